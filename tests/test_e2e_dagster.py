"""End to end: `citycube build` as `make run` calls it, on a fresh DAGSTER_HOME, through a
2-worker dask LocalCluster; then the release is queried with DuckDB and the instance is read
back for the backfill and its runs (what `dagster dev` shows)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import rioxarray  # noqa: F401  (registers .rio)

from citycube.cube.chips import open_chips
from citycube.cube.release import Release
from pipelines.definitions import defs

pytestmark = pytest.mark.e2e(builds=1)

REPO_ROOT = Path(__file__).resolve().parents[1]
CITY, YEAR = "Amsterdam", 2025


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One build of Amsterdam 2025 with two dask workers, from an empty DAGSTER_HOME."""
    root = tmp_path_factory.mktemp("e2e")
    home, data = root / "dagster_home", root / "data"
    command = [sys.executable, "-m", "pipelines.cli", "--data", str(data), "--release", "e2e"]
    command += ["build", "--cities", CITY, "--years", str(YEAR), "--workers", "2"]
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    env.pop("CITYCUBE_DASK_SCHEDULER", None)
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {"release": data / "releases" / "e2e", "home": home, "out": done.stdout}


@pytest.fixture(scope="module")
def release_dir(build: dict[str, object]) -> Path:
    return build["release"]  # type: ignore[return-value]


def _instance(home: Path) -> dg.DagsterInstance:
    from dagster._core.instance.ref import InstanceRef

    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


def test_build_is_two_backfills_of_successful_runs(build: dict[str, object]) -> None:
    from dagster._core.execution.backfill import BulkActionStatus

    with _instance(build["home"]) as instance:  # type: ignore[arg-type]
        second, first = instance.get_backfills()  # newest first
        assert "(1/2: static and 5-year products)" in (first.title or "")
        assert "(2/2: city-years and the cube)" in (second.title or "")
        runs = []
        for backfill in (first, second):
            assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS
            assert backfill.tags["citycube/release"] == "e2e"
            assert backfill.tags["citycube/build"] == first.tags["citycube/build"]
            tags = {"dagster/backfill": backfill.backfill_id}
            runs += instance.get_runs(filters=dg.RunsFilter(tags=tags))
        assert len(runs) >= 4  # static, epoch, annual and cube partitionings each get runs
        assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
        # Every city-year asset of the city is in one run: the static and epoch products it
        # reads were materialised by the first backfill.
        (city_year_run,) = [r for r in runs if len(r.asset_selection or ()) > 40]
        assert dg.AssetKey(["modalities", "dem"]) in city_year_run.asset_selection
        assert dg.AssetKey(["derived", "prop"]) in city_year_run.asset_selection
        materialized = {
            key.to_user_string()
            for run in runs
            for key in instance.get_asset_keys_for_run(run.run_id)
        }
    assert {"sources/cop_dem_glo30", "derived/dem", "derived/pop", "modalities/opt"} <= materialized
    assert {"cube/staged_database", "cube/database", "cube/availability_report"} <= materialized
    assert {"cube/dataset_card", "cube/manifest"} <= materialized
    benchmark = {
        "benchmark/translation_pairs",
        "benchmark/splits",
        "benchmark/translation_instances",
        "benchmark/forecast_cases",
        "benchmark/forecast_baseline_scores",
    }
    assert benchmark <= materialized


def test_benchmark_views_are_queryable_after_the_build(build: dict[str, object]) -> None:
    release_dir = Path(str(build["release"]))
    con = duckdb.connect(str(release_dir / "cube.duckdb"), read_only=True)
    keys, routes, cities = con.execute(
        "SELECT count(*), sum(n_routes), count(DISTINCT city) FROM translation_pairs"
    ).fetchone()
    assert keys > 0 and cities == 1
    assert con.execute("SELECT sum(pairs) FROM translation_route_counts").fetchone()[0] == routes
    assert con.execute("SELECT count(*) FROM splits").fetchone()[0] == 6586
    # Amsterdam publishes no electricity: no route to or from ELEC
    assert (
        con.execute(
            "SELECT count(*) FROM translation_routes WHERE 'ELEC' IN (source, target)"
        ).fetchone()[0]
        == 0
    )
    per_split = dict(
        con.execute("SELECT split, count(*) FROM translation_instances GROUP BY 1").fetchall()
    )
    assert set(per_split) == {"train", "val", "test"}
    # one city-year is a partial cube: every pair became an instance, and the build says so
    assert sum(per_split.values()) == routes
    assert "Translation benchmark:" in str(build["out"]) and "asked for" in str(build["out"])
    # 2025 lies outside the 2010–2024 panel: no tile to consider, no forecasting case, and the
    # build says so
    for view in ("forecast_cases", "forecast_targets", "forecast_eligibility", "forecast_scores"):
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone() == (0,)
    assert "Forecasting cases: lst 0 of 220, carbon 0 of 220, property 0 of 160" in str(
        build["out"]
    )


