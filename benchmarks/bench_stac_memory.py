"""Benchmark: peak memory of one Landsat product-year composite, block by block against the
whole window, as the window grows.

The parent writes synthetic Landsat scenes (the loopback fixtures' COGs: clouds, shadow, snow,
fill corners, values that encode their position) as local files covering square windows of
growing size, then runs one OPT composite (red, green, blue and QA of every scene) per case in
a fresh subprocess, so each peak RSS (``ru_maxrss``) is its own: with ``composite_block_px``
larger than the window (the whole-window computation, the baseline) and at the default block
size. A subprocess that only imports the same modules is subtracted from both. Subprocesses are
started through a tiny launcher (see ``benchmarks.bench_memory``) so a child's peak is not the
parent's.

Run as a script (``python -m benchmarks.bench_stac_memory --storage DIR --size N --block PX``)
it is the child: it composites one window and prints its peak RSS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from affine import Affine
from pyproj import CRS

from benchmarks import BenchConfig, BenchResult, log
from benchmarks.bench_memory import FLAT_TOLERANCE, LAUNCHER, MIB, REPO_ROOT, peak_rss_bytes

EPSG = 32619
ORIGIN = (300_015.0, 4_700_025.0)
"""Upper-left corner of every window (on the Landsat lattice of the zone)."""
SCENES = 8
"""Scenes per composite (a real year has up to 24: the whole-window cost grows with them)."""
SIZES = (768, 1536, 2304)
"""Window edges in pixels (30 m): 23, 46 and 69 km."""
QUICK_SIZES = (512, 1024, 1536)
WHOLE = 1_000_000
"""A block edge larger than any window: the whole-window computation."""
PRODUCT = "landsat_c2l2"


def write_scenes(storage: Path, size: int) -> Path:
    """``SCENES`` scenes a little larger than the window, each shifted by a few pixels; their
    STAC items in ``items.json`` (blob hrefs, read through a mirror onto ``storage``)."""
    from tests.stac_fixtures import SceneSpec, write_scene

    acquired = datetime(2020, 5, 1, 15, 30, tzinfo=UTC)
    items = []
    for k in range(SCENES):
        shift_col, shift_row = 3 * k, 2 * k
        scene = SceneSpec(
            f"LC08_L2SP_0{k:02d}031_20200{5 + k // 4}0{1 + k % 4}_20200823_02_T1",
            "landsat-8",
            EPSG,
            (ORIGIN[0] - 30 * shift_col, ORIGIN[1] + 30 * shift_row),
            (size + 2 * shift_row, size + 2 * shift_col),
            acquired + timedelta(days=16 * k),
            5.0 + k,
            100 + k,
        )
        items.append(write_scene(storage, scene))
    path = storage / "items.json"
    path.write_text(json.dumps(items), encoding="utf-8")
    return path


def child(storage: Path, size: int | None, block_px: int) -> dict[str, Any]:
    """Composite one window (or, without a size, only import) and report peak RSS."""
    import pystac
    import rasterio

    from sources.stac import landsat
    from sources.stac.adapter import FetchContext
    from sources.stac.clearmasks import ClearMaskCache
    from sources.stac.grids import GeoBox
    from sources.stac.options import StacFamilyOptions
    from sources.stac.records import SearchRecords
    from sources.stac.retrying import retry_policy
    from sources.stac.signing import HrefSigner
    from sources.stac.spec import Signing, load_stac_catalogue
    from sources.stac.windows import WindowCache
    from tests.stac_fixtures import BLOB, LANDSAT_ACCOUNT

    seconds = 0.0
    if size is not None:
        mirror = {f"https://{LANDSAT_ACCOUNT}.{BLOB}/": f"{storage}/{LANDSAT_ACCOUNT}/"}
        options = StacFamilyOptions(composite_block_px=block_px, mirror=mirror)
        policy = retry_policy(options)
        items = json.loads((storage / "items.json").read_text(encoding="utf-8"))
        scenes = [pystac.Item.from_dict(item) for item in items]
        grid = GeoBox(
            (size, size),
            Affine(30, 0, ORIGIN[0], 0, -30, ORIGIN[1]),
            CRS.from_epsg(EPSG),
        )
        with tempfile.TemporaryDirectory(prefix="citycube-bench-stac-mem-") as tmp:
            ctx = FetchContext(
                spec=load_stac_catalogue().product(PRODUCT),
                source_id="bench",
                city="bench",
                year=2020,
                signer=HrefSigner(Signing.NONE, policy, mirror=mirror),
                policy=policy,
                options=options,
                records=SearchRecords(Path(tmp) / "searches"),
                clear_masks=ClearMaskCache(Path(tmp) / "qa"),
                windows=WindowCache(Path(tmp) / "windows"),
            )
            start = time.perf_counter()
            out = Path(tmp) / "out"
            out.mkdir()
            made = landsat.composite(ctx, scenes, grid, "bench", out, {})
            seconds = time.perf_counter() - start
            with rasterio.open(out / made.layers[0].filename) as written:
                assert (written.count, written.height, written.width) == (3, size, size)
    return {"peak_rss_bytes": peak_rss_bytes(), "seconds": seconds}


def run_child(storage: Path, size: int | None, block_px: int) -> dict[str, Any]:
    """A fresh interpreter per measurement, started through the launcher."""
    command = [sys.executable, "-c", LAUNCHER, sys.executable, "-m", "benchmarks.bench_stac_memory"]
    command += ["--storage", str(storage), "--block", str(block_px)]
    if size is not None:
        command += ["--size", str(size)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"composite memory child ({size}, {block_px}) failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(config: BenchConfig) -> BenchResult:
    """Peak RSS increments of whole-window and block-wise composites per window size."""
    from sources.stac.options import StacFamilyOptions

    block_px = StacFamilyOptions().composite_block_px
    sizes = QUICK_SIZES if config.quick else SIZES
    repeats = 1 if config.quick else max(1, config.repeats // 2)
    result = BenchResult(
        name="stac_memory",
        title=(
            f"Peak memory of one Landsat OPT composite ({SCENES} scenes: red, green, blue, QA) "
            f"vs window size: {block_px}-px blocks vs the whole window"
        ),
        baseline="the whole-window composite of the same scenes (composite_block_px above the "
        "window), each less a subprocess that imports the same modules",
        columns=[
            "window (px)",
            "pixels (M)",
            "whole window MiB",
            f"{block_px}-px blocks MiB",
            "blocks / whole",
            "whole s",
            "blocks s",
        ],
    )
    cases: dict[int, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="citycube-bench-stac-scenes-") as tmp:
        base_runs = []
        for size in sizes:
            storage = Path(tmp) / str(size)
            log(f"  writing {SCENES} scenes over a {size} × {size} window (untimed)")
            write_scenes(storage, size)
            cases[size] = {"whole": [], "blocks": []}
            for attempt in range(repeats):
                base_runs.append(run_child(storage, None, WHOLE))
                for label, px in (("whole", WHOLE), ("blocks", block_px)):
                    cases[size][label].append(run_child(storage, size, px))
                    peak = cases[size][label][-1]["peak_rss_bytes"] / MIB
                    log(f"    {size} px, {label} (round {attempt + 1}): peak {peak:.1f} MiB")
    base = statistics.median(r["peak_rss_bytes"] for r in base_runs)

    def median(size: int, label: str, key: str) -> float:
        return statistics.median(r[key] for r in cases[size][label])

    increments = {
        (size, label): median(size, label, "peak_rss_bytes") - base
        for size in sizes
        for label in ("whole", "blocks")
    }
    result.rows.append(["(imports only)", "", f"{base / MIB:.1f}", f"{base / MIB:.1f}", "", "", ""])
    for size in sizes:
        whole, blocks = increments[(size, "whole")], increments[(size, "blocks")]
        result.rows.append(
            [
                f"{size} × {size}",
                f"{size * size / 1e6:.2f}",
                f"{whole / MIB:.1f}",
                f"{blocks / MIB:.1f}",
                f"{blocks / whole:.3f}",
                f"{median(size, 'whole', 'seconds'):.2f}",
                f"{median(size, 'blocks', 'seconds'):.2f}",
            ]
        )
    small, large = sizes[0], sizes[-1]
    pixel_ratio = (large / small) ** 2
    whole_growth = increments[(large, "whole")] / increments[(small, "whole")]
    block_growth = increments[(large, "blocks")] / increments[(small, "blocks")]
    per_pixel = {
        label: (increments[(large, label)] - increments[(small, label)]) / (large**2 - small**2)
        for label in ("whole", "blocks")
    }
    result.notes += [
        f"From {small}² to {large}² pixels ({pixel_ratio:.1f}× the pixels): the whole-window "
        f"increment grows {whole_growth:.2f}×, the block-wise one {block_growth:.2f}× "
        f"(flat = ≤ {FLAT_TOLERANCE}×: {'met' if block_growth <= FLAT_TOLERANCE else 'not met'}).",
        f"Marginal bytes per added window pixel: whole window {per_pixel['whole']:.1f} B, "
        f"blocks {per_pixel['blocks']:.1f} B. What still grows with the window in the "
        "block-wise path: per reading thread, one asset's raw window (uint16 + footprint, "
        "3 B per pixel) before it is sliced into blocks, and GDAL's copy of the written blocks "
        "into the COG (its block cache); the stacks of scenes × bands × float32 and the output "
        "follow the block (each block is written into the files as it is composited).",
        "Peak RSS is ru_maxrss of a fresh subprocess, median over rounds; each child reads "
        "local COGs through the adapter's windowed reads and keeps its blocks in a fresh "
        "cache folder, so both paths do the same reads and writes.",
    ]
    result.details = {
        "scenes": SCENES,
        "block_px": block_px,
        "baseline_peak_rss_bytes": base,
        "increment_growth_whole": whole_growth,
        "increment_growth_blocks": block_growth,
        "marginal_bytes_per_pixel": per_pixel,
        "flat": block_growth <= FLAT_TOLERANCE,
        "cases": {str(size): cases[size] for size in sizes},
    }
    return result


def main(argv: list[str] | None = None) -> int:
    """Child entry point: one measurement, printed as a JSON line."""
    parser = argparse.ArgumentParser(description="Peak RSS of one Landsat composite (child).")
    parser.add_argument("--storage", type=Path, required=True, help="folder of the scenes")
    parser.add_argument("--size", type=int, help="window edge in pixels; omit for imports only")
    parser.add_argument("--block", type=int, required=True, help="composite_block_px")
    args = parser.parse_args(argv)
    print(json.dumps(child(args.storage, args.size, args.block)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
