"""A damaged or unusable score cache (issue 11): detected, said once in one line naming the file and the
way out, scoring goes on without the cache, and `agentic-iqa tools cache clear` recreates a corrupt file
(it used to report "cleared 0" and leave it broken)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import warnings

import pytest
from typer.testing import CliRunner

from agentic_iqa.cli import app
from agentic_iqa.cli.common import EXIT_FAILED
from iqa_tools import ToolCache
from iqa_tools.cache import FILENAME, ScoreCacheError, ScoreCacheWarning

runner = CliRunner()


def garbage_file(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FILENAME).write_bytes(b"\x00garbage, not SQLite\xff" * 1000)
    return folder


def malformed_db(folder, rows: int = 2000):
    """A real cache whose table pages were overwritten: it opens, and reads fail 'malformed'."""
    c = ToolCache(folder)
    for i in range(rows):
        c.put(f"k{i}", "PIQE", float(i), 0.0, "cpu")
    c.close()
    path = folder / FILENAME
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(path.read_bytes())
    page = 4096
    for off in range(2 * page, len(data) - page, 3 * page):  # keep page 1 (the header and schema)
        data[off:off + page] = b"\xa5" * page
    path.write_bytes(bytes(data))
    return folder


def cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, ScoreCacheWarning)]


@pytest.mark.parametrize("damage", [garbage_file, malformed_db])
def test_corrupt_cache_is_said_once_and_scoring_goes_on(tmp_path, damage):
    folder = damage(tmp_path / "cache")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        c = ToolCache(folder)
        for i in range(5):  # many images: still one line
            assert c.get(f"k{i}") is None
            c.put(f"new{i}", "PIQE", 1.0, 0.0, "cpu")
    said = cache_warnings(record)
    assert len(said) == 1, said
    assert str(folder / FILENAME) in said[0] and "is corrupt" in said[0]
    assert "`agentic-iqa tools cache clear` to recreate it" in said[0]
    assert "\n" not in said[0]
    assert c.corrupt and c.info()["corrupt"]


@pytest.mark.parametrize("damage", [garbage_file, malformed_db])
def test_clear_recreates_a_corrupt_cache(tmp_path, damage):
    folder = damage(tmp_path / "cache")
    c = ToolCache(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScoreCacheWarning)
        assert c.clear() == 0
    assert c.recreated and not c.corrupt and c.disabled_reason is None
    c.put("k", "PIQE", 2.5, 0.0, "cpu")
    assert c.get("k").raw == 2.5
    c.close()
    # A fresh process sees a healthy database.
    again = ToolCache(folder)
    assert again.get("k").raw == 2.5 and again.info()["disabled"] is None
    assert sqlite3.connect(folder / FILENAME).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_clear_keeps_a_healthy_cache_and_counts(tmp_path):
    c = ToolCache(tmp_path)
    c.put("a", "PIQE", 1.0, 0.0, None)
    c.put("b", "PIQE", 2.0, 0.0, None)
    assert c.clear() == 2 and not c.recreated


def test_unwritable_cache_folder_is_one_warning_and_clear_says_why(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")  # the cache folder would have to be created inside a file (root can write anywhere else)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        c = ToolCache(blocker / "cache")
        for i in range(3):
            assert c.get("k") is None
            c.put("k", "PIQE", 1.0, 0.0, None)
    said = cache_warnings(record)
    assert len(said) == 1 and str(blocker / "cache" / FILENAME) in said[0]
    assert "scores are not cached this run" in said[0] and "AGENTIC_IQA_CACHE_DIR" in said[0]
    assert not c.corrupt
    with pytest.raises(ScoreCacheError, match="cannot clear the score cache"):
        c.clear()


def test_cli_cache_clear_recreates_a_corrupt_file(tmp_path, monkeypatch):
    folder = garbage_file(tmp_path / "cache")
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(folder))
    info = runner.invoke(app, ["tools", "cache", "info"])
    assert info.exit_code == 0 and "is corrupt" in info.output and "tools cache clear" in info.output
    r = runner.invoke(app, ["tools", "cache", "clear"])
    assert r.exit_code == 0, r.output
    assert "recreated the score cache" in r.output and "cleared 0" not in r.output
    info = runner.invoke(app, ["tools", "cache", "info", "--json"])
    assert info.exit_code == 0 and '"disabled": null' in info.output and '"corrupt": false' in info.output


def test_cli_cache_clear_on_an_unwritable_folder_fails_in_one_line(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(blocker / "cache"))
    r = runner.invoke(app, ["tools", "cache", "clear"])
    assert r.exit_code == EXIT_FAILED
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: cannot clear the score cache") and "Traceback" not in r.output


def test_cli_run_with_a_corrupt_cache_warns_once_in_one_line(tmp_path):
    # A fresh process, as a user runs it: the warning is one `warning: …` line on stderr, the score is printed.
    from PIL import Image

    folder = garbage_file(tmp_path / "cache")
    image = tmp_path / "img.png"
    Image.new("RGB", (64, 64), (120, 80, 40)).save(image)
    code = "import sys; from agentic_iqa.cli import main; sys.argv[0] = 'agentic-iqa'; main()"
    env = {**__import__("os").environ, "AGENTIC_IQA_CACHE_DIR": str(folder)}
    p = subprocess.run([sys.executable, "-c", code, "tools", "run", "PSNR", str(image), "--reference", str(image)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    warned = [ln for ln in p.stderr.splitlines() if "score cache" in ln]
    assert len(warned) == 1 and warned[0].startswith("warning: score cache disabled: ") and str(folder) in warned[0]
    assert "PSNR" in p.stdout
