"""Representation evaluation (the CityRep protocol) on a small real release."""

from __future__ import annotations

from pathlib import Path

import duckdb
import h3
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from affine import Affine
from pyproj import Transformer

from citycube.errors import EmbeddingError
from citycube.grid.tiles import city_grid
from citycube.represent import aggregate, metrics
from citycube.represent.builtin import cube_features, random_features, sinusoidal
from citycube.represent.embeddings import (
    CoordinateEncoder,
    EntityEmbedding,
    RasterEmbedding,
    RegionEmbedding,
    TileEmbedding,
    align,
    prepare,
    read_table_embedding,
    tile_units,
)
from citycube.represent.heads import Head, HeadConfig
from citycube.represent.run import RunConfig, evaluate
from citycube.represent.splits import SEEDS, block_ids, block_split, make_split, random_split
from citycube.represent.tasks import TASKS, load_target
from tests.conftest import write_tif
from tests.represent_fixtures import YEAR, build_single_modality_release, build_smooth_release


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory):
    return build_smooth_release(tmp_path_factory.mktemp("represent") / "data")


@pytest.fixture()
def con(release):
    with duckdb.connect(str(release.duckdb_file), read_only=True) as c:
        yield c


# --- alignment -----------------------------------------------------------------------------


def test_fine_raster_is_averaged_within_each_tile(tmp_path: Path) -> None:
    units = tile_units("Amsterdam", "2km")
    grid = city_grid("Amsterdam", "2km")
    # 500 m pixels: 4 × 4 per tile; band 0 = pixel column, band 1 = 7 everywhere
    h, w = grid.n_rows * 4, grid.n_cols * 4
    cols = np.tile(np.arange(w, dtype=np.float32), (h, 1))
    data = np.stack([cols, np.full((h, w), 7.0, np.float32)])
    data[:, 0, 0] = -1  # nodata in tile r0 c0: the mean is over its 15 valid pixels
    transform = Affine(500, 0, grid.x_min, 0, -500, grid.y_max)
    path = write_tif(tmp_path / "emb.tif", data, crs="EPSG:32631", transform=transform, nodata=-1)
    aligned = align(RasterEmbedding.from_geotiff("r", path), units)
    assert aligned.rule == "raster mean"
    tile = units.tile_ids.tolist().index("Amsterdam_2KM_r3_c5")
    assert aligned.features[tile].tolist() == [5 * 4 + 1.5, 7.0]
    first = units.tile_ids.tolist().index("Amsterdam_2KM_r0_c0")
    assert aligned.features[first, 0] == pytest.approx((0 + 1 + 2 + 3) * 4 / 15)


def test_a_zarr_raster_aligns_as_its_geotiff_twin(tmp_path: Path) -> None:
    """A (band, y, x) Zarr store written by rioxarray is read like the same GeoTIFF."""
    import rioxarray  # noqa: F401
    import xarray as xr

    units = tile_units("Amsterdam", "2km")
    grid = city_grid("Amsterdam", "2km")
    h, w = grid.n_rows * 4, grid.n_cols * 4
    data = np.stack(
        [np.tile(np.arange(w, dtype=np.float32), (h, 1)), np.full((h, w), 3.0, np.float32)]
    )
    data[:, 5, 7] = np.nan
    transform = Affine(500, 0, grid.x_min, 0, -500, grid.y_max)
    tif = write_tif(
        tmp_path / "emb.tif",
        np.nan_to_num(data, nan=-1),
        crs="EPSG:32631",
        transform=transform,
        nodata=-1,
    )
    xs = grid.x_min + (np.arange(w) + 0.5) * 500
    ys = grid.y_max - (np.arange(h) + 0.5) * 500
    array = xr.DataArray(data, dims=("band", "y", "x"), coords={"band": [0, 1], "y": ys, "x": xs})
    array = array.rio.write_crs("EPSG:32631").rio.write_transform(transform)
    store = tmp_path / "emb.zarr"
    array.to_dataset(name="embedding").to_zarr(store)
    from_zarr = align(RasterEmbedding.from_zarr("z", store), units)
    from_tif = align(RasterEmbedding.from_geotiff("t", tif), units)
    assert from_zarr.rule == from_tif.rule == "raster mean"
    np.testing.assert_allclose(from_zarr.features, from_tif.features)


