"""The source protocol: source sets from specs, per-product adapters, provenance from the
adapter, the shared staging helper and remote hrefs read through GDAL."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from affine import Affine

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.errors import SourceReadError, SpecError, UnknownProductError
from citycube.grid.tiles import city_grid
from citycube.items.protocol import SourceItem, SourceSet, is_remote, parse_source_set_spec
from citycube.items.rasters import open_raster
from citycube.items.staging import COMPLETE_MARKER, StagedFiles, install_item, installed_item
from citycube.processing.compute import process_partition
from sources import build_source_set, load_source_set
from sources.sample import SampleBackend
from tests.conftest import LocalFilesProduct, write_tif

CITY = "Amsterdam"
CAT = load_catalogue()


# ---- source sets ---------------------------------------------------------------------------


def test_default_source_set_serves_every_product_from_the_sample() -> None:
    sources = load_source_set()
    assert sources.name == "sample" and sources.synthetic
    assert set(sources.products()) >= {p for m in CAT.enabled() for p in m.products()}
    assert sources.provenance()["odiac"]["source_id"] == "sample:odiac"


def test_a_spec_picks_a_family_per_product_and_rejects_unknown_names() -> None:
    spec = parse_source_set_spec("name: t\ndefault: sample\noptions: {sample: {seed: 4}}\n")
    sources = build_source_set(spec)
    assert sources.product("odiac").seed == 4  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match="unknown adapter families"):
        build_source_set(parse_source_set_spec("name: t\ndefault: nowhere\n"))
    with pytest.raises(SpecError, match="unknown product ids"):
        parse_source_set_spec("name: t\ndefault: sample\nproducts: {modis: sample}\n")
    with pytest.raises(SpecError, match="unknown sample options"):
        build_source_set(
            parse_source_set_spec("name: t\ndefault: sample\noptions: {sample: {x: 1}}")
        )
    with pytest.raises(UnknownProductError, match="'modis'"):
        sources.product("modis")


def test_provenance_comes_from_each_products_adapter(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    """CO2 from a non-synthetic adapter, DEM from the sample: each row says who served it."""
    grid = city_grid(CITY, "2km")
    xmin, ymin, xmax, ymax = grid.bounds
    # A lon/lat raster covering the city, as ODIAC is published.
    from pyproj import Transformer

    lon0, lat1 = Transformer.from_crs(32631, 4326, always_xy=True).transform(xmin, ymax)
    lon1, lat0 = Transformer.from_crs(32631, 4326, always_xy=True).transform(xmax, ymin)
    step = 1 / 120
    width, height = int((lon1 - lon0) / step) + 20, int((lat1 - lat0) / step) + 20
    odiac = tif_writer(
        "odiac.tif",
        np.full((height, width), 50.0, np.float32),
        crs="EPSG:4326",
        transform=Affine(step, 0, lon0 - 10 * step, 0, -step, lat1 + 10 * step),
    )
    files = LocalFilesProduct(
        "odiac",
        {(CITY, 2020): {"data": odiac}},
        synthetic=False,
        source_id="files:odiac",
        version="v2022",
    )
    sample = SampleBackend()
    mixed = SourceSet([files, sample.product("cop_dem_glo30")], name="mixed")
    release = Release(tmp_path / "data", "t")
    process_partition(CAT.get("CO2"), CAT, CITY, 2020, mixed, release)
    process_partition(CAT.get("DEM"), CAT, CITY, 2020, mixed, release)
    co2 = pq.read_table(release.observations_file(CITY, 2020, "CO2")).to_pylist()
    dem = pq.read_table(release.observations_file(CITY, 2020, "DEM")).to_pylist()
    assert {(r["source_id"], r["source_version"], r["synthetic"]) for r in co2} == {
        ("files:odiac", "v2022", False)
    }
    assert {(r["source_id"], r["synthetic"]) for r in dem} == {("sample:cop_dem_glo30", True)}
    meta = pq.read_schema(release.observations_file(CITY, 2020, "CO2")).metadata
    assert meta[b"citycube:synthetic"] == b"false"
    assert mixed.synthetic and mixed.provenance()["odiac"]["synthetic"] is False


def test_unpublished_years_carry_the_adapters_provenance(tmp_path: Path) -> None:
    files = LocalFilesProduct("odiac", {}, synthetic=False, source_id="files:odiac")
    release = Release(tmp_path / "data", "t")
    process_partition(CAT.get("CO2"), CAT, CITY, 2020, SourceSet([files]), release)
    rows = pq.read_table(release.observations_file(CITY, 2020, "CO2")).to_pylist()
    assert {(r["source_id"], r["synthetic"], r["reason"]) for r in rows} == {
        ("files:odiac", False, "outside_source_coverage")
    }


# ---- items ---------------------------------------------------------------------------------


def test_items_hold_local_paths_or_remote_hrefs(tmp_path: Path) -> None:
    local = tmp_path / "a.tif"
    local.write_bytes(b"x")
    item = SourceItem(
        "odiac",
        CITY,
        2020,
        {"data": local, "qa": "/vsicurl/https://example.org/qa.tif"},
        "files:odiac",
        "v1",
        False,
    )
    assert item.local_path("data") == local and is_remote(item.href("qa"))
    with pytest.raises(SourceReadError, match="needs a local file"):
        item.local_path("qa")
    with pytest.raises(SourceReadError, match="no 'coverage' file"):
        item.href("coverage")
    before = item.fingerprint
    local.write_bytes(b"xy")
    again = SourceItem("odiac", CITY, 2020, dict(item.files), "files:odiac", "v1", False)
    assert again.fingerprint != before  # changed files, changed fingerprint


# ---- staging -------------------------------------------------------------------------------


def _writer(calls: list[int], content: bytes = b"data") -> Callable[[Path], StagedFiles]:
    def write(staging: Path) -> StagedFiles:
        calls.append(1)
        (staging / "a.bin").write_bytes(content)
        return StagedFiles(files={"data": "a.bin"}, extra={"n": len(calls)})

    return write


def test_install_once_then_reuse_until_the_identity_changes(tmp_path: Path) -> None:
    final = tmp_path / "p" / "Amsterdam" / "2020"
    calls: list[int] = []
    first = install_item(final, {"version": "1"}, _writer(calls))
    second = install_item(final, {"version": "1"}, _writer(calls))
    assert len(calls) == 1 and first.fingerprint == second.fingerprint
    third = install_item(final, {"version": "2"}, _writer(calls, b"new"))
    assert len(calls) == 2 and third.fingerprint != first.fingerprint
    assert (final / "a.bin").read_bytes() == b"new"
    assert sorted(os.listdir(final.parent)) == ["2020"]


def test_a_failed_writer_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    final = tmp_path / "item"

    def broken(staging: Path) -> StagedFiles:
        (staging / "a.bin").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        install_item(final, {"version": "1"}, broken)
    assert not final.exists() and list(tmp_path.iterdir()) == []
    # A dead writer's staging directory is swept by the next install.
    dead = tmp_path / f".item.tmp-{2**22 + 7}-{'0' * 32}"
    dead.mkdir()
    install_item(final, {"version": "1"}, _writer([]))
    assert not dead.exists()
    record = json.loads((final / COMPLETE_MARKER).read_text())
    assert record["files"] == {"data": "a.bin"} and record["version"] == "1"
    (final / "a.bin").unlink()  # a record whose files are gone is not an item
    assert installed_item(final, {"version": "1"}) is None


def test_an_item_changed_after_install_is_made_again(tmp_path: Path) -> None:
    final = tmp_path / "city_electricity" / "Boston" / "2020"
    rows = "".join(f"b{i},{i * 10}\n" for i in range(1000)).encode()
    calls: list[int] = []

    def writer(staging: Path) -> StagedFiles:
        calls.append(1)
        (staging / "records.csv").write_bytes(b"building,kwh\n" + rows)
        return StagedFiles({"data": "records.csv"})

    item = install_item(final, {"version": "1"}, writer)
    whole = item.files["data"].read_bytes()
    record = json.loads((final / COMPLETE_MARKER).read_text())
    assert record["checksums"]["records.csv"]["bytes"] == len(whole)

    item.files["data"].write_bytes(whole[: len(whole) // 2])  # cut in half
    assert installed_item(final, {"version": "1"}) is None
    again = install_item(final, {"version": "1"}, writer)
    assert len(calls) == 2 and again.files["data"].read_bytes() == whole

    garbled = bytearray(whole)
    garbled[len(garbled) // 3] ^= 0x04  # same size, one bit
    again.files["data"].write_bytes(bytes(garbled))
    install_item(final, {"version": "1"}, writer)
    assert len(calls) == 3 and again.files["data"].read_bytes() == whole

    del record["checksums"]  # a record from before checksums were kept is trusted as before
    (final / COMPLETE_MARKER).write_text(json.dumps(record))
    assert installed_item(final, {"version": "1"}) is not None


def test_other_processes_trust_a_verified_state_and_hash_a_changed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file verified once is not read again by a later process while it stays in the state
    it was verified in; rewritten, even at the same size with its mtime put back, it is."""
    import os
    import time

    import citycube.items.staging as staging

    final = tmp_path / "odiac" / "Boston" / "2020"
    payload = bytes(range(256)) * 64

    def writer(staging_dir: Path) -> StagedFiles:
        (staging_dir / "odiac.tif").write_bytes(payload)
        return StagedFiles({"data": "odiac.tif"})

    install_item(final, {"version": "1"}, writer)
    hashed: list[str] = []
    real = staging.file_sha256

    def counting(path: Path) -> str:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(staging, "file_sha256", counting)
    monkeypatch.setattr(staging, "_verified", {})  # as in another worker process
    assert installed_item(final, {"version": "1"}) is not None
    assert hashed == []  # the state recorded at install vouches for the file

    path = final / "odiac.tif"
    before = path.stat()
    time.sleep(0.02)  # past a coarse clock tick, so the rewrite gets a change time of its own
    garbled = bytearray(payload)
    garbled[100] ^= 0x10
    path.write_bytes(bytes(garbled))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    monkeypatch.setattr(staging, "_verified", {})
    assert installed_item(final, {"version": "1"}) is None
    assert hashed == ["odiac.tif"]


