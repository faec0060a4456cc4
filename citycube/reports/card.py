"""A release's dataset card: a STAC Collection, a Croissant description and a markdown card.

A release is found and used through catalogues as much as through this repository: the STAC
Collection (with the datacube extension) lets STAC tools index its extent, dimensions and
variables; the Croissant JSON-LD lets ML loaders read its observations and tiles as record
sets; the markdown card tells a reader what it covers, how complete each modality is, whose
data it is and on what terms, and what it cannot be used for. All three are written from the
published release (its database, ``release.json`` and the specs) into the release root, before
the manifest, so ``citycube verify`` covers them. Generating needs neither pystac's JSON Schema
validation nor mlcroissant; ``validate_card`` uses them when installed (the dev extra).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from citycube.catalogue.cities import SCALES, load_cities
from citycube.catalogue.modalities import Catalogue, ModalitySpec
from citycube.catalogue.products import load_products
from citycube.cube.release import CHIP_INDEX_SCHEMA, OBSERVATION_SCHEMA, Release
from citycube.cube.releases import published_partitions, read_release_metadata
from citycube.errors import CardValidationError, ReleaseNotFoundError
from citycube.io.atomic import write_text_atomic
from citycube.reports.paper import load_paper_tables

STAC_FILE = "collection.json"
"""The STAC Collection, in the release root."""
CROISSANT_FILE = "croissant.json"
"""The Croissant JSON-LD, in the release root (its file paths are relative to it)."""
CARD_FILE = "README.md"
"""The markdown data card, in the release root (what a reader opening the folder sees)."""

CROISSANT_CONTEXT: dict[str, Any] = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}
"""The Croissant 1.0 JSON-LD context."""

PARQUET = "application/x-parquet"
"""Parquet's media type as Croissant names it."""

_CROISSANT_TYPES = {
    "string": "sc:Text",
    "int16": "sc:Integer",
    "int32": "sc:Integer",
    "int64": "sc:Integer",
    "double": "sc:Float",
    "bool": "sc:Boolean",
}

OBSERVATION_COLUMNS: dict[str, str] = {
    "tile_id": "Tile id, e.g. Boston_2KM_r7_c8 (city, scale, row, column).",
    "city": "City key.",
    "scale": "Tile grid: 2km or 5km.",
    "year": "Calendar year the row describes.",
    "modality": "Modality code.",
    "field": "Released field of the modality.",
    "value": "Value in physical units; NULL when unavailable (never zero-filled).",
    "unit": "Unit of the value.",
    "valid_fraction": "Share of the tile with valid support (pixels or area).",
    "available": "Whether the tile meets the modality's validity threshold that year.",
    "reason": "Stable reason code when unavailable.",
    "temporal_basis": "annual, epoch, static, snapshot or city_record.",
    "source_year": "Year of the source data used (NULL for static sources).",
    "source_id": "Which adapter served the source, e.g. sample:odiac.",
    "source_version": "Version of the source product.",
    "synthetic": "True when the source is the synthetic sample backend.",
}
"""Descriptions of the observations columns (Croissant fields, data card)."""

TILE_COLUMNS: dict[str, tuple[str, str]] = {
    "tile_id": ("sc:Text", "Tile id."),
    "city": ("sc:Text", "City key."),
    "city_name": ("sc:Text", "City name."),
    "country": ("sc:Text", "Country."),
    "scale": ("sc:Text", "Tile grid: 2km or 5km."),
    "row": ("sc:Integer", "Tile row, north to south."),
    "col": ("sc:Integer", "Tile column, west to east."),
    "parent_id": ("sc:Text", "The 10 km lattice cell the tile nests in."),
    "epsg": ("sc:Integer", "The city's UTM EPSG code."),
    "utm_xmin": ("sc:Float", "West edge, metres, in the city's UTM CRS."),
    "utm_ymin": ("sc:Float", "South edge, metres."),
    "utm_xmax": ("sc:Float", "East edge, metres."),
    "utm_ymax": ("sc:Float", "North edge, metres."),
    "lon_min": ("sc:Float", "West edge, WGS84 degrees."),
    "lat_min": ("sc:Float", "South edge, WGS84 degrees."),
    "lon_max": ("sc:Float", "East edge, WGS84 degrees."),
    "lat_max": ("sc:Float", "North edge, WGS84 degrees."),
}
"""The tiles table's plain columns (its WKB geometry is left to GeoParquet readers)."""