def test_categorical_chips_record_their_classes(release_dir: Path) -> None:
    """Single-class flags from the chip index's class counts match the chips' pixels."""
    from citycube.tasks.translation import _single_class_from_stores, single_class_flags

    release = Release(release_dir.parent.parent, release_dir.name)
    con = duckdb.connect(str(release_dir / "cube.duckdb"), read_only=True)
    missing = con.execute(
        "SELECT count(*) FILTER (WHERE classes IS NULL), min(classes) FROM chip_index "
        "WHERE modality IN ('LC', 'LU', 'POI') AND available"
    ).fetchone()
    assert missing[0] == 0 and missing[1] >= 1
    assert con.execute(
        "SELECT count(*) FROM chip_index WHERE modality = 'OPT' AND classes IS NOT NULL"
    ).fetchone() == (0,)
    flags = single_class_flags(release, con, ["LC", "LU", "POI"])
    index = con.execute(
        "SELECT tile_id, year, modality, store, row_off, col_off, height, width FROM chip_index "
        "WHERE available AND modality IN ('LC', 'LU', 'POI')"
    ).to_arrow_table()
    from_pixels = _single_class_from_stores(release, index)

    def keyed(table: object, values: list[bool]) -> dict[tuple, bool]:
        rows = table.select(["tile_id", "year", "modality"]).to_pylist()  # type: ignore[attr-defined]
        return {tuple(r.values()): v for r, v in zip(rows, values, strict=True)}

    assert keyed(flags, flags["single_class"].to_pylist()) == keyed(index, from_pixels.tolist())
    assert 0 < sum(from_pixels) < len(from_pixels)


def test_partition_work_ran_on_a_two_worker_local_cluster(build: dict[str, object]) -> None:
    out = str(build["out"])
    assert re.search(r"dask: LocalCluster with 2 workers at tcp://", out)
    assert "check values_in_range_no_zero_fill: PASS" in out


def test_definitions_load() -> None:
    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"modalities/opt", "derived/co2", "cube/database", "sources/odiac"} <= keys


def test_tiles_table_matches_spec(release_dir: Path) -> None:
    con = duckdb.connect(str(release_dir / "cube.duckdb"), read_only=True)
    counts = dict(con.execute("SELECT scale, count(*) FROM tiles GROUP BY 1").fetchall())
    assert counts == {"2km": 5836, "5km": 750}
    ams = dict(
        con.execute(
            "SELECT scale, count(*) FROM tiles WHERE city='Amsterdam' GROUP BY 1"
        ).fetchall()
    )
    assert ams == {"2km": 140, "5km": 12}


def test_observations_queryable_with_both_kinds(release_dir: Path) -> None:
    con = duckdb.connect(str(release_dir / "cube.duckdb"), read_only=True)
    mods = {
        r[0]
        for r in con.execute(
            "SELECT DISTINCT modality FROM observations WHERE available AND year = ?", [YEAR]
        ).fetchall()
    }
    assert {"OPT", "DEM", "LC", "POP"} <= mods
    # ODIAC ends in 2024: CO2 for 2025 is unavailable, NULL, with a reason — never zero.
    co2 = con.execute(
        "SELECT count(*), count(value), any_value(reason), bool_or(available) "
        "FROM observations WHERE modality = 'CO2' AND year = ?",
        [YEAR],
    ).fetchone()
    assert co2 == (152, 0, "source_year_missing", False)
    basis = dict(
        con.execute(
            "SELECT modality, any_value(temporal_basis) FROM observations GROUP BY 1"
        ).fetchall()
    )
    assert basis["DEM"] == "static" and basis["POP"] == "epoch" and basis["OPT"] == "annual"
    provenance = con.execute(
        "SELECT bool_and(synthetic), count(DISTINCT source_id) FILTER "
        "(WHERE NOT starts_with(source_id, 'sample:')) FROM observations"
    ).fetchone()
    assert provenance == (True, 0)
    assert con.execute("SELECT value FROM release WHERE key='synthetic'").fetchone()[0] == "true"


def test_release_records_every_source_with_its_licence(release_dir: Path) -> None:
    import json

    meta = json.loads((release_dir / "release.json").read_text(encoding="utf-8"))
    assert meta["source_set"] == "sample" and meta["synthetic"] is True
    assert meta["sources"]["odiac"]["source_id"] == "sample:odiac"
    assert all(s["licence"] for s in meta["sources"].values())


