"""``citycube build``: asset backfills of the chosen cities and years, run by Dagster.

The build is Dagster asset backfills like ones launched from the UI: every asset partition the
cities and years need, across the city, city × epoch and city × year partitionings plus the
cube, in two backfills one after the other — the static and epoch products first, then the
rest, so that every city-year asset of a city finds what it reads materialised and joins one
run. They are requested through Dagster's GraphQL API (``launchPartitionBackfill``,
pipelines/graphql.py) and run by Dagster's daemon: Dagster's backfill logic turns each into
runs (one per partition range, as the single-run backfill policy asks), its queued run
coordinator launches them and each run's steps fan their partitions out to one dask cluster.
When a Dagster daemon already serves this ``DAGSTER_HOME`` (``make dev``), it executes the
backfills; otherwise the build starts ``dagster-daemon run`` itself, on a code server of its
own (pipelines/daemon.py), and stops both at its end. The build follows the runs and their
events through the instance's run and event queries.

Order, so that the two cores never wait on Dagster: static and epoch runs leave the queue first
(run priority tag), fetch steps go ahead of all processing on the workers, and other steps run
in the order their runs started, so a run finishes, and frees its slot, as early as it can.

The command is two processes. The one in the terminal only relays stop requests: a first
Ctrl-C/SIGTERM cancels the backfill (Dagster terminates its runs; finished partitions stay), a
second forces every run down at once. The other, in its own session so a terminal's Ctrl-C
never reaches the runs behind Dagster's back, creates the dask cluster, starts Dagster's
processes, submits the backfills, follows them and reports progress.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pipelines.graphql import TERMINAL_STATUSES, DagsterGraphQL

if TYPE_CHECKING:  # imported where used
    from citycube.cube.release import Release
    from pipelines.daemon import BuildServices
    from pipelines.selection import Selection

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKSPACE_FILE = REPO_ROOT / "workspace.yaml"
BUILD_TAG = "citycube/build"
RELEASE_TAG = "citycube/release"
BACKFILL_TAG = "dagster/backfill"
DRIVER_TAG = "citycube/driver"
"""Who runs a build's backfill: 'build' (the build's own driver) or 'daemon' (``make dev``)."""
TICK_S = 1.0
"""Seconds between two reads of the runs and their events."""
BUSY_READ_S = 5.0
"""The same while several runs compute (:meth:`ProgressPrinter.busy`): each read is a few
queries on the instance's storage per run, and nothing waits on the build meanwhile."""
IDLE_LOOK_S = 10.0
"""With nothing in flight, seconds after the daemon's last look before the build asks for
another (the backfill requests more runs, or records its end, at a look)."""
STATUS_POLL_S = 0.5
"""With nothing in flight, least seconds between two reads of the backfill's status."""
SERVED_POLL_S = 10.0
"""The same when a daemon of `make dev` runs the backfill (it looks every 30 s)."""
END_WAIT_S = 60.0
"""Longest wait, at a build's end, for Dagster to record its last backfill's end."""
PRIORITY_TAG = "dagster/priority"
"""Dagster's run priority tag: the run queue launches runs with a higher one first."""
FIRST_PRIORITY = "1"
"""Run priority (Dagster's ``dagster/priority`` tag) of runs whose assets are not per city ×
year: static and epoch products, which the city-years' later runs read."""
DAEMON_FRESH_S = 60.0
"""A daemon heartbeat younger than this means a daemon serves the instance."""
FORCED_STOP_GRACE_S = 20.0
"""After a forced stop, seconds to wait for runs to report their end before marking them."""
EXIT_STOPPED = 130


# --------------------------------------------------------------------------------------------
# The build request, passed from the terminal process to the driver.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildRequest:
    """What to build and with how many workers."""

    cities: list[str]
    years: list[int]
    release: str
    data_root: str
    workers: int
    scheduler: str = ""
    """A running dask scheduler to use instead of a local cluster."""
    assets: list[str] = field(default_factory=list)
    """Only assets whose key starts with one of these (e.g. 'sources'); empty: everything."""

    def to_json(self) -> str:
        """For the driver's command line."""
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> BuildRequest:
        """Back from the driver's command line."""
        return cls(**json.loads(text))


# --------------------------------------------------------------------------------------------
# The terminal process: relay stop requests to the driver.
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def build_locks(request: BuildRequest, home: Path) -> Iterator[tuple[int, ...]]:
    """Hold the release's and the Dagster instance's build locks; their file descriptors.

    Two builds of one release would write the same files and the same staged database, and
    two builds driving one instance would each run the other's backfill (and the second would
    take the first's runs for a killed build's). The second build is refused instead, naming
    the first. The driver inherits the descriptors, so the locks last as long as it does.
    """
    from citycube.cube.release import Release
    from citycube.errors import BuildBusyError
    from pipelines.lifetime import LOCK_FILE, exclusive, lock_holder

    release = Release(Path(request.data_root), request.release)
    holder = (
        f"citycube build of release {request.release} ({_describe(request)}) into "
        f"{request.data_root} with DAGSTER_HOME {home}, pid {os.getpid()}, started "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}"
    )
    places = [
        (release.root / LOCK_FILE, f"release {request.release} in {request.data_root}"),
        (home / LOCK_FILE, f"DAGSTER_HOME {home}"),
    ]
    with contextlib.ExitStack() as stack:
        fds = []
        for path, what in places:
            fd = stack.enter_context(exclusive(path, holder))
            if fd is None:
                raise BuildBusyError(
                    f"{what} is in use by another build: {lock_holder(path)}. Wait for it to "
                    "end (or stop it with Ctrl-C in its terminal) and run the command again, "
                    "or build into another --release / DAGSTER_HOME"
                )
            fds.append(fd)
        yield tuple(fds)


