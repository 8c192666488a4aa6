"""Batch assessment that never loses work: many images at once, results streamed to a JSONL file.

    from agentic_iqa import assess_many
    for r in assess_many(["a.jpg", "b.png", {"image": "c.jpg", "query": "Is it blurry? A. Yes B. No"}], concurrency=8):
        print(r.item.image, r.result.score if r.ok else r.error)

Three layers:

* **Items** (`BatchItem`): what to assess. Built from paths, a directory scan (`scan_directory`) or an
  eval manifest (`items_from_manifest`; paths in it may not leave the manifest's folder unless allowed).
* **Running** (`assess_many`): a bounded thread pool of `concurrency` assessments sharing one
  `Assessor` (one registry, one set of LMs, one compiled graph). LM calls are blocking HTTP calls in
  those threads, so they overlap; tool runs go through a gate (`tool_slots`, default 1) because every
  pyiqa forward already uses all cores through torch's intra-op threads, and running several at once
  would only oversubscribe the CPU. Items are pulled lazily, so at most `concurrency` images are in
  memory. DSPy's per-call history and trace are off for every assessment (`VLMRoles`, unless
  `lm_history: true`): both would otherwise keep every request, image included. DSPy's
  image-formatting cache is cleared as items finish, and freed heap is handed back to the OS.
* **Results file** (`ResultsFile`, `run_batch`): one JSON line per item, written with a single
  `write` and fsync'd as the item finishes, so a kill loses at most the items in flight. Each line
  carries a resume key — sha256 of (path, content sha256, query, mode, configuration fingerprint) —
  so `resume=True` skips items already done and never writes a second line for one. A partial
  trailing line left by a crash is cut off (or completed, if it is a whole record missing only its
  newline); an exclusive lock keeps two batches from appending to the same file.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Optional

from agentic_iqa.config import LMSetupError, Settings

#: Bumped when the meaning of a results line changes; part of every key, so old lines are not reused.
RESULTS_FORMAT = 1

#: What a directory scan picks up (case-insensitive). Explicitly named files are taken whatever their name.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".gif"})


class BatchError(ValueError):
    """The batch cannot start (bad manifest, results file in use or not ours, …); the message says why."""


# ── items ───────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class BatchItem:
    """One assessment to run. `problem` marks an item refused before running (it still gets a line)."""

    image: str
    query: Optional[str] = None
    reference: Optional[str] = None
    mode: str = "auto"
    id: Optional[str] = None
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    problem: Optional[str] = None


def as_item(value: Any) -> BatchItem:
    """Accept a BatchItem, a path, a dict with `image` (and query/reference/mode/id/meta), or a tuple
    (image, query[, reference])."""
    if isinstance(value, BatchItem):
        return value
    if isinstance(value, (str, os.PathLike)):
        return BatchItem(image=str(value))
    if isinstance(value, Mapping):
        if "image" not in value:
            raise TypeError(f"a batch item dict needs an 'image' key: {dict(value)!r}")
        known = {k: value[k] for k in ("query", "reference", "mode", "id", "meta") if value.get(k) is not None}
        if "reference" in known:
            known["reference"] = str(known["reference"])
        return BatchItem(image=str(value["image"]), **known)
    if isinstance(value, tuple) and 1 <= len(value) <= 3:
        image, query, reference = (*value, None, None)[:3]
        return BatchItem(image=str(image), query=query, reference=None if reference is None else str(reference))
    raise TypeError(f"cannot make a batch item from {type(value).__name__}: pass a path, a dict or a BatchItem")


def scan_directory(folder: str | Path, recursive: bool = False) -> list[Path]:
    """Image files in `folder` (by extension), sorted; hidden files and folders are skipped. Symlinked
    folders are not followed (no loops); symlinked files are taken."""
    root = Path(folder)
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")) if recursive else []
        for name in filenames:
            if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS:
                found.append(Path(dirpath) / name)
    return sorted(found)


def items_from_paths(
    paths: Iterable[str | Path],
    *,
    recursive: bool = False,
    query: Optional[str] = None,
    reference: Optional[str] = None,
    mode: str = "auto",
) -> tuple[list[BatchItem], list[str]]:
    """Items for files and folders given on the command line, and notes (e.g. an empty folder).

    Files are taken as named, whatever their extension (a missing one becomes a failed item with the
    reason); folders are scanned for image files."""
    items: list[BatchItem] = []
    notes: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = scan_directory(p, recursive)
            if not found:
                hint = "" if recursive else " (pass --recursive to include subfolders)"
                notes.append(f"{raw}: no image files found{hint}")
            items.extend(BatchItem(image=str(f), query=query, reference=reference, mode=mode) for f in found)
        else:
            items.append(BatchItem(image=str(raw), query=query, reference=reference, mode=mode))
    return items, notes


def _inside(path: Path, base: Path) -> bool:
    try:
        path.relative_to(base)
        return True
    except ValueError:
        return False


def manifest_query(question: Optional[str], options: Optional[Mapping[str, str]]) -> Optional[str]:
    """A manifest row's question with its options appended the way the planner reads them ("A. Yes B. No")."""
    if not question:
        return None
    if not options:
        return question
    return question.rstrip() + " " + " ".join(f"{k}. {v}" for k, v in options.items())


