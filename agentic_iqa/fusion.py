"""Score fusion: tool scores and the VLM's level probabilities into one 1–5 score (spec 004, DESIGN §5).

    q̄   = mean of the (valid) normalized tool scores
    α_c = softmax_c(−η (q̄ − c)²),                  c = 1..5   (perceptual weights)
    p_c = the VLM's probability of level c           (A = 5 … E = 1)
    q   = Σ_c c · α_c · p_c / Σ_c α_c · p_c

The spec prints q = Σ α_c p_c c, which with uniform p gives q̄/5; DESIGN §5 explains why the
normalized form is the paper's intent (it reproduces the paper's own example). With no tool scores α is
uniform, so q = Σ c · p_c (the VLM alone); with no VLM probabilities p is uniform, so q follows α alone.

Where p comes from (`prob_mode`):
- "logits" (default): softmax of the log-probabilities of the five level letters read from the LM's
  tokens (signatures.logprobs). None available -> the classification fallback, recorded.
- "classification": 0.7 on the level the VLM chose, 0.075 on each other level.
- "uniform": 0.2 each (ablation).
- "analyst": a distribution supplied from outside (the offline analyst), with a note on its source.
Each mode falls back to the next weaker source when its input is missing or invalid, down to uniform;
`FusionResult.prob_mode_used` says what was actually used.

Uses numpy, pydantic and logging only; no DSPy.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, Field

from signatures.vocabulary import LEVEL_SCORES, SCORE_LEVELS

__all__ = [
    "LEVELS",
    "LETTER_TO_LEVEL",
    "LEVEL_TO_LETTER",
    "PROB_MODES",
    "FusionResult",
    "ProbExtraction",
    "ScoreFusion",
    "fused_scores",
    "level_letter",
    "stable_softmax",
]

logger = logging.getLogger("agentic_iqa.fusion")

LEVELS = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
LETTER_TO_LEVEL = LEVEL_SCORES  # signatures.vocabulary: A = 5 … E = 1
LEVEL_TO_LETTER = SCORE_LEVELS
_LOGPROB_ROUNDING = 1e-3  # providers round: a log-prob of +0.0001 is a certainty, not an error
PROB_MODES = ("logits", "classification", "uniform", "analyst")
ProbMode = Literal["logits", "classification", "uniform", "analyst"]

_CLASSIFICATION_HIT = 0.7
_CLASSIFICATION_MISS = 0.075  # (1 - 0.7) / 4
_TOOL_SCORE_RANGE = (0.0, 6.0)  # spec 004: slightly wider than 1..5 so near-misses are not discarded
_PROB_SUM_TOLERANCE = 0.01
_ALPHA_SUM_TOLERANCE = 0.001
#: Log-probability used for a level missing from a partial log-prob dict (same as signatures.logprobs).
MISSING_LOGPROB = -100.0

LevelKey = Union[int, str]


def stable_softmax(x: np.ndarray) -> np.ndarray:
    """softmax with the maximum subtracted first, so large exponents cannot overflow."""
    x = np.asarray(x, dtype=np.float64)
    shifted = x - np.max(x)
    e = np.exp(shifted)
    return e / e.sum()


def fused_scores(qbar: np.ndarray, p: np.ndarray, eta: float) -> np.ndarray:
    """`ScoreFusion.fuse`'s q for many images at once, for parameter searches (benchmarks/choose_fusion.py):
    qbar (n,) mean normalized tool score per image (NaN: no tool scores, α uniform), p (n, 5) level
    probabilities (rows summing to 1). Same formula, weighted in log space like `fuse`; no validation,
    fallbacks or logging. Clipped to [1, 5] as `fuse` does."""
    qbar = np.asarray(qbar, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != 5 or qbar.shape != (p.shape[0],):
        raise ValueError(f"fused_scores wants qbar (n,) and p (n, 5), got {qbar.shape} and {p.shape}")
    log_alpha = -float(eta) * (qbar[:, None] - LEVELS[None, :]) ** 2
    log_alpha = np.where(np.isnan(log_alpha), 0.0, log_alpha)  # no tool scores: uniform α
    with np.errstate(divide="ignore"):
        log_w = log_alpha + np.log(p)
    log_w -= log_w.max(axis=1, keepdims=True)
    w = np.exp(log_w)
    return np.clip((w * LEVELS).sum(axis=1) / w.sum(axis=1), 1.0, 5.0)


def level_letter(score: float) -> str:
    """The letter of the level nearest to `score` (half rounds up: 2.5 -> 3 -> "C")."""
    level = int(math.floor(score + 0.5))
    return LEVEL_TO_LETTER[min(5, max(1, level))]


def _level_of(key: LevelKey) -> int:
    """1..5 from 1..5, "1".."5", or a letter "A".."E" (A = 5); ValueError otherwise."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool) and 1 <= int(key) <= 5:
        return int(key)
    if isinstance(key, str):
        k = key.strip().upper()
        if k in LETTER_TO_LEVEL:
            return LETTER_TO_LEVEL[k]
        if k in {"1", "2", "3", "4", "5"}:
            return int(k)
    raise ValueError(f"{key!r} is not a quality level (1..5 or A..E)")


