"""Turn one modality's source items into tile observations (and chips for image modalities).

The work splits in two stages, keyed by what changes:
- ``derive``: per-tile results for one *source period* of a city (a year, a 5-year epoch, or
  the static item), computed once by one writer into ``derived/`` together with the chips.
  A result is reused only when its signature matches: the engine version, the modality's
  spec digest (rules, thresholds, legends, product specs) and the fingerprints of the items it
  read. A changed rule or a re-made source therefore always recomputes.
- ``write_observations``: the rows for one *calendar* year, read from the derived results of
  the period that serves it and labelled with how that year is served (annual, epoch, static,
  snapshot, city record); never zero-filled when it is not served.

Each item becomes tile values by the aggregation rule that :mod:`citycube.processing.rules`
picks for it; this module resolves the items, converts money and writes the results.

Provenance (``source_id``, ``source_version``, ``synthetic``) comes from the adapter that
served each product, never from the name of a backend.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from citycube.catalogue.cities import get_city
from citycube.catalogue.modalities import (
    Catalogue,
    Conversion,
    FieldSpec,
    Kind,
    ModalitySpec,
    Temporal,
)
from citycube.catalogue.temporal import BASIS, period_label, period_of
from citycube.catalogue.versions import ENGINE_VERSION, modality_digest
from citycube.cube.release import (
    CHIP_INDEX_SCHEMA,
    OBSERVATION_SCHEMA,
    Release,
    adopt_draft_file,
    file_metadata,
    intact_with_digest,
    write_parquet_atomic,
    write_parquet_with_digest,
)
from citycube.errors import DerivedResultsMissingError, in_context
from citycube.items.fetched import open_fetched
from citycube.items.protocol import SourceInfo, SourceItem, SourceSet
from citycube.processing.memory import bound_process_memory
from citycube.processing.money import check_currency, ppp_2017_factor
from citycube.processing.rules import RuleInput, rule_for, rule_kind
from citycube.processing.rules.shared import (
    RESULT_COLUMNS,
    BlockObserver,
    ProgressFn,
    all_tiles,
    tile_windows,
)

log = logging.getLogger(__name__)

PROVENANCE_COLUMNS = ["product", "source_year", "source_id", "source_version", "synthetic"]


def _apply_conversions(
    frame: pd.DataFrame,
    fields: Sequence[FieldSpec],
    city: str,
    source_year: int | None,
    aux: dict[str, SourceItem],
    currency: str | None = None,
) -> pd.DataFrame:
    """Convert money to 2017 PPP international dollars (keeping the local field as is).

    A currency declared by the item must be the country's own: the PPP factor converts that
    currency only.
    """
    for f in fields:
        if f.conversion != Conversion.PPP_2017:
            continue
        factor = None
        iso3 = get_city(city).iso3
        if currency is not None:
            check_currency(currency, iso3, city)
        if source_year is not None and "worldbank_indicators" in aux:
            series = aux["worldbank_indicators"]
            with in_context(
                f"auxiliary source {series.product} ({series.source_id} {series.version})"
            ):
                factor = ppp_2017_factor(series, iso3, source_year)
        rows = frame["field"] == f.name
        if factor is None:
            frame.loc[rows & frame["reason"].isna(), "reason"] = "conversion_factor_missing"
            frame.loc[rows, "value"] = math.nan
        else:
            frame.loc[rows, "value"] = frame.loc[rows, "value"] * factor
    return frame


def _compute(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    item: SourceItem,
    fields: Sequence[FieldSpec],
    aux: dict[str, SourceItem],
    release: Release,
    progress: ProgressFn | None,
    on_written: Sequence[BlockObserver] = (),
) -> pd.DataFrame:
    """One item's tile results by the rule its modality (or its form) calls for, money converted."""
    rule = rule_for(rule_kind(modality, item))
    frame = rule(
        RuleInput(modality, catalogue, city, item, tuple(fields), release, progress, on_written)
    )
    currency = item.extra.get("currency")
    return _apply_conversions(frame, fields, city, item.source_year, aux, currency)


