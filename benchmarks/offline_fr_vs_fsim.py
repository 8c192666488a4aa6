"""FR check for issue 10 part 6: the offline analyst's FR score against FSIM alone on the same images.

    python benchmarks/offline_fr_vs_fsim.py [--per-source 2]

Uses the corpus and statistics cache of ``fit_corpus.py`` (run it first). For each source, the first
``--per-source`` photos are held out with their source (the fold's fit never saw that source); their
damage is regenerated under the "alt" ladder and scored by pyiqa's FSIM (colour FSIMc, pyiqa default) and by the
analyst in FR mode (expectation of its level distribution, analyst alone). Reported: mean intra-(photo,
type) SRCC for both, per type, on exactly the same groups.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_corpus as fc  # noqa: E402
from agentic_iqa.bench import metrics, synth  # noqa: E402
from agentic_iqa.offline import severity as sv  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=str(fc.DEFAULT_CACHE))
    ap.add_argument("--per-source", type=int, default=2)
    ap.add_argument("--json", default=str(ROOT / "benchmarks/corpus/fr_vs_fsim.json"))
    args = ap.parse_args(argv)
    import pyiqa
    import torch

    fsim = pyiqa.create_metric("fsim", device="cpu")
    cache = Path(args.cache).expanduser()
    photos = fc.build_corpus(cache, 512)
    measured = fc.measure_corpus(photos, cache, 1, "512")
    rows = {"group": [], "type": [], "level": [], "fsim": [], "analyst": []}
    for held in sorted({p["source"] for p in photos}):
        tr = [i for i, p in enumerate(photos) if p["source"] != held]
        th = fc.fit([photos[i] for i in tr], [measured[i] for i in tr])
        for i in [i for i, p in enumerate(photos) if p["source"] == held][: args.per_source]:
            p, m = photos[i], measured[i]
            x = np.asarray(fc.Image.open(p["path"]).convert("RGB"), dtype=np.float32) / 255
            ref_t = torch.from_numpy(x).permute(2, 0, 1)[None]
            for r in m["rows"]:
                if r["ladder"] != "alt":
                    continue
                t = synth.TYPES[r["type"]]
                rng = synth._rng(1, Path(p["path"]).stem, r["type"], r["level"])
                y = fc._apply(x, t, fc.ladder_param(t, r["level"], "alt"), rng)
                with torch.no_grad():
                    f = float(fsim(torch.from_numpy(y).permute(2, 0, 1)[None], ref_t))
                an = sv.analyze_stats(r["nr"], r["fr"], th)
                rows["group"].append(p["name"]), rows["type"].append(r["type"]), rows["level"].append(r["level"])
                rows["fsim"].append(f), rows["analyst"].append(fc.score_of(an))
            print(f"{held}/{p['name']} done", flush=True)
    out = {}
    for key in ("fsim", "analyst"):
        out[key] = metrics.intra_group_srcc(rows["group"], rows["type"], rows["level"], rows[key])
        print(f"{key:8s} intra SRCC {out[key]['srcc']:.3f} ({out[key]['groups']} groups); "
              + ", ".join(f"{t} {v:.2f}" for t, v in out[key]["per_type"].items()))
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
