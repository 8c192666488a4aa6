"""A hostile or broken LM server, through the real HTTP path (the local fake server) — issue 11 part 4,
issue 12 (lm_calls): one wall-clock budget per LM call (retries and Retry-After waits included), a capped
Retry-After, a reply-size cap before parsing, and every HTTP request counted in the result.

No wall times are asserted: the bounds are checked on the number of requests the server received, and
a call that would wait an hour is run in a thread that must finish well before that (a hang fails the
test instead of hanging the suite).
"""
from __future__ import annotations

import contextvars
import json
import threading

import pytest

from canned import disable_dspy_cache, valid_reply, write_test_image
from fake_openai import FakeOpenAIServer, Reply, route_of, scripted

from agentic_iqa.api import Assessor
from agentic_iqa.config import RoleLM, load_settings
from agentic_iqa.lm import build_lm, lm_unreachable, metering
from iqa_tools import ToolRegistry

HOUR = "3600"
LOGPROBS = {"A": -2.5, "B": -0.5, "C": -1.1, "D": -3.0, "E": -5.0}


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    disable_dspy_cache()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def lm_for(srv: FakeOpenAIServer, **settings):
    return build_lm(RoleLM(model="openai/fake-vlm", api_base=srv.base_url, **settings))


def call_bounded(fn, limit: float = 60.0):
    """fn() in a thread; (result, exception). Fails if it is still running after `limit` seconds (a
    Retry-After of an hour honoured, or a budget not kept, would be that)."""
    out: dict = {}
    context = contextvars.copy_context()  # the caller's metering() block sees the thread's requests

    def run():
        try:
            out["value"] = fn()
        except Exception as exc:  # noqa: BLE001
            out["error"] = exc

    t = threading.Thread(target=context.run, args=(run,), daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"the LM call was still running after {limit:g} s"
    return out.get("value"), out.get("error")


def test_slow_server_the_budget_bounds_the_call_retries_included():
    # Every reply takes 5 s; the read timeout is 0.2 s. DSPy's own loop would send 1 + 10 requests
    # and sleep 1+2+4+...+60 s between them; the 1.5 s budget allows the first request, one backoff
    # second and a second request cut to what is left.
    with FakeOpenAIServer(lambda body: Reply(content="late", delay=5.0)) as srv:
        lm = lm_for(srv, timeout=0.2, num_retries=10, call_budget=1.5)
        with metering() as sent:
            _, err = call_bounded(lambda: lm("hello"))
        n = len(srv.requests)
    assert err is not None and type(err).__name__ == "LMBudgetExceeded", err
    assert "call budget of 1.5 s" in str(err) and "raise call_budget or timeout" in str(err)
    assert 1 <= n <= 2, n  # not 11
    assert sent.requests == n  # every request sent is counted
    assert lm_unreachable(err)  # a timeout for every purpose: the offline analyst takes over


def test_a_server_trickling_its_reply_cannot_outlast_the_budget():
    # Headers at once, then one byte a second of a body announced as 100 kB: every read gets a byte
    # within the 0.5 s read timeout, so only the call's wall-clock budget can end it. Before, the sync
    # path waited as long as the server kept trickling (the async path was bounded by wait_for).
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def trickle(conn):
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            while not stop.is_set():
                try:
                    conn.sendall(b" ")
                except OSError:
                    return
                time.sleep(0.2)

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    port = listener.getsockname()[1]
    try:
        lm = build_lm(RoleLM(model="openai/fake-vlm", api_base=f"http://127.0.0.1:{port}/v1",
                             timeout=0.5, num_retries=2, call_budget=1.5))
        started = time.monotonic()
        _, err = call_bounded(lambda: lm("hello"), limit=20)
        took = time.monotonic() - started
    finally:
        stop.set()
        listener.close()
    assert type(err).__name__ == "LMBudgetExceeded", err
    assert "call budget of 1.5 s" in str(err)
    assert took < 10, took
    assert lm_unreachable(err)


def _late_server_errors(**settings) -> list:
    """The errors of one sync and one async call, with these LM settings, to a server that answers after 3 s."""
    import asyncio

    with FakeOpenAIServer(lambda body: Reply(content="late", delay=3.0)) as srv:
        lm = lm_for(srv, **settings)
        return [call_bounded(lambda: lm("hello"))[1], call_bounded(lambda: asyncio.run(lm.acall("hello")))[1]]


def test_a_last_request_cut_to_the_budget_reports_the_budget_not_the_read_timeout():
    # With timeout 120 and call_budget 300, a silent server ended after 299 s with "no bytes for 16s (the per-request
    # timeout)": the last request's read timeout had been cut to what the budget had left. Here: 1 s, a 1 s backoff,
    # then 0.5 s.
    for e in _late_server_errors(timeout=1.0, num_retries=1, call_budget=2.9):
        assert type(e).__name__ == "LMBudgetExceeded", e
        assert "call budget of 2.9 s (2 request(s)" in str(e) and "per-request timeout" not in str(e), e
        assert lm_unreachable(e)


def test_a_read_timeout_names_the_setting_to_raise():
    # DSPy's read-timeout message advised "raise it with Timeouts(read=...)", an API no user of ours
    # sees; `compile` printed it as is. It now names our settings, and stays a transport failure.
    for e in _late_server_errors(timeout=0.25, num_retries=0, call_budget=30):
        assert type(e).__name__ == "LMTransportError", e
        assert "Timeouts(read" not in str(e) and "lm15" not in str(e), e
        assert "raise timeout" in str(e) and "configs/model_backends.yaml" in str(e), e
        assert "read timed out" in str(e) and lm_unreachable(e)


def test_retry_after_of_an_hour_is_capped_and_the_call_then_succeeds():
    replies = iter([Reply(status=429, headers={"Retry-After": HOUR}), Reply(content="fine")])
    with FakeOpenAIServer(lambda body: next(replies)) as srv:
        lm = lm_for(srv, num_retries=2, max_retry_after=0.1, call_budget=60)
        with metering() as sent:
            out, err = call_bounded(lambda: lm("hello"))
        n = len(srv.requests)
    assert err is None, err
    assert out == ["fine"]
    assert n == 2 and sent.requests == 2


def test_retry_after_beyond_the_budget_fails_at_once():
    # Uncapped Retry-After (max_retry_after 2 h) but a 5 s budget: waiting an hour cannot fit, so the
    # call fails after the one request, naming what the server asked.
    with FakeOpenAIServer(lambda body: Reply(status=429, headers={"Retry-After": HOUR})) as srv:
        lm = lm_for(srv, num_retries=3, max_retry_after=7200, call_budget=5)
        _, err = call_bounded(lambda: lm("hello"))
        n = len(srv.requests)
    assert type(err).__name__ == "LMBudgetExceeded", err
    assert "the server asked to wait 3600 s" in str(err)
    assert n == 1
    assert isinstance(err.__cause__, Exception) and type(err.__cause__).__name__ == "LMRateLimitError"


def test_the_budget_holds_on_the_async_path():
    import asyncio

    with FakeOpenAIServer(lambda body: Reply(content="late", delay=5.0)) as srv:
        lm = lm_for(srv, timeout=0.2, num_retries=10, call_budget=1.5)
        _, err = call_bounded(lambda: asyncio.run(lm.acall("hello")))
        n = len(srv.requests)
    assert type(err).__name__ == "LMBudgetExceeded", err
    assert 1 <= n <= 2, n


def test_reply_over_the_size_cap_is_refused_unparsed_and_not_retried():
    big = "x" * (2 * 1024 * 1024)
    with FakeOpenAIServer(lambda body: Reply(content=big)) as srv:
        lm = lm_for(srv, num_retries=3, max_reply_bytes=1024 * 1024)
        _, err = call_bounded(lambda: lm("hello"))
        n = len(srv.requests)
    assert type(err).__name__ == "LMReplyTooLarge", err
    assert "2,097,152 bytes, over max_reply_bytes (1,048,576)" in str(err) and "refused unparsed" in str(err)
    assert n == 1
    assert not lm_unreachable(err)  # the server answered: a bad reply, not an outage


def test_reply_under_the_cap_passes():
    with FakeOpenAIServer(lambda body: Reply(content="é" * 1000)) as srv:
        out = lm_for(srv, max_reply_bytes=2000)("hello")  # 2000 bytes in UTF-8: exactly at the cap
    assert out == ["é" * 1000]


# ── a reply that does not end: the cap bounds what is read, not only what is parsed ────────────────

MiB = 1024 * 1024


class Flood:
    """A raw HTTP server answering every request 200 at once, then body bytes as fast as the client
    takes them until the client hangs up, or `ceiling` bytes or `seconds` have gone. `framing`: "chunked",
    "close" (no length: the body ends when the connection does) or "length" (an honest Content-Length of
    a terabyte). `sent` counts the body bytes that got out, `hung_up` says the client closed first (a
    client that stops reading without closing stalls the server's send: after 5 s it gives up)."""

    PREFIX = b'{"id":"chatcmpl-flood","object":"chat.completion","choices":[{"index":0,"message":{"content":"'

    def __init__(self, framing: str, ceiling: int = 256 * MiB, seconds: float = 30.0):
        import socket

        self.framing, self.ceiling, self.seconds = framing, ceiling, seconds
        self.requests, self.sent, self.hung_up = 0, 0, False
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self._stop = threading.Event()
        self._answering: list[threading.Thread] = []
        self.base_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    def _answer(self, conn) -> None:
        import time

        with conn:
            conn.settimeout(5.0)
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            self.requests += 1
            framing = {"chunked": b"Transfer-Encoding: chunked\r\n", "close": b"Connection: close\r\n",
                       "length": b"Content-Length: %d\r\n" % 10**12}[self.framing]
            piece = b"x" * 65536
            frame = (lambda b: b"%x\r\n%s\r\n" % (len(b), b)) if self.framing == "chunked" else (lambda b: b)
            ends = time.monotonic() + self.seconds
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + framing + b"\r\n"
                             + frame(self.PREFIX))
                while self.sent < self.ceiling and time.monotonic() < ends and not self._stop.is_set():
                    conn.sendall(frame(piece))
                    self.sent += len(piece)
            except TimeoutError:
                return
            except OSError:
                self.hung_up = True

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            answer = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self._answering.append(answer)
            answer.start()

    def __enter__(self) -> "Flood":
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for answer in self._answering:  # `sent` and `hung_up` are final once every answer has ended
            answer.join(10)
        self._stop.set()
        self._listener.close()


