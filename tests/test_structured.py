"""StructuredPredict: JSON adapter, retries with the error fed back, validation hook, async, counting."""
import asyncio
import json
import logging
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before dspy/litellm load: no price-list download

import dspy  # noqa: E402
import pytest
from canned import CannedVLM, Reply, disable_dspy_cache, dummy_lm, valid_reply, write_test_image

from agentic_iqa.agents.structured import (
    StructuredJSONAdapter,
    StructuredPredict,
    StructuredResult,
    describe_error,
)
from signatures import (
    AnalyzeDistortionsSignature,
    DetectDistortionsSignature,
    ExplainSignature,
    PlanSignature,
    ScoreSignature,
    SelectToolsSignature,
    vlm_image,
)
from signatures.models import ToolAssignment, check_analysis_matches

TOOLS = ["QAlign", "NIQE", "TOPIQ_FR"]


@pytest.fixture(autouse=True, scope="module")
def _hermetic():
    disable_dspy_cache()


@pytest.fixture
def image(tmp_path):
    return vlm_image(write_test_image(tmp_path / "x.jpg"))[0]


def score(image, vlm, **kw):
    with vlm.context():
        return StructuredPredict(ScoreSignature, **kw)(query="Rate the quality.", image=image, evidence="none")


def test_first_reply_good(image):
    vlm = CannedVLM({"score": [valid_reply("score", level="B")]})
    result = score(image, vlm)
    assert isinstance(result, StructuredResult)
    assert result.ok and result.prediction.level == "B" and result.prediction.need_replan is False
    assert (result.attempts, result.retries, result.lm_calls, result.errors) == (1, 0, 1, [])
    assert result.signature_name == "ScoreSignature"
    assert not vlm.calls[0].retried_with_feedback


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ("I think the image looks fine.", "cannot be serialized to a JSON object"),
        ("", "empty or null response"),
        ('{"level": "Z", "quality_reasoning": "x", "need_replan": false, "replan_reason": null}', "level"),
        ('{"level": "B"}', "lacks the fields ['quality_reasoning', 'need_replan']"),
    ],
    ids=["prose", "empty", "schema-violation", "missing-fields"],
)
def test_retry_feeds_the_error_back_then_succeeds(image, bad, fragment):
    vlm = CannedVLM({"score": [bad, valid_reply("score")]})
    result = score(image, vlm)
    assert result.ok and result.attempts == 2 and vlm.count("score") == 2
    assert len(result.errors) == 1 and fragment in result.errors[0]
    first, second = vlm.calls
    assert not first.retried_with_feedback
    assert second.retried_with_feedback
    assert fragment in second.system  # the model is told what was wrong
    assert "Return ONLY valid JSON" in second.system and "`level`, `quality_reasoning`" in second.system
    # The fields are unchanged, so the retry is parsed (and routed) exactly like the first attempt.
    assert second.output_fields == first.output_fields


def test_exhausting_retries_returns_none(image, caplog):
    caplog.set_level(logging.WARNING, logger="agentic_iqa.agents.structured")
    vlm = CannedVLM({"score": ["nope"] * 4})
    result = score(image, vlm)
    assert result.prediction is None and not result.ok
    assert result.attempts == 4 == vlm.count("score") and len(result.errors) == 4
    assert vlm.remaining("score") == 0
    assert any(r.levelno == logging.ERROR and "no valid output after 4 attempts" in r.message for r in caplog.records)
    assert sum(1 for r in caplog.records if r.levelno == logging.WARNING) == 4


def test_max_retries_is_configurable(image):
    vlm = CannedVLM({"score": ["nope", "nope", valid_reply("score")]})
    assert score(image, vlm, max_retries=1).prediction is None and vlm.count() == 2
    vlm = CannedVLM({"score": ["nope"]})
    assert score(image, vlm, max_retries=0).attempts == 1
    with pytest.raises(ValueError):
        StructuredPredict(ScoreSignature, max_retries=-1)


