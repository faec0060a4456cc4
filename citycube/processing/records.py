"""City records onto tiles: one ingest path with one rule per spatial form.

Every record connector writes the same normalised file
(``citycube.items.records_form.RECORD_COLUMNS``)
plus the tables its form needs, so the rules live here once:

- **point**: a record counts in the tile its point falls in (edges belong to one tile);
- **parcel**: a parcel's value is split over the tiles it meets by intersected area;
- **postcode**: a record takes the point of its key in the declared centroid table; records
  whose key the table lacks are counted (``unmatched``) and left out, never placed anywhere;
- **admin_unit**: a unit's value is apportioned to tiles by the unit's area share.

Sums (electricity) are divided by the nominal tile area and never scaled up for missing area;
means (property) are weighted by record, by intersected area or by apportioned unit area.
A field with the median-of-cell-medians rule (``citycube.grid.cells``) places each record in one
cell of the tile lattice instead; see ``tile_cell_medians`` for where each form goes.
A tile's valid support is the share of its area inside what the records report on: the
declared coverage polygon (a city limit), else the union of the parcels or of the units with
a value. Outside it a tile is unavailable with a reason, never zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import shapely
from pyproj import CRS

from citycube.catalogue.products import load_products
from citycube.errors import SourceReadError
from citycube.grid.cells import CellLattice, median_of_cell_medians
from citycube.grid.tiles import TileGrid
from citycube.items.protocol import SourceItem
from citycube.items.rasters import transformer
from citycube.items.records_form import RECORD_COLUMNS, SpatialForm
from citycube.items.staging import repair_hint
from citycube.processing.record_checks import (
    check_inside,
    check_plausible,
    check_year,
    parquet_row,
    require_declared_count,
)
from citycube.processing.vectors import Records, check_declared_counts, tile_index

SPATIAL_FORM_KEY = "spatial_form"
"""Key of a records item's extras naming its spatial form; its presence marks the item as
normalised city records."""

_SPACE = re.compile(r"\s+")

SLIVER_SHARE = 1e-9
"""Overlaps smaller than this share of a tile (a few mm² at 2 km) are slivers of reprojected
shared edges, not real overlap: a polygon that only touches a tile does not count in it."""


def normalise_key(values: pd.Series) -> pd.Series:
    """Join keys compared without case or blanks ('sw1a 1aa' = 'SW1A1AA'); blank keys → NA."""
    text = values.astype("string").str.upper().str.replace(_SPACE, "", regex=True)
    return text.mask(text.fillna("") == "")


@dataclass(frozen=True)
class RecordIngest:
    """What one records item gave, for the derived results' metadata."""

    form: str
    rows: int
    """Rows the file holds."""
    year_rows: int
    """Rows of the requested year."""
    unusable: int
    """Rows of the year without a finite value or a location (geometry or key)."""
    unmatched: int = 0
    """Postcode or unit keys the declared table lacks (records left out, counted here)."""
    unmatched_examples: tuple[str, ...] = ()
    """A few of those keys, to show what did not match."""
    used: int = 0
    """Records that reached the tiles."""

    def as_dict(self) -> dict[str, object]:
        """Plain values for metadata and logs."""
        return {
            "form": self.form,
            "rows": self.rows,
            "year_rows": self.year_rows,
            "unusable": self.unusable,
            "unmatched": self.unmatched,
            "unmatched_examples": list(self.unmatched_examples),
            "used": self.used,
        }


@dataclass
class PlacedRecords:
    """Records of one year placed in the city CRS, ready for any grid."""

    form: SpatialForm
    values: np.ndarray
    """Value per record (points, parcels) or per unit (admin units)."""
    x: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Point x in the city CRS (point and postcode forms)."""
    y: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Point y in the city CRS."""
    polygons: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    """Parcel or unit polygons in the city CRS (parcel and admin-unit forms)."""
    unit_sums: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Admin units: the sum of each unit's records (aligned with ``polygons``)."""
    unit_means: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Admin units: the mean of each unit's records."""
    unit_medians: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Admin units: the median of each unit's records."""
    coverage: shapely.Geometry | None = None
    """What the records report on (city CRS); None only when nothing is covered."""
    ingest: RecordIngest | None = None


def is_records_item(item: SourceItem) -> bool:
    """True for items in the normalised records form."""
    return SPATIAL_FORM_KEY in item.extra


def _read_parquet(path: Path, what: str) -> pd.DataFrame:
    if not Path(path).exists():
        raise SourceReadError(f"{what} {path} does not exist; re-run its source asset")
    try:
        return pq.read_table(path).to_pandas()
    except Exception as exc:  # pyarrow raises many types for damaged files
        raise SourceReadError(f"cannot read {path} as {what} ({exc}); {repair_hint(path)}") from exc


