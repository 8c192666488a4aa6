"""The look model: how people would rate a photo overall, from its statistics (``agentic_iqa/offline/look.py``,
fitted by ``benchmarks/fit_look.py`` on BIQ2021's rated Unsplash photos), and its place in the offline NR score."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import skimage.data

from agentic_iqa.offline import look as lk
from agentic_iqa.offline import severity as sv

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

PHOTOS = ("chelsea", "astronaut", "coffee", "rocket")


def _photo(name: str) -> np.ndarray:
    return getattr(skimage.data, name)().astype(np.float32) / 255


def test_the_shipped_model_reads_the_statistics_and_brisque_features():
    model = lk.load_model()
    features = lk.look_features(_photo("chelsea"))
    assert set(model.names) <= set(features)
    assert {f"brisque_{i}" for i in range(36)} <= set(model.names)
    assert 0.0 <= model.predict(features) <= 1.0
    assert model.about["photos"] > 7000 and "BIQ2021" in model.about["trained_on"]


@pytest.mark.parametrize("name", PHOTOS)
def test_a_blurred_photo_looks_worse_than_its_original(name):
    x = _photo(name)
    blurred = cv2.GaussianBlur(x, (0, 0), 4)
    assert lk.predicted_opinion(blurred) < lk.predicted_opinion(x) - 0.1


def test_a_large_photo_is_judged_at_the_look_size():
    x = _photo("astronaut")  # 512 px: the look size itself
    big = cv2.resize(x, None, fx=4, fy=4, interpolation=cv2.INTER_LINEAR)
    assert lk.at_look_size(big).shape[:2] == (512, 512)
    assert lk.look_features(big) == lk.look_features(lk.at_look_size(big))


def test_a_flat_frame_gets_a_prediction_not_an_error():
    assert 0.0 <= lk.predicted_opinion(np.full((300, 400, 3), 0.5, np.float32)) <= 1.0


def _saved() -> dict:
    return json.loads(lk.MODEL_PATH.read_text())


@pytest.mark.parametrize("spoil, message", [
    (lambda d: d.update(weights=d["weights"][:-1]), "do not match"),
    (lambda d: d["knots"][0].__setitem__(0, float("nan")), "non-finite"),
    (lambda d: d.update(combination={"form": "shift_clean", "gain": -1.0, "threshold": 0.5, "reach": 3}), "non-negative"),
    (lambda d: d.update(combination={"form": "shift_clean", "gain": 1.0, "threshold": 0.5, "reach": 0}), "reach above 0"),
    (lambda d: d.update(combination={"form": "exec", "gain": 1.0, "threshold": 0.5, "reach": 3}), "form"),
])
def test_a_spoilt_model_file_is_refused_with_what_is_wrong(tmp_path, spoil, message):
    d = _saved()
    spoil(d)
    path = tmp_path / "look_model.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=message):
        lk.load_model(path)


def test_a_model_file_that_is_too_large_or_missing_is_refused(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (lk._MAX_MODEL_BYTES + 1))
    for path in (big, tmp_path / "missing.json", tmp_path):
        with pytest.raises(ValueError, match="reinstall"):
            lk.load_model(path)


def test_without_a_look_or_overall_damage_level_the_analyses_score_as_before():
    analyses = sv.analyze(_photo("chelsea"))
    looked = sv.analyze(_photo("chelsea"), look=True)
    assert isinstance(looked, sv.Analyses) and looked.look is not None and looked.damage_level is not None
    assert {c: a.level_raw for c, a in analyses.items()} == {c: a.level_raw for c, a in looked.items()}
    looked.look_shift, looked.damage_level = 0.0, None
    assert sv.level_distribution(looked) == sv.level_distribution(analyses)


def test_with_a_reference_the_look_is_not_used():
    x = _photo("chelsea")
    assert sv.analyze(x, cv2.GaussianBlur(x, (0, 0), 1), look=True).look is None


# ── the fitting script's parts ─────────────────────────────────────────────────────────────────────

def test_the_ridge_on_normal_scores_learns_a_monotone_relation_out_of_fold():
    import fit_look

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 4)) * [1, 10, 0.1, 1]
    X[:, 1] = np.exp(X[:, 1] / 10)  # a skewed feature: the quantile map makes it usable
    y = np.tanh(X[:, 0]) + 0.5 * np.log(X[:, 1]) + rng.normal(0, 0.1, 600)
    oof = fit_look.out_of_fold(X, y, np.arange(600), 1e-4)
    assert fit_look.srcc(oof, y) > 0.9
    assert fit_look.srcc(fit_look.out_of_fold(X[:, 2:3], y, np.arange(600), 1e-4), y) < 0.2  # noise predicts nothing


def test_near_duplicate_photos_share_a_fold_group():
    import fit_look

    rng = np.random.default_rng(1)
    t = rng.normal(size=(5, 1024))
    t[3] = t[0] + rng.normal(0, 0.01, 1024)  # a near copy of photo 0
    t = (t - t.mean(axis=1, keepdims=True)) / np.linalg.norm(t - t.mean(axis=1, keepdims=True), axis=1, keepdims=True)
    g = fit_look.duplicate_groups(t)
    assert g[0] == g[3] and len(set(g)) == 4


def test_the_ratings_of_a_folder_that_is_not_biq2021_are_refused(tmp_path):
    import fit_look

    with pytest.raises(SystemExit, match="BIQ2021"):
        fit_look.biq_ratings(tmp_path)


def test_the_choice_script_scores_as_the_product_does(monkeypatch):
    import dataclasses

    import choose_look

    model = dataclasses.replace(lk.load_model(), combination={"gain": 3.0, "threshold": 0.65, "reach": 3.0})
    monkeypatch.setattr(lk, "load_model", lambda path=lk.MODEL_PATH: model)
    x = _photo("coffee")
    rng = np.random.default_rng(0)
    for y in (x, cv2.GaussianBlur(x, (0, 0), 1.5), cv2.GaussianBlur(x, (0, 0), 4), x * 0.3,
              np.clip(x + rng.normal(0, 0.05, x.shape), 0, 1).astype(np.float32)):
        an = sv.analyze(y, look=True)
        cubed = sum(sv._softplus(a.level_raw) ** 3 for a in an.values())
        theirs = choose_look.score(np.array([cubed]), np.array([an.look]), "shift_clean", 3.0, 0.65, 3.0,
                                   levels=np.array([np.nan if an.damage_level is None else an.damage_level]))[0]
        assert sv.expected_level(sv.level_distribution(an)) == pytest.approx(theirs, abs=1e-6)


def test_the_reasoning_says_when_the_look_moved_the_score():
    from agentic_iqa import assess

    retina = assess("example:retina")  # a fundus photo: nothing detected, but it looks like a fair photo to people
    assert "Overall, photos that measure like this one are rated about 3.0 of 5 by people" in retina.result.quality_reasoning
    assert "the score falls by" in retina.result.quality_reasoning and "and the overall look put the expected level" in retina.result.quality_reasoning
    assert retina.score < 4.5
    from agentic_iqa.offline.analyst import LOOK_NOTE_MIN, _look_note

    quiet = sv.Analyses()  # a look that moves the score by less than a note is worth goes unsaid
    quiet.look, quiet.look_shift = 0.74, -(LOOK_NOTE_MIN - 0.01)
    assert _look_note(quiet) == ""
    quiet.look_shift = LOOK_NOTE_MIN + 0.01
    assert "the score rises by 0.06" in _look_note(quiet)
