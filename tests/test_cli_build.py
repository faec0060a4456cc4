"""`citycube build` as a user runs it: a stop request, a forced stop and a clean re-run.

Stopping goes through Dagster: the backfill is canceled and Dagster terminates its runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import pytest

pytestmark = pytest.mark.e2e(builds=3)

REPO_ROOT = Path(__file__).resolve().parent.parent
CITY, YEARS = "Amsterdam", (2023, 2024, 2025)


def _start(tmp_path: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "pipelines.cli", "--data", str(tmp_path / "data")]
    command += ["build", "--cities", CITY, "--years", f"{YEARS[0]}-{YEARS[-1]}", "--workers", "1"]
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(build: subprocess.Popen[str], marker: str, lines: list[str]) -> None:
    assert build.stdout is not None
    for line in build.stdout:
        lines.append(line)
        if marker in line:
            return
    raise AssertionError(f"the build ended before printing {marker!r}:\n{''.join(lines)}")


def _observation_years(data: Path) -> set[int]:
    files = (data / "releases").glob(f"*/published/observations/city={CITY}/year=*/*.parquet")
    return {int(path.parent.name.removeprefix("year=")) for path in files}


def _instance(tmp_path: Path) -> dg.DagsterInstance:
    """The build's Dagster instance, opened read-back in this process (no build is running)."""
    from dagster._core.instance.ref import InstanceRef

    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path / "dagster_home")))


def _instance_state(tmp_path: Path) -> tuple[list[str], int]:
    """Backfill statuses and runs still recorded as running."""
    unfinished = [
        dg.DagsterRunStatus.STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.QUEUED,
        dg.DagsterRunStatus.CANCELING,
    ]
    with _instance(tmp_path) as instance:
        statuses = [b.status.value for b in instance.get_backfills()]
        running = len(instance.get_runs(filters=dg.RunsFilter(statuses=unfinished)))
    return statuses, running


def _run_priorities(tmp_path: Path) -> dict[str, list[tuple[str, bool]]]:
    """Per backfill of the newest build, oldest first: (dagster/priority tag, whether it holds
    city × year assets) of its runs."""
    from pipelines.build import _per_city_year_assets

    keys = _per_city_year_assets()
    with _instance(tmp_path) as instance:
        backfills = instance.get_backfills()  # newest first
        build = backfills[0].tags["citycube/build"]
        ours = [b for b in reversed(backfills) if b.tags["citycube/build"] == build]
        priorities = {}
        for backfill in ours:
            tags = {"dagster/backfill": backfill.backfill_id}
            runs = instance.get_runs(filters=dg.RunsFilter(tags=tags))
            priorities[backfill.title or ""] = [
                (
                    run.tags.get("dagster/priority", "0"),
                    any(k in keys for k in run.asset_selection or ()),
                )
                for run in runs
            ]
    return priorities


def test_stop_requests_then_a_rerun_builds_everything(tmp_path: Path) -> None:
    data = tmp_path / "data"

    # 1. One SIGTERM once a run is working: the backfill is canceled through Dagster.
    build = _start(tmp_path)
    lines: list[str] = []
    _wait_for(build, "partitions", lines)
    build.send_signal(signal.SIGTERM)
    rest, _ = build.communicate(timeout=300)
    out = "".join(lines) + rest
    assert build.returncode == 130, out
    assert "Stopped after" in out and "Run the same command again" in out
    statuses, running = _instance_state(tmp_path)
    # The backfill it was driving is canceled (and a second one never started, if the first
    # was); an earlier one of the same build may have completed.
    assert statuses[0] == "CANCELED" and running == 0, out
    assert set(statuses[1:]) <= {"COMPLETED_SUCCESS"}, out
    assert not list((data / "releases").glob("*/cube.duckdb")), "a stopped build published a cube"

    # 2. Two requests: every run is forced down at once; none is left recorded as running.
    build = _start(tmp_path)
    lines = []
    _wait_for(build, "started:", lines)
    build.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    build.send_signal(signal.SIGTERM)
    rest, _ = build.communicate(timeout=120)
    out = "".join(lines) + rest
    assert build.returncode == 130, out
    _, running = _instance_state(tmp_path)
    assert running == 0, f"a run still shows as running:\n{out}"

    # 3. The same command again completes, and the cube holds every year once.
    build = _start(tmp_path)
    out, _ = build.communicate(timeout=900)
    assert build.returncode == 0, out
    assert "check unique_keys: PASS" in out
    assert _observation_years(data) == set(YEARS)
    (database,) = (data / "releases").glob("*/cube.duckdb")
    with duckdb.connect(str(database), read_only=True) as con:
        years = con.sql("SELECT DISTINCT year FROM observations ORDER BY year").fetchall()
        duplicates = con.sql(
            "SELECT count(*) FROM (SELECT tile_id, year, modality, field, count(*) AS n "
            "FROM observations GROUP BY ALL HAVING n > 1)"
        ).fetchone()
    assert [y for (y,) in years] == list(YEARS)
    assert duplicates == (0,)
    statuses, _ = _instance_state(tmp_path)
    assert statuses[0] == "COMPLETED_SUCCESS"  # newest first
    # Runs of static and epoch products (the first backfill's) left the queue first.
    (first, static_epoch), (second, rest) = _run_priorities(tmp_path).items()
    assert "(1/2: static and 5-year products)" in first and "(2/2:" in second
    assert static_epoch and {p for p, per_city_year in static_epoch} == {"1"}, static_epoch
    assert not any(per_city_year for _, per_city_year in static_epoch)
    assert {p for p, per_city_year in rest if per_city_year} == {"0"}, rest
    leftovers = [p for p in data.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]
    assert not leftovers
