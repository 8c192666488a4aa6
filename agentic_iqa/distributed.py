"""Scale-out on Ray Data: assess a `ray.data.Dataset` of images on a cluster, with the same results
as one machine.

    import ray
    from agentic_iqa.distributed import assess_dataset
    ds = ray.data.from_items([{"image": "/data/a.jpg"}, {"image": "/data/b.png", "query": "Is it blurry?"}])
    assess_dataset(ds, offline=True, concurrency=4).write_parquet("/data/quality")

How it runs:

* **Workers** (`_AssessWorker`): `map_batches` with a callable class, so each actor of the pool builds
  one `Assessor` (tool registry with its metric instances, LM clients, graph) once and reuses it for
  every batch. Inside a batch, items go through the local batch runner (`BatchRunner`, as in
  `assess_many`), so model calls overlap on `threads_per_worker` threads while tool runs take turns,
  exactly as on one machine. Each input row gets one output row: the item rules are the local ones (a
  missing, corrupt or refused item is a `failed` row with the reason). Workers also compute the resume
  keys (content hashes): a row whose key is among its `done_keys` is `already_done`, not assessed.
* **Coordinator** (`Coordinator`, one small async actor per run): the cluster-wide cap on LM
  requests in flight (a lease semaphore; leases expire, so a killed worker cannot leak slots), the
  cluster-wide back-off after a 429 (every worker's next request waits), the circuit breaker (an LM
  set up wrong stops every worker from starting items: those rows are `not_attempted`) and a few
  counters. Each worker's LMs do their retries through the coordinator: one HTTP attempt = one lease.
* **Faults**: workers run with `max_restarts=-1` and `max_task_retries=-1`, so a killed actor is
  restarted and its batch re-run; a batch's rows are emitted once, when the batch finishes, so no
  item is lost or duplicated.

The CLI side (`run_cli_batch`: `agentic-iqa assess … --engine ray --out DIR`) writes JSONL or
Parquet shards through Ray's datasinks and resumes with the local batch's keys. Its driver reads no
image: it lists the items, computes their identities (path, query, mode, configuration) and gives each
row the keys of that identity's earlier `ok` rows (`done_keys`); the worker that hashes the file skips
it when its key is among them. Per row, not a cluster-wide done-set: no actor holds millions of keys,
and the driver only holds what `--resume` already read from the shards. Nothing here is
imported unless `--engine ray` is asked for.
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

#: Result columns added to every row (nested values as JSON text, so every shard has one schema).
RESULT_COLUMNS = (
    "status", "answer", "level", "score", "backend", "degraded", "distortions", "tool_scores", "error",
    "error_type", "key", "identity", "image_sha256", "config", "seconds", "result",
)
#: Columns of the input rows the workers read (others pass through untouched).
ITEM_COLUMNS = ("image", "query", "reference", "mode", "id", "problem", "done_keys")
NOT_ATTEMPTED = "not_attempted"
#: Status of a row whose content key is among its `done_keys` (resume): dropped before writing.
ALREADY_DONE = "already_done"
#: Optional input column: the keys of the item's earlier `ok` results (the CLI's resume fills it).
DONE_KEYS = "done_keys"
COORDINATOR_WAIT = 5.0  # seconds the end of a run waits for the coordinator's summary (the CLI's Ctrl-C grace is 10 s)


def _ray():
    try:
        import ray
    except ImportError:
        from agentic_iqa.config import ConfigError

        raise ConfigError("--engine ray needs Ray: install the extra with  pip install 'agentic-iqa[ray]'") from None
    return ray


# ── the one place that reaches into the local batch module (re-point here after a restructure) ──


def _batch():
    from agentic_iqa import batch

    return batch


# ── coordinator: global LM cap, cluster-wide back-off, circuit breaker ──────────────────────────


class Coordinator:
    """State shared by all workers of a run. Runs as an async Ray actor (`make_coordinator`)."""

    def __init__(self, max_in_flight: Optional[int] = None, lease_seconds: float = 600.0):
        import asyncio

        self._asyncio = asyncio
        self.cap = max_in_flight
        self.lease_seconds = lease_seconds
        self.leases: dict[int, float] = {}
        self.next_token = 0
        self.peak = 0
        self.paused_until = 0.0
        self.pauses = 0
        self.stopped: Optional[str] = None
        self.counts = {"ok": 0, "failed": 0, NOT_ATTEMPTED: 0, ALREADY_DONE: 0, "batches": 0}
        self.keep: dict[str, str] = {}  # identity → current key, for identities left with two rows
        self.timing: dict[str, dict] = {}  # per actor: its batches' spans and item times (bounded by actors)
        self.workers: dict[str, Any] = {}

    async def acquire(self) -> int:
        """A lease for one LM request: waits while the cap is reached or the cluster is backing off."""
        while True:
            now = time.monotonic()
            for token, expiry in list(self.leases.items()):
                if expiry < now:  # its holder died or hung: reclaim the slot
                    del self.leases[token]
            if now >= self.paused_until and (self.cap is None or len(self.leases) < self.cap):
                self.next_token += 1
                self.leases[self.next_token] = now + self.lease_seconds
                self.peak = max(self.peak, len(self.leases))
                return self.next_token
            wait = self.paused_until - now if now < self.paused_until else 0.005
            await self._asyncio.sleep(min(max(wait, 0.001), 0.05))

    async def release(self, token: int) -> None:
        self.leases.pop(token, None)

    async def back_off(self, seconds: float) -> None:
        """A 429: no worker starts a request for `seconds`."""
        self.paused_until = max(self.paused_until, time.monotonic() + seconds)
        self.pauses += 1

    async def stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason

    async def report(self, counts: dict, keep: Optional[dict] = None, timing: Optional[dict] = None) -> None:
        for k, v in counts.items():
            self.counts[k] = self.counts.get(k, 0) + v
        self.keep.update(keep or {})
        if timing:
            self._time(**timing)

    def _time(self, actor: str, start: float, end: float, items: int, item_seconds: float, row_seconds: float = 0.0) -> None:
        """Per actor, on its own clock: the first batch apart (it creates the metrics), and the later
        batches' span and summed item times — what Ray adds per item is measured where the work runs,
        not from the driver, which receives rows a batch at a time."""
        t = self.timing.setdefault(actor, {"batches": 0, "first_end": None, "last_end": None, "items": 0,
                                           "item_seconds": 0.0, "later_items": 0, "later_item_seconds": 0.0,
                                           "busy_seconds": 0.0, "later_busy_seconds": 0.0,
                                           "later_row_seconds": 0.0})
        t["batches"] += 1
        t["items"] += items
        t["item_seconds"] += item_seconds
        t["busy_seconds"] += end - start
        if t["first_end"] is None:
            t["first_end"] = end
        else:
            t["later_items"] += items
            t["later_item_seconds"] += item_seconds
            t["later_busy_seconds"] += end - start
            t["later_row_seconds"] += row_seconds  # result → row (the record a local batch writes too)
        t["last_end"] = end if t["last_end"] is None else max(t["last_end"], end)

    async def timings(self) -> dict:
        return {k: dict(v) for k, v in self.timing.items()}

    async def kept(self) -> dict:
        return dict(self.keep)

    async def register(self, name: str, handle: Any) -> None:
        self.workers[name] = handle

    async def state(self) -> dict:
        return {"stopped": self.stopped, "counts": dict(self.counts), "peak_in_flight": self.peak,
                "in_flight": len(self.leases), "pauses": self.pauses, "workers": sorted(self.workers)}

    async def worker_handles(self) -> dict:
        return dict(self.workers)


def make_coordinator(max_in_flight: Optional[int] = None, lease_seconds: float = 600.0):
    """Start a run's coordinator actor (on the driver's node, never restarted: it holds no results)."""
    ray = _ray()
    if max_in_flight is not None and max_in_flight < 1:
        raise ValueError(f"the LM cap must be at least 1 request in flight (got {max_in_flight})")
    actor = ray.remote(num_cpus=0, max_concurrency=1000)(Coordinator)
    return actor.remote(max_in_flight, lease_seconds)


class _ClusterGate:
    """A worker's side of the coordinator: every LM attempt holds a lease; retries happen here (the
    LM's own retries are turned off) so that each HTTP attempt is counted and a 429 pauses everyone."""

    def __init__(self, coordinator: Any, retries: int):
        self.coordinator = coordinator
        self.retries = retries

    def call(self, fn):
        from dspy.utils.exceptions import LMRateLimitError, is_retryable_lm_error

        ray = _ray()
        for attempt in range(self.retries + 1):
            token = ray.get(self.coordinator.acquire.remote())
            try:
                return fn()
            except Exception as exc:
                if attempt >= self.retries or not is_retryable_lm_error(exc):
                    raise
                hint = getattr(exc, "retry_after", None)
                delay = float(hint) if isinstance(hint, (int, float)) and math.isfinite(hint) and hint >= 0 else min(2 ** attempt, 60)
                if isinstance(exc, LMRateLimitError) or getattr(exc, "status", None) == 429:
                    ray.get(self.coordinator.back_off.remote(delay))  # the next acquire of every worker waits
                    delay = 0.0
            finally:
                ray.get(self.coordinator.release.remote(token))
            if delay:
                time.sleep(delay)
        raise AssertionError("unreachable")


