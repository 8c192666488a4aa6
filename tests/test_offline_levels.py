"""A detector's level: the shrunk map (E[level | score] over damaged and undamaged samples) is kept where
clean photos' false positives live, and gives way to the positives-only map higher up, so a detector whose
evidence overlaps content does not read its own strongest damage as moderate."""
from __future__ import annotations

import numpy as np
import pytest

from agentic_iqa.offline import severity as sv


def _overlapping_fit() -> dict:
    """One feature; damage at levels 1-5 scores its level (plus noise); a third of the undamaged samples
    score like strong damage (content that looks like it, e.g. low-key photos for darken)."""
    rng = np.random.default_rng(0)
    levels = np.repeat(np.arange(1, 6), 40).astype(float)
    pos_x = levels + rng.normal(0, 0.3, levels.size)
    neg_x = np.concatenate([rng.normal(0, 0.3, 200), rng.normal(4.5, 0.5, 100)])
    x = np.concatenate([pos_x, neg_x])[:, None]
    y = np.concatenate([levels, np.zeros(neg_x.size)])
    pos = y > 0
    w = np.where(pos, 0.5 / pos.sum(), 0.5 / (~pos).sum())
    fit = sv.fit_detector(x, y, w)
    fit["features"] = ["reblur"]
    return fit


def _level_at(fit: dict, reblur: float) -> float:
    return sv._detector_level(fit, {"reblur": reblur})


def test_positives_only_map_is_not_pulled_down_by_undamaged_look_alikes():
    fit = _overlapping_fit()
    top_shrunk, top_pos = fit["knots_y"][-1], fit["pos_knots_y"][-1]
    assert top_shrunk < 4.0 < 4.7 < top_pos  # the negatives at high scores drag E[level | score] down
    # A monotone map: knots rise in score, levels never fall (blocks fitted to one level may sit side by side).
    assert np.all(np.diff(fit["pos_knots_y"]) >= 0) and np.all(np.diff(fit["pos_knots_x"]) > 0)
    assert fit["pos_knots_y"][0] < fit["pos_knots_y"][-1]


def test_level_keeps_the_shrunk_map_low_and_the_positives_only_map_high():
    fit = {**_overlapping_fit(), "clean_offset": 0.3}
    shrunk = {**fit}
    shrunk.pop("pos_ramp", None)
    ramped = {**fit, "pos_ramp": [2.0, 3.0]}
    xs = np.linspace(-2, 8, 401)
    a = np.array([_level_at(shrunk, v) for v in xs])
    b = np.array([_level_at(ramped, v) for v in xs])
    assert np.all(np.diff(b) >= -1e-9)  # still monotone in the score: ranking within a detector is kept
    low = a < 2.0
    assert low.any() and np.allclose(a[low], b[low])  # clean photos' range: untouched
    assert np.all(b >= a - 1e-9)
    # Where the shrunk level is past the ramp, the level is the positives-only map's (offset-free: the
    # positives-only map never reads clean photos)
    high = a >= 3.0
    pos = np.array([sv._extrapolated_map(sv._detector_score(fit, {"reblur": v}), fit["pos_knots_x"],
                                         fit["pos_knots_y"]) for v in xs])
    assert high.any() and np.allclose(b[high], np.maximum(pos[high], a[high]))
    # The strongest damage reads near its level instead of "moderate"
    assert _level_at(shrunk, 5.0) < 3.5 < 4.0 < _level_at(ramped, 5.0)


def test_fit_without_negatives_at_high_scores_is_barely_changed():
    """Where nothing undamaged scores like the damage, both maps agree and the blend changes little."""
    rng = np.random.default_rng(1)
    levels = np.repeat(np.arange(1, 6), 40).astype(float)
    x = np.concatenate([levels + rng.normal(0, 0.2, levels.size), rng.normal(-1, 0.2, 200)])[:, None]
    y = np.concatenate([levels, np.zeros(200)])
    w = np.where(y > 0, 0.5 / 200, 0.5 / 200)
    fit = {**sv.fit_detector(x, y, w), "features": ["reblur"], "clean_offset": 0.0}
    for v in (3.0, 4.0, 5.0):
        assert _level_at({**fit, "pos_ramp": [2.0, 3.0]}, v) == pytest.approx(_level_at(fit, v), abs=0.25)


def test_a_verdict_does_not_quote_a_value_on_the_clean_side_as_its_damage():
    # The Moon photo read "Slight JPEG blocking: 8x8 JPEG grid ratio 1.01; clean training photos measure 1.02 to
    # 1.11": the quoted value is less blocky than any clean photo, so the call rests on the other measures.
    det = next(d for d in sv.DETECTORS if d.name == "jpeg")
    fit = sv.load_thresholds()["nr"]["jpeg"]
    lo, _, hi = fit["clean"]
    text = sv._explain(det, "nr", fit, {"jpeg_grid": lo * 0.99}, 1.0)
    assert text.startswith("Slight JPEG blocking suggested by the combined measures;"), text
    assert "itself is below what clean training photos measure" in text and "benchmark damage" not in text, text
    blocky = sv._explain(det, "nr", fit, {"jpeg_grid": fit["by_level"]["3"]}, 3.0)
    assert blocky.startswith("Moderate JPEG blocking: 8x8 JPEG grid ratio") and "benchmark damage" in blocky, blocky
