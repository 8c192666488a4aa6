"""Canned VLMs for tests: real `dspy.LM` objects whose engine answers from a script.

Only the model's judgement is replaced. The request still goes through DSPy's real adapter
(JSONAdapter formatting and parsing), the LM's execution path, history and log-prob handling: the
engine receives the canonical `dspy.lm15.Request` DSPy builds from the adapter's messages, and its
reply is an OpenAI chat-completion body parsed by the same lm15 function the HTTP path uses.

    from tests.canned import CannedVLM, Reply, valid_reply

    vlm = CannedVLM({
        "plan": [valid_reply("plan")],                               # one reply for PlanSignature
        "detect": ["not json at all", valid_reply("detect")],        # bad first, then good
        "score": [Reply(valid_reply("score", level="B"),
                        level_logprobs={"A": -2.0, "B": -0.3, "C": -1.9})],
    }, logprobs=True)
    with dspy.context(lm=vlm.lm):
        ...
    vlm.count("detect") == 2; vlm.calls[-1].images[0].data == original_bytes

Routing: each request is matched to a route by the output fields DSPy lists in its system message
("Your output fields are: 1. `level` ..."). A route key is a signature class, a short name from
`signatures.signatures_by_name()` ("plan", "detect", "analyze", "select", "explain", "score"), or
the name of an output field. A route's value is one item or a sequence of items consumed in order:

    dict / pydantic model -> serialized as a JSON reply
    str                   -> the reply text verbatim (bad JSON, prose, "" for an empty reply)
    Reply(...)            -> a reply with scripted token log-probs, latency, or both
    Exception instance    -> raised by the engine (transport/provider failures)
    callable(call)        -> called with the CannedCall; returns any of the above

When a route's script runs out the engine fails loudly (AssertionError), unless repeat_last=True.
Log-probs are returned only when the LM asks for them (`CannedVLM(..., logprobs=True)`), as a real
provider would; the shape is OpenAI's (`choices[0].logprobs.content[i].top_logprobs`).

`dummy_lm(answers)` wraps DSPy's own DummyLM with JSON formatting, for the simplest cases;
`disable_dspy_cache()` makes a test session hermetic; `write_test_image()` makes small real images.
Import as `from canned import ...` (pytest puts tests/ on sys.path) or `from tests.canned import ...`.
"""
from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import pydantic  # noqa: E402

__all__ = [
    "Reply",
    "CannedCall",
    "CannedVLM",
    "ScriptExhausted",
    "dummy_lm",
    "disable_dspy_cache",
    "valid_reply",
    "VALID_REPLIES",
    "write_test_image",
    "json_tokens",
]

Token = tuple[str, float, list[tuple[str, float]]]  # (token, logprob, [(alternative, logprob), ...])


class ScriptExhausted(AssertionError):
    """A route was asked for more replies than scripted."""


@dataclass
class Reply:
    """One scripted reply.

    content: dict / pydantic model (sent as JSON) or str (sent verbatim).
    level_logprobs: {"A": logprob, ...} given as the top alternatives of the token holding the value
        of `field` ("level" by default); the chosen letter's own log-prob is taken from it too.
    tokens: explicit OpenAI-shaped tokens [(token, logprob, [(alt, logprob), ...]), ...], used as is
        (they need not spell `content`; the reader only sees tokens).
    delay: seconds to wait before answering (added to the VLM's latency).
    """

    content: Any
    level_logprobs: Optional[dict[str, float]] = None
    field: str = "level"
    tokens: Optional[list[Token]] = None
    delay: float = 0.0

    @property
    def text(self) -> str:
        return _as_text(self.content)


@dataclass
class CannedImage:
    media_type: str
    data: bytes


@dataclass
class CannedCall:
    """What one request looked like and what was answered."""

    route: Optional[str]  # the route key's name, None when the default answered
    output_fields: tuple[str, ...]
    system: str
    user_text: str  # the text parts of the last user message
    images: list[CannedImage]  # images of the last user message, bytes as they arrived
    request: Any  # the dspy.lm15.Request
    reply: str = ""

    @property
    def retried_with_feedback(self) -> bool:
        """True when StructuredPredict fed a previous error back (see agentic_iqa.agents.structured)."""
        return "your previous reply was rejected" in self.system


