"""Sample GLC_FCS30D annual land cover: class ids on the product's 0.000269° lattice.

Impervious surface (190) follows the world's urban intensity and spreads with it; water (210)
is the world's sea and river; vegetation classes depend on the city's climate, woodland
propensity, field patterns and relief. Id 0 (non-green or unclassified, valid) marks a few
bare construction pixels at the urban fringe; 255 marks small nodata patches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sources.sample.grids import geographic_grid
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
    first_rule_class,
    pixel_grain,
    row_blocks,
    row_window,
)

PIXEL_DEGREES = 0.00026949458523585647
"""GLC_FCS30D pixel size, degrees."""
NODATA = 255
"""Nodata class id."""
NON_GREEN = 0
"""Non-green or unclassified (valid)."""
IMPERVIOUS = 190
WATER = 210
SNOW_ICE = 220
LICHENS_MOSSES = 140
GRASSLAND = 130

LEGEND: dict[int, str] = {
    0: "non-green / unclassified",
    10: "rainfed cropland",
    11: "herbaceous cover cropland",
    12: "tree or shrub cover (orchard) cropland",
    20: "irrigated cropland",
    51: "open evergreen broadleaved forest",
    52: "closed evergreen broadleaved forest",
    61: "open deciduous broadleaved forest",
    62: "closed deciduous broadleaved forest",
    71: "open evergreen needle-leaved forest",
    72: "closed evergreen needle-leaved forest",
    81: "open deciduous needle-leaved forest",
    82: "closed deciduous needle-leaved forest",
    91: "open mixed-leaf forest",
    92: "closed mixed-leaf forest",
    120: "shrubland",
    121: "evergreen shrubland",
    122: "deciduous shrubland",
    130: "grassland",
    140: "lichens and mosses",
    150: "sparse vegetation",
    152: "sparse shrubland",
    153: "sparse herbaceous",
    181: "swamp",
    182: "marsh",
    183: "flooded flat",
    184: "saline",
    185: "mangrove",
    186: "salt marsh",
    187: "tidal flat",
    190: "impervious surfaces",
    200: "bare areas",
    201: "consolidated bare areas",
    202: "unconsolidated bare areas",
    210: "water body",
    220: "permanent ice and snow",
}
"""Class ids the sample writes (the GLC_FCS30D legend plus 0)."""


@dataclass(frozen=True)
class ClimateClasses:
    """Which legend classes a climate's vegetation uses (main, second, third choice)."""

    open_forest: tuple[int, int, int]
    """Open forest ids (main, second, third)."""
    closed_forest: tuple[int, int, int]
    """Closed forest ids, in the same order as the open ones."""
    cropland: tuple[int, int, int]
    """Cropland ids, most common first."""
    shrubland: int
    """Shrubland id."""
    sparse: tuple[int, int]
    """Sparse vegetation ids (high ground, degraded land)."""
    wetland: int
    """Wetland id along low river banks."""
    shore: tuple[int, int]
    """Ids of the low strip along the sea."""
    bare: tuple[int, int]
    """Bare-ground ids."""


CLIMATE_CLASSES: dict[Climate, ClimateClasses] = {
    "temperate": ClimateClasses(
        open_forest=(61, 71, 91),
        closed_forest=(62, 72, 92),
        cropland=(10, 11, 20),
        shrubland=122,
        sparse=(150, 153),
        wetland=182,
        shore=(202, 186),
        bare=(200, 201),
    ),
    "subtropical": ClimateClasses(
        open_forest=(51, 61, 91),
        closed_forest=(52, 62, 92),
        cropland=(20, 10, 12),
        shrubland=121,
        sparse=(150, 153),
        wetland=182,
        shore=(202, 187),
        bare=(200, 201),
    ),
    "tropical": ClimateClasses(
        open_forest=(51, 51, 91),
        closed_forest=(52, 52, 92),
        cropland=(12, 20, 10),
        shrubland=121,
        sparse=(150, 152),
        wetland=181,
        shore=(185, 202),
        bare=(200, 202),
    ),
    "mediterranean": ClimateClasses(
        open_forest=(71, 51, 61),
        closed_forest=(72, 52, 62),
        cropland=(10, 12, 20),
        shrubland=121,
        sparse=(152, 153),
        wetland=182,
        shore=(202, 184),
        bare=(201, 200),
    ),
    "semiarid": ClimateClasses(
        open_forest=(61, 71, 81),
        closed_forest=(62, 72, 82),
        cropland=(10, 20, 11),
        shrubland=120,
        sparse=(152, 153),
        wetland=183,
        shore=(202, 184),
        bare=(201, 200),
    ),
}
"""Vegetation classes per climate; the variants add realistic class mixtures."""


