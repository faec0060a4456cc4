"""Command line: build a release through Dagster, rebuild views, print summaries, render.

``make run`` calls ``citycube build``; see ``citycube --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from citycube.reports.summary import summary_text

DEFAULT_CITIES = ("Amsterdam", "Boston")
DEFAULT_YEARS = (2020, 2024, 2025)


def _parse_cities(text: str) -> list[str]:
    from citycube.catalogue.cities import get_city, load_cities

    text = text.strip()
    if not text:
        from citycube.errors import UnknownCityError

        raise UnknownCityError(
            "--cities (CITIES) is empty: give 'default', 'all' or comma-separated city keys"
        )
    if text == "default":
        return list(DEFAULT_CITIES)
    if text == "all":
        return list(load_cities())
    return [get_city(c.strip()).key for c in text.split(",") if c.strip()]


def _parse_years(text: str) -> list[int]:
    from citycube.catalogue.temporal import parse_years

    text = text.strip()
    if not text:
        from citycube.errors import UnknownYearError

        raise UnknownYearError(
            "--years (YEARS) is empty: give 'default', 'all', a range such as 2019-2021 or "
            "comma-separated years"
        )
    if text == "default":
        return list(DEFAULT_YEARS)
    return parse_years(text)


def _release_arg(text: str) -> str:
    """argparse type of --release: a safe release id, checked before anything is written."""
    from citycube.cube.release import validate_release_version
    from citycube.errors import InvalidNameError

    try:
        return validate_release_version(text)
    except InvalidNameError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _workers_arg(text: str) -> int:
    """argparse type of --workers: a positive whole number."""
    try:
        workers = int(text)
    except ValueError:
        workers = 0
    if workers < 1:
        raise argparse.ArgumentTypeError(
            f"--workers (WORKERS) must be a whole number of at least 1, got {text!r}"
        )
    return workers


def _non_negative(text: str, what: str) -> float:
    """``text`` as a finite number, 0 or more; else an argparse error naming ``what``."""
    try:
        amount = float(text)
    except ValueError:
        amount = -1.0
    if not amount >= 0 or amount == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what} (0 or more)")
    return amount


def _minutes_arg(text: str) -> float:
    return _non_negative(text, "a number of minutes")


def _amount_arg(text: str) -> float:
    return _non_negative(text, "a number")


def _data_arg(text: str) -> str:
    """argparse type of --data: a non-empty path (an empty one would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the data root (--data / CITYCUBE_DATA) is empty; unset CITYCUBE_DATA for ./data or "
            "give a directory"
        )
    return text


def writable_directory(path: Path, what: str) -> Path:
    """Create ``path`` if needed and prove it takes files; a clear error otherwise."""
    from citycube.errors import SpecError

    if path.exists() and not path.is_dir():
        raise SpecError(f"{what} {path} is a file, not a directory; point {what} at a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise SpecError(
            f"{what} {path} is not a writable directory ({exc.strerror or exc}); point {what} "
            "at a directory you can write to"
        ) from None
    return path


def _env_defaults(args: argparse.Namespace) -> None:
    """Point this process (and every process it starts) at the data root, release and
    DAGSTER_HOME, creating the Dagster instance's storage once, up front."""
    from pipelines.instance import ensure_dagster_home

    data = writable_directory(Path(args.data).resolve(), "the data root (CITYCUBE_DATA)")
    os.environ["CITYCUBE_DATA"] = str(data)
    os.environ["CITYCUBE_RELEASE"] = args.release
    home_dir = os.environ.get("DAGSTER_HOME") or ".dagster_home"
    writable_directory(Path(home_dir).resolve(), "DAGSTER_HOME")
    home = ensure_dagster_home(Path(home_dir))
    os.environ["DAGSTER_HOME"] = str(home)


def build(args: argparse.Namespace) -> int:
    """Build the selected cities and years as a Dagster asset backfill (see pipelines.build)."""
    from citycube.cube.release import Release
    from citycube.cube.releases import ensure_writable
    from pipelines.build import BuildRequest, build_locks, run_build, selected_asset_keys

    cities = _parse_cities(args.cities)
    years = _parse_years(args.years)
    ensure_writable(Release(Path(args.data).resolve(), args.release))  # before anything is written
    assets = [a.strip() for a in args.assets.split(",") if a.strip()] if args.assets else []
    if assets:  # refused here, before anything is written or started (loads the definitions)
        selected_asset_keys(assets)
    _env_defaults(args)
    request = BuildRequest(
        cities=cities,
        years=years,
        release=args.release,
        data_root=os.environ["CITYCUBE_DATA"],
        workers=args.workers,
        scheduler=os.environ.get("CITYCUBE_DASK_SCHEDULER", ""),
        assets=assets,
    )
    early: EarlyStop | None = getattr(args, "early_stop", None)
    stopped = early.exit_code() if early is not None else None
    if stopped is not None:  # stopped while it was loading
        print(INTERRUPTED, file=sys.stderr)
        return stopped
    with build_locks(request, Path(os.environ["DAGSTER_HOME"])) as locks:
        total = len(cities) * len(years)
        where = (
            f"on the dask scheduler at {request.scheduler}"
            if request.scheduler
            else f"with {args.workers} worker(s)"
        )
        print(
            f"Building release {args.release} for {len(cities)} cities × {len(years)} years = "
            f"{total} city-years into {os.environ['CITYCUBE_DATA']} {where}; "
            f"sources: {_source_set_label()}",
            flush=True,
        )
        pending = early.signals if early is not None else []
        if pending:  # stopped while the locks were taken: no driver is started
            print(INTERRUPTED, file=sys.stderr)
            return 128 + pending[0]
        return run_build(request, keep_fds=locks, pending=pending)