def _as_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, pydantic.BaseModel):
        content = content.model_dump(mode="json")
    return json.dumps(content, ensure_ascii=False)


_TOKEN_RE = re.compile(r"\w+|\s+|[^\w\s]")


def json_tokens(text: str, *, level_logprobs: Optional[dict[str, float]] = None, field: str = "level",
                top_n: int = 5) -> list[Token]:
    """Crude tokens for `text` (words, spaces, single punctuation), each certain (logprob 0), except the
    value of `"<field>": "<letter>"`, which gets `level_logprobs` as its ranked alternatives."""
    tokens = [(t, 0.0, [(t, 0.0)]) for t in _TOKEN_RE.findall(text)]
    if not level_logprobs:
        return tokens
    m = re.search(r'"%s"\s*:\s*"' % re.escape(field), text)
    if m is None:
        raise ValueError(f"reply has no {field!r} string value to attach log-probs to: {text[:200]}")
    pos, start = m.end(), 0
    for i, (tok, _, _) in enumerate(tokens):
        if start == pos:
            ranked = sorted(level_logprobs.items(), key=lambda kv: -kv[1])[:top_n]
            tokens[i] = (tok, level_logprobs.get(tok, -0.01), ranked)
            return tokens
        start += len(tok)
    raise ValueError(f"no token starts at the {field!r} value in {text[:200]}")


