"""Source assets: fetch each product per city-year (static products per city) to local disk."""

import dagster as dg

from citycube.catalogue import Temporal, load_catalogue
from citycube.errors import SourceUnavailableError
from citycube.temporal import resolve
from pipelines.partitions import city_partitions, city_year_partitions, split_key
from pipelines.resources import CubeResource


def source_asset_key(product: str) -> dg.AssetKey:
    """Asset key of a source product."""
    return dg.AssetKey(["sources", product])


def product_temporal(product: str) -> Temporal:
    """The temporal kind of the modality that reads a product (static products: by city)."""
    for m in load_catalogue().modalities:
        if product in m.auxiliary_products:
            return Temporal.STATIC
        if product in m.products():
            return m.temporal
    raise KeyError(product)


def build_source_asset(product: str) -> dg.AssetsDefinition:
    """One asset per product; static products are partitioned by city only."""
    temporal = product_temporal(product)
    partitions = city_partitions if temporal == Temporal.STATIC else city_year_partitions

    @dg.asset(
        key=source_asset_key(product),
        partitions_def=partitions,
        group_name="sources",
        kinds={"python", "geotiff"},
        description=f"Fetch `{product}` for a city (and year) into the local source cache.",
    )
    def _source(context: dg.AssetExecutionContext, cube: CubeResource) -> dg.MaterializeResult:
        city, year = split_key(context)
        backend = cube.source_backend()
        release = cube.release()
        source_years = backend.source_years(product, city)
        if year is None:
            source_year = None
        else:
            resolution = resolve(temporal, year, source_years)
            if not resolution.available:
                context.log.info(f"{product} does not cover {city} {year}: stays missing")
                return dg.MaterializeResult(
                    metadata={"available": False, "reason": resolution.missing_reason}
                )
            source_year = resolution.source_year
        try:
            item = backend.fetch(product, city, source_year, release.sources_dir)
        except SourceUnavailableError as exc:
            context.log.info(f"{product} does not cover {city} {year or ''}: {exc.reason}")
            return dg.MaterializeResult(metadata={"available": False, "reason": exc.reason})
        return dg.MaterializeResult(
            metadata={
                "available": True,
                "source_id": item.source_id,
                "source_version": item.version,
                "source_year": source_year if source_year is not None else "static",
                "synthetic": item.synthetic,
                "files": dg.MetadataValue.json({k: str(v) for k, v in item.files.items()}),
            }
        )

    return _source


def enabled_products() -> list[str]:
    """Products read by the modalities this release processes."""
    products: list[str] = []
    for m in load_catalogue().enabled():
        products += [p for p in [*m.products(), *m.auxiliary_products] if p not in products]
    return products


source_assets = [build_source_asset(p) for p in enabled_products()]
