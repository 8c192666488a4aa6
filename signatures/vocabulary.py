"""The project's one vocabulary: severities, quality levels and their scores, distortion categories.

Every module that names a severity, turns a level letter into a score (or back) or reads a level
from model text uses these; the categories are iqa_tools' (re-exported here).

Layering: depends on ``iqa_tools.categories`` only.
"""
from __future__ import annotations

import re
from typing import Any

from iqa_tools.categories import DISTORTION_CATEGORIES, CategoryName

__all__ = [
    "DISTORTION_CATEGORIES",
    "CategoryName",
    "SEVERITIES",
    "SEVERITY_RANK",
    "QUALITY_LEVELS",
    "LEVEL_NAMES",
    "LEVEL_SCORES",
    "SCORE_LEVELS",
    "fold",
    "normalize_severity",
    "normalize_level",
]

#: Severity levels of distortion analysis, mildest first (spec 001).
SEVERITIES: tuple[str, ...] = ("none", "slight", "moderate", "severe", "extreme")
#: Severity -> rank, 0 (none) … 4 (extreme).
SEVERITY_RANK: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
#: Scoring levels, best first; A = 5 … E = 1 (DESIGN §5).
QUALITY_LEVELS: tuple[str, ...] = ("A", "B", "C", "D", "E")
LEVEL_NAMES: dict[str, str] = {"A": "Excellent", "B": "Good", "C": "Fair", "D": "Poor", "E": "Bad"}
LEVEL_SCORES: dict[str, int] = {letter: 5 - i for i, letter in enumerate(QUALITY_LEVELS)}
SCORE_LEVELS: dict[int, str] = {v: k for k, v in LEVEL_SCORES.items()}

_SEVERITY_SYNONYMS = {s: s for s in SEVERITIES} | {"mild": "slight", "heavy": "severe"}
_LEVEL_BY_NAME = {name.lower(): letter for letter, name in LEVEL_NAMES.items()}
_LEVEL_TEXT = re.compile(r"([A-Ea-e])(?:[.):]\s*\w*)?")


def fold(text: str) -> str:
    """Lower-case, punctuation and spacing folded: 'Over-Exposure ' -> 'over exposure'."""
    return " ".join(re.sub(r"[\s_\-/]+", " ", text).strip().lower().split())


def normalize_severity(value: Any) -> Any:
    """'Mild' -> 'slight', 'HEAVY' -> 'severe', ' none ' -> 'none'; other values pass to the Literal check."""
    if isinstance(value, str):
        return _SEVERITY_SYNONYMS.get(fold(value), value)
    return value


def normalize_level(value: Any) -> Any:
    """'b', 'B.', 'B. Good', 'Good' -> 'B'; numbers 1..5 -> the letter (A = 5). Others pass through."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and float(value).is_integer():
        return SCORE_LEVELS.get(int(value), value)
    if isinstance(value, str):
        text = value.strip().strip("\"'").strip()
        m = _LEVEL_TEXT.fullmatch(text)
        if m:
            return m.group(1).upper()
        return _LEVEL_BY_NAME.get(text.lower(), value)
    return value
