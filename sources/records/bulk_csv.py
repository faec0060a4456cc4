"""Bulk CSV downloads: one (optionally gzipped) file per year, or one file with a year column.

UK Price Paid publishes ``pp-<year>.csv`` without a header; geo-DVF publishes
``<year>/departements/<dep>.csv.gz`` with one. The file goes through the shared download
manager (cache, resume, retries) and is read as text, so codes such as postcodes keep their
leading zeros; the spec's ``row_filter`` cuts a national file to the city.
"""

from __future__ import annotations

import gzip
import io
import zlib

import pandas as pd

from citycube.errors import SourceReadError
from citycube.record_spec import RecordProductSpec
from sources.downloads import redact_url
from sources.records.base import Connector, Pager


class BulkCsv(Connector):
    """The year's rows of a bulk file."""

    def rows(self, spec: RecordProductSpec, year: int, pager: Pager, endpoint: str) -> pd.DataFrame:
        """Download the file and read it as text columns."""
        url = endpoint.format(year=year)
        body = pager.get_bytes(url)
        layout = spec.csv
        try:
            if url.split("?")[0].endswith(".gz"):
                body = gzip.decompress(body)
            return pd.read_csv(
                io.BytesIO(body),
                sep=layout.delimiter if layout else ",",
                header=0 if layout is None or layout.header else None,
                names=list(layout.columns) if layout and not layout.header else None,
                dtype=str,
                keep_default_na=False,
                na_values=[""],
                encoding=layout.encoding if layout else "utf-8",
            )
        except (OSError, EOFError, zlib.error, ValueError, pd.errors.ParserError) as exc:
            pager.manager.discard(url)
            raise SourceReadError(
                f"{pager.source_name}: {pager.city} {year}: {redact_url(url)} is not a readable "
                f"CSV ({exc}); it was dropped from the download cache"
            ) from None
