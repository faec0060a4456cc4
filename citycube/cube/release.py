"""Cube I/O: the versioned release layout, partition writes and the DuckDB catalogue.

A release lives under ``<data>/releases/<version>/``. Observations are partitioned by
city/year/modality so rewriting one city-year touches only its files; every file is written
to a temporary name and moved into place, so a killed run never leaves a half-written file.

Draft and published tables. A build writes the Parquet tables (observations, chip index, the
tiles table and the benchmark folder), the derived results per source period and the
quick-looks into the release's draft (``.draft/``), which no reader opens, so a build that
fails or is stopped by a check changes nothing a published release lists. Building the
database takes a snapshot of the draft (``.snapshots/<id>/``: hard links, so no byte is
copied) and copies that snapshot's rows into its own tables, so it names no file and the
release folder can move; the benchmark files computed from the staged database are added to
its snapshot before it is published.
Publishing swaps one folder, ``published/``, for a hard-linked copy of the snapshot in one step
(so a reader of the folder sees every table old or every table new, never new observations
with the old chip index) and points ``.published`` at the snapshot. A writer only ever
replaces a draft file by a new one (a new inode), so a published file is never rewritten: a
reader that opened the database before a rebuild keeps reading the values it was published
with, and a killed build changes nothing a reader sees. A release published before
``published/`` existed keeps its tables in the release folder itself until its next
publication (:attr:`Release.published_root` finds either).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from citycube.catalogue.cities import SCALES, load_cities
from citycube.catalogue.modalities import Catalogue, catalogue_digest
from citycube.errors import CubeWriteError, InvalidNameError
from citycube.io.atomic import atomic_path, write_text_atomic
from citycube.io.atomic import write_json_atomic as _write_json
from citycube.io.scratch import remove_dead_leftovers, remove_dead_leftovers_in

if TYPE_CHECKING:  # imported where used: the release layout alone should load light
    import duckdb
    import geopandas as gpd

BenchmarkViews = Callable[["duckdb.DuckDBPyConnection", Path], object]
"""Adds views over a snapshot's benchmark folder to a database being built (the tasks' views,
:func:`citycube.tasks.views.task_views`); the cube itself knows nothing of them."""

OBSERVATION_SCHEMA = pa.schema(
    [
        pa.field("tile_id", pa.string(), nullable=False),
        pa.field("city", pa.string(), nullable=False),
        pa.field("scale", pa.string(), nullable=False),
        pa.field("year", pa.int16(), nullable=False),
        pa.field("modality", pa.string(), nullable=False),
        pa.field("field", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("unit", pa.string(), nullable=False),
        pa.field("valid_fraction", pa.float64()),
        pa.field("available", pa.bool_(), nullable=False),
        pa.field("reason", pa.string()),
        pa.field("temporal_basis", pa.string(), nullable=False),
        pa.field("source_year", pa.int16()),
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("source_version", pa.string(), nullable=False),
        pa.field("synthetic", pa.bool_(), nullable=False),
    ]
)

CHIP_INDEX_SCHEMA = pa.schema(
    [
        pa.field("tile_id", pa.string(), nullable=False),
        pa.field("city", pa.string(), nullable=False),
        pa.field("scale", pa.string(), nullable=False),
        pa.field("year", pa.int16(), nullable=False),
        pa.field("modality", pa.string(), nullable=False),
        pa.field("store", pa.string(), nullable=False),
        pa.field("row_off", pa.int32(), nullable=False),
        pa.field("col_off", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
        pa.field("width", pa.int32(), nullable=False),
        pa.field("resolution_m", pa.float64(), nullable=False),
        pa.field("valid_fraction", pa.float64(), nullable=False),
        pa.field("available", pa.bool_(), nullable=False),
        pa.field("temporal_basis", pa.string(), nullable=False),
        pa.field("source_year", pa.int16()),
        pa.field("classes", pa.int16()),  # distinct valid ids of a categorical chip, else NULL
    ]
)


RELEASE_VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Release version ids: a letter or digit, then letters, digits, '.', '_' or '-' (64 at most).

A version is a directory name under ``releases/``, a glob in the database's views and a value
in every file's metadata, so path separators, '..', glob and quote characters are refused."""


def validate_release_version(version: str) -> str:
    """``version`` if it is a safe release id, else ``InvalidNameError`` saying what is allowed."""
    if not isinstance(version, str) or not RELEASE_VERSION_PATTERN.fullmatch(version):
        raise InvalidNameError(
            f"release version {version!r} is not allowed: use 1–64 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit (e.g. sample-0.1.0)"
        )
    if ".." in version:
        raise InvalidNameError(f"release version {version!r} is not allowed: it contains '..'")
    return version


TILES_FILE = "tiles.parquet"
"""The tiles table's name in the draft, a snapshot and the published tables."""
BENCHMARK_DIR = "benchmark"
"""The benchmark folder's name in the draft, a snapshot and the published tables (flat: files
only)."""
DERIVED_DIR = "derived"
"""Per-tile results per source period (``<MODALITY>/<city>/<period>.parquet``) in the draft, a
snapshot and the published tables: a build that is blocked or fails changes only the draft's."""
QUICKLOOKS_DIR = "quicklooks"
"""Quick-looks of the chip stores (``<MODALITY>/<city>/<period>.png``), like ``derived``."""

