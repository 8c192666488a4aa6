"""The results file: one JSON line per item (`ItemResult`), written with one `write` and fsync'd as the
item finishes, locked against a second writer, repaired after a crash, read back for `--resume`.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Literal, Optional
from agentic_iqa.batch.items import BatchError, BatchItem
from agentic_iqa.redact import redact_data




# ── results ─────────────────────────────────────────────────────────────────────────────────────


@dataclass
class ItemResult:
    """How one item ended: `ok` with an AssessmentResult (possibly degraded), or `failed` with why."""

    index: int
    item: BatchItem
    status: Literal["ok", "failed"]
    result: Any = None  # AssessmentResult
    error: Optional[str] = None
    error_type: Optional[Literal["bad_input", "lm_setup", "error"]] = None
    seconds: float = 0.0
    key: str = ""
    identity: str = ""
    image_sha256: Optional[str] = None
    reference_sha256: Optional[str] = None
    query: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def degraded(self) -> bool:
        """Completed, but something fell back (a tool, a role, the LM): the result says what."""
        return self.ok and bool(self.result.fallbacks)

    def record(self, *, with_trace: bool = False, fingerprint: str = "") -> dict:
        """The JSON line for the results file (strict JSON: non-finite numbers become strings)."""
        r = self.result
        rec: dict[str, Any] = {
            "key": self.key,
            "identity": self.identity,
            "status": self.status,
            "id": self.item.id,
            "image": self.item.image,
            "reference": self.item.reference,
            "query": self.query,
            "mode": r.mode if r is not None else self.item.mode,
            "answer": r.answer if r is not None else None,
            "level": r.level if r is not None else None,
            "score": r.score if r is not None else None,
            "backend": r.backend if r is not None else None,
            "degraded": self.degraded,
            "error": self.error,
            "error_type": self.error_type,
            "seconds": round(self.seconds, 4),
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "image_sha256": self.image_sha256,
            "reference_sha256": self.reference_sha256,
            "config": fingerprint,
        }
        if self.item.meta:
            rec["meta"] = dict(self.item.meta)
        if r is not None:
            rec["result"] = json.loads(r.model_dump_json(exclude=None if with_trace else {"trace"}))
        return redact_data(_finite(rec))  # error messages may quote a server that echoed a key


def manifest_problem_record(problem: str, fingerprint: str = "") -> dict:
    """The results line of a manifest row that could not be read (bad JSON, a missing field): the file
    accounts for every row, as the README promises. Keyed by the problem's text (it names the line), so
    a resume neither repeats it nor keeps it once the row is fixed (`manifest_row` marks these lines)."""
    from agentic_iqa.batch.items import digest

    key = digest("manifest problem", problem)
    return redact_data({
        "key": key, "identity": key, "status": "failed", "id": None, "image": None, "reference": None,
        "query": None, "mode": None, "answer": None, "level": None, "score": None, "backend": None,
        "degraded": False, "error": f"manifest {problem}", "error_type": "bad_input", "manifest_row": True,
        "seconds": 0.0, "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "image_sha256": None, "reference_sha256": None, "config": fingerprint,
    })


def manifest_problem_lines(problems: list[str], fingerprint: str, records: list[dict]) -> tuple[list[dict], set[str]]:
    """What a run does with its unusable manifest rows, given the records already written (every engine):
    (the problem lines to write, those not written yet: each once across resumes; the keys of earlier
    problem lines to drop, their row fixed since or their line moved). A problem line's identity is its key."""
    current = {rec["key"]: rec for rec in (manifest_problem_record(p, fingerprint) for p in problems)}
    stale = {r["key"] for r in records if r.get("manifest_row") and r.get("key") not in current}
    written = {r.get("key") for r in records}
    return [rec for key, rec in current.items() if key not in written], stale


