"""The agents' core: case views with hidden years, the tools, trajectories, submissions,
strategies and scoring, on a small published release with traps for leaks
(``tests/agent_fixtures.py``)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from citycube.agents.cases import YEAR_PATTERN, Case, hide_years, release_cases
from citycube.agents.scoring import score_run
from citycube.agents.session import ToolResult
from citycube.agents.strategies import (
    STRATEGIES,
    ar1_one_step,
    ewma,
    four_estimates,
    median_of_four,
)
from citycube.agents.submission import validate_submission
from citycube.agents.tools import PROFILES, AgentRun, replay_case
from citycube.agents.trajectory import read_trajectory, without_timing
from citycube.catalogue.modalities import load_catalogue
from citycube.errors import AgentCaseError, SubmissionError, WorkspacePathError
from citycube.tasks.forecast import ForecastFiles, baseline_predictions
from tests.agent_fixtures import FUTURE_MARK, make_agent_release

CAT = load_catalogue()


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory):
    return make_agent_release(tmp_path_factory.mktemp("agents"))


@pytest.fixture(scope="module")
def cases(release) -> dict[str, Case]:
    return release_cases(release)


def _run(cases, release, run_dir: Path, profile: str = "analysis") -> AgentRun:
    """A run over its own connection to the release (the run closes it)."""
    con = duckdb.connect(str(release.duckdb_file), read_only=True)
    return AgentRun(con, cases, CAT, release.root, run_dir, profile=profile, agent="test")


def _walk(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield "__key__", k
            yield from _walk(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)
    else:
        yield key, value


def _every_tool(run: AgentRun, case: Case) -> list[ToolResult]:
    """Call every tool of the analysis profile with the widest arguments it takes."""
    out = [run.call("get_history"), run.call("list_assets")]
    assets = out[1].data["assets"]
    for asset in assets:
        if asset["kind"] == "table":
            out.append(run.call("read_table", {"asset_id": asset["asset_id"], "tiles": None}))
            neighbours = out[1].data["neighbour_tiles"]
            out.append(
                run.call(
                    "read_table",
                    {"asset_id": asset["asset_id"], "tiles": [case.tile_id, *neighbours]},
                )
            )
            out.append(run.call("materialize_asset", {"asset_id": asset["asset_id"]}))
        else:
            for period in asset["periods_available"]:
                args = {"asset_id": asset["asset_id"], "period": period}
                out += [run.call("describe_raster", args), run.call("view_raster", args)]
                out.append(run.call("materialize_asset", args))
    values = list(case.history)
    for tool in ("trend_estimate", "summary_statistics", "time_series_diagnostics"):
        out.append(run.call(tool, {"values": values}))
    return out


def test_no_tool_reaches_period_0_a_year_a_label_or_a_future_product(
    cases, release, tmp_path: Path
) -> None:
    references = pq.read_table(ForecastFiles.published(release).references).to_pylist()
    reference = {r["case_key"]: r["reference"] for r in references}
    with _run(cases, release, tmp_path / "run") as run:
        seen_periods: set[int] = set()
        one_per_origin = {cases[k].origin_year: k for k in run.case_keys()}
        for key in sorted(one_per_origin.values()):
            case = cases[key]
            message = run.start_case(key)
            results = _every_tool(run, case)
            for result in results:
                for k, v in _walk({"message": message, **result.data}):
                    if k == "__key__":
                        assert "year" not in v.lower(), (v, result.data)
                        continue
                    if isinstance(v, str) and k != "workspace_path":
                        assert not YEAR_PATTERN.search(v), (k, v)
                    if k in ("period", "periods_available", "periods"):
                        assert -10 <= v <= -1, (k, v, result.data.get("asset_id"))
                        seen_periods.add(v)
                    if k == "source_period" and v is not None:
                        assert v < 0, (k, v, result.data.get("asset_id"))
                    if isinstance(v, float):
                        if case.origin_year <= 2020:  # the 2020 epoch is then period 0 or later
                            assert v != FUTURE_MARK, (
                                "a value of a period-0 epoch product was served"
                            )
                        assert v != reference[key], f"{key}'s held-out reference was served"
            # rasters: period 0's chip (pixels = origin year − 2000) is never read
            for result in results:
                if "bands" in result.data and isinstance(result.data["bands"][0], dict):
                    assert result.data["bands"][0]["max"] < case.origin_year - 2000
            for period in (0, 1, -11):
                with pytest.raises(AgentCaseError, match="outside the case's history"):
                    run.call("read_table", {"asset_id": "HEAT/table", "periods": [period]})
                with pytest.raises(AgentCaseError, match="outside the case's history"):
                    run.call("view_raster", {"asset_id": "OPT/raster", "period": period})
        assert seen_periods == set(range(-10, 0))
        # the trap is live: for a later origin the 2020 epoch is history, and served
        later = next(k for k in run.case_keys() if cases[k].origin_year == 2022)
        run.start_case(later)
        pop = run.call("read_table", {"asset_id": "POP/table"}).data["rows"]
        assert {r["period"] for r in pop if r["value"] == FUTURE_MARK} == set(range(-7, 0))


def test_units_and_texts_carry_periods_not_years(cases, release, tmp_path: Path) -> None:
    key = next(k for k, c in cases.items() if c.target == "property")
    case = cases[key]
    with _run(cases, release, tmp_path / "run") as run:
        run.start_case(key)
        rows = run.call("read_table", {"asset_id": "PROP/table"}).data["rows"]
        assert {r["unit"] for r in rows} == {f"USD (nominal, period {p})" for p in range(-10, 0)}
        assert {r["source"] for r in rows} == {f"records period {p}" for p in range(-10, 0)}
        assert hide_years("2017 PPP", case) == f"period {2017 - case.origin_year} PPP"
        # another city's tiles are not this case's
        with pytest.raises(AgentCaseError, match="not tiles of this case's city"):
            run.call("read_table", {"asset_id": "HEAT/table", "tiles": ["London_2KM_r0_c0"]})


def test_history_is_the_case_s_and_baselines_follow(cases, release, tmp_path) -> None:
    with _run(cases, release, tmp_path / "run") as run:
        files = ForecastFiles.published(release)
        base = baseline_predictions(pq.read_table(files.cases))
        for key in run.case_keys():
            run.start_case(key)
            values = run.call("get_history").data["values"]
            assert STRATEGIES["last_year"](values) == base["last_year"][key]
            assert STRATEGIES["ten_year_mean"](values) == base["ten_year_mean"][key]


@pytest.mark.parametrize(
    "name",
    ["../escape", "/etc/passwd", "a/b", ".hidden", "..", "x" * 65, "a\\b", "", "ok name"],
)
def test_materialize_refuses_names_that_leave_the_workspace(
    cases, release, tmp_path: Path, name: str
) -> None:
    with _run(cases, release, tmp_path / "run") as run:
        run.start_case(run.case_keys()[0])
        before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
        with pytest.raises(WorkspacePathError):
            run.call("materialize_asset", {"asset_id": "HEAT/table", "name": name})
        after = sorted(p for p in tmp_path.rglob("*") if p.is_file())
        assert after == before


def test_materialize_refuses_a_symlink_out_of_the_workspace(cases, release, tmp_path: Path) -> None:
    with _run(cases, release, tmp_path / "run") as run:
        run.start_case(run.case_keys()[0])
        assert run.session is not None
        outside = tmp_path / "outside.csv"
        os.symlink(outside, run.session.workspace / "link.csv")
        with pytest.raises(WorkspacePathError, match="outside the case workspace"):
            run.call("materialize_asset", {"asset_id": "HEAT/table", "name": "link"})
        assert not outside.exists()
        good = run.call("materialize_asset", {"asset_id": "HEAT/table", "name": "heat"}).data
        assert (run.session.workspace / good["path"]).read_text().startswith("tile_id,")


def test_submission_is_validated_and_ends_the_case(cases, release, tmp_path) -> None:
    with _run(cases, release, tmp_path / "run") as run:
        key = run.case_keys()[0]
        unit = cases[key].unit
        run.start_case(key)
        run.call("get_history")
        with pytest.raises(SubmissionError) as err:
            run.call(
                "submit_answer",
                {
                    "prediction": math.nan,
                    "unit": "kelvin",
                    "reason": " ",
                    "modalities_used": ["NOPE"],
                    "modules_used": ["view_raster"],
                },
            )
        message = err.value.message
        for part in ("finite number", "the case's unit", "non-empty", "NOPE", "view_raster"):
            assert part in message
        with pytest.raises(SubmissionError, match="missing reason, modalities_used"):
            run.call("submit_answer", {"prediction": 1.0, "unit": unit, "modules_used": []})
        with pytest.raises(SubmissionError, match="finite number"):
            run.call(
                "submit_answer",
                {
                    "prediction": True,
                    "unit": unit,
                    "reason": "r",
                    "modalities_used": [],
                    "modules_used": [],
                },
            )
        answer = {
            "prediction": 21.5,
            "unit": unit,
            "reason": "last value",
            "modalities_used": ["HEAT"],
            "modules_used": ["get_history"],
        }
        assert run.call("submit_answer", answer).data["case_ended"] is True
        assert run.session is not None and run.session.done
        saved = json.loads((run.session.case_dir / "submission.json").read_text())
        assert saved["prediction"] == 21.5 and saved["case_key"] == key
        with pytest.raises(AgentCaseError, match="has ended"):
            run.call("get_history")
    with pytest.raises(SubmissionError, match="JSON object"):
        validate_submission([1], unit="x", modalities=[], tools_called=[])  # type: ignore[arg-type]


def test_profiles_differ_and_unknown_tools_are_refused(cases, release, tmp_path) -> None:
    with _run(cases, release, tmp_path / "run", profile="forecast") as run:
        run.start_case(run.case_keys()[0])
        with pytest.raises(AgentCaseError, match="not in the 'forecast' profile"):
            run.call("trend_estimate", {"values": [1.0, 2.0, 3.0]})
        with pytest.raises(AgentCaseError, match="bad arguments"):
            run.call("get_history", {"year": 2020})
        with pytest.raises(AgentCaseError, match="no case"):
            run.start_case("fc_not_a_case")
        assert set(PROFILES["analysis"]) - set(PROFILES["forecast"]) == {
            "trend_estimate",
            "summary_statistics",
            "time_series_diagnostics",
        }


def test_a_recorded_trajectory_replays_call_for_call(cases, release, tmp_path) -> None:
    key = sorted(cases)[3]
    with _run(cases, release, tmp_path / "first") as first:
        first.start_case(key)
        _every_tool(first, cases[key])
        with pytest.raises(AgentCaseError):
            first.call("read_table", {"asset_id": "HEAT/table", "periods": [0]})
    recorded = read_trajectory(tmp_path / "first" / "cases" / key / "trajectory.jsonl")
    assert len(recorded) > 10 and not recorded[-1]["ok"]
    with _run(cases, release, tmp_path / "second") as second:
        replayed = replay_case(second, key, recorded)
        assert second.session is None  # the case has ended, the run goes on
        assert second.start_case(key)["case_key"] == key
    assert list(without_timing(replayed)) == list(without_timing(recorded))
    assert [r["evidence_id"] for r in replayed] == [
        f"evidence-{i:04d}" for i in range(1, len(recorded) + 1)
    ]
    # a changed tool result changes the digest: the replay would tell
    assert len({r["result_digest"] for r in recorded}) > len(recorded) // 2


def test_ending_a_case_keeps_the_run_and_ending_the_run_closes_its_database(
    cases, release, tmp_path: Path
) -> None:
    from pipelines.agents import open_run

    first, second = sorted(cases)[:2]
    with open_run(release, tmp_path / "run", profile="forecast", agent="t") as run:
        run.start_case(first)
        run.call("get_history")
        run.end_case()
        with pytest.raises(AgentCaseError, match="no case is open"):
            run.call("get_history")
        run.start_case(second)
        assert run.call("list_assets").data["assets"]  # the database is still open
    with pytest.raises(duckdb.ConnectionException, match="closed"):
        run.con.execute("SELECT 1")
    run.close()  # closing again does nothing
    # nothing in this process holds the release open: it opens read-write
    duckdb.connect(str(release.duckdb_file)).close()
    assert [
        len(read_trajectory(tmp_path / "run" / "cases" / k / "trajectory.jsonl"))
        for k in (first, second)
    ] == [1, 1]


def test_a_run_that_cannot_be_opened_leaves_the_release_closed(release, tmp_path: Path) -> None:
    from pipelines.agents import open_run

    with pytest.raises(AgentCaseError, match="unknown tool profile") as caught:
        open_run(release, tmp_path / "run", profile="no-such-profile", agent="t")
    # the error is kept (as a server logging it would keep it, frames and all), yet the
    # connection opened for the run was closed with it: the release opens read-write
    duckdb.connect(str(release.duckdb_file)).close()
    assert caught.traceback


def test_strategies_by_hand() -> None:
    line = [float(v) for v in range(1, 11)]
    assert ar1_one_step(line) == pytest.approx(11.0)
    assert ewma([0.0, 10.0]) == pytest.approx(7.0)
    assert ewma([0.0, 10.0, 0.0]) == pytest.approx(0.3 * 7.0)
    flat = [5.0] * 10
    assert ar1_one_step(flat) == 5.0 and median_of_four(flat) == 5.0
    series = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 20.0, 10.0]
    est = four_estimates(series)
    assert est["most_recent"] == 10.0 and est["median_last_three"] == 10.0
    assert median_of_four(series) == float(np.median(list(est.values())))


def test_scores_and_tool_statistics_of_a_run(cases, release, tmp_path) -> None:
    with _run(cases, release, tmp_path / "scripted-x") as run:
        lst = sorted(k for k, c in cases.items() if c.target == "lst")
        for key in lst:
            run.start_case(key)
            values = run.call("get_history").data["values"]
            with pytest.raises(AgentCaseError):
                run.call("read_table", {"asset_id": "NOPE/table"})
            run.call(
                "submit_answer",
                {
                    "prediction": values[-1],
                    "unit": cases[key].unit,
                    "reason": "last",
                    "modalities_used": ["HEAT"],
                    "modules_used": ["get_history"],
                },
            )
    references = pq.read_table(ForecastFiles.published(release).references)
    runs, calls, scores = score_run(tmp_path / "scripted-x", references, replicates=200)
    assert runs.num_rows == references.num_rows
    assert sum(runs["submitted"].to_pylist()) == len(lst)
    assert set(runs["release"].to_pylist()) == {"t"}
    assert all(len(d) == 12 for d in runs["catalogue_digest"].to_pylist())
    assert calls.num_rows == 3 * len(lst)
    at = {(r["target"], r["metric"]): r for r in scores.to_pylist()}
    assert set(t for t, _ in at) == {"lst"}
    assert at[("lst", "tool_calls_per_case")]["value"] == 2.0  # the submission is not counted
    assert at[("lst", "failed_calls_per_case")]["value"] == 1.0
    ref = {r["case_key"]: r["reference"] for r in references.to_pylist()}
    errors = [abs(ref[k] - cases[k].history[-1]) for k in lst]
    assert at[("lst", "mae")]["value"] == pytest.approx(np.mean(errors), rel=1e-12)
