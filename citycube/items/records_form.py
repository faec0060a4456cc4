"""The one normalised form every records connector writes, which the core turns into tiles.

The contract between the ``records`` source family (``sources/records``) and the core
(``citycube.processing.records``): the columns of a records file and the spatial forms a
record can take.
"""

from __future__ import annotations

from enum import StrEnum

RECORD_COLUMNS = ("year", "value", "geometry", "postcode", "unit_id")
"""Columns of a normalised records file: the record's year, its value in the declared unit,
and one location column per spatial form (WKB geometry in EPSG:4326, a postcode key, an
administrative unit key); the columns a form does not use are null."""


class SpatialForm(StrEnum):
    """Where a record lies, and so how it reaches the tiles."""

    point = "point"
    """A point (a building, a sale's address): summed or averaged inside the tile."""
    parcel = "parcel"
    """A parcel polygon: intersected with tiles and weighted by the intersected area."""
    postcode = "postcode"
    """A postcode or address key joined to a declared point table (e.g. postcode centroids)."""
    admin_unit = "admin_unit"
    """An administrative unit: its value apportioned to tiles by the unit's area share."""


__all__ = ["RECORD_COLUMNS", "SpatialForm"]
