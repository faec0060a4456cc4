"""Small real releases for the release tools (listing, diff, dataset card): Amsterdam 2020,
POP and NTL from hand-made GeoTIFFs, built through the core, published and with a manifest.

POP's source leaves tile r0c0 of the 2 km grid with 45 % valid support, so POP's
``min_valid_fraction`` decides that tile alone: 0.5 (the catalogue's) makes it unavailable,
0.4 makes it available. NTL does not depend on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import zarr
from affine import Affine
from zarr.dtype import VariableLengthUTF8

from citycube.catalogue.cities import SCALES
from citycube.catalogue.modalities import Catalogue, ModalitySpec, load_catalogue
from citycube.cube.manifest import write_manifest
from citycube.cube.release import (
    CHIP_INDEX_SCHEMA,
    Release,
    build_duckdb,
    publish_database,
    release_metadata,
    tiles_frame,
    write_parquet_atomic,
)
from citycube.grid.tiles import city_grid, pixel_grid
from citycube.processing.compute import process_partition
from tests.conftest import LocalFilesBackend, write_tif

CITY, YEAR = "Amsterdam", 2020
CAT = load_catalogue()
FLIPPED_TILE = "Amsterdam_2KM_r0_c0"
"""The one tile whose POP availability the threshold decides."""


DEM_RAISED_ROWS = 40
"""Rows of the DEM source (25 m, the chip grid) that ``dem_raise`` lifts: the first 1 km."""


DEM_HOLE_PX = 20
"""Side of the nodata square ``dem_hole`` cuts into the DEM's first tile (of 80 × 80 px)."""


def _sources(
    folder: Path, ntl_scale: float, dem_raise: float = 0.0, dem_hole: bool = False
) -> dict[tuple[str, str, int | None], dict[str, Path]]:
    xmin, _, _, ymax = city_grid(CITY, "2km").bounds
    transform = Affine(100, 0, xmin, 0, -100, ymax)
    pop = np.full((200, 280), 500.0, np.float32)
    pop[0:20, 9:20] = -200.0  # tile r0c0: 9 of its 20 columns valid (45 %)
    ntl = np.tile(np.linspace(0.0, 60.0 * ntl_scale, 280, dtype=np.float32), (200, 1))
    crs = "EPSG:32631"
    grid = pixel_grid(CITY, 25)
    dem = np.tile(np.linspace(-2.0, 40.0, grid.width, dtype=np.float32), (grid.height, 1))
    dem[:DEM_RAISED_ROWS] += dem_raise
    if dem_hole:
        dem[:DEM_HOLE_PX, :DEM_HOLE_PX] = -32767  # nodata in the corner of tile r0c0
    return {
        ("test_dem", CITY, None): {
            "data": write_tif(
                folder / "dem.tif", dem, crs=crs, transform=grid.transform, nodata=-32767
            )
        },
        ("test_pop", CITY, YEAR): {
            "data": write_tif(folder / "pop.tif", pop, crs=crs, transform=transform, nodata=-200.0)
        },
        ("test_ntl", CITY, YEAR): {
            "data": write_tif(folder / "ntl.tif", ntl, crs=crs, transform=transform, nodata=-9999)
        },
    }


def pop_threshold(catalogue: Catalogue, threshold: float) -> Catalogue:
    """A copy of the catalogue with POP's ``min_valid_fraction`` changed."""
    pop = catalogue.get("POP")
    validity = pop.validity.model_copy(update={"min_valid_fraction": threshold})
    changed = pop.model_copy(update={"validity": validity})
    modalities = tuple(changed if m.code == "POP" else m for m in catalogue.modalities)
    return catalogue.model_copy(update={"modalities": modalities})


def _local(modality: ModalitySpec) -> ModalitySpec:
    """The modality reading the hand-made file (city CRS) instead of its real product."""
    return modality.model_copy(update={"product": f"test_{modality.code.lower()}"})


def build_release(
    data_root: Path,
    version: str,
    catalogue: Catalogue = CAT,
    modalities: tuple[str, ...] = (),
    ntl_scale: float = 1.0,
    *,
    dem_raise: float = 0.0,
    dem_hole: bool = False,
    chip_format: str = "zarr",
) -> Release:
    """Build, publish and manifest a release of Amsterdam 2020 (POP and NTL by default).

    ``ntl_scale`` multiplies the night-time lights source, to make a release whose NTL values
    all change; ``dem_raise`` lifts the first ``DEM_RAISED_ROWS`` rows of the DEM source (when
    ``modalities`` includes DEM, whose chips go in ``chip_format``).
    """
    backend = LocalFilesBackend(
        _sources(data_root / "src" / version, ntl_scale, dem_raise, dem_hole)
    )
    release = Release(data_root, version, chip_format)
    for code in modalities or ("POP", "NTL"):
        process_partition(_local(catalogue.get(code)), catalogue, CITY, YEAR, backend, release)
    release.root.mkdir(parents=True, exist_ok=True)
    tiles_frame([CITY]).to_parquet(release.tiles_file)
    sources = {
        product: {
            "source_id": f"test:{product}",
            "version": "t1",
            "synthetic": True,
            "licence": "test fixture",
            "attribution": "tests",
        }
        for product in ("test_ntl", "test_pop", *(("test_dem",) if "DEM" in modalities else ()))
    }
    meta = release_metadata(release, source_set="local-test", synthetic=True, sources=sources)
    build_duckdb(release, catalogue, meta, path=release.staged_duckdb_file)
    publish_database(release, meta)
    write_manifest(release, meta, catalogue)
    return release