def _gate_lm(lm: Any, coordinator: Any) -> None:
    """Route every call of this `dspy.LM` instance through the coordinator (its class is swapped for a
    subclass whose `__call__` holds a lease per attempt)."""
    if lm is None or getattr(lm, "_cluster_gate", None) is not None:
        return
    base = type(lm)
    gate = _ClusterGate(coordinator, int(getattr(lm, "num_retries", 0) or 0))

    class ClusterGatedLM(base):  # type: ignore[misc, valid-type]
        def __call__(self, *args, **kwargs):
            return gate.call(lambda: base.__call__(self, *args, **kwargs))

    lm.num_retries = 0
    lm._cluster_gate = gate
    lm.__class__ = ClusterGatedLM


# ── workers ─────────────────────────────────────────────────────────────────────────────────────


class _AssessWorker:
    """The callable class `map_batches` runs on each actor: one Assessor per actor, reused."""

    def __init__(self, settings: Any, coordinator: Any, *, threads: int, use_cache: bool, resize_reference: bool,
                 query: Optional[str], mode: str, reference_column: Optional[str], image_column: str,
                 with_trace: bool = False):
        from agentic_iqa.api import Assessor

        ray = _ray()
        self.settings = settings
        self.coordinator = coordinator
        self.threads = threads
        self.use_cache = use_cache
        self.resize_reference = resize_reference
        self.with_trace = with_trace
        self.query, self.mode = query, mode
        self.reference_column, self.image_column = reference_column, image_column
        self.fingerprint = _batch().config_fingerprint(settings)
        self.assessor = Assessor(settings)
        _ = self.assessor.graph  # build now, not in the first batch
        warm_up(self.assessor)
        for lm in {id(x): x for x in getattr(self.assessor.roles, "lms", {}).values() if x is not None}.values():
            _gate_lm(lm, coordinator)
        # One runner for the actor's life (as one runner serves a whole local batch): its graph is built
        # once, not per batch, and the circuit breaker's streak spans batches.
        self.runner = _batch().BatchRunner(self.assessor, concurrency=threads, use_cache=use_cache,
                                           resize_reference=resize_reference)
        self._stop_checked = 0.0
        self._stopped: Optional[str] = None
        ctx = ray.get_runtime_context()
        self.name = f"{ctx.get_node_id()[:8]}:{os.getpid()}:{ctx.get_actor_id()}"
        ray.get(coordinator.register.remote(self.name, ctx.current_actor))

    def _cluster_stopped(self) -> Optional[str]:
        """The circuit breaker's state, asked of the coordinator at most once a second."""
        if self._stopped is None and time.monotonic() - self._stop_checked > 1.0:
            self._stopped = _ray().get(self.coordinator.state.remote())["stopped"]
            self._stop_checked = time.monotonic()
        return self._stopped

    def _item(self, row: dict):
        b = _batch()
        reference = row.get(self.reference_column) if self.reference_column else row.get("reference")
        return b.BatchItem(
            image=str(row.get(self.image_column) or ""),
            query=row.get("query") or self.query,
            reference=None if reference in (None, "") else str(reference),
            mode=row.get("mode") or self.mode,
            id=None if row.get("id") in (None, "") else str(row.get("id")),
            problem=row.get("problem") or (None if row.get(self.image_column) else f"the row has no {self.image_column!r} value"),
        )

    def __call__(self, batch):
        import pyarrow as pa

        start = time.perf_counter()
        b = _batch()
        rows = batch.to_pylist()
        results: dict[int, dict] = {}
        todo, skipped, keep = [], 0, {}
        for i, row in enumerate(rows):
            # The content key is computed here, on the worker, not by the driver: hashing is file I/O
            # that scales with the cluster. `done_keys` (resume) are the keys of this item's earlier ok rows.
            prep = b.prepare_item(i, self._item(row), self.settings, self.fingerprint)
            done = row.get(DONE_KEYS) or ()
            if b.is_done(prep, done):
                results[i] = _already_done(prep)
                skipped += 1
                if len(done) > 1:  # an interrupted replacement left two rows: the driver keeps this one
                    keep[prep.identity] = prep.key
            else:
                todo.append(prep)
        runner = self.runner

        def feed() -> Iterator:
            for prep in todo:
                if self._cluster_stopped():
                    return  # the rest become not_attempted rows
                yield prep

        item_seconds = row_seconds = 0.0
        for res in runner.run(feed()):
            item_seconds += res.seconds
            t_row = time.perf_counter()
            results[res.index] = _columns(res.record(with_trace=self.with_trace, fingerprint=self.fingerprint))
            row_seconds += time.perf_counter() - t_row
            if res.error_type == "lm_setup" and self._stopped is None:
                self._stopped = res.error
                _ray().get(self.coordinator.stop.remote(res.error))
        if runner.stopped and self._stopped is None:  # the circuit breaker: the LM server is down
            self._stopped = runner.stopped
            _ray().get(self.coordinator.stop.remote(runner.stopped))
        out = [results.get(i) or _not_attempted(self._stopped or "the run stopped before this item") for i in range(len(rows))]
        counts = {"batches": 1}
        for rec in out:
            counts[rec["status"]] = counts.get(rec["status"], 0) + 1
        table, types = batch, _types()
        for name in (*RESULT_COLUMNS, DONE_KEYS):
            if name in table.column_names:
                table = table.drop_columns([name])
        for name in RESULT_COLUMNS:
            table = table.append_column(name, pa.array([rec[name] for rec in out], type=types[name]))
        timing = dict(actor=self.name, start=start, end=time.perf_counter(), items=len(rows), item_seconds=item_seconds,
                      row_seconds=row_seconds)
        # Waited for, so that the driver's read of the counts after the run sees every batch.
        _ray().get(self.coordinator.report.remote(counts, keep, timing))
        return table


