"""What an OSM extract covers: its header's bounding box, or a boundary polygon (``.poly``).

An extract holds the objects inside the area it was cut to and nothing beyond, so an empty
place outside that area is unknown, not empty ground. The area is the extract's declared
bounding box, narrowed to the boundary polygon when the user gives one (extract providers
publish one ``.poly`` file per extract, in the Osmosis polygon filter format). Items carry it
as their ``coverage`` file, so processing marks pixels outside it invalid and tiles not covered
enough unavailable (``outside_source_coverage``), never zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import shapely
from pyproj import CRS

from citycube.catalogue.cities import get_city
from citycube.grid.tiles import city_grids
from citycube.items.rasters import transformer
from citycube.processing.vectors import coverage_fractions

WGS84 = CRS.from_epsg(4326)
DENSIFY_DEG = 0.001
"""Longest edge of a written boundary, degrees: a straight edge in degrees is curved in the
city's UTM zone, so edges are split before the polygon is projected."""


class BoundaryError(ValueError):
    """A boundary polygon file that cannot be read as one."""


def read_poly(text: str, name: str) -> shapely.Geometry:
    """A ``.poly`` file's area: the union of its rings minus the rings marked ``!`` (holes).

    Format: a name line; then sections, each a name line, one ``lon lat`` pair per line and
    ``END``; then a final ``END``.
    """
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise BoundaryError(f"boundary file {name} is empty")
    outer: list[shapely.Polygon] = []
    holes: list[shapely.Polygon] = []
    i = 1
    while i < len(lines):
        head = lines[i]
        if head == "END":
            if i != len(lines) - 1:
                raise BoundaryError(f"boundary file {name} has text after its final END")
            break
        ring: list[tuple[float, float]] = []
        i += 1
        while i < len(lines) and lines[i] != "END":
            parts = lines[i].split()
            try:
                lon, lat = float(parts[0]), float(parts[1])
            except (IndexError, ValueError):
                raise BoundaryError(
                    f"boundary file {name}: section {head!r} has a line that is not "
                    f"'longitude latitude': {lines[i]!r}"
                ) from None
            if not (-180 <= lon <= 180 and -90 <= lat <= 90):
                raise BoundaryError(
                    f"boundary file {name}: section {head!r} has a point outside the globe: "
                    f"{lines[i]!r}"
                )
            ring.append((lon, lat))
            i += 1
        if i >= len(lines):
            raise BoundaryError(f"boundary file {name}: section {head!r} has no END")
        if len(set(ring)) < 3:
            raise BoundaryError(f"boundary file {name}: section {head!r} has fewer than 3 points")
        polygon = shapely.make_valid(shapely.Polygon(ring))
        (holes if head.startswith("!") else outer).append(polygon)
        i += 1
    else:
        raise BoundaryError(f"boundary file {name} has no final END")
    if not outer:
        raise BoundaryError(f"boundary file {name} holds no polygon")
    area = shapely.union_all(outer)
    if holes:
        area = shapely.difference(area, shapely.union_all(holes))
    if area.is_empty or area.area == 0:
        raise BoundaryError(f"boundary file {name} encloses no area")
    return area


def extract_area(
    bbox: Sequence[float] | None, boundary: shapely.Geometry | None
) -> shapely.Geometry | None:
    """What an extract covers (WGS84): its header box, narrowed to the boundary if given."""
    area = shapely.box(*bbox) if bbox is not None else None
    if boundary is not None:
        area = boundary if area is None else shapely.intersection(area, boundary)
    return area


def coverage_in_window(
    area: shapely.Geometry, window: tuple[float, float, float, float]
) -> shapely.Geometry:
    """The part of the area within the item's window, with edges short enough to project."""
    cut = shapely.intersection(area, shapely.box(*window))
    parts = [p for p in shapely.get_parts(cut) if shapely.get_type_id(p) in (3, 6)]
    if not parts:
        return shapely.Polygon()
    return shapely.make_valid(shapely.segmentize(shapely.union_all(parts), DENSIFY_DEG))


def tile_shares(city: str, coverage: shapely.Geometry) -> dict[str, np.ndarray]:
    """Share of each tile's area inside the coverage, per scale (tiles in row-major order)."""
    if coverage.is_empty:
        return {scale: np.zeros(grid.n_tiles) for scale, grid in city_grids(city).items()}
    to_city = transformer(WGS84, CRS.from_epsg(get_city(city).epsg))
    projected = shapely.transform(
        coverage, lambda xy: np.column_stack(to_city.transform(xy[:, 0], xy[:, 1]))
    )
    projected = shapely.make_valid(projected)
    return {scale: coverage_fractions(grid, projected) for scale, grid in city_grids(city).items()}


def read_boundary(path: Path, name: str) -> shapely.Geometry:
    """A boundary polygon file read from disk."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BoundaryError(f"boundary file {name} is not a text .poly file") from None
    return read_poly(text, name)