def _read_vector(path: Path, what: str, epsg: int) -> gpd.GeoDataFrame:
    if not Path(path).exists():
        raise SourceReadError(f"{what} {path} does not exist; re-run its source asset")
    try:
        frame = gpd.read_parquet(path) if Path(path).suffix == ".parquet" else gpd.read_file(path)
    except Exception as exc:  # pyogrio/pyarrow raise many types for damaged files
        raise SourceReadError(f"cannot read {path} as {what} ({exc}); {repair_hint(path)}") from exc
    if frame.crs is None:
        raise SourceReadError(f"{path} ({what}) has no CRS")
    return frame.to_crs(epsg=epsg)


def _project(geometry: np.ndarray, epsg: int) -> np.ndarray:
    to_city = transformer(CRS.from_epsg(4326), CRS.from_epsg(epsg))

    def move(xy: np.ndarray) -> np.ndarray:
        return np.column_stack(to_city.transform(xy[:, 0], xy[:, 1]))

    return shapely.transform(geometry, move)


def place_records(item: SourceItem, epsg: int, year: int | None) -> PlacedRecords:
    """Read a records item, check it against its declared counts, place its year's records.

    Rows without a finite value or a location are counted as unusable (and checked against
    the declared ``blank_values``); postcode and unit keys missing from their table are
    counted as unmatched.
    """
    form = SpatialForm(item.extra[SPATIAL_FORM_KEY])
    path = Path(item.local_path("data"))
    frame = _read_parquet(path, "a records file")
    missing = set(RECORD_COLUMNS) - set(frame.columns)
    if missing:
        raise SourceReadError(f"{path} lacks the records columns {sorted(missing)}")
    rows = len(frame)
    require_declared_count(item.extra, path)
    check_year(frame["year"], year, path, parquet_row)
    values = pd.to_numeric(frame["value"], errors="coerce").to_numpy(float)
    finite = np.isfinite(values)
    if form in (SpatialForm.point, SpatialForm.parcel):
        geometry = shapely.from_wkb(frame["geometry"].to_numpy(dtype=object))
        located = ~(shapely.is_missing(geometry) | shapely.is_empty(geometry))
    else:
        key = normalise_key(frame["postcode" if form == SpatialForm.postcode else "unit_id"])
        located = key.notna().to_numpy()
    usable = finite & located
    unusable = int((~usable).sum())
    check_declared_counts(Records(values, values, values, rows, unusable), item.extra, path)
    product = load_products().get(item.product)
    positions = np.flatnonzero(usable)
    checks = product.records if product is not None else None
    check_plausible(values[usable], positions, checks, form.value, path, parquet_row)
    declared = item.files.get("coverage")
    coverage = (
        shapely.union_all(_read_vector(Path(declared), "a coverage file", epsg).geometry.values)
        if declared
        else None
    )
    if coverage is not None and form in (SpatialForm.point, SpatialForm.parcel):
        # A point, or a parcel's representative point, outside the declared coverage reaches
        # no tile: many of them mean wrong positions, not a few mis-geocoded records.
        where = f"{item.city}'s declared coverage ({Path(declared).name})"  # type: ignore[arg-type]
        placed_at = shapely.point_on_surface(_project(geometry[usable], epsg))
        inside = shapely.contains_xy(coverage, shapely.get_x(placed_at), shapely.get_y(placed_at))
        check_inside(inside, positions, where, path, parquet_row)
    common = {"form": form.value, "rows": rows, "year_rows": len(frame), "unusable": unusable}
    if form == SpatialForm.point:
        points = _project(geometry[usable], epsg)
        return PlacedRecords(
            form,
            values[usable],
            x=shapely.get_x(points),
            y=shapely.get_y(points),
            coverage=coverage,
            ingest=RecordIngest(**common, used=int(usable.sum())),
        )
    if form == SpatialForm.parcel:
        polygons = _project(geometry[usable], epsg)
        if coverage is None:
            coverage = shapely.union_all(_project(geometry[located], epsg))
        return PlacedRecords(
            form,
            values[usable],
            polygons=polygons,
            coverage=coverage,
            ingest=RecordIngest(**common, used=int(usable.sum())),
        )
    if form == SpatialForm.postcode:
        return _joined_to_points(item, epsg, values[usable], key[usable], coverage, common)
    return _joined_to_units(item, epsg, values[usable], key[usable], coverage, common)


