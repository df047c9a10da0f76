"""GLUE metrics against values computed by hand."""
import math

import numpy as np
import pytest

from suite.api import metrics


def test_accuracy_and_f1_by_hand():
    gold = np.array([1, 1, 0, 0, 1])
    pred = np.array([1, 0, 0, 1, 1])
    # tp=2, fp=1, fn=1 -> precision 2/3, recall 2/3, f1 2/3; accuracy 3/5
    assert metrics.METRICS.get("accuracy")(pred, gold) == pytest.approx(0.6)
    assert metrics.METRICS.get("f1")(pred, gold) == pytest.approx(2 / 3)


def test_matthews_by_hand():
    gold = np.array([1, 1, 1, 0, 0, 0])
    pred = np.array([1, 1, 0, 0, 0, 1])
    tp, tn, fp, fn = 2, 2, 1, 1
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert metrics.METRICS.get("mcc")(pred, gold) == pytest.approx(mcc)  # = 1/3


def test_pearson_spearman_by_hand():
    gold = np.array([1.0, 2.0, 3.0, 4.0])
    pred = np.array([1.0, 3.0, 2.0, 4.0])
    # pearson: means 2.5; cov = sum(dx*dy) = 2.25+(-0.5*0.5)+(0.5*-0.5)+2.25 = 4.0; var each = 5 -> 0.8
    assert metrics.METRICS.get("pearson")(pred, gold) == pytest.approx(0.8)
    # spearman on ranks (same as values here): 1 - 6*sum d^2/(n(n^2-1)) = 1 - 6*2/60 = 0.8
    assert metrics.METRICS.get("spearman")(pred, gold) == pytest.approx(0.8)
    assert math.isnan(metrics.METRICS.get("pearson")(np.ones(4), gold))  # constant prediction: undefined


def test_compute_headline_and_suffix():
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    gold = np.array([1, 0, 0, 0])
    m = metrics.compute(["f1", "accuracy"], logits, gold, regression=False)
    assert m == {"f1": pytest.approx(2 / 3), "accuracy": pytest.approx(0.75)}
    assert metrics.headline(m, ["f1", "accuracy"]) == pytest.approx((2 / 3 + 0.75) / 2)
    m = metrics.compute(["accuracy"], logits, gold, regression=False, suffix="mm")
    assert list(m) == ["accuracy_mm"]
    reg = metrics.compute(["pearson"], np.array([[1.0], [2.0], [3.0]]), np.array([2.0, 4.0, 6.0]), regression=True)
    assert reg["pearson"] == pytest.approx(1.0)