@dataclass(frozen=True)
class ModalityAvailability:
    """How complete one modality is in a release."""

    code: str
    """Modality code."""
    combinations_available: int
    """(city, year) pairs of the release's scope with at least one available tile."""
    combinations: int
    """(city, year) pairs in the release's scope."""
    tile_fields_available: int
    """Observation rows (tile × field) with a value."""
    tile_fields: int
    """Observation rows (tile × field) published."""


@dataclass(frozen=True)
class CardFacts:
    """Everything the three card files say, read once from the published release."""

    version: str
    """Release version."""
    metadata: Mapping[str, Any]
    """``release.json``."""
    cities: tuple[str, ...]
    """Cities with published partitions, in the city catalogue's order."""
    years: tuple[int, ...]
    """Years with published partitions."""
    modalities: tuple[ModalitySpec, ...]
    """Published modalities, in catalogue order."""
    availability: tuple[ModalityAvailability, ...]
    """Per catalogue modality (published or not)."""
    city_bboxes: Mapping[str, tuple[float, float, float, float]]
    """WGS84 (west, south, east, north) of each city's tiles."""
    has_chips: bool
    """Whether the release has a chip index."""
    tables: str = "published/"
    """Where the published tables are, relative to the release root (``published/``, or ''
    for a release published before that folder existed); ends with '/' unless empty."""

    @property
    def synthetic(self) -> bool:
        """True unless the release says it is built from real sources only."""
        return self.metadata.get("synthetic") is not False

    @property
    def bbox(self) -> tuple[float, float, float, float]:
        """WGS84 bounds of all the release's cities."""
        boxes = list(self.city_bboxes.values()) or [(-180.0, -90.0, 180.0, 90.0)]
        return (
            min(b[0] for b in boxes),
            min(b[1] for b in boxes),
            max(b[2] for b in boxes),
            max(b[3] for b in boxes),
        )


def _city_bboxes(release: Release, cities: tuple[str, ...]) -> dict[str, tuple[float, ...]]:
    columns = ["city", "lon_min", "lat_min", "lon_max", "lat_max"]
    table = pq.read_table(release.published_tiles_file, columns=columns).to_pandas()
    table = table[table["city"].isin(cities)]
    grouped = table.groupby("city").agg(
        {"lon_min": "min", "lat_min": "min", "lon_max": "max", "lat_max": "max"}
    )
    return {
        city: tuple(round(float(v), 6) for v in grouped.loc[city, columns[1:]])
        for city in cities
        if city in grouped.index
    }


def _availability(release: Release, catalogue: Catalogue) -> tuple[ModalityAvailability, ...]:
    import duckdb

    from citycube.reports.availability import load_availability

    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        availability = load_availability(con)
        rows = con.execute(
            "SELECT modality, count(*) FILTER (WHERE available), count(*) "
            "FROM observations GROUP BY modality"
        ).fetchall()
    tile_fields = {m: (int(a), int(n)) for m, a, n in rows}
    scope = availability.scope
    return tuple(
        ModalityAvailability(
            code=m.code,
            combinations_available=sum(
                1 for c, y in scope if (c, y, m.code) in availability.available
            ),
            combinations=len(scope),
            tile_fields_available=tile_fields.get(m.code, (0, 0))[0],
            tile_fields=tile_fields.get(m.code, (0, 0))[1],
        )
        for m in catalogue.modalities
    )


