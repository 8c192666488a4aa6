"""Issue 15 benchmarks: the Ray Data engine against the local batch runner on the same items.

Run:  PYTHONPATH=. .venv/bin/python benchmarks/ray_bench.py [--n 32] [--size 320x240] [--part offline|model|all]

1. Offline (the offline analyst + real pyiqa tools, tool cache off): local `assess_many` (1 thread)
   against `assess_dataset` with 1 and 2 actors (1 thread each). Per-item cost is the steady state:
   the time between results after the first batch (Ray: actor start with its torch import, first
   tool creation; local: the first item) divided by the items after it. Overhead = Ray's per-item
   cost / local per-item cost - 1, median over interleaved repetitions. Target ≤ 5 %.
2. Model (the real HTTP path to the fake OpenAI-compatible server answering every call after
   300 ms, run in its own process): local `assess_many` at 4 threads against 1 and 2 actors at 4
   threads each; steady-state throughput, and wall time including start-up.
3. On paper: images per hour on N GPU nodes from the per-item costs measured here (see `paper`).

All runs share one Ray instance (num_cpus=2) on this machine; they run interleaved so that load from
other processes hits every engine alike. Nothing here is asserted in tests; figures go to RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("AGENTIC_IQA_CACHE_DIR", tempfile.mkdtemp(prefix="aiqa-bench-cache-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from canned import disable_dspy_cache, write_test_image  # noqa: E402

from agentic_iqa.api import Assessor  # noqa: E402
from agentic_iqa.batch import assess_many  # noqa: E402
from agentic_iqa.config import load_settings  # noqa: E402


def make_images(folder: Path, n: int, size: tuple[int, int]) -> list[str]:
    return [str(write_test_image(folder / f"b{i:04d}.jpg", size=size, seed=i, quality=35 + i % 50)) for i in range(n)]


def steady(stamps: list[float], skip: int) -> float:
    """Seconds per item after the first `skip` results (start-up, first tool creation and the first
    batch excluded): (last - first counted) / items after it."""
    stamps = sorted(stamps)
    return (stamps[-1] - stamps[skip - 1]) / (len(stamps) - skip)


def run_local(images: list[str], settings, threads: int) -> tuple[float, float]:
    import torch

    from agentic_iqa.distributed import warm_up

    # Ray gives an actor of num_cpus=1 OMP_NUM_THREADS=1; the local run gets the same torch threads,
    # so the comparison measures Ray, not intra-op threading (which is far slower on a loaded machine).
    torch.set_num_threads(1)
    assessor = Assessor(settings)
    warm_up(assessor)
    _ = assessor.graph
    t0 = time.perf_counter()
    stamps, results = [], []
    for r in assess_many(images, assessor=assessor, concurrency=threads):
        stamps.append(time.perf_counter())
        results.append(r)
    dt = time.perf_counter() - t0
    assert len(results) == len(images) and all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    return dt, steady(stamps, threads)


def run_ray(images: list[str], settings, actors: int, threads: int, batch_size: int) -> tuple[float, float]:
    import ray

    from agentic_iqa.distributed import assess_dataset

    t0 = time.perf_counter()
    ds = ray.data.from_items([{"image": p} for p in images], override_num_blocks=max(1, len(images) // batch_size))
    stamps, rows = [], []
    for row in assess_dataset(ds, settings=settings, concurrency=actors, threads_per_worker=threads,
                              batch_size=batch_size).iter_rows():
        stamps.append(time.perf_counter())
        rows.append(row)
    dt = time.perf_counter() - t0
    assert len(rows) == len(images) and all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"][:3]
    return dt, steady(stamps, batch_size * actors)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def compare(runs: dict, reps: int) -> dict:
    """Run every engine `reps` times, interleaved (load from other processes hits all alike)."""
    got: dict[str, list] = {k: [] for k in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            got[name].append(fn())
    return got


def offline(folder: Path, n: int, size, batch_size: int, reps: int) -> dict:
    settings = load_settings(folder, backend="offline", cache={"enabled": False})
    (folder / "off").mkdir()
    imgs = make_images(folder / "off", n, size)
    got = compare({"local_1_thread": lambda: run_local(imgs, settings, 1),
                   "ray_1_actor": lambda: run_ray(imgs, settings, 1, 1, batch_size),
                   "ray_2_actors": lambda: run_ray(imgs, settings, 2, 1, batch_size)}, reps)
    per = {k: [p for _, p in v] for k, v in got.items()}
    ratios = [r / l for r, l in zip(per["ray_1_actor"], per["local_1_thread"])]
    return {
        "protocol": f"offline analyst, real tools, cache off; {n} JPEGs {size[0]}x{size[1]}; 1 thread per engine; Ray batch_size "
                    f"{batch_size}; steady-state seconds per item after the first batch; {reps} interleaved repetitions, medians",
        "wall_seconds": {k: [round(w, 2) for w, _ in v] for k, v in got.items()},
        "steady_ms_per_item": {k: [round(x * 1000, 1) for x in v] for k, v in per.items()},
        "steady_items_per_s": {k: round(1 / _median(v), 2) for k, v in per.items()},
        "ray_overhead_per_item_pct": round((_median(ratios) - 1) * 100, 1),
        "ray_overhead_per_item_ms": round((_median(per["ray_1_actor"]) - _median(per["local_1_thread"])) * 1000, 1),
        "ray_2_vs_1_actor_throughput": round(_median(per["ray_1_actor"]) / _median(per["ray_2_actors"]), 2),
    }


def model(folder: Path, n: int, size, batch_size: int, latency: float, reps: int) -> dict:
    from batch_bench import ServerProcess

    (folder / "lm").mkdir()
    imgs = make_images(folder / "lm", n, size)
    with ServerProcess(latency) as srv:
        settings = load_settings(folder, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        for role in ("planner", "executor", "summarizer"):
            settings.backends.role(role).timeout = 30
        got = compare({"local_4_threads": lambda: run_local(imgs, settings, 4),
                       "ray_1_actor_x4": lambda: run_ray(imgs, settings, 1, 4, batch_size),
                       "ray_2_actors_x4": lambda: run_ray(imgs, settings, 2, 4, batch_size)}, reps)
    return {
        "protocol": f"fake OpenAI-compatible server (own process) answering after {latency * 1000:.0f} ms, 5 LM calls/item, "
                    f"real PIQE runs, cache off; {n} JPEGs {size[0]}x{size[1]}; Ray batch_size {batch_size}; "
                    f"{reps} interleaved repetitions, medians; wall time includes Ray's start of the actors (torch import)",
        "wall_seconds": {k: [round(w, 2) for w, _ in v] for k, v in got.items()},
        "items_per_s_with_startup": {k: round(n / _median([w for w, _ in v]), 2) for k, v in got.items()},
    }


def paper(per_item_cpu_s: float, lm_calls: int = 5, lm_latency_s: float = 1.5, gpu_speedup: float = 20.0,
          actors_per_gpu: int = 4, lm_cap: int = 256, io_mb_per_item: float = 1.0, node_io_mb_s: float = 200.0,
          cpu_per_node: int = 8, per_item_host_cpu_s: float = 0.15) -> dict:
    """Images per hour on N GPU nodes (one GPU each), three ceilings; the lowest binds.

    tools: actors_per_gpu actors share a GPU (num_gpus 1/actors_per_gpu); one tool slot each; a tool
        run takes per_item_cpu_s / gpu_speedup on the GPU (an assumption: pyiqa's classical metrics
        gain little on GPU, deep ones a lot), so a node does actors_per_gpu / (tool time) items/s
        at best, as long as the GPU is not saturated (then 1 / tool time).
    LM: lm_cap requests in flight cluster-wide, each lm_latency_s: lm_cap / (lm_calls × latency)
        items/s whatever N is (the provider's rate limit is the real cap).
    I/O: node_io_mb_s per node of image reads from shared storage, io_mb_per_item each.
    CPU: per_item_host_cpu_s of host CPU per item (image decode, offline statistics, DSPy formatting
        and parsing: ~0.15 s measured in batch_bench) on cpu_per_node cores."""
    tool_s = per_item_cpu_s / gpu_speedup
    per_node_tools = 1 / tool_s  # one GPU, busy all the time (actors overlap model waits)
    lm_ceiling = lm_cap / (lm_calls * lm_latency_s) if lm_calls else float("inf")  # lm_calls=0: offline analyst
    per_node_io = node_io_mb_s / io_mb_per_item
    rows = []
    for n in (1, 4, 16, 64, 256):
        ceilings = {"GPU tool time": n * per_node_tools, "LM provider cap": lm_ceiling, "image I/O": n * per_node_io,
                    "CPU (decode, statistics)": n * cpu_per_node / per_item_host_cpu_s}
        bound = min(ceilings, key=ceilings.get)
        rows.append({"nodes": n, "images_per_hour": int(ceilings[bound] * 3600), "bottleneck": bound})
    return {"assumptions": {"per_item_cpu_s": round(per_item_cpu_s, 4), "gpu_speedup": gpu_speedup, "lm_calls": lm_calls,
                            "lm_latency_s": lm_latency_s, "lm_cap": lm_cap, "actors_per_gpu": actors_per_gpu,
                            "io_mb_per_item": io_mb_per_item, "node_io_mb_s": node_io_mb_s,
                            "cpu_per_node": cpu_per_node, "per_item_host_cpu_s": per_item_host_cpu_s},
            "scale": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.3)
    ap.add_argument("--part", default="all", choices=["offline", "model", "all"])
    args = ap.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    disable_dspy_cache()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    report = {}
    with tempfile.TemporaryDirectory(prefix="aiqa-ray-bench-") as tmp:
        folder = Path(tmp)
        if args.part in ("offline", "all"):
            report["offline"] = offline(folder, args.n, size, args.batch_size, args.reps)
            per_item = 1 / report["offline"]["steady_items_per_s"]["local_1_thread"]
            report["paper"] = {"vlm": paper(per_item), "offline_analyst": paper(per_item, lm_calls=0)}
        if args.part in ("model", "all"):
            report["model"] = model(folder, args.n, size, args.batch_size, args.latency, args.reps)
    ray.shutdown()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
