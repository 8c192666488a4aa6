"""Signatures end to end through the real JSONAdapter with canned VLMs; the VLM image; level log-probs."""
import base64
import io
import math
import os
import typing
from datetime import datetime, timezone

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before dspy/litellm load: no price-list download

import dspy  # noqa: E402
import pytest
from canned import CannedVLM, Reply, disable_dspy_cache, json_tokens, valid_reply, write_test_image
from PIL import Image

import signatures
from agentic_iqa.agents.structured import StructuredJSONAdapter, StructuredPredict
from iqa_tools.records import ToolExecutionLog
from signatures import (
    SIGNATURE_VERSION,
    AnalyzeDistortionsSignature,
    DetectDistortionsSignature,
    ExplainSignature,
    PlanSignature,
    ScoreSignature,
    SelectToolsSignature,
    format_evidence,
    level_logprobs,
    read_level_logprobs,
    signature_fingerprint,
    token_logprobs,
    vlm_image,
)
from signatures.image import image_bytes
from signatures.logprobs import MISSING_LOGPROB
from signatures.models import (
    DistortionAnalysis,
    DistortionAnalysisMap,
    DistortionSet,
    ExecutorOutput,
    PlanControlFlags,
    PlannerDecision,
    PlannerOutput,
    ToolAssignment,
)

#: Fingerprint of the signatures' fields for each SIGNATURE_VERSION. A field change makes this test
#: fail: bump SIGNATURE_VERSION in signatures/__init__.py and record the new fingerprint here.
FINGERPRINTS = {"1": "1f872f0b1c1f471a"}


@pytest.fixture(autouse=True, scope="module")
def _hermetic():
    disable_dspy_cache()


@pytest.fixture
def jpeg(tmp_path):
    return write_test_image(tmp_path / "photo.jpg", size=(80, 60), quality=37)


def run(signature, vlm, **inputs):
    with vlm.context():
        return StructuredPredict(signature)(**inputs)


# ── each signature, end to end ──────────────────────────────────────────────────────────────────


def test_plan_signature(jpeg):
    img, _ = vlm_image(jpeg)
    reply = valid_reply("plan", query_scope="sky", distortion_source="Explict", distortions={"sky": ["blur"]},
                        plan={"distortion_detection": False, "distortion_analysis": True,
                              "tool_selection": False, "tool_execute": False})
    vlm = CannedVLM({"plan": [reply]})
    result = run(PlanSignature, vlm, query="Is the sky blurry? A. Yes B. No", image=img,
                 reference_mode="No-Reference", available_tools=["QAlign", "NIQE"])
    decision = result.prediction.planner_output
    assert isinstance(decision, PlannerDecision)
    assert decision.query_scope == ["sky"] and decision.distortion_source == "Explicit"
    assert decision.distortions == {"sky": ["Blurs"]} and decision.plan == decision.expected_flags()
    out = PlannerOutput.from_decision(decision, has_reference=False)
    assert out.reference_mode == "No-Reference"
    # reference_mode and the replan feedback are inputs the model reads, never outputs it controls.
    assert set(PlanSignature.input_fields) == {"query", "image", "reference_mode", "available_tools", "replan_reason"}
    assert list(PlanSignature.output_fields) == ["planner_output"]
    user = vlm.calls[0].user_text
    assert "No-Reference" in user and '["QAlign", "NIQE"]' in user


def test_plan_signature_replan_feedback_reaches_the_model(jpeg):
    vlm = CannedVLM({"plan": [valid_reply("plan")]})
    run(PlanSignature, vlm, query="Rate it", image=vlm_image(jpeg)[0], reference_mode="Full-Reference",
        replan_reason="no tool scores for the noise")
    assert "no tool scores for the noise" in vlm.calls[0].user_text


def test_plan_schema_violation_then_fix(jpeg):
    bad = valid_reply("plan", query_type="Aesthetics")
    vlm = CannedVLM({"plan": [bad, valid_reply("plan", query_type="Other", plan={
        "distortion_detection": False, "distortion_analysis": False, "tool_selection": False, "tool_execution": False})]})
    result = run(PlanSignature, vlm, query="Is it pretty?", image=vlm_image(jpeg)[0], reference_mode="No-Reference")
    assert result.attempts == 2 and "query_type" in result.errors[0]
    assert result.prediction.planner_output.query_type == "Other"


