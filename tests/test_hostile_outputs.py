"""Issue 11 part 5: outputs that cannot be written, odd file names and debugging — the result is never
lost, every failure is one line with a non-zero exit, and AGENTIC_IQA_DEBUG=1 shows the traceback."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canned import write_test_image

from agentic_iqa.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("AGENTIC_IQA_DEBUG", raising=False)
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def image(tmp_path) -> Path:
    return write_test_image(tmp_path / "p.jpg", size=(128, 112))


def _offline(*args: str):
    return runner.invoke(app, ["assess", *args, "--offline"])


@pytest.mark.parametrize("target", ["folder", "/dev/full", "unwritable"])
def test_a_trace_that_cannot_be_written_keeps_the_result(tmp_path, image, target):
    if target == "folder":
        path = tmp_path / "a-folder"
        path.mkdir()
    elif target == "unwritable":
        if os.geteuid() == 0:
            path = Path("/proc/version/trace.json")  # not a folder, whoever we are
        else:
            locked = tmp_path / "locked"
            locked.mkdir(mode=0o500)
            path = locked / "trace.json"
    else:
        if not Path(target).exists():
            pytest.skip("no /dev/full here")
        path = Path(target)
    r = _offline(str(image), "--save-trace", str(path))
    assert r.exit_code == 1, r.output
    assert "Level" in r.output  # the summary was printed first
    assert "Traceback" not in r.output
    trace_lines = [ln for ln in r.output.splitlines() if "trace could not be written" in ln]
    assert len(trace_lines) == 1 and str(path) in trace_lines[0]


def test_save_trace_replaces_the_file_whole(tmp_path, image):
    path = tmp_path / "t.json"
    path.write_text("old")
    r = _offline(str(image), "--save-trace", str(path))
    assert r.exit_code == 0, r.output
    assert json.loads(path.read_text())["image"] == str(image)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".t.json")] == []


def test_save_trace_never_replaces_the_image_or_its_reference(tmp_path, image):
    # `assess photo.jpg --save-trace photo.jpg` replaced the photo by the JSON trace (exit 0).
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(image.read_bytes())
    ref = tmp_path / "ref.jpg"
    ref.write_bytes(image.read_bytes())
    for args, target in (([str(photo)], photo), ([str(photo), "--reference", str(ref)], ref),
                         ([str(photo)], tmp_path / "." / "photo.jpg")):
        r = _offline(*args, "--save-trace", str(target))
        assert r.exit_code == 2, r.output
        assert "--save-trace" in r.output and "would replace the" in " ".join(r.output.split()), r.output
        assert "Level" not in r.output  # refused before assessing
    assert photo.read_bytes() == ref.read_bytes() == image.read_bytes()


def test_a_file_name_that_is_not_utf8_works_in_json_trace_and_batch(tmp_path, image):
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/odd-\xff\xfe.jpg"))
    try:
        odd.write_bytes(image.read_bytes())
    except (OSError, UnicodeEncodeError):
        pytest.skip("the file system refuses non-UTF-8 names")
    r = _offline(str(odd), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["image"].endswith("odd-\\xff\\xfe.jpg")
    trace = tmp_path / "trace.json"
    r = _offline(str(odd), "--save-trace", str(trace))
    assert r.exit_code == 0, r.output
    assert json.loads(trace.read_text(encoding="utf-8"))["image"].endswith("odd-\\xff\\xfe.jpg")
    out = tmp_path / "r.jsonl"
    r = _offline(str(tmp_path), "--out", str(out), "--no-progress")
    assert r.exit_code == 0, r.output
    lines = [json.loads(ln) for ln in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(ln["status"] for ln in lines) == ["ok", "ok"]
    r = _offline(str(tmp_path), "--out", str(out), "--no-progress", "--resume", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["already_done"] == 2  # resume recognises the odd name again


def test_debug_shows_the_traceback_of_an_unexpected_error(tmp_path, image, monkeypatch):
    import agentic_iqa.api as api

    def boom(self, *a, **k):
        raise RuntimeError("something nobody foresaw")

    monkeypatch.setattr(api.Assessor, "assess", boom)
    r = _offline(str(image))
    assert r.exit_code == 1
    assert "something nobody foresaw" in r.output and "AGENTIC_IQA_DEBUG=1" in r.output
    assert "Traceback" not in r.output
    monkeypatch.setenv("AGENTIC_IQA_DEBUG", "1")
    r = _offline(str(image))
    assert r.exit_code == 1
    assert "Traceback (most recent call last)" in r.output and "in boom" in r.output
    assert "something nobody foresaw" in r.output


# ── part 3/4: only regular files, size caps, a FIFO never blocks ────────────────────────────────


def _special(tmp_path: Path, kind: str, name: str) -> Path:
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind == "loop":
        path.symlink_to(path)
    return path


@pytest.mark.parametrize("kind,said", [("fifo", "FIFO"), ("zero", "device"), ("folder", "directory"),
                                       ("loop", "symbolic links")])
def test_config_files_must_be_regular(tmp_path, image, kind, said):
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    _special(cfg, kind, "pipeline.yaml")
    r = _offline(str(image), "--config", str(cfg))
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "pipeline.yaml" in r.stderr and said in r.stderr


def test_config_file_size_cap_and_bad_utf8_name_the_file(tmp_path, image):
    from agentic_iqa.config import MAX_CONFIG_BYTES

    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "pipeline.yaml").write_bytes(b"backend: auto\n" + b"#" * MAX_CONFIG_BYTES)
    r = _offline(str(image), "--config", str(cfg))
    assert r.exit_code == 2 and "pipeline.yaml" in r.stderr and "limit" in r.stderr
    (cfg / "pipeline.yaml").write_bytes(b"backend: \xff\xfe\n")
    r = _offline(str(image), "--config", str(cfg))
    assert r.exit_code == 2 and "pipeline.yaml" in r.stderr and "UTF-8" in r.stderr


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_manifest_and_program_must_be_regular(tmp_path, image, kind):
    manifest = _special(tmp_path, kind, "m.jsonl")
    r = _offline("--manifest", str(manifest), "--out", str(tmp_path / "r.jsonl"))
    assert r.exit_code == 2 and "m.jsonl" in r.stderr and "not a regular file" in r.stderr
    program = _special(tmp_path, kind, "p.json")
    r = _offline(str(image), "--program", f"planner={program}")
    assert r.exit_code == 2 and "p.json" in r.stderr and "not a regular file" in r.stderr


def test_a_fifo_in_a_scanned_folder_is_one_failed_line(tmp_path):
    folder = tmp_path / "shots"
    folder.mkdir()
    write_test_image(folder / "a.jpg", size=(128, 112))
    os.mkfifo(folder / "b.jpg")
    write_test_image(folder / "c.jpg", size=(128, 112), seed=2)
    out = tmp_path / "r.jsonl"
    r = _offline(str(folder), "--out", str(out), "--no-progress")
    assert r.exit_code == 3, r.output
    lines = {Path(rec["image"]).name: rec for rec in map(json.loads, out.read_text().splitlines())}
    assert lines["a.jpg"]["status"] == lines["c.jpg"]["status"] == "ok"
    assert lines["b.jpg"]["status"] == "failed" and "FIFO" in lines["b.jpg"]["error"]


def test_program_without_a_model_is_said_to_be_ignored(tmp_path, image):
    path = tmp_path / "planner.json"
    path.write_text(json.dumps({"agentic_iqa_program": {"module": "planner"}, "state": {}}))
    r = _offline(str(image), "--program", str(path))
    assert r.exit_code == 0, r.output
    assert "--program is ignored" in r.stderr
    # The same program listed in pipeline.yaml's programs: was ignored without a word.
    (tmp_path / "pipeline.yaml").write_text(f"programs:\n  planner: {path}\n")
    r = _offline(str(image), "--config", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "programs: in pipeline.yaml is ignored: no model is configured" in r.stderr
    # --program gets the checks programs: gets: a wrong module name or a program of another module is refused.
    r = _offline(str(image), "--program", f"plannr={path}")
    assert r.exit_code == 2 and "unknown module 'plannr' (did you mean 'planner'?)" in r.output, r.output
    r = _offline(str(image), "--program", f"detect={path}")
    assert r.exit_code == 2 and "was compiled for the 'planner' module, not 'detect'" in r.output, r.output
