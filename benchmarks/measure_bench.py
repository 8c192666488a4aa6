"""What one statistic costs the offline analyst's ``stats.measure``: the whole measure against the same measure with
that statistic's function replaced by a constant (the baseline), interleaved round by round, at the fit's size
(512x384) and at the working size a user's photo is measured at (1024x768). Default: ``noise_sigma_across_scales``
(issue 10, RESULTS.md follow-up 40).

    python benchmarks/measure_bench.py [--function noise_sigma_across_scales] [--rounds 7] [--calls 10]
"""
from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import numpy as np

from agentic_iqa.bench.synth import load_reference
from agentic_iqa.offline import stats as st


def _ms_per_call(x: np.ndarray, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        st.measure(x)
    return (time.perf_counter() - start) * 1000 / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--function", default="noise_sigma_across_scales", help="the stats.py function to price")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args(argv)
    if not callable(getattr(st, args.function, None)):
        ap.error(f"stats.py has no function {args.function!r}")
    for size in ((512, 384), (1024, 768)):
        x = load_reference("coffee", size)
        st.measure(x)  # warm-up
        with_it, without = [], []
        for _ in range(args.rounds):
            with_it.append(_ms_per_call(x, args.calls))
            with mock.patch.object(st, args.function, lambda *a, **k: 0.0):
                without.append(_ms_per_call(x, args.calls))
        a, b = statistics.median(with_it), statistics.median(without)
        print(f"{size[0]}x{size[1]}: measure {a:.1f} ms, without {args.function} {b:.1f} ms: ratio {a / b:.3f} "
              f"(medians of {args.rounds} rounds of {args.calls} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