def _fmt(values: Iterable[float], digits: int = 3) -> str:
    return "{" + ", ".join(f"{c}: {v:.{digits}f}" for c, v in zip(range(1, 6), values)) + "}"


class ProbExtraction(BaseModel):
    """The VLM's level distribution as the fusion will use it, and how it was obtained."""

    p: list[float]  # p_1 … p_5 (index 0 is level 1 = E)
    mode_requested: ProbMode
    mode_used: ProbMode
    note: str
    warnings: list[str] = Field(default_factory=list)


class FusionResult(BaseModel):
    """Everything the fusion computed, so a score can be explained without re-running it."""

    score: float  # q in [1, 5]
    level: Literal["A", "B", "C", "D", "E"]  # letter of round(q), A = 5
    level_value: int  # round(q), 1..5
    qbar: Optional[float]  # mean valid tool score; None without tool scores
    alpha: list[float]  # α_1 … α_5 (uniform when there were no tool scores)
    p: list[float]  # p_1 … p_5
    contributions: list[float]  # c · α_c · p_c / Σ α·p, summing to q
    tool_scores: list[float]  # the scores used
    rejected_tool_scores: list[float] = Field(default_factory=list)
    prob_mode_requested: ProbMode
    prob_mode_used: ProbMode
    prob_note: str
    need_replan: bool = False
    fallback: bool = False  # True when the score is the failure fallback, not a fusion
    warnings: list[str] = Field(default_factory=list)

    def probabilities(self) -> dict[str, float]:
        """p as SummarizerOutput.probabilities wants it: {"1": p_1, …, "5": p_5}."""
        return {str(c): float(v) for c, v in zip(range(1, 6), self.p)}


class _FusionFailure(ValueError):
    pass