def items_from_manifest(
    path: str | Path,
    *,
    query: Optional[str] = None,
    mode: str = "auto",
    allow_outside: bool = False,
) -> tuple[list[BatchItem], list[str]]:
    """Items for an eval manifest (JSONL; `agentic_iqa.bench.manifest`), and its unusable rows.

    Paths are relative to the manifest. A path that resolves outside the manifest's folder (absolute,
    `..`, or a symlink pointing out) is refused unless `allow_outside`: a manifest from elsewhere must
    not be able to send arbitrary files of this machine to a remote model. Refused rows still become
    items (failed, with the reason), so the results file accounts for every row. A row's question
    (with options) overrides `query`; its other fields are kept as `meta` in the results line."""
    from agentic_iqa.bench.manifest import read_manifest

    path = Path(path)
    if not path.is_file():
        raise BatchError(f"manifest {path} does not exist" if not path.exists() else f"manifest {path} is not a file")
    try:
        rows, problems = read_manifest(path, check_files=False, require_target=False)
    except (OSError, UnicodeDecodeError) as exc:
        raise BatchError(f"manifest {path} cannot be read: {exc}") from None
    base = path.parent.resolve()
    items: list[BatchItem] = []
    for row in rows:
        refused = []
        for label, value in (("image", row.image), ("reference", row.reference)):
            if value is None:
                continue
            target = (path.parent / value).resolve()
            if not allow_outside and not _inside(target, base):
                refused.append(f"{label} {value!r} resolves outside the manifest's folder {base}; "
                               "refused (pass --allow-absolute to allow paths outside it)")
        meta = row.model_dump(exclude_none=True, exclude={"image", "reference", "question", "options", "id"})
        if row.question is not None:
            meta["question"] = row.question
            if row.options:
                meta["options"] = row.options
        items.append(BatchItem(
            image=str(path.parent / row.image),
            reference=None if row.reference is None else str(path.parent / row.reference),
            query=manifest_query(row.question, row.options) or query,
            mode=mode,
            id=row.id,
            meta=meta,
            problem="; ".join(refused) or None,
        ))
    return items, [str(p) for p in problems]


# ── keys ────────────────────────────────────────────────────────────────────────────────────────


