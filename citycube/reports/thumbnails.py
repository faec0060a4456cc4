"""Small PNG thumbnails as ``data:`` URIs, for markdown in Dagster metadata.

Apart from ``citycube.reports.render``, which imports the raster stack (rasterio, xarray, zarr)
through ``citycube.processing.chips``: a run process that only embeds a preview of a picture already
written does
not have to import it (with dask workers the run's own process never needs it otherwise).
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image


def png_data_uri(image: np.ndarray | Image.Image, max_px: int = 160) -> str:
    """A small PNG thumbnail as a ``data:`` URI, for markdown in Dagster metadata.

    Downsampling is nearest-neighbour so categorical colours are never blended.
    """
    img = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))
    scale = max(img.width, img.height) / max_px
    if scale > 1:
        size = (max(1, round(img.width / scale)), max(1, round(img.height / scale)))
        img = img.resize(size, Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
