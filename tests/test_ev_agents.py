"""The EV charging tools over MCP: the scripted agent through a real client session equals the
direct baselines exactly; nothing from t−1 or t reaches a tool; submissions are validated."""

from __future__ import annotations

import json

import anyio
import duckdb
import pyarrow.parquet as pq
import pytest

from citycube.agents.ev_charging import EV_TOOLS, evaluate
from citycube.cube.release import Release
from citycube.errors import AgentCaseError, EvSubmissionError
from citycube.tasks.ev_charging import PRODUCT, EvFiles, write_ev_cases
from pipelines.agent_tasks import ev_charging as task
from sources.sample.backend import SampleBackend
from tests.agent_fixtures import CITY, publish, stage_boston


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    root = tmp_path_factory.mktemp("ev_agents")
    release, meta = stage_boston(root)
    item = SampleBackend(0).fetch(PRODUCT, CITY, None, root / "sources")
    write_ev_cases(
        release,
        {CITY: item.files},
        {"NYC": "city outside the release's scope", "SanFrancisco": "city outside"},
    )
    publish(release, meta)
    return release


def _run(release: Release, name: str) -> task.EvRun:
    return task.open_run(release, release.data_root / "agent_runs" / "t" / name, agent=name)


def test_views_hold_the_cases_and_say_why_cities_are_missing(release: Release) -> None:
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        per_city = dict(
            con.execute("SELECT city, sum(selected) FROM ev_case_counts GROUP BY city").fetchall()
        )
        reason = con.execute(
            "SELECT DISTINCT reason FROM ev_case_counts WHERE city = 'NYC'"
        ).fetchall()
        assert con.execute("SELECT count(*) FROM ev_cases").fetchone() == (50,)
        assert con.execute("SELECT count(*) FROM ev_baseline_stations").fetchone()[0] > 0
    assert per_city == {"Boston": 50, "NYC": 0, "SanFrancisco": 0}
    assert reason == [("city outside the release's scope",)]
    manifest = json.loads(EvFiles.published(release).manifest.read_text())
    assert manifest["found"] == {"Boston": 50, "NYC": 0, "SanFrancisco": 0}
    assert set(manifest["missing"]) == {"NYC", "SanFrancisco"}


@pytest.mark.parametrize("strategy", task.STRATEGIES)
def test_scripted_agent_over_mcp_equals_the_direct_baseline(
    release: Release, strategy: str
) -> None:
    from mcp import Client

    run = _run(release, f"scripted-{strategy}")

    async def session() -> tuple[list[str], int]:
        async with Client(task.build_server(run)) as client:
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            return tools, await task.scripted_agent(client, strategy)

    try:
        tools, answered = anyio.run(session)
    finally:
        run.close()
    assert answered == 50
    assert set(EV_TOOLS) <= set(tools) and len(EV_TOOLS) == 9
    scores = task.score_runs(release, [run.run_dir])["ev_agent_scores"].to_pylist()
    direct = pq.read_table(EvFiles.published(release).scores).to_pylist()
    mine = {r["city"]: r for r in scores}
    theirs = {r["city"]: r for r in direct if r["method"] == strategy}
    assert set(mine) == set(theirs)
    for city, row in theirs.items():
        for column in ("n", "accuracy", "macro_f1", "balanced_accuracy", "confusion_json"):
            assert mine[city][column] == row[column], (city, column)


