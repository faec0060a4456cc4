"""The Dagster processes a build runs its backfills with: code server, webserver, daemon.

A build serves its code from one ``dagster api grpc`` server for all of them, so the
definitions are loaded once: a ``dagster-webserver`` answers the build's GraphQL requests
(pipelines/graphql.py; and shows the build in Dagster's UI while it runs) and Dagster's own
daemon, ``dagster-daemon run``, runs the backfills and, through the queued run coordinator,
their runs, which the code server launches. The webserver and the daemon load a workspace file
that points at the code server.

Dagster's backfill daemon looks at the backfills once at start and then every 30 seconds, a
period fixed in Dagster (``dagster.yaml`` has no setting for it). A build's backfill needs a
look at a few moments only: when it is submitted, when runs that other partitions wait on have
ended, and at its end. At such a moment, unless the next look is due within a few seconds, the
build restarts the daemon, whose first look is immediate: the old daemon ends its look in
progress first (SIGTERM), so two never look at once. The runs are not the daemon's children (the
code server starts them) and queued ones wait for the next daemon, a second or two. The next
daemon is loaded ahead, while runs compute (pipelines/standby_daemon.py): its start is then a
second, not the three seconds of importing it.

Both processes are the build driver's children, in its process group: killed with it by
pipelines/lifetime.py (the code server loads the definitions, which watch the driver).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipelines.graphql import DagsterGraphQL
from pipelines.ports import LOOPBACK, free_loopback_port
from pipelines.standby_daemon import GO

LOCATION_NAME = "citycube"
"""The code location's name, as in workspace.yaml."""
LOOK_PERIOD_S = 30.0
"""Seconds between two looks of Dagster's backfill daemon at the backfills (fixed in Dagster)."""
RESTART_S = 4.0
"""A wanted look due sooner than this is waited for; later, the daemon is restarted."""
STOP_WAIT_S = 60.0
"""Longest wait for a stopped process to end (the daemon ends its look in progress first)."""
RELOAD_AFTER_S = 20.0
"""Seconds the webserver may show the code location unreachable before it is asked to reload."""
CLOSE_WAIT_S = 5.0
"""At a build's end, seconds its Dagster processes get to end before they are killed (a code
server waits for its open requests, a daemon for its threads: 10–15 s on a loaded machine)."""
SERVER_START_S = 600.0
"""Longest wait for the code server and the webserver to answer (a loaded machine is slow)."""
OWN_DAEMONS_FILE = ".citycube-daemons"
"""In DAGSTER_HOME: ids of the daemons builds ran (their heartbeats are not a `make dev`'s)."""


def _command(name: str) -> str:
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else name