def test_coarse_raster_is_broadcast_to_the_tiles_it_covers(tmp_path: Path) -> None:
    units = tile_units("Amsterdam", "2km")
    grid = city_grid("Amsterdam", "2km")
    # 10 km pixels: each covers 5 × 5 tiles
    h, w = -(-grid.n_rows // 5), -(-grid.n_cols // 5)
    data = np.arange(h * w, dtype=np.float32).reshape(1, h, w)
    transform = Affine(10_000, 0, grid.x_min, 0, -10_000, grid.y_max)
    path = write_tif(tmp_path / "coarse.tif", data, crs="EPSG:32631", transform=transform)
    aligned = align(RasterEmbedding.from_geotiff("c", path), units)
    assert aligned.rule == "raster broadcast"
    expected = (units.row // 5) * w + units.col // 5
    assert aligned.features[:, 0].tolist() == expected.astype(float).tolist()


def _cells_in_city(res: int) -> np.ndarray:
    grid = city_grid("Amsterdam", "2km")
    xmin, ymin, xmax, ymax = grid.bounds
    lon, lat = Transformer.from_crs(32631, 4326, always_xy=True).transform(
        [xmin, xmax, xmax, xmin], [ymin, ymin, ymax, ymax]
    )
    shape = h3.LatLngPoly(list(zip(lat, lon, strict=True)))
    return np.array(sorted(h3.polygon_to_cells(shape, res)))


def test_region_tables_follow_finer_and_coarser_rules() -> None:
    units = tile_units("Amsterdam", "2km")
    fine = _cells_in_city(8)
    lat = np.array([h3.cell_to_latlng(c)[0] for c in fine])
    aligned = align(RegionEmbedding("fine", fine, lat[:, None]), units)
    assert aligned.rule == "h3 r8 mean"
    covered = aligned.covered
    assert covered.mean() > 0.9
    # a tile's feature is the mean latitude of the cell centres inside it: near its centre
    assert np.abs(aligned.features[covered, 0] - units.lat[covered]).max() < 0.01
    coarse = np.array(
        sorted({h3.latlng_to_cell(a, o, 5) for a, o in zip(units.lat, units.lon, strict=True)})
    )
    ids = np.arange(len(coarse), dtype=float)[:, None]
    aligned = align(RegionEmbedding("coarse", coarse, ids), units)
    assert aligned.rule == "h3 r5 broadcast" and aligned.covered.all()
    for i in (0, 57, 139):
        cell = h3.latlng_to_cell(units.lat[i], units.lon[i], 5)
        assert aligned.features[i, 0] == coarse.tolist().index(cell)


def test_entities_are_pooled_to_h3_r8_before_alignment(tmp_path: Path) -> None:
    units = tile_units("Amsterdam", "2km")
    i = units.tile_ids.tolist().index("Amsterdam_2KM_r4_c6")
    # three entities in one r8 cell near the tile centre, one far away in another r8 cell
    cell = h3.latlng_to_cell(units.lat[i], units.lon[i], 8)
    clat, clon = h3.cell_to_latlng(cell)
    lon = np.array([clon, clon + 1e-5, clon - 1e-5, clon + 0.01])
    lat = np.array([clat, clat, clat + 1e-5, clat])
    values = np.array([[1.0], [2.0], [3.0], [100.0]])
    table = pa.table({"lon": lon, "lat": lat, "e0": values[:, 0]})
    pq.write_table(table, tmp_path / "poi.parquet")
    emb = read_table_embedding("poi", tmp_path / "poi.parquet")
    assert isinstance(emb, EntityEmbedding)
    pooled = emb.pooled()
    assert sorted(pooled.values[:, 0].tolist()) == [2.0, 100.0]  # mean per cell first
    aligned = align(emb, units)
    assert aligned.rule == "entities → h3 r8 mean"
    owner = units.locate(
        *Transformer.from_crs(4326, 32631, always_xy=True).transform([lon[3]], [lat[3]])
    )[0]
    if owner == i:  # both cells in one tile: the mean of the two cell means
        assert aligned.features[i, 0] == pytest.approx(51.0)
    else:
        assert aligned.features[i, 0] == pytest.approx(2.0)
    assert aligned.covered.sum() <= 2


def test_tile_tables_and_coordinate_encoders() -> None:
    units = tile_units("Amsterdam", "5km")
    emb = TileEmbedding("t", np.array(units.tile_ids[:3]), np.array([[1.0], [2.0], [3.0]]))
    aligned = align(emb, units)
    assert aligned.rule == "tile lookup"
    assert aligned.features[:3, 0].tolist() == [1.0, 2.0, 3.0]
    assert np.isnan(aligned.features[3:, 0]).all()
    encoded = align(sinusoidal(), units)
    assert encoded.features.shape == (len(units), 64) and encoded.covered.all()
    bad = CoordinateEncoder("bad", lambda lon, lat: np.zeros((1, 2)))
    with pytest.raises(EmbeddingError, match=r"CC403.*one row per point"):
        align(bad, units)


def test_missing_row_policy_coverage_and_l2() -> None:
    units = tile_units("Amsterdam", "5km")
    emb = TileEmbedding("t", units.tile_ids[:4], np.array([[3.0, 4.0]] * 4))
    aligned = align(emb, units)
    task_tiles = units.tile_ids[2:8]
    dropped, record = prepare(aligned, task_tiles, "drop")
    assert dropped.X.shape == (2, 2) and dropped.tile_ids.tolist() == units.tile_ids[2:4].tolist()
    assert record["coverage"] == pytest.approx(2 / 6) and record["kept"] == 2
    zeroed, record = prepare(aligned, task_tiles, "zero", l2=True)
    assert zeroed.X.shape == (6, 2) and zeroed.zero_filled.tolist() == [False] * 2 + [True] * 4
    assert zeroed.X[0].tolist() == [0.6, 0.8] and zeroed.X[5].tolist() == [0.0, 0.0]
    assert record["zero_filled"] == 4 and record["l2"] is True
    with pytest.raises(EmbeddingError, match="policy"):
        prepare(aligned, task_tiles, "mean")  # type: ignore[arg-type]


# --- tasks ---------------------------------------------------------------------------------


def test_targets_come_from_available_observations(release, con) -> None:
    pop = load_target(con, TASKS["POP"], "Amsterdam", "2km", YEAR)
    expected = con.execute(
        "SELECT count(*) FROM observations WHERE city = 'Amsterdam' AND scale = '2km' "
        "AND modality = 'POP' AND available"
    ).fetchone()[0]
    assert len(pop) == expected < 140 and np.isfinite(pop.y).all()
    lcc = load_target(con, TASKS["LCC"], "Amsterdam", "2km", YEAR)
    assert set(np.unique(lcc.y)) == {10, 51, 190} and len(lcc) == 140
    lcd = load_target(con, TASKS["LCD"], "Amsterdam", "2km", YEAR, release.root)
    assert lcd.classes.tolist() == [10, 51, 190] and lcd.y.shape == (140, 3)
    assert np.allclose(lcd.y.sum(axis=1), 1.0)
    west = lcd.tile_ids == "Amsterdam_2KM_r2_c0"
    assert lcd.y[west].tolist() == [[1.0, 0.0, 0.0]]
    none = load_target(con, TASKS["CO2"], "Amsterdam", "2km", YEAR)
    assert len(none) == 0


def test_cube_features_leave_out_the_target_modality(con) -> None:
    units = tile_units("Amsterdam", "2km")
    emb = cube_features(con, units, YEAR, exclude_modality="POP")
    assert emb.values.shape == (140, 4)  # NTL, HEAT, DEM, NDVI; LC is categorical
    with_pop = cube_features(con, units, YEAR, exclude_modality="NTL")
    assert np.isnan(with_pop.values).any()  # POP's unavailable tiles stay missing
    same = random_features(units).values
    assert np.array_equal(same, random_features(units).values)


# --- splits --------------------------------------------------------------------------------


def test_block_split_assigns_whole_non_empty_blocks() -> None:
    units = tile_units("Christchurch", "2km")
    keep = (units.row + units.col) % 7 != 0  # some holes
    keep &= units.row < 25  # and an empty band of blocks at the bottom
    row, col = units.row[keep], units.col[keep]
    split = block_split(row, col, 10, seed=42)
    ids = block_ids(row, col, 10)
    assert ids.max() < 100 and len(np.unique(ids)) == 100  # extent is the units', not the grid's
    for block in np.unique(ids):
        assert len(set(split.split[ids == block])) == 1
    per_block = pd.Series(split.split).groupby(ids).first().value_counts()
    assert per_block["test"] == 20 and per_block["val"] == 8 and per_block["train"] == 72
    assert np.array_equal(block_split(row, col, 10, 42).split, split.split)
    assert not np.array_equal(block_split(row, col, 10, 24).split, split.split)
    fine = block_split(row, col, 20, seed=7)
    assert len(np.unique(fine.block)) > 300
    rnd = random_split(len(row), 0)
    counts = pd.Series(rnd.split).value_counts()
    n = len(row)
    assert counts["test"] == round(0.2 * n) and counts["val"] == round(0.1 * (n - counts["test"]))


def test_parent_split_is_the_release_split(con) -> None:
    units = tile_units("Amsterdam", "2km")
    dataset = dict(con.execute("SELECT tile_id, split FROM splits").fetchall())
    split = make_split("parent", 0, units.tile_ids, units.row, units.col, dataset)
    assert split.split.tolist() == [dataset[t] for t in units.tile_ids]
    with pytest.raises(EmbeddingError, match="no dataset split"):
        make_split("parent", 0, np.array(["nowhere"]), np.zeros(1), np.zeros(1), dataset)


# --- heads and metrics ---------------------------------------------------------------------


def test_mlp_learns_a_nonlinear_target_the_linear_probe_cannot() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (1200, 2))
    y = np.sin(2 * X[:, 0]) * X[:, 1] ** 2
    tr, va, te = slice(0, 800), slice(800, 1000), slice(1000, None)
    mlp = Head("regression", seed=1)
    fit = mlp.fit(X[tr], y[tr], X[va], y[va])
    linear = Head("regression", HeadConfig(hidden=0), seed=1)
    linear.fit(X[tr], y[tr], X[va], y[va])
    r2_mlp = metrics.regression(y[te], mlp.predict(X[te]))["r2"]
    r2_lin = metrics.regression(y[te], linear.predict(X[te]))["r2"]
    assert r2_mlp > 0.8 > r2_lin + 0.5
    assert fit.epochs <= 100 and fit.best_val_loss == min(fit.val_loss)
    again = Head("regression", seed=1)
    again.fit(X[tr], y[tr], X[va], y[va])
    assert np.array_equal(again.predict(X[te]), mlp.predict(X[te]))  # seeded, deterministic


def test_early_stopping_restores_the_best_validation_state() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, 40))
    y = rng.normal(size=120)  # pure noise: the MLP overfits and validation loss rises
    head = Head("regression", seed=0)
    fit = head.fit(X[:80], y[:80], X[80:], y[80:])
    assert fit.epochs == fit.best_epoch + 10 < 100
    Xv = (X[80:] - head.x_mean) / head.x_std
    out, _ = head._forward(Xv)
    restored = float((((out[:, 0]) - (y[80:] - head.y_mean) / head.y_std) ** 2).mean())
    assert restored == pytest.approx(fit.best_val_loss)


