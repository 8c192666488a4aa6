"""Build one DSPy LM per role from the configuration. Keys come only from the environment.

Every LM we build is a `BudgetedLM`: DSPy's own retry loop is turned off and ours runs instead, because
DSPy's has no overall bound (a reply slower than the timeout cost (num_retries+1) x timeout plus backoff,
and it sleeps whatever Retry-After the server sends). Ours keeps one wall-clock budget per call
(`call_budget`, every request and every wait included), caps Retry-After (`max_retry_after`), refuses a
reply over `max_reply_bytes` before anything parses it (and stops reading, and closes the connection of, a
reply whose HTTP body outgrows that: see `_CappedTransport`, and `_hook_litellm` for DSPy's LiteLLM
route), and counts every HTTP request it sends
(`metering()`), so the trace's `lm_calls`/`retries` include the retries made below the agents. A 200
reply that is not JSON at all (a captive portal's or a proxy's login page at the base URL) is
`LMNotAnAPI`: a setup problem, said once, never retried.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import re
import sys
import threading
import time
from typing import Any, Iterator, Optional

from agentic_iqa.config import ROLES, ConfigError, ModelBackends, RoleLM, checked_base_url
from agentic_iqa.redact import redact, register_secret

# LiteLLM otherwise tries to download a price list on first use (no network here, and none needed).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def build_lm(role: RoleLM, role_name: str = "lm"):
    """A `dspy.LM` for one role, or None when no model is configured for it."""
    if not role.model:
        return None
    import dspy

    kwargs: dict = dict(
        temperature=role.temperature,
        max_tokens=role.max_tokens,
        num_retries=role.num_retries,
        timeout=role.timeout,
        cache=False,  # responses (and the images in them) are not kept on disk
        call_budget=role.call_budget,
        max_retry_after=role.max_retry_after,
        max_reply_bytes=role.max_reply_bytes,
    )
    if role.api_base:
        kwargs["api_base"] = checked_base_url(role.api_base, f"{role_name}: api_base")
    if role.api_key_env:
        key = os.environ.get(role.api_key_env)
        if not key:
            raise ConfigError(
                f"{role_name}: api_key_env names ${role.api_key_env}, which is not set; export it first"
            )
        register_secret(key)  # masked in everything we print, log or save
        kwargs["api_key"] = key
    elif role.api_base and role.model.startswith("openai/") and not os.environ.get("OPENAI_API_KEY"):
        # Local OpenAI-compatible servers (vLLM, llama.cpp, ...) usually need no key, but the client wants one.
        kwargs["api_key"] = "not-needed"
    if role.logprobs:
        kwargs.update(logprobs=True, top_logprobs=5)
    try:
        return _budgeted_lm_class()(role.model, **kwargs)
    except ValueError as exc:
        what = str(exc) if role.model in str(exc) else f"model {role.model!r}: {exc}"  # DSPy's may name it already
        raise ConfigError(f"{role_name}: {what}; write the model as provider/model, e.g. openai/gpt-4o") from None


# ── one wall-clock budget per LM call ─────────────────────────────────────────────────────────────


class RequestMeter:
    """HTTP requests sent by BudgetedLM calls made inside one `metering()` block (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0

    def add(self, n: int = 1) -> None:
        with self._lock:
            self.requests += n


_meters: contextvars.ContextVar[tuple[RequestMeter, ...]] = contextvars.ContextVar("agentic_iqa_lm_meters", default=())


class _Attempt:
    """One request of a BudgetedLM call, as its HTTP client saw it, noted on both routes (lm15's by
    `_CountedReply`, LiteLLM's by `_hook_litellm`). The error the call then raises may not say what
    really happened: LiteLLM reports an error raised while its client reads as a connection error, and
    a page that is not JSON as an HTTP 500."""

    __slots__ = ("lm", "refused", "status", "content_type", "cut_by_budget")

    def __init__(self, lm: Any) -> None:
        self.lm, self.refused = lm, None
        self.cut_by_budget = False  # its read timeout was shortened to what the call budget had left
        self.status: Optional[int] = None
        self.content_type: Optional[str] = None

    def not_json(self) -> Optional[str]:
        """The content type of a 200 reply not said to be JSON ("unknown" without one), else None. A
        failed call with such a reply is `LMNotAnAPI` (a body labelled JSON but broken is a bad reply
        from what may well be the API, and stays one)."""
        if self.status != 200:
            return None
        kind = self.content_type or "unknown"
        return None if "json" in kind.lower() or "event-stream" in kind.lower() else kind


#: The request of a BudgetedLM call running in this context (None outside one): its own retries only,
#: and its reply cap.
_inside: contextvars.ContextVar[Optional[_Attempt]] = contextvars.ContextVar("agentic_iqa_lm_inside", default=None)


@contextlib.contextmanager
def metering() -> Iterator[RequestMeter]:
    """Count the HTTP requests BudgetedLM calls send inside this block (an enclosing block counts them too)."""
    meter = RequestMeter()
    token = _meters.set(_meters.get() + (meter,))
    try:
        yield meter
    finally:
        _meters.reset(token)


def _count_request() -> None:
    for meter in _meters.get():
        meter.add(1)


def _attempt_timeout(timeout: float, remaining: float) -> float:
    """The read timeout for the next request: the role's timeout, or less when the budget has less left.
    Rounded down to a power of two (>= 0.25 s) because DSPy keeps one connection pool per distinct
    timeout: a handful of pools per LM, never one per call."""
    if remaining >= timeout:
        return timeout
    return max(0.25, 2.0 ** math.floor(math.log2(max(remaining, 1e-3))))


def _reply_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        return str(output.get("text") or "")
    return ""


def _too_large(outputs: Any, limit: int) -> Optional[int]:
    """The byte size of the first output over `limit`, else None (cheap: bytes <= 4 x characters)."""
    for output in outputs if isinstance(outputs, list) else []:
        text = _reply_text(output)
        if len(text) * 4 > limit:
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > limit:
                return size
    return None


# ── the reply cap, kept while the body is read ──────────────────────────────────────────────────────


def _body_limit(max_reply_bytes: int) -> int:
    """The most HTTP body read for a reply whose text may have `max_reply_bytes`. The body is larger than
    the text: JSON may spell one byte of it in up to 6 (\\u0001), and log-probs add a few hundred bytes
    per token (the 4 MiB hold those of ~6,000 tokens at top_logprobs=5; max_tokens is 2048 by default).
    So a reply that the text cap (`_too_large`, exact, once parsed) lets through is read whole, and
    what is read stays bounded."""
    return 8 * max_reply_bytes + 4 * 1024 * 1024


class _BodyMeter:
    """Counts one reply's body against the calling BudgetedLM's `_body_limit`; raises its LMReplyTooLarge
    (noted on the attempt too, whatever the HTTP client makes of it)."""

    def __init__(self, attempt: _Attempt) -> None:
        self.attempt, self.limit, self.seen = attempt, _body_limit(attempt.lm.max_reply_bytes), 0

    def _refuse(self, size: str) -> Exception:
        self.attempt.refused = self.attempt.lm._too_large_error(size)
        return self.attempt.refused

    def check_announced(self, length_header: Optional[str]) -> None:
        try:
            length = int(length_header or 0)
        except ValueError:  # unreadable: the count below still holds
            return
        if length > self.limit:
            raise self._refuse(f"{length:,} bytes (its Content-Length; not read)")

    def count(self, chunk: bytes) -> bytes:
        self.seen += len(chunk)
        if self.seen > self.limit:
            raise self._refuse(f"more than {self.limit:,} bytes (read no further)")
        return chunk


class _CountedReply:
    """A reply of lm15's transport whose body is counted (`_BodyMeter`) as it is read; its status and
    content type are noted on the attempt."""

    def __init__(self, reply: Any, meter: _BodyMeter) -> None:
        self._reply, self._meter = reply, meter
        self.status, self.reason, self.headers, self.http_version = (
            reply.status, reply.reason, reply.headers, reply.http_version)
        meter.attempt.status, meter.attempt.content_type = reply.status, reply.header("content-type")

    def header(self, name: str) -> Optional[str]:
        return self._reply.header(name)


class _CappedReply(_CountedReply):
    """Sync. Leaving its `with` block (the count raised) closes it."""

    def __iter__(self) -> Iterator[bytes]:  # no iter_lines(): lm15 then splits lines from this
        for chunk in self._reply:
            yield self._meter.count(chunk)

    def read(self) -> bytes:
        return b"".join(self)

    def close(self) -> None:
        self._reply.close()  # a body not read to its end: lm15 closes the connection rather than reuse it
        # lm15's sync transport gives the connection's pool slot back only when the body's iterator ends,
        # which closing does not do: end it now (the socket closed, at once, in an error). Else an abandoned
        # body held the slot until collected, and one never started held it for good.
        with contextlib.suppress(Exception):
            for _ in self._reply:
                pass

    def __enter__(self) -> "_CappedReply":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _CappedAsyncReply(_CountedReply):
    """Async; closed (as above) by the `async with` of its `_CappedAsyncStream`."""

    async def __aiter__(self):  # no aiter_lines(): as above
        async for chunk in self._reply:
            yield self._meter.count(chunk)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self])


