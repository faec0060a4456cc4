"""User-supplied files: a CSV, GeoJSON or Parquet file with a schema file (see
``sources.records.user_schema``), validated row by row before the item is written."""

from __future__ import annotations

import pandas as pd

from sources.records.base import GEOMETRY, Connector, Pager
from sources.records.spec import RecordProductSpec
from sources.records.user_schema import load_user_schema, read_user_file, validate_user_records


class UserFile(Connector):
    """The rows of a user-supplied file; the endpoint handed over is its schema file."""

    def rows(self, spec: RecordProductSpec, year: int, pager: Pager, endpoint: str) -> pd.DataFrame:
        """Read the data file, validate it against the schema, hand rows (and geometry) on."""
        _, data, schema = load_user_schema(endpoint)
        frame, kind = read_user_file(data)
        validate_user_records(frame, schema, data, kind)
        out = pd.DataFrame(frame.drop(columns="geometry", errors="ignore"))
        if "geometry" in frame.columns and not spec.fields.geometry:
            geometry = frame.geometry
            if getattr(frame, "crs", None) is not None:
                geometry = frame.to_crs(4326).geometry
            out[GEOMETRY] = list(geometry)
        return out
