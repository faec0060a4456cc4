"""The forecasting cases over MCP: the server, the scripted baseline agent and the CLI.

The server (official ``mcp`` SDK) serves one :class:`citycube.agents.tools.AgentRun` over stdio
or streamable HTTP on loopback: ``list_cases`` and ``start_case`` open a case, the profile's
tools read it, ``submit_answer`` ends it. Tool logic lives in :mod:`citycube.agents`; this
module only wires it to the protocol, so any MCP client drives the same calls the tests drive.

The scripted agent (no language model) is an MCP client: it starts the server as a subprocess
(stdio), solves every case with one rule (``last_year``, ``ten_year_mean`` or
``median_of_four``) through the tools, and leaves a run folder the scorer reads.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from citycube.agents.cases import Case, release_cases
from citycube.agents.session import validate_run_name
from citycube.agents.tools import PROFILES, AgentRun
from citycube.errors import AgentCaseError, CityCubeError, WorkspacePathError
from pipelines.agent_tasks.cube_tools import (
    CubeToolDocs,
    add_case_tools,
    add_cube_tools,
    add_tools,
    new_server,
    result_text,
)
from pipelines.ports import LOOPBACK

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from citycube.cube.release import Release

INSTRUCTIONS = (
    "Predict the requested annual value for one 2 km x 2 km tile at period 0, using the "
    "supplied ten-year history (periods -10 to -1). Call list_cases, then start_case with a "
    "case key: its message gives the target, unit and spatial aggregation. Calendar years are "
    "hidden; no target-period observations are supplied. Use get_history for the target history "
    "and list_assets to discover available modalities; read_table for numerical properties, "
    "describe_raster for bands and statistics, view_raster for image previews, and "
    "materialize_asset when an analysis tool needs a local asset path. Every result carries a "
    "citable evidence_id. Answer with submit_answer: prediction (number), unit, reason, "
    "modalities_used and modules_used; list only sources and tools actually used. A valid "
    "submission ends the case."
)
"""The server's instructions: AgenticCity-Bench App. D's forecasting prompt, with the case
tools added."""

FORECAST = "forecast"
"""The forecasting task (this module's own server and scripted agent)."""
PLANNING_TASKS: tuple[str, ...] = ("ev_charging", "school_capacity", "food_access")
"""Planning and resource tasks (AgenticCity-Bench App. D.1, D.3.1), each a module of
:mod:`pipelines.agent_tasks` with ``STRATEGIES``, ``open_run``, ``build_server``,
``scripted_agent``, ``score_runs``, ``case_count`` and ``SCORE_TABLE`` (the name of its
published scores, which ``agents show`` prints)."""
TASKS = (FORECAST, *PLANNING_TASKS)
"""Every task an agent can be served."""
CUBE_TOOL_DOCS = CubeToolDocs(
    list_assets="Table and raster assets of the open case, with fields, units and periods.",
    read_table="Rows of a table asset (default: the case's tile, every field and period).",
    view_raster="A PNG preview of a raster asset at a period (fixed colours; invalid transparent).",
)
"""What the forecasting server's clients read of the cube-asset tools."""


def planning_task(name: str) -> Any:
    """The module of a planning task, or a clear error."""
    import importlib

    if name not in PLANNING_TASKS:
        raise AgentCaseError(f"unknown agent task {name!r}: one of {', '.join(TASKS)}")
    return importlib.import_module(f"pipelines.agent_tasks.{name}")


def select_cases(release: Release, series_per_target: int | None) -> tuple[dict[str, Case], list]:
    """The release's cases, and the keys a run may open: all, or per target the cases of its
    first ``series_per_target`` selected series (the selection order of App. D)."""
    from citycube.tasks.forecast import ForecastFiles

    cases = release_cases(release)
    if not series_per_target:
        return cases, sorted(cases)
    refs = pq.read_table(
        ForecastFiles.published(release).references, columns=["case_key", "series_order"]
    )
    keys = [
        k for k, order in zip(*refs.to_pydict().values(), strict=True) if order < series_per_target
    ]
    return cases, sorted(keys)


def open_run(
    release: Release,
    run_dir: Path,
    *,
    profile: str,
    agent: str,
    series_per_target: int | None = None,
) -> AgentRun:
    """An :class:`AgentRun` over the published release, writing into ``run_dir``."""
    import duckdb

    from citycube.catalogue.modalities import load_catalogue

    if not release.duckdb_file.exists():
        raise AgentCaseError(
            f"no published cube at {release.duckdb_file}: build a release first (make run)"
        )
    validate_run_name(run_dir.name)
    cases, allowed = select_cases(release, series_per_target)
    con = duckdb.connect(str(release.duckdb_file), read_only=True)
    try:
        return AgentRun(
            con,
            cases,
            load_catalogue(),
            release.root,
            run_dir,
            profile=profile,
            agent=agent,
            allowed=allowed,
        )
    except BaseException:  # the run owns the connection only once it exists
        con.close()
        raise


def build_server(run: AgentRun) -> MCPServer:
    """An MCP server whose tools are the run's (the profile's tools and the case tools)."""
    server = new_server("citycube-forecasting", INSTRUCTIONS)
    tools = PROFILES[run.profile]

    def get_history() -> str:
        """The target's values at periods -10..-1 of the open case."""
        return result_text(run.call("get_history"))

    def materialize_asset(
        asset_id: str,
        name: str | None = None,
        period: int | None = None,
        tiles: list[str] | None = None,
    ) -> str:
        """Write an asset into the case workspace (table: CSV; raster: .npy, NaN = invalid)."""
        args: dict[str, Any] = {"asset_id": asset_id}
        given = (("name", name), ("period", period), ("tiles", tiles))
        args |= {k: v for k, v in given if v is not None}
        return result_text(run.call("materialize_asset", args))

    def submit_answer(
        prediction: float,
        unit: str,
        reason: str,
        modalities_used: list[str],
        modules_used: list[str],
    ) -> str:
        """Submit the answer; a valid one ends the case."""
        args = {
            "prediction": prediction,
            "unit": unit,
            "reason": reason,
            "modalities_used": modalities_used,
            "modules_used": modules_used,
        }
        return result_text(run.call("submit_answer", args))

    def trend_estimate(values: list[float], periods: list[int] | None = None) -> str:
        """Least-squares and Sen's slope, Mann-Kendall statistic of a series."""
        args: dict[str, Any] = {"values": values}
        return result_text(
            run.call("trend_estimate", args | ({"periods": periods} if periods else {}))
        )

    def summary_statistics(values: list[float]) -> str:
        """Count, mean, standard deviation, quantiles and skewness of a series."""
        return result_text(run.call("summary_statistics", {"values": values}))

    def time_series_diagnostics(values: list[float]) -> str:
        """Lag-1 autocorrelation, differences, AR(1) forecast and four local estimates."""
        return result_text(run.call("time_series_diagnostics", {"values": values}))

    add_case_tools(
        server,
        run,
        "Keys of the cases this server serves (opaque: they name no year).",
        "Open a case and return its message (target, unit, aggregation, tile, window).",
    )
    add_tools(server, get_history, only=tools)
    add_cube_tools(server, run, CUBE_TOOL_DOCS, only=tools)
    add_tools(
        server,
        materialize_asset,
        submit_answer,
        trend_estimate,
        summary_statistics,
        time_series_diagnostics,
        only=tools,
    )
    return server


def serve(
    run: AgentRun, transport: str = "stdio", port: int = 8765, server: MCPServer | None = None
) -> None:
    """Serve a run (through ``server``, by default the forecasting one) until the client
    disconnects (stdio) or the process is stopped (HTTP)."""
    server = build_server(run) if server is None else server
    try:
        if transport == "stdio":
            server.run("stdio")
        elif transport == "http":
            server.run("streamable-http", host=LOOPBACK, port=port)
        else:
            raise AgentCaseError(f"unknown transport {transport!r}: stdio or http")
    finally:
        run.close()


# ------------------------------------------------------------------------------ scripted agent


def result_json(result: Any) -> dict[str, Any]:
    """The JSON object of a tool result's first text block (an error's message raised)."""
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    if result.is_error:
        raise AgentCaseError(f"tool error: {texts[0] if texts else result}")
    return json.loads(texts[0])


def server_command(
    data: Path,
    release: str,
    run_dir: Path,
    profile: str,
    agent: str,
    series: int | None,
    task: str = FORECAST,
) -> list[str]:
    """The command that serves a run over stdio (what an MCP client's config names)."""
    cmd = [sys.executable, "-m", "pipelines.cli", "--data", str(data), "--release", release]
    cmd += ["agents", "serve", "--task", task, "--run", str(run_dir), "--agent", agent]
    cmd += ["--profile", profile]
    if series:
        cmd += ["--series-per-target", str(series)]
    return cmd


async def scripted_agent(client: Any, strategy: str, *, explore: bool = True) -> int:
    """Solve every case the connected server offers with one rule; the number answered.

    Per case: the case message, the target history, the asset list, the target tile's table
    of the target's modality, a raster's description and preview (``explore``), and, with
    ``median_of_four``, the server's time-series diagnostics, whose four local estimates it
    takes the median of. It then submits, citing only tools it called.
    """
    import numpy as np

    from citycube.agents.strategies import STRATEGIES
    from citycube.tasks.forecast import target as forecast_target

    if strategy not in STRATEGIES:
        raise AgentCaseError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    keys = result_json(await client.call_tool("list_cases", {}))["cases"]
    answered = 0
    for key in keys:
        message = result_json(await client.call_tool("start_case", {"case_key": key}))
        used = ["get_history"]
        history = result_json(await client.call_tool("get_history", {}))
        values = [float(v) for v in history["values"]]
        modality = forecast_target(message["target"]).modality
        if explore:
            assets = result_json(await client.call_tool("list_assets", {}))["assets"]
            await client.call_tool("read_table", {"asset_id": f"{modality}/table"})
            used += ["list_assets", "read_table"]
            rasters = [a for a in assets if a["kind"] == "raster" and a["periods_available"]]
            if rasters:
                raster = rasters[0]
                args = {"asset_id": raster["asset_id"], "period": raster["periods_available"][-1]}
                await client.call_tool("describe_raster", args)
                await client.call_tool("view_raster", args)
                used += ["describe_raster", "view_raster"]
        if strategy == "median_of_four":
            diag = result_json(
                await client.call_tool("time_series_diagnostics", {"values": values})
            )
            estimates = diag["local_estimates"]
            prediction = float(np.median(np.asarray(list(estimates.values()))))
            used.append("time_series_diagnostics")
            reason = f"median of the four local estimates {estimates}"
        else:
            prediction = STRATEGIES[strategy](values)
            reason = f"{strategy} rule on the ten supplied values"
        result = await client.call_tool(
            "submit_answer",
            {
                "prediction": prediction,
                "unit": message["unit"],
                "reason": reason,
                "modalities_used": [modality],
                "modules_used": used,
            },
        )
        result_json(result)
        answered += 1
    return answered


async def run_scripted(
    command: Sequence[str],
    strategy: str,
    log: Path,
    *,
    explore: bool = True,
    agent: Callable[[Any, str], Awaitable[int]] | None = None,
) -> int:
    """Start the server command as a subprocess and run a scripted agent over stdio (``agent``,
    by default the forecasting one); the server's own messages (stderr) go to ``log``."""
    from mcp import Client, StdioServerParameters, stdio_client

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=env)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=600) as client:
            if agent is not None:
                return await agent(client, strategy)
            return await scripted_agent(client, strategy, explore=explore)


