"""A release's manifest: every file's SHA-256 and size, its sources, rules and code version.

Users cite a release and must be able to check that it is the one they cited. The manifest is
written last, after the database and the reports, and ``verify_release`` recomputes every hash:
a flipped byte in any chunk, Parquet file, report, quick-look or the database is caught, as is
a file that went missing or appeared. The DuckDB database every reader opens, ``cube.duckdb``,
is listed like any file and, besides, by what a reader gets from it (``database``: each view's
and macro's definition and each table's rows, read through a read-only connection, which
checks every block it reads): a replaced view or a damaged block is caught even by the
listing's quick check, which compares sizes only. A database rebuilt by ``citycube views`` has
new bytes but the same definitions. The tables are covered as published (``published/``:
observations, chip index, tiles, benchmark; in the release folder itself for a release
published before that folder existed); the draft a later build writes and the snapshots are
not.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from citycube.catalogue.modalities import Catalogue
from citycube.catalogue.versions import ENGINE_VERSION, modality_code_version
from citycube.cube.release import Release
from citycube.errors import ReleaseNotFoundError
from citycube.io.atomic import write_text_atomic
from citycube.io.digest import WRITTEN_DIGESTS, file_sha256, file_state

if TYPE_CHECKING:
    import duckdb

MANIFEST_FILE = "manifest.json"
"""The manifest's name in the release directory."""
MANIFEST_FORMAT = 4
"""Bump when the manifest's layout changes (2: ``package_version`` and ``code_versions``; 3: each
file's ``state``, so an untouched file's hash is carried over; 4: ``cube.duckdb`` listed, and
its definitions under ``database``)."""
FINAL_FILE = "final.json"
"""Written when a release is frozen; it pins the manifest's own SHA-256 (``citycube freeze``)."""
DATABASE_FILE = "cube.duckdb"
"""The database readers open, in the release root."""
EXCLUDED_NAMES = frozenset({MANIFEST_FILE, FINAL_FILE})
"""Files of the release root that the manifest does not cover: itself and the record that pins
it. A ``cube.duckdb.wal`` is not excluded: it holds writes a reader would see."""
RELEASE_ROOT_MARK = "<release>"
"""Stands for the release folder in the view definitions the manifest records, so that a
release moved and given new views by ``citycube views`` keeps the same definitions."""
TIMESTAMPED_FILES = frozenset(
    {
        "release.json",
        "croissant.json",
        "README.md",
        "published/benchmark/instances_manifest.json",
        "benchmark/instances_manifest.json",  # where releases published it before published/
    }
)
"""Files whose content records when the build ran (``built_at`` in release.json, quoted by the
dataset card's Croissant file and data card, and in the instances manifest): a rebuild of the
same inputs changes them and nothing else, so comparisons of two builds leave them out."""
EXCLUDED_DIRS = frozenset({".staging", "renders"})
"""Folders it does not cover: the staged database, and renders a user asks for later."""


def manifest_path(release: Release) -> Path:
    """Where a release's manifest lives."""
    return release.root / MANIFEST_FILE


def release_files(release: Release) -> Iterator[Path]:
    """Every file the manifest covers, in a stable order (temporary and hidden files skipped)."""
    for folder, names, _ in _walk(release):
        yield from (folder / name for name in names)


def _walk(release: Release) -> Iterator[tuple[Path, list[str], bool]]:
    """Each folder of the release: the names of its files the manifest covers, and whether a
    writer left the digests of its files there."""
    root = release.root
    for folder, dirs, files in os.walk(root):  # the draft and snapshots are hidden: skipped
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED_DIRS and not d.startswith("."))
        excluded = EXCLUDED_NAMES if folder == str(root) else ()
        kept = [name for name in sorted(files) if not name.startswith(".") and name not in excluded]
        yield Path(folder), kept, WRITTEN_DIGESTS in files