@dataclass(frozen=True)
class FieldGroup:
    """One product's fields in a source period: the item read, or why there is none."""

    product: str
    fields: tuple[FieldSpec, ...]
    info: SourceInfo
    """Provenance of the adapter that serves the product."""
    source_year: int | None
    """Source year read (None for static products or when unavailable)."""
    item: SourceItem | None
    """The fetched item; None when the period is not served."""
    missing_reason: str | None
    """Stable reason code when the period is not served."""
    fallback_from: tuple[tuple[str, str], ...] = ()
    """(product, reason) of the products tried first that could not serve the period."""

    def signature(self) -> str:
        """What the derived results of this group depend on, besides the rules."""
        if self.item is None:
            return f"{self.product}:missing:{self.missing_reason}:{self.info.source_id}"
        return f"{self.product}:{self.item.source_id}:{self.item.version}:{self.item.fingerprint}"


def _field_groups(
    modality: ModalitySpec, city: str, period: int | None, sources: SourceSet, release: Release
) -> list[FieldGroup]:
    """Resolve and fetch each product's item for a source period, independently.

    A product that cannot serve the period (it does not cover the city, does not publish the
    year, or its adapter says it is unavailable) hands the group to its declared fallbacks in
    order; the first that serves is read for every field of the group. When none serves, the
    group stays with the first choice and its reason. Server failures are not a reason to fall
    back: they fail the step, so a rerun reads the same product.
    """
    groups: list[FieldGroup] = []
    for product, fields in modality.field_groups(city):
        group = _serve(modality, product, tuple(fields), city, period, sources, release)
        tried: list[tuple[str, str]] = []
        for fallback in modality.fallbacks(product) if group.item is None else ():
            tried.append((group.product, group.missing_reason or "unavailable"))
            candidate = _serve(modality, fallback, tuple(fields), city, period, sources, release)
            if candidate.item is not None:
                group = replace(candidate, fallback_from=tuple(tried))
                break
        groups.append(group)
    return groups


def _serve(
    modality: ModalitySpec,
    product: str,
    fields: tuple[FieldSpec, ...],
    city: str,
    period: int | None,
    sources: SourceSet,
    release: Release,
) -> FieldGroup:
    """One product's item for a source period, or why it has none."""
    adapter = sources.product(product)
    outcome = open_fetched(adapter, modality.temporal, city, period, release.sources_dir)
    return FieldGroup(
        product, fields, adapter.info, outcome.source_year, outcome.item, outcome.missing_reason
    )


def _fetch_aux(
    modality: ModalitySpec, city: str, sources: SourceSet, release: Release
) -> dict[str, SourceItem]:
    """Auxiliary items (e.g. CPI and PPP series); conversions that lack one mark their fields."""
    aux: dict[str, SourceItem] = {}
    for product in modality.auxiliary_products:
        if product not in sources:
            continue
        outcome = open_fetched(
            sources.product(product), Temporal.STATIC, city, None, release.sources_dir
        )
        if outcome.item is not None:
            aux[product] = outcome.item
    return aux


def _missing_results(fields: Sequence[FieldSpec], city: str, reason: str) -> pd.DataFrame:
    rows = [
        {
            "tile_id": t.tile_id,
            "scale": t.scale,
            "field": f.name,
            "value": math.nan,
            "valid_fraction": math.nan,
            "reason": reason,
        }
        for t in all_tiles(city)
        for f in fields
    ]
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