def test_validate_callback_rejects_and_replaces():
    """Tool names the registry does not know are fed back; known ones come back in registry spelling."""

    def known_tools_only(pred, facts):
        checked = ToolAssignment.model_validate(pred.selected_tools.root, context={"known_tools": facts})
        return dspy.Prediction(selected_tools=checked)

    vlm = CannedVLM({"select": [
        {"selected_tools": {"Global": {"Blurs": "SuperIQA"}}},
        {"selected_tools": {"Global": {"Blurs": "q-align", "Noise": "niqe"}}},
    ]})
    with vlm.context():
        result = StructuredPredict(SelectToolsSignature, validate=known_tools_only)(
            facts=TOOLS, distortion_set={"Global": ["Blurs", "Noise"]}, tool_description="QAlign (NR) ...", reference_mode="No-Reference"
        )
    assert result.attempts == 2
    assert "unknown tool 'SuperIQA'" in result.errors[0] and "unknown tool 'SuperIQA'" in vlm.calls[1].system
    assert result.prediction.selected_tools.root == {"Global": {"Blurs": "QAlign", "Noise": "NIQE"}}


def test_validate_callback_checks_analysis_against_the_set(image):
    distortion_set = {"Global": ["Blurs"]}

    def matches_set(pred, facts):
        check_analysis_matches(pred.distortion_analysis.root, facts)

    wrong = {"distortion_analysis": {"Global": [{"type": "Noise", "severity": "slight", "explanation": "grain"}]}}
    right = {"distortion_analysis": {"Global": [{"type": "blur", "severity": "mild", "explanation": "soft"}]}}
    vlm = CannedVLM({"analyze": [wrong, right]})
    with vlm.context():
        result = StructuredPredict(AnalyzeDistortionsSignature, validate=matches_set)(
            facts=distortion_set, query="q", image=image, distortion_set=distortion_set
        )
    assert result.attempts == 2 and "'Noise' is not among the listed distortions" in result.errors[0]
    item = result.prediction.distortion_analysis.root["Global"][0]
    assert (item.type, item.severity) == ("Blurs", "slight")


def test_feedback_quotes_only_the_latest_error(image):
    vlm = CannedVLM({"detect": [
        {"distortion_set": {"Global": ["haze"]}},
        {"distortion_set": {"Global": ["fog"]}},
        valid_reply("detect"),
    ]})
    with vlm.context():
        result = StructuredPredict(DetectDistortionsSignature)(query="q", image=image, query_scope=["Global"])
    assert result.attempts == 3
    third = vlm.calls[2].system
    assert "'fog'" in third and "'haze'" not in third


def test_transport_errors_are_not_retried(image):
    vlm = CannedVLM({"score": [RuntimeError("connection reset"), valid_reply("score")]})
    with pytest.raises(Exception, match="connection reset"):
        score(image, vlm)
    assert vlm.count() == 1  # not retried as if it were the model's mistake


def test_programming_errors_are_not_retried(image):
    with pytest.raises(ValueError, match="No LM is loaded"):
        with dspy.context(lm=None):
            StructuredPredict(ScoreSignature)(query="q", image=image, evidence="e")


def test_async_path_retries_and_counts(image):
    vlm = CannedVLM({"score": ["{not json", valid_reply("score", level="D")]})

    async def run():
        with vlm.context():
            return await StructuredPredict(ScoreSignature).acall(query="q", image=image, evidence="e")

    result = asyncio.run(run())
    assert result.ok and result.prediction.level == "D" and result.attempts == 2 and vlm.count() == 2


def test_async_calls_run_concurrently(image):
    vlm = CannedVLM({"score": valid_reply("score")}, latency=0.2, repeat_last=True)
    module = StructuredPredict(ScoreSignature)

    async def run():
        with vlm.context():
            return await asyncio.gather(*(module.acall(query="q", image=image, evidence="e") for _ in range(4)))

    import time

    start = time.perf_counter()
    results = asyncio.run(run())
    assert all(r.ok for r in results) and vlm.count() == 4
    assert time.perf_counter() - start < 0.6  # four 0.2 s calls overlapped, not 0.8 s in a row


def test_adapter_is_scoped_not_global(image):
    before = dspy.settings.adapter
    score(image, CannedVLM({"score": [valid_reply("score")]}))
    assert dspy.settings.adapter is before


def test_compiled_demos_are_kept_on_retries(image):
    module = StructuredPredict(ScoreSignature)
    module.predict.demos = [dspy.Example(query="demo query", evidence="demo evidence", level="A",
                                         quality_reasoning="demo reasoning", need_replan=False, replan_reason=None)]
    vlm = CannedVLM({"score": ["oops", valid_reply("score")]})
    with vlm.context():
        assert module(query="q", image=image, evidence="e").attempts == 2
    for call in vlm.calls:
        messages = vlm.lm.history[vlm.calls.index(call)]["messages"]
        assert any("demo reasoning" in str(m["content"]) for m in messages)


