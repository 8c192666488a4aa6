"""State models (spec 001, 003; DESIGN §3): validators, accepted spellings, JSON round-trip."""
import json
import math
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from iqa_tools.records import ToolExecutionLog
from signatures.models import (
    DISTORTION_CATEGORIES,
    SEVERITIES,
    DistortionAnalysis,
    DistortionAnalysisMap,
    DistortionSet,
    ExecutorOutput,
    PlanControlFlags,
    PlannerDecision,
    PlannerOutput,
    SummarizerOutput,
    ToolAssignment,
    check_analysis_matches,
    normalize_category,
    normalize_tool_name,
)

KNOWN = {"known_tools": ["QAlign", "TOPIQ_FR", "NIQE", "BRISQUE", "LPIPS"]}


def plan_dict(**overrides):
    d = {
        "query_type": "IQA",
        "query_scope": ["Global"],
        "distortion_source": "Inferred",
        "distortions": None,
        "required_tool": None,
        "plan": {"distortion_detection": True, "distortion_analysis": True, "tool_selection": True, "tool_execution": True},
    }
    d.update(overrides)
    return d


# ── vocabularies ────────────────────────────────────────────────────────────────────────────────


def test_vocabularies_are_the_spec_lists():
    assert DISTORTION_CATEGORIES == (
        "Blurs", "Color distortions", "Compression", "Noise", "Brightness change", "Sharpness", "Contrast",
    )
    assert SEVERITIES == ("none", "slight", "moderate", "severe", "extreme")


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("Blurs", "Blurs"),
        ("blur", "Blurs"),
        ("Motion-Blur", "Blurs"),
        ("color", "Color distortions"),
        ("Colour  Distortion", "Color distortions"),
        ("jpeg", "Compression"),
        ("compression artifacts", "Compression"),
        ("JPEG2000", "Compression"),
        ("gaussian_noise", "Noise"),
        ("brightness", "Brightness change"),
        ("exposure", "Brightness change"),
        ("over-exposure", "Brightness change"),
        ("SHARPNESS", "Sharpness"),
        ("low contrast", "Contrast"),
    ],
)
def test_category_synonyms(raw, expected):
    assert normalize_category(raw) == expected


def test_unknown_category_message_lists_valid_ones():
    with pytest.raises(ValueError) as exc:
        normalize_category("haze")
    assert "'haze'" in str(exc.value) and "Brightness change" in str(exc.value)


def test_overall_only_where_allowed():
    assert normalize_category("overall", allow_overall=True) == "Overall"
    with pytest.raises(ValueError):
        normalize_category("Overall")


def test_tool_name_matching():
    tools = KNOWN["known_tools"]
    assert normalize_tool_name("q-align", tools) == "QAlign"
    assert normalize_tool_name("topiq-fr", tools) == "TOPIQ_FR"
    assert normalize_tool_name(" NIQE ", None) == "NIQE"  # no registry: only stripped
    with pytest.raises(ValueError, match="unknown tool 'MagicIQA'"):
        normalize_tool_name("MagicIQA", tools)


# ── DistortionAnalysis ──────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("raw, expected", [("mild", "slight"), ("Heavy", "severe"), (" MODERATE ", "moderate"), ("none", "none")])
def test_severity_aliases(raw, expected):
    assert DistortionAnalysis(type="blur", severity=raw, explanation="soft edges").severity == expected


def test_severity_invalid():
    with pytest.raises(ValidationError) as exc:
        DistortionAnalysis(type="Blurs", severity="terrible", explanation="x")
    assert "severity" in str(exc.value)


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_explanation_must_not_be_empty(text):
    with pytest.raises(ValidationError, match="explanation must not be empty"):
        DistortionAnalysis(type="Blurs", severity="slight", explanation=text)


def test_analysis_fields_required_and_type_validated():
    with pytest.raises(ValidationError) as exc:
        DistortionAnalysis(type="Blurs")
    assert {e["loc"][0] for e in exc.value.errors()} == {"severity", "explanation"}
    with pytest.raises(ValidationError, match="unknown distortion type 'haze'"):
        DistortionAnalysis(type="haze", severity="slight", explanation="x")
    assert DistortionAnalysis(type="jpeg", severity="slight", explanation="x").type == "Compression"


# ── Planner ─────────────────────────────────────────────────────────────────────────────────────


def test_flag_aliases():
    flags = PlanControlFlags.model_validate(
        {"distortion_detection": "false", "distortion_analysis": True, "tool_select": False, "tool_execute": "true"}
    )
    assert flags == PlanControlFlags(distortion_detection=False, distortion_analysis=True, tool_selection=False, tool_execution=True)


def test_flags_missing_is_an_error():
    with pytest.raises(ValidationError) as exc:
        PlanControlFlags.model_validate({"distortion_detection": True, "distortion_analysis": True, "tool_selection": True})
    assert exc.value.errors()[0]["loc"] == ("tool_execution",)


