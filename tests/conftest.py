"""Shared fixtures: small real GeoTIFFs served by a local-files backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine

from citycube.errors import SourceUnavailableError
from sources.base import SourceBackend, SourceItem


def write_tif(
    path: Path,
    data: np.ndarray,
    *,
    crs: str,
    transform: Affine,
    nodata: float | None = None,
) -> Path:
    """Write a (bands, h, w) array as a GeoTIFF."""
    if data.ndim == 2:
        data = data[None]
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=data.shape[2],
        height=data.shape[1],
        count=data.shape[0],
        dtype=data.dtype,
        crs=crs,
        transform=transform,
        nodata=nodata,
    ) as ds:
        ds.write(data)
    return path


class LocalFilesBackend(SourceBackend):
    """Serves hand-made files: {(product, city, year): {role: path}}; years listed per product."""

    name = "local-test"

    def __init__(self, items: dict[tuple[str, str, int | None], dict[str, Path]]) -> None:
        self.items = items

    def products(self) -> list[str]:
        return sorted({p for p, _, _ in self.items})

    def source_years(self, product: str, city: str) -> list[int] | None:
        years = [y for p, c, y in self.items if p == product and c == city]
        return None if years == [None] else sorted(y for y in years if y is not None)

    def fetch(self, product: str, city: str, source_year: int | None, dest: Path) -> SourceItem:
        key = (product, city, source_year)
        if key not in self.items:
            raise SourceUnavailableError(f"no test item {key}")
        return SourceItem(
            product=product,
            city=city,
            source_year=source_year,
            files=self.items[key],
            source_id=f"test:{product}",
            version="t1",
            synthetic=True,
        )


@pytest.fixture
def tif_writer(tmp_path: Path) -> Callable[..., Path]:
    """Write GeoTIFFs under tmp_path by name."""

    def _write(name: str, data: np.ndarray, **kwargs: object) -> Path:
        return write_tif(tmp_path / "src" / name, data, **kwargs)  # type: ignore[arg-type]

    return _write
