"""CityRep's nine metrics (App. C.4): three per task kind, one of them primary.

Regression: R² (primary), MAE, RMSE. Classification: macro F1 (primary), macro precision and
macro recall over the classes present in the truth or the prediction, a class with no
prediction (or no truth) scoring 0 on the undefined ratio. Distribution: KL(p‖q) (primary),
Chebyshev and L1 distances, each averaged over units; KL adds ε = 1e-8 to both sides and
renormalises.
"""

from __future__ import annotations

import numpy as np

KL_EPSILON = 1e-8

METRICS = {
    "regression": ("r2", "mae", "rmse"),
    "classification": ("macro_f1", "macro_precision", "macro_recall"),
    "distribution": ("kl", "chebyshev", "l1"),
}
HIGHER_IS_BETTER = {
    "r2": True,
    "mae": False,
    "rmse": False,
    "macro_f1": True,
    "macro_precision": True,
    "macro_recall": True,
    "kl": False,
    "chebyshev": False,
    "l1": False,
}


def regression(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    y, pred = np.asarray(y, float), np.asarray(pred, float)
    resid = y - pred
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float((resid**2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    return {
        "r2": r2,
        "mae": float(np.abs(resid).mean()),
        "rmse": float(np.sqrt((resid**2).mean())),
    }


def classification(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    y, pred = np.asarray(y), np.asarray(pred)
    precision, recall, f1 = [], [], []
    for c in np.union1d(y, pred):
        tp = float(((pred == c) & (y == c)).sum())
        fp = float(((pred == c) & (y != c)).sum())
        fn = float(((pred != c) & (y == c)).sum())
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        precision.append(p)
        recall.append(r)
        f1.append(2 * p * r / (p + r) if p + r else 0.0)
    return {
        "macro_f1": float(np.mean(f1)),
        "macro_precision": float(np.mean(precision)),
        "macro_recall": float(np.mean(recall)),
    }


def distribution(p: np.ndarray, q: np.ndarray) -> dict[str, float]:
    p, q = np.asarray(p, float), np.asarray(q, float)
    ps = (p + KL_EPSILON) / (p + KL_EPSILON).sum(axis=1, keepdims=True)
    qs = (q + KL_EPSILON) / (q + KL_EPSILON).sum(axis=1, keepdims=True)
    return {
        "kl": float((ps * np.log(ps / qs)).sum(axis=1).mean()),
        "chebyshev": float(np.abs(p - q).max(axis=1).mean()),
        "l1": float(np.abs(p - q).sum(axis=1).mean()),
    }


def score(kind: str, y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """The three metrics of a task kind."""
    return {
        "regression": regression,
        "classification": classification,
        "distribution": distribution,
    }[kind](y, pred)
