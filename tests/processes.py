"""Helpers for the loopback server processes tests start."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen, timeout: float = 10) -> None:
    """Stop a loopback server process: SIGTERM, then SIGKILL if it is still there after
    ``timeout`` seconds (a loaded machine has been seen to leave one running past that)."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