def _call(lm, how: str):
    import asyncio

    return call_bounded(lambda: lm("hello") if how == "sync" else asyncio.run(lm.acall("hello")))


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_an_endless_reply_is_cut_off_while_it_is_read(framing, how):
    # Before, the whole body was read into memory and only then measured: the client took all 256 MiB
    # the server offered (or, from a server that never stops, as much as arrived until the budget ran
    # out) before refusing a reply capped at 64 KiB. Now reading stops at the cap's body limit
    # (8 x 64 KiB + 4 MiB, see agentic_iqa.lm._body_limit) and the connection is closed. What the
    # server still got out beyond that sat in the two sockets' buffers.
    with Flood(framing) as srv:
        lm = lm_for(srv, num_retries=3, max_reply_bytes=64 * 1024)
        _, err = _call(lm, how)
    assert type(err).__name__ == "LMReplyTooLarge", err
    assert "the reply is more than 4,718,592 bytes (read no further), over max_reply_bytes (65,536)" in str(err), err
    assert "refused unparsed" in str(err)
    assert srv.requests == 1  # not retried
    assert srv.hung_up and srv.sent < 64 * MiB, srv.sent  # the client closed the connection, far below 256 MiB
    assert not lm_unreachable(err)


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_reply_announcing_a_terabyte_is_refused_unread(how):
    # Before, the client read what came (all 256 MiB) and then failed on the missing rest, a transport
    # error it retried. Now the Content-Length alone refuses it: what got out sat in the sockets' buffers.
    with Flood("length") as srv:
        lm = lm_for(srv, num_retries=3, max_reply_bytes=64 * 1024)
        _, err = _call(lm, how)
    assert type(err).__name__ == "LMReplyTooLarge", err
    assert "the reply is 1,000,000,000,000 bytes (its Content-Length; not read), over max_reply_bytes (65,536)" in str(err), err
    assert srv.requests == 1
    assert srv.hung_up and srv.sent < 64 * MiB, srv.sent