def test_classification_and_distribution_heads() -> None:
    rng = np.random.default_rng(5)
    X = rng.normal(size=(600, 3))
    labels = np.where(X[:, 0] > 0.5, 7, np.where(X[:, 1] > 0, 3, 1))
    head = Head("classification", seed=0)
    head.fit(X[:400], labels[:400], X[400:500], labels[400:500])
    assert metrics.classification(labels[500:], head.predict(X[500:]))["macro_f1"] > 0.8
    logits = np.column_stack([X[:, 0], -X[:, 0], X[:, 1]])
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    dist = Head("distribution", seed=0)
    dist.fit(X[:400], p[:400], X[400:500], p[400:500])
    q = dist.predict(X[500:])
    assert np.allclose(q.sum(axis=1), 1.0)
    assert metrics.distribution(p[500:], q)["kl"] < 0.05


def test_metrics_match_their_definitions() -> None:
    r = metrics.regression(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 5.0]))
    assert r == pytest.approx({"r2": 1 - 4 / 2, "mae": 2 / 3, "rmse": np.sqrt(4 / 3)})
    c = metrics.classification(np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1]))
    # class 0: p 1, r 0.5, f1 2/3; class 1: p 2/3, r 1, f1 0.8
    assert c == pytest.approx(
        {"macro_f1": (2 / 3 + 0.8) / 2, "macro_precision": 5 / 6, "macro_recall": 0.75}
    )
    p = np.array([[0.5, 0.5], [1.0, 0.0]])
    q = np.array([[0.25, 0.75], [1.0, 0.0]])
    d = metrics.distribution(p, q)
    assert d["chebyshev"] == pytest.approx(0.125) and d["l1"] == pytest.approx(0.25)
    assert d["kl"] == pytest.approx((0.5 * np.log(2) + 0.5 * np.log(0.5 / 0.75)) / 2, abs=1e-6)
    assert metrics.distribution(p, p)["kl"] == pytest.approx(0.0, abs=1e-12)