def card_facts(release: Release, catalogue: Catalogue) -> CardFacts:
    """Read what the card needs from a published release."""
    if not release.duckdb_file.exists() or not release.metadata_file.exists():
        raise ReleaseNotFoundError(
            f"release {release.version} has no published database at {release.duckdb_file}: "
            "materialise cube/database (or finish the build) before its dataset card"
        )
    partitions, _ = published_partitions(release)
    order = {key: i for i, key in enumerate(load_cities())}
    cities = tuple(sorted({c for c, _, _ in partitions}, key=lambda c: (order.get(c, 99), c)))
    published = {m for _, _, m in partitions}
    return CardFacts(
        version=release.version,
        metadata=read_release_metadata(release),
        cities=cities,
        years=tuple(sorted({y for _, y, _ in partitions})),
        modalities=tuple(m for m in catalogue.modalities if m.code in published),
        availability=_availability(release, catalogue),
        city_bboxes=_city_bboxes(release, cities),
        has_chips=any((release.published_root / "chip_index").glob("city=*/year=*/*.parquet")),
        tables=_tables_prefix(release),
    )


def _tables_prefix(release: Release) -> str:
    """The published tables' folder relative to the release root, as :attr:`CardFacts.tables`."""
    relative = release.published_root.relative_to(release.root).as_posix()
    return "" if relative == "." else f"{relative}/"


# --------------------------------------------------------------------------------------------
# STAC Collection (datacube extension)


def _year_start(year: int) -> dt.datetime:
    return dt.datetime(year, 1, 1, tzinfo=dt.UTC)


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _notice(facts: CardFacts) -> str:
    if facts.synthetic:
        return (
            "SYNTHETIC SAMPLE DATA: every value was generated by CityCube's sample backend in "
            "each real product's native form; it is not an observation of any real place."
        )
    return "Built from the real sources listed in the data card."


def variable_name(modality: ModalitySpec, field: str) -> str:
    """A datacube variable's name: modality code and field, e.g. 'POP.population_density'."""
    return f"{modality.code}.{field}"