def run_build(
    request: BuildRequest, keep_fds: Sequence[int] = (), pending: list[int] | None = None
) -> int:
    """Start the driver in its own session and relay stop requests to it; its exit code.

    ``keep_fds`` (the build locks) are handed to the driver, which holds them to its end.
    ``pending`` is the list a caller's early handler notes signals in until this one takes
    over: what it noted is relayed as soon as the driver runs.
    """
    pending = [] if pending is None else pending
    command = [sys.executable, "-m", "pipelines.build", request.to_json()]
    driver = subprocess.Popen(
        command, cwd=REPO_ROOT, start_new_session=True, pass_fds=tuple(keep_fds)
    )
    requests = 0

    def relay(signo: int, _frame: object) -> None:
        nonlocal requests
        requests += 1
        if requests == 1:
            print(
                f"\n{signal.Signals(signo).name}: stopping the build: the backfill is canceled "
                "and Dagster terminates its runs; finished partitions stay. "
                "(Again to force every run down at once.)",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(ProcessLookupError):
                driver.send_signal(signal.SIGTERM)
        else:
            with contextlib.suppress(ProcessLookupError):
                driver.send_signal(signal.SIGINT)

    previous = {s: signal.signal(s, relay) for s in (signal.SIGINT, signal.SIGTERM)}
    for signo in list(pending):  # noted by the early handler while the driver was starting
        relay(signo, None)
    try:
        while True:
            try:
                code = driver.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - the handler takes SIGINT
                continue
    finally:
        for signo, handler in previous.items():
            signal.signal(signo, handler)
    if code == -signal.SIGTERM and requests:  # stopped while it was still starting
        print(
            "\nThe build stopped before its backfill began; nothing was built. Run the same "
            "command again to build.",
            file=sys.stderr,
            flush=True,
        )
        return 130
    if code < 0:  # killed: it could not say so itself
        print(
            f"\nThe build was killed ({signal.Signals(-code).name}); its processes ended with "
            "it and every partition finished before is kept. Run the same command again to "
            "build the rest (it closes the runs the killed build left open).",
            file=sys.stderr,
            flush=True,
        )
        return 128 - code
    return code


# --------------------------------------------------------------------------------------------
# The driver: cluster, backfill, progress.
# --------------------------------------------------------------------------------------------


class StopFlags:
    """Stop requests the driver has received: graceful (SIGTERM) and forced (SIGINT)."""

    def __init__(self) -> None:
        self.graceful = False
        self.forced = False

    def install(self) -> None:
        """Route SIGTERM and SIGINT here."""
        signal.signal(signal.SIGTERM, self._graceful)
        signal.signal(signal.SIGINT, self._force)

    def _graceful(self, _signo: int, _frame: object) -> None:
        self.graceful = True

    def _force(self, _signo: int, _frame: object) -> None:
        self.graceful = self.forced = True


def _stop_with_parent() -> None:
    """Ask Linux to send SIGTERM (a graceful stop) to this process when its parent dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class BuildCluster:
    """The dask scheduler a build's runs send partition work to."""

    address: str
    """Scheduler address; empty: each run computes in its own process (one worker)."""
    close_early: Callable[[], None] = lambda: None
    """Start closing a cluster the build started, once no run needs it: it then ends while
    the build records its end and stops Dagster's processes."""


@contextlib.contextmanager
def dask_cluster(request: BuildRequest, out: TextIO) -> Iterator[BuildCluster]:
    """The scheduler the runs send partition work to: given, or a LocalCluster for the build."""
    if request.scheduler:
        from dask.distributed import Client

        from pipelines.resources import describe_cluster

        with Client(request.scheduler, timeout="30s") as client:
            print(f"dask: {describe_cluster(client, external=True)}", file=out, flush=True)
        yield BuildCluster(request.scheduler)
        return
    if request.workers <= 1:
        yield BuildCluster("")
        return
    from pipelines.resources import start_local_cluster

    cluster = start_local_cluster(request.workers)  # workers start while the build sets up
    closing = threading.Thread(target=cluster.close, name="close-dask")

    def close_early() -> None:
        if closing.ident is None:  # not started yet
            closing.start()

    try:
        print(
            f"dask: LocalCluster with {request.workers} workers at {cluster.scheduler_address}",
            file=out,
            flush=True,
        )
        yield BuildCluster(cluster.scheduler_address, close_early)
    finally:
        if closing.ident is None:
            cluster.close()
        else:
            closing.join()


def backfill_phases(request: BuildRequest) -> list[tuple[str, Selection]]:
    """The build's backfills in order, (what, asset partitions): everything the request's
    cities, years and assets need, the static and epoch products first, then the rest (see
    ``source_periods_first``); one when either part is empty."""
    from pipelines.selection import build_selection, is_empty, merged, source_periods_first

    partitions = asset_partitions()
    left_out = set(cube_readers_left_out(request))
    keys = [k for k in selected_asset_keys(request.assets) if k not in left_out]
    selection = build_selection(partitions, request.cities, request.years, keys)
    first, rest = source_periods_first(partitions, selection)
    if is_empty(first) or is_empty(rest):
        return [("", merged(first, rest))]
    return [("static and 5-year products", first), ("city-years and the cube", rest)]


def cube_readers_left_out(request: BuildRequest) -> list[Any]:
    """Selected assets that read the cube being built, left out of a build that neither builds
    that cube nor has one: e.g. the planning tasks' sources, which fetch for the staged
    cube's cities, in a fetch-only build (``--assets sources``). Without the cube they could
    only fail; once it exists, the same selection takes them."""
    if not request.assets:
        return []
    from assets.cube import STAGED_DATABASE_KEY
    from citycube.cube.release import Release, build_database
    from pipelines.definitions import defs

    keys = selected_asset_keys(request.assets)
    if STAGED_DATABASE_KEY in keys:
        return []
    if build_database(Release(Path(request.data_root), request.release)).exists():
        return []
    reads_cube = {
        spec.key
        for spec in defs.resolve_all_asset_specs()
        if any(dep.asset_key == STAGED_DATABASE_KEY for dep in spec.deps)
    }
    return [key for key in keys if key in reads_cube]


def asset_partitions() -> dict[Any, Any]:
    """Asset key → partitions definition (None: unpartitioned) of every asset."""
    from pipelines.definitions import defs
    from pipelines.selection import partitions_by_key

    return partitions_by_key(defs)


PHASE_DONE = ("COMPLETED_SUCCESS", "COMPLETED_FAILED")
"""Statuses of a build's first backfill after which the next one starts (COMPLETED_FAILED:
some partitions failed; the next backfill tries them again with everything downstream)."""


def submit_backfill(
    graphql: DagsterGraphQL,
    request: BuildRequest,
    build_id: str,
    selection: Selection,
    title: str,
    driver: str = "build",
    priority: str | None = None,
) -> str:
    """Request an asset backfill of ``selection`` through Dagster's GraphQL API; its id.

    ``priority`` (Dagster's ``dagster/priority`` tag, which runs take from their backfill)
    puts its runs ahead of others in the run queue.
    """
    tags = {BUILD_TAG: build_id, RELEASE_TAG: request.release, DRIVER_TAG: driver}
    if priority is not None:
        tags[PRIORITY_TAG] = priority
    return graphql.launch_backfill(
        selection,
        asset_partitions(),
        tags=tags,
        title=title,
        description=f"release {request.release}: {_describe(request)}",
    )


def selected_asset_keys(prefixes: Sequence[str]) -> list[Any]:
    """Keys of the assets whose key starts with one of ``prefixes`` (when none is given, all
    but the evaluations materialised on request, ``pipelines.definitions.ON_REQUEST``).

    A prefix that matches nothing is refused with the prefixes that exist: a typo would
    otherwise build nothing of what was meant, or everything.
    """
    from citycube.errors import UnknownAssetError
    from pipelines.definitions import ON_REQUEST, defs
    from pipelines.selection import REQUESTS_GROUP

    keys = [
        key
        for key in defs.resolve_asset_graph().materializable_asset_keys
        if key.path[0] != REQUESTS_GROUP
    ]
    names = {key: key.to_user_string() for key in keys}
    unmatched = [p for p in prefixes if not any(n.startswith(p) for n in names.values())]
    if unmatched:
        groups = sorted({name.split("/")[0] for name in names.values()})
        raise UnknownAssetError(
            f"--assets {','.join(unmatched)} matches no asset; give prefixes of asset keys such "
            f"as {', '.join(groups)} or e.g. derived/opt (see `make dev` for every key)"
        )
    if not prefixes:  # a build makes the cube; evaluations run when asked for by name
        return [k for k in keys if not names[k].startswith(ON_REQUEST)]
    return [k for k in keys if any(names[k].startswith(p) for p in prefixes)]


def _describe(request: BuildRequest) -> str:
    cities = (
        ",".join(request.cities) if len(request.cities) <= 4 else f"{len(request.cities)} cities"
    )
    years = _year_span(request.years)
    return f"{cities} × {years}"


def _year_span(years: Sequence[int]) -> str:
    years = sorted(years)
    if len(years) > 2 and years == list(range(years[0], years[-1] + 1)):
        return f"{years[0]}–{years[-1]}"
    return ",".join(str(y) for y in years)


def daemon_serves(instance: Any, home: Path | None = None) -> bool:
    """True when a Dagster daemon with a backfill loop heartbeats for this instance and runs
    (not one that a build ran: those are recorded in DAGSTER_HOME, see pipelines/daemon.py)."""
    from pipelines.daemon import daemon_process_running, own_daemon_ids

    try:
        heartbeats = instance.get_daemon_heartbeats()
    except Exception:
        return False
    beat = heartbeats.get("BACKFILL")
    if beat is None or time.time() - beat.timestamp >= DAEMON_FRESH_S:
        return False
    if home is None:
        return True
    return beat.daemon_id not in own_daemon_ids(home) and daemon_process_running(home)


@dataclass
class BuildReport:
    """How the backfill ended and what happened on the way."""

    status: str = ""
    runs: dict[str, str] = field(default_factory=dict)
    """Run id → final status."""
    failures: list[str] = field(default_factory=list)
    """One line per failed step."""
    checks: dict[str, str] = field(default_factory=dict)
    """Asset check name → PASS, WARN or FAIL."""
    check_failures: dict[str, str] = field(default_factory=dict)
    """Failed ERROR-level check name → its asset and what failed (the partitions it names)."""
    end_unrecorded: bool = False
    """The backfill is done (everything materialised) but Dagster has not recorded it yet."""


class ProgressPrinter:
    """Prints what the backfill's runs do: runs starting and ending, steps, progress lines."""

    def __init__(self, instance: Any, out: TextIO) -> None:
        self.instance = instance
        self.backfill_id = ""
        """The backfill whose runs are printed (see :meth:`follow`)."""
        self.out = out
        self.start = time.time()
        self.cursors: dict[str, str | None] = {}
        self.names: dict[str, str] = {}
        self.done: set[str] = set()
        """Runs that ended and whose every event has been read."""
        self.current: list[Any] = []
        """The backfill's runs as last read, oldest first."""
        self.made: set[tuple[Any, str | None]] = set()
        """(asset key, partition key or None) of each materialisation the backfill's runs
        recorded, as read with their events."""
        self.report = BuildReport()

    def follow(self, backfill_id: str) -> None:
        """Print the runs of the build's next backfill from now on (run numbers go on)."""
        self.backfill_id = backfill_id
        self.current = []
        self.made = set()

    def missing(self, selection: Selection) -> Selection:
        """The partitions of ``selection`` that the backfill's runs, as read so far, have not
        materialised (all of them read: nothing missing means the backfill made everything).

        Answered from the events already read for progress: reading the materialisations
        again from the instance took 10 s for the whole calendar's 20,000. Only this
        backfill's runs count, not an earlier build's."""
        left: Selection = {}
        for key, keys in selection.items():
            if keys is None:
                if (key, None) not in self.made:
                    left[key] = None
            elif partitions := tuple(k for k in keys if (key, k) not in self.made):
                left[key] = partitions
        return left

    def line(self, text: str, at: float | None = None) -> None:
        """One progress line with the time since the build started (or since ``at``)."""
        elapsed = (at if at is not None else time.time()) - self.start
        print(f"[{elapsed:6.1f}s] {text}", file=self.out, flush=True)

    def runs(self) -> list[Any]:
        """The backfill's runs, oldest first (read again)."""
        import dagster as dg

        tags = {BACKFILL_TAG: self.backfill_id}
        self.current = list(reversed(self.instance.get_runs(filters=dg.RunsFilter(tags=tags))))
        return self.current

    def poll(self) -> None:
        """Read the runs once and print every new event worth a line."""
        for run in self.runs():
            if run.run_id in self.done:
                continue
            if run.run_id not in self.names:
                self.names[run.run_id] = f"run {len(self.names) + 1} ({run.run_id[:8]})"
                self.cursors[run.run_id] = None
            self._events(run)
            if run.is_finished:  # its last events were written before its status changed
                self.done.add(run.run_id)

    def in_flight(self) -> bool:
        """True while a run read by the last ``poll`` is queued, starting or running."""
        return any(not run.is_finished for run in self.current)

    def queued(self) -> bool:
        """True when a run read by the last ``poll`` waits in the run queue."""
        return any(run.status.value == "QUEUED" for run in self.current)

    def busy(self) -> bool:
        """True when more than one run computed at the last ``poll``: the end of one leaves
        the others computing, and the daemon, not the build, starts the queued ones."""
        return sum(run.status.value == "STARTED" for run in self.current) > 1

    def computing(self) -> bool:
        """True when the runs read by the last ``poll`` that have not ended have all started
        (none queued or being launched)."""
        unfinished = [run for run in self.current if not run.is_finished]
        return bool(unfinished) and all(run.status.value == "STARTED" for run in unfinished)

    def _events(self, run: Any) -> None:
        from dagster import DagsterEventType

        name = self.names[run.run_id]
        while True:
            # Unfiltered: a step's progress lines are log entries without an event type,
            # which a filter by event type would leave out.
            page = self.instance.get_records_for_run(
                run.run_id, cursor=self.cursors[run.run_id], limit=500
            )
            self.cursors[run.run_id] = page.cursor
            for record in page.records:
                entry = record.event_log_entry
                event = entry.dagster_event
                at = entry.timestamp
                if event is None:
                    if entry.level >= logging.INFO and entry.user_message:
                        self.line(f"  {entry.user_message}", at)
                    continue
                kind = event.event_type
                if kind == DagsterEventType.ASSET_MATERIALIZATION:
                    self.made.add((event.asset_key, event.partition))
                elif kind == DagsterEventType.RUN_START:
                    self.line(f"{name} started: {_run_scope(run)}", at)
                elif kind == DagsterEventType.STEP_FAILURE:
                    failure = f"{event.step_key}: {root_cause(event.event_specific_data.error)}"
                    self.report.failures.append(failure)
                    self.line(f"  FAILED {failure}", at)
                elif kind == DagsterEventType.STEP_UP_FOR_RETRY:
                    self.line(f"  retrying {event.step_key}", at)
                elif kind == DagsterEventType.ASSET_CHECK_EVALUATION:
                    evaluation = event.event_specific_data
                    warn = getattr(evaluation.severity, "value", "") == "WARN"
                    verdict = "PASS" if evaluation.passed else ("WARN" if warn else "FAIL")
                    self.report.checks[evaluation.check_name] = verdict
                    if verdict == "FAIL":
                        self.report.check_failures[evaluation.check_name] = (
                            f"{evaluation.asset_key.to_user_string()}: "
                            f"{evaluation.description or 'failed'}"
                        )
                    else:
                        self.report.check_failures.pop(evaluation.check_name, None)
                elif kind in (
                    DagsterEventType.RUN_SUCCESS,
                    DagsterEventType.RUN_FAILURE,
                    DagsterEventType.RUN_CANCELED,
                ):
                    ended = kind.value.removeprefix("PIPELINE_").removeprefix("RUN_").lower()
                    self.report.runs[run.run_id] = ended
                    self.line(f"{name} {ended}", at)
            if not page.has_more:
                return


def root_cause(error: Any) -> str:
    """What a step failure says to fix, not Dagster's wrapper around it.

    A step that raises shows up as "Error occurred while executing op …" with the real error as
    its cause, which may carry causes of its own (the library error a CityCube error was raised
    from). The first CityCube error of the chain (``[CCnnn] …``) is the message to show; failing
    that, the first error that is not Dagster's own.
    """
    if error is None:
        return "failed"
    chain = []
    while error is not None:
        chain.append(error)
        error = getattr(error, "cause", None)
    checks = [e for e in chain if e.cls_name == "DagsterAssetCheckFailedError"]
    if checks:  # "1 blocking asset check failed …:" and, on the lines below, which
        return " ".join(line.strip() for line in (checks[0].message or "").splitlines() if line)
    ours = [e for e in chain if re.search(r"\[CC\d{3}\]", e.message or "")]
    theirs = [e for e in chain if not (e.cls_name or "").startswith("Dagster")]
    chosen = (ours or theirs or chain)[0]
    lines = [line.strip() for line in (chosen.message or "").strip().splitlines() if line.strip()]
    if not lines:
        return chosen.cls_name or "failed"
    # Ours in full: a library's message quoted inside can span lines, and the fix comes last.
    return " ".join(lines) if ours else lines[0]


def _run_scope(run: Any) -> str:
    keys = sorted(k.to_user_string() for k in (run.asset_selection or []))
    tags = run.tags
    if "dagster/asset_partition_range_start" in tags:
        start = tags["dagster/asset_partition_range_start"]
        end = tags["dagster/asset_partition_range_end"]
        where = f"partitions {start} … {end}" if start != end else f"partition {start}"
    elif "dagster/partition" in tags:
        where = f"partition {tags['dagster/partition']}"
    else:
        where = "unpartitioned"
    groups = sorted({k.split("/")[0] for k in keys})
    return f"{len(keys)} assets ({', '.join(groups)}), {where}"


def drive_backfill(
    instance: Any,
    graphql: DagsterGraphQL,
    backfill_id: str,
    printer: ProgressPrinter,
    stop: StopFlags,
    services: BuildServices | None = None,
    done_when: Callable[[], bool] | None = None,
) -> BuildReport:
    """Follow the backfill to its end, print progress, and cancel through Dagster when asked
    to stop.

    ``services``: the build's own daemon, restarted when the backfill needs a look sooner than
    the daemon's next one (see pipelines/daemon.py); None when a daemon of `make dev` runs it.
    ``done_when``: once the backfill's runs have ended, whether everything it targets is
    materialised: the build then goes on at once, with COMPLETED_SUCCESS as the report's status
    and ``end_unrecorded`` set: the daemon's next look records the backfill's end.
    """
    own = services is not None
    if own:
        printer.line("Dagster's daemon runs the backfill (started by this build)")
    else:
        printer.line(
            "a Dagster daemon serves this DAGSTER_HOME (`make dev`?): it runs the backfill, "
            "every 30 s, and its runs use that daemon's CITYCUBE_WORKERS"
        )
    per_city_year = _per_city_year_assets()
    canceling = forced_at = None
    # The daemon looks at submission: nothing is in flight yet, but that look is not to be
    # asked for again (which restarted the daemon just started) before IDLE_LOOK_S.
    looked = idle_since = time.monotonic()
    last_status = last_read = 0.0
    while True:
        stopping = stop.graceful or stop.forced
        if stopping or not printer.busy() or time.monotonic() - last_read >= BUSY_READ_S:
            last_read = time.monotonic()
            printer.poll()
            _prioritise(instance, printer.current, per_city_year)
            if own:
                services.note_heartbeats(instance)
                if printer.computing():  # the next look's daemon loads while runs compute
                    services.prepare_daemon()
        now = time.monotonic()
        if printer.in_flight():
            idle_since = None
        elif idle_since is None:  # the backfill's runs have just ended
            idle_since = now
            if canceling is None and done_when is not None and done_when():
                printer.report.status = "COMPLETED_SUCCESS"
                printer.report.end_unrecorded = True
                return printer.report
        if stop.graceful and canceling is None:
            canceling = now
            printer.line("canceling the backfill: Dagster terminates its runs")
            graphql.cancel_backfill(backfill_id)
        if stop.forced and forced_at is None:
            forced_at = now
            _terminate_runs(graphql, printer)
        if forced_at is not None and now - forced_at > FORCED_STOP_GRACE_S:
            _mark_unfinished_canceled(instance, printer)
            printer.report.status = "CANCELED"
            return printer.report
        # The daemon is asked for a look when the backfill has something to do that cannot
        # wait for its next one: it was just canceled (its runs are to be terminated), or
        # nothing is in flight (it requests the runs that waited on the last ones, or records
        # its end). While runs are in flight, the daemon's own looks every 30 s serve.
        idle = idle_since is not None
        wanted = canceling == now or (idle and (looked < idle_since or now - looked >= IDLE_LOOK_S))
        if own and wanted:
            restarted = services.look_soon()
            looked = time.monotonic() + (0.0 if restarted else services.next_look_in())
        # Dagster records the backfill's end (or its cancellation) at a look with nothing in
        # flight: its status is read then, not every second.
        poll = STATUS_POLL_S if own else SERVED_POLL_S
        if idle and now - last_status >= poll and now >= looked:
            last_status = now
            status = graphql.backfill_status(backfill_id)
            if status in TERMINAL_STATUSES:
                printer.poll()  # the last runs' last events
                printer.report.status = status
                return printer.report
        time.sleep(TICK_S)


def wait_for_end(graphql: DagsterGraphQL, backfill_id: str, timeout: float) -> str:
    """The backfill's status once Dagster has recorded its end (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        status = graphql.backfill_status(backfill_id)
        if status in TERMINAL_STATUSES or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def _per_city_year_assets() -> set[Any]:
    """Keys of the assets partitioned by city × year."""
    from pipelines.partitions import city_year_partitions

    return {key for key, p in asset_partitions().items() if p == city_year_partitions}


def _has_assets(run: Any, keys: set[Any]) -> bool:
    """Whether a run materialises any of ``keys``."""
    return any(key in keys for key in run.asset_selection or ())


def _prioritise(instance: Any, runs: Sequence[Any], per_city_year: set[Any]) -> None:
    """Queued runs of static and epoch products go first (Dagster's run priority tag).

    The city-year runs of a build read them: a city-year's products that need a static or
    epoch one (its observations, a conversion series) wait for it in a later run, and started
    early those runs overlap the city-years' work instead of trailing it. (The first backfill's
    runs carry the tag from the backfill; this covers those of the second, e.g. retried ones.)
    """
    for run in runs:
        waiting = run.status.value == "QUEUED" and PRIORITY_TAG not in run.tags
        if waiting and not _has_assets(run, per_city_year):
            instance.add_run_tags(run.run_id, {PRIORITY_TAG: FIRST_PRIORITY})


def _terminate_runs(graphql: DagsterGraphQL, printer: ProgressPrinter) -> None:
    """Ask Dagster to terminate every unfinished run at once (recorded canceled right away).

    Runs that have not ended after the grace period are recorded as canceled by the build.
    """
    unfinished = [run for run in printer.runs() if not run.is_finished]
    for run in unfinished:
        printer.line(f"terminating {printer.names.get(run.run_id, run.run_id)}")
    with contextlib.suppress(Exception):
        graphql.terminate_runs([run.run_id for run in unfinished], at_once=True)


def _mark_unfinished_canceled(instance: Any, printer: ProgressPrinter) -> None:
    """Runs that did not report their end after a forced stop are recorded as canceled."""
    for run in printer.runs():
        if not run.is_finished:
            instance.report_run_canceled(run, message="forced stop of citycube build")


def close_abandoned_builds(
    instance: Any, build_id: str, graphql: DagsterGraphQL | None = None
) -> tuple[int, int]:
    """Close the runs and backfills that earlier builds left open; (runs, backfills).

    A build killed with SIGKILL cannot record its end: its runs stay STARTED (or QUEUED)
    and its backfill in progress, and this build's daemon would even carry that backfill on
    and start its queued runs. The caller holds the instance's build lock, so no other build
    is alive, and the killed build's processes ended with it (``pipelines.lifetime``): started
    runs are marked failed, queued ones canceled, each with a message that says why, and the
    backfill is canceled through Dagster's GraphQL API (the daemon's next look records it
    canceled). Backfills a daemon ran for a build (``make dev``) are the daemon's to finish and
    are left alone. Without ``graphql`` only runs are closed.
    """
    import dagster as dg

    queued = {dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED}
    running = {
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
        dg.DagsterRunStatus.CANCELING,
    }
    runs = 0
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=[*queued, *running])):
        owner = run.tags.get(BUILD_TAG)
        if owner is None or owner == build_id or run.tags.get(DRIVER_TAG) == "daemon":
            continue
        message = (
            f"citycube build {owner} ended (killed) without ending this run; closed by "
            f"build {build_id}"
        )
        if run.status in queued:
            instance.report_run_canceled(run, message=message)
        else:
            instance.report_run_failed(run, message=message)
        runs += 1
    backfills = 0
    for backfill in graphql.backfills("REQUESTED") if graphql is not None else ():
        owner = backfill.tags.get(BUILD_TAG)
        daemon = backfill.tags.get(DRIVER_TAG) == "daemon"
        if owner is not None and owner != build_id and not daemon:
            graphql.cancel_backfill(backfill.backfill_id)  # type: ignore[union-attr]
            backfills += 1
    return runs, backfills


def drive(request: BuildRequest, out: TextIO = sys.stdout) -> int:
    """The driver's work: cluster, backfill, progress, summary; the command's exit code."""
    stop = StopFlags()
    stop.install()  # first: a stop relayed while Dagster loads is kept, not fatal
    import dagster as dg

    from pipelines.daemon import BuildServices
    from pipelines.instance import sqlite_kept_open
    from pipelines.lifetime import mark_build_process
    from pipelines.resources import SCHEDULER_ENV, WORKERS_ENV
    from pipelines.selection import merged

    _stop_with_parent()
    mark_build_process()  # the cluster, the code server and the runs end with this process
    started = time.monotonic()
    build_id = f"{os.getpid()}-{time.time_ns()}"
    instance = dg.DagsterInstance.get()
    home = Path(os.environ["DAGSTER_HOME"]).resolve()
    log_file = home / "build-logs" / f"build-{build_id}.log"  # not logs/: Dagster uploads that
    out = _keep_terminal_for_progress(out, log_file)
    print(f"full log of the runs and workers: {log_file}", file=out, flush=True)
    served = daemon_serves(instance, home)
    if served:  # its runs start from its own code server, which this process cannot configure
        request = replace(request, workers=1)
    try:
        with (
            sqlite_kept_open(home),
            dask_cluster(request, out) as cluster,
            BuildServices(home, REPO_ROOT) as services,
        ):
            # The code server and the runs it launches inherit these.
            os.environ[SCHEDULER_ENV] = cluster.address
            os.environ[WORKERS_ENV] = str(request.workers)
            services.start_servers()
            print(f"Dagster UI of this build: {services.url}", file=out, flush=True)
            graphql = services.graphql
            # What a killed build left open is closed while the first backfill is requested,
            # before the daemon starts (it would carry such a backfill on).
            closing = (
                None if served else _in_thread(close_abandoned_builds, instance, build_id, graphql)
            )
            driver = "daemon" if served else "build"
            phases = backfill_phases(request)
            waiting = cube_readers_left_out(request)
            if waiting:
                print(
                    f"Left out, as they read the cube being built and there is none yet: "
                    f"{', '.join(k.to_user_string() for k in waiting)} (build the cube first, "
                    f"or add 'cube' to --assets).",
                    file=out,
                    flush=True,
                )
            printer = ProgressPrinter(instance, out)
            backfill_id = ""
            failed: Selection = {}
            for number, (what, selection) in enumerate(phases, 1):
                if failed:  # what the first left unmaterialised (failed) is tried again
                    selection = merged(selection, failed)
                part = f" ({number}/{len(phases)}: {what})" if what else ""
                title = f"citycube build {_describe(request)}{part}"
                priority = FIRST_PRIORITY if number < len(phases) else None
                backfill_id = submit_backfill(
                    graphql, request, build_id, selection, title, driver, priority
                )
                if closing is not None:
                    runs, backfills = closing.result()
                    closing = None
                    if runs or backfills:
                        print(
                            f"closed {runs} run(s) and {backfills} backfill(s) that a killed "
                            "earlier build left open (runs marked failed or canceled, "
                            "backfills canceled)",
                            file=out,
                            flush=True,
                        )
                if not served:
                    services.restart_daemon()
                print(
                    f"Dagster backfill {backfill_id}{part} on {os.environ['DAGSTER_HOME']} "
                    "(see it in `make dev`: Runs → Backfills)",
                    file=out,
                    flush=True,
                )
                printer.follow(backfill_id)

                def done_when(phase: Selection = selection) -> bool:
                    return not printer.missing(phase)

                report = drive_backfill(
                    instance,
                    graphql,
                    backfill_id,
                    printer,
                    stop,
                    services=None if served else services,
                    done_when=None if served else done_when,
                )
                failed = printer.missing(selection)
                if stop.graceful or report.status not in PHASE_DONE:
                    break  # stopped or canceled: the next backfill is not started
                if number < len(phases):  # the next backfill tries the failed ones again
                    report.failures.clear()
            if not (stop.graceful or printer.in_flight()):
                cluster.close_early()  # no run needs it any more
            if report.end_unrecorded:  # the daemon records it while the summary is printed
                services.look_soon()
            code = _conclude(request, backfill_id, report, time.monotonic() - started, stop, out)
            if report.end_unrecorded:
                wait_for_end(graphql, backfill_id, END_WAIT_S)
        return code
    except Exception as exc:
        import traceback

        traceback.print_exc()  # into the log
        print(f"\nbuild failed: {exc}\n(details in {log_file})", file=out, flush=True)
        return 1


def _in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """Call ``function`` in a thread of its own; its future."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    future = pool.submit(function, *args)
    pool.shutdown(wait=False)
    return future


