"""Modality assets: one observations partition per modality and city-year, read from the
derived results of the source period that serves the year (through partition mappings).

One multi-asset over all modalities, so a step writes every selected modality's city-years
at once; each modality stays its own asset with its own code version.
"""

from collections.abc import Iterator

import dagster as dg

from assets.common import (
    SINGLE_RUN,
    Plan,
    derived_asset_key,
    materialized,
    modality_asset_key,
    published_path,
    run_partitions,
    table_metadata,
)
from citycube.catalogue.modalities import Catalogue, ModalitySpec
from citycube.catalogue.versions import modality_code_version
from pipelines.partition_work import observe
from pipelines.partitions import city_year_partitions, mapping_between, period_partitions
from pipelines.resources import ComputeResource, CubeResource


def _spec(modality: ModalitySpec, catalogue: Catalogue) -> dg.AssetSpec:
    upstream = period_partitions(modality.temporal)
    return dg.AssetSpec(
        modality_asset_key(modality.code),
        deps=[
            dg.AssetDep(
                derived_asset_key(modality.code),
                partition_mapping=mapping_between(upstream, city_year_partitions),
            )
        ],
        group_name="modalities",
        kinds={"python", "parquet"},
        code_version=modality_code_version(modality, catalogue),
        description=(
            f"{modality.name} ({modality.display_code}): one observations partition per "
            f"city-year ({modality.temporal.value}), values NULL with a reason where unavailable."
        ),
    )


def build_modality_assets(catalogue: Catalogue) -> list[dg.AssetsDefinition]:
    """The observations of every enabled modality, as one multi-asset."""
    modalities = catalogue.enabled()

    @dg.multi_asset(
        name="observations",
        specs=[_spec(m, catalogue) for m in modalities],
        partitions_def=city_year_partitions,
        backfill_policy=SINGLE_RUN,
        can_subset=True,
    )
    def _observations(
        context: dg.AssetExecutionContext, cube: CubeResource, compute: ComputeResource
    ) -> Iterator[dg.MaterializeResult]:
        release = cube.release()

        def metadata(values: dict) -> dict:
            return {
                **values,
                **table_metadata(values["path"], values.get("rows")),
                "path": dg.MetadataValue.path(str(published_path(release, values["path"]))),
            }

        def plan(modality: ModalitySpec) -> Plan:
            return Plan(lambda city, year: (modality, city, year, release), metadata)

        run_partitions(
            context,
            compute,
            city_year_partitions,
            observe,
            {modality_asset_key(m.code): plan(m) for m in modalities},
        )
        yield from materialized(context)

    return [_observations]
