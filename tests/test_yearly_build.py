"""The yearly build sensor, evaluated the way Dagster's sensor daemon does (``evaluate_tick``
on a context that holds the Definitions, so every run request is resolved against the asset
graph and its partitions): before and after 15 January, stage by stage, held by a failed run,
and in a year past 2025 with a code location loaded on that day."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from citycube.catalogue.cities import load_cities
from citycube.catalogue.temporal import open_calendar
from pipelines.definitions import defs
from pipelines.schedules import (
    SENSOR_NAME,
    STAGE_TAG,
    YEAR_TAG,
    build_yearly_build,
    run_requests,
    year_stages,
)
from pipelines.selection import partitions_by_key

REPO = Path(__file__).resolve().parent.parent
CITIES = len(load_cities())
OPT = dg.AssetKey(["modalities", "opt"])
MANIFEST = dg.AssetKey(["cube", "manifest"])


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def tick(
    instance: dg.DagsterInstance, on: dt.date, cursor: str | None = None
) -> dg.SensorResult | object:
    """One evaluation of the sensor on ``on`` (what the daemon would launch, nothing launched)."""
    sensor = build_yearly_build(partitions_by_key(defs), clock=lambda: on)
    context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    return sensor.evaluate_tick(context)


def record_materialized(instance: dg.DagsterInstance, requests: list[dg.RunRequest]) -> None:
    """Record, as an external build would, that every requested partition is materialised."""
    for request in requests:
        for key in request.asset_selection:
            instance.report_runless_asset_event(
                dg.AssetMaterialization(key, partition=request.partition_key)
            )


def test_the_sensor_is_described_and_targets_every_asset() -> None:
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    assert sensor.description and "15 January" in sensor.description
    assert sensor.asset_selection is not None
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED


def test_before_and_after_15_january_the_due_year_changes(instance: dg.DagsterInstance) -> None:
    before = tick(instance, dt.date(2025, 1, 14))
    after = tick(instance, dt.date(2025, 1, 15))
    assert before.skip_message is None and after.skip_message is None
    assert {r.tags[YEAR_TAG] for r in before.run_requests} == {"2023"}
    assert {r.tags[YEAR_TAG] for r in after.run_requests} == {"2024"}
    # First stage: every city's static products and its 2020-epoch products, nothing per year.
    keys = sorted(r.partition_key for r in after.run_requests)
    assert len(keys) == 2 * CITIES
    assert "Boston" in keys and "Boston|2020" in keys
    assert {r.tags[STAGE_TAG] for r in after.run_requests} == {"sources"}
    assert all(r.job_name for r in after.run_requests)  # resolved to an asset job by Dagster
    assert len({r.run_key for r in after.run_requests}) == len(after.run_requests)


def test_the_year_goes_stage_by_stage_and_ends_with_the_cursor(
    instance: dg.DagsterInstance,
) -> None:
    on = dt.date(2025, 3, 1)
    sources = tick(instance, on)
    record_materialized(instance, sources.run_requests)

    city_years = tick(instance, on)
    assert {r.tags[STAGE_TAG] for r in city_years.run_requests} == {"city-years"}
    assert sorted(r.partition_key for r in city_years.run_requests) == sorted(
        f"{c}|2024" for c in load_cities()
    )
    boston = next(r for r in city_years.run_requests if r.partition_key == "Boston|2024")
    assert OPT in boston.asset_selection
    record_materialized(instance, city_years.run_requests)

    (cube,) = tick(instance, on).run_requests
    assert cube.partition_key is None and MANIFEST in cube.asset_selection
    assert cube.tags[STAGE_TAG] == "cube"
    # A run with the cube stage's tags (as the daemon launches it) succeeds: the year is done…
    assert run_with_tags(instance, cube.tags, ok=True).success
    done = tick(instance, on)
    assert done.cursor == "2024" and "built for every city" in done.skip_message
    # …and is not asked for again.
    assert "2025 is due from 15 January 2026" in tick(instance, on, cursor="2024").skip_message


def test_a_failed_run_holds_the_year_and_is_named(instance: dg.DagsterInstance) -> None:
    on = dt.date(2025, 3, 1)
    sources = tick(instance, on).run_requests
    failed = run_with_tags(instance, sources[0].tags, ok=False)
    held = tick(instance, on)
    assert not held.run_requests
    assert failed.run_id in held.skip_message and "re-execute" in held.skip_message
    # Once its partitions are materialised (e.g. by the re-executed run) the year goes on.
    record_materialized(instance, sources)
    assert {r.tags[STAGE_TAG] for r in tick(instance, on).run_requests} == {"city-years"}


def run_with_tags(
    instance: dg.DagsterInstance, tags: dict[str, str], ok: bool
) -> dg.ExecuteInProcessResult:
    """A real (tiny) run on ``instance`` carrying a stage's tags, that succeeds or fails."""

    @dg.asset(name="stage_probe")
    def probe() -> None:
        if not ok:
            raise RuntimeError("this stage's run fails")

    return dg.materialize([probe], instance=instance, tags=dict(tags), raise_on_error=False)


