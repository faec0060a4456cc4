"""The source protocol: one adapter per source product, and the set that picks them.

Every product the cube reads (Landsat, ODIAC, OSM roads, …) is served by one adapter that says
who serves it (``source_id``), which version, under which licence, whether it is synthetic,
which years it publishes for a city, and how to make one item's files available. A
:class:`SourceSet` picks one adapter per product, so some products can come from real adapters
while the rest stay on the offline sample. Provenance in the cube comes from the adapter, never
from a backend's name.

Adapter implementations live outside the core (``sources/``); the core only knows this
protocol.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pyproj import CRS

from citycube.catalogue.modalities import parse_yaml_spec
from citycube.catalogue.products import load_products
from citycube.errors import SourceReadError, SpecError, UnknownProductError
from citycube.items.staging import InstalledItem

MISSING_ROLES_KEY = "missing_roles"
"""Key of an installed item's extras naming the roles it does not publish, and why."""

REMOTE_PREFIXES = ("/vsi", "http://", "https://", "s3://", "gs://", "az://", "abfs://")
"""Hrefs that name a remote object rather than a local file (GDAL virtual paths and URLs)."""


def is_remote(href: str | Path) -> bool:
    """True when ``href`` is a URL or a GDAL virtual path, not a local file."""
    return str(href).startswith(REMOTE_PREFIXES)


@dataclass(frozen=True)
class SourceInfo:
    """Who serves a product and on what terms; stamped on every observation row."""

    product_id: str
    """Product id from ``schemas/sources.yaml``, e.g. 'odiac'."""
    source_id: str
    """Which adapter serves it, e.g. 'sample:odiac' or 'pc:landsat-c2-l2'."""
    version: str
    """Product (or generator) version."""
    synthetic: bool
    """True when the data are generated, not observed."""
    licence: str
    """Licence of the data as served."""
    attribution: str
    """Required attribution text."""


@dataclass(frozen=True)
class SourceItem:
    """Files of one (product, city, source year), local or remote, ready to read."""

    product: str
    """Product id, e.g. 'odiac'."""
    city: str
    """City key."""
    source_year: int | None
    """The year the source labels the data with; None for static products."""
    files: Mapping[str, str | Path]
    """Files by role ('data' always; 'qa', 'coverage', … per product): a local path, a URL or
    a GDAL virtual path such as ``/vsicurl/https://…`` for windowed remote reads."""
    source_id: str
    """Who served it, e.g. 'sample:odiac'."""
    version: str
    """Product version string."""
    synthetic: bool
    """True when the data are generated, not observed."""
    extra: Mapping[str, str] = field(default_factory=dict)
    """Product-specific metadata (scene ids, units, …)."""
    fingerprint: str = ""
    """Identity of the item's content: changes whenever its files do. Adapters that install
    items give their completion record's digest; left empty, it is derived from the files."""
    missing_roles: Mapping[str, str] = field(default_factory=dict)
    """Roles the product does not publish for this item, each with a stable reason code (e.g.
    'srad': 'variable_not_published'). Fields read from them are unavailable with that reason,
    never zero; a role neither in ``files`` nor here is an error."""

    def __post_init__(self) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", _files_fingerprint(self))

    def href(self, role: str) -> str:
        """What GDAL or fsspec opens for a role: a local path or a remote href."""
        if role not in self.files:
            raise SourceReadError(
                f"{self.product} item for {self.city} has no {role!r} file "
                f"(has {sorted(self.files)})"
            )
        return str(self.files[role])

    def local_path(self, role: str) -> Path:
        """A role's local file, for readers that cannot stream (vector layers, CSV)."""
        href = self.href(role)
        if is_remote(href):
            raise SourceReadError(
                f"{self.product} item for {self.city} serves {role!r} remotely ({href}); this "
                "reader needs a local file: fetch it to the data root first"
            )
        return Path(href)


