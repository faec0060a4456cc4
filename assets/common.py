"""What every partitioned asset shares: keys, the backfill and retry policies, and the loop that
hands one task per partition to the compute resource and reports each partition."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg

from citycube.errors import SourceFetchError
from pipelines.partitions import PartitionsDef, split_key
from pipelines.resources import ComputeResource, Outcome

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


def _metadata(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: dg.MetadataValue.json(v) if isinstance(v, dict | list) else v
        for k, v in values.items()
        if v is not None
    }


def run_partitions(
    context: dg.AssetExecutionContext,
    compute: ComputeResource,
    partitions: PartitionsDef,
    function: Callable[..., Any],
    arguments: Callable[[str, int | None], tuple[Any, ...]],
    metadata: Callable[[Any], Mapping[str, Any]],
) -> list[Outcome]:
    """Run ``function(*arguments(city, period))`` for every partition of this step.

    Each successful partition gets its own materialisation metadata. If any partition fails,
    the step fails after the others have finished (their files stay written and are reused by
    a re-run); the error names the failed partitions. Only transient fetch errors are retried.
    """
    tasks = []
    for key in context.partition_keys:
        city, period = split_key(partitions, key)
        tasks.append((key, arguments(city, period)))
    outcomes = compute.run(context.log, context.asset_key.to_user_string(), function, tasks)
    for outcome in outcomes:
        if outcome.ok:
            context.add_asset_metadata(
                _metadata({**metadata(outcome.result), "seconds": round(outcome.seconds, 3)}),
                partition_key=outcome.key,
            )
    failed = [o for o in outcomes if not o.ok]
    if failed:
        _raise_for(context.asset_key.to_user_string(), failed, len(outcomes))
    return outcomes


def _raise_for(label: str, failed: list[Outcome], total: int) -> None:
    listed = "; ".join(f"{o.key}: {o.error}" for o in failed[:MAX_LISTED_FAILURES])
    more = (
        f" (and {len(failed) - MAX_LISTED_FAILURES} more)"
        if len(failed) > MAX_LISTED_FAILURES
        else ""
    )
    message = f"{label}: {len(failed)} of {total} partitions failed — {listed}{more}"
    transient = all(isinstance(o.error, SourceFetchError) and o.error.transient for o in failed)
    if transient:
        raise SourceFetchError(message)
    raise dg.Failure(
        description=message,
        metadata={"failed_partitions": dg.MetadataValue.json([o.key for o in failed])},
        allow_retries=False,
    )
