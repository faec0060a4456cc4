"""Processes a build starts end with its driver, build locks refuse a second build, and a
killed build's open runs and backfill are closed by the next one (fast, no build runs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from pipelines.build import BUILD_TAG, DRIVER_TAG, close_abandoned_builds, daemon_serves
from pipelines.cli import main
from pipelines.instance import ensure_dagster_home
from pipelines.lifetime import BUILD_PROCESS_ENV, LOCK_FILE, exclusive, process_identity

REPO_ROOT = Path(__file__).resolve().parents[1]
DRIVER = """
import subprocess, sys, time
from pipelines.lifetime import mark_build_process
mark_build_process()
follower = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
starting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(follower.pid, starting.pid, flush=True)
time.sleep(120)
"""
FOLLOWER = """
import time
from pipelines.lifetime import follow_build_process
assert follow_build_process()
time.sleep(120)
"""
HOLDER = """
import sys, time
from pathlib import Path
from pipelines.lifetime import exclusive
with exclusive(Path(sys.argv[1]), "holder") as fd:
    assert fd is not None
    print("holding", flush=True)
    time.sleep(120)
"""


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_the_processes_of_a_build_end_when_its_driver_is_killed() -> None:
    """A process that follows the driver, and one still starting (no watcher yet), both end."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, FOLLOWER],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as the build's driver: it leads its process group
    )
    try:
        assert driver.stdout is not None
        children = [int(pid) for pid in driver.stdout.readline().split()]
        time.sleep(2.0)
        assert all(process_identity(pid) for pid in children)  # the driver lives: they go on
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 10
        while any(process_identity(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in children if process_identity(pid)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)


def test_outside_a_build_nothing_is_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines import lifetime

    monkeypatch.delenv(BUILD_PROCESS_ENV, raising=False)
    assert not lifetime.follow_build_process()
    monkeypatch.setenv(BUILD_PROCESS_ENV, f"{os.getpid()}:1")  # the driver itself
    assert not lifetime.follow_build_process()


def test_a_lock_of_a_killed_holder_is_free_again(tmp_path: Path) -> None:
    lock = tmp_path / LOCK_FILE
    holder = _python(HOLDER, str(lock))
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        with exclusive(lock, "second") as fd:
            assert fd is None
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with exclusive(lock, "second") as fd:
            assert fd is not None
    finally:
        holder.kill()


@pytest.mark.parametrize("held", ["release", "home"])
def test_a_second_build_of_a_release_or_an_instance_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    held: str,
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    data = tmp_path / "data"
    lock = (data / "releases" / "r1" if held == "release" else home) / LOCK_FILE
    with exclusive(lock, "citycube build of release r1, pid 1") as fd:
        assert fd is not None
        args = ["--data", str(data), "--release", "r1", "build", "--cities", "Boston"]
        assert main([*args, "--years", "2020"]) == 2
    err = capsys.readouterr().err
    assert "[CC305]" in err and "is in use by another build: citycube build of release r1" in err
    assert "Wait for it to end" in err and "Traceback" not in err
    assert not (data / "releases" / "r1" / "published").exists()
    assert not (data / "releases" / "r1" / ".draft").exists()


def test_the_next_build_closes_what_a_killed_build_left_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs are closed through the instance, backfills canceled through Dagster's GraphQL API
    (an empty workspace: no code is needed to cancel)."""
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
    from dagster._core.instance.ref import InstanceRef

    from pipelines.graphql import DagsterGraphQL

    home = ensure_dagster_home(tmp_path / "home")
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # dagster-graphql's instance
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        statuses = {
            "started": dg.DagsterRunStatus.STARTED,
            "not-started": dg.DagsterRunStatus.NOT_STARTED,  # QUEUED needs a code origin
            "done": dg.DagsterRunStatus.SUCCESS,
        }
        for name, status in statuses.items():
            tags = {BUILD_TAG: "dead-build"}
            instance.add_run(
                dg.DagsterRun(job_name="j", run_id=f"{name}-run", status=status, tags=tags)
            )
        instance.add_run(
            dg.DagsterRun(job_name="j", run_id="ui-run", status=dg.DagsterRunStatus.STARTED)
        )
        daemons = {BUILD_TAG: "watching-build", DRIVER_TAG: "daemon"}  # `make dev` runs it
        started = dg.DagsterRunStatus.STARTED
        instance.add_run(
            dg.DagsterRun(job_name="j", run_id="daemon-run", status=started, tags=daemons)
        )
        backfill = PartitionBackfill(
            backfill_id="deadbf",
            status=BulkActionStatus.REQUESTED,
            from_failure=False,
            tags={BUILD_TAG: "dead-build"},
            backfill_timestamp=time.time(),
            serialized_asset_backfill_data=None,
            asset_selection=[],
        )
        instance.add_backfill(backfill)
        daemons = backfill._replace(backfill_id="daemonbf", tags=daemons)
        instance.add_backfill(daemons)

        graphql = DagsterGraphQL()
        assert close_abandoned_builds(instance, "new-build", graphql) == (2, 1)
        after = {r.run_id: r.status for r in instance.get_runs()}
        assert after["started-run"] == dg.DagsterRunStatus.FAILURE
        assert after["not-started-run"] == dg.DagsterRunStatus.CANCELED
        assert after["done-run"] == dg.DagsterRunStatus.SUCCESS
        assert after["ui-run"] == dg.DagsterRunStatus.STARTED  # not a build's: left alone
        assert after["daemon-run"] == dg.DagsterRunStatus.STARTED  # the daemon's to finish
        # Canceling: the daemon's next look records it canceled (no run of it is in flight).
        assert instance.get_backfill("deadbf").status == BulkActionStatus.CANCELING
        assert instance.get_backfill("daemonbf").status == BulkActionStatus.REQUESTED
        assert close_abandoned_builds(instance, "new-build", graphql) == (0, 0)


def test_a_daemon_that_a_build_ran_does_not_count_as_serving(tmp_path: Path) -> None:
    """A killed build's daemon heartbeated moments ago: the next build must run its own. A
    daemon serves when it heartbeats, is not one a build recorded, and its process runs."""
    from dagster._core.instance.ref import InstanceRef
    from dagster._daemon.types import DaemonHeartbeat

    from pipelines.daemon import note_own_daemons

    home = ensure_dagster_home(tmp_path / "home")
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    sleeper = "import time; time.sleep(120)"
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        assert not daemon_serves(instance, home)
        start = time.time()
        instance.add_daemon_heartbeat(DaemonHeartbeat(start, "BACKFILL", "builds-own", None))
        assert not daemon_serves(instance, home)  # its process is gone (a killed build's)
        # A `dagster-daemon run` for this DAGSTER_HOME (`make dev`'s), and one for another.
        other = {**env, "DAGSTER_HOME": str(tmp_path / "elsewhere")}
        elsewhere = _python(sleeper, "dagster-daemon", "run", env=other)
        try:
            time.sleep(0.5)
            assert not daemon_serves(instance, home)
        finally:
            elsewhere.kill()
        daemon = _python(sleeper, "dagster-daemon", "run", env=env)
        try:
            time.sleep(0.5)
            assert daemon_serves(instance, home)
            assert note_own_daemons(instance, home, since=start) == {"builds-own"}
            assert not daemon_serves(instance, home)  # recorded as a build's own
            later = time.time()
            instance.add_daemon_heartbeat(DaemonHeartbeat(later, "BACKFILL", "make-dev", None))
            assert daemon_serves(instance, home)
            old = later - 120
            instance.add_daemon_heartbeat(DaemonHeartbeat(old, "BACKFILL", "long-gone", None))
            assert not daemon_serves(instance, home)  # its last heartbeat is too old
        finally:
            daemon.kill()
