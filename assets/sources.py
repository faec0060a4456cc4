"""Source assets: each product fetched once per city and source period into the data root.

One multi-asset per partitioning (static products by city, 5-year products by city × epoch,
the rest by city × year), so a backfill's step hands every product's partitions to the workers
at once; each product stays its own asset, with its own lineage, metadata and code version.
"""

import hashlib
from collections.abc import Iterator

import dagster as dg

from assets.common import (
    SINGLE_RUN,
    SOURCE_RETRY,
    Plan,
    materialized,
    run_partitions,
    source_asset_key,
)
from citycube.catalogue.cities import load_cities
from citycube.catalogue.modalities import Catalogue, Temporal
from citycube.catalogue.products import load_products
from pipelines.partition_work import fetch_source
from pipelines.partitions import PartitionsDef, period_partitions
from pipelines.resources import ComputeResource, CubeResource

SOURCE_PROTOCOL_VERSION = "1"
"""Version of how source assets fetch; part of their code version."""


def product_temporal(product: str, catalogue: Catalogue) -> Temporal:
    """The period a product is fetched by: its modality's kind (auxiliary products are static)."""
    kinds = set()
    for m in catalogue.enabled():
        if product in m.auxiliary_products:
            kinds.add(Temporal.STATIC)
        if product in m.products():
            kinds.add(m.temporal)
    if len(kinds) != 1:
        raise ValueError(f"product {product!r} is read with temporal kinds {sorted(kinds)}")
    return kinds.pop()


def enabled_products(catalogue: Catalogue) -> list[str]:
    """Products read by the modalities this release processes."""
    products: list[str] = []
    for m in catalogue.enabled():
        products += [p for p in [*m.products(), *m.auxiliary_products] if p not in products]
    return products


def cities_reading(product: str, catalogue: Catalogue) -> frozenset[str]:
    """Cities for which some enabled modality reads a product (per-city products differ)."""
    return frozenset(
        city
        for city in load_cities()
        for m in catalogue.enabled()
        if product in m.products(city) or product in m.auxiliary_products
    )


def _code_version(product: str) -> str:
    spec = load_products().get(product)
    text = spec.model_dump_json() if spec else product
    return f"{SOURCE_PROTOCOL_VERSION}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _spec(product: str, temporal: Temporal) -> dg.AssetSpec:
    return dg.AssetSpec(
        source_asset_key(product),
        group_name="sources",
        kinds={"python"},
        code_version=_code_version(product),
        description=(
            f"`{product}` for each city and {temporal.value} source period, fetched into the "
            "data root through the adapter the source set picks."
        ),
    )


def build_sources_asset(
    name: str, products: list[str], partitions: PartitionsDef, catalogue: Catalogue
) -> dg.AssetsDefinition:
    """The source products of one partitioning, as one multi-asset."""
    temporals = {p: product_temporal(p, catalogue) for p in products}
    readers = {p: cities_reading(p, catalogue) for p in products}

    @dg.multi_asset(
        name=name,
        specs=[_spec(p, temporals[p]) for p in products],
        partitions_def=partitions,
        backfill_policy=SINGLE_RUN,
        retry_policy=SOURCE_RETRY,
        can_subset=True,
    )
    def _sources(
        context: dg.AssetExecutionContext, cube: CubeResource, compute: ComputeResource
    ) -> Iterator[dg.MaterializeResult]:
        try:
            yield from _fetch(context, cube, compute)
        except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt) as stopped:
            # Dagster's retry policy retries an interrupted step too, and a build's runs are
            # interrupted only when Dagster terminates them (a stop request): retried, the step
            # would fetch on and its run go on to process, as if no one had asked it to stop.
            raise dg.Failure(
                description=f"{context.op_def.name}: interrupted (its run is being terminated)",
                allow_retries=False,
            ) from stopped

    def _fetch(
        context: dg.AssetExecutionContext, cube: CubeResource, compute: ComputeResource
    ) -> Iterator[dg.MaterializeResult]:
        sources, release = cube.sources_for_tasks(), cube.release()

        def plan(product: str) -> Plan:
            return Plan(
                lambda city, period: (
                    sources,
                    product,
                    temporals[product],
                    city,
                    period,
                    city in readers[product],
                    release,
                )
            )

        run_partitions(
            context,
            compute,
            partitions,
            fetch_source,
            {source_asset_key(p): plan(p) for p in products},
            # A run's processing waits for its fetches: fetched while the workers are busy
            # with other runs' processing, they keep the run queue moving.
            first=True,
        )
        yield from materialized(context)

    return _sources


def build_source_assets(catalogue: Catalogue) -> list[dg.AssetsDefinition]:
    """One multi-asset per partitioning, over every product the enabled modalities read."""
    groups: dict[str, list[str]] = {}
    for product in enabled_products(catalogue):
        groups.setdefault(product_temporal(product, catalogue).value, []).append(product)
    by_partitions: dict[str, tuple[PartitionsDef, list[str]]] = {}
    for temporal, products in groups.items():
        partitions = period_partitions(Temporal(temporal))
        name = partitioning_name(partitions)
        by_partitions.setdefault(name, (partitions, []))[1].extend(products)
    return [
        build_sources_asset(f"sources_{name}", products, partitions, catalogue)
        for name, (partitions, products) in sorted(by_partitions.items())
    ]


def partitioning_name(partitions: PartitionsDef) -> str:
    from pipelines.partitions import city_epoch_partitions, city_partitions

    if partitions == city_partitions:
        return "static"
    if partitions == city_epoch_partitions:
        return "epoch"
    return "annual"
