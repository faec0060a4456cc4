"""Command line: build a release through Dagster, rebuild views, print summaries, render.

``make run`` calls ``citycube build``; see ``citycube --help``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import (
    FIRST_COMPLETED,
    Executor,
    Future,
    ProcessPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from functools import partial
from pathlib import Path

DEFAULT_CITIES = ("Amsterdam", "Boston")
DEFAULT_YEARS = (2020, 2024, 2025)
BUILD_ENV = "CITYCUBE_BUILD_ID"
BUILD_TAG = "citycube/build"
"""Every Dagster run of one `citycube build` carries its id, so runs it kills can be found."""
# Dagster's console logger prints every event at DEBUG; the CLI prints its own progress lines.
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _parse_cities(text: str) -> list[str]:
    from citycube.cities import get_city, load_cities

    text = text.strip()
    if text in ("", "default"):
        return list(DEFAULT_CITIES)
    if text == "all":
        return list(load_cities())
    return [get_city(c.strip()).key for c in text.split(",") if c.strip()]


def _parse_years(text: str) -> list[int]:
    from citycube.temporal import parse_years

    text = text.strip()
    if text in ("", "default"):
        return list(DEFAULT_YEARS)
    return parse_years(text)


def _env_defaults(args: argparse.Namespace) -> None:
    os.environ["CITYCUBE_DATA"] = str(Path(args.data).resolve())
    os.environ["CITYCUBE_RELEASE"] = args.release
    home = Path(os.environ.get("DAGSTER_HOME", ".dagster_home")).resolve()
    os.environ["DAGSTER_HOME"] = str(home)
    ensure_dagster_home(home)


def ensure_dagster_home(home: Path) -> Path:
    """Create DAGSTER_HOME with telemetry off, so the UI and runs work offline."""
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    return home


def summary_text(duckdb_file: Path) -> str:
    """A short DuckDB summary of a release: tiles, availability, fields."""
    import duckdb

    con = duckdb.connect(str(duckdb_file), read_only=True)
    try:
        out = [f"release database: {duckdb_file}"]
        tiles = con.execute("SELECT scale, count(*) FROM tiles GROUP BY 1 ORDER BY 1").fetchall()
        out.append("tiles: " + ", ".join(f"{s}={n}" for s, n in tiles))
        rel = dict(con.execute("SELECT key, value FROM release").fetchall())
        out.append(f"version {rel.get('version')}  synthetic={rel.get('synthetic')}")
        rows = con.execute(
            """
            SELECT modality, city, count(DISTINCT year) AS years,
                   count(*) FILTER (WHERE available) AS available_rows, count(*) AS rows,
                   string_agg(DISTINCT reason, ', ') FILTER (WHERE reason IS NOT NULL) AS reasons
            FROM observations GROUP BY ALL ORDER BY modality, city
            """
        ).fetchall()
        out.append(f"{'modality':<9}{'city':<14}{'years':>6}{'available':>12}{'rows':>8}  reasons")
        for m, c, y, a, n, r in rows:
            out.append(f"{m:<9}{c:<14}{y:>6}{a:>12}{n:>8}  {r or '-'}")
        return "\n".join(out)
    finally:
        con.close()


def _materialize(selection_names: Sequence[str], partition_key: str | None, release: str):
    """One in-process Dagster run of the named assets (used by the CLI and its workers)."""
    import dagster as dg

    from pipelines.definitions import all_assets
    from pipelines.resources import CubeResource

    by_key = {a.key.to_user_string(): a for a in all_assets}
    resource = CubeResource(data_root=os.environ["CITYCUBE_DATA"], release_version=release)
    build_tag = {BUILD_TAG: os.environ[BUILD_ENV]} if os.environ.get(BUILD_ENV) else {}
    return dg.materialize(
        all_assets,
        selection=dg.AssetSelection.assets(*[by_key[n] for n in selection_names]),
        partition_key=partition_key,
        run_config=QUIET_RUN_CONFIG,
        resources={"cube": resource},
        instance=dg.DagsterInstance.get(),
        tags={"citycube/release": release, **build_tag},
        raise_on_error=False,
    )


def _cancel_killed_runs(build_id: str) -> int:
    """Mark this build's runs killed mid-way as canceled; returns how many.

    Otherwise the Dagster UI would show them as running forever.
    """
    import dagster as dg

    instance = dg.DagsterInstance.get()
    killed = instance.get_runs(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING],
            tags={BUILD_TAG: build_id},
        )
    )
    for run in killed:
        instance.report_run_canceled(run, message="killed by a second stop request")
    return len(killed)


def _run_city_year(city: str, year: int, release: str) -> tuple[str, int, bool, str, float]:
    """Materialise one city-year; returns (city, year, success, summary, seconds)."""
    from pipelines.partitions import city_year_key
    from pipelines.schedules import city_year_assets

    t0 = time.monotonic()
    names = [a.key.to_user_string() for a in city_year_assets]
    result = _materialize(names, city_year_key(city, year), release)
    parts = []
    for event in result.get_asset_materialization_events():
        key = event.asset_key.path
        meta = event.materialization.metadata
        if key[0] == "modalities" and "tiles" in meta:
            parts.append(f"{key[-1].upper()} {meta['available_tiles'].value}/{meta['tiles'].value}")
    if not result.success:
        failures = [
            f"{e.step_key}: {e.event_specific_data.error.message.strip().splitlines()[-1]}"
            for e in result.all_events
            if e.is_step_failure and e.event_specific_data and e.event_specific_data.error
        ]
        parts.append("FAILED " + "; ".join(failures))
    return city, year, result.success, "  ".join(parts), time.monotonic() - t0


class StopRequests:
    """SIGINT/SIGTERM during a build: the first lets running work finish, the second stops it.

    Dagster swallows an interrupt that arrives while it executes in-process (the step fails and
    the run goes on), so the build keeps Dagster out of its own main process while it waits:
    every city-year runs in a worker process and this handler decides when to stop.
    """

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signo: int, _frame: object) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        print(
            f"\n{signal.Signals(signo).name}: not starting new work; waiting for the running "
            "city-years (again to stop them at once) ...",
            file=sys.stderr,
            flush=True,
        )

    @property
    def requested(self) -> bool:
        return self.count > 0


@contextmanager
def stop_requests() -> Iterator[StopRequests]:
    """Route SIGINT and SIGTERM to a :class:`StopRequests` for the duration of a build."""
    stop = StopRequests()
    previous = {signo: signal.signal(signo, stop) for signo in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for signo, handler in previous.items():
            signal.signal(signo, handler)


def _own_process_group() -> None:
    """Worker start-up: leave the terminal's process group, so Ctrl-C reaches only the parent.

    The parent decides what a stop means (finish running city-years, or kill them on a second
    request); a worker interrupted behind its back would fail half a city-year instead.
    """
    os.setpgrp()


def _static_sources(city: str, release: str) -> tuple[str, bool]:
    """Materialise one city's static (yearless) sources; returns (city, success)."""
    from assets.sources import source_assets
    from pipelines.partitions import city_partitions

    names = [a.key.to_user_string() for a in source_assets if a.partitions_def == city_partitions]
    return city, (not names) or _materialize(names, city, release).success