def _keep_terminal_for_progress(out: TextIO, log_file: Path) -> TextIO:
    """Send this process's stdout and stderr (inherited by the code server, the runs and the
    dask workers) to ``log_file``; progress keeps going to the terminal through a copy."""
    if out is not sys.stdout:
        return out
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        os.dup2(log.fileno(), sys.stdout.fileno())
        os.dup2(log.fileno(), sys.stderr.fileno())
    return terminal


def _conclude(
    request: BuildRequest,
    backfill_id: str,
    report: BuildReport,
    elapsed: float,
    stop: StopFlags,
    out: TextIO,
) -> int:
    from citycube.cube.release import Release
    from citycube.reports.summary import summary_text

    runs = len(report.runs)
    if stop.graceful:
        print(
            f"\nStopped after {elapsed:.0f}s: backfill {backfill_id} is {report.status.lower()}; "
            f"{runs} run(s) ended. Every partition finished so far is in the release and the "
            "cube database was left as it was. Run the same command again to build the rest "
            "(sources and derived results already made are reused).",
            file=out,
            flush=True,
        )
        return EXIT_STOPPED
    for name, verdict in sorted(report.checks.items()):
        print(f"  check {name}: {verdict}", file=out)
    failed_checks = sorted(name for name, verdict in report.checks.items() if verdict == "FAIL")
    if failed_checks:
        # the step failure Dagster raises for them says only how many: each check says what
        report.failures = [f for f in report.failures if "blocking asset check" not in f]
        report.failures.append(
            f"ERROR-level checks failed: {', '.join(failed_checks)}; the cube database was not "
            "published (see the checks' metadata in `make dev`)"
        )
        for name in failed_checks:
            report.failures.append(
                f"  check {name} on {report.check_failures.get(name, 'its asset: failed')}"
            )
    if report.status != "COMPLETED_SUCCESS" or report.failures:
        print(
            f"\nBuild FAILED after {elapsed:.0f}s (backfill {backfill_id}: {report.status}).",
            file=out,
        )
        for failure in report.failures:
            print(f"  {failure}", file=out)
        print(
            "Partitions that finished are kept; fix the cause and run the same command again.",
            file=out,
            flush=True,
        )
        return 1
    release = Release(Path(request.data_root), request.release)
    print(f"\nDone in {elapsed:.0f}s ({runs} Dagster runs).\n", file=out, flush=True)
    if request.assets:
        return 0
    print(summary_text(release.duckdb_file), file=out)
    shell = Path(sys.executable).with_name("duckdb")
    print(f"\nQuery it: {shell if shell.exists() else 'duckdb'} {release.duckdb_file}", file=out)
    print(f"Availability tables and heatmap: {release.root / 'reports'}", file=out)
    print(f"Quick-looks: {release.published_root / 'quicklooks'}", file=out)
    print(
        f"Dataset card: {release.root / 'README.md'} (with collection.json, croissant.json); "
        "other releases: `citycube releases`",
        file=out,
        flush=True,
    )
    print(_benchmark_line(release), file=out, flush=True)
    print(_forecast_line(release), file=out, flush=True)
    return 0


