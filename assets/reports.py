"""Report assets: fixed-rendering quick-looks per city-year and the availability report."""

import dagster as dg
import pandas as pd
from PIL import Image

from assets.cube import DATABASE_KEY
from assets.modalities import modality_assets
from citycube.catalogue import load_catalogue
from citycube.errors import ChipsNotFoundError
from citycube.render import png_data_uri, render_mosaic, write_png
from citycube.report import write_report
from pipelines.partitions import city_year_partitions, split_key
from pipelines.resources import CubeResource

QUICKLOOKS_KEY = dg.AssetKey(["cube", "quicklooks"])
AVAILABILITY_REPORT_KEY = dg.AssetKey(["cube", "availability_report"])

QUICKLOOK_MAX_PX = 1024
"""Longest side of a quick-look PNG."""

THUMBNAIL_PX = 200
"""Longest side of the quick-look thumbnails embedded in the Dagster UI."""

HEATMAP_PREVIEW_PX = 800
"""Longest side of the heatmap preview embedded in the Dagster UI (the file is full size)."""


def _code(asset: dg.AssetsDefinition) -> str:
    return asset.key.path[-1].upper()


_IMAGE_CODES = {m.code for m in load_catalogue().modalities if m.is_image}
_image_assets = [a for a in modality_assets if _code(a) in _IMAGE_CODES]


@dg.asset(
    key=QUICKLOOKS_KEY,
    partitions_def=city_year_partitions,
    deps=[a.key for a in _image_assets],
    group_name="reports",
    kinds={"python", "png"},
)
def quicklooks(context: dg.AssetExecutionContext, cube: CubeResource) -> dg.MaterializeResult:
    """City-wide PNG quick-looks of each image modality, with fixed (never stretched) colours."""
    city, year = split_key(context)
    assert year is not None
    release, catalogue = cube.release(), cube.catalogue()
    written: dict[str, str] = {}
    skipped: dict[str, str] = {}
    previews: list[str] = []
    for code in (_code(a) for a in _image_assets):
        try:
            rgba = render_mosaic(release, catalogue, code, city, year, max_size=QUICKLOOK_MAX_PX)
        except ChipsNotFoundError as exc:
            skipped[code] = exc.message
            continue
        path = write_png(release.root / "quicklooks" / code / city / f"{year}.png", rgba)
        written[code] = str(path)
        previews.append(
            f"**{code}**\n\n![{code} {city} {year}]({png_data_uri(rgba, THUMBNAIL_PX)})"
        )
    context.log.info(f"quick-looks {city} {year}: {sorted(written)}; skipped {sorted(skipped)}")
    return dg.MaterializeResult(
        metadata={
            "paths": dg.MetadataValue.json(written),
            "skipped": dg.MetadataValue.json(skipped),
            "count": len(written),
            "preview": dg.MetadataValue.md("\n\n".join(previews) or "no image chips this year"),
        }
    )


@dg.asset(
    key=AVAILABILITY_REPORT_KEY,
    deps=[DATABASE_KEY],
    group_name="reports",
    kinds={"python", "csv", "png"},
)
def availability_report(cube: CubeResource) -> dg.MaterializeResult:
    """Availability by modality and by city (CSV + markdown) and a city × year heatmap."""
    release, catalogue = cube.release(), cube.catalogue()
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


report_assets = [quicklooks, availability_report]