@pytest.mark.parametrize(
    "region, tool, selection, execution",
    [(True, True, False, True), (True, False, False, False), (False, True, False, True), (False, False, True, True)],
)
def test_flag_rules_table(region, tool, selection, execution):
    flags = PlanControlFlags.from_rules(query_type="IQA", distortion_source="Inferred", region_named=region, tool_named=tool)
    assert (flags.tool_selection, flags.tool_execution) == (selection, execution)
    assert flags.distortion_detection and flags.distortion_analysis


def test_flag_rules_explicit_and_other():
    explicit = PlanControlFlags.from_rules(query_type="IQA", distortion_source="Explicit", region_named=False, tool_named=False)
    assert not explicit.distortion_detection and explicit.distortion_analysis
    other = PlanControlFlags.from_rules(query_type="Other", distortion_source="Inferred", region_named=False, tool_named=True)
    assert not any(other.model_dump().values())


def test_planner_decision_accepts_paper_spellings():
    d = PlannerDecision.model_validate(plan_dict(
        query_type="iqa",
        query_scope="sky",  # bare string, as in the paper's figures
        distortion_source="Explict",  # the paper's own typo
        distortions={"sky": "blur"},
        required_tool="q-align",
        plan={"distortion_detection": False, "distortion_analysis": True, "tool_selection": False, "tool_execute": True},
    ), context=KNOWN)
    assert d.query_type == "IQA"
    assert d.query_scope == ["sky"]
    assert d.distortion_source == "Explicit"
    assert d.distortions == {"sky": ["Blurs"]}
    assert d.required_tool == ["QAlign"]
    assert d.plan.tool_execution is True
    assert d.region_named


def test_planner_decision_empty_values_become_null_or_global():
    d = PlannerDecision.model_validate(plan_dict(query_scope=[], distortions={}, required_tool="none"))
    assert d.query_scope == ["Global"] and d.distortions is None and d.required_tool is None
    assert not d.region_named
    assert d.expected_flags() == d.plan


def test_planner_decision_unknown_tool_with_registry_context():
    with pytest.raises(ValidationError, match="unknown tool 'SuperIQA'"):
        PlannerDecision.model_validate(plan_dict(required_tool=["SuperIQA"]), context=KNOWN)
    # Without the registry the model cannot know, so it accepts the name.
    assert PlannerDecision.model_validate(plan_dict(required_tool=["SuperIQA"])).required_tool == ["SuperIQA"]


def test_planner_decision_rejects_bad_values():
    with pytest.raises(ValidationError) as exc:
        PlannerDecision.model_validate(plan_dict(query_type="Aesthetic", distortion_source="Guessed"))
    fields = {e["loc"][0] for e in exc.value.errors()}
    assert fields == {"query_type", "distortion_source"}


@pytest.mark.parametrize(
    "raw, expected",
    [("Full-Reference", "Full-Reference"), ("FR", "Full-Reference"), ("full reference", "Full-Reference"),
     ("No-reference", "No-Reference"), ("NR", "No-Reference"), ("no_reference", "No-Reference")],
)
def test_reference_mode_spellings(raw, expected):
    assert PlannerOutput.model_validate(plan_dict(reference_mode=raw)).reference_mode == expected


def test_planner_output_from_decision_sets_reference_mode_by_code():
    decision = PlannerDecision.model_validate(plan_dict())
    assert PlannerOutput.from_decision(decision, has_reference=True).reference_mode == "Full-Reference"
    out = PlannerOutput.from_decision(decision, has_reference=False)
    assert out.reference_mode == "No-Reference"
    assert PlannerOutput.model_validate_json(out.model_dump_json()) == out
    assert "reference_mode" not in PlannerDecision.model_fields


def test_planner_output_requires_reference_mode_and_forbids_extras():
    with pytest.raises(ValidationError):
        PlannerOutput.model_validate(plan_dict())
    with pytest.raises(ValidationError, match="extra"):
        PlannerOutput.model_validate(plan_dict(reference_mode="NR", confidence=0.9))


# ── Executor ────────────────────────────────────────────────────────────────────────────────────


def log(tool="QAlign", score=2.89, **kw):
    return ToolExecutionLog(tool_name=tool, object_name="Global", distortion="Blurs", raw_score=3.0,
                            normalized_score=score, execution_time=0.12,
                            timestamp=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc), **kw)


