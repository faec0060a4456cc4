"""Unit tests of the STAC family's pure parts: pixel rules, grids, specs, signing, selection."""

from __future__ import annotations

import json
import warnings
from datetime import UTC, datetime, timedelta

import numpy as np
import pystac
import pytest
from pyproj import CRS

from citycube.errors import SpecError
from sources.stac import pixels
from sources.stac.grids import landsat_grid, y_shift_into
from sources.stac.landsat import select_scenes
from sources.stac.retrying import RetryPolicy, TransientError, is_transient_gdal_message
from sources.stac.signing import HrefSigner
from sources.stac.spec import (
    Signing,
    StacProductSpec,
    load_stac_catalogue,
    parse_stac_catalogue,
)

NAN = np.float32(np.nan)


def test_qa_mask_rejects_each_invalid_bit_and_keeps_water() -> None:
    mask = load_stac_catalogue().product("landsat_c2l2").qa.mask  # type: ignore[union-attr]
    clear_l8 = 21824
    qa = np.array(
        [clear_l8, 1, *(clear_l8 | bit for bit in (2, 4, 8, 16, 32, 128))],
        dtype=np.uint16,
    )
    assert pixels.qa_clear(qa, mask).tolist() == [True] + [False] * 6 + [True]


def test_scaling_applies_raster_bands_and_fill_becomes_nan() -> None:
    dn = np.array([0, 7273, 43636], dtype=np.uint16)
    values = pixels.scale_dn(dn, 0.0000275, -0.2, fill_value=0)
    assert np.isnan(values[0])
    np.testing.assert_allclose(values[1:], [0.0000075, 1.00000], atol=1e-5)
    kelvin = pixels.scale_dn(np.array([44000], dtype=np.uint16), 0.00341802, 149.0)
    np.testing.assert_allclose(kelvin, [299.39288], atol=1e-3)


def test_median_and_mean_composites_skip_unclear_and_leave_empty_pixels_nan() -> None:
    stack = np.array(
        [[1.0, NAN, NAN], [3.0, 2.0, NAN], [10.0, 4.0, NAN], [NAN, NAN, NAN]], dtype=np.float32
    )
    np.testing.assert_array_equal(pixels.median_composite(stack), [3.0, 3.0, NAN])
    np.testing.assert_allclose(pixels.mean_composite(stack), [14 / 3, 3.0, np.nan], rtol=1e-6)
    assert pixels.clear_count(stack).tolist() == [3, 2, 0]
    with pytest.raises(ValueError, match="at least one"):
        pixels.median_composite(np.empty((0, 2), dtype=np.float32))


def test_the_median_composite_equals_numpy_nanmedian_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    for observations in (1, 2, 5, 12):
        stack = (rng.random((observations, 60, 70)) * 0.7 - 0.2).astype(np.float32)
        stack[rng.random(stack.shape) < 0.45] = NAN  # odd, even and zero clear counts
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.nanmedian(stack, axis=0).astype(np.float32)
        composite = pixels.median_composite(stack)
        assert composite.dtype == np.float32
        np.testing.assert_array_equal(composite, expected)


def test_ndvi_is_invalid_where_the_sum_is_not_positive() -> None:
    red = np.array([0.1, 0.2, -0.05, NAN], dtype=np.float32)
    nir = np.array([0.5, 0.2, 0.01, 0.3], dtype=np.float32)
    out = pixels.ndvi(red, nir)
    np.testing.assert_allclose(out[:2], [0.4 / 0.6, 0.0], rtol=1e-6)
    assert np.isnan(out[2]) and np.isnan(out[3])


def test_ndvi_refuses_ratios_outside_minus_1_to_1_from_negative_reflectance() -> None:
    """One negative band with a positive sum gives a ratio outside [−1, 1]: refused."""
    red = np.array([0.02, -0.019, 0.0, 0.3], dtype=np.float32)
    nir = np.array([-0.019, 0.02, 0.4, 0.0], dtype=np.float32)
    out = pixels.ndvi(red, nir)
    assert np.isnan(out[0]) and np.isnan(out[1])
    np.testing.assert_array_equal(out[2:], [1.0, -1.0])


