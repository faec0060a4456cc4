"""A small HTTP file server with Range support, for loopback tests of remote reads.

``python -m tests.http_file_server <folder> <request-log> [<faults.json>]`` serves ``folder``
on a free loopback port, prints the port, and appends one line per request: method, path
(without its query string), Range, status, body bytes sent, whether the URL carried a
query (``signed``/``-``) and when the request arrived (Unix seconds).

The optional faults file is read again whenever it changes. It holds a list of rules, each
applied to requests whose path contains ``match``: ``status`` (answer that status, at most
``times`` times, default always, with the rule's ``headers``, e.g. Retry-After), ``delay_s``
(sleep before answering), ``require_query`` (answer 403 unless the query string contains it).
Tests write it to inject server failures.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit


class Faults:
    """The fault rules of a faults file, with their remaining counts."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.stamp: float | None = None
        self.rules: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def matching(self, url_path: str) -> list[dict[str, Any]]:
        """Rules that apply to a path (reloaded when the file changed)."""
        with self.lock:
            if self.path is not None:
                try:
                    stamp = self.path.stat().st_mtime_ns
                except FileNotFoundError:
                    stamp = None
                if stamp != self.stamp:
                    self.stamp = stamp
                    self.rules = json.loads(self.path.read_text(encoding="utf-8")) if stamp else []
            return [r for r in self.rules if r.get("match", "") in url_path]

    def take(self, rule: dict[str, Any]) -> bool:
        """Use one of a status rule's answers; False when it has none left."""
        with self.lock:
            left = rule.get("times")
            if left is None:
                return True
            if left <= 0:
                return False
            rule["times"] = left - 1
            return True


class RangeFileHandler(SimpleHTTPRequestHandler):
    """Serves files with byte ranges, as object stores and COG hosts do."""

    request_log: Path
    faults: Faults = Faults(None)

    def log_message(self, format: str, *args: object) -> None:
        """Requests are logged by ``_log`` with their status and size."""

    def do_GET(self) -> None:
        """Send the file (or its range) and log the bytes that actually left."""
        self._status, self._sent, self._arrived = 0, 0, time.time()
        body = self.send_head()
        if body is None:
            return
        try:
            while chunk := body.read(64 * 1024):
                self.wfile.write(chunk)
                self._sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up early (GDAL does after reading what it needs)
        finally:
            body.close()
            self._log(self._status, self._sent)

    def do_HEAD(self) -> None:
        """Headers only."""
        self._status, self._arrived = 0, time.time()
        body = self.send_head()
        if body is not None:
            body.close()
            self._log(self._status, 0)

    def _log(self, status: int, sent: int) -> None:
        parts = urlsplit(self.path)
        signed = "signed" if parts.query else "-"
        sent = 0 if self.command == "HEAD" else sent
        line = f"{self.command} {parts.path} {self.headers.get('Range') or '-'} {status} {sent}"
        with open(self.request_log, "a", encoding="utf-8") as log:
            log.write(f"{line} {signed} {self._arrived:.3f}\n")

    def _fail(self, status: int, headers: dict[str, str] | None = None) -> None:
        self._log(status, 0)
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def send_head(self) -> BinaryIO | None:
        parts = urlsplit(self.path)
        for rule in self.faults.matching(parts.path):
            if rule.get("delay_s"):
                time.sleep(float(rule["delay_s"]))
            needed = rule.get("require_query")
            if needed and needed not in parts.query:
                self._fail(403)
                return None
            if rule.get("status") and self.faults.take(rule):
                self._fail(int(rule["status"]), rule.get("headers"))
                return None
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self._log(404, 0)
            self.send_error(404)
            return None
        size = path.stat().st_size
        start, stop = 0, size
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            first, _, last = wanted.removeprefix("bytes=").partition("-")
            start = int(first or 0)
            stop = min(size, int(last) + 1) if last else size
            if start >= size:
                self._log(416, 0)
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            self._status = 206
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        else:
            self._status = 200
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(stop - start))
        self.end_headers()
        handle = open(path, "rb")  # noqa: SIM115 (the base class closes it after copying)
        handle.seek(start)
        return _Limited(handle, stop - start)


class _Limited:
    """A file object that yields at most ``length`` bytes."""

    def __init__(self, handle: BinaryIO, length: int) -> None:
        self.handle, self.left = handle, length

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self.handle.read(size)
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.handle.close()


@contextlib.contextmanager
def serving(folder: Path, request_log: Path) -> Iterator[str]:
    """Serve ``folder`` from this module in its own process (GDAL holds the GIL while it reads,
    so an in-process server would deadlock); yield the base URL, stop the server on exit."""
    from tests.processes import stop_process

    server = subprocess.Popen(
        [sys.executable, "-m", "tests.http_file_server", str(folder), str(request_log)],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        yield f"http://127.0.0.1:{int(server.stdout.readline())}"
    finally:
        stop_process(server)


def main() -> None:
    """Serve a folder until terminated."""
    folder, log = sys.argv[1], Path(sys.argv[2])
    faults = Faults(Path(sys.argv[3]) if len(sys.argv) > 3 else None)
    handler = type(
        "Handler",
        (RangeFileHandler,),
        {"request_log": log, "faults": faults, "__init__": _bind_directory(folder)},
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def _bind_directory(folder: str):  # type: ignore[no-untyped-def]
    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        SimpleHTTPRequestHandler.__init__(self, *args, directory=folder, **kwargs)

    return __init__


if __name__ == "__main__":
    main()
