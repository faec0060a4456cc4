"""Synthetic twin of the school-capacity reference: the same two file formats the Department for
Education serves (a school-level capacity CSV per academic year, UTF-8, with local-authority
total rows; a GIAS establishment CSV in Windows-1252 with British National Grid coordinates),
for London only (the publications cover England).

Every school is named "Synthetic … School" and sits in a "Synthetic borough": nothing here is
an observation. Gaps are those the real files have: schools missing a year, a phase that
changes, places or pupils suppressed (``z``/``x``), establishments without a location (0, 0),
some beyond the city grid, some URNs GIAS does not list. Deterministic for a seed.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from citycube.errors import SourceUnavailableError
from citycube.items.staging import InstalledItem, StagedFiles, install_item

SAMPLE_SCHOOL_VERSION = "sample-school-1"
"""Version of the generator; bump when the files change."""
YEARS = (2021, 2022, 2023, 2024)
"""Academic years written (2021/22 … 2024/25)."""
CITIES = ("London",)
"""Cities the publications cover."""
SCHOOLS = 1_600
"""Establishments generated (the real Greater London file lists about 3,000)."""
CAPACITY_HEADER = [
    "time_period",
    "time_identifier",
    "geographic_level",
    "country_code",
    "country_name",
    "region_code",
    "region_name",
    "new_la_code",
    "la_name",
    "urn",
    "school_name",
    "school_phase",
    "school_capacity",
    "number_of_pupils",
]
GIAS_HEADER = [
    "URN",
    "LA (code)",
    "LA (name)",
    "EstablishmentName",
    "TypeOfEstablishment (name)",
    "EstablishmentStatus (name)",
    "PhaseOfEducation (name)",
    "Easting",
    "Northing",
]
NAMES = ("St Mary’s", "Église Road", "Hillside", "Riverside", "Oak Lane", "Parkfield", "Grove")
"""Name stems; two need Windows-1252 (a curly apostrophe, an accent)."""


def _school_frame(seed: int) -> dict[str, np.ndarray]:
    """Per school: URN, phase, location, capacities and pupils for each year (may be NaN)."""
    from pyproj import Transformer

    from citycube.grid.tiles import city_grid

    rng = np.random.default_rng([seed, 38_2024])
    n = SCHOOLS
    grid = city_grid("London", "2km")
    x0, y0, x1, y1 = grid.bounds
    # a few beyond the grid on every side, the rest inside it
    x = rng.uniform(x0 - 1_500, x1 + 1_500, n)
    y = rng.uniform(y0 - 1_500, y1 + 1_500, n)
    to_bng = Transformer.from_crs(grid.crs, "EPSG:27700", always_xy=True)
    easting, northing = (np.round(v) for v in to_bng.transform(x, y))
    secondary = rng.random(n) < 0.3
    base = np.where(secondary, rng.integers(4, 11, n) * 150, rng.integers(1, 4, n) * 210)
    capacity = np.repeat(base[:, None].astype(float), len(YEARS), axis=1)
    # some schools gain places over the years (a bulge class, a new wing)
    grow = rng.random(n) < 0.15
    step = np.where(secondary, 150, 30)
    capacity[grow, 2:] += step[grow, None]
    # utilisation: a level and a yearly drift; the target year spreads over surplus,
    # balanced and shortage (about 35 %, 35 %, 30 %)
    level = rng.choice([0.80, 1.00, 1.10], n, p=[0.35, 0.35, 0.30]) + rng.normal(0, 0.02, n)
    drift = rng.normal(0.0, 0.015, n)
    t = np.arange(len(YEARS)) - (len(YEARS) - 1)
    util = level[:, None] + drift[:, None] * t[None, :] + rng.normal(0, 0.01, (n, len(YEARS)))
    # the target year is judged against the last historical capacity (no expansion)
    reference = capacity.copy()
    reference[:, -1] = capacity[:, -2]
    pupils = np.round(util * reference)
    # gaps the real files have
    missing_year = rng.random(n) < 0.04
    which = rng.integers(0, len(YEARS), n)
    suppressed = rng.random((n, len(YEARS))) < 0.01
    pupils[suppressed] = np.nan
    capacity_out = capacity.copy()
    capacity_out[rng.random((n, len(YEARS))) < 0.005] = np.nan
    capacity_out[rng.random((n, len(YEARS))) < 0.003] = 0.0  # a closed site reports none
    no_location = rng.random(n) < 0.02
    easting[no_location] = 0
    northing[no_location] = 0
    return {
        "urn": 100_000 + np.arange(n) * 7 + rng.integers(0, 7, n),
        "secondary": secondary,
        "phase_change": rng.random(n) < 0.01,
        "easting": easting,
        "northing": northing,
        "capacity": capacity_out,
        "pupils": pupils,
        "missing_year": np.where(missing_year, which, -1),
        "not_in_gias": rng.random(n) < 0.01,
    }


def _cell(value: float, symbol: str) -> str:
    return symbol if not np.isfinite(value) else str(int(value))


def capacity_csv(frame: dict[str, np.ndarray], year: int) -> bytes:
    """The year's school-level capacity CSV (UTF-8), with a London total row first."""
    i = YEARS.index(year)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CAPACITY_HEADER)
    period = f"{year}{(year + 1) % 100:02d}"
    region = [period, "Academic year", "Regional", "E92000001", "England", "E12000007", "London"]
    w.writerow([*region, "", "", "", "", "Total", "z", "z"])
    for k in range(len(frame["urn"])):
        if frame["missing_year"][k] == i:
            continue
        secondary = bool(frame["secondary"][k]) != (bool(frame["phase_change"][k]) and i == 3)
        phase = "Secondary" if secondary else "Primary"
        w.writerow(
            [
                *region[:3],
                "E92000001",
                "England",
                "E12000007",
                "London",
                "E09000999",
                "Synthetic borough",
                int(frame["urn"][k]),
                f"Synthetic {phase} School {k:04d}",
                phase,
                _cell(frame["capacity"][k, i], "z"),
                _cell(frame["pupils"][k, i], "x"),
            ]
        )
    return out.getvalue().encode("utf-8")


