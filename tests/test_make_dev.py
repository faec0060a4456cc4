"""`make dev` stops whole: after SIGTERM to `make` (what a service manager or `kill` sends) or
Ctrl-C (SIGINT to the terminal's process group), no webserver, daemon or code server is left
a few seconds later."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from pipelines.dev import STOP_GRACE_S
from pipelines.ports import free_loopback_port

REPO = Path(__file__).resolve().parent.parent
STARTUP_S = 240.0
"""Longest wait for the UI to answer on a loaded machine."""
STOPPED_WITHIN_S = STOP_GRACE_S + 12.0
"""Dagster's own shutdown, then the grace, then the kill and the reaping."""

pytestmark = pytest.mark.e2e


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


@pytest.mark.parametrize("stop", ["SIGTERM to make", "Ctrl-C"])
def test_make_dev_stops_every_process(tmp_path: Path, stop: str) -> None:
    port = free_loopback_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "CITYCUBE_DATA": str(tmp_path / "data"),
    }
    make = subprocess.Popen(
        ["make", "dev", f"DEV_PORT={port}", "WORKERS=2"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a terminal's process group of its own, as in a shell
    )
    started: set[int] = set()
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert make.poll() is None, make.stdout.read()  # type: ignore[union-attr]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).is_success:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the UI did not answer"
            time.sleep(1)
        started = descendants(make.pid)
        commands = " ".join(Path(f"/proc/{p}/cmdline").read_text() for p in started if alive(p))
        assert "dagster_webserver" in commands and "code-server" in commands
        assert "multiprocessing" in commands  # the shared cluster's worker processes

        if stop == "Ctrl-C":
            os.killpg(make.pid, signal.SIGINT)
        else:
            make.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        while (left := [p for p in started if alive(p)]) and (
            time.monotonic() - sent < STOPPED_WITHIN_S
        ):
            time.sleep(0.5)
        assert not left, f"still running {time.monotonic() - sent:.0f} s after {stop}: {left}"
        make.wait(timeout=10)
    finally:
        for pid in started | descendants(make.pid) | {make.pid}:  # left ones are adopted
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        make.wait()
