"""Resources shared by every asset: where the cube lives, and where partition work runs."""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from citycube.catalogue.modalities import Catalogue, load_catalogue
from citycube.cube.release import BUILD_CHIP_FORMAT, Release
from citycube.errors import NoWorkersError
from citycube.items.protocol import SourceSet
from sources import SourceSetSpecFile, resolve_sources

DEFAULT_RELEASE = "sample-0.1.0"
SOURCE_SET_ENV = "CITYCUBE_SOURCE_SET"
"""Source-set YAML a build reads when the resource names none."""
CHIP_FORMAT_ENV = "CITYCUBE_CHIPS"
"""Chip store format a build writes when the resource names none ('icechunk' or 'zarr';
unset: ``citycube.cube.release.BUILD_CHIP_FORMAT``, icechunk)."""
SCHEDULER_ENV = "CITYCUBE_DASK_SCHEDULER"
"""Address of a running dask scheduler (e.g. tcp://host:8786) that partition work goes to."""
WORKERS_ENV = "CITYCUBE_WORKERS"
"""Worker processes of the local dask cluster a run starts when no scheduler is given."""
SHARED_ARGUMENT_BYTES = 4096
"""A task argument shared by every task of a step is sent to the workers once from this size."""
PROGRESS_EVERY_S = 10.0
"""Seconds between progress lines of a long step."""
FIRST_PRIORITY_BOOST = 10**13
"""Added to the dask priority of tasks that go first (more than any run's start in ms)."""
NO_WORKER_WAIT_S = 120.0
"""Seconds a step waits while the dask cluster has no worker (every one lost, or none started)
before it fails with CC310; a worker that joins in time picks the work up."""
WORKER_LOOK_S = 2.0
"""Seconds between two looks at the cluster's workers while a step waits for its tasks."""
WORKER_PRELOAD = "pipelines.worker_preload"
"""Module every dask worker imports as it starts, so its first task does not pay for it."""
DASK_MALLOC_VARIABLE = "MALLOC_TRIM_THRESHOLD_"
"""Left out of the environment dask gives local worker processes (the rest is kept).

dask sets it to 64 KiB for every worker it spawns. Setting it also freezes glibc's mmap
threshold at 128 KiB, so every larger buffer is mapped, faulted in page by page and unmapped
again: generating one city-year's sources then spent as long in the kernel as in Python (3.1
million page faults for three city-years, against 71 thousand without it). Processing bounds
its own memory (``citycube.processing.memory``) and needs neither."""


def start_local_cluster(workers: int, scheduler_port: int = 0) -> Any:
    """A ``LocalCluster`` of single-threaded worker processes that import the work stack as
    they start; its workers come up in the background (``scale``), so the caller can go on.
    ``scheduler_port``: the scheduler's port on 127.0.0.1 (0: any free one)."""
    import dask
    from dask.distributed import LocalCluster

    # Set for the process, not a block: the nannies read it when ``scale`` creates them.
    key = "distributed.nanny.pre-spawn-environ"
    environ = {k: v for k, v in dask.config.get(key).items() if k != DASK_MALLOC_VARIABLE}
    dask.config.set({key: environ})
    cluster = LocalCluster(
        n_workers=0,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,
        preload=[WORKER_PRELOAD],
        host="127.0.0.1",
        scheduler_port=scheduler_port,
    )
    cluster.scale(workers)
    return cluster


