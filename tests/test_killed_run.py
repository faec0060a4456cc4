"""A run killed mid-write leaves the last good partition intact, and a re-run is clean."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.chips import open_chips
from citycube.cube.release import Release
from citycube.grid.tiles import pixel_grid
from citycube.processing.compute import process_partition
from tests.conftest import LocalFilesBackend, write_tif

CITY, YEAR = "Amsterdam", 2020


def _dem(path: Path, value: float) -> Path:
    grid = pixel_grid(CITY, 25)
    data = np.full((grid.height, grid.width), value, np.float32)
    return write_tif(path, data, crs="EPSG:32631", transform=grid.transform, nodata=-32767)


def _run_and_die_mid_write(data_root: Path, source: Path) -> int:
    """Run a partition in a subprocess that hard-exits after writing its first chip rows."""
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from citycube.catalogue.modalities import load_catalogue
        from citycube.cube.chips_zarr import ChipStoreWriter
        from citycube.cube.release import Release
        from citycube.processing.compute import process_partition
        from tests.conftest import LocalFilesBackend

        original = ChipStoreWriter.write_rows
        def write_then_die(self, *args, **kwargs):
            original(self, *args, **kwargs)
            os._exit(9)  # like SIGKILL: no cleanup, no exception handlers
        ChipStoreWriter.write_rows = write_then_die

        cat = load_catalogue()
        dem = cat.get("DEM").model_copy(update={{"product": "test_dem"}})
        items = {{("test_dem", "{CITY}", None): {{"data": Path({str(source)!r})}}}}
        release = Release(Path({str(data_root)!r}), "t")
        process_partition(dem, cat, "{CITY}", {YEAR}, LocalFilesBackend(items), release)
        """
    )
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-c", script], cwd=root, check=False).returncode


def test_killed_write_keeps_last_good_version_and_rerun_is_clean(tmp_path: Path) -> None:
    cat = load_catalogue()
    dem = cat.get("DEM").model_copy(update={"product": "test_dem"})
    release = Release(tmp_path / "data", "t")
    good = _dem(tmp_path / "good.tif", 5.0)
    first = LocalFilesBackend({("test_dem", CITY, None): {"data": good}})
    process_partition(dem, cat, CITY, YEAR, first, release)
    store = release.chip_store("DEM", CITY, "static")
    observations = release.observations_file(CITY, YEAR, "DEM")
    before = observations.read_bytes()

    newer = _dem(tmp_path / "newer.tif", 7.0)
    assert _run_and_die_mid_write(release.data_root, newer) == 9

    # The last good version is intact and readable.
    assert observations.read_bytes() == before
    assert float(open_chips(store)["data"].isel(band=0, y=0, x=0)) == 5.0
    assert list(store.parent.glob(".static.zarr.tmp-*"))  # the killed run's leftovers

    # A re-run replaces it cleanly and removes the leftovers.
    rerun = LocalFilesBackend({("test_dem", CITY, None): {"data": newer}})
    process_partition(dem, cat, CITY, YEAR, rerun, release)
    assert float(open_chips(store)["data"].isel(band=0, y=0, x=0)) == 7.0
    assert not list(store.parent.glob(".static.zarr.*"))
    values = {r["value"] for r in pq.read_table(observations).to_pylist()}
    assert values == {7.0}


def test_cleanup_spares_live_writers_and_removes_dead_ones(tmp_path: Path) -> None:
    """Concurrent runs may share a store (static chips): only dead writers' leftovers go."""
    import os

    from citycube.io.scratch import owned_name, remove_dead_leftovers

    target = tmp_path / "static.zarr"
    live = owned_name(target)
    live.mkdir()
    dead = tmp_path / f".static.zarr.tmp-{2**22 + 12345}-{'0' * 32}"
    dead.mkdir()
    assert str(os.getpid()) in live.name
    assert remove_dead_leftovers(target) == 1
    assert live.exists() and not dead.exists()
