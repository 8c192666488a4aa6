"""Rebuild the shipped fixtures: `python -m optimizers.build_fixtures [--out DIR]`.

The committed files in optimizers/fixtures/ are this script's output; it exists so that every label
can be traced to a rule:

- planner.jsonl: the four paper-style examples (DESIGN §3's flag table cases, written with the
  paper's own spellings) and hand-written queries covering every row of the flag table. Each line's
  facts (type, scope, named distortions, named tools) are written here by hand; the four flags are
  computed from them with PlanControlFlags.from_rules, the table itself.
- detect / analyze / summarize: real images made with the synthetic KADID-style generator
  (agentic_iqa.bench.synth) at 256×192, so their distortion type and level are known exactly.
  detect: the type's category. analyze: level 2..5 → slight..extreme for that category, "none" for
  a second, unrelated category (and for both on an undistorted image). summarize/score: undistorted
  → A, level 2..5 → B..E, with evidence holding that analysis and a real PIQE score of the image.
  summarize/explain: multiple-choice and yes/no questions about the applied distortion.
  Level 1 is not used: KADID's weakest level is often invisible, so its label would be a guess.
- select.jsonl: distortion sets with the tools whose table strengths cover each category
  (FR tools with a reference, NR tools without).
- tool_catalog.json: the tool table (modes, strengths, selector descriptions) frozen with the labels.

Split by reference image (as the synthetic benchmark does): chelsea, astronaut and camera are
train; coffee, rocket and coins are val, so no validation image shares content with a training one.
"""
from __future__ import annotations

import argparse
import io
import json
import random
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

SIZE = (256, 192)
SEED = 0
FIXED_TIME = datetime(2025, 1, 1, tzinfo=timezone.utc)  # tool logs carry a timestamp; keep builds identical
SEVERITY_OF_LEVEL = {0: "none", 2: "slight", 3: "moderate", 4: "severe", 5: "extreme"}
LEVEL_OF_LEVEL = {0: "A", 2: "B", 3: "C", 4: "D", 5: "E"}
TRAIN_REFS = ("chelsea", "astronaut", "camera")
VAL_REFS = ("coffee", "rocket", "coins")

# (reference, synthetic type or None for the undistorted image, level)
IMAGES: list[tuple[str, Optional[str], int]] = [
    ("chelsea", None, 0), ("chelsea", "gaussian blur", 4), ("chelsea", "white noise", 3), ("chelsea", "jpeg", 5),
    ("chelsea", "darken", 4), ("chelsea", "color saturation 2", 4), ("chelsea", "contrast decrease", 3),
    ("chelsea", "high sharpen", 2),
    ("astronaut", None, 0), ("astronaut", "motion blur", 3), ("astronaut", "jpeg", 3), ("astronaut", "brighten", 4),
    ("astronaut", "high sharpen", 4), ("astronaut", "color saturation 1", 5), ("astronaut", "white noise", 5),
    ("astronaut", "gaussian blur", 2),
    ("camera", "gaussian blur", 5), ("camera", "white noise", 2), ("camera", "contrast decrease", 5),
    ("camera", "jpeg", 4), ("camera", "darken", 2), ("camera", "lens blur", 3),
    ("coffee", None, 0), ("coffee", "gaussian blur", 3), ("coffee", "white noise", 4), ("coffee", "jpeg", 4),
    ("coffee", "brighten", 3), ("coffee", "color saturation 1", 4), ("coffee", "high sharpen", 3),
    ("rocket", "motion blur", 4), ("rocket", "contrast decrease", 4), ("rocket", "jpeg", 2), ("rocket", "darken", 5),
    ("rocket", "color saturation 2", 3),
    ("coins", "gaussian blur", 2), ("coins", "white noise", 3), ("coins", "jpeg", 5),
]

