"""Boston 2020 built through the Dagster assets from the loopback STAC world, then checked tile
by tile against an independent computation over the same served files.

One source set takes OPT, NDVI and HEAT (Landsat C2 L2), the DEM (Copernicus GLO-30) and WTH
(Daymet) from the ``planetary-computer`` family, pointed at ``rustac serve``, the Range file
server and the SAS endpoint of ``tests/stac_fixtures.py``; the cube's database is built and
published as a build does. The expected tiles are computed here without the adapters or the
processing code: scene pixels composited per pixel with numpy (median of clear observations),
brought onto the 25 m chip grid (images) or straight onto the tiles (area means) by counting
5 m sub-cells, the DEM sampled at the chip pixels' centres, Daymet's cells weighted by their
intersected areas with shapely.

Then the file server fails one product-year past every retry: that partition fails alone with
an error naming source, city and year, nothing of it is installed, every file of the published
release stays byte for byte as it was, and a rerun once the server recovers completes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import numpy as np
import pytest
import rasterio
import shapely
import yaml
import zarr
from pyproj import CRS, Transformer

from citycube.catalogue.cities import SCALES
from citycube.grid.tiles import city_grid, pixel_grid
from pipelines.resources import ComputeResource, CubeResource
from sources.stac.grids import landsat_grid
from tests.stac_expected import area_means, expected_stacks, grid_shares, quiet
from tests.stac_fixtures import (
    CITY,
    DAYMET_LCC,
    DAYMET_X0,
    DAYMET_Y0,
    DAYMET_YEARS,
    StacWorld,
)

pytestmark = pytest.mark.e2e

YEAR = 2020
FAILING_YEAR = 2019
"""The year of the ``faulty`` scene (its thermal asset fails in the fault test)."""
STAC_PRODUCTS = ("landsat_c2l2", "landsat_ndvi", "landsat_st", "cop_dem_glo30", "daymet")
CITY_YEAR_KEYS = [
    "sources/landsat_c2l2",
    "sources/landsat_ndvi",
    "sources/landsat_st",
    "sources/daymet",
    "derived/opt",
    "derived/ndvi",
    "derived/heat",
    "derived/wth",
    "modalities/opt",
    "modalities/ndvi",
    "modalities/heat",
    "modalities/wth",
    "modalities/dem",
]
CUBE_KEYS = ["cube/tiles", "cube/staged_database", "cube/database"]


def _materialize(resources: dict[str, Any], keys: list[str], partition: str | None) -> Any:
    from pipelines.definitions import build_definitions
    from tests.conftest import materialize_keys

    return materialize_keys(
        build_definitions(),
        keys,
        partition,
        resources=resources,
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


@pytest.fixture(scope="module")
def built(stac_world: StacWorld, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The DEM (static), then Boston 2020's city-year assets, then the published cube."""
    stac_world.set_faults([])
    root = tmp_path_factory.mktemp("stac_e2e")
    source_set = root / "source_set.yaml"
    spec = {
        "name": "loopback-stac-e2e",
        "default": "sample",
        "products": {p: "planetary-computer" for p in STAC_PRODUCTS},
        "options": {"sample": {"seed": 0}, "planetary-computer": stac_world.options()},
    }
    source_set.write_text(yaml.safe_dump(spec), encoding="utf-8")
    cube = CubeResource(
        data_root=str(root / "data"), release_version="t", source_set=str(source_set)
    )
    resources = {"cube": cube, "compute": ComputeResource(workers=1)}
    for keys, partition in (
        (["sources/cop_dem_glo30", "derived/dem"], CITY),
        (CITY_YEAR_KEYS, f"{CITY}|{YEAR}"),
        (CUBE_KEYS, None),
    ):
        result = _materialize(resources, keys, partition)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
    return {"cube": cube, "resources": resources, "release": cube.release()}


def observations(database: Path, modality: str, year: int) -> dict[tuple[str, str], tuple]:
    """(tile, field) → (value, valid_fraction, available, reason, source_id, synthetic)."""
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.execute(
            "SELECT tile_id, field, value, valid_fraction, available, reason, source_id, "
            "synthetic FROM observations WHERE city = ? AND modality = ? AND year = ?",
            [CITY, modality, year],
        ).fetchall()
    return {(r[0], r[1]): r[2:] for r in rows}


