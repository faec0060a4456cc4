"""The translation benchmark's files in a release, and their DuckDB views.

Everything is computed from the cube a build is about to publish (the ``observations`` and
``chip_index`` views of the staged database, :func:`citycube.cube.release.build_database`), so the
benchmark follows whatever city-years the cube holds and picks up new ones each time it is
rebuilt. Files are written into the draft's ``benchmark/`` folder, each whole under a temporary
name and moved into place, then added to the staged database's snapshot
(:func:`citycube.tasks.views.stage_views`): they are published with the tables they were computed
from, in the same step, under ``published/benchmark/``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from citycube.catalogue.modalities import Catalogue, Kind
from citycube.cube.release import (
    BENCHMARK_DIR,
    Release,
    build_connection,
    build_tiles_file,
    drop_table,
    file_metadata,
    write_json_atomic,
    write_parquet_atomic,
)
from citycube.io.digest import file_sha256
from citycube.tasks.pairs import (
    modality_order,
    pair_index,
    product_matrix,
    route_count_long,
    route_count_table,
    route_counts,
    route_counts_by_product,
    write_route_heatmap,
)
from citycube.tasks.sampling import DEFAULT_TOTAL, SAMPLING_SEED, SampleResult, sample_instances
from citycube.tasks.splits import SPLIT_SEED, SPLIT_SHARES, split_summary, tile_splits

if TYPE_CHECKING:
    import duckdb


@dataclass(frozen=True)
class BenchmarkFiles:
    """Paths of the translation benchmark's files in one benchmark folder."""

    root: Path
    """The folder: the draft's (:meth:`draft`), a snapshot's or the published one
    (:meth:`published`)."""

    @classmethod
    def draft(cls, release: Release) -> BenchmarkFiles:
        """Where a build writes them (no reader opens the draft)."""
        return cls(release.draft_dir / BENCHMARK_DIR)

    @classmethod
    def published(cls, release: Release) -> BenchmarkFiles:
        """The published ones (what readers see)."""
        return cls(release.published_root / BENCHMARK_DIR)

    @property
    def pairs(self) -> Path:
        """Pair index: one row per key with its offered modalities."""
        return self.root / "translation_pairs.parquet"

    @property
    def route_counts(self) -> Path:
        """Pair counts per route in Table 14's form (source rows, target columns)."""
        return self.root / "route_counts.parquet"

    @property
    def route_counts_long(self) -> Path:
        """Pair counts as (source, target, pairs, pairs_by_product): one pair per key, and in
        AgenticCity-Bench Table 14's unit (once per source product at each end)."""
        return self.root / "route_counts_long.parquet"

    @property
    def heatmap(self) -> Path:
        """Source × target heatmap of the pair counts."""
        return self.root / "route_counts.png"

    @property
    def splits(self) -> Path:
        """Partition of every tile."""
        return self.root / "splits.parquet"

    @property
    def single_class(self) -> Path:
        """Categorical chips holding one class, per (tile, year, modality)."""
        return self.root / "single_class.parquet"

    @property
    def instances(self) -> Path:
        """Sampled translation instances."""
        return self.root / "instances.parquet"

    @property
    def instance_routes(self) -> Path:
        """Per split and route: pairs available, quota and sampled."""
        return self.root / "instance_routes.parquet"

    @property
    def manifest(self) -> Path:
        """Seed, settings, asked-for and achieved counts, and the instance file's hash."""
        return self.root / "instances_manifest.json"


# ------------------------------------------------------------------------------ pair index