class _CappedAsyncStream:
    """`async with transport.stream(request) as reply`, for lm15's async transport, with the reply capped."""

    def __init__(self, stream: Any, meter: _BodyMeter) -> None:
        self._stream, self._meter = stream, meter

    async def __aenter__(self) -> _CappedAsyncReply:
        reply = await self._stream.__aenter__()
        try:
            self._meter.check_announced(reply.header("content-length"))
        except BaseException:
            await self._stream.__aexit__(None, None, None)  # closes the connection, its body unread
            raise
        return _CappedAsyncReply(reply, self._meter)

    async def __aexit__(self, *exc: Any) -> None:
        await self._stream.__aexit__(*exc)


class _CappedTransport:
    """The HTTP transport of DSPy's native engine (lm15's StdlibTransport or StdlibAsyncTransport), reading
    a reply only up to the calling BudgetedLM's `_body_limit`: a body announced larger (Content-Length) is
    refused before any of it is read, a longer one as soon as the limit is passed, either way as
    LMReplyTooLarge and with its connection closed. Before, the whole body (endless, from a broken or
    hostile server) was read into memory and only then measured. Outside a BudgetedLM call (DSPy's
    typed API) it is the transport as is."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:  # close/aclose, pool_stats, ...: the wrapped transport's
        return getattr(self._inner, name)

    def stream(self, request: Any) -> Any:
        attempt = _inside.get()
        if attempt is None:
            return self._inner.stream(request)
        meter = _BodyMeter(attempt)
        if hasattr(self._inner, "aclose"):  # async: stream() gives a context manager to enter
            return _CappedAsyncStream(self._inner.stream(request), meter)
        reply = _CappedReply(self._inner.stream(request), meter)
        try:
            meter.check_announced(reply.header("content-length"))
        except BaseException:
            reply.close()
            raise
        return reply


class _CappingEngines(dict):
    """A BudgetedLM's `_engine_store`: where DSPy (dspy/clients/execution.py, `_select_engine`) keeps the
    native engines it builds for the LM, one per event loop and timeout. DSPy has no option for the
    transport, so each new engine's router gets `_CappedTransport` here, before its first request (the
    router builds its transport on first use). These are DSPy/lm15 internals: if a DSPy upgrade moves
    them, nothing is wrapped and the cap applies after parsing only, and the tests of
    tests/test_hostile_lm.py that flood the client fail. LiteLLM, DSPy's fallback engine for what lm15
    cannot send, is capped by `_hook_litellm`."""

    def __setitem__(self, key: Any, engine: Any) -> None:
        router = getattr(engine, "router", None)
        if router is not None and getattr(router, "_transport", False) is None and router.config.transport is None:
            router._transport = _CappedTransport(router._shared_transport())
        super().__setitem__(key, engine)


_litellm_lock = threading.Lock()
_litellm_hooked = False


def _may_use_litellm(lm: Any, kwargs: dict) -> bool:
    """Whether DSPy sends this LM's calls through LiteLLM, by DSPy's own offline choice (model string,
    client settings, environment). False if that function moved: then LiteLLM is hooked once imported."""
    try:
        from dspy.clients.backend_selection import select_backend

        return not select_backend(lm, kwargs).native
    except Exception:  # noqa: BLE001 - a DSPy that chooses otherwise, or refuses the settings: not known here
        return False


def _hook_litellm() -> None:
    """Cap the replies LiteLLM's HTTP client reads for a BudgetedLM call as `_CappedTransport` does for
    lm15's, and note each reply's status and content type on the attempt (see `_Attempt`). LiteLLM's
    OpenAI-compatible providers (openai/ with an OPENAI_BASE_URL, litellm_proxy/, lm_studio/, ...) send
    through `litellm.client_session` / `litellm.aclient_session` when set: those get a response hook
    (httpx's public event hooks), made now if unset. Outside a BudgetedLM call the hooks do nothing.
    Providers LiteLLM sends through its other clients keep the cap after parsing only, and a gzip body is
    counted as it arrives, compressed. Once per process, before LiteLLM builds the client it caches (hooked
    later, a cached one keeps LiteLLM's own session)."""
    global _litellm_hooked
    with _litellm_lock:
        if _litellm_hooked:
            return
        import asyncio
        import weakref

        import httpx
        import litellm

        class CountedBody(httpx.SyncByteStream):
            def __init__(self, stream: Any, meter: _BodyMeter) -> None:
                self._stream, self._meter = stream, meter

            def __iter__(self) -> Iterator[bytes]:
                for chunk in self._stream:
                    yield self._meter.count(chunk)

            def close(self) -> None:  # httpx closes a reply whose read raised: its connection is dropped
                self._stream.close()

        class CountedAsyncBody(httpx.AsyncByteStream):
            def __init__(self, stream: Any, meter: _BodyMeter) -> None:
                self._stream, self._meter = stream, meter

            async def __aiter__(self):
                async for chunk in self._stream:
                    yield self._meter.count(chunk)

            async def aclose(self) -> None:
                await self._stream.aclose()

        def meter_for(response: Any) -> Optional[_BodyMeter]:
            attempt = _inside.get()
            if attempt is None or response.request.method != "POST":  # not a model call of ours
                return None
            attempt.status, attempt.content_type = response.status_code, response.headers.get("content-type")
            meter = _BodyMeter(attempt)
            meter.check_announced(response.headers.get("content-length"))  # raising, httpx closes the reply
            return meter

        def on_reply(response: Any) -> None:
            meter = meter_for(response)
            if meter is not None:
                response.stream = CountedBody(response.stream, meter)

        async def on_areply(response: Any) -> None:
            meter = meter_for(response)
            if meter is not None:
                response.stream = CountedAsyncBody(response.stream, meter)

        try:  # LiteLLM's own TLS settings (litellm.ssl_verify, SSL_VERIFY, SSL_CERT_FILE), as its clients get them
            from litellm.llms.custom_httpx.http_handler import get_ssl_configuration

            verify: Any = get_ssl_configuration()
        except Exception:  # noqa: BLE001 - moved in another LiteLLM: httpx's default (certifi)
            verify = True

        class PerLoopClient(httpx.AsyncClient):
            """LiteLLM uses its one `aclient_session` on every event loop, but an httpx pool holds
            connections of the loop that opened them (on the next loop: "Event loop is closed"). Sends
            through one client per running loop, dropped with its loop."""

            def __init__(self) -> None:
                super().__init__(follow_redirects=True, verify=verify)
                self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
                self._lock = threading.Lock()

            async def send(self, request: Any, **kwargs: Any) -> Any:
                loop = asyncio.get_running_loop()
                with self._lock:
                    client = self._clients.get(loop)
                    if client is None:
                        client = self._clients[loop] = httpx.AsyncClient(
                            follow_redirects=True, verify=verify, event_hooks={"response": [on_areply]})
                return await client.send(request, **kwargs)

        if litellm.client_session is None:
            litellm.client_session = httpx.Client(follow_redirects=True, verify=verify)  # as LiteLLM's own default
        litellm.client_session.event_hooks["response"].append(on_reply)
        if litellm.aclient_session is None:
            litellm.aclient_session = PerLoopClient()
        else:  # the caller's own: hooked as it is
            litellm.aclient_session.event_hooks["response"].append(on_areply)
        _litellm_hooked = True


class _Overran(Exception):
    """A request still running when the call's budget ran out (see `_within`)."""


def _within(seconds: float, fn, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a helper thread (the caller's context variables carried over), waited on
    for at most `seconds`; _Overran after that. The request's `timeout` bounds each wait for a byte, not
    the whole reply, so a server trickling its body a byte at a time would otherwise hold a synchronous
    call past its budget (the async path has asyncio.wait_for). The abandoned request ends with its
    connection; its reply, if any, is dropped."""
    box: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc
        finally:
            done.set()

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(run,), name="lm-request", daemon=True).start()
    if not done.wait(seconds):
        raise _Overran(f"no complete reply within {seconds:.3g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


#: The tail of DSPy's (vendored lm15's) read-timeout messages, which advise `Timeouts(read=...)`: an API
#: our users never see. `_in_our_terms` names the settings they can raise instead.
_LM15_TIMEOUT_ADVICE = "; this is lm15's read timeout"


def _is_read_timeout(exc: BaseException) -> bool:
    """DSPy's read timeout (no bytes from the server within the request's timeout), which carries lm15's advice."""
    message = getattr(exc, "message", None)
    return isinstance(message, str) and _LM15_TIMEOUT_ADVICE in message


def _in_our_terms(exc: BaseException) -> BaseException:
    """`exc`, or for a read timeout a copy of it (same type and metadata) whose advice names our settings."""
    if not _is_read_timeout(exc):
        return exc
    message = exc.message  # type: ignore[attr-defined]
    head = message.split(_LM15_TIMEOUT_ADVICE)[0]
    try:
        return type(exc)(
            f"{head} (the per-request timeout); raise timeout, and call_budget if needed, in "
            "configs/model_backends.yaml if the model is just slow",
            **{k: getattr(exc, k, None) for k in ("code", "model", "provider", "provider_code", "status",
                                                  "request_id", "retry_after")},
        )
    except TypeError:  # an error type with another constructor: keep it as it is
        return exc


def __getattr__(name: str):
    # BudgetedLM subclasses dspy.LM, which is slow to import: made on first use (also by pickle).
    if name in ("BudgetedLM", "LMBudgetExceeded", "LMReplyTooLarge", "LMNotAnAPI"):
        _budgeted_lm_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _budgeted_lm_class() -> type:
    import dspy
    from dspy.lm15 import Request
    from dspy.utils.exceptions import LMConfigurationError, LMError, LMTimeoutError, is_retryable_lm_error

    class LMReplyTooLarge(LMError):
        """The reply exceeded max_reply_bytes: refused before parsing, not retried."""

        default_code = "reply_too_large"

    class LMNotAnAPI(LMConfigurationError):
        """The server at the base URL answered 200 with something that is not JSON: not an
        OpenAI-compatible API (a setup problem: every later call would get the same page)."""

        default_code = "not_an_api"

    class LMBudgetExceeded(LMTimeoutError):
        """The call's wall-clock budget ran out (a timeout for every purpose: the offline analyst answers)."""

        default_code = "budget_exceeded"

    class BudgetedLM(dspy.LM):
        """`dspy.LM` whose calls keep one wall-clock budget, retries and Retry-After waits included.

        `num_retries` is ours: DSPy's own loop sees 0 (while one of our calls runs) and never retries.
        Code that does its own retries around the LM (agentic_iqa.distributed) reads `num_retries` and
        sets it to 0; then each of its attempts is one request with the whole budget."""

        def __init__(self, model: str, *, num_retries: int = 3, call_budget: float = 300.0,
                     max_retry_after: float = 30.0, max_reply_bytes: int = 4 * 1024 * 1024, **kwargs: Any):
            self._retries = num_retries
            super().__init__(model, num_retries=num_retries, **kwargs)
            self.call_budget = float(call_budget)
            self.max_retry_after = float(max_retry_after)
            self.max_reply_bytes = int(max_reply_bytes)

        @property
        def num_retries(self) -> int:  # type: ignore[override]
            return 0 if _inside.get() is not None else self._retries

        @num_retries.setter
        def num_retries(self, value: int) -> None:
            self._retries = value

        # One request per attempt: `inner(timeout)` sends it; the loop decides whether and when to resend.
        def _plan_wait(self, exc: BaseException, attempt: int, deadline: float, seen: _Attempt) -> float:
            """Seconds to wait before the next attempt, or raise: not retryable, no attempts left, or
            the wait (Retry-After capped at max_retry_after, else backoff) would outlast the budget.
            `seen`: what the HTTP client saw, which LiteLLM's error may not say."""
            if seen.refused is not None:  # LiteLLM's account of it (a connection error) would mislead
                raise seen.refused from None
            kind = seen.not_json()  # whatever the error says (lm15: a provider error; LiteLLM: an HTTP 500)
            if kind is not None:
                raise self._not_an_api(kind) from None
            if attempt >= self._retries or not is_retryable_lm_error(exc):
                if seen.cut_by_budget and _is_read_timeout(exc):
                    # A read timeout shortened to the budget's remainder: the budget ran out, not the per-request
                    # timeout ("no bytes for 16s (the per-request timeout)" after 299 s with timeout 120).
                    raise self._exhausted(attempt + 1, "the budget ran out during a request") from exc
                ours = _in_our_terms(exc)
                if ours is exc:
                    raise exc
                raise ours from exc
            hint = getattr(exc, "retry_after", None)
            if isinstance(hint, (int, float)) and not isinstance(hint, bool) and math.isfinite(hint) and hint >= 0:
                wait = min(float(hint), self.max_retry_after)
            else:
                wait = float(min(2 ** min(attempt, 6), 60))
            remaining = deadline - time.monotonic()
            if wait >= remaining:
                asked = f"; the server asked to wait {hint:g} s" if isinstance(hint, (int, float)) and not isinstance(hint, bool) else ""
                raise self._exhausted(attempt + 1, f"{type(exc).__name__}{asked}") from exc
            return wait

        def _not_an_api(self, kind: str) -> Exception:
            base = self.kwargs.get("api_base")
            where = f"the server at {redact(base)}" if base else f"the server of {self.model}"
            return LMNotAnAPI(
                f"{where} answered HTTP 200 with a page that is not JSON (content type {kind}), so it is not an "
                "OpenAI-compatible API: a captive portal or proxy login page, or a web page instead of the model "
                "server. Check api_base (--api-base, AGENTIC_IQA_API_BASE or configs/model_backends.yaml): it "
                "should be the model server's API address, usually ending in /v1",
                model=self.model,
            )

        def _exhausted(self, attempts: int, last: str) -> Exception:
            return LMBudgetExceeded(
                f"no reply within the call budget of {self.call_budget:g} s ({attempts} request(s); last: {last}); "
                "raise call_budget or timeout in configs/model_backends.yaml if the model is just slow",
                model=self.model,
            )

        @property
        def _engine_store(self) -> dict:
            return self.__dict__["_engine_store"]

        @_engine_store.setter
        def _engine_store(self, engines: dict) -> None:  # set by dspy.LM (on init and unpickling)
            self.__dict__["_engine_store"] = _CappingEngines(engines)

        def _too_large_error(self, size: str) -> Exception:
            return LMReplyTooLarge(
                f"the reply is {size}, over max_reply_bytes ({self.max_reply_bytes:,}); refused unparsed "
                "(raise max_reply_bytes in configs/model_backends.yaml if a model really answers at that length)",
                model=self.model,
            )

        def _checked(self, outputs: Any) -> Any:
            size = _too_large(outputs, self.max_reply_bytes)
            if size is not None:
                raise self._too_large_error(f"{size:,} bytes")
            return outputs

        def _hook_litellm_if_used(self, kwargs: dict) -> None:
            """`_hook_litellm` before this LM's first call through LiteLLM (asked once per LM; after that,
            LiteLLM imported by anything is hooked), so that its cached client is a hooked one."""
            if _litellm_hooked:
                return
            settings = (self.model, self.model_type, tuple(sorted(self.kwargs)))  # a copy may change them
            if "litellm" in sys.modules or (self.__dict__.get("_native_for") != settings and _may_use_litellm(self, kwargs)):
                _hook_litellm()
            else:
                self.__dict__["_native_for"] = settings

        def _timeout_for(self, kwargs: dict, deadline: float) -> float:
            base = kwargs.get("timeout", self.kwargs.get("timeout"))
            base = float(base) if isinstance(base, (int, float)) and not isinstance(base, bool) else 600.0
            timeout = _attempt_timeout(base, deadline - time.monotonic())
            seen = _inside.get()
            if seen is not None:
                seen.cut_by_budget = timeout < base
            return timeout

        def __call__(self, prompt=None, *, messages=None, **kwargs):
            if kwargs.get("request") is not None or isinstance(prompt, Request):
                return super().__call__(prompt, messages=messages, **kwargs)  # the typed API: as DSPy does it
            self._hook_litellm_if_used(kwargs)
            deadline = time.monotonic() + self.call_budget
            send = super().__call__
            for attempt in range(self._retries + 1):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._exhausted(attempt, "the budget ran out between requests")
                seen = _Attempt(self)
                token = _inside.set(seen)
                try:
                    _count_request()
                    outputs = _within(remaining, send, prompt, messages=messages,
                                      **{**kwargs, "timeout": self._timeout_for(kwargs, deadline)})
                except _Overran as exc:
                    raise self._exhausted(attempt + 1, "the budget ran out during a request") from exc
                except Exception as exc:  # noqa: BLE001 - classified by _plan_wait
                    wait = self._plan_wait(exc, attempt, deadline, seen)
                else:
                    return self._checked(outputs)
                finally:
                    _inside.reset(token)
                time.sleep(wait)
            raise AssertionError("unreachable")  # the last attempt returns or raises

        async def acall(self, prompt=None, *, messages=None, **kwargs):
            import asyncio

            if kwargs.get("request") is not None or isinstance(prompt, Request):
                return await super().acall(prompt, messages=messages, **kwargs)
            self._hook_litellm_if_used(kwargs)
            deadline = time.monotonic() + self.call_budget
            for attempt in range(self._retries + 1):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._exhausted(attempt, "the budget ran out between requests")
                seen = _Attempt(self)
                token = _inside.set(seen)
                try:
                    _count_request()
                    outputs = await asyncio.wait_for(
                        super().acall(prompt, messages=messages, **{**kwargs, "timeout": self._timeout_for(kwargs, deadline)}),
                        remaining,
                    )
                except asyncio.TimeoutError as exc:
                    raise self._exhausted(attempt + 1, "the budget ran out during a request") from exc
                except Exception as exc:  # noqa: BLE001
                    wait = self._plan_wait(exc, attempt, deadline, seen)
                else:
                    return self._checked(outputs)
                finally:
                    _inside.reset(token)
                await asyncio.sleep(wait)
            raise AssertionError("unreachable")

    for cls in (BudgetedLM, LMReplyTooLarge, LMBudgetExceeded, LMNotAnAPI):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__  # found by pickle through the module's __getattr__
    globals().update(BudgetedLM=BudgetedLM, LMReplyTooLarge=LMReplyTooLarge, LMBudgetExceeded=LMBudgetExceeded,
                     LMNotAnAPI=LMNotAnAPI)
    return BudgetedLM


def build_role_lms(backends: ModelBackends, make=build_lm) -> dict:
    """{role: dspy.LM | None}. Roles sharing identical settings share one LM instance (one client).
    `make(role_settings, role_name)` builds one LM (the CLI passes one that knows `--lm demo`)."""
    built: dict[str, object] = {}
    by_settings: dict[str, object] = {}
    for name in ROLES:
        role = backends.role(name)
        key = role.model_dump_json()
        if key not in by_settings:
            by_settings[key] = make(role, name)
        built[name] = by_settings[key]
    return built


def _setup_types() -> tuple[type[BaseException], ...]:
    """DSPy's types for "the LM is set up wrong" (and LiteLLM's, when its route is in use)."""
    import sys

    from dspy.utils.exceptions import LMAuthError, LMBillingError, LMConfigurationError, LMUnsupportedModelError

    types: tuple[type[BaseException], ...] = (LMConfigurationError, LMAuthError, LMBillingError, LMUnsupportedModelError)
    litellm = sys.modules.get("litellm")
    if litellm is not None and isinstance(getattr(litellm, "AuthenticationError", None), type):
        types += (litellm.AuthenticationError,)
    return types


def lm_setup_problem(exc: BaseException, otherwise: str = "run without a model (--offline)") -> Optional[str]:
    """A one-line account when `exc` says the LM is configured wrong (no key, key refused, billing,
    unknown model), else None; `otherwise` is the way forward without a model. Such an assessment
    stops with that message instead of degrading."""
    from dspy.utils.exceptions import LMInvalidRequestError

    first = redact((str(exc).strip().splitlines() or [type(exc).__name__])[0])
    status = getattr(exc, "status", None)
    invalid_request = isinstance(exc, LMInvalidRequestError)
    if invalid_request and "Provider NOT provided" in first:
        # A model string DSPy/LiteLLM cannot route, e.g. "gpt4o" or "foo/bar" (written as provider/model, but
        # with a provider nobody knows: "write it as provider/model" alone misled).
        tag = re.match(r"\[([^\]/]+)/", first)  # "[foo/bar] …": the provider it was given
        provider = tag.group(1) if tag else None
        first = first.split(" Pass in")[0].rstrip(".") + (f"; {provider!r} is not a provider LiteLLM knows" if provider
                                                          else "") + \
            "; write the model as provider/model (openai/gpt-4o, anthropic/..., gemini/..., ollama_chat/..., or " \
            "openai/NAME with --api-base for an OpenAI-compatible server)"
        if provider and provider != provider.lower():
            first += f"; provider names are lower case ({provider.lower()}/..., not {provider}/...)"
    elif invalid_request and status == 404:
        first += " (HTTP 404: no such endpoint or model; OpenAI-compatible servers usually want --api-base ending in /v1)"
    elif invalid_request and status == 400 and re.search(r"image", first, re.I):
        first += " (the model does not take images: agentic-iqa needs a vision-language model)"
    elif not isinstance(exc, _setup_types()):
        return None
    elif isinstance(exc, globals().get("LMNotAnAPI", ())):  # its message says what to fix
        return f"the LM cannot be used: {first}; or {otherwise}"
    missing = re.search(r"Missing (\w+) API Key\b.*?`([A-Z][A-Z0-9_]*_API_KEY)`", first)
    if missing:  # LiteLLM's paragraph about it (federation rules, params), said as DSPy's own providers say it
        first = f"{first.split('] ')[0]}] no API key found for {missing.group(1)}. Set {missing.group(2)} in the environment"
    first = first.split(', or pass api_key=')[0].rstrip(".")  # keys come from the environment only
    return f"the LM cannot be used: {first}. Fix the key or the model (--lm, configs/model_backends.yaml), or {otherwise}"


def _unavailable_types() -> tuple[type[BaseException], ...]:
    """Exception types meaning the LM *service* failed (as opposed to its output): DSPy's typed LM errors
    for transport failures, timeouts, rate limits and server errors that outlived the LM's own retries,
    LiteLLM's equivalents when its route is in use, and Python's own connection/timeout errors."""
    import sys

    from dspy.utils.exceptions import LMRateLimitError, LMServerError, LMTimeoutError, LMTransportError

    types: tuple[type[BaseException], ...] = (
        LMTransportError, LMTimeoutError, LMRateLimitError, LMServerError, ConnectionError, TimeoutError,
    )
    litellm = sys.modules.get("litellm")  # only when something already imported it (importing is slow)
    if litellm is not None:
        types += tuple(getattr(litellm, name) for name in (
            "APIConnectionError", "Timeout", "RateLimitError", "ServiceUnavailableError", "InternalServerError",
        ) if isinstance(getattr(litellm, name, None), type))
    return types


def lm_unreachable(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) says the LM service is unreachable or unavailable: the rest of
    the assessment would only wait through the same retries again, so the offline analyst takes over.
    Bad output is not this: our ValueErrors quoting the model's reply never count, whatever they say."""
    types = _unavailable_types()
    seen = 0
    while exc is not None and seen < 8:  # the chain is short; bounded against cycles
        if isinstance(exc, types):
            return True
        exc, seen = exc.__cause__, seen + 1
    return False
