"""The interface every source backend implements, real adapters and the sample backend alike."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SourceItem:
    """Files fetched for one (product, city, source year), ready to read from local disk."""

    product: str
    """Product id, e.g. 'odiac'."""
    city: str
    """City key."""
    source_year: int | None
    """The year the source labels the data with; None for static products."""
    files: dict[str, Path]
    """Local files by role: 'data' always; 'qa' for products with a QA band."""
    source_id: str
    """Who produced it, e.g. 'sample:odiac' or 'odiac'."""
    version: str
    """Product version string."""
    synthetic: bool
    """True when the data are generated, not observed."""
    extra: dict[str, str] = field(default_factory=dict)
    """Product-specific metadata (scene id, units, ...)."""


class SourceBackend(ABC):
    """Fetches source products for a city onto local disk, in each product's native form."""

    name: str
    """Backend name, e.g. 'sample'."""

    @abstractmethod
    def products(self) -> list[str]:
        """Product ids this backend serves."""

    @abstractmethod
    def source_years(self, product: str, city: str) -> list[int] | None:
        """Years the product covers for a city; None for a static product."""

    @abstractmethod
    def fetch(self, product: str, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Make the item's files exist under ``dest`` and describe them.

        Idempotent: a complete earlier fetch is reused. Raises ``SourceUnavailableError`` when
        the product does not cover the request, ``SourceFetchError`` when a server fails.
        """
