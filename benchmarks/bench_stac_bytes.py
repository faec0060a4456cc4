"""Benchmark: bytes a STAC-served city-year takes over HTTP against the bytes its windows need.

The ``planetary-computer`` family reads Landsat and Copernicus DEM assets by windows over
``/vsicurl/`` range requests, never whole scenes. This fetches Boston 2020's three Landsat
products (OPT, NDVI, HEAT composites) and the static DEM mosaic from the loopback services the
tests use (``rustac serve``, a Range file server that logs the bytes it sends, a SAS token
endpoint; ``tests/stac_fixtures.py``) and counts, from the server's own log:

- **fetched:** body bytes the file server sent for the fetch (and of those, QA_PIXEL bytes);
- **baseline, needed:** compressed bytes of the internal COG tiles under each read's window
  (what an ideal windowed reader must transfer), counted once per opening of the file;
- **whole files:** what downloading every file read would have cost.

Target: fetched ≤ 1.5 × needed. Two configurations are fetched, alternating, so that both see
the same machine load: the family's defaults (each scene's QA read once for the three products,
scenes read by a pool of ``read_workers`` threads) and the earlier way (every product reads its
own QA, scenes one after another: ``share_qa: false, read_workers: 1``). Both are fetched
again with 50 ms added to every request by the file server (``LATENCY_S``), a stand-in for the
round trip to a storage region, since loopback has none and concurrency pays off on latency.
Fetch time is the median of the repeats; each repeat fetches into a fresh folder, so nothing is
reused.
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
CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "default (one QA read, parallel reads)": {},
    "QA per product, sequential reads": {"share_qa": False, "read_workers": 1},
}
"""Family options of each configuration, on top of the loopback world's."""
LATENCY_S = 0.05
"""Delay the file server adds to every request in the second round."""


def _qa_bytes(lines: list[str]) -> int:
    return sum(int(line.split()[4]) for line in lines if "QA_PIXEL" in line.split()[1])


def run(config: BenchConfig) -> BenchResult:
    """Fetch the city-year ``config.repeats`` times per configuration and account every byte."""
    from sources.stac import stac_adapters
    from tests.stac_fixtures import byte_accounting, loopback_stac_world

    rounds = {"loopback": 0.0, f"+{LATENCY_S * 1000:.0f} ms per request": LATENCY_S}
    seconds: dict[str, dict[str, list[float]]] = {
        r: {n: [] for n in CONFIGURATIONS} for r in rounds
    }
    totals: dict[str, dict[str, dict[str, int]]] = {}
    qa: dict[str, int] = {}
    requests: dict[str, int] = {}
    with (
        tempfile.TemporaryDirectory(prefix="citycube-bench-stac-") as tmp,
        loopback_stac_world(Path(tmp) / "world") as world,
    ):
        for round_name, delay in rounds.items():
            world.set_faults([{"match": "/", "delay_s": delay}] if delay else [])
            for attempt in range(config.repeats):
                for index, (name, overrides) in enumerate(CONFIGURATIONS.items()):
                    options = world.options(**overrides)
                    adapters = {a.product_id: a for a in stac_adapters(options)}
                    dest = Path(tmp) / f"fetch-{delay}-{attempt}-{index}"
                    before = len(world.log_lines())
                    started = time.perf_counter()
                    for product in ("landsat_c2l2", "landsat_ndvi", "landsat_st"):
                        adapters[product].fetch(CITY, YEAR, dest)
                    adapters["cop_dem_glo30"].fetch(CITY, None, dest)
                    seconds[round_name][name].append(time.perf_counter() - started)
                    lines = world.log_lines()[before:]
                    totals[name] = byte_accounting(world, lines, CITY)
                    qa[name] = _qa_bytes(lines)
                    requests[name] = len(lines)
                    log(
                        f"    {round_name}, {name}, fetch {attempt + 1}/{config.repeats}: "
                        f"{seconds[round_name][name][-1]:.2f} s"
                    )
        world.set_faults([])
    timings = {
        r: {name: Timing(tuple(s)) for name, s in by_name.items()} for r, by_name in seconds.items()
    }
    plain, slow = list(rounds)
    rows: list[list[Any]] = []
    details: dict[str, Any] = {
        "configurations": CONFIGURATIONS,
        "latency_s": LATENCY_S,
        "fetch": {r: {n: t.as_dict() for n, t in by.items()} for r, by in timings.items()},
        "bytes": totals,
        "qa_bytes": qa,
        "requests": requests,
    }
    worst = 0.0
    for name in CONFIGURATIONS:
        for kind, label in (("landsat", "Landsat (OPT, NDVI, HEAT)"), ("dem", "Copernicus DEM")):
            t = totals[name][kind]
            ratio = t["fetched"] / t["needed"]
            worst = max(worst, ratio)
            details[f"{kind}_ratio"] = details.get(f"{kind}_ratio") or ratio
            rows.append(
                [
                    name,
                    label,
                    f"{t['fetched']:,}",
                    f"{qa[name]:,}" if kind == "landsat" else "–",
                    f"{t['needed']:,}",
                    f"{ratio:.3f}×",
                    f"{t['whole']:,}",
                    f"{requests[name]:,}" if kind == "landsat" else "",
                    f"{timings[plain][name].median_s:.2f}" if kind == "landsat" else "",
                    f"{timings[slow][name].median_s:.2f}" if kind == "landsat" else "",
                ]
            )
    default, earlier = list(CONFIGURATIONS)
    saved = totals[earlier]["landsat"]["fetched"] - totals[default]["landsat"]["fetched"]
    return BenchResult(
        name="stac_bytes",
        title=f"Bytes per STAC-served city-year ({CITY} {YEAR}, loopback STAC API and file server)",
        baseline=BASELINE,
        columns=[
            "configuration",
            "assets",
            "fetched B",
            "of which QA_PIXEL B",
            "needed B (baseline)",
            "ratio fetched / needed",
            "whole files B",
            "requests (all assets)",
            f"fetch of 3 Landsat + DEM, {plain}, s",
            f"same, {slow}, s",
        ],
        rows=rows,
        notes=[
            f"Target fetched ≤ {TARGET_RATIO}× needed: "
            f"{'met' if worst <= TARGET_RATIO else 'NOT met'} (worst {worst:.3f}×).",
            f"One QA read per scene saves {saved:,} B of "
            f"{totals[earlier]['landsat']['fetched']:,} B of Landsat "
            f"({saved / totals[earlier]['landsat']['fetched']:.1%}); QA_PIXEL bytes "
            f"{qa[earlier]:,} → {qa[default]:,}.",
            f"Fetch time (median of {config.repeats}, configurations alternating), earlier → "
            f"default: {plain} {timings[plain][earlier].median_s:.2f} s → "
            f"{timings[plain][default].median_s:.2f} s; {slow} "
            f"{timings[slow][earlier].median_s:.2f} s → {timings[slow][default].median_s:.2f} s. "
            "Every read signed through the local SAS endpoint; the times include compositing "
            "and writing the items.",
            "The test scenes lie mostly inside the city window, so Landsat's share of whole files "
            "is high here; real scenes (185 km) are ~50× a city window.",
        ],
        details=details,
    )