def test_metrics_agree_with_scikit_learn() -> None:
    from sklearn import metrics as sk

    rng = np.random.default_rng(11)
    y, pred = rng.normal(size=300), rng.normal(size=300) * 0.5
    r = metrics.regression(y, pred)
    assert r["r2"] == pytest.approx(sk.r2_score(y, pred))
    assert r["mae"] == pytest.approx(sk.mean_absolute_error(y, pred))
    assert r["rmse"] == pytest.approx(sk.root_mean_squared_error(y, pred))
    labels, guess = rng.integers(0, 5, 300), rng.integers(1, 7, 300)  # classes 0 and 6 one-sided
    c = metrics.classification(labels, guess)
    kw = {"average": "macro", "zero_division": 0}
    assert c["macro_f1"] == pytest.approx(sk.f1_score(labels, guess, **kw))
    assert c["macro_precision"] == pytest.approx(sk.precision_score(labels, guess, **kw))
    assert c["macro_recall"] == pytest.approx(sk.recall_score(labels, guess, **kw))


def test_aggregation_ranks_ties_and_spread() -> None:
    rows = []
    scores = {  # embedding → city → per-seed R²
        "a": {"X": [0.5, 0.7], "Y": [0.2, 0.2]},
        "b": {"X": [0.6, 0.6], "Y": [0.1, 0.1]},
        "c": {"X": [0.1, 0.1], "Y": [0.3, 0.3]},
    }
    for emb, per_city in scores.items():
        for city, seeds in per_city.items():
            for seed, s in zip((42, 24), seeds, strict=True):
                rows.append(
                    {
                        "protocol": "block10",
                        "head": "mlp",
                        "task": "POP",
                        "primary": "r2",
                        "embedding": emb,
                        "city": city,
                        "seed": seed,
                        "score": s,
                    }
                )
    cities = aggregate.city_scores(pd.DataFrame(rows))
    tasks = aggregate.task_table(cities).set_index("embedding")
    assert tasks.loc["a", "avg"] == pytest.approx(0.4)
    assert tasks.loc["a", "c_std"] == pytest.approx(np.std([0.6, 0.2], ddof=1))
    ranks = aggregate.city_ranks(cities).set_index(["embedding", "city"])["rank"]
    assert ranks["a", "X"] == 1 and ranks["b", "X"] == 1 and ranks["c", "X"] == 3  # tie → best
    mean = aggregate.mean_city_rank(cities)
    overall = mean[mean["task"] == "overall"].set_index("embedding")["mean_rank"]
    assert overall.to_dict() == {"a": 1.5, "b": 2.0, "c": 2.0}