def warm_up(assessor: Any) -> None:
    """Import torch and pyiqa and resolve the device before the first item, so that startup is not
    counted in the first items' times (concurrent imports are safe anyway: iqa_tools.backend)."""
    from iqa_tools import backend

    backend.pyiqa()
    _ = assessor.registry.device


def _types():
    import pyarrow as pa

    t = {name: pa.string() for name in RESULT_COLUMNS}
    t.update(score=pa.float64(), degraded=pa.bool_(), seconds=pa.float64())
    return t


def _columns(rec: dict) -> dict:
    """The result columns of one local results-file record."""
    result = rec.get("result") or {}
    evidence = result.get("evidence") or {}
    tools = [
        {"tool": lg.get("tool_name"), "object": lg.get("object_name"), "distortion": lg.get("distortion"),
         "raw": lg.get("raw_score"), "score": lg.get("normalized_score"), "error": lg.get("error")}
        for lg in evidence.get("tool_logs") or []
    ]
    score = rec.get("score")
    return {
        "status": rec["status"], "answer": rec.get("answer"), "level": rec.get("level"),
        "score": float(score) if isinstance(score, (int, float)) else None,
        "backend": rec.get("backend"), "degraded": bool(rec.get("degraded")),
        "distortions": json.dumps(evidence.get("distortion_analysis")) if evidence.get("distortion_analysis") else None,
        "tool_scores": json.dumps(tools) if tools else None,
        "error": rec.get("error"), "error_type": rec.get("error_type"), "key": rec.get("key"),
        "identity": rec.get("identity"), "image_sha256": rec.get("image_sha256"), "config": rec.get("config"),
        "seconds": float(rec.get("seconds") or 0.0),
        "result": json.dumps(result, ensure_ascii=False) if result else None,
    }