def test_detect_signature(jpeg):
    vlm = CannedVLM({"detect": [{"distortion_set": {"global": ["blur", "JPEG artifacts"], "sky": "noise"}}]})
    result = run(DetectDistortionsSignature, vlm, query="What is wrong?", image=vlm_image(jpeg)[0],
                 query_scope=["Global", "sky"])
    ds = result.prediction.distortion_set
    assert isinstance(ds, DistortionSet) and ds.root == {"Global": ["Blurs", "Compression"], "sky": ["Noise"]}
    assert '["Global", "sky"]' in vlm.calls[0].user_text


def test_detect_rejects_unknown_category_then_retries(jpeg):
    vlm = CannedVLM({"detect": [{"distortion_set": {"Global": ["haze"]}}, valid_reply("detect")]})
    result = run(DetectDistortionsSignature, vlm, query="q", image=vlm_image(jpeg)[0], query_scope=["Global"])
    assert result.attempts == 2 and "unknown distortion type 'haze'" in vlm.calls[1].system


def test_analyze_signature(jpeg):
    vlm = CannedVLM({"analyze": [valid_reply("analyze")]})
    result = run(AnalyzeDistortionsSignature, vlm, query="q", image=vlm_image(jpeg)[0],
                 distortion_set={"Global": ["Blurs", "Noise"]})
    amap = result.prediction.distortion_analysis
    assert isinstance(amap, DistortionAnalysisMap)
    assert [a.severity for a in amap.root["Global"]] == ["moderate", "slight"]
    assert all(isinstance(a, DistortionAnalysis) for a in amap.root["Global"])
    assert '{"Global": ["Blurs", "Noise"]}' in vlm.calls[0].user_text


def test_analyze_bad_severity_and_empty_explanation(jpeg):
    bad1 = {"distortion_analysis": {"Global": [{"type": "Blurs", "severity": "terrible", "explanation": "x"}]}}
    bad2 = {"distortion_analysis": {"Global": [{"type": "Blurs", "severity": "severe", "explanation": "  "}]}}
    vlm = CannedVLM({"analyze": [bad1, bad2, valid_reply("analyze")]})
    result = run(AnalyzeDistortionsSignature, vlm, query="q", image=vlm_image(jpeg)[0],
                 distortion_set={"Global": ["Blurs", "Noise"]})
    assert result.attempts == 3
    assert "severity" in result.errors[0] and "explanation must not be empty" in result.errors[1]


def test_select_signature():
    vlm = CannedVLM({"select": [valid_reply("select")]})
    result = run(SelectToolsSignature, vlm, distortion_set={"Global": ["Blurs", "Noise"]},
                 tool_description="QAlign (NR): blurs, noise\nNIQE (NR): no known strengths",
                 reference_mode="No-Reference")
    tools = result.prediction.selected_tools
    assert isinstance(tools, ToolAssignment) and tools.root == {"Global": {"Blurs": "QAlign", "Noise": "NIQE"}}
    assert "NIQE (NR): no known strengths" in vlm.calls[0].user_text
    assert "prefer Full-Reference (FR) tools" in vlm.calls[0].system  # the spec's FR rule is in the prompt


def test_explain_signature(jpeg):
    vlm = CannedVLM({"explain": [valid_reply("explain", need_replan=True, replan_reason="no tool scores")]})
    result = run(ExplainSignature, vlm, query="Is the sky blurry? A. Yes B. No", image=vlm_image(jpeg)[0],
                 evidence="No evidence was collected; judge from the image alone.")
    p = result.prediction
    assert (p.final_answer, p.need_replan, p.replan_reason) == ("B", True, "no tool scores")
    assert "judge from the image alone" in vlm.calls[0].user_text