class BuildServices:
    """A build's code server and daemon: started, restarted and stopped by the build."""

    def __init__(self, home: Path, cwd: Path) -> None:
        self.home = home
        self.cwd = cwd
        self.folder = Path(tempfile.mkdtemp(prefix="citycube-"))  # short: a socket path
        self.socket = self.folder / "code.sock"
        self.workspace = self.folder / "workspace.yaml"
        self.code_server: subprocess.Popen[bytes] | None = None
        self.webserver: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.daemon: subprocess.Popen[bytes] | None = None
        self.standby: subprocess.Popen[bytes] | None = None
        """The next daemon, loaded and waiting to start (pipelines/standby_daemon.py)."""
        self.daemon_started = 0.0
        """time.time() of the running daemon's start (its first look)."""
        self.first_started = 0.0
        self.noted: set[str] = set()

    @property
    def url(self) -> str:
        """The build's Dagster UI."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def graphql(self) -> DagsterGraphQL:
        """GraphQL requests to the build's webserver."""
        return DagsterGraphQL(self.workspace, url=f"{self.url}/graphql")

    def start_servers(self) -> None:
        """Start serving the definitions (with this process's environment) and the webserver;
        returns once the webserver has the code location loaded."""
        self.workspace.write_text(
            "load_from:\n  - grpc_server:\n"
            f"      socket: {self.socket}\n      location_name: {LOCATION_NAME}\n",
            encoding="utf-8",
        )
        command = [_command("dagster"), "api", "grpc", "-m", "pipelines.definitions"]
        command += ["--socket", str(self.socket), "--location-name", LOCATION_NAME]
        self.code_server = subprocess.Popen(command, cwd=self.cwd)
        self.prepare_daemon()  # loads while the servers start
        deadline = time.monotonic() + SERVER_START_S
        while True:
            self._start_webserver()
            if self._wait_for_location(deadline):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Dagster's webserver or code server did not start in {SERVER_START_S:.0f}s "
                    "(see the log)"
                )

    def _start_webserver(self) -> None:
        if self.webserver is not None:
            _stop(self.webserver)
        self.port = free_loopback_port()
        command = [_command("dagster-webserver"), "-w", str(self.workspace)]
        command += ["-h", LOOPBACK, "-p", str(self.port), "--log-level", "warning"]
        self.webserver = subprocess.Popen(command, cwd=self.cwd)

    def _wait_for_location(self, deadline: float) -> bool:
        """Wait until the webserver answers with the code location loaded, reloading it while
        the code server starts; False if the webserver ended (e.g. its port was taken)."""
        from pipelines.graphql import GraphQLError

        graphql = self.graphql
        reloaded = time.monotonic()
        while time.monotonic() < deadline:
            if self.webserver is None or self.webserver.poll() is not None:
                return False
            if self.code_server is not None and self.code_server.poll() is not None:
                raise RuntimeError("Dagster's code server ended at start (see the log)")
            try:
                error = graphql.location_error(LOCATION_NAME)
            except (GraphQLError, OSError):  # not answering yet
                time.sleep(0.2)
                continue
            if error is None:
                return True
            time.sleep(0.3)
            # The webserver loads the location again by itself once the code server answers;
            # a reload is only asked for when that has not happened for a while (each makes
            # the code server load the definitions anew).
            if time.monotonic() - reloaded > RELOAD_AFTER_S:
                reloaded = time.monotonic()
                with contextlib.suppress(GraphQLError, OSError):
                    graphql.reload_location(LOCATION_NAME)
        return False

    def prepare_daemon(self) -> None:
        """Load the next daemon ahead of its start (pipelines/standby_daemon.py), unless one
        is loaded already: best while runs compute, not while one is being launched (its
        process loads the definitions at the same time)."""
        if self.standby is not None and self.standby.poll() is None:
            return
        command = [sys.executable, "-m", "pipelines.standby_daemon", "-w", str(self.workspace)]
        self.standby = subprocess.Popen(command, cwd=self.cwd, stdin=subprocess.PIPE)

    def start_daemon(self) -> None:
        """Start Dagster's daemon on the build's workspace: it looks at the backfills at once.

        The daemon loaded ahead (:meth:`prepare_daemon`) starts, else a new one."""
        if self.daemon is not None:
            self.stop_daemon()
        self.daemon_started = time.time()
        self.first_started = self.first_started or self.daemon_started
        standby, self.standby = self.standby, None
        if standby is not None and standby.poll() is None and _tell(standby, GO):
            self.daemon = standby
        else:
            command = [_command("dagster-daemon"), "run", "-w", str(self.workspace)]
            self.daemon = subprocess.Popen(command, cwd=self.cwd)

    def restart_daemon(self) -> None:
        """A look at the backfills now: a new daemon (after the old one's end)."""
        self.start_daemon()

    def note_heartbeats(self, instance: object) -> None:
        """Record the ids of this build's daemons, once they heartbeat (see daemon_serves)."""
        if self.first_started:
            self.noted |= note_own_daemons(instance, self.home, self.first_started, self.noted)

    def next_look_in(self) -> float:
        """Seconds until the running daemon looks at the backfills again (inf: none runs)."""
        if self.daemon is None or self.daemon.poll() is not None:
            return float("inf")
        since = time.time() - self.daemon_started
        return LOOK_PERIOD_S - since % LOOK_PERIOD_S

    def look_soon(self) -> bool:
        """Make sure the daemon looks at the backfills within RESTART_S; True if restarted."""
        if self.next_look_in() <= RESTART_S:
            return False
        self.restart_daemon()
        return True

    def stop_daemon(self) -> None:
        if self.daemon is not None:
            _stop(self.daemon)
            self.daemon = None

    def close(self) -> None:
        """Stop the daemon, the webserver and the code server, together; SIGKILL for those
        not ended after CLOSE_WAIT_S (the build has ended: nothing of theirs is in flight)."""
        if self.standby is not None:
            _tell(self.standby, "")  # never started: it ends at the end of its input
        services = (self.daemon, self.standby, self.webserver, self.code_server)
        processes = [p for p in services if p is not None]
        self.daemon = self.standby = self.webserver = self.code_server = None
        _stop(*processes, wait=CLOSE_WAIT_S)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> BuildServices:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _tell(process: subprocess.Popen[bytes], line: str) -> bool:
    """Send a standby daemon its one line and close its input; False if it has ended."""
    assert process.stdin is not None
    try:
        if line:
            process.stdin.write(f"{line}\n".encode())
        process.stdin.close()
    except (BrokenPipeError, ValueError):
        return False
    return True


def _stop(*processes: subprocess.Popen[bytes], wait: float = STOP_WAIT_S) -> None:
    """SIGTERM, and SIGKILL to those that have not ended after ``wait`` seconds."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + wait
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def note_own_daemons(
    instance: object, home: Path, since: float, known: set[str] | frozenset[str] = frozenset()
) -> set[str]:
    """Record the ids of daemons heartbeating since ``since`` (a build's own) in DAGSTER_HOME;
    every id of those, with ``known`` (ids recorded before)."""
    beats = instance.get_daemon_heartbeats()  # type: ignore[attr-defined]
    ids = {b.daemon_id for b in beats.values() if b.timestamp >= since}
    new = ids - set(known)
    if new:
        with open(home / OWN_DAEMONS_FILE, "a", encoding="utf-8") as file:
            file.writelines(f"{daemon_id}\n" for daemon_id in sorted(new))
    return ids | set(known)


def daemon_process_running(home: Path) -> bool:
    """Whether a ``dagster-daemon`` process (e.g. `make dev`'s) runs for DAGSTER_HOME ``home``.

    A heartbeat is written every 30 s and stays fresh for a minute after its daemon is gone: a
    build killed moments ago leaves one behind, and its daemon may have died before the build
    recorded it as its own. The process table tells them apart (without /proc: True, the
    heartbeat decides alone).
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    home = home.resolve()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(b"dagster-daemon" in arg for arg in argv) or b"run" not in argv:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or another user's
            continue
        for variable in environ:
            if variable.startswith(b"DAGSTER_HOME="):
                value = variable.removeprefix(b"DAGSTER_HOME=").decode(errors="replace")
                if Path(value).resolve() == home:
                    return True
    return False


def own_daemon_ids(home: Path) -> set[str]:
    """Ids of the daemons builds ran on this DAGSTER_HOME."""
    try:
        return set((home / OWN_DAEMONS_FILE).read_text(encoding="utf-8").split())
    except FileNotFoundError:
        return set()
