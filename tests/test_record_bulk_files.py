"""Bulk record files over a loopback server: the NSW Valuer General's yearly sales archives
(zips of weekly zips of ``.DAT`` files with A/B/C/D/Z records) and a DESNZ-style xlsx workbook
(one sheet per year, notes above a header broken over lines). Files are written here, served
over HTTP and read by the ``records`` connectors; tile values are compared with hand
computations, and a truncated archive or workbook fails naming source, city, year and file with
nothing installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import shapely
import yaml

from citycube.errors import SourceReadError
from citycube.items.staging import COMPLETE_MARKER
from citycube.processing.records import place_records, tile_values
from sources.records import records_adapters
from tests.glc_globfp_fixtures import zip_of
from tests.record_files import CityTiles, b_record, dat_file, workbook_bytes
from tests.record_portals import RecordPortals

CITY = "Sydney"
SYDNEY = CityTiles(CITY)
GRID = SYDNEY.grid
EPSG = GRID.epsg


def write_specs(path: Path, *entries: dict[str, Any]) -> Path:
    base = {"licence": "test licence", "attribution": "test portal", "portal": "loopback"}
    path.write_text(yaml.safe_dump({"records": [{**base, **e} for e in entries]}), "utf-8")
    return path


def adapters(tmp_path: Path, spec_file: Path) -> dict[str, Any]:
    options = {
        "spec_file": str(spec_file),
        "cache_dir": str(tmp_path / "downloads"),
        "attempts": 2,
        "wait_initial_s": 0.01,
        "wait_max_s": 0.05,
        "timeout_s": 10.0,
    }
    return {a.product_id: a for a in records_adapters(options)}


@pytest.fixture
def portals() -> Iterator[RecordPortals]:
    with RecordPortals() as running:
        yield running


# ------------------------------------------------------------------ NSW property sales (.DAT)


POSTCODES = {"2000": (5, 5), "2010": (5, 6)}
"""Postcode -> the 2 km tile whose centre is its centroid; 2999 is in no table."""


def serve_psi(portals: RecordPortals) -> None:
    """2020.zip holds weekly zips (as 2015-on archives do); 2021.zip holds .DAT files in a
    folder (as 2001-2014 archives do) and a sale of 2020 lodged in 2021."""
    week1 = dat_file(
        "20200106",
        b_record(100, 1, "20200106", "2000", "20200102", "1000000"),
        b_record(101, 2, "20200106", "2000", "20200303", "1500000"),
        b_record(102, 3, "20200106", "2010", "20200404", "800000"),
        b_record(103, 4, "20200106", "2999", "20200505", "700000"),  # unknown postcode
        b_record(104, 5, "20200106", "2010", "20191230", "999"),  # a contract of 2019
        b_record(105, 6, "20200106", "2010", "20200606", "0"),  # $0: not a market sale
        "B;001;106;7;20200106 01:07;;;9;SHORT ST",  # malformed: cut short
        "X;001;junk",  # malformed: no such record type
        b_record(109, 8, "20200106", "2000", "2020-07-07", "5"),  # malformed: contract date
        "B;001;ARCHIVE;123/456;;1;MAIN ST;SYDNEY;2000;01/02/1999;100000",  # pre-2001 format
    )
    week2 = dat_file(  # sale 101 published again a week later with its corrected price
        "20200113", b_record(101, 1, "20200113", "2000", "20200303", "1600000")
    )
    portals.files["psi/2020.zip"] = zip_of(
        {
            "20200106.zip": zip_of({"001_SALES_DATA_NNME_06012020.DAT": week1}),
            "20200113.zip": zip_of({"001_SALES_DATA_NNME_13012020.DAT": week2}),
        }
    )
    portals.files["psi/2021.zip"] = zip_of(
        {
            "2021/001_SALES_DATA_NNME_04012021.DAT": dat_file(
                "20210104",
                b_record(107, 1, "20210104", "2010", "20201215", "900000"),
                b_record(108, 2, "20210104", "2010", "20210301", "1200000"),
            ),
            "2021/readme.txt": b"not a sales file",
        }
    )
    table = "postcode,locality,long,lat\n" + "".join(
        f"{code},X,{SYDNEY.centre_lonlat(*tile)[0]},{SYDNEY.centre_lonlat(*tile)[1]}\n"
        for code, tile in POSTCODES.items()
    )
    portals.files["australian_postcodes.csv"] = table.encode()
    portals.files["coverage.geojson"] = SYDNEY.block_geojson(range(4, 8), range(4, 8))


def psi_spec(portals: RecordPortals) -> dict[str, Any]:
    return {
        "city": CITY,
        "product": "city_property",
        "protocol": "nsw_psi_dat",
        "endpoint": portals.url("/files/psi/{year}.zip"),
        "fields": {"value": "purchase_price", "year": "contract_date", "postcode": "post_code"},
        "spatial_form": "postcode",
        "points_table": {
            "href": portals.url("/files/australian_postcodes.csv"),
            "key": "postcode",
            "lon": "long",
            "lat": "lat",
        },
        "coverage": portals.url("/files/coverage.geojson"),
        "min_value": 1,
        "unit": "AUD",
        "currency": "AUD",
        "years": [2020, 2021],
    }


def test_psi_archives_give_the_hand_computed_tile_means_and_count_what_they_leave_out(
    tmp_path: Path, portals: RecordPortals
) -> None:
    serve_psi(portals)
    source = adapters(tmp_path, write_specs(tmp_path / "s.yaml", psi_spec(portals)))
    item = source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    extra = item.extra
    assert extra["psi_archives"] == "2020.zip 2021.zip" and extra["psi_archives_missing"] == ""
    assert extra["psi_dat_files"] == "3" and extra["psi_other_members"] == "1"
    assert extra["psi_malformed_lines"] == "3"
    examples = extra["psi_malformed_examples"]
    assert "2020.zip > 20200106.zip > 001_SALES_DATA_NNME_06012020.DAT:" in examples
    assert "9 fields" in examples and "'X'" in examples and "'2020-07-07'" in examples
    assert extra["psi_archive_format_records"] == "1"
    assert extra["psi_duplicate_sales_dropped"] == "1"
    # Sales of 2020: 100, 101 (the later copy), 102, 103, 105 ($0), 107 (lodged in 2021).
    assert extra["psi_other_contract_years"] == "2"  # 104 of 2019, 108 of 2021
    assert extra["records"] == "6" and extra["blank_values"] == "1"
    assert extra["unmatched_keys"] == "1" and extra["unmatched_examples"] == "2999"
    assert extra["unmatched_records"] == "1"

    placed = place_records(item, EPSG, 2020)
    assert placed.ingest is not None
    assert placed.ingest.unmatched == 1 and placed.ingest.unmatched_examples == ("2999",)
    assert placed.ingest.used == 4
    tiles = tile_values(placed, GRID, total=False)
    assert tiles.value[SYDNEY.index(5, 5)] == pytest.approx((1_000_000 + 1_600_000) / 2)
    assert tiles.value[SYDNEY.index(5, 6)] == pytest.approx((800_000 + 900_000) / 2)
    assert tiles.support[SYDNEY.index(5, 5)] == pytest.approx(1.0, abs=1e-4)
    assert tiles.support[SYDNEY.index(0, 0)] == 0.0  # outside the declared coverage


def test_a_later_archive_not_yet_published_is_named_not_fatal(
    tmp_path: Path, portals: RecordPortals
) -> None:
    serve_psi(portals)
    source = adapters(tmp_path, write_specs(tmp_path / "s.yaml", psi_spec(portals)))
    item = source["city_property"].fetch(CITY, 2021, tmp_path / "sources")
    assert item.extra["psi_archives"] == "2021.zip"
    assert item.extra["psi_archives_missing"] == "2022.zip (404)"
    tiles = tile_values(place_records(item, EPSG, 2021), GRID, total=False)
    assert tiles.value[SYDNEY.index(5, 6)] == pytest.approx(1_200_000)


def test_a_truncated_psi_archive_names_source_city_year_and_file_and_installs_nothing(
    tmp_path: Path, portals: RecordPortals
) -> None:
    serve_psi(portals)
    whole = portals.files["psi/2020.zip"]
    portals.files["psi/2020.zip"] = whole[: len(whole) * 2 // 3]
    source = adapters(tmp_path, write_specs(tmp_path / "s.yaml", psi_spec(portals)))
    with pytest.raises(SourceReadError) as raised:
        source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    message = str(raised.value)
    for part in ("records:city_property", CITY, "2020", "2020.zip", "truncated"):
        assert part in message, message
    assert not list((tmp_path / "sources").rglob(COMPLETE_MARKER))
    assert not list((tmp_path / "sources").rglob("records.parquet"))
    # The damaged archive is not served from the cache again: a repaired one is read.
    portals.files["psi/2020.zip"] = whole
    item = source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    assert item.extra["records"] == "6"


def _cut_before_trailer(data: bytes) -> bytes:
    """A weekly file cut short: its last two records (a D record and the Z trailer) gone."""
    return b"\r\n".join(data.rstrip(b"\r\n").split(b"\r\n")[:-2]) + b"\r\n"


def _sale_dropped(data: bytes) -> bytes:
    """A weekly file one B record short, its trailer unchanged (a line lost in copying)."""
    lines = data.split(b"\r\n")
    first_b = next(i for i, line in enumerate(lines) if line.startswith(b"B;"))
    return b"\r\n".join(lines[:first_b] + lines[first_b + 1 :])


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (_cut_before_trailer, "does not end with its Z trailer"),
        (_sale_dropped, "holds 9 records, its Z trailer states [10, 2]"),
    ],
)
def test_a_weekly_file_cut_short_or_missing_a_record_is_refused_by_its_trailer(
    tmp_path: Path, portals: RecordPortals, damage, said: str
) -> None:
    """The zip is intact (CRCs match), so only the Z trailer's counts show the loss."""
    serve_psi(portals)
    week = dat_file(
        "20210104",
        *(b_record(110 + i, i, "20210104", "2010", "20200301", "9") for i in range(1, 3)),
    )
    assert week.rstrip().endswith(b";2;")  # Z;<total records>;<B records>;
    member = "2021/001_SALES_DATA_NNME_04012021.DAT"
    portals.files["psi/2021.zip"] = zip_of({member: damage(week)})
    source = adapters(tmp_path, write_specs(tmp_path / "s.yaml", psi_spec(portals)))
    with pytest.raises(SourceReadError) as raised:
        source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    message = str(raised.value)
    for part in ("records:city_property", CITY, "2020", f"2021.zip > {member}", said):
        assert part in message, message
    assert not list((tmp_path / "sources").rglob(COMPLETE_MARKER))