@dataclass(frozen=True)
class DerivedSummary:
    """What one (modality, city, source period) derivation produced."""

    modality: str
    city: str
    period: int | None
    """Source period: a year, an epoch's first year, or None for static."""
    rows: int
    tiles: int
    available_tiles: int
    reused: bool
    """True when matching results of an earlier run were kept instead of recomputed."""
    chips: bool
    """True when chips were written for this period."""
    reason_counts: dict[str, int]
    sources: dict[str, dict[str, object]] = field(default_factory=dict)
    """Per product: source id, version, source year, synthetic flag (or the missing reason)."""
    path: Path | None = None
    records: dict[str, object] = field(default_factory=dict)
    """Per records product: rows read, unusable, unmatched keys and records used."""

    @property
    def label(self) -> str:
        """'static' or the period's year."""
        return period_label(self.period)

    def as_metadata(self) -> dict[str, object]:
        """Plain values for Dagster materialisation metadata."""
        return {
            "period": self.label,
            "rows": self.rows,
            "tiles": self.tiles,
            "available_tiles": self.available_tiles,
            "reused": self.reused,
            "chips": self.chips,
            "reasons": json.dumps(self.reason_counts),
            "sources": json.dumps(self.sources, default=str),
            "path": str(self.path),
            **({"records": json.dumps(self.records)} if self.records else {}),
        }


def _signature(
    modality: ModalitySpec,
    catalogue: Catalogue,
    groups: Sequence[FieldGroup],
    aux: dict[str, SourceItem],
) -> str:
    parts = [ENGINE_VERSION, modality_digest(modality, catalogue)]
    parts += [g.signature() for g in groups]
    parts += [f"aux:{p}:{i.fingerprint}" for p, i in sorted(aux.items())]
    return "|".join(parts)


def _tile_counts(results: pa.Table) -> tuple[int, int]:
    """(tiles, tiles with at least one available field) of a results table."""
    tile_ids = results["tile_id"]
    available = pc.filter(tile_ids, pc.is_null(results["reason"]))
    return pc.count_distinct(tile_ids).as_py(), pc.count_distinct(available).as_py()


def _reason_counts(results: pa.Table) -> dict[str, int]:
    """Tiles per reason (a tile counts once per reason, however many fields it has), the
    commonest reason first."""
    missing = results.select(["tile_id", "reason"]).filter(pc.is_valid(results["reason"]))
    per_reason = (
        missing.group_by(["reason", "tile_id"], use_threads=False)
        .aggregate([])
        .group_by("reason", use_threads=False)
        .aggregate([("tile_id", "count")])
    )
    pairs = zip(
        per_reason["reason"].to_pylist(), per_reason["tile_id_count"].to_pylist(), strict=True
    )
    return {str(k): int(v) for k, v in sorted(pairs, key=lambda kv: (-kv[1], kv[0]))}


def _group_sources(groups: Sequence[FieldGroup]) -> dict[str, dict[str, object]]:
    return {
        g.product: {
            "source_id": g.info.source_id,
            "version": g.item.version if g.item else g.info.version,
            "source_year": g.source_year,
            "synthetic": g.item.synthetic if g.item else g.info.synthetic,
            **({"missing": g.missing_reason} if g.item is None else {}),
            **({"fallback_from": dict(g.fallback_from)} if g.fallback_from else {}),
        }
        for g in groups
    }


