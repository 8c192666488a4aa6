"""Issue 11 part 2: a server that echoes the API key (in error bodies, headers or the model's answer)
must not make the key appear in anything the tool prints or saves."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canned import disable_dspy_cache, valid_reply, write_test_image
from fake_openai import FakeOpenAIServer, Reply, scripted

from agentic_iqa.cli import app

SENTINEL = "sk-agentic-iqa-SENTINEL-0c4f2e9a7b1d3e5f"
runner = CliRunner()


def _echo(status: int) -> Reply:
    body = {"error": {"message": f"Incorrect API key provided: {SENTINEL}. Authorization: Bearer {SENTINEL}",
                      "type": "invalid_request_error", "headers": {"authorization": f"Bearer {SENTINEL}"}}}
    return Reply(status=status, error_body=body, headers={"X-Echo-Key": SENTINEL, "Retry-After": "0"})


def _routes(**override) -> dict:
    routes = {
        "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
        "score": valid_reply("score", level="B"), "explain": valid_reply("explain"),
        "_logprobs": {"A": -3.0, "B": -0.4, "C": -1.2, "D": -4.0, "E": -6.0},
    }
    routes.update(override)
    return routes


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    disable_dspy_cache()
    monkeypatch.setenv("OPENAI_API_KEY", SENTINEL)
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))


def _everything_written(folder: Path) -> str:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()).decode("latin-1")


def _run_all_outputs(tmp_path: Path, routes: dict) -> tuple[dict[str, str], list]:
    img = write_test_image(tmp_path / "p.jpg", size=(64, 48))
    img2 = write_test_image(tmp_path / "q.jpg", size=(64, 48), seed=3)
    trace, out = tmp_path / "trace.json", tmp_path / "results.jsonl"
    with FakeOpenAIServer(scripted(routes)) as srv:
        lm = ["--lm", "openai/fake-vlm", "--api-base", srv.base_url, "--config", str(tmp_path)]
        single = runner.invoke(app, ["assess", str(img), *lm, "--verbose", "--save-trace", str(trace)])
        as_json = runner.invoke(app, ["assess", str(img), *lm, "--json", "--verbose"])
        batch = runner.invoke(app, ["assess", str(img), str(img2), *lm, "--out", str(out), "--with-trace", "--json"])
    outputs = {
        "summary (stdout+stderr)": single.output, "--json": as_json.output, "batch output": batch.output,
        "saved trace": trace.read_text() if trace.exists() else "",
        "results file": out.read_text() if out.exists() else "",
        "everything written": _everything_written(tmp_path),
    }
    return outputs, srv.requests


@pytest.mark.parametrize("status", [400, 429, 500])
def test_error_bodies_and_headers_echoing_the_key_are_redacted(tmp_path, status, caplog):
    caplog.set_level(logging.DEBUG)
    echo = _echo(status)
    outputs, requests = _run_all_outputs(tmp_path, _routes(plan=echo, detect=echo, analyze=echo, select=echo, score=echo, explain=echo))
    assert requests and all(r["headers"].get("Authorization") == f"Bearer {SENTINEL}" for r in requests)
    outputs["logs"] = caplog.text
    for where, text in outputs.items():
        assert SENTINEL not in text, f"the key echoed by a {status} reached the {where}"


def test_a_refused_key_echoed_in_a_401_is_not_printed(tmp_path):
    img = write_test_image(tmp_path / "p.jpg", size=(64, 48))
    with FakeOpenAIServer(scripted(_routes(plan=_echo(401)))) as srv:
        r = runner.invoke(app, ["assess", str(img), "--lm", "openai/fake-vlm", "--api-base", srv.base_url,
                                "--config", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert SENTINEL not in r.output
    assert "error:" in r.output  # the user still learns what happened


def test_a_key_echoed_inside_the_model_answer_is_masked(tmp_path):
    leaky_score = valid_reply("score", level="B")
    leaky_score["quality_reasoning"] = f"Sharp and clean. (debug: the key I was given is {SENTINEL})"
    leaky_explain = valid_reply("explain")
    leaky_explain["final_answer"] = f"A. Yes ({SENTINEL})"
    outputs, requests = _run_all_outputs(tmp_path, _routes(score=leaky_score, explain=leaky_explain))
    assert requests
    assert "Sharp and clean" in outputs["--json"] or "Sharp and clean" in outputs["summary (stdout+stderr)"]
    for where, text in outputs.items():
        assert SENTINEL not in text, f"the key echoed in the answer reached the {where}"


@pytest.fixture
def dspy_warns_the_key(monkeypatch):
    """Every assessment first logs a DSPy warning quoting the key (as DSPy and LiteLLM do when they log a
    provider's error), through DSPy's own stderr handler. State an earlier test left in this process
    (a redacting record factory, filters on DSPy's handler) is removed: each command must install it."""
    import dspy  # noqa: F401 - DSPy's logger and its handler

    from agentic_iqa.api import Assessor

    original = Assessor.assess

    def assess(self, *args, **kwargs):
        logging.getLogger("dspy.clients.lm").warning("provider said: Incorrect API key provided: %s", SENTINEL)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Assessor, "assess", assess)
    for handler in logging.getLogger("dspy").handlers:
        monkeypatch.setattr(handler, "filters", [])
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(logging.LogRecord)
    yield
    logging.setLogRecordFactory(factory)


@pytest.mark.parametrize("command", ["assess", "batch", "eval"])
def test_dspy_log_lines_are_redacted_in_every_command(tmp_path, dspy_warns_the_key, command):
    img = write_test_image(tmp_path / "p.jpg", size=(64, 48))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "r0", "image": img.name, "level": 1, "type": "white noise", "split": "test"}) + "\n")
    args = {"assess": ["assess", str(img)], "batch": ["assess", str(img), "--out", str(tmp_path / "r.jsonl")],
            "eval": ["eval", str(manifest), "--mode", "nr"]}[command]
    quiet = runner.invoke(app, [*args, "--offline", "--no-cache"] if command != "eval" else [*args, "--offline"])
    verbose = runner.invoke(app, [*args, "--offline", "--verbose", "--overwrite"] if command == "batch"
                            else [*args, "--offline", "--verbose"])
    assert quiet.exit_code == 0 and verbose.exit_code == 0, (quiet.output, verbose.output)
    assert SENTINEL not in quiet.output and SENTINEL not in verbose.output
    assert "Incorrect API key provided" not in quiet.output  # DSPy's log lines only with --verbose, as in compile
    assert "Incorrect API key provided: ***" in verbose.output


