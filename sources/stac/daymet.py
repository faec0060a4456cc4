"""Daymet annual summaries (North America) from the Planetary Computer's Zarr store.

``daymet-annual-na`` has no items: its data is one Zarr store per region, offered as the
collection-level asset ``zarr-https`` (variables with dimensions time, y, x on Daymet's 1 km
Lambert conformal conic lattice, a CF ``lambert_conformal_conic`` grid mapping, consolidated
metadata). A fetch reads the collection, signs the store's root with a SAS token for its blob
container, opens it with xarray over fsspec's HTTP filesystem (the token travels as query
parameters of every request) and reads only the year's slice of the city window of each
variable, so only the chunks under that window are fetched. Values are copied on the store's own
lattice, never resampled, and written as the sample twin writes them: one float32 GeoTIFF per
role, nodata -9999.

What the store does not publish stays unpublished: roles the spec lists under ``unpublished``
(e.g. shortwave radiation and relative humidity, absent from the annual summaries) are recorded
on the item with their reason code, and their fields come out unavailable, never zero. A derived
role is the cell-wise mean of others (``tmean = (tmin + tmax) / 2``, Daymet's convention); it is
exact for annual means of the same days.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

import aiohttp
import numpy as np
import xarray as xr
import zarr.storage
from affine import Affine
from fsspec.implementations.http import HTTPFileSystem
from odc.geo.geobox import GeoBox
from pyproj import CRS, Transformer
from zarr.abc.store import Store

from citycube.catalogue.cities import get_city
from citycube.catalogue.products import load_products
from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.items.protocol import MISSING_ROLES_KEY
from citycube.items.staging import StagedFiles
from sources.retries import parse_retry_after
from sources.stac.adapter import FetchContext
from sources.stac.grids import (
    city_crs,
    city_window,
)
from sources.stac.retrying import TransientError, is_transient_status
from sources.stac.spec import ZarrSpec
from sources.stac.writing import PROVENANCE_FILE, Layer, write_cog, write_provenance
from sources.stac.zarrcache import CachingStore, ChunkCache

CRS_TOLERANCE_M = 0.01
"""The store's grid mapping and the product's declared CRS must place a point this close."""


class CorruptStoreError(Exception):
    """The store answered, but its metadata or a chunk cannot be decoded."""


DECODE_ERRORS = (CorruptStoreError, RuntimeError, ValueError, zlib.error, KeyError)
"""What a store that answered but does not decode raises (codecs, chunk sizes, metadata)."""


@dataclass(frozen=True)
class StoreWindow:
    """One year's city window of the store's variables, on the store's lattice."""

    grid: GeoBox
    """Where the window's cells are (the product's CRS, the store's lattice)."""
    values: Mapping[str, np.ndarray]
    """Per store variable, (rows, cols) float64, NaN where the store has no value."""
    time_index: int
    """Index of the year along the store's time dimension."""
    rows: tuple[int, int]
    """[start, stop) along the store's y dimension."""
    cols: tuple[int, int]
    """[start, stop) along the store's x dimension."""


def _transient_or_fatal(exc: BaseException) -> Exception | None:
    """How a request failure of fsspec's HTTP filesystem is treated; None: not a request error."""
    if isinstance(exc, aiohttp.ClientResponseError):
        if is_transient_status(exc.status):
            asked = (exc.headers or {}).get("Retry-After")
            return TransientError(str(exc), retry_after=parse_retry_after(asked))
        return exc
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | TimeoutError):
        return TransientError(str(exc) or type(exc).__name__)
    return None


