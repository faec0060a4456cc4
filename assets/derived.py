"""Derived assets: one modality's tile results (and chips) per city and source period."""

import dagster as dg

from assets.common import SINGLE_RUN, derived_asset_key, run_partitions, source_asset_key
from assets.sources import product_temporal
from citycube.catalogue import Catalogue, ModalitySpec
from citycube.process import derive, modality_code_version
from pipelines.partitions import mapping_between, period_partitions
from pipelines.resources import ComputeResource, CubeResource


def build_derived_asset(modality: ModalitySpec, catalogue: Catalogue) -> dg.AssetsDefinition:
    """Computed once per source period by one writer; every calendar year it serves reuses it."""
    partitions = period_partitions(modality.temporal)
    deps = [
        dg.AssetDep(
            source_asset_key(product),
            partition_mapping=mapping_between(
                period_partitions(product_temporal(product, catalogue)), partitions
            ),
        )
        for product in [*modality.products(), *modality.auxiliary_products]
    ]

    @dg.asset(
        key=derived_asset_key(modality.code),
        partitions_def=partitions,
        deps=deps,
        backfill_policy=SINGLE_RUN,
        code_version=modality_code_version(modality, catalogue),
        group_name="derived",
        kinds={"python", "parquet"} | ({"zarr"} if modality.is_image else set()),
        description=(
            f"{modality.name} ({modality.display_code}): per-tile {modality.aggregation.value} "
            f"results{' and chips' if modality.is_image else ''} per city and "
            f"{modality.temporal.value} source period."
        ),
    )
    def _derived(
        context: dg.AssetExecutionContext, cube: CubeResource, compute: ComputeResource
    ) -> None:
        sources, release = cube.sources(), cube.release()
        run_partitions(
            context,
            compute,
            partitions,
            derive,
            lambda city, period: (modality, catalogue, city, period, sources, release),
            lambda summary: summary.as_metadata(),
        )

    return _derived


def build_derived_assets(catalogue: Catalogue) -> list[dg.AssetsDefinition]:
    """A derived asset for every enabled modality."""
    return [build_derived_asset(m, catalogue) for m in catalogue.enabled()]
