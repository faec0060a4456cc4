"""Source adapter families (one module per provider) behind
``citycube.items.protocol.SourceProduct``.

A source-set spec names a family per product; :func:`build_source_set` turns it into the
:class:`~citycube.items.protocol.SourceSet` a build reads. Add a family by registering a function
that returns its adapters for the family's options.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from citycube.errors import SpecError
from citycube.items.protocol import SourceProduct, SourceSet, SourceSetSpec, load_source_set_spec

AdapterFamily = Callable[[Mapping[str, Any]], Iterable[SourceProduct]]


def _sample(options: Mapping[str, Any]) -> Iterable[SourceProduct]:
    from sources.sample.backend import sample_adapters

    return sample_adapters(dict(options))


def _http(options: Mapping[str, Any]) -> Iterable[SourceProduct]:
    from sources.http import http_adapters

    return http_adapters(options)


def _stac(options: Mapping[str, Any]) -> Iterable[SourceProduct]:
    from sources.stac import stac_adapters

    return stac_adapters(options)


def _osm(options: Mapping[str, Any]) -> Iterable[SourceProduct]:
    from sources.osm import osm_adapters

    return osm_adapters(options)


def _records(options: Mapping[str, Any]) -> Iterable[SourceProduct]:
    from sources.records import records_adapters

    return records_adapters(options)


def _afdc(options: Mapping[str, Any]) -> Iterable[SourceProduct]:
    from sources.afdc import afdc_adapters

    return afdc_adapters(options)


FAMILIES: dict[str, AdapterFamily] = {
    "sample": _sample,
    "http": _http,
    "planetary-computer": _stac,
    "osm": _osm,
    "records": _records,
    "afdc": _afdc,
}
"""Adapter families by name."""


def build_source_set(spec: SourceSetSpec) -> SourceSet:
    """One adapter per product, each from the family the spec names for it."""
    wanted = {spec.default, *spec.products.values()}
    unknown = sorted(wanted - set(FAMILIES))
    if unknown:
        raise SpecError(
            f"source set {spec.name!r} names unknown adapter families {unknown}; "
            f"known: {sorted(FAMILIES)}"
        )
    offered: dict[str, dict[str, SourceProduct]] = {}
    for family in sorted(wanted):
        try:
            adapters = FAMILIES[family](spec.options.get(family, {}))
        except (TypeError, ValueError) as exc:
            raise SpecError(f"source set {spec.name!r}: family {family!r}: {exc}") from exc
        offered[family] = {a.product_id: a for a in adapters}
    chosen: list[SourceProduct] = []
    for family, adapters in offered.items():
        for product_id, adapter in adapters.items():
            if spec.family_of(product_id) == family:
                chosen.append(adapter)
    missing = sorted(p for p, fam in spec.products.items() if p not in offered.get(fam, {}))
    if missing:
        raise SpecError(f"source set {spec.name!r}: no adapter in its family serves {missing}")
    return SourceSet(chosen, name=spec.name)


def load_source_set(path: str | Path | None = None) -> SourceSet:
    """The source set of a spec file, or the packaged default (every product on sample)."""
    return build_source_set(load_source_set_spec(path))


@cache
def _cached_source_set(path: str) -> SourceSet:
    return load_source_set(path or None)


@dataclass(frozen=True)
class SourceSetSpecFile:
    """A source set named by its spec file, built where it is used.

    Steps hand this to their tasks instead of the set itself, so a run's own process never
    imports the adapters (the sample generators pull in the whole raster stack); each worker
    builds the set once.
    """

    path: str
    """Spec file; empty: the packaged default."""

    def load(self) -> SourceSet:
        """The source set (built once per process)."""
        return _cached_source_set(self.path)


def resolve_sources(sources: SourceSet | SourceSetSpecFile) -> SourceSet:
    """A task's source set, whether it was handed over built or by its spec file."""
    return sources.load() if isinstance(sources, SourceSetSpecFile) else sources


__all__ = [
    "FAMILIES",
    "SourceSetSpecFile",
    "build_source_set",
    "load_source_set",
    "resolve_sources",
]