# ------------------------------------------------------------------------------ command line


def runs_root(data: Path, release: str) -> Path:
    """Where agent runs of a release are written: inside the data root."""
    return data / "agent_runs" / release


def score_runs(release: Release, run_dirs: Sequence[Path]) -> dict[str, pa.Table]:
    """``agent_runs``, ``agent_tool_calls`` and ``agent_scores`` of some run folders."""
    from citycube.agents.scoring import (
        AGENT_SCORE_SCHEMA,
        CALL_SCHEMA,
        RUN_SCHEMA,
        concat,
        score_run,
    )
    from citycube.tasks.forecast import ForecastFiles

    references = pq.read_table(ForecastFiles.published(release).references)
    runs, calls, scores = [], [], []
    for run_dir in run_dirs:
        r, c, s = score_run(run_dir, references)
        runs.append(r)
        calls.append(c)
        scores.append(s)
    return {
        "agent_runs": concat(runs, RUN_SCHEMA),
        "agent_tool_calls": concat(calls, CALL_SCHEMA),
        "agent_scores": concat(scores, AGENT_SCORE_SCHEMA),
    }


def scores_text(scores: pa.Table) -> str:
    """The headline metrics and call counts of each run, as a small table."""
    from citycube.tasks.forecast import TARGETS

    rows = scores.to_pylist()
    at = {(r["run"], r["target"], r["group"], r["metric"]): r for r in rows}
    lines = ["| run | " + " | ".join(f"{t.name} {t.headline.upper()}" for t in TARGETS)]
    lines[0] += " | calls/case |"
    lines.append("|---" * (len(TARGETS) + 2) + "|")
    for run in dict.fromkeys(r["run"] for r in rows):
        cells = []
        for t in TARGETS:
            r = at.get((run, t.name, "all", t.headline))
            cells.append("–" if r is None else f"{r['value']:,.3f} ({r['submitted']} cases)")
        calls = [
            r["value"] for r in rows if r["run"] == run and r["metric"] == "tool_calls_per_case"
        ]
        cells.append(f"{sum(calls) / len(calls):.1f}" if calls else "–")
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _release(args: Any) -> Release:
    from citycube.cube.release import Release

    return Release(Path(args.data).resolve(), args.release)


