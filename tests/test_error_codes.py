"""Every coded error has a code of its own, so a log line or a script can tell them apart."""

from __future__ import annotations

import inspect

import citycube.errors as errors


def _error_classes() -> list[type[errors.CityCubeError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.CityCubeError) and cls.__module__ == errors.__name__
    ]


def test_each_error_class_has_its_own_code() -> None:
    by_code: dict[str, list[str]] = {}
    for cls in _error_classes():
        by_code.setdefault(cls.code, []).append(cls.__name__)
    shared = {code: names for code, names in by_code.items() if len(names) > 1}
    assert not shared, f"codes shared by several errors: {shared}"


def test_a_busy_build_and_an_invalid_card_are_told_apart() -> None:
    busy = errors.BuildBusyError("release r1 is in use by another build")
    card = errors.CardValidationError("croissant.json is not valid Croissant")
    assert str(busy).startswith("[CC305] ") and str(card).startswith("[CC307] ")