def test_reflectance_outside_the_valid_range_is_known_to_the_sr_products() -> None:
    catalogue = load_stac_catalogue()
    for product in ("landsat_c2l2", "landsat_ndvi"):
        assert catalogue.product(product).valid_range == (0.0, 1.0)
    # Collection 2's valid counts 7273–43636 are exactly the reflectances in [0, 1].
    dn = np.array([7272, 7273, 43636, 43637], dtype=np.uint16)
    reflectance = pixels.scale_dn(dn, 0.0000275, -0.2)
    assert pixels.in_range(reflectance, 0.0, 1.0).tolist() == [False, True, True, False]


def test_reflectance_maps_to_uint8_by_a_fixed_range_with_0_for_nodata() -> None:
    refl = np.array([NAN, -0.1, 0.0, 0.15, 0.3, 0.9], dtype=np.float32)
    assert pixels.reflectance_to_uint8(refl, 0.0, 0.3).tolist() == [0, 1, 1, 128, 255, 255]
    # The same reflectance gives the same byte wherever it is (no per-tile stretch).
    dim = pixels.reflectance_to_uint8(np.array([0.15, 0.16], dtype=np.float32), 0.0, 0.3)
    assert dim[0] == 128


def test_composite_qa_and_nodata_conversion() -> None:
    valid = np.array([True, False])
    assert pixels.composite_qa(valid).tolist() == [64, 1]
    out = pixels.to_nodata(np.array([1.5, np.nan], dtype=np.float32), -9999, "float32")
    assert out.tolist() == [1.5, -9999.0]


def test_landsat_grid_matches_the_collection_2_lattice_north_and_south() -> None:
    boston = landsat_grid("Boston")
    assert boston.transform.c % 30 == 15 and boston.transform.f % 30 == 15
    cape = landsat_grid("CapeTown")
    # 326xx northings are negative and on odd multiples of 15 m; +10,000 km moves them 10 m.
    assert (cape.transform.f - 10_000_000) % 30 == 15
    assert y_shift_into(CRS.from_epsg(32634), CRS.from_epsg(32734)) == 10_000_000
    assert y_shift_into(CRS.from_epsg(32619), CRS.from_epsg(32619)) == 0
    assert y_shift_into(CRS.from_epsg(32618), CRS.from_epsg(32619)) is None


def _item(item_id: str, platform: str, cover: float | None) -> pystac.Item:
    props = {"platform": platform}
    if cover is not None:
        props["eo:cloud_cover"] = cover
    return pystac.Item(
        item_id, None, None, datetime(2020, 6, 1, tzinfo=UTC) + timedelta(days=1), props
    )


def test_scene_selection_filters_platform_and_cloud_then_keeps_the_least_cloudy() -> None:
    spec = load_stac_catalogue().product("landsat_c2l2")
    items = [
        _item("a", "landsat-8", 40.0),
        _item("b", "landsat-8", 5.0),
        _item("c", "landsat-1", 0.0),
        _item("d", "landsat-7", 70.0),
        _item("e", "landsat-9", None),
        _item("f", "landsat-9", 10.0),
    ]
    chosen = select_scenes(items, spec, max_cloud_cover=60, max_scenes=3)
    assert [i.id for i in chosen] == ["b", "f", "a"]
    assert [i.id for i in select_scenes(items, spec, 60, 10)][-1] == "e"


def test_platform_names_match_whatever_their_case_and_form() -> None:
    """USGS's own STAC says 'LANDSAT_7' where the Planetary Computer says 'landsat-7'."""
    spec = load_stac_catalogue().product("landsat_st")
    items = [
        _item("a", "LANDSAT_8", 5.0),
        _item("b", "Landsat 7", 6.0),
        _item("c", "landsat9", 7.0),
        _item("d", "LANDSAT_1", 1.0),
    ]
    assert [i.id for i in select_scenes(items, spec, 60, 10)] == ["a", "b", "c"]
    (thermal,) = spec.bands
    assert [thermal.asset_for(p) for p in ("LANDSAT_7", "landsat_5", "LANDSAT_8")] == [
        "lwir",
        "lwir",
        "lwir11",
    ]


