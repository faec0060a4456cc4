"""The shared download manager against a real HTTP server on loopback, with scripted faults."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from citycube.errors import SourceFetchError, SourceUnavailableError
from sources.downloads import (
    DownloadManager,
    DownloadSettings,
    cache_key,
    parse_retry_after,
    redact_url,
)
from tests.faulty_http_server import Fault, FaultyServer

BODY = bytes(range(256)) * 400  # 100 KiB, every byte position distinguishable


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def server() -> Iterator[FaultyServer]:
    with FaultyServer() as running:
        yield running


def manager(tmp_path: Path, **overrides: object) -> DownloadManager:
    settings = {
        "cache_dir": tmp_path / "cache",
        "attempts": 4,
        "total_s": 20.0,
        "wait_initial_s": 0.01,
        "wait_max_s": 0.05,
        "timeout_s": 1.0,
        "chunk_bytes": 4096,
        **overrides,
    }
    return DownloadManager(DownloadSettings(**settings))  # type: ignore[arg-type]


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_a_download_is_verified_cached_and_never_fetched_again(
    tmp_path: Path, server: FaultyServer
) -> None:
    url = server.add("ghsl/tile.tif", BODY)
    first = manager(tmp_path).fetch(url, sha256=sha(BODY))
    assert first.path.read_bytes() == BODY and not first.from_cache
    assert first.path.relative_to(tmp_path / "cache").parts[:2] == ("sha256", sha(BODY)[:2])

    again = manager(tmp_path).fetch(url)  # a new manager: the cache is on disk
    assert again.from_cache and again.path == first.path
    assert len(server.requests_for("ghsl/tile.tif")) == 1


def test_the_same_bytes_under_another_url_come_from_the_cache(
    tmp_path: Path, server: FaultyServer
) -> None:
    first = server.add("a/tile.tif", BODY)
    second = server.add("mirror/tile.tif", BODY)
    manager(tmp_path).fetch(first, sha256=sha(BODY))
    found = manager(tmp_path).fetch(second, sha256=sha(BODY))
    assert found.from_cache and server.requests_for("mirror/tile.tif") == []


def test_a_wrong_checksum_fails_and_leaves_nothing_that_looks_complete(
    tmp_path: Path, server: FaultyServer
) -> None:
    url = server.add("odiac/2019.tif", BODY)
    with pytest.raises(SourceFetchError, match="sha256") as raised:
        manager(tmp_path).fetch(url, sha256="0" * 64)
    assert not raised.value.transient
    cache = tmp_path / "cache"
    assert not (cache / "sha256").exists() or files_under(cache / "sha256") == []
    assert not (cache / "urls").exists()
    assert not list((cache / "partial").glob("*.part"))


def test_server_errors_are_retried_until_the_file_comes(
    tmp_path: Path, server: FaultyServer
) -> None:
    url = server.add("viirs/2020.tif", BODY, Fault(status=500), Fault(status=503))
    got = manager(tmp_path).fetch(url)
    assert got.path.read_bytes() == BODY
    assert len(server.requests_for("viirs/2020.tif")) == 3


def test_retry_after_is_honoured(tmp_path: Path, server: FaultyServer) -> None:
    url = server.add("chelsa/tas.tif", BODY, Fault(status=429, headers={"Retry-After": "1"}))
    manager(tmp_path).fetch(url)
    first, second = server.requests_for("chelsa/tas.tif")
    # Back-off alone would wait at most wait_max_s = 0.05 s.
    assert second.at - first.at >= 0.9


def test_a_retry_after_beyond_the_retry_bound_fails_at_once_saying_so(
    tmp_path: Path, server: FaultyServer
) -> None:
    url = server.add("chelsa/pr.tif", BODY, Fault(status=429, headers={"Retry-After": "120"}))
    with pytest.raises(SourceFetchError, match="asked to retry after 120 s") as raised:
        manager(tmp_path).fetch(url)
    assert raised.value.transient
    assert len(server.requests_for("chelsa/pr.tif")) == 1


def test_client_errors_fail_at_once(tmp_path: Path, server: FaultyServer) -> None:
    url = server.add("private/file.tif", BODY, Fault(status=403))
    with pytest.raises(SourceFetchError, match="HTTP 403") as raised:
        manager(tmp_path).fetch(url)
    assert not raised.value.transient
    assert len(server.requests_for("private/file.tif")) == 1


def test_a_dropped_connection_is_resumed_with_a_range_request(
    tmp_path: Path, server: FaultyServer
) -> None:
    url = server.add("glc/2015.tif", BODY, Fault(drop_after=30_000))
    got = manager(tmp_path).fetch(url, sha256=sha(BODY))
    assert got.path.read_bytes() == BODY
    first, second = server.requests_for("glc/2015.tif")
    assert first.range is None
    assert second.range is not None and second.if_range is not None
    resumed_from = int(second.range.removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_from <= 30_000  # only what had not arrived was asked for again


def test_a_server_that_ignores_range_restarts_the_file(
    tmp_path: Path, server: FaultyServer
) -> None:
    url = server.add("hilda/2019.nc", BODY, Fault(drop_after=50_000), Fault(ignore_range=True))
    got = manager(tmp_path).fetch(url, sha256=sha(BODY))
    assert got.path.read_bytes() == BODY  # not the first 50 kB twice


def test_a_stalled_server_times_out_and_is_retried(tmp_path: Path, server: FaultyServer) -> None:
    url = server.add("acag/no2.nc", BODY, Fault(stall_s=1.5))
    got = manager(tmp_path, timeout_s=0.3).fetch(url)
    assert got.path.read_bytes() == BODY
    assert len(server.requests_for("acag/no2.nc")) == 2


def test_exhausted_retries_keep_the_partial_file_for_the_next_run(
    tmp_path: Path, server: FaultyServer
) -> None:
    url = server.add("ghs/pop.tif", BODY, *[Fault(drop_after=20_000)] * 2)
    with pytest.raises(SourceFetchError, match="next run resumes") as raised:
        manager(tmp_path, attempts=2).fetch(url)
    assert raised.value.transient
    assert manager(tmp_path).cached_path(url) is None  # nothing looks complete

    got = manager(tmp_path).fetch(url, sha256=sha(BODY))  # the next run
    assert got.path.read_bytes() == BODY
    last = server.requests_for("ghs/pop.tif")[-1]
    assert last.range is not None and int(last.range[6:].rstrip("-")) >= 20_000


def test_an_interrupted_download_is_never_installed(tmp_path: Path, server: FaultyServer) -> None:
    url = server.add("big/file.bin", BODY)

    def interrupt(done: int, total: int | None) -> None:
        if done > 40_000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        manager(tmp_path).fetch(url, progress=interrupt)
    assert manager(tmp_path).cached_path(url) is None
    got = manager(tmp_path).fetch(url)
    assert got.path.read_bytes() == BODY


def test_offline_mode_reads_the_cache_then_the_mirror_and_never_the_network(
    tmp_path: Path, server: FaultyServer
) -> None:
    cached_url = server.add("cached.tif", BODY)
    manager(tmp_path).fetch(cached_url)
    mirror = tmp_path / "mirror"
    mirrored_url = "https://data.example.org/ghsl/GHS_POP_E2020.tif?token=s3cr3t"
    copy = mirror / "data.example.org" / "ghsl" / "GHS_POP_E2020.tif"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(BODY[:1000])
    offline = manager(tmp_path, offline=True, mirror_dir=mirror)
    before = len(server.requests)

    assert offline.fetch(cached_url).from_cache
    assert offline.fetch(mirrored_url, sha256=sha(BODY[:1000])).path == copy
    with pytest.raises(SourceUnavailableError, match="offline") as missing:
        offline.fetch("https://data.example.org/ghsl/other.tif?token=s3cr3t")
    assert missing.value.reason == "source_offline"
    assert "s3cr3t" not in str(missing.value)
    with pytest.raises(SourceFetchError, match="damaged or out of date"):
        offline.fetch(mirrored_url, sha256=sha(b"newer release"))
    assert len(server.requests) == before


def test_tokens_never_reach_logs_errors_or_the_cache(
    tmp_path: Path, server: FaultyServer, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sv=2024&sig=TOPSECRET"
    url = server.add("signed/tile.tif", BODY, Fault(status=500)) + "?" + secret + "&v=2"
    caplog.set_level(logging.INFO, logger="sources.downloads")
    got = manager(tmp_path).fetch(url, headers={"Authorization": "Bearer HEADERSECRET"})
    assert "TOPSECRET" not in got.url and "v=2" in got.url
    assert server.requests_for("signed/tile.tif")[0].authorization == "Bearer HEADERSECRET"
    for path in files_under(tmp_path / "cache"):
        if path.suffix == ".json":
            text = path.read_text()
            assert "TOPSECRET" not in text and "HEADERSECRET" not in text
    assert "TOPSECRET" not in caplog.text and "HEADERSECRET" not in caplog.text
    assert "signed/tile.tif" in caplog.text  # the log does name the file

    failing = server.add("signed/gone.tif", BODY, Fault(status=404)) + "?sig=TOPSECRET"
    with pytest.raises(SourceFetchError) as raised:
        manager(tmp_path).fetch(failing)
    assert "TOPSECRET" not in str(raised.value)


def test_a_new_token_for_the_same_file_hits_the_cache(tmp_path: Path, server: FaultyServer) -> None:
    base = server.add("sas/tile.tif", BODY)
    manager(tmp_path).fetch(base + "?sig=first&se=2026-01-01")
    again = manager(tmp_path).fetch(base + "?sig=second&se=2026-02-01")
    assert again.from_cache
    assert cache_key(base + "?sig=a") == cache_key(base + "?sig=b") != cache_key(base + "?x=1")


def test_downloads_per_host_are_bounded(tmp_path: Path, server: FaultyServer) -> None:
    urls = [server.add(f"slow/{i}.tif", BODY + bytes([i]), Fault(stall_s=0.2)) for i in range(6)]
    downloads = manager(tmp_path, per_host=2)
    threads = [threading.Thread(target=downloads.fetch, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert server.max_in_flight == 2
    assert all(downloads.cached_path(url) is not None for url in urls)


def test_two_workers_fetching_one_file_download_it_once(
    tmp_path: Path, server: FaultyServer
) -> None:
    url = server.add("shared/tile.tif", BODY, Fault(stall_s=0.3))
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(manager(tmp_path).fetch(url)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(server.requests_for("shared/tile.tif")) == 1
    assert sorted(r.from_cache for r in results) == [False, True]


def test_the_url_index_records_digest_and_size(tmp_path: Path, server: FaultyServer) -> None:
    url = server.add("index/tile.tif", BODY)
    manager(tmp_path).fetch(url)
    (index,) = (tmp_path / "cache" / "urls").rglob("*.json")
    assert json.loads(index.read_text()) == {"url": url, "sha256": sha(BODY), "size": len(BODY)}


def test_redaction_and_retry_after_parsing() -> None:
    shown = redact_url("https://user:pw@host/p.tif?token=abc&year=2020")
    assert shown == "https://host/p.tif?token=***&year=2020"
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
