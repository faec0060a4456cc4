"""The daemon a build loads ahead of need starts only when told to, as `dagster-daemon run`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _standby(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "pipelines.standby_daemon", *args]
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_told_to_run_it_runs_dagster_daemon_run_with_its_arguments() -> None:
    standby = _standby("--help")
    out, _ = standby.communicate("run\n", timeout=120)
    assert standby.returncode == 0, out
    # Dagster's own command parsed the arguments
    assert "dagster-daemon run [OPTIONS]" in out and "Run any daemons configured" in out


def test_its_input_ending_ends_it_without_starting_anything(tmp_path: Path) -> None:
    """A build that ends (or is killed) before it needs the daemon closes the standby's input."""
    standby = _standby("-w", str(tmp_path / "no-such-workspace.yaml"))
    out, _ = standby.communicate("", timeout=120)
    assert standby.returncode == 0, out
    assert "dagster" not in out.lower()  # nothing started, nothing said