def derive(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    period: int | None,
    sources: SourceSet,
    release: Release,
    progress: ProgressFn | None = None,
    on_written: Sequence[BlockObserver] = (),
) -> DerivedSummary:
    """Compute (or keep, when nothing it depends on changed) one source period's results.

    Field groups served by different products (AQ's NO2 and PM2.5, or each weather variable's
    file) are resolved, fetched and aggregated independently: one product's missing year never
    blanks or fills another. ``on_written`` is called with every chip block written (see
    :attr:`~citycube.cube.chips_zarr.ChipStoreWriter.on_written`); results kept from an earlier run
    write none.
    """
    get_city(city)
    if (period is None) != (modality.temporal == Temporal.STATIC):
        raise ValueError(f"{modality.code} is {modality.temporal.value}; period {period} is wrong")
    bound_process_memory()
    label = period_label(period)
    with in_context(f"{modality.code} {city} {label}"):
        groups = _field_groups(modality, city, period, sources, release)
        aux = _fetch_aux(modality, city, sources, release)
    signature = _signature(modality, catalogue, groups, aux)
    path = release.derived_file(modality.code, city, label)
    adopt_draft_file(release, path)  # results an earlier layout kept in the release folder
    chips = modality.is_image and any(g.item is not None for g in groups)
    store = release.chip_store(modality.code, city, label)
    if path.exists() and (not chips or store.exists()):
        kept = _kept_results(path, signature)
        if kept is not None:
            return _derived_summary(modality, city, period, kept, groups, path, True, chips)
    frames = []
    ingested: dict[str, object] = {}
    for group in groups:
        if group.item is None:
            results = _missing_results(group.fields, city, group.missing_reason or "unavailable")
        else:
            with in_context(_source_context(modality, city, label, group.item)):
                results = _compute(
                    modality,
                    catalogue,
                    city,
                    group.item,
                    group.fields,
                    aux,
                    release,
                    progress,
                    on_written,
                )
            if "records" in results.attrs:
                ingested[group.product] = results.attrs["records"]
        frames.append(
            results.assign(
                product=group.product,
                source_year=group.source_year,
                source_id=group.item.source_id if group.item else group.info.source_id,
                source_version=group.item.version if group.item else group.info.version,
                synthetic=group.item.synthetic if group.item else group.info.synthetic,
                currency=group.item.extra.get("currency") if group.item else None,
            )
        )
    derived = pd.concat(frames, ignore_index=True)
    derived["source_year"] = derived["source_year"].astype("Int16")
    columns = [
        c for c in RESULT_COLUMNS if c != "classes" or modality.kind == Kind.CATEGORICAL_IMAGE
    ]
    columns += PROVENANCE_COLUMNS
    if derived["currency"].notna().any():  # money in its own currency: keep the code per row
        derived["currency"] = derived["currency"].astype("string")
        columns = [*columns, "currency"]
    table = pa.Table.from_pandas(derived[columns], preserve_index=False)
    extra = {"citycube:signature": signature, "citycube:chips": str(chips).lower()}
    if ingested:
        extra["citycube:records"] = json.dumps(ingested, sort_keys=True)
    with in_context(f"{modality.code} {city} {label}"):
        write_parquet_with_digest(table, path, file_metadata(release, **extra))
    return _derived_summary(
        modality, city, period, table, groups, path, False, chips, records=ingested
    )


def _source_context(modality: ModalitySpec, city: str, label: str, item: SourceItem) -> str:
    """'CO2 Amsterdam 2020, source odiac (sample:odiac v1, source year 2020)'."""
    year = "static" if item.source_year is None else f"source year {item.source_year}"
    return (
        f"{modality.code} {city} {label}, source {item.product} "
        f"({item.source_id} {item.version}, {year})"
    )


def _kept_results(path: Path, signature: str) -> pa.Table | None:
    """Earlier results computed under the same signature, if they read back intact.

    A file whose bytes are not the ones recorded when it was written (or that has no record,
    fails its page checksums or does not read at all) is computed again rather than copied
    into fresh observations.
    """
    if not intact_with_digest(path):
        log.warning(
            "derived results %s differ from their recorded digest; computing them again", path
        )
        return None
    try:
        meta = pq.read_schema(path).metadata or {}
        if meta.get(b"citycube:signature", b"").decode() != signature:
            return None
        return pq.read_table(path, page_checksum_verification=True)
    except (OSError, ValueError, pa.ArrowException) as exc:
        log.warning("derived results %s are damaged (%s); computing them again", path, exc)
        return None


def _derived_summary(
    modality: ModalitySpec,
    city: str,
    period: int | None,
    results: pa.Table,
    groups: Sequence[FieldGroup],
    path: Path,
    reused: bool,
    chips: bool,
    records: dict[str, object] | None = None,
) -> DerivedSummary:
    tiles, available_tiles = _tile_counts(results)
    return DerivedSummary(
        modality=modality.code,
        city=city,
        period=period,
        rows=results.num_rows,
        tiles=tiles,
        available_tiles=available_tiles,
        reused=reused,
        chips=chips,
        reason_counts=_reason_counts(results),
        sources=_group_sources(groups),
        path=path,
        records=records or {},
    )


