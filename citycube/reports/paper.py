"""The paper-vs-release report: AgenticCity-Bench's availability tables beside the release's own.

``schemas/paper.yaml`` holds what the paper reports (Table 10 by modality, Table 11 by city)
and every documented departure from it, as validated data; a departure that removes
combinations the paper counts says how many per modality and city. The report puts the paper's
counts next to what the departures leave of them and the release's, per modality and per city,
with the differences in percentage points (and in counts when the release holds the paper's
whole 16 × 26 calendar), then lists the departures with their reasons and shares. It is
rewritten with every build's availability report.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Self

import pandas as pd
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
    paths = comparison_paths(release)
    write_text_atomic(by_modality.to_csv(index=False), paths["paper_modality_csv"])
    write_text_atomic(by_city.to_csv(index=False), paths["paper_city_csv"])
    write_text_atomic(
        comparison_markdown(availability, by_modality, by_city, paper) + "\n", paths["paper_md"]
    )
    return paths