def _run_dir(args: Any, name: str) -> Path:
    return runs_root(Path(args.data).resolve(), args.release) / validate_run_name(name)


def cmd_serve(args: Any) -> int:
    """``citycube agents serve``: serve the cases over stdio or HTTP (loopback)."""
    release = _release(args)
    run_dir = Path(args.run).resolve() if args.run else _run_dir(args, args.agent)
    root = runs_root(Path(args.data).resolve(), args.release)
    if not run_dir.is_relative_to(root) or run_dir.parent != root:
        raise WorkspacePathError(
            f"run folder {run_dir} is not a folder of {root}: runs are written inside the data "
            "root; give --agent NAME instead"
        )
    server = None
    if args.task == FORECAST:
        run = open_run(
            release,
            run_dir,
            profile=args.profile,
            agent=args.agent,
            series_per_target=args.series_per_target,
        )
    else:
        module = planning_task(args.task)
        run = module.open_run(release, run_dir, agent=args.agent)
        server = module.build_server(run)
    if args.transport == "http":
        print(
            f"serving {len(run.case_keys())} cases on http://{LOOPBACK}:{args.port}/mcp; "
            f"trajectories in {run_dir}",
            file=sys.stderr,
        )
    serve(run, args.transport, args.port, server)
    return 0


def fresh_run_dir(run_dir: Path) -> None:
    """Empty a previous run's folder (only one that is a run: it has run.json)."""
    import shutil

    if run_dir.exists():
        if not (run_dir / "run.json").exists():
            raise AgentCaseError(
                f"{run_dir} exists and is not an agent run: choose another run name"
            )
        shutil.rmtree(run_dir)


