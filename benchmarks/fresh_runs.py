"""Try ``make run`` as a new user would, many times: a fresh clone, then ``make run`` with the
default workers, each time on a new empty DAGSTER_HOME (and, unless told otherwise, a new
empty data root). Reports how many succeeded and how long each took.

``make fresh-runs`` (10 times) or ``python -m benchmarks.fresh_runs --help``. Results go to
``benchmarks/results/fresh_runs.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
RUN_TIMEOUT_S = 1800


def _run(command: list[str], cwd: Path, log: Path, timeout: float) -> tuple[int, float]:
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        try:
            done = subprocess.run(
                command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
            )
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = -1
    return code, time.monotonic() - start


def _tail(log: Path, lines: int = 6) -> str:
    return "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    """Clone, install once, then ``make run`` repeatedly on fresh state."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--times", type=int, default=10, help="how many runs (default 10)")
    parser.add_argument("--workers", type=int, default=2, help="WORKERS for make run (default 2)")
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="keep the data root between runs (only DAGSTER_HOME is new each time)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR / "fresh_runs.json", help="results file"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="citycube-fresh-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(
            ["git", "clone", "--quiet", str(REPO_ROOT), str(clone)], check=True, timeout=600
        )
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True
        ).stdout.strip()
        print(f"fresh clone of {commit} in {clone}", flush=True)
        code, seconds = _run(["make", "install"], clone, Path(tmp) / "install.log", 1800)
        if code != 0:
            print(f"make install failed:\n{_tail(Path(tmp) / 'install.log', 30)}")
            return 1
        print(f"make install: {seconds:.0f}s", flush=True)
        runs = []
        for attempt in range(1, args.times + 1):
            shutil.rmtree(clone / ".dagster_home", ignore_errors=True)
            if not args.keep_data:
                shutil.rmtree(clone / "data", ignore_errors=True)
            log = Path(tmp) / f"run{attempt}.log"
            code, seconds = _run(
                ["make", "run", f"WORKERS={args.workers}"], clone, log, RUN_TIMEOUT_S
            )
            ok = code == 0 and "Done in" in log.read_text(encoding="utf-8", errors="replace")
            runs.append({"attempt": attempt, "exit_code": code, "seconds": seconds, "ok": ok})
            print(f"[{attempt}/{args.times}] exit {code} in {seconds:.0f}s", flush=True)
            if not ok:
                print(_tail(log, 20), flush=True)
    succeeded = sum(r["ok"] for r in runs)
    times = [r["seconds"] for r in runs if r["ok"]]
    summary = {
        "commit": commit,
        "times": args.times,
        "workers": args.workers,
        "keep_data": args.keep_data,
        "succeeded": succeeded,
        "median_s": statistics.median(times) if times else None,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    median = f"{summary['median_s']:.0f}s" if times else "n/a"
    text = (
        f"# Fresh runs\n\nCommit {commit}: `make run WORKERS={args.workers}` on a fresh clone, "
        f"{args.times} times, each with a new empty DAGSTER_HOME"
        f"{'' if args.keep_data else ' and data root'}: **{succeeded} of {args.times} "
        f"succeeded**, median {median}.\n"
    )
    args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)
    return 0 if succeeded == args.times else 1


if __name__ == "__main__":
    sys.exit(main())
