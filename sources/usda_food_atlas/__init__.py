"""USDA ERS Food Access Research Atlas 2019 with Census TIGER/Line tract geometries.

The Atlas is one table of census-tract indicators (the 2010 tracts, identified by the 11-digit
``CensusTract`` GEOID). ERS serves it as an Excel workbook whose data sheet is called
"Food Access Research Atlas" (beside "Read Me" and "Variable Lookup"); missing values are
written ``NULL``. Copies also circulate as a CSV of that sheet, sometimes zipped, so all three
are read. Tract polygons come from the Census Bureau's TIGER/Line shapefiles, one zip per state
(``tl_2019_SS_tract.zip``, NAD83 geographic, EPSG:4269, GEOID field ``GEOID``; the 2010-vintage
files name it ``GEOID10``).

A tract's label uses the urban 1 mile / rural 10 miles convention of the Atlas:
``lila_land10`` where ``LILATracts_1And10`` is 1, ``low_access_land10`` where ``LA1and10`` is 1
otherwise, ``not_low_access_land10`` where both are 0. A tract whose flags are missing, or
contradict each other (low income and low access without low access), has no label and
says why; it is never counted as not low access.
"""

from __future__ import annotations

import functools
import io
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pandas as pd
from pydantic import ConfigDict, Field
from pyproj import CRS, Transformer
from shapely.geometry import box

from citycube.errors import FoodAtlasSourceError
from citycube.io.atomic import atomic_path, remove_dir_atomic, write_json_atomic
from citycube.items.fetched import FetchOutcome, record_outcome, recorded_outcome
from citycube.items.protocol import SourceInfo, SourceItem
from citycube.items.staging import StagedFiles, install_item
from citycube.tasks.food_access import LABELS
from sources.downloads import DownloadManager, DownloadOptions

PRODUCT_ID = "usda_food_atlas"
"""The items' folder under the sources directory, and the product their fetch records name."""
ADAPTER_VERSION = "2"
"""Bump when the installed files or their reading change (2: installed as complete items, a
city not served recorded in its fetch record)."""
ATLAS_SHEET = "Food Access Research Atlas"
"""The data sheet of the ERS workbook."""
ATLAS_COLUMNS = ("CensusTract", "Urban", "LowIncomeTracts", "LA1and10", "LILATracts_1And10")
"""Columns read from the Atlas (the rest of its ~147 are left out)."""
ATLAS_URL = "https://www.ers.usda.gov/webdocs/DataFiles/80591/FoodAccessResearchAtlasData2019.xlsx"
"""Where ERS serves the 2019 Atlas workbook."""
TIGER_URL = "https://www2.census.gov/geo/tiger/TIGER2019/TRACT/tl_2019_{state}_tract.zip"
"""TIGER/Line 2019 census tracts per state (2010 tract boundaries, as the Atlas uses)."""
TRACT_CRS = "EPSG:4269"
"""NAD83 geographic: the CRS of every TIGER/Line file."""
CITY_STATES: dict[str, tuple[str, ...]] = {
    "Boston": ("25",),
    "DC": ("11", "24", "51"),
    "NYC": ("36", "34"),
    "SanFrancisco": ("06",),
}
"""State FIPS codes whose tracts can reach each US city's grid."""
TRACTS_FILE = "food_access_tracts.parquet"
"""The installed item: labelled tracts over one city's grid, GeoParquet in EPSG:4269."""
SOURCE_FILE = "source.json"
"""Provenance of the installed item."""
MISSING = ("", "NULL", "NA", "N/A", "null", "-9999")


def _flag(values: pd.Series) -> pd.Series:
    """0/1 flags as nullable integers; anything else (NULL, blank, 2) becomes missing."""
    numbers = pd.to_numeric(values.replace(list(MISSING), np.nan), errors="coerce")
    return numbers.where(numbers.isin([0, 1])).astype("Int64")


