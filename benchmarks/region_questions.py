"""Damage in one half of the frame: does the offline analyst answer a question about that half, and about the other?

    python benchmarks/region_questions.py [--workers 2] [--per-source 2]          # held out, leave one source out
    python benchmarks/region_questions.py --blind-source cbsd68 --blind-source mcmaster   # evaluation-only sets

Each photo gets one damage (Gaussian blur, motion blur, white noise, JPEG, darkening, grain with no colour in it,
salt-and-pepper noise) at level 3, 4 or 5 on the ``alt`` ladder (the draws of ``fit_corpus.py``'s single damage of
that photo) in one half of the frame only: the top,
bottom, left or right half in turn, the other half left clean. Two questions are asked of each image: "Is the <damaged
half> blurry?" (keyed Yes) and "Is the <other half> blurry?" (keyed No), with the damage's own word ("noisy", "too
dark", "show compression artifacts"); of every clean photo, each question of each half (keyed No). The same question
is asked of the image ("Is the image noisy?": keyed Yes on the half-damaged image, No on the clean photo), with the
image's score beside it. Answers are
``analyst.answer_question`` with the rule planner's plan, on the analyses of

* **the part**: the half cut from the working copy and measured alone (``analyst._crop``, as ``assess --offline``
  does now);
* **the whole image**: what the analyst measured before it measured parts (the same answer for both halves).

Held out (default): each source's photos scored by the analyst fitted without that source (``fit_corpus.py``'s
folds), the first ``--per-source`` photos of each. With ``--blind-source``: the evaluation-only sources named, all
their photos, scored by the shipped fit. No half-damaged image is in any fit, and nothing here was tuned on these
figures. Reported: accuracy where the key is Yes (the damaged half), where it is No (the other half; clean photos
apart), and their mean, per damage and level.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fit_corpus as fc  # noqa: E402
from fit_corpus import st, sv, synth  # noqa: E402

from agentic_iqa.agents.planner_rules import frame_part, rule_plan  # noqa: E402
from agentic_iqa.fusion import level_letter  # noqa: E402
from agentic_iqa.offline.analyst import _crop, answer_question  # noqa: E402

LADDER = "alt"
LEVELS = (3, 4, 5)
# damage -> the words of its question ("Is the top half blurry?")
QUESTIONS = {
    "gaussian blur": "Is the {} blurry? A. Yes B. No",
    "motion blur": "Is the {} blurry? A. Yes B. No",
    "white noise": "Is the {} noisy? A. Yes B. No",
    "jpeg": "Does the {} show compression artifacts? A. Yes B. No",
    "darken": "Is the {} too dark? A. Yes B. No",
    "luminance noise": "Is the {} noisy? A. Yes B. No",
    "impulse noise": "Is the {} noisy? A. Yes B. No",
}
# damage -> the question choosing between two halves (the pair in HALVES order)
WHICH = {
    "gaussian blur": "Which half is blurrier, the {} or the {}?",
    "motion blur": "Which half is blurrier, the {} or the {}?",
    "white noise": "Which half is noisier, the {} or the {}?",
    "jpeg": "Which half shows more compression artifacts, the {} or the {}?",
    "darken": "Which half is darker, the {} or the {}?",
    "luminance noise": "Which half is noisier, the {} or the {}?",
    "impulse noise": "Which half is noisier, the {} or the {}?",
}
HALVES = ("top half", "bottom half", "left half", "right half")
OPPOSITE = {"top half": "bottom half", "bottom half": "top half", "left half": "right half", "right half": "left half"}


def _half_damaged(x: np.ndarray, damaged: np.ndarray, half: str) -> np.ndarray:
    where = frame_part(half).slices(*x.shape[:2])
    out = x.copy()
    out[where] = damaged[where]
    return out


def _which_half(type_name: str, level: int, photo_index: int) -> str:
    """Every damage and level in each half in turn across photos."""
    return HALVES[(list(QUESTIONS).index(type_name) + level + photo_index) % len(HALVES)]


def _statistics(x: np.ndarray, reference: Optional[dict] = None, ref_pixels: Optional[np.ndarray] = None) -> dict:
    """{"whole" / each half: {"nr": its statistics, "fr": against the same part of the clean photo}}, each part
    measured alone; "fr" only with the clean photo (``ref_pixels``, and ``reference``: its own statistics)."""
    out = {}
    for where in ("whole", *HALVES):
        part = x if where == "whole" else _crop(x, frame_part(where))
        nr = st.measure(part)
        out[where] = {"nr": nr}
        if reference is not None:
            ref_part = ref_pixels if where == "whole" else _crop(ref_pixels, frame_part(where))
            out[where]["fr"] = st.measure_fr(part, ref_part, image_stats=nr, reference_stats=reference[where]["nr"])
    return out


def measure_photo(job: tuple[str, int]) -> dict:
    """{"clean": statistics, "type|level": (damaged half, statistics)} for one photo."""
    path, index = job
    x = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255
    stem = Path(path).stem
    clean = _statistics(x)
    out: dict = {"clean": clean}
    for type_name in QUESTIONS:
        t = synth.TYPES[type_name]
        for level in LEVELS:
            damaged = fc._apply(x, t, fc.ladder_param(t, level, LADDER), synth._rng(1, stem, t.name, level))
            half = _which_half(type_name, level, index)
            out[f"{type_name}|{level}"] = (half, _statistics(_half_damaged(x, damaged, half), clean, x))
    return out


def _yes(query: str, analyses: dict, parts=(), reference: bool = False) -> str:
    """The analyst's answer, as ``assess --offline`` gives it (``reference``: the image came with one)."""
    plan = rule_plan(query, has_reference=reference)
    return answer_question(query, plan, analyses, level_letter(fc.score_of(analyses)), parts=parts)