def test_a_damaged_installed_file_names_its_item_directory_as_the_fix(tmp_path: Path) -> None:
    final = tmp_path / "sources" / "odiac" / "Boston" / "2020"

    def writer(staging: Path) -> StagedFiles:
        (staging / "odiac.tif").write_bytes(b"II*\x00 truncated")
        return StagedFiles({"data": "odiac.tif"})

    item = install_item(final, {"version": "1"}, writer)
    with pytest.raises(SourceReadError, match="corrupt or truncated") as raised:
        open_raster(item.files["data"])
    assert f"delete its item directory {final} and re-run its source asset" in str(raised.value)
    loose = tmp_path / "loose.tif"
    loose.write_bytes(b"not a tiff")
    with pytest.raises(
        SourceReadError, match="re-run its source asset to fetch it again"
    ) as raised:
        open_raster(loose)
    assert "delete" not in str(raised.value)  # not the pipeline's file: no path to delete


# ---- remote reads --------------------------------------------------------------------------


def test_a_remote_cog_is_read_by_windows_over_http(
    tmp_path: Path, file_server: tuple[str, Path, Path]
) -> None:
    base, served, request_log = file_server
    co2 = CAT.get("CO2").model_copy(update={"product": "test_co2"})
    xmin, _, _, ymax = city_grid(CITY, "2km").bounds
    data = np.arange(200 * 280, dtype=np.float32).reshape(200, 280) % 97
    local = write_tif(
        served / "odiac.tif", data, crs="EPSG:32631", transform=Affine(100, 0, xmin, 0, -100, ymax)
    )
    url = f"{base}/odiac.tif"
    results = {}
    for name, href in (("local", local), ("remote", f"/vsicurl/{url}")):
        adapter = LocalFilesProduct("test_co2", {(CITY, 2020): {"data": href}})
        release = Release(tmp_path / name, "t")
        process_partition(co2, CAT, CITY, 2020, SourceSet([adapter]), release)
        rows = pq.read_table(release.observations_file(CITY, 2020, "CO2")).to_pylist()
        results[name] = {(r["tile_id"], r["value"]) for r in rows}
    assert results["remote"] == results["local"]
    requests = request_log.read_text(encoding="utf-8").splitlines()
    ranged = [r for r in requests if r.startswith("GET /odiac.tif bytes=")]
    assert ranged, f"GDAL read the remote file without range requests: {requests}"


def test_a_missing_remote_file_is_a_fetch_error(
    tmp_path: Path, file_server: tuple[str, Path, Path]
) -> None:
    from citycube.errors import SourceFetchError

    co2 = CAT.get("CO2").model_copy(update={"product": "test_co2"})
    url = f"{file_server[0]}/missing.tif"
    adapter = LocalFilesProduct("test_co2", {(CITY, 2020): {"data": f"/vsicurl/{url}"}})
    with pytest.raises(SourceFetchError, match="cannot read remote raster"):
        process_partition(co2, CAT, CITY, 2020, SourceSet([adapter]), Release(tmp_path / "d", "t"))