def test_refused_replies_give_their_connection_slot_back():
    # lm15's sync transport has 100 connection slots and gives one back when a reply's body iterator
    # ends, which closing the reply does not do: had a reply refused on its Content-Length only been
    # closed, each would keep its slot for good, and the 101st request would wait `timeout` for a free
    # one and fail. (The garbage collector is off: nothing may depend on it.)
    import gc

    gc.disable()
    try:
        with Flood("length", ceiling=0) as srv:
            lm = lm_for(srv, num_retries=0, timeout=1, max_reply_bytes=1024)
            errors = [call_bounded(lambda: lm("hello"))[1] for _ in range(105)]
    finally:
        gc.enable()
    assert {type(e).__name__ for e in errors} == {"LMReplyTooLarge"}, errors[-1]


def test_config_rejects_a_non_positive_budget_or_cap():
    from pydantic import ValidationError

    for bad in ({"call_budget": 0}, {"max_reply_bytes": 0}, {"max_retry_after": -1}):
        with pytest.raises(ValidationError):
            RoleLM(**bad)


# ── through the whole assessment ─────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return write_test_image(tmp_path_factory.mktemp("hostile_lm") / "photo.jpg", size=(128, 128), seed=3)


@pytest.fixture(scope="module")
def registry():
    return ToolRegistry(cache=False)