def run_strategies(
    data: Path,
    release: Release,
    strategies: Sequence[str],
    *,
    series_per_target: int | None = None,
    profile: str = "analysis",
    task: str = FORECAST,
) -> list[Path]:
    """Run the scripted agent once per strategy, each through its own stdio MCP session with
    a server subprocess; the run folders (``scripted-<strategy>`` for forecasting,
    ``<task>-scripted-<strategy>`` otherwise; replaced if present)."""
    import anyio

    if not release.duckdb_file.exists():
        raise AgentCaseError(
            f"no published cube at {release.duckdb_file}: build a release with {task} "
            "cases first (make agents builds one)"
        )
    agent = None
    if task == FORECAST:
        select_cases(release, series_per_target)  # fails clearly when there are none
    else:
        agent = planning_task(task).scripted_agent
    sessions = []
    for strategy in strategies:
        name = f"scripted-{strategy}" if task == FORECAST else f"{task}-scripted-{strategy}"
        run_dir = runs_root(data, release.version) / name
        fresh_run_dir(run_dir)
        command = server_command(
            data, release.version, run_dir, profile, name, series_per_target, task
        )
        sessions.append((strategy, name, run_dir, command))
    failures: list[BaseException | None] = [None] * len(sessions)

    async def run_one(index: int, strategy: str, run_dir: Path, command: list[str]) -> None:
        try:
            await run_scripted(command, strategy, run_dir / "server.log", agent=agent)
        except Exception as exc:  # reported below, in the strategies' order
            failures[index] = exc

    async def run_all() -> None:
        # Side by side: each session is a server process of its own, which spends most of its
        # time loading its imports; the sessions share nothing but the read-only database.
        async with anyio.create_task_group() as group:
            for index, (strategy, _, run_dir, command) in enumerate(sessions):
                group.start_soon(run_one, index, strategy, run_dir, command)

    anyio.run(run_all)
    for (_, name, run_dir, _), exc in zip(sessions, failures, strict=True):
        if isinstance(exc, CityCubeError):
            raise exc
        if exc is not None:  # the session broke: the server's log says why
            log = run_dir / "server.log"
            tail = log.read_text(encoding="utf-8")[-2000:] if log.exists() else ""
            raise AgentCaseError(
                f"the MCP session of {name} ended abnormally ({type(exc).__name__}); the "
                f"server's log {log} ends with:\n{tail}"
            ) from None
    return [run_dir for _, _, run_dir, _ in sessions]


