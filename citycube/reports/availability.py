"""Availability report of a release: per-modality and per-city tables and a heatmap.

A (city, year, modality, field) combination is available when at least one tile has an available
value of the field that year (AgenticCity-Bench App. B.4); a (city, year, modality) combination
is available when every field of the modality is — AQ counts a city-year only when both NO2 and
PM2.5 are present, as AgenticCity-Bench Table 10's 240 / 416 implies. Per-field counts are
reported too, so a modality held back by one field shows which. The report's scope is the set of
city-years
the release holds (any modality); every one of the catalogue's 18 modalities is counted over
that scope, so a modality the release does not process contributes 0 available combinations and
is flagged ``not processed`` rather than left out, and the overall percentage stays comparable
with the full 16 × 26 × 18 calendar.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from citycube.catalogue.cities import load_cities
from citycube.catalogue.modalities import Catalogue
from citycube.catalogue.temporal import CALENDAR
from citycube.cube.release import Release
from citycube.errors import ReleaseNotFoundError
from citycube.io.atomic import atomic_path, write_text_atomic

__all__ = [
    "HEATMAP_COLOURS",
    "Availability",
    "AvailabilitySource",
    "city_table",
    "heatmap_png",
    "load_availability",
    "markdown_table",
    "modality_table",
    "report_paths",
    "write_report",
]

HEATMAP_COLOURS: dict[str, tuple[int, int, int]] = {
    "available": (33, 102, 172),
    "unavailable": (244, 165, 130),
    "not in scope": (245, 245, 245),
    "not processed": (170, 170, 170),
}
"""Fixed cell colours of the heatmap (blue / salmon stay distinct for red-green deficiency)."""

HEATMAP_WIDTH_PX = 1600
"""Width of the heatmap PNG."""

OVERALL = "Overall"


@dataclass(frozen=True)
class Availability:
    """What a release holds, reduced to city-year-modality availability."""

    scope: frozenset[tuple[str, int]]
    """(city, year) pairs with at least one observations row, any modality."""
    processed: frozenset[str]
    """Modality codes with at least one observations row."""
    available: frozenset[tuple[str, int, str]]
    """(city, year, modality) combinations in which every field has an available tile."""
    fields: Mapping[str, tuple[str, ...]]
    """Fields of each modality with observation rows, in name order."""
    available_fields: frozenset[tuple[str, int, str, str]]
    """(city, year, modality, field) combinations with at least one available tile."""
    release: str | None = None
    """Release version, from the database's ``release`` table when present."""
    synthetic: bool | None = None
    """Whether the release says it is built from synthetic sample data."""

    @property
    def cities(self) -> list[str]:
        """Cities in scope, in the city catalogue's order (unknown keys last, sorted)."""
        present = {c for c, _ in self.scope}
        known = [c for c in load_cities() if c in present]
        return known + sorted(present - set(known))

    @property
    def years(self) -> list[int]:
        """Years in scope, ascending."""
        return sorted({y for _, y in self.scope})

    def years_of(self, city: str) -> list[int]:
        """Years in scope for one city."""
        return sorted(y for c, y in self.scope if c == city)


def load_availability(source: Path | duckdb.DuckDBPyConnection) -> Availability:
    """Read availability from a release database (a path, opened read-only, or a connection).

    Only the ``observations`` view is needed (and the ``release`` table, when present).
    """
    if isinstance(source, duckdb.DuckDBPyConnection):
        return _read_availability(source)
    con = duckdb.connect(str(source), read_only=True)
    try:
        return _read_availability(con)
    finally:
        con.close()


def _read_availability(con: duckdb.DuckDBPyConnection) -> Availability:
    rows = con.execute(
        """
        SELECT city, CAST(year AS INTEGER), modality, field, bool_or(available)
        FROM observations GROUP BY ALL
        """
    ).fetchall()
    fields: dict[str, set[str]] = {}
    missing_field: set[tuple[str, int, str]] = set()
    for city, year, modality, field, ok in rows:
        fields.setdefault(modality, set()).add(field)
        if not ok:
            missing_field.add((city, int(year), modality))
    meta: dict[str, object] = {}
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    if "release" in tables:
        for key, value in con.execute("SELECT key, value FROM release").fetchall():
            try:
                meta[key] = json.loads(value)
            except (TypeError, json.JSONDecodeError):
                meta[key] = value
    synthetic = meta.get("synthetic")
    combinations = {(c, int(y), m) for c, y, m, _, _ in rows}
    return Availability(
        scope=frozenset((c, y) for c, y, _ in combinations),
        processed=frozenset(fields),
        available=frozenset(combinations - missing_field),
        fields={m: tuple(sorted(f)) for m, f in sorted(fields.items())},
        available_fields=frozenset((c, int(y), m, f) for c, y, m, f, ok in rows if ok),
        release=str(meta["version"]) if "version" in meta else None,
        synthetic=synthetic if isinstance(synthetic, bool) else None,
    )