def _run_tasks(
    pool: Executor,
    workers: int,
    function: Callable[..., tuple],
    tasks: Sequence[tuple],
    on_result: Callable[..., None],
    stop: StopRequests,
) -> None:
    """Run ``function(*task)`` for each task, ``workers`` at a time, reporting each result.

    Tasks are handed to the pool only as workers free up, so a stop request leaves nothing
    queued: running tasks finish and the rest never start. A second request raises
    KeyboardInterrupt after killing the workers; partitions they were writing never replace a
    finished one (atomic writes).
    """
    waiting = iter(tasks)
    running: set[Future] = set()
    try:
        while True:
            while not stop.requested and len(running) < workers:
                task = next(waiting, None)
                if task is None:
                    break
                running.add(pool.submit(function, *task))
            if not running:
                return
            finished, running = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in finished:
                on_result(*future.result())
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        for child in multiprocessing.active_children():
            child.kill()
        raise


def build(args: argparse.Namespace) -> int:
    """Materialise the selected city-years and the cube assets through Dagster."""
    cities = _parse_cities(args.cities)
    years = _parse_years(args.years)
    if args.workers < 1:
        raise SystemExit("--workers must be at least 1")
    _env_defaults(args)

    from assets.cube import cube_assets
    from assets.reports import availability_report
    from pipelines.resources import CubeResource

    resource = CubeResource(data_root=os.environ["CITYCUBE_DATA"], release_version=args.release)
    total = len(cities) * len(years)
    started = time.monotonic()
    print(
        f"Building release {args.release} (SYNTHETIC sample sources) for {len(cities)} cities × "
        f"{len(years)} years = {total} city-years into {os.environ['CITYCUBE_DATA']} "
        f"with {args.workers} worker(s)",
        flush=True,
    )
    width = len(str(total))
    done = 0
    failed: list[str] = []

    def report_static(city: str, ok: bool) -> None:
        if not ok:
            failed.append(f"{city} static sources")

    def report(city: str, year: int, ok: bool, summary: str, seconds: float) -> None:
        nonlocal done
        done += 1
        if not ok:
            failed.append(f"{city} {year}")
        print(
            f"[{done:>{width}}/{total}] {city} {year}: {summary}  ({seconds:.1f}s, "
            f"elapsed {time.monotonic() - started:.0f}s)",
            flush=True,
        )

    os.environ[BUILD_ENV] = f"{os.getpid()}-{time.time_ns()}"  # inherited by the workers
    spawn = multiprocessing.get_context("spawn")
    killed = 0
    with stop_requests() as stop:
        try:
            with ProcessPoolExecutor(
                args.workers, mp_context=spawn, initializer=_own_process_group
            ) as pool:
                # Static sources first: every year of a city reads them.
                statics = [(city, args.release) for city in cities]
                run = partial(_run_tasks, pool, args.workers)
                run(_static_sources, statics, report_static, stop)
                if not stop.requested:
                    pairs = [(c, y, args.release) for c in cities for y in years]
                    run(_run_city_year, pairs, report, stop)
        except KeyboardInterrupt:  # the second request: workers were killed
            killed = _cancel_killed_runs(os.environ[BUILD_ENV])
        except BrokenProcessPool as exc:
            print(
                f"error: a worker process died ({exc}); partitions it was writing are "
                "discarded, finished ones are kept. Run the same command again.",
                file=sys.stderr,
            )
            return 1
    if stop.requested:
        print(
            f"\nStopped after {done} of {total} city-years ({total - done} not built, "
            f"{len(failed)} failed, {killed} Dagster runs killed mid-way and marked canceled). "
            "Every partition written so far is in the "
            "release and the cube database was left as it was; run the same command again to "
            "build the rest (sources and derived results already made are reused).",
            file=sys.stderr,
        )
        return 130
    print("Building tiles table, DuckDB catalogue and availability report ...", flush=True)
    names = [a.key.to_user_string() for a in [*cube_assets, availability_report]]
    result = _materialize(names, None, args.release)
    for check in result.get_asset_check_evaluations():
        status = "PASS" if check.passed else "FAIL"
        print(f"  check {check.check_name}: {status}")
    release = resource.release()
    print(f"Done in {time.monotonic() - started:.0f}s.\n")
    print(summary_text(release.duckdb_file))
    shell = Path(sys.executable).with_name("duckdb")
    print(f"\nQuery it: {shell if shell.exists() else 'duckdb'} {release.duckdb_file}")
    print(f"Availability tables and heatmap: {release.root / 'reports'}")
    print(f"Quick-looks: {release.root / 'quicklooks'}")
    if failed or not result.success:
        print(f"\nFAILED partitions (others are intact): {', '.join(failed) or 'cube assets'}")
        return 1
    return 0


