"""What a user reads in the Dagster UI without opening files: row counts and column schemas of
every table asset, the database's tables and views with their row counts, quick-looks and the
availability heatmap as images, paths to the published copy, descriptions on every check and
automation, and groups that match key prefixes. One city-epoch-year of two modalities is built
through Dagster (sample sources) and the instance's materialisations are read back."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import dagster as dg
import pytest
from PIL import Image

from citycube.catalogue.modalities import load_catalogue
from pipelines.definitions import build_definitions, defs
from pipelines.resources import ComputeResource, CubeResource
from tests.conftest import materialize_keys

PARTITION = "Amsterdam|2020"


def latest(instance: dg.DagsterInstance, key: str, partition: str | None = None) -> dict:
    """The metadata of an asset's latest materialisation (of one partition)."""
    asset_key = dg.AssetKey(key.split("/"))
    if partition is None:
        event = instance.get_latest_materialization_event(asset_key)
    else:
        events = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition]), limit=1
        ).records
        event = events[0].event_log_entry if events else None
    assert event is not None, f"{key} {partition} was not materialised"
    return dict(event.asset_materialization.metadata)


def shown_png(markdown: dg.MetadataValue) -> Image.Image:
    """The PNG a Markdown metadata value embeds (as the UI renders it: a data:image source)."""
    text = markdown.value
    assert text.startswith("![") and "(data:image/png;base64," in text
    payload = text.split("base64,", 1)[1].rstrip(")")
    return Image.open(io.BytesIO(base64.b64decode(payload)))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dg.DagsterInstance, Path]:
    root = tmp_path_factory.mktemp("metadata")
    resources = {
        "cube": CubeResource(data_root=str(root / "data"), release_version="meta"),
        "compute": ComputeResource(workers=1),
    }
    definitions = build_definitions(load_catalogue(), resources=resources)
    instance = dg.DagsterInstance.ephemeral()
    stages = [
        (["sources/ghs_pop", "sources/ghs_built_v", "derived/pop", "derived/bv"], PARTITION),
        (["modalities/pop", "modalities/bv"], PARTITION),
        (["cube/tiles", "cube/staged_database", "benchmark/splits", "cube/database"], None),
        (["cube/availability_report"], None),
    ]
    for keys, partition in stages:
        result = materialize_keys(
            definitions, keys, partition, resources=resources, instance=instance
        )
        assert result.success  # type: ignore[attr-defined]
    return instance, root / "data" / "releases" / "meta"


def test_table_assets_have_row_counts_and_column_schemas(built: tuple) -> None:
    instance, _ = built
    for key, partition in [
        ("derived/pop", PARTITION),
        ("modalities/pop", PARTITION),
        ("modalities/bv", PARTITION),
        ("cube/tiles", None),
        ("benchmark/splits", None),
    ]:
        meta = latest(instance, key, partition)
        assert meta["dagster/row_count"].value > 0, key
        columns = {c.name for c in meta["dagster/column_schema"].schema.columns}
        assert "tile_id" in columns, (key, columns)
    observations = latest(instance, "modalities/pop", PARTITION)
    assert observations["dagster/row_count"].value == observations["rows"].value
    assert {"value", "available", "reason"} <= {
        c.name for c in observations["dagster/column_schema"].schema.columns
    }


def test_paths_name_the_published_copy(built: tuple) -> None:
    instance, _ = built
    for key, partition in [
        ("modalities/pop", PARTITION),
        ("cube/tiles", None),
        ("benchmark/splits", None),
    ]:
        path = Path(latest(instance, key, partition)["path"].value)
        assert ".draft" not in path.parts and "published" in path.parts, path
        assert path.is_file(), path  # published by cube/database


def test_the_database_lists_its_tables_and_views_with_row_counts(built: tuple) -> None:
    instance, _ = built
    for key in ("cube/staged_database", "cube/database"):
        meta = latest(instance, key)
        records = {r.data["name"]: r.data for r in meta["tables"].value.records}
        assert records["observations"]["rows"] == meta["dagster/row_count"].value > 0
        assert records["tiles"]["rows"] > 0
        assert {r["kind"] for r in records.values()} <= {"table", "view"}
        assert meta["tables_and_views"].value == len(records)


def test_quicklooks_and_the_heatmap_are_images(built: tuple) -> None:
    instance, _ = built
    preview = shown_png(latest(instance, "derived/bv", PARTITION)["preview"])
    assert max(preview.size) <= 200
    quicklook = Path(latest(instance, "derived/bv", PARTITION)["quicklook"].value)
    with Image.open(quicklook) as full:  # the thumbnail shows the quick-look written
        scale = max(full.size) / max(preview.size)
        assert abs(full.width / scale - preview.width) <= 1
        shrunk = full.convert("RGBA").resize(preview.size, Image.Resampling.NEAREST)
    assert preview.convert("RGBA").tobytes() == shrunk.tobytes()  # same size, same pixels
    heatmap = shown_png(latest(instance, "cube/availability_report")["heatmap"])
    assert min(heatmap.size) > 50


def test_every_check_and_automation_is_described_and_groups_match_prefixes() -> None:
    graph = defs.resolve_asset_graph()
    checks = [graph.get_check_spec(key) for key in graph.asset_check_keys]
    assert len(checks) == 6
    assert all(spec.description for spec in checks), [s.key for s in checks if not s.description]
    assert all(sensor.description for sensor in defs.sensors or ())
    assert all(schedule.description for schedule in defs.schedules or ())
    for key in graph.get_all_asset_keys():
        assert graph.get(key).group_name == key.path[0], key.to_user_string()
