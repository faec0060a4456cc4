"""Representation evaluation on the cube (the CityRep protocol).

Bring an embedding in any spatial support, align it to the cube's tiles, and compare it with
others under block-based spatial splits, a random split (the leakage diagnostic) and the
dataset's 10 km parent split, with fixed probes and city-level ranking (CityRep §3).
"""
