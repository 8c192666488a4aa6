"""Persistent score cache: SQLite in the user cache directory, shared by processes, size-bounded.

Key = sha256 over (image content hash, tool, pyiqa metric, reference content hash or "", tool version),
so editing an image, switching reference or bumping a tool's `version` in the table misses the cache.
Only raw scores are stored; normalization is recomputed on read, so changing β needs no invalidation.

WAL journaling lets readers and one writer work at once across processes; writers wait up to
`timeout` seconds for the lock. When the database outgrows `max_mb` the oldest quarter of rows is deleted
(SQLite reuses the freed pages, so the file stops growing); the WAL file beside it is trimmed back to
1 MB after each checkpoint. A cache that cannot be opened or written
(read-only disk, corrupt file) is disabled with a warning instead of failing the scoring.
"""
from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from iqa_tools.paths import user_cache_dir

log = logging.getLogger("iqa_tools.cache")

FILENAME = "tools.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS scores (
    key      TEXT PRIMARY KEY,
    tool     TEXT NOT NULL,
    raw      REAL NOT NULL,
    seconds  REAL NOT NULL,
    device   TEXT,
    created  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS scores_created ON scores(created);
"""


def cache_key(image_sha: str, tool: str, metric: str, reference_sha: Optional[str], version: str) -> str:
    return hashlib.sha256("\x1f".join([image_sha, tool, metric, reference_sha or "", version]).encode()).hexdigest()


@dataclass(frozen=True)
class CachedScore:
    raw: float
    seconds: float  # how long the original computation took
    device: Optional[str]
    created: float


class ToolCache:
    """SQLite-backed cache of raw tool scores. Thread-safe; safe for concurrent processes."""

    def __init__(self, directory: Optional[Path | str] = None, *, max_mb: float = 256, timeout: float = 30.0):
        if not max_mb > 0:
            raise ValueError(f"max_mb must be positive, got {max_mb}")
        self.path = Path(directory).expanduser() / FILENAME if directory else user_cache_dir() / FILENAME
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._conn: Optional[sqlite3.Connection] = None
        self._disabled: Optional[str] = None
        self._puts = 0

    # -- connection -------------------------------------------------------------------------------
    def _connect(self) -> Optional[sqlite3.Connection]:
        if self._conn is not None or self._disabled:
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes, fast commits
            conn.execute("PRAGMA journal_size_limit=1048576")  # the WAL file shrinks back to 1 MB after checkpoints
            conn.executescript(_SCHEMA)
            self._conn = conn
        except (sqlite3.Error, OSError) as exc:
            self._disable(f"cannot open {self.path}: {exc}")
        return self._conn

    def _disable(self, why: str) -> None:
        self._disabled = why
        log.warning("score cache disabled: %s", why)
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    @property
    def disabled_reason(self) -> Optional[str]:
        return self._disabled

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- API --------------------------------------------------------------------------------------
    def get(self, key: str) -> Optional[CachedScore]:
        with self._lock:
            conn = self._connect()
            if conn is None:
                return None
            try:
                row = conn.execute("SELECT raw, seconds, device, created FROM scores WHERE key = ?", (key,)).fetchone()
            except sqlite3.Error as exc:
                self._disable(f"read failed: {exc}")
                return None
        return CachedScore(*row) if row else None

    def put(self, key: str, tool: str, raw: float, seconds: float, device: Optional[str]) -> None:
        with self._lock:
            conn = self._connect()
            if conn is None:
                return
            try:
                conn.execute(
                    "INSERT OR REPLACE INTO scores (key, tool, raw, seconds, device, created) VALUES (?, ?, ?, ?, ?, ?)",
                    (key, tool, float(raw), float(seconds), device, time.time()),
                )
                self._puts += 1
                if self._puts % 64 == 1:  # checking the size costs a few queries: not on every put
                    self._evict(conn)
            except sqlite3.Error as exc:
                self._disable(f"write failed: {exc}")

    def _evict(self, conn: sqlite3.Connection) -> None:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        used = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
        if used * page_size <= self.max_bytes:
            return
        n = conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0]
        conn.execute(
            "DELETE FROM scores WHERE key IN (SELECT key FROM scores ORDER BY created ASC LIMIT ?)",
            (max(1, n // 4),),
        )
        log.info("score cache above %d MB: evicted %d oldest entries", self.max_bytes // 2**20, max(1, n // 4))

    def info(self) -> dict:
        """Location, entry count, size on disk, limit, and per-tool counts."""
        out = {
            "path": str(self.path),
            "entries": 0,
            "size_bytes": 0,
            "max_bytes": self.max_bytes,
            "by_tool": {},
            "disabled": self._disabled,
        }
        with self._lock:
            conn = self._connect()
            if conn is None:
                out["disabled"] = self._disabled
                return out
            try:
                out["entries"] = conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0]
                out["by_tool"] = dict(conn.execute("SELECT tool, COUNT(*) FROM scores GROUP BY tool ORDER BY tool").fetchall())
            except sqlite3.Error as exc:
                out["disabled"] = f"read failed: {exc}"
        out["size_bytes"] = sum(p.stat().st_size for p in self.path.parent.glob(FILENAME + "*") if p.is_file())
        return out

    def clear(self) -> int:
        """Delete every entry; returns how many there were."""
        with self._lock:
            conn = self._connect()
            if conn is None:
                return 0
            n = conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0]
            conn.execute("DELETE FROM scores")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return n
