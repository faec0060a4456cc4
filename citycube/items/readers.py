"""Open a fetched source item as a ``MaskedSource`` that applies the modality's validity rules."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import numpy as np
import rasterio
from odc.geo.geobox import GeoBox
from pyproj import CRS
from rasterio.windows import Window

from citycube.catalogue.modalities import ModalitySpec
from citycube.catalogue.products import load_products
from citycube.errors import SourceReadError
from citycube.items.protocol import SourceItem
from citycube.items.rasters import MaskedSource, open_raster, read_checked
from citycube.items.staging import repair_hint


def _same_crs(a: CRS, b: CRS) -> bool:
    return (
        a == b
        or a.to_wkt() == b.to_wkt()
        or (a.to_epsg() is not None and a.to_epsg() == b.to_epsg())
    )


def check_native_crs(ds: rasterio.DatasetReader, item: SourceItem) -> CRS:
    """Fail clearly when a file is not in its product's native CRS."""
    crs = CRS.from_user_input(ds.crs)
    spec = load_products().get(item.product)
    if spec is not None:
        expected = spec.expected_crs(item.city)
        if not _same_crs(crs, expected):
            raise SourceReadError(
                f"{ds.name} is in {crs.to_string()} but {item.product} is published in "
                f"{expected.to_string()} for {item.city}; the file is wrong or mislabelled — "
                "fetch it again or fix the adapter"
            )
    return crs


def _pixel_validity(
    values: np.ndarray,
    raw: np.ndarray,
    modality: ModalitySpec,
    valid_ids: frozenset[int] | None,
    file_nodata: float | None,
) -> np.ndarray:
    """Valid where finite, not nodata (raw; all bands filled), in range and in the legend."""
    rules = modality.validity
    valid = np.ones(values.shape[1:], dtype=bool)
    if np.issubdtype(values.dtype, np.floating):
        valid &= np.isfinite(values).all(axis=0)
    for nodata in {rules.nodata, file_nodata} - {None}:
        if len(raw) > 1:
            valid &= ~(raw == nodata).all(axis=0)
        else:
            valid &= raw[0] != nodata
    if rules.valid_range is not None:
        lo, hi = rules.valid_range
        with np.errstate(invalid="ignore"):
            valid &= ((values >= lo) & (values <= hi)).all(axis=0)
    if valid_ids is not None:
        valid &= np.isin(values[0], np.fromiter(valid_ids, dtype=np.int64))
    return valid


def _require_real_bands(ds: rasterio.DatasetReader, bands: Sequence[int]) -> None:
    """Refuse bands that do not hold real numbers (complex values, or no numeric type at all):
    no product is published that way, and numpy would silently drop the imaginary part."""
    for band in bands:
        dtype = np.dtype(ds.dtypes[band - 1])
        if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)):
            raise SourceReadError(
                f"{ds.name} band {band} holds {dtype.name} values, not real numbers: the file is "
                f"not a product file; {repair_hint(ds.name)}"
            )


def check_raster_schema(ds: rasterio.DatasetReader, item: SourceItem, bands: Sequence[int]) -> None:
    """Refuse a file whose pixel type, nodata or scaling is not what its product declares
    (``schemas/sources.yaml``): float values rewritten as uint8 lose their magnitude, scaled
    integers without their scale read tenfold, and both would pass as valid pixels."""
    spec = load_products().get(item.product)
    schema = spec.raster if spec is not None else None
    if schema is None:
        return
    for band in bands:
        dtype = ds.dtypes[band - 1]
        if dtype not in schema.dtypes:
            raise SourceReadError(
                f"{ds.name} band {band} holds {dtype} pixels but {item.product} is published as "
                f"{' or '.join(schema.dtypes)}: the file was rewritten in another type or is "
                f"not that product's; {repair_hint(ds.name)}"
            )
        kind = np.dtype(dtype).kind
        unscaled = ds.scales[band - 1] == 1 and ds.offsets[band - 1] == 0
        if schema.scaled and kind in "iu" and unscaled:
            raise SourceReadError(
                f"{ds.name} band {band} holds {dtype} pixels without the scale and offset "
                f"{item.product} stores its values with, so they are not physical values; "
                f"{repair_hint(ds.name)}"
            )
    if schema.nodata is not None and ds.nodata is not None and ds.nodata != schema.nodata:
        raise SourceReadError(
            f"{ds.name} declares nodata {ds.nodata:g} but {item.product} is published with "
            f"nodata {schema.nodata:g}: the file was rewritten; {repair_hint(ds.name)}"
        )


@contextmanager
def open_masked_source(
    item: SourceItem,
    modality: ModalitySpec,
    bands: Sequence[int],
    valid_ids: frozenset[int] | None = None,
    role: str = "data",
    names: Sequence[str] | None = None,
) -> Iterator[MaskedSource]:
    """Yield a reader over ``bands`` of the item's ``role`` file with validity applied.

    Values come back in physical units when the file declares a scale/offset (GDAL metadata,
    as CHELSA does); nodata is judged on the raw values. QA bits (``qa_invalid_bits``) are
    read from the item's 'qa' file on the same grid. ``names`` are the fields the bands
    serve (by default those of the city's first-choice product; a fallback item names its own).
    """
    with ExitStack() as stack:
        data = stack.enter_context(open_raster(item.href(role)))
        crs = check_native_crs(data, item)
        missing = [b for b in bands if b > data.count]
        if missing:
            raise SourceReadError(
                f"{data.name} has {data.count} band(s); {modality.code} reads band(s) "
                f"{list(bands)} of {item.product}, so the file is not that product's: "
                f"{repair_hint(data.name)}"
            )
        _require_real_bands(data, bands)
        check_raster_schema(data, item, bands)
        qa = None
        if modality.validity.qa_invalid_bits:
            qa = stack.enter_context(open_raster(item.href("qa")))
            if qa.transform != data.transform or qa.shape != data.shape:
                raise SourceReadError(
                    f"{qa.name} is not on the same grid as {data.name} (QA bits must match the "
                    f"data pixel for pixel): {repair_hint(qa.name)}"
                )
        qa_mask = sum(1 << b for b in modality.validity.qa_invalid_bits)
        file_nodata = data.nodata
        band_list = list(bands)
        scales = np.array([data.scales[b - 1] for b in band_list], dtype=float)
        offsets = np.array([data.offsets[b - 1] for b in band_list], dtype=float)
        scaled = bool(np.any(scales != 1) or np.any(offsets != 0))

        def read(window: Window) -> tuple[np.ndarray, np.ndarray]:
            raw = read_checked(data, band_list, window)
            values = raw * scales[:, None, None] + offsets[:, None, None] if scaled else raw
            valid = _pixel_validity(values, raw, modality, valid_ids, file_nodata)
            if qa is not None:
                qa_values = read_checked(qa, [1], window)[0]
                valid &= (qa_values & qa_mask) == 0
            return values, valid

        grid = GeoBox((data.height, data.width), data.transform, crs)
        if names is None:  # the fields the city's first-choice product serves from this role
            names = tuple(
                f.name
                for f in modality.fields
                if modality.product_for(f, item.city) == item.product
                and f.role_for(item.product) == role
            )
        yield MaskedSource(grid=grid, read=read, band_names=tuple(names))