def test_score_signature_level_first(jpeg):
    assert list(ScoreSignature.output_fields)[0] == "level"
    assert typing.get_args(ScoreSignature.output_fields["level"].annotation) == ("A", "B", "C", "D", "E")
    vlm = CannedVLM({"score": [valid_reply("score", level="D", replan_reason=None)]})
    result = run(ScoreSignature, vlm, query="Rate", image=vlm_image(jpeg)[0], evidence="x")
    assert result.prediction.level == "D" and result.prediction.replan_reason is None
    assert "A. Excellent, B. Good, C. Fair, D. Poor, E. Bad" in vlm.calls[0].system


def test_every_signature_has_spec_instructions():
    texts = {name: sig.instructions for name, sig in signatures.signatures_by_name().items()}
    assert "expert in distortion detection" in texts["detect"] and '"Brightness change"' in texts["detect"]
    assert 'Use "none" if a distortion is barely' in texts["analyze"]
    assert "assign the most appropriate IQA tool" in texts["select"]
    assert "tool and region named -> false / true" in texts["plan"] and "Explict" not in texts["plan"]
    assert "A plan that deliberately ran no\ntools" in texts["explain"] and "level: only the letter" in texts["score"]


def test_signature_version_pins_the_fields():
    assert FINGERPRINTS.get(SIGNATURE_VERSION) == signature_fingerprint(), (
        "signature fields changed: bump SIGNATURE_VERSION and record the new fingerprint in FINGERPRINTS"
    )


def test_fingerprint_changes_when_a_field_changes(monkeypatch):
    before = signature_fingerprint()
    real = signatures.signatures_by_name
    changed = ScoreSignature.append("confidence", dspy.OutputField(), type_=float)
    monkeypatch.setattr(signatures, "signatures_by_name", lambda: {**real(), "score": changed})
    assert signature_fingerprint() != before


def test_with_reference_pairs_the_images_and_keeps_the_saved_signatures():
    from signatures.image import with_reference

    before = signature_fingerprint()
    compiled = signatures.signatures_by_name()["detect"].with_instructions("compiled wording")
    fr = with_reference(compiled)
    assert list(fr.input_fields) == ["query", "image", "reference_image", "query_scope"]
    assert list(fr.output_fields) == list(compiled.output_fields)
    assert fr.instructions.startswith("compiled wording") and "reference_image` is its" in fr.instructions
    assert fr.input_fields["image"].json_schema_extra["desc"].startswith("the distorted image")
    assert with_reference(fr) is fr  # already paired
    assert "reference_image" not in compiled.input_fields and signature_fingerprint() == before
    with pytest.raises(ValueError, match="no `image` input"):
        with_reference(signatures.signatures_by_name()["select"])


# ── paper-style planner fixtures: the four region/tool cases of DESIGN §3 ──────────────────────


PLANNER_CASES = [
    # (query, decision fields the VLM should produce)
    ("Is the sky in this photo blurry? A. Yes B. No",
     dict(query_scope=["sky"], distortion_source="Explicit", distortions={"sky": ["Blurs"]}, required_tool=None)),
    ("Use LPIPS to check the compression artifacts on the building.",
     dict(query_scope=["building"], distortion_source="Explicit", distortions={"building": ["Compression"]},
          required_tool=["LPIPS"])),
    ("Rate the quality of this image with QAlign.",
     dict(query_scope=["Global"], distortion_source="Inferred", distortions=None, required_tool=["QAlign"])),
    ("How good is the overall quality of this image?",
     dict(query_scope=["Global"], distortion_source="Inferred", distortions=None, required_tool=None)),
]


@pytest.mark.parametrize("query, fields", PLANNER_CASES, ids=["region", "region+tool", "tool", "neither"])
def test_planner_fixture_flags(jpeg, query, fields):
    region, tool = fields["query_scope"] != ["Global"], bool(fields["required_tool"])
    flags = PlanControlFlags.from_rules(query_type="IQA", distortion_source=fields["distortion_source"],
                                        region_named=region, tool_named=tool)
    reply = valid_reply("plan", plan=flags.model_dump(), **fields)
    vlm = CannedVLM({"plan": [reply]})
    decision = run(PlanSignature, vlm, query=query, image=vlm_image(jpeg)[0], reference_mode="Full-Reference",
                   available_tools=["LPIPS", "QAlign"]).prediction.planner_output
    assert decision.plan == decision.expected_flags() == flags
    assert query.split("?")[0].split(".")[0] in PlanSignature.instructions  # the docstring walks through it


