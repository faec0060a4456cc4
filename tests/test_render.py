"""Fixed renderings: exact colours per mode, no per-tile stretch, transparency, tiles and mosaics.

The pure tests use hand-made arrays; the release tests build one small Amsterdam release
(OPT, LC, DEM for 2020; OPT and LC have no 2021 source) through the processing core.
"""

from __future__ import annotations

import math
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
from PIL import Image

from citycube.catalogue.modalities import (
    ModalitySpec,
    Temporal,
    catalogue_text,
    load_catalogue,
    parse_catalogue,
)
from citycube.cube.release import Release, build_duckdb, release_metadata, tiles_frame
from citycube.errors import (
    ChipsNotFoundError,
    SpecError,
    UnknownCityError,
    UnknownModalityError,
    UnknownTileError,
    UnknownYearError,
)
from citycube.grid.tiles import city_grid, pixel_grid
from citycube.processing.compute import derive, process_partition
from citycube.reports.render import (
    GRID_LINE_RGBA,
    LEGEND_SIZE,
    UNKNOWN_CLASS_RGB,
    QuickLook,
    legend_image,
    parse_tile_id,
    render_chip,
    render_mosaic,
    render_store,
    render_tile,
    write_png,
)
from sources.sample import SampleBackend
from tests.conftest import LocalFilesBackend, materialize_keys, write_tif

CAT = load_catalogue()
CITY = "Amsterdam"  # 2 km grid 10×14; the 25 m pixel grid is 800×1200
TILE = "Amsterdam_2KM_r3_c4"


def _render(code: str, values: list | np.ndarray, valid: list | np.ndarray | None = None):
    """Render a (1, n) single-band row (or a (b, 1, n) array) and return (n, 4) RGBA."""
    arr = np.asarray(values)
    if arr.ndim == 1:
        arr = arr[None, None, :]
    mask = np.ones(arr.shape[1:], bool) if valid is None else np.asarray(valid)[None, :]
    return render_chip(CAT.get(code), CAT, arr, mask)[0]


# --------------------------------------------------------------------------------------------
# Pure rendering


def test_rgb_is_rendered_as_supplied() -> None:
    values = np.array([[[0, 17, 255]], [[1, 128, 254]], [[2, 200, 3]]], np.uint8)
    out = _render("OPT", values)
    assert out.tolist() == [[0, 1, 2, 255], [17, 128, 200, 255], [255, 254, 3, 255]]


def test_grey_uses_the_fixed_range_and_replicates_to_rgb() -> None:
    dem = _render("DEM", np.array([-500.0, -100.0, 1450.0, 3000.0, 8000.0], np.float32))
    assert dem[:, 0].tolist() == [0, 0, 128, 255, 255]
    assert (dem[:, 0] == dem[:, 1]).all() and (dem[:, 1] == dem[:, 2]).all()
    hf = _render("HF", np.array([0.0, 50.0, 100.0, 250.0], np.float32))
    assert hf[:, :3].tolist() == [[0] * 3, [128] * 3, [255] * 3, [255] * 3]


def test_grey_log1p_applies_log_then_the_fixed_range() -> None:
    values = np.array([0.0, math.expm1(1.5), math.expm1(3.0), 500.0])
    out = _render("BV", values)
    assert out[:, 0].tolist() == [0, 128, 255, 255]


def test_ndvi_is_grey_over_the_fixed_range_and_clipped_only_when_rendering() -> None:
    values = np.array([-1.0, 0.0, 1.0, 1.5, -3.0, 0.5], np.float32)
    before = values.copy()
    out = _render("NDVI", values)
    # AgenticCity-Bench Table 12: a fixed grayscale over [-1, 1]; -1 black, 1 white, 0 mid-grey.
    assert out[:, :3].tolist() == [[0] * 3, [128] * 3, [255] * 3, [255] * 3, [0] * 3, [191] * 3]
    np.testing.assert_array_equal(values, before)  # the data keep their values


@pytest.mark.parametrize("code", ["LC", "LU", "POI"])
def test_every_class_decodes_back_from_its_rendering_by_the_nearest_colour(code: str) -> None:
    """A rendering's pixels map back to their class ids by the nearest legend colour, the
    way generated images are scored: no two classes of a legend may share a colour."""
    legend = CAT.legends[CAT.get(code).render.legend or ""]
    ids = np.array(sorted(legend), np.uint8)
    rgb = _render(code, ids)[:, :3].astype(np.float64)
    colours = np.array([legend[i].color for i in sorted(legend)], np.float64)
    nearest = np.argmin(((rgb[:, None, :] - colours[None, :, :]) ** 2).sum(axis=2), axis=1)
    assert ids[nearest].tolist() == ids.tolist()


