"""Dagster's daemon, loaded ahead of need: ``python -m pipelines.standby_daemon -w WORKSPACE``.

A build restarts Dagster's daemon whenever a backfill needs a look sooner than the daemon's
fixed 30 s period (pipelines/daemon.py). Most of a daemon's start is importing it: 2.6 s of an
idle core, more on a busy machine, and the build waits for that on each of its few restarts.
This process imports the ``dagster-daemon`` command as it is installed (its console-script
entry point), then waits for one line on its standard input: ``run`` starts the daemon on the
given arguments, as ``dagster-daemon run ARGS`` would; anything else, or the end of the input
(its build ended or was killed), ends it without starting anything.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

GO = "run"
"""The line that starts the daemon."""
COMMAND = "dagster-daemon"


def main(argv: list[str]) -> int:
    """Import Dagster's daemon command, then run it on ``argv`` once told to."""
    (entry_point,) = entry_points(group="console_scripts", name=COMMAND)
    daemon_command = entry_point.load()
    if sys.stdin.readline().strip() != GO:
        return 0
    sys.argv = [COMMAND, "run", *argv]
    return daemon_command()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
