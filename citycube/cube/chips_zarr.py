"""Chip stores written as plain Zarr v3 folders: one chunk per 10 km block, swapped in whole.

The writer every chip format shares (:class:`ChipStoreWriter`); the icechunk format
(:mod:`citycube.cube.chips_icechunk`) writes through it into a repository instead of a folder.
"""

from __future__ import annotations

import hashlib
import shutil
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any

import numcodecs
import numpy as np
import rioxarray  # noqa: F401  (registers the ``.rio`` accessor)
import xarray as xr
import zarr
from affine import Affine
from xarray.backends.zarr import FillValueCoder, encode_zarr_attr_value
from zarr.abc.buffer import Buffer
from zarr.buffer import default_buffer_prototype
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.codecs.bytes import Endian
from zarr.core.group import ConsolidatedMetadata, GroupMetadata
from zarr.dtype import VariableLengthUTF8
from zarr.storage import MemoryStore

from citycube.catalogue.cities import PARENT_SIZE_M
from citycube.errors import CubeWriteError
from citycube.grid.tiles import PixelGrid, whole_pixels
from citycube.io.atomic import replace_dir_atomic
from citycube.io.digest import write_digests
from citycube.io.scratch import owned_name, remove_dead_leftovers

ZARR_SUFFIX = ".zarr"
"""A chip store written as a plain Zarr v3 folder, swapped in whole."""


ICECHUNK_SUFFIX = ".icechunk"
"""A chip store kept as an icechunk repository: one commit per write, a tag per release."""


CHIP_SUFFIXES = (ZARR_SUFFIX, ICECHUNK_SUFFIX)


_ZARR_COMPRESSOR = ZstdCodec(level=3)


_COORDINATE_COMPRESSOR = ZstdCodec(level=0)
"""zarr's default codec for the small coordinate arrays, which xarray leaves to zarr."""


