"""The download manager every HTTP-served source shares.

Downloading gridded products (GHSL tiles, ODIAC months, VIIRS composites, …) needs the same
care whoever serves them, so it lives here once, on well-kept libraries: ``httpx`` speaks HTTP,
``stamina`` retries (through the families' one policy, :mod:`sources.retries`), ``filelock``
keeps two workers off the same file, ``tqdm`` draws progress.

- **Content-addressed cache.** A finished file lives at ``cache/sha256/<ab>/<digest>``; a small
  index per URL (secrets stripped) names its digest, so a rerun downloads nothing and two URLs
  of the same bytes share one file.
- **Atomic installs.** Bytes go to ``cache/partial/<key>.part``; only a file whose size (and
  checksum, when one is declared) checks out is moved into the cache, so an interrupted
  download never leaves a file that looks complete.
- **Resume.** A later attempt (a retry, or the next run) continues a partial file with an HTTP
  ``Range`` request guarded by ``If-Range``; a server that answers with the whole file restarts
  it.
- **Retries.** Timeouts, dropped connections, 429 and 5xx are retried with exponential back-off
  and jitter, bounded in attempts and total time; a 429 or 503 with ``Retry-After`` waits as
  long as the server asks (within the same bound). Anything else fails at once
  (:mod:`sources.retries`, the policy every family shares).
- **Politeness.** At most ``per_host`` downloads run against one host at a time, per process.
- **Offline mirror.** With ``offline=True`` nothing touches the network: files come from the
  cache or from a mirror laid out as ``<mirror>/<host>/<path>``.
- **Secrets.** Tokens in query strings (``secret_params``) and headers never reach logs, error
  messages or the index.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tqdm import tqdm

from citycube.errors import SourceFetchError, SourceUnavailableError
from citycube.io.atomic import fsync_path, write_text_atomic
from sources.retries import TRANSIENT_STATUS, RetryPolicy, TransientError, parse_retry_after

log = logging.getLogger(__name__)

SECRET_PARAMS = frozenset(
    {"token", "access_token", "api_key", "apikey", "key", "sig", "se", "st", "sp", "sv", "sr",
     "skoid", "sktid", "skt", "ske", "sks", "skv", "spr", "signature"}
)  # fmt: skip
"""Query parameters that carry credentials (OAuth, API keys, Azure SAS tokens)."""

ProgressFn = Callable[[int, int | None], None]
"""Called with (bytes so far, total bytes or None) as a download goes."""


@dataclass(frozen=True)
class DownloadSettings:
    """Where files go and how patient the manager is."""

    cache_dir: Path
    """Root of the content-addressed cache (``sha256/``, ``urls/``, ``partial/``)."""
    mirror_dir: Path | None = None
    """A local mirror laid out as ``<mirror>/<host>/<path>``, read in offline mode."""
    offline: bool = False
    """Never touch the network: cache, then mirror, else a clear error."""
    per_host: int = 4
    """Concurrent downloads per host in this process."""
    attempts: int = 6
    """Tries per file, the first included."""
    total_s: float = 600.0
    """Bound on the time of all tries of one file together (waits included)."""
    wait_initial_s: float = 1.0
    """First back-off wait."""
    wait_max_s: float = 60.0
    """Longest back-off wait (a server's Retry-After may ask for more, within ``total_s``)."""
    timeout_s: float = 60.0
    """Connect and read timeout of one request."""
    chunk_bytes: int = 1 << 20
    """Bytes read per chunk."""
    progress_min_bytes: int = 64 << 20
    """Files at least this large get a progress bar on a terminal."""
    secret_params: frozenset[str] = field(default_factory=lambda: SECRET_PARAMS)
    """Query parameters stripped from logs, errors and cache keys."""

    def __post_init__(self) -> None:
        if self.per_host < 1 or self.attempts < 1:
            raise ValueError("per_host and attempts must be at least 1")

    def retry_policy(self) -> RetryPolicy:
        """The shared retry policy with these settings' attempts and waits."""
        return RetryPolicy(self.attempts, self.total_s, self.wait_initial_s, self.wait_max_s)


DEFAULT_CACHE_ENV = "CITYCUBE_DOWNLOAD_CACHE"
"""Environment variable naming the download cache when a family's options do not."""


class DownloadOptions(BaseModel):
    """The download settings an adapter family takes from its source-set ``options``.

    Families that download through the manager (``http``, ``osm``) extend this with their own
    settings, and may change the defaults (OSM asks for one connection per host).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    cache_dir: Path | None = Field(
        default=None,
        description="Download cache root; default $CITYCUBE_DOWNLOAD_CACHE, else "
        "$CITYCUBE_DATA/downloads, else ./data/downloads.",
    )
    mirror_dir: Path | None = Field(
        default=None, description="Offline mirror laid out as <mirror>/<host>/<path>."
    )
    offline: bool = Field(default=False, description="Never touch the network.")
    per_host: int = Field(default=2, ge=1, description="Concurrent downloads per host.")
    attempts: int = Field(default=6, ge=1, description="Tries per file, the first included.")
    total_s: float = Field(default=1800.0, gt=0, description="Bound on all tries of one file.")
    wait_initial_s: float = Field(default=1.0, gt=0, description="First back-off wait.")
    wait_max_s: float = Field(default=60.0, gt=0, description="Longest back-off wait.")
    timeout_s: float = Field(default=60.0, gt=0, description="Timeout of one request.")
    chunk_bytes: int = Field(default=1 << 20, ge=1024, description="Bytes written per chunk.")

    @model_validator(mode="after")
    def _mirror_exists(self) -> Self:
        if self.mirror_dir is not None and not Path(self.mirror_dir).is_dir():
            raise ValueError(f"mirror_dir {self.mirror_dir} is not a directory")
        return self

    def resolved_cache_dir(self) -> Path:
        """The download cache root (options, then environment, then the data root)."""
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        if os.environ.get(DEFAULT_CACHE_ENV):
            return Path(os.environ[DEFAULT_CACHE_ENV])
        return Path(os.environ.get("CITYCUBE_DATA", "data")) / "downloads"

    def download_settings(self) -> DownloadSettings:
        """The download manager's settings these options describe."""
        return DownloadSettings(
            cache_dir=self.resolved_cache_dir(),
            mirror_dir=self.mirror_dir,
            offline=self.offline,
            per_host=self.per_host,
            attempts=self.attempts,
            total_s=self.total_s,
            wait_initial_s=self.wait_initial_s,
            wait_max_s=self.wait_max_s,
            timeout_s=self.timeout_s,
            chunk_bytes=self.chunk_bytes,
        )


@dataclass(frozen=True)
class Downloaded:
    """A file in the cache (or the offline mirror)."""

    path: Path
    """Where its bytes are; never a partial file."""
    sha256: str
    """Digest of its bytes."""
    size: int
    """Bytes."""
    url: str
    """The URL it came from, secrets removed."""
    from_cache: bool
    """True when nothing was downloaded for this call."""


class _Restart(Exception):
    """The partial file cannot be continued (the server's copy changed); start again."""


def redact_url(url: str, secret_params: Iterable[str] = SECRET_PARAMS) -> str:
    """The URL with credential query values replaced by ``***`` (for logs and errors)."""
    secrets = {p.lower() for p in secret_params}
    parts = urlsplit(url)
    query = [
        (k, "***" if k.lower() in secrets else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    netloc = parts.netloc.rpartition("@")[2]  # drop user:password@
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe="*"), ""))


