"""Every module imports, and every name a package exports in ``__all__`` resolves."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

PACKAGES = ["citycube", "sources", "assets", "pipelines", "benchmarks"]


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
            names.append(info.name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_module_imports_and_all_resolves(name: str) -> None:
    module = importlib.import_module(name)
    for exported in getattr(module, "__all__", []):
        assert hasattr(module, exported), f"{name}.__all__ names missing {exported!r}"


FORBIDDEN_IN_CORE = (
    "dagster",
    "dagster_webserver",
    "sources",
    "assets",
    "pipelines",
)
"""The core imports neither Dagster nor any adapter implementation or wiring."""


def _imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.append(str(node.args[0].value))
    return names


def test_core_imports_neither_dagster_nor_adapters() -> None:
    core = Path(importlib.import_module("citycube").__file__).parent
    offenders = {}
    for path in sorted(core.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bad = [name for name in _imported_modules(tree) if name.split(".")[0] in FORBIDDEN_IN_CORE]
        if bad:
            offenders[path.name] = bad
    assert offenders == {}


def test_layering_check_catches_every_import_form() -> None:
    source = (
        "import dagster\n"
        "import dagster as dg\n"
        "from dagster import asset\n"
        "from sources.sample import SampleBackend\n"
        "def f():\n"
        "    from pipelines.resources import CubeResource\n"
        "    importlib.import_module('assets.cube')\n"
    )
    found = [n.split(".")[0] for n in _imported_modules(ast.parse(source))]
    assert found == ["dagster", "dagster", "dagster", "sources", "pipelines", "assets"]


def _private_modules(names: list[str]) -> list[str]:
    """The names of any library's private modules (a dotted part starting with "_")."""
    return [
        name
        for name in names
        if name not in ("__future__", "__main__")
        and any(part.startswith("_") for part in name.split("."))
    ]


def _private_names(tree: ast.AST) -> list[str]:
    """Private names (``_x``, not dunders) imported from another module."""
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_no_module_outside_the_tests_imports_private_modules() -> None:
    """Dagster's ``dagster._*`` or any other library's underscore modules, and no private
    name (``_x``) imported from another module."""
    root = Path(importlib.import_module("pipelines").__file__).parent.parent
    offenders = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
            bad = _private_modules(_imported_modules(tree)) + _private_names(tree)
            if bad:
                offenders[relative] = bad
    assert offenders == {}


def test_private_module_check_catches_every_import_form() -> None:
    source = (
        "import dagster._core.errors\n"
        "from dagster._core.execution.backfill import PartitionBackfill\n"
        "from dagster_graphql._internal import x\n"
        "def f():\n"
        "    from dagster._daemon.backfill import execute_backfill_iteration\n"
        "    importlib.import_module('dagster._core.storage.tags')\n"
        "import dagster\n"
        "from dagster import DagsterInstance\n"
        "from dagster_graphql import DagsterGraphQLClient\n"
        "from rasterio._features import _rasterize\n"
    )
    found = _private_modules(_imported_modules(ast.parse(source)))
    assert found == [
        "dagster._core.errors",
        "dagster._core.execution.backfill",
        "dagster_graphql._internal",
        "rasterio._features",
        "dagster._daemon.backfill",
        "dagster._core.storage.tags",
    ]
