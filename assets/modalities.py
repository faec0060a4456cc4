"""Modality assets: one per processed modality, partitioned by city × year."""

import warnings

import dagster as dg

from assets.sources import product_temporal, source_asset_key
from citycube.catalogue import ModalitySpec, Temporal, load_catalogue
from citycube.process import process_partition
from pipelines.partitions import CITY, city_year_partitions, split_key
from pipelines.resources import CubeResource


def modality_asset_key(code: str) -> dg.AssetKey:
    """Asset key of a modality's observations."""
    return dg.AssetKey(["modalities", code.lower()])


def build_modality_asset(modality: ModalitySpec) -> dg.AssetsDefinition:
    """Observations (and chips, for images) of one modality for one city-year."""
    deps = []
    for product in [*modality.products(), *modality.auxiliary_products]:
        if product_temporal(product) == Temporal.STATIC:
            with warnings.catch_warnings():  # the mapping is stable in use; Dagster flags it beta
                warnings.simplefilter("ignore", dg.BetaWarning)
                mapping = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=CITY)
            deps.append(dg.AssetDep(source_asset_key(product), partition_mapping=mapping))
        else:
            deps.append(dg.AssetDep(source_asset_key(product)))

    @dg.asset(
        key=modality_asset_key(modality.code),
        partitions_def=city_year_partitions,
        deps=deps,
        group_name="modalities",
        kinds={"python", "parquet"} | ({"zarr"} if modality.is_image else set()),
        description=(
            f"{modality.name} ({modality.display_code}): {modality.aggregation.value}, "
            f"{modality.temporal.value}; writes one observations partition per city-year."
        ),
    )
    def _modality(context: dg.AssetExecutionContext, cube: CubeResource) -> dg.MaterializeResult:
        city, year = split_key(context)
        assert year is not None
        summary = process_partition(
            modality,
            cube.catalogue(),
            city,
            year,
            cube.source_backend(),
            cube.release(),
            progress=context.log.debug,
        )
        context.log.info(
            f"{modality.code} {city} {year}: {summary.available_tiles}/{summary.tiles} tiles "
            f"available ({summary.basis})"
        )
        return dg.MaterializeResult(metadata=summary.as_metadata())

    return _modality


modality_assets = [build_modality_asset(m) for m in load_catalogue().enabled()]