CHIP_FORMATS = ("zarr", "icechunk")
"""Chip store formats a release can write (``Release.chip_format``)."""
BUILD_CHIP_FORMAT = "icechunk"
"""What a build writes unless told otherwise (``CITYCUBE_CHIPS``, the cube resource): a
commit per write, readers on the published commit, a tag per frozen release. It cost about
6 % more CPU than plain Zarr on one city-year's processing (median of ten runs each,
``benchmarks.run --only chip_formats``, on a loaded machine). A
``Release`` made directly keeps plain Zarr unless given a format."""


@dataclass(frozen=True)
class Release:
    """Paths of one versioned release."""

    data_root: Path
    """Root of all CityCube data (sources cache, releases)."""
    version: str
    """Release version id, also recorded in ``release.json`` and every file's metadata."""
    chip_format: str = "zarr"
    """How new chip stores are written: 'zarr' (a plain Zarr v3 folder, swapped in whole) or
    'icechunk' (an icechunk repository: a commit per write, a tag per frozen release). Readers
    follow the chip index, so they read either."""

    def __post_init__(self) -> None:
        validate_release_version(self.version)
        if self.chip_format not in CHIP_FORMATS:
            raise InvalidNameError(
                f"chip format {self.chip_format!r} is not known: use one of "
                f"{', '.join(CHIP_FORMATS)} (CITYCUBE_CHIPS)"
            )

    @property
    def root(self) -> Path:
        """The release directory."""
        return self.data_root / "releases" / self.version

    @property
    def tiles_file(self) -> Path:
        """GeoParquet tiles table, in the draft (where a build writes it)."""
        return self.draft_dir / TILES_FILE

    @property
    def published_tiles_file(self) -> Path:
        """The published GeoParquet tiles table (what readers see)."""
        return self.published_root / TILES_FILE

    @property
    def duckdb_file(self) -> Path:
        """DuckDB database holding the published tables (copied from the Parquet)."""
        return self.root / "cube.duckdb"

    @property
    def staged_duckdb_file(self) -> Path:
        """A new database awaiting its checks; published over ``duckdb_file`` only if they pass."""
        return self.root / ".staging" / "cube.duckdb"

    @property
    def metadata_file(self) -> Path:
        """Release metadata."""
        return self.root / "release.json"

    @property
    def sources_dir(self) -> Path:
        """Local cache of fetched source items (shared by releases)."""
        return self.data_root / "sources"

    @property
    def cache_dir(self) -> Path:
        """Reusable intermediate results (coverage weights, derived tile stats)."""
        return self.data_root / "cache"

    @property
    def draft_dir(self) -> Path:
        """Where builds write the Parquet tables; never read by a published database."""
        return self.root / ".draft"

    @property
    def snapshots_dir(self) -> Path:
        """Snapshots of the draft tables, one per database built (:func:`snapshot_tables`)."""
        return self.root / ".snapshots"

    @property
    def published_pointer(self) -> Path:
        """Symbolic link to the published snapshot (moved by :func:`publish_tables`)."""
        return self.root / ".published"

    @property
    def published_dir(self) -> Path:
        """The folder of published tables, swapped in whole by :func:`publish_tables`."""
        return self.root / "published"

    @property
    def published_root(self) -> Path:
        """Where readers find the published tables: ``published/``, or the release folder
        itself for a release last published before that folder existed."""
        return self.published_dir if self.published_dir.is_dir() else self.root

    def observations_file(self, city: str, year: int, modality: str) -> Path:
        """One partition of the observations table, in the draft (where a build writes it)."""
        return _partition_path(self.draft_dir / "observations", city, year, modality)

    def chip_index_file(self, city: str, year: int, modality: str) -> Path:
        """One partition of the chip index, in the draft (where a build writes it)."""
        return _partition_path(self.draft_dir / "chip_index", city, year, modality)

    def published_observations_file(self, city: str, year: int, modality: str) -> Path:
        """One partition of the published observations table (what readers see)."""
        return _partition_path(self.published_root / "observations", city, year, modality)

    def published_chip_index_file(self, city: str, year: int, modality: str) -> Path:
        """One partition of the published chip index (what readers see)."""
        return _partition_path(self.published_root / "chip_index", city, year, modality)

    def chip_store(self, modality: str, city: str, label: str) -> Path:
        """Chip store of one modality, city and source year (or 'static'), in ``chip_format``."""
        return self.root / "chips" / modality / city / f"{label}.{self.chip_format}"

    def quicklook_file(self, modality: str, city: str, label: str) -> Path:
        """Fixed-colour PNG mosaic of one chip store (source year, epoch start or 'static'),
        in the draft (where a build writes it)."""
        return self.draft_dir / QUICKLOOKS_DIR / modality / city / f"{label}.png"

    def derived_file(self, modality: str, city: str, label: str) -> Path:
        """Per-tile results for one source year, reused by every calendar year it serves, in
        the draft (where a build writes them)."""
        return self.draft_dir / DERIVED_DIR / modality / city / f"{label}.parquet"

    def published_quicklook_file(self, modality: str, city: str, label: str) -> Path:
        """A published quick-look (what readers see)."""
        return self.published_root / QUICKLOOKS_DIR / modality / city / f"{label}.png"

    def published_derived_file(self, modality: str, city: str, label: str) -> Path:
        """Published per-tile results of one source period (what readers see)."""
        return self.published_root / DERIVED_DIR / modality / city / f"{label}.parquet"