def _forecast_line(release: Release) -> str:
    """How many forecasting cases the release holds, per target, against those asked for."""
    import json

    from citycube.tasks.forecast import ForecastFiles

    files = ForecastFiles.published(release)
    if not files.manifest.exists():
        return f"Forecasting cases: not built ({files.manifest} is missing)"
    manifest = json.loads(files.manifest.read_text(encoding="utf-8"))
    achieved, asked = manifest["achieved"], manifest["requested"]
    counts = ", ".join(
        f"{t} {achieved[t]} of {asked[t]}" for t in ("lst", "carbon", "property") if t in asked
    )
    why = "" if manifest["complete"] else " (too few tiles with a complete 2010–2024 panel)"
    return f"Forecasting cases: {counts}{why}; baseline scores in {files.scores('md')}"


def _benchmark_line(release: Release) -> str:
    """Where the translation benchmark's inputs are and how many instances they hold."""
    from citycube.tasks.translation import BenchmarkFiles, manifest_summary

    manifest = manifest_summary(release)
    if not manifest:
        folder = BenchmarkFiles.published(release).root
        return f"Translation benchmark: not built ({folder} is empty)"
    achieved = manifest["achieved"]
    counts = " / ".join(f"{achieved[s]:,}" for s in ("train", "val", "test"))
    asked = "" if manifest["complete"] else f" of {manifest['total']:,} asked for"
    return (
        f"Translation benchmark: {sum(achieved.values()):,} instances{asked} "
        f"(train / val / test {counts}), pair counts and splits in "
        f"{BenchmarkFiles.published(release).root}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Driver entry point: ``python -m pipelines.build '<request json>'``."""
    parser = argparse.ArgumentParser(description="(internal) drive one citycube build")
    parser.add_argument("request", help="the build request as JSON")
    args = parser.parse_args(argv)
    return drive(BuildRequest.from_json(args.request))


if __name__ == "__main__":
    sys.exit(main())