def assessor_for(tmp_path, base_url, registry, **role):
    settings = load_settings(tmp_path, lm="openai/fake-vlm", api_base=base_url, cache={"enabled": False})
    for name in ("planner", "executor", "summarizer"):
        for key, value in role.items():
            setattr(settings.backends.role(name), key, value)
    return Assessor(settings, registry=registry)


def good_routes(**overrides) -> dict:
    routes = {"plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
              "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
              "score": valid_reply("score", level="B"), "_logprobs": LOGPROBS}
    routes.update(overrides)
    return routes


def test_lm_calls_count_every_http_request_500_then_200(tmp_path, image, registry):
    # The planner's first request gets a 500; the LM's own retry gets the plan. Both were sent.
    routes = good_routes(plan=[Reply(status=500), valid_reply("plan")])
    with FakeOpenAIServer(scripted(routes)) as srv:
        result = assessor_for(tmp_path, srv.base_url, registry, num_retries=2).assess(image, "Rate the quality of this photo")
        chat = [r for r in srv.requests if r["path"].rstrip("/").endswith("chat/completions")]
    assert [route_of(r["body"]) for r in chat].count("plan") == 2
    assert result.lm_calls == len(chat), (result.lm_calls, len(chat))
    assert result.retries >= 1
    assert not result.lm_unreachable and result.backend == "vlm (openai/fake-vlm)"


def test_lm_calls_count_requests_of_a_call_that_failed(tmp_path, image, registry):
    # Every request fails: the planner's call gives up after 1 + 1 requests and the offline analyst
    # answers; the two requests still count.
    with FakeOpenAIServer(lambda body: Reply(status=500)) as srv:
        result = assessor_for(tmp_path, srv.base_url, registry, num_retries=1).assess(image, "Rate the quality of this photo")
        n = len(srv.requests)
    assert result.lm_unreachable
    assert n == 2 and result.lm_calls == 2 and result.retries == 1


