"""What changed between two releases, partition by partition and field by field.

A new release is trusted when its differences from the last one are the ones its changes
explain (a rule, a source version, new years). ``diff_releases`` compares the published
observations of two releases of the same data root with DuckDB over their Parquet: partitions
added and removed, and per (city, year, modality, field) the tile values that changed, the
largest absolute change, and the tiles whose value appeared or disappeared with the reason
codes involved; and the chips each image partition points at, pixel by pixel. It compares
content as it is on disk now, never the manifests' hashes: a chip store damaged or rewritten
after its manifest was written is compared by what it holds. Release versions are validated
before they reach a path, and file lists reach SQL only as bound parameters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from citycube.cube.release import Release
from citycube.cube.releases import PartitionKey, open_release, published_partitions
from citycube.errors import ChipsNotFoundError, CityCubeError


@dataclass(frozen=True)
class FieldChange:
    """How one field of one partition differs between release A and release B."""

    city: str
    """City key."""
    year: int
    """Calendar year."""
    modality: str
    """Modality code."""
    field: str
    """Field name."""
    tiles: int
    """Tiles of this field in either release."""
    changed_values: int
    """Tiles with a value in both releases that differ."""
    max_abs_change: float | None
    """Largest |B − A| over those tiles (None when no value changed)."""
    null_to_value: int
    """Tiles unavailable in A (NULL) with a value in B."""
    value_to_null: int
    """Tiles with a value in A that are unavailable (NULL) in B."""
    null_to_value_reasons: dict[str, int] = dataclass_field(default_factory=dict)
    """A's reason codes of the tiles that gained a value."""
    value_to_null_reasons: dict[str, int] = dataclass_field(default_factory=dict)
    """B's reason codes of the tiles that lost their value."""
    reason_changed: int = 0
    """Tiles unavailable in both releases whose reason code changed."""
    provenance_changed: int = 0
    """Tiles whose source id, source version or source year changed."""
    tiles_added: int = 0
    """Tiles of the field only in B."""
    tiles_removed: int = 0
    """Tiles of the field only in A."""
    valid_fraction_changed: int = 0
    """Tiles in both releases whose valid fraction (valid pixels or support) changed."""
    max_valid_fraction_change: float | None = None
    """Largest |B − A| of the valid fraction over those tiles (None when none changed)."""

    @property
    def partition(self) -> PartitionKey:
        """(city, year, modality) of the field."""
        return (self.city, self.year, self.modality)


@dataclass(frozen=True)
class ChipChange:
    """How the chips one partition points at differ between release A and release B."""

    city: str
    """City key."""
    year: int
    """Calendar year."""
    modality: str
    """Modality code (an image modality)."""
    store_a: str
    """A's chip store (relative to its release)."""
    store_b: str
    """B's chip store (relative to its release)."""
    pixels: int
    """Pixels of the city's chip grid."""
    changed_pixels: int
    """Pixels whose stored value (any band) or validity differs."""
    validity_changed: int
    """Pixels valid in one release and not in the other."""
    max_abs_change: float | None
    """Largest |B − A| of a stored value over pixels valid in both (None when none differs)."""

    @property
    def partition(self) -> PartitionKey:
        """(city, year, modality) of the chips."""
        return (self.city, self.year, self.modality)


@dataclass(frozen=True)
class ReleaseDiff:
    """Everything ``citycube diff A B`` reports."""

    a: str
    """The release compared from."""
    b: str
    """The release compared to."""
    added: tuple[PartitionKey, ...]
    """Partitions published only in B."""
    removed: tuple[PartitionKey, ...]
    """Partitions published only in A."""
    changed: tuple[PartitionKey, ...]
    """Partitions in both with at least one changed field."""
    unchanged: int
    """Partitions in both that are identical in every compared column."""
    fields: tuple[FieldChange, ...]
    """Every changed field of the changed partitions."""
    chips: tuple[ChipChange, ...] = ()
    """Every partition whose chips changed (pixel values or validity)."""
    compared_partitions: int = 0
    """Partitions published by both whose observations were read and compared row by row."""
    compared_chip_stores: int = 0
    """Pairs of chip stores compared by what they hold (their bytes on disk, then pixel by
    pixel where those differ), never by what the manifests list."""

    @property
    def identical(self) -> bool:
        """True when the releases publish the same partitions with the same values."""
        return not (self.added or self.removed or self.changed)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, partitions as {city, year, modality} objects."""
        values = asdict(self)
        for key in ("added", "removed", "changed"):
            values[key] = [{"city": c, "year": y, "modality": m} for c, y, m in getattr(self, key)]
        return values


_FIELD_CHANGES_SQL = """
WITH a AS (SELECT * FROM read_parquet($a_files, union_by_name = true)),
     b AS (SELECT * FROM read_parquet($b_files, union_by_name = true)),
     j AS (
       SELECT coalesce(a.city, b.city) AS city, coalesce(a.year, b.year) AS year,
              coalesce(a.modality, b.modality) AS modality, coalesce(a.field, b.field) AS field,
              a.tile_id AS a_tile, b.tile_id AS b_tile, a.value AS a_value, b.value AS b_value,
              a.reason AS a_reason, b.reason AS b_reason,
              a.valid_fraction AS a_fraction, b.valid_fraction AS b_fraction,
              (a.source_id, a.source_version, a.source_year)
                IS DISTINCT FROM (b.source_id, b.source_version, b.source_year) AS provenance
       FROM a FULL OUTER JOIN b
         ON a.city = b.city AND a.year = b.year AND a.modality = b.modality
        AND a.field = b.field AND a.tile_id = b.tile_id
     )