def _sha256_file(path: Path) -> Optional[str]:
    h = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def config_fingerprint(settings: Settings) -> str:
    """A short hash of everything in the configuration that can change an answer.

    Left out: where the cache lives and transport settings (retries, timeouts) — resuming with a
    longer timeout must not redo finished items. Compiled programs and extra tool tables count by
    content, not by path."""
    data = settings.model_dump(mode="json", exclude={"config_dir": True, "config_files": True, "pipeline": {"cache"}})
    for role in data["backends"].values():
        role.pop("num_retries", None)
        role.pop("timeout", None)
    files = {
        str(p): _sha256_file(Path(p)) or "missing"
        for p in [*settings.pipeline.programs.values(), *settings.pipeline.tools.extra_tables]
    }
    blob = json.dumps({"format": RESULTS_FORMAT, "settings": data, "files": files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _abs(path: str) -> str:
    """Absolute, normalized, symlinks kept: the same file named the same way keys the same."""
    if "://" in path[:12]:
        return path  # a URL: refused later with a hint, but keyed as given
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()


@dataclass
class PreparedItem:
    """An item with its resume keys. `identity` ignores file contents (it names the item); `key`
    includes them (it names the result)."""

    index: int
    item: BatchItem
    query: str
    image_sha256: Optional[str]
    reference_sha256: Optional[str]
    identity: str
    key: str


def prepare_item(index: int, item: BatchItem, settings: Settings, fingerprint: str) -> PreparedItem:
    """Hash the item's files (cheap next to an assessment) and derive its keys. Never raises for a bad
    file: an unreadable one hashes to None and the assessment reports why."""
    from agentic_iqa.api import prepare_query

    query, _ = prepare_query(item.query, settings.pipeline.max_query_chars)
    image = _abs(item.image)
    reference = _abs(item.reference) if item.reference else None
    image_sha = None if item.problem else _sha256_file(Path(image))
    ref_sha = None if (item.problem or reference is None) else _sha256_file(Path(reference))
    identity = _digest(RESULTS_FORMAT, image, reference, query, item.mode, item.id, fingerprint)
    return PreparedItem(index, item, query, image_sha, ref_sha, identity, _digest(identity, image_sha, ref_sha))


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
        return _finite(rec)


def _finite(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings ("NaN", "Infinity"), as the state models do."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# ── running ─────────────────────────────────────────────────────────────────────────────────────


class _GatedRegistry:
    """The shared ToolRegistry with at most `slots` tool runs at a time across the batch's threads.

    The registry already serializes each metric (one lock per metric), but different metrics could
    still run at once, each with torch's intra-op thread pool sized to all cores; on a CPU that only
    adds contention. Everything but running a tool is passed through untouched."""

    def __init__(self, registry: Any, slots: int):
        self._registry = registry
        self._gate = threading.BoundedSemaphore(max(1, slots))
        self._lock = threading.Lock()
        self.active = 0
        self.peak = 0  # the most tool runs seen at once (tests check the gate holds)

    def _gated(self, fn: Callable, *args, **kwargs):
        with self._gate:
            with self._lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.active -= 1

    def run(self, *args, **kwargs):
        return self._gated(self._registry.run, *args, **kwargs)

    def score(self, *args, **kwargs):
        return self._gated(self._registry.score, *args, **kwargs)

    def score_many(self, *args, **kwargs):
        return self._gated(self._registry.score_many, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._registry, name)


def _bad_input_types() -> tuple[type, ...]:
    from iqa_tools import ImageError

    # ImageError covers missing, unreadable, empty, corrupt, too large and mismatched images.
    return (ImageError, FileNotFoundError, IsADirectoryError, PermissionError)


def _forget_images() -> None:
    """Drop DSPy's per-image formatting cache (`Image.format` is an lru_cache of 32 entries, each
    holding the image twice as a base64 data URL): a finished item's image must not stay in memory.
    Items still running just format theirs again (a data URL formats to itself)."""
    import sys

    dspy = sys.modules.get("dspy")
    fmt = getattr(getattr(dspy, "Image", None), "format", None)
    if fmt is not None and hasattr(fmt, "cache_clear"):
        fmt.cache_clear()


def _trim_heap() -> None:
    """Give freed heap memory back to the OS (glibc only; elsewhere a no-op).

    Each assessment allocates and frees tens of MB (decoded images, base64 request bodies, tool
    buffers) in several threads; glibc keeps such freed memory in per-thread arenas, so a long batch's
    resident size would climb by hundreds of MB without holding anything. `malloc_trim(0)` releases it
    (~0.1 s with a 2 GB heap, so it runs once per `concurrency` finished items, not per item)."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _malloc_trim = libc.malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


class BatchRunner:
    """Runs prepared items on one Assessor with bounded concurrency; see `assess_many`."""

    def __init__(self, assessor: Any, *, concurrency: int = 4, tool_slots: int = 1, use_cache: bool = True,
                 resize_reference: bool = False):
        from agentic_iqa.api import Assessor

        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1 (got {concurrency})")
        self.concurrency = concurrency
        self.use_cache = use_cache
        self.resize_reference = resize_reference
        self.settings: Settings = assessor.settings
        self.fingerprint = config_fingerprint(self.settings)
        # Same registry, roles and settings; only tool runs are gated. The graph is rebuilt (~ms).
        self.gate = _GatedRegistry(assessor.registry, tool_slots)
        self.assessor = Assessor(self.settings, registry=self.gate, roles=assessor.roles)
        _ = self.assessor.graph  # build now: a configuration problem stops the batch before any item
        self.stopped: Optional[str] = None  # why no further items were started (the LM is set up wrong)

    def prepare(self, index: int, item: BatchItem) -> PreparedItem:
        return prepare_item(index, item, self.settings, self.fingerprint)

    def run_one(self, prep: PreparedItem | tuple[int, BatchItem]) -> ItemResult:
        """Assess one item; never raises (an unexpected failure is the item's `error`)."""
        t0 = time.perf_counter()
        if not isinstance(prep, PreparedItem):
            prep = self.prepare(*prep)
        item = prep.item
        base = dict(index=prep.index, item=item, key=prep.key, identity=prep.identity, query=prep.query,
                    image_sha256=prep.image_sha256, reference_sha256=prep.reference_sha256)
        if item.problem:
            return ItemResult(status="failed", error=item.problem, error_type="bad_input", **base)
        try:
            result = self.assessor.assess(
                item.image, item.query, item.reference, mode=item.mode, use_cache=self.use_cache,
                resize_reference=self.resize_reference,
            )
        except _bad_input_types() as exc:
            return ItemResult(status="failed", error=str(exc), error_type="bad_input",
                              seconds=time.perf_counter() - t0, **base)
        except LMSetupError as exc:  # every later item would fail the same way: `run` stops taking items
            return ItemResult(status="failed", error=str(exc), error_type="lm_setup",
                              seconds=time.perf_counter() - t0, **base)
        except Exception as exc:  # noqa: BLE001 - one item's crash must not take the batch down
            return ItemResult(status="failed", error=f"{type(exc).__name__}: {exc}", error_type="error",
                              seconds=time.perf_counter() - t0, **base)
        finally:
            _forget_images()
        return ItemResult(status="ok", result=result, seconds=time.perf_counter() - t0, **base)

    def run(self, items: Iterable[PreparedItem | tuple[int, BatchItem]]) -> Iterator[ItemResult]:
        """Yield results as they complete. At most `concurrency` items are taken from `items` ahead of
        their results, so a huge (or endless) iterable is fine. Stopping the iteration early (break,
        Ctrl-C) cancels what has not started; running items finish in the background. After an item
        fails because the LM is set up wrong, no new item starts (`self.stopped` says why)."""
        source = iter(items)
        pool = cf.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="agentic-iqa-batch")
        pending: set[cf.Future] = set()

        def refill() -> None:
            while len(pending) < self.concurrency and self.stopped is None:
                nxt = next(source, None)
                if nxt is None:
                    return
                pending.add(pool.submit(self.run_one, nxt))

        finished = 0
        try:
            refill()
            while pending:
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                pending -= done
                results = [fut.result() for fut in done]
                if self.stopped is None:
                    self.stopped = next((r.error for r in results if r.error_type == "lm_setup"), None)
                refill()  # keep the workers busy while the caller handles what finished
                finished += len(done)
                if finished >= self.concurrency:
                    finished = 0
                    _trim_heap()
                yield from results
        finally:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=False, cancel_futures=True)


def assess_many(
    items: Iterable[Any],
    *,
    concurrency: int = 4,
    lm: Optional[str] = None,
    config: Optional[str | Path] = None,
    assessor: Any = None,
    use_cache: bool = True,
    resize_reference: bool = False,
    tool_slots: int = 1,
    **settings_kw: Any,
) -> Iterator[ItemResult]:
    """Assess many images; yield an `ItemResult` for each as it completes (not in input order: see
    `.index`). Every item yields exactly once — a bad image or an unexpected failure is a `failed`
    result with the reason, never an exception that ends the loop.

    items: paths, dicts ({"image", "query", "reference", "mode", "id", "meta"}), (image, query[,
        reference]) tuples or BatchItems; any iterable, consumed lazily.
    concurrency: assessments at once (LM calls overlap; tool runs are gated to `tool_slots`).
    lm / config / api_base= / backend=: as for `assess()`; or pass a ready `assessor`.
    """
    if assessor is None:
        from agentic_iqa.api import get_assessor

        assessor = get_assessor(config, lm, **settings_kw)
    runner = BatchRunner(assessor, concurrency=concurrency, tool_slots=tool_slots, use_cache=use_cache,
                         resize_reference=resize_reference)
    yield from runner.run((i, as_item(x)) for i, x in enumerate(items))
    if runner.stopped:  # the rest cannot succeed either: say why instead of failing item after item
        raise LMSetupError(runner.stopped)


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

    def _read_and_repair(self) -> ResumeState:
        assert self._fd is not None
        state = ResumeState()
        with open(self.path, "rb") as fh:
            data = fh.read()
        body, sep, tail = data.rpartition(b"\n")
        complete = body + sep
        if tail:
            rec = _parse_record(tail)
            if rec is not None:
                # A whole record that lacks only its newline (e.g. the file was edited): keep it.
                self._write_all(b"\n")
                complete = data + b"\n"
                state.completed_partial = True
            else:
                # Our writer puts a record and its newline in one write; a crash inside that write
                # leaves a prefix. Cut it off; that item is simply run again.
                os.ftruncate(self._fd, len(complete))
                os.fsync(self._fd)
                state.repaired_bytes = len(tail)
        lines = complete.split(b"\n")[:-1] if complete else []
        for line in lines:
            if not line.strip():
                continue
            rec = _parse_record(line)
            if rec is None:
                state.unreadable_lines += 1
            else:
                state.records.append(rec)
        if lines and not state.records and state.unreadable_lines:
            self.close()
            raise BatchError(f"{self.path} does not look like an agentic-iqa results file (no result records in it); choose another --out")
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


# ── a whole batch: items → results file ─────────────────────────────────────────────────────────


@dataclass
class BatchSummary:
    """What a batch did; `status` says how it ended (the CLI maps it to an exit code)."""

    out: str
    total: int = 0                # items in the input (manifest rows included)
    ran: int = 0                  # items assessed (or refused) in this run
    ok: int = 0
    degraded: int = 0             # ok, but with a fallback recorded
    failed: int = 0
    already_done: int = 0         # skipped: a complete line was already in the results file
    failed_before: int = 0        # skipped: failed in an earlier run (retry with retry_failed)
    duplicates: int = 0           # skipped: the same item appears twice in the input
    manifest_problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # {"image", "error", "error_type"}, first 50
    repaired_bytes: int = 0
    replaced_lines: int = 0       # earlier lines replaced: retried failures, or results for changed files
    interrupted: bool = False
    stopped: Optional[str] = None  # why the batch stopped taking items (the LM is set up wrong)
    not_attempted: int = 0        # items not started because of `stopped` (run again with --resume)
    seconds: float = 0.0
    scores: list[float] = field(default_factory=list, repr=False)
    config: str = ""

    @property
    def skipped(self) -> int:
        return self.failed + self.failed_before + len(self.manifest_problems)

    @property
    def status(self) -> str:
        """How the batch ended: "interrupted", "stopped" (the LM is set up wrong), "partial" (some items
        skipped) or "ok". The CLI maps these to its exit codes."""
        if self.interrupted:
            return "interrupted"
        if self.stopped:
            return "stopped"
        return "partial" if self.skipped else "ok"

    @property
    def rate(self) -> float:
        return self.ran / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        mean = sum(self.scores) / len(self.scores) if self.scores else None
        return {
            "out": self.out, "total": self.total, "ran": self.ran, "ok": self.ok, "degraded": self.degraded,
            "failed": self.failed, "already_done": self.already_done, "failed_before": self.failed_before,
            "duplicates": self.duplicates, "manifest_problems": self.manifest_problems, "notes": self.notes,
            "failures": self.failures, "repaired_bytes": self.repaired_bytes, "replaced_lines": self.replaced_lines,
            "interrupted": self.interrupted, "stopped": self.stopped, "not_attempted": self.not_attempted, "seconds": round(self.seconds, 3), "items_per_second": round(self.rate, 4),
            "mean_score": None if mean is None else round(mean, 4), "config": self.config, "status": self.status,
        }


def plan_resume(
    prepared: list[PreparedItem], state: ResumeState, *, retry_failed: bool
) -> tuple[list[PreparedItem], set[str], dict[str, int]]:
    """Split prepared items into those to run and those already settled by the results file.

    Returns (to_run, identities whose old lines must go, counts). An item is done when a complete
    `ok` line has its key. A `failed` line settles the item by identity (its file may be unreadable,
    so content cannot key it) unless `retry_failed`. An `ok` line with the item's identity but
    another key is a result for an older version of the file (or reference): the item runs again and
    the old line is replaced, so each item keeps exactly one line."""
    ok_keys = {r["key"] for r in state.records if r.get("status") == "ok"}
    ok_identities = {r.get("identity") for r in state.records if r.get("status") == "ok"}
    failed_identities = {r.get("identity") for r in state.records if r.get("status") == "failed"}
    to_run: list[PreparedItem] = []
    replace: set[str] = set()
    counts = {"already_done": 0, "failed_before": 0}
    for prep in prepared:
        if prep.key in ok_keys:
            counts["already_done"] += 1
        elif prep.image_sha256 is None and prep.identity in ok_identities:
            # The file cannot be read now (moved, deleted) but was assessed before: keep that result
            # rather than replace it with a failure.
            counts["already_done"] += 1
        elif prep.identity in failed_identities and prep.identity not in ok_identities and not retry_failed:
            counts["failed_before"] += 1
        else:
            if prep.identity in failed_identities or prep.identity in ok_identities:
                replace.add(prep.identity)
            to_run.append(prep)
    return to_run, replace, counts


def run_batch(
    items: list[BatchItem],
    out: str | Path,
    assessor: Any,
    *,
    concurrency: int = 4,
    resume: bool = False,
    retry_failed: bool = False,
    overwrite: bool = False,
    use_cache: bool = True,
    with_trace: bool = False,
    resize_reference: bool = False,
    manifest_problems: Iterable[str] = (),
    notes: Iterable[str] = (),
    on_start: Optional[Callable[[BatchSummary, int], None]] = None,
    on_result: Optional[Callable[[ItemResult, BatchSummary], None]] = None,
) -> BatchSummary:
    """Assess `items` into the JSONL file `out`, one line per item as it finishes; see the module
    docstring. `on_start(summary, n_to_run)` and `on_result(result, summary)` drive progress displays.
    Raises BatchError before any work if the file cannot be used; KeyboardInterrupt ends the batch with
    `interrupted=True` (every finished item is already on disk)."""
    t0 = time.perf_counter()
    runner = BatchRunner(assessor, concurrency=concurrency, use_cache=use_cache, resize_reference=resize_reference)
    problems = list(manifest_problems)
    summary = BatchSummary(out=str(out), total=len(items) + len(problems), manifest_problems=problems,
                           notes=list(notes), config=runner.fingerprint)
    results = ResultsFile(out)
    state = results.open(resume=resume or retry_failed, overwrite=overwrite)
    try:
        summary.repaired_bytes = state.repaired_bytes
        if state.repaired_bytes:
            summary.notes.append(f"repaired {out}: cut off a partial last line ({state.repaired_bytes} bytes) left by an interrupted run")
        if state.unreadable_lines:
            summary.notes.append(f"{out}: {state.unreadable_lines} line(s) are not result records; kept as they are, ignored")
        # Hash every file up front, in parallel: resume needs all keys before deciding what to run.
        with cf.ThreadPoolExecutor(max_workers=min(8, max(1, concurrency))) as pool:
            prepared = list(pool.map(lambda ix: runner.prepare(*ix), enumerate(items)))
        seen: set[str] = set()
        unique: list[PreparedItem] = []
        for prep in prepared:
            if prep.identity in seen:
                summary.duplicates += 1
                continue
            seen.add(prep.identity)
            unique.append(prep)
        if summary.duplicates:
            summary.notes.append(f"{summary.duplicates} item(s) appear more than once in the input; each is assessed once")
        to_run, replace, counts = plan_resume(unique, state, retry_failed=retry_failed)
        summary.already_done, summary.failed_before = counts["already_done"], counts["failed_before"]
        if summary.failed_before:
            summary.notes.append(f"{summary.failed_before} item(s) failed in an earlier run and were not retried (pass --retry-failed)")
        if replace:
            summary.replaced_lines = results.rewrite(lambda rec: rec.get("identity") not in replace)
        if on_start:
            on_start(summary, len(to_run))
        try:
            for res in runner.run(to_run):
                results.append(res.record(with_trace=with_trace, fingerprint=runner.fingerprint))
                summary.ran += 1
                if res.ok:
                    summary.ok += 1
                    summary.degraded += int(res.degraded)
                    if res.result.score is not None:
                        summary.scores.append(float(res.result.score))
                else:
                    summary.failed += 1
                    if len(summary.failures) < 50:
                        summary.failures.append({"image": res.item.image, "error": res.error, "error_type": res.error_type})
                if on_result:
                    on_result(res, summary)
            if runner.stopped:
                summary.stopped, summary.not_attempted = runner.stopped, len(to_run) - summary.ran
        except KeyboardInterrupt:
            summary.interrupted = True
    finally:
        results.close()
        summary.seconds = time.perf_counter() - t0
    return summary
