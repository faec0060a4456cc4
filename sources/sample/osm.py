"""Sample OpenStreetMap products: road and building snapshots and public GPS trace points.

Each city gets one synthetic *fabric*: every road segment and building it will ever have, laid
out from the synthetic world so it agrees with imagery, land cover and population. Major roads
follow the world's corridors (radials where the urban potential forms ridges) plus ring roads; a
rotated lattice of secondary and tertiary roads bounds districts, and each district has its own
street grid, denser where the world is more urban. Buildings line the streets, larger, taller
and more often non-residential towards the centre. Nothing is drawn at sea, and only major
roads cross rivers (on bridges).

Time works on two clocks, as in real OSM history: a segment or building is *built* the first
year the world's urban intensity at its site passes its own threshold (so the city grows), and
it is *mapped* once the city's mapping completeness passes its own draw (so early snapshots are
sparse, the centre first, and function tags arrive later than outlines). A snapshot holds what
is both built and mapped by its date; nothing ever disappears, so later snapshots contain
earlier ones.

The fabric is generated once per world (cached) in the city's UTM CRS and written in EPSG:4326.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import ClassVar

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely
from pyproj import Transformer
from scipy import ndimage

from citycube.errors import SourceUnavailableError
from citycube.processing.classify import OSM_FUNCTION_TAG_COLUMNS
from sources.sample.calendar import (
    FIRST_GPS_YEAR,
    FIRST_OSM_EXTRACT,
    city_calendar,
    recent_years,
)
from sources.sample.layers import WGS84, Bounds, GeoPackageLayer, GeoParquetLayer
from sources.sample.world import (
    FIRST_YEAR,
    LAST_YEAR,
    GeneratedItem,
    SyntheticCity,
    product_window,
    transformer,
    utm_window,
    year_span,
)

NEVER = 9999
"""Built/mapped year of something that does not happen by the last calendar year."""
YEARS = np.arange(FIRST_YEAR, LAST_YEAR + 1)
"""Calendar years as an array, for vectorised first-year look-ups."""


# Which snapshots each source has per city: the latest years, as many as the city's sample
# calendar plans (``sources.sample.calendar``), the missing early years drawn from the seed.


def road_snapshot_years(city: str, seed: int = 0) -> list[int]:
    """OSM full-history road snapshots (1 January of each year) of a city."""
    count = city_calendar(city).roads
    return recent_years("osm_roads", city, count, FIRST_OSM_EXTRACT, seed)


def building_snapshot_years(city: str, seed: int = 0) -> list[int]:
    """OSM building snapshots of a city (independent of the road extracts)."""
    count = city_calendar(city).buildings
    return recent_years("osm_buildings", city, count, FIRST_OSM_EXTRACT, seed)


def gps_trace_years(city: str, seed: int = 0) -> list[int]:
    """Years with public GPS trace points in a city."""
    count = city_calendar(city).gps_traces
    return recent_years("osm_gps_traces", city, count, FIRST_GPS_YEAR, seed)


HIGHWAYS = (
    "motorway",
    "motorway_link",
    "trunk",
    "trunk_link",
    "primary",
    "primary_link",
    "secondary",
    "tertiary",
    "unclassified",
    "residential",
    "living_street",
    "service",
    "pedestrian",
    "footway",
)
"""OSM ``highway`` values the sample network uses (index = code in the arrays)."""
HW = {name: code for code, name in enumerate(HIGHWAYS)}
MAJOR_HIGHWAYS = frozenset(HIGHWAYS[:7])
"""Motorway to secondary, with links: what the road-network modality draws."""
MAJOR, SECONDARY, TERTIARY, LOCAL = range(4)
"""How a segment was laid out: major road, lattice line (secondary or tertiary), local street."""

FUNCTIONS = (
    "residential",
    "commercial",
    "education",
    "healthcare",
    "food",
    "civic",
    "transport",
    "leisure",
    "industrial",
    "religious",
    "other",
)
"""Latent function of a building; its OSM tags are drawn from it."""
TAG_COLUMNS = OSM_FUNCTION_TAG_COLUMNS
"""OSM function keys written as columns next to ``building`` (null where absent)."""

BUILDING_CAP = 160_000
"""Upper bound on a city's complete building stock; larger cities are thinned uniformly."""
LATTICE_SPACING_M = 800.0
"""Spacing of the tertiary road lattice, which also bounds the districts."""
SEGMENT_STEP_M = 100.0
"""Vertex spacing of long roads (each vertex pair is one segment)."""
SNAPSHOT_DAY = "01-01"
"""Full-history extracts are cut on 1 January."""


# --------------------------------------------------------------------------------------------
# Mapping completeness: how much of what exists is in OSM by a year.
# --------------------------------------------------------------------------------------------


