"""How long one analyst fit takes (``severity.fit_with_clean_offsets``, what every leave-one-source-out fold, every
nested fold of ``choose_fusion.py`` and the final fit run), for two source trees side by side (before = a git
revision, after = this tree), on the same corpus samples; and whether the two fits are the same.

    .venv/bin/python benchmarks/fit_bench.py [--before HEAD~1] [--sources kodak,lomiri,mate,plasma,skimage] [--repeats 1]

Each fit runs in a fresh interpreter of its tree (trees alternate: before, after, after, before, ...); wall time and
the 1-minute load average beside it; medians of --repeats. The fitted thresholds of both trees are compared value by
value (a relative difference over 1e-9 counts). Uses ``fit_corpus.py``'s statistics cache (run it first); the
samples are the named training sources' clean photos and their "fit"-ladder damage. Nothing here is asserted in tests.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIT = r"""
import json, pickle, sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/benchmarks")
from agentic_iqa.offline import severity as sv
samples, sources = pickle.load(open(sys.argv[2], "rb"))
t = time.perf_counter()
fitted = sv.fit_with_clean_offsets(samples, sources)
seconds = time.perf_counter() - t
json.dump(fitted, open(sys.argv[3], "w"))
print(seconds)
"""


def differences(a, b, path: str = "") -> list[str]:
    """Where two fits differ (a relative difference over 1e-9, a key or a length)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in
                ([f"{path}/{k}: only in one"] if (k in a) != (k in b) else differences(a[k], b[k], f"{path}/{k}"))]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        same = a == b or (a != a and b != b) or abs(a - b) <= 1e-9 * max(1.0, abs(a))
        return [] if same else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="HEAD~1", help="git revision of the baseline tree")
    ap.add_argument("--sources", default="kodak,lomiri,mate,plasma,skimage", help="training sources to fit on")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_corpus as fc
    from cli_bench import export_tree  # the baseline tree, as cli_bench exports it

    wanted = set(args.sources.split(","))
    photos = fc.build_corpus(fc.DEFAULT_CACHE, 512)
    measured = fc.measure_corpus(photos, fc.DEFAULT_CACHE, 1, "512")
    keep = [i for i, p in enumerate(photos) if p["source"] in wanted]
    if {photos[i]["source"] for i in keep} != wanted:
        print(f"unknown source(s): {sorted(wanted - {p['source'] for p in photos})}", file=sys.stderr)
        return 2
    samples, sources = fc.samples_of([photos[i] for i in keep], [measured[i] for i in keep])
    print(f"{len(samples)} samples from {len(keep)} photos of {len(wanted)} sources")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "samples.pkl"
        data.write_bytes(pickle.dumps((samples, sources)))
        before = tmp / "before"
        commit = export_tree(args.before, before)
        print(f"before = {args.before} ({commit[:7]}), after = this tree")
        trees = {"before": before, "after": ROOT}
        times: dict = {"before": [], "after": []}
        order = [name for r in range(args.repeats) for name in (("before", "after") if r % 2 == 0 else ("after", "before"))]
        for name in order:
            out = tmp / f"{name}.json"
            t = subprocess.run([sys.executable, "-c", FIT, str(trees[name]), str(data), str(out)], capture_output=True,
                               text=True, check=True)
            times[name].append(float(t.stdout.strip()))
            print(f"{name:6s} {times[name][-1]:7.1f} s  (load {os.getloadavg()[0]:.1f})", flush=True)
        b, a = (statistics.median(times[k]) for k in ("before", "after"))
        print(f"median: before {b:.1f} s, after {a:.1f} s: {b / a:.2f}x")
        diff = differences(json.loads((tmp / "before.json").read_text()), json.loads((tmp / "after.json").read_text()))
        print("fits identical" if not diff else f"fits differ in {len(diff)} values, e.g. " + "; ".join(diff[:5]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