def _partition_path(table_dir: Path, city: str, year: int, modality: str) -> Path:
    return table_dir / f"city={city}" / f"year={year}" / f"{modality}.parquet"


def file_metadata(release: Release, **extra: str) -> dict[bytes, bytes]:
    """Parquet key-value metadata stamped on every file of a release."""
    meta = {"citycube:release": release.version, **extra}
    return {k.encode(): str(v).encode() for k, v in meta.items()}


def write_parquet_atomic(
    table: pa.Table, path: Path, metadata: Mapping[bytes, bytes] | None = None
) -> Path:
    """Write a Parquet file (zstd, page checksums, ``metadata`` added to its key-value
    metadata) through :func:`citycube.io.atomic.atomic_path`; a failure is a
    :class:`CubeWriteError`."""
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_leftovers(path)  # left by a killed earlier write
        with atomic_path(path) as tmp:
            # Page checksums: a flipped bit in a data page is an error on read, not a new value.
            pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
    except Exception as exc:
        raise CubeWriteError.writing(path, exc) from exc
    return path


def digest_file(path: Path) -> Path:
    """Where :func:`write_parquet_with_digest` keeps a file's SHA-256 (a hidden sibling)."""
    return path.with_name(f".{path.name}.sha256")


def write_parquet_with_digest(
    table: pa.Table, path: Path, metadata: Mapping[bytes, bytes] | None = None
) -> Path:
    """:func:`write_parquet_atomic`, then the file's SHA-256 beside it (:func:`digest_file`).

    Page checksums cover a Parquet file's data pages, not its footer (schema, statistics,
    key-value metadata): a flipped byte there still reads. The digest covers every byte, so
    :func:`intact_with_digest` can tell a file that may be reused from one to write again. The
    old digest goes first, so a write cut short leaves a file without one (never reused).
    """
    digest = digest_file(path)
    try:
        digest.unlink(missing_ok=True)
    except OSError as exc:
        raise CubeWriteError.writing(digest, exc) from exc
    write_parquet_atomic(table, path, metadata)
    try:
        write_text_atomic(hashlib.sha256(path.read_bytes()).hexdigest() + "\n", digest)
    except OSError as exc:
        raise CubeWriteError.writing(digest, exc) from exc
    return path


def intact_with_digest(path: Path) -> bool:
    """Whether ``path`` still has the SHA-256 recorded when it was written (False: no record)."""
    try:
        recorded = digest_file(path).read_text(encoding="utf-8").strip()
        return hashlib.sha256(path.read_bytes()).hexdigest() == recorded
    except (OSError, UnicodeDecodeError):
        return False


def write_json_atomic(data: Mapping[str, Any], path: Path) -> Path:
    """A release's JSON file (:func:`citycube.io.atomic.write_json_atomic`); a failure is a
    :class:`CubeWriteError`."""
    try:
        return _write_json(data, path)
    except OSError as exc:
        raise CubeWriteError.writing(path, exc) from exc


def tiles_frame(cities: Iterable[str] | None = None) -> gpd.GeoDataFrame:
    """The tiles table: ids, grid position, parent, UTM bounds and WGS84 geometry.

    The cities span 13 UTM zones and a GeoParquet geometry column has a single CRS, so the
    geometry is WGS84 (densified edges) and the UTM bounds travel as plain columns with the
    city's EPSG code.
    """
    import geopandas as gpd
    import shapely
    from pyproj import Transformer
    from shapely.geometry import box

    from citycube.grid.tiles import city_grid

    rows: list[dict[str, Any]] = []
    geoms = []
    for key in cities or load_cities():
        spec = load_cities()[key]
        to_wgs84 = Transformer.from_crs(spec.epsg, 4326, always_xy=True).transform
        for scale in SCALES:
            grid = city_grid(key, scale)
            for tile in grid.tiles():
                xmin, ymin, xmax, ymax = tile.bounds
                poly = box(xmin, ymin, xmax, ymax).segmentize(grid.tile_size / 8)
                geoms.append(shapely.transform(poly, to_wgs84, interleaved=False))
                rows.append(
                    {
                        "tile_id": tile.tile_id,
                        "city": key,
                        "city_name": spec.name,
                        "country": spec.country,
                        "scale": scale,
                        "row": tile.row,
                        "col": tile.col,
                        "parent_id": tile.parent_id,
                        "epsg": spec.epsg,
                        "utm_xmin": xmin,
                        "utm_ymin": ymin,
                        "utm_xmax": xmax,
                        "utm_ymax": ymax,
                    }
                )
    frame = gpd.GeoDataFrame(rows, geometry=geoms, crs="EPSG:4326")
    bounds = frame.geometry.bounds
    frame["lon_min"], frame["lat_min"] = bounds["minx"], bounds["miny"]
    frame["lon_max"], frame["lat_max"] = bounds["maxx"], bounds["maxy"]
    return frame


