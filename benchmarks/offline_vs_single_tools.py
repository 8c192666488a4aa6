"""Issue 10: the offline answer as users get it, against single IQA tools, on held-out sources.

    python benchmarks/offline_vs_single_tools.py [--per-source 1] [--modes nr,fr] [--workers 2] [--check-cli 6]

Uses the corpus and statistics cache of ``fit_corpus.py`` (it builds them on first use). Protocol: leave
one source out. For each source, the analyst's thresholds are fitted on the OTHER sources (``fit_corpus.fit``);
the first ``--per-source`` photos of the held-out source get their damage regenerated under the "alt" ladder
(parameter values the fit never saw: each level moved halfway to the next, another seed), and every clean
photo of that source is scored too. Each image is scored by

* ``analyst``: the offline analyst alone (expectation of its level distribution);
* single pyiqa tools on the same images (NR: BRISQUE, NIQE, PIQE; FR: FSIM and the other weight-free FR
  tools), raw scores;
* ``pipeline``: what the offline CLI/API answers, computed by the offline analyst's own code
  (``analyst.offline_tool_names`` for the tools it runs, ``OfflineRoles.fuse`` for the spec's fusion with the
  shipped η and the bundled β) — the shipped choice of ``agentic_iqa/offline/fusion_choice.json``
  (``benchmarks/choose_fusion.py``). ``--check-cli N`` runs the real offline assessment (``Assessor``, as
  ``agentic-iqa assess --offline``) on N saved images and fails unless it answers what this script computes.

Reported per mode: mean intra-(photo, type) SRCC (within one photo and type, does the score fall as the
level rises), SRCC across all images (clean photos as level 0 plus all damage: are scores comparable across
types?), and for the pipeline and analyst the clean photos' mean score and share below 3.5.

Raw tool scores are cached under ``<corpus cache>/tools/<tool-layer key>/`` keyed by the image's bytes and the
tool name, so re-runs (and ``choose_fusion.py``) only score what is new; any change to ``iqa_tools/`` or pyiqa
starts a fresh folder.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_corpus as fc  # noqa: E402
from agentic_iqa.bench import metrics, synth  # noqa: E402
from agentic_iqa.offline import severity as sv  # noqa: E402

NR_TOOLS = ("BRISQUE", "NIQE", "PIQE")
# Every weight-free FR tool of the bundled table but CW-SSIM (5x slower than the rest, no β).
FR_TOOLS = ("FSIM", "VIF", "GMSD", "SSIM", "MS-SSIM", "VSI", "NLPD", "PSNR")
TOOLS = {"nr": NR_TOOLS, "fr": FR_TOOLS}
SHOWN = {"nr": NR_TOOLS, "fr": ("FSIM", "VIF", "VSI", "GMSD", "MS-SSIM")}  # single-tool columns of the report
_registry = None


def registry():
    global _registry
    if _registry is None:
        from agentic_iqa.config import load_settings

        _registry = load_settings().build_registry(cache=False)
    return _registry


def raw_score(tool: str, y: np.ndarray, x: np.ndarray) -> float:
    """The tool's raw score, NaN when it fails on this image (VIF on a flat photo against itself: 0/0)."""
    from iqa_tools.errors import ToolRunError

    reg = registry()
    try:
        return float(reg.score(tool, y, x if reg.spec(tool).mode == "FR" else None).raw_score)
    except ToolRunError:
        return float("nan")


def oriented(tool: str, raw: float) -> float:
    """A raw score turned so that higher is better for every tool; a failed tool (NaN) ranks last."""
    if not np.isfinite(raw):
        return -1e12  # finite, so the SRCC helpers' logistic fits do not see infinities
    return -raw if registry().spec(tool).lower_better else raw


def normalized(tool: str, raw: dict) -> float:
    """The normalized score the assessment gets for `tool`: a failed tool is replaced as the executor
    replaces it, by the first generic fallback tool (NIQE, then BRISQUE: tools.yaml) that scored."""
    reg = registry()
    for t in (tool, *reg.table.fallback.generic):
        if t in raw and np.isfinite(raw[t]):
            return reg.normalize(t, raw[t])[0]
    raise ValueError(f"{tool} and every fallback failed: {raw}")


def image_key(y: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(y, dtype=np.float32).tobytes()).hexdigest()[:20]


