"""End to end from a loopback server: `citycube build` with ODIAC (CO2) and GHS-POP (POP) taken
from the ``http`` family and every other product from the sample, one city and two years.

The server holds format-faithful files (gzipped ODIAC months, zipped GHSL tiles on their real
lattices and names); the source-set file points the family's base URLs at it. The cube's
observations are compared with an independent computation over the served arrays: every tile is
sampled on a fine grid of points in its UTM CRS, each point looked up in the served cell it falls
in. A year ODIAC does not publish lands as NULL with its reason. Then the server answers 500 to
every request for another year's ODIAC files: that partition fails with an error naming the
file, while other partitions and the previously published cube stay as they were.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from pyproj import Geod, Transformer

from sources.http import http_adapters
from sources.http.base import HttpSource
from sources.http.spec import load_http_products
from tests.e2e_builds import run_build, write_source_set
from tests.faulty_http_server import Fault, FaultyServer
from tests.http_products_fixtures import (
    Patch,
    ghsl_tiles,
    gz,
    patch_around,
    patch_shape,
    tif_bytes,
    zipped,
)

pytestmark = pytest.mark.e2e(builds=3)

CITY = "Amsterdam"
YEARS = (2020, 2023)  # ODIAC over HTTP publishes 2000-2023 ...
MISSING_YEAR = 2024  # ... so 2024 is unavailable; GHS-POP serves epoch 2020 to all three
FAILING_YEAR = 2021
FAILING_EPOCH_YEAR = 2016
"""A year of epoch 2015, whose GHS-POP tiles answer 500: the build's first backfill (static
and 5-year products) fails there, while that year's ODIAC files are served."""
SPECS = load_http_products()
ASSETS = "sources/odiac,sources/ghs_pop,derived/co2,derived/pop,modalities/co2,modalities/pop,cube"
SAMPLES = 200
"""Points per tile side of the independent computation (10 m apart in a 2 km tile)."""


def _probe(product: str, base: str) -> HttpSource:
    (found,) = http_adapters({"products": [product], "base_urls": {product: base}})
    return found


def _rel(url: str) -> str:
    return url.split("/", 3)[3]


def serve_odiac(server: FaultyServer, year: int, faults: list[Fault] | None = None) -> list[Patch]:
    """Twelve gzipped monthly ODIAC GeoTIFFs around the city (some nodata cells)."""
    spec = SPECS["odiac"]
    rng = np.random.default_rng(year)
    transform = patch_around(CITY, spec, margin_cells=6)
    shape = patch_shape(CITY, spec, margin_cells=6)
    probe = _probe("odiac", server.url(""))
    months = []
    for month in range(1, 13):
        values = rng.gamma(0.8, 30.0, shape).astype(np.float32)
        values[rng.random(shape) < 0.01] = -9999.0
        months.append(Patch(transform, values))
        body = gz(tif_bytes(values, transform, "EPSG:4326", -9999.0))
        url = probe.url(spec.variables[0], year, mm=month)
        server.add(_rel(url), body, *(faults or []))
    return months


def serve_ghs_pop(server: FaultyServer, epoch: int, faults: list[Fault] | None = None) -> Patch:
    """The zipped 1 km GHS-POP tiles covering the city (persons per cell, some nodata)."""
    spec = SPECS["ghs_pop"]
    rng = np.random.default_rng(epoch)
    transform = patch_around(CITY, spec)
    shape = patch_shape(CITY, spec)
    values = rng.gamma(1.5, 2000.0, shape).astype(np.float32)
    values[rng.random(shape) < 0.03] = -200.0
    values[:2, :4] = 0.0  # zero people is a valid count
    patch = Patch(transform, values)
    probe = _probe("ghs_pop", server.url(""))
    for (row, col), (tile_t, block) in ghsl_tiles(spec, patch, -200.0).items():
        url = probe.url(spec.variables[0], epoch, row=row, col=col)
        stem = url.rsplit("/", 1)[1].removesuffix(".zip")
        body = zipped(f"{stem}.tif", tif_bytes(block, tile_t, spec.native_crs, -200.0))
        server.add(_rel(url), body, *(faults or []))
    return patch


