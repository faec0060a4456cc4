"""The forecasting cases over MCP: the scripted agent through a real stdio session equals a
direct computation on the cube to the last digit and reruns identically; the streamable HTTP
transport serves the same tools on loopback."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from citycube.agents.strategies import STRATEGIES
from citycube.agents.trajectory import read_trajectory, without_timing
from citycube.tasks.forecast import (
    PANEL_YEARS,
    ForecastFiles,
    eligible_panel,
    read_panel,
    score_cases,
    target,
)
from pipelines.cli import main
from tests.agent_fixtures import make_agent_release


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory):
    return make_agent_release(tmp_path_factory.mktemp("agents_mcp"))


def _cli(release, *args: str) -> int:
    return main(["--data", str(release.data_root), "--release", "t", "agents", *args])


def _direct_predictions(release) -> dict[str, dict[str, float]]:
    """Each strategy on the history cut straight from the cube's observations."""
    references = pq.read_table(ForecastFiles.published(release).references).to_pylist()
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        panels = {
            name: eligible_panel(read_panel(con, target(name)), target(name))
            for name in ("lst", "carbon", "property")
        }
    out: dict[str, dict[str, float]] = {f"scripted-{s}": {} for s in STRATEGIES}
    for ref in references:
        series = panels[ref["target"]].series[ref["tile_id"]]
        at = PANEL_YEARS.index(ref["origin_year"])
        history = [float(v) for v in series[at - 10 : at]]
        for name, rule in STRATEGIES.items():
            out[f"scripted-{name}"][ref["case_key"]] = rule(history)
    return out


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_scripted_agent_over_stdio_equals_the_direct_computation(release, capsys) -> None:
    assert _cli(release, "run") == 0
    printed = capsys.readouterr().out
    assert "30 cases answered over MCP (stdio)" in printed
    tables = release.data_root / "agent_runs" / "t" / "tables"
    scores = pq.read_table(tables / "agent_scores.parquet").to_pylist()
    references = pq.read_table(ForecastFiles.published(release).references)
    direct = score_cases(references, _direct_predictions(release))
    expected = {(r["method"], r["target"], r["group"], r["metric"]): r for r in direct.to_pylist()}
    compared = 0
    for row in scores:
        if row["metric"] not in ("mae", "mape", "rmse", "r2"):
            continue
        want = expected[(row["run"], row["target"], row["group"], row["metric"])]
        for field in ("value", "ci_low", "ci_high"):
            assert _same(row[field], want[field]), (row, want)
        compared += 1
    assert compared == len(expected) == 3 * (4 + 4 + 5)
    # every run row carries the release and the catalogue digest; calls are counted
    runs = pq.read_table(tables / "agent_runs.parquet").to_pylist()
    assert {r["release"] for r in runs} == {"t"} and all(r["submitted"] for r in runs)
    assert {r["tool_calls"] for r in runs if r["run"] == "scripted-last_year"} == {5}
    assert {r["tool_calls"] for r in runs if r["run"] == "scripted-median_of_four"} == {6}
    calls = pq.read_table(tables / "agent_tool_calls.parquet")
    assert set(calls["tool"].to_pylist()) >= {"get_history", "view_raster", "submit_answer"}


def test_a_rerun_reproduces_scores_and_trajectories(release) -> None:
    root = release.data_root / "agent_runs" / "t"
    if not (root / "scripted-median_of_four").exists():
        assert _cli(release, "run", "--strategy", "median_of_four") == 0
    before = pq.read_table(root / "tables" / "agent_scores.parquet")
    before = before.filter(np.asarray(before["run"].to_pylist()) == "scripted-median_of_four")
    traj = {
        p.parent.name: list(without_timing(read_trajectory(p)))
        for p in (root / "scripted-median_of_four" / "cases").glob("*/trajectory.jsonl")
    }
    assert _cli(release, "run", "--strategy", "median_of_four") == 0
    after = pq.read_table(root / "tables" / "agent_scores.parquet")
    assert after.equals(before)
    for key, lines in traj.items():
        path = root / "scripted-median_of_four" / "cases" / key / "trajectory.jsonl"
        assert list(without_timing(read_trajectory(path))) == lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_serves_the_tools_on_loopback(release, tmp_path: Path) -> None:
    from mcp import Client

    port = _free_port()
    cmd = [sys.executable, "-m", "pipelines.cli", "--data", str(release.data_root)]
    cmd += ["--release", "t", "agents", "serve", "--transport", "http", "--port", str(port)]
    cmd += ["--agent", "http-test", "--profile", "forecast"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.2)

        async def session() -> tuple[list[str], dict, bytes, str]:
            import base64

            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                tools = sorted(t.name for t in (await client.list_tools()).tools)
                keys = json.loads((await client.call_tool("list_cases", {})).content[0].text)
                key = keys["cases"][0]
                await client.call_tool("start_case", {"case_key": key})
                history = json.loads((await client.call_tool("get_history", {})).content[0].text)
                assets = json.loads((await client.call_tool("list_assets", {})).content[0].text)
                raster = next(a for a in assets["assets"] if a["kind"] == "raster")
                view = await client.call_tool(
                    "view_raster",
                    {"asset_id": raster["asset_id"], "period": raster["periods_available"][-1]},
                )
                image = next(c for c in view.content if c.type == "image")
                bad = await client.call_tool(
                    "read_table", {"asset_id": "HEAT/table", "periods": [0]}
                )
                assert bad.is_error
                return tools, history, base64.b64decode(image.data), bad.content[0].text

        tools, history, png, error = anyio.run(session)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert tools == sorted(
        [
            "list_cases",
            "start_case",
            "get_history",
            "list_assets",
            "read_table",
            "describe_raster",
            "view_raster",
            "materialize_asset",
            "submit_answer",
        ]
    )
    assert history["periods"] == list(range(-10, 0)) and history["evidence_id"] == "evidence-0001"
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert "CC400" in error and "outside the case's history" in error
    trajectory = release.data_root / "agent_runs" / "t" / "http-test" / "cases"
    assert len(list(trajectory.glob("*/trajectory.jsonl"))) == 1


def test_agents_without_a_release_fail_clearly(tmp_path: Path, capsys) -> None:
    code = main(["--data", str(tmp_path), "--release", "none", "agents", "run"])
    assert code == 2
    err = capsys.readouterr().err
    assert "CC400" in err or "no forecasting cases" in err or "no published cube" in err