def _which_question(type_name: str, damaged_half: str) -> tuple[str, str]:
    """("Which half is blurrier, the top or the bottom? A. The top B. The bottom", the letter of the damaged half)."""
    first, second = sorted((damaged_half, OPPOSITE[damaged_half]), key=HALVES.index)
    a, b = first.split()[0], second.split()[0]
    return WHICH[type_name].format(a, b) + f" A. The {a} B. The {b}", "A" if damaged_half == first else "B"


# Every row has every field (one header for the record): what a row does not ask is None.
_ANSWERS = {"part_yes": None, "whole_yes": None, "part_fr_yes": None, "whole_fr_yes": None, "score": None, "score_fr": None}


def _row(kind: str, damage: str, asked_about: str, level: int, half: Optional[str], key: bool, **answers) -> dict:
    return {"kind": kind, "damage": damage, "asked_about": asked_about, "level": level, "half": half, "key": key,
            **_ANSWERS, **answers}


def score_photo(measured: dict, th: dict) -> list[dict]:
    """One row per question: "is" rows ask whether a half shows the damage (keyed Yes on the damaged half, No on the
    other and on every half of the clean photo); "which" rows ask which half shows more of it (keyed the damaged
    half; ``*_yes`` is then whether the answer names it); "image" rows ask it of the whole image (keyed Yes on the
    half-damaged image, No on the clean photo), with its scores. Each answered from the part measured alone and from
    the whole image, without the reference and (damaged photos) with it."""
    rows = []
    clean = {k: sv.analyze_stats(v["nr"], None, th) for k, v in measured["clean"].items()}
    for type_name, question in QUESTIONS.items():
        image_query = question.format("image")
        rows.append(_row("image", "clean", type_name, 0, None, False,
                         whole_yes=_yes(image_query, clean["whole"]) == "A", score=fc.score_of(clean["whole"])))
        for half in HALVES:
            query = question.format(half)
            rows.append(_row("is", "clean", type_name, 0, half, False, part_yes=_yes(query, clean[half]) == "A",
                             whole_yes=_yes(query, clean["whole"]) == "A"))
        for level in LEVELS:
            damaged_half, stats = measured[f"{type_name}|{level}"]
            nr = {k: sv.analyze_stats(v["nr"], None, th) for k, v in stats.items()}
            fr = {k: sv.analyze_stats(v["nr"], v["fr"], th) for k, v in stats.items()}
            rows.append(_row("image", type_name, type_name, level, damaged_half, True,
                             whole_yes=_yes(image_query, nr["whole"]) == "A",
                             whole_fr_yes=_yes(image_query, fr["whole"], reference=True) == "A",
                             score=fc.score_of(nr["whole"]), score_fr=fc.score_of(fr["whole"])))
            for half, key in ((damaged_half, True), (OPPOSITE[damaged_half], False)):
                query = question.format(half)
                rows.append(_row("is", type_name, type_name, level, half, key,
                                 part_yes=_yes(query, nr[half]) == "A", whole_yes=_yes(query, nr["whole"]) == "A",
                                 part_fr_yes=_yes(query, fr[half], reference=True) == "A",
                                 whole_fr_yes=_yes(query, fr["whole"], reference=True) == "A"))
            query, right = _which_question(type_name, damaged_half)
            pair = sorted((damaged_half, OPPOSITE[damaged_half]), key=HALVES.index)
            rows.append(_row("which", type_name, type_name, level, damaged_half, True,
                             part_yes=_yes(query, nr[damaged_half], [(h, nr[h]) for h in pair]) == right,
                             whole_yes=_yes(query, nr["whole"]) == right,
                             part_fr_yes=_yes(query, fr[damaged_half], [(h, fr[h]) for h in pair], True) == right,
                             whole_fr_yes=_yes(query, fr["whole"], reference=True) == right))
    return rows


