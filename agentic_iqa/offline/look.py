"""How good a photo looks overall to people, predicted from its statistics: the offline analyst's evidence for
authentic damage that no distortion detector names (a phone's muddy detail, a dim indoor shot, soft focus that
is not a clean blur).

The detectors in ``severity`` are fitted on synthetic damage of clean photos; on photos with authentic damage
they often find nothing, and the score of a photo with nothing detected says little about how people rate it.
This model is fitted on human ratings of authentic photos instead (``benchmarks/fit_look.py``: BIQ2021's
8,000 Unsplash photos with their lab mean opinion scores): a ridge regression over the analyst's own
statistics (``stats.measure``) and BRISQUE's 36 natural-scene features, each mapped to a normal score through
its quantiles on the training photos. It predicts a mean opinion score on BIQ2021's 0–1 scale (0 very bad,
1 excellent).

Every photo is measured at the size the training photos had (long side ``LOOK_SIDE``; smaller photos as they
are), so the prediction does not drift with resolution. The fitted parameters are data (``look_model.json``),
read with size and shape checks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np

from . import stats as st

LOOK_SIDE = 512
MODEL_PATH = Path(__file__).with_name("look_model.json")
_MAX_MODEL_BYTES = 1 << 20
FORM = "shift_clean"  # how the look is combined with the analyst's score (``look_shift``)


def at_look_size(x: np.ndarray) -> np.ndarray:
    """`x` (float RGB in [0, 1]) with its long side at most ``LOOK_SIDE``, area-averaged."""
    h, w = x.shape[:2]
    s = LOOK_SIDE / max(h, w)
    if s >= 1:
        return x
    return cv2.resize(x, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)


def brisque_look_features(image: st.ImageLike) -> dict[str, float]:
    """BRISQUE's 36 features (``brisque_0``…``brisque_35``) at the look size."""
    from iqa_tools.nss import brisque_features

    x = at_look_size(st.as_float_rgb(image))
    with np.errstate(divide="ignore", invalid="ignore"):  # a flat image: NaN features, mapped to the median below
        f = brisque_features(st.in_8bit_steps(x))
    return {f"brisque_{i}": float(v) for i, v in enumerate(f)}


def look_features(image: st.ImageLike, image_stats: dict | None = None) -> dict[str, float]:
    """The model's inputs for one image: ``stats.measure`` and BRISQUE's features, both at the look size.
    ``image_stats``: the image's ``stats.measure`` when it was already measured at that size (an image no larger
    than the look size is measured at its own size by the analyst too)."""
    x = at_look_size(st.as_float_rgb(image))
    s = dict(image_stats) if image_stats is not None else st.measure(x)
    return {**s, **brisque_look_features(x)}


@dataclass(frozen=True)
class LookModel:
    names: tuple[str, ...]
    knots: np.ndarray      # (k, n): each feature's training quantiles, ascending
    z: np.ndarray          # (k,): the normal scores of those quantiles
    weights: np.ndarray    # (n,)
    intercept: float
    about: dict
    combination: dict      # {"gain", "threshold", "reach"}: how the look moves the analyst's score (``look_shift``)
    maps: tuple            # per feature: (its distinct knots, their normal scores), for ``predict``

    def predict(self, features: dict[str, float]) -> float:
        """Predicted mean opinion score, 0..1 (clipped; the regression itself is unbounded)."""
        missing = [n for n in self.names if n not in features]
        if missing:
            raise ValueError(f"look model: features missing: {', '.join(missing[:5])}")
        zs = normal_scores(np.array([[features[n] for n in self.names]], dtype=np.float64), self.maps)[0]
        return float(np.clip(zs @ self.weights + self.intercept, 0.0, 1.0))


