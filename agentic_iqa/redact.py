"""One redactor for every string that leaves the process.

Model servers echo what they were sent: a 401 body quoting `Bearer sk-…`, a 500 quoting the request
headers, a model answer repeating a key it saw. Anything we print, log or save — stderr, `--json`,
traces, results files, the score cache, compiled programs — goes through `redact` (strings) or
`redact_data` (JSON-like values) first. It masks:

* the values of the API keys in use: every environment variable named `*_API_KEY` (or `*_TOKEN`,
  `*_SECRET`), plus any value registered with `register_secret` (a role's `api_key_env`);
* bearer tokens (`Authorization: Bearer …`) and provider-style keys (`sk-…`, `sk-ant-…`) even when
  they are not ours — a server may echo someone else's;
* the user name and password of a URL (`https://user:pass@host/v1` → `https://***@host/v1`), and the
  values of key-like query parameters (`?key=…`, `&access_token=…`, `sig=…`).

Strings leaving the process must also be valid UTF-8: a file name that is not (on Linux, Python holds
its odd bytes as lone surrogates) is written with those bytes as `\\xNN` escapes instead of failing
the JSON writer after the work is done.

Values shorter than 8 characters are never treated as secrets ("x", "not-needed" would mask
ordinary words).
"""
from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any, Optional

MASK = "***"
_MIN_SECRET = 8
_SECRET_NAME = re.compile(r"(_API_KEY|_TOKEN|_SECRET|_ACCESS_KEY)$", re.I)
_PATTERNS = (
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=\-]{8,}"),
    re.compile(r"(?i)(\b(?:api[_-]?key|x-api-key|authorization)[\"']?\s*[:=]\s*[\"']?)(?!bearer\b)[A-Za-z0-9._~+/=\-]{8,}"),
    re.compile(r"()\b(?:sk|rk)-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://)[^\s/?#@]+(?=@)"),
    # A key in a URL's query (?key=…, &access_token=…, a signed URL's sig=…); other parameters stay readable.
    re.compile(r"(?i)([?&](?:[a-z0-9_\-]*(?:key|token|secret|password|passwd|pwd)|sig|signature|code)=)[^&#\s\"']+"),
)

_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_A_BYTE = re.compile("[\ud800-\udc7f\udd00-\udfff]")
_registered: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Mask `value` from now on (for keys read from a variable not named like a key)."""
    if value and len(value) >= _MIN_SECRET:
        with _lock:
            _registered.add(value)


def secret_values() -> list[str]:
    """The secrets to mask now, longest first (so a key containing another is masked whole)."""
    found = {v for k, v in os.environ.items() if _SECRET_NAME.search(k) and v and len(v) >= _MIN_SECRET}
    with _lock:
        found |= _registered
    return sorted(found, key=len, reverse=True)


def redact(text: Any, secrets: Optional[list[str]] = None) -> Any:
    """`text` with every secret masked; non-strings are returned unchanged. `secrets`: `secret_values()`
    computed by the caller once for many strings (it scans the environment)."""
    if not isinstance(text, str) or not text:
        return text
    if _SURROGATE.search(text):
        text = _NOT_A_BYTE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)  # surrogates not from a file name
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    for value in secret_values() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def redact_data(value: Any, secrets: Optional[list[str]] = None) -> Any:
    """A copy of a JSON-like value (dicts, lists, tuples, strings) with every string redacted (the secrets
    are looked up once for the whole value: a result holds ~130 strings)."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {redact(k, secrets): redact_data(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_data(v, secrets) for v in value]
    if isinstance(value, tuple):
        return tuple(redact_data(v, secrets) for v in value)
    return value


def _redact_record(record: logging.LogRecord) -> None:
    """Redact a log record in place: its rendered message, and its traceback and stack if any."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a broken format string must not lose the record
        message = str(record.msg)
    clean = redact(message)
    if clean != message or record.args:
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_text is None:
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
    elif record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's rendered message (install on handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        _redact_record(record)
        return True


def redact_all_log_records() -> None:
    """Redact every log record as it is made, whichever logger and handler it goes to: DSPy and LiteLLM
    log through stream handlers of their own, added when they are imported (LiteLLM's only when its
    route is first used), so a filter on the handlers present now would miss them. Idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _redact_record(record)
        return record

    factory.redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
