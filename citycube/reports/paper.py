"""The paper-vs-release report: AgenticCity-Bench's availability tables and its translation route
counts (Table 14) beside the release's own.

``schemas/paper.yaml`` holds what the paper reports (Table 10 by modality, Table 11 by city,
Table 14 by translation route) and every documented departure from it, as validated data; a
departure that removes combinations the paper counts says how many per modality and city. The
report puts the paper's counts next to what the departures leave of them and the release's,
per modality and per city, with the differences in percentage points (and in counts when the
release holds the paper's whole 16 × 26 calendar), then Table 14's route counts beside the
release's counted the same way (once per source product at each end), then lists the
departures with their reasons and shares. It is rewritten with every build's availability report.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Self

import pandas as pd
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from citycube.catalogue.cities import load_cities
from citycube.catalogue.modalities import Catalogue, parse_yaml_spec
from citycube.cube.release import Release
from citycube.errors import ReleaseNotFoundError, SpecError
from citycube.io.atomic import write_text_atomic
from citycube.reports.availability import (
    Availability,
    city_table,
    load_availability,
    modality_table,
    report_heading,
)

_STRICT = ConfigDict(extra="forbid", frozen=True)


class Calendar(BaseModel):
    """The size of the paper's release."""

    model_config = _STRICT
    cities: int = Field(gt=0)
    years: int = Field(gt=0)
    modalities: int = Field(gt=0)


class Counts(BaseModel):
    """Available out of possible combinations."""

    model_config = _STRICT
    available: int = Field(ge=0)
    possible: int = Field(gt=0)


class Departure(BaseModel):
    """One place where the release differs from the paper on purpose, and why."""

    model_config = _STRICT
    id: str = Field(pattern=r"^[a-z0-9-]+$")
    topic: str
    paper: str
    release: str
    reason: str
    shortfall: dict[str, dict[str, Annotated[int, Field(gt=0)]]] = Field(default_factory=dict)
    """Combinations the paper counts that this departure removes: modality → city → count."""

    def shortfall_of_modality(self, code: str) -> int:
        """Combinations of one modality the departure removes (Table 10's unit)."""
        return sum(self.shortfall.get(code, {}).values())

    def shortfall_of_city(self, city: str) -> int:
        """Combinations of one city the departure removes (Table 11's unit)."""
        return sum(by_city.get(city, 0) for by_city in self.shortfall.values())


