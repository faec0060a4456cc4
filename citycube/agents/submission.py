"""The answer of a forecasting case: AgenticCity-Bench App. D's JSON object, validated.

``prediction`` (a finite number in the case's unit), ``unit`` (the case's), ``reason`` (some
text), ``modalities_used`` (modality codes of the case's data) and ``modules_used`` (tools the
agent actually called in this case: the prompt asks to list only those). Every problem is named
in one error, so an agent can fix them all at once.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from citycube.errors import SubmissionError

FIELDS = ("prediction", "unit", "reason", "modalities_used", "modules_used")
"""The submission's fields, all required."""
MAX_REASON = 20_000
"""Longest reason kept (characters)."""


@dataclass(frozen=True)
class Submission:
    """A validated answer."""

    prediction: float
    unit: str
    reason: str
    modalities_used: tuple[str, ...]
    modules_used: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """As the paper's JSON object."""
        return {
            "prediction": self.prediction,
            "unit": self.unit,
            "reason": self.reason,
            "modalities_used": list(self.modalities_used),
            "modules_used": list(self.modules_used),
        }


def _names(value: Any, field: str, known: Collection[str], what: str, errors: list[str]) -> tuple:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        errors.append(f"{field} must be a list of names (strings), got {type(value).__name__}")
        return ()
    unknown = sorted({v for v in value if v not in known})
    if unknown:
        errors.append(f"{field} names {unknown}, which are not {what} (known: {sorted(known)})")
    return tuple(dict.fromkeys(value))


def validate_submission(
    answer: Mapping[str, Any],
    *,
    unit: str,
    modalities: Collection[str],
    tools_called: Collection[str],
) -> Submission:
    """``answer`` as a :class:`Submission`, or ``SubmissionError`` listing every problem."""
    if not isinstance(answer, Mapping):
        raise SubmissionError(
            f"the answer must be a JSON object with {', '.join(FIELDS)}; got "
            f"{type(answer).__name__}"
        )
    errors: list[str] = []
    missing = [f for f in FIELDS if f not in answer]
    if missing:
        errors.append(f"missing {', '.join(missing)}")
    extra = sorted(set(answer) - set(FIELDS))
    if extra:
        errors.append(f"unknown fields {extra}")
    prediction = answer.get("prediction")
    if "prediction" in answer and (
        isinstance(prediction, bool)
        or not isinstance(prediction, int | float)
        or not math.isfinite(prediction)
    ):
        errors.append(f"prediction must be a finite number, got {prediction!r}")
    if "unit" in answer and answer.get("unit") != unit:
        errors.append(f"unit must be the case's unit {unit!r}, got {answer.get('unit')!r}")
    reason = answer.get("reason")
    if "reason" in answer and (not isinstance(reason, str) or not reason.strip()):
        errors.append("reason must be a non-empty text saying how the prediction was made")
    elif isinstance(reason, str) and len(reason) > MAX_REASON:
        errors.append(f"reason is {len(reason)} characters long: keep it under {MAX_REASON}")
    used_modalities = _names(
        answer.get("modalities_used", []),
        "modalities_used",
        modalities,
        "modalities of this case",
        errors,
    )
    used_tools = _names(
        answer.get("modules_used", []),
        "modules_used",
        tools_called,
        "tools called in this case (list only tools actually used)",
        errors,
    )
    if errors:
        raise SubmissionError(
            "the submission is not valid: " + "; ".join(errors) + ". Fix these and submit again."
        )
    return Submission(
        prediction=float(prediction),  # type: ignore[arg-type]
        unit=unit,
        reason=str(reason),
        modalities_used=used_modalities,
        modules_used=used_tools,
    )