def _already_done(prep: Any) -> dict:
    """The row of an item settled by an earlier run (resume): not written again, only counted."""
    rec = {name: None for name in RESULT_COLUMNS}
    rec.update(status=ALREADY_DONE, key=prep.key, identity=prep.identity, image_sha256=prep.image_sha256,
               degraded=False, seconds=0.0)
    return rec


def _not_attempted(reason: str) -> dict:
    rec = {name: None for name in RESULT_COLUMNS}
    rec.update(status=NOT_ATTEMPTED, error=reason, error_type="lm_setup", degraded=False, seconds=0.0)
    return rec


# ── the Python API ──────────────────────────────────────────────────────────────────────────────


def assess_dataset(
    ds: Any,
    *,
    query: Optional[str] = None,
    reference_column: Optional[str] = None,
    lm: Optional[str] = None,
    offline: Optional[bool] = None,
    config: Optional[str | Path] = None,
    settings: Any = None,
    mode: str = "auto",
    concurrency: int | tuple[int, int] = 1,
    num_gpus_per_worker: float = 0.0,
    num_cpus_per_worker: float = 1.0,
    threads_per_worker: int = 4,
    batch_size: int = 16,
    lm_max_in_flight: Optional[int] = None,
    image_column: str = "image",
    use_cache: bool = True,
    resize_reference: bool = False,
    with_trace: bool = False,
    coordinator: Any = None,
) -> Any:
    """Add the assessment columns to every row of `ds` (lazily: a `ray.data.Dataset`).

    Rows need `image_column` (a path every worker can read); optional columns: `query` (else `query`),
    the reference (`reference_column`, default "reference"), `mode`, `id`, and `problem` (a reason to
    refuse the row, as the manifest rules give). Added columns: status ("ok", "failed", or
    "not_attempted" after the LM was found set up wrong), answer, level, score, backend, degraded,
    distortions and tool_scores (JSON text), error, error_type, key/identity (the local batch's
    resume keys), image_sha256, config, seconds and result (the full result as JSON text).

    concurrency: actors in the pool (an int, or (min, max) to autoscale). num_gpus_per_worker:
    fractional GPUs per actor (0.25: four actors share a GPU; tools then run on "cuda").
    threads_per_worker: assessments at once inside an actor (LM calls overlap). lm_max_in_flight:
    the cap on LM requests in flight across all actors (None: no cap). `lm`/`offline`/`config` or a
    ready `settings` choose the configuration, as for `assess()`. with_trace: keep each result's
    trace in its `result` column (as a local batch's results file does with `with_trace`). A
    `done_keys` column (list of keys) marks rows settled by earlier results: a row whose content key
    is among them comes back with status "already_done" and is not assessed.
    """
    if settings is None:
        from agentic_iqa.config import load_settings

        settings = load_settings(config, lm=lm, backend="offline" if offline else None)
    elif lm is not None or config is not None:
        raise ValueError("assess_dataset: pass either settings= or lm=/config=, not both")
    elif offline:
        settings = settings.model_copy(deep=True)
        settings.pipeline.backend = "offline"
    settings = settings_for_workers(settings, num_gpus_per_worker)
    if threads_per_worker < 1 or batch_size < 1:
        raise ValueError("threads_per_worker and batch_size must be at least 1")
    if coordinator is None:
        coordinator = make_coordinator(lm_max_in_flight)
    from ray.data import ActorPoolStrategy

    if isinstance(concurrency, (tuple, list)):
        pool = ActorPoolStrategy(min_size=int(concurrency[0]), max_size=int(concurrency[1]))
    else:
        pool = ActorPoolStrategy(size=int(concurrency))
    return ds.map_batches(
        _AssessWorker,
        batch_format="pyarrow",
        batch_size=batch_size,
        compute=pool,
        num_cpus=num_cpus_per_worker,
        num_gpus=num_gpus_per_worker or None,
        fn_constructor_kwargs=dict(
            settings=settings, coordinator=coordinator, threads=threads_per_worker, use_cache=use_cache,
            resize_reference=resize_reference, query=query, mode=mode, reference_column=reference_column,
            image_column=image_column, with_trace=with_trace,
        ),
        # Ray Data's actor pools run with max_restarts=-1 and max_task_retries=-1: a killed actor is
        # restarted and its unfinished batch re-run (rows are emitted per batch, so never twice).
    )