def _source_set_label() -> str:
    from sources import load_source_set

    sources = load_source_set(os.environ.get("CITYCUBE_SOURCE_SET") or None)
    flag = "SYNTHETIC sample data" if sources.synthetic else "no synthetic products"
    return f"{sources.name} ({flag})"


def views(args: argparse.Namespace) -> int:
    """Rebuild cube.duckdb for a release (e.g. after moving it)."""
    from citycube.catalogue.modalities import load_catalogue
    from citycube.cube.release import Release, build_duckdb, published_snapshot, release_metadata
    from citycube.tasks.views import task_views

    release = Release(Path(args.data).resolve(), args.release)
    if not release.root.exists():
        print(f"no release at {release.root}", file=sys.stderr)
        return 2
    if release.metadata_file.exists():  # keep what the build recorded (sources, synthetic, …)
        meta = json.loads(release.metadata_file.read_text(encoding="utf-8"))
    else:
        meta = release_metadata(release, source_set="unknown", synthetic=True)
    # over the published tables; a release never published publishes its draft
    catalogue = load_catalogue()
    snapshot = published_snapshot(release)
    task_view_builder = task_views(catalogue)
    print(
        build_duckdb(release, catalogue, meta, snapshot=snapshot, benchmark_views=task_view_builder)
    )
    from citycube.cube.manifest import refresh_database

    if refresh_database(release):  # the rebuilt database is what the manifest lists
        print(f"manifest updated for the rebuilt {release.duckdb_file.name}")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """Score a reference predictor on a split of the translation instances."""
    from citycube.catalogue.modalities import load_catalogue
    from citycube.cube.release import Release
    from citycube.tasks.evaluate import (
        NearestTilePredictor,
        score,
        score_matrix_markdown,
        target_codes,
        write_scores,
    )
    from citycube.tasks.pairs import modality_order
    from citycube.tasks.translation import BenchmarkFiles

    catalogue = load_catalogue()
    targets = target_codes(args.targets, catalogue) if args.targets is not None else None
    release = Release(Path(args.data).resolve(), args.release)
    if not BenchmarkFiles.published(release).instances.exists():
        print(f"no translation instances in {release.root}; run `make run` first", file=sys.stderr)
        return 2
    predictor = (
        NearestTilePredictor(release, catalogue) if args.predictor == "nearest_tile" else None
    )
    table = score(release, catalogue, split=args.split, targets=targets, predictor=predictor)
    out = (
        Path(args.out)
        if args.out
        else (
            release.data_root
            / "evaluations"
            / release.version
            / f"{args.predictor}_{args.split}.parquet"
        )
    )
    path = write_scores(table, out, release)
    name = args.predictor.replace("_", "-")
    print(f"{name} reference on {args.split}: {table.num_rows} routes scored -> {path}")
    print(score_matrix_markdown(table, modality_order(catalogue)))
    return 0


def represent(args: argparse.Namespace) -> int:
    """Evaluate embeddings on the release with the CityRep protocol; write the run's tables."""
    import duckdb

    from citycube.cube.release import Release
    from citycube.errors import EmbeddingError, ReleaseNotFoundError
    from citycube.represent.run import RunConfig, check_name, evaluate, release_cities, summary

    release = Release(Path(args.data).resolve(), args.release)
    if not release.duckdb_file.exists():
        raise ReleaseNotFoundError(
            f"no cube.duckdb in {release.root}; build the release first (`make run`)"
        )
    name = check_name(args.name, "run name")
    files: dict[str, str] = {}
    for item in args.embedding or []:
        key, sep, path = item.partition("=")
        if not sep or not path:
            raise EmbeddingError(f"--embedding {item!r}: give NAME=PATH")
        files[check_name(key, "embedding name")] = str(Path(path).resolve())

    def split(text: str | None) -> tuple[str, ...]:
        return tuple(t.strip() for t in text.split(",") if t.strip()) if text else ()

    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        cities = split(args.cities) or release_cities(con)
        try:
            seeds = tuple(int(s) for s in split(args.seeds))
        except ValueError:
            raise EmbeddingError(f"--seeds {args.seeds!r}: give integers, e.g. 42,24") from None
        config = RunConfig(
            cities=cities,
            tasks=split(args.tasks) or RunConfig.tasks,
            embeddings=split(args.embeddings) or (*RunConfig.embeddings, *files),
            scale=args.scale,
            year=args.year,
            protocols=split(args.protocols) or RunConfig.protocols,
            seeds=seeds or RunConfig.seeds,
            heads=split(args.heads) or RunConfig.heads,
            policy=args.missing,
            l2=args.l2,
            max_epochs=args.max_epochs,
            embedding_files=files,
        )
        out = (
            Path(args.out)
            if args.out
            else release.data_root / "evaluations" / release.version / "represent" / name
        )
        result = evaluate(con, release.root, config, out.resolve(), progress=print)
    print(summary(result))
    print(f"{len(result.results)} fits in {result.seconds:.1f} s -> {result.folder}")
    return 0