# ── the image the VLM sees ──────────────────────────────────────────────────────────────────────


def test_image_bytes_arrive_unchanged(jpeg):
    original = jpeg.read_bytes()
    img, note = vlm_image(jpeg)
    assert note is None
    # The adapter's OpenAI-format messages carry an image_url data URL with the file's own bytes.
    messages = StructuredJSONAdapter().format(ScoreSignature, [], {"query": "q", "image": img, "evidence": "e"})
    urls = [part["image_url"]["url"] for m in messages if isinstance(m["content"], list)
            for part in m["content"] if part.get("type") == "image_url"]
    assert len(urls) == 1 and urls[0].startswith("data:image/jpeg;base64,")
    assert base64.b64decode(urls[0].split(",", 1)[1]) == original
    # ... and the engine receives exactly those bytes.
    vlm = CannedVLM({"score": [valid_reply("score")]})
    run(ScoreSignature, vlm, query="q", image=img, evidence="e")
    (received,) = vlm.calls[0].images
    assert received.media_type == "image/jpeg" and received.data == original


def test_mime_type_comes_from_content_not_name(tmp_path):
    path = write_test_image(tmp_path / "misnamed.jpg", fmt="PNG")
    img, note = vlm_image(path)
    assert note is None and img.url.startswith("data:image/png;base64,")
    assert base64.b64decode(img.url.split(",", 1)[1]) == path.read_bytes()


