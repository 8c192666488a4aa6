"""Issue 10: the offline answer against human opinion (MOS), on photos with authentic distortions.

    python benchmarks/mos_correlation.py MANIFEST [--workers 2] [--limit N] [--json OUT] [--check-cli 6]

MANIFEST holds rows with a ``mos`` (e.g. LIVE In the Wild: ``agentic-iqa bench convert clive
ChallengeDB_release/``). Evaluation only: nothing is fitted or chosen on these images; the shipped fit
(``agentic_iqa/offline/thresholds.json``) and fusion choice are used as they are. Each image is assessed
without a reference, as ``agentic-iqa assess --offline`` does (same loader, same working size), and scored by

* ``analyst``: the offline analyst alone (expectation of its level distribution);
* ``pipeline``: what the offline CLI/API answers (``offline_vs_single_tools.pipeline_score``: the tools the
  analyst selects, fused by the spec's formula with the shipped η); ``--check-cli N`` runs the real
  ``Assessor`` on N of the images and fails unless it answers the same;
* ``without_look``: the analyst's detectors blended with the overall damage level (``offline.damage``), the
  photo's look left out; ``look_alone``: the look model's own prediction;
* BRISQUE, NIQE and PIQE alone (raw scores, turned so that higher is better), the pyiqa tools the project
  ships with their original models.

Reported: SRCC and PLCC (after the 4-parameter logistic) with MOS, a 95 % bootstrap interval of each SRCC
(images resampled, 2,000 times), the paired bootstrap interval of SRCC(analyst or pipeline) − SRCC(BRISQUE),
and how many images each category is detected on (severity slight or worse). Raw tool scores are cached
with ``offline_vs_single_tools``' tool cache (keyed by the image's pixels and the tool layer's code).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_corpus as fc  # noqa: E402
import offline_vs_single_tools as ovst  # noqa: E402
from agentic_iqa.bench import metrics  # noqa: E402
from agentic_iqa.bench.manifest import read_manifest  # noqa: E402

BOOTSTRAP = 2000


def _score_image(args) -> dict:
    """One image as the offline NR assessment sees it: analyst alone, the answer, each NR tool, detections."""
    path, cache_dir = args
    import torch

    torch.set_num_threads(1)  # one process per core
    from agentic_iqa.offline import severity as sv
    from agentic_iqa.offline.stats import at_working_size
    from iqa_tools import load_image

    y = load_image(path).float_pixels()
    key = ovst.image_key(y)
    cfile = Path(cache_dir) / f"{key}.json"
    raw = json.loads(cfile.read_text()) if cfile.is_file() else {}
    if any(t not in raw for t in ovst.NR_TOOLS):
        raw = {t: ovst.raw_score(t, y, None) for t in ovst.NR_TOOLS}
        tmp = cfile.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(raw))
        tmp.replace(cfile)
    an = sv.analyze(at_working_size(y), look=True)  # as the offline assessment judges a whole image
    out = {"analyst": fc.score_of(an), "pipeline": ovst.pipeline_score(an, raw, "nr"), "raw": raw,
           "detected": sorted(c for c, a in an.items() if a.severity != "none"),
           "look_alone": an.look}
    an.look_shift = 0.0
    out["without_look"] = fc.score_of(an)  # the detectors blended with the damage model, the look left out
    return out


def _srcc(x: np.ndarray, y: np.ndarray) -> float:
    if np.ptp(x) == 0 or np.ptp(y) == 0:  # a resample of a few images can be all one value: no ranking
        return float("nan")
    return float(stats.spearmanr(x, y)[0])


def bootstrap_srcc(pred: dict[str, np.ndarray], mos: np.ndarray, base: str, seed: int = 0) -> dict:
    """95 % intervals of each SRCC, and of each SRCC minus the ``base`` predictor's, over the same resamples."""
    rng = np.random.default_rng(seed)
    draws = {k: [] for k in pred}
    for _ in range(BOOTSTRAP):
        idx = rng.integers(0, len(mos), len(mos))
        for k, p in pred.items():
            draws[k].append(_srcc(p[idx], mos[idx]))
    out = {}
    for k, d in draws.items():
        d = np.asarray(d)
        diff = d - np.asarray(draws[base])
        out[k] = {"srcc_ci95": [float(np.nanpercentile(d, 2.5)), float(np.nanpercentile(d, 97.5))],
                  f"minus_{base}_ci95": [float(np.nanpercentile(diff, 2.5)), float(np.nanpercentile(diff, 97.5))]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest", type=Path)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="only the first N rows with a MOS")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--check-cli", type=int, default=0, help="run the real offline Assessor on N images and compare")
    ap.add_argument("--cache", type=Path, default=fc.DEFAULT_CACHE)
    args = ap.parse_args(argv)

    rows, problems = read_manifest(args.manifest)
    for p in problems:
        print(f"skipped {p}", file=sys.stderr)
    rows = [r for r in rows if r.mos is not None][: args.limit]
    if len(rows) < 3:
        print(f"{args.manifest}: fewer than 3 rows with a MOS", file=sys.stderr)
        return 2
    cache_dir = args.cache / "tools" / ovst.tools_code_key() / "mos"
    cache_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(str(r.image_path), str(cache_dir)) for r in rows]
    with ProcessPoolExecutor(args.workers) as pool:
        scored = []
        for i, s in enumerate(pool.map(_score_image, jobs, chunksize=4), 1):
            scored.append(s)
            if i % 100 == 0 or i == len(jobs):
                print(f"{i}/{len(jobs)} images", file=sys.stderr, flush=True)
    mos = np.array([r.mos if r.mos_higher_better else -r.mos for r in rows])
    pred = {k: np.array([s[k] for s in scored]) for k in ("analyst", "pipeline", "without_look", "look_alone")}
    for t in ovst.NR_TOOLS:
        pred[t] = np.array([ovst.oriented(t, s["raw"][t]) for s in scored])
    intervals = bootstrap_srcc(pred, mos, base="BRISQUE")
    n = len(rows)
    detected: dict[str, int] = {}
    for s in scored:
        for c in s["detected"]:
            detected[c] = detected.get(c, 0) + 1
    out = {"manifest": str(args.manifest), "n": n,
           "protocol": "evaluation only: the shipped fit and fusion choice, nothing fitted or chosen on these images; "
                       "no reference (NR)",
           "predictors": {}, "detected": dict(sorted(detected.items(), key=lambda kv: -kv[1])),
           "nothing_detected": sum(not s["detected"] for s in scored),
           "score_mean": {k: float(np.mean(v)) for k, v in pred.items() if k in ("analyst", "pipeline")},
           # per image: id, analyst, answer, each NR tool's raw score, the categories detected (not the data
           # set's MOS: that is its owner's to distribute; join by id with your copy)
           "images": [[r.id, round(s["analyst"], 4), round(s["pipeline"], 4),
                       *(round(s["raw"][t], 4) for t in ovst.NR_TOOLS), s["detected"]] for r, s in zip(rows, scored)],
           "image_columns": ["id", "analyst", "pipeline", *ovst.NR_TOOLS, "detected"]}
    for k, p in pred.items():
        c = metrics.correlations(p, mos)
        out["predictors"][k] = {"srcc": c["srcc"], "plcc": c["plcc"], "plcc_fit": c["plcc_fit"], **intervals[k]}
        ci, dci = intervals[k]["srcc_ci95"], intervals[k]["minus_BRISQUE_ci95"]
        print(f"{k:12s} SRCC {c['srcc']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]  PLCC {c['plcc']:.3f}  "
              f"minus BRISQUE [{dci[0]:+.3f}, {dci[1]:+.3f}]", flush=True)
    print(f"mean score: analyst {out['score_mean']['analyst']:.2f}, pipeline {out['score_mean']['pipeline']:.2f}; "
          f"detected on {n - out['nothing_detected']} of {n}: "
          + ", ".join(f"{c} {k}" for c, k in out["detected"].items()), flush=True)
    if args.check_cli:
        from agentic_iqa.api import Assessor
        from agentic_iqa.config import load_settings

        assessor = Assessor(load_settings(backend="offline", cache={"enabled": False}))
        out["cli_check"] = []
        for i in np.linspace(0, n - 1, args.check_cli).astype(int):
            cli = assessor.assess(str(rows[i].image_path), use_cache=False).score
            out["cli_check"].append({"image": rows[i].id, "benchmark": float(pred["pipeline"][i]), "cli": cli})
            print(f"check {rows[i].id}: benchmark {pred['pipeline'][i]:.4f} cli {cli:.4f}", flush=True)
            if abs(pred["pipeline"][i] - cli) > 1e-6:
                raise SystemExit(f"the benchmark's score {pred['pipeline'][i]} differs from the CLI's {cli} on {rows[i].id}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
