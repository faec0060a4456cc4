"""`citycube build` killed with SIGKILL at random points of its writes, then built again, twice.

One scenario, in order (Amsterdam 2024 with two dask workers: about 60 partition writes of
sources, derived results, chips and observations, then the cube):

1. the driver's whole process group is killed at a random point among the first twenty
   partition writes; then the driver alone (as the OOM killer would), at a random point among
   the next twenty (counted on disk, moments within a write drawn too). After each kill no
   process of the build survives a short grace period, and every partition a reader can see
   is whole;
2. the same command completes: the earlier builds' runs and backfills left open are closed
   (failed or canceled, none STARTED), the cube checks pass and ``citycube verify`` too;
3. a derived result and a source file are damaged, and the same command is run again while
   a second build of overlapping years on the same release starts: the second is refused
   clearly, the rerun detects the damage instead of copying it, and every file of the
   release has the hash it had (apart from files that record the build time; an icechunk
   chip store is compared by its content, as its file names are random).

This is the suite's slowest test: four builds, two of them complete. On this project's
two-core machine it took 117–129 s alone and 300 s at a load of 7–10, 467 s at 15–20.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import duckdb
import psutil
import pyarrow.parquet as pq
import pytest

from citycube.catalogue.cities import SCALES
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.chips import open_chips
from citycube.cube.chips_zarr import ICECHUNK_SUFFIX
from citycube.cube.manifest import TIMESTAMPED_FILES, content_digests, verify_release
from citycube.cube.release import Release
from citycube.grid.tiles import city_grid

pytestmark = pytest.mark.e2e(builds=4)

REPO_ROOT = Path(__file__).resolve().parents[1]
CITY, YEAR, RELEASE = "Amsterdam", 2024, "killed"
SEED = int(os.environ.get("CITYCUBE_KILL_SEED", "20261201"))
"""Seeds the kill moments; set CITYCUBE_KILL_SEED to explore others."""
GRACE_S = 15.0
"""How long a killed build's processes may take to end."""
UNFINISHED = {
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
}