class CubeResource(dg.ConfigurableResource):
    """The release being built, its sources and its catalogue; tests point it elsewhere."""

    data_root: str = "data"
    release_version: str = DEFAULT_RELEASE
    chip_format: str = ""
    """How chip stores are written: 'icechunk' or 'zarr'; empty: CITYCUBE_CHIPS, else
    icechunk (``BUILD_CHIP_FORMAT``)."""
    source_set: str = ""
    """Source-set YAML (which adapter serves each product); empty: CITYCUBE_SOURCE_SET, else
    the packaged default, every product from the offline sample family."""

    def release(self) -> Release:
        """The release being built; a final (frozen) release is refused, naming a new version.

        Every asset that asks for it writes into it (or, for sources, for it), so a run
        launched from the UI cannot change a release someone cites either.
        """
        from citycube.cube.releases import ensure_writable

        return ensure_writable(
            Release(
                Path(self.data_root).resolve(),
                self.release_version,
                self.chip_format or os.environ.get(CHIP_FORMAT_ENV) or BUILD_CHIP_FORMAT,
            )
        )

    def sources(self) -> SourceSet:
        """One adapter per product, as the source-set spec says."""
        return resolve_sources(self.sources_for_tasks())

    def sources_for_tasks(self) -> SourceSet | SourceSetSpecFile:
        """What steps hand to their tasks: the spec file, which each worker builds once."""
        return SourceSetSpecFile(self.source_set or os.environ.get(SOURCE_SET_ENV, ""))

    def catalogue(self) -> Catalogue:
        """The validated modality catalogue."""
        return load_catalogue()


def default_cube_resource() -> CubeResource:
    """Resource bound in Definitions, read from the environment at run time."""
    return CubeResource(
        data_root=dg.EnvVar("CITYCUBE_DATA"),
        release_version=dg.EnvVar("CITYCUBE_RELEASE"),
    )