def tiles() -> Iterator[tuple[str, tuple[float, float, float, float]]]:
    """Every tile of both grids with its bounds (xmin, ymin, xmax, ymax) in the city's CRS."""
    for scale in SCALES:
        for tile in city_grid(CITY, scale).tiles():
            yield tile.tile_id, tile.bounds


def tile_windows(step: float) -> dict[str, tuple[slice, slice]]:
    """Every tile's (rows, cols) window on the city's pixel grid at ``step`` metres."""
    pixels = pixel_grid(CITY, step)
    out = {}
    for tile_id, (xmin, _, xmax, ymax) in tiles():
        row, col, size = (
            round((pixels.y_max - ymax) / step),
            round((xmin - pixels.x_min) / step),
            round((xmax - xmin) / step),
        )
        out[tile_id] = (slice(row, row + size), slice(col, col + size))
    return out


def expected_image(
    bands: list[np.ndarray], valid: np.ndarray, threshold: float
) -> dict[str, tuple[list[float], float, str | None]]:
    """Per tile of an image modality: (band means, valid fraction, reason).

    Each 25 m chip pixel averages the valid 30 m cells under it by area and counts when at
    least half of its area is valid; a tile's value is the mean of its valid chip pixels and it
    is available when at least ``threshold`` of them are valid.
    """
    grid, pixels = landsat_grid(CITY), pixel_grid(CITY, 25)
    shares = grid_shares(grid.transform, grid.shape, pixels.x_min, pixels.y_max, 25, pixels.shape)
    warped = [area_means(band, valid, shares) for band in bands]
    chip_valid = warped[0][1] >= 0.5 - 1e-9
    out = {}
    for tile_id, window in tile_windows(25).items():
        ok = chip_valid[window]
        fraction = float(ok.mean())
        means = [float(mean[window][ok].mean()) if ok.any() else np.nan for mean, _ in warped]
        reason = None
        if fraction < threshold - 1e-9:
            reason = "no_valid_pixels" if not ok.any() else "insufficient_valid_pixels"
        out[tile_id] = (means, fraction, reason)
    return out


def expected_area_means(
    bands: list[np.ndarray], valid: np.ndarray, threshold: float
) -> dict[str, tuple[list[float], float, str | None]]:
    """Per tile of a numeric modality on the Landsat grid: (area means of the valid cells,
    valid share of the tile, reason)."""
    grid = landsat_grid(CITY)
    out = {}
    for scale in SCALES:
        tile_grid = city_grid(CITY, scale)
        shares = grid_shares(
            grid.transform,
            grid.shape,
            tile_grid.x_min,
            tile_grid.y_max,
            tile_grid.tile_size,
            (tile_grid.n_rows, tile_grid.n_cols),
        )
        means = [area_means(band, valid, shares)[0].ravel() for band in bands]
        support = area_means(bands[0], valid, shares)[1].ravel()
        for i, tile_id in enumerate(tile_grid.tile_ids()):
            fraction = float(support[i])
            reason = "insufficient_valid_support" if fraction < threshold - 1e-9 else None
            out[tile_id] = ([float(m[i]) for m in means], fraction, reason)
    return out


def assert_tiles(
    got: dict[tuple[str, str], tuple],
    want: dict[str, tuple[list[float], float, str | None]],
    fields: list[str],
    source_id: str,
    *,
    offset: float = 0.0,
    atol: float,
    fraction_atol: float = 1e-6,
) -> set[str | None]:
    """Every tile's availability, reason, valid fraction, value and provenance, field by
    field; returns the reasons met (None: available)."""
    assert {tile for tile, _ in got} == set(want)
    for tile_id, (means, fraction, reason) in want.items():
        for field, mean in zip(fields, means, strict=True):
            value, got_fraction, available, got_reason, got_source, synthetic = got[tile_id, field]
            where = (tile_id, field)
            assert (got_reason, available) == (reason, reason is None), where
            assert got_fraction == pytest.approx(fraction, abs=fraction_atol), where
            assert (got_source, synthetic) == (source_id, False), where
            if reason is None:
                assert value == pytest.approx(mean + offset, abs=atol), where
            else:
                assert value is None, where
    return {reason for _, _, reason in want.values()}