# --- the protocol end to end ---------------------------------------------------------------


def test_random_split_scores_higher_than_block_split_on_a_smooth_target(con, release) -> None:
    """CityRep §4.3: a coordinate encoding interpolates between neighbours under a random
    split, and loses that help when whole blocks are held out."""
    config = RunConfig(
        cities=("Christchurch",),
        tasks=("POP",),
        embeddings=("sinusoidal",),
        protocols=("block10", "random"),
        seeds=SEEDS,
        heads=("mlp",),
    )
    result = evaluate(con, release.root, config, release.root / "represent" / "leak")
    by = result.results.groupby("protocol")["r2"].mean()
    assert by["random"] > 0.9
    assert by["random"] - by["block10"] > 0.1
    deltas = pd.read_csv(result.folder / "random_minus_spatial.csv")
    assert deltas.loc[0, "delta"] == pytest.approx(by["random"] - by["block10"])


def test_one_run_writes_every_artifact(con, release) -> None:
    config = RunConfig(
        cities=("Amsterdam", "Christchurch"),
        tasks=("POP", "LCC", "LCD", "CO2"),
        protocols=("block10", "parent", "random"),
        seeds=(42, 24),
        heads=("mlp", "linear"),
        max_epochs=20,
    )
    out = release.root / "represent" / "all"
    result = evaluate(con, release.root, config, out)
    for name in (
        "alignment_report.csv",
        "splits.parquet",
        "predictions.parquet",
        "results.parquet",
        "city_scores.csv",
        "task_scores.csv",
        "mean_city_rank.csv",
        "random_minus_spatial.csv",
        "rank_changes.csv",
        "test_block_frequency.csv",
        "skipped.csv",
        "run.json",
    ):
        assert (out / name).is_file(), name
    assert (out / "aligned" / "cube" / "Amsterdam" / "POP.parquet").is_file()
    skipped = set(zip(result.skipped["city"], result.skipped["task"], strict=True))
    assert ("Amsterdam", "CO2") in skipped and ("Christchurch", "LCD") in skipped
    fits = result.results.groupby(["task", "protocol"]).size()
    # POP, LCC: 2 cities; LCD: Amsterdam only; × 3 embeddings × 2 heads × seeds (parent: 1)
    assert fits["POP", "block10"] == 2 * 3 * 2 * 2 and fits["POP", "parent"] == 2 * 3 * 2
    assert fits["LCD", "random"] == 1 * 3 * 2 * 2
    report = result.alignment.set_index(["embedding", "city", "task"])
    assert report.loc[("sinusoidal", "Amsterdam", "POP"), "coverage"] == 1.0
    assert report.loc[("cube", "Amsterdam", "POP"), "dim"] == 4
    splits = pq.read_table(out / "splits.parquet").to_pandas()
    spatial = splits[splits["protocol"] == "block10"]
    assert (spatial.groupby(["city", "task", "seed", "block"])["split"].nunique() == 1).all()
    freq = pd.read_csv(out / "test_block_frequency.csv")
    assert freq["test_seeds"].max() <= 2 and freq["seeds"].max() == 2
    ranks = result.ranks
    assert set(ranks["task"]) == {"POP", "LCC", "LCD", "overall"}
    preds = pq.read_table(out / "predictions.parquet").to_pandas()
    lcd = preds[preds["task"] == "LCD"]
    assert lcd["pred"].isna().all() and np.allclose([sum(p) for p in lcd["pred_fractions"]], 1)


