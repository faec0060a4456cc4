"""Source assets: each product fetched once per city and source period into the data root."""

import hashlib

import dagster as dg

from assets.common import SINGLE_RUN, SOURCE_RETRY, run_partitions, source_asset_key
from citycube.catalogue import Catalogue, Temporal
from citycube.cities import load_cities
from citycube.products import load_products
from pipelines.partitions import period_partitions
from pipelines.resources import ComputeResource, CubeResource
from pipelines.tasks import fetch_source

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


def build_source_asset(product: str, catalogue: Catalogue) -> dg.AssetsDefinition:
    """One asset per product, partitioned by the product's source period."""
    temporal = product_temporal(product, catalogue)
    partitions = period_partitions(temporal)
    readers = cities_reading(product, catalogue)

    @dg.asset(
        key=source_asset_key(product),
        partitions_def=partitions,
        backfill_policy=SINGLE_RUN,
        retry_policy=SOURCE_RETRY,
        code_version=_code_version(product),
        group_name="sources",
        kinds={"python"},
        description=(
            f"Fetch `{product}` for each city and {temporal.value} source period into the "
            "data root (through the adapter the source set picks)."
        ),
    )
    def _source(
        context: dg.AssetExecutionContext, cube: CubeResource, compute: ComputeResource
    ) -> None:
        sources, release = cube.sources(), cube.release()
        run_partitions(
            context,
            compute,
            partitions,
            fetch_source,
            lambda city, period: (
                sources,
                product,
                temporal,
                city,
                period,
                city in readers,
                release,
            ),
            lambda result: result,
        )

    return _source


def build_source_assets(catalogue: Catalogue) -> list[dg.AssetsDefinition]:
    """A source asset for every product the enabled modalities read."""
    return [build_source_asset(p, catalogue) for p in enabled_products(catalogue)]
