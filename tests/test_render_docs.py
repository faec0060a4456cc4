"""`make docs` (benchmarks/render_docs.py): the querying guide's measured figures come from the
newest `queries` result, between markers, and read "not measured" where no result has them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_queries import EXAMPLES
from benchmarks.render_docs import (
    BLOCK_FIGURES,
    EXAMPLE_PREFIX,
    GUIDE,
    figure_keys,
    fill_figures,
    load_results,
    main,
    wrap_paragraph,
)

PAGE = """# Querying

## Examples

<!-- figure:queries:examples-measured-on -->
Each query took 213 ms on a release typed by hand.
<!-- /figure -->

The matrix (<!-- figure:queries:example:availability matrix -->213 ms<!-- /figure -->):

One history (<!-- figure:queries:example:one tile's history -->6 ms<!-- /figure -->), route
counts (<!-- figure:queries:example:translation route counts -->1.3 ms<!-- /figure -->).

Hand-written text stays as it is.

<!-- figure:queries:remote-reads -->
4.2 MB, typed by hand.
<!-- /figure -->
"""


def _timing(median_s: float, runs: int = 7) -> dict[str, Any]:
    return {"median_s": median_s, "runs_s": [median_s] * runs}


def _queries_result(date: str, matrix_s: float, **details: Any) -> dict[str, Any]:
    """A results file as `python -m benchmarks.run --only queries` writes it (the fields read)."""
    recorded = {
        "release": "/data/releases/sample-0.1.0",
        "release_kind": "pipeline",
        "cities": 16,
        "first_year": 2000,
        "last_year": 2025,
        "rows": 5_000_000,
        "partition_files": 7488,
        "years": 26,
        "matrix": {
            "release (cube.duckdb table)": _timing(0.5),
            "baseline (native table)": _timing(0.8),
        },
        "history": {
            "release (cube.duckdb table)": _timing(0.009),
            "baseline (native table)": _timing(0.012),
        },
        "examples": {
            "availability matrix": _timing(matrix_s),
            "one tile's history": _timing(0.00456),
            "translation route counts": None,
        },
        "remote": {
            "database_bytes": 80_000_000,
            "folder_bytes_without_chips": 300_000_000,
            "open_bytes": 1_500_000,
            "open_requests": 9,
            "bytes": 4_000_000,
            "requests": 14,
            "answer_agrees": True,
        },
    }
    recorded.update(details)
    return {
        "meta": {"date_utc": date, "cpu_count": 2, "load_before": [3.21, 3.0, 2.9]},
        "benchmarks": {"queries": {"title": "Queries", "columns": ["layout"], "details": recorded}},
    }


def _results(folder: Path, **files: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / f"{name}.json").write_text(json.dumps(data))
    return folder


def test_the_figures_come_from_the_newest_queries_result_and_rendering_twice_agrees(
    tmp_path: Path,
) -> None:
    results = _results(
        tmp_path / "results",
        older=_queries_result("2026-01-01 00:00:00", 9.99),
        newer=_queries_result("2026-06-01 12:00:00", 0.1234),
    )
    page = fill_figures(PAGE, load_results(results))
    assert "(<!-- figure:queries:example:availability matrix -->123 ms<!-- /figure -->)" in page
    assert "<!-- figure:queries:example:one tile's history -->4.6 ms<!-- /figure -->" in page
    assert "not measured: the measured release has no such table" in page
    text = " ".join(page.split())
    assert "the release `sample-0.1.0` built by the pipeline (16 cities, 2000–2025:" in text
    assert "5,000,000 observation rows in 7,488 partitions" in text
    assert "the median of 7 runs" in text and "2026-06-01 12:00:00 UTC" in text
    assert "load average was 3.2" in text
    assert "took 800 ms for the availability matrix and 12 ms for one tile's history" in text
    assert "(ratios 0.62 and 0.75)" in text
    assert "read 4.0 MB in 14 requests, opening included (1.5 MB in 9), 5.0% of the 80.0 MB" in text
    for stale in ("9990 ms", "213 ms", "1.3 ms", "typed by hand", "6 ms)"):
        assert stale not in page, stale
    assert "Hand-written text stays as it is." in page
    assert figure_keys(page) == figure_keys(PAGE)
    assert fill_figures(page, load_results(results)) == page


def test_the_synthetic_release_is_named_as_such_also_in_results_before_its_field(
    tmp_path: Path,
) -> None:
    result = _queries_result("2026-01-01 00:00:00", 0.2, release=None)
    for key in ("release_kind", "cities", "first_year", "last_year"):
        del result["benchmarks"]["queries"]["details"][key]
    page = fill_figures(PAGE, load_results(_results(tmp_path / "r", queries=result)))
    text = " ".join(page.split())
    assert "a release of the whole calendar's size written by the benchmark, with synthetic" in text
    assert "(5,000,000 observation rows in 7,488 partitions over 26 years)" in text
    assert "built by the pipeline" not in text


def test_without_a_result_or_with_one_lacking_the_examples_nothing_stale_is_left(
    tmp_path: Path,
) -> None:
    empty = fill_figures(PAGE, load_results(_results(tmp_path / "none")))
    assert "213 ms" not in empty and "4.2 MB" not in empty
    assert empty.count("-->not measured<!--") == 3
    assert "The examples' times are not measured: no results file" in " ".join(empty.split())
    assert "Bytes read over HTTP: not measured" in empty

    old = _queries_result("2026-01-01 00:00:00", 0.2)
    newer = _queries_result("2026-06-01 00:00:00", 0.3)
    del newer["benchmarks"]["queries"]["details"]["examples"]
    del newer["benchmarks"]["queries"]["details"]["remote"]
    page = fill_figures(PAGE, load_results(_results(tmp_path / "r", a=old, b=newer)))
    assert "200 ms" not in page, "the older result's time is not shown as current"
    assert page.count("-->not measured<!--") == 3
    assert "(`benchmarks/results/b.json`, 2026-06-01 00:00:00) has no times" in " ".join(
        page.split()
    )


def test_an_unknown_figure_marker_is_an_error(tmp_path: Path) -> None:
    page = "A (<!-- figure:queries:exmple:availability matrix -->1 ms<!-- /figure -->)\n"
    with pytest.raises(ValueError, match="unknown figure marker 'queries:exmple"):
        fill_figures(page, [])


def test_the_querying_guide_marks_every_timed_example_and_nothing_else() -> None:
    keys = figure_keys(GUIDE.read_text())
    examples = [k[len(EXAMPLE_PREFIX) :] for k in keys if k.startswith(EXAMPLE_PREFIX)]
    assert sorted(examples) == sorted(EXAMPLES)
    assert sorted(set(keys) - {EXAMPLE_PREFIX + e for e in examples}) == sorted(BLOCK_FIGURES)


def test_make_docs_writes_the_performance_page_and_fills_the_guide(tmp_path: Path) -> None:
    results = _results(tmp_path / "results", q=_queries_result("2026-06-01 00:00:00", 0.05))
    guide, out = tmp_path / "querying.md", tmp_path / "performance.md"
    guide.write_text(PAGE)
    args = ["--results", str(results), "--out", str(out), "--guide", str(guide)]
    assert main(args) == 0
    first = guide.read_text()
    assert "-->50 ms<!--" in first and out.read_text().startswith("> Generated by `make docs`")
    assert main(args) == 0
    assert guide.read_text() == first


def test_a_wrapped_paragraph_never_starts_a_line_as_markdown_syntax() -> None:
    words = ["word"] * 23 + ["-", "dash", "12.", "ok", "#", "x", "+", "y", "1)", "z"]
    text = " ".join(words * 12)
    lines = wrap_paragraph(text).split("\n")
    assert len(lines) > 5 and " ".join(lines) == text
    for line in lines:
        assert line.split(" ")[0] not in ("-", "12.", "#", "+", "1)"), line