def test_oversized_reply_in_an_assessment_is_one_failed_try(tmp_path, image, registry):
    # The planner answers 2 MiB of prose. Before: parsed by the JSON adapter (seconds of CPU per
    # megabyte) and re-asked 3 more times, each after the LM's own retries. Now: refused unparsed,
    # one request, the rule-based plan is used and the trace says why.
    routes = good_routes(plan="no JSON here " * (2 * 1024 * 1024 // 13))
    with FakeOpenAIServer(scripted(routes)) as srv:
        result = assessor_for(tmp_path, srv.base_url, registry, max_reply_bytes=1024 * 1024).assess(
            image, "Rate the quality of this photo")
        plans = [r for r in srv.requests if route_of(r["body"]) == "plan"]
    assert len(plans) == 1
    assert result.score is not None and not result.lm_unreachable
    trace = json.dumps([e.model_dump() for e in result.trace])
    assert "over max_reply_bytes" in trace
    assert any(f.startswith("planner:") for f in result.fallbacks), result.fallbacks


def test_error_types_importable_and_the_lm_pickles_by_reference():
    import pickle

    from agentic_iqa.lm import BudgetedLM, LMBudgetExceeded, LMReplyTooLarge
    from dspy.utils.exceptions import LMTimeoutError

    assert issubclass(LMBudgetExceeded, LMTimeoutError) and LMReplyTooLarge.__module__ == "agentic_iqa.lm"
    assert pickle.loads(pickle.dumps(BudgetedLM)) is BudgetedLM


# ── a 200 that is not an API: a captive portal's login page at the base URL ────────────────────────

PORTAL = Reply(raw_body=b"<!DOCTYPE html><html><head><title>Hotel Wi-Fi</title></head><body><form>Log in</form></body></html>",
               content_type="text/html; charset=utf-8")


@pytest.mark.parametrize("how", ["sync", "async"])
def test_an_html_page_behind_a_200_is_not_an_api_and_is_not_retried(how):
    with FakeOpenAIServer(lambda body: PORTAL) as srv:
        lm = lm_for(srv, num_retries=3)
        _, err = _call(lm, how)
        n = len(srv.requests)
    assert type(err).__name__ == "LMNotAnAPI", err
    assert n == 1  # a setup problem: the same page would come back
    message = str(err)
    assert srv.base_url in message and "text/html" in message and "not an OpenAI-compatible API" in message
    assert "api_base" in message and "--api-base" in message
    from agentic_iqa.lm import lm_setup_problem

    problem = lm_setup_problem(err)
    assert problem is not None and srv.base_url in problem and "--offline" in problem
    assert "Fix the key" not in problem  # the key is not the problem; its own advice stands


def test_a_broken_json_reply_is_still_a_bad_reply_not_a_setup_problem():
    # Labelled JSON: what may well be the API sent a broken body; that call fails as before.
    broken = Reply(raw_body=b'{"choices": [', content_type="application/json")
    with FakeOpenAIServer(lambda body: broken) as srv:
        _, err = call_bounded(lambda: lm_for(srv, num_retries=0)("hello"))
    assert err is not None and type(err).__name__ == "LMProviderError", err


def test_an_html_page_stops_the_assessment_once_with_one_line_and_exit_2(tmp_path, image):
    from typer.testing import CliRunner

    from agentic_iqa.cli import app

    with FakeOpenAIServer(lambda body: PORTAL) as srv:
        res = CliRunner().invoke(app, ["assess", str(image), "--lm", "openai/fake-vlm", "--api-base", srv.base_url,
                                       "--no-cache", "--config", str(tmp_path)], env={"COLUMNS": "400"})
        n = len(srv.requests)
    assert res.exit_code == 2, res.output
    assert n == 1  # the planner's call: no stage after it asked again
    assert "Traceback" not in res.output
    err = " ".join(res.stderr.split())
    assert err.startswith("error: the LM cannot be used") and srv.base_url in err and "Check api_base" in err


def test_an_html_page_stops_a_batch(tmp_path, image):
    from typer.testing import CliRunner

    from agentic_iqa.cli import app

    others = [write_test_image(tmp_path / f"p{k}.jpg", size=(64, 64), seed=k) for k in range(6)]
    with FakeOpenAIServer(lambda body: PORTAL) as srv:
        res = CliRunner().invoke(app, ["assess", *map(str, others), "--lm", "openai/fake-vlm", "--api-base", srv.base_url,
                                       "--no-cache", "--config", str(tmp_path), "--out", str(tmp_path / "r.jsonl"),
                                       "-j", "1", "--no-progress"], env={"COLUMNS": "400"})
        n = len(srv.requests)
    assert res.exit_code == 2, res.output
    assert n == 1  # the first item's first call; the other items were not started
    assert "Traceback" not in res.output and "not an OpenAI-compatible API" in res.output


# ── the same, on DSPy's LiteLLM route ────────────────────────────────────────────────────────────
# DSPy sends a call through LiteLLM when lm15 cannot: a provider lm15 does not know (litellm_proxy/,
# lm_studio/, ...), or an OPENAI_BASE_URL / OPENAI_API_BASE in the environment (kept for gateways).


def litellm_lm_for(url: str, monkeypatch, route: str = "env", **settings):
    if route == "env":  # openai/ as usual, but the environment names a gateway: LiteLLM sends it
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        return build_lm(RoleLM(model="openai/fake-vlm", api_base=url, **settings))
    monkeypatch.setenv("FAKE_LITELLM_KEY", "not-needed")
    return build_lm(RoleLM(model=f"{route}/fake-vlm", api_base=url, api_key_env="FAKE_LITELLM_KEY", **settings))


def test_the_litellm_routes_are_litellm(monkeypatch):
    # What the tests below rely on: DSPy's own (offline) choice of engine for these LMs.
    from dspy.clients.backend_selection import select_backend

    url = "http://127.0.0.1:9/v1"
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    assert select_backend(build_lm(RoleLM(model="openai/fake-vlm", api_base=url))).native
    assert not select_backend(litellm_lm_for(url, monkeypatch, "litellm_proxy")).native
    assert not select_backend(litellm_lm_for(url, monkeypatch, "env")).native


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("route", ["env", "litellm_proxy"])
def test_an_html_page_on_the_litellm_route_is_not_an_api_either(route, how, monkeypatch):
    # Before: LiteLLM called the page an "Empty or invalid response" (HTTP 500), a server error,
    # re-asked 3 times (4 requests, ~7 s of backoff), then taken for an outage.
    with FakeOpenAIServer(lambda body: PORTAL) as srv:
        lm = litellm_lm_for(srv.base_url, monkeypatch, route, num_retries=3)
        _, err = _call(lm, how)
        n = len(srv.requests)
    assert type(err).__name__ == "LMNotAnAPI", err
    assert n == 1
    message = str(err)
    assert srv.base_url in message and "(content type text/html; charset=utf-8)" in message
    assert "not an OpenAI-compatible API" in message and "--api-base" in message
    assert not lm_unreachable(err)


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_an_endless_reply_on_the_litellm_route_is_cut_off_while_it_is_read(framing, how, monkeypatch):
    # Before: LiteLLM's client read all 256 MiB the server offered (the process grew by ~500 MB), failed
    # on the missing rest as a connection error, and was re-asked 3 times. Now, as on lm15's route.
    with Flood(framing) as srv:
        lm = litellm_lm_for(srv.base_url, monkeypatch, num_retries=3, max_reply_bytes=64 * 1024)
        _, err = _call(lm, how)
    assert type(err).__name__ == "LMReplyTooLarge", err
    expected = {"chunked": "more than 4,718,592 bytes (read no further)",
                "length": "1,000,000,000,000 bytes (its Content-Length; not read)"}[framing]
    assert f"the reply is {expected}, over max_reply_bytes (65,536)" in str(err), err
    assert srv.requests == 1
    assert srv.hung_up and srv.sent < 64 * MiB, srv.sent
    assert not lm_unreachable(err)


def test_ordinary_replies_on_the_litellm_route_still_pass(monkeypatch):
    # Several event loops in turn (assess_async under asyncio.run, twice): LiteLLM keeps one async
    # client for all of them, and an httpx pool must not outlive its loop. A JSON body labelled
    # text/plain is read as JSON, as LiteLLM's client does: only a failed reply is called not an API.
    import asyncio

    plain = Reply(raw_body=json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "plain"}, "finish_reason": "stop"}]}).encode(),
        content_type="text/plain")
    replies = iter([Reply(content="one"), Reply(content="two"), Reply(content="three"), plain])
    with FakeOpenAIServer(lambda body: next(replies)) as srv:
        lm = litellm_lm_for(srv.base_url, monkeypatch, max_reply_bytes=1024)
        outs = [lm("hello"), asyncio.run(lm.acall("hello")), asyncio.run(lm.acall("hello")), lm("hello")]
    assert outs == [["one"], ["two"], ["three"], ["plain"]]
