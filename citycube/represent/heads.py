"""The fixed prediction heads of CityRep (App. C.5 and D.2), in numpy.

The MLP has one hidden layer of 1024 ReLU units; the linear probe has none. Both train with Adam
(learning rate 1e-3, betas 0.9/0.999), mini-batches of 512 shuffled by the seed, at most 100
epochs, and stop when the validation loss has not improved for 10 epochs, restoring the weights
of the best validation epoch. Features and regression targets are z-scored with training
statistics only. Losses: squared error (regression), softmax cross-entropy (classification),
softmax cross-entropy against the target fractions (distribution; its minimum is the KL
divergence plus the target's entropy). Training runs in float32 on the CPU; the seed fixes the
initial weights and the batch order, so a rerun on the same machine gives the same numbers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from citycube.represent.tasks import TaskKind

HIDDEN = 1024
LEARNING_RATE = 1e-3
BATCH_SIZE = 512
MAX_EPOCHS = 100
PATIENCE = 10
DTYPE = np.float32
"""Weights and activations in single precision, as a GPU head would train; statistics, targets
and metrics stay in double."""
HEADS = ("mlp", "linear")


@dataclass(frozen=True)
class HeadConfig:
    """Training settings; the defaults are CityRep's."""

    hidden: int = HIDDEN
    learning_rate: float = LEARNING_RATE
    batch_size: int = BATCH_SIZE
    max_epochs: int = MAX_EPOCHS
    patience: int = PATIENCE


def head_config(head: str) -> HeadConfig:
    if head == "mlp":
        return HeadConfig()
    if head == "linear":
        return HeadConfig(hidden=0)
    raise ValueError(f"unknown head {head!r}; use one of {', '.join(HEADS)}")


@dataclass
class FitResult:
    """What training did: epochs run, the best epoch and its validation loss."""

    epochs: int
    best_epoch: int
    best_val_loss: float
    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class Head:
    """A seeded MLP or linear head for one task kind."""

    def __init__(self, kind: TaskKind, config: HeadConfig | None = None, seed: int = 0) -> None:
        self.kind = kind
        self.config = config or HeadConfig()
        self.seed = seed
        self.params: list[np.ndarray] = []

    # --- parameters -------------------------------------------------------------------
    def _init(self, d_in: int, d_out: int, rng: np.random.Generator) -> None:
        """PyTorch's default Linear initialisation: uniform in ±1/sqrt(fan_in)."""
        sizes = [d_in, self.config.hidden, d_out] if self.config.hidden else [d_in, d_out]
        self.params = []
        for a, b in itertools.pairwise(sizes):
            bound = 1.0 / np.sqrt(a)
            self.params += [
                rng.uniform(-bound, bound, (a, b)).astype(DTYPE),
                rng.uniform(-bound, bound, b).astype(DTYPE),
            ]

    def _forward(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if self.config.hidden:
            w1, b1, w2, b2 = self.params
            h = np.maximum(X @ w1 + b1, 0.0)
            return h @ w2 + b2, h
        w, b = self.params
        return X @ w + b, None

    def _loss_grad(self, out: np.ndarray, Y: np.ndarray) -> tuple[float, np.ndarray]:
        n = len(out)
        if self.kind == "regression":
            diff = out - Y
            return float((diff**2).mean()), 2.0 * diff / diff.size
        p = _softmax(out)
        loss = -float((Y * np.log(np.clip(p, 1e-12, None))).sum() / n)
        return loss, (p - Y) / n

    def _loss(self, X: np.ndarray, Y: np.ndarray) -> float:
        out, _ = self._forward(X)
        return self._loss_grad(out, Y)[0]

    def _backward(self, X: np.ndarray, h: np.ndarray | None, grad: np.ndarray) -> list[np.ndarray]:
        if self.config.hidden:
            _, _, w2, _ = self.params
            assert h is not None
            gw2, gb2 = h.T @ grad, grad.sum(axis=0)
            gh = (grad @ w2.T) * (h > 0)
            return [X.T @ gh, gh.sum(axis=0), gw2, gb2]
        return [X.T @ grad, grad.sum(axis=0)]

    # --- targets ----------------------------------------------------------------------
    def _encode(self, y: np.ndarray) -> np.ndarray:
        if self.kind == "regression":
            return ((y - self.y_mean) / self.y_std)[:, None].astype(DTYPE)
        if self.kind == "classification":
            onehot = np.zeros((len(y), len(self.classes)), DTYPE)
            onehot[np.arange(len(y)), np.searchsorted(self.classes, y)] = 1.0
            return onehot
        return np.asarray(y, DTYPE)

    # --- public -----------------------------------------------------------------------
    def fit(self, X: np.ndarray, y: np.ndarray, X_val: np.ndarray, y_val: np.ndarray) -> FitResult:
        """Train on (X, y), early-stopping on (X_val, y_val); the best state is kept."""
        cfg = self.config
        rng = np.random.default_rng(self.seed)
        self.x_mean = X.mean(axis=0)
        std = X.std(axis=0)
        self.x_std = np.where(std > 0, std, 1.0)
        if self.kind == "regression":
            self.y_mean = float(y.mean())
            self.y_std = float(y.std()) or 1.0
        elif self.kind == "classification":
            self.classes = np.unique(np.concatenate([y, y_val]))
        Xs, Xv = self._scale(X), self._scale(X_val)
        Y, Yv = self._encode(y), self._encode(y_val)
        self._init(Xs.shape[1], Y.shape[1], rng)
        m = [np.zeros_like(p) for p in self.params]
        v = [np.zeros_like(p) for p in self.params]
        beta1, beta2, eps, step = 0.9, 0.999, 1e-8, 0
        best = (np.inf, 0, [p.copy() for p in self.params])
        result = FitResult(0, 0, np.inf)
        since_best = 0
        for epoch in range(1, cfg.max_epochs + 1):
            order = rng.permutation(len(Xs))
            total = 0.0
            for start in range(0, len(order), cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                out, h = self._forward(Xs[idx])
                loss, grad = self._loss_grad(out, Y[idx])
                total += loss * len(idx)
                grads = self._backward(Xs[idx], h, grad)
                step += 1
                for i, g in enumerate(grads):
                    m[i] = beta1 * m[i] + (1 - beta1) * g
                    v[i] = beta2 * v[i] + (1 - beta2) * g * g
                    m_hat = m[i] / (1 - beta1**step)
                    v_hat = v[i] / (1 - beta2**step)
                    self.params[i] -= cfg.learning_rate * m_hat / (np.sqrt(v_hat) + eps)
            val = self._loss(Xv, Yv) if len(Xv) else total / len(Xs)
            result.train_loss.append(total / len(Xs))
            result.val_loss.append(val)
            result.epochs = epoch
            if val < best[0]:
                best = (val, epoch, [p.copy() for p in self.params])
                since_best = 0
            else:
                since_best += 1
                if since_best >= cfg.patience:
                    break
        self.params = best[2]
        result.best_val_loss, result.best_epoch = best[0], best[1]
        return result

    def _scale(self, X: np.ndarray) -> np.ndarray:
        return ((np.asarray(X, np.float64) - self.x_mean) / self.x_std).astype(DTYPE)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Regression values in target units, class ids, or class fractions."""
        out, _ = self._forward(self._scale(X))
        if self.kind == "regression":
            return out[:, 0].astype(np.float64) * self.y_std + self.y_mean
        if self.kind == "classification":
            return self.classes[out.argmax(axis=1)]
        return _softmax(out.astype(np.float64))