def _score_photo(args) -> dict:
    """Raw tool scores for one photo: its clean copy (FR tools against itself: what a clean photo with its
    own copy as reference gets) and, when ``damaged``, every type (``synth.TYPES``) x 5 levels of "alt"-ladder damage
    (``fit_corpus.measure_photo``'s images). Cached per image+tool."""
    path, gray, damaged, cache_dir = args
    try:
        import torch

        torch.set_num_threads(1)  # one process per core; torch's own threads collapse under contention
    except ImportError:  # pragma: no cover
        pass
    stem = Path(path).stem
    cfile = Path(cache_dir) / f"{stem}.json"
    cached = json.loads(cfile.read_text()) if cfile.is_file() else {}
    x = np.asarray(fc.Image.open(path).convert("RGB"), dtype=np.float32) / 255

    def scores(y, tools):
        entry = cached.setdefault(image_key(y), {})
        for t in tools:
            if t not in entry:
                entry[t] = raw_score(t, y, x)
        return {t: entry[t] for t in tools}

    out = {"clean": scores(x, NR_TOOLS + FR_TOOLS), "rows": []}
    if damaged:
        for tname, t in synth.TYPES.items():
            if t.needs_color and gray:
                continue
            for level in range(1, 6):
                rng = synth._rng(1, stem, tname, level)
                y = fc._apply(x, t, fc.ladder_param(t, level, "alt"), rng)
                out["rows"].append({"type": tname, "level": level, "raw": scores(y, NR_TOOLS + FR_TOOLS)})
    tmp = cfile.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cached))
    tmp.replace(cfile)
    return out


def damaged_photos(photos: list[dict], per_source: int) -> set[int]:
    """Indices of the first ``per_source`` photos of every source (the ones that get damaged)."""
    out = set()
    for src in sorted({p["source"] for p in photos}):
        out |= set([i for i, p in enumerate(photos) if p["source"] == src][:per_source])
    return out


def tools_code_key() -> str:
    """Cached tool scores are reused while the tool layer (iqa_tools' code, table and model files) and
    pyiqa are unchanged: a change there (e.g. a faster BRISQUE) starts a new cache folder."""
    from importlib.metadata import version

    h = hashlib.sha1(version("pyiqa").encode())
    for f in sorted((ROOT / "iqa_tools").rglob("*")):
        if f.is_file() and f.suffix in (".py", ".yaml", ".mat", ".pt", ".json"):
            h.update(f.relative_to(ROOT).as_posix().encode() + f.read_bytes())
    return h.hexdigest()[:12]


def tool_scores(photos: list[dict], cache: Path, per_source: int, workers: int) -> list[dict]:
    cache_dir = cache / "tools" / tools_code_key()
    cache_dir.mkdir(parents=True, exist_ok=True)
    damaged = damaged_photos(photos, per_source)
    jobs = [(p["path"], p["gray"], i in damaged, str(cache_dir)) for i, p in enumerate(photos)]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            return list(pool.map(_score_photo, jobs))
    return [_score_photo(j) for j in jobs]


def alt_rows(measured_photo: dict) -> list[dict]:
    """The photo's "alt"-ladder statistics rows, in the order ``_score_photo`` scores them."""
    return [r for r in measured_photo["rows"] if r["ladder"] == "alt"]


def pipeline_score(an: dict, raw: dict, mode: str) -> float:
    """What the offline assessment answers for these analyses and raw tool scores: the tools the analyst
    selects for the categories it detects, normalized by the bundled β, fused by ``OfflineRoles.fuse``."""
    from agentic_iqa.offline.analyst import OfflineRoles, offline_tool_names

    reg = registry()
    names = offline_tool_names(mode.upper(), [c for c, a in an.items() if a.severity != "none"],
                               reg.available_tools(mode.upper()))
    scores = [normalized(t, raw) for t in names]
    return OfflineRoles().fuse(sv.level_distribution(an), scores, mode.upper()).score