def _files_fingerprint(item: SourceItem) -> str:
    """Digest of the provenance and of each file's name, size and modification time."""
    parts = [item.source_id, item.version, str(item.source_year)]
    parts += [f"missing:{role}:{reason}" for role, reason in sorted(item.missing_roles.items())]
    for role, href in sorted(item.files.items()):
        if is_remote(href):
            parts.append(f"{role}:{href}")
            continue
        path = Path(href)
        try:
            stat = path.stat()
        except OSError:
            parts.append(f"{role}:{path}:missing")
            continue
        parts.append(f"{role}:{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


class SourceProduct(ABC):
    """One source product served by one adapter.

    Implementations answer which years a product publishes for a city and make one item's files
    available under a destination folder (or name remote hrefs). ``fetch`` is idempotent: a
    complete earlier fetch is reused. It raises ``SourceUnavailableError`` (with a reason code)
    when the product does not cover the request and ``SourceFetchError`` when a server fails.
    """

    info: SourceInfo
    """Provenance shared by every item of this adapter."""

    @property
    def product_id(self) -> str:
        """The product this adapter serves."""
        return self.info.product_id

    def native_crs(self, city: str) -> CRS:
        """The CRS the product's files must have for a city (from ``schemas/sources.yaml``)."""
        return load_products()[self.product_id].expected_crs(city)

    @abstractmethod
    def source_years(self, city: str) -> list[int] | None:
        """Years the product publishes for a city (empty: none); None for a static product."""

    def item_dir(self, city: str, source_year: int | None, dest: Path) -> Path:
        """Where an item's files live: ``dest/<product>/<city>/<year or 'static'>``."""
        label = "static" if source_year is None else str(source_year)
        return Path(dest) / self.product_id / city / label

    def installed_source_item(
        self,
        installed: InstalledItem,
        city: str,
        source_year: int | None,
        **extra: str,
    ) -> SourceItem:
        """The item an installed directory holds, with this adapter's provenance.

        Roles the item declares unpublished (recorded under ``missing_roles`` by the adapter)
        become the item's ``missing_roles``; ``extra`` adds metadata to the recorded extras.
        """
        recorded = dict(installed.extra)
        missing = recorded.pop(MISSING_ROLES_KEY, None) or {}
        return SourceItem(
            product=self.product_id,
            city=city,
            source_year=source_year,
            files=installed.files,
            source_id=self.info.source_id,
            version=self.info.version,
            synthetic=self.info.synthetic,
            extra={**{k: str(v) for k, v in recorded.items()}, **extra},
            fingerprint=installed.fingerprint,
            missing_roles={str(k): str(v) for k, v in dict(missing).items()},
        )

    @abstractmethod
    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Make one item's files available under ``dest`` and describe them."""


class SourceSet:
    """One adapter per product: the sources a build reads."""

    def __init__(self, adapters: Iterable[SourceProduct], name: str = "custom") -> None:
        self.name = name
        """Name of the configuration this set came from (for release metadata)."""
        self._adapters: dict[str, SourceProduct] = {}
        for adapter in adapters:
            if adapter.product_id in self._adapters:
                raise ValueError(f"two adapters serve {adapter.product_id!r}")
            self._adapters[adapter.product_id] = adapter

    def products(self) -> list[str]:
        """Product ids this set serves."""
        return list(self._adapters)

    def product(self, product_id: str) -> SourceProduct:
        """The adapter of a product, with an error naming the products that are served."""
        try:
            return self._adapters[product_id]
        except KeyError:
            raise UnknownProductError(
                f"no adapter serves product {product_id!r} in source set {self.name!r}; "
                f"it serves: {', '.join(sorted(self._adapters)) or 'nothing'}"
            ) from None

    def source_years(self, product_id: str, city: str) -> list[int] | None:
        """Years a product publishes for a city; None for a static product."""
        return self.product(product_id).source_years(city)

    def fetch(self, product_id: str, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Fetch one item of a product through its adapter."""
        return self.product(product_id).fetch(city, source_year, dest)

    @property
    def synthetic(self) -> bool:
        """True when any product of the set is synthetic."""
        return any(a.info.synthetic for a in self._adapters.values())

    def provenance(self, products: Iterable[str] | None = None) -> dict[str, dict[str, object]]:
        """Per product: who serves it, version, synthetic flag, licence and attribution."""
        chosen = self._adapters if products is None else {p: self.product(p) for p in products}
        return {
            pid: {
                "source_id": a.info.source_id,
                "version": a.info.version,
                "synthetic": a.info.synthetic,
                "licence": a.info.licence,
                "attribution": a.info.attribution,
            }
            for pid, a in sorted(chosen.items())
        }

    def __contains__(self, product_id: object) -> bool:
        return product_id in self._adapters

    def __repr__(self) -> str:
        return f"SourceSet({self.name!r}, {len(self._adapters)} products)"


class SourceSetSpec(BaseModel):
    """Which adapter family serves each product (``schemas/source_set.yaml`` by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Name recorded in releases.")
    default: str = Field(description="Adapter family for every product not listed below.")
    products: dict[str, str] = Field(
        default_factory=dict, description="Product id → adapter family, overriding the default."
    )
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Settings per adapter family (e.g. sample: {seed: 0})."
    )

    @model_validator(mode="after")
    def _known_products(self) -> Self:
        unknown = sorted(set(self.products) - set(load_products()))
        if unknown:
            raise ValueError(
                f"unknown product ids {unknown}; declared products: {sorted(load_products())}"
            )
        return self

    def family_of(self, product_id: str) -> str:
        """The adapter family chosen for a product."""
        return self.products.get(product_id, self.default)


def parse_source_set_spec(text: str, origin: str = "<string>") -> SourceSetSpec:
    """Parse and validate a source-set YAML document, with a readable error."""
    return parse_yaml_spec(SourceSetSpec, text, origin, "source set")


def load_source_set_spec(path: str | Path | None = None) -> SourceSetSpec:
    """A source-set spec from a YAML file, or the packaged default (all products on sample)."""
    if not path:
        text = resources.files("schemas").joinpath("source_set.yaml").read_text(encoding="utf-8")
        return parse_source_set_spec(text, "schemas/source_set.yaml")
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"source set file {file} does not exist")
    return parse_source_set_spec(file.read_text(encoding="utf-8"), str(file))
