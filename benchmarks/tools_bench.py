"""Benchmark the tool registry against raw pyiqa (issue 2).

20 generated 512×384 images (scikit-image photos with blur / noise / JPEG, each with its pristine
reference) × every offline tool, in one process:
  (a) the registry: cold (new registry, metrics created on first use), warm (same registry again),
      cached (a new registry reading the persistent cache the previous run wrote);
  (b) raw pyiqa, one reused instance per metric, fed the same files (the floor);
  (c) raw pyiqa calling create_metric for every image (what the paper's reproduction does).
Plus one network metric pyiqa can build here without downloaded weights (MUSIQ, pretrained=False:
random weights, for timing only), through all three paths, to show what reuse saves when creation
loads a network. Import / start-up time is measured in fresh subprocesses and reported separately.

    .venv/bin/python benchmarks/tools_bench.py [--images 20] [--repeats 3] [--tools PSNR,SSIM] [--json out.json]

All paths alternate image by image, `--repeats` rounds (each round with a new cold registry writing
a new cache, and a new registry reading it), and per image and path the fastest round is kept: the
usual floor estimate on a shared machine, applied to every path alike. Cold includes creating the
metric and writing the cache; warm and raw do neither. Inputs are files on disk, so decoding counts on
all paths. Wall and CPU (process) time are both reported.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCES = ("astronaut", "chelsea", "coffee", "rocket", "camera")
W, H = 512, 384
NETWORK_TOOL = "MUSIQ_untrained"  # defined below as a user tool: pyiqa's musiq with pretrained=False


def make_images(folder: Path, n: int) -> list[tuple[Path, Path]]:
    """n (distorted, reference) PNG pairs of 512×384: photo crops with blur, noise or JPEG at 4 levels."""
    import io

    import skimage.data
    from PIL import Image, ImageFilter, ImageOps

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(n):
        src = getattr(skimage.data, SOURCES[i % len(SOURCES)])()
        ref = ImageOps.fit(Image.fromarray(src).convert("RGB"), (W, H), Image.Resampling.LANCZOS)
        level = 1 + (i // 3) % 4
        kind = i % 3
        if kind == 0:
            dist = ref.filter(ImageFilter.GaussianBlur(0.8 * level))
        elif kind == 1:
            a = np.asarray(ref).astype(np.float32) + rng.normal(0, 6 * level, (H, W, 3))
            dist = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
        else:
            buf = io.BytesIO()
            ref.save(buf, format="JPEG", quality=max(5, 60 - 14 * level))
            dist = Image.open(buf).convert("RGB")
        rp, dp = folder / f"ref_{i:02d}.png", folder / f"img_{i:02d}.png"
        ref.save(rp)
        dist.save(dp)
        pairs.append((dp, rp))
    return pairs


def startup_times() -> dict[str, float]:
    """Wall time of fresh interpreters doing only imports / a one-image CLI call (median of 3)."""
    py = sys.executable
    cmds = {
        "python (bare)": [py, "-c", "pass"],
        "import iqa_tools": [py, "-c", "import iqa_tools"],
        "import torch": [py, "-c", "import torch"],
        "import torch + pyiqa": [py, "-c", "import torch, pyiqa"],
        "agentic-iqa --help": [py, "-c", "import sys; sys.argv=['agentic-iqa','--help']; from agentic_iqa.cli import main; main()"],
        "agentic-iqa tools run PIQE example:chelsea --no-cache": [
            py, "-c",
            "import sys; sys.argv=['agentic-iqa','tools','run','PIQE','example:chelsea','--no-cache']; "
            "from agentic_iqa.cli import main; main()",
        ],
        "agentic-iqa tools run PIQE example:chelsea (cached)": [
            py, "-c",
            "import sys; sys.argv=['agentic-iqa','tools','run','PIQE','example:chelsea']; "
            "from agentic_iqa.cli import main; main()",
        ],
    }  # fmt: skip
    out = {}
    for label, cmd in cmds.items():
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
            runs.append(time.perf_counter() - t0)
        out[label] = statistics.median(runs)
    return out


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process). With one torch thread, CPU time is what the work
    costs regardless of other load on a shared machine; wall time is what a user waits."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


# ── issue 14: our tools against raw pyiqa, each in its own process ────────────────────────────────
# One persistent child per side and tool; the parent drives them alternately, one pass over the images
# per request, so both sides see the same load. Each child reports per-image wall times and scores.
_CHILD = r"""
import json, resource, sys, time
side, tool, threads, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
if side in ("ours", "before"):  # "before": the same registry code of another source tree (PYTHONPATH)
    import cv2
    from iqa_tools import ToolRegistry, backend
    cv2.setNumThreads(threads)  # the torch-free kernels filter with OpenCV: the same thread budget as torch
    reg = ToolRegistry(cache=False, offline=True, device="cpu")
    spec = reg.spec(tool)
    fr = spec.mode == "FR"
    call = lambda img, ref: reg.score(tool, img, ref if fr else None, use_cache=False).raw_score