# ---------------------------------------------------------------------- DESNZ-style xlsx


UNITS = {"E01000001": (6, 6), "E01000002": (6, 7)}


def serve_xlsx(portals: RecordPortals) -> None:
    rows_2020 = [
        ["E09000001", "E01000001", 1000, 4_000_000.0, 4000.0],
        ["E09000001", "E01000002", 250, 1_000_000.0, 4000.0],
        ["E09000001", "E01000003", 100, 500_000.0, 5000.0],  # no boundary: unmatched
    ]
    rows_2019 = [["E09000001", "E01000001", 900, 3_600_000.0, 4000.0]]
    portals.files["LSOA_domestic_elec_2010-2020.xlsx"] = workbook_bytes(
        {"2019": (5, rows_2019), "2020": (7, rows_2020)}
    )
    x0, y0, x1, y1 = SYDNEY.box(6, 6)
    units = {
        "E01000001": shapely.box(x0, y0, x1, y1),
        "E01000002": shapely.box(x1, y0, x1 + 2000.0, y0 + 1000.0),  # south half of r6c7
    }
    portals.files["lsoa.geojson"] = SYDNEY.polygons_geojson(units, "LSOA21CD")


def xlsx_spec(portals: RecordPortals) -> dict[str, Any]:
    return {
        "city": CITY,
        "product": "city_electricity",
        "protocol": "bulk_xlsx",
        "endpoint": portals.url("/files/LSOA_domestic_elec_2010-2020.xlsx"),
        "xlsx": {"sheet": "{year}"},
        "fields": {"value": "Total consumption (kWh)", "unit_id": "LSOA code"},
        "spatial_form": "admin_unit",
        "units_table": {"href": portals.url("/files/lsoa.geojson"), "key": "LSOA21CD"},
        "unit": "kWh/year",
        "years": [2019, 2020, 2021],
    }


