"""One partition's work, as plain functions that dask workers can import and run.

Each asset step hands one of these per partition to the compute resource. They take plain,
picklable values (specs, the source set, the release), call the pure core and return plain
metadata. Nothing here imports Dagster, and the raster and vector stack is imported inside the
functions, where the work runs: a run's own process only names them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from citycube.catalogue.modalities import Catalogue, ModalitySpec, Temporal
from citycube.items.fetched import fetch_and_record
from sources import SourceSetSpecFile, resolve_sources

if TYPE_CHECKING:
    from citycube.cube.release import Release
    from citycube.items.protocol import SourceSet

QUICKLOOK_MAX_PX = 1024
"""Longest side of a quick-look PNG."""


def fetch_source(
    sources: SourceSet | SourceSetSpecFile,
    product: str,
    temporal: Temporal,
    city: str,
    period: int | None,
    used: bool,
    release: Release,
) -> dict[str, Any]:
    """Fetch one product's item for a city's source period; metadata of what was fetched.

    A period the product does not publish, or a product no modality reads for this city, is
    recorded as such (with a reason) rather than fetched.
    """
    adapter = resolve_sources(sources).product(product)
    base: dict[str, Any] = {
        "source_id": adapter.info.source_id,
        "synthetic": adapter.info.synthetic,
        "licence": adapter.info.licence,
    }
    if not used:
        return {**base, "available": False, "reason": "not_read_for_this_city"}
    outcome = fetch_and_record(adapter, temporal, city, period, release.sources_dir)
    if outcome.item is None:
        return {**base, "available": False, "reason": outcome.missing_reason}
    item = outcome.item
    return {
        **base,
        "available": True,
        "source_year": item.source_year if item.source_year is not None else "static",
        "source_version": item.version,
        "fingerprint": item.fingerprint,
        "files": {role: str(href) for role, href in item.files.items()},
    }


def derive_with_quicklook(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    period: int | None,
    sources: SourceSet | SourceSetSpecFile,
    release: Release,
    preview_px: int = 0,
) -> dict[str, Any]:
    """Derive (or keep) one source period's results and render its chips' quick-look once.

    A quick-look belongs to a chip store, so it is made per source period too: a static DEM
    gets one, not one per calendar year. It is drawn from the chip blocks as they are written;
    only kept results whose picture is missing have their store read back. With
    ``preview_px``, a thumbnail of it (that longest side) comes back as ``preview``, a
    ``data:`` URI, made from the picture in hand rather than by the run decoding the file.
    """
    from citycube.cube.release import adopt_draft_file
    from citycube.processing.compute import derive
    from citycube.reports.render import QuickLook, png_data_uri, render_store, write_png

    gathered = (
        QuickLook(catalogue, modality.code, city, QUICKLOOK_MAX_PX) if modality.is_image else None
    )
    summary = derive(
        modality,
        catalogue,
        city,
        period,
        resolve_sources(sources),
        release,
        on_written=[gathered.add] if gathered else (),
    )
    metadata = summary.as_metadata()
    png = release.quicklook_file(modality.code, city, summary.label)
    if not summary.chips:
        png.unlink(missing_ok=True)
        return metadata
    picture = None
    if gathered is not None and not summary.reused:  # drawn from the blocks as written
        picture = gathered.render()
        write_png(png, picture)
    elif not png.exists() and not adopt_draft_file(release, png):
        # kept results: draw the store once if its picture is missing
        store = release.chip_store(modality.code, city, summary.label)
        picture = render_store(store, catalogue, modality.code, city, QUICKLOOK_MAX_PX, draft=True)
        write_png(png, picture)
    out = {**metadata, "quicklook": str(png)}
    if preview_px:
        if picture is None:
            from PIL import Image

            with Image.open(png) as image:
                out["preview"] = png_data_uri(image, preview_px)
        else:
            out["preview"] = png_data_uri(picture, preview_px)
    return out


def observe(modality: ModalitySpec, city: str, year: int, release: Release) -> dict[str, Any]:
    """Write one modality's observations for a city-year from its derived results."""
    from citycube.processing.compute import write_observations

    return write_observations(modality, city, year, release).as_metadata()
