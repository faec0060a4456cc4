"""Make asset hrefs readable: Planetary Computer SAS tokens, then an optional mirror.

Planetary Computer assets live in Azure Blob Storage and are read with a short-lived SAS token
appended as a query string. The token comes from the SAS endpoint of ``planetary_computer``'s
settings (``PC_SDK_SAS_URL``, else the public endpoint) unless the family's options name
another; it is fetched here with a timeout under the family's retry policy (the package's own
``get_token`` waits without a timeout and retries for minutes), parsed and applied with the
package's ``SASToken``. Tokens are secrets: signed hrefs are used only to open files, never
written anywhere, and :meth:`HrefSigner.redact` strips them from any message.

Offline, nothing is signed and no token is fetched: an href is opened through a ``mirror``
prefix, else from ``mirror_dir`` laid out as ``<mirror>/<host>/<path>`` (the download
manager's layout); an href neither covers fails with ``OfflineRecordError``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from urllib.parse import urlparse, urlsplit

import requests
from planetary_computer.sas import BLOB_STORAGE_DOMAIN, SASToken
from planetary_computer.settings import Settings
from planetary_computer.utils import parse_blob_url

from citycube.errors import OfflineRecordError, SourceFetchError
from sources.retries import parse_retry_after
from sources.stac.redaction import without_url_queries
from sources.stac.retrying import (
    RetryPolicy,
    TransientError,
    is_transient_requests_error,
)
from sources.stac.spec import Signing

TOKEN_MIN_TTL_S = 300.0
"""A cached token with less life left than this is fetched again."""


class HrefSigner:
    """Signs hrefs for one signing scheme and rewrites them onto a mirror."""

    def __init__(
        self,
        signing: Signing,
        policy: RetryPolicy,
        *,
        sas_url: str | None = None,
        mirror: dict[str, str] | None = None,
        timeout: tuple[float, float] = (10.0, 30.0),
        offline: bool = False,
        mirror_dir: Path | None = None,
    ) -> None:
        self.signing = signing
        self.policy = policy
        self.sas_url = (sas_url or Settings.get().sas_url or "").rstrip("/")
        self.mirror = dict(mirror or {})
        self.timeout = timeout
        self.offline = offline
        self.mirror_dir = None if mirror_dir is None else Path(mirror_dir)
        self._tokens: dict[tuple[str, str], SASToken] = {}
        self._lock = threading.Lock()

    def sign(self, href: str) -> str:
        """The href to open: signed when it is in blob storage, then mirrored (offline: the
        mirror copy, unsigned)."""
        if self.offline:
            return self.offline_copy(href)
        signed = href
        if self.signing is Signing.PLANETARY_COMPUTER:
            parsed = urlparse(href)
            if parsed.netloc.endswith(BLOB_STORAGE_DOMAIN) and not parsed.query:
                account, container = parse_blob_url(parsed)
                signed = self._token(account, container).sign(href).href
        for prefix, replacement in self.mirror.items():
            if signed.startswith(prefix):
                return replacement + signed[len(prefix) :]
        return signed

    def offline_copy(self, href: str) -> str:
        """Where an href is read offline: through a ``mirror`` prefix, else
        ``<mirror_dir>/<host>/<path>``."""
        for prefix, replacement in self.mirror.items():
            if href.startswith(prefix):
                return replacement + href[len(prefix) :]
        copy = None
        if self.mirror_dir is not None:
            parts = urlsplit(href)
            copy = self.mirror_dir / parts.netloc / parts.path.lstrip("/")
            if copy.exists():
                return str(copy)
        where = f"expected at {copy}" if copy is not None else "no mirror_dir is set"
        raise OfflineRecordError(
            f"offline: {self.redact(href)} is not in the mirror ({where}); copy it there "
            "(<mirror_dir>/<host>/<path>) or build online",
            reason="asset_not_mirrored",
        )

    def redact(self, text: str) -> str:
        """``text`` without any token this signer handed out (and without URL queries)."""
        with self._lock:
            tokens = [t.token for t in self._tokens.values()]
        for token in tokens:
            text = text.replace(token, "<sas-token>")
        return without_url_queries(text)

    def _token(self, account: str, container: str) -> SASToken:
        key = (account, container)
        with self._lock:
            token = self._tokens.get(key)
        if token is not None and token.ttl() > TOKEN_MIN_TTL_S:
            return token
        token = self.policy.call(lambda: self._request_token(account, container))
        with self._lock:
            self._tokens[key] = token
        return token

    def _request_token(self, account: str, container: str) -> SASToken:
        url = f"{self.sas_url}/{account}/{container}"
        key = Settings.get().subscription_key
        headers = {"Ocp-Apim-Subscription-Key": key} if key else None
        try:
            response = requests.get(url, headers=headers, timeout=self.timeout)
            response.raise_for_status()
            return SASToken(**response.json())
        except requests.RequestException as exc:
            if is_transient_requests_error(exc):
                response = getattr(exc, "response", None)
                raise TransientError(
                    f"SAS token for {account}/{container}: {exc}",
                    retry_after=None
                    if response is None
                    else parse_retry_after(response.headers.get("Retry-After")),
                ) from None
            raise SourceFetchError(
                f"the SAS endpoint {self.sas_url} refused a token for {account}/{container}: {exc}",
                transient=False,
                reason="signing_failed",
            ) from None
        except (ValueError, TypeError) as exc:
            raise SourceFetchError(
                f"the SAS endpoint {self.sas_url} answered no token for {account}/{container}",
                transient=False,
                reason="signing_failed",
            ) from exc
