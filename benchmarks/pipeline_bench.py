"""Issue 3 benchmarks: framework overhead, the critical path of LM calls, and CLI start-up.

Run:  .venv/bin/python benchmarks/pipeline_bench.py
Prints each figure with the ratio it is judged by. Nothing here is asserted in tests.
"""
from __future__ import annotations

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


def framework_overhead(img: Path, n: int = 30) -> None:
    """Assessments with an instant canned LM; the tool step's own time is subtracted."""
    disable_dspy_cache()
    settings = load_settings(tempfile.mkdtemp(), cache={"enabled": False})
    registry = ToolRegistry(cache=False)
    vlm = CannedVLM({k: v if k != "score" else Reply(v, level_logprobs=LOGPROBS) for k, v in ROUTES.items()},
                    logprobs=True, repeat_last=True)
    roles = VLMRoles(settings, lms={"planner": vlm.lm, "executor": vlm.lm, "summarizer": vlm.lm})
    assessor = Assessor(settings, registry=registry, roles=roles)
    assessor.assess(img, "Rate this photo")  # warm-up: imports, metric creation
    totals, tools = [], []
    for _ in range(n):
        r = assessor.assess(img, "Rate this photo")
        totals.append(r.total_seconds)
        tools.append(r.timings.get("execute", 0.0))
    overhead = statistics.median(t - x for t, x in zip(totals, tools))
    piqe = []
    for _ in range(n):
        piqe.append(registry.score("PIQE", str(img), use_cache=False).seconds)
    tool = statistics.median(piqe)
    print(f"framework overhead per assessment (5 LM calls, instant LM, tool time excluded): {overhead * 1000:.1f} ms")
    print(f"  PIQE forward on this image (uncached, median): {tool * 1000:.1f} ms -> overhead / PIQE = {overhead / tool:.2f}x")
    print(f"  for a 1 s network NR metric (e.g. TOPIQ/QAlign on CPU) that is {overhead / 1.0 * 100:.1f}% of the tool run")


def critical_path(img: Path, latency: float = 0.3) -> None:
    """With every LM call taking `latency`, how many latencies does one NR scoring assessment take?"""
    disable_dspy_cache()
    routes = dict(ROUTES, _logprobs=LOGPROBS)
    with FakeOpenAIServer(scripted(routes), latency=latency) as srv:
        settings = load_settings(tempfile.mkdtemp(), lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": True})
        assessor = Assessor(settings)
        assessor.assess(img, "Rate this photo")  # warm-up (imports, metric creation, tool cache filled)
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            r = assessor.assess(img, "Rate this photo")
            runs.append(time.perf_counter() - t0)
        calls = r.lm_calls
    wall = statistics.median(runs)
    print(f"critical path: {calls} LM calls at {latency * 1000:.0f} ms each took {wall:.2f} s = {wall / latency:.2f}x the per-call latency "
          f"(sequential would be >= {calls}.00x; target <= 4.3x)")


def cli_startup(n: int = 7) -> None:
    exe = str(ROOT / ".venv/bin/agentic-iqa") if (ROOT / ".venv/bin/agentic-iqa").exists() else "agentic-iqa"

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
    critical_path(img)
    cli_startup()