def _logistic(x: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def _first_year_above(curve: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """First calendar year a rising curve (one value per year) exceeds each draw."""
    index = np.searchsorted(np.maximum.accumulate(curve), draws, side="right")
    return np.where(index < len(YEARS), YEARS[np.minimum(index, len(YEARS) - 1)], NEVER).astype(
        np.int16
    )


def major_road_completeness(city: str, seed: int) -> np.ndarray:
    """Share of major roads mapped, per calendar year: most of them from the first extract."""
    first = road_snapshot_years(city, seed)[0]
    return 0.86 + 0.13 * _logistic((YEARS - first) / 1.5)


def minor_road_completeness(city: str, seed: int) -> np.ndarray:
    """Share of minor roads mapped: about half at the first extract, nearly all later."""
    first = road_snapshot_years(city, seed)[0]
    return 0.3 + 0.69 * _logistic((YEARS - first - 2) / 2.0)


def building_completeness(city: str, seed: int) -> np.ndarray:
    """Share of buildings mapped: sparse early outlines, near-complete a decade later."""
    first = building_snapshot_years(city, seed)[0]
    return 0.97 * _logistic((YEARS - first - 4) / 2.2)


def label_share(city: str, seed: int) -> np.ndarray:
    """Share of mapped buildings that carry more than ``building=yes``."""
    first = building_snapshot_years(city, seed)[0]
    return 0.1 + 0.6 * _logistic((YEARS - first - 6) / 3.0)


# --------------------------------------------------------------------------------------------
# The fabric.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RoadNetwork:
    """Every road segment a city will have, with the years it is built and mapped.

    Segments of one line (a street or highway) are consecutive and in order, so a snapshot
    turns runs of present segments back into LineStrings.
    """

    x0: np.ndarray
    """Start easting (city UTM), m."""
    y0: np.ndarray
    """Start northing, m."""
    x1: np.ndarray
    """End easting, m."""
    y1: np.ndarray
    """End northing, m."""
    line: np.ndarray
    """Line id (int64)."""
    order: np.ndarray
    """Position of the segment within its line."""
    highway: np.ndarray
    """Index into ``HIGHWAYS``."""
    name: np.ndarray
    """Street name or None (object array)."""
    built: np.ndarray
    """First year the segment exists (``NEVER`` if not by 2025)."""
    present_from: np.ndarray
    """First year the segment is in OSM."""
    osm_id: np.ndarray
    """Way id of a run that starts with this segment (ids grow with mapping time)."""

    @property
    def length(self) -> np.ndarray:
        """Segment lengths, m."""
        return np.hypot(self.x1 - self.x0, self.y1 - self.y0)


@dataclass(frozen=True, eq=False)
class BuildingStock:
    """Every building a city will have: footprint, height, function tags and timing."""

    corners: np.ndarray
    """Footprint corners (n, 4, 2) in city UTM, counter-clockwise."""
    footprint_m2: np.ndarray
    """Footprint area, m²."""
    height_m: np.ndarray
    """Height above ground, m."""
    function: np.ndarray
    """Index into ``FUNCTIONS``."""
    building: np.ndarray
    """``building`` value once the building is labelled (object array)."""
    tags: dict[str, np.ndarray]
    """Function tags by OSM key (object arrays, None where absent) once labelled."""
    built: np.ndarray
    """First year the building exists."""
    present_from: np.ndarray
    """First year the outline is in OSM."""
    labelled_from: np.ndarray
    """First year its tags are in OSM (never before ``present_from``)."""
    osm_id: np.ndarray
    """Way id (ids grow with mapping time)."""

    @property
    def centre(self) -> tuple[np.ndarray, np.ndarray]:
        """Footprint centres (x, y), m."""
        return self.corners[:, :, 0].mean(axis=1), self.corners[:, :, 1].mean(axis=1)

    @property
    def storeys(self) -> np.ndarray:
        """Storeys implied by the height (at least one)."""
        return np.maximum(1, np.round(self.height_m / 3.2))


@dataclass(frozen=True, eq=False)
class CityFabric:
    """Road network and building stock of one synthetic city."""

    city: str
    """City key."""
    roads: RoadNetwork
    """All road segments."""
    buildings: BuildingStock
    """All buildings."""
    window: tuple[float, float, float, float]
    """Generated area (city extent plus the product margin), city UTM."""


class _Segments:
    """Collects road segments in pieces and concatenates them once."""

    def __init__(self) -> None:
        self.parts: list[dict[str, np.ndarray]] = []
        self.next_line = 0

    def lines(self, count: int) -> np.ndarray:
        """Fresh line ids."""
        ids = np.arange(self.next_line, self.next_line + count, dtype=np.int64)
        self.next_line += count
        return ids

    def add(self, **columns: np.ndarray) -> None:
        n = len(columns["x0"])
        self.parts.append({k: np.broadcast_to(v, (n,)).copy() for k, v in columns.items()})

    def add_polyline(
        self, x: np.ndarray, y: np.ndarray, highway: np.ndarray | int, built: int, name: str | None
    ) -> None:
        """One line from its vertices; ``highway`` per segment or one code for all."""
        n = len(x) - 1
        if n < 1:
            return
        self.add(
            x0=x[:-1],
            y0=y[:-1],
            x1=x[1:],
            y1=y[1:],
            line=self.lines(1),
            order=np.arange(n, dtype=np.int32),
            highway=np.asarray(highway, dtype=np.int8),
            name=np.array([name], dtype=object),
            built=np.asarray(built, dtype=np.int16),
            kind=np.int8(MAJOR),
            rural=False,
        )

    def concat(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}


_STREET_WORDS = (
    "Harbour Park Mill Station Church Market King Queen North South River Hill Oak Elm "
    "Cedar Maple Bridge Garden Lake Castle Meadow Orchard Spring Victoria Albert Union "
    "High Grove Chapel Forest Willow Ash Birch Beacon Ferry Dock Canal Abbey Rose "
    "Windmill Granite Copper Lantern Heron Falcon Linden Poplar Summit Valley Brook "
    "Tower Academy Liberty Prospect Fountain Clover Juniper Pine Hawthorn Sterling Crown"
)
"""Words street names are made of (with a suffix by road class)."""
_NAME_WORDS = np.array(_STREET_WORDS.split(), dtype=object)
_NAME_SUFFIXES: dict[str, tuple[str, ...]] = {
    "motorway": ("Motorway", "Expressway", "Freeway"),
    "trunk": ("Highway", "Road"),
    "primary": ("Avenue", "Road", "Boulevard"),
    "secondary": ("Road", "Street", "Avenue"),
    "tertiary": ("Street", "Lane", "Road"),
    "residential": ("Street", "Close", "Way", "Court", "Place", "Drive", "Lane", "Crescent"),
    "living_street": ("Mews", "Yard"),
    "pedestrian": ("Walk", "Mall", "Arcade"),
}


def _names(rng: np.random.Generator, highway: np.ndarray) -> np.ndarray:
    """A street name per line, or None for links, service roads, paths and rural roads."""
    words = _NAME_WORDS[rng.integers(len(_NAME_WORDS), size=len(highway))]
    out = np.full(len(highway), None, dtype=object)
    draw = rng.integers(1 << 30, size=len(highway))
    for name, suffixes in _NAME_SUFFIXES.items():
        hit = highway == HW[name]
        if hit.any():
            chosen = np.array(suffixes, dtype=object)[draw[hit] % len(suffixes)]
            out[hit] = words[hit] + " " + chosen
    return out


def _first_built(
    world: SyntheticCity, x: np.ndarray, y: np.ndarray, threshold: np.ndarray
) -> np.ndarray:
    """First year the world's urban intensity at (x, y) reaches ``threshold`` (NEVER if not).

    Urban intensity never falls, so scanning backwards from 2025 leaves the first year.
    """
    pts = world.points(x, y)
    first = np.full(np.shape(x), NEVER, dtype=np.int16)
    for year in range(LAST_YEAR, FIRST_YEAR - 1, -1):
        reached = world.urban_intensity(pts, year) >= threshold
        if not reached.any():
            break
        first[reached] = year
    return first


def _rotate(a: np.ndarray, b: np.ndarray, angle: float) -> tuple[np.ndarray, np.ndarray]:
    c, s = math.cos(angle), math.sin(angle)
    return a * c - b * s, a * s + b * c


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parent index, rank within parent) for ``counts[i]`` children of each parent i."""
    counts = np.maximum(counts, 0).astype(np.int64)
    parent = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    return parent, np.arange(int(counts.sum())) - starts[parent]


def _clip_to_square(
    px: np.ndarray, py: np.ndarray, dx: np.ndarray, dy: np.ndarray, half: float
) -> tuple[np.ndarray, np.ndarray]:
    """Parameter range of the lines (px, py) + t (dx, dy) inside the square |x|, |y| <= half."""
    t0 = np.full(px.shape, -np.inf)
    t1 = np.full(px.shape, np.inf)
    for p, d in ((px, dx), (py, dy)):
        flat = np.abs(d) < 1e-9
        safe = np.where(flat, 1.0, d)
        lo, hi = (-half - p) / safe, (half - p) / safe
        inside = np.abs(p) <= half
        lo_ = np.where(flat, np.where(inside, -np.inf, np.inf), np.minimum(lo, hi))
        hi_ = np.where(flat, np.where(inside, np.inf, -np.inf), np.maximum(lo, hi))
        t0, t1 = np.maximum(t0, lo_), np.minimum(t1, hi_)
    return t0, t1


def _line_nodes(
    t0: np.ndarray, t1: np.ndarray, offset: np.ndarray, spacing: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nodes along clipped lines: both ends plus every crossing street in between.

    Returns (line index, rank along the line, parameter t) for all nodes, lines in order.
    """
    first = np.ceil((t0 - offset) / spacing + 1e-6)
    last = np.floor((t1 - offset) / spacing - 1e-6)
    inner = np.maximum(last - first + 1, 0).astype(np.int64)
    line, rank = _expand(inner + 2)
    t = offset[line] + (first[line] + rank - 1) * spacing[line]
    t = np.where(rank == 0, t0[line], t)
    return line, rank, np.where(rank == inner[line] + 1, t1[line], t)


@lru_cache(maxsize=4)
def city_fabric(world: SyntheticCity) -> CityFabric:
    """The (cached) road network and building stock of a world."""
    return _FabricBuilder(world).build()


class _FabricBuilder:
    """Lays out one city's roads and buildings; see the module docstring for the design."""

    def __init__(self, world: SyntheticCity) -> None:
        self.world = world
        self.scale = world.spatial_scale
        self.cx, self.cy = world.centre_xy
        self.window = utm_window(world)
        self.alpha = float(world.rng("osm-frame").uniform(-math.pi / 4, math.pi / 4))
        self.segments = _Segments()
        rng = world.rng("osm-warp")
        self.waves = [
            (rng.uniform(12.0, 20.0), rng.uniform(3000.0, 7000.0), rng.uniform(0, 2 * math.pi, 4))
            for _ in range(3)
        ]

    # ---- helpers ---------------------------------------------------------------------------

    def _warp(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bend the straight layout gently: a smooth shift of some tens of metres.

        Waves several kilometres long keep the shift almost linear along a block, so a straight
        street between two shifted corners still runs where its shifted buildings expect it.
        """
        dx, dy = np.zeros_like(x), np.zeros_like(y)
        for amplitude, length, phase in self.waves:
            k = 2 * math.pi / length
            dx += amplitude * np.sin(k * y + phase[0]) * np.cos(0.7 * k * x + phase[1])
            dy += amplitude * np.sin(k * x + phase[2]) * np.cos(0.7 * k * y + phase[3])
        return x + dx, y + dy

    def _to_utm(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """City frame (rotated by alpha, centred on the landmark) to UTM."""
        x, y = _rotate(a, b, self.alpha)
        return x + self.cx, y + self.cy

    def _in_window(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        xmin, ymin, xmax, ymax = self.window
        return (x >= xmin) & (x <= xmax) & (y >= ymin) & (y <= ymax)

    # ---- major roads -----------------------------------------------------------------------

    def _corridor_angles(self) -> list[float]:
        """Directions in which the world's urban potential forms radial ridges, strongest first."""
        theta = np.linspace(0, 2 * math.pi, 720, endpoint=False)
        score = np.zeros_like(theta)
        for radius in (4500 * self.scale, 8000 * self.scale):
            pts = self.world.points(
                self.cx + radius * np.cos(theta), self.cy + radius * np.sin(theta)
            )
            potential = pts.field("potential").astype(np.float64)
            score += potential - np.median(potential)
        score = ndimage.uniform_filter1d(score, 9, mode="wrap")
        peak = score == ndimage.maximum_filter1d(score, 21, mode="wrap")
        chosen: list[float] = []
        for i in np.argsort(-score):
            if not peak[i] or score[i] < 0.1:
                continue
            angle = float(theta[i])
            if all(abs((angle - c + math.pi) % (2 * math.pi) - math.pi) > 0.45 for c in chosen):
                chosen.append(angle)
            if len(chosen) == 6:
                break
        return chosen

    def _radial(self, angle: float, phase: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vertices of a gently curving road from the centre to the window edge, and radii."""
        xmin, ymin, xmax, ymax = self.window
        reach = math.hypot(max(xmax - self.cx, self.cx - xmin), max(ymax - self.cy, self.cy - ymin))
        r = np.arange(0.0, reach + SEGMENT_STEP_M, SEGMENT_STEP_M)
        theta = angle + 0.07 * np.sin(r / 2500.0 + phase)
        x, y = self.cx + r * np.cos(theta), self.cy + r * np.sin(theta)
        keep = self._in_window(x, y)
        last = int(np.flatnonzero(keep).max()) + 1 if keep.any() else 0
        return x[:last], y[:last], r[:last]

    def _ring(self, radius: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """A closed, slightly irregular ring road."""
        n = max(int(2 * math.pi * radius / SEGMENT_STEP_M), 24)
        theta = np.linspace(0, 2 * math.pi, n + 1)
        theta[-1] = 0.0
        p1, p2 = rng.uniform(0, 2 * math.pi, 2)
        r = radius * (1 + 0.07 * np.sin(2 * theta + p1) + 0.04 * np.sin(3 * theta + p2))
        return self.cx + r * np.cos(theta), self.cy + r * np.sin(theta)

    def _major_roads(self) -> None:
        rng = self.world.rng("osm-major")
        inner, outer = 2600.0 * self.scale, 8000.0 * self.scale
        corridors = self._corridor_angles()
        while len(corridors) < 3:
            corridors.append(float(rng.uniform(0, 2 * math.pi)))
        radials: list[tuple[float, str]] = [
            (a, "motorway" if k < 2 else "trunk") for k, a in enumerate(corridors)
        ]
        ordered = sorted(corridors)
        for a, b in zip(ordered, [*ordered[1:], ordered[0] + 2 * math.pi], strict=True):
            if b - a > 1.0:
                radials.append(((a + b) / 2, "primary"))
        ring_year = FIRST_YEAR
        if self.world.traits.growth_start > FIRST_YEAR:
            ring_year = min(self.world.traits.growth_start + 3, LAST_YEAR)  # a new town's ring

        junctions: list[tuple[float, str]] = []
        for angle, kind in radials:
            x, y, r = self._radial(angle, float(rng.uniform(0, 2 * math.pi)))
            if kind == "primary":
                codes = np.where(r[:-1] < 1.2 * outer, HW["primary"], HW["secondary"])
            else:
                codes = np.where(r[:-1] < inner, HW["primary"], HW[kind])
                junctions.append((angle, kind))
            self._add_major(x, y, codes, FIRST_YEAR, kind, rng)
        for radius, kind, year in ((inner, "primary", FIRST_YEAR), (outer, "motorway", ring_year)):
            x, y = self._ring(radius, rng)
            self._add_major(x, y, np.int8(HW[kind]), year, kind, rng)
            if kind == "motorway":
                self._links(x, y, junctions, year)

    def _links(
        self, ring_x: np.ndarray, ring_y: np.ndarray, junctions: list[tuple[float, str]], year: int
    ) -> None:
        """Two slip roads where each motorway or trunk radial meets the motorway ring."""
        ring_angle = np.arctan2(ring_y - self.cy, ring_x - self.cx)
        ring_r = np.hypot(ring_x - self.cx, ring_y - self.cy)
        for angle, kind in junctions:
            i = int(np.argmin(np.abs((ring_angle - angle + math.pi) % (2 * math.pi) - math.pi)))
            jr = float(ring_r[i])
            jx, jy = self.cx + jr * math.cos(angle), self.cy + jr * math.sin(angle)
            code = HW["motorway_link"] if kind == "motorway" else HW["trunk_link"]
            for side in (-1, 1):
                rr = jr - side * 300.0
                start = (self.cx + rr * math.cos(angle), self.cy + rr * math.sin(angle))
                k = (i + side * 3) % (len(ring_x) - 1)
                end = (float(ring_x[k]), float(ring_y[k]))
                mid = (
                    0.5 * (start[0] + end[0]) * 0.7 + 0.3 * jx,
                    0.5 * (start[1] + end[1]) * 0.7 + 0.3 * jy,
                )
                x = np.array([start[0], mid[0], end[0]])
                y = np.array([start[1], mid[1], end[1]])
                self._add_major(x, y, np.int8(code), year, None, None)

    def _add_major(
        self,
        x: np.ndarray,
        y: np.ndarray,
        codes: np.ndarray | np.int8,
        built: int,
        kind: str | None,
        rng: np.random.Generator | None,
    ) -> None:
        name = None
        if kind is not None and rng is not None:
            suffixes = _NAME_SUFFIXES[kind]
            word = _NAME_WORDS[rng.integers(len(_NAME_WORDS))]
            name = f"{word} {suffixes[int(rng.integers(len(suffixes)))]}"
        self.segments.add_polyline(x, y, codes, built, name)

    # ---- lattice of secondary and tertiary roads ---------------------------------------------

    def _frame_bounds(self) -> tuple[float, float, float, float]:
        """Window bounds in the rotated city frame."""
        xmin, ymin, xmax, ymax = self.window
        cx = np.array([xmin, xmax, xmax, xmin]) - self.cx
        cy = np.array([ymin, ymin, ymax, ymax]) - self.cy
        a, b = _rotate(cx, cy, -self.alpha)
        return float(a.min()), float(b.min()), float(a.max()), float(b.max())

    def _lattice(self) -> tuple[float, float]:
        """Straight secondary (every third line) and tertiary roads; returns the lattice offset."""
        rng = self.world.rng("osm-lattice")
        d = LATTICE_SPACING_M
        amin, bmin, amax, bmax = self._frame_bounds()
        oa, ob = (float(v) for v in rng.uniform(0, d, 2))
        for axis in (0, 1):
            lo, hi = (amin, amax) if axis == 0 else (bmin, bmax)
            along_lo, along_hi = (bmin, bmax) if axis == 0 else (amin, amax)
            origin = oa if axis == 0 else ob
            k = np.arange(math.floor((lo - origin) / d), math.ceil((hi - origin) / d) + 1)
            fixed = origin + k * d
            along = np.arange(along_lo, along_hi + SEGMENT_STEP_M, SEGMENT_STEP_M)
            fa = np.repeat(fixed, len(along))
            fb = np.tile(along, len(fixed))
            a, b = (fa, fb) if axis == 0 else (fb, fa)
            x, y = self._to_utm(a, b)
            x, y = x.reshape(len(fixed), -1), y.reshape(len(fixed), -1)
            n_lines, n_vertices = x.shape
            lines = self.segments.lines(n_lines)
            secondary = (k % 3) == 0
            rural_secondary = rng.random(n_lines) < 0.5
            rural_tertiary = rng.random(n_lines) < 0.3
            self.segments.add(
                x0=x[:, :-1].ravel(),
                y0=y[:, :-1].ravel(),
                x1=x[:, 1:].ravel(),
                y1=y[:, 1:].ravel(),
                line=np.repeat(lines, n_vertices - 1),
                order=np.tile(np.arange(n_vertices - 1, dtype=np.int32), n_lines),
                highway=np.repeat(
                    np.where(secondary, HW["secondary"], HW["tertiary"]), n_vertices - 1
                ).astype(np.int8),
                name=np.array([None], dtype=object),
                built=np.int16(FIRST_YEAR),  # settled in _settle_segments
                kind=np.repeat(np.where(secondary, SECONDARY, TERTIARY), n_vertices - 1).astype(
                    np.int8
                ),
                rural=np.repeat(
                    np.where(secondary, rural_secondary, rural_tertiary), n_vertices - 1
                ),
            )
        return oa, ob

    # ---- districts: local street grids and buildings -----------------------------------------

    def _districts(self, oa: float, ob: float) -> dict[str, np.ndarray]:
        """Lattice cells that become urban by 2025, with their street-grid parameters."""
        d = LATTICE_SPACING_M
        amin, bmin, amax, bmax = self._frame_bounds()
        ia = np.arange(math.floor((amin - oa) / d), math.ceil((amax - oa) / d))
        ib = np.arange(math.floor((bmin - ob) / d), math.ceil((bmax - ob) / d))
        ga, gb = np.meshgrid(oa + (ia + 0.5) * d, ob + (ib + 0.5) * d)
        ac, bc = ga.ravel(), gb.ravel()
        offsets = np.array([-0.35, 0.0, 0.35]) * d
        sa = (ac[:, None, None] + offsets[None, :, None]).repeat(3, axis=2)
        sb = (bc[:, None, None] + offsets[None, None, :]).repeat(3, axis=1)
        x, y = self._to_utm(sa, sb)
        pts = self.world.points(x, y)
        urban = self.world.urban_intensity(pts, LAST_YEAR).reshape(len(ac), 9)
        nonres = pts.field("nonres").reshape(len(ac), 9).mean(axis=1)
        xc, yc = self._to_utm(ac, bc)
        active = (urban.max(axis=1) >= 0.05) & self._in_window(xc, yc)
        u = urban.mean(axis=1)[active]
        n = int(active.sum())
        rng = self.world.rng("osm-districts")
        gridded = rng.random(n) < 0.45
        beta = np.where(gridded, 0.0, rng.uniform(-0.5, 0.5, n))
        s1 = np.clip(175.0 - 85.0 * u, 85.0, 180.0) * rng.uniform(0.9, 1.1, n)
        nr = nonres[active]
        width = (11.0 + 30.0 * u**2 + 20.0 * nr * u) * rng.uniform(0.9, 1.15, n)
        setback = 6.0 + 7.0 * (1 - u)
        depth = np.minimum(9.0 + 28.0 * u + 14.0 * nr * u, s1 / 2 - setback - 2.0)
        return {
            "ac": ac[active],
            "bc": bc[active],
            "urban": u,
            "beta": beta,
            "s1": s1,
            "s2": s1 * rng.uniform(1.6, 2.6, n),
            "o1": rng.uniform(0, 1, n),
            "o2": rng.uniform(0, 1, n),
            "width": width,
            "gap": 3.5 + 7.0 * (1 - u),
            "setback": setback,
            "depth": depth,
        }

    def _district_streets(self, dist: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Long and cross streets of every district, clipped to the district square.

        Returns the long-street blocks (segments between cross streets), where buildings go.
        """
        half = LATTICE_SPACING_M / 2
        c, s = np.cos(dist["beta"]), np.sin(dist["beta"])
        blocks: dict[str, list[np.ndarray]] = {k: [] for k in ("d", "q", "ta", "tb", "seg")}
        for family in ("long", "cross"):
            spacing = dist["s1"] if family == "long" else dist["s2"]
            other = dist["s2"] if family == "long" else dist["s1"]
            offset = (dist["o1"] if family == "long" else dist["o2"]) * spacing
            other_offset = (dist["o2"] if family == "long" else dist["o1"]) * other
            reach = half * math.sqrt(2)
            kmin = np.floor((-reach - offset) / spacing)
            count = (np.floor((reach - offset) / spacing) - kmin + 1).astype(np.int64)
            d, rank = _expand(count)
            q = offset[d] + (kmin[d] + rank) * spacing[d]
            if family == "long":  # point(t) = R(beta) (t, q)
                px, py, dx, dy = -q * s[d], q * c[d], c[d], s[d]
            else:  # point(t) = R(beta) (q, t)
                px, py, dx, dy = q * c[d], q * s[d], -s[d], c[d]
            t0, t1 = _clip_to_square(px, py, dx, dy, half)
            ok = t1 - t0 > 20.0
            d, q, px, py, dx, dy, t0, t1 = (v[ok] for v in (d, q, px, py, dx, dy, t0, t1))
            line, rank, t = _line_nodes(t0, t1, other_offset[d], other[d])
            same = line[:-1] == line[1:]
            i = np.flatnonzero(same & (t[1:] - t[:-1] > 8.0))
            seg_line = line[i]
            a0 = dist["ac"][d[seg_line]] + px[seg_line] + t[i] * dx[seg_line]
            b0 = dist["bc"][d[seg_line]] + py[seg_line] + t[i] * dy[seg_line]
            a1 = dist["ac"][d[seg_line]] + px[seg_line] + t[i + 1] * dx[seg_line]
            b1 = dist["bc"][d[seg_line]] + py[seg_line] + t[i + 1] * dy[seg_line]
            x0, y0 = self._to_utm(a0, b0)
            x1, y1 = self._to_utm(a1, b1)
            line_ids = self.segments.lines(len(t0))
            first_index = sum(len(p["x0"]) for p in self.segments.parts)
            self.segments.add(
                x0=x0,
                y0=y0,
                x1=x1,
                y1=y1,
                line=line_ids[seg_line],
                order=rank[i].astype(np.int32),
                highway=np.int8(HW["residential"]),
                name=np.array([None], dtype=object),
                built=np.int16(FIRST_YEAR),  # settled in _settle_segments
                kind=np.int8(LOCAL),
                rural=False,
            )
            if family == "long":
                blocks["d"].append(d[seg_line])
                blocks["q"].append(q[seg_line])
                blocks["ta"].append(t[i])
                blocks["tb"].append(t[i + 1])
                blocks["seg"].append(first_index + np.arange(len(i)))
        return {k: np.concatenate(v) for k, v in blocks.items()}

    def _slots(
        self, dist: dict[str, np.ndarray], blocks: dict[str, np.ndarray], thin: float
    ) -> dict[str, np.ndarray]:
        """Building plots along both sides of each block, kept by local urban intensity."""
        rng = self.world.rng("osm-slots")
        d = blocks["d"]
        width, gap = dist["width"][d], dist["gap"][d]
        margin = dist["setback"][d] + 2.0
        usable = blocks["tb"] - blocks["ta"] - 2 * margin
        per_side = np.floor((usable + gap) / (width + gap)).astype(np.int64)
        per_side = np.where(dist["depth"][d] >= 6.0, per_side, 0)
        block, rank = _expand(np.repeat(per_side, 2))
        side = np.where(block % 2 == 0, -1.0, 1.0)
        block //= 2
        dd = d[block]
        w, g = width[block], gap[block]
        used = per_side[block] * (w + g) - g
        start = blocks["ta"][block] + margin[block] + (usable[block] - used) / 2
        t = start + rank * (w + g) + w / 2
        w = w * rng.uniform(0.75, 1.0, len(t))
        depth = dist["depth"][dd] * rng.uniform(0.7, 1.0, len(t))
        near = blocks["q"][block] + side * dist["setback"][dd]
        far = near + side * depth
        # Corners in the district frame (t along the street, q across), counter-clockwise.
        ct = np.stack([t - w / 2, t + w / 2, t + w / 2, t - w / 2], axis=1)
        cq = np.stack([near, near, far, far], axis=1)
        flip = side < 0  # keep every ring counter-clockwise
        ct[flip] = ct[flip][:, ::-1]
        cq[flip] = cq[flip][:, ::-1]
        c, s = np.cos(dist["beta"][dd])[:, None], np.sin(dist["beta"][dd])[:, None]
        da, db = ct * c - cq * s, ct * s + cq * c
        inside = (np.abs(da) <= LATTICE_SPACING_M / 2 - 9.0).all(axis=1) & (
            np.abs(db) <= LATTICE_SPACING_M / 2 - 9.0
        ).all(axis=1)
        x, y = self._to_utm(da + dist["ac"][dd][:, None], db + dist["bc"][dd][:, None])
        site = self.world.points(x.mean(axis=1), y.mean(axis=1))
        urban = self.world.urban_intensity(site, LAST_YEAR)
        occupied = rng.random(len(t)) < (0.1 + 0.75 * urban) * thin
        keep = inside & occupied & (urban > 0.02)
        return {"x": x[keep], "y": y[keep], "street": blocks["seg"][block][keep]}

    # ---- settling years, classes and names ---------------------------------------------------

    def _settle_segments(self, seg: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Final classes and built years; drops segments at sea, on water or never built."""
        world = self.world
        rng = world.rng("osm-segments")
        mx, my = (seg["x0"] + seg["x1"]) / 2, (seg["y0"] + seg["y1"]) / 2
        pts = world.points(mx, my)
        water = pts.water
        urban = world.urban_intensity(pts, LAST_YEAR)
        park = pts.field("park")
        nonres = pts.field("nonres")
        r = np.hypot(mx - self.cx, my - self.cy)
        kind, rural = seg["kind"], seg["rural"]
        highway = seg["highway"].astype(np.int16)
        built = seg["built"].astype(np.int16)
        # Major roads cross rivers on bridges but never run at sea; files end at the window.
        keep = (
            ~pts.sea & self._in_window(seg["x0"], seg["y0"]) & self._in_window(seg["x1"], seg["y1"])
        )

        # Secondary lattice lines: regional roads all along where the line is one (``rural``),
        # elsewhere they arrive with the built-up area.
        sec = kind == SECONDARY
        urban_sec = sec & (urban >= 0.03)
        grows = urban_sec & ~rural
        built[grows] = _first_built(world, mx[grows], my[grows], np.float32(0.03))
        keep &= ~sec | urban_sec | rural

        # Tertiary lattice lines: streets in town, paths through parks, some rural lanes.
        ter = kind == TERTIARY
        urban_ter = ter & (urban >= 0.1)
        path = ter & (park > 0.5)
        grows = urban_ter & ~rural
        built[grows] = _first_built(world, mx[grows], my[grows], np.float32(0.1))
        highway[ter & ~urban_ter] = HW["unclassified"]
        highway[path] = HW["footway"]
        built[path] = FIRST_YEAR
        keep &= ~ter | ((urban_ter | path | rural) & ~water)

        # Local streets appear once their neighbourhood passes their own threshold.
        local = kind == LOCAL
        threshold = rng.uniform(0.05, 0.2, len(mx)).astype(np.float32)
        built[local] = _first_built(world, mx[local], my[local], threshold[local])
        draw = rng.random(len(mx))
        core = np.exp(-r / (1500.0 * self.scale))
        code = np.full(len(mx), HW["residential"], dtype=np.int16)
        code[draw < 0.12 * core] = HW["pedestrian"]
        code[(draw > 0.99) & (urban > 0.3)] = HW["living_street"]
        code[(draw > 0.87) & (draw <= 0.99) & (nonres > 0.45)] = HW["service"]
        footway = local & (park > 0.4)
        code[footway] = HW["footway"]
        built[footway] = FIRST_YEAR
        highway[local] = code[local]
        keep &= ~local | ~water

        keep &= built <= LAST_YEAR
        out = {k: v[keep] for k, v in seg.items()}
        out["highway"] = highway[keep].astype(np.int8)
        out["built"] = built[keep]
        out["r"] = r[keep]
        return out

    def _road_network(self, seg: dict[str, np.ndarray]) -> tuple[RoadNetwork, np.ndarray]:
        """Names, mapping years and ids, lines in order; also each segment's raw index."""
        city, seed = self.world.city, self.world.seed
        rng = self.world.rng("osm-road-mapping")
        sort = np.lexsort((seg["order"], seg["line"]))
        seg = {k: v[sort] for k, v in seg.items()}
        _, first_of_line, line_of_seg = np.unique(
            seg["line"], return_index=True, return_inverse=True
        )
        generated = _names(rng, seg["highway"][first_of_line])[line_of_seg]
        names = np.where(pd.isna(seg["name"]), generated, seg["name"])
        links = np.isin(seg["highway"], [HW["motorway_link"], HW["trunk_link"]])
        names[links] = None
        # Whole ways are traced at once; minor streets near the centre first.
        line_draw = rng.random(len(first_of_line))[line_of_seg]
        r_ref = 15000.0 * self.scale
        minor_draw = np.clip(0.7 * line_draw + 0.3 * np.clip(seg["r"] / r_ref, 0, 1), 0, 0.999)
        major = np.isin(seg["highway"], [HW[h] for h in MAJOR_HIGHWAYS])
        mapped = np.where(
            major,
            _first_year_above(major_road_completeness(city, seed), line_draw),
            _first_year_above(minor_road_completeness(city, seed), minor_draw),
        )
        present = np.maximum(seg["built"], mapped).astype(np.int16)
        rank = np.lexsort((np.arange(len(present)), present))
        osm_id = np.empty(len(present), dtype=np.int64)
        osm_id[rank] = 4_000_000 + 17 * np.arange(len(present), dtype=np.int64)
        network = RoadNetwork(
            x0=seg["x0"],
            y0=seg["y0"],
            x1=seg["x1"],
            y1=seg["y1"],
            line=seg["line"],
            order=seg["order"],
            highway=seg["highway"],
            name=names.astype(object),
            built=seg["built"],
            present_from=present,
            osm_id=osm_id,
        )
        return network, seg["uid"]

    def _building_stock(
        self, slots: dict[str, np.ndarray], roads: RoadNetwork, street_built: np.ndarray
    ) -> BuildingStock:
        """Footprints off water, parks and major roads, with heights, tags and timing."""
        world, city, seed = self.world, self.world.city, self.world.seed
        rng = world.rng("osm-buildings")
        x, y = self._warp(slots["x"], slots["y"])
        on_water = world.points(x, y).water.any(axis=1)
        cx, cy = x.mean(axis=1), y.mean(axis=1)
        site = world.points(cx, cy)
        street_year = street_built[slots["street"]]
        keep = ~on_water & (site.field("park") < 0.5) & (street_year <= LAST_YEAR)
        keep &= self._in_window(x, y).all(axis=1)
        major = np.isin(roads.highway, [HW[h] for h in MAJOR_HIGHWAYS])
        tree = shapely.STRtree(
            shapely.linestrings(
                np.stack(
                    [roads.x0[major], roads.y0[major], roads.x1[major], roads.y1[major]], axis=1
                ).reshape(-1, 2, 2)
            )
        )
        candidates = np.flatnonzero(keep)
        polygons = shapely.polygons(np.stack([x[candidates], y[candidates]], axis=2))
        hits = tree.query(polygons, predicate="dwithin", distance=12.0)
        keep[candidates[np.unique(hits[0])]] = False
        # Footprint areas of the candidates: the buildings kept below are a subset of them.
        area = np.zeros(len(keep))
        area[candidates] = shapely.area(polygons)

        x, y, cx, cy, street_year, area = (v[keep] for v in (x, y, cx, cy, street_year, area))
        threshold = rng.uniform(0.06, 0.32, len(cx)).astype(np.float32)
        built = np.maximum(_first_built(world, cx, cy, threshold), street_year)
        ok = built <= LAST_YEAR
        x, y, cx, cy, built, area = (v[ok] for v in (x, y, cx, cy, built, area))
        n = len(cx)
        site = world.points(cx, cy)
        urban = world.urban_intensity(site, LAST_YEAR)
        r = np.hypot(cx - self.cx, cy - self.cy)
        core = np.exp(-r / (2500.0 * self.scale))

        function = _draw_functions(rng, urban, site.field("nonres"), core)
        building, tags = _draw_tags(rng, city, function, urban)
        height = _draw_heights(rng, function, urban, site.field("tower"))

        r_ref = 15000.0 * self.scale
        map_draw = np.clip(0.7 * rng.random(n) + 0.3 * np.clip(r / r_ref, 0, 1), 0, 0.999)
        present = np.maximum(built, _first_year_above(building_completeness(city, seed), map_draw))
        # Mappers tag schools, shops and churches sooner than houses.
        eager = np.where(function == FUNCTIONS.index("residential"), 1.0, 0.6)
        label_draw = np.clip(rng.random(n) * eager, 0, 0.999)
        labelled = np.maximum(present, _first_year_above(label_share(city, seed), label_draw))
        rank = np.lexsort((np.arange(n), present))
        osm_id = np.empty(n, dtype=np.int64)
        osm_id[rank] = 90_000_000 + 13 * np.arange(n, dtype=np.int64)
        return BuildingStock(
            corners=np.stack([x, y], axis=2),
            footprint_m2=area.astype(np.float32),
            height_m=height,
            function=function,
            building=building,
            tags=tags,
            built=built.astype(np.int16),
            present_from=present.astype(np.int16),
            labelled_from=labelled.astype(np.int16),
            osm_id=osm_id,
        )

    def build(self) -> CityFabric:
        """Roads first (major, lattice, district streets), then the buildings along them."""
        self._major_roads()
        oa, ob = self._lattice()
        dist = self._districts(oa, ob)
        blocks = self._district_streets(dist)
        # Thin very large cities uniformly so the complete stock stays near BUILDING_CAP.
        d = blocks["d"]
        expected = np.sum(
            2
            * (blocks["tb"] - blocks["ta"])
            / (dist["width"][d] + dist["gap"][d])
            * (0.1 + 0.75 * dist["urban"][d])
        )
        slots = self._slots(dist, blocks, min(1.0, BUILDING_CAP / max(float(expected), 1.0)))

        raw = self.segments.concat()
        raw["uid"] = np.arange(len(raw["x0"]))
        x0, y0 = self._warp(raw["x0"], raw["y0"])
        x1, y1 = self._warp(raw["x1"], raw["y1"])
        raw.update(x0=x0, y0=y0, x1=x1, y1=y1)
        roads, uid = self._road_network(self._settle_segments(raw))
        street_built = np.full(len(raw["x0"]), NEVER, dtype=np.int16)
        street_built[uid] = roads.built
        buildings = self._building_stock(slots, roads, street_built)
        return CityFabric(self.world.city, roads, buildings, self.window)


# --------------------------------------------------------------------------------------------
# Building functions, tags and heights.
# --------------------------------------------------------------------------------------------

Variant = tuple[str, dict[str, str], float]
"""(``building`` value, other tags, weight)."""

_RESIDENTIAL_DENSE: list[Variant] = [
    ("apartments", {}, 0.55),
    ("residential", {}, 0.3),
    ("terrace", {}, 0.1),
    ("house", {}, 0.05),
]
_RESIDENTIAL_SPARSE: list[Variant] = [
    ("house", {}, 0.45),
    ("detached", {}, 0.2),
    ("residential", {}, 0.15),
    ("semidetached_house", {}, 0.1),
    ("apartments", {}, 0.05),
    ("terrace", {}, 0.05),
]
_VARIANTS: dict[str, list[Variant]] = {
    "commercial": [
        ("retail", {"shop": "supermarket"}, 0.06),
        ("retail", {"shop": "convenience"}, 0.08),
        ("retail", {"shop": "clothes"}, 0.07),
        ("commercial", {"shop": "hairdresser"}, 0.04),
        ("retail", {}, 0.12),
        ("commercial", {}, 0.22),
        ("office", {}, 0.18),
        ("office", {"office": "company"}, 0.1),
        ("yes", {"office": "company"}, 0.04),
        ("yes", {"shop": "bakery"}, 0.03),
        ("commercial", {"office": "insurance"}, 0.03),
        ("retail", {"shop": "department_store"}, 0.03),
    ],
    "food": [
        ("yes", {"amenity": "restaurant"}, 0.3),
        ("commercial", {"amenity": "restaurant"}, 0.15),
        ("yes", {"amenity": "cafe"}, 0.2),
        ("retail", {"amenity": "fast_food"}, 0.15),
        ("yes", {"amenity": "pub"}, 0.1),
        ("commercial", {"amenity": "bar"}, 0.1),
    ],
    "education": [
        ("school", {"amenity": "school"}, 0.5),
        ("yes", {"amenity": "school"}, 0.12),
        ("kindergarten", {"amenity": "kindergarten"}, 0.12),
        ("university", {"amenity": "university"}, 0.14),
        ("college", {"amenity": "college"}, 0.07),
        ("yes", {"amenity": "library"}, 0.05),
    ],
    "healthcare": [
        ("hospital", {"amenity": "hospital", "healthcare": "hospital"}, 0.4),
        ("yes", {"amenity": "clinic", "healthcare": "clinic"}, 0.25),
        ("commercial", {"amenity": "doctors", "healthcare": "doctor"}, 0.2),
        ("retail", {"amenity": "pharmacy", "healthcare": "pharmacy"}, 0.15),
    ],
    "civic": [
        ("public", {}, 0.25),
        ("civic", {"amenity": "townhall"}, 0.1),
        ("government", {"office": "government"}, 0.15),
        ("public", {"amenity": "library"}, 0.1),
        ("yes", {"amenity": "police"}, 0.1),
        ("fire_station", {"amenity": "fire_station"}, 0.1),
        ("civic", {"amenity": "community_centre"}, 0.12),
        ("public", {"amenity": "courthouse"}, 0.04),
        ("yes", {"amenity": "post_office"}, 0.04),
    ],
    "transport": [
        ("train_station", {"public_transport": "station", "railway": "station"}, 0.15),
        ("transportation", {"public_transport": "station"}, 0.1),
        ("parking", {"amenity": "parking"}, 0.25),
        ("garage", {}, 0.15),
        ("garages", {}, 0.15),
        ("yes", {"amenity": "bus_station", "public_transport": "station"}, 0.08),
        ("yes", {"amenity": "parking"}, 0.12),
    ],
    "leisure": [
        ("hotel", {"tourism": "hotel"}, 0.45),
        ("yes", {"tourism": "museum"}, 0.12),
        ("sports_hall", {"leisure": "sports_centre"}, 0.15),
        ("yes", {"leisure": "fitness_centre"}, 0.1),
        ("stadium", {"leisure": "stadium"}, 0.03),
        ("yes", {"tourism": "attraction"}, 0.07),
        ("commercial", {"tourism": "gallery"}, 0.08),
    ],
    "industrial": [
        ("industrial", {}, 0.45),
        ("warehouse", {}, 0.3),
        ("manufacture", {}, 0.08),
        ("industrial", {"landuse": "industrial"}, 0.12),
        ("yes", {"landuse": "industrial"}, 0.05),
    ],
    "other": [
        ("shed", {}, 0.3),
        ("farm", {}, 0.15),
        ("barn", {}, 0.15),
        ("greenhouse", {}, 0.1),
        ("roof", {}, 0.1),
        ("construction", {}, 0.1),
        ("service", {}, 0.1),
    ],
}
_WORSHIP: dict[str, tuple[str, str]] = {
    "christian": ("church", "christian"),
    "chapel": ("chapel", "christian"),
    "muslim": ("mosque", "muslim"),
    "buddhist": ("temple", "buddhist"),
    "jewish": ("synagogue", "jewish"),
    "hindu": ("temple", "hindu"),
    "shinto": ("shrine", "shinto"),
}
_RELIGION_MIX: dict[str, dict[str, float]] = {
    "Tokyo": {"buddhist": 0.5, "shinto": 0.4, "christian": 0.1},
    "Busan": {"christian": 0.55, "buddhist": 0.45},
    "Shanghai": {"buddhist": 0.5, "christian": 0.3, "muslim": 0.2},
    "XiongAn": {"buddhist": 0.6, "muslim": 0.25, "christian": 0.15},
    "Singapore": {"buddhist": 0.35, "christian": 0.3, "muslim": 0.2, "hindu": 0.15},
    "London": {"christian": 0.65, "chapel": 0.1, "muslim": 0.15, "jewish": 0.05, "hindu": 0.05},
    "NYC": {"christian": 0.7, "jewish": 0.18, "muslim": 0.12},
}
_DEFAULT_RELIGION = {"christian": 0.8, "chapel": 0.1, "muslim": 0.05, "jewish": 0.05}


def _religious_variants(city: str) -> list[Variant]:
    mix = _RELIGION_MIX.get(city, _DEFAULT_RELIGION)
    return [
        (_WORSHIP[k][0], {"amenity": "place_of_worship", "religion": _WORSHIP[k][1]}, w)
        for k, w in mix.items()
    ]


def _draw_functions(
    rng: np.random.Generator, urban: np.ndarray, nonres: np.ndarray, core: np.ndarray
) -> np.ndarray:
    """Latent function per building from the world's non-residential share and centrality."""
    weights = np.stack(
        [
            1.0 - nonres,  # residential
            0.62 * nonres,  # commercial
            np.full_like(urban, 0.022),  # education
            0.006 + 0.004 * core,  # healthcare
            0.12 * nonres + 0.005,  # food
            0.012 + 0.02 * core,  # civic
            0.008 + 0.03 * nonres,  # transport
            0.05 * nonres * (0.5 + core) + 0.004,  # leisure
            0.3 * nonres * (1 - core),  # industrial
            np.full_like(urban, 0.01),  # religious
            0.03 * (1 - urban),  # other
        ],
        axis=1,
    ).astype(np.float64)
    cumulative = np.cumsum(weights, axis=1)
    draw = rng.random(len(urban)) * cumulative[:, -1]
    return (cumulative < draw[:, None]).sum(axis=1).astype(np.int8)


def _draw_tags(
    rng: np.random.Generator, city: str, function: np.ndarray, urban: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The ``building`` value and function tags each building gets once it is labelled."""
    n = len(function)
    building = np.full(n, "yes", dtype=object)
    tags = {key: np.full(n, None, dtype=object) for key in TAG_COLUMNS}
    groups: list[tuple[np.ndarray, list[Variant]]] = []
    residential = function == FUNCTIONS.index("residential")
    groups.append((residential & (urban > 0.55), _RESIDENTIAL_DENSE))
    groups.append((residential & (urban <= 0.55), _RESIDENTIAL_SPARSE))
    for name, variants in _VARIANTS.items():
        groups.append((function == FUNCTIONS.index(name), variants))
    groups.append((function == FUNCTIONS.index("religious"), _religious_variants(city)))
    for mask, variants in groups:
        index = np.flatnonzero(mask)
        if not len(index):
            continue
        p = np.array([v[2] for v in variants])
        choice = rng.choice(len(variants), size=len(index), p=p / p.sum())
        building[index] = np.array([v[0] for v in variants], dtype=object)[choice]
        for key in TAG_COLUMNS:
            values = np.array([v[1].get(key) for v in variants], dtype=object)
            if any(v is not None for v in values):
                tags[key][index] = values[choice]
    return building, tags


def _draw_heights(
    rng: np.random.Generator, function: np.ndarray, urban: np.ndarray, tower: np.ndarray
) -> np.ndarray:
    """Heights from the world's built-volume field: towers downtown, low-rise suburbs."""
    typical = 3.5 + 2.0 * tower * np.clip(urban, 0, 1) ** 1.3
    factor = np.ones(len(function))
    factor[function == FUNCTIONS.index("industrial")] = 0.8
    factor[function == FUNCTIONS.index("religious")] = 1.3
    factor[function == FUNCTIONS.index("education")] = 0.9
    height = typical * factor * rng.lognormal(0.0, 0.35, len(function))
    other = function == FUNCTIONS.index("other")
    height[other] = rng.uniform(2.5, 6.0, int(other.sum()))
    height[function == FUNCTIONS.index("industrial")] = np.maximum(
        height[function == FUNCTIONS.index("industrial")], 6.0
    )
    return np.round(np.clip(height, 2.5, 400.0), 1).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Snapshots as GeoDataFrames.
# --------------------------------------------------------------------------------------------


def _to_wgs84(epsg: int) -> Transformer:
    return transformer(f"EPSG:{epsg}", "EPSG:4326")


def window_bounds_wgs84(world: SyntheticCity) -> Bounds:
    """WGS84 bounds of the city extent plus the product margin (footprint of empty files)."""
    return product_window(world, WGS84)


def road_frame(world: SyntheticCity, year: int) -> gpd.GeoDataFrame:
    """OSM roads as of 1 January of ``year``: runs of present segments become ways."""
    roads = city_fabric(world).roads
    present = np.flatnonzero(roads.present_from <= year)
    line, order, code = roads.line[present], roads.order[present], roads.highway[present]
    starts = np.ones(len(present), dtype=bool)
    starts[1:] = (line[1:] != line[:-1]) | (order[1:] != order[:-1] + 1) | (code[1:] != code[:-1])
    run = np.cumsum(starts) - 1
    # Vertices: the start of each run's first segment, then every segment's end.
    first = present[starts]
    xs = np.concatenate([roads.x0[first], roads.x1[present]])
    ys = np.concatenate([roads.y0[first], roads.y1[present]])
    owner = np.concatenate([np.flatnonzero(starts), np.arange(len(present))])
    key = np.concatenate([2 * np.flatnonzero(starts), 2 * np.arange(len(present)) + 1])
    sort = np.argsort(key, kind="stable")
    lon, lat = _to_wgs84(world.epsg).transform(xs[sort], ys[sort])
    lines = shapely.linestrings(np.stack([lon, lat], axis=1), indices=run[owner[sort]])
    return gpd.GeoDataFrame(
        {
            "osm_id": roads.osm_id[first].astype(np.int64),
            "highway": pd.Series(np.array(HIGHWAYS, dtype=object)[roads.highway[first]]),
            "name": pd.Series(roads.name[first], dtype="str"),
            "snapshot_date": f"{year}-{SNAPSHOT_DAY}",
        },
        geometry=lines,
        crs=WGS84,
    )


def footprints_wgs84(world: SyntheticCity, corners: np.ndarray) -> np.ndarray:
    """Closed WGS84 polygons from UTM corner arrays (n, 4, 2)."""
    lon, lat = _to_wgs84(world.epsg).transform(corners[:, :, 0].ravel(), corners[:, :, 1].ravel())
    ring = np.stack([lon, lat], axis=1).reshape(-1, 4, 2)
    return shapely.polygons(np.concatenate([ring, ring[:, :1]], axis=1))


def stock_footprints_wgs84(world: SyntheticCity) -> np.ndarray:
    """WGS84 footprint polygons of the city's whole building stock, in stock order.

    Every OSM building snapshot and the GloBFP release select from the same stock, so its
    polygons are projected and built once (~0.15 s for 60 000 buildings) instead of per item;
    shapely geometries are immutable, so items can share them.
    """
    return _stock_footprints(city_fabric(world), world)


@lru_cache(maxsize=2)
def _stock_footprints(fabric: CityFabric, world: SyntheticCity) -> np.ndarray:
    """Keyed by the fabric too, so a rebuilt fabric never meets polygons of an older one."""
    footprints = footprints_wgs84(world, fabric.buildings.corners)
    footprints.setflags(write=False)
    return footprints


def building_frame(world: SyntheticCity, year: int) -> gpd.GeoDataFrame:
    """OSM buildings as of 1 January of ``year``; unlabelled ones are just ``building=yes``."""
    stock = city_fabric(world).buildings
    present = np.flatnonzero(stock.present_from <= year)
    labelled = stock.labelled_from[present] <= year
    building = np.where(labelled, stock.building[present], "yes")
    columns: dict[str, object] = {
        "osm_id": stock.osm_id[present],
        "building": pd.Series(building, dtype="str"),
    }
    for key in TAG_COLUMNS:
        columns[key] = pd.Series(np.where(labelled, stock.tags[key][present], None), dtype="str")
    columns["snapshot_date"] = f"{year}-{SNAPSHOT_DAY}"
    return gpd.GeoDataFrame(columns, geometry=stock_footprints_wgs84(world)[present], crs=WGS84)


# --------------------------------------------------------------------------------------------
# GPS traces.
# --------------------------------------------------------------------------------------------

GPS_TRACKS = 1500
"""Tracks a mid-size city collects in a year of peak activity."""
_TRACK_SPEED_M_S = {
    "motorway": 26.0,
    "motorway_link": 15.0,
    "trunk": 20.0,
    "trunk_link": 12.0,
    "primary": 12.0,
    "primary_link": 8.0,
    "secondary": 10.0,
    "tertiary": 8.0,
    "unclassified": 9.0,
    "residential": 5.0,
    "living_street": 2.0,
    "service": 3.0,
    "pedestrian": 1.4,
    "footway": 1.4,
}
"""Typical speed of a trace on each road class, m/s."""
_TRACK_WEIGHT = {"motorway": 2.0, "trunk": 2.0, "primary": 2.5, "secondary": 2.0, "tertiary": 1.5}
"""How much more often traces start on busy roads than on others (per metre)."""


def _per_code(values: dict[str, float], default: float) -> np.ndarray:
    """A lookup array indexed by highway code."""
    return np.array([values.get(h, default) for h in HIGHWAYS])


def gps_activity(year: int) -> float:
    """Relative number of public traces uploaded: rising to ~2014, easing off after 2019."""
    rise = float(_logistic((year - 2010.5) / 1.5))
    return rise * (0.97 ** max(0, year - 2019))


def gps_frame(world: SyntheticCity, year: int) -> gpd.GeoDataFrame:
    """Public GPS trace points of one year: tracks along built roads, busiest downtown."""
    roads = city_fabric(world).roads
    rng = world.rng("osm-gps", year)
    built = np.flatnonzero(roads.built <= year)
    length = roads.length[built]
    mx = (roads.x0[built] + roads.x1[built]) / 2
    my = (roads.y0[built] + roads.y1[built]) / 2
    pts = world.points(mx, my)
    urban = world.urban_intensity(pts, year)
    r = np.hypot(mx - world.centre_xy[0], my - world.centre_xy[1])
    code = roads.highway[built]
    weight = length * _per_code(_TRACK_WEIGHT, 1.0)[code] * (urban + 0.02) ** 1.2
    weight *= np.exp(-r / (9000.0 * world.spatial_scale))
    busy = float(np.clip(world.peak_density / 6000.0, 0.6, 1.6))
    n_tracks = max(5, round(GPS_TRACKS * gps_activity(year) * busy * world.spatial_scale))
    start = rng.choice(len(built), size=n_tracks, p=weight / weight.sum())

    # Each track follows its line from the start segment for a few kilometres at most.
    line, order = roads.line[built], roads.order[built]
    breaks = np.ones(len(built), dtype=bool)
    breaks[1:] = (line[1:] != line[:-1]) | (order[1:] != order[:-1] + 1)
    run_id = np.cumsum(breaks) - 1
    run_end = np.flatnonzero(np.append(breaks[1:], True))  # last segment index of each run
    cum = np.concatenate([[0.0], np.cumsum(length)])
    wanted = rng.lognormal(math.log(2000.0), 0.8, n_tracks)
    last = np.minimum(
        np.searchsorted(cum, cum[start] + wanted, side="left") - 1, run_end[run_id[start]]
    )
    track_length = cum[last + 1] - cum[start]
    speed = _per_code(_TRACK_SPEED_M_S, 5.0)[code[start]]
    interval = rng.choice(np.array([2.0, 5.0, 10.0]), size=n_tracks, p=[0.3, 0.4, 0.3])
    spacing = speed * interval * rng.uniform(0.7, 1.3, n_tracks)
    count = np.clip(np.floor(track_length / spacing).astype(np.int64) + 1, 1, 4000)
    track, step = _expand(count)
    distance = cum[start[track]] + step * spacing[track]
    seg = np.clip(np.searchsorted(cum, distance, side="right") - 1, 0, len(built) - 1)
    frac = np.clip((distance - cum[seg]) / np.maximum(length[seg], 1e-6), 0, 1)
    index = built[seg]
    x = roads.x0[index] + frac * (roads.x1[index] - roads.x0[index])
    y = roads.y0[index] + frac * (roads.y1[index] - roads.y0[index])
    x += rng.normal(0, 4.0, len(x))
    y += rng.normal(0, 4.0, len(y))

    xmin, ymin, xmax, ymax = city_fabric(world).window
    inside = (x >= xmin) & (x <= xmax) & (y >= ymin) & (y <= ymax)
    year_start = datetime(year, 1, 1, tzinfo=UTC).timestamp()
    year_seconds = datetime(year + 1, 1, 1, tzinfo=UTC).timestamp() - year_start
    begin = year_start + rng.uniform(0, year_seconds - 4 * 3600, n_tracks)
    seconds = begin[track] + step * interval[track]
    lon, lat = _to_wgs84(world.epsg).transform(x[inside], y[inside])
    return gpd.GeoDataFrame(
        {
            "track_id": (year * 1_000_000 + track[inside]).astype(np.int64),
            "time": pd.to_datetime(
                np.round(seconds[inside] * 1000).astype(np.int64), unit="ms", utc=True
            ),
        },
        geometry=shapely.points(lon, lat),
        crs=WGS84,
    )


# --------------------------------------------------------------------------------------------
# Products.
# --------------------------------------------------------------------------------------------


class _CityYears:
    """A product whose years differ per city, as the city's sample calendar plans them."""

    product_id: str
    earliest: ClassVar[int]
    """First year any city's record may hold."""

    def years(self) -> list[int] | None:
        """The span any city's years lie in; ``city_years`` gives one city's."""
        return list(range(self.earliest, LAST_YEAR + 1))

    def city_years(self, city: str, seed: int = 0) -> list[int]:
        """Years of one city."""
        raise NotImplementedError

    def _require_year(self, world: SyntheticCity, year: int | None) -> int:
        """The year, or ``SourceUnavailableError`` when the city has no snapshot then."""
        if year is None:
            raise ValueError(f"{self.product_id} is not static; pass one of its source years")
        years = self.city_years(world.city, world.seed)
        if year not in years:
            listed = ", ".join(str(y) for y in years) or "none"
            raise SourceUnavailableError(
                f"{self.product_id} has no {year} snapshot for {world.city}; it has {listed}",
                reason="source_year_missing",
            )
        return year


def _snapshot_item(
    world: SyntheticCity, year: int, kind: str, frame: gpd.GeoDataFrame, extra: dict[str, str]
) -> GeneratedItem:
    """The 1 January snapshot of one OSM feature kind: a GeoPackage with a layer ``kind``."""
    name = f"{world.city.lower()}-{year}0101-osm-{kind}"
    layer = GeoPackageLayer(
        role="data",
        filename=f"{name}.gpkg",
        title=f"OpenStreetMap {kind}, snapshot {year}-{SNAPSHOT_DAY}",
        frame=frame,
        layer=kind,
        fallback_bounds=window_bounds_wgs84(world),
    )
    snapshot_date = datetime(year, 1, 1, tzinfo=UTC)
    return GeneratedItem(
        item_id=f"osm_{kind}_{world.city}_{year}0101",
        layers=(layer,),
        timestamp=snapshot_date,
        start_datetime=None,
        end_datetime=None,
        properties={"osm:snapshot_date": snapshot_date.date().isoformat()},
        extra={
            "snapshot_date": snapshot_date.date().isoformat(),
            "features": str(len(frame)),
            **extra,
        },
    )


class OsmRoads(_CityYears):
    """OSM road snapshots (GeoPackage layer ``roads``), city-specific snapshot years."""

    product_id = "osm_roads"
    earliest = FIRST_OSM_EXTRACT

    def city_years(self, city: str, seed: int = 0) -> list[int]:
        """The city's road snapshots."""
        return road_snapshot_years(city, seed)

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """The roads mapped by 1 January of the snapshot year."""
        year = self._require_year(world, year)
        return _snapshot_item(world, year, "roads", road_frame(world, year), {})


class OsmBuildings(_CityYears):
    """OSM building snapshots with function tags (GeoPackage layer ``buildings``)."""

    product_id = "osm_buildings"
    earliest = FIRST_OSM_EXTRACT

    def city_years(self, city: str, seed: int = 0) -> list[int]:
        """The city's building snapshots."""
        return building_snapshot_years(city, seed)

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """The buildings mapped by 1 January of the snapshot year, with their tags then."""
        year = self._require_year(world, year)
        frame = building_frame(world, year)
        labelled = int((frame["building"] != "yes").sum())
        return _snapshot_item(
            world, year, "buildings", frame, {"labelled_building_values": str(labelled)}
        )


class OsmGpsTraces(_CityYears):
    """Public OSM GPS trace points of one year (GeoParquet), city-specific years."""

    product_id = "osm_gps_traces"
    earliest = FIRST_GPS_YEAR

    def city_years(self, city: str, seed: int = 0) -> list[int]:
        """The city's years with trace points."""
        return gps_trace_years(city, seed)

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Track points recorded during the year inside the city window."""
        year = self._require_year(world, year)
        frame = gps_frame(world, year)
        layer = GeoParquetLayer(
            role="data",
            filename=f"{world.city.lower()}-{year}-gps-trackpoints.parquet",
            title=f"OpenStreetMap public GPS trace points, {year}",
            frame=frame,
            fallback_bounds=window_bounds_wgs84(world),
        )
        start, end = year_span(year)
        return GeneratedItem(
            item_id=f"osm_gps_traces_{world.city}_{year}",
            layers=(layer,),
            timestamp=None,
            start_datetime=start,
            end_datetime=end,
            properties={},
            extra={
                "points": str(len(frame)),
                "tracks": str(frame["track_id"].nunique()),
            },
        )
