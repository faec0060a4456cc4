"""One partition's work, as plain functions that dask workers can import and run.

Each asset step hands one of these per partition to the compute resource. They take plain,
picklable values (specs, the source set, the release) and call the pure core; nothing here
imports Dagster, so a worker process stays light.
"""

from __future__ import annotations

from typing import Any

from citycube.catalogue import Catalogue, Temporal
from citycube.cube import Release
from citycube.errors import ChipsNotFoundError, SourceUnavailableError
from citycube.render import render_mosaic, write_png
from citycube.sources import SourceSet
from citycube.temporal import resolve

QUICKLOOK_MAX_PX = 1024
"""Longest side of a quick-look PNG."""


def fetch_source(
    sources: SourceSet,
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
    adapter = sources.product(product)
    base: dict[str, Any] = {
        "source_id": adapter.info.source_id,
        "synthetic": adapter.info.synthetic,
        "licence": adapter.info.licence,
    }
    if not used:
        return {**base, "available": False, "reason": "not_read_for_this_city"}
    source_year = None
    if period is not None:
        resolution = resolve(temporal, period, adapter.source_years(city))
        if not resolution.available:
            return {**base, "available": False, "reason": resolution.missing_reason}
        source_year = resolution.source_year
    try:
        item = adapter.fetch(city, source_year, release.sources_dir)
    except SourceUnavailableError as exc:
        return {**base, "available": False, "reason": exc.reason}
    return {
        **base,
        "available": True,
        "source_year": source_year if source_year is not None else "static",
        "source_version": item.version,
        "fingerprint": item.fingerprint,
        "files": {role: str(href) for role, href in item.files.items()},
    }


def render_quicklooks(
    catalogue: Catalogue, codes: list[str], city: str, year: int, release: Release
) -> dict[str, dict[str, str]]:
    """Write the quick-look PNG of every image modality with chips for a city-year."""
    written: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for code in codes:
        try:
            rgba = render_mosaic(release, catalogue, code, city, year, max_size=QUICKLOOK_MAX_PX)
        except ChipsNotFoundError as exc:
            skipped[code] = exc.message
            continue
        path = write_png(release.root / "quicklooks" / code / city / f"{year}.png", rgba)
        written[code] = str(path)
    return {"written": written, "skipped": skipped}
