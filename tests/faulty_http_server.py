"""A loopback HTTP file server whose failures a test scripts, request by request.

Serves files from memory with ETag, Range and If-Range as object stores do. Each path can be
given a queue of faults, used up one request at a time: an HTTP status (with headers such as
``Retry-After``), a connection dropped after N body bytes, a stall longer than the client's
timeout, or a server that ignores ``Range``. Every request is recorded (time, path, headers),
and the most requests in flight at once is tracked.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass(frozen=True)
class Fault:
    """One scripted misbehaviour."""

    status: int | None = None
    """Answer with this status and no body."""
    headers: dict[str, str] = field(default_factory=dict)
    """Headers sent with ``status`` (e.g. Retry-After)."""
    drop_after: int | None = None
    """Send this many body bytes, then close the connection."""
    stall_s: float | None = None
    """Wait this long before answering."""
    ignore_range: bool = False
    """Answer 200 with the whole file whatever Range asked."""


@dataclass(frozen=True)
class Request:
    """What the server saw."""

    at: float
    path: str
    range: str | None
    if_range: str | None
    authorization: str | None


class LoopbackServer:
    """A threaded HTTP server on a free loopback port, serving while inside ``with``."""

    def _listen(
        self,
        handler: type[BaseHTTPRequestHandler],
        server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer,
    ) -> None:
        self._server = server_class(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def url(self, path: str) -> str:
        """The URL of a path on this server."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/{path.lstrip('/')}"


class FaultyServer(LoopbackServer):
    """Start with ``with FaultyServer() as server:``; ``server.url(path)`` names a file."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.faults: dict[str, deque[Fault]] = defaultdict(deque)
        self.requests: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._listen(self._handler())

    def add(self, path: str, body: bytes, *faults: Fault) -> str:
        """Serve ``body`` at ``path`` after the given faults; returns its URL."""
        self.files["/" + path.lstrip("/")] = body
        self.faults["/" + path.lstrip("/")].extend(faults)
        return self.url(path)

    def requests_for(self, path: str) -> list[Request]:
        """Requests made for one path, in order."""
        return [r for r in self.requests if r.path.split("?")[0] == "/" + path.lstrip("/")]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                with server._lock:
                    server.requests.append(
                        Request(
                            time.monotonic(),
                            self.path,
                            self.headers.get("Range"),
                            self.headers.get("If-Range"),
                            self.headers.get("Authorization"),
                        )
                    )
                    fault = server.faults[path].popleft() if server.faults[path] else Fault()
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(path, fault)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, path: str, fault: Fault) -> None:
                if fault.stall_s:
                    time.sleep(fault.stall_s)
                if fault.status is not None:
                    self.send_response(fault.status)
                    for key, value in fault.headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = server.files.get(path)
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                etag = '"' + hashlib.md5(body).hexdigest() + '"'
                start = 0
                wanted = self.headers.get("Range")
                if_range = self.headers.get("If-Range")
                partial = (
                    wanted is not None
                    and wanted.startswith("bytes=")
                    and not fault.ignore_range
                    and (if_range is None or if_range == etag)
                )
                if partial:
                    assert wanted is not None
                    start = int(wanted.removeprefix("bytes=").partition("-")[0] or 0)
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                payload = body[start:]
                self.send_header("ETag", etag)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if fault.drop_after is not None:
                    self.wfile.write(payload[: fault.drop_after])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(payload)

        return Handler
