"""Availability report: counts over the release's city-years, 'not processed' flags, files."""

from __future__ import annotations

import math
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.errors import ReleaseNotFoundError
from citycube.reports.availability import (
    HEATMAP_COLOURS,
    HEATMAP_WIDTH_PX,
    city_table,
    field_table,
    heatmap_png,
    load_availability,
    modality_table,
    write_report,
)
from tests.test_render import build_small_release

CAT = load_catalogue()
N_MODALITIES = len(CAT.modalities)


def _tiny_database(path: Path) -> Path:
    """observations + release with the real names: 3 city-years, OPT / AQ / POP processed.

    Amsterdam 2020: OPT (one of two tiles) available, AQ not (only one of its two fields).
    Amsterdam 2021: OPT present but unavailable. Boston 2020: OPT available, POP unavailable.
    """
    rows = [
        ("Amsterdam_2KM_r0_c0", "Amsterdam", 2020, "OPT", "red", True),
        ("Amsterdam_2KM_r0_c1", "Amsterdam", 2020, "OPT", "red", False),
        ("Amsterdam_2KM_r0_c0", "Amsterdam", 2020, "AQ", "annual_mean_no2", False),
        ("Amsterdam_2KM_r0_c0", "Amsterdam", 2020, "AQ", "annual_mean_pm25", True),
        ("Amsterdam_2KM_r0_c0", "Amsterdam", 2021, "OPT", "red", False),
        ("Boston_2KM_r0_c0", "Boston", 2020, "OPT", "red", True),
        ("Boston_2KM_r0_c0", "Boston", 2020, "POP", "population_density", False),
    ]
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE obs (tile_id VARCHAR, city VARCHAR, year SMALLINT, modality VARCHAR, "
        "field VARCHAR, available BOOLEAN)"
    )
    con.executemany("INSERT INTO obs VALUES (?, ?, ?, ?, ?, ?)", rows)
    con.execute("CREATE VIEW observations AS SELECT * FROM obs")
    con.execute("CREATE TABLE release (key VARCHAR, value VARCHAR)")
    con.execute("INSERT INTO release VALUES ('version', '\"tiny\"'), ('synthetic', 'true')")
    con.close()
    return path


@pytest.fixture
def tiny(tmp_path: Path):
    return load_availability(_tiny_database(tmp_path / "cube.duckdb"))


def test_scope_is_the_city_years_in_the_release(tiny) -> None:
    assert tiny.scope == {("Amsterdam", 2020), ("Amsterdam", 2021), ("Boston", 2020)}
    assert tiny.cities == ["Amsterdam", "Boston"] and tiny.years == [2020, 2021]
    assert tiny.processed == {"OPT", "AQ", "POP"}
    assert (tiny.release, tiny.synthetic) == ("tiny", True)


def test_modality_table_counts_any_tile_but_every_field(tiny) -> None:
    table = modality_table(tiny, CAT).set_index("code")
    assert len(table) == N_MODALITIES + 1
    assert table.loc["OPT", ["available", "possible", "percent"]].tolist() == [2, 3, 66.667]
    # AgenticCity-Bench Table 10's AQ count: a city-year with NO2 but no PM2.5 (or the reverse) is
    # not
    # available.
    assert table.loc["AQ", ["available", "percent", "processed"]].tolist() == [0, 0.0, True]
    assert table.loc["POP", ["available", "processed"]].tolist() == [0, True]
    not_processed = table[table["processed"] == False]  # noqa: E712  (nullable boolean)
    assert len(not_processed) == N_MODALITIES - 3 and (not_processed["available"] == 0).all()
    assert table.loc["H&F", "modality"] == "Building height & footprint"
    overall = table.iloc[-1]
    assert overall["modality"] == "Overall" and pd.isna(overall["processed"])
    assert (overall["available"], overall["possible"]) == (2, 3 * N_MODALITIES)
    assert overall["percent"] == round(100 * 2 / (3 * N_MODALITIES), 3)


def test_field_table_shows_which_field_holds_a_modality_back(tiny) -> None:
    table = field_table(tiny, CAT)
    rows = {(r.code, r.field): (r.available, r.possible) for r in table.itertuples()}
    assert rows == {
        ("OPT", "red"): (2, 3),
        ("AQ", "annual_mean_no2"): (0, 3),
        ("AQ", "annual_mean_pm25"): (1, 3),
        ("POP", "population_density"): (0, 3),
    }
    order = [m.code for m in CAT.modalities if m.code in {"OPT", "AQ", "POP"}]
    assert list(dict.fromkeys(table["code"])) == order  # catalogue order, fields by name


def test_tables_accept_the_database_path(tmp_path: Path) -> None:
    path = _tiny_database(tmp_path / "cube.duckdb")
    from_path = modality_table(path, CAT)
    pd.testing.assert_frame_equal(from_path, modality_table(load_availability(path), CAT))
    assert city_table(path, CAT).iloc[-1]["available"] == 2


def test_city_table_counts_over_all_modalities(tiny) -> None:
    table = city_table(tiny, CAT).set_index("key")
    assert table.loc["Amsterdam", ["available", "possible"]].tolist() == [1, 2 * N_MODALITIES]
    assert table.loc["Boston", ["available", "possible"]].tolist() == [1, N_MODALITIES]
    assert table.loc["Boston", "percent"] == round(100 / N_MODALITIES, 3)
    assert table.loc["Amsterdam", "city"] == "Amsterdam"
    overall = table.iloc[-1]
    assert (overall["city"], overall["available"], overall["possible"]) == (
        "Overall",
        2,
        3 * N_MODALITIES,
    )