def rebuild_partitions(
    release: Release,
    modalities: tuple[str, ...],
    catalogue: Catalogue = CAT,
    ntl_scale: float = 1.0,
    *,
    dem_raise: float = 0.0,
) -> None:
    """Process ``modalities`` of Amsterdam 2020 again from new sources (``ntl_scale``,
    ``dem_raise`` as in :func:`build_release`), as a build does before its database is staged:
    derived results, chips, quick-looks and partitions; nothing is published. With the
    defaults, the files :func:`build_release` wrote are read as they are (untouched: results
    derived from them are kept)."""
    if ntl_scale == 1.0 and dem_raise == 0.0:
        folder = release.data_root / "src" / release.version
        items = {
            ("test_dem", CITY, None): {"data": folder / "dem.tif"},
            ("test_pop", CITY, YEAR): {"data": folder / "pop.tif"},
            ("test_ntl", CITY, YEAR): {"data": folder / "ntl.tif"},
        }
    else:
        folder = release.data_root / "src" / f"{release.version}-{ntl_scale}-{dem_raise}"
        items = _sources(folder, ntl_scale, dem_raise)
    backend = LocalFilesBackend(items)
    for code in modalities:
        process_partition(_local(catalogue.get(code)), catalogue, CITY, YEAR, backend, release)


def write_mixed_lc_chips(
    release: Release, city: str, source_year: int, years: tuple[int, ...]
) -> None:
    """One LC chip store of ``source_year`` (west half class 10, east half a seeded mix of 10,
    51 and 190) and the chip index rows that serve it for each of ``years``."""
    grid = pixel_grid(city, 25)
    store = release.chip_store("LC", city, str(source_year))
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    rng = np.random.default_rng(0)
    data = rng.choice(np.array([10, 51, 190], np.uint8), size=(1, grid.height, grid.width))
    data[:, :, : grid.width // 2] = 10
    group.create_array("data", data=data, chunks=(1, 400, 400))
    group.create_array("valid", data=np.ones((grid.height, grid.width), np.uint8))
    band = group.create_array("band", shape=(1,), dtype=VariableLengthUTF8())  # type: ignore[arg-type]
    band[:] = np.array(["class_id"], dtype=object)
    _index_chips(release, city, "LC", store, source_year, years)


def write_rgb_chips(release: Release, city: str, source_year: int, years: tuple[int, ...]) -> None:
    """One OPT chip store of ``source_year`` (seeded uint8 red, green and blue, all valid) and
    the chip index rows that serve it for each of ``years``."""
    grid = pixel_grid(city, 25)
    store = release.chip_store("OPT", city, str(source_year))
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    data = np.random.default_rng(1).integers(0, 256, (3, grid.height, grid.width), np.uint8)
    group.create_array("data", data=data, chunks=(3, 400, 400))
    group.create_array("valid", data=np.ones((grid.height, grid.width), np.uint8))
    band = group.create_array("band", shape=(3,), dtype=VariableLengthUTF8())  # type: ignore[arg-type]
    band[:] = np.array(["red", "green", "blue"], dtype=object)
    _index_chips(release, city, "OPT", store, source_year, years)


def _index_chips(
    release: Release,
    city: str,
    modality: str,
    store: Path,
    source_year: int,
    years: tuple[int, ...],
) -> None:
    """Chip index rows of every tile of ``city`` (both scales) on one 25 m store, per year."""
    grid = pixel_grid(city, 25)
    for year in years:
        rows = []
        for scale in SCALES:
            for tile in city_grid(city, scale).tiles():
                r, c, h, w = grid.window(tile)
                rows.append(
                    {
                        "tile_id": tile.tile_id,
                        "city": city,
                        "scale": scale,
                        "year": year,
                        "modality": modality,
                        "store": str(store.relative_to(release.root)),
                        "row_off": r,
                        "col_off": c,
                        "height": h,
                        "width": w,
                        "resolution_m": 25.0,
                        "valid_fraction": 1.0,
                        "available": True,
                        "temporal_basis": "annual",
                        "source_year": source_year,
                    }
                )
        write_parquet_atomic(
            pa.Table.from_pylist(rows, schema=CHIP_INDEX_SCHEMA),
            release.chip_index_file(city, year, modality),
        )
