"""Running a batch: `assess_many` (a bounded pool of assessments sharing one Assessor, tool runs
through a gate) and `run_batch` (items → results file, with resume and a summary).
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from agentic_iqa.config import LMSetupError, Settings
from agentic_iqa.batch.items import (BatchError, BatchItem, PreparedItem, as_item, config_fingerprint, identify_item,
                                    is_done, prepare_item)
from agentic_iqa.batch.results import ItemResult, ResultsFile, ResumeState, manifest_problem_lines



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


#: After this many items in a row found the LM unreachable (connection refused, timeouts or server errors
#: that outlived the retries), a batch starts no new item: each would pay the whole LM budget again.
UNREACHABLE_STREAK = 2


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
        self.stopped: Optional[str] = None  # why no further items were started (LM set up wrong, or down)
        self._unreachable: list[str] = []   # the current run of items that found the LM unreachable

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
        fails because the LM is set up wrong, or UNREACHABLE_STREAK items in a row found it unreachable,
        no new item starts (`self.stopped` says why)."""
        source = iter(items)
        pool = cf.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="agentic-iqa-batch")
        pending: set[cf.Future] = set()

        def refill(limit: int) -> None:
            while limit > 0 and len(pending) < self.concurrency and self.stopped is None:
                nxt = next(source, None)
                if nxt is None:
                    return
                if len(self._unreachable) >= UNREACHABLE_STREAK:  # the circuit breaker: the server is down
                    self.stopped = (
                        f"the LM server was unreachable for {len(self._unreachable)} items in a row "
                        f"({self._unreachable[-1]}); no further items were started, so they do not each wait "
                        "through the timeout and retries (the items the offline analyst answered meanwhile are "
                        "recorded as degraded). Check the server (--api-base); once it answers, --resume "
                        "--retry-failed runs the rest and assesses those items again with the model")
                    return
                pending.add(pool.submit(self.run_one, nxt))
                limit -= 1

        finished = 0
        try:
            refill(self.concurrency)
            while pending:
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                pending -= done
                results = [fut.result() for fut in done]
                if self.stopped is None:
                    self.stopped = next((r.error for r in results if r.error_type == "lm_setup"), None)
                for r in results:
                    if r.ok and r.result.lm_unreachable:
                        self._unreachable.append(r.result.backend)
                    elif r.ok:  # the LM answered: it is up (failed items say nothing about it)
                        self._unreachable.clear()
                finished += len(done)
                if finished >= self.concurrency:
                    finished = 0
                    _trim_heap()
                for result in results:
                    # One new item per result handed out, started before the caller handles it (the
                    # workers stay busy) and never more: at most `concurrency` items are taken ahead,
                    # also when several finish at once.
                    refill(1)
                    yield result
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

    One image is `assess_many(["photo.jpg"])`: a bare path (or one dict or BatchItem) is refused with a
    TypeError at the call, since iterating it would assess each of its characters (or keys).
    """
    if isinstance(items, (str, bytes, os.PathLike, BatchItem, Mapping)):
        raise TypeError(f"assess_many takes a list (or any iterable) of items, not one {type(items).__name__} "
                        f"({items!r:.80}): pass [{items!r:.60}], or call assess() for one image")
    return _assess_many(items, concurrency, lm, config, assessor, use_cache, resize_reference, tool_slots, settings_kw)


def _assess_many(items, concurrency, lm, config, assessor, use_cache, resize_reference, tool_slots,
                 settings_kw) -> Iterator[ItemResult]:
    """assess_many's generator: the assessor is built when iteration starts, as before."""
    if assessor is None:
        from agentic_iqa.api import get_assessor

        assessor = get_assessor(config, lm, **settings_kw)
    runner = BatchRunner(assessor, concurrency=concurrency, tool_slots=tool_slots, use_cache=use_cache,
                         resize_reference=resize_reference)
    yield from runner.run((i, as_item(x)) for i, x in enumerate(items))
    if runner.stopped:  # the rest cannot succeed either: say why instead of failing item after item
        raise LMSetupError(runner.stopped)




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
    not_attempted: int = 0        # items not finished because of `stopped` or an interrupt (run again with --resume)
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


def answered_without_the_model(record: dict) -> bool:
    """Whether a results line is the offline analyst's fallback answer: the LM was unreachable, or every stage that
    asked it got no usable reply (a server answering with no chat completion, a model that never wrote the format)."""
    from agentic_iqa.api import UNREACHABLE_BACKEND, UNUSABLE_BACKEND

    return record.get("status") == "ok" and str(record.get("backend") or "").startswith((UNREACHABLE_BACKEND,
                                                                                         UNUSABLE_BACKEND))


