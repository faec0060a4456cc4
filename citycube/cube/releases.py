"""The releases under a data root: what each holds, where it came from, whether it is intact,
and whether it is final.

Users keep several releases side by side and must tell them apart before citing or comparing
one: ``list_releases`` reads each release's ``release.json``, its published partitions and its
manifest (file sizes only, so a listing stays fast however large the releases are).

A release someone cites must not change under them. Releases are drafts until
``freeze_release`` makes one final: it checks every file against the manifest and writes
``final.json`` pinning the manifest's SHA-256. From then on ``ensure_writable`` refuses any
build or rewrite of that version (the fix is a new version), while drafts, such as the
default ``sample-0.1.0`` that ``make run`` rebuilds, stay rebuildable in place.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from citycube.cube.manifest import (
    FINAL_FILE,
    add_to_manifest,
    manifest_path,
    read_manifest,
    refresh_manifest,
    verify_release,
)
from citycube.cube.release import (
    Release,
    observation_partitions,
    prune_snapshots,
    validate_release_version,
    write_json_atomic,
)
from citycube.errors import InvalidNameError, ReleaseImmutableError, ReleaseNotFoundError
from citycube.io.digest import file_sha256

PartitionKey = tuple[str, int, str]
"""(city, year, modality) of one observations partition."""


@dataclass(frozen=True)
class SourceVersion:
    """One product's source as a release recorded it."""

    product: str
    """Product id, e.g. 'odiac'."""
    source_id: str
    """Who served it, e.g. 'sample:odiac'."""
    version: str
    """The source's version string."""


@dataclass(frozen=True)
class ReleaseSummary:
    """What ``citycube releases`` shows of one release."""

    version: str
    """Release version id (its directory name)."""
    root: str
    """The release directory."""
    published: bool
    """True when a checked database was published (``cube.duckdb`` and ``release.json``)."""
    built_at: str | None
    """When the published database was built (UTC), from ``release.json``."""
    synthetic: bool | None
    """True when built from the synthetic sample backend."""
    source_set: str | None
    """Name of the source set it was built from."""
    catalogue_digest: str | None
    """Digest of the modality catalogue its rules came from."""
    engine_version: str | None
    """Processing engine version, from the manifest."""
    cities: tuple[str, ...]
    """Cities with at least one published partition."""
    years: tuple[int, ...]
    """Calendar years with at least one published partition."""
    modalities: tuple[str, ...]
    """Modalities with at least one published partition."""
    partitions: int
    """Published (city, year, modality) observations partitions."""
    partitions_from: str
    """Where the partitions were read: 'database' (published tables) or 'files' (on disk)."""
    sources: tuple[SourceVersion, ...]
    """Each product's source id and version."""
    manifest: str
    """'matches' (file list and sizes), 'differs', 'absent' or 'unreadable'."""
    manifest_problems: tuple[str, ...] = field(default=())
    """Up to a few files that differ from the manifest, when it differs."""
    final: bool = False
    """True when the release was frozen: immutable, never rebuilt in place."""
    frozen_at: str | None = None
    """When it was frozen (UTC)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return asdict(self)


def releases_dir(data_root: Path) -> Path:
    """Where a data root keeps its releases."""
    return data_root / "releases"


def release_versions(data_root: Path) -> list[str]:
    """Version ids of the release directories under ``data_root``, sorted (others skipped)."""
    folder = releases_dir(data_root)
    if not folder.is_dir():
        return []
    versions = []
    for path in sorted(folder.iterdir()):
        if not path.is_dir():
            continue
        try:
            versions.append(validate_release_version(path.name))
        except InvalidNameError:
            continue  # a hidden or temporary folder, never a release
    return versions


def open_release(data_root: Path, version: str) -> Release:
    """A release that exists, with an error naming the releases there are when it does not."""
    release = Release(data_root, validate_release_version(version))
    if not release.root.is_dir():
        known = ", ".join(release_versions(data_root)) or "none"
        raise ReleaseNotFoundError(
            f"no release {version!r} under {releases_dir(data_root)} (releases there: {known}); "
            "list them with `citycube releases` or pass --data"
        )
    return release


def read_release_metadata(release: Release) -> dict[str, Any]:
    """``release.json``, or an empty mapping when the release was never published."""
    try:
        meta = json.loads(release.metadata_file.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def published_partitions(release: Release) -> tuple[list[PartitionKey], str]:
    """The partitions the published database shows, and 'database'; else those on disk, 'files'.

    The database is opened read-only; when it is absent, locked or too old to list its
    partitions, the files on disk are counted instead (and the listing says so).
    """
    if release.duckdb_file.exists():
        import duckdb

        try:
            with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
                rows = con.execute(
                    "SELECT city, year, modality FROM published_observations"
                ).fetchall()
            return sorted((str(c), int(y), str(m)) for c, y, m in rows), "database"
        except duckdb.Error:
            pass
    files = observation_partitions(release)
    return sorted((p["city"], p["year"], p["modality"]) for p in files), "files"


def _manifest_state(release: Release) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    if not manifest_path(release).exists():
        return "absent", {}, ()
    try:
        manifest = read_manifest(release)
        check = verify_release(release, hashes=False)
    except ReleaseNotFoundError:
        return "unreadable", {}, ()
    if check.ok:
        return "matches", manifest, ()
    problems = list(check.database)  # what readers of the database get, first
    problems += [f"changed {p}" for p in check.changed] + [f"missing {p}" for p in check.missing]
    problems += [f"not in the manifest {p}" for p in check.unexpected]
    return "differs", manifest, tuple(problems[:5])


def final_path(release: Release) -> Path:
    """Where a frozen release's ``final.json`` lives."""
    return release.root / FINAL_FILE