def stac_collection(facts: CardFacts) -> dict[str, Any]:
    """The release as a STAC Collection with the datacube extension (x, y, time, scale)."""
    import pystac
    from pystac.extensions.datacube import DatacubeExtension, Dimension, Variable

    products = load_products()
    sources: Mapping[str, Mapping[str, Any]] = facts.metadata.get("sources") or {}
    providers = [
        pystac.Provider(
            name="CityCube",
            roles=[pystac.ProviderRole.PROCESSOR, pystac.ProviderRole.HOST],
            description="Aligned every source onto the cities' 2 km and 5 km UTM tile grids.",
        )
    ]
    if facts.synthetic:
        providers.append(
            pystac.Provider(
                name="CityCube sample backend (synthetic)",
                roles=[pystac.ProviderRole.PRODUCER],
                description=_notice(facts),
            )
        )
    seen = set()
    for product, info in sorted(sources.items()):
        spec = products.get(product)
        if info.get("synthetic") or spec is None or spec.provider in seen:
            continue
        seen.add(spec.provider)
        providers.append(
            pystac.Provider(
                name=spec.provider, roles=[pystac.ProviderRole.PRODUCER], description=spec.name
            )
        )
    west, south, east, north = facts.bbox
    # STAC: one overall box, then one per city when there are at least two (never just one).
    city_boxes = list(facts.city_bboxes.values()) if len(facts.city_bboxes) > 1 else []
    first, last = (facts.years[0], facts.years[-1]) if facts.years else (2000, 2025)
    end = dt.datetime(last, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
    collection = pystac.Collection(
        id=f"citycube-{facts.version}",
        title=f"CityCube {facts.version}" + (" (synthetic sample data)" if facts.synthetic else ""),
        description=(
            "A longitudinal, multimodal urban data cube: per-tile values of "
            f"{len(facts.modalities)} modalities on 2 km and 5 km UTM tiles of "
            f"{len(facts.cities)} cities, {len(facts.years)} years. {_notice(facts)}"
        ),
        extent=pystac.Extent(
            pystac.SpatialExtent([[west, south, east, north], *city_boxes]),
            pystac.TemporalExtent([[_year_start(first), end]]),
        ),
        license="other",
        providers=providers,
        keywords=["urban", "data cube", "multimodal", "tiles", "longitudinal"],
        summaries=pystac.Summaries(
            {
                "citycube:cities": list(facts.cities),
                "citycube:modalities": [m.code for m in facts.modalities],
                "citycube:synthetic": [facts.synthetic],
            }
        ),
    )
    time_dimension: dict[str, Any] = {
        "type": "temporal",
        "extent": [_iso(_year_start(first)), _iso(end)],
        "description": "Calendar year of each observation (one value per tile and year).",
    }
    if list(facts.years) == list(range(first, last + 1)):
        time_dimension["step"] = "P1Y"
    else:
        time_dimension["values"] = [_iso(_year_start(y)) for y in facts.years]
    grids = "Tiles of each city's own UTM grid (tiles.parquet gives each tile's EPSG and bounds)"
    dimensions = {
        "x": {
            "type": "spatial",
            "axis": "x",
            "extent": [west, east],
            "reference_system": 4326,
            "description": f"{grids}; extent in WGS84 longitude.",
        },
        "y": {
            "type": "spatial",
            "axis": "y",
            "extent": [south, north],
            "reference_system": 4326,
            "description": f"{grids}; extent in WGS84 latitude.",
        },
        "time": time_dimension,
        "scale": {
            "type": "tile_size",
            "values": list(SCALES),
            "description": "Tile grid: 2 km and 5 km tiles are separate, non-nested grids.",
        },
    }
    variables = {
        variable_name(m, f.name): {
            "dimensions": ["x", "y", "time", "scale"],
            "type": "data",
            "unit": f.unit,
            "description": f"{m.name} ({m.display_code}): {f.name}; {m.temporal.value} source, "
            f"{m.aggregation_of(f)} per tile, available when valid support ≥ "
            f"{m.validity.min_valid_fraction:g}.",
        }
        for m in facts.modalities
        for f in m.fields
    }
    DatacubeExtension.ext(collection, add_if_missing=True).apply(
        dimensions={k: Dimension.from_dict(v) for k, v in dimensions.items()},
        variables={k: Variable.from_dict(v) for k, v in variables.items()},
    )
    assets = {
        "observations": (
            f"{facts.tables}observations/",
            "application/vnd.apache.parquet",
            ["data"],
            "Long-form tile values, one Parquet file per city, year and modality.",
        ),
        "tiles": (
            f"{facts.tables}tiles.parquet",
            "application/vnd.apache.parquet; profile=geoparquet",
            ["data"],
            "GeoParquet: every 2 km and 5 km tile (WGS84 geometry, UTM bounds).",
        ),
        "database": (
            "cube.duckdb",
            "application/vnd.duckdb",
            ["metadata"],
            "DuckDB views over the Parquet (observations, tiles, chip_index, availability).",
        ),
        "croissant": (CROISSANT_FILE, "application/ld+json", ["metadata"], "Croissant JSON-LD."),
        "card": (CARD_FILE, "text/markdown", ["metadata"], "The data card."),
        "manifest": (
            "manifest.json",
            "application/json",
            ["metadata"],
            "SHA-256 and size of every file (`citycube verify`).",
        ),
    }
    if facts.has_chips:
        assets["chips"] = (
            "chips/",
            "application/vnd+zarr",
            ["data"],
            f"Zarr v3 image chips per modality, city and source period (see {facts.tables}"
            "chip_index/).",
        )
    for key, (href, media_type, roles, description) in assets.items():
        collection.add_asset(
            key,
            pystac.Asset(href=href, media_type=media_type, roles=roles, description=description),
        )
    collection.add_link(pystac.Link("license", CARD_FILE, "text/markdown", "Licences by source"))
    collection.add_link(pystac.Link("describedby", CARD_FILE, "text/markdown", "Data card"))
    return collection.to_dict(include_self_link=False, transform_hrefs=False)


# --------------------------------------------------------------------------------------------
# Croissant


def _croissant_fields(
    record_set: str, source: tuple[str, str], columns: Mapping[str, tuple[str, str]]
) -> list[dict[str, Any]]:
    """One field per column, read from ``source``: ('fileSet' or 'fileObject', its @id)."""
    kind, source_id = source
    return [
        {
            "@type": "cr:Field",
            "@id": f"{record_set}/{name}",
            "name": name,
            "description": description,
            "dataType": data_type,
            "source": {kind: {"@id": source_id}, "extract": {"column": name}},
        }
        for name, (data_type, description) in columns.items()
    ]


def _schema_columns(
    schema: pa.Schema, descriptions: Mapping[str, str]
) -> dict[str, tuple[str, str]]:
    return {
        f.name: (_CROISSANT_TYPES[str(f.type)], descriptions.get(f.name, f.name)) for f in schema
    }


def _licences(facts: CardFacts) -> list[str]:
    sources: Mapping[str, Mapping[str, Any]] = facts.metadata.get("sources") or {}
    return sorted({str(info.get("licence")) for info in sources.values() if info.get("licence")})


def semantic_version(version: str) -> str:
    """The MAJOR.MINOR.PATCH part of a release version ('sample-0.1.0' → '0.1.0'), as
    Croissant asks for; the whole version when it has none."""
    match = re.search(r"\d+\.\d+\.\d+", version)
    return match.group(0) if match else version


def croissant_metadata(facts: CardFacts, release: Release) -> dict[str, Any]:
    """The release's observations, tiles and chip index as Croissant 1.0 record sets.

    Paths are relative to the release root (where ``croissant.json`` lives); the tiles file is
    pinned by its SHA-256, the partitioned tables are file sets.
    """
    from citycube.io.digest import file_sha256

    distribution: list[dict[str, Any]] = [
        {
            "@type": "cr:FileObject",
            "@id": "tiles.parquet",
            "name": "tiles.parquet",
            "description": "GeoParquet table of every 2 km and 5 km tile.",
            "contentUrl": f"{facts.tables}tiles.parquet",
            "encodingFormat": PARQUET,
            "sha256": file_sha256(release.published_tiles_file),
        },
        {
            "@type": "cr:FileSet",
            "@id": "observations-files",
            "name": "observations-files",
            "description": "One Parquet file per (city, year, modality).",
            "encodingFormat": PARQUET,
            "includes": f"{facts.tables}observations/city=*/year=*/*.parquet",
        },
    ]
    observation_columns = _schema_columns(OBSERVATION_SCHEMA, OBSERVATION_COLUMNS)
    record_sets: list[dict[str, Any]] = [
        {
            "@type": "cr:RecordSet",
            "@id": "observations",
            "name": "observations",
            "description": "Long-form tile values: one row per tile, year, modality and field.",
            "key": [{"@id": f"observations/{k}"} for k in ("tile_id", "year", "modality", "field")],
            "field": _croissant_fields(
                "observations", ("fileSet", "observations-files"), observation_columns
            ),
        },
        {
            "@type": "cr:RecordSet",
            "@id": "tiles",
            "name": "tiles",
            "description": "The tiles: id, city, grid position, UTM and WGS84 bounds.",
            "key": {"@id": "tiles/tile_id"},
            "field": _croissant_fields("tiles", ("fileObject", "tiles.parquet"), TILE_COLUMNS),
        },
        {
            "@type": "cr:RecordSet",
            "@id": "released_fields",
            "name": "released_fields",
            "description": "Each released modality field with its unit and temporal rule.",
            "key": [{"@id": "released_fields/modality"}, {"@id": "released_fields/field"}],
            "field": [
                {
                    "@type": "cr:Field",
                    "@id": f"released_fields/{name}",
                    "name": name,
                    "description": description,
                    "dataType": "sc:Text",
                }
                for name, description in (
                    ("modality", "Modality code."),
                    ("field", "Field name."),
                    ("unit", "Physical unit of the field's values."),
                    ("temporal", "Temporal rule of the modality's source."),
                )
            ],
            "data": [
                {
                    "released_fields/modality": m.code,
                    "released_fields/field": f.name,
                    "released_fields/unit": f.unit,
                    "released_fields/temporal": m.temporal.value,
                }
                for m in facts.modalities
                for f in m.fields
            ],
        },
    ]
    if facts.has_chips:
        distribution.append(
            {
                "@type": "cr:FileSet",
                "@id": "chip_index-files",
                "name": "chip_index-files",
                "description": "Where each image tile's chip lives, per (city, year, modality).",
                "encodingFormat": PARQUET,
                "includes": f"{facts.tables}chip_index/city=*/year=*/*.parquet",
            }
        )
        descriptions = {
            "store": "Zarr store of the chip, relative to the release root.",
            "row_off": "First pixel row of the tile in the store.",
            "col_off": "First pixel column of the tile in the store.",
            "height": "Chip height, pixels.",
            "width": "Chip width, pixels.",
            "resolution_m": "Pixel size, metres.",
            "classes": "Distinct valid class ids in a categorical chip (LC, LU, POI); else empty.",
        }
        record_sets.append(
            {
                "@type": "cr:RecordSet",
                "@id": "chip_index",
                "name": "chip_index",
                "description": "Image chips: the Zarr store and pixel window of each tile.",
                "field": _croissant_fields(
                    "chip_index",
                    ("fileSet", "chip_index-files"),
                    _schema_columns(CHIP_INDEX_SCHEMA, {**OBSERVATION_COLUMNS, **descriptions}),
                ),
            }
        )
    built = str(facts.metadata.get("built_at") or "")
    return {
        "@context": CROISSANT_CONTEXT,
        "@type": "sc:Dataset",
        "name": f"CityCube {facts.version}",
        "description": (
            f"Per-tile values of {len(facts.modalities)} urban modalities on 2 km and 5 km UTM "
            f"tiles of {len(facts.cities)} cities ({', '.join(facts.cities)}), years "
            f"{', '.join(str(y) for y in facts.years)}. {_notice(facts)}"
        ),
        "conformsTo": "http://mlcommons.org/croissant/1.0",
        "version": semantic_version(facts.version),
        "datePublished": built[:10] or None,
        "license": _licences(facts) or ["see README.md"],
        "url": "README.md",
        "citeAs": f"CityCube release {facts.version} (built {built or 'unknown'}); "
        "cite the sources listed in its README.md as well.",
        "isLiveDataset": False,
        "keywords": ["urban", "data cube", "multimodal", "synthetic" if facts.synthetic else "EO"],
        "distribution": distribution,
        "recordSet": record_sets,
    }


# --------------------------------------------------------------------------------------------
# Markdown data card


def _md_table(header: list[str], rows: list[list[object]]) -> list[str]:
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows),
    ]


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole else "–"


