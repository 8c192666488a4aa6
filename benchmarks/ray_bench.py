"""Issue 15 benchmarks: the Ray Data engine against the local batch runner on the same items.

Run:  PYTHONPATH=. .venv/bin/python benchmarks/ray_bench.py [--n 32] [--size 320x240] [--part offline|model|all]

1. Offline (the offline analyst + real pyiqa tools, tool cache off): local `assess_many` (1 thread)
   against `assess_dataset` with 1 and 2 actors (1 thread each). Ray's overhead per item is the
   marginal cost: each engine runs N and 2N items, and (T(2N) - T(N)) / N is its per-item cost, so
   fixed costs (Ray start, actor start with its torch import, the first batch) cancel out.
   Overhead = Ray's per-item cost / local per-item cost - 1. Target ≤ 5 %.
2. Model (the real HTTP path to the fake OpenAI-compatible server answering every call after
   300 ms, run in its own process): local `assess_many` at 4 threads against 1 and 2 actors at 4
   threads each.
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


def run_local(images: list[str], settings, threads: int) -> float:
    from agentic_iqa.distributed import warm_up

    assessor = Assessor(settings)
    warm_up(assessor)
    _ = assessor.graph
    t0 = time.perf_counter()
    results = list(assess_many(images, assessor=assessor, concurrency=threads))
    dt = time.perf_counter() - t0
    assert len(results) == len(images) and all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    return dt


def run_ray(images: list[str], settings, actors: int, threads: int, batch_size: int) -> float:
    import ray

    from agentic_iqa.distributed import assess_dataset

    t0 = time.perf_counter()
    ds = ray.data.from_items([{"image": p} for p in images], override_num_blocks=max(1, len(images) // batch_size))
    rows = assess_dataset(ds, settings=settings, concurrency=actors, threads_per_worker=threads, batch_size=batch_size).take_all()
    dt = time.perf_counter() - t0
    assert len(rows) == len(images) and all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"][:3]
    return dt


def marginal(t1: float, t2: float, n: int) -> float:
    return (t2 - t1) / n


def offline(folder: Path, n: int, size, batch_size: int) -> dict:
    settings = load_settings(folder, backend="offline", cache={"enabled": False})
    imgs = make_images(folder / "off", 2 * n, size)
    half, full = imgs[:n], imgs
    t = {}
    for name, fn in (("local", lambda xs: run_local(xs, settings, 1)),
                     ("ray_1", lambda xs: run_ray(xs, settings, 1, 1, batch_size)),
                     ("ray_2", lambda xs: run_ray(xs, settings, 2, 1, batch_size))):
        t[name] = (fn(half), fn(full))
    per = {k: marginal(a, b, n) for k, (a, b) in t.items()}
    return {
        "protocol": f"offline analyst, real tools, cache off; {n} and {2 * n} JPEGs {size[0]}x{size[1]}; 1 thread per engine; "
                    f"Ray batch_size {batch_size}; per-item = (T(2N)-T(N))/N",
        "wall_seconds": {k: [round(a, 2), round(b, 2)] for k, (a, b) in t.items()},
        "per_item_ms": {k: round(v * 1000, 1) for k, v in per.items()},
        "items_per_s_marginal": {k: round(1 / v, 2) for k, v in per.items()},
        "ray_overhead_per_item_pct": round((per["ray_1"] / per["local"] - 1) * 100, 1),
        "ray_2_vs_ray_1_speedup": round(per["ray_1"] / per["ray_2"], 2),
    }


def model(folder: Path, n: int, size, batch_size: int, latency: float) -> dict:
    from batch_bench import ServerProcess

    imgs = make_images(folder / "lm", n, size)
    out = {}
    with ServerProcess(latency) as srv:
        settings = load_settings(folder, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False})
        for role in ("planner", "executor", "summarizer"):
            settings.backends.role(role).timeout = 30
        runs = (("local_4_threads", lambda: run_local(imgs, settings, 4)),
                ("ray_1x4", lambda: run_ray(imgs, settings, 1, 4, batch_size)),
                ("ray_2x4", lambda: run_ray(imgs, settings, 2, 4, batch_size)))
        for name, fn in runs:
            out[name] = fn()
    return {
        "protocol": f"fake OpenAI-compatible server (own process) answering after {latency * 1000:.0f} ms, 5 LM calls/item, "
                    f"real PIQE runs, cache off; {n} JPEGs {size[0]}x{size[1]}; wall time including Ray start-up of actors",
        "wall_seconds": {k: round(v, 2) for k, v in out.items()},
        "items_per_s": {k: round(n / v, 2) for k, v in out.items()},
    }


def paper(per_item_cpu_s: float, lm_calls: int = 5, lm_latency_s: float = 1.5, gpu_speedup: float = 20.0,
          actors_per_gpu: int = 4, lm_cap: int = 256, io_mb_per_item: float = 1.0, node_io_mb_s: float = 200.0) -> dict:
    """Images per hour on N GPU nodes (one GPU each), three ceilings; the lowest binds.

    tools: actors_per_gpu actors share a GPU (num_gpus 1/actors_per_gpu); one tool slot each; a tool
        run takes per_item_cpu_s / gpu_speedup on the GPU (an assumption: pyiqa's classical metrics
        gain little on GPU, deep ones a lot), so a node does actors_per_gpu / (tool time) items/s
        at best, as long as the GPU is not saturated (then 1 / tool time).
    LM: lm_cap requests in flight cluster-wide, each lm_latency_s: lm_cap / (lm_calls × latency)
        items/s whatever N is (the provider's rate limit is the real cap).
    I/O: node_io_mb_s per node of image reads from shared storage, io_mb_per_item each."""
    tool_s = per_item_cpu_s / gpu_speedup
    per_node_tools = 1 / tool_s  # one GPU, busy all the time (actors overlap model waits)
    lm_ceiling = lm_cap / (lm_calls * lm_latency_s)
    per_node_io = node_io_mb_s / io_mb_per_item
    rows = []
    for n in (1, 4, 16, 64, 256):
        ceilings = {"GPU tool time": n * per_node_tools, "LM provider cap": lm_ceiling, "image I/O": n * per_node_io}
        bound = min(ceilings, key=ceilings.get)
        rows.append({"nodes": n, "images_per_hour": int(ceilings[bound] * 3600), "bottleneck": bound})
    return {"assumptions": {"per_item_cpu_s": round(per_item_cpu_s, 4), "gpu_speedup": gpu_speedup, "lm_calls": lm_calls,
                            "lm_latency_s": lm_latency_s, "lm_cap": lm_cap, "actors_per_gpu": actors_per_gpu,
                            "io_mb_per_item": io_mb_per_item, "node_io_mb_s": node_io_mb_s},
            "scale": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
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
            report["offline"] = offline(folder, args.n, size, args.batch_size)
            report["paper"] = paper(report["offline"]["per_item_ms"]["local"] / 1000)
        if args.part in ("model", "all"):
            report["model"] = model(folder, args.n, size, args.batch_size, args.latency)
    ray.shutdown()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