def test_an_embedding_without_features_is_skipped_not_fatal(tmp_path: Path) -> None:
    release = build_single_modality_release(tmp_path / "data")
    config = RunConfig(cities=("Amsterdam",), tasks=("POP",), seeds=(42,), max_epochs=3)
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        result = evaluate(con, release.root, config, tmp_path / "run")
    assert set(result.results["embedding"]) == {"sinusoidal", "random"}
    skipped = result.skipped.set_index("embedding")
    assert "covers half the tiles" in skipped.loc["cube", "reason"]


# --- command line --------------------------------------------------------------------------


def test_cli_writes_the_summary_tables(release, tmp_path: Path, capsys) -> None:
    from pipelines.cli import main

    data = str(release.data_root)
    code = main(
        [
            "--data",
            data,
            "--release",
            release.version,
            "represent",
            "--name",
            "cli",
            "--cities",
            "Amsterdam",
            "--tasks",
            "NTL,LCC",
            "--seeds",
            "42,24",
            "--heads",
            "mlp,linear",
            "--max-epochs",
            "15",
            "--missing",
            "zero",
            "--l2",
        ]
    )
    assert code == 0
    out = release.data_root / "evaluations" / release.version / "represent" / "cli"
    tasks = pd.read_csv(out / "task_scores.csv")
    assert set(tasks["embedding"]) == {"sinusoidal", "cube", "random"}
    assert set(tasks["protocol"]) == {"block10", "random"} and set(tasks["head"]) == {
        "mlp",
        "linear",
    }
    report = pd.read_csv(out / "alignment_report.csv")
    assert report["l2"].all() and (report["policy"] == "zero").all()
    printed = capsys.readouterr().out
    assert "block10 · mlp" in printed and "mean city rank" in printed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks", "GDP"], "unknown task 'GDP'"),
        (["--protocols", "block5"], "unknown protocol"),
        (["--embedding", "mine"], "give NAME=PATH"),
        (["--embedding", "mine=/nonexistent/emb.tif"], "no file at"),
        (["--name", "../escape"], "run name"),
    ],
)
def test_cli_refuses_bad_input_and_writes_nothing(release, args, message, capsys) -> None:
    from pipelines.cli import main

    base = ["--data", str(release.data_root), "--release", release.version, "represent"]
    code = main([*base, "--name", "bad", "--cities", "Amsterdam", *args])  # the last --name wins
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (release.data_root / "evaluations" / release.version / "represent" / "bad").exists()