def cmd_run(args: Any) -> int:
    """``citycube agents run``: the scripted agent over MCP (stdio), then the scores."""
    from citycube.agents.strategies import STRATEGIES
    from citycube.agents.views import publish_agent_tables, write_agent_tables

    release = _release(args)
    data = Path(args.data).resolve()
    if args.task != FORECAST:
        return _run_planning(args, release, data)
    if args.strategy != "all" and args.strategy not in STRATEGIES:
        raise AgentCaseError(
            f"unknown strategy {args.strategy!r} for {FORECAST}: all, {', '.join(STRATEGIES)}"
        )
    strategies = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
    run_dirs = run_strategies(
        data,
        release,
        strategies,
        series_per_target=args.series_per_target,
        profile=args.profile,
    )
    tables = score_runs(release, run_dirs)
    for run_dir, table in zip(run_dirs, _per_run(tables["agent_runs"], run_dirs), strict=True):
        print(f"{run_dir.name}: {table} cases answered over MCP (stdio)")
    print()
    print(scores_text(tables["agent_scores"]))
    print()
    print("trajectories: " + ", ".join(str(d / "cases") for d in run_dirs))
    if args.publish:
        views = publish_agent_tables(release, tables)
        print(f"views {', '.join(views)} in {release.duckdb_file}")
    else:
        paths = write_agent_tables(runs_root(data, release.version) / "tables", tables)
        print("tables: " + ", ".join(str(p) for p in paths.values()))
    return 0


def _run_planning(args: Any, release: Release, data: Path) -> int:
    """``citycube agents run --task <planning task>``: its scripted rules, then its scores."""
    from citycube.io.atomic import atomic_path

    module = planning_task(args.task)
    known = tuple(module.STRATEGIES)
    if args.strategy != "all" and args.strategy not in known:
        raise AgentCaseError(
            f"unknown strategy {args.strategy!r} for {args.task}: all, {', '.join(known)}"
        )
    strategies = list(known) if args.strategy == "all" else [args.strategy]
    run_dirs = run_strategies(data, release, strategies, task=args.task)
    tables = module.score_runs(release, run_dirs)
    folder = runs_root(data, release.version) / "tables" / args.task
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        print(f"{args.task} {name}:")
        print(table.to_pandas().to_string(index=False))
        print()
        with atomic_path(folder / f"{name}.parquet") as tmp:
            pq.write_table(table, tmp)
    print("trajectories: " + ", ".join(str(d / "cases") for d in run_dirs))
    print(f"tables: {folder}")
    return 0


def _per_run(runs: pa.Table, run_dirs: Sequence[Path]) -> list[int]:
    rows = runs.to_pylist()
    return [sum(1 for r in rows if r["run"] == d.name and r["submitted"]) for d in run_dirs]


def planning_score_tables() -> list[str]:
    """The score table each planning task publishes, in task order."""
    return [planning_task(task).SCORE_TABLE for task in PLANNING_TASKS]


def cmd_show(args: Any) -> int:
    """``citycube agents show``: the scores in the release's agent views, and the runs."""
    import duckdb

    release = _release(args)
    if not release.duckdb_file.exists():
        raise AgentCaseError(f"no published cube at {release.duckdb_file}: build it first")
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        names = "SELECT view_name FROM duckdb_views() UNION SELECT table_name FROM duckdb_tables()"
        have = {name for (name,) in con.execute(names).fetchall()}
        planning = sorted(v for v in planning_score_tables() if v in have)
        if "agent_scores" not in have and not planning:
            raise AgentCaseError(
                f"{release.duckdb_file} has no agent views: build a scope with forecasting "
                "cases (make agents) or run `citycube agents run --publish`"
            )
        scores = runs = None
        if "agent_scores" in have:
            scores = con.execute("SELECT * FROM agent_scores").to_arrow_table()
            runs = con.execute(
                "SELECT run, count(*) FILTER (WHERE submitted) AS answered FROM agent_runs "
                "GROUP BY run ORDER BY run"
            ).fetchall()
        planning_scores = [
            (v, con.execute(f'SELECT * FROM "{v}"').to_arrow_table()) for v in planning
        ]
    if scores is not None and runs is not None:
        print(scores_text(scores))
        print()
        root = runs_root(Path(args.data).resolve(), release.version)
        for run, answered in runs:
            print(f"{run}: {answered} cases answered; trajectories in {root / run / 'cases'}")
        print(f"views agent_runs, agent_tool_calls, agent_scores in {release.duckdb_file}")
    for view, table in planning_scores:
        print()
        print(f"{view}:")
        print(table.to_pandas().to_string(index=False))
    return 0