def full_output(**kw):
    data = dict(
        distortion_set={"Global": ["Blurs", "Noise"], "sky": ["Color distortions"]},
        distortion_analysis={
            "Global": [DistortionAnalysis(type="Blurs", severity="moderate", explanation="soft edges"),
                       DistortionAnalysis(type="Noise", severity="slight", explanation="grain")],
            "sky": [DistortionAnalysis(type="Color distortions", severity="none", explanation="natural blue")],
        },
        selected_tools={"Global": {"Blurs": "QAlign", "Noise": "NIQE"}},
        quality_scores={"Global": {"Blurs": ("QAlign", 2.89), "Noise": ("NIQE", 3.4)}},
        tool_logs=[log(), log("NIQE", 3.4)],
    )
    data.update(kw)
    return ExecutorOutput.model_validate(data, context=KNOWN)


def test_executor_output_defaults():
    out = ExecutorOutput()
    assert out.distortion_set is None and out.distortion_analysis is None
    assert out.selected_tools is None and out.quality_scores is None and out.tool_logs == []
    assert json.loads(out.model_dump_json()) == {
        "distortion_set": None, "distortion_analysis": None, "selected_tools": None, "quality_scores": None, "tool_logs": [],
    }


def test_executor_output_normalizes_keys_and_types():
    out = ExecutorOutput.model_validate({
        "distortion_set": {"global": ["blur", "Blurs", "jpeg"], "": ["noise"]},
        "selected_tools": {"Global": {"blur": "q-align", "overall": "niqe"}},
        "quality_scores": {"Global": {"Blurs": ["qalign", 3.0]}},
    }, context=KNOWN)
    assert out.distortion_set == {"Global": ["Blurs", "Compression", "Noise"]}
    assert out.selected_tools == {"Global": {"Blurs": "QAlign", "Overall": "NIQE"}}
    assert out.quality_scores == {"Global": {"Blurs": ("QAlign", 3.0)}}
    assert out.tool_scores() == [3.0]


def test_executor_output_rejects_unknown_distortion():
    with pytest.raises(ValidationError, match="unknown distortion type 'haze'"):
        ExecutorOutput(distortion_set={"Global": ["haze"]})


def test_executor_output_tool_names_checked_only_with_registry():
    with pytest.raises(ValidationError, match="unknown tool 'SuperIQA'"):
        ExecutorOutput.model_validate({"selected_tools": {"Global": {"Blurs": "SuperIQA"}}}, context=KNOWN)
    with pytest.raises(ValidationError, match="unknown tool 'SuperIQA'"):
        ExecutorOutput.model_validate({"quality_scores": {"Global": {"Blurs": ("SuperIQA", 3.0)}}}, context=KNOWN)
    assert ExecutorOutput(selected_tools={"Global": {"Blurs": "SuperIQA"}}).selected_tools == {"Global": {"Blurs": "SuperIQA"}}


@pytest.mark.parametrize("score", [0.99, 5.01, float("nan"), float("inf")])
def test_quality_scores_in_range(score):
    with pytest.raises(ValidationError, match=r"outside \[1, 5\]"):
        ExecutorOutput(quality_scores={"Global": {"Blurs": ("QAlign", score)}})


def test_quality_scores_must_be_pairs():
    with pytest.raises(ValidationError):
        ExecutorOutput(quality_scores={"Global": {"Blurs": "QAlign"}})


def test_analysis_must_match_distortion_set():
    bad = {"Global": [DistortionAnalysis(type="Contrast", severity="slight", explanation="flat")]}
    with pytest.raises(ValidationError, match="'Contrast' is not among the listed distortions"):
        ExecutorOutput(distortion_set={"Global": ["Blurs"]}, distortion_analysis=bad)
    with pytest.raises(ValueError, match="object 'sky' is not in the distortion set"):
        check_analysis_matches({"sky": bad["Global"]}, {"Global": ["Contrast"]})
    # With no distortion set there is nothing to check against.
    assert ExecutorOutput(distortion_analysis=bad).distortion_analysis == bad


def test_executor_output_round_trip_exact():
    out = full_output()
    text = out.model_dump_json()
    back = ExecutorOutput.model_validate_json(text, context=KNOWN)
    assert back == out
    assert isinstance(back.distortion_analysis["Global"][0], DistortionAnalysis)
    assert isinstance(back.quality_scores["Global"]["Blurs"], tuple)
    assert json.loads(text)["tool_logs"][0]["timestamp"] == "2026-01-02T03:04:05.678901Z"
    assert back.tool_logs[0].timestamp == out.tool_logs[0].timestamp


def test_executor_output_round_trip_failed_log_keeps_nan():
    failed = ToolExecutionLog(tool_name="QAlign", error="weights missing",
                              timestamp=datetime(2026, 1, 2, tzinfo=timezone.utc))
    out = full_output(tool_logs=[failed, log("NIQE", 3.4, fallback=True, fallback_for="QAlign")])
    text = out.model_dump_json()
    assert '"normalized_score":"NaN"' in text
    back = ExecutorOutput.model_validate_json(text)
    assert math.isnan(back.tool_logs[0].normalized_score) and back.tool_logs[0].error == "weights missing"
    # NaN != NaN, so compare the serialized forms: identical text means identical values.
    assert back.model_dump_json() == text
    assert back.tool_logs[1].fallback and back.tool_logs[1].fallback_for == "QAlign"


