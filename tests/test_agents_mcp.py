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
from pipelines.ports import free_loopback_port
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


def test_streamable_http_serves_the_tools_on_loopback(release, tmp_path: Path) -> None:
    from mcp import Client

    port = free_loopback_port()
    cmd = [sys.executable, "-m", "pipelines.cli", "--data", str(release.data_root)]
    cmd += ["--release", "t", "agents", "serve", "--transport", "http", "--port", str(port)]
    cmd += ["--agent", "http-test", "--profile", "forecast"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180  # a loaded machine imports slowly
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


def test_the_dagster_asset_runs_the_agent_and_adds_queryable_views(release, capsys) -> None:
    import dagster as dg

    from assets.agents import build_agent_assets
    from pipelines.resources import CubeResource

    result = dg.materialize(
        build_agent_assets(),
        resources={"cube": CubeResource(data_root=str(release.data_root), release_version="t")},
        instance=dg.DagsterInstance.ephemeral(),
        run_config={"ops": {"agents__scripted_runs": {"config": {"series_per_target": 1}}}},
    )
    assert result.success
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        runs = con.execute(
            "SELECT run, count(*) FILTER (WHERE submitted), any_value(release), "
            "count(DISTINCT catalogue_digest) FROM agent_runs GROUP BY run ORDER BY run"
        ).fetchall()
        calls = con.execute(
            "SELECT count(*) FROM agent_tool_calls WHERE counted AND NOT ok"
        ).fetchone()
        mae = con.execute(
            "SELECT value FROM agent_scores WHERE run = 'scripted-last_year' AND target = 'lst' "
            "AND metric = 'mae'"
        ).fetchone()
    assert runs == [
        ("scripted-last_year", 15, "t", 1),
        ("scripted-median_of_four", 15, "t", 1),
        ("scripted-ten_year_mean", 15, "t", 1),
    ]
    assert calls == (0,)
    refs = pq.read_table(ForecastFiles.published(release).references).to_pylist()
    direct = _direct_predictions(release)["scripted-last_year"]
    lst = [r for r in refs if r["target"] == "lst" and r["series_order"] < 1]
    assert mae[0] == pytest.approx(
        np.mean([abs(r["reference"] - direct[r["case_key"]]) for r in lst]), rel=1e-12
    )
    assert _cli(release, "show") == 0
    out = capsys.readouterr().out
    assert "scripted-median_of_four: 15 cases answered" in out


def test_the_asset_makes_no_runs_without_cases(tmp_path: Path) -> None:
    import dagster as dg

    from assets.agents import build_agent_assets
    from pipelines.resources import CubeResource

    result = dg.materialize(
        build_agent_assets(),
        resources={"cube": CubeResource(data_root=str(tmp_path), release_version="empty")},
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    (mat,) = result.asset_materializations_for_node("agents__scripted_runs")
    assert mat.metadata["runs"].value == 0
    assert not (tmp_path / "agent_runs").exists()


def test_the_documented_client_configuration_works(release) -> None:
    """The ``mcpServers`` example of docs/agents.md, with its two paths filled in, starts a
    server an MCP client can use."""
    import re

    from mcp import Client, StdioServerParameters, stdio_client

    doc = (Path(__file__).parents[1] / "docs" / "agents.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```json\n(.*?)```", doc, flags=re.S)
    server = json.loads(block)["mcpServers"]["citycube-forecasting"]
    command = server["command"].replace(
        "/path/to/citycube/.venv/bin", str(Path(sys.executable).parent)
    )
    args = [str(release.data_root) if a == "/path/to/citycube/data" else a for a in server["args"]]
    args[args.index("--release") + 1] = "t"
    assert Path(command).exists()

    async def session() -> tuple[list[str], int]:
        params = StdioServerParameters(command=command, args=args)
        with (release.data_root / "doc-client.log").open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                tools = sorted(t.name for t in (await client.list_tools()).tools)
                cases = json.loads((await client.call_tool("list_cases", {})).content[0].text)
        return tools, len(cases["cases"])

    tools, n_cases = anyio.run(session)
    assert "time_series_diagnostics" in tools and "submit_answer" in tools
    assert n_cases == 30  # two series per target, as the example asks


@pytest.mark.parametrize(
    "where", [["--run", "OUTSIDE"], ["--agent", "../escape"], ["--agent", ".hidden"]]
)
def test_serve_writes_runs_only_inside_the_data_root(
    release, tmp_path: Path, capsys, where: list[str]
) -> None:
    args = [str(tmp_path / "elsewhere") if a == "OUTSIDE" else a for a in where]
    assert _cli(release, "serve", *args) == 2
    assert "CC402" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere").exists()
    assert not (release.data_root / "agent_runs" / "escape").exists()


def test_show_prints_the_score_table_each_planning_task_names(tmp_path: Path, capsys) -> None:
    """`agents show` asks every planning task for its score table and prints each one found;
    a table no task names is not shown, however it is called."""
    import pyarrow as pa

    from citycube.agents.views import publish_task_tables
    from pipelines.agents import PLANNING_TASKS, planning_task

    names = {
        "ev_charging": "ev_agent_scores",
        "school_capacity": "school_agent_scores",
        "food_access": "food_access_agent_scores",
    }
    assert {t: planning_task(t).SCORE_TABLE for t in PLANNING_TASKS} == names
    release = make_agent_release(tmp_path)
    for task, name in names.items():
        table = pa.table({"run": [f"{task}-scripted-marker"], "value": [0.25]})
        assert publish_task_tables(release, task, {name: table}) == [name]
    other = pa.table({"run": ["not-a-task-run"], "value": [1.0]})
    assert publish_task_tables(release, "other", {"other_agent_scores": other}) == [
        "other_agent_scores"
    ]
    assert _cli(release, "show") == 0
    out = capsys.readouterr().out
    for task, name in names.items():
        assert f"{name}:" in out and f"{task}-scripted-marker" in out
    assert "other_agent_scores" not in out and "not-a-task-run" not in out
