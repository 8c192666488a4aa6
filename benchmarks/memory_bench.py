"""Peak memory of the tool layer on large images (issue 11 part 3 / issue 14).

For each size (12, 48, 90 MP by default) a synthetic photo-like JPEG is generated, then a fresh Python process
scores it with every weight-free tool of the bundled table through ToolRegistry (FR tools against a
re-encoded copy as reference) and reports its peak RSS (ru_maxrss) and each tool's working resolution.
Target: peak RSS ≤ 3 GB at every size the pixel guard accepts (default limit 100 MP).

`--cli` measures the whole product instead: a fresh `agentic-iqa assess IMAGE --offline --json --no-cache`
process per size (without and with `--reference`), its peak RSS read with wait4() (the child's own
ru_maxrss, not the maximum over all children), wall time and exit code.

    python benchmarks/memory_bench.py [--sizes 12 48 90] [--cli]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from iqa_tools import ToolRegistry
img, ref = sys.argv[1], sys.argv[2]
reg = ToolRegistry(cache=False, offline=True, device="cpu")
rows = []
for spec in reg.available_tools():
    t = time.perf_counter()
    try:
        ws = reg.score(spec.name, img, ref if spec.mode == "FR" else None).working_size
    except Exception as exc:  # a tool's own failure (e.g. a NaN score) is reported, the others still run
        ws = [type(exc).__name__]
    rows.append({"tool": spec.name, "working_size": ws, "seconds": round(time.perf_counter() - t, 1),
                 "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})
print(json.dumps(rows))
"""


def make_image(path: Path, megapixels: float, seed: int, quality: int) -> tuple[int, int]:
    """A smooth-plus-texture RGB image of about `megapixels`, 4:3, written as JPEG (generated in strips)."""
    import numpy as np
    from PIL import Image

    h = int((megapixels * 1e6 * 3 / 4) ** 0.5)
    w = int(h * 4 / 3)
    rng = np.random.default_rng(seed)
    out = Image.new("RGB", (w, h))
    xs = np.linspace(0, 6 * np.pi, w, dtype=np.float32)
    for top in range(0, h, 1024):
        rows = np.arange(top, min(h, top + 1024), dtype=np.float32)[:, None]
        base = 128 + 60 * np.sin(xs[None, :] + rows / 300) * np.cos(rows / 500)
        strip = np.stack([base, base * 0.8 + 30, 255 - base], axis=-1) + rng.normal(0, 12, (len(rows), w, 3)).astype(np.float32)
        out.paste(Image.fromarray(strip.clip(0, 255).astype(np.uint8)), (0, top))
    out.save(path, quality=quality)
    return w, h


CLI = "import sys; from agentic_iqa.cli import main; sys.argv[0] = 'agentic-iqa'; main()"


def run_cli(args: list[str]) -> dict:
    """One fresh `agentic-iqa …` process: exit code, wall seconds, its own peak RSS (MB), stderr tail."""
    import time

    t = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", CLI, *args], stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's rusage alone
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        out.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        tail = err.read().decode("utf-8", "replace").strip().splitlines()[-2:]
    row = {"exit": proc.returncode, "seconds": round(time.perf_counter() - t, 1),
           "peak_rss_mb": round(usage.ru_maxrss / 1024), "stderr": tail}
    try:
        result = json.loads(stdout)
        row["score"] = round((result.get("result") or {}).get("score") or 0, 2) or None
    except json.JSONDecodeError:
        pass
    return row


def cli_mode(sizes: list[float]) -> int:
    worst = 0
    with tempfile.TemporaryDirectory(prefix="aiqa-mem-") as tmp:
        env_note = os.environ.get("AGENTIC_IQA_CACHE_DIR", "(default)")
        print(f"full CLI, --offline --no-cache; cache dir {env_note}")
        for mp in sizes:
            img, ref = Path(tmp) / f"img{mp:g}.jpg", Path(tmp) / f"ref{mp:g}.jpg"
            w, h = make_image(ref, mp, 0, 95)
            make_image(img, mp, 0, 40)
            for label, extra in (("NR", []), ("FR", ["--reference", str(ref)])):
                row = run_cli(["assess", str(img), *extra, "--offline", "--json", "--no-cache"])
                worst = max(worst, row["peak_rss_mb"])
                print(f"{mp:g} MP ({w}×{h}) {label}: exit {row['exit']}, peak RSS {row['peak_rss_mb']} MB, "
                      f"{row['seconds']} s, score {row.get('score')}" + (f", stderr {row['stderr']}" if row["exit"] else ""))
            img.unlink()
            ref.unlink()
    print(f"worst peak RSS {worst} MB (target ≤ 3072 MB)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[12, 48, 90])
    ap.add_argument("--cli", action="store_true", help="measure the whole `agentic-iqa assess --offline` process")
    args = ap.parse_args()
    if args.cli:
        return cli_mode(args.sizes)
    with tempfile.TemporaryDirectory(prefix="aiqa-mem-") as tmp:
        for mp in args.sizes:
            img, ref = Path(tmp) / f"img{mp:g}.jpg", Path(tmp) / f"ref{mp:g}.jpg"
            w, h = make_image(ref, mp, 0, 95)
            make_image(img, mp, 0, 40)
            proc = subprocess.run([sys.executable, "-c", CHILD, str(img), str(ref)], capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{mp:g} MP ({w}×{h}): failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            rows = json.loads(proc.stdout.strip().splitlines()[-1])
            peak = max(r["peak_rss_mb"] for r in rows)
            print(f"{mp:g} MP ({w}×{h}): peak RSS {peak} MB over {len(rows)} tools")
            for r in rows:
                ws = "×".join(map(str, r["working_size"]))
                print(f"  {r['tool']:8s} at {ws:10s} {r['seconds']:6.1f} s  peak so far {r['peak_rss_mb']} MB")
            img.unlink()
            ref.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