def test_spec_rejects_inconsistent_products() -> None:
    text = """
api_url: http://x
signing: none
products:
  - product: landsat_ndvi
    collection: c
    version: v
    licence: l
    attribution: a
    temporal: annual
    first_year: 2000
    last_year: 2001
    recipe: ndvi
    bands: [{name: red, asset: red}]
    qa: {asset: qa_pixel, invalid_bits: [0]}
    scale_source: raster:bands
    output: {dtype: float32, nodata: -9999, units: "1", band_descriptions: [ndvi], title: t}
"""
    with pytest.raises(SpecError, match="reads bands"):
        parse_stac_catalogue(text)
    with pytest.raises(SpecError, match="bit positions"):
        parse_stac_catalogue(text.replace("invalid_bits: [0]", "invalid_bits: [16]"))


def test_spec_checks_a_zarr_store_entry() -> None:
    """A Zarr entry's roles: each from a variable (with its store units) or averaged from roles
    listed before it; none both written and declared unpublished; no bands, qa or output."""
    daymet = load_stac_catalogue().product("daymet")
    assert daymet.zarr is not None
    assert [v.role for v in daymet.zarr.variables] == ["tmin", "tmax", "tmean", "prcp"]
    assert daymet.zarr.unpublished == {
        "srad": "variable_not_published",
        "rh": "variable_not_published",
    }
    entry = daymet.model_dump(mode="json")
    bad = json.loads(json.dumps(entry))
    bad["zarr"]["variables"][2]["mean_of"] = ["tmin", "vp"]
    with pytest.raises(ValueError, match="not listed before it"):
        StacProductSpec.model_validate(bad)
    bad = json.loads(json.dumps(entry))
    bad["zarr"]["unpublished"]["tmin"] = "variable_not_published"
    with pytest.raises(ValueError, match="both written and unpublished"):
        StacProductSpec.model_validate(bad)
    bad = json.loads(json.dumps(entry))
    bad["zarr"]["variables"][0]["store_units"] = None
    with pytest.raises(ValueError, match="store_units"):
        StacProductSpec.model_validate(bad)
    bad = json.loads(json.dumps(entry))
    bad["zarr"] = None
    with pytest.raises(ValueError, match="needs a zarr store spec"):
        StacProductSpec.model_validate(bad)


def test_signer_leaves_foreign_hrefs_mirrors_and_redacts() -> None:
    policy = RetryPolicy(1, 1.0, 0.0, 0.0)
    signer = HrefSigner(
        Signing.NONE, policy, mirror={"https://a.example/": "http://127.0.0.1:9/a/"}
    )
    assert signer.sign("https://a.example/x.tif") == "http://127.0.0.1:9/a/x.tif"
    assert signer.sign("https://b.example/x.tif") == "https://b.example/x.tif"
    message = "failed /vsicurl/http://h/x.tif?st=1&sig=SECRET: 500"
    assert "SECRET" not in signer.redact(message)


def test_retry_policy_retries_transient_failures_only() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransientError("503")
        return "ok"

    assert RetryPolicy(5, 10.0, 0.0, 0.0).call(flaky) == "ok"
    assert len(calls) == 3
    with pytest.raises(TransientError):
        RetryPolicy(2, 10.0, 0.0, 0.0).call(lambda: (_ for _ in ()).throw(TransientError("x")))
    assert is_transient_gdal_message("HTTP response code: 503")
    assert not is_transient_gdal_message("HTTP response code: 416")


def test_the_planetary_computer_source_set_picks_the_stac_family() -> None:
    from pathlib import Path

    from sources import load_source_set

    path = Path(__file__).resolve().parents[1] / "schemas/source_sets/planetary-computer.yaml"
    sources = load_source_set(path)
    for product in ("landsat_c2l2", "landsat_ndvi", "landsat_st", "cop_dem_glo30", "daymet"):
        info = sources.product(product).info
        assert info.source_id.startswith("pc:") and not info.synthetic
    assert sources.product("odiac").info.synthetic
    assert sources.product("chelsa").info.synthetic  # the fallback of daymet stays on sample
    assert sources.source_years("landsat_st", "Boston") == list(range(2000, 2026))
    assert sources.source_years("cop_dem_glo30", "Boston") is None
    assert sources.source_years("daymet", "Boston") == list(range(1980, 2021))
    assert sources.source_years("daymet", "Tokyo") == []