def gias_csv(frame: dict[str, np.ndarray]) -> bytes:
    """The GIAS establishment extract (Windows-1252, as GIAS writes it)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_ALL)
    w.writerow(GIAS_HEADER)
    for k in range(len(frame["urn"])):
        if frame["not_in_gias"][k]:
            continue
        phase = "Secondary" if frame["secondary"][k] else "Primary"
        stem = NAMES[k % len(NAMES)]
        w.writerow(
            [
                int(frame["urn"][k]),
                "999",
                "Synthetic borough",
                f"Synthetic {stem} {phase} School {k:04d}",
                "Community school",
                "Open",
                phase,
                int(frame["easting"][k]),
                int(frame["northing"][k]),
            ]
        )
    return out.getvalue().encode("cp1252")


def sample_school_files(city: str, seed: int = 0) -> dict[str, bytes]:
    """The files by name (``capacity_2021.csv`` … ``gias.csv``) of a city the twin covers."""
    if city not in CITIES:
        raise SourceUnavailableError(
            f"school capacity: {city} is not in England; the Department for Education's "
            "School capacity releases and Get Information about Schools cover England only "
            "(of the cube's cities, London)",
            reason="outside_source_coverage",
        )
    frame = _school_frame(seed)
    files = {f"capacity_{y}.csv": capacity_csv(frame, y) for y in YEARS}
    files["gias.csv"] = gias_csv(frame)
    return files


def sample_school_item(city: str, root: Path, seed: int = 0) -> InstalledItem:
    """Install the twin's files as an item under ``root/dfe_school_capacity/<city>/``."""
    from sources.dfe_schools.fetch import PRODUCT_ID

    files = sample_school_files(city, seed)
    identity = {
        "product": PRODUCT_ID,
        "city": city,
        "source_id": f"sample:{PRODUCT_ID}",
        "version": SAMPLE_SCHOOL_VERSION,
        "seed": seed,
        "synthetic": True,
    }

    def write(staging: Path) -> StagedFiles:
        roles = {}
        for i, (name, body) in enumerate(files.items()):
            (staging / name).write_bytes(body)
            roles["gias" if name == "gias.csv" else f"capacity_{i}"] = name
        return StagedFiles(roles, {"synthetic": True, "notice": "synthetic sample, not observed"})

    return install_item(root / PRODUCT_ID / city, identity, write)
