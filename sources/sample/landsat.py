"""Sample Landsat Collection 2 Level-2 scenes: a 30 m RGB file plus a QA_PIXEL bit field.

One scene per city and year, in the city's UTM zone on the Landsat pixel lattice (corners on
odd multiples of 15 m, so pixels do not line up with the 2 km tile edges). The colours follow
the city's synthetic world; clouds, their shadows, swath edges and Landsat 7 SLC-off gaps
make the optical modality miss tiles the way real scenes do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import numpy as np
from odc.geo.geobox import GeoBox

from citycube.grid.tiles import snapped_grid
from sources.sample.world import (
    FIRST_YEAR,
    LAST_YEAR,
    GeneratedItem,
    LinearZoom,
    RasterLayer,
    SyntheticCity,
    WorldPoints,
    pixel_grain,
    row_blocks,
    row_window,
    smooth_noise,
    smoothstep,
    utm_window,
)

PIXEL_SIZE_M = 30.0
"""Landsat reflective-band pixel size."""
PIXEL_CORNER_OFFSET_M = 15.0
"""Landsat pixel corners lie on odd multiples of 15 m (pixel centres on multiples of 30 m)."""

# QA_PIXEL bits (Landsat Collection 2).
QA_FILL = 1 << 0
QA_DILATED_CLOUD = 1 << 1
QA_CIRRUS = 1 << 2
QA_CLOUD = 1 << 3
QA_CLOUD_SHADOW = 1 << 4
QA_SNOW = 1 << 5
QA_CLEAR = 1 << 6
QA_WATER = 1 << 7
QA_CLOUD_CONFIDENCE_SHIFT = 8
QA_SHADOW_CONFIDENCE_SHIFT = 10
QA_SNOW_CONFIDENCE_SHIFT = 12
QA_CIRRUS_CONFIDENCE_SHIFT = 14
CONFIDENCE_LOW, CONFIDENCE_MEDIUM, CONFIDENCE_HIGH = 1, 2, 3


@dataclass(frozen=True)
class Sensor:
    """The Landsat mission that supplies a year's scene."""

    code: str
    """Scene-id prefix, e.g. 'LC08'."""
    platform: str
    """STAC platform name."""
    instruments: tuple[str, ...]
    """STAC instrument names."""
    has_cirrus_band: bool
    """OLI has a cirrus band; TM and ETM+ do not, so their cirrus bits stay 0."""
    slc_off: bool
    """Landsat 7 after May 2003: scan-line-corrector gaps."""


def sensor_for(year: int) -> Sensor:
    """The mission used for a year (one sensor per year keeps the series simple)."""
    if year <= 2011:
        return Sensor("LT05", "landsat-5", ("tm",), False, False)
    if year == 2012:
        return Sensor("LE07", "landsat-7", ("etm+",), False, True)
    if year <= 2020:
        return Sensor("LC08", "landsat-8", ("oli", "tirs"), True, False)
    return Sensor("LC09", "landsat-9", ("oli", "tirs"), True, False)


def wrs2_path_row(lat: float, lon: float) -> tuple[int, int]:
    """Approximate WRS-2 path and row of a point (descending daytime pass)."""
    path = round((-66.6 - lon + 0.333 * lat) / (360 / 233)) % 233 + 1
    row = round(60 - lat / 1.45)
    return int(path), int(row)


def scene_grid(world: SyntheticCity) -> GeoBox:
    """The scene's window: city extent plus margin, on the Landsat 30 m UTM lattice."""
    return snapped_grid(
        world.crs,
        utm_window(world),
        (PIXEL_SIZE_M, PIXEL_SIZE_M),
        (PIXEL_CORNER_OFFSET_M, PIXEL_CORNER_OFFSET_M),
    )


def acquisition_time(world: SyntheticCity, year: int, sensor: Sensor) -> datetime:
    """A summer overpass at about 10:30 local solar time, in UTC."""
    rng = world.rng("landsat-date", year)
    north = world.latitude >= 0
    if sensor.code == "LC09":  # operational from late 2021
        doy = int(rng.integers(305, 364))
    elif sensor.code == "LC08" and year == 2013:  # operational from April 2013
        doy = int(rng.integers(152, 259)) if north else int(rng.integers(335, 364))
    else:
        doy = int(rng.integers(152, 259)) if north else int(rng.integers(1, 75))
    local = datetime.combine(date(year, 1, 1) + timedelta(days=doy - 1), time(10, 30))
    local += timedelta(minutes=float(rng.normal(0, 8)))
    return (local - timedelta(hours=world.longitude / 15)).replace(tzinfo=UTC, microsecond=0)