class ChipStoreWriter:
    """Writes one city-year (or static) chip store as Zarr v3, atomically.

    The store is built in a sibling temp directory and swapped in only when every pixel was
    written, so readers never see a half-written store and a failed run leaves the previous
    version in place. Use as a context manager; ``commit`` runs on a clean exit.
    """

    def __init__(
        self,
        path: Path,
        pixel_grid: PixelGrid,
        band_names: Sequence[str],
        dtype: Any,
        fill_value: Any,
        attrs: Mapping[str, Any],
    ) -> None:
        if not band_names:
            raise ValueError("a chip store needs at least one band name")
        if len(set(band_names)) != len(band_names):
            raise ValueError(f"band names must be unique, got {list(band_names)}")
        self.path = Path(path)
        self.pixel_grid = pixel_grid
        self.band_names = tuple(band_names)
        self.dtype = np.dtype(dtype)
        self.fill_value = _checked_fill(self.dtype, fill_value)
        self.attrs = dict(attrs)
        self.chunk_px = whole_pixels(PARENT_SIZE_M / pixel_grid.resolution, "10 km / resolution")
        self._tmp_path = owned_name(self.path, "tmp")
        self._written: list[tuple[int, int, int, int]] = []
        self._zarr_group: zarr.Group | None = None
        self._arrays: dict[str, zarr.Array] = {}
        self._layout: dict[str, zarr.Array] = {}
        self._made_dirs: set[Path] = set()
        self._digests: dict[str, tuple[str, int]] = {}
        """SHA-256 and size of each key written from bytes in hand, for the manifest."""
        self._untracked: set[str] = set()
        """Arrays that zarr itself wrote to: their chunks' bytes were never in hand."""
        self.on_written: list[Callable[[int, int, np.ndarray, np.ndarray], None]] = []
        """Called with (row_start, col_start, values as stored, valid) after each write, e.g.
        to gather a quick-look without reading the store back."""
        self._started = False
        self._committed = False

    def __enter__(self) -> ChipStoreWriter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()
        except OSError as exc:
            raise CubeWriteError.writing(self.path, exc) from exc
        try:
            self._write_template()
        except OSError as exc:
            self._discard()
            raise CubeWriteError.writing(self.path, exc) from exc
        except BaseException:
            self._discard()
            raise
        self._started = True
        return self

    def _remove_leftovers(self) -> None:
        """Delete temp/old siblings that a killed earlier write of this store left behind.

        Only leftovers of processes that no longer exist are removed, so a concurrent writer of
        the same shared store (e.g. static chips) is never disturbed.
        """
        remove_dead_leftovers(self.path)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._discard()
            return
        try:
            if not self._committed:
                self.commit()
        finally:
            self._discard()

    def write_block(
        self, row_start: int, col_start: int, values: np.ndarray, valid: np.ndarray
    ) -> None:
        """Write one block at (row_start, col_start): values[bands,h,w] and valid[h,w].

        A block from :func:`blocks` is exactly one chunk of the store, so it is written
        without reading anything back. Invalid pixels are stored as the fill value; floats
        going into an integer store are rounded (averaged uint8 RGB stays uint8), while integer
        ids that do not fit the store type are an error rather than being clipped into another
        class.
        """
        self.write_rows(row_start, values, valid, col_start=col_start)

    def write_rows(
        self, row_start: int, values: np.ndarray, valid: np.ndarray, *, col_start: int = 0
    ) -> None:
        """Write rows from ``row_start``: values[bands,h,w] and valid[h,w], from ``col_start``.

        With the default ``col_start=0`` and full-width arrays this writes whole rows; any
        narrower array is written as the block it is (see :meth:`write_block`).
        """
        if not self._started:
            raise RuntimeError("use ChipStoreWriter as a context manager before writing rows")
        n_bands = len(self.band_names)
        if values.ndim != 3 or values.shape[0] != n_bands:
            raise ValueError(f"values must have shape ({n_bands}, h, w), got {values.shape}")
        height, width = values.shape[1:]
        if valid.shape != (height, width):
            raise ValueError(f"valid must have shape ({height}, {width}), got {valid.shape}")
        row_stop, col_stop = row_start + height, col_start + width
        if not (
            0 <= row_start < row_stop <= self.pixel_grid.height
            and 0 <= col_start < col_stop <= self.pixel_grid.width
        ):
            raise ValueError(
                f"rows [{row_start}, {row_stop}) × cols [{col_start}, {col_stop}) are outside "
                f"the {self.pixel_grid.height} × {self.pixel_grid.width} pixel grid"
            )
        valid = valid.astype(bool, copy=False)
        stored = self._to_store_type(values, valid)
        rows, cols = slice(row_start, row_stop), slice(col_start, col_stop)
        try:
            chunk = self._whole_chunk(row_start, row_stop, col_start, col_stop)
            if chunk is None or not self._write_chunk("data", (0, *chunk), stored):
                self._untrack("data")
                self._array("data")[:, rows, cols] = stored
            if chunk is None or not self._write_chunk("valid", chunk, valid.view(np.uint8)):
                self._untrack("valid")
                self._array("valid")[rows, cols] = valid.astype(np.uint8)
        except Exception as exc:
            raise CubeWriteError(
                f"writing rows {row_start}:{row_stop}, cols {col_start}:{col_stop} of "
                f"{self.path} failed: {exc}"
            ) from exc
        self._written.append((row_start, row_stop, col_start, col_stop))
        for observer in self.on_written:
            observer(row_start, col_start, stored, valid)

    def _group(self) -> zarr.Group:
        """The temp store, opened once for all block writes."""
        if self._zarr_group is None:
            self._zarr_group = zarr.open_group(str(self._tmp_path), mode="r+", zarr_format=3)
        return self._zarr_group

    def _array(self, name: str) -> zarr.Array:
        """One array of the temp store, its metadata read once."""
        if name not in self._arrays:
            self._arrays[name] = self._group()[name]
        return self._arrays[name]

    def _whole_chunk(
        self, row_start: int, row_stop: int, col_start: int, col_stop: int
    ) -> tuple[int, int] | None:
        """(row, col) index of the chunk these rows and columns exactly fill, else None.

        A chunk on the grid's south or east edge is filled by the part of it inside the grid.
        """
        size, grid = self.chunk_px, self.pixel_grid
        if row_start % size or col_start % size:
            return None
        if row_stop != min(row_start + size, grid.height):
            return None
        if col_stop != min(col_start + size, grid.width):
            return None
        return row_start // size, col_start // size

    def _write_chunk(self, name: str, index: tuple[int, ...], block: np.ndarray) -> bool:
        """Encode and write one whole chunk straight to its file; False if zarr must do it.

        This is the chunk zarr itself would write (its codecs, its key, edge chunks padded
        with the fill value, a chunk of nothing but fill value left out), without zarr's
        per-write round trips through its event-loop thread, which cost several times the
        compression of a 10 km block. Only plain ``bytes`` + ``zstd`` arrays are written here.
        """
        array = self._layout[name]
        metadata = array.metadata
        codecs = getattr(metadata, "codecs", ())
        if (
            len(codecs) != 2
            or not isinstance(codecs[0], BytesCodec)
            or codecs[0].endian not in (None, Endian.little)
            or not isinstance(codecs[1], ZstdCodec)
            or block.dtype != array.dtype
        ):
            return False
        fill = metadata.fill_value
        chunk_shape = tuple(array.chunks)
        if block.shape != chunk_shape:
            padded = np.full(chunk_shape, fill, dtype=block.dtype)
            padded[tuple(slice(0, n) for n in block.shape)] = block
            block = padded
        key = f"{array.path}/{metadata.encode_chunk_key(index)}"
        if _all_fill(block, fill):
            self._drop_key(key)  # an absent chunk reads as fill
            return True
        codec = numcodecs.Zstd(level=codecs[1].level, checksum=codecs[1].checksum)
        payload = codec.encode(np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<")))
        self._put_key(key, payload)
        return True

    def _put_key(self, key: str, payload: bytes) -> None:
        """Store one document or encoded chunk under its Zarr key in the store being built."""
        path = self._tmp_path / key
        if path.parent not in self._made_dirs:  # a chunk row's directory, made once
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made_dirs.add(path.parent)
        path.write_bytes(payload)
        if key.split("/", 1)[0] not in self._untracked:
            self._digests[key] = (hashlib.sha256(payload).hexdigest(), len(payload))

    def _drop_key(self, key: str) -> None:
        """Remove one key from the store being built, if it is there."""
        (self._tmp_path / key).unlink(missing_ok=True)
        self._digests.pop(key, None)

    def _untrack(self, name: str) -> None:
        """Forget the digests of an array that zarr writes to itself (bytes not in hand)."""
        if name not in self._untracked:
            self._untracked.add(name)
            self._digests = {k: v for k, v in self._digests.items() if not k.startswith(f"{name}/")}

    def commit(self) -> None:
        """Swap the finished temp store into ``path``; the old store is removed afterwards.

        One exchange where the system has one (readers see the old store or the new, whole);
        elsewhere the old store is first moved aside and restored if the swap fails, so for
        that instant ``path`` is absent, never partial
        (:func:`citycube.io.atomic.replace_dir_atomic`). A crash in between can leave a
        ``.<name>.old-*`` or ``.<name>.tmp-*`` sibling behind.
        """
        if self._committed:
            return
        if not self._started:
            raise RuntimeError("nothing to commit: the writer was never entered")
        self._check_covered()
        try:  # inside the store, so swapped in with it and gone with it
            write_digests(self._tmp_path, self._digests)
        except OSError as exc:
            raise CubeWriteError.writing(self.path, exc) from exc
        try:
            replace_dir_atomic(self._tmp_path, self.path)
        except OSError as exc:
            raise CubeWriteError.writing(self.path, exc) from exc
        self._committed = True
        remove_other_formats(self.path)

    def _check_covered(self) -> None:
        """Refuse to commit a store with pixels no block wrote (they would read as nodata)."""
        missing, first = _uncovered(self._written, self.pixel_grid.height, self.pixel_grid.width)
        if missing:
            raise CubeWriteError(
                f"{self.path}: {missing} pixels were never written (first at row {first[0]}, "
                f"col {first[1]}); write every block before committing, or the gap would read "
                "as nodata"
            )

    def _write_template(self) -> None:
        """Write metadata and coordinates; data chunks are written later, block by block.

        The layout is the one ``xarray.Dataset.to_zarr`` gives the equivalent dataset (data
        and valid with their coordinates and a rioxarray ``spatial_ref``), written with zarr
        directly: through xarray and dask the empty template cost more than a city's chunks
        of a coarse modality (``tests/test_chips.py`` compares the two). Every store of a grid,
        bands and type shares its documents but the root's attributes, so those are built once
        per process (:func:`_template`) and written as files here.
        """
        template = _template(self.pixel_grid, self.band_names, self.dtype.str, self.fill_value)
        self._layout = dict(template.arrays)
        root = GroupMetadata(
            attributes=_zarr_attrs(self._store_attrs()),
            consolidated_metadata=template.consolidated,
        )
        documents = {
            **template.documents,
            **{k: v.to_bytes() for k, v in root.to_buffer_dict(default_buffer_prototype()).items()},
        }
        self._begin_store()
        for key in sorted(documents, key=lambda k: (k.count("/"), k)):  # parents first
            self._put_key(key, documents[key])

    def _begin_store(self) -> None:
        """Create the empty store that the blocks are written into (here: the temp folder)."""
        self._tmp_path.mkdir()

    def _store_attrs(self) -> dict[str, Any]:
        """Caller attrs plus the grid facts a reader needs; the grid facts cannot be overridden."""
        grid = self.pixel_grid
        facts = {
            "city": grid.city,
            "epsg": grid.epsg,
            "resolution_m": grid.resolution,
            "chunk_size_m": PARENT_SIZE_M,
            "band_names": list(self.band_names),
            "nodata": self.fill_value,
        }
        clashes = {k for k in facts if k in self.attrs and self.attrs[k] != facts[k]}
        if clashes:
            raise ValueError(f"attrs {sorted(clashes)} contradict the pixel grid or bands")
        return {**self.attrs, **facts}

    def _to_store_type(self, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Cast to the store dtype with invalid pixels set to the fill value.

        Works in place on one working copy (or none, when every pixel is valid and the type
        already fits): a block is written per 10 km, and each extra full-size temporary is
        one more pass over a block's memory.
        """
        out_is_int = np.issubdtype(self.dtype, np.integer)
        all_valid = bool(valid.all())
        if out_is_int and np.issubdtype(values.dtype, np.floating):
            info = np.iinfo(self.dtype)
            inside = values.copy()
            if not all_valid:
                np.copyto(inside, 0, where=~valid)  # invalid cells may hold NaN
            np.rint(inside, out=inside)
            np.clip(inside, info.min, info.max, out=inside)
            stored = inside.astype(self.dtype)
        elif out_is_int:
            info = np.iinfo(self.dtype)
            if valid.any():
                low = values.min(where=valid, initial=np.iinfo(values.dtype).max)
                high = values.max(where=valid, initial=np.iinfo(values.dtype).min)
                if low < info.min or high > info.max:
                    raise CubeWriteError(
                        f"values {low}..{high} do not fit the store type "
                        f"{self.dtype}; choose a wider dtype for {self.path.name}"
                    )
            stored = values.astype(self.dtype, copy=not all_valid)
        else:
            stored = values.astype(self.dtype, copy=not all_valid)
        if not all_valid:
            np.copyto(stored, np.array(self.fill_value, dtype=self.dtype), where=~valid)
        return stored

    def _discard(self) -> None:
        """Remove the temp store (after a failure, or whatever is left after a commit)."""
        shutil.rmtree(self._tmp_path, ignore_errors=True)


@dataclass(frozen=True)
class _Template:
    """The documents every chip store of one grid, band list and type shares."""

    documents: Mapping[str, bytes]
    """Store key → bytes of every document but the root group's."""
    consolidated: ConsolidatedMetadata
    """The root's consolidated metadata (chunk writes never change it)."""
    arrays: Mapping[str, zarr.Array]
    """The data and valid arrays (in memory): their codecs, chunks and keys."""


@lru_cache(maxsize=64)
def _template(grid: PixelGrid, band_names: tuple[str, ...], dtype: str, fill: Any) -> _Template:
    """Build a chip store's layout with zarr in memory, once per grid, bands and type.

    zarr's local store hands every document to a thread of its event loop, which cost a few
    times more than building the layout; written as files, the documents are the same bytes.
    """
    documents: dict[str, Buffer] = {}
    group = zarr.open_group(MemoryStore(documents), mode="w-", zarr_format=3)
    arrays = _create_arrays(group, grid, band_names, np.dtype(dtype), fill)
    with warnings.catch_warnings():
        # zarr notes that consolidated metadata is not yet in the v3 spec; the per-array
        # metadata stays complete, so readers that ignore it lose nothing.
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not")
        consolidated = zarr.consolidate_metadata(group.store, zarr_format=3).metadata
    assert consolidated.consolidated_metadata is not None
    return _Template(
        {k: v.to_bytes() for k, v in documents.items() if k != "zarr.json"},
        consolidated.consolidated_metadata,
        arrays,
    )


def _create_arrays(
    group: zarr.Group, grid: PixelGrid, band_names: tuple[str, ...], dtype: np.dtype, fill: Any
) -> dict[str, zarr.Array]:
    """Coordinates, grid mapping, data and valid in ``group``; the data and valid arrays."""
    n_bands = len(band_names)
    chunk = whole_pixels(PARENT_SIZE_M / grid.resolution, "10 km / resolution")
    coordinates = (_COORDINATE_COMPRESSOR,)
    nan_fill = {"_FillValue": FillValueCoder.encode(np.nan, np.dtype(np.float64))}
    band = group.create_array(
        "band",
        shape=(n_bands,),
        dtype=VariableLengthUTF8(),  # type: ignore[arg-type]
        chunks=(n_bands,),
        compressors=coordinates,
        fill_value="",
        dimension_names=("band",),
    )
    band[:] = np.array(band_names, dtype=object)
    for name, values in (("x", grid.x_coords()), ("y", grid.y_coords())):
        coordinate = group.create_array(
            name,
            shape=values.shape,
            dtype=values.dtype,
            chunks=values.shape,
            compressors=coordinates,
            fill_value=np.nan,
            dimension_names=(name,),
            attributes=nan_fill,
        )
        coordinate[:] = values
    group.create_array(
        "spatial_ref",
        shape=(),
        dtype=np.int64,
        compressors=coordinates,
        fill_value=0,
        attributes=_grid_mapping_attrs(grid.crs, grid.transform),
    )
    data_attrs: dict[str, Any] = {
        "nodata": fill,
        "long_name": list(band_names),
        "grid_mapping": "spatial_ref",
    }
    if np.issubdtype(dtype, np.floating):
        data_attrs.update(nan_fill)  # xarray's CF default for float variables, any fill
    data = group.create_array(
        "data",
        shape=(n_bands, grid.height, grid.width),
        chunks=(n_bands, chunk, chunk),
        dtype=dtype,
        compressors=(_ZARR_COMPRESSOR,),
        fill_value=fill,
        dimension_names=("band", "y", "x"),
        attributes=data_attrs,
    )
    valid = group.create_array(
        "valid",
        shape=(grid.height, grid.width),
        chunks=(chunk, chunk),
        dtype=np.uint8,
        compressors=(_ZARR_COMPRESSOR,),
        fill_value=0,
        dimension_names=("y", "x"),
        attributes={
            "description": ("1 where at least half of the pixel's source support is valid, else 0"),
            "grid_mapping": "spatial_ref",
        },
    )
    return {"data": data, "valid": valid}


def _zarr_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute values as xarray stores them (NumPy scalars and arrays as plain JSON)."""
    return {key: encode_zarr_attr_value(value) for key, value in attrs.items()}


def _grid_mapping_attrs(crs: str, transform: Affine) -> dict[str, Any]:
    """The ``spatial_ref`` attributes rioxarray writes for a grid (CF grid mapping + WKT)."""
    return dict(_grid_mapping_items(crs, transform))


@lru_cache(maxsize=32)
def _grid_mapping_items(crs: str, transform: Affine) -> tuple[tuple[str, Any], ...]:
    """Built once per grid: rioxarray derives them from the CRS through pyproj, slowly."""
    coordinate = xr.Dataset().rio.write_crs(crs).rio.write_transform(transform)["spatial_ref"]
    return tuple(_zarr_attrs(coordinate.attrs).items())


def _all_fill(block: np.ndarray, fill: Any) -> bool:
    """Whether every element is the fill value (NaN counts as equal to a NaN fill)."""
    if np.issubdtype(block.dtype, np.floating) and np.isnan(fill):
        return bool(np.isnan(block).all())
    if np.issubdtype(block.dtype, np.floating) and fill == 0:
        return not block.view(f"u{block.dtype.itemsize}").any()  # -0.0 is not the fill 0.0
    return bool(block.min() == fill and block.max() == fill)


def _checked_fill(dtype: np.dtype, fill_value: Any) -> int | float:
    """The fill value as a plain Python number that the store dtype can hold."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if not (isinstance(fill_value, int | np.integer) and info.min <= fill_value <= info.max):
            raise ValueError(f"fill value {fill_value!r} does not fit {dtype}")
        return int(fill_value)
    if np.issubdtype(dtype, np.floating):
        return float(fill_value)
    raise ValueError(f"chip stores hold integer or float data, not {dtype}")


def _uncovered(
    written: Sequence[tuple[int, int, int, int]], height: int, width: int
) -> tuple[int, tuple[int, int]]:
    """Pixels of a height × width grid that no written rectangle covers, and the first one.

    Works on the grid cut along the rectangles' own edges, so the check costs a few hundred
    cells whatever the city's size, not one flag per pixel.
    """
    row_edges = sorted({0, height, *(e for r in written for e in r[:2])})
    col_edges = sorted({0, width, *(e for r in written for e in r[2:])})
    covered = np.zeros((len(row_edges) - 1, len(col_edges) - 1), dtype=bool)
    row_index = {edge: i for i, edge in enumerate(row_edges)}
    col_index = {edge: i for i, edge in enumerate(col_edges)}
    for row_start, row_stop, col_start, col_stop in written:
        covered[
            row_index[row_start] : row_index[row_stop], col_index[col_start] : col_index[col_stop]
        ] = True
    areas = np.outer(np.diff(row_edges), np.diff(col_edges))
    missing = int(areas[~covered].sum())
    if not missing:
        return 0, (0, 0)
    gaps = np.argwhere(~covered)  # row-major order
    first_row, first_col = (int(i) for i in gaps[0])
    return missing, (row_edges[first_row], col_edges[first_col])


def remove_other_formats(path: Path) -> None:
    """Remove the store of the same chips in the other format (a release that switched format).

    Called after a commit, so the chip index, which names the new store, never points at a
    store that is gone.
    """
    for suffix in CHIP_SUFFIXES:
        other = path.with_suffix(suffix)
        if other != path and other.exists():
            shutil.rmtree(other, ignore_errors=True)