def check_cli(photos, per_source: int, n: int) -> list[dict]:
    """Run the real offline assessment on ``n`` damaged images (saved as PNG) and compare its score with
    ``pipeline_score`` on the same file's statistics and tool scores. Raises on any difference."""
    from agentic_iqa.offline.stats import at_working_size
    from iqa_tools import load_image

    from agentic_iqa.api import Assessor
    from agentic_iqa.config import load_settings

    assessor = Assessor(load_settings(backend="offline", cache={"enabled": False}))
    picks = sorted(damaged_photos(photos, per_source))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(n):
            p = photos[picks[k % len(picks)]]
            tname = sorted(synth.TYPES)[(5 * k + 3) % len(synth.TYPES)]
            level = 1 + k % 5
            x = np.asarray(fc.Image.open(p["path"]).convert("RGB"), dtype=np.float32) / 255
            t = synth.TYPES[tname]
            y = fc._apply(x, t, fc.ladder_param(t, level, "alt"), synth._rng(1, p["name"], tname, level))
            ypath, xpath = Path(tmp) / f"{k}.png", Path(tmp) / f"{k}_ref.png"
            fc.Image.fromarray((y * 255 + 0.5).astype(np.uint8)).save(ypath)
            fc.Image.fromarray((x * 255 + 0.5).astype(np.uint8)).save(xpath)
            yl = load_image(ypath).float_pixels()
            xl = load_image(xpath).float_pixels()
            for mode, ref in (("nr", None), ("fr", xpath)):
                an = sv.analyze(at_working_size(yl), at_working_size(xl) if ref else None, look=True)
                raw = {tn: raw_score(tn, yl, xl) for tn in TOOLS[mode]}
                mine = pipeline_score(an, raw, mode)
                cli = assessor.assess(str(ypath), reference=str(ref) if ref else None, use_cache=False).score
                out.append({"image": f"{p['name']}/{tname}/{level}", "mode": mode, "benchmark": mine, "cli": cli})
                print(f"check {mode} {out[-1]['image']}: benchmark {mine:.4f} cli {cli:.4f}", flush=True)
                if abs(mine - cli) > 1e-6:
                    raise SystemExit(f"the benchmark's pipeline score {mine} differs from the CLI's {cli} on {out[-1]}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=str(fc.DEFAULT_CACHE))
    ap.add_argument("--per-source", type=int, default=1)
    ap.add_argument("--modes", default="nr,fr")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--check-cli", type=int, default=0, metavar="N")
    ap.add_argument("--json", default=str(ROOT / "benchmarks/corpus/offline_vs_single_tools.json"))
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m in TOOLS]
    cache = Path(args.cache).expanduser()
    photos = fc.build_corpus(cache, 512)
    measured = fc.measure_corpus(photos, cache, 1, "512")
    scored = tool_scores(photos, cache, args.per_source, args.workers)
    damaged = damaged_photos(photos, args.per_source)
    cols = {m: ["analyst", "pipeline", *SHOWN[m]] for m in modes}
    rows = {m: {k: [] for k in ("group", "type", "level", *cols[m])} for m in modes}
    clean = {m: {k: [] for k in cols[m]} for m in modes}

    def add(m: str, target: dict, an: dict, raw: dict, tools) -> None:
        target["analyst"].append(fc.score_of(an))
        target["pipeline"].append(pipeline_score(an, raw, m))
        for t in tools:
            target[t].append(oriented(t, raw[t]))

    for held, _, _, th in fc.fold_fits(photos, measured, args.workers):
        for i in (i for i, p in enumerate(photos) if p["source"] == held):
            p, mrec, sc = photos[i], measured[i], scored[i]
            for m in modes:  # a clean photo against itself: FR statistics of identity, FR tools at their best
                an = sv.analyze_stats(mrec["clean"]["nr"], mrec["clean"]["fr"] if m == "fr" else None, th)
                add(m, clean[m], an, sc["clean"], SHOWN[m])
            if i not in damaged:
                continue
            for r, s in zip(alt_rows(mrec), sc["rows"], strict=True):
                assert (r["type"], r["level"]) == (s["type"], s["level"]), (r["type"], s["type"])
                for m in modes:
                    an = sv.analyze_stats(r["nr"], r["fr"] if m == "fr" else None, th)
                    rows[m]["group"].append(p["name"]), rows[m]["type"].append(r["type"]), rows[m]["level"].append(r["level"])
                    add(m, rows[m], an, s["raw"], SHOWN[m])
    out: dict = {"protocol": "leave-one-source-out, alt ladder, first %d photo(s) per held-out source damaged, "
                             "all clean photos of the held-out sources; pipeline = the shipped "
                             "agentic_iqa/offline/fusion_choice.json" % args.per_source}
    for m in modes:
        out[m] = {}
        n_clean = len(clean[m]["analyst"])
        for key in cols[m]:
            intra = metrics.intra_group_srcc(rows[m]["group"], rows[m]["type"], rows[m]["level"], rows[m][key])
            levels = [0] * n_clean + rows[m]["level"]
            entry = {"intra_srcc": intra["srcc"], "groups": intra["groups"], "per_type": intra["per_type"],
                     "all_srcc": metrics.correlations(clean[m][key] + rows[m][key], [-lv for lv in levels])["srcc"]}
            if key in ("analyst", "pipeline"):
                c = np.array(clean[m][key])
                entry.update(clean_mean=float(c.mean()), clean_below_3_5=float(np.mean(c < 3.5)), n_clean=n_clean)
            out[m][key] = entry
            extra = f"; clean {entry['clean_mean']:.2f} ({entry['clean_below_3_5']:.0%} < 3.5, n={n_clean})" if "clean_mean" in entry else ""
            print(f"{m.upper()} {key:9s} intra SRCC {entry['intra_srcc']:.3f} ({entry['groups']} groups), SRCC all images {entry['all_srcc']:.3f}{extra}", flush=True)
    if args.check_cli:
        out["cli_check"] = check_cli(photos, args.per_source, args.check_cli)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
