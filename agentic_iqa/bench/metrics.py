"""Evaluation metrics for IQA benchmarks (pure functions on plain sequences).

Correlations follow the VQEG convention (DESIGN §7): SRCC and KRCC on the raw scores, PLCC after a
4-parameter logistic maps scores onto the target scale. Intra-group SRCC measures what graded synthetic
distortions can measure without MOS: within one image and one distortion type, does the score fall as
the level rises?
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from typing import Hashable, Iterable, Optional, Sequence

import numpy as np
from scipy import optimize, stats

from .manifest import NON_MONOTONE_TYPES


def logistic4(x, b1, b2, b3, b4):
    """VQEG 4-parameter logistic: from b2 (low end) to b1 (high end), centred at b3, scale |b4|."""
    z = np.clip(-(np.asarray(x, dtype=float) - b3) / (abs(b4) + 1e-12), -500, 500)
    return (b1 - b2) / (1.0 + np.exp(z)) + b2


def fit_logistic4(pred: Sequence[float], target: Sequence[float]) -> tuple[Optional[np.ndarray], str]:
    """Fit ``logistic4`` mapping predictions onto targets. Returns (params, "logistic"), or
    (None, reason) when it cannot be fitted (too few points, constant input, no convergence)."""
    x, y = np.asarray(pred, dtype=float), np.asarray(target, dtype=float)
    if len(x) < 5 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None, "too few points or constant input for a logistic fit"
    # Start from the target's range, centred on the predictions, with a slope sign that follows the
    # data (a decreasing relation is fitted by a negative b4 turned around: swap b1 and b2).
    rising = stats.spearmanr(x, y)[0] >= 0
    b1, b2 = (y.max(), y.min()) if rising else (y.min(), y.max())
    p0 = [b1, b2, float(np.median(x)), float(np.std(x)) / 2 or 1.0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            params, _ = optimize.curve_fit(logistic4, x, y, p0=p0, maxfev=20000)
    except (RuntimeError, ValueError, optimize.OptimizeWarning) as exc:
        return None, f"logistic fit failed: {exc}"
    if not np.all(np.isfinite(params)):
        return None, "logistic fit gave non-finite parameters"
    return params, "logistic"


def correlations(pred: Sequence[float], target: Sequence[float]) -> dict:
    """SRCC, KRCC and PLCC (after the logistic fit; the plain linear PLCC when the fit fails, which the
    ``plcc_fit`` field says) of predictions against targets."""
    x, y = np.asarray(pred, dtype=float), np.asarray(target, dtype=float)
    out = {"n": int(len(x)), "srcc": math.nan, "krcc": math.nan, "plcc": math.nan, "plcc_fit": "none"}
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    out["srcc"] = float(stats.spearmanr(x, y)[0])
    out["krcc"] = float(stats.kendalltau(x, y)[0])
    params, how = fit_logistic4(x, y)
    mapped = logistic4(x, *params) if params is not None else x
    if np.ptp(mapped) == 0:  # a degenerate fit (a flat curve) carries no information
        mapped, how = x, "linear (logistic fit was flat)"
    out["plcc"] = float(stats.pearsonr(mapped, y)[0])
    out["plcc_fit"] = how if params is not None else f"linear ({how})"
    return out


def correlations_by(keys: Sequence[Hashable], pred: Sequence[float], target: Sequence[float]) -> dict:
    """``correlations`` per key (e.g. per distortion type)."""
    idx = defaultdict(list)
    for i, k in enumerate(keys):
        idx[k].append(i)
    p, t = np.asarray(pred, dtype=float), np.asarray(target, dtype=float)
    return {k: correlations(p[i], t[i]) for k, i in idx.items()}


def intra_group_srcc(groups: Sequence[Hashable], types: Sequence[Optional[str]], levels: Sequence[int],
                     scores: Sequence[float], skip_types: Iterable[str] = NON_MONOTONE_TYPES) -> dict:
    """Mean SRCC between score and -level within each (image, type) group (higher level = worse, so a
    good quality score correlates positively with -level). Groups with fewer than two distinct levels
    are skipped, and so are ``skip_types`` (not monotone in level). A group whose scores are all equal
    ranks nothing and counts as 0. Returns the mean, the number of groups and the mean per type."""
    by_group: dict = defaultdict(list)
    for g, t, lv, s in zip(groups, types, levels, scores):
        if lv is None or t in set(skip_types):
            continue
        by_group[(g, t)].append((lv, s))
    per_type: dict = defaultdict(list)
    for (g, t), items in by_group.items():
        lv = np.array([i[0] for i in items], dtype=float)
        sc = np.array([i[1] for i in items], dtype=float)
        if len(np.unique(lv)) < 2:
            continue
        rho = 0.0 if np.ptp(sc) == 0 else float(stats.spearmanr(sc, -lv)[0])
        per_type[t].append(rho)
    all_rho = [r for rs in per_type.values() for r in rs]
    return {"srcc": float(np.mean(all_rho)) if all_rho else math.nan, "groups": len(all_rho),
            "per_type": {t: float(np.mean(rs)) for t, rs in sorted(per_type.items(), key=lambda kv: str(kv[0]))}}


def detection_accuracy(categories: Sequence[Optional[str]], detected: Sequence[Sequence[str]],
                       levels: Optional[Sequence[Optional[int]]] = None) -> dict:
    """Top-1 accuracy (the first detected category is the applied one) and recall (the applied category
    is anywhere among the detected) over rows with a known category; also per level when given.
    ``detected`` lists, per row, the detected categories worst first (empty = nothing detected)."""
    levels = levels if levels is not None else [None] * len(categories)

    def summary(idx: list[int]) -> dict:
        if not idx:
            return {"n": 0, "top1": math.nan, "recall": math.nan}
        top1 = [bool(detected[i]) and detected[i][0] == categories[i] for i in idx]
        recall = [categories[i] in detected[i] for i in idx]
        return {"n": len(idx), "top1": float(np.mean(top1)), "recall": float(np.mean(recall))}

    rows = [i for i, c in enumerate(categories) if c is not None]
    by_level = defaultdict(list)
    for i in rows:
        if levels[i] is not None:
            by_level[levels[i]].append(i)
    return {**summary(rows), "per_level": {lv: summary(ix) for lv, ix in sorted(by_level.items())}}


def mcq_accuracy(answers: Sequence[Optional[str]], predicted: Sequence[Optional[str]]) -> dict:
    """Share of questions answered with the right letter (case and surrounding space ignored; a missing
    prediction counts as wrong). Rows without a known answer are skipped."""
    pairs = [(a, p) for a, p in zip(answers, predicted) if a is not None]
    if not pairs:
        return {"n": 0, "accuracy": math.nan}
    right = [p is not None and p.strip().upper() == a.strip().upper() for a, p in pairs]
    return {"n": len(pairs), "accuracy": float(np.mean(right))}
