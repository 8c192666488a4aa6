"""Issue 3 benchmarks: framework overhead, the critical path of LM calls, and CLI start-up.

Run:  .venv/bin/python benchmarks/pipeline_bench.py
Prints each figure with the ratio it is judged by. Nothing here is asserted in tests.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("AGENTIC_IQA_CACHE_DIR", tempfile.mkdtemp(prefix="aiqa-bench-cache-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from canned import CannedVLM, Reply, disable_dspy_cache, valid_reply, write_test_image  # noqa: E402
from fake_openai import FakeOpenAIServer, scripted  # noqa: E402

from agentic_iqa.agents.vlm import VLMRoles  # noqa: E402
from agentic_iqa.api import Assessor  # noqa: E402
from agentic_iqa.config import load_settings  # noqa: E402
from iqa_tools import ToolRegistry  # noqa: E402

LOGPROBS = {"A": -3.0, "B": -0.4, "C": -1.2, "D": -4.0, "E": -6.0}
ROUTES = {
    "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
    "select": {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}},
    "score": valid_reply("score", level="B"),
}


def framework_overhead(img: Path, n: int = 60) -> None:
    """Assessments with an instant canned LM and the tool step out of the way.

    The tool step: the registry's score cache is filled by a warm-up run, so `execute` is a cache lookup
    (counted as overhead). The canned LM's own scripting time (harness work) is subtracted; DSPy's
    parsing of its reply is not. What is left: input validation (one image decode), the graph, the five
    DSPy calls (adapter, LM client path, parsing), our validation, fusion and the result."""
    disable_dspy_cache()
    settings = load_settings(tempfile.mkdtemp(), cache={"enabled": True, "dir": tempfile.mkdtemp(prefix="aiqa-bench-")})
    vlm = CannedVLM({k: v if k != "score" else Reply(v, level_logprobs=LOGPROBS) for k, v in ROUTES.items()},
                    logprobs=True, repeat_last=True)
    roles = VLMRoles(settings, lms={"planner": vlm.lm, "executor": vlm.lm, "summarizer": vlm.lm})
    assessor = Assessor(settings, roles=roles)
    for _ in range(3):
        assessor.assess(img, "Rate this photo")  # warm-up: imports, metric creation, score cache filled
    overheads, stages = [], []
    for _ in range(n):
        scripted_before = vlm.answer_seconds
        t0 = time.perf_counter()
        r = assessor.assess(img, "Rate this photo")
        wall = time.perf_counter() - t0
        overheads.append(wall - (vlm.answer_seconds - scripted_before))
        stages.append(r.timings)
    overhead = statistics.median(overheads)
    q1, _, q3 = statistics.quantiles(overheads, n=4)
    from iqa_tools import load_image

    decode = statistics.median(_timed(lambda: load_image(str(img))) for _ in range(20))
    registry = ToolRegistry(cache=False)
    registry.score("PIQE", str(img), use_cache=False)
    piqe = statistics.median(registry.score("PIQE", str(img), use_cache=False).seconds for _ in range(10))
    network = network_nr_seconds(img)
    per_stage = {k: statistics.median(t.get(k, 0.0) for t in stages) * 1000 for k in ("planner", "detect", "select", "execute", "analyze", "summarizer")}
    w, h = _size(img)
    print(f"[{w}x{h}] framework overhead per assessment (5 LM calls, instant LM, tool step cached): {overhead * 1000:.1f} ms "
          f"(median of {n}, quartiles {q1 * 1000:.1f}-{q3 * 1000:.1f}; target <= 30 ms)")
    print("  of which: input image decode " + f"{decode * 1000:.1f} ms; stages " + ", ".join(f"{k} {v:.1f}" for k, v in per_stage.items()) + " ms")
    print(f"  vs one network NR metric forward on this image (MUSIQ architecture, CPU): {network * 1000:.0f} ms -> "
          f"{overhead / network * 100:.1f}% (target <= 3% of a typical NR tool run)")
    print(f"  vs PIQE (a classical NR metric) on this image: {piqe * 1000:.1f} ms -> {overhead / piqe:.2f}x")
    if hasattr(assessor, "agraph"):  # the async path (graph.ainvoke, DSPy acall), same assessor and images
        import asyncio

        async def timed_async() -> list[float]:
            out = []
            for _ in range(n):
                scripted_before = vlm.answer_seconds
                t0 = time.perf_counter()
                await assessor.assess_async(img, "Rate this photo")
                out.append(time.perf_counter() - t0 - (vlm.answer_seconds - scripted_before))
            return out

        asyncio.run(timed_async())  # warm-up: the async graph and the LM's async client
        a = asyncio.run(timed_async())
        aq1, _, aq3 = statistics.quantiles(a, n=4)
        print(f"  async path (assess_async): {statistics.median(a) * 1000:.1f} ms (quartiles {aq1 * 1000:.1f}-{aq3 * 1000:.1f}) "
              f"-> {statistics.median(a) / overhead:.2f}x the sync path")


def network_nr_seconds(img: Path) -> float:
    """One forward of pyiqa's MUSIQ architecture on `img` (pretrained=False: random weights, the only
    network NR metric pyiqa builds here without a download; same compute as the real one)."""
    import pyiqa
    import torch

    from iqa_tools import load_image

    metric = pyiqa.create_metric("musiq", pretrained=False, device="cpu")
    tensor = load_image(str(img)).tensor
    with torch.no_grad():
        metric(tensor)
        return statistics.median(_timed(lambda: metric(tensor)) for _ in range(3))


def _size(img: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(img) as im:
        return im.size


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _serve(routes: dict, latency: float, conn) -> None:
    """Child process: the fake OpenAI-compatible server, off this process's GIL like a remote provider."""
    with FakeOpenAIServer(scripted(routes), latency=latency) as srv:
        conn.send(srv.base_url)
        conn.recv()  # until the parent says stop