def _unmatched(keys: pd.Series, known: pd.Index) -> tuple[np.ndarray, int, tuple[str, ...]]:
    matched = keys.isin(known).to_numpy()
    missing = keys[~matched]
    examples = tuple(sorted(missing.unique().tolist())[:5])
    return matched, int((~matched).sum()), examples


def _joined_to_points(
    item: SourceItem,
    epsg: int,
    values: np.ndarray,
    keys: pd.Series,
    coverage: shapely.Geometry | None,
    common: dict[str, object],
) -> PlacedRecords:
    table = _read_parquet(Path(item.local_path("points")), "a postcode points table")
    for column in ("key", "lon", "lat"):
        if column not in table:
            raise SourceReadError(f"postcode points table of {item.city} lacks column {column!r}")
    table = table.assign(key=normalise_key(table["key"])).dropna(subset=["key"])
    table = table.drop_duplicates("key").set_index("key")
    matched, unmatched, examples = _unmatched(keys, table.index)
    joined = table.loc[keys[matched].to_numpy()]
    x, y = transformer(CRS.from_epsg(4326), CRS.from_epsg(epsg)).transform(
        joined["lon"].to_numpy(float), joined["lat"].to_numpy(float)
    )
    ingest = RecordIngest(
        **common,  # type: ignore[arg-type]
        unmatched=unmatched,
        unmatched_examples=examples,
        used=int(matched.sum()),
    )
    return PlacedRecords(
        SpatialForm.postcode,
        values[matched],
        x=np.asarray(x),
        y=np.asarray(y),
        coverage=coverage,
        ingest=ingest,
    )


def _joined_to_units(
    item: SourceItem,
    epsg: int,
    values: np.ndarray,
    keys: pd.Series,
    coverage: shapely.Geometry | None,
    common: dict[str, object],
) -> PlacedRecords:
    """Records grouped per unit (kept as value lists, summed or averaged by the rule)."""
    units = _read_vector(Path(item.local_path("units")), "an admin-unit boundary file", epsg)
    if "key" not in units:
        raise SourceReadError(f"admin-unit boundaries of {item.city} lack column 'key'")
    units = units.assign(key=normalise_key(units["key"])).dropna(subset=["key"])
    units = units.dissolve(by="key")
    matched, unmatched, examples = _unmatched(keys, units.index)
    frame = pd.DataFrame({"key": keys[matched].to_numpy(), "value": values[matched]})
    ingest = RecordIngest(
        **common,  # type: ignore[arg-type]
        unmatched=unmatched,
        unmatched_examples=examples,
        used=int(matched.sum()),
    )
    grouped = frame.groupby("key")["value"]
    sums = grouped.sum()
    return PlacedRecords(
        SpatialForm.admin_unit,
        sums.to_numpy(float),
        polygons=units.geometry.loc[sums.index].to_numpy(),
        unit_sums=sums.to_numpy(float),
        unit_means=grouped.mean().to_numpy(float),
        unit_medians=grouped.median().to_numpy(float),
        coverage=coverage if coverage is not None else shapely.union_all(units.geometry.values),
        ingest=ingest,
    )


@dataclass(frozen=True)
class TileRecordValues:
    """Per tile of one grid: the value, its valid support and the share covered at all."""

    value: np.ndarray
    """Sum ÷ nominal area (km²) or mean; NaN where no record contributes."""
    support: np.ndarray
    """Share of the tile with valid support (0–1)."""
    covered: np.ndarray
    """Share of the tile inside what the records report on (0 → outside coverage)."""


def _tile_boxes(grid: TileGrid) -> np.ndarray:
    return np.array([shapely.box(*t.bounds) for t in grid.tiles()])


