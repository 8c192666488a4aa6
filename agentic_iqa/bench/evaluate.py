"""`agentic-iqa eval`: run assessments over a manifest and score them (DESIGN §7 conventions).

For every usable row: a scoring assessment without the reference (NR mode) and/or with it (FR mode),
recording the fused score and the detected distortion categories (worst first); rows with a question
get the question asked instead. Metrics: SRCC / KRCC / PLCC (after the 4-parameter logistic) against
-level or MOS, overall and per type; intra-group SRCC; detection top-1 / recall; MCQ accuracy over the
questions with an answer key. A question without an answer key is asked and its answer reported as
unscored (not an error). Broken manifest rows are reported with their line numbers and skipped; an item
whose assessment fails is recorded with its reason and skipped (the CLI exits 3 for either).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Optional

from agentic_iqa.bench import metrics
from agentic_iqa.bench.manifest import ManifestRow, read_manifest

Mode = Literal["nr", "fr"]


@dataclass
class ItemResult:
    row: ManifestRow
    mode: Mode
    score: Optional[float] = None
    detected: list[str] = field(default_factory=list)   # categories, the pipeline's main one first
    answer: Optional[str] = None                        # MCQ letter, for rows with a question
    answer_text: Optional[str] = None                   # the answer as given (open questions have no letter)
    seconds: float = 0.0
    timings: dict = field(default_factory=dict)
    error: Optional[str] = None


def detected_categories(result) -> list[str]:
    """Categories graded above "none" in the analysis's own order (the pipeline's ranking: the offline
    analyst's category model, a VLM's listing), else the detected set in order. Re-sorting by severity
    here would score another ranking than the one the answer names."""
    ev = result.evidence
    if ev is None:
        return []
    if ev.distortion_analysis:
        items = [a for objs in ev.distortion_analysis.values() for a in objs if a.severity != "none"]
        return list(dict.fromkeys(a.type for a in items))
    return list(dict.fromkeys(c for cats in (ev.distortion_set or {}).values() for c in cats))


def _question(row: ManifestRow) -> str:
    text = row.question or ""
    if row.options and not any(f"{k}." in text for k in row.options):
        text += " " + " ".join(f"{k}. {v}" for k, v in sorted(row.options.items()))
    return text


def run_items(assessor, rows: list[ManifestRow], modes: list[Mode], concurrency: int = 1,
              on_item: Optional[Callable[[ItemResult], None]] = None,
              on_start: Optional[Callable[[int], None]] = None) -> list[ItemResult]:
    """Assess every (row, mode) job; `on_start(n_jobs)` is called once before the first."""
    jobs: list[tuple[ManifestRow, Mode]] = []
    for row in rows:
        for mode in modes:
            if mode == "fr" and row.reference_path is None:
                continue
            jobs.append((row, mode))
    if on_start:
        on_start(len(jobs))

    # Each job is one or two assessments, run by the batch runner (`assess_many`: its bounded pool,
    # tool gate and memory care). A question row is evaluated on its question only: its image is
    # usually also a plain row, and scoring it twice would count that image twice in the correlations.
    from agentic_iqa.batch import BatchItem, assess_many

    results = [ItemResult(row, mode) for row, mode in jobs]
    batch: list[BatchItem] = []
    for j, (row, mode) in enumerate(jobs):
        ref = str(row.reference_path) if mode == "fr" else None
        if row.question is None and (row.level is not None or row.mos is not None):
            batch.append(BatchItem(str(row.image_path), None, ref, mode="score", meta={"job": j}))
        if row.question:
            batch.append(BatchItem(str(row.image_path), _question(row), ref, mode="answer", meta={"job": j}))
    remaining = Counter(b.meta["job"] for b in batch)
    if on_item:
        for j, item in enumerate(results):
            if not remaining[j]:
                on_item(item)  # nothing to assess for this job (no target and no question)
    for done in assess_many(batch, assessor=assessor, concurrency=max(1, concurrency)):
        j = done.item.meta["job"]
        item = results[j]
        if not done.ok:  # an item that fails is recorded and skipped
            item.error = item.error or done.error
        elif done.item.mode == "score":
            r = done.result
            item.score, item.detected, item.timings = r.score, detected_categories(r), r.timings
            item.seconds += r.total_seconds
        else:
            a = done.result
            item.answer = a.answer.strip()[:1].upper() if a.answer else None
            item.answer_text = a.answer
            item.seconds += a.total_seconds
        remaining[j] -= 1
        if not remaining[j] and on_item:
            on_item(item)
    return results


def summarize(items: list[ItemResult]) -> dict:
    """All metrics, per mode."""
    report: dict = {}
    for mode in sorted({i.mode for i in items}):
        ok = [i for i in items if i.mode == mode and i.error is None]
        scored = [i for i in ok if i.score is not None]
        lv = [i for i in scored if i.row.level is not None]
        mos = [i for i in scored if i.row.mos is not None]
        part: dict = {"items": len([i for i in items if i.mode == mode]), "failed": len([i for i in items if i.mode == mode and i.error])}
        if lv:
            target = [-i.row.level for i in lv]
            pred = [i.score for i in lv]
            part["vs_level"] = metrics.correlations(pred, target)
            part["vs_level_per_type"] = metrics.correlations_by([i.row.type for i in lv], pred, target)
            part["intra_group"] = metrics.intra_group_srcc(
                [i.row.source or i.row.reference or i.row.id for i in lv], [i.row.type for i in lv],
                [i.row.level for i in lv], pred)
            part["detection"] = metrics.detection_accuracy(
                [i.row.category for i in lv], [i.detected for i in lv], [i.row.level for i in lv])
            high = [i for i in lv if i.row.level >= 3]
            part["detection_levels_3_5"] = metrics.detection_accuracy([i.row.category for i in high], [i.detected for i in high])
        if mos:
            target = [i.row.mos if i.row.mos_higher_better else -i.row.mos for i in mos]
            part["vs_mos"] = metrics.correlations([i.score for i in mos], target)
        mcq = [i for i in ok if i.row.question and i.row.answer is not None]
        if mcq:
            part["mcq"] = metrics.mcq_accuracy([i.row.answer for i in mcq], [i.answer for i in mcq])
        unscored = [i for i in ok if i.row.question and i.row.answer is None]
        if unscored:  # questions without an answer key: asked, answered, not scored
            part["unscored_answers"] = [{"id": i.row.id, "question": i.row.question, "answer": i.answer_text}
                                        for i in unscored]
        times = sorted(i.seconds for i in ok)
        if times:
            part["seconds_per_item_median"] = times[len(times) // 2]
        report[mode] = part
    report["errors"] = [{"id": i.row.id, "mode": i.mode, "error": i.error} for i in items if i.error]
    return report


def evaluate(manifest: Path, assessor, *, modes: list[Mode], split: str = "test", limit: Optional[int] = None,
             concurrency: int = 1, on_item=None, on_start=None,
             allow_outside: bool = False) -> tuple[dict, list[ItemResult], list]:
    """Rows whose paths leave the manifest's folder are skipped unless `allow_outside` (as `assess --manifest`).
    `limit`: only the first N rows after the split filter (None: all)."""
    if limit is not None and limit < 1:  # 0 would otherwise mean "all" and run a whole data set unasked
        raise ValueError(f"limit must be at least 1 (got {limit}); pass None to evaluate every row")
    rows, problems = read_manifest(manifest, allow_outside=allow_outside)
    if split != "all":
        chosen = [r for r in rows if r.split == split]
        if rows and not chosen:  # e.g. `bench make --ref chelsea` writes train rows only; the default is test
            others = sorted({r.split for r in rows})
            raise ValueError(f"manifest {manifest}: no rows in split '{split}' (its {len(rows)} row(s) are in "
                             f"split {', '.join(repr(o) for o in others)}); evaluate them with --split all"
                             + "".join(f" or --split {o}" for o in others))
        rows = chosen
    if limit is not None:
        rows = rows[:limit]
    items = run_items(assessor, rows, modes, concurrency, on_item, on_start)
    report = summarize(items)
    report["manifest"] = str(manifest)
    report["split"] = split
    report["skipped_rows"] = [{"line": p.line, "id": p.row_id, "reason": p.message} for p in problems]
    return report, items, problems


def plot(items: list[ItemResult], path: Path) -> Path:
    """PNG: mean score vs level, one line per distortion type, one panel per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({i.mode for i in items if i.score is not None and i.row.level is not None})
    fig, axes = plt.subplots(1, max(1, len(modes)), figsize=(6.5 * max(1, len(modes)), 4.8), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        by_type: dict = {}
        for i in items:
            if i.mode == mode and i.score is not None and i.row.level is not None:
                by_type.setdefault(i.row.type, {}).setdefault(i.row.level, []).append(i.score)
        for t, levels in sorted(by_type.items(), key=lambda kv: str(kv[0])):
            xs = sorted(levels)
            ax.plot(xs, [sum(levels[x]) / len(levels[x]) for x in xs], marker="o", label=str(t))
        ax.set_title(f"{mode.upper()} mode: mean score per level")
        ax.set_xlabel("distortion level (1 = mild … 5 = strong)")
        ax.set_ylabel("fused score (1–5)")
        ax.set_xticks([1, 2, 3, 4, 5])
        ax.set_ylim(1, 5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fmt(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"