def read_predictions(path: Path) -> dict[str, tuple[list[str], list[float]]]:
    """method -> (case ids, values) from a CSV or Parquet of predictions.

    Columns: ``case_id`` (a paper-form case id or a case key), ``prediction`` (or ``value``),
    and optionally ``method`` (several methods in one file; else the file's stem names it).
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from citycube.errors import InputFileError

    parquet = path.suffix.lower() == ".parquet"
    try:
        table = pq.read_table(path) if parquet else pacsv.read_csv(path)
    except (pa.ArrowException, OSError) as exc:
        what = "Parquet" if parquet else "CSV"
        raise InputFileError(f"cannot read {path} as {what} ({exc}); write it again") from None
    names = set(table.column_names)
    ids = "case_id" if "case_id" in names else "case_key" if "case_key" in names else None
    values = "prediction" if "prediction" in names else "value" if "value" in names else None
    if ids is None or values is None:
        raise InputFileError(
            f"{path} needs columns case_id (or case_key) and prediction (or value); it has "
            f"{', '.join(table.column_names)}"
        )
    case_ids = [str(v) for v in table[ids].to_pylist()]
    numbers = []
    for row, value in enumerate(table[values].to_pylist()):
        try:
            numbers.append(float("nan") if value is None else float(value))
        except (TypeError, ValueError):
            where = f"row {row + 1}" if parquet else f"line {row + 2}"
            raise InputFileError(
                f"{path} {where}, column {values!r}: {value!r} is not a number; predictions "
                "are plain numbers in the target's unit (a blank for no prediction)"
            ) from None
    methods = (
        [str(m) for m in table["method"].to_pylist()]
        if "method" in names
        else [path.stem] * len(case_ids)
    )
    out: dict[str, tuple[list[str], list[float]]] = {}
    for m, i, v in zip(methods, case_ids, numbers, strict=True):
        mine = out.setdefault(m, ([], []))
        mine[0].append(i)
        mine[1].append(v)
    return out


def forecast_score(args: argparse.Namespace) -> int:
    """Score forecasts (and the two baselines) on the release's forecasting cases."""
    from citycube.cube.release import Release
    from citycube.errors import CityCubeError
    from citycube.tasks.forecast import (
        ForecastFiles,
        resolve_predictions,
        score_release,
        summary_markdown,
        write_scores,
    )

    release = Release(Path(args.data).resolve(), args.release)
    files = ForecastFiles.published(release)
    if not files.references.exists():
        print(f"no forecasting cases in {release.root}; run `make run` first", file=sys.stderr)
        return 2
    import pyarrow.parquet as pq

    references = pq.read_table(files.references)
    predictions = {}
    name = args.name or "baselines"
    if args.predictions:
        path = Path(args.predictions)
        if not path.exists():
            print(f"no predictions file at {path}", file=sys.stderr)
            return 2
        try:
            for method, (ids, values) in read_predictions(path).items():
                predictions[method] = resolve_predictions(references, ids, values)
        except ValueError as exc:
            raise CityCubeError(str(exc)) from None
        name = args.name or path.stem
    if references.num_rows == 0:
        print(
            "the release holds no forecasting cases (no tile has a complete 2010–2024 panel "
            f"of any target; see {files.manifest}): nothing to score",
            file=sys.stderr,
        )
    try:
        scores = score_release(release, predictions, replicates=args.replicates)
    except ValueError as exc:
        raise CityCubeError(str(exc)) from None
    out = Path(args.out) if args.out else release.data_root / "evaluations" / release.version
    paths = write_scores(scores, out / f"forecast_{name}", release)
    print(f"{references.num_rows} forecasting cases scored -> {paths['md']} (+ .csv, .parquet)")
    print(summary_markdown(scores))
    return 0


def summary(args: argparse.Namespace) -> int:
    """Print the DuckDB summary of a release."""
    from citycube.cube.release import Release

    release = Release(Path(args.data).resolve(), args.release)
    if not release.duckdb_file.exists():
        print(f"no database at {release.duckdb_file}; run `make run` first", file=sys.stderr)
        return 2
    print(summary_text(release.duckdb_file))
    return 0


def query(args: argparse.Namespace) -> int:
    """Run one SQL query on a release, local or served over HTTP(S), and print its rows."""
    import duckdb

    from citycube.cube.release import Release
    from citycube.cube.remote import open_remote_release
    from citycube.io.database import database_error

    if args.url:
        con = open_remote_release(args.url)
        where = args.url
    else:
        path = Release(Path(args.data).resolve(), args.release).duckdb_file
        if not path.exists():
            print(f"no database at {path}; run `make run` first", file=sys.stderr)
            return 2
        try:
            con = duckdb.connect(str(path), read_only=True)
        except duckdb.Error as exc:
            raise database_error(path, exc) from None
        where = str(path)
    try:
        result = con.execute(args.sql)
        names = [c[0] for c in result.description or []]
        rows = result.fetchall()
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"error: the query failed on {where}: {first}", file=sys.stderr)
        return 2
    finally:
        con.close()
    print("\t".join(names))
    for row in rows:
        print("\t".join("" if v is None else str(v) for v in row))
    return 0