def data_card_markdown(facts: CardFacts, catalogue: Catalogue) -> str:
    """The markdown data card: coverage, availability, sources and licences, limitations."""
    from citycube.grid.tiles import city_grid

    meta = facts.metadata
    out = [f"# CityCube release {facts.version}", ""]
    if facts.synthetic:
        out += [f"> **{_notice(facts)}**", ""]
    out += [
        f"- Built: {meta.get('built_at', 'unknown')} from source set "
        f"`{meta.get('source_set', 'unknown')}`; catalogue digest "
        f"`{meta.get('catalogue_digest', 'unknown')}`.",
        f"- Files: `{STAC_FILE}` (STAC Collection, datacube extension), `{CROISSANT_FILE}` "
        "(Croissant), `manifest.json` (every file's SHA-256: `citycube verify`), "
        f"`cube.duckdb` (DuckDB views), `{facts.tables}observations/`, "
        f"`{facts.tables}tiles.parquet`"
        + (f", `{facts.tables}chip_index/`, `chips/`" if facts.has_chips else "")
        + ", `reports/` (availability).",
        "",
        "## Coverage",
        "",
        f"{_count(len(facts.cities), 'city', 'cities')} × "
        f"{_count(len(facts.years), 'year', 'years')} "
        f"({', '.join(str(y) for y in facts.years) or 'none'}), {len(facts.modalities)} of "
        f"{len(catalogue.modalities)} modalities. Each city has two separate tile grids in its "
        "own UTM zone, 2 km and 5 km, both aligned to a 10 km lattice.",
        "",
    ]
    cities = load_cities()
    rows: list[list[object]] = []
    for key in facts.cities:
        spec = cities.get(key)
        grids = [city_grid(key, s) for s in SCALES] if spec else []
        west, south, east, north = facts.city_bboxes.get(key, (0.0, 0.0, 0.0, 0.0))
        rows.append(
            [
                spec.name if spec else key,
                spec.country if spec else "",
                f"EPSG:{spec.epsg}" if spec else "",
                *(f"{g.n_rows}×{g.n_cols} ({g.n_tiles})" for g in grids),
                f"{west:.3f}, {south:.3f}, {east:.3f}, {north:.3f}",
            ]
        )
    out += _md_table(
        ["city", "country", "CRS", "2 km grid (tiles)", "5 km grid (tiles)", "WGS84 bounds"], rows
    )
    out += [
        "",
        "## Availability by modality",
        "",
        "A city-year counts as available when at least one tile has a valid value (any field); "
        "tile-fields are the observation rows with a value. Unavailable values are NULL with a "
        "reason code, never zero-filled or imputed.",
        "",
    ]
    by_code = {a.code: a for a in facts.availability}
    published = {m.code for m in facts.modalities}
    rows = []
    for m in catalogue.modalities:
        a = by_code[m.code]
        fields = ", ".join(f"{f.name} ({f.unit})" for f in m.fields)
        state = (
            f"{a.combinations_available}/{a.combinations} "
            f"({_percent(a.combinations_available, a.combinations)})"
            if m.code in published
            else "not in this release"
        )
        tiles = (
            f"{a.tile_fields_available}/{a.tile_fields} "
            f"({_percent(a.tile_fields_available, a.tile_fields)})"
            if a.tile_fields
            else "–"
        )
        rows.append([m.display_code, m.name, m.temporal.value, fields, state, tiles])
    out += _md_table(
        ["code", "modality", "time", "fields (unit)", "city-years available", "tile-fields"],
        rows,
    )
    out += ["", "## Sources, licences and attribution", ""]
    products = load_products()
    sources: Mapping[str, Mapping[str, Any]] = meta.get("sources") or {}
    rows = []
    for product, info in sorted(sources.items()):
        spec = products.get(product)
        rows.append(
            [
                f"`{product}`",
                f"{spec.name} ({spec.provider})" if spec else product,
                f"`{info.get('source_id', '')}` {info.get('version', '')}",
                info.get("licence", ""),
                info.get("attribution", ""),
                "synthetic" if info.get("synthetic") else "observed",
            ]
        )
    out += _md_table(
        ["product", "what (publisher)", "served by, version", "licence", "attribution", "data"],
        rows,
    )
    if any(not info.get("synthetic") for info in sources.values()):
        out += [
            "",
            "Each observation row names its `source_id` and `source_version`. Share the cube "
            "under terms compatible with every licence above (OpenStreetMap-derived data: ODbL "
            "share-alike, © OpenStreetMap contributors) and keep the attributions.",
        ]
    out += ["", "## Known limitations", ""]
    limits = []
    if facts.synthetic:
        limits.append(
            "Synthetic: the sample backend imitates each product's file form, coverage and "
            "trends from one generated structure per city, and its calendars (which city-years "
            "each product holds) are planned so that a full calendar's availability per modality "
            "and per city matches AgenticCity-Bench Tables 10 and 11 less the departures "
            "listed below. Use it to test pipelines and models, never to describe a real place."
        )
    missing = [m.display_code for m in catalogue.modalities if m.code not in published]
    if missing:
        limits.append(f"Modalities not in this release: {', '.join(missing)}.")
    limits += [
        "Values are tile aggregates (2 km and 5 km); image modalities also ship per-tile chips.",
        "No interpolation: epoch and static sources are reused for the years they serve "
        "(`temporal_basis`, `source_year`); years a source does not cover stay unavailable.",
        "Tiles below a modality's valid-support threshold are unavailable "
        "(`insufficient_valid_support`), so coastal and edge tiles are often missing.",
        "The 2 km and 5 km grids are separate: a 5 km value is not an aggregate of 2 km values.",
    ]
    limits += [
        f"Departs from AgenticCity-Bench ({d.topic}): {d.release} {d.reason}"
        for d in load_paper_tables().departures
        if d.id != "sample-data"
    ]
    out += [f"- {line}" for line in limits]
    out += [
        "",
        "## Use",
        "",
        "```bash",
        f"citycube --release {facts.version} verify          # every file against manifest.json",
        f"citycube releases --open {facts.version}           # query one-liners and a summary",
        f"citycube diff <older-release> {facts.version}       # what changed",
        "```",
        "",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Writing and validating


def card_paths(release: Release) -> dict[str, Path]:
    """Where the card's files go."""
    return {
        "stac": release.root / STAC_FILE,
        "croissant": release.root / CROISSANT_FILE,
        "card": release.root / CARD_FILE,
    }


def write_card(release: Release, catalogue: Catalogue) -> dict[str, Path]:
    """Write the STAC Collection, the Croissant JSON-LD and the data card of a published release."""
    facts = card_facts(release, catalogue)
    paths = card_paths(release)
    write_text_atomic(json.dumps(stac_collection(facts), indent=2) + "\n", paths["stac"])
    croissant = croissant_metadata(facts, release)
    write_text_atomic(
        json.dumps(croissant, indent=2, ensure_ascii=False) + "\n", paths["croissant"]
    )
    write_text_atomic(data_card_markdown(facts, catalogue), paths["card"])
    return paths


def validate_card(release: Release, records: int = 5) -> list[str]:
    """Validate the card's files and load a few records of each record set; what was checked.

    The STAC Collection is validated against the STAC core JSON Schema shipped with pystac
    (offline); the datacube extension's schema is not available offline, so its required
    fields are checked here. The Croissant file is validated and read by mlcroissant.
    """
    paths = card_paths(release)
    for path in paths.values():
        if not path.exists():
            raise CardValidationError(
                f"no {path.name} in release {release.version}: write the card with "
                f"`citycube --release {release.version} card`"
            )
    try:
        import jsonschema  # noqa: F401  (pystac's validator needs it)
        import mlcroissant as mlc
        import pystac.validation
    except ImportError as exc:
        raise CardValidationError(
            f"validating the card needs the dev extra ({exc.name} is missing): run `make install`"
        ) from None
    checked = []
    stac = json.loads(paths["stac"].read_text(encoding="utf-8"))
    try:
        pystac.validation.validate_dict(stac, extensions=[])
    except pystac.errors.STACValidationError as exc:
        raise CardValidationError(f"{STAC_FILE} is not a valid STAC Collection: {exc}") from None
    problems = datacube_problems(stac)
    if problems:
        raise CardValidationError(f"{STAC_FILE}: " + "; ".join(problems))
    checked.append(f"{STAC_FILE}: STAC {stac['stac_version']} core schema and datacube fields")
    try:
        dataset = mlc.Dataset(jsonld=paths["croissant"])
        for record_set in dataset.metadata.record_sets:
            n = sum(
                1 for _, _ in zip(range(records), dataset.records(record_set.uuid), strict=False)
            )
            checked.append(f"{CROISSANT_FILE}: record set {record_set.name}: read {n} records")
    except mlc.ValidationError as exc:
        raise CardValidationError(f"{CROISSANT_FILE} is not valid Croissant: {exc}") from None
    return checked


def datacube_problems(stac: Mapping[str, Any]) -> list[str]:
    """What the datacube extension requires and the collection lacks (empty when none)."""
    problems = []
    if not any("datacube" in e for e in stac.get("stac_extensions", [])):
        problems.append("the datacube extension is not declared")
    dimensions = stac.get("cube:dimensions") or {}
    for name, axis in (("x", "x"), ("y", "y")):
        d = dimensions.get(name, {})
        if d.get("type") != "spatial" or d.get("axis") != axis or len(d.get("extent", [])) != 2:
            problems.append(f"dimension {name} needs type spatial, axis {axis} and an extent")
    time = dimensions.get("time", {})
    if time.get("type") != "temporal" or not (time.get("extent") or time.get("values")):
        problems.append("dimension time needs type temporal and an extent or values")
    variables = stac.get("cube:variables") or {}
    if not variables:
        problems.append("no cube:variables")
    for name, v in variables.items():
        if not v.get("dimensions") or not set(v["dimensions"]) <= set(dimensions):
            problems.append(f"variable {name} names dimensions the cube does not have")
        if not v.get("unit"):
            problems.append(f"variable {name} has no unit")
    return problems


__all__ = [
    "CARD_FILE",
    "CROISSANT_FILE",
    "STAC_FILE",
    "CardFacts",
    "card_facts",
    "card_paths",
    "croissant_metadata",
    "data_card_markdown",
    "datacube_problems",
    "stac_collection",
    "validate_card",
    "write_card",
]
