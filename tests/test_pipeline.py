"""The whole pipeline (graph, agents, registry, fusion) with canned VLMs standing in for the model."""
from __future__ import annotations

import math

import pytest

from canned import CannedVLM, Reply, disable_dspy_cache, valid_reply, write_test_image

from agentic_iqa.agents.vlm import VLMRoles
from agentic_iqa.api import Assessor
from agentic_iqa.config import load_settings
from agentic_iqa.fusion import ScoreFusion


@pytest.fixture(scope="module", autouse=True)
def _no_dspy_cache():
    disable_dspy_cache()


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    return load_settings(tmp_path_factory.mktemp("cfg"), cache={"enabled": False})


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    img = write_test_image(d / "photo.jpg", size=(96, 72), quality=60)
    ref = write_test_image(d / "ref.png", size=(96, 72), fmt="PNG", seed=0)
    return img, ref


@pytest.fixture(scope="module")
def registry(settings):
    from iqa_tools import ToolRegistry

    return ToolRegistry(cache=False)


def run(settings, registry, routes, image, query, reference=None, logprobs=True, **kw):
    vlm = CannedVLM(routes, logprobs=logprobs)
    roles = VLMRoles(settings, lms={"planner": vlm.lm, "executor": vlm.lm, "summarizer": vlm.lm})
    result = Assessor(settings, registry=registry, roles=roles).assess(image, query, reference, **kw)
    return result, vlm


SELECT_PIQE = {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}}
LOGPROBS = {"A": -3.0, "B": -0.4, "C": -1.2, "D": -4.0, "E": -6.0}


def test_nr_scoring_runs_every_subtask_and_fuses_logprobs_with_tool_scores(settings, registry, images):
    img, _ = images
    result, vlm = run(settings, registry, {
        "plan": valid_reply("plan"),
        "detect": valid_reply("detect"),
        "analyze": valid_reply("analyze"),
        "select": SELECT_PIQE,
        "score": Reply(valid_reply("score", level="B"), level_logprobs=LOGPROBS),
    }, img, "Rate the quality of this photo")
    assert result.mode == "score" and result.backend.startswith("vlm")
    assert [c.route for c in vlm.calls].count("score") == 1 and vlm.count() == 5
    assert result.plan.reference_mode == "No-Reference"
    ev = result.evidence
    assert ev.distortion_set and ev.distortion_analysis and ev.selected_tools["Global"]["Blurs"] == "PIQE"
    piqe = [lg for lg in ev.tool_logs if lg.tool_name == "PIQE"]
    assert piqe and all(lg.ok for lg in piqe) and 1 <= piqe[0].normalized_score <= 5
    # The fused score is exactly the spec's fusion of the PIQE score and the letter log-probs.
    expected = ScoreFusion().fuse([piqe[0].normalized_score], level_logprobs=LOGPROBS)
    assert result.score == pytest.approx(expected.score, abs=1e-9)
    assert result.result.prob_mode == "logits" and result.level == expected.level
    assert set(result.timings) >= {"planner", "detect", "analyze", "execute", "summarizer"}
    assert result.lm_calls == 5 and result.retries == 0 and result.replans == 0


def test_the_image_reaches_the_model_as_its_original_bytes(settings, registry, images):
    img, _ = images
    _, vlm = run(settings, registry, {
        "plan": valid_reply("plan", query_type="Other", plan={"distortion_detection": False, "distortion_analysis": False, "tool_selection": False, "tool_execution": False}),
        "explain": valid_reply("explain"),
    }, img, "Does this photo feel calm?")
    assert vlm.calls[0].images[0].data == img.read_bytes()


def test_example_images_work_in_the_api_as_in_the_cli(settings, registry):
    from iqa_tools.examples import example_image

    _, vlm = run(settings, registry, {
        "plan": valid_reply("plan", query_type="Other", plan={"distortion_detection": False, "distortion_analysis": False, "tool_selection": False, "tool_execution": False}),
        "explain": valid_reply("explain"),
    }, "example:camera", "Does this photo feel calm?")
    assert vlm.calls[0].images[0].data == example_image("camera").read_bytes()