def verify(args: argparse.Namespace) -> int:
    """Recompute every file's SHA-256 and compare with the release's manifest."""
    from citycube.cube.manifest import verify_release
    from citycube.cube.release import Release
    from citycube.cube.releases import manifest_pinned

    release = Release(Path(args.data).resolve(), args.release)
    result = verify_release(release)
    for line in result.lines():
        print(line)
    if manifest_pinned(release) is False:
        print(
            f"release {release.version} is final but its manifest.json is not the one it was "
            "frozen with (final.json pins its SHA-256): restore the frozen manifest",
            file=sys.stderr,
        )
        return 1
    if result.ok:
        print(f"release {release.version} is intact")
        return 0
    print(
        f"release {release.version} differs from its manifest: rebuild the changed partitions "
        "with `make run` (a rebuild writes a new manifest) or restore the files",
        file=sys.stderr,
    )
    return 1


def releases(args: argparse.Namespace) -> int:
    """List the releases under the data root, or show how to query one (``--open``)."""
    from citycube.cube.releases import list_releases, open_release, query_help, releases_text

    data_root = Path(args.data).resolve()
    if args.open:
        release = open_release(data_root, args.open)
        print(query_help(release))
        print(summary_text(release.duckdb_file))
        return 0
    found = list_releases(data_root)
    if args.json:
        print(json.dumps([s.as_dict() for s in found], indent=2))
    else:
        print(f"releases under {data_root / 'releases'}:")
        print(releases_text(found))
    return 0


def freeze(args: argparse.Namespace) -> int:
    """Make a release final: checked against its manifest, then never rebuilt in place."""
    from citycube.cube.releases import freeze_release, open_release

    release = open_release(Path(args.data).resolve(), args.release)
    record = freeze_release(release)
    print(
        f"release {release.version} is final (frozen {record.get('frozen_at')}): builds into "
        "it are refused; build later changes into a new version"
    )
    return 0


def gc(args: argparse.Namespace) -> int:
    """Delete unreferenced icechunk chunks and unpublished table snapshots of a release."""
    from datetime import UTC, datetime, timedelta

    from citycube.cube.releases import collect_garbage, open_release

    release = open_release(Path(args.data).resolve(), args.release)
    cutoff = datetime.now(UTC) - timedelta(minutes=args.older_than)
    report = collect_garbage(release, cutoff)
    for line in report.lines():
        print(line)
    return 0


def prune_cache(args: argparse.Namespace) -> int:
    """Delete the STAC family's least recently used cached windows, masks and chunks."""
    from sources.stac.adapter import STAC_STATE_DIR
    from sources.stac.pruning import prune_caches

    state = Path(args.data).resolve() / "sources" / STAC_STATE_DIR
    report = prune_caches(
        state,
        max_bytes=None if args.max_gb is None else int(args.max_gb * 1e9),
        older_than_s=None if args.older_than_days is None else args.older_than_days * 86400.0,
        dry_run=args.dry_run,
    )
    print(f"{state}: {report.summary()}")
    return 0


def diff(args: argparse.Namespace) -> int:
    """Compare two releases' published observations; exit 0 when identical, 1 when not."""
    from citycube.cube.diff import diff_releases, diff_text

    result = diff_releases(Path(args.data).resolve(), args.a, args.b)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print(diff_text(result))
    return 0 if result.identical else 1


def card(args: argparse.Namespace) -> int:
    """(Re)write a release's dataset card, or validate it (``--validate``)."""
    from citycube.catalogue.modalities import load_catalogue
    from citycube.cube.releases import ensure_writable, open_release
    from citycube.reports.card import validate_card, write_card

    release = open_release(Path(args.data).resolve(), args.release)
    if args.validate:
        for line in validate_card(release):
            print(line)
        print(f"the dataset card of release {release.version} is valid")
        return 0
    for path in write_card(ensure_writable(release), load_catalogue()).values():
        print(path)
    return 0


def dagster_home(args: argparse.Namespace) -> int:
    """Create DAGSTER_HOME and its storage, telemetry off (``make dev`` runs this first)."""
    from pipelines.instance import ensure_dagster_home

    print(ensure_dagster_home(Path(os.environ.get("DAGSTER_HOME", ".dagster_home"))))
    return 0


