"""Source assets retry transient fetch failures through Dagster's retry policy, and only those."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from assets.common import source_asset_key
from assets.sources import build_source_assets
from citycube.catalogue.modalities import load_catalogue
from citycube.errors import SourceFetchError, SourceReadError
from citycube.items.protocol import SourceItem, SourceSet
from pipelines.partitions import city_year_key
from pipelines.resources import ComputeResource, CubeResource
from tests.conftest import LocalFilesProduct

CAT = load_catalogue()
CITY = "Amsterdam"


class FlakyProduct(LocalFilesProduct):
    """Fails its first ``failures`` fetches with ``error`` (counted in a file, so the count
    survives whatever process a retry runs in)."""

    def __init__(self, counter: Path, failures: int, error: Exception, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.counter, self.failures, self.error = counter, failures, error

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        calls = int(self.counter.read_text()) + 1 if self.counter.exists() else 1
        self.counter.write_text(str(calls))
        if calls <= self.failures:
            raise self.error
        return super().fetch(city, source_year, dest)


def _materialize(tmp_path: Path, error: Exception, failures: int) -> dg.ExecuteInProcessResult:
    source = tmp_path / "odiac.tif"
    source.write_bytes(b"not read by the source asset")
    flaky = FlakyProduct(
        tmp_path / "calls",
        failures,
        error,
        product_id="odiac",
        items={(CITY, 2020): {"data": source}},
    )

    class FlakyCube(CubeResource):
        def sources_for_tasks(self) -> SourceSet:
            return SourceSet([flaky], name="flaky")

    cube = FlakyCube(data_root=str(tmp_path / "data"), release_version="t")
    (annual,) = [a for a in build_source_assets(CAT) if source_asset_key("odiac") in a.keys]
    return dg.materialize(
        [annual],
        selection=[source_asset_key("odiac")],
        partition_key=city_year_key(CITY, 2020),
        resources={"cube": cube, "compute": ComputeResource(workers=1)},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def _retries(result: dg.ExecuteInProcessResult) -> int:
    return sum(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)


@pytest.mark.parametrize(
    ("error", "retried", "succeeds"),
    [
        (SourceFetchError("server said 503"), 2, True),
        (SourceFetchError("403 forbidden", transient=False), 0, False),
        (SourceReadError("truncated download"), 0, False),
    ],
)
def test_only_transient_fetch_errors_are_retried(
    tmp_path: Path, error: Exception, retried: int, succeeds: bool
) -> None:
    result = _materialize(tmp_path, error, failures=2)
    assert _retries(result) == retried
    assert result.success is succeeds
    if succeeds:
        (event,) = result.get_asset_materialization_events()
        assert event.materialization.metadata["available"].value is True
    else:
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        assert "Amsterdam|2020" in failure.event_specific_data.error.message


def test_a_fetch_step_interrupted_by_its_runs_termination_is_not_retried(tmp_path: Path) -> None:
    """Dagster's retry policy would retry an interrupted step; a build's source step is
    interrupted only when Dagster terminates its run, so it fails at once instead."""
    from dagster import DagsterExecutionInterruptedError

    result = _materialize(tmp_path, DagsterExecutionInterruptedError(), failures=1)
    assert _retries(result) == 0
    assert result.success is False
    assert (tmp_path / "calls").read_text() == "1"  # fetched once, never again
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "interrupted" in failure.event_specific_data.error.message