def test_empty_release_reports_zero_possible(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "e.duckdb"))
    con.execute(
        "CREATE VIEW observations AS SELECT 'x' AS city, 2020 AS year, 'OPT' AS modality, "
        "'red' AS field, true AS available WHERE false"
    )
    availability = load_availability(con)
    con.close()
    table = modality_table(availability, CAT)
    assert (table["possible"] == 0).all() and table["percent"].isna().all()
    assert city_table(availability, CAT)["city"].tolist() == ["Overall"]


def test_heatmap_has_fixed_colours_and_a_readable_size(tiny, tmp_path: Path) -> None:
    path = heatmap_png(tmp_path / "heat.png", tiny, CAT)
    image = Image.open(path).convert("RGB")
    width, height = image.size
    assert width == HEATMAP_WIDTH_PX and 500 <= height <= 3000
    colours = {tuple(c) for c in np.asarray(image).reshape(-1, 3).tolist()}
    assert set(HEATMAP_COLOURS.values()) <= colours


# --------------------------------------------------------------------------------------------
# Files, CLI and Dagster on a small release


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return build_small_release(tmp_path_factory.mktemp("data"))


def test_write_report_files(release: Release) -> None:
    paths = write_report(release, CAT)
    reports = release.root / "reports"
    expected = {
        "availability_by_modality.csv",
        "availability_by_modality.md",
        "availability_by_city.csv",
        "availability_by_city.md",
        "availability_by_field.csv",
        "availability_by_field.md",
        "availability_heatmap.png",
        "availability_scope.json",
    }
    assert {p.name for p in paths.values()} == expected
    assert {p.name for p in reports.iterdir()} == expected  # no temp files left behind
    by_modality = pd.read_csv(paths["modality_csv"]).set_index("code")
    assert by_modality.loc["OPT", ["available", "possible"]].tolist() == [1, 2]  # 2021 missing
    assert by_modality.loc["DEM", ["available", "percent"]].tolist() == [2, 100.0]  # static
    assert by_modality.loc["LC", "percent"] == 50.0
    assert not by_modality.loc["CO2", "processed"]
    overall = by_modality.iloc[-1]
    assert (overall["available"], overall["possible"]) == (4, 2 * N_MODALITIES)
    assert math.isclose(overall["percent"], round(400 / 36, 3))
    md = paths["modality_md"].read_text(encoding="utf-8")
    assert "| Carbon emissions | CO2 | 0 / 2 | 0.000% | not processed |" in md
    assert "| Overall |  | 4 / 36 | 11.111% |  |" in md
    assert "Synthetic sample data" in md and "2020, 2021" in md
    city_md = paths["city_md"].read_text(encoding="utf-8")
    assert "| Amsterdam | 2 | 4 / 36 | 11.111% |" in city_md


def test_write_report_needs_the_database(tmp_path: Path) -> None:
    with pytest.raises(ReleaseNotFoundError, match="cube/database"):
        write_report(Release(tmp_path, "missing"), CAT)


def test_cli_report_prints_both_tables(
    release: Release, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.cli import main

    assert main(["--data", str(release.data_root), "--release", release.version, "report"]) == 0
    out = capsys.readouterr().out
    assert "# Availability by modality" in out and "# Availability by city" in out
    assert "availability_heatmap.png" in out
    assert main(["--data", str(release.data_root), "--release", "nope", "report"]) == 2
    assert "[CC302]" in capsys.readouterr().err


def test_availability_report_asset_attaches_tables_and_heatmap(release: Release) -> None:
    from assets.reports import AVAILABILITY_REPORT_KEY, build_report_assets
    from pipelines.resources import CubeResource

    (availability_report,) = [
        a for a in build_report_assets(CAT) if a.key == AVAILABILITY_REPORT_KEY
    ]
    cube = CubeResource(data_root=str(release.data_root), release_version=release.version)
    result = dg.materialize(
        [availability_report], resources={"cube": cube}, instance=dg.DagsterInstance.ephemeral()
    )
    assert result.success
    event = result.get_asset_materialization_events()[0]
    assert event.asset_key == dg.AssetKey(["cube", "availability_report"])
    meta = event.materialization.metadata
    assert meta["available_combinations"].value == 4
    assert meta["possible_combinations"].value == 36
    assert "not processed" in meta["by_modality"].value
    assert meta["heatmap"].value.startswith("![availability heatmap](data:image/png;base64,")


def test_report_assets_load_alongside_the_pipeline() -> None:
    from pipelines.definitions import build_definitions

    defs = build_definitions(CAT)
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert "cube/availability_report" in keys
    parents = {
        k.to_user_string()
        for k in graph.get(dg.AssetKey(["cube", "availability_report"])).parent_keys
    }
    assert parents == {"cube/database"}


def test_the_database_availability_view_follows_the_every_field_rule(release: Release) -> None:
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        rows = con.execute(
            "SELECT year, modality, tiles, available_tiles, fields, available_fields, available "
            "FROM availability WHERE modality IN ('OPT', 'DEM') ORDER BY modality, year"
        ).fetchall()
    # OPT's three bands all come from the 2020 scene; 2021 has no source; DEM is static.
    assert rows == [
        (2020, "DEM", 152, 152, 1, 1, True),
        (2021, "DEM", 152, 152, 1, 1, True),
        (2020, "OPT", 152, 152, 3, 3, True),
        (2021, "OPT", 152, 0, 3, 0, False),
    ]
