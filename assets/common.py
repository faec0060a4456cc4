"""What every partitioned asset shares: keys, the backfill and retry policies, and the loop that
hands one task per partition to the compute resource and reports each partition."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from citycube.errors import SourceFetchError
from pipelines.partitions import PartitionsDef, split_key
from pipelines.resources import ComputeResource, Outcome

if TYPE_CHECKING:
    from citycube.cube.release import Release

with warnings.catch_warnings():  # single-run backfills are stable in use; Dagster flags them beta
    warnings.simplefilter("ignore", dg.BetaWarning)
    SINGLE_RUN = dg.BackfillPolicy.single_run()
    """A backfill materialises each asset's partitions in one step, which fans them out to the
    compute resource: Dagster's bookkeeping then costs per asset, not per partition."""

SOURCE_RETRY = dg.RetryPolicy(
    max_retries=3, delay=2, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
"""Retries for transient fetch failures (timeouts, 429, 5xx); items already fetched are kept,
so a retry only redoes what failed."""

MAX_LISTED_FAILURES = 5
"""Failed partitions named in a step's error (all are in the step's log)."""


def source_asset_key(product: str) -> dg.AssetKey:
    """Asset key of a source product."""
    return dg.AssetKey(["sources", product])


def derived_asset_key(code: str) -> dg.AssetKey:
    """Asset key of a modality's per-source-period results (and chips)."""
    return dg.AssetKey(["derived", code.lower()])


def modality_asset_key(code: str) -> dg.AssetKey:
    """Asset key of a modality's observations."""
    return dg.AssetKey(["modalities", code.lower()])


def table_metadata(path: str | Path, rows: int | None = None) -> dict[str, Any]:
    """Dagster's ``dagster/row_count`` and ``dagster/column_schema`` of a Parquet table, read
    from its footer (``rows`` when the writer counted them); nothing for a file that is not
    Parquet or not there (e.g. a table with no rows to write)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if path.suffix != ".parquet" or not path.is_file():
        return {}
    footer = pq.read_metadata(path)
    columns = [
        dg.TableColumn(field.name, str(field.type)) for field in footer.schema.to_arrow_schema()
    ]
    return {
        "dagster/row_count": footer.num_rows if rows is None else int(rows),
        "dagster/column_schema": dg.TableSchema(columns=columns),
    }


def published_path(release: Release, path: str | Path) -> Path:
    """Where readers find a file a build writes into the release's draft once ``cube/database``
    publishes it (a file outside the draft is where it is)."""
    path = Path(path)
    try:
        return release.published_dir / path.relative_to(release.draft_dir)
    except ValueError:
        return path


def published_table(release: Release, path: str | Path, name: str = "path") -> dict[str, Any]:
    """A draft table's row count and column schema, and the path it is published at."""
    return {
        **table_metadata(path),
        name: dg.MetadataValue.path(str(published_path(release, path))),
    }


def _metadata(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: dg.MetadataValue.json(v) if isinstance(v, dict | list) else v
        for k, v in values.items()
        if v is not None
    }


@dataclass(frozen=True)
class Plan:
    """How one asset of a multi-asset step turns a partition into a task and its metadata."""

    arguments: Callable[[str, int | None], tuple[Any, ...]]
    """Task arguments for (city, period)."""
    metadata: Callable[[Any], Mapping[str, Any]] = dict
    """Materialisation metadata from the task's result."""


def run_partitions(
    context: dg.AssetExecutionContext,
    compute: ComputeResource,
    partitions: PartitionsDef,
    function: Callable[..., Any],
    plans: Mapping[dg.AssetKey, Plan],
    *,
    first: bool = False,
) -> list[Outcome]:
    """Run ``function`` for every selected asset and partition of this step, all at once.

    One step materialises many assets (a multi-asset per partitioning), so every task of the
    step goes to the compute resource together and the workers never wait on a step boundary
    between products. Each successful asset partition gets its own materialisation metadata.
    If any fails, the step fails after the others have finished (their files stay written and
    are reused by a re-run); the error names the failed ones. Only transient fetch errors are
    retried. ``first`` tasks go ahead of every other step's on a shared cluster; otherwise
    steps of earlier runs go first.
    """
    owners: dict[str, tuple[dg.AssetKey, str]] = {}
    tasks = []
    for asset_key in sorted(context.selected_asset_keys, key=lambda k: k.to_user_string()):
        plan = plans[asset_key]
        for partition_key in context.partition_keys:
            city, period = split_key(partitions, partition_key)
            name = f"{asset_key.to_user_string()} {partition_key}"
            owners[name] = (asset_key, partition_key)
            tasks.append((name, plan.arguments(city, period)))
    record = context.instance.get_run_record_by_id(context.run.run_id)
    started = record.start_time if record is not None else None
    outcomes = compute.run(context.log, context.op_def.name, function, tasks, started, first)
    for outcome in outcomes:
        if outcome.ok:
            asset_key, partition_key = owners[outcome.key]
            values = plans[asset_key].metadata(outcome.result)
            context.add_asset_metadata(
                _metadata({**values, "seconds": round(outcome.seconds, 3)}),
                asset_key=asset_key,
                partition_key=partition_key,
            )
    failed = [o for o in outcomes if not o.ok]
    if failed:
        _raise_for(context.op_def.name, failed, len(outcomes))
    return outcomes


def materialized(context: dg.AssetExecutionContext) -> Iterator[dg.MaterializeResult]:
    """One result per selected asset of a multi-asset step (its metadata is per partition)."""
    for asset_key in sorted(context.selected_asset_keys, key=lambda k: k.to_user_string()):
        yield dg.MaterializeResult(asset_key=asset_key)


def _raise_for(label: str, failed: list[Outcome], total: int) -> None:
    listed = "; ".join(f"{o.key}: {o.error}" for o in failed[:MAX_LISTED_FAILURES])
    more = (
        f" (and {len(failed) - MAX_LISTED_FAILURES} more)"
        if len(failed) > MAX_LISTED_FAILURES
        else ""
    )
    message = f"{label}: {len(failed)} of {total} asset partitions failed — {listed}{more}"
    transient = all(isinstance(o.error, SourceFetchError) and o.error.transient for o in failed)
    if transient:
        raise SourceFetchError(message)
    raise dg.Failure(
        description=message,
        metadata={"failed_partitions": dg.MetadataValue.json([o.key for o in failed])},
        allow_retries=False,
    )
