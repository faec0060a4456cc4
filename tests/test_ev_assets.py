"""The EV charging assets in Dagster: the station source per city records what the source set
serves (or why not), and the case asset reads only those records and says per city how many
cases it found and why the rest are missing."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.tasks.ev_charging import EvFiles
from pipelines.definitions import build_definitions
from pipelines.resources import ComputeResource, CubeResource
from tests.conftest import materialize_keys


def test_source_per_city_then_cases_with_counts_and_reasons(tmp_path: Path) -> None:
    resources = {
        "cube": CubeResource(data_root=str(tmp_path / "data"), release_version="ev"),
        "compute": ComputeResource(workers=1),
    }
    definitions = build_definitions(load_catalogue(), resources=resources)
    instance = dg.DagsterInstance.ephemeral()
    for city in ("Amsterdam", "Boston"):
        result = materialize_keys(
            definitions, ["sources/afdc_ev_stations"], city, resources=resources, instance=instance
        )
        assert result.success  # type: ignore[attr-defined]
    events = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(["sources", "afdc_ev_stations"]), asset_partitions=["Amsterdam"]
        ),
        limit=1,
    ).records
    amsterdam = events[0].event_log_entry.asset_materialization.metadata
    assert amsterdam["available"].value is False
    assert amsterdam["reason"].value == "outside_source_coverage"
    result = materialize_keys(
        definitions, ["benchmark/ev_cases"], resources=resources, instance=instance
    )
    assert result.success  # type: ignore[attr-defined]
    files = EvFiles.draft(Release(tmp_path / "data", "ev"))
    counts = pq.read_table(files.counts).to_pylist()
    selected = {c: sum(r["selected"] for r in counts if r["city"] == c) for c in ("Boston", "NYC")}
    assert selected == {"Boston": 50, "NYC": 0}
    assert {r["reason"] for r in counts if r["city"] == "NYC"} == {
        "city outside the release's scope (no station source fetched for it)"
    }
    assert pq.read_table(files.cases).num_rows == 50
