"""The school-capacity reference source: capacity CSVs and a GIAS extract served over loopback
HTTP, downloaded, installed and joined by URN onto London's 2 km grid."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyproj import Transformer

from citycube.errors import SourceReadError
from citycube.grid.tiles import city_grid
from sources.dfe_schools import SchoolSourceOptions, fetch_school_item, item_records
from sources.dfe_schools.records import read_capacity_csv, read_school_files

CAPACITY_HEADER = (
    "time_period,time_identifier,geographic_level,country_code,country_name,region_code,"
    "region_name,new_la_code,la_name,urn,school_name,school_phase,school_capacity,"
    "number_of_pupils\n"
)
GIAS_HEADER = '"URN","EstablishmentName","PhaseOfEducation (name)","Easting","Northing"\r\n'
CHARING_CROSS_BNG = (530047, 180422)


def capacity_file(year: int, rows: list[tuple[int, str, str, str]]) -> bytes:
    period = f"{year}{(year + 1) % 100:02d}"
    lines = [CAPACITY_HEADER]
    lines.append(f"{period},Academic year,Regional,E92000001,England,E12000007,London,,,,,,z,z\n")
    for urn, phase, cap, pupils in rows:
        lines.append(
            f"{period},Academic year,School,E92000001,England,E12000007,London,E09000033,"
            f"Westminster,{urn},School {urn},{phase},{cap},{pupils}\n"
        )
    return "".join(lines).encode("utf-8")


def gias_file() -> bytes:
    e, n = CHARING_CROSS_BNG
    text = GIAS_HEADER + (
        f'"100001","St Mary’s Église School","Primary","{e}","{n}"\r\n'
        f'"100002","Far Away Academy","Secondary","{e + 200_000}","{n}"\r\n'
        '"100003","Unplaced School","Primary","",""\r\n'
    )
    return text.encode("cp1252")


def expected_tile(e: float, n: float) -> str:
    grid = city_grid("London", "2km")
    x, y = Transformer.from_crs("EPSG:27700", "EPSG:32630", always_xy=True).transform(e, n)
    row = int((grid.y_max - y) // grid.tile_size)
    col = int((x - grid.x_min) // grid.tile_size)
    return f"London_2KM_r{row}_c{col}"


def serve(root: Path) -> list[str]:
    files = {
        "capacity_2122.csv": capacity_file(2021, [(100001, "Primary", "420", "401")]),
        "capacity_2223.csv": capacity_file(
            2022, [(100001, "Primary", "420", "x"), (100002, "Secondary", "900", "870")]
        ),
        "capacity_2324.csv": capacity_file(
            2023, [(100001, "Primary", "420", "415"), (100004, "Primary", "210", "200")]
        ),
    }
    (root / "ees").mkdir()
    for name, body in files.items():
        (root / "ees" / name).write_bytes(body)
    (root / "gias").mkdir()
    (root / "gias" / "edubasealldata.csv").write_bytes(gias_file())
    return sorted(files)


def test_files_are_downloaded_installed_and_joined_onto_the_grid(
    tmp_path: Path, file_server: tuple[str, Path, Path]
) -> None:
    base, root, log = file_server
    names = serve(root)
    options = SchoolSourceOptions(
        capacity_urls=tuple(f"{base}/ees/{n}" for n in names),
        gias_url=f"{base}/gias/edubasealldata.csv",
        cache_dir=tmp_path / "cache",
        attempts=2,
        wait_initial_s=0.01,
    )
    item = fetch_school_item(options, "London", tmp_path / "sources")
    assert item.files["gias"].read_bytes() == gias_file()
    records = item_records(item, "London").to_pylist()
    by_key = {(r["urn"], r["academic_year"]): r for r in records}
    assert sorted(by_key) == [
        (100001, 2021),
        (100001, 2022),
        (100001, 2023),
        (100002, 2022),
        (100004, 2023),
    ]
    first = by_key[(100001, 2021)]
    assert first["name"] == "St Mary’s Église School"  # read as Windows-1252
    assert (first["phase"], first["capacity"], first["pupils"]) == ("primary", 420, 401)
    assert first["tile_id"] == expected_tile(*CHARING_CROSS_BNG)
    assert by_key[(100001, 2022)]["pupils"] is None  # suppressed, not zero
    assert by_key[(100002, 2022)]["location_reason"] == "outside_grid"
    assert by_key[(100002, 2022)]["tile_id"] is None
    assert by_key[(100004, 2023)]["location_reason"] == "not_in_gias"
    requests = log.read_text().splitlines()
    assert len(requests) == 4
    again = fetch_school_item(options, "London", tmp_path / "sources")
    assert again.directory == item.directory
    assert len(log.read_text().splitlines()) == 4  # cached and installed: nothing fetched


def test_a_file_without_the_capacity_columns_is_named(tmp_path: Path) -> None:
    path = tmp_path / "capacity.csv"
    path.write_text("time_period,urn,school_name\n202324,1,A\n", encoding="utf-8")
    with pytest.raises(SourceReadError) as err:
        read_capacity_csv(path)
    assert err.value.code == "CC201"
    assert "capacity.csv" in err.value.message and "school_capacity" in err.value.message


def test_a_bad_academic_year_and_a_repeated_urn_are_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "cap.csv"
    bad.write_bytes(capacity_file(2023, [(1, "Primary", "1", "1")]).replace(b"202324", b"2023"))
    with pytest.raises(SourceReadError, match="academic year"):
        read_capacity_csv(bad)
    good = tmp_path / "good.csv"
    good.write_bytes(capacity_file(2023, [(100001, "Primary", "420", "415")]))
    gias = tmp_path / "gias.csv"
    gias.write_bytes(gias_file() + b'"100001","Again","Primary","530000","180000"\r\n')
    with pytest.raises(SourceReadError, match="more than once"):
        read_school_files([good], gias, "London")


def test_a_missing_file_on_the_server_is_named_and_nothing_is_installed(
    tmp_path: Path, file_server: tuple[str, Path, Path]
) -> None:
    from citycube.errors import SourceFetchError

    base, root, _log = file_server
    names = serve(root)
    options = SchoolSourceOptions(
        capacity_urls=tuple(f"{base}/ees/{n}" for n in names),
        gias_url=f"{base}/gias/missing.csv",
        cache_dir=tmp_path / "cache",
        attempts=1,
    )
    with pytest.raises(SourceFetchError) as err:
        fetch_school_item(options, "London", tmp_path / "sources")
    assert err.value.code == "CC202"
    assert "dfe_school_capacity London" in err.value.message
    assert "missing.csv" in err.value.message
    assert not (tmp_path / "sources" / "dfe_school_capacity" / "London").exists()
