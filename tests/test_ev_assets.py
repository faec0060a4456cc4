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


def test_source_per_city_then_cases_with_counts_and_reasons(tmp_path: Path) -> None:
    resources = {
        "cube": CubeResource(data_root=str(tmp_path / "data"), release_version="ev"),
        "compute": ComputeResource(workers=1),
    }
    definitions = build_definitions(load_catalogue(), resources=resources)
    instance = dg.DagsterInstance.ephemeral()
    scope = {"config": {"cities": ["Amsterdam", "Boston"]}}
    result = dg.materialize(
        list(definitions.assets),  # type: ignore[arg-type]
        selection=dg.AssetSelection.assets(dg.AssetKey(["sources", "afdc_ev_stations"])),
        resources=resources,
        instance=instance,
        run_config={"ops": {"sources__afdc_ev_stations": scope}},
    )
    assert result.success
    event = instance.get_latest_materialization_event(dg.AssetKey(["sources", "afdc_ev_stations"]))
    assert event is not None and event.asset_materialization is not None
    cities = event.asset_materialization.metadata["cities"].value
    assert cities["Amsterdam"] == {"available": False, "reason": "outside_source_coverage"}
    assert cities["Boston"]["available"] is True  # type: ignore[index]
    result = dg.materialize(
        list(definitions.assets),  # type: ignore[arg-type]
        selection=dg.AssetSelection.assets(dg.AssetKey(["benchmark", "ev_cases"])),
        resources=resources,
        instance=instance,
        run_config={"ops": {"benchmark__ev_cases": scope}},
    )
    assert result.success
    files = EvFiles.draft(Release(tmp_path / "data", "ev"))
    counts = pq.read_table(files.counts).to_pylist()
    selected = {c: sum(r["selected"] for r in counts if r["city"] == c) for c in ("Boston", "NYC")}
    assert selected == {"Boston": 50, "NYC": 0}
    assert {r["reason"] for r in counts if r["city"] == "NYC"} == {
        "city outside the release's scope"
    }
    assert pq.read_table(files.cases).num_rows == 50