def final_record(release: Release) -> dict[str, Any] | None:
    """``final.json`` of a frozen release; None for a draft.

    A damaged record still counts as final: a release once frozen is never silently writable.
    """
    path = final_path(release)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return {"version": release.version, "damaged": True}
    return record if isinstance(record, dict) else {"version": release.version, "damaged": True}


def next_version(version: str) -> str:
    """A suggested new version: the last number bumped ('sample-0.1.0' → 'sample-0.1.1')."""
    match = re.search(r"(\d+)(\D*)$", version)
    if match is None:
        return f"{version}-2"
    start, end = match.span(1)
    return f"{version[:start]}{int(match.group(1)) + 1}{version[end:]}"


def ensure_writable(release: Release) -> Release:
    """``release`` when it is a draft; ``ReleaseImmutableError`` naming a new version if final."""
    record = final_record(release)
    if record is None:
        return release
    suggestion = next_version(release.version)
    while Release(release.data_root, suggestion).root.exists():
        suggestion = next_version(suggestion)
    raise ReleaseImmutableError(
        f"release {release.version} is final (frozen {record.get('frozen_at', 'earlier')}) and "
        f"is never rebuilt or changed in place: build a new version instead, e.g. "
        f"`make run CITYCUBE_RELEASE={suggestion}` or `citycube --release {suggestion} build`"
    )


def freeze_release(release: Release) -> dict[str, Any]:
    """Make a published, intact release final; the ``final.json`` record (kept if already final).

    Every file's hash is checked against the manifest first, so what is frozen is exactly what
    the manifest lists; the record pins the manifest's own SHA-256.
    """
    existing = final_record(release)
    if existing is not None:
        return existing
    if not (release.duckdb_file.exists() and release.metadata_file.exists()):
        raise ReleaseNotFoundError(
            f"release {release.version} has no published database: finish its build with "
            f"`citycube --release {release.version} build` before freezing it"
        )
    check = verify_release(release)  # raises, naming the fix, when there is no manifest
    if not check.ok:
        raise ReleaseImmutableError(
            f"release {release.version} differs from its manifest ({'; '.join(check.lines(3))}): "
            f"rebuild it with `citycube --release {release.version} build`, then freeze it"
        )
    tagged = 0
    if any((release.root / "chips").glob("*/*/*.icechunk")):
        from citycube.cube.chips_icechunk import chip_repositories, tag_chip_stores

        # The tag refs are files of the repositories: listed in the manifest before it is pinned.
        add_to_manifest(release, tag_chip_stores(release, release.version))
        tagged = len(chip_repositories(release))
    record = {
        "version": release.version,
        "frozen_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "manifest_sha256": file_sha256(manifest_path(release)),
        "files": len(read_manifest(release)["files"]),
        "chip_stores_tagged": tagged,
    }
    write_json_atomic(record, final_path(release))
    return record


