"""Issue 14: what a user waits for — a cold one-photo `agentic-iqa assess --offline`, a warm assessment in one
process, and `--help` — for two source trees side by side (before = a git revision, after = this tree).

    .venv/bin/python benchmarks/cli_bench.py [--before main] [--repeats 3] [--warm-items 5] [--query Q] [--json out.json]

Images: scikit-image's astronaut as a 512×384 JPEG and upscaled (Lanczos) to a 4000×3000 (12 MP) JPEG,
quality 90, like a phone photo's size (its content is soft: it is an upscale).
Cold: a fresh interpreter per call (`assess --offline --no-cache --json IMG`, and the 512×384 JPEG with
`--reference` its lossless original for FR), wall time and peak RSS of that
child (wait4's rusage). Trees alternate call by call (before, after, after, before, …); medians of --repeats.
Warm: one fresh process per tree builds `create_assessor(offline=True)`, assesses each image once (not timed),
then --warm-items times each (cache off); median per item, and its peak RSS.
Where the time goes: the result's stage timings and tool logs (JSON) for the cold call, plus fresh-process
import times. The machine is shared: the 1-minute load average is printed beside every figure.
`--query`: ask this instead of the default rating, cold and warm (e.g. a question about a part of the frame).
Nothing here is asserted in tests.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

CLI = "import sys; sys.argv[0] = 'agentic-iqa'; from agentic_iqa.cli import main; main()"

WARM = r"""
import json, os, resource, statistics, sys, time
from agentic_iqa.api import create_assessor
images, n = sys.argv[1:-1], int(sys.argv[-1])
t0 = time.perf_counter()
a = create_assessor(offline=True)
kw = {"query": os.environ["CLI_BENCH_QUERY"]} if os.environ.get("CLI_BENCH_QUERY") else {}
out = {"first": {}, "per_item": {}, "stages": {}, "tools": {}}
for img in images:
    t = time.perf_counter(); a.assess(img, use_cache=False, **kw); out["first"][img] = time.perf_counter() - t
for img in images:
    times = []
    for _ in range(n):
        t = time.perf_counter(); r = a.assess(img, use_cache=False, **kw); times.append(time.perf_counter() - t)
    out["per_item"][img] = times
    out["stages"][img] = r.timings
    out["tools"][img] = list(dict.fromkeys((lg.tool_name, lg.execution_time, lg.working_size) for lg in r.evidence.tool_logs))
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out["torch_loaded"] = "torch" in sys.modules  # not imported here: the torch-free NR kernels never load it
if out["torch_loaded"]:
    out["torch_threads"] = sys.modules["torch"].get_num_threads()