# A second category to analyse that the type does not produce (its label is "none").
DECOY = {
    "Blurs": "Noise", "Noise": "Blurs", "Compression": "Brightness change", "Brightness change": "Blurs",
    "Contrast": "Noise", "Color distortions": "Blurs", "Sharpness": "Blurs",
}
CLEAN_PAIRS = [("Blurs", "Noise"), ("Compression", "Contrast"), ("Noise", "Brightness change")]

ADVERB = {"slight": "slightly", "moderate": "moderately", "severe": "strongly", "extreme": "extremely"}
EXPLANATION = {
    "gaussian blur": "Edges and fine texture are {adv} softened across the frame.",
    "lens blur": "Edges and fine texture are {adv} softened, as if out of focus.",
    "motion blur": "Edges are {adv} smeared in one direction, as from camera shake.",
    "white noise": "Random grain is {adv} visible, most of all in flat areas.",
    "jpeg": "Blocking and ringing around edges are {adv} visible.",
    "brighten": "The image is {adv} too bright; light tones lose detail.",
    "darken": "The image is {adv} too dark; shadows lose detail.",
    "contrast decrease": "Tones are {adv} flattened towards grey; the image looks washed out.",
    "color saturation 1": "Colours are {adv} desaturated and look dull.",
    "color saturation 2": "Colours are {adv} oversaturated and look garish.",
    "high sharpen": "Edges show {adv} strong halos and exaggerated texture from oversharpening.",
}
NONE_EXPLANATION = {
    "Blurs": "Edges are crisp; no blur is visible.",
    "Noise": "Flat areas are clean; no grain is visible.",
    "Compression": "No blocking or ringing is visible.",
    "Brightness change": "Exposure looks natural; highlights and shadows keep detail.",
    "Contrast": "Tones span a natural range; no loss of contrast.",
    "Color distortions": "Colours look natural.",
    "Sharpness": "No halos or oversharpening artefacts.",
}
NOUN = {"Blurs": "blurry", "Noise": "noisy", "Compression": "affected by compression artifacts",
        "Brightness change": "badly exposed", "Contrast": "low in contrast", "Color distortions": "off in colour",
        "Sharpness": "oversharpened"}
DETECT_QUERIES = [
    "What distortions affect this image?",
    "Which kinds of degradation can you see in this photo?",
    "Identify the distortions that reduce the quality of this picture.",
    "Rate the quality of this image.",
]
ANALYZE_QUERIES = ["Rate the quality of this image.", "How severe are the distortions in this photo?"]
SCORE_QUERIES = [
    "Rate the overall quality of this image.",
    "How would you grade the quality of this photo?",
    "Give this picture a quality rating.",
]
SCORE_REASONING = {
    "A": "No visible distortion; the tool score agrees that quality is high.",
    "B": "A slight {cat} is visible but barely affects the image.",
    "C": "A moderate {cat} is clearly visible and lowers the quality.",
    "D": "A severe {cat} dominates the image.",
    "E": "An extreme {cat} destroys most detail.",
}
CATEGORY_WORD = {"Blurs": "blur", "Noise": "noise", "Compression": "compression artifact",
                 "Brightness change": "exposure error", "Contrast": "loss of contrast",
                 "Color distortions": "colour distortion", "Sharpness": "oversharpening"}


# ── planner ─────────────────────────────────────────────────────────────────────────────────────