def _geoid(values: pd.Series, origin: str) -> pd.Series:
    """11-digit tract GEOIDs (Excel and CSV readers drop the leading zero of some states)."""
    text = values.astype("string").str.strip().str.removesuffix(".0").str.zfill(11)
    bad = ~text.fillna("").str.fullmatch(r"\d{11}")
    if bad.any():
        raise FoodAtlasSourceError(
            f"{origin}: {int(bad.sum())} CensusTract values are not 11-digit tract GEOIDs "
            f"(first: {values[bad].iloc[0]!r}); use the Atlas table as ERS serves it"
        )
    return text


def _xlsx_rows(data: bytes, origin: str) -> pd.DataFrame:
    """The Atlas columns of the workbook's data sheet (found by name, else by its header)."""
    from openpyxl import load_workbook

    try:
        book = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except Exception as exc:  # openpyxl raises many types for a broken workbook
        raise FoodAtlasSourceError(f"{origin} is not a readable xlsx workbook ({exc})") from exc
    try:
        names = [ATLAS_SHEET] if ATLAS_SHEET in book.sheetnames else list(book.sheetnames)
        for name in names:
            rows = book[name].iter_rows(values_only=True)
            header = [str(c).strip() if c is not None else "" for c in next(rows, ())]
            if "CensusTract" not in header:
                continue
            index = _column_index(header, origin)
            records = [[row[i] for i in index] for row in rows if any(v is not None for v in row)]
            return pd.DataFrame(records, columns=list(ATLAS_COLUMNS), dtype=object)
    finally:
        book.close()
    raise FoodAtlasSourceError(
        f"{origin} has no sheet with a CensusTract column (sheets: {book.sheetnames}); expected "
        f"the {ATLAS_SHEET!r} sheet of the ERS workbook"
    )


def _column_index(header: Sequence[str], origin: str) -> list[int]:
    missing = [c for c in ATLAS_COLUMNS if c not in header]
    if missing:
        raise FoodAtlasSourceError(
            f"{origin} lacks the Atlas columns {missing}; the 2019 Atlas names them "
            f"{', '.join(ATLAS_COLUMNS)}"
        )
    return [list(header).index(c) for c in ATLAS_COLUMNS]


def _csv_rows(data: bytes, origin: str) -> pd.DataFrame:
    try:
        frame = pd.read_csv(
            io.BytesIO(data), dtype=str, keep_default_na=False, sep=None, engine="python"
        )
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise FoodAtlasSourceError(f"{origin} is not a readable CSV table ({exc})") from exc
    frame.columns = [str(c).strip() for c in frame.columns]
    _column_index(list(frame.columns), origin)
    return frame[list(ATLAS_COLUMNS)]


def _is_plain_zip(data: bytes) -> bool:
    """A zip archive that is not itself a workbook (an xlsx is a zip with xl/workbook.xml)."""
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return False
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return "xl/workbook.xml" not in archive.namelist()


def read_atlas(path: Path) -> pd.DataFrame:
    """The Atlas tract table at ``path`` (xlsx, csv, or a zip holding one of them).

    Returns one row per tract: ``geoid``, ``urban``, ``low_income``, ``low_access``, ``lila``
    (nullable 0/1), ``label`` (one of :data:`LABELS`, or missing) and ``reason`` (why a tract
    has no label).
    """
    path = Path(path)
    data = path.read_bytes()
    origin = str(path)
    if _is_plain_zip(data):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = [n for n in archive.namelist() if n.lower().endswith((".xlsx", ".csv"))]
            if not members:
                raise FoodAtlasSourceError(
                    f"{origin} holds no .xlsx or .csv table (members: {archive.namelist()})"
                )
            member = sorted(members, key=lambda n: not n.lower().endswith(".xlsx"))[0]
            data, origin = archive.read(member), f"{origin}!{member}"
    raw = _xlsx_rows(data, origin) if data[:2] == b"PK" else _csv_rows(data, origin)
    return atlas_labels(raw, origin)


