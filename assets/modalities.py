"""Modality assets: one observations partition per modality and city-year."""

import dagster as dg

from assets.common import SINGLE_RUN, derived_asset_key, modality_asset_key, run_partitions
from citycube.catalogue import Catalogue, ModalitySpec
from citycube.process import modality_code_version, write_observations
from pipelines.partitions import city_year_partitions, mapping_between, period_partitions
from pipelines.resources import ComputeResource, CubeResource


def build_modality_asset(modality: ModalitySpec, catalogue: Catalogue) -> dg.AssetsDefinition:
    """Observations of one modality for each city-year, read from its source period's results."""
    upstream = period_partitions(modality.temporal)

    @dg.asset(
        key=modality_asset_key(modality.code),
        partitions_def=city_year_partitions,
        deps=[
            dg.AssetDep(
                derived_asset_key(modality.code),
                partition_mapping=mapping_between(upstream, city_year_partitions),
            )
        ],
        backfill_policy=SINGLE_RUN,
        code_version=modality_code_version(modality, catalogue),
        group_name="modalities",
        kinds={"python", "parquet"},
        description=(
            f"{modality.name} ({modality.display_code}): one observations partition per "
            f"city-year ({modality.temporal.value}), values NULL with a reason where unavailable."
        ),
    )
    def _modality(
        context: dg.AssetExecutionContext, cube: CubeResource, compute: ComputeResource
    ) -> None:
        release = cube.release()
        run_partitions(
            context,
            compute,
            city_year_partitions,
            write_observations,
            lambda city, year: (modality, city, year, release),
            lambda summary: summary.as_metadata(),
        )

    return _modality


def build_modality_assets(catalogue: Catalogue) -> list[dg.AssetsDefinition]:
    """An observations asset for every enabled modality."""
    return [build_modality_asset(m, catalogue) for m in catalogue.enabled()]