class PaperTables(BaseModel):
    """AgenticCity-Bench's availability tables and the release's documented departures."""

    model_config = _STRICT
    calendar: Calendar
    overall: Counts
    by_modality: dict[str, int]
    by_city: dict[str, int]
    table14: dict[str, tuple[Annotated[int, Field(ge=0)] | None, ...]] | None = None
    """Table 14: pairs per directed route (source → its row of counts, targets in the same
    order), in the paper's unit (once per source product at each end)."""
    departures: tuple[Departure, ...]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        cal = self.calendar
        if self.overall.possible != cal.cities * cal.years * cal.modalities:
            raise ValueError("overall.possible must be cities × years × modalities")
        for name, table, each in (
            ("by_modality", self.by_modality, cal.cities * cal.years),
            ("by_city", self.by_city, cal.years * cal.modalities),
        ):
            if sum(table.values()) != self.overall.available:
                raise ValueError(f"{name} sums to {sum(table.values())}, not overall.available")
            over = sorted(k for k, v in table.items() if not 0 <= v <= each)
            if over:
                raise ValueError(f"{name}: counts of {over} lie outside 0–{each}")
        if self.table14 is not None:
            self._check_table14(self.table14)
        ids = [d.id for d in self.departures]
        if len(set(ids)) != len(ids):
            raise ValueError("departure ids must be unique")
        for code, expected in self.expected_by_modality.items():
            if expected < 0:
                raise ValueError(f"departures remove more {code} city-years than Table 10 has")
        for city, expected in self.expected_by_city.items():
            if expected < 0:
                raise ValueError(f"departures remove more of {city} than Table 11 has")
        for d in self.departures:
            for code, by_city in d.shortfall.items():
                over = sorted(c for c, n in by_city.items() if n > cal.years)
                if over:
                    raise ValueError(f"{d.id}: {code} shortfall of {over} exceeds {cal.years}")
        return self

    @staticmethod
    def _check_table14(table: dict[str, tuple[int | None, ...]]) -> None:
        codes = list(table)
        for i, (code, row) in enumerate(table.items()):
            if len(row) != len(codes):
                raise ValueError(f"table14 row {code} has {len(row)} counts, not {len(codes)}")
            blanks = [codes[j] for j, v in enumerate(row) if v is None]
            if blanks != [code]:
                raise ValueError(f"table14 row {code} must be blank on its own column only")
            for j, other in enumerate(codes):
                if j != i and row[j] != table[other][i]:
                    raise ValueError(
                        f"table14 is not symmetric: {code} → {other} {row[j]}, "
                        f"{other} → {code} {table[other][i]}"
                    )

    def route_pairs(self) -> dict[tuple[str, str], int]:
        """Table 14 as (source, target) → pairs (empty when the tables have none)."""
        table = self.table14 or {}
        codes = list(table)
        return {
            (s, codes[j]): int(v)
            for s, row in table.items()
            for j, v in enumerate(row)
            if v is not None
        }

    def shortfall_of_modality(self, code: str) -> int:
        """Combinations of one modality the documented departures remove."""
        return sum(d.shortfall_of_modality(code) for d in self.departures)

    def shortfall_of_city(self, city: str) -> int:
        """Combinations of one city the documented departures remove."""
        return sum(d.shortfall_of_city(city) for d in self.departures)

    @property
    def expected_by_modality(self) -> dict[str, int]:
        """Table 10 less what the departures remove: what a full release should count."""
        return {code: n - self.shortfall_of_modality(code) for code, n in self.by_modality.items()}

    @property
    def expected_by_city(self) -> dict[str, int]:
        """Table 11 less what the departures remove: what a full release should count."""
        return {city: n - self.shortfall_of_city(city) for city, n in self.by_city.items()}

    @property
    def city_years(self) -> int:
        """Possible city-years of one modality (Table 10's denominator)."""
        return self.calendar.cities * self.calendar.years

    @property
    def combinations_per_city(self) -> int:
        """Possible (year, modality) combinations of one city (Table 11's denominator)."""
        return self.calendar.years * self.calendar.modalities

    def check_against(self, catalogue: Catalogue) -> None:
        """Fail when the tables name other modalities or cities than the catalogues hold."""
        codes = {m.code for m in catalogue.modalities}
        cities = set(load_cities())
        for name, keys, known in (
            ("by_modality", set(self.by_modality), codes),
            ("by_city", set(self.by_city), cities),
            ("table14", set(self.table14 or codes), codes),
        ):
            if keys != known:
                raise SpecError(
                    f"schemas/paper.yaml {name} names {sorted(keys - known)} and lacks "
                    f"{sorted(known - keys)}; it must list exactly {sorted(known)}"
                )
        for d in self.departures:
            unknown = sorted(set(d.shortfall) - codes) + sorted(
                {c for by_city in d.shortfall.values() for c in by_city} - cities
            )
            if unknown:
                raise SpecError(
                    f"schemas/paper.yaml departure {d.id} has a shortfall for {unknown}, "
                    "which are not modality codes or city keys of the catalogues"
                )


def parse_paper_tables(text: str, origin: str = "<string>") -> PaperTables:
    """Parse and validate the paper's tables, with a readable error."""
    return parse_yaml_spec(PaperTables, text, origin, "paper tables")


@cache
def load_paper_tables() -> PaperTables:
    """The packaged ``schemas/paper.yaml``."""
    text = resources.files("schemas").joinpath("paper.yaml").read_text(encoding="utf-8")
    return parse_paper_tables(text, "schemas/paper.yaml")


def _percent(available: int, possible: int) -> float | None:
    return round(100.0 * available / possible, 3) if possible else None


def _difference(release: float | None, paper: float | None) -> float | None:
    return None if release is None or paper is None else round(release - paper, 3)


def _full_calendar(availability: Availability, paper: PaperTables) -> bool:
    cal = paper.calendar
    return len(availability.cities) == cal.cities and len(availability.scope) == (
        cal.cities * cal.years
    )


