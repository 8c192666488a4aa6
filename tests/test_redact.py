"""The redactor every outgoing string passes through (issue 11 part 2)."""
from __future__ import annotations

import logging

from agentic_iqa.redact import MASK, RedactingFilter, redact, redact_data, register_secret

KEY = "sk-agentic-iqa-SENTINEL-7f3a9c1e5b2d4a6f"


def test_keys_in_use_are_masked_wherever_they_appear(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert redact(f"401: Incorrect API key provided: {KEY}.") == f"401: Incorrect API key provided: {MASK}."
    assert KEY not in redact(f"prefix{KEY}suffix")


def test_a_key_from_a_custom_variable_is_masked_once_registered(monkeypatch):
    secret = "custom-secret-value-1234567"
    monkeypatch.setenv("MY_PROVIDER_CREDENTIAL", secret)  # not named like a key
    assert redact(f"echo {secret}") == f"echo {secret}"
    register_secret(secret)
    assert redact(f"echo {secret}") == f"echo {MASK}"


def test_bearer_tokens_and_provider_style_keys_are_masked_even_when_not_ours():
    text = 'headers: {"Authorization": "Bearer abcdefgh12345678"} and sk-ant-api03-ABCDEFGHIJKLMNOPQRST'
    clean = redact(text)
    assert "abcdefgh12345678" not in clean and "ABCDEFGHIJKLMNOPQRST" not in clean
    assert "Bearer ***" in clean
    assert redact("api_key=0123456789abcdef") == f"api_key={MASK}"


def test_ordinary_text_and_short_values_are_left_alone(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "x")  # too short to be a secret: would mask every "x"
    text = "The sky is slightly blurry (x = 0.42); skill-based sketching is fine."
    assert redact(text) == text
    assert redact(None) is None and redact(3.5) == 3.5


def test_nested_values_are_redacted_without_changing_their_shape(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    data = {"backend": f"offline ({KEY})", "trace": [{"message": KEY, "n": 1}], "t": (KEY, 2), KEY: True}
    clean = redact_data(data)
    assert KEY not in repr(clean)
    assert clean["trace"][0]["n"] == 1 and isinstance(clean["t"], tuple) and clean[MASK] is True
    assert KEY in repr(data)  # the input is not modified


def test_log_records_are_redacted_including_args_and_tracebacks(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(self.format(record))

    handler = Keep()
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("test_redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("server said %s", f"Bearer {KEY}")
        try:
            raise RuntimeError(f"echo {KEY}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    assert len(records) == 2
    assert all(KEY not in r for r in records)
    assert "RuntimeError: echo ***" in records[1]


def test_the_password_of_a_url_is_masked():
    from agentic_iqa.config import RoleLM
    from agentic_iqa.lm import build_lm

    assert redact("at https://alice:hunter2secret@proxy.example/v1") == f"at https://{MASK}@proxy.example/v1"
    assert redact("https://proxy.example/v1 and a@b.example") == "https://proxy.example/v1 and a@b.example"
    build_lm(RoleLM(model="openai/m", api_base="http://bob:s3cret-pass-word@127.0.0.1:9/v1"))
    assert redact("connect to bob:s3cret-pass-word@127.0.0.1:9 failed") == f"connect to bob:{MASK}@127.0.0.1:9 failed"