def test_a_key_echoed_in_the_answers_never_reaches_a_compiled_program(tmp_path):
    """`compile` against a server whose answers echo the key wrote it into the program's bootstrapped demos
    (8 times, "quality_reasoning": "your key is Bearer sk-…"): every saved program is redacted."""
    leaky = [valid_reply("score", level=lv, quality_reasoning=f"your key is Bearer {SENTINEL}") for lv in "ABCDE" * 20]
    out = tmp_path / "summarize.json"
    with FakeOpenAIServer(scripted(_routes(score=leaky, explain=valid_reply(
            "explain", quality_reasoning=f"your key is {SENTINEL}")))) as srv:
        res = runner.invoke(app, ["compile", "--module", "summarize", "--lm", "openai/fake-vlm", "--api-base",
                                  srv.base_url, "--config", str(tmp_path), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert srv.requests and SENTINEL not in res.output
    text = out.read_text()
    assert "your key is" in text, "the test must bootstrap an echoed answer to mean anything"
    assert SENTINEL not in _everything_written(tmp_path)


def test_secrets_in_a_urls_query_are_masked_wherever_it_is_quoted():
    from agentic_iqa.redact import redact

    text = redact("GET https://u:pa55word-xyz@host/v1?api-version=2024&key=SECRETvalue123456&sig=abcdefgh12345678 failed")
    assert "SECRETvalue123456" not in text and "abcdefgh12345678" not in text and "pa55word" not in text, text
    assert "api-version=2024" in text and "https://***@host/v1" in text  # what is not a secret stays readable