def settings_for_workers(settings: Any, num_gpus_per_worker: float = 0.0) -> Any:
    """The settings the workers use (tools on "cuda" when actors get a GPU share); the driver keys
    items with the same settings, so resume keys match."""
    if num_gpus_per_worker and settings.pipeline.tools.device in ("auto", "cpu"):
        settings = settings.model_copy(deep=True)
        settings.pipeline.tools.device = "cuda"
    return settings


# ── the CLI: items → shards in OUTDIR, resumable ────────────────────────────────────────────────

SHARD_SUFFIX = {"jsonl": ".json", "parquet": ".parquet"}
_MAX_SHARD_BYTES = 1 << 30  # a shard larger than this is not ours


def _abs(path: Optional[str]) -> Optional[str]:
    if path is None or "://" in path[:12]:
        return path
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def item_rows(prepared: Iterable[Any]) -> list[dict]:
    """Dataset rows for prepared local-batch items (absolute paths: workers may run elsewhere)."""
    rows = []
    for prep in prepared:
        it = prep.item
        rows.append({
            "image": _abs(it.image), "query": it.query, "reference": _abs(it.reference), "mode": it.mode,
            "id": it.id, "problem": it.problem, "meta": json.dumps(dict(it.meta)) if it.meta else None,
            DONE_KEYS: list(prep.done_keys) or None,
        })
    return rows


def shard_files(out_dir: Path) -> list[Path]:
    """Result shards in OUTDIR (regular files only; hidden and temporary files are not ours)."""
    if not out_dir.is_dir():
        return []
    return sorted(p for p in out_dir.iterdir()
                  if p.suffix in (".json", ".parquet") and not p.name.startswith(".") and p.is_file() and not p.is_symlink())


def read_shards(out_dir: Path, *, repair: bool = False, notes: Optional[list] = None) -> list[dict]:
    """The records (key, identity, status, …) in OUTDIR's shards. With `repair`, a JSONL shard's
    partial last line (an interrupted write) is cut off and an unreadable Parquet shard is removed,
    so its items run again and each item keeps one row."""
    records: list[dict] = []
    for path in shard_files(out_dir):
        if path.stat().st_size > _MAX_SHARD_BYTES:
            raise _batch().BatchError(f"{path} is larger than {_MAX_SHARD_BYTES >> 20} MB: not an agentic-iqa shard; choose another --out")
        if path.suffix == ".parquet":
            records += _read_parquet_shard(path, repair, notes)
        else:
            records += _read_json_shard(path, repair, notes)
    return records


