"""Why the NR SRCC across all images stays below the intra-group SRCC: a decomposition per held-out fold.

    python benchmarks/across_types.py [--workers 2]    # one fit per fold (~12 s each) from fit_corpus.py's statistics cache

Same folds and protocol as ``fit_corpus.py`` (leave-one-source-out, ``alt`` ladder, analyst alone, NR).
For each held-out source it prints the SRCC across all images (clean photos = level 0) as measured, and
two diagnostic upper bounds that use the held-out fold's own truth, so they are NOT results, only where the
loss sits:

* *type scales only*: every damaged score replaced by the mean of its (type, level) over the fold: no
  photo-to-photo spread is left, only the types' different score scales;
* *photo spread only*: each type's scores mapped (piecewise linearly, through its per-level means) onto
  the common per-level means: the type scales are aligned, the photo-to-photo spread is kept.

A fourth column, *without tone types*, is measured (no truth used): the SRCC across all images with the damage
that changes only a photo's global tone or colour (``TONE_TYPES``) left out. Without a reference that damage is
read from global statistics (how dark, how contrasty, how colourful) that a photo's own look shares, so it carries
most of the photo-to-photo spread.

Then each type's held-out mean score per level, photo-weighted over the folds.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fit_corpus as fc  # noqa: E402
from fit_corpus import sv  # noqa: E402


# Damage to a photo's global tone or colour only (no detail lost or added).
TONE_TYPES = ("brighten", "darken", "overexposure", "contrast decrease", "color saturation 1", "color saturation 2")


def held_out_rows(photos, measured, held: str, th: dict) -> list[tuple[str | None, int, float]]:
    """(type or None for clean, level, NR score) of every held-out image, scored by the fold's fit ``th``."""
    rows = []
    for p, m in zip(photos, measured):
        if p["source"] != held:
            continue
        rows.append((None, 0, fc.score_of(sv.analyze_stats(m["clean"]["nr"], None, th))))
        rows += [(r["type"], r["level"], fc.score_of(sv.analyze_stats(r["nr"], None, th)))
                 for r in m["rows"] if r["ladder"] == "alt"]
    return rows


def decompose(rows) -> dict[str, float]:
    types = [t for t, _, _ in rows]
    levels = np.array([lv for _, lv, _ in rows])
    scores = np.array([s for _, _, s in rows])
    groups: dict = defaultdict(list)
    for t, lv, s in rows:
        groups[(t, lv)].append(s)
    mean = {k: float(np.mean(v)) for k, v in groups.items()}
    common = {lv: float(scores[levels == lv].mean()) for lv in range(6)}
    type_scales = np.array([s if t is None else mean[(t, lv)] for t, lv, s in rows])
    photo_spread = scores.copy()
    for t in {t for t in types if t is not None}:
        idx = np.array([i for i, tt in enumerate(types) if tt == t])
        xs = np.array([mean[(t, lv)] for lv in range(1, 6)])
        ys = np.array([common[lv] for lv in range(1, 6)])
        order = np.argsort(xs)
        photo_spread[idx] = np.interp(scores[idx], xs[order], ys[order])
    srcc = lambda v: float(spearmanr(v, -levels)[0])  # noqa: E731
    keep = np.array([t not in TONE_TYPES for t in types])
    return {"measured": srcc(scores), "type_scales_only": srcc(type_scales), "photo_spread_only": srcc(photo_spread),
            "without_tone_types": float(spearmanr(scores[keep], -levels[keep])[0]), "n": len(rows), "level_means": mean}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1, help="processes for the per-fold fits")
    args = ap.parse_args(argv)
    photos = fc.build_corpus(fc.DEFAULT_CACHE, 512)
    measured = fc.measure_corpus(photos, fc.DEFAULT_CACHE, args.workers, "512")
    per_type: dict = defaultdict(list)
    figures: dict = defaultdict(list)
    print("held out         measured  type-scales-only  photo-spread-only  without-tone-types   (upper bounds use the fold's truth)")
    for held, _, _, th in fc.fold_fits(photos, measured, args.workers):
        d = decompose(held_out_rows(photos, measured, held, th))
        n_photos = sum(p["source"] == held for p in photos)
        for k in ("measured", "type_scales_only", "photo_spread_only", "without_tone_types"):
            figures[k].append((d[k], n_photos))
        print(f"{held:15s}  {d['measured']:.3f}     {d['type_scales_only']:.3f}             {d['photo_spread_only']:.3f}"
              f"              {d['without_tone_types']:.3f}")
        for (t, lv), v in d["level_means"].items():
            if t is not None:
                per_type[(t, lv)].append((v, n_photos))
    print("photo-weighted   " + "     ".join(f"{np.average([v for v, _ in f], weights=[w for _, w in f]):.3f}"
                                         for f in figures.values()))
    print("\nheld-out mean NR score per level (photo-weighted over the folds)")
    print("type".ljust(34) + "L1    L2    L3    L4    L5")
    for t in sorted({t for t, _ in per_type}):
        cells = [np.average([v for v, _ in per_type[(t, lv)]], weights=[w for _, w in per_type[(t, lv)]]) for lv in range(1, 6)]
        print(f"{t[:32]:34s}" + "  ".join(f"{c:.2f}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