@contextmanager
def open_store(
    signed_root: str,
    spec: ZarrSpec,
    timeout: tuple[float, float],
    consolidated: bool,
    *,
    cache: ChunkCache | None = None,
    href: str | None = None,
) -> Iterator[xr.Dataset]:
    """The store at a signed HTTPS root as a lazy dataset (nothing but metadata read yet).

    The SAS query of the root is handed to every request as parameters (fsspec appends chunk
    keys to the path, so a query in the root itself would be lost). With a ``cache``, chunks
    are kept on disk keyed by ``href`` (the store's unsigned URL; default the root without its
    query) and read from there by later opens; a decoding failure removes the chunks this open
    read from the cache (``sources.stac.zarrcache``). A local (offline mirror) store is read as
    it is.
    """
    root, _, query = signed_root.partition("?")
    sessions: list[aiohttp.ClientSession] = []
    caching: CachingStore | None = None
    store: Store
    if root.startswith(("http://", "https://")):
        connect_s, read_s = timeout
        options: dict[str, object] = {}
        if query:
            options["params"] = dict(parse_qsl(query, keep_blank_values=True))

        async def get_client(**kwargs: object) -> aiohttp.ClientSession:
            """fsspec's own client maker, keeping the session so that it can be closed."""
            session = aiohttp.ClientSession(**kwargs)  # type: ignore[arg-type]
            sessions.append(session)
            return session

        fs = HTTPFileSystem(
            asynchronous=True,
            skip_instance_cache=True,
            get_client=get_client,
            client_kwargs={
                "timeout": aiohttp.ClientTimeout(
                    total=None, sock_connect=connect_s, sock_read=read_s
                )
            },
            **options,
        )
        store = zarr.storage.FsspecStore(fs, read_only=True, path=root.rstrip("/"))
        if cache is not None:
            store = caching = cache.wrap(store, href or root)
    else:  # an offline mirror copy on disk
        store = zarr.storage.LocalStore(root, read_only=True)
    try:
        try:
            dataset = xr.open_zarr(
                store,
                consolidated=consolidated,
                zarr_format=spec.zarr_format,
                chunks=None,
                drop_variables=list(spec.drop_variables),
            )
        except FileNotFoundError as exc:
            raise SourceReadError(
                f"no Zarr store at {root}: {exc}", reason="missing_asset"
            ) from None
        try:
            yield dataset
        finally:
            dataset.close()
    except DECODE_ERRORS:
        if caching is not None:
            caching.discard_read_chunks()  # never replay bytes that did not decode
        raise
    finally:
        _close_sessions(sessions)


def _close_sessions(sessions: list[aiohttp.ClientSession]) -> None:
    """Close the filesystem's aiohttp sessions on zarr's event loop (no unclosed-session noise)."""
    open_sessions = [session for session in sessions if not session.closed]
    if not open_sessions:
        return
    from zarr.core.sync import sync

    for session in open_sessions:
        sync(session.close())


def store_crs(dataset: xr.Dataset, spec: ZarrSpec) -> CRS:
    """The CRS of the store's CF grid mapping."""
    if spec.grid_mapping not in dataset.variables:
        raise CorruptStoreError(f"the store has no grid mapping variable {spec.grid_mapping!r}")
    return CRS.from_cf(dict(dataset[spec.grid_mapping].attrs))


def check_same_crs(found: CRS, expected: CRS, lon: float, lat: float) -> None:
    """Fail unless two CRSs place a point (and one 100 km away) within ``CRS_TOLERANCE_M``.

    A grid mapping read from CF attributes and a PROJ string name their datum differently, so
    equality of definitions says little; agreement of coordinates is what matters.
    """
    for dlon, dlat in ((0.0, 0.0), (1.0, 1.0)):
        a = Transformer.from_crs("EPSG:4326", found, always_xy=True).transform(lon + dlon, lat)
        b = Transformer.from_crs("EPSG:4326", expected, always_xy=True).transform(lon + dlon, lat)
        if math.hypot(a[0] - b[0], a[1] - b[1]) > CRS_TOLERANCE_M:
            raise CorruptStoreError(
                f"the store's grid mapping ({found.to_proj4()}) is not the product's CRS "
                f"({expected.to_proj4()}): they place ({lon + dlon}, {lat + dlat}) "
                f"{math.hypot(a[0] - b[0], a[1] - b[1]):.3f} m apart"
            )


def lattice_window(
    city: str, crs: CRS, x: np.ndarray, y: np.ndarray, cell: float
) -> tuple[tuple[int, int], tuple[int, int], GeoBox]:
    """(rows, cols, grid): the store cells covering the city window, and where they are.

    ``x`` and ``y`` are the store's cell centres; x must rise and y fall by ``cell`` (a north-up
    lattice). The window is the city extent plus the product margin, transformed into the
    store's CRS (edges densified) and clipped to the store.
    """
    if len(x) < 2 or len(y) < 2:
        raise CorruptStoreError("the store's x and y coordinates have fewer than two cells")
    dx, dy = np.diff(x), np.diff(y)
    if not (np.allclose(dx, cell, atol=1e-6) and np.allclose(dy, -cell, atol=1e-6)):
        raise CorruptStoreError(
            f"the store's lattice is not north-up with {cell} m cells "
            f"(x steps {dx.min()}…{dx.max()}, y steps {dy.min()}…{dy.max()})"
        )
    left, top = float(x[0]) - cell / 2, float(y[0]) + cell / 2
    to_store = Transformer.from_crs(city_crs(city), crs, always_xy=True)
    xmin, ymin, xmax, ymax = to_store.transform_bounds(*city_window(city), densify_pts=51)
    c0 = max(math.floor((xmin - left) / cell + 1e-9), 0)
    c1 = min(math.ceil((xmax - left) / cell - 1e-9), len(x))
    r0 = max(math.floor((top - ymax) / cell + 1e-9), 0)
    r1 = min(math.ceil((top - ymin) / cell - 1e-9), len(y))
    if c0 >= c1 or r0 >= r1:
        raise SourceUnavailableError(
            f"the store does not reach {city}'s window", reason="outside_source_coverage"
        )
    transform = Affine(cell, 0, left + c0 * cell, 0, -cell, top - r0 * cell)
    return (r0, r1), (c0, c1), GeoBox((r1 - r0, c1 - c0), transform, crs)