@dataclass(frozen=True)
class GarbageReport:
    """What ``collect_garbage`` removed from a release."""

    chip_stores: int
    """icechunk chip stores collected."""
    commits_expired: int
    """Commits taken out of their store's history."""
    chunks_deleted: int
    """Chunk files no remaining commit referenced."""
    bytes_deleted: int
    """Bytes the stores' deleted objects held."""
    table_snapshots_deleted: tuple[str, ...]
    """Snapshots of the Parquet tables deleted (never the published one)."""

    def lines(self) -> list[str]:
        """A readable account."""
        return [
            f"{self.chip_stores} icechunk chip stores: {self.commits_expired} commits expired, "
            f"{self.chunks_deleted} unreferenced chunks deleted ({self.bytes_deleted:,} bytes)",
            f"{len(self.table_snapshots_deleted)} unpublished snapshots of the tables deleted",
        ]


def collect_garbage(release: Release, older_than: datetime) -> GarbageReport:
    """Delete what no reader can reach any more and what is older than ``older_than``: the
    commits of each icechunk chip store that no branch or tag points at, the chunks only
    they (or killed writes) referenced, and snapshots of the tables other than the published
    one. The manifest is brought up to date, so ``verify`` still passes.

    A final release is refused: its manifest is pinned, and a release someone cites never
    changes.
    """
    ensure_writable(release)
    from citycube.cube.chips_icechunk import chip_repositories, collect_store_garbage

    stores = chip_repositories(release)
    collected = [collect_store_garbage(path, older_than) for path in stores]
    removed = prune_snapshots(release, keep=0, older_than=older_than)
    if stores and manifest_path(release).exists():
        refresh_manifest(release, stores)
    return GarbageReport(
        chip_stores=len(stores),
        commits_expired=sum(c.snapshots_expired for c in collected),
        chunks_deleted=sum(c.chunks_deleted for c in collected),
        bytes_deleted=sum(c.bytes_deleted for c in collected),
        table_snapshots_deleted=tuple(removed),
    )


def manifest_pinned(release: Release) -> bool | None:
    """For a final release, whether its manifest is the one it was frozen with; None for a draft."""
    record = final_record(release)
    if record is None:
        return None
    path = manifest_path(release)
    return path.exists() and record.get("manifest_sha256") == file_sha256(path)


def summarise_release(release: Release) -> ReleaseSummary:
    """One release's listing entry."""
    meta = read_release_metadata(release)
    manifest_state, manifest, problems = _manifest_state(release)
    partitions, partitions_from = published_partitions(release)
    final = final_record(release)
    recorded = meta.get("sources") or manifest.get("sources") or {}
    sources = tuple(
        SourceVersion(product, str(info.get("source_id", "")), str(info.get("version", "")))
        for product, info in sorted(recorded.items())
        if isinstance(info, dict)
    )
    return ReleaseSummary(
        version=release.version,
        root=str(release.root),
        published=release.duckdb_file.exists() and bool(meta),
        built_at=meta.get("built_at") or manifest.get("built_at"),
        synthetic=meta.get("synthetic", manifest.get("synthetic")),
        source_set=meta.get("source_set") or manifest.get("source_set"),
        catalogue_digest=meta.get("catalogue_digest") or manifest.get("catalogue_digest"),
        engine_version=manifest.get("engine_version"),
        cities=tuple(sorted({c for c, _, _ in partitions})),
        years=tuple(sorted({y for _, y, _ in partitions})),
        modalities=tuple(sorted({m for _, _, m in partitions})),
        partitions=len(partitions),
        partitions_from=partitions_from,
        sources=sources,
        manifest=manifest_state,
        manifest_problems=problems,
        final=final is not None,
        frozen_at=(final or {}).get("frozen_at"),
    )


def list_releases(data_root: Path) -> list[ReleaseSummary]:
    """Every release under ``data_root``, oldest build first (unpublished ones last)."""
    summaries = [summarise_release(Release(data_root, v)) for v in release_versions(data_root)]
    return sorted(summaries, key=lambda s: (s.built_at is None, s.built_at or "", s.version))


