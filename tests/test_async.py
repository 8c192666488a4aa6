"""`assess_async`: the graph's async nodes (`ainvoke`) and DSPy's async LM path (`acall`), over real HTTP."""
from __future__ import annotations

import asyncio

import dspy
import pytest

from canned import disable_dspy_cache, valid_reply, write_test_image
from fake_openai import FakeOpenAIServer, Reply, route_of, scripted

from agentic_iqa.api import Assessor
from agentic_iqa.config import load_settings

LOGPROBS = {"A": -2.5, "B": -0.5, "C": -1.1, "D": -3.0, "E": -5.0}
ROUTES = {
    "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
    "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
    "score": valid_reply("score", level="B"), "_logprobs": LOGPROBS,
}


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    disable_dspy_cache()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return write_test_image(tmp_path_factory.mktemp("async") / "photo.jpg", size=(96, 72), quality=55)


def _assessor(tmp_path, srv) -> Assessor:
    s = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
    for role in ("planner", "executor", "summarizer"):
        s.backends.role(role).num_retries = 1
        s.backends.role(role).timeout = 10
    return Assessor(s)


@pytest.fixture
def lm_entry_points(monkeypatch):
    """Which of DSPy's LM entry points the assessment used (a spy: the calls go through unchanged)."""
    seen = {"sync": 0, "async": 0}
    call, acall = dspy.LM.__call__, dspy.LM.acall

    def spy_call(self, *a, **k):
        seen["sync"] += 1
        return call(self, *a, **k)

    async def spy_acall(self, *a, **k):
        seen["async"] += 1
        return await acall(self, *a, **k)

    monkeypatch.setattr(dspy.LM, "__call__", spy_call)
    monkeypatch.setattr(dspy.LM, "acall", spy_acall)
    return seen


def test_async_gives_the_sync_result_through_dspy_async_calls(tmp_path, image, lm_entry_points):
    with FakeOpenAIServer(scripted(ROUTES)) as srv:
        a = _assessor(tmp_path, srv)
        sync = a.assess(image, "Rate the quality of this photo")
        assert lm_entry_points == {"sync": 5, "async": 0}
        result = asyncio.run(a.assess_async(image, "Rate the quality of this photo"))
    assert lm_entry_points == {"sync": 5, "async": 5}
    assert sorted(route_of(r["body"]) for r in srv.requests[5:]) == ["analyze", "detect", "plan", "score", "select"]
    assert result.score == pytest.approx(sync.score, abs=1e-12) and result.result.level == sync.result.level == "B"
    assert result.lm_calls == sync.lm_calls == 5 and result.fallbacks == sync.fallbacks == []
    assert [lg.tool_name for lg in result.evidence.tool_logs] == [lg.tool_name for lg in sync.evidence.tool_logs]
    assert set(result.timings) == set(sync.timings)


def test_concurrent_async_assessments_overlap_their_model_calls_without_a_thread_each(tmp_path, image, lm_entry_points):
    """Six assessments awaited together with ONE worker thread for the CPU steps: their model calls are
    still in flight at once, because no thread waits on HTTP (with `to_thread` per assessment, one worker
    would run them one after another: one request in flight)."""
    from concurrent.futures import ThreadPoolExecutor

    with FakeOpenAIServer(scripted(ROUTES), latency=0.3) as srv:
        a = _assessor(tmp_path, srv)
        a.assess(image, "Rate the quality of this photo")  # build registry, LMs and metrics first
        srv.peak_in_flight = 0

        async def main():
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
            return await asyncio.gather(*(a.assess_async(image, "Rate the quality of this photo") for _ in range(6)))

        results = asyncio.run(main())
    assert [r.result.level for r in results] == ["B"] * 6 and all(r.lm_calls == 5 for r in results)
    assert srv.peak_in_flight >= 4, srv.peak_in_flight
    assert len(srv.requests) == 5 + 6 * 5 and lm_entry_points == {"sync": 5, "async": 30}


def test_async_errors_and_fallbacks_match_the_sync_path(tmp_path, image):
    """A detection reply that never validates: the same null + recorded failure, sync and async."""
    routes = {**ROUTES, "detect": Reply(content="not json at all")}
    with FakeOpenAIServer(scripted(routes)) as srv:
        a = _assessor(tmp_path, srv)
        sync = a.assess(image, "Rate the quality of this photo")
        result = asyncio.run(a.assess_async(image, "Rate the quality of this photo"))
    assert result.evidence.distortion_set is None and sync.evidence.distortion_set is None
    assert result.retries == sync.retries > 0 and result.lm_calls == sync.lm_calls
    assert result.score == pytest.approx(sync.score, abs=1e-12)


def test_async_counts_every_http_request_like_the_sync_path(tmp_path, image):
    """The planner's first request gets a 500 and the LM's own retry the plan: both count, sync and async."""
    with FakeOpenAIServer(scripted(ROUTES)) as srv:
        clean = _assessor(tmp_path, srv).assess(image, "Rate the quality of this photo")
    with FakeOpenAIServer(scripted({**ROUTES, "plan": [Reply(status=500), valid_reply("plan")]})) as srv:
        a = _assessor(tmp_path, srv)
        result = asyncio.run(a.assess_async(image, "Rate the quality of this photo"))
    assert len(srv.requests) == 6 and result.lm_calls == 6 and result.retries == 1
    # The image went out 4 times without the retry (plan, detect, analyze, score), 5 times with it.
    assert clean.image_bytes_sent > 0 and result.image_bytes_sent * 4 == clean.image_bytes_sent * 5


def test_async_offline_analyst_matches_sync(tmp_path):
    """No model: every step runs in worker threads; same answer and score as the sync path."""
    import agentic_iqa

    sync = agentic_iqa.assess("example:coins", "Is it blurry?", config=tmp_path, backend="offline", use_cache=False)
    result = asyncio.run(agentic_iqa.assess_async("example:coins", "Is it blurry?", config=tmp_path,
                                                  backend="offline", use_cache=False))
    assert result.backend == sync.backend == "offline analyst" and result.answer == sync.answer
    assert result.lm_calls == 0 and [lg.raw_score for lg in result.evidence.tool_logs] == \
        [lg.raw_score for lg in sync.evidence.tool_logs]