_KEEP = ("key", "identity", "status", "image", "score", "degraded", "error", "error_type", "manifest_row")


def _read_json_shard(path: Path, repair: bool, notes: Optional[list]) -> list[dict]:
    data = path.read_bytes()
    out, good = [], 0
    for line in data.split(b"\n"):
        if not line.strip():
            good += len(line) + 1
            continue
        try:
            rec = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            break
        if not (isinstance(rec, dict) and isinstance(rec.get("key"), str) and "status" in rec):
            raise _batch().BatchError(f"{path} does not hold agentic-iqa results; choose another --out")
        out.append({k: rec.get(k) for k in _KEEP})
        good += len(line) + 1
    good = min(good, len(data))
    if good < len(data) and repair:
        with open(path, "r+b") as fh:
            fh.truncate(good)
            fh.flush()
            os.fsync(fh.fileno())
        if notes is not None:
            notes.append(f"repaired {path.name}: cut off {len(data) - good} bytes of a partial write")
    return out


def _read_parquet_shard(path: Path, repair: bool, notes: Optional[list]) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)  # `manifest_row` is only in the shards of unusable manifest rows
        table = pq.read_table(path, columns=[c for c in _KEEP if c != "image" and c in names] + ["image"])
    except Exception as exc:  # noqa: BLE001 - a truncated shard from an interrupted write
        if not repair:
            return []
        path.unlink()
        if notes is not None:
            notes.append(f"removed {path.name}: an unreadable shard left by an interrupted write ({type(exc).__name__}); its items run again")
        return []
    return table.to_pylist()