def test_chips_are_georeferenced_windows(release_dir: Path) -> None:
    con = duckdb.connect(str(release_dir / "cube.duckdb"), read_only=True)
    store, row, col, h, w = con.execute(
        "SELECT store, row_off, col_off, height, width FROM chip_index "
        "WHERE modality='OPT' AND tile_id = 'Amsterdam_2KM_r3_c4'"
    ).fetchone()
    assert store.endswith(".icechunk")  # what a build writes by default
    ds = open_chips(release_dir / store)
    assert ds.rio.crs.to_epsg() == 32631
    assert (h, w) == (80, 80)
    chip = ds["data"].isel(y=slice(row, row + h), x=slice(col, col + w))
    x0 = float(chip.x[0]) - 12.5
    tile_xmin = con.execute(
        "SELECT utm_xmin FROM tiles WHERE tile_id = 'Amsterdam_2KM_r3_c4'"
    ).fetchone()[0]
    assert x0 == pytest.approx(tile_xmin)
    assert chip.dtype == "uint8" and chip.shape == (3, 80, 80)


def _sql_blocks(doc: str) -> list[str]:
    text = (REPO_ROOT / doc).read_text(encoding="utf-8")
    return re.findall(r"```sql\n(.*?)```", text, flags=re.DOTALL)


def test_documented_queries_run_on_the_release(release_dir: Path) -> None:
    readme, querying = _sql_blocks("README.md"), _sql_blocks("docs/querying.md")
    assert len(readme) >= 1 and len(querying) >= 3
    con = duckdb.connect(str(release_dir / "cube.duckdb"), read_only=True)
    assert con.execute(readme[0]).fetchall()  # the README's availability table is non-empty
    for query in querying:
        con.execute(query).fetchall()


def test_duckdb_command_opens_the_release(release_dir: Path) -> None:
    cli = Path(sys.executable).with_name("duckdb")
    out = subprocess.run(
        [str(cli), str(release_dir / "cube.duckdb"), "-csv", "-c", "SELECT count(*) FROM tiles"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "6586"


def test_all_18_modalities_listed_with_fields_and_units(release_dir: Path) -> None:
    con = duckdb.connect(str(release_dir / "cube.duckdb"), read_only=True)
    rows = con.execute("SELECT DISTINCT modality, field, unit FROM observations").fetchall()
    assert len({m for m, _, _ in rows}) == 18
    fields = {(m, f): u for m, f, u in rows}
    assert fields[("WTH", "prcp_mm")] == "mm" and fields[("HEAT", "median_c")] == "°C"
    assert fields[("PROP", "property_mean_2017ppp")] == "2017 PPP international dollars"
    # Amsterdam publishes no electricity records: unavailable with a reason, never zero
    elec = con.execute(
        "SELECT bool_or(available), count(value), any_value(reason) FROM observations "
        "WHERE modality = 'ELEC'"
    ).fetchone()
    assert elec == (False, 0, "outside_source_coverage")


@pytest.mark.parametrize("code", ["OPT", "DEM", "NDVI", "BV", "LC", "LU", "RD", "POI", "HF"])
def test_render_command_writes_png_for_each_image_modality(
    release_dir: Path, tmp_path: Path, code: str
) -> None:
    from PIL import Image

    from pipelines.cli import main

    out = tmp_path / f"{code}.png"
    args = ["--data", str(release_dir.parents[1]), "--release", release_dir.name, "render"]
    args += ["--tile", "Amsterdam_2KM_r3_c4", "--modality", code, "--year", str(YEAR)]
    assert main([*args, "--out", str(out)]) == 0
    image = Image.open(out)
    size = {"BV": 20, "LU": 8, "RD": 200, "POI": 200, "HF": 200}.get(code, 80)
    assert image.size == (size, size)
    if code == "RD":
        colours = {c for _, c in image.convert("RGB").getcolors(maxcolors=1 << 16)}
        assert colours <= {(224, 64, 69), (255, 255, 255)}


def test_the_release_is_verified_against_its_manifest(release_dir: Path, tmp_path: Path) -> None:
    from citycube.cube.manifest import read_manifest, verify_release

    release = Release(release_dir.parent.parent, release_dir.name)
    manifest = read_manifest(release)
    names = set(manifest["files"])
    assert "release.json" in names and any(n.startswith("chips/") for n in names)
    assert any(n.startswith("published/observations/") for n in names)
    assert "published/tiles.parquet" in names and "published/benchmark/splits.parquet" in names
    assert any(n.startswith("reports/") for n in names)
    assert verify_release(release).ok

    copy = Release(tmp_path, release.version)
    shutil.copytree(release.root, copy.root)
    chunk = next(  # a chunk of a chip store, icechunk (what builds write) or plain Zarr
        copy.root / n
        for n in sorted(names)
        if n.startswith("chips/") and (".icechunk/chunks/" in n or "/data/c/" in n)
    )
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    result = verify_release(copy)
    assert result.changed == [chunk.relative_to(copy.root).as_posix()] and not result.ok
