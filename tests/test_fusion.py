"""Score fusion (spec 004 with DESIGN §5's normalized formula): worked values, modes, validation, logging."""
import logging
import math

import numpy as np
import pytest

from agentic_iqa.fusion import FusionResult, ScoreFusion, level_letter, stable_softmax
from signatures.models import SummarizerOutput

LOGGER = "agentic_iqa.fusion"


def expected_q(qbar, p, eta=1.0):
    """The normalized formula written out directly, as an independent check."""
    c = np.arange(1, 6, dtype=float)
    alpha = np.exp(-eta * (qbar - c) ** 2)
    alpha /= alpha.sum()
    p = np.asarray(p, dtype=float)
    return float((c * alpha * p).sum() / (alpha * p).sum())


# ── DESIGN §5 worked values ─────────────────────────────────────────────────────────────────────


def test_worked_value_qbar_3_uniform():
    r = ScoreFusion().fuse([3.0], prob_mode="uniform")
    assert r.alpha == pytest.approx([0.0103, 0.2076, 0.5642, 0.2076, 0.0103], abs=5e-5)
    assert r.score == pytest.approx(3.000, abs=5e-4)
    assert r.level == "C" and r.level_value == 3 and r.qbar == 3.0


@pytest.mark.parametrize("qbar, q", [(2.6, 2.6019), (2.0, 2.0211)])
def test_worked_values_uniform(qbar, q):
    assert ScoreFusion().fuse([qbar], prob_mode="uniform").score == pytest.approx(q, abs=5e-5)


def test_qbar_is_the_mean_of_tool_scores():
    r = ScoreFusion().fuse([2.2, 3.0], prob_mode="uniform")
    assert r.qbar == pytest.approx(2.6)
    assert r.score == pytest.approx(2.6019, abs=5e-5)
    assert sum(r.contributions) == pytest.approx(r.score)


def test_unnormalized_paper_formula_is_not_used():
    # The printed q = Σ α p c would give q̄/5 = 0.6 here; the normalized form gives q̄.
    assert ScoreFusion().fuse([3.0], prob_mode="uniform").score > 2.9


# ── probability modes ───────────────────────────────────────────────────────────────────────────


def test_logits_mode_softmax_of_letter_logprobs():
    logprobs = {"A": -3.0, "B": -0.2, "C": -2.0, "D": -5.0, "E": -9.0}
    r = ScoreFusion().fuse([2.89, 3.1], level_logprobs=logprobs)
    p = stable_softmax(np.array([-9.0, -5.0, -2.0, -0.2, -3.0]))  # levels 1..5 = E..A
    assert r.p == pytest.approx(list(p))
    assert r.prob_mode_used == "logits" and r.prob_mode_requested == "logits"
    assert r.score == pytest.approx(expected_q(2.995, p))
    assert r.warnings == []


def test_logits_mode_accepts_digit_keys_and_fills_missing_levels():
    r = ScoreFusion().fuse([3.0], level_logprobs={"4": -0.1, 3: -2.5})
    assert r.prob_mode_used == "logits"
    assert r.p[0] < 1e-40 and r.p[4] < 1e-40  # levels 1 and 5 were not ranked
    assert any("missing for levels [1, 2, 5]" in w for w in r.warnings)


