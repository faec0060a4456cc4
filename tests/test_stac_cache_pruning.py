"""Pruning the STAC family's caches: least recently used entries go first, an age limit, a
dry run, entries a fetch holds left alone, nothing but cache entries touched; from the CLI and
after every fetch when a source set gives ``cache_max_gb``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from pipelines.cli import main
from sources.stac import cachefiles, stac_adapters
from sources.stac.clearmasks import ClearMaskCache
from sources.stac.pruning import cache_entries, prune_caches
from tests.stac_fixtures import CITY, StacWorld

NOW = time.time()
DAY = 86_400.0


def _entry(state: Path, folder: str, name: str, size: int, days_ago: float) -> Path:
    """A real cache file of about ``size`` payload bytes, last used ``days_ago``."""
    path = state / folder / CITY / "2020" / name
    cachefiles.write(path, {"name": name}, bytes(size))
    os.utime(path, (NOW - days_ago * DAY, NOW - days_ago * DAY))
    return path


def _names(state: Path) -> set[str]:
    return {e.path.name for e in cache_entries(state)}


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """Three windows, a Zarr chunk and a clear mask, used 1 to 5 days ago, plus files that
    are not cache entries (search records, scratch, a temp file)."""
    state = tmp_path / "sources" / ".stac"
    _entry(state, "windows", "old.red.win", 4000, days_ago=5)
    _entry(state, "windows", "mid.red.win", 4000, days_ago=3)
    _entry(state, "windows", "new.red.win", 4000, days_ago=1)
    _entry(state, "zarr", "0.0.0.chunk", 4000, days_ago=4)
    masks = ClearMaskCache(state / "qa")
    masks.save(CITY, 2020, "scene", {"k": 1}, np.ones((8, 8), dtype=bool))
    mask = masks.path(CITY, 2020, "scene", {"k": 1})
    os.utime(mask, (NOW - 2 * DAY, NOW - 2 * DAY))
    for other in ("searches/a.json", "scratch/composite-x/part", "windows/.x.win.1.2.tmp"):
        (state / other).parent.mkdir(parents=True, exist_ok=True)
        (state / other).write_bytes(b"not a cache entry")
    return state


def test_the_least_recently_used_entries_go_first_until_the_rest_fit(state: Path) -> None:
    sizes = {e.path.name: e.size for e in cache_entries(state)}
    budget = sum(sizes.values()) - sizes["old.red.win"] - sizes["0.0.0.chunk"]
    report = prune_caches(state, max_bytes=budget)
    assert report.removed == 2 and report.kept_bytes <= budget
    assert _names(state) == {"mid.red.win", "new.red.win", next(iter(_mask_names(state)))}
    for other in ("searches/a.json", "scratch/composite-x/part", "windows/.x.win.1.2.tmp"):
        assert (state / other).read_bytes() == b"not a cache entry"
    assert not (state / "zarr" / CITY).exists(), "an emptied folder is removed"


def _mask_names(state: Path) -> set[str]:
    return {p.name for p in (state / "qa").rglob("*.npz")}


def test_an_entry_loaded_recently_is_kept_longest(state: Path) -> None:
    old = state / "windows" / CITY / "2020" / "old.red.win"
    assert cachefiles.read(old, {"name": "old.red.win"}) is not None  # a load marks it used
    report = prune_caches(state, max_bytes=old.stat().st_size)
    assert _names(state) == {"old.red.win"}
    assert report.removed == 4


def test_an_age_limit_removes_what_was_not_used_within_it(state: Path) -> None:
    report = prune_caches(state, older_than_s=3.5 * DAY, now=NOW)
    assert report.removed == 2
    assert "old.red.win" not in _names(state) and "0.0.0.chunk" not in _names(state)
    assert {"mid.red.win", "new.red.win"} <= _names(state)


def test_a_dry_run_counts_and_deletes_nothing(state: Path) -> None:
    before = {e.path: e.size for e in cache_entries(state)}
    report = prune_caches(state, max_bytes=0, dry_run=True)
    assert report.removed == len(before) and report.removed_bytes == sum(before.values())
    assert {e.path: e.size for e in cache_entries(state)} == before
    assert "would remove" in report.summary()


def test_an_entry_whose_lock_a_fetch_holds_is_left_alone(state: Path) -> None:
    held = state / "windows" / CITY / "2020" / "old.red.win"
    with FileLock(str(held.with_suffix(".lock"))):
        report = prune_caches(state, max_bytes=0)
    assert report.skipped_locked == 1
    assert _names(state) == {"old.red.win"}
    assert "in use" in report.summary()


def test_bad_budgets_are_refused(state: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        prune_caches(state, max_bytes=-1)
    with pytest.raises(ValueError, match="older_than_s"):
        prune_caches(state, older_than_s=-1)


def test_the_cli_prunes_the_data_roots_caches(state: Path, capsys) -> None:
    data = state.parent.parent
    assert main(["--data", str(data), "prune-cache", "--dry-run", "--max-gb", "0"]) == 0
    assert "would remove 5" in capsys.readouterr().out
    assert len(_names(state)) == 5
    assert main(["--data", str(data), "prune-cache", "--older-than-days", "0"]) == 0
    assert "removed 5" in capsys.readouterr().out
    assert _names(state) == set()
    with pytest.raises(SystemExit):
        main(["--data", str(data), "prune-cache", "--max-gb", "-1"])


def test_a_fetch_with_a_cache_budget_prunes_after_installing(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    stac_world.set_faults([])
    state = tmp_path / ".stac"
    kept = {a.product_id: a for a in stac_adapters(stac_world.options())}
    kept["landsat_st"].fetch(CITY, 2020, tmp_path)
    cached = cache_entries(state)
    assert cached, "a fetch without a budget keeps its windows and masks"
    pruned = {a.product_id: a for a in stac_adapters(stac_world.options(cache_max_gb=0))}
    item = pruned["landsat_c2l2"].fetch(CITY, 2020, tmp_path)
    assert item.href("data") and Path(item.href("data")).is_file()
    assert cache_entries(state) == []