SELECT city, year, modality, field,
       count(*) AS tiles,
       count(*) FILTER (both_values AND a_value <> b_value) AS changed_values,
       max(abs(b_value - a_value)) FILTER (both_values AND a_value <> b_value) AS max_abs_change,
       count(*) FILTER (both_tiles AND a_value IS NULL AND b_value IS NOT NULL) AS null_to_value,
       count(*) FILTER (both_tiles AND a_value IS NOT NULL AND b_value IS NULL) AS value_to_null,
       histogram(coalesce(a_reason, 'none'))
         FILTER (both_tiles AND a_value IS NULL AND b_value IS NOT NULL) AS gained_reasons,
       histogram(coalesce(b_reason, 'none'))
         FILTER (both_tiles AND a_value IS NOT NULL AND b_value IS NULL) AS lost_reasons,
       count(*) FILTER (both_tiles AND a_value IS NULL AND b_value IS NULL
                        AND a_reason IS DISTINCT FROM b_reason) AS reason_changed,
       count(*) FILTER (both_tiles AND provenance) AS provenance_changed,
       count(*) FILTER (a_tile IS NULL) AS tiles_added,
       count(*) FILTER (b_tile IS NULL) AS tiles_removed,
       count(*) FILTER (both_tiles AND a_fraction IS DISTINCT FROM b_fraction)
         AS fraction_changed,
       max(abs(b_fraction - a_fraction))
         FILTER (both_tiles AND a_fraction IS DISTINCT FROM b_fraction) AS max_fraction_change
FROM (SELECT *, a_tile IS NOT NULL AND b_tile IS NOT NULL AS both_tiles,
             a_value IS NOT NULL AND b_value IS NOT NULL AS both_values FROM j)
GROUP BY ALL
HAVING changed_values + null_to_value + value_to_null + reason_changed + provenance_changed
       + tiles_added + tiles_removed + fraction_changed > 0
ORDER BY city, year, modality, field
"""


def _partition_files(release: Release, partitions: list[PartitionKey]) -> list[str]:
    return [str(release.published_observations_file(c, y, m)) for c, y, m in partitions]


def field_changes(
    release_a: Release, release_b: Release, partitions: list[PartitionKey]
) -> list[FieldChange]:
    """The changed fields of ``partitions``, which both releases publish."""
    if not partitions:
        return []
    import duckdb

    with duckdb.connect() as con:
        rows = con.execute(
            _FIELD_CHANGES_SQL,
            {
                "a_files": _partition_files(release_a, partitions),
                "b_files": _partition_files(release_b, partitions),
            },
        ).fetchall()
    return [
        FieldChange(
            city=city,
            year=int(year),
            modality=modality,
            field=name,
            tiles=tiles,
            changed_values=changed,
            max_abs_change=None if largest is None else float(largest),
            null_to_value=gained,
            value_to_null=lost,
            null_to_value_reasons=dict(sorted((gained_reasons or {}).items())),
            value_to_null_reasons=dict(sorted((lost_reasons or {}).items())),
            reason_changed=reasons,
            provenance_changed=provenance,
            tiles_added=added,
            tiles_removed=removed,
            valid_fraction_changed=fractions,
            max_valid_fraction_change=None if largest_fraction is None else float(largest_fraction),
        )
        for (
            city,
            year,
            modality,
            name,
            tiles,
            changed,
            largest,
            gained,
            lost,
            gained_reasons,
            lost_reasons,
            reasons,
            provenance,
            added,
            removed,
            fractions,
            largest_fraction,
        ) in rows
    ]


def _same_bytes(path_a: Path, path_b: Path) -> bool:
    """Whether two chip stores hold the same files with the same bytes now (read from disk:
    plain Zarr stores of identical content are identical bytes; icechunk ones never are)."""
    import filecmp

    def files(root: Path) -> list[str]:
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())

    if not (path_a.is_dir() and path_b.is_dir()):
        return False
    names = files(path_a)
    if names != files(path_b):
        return False
    return all(filecmp.cmp(path_a / n, path_b / n, shallow=False) for n in names)


def _chip_store_of(release: Release, key: PartitionKey) -> str | None:
    """The store a partition's chip index names (relative to the release), if it has chips."""
    import pyarrow.parquet as pq

    path = release.published_chip_index_file(*key)
    if not path.exists():
        return None
    stores = pq.read_table(path, columns=["store"]).column("store").unique().to_pylist()
    return str(stores[0]) if stores else None


