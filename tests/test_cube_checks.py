"""The cube's ERROR checks block publishing: bad observations never reach ``cube.duckdb``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from affine import Affine

from assets.cube import DATABASE_KEY, STAGED_DATABASE_KEY, TILES_KEY, build_cube_assets
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.grid.tiles import city_grid
from citycube.processing.compute import process_partition
from pipelines.resources import CubeResource
from tests.conftest import LocalFilesBackend

CITY = "Amsterdam"
CAT = load_catalogue()


def _materialize(release: Release) -> dg.ExecuteInProcessResult:
    cube = CubeResource(data_root=str(release.data_root), release_version=release.version)
    return dg.materialize(
        build_cube_assets(CAT),
        resources={"cube": cube},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def test_a_failing_check_stops_the_database_from_being_published(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    co2 = CAT.get("CO2").model_copy(update={"product": "test_co2"})
    xmin, _, _, ymax = city_grid(CITY, "2km").bounds
    path = tif_writer(
        "co2.tif",
        np.ones((200, 280), np.float32),
        crs="EPSG:32631",
        transform=Affine(100, 0, xmin, 0, -100, ymax),
    )
    release = Release(tmp_path / "data", "t")
    process_partition(
        co2, CAT, CITY, 2020, LocalFilesBackend({("test_co2", CITY, 2020): {"data": path}}), release
    )

    # Good data: every check passes and the database is published.
    good = _materialize(release)
    assert good.success and all(_checks(good).values())
    published = release.duckdb_file.read_bytes()
    recorded = release.metadata_file.read_text(encoding="utf-8")

    # Bad data: an unavailable tile whose value was zero-filled, in a year of its own.
    rows = pq.read_table(release.observations_file(CITY, 2020, "CO2"))
    bad = rows.slice(0, 1).to_pylist()[0] | {"year": 2021, "available": False, "value": 0.0}
    bad["reason"] = "source_year_missing"
    target = release.observations_file(CITY, 2021, "CO2")
    target.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([bad], schema=rows.schema), target)
    result = _materialize(release)
    assert not result.success
    assert _checks(result)["values_in_range_no_zero_fill"] is False
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    assert {TILES_KEY, STAGED_DATABASE_KEY} <= materialized
    assert DATABASE_KEY not in materialized  # blocked by the failing check
    assert release.duckdb_file.read_bytes() == published  # the last good database stays
    assert release.metadata_file.read_text(encoding="utf-8") == recorded
    # Files written after the last publish (here the bad year; after an interrupted build, a
    # half-built city-year) stay out of the published database's views.
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        years = con.execute("SELECT DISTINCT year FROM observations").fetchall()
        published_years = con.execute("SELECT DISTINCT year FROM published_observations")
        assert years == [(2020,)] and published_years.fetchall() == [(2020,)]


def test_the_value_check_names_each_modality_out_of_range_and_counts_zero_fills() -> None:
    from citycube.cube import checks

    low, high = CAT.get("NDVI").value_range
    rows = [  # modality, available, value, reason
        ("NDVI", True, 0.4, None),
        ("NDVI", True, high + 0.5, None),  # out of NDVI's range
        ("CO2", True, 10.0, None),
        ("CO2", False, 0.0, "source_year_missing"),  # an unavailable tile zero-filled
        ("CO2", False, None, "source_year_missing"),
        ("DEM", True, low - 1.0, None),  # within DEM's range, below NDVI's
    ]
    with duckdb.connect() as con:
        con.execute(
            "CREATE TABLE observations (modality VARCHAR, available BOOLEAN, value DOUBLE, "
            "reason VARCHAR, city VARCHAR DEFAULT 'Boston', year SMALLINT DEFAULT 2020)"
        )
        con.executemany(
            "INSERT INTO observations (modality, available, value, reason) VALUES (?, ?, ?, ?)",
            rows,
        )
        outcome = checks.check_values(con, CAT)
        assert not outcome.passed
        assert outcome.details == {
            "inconsistent_rows": 1,
            "out_of_range": {"NDVI": 1},
            "partitions": [
                "CO2 Boston 2020: 1 rows whose value does not match their availability (a "
                "zero-filled unavailable tile, or an available one without a finite value)",
                f"NDVI Boston 2020: 1 values outside NDVI's range [{low:g}, {high:g}] "
                f"(from {high + 0.5:g} to {high + 0.5:g})",
            ],
        }
        con.execute("DELETE FROM observations WHERE value = 0.0 OR value > 1")
        assert checks.check_values(con, CAT).passed


def test_a_blocked_build_names_each_failing_check_and_its_partitions(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    """What `citycube build` prints when a check blocks publication: the check, its asset, and
    each partition that fails it with how, read from the run's events as a build reads them."""
    import io

    from pipelines.build import BACKFILL_TAG, BuildRequest, ProgressPrinter, StopFlags, _conclude

    co2 = CAT.get("CO2").model_copy(update={"product": "test_co2"})
    xmin, _, _, ymax = city_grid(CITY, "2km").bounds
    path = tif_writer(
        "co2.tif",
        np.ones((200, 280), np.float32),
        crs="EPSG:32631",
        transform=Affine(100, 0, xmin, 0, -100, ymax),
    )
    release = Release(tmp_path / "data", "t")
    sources = LocalFilesBackend({("test_co2", CITY, 2020): {"data": path}})
    process_partition(co2, CAT, CITY, 2020, sources, release)
    partition = release.observations_file(CITY, 2020, "CO2")
    rows = pq.read_table(partition).to_pylist()
    first = next(i for i, row in enumerate(rows) if row["available"])
    rows[first]["value"] = 1e18  # one value far out of CO2's range
    schema = pq.read_schema(partition)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), partition)
    zero_filled = rows[0] | {"year": 2021, "available": False, "value": 0.0}
    zero_filled["reason"] = "source_year_missing"
    other = release.observations_file(CITY, 2021, "CO2")
    other.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([zero_filled], schema=schema), other)

    instance = dg.DagsterInstance.ephemeral()
    cube = CubeResource(data_root=str(release.data_root), release_version=release.version)
    result = dg.materialize(
        build_cube_assets(CAT),
        resources={"cube": cube},
        instance=instance,
        raise_on_error=False,
        tags={BACKFILL_TAG: "blocked"},
    )
    assert not result.success
    out = io.StringIO()
    printer = ProgressPrinter(instance, out)
    printer.follow("blocked")
    printer.poll()
    printer.report.status = "COMPLETED_FAILED"
    request = BuildRequest([CITY], [2020, 2021], release.version, str(release.data_root), 1)
    assert _conclude(request, "blocked", printer.report, 1.0, StopFlags(), out) == 1
    text = out.getvalue()
    low, high = CAT.get("CO2").value_range
    assert (
        "check values_in_range_no_zero_fill on cube/staged_database: values are in range; "
        "unavailable rows are NULL with a reason (no zero-fill): FAILED in "
        f"CO2 {CITY} 2020: 1 values outside CO2's range [{low:g}, {high:g}] (from 1e+18 to 1e+18); "
        f"CO2 {CITY} 2021: 1 rows whose value does not match their availability"
    ) in text
    conclusion = text.split("Build FAILED", 1)[1]
    assert "values_in_range_no_zero_fill" in text.split("FAILED cube__staged_database: ", 1)[1]
    assert "1 blocking asset check failed" not in conclusion
