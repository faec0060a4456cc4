"""The ``calculate`` tool of the agent tasks (AgenticCity-Bench App. D): arithmetic on numbers,
nothing else evaluated.

An expression is parsed, never run: only numbers, + − × ÷ // % **, parentheses and the task's
named functions are walked, and exponents are capped so no call can take the server's time or
memory. One evaluator serves every task; a task passes its functions, its exponent cap and its
:class:`Wording` (the texts its agents and tests know).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from citycube.errors import AgentCaseError

BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
"""The binary operators evaluated."""
UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
"""The unary operators evaluated."""
MAX_EXPRESSION = 500
"""Longest expression evaluated."""


@dataclass(frozen=True)
class Wording:
    """A task's error texts, as ``str.format`` templates."""

    example: str
    """An expression shown when none is given."""
    unparsable: str
    """``{expression}`` does not parse: ``{reason}``."""
    exponent: str
    """An exponent above ``{limit}``."""
    not_allowed: str
    """A node that is not arithmetic: ``{source}`` (its text) or ``{dump}`` (its AST, cut),
    with ``{functions}`` (the names allowed)."""
    failed: str
    """``{expression}`` raised ``{error}``."""
    not_finite: str
    """``{expression}``'s value is not finite."""


def evaluate(
    expression: Any,
    *,
    functions: Mapping[str, Callable[..., Any]],
    max_exponent: float,
    wording: Wording,
) -> float:
    """The finite value of an arithmetic expression, or an :class:`AgentCaseError` in the task's
    ``wording``."""
    if not isinstance(expression, str) or not expression.strip():
        raise AgentCaseError(f"calculate needs an arithmetic expression, e.g. {wording.example!r}")
    if len(expression) > MAX_EXPRESSION:
        raise AgentCaseError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise AgentCaseError(
            wording.unparsable.format(expression=expression, reason=exc.msg)
        ) from None

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            return UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > max_exponent:
                raise AgentCaseError(wording.exponent.format(limit=max_exponent))
            return BINARY[type(node.op)](left, right)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in functions
            and not node.keywords
        ):
            return functions[node.func.id](*(value(a) for a in node.args))
        raise AgentCaseError(
            wording.not_allowed.format(
                source=ast.unparse(node), dump=ast.dump(node)[:60], functions=", ".join(functions)
            )
        )

    try:
        result = float(value(tree))
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise AgentCaseError(wording.failed.format(expression=expression, error=exc)) from None
    if not math.isfinite(result):
        raise AgentCaseError(wording.not_finite.format(expression=expression))
    return result