def _openai_body(text: str, tokens: Optional[list[Token]], model: str) -> dict:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
    if tokens is not None:
        choice["logprobs"] = {"content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()),
             "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode())} for a, alp in alts]}
            for t, lp, alts in tokens
        ]}
    completion = max(1, len(text) // 4)
    return {"id": "canned", "object": "chat.completion", "created": 0, "model": model, "choices": [choice],
            "usage": {"prompt_tokens": 1, "completion_tokens": completion, "total_tokens": 1 + completion}}


_OUTPUTS_RE = re.compile(r"Your output fields are:\n(.*?)(?:\n\n|\Z)", re.S)
_FIELD_RE = re.compile(r"^\d+\. `(\w+)`", re.M)


def _output_fields(system: str) -> tuple[str, ...]:
    m = _OUTPUTS_RE.search(system)
    return tuple(_FIELD_RE.findall(m.group(1))) if m else ()


def _text_of(parts: Any) -> str:
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    return "".join(getattr(p, "text", "") or "" for p in parts)


class _Route:
    def __init__(self, name: str, fields: Optional[tuple[str, ...]], field_name: Optional[str], items: list):
        self.name, self.fields, self.field_name, self.items = name, fields, field_name, items
        self.served = 0

    def matches(self, output_fields: tuple[str, ...]) -> bool:
        if self.fields is not None:
            return output_fields == self.fields
        return self.field_name in output_fields


class CannedVLM:
    """A scripted VLM reachable as `self.lm`, a genuine `dspy.LM` with a custom engine.

    Args:
        routes: {route key: item or sequence of items}; see the module docstring.
        default: the item (or callable) for requests no route matches; None -> AssertionError.
        logprobs: build the LM with logprobs=True, top_logprobs=top_logprobs (like a provider asked for them).
        latency: seconds every call waits (time.sleep, or asyncio.sleep on the async path).
        repeat_last: keep serving a route's last item instead of failing when its script runs out.
        num_retries: the LM's transport retries (0 by default so scripted errors surface at once).
    """

    def __init__(
        self,
        routes: Optional[Mapping[Any, Any]] = None,
        *,
        default: Any = None,
        logprobs: bool = False,
        top_logprobs: int = 5,
        latency: float = 0.0,
        repeat_last: bool = False,
        num_retries: int = 0,
        model: str = "canned/vlm",
    ) -> None:
        self._lock = threading.Lock()
        self._routes: list[_Route] = []
        self.default = default
        self.latency = latency
        self.repeat_last = repeat_last
        self.top_logprobs = top_logprobs
        self.calls: list[CannedCall] = []
        self.answer_seconds = 0.0  # time spent scripting replies (harness work, not the framework's)
        for key, items in (routes or {}).items():
            self.add(key, items)
        kwargs: dict[str, Any] = {"cache": False, "num_retries": num_retries}
        if logprobs:
            kwargs.update(logprobs=True, top_logprobs=top_logprobs)
        self.lm = dspy.LM(model, engine=_Engine(self), async_engine=_AsyncEngine(self), **kwargs)

    # ── scripting ───────────────────────────────────────────────────────────────────────────────

    def add(self, key: Any, items: Any) -> "CannedVLM":
        """Add (or extend) a route. `items` is one item or a list/tuple of items."""
        seq = list(items) if isinstance(items, (list, tuple)) else [items]
        name, fields, field_name = self._resolve(key)
        with self._lock:
            for route in self._routes:
                if route.name == name:
                    route.items.extend(seq)
                    return self
            self._routes.append(_Route(name, fields, field_name, seq))
        return self

    @staticmethod
    def _resolve(key: Any) -> tuple[str, Optional[tuple[str, ...]], Optional[str]]:
        from signatures import signatures_by_name

        by_name = signatures_by_name()
        if isinstance(key, type) and issubclass(key, dspy.Signature):
            short = next((n for n, s in by_name.items() if s is key), key.__name__)
            return short, tuple(key.output_fields), None
        if isinstance(key, str) and key in by_name:
            return key, tuple(by_name[key].output_fields), None
        if isinstance(key, str):
            return key, None, key
        raise TypeError(f"route key must be a Signature class, a signature name or an output field name, not {key!r}")

    # ── inspection ──────────────────────────────────────────────────────────────────────────────

    def count(self, route: Any = None) -> int:
        """Calls answered in total, or by one route (key as given to `add`)."""
        with self._lock:
            if route is None:
                return len(self.calls)
            name = self._resolve(route)[0]
            return sum(1 for c in self.calls if c.route == name)

    def calls_for(self, route: Any) -> list[CannedCall]:
        name = self._resolve(route)[0]
        with self._lock:
            return [c for c in self.calls if c.route == name]

    def remaining(self, route: Any) -> int:
        """Scripted items not yet served on a route."""
        name = self._resolve(route)[0]
        with self._lock:
            for r in self._routes:
                if r.name == name:
                    return len(r.items) - r.served
        return 0

    def context(self, **settings: Any):
        """`dspy.context(lm=self.lm, ...)`."""
        return dspy.context(lm=self.lm, **settings)

    # ── answering ───────────────────────────────────────────────────────────────────────────────

    def _answer(self, request: Any) -> tuple[Any, float]:
        """The lm15 Response for `request`, and the delay to apply before returning it."""
        from dspy._vendor.lm15.providers.openai_chat import response_from_openai_chat

        started = time.perf_counter()
        system = _text_of(request.system)
        last_user = next((m for m in reversed(request.messages) if m.role == "user"), None)
        parts = last_user.parts if last_user is not None else ()
        images = [CannedImage(p.media_type, p.bytes) for p in parts if getattr(p, "type", None) == "image"]
        output_fields = _output_fields(system)
        call = CannedCall(None, output_fields, system, _text_of(parts), images, request)
        with self._lock:
            route = next((r for r in self._routes if r.matches(output_fields)), None)
            if route is None:
                if self.default is None:
                    raise AssertionError(
                        f"CannedVLM: no route for a request with output fields {list(output_fields)}; "
                        f"routes: {[r.name for r in self._routes]}"
                    )
                item = self.default
            else:
                call.route = route.name
                if route.served >= len(route.items):
                    if not (self.repeat_last and route.items):
                        raise ScriptExhausted(
                            f"CannedVLM: route {route.name!r} exhausted after {route.served} replies"
                        )
                    item = route.items[-1]
                else:
                    item = route.items[route.served]
                route.served += 1
            self.calls.append(call)
        if callable(item) and not isinstance(item, (type, BaseException)):
            item = item(call)
        if isinstance(item, BaseException):
            raise item
        reply = item if isinstance(item, Reply) else Reply(item)
        text = reply.text
        call.reply = text
        tokens = None
        if request.config.logprobs is not None:  # only a request that asked gets log-probs
            if reply.tokens is not None:
                tokens = reply.tokens
            elif reply.level_logprobs is not None:
                tokens = json_tokens(text, level_logprobs=reply.level_logprobs, field=reply.field,
                                     top_n=self.top_logprobs)
        body = _openai_body(text, tokens, request.model)
        with self._lock:
            self.answer_seconds += time.perf_counter() - started
        response = response_from_openai_chat(body, model=request.model)  # DSPy's own parsing: not ours to time
        return response, self.latency + reply.delay


class _Engine:
    """dspy.LM engine protocol: complete(Request) -> Response."""

    def __init__(self, owner: CannedVLM) -> None:
        self.owner = owner

    def complete(self, request):
        response, delay = self.owner._answer(request)
        if delay:
            time.sleep(delay)
        return response

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


class _AsyncEngine:
    def __init__(self, owner: CannedVLM) -> None:
        self.owner = owner

    async def complete(self, request):
        response, delay = self.owner._answer(request)
        if delay:
            await asyncio.sleep(delay)
        return response

    async def stream(self, request):
        from dspy.lm15 import response_to_events

        for event in response_to_events(await self.complete(request)):
            yield event

    async def aclose(self) -> None:
        pass


def disable_dspy_cache() -> None:
    """No DSPy response cache, on disk or in memory: tests must not see each other's (or earlier runs')
    answers. DSPy builds its default disk cache lazily, so calling this before any LM call also keeps
    ~/.dspy_cache from being created."""
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


def dummy_lm(answers: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]]) -> dspy.BaseLM:
    """DSPy's DummyLM answering in JSON (for the JSONAdapter): a list is served in order; a dict maps a
    substring of the last message to its answer. Answers are {output field: value}."""
    from dspy.utils.dummies import DummyLM

    return DummyLM(list(answers) if not isinstance(answers, Mapping) else dict(answers), adapter=dspy.JSONAdapter())


