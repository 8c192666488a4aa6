"""Issue 14: torch intra-op threads for tool runs — 1 vs 2 — at batch concurrency 1 and 8.

    .venv/bin/python benchmarks/threads_bench.py [--images 16] [--tools PIQE,NIQE,SSIM] [--rounds 2]

Each cell is a fresh process (AGENTIC_IQA_TORCH_THREADS=t) running `assess_many` over the same 512×384
JPEGs with the offline analyst, cache off, and a query naming the tool (so that tool runs for every image;
SSIM gets each image's pristine reference). `assess_many` gates tool runs to one at a time, as in
production, so at concurrency 8 the other items' decoding and statistics (numpy/OpenCV) compete with the
tool for the cores. Cells alternate thread counts within each round; per cell the median of rounds.
Figures: wall time of the batch / items, after one untimed assessment that pays imports and metric creation.
The machine is shared: the load average is printed beside each figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
from agentic_iqa.api import create_assessor
from agentic_iqa.batch.runner import assess_many
from iqa_tools import backend
tool, conc, items = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
a = create_assessor(offline=True)
q = f"Rate the overall quality of this image using {tool}."
batch = [{"image": i, "query": q, **({"reference": r} if tool in ("SSIM",) else {})} for i, r in items]
a.assess(batch[0]["image"], q, batch[0].get("reference"), use_cache=False)  # imports, metric creation: not timed
t0 = time.perf_counter()
for res in assess_many(batch, concurrency=conc, assessor=a, use_cache=False):
    if res.status != "ok":
        raise SystemExit(f"item failed: {res}")
wall = time.perf_counter() - t0
print(json.dumps({"per_item_s": wall / len(batch), "wall_s": wall, "threads": backend.torch().get_num_threads()}))
"""

MAKE = r"""
import io, json, sys
import numpy as np, skimage.data
from PIL import Image, ImageFilter
out, n = sys.argv[1], int(sys.argv[2])
names = ("astronaut", "chelsea", "coffee", "rocket")
rows = []
for i in range(n):
    ref = Image.fromarray(getattr(skimage.data, names[i % 4])()).convert("RGB").resize((512, 384), Image.Resampling.LANCZOS)
    r, d = f"{out}/ref_{i}.png", f"{out}/img_{i}.jpg"
    ref.save(r)
    ref.filter(ImageFilter.GaussianBlur(0.5 + i % 3)).save(d, quality=70)
    rows.append([d, r])
print(json.dumps(rows))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--tools", default="PIQE,NIQE,SSIM")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="threads-bench-"))
    items = subprocess.run([sys.executable, "-c", MAKE, str(work), str(args.images)], check=True, capture_output=True,
                           text=True).stdout
    env = dict(os.environ, PYTHONPATH=str(ROOT), AGENTIC_IQA_CACHE_DIR=str(work / "cache"), HF_HUB_OFFLINE="1")
    env.pop("OMP_NUM_THREADS", None)
    res: dict = {}
    print(f"{args.images} images 512x384, offline analyst, cache off; load {os.getloadavg()[0]:.1f} (2 cores)", flush=True)
    for tool in args.tools.split(","):
        for conc in (1, 8):
            cells: dict = {1: [], 2: []}
            loads = []
            for rnd in range(args.rounds):
                for threads in ((1, 2) if rnd % 2 == 0 else (2, 1)):
                    out = subprocess.run([sys.executable, "-c", CHILD, tool, str(conc), items], cwd=ROOT, capture_output=True,
                                         text=True, env=dict(env, AGENTIC_IQA_TORCH_THREADS=str(threads)))
                    if out.returncode != 0:
                        raise SystemExit(out.stderr[-2000:])
                    doc = json.loads(out.stdout.strip().splitlines()[-1])
                    assert doc["threads"] == min(threads, len(os.sched_getaffinity(0)))
                    cells[threads].append(doc["per_item_s"])
                    loads.append(os.getloadavg()[0])
            one, two = (statistics.median(cells[t]) for t in (1, 2))
            res[f"{tool} c{conc}"] = {"1": cells[1], "2": cells[2], "loads": loads}
            print(f"{tool:6s} concurrency {conc}: 1 thread {one * 1e3:7.1f} ms/item, 2 threads {two * 1e3:7.1f} ms/item "
                  f"(2 threads / 1 = {two / one:.2f}); runs {[round(x * 1e3) for x in cells[1]]} / {[round(x * 1e3) for x in cells[2]]}; "
                  f"load {', '.join(f'{x:.1f}' for x in loads)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