# ---- values against the independent computation ---------------------------------------------


@pytest.fixture(scope="module")
def stacks(stac_world: StacWorld) -> dict[str, np.ndarray]:
    """Boston 2020's clear observations of every band, read from the served scenes."""
    return expected_stacks(stac_world, ["red", "green", "blue", "nir08", "thermal"])


def test_opt_tiles_equal_an_independent_computation(built: dict, stacks: dict) -> None:
    """Per-band medians mapped to 1–255 by the fixed 0–0.3 reflectance range; the tiles the
    scenes do not cover are NULL with the image rule's reasons."""
    medians = [quiet(np.nanmedian, stacks[b], axis=0) for b in ("red", "green", "blue")]
    valid = np.logical_and.reduce([np.isfinite(m) for m in medians])
    rgb = [np.clip(np.rint(1 + 254 * m / 0.3), 1, 255) for m in medians]
    want = expected_image(rgb, valid, 0.98)
    got = observations(built["release"].duckdb_file, "OPT", YEAR)
    # A one-column shift of the red ramp would move a tile by ~0.85.
    reasons = assert_tiles(got, want, ["red", "green", "blue"], "pc:landsat-c2-l2", atol=0.02)
    assert reasons == {None, "insufficient_valid_pixels", "no_valid_pixels"}


def test_ndvi_tiles_equal_an_independent_computation(built: dict, stacks: dict) -> None:
    index = quiet(np.divide, stacks["nir08"] - stacks["red"], stacks["nir08"] + stacks["red"])
    median = quiet(np.nanmedian, index, axis=0)
    want = expected_image([median], np.isfinite(median), 0.98)
    got = observations(built["release"].duckdb_file, "NDVI", YEAR)
    reasons = assert_tiles(got, want, ["ndvi"], "pc:landsat-c2-l2", atol=1e-4)
    assert reasons == {None, "insufficient_valid_pixels", "no_valid_pixels"}


def test_heat_tiles_equal_an_independent_computation(built: dict, stacks: dict) -> None:
    """Per-pixel mean and median of clear Kelvin observations, area means over each tile, °C."""
    mean = quiet(np.nanmean, stacks["thermal"], axis=0)
    median = quiet(np.nanmedian, stacks["thermal"], axis=0)
    valid = np.isfinite(mean) & (mean >= 183.15) & (mean <= 363.15)
    want = expected_area_means([mean, median], valid, 0.5)
    got = observations(built["release"].duckdb_file, "HEAT", YEAR)
    fields = ["mean_c", "median_c"]
    # A one-column shift of the thermal ramp would move a tile by ~0.05 K.
    reasons = assert_tiles(got, want, fields, "pc:landsat-c2-l2", offset=-273.15, atol=1e-3)
    assert reasons == {None, "insufficient_valid_support"}