def quantile_knots(X: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fitting side of ``feature_maps``: each feature's (column of ``X``; NaN left out) quantiles at ``levels``,
    and the normal scores of those levels."""
    from scipy.special import ndtri

    return np.nanquantile(X, levels, axis=0), ndtri(levels)


def feature_maps(knots: np.ndarray, z: np.ndarray) -> tuple:
    """Per feature (column of ``knots``): its distinct training quantiles and their normal scores."""
    return tuple((u, z[first]) for u, first in (np.unique(knots[:, j], return_index=True) for j in range(knots.shape[1])))


def normal_scores(X: np.ndarray, maps: tuple) -> np.ndarray:
    """Features (n, k) mapped to normal scores through ``feature_maps``; an undefined value (a flat image) or a feature
    constant in training counts as typical (0). The fit (``benchmarks/fit_look.py``) and ``predict`` both use it."""
    out = np.zeros(X.shape)
    for j, (u, zq) in enumerate(maps):
        if len(u) > 1:
            out[:, j] = np.interp(X[:, j], u, zq)
    return np.where(np.isfinite(X), out, 0.0)


def model_from_dict(d: dict) -> LookModel:
    """A ``LookModel`` from its saved form, every array checked for shape and finite values."""
    names = tuple(str(n) for n in d["names"])
    knots = np.asarray(d["knots"], dtype=np.float64)
    z = np.asarray(d["z"], dtype=np.float64)
    w = np.asarray(d["weights"], dtype=np.float64)
    if not names or knots.shape != (len(z), len(names)) or w.shape != (len(names),):
        raise ValueError("look model: arrays do not match its feature names")
    if not (np.isfinite(knots).all() and np.isfinite(z).all() and np.isfinite(w).all()):
        raise ValueError("look model: non-finite parameters")
    comb = d.get("combination", {"form": FORM, "gain": 0.0, "threshold": 0.0, "reach": 1.0})
    if comb.get("form") != FORM:
        raise ValueError(f"look model: combination form {comb.get('form')!r} is not {FORM!r}, the one this version applies")
    combination = {k: float(comb[k]) for k in ("gain", "threshold", "reach")}
    if not all(np.isfinite(v) and v >= 0 for v in combination.values()) or combination["reach"] == 0:
        raise ValueError("look model: combination gain, threshold and reach must be finite and non-negative "
                         "(reach above 0)")
    return LookModel(names, knots, z, w, float(d["intercept"]), dict(d.get("about", {})), combination,
                     feature_maps(knots, z))


def read_fitted_json(path: Path, label: str) -> dict:
    """A fitted-parameters file shipped with the package (``iqa_tools.files.read_regular_file``: a regular file, at
    most ``_MAX_MODEL_BYTES``), parsed; refusals name ``label`` and say to reinstall."""
    from iqa_tools.files import read_regular_file

    try:
        return json.loads(read_regular_file(path, f"{label} {path}", _MAX_MODEL_BYTES, "a model file"))
    except ValueError as exc:
        raise ValueError(f"{exc}; reinstall agentic-iqa") from None


@lru_cache(maxsize=4)
def load_model(path: Path = MODEL_PATH) -> LookModel:
    """The fitted model shipped with the package (read once)."""
    return model_from_dict(read_fitted_json(path, "look model"))


def look_shift(opinion: float, badness: float, model: LookModel | None = None) -> float:
    """Points of quality (on 1..5) the photo's look adds to the analyst's score, or takes from it:
    ``gain · (opinion − threshold)``, fading out as the detected damage grows (gone at ``reach`` levels of combined
    badness: where the detectors measure damage, they rank it better than the look does). The combination is in the
    model file, chosen by ``benchmarks/choose_look.py``; gain 0 leaves the analyst's score as it is."""
    c = (model or load_model()).combination
    if c["gain"] == 0.0:
        return 0.0
    fade = max(0.0, 1.0 - badness / c["reach"])
    return c["gain"] * (opinion - c["threshold"]) * fade


def predicted_opinion(image: st.ImageLike, image_stats: dict | None = None) -> float:
    """How people would rate the photo, 0..1 (BIQ2021's scale), from ``look_features``."""
    return load_model().predict(look_features(image, image_stats))
