"""ToolCache: keys, persistence, size bound, concurrent processes, graceful failure."""
from __future__ import annotations

import multiprocessing as mp
import sqlite3

import pytest

from iqa_tools import ToolCache
from iqa_tools.cache import cache_key
from iqa_tools.paths import user_cache_dir


def test_key_depends_on_every_part():
    base = cache_key("img", "PSNR", "psnr", "ref", "1")
    assert len(base) == 64
    others = [
        cache_key("img2", "PSNR", "psnr", "ref", "1"),
        cache_key("img", "SSIM", "psnr", "ref", "1"),
        cache_key("img", "PSNR", "psnry", "ref", "1"),
        cache_key("img", "PSNR", "psnr", None, "1"),
        cache_key("img", "PSNR", "psnr", "ref", "2"),
    ]
    assert len({base, *others}) == 6


def test_put_get_persists_and_clears(tmp_path):
    c = ToolCache(tmp_path)
    assert c.get("k") is None
    c.put("k", "PIQE", 33.5, 0.01, "cpu")
    c.close()
    again = ToolCache(tmp_path)
    hit = again.get("k")
    assert (hit.raw, hit.device) == (33.5, "cpu")
    info = again.info()
    assert info["entries"] == 1 and info["by_tool"] == {"PIQE": 1} and info["path"].endswith("tools.sqlite")
    assert info["size_bytes"] > 0 and info["disabled"] is None
    assert again.clear() == 1 and again.get("k") is None and again.info()["entries"] == 0


def test_default_location_follows_env(tmp_path, monkeypatch):
    from agentic_iqa.config import load_settings

    monkeypatch.setenv("AGENTIC_IQA_CACHE_DIR", str(tmp_path / "here"))
    assert load_settings().build_registry().cache.path == tmp_path / "here" / "tools.sqlite"
    monkeypatch.delenv("AGENTIC_IQA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "agentic-iqa"
    assert ToolCache().path == tmp_path / "xdg" / "agentic-iqa" / "tools.sqlite"
    assert load_settings().build_registry().cache.path == tmp_path / "xdg" / "agentic-iqa" / "tools.sqlite"


def test_size_bound_evicts_oldest(tmp_path):
    c = ToolCache(tmp_path, max_mb=0.05)  # ~50 KB
    for i in range(3000):
        c.put(f"key-{i:05d}", "PSNR", float(i), 0.0, "cpu")
    info = c.info()
    assert info["entries"] < 3000
    assert c.get("key-02999") is not None and c.get("key-00000") is None
    assert (tmp_path / "tools.sqlite").stat().st_size < 200_000  # the WAL file comes on top, ≤ ~4 MB


def _writer(directory: str, start: int) -> None:
    c = ToolCache(directory)
    for i in range(start, start + 200):
        c.put(f"k{i}", "PIQE", float(i), 0.0, "cpu")


def test_concurrent_processes(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), n * 200)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    c = ToolCache(tmp_path)
    assert c.info()["entries"] == 600 and c.get("k599").raw == 599.0


def test_unusable_cache_is_disabled_not_fatal(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    c = ToolCache(blocker / "sub")  # parent is a file: cannot create the directory
    assert c.get("k") is None
    c.put("k", "PIQE", 1.0, 0.0, "cpu")
    assert c.disabled_reason and "cannot open" in c.disabled_reason

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "tools.sqlite").write_bytes(b"this is not a database" * 100)
    c2 = ToolCache(corrupt)
    assert c2.get("k") is None and c2.disabled_reason


def test_wal_mode(tmp_path):
    c = ToolCache(tmp_path)
    c.put("k", "PIQE", 1.0, 0.0, None)
    mode = sqlite3.connect(tmp_path / "tools.sqlite").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_max_mb_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="max_mb"):
        ToolCache(tmp_path, max_mb=0)
