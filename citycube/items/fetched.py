"""What a source asset fetched, recorded so the processing step opens it without fetching again.

A value goes one way from the fetched item to the cube's row: the source asset fetches a
product's item for a city's source period and records the outcome here (the item's files and
provenance, or the reason the period is not served); the processing step that reads the item
opens the record instead of asking the adapter again, so a remote source is searched and
signed once per build, not once per reader.

A record is used only while it still describes the item: it names the adapter (source id and
version) and the source year it resolved to, and the size and modification time of each local
file; when any of these differ (a changed source set, a re-made or damaged file), it is ignored
and the item is fetched again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from citycube.catalogue.modalities import Temporal
from citycube.catalogue.temporal import period_label, resolve
from citycube.errors import SourceUnavailableError, in_context
from citycube.io.atomic import write_json_atomic
from citycube.io.digest import file_state
from citycube.items.protocol import SourceInfo, SourceItem, SourceProduct, is_remote

log = logging.getLogger(__name__)

RECORDS_FOLDER = ".fetched"
"""Folder under the sources directory that holds the records."""

RECORD_FORMAT = 1


def fetch_and_record(
    adapter: SourceProduct, temporal: Temporal, city: str, period: int | None, sources_dir: Path
) -> FetchOutcome:
    """Fetch a product's item for a city's source period and record the outcome.

    This is the source asset's fetch: the adapter checks and reuses what it installed before,
    and the record it leaves is what readers downstream open.
    """
    source_year, reason = _resolved_year(adapter, temporal, city, period)
    if reason is not None:
        return FetchOutcome(None, None, reason)
    year = "static" if source_year is None else f"source year {source_year}"
    info = adapter.info
    with in_context(f"source {info.product_id} ({info.source_id}) for {city}, {year}"):
        outcome = _fetch(adapter, city, source_year, sources_dir)
    record_outcome(sources_dir, adapter.info, city, period, source_year, outcome)
    return outcome


def open_fetched(
    adapter: SourceProduct, temporal: Temporal, city: str, period: int | None, sources_dir: Path
) -> FetchOutcome:
    """The item the source asset fetched for a city's source period, without fetching again.

    Without a usable record (the core used without its source assets, or the item changed
    since), the adapter is asked, and nothing is recorded: records come from source assets.
    """
    source_year, reason = _resolved_year(adapter, temporal, city, period)
    if reason is not None:
        return FetchOutcome(None, None, reason)
    recorded = recorded_outcome(sources_dir, adapter.info, city, period, source_year)
    if recorded is not None:
        return recorded
    return _fetch(adapter, city, source_year, sources_dir)


def _resolved_year(
    adapter: SourceProduct, temporal: Temporal, city: str, period: int | None
) -> tuple[int | None, str | None]:
    """The source year a period reads, or why it has none (a lookup, no fetch)."""
    if period is None:
        return None, None
    resolution = resolve(temporal, period, adapter.source_years(city))
    return resolution.source_year, resolution.missing_reason


def _fetch(
    adapter: SourceProduct, city: str, source_year: int | None, sources_dir: Path
) -> FetchOutcome:
    try:
        return FetchOutcome(source_year, adapter.fetch(city, source_year, sources_dir), None)
    except SourceUnavailableError as exc:
        return FetchOutcome(None, None, exc.reason)


@dataclass(frozen=True)
class FetchOutcome:
    """One product's item for a city's source period, or why the period is not served."""

    source_year: int | None
    item: SourceItem | None
    missing_reason: str | None


def record_path(sources_dir: Path, info: SourceInfo, city: str, period: int | None) -> Path:
    """Where the outcome of fetching ``info``'s product for a city's source period is kept.

    Product ids and city keys are catalogue keys (validated on load); the adapter is named by a
    digest, since source ids carry characters that do not belong in file names.
    """
    adapter = hashlib.sha256(f"{info.source_id}|{info.version}".encode()).hexdigest()[:12]
    name = f"{period_label(period)}.{adapter}.json"
    return sources_dir / RECORDS_FOLDER / info.product_id / city / name


def record_outcome(
    sources_dir: Path,
    info: SourceInfo,
    city: str,
    period: int | None,
    source_year: int | None,
    outcome: FetchOutcome,
) -> Path:
    """Record what fetching a product's item for a city's source period gave.

    ``source_year`` is the year the period resolved to (the outcome's is None when the adapter
    found the year unavailable).
    """
    item = outcome.item
    record: dict[str, Any] = {
        "format": RECORD_FORMAT,
        "source_id": info.source_id,
        "version": info.version,
        "source_year": source_year,
        "missing_reason": outcome.missing_reason,
        "item": None if item is None else _item_record(item, sources_dir),
    }
    return write_json_atomic(record, record_path(sources_dir, info, city, period))


def recorded_outcome(
    sources_dir: Path,
    info: SourceInfo,
    city: str,
    period: int | None,
    source_year: int | None,
) -> FetchOutcome | None:
    """The recorded outcome when it still describes the item; None when it must be fetched.

    ``source_year`` is the year the period resolves to now: a record made for another year (the
    product's published years changed) is not used.
    """
    path = record_path(sources_dir, info, city, period)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("fetch record %s is unreadable (%s); the item is fetched again", path, exc)
        return None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        return None
    if (record.get("source_id"), record.get("version")) != (info.source_id, info.version):
        return None
    if record.get("source_year") != source_year:
        return None
    item_record = record.get("item")
    if item_record is None:
        reason = record.get("missing_reason")
        return FetchOutcome(None, None, reason) if isinstance(reason, str) else None
    item = _item_from_record(item_record, sources_dir, info, city, source_year)
    if item is None:
        log.info(
            "source item %s for %s, %s changed since it was fetched; it is fetched again",
            info.product_id,
            city,
            period_label(period),
        )
        return None
    return FetchOutcome(source_year, item, None)


def _item_record(item: SourceItem, sources_dir: Path) -> dict[str, Any]:
    """The item as plain values; local files under the sources directory relative to it, so
    the record stays right when the data root is moved."""
    files: dict[str, str] = {}
    states: dict[str, list[int]] = {}
    for role, href in item.files.items():
        if is_remote(href):
            files[role] = str(href)
            continue
        path = Path(href)
        states[role] = file_state(path)
        files[role] = str(
            path.relative_to(sources_dir) if path.is_relative_to(sources_dir) else path
        )
    return {
        "files": files,
        "states": states,
        "synthetic": item.synthetic,
        "extra": dict(item.extra),
        "fingerprint": item.fingerprint,
        "missing_roles": dict(item.missing_roles),
    }


def _item_from_record(
    record: dict[str, Any],
    sources_dir: Path,
    info: SourceInfo,
    city: str,
    source_year: int | None,
) -> SourceItem | None:
    """The recorded item, or None when a local file is gone or differs from when it was fetched."""
    try:
        files: dict[str, str | Path] = dict(record["files"])
        for role, state in dict(record["states"]).items():
            path = sources_dir / files[role]  # an absolute recorded path stays as it is
            if file_state(path) != state:
                return None
            files[role] = path
        return SourceItem(
            product=info.product_id,
            city=city,
            source_year=source_year,
            files=files,
            source_id=info.source_id,
            version=info.version,
            synthetic=bool(record["synthetic"]),
            extra=dict(record["extra"]),
            fingerprint=str(record["fingerprint"]),
            missing_roles=dict(record["missing_roles"]),
        )
    except (OSError, KeyError, TypeError, ValueError):
        return None
