"""The synthetic benchmark generator: deterministic, valid manifests, distortions that grow with level."""
from __future__ import annotations

import hashlib
import json

import cv2
import numpy as np
import pytest

from agentic_iqa.bench.manifest import read_manifest
from iqa_tools.categories import DISTORTION_CATEGORIES
from agentic_iqa.bench import synth
from agentic_iqa.bench.synth import REFERENCES, TEST_REFS, TYPES, distort, load_reference, make_benchmark


def _digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    manifest = make_benchmark(out, seed=3, refs=["coins", "chelsea"],
                              types=["jpeg", "white noise", "color saturation 1", "darken"], workers=1)
    return out, manifest


def test_same_seed_same_bytes_other_seed_other_noise(small, tmp_path):
    out, _ = small
    again = make_benchmark(tmp_path / "again", seed=3, refs=["coins", "chelsea"],
                           types=["jpeg", "white noise", "color saturation 1", "darken"], workers=2)
    assert _digest(out) == _digest(again.parent)
    other = make_benchmark(tmp_path / "other", seed=4, refs=["coins"], types=["white noise"], workers=1)
    name = "images/coins/coins__white-noise__L3.png"
    assert (other.parent / name).read_bytes() != (out / name).read_bytes()


def test_manifest_rows_and_files(small):
    out, manifest = small
    rows, problems = read_manifest(manifest)
    assert problems == []
    plain = [r for r in rows if r.question is None]
    # colour saturation needs colour: applied to chelsea only, not to the gray coins
    assert len(plain) == 2 * 3 * 5 + 1 * 5
    assert not any(r.source == "coins" and r.type == "color saturation 1" for r in rows)
    assert {r.split for r in plain if r.source == "coins"} == {"test"} and "coins" in TEST_REFS
    assert {r.split for r in plain if r.source == "chelsea"} == {"train"}
    jpeg = next(r for r in plain if r.type == "jpeg" and r.level == 5)
    assert jpeg.image_path.suffix == ".jpg" and jpeg.image_path.read_bytes()[:2] == b"\xff\xd8"
    assert jpeg.reference_path.is_file() and jpeg.category == "Compression"
    meta = json.loads((out / "benchmark.json").read_text())
    assert meta["seed"] == 3 and meta["types"]["jpeg"]["params"] == [43, 36, 24, 7, 4]


def test_mcq_rows_ask_for_the_applied_category(small):
    rows, _ = read_manifest(small[1])
    mcq = [r for r in rows if r.question is not None]
    assert len(mcq) == 7  # one per (reference, type) pair
    for r in mcq:
        assert r.level >= 3 and len(r.options) == 4
        assert r.options[r.answer] == r.category
        assert set(r.options.values()) <= set(DISTORTION_CATEGORIES)
        assert all(f"{k}. {v}" in r.question for k, v in r.options.items())


def test_references_are_benchmark_sized_and_types_span_all_categories():
    img = load_reference("coins")
    assert img.shape == (384, 512, 3) and img.dtype == np.float32
    assert np.allclose(img[..., 0], img[..., 2])  # gray sample converted to RGB
    assert {t.category for t in TYPES.values()} >= set(DISTORTION_CATEGORIES)
    assert len(TYPES) >= 10 and all(len(t.params) == 5 for t in TYPES.values())
    assert set(TEST_REFS) < set(REFERENCES)


@pytest.mark.parametrize("type_name", ["gaussian blur", "lens blur", "white noise", "darken", "contrast decrease",
                                       "color quantization", "jpeg2000", "overexposure", "luminance noise",
                                       "gray impulse noise"])
def test_damage_grows_with_level(type_name):
    ref = load_reference("camera", size=(256, 192))  # smaller, and JPEG2000 bottoms out
    err = [float(np.abs(distort(ref, type_name, lv, key="t") - ref).mean()) for lv in range(1, 6)]
    assert all(a < b for a, b in zip(err, err[1:])), err


def test_colourless_noise_types_add_no_colour():
    # KADID's white and impulse noise are drawn per RGB channel, so coloured; these two are grain and specks with
    # none (a camera's processed grain, a gray scan's dust), which the analyst's noise detectors missed until fitted on.
    gray = load_reference("camera", size=(256, 192))
    for name in ("luminance noise", "gray impulse noise"):
        y = distort(gray, name, 5, key="t")
        assert np.abs(y - gray).mean() > 0.02 and np.allclose(y[..., 0], y[..., 1], atol=1e-4), name
        assert np.allclose(y[..., 0], y[..., 2], atol=1e-4), name
    specks = distort(gray, "gray impulse noise", 5, key="t")
    hit = np.abs(specks - gray).max(axis=2) > 1e-6
    assert set(np.unique(specks[hit])) <= {0.0, 1.0} and 0.05 < hit.mean() < 0.09
    cat = load_reference("chelsea", size=(256, 192))  # in colour, the grain leaves the chroma where it was
    grain = distort(cat, "luminance noise", 5, key="t")
    inside = ((grain > 0) & (grain < 1)).all(axis=2)  # where no channel left the range (a file would clip it)
    chroma = lambda x: cv2.cvtColor(x, cv2.COLOR_RGB2YCrCb)[..., 1:][inside]  # noqa: E731
    luma = lambda x: cv2.cvtColor(x, cv2.COLOR_RGB2YCrCb)[..., 0][inside]  # noqa: E731
    assert np.abs(chroma(grain) - chroma(cat)).max() < 2e-3 and np.std(luma(grain) - luma(cat)) > 0.07


def test_unknown_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown"):
        make_benchmark(tmp_path, types=["no such type"])
    with pytest.raises(ValueError, match="unknown"):
        make_benchmark(tmp_path, refs=["moon"])


def test_overexposure_clips_highlights_as_a_gamma_does_not():
    # A camera's +2 EV blows a bright photo's highlights out to white; the tone-curve brighten at its level 5 lifts
    # the shadows instead (the difference the NR over-exposure detectors rely on).
    ref = load_reference("astronaut", size=(256, 192))
    gain, gamma = distort(ref, "overexposure", 5, key="t"), distort(ref, "brighten", 5, key="t")
    assert np.allclose(synth.over_exposure(ref, 0.0, None), ref, atol=1e-5)  # 0 EV changes nothing
    white = [float((distort(ref, "overexposure", lv, key="t") >= 254.5 / 255).all(axis=2).mean()) for lv in range(1, 6)]
    assert all(a <= b for a, b in zip(white, white[1:])) and white[4] > 0.15, white
    assert float((gamma >= 254.5 / 255).all(axis=2).mean()) < white[4] / 5
    cat = load_reference("chelsea", size=(256, 192))  # no black backdrop: its shadows show the lift
    lifted = [np.percentile(distort(cat, t, 5, key="t"), 5) - np.percentile(cat, 5) for t in ("brighten", "overexposure")]
    assert lifted[0] > 2 * lifted[1], lifted
