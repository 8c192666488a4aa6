"""Issue 10 part 5: how often the offline analyst answers a yes/no question right, on held-out photos.

    python benchmarks/question_accuracy.py [--workers 2] [--json benchmarks/corpus/questions.json]
    python benchmarks/question_accuracy.py --blind-report [--blind-source NAME]   # blind / spent sources, shipped fit

Uses the corpus and statistics cache of ``fit_corpus.py`` (it builds them on first use). Protocol: leave one
source out, as ``fit_corpus.py``: the analyst's thresholds are fitted on the other sources, then every clean photo
of the held-out source and all its damage under the ``alt`` ladder (parameter values the fit never saw) are asked
each question below, without the reference (NR) and with it (FR). The answer is the offline analyst's own
(``analyst.answer_question`` with the rule planner's plan, as ``agentic-iqa assess --offline`` answers); for the
quality questions its level is the analyst's expected level (the shipped NR answer, η 0; for FR the tool's share of
the fused score is left out).

The answer key was fixed before any answer was counted, from what was done to the image:

* a distortion question ("Is the image too dark?") is keyed **Yes** on its own damage at levels 3-5 (moderate or
  worse) and **No** on clean photos and on every other damage at levels 3-5, except the damage that shows the
  same symptom (``LOOKALIKE``: a strong JPEG2000 or pixelation does look blurry), which is not scored. Levels 1-2
  are not scored either: they may not be visible;
* a quality question ("Is the image of good quality?") is keyed Yes on clean photos and No on damage at levels
  4-5 (its negation, "Is the image degraded?", the other way round);
* "Is the image sharp?" is keyed as the negation of "Is the image blurry?", and the other questions asked the positive
  way ("Is the contrast good?") as the negation of theirs.

``--blind-report`` asks the same questions of the sources no fold and no fit used (manifest "blind": true), each
source on its own, with the shipped fit (``fit_corpus.blind_safe_thresholds``): figures on photos no choice looked at.

Reported per question and mode: accuracy where the key is Yes, where it is No (clean photos and other damage
apart), and their mean (balanced accuracy), pooled over the folds' images; the fold range of the balanced accuracy.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_corpus as fc  # noqa: E402
from agentic_iqa.agents.planner_rules import rule_plan  # noqa: E402
from agentic_iqa.fusion import level_letter  # noqa: E402
from agentic_iqa.offline import severity as sv  # noqa: E402
from agentic_iqa.offline.analyst import answer_question  # noqa: E402

# Over-exposure is keyed as brightening is: both are "too bright", and both show the same lookalike symptoms.
BLURS = {"gaussian blur", "lens blur", "motion blur"}
# Every benchmark type of the Noise category (a new kind of noise is keyed as noise without editing this file).
NOISES = {name for name, t in fc.synth.TYPES.items() if t.category == "Noise"}
# question -> (the damage it asks about, damage with the same symptom (not scored), negated: Yes means "absent")
DISTORTION_QUESTIONS: dict[str, tuple[set, set, bool]] = {
    "Is the image blurry? A. Yes B. No": (BLURS, {"jpeg2000", "pixelate"}, False),
    "Is the image sharp? A. Yes B. No": (BLURS, {"jpeg2000", "pixelate"}, True),
    "Is there noise in the image? A. Yes B. No": (NOISES, set(), False),
    "Is the image pixelated? A. Yes B. No": ({"pixelate"}, {"jpeg"}, False),
    "Does the image show compression artifacts? A. Yes B. No": ({"jpeg", "jpeg2000"}, {"pixelate", "color quantization"}, False),
    "Is the image too dark? A. Yes B. No": ({"darken"}, set(), False),
    "Is the image too bright? A. Yes B. No": ({"brighten", "overexposure"}, set(), False),
    "Is the image over-exposed? A. Yes B. No": ({"brighten", "overexposure"}, set(), False),
    "Is the contrast too low? A. Yes B. No": ({"contrast decrease"}, {"brighten", "overexposure"}, False),
    "Are the colours washed out? A. Yes B. No": ({"color saturation 1"}, {"contrast decrease", "brighten", "overexposure"}, False),
    "Are the colours over-saturated? A. Yes B. No": ({"color saturation 2"}, set(), False),
    "Is there colour banding? A. Yes B. No": ({"color quantization"}, {"jpeg", "pixelate"}, False),
    "Is the image over-sharpened? A. Yes B. No": ({"high sharpen"}, set(), False),
    # Asked the positive way: Yes means the damage is absent.
    "Is the image free of noise? A. Yes B. No": (NOISES, set(), True),
    "Is the exposure correct? A. Yes B. No": ({"darken", "brighten", "overexposure"}, set(), True),
    "Is the contrast good? A. Yes B. No": ({"contrast decrease"}, {"brighten", "overexposure"}, True),
}
# question -> Yes means good quality
QUALITY_QUESTIONS: dict[str, bool] = {
    "Is the image of good quality? A. Yes B. No": True,
    "Is this image degraded? A. Yes B. No": False,
}
QUESTIONS = list(DISTORTION_QUESTIONS) + list(QUALITY_QUESTIONS)


def key(question: str, damage: str | None, level: int) -> bool | None:
    """The answer key (True = Yes), or None where the image does not settle the question."""
    if question in QUALITY_QUESTIONS:
        good = True if damage is None else (False if level >= 4 else None)
        return None if good is None else good == QUALITY_QUESTIONS[question]
    asked, lookalike, negated = DISTORTION_QUESTIONS[question]
    if damage is not None and (level < 3 or damage in lookalike):
        return None
    present = damage in asked
    return present != negated


def answers_yes(question: str, analyses: dict, mode: str) -> bool:
    plan = rule_plan(question, has_reference=mode == "fr")
    return answer_question(question, plan, analyses, level_letter(fc.score_of(analyses))) == "A"


def ask_fold(photos, measured, thresholds) -> list[dict]:
    """One row per (image, mode, question) the key settles: what was asked and whether the answer was right."""
    rows = []
    for p, m in zip(photos, measured):
        images = [(None, 0, m["clean"])] + [(r["type"], r["level"], r) for r in m["rows"] if r["ladder"] == "alt"]
        for damage, level, st in images:
            for mode in ("nr", "fr"):
                analyses = sv.analyze_stats(st["nr"], st["fr"] if mode == "fr" else None, thresholds)
                for q in QUESTIONS:
                    k = key(q, damage, level)
                    if k is not None:
                        rows.append({"photo": p["name"], "mode": mode, "question": q, "damage": damage,
                                     "level": level, "key": k, "right": answers_yes(q, analyses, mode) == k})
    return rows


def summarize(rows: list[dict], folds: dict[str, list[dict]]) -> dict:
    def acc(rr):
        return (float(np.mean([r["right"] for r in rr])), len(rr)) if rr else (None, 0)

    def balanced(rr):
        yes, no = acc([r for r in rr if r["key"]])[0], acc([r for r in rr if not r["key"]])[0]
        return None if yes is None or no is None else (yes + no) / 2

    out = {}
    for mode in ("nr", "fr"):
        out[mode] = {}
        for q in QUESTIONS + ["all"]:
            rr = [r for r in rows if r["mode"] == mode and (q == "all" or r["question"] == q)]
            per_fold = [balanced([r for r in f if r["mode"] == mode and (q == "all" or r["question"] == q)]) for f in folds.values()]
            per_fold = [b for b in per_fold if b is not None]
            wrong = {}
            for r in rr:
                if not r["right"]:
                    name = r["damage"] or "clean"
                    wrong[name] = wrong.get(name, 0) + 1
            out[mode][q] = {
                "yes_key": acc([r for r in rr if r["key"]]),
                "no_key_clean": acc([r for r in rr if not r["key"] and r["damage"] is None]),
                "no_key_damage": acc([r for r in rr if not r["key"] and r["damage"] is not None]),
                "balanced": balanced(rr), "fold_range": [min(per_fold), max(per_fold)] if per_fold else None,
                "wrong_by_image": dict(sorted(wrong.items(), key=lambda kv: -kv[1])),
            }
    return out


def _fmt(a) -> str:
    return "   -   " if a[0] is None else f"{a[0]:.3f} ({a[1]})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=str(fc.DEFAULT_CACHE))
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", help="write the report here (default benchmarks/corpus/questions.json, with "
                                    "--blind-report questions_blind.json)")
    ap.add_argument("--blind-report", action="store_true", help="the blind sources, each on its own, with the shipped fit")
    ap.add_argument("--blind-source", action="append", metavar="NAME",
                    help="with --blind-report: only this blind source (repeat for more; default: every one)")
    args = ap.parse_args(argv)
    cache = Path(args.cache).expanduser()
    out = Path(args.json or ROOT / "benchmarks/corpus" / ("questions_blind.json" if args.blind_report else "questions.json"))
    head = {"protocol": __doc__.split("\n\n", 2)[2].strip(),
            "questions": {q: {"asks": sorted(v[0]), "lookalike": sorted(v[1]), "negated": v[2]}
                          for q, v in DISTORTION_QUESTIONS.items()},
            "quality_questions": QUALITY_QUESTIONS}
    if args.blind_report:
        thresholds = fc.blind_safe_thresholds(sv.THRESHOLDS_PATH)
        only = set(args.blind_source) if args.blind_source else None
        try:
            fc.check_blind_names(only)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        photos = fc.build_corpus(cache, args.size, blind=True, only=only)
        measured = fc.measure_corpus(photos, cache, args.workers, f"blind-{args.size}")
        reports = {}
        for source in sorted({p["source"] for p in photos}):
            idx = [i for i, p in enumerate(photos) if p["source"] == source]
            rows = ask_fold([photos[i] for i in idx], [measured[i] for i in idx], thresholds)
            reports[source] = summarize(rows, {source: rows})
            _print(f"{source} ({len(idx)} photos, shipped fit)", reports[source])
        out.write_text(json.dumps({**head, "thresholds": thresholds.get("provenance"), "sources": reports}, indent=1) + "\n")
    else:
        photos = fc.build_corpus(cache, args.size)
        measured = fc.measure_corpus(photos, cache, args.workers, str(args.size))
        folds = {}
        for held, test_photos, test_measured, thresholds in fc.fold_fits(photos, measured, args.workers):
            folds[held] = ask_fold(test_photos, test_measured, thresholds)
            print(f"held out {held}: {len(folds[held])} answers", flush=True)
        report = summarize([r for f in folds.values() for r in f], folds)
        _print("leave one source out", report)
        out.write_text(json.dumps({**head, "report": report}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def _print(title: str, report: dict) -> None:
    for mode in ("nr", "fr"):
        print(f"\n{title}, {mode.upper()}: question | key Yes | key No, clean | key No, other damage | balanced (fold range) | wrong on")
        for q, s in report[mode].items():
            fr = "" if s["fold_range"] is None else f" ({s['fold_range'][0]:.3f}-{s['fold_range'][1]:.3f})"
            top = ", ".join(f"{k} {v}" for k, v in list(s["wrong_by_image"].items())[:3])
            print(f"  {q.split(' A. ')[0]:48s} {_fmt(s['yes_key']):>14s} {_fmt(s['no_key_clean']):>13s} "
                  f"{_fmt(s['no_key_damage']):>14s} {s['balanced'] if s['balanced'] is None else round(s['balanced'], 3)}{fr} | {top}")


if __name__ == "__main__":
    raise SystemExit(main())