def test_xlsx_sheet_of_the_year_is_apportioned_to_tiles_by_hand(
    tmp_path: Path, portals: RecordPortals
) -> None:
    serve_xlsx(portals)
    source = adapters(tmp_path, write_specs(tmp_path / "s.yaml", xlsx_spec(portals)))
    electricity = source["city_electricity"]
    item = electricity.fetch(CITY, 2020, tmp_path / "sources")
    assert item.extra["sheet"] == "2020" and item.extra["header_row"] == "7"
    assert item.extra["records"] == "4" and item.extra["blank_values"] == "1"  # the footnote
    placed = place_records(item, EPSG, 2020)
    assert placed.ingest is not None and placed.ingest.unmatched == 1
    tiles = tile_values(placed, GRID, total=True)
    # kWh per nominal km²
    assert tiles.value[SYDNEY.index(6, 6)] == pytest.approx(4_000_000 / 4.0)
    assert tiles.value[SYDNEY.index(6, 7)] == pytest.approx(1_000_000 / 4.0)
    assert tiles.support[SYDNEY.index(6, 7)] == pytest.approx(0.5, abs=1e-4)
    assert tiles.support[SYDNEY.index(0, 0)] == 0.0

    earlier = electricity.fetch(CITY, 2019, tmp_path / "sources")
    assert earlier.extra["header_row"] == "5"
    tiles = tile_values(place_records(earlier, EPSG, 2019), GRID, total=True)
    assert tiles.value[SYDNEY.index(6, 6)] == pytest.approx(3_600_000 / 4.0)
    workbook = [s for s in portals.seen if s.path.endswith(".xlsx")]
    assert len(workbook) == 1  # one download serves every year

    with pytest.raises(SourceReadError, match=r"no sheet '2021' \(it has \['2019', '2020'\]\)"):
        electricity.fetch(CITY, 2021, tmp_path / "sources")