# (id, query, has_reference, query_type, scope, distortions, tools, split)
# scope None = ["Global"]; distortions {object: [categories]} or None; tools list or None.
PLANNER_CASES: list[tuple] = [
    # Other: all four flags false
    ("other-calm", "Does this photo feel calm or tense?", False, "Other", None, None, None, "train"),
    ("other-composition", "Is the composition of this picture balanced?", False, "Other", None, None, None, "val"),
    ("other-style", "What artistic style does this image remind you of?", False, "Other", None, None, None, "train"),
    ("other-dog-cute", "Is the dog in this photo cute?", False, "Other", ["dog"], None, None, "val"),
    ("other-aesthetic", "How aesthetically pleasing is this photograph?", False, "Other", None, None, None, "train"),
    # Explicit distortion, region and tool named: detection off, selection off, execution on
    ("exp-region-tool-sky", "Use QAlign to check whether the sky is noisy.", False, "IQA", ["sky"], {"sky": ["Noise"]}, ["QAlign"], "train"),
    ("exp-region-tool-face", "Measure the blur on the face with TOPIQ_FR.", True, "IQA", ["face"], {"face": ["Blurs"]}, ["TOPIQ_FR"], "val"),
    ("exp-region-tool-car", "Check the compression artifacts on the car with UNIQUE.", False, "IQA", ["car"], {"car": ["Compression"]}, ["UNIQUE"], "train"),
    # Explicit distortion, region, no tool: selection and execution off
    ("exp-region-sky-noise", "Is the sky noisy?", False, "IQA", ["sky"], {"sky": ["Noise"]}, None, "train"),
    ("exp-region-face-focus", "Is the man's face out of focus?", False, "IQA", ["face"], {"face": ["Blurs"]}, None, "val"),
    ("exp-region-trees-sharpen", "Are the trees in the background oversharpened?", False, "IQA", ["trees"], {"trees": ["Sharpness"]}, None, "train"),
    ("exp-region-building-mcq", "How is the brightness of the building? A. Too dark B. Normal C. Too bright", False, "IQA", ["building"], {"building": ["Brightness change"]}, None, "val"),
    # Explicit distortion, tool, no region: selection off, execution on
    ("exp-tool-niqe-noise", "Use NIQE to check how noisy this image is.", False, "IQA", None, {"Global": ["Noise"]}, ["NIQE"], "train"),
    ("exp-tool-vif-jpeg", "Measure the JPEG compression with VIF.", True, "IQA", None, {"Global": ["Compression"]}, ["VIF"], "val"),
    ("exp-tool-dists-blur", "Evaluate the blur using DISTS.", True, "IQA", None, {"Global": ["Blurs"]}, ["DISTS"], "train"),
    ("exp-tool-unique-contrast", "How strong is the contrast loss according to UNIQUE?", False, "IQA", None, {"Global": ["Contrast"]}, ["UNIQUE"], "val"),
    # Explicit distortion, neither region nor tool: detection off, selection and execution on
    ("exp-blurry-yesno", "Is this image blurry? A. Yes B. No", False, "IQA", None, {"Global": ["Blurs"]}, None, "train"),
    ("exp-how-noisy", "How noisy is this photo?", False, "IQA", None, {"Global": ["Noise"]}, None, "val"),
    ("exp-jpeg-artifacts", "Does the image suffer from JPEG compression artifacts?", False, "IQA", None, {"Global": ["Compression"]}, None, "train"),
    ("exp-overexposed", "Is the image overexposed?", False, "IQA", None, {"Global": ["Brightness change"]}, None, "val"),
    ("exp-mcq-options", "Which distortion is most visible? A. Blur B. Noise C. JPEG compression D. Low contrast", False, "IQA", None,
     {"Global": ["Blurs", "Noise", "Compression", "Contrast"]}, None, "train"),
    # Inferred, region and tool: detection on, selection off, execution on
    ("inf-region-tool-face", "Rate the quality of the face with QAlign.", False, "IQA", ["face"], None, ["QAlign"], "train"),
    ("inf-region-tool-sky", "Score the sky region using CLIPIQA.", False, "IQA", ["sky"], None, ["CLIPIQA"], "val"),
    ("inf-region-tool-building", "Assess the quality of the building with SSIM against the reference.", True, "IQA", ["building"], None, ["SSIM"], "train"),
    # Inferred, region, no tool: detection on, selection and execution off
    ("inf-region-sky", "How is the quality of the sky?", False, "IQA", ["sky"], None, None, "train"),
    ("inf-region-building-look", "How does the building look?", False, "IQA", ["building"], None, None, "val"),
    ("inf-region-fur", "What is wrong with the dog's fur?", False, "IQA", ["fur"], None, None, "train"),
    ("inf-region-car", "Is the car in good technical condition in this shot? A. Yes B. No", False, "IQA", ["car"], None, None, "val"),
    # Inferred, tool, no region: detection on, selection off, execution on
    ("inf-tool-musiq", "Score this image with MUSIQ.", False, "IQA", None, None, ["MUSIQ"], "train"),
    ("inf-tool-psnr", "Compute the PSNR against the reference.", True, "IQA", None, None, ["PSNR"], "val"),
    ("inf-tool-niqe", "What does NIQE say about this image?", False, "IQA", None, None, ["NIQE"], "train"),
    ("inf-tool-two", "Evaluate this photo using LIQE and QAlign.", False, "IQA", None, None, ["LIQE", "QAlign"], "val"),
    # Inferred, neither: all four on
    ("inf-rate", "Rate the quality of this image.", False, "IQA", None, None, None, "train"),
    ("inf-high-quality", "Is this a high-quality photo?", False, "IQA", None, None, None, "val"),
    ("inf-main-distortion", "What is the main distortion in this image?", False, "IQA", None, None, None, "train"),
    ("inf-score-1-5", "Give this picture a quality score from 1 to 5.", False, "IQA", None, None, None, "val"),
    ("inf-compare-reference", "How does this image compare with the reference in quality?", True, "IQA", None, None, None, "train"),
]

