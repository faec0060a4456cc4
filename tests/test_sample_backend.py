"""The sample backend: native forms, determinism, idempotent and atomic fetches, coherence."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pystac
import pytest
import rasterio
from pyproj import CRS, Transformer
from rasterio.warp import Resampling, reproject

from citycube.errors import SourceUnavailableError, UnknownCityError, UnknownProductError
from citycube.grid.tiles import city_extent, city_grid
from citycube.items.protocol import SourceItem
from sources.sample import SAMPLE_VERSION, SYNTHETIC_NOTICE, SampleBackend, synthetic_city
from sources.sample import backend as backend_module
from sources.sample.landsat import (
    QA_CLEAR,
    QA_CLOUD,
    QA_FILL,
    QA_WATER,
    sensor_for,
)
from sources.sample.world import PRODUCT_MARGIN_M

CITY = "Amsterdam"
YEAR = 2020
ARC_SECOND = 1 / 3600

# product -> (CRS, pixel size (x, y), dtype, nodata, band count)
NATIVE_FORM: dict[str, tuple[str, tuple[float, float], str, float, int]] = {
    "landsat_c2l2": ("EPSG:32631", (30.0, 30.0), "uint8", 0, 3),
    # Amsterdam lies between 50° and 60° N, where GLO-30 longitude spacing is 1.5″.
    "cop_dem_glo30": ("EPSG:4326", (1.5 * ARC_SECOND, ARC_SECOND), "float32", -32767, 1),
    "glc_fcs30d": (
        "EPSG:4326",
        (0.00026949458523585647, 0.00026949458523585647),
        "uint8",
        255,
        1,
    ),
    "ghs_pop": ("ESRI:54009", (1000.0, 1000.0), "float32", -200, 1),
    "ghs_built_v": ("ESRI:54009", (100.0, 100.0), "float32", -9999, 2),
    "odiac": ("EPSG:4326", (1 / 120, 1 / 120), "float32", -9999, 1),
}


def _year(product: str) -> int | None:
    return None if product == "cop_dem_glo30" else YEAR


def _read(path: Path) -> np.ndarray:
    with rasterio.open(path) as ds:
        return ds.read()


@pytest.fixture(scope="module")
def backend() -> SampleBackend:
    return SampleBackend()


@pytest.fixture(scope="module")
def dest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sample-sources")


@pytest.fixture(scope="module")
def items(backend: SampleBackend, dest: Path) -> dict[str, SourceItem]:
    """One item per product for Amsterdam (shared by the read-only tests)."""
    return {p: backend.fetch(p, CITY, _year(p), dest) for p in NATIVE_FORM}


# ---- catalogue and errors ------------------------------------------------------------------


def test_products_and_years(backend: SampleBackend) -> None:
    assert set(NATIVE_FORM) <= set(backend.products())
    assert backend.source_years("cop_dem_glo30", CITY) is None
    assert backend.source_years("odiac", CITY) == list(range(2000, 2025))
    assert backend.source_years("ghs_pop", CITY) == [2000, 2005, 2010, 2015, 2020, 2025]
    assert backend.source_years("landsat_c2l2", CITY) == list(range(2000, 2026))
    assert backend.source_years("glc_fcs30d", CITY) == list(range(2000, 2026))


def test_odiac_2025_is_unavailable(backend: SampleBackend, tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailableError) as err:
        backend.fetch("odiac", CITY, 2025, tmp_path)
    assert err.value.reason == "source_year_missing"
    assert not (tmp_path / "odiac").exists() or not any((tmp_path / "odiac").rglob("*.tif"))


def test_year_between_epochs_is_unavailable(backend: SampleBackend, tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailableError, match="2003"):
        backend.fetch("ghs_pop", CITY, 2003, tmp_path)


def test_bad_requests_say_what_to_change(backend: SampleBackend, tmp_path: Path) -> None:
    with pytest.raises(UnknownProductError, match=r"'modis'.*landsat_c2l2.*odiac"):
        backend.fetch("modis", CITY, YEAR, tmp_path)
    with pytest.raises(ValueError, match="static"):
        backend.fetch("cop_dem_glo30", CITY, YEAR, tmp_path)
    with pytest.raises(ValueError, match="source year"):
        backend.fetch("odiac", CITY, None, tmp_path)
    with pytest.raises(UnknownCityError):
        backend.fetch("odiac", "Atlantis", YEAR, tmp_path)


# ---- native form ---------------------------------------------------------------------------


@pytest.mark.parametrize("product", sorted(NATIVE_FORM))
def test_native_form(product: str, items: dict[str, SourceItem], dest: Path) -> None:
    item = items[product]
    crs, (res_x, res_y), dtype, nodata, count = NATIVE_FORM[product]
    year_dir = "static" if item.source_year is None else str(item.source_year)
    assert item.files["data"].parent == dest / product / CITY / year_dir
    assert item.source_id == f"sample:{product}"
    assert item.synthetic and item.version == SAMPLE_VERSION
    with rasterio.open(item.files["data"]) as ds:
        assert CRS.from_user_input(ds.crs) == CRS.from_user_input(crs)
        assert ds.res == pytest.approx((res_x, res_y), rel=1e-9)
        assert ds.count == count
        assert set(ds.dtypes) == {dtype}
        assert ds.nodatavals == (nodata,) * count
        assert all(ds.descriptions)
        assert ds.profile["compress"] == "deflate" and ds.profile["tiled"]
        tags = ds.tags()
        assert tags["SYNTHETIC"] == "true"
        assert tags["CITYCUBE_PRODUCT"] == product
        assert tags["CITYCUBE_NOTICE"] == SYNTHETIC_NOTICE
        # The file covers the city extent plus the margin.
        xmin, ymin, xmax, ymax = city_extent(CITY)
        m = PRODUCT_MARGIN_M - 1
        to_native = Transformer.from_crs("EPSG:32631", ds.crs, always_xy=True)
        box = to_native.transform_bounds(xmin - m, ymin - m, xmax + m, ymax + m)
        left, bottom, right, top = ds.bounds
        assert left <= box[0] and bottom <= box[1] and right >= box[2] and top >= box[3]
        values = ds.read(1)
        assert (values != nodata).mean() > 0.5


@pytest.mark.parametrize("product", sorted(NATIVE_FORM))
def test_stac_item(product: str, items: dict[str, SourceItem]) -> None:
    item = items[product]
    stac = pystac.Item.from_file(item.extra["stac_item"])
    assert stac.properties["citycube:synthetic"] is True
    assert stac.properties["citycube:product"] == product
    assert stac.datetime is not None or (
        stac.properties.get("start_datetime") and stac.properties.get("end_datetime")
    )
    raw = json.loads(Path(item.extra["stac_item"]).read_text())
    props = raw["properties"]
    assert "proj:wkt2" in props and len(props["proj:transform"]) == 6
    assert props["proj:epsg"] == CRS.from_user_input(NATIVE_FORM[product][0]).to_epsg()
    with rasterio.open(item.files["data"]) as ds:
        assert props["proj:shape"] == [ds.height, ds.width]
    for role, path in item.files.items():
        asset = raw["assets"][role]
        assert asset["href"] == f"./{path.name}" and role in asset["roles"]
    lon, lat = 4.8922, 52.3731  # the city's landmark
    assert stac.bbox is not None
    west, south, east, north = stac.bbox
    assert west < lon < east and south < lat < north


def test_landsat_pixels_avoid_tile_edges(items: dict[str, SourceItem]) -> None:
    with rasterio.open(items["landsat_c2l2"].files["data"]) as ds:
        t = ds.transform
    assert t.c % 30 == 15 and t.f % 30 == 15  # corners on odd multiples of 15 m
    grid = city_grid(CITY, "2km")
    x_edges = grid.x_min + 2000 * np.arange(grid.n_cols + 1)
    y_edges = grid.y_max - 2000 * np.arange(grid.n_rows + 1)
    for offsets in ((x_edges - t.c) / 30, (t.f - y_edges) / 30):
        fractions = offsets % 1
        assert np.all((fractions > 0.1) & (fractions < 0.9))  # no tile edge on a pixel edge


def test_landsat_scene_naming_and_qa(items: dict[str, SourceItem]) -> None:
    item = items["landsat_c2l2"]
    scene = item.extra["scene_id"]
    assert scene.startswith("LC08_L2SP_") and scene.endswith("_02_T1")
    assert item.files["data"].name == f"{scene}_SR_RGB.TIF"
    assert item.files["qa"].name == f"{scene}_QA_PIXEL.TIF"
    rgb, qa = _read(item.files["data"]), _read(item.files["qa"])[0]
    assert qa.dtype == np.uint16
    fill = (qa & QA_FILL) > 0
    assert np.array_equal(fill, (rgb == 0).all(axis=0))
    clear = (qa & QA_CLEAR) > 0
    assert clear.any() and ((qa & QA_CLOUD) > 0).any()
    assert not (clear & ((qa & QA_CLOUD) > 0)).any()
    # Water pixels look like water: darker than land and blue over red.
    water = ((qa & QA_WATER) > 0) & clear
    land = ~((qa & QA_WATER) > 0) & clear & ~fill
    assert water.sum() > 1000
    assert rgb[2][water].mean() > rgb[0][water].mean()
    assert rgb[:, water].mean() < rgb[:, land].mean()


def test_landsat_sensor_years_and_slc_gaps(backend: SampleBackend, dest: Path) -> None:
    assert [sensor_for(y).code for y in (2000, 2011, 2012, 2013, 2020, 2021, 2025)] == [
        "LT05",
        "LT05",
        "LE07",
        "LC08",
        "LC08",
        "LC09",
        "LC09",
    ]
    item = backend.fetch("landsat_c2l2", CITY, 2012, dest)
    assert item.extra["scene_id"].startswith("LE07_")
    qa = _read(item.files["qa"])[0]
    fill_rows = ((qa & QA_FILL) > 0).mean(axis=1)
    assert 0.02 < ((qa & QA_FILL) > 0).mean() < 0.9  # SLC-off stripes are fill
    assert fill_rows.max() > fill_rows.min()  # striped, not uniform


def test_cloudiness_varies_by_year() -> None:
    world = synthetic_city(CITY)
    fractions = [world.cloud_fraction(y) for y in range(2000, 2026)]
    assert max(fractions) > 0.3  # some heavily clouded years
    assert np.median(fractions) < 0.15  # most years are light


def test_dem_sea_zero_voids_and_polders(items: dict[str, SourceItem]) -> None:
    dem = _read(items["cop_dem_glo30"].files["data"])[0]
    valid = dem != -32767
    assert (~valid).sum() > 0  # a few voids
    assert (~valid).mean() < 0.01
    assert (dem[valid] == 0).mean() > 0.01  # sea (and nothing else) is exactly 0
    assert dem[valid].min() < -1  # polders below sea level


def test_glc_classes_and_growth(
    backend: SampleBackend, items: dict[str, SourceItem], dest: Path
) -> None:
    later = _read(items["glc_fcs30d"].files["data"])[0]
    legend = {0, 10, 11, 12, 20, 51, 52, 61, 62, 71, 72, 81, 82, 91, 92, 120, 121, 122}
    legend |= {130, 140, 150, 152, 153, 181, 182, 183, 184, 185, 186, 187, 190, 200, 201, 202}
    legend |= {210, 220, 255}
    assert set(np.unique(later).tolist()) <= legend
    assert {190, 210}.issubset(set(np.unique(later).tolist()))
    earlier = _read(backend.fetch("glc_fcs30d", CITY, 2000, dest).files["data"])[0]
    assert (later == 190).mean() > (earlier == 190).mean()


# ---- determinism, reuse, atomicity ----------------------------------------------------------


def test_deterministic_and_seeded(items: dict[str, SourceItem], tmp_path: Path) -> None:
    for product in ("odiac", "ghs_built_v"):
        again = SampleBackend().fetch(product, CITY, YEAR, tmp_path / "again")
        assert np.array_equal(_read(again.files["data"]), _read(items[product].files["data"]))
        other = SampleBackend(seed=1).fetch(product, CITY, YEAR, tmp_path / "other")
        assert not np.array_equal(_read(other.files["data"]), _read(items[product].files["data"]))


def test_second_fetch_reuses_files(backend: SampleBackend, tmp_path: Path) -> None:
    first = backend.fetch("odiac", CITY, 2010, tmp_path)
    folder = first.files["data"].parent
    marker = json.loads((folder / "_complete.json").read_text())
    assert marker["version"] == SAMPLE_VERSION and marker["seed"] == 0
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    second = backend.fetch("odiac", CITY, 2010, tmp_path)
    assert second == first
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    # Another seed must not reuse these files.
    reseeded = SampleBackend(seed=3).fetch("odiac", CITY, 2010, tmp_path)
    assert json.loads((folder / "_complete.json").read_text())["seed"] == 3
    assert reseeded.extra["seed"] == "3"


def test_killed_fetch_leaves_no_half_item(
    backend: SampleBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(backend_module, "_write_json", crash)
    with pytest.raises(KeyboardInterrupt):
        backend.fetch("ghs_pop", CITY, YEAR, tmp_path)
    city_dir = tmp_path / "ghs_pop" / CITY
    assert list(city_dir.iterdir()) == []
    monkeypatch.undo()

    # A partial directory (no marker) and a dead writer's staging directory get replaced.
    (city_dir / str(YEAR)).mkdir()
    (city_dir / str(YEAR) / "half.tif").write_bytes(b"II*\x00")
    (city_dir / f".{YEAR}.tmp-{2**22 + 999}-{'0' * 32}").mkdir()
    item = backend.fetch("ghs_pop", CITY, YEAR, tmp_path)
    assert sorted(os.listdir(city_dir)) == [str(YEAR)]
    assert not (city_dir / str(YEAR) / "half.tif").exists()
    assert item.files["data"].exists()


# ---- coherence ------------------------------------------------------------------------------


def test_population_follows_impervious_surface(items: dict[str, SourceItem]) -> None:
    pop_path, glc_path = items["ghs_pop"].files["data"], items["glc_fcs30d"].files["data"]
    with rasterio.open(pop_path) as pop_ds, rasterio.open(glc_path) as glc_ds:
        population = pop_ds.read(1)
        impervious = (glc_ds.read(1) == 190).astype(np.float32)
        impervious[glc_ds.read(1) == 255] = np.nan
        share = np.full(population.shape, np.nan, dtype=np.float32)
        reproject(
            impervious,
            share,
            src_transform=glc_ds.transform,
            src_crs=glc_ds.crs,
            src_nodata=np.nan,
            dst_transform=pop_ds.transform,
            dst_crs=pop_ds.crs,
            dst_nodata=np.nan,
            resampling=Resampling.average,
        )
    both = (population != -200) & np.isfinite(share)
    assert both.sum() > 100
    r = np.corrcoef(population[both], share[both])[0, 1]
    assert r > 0.6


def test_emissions_and_volume_follow_people(backend: SampleBackend, dest: Path) -> None:
    world = synthetic_city(CITY)
    xmin, ymin, xmax, ymax = city_extent(CITY)
    x = np.arange(xmin, xmax, 500.0)[None, :]
    y = np.arange(ymax, ymin, -500.0)[:, None]
    pts = world.points(x, y)
    people = world.population_density(pts, YEAR).ravel()
    carbon = world.emission_density(pts, YEAR).ravel()
    volume = world.built_volume(pts, YEAR)[0].ravel()
    assert np.corrcoef(people, carbon)[0, 1] > 0.6
    assert np.corrcoef(people, volume)[0, 1] > 0.5
    assert world.population_density(pts, 2025).sum() > world.population_density(pts, 2000).sum()
    assert world.carbon_per_capita(2024) < world.carbon_per_capita(2008)  # decline after a peak
