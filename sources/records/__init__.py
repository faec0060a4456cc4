"""The ``records`` adapter family: city records of property values and electricity use from
their portals (ArcGIS REST, Socrata SODA, bulk CSV and xlsx files, the NSW bulk sales
archives, paged JSON APIs, user-supplied files), and the World Bank CPI and PPP series that
convert money.

Which portal serves which city is data (``schemas/record_products.yaml``, validated by
``sources.records.spec``); one module per protocol pages a city-year's rows out of its portal,
and every item is written in one normalised form that the core reads by spatial form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from citycube.items.protocol import SourceProduct
from sources.downloads import SECRET_PARAMS, DownloadManager
from sources.records.arcgis import ArcGisQuery
from sources.records.base import Connector, RecordSource
from sources.records.bulk_table import BulkCsv, BulkXlsx
from sources.records.json_api import JsonApi
from sources.records.nsw_psi import NswPsiDat
from sources.records.options import RecordsFamilyOptions
from sources.records.socrata import SodaResource
from sources.records.spec import RECORD_PRODUCTS, Protocol, RecordProductSpec, load_record_products
from sources.records.user_file import UserFile
from sources.records.user_schema import load_user_schema
from sources.records.worldbank import WorldBankIndicators

CONNECTORS: dict[str, Connector] = {
    Protocol.arcgis.value: ArcGisQuery(),
    Protocol.socrata.value: SodaResource(),
    Protocol.bulk_csv.value: BulkCsv(),
    Protocol.bulk_xlsx.value: BulkXlsx(),
    Protocol.nsw_psi_dat.value: NswPsiDat(),
    Protocol.json_api.value: JsonApi(),
    Protocol.user_file.value: UserFile(),
}
"""Connector per protocol."""


def records_adapters(options: Mapping[str, Any]) -> list[SourceProduct]:
    """The family's adapters for a source-set's ``options: {records: …}``."""
    try:
        parsed = RecordsFamilyOptions.model_validate(dict(options))
    except ValidationError as exc:
        raise ValueError(f"invalid records options: {exc}") from exc
    specs = load_record_products(parsed.spec_file)
    user_files: dict[tuple[str, str], Path] = {}
    for schema_path in parsed.user_files:
        spec, _, _ = load_user_schema(schema_path)
        specs[spec.key] = spec
        user_files[spec.key] = Path(schema_path).resolve()
    unknown = sorted(k for k in parsed.endpoints if tuple(k.split("/", 1)) not in specs)
    if unknown:
        raise ValueError(f"records endpoints name undeclared (product/city) pairs {unknown}")
    secrets = SECRET_PARAMS | {s.token_param.lower() for s in specs.values() if s.token_param}
    manager = DownloadManager(replace(parsed.download_settings(), secret_params=secrets))
    adapters: list[SourceProduct] = []
    for product in RECORD_PRODUCTS:
        by_city: dict[str, RecordProductSpec] = {
            city: spec for (p, city), spec in specs.items() if p == product
        }
        files = {city: path for (p, city), path in user_files.items() if p == product}
        adapters.append(
            RecordSource(product, by_city, CONNECTORS, manager, parsed.endpoints, files)
        )
    adapters.append(WorldBankIndicators(manager, parsed.worldbank_api, parsed.worldbank_per_page))
    return adapters


__all__ = ["CONNECTORS", "RecordsFamilyOptions", "records_adapters"]