# ── valid replies, one per signature ─────────────────────────────────────────────────────────────

VALID_REPLIES: dict[str, dict[str, Any]] = {
    "plan": {"planner_output": {
        "query_type": "IQA", "query_scope": ["Global"], "distortion_source": "Inferred", "distortions": None,
        "required_tool": None,
        "plan": {"distortion_detection": True, "distortion_analysis": True, "tool_selection": True,
                 "tool_execution": True},
    }},
    "detect": {"distortion_set": {"Global": ["Blurs", "Noise"]}},
    "analyze": {"distortion_analysis": {"Global": [
        {"type": "Blurs", "severity": "moderate", "explanation": "Edges are visibly soft."},
        {"type": "Noise", "severity": "slight", "explanation": "Fine grain in flat areas."},
    ]}},
    "select": {"selected_tools": {"Global": {"Blurs": "QAlign", "Noise": "NIQE"}}},
    "explain": {"final_answer": "B", "quality_reasoning": "The sky shows no blur; edges are crisp.",
                "need_replan": False, "replan_reason": None},
    "score": {"level": "C", "quality_reasoning": "Moderate blur and slight noise; tool scores around 3.",
              "need_replan": False, "replan_reason": None},
}


def valid_reply(name: str, **overrides: Any) -> dict[str, Any]:
    """A fresh copy of a valid reply for signature `name`. Keyword overrides replace top-level fields,
    except for "plan", where they replace fields of `planner_output` (e.g. query_type="Other")."""
    reply = copy.deepcopy(VALID_REPLIES[name])
    if name == "plan":
        reply["planner_output"].update(overrides)
    else:
        reply.update(overrides)
    return reply


def write_test_image(path: str | os.PathLike, size: tuple[int, int] = (64, 48), fmt: str = "JPEG",
                     seed: int = 0, **save: Any) -> Path:
    """A small textured image (gradient + noise, so encoders have real work) written to `path`."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / max(1, w - 1), yy * 255 / max(1, h - 1), (xx + yy) * 127 / max(1, w + h - 2)], -1)
    arr = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    path = Path(path)
    Image.fromarray(arr, "RGB").save(path, format=fmt, **save)
    return path

