"""Issue 4: where the time of one offline assessment (512×384, no LM) goes.

Run: .venv/bin/python benchmarks/offline_bench.py   — prints per-stage medians over N runs (tool cache off),
plus the statistics alone and process start-up, so a one-image CLI call can be read against them.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("AGENTIC_IQA_CACHE_DIR", tempfile.mkdtemp(prefix="aiqa-offline-bench-"))

from agentic_iqa.api import Assessor  # noqa: E402
from agentic_iqa.bench.synth import distort, load_reference  # noqa: E402
from agentic_iqa.config import load_settings  # noqa: E402
from agentic_iqa.offline import severity, stats  # noqa: E402


def main(n: int = 7) -> None:
    from PIL import Image

    d = Path(tempfile.mkdtemp())
    ref = load_reference("coffee")
    img = distort(ref, "gaussian blur", 3, seed=0)
    Image.fromarray((ref * 255).round().astype("uint8")).save(d / "ref.png")
    Image.fromarray((img * 255).round().astype("uint8")).save(d / "img.png")
    assessor = Assessor(load_settings(tempfile.mkdtemp(), backend="offline", cache={"enabled": False}))
    for mode, reference in (("NR", None), ("FR", d / "ref.png")):
        assessor.assess(d / "img.png", None, reference)  # warm-up: imports, metric creation
        runs = [assessor.assess(d / "img.png", None, reference) for _ in range(n)]
        total = statistics.median(r.total_seconds for r in runs)
        stages = {k: statistics.median(r.timings.get(k, 0.0) for r in runs) for k in runs[0].timings}
        tools = sorted({lg.tool_name for lg in runs[0].evidence.tool_logs})
        print(f"{mode}: {total * 1000:.0f} ms per assessment (median of {n}); tools {tools}")
        for k, v in sorted(stages.items(), key=lambda kv: -kv[1]):
            print(f"   {k:<15} {v * 1000:7.1f} ms")
    shared_reference(assessor, d, n)
    x = stats.as_float_rgb(d / "img.png")
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        severity.analyze(x)
        t.append(time.perf_counter() - t0)
    print(f"NR statistics + severities alone: {statistics.median(t) * 1000:.0f} ms")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import agentic_iqa.api, iqa_tools, torch, pyiqa"], check=True)
    print(f"process start-up (python + torch + pyiqa + our modules): {time.perf_counter() - t0:.2f} s")


def shared_reference(assessor: Assessor, d: Path, n: int) -> None:
    """FR items that share one reference (a batch against one original): the reference's statistics kept
    per file version (``analyst._reference_stats``) vs measured for every item (the cache emptied before it),
    alternated item by item, at 512×384 and at 2048×1536 (measured at the 1024 px working size)."""
    from PIL import Image

    from agentic_iqa.offline import analyst

    for size in ((512, 384), (2048, 1536)):
        ref = Image.open(d / "ref.png").resize(size, Image.Resampling.LANCZOS)
        img = Image.open(d / "img.png").resize(size, Image.Resampling.LANCZOS)
        ref.save(d / f"ref{size[0]}.png"), img.save(d / f"img{size[0]}.png")
        times: dict = {"kept": [], "per item": []}
        for i in range(2 * n + 2):
            side = ("kept", "per item")[i % 2]
            if side == "per item":
                analyst._REFERENCE_STATS.clear()
            r = assessor.assess(d / f"img{size[0]}.png", None, d / f"ref{size[0]}.png")
            if i >= 2:  # the first of each side warms up (and fills the cache)
                times[side].append(r.total_seconds)
        a, b = statistics.median(times["per item"]), statistics.median(times["kept"])
        print(f"FR, one shared reference, {size[0]}×{size[1]}: {a * 1000:.0f} ms per item measuring it each time, "
              f"{b * 1000:.0f} ms keeping its statistics ({a / b:.2f}×; medians of {n}, alternated; load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
