"""The spec's seven distortion categories (spec 000, detection prompt): the one definition the whole
project uses. It lives in the lowest layer so that the tool table, the state models, the offline
analyst and the benchmark manifests can all import it."""
from __future__ import annotations

from typing import Literal, get_args

CategoryName = Literal["Blurs", "Color distortions", "Compression", "Noise", "Brightness change", "Sharpness", "Contrast"]
DISTORTION_CATEGORIES: tuple[str, ...] = get_args(CategoryName)

#: What a tool can be good at: the seven categories plus KADID's spatial family (the paper's tool table).
StrengthName = Literal[CategoryName, "Spatial distortions"]
STRENGTHS: tuple[str, ...] = (*DISTORTION_CATEGORIES, "Spatial distortions")