def test_a_truncated_workbook_names_source_city_year_and_file_and_installs_nothing(
    tmp_path: Path, portals: RecordPortals
) -> None:
    serve_xlsx(portals)
    name = "LSOA_domestic_elec_2010-2020.xlsx"
    portals.files[name] = portals.files[name][:1500]
    source = adapters(tmp_path, write_specs(tmp_path / "s.yaml", xlsx_spec(portals)))
    with pytest.raises(SourceReadError) as raised:
        source["city_electricity"].fetch(CITY, 2020, tmp_path / "sources")
    message = str(raised.value)
    for part in ("records:city_electricity", CITY, "2020", name, "dropped from the download"):
        assert part in message, message
    assert not list((tmp_path / "sources").rglob(COMPLETE_MARKER))
    assert not list((tmp_path / "sources").rglob("records.parquet"))


def test_bulk_file_specs_are_checked_on_load(portals: RecordPortals, tmp_path: Path) -> None:
    from citycube.errors import SpecError
    from sources.records.spec import load_record_products

    xlsx = {k: v for k, v in xlsx_spec(portals).items() if k != "xlsx"}
    with pytest.raises(SpecError, match="bulk_xlsx needs an xlsx layout"):
        load_record_products(write_specs(tmp_path / "a.yaml", xlsx))
    one_sheet = {**xlsx_spec(portals), "xlsx": {"sheet": "Data"}}
    with pytest.raises(SpecError, match="needs a year field"):
        load_record_products(write_specs(tmp_path / "b.yaml", one_sheet))
    yearless = {**psi_spec(portals), "endpoint": portals.url("/files/psi/all.zip")}
    with pytest.raises(SpecError, match=r"nsw_psi_dat needs \{year\}"):
        load_record_products(write_specs(tmp_path / "c.yaml", yearless))
    bad_sheet = {**xlsx_spec(portals), "xlsx": {"sheet": "{year} {city}"}}
    with pytest.raises(SpecError, match=r"only \{year\} may be filled in"):
        load_record_products(write_specs(tmp_path / "d.yaml", bad_sheet))
    # Postcodes locate the records, not the area they report on: every tile would be outside.
    uncovered = {k: v for k, v in psi_spec(portals).items() if k != "coverage"}
    with pytest.raises(SpecError, match="postcode records need a coverage polygon"):
        load_record_products(write_specs(tmp_path / "e.yaml", uncovered))
    load_record_products(write_specs(tmp_path / "f.yaml", psi_spec(portals)))


def test_a_declared_header_row_without_the_fields_fails_naming_what_it_holds(
    tmp_path: Path, portals: RecordPortals
) -> None:
    serve_xlsx(portals)
    spec = {**xlsx_spec(portals), "xlsx": {"sheet": "{year}", "header_row": 5}}
    source = adapters(tmp_path, write_specs(tmp_path / "s.yaml", spec))
    with pytest.raises(SourceReadError, match=r"no header row with .* in row 5; its first rows"):
        source["city_electricity"].fetch(CITY, 2020, tmp_path / "sources")  # header on row 7
    assert source["city_electricity"].fetch(CITY, 2019, tmp_path / "sources")