def views(args: argparse.Namespace) -> int:
    """Rebuild cube.duckdb for a release (e.g. after moving it)."""
    from citycube.catalogue import load_catalogue
    from citycube.cube import Release, build_duckdb, release_metadata

    release = Release(Path(args.data).resolve(), args.release)
    if not release.root.exists():
        print(f"no release at {release.root}", file=sys.stderr)
        return 2
    if release.metadata_file.exists():  # keep what the build recorded (backend, synthetic, …)
        meta = json.loads(release.metadata_file.read_text(encoding="utf-8"))
    else:
        meta = release_metadata(release, backend="unknown", synthetic=True)
    print(build_duckdb(release, load_catalogue(), meta))
    return 0


def summary(args: argparse.Namespace) -> int:
    """Print the DuckDB summary of a release."""
    from citycube.cube import Release

    release = Release(Path(args.data).resolve(), args.release)
    if not release.duckdb_file.exists():
        print(f"no database at {release.duckdb_file}; run `make run` first", file=sys.stderr)
        return 2
    print(summary_text(release.duckdb_file))
    return 0


def dagster_home(args: argparse.Namespace) -> int:
    """Create DAGSTER_HOME with telemetry off (used by `make dev`)."""
    print(ensure_dagster_home(Path(os.environ.get("DAGSTER_HOME", ".dagster_home")).resolve()))
    return 0


def render(args: argparse.Namespace) -> int:
    """Write one tile's chip, or a categorical legend, as a PNG with fixed colours."""
    import numpy as np

    from citycube.catalogue import load_catalogue
    from citycube.cube import Release
    from citycube.render import legend_image, legend_key, render_tile, write_png

    release = Release(Path(args.data).resolve(), args.release)
    catalogue = load_catalogue()
    if args.out is None and not release.root.exists():
        print(f"no release at {release.root}; pass --data/--release or --out", file=sys.stderr)
        return 2
    if args.legend:
        legend_key(catalogue, args.legend)  # a clear error for an unknown name
        out = Path(args.out or release.root / "renders" / f"legend_{args.legend}.png")
        legend = np.asarray(legend_image(catalogue, args.legend).convert("RGBA"))
        print(write_png(out, legend))
        return 0
    if not (args.tile and args.modality and args.year is not None):
        print("error: render needs --tile, --modality and --year (or --legend)", file=sys.stderr)
        return 2
    code = args.modality.upper()
    rgba = render_tile(release, catalogue, code, args.tile, args.year)
    name = f"{args.tile}_{code}_{args.year}.png"
    print(write_png(Path(args.out or release.root / "renders" / name), rgba))
    return 0


