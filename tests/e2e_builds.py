"""`citycube build` as a user runs it, for the end-to-end tests of real source families: a
subprocess on ``<root>/data`` with its own ``DAGSTER_HOME`` and a source-set file that points
some products at loopback servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]


def write_source_set(root: Path, source_set: dict[str, Any]) -> Path:
    """The source-set file the builds under ``root`` read."""
    path = root / "source_set.yaml"
    path.write_text(yaml.safe_dump(source_set), encoding="utf-8")
    return path


def run_build(
    root: Path, release: str, cities: str, years: str, assets: str
) -> subprocess.CompletedProcess[str]:
    """One build of ``assets`` with one dask worker; the caller checks the exit code."""
    command = [sys.executable, "-m", "pipelines.cli", "--data", str(root / "data")]
    command += ["--release", release, "build", "--cities", cities, "--years", years]
    command += ["--workers", "1", "--assets", assets]
    env = {
        **os.environ,
        "DAGSTER_HOME": str(root / "dagster_home"),
        "CITYCUBE_SOURCE_SET": str(root / "source_set.yaml"),
    }
    env.pop("CITYCUBE_DASK_SCHEDULER", None)
    env.pop("CITYCUBE_DOWNLOAD_CACHE", None)
    return subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
    )
