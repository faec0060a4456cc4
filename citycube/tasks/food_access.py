"""Food-access cases of the resource-analysis track (AgenticCity-Bench App. D.1, D.3.1).

Reference labels come from the USDA ERS Food Access Research Atlas 2019 tract indicators
(urban 1 mile / rural 10 miles), transferred from census tracts to the four 1 km cells of each
2 km tile: ``s00`` (NW), ``s01`` (NE), ``s10`` (SW), ``s11`` (SE).

Transfer (exact area weights, in the city's UTM CRS):

* **source coverage**: the share of the cell's area inside tracts that have a valid label;
* **label**: the label of the labelled tract that covers the largest part of the cell;
* **assignment score**: the share of the cell's area inside that tract (1.0 when one tract
  covers the whole cell; low when the label rests on a small piece of a tract).

A tile is eligible when all four cells have source coverage ≥ 0.95 and a label. Tiles are
stratified by their number of low-access cells (``low_access_land10`` or ``lila_land10``):
``none`` (0), ``mixed`` (1–3) and ``all`` (4), 48 / 54 / 48 over 38 Boston, 38 Washington DC,
37 New York City and 37 San Francisco tiles. The paper gives the city and stratum totals but not
their cross table; :data:`QUOTAS` splits each city as evenly as the totals allow. Within a city
the strata are filled in the order ``all``, ``mixed``, ``none`` (underserved areas first), and
within a stratum tiles are taken one at a time by the paper's priority: most
low-income-and-low-access cells, then the largest Manhattan distance (in 2 km tile rows and
columns) to the tiles of the city already selected, then the highest minimum assignment score
of the four cells, then ``sha256("<seed>:<city>:<stratum>:<tile>")``. A city or stratum with too
few eligible tiles keeps what it has and the counts table says how many were found and why.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import shapely

from citycube.catalogue.cities import get_city
from citycube.errors import FoodAccessCaseError
from citycube.grid.tiles import city_grid

if TYPE_CHECKING:
    import duckdb

    from citycube.cube.release import Release

LABELS = ("not_low_access_land10", "low_access_land10", "lila_land10")
"""The three cell classes (AgenticCity-Bench App. D prompt)."""
LOW_ACCESS = frozenset(LABELS[1:])
"""Labels counted as low access (low access alone, or with low income)."""
CELLS = ("s00", "s01", "s10", "s11")
"""Cell ids: row then column of the 1 km cell inside its 2 km tile (NW, NE, SW, SE)."""
CELL_NAMES = {"s00": "NW", "s01": "NE", "s10": "SW", "s11": "SE"}
CELL_SIZE_M = 1000.0
SLIVER = 1e-6
"""Intersections below this share of a cell (1 m²) are ignored."""
MIN_COVERAGE = 0.95
"""A cell needs this share of its area under labelled tracts."""
STRATA = ("all", "mixed", "none")
"""Strata by number of low-access cells (4, 1–3, 0), in the order they are filled."""
QUOTAS: dict[str, dict[str, int]] = {
    "Boston": {"all": 12, "mixed": 14, "none": 12},
    "DC": {"all": 12, "mixed": 14, "none": 12},
    "NYC": {"all": 12, "mixed": 13, "none": 12},
    "SanFrancisco": {"all": 12, "mixed": 13, "none": 12},
}
"""Tiles per city and stratum: 38 / 38 / 37 / 37 by city, 48 / 54 / 48 by stratum."""
SEED = 0
REFERENCE_YEAR = 2019
"""The Atlas year of the reference labels."""
CUTOFF = "2020-01-01"
"""A case's evidence cut-off: only observations dated before it (years ≤ 2019) are offered."""


def case_id(city: str, tile_id: str, seed: int = SEED) -> str:
    """An opaque case id (``fa_`` + 12 hex), stable for a seed and tile."""
    return "fa_" + hashlib.sha256(f"{seed}:food_access:{city}:{tile_id}".encode()).hexdigest()[:12]


def _rank(seed: int, city: str, stratum: str, tile_id: str) -> str:
    return hashlib.sha256(f"{seed}:{city}:{stratum}:{tile_id}".encode()).hexdigest()


