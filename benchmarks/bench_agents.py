"""Per-call latency of the forecasting tools over MCP against a direct DuckDB read.

Runs the scripted agent (``median_of_four``, analysis profile) over a real stdio MCP session on
a built release and times every tool call at the client (the round trip through the protocol
and the server) and inside the server (the trajectory's ``duration_ms``). The baseline, in the
same minutes: the same target-modality rows of each case read directly from the release's
``observations`` view on one open DuckDB connection. Medians and 95th percentiles go to a JSON
file with the command that made them.

    .venv/bin/python -m benchmarks.bench_agents --data /tmp/agents-data --release sample-0.1.0
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).parent / "results" / "agents_latency.json"


class TimedClient:
    """An MCP client whose every tool call is timed (seconds, by tool)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.times: dict[str, list[float]] = {}

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        start = time.perf_counter()
        result = await self.client.call_tool(name, arguments)
        self.times.setdefault(name, []).append(time.perf_counter() - start)
        return result


def _stats(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000.0
    return {
        "calls": len(ms),
        "median_ms": round(float(np.median(ms)), 3),
        "p95_ms": round(float(np.percentile(ms, 95)), 3),
    }


async def _agent(command: list[str], log: Path) -> dict[str, list[float]]:
    from mcp import Client, StdioServerParameters, stdio_client

    from pipelines.agents import scripted_agent

    params = StdioServerParameters(command=command[0], args=command[1:])
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            timed = TimedClient(client)
            await scripted_agent(timed, "median_of_four")
    return timed.times


def main(argv: list[str] | None = None) -> int:
    import anyio
    import duckdb

    from citycube.agents.cases import release_cases
    from citycube.agents.trajectory import read_trajectory
    from citycube.cube.release import Release
    from citycube.tasks.forecast import target
    from pipelines.agents import fresh_run_dir, runs_root, select_cases, server_command

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="data root of a built release with cases")
    p.add_argument("--release", required=True)
    p.add_argument("--series-per-target", type=int, default=2)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)

    data = Path(args.data).resolve()
    release = Release(data, args.release)
    run_dir = runs_root(data, release.version) / "bench-latency"
    fresh_run_dir(run_dir)
    command = server_command(
        data, release.version, run_dir, "analysis", "bench-latency", args.series_per_target
    )
    started = time.perf_counter()
    client_times = anyio.run(_agent, command, run_dir / "server.log")
    wall = time.perf_counter() - started

    server_times: dict[str, list[float]] = {}
    for path in sorted((run_dir / "cases").glob("*/trajectory.jsonl")):
        for line in read_trajectory(path):
            server_times.setdefault(line["tool"], []).append(line["duration_ms"] / 1000.0)

    cases = release_cases(release)
    _, keys = select_cases(release, args.series_per_target)
    direct: list[float] = []
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        for key in keys:
            case = cases[key]
            start = time.perf_counter()
            con.execute(
                "SELECT tile_id, year, field, value, unit FROM observations WHERE city = ? "
                "AND tile_id = ? AND modality = ? AND year BETWEEN ? AND ? "
                "ORDER BY field, year",
                [
                    case.city,
                    case.tile_id,
                    target(case.target).modality,
                    case.origin_year - 10,
                    case.origin_year - 1,
                ],
            ).fetchall()
            direct.append(time.perf_counter() - start)

    result = {
        "benchmark": "agents_latency",
        "command": "python -m benchmarks.bench_agents "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "release": release.version,
        "cases": len(keys),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_seconds": round(wall, 2),
        "client_round_trip": {tool: _stats(v) for tool, v in sorted(client_times.items())},
        "client_round_trip_all_tools": _stats([t for v in client_times.values() for t in v]),
        "in_server": {tool: _stats(v) for tool, v in sorted(server_times.items())},
        "direct_duckdb_read": _stats(direct),
        "note": (
            "client_round_trip: a call through MCP stdio as the agent sees it; in_server: the "
            "tool's own time (trajectory duration_ms); direct_duckdb_read: the target "
            "modality's rows of the same case read from the observations view, the data "
            "read_table returns"
        ),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    rt = result["client_round_trip"].get("read_table", {})
    print(json.dumps({"read_table": rt, "direct": result["direct_duckdb_read"]}, indent=2))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
