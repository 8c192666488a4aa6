"""The fault matrix (issue 6): every fault, injected through the local fake OpenAI-compatible server
(the real HTTP path) or a tool registry whose metric misbehaves, ends in a completed result that
records the degradation — which field is null, which fallback ran, or that the offline analyst
answered because the LM was unreachable. Each case runs as a small batch into a results file, so
"never a lost item" is checked too: one complete `ok` line per item.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from canned import disable_dspy_cache, valid_reply, write_test_image
from fake_openai import FakeOpenAIServer, Reply, route_of, scripted

from agentic_iqa.api import Assessor
from agentic_iqa.batch import BatchItem, assess_many, run_batch
from agentic_iqa.config import LMSetupError, load_settings
from iqa_tools import ToolRegistry

N_ITEMS = 2
LOGPROBS = {"A": -2.5, "B": -0.5, "C": -1.1, "D": -3.0, "E": -5.0}
SELECT_PIQE = {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}}
ROUTES = ("plan", "detect", "analyze", "select", "score", "explain")


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    disable_dspy_cache()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    # 128 px: large enough for NIQE, the first fallback tool (it needs 96 px a side).
    d = tmp_path_factory.mktemp("faults")
    return [write_test_image(d / f"photo{i}.jpg", size=(128, 128), seed=i, quality=50 + 10 * i) for i in range(N_ITEMS)]


@pytest.fixture(scope="module")
def registry():
    return ToolRegistry(cache=False)


def good_routes(**overrides) -> dict:
    routes = {"plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
              "select": SELECT_PIQE, "score": valid_reply("score", level="B"), "_logprobs": LOGPROBS}
    routes.update(overrides)
    return routes


def every_route(reply) -> dict:
    return {r: reply for r in ROUTES}


def run(tmp_path, images, api_base: str, registry, *, timeout: float = 10, num_retries: int = 1):
    """A batch of every image into results.jsonl; returns (records, summary)."""
    settings = load_settings(tmp_path, lm="openai/fake-vlm", api_base=api_base, cache={"enabled": False})
    for role in ("planner", "executor", "summarizer"):
        settings.backends.role(role).num_retries = num_retries
        settings.backends.role(role).timeout = timeout
    assessor = Assessor(settings, registry=registry)
    items = [BatchItem(image=str(p), query="Rate the quality of this photo") for p in images]
    out = tmp_path / "results.jsonl"
    summary = run_batch(items, out, assessor, concurrency=N_ITEMS)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    # Never a lost item, never a crash: one complete, successful line per image.
    assert sorted(r["image"] for r in records) == sorted(str(p) for p in images)
    assert all(r["status"] == "ok" and r["score"] is not None for r in records), records
    assert summary.ok == N_ITEMS and summary.failed == 0
    return records, summary


def fallbacks(rec: dict) -> list[str]:
    return rec["result"]["fallbacks"]


def assert_lm_output_degraded(rec: dict) -> None:
    """Bad model output everywhere: retried, then every LM field null and every step's fallback ran;
    the LM stayed reachable, so it is not reported as unreachable, but nothing of the answer came from the model
    (it was labelled "vlm (openai/fake-vlm)")."""
    res = rec["result"]
    assert re.fullmatch(r"offline analyst \(no usable model reply: model reply rejected 4× \(.+\)\)", rec["backend"]), \
        rec["backend"]
    assert not rec["backend"].startswith("offline analyst (LM unreachable")
    assert res["retries"] > 0 and rec["degraded"]
    assert res["evidence"]["distortion_set"] is None and res["evidence"]["distortion_analysis"] is None
    fb = fallbacks(rec)
    # One line per stage that fell back: why (the replies were rejected), then what was done instead.
    assert any(re.fullmatch(r"planner: model reply rejected 4× \(.+\) → rule-based plan", f) for f in fb), fb
    assert any(re.fullmatch(r"detect: model reply rejected 4× \(.+\) → no distortions listed .*", f) for f in fb), fb
    assert any(re.fullmatch(r"select: model reply rejected 4× \(.+\) → generic tools \(.+\)", f) for f in fb), fb
    assert any(re.fullmatch(r"summarizer: model reply rejected 4× \(.+\) → .*", f) for f in fb), fb
    assert any(lg["error"] is None for lg in res["evidence"]["tool_logs"])  # a generic tool still scored


def test_invalid_json_every_time(tmp_path, images, registry):
    with FakeOpenAIServer(scripted(every_route("this is not JSON {{"))) as srv:
        records, _ = run(tmp_path, images, srv.base_url, registry)
    for rec in records:
        assert_lm_output_degraded(rec)


def test_schema_violating_json(tmp_path, images, registry):
    wrong = json.dumps({"planner_output": {"query_type": "Banana"}, "distortion_set": 7, "distortion_analysis": "x",
                        "selected_tools": ["not", "a", "mapping"], "level": "Z", "final_answer": None})
    with FakeOpenAIServer(scripted(every_route(wrong))) as srv:
        records, _ = run(tmp_path, images, srv.base_url, registry)
    for rec in records:
        assert_lm_output_degraded(rec)
    # The retries told the model what was wrong (StructuredPredict's feedback reached the wire).
    assert any("your previous reply was rejected" in json.dumps(r["body"]) for r in srv.requests)


def test_empty_reply(tmp_path, images, registry):
    with FakeOpenAIServer(scripted(every_route(""))) as srv:
        records, _ = run(tmp_path, images, srv.base_url, registry)
    for rec in records:
        assert_lm_output_degraded(rec)


def assert_offline_answered(rec: dict, why: str) -> None:
    """The LM service failed: the offline analyst answered the rest, and the result says so."""
    assert rec["backend"].startswith("offline analyst (LM unreachable: ") and why in rec["backend"], rec["backend"]
    assert "\n" not in rec["backend"]
    assert any("offline analyst answers" in f for f in fallbacks(rec))


def test_429_with_retry_after_is_honoured_then_the_offline_analyst_answers(tmp_path, images, registry):
    """Rate limited on every call: the LM's own retry waits Retry-After, then the assessment stops
    asking (one node's retries, not every node's) and the offline analyst answers."""
    stamps: list[float] = []
    lock = threading.Lock()
    inner = scripted(every_route(Reply(status=429, headers={"Retry-After": "1"})))

    def responder(body):
        with lock:
            stamps.append(time.monotonic())
        return inner(body)

    with FakeOpenAIServer(responder) as srv:
        records, _ = run(tmp_path, images, srv.base_url, registry, num_retries=1)
    for rec in records:
        assert_offline_answered(rec, "LMRateLimitError")
    # One planner call and its single retry per item, and nothing after the switch to offline.
    assert len(srv.requests) == 2 * N_ITEMS
    assert all(route_of(r["body"]) == "plan" for r in srv.requests)
    # The retry waited at least the Retry-After second (a lower bound: slowness cannot break it).
    stamps.sort()
    assert stamps[-1] - stamps[0] >= 1.0


def test_http_500_every_time(tmp_path, images, registry):
    with FakeOpenAIServer(scripted(every_route(Reply(status=500)))) as srv:
        records, _ = run(tmp_path, images, srv.base_url, registry, num_retries=0)
    for rec in records:
        assert_offline_answered(rec, "LMServerError")


def test_connection_refused(tmp_path, images, registry):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    records, _ = run(tmp_path, images, f"http://127.0.0.1:{port}/v1", registry, num_retries=0)
    for rec in records:
        assert_offline_answered(rec, "LMTransportError")


def test_reply_slower_than_the_timeout(tmp_path, images, registry):
    with FakeOpenAIServer(scripted(every_route(Reply(content="{}", delay=3.0)))) as srv:
        records, _ = run(tmp_path, images, srv.base_url, registry, timeout=0.5, num_retries=0)
    for rec in records:
        assert_offline_answered(rec, "timed out")


def test_logprobs_missing(tmp_path, images, registry):
    # The provider ignores logprobs=True: the reply carries no "logprobs" at all.
    routes = good_routes(score=Reply(content=json.dumps(valid_reply("score", level="B")), logprobs=None))
    with FakeOpenAIServer(scripted(routes)) as srv:
        records, _ = run(tmp_path, images, srv.base_url, registry)
    assert any(r["body"].get("logprobs") for r in srv.requests if route_of(r["body"]) == "score")
    for rec in records:
        res = rec["result"]["result"]
        assert res["prob_mode"] == "classification", res
        # The spec's fallback: 0.7 on the chosen level, 0.075 on each other one, and the result says so.
        assert "smoothed 0.7/0.075" in res["prob_source"]
        assert res["probabilities"]["4"] == pytest.approx(0.7) and res["probabilities"]["1"] == pytest.approx(0.075)  # B = 4, E = 1
        assert rec["backend"] == "vlm (openai/fake-vlm)" and rec["level"] in list("ABCDE")


class FaultyRegistry(ToolRegistry):
    """The real registry and the real pyiqa metric; after the metric runs, one tool's result is
    replaced the way a buggy metric fails: an exception, or a non-finite score."""

    def __init__(self, tool: str, fault: str):
        super().__init__(cache=False)
        self.tool, self.fault = tool, fault

    def _forward(self, metric, lock, spec, x, ref):
        out = ToolRegistry._forward(metric, lock, spec, x, ref)
        if spec.name != self.tool:
            return out
        if self.fault == "raise":
            raise RuntimeError("simulated crash inside the metric")
        return [float(self.fault)] * len(out)


@pytest.mark.parametrize("fault,expected", [
    ("raise", "RuntimeError: simulated crash inside the metric"),
    ("nan", "returned a non-finite score (nan)"),
    ("inf", "returned a non-finite score (inf)"),
])
def test_a_failing_tool_falls_back_to_a_generic_one(tmp_path, images, fault, expected):
    with FakeOpenAIServer(scripted(good_routes())) as srv:
        records, _ = run(tmp_path, images, srv.base_url, FaultyRegistry("PIQE", fault))
    for rec in records:
        logs = rec["result"]["evidence"]["tool_logs"]
        piqe = [lg for lg in logs if lg["tool_name"] == "PIQE"]
        assert piqe and all(expected in lg["error"] for lg in piqe)
        assert all(lg["normalized_score"] == "NaN" for lg in piqe)  # failed score: null-like, never a number
        rescue = [lg for lg in logs if lg["fallback"] and lg["fallback_for"] == "PIQE" and lg["error"] is None]
        assert rescue and rescue[0]["tool_name"] == "NIQE"
        assert any(f.startswith("execute: PIQE failed (") and f.endswith(") → NIQE") for f in fallbacks(rec))
        assert rec["result"]["evidence"]["quality_scores"]["Global"]["Blurs"][0] == "NIQE"


def test_a_tool_whose_weights_are_missing_fails_before_loading_anything(tmp_path, images, registry, monkeypatch):
    """MUSIQ needs a checkpoint this machine lacks. The registry's preflight refuses it from the file
    system alone; if anything went on to create the pyiqa metric (where the ~50 s hub download hang
    lives) the guard below would turn the log's error into a different message and fail the test."""
    create = ToolRegistry._create

    def guard(self, spec, *args, **kwargs):
        if spec.name == "MUSIQ":
            raise AssertionError("MUSIQ was created: the preflight did not stop a tool with missing weights")
        return create(self, spec, *args, **kwargs)  # the fallback tools are created as usual

    monkeypatch.setattr(ToolRegistry, "_create", guard)
    plan = valid_reply("plan", required_tool=["MUSIQ"],
                       plan={"distortion_detection": True, "distortion_analysis": True, "tool_selection": False, "tool_execution": True})
    with FakeOpenAIServer(scripted(good_routes(plan=plan))) as srv:
        records, _ = run(tmp_path, images, srv.base_url, ToolRegistry(cache=False, offline=True))
    for rec in records:
        logs = rec["result"]["evidence"]["tool_logs"]
        musiq = [lg for lg in logs if lg["tool_name"] == "MUSIQ"]
        assert musiq and "missing weights" in musiq[0]["error"] and "musiq_koniq_ckpt" in musiq[0]["error"]
        assert any(lg["fallback_for"] == "MUSIQ" and lg["error"] is None for lg in logs)
        assert any(f.startswith("execute: MUSIQ failed (missing weights") and " → " in f for f in fallbacks(rec)), fallbacks(rec)