def _dem_at(world: StacWorld, lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Elevation of the served GLO-30 cell each point falls in (NaN in a void or no tile)."""
    out = np.full(lon.shape, np.nan)
    for item in world.items.values():
        if item["collection"] != "cop-dem-glo-30":
            continue
        with rasterio.open(world.local_path(item["assets"]["data"]["href"])) as src:
            whole, t, nodata = src.read(1), src.transform, src.nodata
        cols = np.floor((lon - t.c) / t.a).astype(int)
        rows = np.floor((lat - t.f) / t.e).astype(int)
        inside = (rows >= 0) & (rows < whole.shape[0]) & (cols >= 0) & (cols < whole.shape[1])
        values = whole[np.clip(rows, 0, whole.shape[0] - 1), np.clip(cols, 0, whole.shape[1] - 1)]
        values = np.where(values == nodata, np.nan, values)
        out = np.where(inside & np.isnan(out), values, out)
    return out


def test_dem_tiles_agree_with_the_tiles_sampled_at_every_chip_pixel(
    built: dict, stac_world: StacWorld
) -> None:
    """The chips average 1″-lattice cells warped onto 25 m pixels; sampling each pixel's centre
    in the cell it falls in gives the same tiles to within the cells' slopes."""
    pixels = pixel_grid(CITY, 25)
    x, y = np.meshgrid(pixels.x_coords(), pixels.y_coords())
    lon, lat = Transformer.from_crs(pixels.crs, "EPSG:4326", always_xy=True).transform(x, y)
    elevation = _dem_at(stac_world, lon, lat)
    valid = np.isfinite(elevation)
    assert (~valid).sum() > 1000  # the void lies under the city
    want = {}
    for tile_id, window in tile_windows(25).items():
        ok = valid[window]
        fraction = float(ok.mean())
        want[tile_id] = (
            [float(elevation[window][ok].mean())],
            fraction,
            None if fraction >= 0.98 else "insufficient_valid_pixels",
        )
    got = observations(built["release"].duckdb_file, "DEM", YEAR)
    reasons = assert_tiles(
        got, want, ["elevation_m"], "pc:cop-dem-glo-30", atol=0.05, fraction_atol=5e-3
    )
    assert reasons == {None, "insufficient_valid_pixels"}  # the void's tiles


def _tile_polygon(bounds: tuple[float, float, float, float], to_lcc: Transformer) -> Any:
    """A tile's outline in Daymet's Lambert conformal conic, its edges densified to 10 m."""
    ring = shapely.segmentize(shapely.box(*bounds), 10.0)
    x, y = np.asarray(ring.exterior.coords).T
    return shapely.Polygon(np.column_stack(to_lcc.transform(x, y)))


def test_wth_tiles_equal_the_cells_weighted_by_their_areas_in_each_tile(
    built: dict, stac_world: StacWorld
) -> None:
    """Area means of the store's 1 km cells over each tile's outline (intersected with
    shapely, in the store's own plane); the fields the store does not publish are NULL."""
    store = stac_world.daymet
    assert store is not None
    t = DAYMET_YEARS.index(YEAR)
    cells = {}
    for name in ("tmin", "tmax", "prcp"):
        values = zarr.open_array(str(store.path / name), mode="r")[t].astype(np.float64)
        cells[name] = np.where(values == -9999, np.nan, values)
    cells["tmean"] = (cells["tmin"] + cells["tmax"]) / 2
    rows, cols = store.shape
    west = DAYMET_X0 + 1000 * (store.col0 + np.arange(cols)) - 500
    north = DAYMET_Y0 - 1000 * (store.row0 + np.arange(rows)) + 500
    to_lcc = Transformer.from_crs(CRS.from_epsg(32619), CRS.from_proj4(DAYMET_LCC), always_xy=True)
    want = {}
    for tile_id, bounds in tiles():
        outline = _tile_polygon(bounds, to_lcc)
        xmin, ymin, xmax, ymax = outline.bounds
        c = np.flatnonzero((west + 1000 > xmin) & (west < xmax))
        r = np.flatnonzero((north - 1000 < ymax) & (north > ymin))
        rr, cc = np.meshgrid(r, c, indexing="ij")
        boxes = shapely.box(west[cc], north[rr] - 1000, west[cc] + 1000, north[rr])
        area = shapely.area(shapely.intersection(boxes, outline))
        valid = np.isfinite(cells["tmin"][rr, cc])
        fraction = float(area[valid].sum() / outline.area)
        means = [
            float((area * np.where(valid, cells[n][rr, cc], 0)).sum() / area[valid].sum())
            for n in ("tmin", "tmax", "tmean", "prcp")
        ]
        want[tile_id] = (means, fraction, None if fraction >= 0.5 else "insufficient_valid_support")
    got = observations(built["release"].duckdb_file, "WTH", YEAR)
    fields = ["tmin_c", "tmax_c", "tmean_c", "prcp_mm"]
    published = {k: v for k, v in got.items() if k[1] in fields}
    assert_tiles(published, want, fields, "pc:daymet-annual-na", atol=1e-4)
    unpublished = {v[:4] for k, v in got.items() if k[1] not in fields}
    assert unpublished == {(None, None, False, "variable_not_published")}


def test_the_release_names_the_stac_sources(built: dict) -> None:
    meta = json.loads(built["release"].metadata_file.read_text(encoding="utf-8"))
    assert meta["source_set"] == "loopback-stac-e2e"
    for product, source_id in (
        ("landsat_c2l2", "pc:landsat-c2-l2"),
        ("landsat_ndvi", "pc:landsat-c2-l2"),
        ("landsat_st", "pc:landsat-c2-l2"),
        ("cop_dem_glo30", "pc:cop-dem-glo-30"),
        ("daymet", "pc:daymet-annual-na"),
    ):
        assert meta["sources"][product]["source_id"] == source_id, product
        assert meta["sources"][product]["synthetic"] is False, product


# ---- a product-year failing past its retries --------------------------------------------------


def _digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, by relative path."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _error_text(error: Any) -> str:
    """A step's error with its causes (Dagster reports a retried step's own error as the cause
    of "Exceeded max_retries")."""
    parts = []
    while error is not None:
        parts.append(error.message)
        error = error.cause
    return "\n".join(parts)


def test_a_product_year_failing_past_its_retries_fails_alone_and_the_cube_stays_intact(
    built: dict, stac_world: StacWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thermal asset of 2019's scene answers 503 to every request: HEAT's source partition
    fails after the adapter's retries and Dagster's, with an error naming source, city, year,
    item and asset; NDVI's partition of the same step completes; nothing of the failed item is
    installed and the published release is unchanged byte for byte. Once the server recovers,
    a rerun completes 2019 and leaves 2020 as it was.

    Dagster's retry policy is cut to one quick retry here: its back-off is not under test.
    """
    import assets.sources

    monkeypatch.setattr(assets.sources, "SOURCE_RETRY", dg.RetryPolicy(max_retries=1, delay=0.1))
    release = built["release"]
    sources = release.sources_dir
    published = _digests(release.root)
    scene = stac_world.scenes["faulty"]
    thermal = stac_world.items[scene.scene_id]["assets"]["lwir11"]["href"].rsplit("/", 1)[1]
    keys = [
        "sources/landsat_ndvi",
        "sources/landsat_st",
        "derived/ndvi",
        "derived/heat",
        "modalities/ndvi",
        "modalities/heat",
    ]
    partition = f"{CITY}|{FAILING_YEAR}"
    stac_world.set_faults([{"match": thermal, "status": 503}])
    before = len(stac_world.log_lines())
    try:
        failed = _materialize(built["resources"], keys, partition)
    finally:
        stac_world.set_faults([])
    refused = [line for line in stac_world.log_lines()[before:] if thermal in line]

    assert not failed.success
    assert sum(e.event_type_value == "STEP_UP_FOR_RETRY" for e in failed.all_events) == 1
    (failure,) = [e for e in failed.all_events if e.is_step_failure]
    message = _error_text(failure.event_specific_data.error)
    assert "1 of 2 asset partitions failed" in message, message
    assert f"sources/landsat_st {partition}" in message, message
    for part in ("pc:landsat-c2-l2", CITY, f"source year {FAILING_YEAR}", scene.scene_id, "503"):
        assert part in message, part
    assert "sig=" not in message
    assert len(refused) >= 2 * 3 and all(" 503 " in line for line in refused)

    failed_item = sources / "landsat_st" / CITY / str(FAILING_YEAR)
    assert not failed_item.exists()
    assert not list(failed_item.parent.glob(f".{FAILING_YEAR}.*"))  # no staging left behind
    assert (sources / "landsat_ndvi" / CITY / str(FAILING_YEAR) / "_complete.json").is_file()
    assert _digests(release.root) == published
    assert not release.observations_file(CITY, FAILING_YEAR, "HEAT").exists()
    assert not release.observations_file(CITY, FAILING_YEAR, "NDVI").exists()

    before = len(stac_world.log_lines())
    rerun = _materialize(built["resources"], keys, partition)
    assert rerun.success, [e.message for e in rerun.all_events if e.is_failure]
    requested = " ".join(stac_world.log_lines()[before:])
    assert thermal in requested
    assert f"{scene.scene_id}_SR_B5" not in requested  # NDVI's complete item was reused
    assert (failed_item / "_complete.json").is_file()
    heat = observations_from(release.observations_file(CITY, FAILING_YEAR, "HEAT"))
    assert heat and any(row["available"] for row in heat)
    after = _digests(release.root)
    assert {name: after.get(name) for name in published} == published


def observations_from(path: Path) -> list[dict[str, Any]]:
    """Rows of one observations partition file."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()
