"""A symlink loop is named as one, never "file not found" or a crashed batch (issue 11): as the image,
--reference, --program, a config file, the manifest, and an entry of a manifest (assess and eval)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canned import write_test_image

from agentic_iqa.cli import app
from agentic_iqa.cli.common import EXIT_BAD_INPUT, EXIT_PARTIAL

runner = CliRunner()
SAID = "too many levels of symbolic links"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def folder(tmp_path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    write_test_image(d / "ok.jpg", size=(128, 96))
    (d / "loop1").symlink_to("loop2")
    (d / "loop2").symlink_to("loop1")
    return d


def cli(*args: str):
    r = runner.invoke(app, list(args))
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def one_error_line(r, code: int = EXIT_BAD_INPUT) -> str:
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: "), r.output
    text = " ".join(" ".join(lines).split())  # rich wraps long lines
    assert "not found" not in text and "does not exist" not in text
    return text


@pytest.mark.parametrize("where", ["image", "reference", "program"])
def test_loop_as_an_input_file(folder, where):
    loop, ok = str(folder / "loop1"), str(folder / "ok.jpg")
    args = {"image": [loop], "reference": [ok, "--reference", loop], "program": [ok, "--program", loop]}[where]
    text = one_error_line(cli("assess", *args, "--offline", "--no-cache"))
    assert "loop1" in text and SAID in text.lower()


@pytest.mark.parametrize("name", ["pipeline.yaml", "model_backends.yaml"])
def test_loop_as_a_config_file(folder, tmp_path, name):
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / name).symlink_to(folder / "loop1")
    text = one_error_line(cli("assess", str(folder / "ok.jpg"), "--offline", "--no-cache", "--config", str(cfg)))
    assert name in text and SAID in text.lower()


def test_loop_as_the_manifest(folder, tmp_path):
    text = one_error_line(cli("assess", "--manifest", str(folder / "loop1"), "--out", str(tmp_path / "r.jsonl"),
                              "--offline", "--no-cache"))
    assert "loop1" in text and SAID in text.lower()


def test_loop_as_a_manifest_entry_is_one_failed_line(folder, tmp_path):
    # Before: the whole batch failed with "RuntimeError: Symlink loop from …" and wrote nothing.
    manifest = folder / "m.jsonl"
    manifest.write_text('{"image": "loop1"}\n{"image": "ok.jpg"}\n', encoding="utf-8")
    out = tmp_path / "r.jsonl"
    r = cli("assess", "--manifest", str(manifest), "--out", str(out), "--offline", "--no-cache")
    assert r.exit_code == EXIT_PARTIAL, r.output
    lines = {json.loads(ln)["image"].rsplit("/", 1)[-1]: json.loads(ln) for ln in out.read_text().splitlines()}
    assert lines["ok.jpg"]["status"] == "ok"
    bad = lines["loop1"]
    assert bad["status"] == "failed" and "symlink loop" in bad["error"] and SAID in bad["error"]


def test_loop_in_an_eval_manifest_is_named_not_missing(folder):
    manifest = folder / "eval.jsonl"
    manifest.write_text('{"id": "a", "image": "loop1", "mos": 3}\n{"id": "b", "image": "ok.jpg", "mos": 4}\n',
                        encoding="utf-8")
    r = cli("eval", str(manifest), "--offline")
    text = " ".join(r.output.split())
    assert "line 1 (a): image 'loop1': symlink loop" in text, text  # the words of assess --manifest
    assert "missing image file loop1" not in text
