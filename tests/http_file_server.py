"""A small HTTP file server with Range support, for loopback tests of remote reads.

``python -m tests.http_file_server <folder> <request-log>`` serves ``folder`` on a free
loopback port, prints the port, and appends one line per request (method, path, Range).
"""

from __future__ import annotations

import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO


class RangeFileHandler(SimpleHTTPRequestHandler):
    """Serves files with byte ranges, as object stores and COG hosts do."""

    request_log: Path

    def log_message(self, format: str, *args: object) -> None:
        with open(self.request_log, "a", encoding="utf-8") as log:
            log.write(f"{self.command} {self.path} {self.headers.get('Range') or '-'}\n")

    def send_head(self) -> BinaryIO | None:
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return None
        size = path.stat().st_size
        start, stop = 0, size
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            first, _, last = wanted.removeprefix("bytes=").partition("-")
            start = int(first or 0)
            stop = min(size, int(last) + 1) if last else size
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        else:
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


def main() -> None:
    """Serve a folder until terminated."""
    folder, log = sys.argv[1], Path(sys.argv[2])
    handler = type(
        "Handler",
        (RangeFileHandler,),
        {"request_log": log, "__init__": _bind_directory(folder)},
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
