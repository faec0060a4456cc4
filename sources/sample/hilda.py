"""Sample HILDA+ v2 annual land-use states: uint8 ids on a 0.01° grid (EPSG:4326).

Each cell takes the majority land use of the synthetic world inside it: ocean (0) wherever the
real coastline puts most of the cell at sea, urban (11) where the built-up area dominates and
spreads over the years, inland water (77) on the river, forest types by climate, cropland,
pasture and unmanaged grass or shrubland from the world's field and texture patterns, sparse
vegetation on high or dry ground. Nodata (99) covers a few small patches, and a very few cells
carry ids outside the legend (13, 200, 254) — corrupt values the engine must treat as invalid.
"""

from __future__ import annotations

import numpy as np

from sources.sample.grids import cell_raster, geographic_grid
from sources.sample.world import (
    FIRST_YEAR,
    LAST_YEAR,
    Climate,
    GeneratedItem,
    RasterLayer,
    SyntheticCity,
    WorldPoints,
    annual_item,
    bin_index,
    block_mean,
    first_rule_class,
)

CELL_DEGREES = 0.01
"""HILDA+ cell size."""
NODATA = 99
"""Nodata id."""
OCEAN, URBAN, CROPLAND, PASTURE = 0, 11, 22, 33
FOREST_UNKNOWN, FOREST_ENF, FOREST_EBF = 40, 41, 42
FOREST_DNF, FOREST_DBF, FOREST_MIXED = 43, 44, 45
GRASS_SHRUB, SPARSE, INLAND_WATER = 55, 66, 77
LEGEND: dict[int, str] = {
    0: "ocean",
    11: "urban",
    22: "cropland",
    33: "pasture / rangeland",
    40: "forest (unknown type)",
    41: "evergreen needle-leaf forest",
    42: "evergreen broad-leaf forest",
    43: "deciduous needle-leaf forest",
    44: "deciduous broad-leaf forest",
    45: "mixed forest",
    55: "unmanaged grass / shrubland",
    66: "sparse / no vegetation",
    77: "inland water",
}
"""HILDA+ land-use ids."""
CORRUPT_IDS = (13, 200, 254)
"""Out-of-legend ids the sample plants in a few cells."""

_FORESTS: dict[Climate, tuple[int, int, int]] = {
    "temperate": (FOREST_DBF, FOREST_MIXED, FOREST_ENF),
    "subtropical": (FOREST_EBF, FOREST_MIXED, FOREST_DBF),
    "tropical": (FOREST_EBF, FOREST_EBF, FOREST_UNKNOWN),
    "mediterranean": (FOREST_ENF, FOREST_EBF, FOREST_MIXED),
    "semiarid": (FOREST_DBF, FOREST_ENF, FOREST_DNF),
}
"""Forest types per climate (main, second, third by texture)."""
_CANDIDATES = (
    OCEAN,
    URBAN,
    CROPLAND,
    PASTURE,
    *sorted(set().union(*_FORESTS.values())),
    GRASS_SHRUB,
    SPARSE,
    INLAND_WATER,
)
"""Every id a sub-cell sample can take; the cell takes the most frequent."""


def land_use(world: SyntheticCity, pts: WorldPoints, year: int) -> np.ndarray:
    """Land-use ids at points (uint8); rules from the highest priority down."""
    urban = world.urban_intensity(pts, year)
    green = world.green_fraction(pts, year, urban)
    texture = pts.field("texture")
    forest_types = np.asarray(_FORESTS[world.traits.climate], dtype=np.uint8)
    variant = bin_index(texture, (0.4, 1.0))
    elevation = pts.elevation
    rules: list[tuple[np.ndarray, np.ndarray | int]] = [
        (pts.sea, OCEAN),
        (pts.water, INLAND_WATER),
        (urban > 0.35, URBAN),
        (elevation > world.snowline_m - 500, SPARSE),
        (green < 0.25, SPARSE),
        (pts.field("forest") > 0.62, forest_types[variant]),
        ((pts.field("crop") > 0.0) & (urban < 0.1), CROPLAND),
        (texture < -0.6, GRASS_SHRUB),
    ]
    return first_rule_class(pts.shape, rules, PASTURE)


def majority(ids: np.ndarray, factor: int) -> np.ndarray:
    """Most frequent id in each factor × factor block (ties go to the earlier candidate)."""
    shares = np.stack([block_mean(ids == c, factor) for c in _CANDIDATES])
    return np.asarray(_CANDIDATES, dtype=np.uint8)[np.argmax(shares, axis=0)]


def _damage(world: SyntheticCity, year: int, ids: np.ndarray) -> None:
    """Small nodata patches and a very few out-of-legend ids."""
    rng = world.rng("hilda-damage", year)
    h, w = ids.shape
    for _ in range(int(rng.integers(1, 4))):
        row, col = int(rng.integers(0, h)), int(rng.integers(0, w))
        radius = float(rng.uniform(0.8, 2.2))
        yy, xx = np.ogrid[:h, :w]
        ids[(yy - row) ** 2 + (xx - col) ** 2 <= radius**2] = NODATA
    count = int(rng.integers(2, 6))
    rows, cols = rng.integers(0, h, count), rng.integers(0, w, count)
    ids[rows, cols] = rng.choice(np.asarray(CORRUPT_IDS, dtype=np.uint8), count)


class HildaPlus:
    """HILDA+ v2 annual land-use states (uint8 ids, EPSG:4326, 0.01°), 2000–2025."""

    product_id = "hilda_plus"
    supersample = 6

    def years(self) -> list[int] | None:
        """Every calendar year."""
        return list(range(FIRST_YEAR, LAST_YEAR + 1))

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Majority land use per cell; ocean where the real coastline says so."""
        assert year is not None
        grid = geographic_grid(world, CELL_DEGREES)
        ids = cell_raster(
            world,
            grid,
            self.supersample,
            block_rows=32,
            cells=lambda pts: majority(land_use(world, pts, year), self.supersample),
            fill=NODATA,
            dtype=np.uint8,
        )
        _damage(world, year, ids)
        name = f"hilda_plus_{year}_states_GLOB-v2-0_wgs84-nn"
        layer = RasterLayer(
            role="data",
            filename=f"{name}.tif",
            data=ids[None],
            grid=grid,
            nodata=NODATA,
            band_descriptions=("land_use_state",),
            units="class id",
            title="Land-use state (HILDA+ legend; 0 ocean, 99 nodata)",
            categorical=True,
        )
        return annual_item(
            f"{name}_{world.city}",
            (layer,),
            year,
            properties={"hilda:version": "2.0", "classification:classes_legend": "HILDA+"},
            extra={"units": "class id", "nodata": str(NODATA)},
        )
