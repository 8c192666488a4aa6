"""Generate the KADID-style synthetic benchmark (see agentic_iqa/bench/synth.py for what is in it).

    .venv/bin/python benchmarks/make_synthetic.py [OUT_DIR] [--seed 0] [--refs a,b] [--types "jpeg,white noise"]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentic_iqa.bench.synth import REFERENCES, TYPES, make_benchmark  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", nargs="?", default="benchmarks/out/synthetic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--refs", help=f"comma-separated subset of: {', '.join(REFERENCES)}")
    ap.add_argument("--types", help=f"comma-separated subset of: {', '.join(TYPES)}")
    ap.add_argument("--no-mcq", action="store_true", help="leave out the multiple-choice rows")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: up to 4, one per core)")
    args = ap.parse_args(argv)
    split = lambda s: [p.strip() for p in s.split(",") if p.strip()] if s else None  # noqa: E731
    start = time.perf_counter()
    try:
        manifest = make_benchmark(args.out_dir, seed=args.seed, refs=split(args.refs), types=split(args.types),
                                  mcq=not args.no_mcq, workers=args.workers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    n = sum(1 for _ in manifest.open())
    print(f"wrote {manifest} ({n} rows) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
