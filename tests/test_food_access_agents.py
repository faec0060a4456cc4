"""The food-access cases in a published release and their seven tools: views with counts, the
evidence cut-off, submission checks, and the scripted agent over a real MCP session equal to
the direct baselines."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest
from mcp import Client

from citycube.agents.food_access import evaluate
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import build_duckdb, publish_database, release_metadata
from citycube.errors import AgentCaseError, FoodAccessSubmissionError
from citycube.tasks.food_access import CELLS, LABELS, FoodAccessFiles, write_food_access_cases
from citycube.tasks.views import stage_views
from pipelines.agent_tasks.food_access import (
    STRATEGIES,
    build_server,
    open_run,
    score_runs,
    scripted_agent,
)
from sources.sample.food_access import SampleFoodAtlas
from sources.usda_food_atlas import read_item
from tests.agent_fixtures import FUTURE_MARK, make_agent_release

CAT = load_catalogue()


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory):
    """The agent tests' Boston release, built again with the food-access cases of the default
    scope (Amsterdam + Boston) from the sample twin, as a build does."""
    root = tmp_path_factory.mktemp("food_agents")
    release = make_agent_release(root)
    SampleFoodAtlas(0).install("Boston", root / "food" / "Boston")
    tracts = {"Boston": read_item(root / "food" / "Boston")}
    meta = release_metadata(release, source_set="test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    unavailable = {"Amsterdam": "not a US city: the Food Access Research Atlas covers US tracts"}
    write_food_access_cases(release, tracts, ["Amsterdam", "Boston"], unavailable)
    stage_views(release, CAT)
    publish_database(release, meta)
    return release


def test_the_case_set_is_published_as_views_with_counts_and_no_labels(release) -> None:
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        counts = con.execute(
            "SELECT city, sum(selected), sum(wanted), max(reason) FROM food_access_counts "
            "GROUP BY city ORDER BY city"
        ).fetchall()
        columns = [
            c
            for (c,) in con.execute(
                "SELECT name FROM pragma_table_info('food_access_cases')"
            ).fetchall()
        ]
        strata = dict(
            con.execute(
                "SELECT stratum, count(DISTINCT case_id) FROM food_access_reference "
                "GROUP BY stratum"
            ).fetchall()
        )
        cells = con.execute("SELECT count(*) FROM food_access_reference").fetchone()[0]
    by_city = {c: (s, w, r) for c, s, w, r in counts}
    assert by_city["Boston"][:2] == (38, 38)
    assert by_city["Amsterdam"] == (
        0,
        0,
        "not a US city: the Food Access Research Atlas covers US tracts",
    )
    assert by_city["DC"][0] == 0 and by_city["DC"][2] == "city not in this build's scope"
    assert strata == {"all": 12, "mixed": 14, "none": 12}
    assert cells == 4 * 38
    assert set(columns) == {"case_id", "city", "tile_id", "scale", "cutoff"}


def test_no_tool_serves_evidence_from_the_cut_off_on(release, tmp_path: Path) -> None:
    run = open_run(release, tmp_path / "leak", agent="probe")
    try:
        run.start_case(run.case_keys()[0])
        assets = {a["asset_id"]: a for a in run.call("list_reference_assets").data["assets"]}
        assert assets["OPT/raster"]["years"] == [2018, 2019]
        assert max(assets["HEAT/table"]["years"]) == 2019
        # POP from 2015 on is served by its 2020 epoch: never shown.
        assert max(assets["POP/table"]["years"]) == 2014
        rows = run.call("inspect_table", {"asset_id": "POP/table"}).data["rows"]
        assert rows and all(r["value"] != FUTURE_MARK for r in rows)
        heat = run.call("inspect_table", {"asset_id": "HEAT/table", "years": [2019, 2020]})
        assert [r["year"] for r in heat.data["rows"]] == [2019]
        with pytest.raises(AgentCaseError, match="before the evidence cut-off"):
            run.call("get_cell_summaries", {"asset_id": "OPT/raster", "year": 2020})
        cells = run.call("get_cell_summaries", {"asset_id": "OPT/raster", "year": 2019})
        assert set(cells.data["cells"]) == set(CELLS)
        assert cells.data["cells"]["s00"]["bands"][0]["mean"] == 19.0
    finally:
        run.close()


def _predictions(evidence: list[str], label: str = LABELS[0]) -> dict:
    return {
        c: {"label": label, "confidence": 0.7, "reason": "r", "evidence": evidence} for c in CELLS
    }


def test_a_submission_needs_every_cell_a_label_and_cited_inspections(
    release, tmp_path: Path
) -> None:
    run = open_run(release, tmp_path / "submit", agent="probe")
    try:
        case = run.case_keys()[0]
        run.start_case(case)
        listed = run.call("list_reference_assets").data["evidence_id"]
        seen = run.call("describe_raster", {"asset_id": "OPT/raster", "year": 2019})
        cite = f"{seen.data['evidence_id']}/OPT/raster: mean 19"
        bad = [
            ({"predictions": _predictions([cite], "food_desert"), "limitations": "x"}, "label"),
            ({"predictions": {"s00": _predictions([cite])["s00"]}, "limitations": "x"}, "exactly"),
            (
                {"predictions": _predictions([f"{listed}/OPT/raster: listed"]), "limitations": "x"},
                "not a successful inspection",
            ),
            (
                {
                    "predictions": _predictions([f"{seen.data['evidence_id']}/HEAT/table: x"]),
                    "limitations": "x",
                },
                "not a successful inspection",
            ),
            (
                {"predictions": _predictions(["OPT/raster looked green"]), "limitations": "x"},
                "form evidence-NNNN",
            ),
            ({"predictions": _predictions([]), "limitations": "x"}, "at least one"),
            ({"predictions": _predictions([cite]), "limitations": ""}, "limitations"),
        ]
        for args, words in bad:
            with pytest.raises(FoodAccessSubmissionError, match=words):
                run.call("submit_predictions", args)
        done = run.call(
            "submit_predictions",
            {"predictions": _predictions([cite]), "limitations": "no supermarket data"},
        )
        assert done.data["case_ended"]
        with pytest.raises(AgentCaseError, match="ended"):
            run.call("calculate", {"expression": "1+1"})
        saved = json.loads((tmp_path / "submit" / "cases" / case / "submission.json").read_text())
        assert saved["predictions"]["s11"]["label"] == LABELS[0]
    finally:
        run.close()


def test_calculate_evaluates_arithmetic_and_nothing_else() -> None:
    assert evaluate("(2 + 3) * 4 / mean(1, 3)") == 10.0
    for expression in ("__import__('os').getcwd()", "open('x')", "2 ** 1000", "1 / 0"):
        with pytest.raises(AgentCaseError, match="calculate"):
            evaluate(expression)


def test_the_scripted_agent_over_mcp_reproduces_the_direct_baselines(
    release, tmp_path: Path
) -> None:
    direct = pq.read_table(FoodAccessFiles.published(release).scores).to_pandas()
    direct = direct.set_index("baseline")
    run_dirs = []
    for strategy in STRATEGIES:
        run = open_run(release, tmp_path / strategy, agent=f"scripted-{strategy}")

        async def session(run=run, strategy=strategy) -> int:
            async with Client(build_server(run)) as client:
                return await scripted_agent(client, strategy)

        try:
            assert anyio.run(session) == 38
        finally:
            run.close()
        run_dirs.append(tmp_path / strategy)
    scores = score_runs(release, run_dirs)["food_access_agent_scores"].to_pandas()
    metrics = [
        "cell_accuracy",
        "macro_f1",
        "exact_case_accuracy",
        *[f"recall_{c}" for c in LABELS],
        "n_cells",
        "n_cases",
    ]
    for row in scores.itertuples():
        baseline = direct.loc[row.run]
        for metric in metrics:
            got, want = getattr(row, metric), baseline[metric]
            assert (pd.isna(got) and pd.isna(want)) or got == want, (row.run, metric)
        assert row.n_submitted == 38 and row.mean_calls == 3.0
    assert int(direct["majority"].sum()) == 1


def test_the_cli_serves_the_task_over_stdio_and_publishes_its_scores(
    release, tmp_path: Path, capsys
) -> None:
    """`citycube agents run --task food_access` path: a server subprocess per rule (stdio), the
    runs' scores equal the direct baseline's, published as a view that `agents show` prints."""
    from citycube.agents.views import publish_task_tables
    from pipelines.agents import run_strategies, runs_root
    from pipelines.cli import main

    with open_run(release, tmp_path / "ended", agent="ended") as ended:
        ended.start_case(ended.case_keys()[0])
    strategy = STRATEGIES[0]
    # Sessions run side by side: one that breaks (a rule the agent does not know) is named,
    # and the other's run is complete all the same.
    with pytest.raises(AgentCaseError, match="session of food_access-scripted-no_such_rule"):
        run_strategies(release.data_root, release, ["no_such_rule", strategy], task="food_access")
    run_dirs = [runs_root(release.data_root, release.version) / f"food_access-scripted-{strategy}"]
    scores = score_runs(release, run_dirs)
    row = scores["food_access_agent_scores"].to_pylist()[0]
    direct = pq.read_table(FoodAccessFiles.published(release).scores).to_pandas()
    want = direct.set_index("baseline").loc[strategy]
    assert row["n_submitted"] == 38
    assert row["cell_accuracy"] == want["cell_accuracy"]
    assert publish_task_tables(release, "food_access", scores) == ["food_access_agent_scores"]

    # in this process, with a run still referenced: an ended run holds no database open, so
    # `agents show` opens the database just published, not the one the run read
    assert ended.session is None
    args = ["--data", str(release.data_root), "--release", release.version, "agents", "show"]
    assert main(args) == 0
    shown = capsys.readouterr().out
    assert "food_access_agent_scores:" in shown and f"food_access-scripted-{strategy}" in shown
