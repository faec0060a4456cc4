"""Synthetic twin of the Food Access Research Atlas and its TIGER/Line tracts (food access task).

It writes the same files the real source serves, so the same reader installs them: an xlsx
workbook laid out as ERS's (sheets "Read Me", "Variable Lookup" and "Food Access Research
Atlas", ``NULL`` for missing flags) and one zipped tract shapefile per state (EPSG:4269, field
``GEOID``). Every file says it is synthetic: the workbook's first sheet and the county name
``SYNTHETIC``, the tract ids use county code 999, and the provenance has ``synthetic: true``.

Tracts are Voronoi cells of a jittered lattice (about 1.3 km apart, as dense urban tracts are)
over the city's grid; a band of open water along one edge has no tracts. Low access and low
income follow smooth random fields, so neighbouring tracts tend to agree. Gaps as the real
table has them: some tracts are missing from the table and some have NULL access flags.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from tempfile import TemporaryDirectory

import geopandas as gpd
import numpy as np
import shapely
from openpyxl import Workbook

from citycube.catalogue.cities import get_city
from citycube.errors import FoodAtlasSourceError
from citycube.grid.tiles import city_extent
from citycube.items.protocol import SourceInfo
from sources.sample.world import SYNTHETIC_NOTICE, stable_hash
from sources.usda_food_atlas import (
    ADAPTER_VERSION,
    ATLAS_COLUMNS,
    ATLAS_SHEET,
    CITY_STATES,
    PRODUCT_ID,
    TRACT_CRS,
    FoodAtlasFiles,
    install_files,
)

SAMPLE_FOOD_VERSION = "sample-food-1"
"""Version of this generator; bump it when its tracts or flags change."""
TRACT_SPACING_M = 1300.0
"""Mean distance between synthetic tract centres."""
ABSENT_SHARE = 0.02
"""Share of tracts the synthetic table leaves out."""
NULL_SHARE = 0.01
"""Share of listed tracts whose access flags are NULL."""


def _field(rng: np.random.Generator, x: np.ndarray, y: np.ndarray, scale: float) -> np.ndarray:
    """A smooth random field in [0, 1] (a few random waves), for spatially coherent flags."""
    total = np.zeros_like(x)
    for _ in range(4):
        kx, ky = rng.normal(0, 1, 2) / scale
        total += np.sin(kx * x + ky * y + rng.uniform(0, 2 * np.pi))
    return (total / 4 + 1) / 2


def synthetic_tracts(city: str, seed: int = 0) -> gpd.GeoDataFrame:
    """The synthetic tracts of a city with their Atlas flags (``None`` where NULL)."""
    rng = np.random.default_rng(stable_hash("food_access", city, seed))
    xmin, ymin, xmax, ymax = city_extent(city)
    xs = np.arange(xmin - TRACT_SPACING_M, xmax + 2 * TRACT_SPACING_M, TRACT_SPACING_M)
    ys = np.arange(ymin - TRACT_SPACING_M, ymax + 2 * TRACT_SPACING_M, TRACT_SPACING_M)
    gx, gy = np.meshgrid(xs, ys)
    px = gx.ravel() + rng.uniform(-0.35, 0.35, gx.size) * TRACT_SPACING_M
    py = gy.ravel() + rng.uniform(-0.35, 0.35, gy.size) * TRACT_SPACING_M
    frame = shapely.box(xmin - 2000, ymin - 2000, xmax + 2000, ymax + 2000)
    cells = shapely.voronoi_polygons(
        shapely.multipoints(np.column_stack([px, py])), extend_to=frame
    )
    polygons = [shapely.intersection(c, frame) for c in shapely.get_parts(cells)]
    # Open water along the eastern edge (a bay, a river mouth): no tract covers it.
    water = shapely.box(xmax - 0.12 * (xmax - xmin), ymin - 2000, xmax + 2000, ymax + 2000)
    polygons = [shapely.difference(p, water) for p in polygons]
    keep = [i for i, p in enumerate(polygons) if not p.is_empty and p.area > 1e4]
    polygons = [polygons[i] for i in keep]
    cx = np.array([p.centroid.x for p in polygons])
    cy = np.array([p.centroid.y for p in polygons])
    access = _field(rng, cx - xmin, cy - ymin, 2500.0)
    income = _field(rng, cx - xmin, cy - ymin, 3500.0)
    low_access = (access + rng.normal(0, 0.05, len(polygons)) > 0.55).astype(int)
    low_income = (income + rng.normal(0, 0.05, len(polygons)) > 0.5).astype(int)
    lila = low_access * low_income
    states = CITY_STATES.get(city, ("99",))
    band = np.clip((cx - xmin) / (xmax - xmin) * len(states), 0, len(states) - 1).astype(int)
    state = np.array([states[b] for b in band])
    geoid = [f"{s}999{i + 100:06d}" for i, s in enumerate(state)]
    out = gpd.GeoDataFrame(
        {
            "geoid": geoid,
            "state": state,
            "Urban": np.ones(len(polygons), dtype=int),
            "LowIncomeTracts": low_income,
            "LA1and10": low_access.astype(object),
            "LILATracts_1And10": lila.astype(object),
        },
        geometry=polygons,
        crs=f"EPSG:{get_city(city).epsg}",
    ).to_crs(TRACT_CRS)
    null = rng.random(len(out)) < NULL_SHARE
    out.loc[null, ["LA1and10", "LILATracts_1And10"]] = None
    out["listed"] = rng.random(len(out)) >= ABSENT_SHARE
    return out


def atlas_workbook(tracts: gpd.GeoDataFrame) -> bytes:
    """The synthetic Atlas as an xlsx laid out like ERS's workbook."""
    book = Workbook()
    book.active.title = "Read Me"
    book.active.append([SYNTHETIC_NOTICE])
    book.active.append(["Laid out like the USDA ERS Food Access Research Atlas 2019 workbook."])
    lookup = book.create_sheet("Variable Lookup")
    lookup.append(["Field", "LongName"])
    lookup.append(["LA1and10", "Low access tract at 1 mile for urban areas or 10 miles for rural"])
    lookup.append(["LILATracts_1And10", "Low income and low access tract, 1 and 10 miles"])
    data = book.create_sheet(ATLAS_SHEET)
    data.append(["CensusTract", "State", "County", *ATLAS_COLUMNS[1:]])
    for row in tracts[tracts["listed"]].itertuples():
        flags = [row.Urban, row.LowIncomeTracts, row.LA1and10, row.LILATracts_1And10]
        flags = ["NULL" if v is None else int(v) for v in flags]
        data.append([int(row.geoid), row.state, "SYNTHETIC", *flags])
    buffer = io.BytesIO()
    book.save(buffer)
    return buffer.getvalue()


