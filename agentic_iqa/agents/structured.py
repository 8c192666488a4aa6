"""Structured prediction with retry-and-feedback (spec 000: "retry up to 3 times with stricter prompt").

DSPy's JSONAdapter parses the reply into the signature's Pydantic types and raises AdapterParseError
when the reply is not JSON, lacks a field, or violates a type; it does not retry. `StructuredPredict`
does: it feeds the error back to the model together with a stricter instruction and tries again, up to
`max_retries` more times, then gives up and returns no prediction (callers set the field to null and
log, as the spec says). An optional `validate` callback adds checks the types cannot express (unknown
tool names, an analysis that does not match the distortion set).

How the feedback travels: the retry uses the same Predict (so compiled demos and instructions are kept)
with a signature whose instructions gain the error and "Return ONLY valid JSON ..." (Predict accepts a
per-call `signature=`). The fields stay the same, so demos remain complete examples and the reply is
parsed exactly as before.

The adapter is set per call with `dspy.context(adapter=...)`, never with the process-global
`dspy.configure`. Works sync (`module(**inputs)`) and async (`await module.acall(**inputs)`).
"""
from __future__ import annotations

import copy
import functools
import logging
import re
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Optional

import dspy
import pydantic
from dspy.adapters.base import Adapter
from dspy.utils.exceptions import AdapterParseError

from agentic_iqa.redact import redact

__all__ = ["StructuredPredict", "StructuredResult", "StructuredJSONAdapter", "STRICT_INSTRUCTION", "describe_error",
           "short_reason"]

logger = logging.getLogger("agentic_iqa.agents.structured")

STRICT_INSTRUCTION = (
    "Return ONLY valid JSON matching the schema: one JSON object with exactly the fields {fields}, in that "
    "order, each value of the type and allowed values stated above. No prose, no Markdown code fences."
)
_MAX_ECHO = 600  # characters of the rejected reply quoted back to the model

#: validate(prediction, facts): raise ValueError to reject, return a replacement or None to accept.
Validator = Callable[[dspy.Prediction, Any], Optional[dspy.Prediction]]


@dataclass
class StructuredResult:
    """What one StructuredPredict call produced."""

    prediction: Optional[dspy.Prediction]  # None when every attempt failed
    attempts: int  # LM calls made (1 + retries)
    errors: list[str] = field(default_factory=list)  # one per failed attempt, in order
    signature_name: str = ""

    @property
    def ok(self) -> bool:
        return self.prediction is not None

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)

    @property
    def lm_calls(self) -> int:
        return self.attempts

    def rejection(self) -> str:
        """One line for people: "model reply rejected 4× (invalid JSON)", the distinct reasons in order."""
        reasons = list(dict.fromkeys(short_reason(e) for e in self.errors)) or ["no reply"]
        return f"model reply rejected {self.attempts}× ({'; '.join(reasons)})"


def short_reason(error: str) -> str:
    """What a `describe_error` message says, in a few words (the message quotes the whole reply)."""
    text = error.split(". Your reply was:")[0].strip()
    if "cannot be serialized to a JSON object" in text or text.startswith("the reply is not a JSON object"):
        return "invalid JSON"
    m = re.match(r"the JSON object lacks the fields (\[.*?\])", text)
    if m:
        return f"missing fields {m.group(1)}"
    field = re.match(r"Failed to parse field (\w+)", text)
    lines = text.splitlines()
    header = next((i for i, ln in enumerate(lines) if re.search(r"\d+ validation errors? for \w+", ln)), None)
    if header is not None and header + 1 < len(lines):
        # Pydantic: an optional location line, then the indented message with a "[type=...]" tail.
        after = lines[header + 1:]
        loc = after[0].strip() if not after[0].startswith(" ") else None
        msg = next((ln for ln in after if ln.startswith(" ")), after[0]).strip()
        msg = re.split(r" \[type=", re.sub(r"^Value error, ", "", msg))[0]
        where = field.group(1) if field else loc
        text = f"{where}: {msg}" if where else msg
    text = text.splitlines()[0].split(";")[0].strip() if text else "rejected"
    return text if len(text) <= 90 else text[:89] + "…"


