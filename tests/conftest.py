"""Shared fixtures: small real GeoTIFFs served by a local-files backend."""

from __future__ import annotations

import os

# The open calendar grows every 15 January; the suite runs on a fixed day so that what it
# expects does not change with the date it runs on (tests of other days set their own).
os.environ.setdefault("CITYCUBE_TODAY", "2026-12-06")

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine

from citycube.errors import SourceUnavailableError
from citycube.items.protocol import SourceInfo, SourceItem, SourceProduct, SourceSet
from tests.stac_fixtures import stac_world  # noqa: F401  (loopback STAC services, per session)


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


class LocalFilesProduct(SourceProduct):
    """Serves hand-made files of one product: {(city, year): {role: path}}."""

    def __init__(
        self,
        product_id: str,
        items: dict[tuple[str, int | None], dict[str, Path]],
        *,
        synthetic: bool = True,
        source_id: str | None = None,
        version: str = "t1",
        extra: dict[str, str] | None = None,
    ) -> None:
        self.items = items
        self.extra = extra or {}
        self.info = SourceInfo(
            product_id=product_id,
            source_id=source_id or f"test:{product_id}",
            version=version,
            synthetic=synthetic,
            licence="test fixture",
            attribution="tests",
        )

    def source_years(self, city: str) -> list[int] | None:
        years = [y for c, y in self.items if c == city]
        return None if years == [None] else sorted(y for y in years if y is not None)

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        if (city, source_year) not in self.items:
            raise SourceUnavailableError(f"no test item {(self.product_id, city, source_year)}")
        return SourceItem(
            product=self.product_id,
            city=city,
            source_year=source_year,
            files=self.items[(city, source_year)],
            source_id=self.info.source_id,
            version=self.info.version,
            synthetic=self.info.synthetic,
            extra=dict(self.extra),
        )


def LocalFilesBackend(
    items: dict[tuple[str, str, int | None], dict[str, Path]],
    *,
    synthetic: bool = True,
    extra: dict[str, dict[str, str]] | None = None,
) -> SourceSet:
    """A source set of hand-made files: {(product, city, year): {role: path}}; ``extra``:
    item metadata by product (e.g. a records file's declared counts)."""
    by_product: dict[str, dict[tuple[str, int | None], dict[str, Path]]] = {}
    for (product, city, year), files in items.items():
        by_product.setdefault(product, {})[(city, year)] = files
    adapters = [
        LocalFilesProduct(product, files, synthetic=synthetic, extra=(extra or {}).get(product))
        for product, files in by_product.items()
    ]
    return SourceSet(adapters, name="local-test")


@pytest.fixture
def tif_writer(tmp_path: Path) -> Callable[..., Path]:
    """Write GeoTIFFs under tmp_path by name."""

    def _write(name: str, data: np.ndarray, **kwargs: object) -> Path:
        return write_tif(tmp_path / "src" / name, data, **kwargs)  # type: ignore[arg-type]

    return _write


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """A loopback HTTP file server with Range support, in its own process (GDAL holds the
    GIL while it reads, so an in-process server would deadlock): (base URL, served folder,
    request log file)."""
    from tests.http_file_server import serving

    root = tmp_path / "served"
    root.mkdir()
    log = tmp_path / "requests.log"
    with serving(root, log) as url:
        yield url, root, log


def materialize_keys(
    definitions: object,
    keys: list[str],
    partition: str | None = None,
    *,
    resources: dict[str, object],
    instance: object | None = None,
    tags: dict[str, str] | None = None,
    raise_on_error: bool = True,
) -> object:
    """Materialise some assets of a Definitions (by 'group/name' keys) for one partition."""
    import dagster as dg

    graph = definitions.resolve_asset_graph()  # type: ignore[attr-defined]
    asset_keys = [dg.AssetKey(k.split("/")) for k in keys]
    partition_key: str | None = partition
    partitions = graph.get(asset_keys[0]).partitions_def
    if partition is not None and isinstance(partitions, dg.MultiPartitionsDefinition):
        partition_key = partitions.get_partition_key_from_str(partition)
    return dg.materialize(
        list(definitions.assets),  # type: ignore[attr-defined]
        selection=dg.AssetSelection.assets(*asset_keys),
        partition_key=partition_key,
        resources=resources,
        instance=instance or dg.DagsterInstance.ephemeral(),
        tags=tags,
        raise_on_error=raise_on_error,
    )


BAD_INPUT_KINDS = ("clear", "handled")
"""How the bad-input suite's cases end: refused with a clear coded error, or handled (the
input absorbed without loss, e.g. an untrusted item made again)."""


def _builds(item: pytest.Item) -> int:
    """Whole builds an end-to-end test (or its module's fixture) runs; -1 for other tests."""
    marker = item.get_closest_marker("e2e")
    return -1 if marker is None else int(marker.kwargs.get("builds", 0))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the files that run the most builds first, and carry each bad-input case's kind
    into its reports (they cross xdist workers).

    ``make test`` hands whole files to its workers (``--dist loadfile``, so a module's build
    fixture runs once) in this order (``--no-loadscope-reorder``: xdist would otherwise order
    files by their number of tests, the single-test build files last): the longest files start
    first and the short tests fill in behind them.
    """
    weight: dict[Path, int] = {}
    for item in items:
        weight[item.path] = max(weight.get(item.path, -1), _builds(item))
    items.sort(key=lambda item: -weight[item.path])  # stable: files keep their order
    for item in items:
        marker = item.get_closest_marker("bad_input")
        if marker is not None:
            kind = marker.args[0] if marker.args else ""
            if kind not in BAD_INPUT_KINDS:
                raise pytest.UsageError(
                    f"{item.nodeid}: bad_input kind {kind!r} is not one of {BAD_INPUT_KINDS}"
                )
            item.user_properties.append(("bad_input", kind))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Count the bad-input cases that ran, by kind and outcome."""
    counts: dict[tuple[str, str], int] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            kind = dict(getattr(report, "user_properties", ())).get("bad_input")
            if kind is None or (report.when != "call" and outcome == "passed"):
                continue
            counts[(kind, outcome)] = counts.get((kind, outcome), 0) + 1
    if not counts:
        return
    parts = []
    for kind in BAD_INPUT_KINDS:
        outcomes = {o: n for (k, o), n in counts.items() if k == kind}
        detail = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
        parts.append(f"{sum(outcomes.values())} {kind} ({detail or 'none run'})")
    total = sum(counts.values())
    terminalreporter.write_sep("-", f"bad-input cases: {total} = " + " + ".join(parts))
