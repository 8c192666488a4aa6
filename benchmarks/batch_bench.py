"""Issue 6 benchmarks: batch throughput with concurrency, and memory over a long batch.

Run:  .venv/bin/python benchmarks/batch_bench.py [--part throughput|rss|all] [--n-rss 300]

1. Throughput: 32 images (512×384 JPEG), the local fake OpenAI-compatible server answering every
   call after 300 ms, `assess_many` at concurrency 1 and 8. Target: concurrency 8 ≥ 6× the
   throughput of concurrency 1.
2. Memory: 300 assessments of ~1 MB JPEGs (1600×1200, sent to the model as they are) at
   concurrency 8; resident set size sampled throughout. Target: growth ≤ 50 MB over the batch
   (see `memory` for how growth is separated from the working set of the items in flight).

Both use the real HTTP path (DSPy's client → the fake server, run in its own process like a real model
server, keeping no request bodies), real PIQE runs (tool cache off, so every item computes its score)
and the batch runner exactly as the CLI uses it. Nothing here is asserted in
tests; the figures go to benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("AGENTIC_IQA_CACHE_DIR", tempfile.mkdtemp(prefix="aiqa-bench-cache-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from canned import disable_dspy_cache, valid_reply  # noqa: E402
from fake_openai import FakeOpenAIServer, scripted  # noqa: E402

from agentic_iqa.api import Assessor  # noqa: E402
from agentic_iqa.batch import assess_many  # noqa: E402
from agentic_iqa.config import load_settings  # noqa: E402

# The model name sent to the fake server (`--model` to change it; a name DSPy's catalog knows, such as
# openai/gpt-4o-mini, switches on structured-output schemas; the ratio measured the same either way).
MODEL = "openai/fake-vlm"
LOGPROBS = {"A": -3.0, "B": -0.4, "C": -1.2, "D": -4.0, "E": -6.0}
ROUTES = {
    "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
    "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
    "score": valid_reply("score", level="B"), "_logprobs": LOGPROBS,
}


class _Discard(list):
    """A request log that keeps nothing (the benchmark server must not hoard 1.8 MB request bodies)."""

    def append(self, item) -> None:
        self.calls = getattr(self, "calls", 0) + 1


def _serve(conn, latency: float) -> None:
    """Child process: the fake server, answering until told to stop; reports its URL, then its count."""
    srv = FakeOpenAIServer(scripted(ROUTES), latency=latency)
    srv.requests = _Discard()
    srv.start()
    conn.send(srv.base_url)
    conn.recv()  # wait for "stop"
    conn.send(getattr(srv.requests, "calls", 0))
    srv.stop()


class ServerProcess:
    """The fake OpenAI-compatible server in its own process, as a real model server would be: its CPU
    time and memory are not the client's."""

    def __init__(self, latency: float):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, latency), daemon=True)
        self.calls = 0

    def __enter__(self) -> "ServerProcess":
        self._proc.start()
        self.base_url = self._conn.recv()
        return self

    def __exit__(self, *exc) -> None:
        self._conn.send("stop")
        self.calls = self._conn.recv()
        self._proc.join(10)


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def make_images(folder: Path, n: int, size: tuple[int, int], quality: int) -> list[Path]:
    """Textured JPEGs (smooth gradients + noise + edges), distinct per index."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    paths = []
    for i in range(n):
        rng = np.random.default_rng(i)
        base = np.stack([xx * 255 / w, yy * 255 / h, ((xx // 40 + yy // 40) % 2) * 160 + 40], -1)
        arr = np.clip(base + rng.normal(0, 22, base.shape), 0, 255).astype(np.uint8)
        p = folder / f"img_{i:03d}.jpg"
        Image.fromarray(arr, "RGB").save(p, format="JPEG", quality=quality)
        paths.append(p)
    return paths


def assessor_for(srv) -> Assessor:
    settings = load_settings(tempfile.mkdtemp(), lm=MODEL, api_base=srv.base_url, cache={"enabled": False})
    return Assessor(settings)


def run(assessor: Assessor, images: list[Path], concurrency: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    ok = sum(r.ok for r in assess_many(images, assessor=assessor, concurrency=concurrency, use_cache=False))
    return time.perf_counter() - t0, ok


def throughput(latency: float = 0.3, n: int = 32) -> None:
    disable_dspy_cache()
    images = make_images(Path(tempfile.mkdtemp(prefix="aiqa-bench-img-")), n, (512, 384), 85)
    with ServerProcess(latency) as srv:
        assessor = assessor_for(srv)
        assessor.assess(images[0], None)  # warm-up: imports, metric creation, HTTP client
        seq, ok1 = run(assessor, images, 1)
        par, ok8 = run(assessor, images, 8)
    calls = srv.calls
    print(f"throughput: {n} images, {latency * 1000:.0f} ms per LM call ({calls} calls in all)")
    print(f"  concurrency 1: {seq:.1f} s = {n / seq:.2f} images/s ({ok1}/{n} ok)")
    print(f"  concurrency 8: {par:.1f} s = {n / par:.2f} images/s ({ok8}/{n} ok)")
    print(f"  ratio: {seq / par:.2f}x (target >= 6x)")


def memory(n: int = 300, latency: float = 0.05, distinct: int = 32, concurrency: int = 8) -> None:
    """RSS over `n` assessments of ~1 MB images (`distinct` files, cycled: every run decodes, sends and
    scores its image again since the tool cache is off).

    RSS is sampled every 0.1 s. At concurrency 8 the first round of items fills the working set (eight
    1600×1200 images in flight, each decoded to float tensors, base64-encoded for the model, scored);
    after that the resident size saw-tooths as items start and finish. Growth is therefore measured
    between the mean RSS over the first steady window (items 33–64) and the last (the final 32 items):
    what a long batch adds, not what one item in flight holds."""
    disable_dspy_cache()
    images = make_images(Path(tempfile.mkdtemp(prefix="aiqa-bench-1mb-")), distinct, (1600, 1200), 95)
    sizes = [p.stat().st_size for p in images]
    samples: list[tuple[int, float]] = []
    done = 0
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(0.1):
            samples.append((done, rss_mb()))

    with ServerProcess(latency) as srv:
        assessor = assessor_for(srv)
        assessor.assess(images[0], None)  # warm-up
        start = rss_mb()
        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        t0 = time.perf_counter()
        ok = 0
        for r in assess_many((images[i % distinct] for i in range(n)), assessor=assessor, concurrency=concurrency, use_cache=False):
            done += 1
            ok += r.ok
        wall = time.perf_counter() - t0
        stop.set()
        thread.join()
        end = rss_mb()

    def window(lo: int, hi: int) -> float:
        vals = [v for d, v in samples if lo <= d < hi]
        return sum(vals) / len(vals)

    first, last = window(32, 64), window(n - 32, n)
    peak = max(v for _, v in samples)
    print(f"memory: {n} assessments at concurrency {concurrency} of {distinct} distinct JPEGs (1600×1200), "
          f"mean {sum(sizes) / len(sizes) / 2**20:.2f} MB each ({ok}/{n} ok, {wall:.1f} s, {srv.calls} LM calls)")
    print(f"  RSS after one warm-up assessment: {start:.0f} MB; mean over items 33-64: {first:.0f} MB; "
          f"over items {n - 31}-{n}: {last:.0f} MB; at the end: {end:.0f} MB; peak: {peak:.0f} MB")
    print(f"  growth over the batch (last window - first window): {last - first:+.1f} MB (target <= 50 MB); "
          f"working set of {concurrency} items in flight: {first - start:+.0f} MB")


def main() -> None:
    global MODEL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["throughput", "rss", "all"], default="all")
    ap.add_argument("--n-rss", type=int, default=300)
    ap.add_argument("--latency", type=float, default=0.3, help="seconds per LM call in the throughput part")
    ap.add_argument("--model", default=MODEL, help="model name sent to the fake server")
    args = ap.parse_args()
    MODEL = args.model
    if args.part in ("throughput", "all"):
        throughput(args.latency)
    if args.part in ("rss", "all"):
        memory(args.n_rss)


if __name__ == "__main__":
    main()