def _has_open_mapping(schema: Any) -> bool:
    """True if a JSON schema contains an object with free-form keys (a dict field)."""
    if isinstance(schema, dict):
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) or extra is True:
            return True
        if schema.get("type") == "object" and "properties" not in schema:
            return True
        return any(_has_open_mapping(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_open_mapping(v) for v in schema)
    return False


# What we derive from a signature (system message, response format, ...), per signature class. DSPy
# signatures are replaced rather than mutated (optimizers make new classes), so weak keys on the class
# suffice; the stored fingerprint also catches in-place edits of instructions or field descriptions.
# Weak keys: the retry signatures made per failed attempt are dropped with their class.
_derived: "weakref.WeakKeyDictionary[type, tuple[Any, dict]]" = weakref.WeakKeyDictionary()


def _fingerprint(signature: type[dspy.Signature]) -> tuple:
    return signature.instructions, tuple(
        (name, info.annotation, repr(info.json_schema_extra)) for name, info in signature.fields.items()
    )


def _derived_from(signature: type[dspy.Signature]) -> dict:
    """The memo of values derived from `signature` (emptied when the signature was edited in place)."""
    fingerprint = _fingerprint(signature)
    hit = _derived.get(signature)
    if hit is None or hit[0] != fingerprint:
        hit = (fingerprint, {})
        _derived[signature] = hit  # a concurrent first call may compute the same values twice: harmless
    return hit[1]


def _signature_has_open_mapping(signature: type[dspy.Signature]) -> bool:
    for info in signature.output_fields.values():
        try:
            schema = pydantic.TypeAdapter(info.annotation).json_schema()
        except Exception:
            continue
        if _has_open_mapping(schema):
            return True
    return False


@functools.lru_cache(maxsize=8)
def _stand_in(index: int) -> dspy.Image:
    """A one-pixel PNG used in place of image input number `index` while DSPy formats the prompt."""
    import base64
    import io

    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    label = PngInfo()
    label.add_text("agentic-iqa", f"prompt-formatting stand-in {index}")  # no real image has these bytes
    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, format="PNG", pnginfo=label)
    return dspy.Image("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())


class StructuredJSONAdapter(dspy.JSONAdapter):
    """DSPy's JSONAdapter, with plain JSON mode for free-form keys and without per-call rework.

    - Our outputs are keyed by object names and distortion types ({"sky": ["Blurs"]}). DSPy 3.4 turns
      nested dicts into strict Structured Outputs schemas with `additionalProperties: false` and no
      properties, which only admits `{}` (or is refused by the provider). For such signatures we request
      `{"type": "json_object"}`; signatures without dicts keep DSPy's structured schema.
    - What depends only on the signature (system message, response format) is built once per
      signature class instead of on every call, and images skip DSPy's text round trip (`format`).
      The messages and formats are DSPy's own: tests compare them with a stock JSONAdapter.

    DSPy internals used, and the upstream reports that make them necessary (drop each override when
    its report is fixed in the pinned DSPy; tests/test_structured.py compares against stock DSPy):
    - `_prepare_response_format` (private): nested open mappings are closed into `{}`-only schemas,
      https://github.com/stanfordnlp/dspy/pull/10009 (open).
    - `Adapter.format` called directly, with stand-in images: formatting a call with a `dspy.Image`
      re-parses the image's base64 text, https://github.com/stanfordnlp/dspy/issues/8570 (open).
    """

    def format_system_message(self, signature: type[dspy.Signature]) -> str:
        # Field descriptions, JSON schemas and instructions: DSPy rebuilds them on every call, which
        # was most of our per-call overhead.
        key = ("system message", type(self), self.use_native_function_calling)
        memo = _derived_from(signature)
        if key not in memo:
            memo[key] = super().format_system_message(signature)
        return memo[key]

    def format(self, signature: type[dspy.Signature], demos: list[dict[str, Any]], inputs: dict[str, Any]) -> list[dict[str, Any]]:
        """DSPy's messages, built without scanning the image's base64 text.

        DSPy writes an image into the prompt text between markers and then finds it again with a regex
        over the whole text (about 1 ms per 100 KB of base64, on every call). We format with a tiny
        stand-in image per image input and put the real image's content block in its place: the
        messages are the same (tests compare them with DSPy's own JSONAdapter)."""
        # Adapter.format itself, not super().format: DSPy wraps every subclass's `format` with its
        # callbacks, which would otherwise report the stand-in as the prompt (ours reports the real one).
        build = functools.partial(Adapter.format, self, signature, demos)
        stand_ins = {
            name: _stand_in(i) for i, (name, value) in enumerate(inputs.items()) if isinstance(value, dspy.Image)
        }
        if not stand_ins:
            return build(inputs)
        messages = build({**inputs, **stand_ins})
        real = {stand_ins[name].url: inputs[name].format() for name in stand_ins}
        found = 0
        for message in messages:
            content = message.get("content")
            if message.get("role") != "user" or not isinstance(content, list):
                continue
            blocks = []
            for block in content:
                url = (block.get("image_url") or {}).get("url") if isinstance(block, dict) else None
                if url in real:
                    # Fresh dicts (DSPy's are memoized per image): editing one call's messages must not
                    # change the next call's.
                    blocks.extend(copy.deepcopy(real[url]))
                    found += 1
                else:
                    blocks.append(block)
            message["content"] = blocks
        if found != len(stand_ins):  # DSPy placed images differently: let it do the whole job
            return build(inputs)
        return messages

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        # DSPy builds a Pydantic model of the outputs on every call (~1–2 ms); the choice depends only on
        # the signature and two facts about the LM, so it is made once per combination.
        facts = ("response format", type(self), self.use_native_function_calling,
                 "response_format" in lm.supported_params, bool(lm.supports_response_schema))
        choices = _derived_from(signature)
        if facts not in choices:
            probe: dict[str, Any] = {}
            super()._prepare_response_format(lm, probe, signature)
            fmt = probe.get("response_format")
            if fmt is not None and not isinstance(fmt, dict) and _signature_has_open_mapping(signature):
                fmt = {"type": "json_object"}
            choices[facts] = fmt
        fmt = choices[facts]
        if fmt is not None:
            lm_kwargs["response_format"] = dict(fmt) if isinstance(fmt, dict) else fmt


def _clean(text: str) -> str:
    # Pydantic's "For further information visit https://errors.pydantic.dev/..." lines help humans, not the VLM.
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("For further information")]
    return "\n".join(lines).strip()