def atlas_labels(raw: pd.DataFrame, origin: str) -> pd.DataFrame:
    """Tract labels from the Atlas columns (see the module docstring for the rule)."""
    frame = pd.DataFrame(
        {
            "geoid": _geoid(raw["CensusTract"], origin),
            "urban": _flag(raw["Urban"]),
            "low_income": _flag(raw["LowIncomeTracts"]),
            "low_access": _flag(raw["LA1and10"]),
            "lila": _flag(raw["LILATracts_1And10"]),
        }
    )
    if frame["geoid"].duplicated().any():
        dup = frame.loc[frame["geoid"].duplicated(), "geoid"].iloc[0]
        raise FoodAtlasSourceError(f"{origin}: tract {dup} appears more than once")
    label = pd.Series(pd.NA, index=frame.index, dtype="string")
    reason = pd.Series(pd.NA, index=frame.index, dtype="string")
    missing = frame["low_access"].isna() | frame["lila"].isna()
    contradict = ~missing & (frame["lila"] == 1) & (frame["low_access"] == 0)
    label[~missing & (frame["lila"] == 1) & ~contradict] = LABELS[2]
    label[~missing & (frame["lila"] == 0) & (frame["low_access"] == 1)] = LABELS[1]
    label[~missing & (frame["lila"] == 0) & (frame["low_access"] == 0)] = LABELS[0]
    reason[missing] = "LA1and10 or LILATracts_1And10 missing"
    reason[contradict] = "LILATracts_1And10 = 1 but LA1and10 = 0"
    frame["label"] = label
    frame["reason"] = reason
    return frame


def read_tracts(path: Path) -> gpd.GeoDataFrame:
    """Tract polygons (``geoid``, geometry in EPSG:4269) of a zipped TIGER/Line shapefile."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            layers = [n for n in archive.namelist() if n.lower().endswith(".shp")]
        if len(layers) != 1:
            raise ValueError(f"expected one .shp in the zip, found {layers}")
        # GDAL's zip reader wants a .zip name; cached files are named by digest, so the
        # archive is handed over as bytes (a tract file of a state is a few tens of MB).
        frame = gpd.read_file(io.BytesIO(path.read_bytes()), engine="pyogrio")
    except Exception as exc:  # pyogrio raises its own DataSourceError and friends
        raise FoodAtlasSourceError(
            f"{path} is not a readable zipped tract shapefile ({exc}); use a TIGER/Line "
            "tl_YYYY_SS_tract.zip"
        ) from exc
    column = next((c for c in ("GEOID", "GEOID10", "GEOID20") if c in frame.columns), None)
    if column is None:
        raise FoodAtlasSourceError(f"{path} has no GEOID field (fields: {list(frame.columns)})")
    if frame.crs is None:
        raise FoodAtlasSourceError(f"{path} has no .prj: its CRS is unknown")
    frame = frame.to_crs(TRACT_CRS) if not CRS(frame.crs).equals(CRS(TRACT_CRS)) else frame
    out = gpd.GeoDataFrame(
        {"geoid": _geoid(frame[column], str(path))},
        geometry=frame.geometry.values,
        crs=TRACT_CRS,
    )
    return out[~out.geometry.is_empty & out.geometry.notna()].reset_index(drop=True)


def city_bounds(city: str) -> tuple[float, float, float, float]:
    """The city's grid extent in EPSG:4269 (lon/lat), a little widened for the transform."""
    from citycube.catalogue.cities import get_city
    from citycube.grid.tiles import city_extent

    xmin, ymin, xmax, ymax = city_extent(city)
    to_geo = Transformer.from_crs(f"EPSG:{get_city(city).epsg}", TRACT_CRS, always_xy=True)
    west, south, east, north = to_geo.transform_bounds(xmin, ymin, xmax, ymax, densify_pts=21)
    pad = 0.01
    return (west - pad, south - pad, east + pad, north + pad)


