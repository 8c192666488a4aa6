"""Persistent score cache: SQLite in the user cache directory, shared by processes, size-bounded.

Key = sha256 over (image content hash, tool, pyiqa metric, reference content hash or "", tool version),
so editing an image, switching reference or bumping a tool's `version` in the table misses the cache.
Only raw scores are stored; normalization is recomputed on read, so changing β needs no invalidation.

WAL journaling lets readers and one writer work at once across processes; writers wait up to
`timeout` seconds for the lock. When the database outgrows `max_mb` the oldest quarter of rows is deleted
(SQLite reuses the freed pages, so the file stops growing); the WAL file beside it is trimmed back to
1 MB after each checkpoint. A cache that cannot be opened or written (read-only disk, a folder
that cannot be created, a corrupt file) is disabled instead of failing the scoring, and says so once per
process in one line (a `ScoreCacheWarning`, also logged): a corrupt file names
`agentic-iqa tools cache clear`, which recreates it (`clear(recreate=True)`).
"""
from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
import warnings
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


class ScoreCacheWarning(UserWarning):
    """The score cache is off for this process (corrupt file, unwritable folder): scoring goes on uncached."""


class ScoreCacheError(OSError):
    """`clear` could not do its job (the folder is not writable, the file is not ours to delete)."""


_said: set[str] = set()  # warnings already given in this process (one line each, not one per image)
_said_lock = threading.Lock()


def _say_once(message: str) -> None:
    with _said_lock:
        if message in _said:
            return
        _said.add(message)
    log.warning("%s", message)
    warnings.warn(message, ScoreCacheWarning, stacklevel=4)


def is_corruption(exc: BaseException) -> bool:
    """True when SQLite says the file is not a database or its contents are damaged (not: locked, busy,
    read-only, I/O)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return True
    text = str(exc).lower()
    return isinstance(exc, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text)


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
        self.corrupt = False  # SQLite found the file damaged: `clear()` recreates it
        self.recreated = False  # the last clear() replaced a corrupt file
        self._puts = 0

    # -- connection -------------------------------------------------------------------------------
    def _connect(self) -> Optional[sqlite3.Connection]:
        if self._conn is not None or self._disabled:
            return self._conn
        try:
            self._conn = self._open()
        except (sqlite3.Error, OSError) as exc:
            self._disable_for(exc, "open")
        return self._conn

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes, fast commits
            conn.execute("PRAGMA journal_size_limit=1048576")  # the WAL file shrinks back to 1 MB after checkpoints
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def _disable_for(self, exc: BaseException, doing: str) -> None:
        """Turn the cache off for this process, with the one line that says why and what to do."""
        if is_corruption(exc):
            self.corrupt = True
            self._disable(f"{self.path} is corrupt ({exc}); scores are not cached. "
                          "Run `agentic-iqa tools cache clear` to recreate it")
        elif isinstance(exc, OSError) or "readonly" in str(exc).lower() or "unable to open" in str(exc).lower():
            self._disable(f"cannot {'open' if doing == 'open' else doing} {self.path} ({exc}); scores are not cached "
                          "this run. Make the folder writable or point AGENTIC_IQA_CACHE_DIR (pipeline cache.dir) elsewhere")
        else:
            self._disable(f"{doing} of {self.path} failed ({exc}); scores are not cached this run")

    def _disable(self, why: str) -> None:
        self._disabled = why
        _say_once(f"score cache disabled: {why}")
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
                self._disable_for(exc, "read")
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
                self._disable_for(exc, "write")

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
            if conn is not None:
                try:
                    out["entries"] = conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0]
                    out["by_tool"] = dict(conn.execute("SELECT tool, COUNT(*) FROM scores GROUP BY tool ORDER BY tool").fetchall())
                except sqlite3.Error as exc:
                    self._disable_for(exc, "read")
            out["disabled"], out["corrupt"] = self._disabled, self.corrupt
        try:
            out["size_bytes"] = sum(p.stat().st_size for p in self.path.parent.glob(FILENAME + "*") if p.is_file())
        except OSError:
            pass
        return out

    def clear(self) -> int:
        """Delete every entry; returns how many there were. A corrupt database is deleted and made anew
        (0 entries; `self.recreated` says so). Raises ScoreCacheError when it cannot be cleared."""
        with self._lock:
            self.recreated = False
            conn = self._connect()
            if conn is None and self.corrupt:
                return self._recreate()
            if conn is None:
                raise ScoreCacheError(f"cannot clear the score cache: {self._disabled}")
            try:
                n = conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0]
                conn.execute("DELETE FROM scores")
                conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                if not is_corruption(exc):
                    raise ScoreCacheError(f"cannot clear the score cache {self.path}: {exc}") from None
                self.corrupt = True
                self._disabled = str(exc)
                conn.close()
                self._conn = None
                return self._recreate()
            return n

    def _recreate(self) -> int:
        """Delete the corrupt database (and its WAL/SHM files) and open a fresh one (lock held)."""
        for p in (self.path, self.path.with_name(self.path.name + "-wal"), self.path.with_name(self.path.name + "-shm")):
            if p.is_symlink() or (p.exists() and not p.is_file()):
                raise ScoreCacheError(f"cannot recreate the score cache: {p} is not a regular file; remove it yourself")
            try:
                p.unlink(missing_ok=True)
            except OSError as exc:
                raise ScoreCacheError(f"cannot recreate the score cache: deleting {p} failed ({exc.strerror or exc})") from None
        try:
            self._conn = self._open()
        except (sqlite3.Error, OSError) as exc:
            raise ScoreCacheError(f"cannot recreate the score cache {self.path}: {exc}") from None
        self._disabled, self.corrupt, self.recreated = None, False, True
        return 0
