"""The benchmark assets materialised through Dagster on a small hand-made release.

The release holds synthetic observations of Amsterdam for two years (every field of the 18
modalities) and one land-cover chip store whose west half is a single class, in a staged
``cube.duckdb``. The assets then run as ``make run`` runs them, between the staged database and
its publication, and the published views, files and the instance loader are checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from assets.tasks import build_benchmark_assets
from benchmarks.bench_translation import write_synthetic_observations
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import (
    Release,
    build_duckdb,
    publish_database,
    release_metadata,
    write_tiles,
)
from citycube.errors import UnknownModalityError
from citycube.grid.tiles import city_grid
from citycube.tasks.loader import InstanceLoader
from citycube.tasks.translation import BenchmarkFiles
from citycube.tasks.views import task_views
from pipelines.resources import CubeResource
from tests.release_fixtures import write_mixed_lc_chips, write_rgb_chips

CITY, YEARS = "Amsterdam", (2020, 2021)
CAT = load_catalogue()


def _lc_store(release: Release) -> None:
    """One LC chip store (west half one class, east half mixed) and its chip index rows."""
    write_mixed_lc_chips(release, CITY, 2020, YEARS)


@pytest.fixture(scope="module")
def materialised(tmp_path_factory: pytest.TempPathFactory) -> Release:
    root = tmp_path_factory.mktemp("bench-assets")
    release = Release(root / "data", "t")
    write_tiles(release)
    write_synthetic_observations(
        release.draft_dir / "observations", CAT, years=YEARS, cities=(CITY,), seed=4
    )
    _lc_store(release)
    write_rgb_chips(release, CITY, 2020, YEARS)
    meta = release_metadata(release, source_set="test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    result = dg.materialize(
        build_benchmark_assets(CAT),
        resources={"cube": CubeResource(data_root=str(root / "data"), release_version="t")},
        instance=dg.DagsterInstance.ephemeral(),
        run_config={"ops": {"benchmark__translation_instances": {"config": {"total": 3000}}}},
    )
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert [(c.check_name, c.passed) for c in checks] == [("no_cross_split_overlap", True)]
    publish_database(release, meta)
    return release


def test_views_are_queryable_in_the_published_database(materialised: Release) -> None:
    with duckdb.connect(str(materialised.duckdb_file), read_only=True) as con:
        keys, routes = con.execute(
            "SELECT count(*), sum(n_routes) FROM translation_pairs"
        ).fetchone()
        assert 0 < keys <= 152 * len(YEARS)
        assert con.execute("SELECT count(*) FROM translation_routes").fetchone()[0] == routes
        counts = con.execute("SELECT count(*), sum(pairs) FROM translation_route_counts").fetchone()
        assert counts == (306, routes)
        splits = dict(con.execute("SELECT split, count(*) FROM splits GROUP BY 1").fetchall())
        assert sum(splits.values()) == 6586 and set(splits) == {"train", "val", "test"}
        instances = con.execute(
            "SELECT count(*), count(DISTINCT split) FROM translation_instances"
        ).fetchone()
        assert instances[0] > 0 and instances[1] == 3
        # instances sit on offered routes of their key, in their key's split
        stray = con.execute(
            """
            SELECT count(*) FROM translation_instances AS i
            ANTI JOIN translation_routes AS r
              ON i.tile_id = r.tile_id AND i.year = r.year
             AND i.source = r.source AND i.target = r.target
            """
        ).fetchone()[0]
        assert stray == 0
        wrong_split = con.execute(
            "SELECT count(*) FROM translation_instances i JOIN splits s USING (tile_id) "
            "WHERE i.split <> s.split"
        ).fetchone()[0]
        assert wrong_split == 0


def test_files_and_manifest(materialised: Release) -> None:
    import json

    files = BenchmarkFiles.published(materialised)
    table14 = pq.read_table(files.route_counts)
    assert table14.num_rows == 18 and "H&F" in table14.column_names
    assert files.heatmap.read_bytes()[:4] == b"\x89PNG"
    manifest = json.loads(files.manifest.read_text(encoding="utf-8"))
    assert manifest["total"] == 3000 and manifest["seed"] == 0 and manifest["split_seed"] == 0
    assert manifest["requested"] == {"train": 1915, "val": 543, "test": 542}
    # the test split's anchors fill its quota exactly: the pairs are there
    assert manifest["achieved"] == manifest["requested"] and manifest["complete"]
    assert manifest["note"] == "every split got what it asked for"
    assert all(manifest["available"][s] >= manifest["requested"][s] for s in manifest["requested"])
    assert manifest["single_class_chips"] > 0
    assert manifest["files"]["instances"]["path"] == "instances.parquet"


def test_single_class_chips_are_sampled_less(materialised: Release) -> None:
    with duckdb.connect(str(materialised.duckdb_file), read_only=True) as con:
        share = con.execute(
            """
            SELECT avg(single_class_target::INT) FILTER (WHERE target = 'LC'),
                   avg(s.single_class::INT)
            FROM translation_instances i
            JOIN read_parquet(?) s ON s.tile_id = i.tile_id AND s.year = i.year
            WHERE s.modality = 'LC'
            """,
            [str(BenchmarkFiles.published(materialised).single_class)],
        ).fetchone()
    kept, overall = share
    assert overall is not None and 0 < overall < 1
    assert kept is not None and 0 < kept < overall  # kept, at a lower rate


def test_loader_resolves_chips_and_fields(materialised: Release) -> None:
    loader = InstanceLoader(materialised, split="train")
    assert len(loader) > 0
    numeric = {m.code for m in CAT.modalities if not m.is_image}  # only LC has chips here
    rows = loader.instances.to_pylist()
    images = [i for i, r in enumerate(rows) if r["target"] == "LC" and r["source"] in numeric]
    numbers = [i for i, r in enumerate(rows) if r["target"] == "WTH" and r["source"] in numeric]
    item = loader[images[0]]
    assert item.target.values.ndim == 3 and item.target.values.shape[0] == 1
    assert item.target.valid is not None and item.target.valid.shape == item.target.values.shape[1:]
    side = 80 if item.key[1] == "2km" else 200
    assert item.target.values.shape[1:] == (side, side)
    weather = loader[numbers[0]].target
    assert weather.fields[0] == "tmin_c" and weather.values.shape == (6,)
    assert np.isfinite(weather.values).all()


def test_each_instance_carries_its_grid_context(materialised: Release) -> None:
    """The paper's model is f(x, c): city, year, scale and the tile's place come with x."""

    loader = InstanceLoader(materialised, split="test")
    numeric = {m.code for m in CAT.modalities if not m.is_image}  # only LC has chips here
    rows = loader.instances.to_pylist()
    item = loader[next(i for i, r in enumerate(rows) if {r["source"], r["target"]} <= numeric)]
    city, scale, tile_id, _ = item.key
    context = item.context
    assert (context.city, context.scale, context.tile_id, context.year) == item.key
    tile = next(t for t in city_grid(city, scale).tiles() if t.tile_id == tile_id)
    assert (context.row, context.col) == (tile.row, tile.col)
    lon_min, lat_min, lon_max, lat_max = context.bounds_wgs84
    lon, lat = context.centre_wgs84
    assert lon_min < lon < lon_max and lat_min < lat < lat_max
    side_deg = 2.0 if scale == "2km" else 5.0
    assert 0 < lat_max - lat_min < side_deg / 100  # about 0.018° a side for 2 km
    assert json.dumps(context.centre_wgs84)  # plain numbers, ready for a model's input


def test_rebuilt_database_keeps_the_views(materialised: Release, tmp_path: Path) -> None:
    path = tmp_path / "again.duckdb"
    build_duckdb(materialised, CAT, {"version": "t"}, path=path, benchmark_views=task_views(CAT))
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM translation_instances").fetchone()[0] > 0


def test_training_mean_reference_scores_end_to_end(materialised: Release, tmp_path: Path) -> None:
    from citycube.tasks.evaluate import score, training_stats
    from citycube.tasks.metrics import log1p_nmse, percentile_range
    from pipelines.cli import main

    stats = training_stats(materialised, CAT)
    table = score(materialised, CAT, stats=stats, targets=["POP", "LC", "WTH"])
    rows = {(r["source"], r["target"]): r for r in table.to_pylist()}
    assert {r["metric"] for r in rows.values() if r["target"] == "LC"} == {"macro_miou"}
    assert {r["metric"] for r in rows.values() if r["target"] == "WTH"} == {"macro_nmse"}
    # POP by hand: log1p NMSE of the training mean against every test reference of a route
    with duckdb.connect(str(materialised.duckdb_file), read_only=True) as con:
        train = con.execute(
            "SELECT value FROM observations JOIN splits USING (tile_id) "
            "WHERE split = 'train' AND modality = 'POP' AND available"
        ).fetchnumpy()["value"]
        reference = con.execute(
            "SELECT o.value FROM translation_instances i JOIN observations o "
            "ON o.tile_id = i.tile_id AND o.year = i.year AND o.modality = i.target "
            "WHERE i.split = 'test' AND i.source = 'NTL' AND i.target = 'POP'"
        ).fetchnumpy()["value"]
    expected = log1p_nmse(
        reference,
        np.full(len(reference), train.mean()),
        percentile_range(train, log1p=True),
    )
    assert rows[("NTL", "POP")]["score"] == pytest.approx(expected)
    assert rows[("NTL", "POP")]["instances"] == len(reference)
    out = tmp_path / "scores.parquet"
    args = ["--data", str(materialised.data_root), "--release", materialised.version]
    assert main([*args, "evaluate", "--targets", "POP", "--out", str(out)]) == 0
    assert pq.read_table(out).num_rows == sum(1 for _, t in rows if t == "POP")
    # a target no instance has is refused, not scored as nothing
    with pytest.raises(UnknownModalityError, match=r"no test instance of .* has target\(s\) X"):
        score(materialised, CAT, stats=stats, targets=["POP", "X"])
    out.unlink()
    assert main([*args, "evaluate", "--targets", "BOGUS,XYZ", "--out", str(out)]) == 2
    assert not out.exists()


def test_opt_lpips_is_marked_unavailable_beside_its_mse(
    materialised: Release, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Table 2 scores OPT by MSE and LPIPS: LPIPS has a row per route that says it is not
    computed and why, with no score, and the printed table shows it as n/a."""
    from citycube.tasks.evaluate import score, training_stats
    from citycube.tasks.metrics import UNAVAILABLE_METRICS, Metric
    from pipelines.cli import main

    table = score(materialised, CAT, stats=training_stats(materialised, CAT), targets=["OPT"])
    rows = table.to_pylist()
    mse = {r["source"]: r for r in rows if r["metric"] == "mse"}
    lpips = {r["source"]: r for r in rows if r["metric"] == "lpips"}
    assert mse and set(mse) == set(lpips) and len(rows) == 2 * len(mse)
    for source, row in mse.items():
        assert row["available"] and row["reason"] is None and np.isfinite(row["score"])
        other = lpips[source]
        assert other["score"] is None and other["available"] is False
        assert other["reason"] == UNAVAILABLE_METRICS[Metric.LPIPS]
        assert other["instances"] == row["instances"]
    out = tmp_path / "opt.parquet"
    args = ["--data", str(materialised.data_root), "--release", materialised.version]
    capsys.readouterr()
    assert main([*args, "evaluate", "--targets", "OPT", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| source / target | OPT MSE | OPT LPIPS |" in printed
    body = [line for line in printed.splitlines() if line.startswith("| ") and "target" not in line]
    assert len(body) == len(mse) and all(line.endswith(" | n/a |") for line in body)
    assert f"OPT LPIPS: {UNAVAILABLE_METRICS[Metric.LPIPS]}" in printed
    written = pq.read_table(out)
    assert written.filter(pc.equal(written["metric"], "lpips"))["score"].null_count == len(lpips)


def test_gps_is_scored_in_the_log_domain_it_is_stored_in(materialised: Release) -> None:
    """GPS is published as log(1 + points/km²): its log1p NMSE takes log1p once, not twice."""
    from citycube.tasks.evaluate import score, training_stats
    from citycube.tasks.metrics import nmse

    table = score(materialised, CAT, stats=training_stats(materialised, CAT), targets=["GPS"])
    rows = {r["source"]: r for r in table.to_pylist()}
    source = sorted(rows)[0]
    with duckdb.connect(str(materialised.duckdb_file), read_only=True) as con:
        train = con.execute(
            "SELECT value FROM observations JOIN splits USING (tile_id) "
            "WHERE split = 'train' AND modality = 'GPS' AND available"
        ).fetchnumpy()["value"]
        reference = con.execute(
            "SELECT o.value FROM translation_instances i JOIN observations o "
            "ON o.tile_id = i.tile_id AND o.year = i.year AND o.modality = i.target "
            "WHERE i.split = 'test' AND i.source = ? AND i.target = 'GPS'",
            [source],
        ).fetchnumpy()["value"]
    low, high = np.percentile(np.clip(train, 0, None), [1, 99])
    expected = nmse(np.clip(reference, 0, None), np.full(len(reference), train.mean()), (low, high))
    assert rows[source]["metric"] == "log1p_nmse"
    assert rows[source]["score"] == pytest.approx(expected)


def test_nearest_tile_reference_scores_end_to_end(materialised: Release, tmp_path: Path) -> None:
    from citycube.tasks.evaluate import NearestTilePredictor, score, training_stats
    from citycube.tasks.metrics import log1p_nmse, percentile_range
    from pipelines.cli import main

    stats = training_stats(materialised, CAT)
    predictor = NearestTilePredictor(materialised, CAT)
    table = score(materialised, CAT, stats=stats, targets=["POP"], predictor=predictor)
    rows = {(r["source"], r["target"]): r for r in table.to_pylist()}
    # NTL → POP by hand: one source field, so the nearest training key of the route and scale
    # is the one with the closest NTL value (first in tile, year order on ties)
    with duckdb.connect(str(materialised.duckdb_file), read_only=True) as con:
        pairs = con.execute(
            """
            SELECT i.split, i.scale, i.tile_id, i.year, s.value AS ntl, t.value AS pop
            FROM translation_instances i
            JOIN observations s ON s.tile_id = i.tile_id AND s.year = i.year
                               AND s.modality = 'NTL'
            JOIN observations t ON t.tile_id = i.tile_id AND t.year = i.year
                               AND t.modality = 'POP'
            WHERE i.source = 'NTL' AND i.target = 'POP' AND i.split IN ('train', 'test')
            ORDER BY i.tile_id, i.year
            """
        ).fetchall()
        train = con.execute(
            "SELECT value FROM observations JOIN splits USING (tile_id) "
            "WHERE split = 'train' AND modality = 'POP' AND available"
        ).fetchnumpy()["value"]
    candidates = [p for p in pairs if p[0] == "train"]
    tests = [p for p in pairs if p[0] == "test"]
    assert candidates and tests
    reference, predicted = [], []
    for _, scale, _, _, ntl, pop in tests:
        mine = [c for c in candidates if c[1] == scale]
        best = min(range(len(mine)), key=lambda i: (abs(mine[i][4] - ntl), i))
        reference.append(pop)
        predicted.append(mine[best][5])
    expected = log1p_nmse(
        np.array(reference), np.array(predicted), percentile_range(train, log1p=True)
    )
    assert rows[("NTL", "POP")]["score"] == pytest.approx(expected)
    assert rows[("NTL", "POP")]["instances"] == len(tests)
    # a borrowed chip's invalid pixels are filled from its valid ones, never left as NaN
    from citycube.tasks.loader import ModalityValue

    valid = np.array([[True, True], [True, False]])
    heights = ModalityValue("HF", ("height_m",), np.array([[[1.0, 2.0], [3.0, np.nan]]]), valid)
    assert predictor._filled(heights, "HF").tolist() == [[[1.0, 2.0], [3.0, 2.0]]]
    classes = ModalityValue("LC", ("class_id",), np.array([[[10, 51], [10, 255]]], np.uint8), valid)
    assert predictor._filled(classes, "LC").tolist() == [[[10, 51], [10, 10]]]
    # a class id is near only when it agrees
    d = predictor.distances("LC", np.array([10.0]), np.array([[10.0], [51.0], [np.nan]]))
    assert d.tolist() == [0.0, 1.0, float("inf")]
    out = tmp_path / "nearest.parquet"
    args = ["--data", str(materialised.data_root), "--release", materialised.version]
    assert (
        main(
            [
                *args,
                "evaluate",
                "--predictor",
                "nearest_tile",
                "--targets",
                "POP",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert pq.read_table(out).to_pylist() == table.to_pylist()