def _overlaps(grid: TileGrid, polygons: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(polygon index, tile index, intersected area) of every polygon-tile pair that meets."""
    boxes = _tile_boxes(grid)
    tree = shapely.STRtree(boxes)
    poly_index, tile_idx = tree.query(polygons, predicate="intersects")
    areas = shapely.area(shapely.intersection(polygons[poly_index], boxes[tile_idx]))
    keep = areas > SLIVER_SHARE * float(grid.tile_size**2)
    return poly_index[keep], tile_idx[keep], areas[keep]


def coverage_share(grid: TileGrid, coverage: shapely.Geometry | None) -> np.ndarray:
    """Exact share of each tile's area inside the coverage (0 everywhere when there is none)."""
    if coverage is None or shapely.is_empty(coverage):
        return np.zeros(grid.n_tiles)
    share = shapely.area(shapely.intersection(_tile_boxes(grid), coverage)) / grid.tile_size**2
    return np.where(share > SLIVER_SHARE, share, 0.0)


def tile_values(placed: PlacedRecords, grid: TileGrid, *, total: bool) -> TileRecordValues:
    """The form's rule on one grid: sums per nominal km² (``total``) or means."""
    n = grid.n_tiles
    tile_area = float(grid.tile_size**2)
    nominal_km2 = tile_area / 1e6
    covered = coverage_share(grid, placed.coverage)
    if placed.form in (SpatialForm.point, SpatialForm.postcode):
        inside = (
            shapely.contains_xy(placed.coverage, placed.x, placed.y)
            if placed.coverage is not None
            else np.zeros(len(placed.x), bool)
        )
        index = tile_index(grid, placed.x[inside], placed.y[inside])
        keep = index >= 0
        sums = np.bincount(index[keep], weights=placed.values[inside][keep], minlength=n)
        counts = np.bincount(index[keep], minlength=n)
        if total:
            value = sums / nominal_km2
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                value = np.where(counts > 0, sums / counts, np.nan)
        return TileRecordValues(value, covered, covered)
    if placed.form == SpatialForm.parcel:
        poly, tile, area = _overlaps(grid, placed.polygons)
        share = area / shapely.area(placed.polygons[poly])
        if total:
            value = np.bincount(tile, weights=placed.values[poly] * share, minlength=n)
            value = value / nominal_km2
        else:
            weighted = np.bincount(tile, weights=placed.values[poly] * area, minlength=n)
            weights = np.bincount(tile, weights=area, minlength=n)
            with np.errstate(invalid="ignore", divide="ignore"):
                value = np.where(weights > 0, weighted / weights, np.nan)
        return TileRecordValues(value, covered, covered)
    # Administrative units: apportioned by area share; support = area of units with a value.
    sums, means = placed.unit_sums, placed.unit_means
    poly, tile, area = _overlaps(grid, placed.polygons)
    share = area / shapely.area(placed.polygons[poly])
    supported = np.bincount(tile, weights=area, minlength=n) / tile_area
    if total:
        value = np.bincount(tile, weights=sums[poly] * share, minlength=n) / nominal_km2
        value = np.where(supported > 0, value, np.nan)
    else:
        weighted = np.bincount(tile, weights=means[poly] * area, minlength=n)
        weights = np.bincount(tile, weights=area, minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            value = np.where(weights > 0, weighted / weights, np.nan)
    return TileRecordValues(value, np.minimum(supported, 1.0), covered)


def tile_cell_medians(placed: PlacedRecords, grid: TileGrid, cell_m: int) -> np.ndarray:
    """The median of cell medians on one grid: (n_tiles,), NaN where no cell holds a value.

    Where each form's values go (cells of ``cell_m`` on the tile lattice, ``citycube.grid.cells``):

    - **point** and **postcode**: a record goes to the cell its point falls in, and only when
      the point lies inside the coverage, as for the mean;
    - **parcel**: a parcel goes to the cell of its representative point
      (``shapely.point_on_surface``, always inside the parcel, unlike a centroid), wherever the
      parcel lies, as its mean counts it wherever it meets a tile. A parcel spanning several
      cells thus counts once, like a sale at one address;
    - **admin_unit**: a unit's median record value goes to every cell whose centre the unit
      covers (inside or on its edge); a cell covered by several units takes the median of
      their values. A unit smaller than a cell and away from its centre reaches no cell.

    Availability (valid support, coverage) is the form's, from ``tile_values``.
    """
    lattice = CellLattice(grid, cell_m)
    out = np.full(grid.n_tiles, np.nan)
    if placed.form in (SpatialForm.point, SpatialForm.postcode):
        inside = (
            shapely.contains_xy(placed.coverage, placed.x, placed.y)
            if placed.coverage is not None
            else np.zeros(len(placed.x), bool)
        )
        cells = lattice.cell_index(placed.x[inside], placed.y[inside])
        values = placed.values[inside]
    elif placed.form == SpatialForm.parcel:
        points = shapely.point_on_surface(placed.polygons)
        cells = lattice.cell_index(shapely.get_x(points), shapely.get_y(points))
        values = placed.values
    else:
        x, y = lattice.centres()
        tree = shapely.STRtree(placed.polygons)
        cell_idx, unit_idx = tree.query(shapely.points(x, y), predicate="covered_by")
        cells, values = cell_idx, placed.unit_medians[unit_idx]
    tiles, medians = median_of_cell_medians(lattice, cells, values)
    out[tiles] = medians
    return out