def test_executor_output_invalid_json_structure():
    with pytest.raises(ValidationError):
        ExecutorOutput.model_validate_json('{"distortion_set": ["Blurs"]}')
    with pytest.raises(ValidationError, match="extra"):
        ExecutorOutput.model_validate_json('{"distortions": {}}')


def test_signature_output_containers():
    assert DistortionSet.model_validate({"whole image": "blur"}).root == {"Global": ["Blurs"]}
    amap = DistortionAnalysisMap.model_validate({"global": [{"type": "noise", "severity": "mild", "explanation": "grain"}]})
    assert amap.root["Global"][0].severity == "slight"
    with pytest.raises(ValidationError, match="unknown tool"):
        ToolAssignment.model_validate({"Global": {"Blurs": "Nope"}}, context=KNOWN)
    assert ToolAssignment.model_validate({"Global": {"blurs": "qalign"}}, context=KNOWN).root == {"Global": {"Blurs": "QAlign"}}


# ── Summarizer ──────────────────────────────────────────────────────────────────────────────────


def test_summarizer_minimal_and_defaults():
    out = SummarizerOutput(final_answer="B", quality_reasoning="The sky is sharp.")
    assert out.need_replan is False and out.replan_reason is None
    assert out.level is None and out.score is None and out.probabilities is None


def test_summarizer_scoring_round_trip():
    out = SummarizerOutput(
        final_answer="C", quality_reasoning="moderate blur", level="c", score=2.6019,
        probabilities={"A": 0.1, "B": 0.2, "C": 0.4, "D": 0.2, "E": 0.1}, prob_mode="logits",
        prob_source="log-probs of token #7 'C'",
    )
    assert out.level == "C"
    assert out.probabilities == {"1": 0.1, "2": 0.2, "3": 0.4, "4": 0.2, "5": 0.1}  # A = "5"
    assert SummarizerOutput.model_validate_json(out.model_dump_json()) == out


@pytest.mark.parametrize("raw", ["B", "b", "B.", "B. Good", "Good", 4])
def test_summarizer_level_spellings(raw):
    assert SummarizerOutput(final_answer="x", quality_reasoning="y", level=raw).level == "B"


def test_summarizer_validation_messages():
    with pytest.raises(ValidationError, match="replan_reason is empty"):
        SummarizerOutput(final_answer="x", quality_reasoning="y", need_replan=True)
    with pytest.raises(ValidationError, match="final_answer must not be empty"):
        SummarizerOutput(final_answer=" ", quality_reasoning="y")
    with pytest.raises(ValidationError, match=r"outside \[1, 5\]"):
        SummarizerOutput(final_answer="x", quality_reasoning="y", score=5.5)
    with pytest.raises(ValidationError, match="missing"):
        SummarizerOutput(final_answer="x", quality_reasoning="y", probabilities={"1": 0.5, "2": 0.5}, prob_mode="analyst")
    with pytest.raises(ValidationError, match="sum to 0.9"):
        SummarizerOutput(final_answer="x", quality_reasoning="y", prob_mode="analyst",
                         probabilities={"1": 0.1, "2": 0.2, "3": 0.3, "4": 0.2, "5": 0.1})
    with pytest.raises(ValidationError, match="without prob_mode"):
        SummarizerOutput(final_answer="x", quality_reasoning="y", probabilities={str(c): 0.2 for c in range(1, 6)})
    with pytest.raises(ValidationError, match="prob_mode"):
        SummarizerOutput(final_answer="x", quality_reasoning="y", prob_mode="guess")
    with pytest.raises(ValidationError, match="level 5 given twice"):
        SummarizerOutput(final_answer="x", quality_reasoning="y", prob_mode="analyst",
                         probabilities={"A": 0.2, "5": 0.2, "2": 0.2, "3": 0.2, "4": 0.2})


def test_categories_have_one_home():
    """The tool table, the state models and the detection prompt use the same seven categories."""
    from iqa_tools.categories import DISTORTION_CATEGORIES
    from signatures import DetectDistortionsSignature
    from signatures.models import DistortionAnalysis

    assert all(f'"{c}"' in DetectDistortionsSignature.instructions for c in DISTORTION_CATEGORIES)
    for c in DISTORTION_CATEGORIES:
        DistortionAnalysis.model_validate({"type": c, "severity": "slight", "explanation": "x"})
    with pytest.raises(ValueError):
        DistortionAnalysis.model_validate({"type": "Spatial distortions", "severity": "slight", "explanation": "x"})