def compare_chip_stores(path_a: Path, path_b: Path) -> tuple[int, int, int, float | None]:
    """(pixels, changed pixels, validity changes, largest |B − A|) of two chip stores.

    Read one row band of chunks at a time (the stores' own chunking), so memory follows a
    band, not the city. Stores of different grids or bands are reported as wholly changed; a
    store whose chunks cannot be decoded is a ``ChipsNotFoundError`` naming it.
    """
    try:
        return _compare_chip_stores(path_a, path_b)
    except CityCubeError:
        raise
    except Exception as exc:  # a damaged chunk: zstd, zarr or icechunk each raise their own
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ChipsNotFoundError(
            f"the chip stores {path_a} and {path_b} could not be compared: one cannot be read "
            f"({type(exc).__name__}: {why}); run `citycube verify` on both releases to find "
            "the damaged file, and rebuild its partition"
        ) from None


def _compare_chip_stores(path_a: Path, path_b: Path) -> tuple[int, int, int, float | None]:
    import numpy as np

    from citycube.cube.chips import open_chips

    with open_chips(path_a) as a, open_chips(path_b) as b:
        shape = (a.sizes["y"], a.sizes["x"])
        pixels = shape[0] * shape[1]
        if (
            shape != (b.sizes["y"], b.sizes["x"])
            or a.sizes["band"] != b.sizes["band"]
            or a["data"].dtype != b["data"].dtype
        ):
            return pixels, pixels, 0, None
        rows = a["data"].encoding.get("chunks", (1, 400, 400))[1]
        changed = validity = 0
        largest: float | None = None
        for r0 in range(0, shape[0], rows):
            band = slice(r0, min(r0 + rows, shape[0]))
            da, db = a["data"][:, band].values, b["data"][:, band].values
            va, vb = a["valid"][band].values.astype(bool), b["valid"][band].values.astype(bool)
            same = da == db
            if da.dtype.kind == "f":
                same |= np.isnan(da) & np.isnan(db)  # the float fill is NaN
            differs = ~same
            pixel_differs = differs.any(axis=0) | (va != vb)
            changed += int(pixel_differs.sum())
            validity += int((va != vb).sum())
            both = va & vb & differs.any(axis=0)
            if both.any():
                delta = np.abs(db[:, both].astype(np.float64) - da[:, both].astype(np.float64))
                top = float(np.nanmax(delta))
                largest = top if largest is None else max(largest, top)
    return pixels, changed, validity, largest


def chip_changes(
    release_a: Release, release_b: Release, partitions: list[PartitionKey]
) -> list[ChipChange]:
    """The partitions among ``partitions`` whose chips differ, with how many pixels did.

    A store is compared once however many years point at it (a static store serves every
    year). What is compared is what is on disk now, never what the manifests say: two stores
    whose files have the same bytes are the same (plain Zarr stores of identical content are
    identical bytes); others, icechunk repositories among them, are compared pixel by pixel.
    """
    return _chip_changes(release_a, release_b, partitions, {})


def _chip_changes(
    release_a: Release,
    release_b: Release,
    partitions: list[PartitionKey],
    compared: dict[tuple[str, str], tuple[int, int, int, float | None]],
) -> list[ChipChange]:
    """:func:`chip_changes`, recording each pair of stores compared in ``compared``."""
    out = []
    for key in partitions:
        store_a, store_b = _chip_store_of(release_a, key), _chip_store_of(release_b, key)
        if store_a is None or store_b is None:
            continue
        pair = (store_a, store_b)
        if pair not in compared:
            path_a, path_b = release_a.root / store_a, release_b.root / store_b
            if _same_bytes(path_a, path_b):
                compared[pair] = (0, 0, 0, None)
            else:
                compared[pair] = compare_chip_stores(path_a, path_b)
        pixels, changed, validity, largest = compared[pair]
        if changed:
            city, year, modality = key
            out.append(
                ChipChange(
                    city, year, modality, store_a, store_b, pixels, changed, validity, largest
                )
            )
    return out