def read_window(ctx: FetchContext, href: str, consolidated: bool) -> StoreWindow:
    """Open the signed store and read the year's city window of each variable (one attempt)."""
    spec = ctx.spec.zarr
    assert spec is not None and ctx.year is not None
    expected = load_products()[ctx.spec.product].expected_crs(ctx.city)
    centre = get_city(ctx.city).centre
    with open_store(
        ctx.open_href(href), spec, ctx.timeout, consolidated, cache=ctx.chunks, href=href
    ) as ds:
        check_same_crs(store_crs(ds, spec), expected, centre.lon, centre.lat)
        time_dim, y_dim, x_dim = spec.dims
        years = ds[time_dim].dt.year.values
        hits = np.flatnonzero(years == ctx.year)
        if len(hits) == 0:
            raise SourceUnavailableError(
                f"{ctx.where()}: the store publishes {years.min()}–{years.max()}, not {ctx.year}",
                reason="source_year_missing",
            )
        if len(hits) > 1:
            raise CorruptStoreError(f"the store has {len(hits)} time steps in {ctx.year}")
        rows, cols, grid = lattice_window(
            ctx.city,
            expected,
            ds[x_dim].values.astype(np.float64),
            ds[y_dim].values.astype(np.float64),
            spec.cell_size_m,
        )
        values: dict[str, np.ndarray] = {}
        for variable in spec.variables:
            if variable.variable is None:
                continue
            values[variable.variable] = _read_variable(
                ds, variable.variable, variable.store_units, spec, int(hits[0]), rows, cols
            )
    return StoreWindow(grid, values, int(hits[0]), rows, cols)


def _read_variable(
    ds: xr.Dataset,
    name: str,
    units: str | None,
    spec: ZarrSpec,
    time_index: int,
    rows: tuple[int, int],
    cols: tuple[int, int],
) -> np.ndarray:
    """One variable's window (float64, NaN where the store has no value); checks its form."""
    if name not in ds.data_vars:
        raise CorruptStoreError(f"the store has no variable {name!r} (has {sorted(ds.data_vars)})")
    array = ds[name]
    if tuple(array.dims) != spec.dims:
        raise CorruptStoreError(f"{name} has dimensions {array.dims}, expected {spec.dims}")
    mapping = array.attrs.get("grid_mapping") or array.encoding.get("grid_mapping")
    if mapping != spec.grid_mapping:
        raise CorruptStoreError(f"{name} names grid mapping {mapping!r}, not {spec.grid_mapping!r}")
    if array.attrs.get("units") != units:
        raise CorruptStoreError(f"{name} is in {array.attrs.get('units')!r}, expected {units!r}")
    time_dim, y_dim, x_dim = spec.dims
    selection = array.isel({time_dim: time_index, y_dim: slice(*rows), x_dim: slice(*cols)})
    try:
        window = selection.values.astype(np.float64)
    except (RuntimeError, ValueError, zlib.error) as exc:  # codecs, chunks of the wrong size
        raise CorruptStoreError(f"{name}: {type(exc).__name__}: {exc}") from None
    window[window == spec.nodata] = np.nan  # a store that did not declare its fill value
    return window