# The paper's four flag-table cases (DESIGN §3), in the paper's own spellings: "Explict",
# "tool_execute", reference_mode inside the plan, scope as a bare string. The loader normalizes them.
PAPER_LINES: list[dict[str, Any]] = [
    {"id": "paper-1-region-mcq", "split": "train", "query": "Is the sky in this photo blurry? A. Yes B. No", "has_reference": False,
     "planner_output": {"query_type": "IQA", "query_scope": "sky", "distortion_source": "Explict",
                        "distortions": {"sky": ["Blurs"]}, "reference_mode": "No-reference", "required_tool": None,
                        "plan": {"distortion_detection": False, "distortion_analysis": True, "tool_selection": False,
                                 "tool_execute": False}}},
    {"id": "paper-2-region-tool", "split": "val", "query": "Use LPIPS to check the compression artifacts on the building.",
     "has_reference": True,
     "planner_output": {"query_type": "IQA", "query_scope": ["building"], "distortion_source": "Explict",
                        "distortions": {"building": ["Compression"]}, "reference_mode": "Full-reference",
                        "required_tool": ["LPIPS"],
                        "plan": {"distortion_detection": False, "distortion_analysis": True, "tool_selection": False,
                                 "tool_execute": True}}},
    {"id": "paper-3-tool", "split": "train", "query": "Rate the quality of this image with QAlign.", "has_reference": False,
     "planner_output": {"query_type": "IQA", "query_scope": "Global", "distortion_source": "Inferred", "distortions": None,
                        "reference_mode": "No-reference", "required_tool": ["QAlign"],
                        "plan": {"distortion_detection": True, "distortion_analysis": True, "tool_selection": False,
                                 "tool_execute": True}}},
    {"id": "paper-4-overall", "split": "val", "query": "How good is the overall quality of this image?", "has_reference": False,
     "planner_output": {"query_type": "IQA", "query_scope": "Global", "distortion_source": "Inferred", "distortions": None,
                        "reference_mode": "No-reference", "required_tool": None,
                        "plan": {"distortion_detection": True, "distortion_analysis": True, "tool_selection": True,
                                 "tool_execute": True}}},
]
PLANNER_IMAGE = "images/chelsea__clean.png"


def planner_lines() -> list[dict[str, Any]]:
    from signatures.models import PlanControlFlags

    lines = []
    for line in PAPER_LINES:
        lines.append({**line, "image": PLANNER_IMAGE, "source": "paper", "label_source": "paper (DESIGN §3)"})
    for cid, query, ref, qtype, scope, dists, tools, split in PLANNER_CASES:
        scope = scope or ["Global"]
        flags = PlanControlFlags.from_rules(
            query_type=qtype,
            distortion_source="Explicit" if dists else "Inferred",
            region_named=scope != ["Global"],
            tool_named=bool(tools),
        )
        lines.append({
            "id": cid, "split": split, "query": query, "has_reference": ref, "image": PLANNER_IMAGE,
            "source": "hand-written", "label_source": "rules (DESIGN §3 flag table)",
            "planner_output": {
                "query_type": qtype, "query_scope": scope,
                "distortion_source": "Explicit" if dists else "Inferred",
                "distortions": dists, "required_tool": tools, "plan": flags.model_dump(),
            },
        })
    return lines


