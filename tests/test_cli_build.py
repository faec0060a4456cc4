"""`citycube build` as a user runs it: stop requests, a forced stop, and a clean re-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.e2e

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
        stderr=subprocess.PIPE,
        text=True,
    )


def _built_years(lines: list[str]) -> list[int]:
    return [int(line.split(":")[0].split()[-1]) for line in lines if line.startswith("[")]


def _observation_years(data: Path) -> set[int]:
    files = (data / "releases").glob(f"*/observations/city={CITY}/year=*/*.parquet")
    return {int(path.parent.name.removeprefix("year=")) for path in files}


def _runs_left_running(tmp_path: Path) -> int:
    """Runs the Dagster instance still records as started (read in a fresh interpreter)."""
    probe = (
        "import dagster as dg\n"
        "i = dg.DagsterInstance.get()\n"
        "s = [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING]\n"
        "print(len(i.get_runs(filters=dg.RunsFilter(statuses=s))))\n"
    )
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip().splitlines()[-1])


def test_stop_requests_then_a_rerun_builds_everything(tmp_path: Path) -> None:
    data = tmp_path / "data"

    # 1. One SIGTERM after the first city-year: running work finishes, nothing new starts.
    build = _start(tmp_path)
    assert build.stdout is not None
    lines = []
    for line in build.stdout:
        lines.append(line)
        if line.startswith("[1/"):
            build.send_signal(signal.SIGTERM)
            break
    rest, err = build.communicate(timeout=300)
    lines += rest.splitlines()
    assert build.returncode == 130, err
    assert "Stopped after" in err and "run the same command again" in err
    built = _built_years(lines)
    assert 1 <= len(built) < len(YEARS)
    assert _observation_years(data) == set(built)
    assert not list((data / "releases").glob("*/cube.duckdb")), "a stopped build left a cube"

    # 2. Two requests while a city-year runs: its worker is killed mid-write.
    build = _start(tmp_path)
    time.sleep(4)
    build.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    build.send_signal(signal.SIGTERM)
    _, err = build.communicate(timeout=120)
    assert build.returncode == 130, err
    assert _runs_left_running(tmp_path) == 0, "a killed run still shows as running"

    # 3. The same command again completes, and the cube holds every year once.
    build = _start(tmp_path)
    out, err = build.communicate(timeout=600)
    assert build.returncode == 0, err
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
    leftovers = [p for p in data.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]
    assert not leftovers
