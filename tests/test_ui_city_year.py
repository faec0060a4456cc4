"""One launch from the UI builds a city-year: on a fresh DAGSTER_HOME and data root, `make
dev`'s server (pipelines/dev.py) is sent the GraphQL mutation the UI's launch dialog sends for
one partition of requests/city_year, and nothing else; the daemon and the city_year_requests
sensor then build Boston 2020 into the cube."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import httpx
import pytest

from pipelines.graphql import DagsterGraphQL
from pipelines.ports import free_loopback_port
from pipelines.schedules import REQUEST_TAG

pytestmark = pytest.mark.e2e(builds=1)

REPO = Path(__file__).resolve().parent.parent
BUILD_S = 1500.0
"""Longest wait for the whole city-year on a loaded 2-core machine."""
LAUNCH = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""


def test_one_ui_launch_builds_boston_2020(tmp_path: Path) -> None:
    from dagster._core.instance.ref import InstanceRef

    home, data, port = tmp_path / "home", tmp_path / "data", free_loopback_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "CITYCUBE_DATA": str(data)}
    env.update({"CITYCUBE_RELEASE": "ui", "CITYCUBE_WORKERS": "2"})
    subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "dagster-home"], cwd=REPO, env=env, check=True
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "pipelines.dev", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/graphql"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).is_success:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "no UI"
            time.sleep(1)
        # The UI offers an asset's launch dialog once its code location has loaded.
        while (error := DagsterGraphQL(url=url).location_error("citycube")) is not None:
            assert time.monotonic() < deadline and server.poll() is None, error
            time.sleep(1)
        # What the launch dialog sends for Assets → requests/city_year → Materialize → one
        # partition (ui-core LaunchAssetChoosePartitionsDialog, "pureWithAnchorAsset").
        params = {
            "assetSelection": [{"path": ["requests", "city_year"]}],
            "partitionNames": ["Boston|2020"],
            "fromFailure": False,
            "tags": [],
        }
        answer = httpx.post(
            url, json={"query": LAUNCH, "variables": {"backfillParams": params}}, timeout=120
        ).json()
        assert answer["data"]["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", (
            answer
        )
        manifest = dg.AssetKey(["cube", "manifest"])
        deadline = time.monotonic() + BUILD_S
        with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
            while instance.get_latest_materialization_event(manifest) is None:
                failed = instance.get_runs(
                    filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])
                )
                assert not failed, [r.run_id for r in failed]
                assert time.monotonic() < deadline, "the city-year was not built in time"
                time.sleep(5)
            runs = instance.get_runs()
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        built = [r for r in runs if REQUEST_TAG in r.tags]
        assert {r.tags["citycube/stage"] for r in built} == {"sources", "city-years", "cube"}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    with duckdb.connect(str(data / "releases" / "ui" / "cube.duckdb"), read_only=True) as con:
        cities_years = con.execute("SELECT DISTINCT city, year FROM observations").fetchall()
        modalities = con.execute("SELECT count(DISTINCT modality) FROM observations").fetchone()
    assert cities_years == [("Boston", 2020)]
    assert modalities[0] == 18