def _written_digests(root: Path, folder: Path) -> dict[str, Mapping[str, Any]]:
    """The digests a writer left in ``folder``, by release-relative name (none if damaged)."""
    try:
        entries = json.loads((folder / WRITTEN_DIGESTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(entries, dict):
        return {}
    prefix = folder.relative_to(root).as_posix()
    return {f"{prefix}/{name}": entry for name, entry in entries.items() if isinstance(entry, dict)}


HASH_THREADS = max(2, min(8, os.cpu_count() or 2))
"""Files hashed at once: one per core (SHA-256 releases the GIL), at least two, so one thread's
open and read calls overlap another's hashing."""
HASH_BATCH = 64
"""Files each thread task hashes: a release is mostly small chunk files, and a task (a future,
a lock hand-over) per file cost more than hashing it — 88,000 files of the calendar took 9 s
on 2 threads one per task, 4.8 s in batches of 64."""


def _in_threads(function: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    """``function`` over ``items`` on ``HASH_THREADS`` threads, results in order."""
    listed = list(items)
    batches = [listed[i : i + HASH_BATCH] for i in range(0, len(listed), HASH_BATCH)]
    with ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="manifest-hash") as pool:
        done = pool.map(lambda batch: [function(item) for item in batch], batches)
        return [result for batch in done for result in batch]


def _entry(path: Path, *known: Mapping[str, Any] | None) -> dict[str, Any]:
    """A file's manifest entry; a hash already known for it (from the earlier manifest, or
    from its writer) is kept when the file is untouched since, else the file is hashed.

    A rebuild rewrites a few partitions of a release of a hundred thousand files, and hashing
    them all again took minutes on the whole calendar; a fresh build's chunks were hashed by
    their writer from the bytes it wrote, which spares reading 5 GB back.
    """
    state = file_state(path)
    return _known_entry(state, *known) or _hashed_entry(path, state)


def _known_entry(state: list[int], *known: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The entry of a file in ``state`` from a hash known for that same state, if any."""
    for entry in known:
        if entry is not None and entry.get("state") == state and "sha256" in entry:
            return {"sha256": entry["sha256"], "bytes": state[0], "state": state}
    return None


def _hashed_entry(path: str | Path, state: list[int]) -> dict[str, Any]:
    return {"sha256": file_sha256(path), "bytes": state[0], "state": state}


def _earlier_entries(release: Release) -> dict[str, Mapping[str, Any]]:
    """The entries of the manifest already on disk (none if there is none, or it is damaged)."""
    try:
        files = read_manifest(release)["files"]
    except ReleaseNotFoundError:
        return {}
    return {k: v for k, v in files.items() if isinstance(v, Mapping)}


def database_definitions(release: Release) -> dict[str, Any]:
    """What a reader of ``cube.duckdb`` gets from it, whatever its bytes: each view's and
    macro's definition (the release folder written as :data:`RELEASE_ROOT_MARK`) and each
    table's rows (count and SHA-256, rows in sorted order).

    The database is opened read-only, so nothing is written to it; reading every table and the
    catalogue makes DuckDB check each block it holds against the block's checksum. Raises
    ``duckdb.Error`` when the database cannot be opened or read.
    """
    import hashlib

    import duckdb

    root = str(release.root.resolve())

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def named(schema: str, name: str) -> str:
        return name if schema == "main" else f"{schema}.{name}"

    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        views = con.execute(
            "SELECT schema_name, view_name, sql FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
        macros = con.execute(
            "SELECT schema_name, function_name, function_type, "
            "coalesce(macro_definition, ''), parameters::VARCHAR "
            "FROM duckdb_functions() WHERE NOT internal"
        ).fetchall()
        tables = {}
        for schema, name in con.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE NOT internal"
        ).fetchall():
            tables[named(schema, name)] = _table_digest(con, f"{_quoted(schema)}.{_quoted(name)}")
    folders = re.compile(r"'(/[^']*/releases/" + re.escape(release.version) + r")/")
    elsewhere = {f for _, _, sql in views for f in folders.findall(sql or "")} - {root}
    return {
        **({"elsewhere": sorted(elsewhere)} if elsewhere else {}),
        "views": {
            named(schema, name): digest((sql or "").replace(root, RELEASE_ROOT_MARK))
            for schema, name, sql in sorted(views)
        },
        "macros": {
            named(schema, name): digest(f"{kind} {params} {body}")
            for schema, name, kind, body, params in sorted(macros)
        },
        "tables": dict(sorted(tables.items())),
    }


LARGE_TABLE_ROWS = 20_000
"""Tables with more rows are digested inside DuckDB (:func:`_table_digest`)."""


LOW_64_BITS = (1 << 64) - 1


def _table_digest(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, Any]:
    """A table's row count and SHA-256, whatever order its rows are stored in.

    A small table's sorted rows are hashed as JSON. A large one (the observations, the chip
    index: millions of rows for the whole calendar) would not fit in memory as Python objects,
    so DuckDB sums the MD5 of each row's text in both halves, and those sums are hashed with
    the column names and types: a changed, added or dropped row changes them.
    """
    import hashlib

    (count,) = con.execute(f"SELECT count(*) FROM {table}").fetchone() or (0,)
    if count <= LARGE_TABLE_ROWS:
        cursor = con.execute(f"SELECT * FROM {table} ORDER BY ALL")
        columns = [d[0] for d in cursor.description or ()]
        rows = cursor.fetchall()
        text = json.dumps([columns, rows], default=str)
    else:
        columns = con.execute(f"DESCRIBE {table}").fetchall()
        # The sums of md5_number_upper and md5_number_lower over the rows' text, from one
        # MD5 per row: those two halves are the low and high 64 bits of md5_number's value.
        sums = con.execute(
            f"SELECT sum((h & {LOW_64_BITS}::UHUGEINT)::UBIGINT)::VARCHAR, "
            "sum((h >> 64)::UBIGINT)::VARCHAR "
            f"FROM (SELECT md5_number(r::VARCHAR) AS h FROM {table} AS r)"
        ).fetchone()
        text = json.dumps([[c[:2] for c in columns], count, sums], default=str)
    return {"rows": count, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def _quoted(identifier: str) -> str:
    """A DuckDB identifier in double quotes (names come from the database itself)."""
    return '"' + identifier.replace('"', '""') + '"'


def database_problems(release: Release, recorded: Mapping[str, Any]) -> list[str]:
    """How ``cube.duckdb`` differs from the definitions the manifest ``recorded`` (empty when
    a reader gets what was published): views, macros or tables replaced, added or gone, or a
    database that cannot be read."""
    import duckdb

    path = release.duckdb_file
    if not path.exists():
        return []  # listed among the missing files
    try:
        found = database_definitions(release)
    except duckdb.Error as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "could not set lock" in why.lower() or "conflicting lock" in why.lower():
            return [
                f"{DATABASE_FILE} could not be checked: another process holds it open for "
                f"writing ({why}); close that process and verify again"
            ]
        return [f"{DATABASE_FILE} cannot be read ({why})"]
    problems = []
    if found.get("elsewhere"):
        problems.append(
            f"its views read files of the release at {', '.join(found['elsewhere'])}, not "
            f"{release.root.resolve()}: the release was moved or copied; rebuild its views with "
            f"`citycube --release {release.version} views`"
        )
    for kind in ("views", "macros", "tables"):
        want: Mapping[str, Any] = recorded.get(kind) or {}
        have = found[kind]
        singular = kind[:-1]
        added = sorted(set(have) - set(want))
        problems += [f"{singular} {name} is not in the manifest" for name in added]
        problems += [f"{singular} {name} is gone" for name in sorted(set(want) - set(have))]
        problems += [
            f"{singular} {name} differs from the manifest"
            for name in sorted(set(want) & set(have))
            if want[name] != have[name]
        ]
    return problems


def package_version() -> str | None:
    """The installed citycube package's version, if it is installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("citycube")
    except PackageNotFoundError:
        return None


def build_manifest(
    release: Release, metadata: Mapping[str, Any], catalogue: Catalogue | None = None
) -> dict[str, Any]:
    """The manifest of a release as it is on disk now.

    With ``catalogue``, each modality's code version (engine version + spec digest) is recorded
    too, so a cited release names the exact rules its values came from.
    """
    if not release.root.is_dir():
        raise ReleaseNotFoundError(f"no release at {release.root}")
    earlier = _earlier_entries(release)
    files: dict[str, dict[str, Any]] = {}
    unknown: list[tuple[str, str, list[int]]] = []
    written: dict[str, Mapping[str, Any]] = {}
    # Most files' hashes are known (their writer's, or the earlier manifest's): those cost a
    # stat here, with plain strings (Path objects and a task per file were most of the time
    # for the calendar's ~90,000 files); only the others are read, on a few threads. A
    # writer's digests sit at the top of what it wrote, which the walk visits first.
    for folder, kept, has_digests in _walk(release):
        if has_digests:
            written.update(_written_digests(release.root, folder))
        prefix = folder.relative_to(release.root).as_posix()
        prefix = "" if prefix == "." else f"{prefix}/"
        for name in kept:
            path, key = os.path.join(folder, name), prefix + name
            state = file_state(path)
            entry = _known_entry(state, earlier.get(key), written.get(key))
            if entry is None:  # hashed below; its place in the listing kept
                unknown.append((key, path, state))
                entry = {}
            files[key] = entry
    for (key, _, _), entry in zip(
        unknown, _in_threads(lambda item: _hashed_entry(*item[1:]), unknown), strict=True
    ):
        files[key] = entry
    return {
        "format": MANIFEST_FORMAT,
        "release": release.version,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "engine_version": ENGINE_VERSION,
        "package_version": package_version(),
        "code_versions": (
            {m.code: modality_code_version(m, catalogue) for m in catalogue.modalities}
            if catalogue is not None
            else {}
        ),
        "catalogue_digest": metadata.get("catalogue_digest"),
        "source_set": metadata.get("source_set"),
        "synthetic": metadata.get("synthetic"),
        "sources": metadata.get("sources", {}),
        "built_at": metadata.get("built_at"),
        "totals": {"files": len(files), "bytes": sum(f["bytes"] for f in files.values())},
        "files": files,
        "database": _database_entry(release),
    }


def _database_entry(release: Release) -> dict[str, Any] | None:
    """The database's definitions for the manifest (None when the release has none yet);
    a database that cannot be read is an error here: the manifest would bless it."""
    import duckdb

    if not release.duckdb_file.exists():
        return None
    try:
        return database_definitions(release)
    except duckdb.Error as exc:
        raise ReleaseNotFoundError(
            f"the database {release.duckdb_file} cannot be read ({str(exc).splitlines()[0]}): "
            f"rebuild it with `citycube --release {release.version} views`, then write the "
            "manifest again"
        ) from None


def refresh_database(release: Release) -> bool:
    """Bring the manifest's entry of ``cube.duckdb`` and its definitions to the database there
    now, after ``citycube views`` rebuilt it; False (nothing written) when the release has no
    manifest, or a final one (its manifest is pinned: the rebuilt database's definitions
    are checked against the frozen ones)."""
    if not manifest_path(release).exists() or (release.root / FINAL_FILE).exists():
        return False
    manifest = read_manifest(release)
    files: dict[str, Any] = manifest["files"]
    if release.duckdb_file.exists():
        files[DATABASE_FILE] = _entry(release.duckdb_file, None)
    else:
        files.pop(DATABASE_FILE, None)
    manifest["files"] = dict(sorted(files.items()))
    manifest["database"] = _database_entry(release)
    manifest["format"] = MANIFEST_FORMAT
    entries = manifest["files"].values()
    manifest["totals"] = {"files": len(entries), "bytes": sum(f["bytes"] for f in entries)}
    _write(manifest, release)
    return True


def write_manifest(
    release: Release, metadata: Mapping[str, Any], catalogue: Catalogue | None = None
) -> Path:
    """Hash every file of the release and write the manifest atomically."""
    return _write(build_manifest(release, metadata, catalogue), release)


def manifest_text(manifest: Mapping[str, Any]) -> str:
    """The manifest as JSON: keys sorted, indented, one line per file entry.

    What ``json.dumps(..., indent=2, sort_keys=True)`` gives, except that each file's entry
    stays on one line (and diffs as one): indented output goes through json's pure-Python
    encoder, which took 2.8 s for the calendar's 88,000 entries; one line each, the C encoder.
    """
    parts = []
    for key, value in sorted(manifest.items()):
        if key == "files" and value:
            lines = ",\n".join(
                f"    {json.dumps(name)}: {json.dumps(entry, sort_keys=True, default=str)}"
                for name, entry in sorted(value.items())
            )
            text = f"{{\n{lines}\n  }}"
        else:
            text = json.dumps(value, indent=2, sort_keys=True, default=str).replace("\n", "\n  ")
        parts.append(f"  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}"


def _write(manifest: Mapping[str, Any], release: Release) -> Path:
    return write_text_atomic(manifest_text(manifest), manifest_path(release))


def add_to_manifest(release: Release, paths: list[Path]) -> None:
    """List files added after the manifest was written (a frozen release's chip tags)."""
    if not paths:
        return
    manifest = read_manifest(release)
    for path in paths:
        manifest["files"][path.relative_to(release.root).as_posix()] = _entry(path, None)
    manifest["files"] = dict(sorted(manifest["files"].items()))
    files = manifest["files"].values()
    manifest["totals"] = {"files": len(files), "bytes": sum(f["bytes"] for f in files)}
    _write(manifest, release)


def refresh_manifest(release: Release, folders: Iterable[Path]) -> None:
    """Bring the manifest's entries under ``folders`` to the files there now, the others left
    as they are: after a garbage collection deleted files of chip stores and rewrote refs.
    Files untouched since they were listed keep their hash without being read."""
    manifest = read_manifest(release)
    prefixes = tuple(f"{Path(f).relative_to(release.root).as_posix()}/" for f in folders)
    if not prefixes:
        return
    listed: dict[str, Any] = manifest["files"]
    files = {name: entry for name, entry in listed.items() if not name.startswith(prefixes)}
    for path in release_files(release):
        name = path.relative_to(release.root).as_posix()
        if name.startswith(prefixes):
            files[name] = _entry(path, listed.get(name))
    manifest["files"] = dict(sorted(files.items()))
    entries = manifest["files"].values()
    manifest["totals"] = {"files": len(entries), "bytes": sum(f["bytes"] for f in entries)}
    _write(manifest, release)


def content_digests(release: Release) -> dict[str, str]:
    """What the release holds, for comparing two builds: each manifest file's SHA-256, except
    that an icechunk chip store counts as one entry, the digest of its Zarr content as readers
    open it.

    icechunk names its snapshots and chunk files at random, so a rebuild of the same chips
    never has the same repository files; its content (every key and its bytes) is the same.
    ``cube.duckdb`` is left out: a rebuild's database reads a new snapshot of the same tables
    (its id and paths differ), and those tables are compared file by file.
    """
    from citycube.cube.chips_zarr import ICECHUNK_SUFFIX

    files: dict[str, Any] = read_manifest(release)["files"]
    digests: dict[str, str] = {}
    stores: set[str] = set()
    for name, entry in files.items():
        if name == DATABASE_FILE:
            continue
        parts = name.split("/")
        store = next((i for i, part in enumerate(parts) if part.endswith(ICECHUNK_SUFFIX)), None)
        if store is None:
            digests[name] = str(entry.get("sha256"))
        else:
            stores.add("/".join(parts[: store + 1]))
    if stores:
        from citycube.cube.chips_icechunk import store_content_digest

        for store in sorted(stores):
            digests[store] = store_content_digest(release.root / store)
    return dict(sorted(digests.items()))


@dataclass
class Verification:
    """What ``verify_release`` found."""

    checked: int = 0
    """Files whose hash was recomputed."""
    changed: list[str] = field(default_factory=list)
    """Files whose content differs from the manifest."""
    missing: list[str] = field(default_factory=list)
    """Files the manifest lists that are gone."""
    unexpected: list[str] = field(default_factory=list)
    """Files on disk that the manifest does not list."""
    database: list[str] = field(default_factory=list)
    """How what a reader of ``cube.duckdb`` gets differs from the manifest's definitions."""
    draft: list[str] = field(default_factory=list)
    """Files a build wrote since that no reader of the release reads: commits of chip stores on
    their draft branch (objects the published commit does not reference, the draft branch's
    ref, stores not published yet). Not damage."""
    notes: list[str] = field(default_factory=list)
    """What is worth knowing but is no damage (a database rebuilt with the same definitions,
    one a manifest of an older format does not cover)."""

    @property
    def ok(self) -> bool:
        """True when every file is as the manifest says, nothing else is there, and the
        database gives readers what it gave when the manifest was written."""
        return not (self.changed or self.missing or self.unexpected or self.database)

    def lines(self, most: int = 20) -> list[str]:
        """A readable account, at most ``most`` paths per kind."""
        out = [f"{self.checked} files checked"]
        for label, paths in (
            ("changed", self.changed),
            ("missing", self.missing),
            ("not in the manifest", self.unexpected),
            (f"problems in {DATABASE_FILE}", self.database),
        ):
            if paths:
                out.append(f"{len(paths)} {label}:")
                out += [f"  {p}" for p in paths[:most]]
                if len(paths) > most:
                    out.append(f"  … and {len(paths) - most} more")
        if self.draft:
            out.append(
                f"note: {len(self.draft)} files of chip stores' draft commits (written by a build "
                "since, not published; no reader reads them) are not in the manifest: not damage"
            )
        out += [f"note: {note}" for note in self.notes]
        return out


def read_manifest(release: Release) -> dict[str, Any]:
    """A release's manifest, with an error that says how to make one."""
    path = manifest_path(release)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReleaseNotFoundError(
            f"release {release.version} has no manifest at {path}: build it with `make run` "
            "(the manifest is written last, after the database and the reports)"
        ) from None
    except ValueError as exc:
        raise ReleaseNotFoundError(f"the manifest {path} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ReleaseNotFoundError(f"the manifest {path} has no file list")
    return manifest


ICECHUNK_OBJECT_DIRS = frozenset({"chunks", "manifests", "snapshots", "transactions"})
"""Folders of an icechunk repository whose files are named by content or at random and never
rewritten: one not in the manifest belongs to a commit the listed refs do not reach."""
ICECHUNK_DRAFT_REF = "refs/branch.main/ref.json"
"""The draft branch's ref in an icechunk chip store (``DRAFT_BRANCH``): every build moves it;
readers follow ``published`` or a tag."""


def _icechunk_split(name: str) -> tuple[str, str] | None:
    """(store, path inside it) of a release file inside an icechunk chip store, else None."""
    from citycube.cube.chips_zarr import ICECHUNK_SUFFIX

    parts = name.split("/")
    for i, part in enumerate(parts[:-1]):
        if part.endswith(ICECHUNK_SUFFIX):
            return "/".join(parts[: i + 1]), "/".join(parts[i + 1 :])
    return None


def _set_draft_files_apart(result: Verification, listed: Mapping[str, Any]) -> None:
    """Move the files of chip stores' draft commits from ``unexpected`` and ``changed`` to
    ``draft``: a build interrupted, blocked or still running before its publication commits
    chips on the draft branch, which readers never open. Objects no listed snapshot refers to,
    the draft branch's ref, and whole stores no manifest entry names and that have no published
    branch. A changed or missing listed object, the published branch's ref, or a tag is still
    damage."""
    stores_listed = {split[0] for name in listed if (split := _icechunk_split(name))}
    draft: list[str] = []
    unexpected: dict[str, list[str]] = {}
    for name in result.unexpected:
        split = _icechunk_split(name)
        if split is None:
            continue
        unexpected.setdefault(split[0], []).append(split[1])
    for store, inside in unexpected.items():
        if store in stores_listed:
            draft += [
                f"{store}/{path}"
                for path in inside
                if path.split("/", 1)[0] in ICECHUNK_OBJECT_DIRS or path == ICECHUNK_DRAFT_REF
            ]
        elif not any(path.startswith(("refs/branch.published/", "refs/tag.")) for path in inside):
            draft += [f"{store}/{path}" for path in inside]  # a store never published
    moved = set(draft)
    for name in result.changed:
        split = _icechunk_split(name)
        if split is not None and split[1] == ICECHUNK_DRAFT_REF:
            moved.add(name)
    result.draft = sorted(moved)
    result.unexpected = [n for n in result.unexpected if n not in moved]
    result.changed = [n for n in result.changed if n not in moved]


def verify_release(release: Release, *, hashes: bool = True) -> Verification:
    """Recompute every file's hash and compare it, and the file list, with the manifest.

    ``hashes=False`` compares only the file list and sizes: a check in milliseconds that
    catches missing, extra, truncated or grown files (not a same-size change), for listings.
    """
    manifest = read_manifest(release)
    listed: dict[str, Any] = manifest["files"]
    result = Verification()
    on_disk = {p.relative_to(release.root).as_posix(): p for p in release_files(release)}
    recorded = manifest.get("database")
    older = not isinstance(manifest.get("format"), int) or manifest["format"] < 4
    # a manifest written before the database was listed: not covered, and said so
    if older and DATABASE_FILE not in listed and on_disk.pop(DATABASE_FILE, None) is not None:
        result.notes.append(
            f"this manifest (format {manifest.get('format', '?')}) does not cover "
            f"{DATABASE_FILE}: a rebuild writes one that does"
        )

    def changed(name: str) -> bool:
        path, entry = on_disk[name], listed[name]
        return path.stat().st_size != entry.get("bytes") or (
            hashes and file_sha256(path) != entry.get("sha256")
        )

    present = [name for name in listed if name in on_disk]
    result.missing = [name for name in listed if name not in on_disk]
    result.checked = len(present)
    result.changed = [n for n, c in zip(present, _in_threads(changed, present), strict=True) if c]
    result.unexpected = sorted(set(on_disk) - set(listed))
    _set_draft_files_apart(result, listed)
    if isinstance(recorded, Mapping):
        result.database = database_problems(release, recorded)
        if DATABASE_FILE in result.changed and not result.database:
            # Same views, macros and tables, new bytes: rebuilt by `citycube views` (which
            # cannot update a final release's pinned manifest); readers get what was listed.
            result.changed.remove(DATABASE_FILE)
            result.notes.append(
                f"{DATABASE_FILE} has other bytes than the manifest lists, but every view, "
                "macro and table a reader gets from it matches the manifest (the database was "
                "rebuilt, e.g. by `citycube views`)"
            )
    return result
