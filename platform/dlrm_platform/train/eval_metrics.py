"""Evaluation metrics: exact ROC AUC and numerically stable log loss.

Both take 1-D arrays of ``N`` scores (or logits) and ``N`` binary labels and
return a Python float. Neither keeps state; the train loop gathers the
predictions of all workers first.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["auc", "logloss", "logloss_from_logits", "sigmoid"]


def _as_1d(x: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _check_labels(labels: np.ndarray, n: int) -> None:
    if labels.shape[0] != n:
        raise ValueError(f"{n} scores but {labels.shape[0]} labels")
    if not np.all((labels == 0) | (labels == 1)):
        raise ValueError("labels must be 0 or 1")


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``; tied values share the mean of their ranks."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # Start index of each run of equal values in sorted order.
    is_start = np.empty(len(x), dtype=bool)
    is_start[:1] = True
    is_start[1:] = sorted_x[1:] != sorted_x[:-1]
    starts = np.flatnonzero(is_start)
    ends = np.append(starts[1:], len(x))  # exclusive
    run_rank = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def auc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Exact area under the ROC curve (Mann-Whitney U), ties counted as one half.

    Any monotone transform of the scores gives the same value, so logits and
    probabilities are equivalent. Returns NaN when only one class is present
    (AUC is undefined there); raises ValueError for mismatched lengths,
    non-binary labels or non-finite scores.
    """
    s = _as_1d(scores, "scores")
    y = _as_1d(labels, "labels")
    _check_labels(y, len(s))
    n_pos = float(y.sum())
    n_neg = float(len(y) - n_pos)
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    rank_sum_pos = float(_average_ranks(s)[y == 1].sum())
    u = rank_sum_pos - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def sigmoid(logits: ArrayLike) -> np.ndarray:
    """Elementwise logistic function without overflow."""
    z = np.asarray(logits, dtype=np.float64)
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def logloss_from_logits(logits: ArrayLike, labels: ArrayLike) -> float:
    """Mean binary cross-entropy of ``sigmoid(logits)``, computed in logit space.

    ``log(1 + exp(z)) - y * z`` written as ``max(z, 0) - y * z + log1p(exp(-|z|))``:
    exact for any finite logit, no clipping. NaN for empty input.
    """
    z = _as_1d(logits, "logits")
    y = _as_1d(labels, "labels")
    _check_labels(y, len(z))
    if len(z) == 0:
        return float("nan")
    losses = np.maximum(z, 0.0) - y * z + np.log1p(np.exp(-np.abs(z)))
    return float(losses.mean())


def logloss(probs: ArrayLike, labels: ArrayLike, eps: float = 1e-15) -> float:
    """Mean binary cross-entropy of probabilities, clipped to ``[eps, 1 - eps]``.

    Prefer :func:`logloss_from_logits` when logits are at hand: clipping here
    bounds the loss of a confidently wrong prediction at ``-log(eps)``.
    """
    p = _as_1d(probs, "probs")
    y = _as_1d(labels, "labels")
    _check_labels(y, len(p))
    if len(p) == 0:
        return float("nan")
    if np.any((p < 0) | (p > 1)):
        raise ValueError("probabilities must lie in [0, 1]")
    p = np.clip(p, eps, 1.0 - eps)
    return float(-(y * np.log(p) + (1.0 - y) * np.log1p(-p)).mean())
