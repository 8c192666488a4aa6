"""`agentic-iqa tools …` through typer's CliRunner: output, exit codes, one-line errors, no tracebacks."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from agentic_iqa.cli import app
from agentic_iqa.cli.common import EXIT_BAD_INPUT, EXIT_FAILED
from iqa_tools import example_image

runner = CliRunner()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))


def invoke(*args: str):
    result = runner.invoke(app, ["tools", *args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_list_table_and_filters():
    r = invoke("list")
    assert r.exit_code == 0
    for text in ("TOPIQ_FR", "PIQE", "Runs here?", "needs weights", "needs pip install"):
        assert text in r.output
    r = invoke("list", "--available", "--mode", "nr")
    assert r.exit_code == 0 and "NIQE" in r.output and "PIQE" in r.output and "SSIM" not in r.output


def test_list_json():
    r = invoke("list", "--json")
    rows = {row["name"]: row for row in json.loads(r.output)}
    assert len(rows) == 31
    assert rows["PIQE"]["available"] and rows["PIQE"]["reason"] == "weight-free"
    assert rows["BRISQUE"]["available"] and rows["BRISQUE"]["reason"] == "parameter file present"
    assert not rows["MUSIQ"]["available"] and "musiq_koniq_ckpt" in rows["MUSIQ"]["reason"]
    assert rows["QAlign"]["beta"] == [28.8204, 0.1469, 6.1941, -0.1906, 6.7863]
    avail = json.loads(invoke("list", "--json", "--available", "--mode", "FR").output)
    assert {row["name"] for row in avail} == {"FSIM", "GMSD", "SSIM", "VIF", "MS-SSIM", "PSNR", "VSI", "NLPD", "CW-SSIM"}


def test_run_example_then_cached():
    r = invoke("run", "PIQE", "example:chelsea", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["tool"] == "PIQE" and 1 <= out["normalized_score"] <= 5 and out["cached"] is False
    assert out["image"].endswith("chelsea.png")
    again = json.loads(invoke("run", "piqe", "example:chelsea", "--json").output)
    assert again["cached"] is True and again["raw_score"] == out["raw_score"]
    fresh = json.loads(invoke("run", "PIQE", "example:chelsea", "--json", "--no-cache").output)
    assert fresh["cached"] is False
    text = invoke("run", "PIQE", "example:chelsea")
    assert text.exit_code == 0 and "PIQE" in text.output and "/ 5" in text.output and "from cache" in text.output


def test_run_full_reference():
    ref = example_image("camera")
    r = invoke("run", "GMSD", str(ref), "--reference", str(ref), "--device", "cpu")
    assert r.exit_code == 0 and "GMSD" in r.output


def test_run_fallback_json():
    r = invoke("run", "MUSIQ", "example:coffee", "--fallback", "--json")
    assert r.exit_code == 0
    logs = json.loads(r.output)["logs"]
    assert [e["tool_name"] for e in logs] == ["MUSIQ", "NIQE"]
    assert logs[0]["raw_score"] == "NaN" and logs[1]["fallback"] is True  # strict JSON, no bare NaN


@pytest.mark.parametrize(
    "args, code, message",
    [
        (("run", "NOPE", "example:chelsea"), EXIT_BAD_INPUT, "unknown tool 'NOPE'"),
        (("run", "PIQE", "/no/such/file.png"), EXIT_BAD_INPUT, "file not found"),
        (("run", "PIQE", "example:lena"), EXIT_BAD_INPUT, "unknown example image"),
        (("run", "SSIM", "example:chelsea"), EXIT_BAD_INPUT, "needs a reference image"),
        (("run", "PSNR", "example:chelsea", "-r", "example:coffee"), EXIT_BAD_INPUT, "resize or crop"),
        # a missing weight file or package is configuration (exit 2; it was 1, the code of unexpected failures)
        (("run", "MUSIQ", "example:chelsea"), EXIT_BAD_INPUT, "musiq_koniq_ckpt-e95806b9.pth"),
        (("run", "CLIPIQA", "example:chelsea"), EXIT_BAD_INPUT, "[metrics] extra"),
        (("run", "TOPIQ_FR", "example:chelsea", "-r", "example:chelsea"), EXIT_BAD_INPUT, "missing Python package(s)"),
        (("run", "PIQE", "example:chelsea", "--device", "gpu0"), EXIT_BAD_INPUT, "unknown device"),
        (("list", "--tools-file", "/no/such.yaml"), EXIT_BAD_INPUT, "file not found"),
        (("list", "--mode", "XR"), 2, "Invalid value"),
    ],
)
def test_errors_are_one_line_with_exit_codes(args, code, message):
    r = invoke(*args)
    assert r.exit_code == code, r.output
    assert message in r.output


def test_fallback_that_cannot_run_exits_failed(tmp_path):
    only_maniqa = tmp_path / "t.yaml"
    only_maniqa.write_text("fallback:\n  generic: [MANIQA]\n  best_of: []\n")
    r = invoke("run", "MUSIQ", "example:chelsea", "--fallback", "--tools-file", str(only_maniqa))
    assert r.exit_code == EXIT_FAILED and "failed" in r.output


def test_cache_info_and_clear():
    invoke("run", "PIQE", "example:chelsea")
    info = json.loads(invoke("cache", "info", "--json").output)
    assert info["entries"] == 1 and info["by_tool"] == {"PIQE": 1}
    assert "entries: 1" in invoke("cache", "info").output
    r = invoke("cache", "clear")
    assert r.exit_code == 0 and "cleared 1 cached score" in r.output
    assert json.loads(invoke("cache", "info", "--json").output)["entries"] == 0


def test_help_does_not_import_torch():
    code = "import sys; from agentic_iqa.cli import app; from typer.testing import CliRunner; " \
           "CliRunner().invoke(app, ['tools', '--help']); print('torch' in sys.modules, 'pyiqa' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_an_offline_assessment_does_not_import_dspy(tmp_path):
    """DSPy (about 0.3-1 s to import) is for the model path: the offline answer every user gets without a key
    never loads it, logging set up included (`setup_logging` quiets DSPy only once a model is used)."""
    from canned import write_test_image

    img = write_test_image(tmp_path / "p.png", size=(64, 48))
    code = ("import sys; from agentic_iqa.cli import app; from typer.testing import CliRunner; "
            f"r = CliRunner().invoke(app, ['assess', {str(img)!r}, '--offline', '--json', '--no-cache']); "
            "print(r.exit_code, 'dspy' in sys.modules)")
    env = {**os.environ, "AGENTIC_IQA_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, timeout=300)
    assert out.stdout.split() == ["0", "False"], out.stderr[-2000:]