def test_region_question_runs_no_tools_and_does_not_replan_for_missing_scores(settings, registry, images):
    img, _ = images
    plan = valid_reply("plan", query_scope=["sky"], distortion_source="Explicit", distortions={"sky": ["Blurs"]},
                       plan={"distortion_detection": False, "distortion_analysis": True, "tool_selection": False, "tool_execution": False})
    analysis = {"distortion_analysis": {"sky": [{"type": "Blurs", "severity": "moderate", "explanation": "soft clouds"}]}}
    answer = valid_reply("explain", final_answer="A", need_replan=True, replan_reason="no tool scores were collected")
    result, vlm = run(settings, registry, {"plan": plan, "analyze": analysis, "explain": answer}, img,
                      "Is the sky blurry? A. Yes B. No")
    assert result.mode == "answer" and result.answer == "A"
    assert result.evidence.tool_logs == [] and result.evidence.distortion_set == {"sky": ["Blurs"]}
    assert result.replans == 0 and vlm.count("plan") == 1
    assert not result.result.need_replan
    assert any("replan request ignored" in n for n in result.notes)


def test_replan_carries_the_summarizers_reason_back_to_the_planner(settings, registry, images):
    img, _ = images
    first = valid_reply("score", level="C", need_replan=True, replan_reason="noise in the shadows was not checked")
    result, vlm = run(settings, registry, {
        "plan": [valid_reply("plan"), valid_reply("plan")],
        "detect": [valid_reply("detect")] * 2,
        "analyze": [valid_reply("analyze")] * 2,
        "select": [SELECT_PIQE] * 2,
        "score": [Reply(first, level_logprobs=LOGPROBS), Reply(valid_reply("score", level="B"), level_logprobs=LOGPROBS)],
    }, img, "Rate this photo")
    assert result.replans == 1 and vlm.count("plan") == 2
    assert "noise in the shadows was not checked" in vlm.calls_for("plan")[1].user_text
    assert not result.result.need_replan


def test_replans_stop_at_max_replan(settings, registry, images):
    img, _ = images
    always = Reply(valid_reply("score", level="C", need_replan=True, replan_reason="still unsure"), level_logprobs=LOGPROBS)
    result, vlm = run(settings, registry, {
        "plan": [valid_reply("plan")] * 3, "detect": [valid_reply("detect")] * 3, "analyze": [valid_reply("analyze")] * 3,
        "select": [SELECT_PIQE] * 3, "score": [always] * 3,
    }, img, "Rate this photo")
    assert vlm.count("plan") == 3 and result.replans == 2  # max_replan = 2 by default


def test_required_tool_skips_selection_and_runs_for_every_distortion(settings, registry, images):
    img, ref = images
    plan = valid_reply("plan", required_tool=["PSNR"], plan={"distortion_detection": True, "distortion_analysis": True, "tool_selection": False, "tool_execution": True})
    result, vlm = run(settings, registry, {
        "plan": plan, "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "score": Reply(valid_reply("score", level="B"), level_logprobs=LOGPROBS),
    }, img, "Rate this photo with PSNR", reference=ref)
    assert vlm.count("select") == 0
    assert result.plan.reference_mode == "Full-Reference"
    assert {d: t for d, t in result.evidence.selected_tools["Global"].items()} == {"Blurs": "PSNR", "Noise": "PSNR"}
    assert all(lg.tool_name == "PSNR" and lg.ok for lg in result.evidence.tool_logs)


def test_unknown_tool_is_fed_back_then_corrected(settings, registry, images):
    img, _ = images
    result, vlm = run(settings, registry, {
        "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "select": [{"selected_tools": {"Global": {"Blurs": "SuperIQA", "Noise": "PIQE"}}}, SELECT_PIQE],
        "score": Reply(valid_reply("score", level="B"), level_logprobs=LOGPROBS),
    }, img, "Rate this photo")
    second = vlm.calls_for("select")[1]
    assert second.retried_with_feedback and "SuperIQA" in second.system
    assert result.retries == 1 and result.evidence.selected_tools["Global"]["Blurs"] == "PIQE"


def test_fr_tool_without_reference_is_refused_and_selection_falls_back(settings, registry, images):
    img, _ = images
    bad = {"selected_tools": {"Global": {"Blurs": "SSIM", "Noise": "SSIM"}}}
    result, vlm = run(settings, registry, {
        "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "select": [bad] * 4, "score": Reply(valid_reply("score", level="B"), level_logprobs=LOGPROBS),
    }, img, "Rate this photo")
    assert vlm.count("select") == 4  # first try + 3 retries
    assert "full-reference" in vlm.calls_for("select")[1].system
    used = {t for d in result.evidence.selected_tools.values() for t in d.values()}
    assert used and all(registry.spec(t).mode == "NR" for t in used)
    assert any("generic tools" in f for f in result.fallbacks)


