"""The cluster path says what it does: the scheduler and its workers when a step starts, each
worker lost on the way, and a clear error (CC310) after a set wait once no worker is left.
Workers are real ``dask worker`` processes on loopback, killed with SIGKILL."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dask.distributed import Client, LocalCluster

from citycube.errors import NoWorkersError
from pipelines.resources import ComputeResource
from tests.processes import stop_process

DASK = str(Path(sys.executable).with_name("dask"))
WORKER = ["--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"]


class Lines(logging.Handler):
    """Keeps the lines a step logs."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def log() -> Iterator[tuple[logging.Logger, Lines]]:
    logger = logging.getLogger(f"citycube-test-{time.monotonic_ns()}")
    lines = Lines()
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    yield logger, lines
    logger.removeHandler(lines)


@pytest.fixture
def scheduler() -> Iterator[str]:
    """A dask scheduler with no worker of its own (workers are started by the tests)."""
    with LocalCluster(
        n_workers=0, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


def start_workers(address: str, count: int) -> list[subprocess.Popen]:
    workers = [
        subprocess.Popen(
            [DASK, "worker", address, *WORKER],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    with Client(address, timeout="60s") as client:
        client.wait_for_workers(count, timeout=120)
    return workers


def kill_after(seconds: float, workers: list[subprocess.Popen]) -> threading.Thread:
    def kill() -> None:
        time.sleep(seconds)
        for worker in workers:
            worker.send_signal(signal.SIGKILL)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_a_lost_worker_is_reported_and_the_work_finishes_on_the_others(
    scheduler: str, log: tuple[logging.Logger, Lines]
) -> None:
    logger, lines = log
    workers = start_workers(scheduler, 2)
    try:
        compute = ComputeResource(scheduler=scheduler)
        kill_after(1.5, workers[:1])
        tasks = [(f"t{i}", (1.0,)) for i in range(6)]
        outcomes = compute.run(logger, "probe", time.sleep, tasks)
        compute.teardown_after_execution(None)  # type: ignore[arg-type]
    finally:
        for worker in workers:
            stop_process(worker)
    assert all(o.ok for o in outcomes) and len(outcomes) == 6
    text = lines.text()
    assert f"dask scheduler {scheduler} with 2 worker(s)" in text
    assert "lost; 1 left" in text


def test_with_no_worker_left_the_step_fails_with_cc307_after_the_wait(
    scheduler: str, log: tuple[logging.Logger, Lines]
) -> None:
    logger, lines = log
    workers = start_workers(scheduler, 1)
    try:
        compute = ComputeResource(scheduler=scheduler, no_worker_wait_s=3.0)
        kill_after(1.0, workers)
        started = time.monotonic()
        with pytest.raises(NoWorkersError, match="no worker for 3 s") as error:
            compute.run(logger, "probe", time.sleep, [("a", (60.0,)), ("b", (60.0,))])
        waited = time.monotonic() - started
        compute.teardown_after_execution(None)  # type: ignore[arg-type]
    finally:
        for worker in workers:
            stop_process(worker)
    assert 3.0 <= waited < 30.0
    assert error.value.code == "CC310" and scheduler in str(error.value)
    text = lines.text()
    assert "lost; 0 left" in text and "has no worker left; waiting up to 3 s" in text