def test_large_image_downscaled_losslessly_for_the_vlm_only(tmp_path):
    path = write_test_image(tmp_path / "big.jpg", size=(400, 300))
    before = path.read_bytes()
    img, note = vlm_image(path, max_side=128)
    assert note == "downscaled 400×300 → 128×96 PNG for the VLM; tools use the original"
    assert img.url.startswith("data:image/png;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(img.url.split(",", 1)[1])))
    assert decoded.format == "PNG" and decoded.size == (128, 96)
    assert path.read_bytes() == before  # the original is untouched
    assert vlm_image(path, max_side=400)[1] is None  # at the limit: original bytes


def test_unsupported_format_converted_to_png(tmp_path):
    path = write_test_image(tmp_path / "scan.bmp", fmt="BMP")
    img, note = vlm_image(path)
    assert "converted BMP to PNG" in note and img.url.startswith("data:image/png;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(img.url.split(",", 1)[1])))
    import numpy as np

    assert np.array_equal(np.asarray(decoded.convert("RGB")), np.asarray(Image.open(path).convert("RGB")))  # lossless


def test_auto_transport_keeps_bytes_below_the_limit_and_sends_jpeg_95_above(tmp_path):
    path = write_test_image(tmp_path / "big.png", size=(200, 150), fmt="PNG")
    size = path.stat().st_size
    img, note = vlm_image(path, transport="auto", max_bytes=size)
    assert note is None and base64.b64decode(img.url.split(",", 1)[1]) == path.read_bytes()
    img, note = vlm_image(path, transport="auto", max_bytes=size - 1)
    assert img.url.startswith("data:image/jpeg;base64,")
    assert note == (f"re-encoded PNG ({size:,} bytes) as JPEG (quality 95) for the VLM (lossless would exceed "
                    f"{size - 1:,} bytes); tools use the original")
    assert vlm_image(path, transport="original", max_bytes=1)[1] is None  # original: the file, whatever its size


def test_jpeg_transport(tmp_path):
    jpeg = write_test_image(tmp_path / "a.jpg", size=(80, 60))
    assert vlm_image(jpeg, transport="jpeg", quality=50)[1] is None  # a JPEG within limits goes as it is
    rgba = tmp_path / "t.png"
    Image.new("RGBA", (40, 30), (0, 0, 0, 0)).save(rgba)
    img, note = vlm_image(rgba, transport="jpeg", quality=90)
    decoded = Image.open(io.BytesIO(base64.b64decode(img.url.split(",", 1)[1])))
    assert decoded.format == "JPEG" and decoded.getpixel((5, 5)) == (255, 255, 255)  # transparent → white
    img, note = vlm_image(jpeg, transport="jpeg", quality=70, side=40)
    assert note == "downscaled 80×60 → 40×30 JPEG (quality 70) for the VLM; tools use the original"
    assert image_bytes(img) == len(base64.b64decode(img.url.split(",", 1)[1]))


def test_16_bit_image_is_scaled_not_saturated(tmp_path):
    import numpy as np

    arr = (np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)  # values up to 65520
    path = tmp_path / "deep.png"
    Image.fromarray(arr).save(path)
    img, note = vlm_image(path, max_side=32)
    small = np.asarray(Image.open(io.BytesIO(base64.b64decode(img.url.split(",", 1)[1]))))
    assert note.startswith("downscaled 64×64 → 32×32")
    assert small.min() < 20 and small.max() > 235  # the full range survives; PIL's clip would give all 255


def test_image_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        vlm_image(tmp_path / "missing.jpg")
    bogus = tmp_path / "notes.jpg"
    bogus.write_text("not an image")
    with pytest.raises(ValueError, match="not an image"):
        vlm_image(bogus)
    with pytest.raises(ValueError, match="max_side"):
        vlm_image(write_test_image(tmp_path / "ok.png", fmt="PNG"), max_side=0)


# ── level log-probabilities ─────────────────────────────────────────────────────────────────────


def test_logprobs_read_from_a_real_prediction(jpeg):
    letters = {"A": -2.3, "B": -0.25, "C": -1.8, "D": -4.0}
    vlm = CannedVLM({"score": [Reply(valid_reply("score", level="B"), level_logprobs=letters)]}, logprobs=True)
    prediction = run(ScoreSignature, vlm, query="q", image=vlm_image(jpeg)[0], evidence="e").prediction
    # Where DSPy 3.4 puts them: on the prediction, and in the LM's history, in OpenAI's shape.
    assert "content" in prediction.logprobs
    assert prediction.logprobs == vlm.lm.history[-1]["outputs"][0]["logprobs"]
    reading = read_level_logprobs(prediction)
    assert reading.logprobs == {"A": -2.3, "B": -0.25, "C": -1.8, "D": -4.0, "E": MISSING_LOGPROB}
    assert reading.token == "B" and reading.ranked == ("A", "B", "C", "D")
    assert level_logprobs(vlm.lm.history[-1]["outputs"][0]) == reading.logprobs
    assert "not ranked: E" in reading.note()


def test_no_logprobs_when_the_lm_did_not_ask(jpeg):
    vlm = CannedVLM({"score": [Reply(valid_reply("score"), level_logprobs={"C": -0.1, "B": -2.0})]})
    prediction = run(ScoreSignature, vlm, query="q", image=vlm_image(jpeg)[0], evidence="e").prediction
    assert prediction.get("logprobs") is None and level_logprobs(prediction) is None


def test_no_alternatives_means_no_distribution():
    # logprobs=0 style: only the chosen token, which alone would make the chosen letter look certain.
    tokens = [('{"', 0.0, []), ("level", 0.0, []), ('": "', 0.0, []), ("B", -0.2, [])]
    assert [t[0] for t in token_logprobs(tokens)] == ['{"', "level", '": "', "B"]
    assert level_logprobs(tokens) is None
    tokens[-1] = ("B", -0.2, [("B", -0.2), ("C", -1.7)])
    assert level_logprobs(tokens)["C"] == -1.7


def test_letter_sharing_a_token_with_quotes_and_case_variants():
    tokens = [('{"', 0.0, [('{"', 0.0)]), ("level", 0.0, [("level", 0.0)]), ('":', 0.0, [('":', 0.0)]),
              (' "B', -0.5, [(' "B', -0.5), (' "A', -1.2), (' "b', -2.0), (' "Good', -3.0)]), ('",', 0.0, [])]
    reading = read_level_logprobs({"content": [
        {"token": t, "logprob": lp, "top_logprobs": [{"token": a, "logprob": alp} for a, alp in alts]}
        for t, lp, alts in tokens]})
    assert reading.token == ' "B' and reading.token_index == 3
    assert reading.logprobs["B"] == pytest.approx(math.log(math.exp(-0.5) + math.exp(-2.0)))  # "B" and "b" merged
    assert reading.logprobs["A"] == -1.2 and reading.logprobs["C"] == MISSING_LOGPROB


def test_chosen_token_counts_even_if_not_listed():
    tokens = json_tokens('{"level": "C", "quality_reasoning": "ok"}', level_logprobs={"A": -3.0, "B": -1.0})
    i = next(i for i, t in enumerate(tokens) if t[0] == "C")
    tokens[i] = ("C", -0.4, [("A", -3.0), ("B", -1.0)])
    assert level_logprobs(tokens) == {"A": -3.0, "B": -1.0, "C": -0.4, "D": MISSING_LOGPROB, "E": MISSING_LOGPROB}


def test_only_the_level_field_is_read():
    text = '{"quality_reasoning": "A clear, sharp photo", "level": "A"}'
    tokens = json_tokens(text, level_logprobs={"A": -0.1, "B": -2.5})
    assert level_logprobs(tokens) == {"A": -0.1, "B": -2.5, "C": -100.0, "D": -100.0, "E": -100.0}
    assert level_logprobs(json_tokens('{"final_answer": "B"}')) is None  # no level field at all


def test_token_logprobs_from_an_lm15_response():
    from dspy._vendor.lm15.providers.openai_chat import response_from_openai_chat

    body = {"id": "x", "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": '{"level": "E"}'},
            "logprobs": {"content": [{"token": '{"level": "', "logprob": 0.0, "top_logprobs": []},
                                     {"token": "E", "logprob": -0.3, "top_logprobs": [{"token": "D", "logprob": -1.4}]}]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}
    response = response_from_openai_chat(body, model="m")
    assert [t[0] for t in token_logprobs(response)] == ['{"level": "', "E"]
    assert level_logprobs(response) == {"A": -100.0, "B": -100.0, "C": -100.0, "D": -1.4, "E": -0.3}


# ── the evidence text ───────────────────────────────────────────────────────────────────────────


def test_format_evidence():
    evidence = ExecutorOutput(
        distortion_set={"Global": ["Blurs"]},
        distortion_analysis={"Global": [DistortionAnalysis(type="Blurs", severity="moderate", explanation=" soft edges ")]},
        quality_scores={"Global": {"Blurs": ("QAlign", 2.891)}},
        tool_logs=[
            ToolExecutionLog(tool_name="TOPIQ_FR", error="weights missing", distortion="Blurs",
                             timestamp=datetime(2026, 1, 1, tzinfo=timezone.utc)),
            ToolExecutionLog(tool_name="QAlign", normalized_score=2.891, fallback=True, fallback_for="TOPIQ_FR",
                             distortion="Blurs", timestamp=datetime(2026, 1, 1, tzinfo=timezone.utc)),
        ],
    )
    assert format_evidence(evidence) == (
        "Distortion analysis:\n"
        "- Global / Blurs: moderate. soft edges\n"
        "Tool scores (normalized to 1-5, 5 = best):\n"
        "- Global / Blurs: QAlign = 2.89\n"
        "Tool notes:\n"
        "- TOPIQ_FR failed on Global / Blurs: weights missing\n"
        "- QAlign ran as a fallback instead of TOPIQ_FR (Global / Blurs)"
    )
    assert format_evidence(None) == format_evidence(ExecutorOutput()) == "No evidence was collected; judge from the image alone."
    assert "Distortions to consider" in format_evidence(ExecutorOutput(distortion_set={"sky": ["Noise"]}))


def test_signatures_module_does_not_import_agentic_iqa():
    import subprocess
    import sys

    code = ("import sys, signatures, signatures.models, signatures.planner, signatures.executor, "
            "signatures.summarizer, signatures.image, signatures.logprobs; "
            "print(any(m == 'agentic_iqa' or m.startswith('agentic_iqa.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert out.stdout.strip() == "False"


def test_state_models_import_without_dspy():
    import subprocess
    import sys

    code = "import sys, signatures.models; print('dspy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert out.stdout.strip() == "False"

