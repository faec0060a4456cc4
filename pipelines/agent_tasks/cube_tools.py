"""MCP wiring the agent tasks' servers share: a tool's CityCube errors as MCP tool errors, a
result as JSON text, the server's settings, and one registration of the case tools and of the
cube-asset tools.

The cube-asset tools (``list_assets``, ``read_table``, ``describe_raster``, ``view_raster``)
are implemented once in :class:`citycube.agents.cube_tools.CubeAssetTools`; the forecasting,
EV charging and school capacity servers register them here with the same names and
parameters, each with its own descriptions (what its cases may see: periods, the tile).
"""

from __future__ import annotations

import json
from collections.abc import Container
from typing import TYPE_CHECKING, Any, NamedTuple

from citycube.errors import CityCubeError

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from citycube.agents.session import ToolResult


class CubeToolDocs(NamedTuple):
    """A task's descriptions of the cube-asset tools (what its MCP clients read); the raster
    tools' have a default for tasks that add nothing to it."""

    list_assets: str
    read_table: str
    describe_raster: str = (
        "Bands, shape, resolution and per-band statistics of a raster asset at a period."
    )
    view_raster: str = "A PNG preview of a raster asset at a period."


CUBE_TOOLS: tuple[str, ...] = CubeToolDocs._fields
"""The cube-asset tools, in the order they are registered."""


def result_text(result: ToolResult) -> str:
    """A tool result's data as the JSON text an MCP client receives."""
    return json.dumps(result.data, ensure_ascii=False)


def tool_errors(fn: Any) -> Any:
    """``fn`` with CityCube errors raised as MCP tool errors, whose message (code, cause,
    remedy) the client sees; anything else stays an unexpected error."""
    import functools

    from mcp.server.mcpserver.exceptions import ToolError

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CityCubeError as exc:
            raise ToolError(str(exc)) from None

    return wrapper


def new_server(name: str, instructions: str) -> MCPServer:
    """An empty MCP server with the settings every task's server shares."""
    from mcp.server.mcpserver import MCPServer

    return MCPServer(name=name, instructions=instructions, version="1", log_level="WARNING")


def add_tools(server: MCPServer, *fns: Any, only: Container[str] | None = None) -> None:
    """Register each function as a tool named after it and described by its docstring (with
    ``only``, just those it holds), its CityCube errors raised as tool errors."""
    for fn in fns:
        if only is None or fn.__name__ in only:
            server.add_tool(tool_errors(fn), structured_output=False)


def add_case_tools(server: MCPServer, run: Any, list_doc: str, start_doc: str) -> None:
    """Register ``list_cases`` and ``start_case`` (by case key) on ``server`` for ``run``,
    described by ``list_doc`` and ``start_doc``."""

    def list_cases() -> str:
        return json.dumps({"cases": run.case_keys()})

    def start_case(case_key: str) -> str:
        return json.dumps(run.start_case(case_key), ensure_ascii=False)

    for fn, doc in ((list_cases, list_doc), (start_case, start_doc)):
        server.add_tool(tool_errors(fn), description=doc, structured_output=False)


def add_cube_tools(
    server: MCPServer, run: Any, docs: CubeToolDocs, only: Container[str] | None = None
) -> None:
    """Register the cube-asset tools on ``server``, each sending its call to ``run`` (a
    :class:`~citycube.agents.session.CaseRun`) and described by ``docs``; with ``only``, just
    the tools it holds (a profile's)."""
    from mcp.server.mcpserver import Image

    def list_assets() -> str:
        return result_text(run.call("list_assets"))

    def read_table(
        asset_id: str,
        tiles: list[str] | None = None,
        fields: list[str] | None = None,
        periods: list[int] | None = None,
        limit: int = 5000,
    ) -> str:
        args: dict[str, Any] = {"asset_id": asset_id, "limit": limit}
        args |= {k: v for k, v in (("tiles", tiles), ("fields", fields), ("periods", periods)) if v}
        return result_text(run.call("read_table", args))

    def describe_raster(asset_id: str, period: int, tile_id: str | None = None) -> str:
        args = {"asset_id": asset_id, "period": period}
        return result_text(
            run.call("describe_raster", args | ({"tile_id": tile_id} if tile_id else {}))
        )

    def view_raster(asset_id: str, period: int, tile_id: str | None = None) -> list[Any]:
        args = {"asset_id": asset_id, "period": period}
        result = run.call("view_raster", args | ({"tile_id": tile_id} if tile_id else {}))
        return [result_text(result), Image(data=result.image, format="png")]

    tools = (list_assets, read_table, describe_raster, view_raster)
    for name, fn in zip(CUBE_TOOLS, tools, strict=True):
        if only is None or name in only:
            server.add_tool(
                tool_errors(fn), name=name, description=getattr(docs, name), structured_output=False
            )
