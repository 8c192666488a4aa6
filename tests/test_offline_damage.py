"""The damage model: how damaged a photo is overall, whatever the damage (``agentic_iqa/offline/damage.py``, fitted
by ``benchmarks/fit_damage.py`` on the synthetic corpus), and its share of the offline NR score."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import skimage.data

from agentic_iqa.offline import damage as dm
from agentic_iqa.offline import look as lk
from agentic_iqa.offline import severity as sv
from agentic_iqa.offline import stats as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _photo(name: str) -> np.ndarray:
    return getattr(skimage.data, name)().astype(np.float32) / 255


def _jpeg(x: np.ndarray, quality: int) -> np.ndarray:
    ok, buf = cv2.imencode(".jpg", (x * 255).round().astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, quality])
    return cv2.imdecode(buf, cv2.IMREAD_UNCHANGED).astype(np.float32) / 255


def _level(x: np.ndarray) -> float:
    return dm.load_model().level(st.measure(st.at_working_size(x)))


def test_the_shipped_model_reads_every_statistic_the_analyst_measures():
    model = dm.load_model()
    assert set(model.names) == set(st.measure(_photo("chelsea")))
    assert 0.0 < model.weight <= 1.0 and 0.0 <= model.offset < 2.0
    assert "fit_damage.py" in model.about["fitted_by"] and model.about["images"] > 30000


@pytest.mark.parametrize("name", ("chelsea", "astronaut", "coffee", "rocket"))
def test_each_kind_of_strong_damage_reads_worse_than_the_clean_photo(name):
    x = _photo(name)
    clean = _level(x)
    rng = np.random.default_rng(0)
    damaged = {
        "blur": cv2.GaussianBlur(x, (0, 0), 3),
        "noise": np.clip(x + rng.normal(0, 0.08, x.shape), 0, 1).astype(np.float32),
        "darkening": (x ** 3.0).astype(np.float32),  # tone damage: the detectors alone under-call it
        "jpeg": _jpeg(x, 8),
    }
    for kind, y in damaged.items():
        assert _level(y) > clean + 1.0, kind


def test_the_levels_of_one_damage_rise_with_its_strength():
    x = _photo("astronaut")
    levels = [_level(cv2.GaussianBlur(x, (0, 0), s)) for s in (0.8, 1.6, 3.2, 6.4)]
    assert levels == sorted(levels) and levels[-1] > levels[0] + 1.5


def test_the_whole_image_without_a_reference_blends_the_model_in_and_nothing_else_does():
    x = cv2.GaussianBlur(_photo("coffee"), (0, 0), 2)
    whole = sv.analyze(x, look=True)
    assert whole.damage_level == pytest.approx(_level(x))
    detected = sv.overall_badness(list(whole.values()))
    model = dm.load_model()
    assert sv.overall_badness(whole) == pytest.approx(
        (1 - model.weight) * detected + model.weight * max(0.0, whole.damage_level - model.offset))
    assert sv.analyze(x).damage_level is None  # a part of the frame, a fitting script
    with_reference = sv.analyze(x, _photo("coffee"), look=True)
    assert with_reference.damage_level is None
    assert sv.overall_badness(with_reference) == sv.overall_badness(list(with_reference.values()))


def test_the_fitting_script_predicts_as_the_product_does():
    import fit_damage

    saved = {k: v for k, v in json.loads(dm.MODEL_PATH.read_text()).items() if k not in ("weight", "offset", "about")}
    images = [_photo("chelsea"), cv2.GaussianBlur(_photo("rocket"), (0, 0), 2), _photo("coffee") ** 2.5]
    stats = [st.measure(y) for y in images]
    theirs = fit_damage.predicted_levels(saved, stats)
    assert theirs == pytest.approx([dm.load_model().level(s) for s in stats], abs=1e-9)
    detected = np.array([sv.overall_badness(sv.analyze_stats(s)) for s in stats])
    model = dm.load_model()
    q = fit_damage.quality(detected, theirs, model.weight, model.offset)
    ours = [sv.quality_from_badness(dm.blend(b, lv, model.weight, model.offset)) for b, lv in zip(detected, theirs)]
    assert q == pytest.approx(ours, abs=1e-12)


def test_training_learns_the_level_from_statistics(monkeypatch):
    import fit_damage

    monkeypatch.setattr(fit_damage, "EPOCHS", 30)
    rng = np.random.default_rng(1)
    names = ["a", "b", "c"]
    y = rng.integers(0, 6, 600).astype(float)
    X = np.column_stack([y + rng.normal(0, 0.3, 600), rng.normal(size=600), -2 * y + rng.normal(0, 0.5, 600)])
    saved = fit_damage.train(X, y, names)
    model = dm.model_from_dict({**saved, "weight": 0.5, "offset": 0.5})
    from scipy.stats import spearmanr

    assert spearmanr(model.levels(X), y)[0] > 0.9
    assert model.level({"a": 5.0, "b": 0.0, "c": -10.0}) > model.level({"a": 0.0, "b": 0.0, "c": 0.0}) + 2


def _saved() -> dict:
    return json.loads(dm.MODEL_PATH.read_text())


@pytest.mark.parametrize("spoil, message", [
    (lambda d: d["layers"][0].update(b=d["layers"][0]["b"][:-1]), "do not chain"),
    (lambda d: d["layers"].pop(), "one level"),
    (lambda d: d["knots"][0].__setitem__(0, float("nan")), "non-finite"),
    (lambda d: d.update(weight=1.5), "weight outside"),
    (lambda d: d.update(offset=-1), "offset outside"),
    (lambda d: d.update(names=d["names"][:-1]), "do not match"),
])
def test_a_spoilt_model_file_is_refused_with_what_is_wrong(tmp_path, spoil, message):
    d = _saved()
    spoil(d)
    f = tmp_path / "damage_model.json"
    f.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=message):
        dm.load_model(f)


def test_a_missing_or_oversized_model_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="reinstall"):
        dm.load_model(tmp_path / "absent.json")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (lk._MAX_MODEL_BYTES + 1))  # the cap every fitted-parameters file shares
    with pytest.raises(ValueError, match="reinstall"):
        dm.load_model(big)


def test_statistics_missing_from_an_image_are_named():
    with pytest.raises(ValueError, match="statistics missing"):
        dm.load_model().level({"lap_var": 1.0})


def test_the_reasoning_says_when_the_overall_damage_level_moved_the_score():
    from agentic_iqa import assess

    x = (_photo("astronaut") ** 3.4 * 255).astype(np.uint8)  # darkened: the detectors alone under-call it
    answer = assess(x)
    reasoning = answer.result.quality_reasoning
    assert "All its statistics together read like damage of level" in reasoning and "the score falls by" in reasoning
    assert "Measured severities and the overall damage level" in reasoning or "the overall damage level and" in reasoning
    assert answer.score < 3.5
