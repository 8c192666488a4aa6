"""How damaged a photo is overall, whatever the damage: the offline analyst's evidence for putting different kinds
of damage on one scale.

Each detector in ``severity`` grades its own kind of damage, and the analyst's score combines their levels. Held
out, those levels rank the damage within each kind well but do not line up across kinds: a strong darkening or
over-exposure reads as milder than a strong blur of the same benchmark level, and a photo's own dark or pale look
reads as tone damage. This model looks at all the statistics at once. It is a small neural network
(``benchmarks/fit_damage.py``: two hidden layers, trained on the synthetic corpus's clean photos and their damage,
every kind at five levels) that predicts the damage level, 0 (clean) to 5, from the statistics the detectors read
(``stats.measure`` at the analyst's working size), each mapped to a normal score through its training quantiles as
the look model does. Not at the look's smaller size: shrinking a large noisy photo averages its noise away.

The analyst's combined badness blends the detectors' level with this one (``blend``); the weight was chosen
leave-one-source-out. The fitted parameters are data (``damage_model.json``), read with size and shape checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .look import feature_maps, normal_scores, read_fitted_json

MODEL_PATH = Path(__file__).with_name("damage_model.json")


@dataclass(frozen=True)
class DamageModel:
    names: tuple[str, ...]
    maps: tuple                                   # per statistic: its training quantiles and their normal scores
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]  # (weights (in, out), bias (out,)); ReLU between layers
    weight: float                                 # the model's share of the combined badness (``blend``)
    offset: float                                 # the model's level that counts as no damage (``blend``)
    about: dict

    def levels(self, X: np.ndarray) -> np.ndarray:
        """Predicted damage levels for statistics ``X`` (n, len(names)), in ``names`` order (not clipped)."""
        h = normal_scores(np.asarray(X, dtype=np.float64), self.maps)
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        return h[:, 0]

    def level(self, image_stats: dict) -> float:
        """One image's predicted damage level, 0..5 (clipped), from its ``stats.measure`` at the look size."""
        missing = [n for n in self.names if n not in image_stats]
        if missing:
            raise ValueError(f"damage model: statistics missing: {', '.join(missing[:5])}")
        return float(np.clip(self.levels(np.array([[image_stats[n] for n in self.names]]))[0], 0.0, 5.0))


def model_from_dict(d: dict) -> DamageModel:
    """A ``DamageModel`` from its saved form, every array checked for shape and finite values."""
    names = tuple(str(n) for n in d["names"])
    knots, z = np.asarray(d["knots"], dtype=np.float64), np.asarray(d["z"], dtype=np.float64)
    if not names or knots.shape != (len(z), len(names)):
        raise ValueError("damage model: quantiles do not match its statistic names")
    layers, width = [], len(names)
    for layer in d["layers"]:
        w, b = np.asarray(layer["w"], dtype=np.float64), np.asarray(layer["b"], dtype=np.float64)
        if w.ndim != 2 or w.shape[0] != width or b.shape != (w.shape[1],):
            raise ValueError("damage model: layer shapes do not chain")
        layers.append((w, b))
        width = w.shape[1]
    if not layers or width != 1:
        raise ValueError("damage model: the last layer must give one level")
    weight, offset = float(d["weight"]), float(d["offset"])
    arrays = [knots, z] + [a for wb in layers for a in wb]
    if not all(np.isfinite(a).all() for a in arrays) or not (0.0 <= weight <= 1.0 and 0.0 <= offset <= 5.0):
        raise ValueError("damage model: non-finite parameters, a weight outside 0..1 or an offset outside 0..5")
    return DamageModel(names, feature_maps(knots, z), tuple(layers), weight, offset, dict(d.get("about", {})))


@lru_cache(maxsize=4)
def load_model(path: Path = MODEL_PATH) -> DamageModel:
    """The fitted model shipped with the package (read once)."""
    return model_from_dict(read_fitted_json(path, "damage model"))


def blend(detected, level, weight: float, offset: float):
    """The combined badness: the detectors' level (``severity``'s cubic norm) and the model's, ``weight`` its share.
    The model's level counts from ``offset`` up: trained to the mean level, it reads clean photos at about 1 (it
    cannot undershoot 0), and that much is no damage. Works on floats and NumPy arrays alike."""
    return (1.0 - weight) * detected + weight * np.maximum(0.0, level - offset)