# --- Dagster asset -------------------------------------------------------------------------


def test_asset_evaluates_the_published_cube(release) -> None:
    import dagster as dg

    from assets.tasks import REPRESENT_KEY, build_represent_assets
    from pipelines.build import selected_asset_keys
    from pipelines.resources import CubeResource

    result = dg.materialize(
        build_represent_assets(),
        resources={
            "cube": CubeResource(data_root=str(release.data_root), release_version=release.version)
        },
        instance=dg.DagsterInstance.ephemeral(),
        run_config={
            "ops": {
                "represent__builtin_scores": {
                    "config": {
                        "cities": ["Amsterdam"],
                        "tasks": ["LST"],
                        "seeds": [42],
                        "protocols": ["block10", "random", "parent"],
                    }
                }
            }
        },
    )
    assert result.success
    meta = result.asset_materializations_for_node("represent__builtin_scores")[0].metadata
    assert meta["fits"].value == 3 * 3
    folder = release.data_root / "evaluations" / release.version / "represent" / "builtin"
    assert (folder / "task_scores.csv").is_file()
    # a build without --assets leaves the evaluation out; asking for it by name selects it
    assert REPRESENT_KEY not in selected_asset_keys([])
    assert selected_asset_keys(["represent"]) == [REPRESENT_KEY]
