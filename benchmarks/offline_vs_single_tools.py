"""Issue 10: the offline answer as users get it, against single IQA tools, on held-out sources.

    python benchmarks/offline_vs_single_tools.py [--per-source 1] [--modes nr,fr]

Uses the corpus and statistics cache of ``fit_corpus.py`` (it builds them on first use). Protocol: leave
one source out. For each source, the analyst's thresholds are fitted on the OTHER sources (``fit_corpus.fit``);
the first ``--per-source`` photos of the held-out source get their damage regenerated under the "alt" ladder
(parameter values the fit never saw: each level moved halfway to the next, another seed), and every clean
photo of that source is scored too. Each image is scored by

* ``analyst``: the offline analyst alone (expectation of its level distribution);
* single pyiqa tools on the same images (NR: BRISQUE, NIQE, PIQE; FR: FSIM, the strongest weight-free FR
  tool here), raw scores;
* ``pipeline``: what the offline CLI/API answers: the analyst's distribution fused (spec fusion, default η)
  with the tools the offline analyst selects (NR: the first available NR tool, BRISQUE; FR: VIF for
  Compression, FSIM otherwise), normalized by the bundled table's β.

Reported per mode: mean intra-(photo, type) SRCC (within one photo and type, does the score fall as the
level rises), SRCC across all images (clean photos as level 0 plus all damage: are scores comparable across
types?), and for the pipeline and analyst the clean photos' mean score and share below 3.5.
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

TOOLS = {"nr": ("BRISQUE", "NIQE", "PIQE"), "fr": ("FSIM",)}
LOWER_BETTER = {"BRISQUE", "NIQE", "PIQE"}


class Scorer:
    def __init__(self):
        from agentic_iqa.config import load_settings
        from agentic_iqa.fusion import ScoreFusion

        settings = load_settings()
        self.registry = settings.build_registry(cache=False)
        self.fusion = ScoreFusion(eta=settings.pipeline.fusion.eta)

    def raw(self, tool: str, y: np.ndarray, x: np.ndarray | None) -> float:
        return float(self.registry.score(tool, y, x if self.registry.spec(tool).mode == "FR" else None).raw_score)

    def pipeline(self, an: dict, raw: dict, mode: str, y: np.ndarray, x: np.ndarray) -> float:
        if mode == "nr":
            tools = {"BRISQUE"}
        else:  # the offline analyst's selection: VIF for Compression, FSIM for everything else
            cats = [c for c, a in an.items() if a.severity != "none"] or ["Overall"]
            tools = {"VIF" if c == "Compression" else "FSIM" for c in cats}
        for t in tools - raw.keys():  # VIF only where the pipeline would run it (it is slow)
            raw[t] = self.raw(t, y, x)
        scores = [self.registry.normalize(t, raw[t])[0] for t in sorted(tools)]
        dist = sv.level_distribution(an)
        return self.fusion.fuse(scores, probabilities={str(c): q for c, q in zip(range(1, 6), dist)},
                                prob_mode="analyst").score


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=str(fc.DEFAULT_CACHE))
    ap.add_argument("--per-source", type=int, default=1)
    ap.add_argument("--modes", default="nr,fr")
    ap.add_argument("--json", default=str(ROOT / "benchmarks/corpus/offline_vs_single_tools.json"))
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m in TOOLS]
    scorer = Scorer()
    cache = Path(args.cache).expanduser()
    photos = fc.build_corpus(cache, 512)
    measured = fc.measure_corpus(photos, cache, 1, "512")
    cols = {m: ["analyst", "pipeline", *TOOLS[m]] for m in modes}
    rows = {m: {k: [] for k in ("group", "type", "level", *cols[m])} for m in modes}
    clean = {m: {k: [] for k in cols[m]} for m in modes}

    def add(m: str, target: dict, an: dict, y: np.ndarray, x: np.ndarray) -> None:
        raw = {t: scorer.raw(t, y, x) for t in TOOLS[m]}
        target["analyst"].append(fc.score_of(an))
        target["pipeline"].append(scorer.pipeline(an, dict(raw), m, y, x))
        for t, v in raw.items():
            target[t].append(-v if t in LOWER_BETTER else v)  # higher = better for every column

    for held in sorted({p["source"] for p in photos}):
        tr = [i for i, p in enumerate(photos) if p["source"] != held]
        th = fc.fit([photos[i] for i in tr], [measured[i] for i in tr])
        held_idx = [i for i, p in enumerate(photos) if p["source"] == held]
        for i in held_idx:
            p, mrec = photos[i], measured[i]
            x = np.asarray(fc.Image.open(p["path"]).convert("RGB"), dtype=np.float32) / 255
            for m in modes:
                an = sv.analyze_stats(mrec["clean"]["nr"], mrec["clean"]["fr"] if m == "fr" else None, th)
                add(m, clean[m], an, x, x)
            if i not in held_idx[: args.per_source]:
                continue
            for r in mrec["rows"]:
                if r["ladder"] != "alt":
                    continue
                t = synth.TYPES[r["type"]]
                rng = synth._rng(1, Path(p["path"]).stem, r["type"], r["level"])
                y = fc._apply(x, t, fc.ladder_param(t, r["level"], "alt"), rng)
                for m in modes:
                    an = sv.analyze_stats(r["nr"], r["fr"] if m == "fr" else None, th)
                    rows[m]["group"].append(p["name"]), rows[m]["type"].append(r["type"]), rows[m]["level"].append(r["level"])
                    add(m, rows[m], an, y, x)
            print(f"{held}/{p['name']} done", flush=True)
    out: dict = {"protocol": "leave-one-source-out, alt ladder, first %d photo(s) per held-out source damaged, "
                             "all clean photos of the held-out sources" % args.per_source}
    for m in modes:
        out[m] = {}
        n_clean = len(clean[m]["analyst"])
        for key in cols[m]:
            intra = metrics.intra_group_srcc(rows[m]["group"], rows[m]["type"], rows[m]["level"], rows[m][key])
            both = clean[m][key] + rows[m][key]
            levels = [0] * n_clean + rows[m]["level"]
            entry = {"intra_srcc": intra["srcc"], "groups": intra["groups"], "per_type": intra["per_type"],
                     "all_srcc": metrics.correlations(both, [-lv for lv in levels])["srcc"]}
            if key in ("analyst", "pipeline"):
                c = np.array(clean[m][key])
                entry.update(clean_mean=float(c.mean()), clean_below_3_5=float(np.mean(c < 3.5)), n_clean=n_clean)
            out[m][key] = entry
            extra = f"; clean {entry['clean_mean']:.2f} ({entry['clean_below_3_5']:.0%} < 3.5, n={n_clean})" if "clean_mean" in entry else ""
            print(f"{m.upper()} {key:9s} intra SRCC {entry['intra_srcc']:.3f} ({entry['groups']} groups), "
                  f"SRCC all images {entry['all_srcc']:.3f}{extra}", flush=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