def scene_id(world: SyntheticCity, year: int, sensor: Sensor, acquired: datetime) -> str:
    """A Collection 2 Level-2 product id: sensor, path/row, acquisition and processing date."""
    path, row = wrs2_path_row(world.latitude, world.longitude)
    rng = world.rng("landsat-processing", year)
    reprocessing = datetime(2020, 8, 1, tzinfo=UTC)
    if acquired < reprocessing:
        processed = reprocessing + timedelta(days=int(rng.integers(0, 150)))
    else:
        processed = acquired + timedelta(days=int(rng.integers(8, 20)))
    return f"{sensor.code}_L2SP_{path:03d}{row:03d}_{acquired:%Y%m%d}_{processed:%Y%m%d}_02_T1"


# Surface colours (uint8 RGB as supplied), per climate where vegetation differs.
_WATER_SEA = np.array([18, 40, 66], dtype=np.float32)
_WATER_RIVER = np.array([32, 56, 66], dtype=np.float32)
_URBAN_2000 = np.array([116, 114, 117], dtype=np.float32)
_URBAN_2025 = np.array([136, 133, 131], dtype=np.float32)
_BARE = {
    "default": np.array([152, 128, 98], dtype=np.float32),
    "semiarid": np.array([176, 156, 124], dtype=np.float32),
}
_VEG_DENSE = {
    "temperate": (34, 70, 38),
    "subtropical": (30, 74, 40),
    "tropical": (24, 80, 34),
    "mediterranean": (52, 74, 44),
    "semiarid": (70, 80, 52),
}
_VEG_OPEN = {
    "temperate": (96, 130, 64),
    "subtropical": (90, 128, 60),
    "tropical": (80, 130, 56),
    "mediterranean": (146, 142, 94),
    "semiarid": (160, 148, 108),
}
_CLOUD = np.array([232, 232, 236], dtype=np.float32)


