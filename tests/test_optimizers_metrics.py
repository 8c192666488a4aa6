"""Graded metrics: partial credit where partly right, feedback that names the rule or the error."""
from __future__ import annotations

import copy

import dspy
import pytest

from optimizers.fixtures import default_catalog, load_dataset
from optimizers.metrics import ModuleMetric, grade
from signatures.models import PlannerDecision


@pytest.fixture(scope="module")
def data():
    return {m: load_dataset(m) for m in ("planner", "detect", "analyze", "select", "summarize")}


def example(data, module, fixture_id=None, part=None):
    pool = data[module].train + data[module].val
    return next(e for e in pool if (fixture_id is None or e.fixture_id == fixture_id) and (part is None or e.part == part))


def pred(**fields):
    return dspy.Prediction(**fields)


def test_planner_metric_weights_fields_and_explains_the_flag_rule(data):
    ex = example(data, "planner", "exp-region-sky-noise")  # region named, no tool: no selection/execution
    gold = ex.planner_output
    assert grade(ex, pred(planner_output=gold)).score == 1.0
    wrong = gold.model_copy(deep=True)
    wrong.plan.tool_selection = wrong.plan.tool_execution = True
    g = grade(ex, pred(planner_output=wrong))
    assert g.score == pytest.approx(0.8)
    assert "region is named without a tool" in g.feedback
    # A plan given as a dict (e.g. from a saved trace) is read the same way; scope compares case-insensitively.
    as_dict = gold.model_dump()
    as_dict["query_scope"] = ["Sky"]
    assert grade(ex, pred(planner_output=as_dict)).score == 1.0
    other = PlannerDecision.model_validate({**gold.model_dump(), "query_type": "Other", "query_scope": ["Global"]})
    assert grade(ex, pred(planner_output=other)).score < 0.8


def test_detection_is_f1_over_categories(data):
    ex = example(data, "detect")
    (cat,) = ex.distortion_set["Global"]
    other = "Noise" if cat != "Noise" else "Blurs"
    assert grade(ex, pred(distortion_set={"Global": [cat]})).score == 1.0
    assert grade(ex, pred(distortion_set={"global": [cat, other]})).score == pytest.approx(2 / 3)
    g = grade(ex, pred(distortion_set={"Global": [other]}))
    assert g.score == 0.0 and "missed" in g.feedback.lower()


def test_analysis_scores_severity_distance(data):
    ex = next(e for e in data["analyze"].train if any(a["severity"] == "severe" for a in e.distortion_analysis["Global"]))
    items = copy.deepcopy(ex.distortion_analysis["Global"])
    assert grade(ex, pred(distortion_analysis={"Global": items})).score == 1.0
    for item in items:
        if item["severity"] == "severe":
            item["severity"] = "moderate"  # one step off on one of two items
    g = grade(ex, pred(distortion_analysis={"Global": items}))
    assert g.score == pytest.approx((0.75 + 1.0) / 2)
    assert "should be severe, not moderate" in g.feedback
    assert grade(ex, pred(distortion_analysis={"Global": items[:1]})).score <= 0.5  # a missing item scores 0


def test_selection_credits_acceptable_tools_and_the_right_fr_nr_kind(data):
    modes = default_catalog().modes
    nr = next(e for e in data["select"].train + data["select"].val
              if e.reference_mode == "No-Reference" and e.distortion_set == {"Global": ["Blurs"]})
    assert grade(nr, pred(selected_tools={"Global": {"Blurs": "UNIQUE"}}), modes).score == 1.0
    assert grade(nr, pred(selected_tools={"Global": {"Blurs": "NIQE"}}), modes).score == pytest.approx(0.4)
    g = grade(nr, pred(selected_tools={"Global": {"Blurs": "SSIM"}}), modes)
    assert g.score == 0.0 and "FR tool" in g.feedback
    fr = next(e for e in data["select"].train + data["select"].val
              if e.reference_mode == "Full-Reference" and e.distortion_set == {"Global": ["Compression"]})
    assert grade(fr, pred(selected_tools={"Global": {"Compression": "VIF"}}), modes).score == 1.0
    assert grade(fr, pred(selected_tools={"Global": {"Compression": "UNIQUE"}}), modes).score == 0.0


def test_summarizer_letter_and_level_distance(data):
    explain = example(data, "summarize", part="explain")
    letter = explain.final_answer
    wrong = next(x for x in "ABCD" if x != letter)
    ok = dict(quality_reasoning="r", need_replan=False, replan_reason=None)
    assert grade(explain, pred(final_answer=f"{letter}. whatever", **ok)).score == 1.0
    assert grade(explain, pred(final_answer=wrong, **ok)).score == pytest.approx(0.1)
    score = next(e for e in data["summarize"].train if e.part == "score" and e.level == "C")
    assert grade(score, pred(level="C", **ok)).score == 1.0
    assert grade(score, pred(level="A", **ok)).score == pytest.approx(0.9 * 0.5 + 0.1)
    assert grade(score, pred(level="D", need_replan=True, replan_reason="x", quality_reasoning="r")).score == pytest.approx(0.9 * 0.75)


def test_a_prediction_that_never_validated_scores_zero_with_its_error(data):
    ex = example(data, "detect")
    g = grade(ex, dspy.Prediction(failed=True, errors=["unknown distortion type 'Fog'"]))
    assert g.score == 0.0 and "Fog" in g.feedback


def test_module_metric_speaks_both_dspy_metric_protocols(data):
    ex = example(data, "detect")
    seen = []
    metric = ModuleMetric(on_call=seen.append)
    p = pred(distortion_set=ex.distortion_set)
    assert metric(ex, p) == 1.0 and metric(ex, p, None) == 1.0  # Evaluate / BootstrapFewShot
    gepa = metric(ex, p, None, "step.predict", [])  # GEPA's per-predictor call wants feedback
    assert gepa.score == 1.0 and gepa.feedback
    assert metric.calls == 3 and seen == [1.0, 1.0, 1.0]
