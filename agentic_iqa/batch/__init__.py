"""Batch assessment that never loses work: many images at once, results streamed to a JSONL file.

    from agentic_iqa import assess_many
    for r in assess_many(["a.jpg", "b.png", {"image": "c.jpg", "query": "Is it blurry? A. Yes B. No"}], concurrency=8):
        print(r.item.image, r.result.score if r.ok else r.error)

Three modules, one per layer (everything public is re-exported here):

* **Items** (`batch.items`: `BatchItem`): what to assess. Built from paths, a directory scan (`scan_directory`) or an
  eval manifest (`items_from_manifest`; paths in it may not leave the manifest's folder unless allowed).
* **Running** (`batch.runner`: `assess_many`): a bounded thread pool of `concurrency` assessments sharing one
  `Assessor` (one registry, one set of LMs, one compiled graph). LM calls are blocking HTTP calls in
  those threads, so they overlap; tool runs go through a gate (`tool_slots`, default 1) because every
  pyiqa forward already uses all cores through torch's intra-op threads, and running several at once
  would only oversubscribe the CPU. Items are pulled lazily, so at most `concurrency` images are in
  memory. DSPy's per-call history and trace are off for every assessment (`VLMRoles`, unless
  `lm_history: true`): both would otherwise keep every request, image included. DSPy's
  image-formatting cache is cleared as items finish, and freed heap is handed back to the OS.
* **Results file** (`batch.results`: `ResultsFile`; `run_batch` in `batch.runner`): one JSON line per item, written with a single
  `write` and fsync'd as the item finishes, so a kill loses at most the items in flight. Each line
  carries a resume key — sha256 of (path, content sha256, query, mode, configuration fingerprint) —
  so `resume=True` skips items already done and never writes a second line for one. A partial
  trailing line left by a crash is cut off (or completed, if it is a whole record missing only its
  newline); an exclusive lock keeps two batches from appending to the same file.
"""
from __future__ import annotations

from agentic_iqa.batch.items import (  # noqa: F401
    BatchError,
    BatchItem,
    IMAGE_EXTENSIONS,
    PreparedItem,
    RESULTS_FORMAT,
    as_item,
    config_fingerprint,
    identify_item,
    is_done,
    items_from_manifest,
    items_from_paths,
    manifest_query,
    prepare_item,
    scan_directory,
)
from agentic_iqa.batch.results import (  # noqa: F401
    ItemResult,
    ResultsFile,
    ResumeState,
)
from agentic_iqa.batch.runner import (  # noqa: F401
    BatchRunner,
    BatchSummary,
    assess_many,
    plan_batch,
    plan_resume,
    run_batch,
)

__all__ = [
    "BatchError",
    "BatchItem",
    "BatchRunner",
    "BatchSummary",
    "IMAGE_EXTENSIONS",
    "ItemResult",
    "PreparedItem",
    "RESULTS_FORMAT",
    "ResultsFile",
    "ResumeState",
    "as_item",
    "assess_many",
    "config_fingerprint",
    "identify_item",
    "is_done",
    "items_from_manifest",
    "items_from_paths",
    "manifest_query",
    "plan_batch",
    "plan_resume",
    "prepare_item",
    "run_batch",
    "scan_directory",
]
