"""Processes a build starts end with it, and two builds never share a release or an instance.

A build's driver starts a dask cluster, a Dagster code server and, through it, one process per
run, all in the driver's own process group (it leads its session). Killed with SIGKILL (the
OOM killer, ``kill -9``), it cannot stop them: the code server waited out its heartbeat for
over a minute, and a run computing in its own process kept writing partitions for a build that
no longer existed. So the driver names itself in ``CITYCUBE_BUILD_PROCESS``, which they
inherit, and a watcher thread in each of them kills the whole group once the driver is gone:
also the processes still starting up, which have no watcher yet. SIGKILL, as the driver got:
every file is written under a temporary name and moved into place, so nothing half-written
becomes visible, and the next build closes the records of the runs that were cut short.

The locks are ``flock`` locks on files in the release and in ``DAGSTER_HOME``: the kernel
drops them when the last process holding them ends, however it ends, so a killed build never
leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

BUILD_PROCESS_ENV = "CITYCUBE_BUILD_PROCESS"
"""'<pid>:<start time>' of the driver of the build that started this process."""
POLL_S = 0.5
"""Seconds between two looks at the driver."""
LOCK_FILE = ".citycube-build.lock"
"""Name of the lock file in a release directory and in DAGSTER_HOME."""

_watching = False


def process_identity(pid: int) -> str | None:
    """'<pid>:<start time>' of a live process, or None when it is gone (or a zombie).

    The start time tells a process from a later one that reuses its pid.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError:  # no /proc (not Linux): whether the pid exists is all there is
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return f"{pid}:?"
    state, *rest = stat[stat.rindex(")") + 2 :].split()
    return None if state in ("Z", "X") else f"{pid}:{rest[18]}"


def mark_build_process() -> None:
    """Name this process (the driver) as the one everything it starts must outlive not."""
    identity = process_identity(os.getpid())
    if identity is not None:
        os.environ[BUILD_PROCESS_ENV] = identity


def follow_build_process() -> bool:
    """End this process, and the build's process group, when the build's driver is gone.

    A no-op outside a build (no ``CITYCUBE_BUILD_PROCESS``, e.g. under ``make dev``) and in the
    driver itself. Returns whether a watcher runs.
    """
    global _watching
    identity = os.environ.get(BUILD_PROCESS_ENV, "")
    pid_text = identity.partition(":")[0]
    if _watching or not pid_text.isdigit() or int(pid_text) == os.getpid():
        return _watching
    _watching = True
    threading.Thread(
        target=_watch, args=(int(pid_text), identity), name="citycube-follow-build", daemon=True
    ).start()
    return True


def _watch(pid: int, identity: str) -> None:
    while process_identity(pid) in (identity, f"{pid}:?"):
        time.sleep(POLL_S)
    if os.getpgid(0) == pid:  # in the group the driver led: every process of the build
        os.killpg(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def exclusive(path: Path, holder: str) -> Iterator[int | None]:
    """Hold an exclusive lock on ``path``; yields its file descriptor, or None when another
    process holds it (``holder`` of that process is then in the file).

    The descriptor is inheritable, so a child process given it (``pass_fds``) keeps the lock
    after this process ends.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        os.set_inheritable(fd, True)
        yield fd
    finally:
        os.close(fd)


def lock_holder(path: Path) -> str:
    """What the process holding the lock at ``path`` wrote about itself."""
    with contextlib.suppress(OSError):
        return path.read_text(encoding="utf-8").strip() or "another process"
    return "another process"
