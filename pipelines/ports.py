"""The one way the project picks a TCP port for a server it starts on loopback."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"
"""Every server the project starts listens here only."""


def free_loopback_port() -> int:
    """A TCP port nobody listens on at 127.0.0.1 right now (the caller binds it next; another
    process could take it in between, so servers that fail to bind are retried by callers that
    care)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])