# ── images and image-based lines ────────────────────────────────────────────────────────────────


def image_name(ref: str, typ: Optional[str], level: int) -> str:
    if typ is None:
        return f"{ref}__clean.png"
    from agentic_iqa.bench import synth

    ext = "jpg" if typ == "jpeg" else "png"  # JPEG rows keep the encoder's bytes
    return f"{ref}__{synth.slug(typ)}__L{level}.{ext}"


def write_images(out: Path) -> dict[str, bytes]:
    import cv2

    from agentic_iqa.bench import synth

    (out / "images").mkdir(parents=True, exist_ok=True)
    written: dict[str, bytes] = {}
    for ref, typ, level in IMAGES:
        img = synth.load_reference(ref, SIZE)
        result = img if typ is None else synth.distort(img, typ, level, SEED, ref)
        if isinstance(result, bytes):
            data = result
        else:
            # Maximum lossless compression: the committed fixture images must stay small.
            ok, buf = cv2.imencode(".png", synth.to_uint8(result)[..., ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 9])
            assert ok
            data = buf.tobytes()
        name = image_name(ref, typ, level)
        (out / "images" / name).write_bytes(data)
        written[name] = data
    return written


def _category(typ: Optional[str]) -> Optional[str]:
    if typ is None:
        return None
    from agentic_iqa.bench.manifest import KNOWN_TYPES

    return KNOWN_TYPES[typ]


def _analysis(ref: str, typ: Optional[str], level: int, index: int) -> tuple[dict, dict]:
    """(distortion_set, distortion_analysis) labels for one image."""
    if typ is None:
        a, b = CLEAN_PAIRS[index % len(CLEAN_PAIRS)]
        return ({"Global": [a, b]},
                {"Global": [{"type": c, "severity": "none", "explanation": NONE_EXPLANATION[c]} for c in (a, b)]})
    cat = _category(typ)
    decoy = DECOY[cat]
    sev = SEVERITY_OF_LEVEL[level]
    return ({"Global": [cat, decoy]},
            {"Global": [
                {"type": cat, "severity": sev, "explanation": EXPLANATION[typ].format(adv=ADVERB[sev])},
                {"type": decoy, "severity": "none", "explanation": NONE_EXPLANATION[decoy]},
            ]})