def cmd_score(args: Any) -> int:
    """``citycube agents score``: score run folders and print the headline metrics."""
    release = _release(args)
    run_dirs = [Path(r).resolve() for r in args.runs]
    if args.task != FORECAST:
        for name, table in planning_task(args.task).score_runs(release, run_dirs).items():
            print(f"{args.task} {name}:")
            print(table.to_pandas().to_string(index=False))
            print()
        return 0
    tables = score_runs(release, run_dirs)
    print(scores_text(tables["agent_scores"]))
    if args.out:
        from citycube.agents.views import write_agent_tables

        for path in write_agent_tables(Path(args.out), tables).values():
            print(f"written: {path}")
    if args.publish:
        from citycube.agents.views import publish_agent_tables

        views = publish_agent_tables(release, tables)
        print(f"views {', '.join(views)} in {release.duckdb_file}")
    return 0


def add_parser(sub: Any) -> None:
    """The ``agents`` subcommand and its actions."""
    ag = sub.add_parser(
        "agents",
        help="serve the forecasting cases to agents over MCP, run the scripted agent, score runs",
        description=(
            "Forecasting cases as MCP tools (AgenticCity-Bench App. D): periods -10..-1 of the "
            "case's city, calendar years hidden, every call logged with an evidence id. "
            "`serve` serves them to any MCP client (stdio, or streamable HTTP on 127.0.0.1); "
            "`run` runs the scripted baseline agent through a real MCP session and scores it; "
            "`score` scores run folders."
        ),
    )
    acts = ag.add_subparsers(dest="agents_command", required=True)
    common = [
        (
            ("--task",),
            {
                "choices": list(TASKS),
                "default": FORECAST,
                "help": "which cases: forecasting, or a planning / resource task",
            },
        ),
        (
            ("--profile",),
            {"choices": list(PROFILES), "default": "analysis", "help": "tool profile"},
        ),
        (
            ("--series-per-target",),
            {
                "type": int,
                "default": None,
                "metavar": "N",
                "help": "serve only the cases of each target's first N series (5 cases each)",
            },
        ),
    ]
    sv = acts.add_parser("serve", help="serve the cases over MCP")
    sv.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    sv.add_argument("--port", type=int, default=8765, help="HTTP port on 127.0.0.1")
    sv.add_argument("--agent", default="agent", help="run name (folder under agent_runs/)")
    sv.add_argument("--run", help="run folder (default <data>/agent_runs/<release>/<agent>)")
    rn = acts.add_parser("run", help="run the scripted agent over MCP and print its scores")
    rn.add_argument(
        "--strategy",
        default="all",
        help="the scripted agent's rule (a baseline of the task), or all; forecasting: "
        "last_year, ten_year_mean, median_of_four",
    )
    for p in (sv, rn):
        for flags, kwargs in common:
            p.add_argument(*flags, **kwargs)
    rn.add_argument(
        "--publish",
        action="store_true",
        help="add the tables to the release (agents/*.parquet and views in cube.duckdb)",
    )
    sh = acts.add_parser("show", help="print the scores in the release's agent views")
    sh.set_defaults(func=cmd_show)
    sc = acts.add_parser("score", help="score run folders")
    sc.add_argument("runs", nargs="+", help="run folders")
    sc.add_argument("--task", choices=list(TASKS), default=FORECAST, help="the runs' task")
    sc.add_argument("--out", help="folder to write agent_*.parquet into")
    sc.add_argument("--publish", action="store_true", help="add the tables to the release")
    sv.set_defaults(func=cmd_serve)
    rn.set_defaults(func=cmd_run)
    sc.set_defaults(func=cmd_score)