def _counts(
    paper_count: int,
    shortfall: int,
    paper_possible: int,
    release_count: int,
    release_possible: int,
    full: bool,
) -> dict[str, object]:
    """One comparison row's figures: the paper's, what its departures leave, the release's."""
    paper_pct = _percent(paper_count, paper_possible)
    expected = paper_count - shortfall
    expected_pct = _percent(expected, paper_possible)
    release_pct = _percent(release_count, release_possible)
    return {
        "paper_available": paper_count,
        "paper_possible": paper_possible,
        "paper_percent": paper_pct,
        "departures_shortfall": shortfall,
        "expected_available": expected,
        "expected_percent": expected_pct,
        "release_available": release_count,
        "release_possible": release_possible,
        "release_percent": release_pct,
        "difference_pp": _difference(release_pct, paper_pct),
        "difference_count": release_count - paper_count if full else None,
        "difference_from_expected_pp": _difference(release_pct, expected_pct),
        "difference_from_expected_count": release_count - expected if full else None,
    }


def modality_comparison(
    availability: Availability, catalogue: Catalogue, paper: PaperTables
) -> pd.DataFrame:
    """Per modality: the paper's Table 10 count and share, the release's, and the differences."""
    paper.check_against(catalogue)
    ours = modality_table(availability, catalogue).set_index("code")
    full = _full_calendar(availability, paper)
    rows = []
    for m in catalogue.modalities:
        count, possible = (int(v) for v in ours.loc[m.display_code, ["available", "possible"]])
        figures = _counts(
            paper.by_modality[m.code],
            paper.shortfall_of_modality(m.code),
            paper.city_years,
            count,
            possible,
            full,
        )
        rows.append({"code": m.display_code, "modality": m.name, **figures})
    return pd.DataFrame(rows)


def city_comparison(
    availability: Availability, catalogue: Catalogue, paper: PaperTables
) -> pd.DataFrame:
    """Per city: the paper's Table 11 count and share, the release's, and the differences."""
    paper.check_against(catalogue)
    ours = city_table(availability, catalogue).set_index("key")
    full = _full_calendar(availability, paper)
    names = {k: c.name for k, c in load_cities().items()}
    rows = []
    for city, paper_count in paper.by_city.items():
        held = city in ours.index
        count = int(ours.loc[city, "available"]) if held else 0
        possible = int(ours.loc[city, "possible"]) if held else 0
        figures = _counts(
            paper_count,
            paper.shortfall_of_city(city),
            paper.combinations_per_city,
            count,
            possible,
            full,
        )
        rows.append({"key": city, "city": names.get(city, city), **figures})
    return pd.DataFrame(rows)


def route_comparison(routes: pa.Table | None, paper: PaperTables) -> pd.DataFrame:
    """Per directed route: Table 14's count and the release's, counted the paper's way (once
    per source product at each end) and one pair per key.

    ``routes`` is the release's ``route_counts_long`` (None when it has no benchmark; a release
    built before ``pairs_by_product`` was counted has no by-product column).
    """
    mine: dict[tuple[str, str], dict[str, object]] = {}
    if routes is not None:
        by_product = "pairs_by_product" in routes.column_names
        for row in routes.to_pylist():
            mine[(row["source"], row["target"])] = {
                "per_key": row["pairs"],
                "by_product": row["pairs_by_product"] if by_product else None,
            }
    rows = []
    for (source, target), count in paper.route_pairs().items():
        ours = mine.get((source, target), {})
        by_product = ours.get("by_product")
        rows.append(
            {
                "source": source,
                "target": target,
                "paper_pairs": count,
                "release_pairs_by_product": by_product,
                "release_pairs_per_key": ours.get("per_key"),
                "difference_by_product": None if by_product is None else by_product - count,
            }
        )
    return pd.DataFrame(rows)