def image_lines(images: dict[str, bytes]) -> dict[str, list[dict[str, Any]]]:
    from iqa_tools import ToolRegistry

    registry = ToolRegistry(cache=False)
    rng = random.Random(SEED)
    from iqa_tools.categories import DISTORTION_CATEGORIES

    out: dict[str, list[dict[str, Any]]] = {"detect": [], "analyze": [], "summarize": []}
    for i, (ref, typ, level) in enumerate(IMAGES):
        name = image_name(ref, typ, level)
        rel = f"images/{name}"
        split = "train" if ref in TRAIN_REFS else "val"
        stem = name.rsplit(".", 1)[0]
        meta = {"reference": ref, "type": typ, "level": level or None, "generator": "agentic_iqa.bench.synth",
                "size": list(SIZE), "seed": SEED}
        meta = {k: v for k, v in meta.items() if v is not None}
        source = f"synthetic:{ref}/{typ or 'clean'}" + (f"/L{level}" if typ else "")
        common = {"split": split, "source": source, "label_source": "synthetic (known type and level)", "meta": meta}
        cat = _category(typ)
        if typ is not None:
            out["detect"].append({"id": f"detect-{stem}", **common, "image": rel, "query": DETECT_QUERIES[i % len(DETECT_QUERIES)],
                                  "query_scope": ["Global"], "distortion_set": {"Global": [cat]}})
        dset, analysis = _analysis(ref, typ, level, i)
        out["analyze"].append({"id": f"analyze-{stem}", **common, "image": rel, "query": ANALYZE_QUERIES[i % len(ANALYZE_QUERIES)],
                               "distortion_set": dset, "distortion_analysis": analysis})
        # Evidence as the Executor would hand it over: the analysis plus a real PIQE score of this image.
        piqe = registry.score("PIQE", images[name], use_cache=False)
        score_key = cat or "Overall"
        log = piqe.to_log(object_name="Global", distortion=score_key).model_copy(update={"timestamp": FIXED_TIME, "execution_time": 0.0})
        evidence = {"distortion_set": dset, "distortion_analysis": analysis,
                    "quality_scores": {"Global": {score_key: ["PIQE", round(piqe.normalized_score, 4)]}},
                    "tool_logs": [json.loads(log.model_dump_json())]}
        lvl = LEVEL_OF_LEVEL[level]
        out["summarize"].append({
            "id": f"score-{stem}", **common, "mode": "score", "image": rel, "query": SCORE_QUERIES[i % len(SCORE_QUERIES)],
            "evidence": evidence, "level": lvl,
            "quality_reasoning": SCORE_REASONING[lvl].format(cat=CATEGORY_WORD.get(cat or "", "")),
            "need_replan": False, "replan_reason": None,
        })
        if typ is not None and level >= 3:
            # Questions only where the distortion is clearly visible (level 3+), alternating kinds.
            if i % 2 == 0:
                others = rng.sample([c for c in DISTORTION_CATEGORIES if c != cat], 3)
                choices = [cat] + others
                rng.shuffle(choices)
                options = dict(zip("ABCD", choices))
                letter = next(k for k, v in options.items() if v == cat)
                query = "Which distortion is most visible in this image? " + " ".join(f"{k}. {v}" for k, v in options.items())
                reasoning = f"The analysis finds {SEVERITY_OF_LEVEL[level]} {CATEGORY_WORD[cat]}, and it is plainly visible."
            else:
                asked = cat if rng.random() < 0.5 else DECOY[cat]
                letter = "A" if asked == cat else "B"
                query = f"Is this image {NOUN[asked]}? A. Yes B. No"
                reasoning = (f"Yes: the {CATEGORY_WORD[cat]} is {SEVERITY_OF_LEVEL[level]} and plainly visible."
                             if asked == cat else f"No: {NONE_EXPLANATION[asked]}")
            out["summarize"].append({
                "id": f"explain-{stem}", **common, "mode": "explain", "image": rel, "query": query,
                "evidence": {"distortion_set": dset, "distortion_analysis": analysis},
                "final_answer": letter, "quality_reasoning": reasoning, "need_replan": False, "replan_reason": None,
            })
    return out


# ── selection ───────────────────────────────────────────────────────────────────────────────────

SELECT_SETS: list[tuple[str, dict[str, list[str]], str]] = [
    # (id, distortion set, reference mode); each single category in both modes, then mixes and regions
    *[(f"nr-{c.split()[0].lower()}", {"Global": [c]}, "No-Reference") for c in
      ("Blurs", "Color distortions", "Compression", "Noise", "Brightness change", "Sharpness", "Contrast")],
    *[(f"fr-{c.split()[0].lower()}", {"Global": [c]}, "Full-Reference") for c in
      ("Blurs", "Color distortions", "Compression", "Noise", "Brightness change", "Sharpness", "Contrast")],
    ("nr-blur-noise", {"Global": ["Blurs", "Noise"]}, "No-Reference"),
    ("nr-jpeg-contrast", {"Global": ["Compression", "Contrast"]}, "No-Reference"),
    ("nr-sky-building", {"sky": ["Noise"], "building": ["Blurs"]}, "No-Reference"),
    ("nr-face-colour", {"face": ["Color distortions", "Brightness change"]}, "No-Reference"),
    ("fr-blur-jpeg", {"Global": ["Blurs", "Compression"]}, "Full-Reference"),
    ("fr-sky-noise", {"sky": ["Noise"], "Global": ["Contrast"]}, "Full-Reference"),
    ("fr-three", {"Global": ["Sharpness", "Brightness change", "Color distortions"]}, "Full-Reference"),
    ("nr-four", {"Global": ["Blurs", "Noise", "Compression", "Sharpness"]}, "No-Reference"),
]


