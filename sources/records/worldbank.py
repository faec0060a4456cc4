"""World Bank CPI (FP.CPI.TOTL) and PPP conversion factor (PA.NUS.PPP) from the Indicators API v2.

``GET {api}/country/all/indicator/{id}?format=json&per_page=N&page=P&date=2000:2025`` answers
``[page metadata, rows]``; the metadata's ``pages`` says how many pages follow. Every page goes
through the shared download manager (cached, so all cities and reruns share one download per
page; 429 and 5xx retried). The pages are merged into one response per indicator in the API's
own layout, so ``citycube.processing.money`` reads real and sample items alike. The API reports a
bad request as HTTP 200 with ``[{"message": [...]}]``: that fails the fetch by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from citycube.errors import SourceFetchError, SourceReadError
from citycube.items.protocol import SourceInfo, SourceItem, SourceProduct
from citycube.items.staging import StagedFiles, install_item
from sources.downloads import DownloadManager, redact_url

INDICATORS = {"cpi": "FP.CPI.TOTL", "ppp": "PA.NUS.PPP"}
"""Item role → World Bank indicator id."""
DATE_RANGE = "2000:2025"
"""Years asked (the cube's calendar)."""


class WorldBankIndicators(SourceProduct):
    """Both series for every country; the same item content for every city."""

    def __init__(self, manager: DownloadManager, api: str, per_page: int) -> None:
        self.manager = manager
        self.api = api.rstrip("/")
        self.per_page = per_page
        self.info = SourceInfo(
            product_id="worldbank_indicators",
            source_id="worldbank:wdi-api-v2",
            version="WDI (API v2)",
            synthetic=False,
            licence="CC-BY-4.0",
            attribution="World Bank, World Development Indicators (FP.CPI.TOTL, PA.NUS.PPP)",
        )

    def source_years(self, city: str) -> list[int] | None:
        """Static: one download holds every year."""
        return None

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Page both indicators and install them as API v2 responses (roles cpi, ppp, data)."""
        identity = {
            "product": self.product_id,
            "city": city,
            "source_id": self.info.source_id,
            "api": redact_url(self.api),
            "dates": DATE_RANGE,
        }

        def write(staging: Path) -> StagedFiles:
            combined: list[dict[str, Any]] = []
            files: dict[str, str] = {}
            pages: dict[str, int] = {}
            for role, indicator in INDICATORS.items():
                meta, rows = self.series(indicator)
                name = f"worldbank_{indicator}.json"
                (staging / name).write_text(json.dumps([meta, rows]), encoding="utf-8")
                files[role] = name
                combined += rows
                pages[indicator] = int(meta.get("pages", 1))
            both = [{"page": 1, "pages": 1, "total": len(combined)}, combined]
            (staging / "worldbank_indicators.json").write_text(json.dumps(both), encoding="utf-8")
            files["data"] = "worldbank_indicators.json"
            return StagedFiles(files, {"pages": json.dumps(pages)})

        installed = install_item(self.item_dir(city, None, dest), identity, write)
        return self.installed_source_item(installed, city, None)

    def series(self, indicator: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Every page of one indicator: (merged metadata, all rows)."""
        url = f"{self.api}/country/all/indicator/{indicator}"
        rows: list[dict[str, Any]] = []
        page, pages = 1, 1
        meta: dict[str, Any] = {}
        while page <= pages:
            params = {"format": "json", "per_page": self.per_page, "page": page, "date": DATE_RANGE}
            full = f"{url}?" + "&".join(f"{k}={v}" for k, v in params.items())
            got = self.manager.fetch(full)
            try:
                body = json.loads(got.path.read_bytes())
            except ValueError as exc:
                self.manager.discard(full)
                raise SourceReadError(f"{got.url} is not JSON ({exc})") from None
            if not isinstance(body, list) or len(body) < 1 or "message" in (body[0] or {}):
                self.manager.discard(full)
                raise SourceFetchError(
                    f"World Bank API refused {got.url}: {body[0] if body else body}",
                    transient=False,
                )
            meta = dict(body[0])
            pages = int(meta.get("pages") or 1)
            rows += body[1] if len(body) > 1 and body[1] else []
            page += 1
        meta.update({"page": 1, "pages": pages, "per_page": len(rows), "total": len(rows)})
        return meta, rows