class Build:
    """One `citycube build` in its own session, its output collected as it comes."""

    def __init__(self, tmp_path: Path, home: str, years: str) -> None:
        command = [sys.executable, "-m", "pipelines.cli", "--data", str(tmp_path / "data")]
        command += ["--release", RELEASE, "build", "--cities", CITY, "--years", years]
        env = {**os.environ, "DAGSTER_HOME": str(tmp_path / home)}
        env.pop("CITYCUBE_DASK_SCHEDULER", None)
        self.process = subprocess.Popen(
            [*command, "--workers", "2"],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 180) -> re.Match[str]:
        """The first output line matching ``pattern``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                found = re.search(pattern, line)
                if found:
                    return found
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r}:\n{self.output}")

    def driver(self) -> psutil.Process:
        """The driver process, named by the build log's file name."""
        return psutil.Process(int(self.wait_for(r"logs/build-(\d+)-\d+\.log").group(1)))

    def finish(self, timeout: float = 600) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The processes that still run (a zombie has ended: it only waits to be reaped)."""
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    return alive


def partition_writes(release: Release) -> int:
    """Partitions written whole so far: source items, derived results, chip stores and
    observation partitions (each under its real name only once whole)."""
    whole = (
        *release.data_root.glob("sources/*/*/*/_complete.json"),
        *release.draft_dir.glob("derived/*/*/*.parquet"),
        *release.root.glob(f"chips/*/*/*{ICECHUNK_SUFFIX}"),
        *release.draft_dir.glob("observations/city=*/year=*/*.parquet"),
    )
    return len(whole)


def _kill_and_check_nothing_survives(
    build: Build, release: Release, after_writes: int, within_s: float, whole_group: bool
) -> int:
    """Kill the build ``within_s`` seconds after its ``after_writes``-th partition write
    (counted on disk, earlier builds' included); the writes done when it was killed."""
    driver = build.driver()
    deadline = time.monotonic() + 300
    while partition_writes(release) < after_writes:
        assert build.process.poll() is None, f"the build ended first:\n{build.output}"
        assert time.monotonic() < deadline, f"no {after_writes} writes:\n{build.output}"
        time.sleep(0.05)
    time.sleep(within_s)
    tree = [driver, *driver.children(recursive=True)]
    assert len(tree) > 1, f"the build had not started its processes:\n{build.output}"
    if whole_group:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver leads its own session and group
    else:
        driver.send_signal(signal.SIGKILL)
    assert build.finish(timeout=60) == 128 + signal.SIGKILL
    assert "The build was killed (SIGKILL)" in build.output
    deadline = time.monotonic() + GRACE_S
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    survivors = _alive(tree)
    for process in survivors:  # do not leave them running, whatever the verdict
        process.kill()
    described = [" ".join(p.cmdline())[:120] for p in survivors if p.is_running()]
    assert not survivors, f"processes outlived the killed build: {described}"
    return partition_writes(release)


def _expected_rows(code: str) -> int:
    tiles = sum(city_grid(CITY, scale).n_tiles for scale in SCALES)
    return tiles * len(load_catalogue().get(code).fields)


def _assert_readers_see_only_whole_partitions(release: Release) -> None:
    """Every file a reader finds under its real name is whole; DuckDB, if published, reads."""
    for path in release.published_root.glob("observations/city=*/year=*/*.parquet"):
        table = pq.read_table(path, page_checksum_verification=True)
        assert table.num_rows == _expected_rows(path.stem), path
    for path in release.draft_dir.glob("derived/*/*/*.parquet"):
        table = pq.read_table(path, page_checksum_verification=True)
        assert table.num_rows == _expected_rows(path.parent.parent.name), path
    for store in release.root.glob("chips/*/*/*.zarr"):
        assert json.loads((store / "zarr.json").read_text())["zarr_format"] == 3, store
    for store in release.root.glob("chips/*/*/*.icechunk"):  # what a build writes by default
        with open_chips(store) as chips:  # its last commit, whole
            assert chips["valid"].shape == chips["data"].shape[1:], store
    sources = release.data_root / "sources"
    for record in sources.glob("*/*/*"):  # items are whole or absent
        if not any(part.startswith(".") for part in record.relative_to(sources).parts):
            assert (record / "_complete.json").exists(), record
    for fetched in sources.glob(".fetched/*/*/*.json"):  # fetch records: written whole
        outcome = json.loads(fetched.read_text())
        assert outcome["format"] == 1, fetched
        assert outcome["item"] is not None or outcome["missing_reason"], fetched  # or why not
    if release.duckdb_file.exists():
        with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
            con.sql("SELECT count(*) FROM observations").fetchall()


def _instance(tmp_path: Path, home: str) -> dg.DagsterInstance:
    from dagster._core.instance.ref import InstanceRef

    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path / home)))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_killed_builds_leave_no_process_nor_partial_partition_and_reruns_agree(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    release = Release(tmp_path / "data", RELEASE)

    # 1. Two kills at random points of the build's partition writes: the whole group among
    # the first twenty, then the driver alone among the next twenty (of about sixty).
    written = 0
    for whole_group in (True, False):
        build = Build(tmp_path, "home", str(YEAR))
        after = written + rng.randint(1, 20)
        written = _kill_and_check_nothing_survives(
            build, release, after, rng.uniform(0.0, 1.0), whole_group
        )
        _assert_readers_see_only_whole_partitions(release)
        assert written >= after
        print(f"killed {'the group' if whole_group else 'the driver'} at {written} writes")

    # 2. The same command completes and closes what the killed builds left open.
    build = Build(tmp_path, "home", str(YEAR))
    assert build.finish() == 0, build.output
    assert "check unique_keys: PASS" in build.output
    total = partition_writes(release)
    print(f"the complete build: {total} writes")
    assert total > 40  # both kill points fell inside the build's writes
    assert verify_release(release).ok
    with _instance(tmp_path, "home") as instance:
        runs = instance.get_runs()
        backfills = instance.get_backfills()  # newest first
    assert not [r.run_id for r in runs if r.status in UNFINISHED]
    last = backfills[0].tags["citycube/build"]
    finished = [b.status.value for b in backfills if b.tags["citycube/build"] == last]
    killed = {b.status.value for b in backfills if b.tags["citycube/build"] != last}
    assert finished == ["COMPLETED_SUCCESS"] * 2, build.output  # its two backfills
    assert killed <= {"CANCELED", "COMPLETED_SUCCESS"}, build.output  # none left open

    # 3. Damaged caches, a rerun and, at once, a second build of overlapping years.
    first = content_digests(release)
    _flip_a_byte(release.derived_file("CO2", CITY, str(YEAR)))
    _flip_a_byte(next(release.data_root.glob(f"sources/odiac/{CITY}/{YEAR}/*.tif")))
    rerun = Build(tmp_path, "home", str(YEAR))
    rerun.wait_for("^Building release")  # it holds the release's build lock
    second = Build(tmp_path, "other-home", f"{YEAR}-{YEAR + 1}")
    assert second.finish(timeout=120) == 2, second.output
    assert f"[CC305] release {RELEASE} in " in second.output
    assert "is in use by another build" in second.output and "Traceback" not in second.output
    assert rerun.finish() == 0, rerun.output
    again = content_digests(release)  # an icechunk store by its content, not its files
    assert set(again) == set(first)
    changed = sorted(name for name in first if first[name] != again[name])
    assert set(changed) <= TIMESTAMPED_FILES, changed
    assert verify_release(release).ok