else:
    import torch, pyiqa
    from iqa_tools.table import load_table
    spec = load_table([]).tools[tool]
    kw = dict(spec.metric_kwargs)
    if spec.model_path:
        from pathlib import Path
        import iqa_tools
        kw["pretrained_model_path"] = str(Path(iqa_tools.__file__).parent / spec.model_path)
    metric = pyiqa.create_metric(spec.metric, device=torch.device("cpu"), **kw)
    fr = spec.mode == "FR"
    call = lambda img, ref: float(metric(img, ref) if fr else metric(img))
for img, ref in pairs[:2]:
    call(img, ref)  # warm-up, not timed
if "torch" in sys.modules:  # our torch-free kernels (NIQE, BRISQUE, PIQE) never load it
    sys.modules["torch"].set_num_threads(threads)
print("ready", flush=True)
for line in sys.stdin:
    times, scores = [], []
    for img, ref in pairs:
        t = time.perf_counter(); scores.append(call(img, ref)); times.append(time.perf_counter() - t)
    print(json.dumps({"times": times, "scores": scores, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "torch_loaded": "torch" in sys.modules}), flush=True)
"""


def vs_raw_processes(tools: list[str], pairs: list[tuple[Path, Path]], repeats: int, threads: int,
                     before: Path | None = None) -> dict:
    """Per tool: our registry (warm, cache off) vs `pyiqa.create_metric` reused, each in a fresh process of
    its own with `threads` torch threads; per image the fastest of `repeats` passes; scores compared.
    `before`: another source tree (e.g. an export of main) whose registry runs as a third side, alternated
    with the other two, so that before and after are measured side by side under the same load."""
    payload = json.dumps([[str(i), str(r)] for i, r in pairs])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("AGENTIC_IQA_MALLOC_TUNING", None)
    trees = {"raw": ROOT, "ours": ROOT, **({"before": before} if before else {})}
    out = {}
    for tool in tools:
        kids = {side: subprocess.Popen([sys.executable, "-c", _CHILD, side, tool, str(threads), payload], cwd=tree,
                                       env=dict(env, PYTHONPATH=str(tree)), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for side, tree in trees.items()}
        for kid in kids.values():
            assert kid.stdout.readline().strip() == "ready"
        best = {side: [math.inf] * len(pairs) for side in kids}
        scores, rss, loads, torch_loaded = {}, {}, [], {}
        for rep in range(repeats):
            for side in (list(kids) if rep % 2 == 0 else list(kids)[::-1]):
                kids[side].stdin.write("go\n")
                kids[side].stdin.flush()
                doc = json.loads(kids[side].stdout.readline())
                best[side] = [min(a, b) for a, b in zip(best[side], doc["times"])]
                scores[side], rss[side], torch_loaded[side] = doc["scores"], doc["rss_mb"], doc["torch_loaded"]
                loads.append(os.getloadavg()[0])
        for kid in kids.values():
            kid.stdin.close()
            kid.wait()
        rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(scores["ours"], scores["raw"]))
        absdiff = max(abs(a - b) for a, b in zip(scores["ours"], scores["raw"]))
        raw_s, ours_s = sum(best["raw"]), sum(best["ours"])
        out[tool] = {"raw_ms": raw_s / len(pairs) * 1e3, "ours_ms": ours_s / len(pairs) * 1e3, "speedup": raw_s / ours_s,
                     "max_rel_diff": rel, "max_abs_diff": absdiff, "raw_rss_mb": rss["raw"], "ours_rss_mb": rss["ours"],
                     "ours_loads_torch": torch_loaded["ours"], "load": statistics.median(loads)}
        r = out[tool]
        print(f"{tool:10s} raw pyiqa {r['raw_ms']:8.1f} ms/img  ours {r['ours_ms']:8.1f} ms/img  = {r['speedup']:5.2f}×  "
              f"max rel diff {rel:.1e} (abs {absdiff:.1e})  peak RSS raw {rss['raw']:.0f} MB / ours {rss['ours']:.0f} MB"
              f"{'' if torch_loaded['ours'] else ' (no torch)'}  load {r['load']:.1f}", flush=True)
        if before:
            before_s = sum(best["before"])
            before_rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(scores["before"], scores["raw"]))
            r.update(before_ms=before_s / len(pairs) * 1e3, before_speedup=raw_s / before_s, after_vs_before=before_s / ours_s,
                     before_rss_mb=rss["before"], before_loads_torch=torch_loaded["before"], before_max_rel_diff=before_rel)
            print(f"{'':10s} before    {r['before_ms']:8.1f} ms/img  = {r['before_speedup']:5.2f}× raw; after is "
                  f"{r['after_vs_before']:5.2f}× before  (before max rel diff {before_rel:.1e}, RSS {rss['before']:.0f} MB"
                  f"{'' if torch_loaded['before'] else ', no torch'})", flush=True)
    total_raw = sum(v["raw_ms"] for v in out.values())
    total_ours = sum(v["ours_ms"] for v in out.values())
    print(f"all {len(out)} tools: raw {total_raw:.0f} ms / ours {total_ours:.0f} ms per image set = {total_raw / total_ours:.2f}×; "
          f"slowest ratio {min(v['speedup'] for v in out.values()):.2f}×", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="alternating warm/raw rounds; per-image minimum kept")
    ap.add_argument("--tools", default="", help="comma-separated subset of tools (default: every offline tool)")
    ap.add_argument("--no-network", action="store_true", help="skip the MUSIQ (untrained) network metric")
    ap.add_argument("--no-startup", action="store_true", help="skip the subprocess start-up measurements")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument("--vs-raw", action="store_true",
                    help="issue 14: only our tools vs raw pyiqa, each side in its own process (--threads, default 1)")
    ap.add_argument("--before", type=Path, default=None,
                    help="with --vs-raw: another source tree (e.g. an export of main) run as a third side, for before/after")
    args = ap.parse_args()
    if args.vs_raw:
        work = Path(tempfile.mkdtemp(prefix="tools-bench-"))
        pairs = make_images(work / "imgs", args.images)
        from iqa_tools import ToolRegistry

        probe = ToolRegistry(cache=False, offline=True)
        tools = [probe.spec(t).name for t in args.tools.split(",")] if args.tools else [
            s.name for s in probe.table.tools.values() if not s.needs_weights and probe.availability(s.name)[0]]
        print(f"{args.images} images {W}x{H}, {args.repeats} alternating passes, torch threads {args.threads or 1}; "
              f"load {os.getloadavg()[0]:.1f} (2 cores)", flush=True)
        res = vs_raw_processes(tools, pairs, args.repeats, args.threads or 1, args.before)
        if args.json:
            args.json.write_text(json.dumps(res, indent=2))
        return

    work = Path(tempfile.mkdtemp(prefix="tools-bench-"))
    os.environ["AGENTIC_IQA_CACHE_DIR"] = str(work / "cache")  # never touch the user's cache
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    results: dict = {"images": args.images, "size": f"{W}x{H}", "repeats": args.repeats,
                     "load_average_start": os.getloadavg()[0]}  # fmt: skip
    if not args.no_startup:
        results["startup_s"] = startup_times()

    t0 = time.perf_counter()
    import pyiqa
    import torch

    results["in_process_import_torch_pyiqa_s"] = time.perf_counter() - t0
    if args.threads:  # on a shared machine one thread avoids OpenMP spin-wait collapse of small ops
        torch.set_num_threads(args.threads)
    results["torch_threads"] = torch.get_num_threads()

    from iqa_tools import ToolCache, ToolRegistry

    user_table = work / "bench_tools.yaml"
    user_table.write_text(
        f"tools:\n  - name: {NETWORK_TOOL}\n    metric: musiq\n    mode: NR\n    lower_better: false\n"
        "    score_range: [0, 100]\n    metric_kwargs: {pretrained: false}\n"
        "    description: MUSIQ architecture with random weights (timing only, no meaningful scores).\n"
    )
    pairs = make_images(work / "imgs", args.images)
    probe = ToolRegistry(table_paths=[user_table], cache=False, offline=True, device="cpu")
    if args.tools:
        tools = [probe.spec(t).name for t in args.tools.split(",")]
    else:
        tools = [s.name for s in probe.table.tools.values() if probe.availability(s.name)[0] and s.name != NETWORK_TOOL]
    if not args.no_network:
        tools.append(NETWORK_TOOL)
    specs = {t: probe.spec(t) for t in tools}

    def registry_pass(reg, tool):
        ref = specs[tool].mode == "FR"
        for img, r in pairs:
            reg.score(tool, img, r if ref else None)

    def create_kwargs(tool):
        return dict(specs[tool].metric_kwargs, **({"pretrained_model_path": specs[tool].model_path} if specs[tool].model_path else {}))

    clocks = ("wall", "cpu")
    sides = ("cold", "warm", "raw_reused", "create_per_image", "cached")
    per_tool: dict[str, dict] = {}
    for tool in tools:
        fr = specs[tool].mode == "FR"
        t0 = time.perf_counter()
        reused = pyiqa.create_metric(specs[tool].metric, device=torch.device("cpu"), **create_kwargs(tool))
        create_once = time.perf_counter() - t0
        warm = ToolRegistry(table_paths=[user_table], cache=False, offline=True, device="cpu")
        registry_pass(warm, tool)  # warm it up once; not timed

        def raw_call(m, img, r):
            return m(str(img), str(r)) if fr else m(str(img))

        best = {side: {c: [math.inf] * len(pairs) for c in clocks} for side in sides}
        for rep in range(args.repeats):
            # Each round starts a genuinely cold registry (with a fresh cache it writes to) and a
            # registry that only reads that cache; all sides alternate image by image.
            cache_dir = work / f"cache-{tool}-{rep}"
            cold = ToolRegistry(table_paths=[user_table], cache=ToolCache(cache_dir), offline=True, device="cpu")
            reader = ToolRegistry(table_paths=[user_table], cache=ToolCache(cache_dir), offline=True, device="cpu")
            calls = {
                "cold": lambda img, r: cold.score(tool, img, r if fr else None),
                "warm": lambda img, r: warm.score(tool, img, r if fr else None, use_cache=False),
                "raw_reused": lambda img, r: raw_call(reused, img, r),
                "create_per_image": lambda img, r: raw_call(
                    pyiqa.create_metric(specs[tool].metric, device=torch.device("cpu"), **create_kwargs(tool)), img, r),
                "cached": lambda img, r: reader.score(tool, img, r if fr else None),
            }
            for j, (img, r) in enumerate(pairs):
                middle = ["warm", "raw_reused", "create_per_image"]
                k = (rep + j) % 3
                for side in ["cold", *middle[k:], *middle[:k], "cached"]:  # cold fills the cache; the rest rotate
                    for c, v in zip(clocks, timed(lambda: calls[side](img, r))):
                        best[side][c][j] = min(best[side][c][j], v)
            assert reader._metrics == {}, "the cached side must not create (or run) a metric"
        row = {c: {side: sum(best[side][c]) for side in sides} for c in clocks}
        for c in clocks:
            row[c]["raw_create_once"] = create_once
        w, c = row["wall"], row["cpu"]
        print(
            f"{tool:16s} ms/img wall (cpu): raw {w['raw_reused'] / args.images * 1e3:7.1f} ({c['raw_reused'] / args.images * 1e3:7.1f})"
            f"  warm {w['warm'] / args.images * 1e3:7.1f} ({c['warm'] / args.images * 1e3:7.1f})"
            f"  cold {w['cold'] / args.images * 1e3:7.1f}  create/img {w['create_per_image'] / args.images * 1e3:7.1f}"
            f"  cached {w['cached'] / args.images * 1e3:5.2f}"
            f"  warm/raw {w['warm'] / w['raw_reused']:.3f} ({c['warm'] / c['raw_reused']:.3f})",
            flush=True,
        )
        per_tool[tool] = row
    results["per_tool_s"] = per_tool

    offline = [t for t in tools if t != NETWORK_TOOL]

    def total(clock, key, among=offline):
        return sum(per_tool[t][clock][key] for t in among)

    summary: dict = {"offline_tools": offline}
    for clock in clocks:
        summary[clock] = {
            "totals_s": {k: total(clock, k) for k in per_tool[offline[0]][clock]} if offline else {},
            "warm_over_raw": total(clock, "warm") / total(clock, "raw_reused"),
            "cold_over_raw": total(clock, "cold") / total(clock, "raw_reused"),
            "create_per_image_over_raw": total(clock, "create_per_image") / total(clock, "raw_reused"),
            "cached_over_cold": total(clock, "cached") / total(clock, "cold"),
        }
        if NETWORK_TOOL in per_tool:
            n = per_tool[NETWORK_TOOL][clock]
            summary[clock]["network"] = {
                "tool": "musiq (pretrained=False)",
                "create_once_s": n["raw_create_once"],
                "reused_per_image_s": n["raw_reused"] / args.images,
                "warm_over_raw": n["warm"] / n["raw_reused"],
                "cold_over_raw": n["cold"] / n["raw_reused"],
                "create_per_image_over_reused": n["create_per_image"] / n["raw_reused"],
                "cached_over_cold": n["cached"] / n["cold"],
            }
    results["summary"] = summary
    results["load_average_end"] = os.getloadavg()[0]

    print()
    if "startup_s" in results:
        print("start-up (fresh process, median of 3):")
        for label, secs in results["startup_s"].items():
            print(f"  {label:55s} {secs:6.2f} s")
    print(f"in-process import torch + pyiqa: {results['in_process_import_torch_pyiqa_s']:.2f} s; torch threads: {results['torch_threads']}")
    for clock in clocks:
        sm = summary[clock]
        print(f"[{clock}] offline tools ({len(offline)}), {args.images} images, totals over all tools:")
        for key, secs in sm["totals_s"].items():
            print(f"  {key:34s} {secs:8.2f} s")
        print(f"  warm / raw reused          = {sm['warm_over_raw']:.3f}   (target ≤ 1.05)")
        print(f"  cached re-run / cold       = {sm['cached_over_cold']:.4f}  (target ≤ 0.1)")
        print(f"  create per image / reused  = {sm['create_per_image_over_raw']:.3f}")
        if "network" in sm:
            nw = sm["network"]
            print(f"  network {nw['tool']}: create {nw['create_once_s']:.2f} s, forward {nw['reused_per_image_s']:.2f} s/img; "
                  f"warm/raw {nw['warm_over_raw']:.3f}; create-per-image / reused {nw['create_per_image_over_reused']:.2f}×; "
                  f"cached/cold {nw['cached_over_cold']:.4f}")  # fmt: skip
    print(f"load average: {results['load_average_start']:.2f} at start, {results['load_average_end']:.2f} at end (2 cores)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