def test_failing_subtasks_leave_null_fields_and_never_fail_the_executor(settings, registry, images):
    img, _ = images
    result, vlm = run(settings, registry, {
        "plan": valid_reply("plan"),
        "detect": ["not json"] * 4,
        "select": ["{}"] * 4,
        "score": Reply(valid_reply("score", level="C"), level_logprobs=LOGPROBS),
    }, img, "Rate this photo")
    ev = result.evidence
    assert ev.distortion_set is None and ev.distortion_analysis is None
    assert ev.tool_logs and any(lg.ok for lg in ev.tool_logs)  # generic fallback tool still ran
    assert result.retries >= 6 and result.score is not None


def test_planner_garbage_falls_back_to_the_rule_based_plan(settings, registry, images):
    img, _ = images
    result, vlm = run(settings, registry, {
        "plan": ["I think you should look at the sky."] * 4,
        "analyze": {"distortion_analysis": {"sky": [{"type": "Blurs", "severity": "slight", "explanation": "a little soft"}]}},
        "explain": valid_reply("explain", final_answer="B"),
    }, img, "Is the sky blurry? A. Yes B. No")
    assert result.plan.query_scope == ["sky"] and result.plan.distortions == {"sky": ["Blurs"]}
    assert any("rule-based plan" in f for f in result.fallbacks)
    assert result.answer == "B"


def test_without_logprobs_the_classification_fallback_is_recorded(settings, registry, images):
    img, _ = images
    result, _ = run(settings, registry, {
        "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "select": SELECT_PIQE, "score": valid_reply("score", level="D"),
    }, img, "Rate this photo", logprobs=False)
    assert result.result.prob_mode == "classification"
    assert result.result.probabilities["2"] == pytest.approx(0.7)
    assert math.isfinite(result.score)


def test_probability_mode_can_be_set_per_pipeline(tmp_path, registry, images):
    img, _ = images
    s = load_settings(tmp_path, cache={"enabled": False}, fusion={"eta": 1.0, "prob_mode": "uniform"})
    result, _ = run(s, registry, {
        "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "select": SELECT_PIQE, "score": Reply(valid_reply("score", level="A"), level_logprobs=LOGPROBS),
    }, img, "Rate this photo")
    assert result.result.prob_mode == "uniform"
    assert list(result.result.probabilities.values()) == pytest.approx([0.2] * 5)


def test_progress_events_stream_from_the_nodes_and_the_trace_lives_in_the_state(settings, registry, images):
    """Progress goes out through LangGraph's stream writer; the result is built from the final state."""
    routes = {"plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
              "select": SELECT_PIQE, "score": valid_reply("score", level="B"), "_logprobs": LOGPROBS}
    events: list[dict] = []
    quiet, _ = run(settings, registry, routes, images[0], "Rate the quality")
    loud, _ = run(settings, registry, routes, images[0], "Rate the quality", on_event=events.append)
    starts = [e["stage"] for e in events if e["event"] == "start"]
    assert starts[:2] == ["planner", "detect"] and starts[-2:] == ["evidence", "summarizer"]
    assert {"analyze", "select", "execute"} <= set(starts)
    assert [e["tool"] for e in events if e["event"] == "tool_start"] == ["PIQE"]
    # The same answer with or without a listener; the counts come from the state's summed keys.
    assert (loud.level, loud.lm_calls, loud.fallbacks) == (quiet.level, quiet.lm_calls, quiet.fallbacks) == ("B", 5, [])
    assert [ev.stage for ev in loud.trace if ev.kind == "end"][-1] == "summarizer"


def test_create_assessor_is_a_reusable_callable(images):
    from agentic_iqa import create_assessor

    iqa = create_assessor(offline=True, device="cpu")
    assert iqa.settings.pipeline.tools.device == "cpu" and iqa.settings.pipeline.backend == "offline"
    first, second = iqa(images[0]), iqa(images[0], "Is the image noisy?")
    assert first.backend == "offline analyst" and 1.0 <= first.score <= 5.0
    assert second.mode == "answer" and iqa.registry is iqa.registry  # one registry for every call


def test_with_a_reference_an_nr_pick_is_replaced_by_an_fr_tool_and_recorded(settings, registry, images):
    img, ref = images
    routes = {
        "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "select": SELECT_PIQE, "score": Reply(valid_reply("score", level="B"), level_logprobs=LOGPROBS),
    }
    result, _ = run(settings, registry, routes, img, "Rate the quality of this photo", reference=ref)
    used = {t for d in result.evidence.selected_tools.values() for t in d.values()}
    assert used and all(registry.spec(t).mode == "FR" for t in used), used
    assert "PIQE" not in {lg.tool_name for lg in result.evidence.tool_logs}
    assert any("full-reference tools replace" in n and "PIQE →" in n for n in result.notes), result.notes
    # Named in the query, the NR tool is kept.
    result, _ = run(settings, registry, routes, img, "Rate this photo with PIQE", reference=ref)
    assert {t for d in result.evidence.selected_tools.values() for t in d.values()} == {"PIQE"}
    assert not any("full-reference tools replace" in n for n in result.notes)


