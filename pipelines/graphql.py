"""Asset backfills through Dagster's GraphQL API: launch, cancel, read, and terminate runs.

Dagster's public way to request an asset backfill over partitions of several partitionings is
the ``launchPartitionBackfill`` mutation with ``partitionsByAssets`` (what the UI sends). The
requests go over HTTP to a ``dagster-webserver`` (a build runs one, see pipelines/daemon.py),
or, without one, through the ``dagster-graphql`` command on a workspace file (a process that
loads Dagster and the workspace for each request: seconds).

A selection is a plain mapping, asset key → partition keys (``None``: an unpartitioned asset,
taken whole); its partitions go to Dagster as ranges of consecutive keys of the asset's
partitions definition.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

if TYPE_CHECKING:
    import httpx

Selection = Mapping[dg.AssetKey, Sequence[str] | None]
"""Asset key → the partition keys to build (``None``: an unpartitioned asset)."""

TERMINAL_STATUSES = frozenset(
    {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
)
"""Backfill statuses after which Dagster does nothing more for a backfill."""
TIMEOUT_S = 300.0
"""Longest a request may take: loading a workspace on a loaded machine can take a minute."""

LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
  }
}
"""
CANCEL = """
mutation Cancel($id: String!) {
  cancelPartitionBackfill(backfillId: $id) {
    __typename
    ... on CancelBackfillSuccess { backfillId }
    ... on Error { message }
  }
}
"""
STATUS = """
query Status($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { id status }
    ... on Error { message }
  }
}
"""
LIST = """
query Backfills($status: BulkActionStatus) {
  partitionBackfillsOrError(status: $status) {
    __typename
    ... on PartitionBackfills { results { id status tags { key value } } }
    ... on Error { message }
  }
}
"""
TERMINATE = """
mutation Terminate($ids: [String!]!, $policy: TerminateRunPolicy) {
  terminateRuns(runIds: $ids, terminatePolicy: $policy) {
    __typename
    ... on TerminateRunsResult {
      terminateRunResults { __typename ... on Error { message } }
    }
    ... on Error { message }
  }
}
"""
LOCATIONS = """
query Locations {
  workspaceOrError {
    ... on Workspace {
      locationEntries {
        name loadStatus locationOrLoadError { __typename ... on PythonError { message } }
      }
    }
  }
}
"""
RELOAD = """
mutation Reload($name: String!) {
  reloadRepositoryLocation(repositoryLocationName: $name) { __typename }
}
"""


class GraphQLError(RuntimeError):
    """Dagster answered a request with an error."""


@dataclass(frozen=True)
class Backfill:
    """A backfill as the GraphQL API lists it."""

    backfill_id: str
    status: str
    tags: Mapping[str, str]


@functools.cache
def _http_client() -> httpx.Client:
    """One HTTP client for the process. Each new one loads the certificate authorities for
    TLS (about 40 ms of a core), which polling the webserver while it starts repeated every
    0.2 s on the build's busiest seconds; the webserver is on loopback, over plain HTTP."""
    import httpx

    return httpx.Client(timeout=TIMEOUT_S)


def dagster_graphql_command() -> str:
    """The ``dagster-graphql`` command of this environment."""
    here = Path(sys.executable).with_name("dagster-graphql")
    return str(here) if here.exists() else "dagster-graphql"


