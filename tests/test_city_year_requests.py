"""A city-year requested from the UI (a partition of requests/city_year) is built stage by
stage by the city_year_requests sensor, evaluated as Dagster's sensor daemon does."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest

from assets.requests import REQUEST_KEY, city_year_request
from pipelines.definitions import defs
from pipelines.partitions import city_year_key
from pipelines.schedules import REQUEST_TAG, REQUESTS_SENSOR, STAGE_TAG
from tests.test_yearly_build import record_materialized, run_with_tags

MANIFEST = dg.AssetKey(["cube", "manifest"])


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def tick(instance: dg.DagsterInstance, cursor: str | None) -> dg.SensorResult | object:
    sensor = defs.resolve_sensor_def(REQUESTS_SENSOR)
    context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    return sensor.evaluate_tick(context)


def request(instance: dg.DagsterInstance, city: str, year: int) -> str:
    """Materialise one partition of the request asset, as the UI's launch does; its run id."""
    result = dg.materialize(
        [city_year_request], partition_key=city_year_key(city, year), instance=instance
    )
    assert result.success
    return result.run_id


def test_the_sensor_runs_by_default_and_is_described() -> None:
    sensor = defs.resolve_sensor_def(REQUESTS_SENSOR)
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert "requests/city_year" in (sensor.description or "")
    assert REQUEST_KEY not in sensor.asset_selection.resolve(defs.resolve_asset_graph())


def test_a_requested_city_year_is_built_stage_by_stage(instance: dg.DagsterInstance) -> None:
    idle = tick(instance, None)
    assert "no city-year requested" in idle.skip_message and not idle.run_requests
    run_id = request(instance, "Boston", 2020)

    sources = tick(instance, idle.cursor)
    assert sorted(r.partition_key for r in sources.run_requests) == ["Boston", "Boston|2020"]
    assert {r.tags[REQUEST_TAG] for r in sources.run_requests} == {run_id}
    assert {r.tags[STAGE_TAG] for r in sources.run_requests} == {"sources"}
    # Asked again before anything ran, it asks for the same runs (run keys keep them single).
    again = tick(instance, sources.cursor)
    assert [r.run_key for r in again.run_requests] == [r.run_key for r in sources.run_requests]
    record_materialized(instance, sources.run_requests)

    (city_year,) = tick(instance, sources.cursor).run_requests
    assert city_year.partition_key == "Boston|2020" and city_year.tags[STAGE_TAG] == "city-years"
    assert REQUEST_KEY not in city_year.asset_selection
    record_materialized(instance, [city_year])

    cube = tick(instance, sources.cursor)
    (cube_run,) = cube.run_requests
    assert cube_run.partition_key is None and MANIFEST in cube_run.asset_selection
    assert run_with_tags(instance, cube_run.tags, ok=True).success
    built = tick(instance, cube.cursor)
    assert "request Boston|2020 is built" in built.skip_message
    assert "no city-year requested" in tick(instance, built.cursor).skip_message


def test_requests_made_while_one_is_built_wait_for_it(instance: dg.DagsterInstance) -> None:
    request(instance, "Boston", 2020)
    first = tick(instance, None)
    request(instance, "Tokyo", 2021)
    second = tick(instance, first.cursor)
    assert {r.partition_key for r in second.run_requests} == {"Boston", "Boston|2020"}