def diff_releases(data_root: Path, version_a: str, version_b: str) -> ReleaseDiff:
    """Compare the published observations of releases ``version_a`` and ``version_b``."""
    release_a = open_release(data_root, version_a)
    release_b = open_release(data_root, version_b)
    in_a = set(published_partitions(release_a)[0])
    in_b = set(published_partitions(release_b)[0])
    common = sorted(in_a & in_b)
    changes = field_changes(release_a, release_b, common)
    compared: dict[tuple[str, str], tuple[int, int, int, float | None]] = {}
    chips = _chip_changes(release_a, release_b, common, compared)
    changed = sorted({c.partition for c in changes} | {c.partition for c in chips})
    return ReleaseDiff(
        a=release_a.version,
        b=release_b.version,
        added=tuple(sorted(in_b - in_a)),
        removed=tuple(sorted(in_a - in_b)),
        changed=tuple(changed),
        unchanged=len(common) - len(changed),
        fields=tuple(changes),
        chips=tuple(chips),
        compared_partitions=len(common),
        compared_chip_stores=len(compared),
    )


def _reasons_text(count: int, reasons: dict[str, int]) -> str:
    if not count:
        return "0"
    return f"{count} (" + ", ".join(f"{r} {n}" for r, n in reasons.items()) + ")"


def diff_text(diff: ReleaseDiff) -> str:
    """The human report: a summary line, added and removed partitions, changed fields."""
    out = [
        f"{diff.a} → {diff.b}: {len(diff.changed)} partitions changed, {len(diff.added)} added, "
        f"{len(diff.removed)} removed, {diff.unchanged} unchanged",
        f"compared: the observations of {diff.compared_partitions} partitions both publish, row "
        f"by row, and {diff.compared_chip_stores} pairs of chip stores by their content (bytes "
        "on disk, then pixel by pixel), as read now, not as the manifests list them",
    ]
    for label, keys in (("added", diff.added), ("removed", diff.removed)):
        for city, year, modality in keys:
            out.append(f"  {label:<8}{city} {year} {modality}")
    if diff.fields:
        header = (
            f"{'city':<14}{'year':>5}  {'modality':<9}{'field':<28}{'tiles':>6}{'changed':>9}"
            f"{'max |Δ|':>12}  NULL→value / value→NULL (reasons)"
        )
        out += ["", header]
        for f in diff.fields:
            largest = "-" if f.max_abs_change is None else f"{f.max_abs_change:.6g}"
            flips = (
                f"{_reasons_text(f.null_to_value, f.null_to_value_reasons)} / "
                f"{_reasons_text(f.value_to_null, f.value_to_null_reasons)}"
            )
            extra = [
                f"{n} {what}"
                for n, what in (
                    (f.reason_changed, "reasons changed"),
                    (f.provenance_changed, "sources changed"),
                    (f.tiles_added, "tiles added"),
                    (f.tiles_removed, "tiles removed"),
                )
                if n
            ]
            if f.valid_fraction_changed:
                extra.append(
                    f"{f.valid_fraction_changed} valid fractions changed (max |Δ| "
                    f"{f.max_valid_fraction_change or 0:.6g})"
                )
            line = (
                f"{f.city:<14}{f.year:>5}  {f.modality:<9}{f.field:<28}{f.tiles:>6}"
                f"{f.changed_values:>9}{largest:>12}  {flips}"
            )
            out.append(line + (f"; {', '.join(extra)}" if extra else ""))
    if diff.chips:
        out += [
            "",
            f"{'city':<14}{'year':>5}  {'modality':<9}{'chip pixels':>12}{'changed':>10}"
            f"{'validity':>10}{'max |Δ|':>12}  stores",
        ]
        for c in diff.chips:
            largest = "-" if c.max_abs_change is None else f"{c.max_abs_change:.6g}"
            out.append(
                f"{c.city:<14}{c.year:>5}  {c.modality:<9}{c.pixels:>12}{c.changed_pixels:>10}"
                f"{c.validity_changed:>10}{largest:>12}  {c.store_a} → {c.store_b}"
            )
    if diff.identical:
        out.append("the releases publish the same partitions with the same values and chips")
    return "\n".join(out)


__all__ = [
    "ChipChange",
    "FieldChange",
    "ReleaseDiff",
    "chip_changes",
    "compare_chip_stores",
    "diff_releases",
    "diff_text",
    "field_changes",
]