def write_tiles(release: Release) -> Path:
    """Write the GeoParquet tiles table for all cities into the draft, atomically."""
    path = release.tiles_file
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tiles_frame().to_parquet(tmp, index=False, compression="zstd")
    return path


def catalogue_table(catalogue: Catalogue) -> pa.Table:
    """One row per modality field: what is released and how."""
    rows = []
    for m in catalogue.modalities:
        for f in m.fields:
            rows.append(
                {
                    "modality": m.code,
                    "label": m.display_code,
                    "name": m.name,
                    "family": m.family,
                    "kind": m.kind.value,
                    "temporal": m.temporal.value,
                    "field": f.name,
                    "unit": f.unit,
                    "product": f.product or m.product,
                    "aggregation": m.aggregation_of(f),
                    "min_valid_fraction": m.validity.min_valid_fraction,
                    "chip_resolution_m": m.chip.resolution_m if m.chip else None,
                    "chip_resampling": m.chip.resampling.value if m.chip else None,
                    "processing": m.processing.value,
                }
            )
    return pa.Table.from_pylist(rows)


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


_PARTITION_FILE = re.compile(r"city=([^/]+)/year=(\d{4})/([A-Za-z0-9]+)\.parquet")
"""``city=<key>/year=<yyyy>/<MODALITY>.parquet`` under observations/ and chip_index/."""


def _partitions(root: Path) -> list[dict[str, Any]]:
    """(city, year, modality) of every partition file under ``root`` now."""
    found = []
    for path in sorted(root.glob("city=*/year=*/*.parquet")) if root.exists() else []:
        match = _PARTITION_FILE.fullmatch(path.relative_to(root).as_posix())
        if match:
            city, year, modality = match.groups()
            found.append({"city": city, "year": int(year), "modality": modality})
    return found


def observation_partitions(release: Release) -> list[dict[str, Any]]:
    """(city, year, modality) of every published observations partition file of a release, or
    of its draft when it was never published."""
    published = release.published_root / "observations"
    return _partitions(published if published.exists() else release.draft_dir / "observations")


PUBLISHED_TABLES = ("observations", "chip_index")
"""The partitioned Parquet tables that go draft → snapshot → published."""
PUBLISHED_TREES = (DERIVED_DIR, QUICKLOOKS_DIR)
"""Folders of per-period results that go draft → snapshot → published, file by file (their
hidden files, the draft's digests and temporary files, stay in the draft)."""
PUBLISHED_NAMES = (*PUBLISHED_TABLES, TILES_FILE, BENCHMARK_DIR, *PUBLISHED_TREES)
"""Everything that goes draft → snapshot → published: the partitioned tables, the tiles table,
the benchmark folder, the derived results and quick-looks. A publication switches them
together."""
KEPT_SNAPSHOTS = 2
"""Newest snapshots kept after a publication (the published one always is): a reader that
opened the database before the last publication keeps its files; older ones are deleted."""
_SNAPSHOT_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{12}")
"""``<UTC time>-<microsecond, 5 hex digits><random, 7>``: snapshot ids sort by the time they
were taken, to the microsecond (two publications within one second keep their order)."""


def validate_snapshot_id(snapshot: str) -> str:
    """``snapshot`` if it is a snapshot id (it names a folder), else ``InvalidNameError``."""
    if not isinstance(snapshot, str) or not _SNAPSHOT_ID.fullmatch(snapshot):
        raise InvalidNameError(f"{snapshot!r} is not a snapshot id (e.g. 20260101T120000Z-…)")
    return snapshot


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link (no bytes copied); a copy where the file system has none."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _adopt_unversioned_tables(release: Release) -> None:
    """Bring tables written before the draft held them into the draft, where it has none:
    partitions written straight into the published ``observations/`` and ``chip_index/``
    (before drafts existed), and the tiles table and benchmark folder written straight into
    the release folder (before they went through the draft)."""
    if not release.published_pointer.is_symlink():  # else the draft holds every partition
        for table in PUBLISHED_TABLES:
            legacy = release.root / table
            for partition in _partitions(legacy):
                target = _partition_path(release.draft_dir / table, **partition)
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _link_or_copy(_partition_path(legacy, **partition), target)
    published = release.published_root
    if not release.tiles_file.exists() and (published / TILES_FILE).is_file():
        release.tiles_file.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(published / TILES_FILE, release.tiles_file)
    draft_benchmark = release.draft_dir / BENCHMARK_DIR
    if not draft_benchmark.exists() and (published / BENCHMARK_DIR).is_dir():
        with atomic_path(draft_benchmark) as tmp:
            _link_folder(published / BENCHMARK_DIR, tmp)
    for tree in PUBLISHED_TREES:  # written into the release folder before the draft held them
        legacy = release.root / tree
        if legacy.is_dir() and not legacy.is_symlink():
            for path in sorted(legacy.rglob("*")):
                if path.is_file():
                    adopt_draft_file(release, release.draft_dir / path.relative_to(release.root))