def test_a_year_past_2025_is_built_by_code_loaded_after_it_closed(tmp_path: Path) -> None:
    """Loaded on 1 February 2027 (CITYCUBE_TODAY), the code offers 2026 and the sensor asks
    for it; loaded on 14 January 2027, 2025 is still the year due."""
    script = """
import datetime as dt, json, sys
import dagster as dg
from citycube.catalogue.temporal import today
from pipelines.definitions import defs
from pipelines.partitions import YEARS
from pipelines.schedules import build_yearly_build
from pipelines.selection import partitions_by_key
sensor = build_yearly_build(partitions_by_key(defs), clock=today)
with dg.instance_for_test() as instance:
    data = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
print(json.dumps({"years": [YEARS[0], YEARS[-1]], "skip": data.skip_message,
    "keys": sorted(r.partition_key for r in data.run_requests),
    "year": sorted({r.tags["citycube/yearly"] for r in data.run_requests})}))
"""
    answers = {}
    for day in ("2027-01-14", "2027-02-01"):
        env = {**os.environ, "CITYCUBE_TODAY": day, "DAGSTER_HOME": str(tmp_path)}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        answers[day] = json.loads(done.stdout.strip().splitlines()[-1])
    early, late = answers["2027-01-14"], answers["2027-02-01"]
    assert early["years"] == [2000, 2025] and early["year"] == ["2025"]
    assert late["years"] == [2000, 2026] and late["year"] == ["2026"] and late["skip"] is None
    # 2026 lies in the 2025 epoch: its first stage is every city's static and 2025-epoch items.
    assert "Boston|2025" in late["keys"] and "Boston" in late["keys"]


def test_the_open_calendar_grows_on_15_january() -> None:
    assert open_calendar(dt.date(2026, 12, 6))[-1] == 2025
    assert open_calendar(dt.date(2027, 1, 14))[-1] == 2025
    assert open_calendar(dt.date(2027, 1, 15))[-1] == 2026
    assert open_calendar(dt.date(2031, 6, 1)) == tuple(range(2000, 2031))


def test_stages_split_a_year_by_partitioning() -> None:
    stages = dict(year_stages(partitions_by_key(defs), 2024))
    assert all(keys is None for keys in stages["cube"].values())
    assert all(len(keys) == CITIES for keys in stages["city-years"].values())


def test_every_stage_s_runs_take_their_run_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster's validate_run_config accepts each stage's run request (resources, the
    benchmark assets' config defaults) for the asset job the daemon launches it as."""
    monkeypatch.setenv("CITYCUBE_DATA", str(tmp_path))
    monkeypatch.setenv("CITYCUBE_RELEASE", "yearly")
    partitions = partitions_by_key(defs)
    for stage, selection in year_stages(partitions, 2024):
        for request in run_requests(partitions, {YEAR_TAG: "2024"}, "2024", stage, selection):
            keys = list(request.asset_selection)
            job = defs.resolve_implicit_job_def_def_for_assets(keys)
            subset = job.get_subset(asset_selection=set(keys))
            assert dg.validate_run_config(subset, request.run_config) is not None
