"""Metrics against values worked out by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from agentic_iqa.bench import metrics as M


def test_rank_correlations_by_hand():
    # ranks differ by one swap: SRCC = 1 - 6*(0+1+1+0)/(4*(16-1)) = 0.8; KRCC = (5-1)/6
    out = M.correlations([1, 2, 3, 4], [1, 3, 2, 4])
    assert out["srcc"] == pytest.approx(0.8)
    assert out["krcc"] == pytest.approx(4 / 6)
    assert out["n"] == 4


def test_logistic4_shape():
    assert M.logistic4(0.3, 5, 1, 0.3, 2) == pytest.approx(3.0)  # midpoint = (b1 + b2) / 2
    assert M.logistic4(1e6, 5, 1, 0, 1) == pytest.approx(5)
    assert M.logistic4(-1e6, 5, 1, 0, 1) == pytest.approx(1)
    assert M.logistic4(2.0, 5, 1, 0, -1) == M.logistic4(2.0, 5, 1, 0, 1)  # the scale enters as |b4|


def test_plcc_after_logistic_fit_recovers_a_logistic_relation():
    x = np.linspace(-3, 3, 25)
    y = M.logistic4(x, 4.5, 1.2, 0.4, 0.7)
    out = M.correlations(x, y)
    assert out["plcc_fit"] == "logistic"
    assert out["plcc"] == pytest.approx(1.0, abs=1e-6)
    assert stats.pearsonr(x, y)[0] < 0.99  # plain PLCC would understate it
    down = M.correlations(x, -y)  # falling relation: fitted too, PLCC judged on the mapped scores
    assert down["srcc"] == pytest.approx(-1) and down["plcc"] == pytest.approx(1.0, abs=1e-6)


def test_plcc_falls_back_to_linear_when_no_fit_is_possible():
    # 4 points are too few for 4 parameters: Pearson r by hand = 6.5 / sqrt(5 * 8.75)
    out = M.correlations([1, 2, 3, 4], [1, 2, 3, 5])
    assert out["plcc"] == pytest.approx(6.5 / math.sqrt(5 * 8.75))
    assert out["plcc_fit"].startswith("linear")
    params, why = M.fit_logistic4([1, 2, 3, 4, 5, 6], [2, 2, 2, 2, 2, 2])
    assert params is None and "constant" in why
    flat = M.correlations([1, 2, 3], [5, 5, 5])
    assert math.isnan(flat["srcc"]) and math.isnan(flat["plcc"])


def test_correlations_by_type():
    out = M.correlations_by(["a", "a", "a", "b", "b", "b"], [1, 2, 3, 1, 2, 3], [1, 2, 3, 3, 2, 1])
    assert out["a"]["srcc"] == pytest.approx(1) and out["b"]["srcc"] == pytest.approx(-1)


def test_intra_group_srcc_by_hand():
    groups = ["g1"] * 3 + ["g2"] * 3 + ["g3"] * 3 + ["g4"] * 3 + ["g5"] * 2
    types = ["T"] * 6 + ["U"] * 3 + ["mean shift"] * 3 + ["T"] * 2
    levels = [1, 2, 3] * 4 + [2, 2]
    scores = [3, 2, 1,      # falls with level: rho 1
              2, 3, 1,      # one swap: rho = 1 - 6*(1+1+0)/(3*8) = 0.5
              5, 5, 5,      # ranks nothing: 0
              1, 2, 3,      # non-monotone type: skipped
              4, 1]         # a single level: skipped
    out = M.intra_group_srcc(groups, types, levels, scores)
    assert out["groups"] == 3
    assert out["srcc"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert out["per_type"] == {"T": pytest.approx(0.75), "U": 0.0}
    # the same group name with another type is another group
    assert M.intra_group_srcc(["g"] * 4, ["A", "A", "B", "B"], [1, 2, 1, 2], [2, 1, 1, 2])["per_type"] == {
        "A": pytest.approx(1.0), "B": pytest.approx(-1.0)}


def test_detection_accuracy_by_hand():
    cats = ["Blurs", "Noise", "Noise", None]
    detected = [["Blurs", "Noise"], ["Blurs", "Noise"], [], ["Blurs"]]
    out = M.detection_accuracy(cats, detected, [3, 3, 5, 1])
    assert out["n"] == 3  # the row without a category does not count
    assert out["top1"] == pytest.approx(1 / 3) and out["recall"] == pytest.approx(2 / 3)
    assert out["per_level"][3] == {"n": 2, "top1": 0.5, "recall": 1.0}
    assert out["per_level"][5] == {"n": 1, "top1": 0.0, "recall": 0.0}
    assert math.isnan(M.detection_accuracy([None], [[]])["top1"])


def test_mcq_accuracy_by_hand():
    out = M.mcq_accuracy(["A", "B", None, "C"], [" a ", "C", "A", None])
    assert out == {"n": 3, "accuracy": pytest.approx(1 / 3)}
    assert math.isnan(M.mcq_accuracy([None], ["A"])["accuracy"])
