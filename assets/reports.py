"""Report assets of the published release: its availability report, its dataset card, then its
manifest (quick-looks are made with each source period's chips, by the derived assets)."""

import json
from collections.abc import Sequence
from pathlib import Path

import dagster as dg

from assets.cube import DATABASE_KEY
from citycube.catalogue.modalities import Catalogue
from pipelines.resources import CubeResource

AVAILABILITY_REPORT_KEY = dg.AssetKey(["cube", "availability_report"])
PAPER_COMPARISON_KEY = dg.AssetKey(["cube", "paper_comparison"])
DATASET_CARD_KEY = dg.AssetKey(["cube", "dataset_card"])
MANIFEST_KEY = dg.AssetKey(["cube", "manifest"])

HEATMAP_PREVIEW_PX = 800
"""Longest side of the heatmap preview embedded in the Dagster UI (the file is full size)."""


def _files_written(paths: dict[str, Path], shown: str, as_name: str) -> dg.MaterializeResult:
    """A materialisation listing the files an asset wrote, one markdown file shown in the UI."""
    return dg.MaterializeResult(
        metadata={
            **{name: dg.MetadataValue.path(str(p)) for name, p in paths.items()},
            as_name: dg.MetadataValue.md(paths[shown].read_text(encoding="utf-8")),
        }
    )


def build_report_assets(
    catalogue: Catalogue, after: Sequence[dg.AssetKey] = ()
) -> list[dg.AssetsDefinition]:
    """The availability and paper-vs-release reports of the published release, its dataset
    card, then its manifest (written after ``after`` too: every asset that adds files to the
    release or touches its database)."""

    @dg.asset(
        key=AVAILABILITY_REPORT_KEY,
        deps=[DATABASE_KEY],
        group_name="cube",
        kinds={"python", "csv", "png"},
    )
    def availability_report(cube: CubeResource) -> dg.MaterializeResult:
        """Availability by modality, field and city (CSV + markdown) and a city × year heatmap."""
        import pandas as pd
        from PIL import Image

        from citycube.reports.availability import write_report
        from citycube.reports.thumbnails import png_data_uri

        release = cube.release()
        paths = write_report(release, catalogue)
        modality_md = paths["modality_md"].read_text(encoding="utf-8")
        field_md = paths["field_md"].read_text(encoding="utf-8")
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
                "by_field": dg.MetadataValue.md(field_md),
                "by_city": dg.MetadataValue.md(city_md),
                "heatmap": dg.MetadataValue.md(f"![availability heatmap]({heatmap_uri})"),
            }
        )

    @dg.asset(
        key=PAPER_COMPARISON_KEY,
        deps=[DATABASE_KEY],
        group_name="cube",
        kinds={"python", "csv"},
    )
    def paper_comparison(cube: CubeResource) -> dg.MaterializeResult:
        """AgenticCity-Bench's Tables 10 and 11 beside the release's availability, and every
        documented departure from the paper with its reason (schemas/paper.yaml)."""
        from citycube.reports.paper import write_paper_comparison

        paths = write_paper_comparison(cube.release(), catalogue)
        return _files_written(paths, shown="paper_md", as_name="report")

    @dg.asset(
        key=DATASET_CARD_KEY,
        deps=[AVAILABILITY_REPORT_KEY],
        group_name="cube",
        kinds={"json", "markdown"},
    )
    def dataset_card(cube: CubeResource) -> dg.MaterializeResult:
        """STAC Collection (datacube), Croissant JSON-LD and markdown data card of the release.

        Written before the manifest, so ``citycube verify`` covers them too.
        """
        from citycube.reports.card import write_card

        paths = write_card(cube.release(), catalogue)
        return _files_written(paths, shown="card", as_name="card")

    @dg.asset(
        key=MANIFEST_KEY,
        deps=[DATASET_CARD_KEY, PAPER_COMPARISON_KEY, *after],
        group_name="cube",
        kinds={"json"},
    )
    def release_manifest(cube: CubeResource) -> dg.MaterializeResult:
        """Every file's SHA-256 and size, with sources, catalogue digest and engine version.

        Written last, so it covers the published database's Parquet, the chips, the quick-looks
        and the reports; ``citycube verify`` recomputes it.
        """
        from citycube.cube.manifest import read_manifest, write_manifest

        release = cube.release()
        meta_file = release.metadata_file
        meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.exists() else {}
        path = write_manifest(release, meta, catalogue)
        totals = read_manifest(release)["totals"]
        return dg.MaterializeResult(
            metadata={
                "path": dg.MetadataValue.path(str(path)),
                "files": totals["files"],
                "bytes": totals["bytes"],
            }
        )

    return [availability_report, paper_comparison, dataset_card, release_manifest]