# ── the LM is set up wrong: the assessment stops with the reason instead of degrading ───────────


def test_key_refused_stops_the_assessment_with_the_reason(tmp_path, images, registry):
    refused = Reply(status=401, error_body={"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                                      "code": "invalid_api_key"}})
    with FakeOpenAIServer(scripted(every_route(refused))) as srv:
        settings = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        assessor = Assessor(settings, registry=registry)
        with pytest.raises(LMSetupError, match=r"the LM cannot be used: .*(401|API key).*--offline"):
            assessor.assess(images[0], "Rate this photo")
        assert len(srv.requests) == 1  # not retried, not re-asked at every node
        # A batch records the first item's failure with that reason and takes no further items.
        out = tmp_path / "results.jsonl"
        summary = run_batch([BatchItem(image=str(p)) for p in images], out, assessor, concurrency=1)
        assert len(srv.requests) == 2
        yielded = []
        with pytest.raises(LMSetupError):  # the API's batch: what finished is yielded, then the reason
            for r in assess_many(images, assessor=assessor, concurrency=1):
                yielded.append(r.error_type)
        assert yielded == ["lm_setup"]
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["error_type"] for r in records] == ["lm_setup"] and "the LM cannot be used" in records[0]["error"]
    assert summary.stopped and summary.not_attempted == N_ITEMS - 1 and summary.status == "stopped"


@pytest.mark.parametrize("status, body, expected", [
    (404, {"error": {"message": "Not Found"}}, "/v1"),
    (400, {"error": {"message": "image_url is not supported by this model", "type": "invalid_request_error"}},
     "vision-language model"),
])
def test_wrong_endpoint_or_a_text_only_model_stops_with_the_reason(tmp_path, images, registry, status, body, expected):
    with FakeOpenAIServer(scripted(every_route(Reply(status=status, error_body=body)))) as srv:
        settings = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        with pytest.raises(LMSetupError, match="the LM cannot be used") as info:
            Assessor(settings, registry=registry).assess(images[0], "Rate this photo")
        assert len(srv.requests) == 1
    assert expected in str(info.value)


def test_missing_key_is_one_clear_cli_error(tmp_path, images):
    from typer.testing import CliRunner

    from agentic_iqa.cli import app
    from agentic_iqa.cli.common import EXIT_BAD_INPUT

    res = CliRunner().invoke(app, ["assess", str(images[0]), "--lm", "openai/gpt-4o", "--config", str(tmp_path)])
    assert res.exit_code == EXIT_BAD_INPUT, res.output
    assert "OPENAI_API_KEY" in res.output and "--offline" in res.output and "Traceback" not in res.output
    assert "dspy.LM(" not in res.output  # keys come from the environment only: no api_key= advice


def test_a_model_string_without_a_known_provider_is_one_clear_cli_error(tmp_path, images):
    from typer.testing import CliRunner

    from agentic_iqa.cli import app

    res = CliRunner().invoke(app, ["assess", str(images[0]), "--lm", "gpt4o-typo", "--config", str(tmp_path)])
    assert res.exit_code == 2 and "provider/model" in res.output and "Traceback" not in res.output, res.output


def test_an_unknown_provider_and_a_missing_litellm_key_are_said_plainly(tmp_path, images, monkeypatch):
    # "foo/bar" was told to "write the model as provider/model", which it is; a missing Anthropic key printed
    # LiteLLM's paragraph (federation rules, params) instead of the one line DSPy's own providers give.
    from typer.testing import CliRunner

    from agentic_iqa.cli import app

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    res = CliRunner().invoke(app, ["assess", str(images[0]), "--lm", "foo/bar", "--config", str(tmp_path)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "'foo' is not a provider LiteLLM knows" in text and "Traceback" not in text, text
    res = CliRunner().invoke(app, ["assess", str(images[0]), "--lm", "anthropic/claude-sonnet-4-5",
                                   "--config", str(tmp_path)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "no API key found for Anthropic. Set ANTHROPIC_API_KEY in the environment" in text
    assert "FEDERATION" not in text and "Traceback" not in text, text


@pytest.mark.parametrize("model", ["openai/", "OpenAI/gpt-4o"])
def test_a_malformed_model_string_says_how_to_write_it_once(tmp_path, images, model):
    # Before: "planner: model 'openai/': model 'openai/' has a provider prefix but no model id after
    # it" (the name twice, no example), and for "OpenAI/gpt-4o" advice to write provider/model, which
    # it is: the provider name is lower case.
    from typer.testing import CliRunner

    from agentic_iqa.cli import app

    res = CliRunner().invoke(app, ["assess", str(images[0]), "--lm", model, "--config", str(tmp_path)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in text, text
    assert text.count(repr(model)) + text.count(f"[{model}]") == 1, text
    assert "openai/gpt-4o" in text and ("lower case" in text or model == "openai/"), text


def test_a_dead_server_trips_the_circuit_breaker(tmp_path, registry):
    """Issue 11 part 4: against a dead server, a batch stops taking items after UNREACHABLE_STREAK items
    in a row found it unreachable, instead of every item waiting through the timeout and retries."""
    from agentic_iqa.batch.runner import UNREACHABLE_STREAK

    imgs = [write_test_image(tmp_path / f"d{i}.jpg", size=(128, 128), seed=i) for i in range(6)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = load_settings(tmp_path, lm="openai/fake-vlm", api_base=f"http://127.0.0.1:{port}/v1",
                             cache={"enabled": False})
    for role in ("planner", "executor", "summarizer"):
        settings.backends.role(role).num_retries = 0
    items = [BatchItem(image=str(p)) for p in imgs]
    out = tmp_path / "results.jsonl"
    summary = run_batch(items, out, Assessor(settings, registry=registry), concurrency=1)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == UNREACHABLE_STREAK < len(imgs)
    assert all(r["status"] == "ok" and r["backend"].startswith("offline analyst (LM unreachable") for r in records)
    assert summary.status == "stopped" and "unreachable" in summary.stopped
    assert summary.not_attempted == len(imgs) - UNREACHABLE_STREAK


def test_one_unreachable_item_among_answered_ones_does_not_stop_the_batch(tmp_path, registry):
    imgs = [write_test_image(tmp_path / f"e{i}.jpg", size=(128, 128), seed=i) for i in range(4)]
    busy = Reply(status=503, error_body={"error": {"message": "busy"}})
    # Items 1 and 3 find the server busy at their first call; items 2 and 4 are answered by the model.
    flaky = good_routes(plan=[busy, valid_reply("plan"), busy, valid_reply("plan")])
    with FakeOpenAIServer(scripted(flaky)) as srv:
        settings = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        for role in ("planner", "executor", "summarizer"):
            settings.backends.role(role).num_retries = 0
        summary = run_batch([BatchItem(image=str(p)) for p in imgs], tmp_path / "r.jsonl",
                            Assessor(settings, registry=registry), concurrency=1)
    assert summary.stopped is None and summary.ran == len(imgs)
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sum(r["backend"].startswith("offline analyst (LM unreachable") for r in records) == 2


def test_a_long_error_in_a_fallback_line_is_cut_at_a_word_and_marked():
    # A gateway's HTML page is quoted in DSPy's long "not JSON" message; the fallback line (and the
    # "LM unreachable" reason) keep 200 characters. Before, the cut fell mid-sentence with nothing to
    # show it: "... A gateway or  → rule-based plan".
    from types import SimpleNamespace

    from agentic_iqa.graph import _fell_back
    from agentic_iqa.state import Trace, fallbacks as fallback_lines

    message = ("[openai/fake] the reply (HTTP 200, text/html, 41 bytes) is not JSON: Expecting value: line 1 column 1 "
               "(char 0). Body starts: '<html><body>502 Bad Gateway</body></html>'. A gateway or proxy in front of "
               "the provider is the usual cause; the request may or may not have been served.")
    ctx = SimpleNamespace(trace=Trace())
    _fell_back("planner", ctx, RuntimeError(message), "rule-based plan")
    (line,) = fallback_lines(ctx.trace.events)
    why = line.removeprefix("planner: ").split(" → ")[0]
    assert why.endswith("…") and len(why) <= 201, why
    assert not why.endswith(" …") and "  " not in line, line
    assert message.startswith(why[:-1].removeprefix("RuntimeError: ")), why