def test_a_legend_with_two_classes_of_one_colour_is_refused_on_load() -> None:
    text = catalogue_text().replace(
        "11: {name: herbaceous cover cropland, color: [230, 230, 60]}",
        "11: {name: herbaceous cover cropland, color: [255, 255, 95]}",
    )
    with pytest.raises(SpecError, match=r"classes 10 and 11 .* 5\.0 apart"):
        parse_catalogue(text)


def test_road_network_is_the_spec_colour_on_white() -> None:
    out = _render("RD", np.array([0, 1, 7], np.uint8))
    assert out.tolist() == [[255, 255, 255, 255], [224, 64, 69, 255], [224, 64, 69, 255]]


@pytest.mark.parametrize(
    ("code", "class_id", "rgb"),
    [("LC", 190, (195, 20, 0)), ("LC", 0, (180, 180, 180)), ("LU", 0, (20, 50, 120)),
     ("POI", 3, (230, 80, 60)), ("POI", 1, (160, 160, 160))],
)  # fmt: skip
def test_categorical_uses_the_legend_colours(code: str, class_id: int, rgb: tuple) -> None:
    assert tuple(_render(code, np.array([class_id], np.uint8))[0]) == (*rgb, 255)


def test_ids_outside_the_legend_get_the_unknown_colour() -> None:
    out = _render("LC", np.array([5, 10, 250], np.uint8))
    assert tuple(out[0, :3]) == UNKNOWN_CLASS_RGB and tuple(out[2, :3]) == UNKNOWN_CLASS_RGB
    assert tuple(out[1, :3]) == (255, 255, 100)
    assert (out[:, 3] == 255).all()
    floats = _render("LU", np.array([11.0, 11.5], np.float32))  # never rounded into a class
    assert tuple(floats[0, :3]) == (200, 30, 30) and tuple(floats[1, :3]) == UNKNOWN_CLASS_RGB


@pytest.mark.parametrize(("code", "shared"), [("DEM", 40.0), ("NDVI", 0.3), ("BV", 1.2)])
def test_no_per_tile_stretch(code: str, shared: float) -> None:
    """The same value renders identically in tiles with very different value ranges."""
    narrow = np.array([shared, shared + 0.01, shared + 0.02], np.float32)
    wide = np.array([shared, shared * 50, -shared * 40], np.float32)
    assert (_render(code, narrow)[0] == _render(code, wide)[0]).all()


def test_invalid_and_non_finite_pixels_are_transparent() -> None:
    out = _render("DEM", np.array([10.0, 10.0, np.nan], np.float32), [True, False, True])
    assert out[0, 3] == 255
    assert out[1].tolist() == [0, 0, 0, 0] and out[2].tolist() == [0, 0, 0, 0]
    lc = _render("LC", np.array([190, 190], np.uint8), [False, True])
    assert lc[0, 3] == 0 and lc[1, 3] == 255


def test_numeric_modalities_and_bad_shapes_are_refused() -> None:
    with pytest.raises(ChipsNotFoundError, match="CO2 is a numeric modality"):
        render_chip(CAT.get("CO2"), CAT, np.zeros((1, 2, 2)), np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="needs 3 band"):
        render_chip(CAT.get("OPT"), CAT, np.zeros((1, 2, 2), np.uint8), np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="expected values"):
        render_chip(CAT.get("DEM"), CAT, np.zeros((1, 2, 2)), np.ones((3, 2), bool))


@pytest.mark.parametrize("stride", [1, 2, 3, 7])
def test_binary_decimation_keeps_any_hit_in_each_block(stride: int) -> None:
    """A road one pixel wide survives decimation: each output pixel is its block's maximum,
    blocks at the ragged right and bottom edges included."""
    from citycube.reports.render import _block_max

    rng = np.random.default_rng(stride)
    values = rng.integers(-3, 2, (2, 23, 31)).astype(np.int8)
    out = _block_max(values, stride)
    assert out.shape == (2, math.ceil(23 / stride), math.ceil(31 / stride))
    for r, c in np.ndindex(out.shape[1:]):
        block = values[:, r * stride : (r + 1) * stride, c * stride : (c + 1) * stride]
        np.testing.assert_array_equal(out[:, r, c], block.max(axis=(1, 2)))