AvailabilitySource = Availability | Path | duckdb.DuckDBPyConnection
"""Loaded availability, a release database path, or an open connection to one."""


def _as_availability(source: AvailabilitySource) -> Availability:
    return source if isinstance(source, Availability) else load_availability(source)


def _percent(available: int, possible: int) -> float:
    return round(100.0 * available / possible, 3) if possible else math.nan


def modality_table(source: AvailabilitySource, catalogue: Catalogue) -> pd.DataFrame:
    """Available / possible city-year combinations per modality (catalogue order) + Overall."""
    availability = _as_availability(source)
    possible = len(availability.scope)
    rows = []
    for m in catalogue.modalities:
        count = sum(1 for c, y in availability.scope if (c, y, m.code) in availability.available)
        rows.append(
            {
                "modality": m.name,
                "code": m.display_code,
                "available": count,
                "possible": possible,
                "percent": _percent(count, possible),
                "processed": m.code in availability.processed,
            }
        )
    total_available = sum(r["available"] for r in rows)
    total_possible = possible * len(catalogue.modalities)
    rows.append(
        {
            "modality": OVERALL,
            "code": "",
            "available": total_available,
            "possible": total_possible,
            "percent": _percent(total_available, total_possible),
            "processed": None,
        }
    )
    frame = pd.DataFrame(rows)
    frame["processed"] = frame["processed"].astype("boolean")
    return frame


def field_table(source: AvailabilitySource, catalogue: Catalogue) -> pd.DataFrame:
    """Available / possible city-years per field of every processed modality (catalogue order).

    A modality counts as available only where all of its fields are; this table shows which
    field held it back.
    """
    availability = _as_availability(source)
    possible = len(availability.scope)
    rows = []
    for m in catalogue.modalities:
        for field in availability.fields.get(m.code, ()):
            count = sum(
                1
                for c, y in availability.scope
                if (c, y, m.code, field) in availability.available_fields
            )
            rows.append(
                {
                    "code": m.display_code,
                    "field": field,
                    "available": count,
                    "possible": possible,
                    "percent": _percent(count, possible),
                }
            )
    return pd.DataFrame(rows, columns=["code", "field", "available", "possible", "percent"])


def city_table(source: AvailabilitySource, catalogue: Catalogue) -> pd.DataFrame:
    """Available / possible (year, modality) combinations per city over all modalities."""
    availability = _as_availability(source)
    codes = [m.code for m in catalogue.modalities]
    names = {k: c.name for k, c in load_cities().items()}
    rows = []
    for city in availability.cities:
        years = availability.years_of(city)
        count = sum(1 for y in years for m in codes if (city, y, m) in availability.available)
        possible = len(years) * len(codes)
        rows.append(
            {
                "city": names.get(city, city),
                "key": city,
                "years": len(years),
                "available": count,
                "possible": possible,
                "percent": _percent(count, possible),
            }
        )
    total_available = sum(r["available"] for r in rows)
    total_possible = sum(r["possible"] for r in rows)
    rows.append(
        {
            "city": OVERALL,
            "key": "",
            "years": len(availability.years),
            "available": total_available,
            "possible": total_possible,
            "percent": _percent(total_available, total_possible),
        }
    )
    return pd.DataFrame(rows, columns=["city", "key", "years", "available", "possible", "percent"])


# --------------------------------------------------------------------------------------------
# Markdown


def _fmt_percent(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.3f}%"


