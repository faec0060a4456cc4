"""Report assets: fixed-rendering quick-looks per city-year and the availability report."""

import dagster as dg
import pandas as pd
from PIL import Image

from assets.common import SINGLE_RUN, modality_asset_key, run_partitions
from assets.cube import DATABASE_KEY
from citycube.catalogue import Catalogue
from citycube.render import png_data_uri
from citycube.report import write_report
from pipelines.partitions import city_year_partitions
from pipelines.resources import ComputeResource, CubeResource
from pipelines.tasks import render_quicklooks

QUICKLOOKS_KEY = dg.AssetKey(["cube", "quicklooks"])
AVAILABILITY_REPORT_KEY = dg.AssetKey(["cube", "availability_report"])

THUMBNAIL_PX = 200
"""Longest side of the quick-look thumbnails embedded in the Dagster UI."""

HEATMAP_PREVIEW_PX = 800
"""Longest side of the heatmap preview embedded in the Dagster UI (the file is full size)."""


def _previews(written: dict[str, str]) -> str:
    parts = []
    for code, path in written.items():
        with Image.open(path) as image:
            parts.append(f"**{code}**\n\n![{code}]({png_data_uri(image, THUMBNAIL_PX)})")
    return "\n\n".join(parts) or "no image chips this year"


def build_report_assets(catalogue: Catalogue) -> list[dg.AssetsDefinition]:
    """Quick-looks per city-year and the availability report of the published release."""
    image_codes = [m.code for m in catalogue.enabled() if m.is_image]

    @dg.asset(
        key=QUICKLOOKS_KEY,
        partitions_def=city_year_partitions,
        deps=[modality_asset_key(code) for code in image_codes],
        backfill_policy=SINGLE_RUN,
        group_name="reports",
        kinds={"python", "png"},
    )
    def quicklooks(
        context: dg.AssetExecutionContext, cube: CubeResource, compute: ComputeResource
    ) -> None:
        """City-wide PNG quick-looks of each image modality, in fixed (never stretched) colours."""
        release = cube.release()
        many = len(context.partition_keys) > 1
        run_partitions(
            context,
            compute,
            city_year_partitions,
            render_quicklooks,
            lambda city, year: (catalogue, image_codes, city, year, release),
            lambda result: {
                "paths": result["written"],
                "skipped": result["skipped"],
                "count": len(result["written"]),
                # thumbnails only when one city-year is materialised (a backfill's hundreds of
                # previews would bloat the event log)
                "preview": None if many else dg.MetadataValue.md(_previews(result["written"])),
            },
        )

    @dg.asset(
        key=AVAILABILITY_REPORT_KEY,
        deps=[DATABASE_KEY],
        group_name="reports",
        kinds={"python", "csv", "png"},
    )
    def availability_report(cube: CubeResource) -> dg.MaterializeResult:
        """Availability by modality and by city (CSV + markdown) and a city × year heatmap."""
        release = cube.release()
        paths = write_report(release, catalogue)
        modality_md = paths["modality_md"].read_text(encoding="utf-8")
        city_md = paths["city_md"].read_text(encoding="utf-8")
        with Image.open(paths["heatmap_png"]) as heatmap:
            heatmap_uri = png_data_uri(heatmap.convert("RGB"), HEATMAP_PREVIEW_PX)
        overall = pd.read_csv(paths["modality_csv"]).iloc[-1]
        return dg.MaterializeResult(
            metadata={
                **{name: dg.MetadataValue.path(str(p)) for name, p in paths.items()},
                "available_combinations": int(overall["available"]),
                "possible_combinations": int(overall["possible"]),
                "availability_percent": float(overall["percent"]),
                "by_modality": dg.MetadataValue.md(modality_md),
                "by_city": dg.MetadataValue.md(city_md),
                "heatmap": dg.MetadataValue.md(f"![availability heatmap]({heatmap_uri})"),
            }
        )

    return [quicklooks, availability_report]