def test_png_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, size=(17, 23, 4), dtype=np.uint8)
    path = write_png(tmp_path / "sub" / "x.png", rgba)
    np.testing.assert_array_equal(np.asarray(Image.open(path)), rgba)
    assert not list(path.parent.glob(".*tmp"))


@pytest.mark.parametrize("name", ["LC", "LU", "POI", "glc_fcs30d"])
def test_legend_images_show_every_class_colour(name: str) -> None:
    image = legend_image(CAT, name)
    assert image.size == LEGEND_SIZE
    legend = CAT.legends[{"LC": "glc_fcs30d", "LU": "hilda_plus", "POI": "osm_building_function"}
                         .get(name, name)]  # fmt: skip
    colours = {tuple(c) for c in np.asarray(image).reshape(-1, 3).tolist()}
    assert {e.color for e in legend.values()} <= colours
    assert UNKNOWN_CLASS_RGB in colours


def test_tile_ids_are_checked() -> None:
    assert parse_tile_id("Boston_2KM_r7_c8") == ("Boston", "2km", 7, 8)
    with pytest.raises(UnknownTileError, match="not of the form"):
        parse_tile_id("Boston_r7_c8")
    with pytest.raises(UnknownTileError, match="rows 0–9"):
        parse_tile_id("Amsterdam_2KM_r10_c0")
    with pytest.raises(UnknownCityError):
        parse_tile_id("Atlantis_2KM_r1_c1")


# --------------------------------------------------------------------------------------------
# A small release