@dataclass(frozen=True)
class PartitionSummary:
    """What one (modality, city, year) observations partition wrote."""

    modality: str
    city: str
    year: int
    rows: int
    tiles: int
    available_tiles: int
    basis: str
    source_year: int | None
    reason_counts: dict[str, int]
    path: Path

    def as_metadata(self) -> dict:
        """Plain values for Dagster materialisation metadata."""
        return {
            "rows": self.rows,
            "tiles": self.tiles,
            "available_tiles": self.available_tiles,
            "availability": round(self.available_tiles / self.tiles, 4) if self.tiles else 0.0,
            "temporal_basis": self.basis,
            "source_year": self.source_year if self.source_year is not None else "static/none",
            "reasons": json.dumps(self.reason_counts),
            "path": str(self.path),
        }


def read_derived(
    modality: ModalitySpec, city: str, period: int | None, release: Release
) -> tuple[pa.Table, bool]:
    """A source period's derived results and whether it has chips."""
    label = period_label(period)
    path = release.derived_file(modality.code, city, label)
    if not path.exists():
        raise DerivedResultsMissingError(
            f"no derived {modality.code} results for {city} {label}: materialise "
            f"derived/{modality.code.lower()} for that partition first"
        )
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise DerivedResultsMissingError(
            f"derived {modality.code} results for {city} {label} at {path} are damaged ({exc}): "
            f"materialise derived/{modality.code.lower()} for that partition again"
        ) from None
    chips = (table.schema.metadata or {}).get(b"citycube:chips", b"false") == b"true"
    return table, chips


def _row_units(modality: ModalitySpec, derived: pa.Table) -> pa.Array:
    """Each row's unit: the field's, or for money kept in its own currency the item's ISO 4217
    code and price year (derived results written before currencies were kept have none)."""
    unit_of = {f.name: f.unit for f in modality.fields}
    fields = derived["field"].to_pylist()
    in_currency = {f.name for f in modality.fields if f.currency_unit}
    if not in_currency or "currency" not in derived.column_names:
        return pa.array([unit_of.get(f) for f in fields], pa.string())
    currencies = derived["currency"].to_pylist()
    years = derived["source_year"].to_pylist()
    return pa.array(
        [
            f"{currency} (nominal, {'?' if year is None else year})"
            if f in in_currency and currency is not None
            else unit_of.get(f)
            for f, currency, year in zip(fields, currencies, years, strict=True)
        ],
        pa.string(),
    )


def _constant(value: object, n: int, type_: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, type_), n)


def observation_table(modality: ModalitySpec, city: str, year: int, derived: pa.Table) -> pa.Table:
    """Rows for one calendar year: values only where available, NULL plus a reason elsewhere.

    Built column by column in Arrow from the derived table: a round trip through pandas cost
    more than writing the file.
    """
    n = derived.num_rows
    available = pc.is_null(derived["reason"])
    value = derived["value"].cast(pa.float64())
    fraction = derived["valid_fraction"].cast(pa.float64())
    columns = {
        "tile_id": derived["tile_id"].cast(pa.string()),
        "city": _constant(city, n, pa.string()),
        "scale": derived["scale"].cast(pa.string()),
        "year": _constant(year, n, pa.int16()),
        "modality": _constant(modality.code, n, pa.string()),
        "field": derived["field"].cast(pa.string()),
        # NULL unless available and finite; NaN never reaches a value
        "value": pc.if_else(pc.and_(available, pc.is_finite(value)), value, None),
        "unit": _row_units(modality, derived),
        "valid_fraction": pc.if_else(pc.is_finite(fraction), fraction, None),
        "available": available,
        "reason": derived["reason"].cast(pa.string()),
        "temporal_basis": _constant(BASIS[modality.temporal], n, pa.string()),
        "source_year": derived["source_year"].cast(pa.int16()),
        "source_id": derived["source_id"].cast(pa.string()),
        "source_version": derived["source_version"].cast(pa.string()),
        "synthetic": pc.fill_null(derived["synthetic"].cast(pa.bool_()), False),
    }
    return pa.Table.from_arrays(list(columns.values()), schema=OBSERVATION_SCHEMA)