def _finite(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings ("NaN", "Infinity"), as the state models do."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value




# ── the results file ────────────────────────────────────────────────────────────────────────────


@dataclass
class ResumeState:
    """What an existing results file holds, read when a batch resumes it."""

    records: list[dict] = field(default_factory=list)  # every complete line, parsed
    repaired_bytes: int = 0       # a partial trailing line of this many bytes was cut off
    completed_partial: bool = False  # the trailing line was a whole record missing its newline
    unreadable_lines: int = 0     # complete lines that are not JSON records (kept, ignored)


class ResultsFile:
    """An append-only JSONL results file, locked against a second writer while open."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: Optional[int] = None

    # -- opening ---------------------------------------------------------------------------------
    def open(self, *, resume: bool = False, overwrite: bool = False) -> ResumeState:
        if self.path.is_dir():
            raise BatchError(f"--out {self.path} is a directory; give a file name such as {self.path / 'results.jsonl'}")
        if os.path.lexists(self.path) and not self.path.is_file():
            raise BatchError(f"--out {self.path} is not a regular file (a device, FIFO, socket or broken link); "
                             "give a file name such as results.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise BatchError(f"cannot open results file {self.path}: {exc.strerror}") from None
        self._lock(fd)
        self._fd = fd
        if created:
            _fsync_dir(self.path.parent)  # the new file's name survives a crash too
        size = os.fstat(fd).st_size
        if size and not (resume and not overwrite) and not self._starts_with_a_record():
            # Never clobbered, never offered to: `--out c.jpg` for `c.jsonl` must not cost the photo.
            self.close()
            raise BatchError(f"{self.path} is not an agentic-iqa results file (it does not start with a result line); "
                             "choose another --out (--overwrite only replaces a results file)")
        if size and overwrite:
            os.ftruncate(fd, 0)
            os.fsync(fd)
            return ResumeState()
        if size and not resume:
            self.close()
            raise BatchError(
                f"{self.path} already holds results; pass --resume to continue it (finished items are skipped), "
                "or --overwrite to start over"
            )
        return self._read_and_repair() if size else ResumeState()

    @staticmethod
    def _lock(fd: int) -> None:
        try:
            import fcntl
        except ImportError:  # not on POSIX: no lock, the user must not run two batches on one file
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BatchError("another agentic-iqa batch is writing this results file; wait for it or choose another --out") from None

    def _starts_with_a_record(self) -> bool:
        """Whether the file's first line is one of our records (or the cut-off start of one)."""
        with open(self.path, "rb") as fh:
            head = fh.read(1 << 20).lstrip()
        first = head.split(b"\n", 1)[0]
        return _parse_record(first) is not None or (b"\n" not in head and head.startswith(b'{"key":'))

    def _read_and_repair(self) -> ResumeState:
        assert self._fd is not None
        state = ResumeState()
        with open(self.path, "rb") as fh:
            data = fh.read()
        body, sep, tail = data.rpartition(b"\n")
        complete = body + sep
        last = _parse_record(tail) if tail else None
        if last is not None:
            complete = data + b"\n"  # a whole record that lacks only its newline (e.g. the file was edited)
        lines = complete.split(b"\n")[:-1] if complete else []
        for line in lines:
            if not line.strip():
                continue
            rec = _parse_record(line)
            if rec is None:
                state.unreadable_lines += 1
            else:
                state.records.append(rec)
        ours_cut_off = tail.lstrip().startswith(b'{"key":')  # a crash during the very first write
        if not state.records and (state.unreadable_lines or (tail and not ours_cut_off)):
            # Checked before any repair below writes: a file that is not ours is left exactly as it was.
            self.close()
            raise BatchError(f"{self.path} does not look like an agentic-iqa results file (no result records in it); choose another --out")
        if last is not None:
            self._write_all(b"\n")  # keep that record
            state.completed_partial = True
        elif tail:
            # Our writer puts a record and its newline in one write; a crash inside that write leaves a
            # prefix. Cut it off; that item is simply run again.
            os.ftruncate(self._fd, len(complete))
            os.fsync(self._fd)
            state.repaired_bytes = len(tail)
        return state

    # -- writing ---------------------------------------------------------------------------------
    def append(self, record: dict) -> None:
        """Write one record as one line, in one write call, and fsync before returning."""
        line = json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
        self._write_all(line.encode("utf-8"))
        os.fsync(self._fd)

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None, "results file is not open"
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def rewrite(self, keep: Callable[[dict], bool]) -> int:
        """Drop the records `keep` rejects (e.g. failed items about to be retried); crash-safe: the new
        content goes to a locked temporary file that then replaces the old one. Returns lines dropped."""
        assert self._fd is not None
        with open(self.path, "rb") as fh:
            lines = fh.read().split(b"\n")
        kept, dropped = [], 0
        for line in lines:
            if not line.strip():
                continue
            rec = _parse_record(line)
            if rec is not None and not keep(rec):
                dropped += 1
            else:
                kept.append(line)
        if not dropped:
            return 0
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            self._lock(fd)  # locked before it takes the name, so no second writer can slip in
            payload = b"".join(line + b"\n" for line in kept)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(self._fd)
        self._fd = fd
        return dropped

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None

    def __enter__(self) -> "ResultsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _parse_record(line: bytes) -> Optional[dict]:
    try:
        rec = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("key"), str) and "status" in rec else None


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not support fsync on directories
    finally:
        os.close(fd)