def test_dummy_lm_works_for_simple_cases():
    lm = dummy_lm([{"selected_tools": {"Global": {"Blurs": "QAlign"}}}])
    with dspy.context(lm=lm):
        result = StructuredPredict(SelectToolsSignature)(
            distortion_set={"Global": ["Blurs"]}, tool_description="QAlign", reference_mode="No-Reference"
        )
    assert result.prediction.selected_tools.root == {"Global": {"Blurs": "QAlign"}}


def test_describe_error_plain_value_error():
    assert describe_error(ValueError("bad tool\nFor further information visit https://x")) == "bad tool"


def test_level_logprobs_survive_retries(image):
    from signatures import level_logprobs

    vlm = CannedVLM({"score": ["junk", Reply(valid_reply("score", level="B"), level_logprobs={"A": -1.5, "B": -0.4})]},
                    logprobs=True)
    result = score(image, vlm)
    assert level_logprobs(result.prediction)["B"] == pytest.approx(-0.4)


# ── the adapter's response format ───────────────────────────────────────────────────────────────


def _format_for(adapter, signature):
    lm = dspy.LM("openai/gpt-4o", api_key="not-used")  # a model DSPy sends Structured Outputs to; no call is made
    kwargs = {}
    adapter._prepare_response_format(lm, kwargs, signature)
    return kwargs.get("response_format")


def test_dict_outputs_use_json_mode():
    """DSPy's strict schema for a nested dict only admits {} — so those signatures ask for JSON mode."""
    stock = _format_for(dspy.JSONAdapter(), DetectDistortionsSignature)
    schema = stock.model_json_schema()
    dist = schema["$defs"]["DistortionSet"]
    assert dist["properties"] == {} and dist["additionalProperties"] is False  # why the override exists
    for sig in (PlanSignature, DetectDistortionsSignature, AnalyzeDistortionsSignature, SelectToolsSignature):
        assert _format_for(StructuredJSONAdapter(), sig) == {"type": "json_object"}, sig.__name__


def test_dict_free_outputs_keep_the_structured_schema():
    fmt = _format_for(StructuredJSONAdapter(), ScoreSignature)
    assert not isinstance(fmt, dict)
    assert fmt.model_json_schema()["properties"]["level"]["enum"] == ["A", "B", "C", "D", "E"]
    assert not isinstance(_format_for(StructuredJSONAdapter(), ExplainSignature), dict)


def _demo(image):
    return dspy.Example(query="Is it sharp?", image=image, query_scope=["Global"],
                        distortion_set={"Global": ["Blurs"]}).with_inputs("query", "image", "query_scope")


@pytest.mark.parametrize("with_demo", [False, True])
def test_adapter_messages_equal_dspy_json_adapter(tmp_path, with_demo):
    """Our adapter caches the system message and swaps images in after formatting: same messages as DSPy's."""
    big = vlm_image(write_test_image(tmp_path / "big.jpg", size=(640, 480)))[0]
    demos = [_demo(vlm_image(write_test_image(tmp_path / "d.png", size=(32, 24)))[0])] if with_demo else []
    inputs = dict(query="Is the sky blurry?", image=big, query_scope=["sky"])
    ours, stock = StructuredJSONAdapter(), dspy.JSONAdapter()
    for _ in range(2):  # the second call is served from the cache
        mine = ours.format(DetectDistortionsSignature, demos, inputs)
        assert mine == stock.format(DetectDistortionsSignature, demos, inputs)
    image_blocks = [b for m in mine if isinstance(m["content"], list) for b in m["content"] if b.get("type") == "image_url"]
    assert image_blocks[-1]["image_url"]["url"] == big.url  # the original bytes, not the stand-in
    assert len(image_blocks) == 1 + len(demos)


def test_adapter_system_message_follows_new_instructions():
    ours = StructuredJSONAdapter()
    base = ours.format_system_message(ScoreSignature)
    changed = ScoreSignature.with_instructions("Judge only the sharpness.")
    assert "Judge only the sharpness." in ours.format_system_message(changed)
    assert ours.format_system_message(ScoreSignature) == base == dspy.JSONAdapter().format_system_message(ScoreSignature)
    changed.instructions = "Judge only the colours."  # edited in place, as some optimizers do
    assert ours.format_system_message(changed) == dspy.JSONAdapter().format_system_message(changed)
    assert "Judge only the colours." in ours.format_system_message(changed)