def render(args: argparse.Namespace) -> int:
    """Write one tile's chip, or a categorical legend, as a PNG with fixed colours."""
    import numpy as np

    from citycube.catalogue.modalities import load_catalogue
    from citycube.cube.release import Release
    from citycube.reports.render import legend_image, legend_key, render_tile, write_png

    release = Release(Path(args.data).resolve(), args.release)
    catalogue = load_catalogue()
    if args.out is None and not release.root.exists():
        print(f"no release at {release.root}; pass --data/--release or --out", file=sys.stderr)
        return 2
    if args.legend:
        legend_key(catalogue, args.legend)  # a clear error for an unknown name
        out = Path(args.out or release.root / "renders" / f"legend_{args.legend}.png")
        legend = np.asarray(legend_image(catalogue, args.legend).convert("RGBA"))
        print(write_png(out, legend))
        return 0
    if not (args.tile and args.modality and args.year is not None):
        print("error: render needs --tile, --modality and --year (or --legend)", file=sys.stderr)
        return 2
    code = args.modality.upper()
    rgba = render_tile(release, catalogue, code, args.tile, args.year)
    name = f"{args.tile}_{code}_{args.year}.png"
    print(write_png(Path(args.out or release.root / "renders" / name), rgba))
    return 0


def report(args: argparse.Namespace) -> int:
    """(Re)write a release's availability and paper-vs-release reports; print the first."""
    from citycube.catalogue.modalities import load_catalogue
    from citycube.cube.release import Release
    from citycube.cube.releases import ensure_writable
    from citycube.reports.availability import write_report
    from citycube.reports.paper import write_paper_comparison

    release = ensure_writable(Release(Path(args.data).resolve(), args.release))
    catalogue = load_catalogue()
    paths = write_report(release, catalogue)
    for key in ("modality_md", "field_md", "city_md"):
        print(paths[key].read_text(encoding="utf-8"))
    paths.update(write_paper_comparison(release, catalogue))
    print("written:")
    for path in paths.values():
        print(f"  {path}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The argument parser (also used to render --help in the README)."""
    from pipelines.resources import DEFAULT_RELEASE

    p = argparse.ArgumentParser(
        prog="citycube",
        description="Build and inspect CityCube releases (multimodal urban data cube).",
    )
    p.add_argument(
        "--data",
        type=_data_arg,
        default=os.environ.get("CITYCUBE_DATA", "data"),
        help="data root holding sources/, cache/ and releases/ (env CITYCUBE_DATA; default ./data)",
    )
    p.add_argument(
        "--release",
        type=_release_arg,
        default=os.environ.get("CITYCUBE_RELEASE", DEFAULT_RELEASE),
        help=f"release version id (env CITYCUBE_RELEASE; default {DEFAULT_RELEASE})",
    )
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "build",
        help="build cities and years as Dagster asset backfills",
        description=(
            "Submit Dagster asset backfills of everything the selected cities and years need "
            "(sources, derived results per source period, all 18 modalities' observations, "
            "quick-looks, then the tiles table, the checked DuckDB catalogue and the "
            "availability report) and drive them to the end, printing progress: first the "
            "static and 5-year products, then the rest. The backfills and their runs are "
            "visible in `make dev` (Runs → Backfills). Partition work runs on "
            "a dask LocalCluster of --workers processes, or on the scheduler named by "
            "CITYCUBE_DASK_SCHEDULER (e.g. tcp://host:8786)."
        ),
        epilog=(
            "Ctrl-C or SIGTERM once: the backfill is canceled and Dagster terminates its runs; "
            "finished partitions stay and the published cube is left as it was (exit 130). "
            "Twice: every run is forced down at once. Killed outright (SIGKILL), the build's "
            "processes end with it and the next build closes its open runs. Run the same "
            "command again to build the rest: finished sources and derived results are reused. "
            "One build at a time per release and per DAGSTER_HOME: a second is refused."
        ),
    )
    b.add_argument(
        "--cities",
        default="default",
        help="'default' (Amsterdam,Boston), 'all', or comma-separated city keys",
    )
    b.add_argument(
        "--years",
        default="default",
        help="'default' (2020,2024,2025), 'all', or e.g. 2019-2021 or 2000,2005",
    )
    b.add_argument(
        "--workers",
        type=_workers_arg,
        default=os.environ.get("WORKERS", "1"),
        help="dask worker processes that partition work runs on (env WORKERS; default 1: "
        "every step works in its run's own process)",
    )
    b.add_argument(
        "--assets",
        metavar="PREFIXES",
        help="only assets whose key starts with one of these comma-separated prefixes, e.g. "
        "'sources' (fetch only) or 'sources,derived/opt'; default: everything",
    )
    b.set_defaults(func=build)
    v = sub.add_parser("views", help="rebuild cube.duckdb views for a release")
    v.set_defaults(func=views)
    s = sub.add_parser("summary", help="print a DuckDB summary of a release")
    s.set_defaults(func=summary)
    q = sub.add_parser(
        "query",
        help="run one read-only SQL query on a release, local or served over HTTP(S) (--url)",
        description=(
            "Run SQL on a release's cube.duckdb, read-only, and print the rows tab-separated "
            "with a header line. Without --url the release is --release under --data. With "
            "--url the release is read where it is served (a web server or object store that "
            "answers HTTP Range requests): DuckDB's httpfs extension fetches only the blocks the "
            "query touches, so a one-tile query reads a small part of the database."
        ),
        epilog=(
            "example: citycube query --url https://example.org/releases/sample-0.1.0/ "
            '"SELECT year, field, value FROM observations WHERE tile_id = '
            "'Amsterdam_2KM_r0_c0' AND modality = 'POP' ORDER BY year\""
        ),
    )
    q.add_argument(
        "--url",
        help="URL of a served release folder (…/releases/<version>/) or of its cube.duckdb",
    )
    q.add_argument("sql", help="the query: tables and views as in `citycube releases --open`")
    q.set_defaults(func=query)
    vf = sub.add_parser(
        "verify",
        help="check every file of a release against its manifest (SHA-256); exit 1 if not",
        description=(
            "Recompute the SHA-256 of every file of the release (observations, chip index, "
            "chips, tiles, quick-looks, reports, release.json) and compare with manifest.json, "
            "which a build writes last. Lists changed, missing and unlisted files; exits 0 when "
            "the release is intact, 1 when it is not, 2 when it has no manifest."
        ),
    )
    vf.set_defaults(func=verify)
    rl = sub.add_parser(
        "releases",
        help="list the releases under the data root, or show how to query one (--open)",
        description=(
            "One entry per release: final (frozen, immutable), published draft or draft, "
            "build time, cities, years and "
            "modalities published, catalogue digest, engine version, each source's id and "
            "version, and whether the files match the manifest by list and size (`verify` "
            "checks hashes). `--open VERSION` prints the path of its cube.duckdb, DuckDB and "
            "Python one-liners, and a read-only summary."
        ),
    )
    rl.add_argument("--open", metavar="VERSION", type=_release_arg, help="release to query")
    rl.add_argument("--json", action="store_true", help="print the listing as JSON")
    rl.set_defaults(func=releases)
    fz = sub.add_parser(
        "freeze",
        help="make a published release final (immutable): later builds of it are refused",
        description=(
            "Check every file of --release against its manifest (SHA-256), then write "
            "final.json pinning the manifest's own hash. A final release is never rebuilt or "
            "rewritten in place: `build`, `report`, `card` and every asset that writes refuse "
            "it and name a new version to build instead. Drafts (every release until frozen, "
            "such as the default sample-0.1.0) stay rebuildable."
        ),
    )
    fz.set_defaults(func=freeze)
    gcp = sub.add_parser(
        "gc",
        help="delete unreferenced icechunk chunks and unpublished table snapshots of a release",
        description=(
            "For every icechunk chip store of --release, expire the commits older than "
            "--older-than minutes that no branch or tag points at and delete the chunks and "
            "other objects no remaining commit references (icechunk's expire_snapshots and "
            "garbage_collect); delete the snapshots of the Parquet tables other than the "
            "published one taken before then. The manifest is updated so `verify` passes. "
            "A final (frozen) release is refused."
        ),
    )
    gcp.add_argument(
        "--older-than",
        type=_minutes_arg,
        default=60.0,
        metavar="MINUTES",
        help="keep what is younger, for readers still on a recent commit (default 60; 0: all)",
    )
    gcp.set_defaults(func=gc)
    pc = sub.add_parser(
        "prune-cache",
        help="delete the least recently used fetched windows, masks and chunks (STAC sources)",
        description=(
            "The STAC sources keep every Landsat band window, clear mask and Zarr chunk they "
            "fetch under <data root>/sources/.stac (qa/, windows/, zarr/), so reruns download "
            "nothing again. This deletes the entries not used for --older-than-days, then the "
            "least recently used ones until the rest fit in --max-gb; a deleted entry is only "
            "fetched again when a build needs it. Entries a running fetch holds are left alone; "
            "installed source items and search records are never touched. Without options it "
            "reports the caches' size. The source-set option cache_max_gb prunes after every "
            "fetch instead."
        ),
    )
    pc.add_argument("--max-gb", type=_amount_arg, metavar="GB", help="size to prune down to")
    pc.add_argument(
        "--older-than-days",
        type=_amount_arg,
        metavar="DAYS",
        help="delete every entry not used for this long",
    )
    pc.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")
    pc.set_defaults(func=prune_cache)
    df = sub.add_parser(
        "diff",
        help="what changed between two releases: partitions and field values; exit 1 if any",
        description=(
            "Compare the published observations of releases A and B under the data root: "
            "partitions added and removed, and per changed (city, year, modality, field) the "
            "tiles whose value changed, the largest absolute change, NULL→value and "
            "value→NULL flips with their reason codes, changed reasons and changed sources. "
            "Exits 0 when the releases are identical, 1 when they differ, 2 on an error."
        ),
    )
    df.add_argument("a", type=_release_arg, metavar="A", help="release compared from")
    df.add_argument("b", type=_release_arg, metavar="B", help="release compared to")
    df.add_argument("--json", action="store_true", help="print the differences as JSON")
    df.set_defaults(func=diff)
    cd = sub.add_parser(
        "card",
        help="(re)write a release's dataset card (STAC, Croissant, README.md); --validate it",
        description=(
            "Write collection.json (STAC Collection with the datacube extension), "
            "croissant.json (Croissant 1.0: observations, tiles, chip index and released "
            "fields as record sets) and README.md (coverage, availability per modality, "
            "licences and attribution per source, limitations) into the release root; a "
            "build writes them before the manifest. --validate checks the STAC Collection "
            "against STAC's core schema offline plus the datacube fields, and has mlcroissant "
            "validate croissant.json and read records of every record set (dev extra)."
        ),
    )
    cd.add_argument("--validate", action="store_true", help="validate the written card instead")
    cd.set_defaults(func=card)
    e = sub.add_parser(
        "evaluate",
        help="score a reference predictor (training mean, nearest tile) on the translation "
        "instances",
        description=(
            "Score every route of a split of the release's translation instances with its "
            "target's metric (AgenticCity-Bench Table 2), normalised by the training split, for a "
            "reference predictor: the training mean (each target's training mean, mean chip or "
            "majority class) or the nearest tile (the target of the training instance of the "
            "same route and scale whose source observation fields are nearest, fields "
            "standardised by the training split; class ids match or not). Writes a Parquet of "
            "(source, target, metric, score, instances) outside the release (its manifest "
            "stays valid) and prints the source × target table."
        ),
    )
    e.add_argument("--split", default="test", choices=["train", "val", "test"])
    e.add_argument("--targets", help="comma-separated target codes (default: every target)")
    e.add_argument(
        "--predictor",
        default="training_mean",
        choices=["training_mean", "nearest_tile"],
        help="reference predictor to score (default training_mean)",
    )
    e.add_argument(
        "--out",
        help="output Parquet (default <data>/evaluations/<release>/<predictor>_<split>.parquet)",
    )
    e.set_defaults(func=evaluate)
    rp = sub.add_parser(
        "represent",
        help="evaluate embeddings on the release's tiles with the CityRep protocol",
        description=(
            "Align embeddings to the release's tiles (finer: mean within the tile; coarser: "
            "broadcast; matching: lookup; entities pooled to H3 resolution 8 first; coordinate "
            "encoders queried at tile centres), build each city's tasks from the observations, "
            "split them by 10 x 10 (or 20 x 20) blocks in grid index space, the dataset's 10 km "
            "parent split, or at random (the leakage diagnostic), train the fixed heads (MLP "
            "with one hidden layer of 1024, or a linear probe) per seed and write per-seed "
            "scores, seed -> city -> task tables, mean city ranks and random-minus-spatial "
            "diagnostics. Without --embedding only the built-in references run: sinusoidal "
            "(coordinates), cube (the release's own numeric fields, minus the task's modality) "
            "and random. See docs/representation.md."
        ),
        epilog=(
            "Examples: `citycube represent` (built-ins, all cities, block10 + random, MLP, five "
            "seeds); `citycube represent --cities Amsterdam --tasks POP,NTL --heads mlp,linear "
            "--protocols block10,block20,parent,random`; `citycube represent --embedding "
            "mine=emb.tif --embeddings mine,random`. An embedding file is a GeoTIFF (bands = "
            "dimensions) or a Parquet table keyed by h3 (region), lon + lat (entities) or "
            "tile_id. Output: <data>/evaluations/<release>/represent/<name>/ (outside the "
            "release, whose manifest stays valid)."
        ),
    )
    rp.add_argument(
        "--name", default="builtin", help="run name: the output folder (default builtin)"
    )
    rp.add_argument(
        "--cities", help="comma-separated city keys (default: every city in the release)"
    )
    rp.add_argument(
        "--tasks",
        help="comma-separated task codes: POP,NTL,CO2,LST,PM25,RDE,PROP (regression), LCC,LUC "
        "(majority class), LCD (land-cover class fractions); default all",
    )
    rp.add_argument(
        "--embeddings", help="embeddings to evaluate (default: sinusoidal,cube,random + files)"
    )
    rp.add_argument(
        "--embedding",
        action="append",
        metavar="NAME=PATH",
        help="an embedding file (GeoTIFF or Parquet); repeatable",
    )
    rp.add_argument(
        "--scale", default="2km", choices=["2km", "5km"], help="task units (default 2km)"
    )
    rp.add_argument(
        "--year",
        type=int,
        help="year of the targets (default: each task's latest year with labels)",
    )
    rp.add_argument(
        "--protocols",
        help="comma-separated of block10, block20, parent, random (default block10,random)",
    )
    rp.add_argument("--seeds", help="comma-separated split seeds (default 42,24,7,0,100)")
    rp.add_argument("--heads", help="comma-separated of mlp, linear (default mlp)")
    rp.add_argument(
        "--missing",
        default="drop",
        choices=["drop", "zero"],
        help="tiles without an aligned feature: drop them, or zero-fill and flag (default drop)",
    )
    rp.add_argument("--l2", action="store_true", help="L2-normalise every feature row")
    rp.add_argument(
        "--max-epochs",
        type=int,
        help="cap on training epochs below the protocol's 100 (quick trials; recorded)",
    )
    rp.add_argument("--out", metavar="DIR", help="output folder (default under <data>/evaluations)")
    rp.set_defaults(func=represent)
    fs = sub.add_parser(
        "forecast-score",
        help="score forecasts of the forecasting cases against the baselines (Table 4 form)",
        description=(
            "Score a predictions file (one value per case) on the release's LST, carbon and "
            "property forecasting cases, next to the last-year and ten-year-mean baselines: "
            "MAE, MAPE, RMSE and R² with 95 %% intervals from city-stratified tile-block "
            "bootstrap replicates (seed 20261024; a block is all five cases of one tile; the "
            "same draws for every method). LST and carbon pool their cases; property is scored "
            "per city in local currency, and its MAPE also pooled. Writes "
            "forecast_<name>.{md,csv,parquet} (markdown: Table 4 and the RMSE / R² tables) "
            "outside the release. Without --predictions only the baselines are scored."
        ),
        epilog=(
            "Predictions file (CSV or Parquet): column case_id (the paper-form id from "
            "forecast_targets, e.g. Boston_2KM_r7_c8_lst_2022, or the opaque case_key from "
            "forecast_cases) and column prediction (or value), in the target's unit (°C; "
            "tonne C/tile/year; the case's local currency); optional column method for several "
            "methods in one file. A method predicts every case of a target or none of it."
        ),
    )
    fs.add_argument("--predictions", metavar="FILE", help="CSV or Parquet of case_id, prediction")
    fs.add_argument(
        "--name", help="name of the output files (default: the predictions file's stem)"
    )
    fs.add_argument(
        "--out", metavar="DIR", help="output folder (default <data>/evaluations/<release>)"
    )
    fs.add_argument(
        "--replicates",
        type=int,
        default=10_000,
        help="bootstrap replicates per evaluation group (default 10000)",
    )
    fs.set_defaults(func=forecast_score)
    d = sub.add_parser("dagster-home", help="prepare DAGSTER_HOME for offline `dagster dev`")
    d.set_defaults(func=dagster_home)
    r = sub.add_parser(
        "render",
        help="render a tile's chip (or a legend) as PNG with fixed, never-stretched colours",
        description=(
            "Render one tile of an image modality with its fixed rendering (RGB as supplied, "
            "fixed grey ranges, fixed palettes and legends; invalid pixels transparent), e.g. "
            "`citycube render --tile Boston_2KM_r7_c8 --modality OPT --year 2020`, or write a "
            "categorical legend with `citycube render --legend LC`."
        ),
    )
    r.add_argument("--tile", help="tile id, e.g. Boston_2KM_r7_c8 (the city is taken from it)")
    r.add_argument("--modality", help="image modality code, e.g. OPT, DEM, LC")
    r.add_argument("--year", type=int, help="calendar year, 2000–2025")
    r.add_argument(
        "--legend",
        metavar="NAME",
        help="write the legend of a categorical modality (LC, LU, POI) or a legend name instead",
    )
    r.add_argument(
        "--out",
        help="output PNG (default <release>/renders/<tile>_<MODALITY>_<year>.png, "
        "or <release>/renders/legend_<NAME>.png)",
    )
    r.set_defaults(func=render)
    a = sub.add_parser(
        "report",
        help="(re)write the availability report of a release and print its tables",
        description=(
            "Count available city-year-modality combinations (at least one tile available) over "
            "the city-years the release holds, for all 18 modalities; writes reports/"
            "availability_by_{modality,city}.{csv,md} and reports/availability_heatmap.png."
        ),
    )
    a.set_defaults(func=report)
    from pipelines.agents import add_parser as add_agents_parser

    add_agents_parser(sub)
    return p


