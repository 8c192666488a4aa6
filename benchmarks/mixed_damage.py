"""Two kinds of damage at once, a blur with noise on top: is each one named, and does the pair score below each alone?

    python benchmarks/mixed_damage.py [--workers 2] [--per-source 2]          # held out, leave one source out
    python benchmarks/mixed_damage.py --blind-source cbsd68 --blind-source mcmaster   # evaluation-only sets

Held out (default): the folds of ``fit_corpus.py`` (each source scored by the analyst fitted without it; the
statistics of the single damage come from its cache), on the first ``--per-source`` photos of every source. With
``--blind-source``: the blind sources named, scored by the shipped fit. Each photo is blurred (Gaussian, lens or
motion blur) and then given noise (white or luminance noise) at the same level, 3 to 5, on the ``alt`` ladder: the
same parameters and random draws as that ladder's single damage, so each pair has its two parts alone beside it. No
pair of damage is in any fit. Per pair and over all: how often the blur is named (a "Blurs" category detected at
slight or worse), the noise named, both, and the pair scored below both of its parts alone (the analyst alone, NR).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fit_corpus as fc  # noqa: E402
from fit_corpus import st, sv, synth  # noqa: E402

BLURS = ("gaussian blur", "lens blur", "motion blur")
NOISES = ("white noise", "luminance noise")
LEVELS = (3, 4, 5)
LADDER = "alt"


def _damaged(x: np.ndarray, stem: str, type_name: str, level: int) -> np.ndarray:
    """``type_name`` at ``level`` on the ``alt`` ladder, with the draws fit_corpus.py's single damage of that photo uses."""
    t = synth.TYPES[type_name]
    return fc._apply(x, t, fc.ladder_param(t, level, LADDER), synth._rng(1, stem, t.name, level))


def measure_pairs(path: str) -> dict:
    """NR statistics of every (blur, noise, level) pair of one photo, keyed "blur|noise|level"."""
    x = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255
    stem = Path(path).stem
    out = {}
    for blur in BLURS:
        for level in LEVELS:
            blurred = _damaged(x, stem, blur, level)
            for noise in NOISES:
                out[f"{blur}|{noise}|{level}"] = st.measure(_damaged(blurred, stem, noise, level))
    return out


def _named(stats: dict, th: dict) -> tuple[set, float]:
    an = sv.analyze_stats(stats, None, th)
    return {d.category for d in sv.detect(None, analyses=an)}, fc.score_of(an)


def score_photo(measured_photo: dict, pairs: dict, th: dict) -> list[dict]:
    """One row per pair: what was named and the scores of the pair and of its parts alone."""
    alone = {(r["type"], r["level"]): _named(r["nr"], th)[1] for r in measured_photo["rows"] if r["ladder"] == LADDER}
    rows = []
    for key, stats in pairs.items():
        blur, noise, level = key.split("|")
        level = int(level)
        named, score = _named(stats, th)
        rows.append({"pair": f"{blur} + {noise}", "level": level, "score": score,
                     "blur_named": "Blurs" in named, "noise_named": "Noise" in named,
                     "below_both": score < min(alone[(blur, level)], alone[(noise, level)]),
                     "blur_alone": alone[(blur, level)], "noise_alone": alone[(noise, level)]})
    return rows


def summarize(rows: list[dict]) -> dict:
    def shares(rs):
        return {"n": len(rs), "blur_named": float(np.mean([r["blur_named"] for r in rs])),
                "noise_named": float(np.mean([r["noise_named"] for r in rs])),
                "both_named": float(np.mean([r["blur_named"] and r["noise_named"] for r in rs])),
                "below_both_alone": float(np.mean([r["below_both"] for r in rs])),
                "mean_score": float(np.mean([r["score"] for r in rs]))}
    by_pair = defaultdict(list)
    for r in rows:
        by_pair[r["pair"]].append(r)
    return {"all": shares(rows), "per_pair": {k: shares(v) for k, v in sorted(by_pair.items())},
            "per_level": {lv: shares([r for r in rows if r["level"] == lv]) for lv in LEVELS}}


def _print(title: str, summary: dict) -> None:
    print(f"\n{title}")
    print(f"{'':38s}{'n':>5s}  blur named  noise named  both   below both alone  mean score")
    lines = [("all", summary["all"])] + list(summary["per_pair"].items()) + \
            [(f"level {lv}", s) for lv, s in summary["per_level"].items()]
    for name, s in lines:
        print(f"{name:38s}{s['n']:5d}  {s['blur_named']:9.3f}  {s['noise_named']:10.3f}  {s['both_named']:5.3f}"
              f"  {s['below_both_alone']:15.3f}  {s['mean_score']:9.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    fc.add_probe_arguments(ap)
    args = ap.parse_args(argv)

    photos, chosen = fc.probe_photos(args)
    measured = fc.measure_corpus(photos, fc.DEFAULT_CACHE, args.workers, "blind-512" if args.blind_source else "512")
    print(f"{len(chosen)} photos, {len(BLURS) * len(NOISES) * len(LEVELS)} pairs each: measuring...", flush=True)
    with ProcessPoolExecutor(args.workers) as pool:
        pairs = dict(zip(chosen, pool.map(measure_pairs, [photos[i]["path"] for i in chosen])))
    fits, protocol = fc.probe_fits(args, photos, measured)
    rows = []
    for i in chosen:
        for r in score_photo(measured[i], pairs[i], fits[photos[i]["source"]]):
            rows.append({"source": photos[i]["source"], "photo": photos[i]["name"], **r})
    summary = summarize(rows)
    _print(f"Blur with noise on top ({LADDER} ladder, levels {LEVELS[0]}-{LEVELS[-1]}), NR, {protocol}", summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"protocol": protocol, "measure_code_key": fc._code_key(),
                                               "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