def tract_zip(tracts: gpd.GeoDataFrame, state: str) -> bytes:
    """The synthetic tracts of one state as a zipped TIGER/Line-style shapefile."""
    part = tracts[tracts["state"] == state]
    frame = gpd.GeoDataFrame(
        {"STATEFP": part["state"], "GEOID": part["geoid"], "NAMELSAD": "SYNTHETIC"},
        geometry=part.geometry,
        crs=TRACT_CRS,
    )
    with TemporaryDirectory() as tmp:
        name = f"tl_2019_{state}_tract"
        frame.to_file(Path(tmp) / f"{name}.shp", engine="pyogrio")
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(Path(tmp).iterdir()):
                archive.write(path, path.name)
    return buffer.getvalue()


class SampleFoodAtlas:
    """The sample twin of :class:`sources.usda_food_atlas.FoodAtlasSource`."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @property
    def tag(self) -> str:
        """A folder name for this twin's items (generator version and seed)."""
        return f"sample-{SAMPLE_FOOD_VERSION}-seed{self.seed}"

    @property
    def info(self) -> SourceInfo:
        """Who serves the items (the tag names generator version and seed)."""
        return SourceInfo(
            product_id=PRODUCT_ID,
            source_id=self.tag,
            version=ADAPTER_VERSION,
            synthetic=True,
            licence=f"{SYNTHETIC_NOTICE} (Apache-2.0)",
            attribution="CityCube sample twin of the Food Access Research Atlas",
        )

    def covers(self, city: str) -> bool:
        """Like the Atlas: US cities only."""
        return city in CITY_STATES

    def write_files(self, city: str, folder: Path) -> FoodAtlasFiles:
        """Write the workbook and the state tract zips of ``city`` into ``folder``."""
        tracts = synthetic_tracts(city, self.seed)
        folder.mkdir(parents=True, exist_ok=True)
        atlas = folder / "FoodAccessResearchAtlasData2019.xlsx"
        atlas.write_bytes(atlas_workbook(tracts))
        zips = []
        for state in CITY_STATES[city]:
            path = folder / f"tl_2019_{state}_tract.zip"
            path.write_bytes(tract_zip(tracts, state))
            zips.append(path)
        provenance = {
            "source": "CityCube sample twin of the Food Access Research Atlas 2019 (synthetic)",
            "synthetic": True,
            "notice": SYNTHETIC_NOTICE,
            "version": SAMPLE_FOOD_VERSION,
            "seed": self.seed,
            "reference_year": 2019,
        }
        return FoodAtlasFiles(atlas, tuple(zips), provenance)

    def install(self, city: str, dest: Path) -> Path:
        """Write the city's files under ``dest/raw`` and install its labelled tracts."""
        if not self.covers(city):
            raise FoodAtlasSourceError(
                f"{city} is not a US city of the grid: the Food Access Research Atlas covers "
                f"US census tracts only ({', '.join(CITY_STATES)})"
            )
        return install_files(city, self.write_files(city, dest / "raw"), dest)