def markdown_table(frame: pd.DataFrame) -> str:
    """A report table as GitHub markdown, with 'a / p' counts and 3-decimal percentages."""
    by_modality = "modality" in frame.columns
    by_field = "field" in frame.columns
    if by_modality:
        header = ["Modality", "Code", "Available / possible", "Availability", "Status"]
        align = ["---", "---", "--:", "--:", "---"]
    elif by_field:
        header = ["Code", "Field", "Available / possible", "Availability"]
        align = ["---", "---", "--:", "--:"]
    else:
        header = ["City", "Years", "Available / possible", "Availability"]
        align = ["---", "--:", "--:", "--:"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for row in frame.itertuples(index=False):
        counts = f"{row.available:,} / {row.possible:,}"
        share = _fmt_percent(row.percent)
        if by_modality:
            status = (
                ""
                if pd.isna(row.processed)
                else ("processed" if row.processed else "not processed")
            )
            cells = [row.modality, row.code, counts, share, status]
        elif by_field:
            cells = [row.code, row.field, counts, share]
        else:
            cells = [row.city, str(row.years), counts, share]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def scope_text(availability: Availability) -> str:
    """One paragraph recording the scope the percentages are computed over."""
    years, cities = availability.years, availability.cities
    return (
        f"Scope: {len(availability.scope)} city-years held by the release "
        f"({_count(len(cities), 'city', 'cities')}: {', '.join(cities) or 'none'}; "
        f"{_count(len(years), 'year', 'years')}: {', '.join(map(str, years)) or 'none'}). "
        "A field is available in a city-year when at least one tile has an available value of "
        "it; a modality is available when all of its fields are (per-field counts in "
        "availability_by_field); modalities the release does not process count as unavailable "
        "and are marked 'not processed'."
    )


def report_heading(title: str, availability: Availability) -> str:
    """A report's title, release, synthetic warning and scope paragraph (markdown)."""
    lines = [f"# {title}", ""]
    if availability.release:
        lines += [f"Release `{availability.release}`.", ""]
    if availability.synthetic:
        lines += ["**Synthetic sample data: not observations of any real place.**", ""]
    return "\n".join([*lines, scope_text(availability), ""])


# --------------------------------------------------------------------------------------------
# Heatmap


def _states(availability: Availability, catalogue: Catalogue) -> np.ndarray:
    """(modality, city, calendar year) codes: 0 not in scope, 1 not processed, 2 no, 3 yes."""
    cities, years = availability.cities, list(CALENDAR)
    states = np.zeros((len(catalogue.modalities), len(cities), len(years)), dtype=np.uint8)
    for i, m in enumerate(catalogue.modalities):
        processed = m.code in availability.processed
        for j, city in enumerate(cities):
            for k, year in enumerate(years):
                if (city, year) not in availability.scope:
                    continue
                if not processed:
                    states[i, j, k] = 1
                else:
                    states[i, j, k] = 3 if (city, year, m.code) in availability.available else 2
    return states


def heatmap_png(path: Path, source: AvailabilitySource, catalogue: Catalogue) -> Path:
    """City × year availability, one small panel per modality, written as PNG.

    Columns are the whole 2000–2025 calendar, so years outside the release show as 'not in
    scope'; rows are the cities in scope; colours are fixed (``HEATMAP_COLOURS``). Drawn on a
    bare ``Figure`` with the Agg canvas and matplotlib's default style, so neither pyplot's
    global state nor a caller's rcParams change the image.
    """
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    availability = _as_availability(source)
    order = ["not in scope", "not processed", "unavailable", "available"]
    colours = [tuple(c / 255 for c in HEATMAP_COLOURS[name]) for name in order]
    cmap = ListedColormap(colours)
    states = _states(availability, catalogue)
    cities = availability.cities
    n_cities = max(1, len(cities))
    ncols, nrows = 3, math.ceil(len(catalogue.modalities) / 3)
    axes_h = max(0.45, 0.19 * n_cities)  # inches per panel: one row of cells per city
    gap_h, top_h, bottom_h = 0.62, 0.95, 0.75  # panel title + year labels; suptitle; legend
    height = top_h + nrows * axes_h + (nrows - 1) * gap_h + bottom_h
    dpi = 100
    names = {k: c.name for k, c in load_cities().items()}
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(HEATMAP_WIDTH_PX / dpi, height), dpi=dpi)
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, squeeze=False)
        fig.subplots_adjust(
            left=0.1,
            right=0.99,
            top=1 - top_h / height,
            bottom=bottom_h / height,
            hspace=gap_h / axes_h,
            wspace=0.05,
        )
        year_ticks = [k for k, y in enumerate(CALENDAR) if y % 5 == 0]
        for i, m in enumerate(catalogue.modalities):
            ax = axes[i // ncols][i % ncols]
            data = states[i] if cities else np.zeros((1, len(CALENDAR)), np.uint8)
            ax.imshow(data, cmap=cmap, vmin=0, vmax=3, interpolation="nearest", aspect="auto")
            count = int((data == 3).sum())
            possible = len(availability.scope)
            flag = "" if m.code in availability.processed else "  (not processed)"
            ax.set_title(
                f"{m.display_code} · {m.name}: {count}/{possible}{flag}", fontsize=9, loc="left"
            )
            # Cell separators as two line collections (minor-tick grids cost ~10× more).
            edges_x, edges_y = np.arange(len(CALENDAR) + 1) - 0.5, np.arange(n_cities + 1) - 0.5
            ax.vlines(edges_x, edges_y[0], edges_y[-1], colors="white", linewidth=0.6)
            ax.hlines(edges_y, edges_x[0], edges_x[-1], colors="white", linewidth=0.6)
            ax.set_xticks(year_ticks, [str(CALENDAR[k]) for k in year_ticks], fontsize=8)
            labels = [names.get(c, c) for c in cities] if i % ncols == 0 else []
            ax.set_yticks(range(len(cities)), labels, fontsize=8)
        for j in range(len(catalogue.modalities), nrows * ncols):
            axes[j // ncols][j % ncols].set_visible(False)
        overall = modality_table(availability, catalogue).iloc[-1]
        title = (
            f"Availability by city, year and modality — {overall.available:,} / "
            f"{overall.possible:,} combinations ({_fmt_percent(overall.percent)})"
        )
        if availability.release:
            title += f", release {availability.release}"
        if availability.synthetic:
            title += " (SYNTHETIC sample data)"
        fig.text(0.01, 1 - 0.3 / height, title, fontsize=13, ha="left", va="center")
        fig.text(
            0.01,
            1 - 0.55 / height,
            "Rows: cities; columns: calendar years. A cell is available when, for every field "
            "of the modality, at least one tile of the city has an available value that year.",
            fontsize=9,
            ha="left",
            va="center",
            color="0.3",
        )
        fig.legend(
            handles=[
                Patch(facecolor=c, edgecolor="0.5", label=n)
                for n, c in zip(order, colours, strict=True)
            ],
            loc="lower center",
            ncol=4,
            fontsize=9,
            frameon=False,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None})
    return path


# --------------------------------------------------------------------------------------------
# Files


def report_paths(release: Release) -> dict[str, Path]:
    """Where ``write_report`` puts each file, under ``<release>/reports/``."""
    d = release.root / "reports"
    return {
        "modality_csv": d / "availability_by_modality.csv",
        "modality_md": d / "availability_by_modality.md",
        "city_csv": d / "availability_by_city.csv",
        "city_md": d / "availability_by_city.md",
        "field_csv": d / "availability_by_field.csv",
        "field_md": d / "availability_by_field.md",
        "heatmap_png": d / "availability_heatmap.png",
        "scope_json": d / "availability_scope.json",
    }


def report_markdown(
    availability: Availability, tables: Mapping[str, pd.DataFrame]
) -> dict[str, str]:
    """The markdown documents (by modality, by field, by city), keyed like ``tables``."""
    titles = {
        "modality": "Availability by modality",
        "field": "Availability by field",
        "city": "Availability by city",
    }
    return {
        key: report_heading(titles[key], availability) + "\n" + markdown_table(frame) + "\n"
        for key, frame in tables.items()
    }


def write_report(release: Release, catalogue: Catalogue) -> dict[str, Path]:
    """(Re)write the availability report of a release from its DuckDB database, atomically."""
    if not release.duckdb_file.exists():
        raise ReleaseNotFoundError(
            f"no release database at {release.duckdb_file}; materialise cube/database "
            "(or run `citycube views`) for this data root and release first"
        )
    availability = load_availability(release.duckdb_file)
    tables = {
        "modality": modality_table(availability, catalogue),
        "field": field_table(availability, catalogue),
        "city": city_table(availability, catalogue),
    }
    paths = report_paths(release)
    docs = report_markdown(availability, tables)
    for key, frame in tables.items():
        write_text_atomic(frame.to_csv(index=False, float_format="%.3f"), paths[f"{key}_csv"])
        write_text_atomic(docs[key], paths[f"{key}_md"])
    heatmap_png(paths["heatmap_png"], availability, catalogue)
    scope = {
        "release": availability.release,
        "synthetic": availability.synthetic,
        "cities": availability.cities,
        "years": availability.years,
        "city_years": sorted([c, y] for c, y in availability.scope),
        "processed_modalities": sorted(availability.processed),
        "catalogue_modalities": [m.code for m in catalogue.modalities],
    }
    write_text_atomic(json.dumps(scope, indent=2) + "\n", paths["scope_json"])
    return paths
