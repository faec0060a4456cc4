"""Benchmark: bytes an incremental build writes, against the full build of the same selection.

A release of two cities × two years is built from an empty data root (the baseline: every
byte of the sources and the release is written). Then one city-year is built again, as a user
does after fixing one partition: every file under the data root is compared (inode, size,
modification time) before and after, so the figure is what the rebuild really wrote. Files of
other city-years must be untouched; the benchmark reports any that were not.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import BenchConfig, BenchResult, log
from benchmarks.builds import citycube_build

CITIES = ("Amsterdam", "Boston")
YEARS = (2020, 2024)
REBUILT = ("Boston", 2024)
RELEASE = "bench-incremental"
BASELINE = f"full build of {len(CITIES)} cities × {len(YEARS)} years from an empty data root"

FileState = tuple[int, int, int]
"""(inode, size, mtime_ns) of one file."""


def snapshot(root: Path) -> dict[Path, FileState]:
    """Every file under ``root`` with what changes when it is rewritten or replaced."""
    states: dict[Path, FileState] = {}
    for path in root.rglob("*"):
        if path.is_file():
            st = path.stat()
            states[path.relative_to(root)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return states


def written(before: dict[Path, FileState], after: dict[Path, FileState]) -> dict[Path, int]:
    """Files created or rewritten between two snapshots, with their sizes."""
    return {path: state[1] for path, state in after.items() if before.get(path) != state}


_YEAR_PART = re.compile(r"(?:^|[/=])((?:19|20)\d\d)(?:[/.]|$)")


def foreign_partitions(paths: dict[Path, int], city: str, year: int) -> list[str]:
    """Rewritten files that belong to another city-year than the rebuilt one.

    A path names a city-year when it holds a city key and a calendar year (observations
    ``city=…/year=…``, chips and quick-looks ``<city>/<year>``, sources ``<city>/<year>``).
    Static and epoch results, the database and reports are shared and not counted.
    """
    others: list[str] = []
    for path in paths:
        text = path.as_posix()
        cities = [c for c in CITIES if c in text.split("/") or f"city={c}" in text]
        years = [int(y) for y in _YEAR_PART.findall(text)]
        if cities and years and (cities[0] != city or years[0] != year) and years[0] in YEARS:
            others.append(text)
    return sorted(others)


def _by_area(paths: dict[Path, int]) -> dict[str, int]:
    areas: dict[str, int] = {}
    for path, size in paths.items():
        parts = path.parts
        key = "/".join(parts[:3]) if parts[0] == "releases" else parts[0]
        areas[key] = areas.get(key, 0) + size
    return dict(sorted(areas.items(), key=lambda kv: -kv[1]))


def run(config: BenchConfig) -> BenchResult:
    """A full build, then one city-year again; bytes written by each."""
    with tempfile.TemporaryDirectory(prefix="citycube-bench-incremental-") as tmp:
        root, home = Path(tmp) / "data", Path(tmp) / "home"
        root.mkdir()
        log(f"    full build of {', '.join(CITIES)} × {', '.join(map(str, YEARS))}")
        full_s, _ = citycube_build(
            root, home, RELEASE, ",".join(CITIES), ",".join(map(str, YEARS)), workers=2
        )
        after_full = snapshot(root)
        full = written({}, after_full)
        city, year = REBUILT
        log(f"    rebuild of {city} {year}")
        again_s, _ = citycube_build(root, home, RELEASE, city, str(year), workers=2)
        after_again = snapshot(root)
        again = written(after_full, after_again)
    full_bytes, again_bytes = sum(full.values()), sum(again.values())
    foreign = foreign_partitions(again, city, year)
    result = BenchResult(
        name="incremental",
        title=f"Bytes written by rebuilding {city} {year} in a built release",
        baseline=BASELINE,
        columns=[
            "build",
            "seconds",
            "files written",
            "MB written",
            "ratio (bytes / full build)",
            "other city-years' files rewritten",
        ],
        rows=[
            [
                "full (baseline)",
                f"{full_s:.0f}",
                f"{len(full):,}",
                f"{full_bytes / 1e6:.1f}",
                "1.000",
                "–",
            ],
            [
                f"{city} {year} again",
                f"{again_s:.0f}",
                f"{len(again):,}",
                f"{again_bytes / 1e6:.1f}",
                f"{again_bytes / full_bytes:.3f}",
                str(len(foreign)),
            ],
        ],
        notes=[
            "Written = created, or replaced (new inode, size or modification time), found by "
            "comparing every file under the data root before and after.",
            "A rebuild re-materialises the city-year's partitions through Dagster; shared "
            "outputs (the cube database, reports, manifest) are rewritten with it.",
        ],
    )
    details: dict[str, Any] = {
        "full_bytes": full_bytes,
        "rebuild_bytes": again_bytes,
        "ratio": again_bytes / full_bytes,
        "full_s": full_s,
        "rebuild_s": again_s,
        "full_by_area": _by_area(full),
        "rebuild_by_area": _by_area(again),
        "other_city_year_files_rewritten": foreign,
    }
    result.details = details
    return result
