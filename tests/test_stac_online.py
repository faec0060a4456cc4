"""Against the real Planetary Computer: skipped unless CITYCUBE_ONLINE=1 (needs the internet)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import rasterio

from sources.stac import stac_adapters

pytestmark = [
    pytest.mark.online,
    pytest.mark.skipif(
        not os.environ.get("CITYCUBE_ONLINE"), reason="needs the internet: set CITYCUBE_ONLINE=1"
    ),
]


def test_boston_2020_surface_temperature_and_dem_from_the_planetary_computer(
    tmp_path: Path,
) -> None:
    """Two scenes are enough to see real scenes searched, signed, windowed and composited."""
    adapters = {a.product_id: a for a in stac_adapters({"max_scenes": 2})}
    heat = adapters["landsat_st"].fetch("Boston", 2020, tmp_path)
    with rasterio.open(heat.href("data")) as ds:
        assert ds.crs.to_epsg() == 32619 and ds.count == 2
        values = ds.read(1, masked=True)
    assert values.count() > 0 and 230 < float(values.mean()) < 330  # Kelvin
    dem = adapters["cop_dem_glo30"].fetch("Boston", None, tmp_path)
    with rasterio.open(dem.href("data")) as ds:
        assert ds.crs.to_epsg() == 4326
        assert ds.read(1, masked=True).count() > 0


def test_boston_2020_daymet_from_the_planetary_computer_zarr_store(tmp_path: Path) -> None:
    """The real store: its variables, units, grid mapping and 2020 time step as the spec says
    (the whole continent-sized chunks of three variables are read: a few hundred MB)."""
    adapters = {a.product_id: a for a in stac_adapters({"timeout_s": 300})}
    item = adapters["daymet"].fetch("Boston", 2020, tmp_path)
    assert set(item.files) == {"tmin", "tmax", "tmean", "prcp"}
    with rasterio.open(item.href("prcp")) as ds:
        values = ds.read(1, masked=True)
    assert values.count() > 0 and 500 < float(values.mean()) < 2500  # mm per year
