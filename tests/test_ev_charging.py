"""EV charging cases: how ports are counted per tile and date from real AFDC files, the paper's
strata and counts, and the classification scorer with its constant-class baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyproj import Transformer

from citycube.errors import StationFileError
from citycube.grid.tiles import city_grid
from citycube.tasks import ev_charging as ev


def _lonlat(city: str, row: int, col: int) -> tuple[float, float]:
    grid = city_grid(city, "2km")
    x0, y0, x1, y1 = grid.tile(row, col).bounds
    lon, lat = Transformer.from_crs(grid.crs, "EPSG:4326", always_xy=True).transform(
        (x0 + x1) / 2, (y0 + y1) / 2
    )
    return float(lon), float(lat)


def _api(path: Path, stations: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"total_results": len(stations), "fuel_stations": stations}))
    return path


def _s(sid: int, where: tuple[float, float], opened: str | None, **kw: Any) -> dict[str, Any]:
    return {
        "id": sid,
        "fuel_type_code": "ELEC",
        "status_code": "E",
        "access_code": "public",
        "open_date": opened,
        "ev_level1_evse_num": None,
        "ev_level2_evse_num": 2,
        "ev_dc_fast_num": None,
        "latitude": where[1],
        "longitude": where[0],
        **kw,
    }


def test_counts_read_the_earliest_snapshot_on_or_after_each_date(tmp_path: Path) -> None:
    here = _lonlat("Boston", 4, 4)
    # 2023 snapshot: station 1 (2 ports) and station 2, which closes before 2024's snapshot
    old = _api(
        tmp_path / "a.json",
        [_s(1, here, "2021-01-01"), _s(2, here, "2022-01-01", ev_dc_fast_num=3)],
    )
    new = _api(
        tmp_path / "b.json",
        [
            _s(1, here, "2021-01-01", ev_level2_evse_num=4),  # grew after the 2023 snapshot
            _s(3, here, "2025-01-01", status_code="T"),  # temporarily unavailable: counted
            _s(4, here, None, status_code="P"),  # planned: never counted
            _s(5, here, "2020-01-01", fuel_type_code="CNG"),
        ],
    )
    snapshots = [
        ev.Snapshot(ev.PERIODS["t-3"], old),
        ev.Snapshot(ev.PERIODS["t"], new),
    ]
    ports = ev.tile_ports("Boston", snapshots).to_pandas()
    tile = ports[ports.tile_id == "Boston_2KM_r4_c4"].set_index("period")
    assert tile.loc["t-4", "ports"] == 2 + 2 + 3  # read from the 2023 snapshot
    assert tile.loc["t-3", "ports"] == 7
    assert tile.loc["t-2", "ports"] == 4  # the 2026 file: station 2 has closed
    assert tile.loc["t", "ports"] == 6 and tile.loc["t", "stations"] == 2


def test_unknown_is_null_with_a_reason_never_zero(tmp_path: Path) -> None:
    here, there = _lonlat("Boston", 1, 1), _lonlat("Boston", 2, 2)
    only = _api(
        tmp_path / "s.json",
        [
            _s(1, here, None),  # open, undated
            _s(2, there, "2020-01-01", ev_level2_evse_num=None),  # no port count
        ],
    )
    ports = ev.tile_ports("Boston", [ev.Snapshot(ev.PERIODS["t-2"], only)]).to_pandas()
    by = ports.set_index(["tile_id", "period"])
    assert by.loc[("Boston_2KM_r1_c1", "t-2")].reason == "station_without_open_date"
    assert by.loc[("Boston_2KM_r2_c2", "t-2")].reason == "station_without_port_count"
    assert by.loc[("Boston_2KM_r1_c1", "t")].reason == "no_snapshot_on_or_after_date"
    assert ports["ports"].isna().sum() == 6 + len(city_grid("Boston", "2km").tile_ids())
    assert by.loc[("Boston_2KM_r0_c0", "t-2")].ports == 0


def test_csv_download_headers_and_bad_values(tmp_path: Path) -> None:
    lon, lat = _lonlat("Boston", 3, 3)
    good = tmp_path / "good.csv"
    good.write_text(
        "Fuel Type Code,Station Name,Status Code,EV Level1 EVSE Num,EV Level2 EVSE Num,"
        "EV DC Fast Count,Latitude,Longitude,ID,Open Date,Access Code\n"
        f"ELEC,a,E,,3,1,{lat},{lon},7,06/30/2019,public\n"
    )
    frame = ev.read_station_file(good)
    assert frame.loc[0, "open_date"].isoformat() == "2019-06-30"
    assert frame.loc[0, "ev_dc_fast_num"] == 1
    bad = tmp_path / "bad.csv"
    bad.write_text(good.read_text().replace("06/30/2019", "June 2019"))
    with pytest.raises(StationFileError, match="open date 'June 2019'"):
        ev.read_station_file(bad)
    negative = tmp_path / "neg.csv"
    negative.write_text(good.read_text().replace(",3,1,", ",-3,1,"))
    with pytest.raises(StationFileError, match="not a count"):
        ev.read_station_file(negative)


def test_ranges_follow_table_15() -> None:
    assert [ev.range_of("Boston", c) for c in (-2, 0, 1, 5, 6, 10, 11)] == list("AABBCCD")
    assert [ev.range_of("NYC", c) for c in (0, 4, 5, 18, 19)] == list("ABCCD")
    assert [ev.range_of("SanFrancisco", c) for c in (0, 3, 4, 8, 9)] == list("ABCCD")
    totals = {r: sum(ev.ALLOCATION[c][r] for c in ev.CITIES) for r in ev.RANGES}
    assert totals == {"A": 38, "B": 38, "C": 37, "D": 37}
    assert all(sum(ev.ALLOCATION[c].values()) == 50 for c in ev.CITIES)


def _ports(city: str, changes: dict[str, int | None]) -> pa.Table:
    rows: dict[str, list[Any]] = {f.name: [] for f in ev.TILE_PORT_SCHEMA}
    for tile, change in changes.items():
        for period, when in ev.PERIODS.items():
            value = 10 if period != "t" else (None if change is None else 10 + change)
            rows["city"].append(city)
            rows["tile_id"].append(tile)
            rows["period"].append(period)
            rows["count_date"].append(when)
            rows["snapshot_date"].append(when)
            rows["stations"].append(None if value is None else 1)
            rows["ports_level1"].append(None if value is None else 0)
            rows["ports_level2"].append(value)
            rows["ports_dc_fast"].append(None if value is None else 0)
            rows["ports"].append(value)
            rows["reason"].append("station_without_open_date" if value is None else None)
    return pa.table(rows, schema=ev.TILE_PORT_SCHEMA)


def test_strata_take_hash_order_and_report_shortfalls() -> None:
    changes: dict[str, int | None] = {f"Boston_2KM_r0_c{i}": 0 for i in range(20)}
    changes |= {f"Boston_2KM_r1_c{i}": 3 for i in range(20)}
    changes |= {f"Boston_2KM_r2_c{i}": 7 for i in range(5)}  # C: 5 of 12
    changes |= {"Boston_2KM_r3_c0": None}
    case_set = ev.select_cases({"Boston": _ports("Boston", changes)}, {"NYC": "city outside"})
    counts = {(r["city"], r["range"]): r for r in case_set.counts.to_pylist()}
    assert counts[("Boston", "A")]["selected"] == 13 and counts[("Boston", "A")]["eligible"] == 20
    assert counts[("Boston", "C")]["selected"] == 5
    assert "only 5 eligible tiles" in counts[("Boston", "C")]["reason"]
    assert "1 station_without_open_date" in counts[("Boston", "C")]["reason"]
    assert counts[("Boston", "D")]["selected"] == 0
    assert counts[("NYC", "A")]["reason"] == "city outside"
    assert case_set.found() == {"Boston": 31, "NYC": 0, "SanFrancisco": 0}
    chosen = {r["tile_id"] for r in case_set.references.to_pylist() if r["range"] == "A"}
    order = sorted(changes, key=lambda t: ev._rank(0, "Boston", "A", t))
    assert chosen == set([t for t in order if changes[t] == 0][:13])
    # the visible table holds no reference
    assert "range" not in case_set.cases.column_names
    assert "net_change" not in case_set.cases.column_names
    again = ev.select_cases({"Boston": _ports("Boston", changes)}, {})
    assert again.references.equals(case_set.references)


def test_scorer_reproduces_the_papers_constant_class_baseline() -> None:
    reference = ["A"] * 38 + ["B"] * 38 + ["C"] * 37 + ["D"] * 37
    constant = ev.score(reference, ["A"] * 150)
    assert round(constant.accuracy * 100, 1) == 25.3
    assert round(constant.macro_f1, 3) == 0.101
    assert constant.balanced_accuracy == pytest.approx(0.25)
    assert constant.confusion[1] == [38, 0, 0, 0]
    mixed = ev.score(["A", "A", "B", "C"], ["A", "B", "B", "D"])
    # F1: A 2/3, B 2/3, C 0, D 0; recall A 1/2, B 1, C 0
    assert mixed.macro_f1 == pytest.approx((2 / 3 + 2 / 3) / 4)
    assert mixed.balanced_accuracy == pytest.approx(0.5)


def test_sample_twin_serves_the_real_formats_labelled_synthetic(tmp_path: Path) -> None:
    from citycube.errors import SourceUnavailableError
    from sources.sample.backend import SampleBackend

    backend = SampleBackend(seed=0)
    item = backend.fetch(ev.PRODUCT, "Boston", None, tmp_path / "a")
    again = SampleBackend(seed=0).fetch(ev.PRODUCT, "Boston", None, tmp_path / "b")
    assert item.synthetic and sorted(item.files) == [
        "snapshot_2022-09-30", "snapshot_2023-09-30", "snapshot_2024-09-30", "snapshot_2026-09-30",
    ]  # fmt: skip
    for role, path in item.files.items():
        assert Path(path).read_bytes() == Path(again.files[role]).read_bytes()
    csv_text = Path(item.files["snapshot_2024-09-30"]).read_text()
    assert csv_text.startswith("Fuel Type Code,") and ",synthetic" in csv_text.splitlines()[0]
    document = json.loads(Path(item.files["snapshot_2026-09-30"]).read_text())
    assert document["synthetic"] is True and document["fuel_stations"]
    ports = ev.tile_ports("Boston", ev.snapshot_roles(item.files))
    reasons = set(ports.column("reason").to_pylist()) - {None}
    assert reasons  # the twin has the real data's gaps
    case_set = ev.select_cases({"Boston": ports}, {"NYC": "x", "SanFrancisco": "y"})
    assert case_set.found()["Boston"] == 50
    with pytest.raises(SourceUnavailableError):
        backend.fetch(ev.PRODUCT, "Amsterdam", None, tmp_path / "a")
