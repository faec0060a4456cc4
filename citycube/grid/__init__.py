"""Where things are: city tile grids, the pixel grids chips are cut from, and lattices of cells
finer than tiles.
"""
