"""Every module imports, and every name a package exports in ``__all__`` resolves."""

from __future__ import annotations

import importlib
import pkgutil

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


def test_core_does_not_import_dagster() -> None:
    import sys

    for name in _modules():
        if name.startswith("citycube"):
            module = sys.modules[name]
            source = open(module.__file__, encoding="utf-8").read()  # noqa: SIM115
            assert "import dagster" not in source, f"{name} imports dagster"
