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
