"""The build's event log: the same records as Dagster's own SQLite storage, written in batches."""

from pathlib import Path

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef

from pipelines.build import DAGSTER_SETTINGS, ensure_dagster_home
from pipelines.event_storage import BatchedSqliteEventLogStorage

PARTITIONS = dg.StaticPartitionsDefinition([f"p{i:02d}" for i in range(30)])
STOCK_CLASS = "module: dagster.core.storage.event_log\n  class: ConsolidatedSqliteEventLogStorage"
BATCHED_CLASS = "module: pipelines.event_storage\n  class: BatchedSqliteEventLogStorage"


@dg.multi_asset(
    specs=[dg.AssetSpec("tiles"), dg.AssetSpec("chips")],
    partitions_def=PARTITIONS,
    backfill_policy=dg.BackfillPolicy.single_run(),
    can_subset=True,
)
def _two_assets(context: dg.AssetExecutionContext):
    for key in context.selected_asset_keys:
        for partition in context.partition_keys:
            value = int(partition[1:]) * (2 if key.path[-1] == "chips" else 1)
            context.add_asset_metadata({"value": value}, asset_key=key, partition_key=partition)
    context.log.info(f"{len(context.partition_keys)} partitions done")  # a progress line
    for key in sorted(context.selected_asset_keys):
        yield dg.MaterializeResult(asset_key=key)


def _instance(home: Path, stock: bool) -> dg.DagsterInstance:
    """A new instance as ``citycube build`` prepares it (or with Dagster's stock event log)."""
    ensure_dagster_home(home)
    if stock:
        config = home / "dagster.yaml"
        text = config.read_text(encoding="utf-8").replace(BATCHED_CLASS, STOCK_CLASS)
        config.write_text(text, encoding="utf-8")
    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


def _materialize_range(instance: dg.DagsterInstance) -> dict[str, dict[str, int]]:
    keys = PARTITIONS.get_partition_keys()
    tags = {
        "dagster/asset_partition_range_start": keys[0],
        "dagster/asset_partition_range_end": keys[-1],
    }
    assert dg.materialize([_two_assets], instance=instance, tags=tags).success
    found: dict[str, dict[str, int]] = {}
    for name in ("tiles", "chips"):
        records = instance.fetch_materializations(dg.AssetKey(name), limit=1000).records
        found[name] = {
            r.partition_key: r.asset_materialization.metadata["value"].value for r in records
        }
        assert instance.get_materialized_partitions(dg.AssetKey(name)) == set(keys)
    return found


def test_a_step_s_materialisations_are_written_in_batches_with_the_same_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in DAGSTER_SETTINGS.items():
        monkeypatch.setenv(name, value)
    batches: list[int] = []
    original = BatchedSqliteEventLogStorage.store_event_batch

    def counting(self, events):
        batches.append(len(events))
        return original(self, events)

    monkeypatch.setattr(BatchedSqliteEventLogStorage, "store_event_batch", counting)
    with _instance(tmp_path / "stock", stock=True) as stock:
        assert type(stock.event_log_storage).__name__ == "ConsolidatedSqliteEventLogStorage"
        expected = _materialize_range(stock)
    with _instance(tmp_path / "batched", stock=False) as batched:
        assert isinstance(batched.event_log_storage, BatchedSqliteEventLogStorage)
        found = _materialize_range(batched)
        # A later single event goes through the same engine and lands after the batch.
        dg.materialize([_two_assets], instance=batched, partition_key="p07")
        latest = batched.get_latest_materialization_event(dg.AssetKey("chips"))
        assert latest is not None and latest.dagster_event.partition == "p07"
    assert found == expected
    assert expected["chips"]["p29"] == 58 and len(expected["tiles"]) == 30
    # One batch per asset of the 30-partition step (and the planned events of each run).
    assert batches.count(30) == 2 and sum(batches) == 2 * 30 + 2 * 2


def test_the_progress_reader_skips_materialisations_and_keeps_everything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipelines.build import UNPRINTED_EVENTS

    for name, value in DAGSTER_SETTINGS.items():
        monkeypatch.setenv(name, value)
    with _instance(tmp_path / "home", stock=False) as instance:
        _materialize_range(instance)
        (run,) = instance.get_runs()
        every = instance.get_records_for_run(run.run_id).records
        storage = instance.event_log_storage
        read, cursor = [], None
        while True:  # pages of 7, as the printer pages through a long run
            page = storage.get_records_for_run_except(run.run_id, cursor, UNPRINTED_EVENTS, 7)
            read += page.records
            cursor = page.cursor
            if not page.has_more:
                break
    kept = [
        r.storage_id
        for r in every
        if r.event_log_entry.dagster_event is None
        or r.event_log_entry.dagster_event.event_type_value not in UNPRINTED_EVENTS
    ]
    assert [r.storage_id for r in read] == kept
    assert len(every) - len(kept) >= 60  # the 60 materialisations (and the planned events)
    kinds = {r.event_log_entry.dagster_event_type for r in read}
    assert {dg.DagsterEventType.RUN_START, dg.DagsterEventType.RUN_SUCCESS} <= kinds
    assert None in kinds  # log messages, which have no event type, are kept
