"""End to end: materialise one city-year through Dagster, then query the release with DuckDB."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr

from assets.cube import cube_assets
from assets.sources import source_assets
from pipelines.definitions import all_assets, defs
from pipelines.partitions import city_partitions, city_year_key
from pipelines.resources import CubeResource
from pipelines.schedules import city_year_assets, yearly_backfill

pytestmark = pytest.mark.e2e

CITY, YEAR = "Amsterdam", 2025


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("data")
    cube = CubeResource(data_root=str(data), release_version="test-release")
    instance = dg.DagsterInstance.ephemeral()

    def run(selection: list[dg.AssetsDefinition], key: str | None) -> None:
        result = dg.materialize(
            all_assets,
            selection=dg.AssetSelection.assets(*selection),
            partition_key=key,
            resources={"cube": cube},
            instance=instance,
        )
        assert result.success

    run([a for a in source_assets if a.partitions_def == city_partitions], CITY)
    run(city_year_assets, city_year_key(CITY, YEAR))
    run(cube_assets, None)
    return cube.release().root


def test_definitions_load() -> None:
    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"modalities/opt", "modalities/co2", "cube/database", "sources/odiac"} <= keys


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
    synthetic = con.execute("SELECT bool_and(synthetic) FROM observations").fetchone()[0]
    assert synthetic is True
    assert con.execute("SELECT value FROM release WHERE key='synthetic'").fetchone()[0] == "true"


def test_chips_are_georeferenced_windows(release_dir: Path) -> None:
    con = duckdb.connect(str(release_dir / "cube.duckdb"), read_only=True)
    store, row, col, h, w = con.execute(
        "SELECT store, row_off, col_off, height, width FROM chip_index "
        "WHERE modality='OPT' AND tile_id = 'Amsterdam_2KM_r3_c4'"
    ).fetchone()
    ds = xr.open_zarr(release_dir / store, decode_coords="all")
    assert ds.rio.crs.to_epsg() == 32631
    assert (h, w) == (80, 80)
    chip = ds["data"].isel(y=slice(row, row + h), x=slice(col, col + w))
    x0 = float(chip.x[0]) - 12.5
    tile_xmin = con.execute(
        "SELECT utm_xmin FROM tiles WHERE tile_id = 'Amsterdam_2KM_r3_c4'"
    ).fetchone()[0]
    assert x0 == pytest.approx(tile_xmin)
    assert chip.dtype == "uint8" and chip.shape == (3, 80, 80)


def test_schedule_requests_last_year_for_every_city() -> None:
    context = dg.build_schedule_context(
        scheduled_execution_time=__import__("datetime").datetime(2025, 1, 15)
    )
    requests = yearly_backfill(context)
    assert len(requests) == 16
    assert all(r.partition_key.keys_by_dimension["year"] == "2024" for r in requests)


def _readme_sql() -> list[str]:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```sql\n(.*?)```", readme, flags=re.DOTALL)


def test_readme_queries_run_on_the_release(release_dir: Path) -> None:
    queries = _readme_sql()
    assert len(queries) >= 3
    con = duckdb.connect(str(release_dir / "cube.duckdb"), read_only=True)
    results = [con.execute(q).fetchall() for q in queries]
    assert all(results[:2])  # availability table and a tile history are non-empty here


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