def published_connection(release: Release) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the published ``cube.duckdb``."""
    import duckdb

    from citycube.errors import CubeWriteError

    if not release.duckdb_file.exists():
        raise CubeWriteError(
            f"no published cube at {release.duckdb_file}: materialise cube/database first"
        )
    return duckdb.connect(str(release.duckdb_file), read_only=True)


def write_pair_index(release: Release, catalogue: Catalogue) -> dict[str, Any]:
    """Pair index, Table 14 counts (Parquet, both forms) and heatmap of the cube being built,
    into the draft."""
    files = BenchmarkFiles.draft(release)
    with build_connection(release) as con:
        pairs = pair_index(con, catalogue)
    order = modality_order(catalogue)
    counts = route_counts(pairs["modality_mask"].to_numpy(), len(order))
    by_product = route_counts_by_product(product_matrix(pairs, order))
    meta = file_metadata(release, **{"citycube:modality_order": ",".join(order)})
    write_parquet_atomic(pairs, files.pairs, meta)
    write_parquet_atomic(route_count_table(counts, order, catalogue), files.route_counts, meta)
    long = route_count_long(counts, order, by_product)
    write_parquet_atomic(long, files.route_counts_long, meta)
    labels = [catalogue.get(c).display_code for c in order]
    write_route_heatmap(counts, labels, files.heatmap)
    city_years = len(set(zip(pairs["city"].to_pylist(), pairs["year"].to_pylist(), strict=True)))
    return {
        "keys": pairs.num_rows,
        "city_years": city_years,
        "pairs": int(counts.sum()),
        "pairs_by_product": int(by_product.sum()),
        "routes_with_pairs": int((counts > 0).sum()),
        "counts": counts,
        "labels": labels,
    }


# ------------------------------------------------------------------------------ splits

SPLIT_COLUMNS = ("tile_id", "city", "scale", "parent_id")
"""Columns of the tiles table the splits read (with the UTM bounds, for the overlap check)."""


def write_splits(release: Release, seed: int = SPLIT_SEED) -> dict[str, Any]:
    """Partition of every tile of the tiles table being built, by whole parent cells, into
    the draft."""
    from citycube.tasks.splits import cross_split_overlaps

    tiles = pq.read_table(
        build_tiles_file(release),
        columns=[*SPLIT_COLUMNS, "utm_xmin", "utm_ymin", "utm_xmax", "utm_ymax"],
    )
    splits = tile_splits(tiles, seed=seed)
    overlaps = cross_split_overlaps(tiles, splits)
    meta = file_metadata(
        release,
        **{
            "citycube:split_seed": str(seed),
            "citycube:split_shares": json.dumps(dict(SPLIT_SHARES)),
        },
    )
    write_parquet_atomic(splits, BenchmarkFiles.draft(release).splits, meta)
    return {"seed": seed, "summary": split_summary(splits), "overlaps": overlaps}


# ------------------------------------------------------------------------------ diversity


def categorical_codes(catalogue: Catalogue) -> list[str]:
    """Modalities whose targets are class maps (sampled with the diversity rule)."""
    return [m.code for m in catalogue.modalities if m.kind == Kind.CATEGORICAL_IMAGE]


def single_class_flags(
    release: Release, con: duckdb.DuckDBPyConnection, codes: Iterable[str]
) -> pa.Table:
    """(tile_id, year, modality, single_class) of every available categorical chip.

    A chip is single-class when all its valid pixels hold one id. The chip index records each
    categorical chip's distinct ids (``classes``, counted when the chip was written), so this
    is one query; chips indexed without the count (by an older build) are read from their Zarr
    store instead.
    """
    codes = list(codes)
    if not codes:
        return _flags_table([], [], [], [])
    marks = ", ".join("?" for _ in codes)
    index = con.execute(
        f"""
        SELECT tile_id, year, modality, store, row_off, col_off, height, width,
               {"classes" if _has_classes(con) else "NULL::SMALLINT AS classes"}
        FROM chip_index WHERE available AND modality IN ({marks})
        ORDER BY modality, tile_id, year
        """,
        codes,
    ).to_arrow_table()
    classes = index["classes"].to_numpy(zero_copy_only=False)
    known = ~np.isnan(classes.astype(np.float64))
    flags = np.zeros(index.num_rows, dtype=bool)
    flags[known] = classes[known].astype(np.float64) == 1
    if not known.all():
        unknown = np.flatnonzero(~known)
        read = _single_class_from_stores(release, index.take(pa.array(unknown)))
        flags[unknown] = read
    return _flags_table(
        index["tile_id"].to_pylist(),
        index["year"].to_pylist(),
        index["modality"].to_pylist(),
        flags.tolist(),
    )


def _has_classes(con: duckdb.DuckDBPyConnection) -> bool:
    names = [row[0] for row in con.execute("DESCRIBE chip_index").fetchall()]
    return "classes" in names


def _single_class_from_stores(release: Release, index: pa.Table) -> np.ndarray:
    """Single-class flags of chip-index rows read from their chip stores (plain Zarr or
    icechunk, at the published commit).

    Each store is read once per group of equal windows on one lattice (a scale's tiles), as a
    reshaped block: no per-tile loop over pixels.
    """
    from citycube.cube.chips import open_chip_group

    rows = index.to_pydict()
    out = np.zeros(index.num_rows, dtype=bool)
    by_store: dict[str, list[int]] = {}
    for i, store in enumerate(rows["store"]):
        by_store.setdefault(store, []).append(i)
    for store, members_of_store in by_store.items():
        path = release.root / store
        if not path.exists():
            continue
        group = open_chip_group(path)
        lattices: dict[tuple[int, int, int, int], list[int]] = {}
        for i in members_of_store:
            h, w = rows["height"][i], rows["width"][i]
            key = (h, w, rows["row_off"][i] % h, rows["col_off"][i] % w)
            lattices.setdefault(key, []).append(i)
        for (h, w, _, _), members in lattices.items():
            r = np.array([rows["row_off"][i] for i in members])
            c = np.array([rows["col_off"][i] for i in members])
            r0, c0 = int(r.min()), int(c.min())
            n_r, n_c = (int(r.max()) - r0) // h + 1, (int(c.max()) - c0) // w + 1
            rows_px, cols_px = slice(r0, r0 + n_r * h), slice(c0, c0 + n_c * w)
            ids = np.asarray(group["data"][0, rows_px, cols_px])
            valid = np.asarray(group["valid"][rows_px, cols_px]).astype(bool)
            ids, valid = ids.reshape(n_r, h, n_c, w), valid.reshape(n_r, h, n_c, w)
            info = np.iinfo(ids.dtype) if ids.dtype.kind in "iu" else np.finfo(ids.dtype)
            low = np.where(valid, ids, info.max).min(axis=(1, 3))  # none valid: low > high
            high = np.where(valid, ids, info.min).max(axis=(1, 3))
            out[members] = (low == high)[(r - r0) // h, (c - c0) // w]
    return out


def _flags_table(tile_ids: list, years: list, modalities: list, flags: list) -> pa.Table:
    return pa.table(
        {
            "tile_id": pa.array(tile_ids, pa.string()),
            "year": pa.array(years, pa.int16()),
            "modality": pa.array(modalities, pa.string()),
            "single_class": pa.array(flags, pa.bool_()),
        }
    )


# ------------------------------------------------------------------------------ instances


def write_instances(
    release: Release,
    catalogue: Catalogue,
    *,
    total: int = DEFAULT_TOTAL,
    seed: int = SAMPLING_SEED,
) -> SampleResult:
    """Sample instances from the draft's pair index and splits; write them with their
    manifest into the draft."""
    files = BenchmarkFiles.draft(release)
    pairs = pq.read_table(files.pairs)
    splits = pq.read_table(files.splits, columns=["tile_id", "split"])
    codes = categorical_codes(catalogue)
    with build_connection(release) as con:
        flags = single_class_flags(release, con, codes)
    meta = file_metadata(release, **{"citycube:sampling_seed": str(seed)})
    write_parquet_atomic(flags, files.single_class, meta)
    result = sample_instances(
        pairs,
        splits,
        modality_order(catalogue),
        categorical=codes,
        single_class=flags,
        total=total,
        seed=seed,
    )
    write_parquet_atomic(result.instances, files.instances, meta)
    write_parquet_atomic(result.routes, files.instance_routes, meta)
    split_seed = (pq.read_schema(files.splits).metadata or {}).get(b"citycube:split_seed", b"")
    manifest = {
        "release": release.version,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **result.settings,
        "split_seed": int(split_seed) if split_seed else None,
        "requested": result.requested,
        "achieved": result.achieved,
        "available": result.available,
        "complete": result.complete,
        "note": result.note,
        "single_class_chips": int(np.count_nonzero(flags["single_class"].to_numpy())),
        "categorical_chips": flags.num_rows,
        "files": {
            name: {"path": path.name, "sha256": file_sha256(path)}
            for name, path in (
                ("instances", files.instances),
                ("instance_routes", files.instance_routes),
                ("pairs", files.pairs),
                ("splits", files.splits),
            )
        },
    }
    write_json_atomic(manifest, files.manifest)
    return result


# ------------------------------------------------------------------------------ views


def _sql_path(path: Path) -> str:
    return "'" + str(path.resolve()).replace("'", "''") + "'"


def create_views(con: duckdb.DuckDBPyConnection, folder: Path, order: Iterable[str]) -> list[str]:
    """Views over the benchmark files present now in ``folder`` (a snapshot's benchmark
    folder); the names created.

    ``translation_routes`` expands the pair index (``translation_pairs``) to one row per key
    and directed route without storing them (tens of millions for the whole calendar).
    """
    files = BenchmarkFiles(folder)
    created = []

    def view(name: str, path: Path, sql: str | None = None) -> None:
        if path.exists():
            drop_table(con, name)  # its rows copied by an earlier build
            con.execute(
                f"CREATE OR REPLACE VIEW {name} AS "
                + (sql or f"SELECT * FROM read_parquet({_sql_path(path)})")
            )
            created.append(name)

    bits = ", ".join(f"('{code}', {1 << i})" for i, code in enumerate(order))
    view("translation_pairs", files.pairs)
    view(
        "translation_routes",
        files.pairs,
        f"""
        WITH bits(modality, bit) AS (VALUES {bits})
        SELECT p.city, p.scale, p.tile_id, p.year, s.modality AS source, t.modality AS target
        FROM translation_pairs AS p, bits AS s, bits AS t
        WHERE s.modality <> t.modality
          AND p.modality_mask & s.bit <> 0 AND p.modality_mask & t.bit <> 0
        """,
    )
    view("translation_route_counts", files.route_counts_long)
    view("splits", files.splits)
    view("translation_instances", files.instances)
    view("translation_instance_routes", files.instance_routes)
    return created


def summary_markdown(counts: np.ndarray, labels: list[str]) -> str:
    """Table 14's form as markdown (for the Dagster UI)."""
    lines = ["| source / target | " + " | ".join(labels) + " |"]
    lines.append("|---" * (len(labels) + 1) + "|")
    for i, label in enumerate(labels):
        cells = ["–" if i == j else f"{int(counts[i, j]):,}" for j in range(len(labels))]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def manifest_summary(release: Release) -> Mapping[str, Any]:
    """The published instances manifest, if there is one."""
    path = BenchmarkFiles.published(release).manifest
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