def _years_text(years: tuple[int, ...]) -> str:
    if not years:
        return "-"
    if list(years) == list(range(years[0], years[-1] + 1)) and len(years) > 2:
        return f"{years[0]}–{years[-1]}"
    return ",".join(str(y) for y in years)


def _sources_text(sources: tuple[SourceVersion, ...]) -> str:
    """Source ids grouped by version: 'sample-1: sample:odiac, sample:viirs_vnl; …'."""
    by_version: dict[str, list[str]] = {}
    for s in sources:
        by_version.setdefault(s.version, []).append(s.source_id)
    return "; ".join(f"{v}: {', '.join(ids)}" for v, ids in sorted(by_version.items())) or "-"


def releases_text(summaries: list[ReleaseSummary]) -> str:
    """The human listing: one block per release."""
    if not summaries:
        return "no releases"
    out = []
    for s in summaries:
        if s.final:
            state = f"FINAL (immutable, frozen {s.frozen_at or '-'})"
        elif s.published:
            state = "published draft (a build replaces it; `citycube freeze` makes it final)"
        else:
            state = "draft (no published database)"
        flag = "  SYNTHETIC" if s.synthetic else ""
        out.append(f"{s.version}  {state}  built {s.built_at or '-'}{flag}")
        where = "" if s.partitions_from == "database" else " (counted from files on disk)"
        out.append(
            f"  {len(s.cities)} cities ({', '.join(s.cities) or '-'}), {len(s.years)} years "
            f"({_years_text(s.years)}), {len(s.modalities)} modalities: "
            f"{s.partitions} partitions{where}"
        )
        out.append(
            f"  catalogue {s.catalogue_digest or '-'}  engine {s.engine_version or '-'}  "
            f"source set {s.source_set or '-'}"
        )
        out.append(f"  sources {_sources_text(s.sources)}")
        manifest = {
            "matches": (
                "manifest matches (file list and sizes, the database's views and tables; "
                "`verify` checks hashes)"
            ),
            "differs": "manifest DIFFERS: " + "; ".join(s.manifest_problems),
            "absent": "no manifest (its build has not finished)",
            "unreadable": "manifest unreadable",
        }[s.manifest]
        out.append(f"  {manifest}")
    return "\n".join(out)


def query_help(release: Release) -> str:
    """How to query a release: its database and one-liners for the DuckDB shell and Python."""
    db = release.duckdb_file.resolve()
    if not db.exists():
        raise ReleaseNotFoundError(
            f"release {release.version} has no published database at {db}: finish its build "
            f"with `citycube --release {release.version} build` (or `make run`)"
        )
    sql = "SELECT city, year, modality, count(*) FILTER (WHERE available) AS available_rows "
    sql += "FROM observations GROUP BY ALL ORDER BY ALL"
    python = (
        f"import duckdb; con = duckdb.connect({json.dumps(str(db))}, read_only=True); "
        'print(con.sql("FROM observations LIMIT 5"))'
    )
    lines = [
        f"release {release.version}: {db}",
        f"  .venv/bin/duckdb -readonly {shlex.quote(str(db))} -c {shlex.quote(sql)}",
        f"  .venv/bin/python -c {shlex.quote(python)}",
    ]
    stores = sorted((release.root / "chips").glob("*/*/*.icechunk"))
    if stores:
        ref = json.dumps(release.version) if final_record(release) is not None else "None"
        chips = (
            "from citycube.cube.chips import open_chips; "
            f"print(open_chips({json.dumps(str(stores[0].resolve()))}, ref={ref}))"
        )
        lines += [
            f"  {len(stores)} icechunk chip stores ("
            + (f"tag {release.version}" if ref != "None" else "branch published")
            + "), e.g.:",
            f"  .venv/bin/python -c {shlex.quote(chips)}",
        ]
    return "\n".join(lines)


__all__ = [
    "GarbageReport",
    "ReleaseSummary",
    "SourceVersion",
    "collect_garbage",
    "ensure_writable",
    "final_record",
    "freeze_release",
    "list_releases",
    "manifest_pinned",
    "next_version",
    "open_release",
    "published_partitions",
    "query_help",
    "read_release_metadata",
    "release_versions",
    "releases_text",
    "summarise_release",
]
