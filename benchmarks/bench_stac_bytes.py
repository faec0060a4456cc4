"""Benchmark: bytes a STAC-served city-year takes over HTTP against the bytes its windows need.

The ``planetary-computer`` family reads Landsat and Copernicus DEM assets by windows over
``/vsicurl/`` range requests, never whole scenes. This fetches Boston 2020's three Landsat
products (OPT, NDVI, HEAT composites) and the static DEM mosaic from the loopback services the
tests use (``rustac serve``, a Range file server that logs the bytes it sends, a SAS token
endpoint; ``tests/stac_fixtures.py``) and counts, from the server's own log:

- **fetched:** body bytes the file server sent for the fetch;
- **baseline, needed:** compressed bytes of the internal COG tiles under each read's window
  (what an ideal windowed reader must transfer), counted once per opening of the file;
- **whole files:** what downloading every file read would have cost.

Target: fetched ≤ 1.5 × needed. Fetch time is reported too (median of the repeats; each
repeat fetches into a fresh folder, so nothing is reused).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import BenchConfig, BenchResult, Timing, log

CITY = "Boston"
YEAR = 2020
BASELINE = "compressed bytes of the COG tiles under each read's window (counted from the files)"
TARGET_RATIO = 1.5


def run(config: BenchConfig) -> BenchResult:
    """Fetch the city-year ``config.repeats`` times and account every byte the server sent."""
    from sources.stac import stac_adapters
    from tests.stac_fixtures import byte_accounting, loopback_stac_world

    seconds: list[float] = []
    totals: dict[str, dict[str, int]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="citycube-bench-stac-") as tmp,
        loopback_stac_world(Path(tmp) / "world") as world,
    ):
        world.set_faults([])
        adapters = {a.product_id: a for a in stac_adapters(world.options())}
        for attempt in range(config.repeats):
            dest = Path(tmp) / f"fetch{attempt}"
            before = len(world.log_lines())
            started = time.perf_counter()
            for product in ("landsat_c2l2", "landsat_ndvi", "landsat_st"):
                adapters[product].fetch(CITY, YEAR, dest)
            adapters["cop_dem_glo30"].fetch(CITY, None, dest)
            seconds.append(time.perf_counter() - started)
            totals = byte_accounting(world, world.log_lines()[before:], CITY)
            log(f"    fetch {attempt + 1}/{config.repeats}: {seconds[-1]:.2f} s")
    timing = Timing(tuple(seconds))
    rows: list[list[Any]] = []
    details: dict[str, Any] = {"fetch": timing.as_dict(), "bytes": totals}
    for kind, label in (("landsat", "Landsat (OPT, NDVI, HEAT)"), ("dem", "Copernicus DEM")):
        t = totals[kind]
        ratio = t["fetched"] / t["needed"]
        details[f"{kind}_ratio"] = ratio
        rows.append(
            [
                label,
                f"{t['fetched']:,}",
                f"{t['needed']:,}",
                f"{ratio:.3f}×",
                f"{t['whole']:,}",
                f"{t['fetched'] / t['whole']:.2f}",
            ]
        )
    worst = max(details["landsat_ratio"], details["dem_ratio"])
    return BenchResult(
        name="stac_bytes",
        title=f"Bytes per STAC-served city-year ({CITY} {YEAR}, loopback STAC API and file server)",
        baseline=BASELINE,
        columns=[
            "assets",
            "fetched B",
            "needed B (baseline)",
            "ratio fetched / needed",
            "whole files B",
            "share of whole files",
        ],
        rows=rows,
        notes=[
            f"Target fetched ≤ {TARGET_RATIO}× needed: "
            f"{'met' if worst <= TARGET_RATIO else 'NOT met'} (worst {worst:.3f}×).",
            f"Fetch of the three Landsat products and the DEM: {timing.median_s:.2f} s (median of "
            f"{len(seconds)}), loopback, every read signed through the local SAS endpoint.",
            "The test scenes lie mostly inside the city window, so Landsat's share of whole files "
            "is high here; real scenes (185 km) are ~50× a city window.",
        ],
        details=details,
    )