@pytest.mark.parametrize("query", [
    "Is the image blurry? A. Yes B. No",
    "Is the image blurry?\n(A) Yes\n(B) No",
    "Is the image blurry? A) Yes B) No",
])
def test_mcq_answer_is_held_to_the_offered_options_with_its_probability(settings, registry, images, query):
    from agentic_iqa.agents.planner_rules import mcq_options

    assert mcq_options(query) == {"A": "Yes", "B": "No"}
    img, _ = images
    plan = valid_reply("plan", query_type="MCQ", plan={"distortion_detection": False, "distortion_analysis": False,
                                                       "tool_selection": False, "tool_execution": False})
    result, vlm = run(settings, registry, {
        "plan": plan,
        "explain": [valid_reply("explain", final_answer="C"),
                    Reply(valid_reply("explain", final_answer="B"), field="final_answer",
                          level_logprobs={"A": -1.6, "B": -0.25, "C": -3.0})],
    }, img, query)
    assert vlm.count("explain") == 2 and "offered options (A, B)" in vlm.calls_for("explain")[1].system
    assert result.answer == "B" and result.retries >= 1
    note = next(n for n in result.notes if "over the offered options" in n)
    pa, pb = math.exp(-1.6), math.exp(-0.25)
    assert f"probability {pb / (pa + pb):.2f}" in note and "C" not in note.split("(")[1]


def test_in_memory_images_are_assessed_through_a_temporary_png_that_is_removed(tmp_path, monkeypatch, images):
    """`assess(PIL.Image)` and `assess(numpy array)` raised "TypeError: expected str, bytes or os.PathLike
    object". They are written to a lossless PNG in a temporary folder, removed after the run (also when the
    input is refused), and the result names them by their label."""
    import tempfile

    import numpy as np
    from PIL import Image

    from agentic_iqa import create_assessor
    from iqa_tools import ImageError

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    iqa = create_assessor(offline=True, device="cpu")
    pil = Image.open(images[1]).convert("RGB")
    arr = np.asarray(pil)
    from_file = iqa(images[1])
    from_pil, from_array = iqa(pil), iqa(arr)
    assert from_pil.image == "<PIL RGB 96×72>" and from_array.image == "<array uint8 (72, 96, 3)>"
    assert from_pil.score == from_array.score == from_file.score  # the same pixels: the same answer
    fr = iqa(pil, reference=arr)
    assert fr.plan.reference_mode == "Full-Reference" and fr.reference == "<array uint8 (72, 96, 3)>"
    with pytest.raises(ImageError, match=r"<array uint8 \(30, 90, 3\)>: 90×30 px is too small to assess"):
        iqa(arr[:30, :90])
    assert not list(scratch.iterdir())  # every temporary copy is gone
    with pytest.raises(TypeError, match=r"image: cannot assess a builtins.dict; pass a file path .*a PIL image, a numpy array"):
        iqa({"image": "photo.jpg"})
    # The CLI refuses these; from Python mode="SCORE" ran answer mode silently (score None) and query=5 raised
    # "AttributeError: 'int' object has no attribute 'strip'".
    with pytest.raises(ValueError, match=r"mode must be 'auto', 'score' or 'answer' \(got 'SCORE'\)"):
        iqa(arr, mode="SCORE")
    with pytest.raises(TypeError, match=r"query must be a string or None \(got int: 5\)"):
        iqa(arr, query=5)


def test_a_model_for_some_roles_only_is_a_configuration_error(tmp_path):
    """model_backends.yaml with a model for the summarizer alone ran with "fallback: planner: RuntimeError: no LM
    configured for the planner role" for three stages, exit 0, labelled "answered by vlm"."""
    from typer.testing import CliRunner

    from agentic_iqa.cli import app
    from agentic_iqa.config import ConfigError

    (tmp_path / "model_backends.yaml").write_text("summarizer:\n  model: openai/x\n  api_base: http://127.0.0.1:9/v1\n")
    res = CliRunner().invoke(app, ["assess", "example:chelsea", "--config", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert "a model is set for summarizer (openai/x) but not for planner, executor" in " ".join(res.output.split())
    with pytest.raises(ConfigError, match="set `model` for every role"):
        Assessor(load_settings(tmp_path)).assess("example:chelsea")