def report(args: argparse.Namespace) -> int:
    """(Re)write a release's availability report and print its two tables."""
    from citycube.catalogue import load_catalogue
    from citycube.cube import Release
    from citycube.report import write_report

    release = Release(Path(args.data).resolve(), args.release)
    paths = write_report(release, load_catalogue())
    for key in ("modality_md", "city_md"):
        print(paths[key].read_text(encoding="utf-8"))
    print("written:")
    for path in paths.values():
        print(f"  {path}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The argument parser (also used to render --help in the README)."""
    from pipelines.resources import DEFAULT_RELEASE

    p = argparse.ArgumentParser(
        prog="citycube",
        description="Build and inspect CityCube releases (multimodal urban data cube).",
    )
    p.add_argument(
        "--data",
        default=os.environ.get("CITYCUBE_DATA", "data"),
        help="data root holding sources/, cache/ and releases/ (env CITYCUBE_DATA; default ./data)",
    )
    p.add_argument(
        "--release",
        default=os.environ.get("CITYCUBE_RELEASE", DEFAULT_RELEASE),
        help=f"release version id (env CITYCUBE_RELEASE; default {DEFAULT_RELEASE})",
    )
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "build",
        help="materialise city-years and the cube through Dagster",
        description=(
            "Materialise each city's static sources, then every selected city-year (sources, "
            "all 18 modalities and quick-looks), then the tiles table, DuckDB catalogue and "
            "availability report, printing a line per city-year."
        ),
        epilog=(
            "Ctrl-C or SIGTERM once: start nothing new, let running city-years finish, exit "
            "130. Twice: kill the running city-years (finished partitions are kept). Run the "
            "same command again to build the rest."
        ),
    )
    b.add_argument(
        "--cities",
        default="default",
        help="'default' (Amsterdam,Boston), 'all', or comma-separated city keys",
    )
    b.add_argument(
        "--years",
        default="default",
        help="'default' (2020,2024,2025), 'all', or e.g. 2019-2021 or 2000,2005",
    )
    b.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("WORKERS", "1")),
        help="city-years built in parallel processes (env WORKERS; default 1)",
    )
    b.set_defaults(func=build)
    v = sub.add_parser("views", help="rebuild cube.duckdb views for a release")
    v.set_defaults(func=views)
    s = sub.add_parser("summary", help="print a DuckDB summary of a release")
    s.set_defaults(func=summary)
    d = sub.add_parser("dagster-home", help="prepare DAGSTER_HOME for offline `dagster dev`")
    d.set_defaults(func=dagster_home)
    r = sub.add_parser(
        "render",
        help="render a tile's chip (or a legend) as PNG with fixed, never-stretched colours",
        description=(
            "Render one tile of an image modality with its fixed rendering (RGB as supplied, "
            "fixed grey ranges, fixed palettes and legends; invalid pixels transparent), e.g. "
            "`citycube render --tile Boston_2KM_r7_c8 --modality OPT --year 2020`, or write a "
            "categorical legend with `citycube render --legend LC`."
        ),
    )
    r.add_argument("--tile", help="tile id, e.g. Boston_2KM_r7_c8 (the city is taken from it)")
    r.add_argument("--modality", help="image modality code, e.g. OPT, DEM, LC")
    r.add_argument("--year", type=int, help="calendar year, 2000–2025")
    r.add_argument(
        "--legend",
        metavar="NAME",
        help="write the legend of a categorical modality (LC, LU, POI) or a legend name instead",
    )
    r.add_argument(
        "--out",
        help="output PNG (default <release>/renders/<tile>_<MODALITY>_<year>.png, "
        "or <release>/renders/legend_<NAME>.png)",
    )
    r.set_defaults(func=render)
    a = sub.add_parser(
        "report",
        help="(re)write the availability report of a release and print its tables",
        description=(
            "Count available city-year-modality combinations (at least one tile available) over "
            "the city-years the release holds, for all 18 modalities; writes reports/"
            "availability_by_{modality,city}.{csv,md} and reports/availability_heatmap.png."
        ),
    )
    a.set_defaults(func=report)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    args = parser().parse_args(argv)
    from citycube.errors import CityCubeError

    try:
        return int(args.func(args))
    except CityCubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