def adopt_draft_file(release: Release, path: Path) -> bool:
    """Give the draft file ``path`` (a derived result or quick-look) the bytes a build of an
    earlier layout wrote into the release folder itself, by a hard link, with its digest where
    it has one; whether it did. So the first build after the draft held them reuses them
    rather than computing them again."""
    if path.exists():
        return False
    try:
        relative = path.relative_to(release.draft_dir)
    except ValueError:
        return False
    legacy = release.root / relative
    if relative.parts[:1] not in ((DERIVED_DIR,), (QUICKLOOKS_DIR,)) or not legacy.is_file():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        for source, target in ((legacy, path), (digest_file(legacy), digest_file(path))):
            if source.is_file() and not target.exists():
                _link_or_copy(source, target)
    except OSError as exc:
        raise CubeWriteError.writing(path, exc) from exc
    return True


def _link_table(source: Path, target: Path) -> None:
    """Hard-link every partition file of the table folder ``source`` into ``target``."""
    target.mkdir(parents=True)
    for partition in _partitions(source):
        link = _partition_path(target, **partition)
        link.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(_partition_path(source, **partition), link)


def _link_folder(source: Path, target: Path) -> None:
    """Hard-link every file directly in ``source`` (not hidden: no temporary or digest file)
    into a new folder ``target``."""
    target.mkdir(parents=True)
    for path in sorted(source.iterdir()) if source.is_dir() else []:
        if path.is_file() and not path.name.startswith("."):
            _link_or_copy(path, target / path.name)


def _link_tree(source: Path, target: Path) -> None:
    """Hard-link every file under ``source`` whose name is not hidden (no temporary file or
    digest) into the same place under ``target``."""
    for folder, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        kept = [name for name in sorted(files) if not name.startswith(".")]
        if not kept:
            continue
        into = target / Path(folder).relative_to(source)
        into.mkdir(parents=True, exist_ok=True)
        for name in kept:
            _link_or_copy(Path(folder) / name, into / name)


def _link_tables(source: Path, target: Path, fallback: Path | None = None) -> None:
    """Hard-link everything a publication switches (:data:`PUBLISHED_NAMES`) from the folder
    ``source`` (the draft, a snapshot) into a new folder ``target``. The tiles table, the
    benchmark folder and the derived results and quick-looks come from ``fallback`` where
    ``source`` has none (a snapshot taken before they were part of one)."""
    target.mkdir(parents=True)
    for tree in PUBLISHED_TREES:
        folder = source / tree
        if not folder.is_dir() and fallback is not None:
            folder = fallback / tree
        if folder.is_dir():
            _link_tree(folder, target / tree)
    for table in PUBLISHED_TABLES:
        _link_table(source / table, target / table)
    tiles = source / TILES_FILE
    if not tiles.is_file() and fallback is not None:
        tiles = fallback / TILES_FILE
    if tiles.is_file():
        _link_or_copy(tiles, target / TILES_FILE)
    benchmark = source / BENCHMARK_DIR
    if not benchmark.is_dir() and fallback is not None:
        benchmark = fallback / BENCHMARK_DIR
    if benchmark.is_dir():
        _link_folder(benchmark, target / BENCHMARK_DIR)


def snapshot_tables(release: Release) -> str:
    """Take a snapshot of the draft tables as they are now; return its id.

    Every partition file, the tiles table and the benchmark files are hard-linked into
    ``.snapshots/<id>/``: writers replace a draft file by a new one, never rewrite it, so the
    snapshot keeps these bytes whatever the draft becomes. The snapshot is laid out under a
    temporary name and renamed when complete.
    """
    _adopt_unversioned_tables(release)
    now_us = time.time_ns() // 1000
    taken = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_us // 1_000_000))
    snapshot = f"{taken}-{now_us % 1_000_000:05x}{uuid.uuid4().hex[:7]}"
    final = release.snapshots_dir / snapshot
    try:
        release.snapshots_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(final) as tmp:
            _link_tables(release.draft_dir, tmp)
    except OSError as exc:
        raise CubeWriteError.writing(final, exc) from exc
    return snapshot


def published_snapshot(release: Release) -> str | None:
    """The id of the published snapshot, or None when the release was never published."""
    try:
        target = os.readlink(release.published_pointer)
    except OSError:
        return None
    try:
        return validate_snapshot_id(Path(target).name)
    except InvalidNameError:
        return None