class EarlyStop:
    """Ctrl-C or SIGTERM that comes while a command is still loading, kept until it can act.

    Python's own Ctrl-C handler raises KeyboardInterrupt wherever the main thread is, and one
    raised inside a finaliser is printed and swallowed: a build interrupted in its first
    seconds went on to the end. So the signal is only noted here; a command checks the note
    before it writes anything, and a build hands it to the handler that stops its driver.
    """

    def __init__(self) -> None:
        self.signals: list[int] = []
        self._previous = {s: signal.signal(s, self._note) for s in (signal.SIGINT, signal.SIGTERM)}

    def _note(self, signo: int, _frame: object) -> None:
        self.signals.append(signo)

    def exit_code(self) -> int | None:
        """128 + the first signal noted, or None when none came."""
        return 128 + self.signals[0] if self.signals else None

    def release(self) -> None:
        """Give the signals their usual handlers back (commands that need no deferral)."""
        for signo, handler in self._previous.items():
            signal.signal(signo, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    early = EarlyStop()
    from citycube.errors import CityCubeError

    try:
        args = parser().parse_args(argv)  # loads the libraries: a stop may come here
        code = early.exit_code()
        if code is not None:
            print(INTERRUPTED, file=sys.stderr)
            return code
        if args.func is build:
            args.early_stop = early  # run_build takes the signals over from here
        else:
            early.release()
        return int(args.func(args))
    except CityCubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C in a command that is not a build
        print(INTERRUPTED, file=sys.stderr)
        return 130


INTERRUPTED = (
    "stopped by Ctrl-C; files are written whole or not at all, so run the same command again "
    "to finish"
)
"""What an interrupted command says instead of a traceback."""


if __name__ == "__main__":
    sys.exit(main())
