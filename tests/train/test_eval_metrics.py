"""AUC and log loss against scikit-learn, plus the edge cases sklearn handles differently."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import log_loss as sk_log_loss
from sklearn.metrics import roc_auc_score

from dlrm_platform.train.eval_metrics import auc, logloss, logloss_from_logits, sigmoid


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn_random(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 3000))
    labels = rng.integers(0, 2, n)
    labels[0], labels[-1] = 0, 1
    scores = rng.normal(size=n) + 0.7 * labels
    assert auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auc_with_many_ties_matches_sklearn() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 5000)
    scores = rng.integers(0, 5, 5000).astype(np.float32)  # heavy ties
    assert auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auc_extremes_and_invariance() -> None:
    labels = np.array([0, 0, 1, 1])
    assert auc([0.1, 0.2, 0.8, 0.9], labels) == 1.0
    assert auc([0.9, 0.8, 0.2, 0.1], labels) == 0.0
    assert auc([0.5, 0.5, 0.5, 0.5], labels) == 0.5
    logits = np.array([-3.0, 0.5, 0.1, 4.0])
    assert auc(logits, labels) == pytest.approx(auc(sigmoid(logits), labels))


def test_auc_single_class_is_nan() -> None:
    assert math.isnan(auc([0.1, 0.2], [1, 1]))
    assert math.isnan(auc([], []))


def test_auc_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="labels"):
        auc([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="2 scores but 3"):
        auc([0.1, 0.2], [0, 1, 1])
    with pytest.raises(ValueError, match="NaN"):
        auc([0.1, float("nan")], [0, 1])


@pytest.mark.parametrize("seed", range(3))
def test_logloss_matches_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 1000)
    logits = rng.normal(scale=3.0, size=1000)
    expected = sk_log_loss(labels, sigmoid(logits), labels=[0, 1])
    assert logloss_from_logits(logits, labels) == pytest.approx(expected, rel=1e-9)
    assert logloss(sigmoid(logits), labels) == pytest.approx(expected, rel=1e-9)


def test_logloss_from_logits_is_stable_for_extreme_logits() -> None:
    # A confidently wrong prediction costs |z|; a confidently right one ~0. No inf, no nan.
    assert logloss_from_logits([1000.0], [0]) == pytest.approx(1000.0)
    assert logloss_from_logits([-1000.0], [1]) == pytest.approx(1000.0)
    assert logloss_from_logits([1000.0, -1000.0], [1, 0]) == pytest.approx(0.0, abs=1e-300)
    assert logloss_from_logits([0.0], [1]) == pytest.approx(math.log(2))


def test_logloss_of_probabilities_clips() -> None:
    assert logloss([0.0], [1]) == pytest.approx(-math.log(1e-15))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        logloss([1.5], [1])
    assert math.isnan(logloss([], []))


def test_sigmoid_no_overflow() -> None:
    with np.errstate(over="raise"):
        out = sigmoid(np.array([-1e4, 0.0, 1e4]))
    assert out.tolist() == [0.0, 0.5, 1.0]
