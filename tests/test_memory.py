"""Allocator settings that keep a processing process's memory independent of city size.

Each case runs in a fresh interpreter: the settings are process-wide and applied once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import ctypes, json, sys
import pyarrow as pa
from citycube.processing.chips import block_memory

before = pa.default_memory_pool().backend_name
with block_memory() as release_block:
    release_block()
libc = ctypes.CDLL(None)
thp = libc.prctl(42, 0, 0, 0, 0) if sys.platform.startswith("linux") else None
after = pa.default_memory_pool().backend_name
print(json.dumps({"before": before, "after": after, "thp_off": thp}))
"""


def _run(script: str, environ: dict[str, str]) -> dict:
    """What a fresh interpreter running ``script`` prints last, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _probe(**env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    return _run(PROBE, {**environ, **env})


def test_block_sweep_switches_arrow_to_the_system_pool() -> None:
    seen = _probe()
    assert seen["before"] != "system", "Arrow's default pool is expected to be a caching one"
    assert seen["after"] == "system"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux-only")
def test_block_sweep_turns_off_transparent_huge_pages() -> None:
    assert _probe()["thp_off"] == 1


def test_an_explicit_arrow_pool_choice_is_kept() -> None:
    seen = _probe(ARROW_DEFAULT_MEMORY_POOL="jemalloc")
    assert seen["before"] == seen["after"] == "jemalloc"


TRIM_PROBE = """
import json
from citycube.processing.memory import (
    TRIM_GROWTH_BYTES, bound_process_memory, release_freed, resident_bytes,
)

bound_process_memory()
release_freed(force=True)
start = resident_bytes()
small = [bytearray(4096) for _ in range(3 * TRIM_GROWTH_BYTES // 4096)]  # heap, not mmap
release_freed()  # grown past the margin: trims (nothing is free yet) and notes the level
small = None
release_freed()  # no growth since that trim: the freed heap stays for the next block
kept = resident_bytes()
release_freed(force=True)  # the end of a sweep: handed back
print(json.dumps({"start": start, "kept": kept, "end": resident_bytes(),
                  "margin": TRIM_GROWTH_BYTES}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim and /proc")
def test_freed_heap_is_kept_between_blocks_and_handed_back_at_the_end() -> None:
    seen = _run(TRIM_PROBE, dict(os.environ))
    assert seen["kept"] - seen["start"] > 2 * seen["margin"]
    assert seen["end"] - seen["start"] < seen["margin"] // 2


REUSE_PROBE = """
import json, resource
import numpy as np
from citycube.processing.memory import bound_process_memory

bound_process_memory()
block = 1000 * 1000  # a 10 km block of 10 m pixels
np.ones(block).sum()  # the heap grows to a block once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    np.ones(block).sum()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"faults": faults, "pages": 20 * block * 8 // 4096}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt and getrusage")
def test_block_sized_buffers_reuse_the_heap_instead_of_faulting_in_fresh_pages() -> None:
    seen = _run(REUSE_PROBE, {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")})
    assert seen["faults"] < seen["pages"] // 10, seen
