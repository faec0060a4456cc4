"""What every agent task shares: numbered tool calls with citable evidence ids, a trajectory
line per call, and a case that ends with its first valid submission.

A task's tools are the ``_tool_<name>(evidence, **arguments)`` methods of a
:class:`ToolSession` subclass; :meth:`ToolSession.call` checks the tool is offered, runs it,
turns bad arguments into a clear error and logs the call whether it succeeded or not. Results
must be functions of the release, the case and the arguments only, so that a recorded run
replays call for call.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from citycube.agents.trajectory import Call, TrajectoryWriter, canonical_json, digest, evidence_id
from citycube.errors import AgentCaseError, CityCubeError, WorkspacePathError

if TYPE_CHECKING:
    import duckdb

LOCAL_FIELDS = ("workspace_path",)
"""Result fields that depend on where the run is written, left out of the result digest."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""File and run names a tool accepts: no separator, no leading dot."""


@dataclass(frozen=True)
class ToolResult:
    """What a tool hands back: JSON data, and for image tools a PNG."""

    data: dict[str, Any]
    """The result (with its ``evidence_id``)."""
    image: bytes | None = None
    """PNG bytes of an image tool."""

    @property
    def digest(self) -> str:
        """SHA-256 of the result (the data, and the image's bytes)."""
        data = {k: v for k, v in self.data.items() if k not in LOCAL_FIELDS}
        if self.image is None:
            return digest(data)
        return digest(canonical_json(data).encode() + self.image)


def workspace_file(workspace: Path, name: Any, suffix: str) -> Path:
    """The path of ``name`` inside ``workspace``, after checking it cannot leave it.

    The name must be a plain file name (letters, digits, ``_.-``; no separator, no leading
    dot) and gets ``suffix`` if it lacks it; the resolved path must sit directly in the
    resolved workspace, and an existing symbolic link there is refused.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise WorkspacePathError(
            f"file name {name!r} is not allowed: use a plain name of letters, digits, '_', '.' "
            "and '-' (at most 64, no path separators, no '..', not starting with a dot)"
        )
    if not name.endswith(suffix):
        name += suffix
    root = workspace.resolve()
    path = root / name
    if path.is_symlink() or path.resolve().parent != root:
        raise WorkspacePathError(
            f"{name!r} would be written outside the case workspace: choose another name"
        )
    return path


def validate_run_name(name: str) -> str:
    """``name`` if it is a safe folder name for a run."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise WorkspacePathError(
            f"run name {name!r} is not allowed: letters, digits, '_', '.' and '-' (at most 64, "
            "not starting with a dot)"
        )
    return name


class ToolSession:
    """One case being solved: the tools it offers, its trajectory and, once valid, its
    submission. Subclasses add ``_tool_<name>`` methods and set :attr:`submission`."""

    def __init__(self, case_dir: Path, tools: Sequence[str], profile: str) -> None:
        missing = [t for t in tools if not callable(getattr(self, f"_tool_{t}", None))]
        if missing:
            raise AgentCaseError(f"profile {profile!r} names tools without code: {missing}")
        self.case_dir = case_dir
        self.workspace = case_dir / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.profile = profile
        self.tools = tuple(tools)
        self.calls: list[Call] = []
        self.submission: Any = None
        self._trajectory = TrajectoryWriter(case_dir / "trajectory.jsonl")

    @property
    def done(self) -> bool:
        """A valid submission ended the case."""
        return self.submission is not None

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None) -> ToolResult:
        """Run one tool call and log it; a tool's error is logged and raised again."""
        arguments = dict(arguments or {})
        seq = len(self.calls) + 1
        evidence = evidence_id(seq)
        start = time.perf_counter()
        try:
            if self.done:
                raise AgentCaseError(
                    "this case has ended with a valid submission: start the next case"
                )
            if tool not in self.tools:
                raise AgentCaseError(
                    f"tool {tool!r} is not in the {self.profile!r} profile: one of "
                    f"{', '.join(self.tools)}"
                )
            method: Callable[..., ToolResult] = getattr(self, f"_tool_{tool}")
            try:
                result = method(evidence, **arguments)
            except (TypeError, ValueError) as exc:
                raise AgentCaseError(f"{tool}: bad arguments ({exc})") from exc
        except CityCubeError as exc:
            self._log(seq, tool, arguments, evidence, False, digest(exc.message), start, exc)
            raise
        self._log(seq, tool, arguments, evidence, True, result.digest, start, None)
        return result

    def called(self, uncounted: Sequence[str] = ()) -> set[str]:
        """Tools this case called successfully (leaving out ``uncounted``)."""
        return {c.tool for c in self.calls if c.ok and c.tool not in uncounted}

    def _log(
        self,
        seq: int,
        tool: str,
        arguments: Mapping[str, Any],
        evidence: str,
        ok: bool,
        result_digest: str,
        start: float,
        error: CityCubeError | None,
    ) -> None:
        call = Call(
            seq=seq,
            tool=tool,
            arguments=arguments,
            evidence_id=evidence,
            ok=ok,
            result_digest=result_digest,
            duration_ms=(time.perf_counter() - start) * 1000.0,
            error=None if error is None else error.message,
        )
        self.calls.append(call)
        self._trajectory.write(call)

    def close(self) -> None:
        """Close the trajectory file."""
        self._trajectory.close()


class CaseRun:
    """What every task's run shares: the release database it reads (:attr:`con`), one case open
    at a time (:attr:`session`), tool calls sent to it, and ending the case and the run.

    A run owns its connection: :meth:`end_case` closes the open case and keeps the run open for
    the next one, :meth:`close` (or leaving a ``with`` block) also closes the database.
    Subclasses set :attr:`con`, open cases (``start_case``) and set :attr:`session`."""

    con: duckdb.DuckDBPyConnection
    """The release database, closed with the run."""
    session: ToolSession | None = None
    case_word = "key"
    """What ``list_cases`` calls a case's name in the task's messages."""

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None) -> ToolResult:
        """A tool call on the open case."""
        if self.session is None:
            article = "an" if self.case_word[0] in "aeiou" else "a"
            raise AgentCaseError(
                f"no case is open: call start_case with {article} {self.case_word} from list_cases"
            )
        return self.session.call(tool, arguments)

    def end_case(self) -> None:
        """Close the open case's trajectory; the run stays open for another case."""
        if self.session is not None:
            self.session.close()
            self.session = None

    def close(self) -> None:
        """End the run: close the open case and the database connection (again: no-op)."""
        self.end_case()
        self.con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
