"""Derived assets: each modality's tile results (with chips and a quick-look for images) per
city and source period, computed once by one writer and read by every year it serves.

One multi-asset per partitioning (static, epoch, annual), so a backfill's step hands every
modality's partitions to the workers at once; each modality stays its own asset with its own
code version, made from its spec digest and the engine version.
"""

from collections.abc import Iterator

import dagster as dg

from assets.common import (
    SINGLE_RUN,
    Plan,
    derived_asset_key,
    materialized,
    run_partitions,
    source_asset_key,
    table_metadata,
)
from assets.sources import partitioning_name, product_temporal
from citycube.catalogue.modalities import Catalogue, ModalitySpec
from citycube.catalogue.versions import modality_code_version
from pipelines.partition_work import derive_with_quicklook
from pipelines.partitions import PartitionsDef, mapping_between, period_partitions
from pipelines.resources import ComputeResource, CubeResource

THUMBNAIL_PX = 200
"""Longest side of a quick-look thumbnail embedded in the Dagster UI for one partition."""
SMALL_THUMBNAIL_PX = 96
"""The same when a step materialises several partitions (a backfill's hundreds of previews
stay a few KB each in the event log)."""


def _preview(metadata: dict) -> dict:
    """The period's quick-look shown in the UI (a PNG thumbnail embedded in Markdown, as the
    UI renders ``data:image`` sources; made where the partition's work ran), with the
    full-size file's path."""
    if "quicklook" not in metadata:
        return {}
    return {
        "quicklook": dg.MetadataValue.path(metadata["quicklook"]),
        "preview": dg.MetadataValue.md(f"![quick-look]({metadata['preview']})"),
    }


def _spec(modality: ModalitySpec, catalogue: Catalogue, partitions: PartitionsDef) -> dg.AssetSpec:
    deps = [
        dg.AssetDep(
            source_asset_key(product),
            partition_mapping=mapping_between(
                period_partitions(product_temporal(product, catalogue)), partitions
            ),
        )
        for product in [*modality.products(), *modality.auxiliary_products]
    ]
    return dg.AssetSpec(
        derived_asset_key(modality.code),
        deps=deps,
        group_name="derived",
        kinds={"python", "parquet"} | ({"zarr", "png"} if modality.is_image else set()),
        code_version=modality_code_version(modality, catalogue),
        description=(
            f"{modality.name} ({modality.display_code}): per-tile {modality.aggregation.value} "
            f"results{' with chips and a quick-look' if modality.is_image else ''} per city and "
            f"{modality.temporal.value} source period."
        ),
    )


def build_derived_asset(
    name: str, modalities: list[ModalitySpec], partitions: PartitionsDef, catalogue: Catalogue
) -> dg.AssetsDefinition:
    """The modalities of one partitioning, as one multi-asset."""

    @dg.multi_asset(
        name=name,
        specs=[_spec(m, catalogue, partitions) for m in modalities],
        partitions_def=partitions,
        backfill_policy=SINGLE_RUN,
        can_subset=True,
    )
    def _derived(
        context: dg.AssetExecutionContext, cube: CubeResource, compute: ComputeResource
    ) -> Iterator[dg.MaterializeResult]:
        sources, release = cube.sources_for_tasks(), cube.release()
        px = THUMBNAIL_PX if len(context.partition_keys) == 1 else SMALL_THUMBNAIL_PX

        def metadata(values: dict) -> dict:
            return {
                **values,
                **table_metadata(values["path"], values.get("rows")),
                **_preview(values),
            }

        def plan(modality: ModalitySpec) -> Plan:
            return Plan(
                lambda city, period: (modality, catalogue, city, period, sources, release, px),
                metadata,
            )

        run_partitions(
            context,
            compute,
            partitions,
            derive_with_quicklook,
            {derived_asset_key(m.code): plan(m) for m in modalities},
        )
        yield from materialized(context)

    return _derived


def build_derived_assets(catalogue: Catalogue) -> list[dg.AssetsDefinition]:
    """One multi-asset per partitioning, over every enabled modality."""
    groups: dict[str, tuple[PartitionsDef, list[ModalitySpec]]] = {}
    for modality in catalogue.enabled():
        partitions = period_partitions(modality.temporal)
        groups.setdefault(partitioning_name(partitions), (partitions, []))[1].append(modality)
    return [
        build_derived_asset(f"derived_{name}", modalities, partitions, catalogue)
        for name, (partitions, modalities) in sorted(groups.items())
    ]
