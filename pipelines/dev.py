"""``make dev``: Dagster's UI and daemon (``dagster dev``), stopped whole by SIGTERM or Ctrl-C.

``dagster dev`` starts a webserver, a daemon and code servers (which start run processes). Sent
SIGTERM through ``make``, only the shell in front of it was told, and all of them kept running
for minutes. So ``dagster dev`` runs here in a process group of its own, whose every member is
one of its processes: a stop request (SIGTERM, SIGINT from Ctrl-C, SIGHUP when the terminal
closes, or this process's parent ending) is passed to ``dagster dev`` as the Ctrl-C it handles
(it stops its webserver and daemon, which stop their code servers), and whatever of the group
is still alive ``STOP_GRACE_S`` seconds later is killed. Run processes that a code server
launched belong to the group too, so a run in flight is ended with them (Dagster records it as
failed at the next start). With more than one worker, the runs share one dask LocalCluster that
this process starts and closes (``shared_cluster``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipelines.ports import LOOPBACK, free_loopback_port

REPO_ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 8.0
"""Seconds ``dagster dev`` gets to stop its processes before the rest of its group is killed."""
POLL_S = 0.2
PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def dagster_dev_command(host: str, port: int) -> list[str]:
    """``dagster dev`` of this environment on the project's workspace."""
    here = Path(sys.executable).with_name("dagster")
    dagster = str(here) if here.exists() else "dagster"
    workspace = str(REPO_ROOT / "workspace.yaml")
    return [dagster, "dev", "-w", workspace, "-h", host, "-p", str(port)]


def _die_with_parent(signo: int) -> None:
    """Ask the kernel to send ``signo`` to this process when its parent ends (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signo)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(process: subprocess.Popen, grace: float = STOP_GRACE_S) -> int:
    """Stop ``dagster dev`` (its group): Ctrl-C first, SIGKILL for what is left after
    ``grace`` seconds. Returns how many seconds it took."""
    started = time.monotonic()
    pgid = process.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGINT)
    deadline = started + grace
    while time.monotonic() < deadline:
        process.poll()  # reaps dagster dev itself once it ends (a zombie still counts)
        if process.returncode is not None and not group_alive(pgid):
            break
        time.sleep(POLL_S)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    process.wait()
    while group_alive(pgid) and time.monotonic() < deadline + grace:
        time.sleep(POLL_S)  # killed members are reaped by whoever adopted them
    return round(time.monotonic() - started)


def cluster_port() -> int | None:
    """The scheduler port of the session's shared dask cluster, named to every run in
    ``CITYCUBE_DASK_SCHEDULER``; None when a scheduler is named already or there is one
    worker. Runs launched together then share the workers, as a build's do, instead of each
    starting a cluster of its own."""
    from pipelines.resources import SCHEDULER_ENV, WORKERS_ENV

    if os.environ.get(SCHEDULER_ENV) or int(os.environ.get(WORKERS_ENV, "1") or 1) <= 1:
        return None
    port = free_loopback_port()
    os.environ[SCHEDULER_ENV] = f"tcp://{LOOPBACK}:{port}"
    return port


@contextlib.contextmanager
def shared_cluster(port: int | None) -> Iterator[None]:
    """The session's dask LocalCluster on ``port`` (none when None), closed at the end."""
    if port is None:
        yield
        return
    from pipelines.resources import WORKERS_ENV, start_local_cluster

    workers = int(os.environ[WORKERS_ENV])
    cluster = start_local_cluster(workers, scheduler_port=port)
    print(f"dask: LocalCluster with {workers} workers at {cluster.scheduler_address}", flush=True)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            cluster.close(timeout=10)


def serve(host: str, port: int) -> int:
    """Run ``dagster dev`` until it ends or this process is asked to stop; its exit code."""
    stop: list[int] = []

    def on_signal(signo: int, _frame: object) -> None:
        stop.append(signo)

    for signo in STOP_SIGNALS:
        signal.signal(signo, on_signal)
    _die_with_parent(signal.SIGTERM)
    scheduler_port = cluster_port()
    # Started before the cluster, while this process has no thread besides the main one.
    process = subprocess.Popen(
        dagster_dev_command(host, port),
        cwd=REPO_ROOT,
        start_new_session=True,  # its own group: a terminal's Ctrl-C reaches it only from here
        preexec_fn=lambda: _die_with_parent(signal.SIGINT),
    )
    with shared_cluster(scheduler_port):
        while not stop and process.poll() is None:
            time.sleep(POLL_S)
        if process.returncode is not None and not stop:
            stop_group(process, grace=0.0)  # dagster dev ended: its leftovers go with it
            return process.returncode
        name = signal.Signals(stop[0]).name
        print(f"\n{name}: stopping dagster dev (webserver, daemon, code servers)", flush=True)
        seconds = stop_group(process)
        print(f"dagster dev stopped in {seconds} s", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="citycube dev", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    args = parser.parse_args(argv)
    return serve(args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