def _drop_rows(out_dir: Path, drop: Any, shards: Optional[Iterable[Path]] = None) -> int:
    """Remove rows from the shards (a result for an older version of a file, or a failure being
    retried): `drop` is a set of identities, or a function (identity, key) -> bool. Each shard is
    rewritten beside itself and then replaces it. Returns the rows removed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    gone = (lambda identity, key: identity in drop) if isinstance(drop, (set, frozenset)) else drop
    dropped = 0
    for path in shard_files(out_dir) if shards is None else shards:
        tmp = path.with_name(f".{path.name}.tmp")
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            mask = [not gone(i, k) for i, k in zip(table["identity"].to_pylist(), table["key"].to_pylist())]
            if all(mask):
                continue
            dropped += mask.count(False)
            pq.write_table(table.filter(pa.array(mask, pa.bool_())), tmp)
        else:
            lines = [ln for ln in path.read_bytes().split(b"\n") if ln.strip()]
            kept_lines = [ln for ln in lines if not gone((rec := json.loads(ln)).get("identity"), rec.get("key"))]
            if len(kept_lines) == len(lines):
                continue
            dropped += len(lines) - len(kept_lines)
            tmp.write_bytes(b"".join(ln + b"\n" for ln in kept_lines))
        os.replace(tmp, path)
    return dropped


def run_cli_batch(
    items: list,
    out_dir: Path,
    settings: Any,
    *,
    address: Optional[str] = None,
    fmt: str = "jsonl",
    resume: bool = False,
    retry_failed: bool = False,
    overwrite: bool = False,
    concurrency: int = 4,
    actors: Optional[int] = None,
    batch_size: Optional[int] = None,
    num_gpus_per_worker: Optional[float] = None,
    lm_max_in_flight: Optional[int] = None,
    use_cache: bool = True,
    resize_reference: bool = False,
    with_trace: bool = False,
    progress: bool = True,
    manifest_problems: Iterable[str] = (),
    notes: Iterable[str] = (),
) -> Any:
    """`agentic-iqa assess … --engine ray --out DIR`: the local batch's summary (BatchSummary) for a
    run whose rows went to shards in `out_dir` through Ray's datasinks. with_trace: traces kept in
    the rows' `result` (as in a local results file). progress=False: no Ray progress bars or
    progress logs (`--no-progress`, `--json`)."""
    b = _batch()
    # Flags win over the environment; a variable a flag overrides is not even checked.
    knobs = cluster_knobs(skip={k for k, v in (("actors", actors), ("batch_size", batch_size),
                                               ("gpus_per_worker", num_gpus_per_worker),
                                               ("lm_max_in_flight", lm_max_in_flight)) if v is not None})
    actors = actors if actors is not None else knobs["actors"]
    batch_size = batch_size if batch_size is not None else knobs["batch_size"] or 16
    num_gpus_per_worker = num_gpus_per_worker if num_gpus_per_worker is not None else knobs["gpus_per_worker"] or 0.0
    lm_max_in_flight = lm_max_in_flight if lm_max_in_flight is not None else knobs["lm_max_in_flight"]
    if fmt not in SHARD_SUFFIX:
        raise b.BatchError(f"--format must be jsonl or parquet (got {fmt!r})")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise b.BatchError(f"--out {out_dir} is a file; with --engine ray it is a folder for the result shards")
    t0 = time.perf_counter()
    settings = settings_for_workers(settings, num_gpus_per_worker)
    fingerprint = b.config_fingerprint(settings)
    problems = list(manifest_problems)
    summary = b.BatchSummary(out=str(out_dir), total=len(items) + len(problems), manifest_problems=problems,
                             notes=list(notes), config=fingerprint)
    existing = shard_files(out_dir)
    other = sorted(p.suffix for p in existing if p.suffix != SHARD_SUFFIX[fmt])
    if existing and overwrite:
        for p in existing:
            p.unlink()
        existing = []
    elif existing and not (resume or retry_failed):
        raise b.BatchError(f"{out_dir} already holds results; pass --resume to continue it (finished items are skipped), "
                           "or --overwrite to start over")
    elif other:
        raise b.BatchError(f"{out_dir} holds {other[0]} shards; resume it with the same --format")
    records = read_shards(out_dir, repair=True, notes=summary.notes)
    # The driver only lists and identifies items (no file is read here: that would not scale to
    # millions); each worker hashes its items and skips those whose key an earlier ok row holds.
    to_run, replace = b.plan_batch(items, settings=settings, fingerprint=fingerprint, hash_contents=False,
                                   state=b.ResumeState(records=records), summary=summary, retry_failed=retry_failed)
    # Unusable manifest rows are failed rows too, as in a local results file: written once across resumes, in
    # a shard of their own, and dropped once the row is fixed.
    new_problems, stale_problems = b.results.manifest_problem_lines(problems, fingerprint, records)
    if replace or stale_problems:  # failures being retried, fixed manifest rows (by identity: no content needed)
        summary.replaced_lines = _drop_rows(out_dir, replace | stale_problems)
    if new_problems:
        _write_problem_shard(out_dir, fmt, new_problems)
    before = {p.name for p in shard_files(out_dir)}
    had_rows = {r.get("identity") for r in records} - replace
    state: dict = {"stopped": None, "counts": {}}
    if to_run:
        ray = _ray()
        if not ray.is_initialized():
            check_address(address)
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        n_actors = actors or max(1, min(int(ray.available_resources().get("CPU", 1)), math.ceil(len(to_run) / batch_size)))
        coordinator = make_coordinator(lm_max_in_flight)
        ds = ray.data.from_items(item_rows(to_run), override_num_blocks=max(1, math.ceil(len(to_run) / batch_size)))
        out = assess_dataset(ds, settings=settings, concurrency=n_actors, threads_per_worker=concurrency,
                             batch_size=batch_size, num_gpus_per_worker=num_gpus_per_worker, use_cache=use_cache,
                             resize_reference=resize_reference, with_trace=with_trace, coordinator=coordinator)
        from ray.data.expressions import col

        out = out.filter(expr=(col("status") != NOT_ATTEMPTED) & (col("status") != ALREADY_DONE))
        name = time.strftime('%Y%m%dT%H%M%S')
        quiet = _quiet_ray_data() if not progress else None
        try:
            if fmt == "parquet":
                out.write_parquet(str(out_dir), filename_provider=_names(name, ".parquet"))
            else:
                out.write_json(str(out_dir), filename_provider=_names(name, ".json"), force_ascii=False,
                               double_precision=15)
        except KeyboardInterrupt:
            summary.interrupted = True
        finally:
            if quiet is not None:
                _restore_ray_data(quiet)
        try:
            # One bounded wait for both answers, well inside the CLI's 10 s grace after a Ctrl-C (two waits
            # of 10 s each could outlast it, and the watchdog would end the run before the rows are merged).
            state, keep = ray.get([coordinator.state.remote(), coordinator.kept.remote()], timeout=COORDINATOR_WAIT)
            state["keep"] = keep
        except Exception:  # noqa: BLE001 - the summary still comes from the shards
            state = {"stopped": None, "counts": {}}
        if state["stopped"]:
            summary.stopped = state["stopped"]
            summary.not_attempted = state["counts"].get(NOT_ATTEMPTED, 0)
        summary.already_done += state["counts"].get(ALREADY_DONE, 0)
    new = _new_records(out_dir, before)
    # Items that ran again (their file changed since its ok row): now that the new row is written,
    # the old one goes (in this order, an interruption leaves two rows, never none; the next resume
    # keeps the one whose key matches the file: `keep`). Done after an interrupt too.
    rerun = {rec.get("identity") for rec in new} & had_rows
    keep = state.get("keep") or {}
    if rerun or keep:
        old = [out_dir / name for name in sorted(before) if (out_dir / name).exists()]
        summary.replaced_lines += _drop_rows(
            out_dir, lambda identity, key: identity in rerun or (identity in keep and key != keep[identity]), old)
    for rec in new:
        summary.ran += 1
        if rec["status"] == "ok":
            summary.ok += 1
            summary.degraded += int(bool(rec.get("degraded")))
            if isinstance(rec.get("score"), (int, float)):
                summary.scores.append(float(rec["score"]))
        else:
            summary.failed += 1
            if len(summary.failures) < 50:
                summary.failures.append({"image": rec.get("image"), "error": rec.get("error"), "error_type": rec.get("error_type")})
    if summary.interrupted:  # as a local batch counts them: what is neither written nor found done runs on --resume
        summary.not_attempted = max(0, len(to_run) - summary.ran - state["counts"].get(ALREADY_DONE, 0))
    summary.seconds = time.perf_counter() - t0
    return summary


#: The cluster knobs and their AGENTIC_IQA_RAY_* fields (agentic_iqa.config.RayEnvSettings).
KNOBS = {"actors": "ACTORS", "batch_size": "BATCH_SIZE", "gpus_per_worker": "GPUS_PER_WORKER",
         "lm_max_in_flight": "LM_MAX_IN_FLIGHT"}


def cluster_knobs(skip: Iterable[str] = ()) -> dict:
    """{knob: value or None} from the AGENTIC_IQA_RAY_* variables (the knobs in `skip` are None, their
    variables unread); a bad value is a one-line ConfigError."""
    from agentic_iqa.config import ray_env_settings

    env = ray_env_settings(skip=[KNOBS[k] for k in skip])
    return {knob: (None if knob in skip else getattr(env, field)) for knob, field in KNOBS.items()}


def check_address(address: Optional[str], timeout: float = 5.0) -> None:
    """Fail in seconds, with the address named, when nothing listens at a `host:port` or
    `ray://host:port` address (Ray itself would wait minutes). "auto" and None are Ray's to resolve."""
    import socket

    if not address or address == "auto":
        return
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not port.isdigit() or not host:
        from agentic_iqa.config import ConfigError

        raise ConfigError(f"--address {address!r}: give auto, host:port (the GCS, 6379) or ray://host:port (Ray Client, 10001)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        from agentic_iqa.config import ConfigError

        raise ConfigError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc}); "
                          "check the head node's address and port, or leave --address out to start Ray here") from None


