"""Issue 11 part 5, the model side: escape sequences in model text never reach the terminal, the footer
says which parts fell back when the model did not answer everything, and a malformed API base URL is
a setup error (exit 2), not a silent fallback."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from canned import disable_dspy_cache, valid_reply, write_test_image
from fake_openai import FakeOpenAIServer, scripted

from agentic_iqa.cli import app

runner = CliRunner()
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mRED\x1b[0m\x07\x08\x9b"


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    disable_dspy_cache()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("AGENTIC_IQA_API_BASE", raising=False)
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))


def _routes(**override) -> dict:
    routes = {
        "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
        "score": valid_reply("score", level="B"), "explain": valid_reply("explain"),
        "_logprobs": {"A": -3.0, "B": -0.4, "C": -1.2, "D": -4.0, "E": -6.0},
    }
    routes.update(override)
    return routes


def _assess(tmp_path, routes, *extra):
    img = write_test_image(tmp_path / "p.jpg", size=(128, 112))
    with FakeOpenAIServer(scripted(routes)) as srv:
        return runner.invoke(app, ["assess", str(img), "--lm", "openai/fake-vlm", "--api-base", srv.base_url,
                                   "--config", str(tmp_path), *extra])


def test_escape_sequences_in_model_text_are_stripped_from_the_summary(tmp_path):
    score = valid_reply("score", level="B")
    score["quality_reasoning"] = f"Sharp overall.{HOSTILE} Slight noise."
    r = _assess(tmp_path, _routes(score=score))
    assert r.exit_code == 0, r.output
    assert "Sharp overall." in r.output and "RED" in r.output and "Slight noise." in r.output
    for ch in ("\x1b", "\x07", "\x08", "\x9b"):
        assert ch not in r.output


def test_the_footer_names_the_stages_that_fell_back(tmp_path):
    r = _assess(tmp_path, _routes())
    assert r.exit_code == 0, r.output
    assert "answered by vlm" in r.output and "fallbacks in" not in r.output
    r = _assess(tmp_path, _routes(plan="this is not JSON at all", select="nor is this"))
    assert r.exit_code == 0, r.output
    footer = " ".join(r.output.split())
    assert "with fallbacks in" in footer and "planner" in footer


@pytest.mark.parametrize("base", ["not a url", "ftp://host/v1", "http://host:99999/v1", "http:///v1"])
def test_a_malformed_api_base_is_a_setup_error(tmp_path, monkeypatch, base):
    img = write_test_image(tmp_path / "p.jpg", size=(128, 112))
    monkeypatch.setenv("AGENTIC_IQA_API_BASE", base)
    r = runner.invoke(app, ["assess", str(img), "--lm", "openai/fake-vlm", "--config", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "AGENTIC_IQA_API_BASE" in r.stderr and "http" in r.stderr