def select_lines(catalog: dict[str, Any]) -> list[dict[str, Any]]:
    lines = []
    for i, (sid, dset, mode) in enumerate(SELECT_SETS):
        kind = "FR" if mode == "Full-Reference" else "NR"
        acceptable = {obj: {d: [t for t, m in catalog["modes"].items() if m == kind and d in catalog["strengths"][t]]
                            for d in ds} for obj, ds in dset.items()}
        chosen = {obj: {d: ts[0] for d, ts in by.items()} for obj, by in acceptable.items()}
        lines.append({"id": f"select-{sid}", "split": "train" if i % 3 else "val", "source": "hand-written",
                      "label_source": "tool table strengths", "reference_mode": mode, "distortion_set": dset,
                      "selected_tools": chosen, "acceptable": acceptable})
    return lines


def tool_catalog() -> dict[str, Any]:
    from iqa_tools import ToolRegistry

    registry = ToolRegistry(cache=False)
    names = registry.names()
    modes = {n: registry.spec(n).mode for n in names}
    strengths = {n: list(registry.spec(n).strengths) for n in names}
    fr = registry.describe_tools("FR", available_only=False)
    nr = registry.describe_tools("NR", available_only=False)
    return {
        "about": "The tool table the selection fixtures were labelled against (optimizers/build_fixtures.py). "
                 "Descriptions list every tool, available or not, so labels do not depend on one machine.",
        "modes": modes,
        "strengths": strengths,
        # As the pipeline describes tools: FR then NR with a reference, NR only without.
        "descriptions": {"Full-Reference": fr + "\n" + nr, "No-Reference": nr},
    }


def write_jsonl(path: Path, lines: list[dict[str, Any]], header: str) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for text in header.strip().splitlines():
            fh.write(f"# {text}\n")
        for line in lines:
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")


HEADERS = {
    "planner": "Planner fixtures (format: optimizers/fixtures/README.md). Built by optimizers/build_fixtures.py.\n"
               "Paper-style examples in the paper's spellings, then queries for every row of DESIGN §3's flag table.",
    "detect": "Distortion-detection fixtures on synthetic images with a known distortion type.\n"
              "Built by optimizers/build_fixtures.py.",
    "analyze": "Distortion-analysis fixtures: level 2..5 -> slight..extreme; an unrelated category -> none.\n"
               "Built by optimizers/build_fixtures.py.",
    "select": "Tool-selection fixtures: acceptable = tools whose table strengths cover the category (FR with a\n"
              "reference, NR without); tool_catalog.json holds the table. Built by optimizers/build_fixtures.py.",
    "summarize": "Summarizer fixtures: score lines (undistorted -> A, level 2..5 -> B..E; evidence holds a real PIQE\n"
                 "score) and explain lines (multiple-choice / yes-no about the applied distortion).\n"
                 "Built by optimizers/build_fixtures.py.",
}


def build(out: Path) -> dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    catalog = tool_catalog()
    (out / "tool_catalog.json").write_text(json.dumps(catalog, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    images = write_images(out)
    by_module = {"planner": planner_lines(), "select": select_lines(catalog), **image_lines(images)}
    for module, lines in by_module.items():
        write_jsonl(out / f"{module}.jsonl", lines, HEADERS[module])
    return {m: len(v) for m, v in by_module.items()} | {"images": len(images)}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "fixtures")
    args = parser.parse_args(argv)
    counts = build(args.out)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