def cell_frame(city: str) -> gpd.GeoDataFrame:
    """The four 1 km cells of every 2 km tile of a city, in its UTM CRS."""
    grid = city_grid(city, "2km")
    rows: list[dict[str, Any]] = []
    geoms = []
    for tile in grid.tiles():
        x0, _, _, y1 = tile.bounds
        for cell in CELLS:
            r, c = int(cell[1]), int(cell[2])
            left, top = x0 + c * CELL_SIZE_M, y1 - r * CELL_SIZE_M
            geoms.append(shapely.box(left, top - CELL_SIZE_M, left + CELL_SIZE_M, top))
            rows.append(
                {
                    "city": city,
                    "tile_id": tile.tile_id,
                    "row": tile.row,
                    "col": tile.col,
                    "cell": cell,
                }
            )
    return gpd.GeoDataFrame(rows, geometry=geoms, crs=f"EPSG:{get_city(city).epsg}")


def transfer_labels(city: str, tracts: gpd.GeoDataFrame) -> pd.DataFrame:
    """Per cell: label, source coverage, assignment score and the tract that gives the label.

    ``tracts`` holds ``geoid``, ``label`` (one of :data:`LABELS` or missing) and polygons in any
    CRS. Areas are exact polygon intersections in the city's UTM CRS.
    """
    if "label" not in tracts or "geoid" not in tracts:
        raise FoodAccessCaseError("tracts need 'geoid' and 'label' columns")
    cells = cell_frame(city)
    labelled = tracts[tracts["label"].isin(LABELS)][["geoid", "label", "geometry"]]
    labelled = labelled.to_crs(cells.crs)
    labelled = labelled.assign(geometry=shapely.make_valid(labelled.geometry.values))
    cells["key"] = np.arange(len(cells))
    pieces = gpd.overlay(
        cells[["key", "geometry"]], labelled, how="intersection", keep_geom_type=True
    )
    pieces["area"] = pieces.geometry.area / (CELL_SIZE_M * CELL_SIZE_M)
    # Slivers under 1 m² are shared edges after reprojection, not parts of the cell.
    pieces = pieces[pieces["area"] > SLIVER]
    area = pieces.groupby(["key", "geoid", "label"], as_index=False)["area"].sum()
    coverage = area.groupby("key")["area"].sum()
    best = area.sort_values(["key", "area", "geoid"], ascending=[True, False, True])
    best = best.drop_duplicates("key").set_index("key")
    out = pd.DataFrame(cells.drop(columns="geometry"))
    out["coverage"] = np.minimum(out["key"].map(coverage).fillna(0.0).to_numpy(), 1.0)
    out["label"] = out["key"].map(best["label"]).astype("string")
    out["assignment_score"] = np.minimum(out["key"].map(best["area"]).to_numpy(), 1.0)
    out["tract_geoid"] = out["key"].map(best["geoid"]).astype("string")
    out["n_tracts"] = out["key"].map(area.groupby("key").size()).fillna(0).astype(int)
    return out.drop(columns="key").reset_index(drop=True)


def stratum_of(n_low_access: int) -> str:
    """``none`` (0), ``mixed`` (1–3) or ``all`` (4) low-access cells."""
    return "none" if n_low_access == 0 else "all" if n_low_access == 4 else "mixed"