HOWS = ("part", "whole", "part_fr", "whole_fr")


def _shares(rows: list[dict]) -> dict:
    out = {}
    for how in HOWS:
        yes = [r[f"{how}_yes"] for r in rows if r["key"] and r[f"{how}_yes"] is not None]
        no = [not r[f"{how}_yes"] for r in rows if not r["key"] and r[f"{how}_yes"] is not None]
        out[how] = {"damaged_half_yes": float(np.mean(yes)) if yes else None,
                    "other_half_no": float(np.mean(no)) if no else None,
                    "balanced": float(np.mean([np.mean(yes), np.mean(no)])) if yes and no else None}
    out["n"] = len(rows)
    return out


def summarize(rows: list[dict]) -> dict:
    damaged = [r for r in rows if r["damage"] != "clean" and r["kind"] == "is"]
    clean = [r for r in rows if r["damage"] == "clean" and r["kind"] == "is"]
    which = [r for r in rows if r["kind"] == "which"]
    image = [r for r in rows if r["kind"] == "image"]
    by_damage, by_level = defaultdict(list), defaultdict(list)
    for r in damaged:
        by_damage[r["damage"]].append(r)
        by_level[r["level"]].append(r)
    return {"all": _shares(damaged),
            "per_damage": {k: _shares(v) for k, v in by_damage.items()},
            "per_level": {lv: _shares(v) for lv, v in sorted(by_level.items())},
            "clean_photos_no": {how: float(np.mean([not r[f"{how}_yes"] for r in clean])) for how in ("part", "whole")},
            "clean_photos_no_per_question": {t: {how: float(np.mean([not r[f"{how}_yes"] for r in clean
                                                                      if r["asked_about"] == t]))
                                                 for how in ("part", "whole")} for t in QUESTIONS},
            "which_half_right": {"n": len(which), **{how: float(np.mean([r[f"{how}_yes"] for r in which])) for how in HOWS},
                                 "per_damage": {t: {how: float(np.mean([r[f"{how}_yes"] for r in which if r["damage"] == t]))
                                                    for how in HOWS} for t in QUESTIONS}},
            "image_question": {t: _image_shares([r for r in image if r["asked_about"] == t]) for t in QUESTIONS}}


def _image_shares(rows: list[dict]) -> dict:
    """The question asked of the whole image: Yes on the half-damaged images (without and with the reference) and on
    the clean photos, and the mean scores."""
    damaged, clean = [r for r in rows if r["key"]], [r for r in rows if not r["key"]]
    return {"n": len(damaged), "damaged_yes": float(np.mean([r["whole_yes"] for r in damaged])),
            "damaged_yes_fr": float(np.mean([r["whole_fr_yes"] for r in damaged])),
            "clean_yes": float(np.mean([r["whole_yes"] for r in clean])),
            "score_damaged": float(np.mean([r["score"] for r in damaged])),
            "score_damaged_fr": float(np.mean([r["score_fr"] for r in damaged])),
            "score_clean": float(np.mean([r["score"] for r in clean])),
            "per_level": {lv: {"damaged_yes": float(np.mean([r["whole_yes"] for r in damaged if r["level"] == lv])),
                               "score_damaged": float(np.mean([r["score"] for r in damaged if r["level"] == lv]))}
                          for lv in LEVELS}}