def _pick(choice: np.ndarray, options: tuple[int, ...]) -> np.ndarray:
    """Class ids from a 0..n-1 choice index."""
    return np.asarray(options, dtype=np.uint8)[np.minimum(choice, len(options) - 1)]


def land_cover(
    world: SyntheticCity, pts: WorldPoints, year: int, speckle: np.ndarray
) -> np.ndarray:
    """Class ids (uint8) for a year; categorical rules, never blended."""
    classes = CLIMATE_CLASSES[world.traits.climate]
    urban = world.urban_intensity(pts, year)
    green = world.green_fraction(pts, year, urban)
    texture = pts.field("texture")
    variant = bin_index(texture, (0.4, 1.0))
    forest = pts.field("forest") + 0.08 * speckle
    crop = pts.field("crop") + 0.15 * speckle
    elevation = pts.elevation
    base = world.traits.base_elevation_m
    urban_score = urban + 0.12 * speckle
    river_bank = np.abs(pts.field("river_offset")) < pts.field("river_half_width") + 200
    shore = (pts.field("coast_distance") < 150) & (elevation < 4)

    # (where, class) from the highest priority down; the first rule that holds wins.
    rules: list[tuple[np.ndarray, np.ndarray | int]] = [
        (pts.water, WATER),
        (elevation > world.snowline_m, SNOW_ICE),
        (urban_score > 0.42, IMPERVIOUS),
        ((urban_score > 0.3) & (speckle > 1.3), NON_GREEN),
        (shore, _pick(variant, classes.shore)),
        (river_bank & (elevation < base + 3) & (texture > 0.5), classes.wetland),
        (
            elevation > world.snowline_m - 500,
            np.where(texture > 0, np.uint8(LICHENS_MOSSES), np.uint8(classes.sparse[0])),
        ),
        (green + 0.1 * speckle < 0.3, _pick(variant, classes.bare)),
        (forest > 0.78, _pick(variant, classes.closed_forest)),
        (forest > 0.62, _pick(variant, classes.open_forest)),
        (pts.field("park") > 0.5, GRASSLAND),
        ((crop > 0.0) & (urban < 0.1), _pick(bin_index(crop, (0.8, 1.4)), classes.cropland)),
        (texture < -0.9, classes.shrubland),
        (texture < -0.5, classes.sparse[1]),
    ]
    return first_rule_class(pts.shape, rules, GRASSLAND)


def _nodata_patches(world: SyntheticCity, year: int, classes: np.ndarray) -> None:
    """A few small patches without a classification (nodata 255)."""
    rng = world.rng("glc-nodata", year)
    h, w = classes.shape
    for _ in range(int(rng.integers(1, 5))):
        row, col = int(rng.integers(0, h)), int(rng.integers(0, w))
        radius = float(rng.uniform(3, 12))
        r0, r1 = max(row - 13, 0), min(row + 14, h)
        c0, c1 = max(col - 13, 0), min(col + 14, w)
        yy, xx = np.ogrid[r0:r1, c0:c1]
        classes[r0:r1, c0:c1][(yy - row) ** 2 + (xx - col) ** 2 <= radius**2] = NODATA


class GlcFcs30d:
    """GLC_FCS30D annual land cover (uint8 class ids, EPSG:4326), 2000–2025."""

    product_id = "glc_fcs30d"

    def years(self) -> list[int] | None:
        """Every calendar year."""
        return list(range(FIRST_YEAR, LAST_YEAR + 1))

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """One year's classification of the city window."""
        assert year is not None
        grid = geographic_grid(world, PIXEL_DEGREES)
        # Pixel-scale variation that stays put across years, so only trends change classes.
        speckle = pixel_grain(world, "glc-speckle", (grid.height, grid.width), reuse=True)
        classes = np.empty((grid.height, grid.width), dtype=np.uint8)
        for start, stop in row_blocks(grid.height):
            pts = world.grid_points(row_window(grid, start, stop))
            block = land_cover(world, pts, year, speckle[start:stop])
            classes[start:stop] = np.where(pts.inside, block, np.uint8(NODATA))
        _nodata_patches(world, year, classes)
        name = f"GLC_FCS30D_{year}_{world.city}"
        layer = RasterLayer(
            role="data",
            filename=f"{name}.tif",
            data=classes[None],
            grid=grid,
            nodata=NODATA,
            band_descriptions=("land_cover_class",),
            units="class id",
            title="Land cover class (GLC_FCS30D legend; 0 non-green/unclassified)",
            categorical=True,
        )
        return annual_item(
            name,
            (layer,),
            year,
            properties={"gsd": 30, "classification:classes_legend": "GLC_FCS30D"},
            extra={"units": "class id", "nodata": str(NODATA)},
        )