def _route_lines(by_route: pd.DataFrame, paper: PaperTables, full: bool) -> list[str]:
    """The Table 14 section: the counting unit, the totals and every route."""
    keys = paper.calendar.years * _grid_tiles()
    paper_total = int(by_route["paper_pairs"].sum())
    over = int((by_route["paper_pairs"] > keys).sum())
    lines = [
        "## Translation routes (AgenticCity-Bench Table 14)",
        "",
        "AgenticCity-Bench counts a route once per source product at each end: OPT once per "
        "sensor (Landsat and Planet), AQ once per product (NO2 and PM2.5). So its total is "
        f"{paper_total:,} and {over} of its {len(by_route)} counts exceed the {keys:,} (tile, "
        "year) keys of the calendar, every one of them an OPT or AQ route. *By product* counts "
        "the release the same way and is the column compared; *per key* is the release's own "
        "unit, one pair per key offering both modalities, from which the instances are drawn. "
        "The release has no Planet imagery (departure `opt-planet`), so its OPT routes count "
        "Landsat alone where the paper's add Planet's years (2009–2025); other differences "
        "follow the availability above.",
        "",
    ]
    measured = by_route["release_pairs_by_product"].notna()
    if not by_route["release_pairs_per_key"].notna().any():
        return [*lines, "The release has no translation pair counts (benchmark not built).", ""]
    per_key_total = int(by_route["release_pairs_per_key"].sum())
    if measured.any():
        total = int(by_route["release_pairs_by_product"].sum())
        lines.append(
            f"Pairs in all: paper {paper_total:,}, release by product {total:,} "
            f"({total - paper_total:+,}), release per key {per_key_total:,}. Routes above "
            f"{keys:,}: paper {over}, release by product "
            f"{int((by_route['release_pairs_by_product'] > keys).sum())}."
        )
    else:
        lines.append(
            f"Pairs in all: paper {paper_total:,}, release per key {per_key_total:,}; this "
            "release was built without the by-product count (rebuild it to compare)."
        )
    if not full:
        lines.append(
            "The release holds part of the paper's calendar, so its counts are not expected "
            "to reach the paper's."
        )
    lines += [
        "",
        "| Route | Paper | Release by product | Difference | Release per key |",
        "|---|--:|--:|--:|--:|",
    ]
    for row in by_route.to_dict("records"):
        by_product = row["release_pairs_by_product"]
        per_key = row["release_pairs_per_key"]
        lines.append(
            f"| {row['source']} → {row['target']} | {row['paper_pairs']:,} | "
            f"{'–' if pd.isna(by_product) else f'{int(by_product):,}'} | "
            f"{_signed_count(row['difference_by_product'])} | "
            f"{'–' if pd.isna(per_key) else f'{int(per_key):,}'} |"
        )
    return [*lines, ""]


def _grid_tiles() -> int:
    """Tiles of every city at both scales (a (tile, year) key per tile and year)."""
    from citycube.catalogue.cities import SCALES
    from citycube.grid.tiles import city_grid

    return sum(city_grid(c, s).n_tiles for c in load_cities() for s in SCALES)


def _share(available: int, possible: int, percent: float | None) -> str:
    if not possible:
        return "not in the release"
    return f"{available:,} / {possible:,} ({percent:.3f}%)"


def _signed_pp(value: float | None) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:+.3f} pp"


def _signed_count(value: float | None) -> str:
    return "–" if value is None or pd.isna(value) else f"{int(value):+,}"


