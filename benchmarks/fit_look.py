"""Fit the offline analyst's look model (``agentic_iqa/offline/look.py``) on human ratings of authentic photos.

    python benchmarks/fit_look.py BIQ2021_DIR [--clive MANIFEST] [--workers 2] [--no-write]

BIQ2021_DIR is a checkout of github nisarahmedrana/BIQ2021 (62c7b40: ``Images/`` and the two
``(Images and MOS).csv`` files; 12,000 photos, long side 512, each with the mean of 30 lab ratings, 0–1).

Protocol (fixed before any figure was seen; RESULTS.md, follow-up 44):

* **Training: subset 03 only**, the 8,000 Unsplash photos (Unsplash License), less any photo the synthetic corpus
  also has (32×32 thumbnail correlation > 0.98 with a corpus working copy), so the corpus's leave-one-source-out
  figures stay held out. Subsets 01 and 02 are the authors' own photos with no stated licence: never fitted on.
* **Choices by 5-fold cross-validation on subset 03**, near-duplicates (thumbnail correlation > 0.97) kept in one
  fold: the feature set (the analyst's statistics alone, or with BRISQUE's 36 features; the larger set must gain
  more than 0.01 of out-of-fold SRCC) and the ridge penalty (the best out-of-fold SRCC).
* **Evaluation only**, never in a choice: subsets 01 + 02 (4,000 photos from the authors' own cameras: another
  source) and, with ``--clive``, LIVE In the Wild (``agentic-iqa bench convert clive``).

Writes ``agentic_iqa/offline/look_model.json`` (unless ``--no-write``) and ``benchmarks/corpus/look_fit.json``
(the choices, the figures, and subset 03's out-of-fold predictions for ``choose_look.py``). Features are cached
per image under the corpus cache (``fit_corpus.py``'s), keyed by the file's bytes and the feature code.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_corpus as fc  # noqa: E402
from agentic_iqa.bench.manifest import read_manifest  # noqa: E402
from agentic_iqa.offline.look import feature_maps, normal_scores, quantile_knots  # noqa: E402

RECORD = ROOT / "benchmarks" / "corpus" / "look_fit.json"
FOLDS = 5
KNOTS = 41
PENALTIES = (1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0)
LARGER_SET_MARGIN = 0.01
SAME_PHOTO, NEAR_DUPLICATE = 0.98, 0.97
MAX_CSV_BYTES = 4 << 20


def _code_key() -> str:
    h = hashlib.sha1()
    for f in ("agentic_iqa/offline/stats.py", "agentic_iqa/offline/look.py", "iqa_tools/nss.py"):
        h.update((ROOT / f).read_bytes())
    return h.hexdigest()[:12]


def _features(args) -> dict:
    path, cache_dir = args
    import torch

    torch.set_num_threads(1)
    from agentic_iqa.offline.look import look_features
    from iqa_tools import load_image

    data = Path(path).read_bytes()
    cfile = Path(cache_dir) / f"{hashlib.sha1(data).hexdigest()[:16]}.json"
    if cfile.is_file():
        return json.loads(cfile.read_text())
    try:
        out = {"features": look_features(load_image(path).float_pixels())}
    except Exception as e:  # noqa: BLE001 - a bad file is recorded and skipped, the rest go on
        out = {"error": f"{type(e).__name__}: {e}"}
    cfile.write_text(json.dumps(out))
    return out


def features_of(paths: list[str], cache: Path, workers: int) -> list[dict]:
    cache_dir = cache / "look" / _code_key()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_features, [(p, str(cache_dir)) for p in paths], chunksize=16))


def biq_ratings(root: Path) -> dict[str, float]:
    """{lower-case file name: MOS} from the two CSVs (regular files under 4 MiB)."""
    out = {}
    for name in ("Train (Images and MOS).csv", "Test (Images and MOS).csv"):
        f = root / name
        if not f.is_file() or f.stat().st_size > MAX_CSV_BYTES:
            raise SystemExit(f"{f}: not found or too large; pass a BIQ2021 checkout")
        for row in csv.reader(f.read_text(encoding="utf-8", errors="replace").splitlines()):
            if row and row[0].lower().endswith(".jpg"):
                out[row[0].strip().lower()] = float(row[1])
    return out


def thumbnail(path: str) -> np.ndarray:
    with fc.Image.open(path) as im:
        a = np.asarray(im.convert("L").resize((32, 32), fc.Image.Resampling.BILINEAR), dtype=np.float64).ravel()
    a -= a.mean()
    n = np.linalg.norm(a)
    return a / n if n > 0 else a


def duplicate_groups(thumbs: np.ndarray) -> np.ndarray:
    """A group id per photo: photos whose thumbnails correlate above ``NEAR_DUPLICATE`` share one (union-find)."""
    parent = np.arange(len(thumbs))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    sim = thumbs @ thumbs.T
    for a, b in zip(*np.nonzero(np.triu(sim, 1) > NEAR_DUPLICATE)):
        parent[find(a)] = find(b)
    return np.array([find(a) for a in range(len(thumbs))])


def quantile_map(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return quantile_knots(X, np.linspace(0.5 / KNOTS, 1 - 0.5 / KNOTS, KNOTS))


def fit_ridge(X: np.ndarray, y: np.ndarray, penalty: float) -> dict:
    knots, z = quantile_map(X)
    Z = normal_scores(X, feature_maps(knots, z))
    mu = float(y.mean())
    w = np.linalg.solve(Z.T @ Z + penalty * len(y) * np.eye(Z.shape[1]), Z.T @ (y - mu))
    return {"knots": knots, "z": z, "weights": w, "intercept": mu}


def predict(m: dict, X: np.ndarray) -> np.ndarray:
    return normal_scores(X, feature_maps(m["knots"], m["z"])) @ m["weights"] + m["intercept"]


def out_of_fold(X: np.ndarray, y: np.ndarray, groups: np.ndarray, penalty: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    ids = np.unique(groups)
    fold = dict(zip(ids, rng.integers(0, FOLDS, len(ids))))
    f = np.array([fold[g] for g in groups])
    oof = np.empty(len(y))
    for k in range(FOLDS):
        m = fit_ridge(X[f != k], y[f != k], penalty)
        oof[f == k] = predict(m, X[f == k])
    return oof


def srcc(a, b) -> float:
    return float(stats.spearmanr(a, b)[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("biq", type=Path)
    ap.add_argument("--clive", type=Path, default=None, help="a LIVE In the Wild manifest (evaluation only)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=fc.DEFAULT_CACHE)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    ratings = biq_ratings(args.biq)
    paths = sorted(str(p) for p in (args.biq / "Images").iterdir() if p.is_file() and p.name.lower() in ratings)
    train = [p for p in paths if Path(p).name.startswith("ss03")]
    held = [p for p in paths if not Path(p).name.startswith("ss03")]
    thumbs = np.stack([thumbnail(p) for p in train])
    # The fitted sources, and the blind (evaluation-only) sources' working copies where this machine has them.
    corpus = [p["path"] for p in fc.build_corpus(args.cache, 512)]
    corpus += sorted(str(p) for p in (args.cache / "work" / "blind-512").glob("*.png"))
    in_corpus = (np.stack([thumbnail(p) for p in corpus]) @ thumbs.T).max(axis=0) > SAME_PHOTO
    print(f"subset 03: {len(train)} photos, {int(in_corpus.sum())} also in the synthetic corpus (left out)")
    keep = ~in_corpus
    train, thumbs = [p for p, k in zip(train, keep) if k], thumbs[keep]
    groups = duplicate_groups(thumbs)

    feats = features_of(train + held, args.cache, args.workers)
    bad = [(p, f["error"]) for p, f in zip(train + held, feats) if "error" in f]
    for p, e in bad:
        print(f"skipped {p}: {e}", file=sys.stderr)
    ftrain, fheld = feats[:len(train)], feats[len(train):]
    ok = np.array(["error" not in f for f in ftrain])
    y = np.array([ratings[Path(p).name.lower()] for p in train])[ok]
    groups = groups[ok]
    names_all = sorted(next(f for f in ftrain if "error" not in f)["features"])
    sets = {"stats": [n for n in names_all if not n.startswith("brisque_")], "stats+brisque": names_all}

    def matrix(fs, names):
        return np.array([[f["features"][n] for n in names] for f in fs if "error" not in f], dtype=np.float64)

    cv = {}
    for set_name, names in sets.items():
        X = matrix(ftrain, names)
        cv[set_name] = {str(pen): srcc(out_of_fold(X, y, groups, pen), y) for pen in PENALTIES}
        print(set_name, {k: round(v, 4) for k, v in cv[set_name].items()})
    best = {s: max(cv[s].items(), key=lambda kv: kv[1]) for s in sets}
    chosen = "stats+brisque" if best["stats+brisque"][1] > best["stats"][1] + LARGER_SET_MARGIN else "stats"
    penalty = float(best[chosen][0])
    names = sets[chosen]
    X = matrix(ftrain, names)
    oof = out_of_fold(X, y, groups, penalty)
    model = fit_ridge(X, y, penalty)
    print(f"chosen: {chosen}, penalty {penalty:g}; subset 03 out-of-fold SRCC {srcc(oof, y):.4f}")

    evaluation = {}
    hy = np.array([ratings[Path(p).name.lower()] for p, f in zip(held, fheld) if "error" not in f])
    evaluation["biq2021 subsets 01+02"] = {"n": int(len(hy)), "srcc": srcc(predict(model, matrix(fheld, names)), hy)}
    if args.clive:
        rows, problems = read_manifest(args.clive)
        rows = [r for r in rows if r.mos is not None]
        fc_ = features_of([str(r.image_path) for r in rows], args.cache, args.workers)
        cy = np.array([r.mos for r, f in zip(rows, fc_) if "error" not in f])
        evaluation["clive"] = {"n": int(len(cy)), "srcc": srcc(predict(model, matrix(fc_, names)), cy)}
    for k, v in evaluation.items():
        print(f"evaluation only, {k}: n {v['n']}, SRCC {v['srcc']:.4f}")

    about = {"trained_on": "BIQ2021 subset 03 (Unsplash photos, Unsplash License; lab MOS 0-1), github "
                           "nisarahmedrana/BIQ2021 62c7b40", "photos": int(len(y)), "features": chosen,
             "penalty": penalty, "subset03_oof_srcc": srcc(oof, y)}
    shipped = {"about": about, "names": names, "knots": model["knots"].tolist(), "z": model["z"].tolist(),
               "weights": model["weights"].tolist(), "intercept": model["intercept"]}
    record = {"protocol": __doc__.split("Protocol")[1].split("Writes")[0].strip(), "cv_srcc": cv, "chosen": chosen,
              "penalty": penalty, "evaluation_only": evaluation, "skipped": [p for p, _ in bad],
              "subset03_oof": {Path(p).name: float(v) for p, v in zip([p for p, k in zip(train, ok) if k], oof)}}
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    if not args.no_write:
        from agentic_iqa.offline.look import MODEL_PATH

        MODEL_PATH.write_text(json.dumps(shipped) + "\n")
        print(f"wrote {MODEL_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
