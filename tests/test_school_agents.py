"""The school capacity tools: what a case may read (no URN, no target, no urban data after
period 0), plan validation, calculate, and the scripted baseline agent through a real MCP
session reproducing the direct baseline scores exactly."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import duckdb
import pyarrow.parquet as pq
import pytest

from citycube.agents.school_capacity import SCHOOL_TOOLS, calculate
from citycube.errors import AgentCaseError, CityCubeError, SchoolPlanError
from citycube.tasks.school_capacity import SchoolFiles
from pipelines.agent_tasks.school_capacity import (
    STRATEGIES,
    build_server,
    open_run,
    score_runs,
    scripted_agent,
)
from tests.school_fixtures import FUTURE_MARK, make_school_release


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory):
    return make_school_release(tmp_path_factory.mktemp("school_agents"))


def _every_value(data: object) -> list[object]:
    if isinstance(data, dict):
        return [v for x in data.values() for v in _every_value(x)]
    if isinstance(data, list):
        return [v for x in data for v in _every_value(x)]
    return [data]


def test_a_case_sees_its_history_and_nothing_after_period_0(release, tmp_path: Path) -> None:
    with open_run(release, tmp_path / "probe", agent="probe") as run:
        key = run.case_keys()[0]
        message = run.start_case(key)
        refs = pq.read_table(SchoolFiles.published(release).references).to_pylist()
        ref = next(r for r in refs if r["case_key"] == key)
        history = run.call("read_school_history").data
        assert history["periods"] == [-2, -1, 0] and len(history["enrollment"]) == 3
        assert history["source"].endswith("SYNTHETIC sample twin")
        seen = [
            message,
            history,
            run.call("list_modalities").data,
            run.call("list_assets").data,
            run.call("read_table", {"asset_id": "HEAT/table"}).data,
            run.call("read_table", {"asset_id": "POP/table"}).data,
            run.call("describe_raster", {"asset_id": "OPT/raster", "period": 0}).data,
        ]
        values = [v for data in seen for v in _every_value(data)]
        assert FUTURE_MARK not in values  # no urban value of period +1 or a later product
        assert ref["urn"] not in values
        text = json.dumps(seen, ensure_ascii=False)
        assert "2023" not in text and "2024" not in text  # periods, not years
        modalities = {m["modality"]: m["periods"] for m in seen[2]["modalities"]}
        assert max(p for ps in modalities.values() for p in ps) == 0
        assert modalities["POP"] == [-9, -8, -7, -6, -5, -4]  # the 2025 epoch serves none
        heat = seen[4]["rows"]
        assert [r["period"] for r in heat] == list(range(-9, 1))
        assert seen[6]["bands"][0]["mean"] == 23.0  # period 0's chip, not period +1's
        with pytest.raises(AgentCaseError, match="outside the case's evidence"):
            run.call("read_table", {"asset_id": "HEAT/table", "periods": [1]})
        with pytest.raises(AgentCaseError, match="outside the case's evidence"):
            run.call("describe_raster", {"asset_id": "OPT/raster", "period": 1})
        with pytest.raises(AgentCaseError, match="not tiles of London"):
            run.call("read_table", {"asset_id": "HEAT/table", "tiles": ["Boston_2KM_r1_c1"]})
        image = run.call("view_raster", {"asset_id": "OPT/raster", "period": -1})
        assert image.image is not None and image.image.startswith(b"\x89PNG")


def test_plans_are_validated_and_a_valid_one_ends_the_case(release, tmp_path: Path) -> None:
    with open_run(release, tmp_path / "plans", agent="plans") as run:
        run.start_case(run.case_keys()[1])
        history = run.call("read_school_history").data  # evidence-0001
        with pytest.raises(AgentCaseError):
            run.call("read_table", {"asset_id": "NOPE/table"})  # evidence-0002 failed
        good = {"predicted_enrollment": 400, "added_seats": 5, "reason": "mean of three"}
        bad_cases = [
            ({**good, "added_seats": -1, "evidence_ids": ["evidence-0001"]}, "added_seats"),
            ({**good, "added_seats": 2.5, "evidence_ids": ["evidence-0001"]}, "added_seats"),
            ({**good, "added_seats": True, "evidence_ids": ["evidence-0001"]}, "added_seats"),
            ({**good, "predicted_enrollment": -3, "evidence_ids": ["evidence-0001"]}, "predicted"),
            ({**good, "evidence_ids": []}, "evidence_ids"),
            ({**good, "evidence_ids": ["evidence-0002"]}, "not a successful read"),
            ({**good, "evidence_ids": ["evidence-0099"]}, "not a successful read"),
            ({**good, "evidence_ids": ["call 1"]}, "not an evidence id"),
            ({**good, "reason": " ", "evidence_ids": ["evidence-0001"]}, "reason"),
        ]
        for arguments, words in bad_cases:
            with pytest.raises(SchoolPlanError, match=words) as err:
                run.call("submit_plan", arguments)
            assert err.value.code == "CC415"
        accepted = run.call(
            "submit_plan", {**good, "evidence_ids": ["evidence-0001/school_history"]}
        ).data
        assert accepted["case_ended"]
        assert accepted["planned_capacity"] == history["capacity"][-1] + 5
        with pytest.raises(AgentCaseError, match="has ended"):
            run.call("read_school_history")
    with pytest.raises(duckdb.ConnectionException, match="closed"):  # the run's own connection
        run.con.execute("SELECT 1")


def test_calculate_evaluates_arithmetic_only() -> None:
    assert calculate("(637 + 724 + 753) / 3") == pytest.approx(704.6667, abs=1e-4)
    assert calculate("max(0, ceil(782 / 1.05) - 600)") == 145
    assert calculate("mean(1, 2, 3) ** 2") == 4
    for bad in ("__import__('os').system('true')", "open('x')", "a + 1", "2 ** 1000", "1/0", ""):
        with pytest.raises(CityCubeError):
            calculate(bad)
    with pytest.raises(AgentCaseError, match="calculate: exponents above 64 are not evaluated"):
        calculate("2 ** 65")  # the school task's own limit and wording
    with pytest.raises(AgentCaseError, match="calculate: 'a' is not allowed"):
        calculate("a + 1")


def test_the_scripted_agent_over_mcp_reproduces_the_direct_baselines(
    release, tmp_path: Path
) -> None:
    from mcp import Client

    run_dirs = []
    for strategy in STRATEGIES:
        run_dir = tmp_path / f"scripted-{strategy}"
        with open_run(release, run_dir, agent=f"scripted-{strategy}") as run:

            async def drive(run=run, strategy=strategy) -> int:
                async with Client(build_server(run)) as client:
                    tools = sorted(t.name for t in (await client.list_tools()).tools)
                    assert tools == sorted([*SCHOOL_TOOLS, "list_cases", "start_case"])
                    return await scripted_agent(client, strategy)

            assert anyio.run(drive) == 100
        run_dirs.append(run_dir)
    tables = score_runs(release, run_dirs)
    got = {
        (r["strategy"].removeprefix("scripted-"), r["group"], r["metric"]): r["value"]
        for r in tables["school_agent_scores"].to_pylist()
    }
    direct = pq.read_table(SchoolFiles.published(release).scores).to_pylist()
    assert len(direct) == 2 * 5 * 8
    for row in direct:
        assert got[(row["strategy"], row["group"], row["metric"])] == row["value"], row
    runs = tables["school_agent_runs"].to_pylist()
    assert len(runs) == 200 and all(r["submitted"] for r in runs)
    calls = tables["school_agent_tool_calls"].to_pylist()
    assert {c["tool"] for c in calls} >= {"read_school_history", "read_table", "submit_plan"}
    assert all(c["ok"] for c in calls)