class ScoreFusion:
    """Fuse normalized tool scores with the VLM's level probabilities (spec 004 with DESIGN §5's formula)."""

    def __init__(self, eta: float = 1.0, prob_mode: ProbMode = "logits") -> None:
        if not (isinstance(eta, (int, float)) and math.isfinite(eta) and eta >= 0):
            raise ValueError(f"eta must be a finite number >= 0, got {eta!r}")
        self.eta = float(eta)
        self.prob_mode = self._check_mode(prob_mode)

    @staticmethod
    def _check_mode(mode: str) -> ProbMode:
        if mode not in PROB_MODES:
            raise ValueError(f"prob_mode must be one of {PROB_MODES}, got {mode!r}")
        return mode  # type: ignore[return-value]

    # ── perceptual weights ──────────────────────────────────────────────────────────────────────

    def perceptual_weights(self, qbar: float) -> np.ndarray:
        """α_c = exp(−η(q̄−c)²) / Σ_j exp(−η(q̄−j)²), computed as a max-shifted softmax."""
        alpha = stable_softmax(-self.eta * (qbar - LEVELS) ** 2)
        if abs(alpha.sum() - 1.0) > _ALPHA_SUM_TOLERANCE:  # pragma: no cover - softmax guarantees it
            raise _FusionFailure(f"perceptual weights sum to {alpha.sum()}, not 1")
        return alpha

    # ── VLM probabilities ───────────────────────────────────────────────────────────────────────

    def extract_vlm_probs(
        self,
        *,
        level_logprobs: Optional[Mapping[LevelKey, float]] = None,
        level: Optional[LevelKey] = None,
        probabilities: Optional[Mapping[LevelKey, float]] = None,
        prob_mode: Optional[ProbMode] = None,
        prob_note: Optional[str] = None,
    ) -> ProbExtraction:
        """p_1..p_5 for the requested mode, falling back (and saying so) when its input is unusable.

        level_logprobs: log-probabilities per level (keys 1..5, "1".."5" or letters), e.g. from
            signatures.logprobs.level_logprobs; levels missing from it get MISSING_LOGPROB.
        level: the level the VLM chose (letter or 1..5), for the classification mode and fallback.
        probabilities: an external distribution over levels (mode "analyst").
        """
        requested = self._check_mode(prob_mode or self.prob_mode)
        warnings: list[str] = []

        def warn(message: str) -> None:
            logger.warning(message)
            warnings.append(message)

        if requested == "uniform":
            return ProbExtraction(p=[0.2] * 5, mode_requested=requested, mode_used="uniform",
                                  note="uniform distribution requested", warnings=warnings)

        if requested == "analyst":
            if probabilities is None:
                warn("No VLM probabilities, using fallback (analyst mode without a distribution)")
            else:
                try:
                    p = self._validate_probabilities(probabilities, warn)
                    return ProbExtraction(p=list(p), mode_requested=requested, mode_used="analyst",
                                          note=prob_note or "distribution supplied by the analyst", warnings=warnings)
                except ValueError as exc:
                    warn(f"Analyst probabilities rejected ({exc}); using fallback")

        if requested == "logits":
            if level_logprobs is None:
                warn("No VLM probabilities, using fallback (the provider returned no log-probs)")
            else:
                try:
                    p = self._softmax_logprobs(level_logprobs, warn)
                    note = prob_note or "softmax of the level letters' token log-probabilities"
                    return ProbExtraction(p=list(p), mode_requested=requested, mode_used="logits",
                                          note=note, warnings=warnings)
                except ValueError as exc:
                    warn(f"Level log-probabilities rejected ({exc}); using fallback")

        if level is not None:
            try:
                chosen = _level_of(level)
            except ValueError as exc:
                warn(f"Unusable VLM level ({exc})")
            else:
                if requested != "classification":
                    warn("Using classification fallback with smoothing")
                p = np.full(5, _CLASSIFICATION_MISS)
                p[chosen - 1] = _CLASSIFICATION_HIT
                return ProbExtraction(
                    p=list(p), mode_requested=requested, mode_used="classification",
                    note=f"level {LEVEL_TO_LETTER[chosen]} chosen by the VLM, smoothed 0.7/0.075", warnings=warnings,
                )
        warn("No VLM probabilities, using uniform distribution")
        return ProbExtraction(p=[0.2] * 5, mode_requested=requested, mode_used="uniform",
                              note="no usable VLM output; uniform distribution", warnings=warnings)

    @staticmethod
    def _by_level(values: Mapping[LevelKey, float], what: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for key, value in values.items():
            level = _level_of(key)
            if level in out:
                raise ValueError(f"{what} gives level {level} twice")
            try:
                out[level] = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{what} for level {level} is not a number: {value!r}") from None
        return out

    def _softmax_logprobs(self, level_logprobs: Mapping[LevelKey, float], warn) -> np.ndarray:
        by_level = self._by_level(level_logprobs, "log-probability")
        if not by_level:
            raise ValueError("no levels in the log-probabilities")
        bad = {c: v for c, v in by_level.items() if math.isnan(v) or v == math.inf}
        if bad:
            raise ValueError(f"non-finite log-probabilities {bad}")
        positive = {c: v for c, v in by_level.items() if v > _LOGPROB_ROUNDING}
        if positive:  # a log-probability is ≤ 0; +1e308 is a broken server, not a certainty
            raise ValueError(f"log-probabilities above 0 {positive}")
        missing = [c for c in range(1, 6) if c not in by_level]
        if missing:
            warn(f"Log-probabilities missing for levels {missing}; set to {MISSING_LOGPROB:g}")
        logp = np.array([by_level.get(c, MISSING_LOGPROB) for c in range(1, 6)])
        if np.isneginf(logp).any():
            if np.isneginf(logp).all():
                raise ValueError("every level has log-probability -inf")
            warn("Numerical instability detected, applied stabilization (-inf log-probabilities)")
            logp = np.where(np.isneginf(logp), MISSING_LOGPROB, logp)
        p = stable_softmax(logp)
        if abs(p.sum() - 1.0) > _PROB_SUM_TOLERANCE:  # pragma: no cover - softmax guarantees it
            raise ValueError(f"probabilities sum to {p.sum()}")
        return p

    def _validate_probabilities(self, probabilities: Mapping[LevelKey, float], warn) -> np.ndarray:
        by_level = self._by_level(probabilities, "probability")
        p = np.array([by_level.get(c, 0.0) for c in range(1, 6)])
        if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
            raise ValueError(f"probabilities must be finite and in [0, 1], got {_fmt(p)}")
        total = p.sum()
        if total <= 0:
            raise ValueError("probabilities sum to 0")
        if abs(total - 1.0) > _PROB_SUM_TOLERANCE:
            warn(f"VLM probabilities sum to {total:.4f}, renormalized")
            p = p / total
        return p

    # ── fusion ──────────────────────────────────────────────────────────────────────────────────

    def fuse(
        self,
        tool_scores: Optional[Iterable[float]],
        *,
        level_logprobs: Optional[Mapping[LevelKey, float]] = None,
        level: Optional[LevelKey] = None,
        probabilities: Optional[Mapping[LevelKey, float]] = None,
        prob_mode: Optional[ProbMode] = None,
        prob_note: Optional[str] = None,
    ) -> FusionResult:
        """Fuse; never raises for bad data. On failure the score is mean(valid tool scores) or 3.0,
        `fallback` and `need_replan` are True, and the reason is in `warnings` (and logged at ERROR).

        `prob_mode` overrides the instance's mode for this call.
        """
        requested = self._check_mode(prob_mode or self.prob_mode)
        logger.info("Fusion prob_mode: %s%s", requested, " (per-call override)" if prob_mode else "")
        raw = [] if tool_scores is None else list(tool_scores)
        warnings: list[str] = []
        valid, rejected = self._validate_tool_scores(raw, warnings)
        extraction = self.extract_vlm_probs(
            level_logprobs=level_logprobs, level=level, probabilities=probabilities,
            prob_mode=requested, prob_note=prob_note,
        )
        warnings.extend(extraction.warnings)
        p = np.array(extraction.p)

        common = dict(
            p=list(p), tool_scores=valid, rejected_tool_scores=rejected, prob_mode_requested=requested,
            prob_mode_used=extraction.mode_used, prob_note=extraction.note,
        )
        try:
            if raw and not valid:
                raise _FusionFailure(f"all {len(raw)} tool scores are invalid: {raw}")
            logger.info("Tool scores: %s", [round(s, 4) for s in valid])
            logger.info("Tool score count: %d", len(valid))
            source = "Offline analyst's level distribution" if extraction.mode_used == "analyst" else "VLM probabilities"
            logger.info("%s: %s (%s)", source, _fmt(p), extraction.mode_used)
            if valid:
                qbar: Optional[float] = float(np.mean(valid))
                logger.info("Tool score mean: %.2f", qbar)
                alpha = self.perceptual_weights(qbar)
            else:
                qbar = None
                message = "No tool scores, using uniform α weights"
                logger.warning(message)
                warnings.append(message)
                alpha = np.full(5, 0.2)
            entropy = float(-np.sum(alpha * np.log(np.clip(alpha, 1e-300, None))))
            logger.info("Perceptual weights: %s; peak level %d; entropy %.3f",
                        _fmt(alpha), int(np.argmax(alpha)) + 1, entropy)

            # Weighted in log space: α_c·p_c can underflow for far-apart q̄ and p, their ratio cannot.
            with np.errstate(divide="ignore"):
                log_w = np.log(alpha) + np.log(p)
            if not np.isfinite(log_w).any():
                raise _FusionFailure("α·p is zero for every level (the tools and the VLM exclude each other)")
            weights = stable_softmax(log_w)
            contributions = LEVELS * weights
            q = float(contributions.sum())
            if not math.isfinite(q):  # pragma: no cover - a convex combination of 1..5 is finite
                raise _FusionFailure(f"fused score is {q}")
        except _FusionFailure as exc:
            return self._failure(str(exc), valid, warnings, common)

        if not 1.0 <= q <= 5.0:
            clipped = min(5.0, max(1.0, q))
            logger.error("Fusion score %.3f out of range, clipped to %.3f", q, clipped)
            message = f"Score {q} clipped to [1.0, 5.0]"
            logger.warning(message)
            warnings.append(message)
            q = clipped
        letter = level_letter(q)
        logger.info("Final score: %.2f", q)
        logger.info("Discrete level: %d (%s)", LETTER_TO_LEVEL[letter], letter)
        logger.info("Contribution breakdown (c·α_c·p_c / Σα·p): %s", _fmt(contributions, 4))
        return FusionResult(
            score=q, level=letter, level_value=LETTER_TO_LEVEL[letter], qbar=qbar, alpha=list(alpha),
            contributions=list(contributions), warnings=warnings, **common,
        )

    @staticmethod
    def _validate_tool_scores(raw: list, warnings: list[str]) -> tuple[list[float], list[float]]:
        valid: list[float] = []
        rejected: list[float] = []
        lo, hi = _TOOL_SCORE_RANGE
        for s in raw:
            try:
                v = float(s)
            except (TypeError, ValueError):
                v = math.nan
            if math.isfinite(v) and lo <= v <= hi:
                valid.append(v)
            else:
                rejected.append(v)
        if rejected:
            message = f"Invalid tool scores filtered out (not finite or outside [{lo:g}, {hi:g}]): {rejected}"
            logger.error(message)
            warnings.append(message)
        return valid, rejected

    @staticmethod
    def _failure(reason: str, valid: list[float], warnings: list[str], common: dict) -> FusionResult:
        score = float(np.mean(valid)) if valid else 3.0
        score = min(5.0, max(1.0, score))
        message = (
            f"Fusion failed: {reason}; fallback score {score:.3f} "
            f"({'mean of tool scores' if valid else 'neutral 3.0'}), replan requested"
        )
        logger.error(message)
        letter = level_letter(score)
        return FusionResult(
            score=score, level=letter, level_value=LETTER_TO_LEVEL[letter],
            qbar=float(np.mean(valid)) if valid else None, alpha=[0.2] * 5, contributions=[0.0] * 5,
            need_replan=True, fallback=True, warnings=[*warnings, message], **common,
        )