@contextlib.contextmanager
def remote_fake_server(routes: dict, latency: float):
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(routes, latency, child), daemon=True)
    proc.start()
    try:
        yield parent.recv()
    finally:
        parent.send("stop")
        proc.join(5)


def critical_path(img: Path, latency: float = 0.3, model: str = "openai/gpt-4o") -> None:
    """With every LM call taking `latency`, how many latencies does one NR scoring assessment take?

    The fake server runs in its own process (a provider's work is not done on our cores). `model` is the
    name DSPy sees: a catalogued one (gpt-4o: structured-output schemas, known capabilities) or an unknown
    one (DSPy scans its model-metadata map for it on every call)."""
    disable_dspy_cache()
    routes = dict(ROUTES, _logprobs=LOGPROBS)
    with remote_fake_server(routes, latency) as base_url:
        settings = load_settings(tempfile.mkdtemp(), lm=model, api_base=base_url, cache={"enabled": True})
        assessor = Assessor(settings)
        assessor.assess(img, "Rate this photo")  # warm-up (imports, metric creation, tool cache filled)
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = assessor.assess(img, "Rate this photo")
            runs.append(time.perf_counter() - t0)
        calls = r.lm_calls
    wall = statistics.median(runs)
    print(f"critical path ({model}): {calls} LM calls at {latency * 1000:.0f} ms each took {wall:.3f} s = "
          f"{wall / latency:.2f}x the per-call latency (sequential would be >= {calls}.00x; target <= 4.3x)")


def cli_startup(n: int = 7) -> None:
    # The project's venv, else the running interpreter's (a worktree sharing a venv; PYTHONPATH picks the code).
    candidates = [ROOT / ".venv/bin/agentic-iqa", Path(sys.executable).parent / "agentic-iqa"]
    exe = next((str(c) for c in candidates if c.exists()), "agentic-iqa")

    def timed(cmd):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    base = timed([sys.executable, "-c", "pass"])
    helps = timed([exe, "--help"])
    heavy = timed([sys.executable, "-c", "import torch, pyiqa, dspy"])
    print(f"`agentic-iqa --help`: {helps:.3f} s vs `python -c pass` {base:.3f} s -> +{helps - base:.3f} s (target <= 0.5 s)")
    print(f"  for scale: importing torch + pyiqa + dspy takes {heavy:.2f} s, which --help does not pay")


if __name__ == "__main__":
    d = Path(tempfile.mkdtemp())
    img = write_test_image(d / "bench.jpg", size=(512, 384), quality=85)
    framework_overhead(img)
    framework_overhead(write_test_image(d / "photo.jpg", size=(1024, 768), quality=85))  # a typical web photo
    critical_path(img)
    critical_path(img, model="openai/my-local-vlm")
    cli_startup()