def _replace_symlink(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` (relative) in one rename: readers see the old or the new."""
    try:
        with atomic_path(link) as tmp:
            os.symlink(target, tmp)
    except OSError as exc:
        raise CubeWriteError.writing(link, exc) from exc


def publish_tables(release: Release, snapshot: str) -> None:
    """Make ``snapshot`` the published tables.

    ``published/`` becomes a hard-linked copy of the snapshot (observations, chip index,
    tiles table, benchmark folder), swapped in whole in one step: a reader of the folder sees
    all the previous tables or all the new ones. ``.published`` records which snapshot they
    are. The database holds the snapshot's rows itself.
    The tables of a release published before ``published/`` existed, in the release folder
    itself, are removed once ``published/`` is in place.
    """
    folder = release.snapshots_dir / validate_snapshot_id(snapshot)
    if not folder.is_dir():
        raise CubeWriteError(f"no snapshot {snapshot} in {release.snapshots_dir}: rebuild")
    dest = release.published_dir
    try:
        remove_dead_leftovers(dest)
        with atomic_path(dest) as tmp:  # swapped whole for the folder there (replace_dir_atomic)
            _link_tables(folder, tmp, fallback=release.published_root)
    except OSError as exc:
        raise CubeWriteError.writing(dest, exc) from exc
    _replace_symlink(release.published_pointer, Path(release.snapshots_dir.name) / snapshot)
    _remove_tables_of_the_old_layout(release)


def _remove_tables_of_the_old_layout(release: Release) -> None:
    """Delete the tables a release published into its own folder before ``published/``
    existed (readers find ``published/`` first; open files keep their bytes)."""
    for name in PUBLISHED_NAMES:
        legacy = release.root / name
        if legacy.is_dir() and not legacy.is_symlink():
            shutil.rmtree(legacy, ignore_errors=True)
        elif legacy.is_file() or legacy.is_symlink():
            legacy.unlink(missing_ok=True)


def build_database(release: Release) -> Path:
    """The database a build's steps after the staged database read: the staged one until it
    is published (what would be published), else the published one (a step run on its own)."""
    staged = release.staged_duckdb_file
    return staged if staged.exists() else release.duckdb_file


def snapshot_table_path(release: Release, snapshot: str, name: str) -> Path:
    """``name`` (:data:`TILES_FILE`, :data:`BENCHMARK_DIR`) in a snapshot; the published one
    where the snapshot has none (taken before they were part of snapshots)."""
    path = release.snapshots_dir / validate_snapshot_id(snapshot) / name
    return path if path.exists() else release.published_root / name


def build_tiles_file(release: Release) -> Path:
    """The tiles table a build's later steps read: the one the :func:`build_database` reads."""
    return snapshot_table_path(release, database_snapshot(build_database(release)), TILES_FILE)


def stage_benchmark(release: Release) -> Path | None:
    """Put the draft's benchmark folder into the snapshot the staged database reads, so that it
    is published with the tables it was computed from; return that folder.

    The snapshot is not published yet, and its old benchmark folder is swapped whole for new
    hard links (no file is rewritten). None when no database is staged: the files wait in the
    draft for the next build's snapshot.
    """
    staged = release.staged_duckdb_file
    if not staged.exists():
        return None
    snapshot = database_snapshot(staged)
    if snapshot == published_snapshot(release):
        raise CubeWriteError(
            f"the staged database {staged} reads the published snapshot {snapshot}: "
            "materialise cube/staged_database again"
        )
    dest = release.snapshots_dir / snapshot / BENCHMARK_DIR
    try:
        remove_dead_leftovers(dest)
        with atomic_path(dest) as tmp:  # swapped whole for the folder there (replace_dir_atomic)
            _link_folder(release.draft_dir / BENCHMARK_DIR, tmp)
    except OSError as exc:
        raise CubeWriteError.writing(dest, exc) from exc
    return dest


def snapshot_time(snapshot: str) -> datetime:
    """When a snapshot was taken (UTC, to the second), from its id."""
    return datetime.strptime(validate_snapshot_id(snapshot)[:16], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=UTC
    )


def prune_snapshots(
    release: Release, keep: int = KEPT_SNAPSHOTS, older_than: datetime | None = None
) -> list[str]:
    """Delete the snapshots other than the published one and the ``keep`` newest; with
    ``older_than``, only those taken before it. Return their ids. Left-overs of snapshots cut
    short by a killed build go too."""
    if not release.snapshots_dir.is_dir():
        return []
    published = published_snapshot(release)
    snapshots = sorted(
        p.name for p in release.snapshots_dir.iterdir() if _SNAPSHOT_ID.fullmatch(p.name)
    )
    kept = {published, *snapshots[-keep:]} if keep > 0 else {published}
    removed = [
        s
        for s in snapshots
        if s not in kept and (older_than is None or snapshot_time(s) < older_than)
    ]
    for snapshot in removed:
        shutil.rmtree(release.snapshots_dir / snapshot, ignore_errors=True)
    remove_dead_leftovers_in(release.snapshots_dir)
    return removed


TABLE_ORDER = {
    "observations": ("modality", "city", "tile_id", "year", "field"),
    "chip_index": ("modality", "city", "tile_id", "year"),
}
"""How the partition tables are sorted in ``cube.duckdb``: by the filters readers use most (a
modality, a city, a tile), so that each block's min/max statistics let a query skip the rest."""


def _partition_table(
    con: duckdb.DuckDBPyConnection, name: str, root: Path, schema: pa.Schema
) -> None:
    """A table ``name`` in the database holding the partition files under ``root`` (a
    snapshot's table), and only those.

    The rows are copied into the database (sorted by :data:`TABLE_ORDER`) rather than read
    through a view over the files: a query reads DuckDB's own column blocks, and the database
    names no path, so it answers the same after the release folder is moved or copied. The
    (city, year, modality) partitions copied are listed in ``published_<name>``.
    """
    partitions = _partitions(root)
    published = f"published_{name}"
    con.register("_published", pa.Table.from_pylist(partitions, schema=_PUBLISHED_SCHEMA))
    con.execute(f"CREATE TABLE {published} AS SELECT * FROM _published")
    con.unregister("_published")
    if partitions:
        pattern = _sql_str(str(root.resolve() / "city=*" / "year=*" / "*.parquet"))
        order = ", ".join(TABLE_ORDER[name])
        con.execute(
            f"CREATE TABLE {name} AS SELECT o.* FROM read_parquet({pattern}, "
            "hive_partitioning = false, union_by_name = true) AS o "
            f"SEMI JOIN {published} AS p "
            "ON o.city = p.city AND o.year = p.year AND o.modality = p.modality "
            f"ORDER BY {order}"
        )
    else:  # typed and empty
        types = {"string": "VARCHAR", "int16": "SMALLINT", "int32": "INTEGER"}
        types |= {"double": "DOUBLE", "bool": "BOOLEAN"}
        columns = ", ".join(f"{f.name} {types[str(f.type)]}" for f in schema)
        con.execute(f"CREATE TABLE {name} ({columns})")


def drop_table(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Drop table ``name`` of the main schema if there is one (a view of that name stays): a
    view over a file is about to replace the table an earlier build copied its rows into."""
    found = con.execute(
        "SELECT 1 FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = ?", [name]
    ).fetchone()
    if found:
        con.execute(f'DROP TABLE "{name}"')


def create_file_view(con: duckdb.DuckDBPyConnection, name: str, path: Path) -> None:
    """View ``name`` over the Parquet file ``path`` (replacing a table of that name an earlier
    build copied rows into); publication turns it into a table (:func:`tables_from_file_views`).
    ``name`` comes from code, never from a user: it must be a plain identifier."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
        raise ValueError(f"not a view name: {name!r}")
    quoted = "'" + str(path.resolve()).replace("'", "''") + "'"
    drop_table(con, name)
    con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet({quoted})")


_FILE_VIEW = re.compile(r"CREATE VIEW (\w+) AS SELECT \* FROM read_parquet\('((?:[^']|'')*)'\);?")


def tables_from_file_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Replace each view that reads one Parquet file whole (``SELECT * FROM read_parquet('…')``,
    as the benchmark tasks create them) by a table holding its rows; the names replaced.

    A view names its file by an absolute path, which breaks when the release folder moves;
    a table travels with the database. Views over these (e.g. ``translation_routes`` over
    ``translation_pairs``) keep working: DuckDB binds a view's names when it is queried.
    """
    views = con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'"
    ).fetchall()
    replaced = []
    for name, sql in views:
        found = _FILE_VIEW.fullmatch((sql or "").strip())
        if found is None or found.group(1) != name:
            continue
        source = found.group(2)  # a quoted literal already
        con.execute(f"CREATE TABLE _file_view_rows AS SELECT * FROM read_parquet('{source}')")
        con.execute(f"DROP VIEW {name}")
        con.execute(f"ALTER TABLE _file_view_rows RENAME TO {name}")
        replaced.append(name)
    return replaced


_PUBLISHED_SCHEMA = pa.schema(
    [("city", pa.string()), ("year", pa.int16()), ("modality", pa.string())]
)
"""The partitions a database publishes (tables ``published_observations`` and
``published_chip_index``)."""


SNAPSHOT_KEY = "snapshot"
"""Key of the snapshot id in a database's ``release`` table and in ``release.json``."""


@contextlib.contextmanager
def atomic_database(path: Path, *, copy: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to a new database (a copy of the one at ``path`` with ``copy``) that
    replaces ``path`` in one rename when the block ends well (:func:`atomic_path`); its
    temporary file and write-ahead log are removed either way."""
    import duckdb

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        try:
            if copy:
                shutil.copyfile(path, tmp)
            with duckdb.connect(str(tmp)) as con:
                yield con
        finally:
            Path(f"{tmp}.wal").unlink(missing_ok=True)


def build_duckdb(
    release: Release,
    catalogue: Catalogue,
    metadata: Mapping[str, Any],
    path: Path | None = None,
    snapshot: str | None = None,
    benchmark_views: BenchmarkViews | None = None,
) -> Path:
    """(Re)build ``cube.duckdb`` (or the database at ``path``): the rows of one snapshot of the
    Parquet tables copied into tables (:func:`_partition_table`), plus metadata tables.

    Without ``snapshot``, a new one is taken of the draft (:func:`snapshot_tables`); its id is
    recorded in the ``release`` table. Building ``cube.duckdb`` itself publishes the snapshot
    too (unless it is the published one already: ``citycube views`` changes no table); a
    database built elsewhere (the staged one) is published by :func:`publish_database`. The
    database names no file (the benchmark's views over files become tables too,
    :func:`tables_from_file_views`), so it works from any directory and after the release
    folder is moved or copied.
    """
    path = path or release.duckdb_file
    snapshot = validate_snapshot_id(snapshot) if snapshot else snapshot_tables(release)
    publishing = path == release.duckdb_file and snapshot != published_snapshot(release)
    tables = (release.snapshots_dir / snapshot).resolve()
    metadata = {**metadata, SNAPSHOT_KEY: snapshot}
    with atomic_database(path) as con:
        tiles_file = snapshot_table_path(release, snapshot, TILES_FILE)
        tiles = _sql_str(str(tiles_file.resolve()))
        con.execute(f"CREATE TABLE tiles AS SELECT * FROM read_parquet({tiles}) ORDER BY tile_id")
        _partition_table(con, "observations", tables / "observations", OBSERVATION_SCHEMA)
        _partition_table(con, "chip_index", tables / "chip_index", CHIP_INDEX_SCHEMA)
        con.register("_modalities", catalogue_table(catalogue))
        con.execute("CREATE TABLE modalities AS SELECT * FROM _modalities")
        con.unregister("_modalities")
        meta_rows = [  # keys sorted: the same metadata read back from release.json, same rows
            {"key": k, "value": json.dumps(v, default=str, sort_keys=True)}
            for k, v in metadata.items()
        ]
        con.register("_release", pa.Table.from_pylist(meta_rows))
        con.execute("CREATE TABLE release AS SELECT * FROM _release")
        con.unregister("_release")
        con.execute(
            """
            CREATE VIEW availability AS
            WITH per_field AS (
                SELECT city, year, modality, field, bool_or(available) AS field_available
                FROM observations GROUP BY city, year, modality, field
            )
            SELECT city, year, modality,
                   count(DISTINCT o.tile_id) FILTER (WHERE o.available) AS available_tiles,
                   count(DISTINCT o.tile_id) AS tiles,
                   any_value(f.available_fields) AS available_fields,
                   any_value(f.fields) AS fields,
                   any_value(f.all_fields) AS available
            FROM observations AS o
            JOIN (SELECT city, year, modality,
                         count(*) FILTER (WHERE field_available) AS available_fields,
                         count(*) AS fields,
                         bool_and(field_available) AS all_fields
                  FROM per_field GROUP BY city, year, modality) AS f
            USING (city, year, modality)
            GROUP BY city, year, modality
            """
        )
        if benchmark_views is not None:  # over the benchmark files already written
            benchmark_views(con, snapshot_table_path(release, snapshot, BENCHMARK_DIR))
            tables_from_file_views(con)
    if publishing:
        publish_tables(release, snapshot)
        prune_snapshots(release)
    return path


def database_snapshot(path: Path) -> str:
    """The snapshot id a database's views read (from its ``release`` table)."""
    import duckdb

    try:
        with duckdb.connect(str(path), read_only=True) as con:
            row = con.execute("SELECT value FROM release WHERE key = ?", [SNAPSHOT_KEY]).fetchone()
    except duckdb.Error as exc:
        raise CubeWriteError(f"cannot read the database {path} ({exc}): rebuild it") from exc
    if row is None:
        raise CubeWriteError(f"the database {path} names no snapshot of its tables: rebuild it")
    return validate_snapshot_id(json.loads(row[0]))


def publish_database(release: Release, metadata: Mapping[str, Any]) -> Path:
    """Publish the checked staged database and the snapshot of the tables it reads, and record
    the release metadata.

    Each step is one rename: readers see the previous database or the new one, all the
    previous tables or all the new ones, never a half-written file or a half-built city-year.
    """
    staged = release.staged_duckdb_file
    if not staged.exists():
        raise CubeWriteError(
            f"no staged database at {staged}: materialise cube/staged_database first"
        )
    snapshot = database_snapshot(staged)
    os.replace(staged, release.duckdb_file)
    publish_tables(release, snapshot)
    write_json_atomic({**metadata, SNAPSHOT_KEY: snapshot}, release.metadata_file)
    prune_snapshots(release)
    if any((release.root / "chips").glob("*/*/*.icechunk")):
        from citycube.cube.chips_icechunk import publish_chip_stores

        publish_chip_stores(release)
    return release.duckdb_file


def release_metadata(
    release: Release,
    *,
    source_set: str,
    synthetic: bool,
    sources: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Metadata recorded in ``release.json`` and the DuckDB ``release`` table.

    ``sources`` lists each product's adapter, version, synthetic flag, licence and attribution.
    """
    return {
        "version": release.version,
        "source_set": source_set,
        "sources": dict(sources or {}),
        "synthetic": synthetic,
        "notice": (
            "SYNTHETIC SAMPLE DATA: generated by CityCube's sample backend; not observations."
            if synthetic
            else "Built from the configured real sources."
        ),
        "catalogue_digest": catalogue_digest(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(extra or {}),
    }


def build_connection(release: Release) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the database a build is about to publish (the staged one;
    the published one when a benchmark step runs on its own, outside a build)."""
    import duckdb

    path = build_database(release)
    if not path.exists():
        raise CubeWriteError(
            f"no staged or published cube at {path}: materialise cube/staged_database first"
        )
    return duckdb.connect(str(path), read_only=True)