def _print(title: str, s: dict) -> None:
    print(f"\n{title}")
    print(f"{'':22s}{'n':>5s}   part measured alone: Yes on damaged / No on other / mean"
          f"   whole image: Yes / No / mean")
    lines = [("all", s["all"])] + list(s["per_damage"].items()) + [(f"level {lv}", v) for lv, v in s["per_level"].items()]
    for name, v in lines:
        p, w = v["part"], v["whole"]
        print(f"{name:22s}{v['n']:5d}   {p['damaged_half_yes']:21.3f} {p['other_half_no']:9.3f} {p['balanced']:7.3f}"
              f"   {w['damaged_half_yes']:13.3f} {w['other_half_no']:5.3f} {w['balanced']:6.3f}")
    print(f"{'':22s}{'':5s}   with the reference: part {s['all']['part_fr']['balanced']:.3f}, "
          f"whole {s['all']['whole_fr']['balanced']:.3f} (balanced)")
    w = s["which_half_right"]
    print(f"which half shows more of it (n {w['n']}): right on part {w['part']:.3f}, whole {w['whole']:.3f}; "
          f"with the reference part {w['part_fr']:.3f}, whole {w['whole_fr']:.3f}")
    for t, v in w["per_damage"].items():
        print(f"  {t:15s} part {v['part']:.3f}  whole {v['whole']:.3f}  part FR {v['part_fr']:.3f}  whole FR {v['whole_fr']:.3f}")
    print("clean photos, every half, every question: No on " +
          ", ".join(f"{how} {v:.3f}" for how, v in s["clean_photos_no"].items()))
    for t, v in s["clean_photos_no_per_question"].items():
        print(f"  {t + ':':15s}{QUESTIONS[t].format('<half>'):58s} part {v['part']:.3f}  whole {v['whole']:.3f}")
    print("asked of the whole image (\"Is the image noisy?\"): Yes on the half-damaged image / with the reference / "
          "on the clean photo; score half-damaged / with the reference / clean")
    for t, v in s["image_question"].items():
        levels = ", ".join(f"level {lv} {x['damaged_yes']:.3f} ({x['score_damaged']:.2f})" for lv, x in v["per_level"].items())
        print(f"  {t:15s} {v['damaged_yes']:.3f} / {v['damaged_yes_fr']:.3f} / {v['clean_yes']:.3f};  "
              f"{v['score_damaged']:.2f} / {v['score_damaged_fr']:.2f} / {v['score_clean']:.2f}   [{levels}]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    fc.add_probe_arguments(ap)
    args = ap.parse_args(argv)

    photos, chosen = fc.probe_photos(args)
    print(f"{len(chosen)} photos, {len(QUESTIONS) * len(LEVELS)} half-damaged images each: measuring...", flush=True)
    with ProcessPoolExecutor(args.workers) as pool:
        measured = dict(zip(chosen, pool.map(measure_photo, [(photos[i]["path"], i) for i in chosen])))
    fits, protocol = fc.probe_fits(args, photos)
    rows = []
    for i in chosen:
        for r in score_photo(measured[i], fits[photos[i]["source"]]):
            rows.append({"source": photos[i]["source"], "photo": photos[i]["name"], **r})
    summary = summarize(rows)
    _print(f"Damage in one half of the frame ({LADDER} ladder, levels {LEVELS[0]}-{LEVELS[-1]}), NR, {protocol}", summary)
    if args.json:
        fields = list(rows[0])  # rows as lists under one header: a third of the size of repeated keys
        Path(args.json).write_text(json.dumps({"protocol": protocol, "measure_code_key": fc._code_key(),
                                               "summary": summary, "row_fields": fields,
                                               "rows": [[r[f] for f in fields] for r in rows]}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
