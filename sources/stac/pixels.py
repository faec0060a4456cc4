"""Pure pixel arithmetic of the STAC adapters: QA masks, scaling, composites, mappings.

Nothing here reads a file or knows a product: each function takes arrays and returns arrays,
so every rule can be checked on a few pixels. Invalid pixels travel as NaN (float32) between
steps and become the product's nodata only when the file is written.

Annual composites are per-pixel statistics over a year's *clear* observations: an
observation counts at a pixel when its QA_PIXEL has none of the product's invalid bits (fill,
dilated cloud, cirrus, cloud, cloud shadow, snow) and its raw value is not fill. The median
is ``numpy.nanmedian`` (for an even count, the mean of the two middle values); a pixel with no
clear observation stays invalid — never 0.
"""

from __future__ import annotations

import numpy as np

QA_FILL = 1 << 0
"""QA_PIXEL bit 0: fill (outside the scene, or a Landsat 7 SLC-off gap)."""
QA_CLEAR = 1 << 6
"""QA_PIXEL bit 6: clear (no cloud, no dilated cloud)."""


def qa_clear(qa: np.ndarray, invalid_mask: int) -> np.ndarray:
    """True where none of the invalid QA bits is set."""
    return (qa.astype(np.uint16) & np.uint16(invalid_mask)) == 0


def scale_dn(dn: np.ndarray, scale: float, offset: float, fill_value: int | None = 0) -> np.ndarray:
    """Physical values (float32) from raw counts; fill counts become NaN."""
    values = dn.astype(np.float32) * np.float32(scale) + np.float32(offset)
    if fill_value is not None:
        values[dn == fill_value] = np.nan
    return values


def masked(values: np.ndarray, clear: np.ndarray) -> np.ndarray:
    """``values`` with NaN wherever the observation is not clear."""
    return np.where(clear, values, np.float32(np.nan)).astype(np.float32)


def median_composite(stack: np.ndarray) -> np.ndarray:
    """Per-pixel median over observations (axis 0), ignoring NaN; NaN where none is clear.

    The same values as ``numpy.nanmedian`` (the mean of the two middle values for an even
    count), from one sort along the observations, which puts NaN last: ``nanmedian`` masks
    every pixel's observations and took most of a composite's time.
    """
    if stack.shape[0] == 0:
        raise ValueError("a composite needs at least one observation")
    ordered = np.sort(stack, axis=0)
    count = np.count_nonzero(~np.isnan(stack), axis=0)
    lower = np.take_along_axis(ordered, ((np.maximum(count, 1) - 1) // 2)[None], axis=0)[0]
    upper_index = np.minimum(count // 2, stack.shape[0] - 1)
    upper = np.take_along_axis(ordered, upper_index[None], axis=0)[0]
    with np.errstate(invalid="ignore"):
        median = np.where(count % 2 == 1, lower, (lower + upper) / lower.dtype.type(2))
    return np.where(count > 0, median, np.nan).astype(np.float32)


def mean_composite(stack: np.ndarray) -> np.ndarray:
    """Per-pixel mean over observations (axis 0), ignoring NaN; NaN where none is clear."""
    if stack.shape[0] == 0:
        raise ValueError("a composite needs at least one observation")
    # numpy.nanmean's own steps (NaN as 0, a float32 sum, divided by the count), so the values
    # are the same bit for bit, but all-NaN pixels give NaN under a thread-safe errstate instead
    # of a warning silenced through the process-wide warnings filters (composites run in
    # several threads).
    missing = np.isnan(stack)
    total = np.sum(np.where(missing, np.float32(0), stack), axis=0)
    count = np.sum(~missing, axis=0, dtype=np.intp)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.true_divide(total, count, out=total, casting="unsafe").astype(np.float32)


def clear_count(stack: np.ndarray) -> np.ndarray:
    """How many observations are clear at each pixel."""
    return np.isfinite(stack).sum(axis=0).astype(np.uint16)


def in_range(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """True where a value lies in [low, high] (NaN is not in range)."""
    return (values >= np.float32(low)) & (values <= np.float32(high))


def ndvi(red: np.ndarray, nir: np.ndarray) -> np.ndarray:
    """(nir − red) / (nir + red); NaN where either is NaN or the ratio is not an NDVI.

    Surface reflectance can be negative (the Collection 2 offset is −0.2; dark targets and
    water retrieve below 0), and a ratio with one negative band leaves [−1, 1] (red 0.02 and
    nir −0.019 give −39): such a value, and a non-positive sum, are refused (NaN) rather than
    published. With both bands masked to the valid reflectance range first (the products'
    ``valid_range``) nothing is refused here.
    """
    total = nir + red
    with np.errstate(divide="ignore", invalid="ignore"):
        index = (nir - red) / total
        valid = (total > 0) & (np.abs(index) <= 1)
    return np.where(valid, index, np.float32(np.nan)).astype(np.float32)


def reflectance_to_uint8(reflectance: np.ndarray, low: float, high: float) -> np.ndarray:
    """Fixed linear map of reflectance [low, high] to 1–255; NaN becomes 0 (nodata).

    The range is the same for every tile, city and year (no per-tile stretch), so colours
    compare across the cube. Values outside it clip to 1 or 255.
    """
    scaled = 1.0 + 254.0 * (reflectance.astype(np.float64) - low) / (high - low)
    out = np.clip(np.rint(np.nan_to_num(scaled, nan=0.0)), 1, 255).astype(np.uint8)
    out[~np.isfinite(reflectance)] = 0
    return out


def composite_qa(valid: np.ndarray) -> np.ndarray:
    """A QA_PIXEL-form layer of a composite: clear where a value exists, fill elsewhere."""
    return np.where(valid, np.uint16(QA_CLEAR), np.uint16(QA_FILL)).astype(np.uint16)


def to_nodata(values: np.ndarray, nodata: float, dtype: str) -> np.ndarray:
    """NaN to the file's nodata, cast to the file's type."""
    return np.where(np.isfinite(values), values, np.float32(nodata)).astype(dtype)