def test_no_tool_shows_t_minus_1_or_later(release: Release) -> None:
    run = _run(release, "leak-check")
    try:
        key = run.case_keys()[0]
        run.start_case(key)
        tile = run.cases[key].tile_id
        rows = run.call("read_table", {"asset_id": "HEAT/table"}).data["rows"]
        assert rows and max(r["period"] for r in rows) == -2
        with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
            by_year = dict(
                con.execute(
                    "SELECT year, value FROM observations WHERE tile_id = ? AND modality = 'HEAT'"
                    " AND field = 'mean_c' AND city = ?",
                    [tile, CITY],
                ).fetchall()
            )
        shown = {r["period"]: r["value"] for r in rows if r["field"] == "mean_c"}
        assert shown[-2] == by_year[2024]  # t-2 is 2024's value …
        assert by_year[2025] not in shown.values()  # … and 2025 (t-1) is never shown
        for period in (-1, 0):
            with pytest.raises(AgentCaseError, match="t-2 is the last"):
                run.call("read_table", {"asset_id": "HEAT/table", "periods": [period]})
        rasters = [a for a in run.call("list_assets").data["assets"] if a["kind"] == "raster"]
        assert rasters and all(max(a["periods_available"]) <= -2 for a in rasters)
        case = run.call("inspect_case").data
        assert [h["period"] for h in case["charging_history"]] == [-4, -3, -2]
        text = json.dumps(case) + json.dumps(run.call("inspect_baseline").data)
        for word in ("net_change", 'ports_t"', "2024", "2026"):
            assert word not in text
    finally:
        run.close()


def test_submissions_are_validated_and_end_the_case(release: Release) -> None:
    run = _run(release, "validation")
    try:
        run.start_case(run.case_keys()[0])
        seen = run.call("inspect_case").data["evidence_id"]
        with pytest.raises(EvSubmissionError) as err:
            run.call(
                "submit_forecast",
                {
                    "range": "E",
                    "confidence": 2,
                    "explanation": "",
                    "range_reasons": {"A": "x"},
                    "evidence_ids": ["evidence-0099"],
                    "limitations": "none",
                },
            )
        message = str(err.value)
        assert message.startswith("[CC411]")
        for part in ("range must be one of", "confidence", "explanation", "range_reasons"):
            assert part in message
        assert "evidence-0099" in message
        good = {
            "range": "B",
            "confidence": 0.6,
            "explanation": "growth continues",
            "range_reasons": {r: f"reason {r}" for r in "ABCD"},
            "evidence_ids": [seen],
            "limitations": "one tile only",
        }
        assert run.call("submit_forecast", good).data["case_ended"]
        with pytest.raises(AgentCaseError, match="has ended"):
            run.call("inspect_case")
    finally:
        run.close()


def test_calculate_is_arithmetic_only() -> None:
    assert evaluate("(12 - 7) / 5 + max(1, 2) ** 2") == 5.0
    assert evaluate("sum(1, 2, 3.5)") == 6.5  # every listed function takes numbers
    for bad in ("__import__('os').system('true')", "a + 1", "2 ** 1000", "1 / 0", ""):
        with pytest.raises(AgentCaseError):
            evaluate(bad)
    assert evaluate("2 ** 100") == 2.0**100  # the EV task's own limit and wording
    with pytest.raises(AgentCaseError, match=r"^\[CC\d+\] exponents above 100 are refused"):
        evaluate("2 ** 101")
    with pytest.raises(AgentCaseError, match=r"calculate takes numbers.*; not Name\(id='a'"):
        evaluate("a + 1")


def test_tool_errors_reach_the_client_with_their_code(release: Release) -> None:
    from mcp import Client

    run = _run(release, "errors")

    async def session() -> tuple[str, str]:
        async with Client(task.build_server(run)) as client:
            key = json.loads((await client.call_tool("list_cases", {})).content[0].text)
            await client.call_tool("start_case", {"case_key": key["cases"][0]})
            late = await client.call_tool("read_table", {"asset_id": "HEAT/table", "periods": [-1]})
            bad = await client.call_tool(
                "submit_forecast",
                {
                    "range": "Z",
                    "confidence": 0.5,
                    "explanation": "x",
                    "range_reasons": {r: "x" for r in "ABCD"},
                    "evidence_ids": [],
                    "limitations": "x",
                },
            )
            assert late.is_error and bad.is_error
            return late.content[0].text, bad.content[0].text

    try:
        late, bad = anyio.run(session)
    finally:
        run.close()
    assert "[CC400]" in late and "t-2 is the last" in late
    assert "[CC411]" in bad and "range must be one of" in bad
