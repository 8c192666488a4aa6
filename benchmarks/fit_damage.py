"""Fit the damage model (``agentic_iqa/offline/damage.py``) on the synthetic corpus and choose its share of the
analyst's combined badness, leave-one-source-out.

    python benchmarks/fit_damage.py [--workers 2] [--no-write]    # ~8 min on 2 cores, from fit_corpus.py's cache

Protocol. The model is a two-layer network (``HIDDEN``, ReLU) from the analyst's NR statistics (``stats.measure``
on the corpus's 512 px working copies) to the damage level, clean photos 0 and every damage type at levels 1..5 of
the "fit" ladder. Its settings (``HIDDEN``, ``EPOCHS``, ``LEARNING_RATE``, ``WEIGHT_DECAY``, ``BATCH``, ``SEED``)
were set before any held-out figure was seen and not searched. For each of the 25 sources, a model trained
without that source predicts its clean photos and their "alt"-ladder damage (other parameters than the fit's),
and the analyst fitted without it (``fit_corpus.fold_fits``) grades the same images. The score is
``quality_from_badness(blend(detected badness, predicted level, w, t))``: the model's share ``w`` of the badness,
its level counted from ``t`` up (the detectors' badness alone on a monochrome or blank image, as the product does:
``severity.damage_level_applies``). ``(w, t)`` is chosen on a grid by

    J = intra SRCC + SRCC across all images − clean-photo penalties (choose_fusion's criterion)
        − 10 · max(0, 0.92 − intra SRCC) − 10 · max(0, clean share below 3.5 − 0.10)

(issue 10's NR targets as constraints, as in choose_look.py). A setting must beat the model unused by more than
``MARGIN``. The held-out figures are nested: each source is scored with the ``(w, t)`` chosen on the other 24
sources' held-out predictions. The photo's look (``look.py``) is not applied here (its features are not in the
corpus cache); ``choose_look.py`` re-chooses the look's combination on top of this one.

Writes the model trained on all 25 sources, with the ``(w, t)`` chosen on all of them, to
``agentic_iqa/offline/damage_model.json`` (unless ``--no-write``) and the record to
``benchmarks/corpus/damage_choice.json``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_corpus as fc  # noqa: E402
import offline_vs_single_tools as ovst  # noqa: E402
from agentic_iqa.offline import damage as dm  # noqa: E402
from agentic_iqa.offline import severity as sv  # noqa: E402
from agentic_iqa.offline.look import feature_maps, normal_scores, quantile_knots  # noqa: E402
from fit_corpus import figures  # noqa: E402

HIDDEN = (64, 32)
EPOCHS = 20
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-4
BATCH = 256
SEED = 0
QUANTILES = np.linspace(0.005, 0.995, 41)  # the knots each statistic is mapped to a normal score through
WEIGHTS = tuple(round(0.1 * i, 1) for i in range(1, 11))
OFFSETS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)
UNUSED = (0.0, 0.0)
MARGIN = 0.01
INTRA_TARGET, CLEAN_SHARE_TARGET = 0.92, 0.10
RECORD = ROOT / "benchmarks" / "corpus" / "damage_choice.json"


def statistic_names(measured) -> list[str]:
    return sorted(measured[0]["clean"]["nr"])


def training_rows(photos, measured, idx, names) -> tuple[np.ndarray, np.ndarray]:
    """Statistics and damage level of the photos ``idx``: each clean copy (level 0) and its "fit"-ladder damage, as
    the detectors are fitted on them (``fit_corpus.samples_of``)."""
    samples, _ = fc.samples_of([photos[i] for i in idx], [measured[i] for i in idx])
    return (np.array([[s[n] for n in names] for s, _, _ in samples], dtype=np.float64),
            np.array([level for _, _, level in samples], dtype=np.float64))


def held_out_rows(photos, measured, idx) -> tuple[list[dict], list[dict]]:
    """(item, NR statistics) of the photos ``idx``: each clean copy and its "alt"-ladder damage."""
    items, nrs = [], []
    for i in idx:
        m = measured[i]
        items.append({"group": photos[i]["name"], "type": None, "level": 0})
        nrs.append(m["clean"]["nr"])
        for r in ovst.alt_rows(m):
            items.append({"group": photos[i]["name"], "type": r["type"], "level": r["level"]})
            nrs.append(r["nr"])
    return items, nrs


def train(X: np.ndarray, y: np.ndarray, names: list[str]) -> dict:
    """The model's saved form (without its weight), trained on statistics ``X`` and levels ``y``."""
    import torch

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    knots, z = quantile_knots(X, QUANTILES)
    A = torch.tensor(normal_scores(X, feature_maps(knots, z)), dtype=torch.float32)
    t = torch.tensor(y, dtype=torch.float32)
    widths = (len(names), *HIDDEN, 1)
    mods = []
    for a, b in zip(widths[:-1], widths[1:]):
        mods += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    net = torch.nn.Sequential(*mods[:-1])
    opt = torch.optim.Adam(net.parameters(), LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(EPOCHS):
        perm = torch.randperm(len(A), generator=gen)
        for start in range(0, len(A), BATCH):
            b = perm[start:start + BATCH]
            loss = ((net(A[b]).squeeze(1) - t[b]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    linear = [m for m in net if isinstance(m, torch.nn.Linear)]
    return {"names": names, "knots": knots.tolist(), "z": z.tolist(),
            "layers": [{"w": m.weight.detach().double().numpy().T.tolist(),
                        "b": m.bias.detach().double().numpy().tolist()} for m in linear]}


def _train_job(args) -> dict:
    X, y, names = args
    return train(X, y, names)


def predicted_levels(saved: dict, nrs: list[dict]) -> np.ndarray:
    """The product's prediction (``DamageModel.level``, vectorized) for statistics ``nrs``; NaN where the product
    does not apply it (``severity.damage_level_applies``: a monochrome or blank image)."""
    model = dm.model_from_dict({**saved, "weight": 0.0, "offset": 0.0})
    levels = np.clip(model.levels(np.array([[s[n] for n in model.names] for s in nrs])), 0.0, 5.0)
    return np.where([sv.damage_level_applies(s) for s in nrs], levels, np.nan)


def quality(detected: np.ndarray, levels: np.ndarray, w: float, t: float) -> np.ndarray:
    """``severity.quality_from_badness`` of the blended badness (the detectors' alone where ``levels`` is NaN),
    vectorized."""
    blended = dm.blend(detected, np.nan_to_num(levels), w, t)
    return sv.quality_from_badness(np.where(np.isnan(levels), detected, blended))


def grid(items, detected, levels) -> dict:
    out = {}
    for setting in [UNUSED] + [(w, t) for w in WEIGHTS for t in OFFSETS]:
        f = figures(quality(detected, levels, *setting), items)
        f["J"] = (f["J_synthetic"] - 10 * max(0.0, INTRA_TARGET - f["intra_srcc"])
                  - 10 * max(0.0, f["clean_below_3_5"] - CLEAN_SHARE_TARGET))
        out[setting] = f
    return out


def level_means(q: np.ndarray, items: list[dict]) -> list[float]:
    """Mean score of the clean photos (level 0) and of each damage level 1..5."""
    level = np.array([it["level"] for it in items])
    return [float(q[level == k].mean()) for k in range(6)]


def best_of(table: dict) -> tuple[float, float]:
    best = max(table, key=lambda k: table[k]["J"])
    return best if table[best]["J"] > table[UNUSED]["J"] + MARGIN else UNUSED


def _cache_key(names) -> str:
    settings = json.dumps([HIDDEN, EPOCHS, LEARNING_RATE, WEIGHT_DECAY, BATCH, SEED, QUANTILES.tolist(), names])
    return hashlib.sha1(settings.encode() + fc._code_key().encode()).hexdigest()[:12]


def fold_models(photos, measured, cache: Path, workers: int) -> dict[str, dict]:
    """{source: the model trained without it} (saved forms), trained once and cached: the settings, the statistic
    names and the damage code are the key."""
    names = statistic_names(measured)
    sources = sorted({p["source"] for p in photos})
    cache_file = cache / "damage" / f"loso_{_cache_key(names)}.json"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    models = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    todo = [s for s in sources if s not in models]
    jobs = [training_rows(photos, measured, [i for i, p in enumerate(photos) if p["source"] != s], names) + (names,)
            for s in todo]
    with ProcessPoolExecutor(workers) as pool:
        for s, saved in zip(todo, pool.map(_train_job, jobs)):
            models[s] = saved
            tmp = cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(models))
            tmp.replace(cache_file)
            print(f"trained without {s}", flush=True)
    return models


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=fc.DEFAULT_CACHE)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    photos = fc.build_corpus(args.cache, 512)
    measured = fc.measure_corpus(photos, args.cache, args.workers, "512")
    names = statistic_names(measured)
    sources = sorted({p["source"] for p in photos})
    of = {s: [i for i, p in enumerate(photos) if p["source"] == s] for s in sources}

    models = fold_models(photos, measured, args.cache, args.workers)
    fits = fc.fits_without(photos, measured, [(s,) for s in sources], args.workers)
    by_source = {}
    for s in sources:
        items, nrs = held_out_rows(photos, measured, of[s])
        detected = np.array([sv.overall_badness(sv.analyze_stats(nr, None, fits[(s,)])) for nr in nrs])
        by_source[s] = (items, detected, predicted_levels(models[s], nrs))

    def pooled(srcs):
        return ([it for s in srcs for it in by_source[s][0]],
                np.concatenate([by_source[s][1] for s in srcs]), np.concatenate([by_source[s][2] for s in srcs]))

    table = grid(*pooled(sources))
    shipped = best_of(table)
    nested = {}
    for h in sources:
        chosen = best_of(grid(*pooled([s for s in sources if s != h])))
        items, detected, levels = by_source[h]
        nested[h] = {"chosen": chosen, "with": figures(quality(detected, levels, *chosen), items),
                     "without": figures(quality(detected, levels, *UNUSED), items),
                     "model_alone": figures(quality(detected, levels, 1.0, 0.0), items), "n_photos": len(of[h])}
        nested[h]["with"]["level_means"] = level_means(quality(detected, levels, *chosen), items)
        nested[h]["without"]["level_means"] = level_means(quality(detected, levels, *UNUSED), items)
    keys = ("intra_srcc", "all_srcc", "clean_mean", "clean_below_3_5")
    wts = np.array([len(of[h]) for h in sources], dtype=float)
    summary = {side: {k: float(np.average([nested[h][side][k] for h in sources], weights=wts)) for k in keys}
               for side in ("without", "with", "model_alone")}
    print(f"shipped: weight {shipped[0]:g}, offset {shipped[1]:g}: J {table[shipped]['J']:.4f} "
          f"(unused {table[UNUSED]['J']:.4f})")
    for h in sources:
        a, b = nested[h]["without"], nested[h]["with"]
        print(f"  {h:15s} w, t {nested[h]['chosen']}  intra {a['intra_srcc']:.3f} -> {b['intra_srcc']:.3f}  "
              f"all {a['all_srcc']:.3f} -> {b['all_srcc']:.3f}  clean {a['clean_mean']:.2f} -> {b['clean_mean']:.2f}")
    for side in ("without", "with"):  # pooled over the held-out images
        means = np.average([nested[h][side]["level_means"] for h in sources], axis=0,
                           weights=[len(by_source[h][0]) for h in sources])
        print(f"mean held-out score by level 0..5, {side}: " + " ".join(f"{m:.2f}" for m in means))
    for side, f in summary.items():
        print(f"held out (nested, photo-weighted fold means), {side:11s}: intra {f['intra_srcc']:.4f} all "
              f"{f['all_srcc']:.4f} clean {f['clean_mean']:.2f} ({f['clean_below_3_5']:.1%} < 3.5)")
    record = {"protocol": __doc__.split("\n\n")[1].strip(),
              "settings": {"hidden": HIDDEN, "epochs": EPOCHS, "learning_rate": LEARNING_RATE,
                           "weight_decay": WEIGHT_DECAY, "batch": BATCH, "seed": SEED},
              "weights": list(WEIGHTS), "offsets": list(OFFSETS), "margin": MARGIN,
              "shipped": {"weight": shipped[0], "offset": shipped[1]},
              "table": {f"{w}/{t}": f for (w, t), f in table.items()}, "nested": nested, "nested_summary": summary}
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    if not args.no_write:
        X, y = training_rows(photos, measured, range(len(photos)), names)
        saved = train(X, y, names)
        saved.update(weight=shipped[0], offset=shipped[1], about={
            "fitted_by": "benchmarks/fit_damage.py", "record": "benchmarks/corpus/damage_choice.json",
            "trained_on": f"{len(photos)} clean photos of {len(sources)} sources and their 'fit'-ladder damage",
            "images": len(y)})
        dm.MODEL_PATH.write_text(json.dumps(saved) + "\n")
        dm.load_model.cache_clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