def cache_key(url: str, secret_params: Iterable[str] = SECRET_PARAMS) -> str:
    """Identity of a URL's content: the URL without its credentials (a new token, same file)."""
    secrets = {p.lower() for p in secret_params}
    parts = urlsplit(url)
    query = sorted(
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if k.lower() not in secrets
    )
    bare = urlunsplit(
        (parts.scheme, parts.netloc.rpartition("@")[2], parts.path, urlencode(query), "")
    )
    return hashlib.sha256(bare.encode()).hexdigest()


_host_slots: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_host_slots_lock = threading.Lock()


def host_slot(host: str, limit: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore bounding concurrent requests to ``host`` (downloads here,
    window reads of the STAC family)."""
    with _host_slots_lock:
        return _host_slots.setdefault((host, limit), threading.BoundedSemaphore(limit))


class DownloadManager:
    """Fetches URLs into a content-addressed cache; see the module docstring for guarantees."""

    def __init__(self, settings: DownloadSettings, client: httpx.Client | None = None) -> None:
        self.settings = settings
        self._client = client
        self.root = Path(settings.cache_dir)

    # -- public ---------------------------------------------------------------------------

    def fetch(
        self,
        url: str,
        *,
        sha256: str | None = None,
        headers: Mapping[str, str] | None = None,
        progress: ProgressFn | None = None,
    ) -> Downloaded:
        """The file at ``url``, from the cache when it is there, else downloaded into it.

        ``sha256``, when the product publishes one, is checked before the file is installed
        and lets a cached copy be found under any URL. ``headers`` (e.g. an Authorization
        token) are sent but never recorded. Raises ``SourceFetchError`` when the server
        fails (``transient`` when retries ran out on a transient failure) and
        ``SourceUnavailableError`` in offline mode when neither cache nor mirror has it.
        """
        shown = redact_url(url, self.settings.secret_params)
        key = cache_key(url, self.settings.secret_params)
        expected = sha256.lower() if sha256 else None
        cached = self._cached(key, expected, shown)
        if cached is not None:
            return cached
        if self.settings.offline:
            return self._from_mirror(url, shown, expected)
        partial = self._partial(key)
        partial.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(partial) + ".lock"):
            cached = self._cached(key, expected, shown)  # another worker may have finished it
            if cached is not None:
                return cached
            host = urlsplit(url).netloc.rpartition("@")[2]
            with host_slot(host, self.settings.per_host):
                digest, size = self._download_with_retries(
                    url, shown, partial, expected, headers or {}, progress
                )
            return self._install(key, partial, digest, size, shown)

    def cached_path(self, url: str) -> Path | None:
        """The cached file of a URL, if one was installed."""
        found = self._cached(cache_key(url, self.settings.secret_params), None, url)
        return found.path if found else None

    def discard(self, url: str) -> None:
        """Forget a URL's cached file (e.g. one found corrupt), so the next fetch downloads it."""
        key = cache_key(url, self.settings.secret_params)
        index = self._index(key)
        try:
            record = json.loads(index.read_text(encoding="utf-8"))
            digest = str(record["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        index.unlink(missing_ok=True)
        self._blob(digest).unlink(missing_ok=True)

    # -- cache ----------------------------------------------------------------------------

    def _blob(self, digest: str) -> Path:
        return self.root / "sha256" / digest[:2] / digest

    def _index(self, key: str) -> Path:
        return self.root / "urls" / key[:2] / f"{key}.json"

    def _partial(self, key: str) -> Path:
        return self.root / "partial" / f"{key}.part"

    def _cached(self, key: str, expected: str | None, shown: str) -> Downloaded | None:
        if expected is not None:
            blob = self._blob(expected)
            if blob.is_file():
                return Downloaded(blob, expected, blob.stat().st_size, shown, True)
        try:
            record = json.loads(self._index(key).read_text(encoding="utf-8"))
            digest, size = str(record["sha256"]), int(record["size"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        blob = self._blob(digest)
        if expected is not None and digest != expected:
            return None  # the product now names other bytes: fetch them
        try:
            if blob.stat().st_size != size:
                return None
        except OSError:
            return None
        return Downloaded(blob, digest, size, shown, True)

    def _install(self, key: str, partial: Path, digest: str, size: int, shown: str) -> Downloaded:
        """Move a verified partial file into the cache, then record its URL (both atomic)."""
        blob = self._blob(digest)
        blob.parent.mkdir(parents=True, exist_ok=True)
        fsync_path(partial)
        os.replace(partial, blob)  # the verified download, complete: published by one rename
        _meta_path(partial).unlink(missing_ok=True)
        record = {"url": shown, "sha256": digest, "size": size}
        write_text_atomic(json.dumps(record, indent=2), self._index(key))
        log.info("downloaded %s (%d bytes, sha256 %s)", shown, size, digest[:12])
        return Downloaded(blob, digest, size, shown, False)

    def _from_mirror(self, url: str, shown: str, expected: str | None) -> Downloaded:
        parts = urlsplit(url)
        mirror = self.settings.mirror_dir
        candidate = None if mirror is None else Path(mirror) / parts.netloc / parts.path.lstrip("/")
        if candidate is None or not candidate.is_file():
            where = f"mirror {mirror}" if mirror else "no mirror configured"
            raise SourceUnavailableError(
                f"offline: {shown} is neither in the download cache {self.root} nor in the "
                f"{where} (expected at {candidate})",
                reason="source_offline",
            )
        digest, size = _digest_file(candidate)
        if expected is not None and digest != expected:
            raise SourceFetchError(
                f"offline mirror copy {candidate} of {shown} has sha256 {digest}, the product "
                f"declares {expected}: the mirror is damaged or out of date",
                transient=False,
            )
        return Downloaded(candidate, digest, size, shown, True)

    # -- network --------------------------------------------------------------------------

    def _download_with_retries(
        self,
        url: str,
        shown: str,
        partial: Path,
        expected: str | None,
        headers: Mapping[str, str],
        progress: ProgressFn | None,
    ) -> tuple[str, int]:
        s = self.settings

        def failed(exc: TransientError, attempt: int) -> None:
            log.warning("download of %s, attempt %d: %s", shown, attempt, exc)

        try:
            return s.retry_policy().call(
                lambda: self._download_once(url, shown, partial, headers, progress, expected),
                on_failure=failed,
            )
        except TransientError as exc:
            raise SourceFetchError(
                f"download of {shown} failed after {s.attempts} attempts or {s.total_s:.0f} s: "
                f"{exc}; the partial file is kept and the next run resumes it",
                transient=True,
            ) from None

    def _download_once(
        self,
        url: str,
        shown: str,
        partial: Path,
        headers: Mapping[str, str],
        progress: ProgressFn | None,
        expected: str | None,
    ) -> tuple[str, int]:
        """One request: continue ``partial`` (or start it) and return (sha256, size)."""
        try:
            return self._stream(url, shown, partial, headers, progress, expected, resume=True)
        except _Restart:
            _discard_partial(partial)
            return self._stream(url, shown, partial, headers, progress, expected, resume=False)

    def _stream(
        self,
        url: str,
        shown: str,
        partial: Path,
        headers: Mapping[str, str],
        progress: ProgressFn | None,
        expected: str | None,
        *,
        resume: bool,
    ) -> tuple[str, int]:
        have = partial.stat().st_size if resume and partial.exists() else 0
        meta = _read_meta(partial) if have else {}
        request_headers = dict(headers)
        validator = meta.get("etag") or meta.get("last_modified")
        if have and validator:
            request_headers["Range"] = f"bytes={have}-"
            request_headers["If-Range"] = validator
        elif have:
            have = 0  # nothing to prove the server's copy is the same: start again
        client = self._client or _shared_client(self.settings.timeout_s)
        try:
            with client.stream("GET", url, headers=request_headers) as response:
                status = response.status_code
                if status in TRANSIENT_STATUS:
                    wait = parse_retry_after(response.headers.get("Retry-After"))
                    raise TransientError(f"HTTP {status}", retry_after=wait)
                if status == 416 and have:
                    raise _Restart()
                if status >= 400:
                    raise SourceFetchError(
                        f"{shown} answered HTTP {status}; not retried",
                        transient=False,
                        status=status,
                    )
                if status == 206:
                    start, total = _content_range(response.headers.get("Content-Range"))
                    if start != have:
                        raise _Restart()
                    mode = "ab"
                else:  # 200: the whole file, whatever was asked
                    have, mode = 0, "wb"
                    length = response.headers.get("Content-Length")
                    total = int(length) if length and length.isdigit() else None
                _write_meta(partial, response.headers)
                done = have
                with (
                    open(partial, mode) as out,
                    _progress_bar(shown, total, have, self.settings, progress) as report,
                ):
                    for chunk in response.iter_bytes(self.settings.chunk_bytes):
                        out.write(chunk)
                        done += len(chunk)
                        report(done)
        except httpx.TimeoutException as exc:
            raise TransientError(f"timed out ({type(exc).__name__})") from None
        except (httpx.TransportError, httpx.StreamError) as exc:
            detail = str(exc).replace(url, shown)
            raise TransientError(f"connection failed ({type(exc).__name__}: {detail})") from None
        if total is not None and done != total:
            raise TransientError(f"connection closed after {done} of {total} bytes")
        digest, size = _digest_file(partial)
        if expected is not None and digest != expected:
            _discard_partial(partial)
            raise SourceFetchError(
                f"{shown}: downloaded {size} bytes with sha256 {digest}, the product declares "
                f"{expected}; the file was discarded",
                transient=False,
            )
        return digest, size


_clients: dict[float, httpx.Client] = {}
_clients_lock = threading.Lock()


def _shared_client(timeout_s: float) -> httpx.Client:
    """One pooled client per timeout and process (connections are reused across files)."""
    with _clients_lock:
        client = _clients.get(timeout_s)
        if client is None:
            client = httpx.Client(timeout=httpx.Timeout(timeout_s), follow_redirects=True)
            _clients[timeout_s] = client
        return client


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """(first byte, total size) of a ``Content-Range: bytes a-b/n`` header."""
    if not value or not value.startswith("bytes "):
        return None, None
    span, _, total = value.removeprefix("bytes ").partition("/")
    first = span.partition("-")[0]
    return (
        int(first) if first.isdigit() else None,
        int(total) if total.isdigit() else None,
    )


def _meta_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".json")


def _read_meta(partial: Path) -> dict[str, str]:
    try:
        meta = json.loads(_meta_path(partial).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _write_meta(partial: Path, headers: httpx.Headers) -> None:
    """Remember the validators of the server's copy, to resume only the same bytes."""
    meta = {
        "etag": headers.get("ETag") or "",
        "last_modified": headers.get("Last-Modified") or "",
    }
    _meta_path(partial).write_text(json.dumps(meta), encoding="utf-8")


def _discard_partial(partial: Path) -> None:
    partial.unlink(missing_ok=True)
    _meta_path(partial).unlink(missing_ok=True)


def _digest_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


@contextlib.contextmanager
def _progress_bar(
    shown: str,
    total: int | None,
    start: int,
    settings: DownloadSettings,
    progress: ProgressFn | None,
) -> Iterator[Callable[[int], None]]:
    """A reporter of bytes so far: a tqdm bar on a terminal for large files, and ``progress``."""
    large = total is not None and total >= settings.progress_min_bytes
    bar = (
        tqdm(
            total=total,
            initial=start,
            unit="B",
            unit_scale=True,
            desc=shown.rsplit("/", 1)[-1][:40],
            disable=None,  # only on a terminal
            leave=False,
        )
        if large
        else None
    )
    last = [start]

    def report(done: int) -> None:
        if bar is not None:
            bar.update(done - last[0])
        last[0] = done
        if progress is not None:
            progress(done, total)

    try:
        yield report
    finally:
        if bar is not None:
            bar.close()
