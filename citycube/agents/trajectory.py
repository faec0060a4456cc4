"""Trajectories: one JSON line per tool call, so a run can be audited, counted and replayed.

A line holds the call's sequence number, tool, arguments, evidence id, whether it succeeded
(the error's message when not), the SHA-256 of its result and how long it took. Everything but
the timing is a function of the release, the case and the calls, so two runs of the same calls
give the same lines apart from ``duration_ms``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIMING_FIELDS = ("duration_ms",)
"""Fields of a trajectory line that differ between replays of the same calls."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, exact floats: one text per value, for digests and replay."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    """SHA-256 of a result: of its bytes, or of its canonical JSON."""
    data = value if isinstance(value, bytes) else canonical_json(value).encode()
    return hashlib.sha256(data).hexdigest()


def evidence_id(seq: int) -> str:
    """The citable id of a case's ``seq``-th call (``evidence-0001``)."""
    return f"evidence-{seq:04d}"


@dataclass(frozen=True)
class Call:
    """One logged tool call."""

    seq: int
    """1 for the case's first call."""
    tool: str
    """Tool name."""
    arguments: Mapping[str, Any]
    """Arguments as the client sent them."""
    evidence_id: str
    """Citable id (also on failed calls: an error is evidence too)."""
    ok: bool
    """Whether the tool returned a result."""
    result_digest: str
    """SHA-256 of the result (of the error message for a failed call)."""
    duration_ms: float
    """Wall time inside the tool."""
    error: str | None = None
    """The error's message, for a failed call."""

    def line(self) -> dict[str, Any]:
        """The JSON line's object."""
        return {
            "seq": self.seq,
            "tool": self.tool,
            "arguments": dict(self.arguments),
            "evidence_id": self.evidence_id,
            "ok": self.ok,
            "error": self.error,
            "result_digest": self.result_digest,
            "duration_ms": round(self.duration_ms, 3),
        }


class TrajectoryWriter:
    """Appends calls to a case's ``trajectory.jsonl``, one flushed line each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w", encoding="utf-8")

    def write(self, call: Call) -> None:
        """Log one call (flushed, so a killed run keeps what it did)."""
        self._file.write(canonical_json(call.line()) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def read_trajectory(path: Path) -> list[dict[str, Any]]:
    """A trajectory's lines as dicts, in call order."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def without_timing(lines: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Lines with the timing fields dropped (what a replay must reproduce)."""
    for line in lines:
        yield {k: v for k, v in line.items() if k not in TIMING_FIELDS}