def _quiet_ray_data() -> tuple:
    """Ray Data's progress bars (or, off a terminal, its progress log lines) and its INFO logs off for
    this process; returns what `_restore_ray_data` puts back."""
    import logging

    from ray.data import DataContext

    ctx = DataContext.get_current()
    loggers = {name: logging.getLogger(name) for name in ("ray.data", "ray.data._internal.progress")}
    saved = (ctx.enable_progress_bars, {name: lg.level for name, lg in loggers.items()})
    ctx.enable_progress_bars = False
    loggers["ray.data"].setLevel(logging.WARNING)
    loggers["ray.data._internal.progress"].setLevel(logging.ERROR)  # it would only say "progress bars disabled"
    return saved


def _restore_ray_data(saved: tuple) -> None:
    import logging

    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = saved[0]
    for name, level in saved[1].items():
        logging.getLogger(name).setLevel(level)


#: Input columns of a shard row (those `item_rows` gives, less `done_keys`, which the workers drop).
_ROW_COLUMNS = ("image", "query", "reference", "mode", "id", "problem", "meta")


def _write_problem_shard(out_dir: Path, fmt: str, records: list[dict]) -> None:
    """A shard of unusable manifest rows (`manifest_problem_lines`): the rows a worker would write, with no
    input and `manifest_row` true. Written beside its final name, then renamed (readers skip hidden files)."""
    import uuid

    rows = [{**{c: None for c in _ROW_COLUMNS}, **_columns(rec), "manifest_row": True} for rec in records]
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-manifest-{uuid.uuid4().hex}-000000{SHARD_SUFFIX[fmt]}"
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.tmp"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        types = _types()
        schema = pa.schema([(c, pa.string()) for c in _ROW_COLUMNS] + [(c, types[c]) for c in RESULT_COLUMNS]
                           + [("manifest_row", pa.bool_())])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    else:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, out_dir / name)


def _new_records(out_dir: Path, before: set[str]) -> list[dict]:
    new = [p for p in shard_files(out_dir) if p.name not in before]
    recs: list[dict] = []
    for p in new:
        recs += _read_parquet_shard(p, False, None) if p.suffix == ".parquet" else _read_json_shard(p, False, None)
    return recs


def _names(prefix: str, suffix: str):
    from ray.data.datasource import FilenameProvider

    class Names(FilenameProvider):
        """Shard names that sort by run and never collide with an earlier run's shards."""

        def get_filename_for_task(self, write_uuid, task_index):
            return f"{prefix}-{write_uuid}-{task_index:06d}{suffix}"

    return Names()