def labelled_tracts(
    city: str, atlas: pd.DataFrame, tracts: Sequence[gpd.GeoDataFrame]
) -> gpd.GeoDataFrame:
    """The tracts over ``city``'s grid with their Atlas label (missing, with a reason, for a
    tract the Atlas does not list)."""
    frame = pd.concat(list(tracts), ignore_index=True) if tracts else None
    if frame is None or frame.empty:
        raise FoodAtlasSourceError(f"{city}: no tract geometries were given")
    frame = gpd.GeoDataFrame(frame, geometry="geometry", crs=TRACT_CRS)
    frame = frame[frame.intersects(box(*city_bounds(city)))]
    frame = frame.drop_duplicates("geoid")
    merged = frame.merge(atlas, on="geoid", how="left")
    absent = merged["label"].isna() & merged["reason"].isna()
    merged["reason"] = merged["reason"].astype("string")
    merged.loc[absent, "reason"] = "tract not listed in the Atlas"
    return gpd.GeoDataFrame(merged, geometry="geometry", crs=TRACT_CRS).reset_index(drop=True)


def write_item(frame: gpd.GeoDataFrame, dest: Path, provenance: dict[str, Any]) -> Path:
    """Write one city's labelled tracts and their provenance into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest / TRACTS_FILE) as part:
        frame.to_parquet(part, index=False)
    write_json_atomic(provenance, dest / SOURCE_FILE)
    return dest / TRACTS_FILE


def read_item(dest: Path) -> gpd.GeoDataFrame:
    """The labelled tracts an item folder holds."""
    path = Path(dest) / TRACTS_FILE
    if not path.is_file():
        raise FoodAtlasSourceError(
            f"{path} is missing: fetch the food-access source for this city first"
        )
    return gpd.read_parquet(path)


class FoodAtlasOptions(DownloadOptions):
    """Where the Atlas and the tract files are served (the ERS and Census addresses by
    default; a mirror or a loopback server in tests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    atlas_url: str = Field(default=ATLAS_URL, description="The Atlas table (xlsx, csv or zip).")
    tiger_url: str = Field(
        default=TIGER_URL, description="Tract shapefile zips; '{state}' is the state FIPS code."
    )
    atlas_sha256: str | None = Field(default=None, description="Expected digest of the table.")


@dataclass(frozen=True)
class FoodAtlasFiles:
    """The downloaded files of one city."""

    atlas: Path
    tracts: tuple[Path, ...]
    provenance: dict[str, Any]


class FoodAtlasSource:
    """Downloads the Atlas and the tract files of a city through the shared download manager
    and installs the city's labelled tracts."""

    def __init__(self, options: FoodAtlasOptions | None = None) -> None:
        self.options = options or FoodAtlasOptions()
        self.manager = DownloadManager(self.options.download_settings())

    @property
    def tag(self) -> str:
        """A folder name for this source's items (the addresses it reads, hashed)."""
        import hashlib

        key = f"{self.options.atlas_url}|{self.options.tiger_url}"
        if self.options.atlas_sha256:  # a pinned table is another item (tags without stay)
            key += f"|{self.options.atlas_sha256}"
        return "ers-2019-" + hashlib.sha256(key.encode()).hexdigest()[:10]

    @property
    def info(self) -> SourceInfo:
        """Who serves the items (the tag names the addresses), as fetch records name it."""
        return SourceInfo(
            product_id=PRODUCT_ID,
            source_id=self.tag,
            version=ADAPTER_VERSION,
            synthetic=False,
            licence="Public domain (U.S. Government works)",
            attribution="USDA ERS Food Access Research Atlas 2019; U.S. Census Bureau "
            "TIGER/Line 2019 census tracts",
        )

    def covers(self, city: str) -> bool:
        """The Atlas covers US tracts only."""
        return city in CITY_STATES

    def fetch(self, city: str) -> FoodAtlasFiles:
        """Download (or find in the cache) the Atlas and the city's state tract files."""
        if not self.covers(city):
            raise FoodAtlasSourceError(
                f"{city} is not a US city of the grid: the Food Access Research Atlas covers "
                f"US census tracts only ({', '.join(CITY_STATES)})"
            )
        atlas = self.manager.fetch(self.options.atlas_url, sha256=self.options.atlas_sha256)
        tracts = [
            self.manager.fetch(self.options.tiger_url.format(state=s)) for s in CITY_STATES[city]
        ]
        provenance = {
            "source": "USDA ERS Food Access Research Atlas 2019; Census TIGER/Line tracts",
            "synthetic": False,
            "atlas": {"url": atlas.url, "sha256": atlas.sha256},
            "tracts": [{"url": t.url, "sha256": t.sha256} for t in tracts],
            "reference_year": 2019,
        }
        return FoodAtlasFiles(atlas.path, tuple(t.path for t in tracts), provenance)

    def install(self, city: str, dest: Path) -> Path:
        """Fetch the city's files and write its labelled tracts into ``dest``."""
        files = self.fetch(city)
        return install_files(city, files, dest)


@functools.lru_cache(maxsize=2)
def _atlas_once(path: str, size: int, mtime_ns: int) -> pd.DataFrame:
    """The national table read once per process and file version (the real workbook has
    about 72,000 tracts × 147 columns; every city of a build reads it)."""
    return read_atlas(Path(path))


def install_files(city: str, files: FoodAtlasFiles, dest: Path) -> Path:
    """Read downloaded (or sample) files and write the city's labelled tracts item."""
    stat = Path(files.atlas).stat()
    atlas = _atlas_once(str(Path(files.atlas).resolve()), stat.st_size, stat.st_mtime_ns).copy()
    frame = labelled_tracts(city, atlas, [read_tracts(p) for p in files.tracts])
    provenance = dict(files.provenance)
    provenance.update(
        city=city,
        tracts_over_grid=len(frame),
        tracts_without_label=int(frame["label"].isna().sum()),
    )
    return write_item(frame, dest, provenance)


def item_dir(source: Any, city: str, sources_dir: Path) -> Path:
    """Where ``city``'s item of ``source`` is installed under the sources directory."""
    return Path(sources_dir) / PRODUCT_ID / source.tag / city


def fetch_city(source: Any, city: str, sources_dir: Path) -> dict[str, Any]:
    """Install ``city``'s labelled tracts (or find why the source does not cover it) and record
    the outcome under ``sources_dir/.fetched``; what was done, for the asset's metadata.

    The item is installed like any source item (staged, completion record last, one rename
    replacing whatever folder was there) and is reused while its source and files are
    unchanged. A city the source does not serve has no item: its fetch record says why, and an
    item installed there before is removed.
    """
    info, final = source.info, item_dir(source, city, sources_dir)
    if not source.covers(city):
        reason = f"{city} is not a US city: the Food Access Research Atlas covers US tracts only"
        record_outcome(sources_dir, info, city, None, None, FetchOutcome(None, None, reason))
        remove_dir_atomic(final)
        return {"city": city, "available": False, "reason": reason}
    identity = {
        "product": PRODUCT_ID,
        "city": city,
        "source_id": info.source_id,
        "version": info.version,
    }

    def write(staging: Path) -> StagedFiles:
        source.install(city, staging)
        return StagedFiles({"tracts": TRACTS_FILE, "source": SOURCE_FILE})

    installed = install_item(final, identity, write)
    item = SourceItem(
        product=PRODUCT_ID,
        city=city,
        source_year=None,
        files=installed.files,
        source_id=info.source_id,
        version=info.version,
        synthetic=info.synthetic,
        fingerprint=installed.fingerprint,
    )
    record_outcome(sources_dir, info, city, None, None, FetchOutcome(None, item, None))
    frame = read_item(final)
    return {"city": city, "available": True, "tracts": len(frame),
            "unlabelled": int(frame["label"].isna().sum())}  # fmt: skip


def read_city(
    source: Any, city: str, sources_dir: Path
) -> tuple[gpd.GeoDataFrame | None, str | None]:
    """(labelled tracts, None) of a city fetched with ``source``, or (None, why there are none).

    The city's fetch record decides, never the files found in a folder: a city the source does
    not serve, one never fetched, and one whose installed files changed since its fetch each
    say so.
    """
    outcome = recorded_outcome(sources_dir, source.info, city, None, None)
    if outcome is None:
        return None, (
            f"the food-access reference of {city} was not fetched with this source, or its "
            "files changed since: run the usda_food_atlas source again"
        )
    if outcome.item is None:
        return None, str(outcome.missing_reason)
    return read_item(Path(outcome.item.files["tracts"]).parent), None
