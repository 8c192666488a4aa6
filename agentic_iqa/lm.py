"""Build one DSPy LM per role from the configuration. Keys come only from the environment."""
from __future__ import annotations

import os
import re
from typing import Optional

from agentic_iqa.config import ROLES, ConfigError, ModelBackends, RoleLM
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
    )
    if role.api_base:
        kwargs["api_base"] = _checked_base_url(role.api_base, role_name)
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
        return dspy.LM(role.model, **kwargs)
    except ValueError as exc:
        raise ConfigError(f"{role_name}: model {role.model!r}: {exc}") from None


def _checked_base_url(url: str, role_name: str) -> str:
    """`url` when it is an http(s) URL with a host; otherwise a ConfigError (a malformed base URL would
    make every call fail and the run fall back silently)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{role_name}: api_base {redact(url)!r} is not a valid http(s) URL (scheme, host, port); "
                          "write it like http://localhost:8000/v1 (--api-base, AGENTIC_IQA_API_BASE)")
    return url.strip()


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
        # A model string DSPy/LiteLLM cannot route, e.g. "gpt4o" or "foo/bar".
        first = first.split(" Pass in")[0].rstrip(".") + "; write the model as provider/model (openai/gpt-4o, " \
            "anthropic/..., gemini/..., ollama_chat/..., or openai/NAME with --api-base for an OpenAI-compatible server)"
    elif invalid_request and status == 404:
        first += " (HTTP 404: no such endpoint or model; OpenAI-compatible servers usually want --api-base ending in /v1)"
    elif invalid_request and status == 400 and re.search(r"image", first, re.I):
        first += " (the model does not take images: agentic-iqa needs a vision-language model)"
    elif not isinstance(exc, _setup_types()):
        return None
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