def _excerpt(text: Any) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + f"… [{len(text) - _MAX_ECHO} more characters]"


def describe_error(exc: BaseException) -> str:
    """A short, model-readable account of why a reply was rejected (secrets masked: it is logged, saved
    and sent back to the model)."""
    return redact(_describe_error(exc))


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, AdapterParseError):
        marker = f"Adapter {exc.adapter_name} failed to parse"
        reason = _clean(str(exc.message).split(marker)[0])
        if not reason:
            expected = list(exc.signature.output_fields)
            if isinstance(exc.parsed_result, dict):
                missing = [f for f in expected if f not in exc.parsed_result]
                reason = f"the JSON object lacks the fields {missing} (expected exactly {expected})"
            else:
                reason = f"the reply is not a JSON object with the fields {expected}"
        return f"{reason.rstrip('.')}. Your reply was: {_excerpt(exc.lm_response)}"
    return _clean(str(exc)) or type(exc).__name__


class StructuredPredict(dspy.Module):
    """`dspy.Predict(signature)` through the JSON adapter, retried with the error fed back.

    Args:
        signature: the DSPy signature (its output fields should be Pydantic models or Literals).
        max_retries: retries after the first attempt (spec 000: 3), so at most 1 + max_retries LM calls.
        validate: optional extra check, called with each parsed prediction and the call's `facts`
            (explicit per-call inputs such as the known tool names); raise ValueError (a Pydantic
            ValidationError is one) to reject it with that message, or return a replacement prediction
            (e.g. with tool names normalized), or None to accept it as is.
        adapter: the adapter to use (default StructuredJSONAdapter()).

    Calling it returns a StructuredResult. Only the model's mistakes are retried: AdapterParseError from
    the adapter and ValueError from `validate`. Everything else (network, authentication, rate limits
    after the LM's own retries, a missing LM, bad inputs) propagates unchanged.
    """

    def __init__(
        self,
        signature: type[dspy.Signature],
        max_retries: int = 3,
        validate: Optional[Validator] = None,
        adapter: Optional[dspy.Adapter] = None,
    ) -> None:
        super().__init__()
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.predict = dspy.Predict(signature)
        self.max_retries = max_retries
        self.validate = validate
        self.adapter = adapter or StructuredJSONAdapter()

    @property
    def signature(self) -> type[dspy.Signature]:
        return self.predict.signature

    def _retry_signature(self, errors: list[str], base: type[dspy.Signature]) -> type[dspy.Signature]:
        fields = ", ".join(f"`{name}`" for name in base.output_fields)
        feedback = (
            f"{base.instructions}\n\n"
            f"IMPORTANT: your previous reply was rejected: {errors[-1]}\n"
            f"{STRICT_INSTRUCTION.format(fields=fields)}"
        )
        return base.with_instructions(feedback)

    def _check(self, prediction: dspy.Prediction, facts: Any) -> dspy.Prediction:
        if self.validate is None:
            return prediction
        replacement = self.validate(prediction, facts)
        return prediction if replacement is None else replacement

    def _failed(self, attempt: int, exc: BaseException, errors: list[str]) -> None:
        message = describe_error(exc)
        errors.append(message)
        logger.warning(
            "%s: attempt %d/%d rejected: %s",
            self.predict.signature.__name__, attempt, self.max_retries + 1, message.splitlines()[0][:300],
        )

    def _give_up(self, attempts: int, errors: list[str]) -> StructuredResult:
        name = self.predict.signature.__name__
        logger.error("%s: no valid output after %d attempts; last error: %s", name, attempts, errors[-1][:500])
        return StructuredResult(None, attempts, errors, name)

    def _attempts(self, inputs: dict[str, Any], facts: Any,
                  signature: Optional[type[dspy.Signature]] = None) -> Generator[dict, dspy.Prediction, StructuredResult]:
        """The one retry loop, shared by `forward` and `aforward`: yields each call's arguments and is
        sent the prediction (or thrown the adapter's parse error); returns the StructuredResult.
        `signature`: this call's form of the module's signature (e.g. `with_reference`); retries build on it."""
        errors: list[str] = []
        base = signature or self.predict.signature  # read per call: an optimizer may have replaced it
        for attempt in range(1, self.max_retries + 2):
            call = dict(inputs)
            if errors:
                call["signature"] = self._retry_signature(errors, base)
            elif signature is not None:
                call["signature"] = signature
            try:
                prediction = yield call
            except AdapterParseError as exc:  # not JSON, a missing field, or a type/validator violation
                self._failed(attempt, exc, errors)
                continue
            try:
                prediction = self._check(prediction, facts)
            except ValueError as exc:  # the caller's check; a pydantic ValidationError is a ValueError
                self._failed(attempt, exc, errors)
                continue
            return StructuredResult(prediction, attempt, errors, self.predict.signature.__name__)
        return self._give_up(self.max_retries + 1, errors)

    def forward(self, facts: Any = None, signature: Optional[type[dspy.Signature]] = None, **inputs: Any) -> StructuredResult:
        """`facts`: what `validate` checks the reply against (known tools, the distortion set, ...);
        `signature`: a form of the module's signature for this call only (same outputs, e.g. an extra input)."""
        loop = self._attempts(inputs, facts, signature)
        try:
            call = next(loop)
            while True:
                try:
                    with dspy.context(adapter=self.adapter):
                        prediction = self.predict(**call)
                except AdapterParseError as exc:
                    call = loop.throw(exc)
                    continue
                call = loop.send(prediction)
        except StopIteration as done:
            return done.value

    async def aforward(self, facts: Any = None, signature: Optional[type[dspy.Signature]] = None,
                       **inputs: Any) -> StructuredResult:
        loop = self._attempts(inputs, facts, signature)
        try:
            call = next(loop)
            while True:
                try:
                    with dspy.context(adapter=self.adapter):
                        prediction = await self.predict.acall(**call)
                except AdapterParseError as exc:
                    call = loop.throw(exc)
                    continue
                call = loop.send(prediction)
        except StopIteration as done:
            return done.value