def build_small_release(data_root: Path, version: str = "t") -> Release:
    """Amsterdam: OPT and LC for 2020 (no 2021 source), static DEM; tiles + DuckDB views.

    OPT is a column/row gradient, LC a 2 km checkerboard of 190/210, DEM rises eastwards.
    """
    grid = pixel_grid(CITY, 25)
    yy, xx = np.mgrid[0 : grid.height, 0 : grid.width]
    rgb = np.stack(
        [1 + xx * 254 // grid.width, 1 + yy * 254 // grid.height, np.full_like(xx, 90)]
    ).astype(np.uint8)
    lc = np.where((xx // 80 + yy // 80) % 2 == 0, 190, 210).astype(np.uint8)
    dem = (xx * 2.0 - 50.0).astype(np.float32)
    src, crs, transform = data_root / "src", "EPSG:32631", grid.transform
    qa = np.zeros((1, grid.height, grid.width), np.uint16)
    backend = LocalFilesBackend(
        {
            ("landsat_c2l2", CITY, 2020): {
                "data": write_tif(src / "rgb.tif", rgb, crs=crs, transform=transform, nodata=0),
                "qa": write_tif(src / "qa.tif", qa, crs=crs, transform=transform),
            },
            ("test_lc", CITY, 2020): {
                "data": write_tif(src / "lc.tif", lc, crs=crs, transform=transform, nodata=255)
            },
            ("test_dem", CITY, None): {
                "data": write_tif(src / "dem.tif", dem, crs=crs, transform=transform, nodata=-32767)
            },
        }
    )
    release = Release(data_root, version)
    for code in ("OPT", "LC", "DEM"):
        modality = CAT.get(code)
        if code != "OPT":  # the hand-made files are in the city CRS, not the product's
            modality = modality.model_copy(update={"product": f"test_{code.lower()}"})
        for year in (2020, 2021):
            process_partition(modality, CAT, CITY, year, backend, release)
    release.root.mkdir(parents=True, exist_ok=True)
    tiles_frame([CITY]).to_parquet(release.tiles_file)
    build_duckdb(release, CAT, release_metadata(release, source_set="local-test", synthetic=True))
    return release


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return build_small_release(tmp_path_factory.mktemp("data"))


def _tile_pixels(code: str) -> tuple[int, int, int, int]:
    """(row_off, col_off, h, w) of TILE in the modality's pixel grid."""
    resolution = CAT.get(code).chip.resolution_m  # type: ignore[union-attr]
    return pixel_grid(CITY, resolution).window(city_grid(CITY, "2km").tile(3, 4))


def test_render_tile_reads_the_chip_window(release: Release) -> None:
    _, c0, h, w = _tile_pixels("OPT")
    opt = render_tile(release, CAT, "OPT", TILE, 2020)
    assert opt.shape == (h, w, 4) and (opt[..., 3] == 255).all()
    grid = pixel_grid(CITY, 25)
    expected_red = 1 + (np.arange(c0, c0 + w) * 254 // grid.width)
    np.testing.assert_array_equal(opt[0, :, 0], expected_red)
    lc = render_tile(release, CAT, "LC", TILE, 2020)
    colours = {tuple(c) for c in lc[..., :3].reshape(-1, 3).tolist()}
    assert colours <= {(195, 20, 0), (0, 70, 200)}  # impervious surface, water body
    dem = render_tile(release, CAT, "DEM", TILE, 2021)  # static: served for every year
    assert dem.shape == (h, w, 4) and (dem[..., 3] == 255).all()


def test_render_tile_errors_say_what_to_change(release: Release) -> None:
    with pytest.raises(ChipsNotFoundError, match="source_year_missing"):
        render_tile(release, CAT, "OPT", TILE, 2021)
    with pytest.raises(ChipsNotFoundError, match="materialise modalities/opt"):
        render_tile(release, CAT, "OPT", TILE, 2022)
    with pytest.raises(ChipsNotFoundError, match="numeric"):
        render_tile(release, CAT, "POP", TILE, 2020)
    with pytest.raises(UnknownModalityError):
        render_tile(release, CAT, "XYZ", TILE, 2020)
    with pytest.raises(UnknownYearError):
        render_tile(release, CAT, "OPT", TILE, 1999)
    with pytest.raises(UnknownTileError):
        render_tile(release, CAT, "OPT", "Amsterdam_5KM_r9_c9", 2020)


def test_mosaic_is_downsampled_with_grid_lines(release: Release) -> None:
    grid = pixel_grid(CITY, 25)  # 800 × 1200 → stride 3 at 512
    mosaic = render_mosaic(release, CAT, "LC", CITY, 2020, max_size=512)
    stride = math.ceil(max(grid.shape) / 512)
    assert mosaic.shape == (math.ceil(grid.height / stride), math.ceil(grid.width / stride), 4)
    assert max(mosaic.shape[:2]) <= 512
    np.testing.assert_array_equal(mosaic, render_mosaic(release, CAT, "LC", CITY, 2020, 512))
    colours = {tuple(c) for c in mosaic[..., :3].reshape(-1, 3).tolist()}
    legend = {(195, 20, 0), (0, 70, 200)}
    assert legend <= colours
    # Faint 2 km grid lines: the class colour blended with the line colour, nothing else.
    alpha = GRID_LINE_RGBA[3] / 255

    def blend(rgb: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(
            math.floor(c * (1 - alpha) + g * alpha + 0.5)
            for c, g in zip(rgb, GRID_LINE_RGBA[:3], strict=True)
        )

    assert colours - legend == {blend(c) for c in legend}


def test_full_resolution_mosaic_matches_the_tile_rendering(release: Release) -> None:
    """At stride 1 the mosaic is the tile renderings side by side (plus grid lines)."""
    mosaic = render_mosaic(release, CAT, "OPT", CITY, 2020, max_size=1200)
    r0, c0, h, w = _tile_pixels("OPT")
    tile = render_tile(release, CAT, "OPT", TILE, 2020)
    inner = (slice(1, h - 1), slice(1, w - 1))  # tile edges carry the grid lines
    np.testing.assert_array_equal(mosaic[r0 : r0 + h, c0 : c0 + w][inner], tile[inner])
    assert not np.array_equal(mosaic[r0, c0 : c0 + w], tile[0])


def test_mosaic_of_a_year_without_chips_fails_clearly(release: Release) -> None:
    with pytest.raises(ChipsNotFoundError, match="source does not cover"):
        render_mosaic(release, CAT, "LC", CITY, 2021)


# --------------------------------------------------------------------------------------------
# CLI and Dagster


def test_cli_render_writes_the_tile_and_legend(
    release: Release, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from pipelines.cli import main

    base = ["--data", str(release.data_root), "--release", release.version, "render"]
    assert main([*base, "--tile", TILE, "--modality", "opt", "--year", "2020"]) == 0
    out = Path(capsys.readouterr().out.strip())
    assert out == release.root / "renders" / f"{TILE}_OPT_2020.png"
    np.testing.assert_array_equal(
        np.asarray(Image.open(out)), render_tile(release, CAT, "OPT", TILE, 2020)
    )
    target = tmp_path / "lc_legend.png"
    assert main([*base, "--legend", "LC", "--out", str(target)]) == 0
    assert Image.open(target).size == LEGEND_SIZE
    assert main([*base, "--tile", TILE, "--modality", "OPT", "--year", "2021"]) == 2
    assert "[CC301]" in capsys.readouterr().err
    assert main([*base, "--tile", TILE]) == 2


def test_each_source_periods_chips_get_one_quicklook(tmp_path: Path) -> None:
    """The derived assets render a quick-look per chip store: one for the static DEM, one for
    each year of OPT; the UI gets a thumbnail when one partition is materialised."""
    from pipelines.definitions import build_definitions
    from pipelines.resources import ComputeResource, CubeResource

    cube = CubeResource(data_root=str(tmp_path / "data"), release_version="t")
    resources = {"cube": cube, "compute": ComputeResource(workers=1)}
    definitions = build_definitions(CAT)
    instance = dg.DagsterInstance.ephemeral()
    for key, partition in (("derived/dem", CITY), ("derived/opt", f"{CITY}|2020")):
        result = materialize_keys(
            definitions, [key], partition, resources=resources, instance=instance
        )
        meta = result.get_asset_materialization_events()[0].materialization.metadata  # type: ignore[attr-defined]
        assert meta["preview"].value.startswith("![quick-look](data:image/png;base64,")
    release = cube.release()
    for code, label in (("DEM", "static"), ("OPT", "2020")):
        path = release.quicklook_file(code, CITY, label)
        assert path.exists() and max(Image.open(path).size) <= 1024
    assert sorted(p.name for p in (release.draft_dir / "quicklooks" / "DEM" / CITY).iterdir()) == [
        "static.png"
    ]


@pytest.mark.parametrize(
    ("code", "max_size"),
    [
        ("OPT", 1024),
        ("OPT", 333),
        ("NDVI", 517),
        ("LC", 700),
        ("RD", 1024),
        ("RD", 290),
        ("POI", 450),
        ("HF", 1024),
    ],
)
def test_a_quicklook_gathered_while_writing_equals_the_stores_rendering(
    sample_city_year: tuple[Release, SampleBackend], code: str, max_size: int
) -> None:
    """Drawn from the blocks as the writer stores them, the quick-look is the one read back
    from the finished store, pixel for pixel: every-n-th pixels, and for the binary road
    rendering the maxima of cells that straddle 10 km blocks (strides 3 to 13 here)."""
    release, backend = sample_city_year
    modality = CAT.get(code)
    gathered = QuickLook(CAT, code, "Boston", max_size)
    assert gathered.stride > 1 or max_size == 1024
    period = period_of(modality)
    label = "static" if period is None else str(period)
    release.derived_file(code, "Boston", label).unlink(missing_ok=True)  # derive anew
    summary = derive(modality, CAT, "Boston", period, backend, release, on_written=[gathered.add])
    assert summary.chips and not summary.reused
    store = release.chip_store(code, "Boston", summary.label)
    np.testing.assert_array_equal(
        gathered.render(), render_store(store, CAT, code, "Boston", max_size)
    )


def test_an_incomplete_quicklook_is_refused() -> None:
    gathered = QuickLook(CAT, "OPT", CITY, 256)
    grid = pixel_grid(CITY, 25)
    gathered.add(0, 0, np.zeros((3, 400, 400), np.uint8), np.ones((400, 400), bool))
    assert gathered.stride == math.ceil(max(grid.height, grid.width) / 256)
    with pytest.raises(ValueError, match="render the finished store"):
        gathered.render()


@pytest.fixture(scope="module")
def sample_city_year(tmp_path_factory: pytest.TempPathFactory) -> tuple[Release, SampleBackend]:
    """The sample sources of Boston (one of the smaller cities), fetched into a release."""
    return Release(tmp_path_factory.mktemp("sample"), "q"), SampleBackend()


def period_of(modality: ModalitySpec) -> int | None:
    """The source period of 2020 for the modality (static products have none)."""
    return None if modality.temporal == Temporal.STATIC else 2020