@dataclass(frozen=True)
class DagsterGraphQL:
    """Runs GraphQL documents against a ``dagster-webserver`` at ``url`` (its ``/graphql``), or
    else against ``workspace`` with the ``dagster-graphql`` command (no workspace: an empty
    one, enough for requests about backfills and runs that need no code)."""

    workspace: Path | None = None
    url: str = ""

    def execute(self, document: str, variables: Mapping[str, Any] | None = None) -> dict:
        """The ``data`` of Dagster's answer; raises GraphQLError on errors."""
        answer = (
            self._over_http(document, variables) if self.url else self._cli(document, variables)
        )
        if answer.get("errors"):
            raise GraphQLError("; ".join(e.get("message", str(e)) for e in answer["errors"]))
        return answer["data"]

    def _over_http(self, document: str, variables: Mapping[str, Any] | None) -> dict:
        import httpx

        body = {"query": document, "variables": dict(variables or {})}
        try:
            response = _http_client().post(self.url, json=body)
        except httpx.TransportError as exc:
            raise ConnectionError(f"{self.url}: {exc}") from exc
        if response.status_code >= 500 or not response.content:
            raise GraphQLError(f"{self.url} answered {response.status_code}: {response.text}")
        return response.json()

    def _cli(self, document: str, variables: Mapping[str, Any] | None) -> dict:
        where = ["-w", str(self.workspace)] if self.workspace else ["--empty-workspace"]
        with tempfile.TemporaryDirectory(prefix="citycube-graphql-") as folder:
            output = Path(folder) / "answer.json"
            command = [dagster_graphql_command(), *where, "-t", document]
            command += ["-v", json.dumps(dict(variables or {})), "-o", str(output)]
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            text = output.read_text(encoding="utf-8") if output.exists() else ""
        if not text:
            raise GraphQLError(
                f"dagster-graphql gave no answer (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        return json.loads(text)

    def launch_backfill(
        self,
        selection: Selection,
        partitions: Mapping[dg.AssetKey, dg.PartitionsDefinition | None],
        tags: Mapping[str, str],
        title: str,
        description: str,
    ) -> str:
        """Request an asset backfill of ``selection``; its id."""
        params = {
            "partitionsByAssets": partitions_by_assets(selection, partitions),
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
            "title": title,
            "description": description,
        }
        result = self.execute(LAUNCH, {"params": params})["launchPartitionBackfill"]
        return _success(result, "backfillId")

    def cancel_backfill(self, backfill_id: str) -> None:
        """Ask Dagster to cancel a backfill: it terminates its runs, then marks it canceled."""
        _success(self.execute(CANCEL, {"id": backfill_id})["cancelPartitionBackfill"], "backfillId")

    def backfill_status(self, backfill_id: str) -> str:
        """The status of a backfill (``REQUESTED``, ``COMPLETED_SUCCESS``, ``CANCELED``…)."""
        result = self.execute(STATUS, {"id": backfill_id})["partitionBackfillOrError"]
        return _success(result, "status")

    def backfills(self, status: str) -> list[Backfill]:
        """The backfills with a status."""
        result = self.execute(LIST, {"status": status})["partitionBackfillsOrError"]
        _success(result, "results")
        return [
            Backfill(b["id"], b["status"], {t["key"]: t["value"] for t in b["tags"]})
            for b in result["results"]
        ]

    def location_error(self, name: str) -> str | None:
        """Why the code location ``name`` is not loaded (None: it is). While the webserver
        loads it, it has neither its definitions nor an error: requests about its assets fail
        until then."""
        data = self.execute(LOCATIONS)["workspaceOrError"]
        for entry in data.get("locationEntries", ()):
            if entry["name"] == name:
                loaded = entry["locationOrLoadError"] or {}
                if "message" in loaded:
                    return loaded["message"]
                if entry["loadStatus"] != "LOADED" or not loaded:
                    return f"code location {name} is still loading"
                return None
        return f"no code location {name}"

    def reload_location(self, name: str) -> None:
        """Load the code location ``name`` again (e.g. once its code server is up)."""
        self.execute(RELOAD, {"name": name})

    def terminate_runs(self, run_ids: Sequence[str], at_once: bool = False) -> None:
        """Ask Dagster to terminate runs; ``at_once`` records them canceled straight away."""
        if not run_ids:
            return
        policy = "MARK_AS_CANCELED_IMMEDIATELY" if at_once else "SAFE_TERMINATE"
        result = self.execute(TERMINATE, {"ids": list(run_ids), "policy": policy})
        _success(result["terminateRuns"], "terminateRunResults")


def _success(result: Mapping[str, Any], field: str) -> Any:
    if field not in result:
        message = result.get("message") or result.get("__typename", "no answer")
        raise GraphQLError(f"{result.get('__typename', 'error')}: {message}")
    return result[field]


def partitions_by_assets(
    selection: Selection, partitions: Mapping[dg.AssetKey, dg.PartitionsDefinition | None]
) -> list[dict[str, Any]]:
    """``partitionsByAssets`` of ``launchPartitionBackfill``: per asset its key ranges."""
    selectors = []
    for key, wanted in sorted(selection.items(), key=lambda item: item[0].to_user_string()):
        selector: dict[str, Any] = {"assetKey": {"path": list(key.path)}, "partitions": None}
        partitions_def = partitions.get(key)
        if partitions_def is not None:
            if not wanted:
                continue  # nothing of it is wanted (None would mean every partition)
            ranges = key_ranges(partitions_def.get_partition_keys(), wanted)
            selector["partitions"] = {"ranges": [{"start": s, "end": e} for s, e in ranges]}
        selectors.append(selector)
    return selectors


def key_ranges(ordered: Sequence[str], wanted: Iterable[str]) -> list[tuple[str, str]]:
    """``wanted`` as ranges (first, last) of consecutive keys of ``ordered``."""
    wanted = set(wanted)
    unknown = wanted - set(ordered)
    if unknown:
        raise ValueError(f"partition keys not in the partitions definition: {sorted(unknown)}")
    ranges: list[tuple[str, str]] = []
    start = previous = None
    for key in ordered:
        if key in wanted:
            if start is None:
                start = key
            previous = key
        elif start is not None:
            ranges.append((start, previous))  # type: ignore[arg-type]
            start = None
    if start is not None:
        ranges.append((start, previous))  # type: ignore[arg-type]
    return ranges