def test_adapter_never_scans_the_image_text(tmp_path, monkeypatch):
    """The point of the stand-in: DSPy's marker regex only ever sees short text, not the base64 image."""
    import dspy.adapters._legacy_type_markers as markers

    scanned = []
    real_split = markers._split_legacy_custom_type_text_to_blocks
    monkeypatch.setattr(markers, "_split_legacy_custom_type_text_to_blocks", lambda text: scanned.append(len(text)) or real_split(text))
    big = vlm_image(write_test_image(tmp_path / "big.jpg", size=(640, 480)))[0]
    StructuredJSONAdapter().format(DetectDistortionsSignature, [], dict(query="q", image=big, query_scope=["Global"]))
    assert scanned and max(scanned) < 2000 < len(big.url)


def test_adapter_messages_are_fresh_and_callbacks_see_the_real_image(tmp_path):
    from dspy.utils.callback import BaseCallback

    seen = []

    class Spy(BaseCallback):
        def on_adapter_format_start(self, call_id, instance, inputs):
            seen.append(json.dumps(inputs["inputs"]["image"].url))

    img = vlm_image(write_test_image(tmp_path / "x.jpg"))[0]
    inputs = dict(query="q", image=img, query_scope=["Global"])
    ours = StructuredJSONAdapter(callbacks=[Spy()])
    first = ours.format(DetectDistortionsSignature, [], inputs)
    first[-1]["content"][1]["image_url"]["url"] = "REDACTED"  # a caller editing its copy of the messages
    second = ours.format(DetectDistortionsSignature, [], inputs)
    assert json.dumps(second).count(img.url) == 1 and "REDACTED" not in json.dumps(second)
    assert seen == [json.dumps(img.url)] * 2  # one event per call, with the real image


def test_adapter_can_be_pickled_and_copied():
    import copy
    import pickle

    ours = StructuredJSONAdapter()
    ours.format_system_message(ScoreSignature)
    for clone in (pickle.loads(pickle.dumps(ours)), copy.deepcopy(ours)):
        assert clone.format_system_message(ScoreSignature) == ours.format_system_message(ScoreSignature)


def test_response_format_is_chosen_once_per_signature_and_lm_kind():
    ours = StructuredJSONAdapter()
    first, again = _format_for(ours, ScoreSignature), _format_for(ours, ScoreSignature)
    assert first is again  # the built schema model is reused, not rebuilt per call
    assert first.model_json_schema() == _format_for(dspy.JSONAdapter(), ScoreSignature).model_json_schema()
    plain = dspy.LM("openai/my-local-vlm", api_key="not-used")  # not catalogued: no Structured Outputs
    kwargs = {}
    ours._prepare_response_format(plain, kwargs, ScoreSignature)
    stock = {}
    dspy.JSONAdapter()._prepare_response_format(plain, stock, ScoreSignature)
    assert kwargs.get("response_format") == stock.get("response_format")


@pytest.mark.parametrize("error,short", [
    ("LM response cannot be serialized to a JSON object. Your reply was: hello", "invalid JSON"),
    ("the JSON object lacks the fields ['level'] (expected exactly ['level', 'x']). Your reply was: {}",
     "missing fields ['level']"),
    ("Failed to parse field distortion_set: 1 validation error for DistortionSet\n  Value error, unknown distortion "
     "type 'Fog'; use one of ['Blurs'] [type=value_error, input_value={}, input_type=dict]. Your reply was: {}",
     "distortion_set: unknown distortion type 'Fog'"),
    ("1 validation error for PlannerDecision\nquery_type\n  Input should be 'IQA' or 'Other' [type=literal_error]",
     "query_type: Input should be 'IQA' or 'Other'"),
    ("final_answer must be the letter of one of the offered options (A, B), got 'C'",
     "final_answer must be the letter of one of the offered options (A, B), got 'C'"),
])
def test_short_reason_names_what_was_wrong_in_a_few_words(error, short):
    from agentic_iqa.agents.structured import StructuredResult, short_reason

    assert short_reason(error) == short
    assert StructuredResult(None, 4, [error] * 4).rejection() == f"model reply rejected 4× ({short})"