def _table(frame: pd.DataFrame, header: str, name_column: str) -> list[str]:
    lines = [
        f"| {header} | Paper | Departures | Expected after departures | Release "
        "| Difference | Difference (count) | Release − expected |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in frame.to_dict("records"):
        paper = _share(row["paper_available"], row["paper_possible"], row["paper_percent"])
        expected = _share(row["expected_available"], row["paper_possible"], row["expected_percent"])
        ours = _share(row["release_available"], row["release_possible"], row["release_percent"])
        shortfall = row["departures_shortfall"]
        from_expected = row["difference_from_expected_count"]
        if from_expected is None or pd.isna(from_expected):
            from_expected_text = _signed_pp(row["difference_from_expected_pp"])
        else:
            from_expected_text = _signed_count(from_expected)
        lines.append(
            f"| {row[name_column]} | {paper} | {f'−{shortfall:,}' if shortfall else '–'} | "
            f"{expected} | {ours} | {_signed_pp(row['difference_pp'])} | "
            f"{_signed_count(row['difference_count'])} | {from_expected_text} |"
        )
    return lines


def _shortfall_lines(departure: Departure) -> list[str]:
    """The combinations a departure removes, per modality, with each city's share."""
    names = {k: c.name for k, c in load_cities().items()}
    lines = []
    for code, by_city in departure.shortfall.items():
        shares = ", ".join(f"{names.get(city, city)} {n}" for city, n in by_city.items())
        lines.append(f"- Removes: {code} {sum(by_city.values()):,} ({shares})")
    return lines


def comparison_markdown(
    availability: Availability,
    by_modality: pd.DataFrame,
    by_city: pd.DataFrame,
    paper: PaperTables,
    by_route: pd.DataFrame | None = None,
) -> str:
    """The report as one markdown document."""
    full = _full_calendar(availability, paper)
    note = (
        "The release holds the paper's whole calendar, so counts compare directly."
        if full
        else "The release holds part of the paper's calendar: compare the percentages; counts "
        "are differenced only for a release of all 16 cities × 26 years."
    )
    expected_note = (
        "*Expected after departures* is the paper's count less the combinations the documented "
        "departures below remove (each lists them per modality and city); a full release "
        "should match it exactly, and *Release − expected* shows where it does not."
    )
    lines = [
        report_heading("Paper vs release: availability", availability).rstrip(),
        "",
        f"AgenticCity-Bench reports {paper.overall.available:,} of {paper.overall.possible:,} "
        "(city, year, modality) combinations available. " + note,
        "",
        expected_note,
        "",
        "## By modality (AgenticCity-Bench Table 10)",
        "",
        *_table(by_modality, "Modality", "code"),
        "",
        "## By city (AgenticCity-Bench Table 11)",
        "",
        *_table(by_city, "City", "city"),
        "",
        *([] if by_route is None or by_route.empty else _route_lines(by_route, paper, full)),
        "## Documented departures from the paper",
        "",
    ]
    for d in paper.departures:
        lines += [
            f"### {d.topic} (`{d.id}`)",
            "",
            f"- Paper: {d.paper}",
            f"- Release: {d.release}",
            f"- Why: {d.reason}",
            *_shortfall_lines(d),
            "",
        ]
    return "\n".join(lines)


def comparison_paths(release: Release) -> dict[str, Path]:
    """Where ``write_paper_comparison`` puts each file, under ``<release>/reports/``."""
    d = release.root / "reports"
    return {
        "paper_md": d / "paper_vs_release.md",
        "paper_modality_csv": d / "paper_vs_release_by_modality.csv",
        "paper_city_csv": d / "paper_vs_release_by_city.csv",
        "paper_route_csv": d / "paper_vs_release_by_route.csv",
    }


def write_paper_comparison(
    release: Release, catalogue: Catalogue, paper: PaperTables | None = None
) -> dict[str, Path]:
    """(Re)write the paper-vs-release report of a release from its DuckDB database."""
    if not release.duckdb_file.exists():
        raise ReleaseNotFoundError(
            f"no release database at {release.duckdb_file}; materialise cube/database "
            "(or run `citycube views`) for this data root and release first"
        )
    paper = paper or load_paper_tables()
    availability = load_availability(release.duckdb_file)
    by_modality = modality_comparison(availability, catalogue, paper)
    by_city = city_comparison(availability, catalogue, paper)
    by_route = route_comparison(_release_routes(release), paper)
    paths = comparison_paths(release)
    write_text_atomic(by_modality.to_csv(index=False), paths["paper_modality_csv"])
    write_text_atomic(by_city.to_csv(index=False), paths["paper_city_csv"])
    write_text_atomic(by_route.to_csv(index=False), paths["paper_route_csv"])
    write_text_atomic(
        comparison_markdown(availability, by_modality, by_city, paper, by_route) + "\n",
        paths["paper_md"],
    )
    return paths


def _release_routes(release: Release) -> pa.Table | None:
    """The published route counts (``route_counts_long``), or None without a benchmark."""
    import pyarrow.parquet as pq

    from citycube.tasks.translation import BenchmarkFiles

    path = BenchmarkFiles.published(release).route_counts_long
    return pq.read_table(path) if path.exists() else None