def chip_index_table(
    modality: ModalitySpec,
    city: str,
    year: int,
    period: int | None,
    derived: pa.Table,
    release: Release,
) -> pa.Table:
    """Where each tile's chip lives: store path (relative to the release) and pixel window."""
    assert modality.chip is not None
    store = str(
        release.chip_store(modality.code, city, period_label(period)).relative_to(release.root)
    )
    tiles = all_tiles(city)
    first_row: dict[str, int] = {}
    for row, tile_id in enumerate(derived["tile_id"].to_pylist()):
        first_row.setdefault(tile_id, row)
    # each tile's first derived row (its figures are per tile), NULL for a tile without one
    per_tile = derived.take(pa.array([first_row.get(t.tile_id) for t in tiles], pa.int64()))
    windows = tile_windows(city, modality.chip.resolution_m)
    n = len(tiles)
    classes = (
        per_tile["classes"].cast(pa.float64())
        if "classes" in per_tile.column_names
        else pa.nulls(n, pa.float64())
    )
    classes = pc.if_else(pc.is_finite(classes), classes, None)
    columns = {
        "tile_id": pa.array([t.tile_id for t in tiles], pa.string()),
        "city": _constant(city, n, pa.string()),
        "scale": pa.array([t.scale for t in tiles], pa.string()),
        "year": _constant(year, n, pa.int16()),
        "modality": _constant(modality.code, n, pa.string()),
        "store": _constant(store, n, pa.string()),
        "row_off": pa.array(windows[:, 0]),
        "col_off": pa.array(windows[:, 1]),
        "height": pa.array(windows[:, 2]),
        "width": pa.array(windows[:, 3]),
        "resolution_m": _constant(float(modality.chip.resolution_m), n, pa.float64()),
        "valid_fraction": pc.fill_null(per_tile["valid_fraction"].cast(pa.float64()), math.nan),
        "available": pc.is_null(per_tile["reason"]),
        "temporal_basis": _constant(BASIS[modality.temporal], n, pa.string()),
        "source_year": per_tile["source_year"].cast(pa.int16()),
        "classes": classes.cast(pa.int16()),
    }
    return pa.Table.from_arrays(list(columns.values()), schema=CHIP_INDEX_SCHEMA)


def write_observations(
    modality: ModalitySpec, city: str, year: int, release: Release
) -> PartitionSummary:
    """Write one (modality, city, year) partition from the derived results serving that year."""
    period = period_of(modality.temporal, year)
    derived, chips = read_derived(modality, city, period, release)
    table = observation_table(modality, city, year, derived)
    synthetic = bool(pc.all(table["synthetic"]).as_py()) if table.num_rows else True
    meta = file_metadata(release, **{"citycube:synthetic": str(synthetic).lower()})
    index_file = release.chip_index_file(city, year, modality.code)
    with in_context(f"{modality.code} {city} {year}"):
        if modality.is_image and chips:
            index = chip_index_table(modality, city, year, period, derived, release)
            write_parquet_atomic(index, index_file, meta)
        else:
            index_file.unlink(missing_ok=True)
        observations = release.observations_file(city, year, modality.code)
        path = write_parquet_atomic(table, observations, meta)
    tiles, available_tiles = _tile_counts(derived)
    first_year = table["source_year"][0].as_py() if table.num_rows else None
    return PartitionSummary(
        modality=modality.code,
        city=city,
        year=year,
        rows=table.num_rows,
        tiles=tiles,
        available_tiles=available_tiles,
        basis=BASIS[modality.temporal],
        source_year=first_year,
        reason_counts=_reason_counts(derived),
        path=path,
    )


def process_partition(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    year: int,
    sources: SourceSet,
    release: Release,
    progress: ProgressFn | None = None,
) -> PartitionSummary:
    """Derive the source period serving ``year`` (or keep it) and write that year's partition."""
    period = period_of(modality.temporal, year)
    derive(modality, catalogue, city, period, sources, release, progress)
    return write_observations(modality, city, year, release)