def compose(ctx: FetchContext, staging: Path) -> StagedFiles:
    """Read the store's window for the city and year and write one file per published role."""
    spec = ctx.spec.zarr
    assert spec is not None and ctx.year is not None
    collection = ctx.collection()
    asset = collection.assets.get(spec.asset)
    if asset is None:
        raise SourceReadError(
            f"{ctx.where(asset=spec.asset)}: collection {collection.id} has no such asset "
            f"(it has {sorted(collection.assets)})",
            reason="missing_asset",
        )
    open_kwargs = asset.extra_fields.get("xarray:open_kwargs") or {}
    consolidated = bool(open_kwargs.get("consolidated", spec.consolidated))
    window = _read_with_policy(ctx, asset.href, consolidated)

    by_role: dict[str, np.ndarray] = {}
    for variable in spec.variables:
        if variable.variable is not None:
            by_role[variable.role] = window.values[variable.variable]
        else:
            stack = np.stack([by_role[r] for r in variable.mean_of])
            by_role[variable.role] = stack.mean(axis=0)  # NaN wherever an input is NaN
    if not any(np.isfinite(v).any() for v in by_role.values()):
        raise SourceUnavailableError(
            f"{ctx.where(asset=spec.asset)}: the store has no value in the city window",
            reason="no_valid_pixels",
        )
    layers = [
        Layer(
            v.role,
            spec.file_name.format(role=v.role, aggregate=v.aggregate, year=ctx.year),
            spec.nodata,
            (v.role,),
            v.units,
            v.title,
            data=np.where(np.isfinite(by_role[v.role]), by_role[v.role], spec.nodata)[None].astype(
                np.float32
            ),
        )
        for v in spec.variables
    ]
    tags = {
        "SYNTHETIC": "false",
        "CITYCUBE_PRODUCT": ctx.spec.product,
        "CITYCUBE_CITY": ctx.city,
        "CITYCUBE_SOURCE_YEAR": str(ctx.year),
        "CITYCUBE_SOURCE": ctx.source_id,
    }
    for layer in layers:
        write_cog(staging / layer.filename, layer, window.grid, tags)
    href = asset.href.split("?", 1)[0]
    item_id = f"{ctx.spec.collection}_{ctx.year}_{ctx.city}"
    source = {
        "id": collection.id,
        "collection": collection.id,
        "self_href": None,
        "assets": {spec.asset: href},
        "time_index": window.time_index,
        "rows": list(window.rows),
        "cols": list(window.cols),
        "variables": {v.role: v.variable for v in spec.variables if v.variable},
    }
    derived = {v.role: f"mean of {', '.join(v.mean_of)}" for v in spec.variables if v.mean_of}
    write_provenance(
        staging / PROVENANCE_FILE,
        item_id=item_id,
        product=ctx.spec.product,
        city=ctx.city,
        source_year=ctx.year,
        grid=window.grid,
        layers=layers,
        sources=[source],
        properties={
            "citycube:source": ctx.source_id,
            "citycube:composite": "zarr_window",
            "citycube:derived_roles": derived,
            "citycube:unpublished_roles": dict(spec.unpublished),
        },
    )
    extra = {
        "item_id": item_id,
        "store": href,
        "time_index": window.time_index,
        "window_rows": f"{window.rows[0]}:{window.rows[1]}",
        "window_cols": f"{window.cols[0]}:{window.cols[1]}",
        "units": ", ".join(f"{v.role} {v.units}" for v in spec.variables),
        "nodata": str(spec.nodata),
        "stac_item_file": PROVENANCE_FILE,
        MISSING_ROLES_KEY: dict(spec.unpublished),
    }
    return StagedFiles(files={layer.role: layer.filename for layer in layers}, extra=extra)


def _read_with_policy(ctx: FetchContext, href: str, consolidated: bool) -> StoreWindow:
    """``read_window`` under the family's retry policy, its failures named and redacted."""
    asset_key = ctx.spec.zarr.asset if ctx.spec.zarr else None

    def attempt() -> StoreWindow:
        try:
            return read_window(ctx, href, consolidated)
        except (SourceUnavailableError, SourceReadError, CorruptStoreError):
            raise
        except DECODE_ERRORS as exc:
            # Codec failures (blosc, zlib, zstd), chunks of the wrong size, unreadable metadata.
            raise CorruptStoreError(f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:
            classified = _transient_or_fatal(exc)
            if classified is None:
                raise
            raise classified from None

    try:
        return ctx.policy.call(attempt)
    except TransientError as exc:
        raise SourceFetchError(
            f"{ctx.where(asset=asset_key)}: reading {href} kept failing within the retry "
            f"bounds: {ctx.signer.redact(str(exc))}",
            transient=True,
            reason="server_error",
        ) from None
    except aiohttp.ClientResponseError as exc:
        raise SourceFetchError(
            f"{ctx.where(asset=asset_key)}: {href} answered HTTP {exc.status} "
            f"({ctx.signer.redact(str(exc.message))}); a 403 usually means the SAS token was "
            "refused or expired",
            transient=False,
            reason="access_denied" if exc.status in (401, 403) else "server_error",
        ) from None
    except CorruptStoreError as exc:
        raise SourceReadError(
            f"{ctx.where(asset=asset_key)}: the Zarr store {href} could not be decoded "
            f"(corrupt chunk or metadata): {ctx.signer.redact(str(exc))}",
            reason="corrupt_asset",
        ) from None
    except SourceReadError as exc:
        raise SourceReadError(
            f"{ctx.where(asset=asset_key)}: {ctx.signer.redact(exc.message)}", reason=exc.reason
        ) from None