@dataclass(frozen=True)
class Outcome:
    """What one partition's task gave: a result, or the error it raised."""

    key: str
    """Partition key."""
    result: Any = None
    error: BaseException | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the task finished without an error."""
        return self.error is None


class ComputeResource(dg.ConfigurableResource):
    """Where partition work runs: in the step's process, on a local dask cluster, or on a
    running dask scheduler.

    A step hands this resource one task per partition it materialises. With one worker (or one
    task) the tasks run in the step's own process; with more, they go to a dask
    ``LocalCluster`` that this resource starts for the run, or to the scheduler at
    ``scheduler``. Empty settings are read when the run starts from ``CITYCUBE_DASK_SCHEDULER``
    and ``CITYCUBE_WORKERS`` (``citycube build`` sets both for the runs it starts).
    """

    scheduler: str = ""
    """Address of a running dask scheduler; empty: start a LocalCluster when workers > 1."""
    workers: int = 0
    """Worker processes of the local cluster; 0: CITYCUBE_WORKERS, or 1."""
    no_worker_wait_s: float = NO_WORKER_WAIT_S
    """Seconds a step waits while the cluster has no worker before it fails (CC310)."""
    _client: Any = PrivateAttr(default=None)
    _cluster: Any = PrivateAttr(default=None)

    def settings(self) -> tuple[str, int]:
        """The scheduler address and worker count in effect."""
        scheduler = self.scheduler or os.environ.get(SCHEDULER_ENV, "")
        workers = self.workers or int(os.environ.get(WORKERS_ENV, "1") or 1)
        return scheduler, max(1, workers)

    def _dask_client(self, log: logging.Logger | Any = None) -> Any:
        if self._client is None:
            from dask.distributed import Client

            scheduler, workers = self.settings()
            if scheduler:
                self._client = Client(scheduler, timeout="30s")
            else:
                self._cluster = start_local_cluster(workers)
                self._client = Client(self._cluster)
            (log or logging.getLogger(__name__)).info(
                describe_cluster(self._client, external=bool(scheduler))
            )
        return self._client

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Close the client, and the cluster this resource started."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def run(
        self,
        log: logging.Logger | Any,
        label: str,
        function: Callable[..., Any],
        tasks: Sequence[tuple[str, tuple[Any, ...]]],
        started: float | None = None,
        first: bool = False,
    ) -> list[Outcome]:
        """Run ``function(*args)`` for every (partition key, args) task; one outcome each.

        A failing task does not stop the others. Progress goes to ``log`` every few seconds.
        On a shared cluster tasks run in the order of ``started`` (a Unix time, default now),
        earliest first, except that ``first`` tasks go ahead of all others.
        """
        scheduler, workers = self.settings()
        progress = _Progress(log, label, len(tasks))
        if not tasks:
            return []
        if not scheduler and (workers <= 1 or len(tasks) <= 1):
            return [progress.add(_run_inline(key, function, args)) for key, args in tasks]
        return self._run_on_dask(function, tasks, progress, started, first)

    def _run_on_dask(
        self,
        function: Callable[..., Any],
        tasks: Sequence[tuple[str, tuple[Any, ...]]],
        progress: _Progress,
        started: float | None = None,
        first: bool = False,
    ) -> list[Outcome]:
        from dask.distributed import as_completed

        client = self._dask_client(progress.log)
        watch = WorkerWatch(client, progress.log, self.no_worker_wait_s)
        # First started, first run: several runs share the workers, and a run whose tasks all
        # finish early frees its slot in the run queue for the next one while the others'
        # tasks keep the workers busy. Interleaved, every run would end at about the same time
        # and the workers would wait while the next runs start. Steps pass their run's start,
        # so a run's later steps go ahead of the steps of runs that started after it.
        priority = task_priority(started, first)
        began = time.monotonic()
        shared = _broadcast_shared(client, [args for _, args in tasks])
        futures = {
            client.submit(
                _timed,
                function,
                *[shared.get(id(arg), arg) for arg in args],
                pure=False,
                key=f"{progress.label}-{key}-{i}",
                priority=priority,
            ): key
            for i, (key, args) in enumerate(tasks)
        }
        outcomes: list[Outcome] = []
        try:
            finished = as_completed(futures, with_results=False)
            while len(outcomes) < len(futures):
                batch = finished.next_batch(block=False)
                if not batch:
                    watch.look()  # raises NoWorkersError once the cluster has been empty too long
                    time.sleep(0.05)
                    continue
                for future in batch:
                    key = futures[future]
                    try:
                        result, seconds = future.result()
                        outcome = Outcome(key, result=result, seconds=seconds)
                    except Exception as exc:
                        outcome = Outcome(key, error=exc, seconds=time.monotonic() - began)
                    outcomes.append(progress.add(outcome))
        finally:
            pending = [f for f in futures if not f.done()]
            if pending:  # interrupted: nothing more is started for this step
                client.cancel(pending)
        return outcomes


def describe_cluster(client: Any, external: bool) -> str:
    """One line about the cluster a run sends work to: scheduler, workers, dashboard."""
    workers = sorted(client.nthreads())
    kind = "dask scheduler" if external else "dask LocalCluster of this run, scheduler"
    dashboard = _dashboard(client)
    return (
        f"{kind} {client.scheduler.address} with {len(workers)} worker(s)"
        + (f": {', '.join(workers)}" if workers else " (waiting for one)")
        + (f"; dashboard {dashboard}" if dashboard else "")
    )


def _dashboard(client: Any) -> str:
    """The dask dashboard's address, when the scheduler serves one (bokeh installed)."""
    try:
        services = client.scheduler_info().get("services", {})
    except Exception:
        return ""
    return client.dashboard_link if "dashboard" in services else ""


class WorkerWatch:
    """Follows a cluster's workers while a step waits: logs each one lost or joined, and fails
    the step (CC310) when the cluster has had none for ``wait`` seconds."""

    def __init__(self, client: Any, log: Any, wait: float = NO_WORKER_WAIT_S) -> None:
        self.client, self.log, self.wait = client, log, wait
        self.known = set(client.nthreads())
        self.empty_since: float | None = None if self.known else time.monotonic()
        self.last = time.monotonic()

    def look(self) -> None:
        """Compare the workers with the last look (at most every ``WORKER_LOOK_S``)."""
        now = time.monotonic()
        if now - self.last < WORKER_LOOK_S and self.empty_since is None:
            return
        self.last = now
        workers = set(self.client.nthreads())
        for lost in sorted(self.known - workers):
            self.log.warning(f"dask worker {lost} lost; {len(workers)} left")
        for joined in sorted(workers - self.known):
            self.log.info(f"dask worker {joined} joined; {len(workers)} now")
        self.known = workers
        if workers:
            self.empty_since = None
            return
        if self.empty_since is None:
            self.empty_since = now
            self.log.warning(
                f"the dask cluster at {self.client.scheduler.address} has no worker left; "
                f"waiting up to {self.wait:.0f} s for one"
            )
        elif now - self.empty_since >= self.wait:
            raise NoWorkersError(
                f"the dask cluster at {self.client.scheduler.address} has had no worker for "
                f"{self.wait:.0f} s; start workers (`dask worker "
                f"{self.client.scheduler.address}`) or unset CITYCUBE_DASK_SCHEDULER to use a "
                "local cluster, then materialise the failed partitions again"
            )