print(json.dumps(out))
"""


def load() -> float:
    return os.getloadavg()[0]


MAKE_IMAGES = r"""
import sys
import skimage.data
from PIL import Image
src = Image.fromarray(skimage.data.astronaut())
src.resize((512, 384), Image.Resampling.LANCZOS).save(sys.argv[1], quality=90)
src.resize((4000, 3000), Image.Resampling.LANCZOS).save(sys.argv[2], quality=90)
src.resize((512, 384), Image.Resampling.LANCZOS).save(sys.argv[3])  # lossless: the FR call's reference
"""


def make_images(folder: Path) -> dict[str, Path]:
    """In a child: this process stays small, since a child's peak RSS (wait4) counts its parent's pages
    from before the exec."""
    small, big, ref = folder / "photo_512x384.jpg", folder / "photo_4000x3000.jpg", folder / "reference_512x384.png"
    subprocess.run([PY, "-c", MAKE_IMAGES, str(small), str(big), str(ref)], check=True)
    return {"512x384": small, "12MP": big, "reference": ref}


def export_tree(rev: str, dest: Path) -> str:
    """The source of `rev` (a git revision of this repository) as plain files; returns its commit hash."""
    commit = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    archive = dest.with_suffix(".tar")
    with open(archive, "wb") as fh:
        subprocess.run(["git", "archive", commit], cwd=ROOT, stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    data = ROOT / "iqa_tools" / "data"  # gitignored model files written at install time
    for f in data.glob("*"):
        target = dest / "iqa_tools" / "data" / f.name
        if f.is_file() and not target.exists():
            target.write_bytes(f.read_bytes())
    return commit


def run_child(tree: Path, args: list[str], env_extra: dict) -> tuple[float, float, int, str]:
    """(wall s, peak RSS MB, exit code, stdout) of a fresh interpreter in `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree), **env_extra)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([PY, *args], cwd=tree, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode("utf-8", "replace")
        if p.returncode != 0:
            sys.stderr.write(err.read().decode("utf-8", "replace")[-2000:])
    return wall, usage.ru_maxrss / 1024, p.returncode, text


def breakdown(doc: dict, wall: float) -> str:
    """Where a cold call's time went, from its JSON result."""
    t = doc.get("timings", {})
    # A tool serving several distortions is logged once per distortion, with the same run's figures.
    tools = list(dict.fromkeys((lg["tool_name"], lg["execution_time"], tuple(lg.get("working_size") or ()))
                               for lg in (doc.get("evidence") or {}).get("tool_logs", [])))
    tool_s = sum(x[1] for x in tools)
    parts = [f"start-up+imports before the graph {wall - doc.get('total_seconds', 0):.2f}",
             f"input check+graph build {doc.get('total_seconds', 0) - sum(t.values()):.2f}"]
    parts += [f"{k} {v:.2f}" for k, v in t.items() if v >= 0.01]
    parts.append(f"(of execute: tools {tool_s:.2f} = " + ", ".join(f"{n} {s:.2f}@{ws[0]}x{ws[1]}" if ws else f"{n} {s:.2f}" for n, s, ws in tools)
                 + f"; metric creation, with the torch/pyiqa import when a tool needs them, {t.get('execute', 0) - tool_s:.2f})")
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="main", help="git revision for the 'before' side (default: main)")
    ap.add_argument("--after", type=Path, default=ROOT, help="source tree for the 'after' side (default: this one)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warm-items", type=int, default=5)
    ap.add_argument("--skip-warm", action="store_true")
    ap.add_argument("--query", help="ask this instead of the default rating (cold and warm)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cli-bench-"))
    env = {"AGENTIC_IQA_CACHE_DIR": str(work / "cache"), "HF_HUB_OFFLINE": "1", "CLI_BENCH_QUERY": args.query or ""}
    images = make_images(work)
    reference = images.pop("reference")
    before = work / "before"
    commit = export_tree(args.before, before)
    trees = {"before": before, "after": args.after.resolve()}
    results: dict = {"before": f"{args.before} {commit[:10]}", "after": str(trees["after"]), "load_start": load(),
                     "cold": {}, "help": {}, "warm": {}, "imports": {}}
    print(f"before = {args.before} ({commit[:10]}), after = {trees['after']}; load {load():.1f} (2 cores)", flush=True)

    # Fresh-process import times: the floor every cold call pays.
    for label, code in {"python -c pass": "pass", "import torch": "import torch", "import torch, pyiqa": "import torch, pyiqa",
                        "import agentic_iqa.graph (LangGraph, DSPy)": "import agentic_iqa.graph"}.items():
        runs = [run_child(trees["after"], ["-c", code], env)[:2] for _ in range(args.repeats)]
        results["imports"][label] = {"wall_s": statistics.median(r[0] for r in runs), "rss_mb": max(r[1] for r in runs), "load": load()}
        print(f"  {label:45s} {results['imports'][label]['wall_s']:6.2f} s  RSS {results['imports'][label]['rss_mb']:6.0f} MB  load {load():.1f}", flush=True)

    order = ["before", "after"]
    # The FR call: the 512x384 JPEG against its lossless original (the JPEG's damage is what FR measures).
    asked = ["-q", args.query] if args.query else []
    cold_calls = {size: [str(img), *asked] for size, img in images.items()}
    cold_calls["FR 512x384"] = [str(images["512x384"]), "--reference", str(reference), *asked]
    for size, call in cold_calls.items():
        runs: dict = {k: [] for k in trees}
        for rep in range(args.repeats):
            for side in (order if rep % 2 == 0 else order[::-1]):
                wall, rss, code, out = run_child(trees[side], ["-c", CLI, "assess", "--offline", "--no-cache", "--json", *call], env)
                if code != 0:
                    raise SystemExit(f"{side}: assess {' '.join(call)} exited {code}")
                doc = json.loads(out)
                runs[side].append({"wall_s": wall, "rss_mb": rss, "load": load(), "score": doc["result"].get("score"),
                                   "where": breakdown(doc, wall)})
        results["cold"][size] = runs
        for side in trees:
            r = runs[side]
            med = statistics.median(x["wall_s"] for x in r)
            walls = ", ".join(f"{x['wall_s']:.2f}" for x in r)
            loads = ", ".join(f"{x['load']:.1f}" for x in r)
            print(f"cold {size:8s} {side:6s} wall {med:6.2f} s (runs {walls})  "
                  f"peak RSS {max(x['rss_mb'] for x in r):6.0f} MB  score {r[0]['score']}  load {loads}", flush=True)
            print(f"     where (last run): {r[-1]['where']}", flush=True)
        b, a = (statistics.median(x["wall_s"] for x in runs[s]) for s in ("before", "after"))
        print(f"cold {size}: before/after = {b / a:.2f}×", flush=True)

    help_runs: dict = {k: [] for k in trees}
    for rep in range(max(3, args.repeats)):
        for side in (order if rep % 2 == 0 else order[::-1]):
            help_runs[side].append(run_child(trees[side], ["-c", CLI, "--help"], env)[0])
    bare = statistics.median(run_child(trees["after"], ["-c", "pass"], env)[0] for _ in range(3))
    for side in trees:
        results["help"][side] = {"wall_s": statistics.median(help_runs[side]), "bare_python_s": bare, "load": load()}
        print(f"--help {side:6s} {statistics.median(help_runs[side]):.2f} s (bare python {bare:.2f} s)  load {load():.1f}", flush=True)

    if not args.skip_warm:
        for side in (order if args.repeats % 2 else order[::-1]):
            wall, rss, code, out = run_child(trees[side], ["-c", WARM, *map(str, images.values()), str(args.warm_items)], env)
            if code != 0:
                raise SystemExit(f"{side}: warm run exited {code}")
            doc = json.loads(out)
            doc["load"] = load()
            results["warm"][side] = doc
            for size, img in images.items():
                per = doc["per_item"][str(img)]
                tools = ", ".join(f"{n} {s:.2f}s@{ws[0]}x{ws[1]}" for n, s, ws in doc["tools"][str(img)] if ws)
                print(f"warm {size:8s} {side:6s} per item {statistics.median(per):.3f} s (min {min(per):.3f}; first {doc['first'][str(img)]:.2f}) "
                      f"stages {doc['stages'][str(img)]} tools {tools}  load {doc['load']:.1f}", flush=True)
            print(f"warm {side} process peak RSS {doc['peak_rss_mb']:.0f} MB; " + (f"torch threads {doc.get('torch_threads')}" if doc.get('torch_loaded', True) else 'torch not loaded'), flush=True)
    results["load_end"] = load()
    print(f"load average: {results['load_start']:.1f} at start, {results['load_end']:.1f} at end (2 cores)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