def ground_cover(
    world: SyntheticCity, pts: WorldPoints, year: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Urban, green and bare shares of the ground (bare is what the other two leave)."""
    urban = world.urban_intensity(pts, year)
    green = world.green_fraction(pts, year, urban)
    return urban, green, np.clip(1 - urban - green, 0, 1)


def woodedness(pts: WorldPoints) -> np.ndarray:
    """How closed the vegetation's canopy is: 0 open land, 1 woodland."""
    return smoothstep((pts.field("forest") - 0.45) / 0.3)


def surface_colour(
    world: SyntheticCity, pts: WorldPoints, year: int, grain: np.ndarray
) -> np.ndarray:
    """Cloud-free RGB (3, rows, cols) float32 from land cover, relief shading and texture."""
    urban, green, bare = ground_cover(world, pts, year)
    total = np.maximum(urban + green + bare, 1e-6)
    urban, green, bare = urban / total, green / total, bare / total
    climate = world.traits.climate
    dense = np.array(_VEG_DENSE[climate], dtype=np.float32)
    open_ = np.array(_VEG_OPEN[climate], dtype=np.float32)
    bare_rgb = _BARE.get(climate, _BARE["default"])
    g = world.growth_progress(year)
    urban_rgb = _URBAN_2000 + g * (_URBAN_2025 - _URBAN_2000)
    wooded = woodedness(pts)
    fields = 1 + 0.1 * np.tanh(3 * pts.field("crop"))
    texture = 1 + 0.05 * pts.field("texture") + 0.035 * grain
    shade = _hillshade(pts.elevation, world.latitude >= 0)
    sea = pts.sea
    river = pts.water & ~sea
    gain = float(world.rng("landsat-gain", year).uniform(0.97, 1.03))
    rgb = np.empty((3, *pts.shape), dtype=np.float32)
    for band in range(3):
        veg = open_[band] * fields + wooded * (dense[band] - open_[band] * fields)
        land = urban * urban_rgb[band] + green * veg + bare * bare_rgb[band]
        land *= shade * texture * gain
        water = np.where(sea, _WATER_SEA[band], _WATER_RIVER[band]) * (1 + 0.02 * texture)
        rgb[band] = np.where(sea | river, water, land)
    return rgb


def grain_field(world: SyntheticCity, shape: tuple[int, int]) -> np.ndarray:
    """Pixel-scale texture, the same every year (roofs and fields do not flicker)."""
    return pixel_grain(world, "landsat-grain", shape, reuse=True)


def _hillshade(elevation: np.ndarray, north: bool) -> np.ndarray:
    """Lambertian shading for a morning sun (south-east in the north, north-east in the south)."""
    d_row, d_col = np.gradient(elevation, PIXEL_SIZE_M)
    dz_dx, dz_dy = d_col, -d_row
    azimuth = math.radians(135 if north else 45)
    altitude = math.radians(50)
    sx, sy = math.sin(azimuth) * math.cos(altitude), math.cos(azimuth) * math.cos(altitude)
    sz = math.sin(altitude)
    shade = (-dz_dx * sx - dz_dy * sy + sz) / np.sqrt(1 + dz_dx**2 + dz_dy**2) / sz
    return np.clip(0.55 + 0.45 * shade, 0.35, 1.3).astype(np.float32)


@dataclass(frozen=True)
class SkyRows:
    """Atmospheric effects of one scene on a block of its rows."""

    cloud_alpha: np.ndarray
    """Cloud opacity in [0, 1]."""
    cloud: np.ndarray
    """Opaque cloud (QA bit 3)."""
    dilated: np.ndarray
    """Thin cloud edge around opaque cloud (QA bit 1)."""
    shadow_alpha: np.ndarray
    """Shadow strength in [0, 1]."""
    shadow: np.ndarray
    """Cloud shadow (QA bit 4)."""
    cirrus: np.ndarray
    """Thin high cloud (QA bit 2; OLI only)."""


HAZE = 0.06
"""Cloud-density band below the opaque threshold that is thin (dilated) cloud."""
_SKIP_MARGIN = 1e-3
"""How far below a threshold a whole 90 m cell must stay to be skipped (float32 rounding)."""


class Sky:
    """Clouds, their shadows and cirrus of one scene, brought to the 30 m grid block by block.

    The cloud density and cirrus fields live on a 90 m grid (a few MB for any city) and are
    zoomed only where a block needs them: a pixel whose surrounding 90 m samples all lie below
    the thin-cloud threshold is clear without being evaluated, so a mostly clear scene costs
    little more than its 90 m fields. Every value is the one zooming the whole scene gives.
    """

    def __init__(
        self,
        density: LinearZoom,
        threshold: float,
        shadow_shift: tuple[int, int],
        cirrus: LinearZoom | None,
        cirrus_threshold: np.float64 | float,
    ) -> None:
        self.shape = density.shape
        self._density = density
        self._threshold = threshold
        self._shadow_shift = shadow_shift
        self._cloudy_cells = density.cell_max() > threshold - HAZE - _SKIP_MARGIN
        self._cirrus = cirrus
        self._cirrus_threshold = cirrus_threshold
        if cirrus is not None:
            self._cirrus_cells = cirrus.cell_max() > cirrus_threshold - _SKIP_MARGIN

    def _candidates(
        self, zoom: LinearZoom, cells: np.ndarray, start: int, stop: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(rows, cols) of the pixels in rows [start, stop) whose 90 m cell may pass a threshold."""
        near = cells[zoom.row_starts[start:stop]][:, zoom.col_starts]
        rows, cols = np.nonzero(near)
        return rows, cols

    def _cloud(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(alpha, opaque, dilated) on rows [start, stop)."""
        shape = (stop - start, self.shape[1])
        alpha = np.zeros(shape, dtype=np.float32)
        cloud = np.zeros(shape, dtype=bool)
        dilated = np.zeros(shape, dtype=bool)
        rows, cols = self._candidates(self._density, self._cloudy_cells, start, stop)
        if rows.size:
            threshold = self._threshold
            density = self._density.at(rows + start, cols)
            opaque = density > threshold
            cloud[rows, cols] = opaque
            dilated[rows, cols] = (density > threshold - HAZE) & ~opaque
            alpha[rows, cols] = smoothstep((density - threshold + HAZE) / (2.5 * HAZE))
        return alpha, cloud, dilated

    def _shadow_alpha(self, start: int, stop: int) -> np.ndarray:
        """Cloud opacity moved by the shadow offset (0 where none moves in), rows [start, stop)."""
        h, w = self.shape
        shift_rows, shift_cols = self._shadow_shift
        out = np.zeros((stop - start, w), dtype=np.float32)
        if abs(shift_rows) >= h or abs(shift_cols) >= w:
            return out
        src_start, src_stop = max(start - shift_rows, 0), min(stop - shift_rows, h)
        if src_start >= src_stop:
            return out
        alpha = self._cloud(src_start, src_stop)[0]
        dst_rows = slice(src_start + shift_rows - start, src_stop + shift_rows - start)
        src_cols = slice(max(-shift_cols, 0), w - max(shift_cols, 0))
        dst_cols = slice(max(shift_cols, 0), w - max(-shift_cols, 0))
        out[dst_rows, dst_cols] = alpha[:, src_cols]
        return out

    def rows(self, start: int, stop: int) -> SkyRows:
        """The effects on rows [start, stop)."""
        alpha, cloud, dilated = self._cloud(start, stop)
        shadow_alpha = self._shadow_alpha(start, stop)
        cirrus = np.zeros((stop - start, self.shape[1]), dtype=bool)
        if self._cirrus is not None:
            rows, cols = self._candidates(self._cirrus, self._cirrus_cells, start, stop)
            if rows.size:
                cirrus[rows, cols] = self._cirrus.at(rows + start, cols) > self._cirrus_threshold
        return SkyRows(alpha, cloud, dilated, shadow_alpha, (shadow_alpha > 0.35) & ~cloud, cirrus)


def sky_effects(
    world: SyntheticCity,
    year: int,
    grid: GeoBox,
    sensor: Sensor,
    extent_window: tuple[slice, slice],
) -> Sky:
    """Blobby clouds with offset shadows; the cloud share follows the world's year."""
    rng = world.rng("landsat-clouds", year)
    h, w = grid.height, grid.width
    coarse = (h // 3 + 2, w // 3 + 2)
    spacing = 3 * PIXEL_SIZE_M
    density = (
        0.75 * smooth_noise(rng, coarse, spacing, 5000)
        + 0.40 * smooth_noise(rng, coarse, spacing, 1200)
        + 0.15 * smooth_noise(rng, coarse, spacing, 300)
    )
    zoomed = LinearZoom(density, 3, (h, w))
    fraction = world.cloud_fraction(year)
    rows, cols = extent_window
    sample = zoomed.grid(np.arange(h)[rows][::4], np.arange(w)[cols][::4])
    threshold = float(np.quantile(sample, 1 - fraction)) if fraction > 0 else np.inf

    # Shadows fall away from the sun: north-west in the north, south-west in the south.
    distance_px = float(rng.uniform(30, 80))
    bearing = math.radians(-45 if world.latitude >= 0 else -135)
    east, north = distance_px * math.sin(bearing), distance_px * math.cos(bearing)

    cirrus: LinearZoom | None = None
    cirrus_threshold: np.float64 | float = np.inf
    if sensor.has_cirrus_band and rng.random() < 0.3:
        cirrus = LinearZoom(smooth_noise(rng, coarse, spacing, 8000), 3, (h, w))
        sample = cirrus.grid(slice(0, h, 8), slice(0, w, 8))
        cirrus_threshold = np.quantile(sample, 1 - rng.uniform(0.05, 0.25))
    return Sky(zoomed, threshold, (-round(north), round(east)), cirrus, cirrus_threshold)


def compose_scene(rgb: np.ndarray, sky: SkyRows, fill: np.ndarray) -> np.ndarray:
    """Shadows darken, clouds whiten (with soft edges); fill pixels become nodata 0."""
    shadow = sky.shadow_alpha * (1 - sky.cloud_alpha)
    veil = np.clip(sky.cloud_alpha + np.where(sky.cirrus, np.float32(0.15), np.float32(0)), 0, 1)
    out = np.empty(rgb.shape, dtype=np.uint8)
    for band in range(3):
        value = rgb[band] * (1 - 0.5 * shadow)
        value += veil * (_CLOUD[band] - value)
        out[band] = np.clip(np.rint(value), 1, 255).astype(np.uint8)
        out[band][fill] = 0
    return out


def fill_mask(world: SyntheticCity, year: int, sensor: Sensor, pts: WorldPoints) -> np.ndarray:
    """Pixels outside the imaged swath, plus Landsat 7 SLC-off gaps."""
    rng = world.rng("landsat-swath", year)
    lat = abs(world.latitude)
    heading = math.radians(9 + 5 * lat / 60)  # ground track tilt from north
    x, y = pts.local_x, pts.local_y
    across = x * math.cos(heading) - y * math.sin(heading)
    along = x * math.sin(heading) + y * math.cos(heading)
    fill = np.zeros(pts.shape, dtype=bool)
    if rng.random() < 0.2:  # the swath edge crosses the city this year
        xmin, _, xmax, _ = world.extent
        half_width = (xmax - xmin) / 2
        cut = rng.uniform(0.2, 0.9) * half_width
        side = rng.choice([-1.0, 1.0])
        fill |= side * across > half_width - cut
    if sensor.slc_off:
        centre_offset = rng.uniform(-70_000, 70_000)
        gap_px = 14 * np.minimum(np.abs(across - centre_offset) / 92_500, 1)
        phase = np.mod(along / PIXEL_SIZE_M + rng.uniform(0, 32), 32)
        fill |= phase < gap_px
    return fill


def qa_pixel(
    sensor: Sensor,
    sky: SkyRows,
    fill: np.ndarray,
    water: np.ndarray,
    snow: np.ndarray,
) -> np.ndarray:
    """QA_PIXEL values with Collection 2 bit semantics (flags plus 2-bit confidences)."""
    cloud_conf = np.where(
        sky.cloud, CONFIDENCE_HIGH, np.where(sky.dilated, CONFIDENCE_MEDIUM, CONFIDENCE_LOW)
    )
    qa = cloud_conf.astype(np.uint16) << QA_CLOUD_CONFIDENCE_SHIFT
    qa |= (
        np.where(sky.shadow, CONFIDENCE_HIGH, CONFIDENCE_LOW).astype(np.uint16)
        << QA_SHADOW_CONFIDENCE_SHIFT
    )
    qa |= (
        np.where(snow, CONFIDENCE_HIGH, CONFIDENCE_LOW).astype(np.uint16)
        << QA_SNOW_CONFIDENCE_SHIFT
    )
    if sensor.has_cirrus_band:
        cirrus_conf = np.where(sky.cirrus, CONFIDENCE_HIGH, CONFIDENCE_LOW).astype(np.uint16)
        qa |= cirrus_conf << QA_CIRRUS_CONFIDENCE_SHIFT
        qa |= np.where(sky.cirrus, QA_CIRRUS, 0).astype(np.uint16)
    qa |= np.where(sky.dilated, QA_DILATED_CLOUD, 0).astype(np.uint16)
    qa |= np.where(sky.cloud, QA_CLOUD, 0).astype(np.uint16)
    qa |= np.where(sky.shadow, QA_CLOUD_SHADOW, 0).astype(np.uint16)
    qa |= np.where(snow & ~sky.cloud, QA_SNOW, 0).astype(np.uint16)
    qa |= np.where(~(sky.cloud | sky.dilated), QA_CLEAR, 0).astype(np.uint16)
    qa |= np.where(water & ~sky.cloud, QA_WATER, 0).astype(np.uint16)
    return np.where(fill, np.uint16(QA_FILL), qa).astype(np.uint16)


@dataclass(frozen=True)
class Scene:
    """A year's scene: its grid, mission, sky and id, shared by the scene and derived layers."""

    grid: GeoBox
    """The scene's 30 m grid in the city's UTM zone."""
    sensor: Sensor
    """Mission of the year."""
    sky: Sky
    """Clouds and shadows on the grid."""
    acquired: datetime
    """Acquisition time."""
    scene_id: str
    """Collection 2 product id."""


def landsat_scene(world: SyntheticCity, year: int) -> Scene:
    """The year's scene; the cloud share is set over the city extent, not the margin."""
    grid = scene_grid(world)
    sensor = sensor_for(year)
    acquired = acquisition_time(world, year, sensor)
    t = grid.transform
    xmin, ymin, xmax, ymax = world.extent
    extent_window = (
        slice(round((t.f - ymax) / PIXEL_SIZE_M), round((t.f - ymin) / PIXEL_SIZE_M)),
        slice(round((xmin - t.c) / PIXEL_SIZE_M), round((xmax - t.c) / PIXEL_SIZE_M)),
    )
    sky = sky_effects(world, year, grid, sensor, extent_window)
    return Scene(grid, sensor, sky, acquired, scene_id(world, year, sensor, acquired))


class LandsatC2L2:
    """Annual Landsat Collection 2 Level-2 scenes (RGB as supplied plus QA_PIXEL)."""

    product_id = "landsat_c2l2"

    def years(self) -> list[int] | None:
        """Every calendar year has a scene (cloud and gaps decide what is usable)."""
        return list(range(FIRST_YEAR, LAST_YEAR + 1))

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """One scene: RGB file (role 'data') and QA_PIXEL file (role 'qa')."""
        assert year is not None
        scene = landsat_scene(world, year)
        grid, sensor, sky, acquired = scene.grid, scene.sensor, scene.sky, scene.acquired
        product_id = scene.scene_id
        grain = grain_field(world, (grid.height, grid.width))
        pixels = np.empty((3, grid.height, grid.width), dtype=np.uint8)
        qa = np.empty((grid.height, grid.width), dtype=np.uint16)
        observed = cloudy = 0
        for start, stop in row_blocks(grid.height):
            # One halo row each side so relief shading has no seams between blocks.
            lo, hi = max(start - 1, 0), min(stop + 1, grid.height)
            core = slice(start - lo, stop - lo)
            pts = world.grid_points(row_window(grid, lo, hi))
            rgb = surface_colour(world, pts, year, grain[lo:hi])[:, core]
            block_sky = sky.rows(start, stop)
            block_fill = (fill_mask(world, year, sensor, pts) | ~pts.inside)[core]
            pixels[:, start:stop] = compose_scene(rgb, block_sky, block_fill)
            snow = (pts.elevation > world.snowline_m)[core]
            qa[start:stop] = qa_pixel(sensor, block_sky, block_fill, pts.water[core], snow)
            observed += int((~block_fill).sum())
            cloudy += int((block_sky.cloud & ~block_fill).sum())
        del grain
        cloud_cover = 100.0 * float(cloudy) / max(observed, 1)
        path, row = wrs2_path_row(world.latitude, world.longitude)
        layers = (
            RasterLayer(
                role="data",
                filename=f"{product_id}_SR_RGB.TIF",
                data=pixels,
                grid=grid,
                nodata=0,
                band_descriptions=("red", "green", "blue"),
                units="digital number (uint8 RGB as supplied)",
                title="Surface reflectance RGB (red, green, blue)",
            ),
            RasterLayer(
                role="qa",
                filename=f"{product_id}_QA_PIXEL.TIF",
                data=qa[None],
                grid=grid,
                nodata=QA_FILL,
                band_descriptions=("qa_pixel",),
                units="bit field",
                title="Pixel quality assessment (Collection 2 QA_PIXEL bits)",
                categorical=True,
            ),
        )
        return GeneratedItem(
            item_id=product_id,
            layers=layers,
            timestamp=acquired,
            start_datetime=None,
            end_datetime=None,
            properties={
                "platform": sensor.platform,
                "instruments": list(sensor.instruments),
                "eo:cloud_cover": round(cloud_cover, 2),
                "landsat:scene_id": product_id,
                "landsat:wrs_path": f"{path:03d}",
                "landsat:wrs_row": f"{row:03d}",
                "landsat:collection_number": "02",
                "landsat:collection_category": "T1",
                "landsat:correction": "L2SP",
            },
            extra={
                "scene_id": product_id,
                "sensor": sensor.code,
                "cloud_cover_percent": f"{cloud_cover:.2f}",
                "units": "uint8 RGB",
            },
        )