def _broadcast_shared(client: Any, arguments: Sequence[tuple[Any, ...]]) -> dict[int, Any]:
    """Send each large argument that every task of a step shares (the modality catalogue, for
    one) to the workers once; {id of the object: its dask future}.

    Passed as it is, it would be pickled into every task by the run, and unpickled for every
    task by the scheduler: 20 KB times tens of thousands of tasks in a whole-calendar build.
    """
    if len(arguments) < 2:
        return {}
    common = {id(arg): arg for arg in arguments[0]}
    for args in arguments[1:]:
        common = {key: arg for key, arg in common.items() if any(a is arg for a in args)}
    large = {key: arg for key, arg in common.items() if _pickled_size(arg) >= SHARED_ARGUMENT_BYTES}
    return {key: client.scatter(arg, broadcast=True, hash=False) for key, arg in large.items()}


def _pickled_size(value: Any) -> int:
    """Bytes of ``value`` pickled; 0 when plain pickle cannot take it (dask's cloudpickle can,
    and then it travels with each task as before)."""
    try:
        return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return 0


def task_priority(started: float | None, first: bool) -> int:
    """Dask priority (higher runs first) of a step's tasks: ``first`` steps ahead of all
    others, then steps of runs that started earlier (``started``, a Unix time; None: now)."""
    priority = -round((time.time() if started is None else started) * 1000)
    return priority + FIRST_PRIORITY_BOOST if first else priority


def _timed(function: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """Run one partition's task on a worker; (its result, seconds).

    A worker runs one task at a time. Any dask collection the task computes is computed right
    there (dask's synchronous scheduler): inside a worker dask would otherwise default to the
    cluster's client, ship the pieces to other workers and let this worker start another task
    while it waits — two tasks on one core, and their arrays sent over the network.
    """
    import dask

    start = time.monotonic()
    with dask.config.set(scheduler="synchronous"):
        result = function(*args)
    return result, time.monotonic() - start


def _run_inline(key: str, function: Callable[..., Any], args: tuple[Any, ...]) -> Outcome:
    start = time.monotonic()
    try:
        return Outcome(key, result=function(*args), seconds=time.monotonic() - start)
    except Exception as exc:
        return Outcome(key, error=exc, seconds=time.monotonic() - start)


class _Progress:
    """Progress lines of a step: partitions done out of all, failures, elapsed time."""

    def __init__(self, log: Any, label: str, total: int) -> None:
        self.log, self.label, self.total = log, label, total
        self.done = self.failed = 0
        self.task_seconds = 0.0
        self.start = self.last = time.monotonic()

    def add(self, outcome: Outcome) -> Outcome:
        self.done += 1
        if outcome.ok:  # a failure's seconds count from the step's start, not the task's
            self.task_seconds += outcome.seconds
        now = time.monotonic()
        if not outcome.ok:
            self.failed += 1
            self.log.error(f"{self.label} {outcome.key}: {outcome.error}")
        if self.done == self.total or now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            failed = f", {self.failed} failed" if self.failed else ""
            self.log.info(
                f"{self.label}: {self.done}/{self.total} partitions{failed} "
                f"({now - self.start:.1f}s, {self.task_seconds:.1f}s of task time)"
            )
        return outcome
