"""Fit the offline analyst's detectors on the synthetic benchmark's TRAIN split; report on TEST.

    .venv/bin/python benchmarks/fit_thresholds.py                 # generate if needed, fit, report
    .venv/bin/python benchmarks/fit_thresholds.py --no-fit        # only report with the shipped thresholds
    .venv/bin/python benchmarks/fit_thresholds.py --json out.json # the report as JSON too

The shipped thresholds come from ``benchmarks/fit_corpus.py`` (real photos, leave-one-source-out). This
older fit on 7 scikit-image photos writes ``--out`` (default benchmarks/out/synthetic_thresholds.json,
weights, monotone maps, clean-photo ranges, provenance) for comparison; ``--no-fit`` reports the shipped file.
Statistics are cached next to the manifest (offline_stats.json), keyed by file size and mtime.
The report is the analyst alone (no IQA tools): top-1 category accuracy at levels 3-5 and the
intra-group SRCC of the expectation of ``level_distribution``, in NR and FR mode.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentic_iqa.bench import metrics  # noqa: E402
from agentic_iqa.bench.manifest import ManifestRow, read_manifest  # noqa: E402
from agentic_iqa.bench.synth import TEST_REFS, make_benchmark  # noqa: E402
from agentic_iqa.offline import severity as sv  # noqa: E402
from agentic_iqa.offline import stats as st  # noqa: E402


def _measure_pair(args: tuple[str, str]) -> dict:
    image, reference = args
    x, r = st.as_float_rgb(image), st.as_float_rgb(reference)
    nr = st.measure(x)
    return {"nr": nr, "fr": st.measure_fr(x, r, nr, _reference_stats(reference))}


@lru_cache(maxsize=16)
def _reference_stats(path: str) -> dict:
    return st.measure(path)


def measure_all(pairs: list[tuple[Path, Path]], cache_path: Path, workers: int) -> list[dict]:
    """NR and FR statistics for each (image, reference), reusing cached values for unchanged files
    measured by unchanged code (the key holds a hash of stats.py)."""
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    code = hashlib.sha1(Path(st.__file__).read_bytes()).hexdigest()[:12]

    def key(p: Path, r: Path) -> str:
        s, t = p.stat(), r.stat()
        return f"{code}|{p}|{s.st_size}|{s.st_mtime_ns}|{r}|{t.st_size}|{t.st_mtime_ns}"

    keys = [key(p, r) for p, r in pairs]
    cache = {k: v for k, v in cache.items() if k.startswith(code)}  # drop stale entries
    todo = sorted({k: (str(p), str(r)) for k, (p, r) in zip(keys, pairs) if k not in cache}.items())
    if todo:
        print(f"measuring {len(todo)} images ({len(pairs) - len(todo)} cached)...", flush=True)
        if workers > 1:
            with ProcessPoolExecutor(workers) as pool:
                results = list(pool.map(_measure_pair, [a for _, a in todo], chunksize=8))
        else:
            results = [_measure_pair(a) for _, a in todo]
        cache.update({k: v for (k, _), v in zip(todo, results)})
        cache_path.write_text(json.dumps(cache))
    return [cache[k] for k in keys]


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _round(obj, digits: int = 6):
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _round(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_round(v, digits) for v in obj]
    return obj


def fit(rows: list[ManifestRow], measured: list[dict], ref_stats: dict[str, dict], meta: dict) -> dict:
    samples = [({**m["nr"], **m["fr"]}, r.type, r.level) for r, m in zip(rows, measured)]
    samples += [({**m["nr"], **m["fr"]}, None, 0) for m in ref_stats.values()]
    fitted = sv.fit_all(samples)
    provenance = {
        "fitted": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "benchmark_seed": meta.get("seed"), "split": "train",
        "n_images": len(rows), "n_references": len(ref_stats), "references": sorted(ref_stats),
        "types": sorted({r.type for r in rows}), "code_commit": _git_commit(),
        "method": f"per detector: weighted non-negative ridge (alpha={sv.RIDGE}, standardized signed features) towards the applied level, "
                  "then isotonic map score->level; severity edges at levels 0.5/2.5/3.5/4.5",
    }
    return _round({"provenance": provenance, "severity_edges": list(sv.SEVERITY_EDGES), **fitted})


def _mcq_answer(row: ManifestRow, analyses: dict) -> str | None:
    """The option naming the category the analyst rates worst (the simple rule the report uses)."""
    options = {k: v for k, v in (row.options or {}).items() if v in analyses}
    if not options:
        return None
    return max(options, key=lambda k: (sv.SEVERITIES.index(analyses[options[k]].severity), analyses[options[k]].level))


def report(rows, measured, ref_stats, thresholds) -> dict:
    """Analyst-only figures on the given rows, in NR and FR mode."""
    out = {}
    for mode in ("nr", "fr"):
        cats, detected, levels, groups, types, scores, answers, truth = [], [], [], [], [], [], [], []
        for row, m in zip(rows, measured):
            an = sv.analyze_stats(m["nr"], m["fr"] if mode == "fr" else None, thresholds)
            if row.question is not None:
                answers.append(_mcq_answer(row, an))
                truth.append(row.answer)
                continue
            cats.append(row.category)
            detected.append([d.category for d in sv.detect(None, analyses=an)])
            levels.append(row.level)
            groups.append(row.source)
            types.append(row.type)
            scores.append(sv.expected_level(sv.level_distribution(an)))
        high = [i for i, lv in enumerate(levels) if lv >= 3]
        det_hi = metrics.detection_accuracy([cats[i] for i in high], [detected[i] for i in high])
        det_all = metrics.detection_accuracy(cats, detected, levels)
        intra = metrics.intra_group_srcc(groups, types, levels, scores)
        clean = []
        for m in ref_stats.values():
            an = sv.analyze_stats(m["nr"], m["fr"] if mode == "fr" else None, thresholds)
            clean.append({"score": sv.expected_level(sv.level_distribution(an)),
                          "flagged": [d.category for d in sv.detect(None, analyses=an)]})
        out[mode] = {
            "top1_levels_3_5": det_hi["top1"], "recall_levels_3_5": det_hi["recall"], "n_levels_3_5": det_hi["n"],
            "detection_per_level": det_all["per_level"],
            "mean_categories_flagged": float(np.mean([len(d) for d in detected])),
            "intra_group_srcc": intra["srcc"], "intra_groups": intra["groups"], "intra_per_type": intra["per_type"],
            "overall_vs_level": metrics.correlations(scores, [-lv for lv in levels]),
            "mcq": metrics.mcq_accuracy(truth, answers),
            "clean_references": {"mean_score": float(np.mean([c["score"] for c in clean])),
                                 "mean_categories_flagged": float(np.mean([len(c["flagged"]) for c in clean]))},
        }
    return out


def timing(image: Path, reference: Path, repeats: int = 10) -> dict:
    """Median wall and CPU milliseconds per call (the machine may be shared: CPU time is the steadier)."""
    x, r = st.as_float_rgb(image), st.as_float_rgb(reference)
    nr, ref = st.measure(x), st.measure(r)

    def median_ms(fn) -> tuple[float, float]:
        wall, cpu = [], []
        for _ in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            fn()
            wall.append((time.perf_counter() - t) * 1000)
            cpu.append((time.process_time() - c) * 1000)
        return round(float(np.median(wall)), 1), round(float(np.median(cpu)), 1)

    return {"image": f"{x.shape[1]}x{x.shape[0]}",
            "measure_ms": median_ms(lambda: st.measure(x)),
            "measure_fr_given_stats_ms": median_ms(lambda: st.measure_fr(x, r, nr, ref)),
            "analyze_from_stats_ms": median_ms(lambda: sv.analyze_stats(nr))}


def _print(rep: dict) -> None:
    for mode, r in rep.items():
        if not isinstance(r, dict) or "top1_levels_3_5" not in r:
            continue
        print(f"[{mode.upper()}] top-1 at levels 3-5: {r['top1_levels_3_5']:.3f} (n={r['n_levels_3_5']}), "
              f"recall {r['recall_levels_3_5']:.3f}; intra-group SRCC {r['intra_group_srcc']:.3f} "
              f"({r['intra_groups']} groups); MCQ {r['mcq']['accuracy']:.3f} (n={r['mcq']['n']})")
        print("      top-1 per level: " + ", ".join(f"L{k} {v['top1']:.2f}" for k, v in r["detection_per_level"].items()))
        print("      intra per type:  " + ", ".join(f"{k} {v:.2f}" for k, v in r["intra_per_type"].items()))
        print(f"      clean references: mean score {r['clean_references']['mean_score']:.2f}, "
              f"{r['clean_references']['mean_categories_flagged']:.1f} categories flagged on average; "
              f"distorted images: {r['mean_categories_flagged']:.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=str(ROOT / "benchmarks/out/synthetic"), help="benchmark folder")
    ap.add_argument("--seed", type=int, default=0, help="seed when the benchmark must be generated")
    ap.add_argument("--out", default=None, help="where a fit is written (default benchmarks/out/synthetic_thresholds.json; "
                    "with --no-fit: the thresholds reported, default the shipped file)")
    ap.add_argument("--no-fit", action="store_true", help="report with the existing thresholds file")
    ap.add_argument("--json", help="also write the report here")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    args.out = args.out or str(sv.THRESHOLDS_PATH if args.no_fit else ROOT / "benchmarks/out/synthetic_thresholds.json")

    bench = Path(args.bench)
    manifest = bench / "manifest.jsonl"
    if not manifest.is_file():
        print(f"generating the benchmark in {bench} (seed {args.seed})...", flush=True)
        make_benchmark(bench, seed=args.seed)
    rows, problems = read_manifest(manifest)
    for p in problems:
        print(f"skipped {p}", file=sys.stderr)
    meta = json.loads((bench / "benchmark.json").read_text()) if (bench / "benchmark.json").is_file() else {}
    scored = [r for r in rows if r.reference is not None and r.level is not None]

    measured = measure_all([(r.image_path, r.reference_path) for r in scored], bench / "offline_stats.json", args.workers)
    refs = {r.source: r.reference_path for r in scored}
    ref_measured = measure_all([(p, p) for p in refs.values()], bench / "offline_stats.json", 1)
    ref_stats = dict(zip(refs, ref_measured))

    def part(split: str):
        idx = [i for i, r in enumerate(scored) if r.split == split]
        srcs = {scored[i].source for i in idx}
        return [scored[i] for i in idx], [measured[i] for i in idx], {s: ref_stats[s] for s in srcs}

    train, test = part("train"), part("test")
    if not args.no_fit:
        fitted_rows = [r for r in train[0] if r.question is None]
        fitted_measured = [m for r, m in zip(*train[:2]) if r.question is None]
        thresholds = fit(fitted_rows, fitted_measured, train[2], meta)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(thresholds, indent=1) + "\n")
        sv.load_thresholds.cache_clear()
        print(f"wrote {args.out}: {len(fitted_rows)} train images, {len(train[2])} references "
              f"({', '.join(sorted(train[2]))}); test references: {', '.join(TEST_REFS)}")
    thresholds = sv.load_thresholds(str(args.out))

    rep = {"provenance": thresholds["provenance"]}
    for name, (r, m, refstats) in (("train", train), ("test", test)):
        rep[name] = report(r, m, refstats, thresholds)
    first = scored[0]
    rep["timing"] = timing(first.image_path, first.reference_path)
    for name in ("train", "test"):
        print(f"== {name.upper()} split (analyst alone, no IQA tools)")
        _print(rep[name])
    tm = rep["timing"]
    print(f"== timing per {tm['image']} image, (wall, cpu) ms: measure {tm['measure_ms']}, "
          f"FR comparison given both images' statistics {tm['measure_fr_given_stats_ms']}, "
          f"analyze {tm['analyze_from_stats_ms']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