def test_logits_without_logprobs_falls_back_to_classification_and_records_it(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    r = ScoreFusion().fuse([3.0], level="B")
    assert r.prob_mode_requested == "logits" and r.prob_mode_used == "classification"
    assert r.p == pytest.approx([0.075, 0.075, 0.075, 0.7, 0.075])  # B = 4
    warnings = [rec.message for rec in caplog.records if rec.levelno == logging.WARNING]
    assert "Using classification fallback with smoothing" in warnings
    assert any(w.startswith("No VLM probabilities, using fallback") for w in warnings)


def test_logits_with_nan_logprob_falls_back():
    r = ScoreFusion().fuse([3.0], level_logprobs={"A": float("nan"), "B": -1.0}, level="B")
    assert r.prob_mode_used == "classification"
    assert any("rejected" in w for w in r.warnings)


def test_neg_inf_logprob_is_stabilized():
    r = ScoreFusion().fuse([3.0], level_logprobs={"A": -math.inf, "B": -0.1, "C": -2.0, "D": -3.0, "E": -4.0})
    assert r.prob_mode_used == "logits" and all(math.isfinite(x) for x in r.p)
    assert any("Numerical instability detected" in w for w in r.warnings)


def test_classification_mode_ignores_logprobs():
    r = ScoreFusion(prob_mode="classification").fuse([3.0], level_logprobs={"A": 0.0}, level="A")
    assert r.prob_mode_used == "classification" and r.p[4] == pytest.approx(0.7)
    assert sum(r.p) == pytest.approx(1.0)


def test_no_level_anything_falls_back_to_uniform(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    r = ScoreFusion().fuse([2.0])
    assert r.prob_mode_used == "uniform" and r.p == [0.2] * 5
    assert r.score == pytest.approx(2.0211, abs=5e-5)
    assert "No VLM probabilities, using uniform distribution" in caplog.messages


def test_per_call_override_and_instance_default():
    fusion = ScoreFusion(prob_mode="uniform")
    assert fusion.fuse([3.0], level="A").prob_mode_used == "uniform"
    overridden = fusion.fuse([3.0], level="A", prob_mode="classification")
    assert overridden.prob_mode_used == "classification" and overridden.prob_mode_requested == "classification"
    assert fusion.prob_mode == "uniform"  # the override did not stick


def test_analyst_mode_renormalizes_and_keeps_note(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    r = ScoreFusion().fuse([3.0], probabilities={1: 0.1, 2: 0.1, 3: 0.2, 4: 0.4, 5: 0.4}, prob_mode="analyst",
                           prob_note="analyst v2 histogram")
    assert r.prob_mode_used == "analyst" and r.prob_note == "analyst v2 histogram"
    assert r.p == pytest.approx([0.0833333, 0.0833333, 0.1666667, 0.3333333, 0.3333333])
    assert any("renormalized" in m for m in caplog.messages)


def test_analyst_mode_invalid_distribution_falls_back():
    r = ScoreFusion().fuse([3.0], probabilities={"1": -0.5, "2": 1.5}, prob_mode="analyst", level="C")
    assert r.prob_mode_used == "classification"
    assert any("Analyst probabilities rejected" in w for w in r.warnings)


def test_letters_map_a_to_5():
    r = ScoreFusion().fuse([], level="A", prob_mode="classification")
    assert r.p[4] == pytest.approx(0.7)
    assert r.score == pytest.approx(1 * 0.075 + 2 * 0.075 + 3 * 0.075 + 4 * 0.075 + 5 * 0.7)


# ── validation and failures ─────────────────────────────────────────────────────────────────────


def test_no_tool_scores_is_the_vlm_alone(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    p = stable_softmax(np.array([-4.0, -2.0, -0.5, -1.0, -3.0]))
    logprobs = dict(zip("EDCBA", [-4.0, -2.0, -0.5, -1.0, -3.0]))
    for scores in (None, []):
        r = ScoreFusion().fuse(scores, level_logprobs=logprobs)
        assert r.score == pytest.approx(float((np.arange(1, 6) * p).sum()))
        assert r.qbar is None and r.alpha == [0.2] * 5 and not r.need_replan
    assert "No tool scores, using uniform α weights" in caplog.messages


def test_invalid_tool_scores_are_filtered_and_logged(caplog):
    caplog.set_level(logging.ERROR, logger=LOGGER)
    r = ScoreFusion().fuse([3.0, float("nan"), 7.5, float("inf"), -0.1, "x"], prob_mode="uniform")
    assert r.tool_scores == [3.0] and len(r.rejected_tool_scores) == 5
    assert r.score == pytest.approx(3.0, abs=5e-4) and not r.need_replan
    assert any("Invalid tool scores filtered out" in rec.message for rec in caplog.records if rec.levelno == logging.ERROR)


def test_scores_slightly_outside_1_5_are_kept():
    assert ScoreFusion().fuse([0.5, 5.8], prob_mode="uniform").tool_scores == [0.5, 5.8]


def test_all_tool_scores_invalid_gives_neutral_fallback_and_replan(caplog):
    caplog.set_level(logging.ERROR, logger=LOGGER)
    r = ScoreFusion().fuse([float("nan"), 9.0], level="A")
    assert r.fallback and r.need_replan
    assert r.score == 3.0 and r.level == "C"
    assert any(m.startswith("Fusion failed") for m in caplog.messages)


def test_disjoint_tools_and_vlm_fall_back_to_tool_mean():
    # η so large that α is exactly 0 away from q̄ = 5, while the VLM is certain of level 1.
    r = ScoreFusion(eta=1e6).fuse([5.0], probabilities={"E": 1.0}, prob_mode="analyst")
    assert r.fallback and r.need_replan and r.score == 5.0
    assert any("exclude each other" in w for w in r.warnings)


def test_extreme_but_possible_disagreement_is_not_a_failure():
    r = ScoreFusion().fuse([5.0], probabilities={"E": 1.0}, prob_mode="analyst")
    assert not r.fallback and r.score == pytest.approx(1.0)


def test_large_eta_is_numerically_stable():
    r = ScoreFusion(eta=500.0).fuse([4.2], prob_mode="uniform")
    assert all(math.isfinite(a) for a in r.alpha) and sum(r.alpha) == pytest.approx(1.0)
    assert r.score == pytest.approx(4.0, abs=1e-6)


def test_constructor_and_mode_validation():
    with pytest.raises(ValueError, match="eta"):
        ScoreFusion(eta=-1)
    with pytest.raises(ValueError, match="eta"):
        ScoreFusion(eta=float("nan"))
    with pytest.raises(ValueError, match="prob_mode"):
        ScoreFusion(prob_mode="softmax")
    with pytest.raises(ValueError, match="prob_mode"):
        ScoreFusion().fuse([3.0], prob_mode="magic")


@pytest.mark.parametrize("q, letter", [(1.0, "E"), (1.49, "E"), (1.5, "D"), (2.5, "C"), (3.4999, "C"), (4.5, "A"), (5.0, "A")])
def test_level_letter_rounds_half_up(q, letter):
    assert level_letter(q) == letter


def test_stable_softmax_large_inputs():
    p = stable_softmax(np.array([1000.0, 1001.0, 999.0]))
    assert np.isfinite(p).all() and p.sum() == pytest.approx(1.0) and p.argmax() == 1


# ── logging and result shape ────────────────────────────────────────────────────────────────────


def test_intermediate_values_logged_at_info(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    ScoreFusion().fuse([2.6], prob_mode="uniform")
    info = "\n".join(rec.message for rec in caplog.records if rec.levelno == logging.INFO)
    for expected in ("Tool scores: [2.6]", "Tool score count: 1", "Tool score mean: 2.60",
                     "VLM probabilities: {1: 0.200", "Perceptual weights: {1: 0.044", "peak level 3", "entropy",
                     "Final score: 2.60", "Discrete level: 3 (C)", "Contribution breakdown", "Fusion prob_mode: uniform"):
        assert expected in info, expected


def test_result_feeds_summarizer_output():
    r = ScoreFusion().fuse([3.3], level_logprobs={"A": -2.0, "B": -0.4, "C": -1.3, "D": -3.0, "E": -6.0})
    assert isinstance(r, FusionResult)
    out = SummarizerOutput(final_answer=r.level, quality_reasoning="ok", level=r.level, score=r.score,
                           probabilities=r.probabilities(), prob_mode=r.prob_mode_used, prob_source=r.prob_note)
    assert out.probabilities["4"] == pytest.approx(r.p[3])
    assert FusionResult.model_validate_json(r.model_dump_json()) == r


def test_a_positive_log_probability_falls_back_and_says_so():
    """Issue 11: +1e308 used to give a uniform distribution labelled "logits"."""
    r = ScoreFusion().fuse([3.0], level_logprobs={"A": 1e308, "B": -1.0, "C": -2.0}, level="B")
    assert r.prob_mode_used == "classification"
    assert any("above 0" in w for w in r.warnings)
    ok = ScoreFusion().fuse([3.0], level_logprobs={"A": 0.0001, "B": -1.0, "C": -2.0, "D": -3.0, "E": -4.0})
    assert ok.prob_mode_used == "logits"  # provider rounding is not an error


# ── the batch form used by the held-out choice of η (benchmarks/choose_fusion.py) ─────────────────


@pytest.mark.parametrize("eta", [0.0, 0.3, 1.0, 4.0])
def test_fused_scores_equals_fuse(eta):
    from agentic_iqa.fusion import fused_scores

    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.full(5, 0.6), size=40)
    p[0] = [0, 0, 0, 0, 1.0]  # a certain analyst: zeros in p must not break the log-space weighting
    qbar = rng.uniform(1, 5, size=40)
    qbar[1] = np.nan  # no tool scores
    batch = fused_scores(qbar, p, eta)
    fusion = ScoreFusion(eta=eta, prob_mode="analyst")
    for q, row, b in zip(qbar, p, batch):
        one = fusion.fuse([] if np.isnan(q) else [q], probabilities={str(c): v for c, v in zip(range(1, 6), row)})
        assert b == pytest.approx(one.score, abs=1e-9)
    assert fused_scores(qbar[:1], p[:1], eta)[0] == pytest.approx(5.0)


def test_fused_scores_rejects_mismatched_shapes():
    from agentic_iqa.fusion import fused_scores

    with pytest.raises(ValueError, match="qbar"):
        fused_scores(np.ones(3), np.full((2, 5), 0.2), 1.0)