def tile_candidates(cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Eligible tiles (with strata and priority keys) and every tile's reason if not.

    Returns (candidates, tiles): ``tiles`` has one row per tile with ``eligible`` and
    ``reason`` (``low_coverage``: a cell under 95 % coverage; ``no_label``: a cell without one).
    """
    cells = cells.assign(
        ok=(cells["coverage"] >= MIN_COVERAGE) & cells["label"].isin(LABELS),
        low=cells["label"].isin(LOW_ACCESS),
        lila=cells["label"] == LABELS[2],
    )
    tiles = cells.groupby(["city", "tile_id", "row", "col"], as_index=False).agg(
        n_cells=("cell", "size"),
        n_ok=("ok", "sum"),
        min_coverage=("coverage", "min"),
        n_low_access=("low", "sum"),
        n_lila=("lila", "sum"),
        min_score=("assignment_score", "min"),
        any_unlabelled=("label", lambda s: bool(s.isna().any())),
    )
    tiles["eligible"] = (tiles["n_cells"] == 4) & (tiles["n_ok"] == 4)
    tiles["reason"] = np.where(
        tiles["eligible"],
        "",
        np.where(tiles["min_coverage"] < MIN_COVERAGE, "low_coverage", "no_label"),
    )
    tiles["stratum"] = [stratum_of(int(n)) for n in tiles["n_low_access"]]
    candidates = tiles[tiles["eligible"]].reset_index(drop=True)
    return candidates, tiles.drop(columns=["n_ok", "any_unlabelled"])


@dataclass(frozen=True)
class FoodAccessCases:
    """A selected case set: cases, their reference cells and the counts table."""

    cases: pd.DataFrame
    """One row per case: case_id, city, tile_id, row, col, stratum, n_low_access, n_lila,
    min_score, order (selection order within the city)."""
    reference: pd.DataFrame
    """Four rows per case: case_id, cell, label, coverage, assignment_score, tract_geoid."""
    counts: pd.DataFrame
    """Per city and stratum: wanted (the paper's), eligible, selected, reason when short."""
    pool: pd.DataFrame
    """Every eligible tile's cells (the candidate pool the majority class is taken from)."""


def _select_city(
    cands: pd.DataFrame, city: str, quota: Mapping[str, int], seed: int
) -> list[dict[str, Any]]:
    chosen: list[dict[str, Any]] = []
    for stratum in STRATA:
        pool = cands[cands["stratum"] == stratum].to_dict("records")
        for row in pool:
            row["hash"] = _rank(seed, city, stratum, row["tile_id"])
        taken = 0
        while pool and taken < quota.get(stratum, 0):

            def key(row: dict[str, Any]) -> tuple[Any, ...]:
                dist = min(
                    (abs(row["row"] - c["row"]) + abs(row["col"] - c["col"]) for c in chosen),
                    default=10**9,
                )
                return (-int(row["n_lila"]), -dist, -float(row["min_score"]), row["hash"])

            best = min(pool, key=key)
            pool.remove(best)
            best["order"] = len(chosen)
            chosen.append(best)
            taken += 1
    return chosen


def select_cases(
    cells: pd.DataFrame,
    cities: Iterable[str],
    *,
    seed: int = SEED,
    quotas: Mapping[str, Mapping[str, int]] = QUOTAS,
    unavailable: Mapping[str, str] | None = None,
) -> FoodAccessCases:
    """The paper's selection over the cells of ``cities`` (see the module docstring).

    ``unavailable`` names cities of the scope that have no reference labels, with the reason;
    the counts table lists every city of :data:`QUOTAS` and says why one has fewer cases.
    """
    unavailable = dict(unavailable or {})
    cities = list(cities)
    candidates, tiles = tile_candidates(cells) if len(cells) else (cells, cells)
    rows: list[dict[str, Any]] = []
    counts: list[dict[str, Any]] = []
    for city in quotas:
        quota = quotas[city]
        cands = candidates[candidates["city"] == city] if len(candidates) else candidates
        chosen = _select_city(cands, city, quota, seed) if city in cities and len(cands) else []
        rows.extend(chosen)
        for stratum in STRATA:
            eligible = int((cands["stratum"] == stratum).sum()) if len(cands) else 0
            selected = sum(1 for c in chosen if c["stratum"] == stratum)
            if city not in cities:
                reason = "city not in this build's scope"
            elif city in unavailable:
                reason = unavailable[city]
            elif selected < quota[stratum]:
                city_tiles = tiles[tiles["city"] == city] if len(tiles) else tiles
                low = int((city_tiles["reason"] == "low_coverage").sum()) if len(tiles) else 0
                unlabelled = int((city_tiles["reason"] == "no_label").sum()) if len(tiles) else 0
                reason = (
                    f"only {eligible} eligible tiles in this stratum; of the city's "
                    f"{len(city_tiles)} tiles {low} fail the 95 % coverage rule and "
                    f"{unlabelled} have a cell without a label"
                )
            else:
                reason = ""
            counts.append(
                {
                    "city": city,
                    "stratum": stratum,
                    "wanted": quota[stratum],
                    "eligible": eligible,
                    "selected": selected,
                    "reason": reason,
                }
            )
    for city in cities:
        if city not in quotas:
            counts.append(
                {
                    "city": city,
                    "stratum": "",
                    "wanted": 0,
                    "eligible": 0,
                    "selected": 0,
                    "reason": unavailable.get(city, "not one of the paper's food-access cities"),
                }
            )
    columns = [
        "case_id",
        "city",
        "tile_id",
        "row",
        "col",
        "stratum",
        "n_low_access",
        "n_lila",
        "min_score",
        "order",
    ]
    cases = pd.DataFrame(rows, columns=[c for c in columns if c != "case_id"])
    ids = [case_id(c, t, seed) for c, t in zip(cases["city"], cases["tile_id"], strict=True)]
    cases.insert(0, "case_id", pd.Series(ids, index=cases.index, dtype=object))
    text = {"case_id": object, "city": object, "tile_id": object, "stratum": object}
    cases = cases.astype(
        {
            **text,
            "n_low_access": int,
            "n_lila": int,
            "row": int,
            "col": int,
            "order": int,
            "min_score": float,
        }
    )
    keyed = cells.merge(cases[["case_id", "tile_id"]], on="tile_id") if len(cases) else None
    ref_cols = ["case_id", "cell", "label", "coverage", "assignment_score", "tract_geoid"]
    reference = (
        keyed[ref_cols].sort_values(["case_id", "cell"]).reset_index(drop=True)
        if keyed is not None
        else pd.DataFrame({c: pd.Series(dtype=object) for c in ref_cols})
    )
    pool = cells.merge(candidates[["tile_id"]], on="tile_id") if len(candidates) else cells[:0]
    return FoodAccessCases(cases, reference, pd.DataFrame(counts), pool)


# -- scoring -------------------------------------------------------------------------------


def score(reference: pd.DataFrame, predictions: pd.DataFrame) -> dict[str, Any]:
    """Cell accuracy, macro-F1 over the three classes, exact-case accuracy, per-class recall.

    ``predictions`` has case_id, cell, label; a reference cell without a prediction counts as
    wrong (its prediction is missing). Macro-F1 averages the F1 of the classes that occur in
    the reference or the predictions.
    """
    merged = reference[["case_id", "cell", "label"]].merge(
        predictions[["case_id", "cell", "label"]].rename(columns={"label": "predicted"}),
        on=["case_id", "cell"],
        how="left",
    )
    truth = merged["label"].astype(str).to_numpy()
    pred = merged["predicted"].astype(object).where(merged["predicted"].notna(), "").to_numpy()
    correct = truth == pred
    present = [c for c in LABELS if (truth == c).any() or (pred == c).any()]
    f1s, recall = [], {}
    for c in LABELS:
        tp = float(((truth == c) & (pred == c)).sum())
        support = float((truth == c).sum())
        predicted = float((pred == c).sum())
        recall[c] = tp / support if support else None
        if c in present:
            f1s.append(2 * tp / (support + predicted) if support + predicted else 0.0)
    exact = pd.Series(correct).groupby(merged["case_id"].to_numpy()).all()
    return {
        "n_cases": int(merged["case_id"].nunique()),
        "n_cells": len(merged),
        "cell_accuracy": float(correct.mean()) if len(merged) else None,
        "macro_f1": float(np.mean(f1s)) if f1s else None,
        "exact_case_accuracy": float(exact.mean()) if len(exact) else None,
        **{f"recall_{c}": recall[c] for c in LABELS},
    }


def majority_class(pool: pd.DataFrame) -> str:
    """The most frequent label among the candidate pool's cells (ties: the first of LABELS)."""
    counts = pool["label"].value_counts()
    if counts.empty:
        raise FoodAccessCaseError("no eligible cells: the majority class is undefined")
    return max(LABELS, key=lambda c: (int(counts.get(c, 0)), -LABELS.index(c)))


def constant_predictions(reference: pd.DataFrame, label: str) -> pd.DataFrame:
    """One label for every cell of every case."""
    if label not in LABELS:
        raise FoodAccessCaseError(f"unknown label {label!r}: one of {', '.join(LABELS)}")
    return reference[["case_id", "cell"]].assign(label=label)


def baseline_scores(cases: FoodAccessCases) -> pd.DataFrame:
    """The direct baselines: each constant class, and which of them is the majority class."""
    if cases.reference.empty:
        return pd.DataFrame(columns=["baseline", "label", "majority"])
    majority = majority_class(cases.pool)
    rows = []
    for label in LABELS:
        scored = score(cases.reference, constant_predictions(cases.reference, label))
        rows.append(
            {
                "baseline": f"constant_{label}",
                "label": label,
                "majority": label == majority,
                **scored,
            }
        )
    return pd.DataFrame(rows)


def cells_of(reference: pd.DataFrame, case: str) -> Sequence[str]:
    """The cell ids of one case (always the four of :data:`CELLS`)."""
    found = reference.loc[reference["case_id"] == case, "cell"].tolist()
    if not found:
        raise FoodAccessCaseError(f"no case {case!r} in this case set")
    return found


# -- release files -------------------------------------------------------------------------


@dataclass(frozen=True)
class FoodAccessFiles:
    """Paths of the food-access cases in one benchmark folder."""

    root: Path

    @classmethod
    def draft(cls, release: Release) -> FoodAccessFiles:
        """Where a build writes them."""
        from citycube.cube.release import BENCHMARK_DIR

        return cls(release.draft_dir / BENCHMARK_DIR)

    @classmethod
    def published(cls, release: Release) -> FoodAccessFiles:
        """The published ones."""
        from citycube.cube.release import BENCHMARK_DIR

        return cls(release.published_root / BENCHMARK_DIR)

    @property
    def cases(self) -> Path:
        """What an agent is given: case id, city, tile; no label, stratum or score."""
        return self.root / "food_access_cases.parquet"

    @property
    def reference(self) -> Path:
        """Held out: per case and cell the label, coverage, assignment score, stratum."""
        return self.root / "food_access_reference.parquet"

    @property
    def counts(self) -> Path:
        """Per city and stratum: wanted, eligible, selected and why fewer."""
        return self.root / "food_access_counts.parquet"

    @property
    def scores(self) -> Path:
        """The direct baselines' scores."""
        return self.root / "food_access_baseline_scores.parquet"

    @property
    def manifest(self) -> Path:
        """Settings, counts, the majority class and the files' hashes."""
        return self.root / "food_access_manifest.json"


CASE_COLUMNS = ("case_id", "city", "tile_id", "scale", "cutoff")
"""The agent-visible columns of a case."""


def build_case_set(
    tracts: Mapping[str, gpd.GeoDataFrame],
    scope: Sequence[str],
    unavailable: Mapping[str, str] | None = None,
    seed: int = SEED,
) -> FoodAccessCases:
    """Transfer each city's labelled tracts to cells and select the cases of ``scope``."""
    frames = [transfer_labels(city, tracts[city]) for city in scope if city in tracts]
    cells = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    missing = {c: "no reference labels were fetched" for c in scope if c not in tracts}
    return select_cases(cells, scope, seed=seed, unavailable={**missing, **(unavailable or {})})


def case_tables(found: FoodAccessCases) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(cases, reference, counts) as Arrow tables with fixed schemas."""
    cases = found.cases.assign(scale="2km", cutoff=CUTOFF)
    case_table = pa.Table.from_pandas(
        cases.reindex(columns=list(CASE_COLUMNS)), schema=CASE_SCHEMA, preserve_index=False
    )
    ref = found.reference.merge(
        found.cases[["case_id", "city", "tile_id", "stratum", "n_low_access", "n_lila", "order"]],
        on="case_id",
    )
    ref = ref.assign(label=ref["label"].astype(str), tract_geoid=ref["tract_geoid"].astype(str))
    ref_table = pa.Table.from_pandas(
        ref.reindex(columns=REFERENCE_SCHEMA.names), schema=REFERENCE_SCHEMA, preserve_index=False
    )
    counts = pa.Table.from_pandas(found.counts, schema=COUNT_SCHEMA, preserve_index=False)
    return case_table, ref_table, counts


CASE_SCHEMA = pa.schema(
    [
        ("case_id", pa.string()),
        ("city", pa.string()),
        ("tile_id", pa.string()),
        ("scale", pa.string()),
        ("cutoff", pa.string()),
    ]
)
REFERENCE_SCHEMA = pa.schema(
    [
        ("case_id", pa.string()),
        ("city", pa.string()),
        ("tile_id", pa.string()),
        ("cell", pa.string()),
        ("label", pa.string()),
        ("coverage", pa.float64()),
        ("assignment_score", pa.float64()),
        ("tract_geoid", pa.string()),
        ("stratum", pa.string()),
        ("n_low_access", pa.int64()),
        ("n_lila", pa.int64()),
        ("order", pa.int64()),
    ]
)
COUNT_SCHEMA = pa.schema(
    [
        ("city", pa.string()),
        ("stratum", pa.string()),
        ("wanted", pa.int64()),
        ("eligible", pa.int64()),
        ("selected", pa.int64()),
        ("reason", pa.string()),
    ]
)


BASELINE_SCHEMA = pa.schema(
    [("baseline", pa.string()), ("label", pa.string()), ("majority", pa.bool_()),
     ("n_cases", pa.int64()), ("n_cells", pa.int64()), ("cell_accuracy", pa.float64()),
     ("macro_f1", pa.float64()), ("exact_case_accuracy", pa.float64()),
     *[(f"recall_{c}", pa.float64()) for c in LABELS]]
)  # fmt: skip


def baseline_table(found: FoodAccessCases) -> pa.Table:
    """The direct baselines' scores with a fixed schema (no rows without cases)."""
    rows = baseline_scores(found).to_dict("records")
    return pa.Table.from_pylist(rows, schema=BASELINE_SCHEMA)


def write_food_access_cases(
    release: Release,
    tracts: Mapping[str, gpd.GeoDataFrame],
    scope: Sequence[str],
    unavailable: Mapping[str, str] | None = None,
    seed: int = SEED,
) -> FoodAccessCases:
    """Cases, references, counts, baseline scores and manifest into the release's draft."""
    from citycube.cube.release import file_metadata, write_json_atomic, write_parquet_atomic
    from citycube.io.digest import file_sha256

    found = build_case_set(tracts, scope, unavailable, seed)
    files = FoodAccessFiles.draft(release)
    files.root.mkdir(parents=True, exist_ok=True)
    cases, reference, counts = case_tables(found)
    meta = file_metadata(release)
    write_parquet_atomic(cases, files.cases, meta)
    write_parquet_atomic(reference, files.reference, meta)
    write_parquet_atomic(counts, files.counts, meta)
    baselines = baseline_scores(found)
    write_parquet_atomic(pa.Table.from_pandas(baselines, preserve_index=False), files.scores, meta)
    majority = majority_class(found.pool) if len(found.pool) else None
    manifest = {
        "release": release.version,
        "seed": seed,
        "reference_year": REFERENCE_YEAR,
        "cutoff": CUTOFF,
        "min_coverage": MIN_COVERAGE,
        "quotas": QUOTAS,
        "scope": list(scope),
        "selected": len(found.cases),
        "wanted": sum(sum(q.values()) for q in QUOTAS.values()),
        "selected_by_city": found.cases.groupby("city").size().to_dict()
        if len(found.cases)
        else {},
        "majority_class": majority,
        "files": {
            name: {"path": path.name, "sha256": file_sha256(path)}
            for name, path in (
                ("cases", files.cases),
                ("reference", files.reference),
                ("counts", files.counts),
            )
        },
    }
    write_json_atomic(manifest, files.manifest)
    return found


def create_food_access_views(con: duckdb.DuckDBPyConnection, folder: Path) -> list[str]:
    """Views over the food-access files present now in ``folder``; the names created."""
    from citycube.cube.release import create_file_view

    files = FoodAccessFiles(folder)
    created = []
    for name, path in (
        ("food_access_cases", files.cases),
        ("food_access_reference", files.reference),
        ("food_access_counts", files.counts),
        ("food_access_baseline_scores", files.scores),
    ):
        if path.exists():
            create_file_view(con, name, path)
            created.append(name)
    return created


def counts_markdown(counts: pd.DataFrame) -> str:
    """The counts table as markdown: per city and stratum, wanted, eligible, selected, why."""
    lines = [
        "| city | stratum | wanted | eligible | selected | reason |",
        "|---|---|---|---|---|---|",
    ]
    for r in counts.itertuples():
        lines.append(
            f"| {r.city} | {r.stratum} | {r.wanted} | {r.eligible} | {r.selected} | {r.reason} |"
        )
    return "\n".join(lines) + "\n"