def plan_resume(
    prepared: list[PreparedItem], state: ResumeState, *, retry_failed: bool
) -> tuple[list[PreparedItem], set[str], dict[str, int]]:
    """Split prepared items into those to run and those already settled by the results file.

    Returns (to_run, identities whose old lines must go, counts). An item is done when a complete
    `ok` line has its key. A `failed` line settles the item by identity (its file may be unreadable,
    so content cannot key it) unless `retry_failed`, or its files' contents are not those the failure saw.
    With `retry_failed`, an `ok` line the offline analyst answered in the model's place (unreachable, or no
    usable reply: `answered_without_the_model`) counts as failed too: after an outage or a broken server, the
    documented recovery redoes it with the model instead of mixing models in one results file. An `ok` line
    with the item's identity but another key is a result for an older version of the file (or reference):
    the item runs again and the old line is replaced, so each item keeps exactly one line.

    Items only identified (not hashed: `identify_item`) are decided by identity here; the ones with
    earlier `ok` lines run with those lines' keys in `done_keys`, and whoever hashes them skips the
    done ones (`is_done`) and replaces the stale lines of the rest after writing their new ones."""
    ok_keys: dict[str, list[str]] = {}
    without_model: set[str] = set()  # identities the offline analyst answered in the model's place
    for r in state.records:
        if r.get("status") == "ok":
            if retry_failed and answered_without_the_model(r):  # not the configured model's answer: redone like a failure
                without_model.add(r.get("identity"))
            else:
                ok_keys.setdefault(r.get("identity"), []).append(r["key"])
    # The file contents each failed line saw: a failure is settled only while its files are unchanged. Its
    # content key says so too (a Ray shard row records no reference hash, only the key that includes it).
    failed_contents: dict[str, set] = {}
    failed_keys: dict[str, set] = {}
    for r in state.records:
        if r.get("status") == "failed":
            failed_contents.setdefault(r.get("identity"), set()).add((r.get("image_sha256"), r.get("reference_sha256")))
            failed_keys.setdefault(r.get("identity"), set()).add(r.get("key"))
    failed_identities = set(failed_contents) | without_model
    to_run: list[PreparedItem] = []
    replace: set[str] = set()
    counts = {"already_done": 0, "failed_before": 0}
    for prep in prepared:
        done = ok_keys.get(prep.identity, ())
        # A fixed image (replaced, or a missing one that appeared) is assessed again without --retry-failed,
        # as a changed image is. Items only identified have no contents to compare (`plan_batch` hashes
        # those that failed before).
        unchanged = (not prep.hashed or prep.key in failed_keys.get(prep.identity, ())
                     or (prep.image_sha256, prep.reference_sha256) in failed_contents.get(prep.identity, ()))
        if prep.hashed and is_done(prep, done):
            counts["already_done"] += 1
        elif prep.identity in failed_identities and not done and not retry_failed and unchanged:
            counts["failed_before"] += 1
        else:
            if prep.identity in failed_identities or (done and prep.hashed):
                replace.add(prep.identity)
            if not prep.hashed:
                prep.done_keys = tuple(done)
            to_run.append(prep)
    return to_run, replace, counts


def plan_batch(
    items: list[BatchItem],
    *,
    settings: Settings,
    fingerprint: str,
    state: ResumeState,
    summary: BatchSummary,
    retry_failed: bool,
    workers: int = 8,
    hash_contents: bool = True,
) -> tuple[list[PreparedItem], set[str]]:
    """Items → (items to run, identities whose earlier results must go), shared by every engine: key
    each item (files hashed in parallel: resume needs every key before deciding what to run), keep the
    first of items that appear twice, and split by `plan_resume`. `summary` gets the duplicates,
    already_done and failed_before counts and their notes.

    hash_contents=False (the Ray driver): items are only identified; the content keys are computed
    where the items run (see `plan_resume`), and `already_done` is counted there. Only the files of items
    that failed before are read here (few), unless `retry_failed`: a failure is settled only while its
    files are unchanged, so a fixed image runs again, as in a local batch."""
    prepare = lambda ix: prepare_item(ix[0], ix[1], settings, fingerprint)  # noqa: E731
    if hash_contents:
        with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            prepared = list(pool.map(prepare, enumerate(items)))
    else:
        prepared = [identify_item(i, item, settings, fingerprint) for i, item in enumerate(items)]
        failed = set() if retry_failed else {r.get("identity") for r in state.records if r.get("status") == "failed"}
        again = [p for p in prepared if p.identity in failed]
        if again:
            with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                for prep in pool.map(lambda p: prepare((p.index, p.item)), again):
                    prepared[prep.index] = prep
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
    other_config = sum(1 for r in state.records if r.get("config") not in (None, "", fingerprint))
    if other_config:
        summary.notes.append(
            f"{other_config} earlier result line(s) in the results file were made with another configuration "
            "(model, server, fusion, programs, …): kept, not reused, so their items run again beside them; "
            "use another --out to keep runs apart")
    summary.already_done, summary.failed_before = counts["already_done"], counts["failed_before"]
    if summary.failed_before:
        summary.notes.append(f"{summary.failed_before} item(s) failed in an earlier run and were not retried (pass --retry-failed)")
    if not retry_failed:
        ids = {p.identity for p in unique}
        fell_back = sum(1 for r in state.records if r.get("identity") in ids and answered_without_the_model(r))
        if fell_back:
            summary.notes.append(
                f"{fell_back} earlier result(s) were answered by the offline analyst because the LM was unreachable "
                "or gave no usable reply; kept (pass --retry-failed to assess them again with the model)")
    return to_run, replace


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
        to_run, replace = plan_batch(items, settings=runner.settings, fingerprint=runner.fingerprint, state=state,
                                     summary=summary, retry_failed=retry_failed, workers=min(8, max(1, concurrency)))
        # A problem line whose row has been fixed (or whose line moved) since is dropped, as a stale result is.
        new_problems, stale_problems = manifest_problem_lines(problems, runner.fingerprint, state.records)
        if replace or stale_problems:
            summary.replaced_lines = results.rewrite(
                lambda rec: rec.get("identity") not in replace and rec.get("key") not in stale_problems)
        for rec in new_problems:
            results.append(rec)
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
            summary.not_attempted = len(to_run) - summary.ran  # not finished: --resume runs them
    finally:
        results.close()
        summary.seconds = time.perf_counter() - t0
    return summary
