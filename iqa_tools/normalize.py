"""Map a tool's raw score onto the 1..5 quality scale (DESIGN §4).

With fitted β (paper Table 5) the standard 5-parameter logistic is used:
    q = β1·(0.5 − 1/(1 + exp(β2·(x − β3)))) + β4·x + β5,   clipped to [1, 5].
(The paper prints the formula without the "1 +"; only the standard form gives sane values with its β.)
Without β the tool's score range is mapped linearly onto [1, 5], flipped when lower is better.
"""
from __future__ import annotations

import math
from typing import Literal, Optional, Sequence

Normalization = Literal["logistic", "linear"]


def _inv_one_plus_exp(z: float) -> float:
    """1 / (1 + e^z) without overflow for large |z|."""
    if z >= 0:
        e = math.exp(-z)
        return e / (1.0 + e)
    return 1.0 / (1.0 + math.exp(z))


def logistic5(x: float, beta: Sequence[float]) -> float:
    b1, b2, b3, b4, b5 = beta
    return b1 * (0.5 - _inv_one_plus_exp(b2 * (x - b3))) + b4 * x + b5


def linear(x: float, lo: float, hi: float, lower_better: bool) -> float:
    t = (x - lo) / (hi - lo)
    t = min(1.0, max(0.0, t))
    if lower_better:
        t = 1.0 - t
    return 1.0 + 4.0 * t


def normalize_score(
    raw: float,
    *,
    beta: Optional[Sequence[float]],
    score_range: tuple[float, float],
    lower_better: bool,
) -> tuple[float, Normalization]:
    """(score on [1, 5], which mapping was used). Raises ValueError for NaN/Inf input."""
    x = float(raw)
    if not math.isfinite(x):
        raise ValueError(f"cannot normalize a non-finite score ({x})")
    if beta is not None:
        q, how = logistic5(x, beta), "logistic"
    else:
        q, how = linear(x, score_range[0], score_range[1], lower_better), "linear"
    return min(5.0, max(1.0, q)), how  # type: ignore[return-value]