# ------------------------------------------------------------- the independent computation


def _tiles(database: Path) -> list[tuple[str, int, float, float, float, float]]:
    with duckdb.connect(str(database), read_only=True) as con:
        return con.execute(
            "SELECT tile_id, epsg, utm_xmin, utm_ymin, utm_xmax, utm_ymax FROM tiles "
            "WHERE city = ? ORDER BY tile_id",
            [CITY],
        ).fetchall()


def _points(xmin: float, ymin: float, xmax: float, ymax: float) -> tuple[np.ndarray, np.ndarray]:
    """Centres of SAMPLES x SAMPLES equal sub-squares of a tile (each stands for equal area)."""
    fx = (np.arange(SAMPLES) + 0.5) / SAMPLES
    xs, ys = np.meshgrid(xmin + fx * (xmax - xmin), ymin + fx * (ymax - ymin))
    return xs.ravel(), ys.ravel()


def _cells(patch: Patch, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = patch.transform
    cols = np.floor((x - t.c) / t.a).astype(int)
    rows = np.floor((y - t.f) / t.e).astype(int)
    assert (cols >= 0).all() and (rows >= 0).all()
    assert (rows < patch.values.shape[0]).all() and (cols < patch.values.shape[1]).all()
    return rows, cols


def expected_pop(database: Path, patch: Patch) -> dict[str, tuple[float | None, float]]:
    """tile -> (area-weighted mean density of valid cells or None, valid share)."""
    out: dict[str, tuple[float | None, float]] = {}
    for tile, epsg, *bounds in _tiles(database):
        x, y = Transformer.from_crs(epsg, "ESRI:54009", always_xy=True).transform(*_points(*bounds))
        rows, cols = _cells(patch, np.asarray(x), np.asarray(y))
        values = patch.values[rows, cols].astype(np.float64)
        valid = values != -200.0
        share = float(valid.mean())
        # persons per 1 km² cell are persons/km²; Mollweide cells have equal areas.
        out[tile] = (float(values[valid].mean()) if share >= 0.5 else None, share)
    return out


def expected_co2(database: Path, months: list[Patch]) -> dict[str, tuple[float | None, float]]:
    """tile -> (tonne C per km² per year from valid cells or None, valid share)."""
    stack = np.stack([m.values.astype(np.float64) for m in months])
    annual = stack.sum(axis=0)
    annual[(stack == -9999.0).any(axis=0)] = np.nan  # a cell missing a month has no year
    patch = Patch(months[0].transform, annual)
    t = patch.transform
    geod = Geod(ellps="WGS84")
    rows_n = annual.shape[0]
    cell_km2 = np.empty(rows_n)
    for r in range(rows_n):  # the ellipsoidal area of a cell of each patch row
        top, bottom = t.f + r * t.e, t.f + (r + 1) * t.e
        lons = [t.c, t.c + t.a, t.c + t.a, t.c]
        area, _ = geod.polygon_area_perimeter(lons, [bottom, bottom, top, top])
        cell_km2[r] = abs(area) / 1e6
    out: dict[str, tuple[float | None, float]] = {}
    for tile, epsg, *bounds in _tiles(database):
        xmin, ymin, xmax, ymax = bounds
        tile_km2 = (xmax - xmin) * (ymax - ymin) / 1e6
        lon, lat = Transformer.from_crs(epsg, 4326, always_xy=True).transform(*_points(*bounds))
        rows, cols = _cells(patch, np.asarray(lon), np.asarray(lat))
        values = annual[rows, cols]
        valid = np.isfinite(values)
        share = float(valid.mean())
        point_km2 = tile_km2 / SAMPLES**2
        # Each point carries its area's share of its cell's total; the sum over the nominal area.
        total = float(np.sum(values[valid] * point_km2 / cell_km2[rows[valid]]))
        out[tile] = (total / tile_km2 if share >= 0.5 else None, share)
    return out


# ----------------------------------------------------------------------------- the builds


@pytest.fixture(scope="module")
def server() -> Iterator[FaultyServer]:
    with FaultyServer() as running:
        yield running


@pytest.fixture(scope="module")
def served(server: FaultyServer) -> dict[str, Any]:
    odiac = {year: serve_odiac(server, year) for year in YEARS}
    # Every request for the failing year's months answers 500, past every retry bound.
    serve_odiac(server, FAILING_YEAR, faults=[Fault(status=500)] * 200)
    serve_odiac(server, FAILING_EPOCH_YEAR)
    serve_ghs_pop(server, 2015, faults=[Fault(status=500)] * 200)
    return {"odiac": odiac, "ghs_pop": serve_ghs_pop(server, 2020)}


@pytest.fixture(scope="module")
def root(
    tmp_path_factory: pytest.TempPathFactory, server: FaultyServer, served: dict[str, Any]
) -> Path:
    base = tmp_path_factory.mktemp("e2e_http")
    source_set = {
        "name": "http-loopback",
        "default": "sample",
        "products": {"odiac": "http", "ghs_pop": "http"},
        "options": {
            "sample": {"seed": 0},
            "http": {
                "products": ["odiac", "ghs_pop"],
                "base_urls": {"odiac": server.url(""), "ghs_pop": server.url("")},
                "cache_dir": str(base / "downloads"),
                "attempts": 2,
                "wait_initial_s": 0.01,
                "wait_max_s": 0.05,
                "timeout_s": 10.0,
            },
        },
    }
    write_source_set(base, source_set)
    return base


def _build(root: Path, years: str) -> subprocess.CompletedProcess[str]:
    return run_build(root, "http-e2e", CITY, years, ASSETS)


@pytest.fixture(scope="module")
def first_build(root: Path) -> dict[str, Any]:
    years = ",".join(str(y) for y in (*YEARS, MISSING_YEAR))
    done = _build(root, years)
    assert done.returncode == 0, done.stdout + done.stderr
    release = root / "data" / "releases" / "http-e2e"
    return {"release": release, "database": release / "cube.duckdb", "out": done.stdout}


def _observations(database: Path, modality: str, year: int) -> dict[str, tuple[Any, ...]]:
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.execute(
            "SELECT tile_id, value, valid_fraction, available, reason, source_id, "
            "source_version, synthetic, temporal_basis, source_year FROM observations "
            "WHERE city = ? AND modality = ? AND year = ?",
            [CITY, modality, year],
        ).fetchall()
    return {row[0]: row[1:] for row in rows}


def _compare(got: dict[str, tuple[Any, ...]], want: dict[str, tuple[float | None, float]]) -> int:
    """Asserts value and support of every tile; returns how many tiles are available."""
    assert set(got) == set(want) and len(got) == 152  # 140 tiles of 2 km, 12 of 5 km
    available = 0
    for tile, (value, support) in want.items():
        got_value, got_support, got_available = got[tile][:3]
        assert got_support == pytest.approx(support, abs=5e-3), tile
        if value is None:
            assert got_value is None and not got_available, tile
            continue
        available += 1
        assert got_available, tile
        assert got_value == pytest.approx(value, rel=5e-3), tile
    return available


def test_co2_and_pop_equal_an_independent_computation_over_the_served_files(
    first_build: dict[str, Any], served: dict[str, Any]
) -> None:
    database = first_build["database"]
    for year in YEARS:
        co2 = _observations(database, "CO2", year)
        assert _compare(co2, expected_co2(database, served["odiac"][year])) > 140
        assert {r[4:9] for r in co2.values()} == {
            ("http:odiac", "ODIAC2024", False, "annual", year)
        }
        pop = _observations(database, "POP", year)
        assert _compare(pop, expected_pop(database, served["ghs_pop"])) > 140
        assert {r[4:9] for r in pop.values()} == {
            ("http:ghs_pop", "R2023A V1-0", False, "epoch", 2020)
        }


def test_a_year_odiac_does_not_publish_is_null_with_its_reason(
    first_build: dict[str, Any], server: FaultyServer
) -> None:
    co2 = _observations(first_build["database"], "CO2", MISSING_YEAR)
    assert len(co2) == 152
    assert {(r[0], r[2], r[3]) for r in co2.values()} == {(None, False, "source_year_missing")}
    assert not server.requests_for(f"odiac2024/1km_tiff/{MISSING_YEAR}/")  # never asked for
    assert not any(f"/{MISSING_YEAR}/" in r.path for r in server.requests)
    pop = _observations(first_build["database"], "POP", MISSING_YEAR)
    assert sum(r[2] for r in pop.values()) > 140  # epoch 2020 serves 2024


def test_release_records_the_http_sources(first_build: dict[str, Any]) -> None:
    import json

    meta = json.loads((first_build["release"] / "release.json").read_text(encoding="utf-8"))
    assert meta["source_set"] == "http-loopback"
    assert meta["sources"]["odiac"]["source_id"] == "http:odiac"
    assert meta["sources"]["ghs_pop"]["synthetic"] is False
    assert meta["sources"]["landsat_c2l2"]["source_id"].startswith("sample:")


def test_a_product_failing_past_its_retries_fails_its_partition_only(
    first_build: dict[str, Any], root: Path, server: FaultyServer
) -> None:
    database: Path = first_build["database"]
    published = hashlib.sha256(database.read_bytes()).hexdigest()
    observations = first_build["release"] / "published" / "observations" / f"city={CITY}"
    before = {p: p.stat().st_mtime_ns for p in observations.rglob("*.parquet")}

    done = _build(root, str(FAILING_YEAR))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "odiac2024_1km_excl_intl_2101.tif.gz" in out and "HTTP 500" in out, out
    assert f"{CITY}|{FAILING_YEAR}" in out, out
    failing = server.requests_for(
        f"odiac2024/1km_tiff/{FAILING_YEAR}/odiac2024_1km_excl_intl_2101.tif.gz"
    )
    assert len(failing) >= 4  # the download manager's attempts, then the asset's retries

    # The published cube and every earlier partition are untouched.
    assert hashlib.sha256(database.read_bytes()).hexdigest() == published
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert not (observations / f"year={FAILING_YEAR}" / "CO2.parquet").exists()
    assert not (root / "data" / "sources" / "odiac" / CITY / str(FAILING_YEAR)).exists()
    # POP of that year reads epoch 2020, which did not fail, but its observations are in the
    # same run as the failed fetch step, whose later steps Dagster skips: not written (a rerun
    # writes them); nothing of that city-year is published.
    draft = first_build["release"] / ".draft" / "observations" / f"city={CITY}"
    assert not (draft / f"year={FAILING_YEAR}" / "POP.parquet").exists()
    assert not (observations / f"year={FAILING_YEAR}").exists()
    # The published database shows only what it published: neither the failed CO2 year nor
    # that year's POP.
    assert _observations(database, "CO2", FAILING_YEAR) == {}
    assert _observations(database, "POP", FAILING_YEAR) == {}
    assert len(_observations(database, "POP", 2020)) == 152


def test_a_failing_epoch_product_fails_only_what_reads_it(
    first_build: dict[str, Any], root: Path
) -> None:
    """The first backfill fails on GHS-POP's epoch; the second tries it once more and still
    builds the year's CO2, which does not read it."""
    done = _build(root, str(FAILING_EPOCH_YEAR))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "(1/2: static and 5-year products)" in out and "(2/2: city-years and the cube)" in out
    assert "ghs_pop" in out and "HTTP 500" in out, out
    assert f"{CITY}|2015" in out, out
    draft = first_build["release"] / ".draft" / "observations" / f"city={CITY}"
    assert (draft / f"year={FAILING_EPOCH_YEAR}" / "CO2.parquet").is_file()
    assert not (draft / f"year={FAILING_EPOCH_YEAR}" / "POP.parquet").exists()
    assert not (root / "data" / "sources" / "ghs_pop" / CITY / "2015").exists()
