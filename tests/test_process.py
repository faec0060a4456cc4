"""Processing rules through the public partition API with small hand-made rasters.

Covers validity thresholds at and around their limits, no zero-fill, epoch and static reuse,
categorical ids never averaged, and bad input that fails clearly without losing anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from affine import Affine

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.errors import DerivedResultsMissingError, SourceReadError
from citycube.grid.tiles import city_grid, pixel_grid
from citycube.processing.compute import derive, process_partition, read_derived, write_observations
from tests.conftest import LocalFilesBackend

CITY = "Amsterdam"  # 2 km grid 10×14, 5 km grid 3×4, EPSG:32631
CAT = load_catalogue()


def _rows(release: Release, year: int, modality: str) -> dict[tuple[str, str], dict]:
    table = pq.read_table(release.observations_file(CITY, year, modality)).to_pylist()
    return {(r["tile_id"], r["field"]): r for r in table}


def _opt_source(valid_pixels_in_first_tile: int) -> tuple[np.ndarray, np.ndarray, Affine]:
    """A 25 m RGB + QA raster exactly on the chip grid; tile r0c0 gets N valid pixels."""
    grid = pixel_grid(CITY, 25)
    rgb = np.full((3, grid.height, grid.width), 120, np.uint8)
    qa = np.zeros((1, grid.height, grid.width), np.uint16)
    window = grid.window(city_grid(CITY, "2km").tile(0, 0))
    r0, c0, h, w = window
    block = np.zeros(h * w, np.uint16)
    block[valid_pixels_in_first_tile:] = 1 << 3  # cloud bit
    qa[0, r0 : r0 + h, c0 : c0 + w] = block.reshape(h, w)
    return rgb, qa, grid.transform


@pytest.mark.parametrize(("valid", "available"), [(6272, True), (6271, False), (6400, True)])
def test_image_needs_98_percent_valid_pixels(
    tmp_path: Path, tif_writer: Callable[..., Path], valid: int, available: bool
) -> None:
    rgb, qa, transform = _opt_source(valid)
    files = {
        "data": tif_writer("rgb.tif", rgb, crs="EPSG:32631", transform=transform, nodata=0),
        "qa": tif_writer("qa.tif", qa, crs="EPSG:32631", transform=transform),
    }
    backend = LocalFilesBackend({("landsat_c2l2", CITY, 2020): files})
    release = Release(tmp_path / "data", "t")
    process_partition(CAT.get("OPT"), CAT, CITY, 2020, backend, release)
    row = _rows(release, 2020, "OPT")[("Amsterdam_2KM_r0_c0", "red")]
    assert row["valid_fraction"] == pytest.approx(valid / 6400)
    assert row["available"] is available
    if available:
        assert row["value"] == pytest.approx(120.0)
    else:
        assert row["value"] is None and row["reason"] == "insufficient_valid_pixels"


def _pop_source(tif_writer: Callable[..., Path], valid_cols_in_tile: int) -> Path:
    """A 100 m density raster in Mollweide? No: in the tile CRS, so fractions are exact.

    Tile r0c0 (2 km = 20 cells of 100 m) has ``valid_cols_in_tile`` valid columns; other tiles
    are fully valid. Value 0 (valid zero population) in the valid part of r0c0.
    """
    grid = city_grid(CITY, "2km")
    xmin, ymin, xmax, ymax = grid.bounds
    width, height = int((xmax - xmin) / 100), int((ymax - ymin) / 100)
    data = np.full((height, width), 500.0, np.float32)
    data[0:20, 0:20] = 0.0
    data[0:20, valid_cols_in_tile:20] = -200.0
    return tif_writer(
        f"pop{valid_cols_in_tile}.tif",
        data,
        crs="EPSG:32631",
        transform=Affine(100, 0, xmin, 0, -100, ymax),
        nodata=-200.0,
    )


@pytest.mark.parametrize(
    ("valid_cols", "available"), [(10, True), (9, False), (11, True), (0, False)]
)
def test_numeric_threshold_and_zero_is_valid(
    tmp_path: Path, tif_writer: Callable[..., Path], valid_cols: int, available: bool
) -> None:
    pop = CAT.get("POP").model_copy(update={"product": "test_pop"})
    path = _pop_source(tif_writer, valid_cols)
    backend = LocalFilesBackend({("test_pop", CITY, y): {"data": path} for y in (2015, 2020)})
    release = Release(tmp_path / "data", "t")
    process_partition(pop, CAT, CITY, 2020, backend, release)
    row = _rows(release, 2020, "POP")[("Amsterdam_2KM_r0_c0", "population_density")]
    assert row["valid_fraction"] == pytest.approx(valid_cols / 20)
    assert row["available"] is available
    if available:
        assert row["value"] == 0.0  # a meaningful zero stays a zero
    else:
        assert row["value"] is None  # never zero-filled
        assert row["reason"] == "insufficient_valid_support"


def test_epoch_reuse_and_missing_years_are_labelled(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    pop = CAT.get("POP").model_copy(update={"product": "test_pop"})
    path = _pop_source(tif_writer, 20)
    backend = LocalFilesBackend({("test_pop", CITY, y): {"data": path} for y in (2015, 2020)})
    release = Release(tmp_path / "data", "t")
    s2023 = process_partition(pop, CAT, CITY, 2023, backend, release)
    assert (s2023.basis, s2023.source_year) == ("epoch", 2020)
    rows = _rows(release, 2023, "POP")
    assert all(r["source_year"] == 2020 and r["temporal_basis"] == "epoch" for r in rows.values())
    s2012 = process_partition(pop, CAT, CITY, 2012, backend, release)  # epoch 2010 not published
    assert s2012.available_tiles == 0
    rows = _rows(release, 2012, "POP")
    assert all(r["value"] is None and r["reason"] == "source_year_missing" for r in rows.values())


def test_sum_rule_divides_by_nominal_area_without_scaling_up(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    """CO2-like: 1 t per 100 m cell; a tile with 60 % valid support keeps 60 % of the total."""
    co2 = CAT.get("CO2").model_copy(update={"product": "test_co2"})
    grid = city_grid(CITY, "2km")
    xmin, _, _, ymax = grid.bounds
    data = np.ones((200, 280), np.float32)
    data[0:20, 12:20] = -9999.0  # tile r0c0: 12 of 20 columns valid
    path = tif_writer(
        "co2.tif",
        data,
        crs="EPSG:32631",
        transform=Affine(100, 0, xmin, 0, -100, ymax),
        nodata=-9999.0,
    )
    backend = LocalFilesBackend({("test_co2", CITY, 2020): {"data": path}})
    release = Release(tmp_path / "data", "t")
    process_partition(co2, CAT, CITY, 2020, backend, release)
    rows = _rows(release, 2020, "CO2")
    full = rows[("Amsterdam_2KM_r0_c1", "carbon_tc_km2")]
    part = rows[("Amsterdam_2KM_r0_c0", "carbon_tc_km2")]
    assert full["value"] == pytest.approx(400 / 4)  # 400 cells × 1 t over 4 km²
    assert part["value"] == pytest.approx(240 / 4) and part["valid_fraction"] == pytest.approx(0.6)


def test_tiles_outside_source_are_unavailable_not_zero(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    co2 = CAT.get("CO2").model_copy(update={"product": "test_co2"})
    grid = city_grid(CITY, "2km")
    xmin, _, _, ymax = grid.bounds
    data = np.ones((20, 280), np.float32)  # covers only the first tile row
    path = tif_writer(
        "co2.tif", data, crs="EPSG:32631", transform=Affine(100, 0, xmin, 0, -100, ymax)
    )
    backend = LocalFilesBackend({("test_co2", CITY, 2020): {"data": path}})
    release = Release(tmp_path / "data", "t")
    process_partition(co2, CAT, CITY, 2020, backend, release)
    row = _rows(release, 2020, "CO2")[("Amsterdam_2KM_r5_c5", "carbon_tc_km2")]
    assert row["value"] is None and row["reason"] == "outside_source_coverage"


def test_categorical_mode_never_averages_ids(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    """Alternating 10 and 210 with a strip of 190: the id is one of them, never an average."""
    lc = CAT.get("LC").model_copy(update={"product": "test_lc"})
    grid = pixel_grid(CITY, 25)
    data = np.full((grid.height, grid.width), 10, np.uint8)
    data[:, 1::2] = 210
    data[:, ::7] = 190
    path = tif_writer("lc.tif", data, crs="EPSG:32631", transform=grid.transform, nodata=255)
    backend = LocalFilesBackend({("test_lc", CITY, 2020): {"data": path}})
    release = Release(tmp_path / "data", "t")
    process_partition(lc, CAT, CITY, 2020, backend, release)
    values = {r["value"] for r in _rows(release, 2020, "LC").values()}
    assert values <= {10.0, 210.0, 190.0}


def test_static_dem_reused_and_labelled(tmp_path: Path, tif_writer: Callable[..., Path]) -> None:
    dem = CAT.get("DEM").model_copy(update={"product": "test_dem"})
    grid = pixel_grid(CITY, 25)
    data = np.full((grid.height, grid.width), -3.0, np.float32)  # below sea level stays valid
    path = tif_writer("dem.tif", data, crs="EPSG:32631", transform=grid.transform, nodata=-32767)
    backend = LocalFilesBackend({("test_dem", CITY, None): {"data": path}})
    release = Release(tmp_path / "data", "t")
    for year in (2001, 2019):
        s = process_partition(dem, CAT, CITY, year, backend, release)
        assert (s.basis, s.source_year, s.available_tiles) == ("static", None, 152)
    rows = _rows(release, 2019, "DEM")
    assert {r["value"] for r in rows.values()} == {-3.0}
    assert release.chip_store("DEM", CITY, "static").exists()


def test_corrupt_file_fails_clearly_and_keeps_previous_partition(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    co2 = CAT.get("CO2").model_copy(update={"product": "test_co2"})
    grid = city_grid(CITY, "2km")
    xmin, _, _, ymax = grid.bounds
    good = tif_writer(
        "co2.tif",
        np.ones((200, 280), np.float32),
        crs="EPSG:32631",
        transform=Affine(100, 0, xmin, 0, -100, ymax),
    )
    release = Release(tmp_path / "data", "t")
    process_partition(
        co2, CAT, CITY, 2020, LocalFilesBackend({("test_co2", CITY, 2020): {"data": good}}), release
    )
    before = release.observations_file(CITY, 2020, "CO2").read_bytes()
    payload = good.read_bytes()
    for name, cut in (("header", 300), ("body", len(payload) * 2 // 3)):
        truncated = tmp_path / f"truncated-{name}.tif"
        truncated.write_bytes(payload[:cut])
        backend = LocalFilesBackend({("test_co2", CITY, 2020): {"data": truncated}})
        with pytest.raises(SourceReadError, match="corrupt or truncated"):
            process_partition(co2, CAT, CITY, 2020, backend, release)
    assert release.observations_file(CITY, 2020, "CO2").read_bytes() == before
    assert not list(release.root.rglob(".*.tmp*"))


def test_wrong_crs_is_rejected(tmp_path: Path, tif_writer: Callable[..., Path]) -> None:
    """ODIAC is published in EPSG:4326; a UTM file claiming to be ODIAC is refused."""
    grid = city_grid(CITY, "2km")
    xmin, _, _, ymax = grid.bounds
    path = tif_writer(
        "odiac.tif",
        np.ones((200, 280), np.float32),
        crs="EPSG:32631",
        transform=Affine(100, 0, xmin, 0, -100, ymax),
    )
    backend = LocalFilesBackend({("odiac", CITY, 2020): {"data": path}})
    with pytest.raises(SourceReadError, match="published in EPSG:4326"):
        process_partition(CAT.get("CO2"), CAT, CITY, 2020, backend, Release(tmp_path / "d", "t"))


def test_a_flip_in_the_footer_of_derived_results_is_caught_and_the_file_made_again(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    """Page checksums do not cover the footer (schema, statistics, key-value metadata): a byte
    flipped there still reads, so the file's recorded digest decides."""
    pop = CAT.get("POP").model_copy(update={"product": "test_pop"})
    path = _pop_source(tif_writer, 20)
    backend = LocalFilesBackend({("test_pop", CITY, y): {"data": path} for y in (2015, 2020)})
    release = Release(tmp_path / "data", "t")
    process_partition(pop, CAT, CITY, 2020, backend, release)
    derived = release.derived_file("POP", CITY, "2020")
    original = derived.read_bytes()
    footer = int.from_bytes(original[-8:-4], "little")
    data = bytearray(original)
    data[len(data) - 8 - footer // 2] ^= 0x01  # inside the footer, past every page
    derived.write_bytes(bytes(data))
    pq.read_table(derived, page_checksum_verification=True)  # still reads: pages are intact
    again = derive(pop, CAT, CITY, 2020, backend, release)
    assert not again.reused
    assert derived.read_bytes() == original
    assert derive(pop, CAT, CITY, 2020, backend, release).reused  # intact again: kept


def test_damaged_derived_results_are_computed_again_not_copied(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    pop = CAT.get("POP").model_copy(update={"product": "test_pop"})
    path = _pop_source(tif_writer, 20)
    backend = LocalFilesBackend({("test_pop", CITY, y): {"data": path} for y in (2015, 2020)})
    release = Release(tmp_path / "data", "t")
    process_partition(pop, CAT, CITY, 2020, backend, release)
    first = _rows(release, 2020, "POP")
    assert derive(pop, CAT, CITY, 2020, backend, release).reused

    derived = release.derived_file("POP", CITY, "2020")
    data = bytearray(derived.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")  # the pages come before the footer
    data[(4 + len(data) - 8 - footer) // 2] ^= 0x01  # one bit inside the column pages
    derived.write_bytes(bytes(data))
    with pytest.raises(DerivedResultsMissingError, match="are damaged"):
        read_derived(pop, CITY, 2020, release)
    again = derive(pop, CAT, CITY, 2020, backend, release)
    assert not again.reused  # checksums caught it: computed again
    write_observations(pop, CITY, 2020, release)
    assert _rows(release, 2020, "POP") == first
