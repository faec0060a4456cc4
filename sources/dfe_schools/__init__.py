"""The school-capacity reference of the planning task: the Department for Education's School
capacity releases (places and pupils per school and academic year) joined by URN to Get
Information about Schools coordinates (AgenticCity-Bench App. D.1)."""

from sources.dfe_schools.fetch import (
    PRODUCT_ID,
    SchoolSourceOptions,
    fetch_school_item,
    item_records,
)
from sources.dfe_schools.records import read_school_files

__all__ = [
    "PRODUCT_ID",
    "SchoolSourceOptions",
    "fetch_school_item",
    "item_records",
    "read_school_files",
]
