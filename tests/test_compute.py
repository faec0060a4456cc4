"""Partition work on dask: a 2-worker LocalCluster runs the tasks, errors come back intact."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from citycube.errors import SourceReadError
from pipelines.resources import ComputeResource, CubeResource, task_priority
from tests.conftest import materialize_keys

LOG = logging.getLogger("test")


def _pid_and_square(value: int) -> tuple[int, int]:
    if value < 0:
        raise SourceReadError(f"negative input {value}")
    time.sleep(0.05)  # long enough that one worker cannot finish them all before the other
    return os.getpid(), value * value


def _nested_dask(_: int) -> tuple[str, int, str | None]:
    """What a task that computes a dask collection inside a worker runs it on."""
    import dask
    import dask.array as da

    total = int(da.ones(10, chunks=5).sum().compute())
    return dask.base.get_scheduler().__name__, total, os.environ.get("MALLOC_TRIM_THRESHOLD_")


UNPICKLED = []
"""Each copy of a ``_Shared`` unpickled in this process."""


class _Shared:
    """A large argument shared by every task of a step; counts its copies where it lands."""

    def __init__(self) -> None:
        self.payload = bytes(64_000)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        UNPICKLED.append(1)


def _copies_seen(shared: _Shared, _: int) -> tuple[int, int]:
    time.sleep(0.05)
    return os.getpid(), len(UNPICKLED)


def test_tasks_run_inline_with_one_worker() -> None:
    outcomes = ComputeResource(workers=1).run(
        LOG, "t", _pid_and_square, [("a", (2,)), ("b", (-1,))]
    )
    assert [o.key for o in outcomes] == ["a", "b"]
    assert outcomes[0].result == (os.getpid(), 4)
    assert isinstance(outcomes[1].error, SourceReadError)


def test_tasks_run_on_a_two_worker_local_cluster() -> None:
    compute = ComputeResource(workers=2)
    try:
        # The cluster's workers come up in the background; on a busy machine the first one
        # could take every task before the second registers.
        compute._dask_client().wait_for_workers(2, timeout=180)
        tasks = [(str(i), (i,)) for i in range(-1, 12)]
        outcomes = {o.key: o for o in compute.run(LOG, "t", _pid_and_square, tasks)}
        workers = {o.result[0] for o in outcomes.values() if o.ok}
        assert os.getpid() not in workers and len(workers) == 2
        assert outcomes["11"].result[1] == 121
        error = outcomes["-1"].error
        assert isinstance(error, SourceReadError) and error.message == "negative input -1"
        # Collections computed inside a task stay in it (not sent back to the cluster, where
        # the worker would start another task meanwhile), and the workers keep glibc's
        # adaptive allocator (dask's default MALLOC_TRIM_THRESHOLD_ is dropped).
        nested = compute.run(LOG, "t", _nested_dask, [("n", (0,))] * 2)
        assert [o.result for o in nested] == [("get_sync", 10, None)] * 2
        # A large argument every task shares reaches each worker once, not once per task.
        shared = _Shared()
        tasks = [(str(i), (shared, i)) for i in range(16)]
        copies = [o.result for o in compute.run(LOG, "t", _copies_seen, tasks)]
        assert len(copies) == 16 and max(seen for _, seen in copies) <= 2
    finally:
        compute.teardown_after_execution(dg.build_init_resource_context())


def test_fetch_steps_go_first_then_the_steps_of_earlier_runs() -> None:
    """Several runs share the workers: a fetch step goes ahead of all processing, other steps
    in the order their runs started, whenever each step was submitted."""
    now = time.time()
    fetch_of_latest_run = task_priority(now, first=True)
    step_of_early_run = task_priority(now - 600, first=False)
    step_of_late_run = task_priority(now - 60, first=False)
    assert fetch_of_latest_run > step_of_early_run > step_of_late_run
    assert task_priority(None, first=False) <= task_priority(now, first=False)


@pytest.mark.e2e
def test_a_partition_range_builds_through_a_two_worker_local_cluster(tmp_path: Path) -> None:
    """Two city-years of a source and its derived results, as a single-run backfill does."""
    from pipelines.definitions import build_definitions

    defs = build_definitions(
        resources={
            "cube": CubeResource(data_root=str(tmp_path / "data"), release_version="t"),
            "compute": ComputeResource(workers=2),
        }
    )
    keys = ["sources/odiac", "derived/co2"]
    result = materialize_keys(
        defs,
        keys,
        resources=dict(defs.resources),  # type: ignore[arg-type]
        tags={
            "dagster/asset_partition_range_start": "Boston|2019",
            "dagster/asset_partition_range_end": "Boston|2020",
        },
    )
    assert result.success
    materialized = {
        (e.asset_key.to_user_string(), e.partition)
        for e in result.get_asset_materialization_events()
    }
    assert materialized == {(k, f"Boston|{y}") for k in keys for y in (2019, 2020)}
    derived = tmp_path / "data" / "releases" / "t" / ".draft" / "derived" / "CO2" / "Boston"
    assert sorted(p.name for p in derived.glob("*.parquet")) == ["2019.parquet", "2020.parquet"]
    table = pq.read_table(derived / "2020.parquet")
    assert set(table.column("source_id").to_pylist()) == {"sample:odiac"}
