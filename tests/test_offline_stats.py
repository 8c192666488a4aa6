"""The offline analyst's statistics and severities respond to known distortions.

Images come from the synthetic generator applied to "coffee", a TEST-split reference the thresholds
never saw, at full benchmark size (the thresholds are fitted at 512x384).
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from agentic_iqa.bench.synth import TEST_REFS, distort, load_reference
from agentic_iqa.offline import severity as sv
from agentic_iqa.offline import stats as st
from iqa_tools.categories import DISTORTION_CATEGORIES


@pytest.fixture(scope="module")
def coffee():
    assert "coffee" in TEST_REFS
    return load_reference("coffee")


def _img(ref, type_name, level):
    out = distort(ref, type_name, level, seed=0, key="test")
    if isinstance(out, bytes):  # JPEG: decode the real encoder's bytes
        return st.as_float_rgb(Image.open(io.BytesIO(out)))
    return out


def _levels(ref, type_name, category, reference=None):
    return [sv.analyze(_img(ref, type_name, lv), reference)[category].level for lv in (1, 3, 5)]


def test_as_float_rgb_conversions(tmp_path):
    gray16 = (np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000)
    out = st.as_float_rgb(gray16)
    assert out.shape == (3, 4, 3) and out.dtype == np.float32
    assert out[2, 3, 0] == pytest.approx(55000 / 65535, abs=1e-6)
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[..., 0] = 255
    assert st.as_float_rgb(rgba)[..., 0].min() == 1.0 and st.as_float_rgb(rgba).shape == (2, 2, 3)
    path = tmp_path / "x.png"
    Image.fromarray((np.ones((4, 5, 3)) * 128).astype(np.uint8)).save(path)
    assert st.as_float_rgb(path).shape == (4, 5, 3)
    assert st.as_float_rgb(Image.open(path)).max() == pytest.approx(128 / 255)
    with pytest.raises(ValueError):
        st.as_float_rgb(np.zeros((2, 2, 2)))


def test_raw_statistics_move_the_right_way(coffee):
    clean = st.measure(coffee)
    blurred = st.measure(_img(coffee, "gaussian blur", 4))
    noisy = st.measure(_img(coffee, "white noise", 3))
    jpeg = st.measure(_img(coffee, "jpeg", 5))
    gray = st.measure(np.repeat(st.luma(coffee)[..., None], 3, axis=2))
    assert blurred["reblur"] > clean["reblur"] + 0.2
    assert blurred["lap_var"] < clean["lap_var"] / 10
    assert noisy["noise_flat"] > 3 * clean["noise_flat"]
    assert noisy["chroma_noise"] > 5 * clean["chroma_noise"]
    assert clean["jpeg_grid"] < 1.2 < 2.0 < jpeg["jpeg_grid"]
    assert gray["colorfulness"] < 1e-3 < clean["colorfulness"]


def test_noise_across_scales_sees_grain_but_not_fine_texture():
    import skimage.data

    rng = np.random.default_rng(0)
    flat = np.full((256, 384), 120.0, np.float32)
    ramp = np.tile(np.linspace(40, 200, 384, dtype=np.float32), (256, 1))
    for sigma in (5, 10, 20):  # white noise, on a flat and on a graded background: about 0.85 of its sigma
        assert 0.75 * sigma < st.noise_sigma_across_scales(flat + rng.normal(0, sigma, flat.shape).astype(np.float32)) < sigma
        assert 0.75 * sigma < st.noise_sigma_across_scales(ramp + rng.normal(0, sigma, ramp.shape).astype(np.float32)) < sigma
    assert st.noise_sigma_across_scales(ramp) == 0.0
    # Grass (scikit-image, CC0) has no flat area: its flattest blocks read as grain of sigma 8, its detail across
    # scales as none; grain of sigma 20 added to it reads as such on both.
    grass = skimage.data.grass().astype(np.float32)
    assert np.percentile(st.noise_sigma_blocks(grass / 255) * 255, 10) > 6 > 1 > st.noise_sigma_across_scales(grass)
    assert st.noise_sigma_across_scales(grass + rng.normal(0, 20, grass.shape).astype(np.float32)) > 15


def test_fine_to_mid_net_of_noise_sees_a_blur_under_the_noise():
    """Noise fills the fine band: on the raw band ratio a blurred photo with noise on top reads sharper than the
    photo itself. Net of the noise's share (sigma from ``noise_sigma_across_scales``) it reads as the blur alone,
    and a clean photo's ratio is unchanged."""
    # The shares are the band filters' own: about 76 % of a white noise's variance is in the fine band.
    assert st.WHITE_NOISE_BAND_SHARES == pytest.approx((0.76, 0.036), abs=0.005)
    x = load_reference("chelsea")
    blurred = np.clip(distort(x, "gaussian blur", 3, key="t"), 0, 1)
    noisy_blur = np.clip(distort(blurred, "white noise", 3, key="t"), 0, 1)
    clean, blur, both = st.measure(x), st.measure(blurred), st.measure(noisy_blur)
    assert clean["noise_scales"] < 1 and clean["fine_to_mid_net"] == pytest.approx(clean["fine_to_mid"], abs=0.01)
    # The raw ratio reads the blurred photo with noise sharper than the clean one; net of the noise, blurrier.
    assert blur["fine_to_mid_net"] < both["fine_to_mid_net"] < clean["fine_to_mid_net"] < both["fine_to_mid"]
    # Noise alone is taken out (a little under-estimated, never over-corrected into a blur).
    noisy = st.measure(np.clip(distort(x, "white noise", 3, key="t"), 0, 1))
    assert noisy["fine_to_mid"] - 0.3 > noisy["fine_to_mid_net"] > clean["fine_to_mid_net"]
    assert noisy["fine_to_mid_net"] == pytest.approx(clean["fine_to_mid_net"], abs=0.15)


def test_dead_flat_counts_noise_free_blocks_but_not_clipped_ones():
    rng = np.random.default_rng(0)
    flat = np.full((64, 96), 120.0, np.float32)
    grain = flat + rng.normal(0, 1.0, flat.shape).astype(np.float32)
    assert st.dead_flat_share(flat) == 1.0
    assert st.dead_flat_share(grain) == 0.0
    half = grain.copy()
    half[:, :48] = 120.0
    assert st.dead_flat_share(half) == pytest.approx(0.5, abs=0.1)
    # Clipped white is flat because of the clipping: those blocks are left out.
    half[:, :48] = 255.0
    assert st.dead_flat_share(half) == 0.0


def test_blur_severity_rises_with_sigma(coffee):
    levels = _levels(coffee, "gaussian blur", "Blurs")
    assert levels[0] < levels[1] < levels[2]
    assert sv.analyze(coffee)["Blurs"].level < levels[1]
    worst = sv.detect(_img(coffee, "gaussian blur", 5))[0]
    assert worst.category == "Blurs" and worst.severity in ("severe", "extreme")


@pytest.mark.parametrize("type_name,category,word", [
    ("white noise", "Noise", "noise"),
    ("impulse noise", "Noise", "noise"),
    ("jpeg", "Compression", "JPEG"),
    ("darken", "Brightness change", "under-exposure"),
    ("brighten", "Brightness change", "over-exposure"),
    ("color saturation 1", "Color distortions", "colour loss"),
    ("contrast decrease", "Contrast", "contrast"),
    ("high sharpen", "Sharpness", "sharpening"),
])
def test_strong_distortion_is_the_top_detection_with_a_measured_reason(coffee, type_name, category, word):
    top = sv.detect(_img(coffee, type_name, 5))[0]
    assert top.category == category
    if type_name == "high sharpen":
        # Strong unsharp masking also amplifies grain: it ranked second behind noise until the noise detectors'
        # discount against over-sharpening; now it is the main finding. Coffee's edge overshoot at level 5 (0.236)
        # lies between the corpus' level-2 and level-3 values, and the 5-source fit raised the sharpen detector's
        # clean offset (1.14 -> 1.68: pyiqa's Kodak duplicates left the corpus), so it reads slight (1.87, was 2.53).
        assert top.severity != "none" and sv.analyze(_img(coffee, type_name, 5))[category].level >= 1.5
    elif type_name == "brighten":
        # Kodak24's high-key photos joined the fit (6 sources): clean photos of unseen sources now reach a higher
        # over-exposure level, so the clean offset rose (1.68 -> 1.86; 1.89 since pyiqa's Kodak duplicates left) and
        # gamma 0.3 on coffee read 2.42, the top of "slight" (5 sources before Kodak24: 3.36; now 2.77). Held out, brighten levels 4-5 read moderate or worse in 65 % / 75 % of cases
        # (5 sources: 71 % / 82 %): benchmarks/RESULTS.md. With deepin's bright skies in the fit (7 sources) the offset
        # is 1.87 and coffee reads 1.81; with ubuntucinnamon's (12 sources) 1.41 (1.55 with 11). It must still be the
        # main finding, past the clean photos' level 0 and the "slight" threshold (benchmarks/RESULTS.md follow-up 25).
        assert top.severity in ("slight", "moderate", "severe", "extreme") and sv.analyze(
            _img(coffee, type_name, 5))[category].level >= 1.2
    elif type_name == "darken":
        # Each source of low-key photos in the fit reads a darkening as less damaging: with elementary's (10 sources)
        # coffee at gamma 3.4 reads 2.24, slight (2.88, moderate, with 9), 2.14 with 11 and 1.85 with 12. It must still
        # be the main finding, well past the clean photos' level 0 (benchmarks/RESULTS.md follow-ups 24-25).
        assert top.severity != "none" and sv.analyze(_img(coffee, type_name, 5))[category].level >= 1.5
    else:
        assert top.severity in ("moderate", "severe", "extreme")
    assert word in top.explanation and any(ch.isdigit() for ch in top.explanation)
    assert 0 < top.confidence <= 1


def test_full_reference_mode_pins_down_mild_distortions(coffee):
    # Level 2 is often invisible to the NR statistics; against the reference it is not.
    for type_name, category in [("jpeg", "Compression"), ("gaussian blur", "Blurs"), ("darken", "Brightness change")]:
        top = sv.detect(_img(coffee, type_name, 2), reference=coffee)[0]
        assert top.category == category, type_name
    assert sv.detect(coffee, reference=coffee) == []  # the reference itself: nothing found
    with pytest.raises(ValueError, match="differ in size"):
        st.measure_fr(coffee, coffee[:-8])


def test_measure_fr_reuses_given_statistics(coffee):
    img = _img(coffee, "white noise", 2)
    direct = st.measure_fr(img, coffee)
    reused = st.measure_fr(img, coffee, st.measure(img), st.measure(coffee))
    assert direct == pytest.approx(reused)
    assert direct["fr_noise"] > 3 and abs(direct["fr_median_shift"]) < 2


def test_monochrome_image_is_not_called_desaturated(coffee):
    gray = np.repeat(st.luma(coffee)[..., None], 3, axis=2)
    noisy_gray = np.clip(gray + np.random.default_rng(0).normal(0, 0.05, gray.shape), 0, 1).astype(np.float32)
    for img in (gray, noisy_gray):
        colour = sv.analyze(img)["Color distortions"]
        assert colour.severity == "none", colour.explanation
        desaturated = next(d for d in sv.DETECTORS if d.name == "desaturated")
        assert "monochrome" in desaturated.gate(st.measure(img))
    assert desaturated.gate(st.measure(coffee)) is None


def test_level_distribution_is_a_distribution_and_ranks_damage(coffee):
    scores = []
    for img in (coffee, _img(coffee, "lens blur", 2), _img(coffee, "lens blur", 4)):
        dist = sv.level_distribution(sv.analyze(img))
        assert len(dist) == 5 and sum(dist) == pytest.approx(1) and min(dist) >= 0
        scores.append(sv.expected_level(dist))
    assert scores[0] > scores[1] > scores[2]
    assert scores[2] < 2.5 < scores[0]


def test_level_distribution_expectation_tracks_badness_exactly():
    # Built by hand: one category at a given raw level, the rest clean.
    def analyses(raw):
        return [sv.CategoryAnalysis(c, sv.severity_of(max(raw if i == 0 else -1, 0)), max(raw if i == 0 else -1, 0),
                                    0.8, "x", "d", level_raw=raw if i == 0 else -1.0)
                for i, c in enumerate(DISTORTION_CATEGORIES)]
    qs = [sv.expected_level(sv.level_distribution(analyses(r))) for r in (0.0, 1.0, 2.5, 4.0, 6.0)]
    assert all(a > b for a, b in zip(qs, qs[1:]))
    b = sv.overall_badness(analyses(2.5))
    assert qs[2] == pytest.approx(sv.quality_from_badness(b), abs=1e-6)
    assert sv.quality_from_badness(0) == 5 and sv.quality_from_badness(4.5) == pytest.approx(1.4)


def test_severity_edges():
    assert [sv.severity_of(v) for v in (0, 0.49, 0.5, 2.49, 2.5, 3.5, 4.5, 5)] == [
        "none", "none", "slight", "slight", "moderate", "severe", "extreme", "extreme"]


def test_isotonic_fit_is_monotone_and_pools_violators():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    y = np.array([1.0, 3.0, 2.0, 4.0])
    kx, ky = sv.isotonic(x, y, np.ones(4))
    assert kx.tolist() == [1.0, 2.5, 4.0] and ky.tolist() == [1.0, 2.5, 4.0]


def test_shipped_thresholds_record_their_fit():
    th = json.loads(sv.THRESHOLDS_PATH.read_text())
    prov = th["provenance"]
    # Fitted on the real-photo corpus (several independent registry sources), by benchmarks/fit_corpus.py.
    assert prov["corpus"] == "benchmarks/corpus/manifest.json" and prov["n_photos"] >= 30 and prov["fitted"]
    assert len(prov["sources"]) >= 4
    for mode in ("nr", "fr"):
        assert set(th[mode]) == {d.name for d in sv.DETECTORS}
        assert all(0.0 <= fit["clean_offset"] <= 2.5 for fit in th[mode].values())


def test_too_small_images_get_a_clear_reason_not_an_index_error():
    import numpy as np
    import pytest

    from agentic_iqa.offline.stats import MIN_SIDE, measure

    with pytest.raises(ValueError, match=r"16×16 px: too small for the offline analyst's statistics"):
        measure(np.full((16, 16, 3), 0.5, np.float32))
    assert measure(np.random.default_rng(0).random((MIN_SIDE, MIN_SIDE, 3)).astype(np.float32))["lap_var"] > 0


# ── which category: the category model over all detector levels (issue 10, top-1) ──────────────────

def test_shipped_category_model_covers_every_detector_and_gives_probabilities(coffee):
    th = json.loads(sv.THRESHOLDS_PATH.read_text())
    for mode in ("nr", "fr"):
        model = th["category_model"][mode]
        assert model["detectors"] == [d.name for d in sv.DETECTORS]
        assert model["categories"] == list(DISTORTION_CATEGORIES) and model["n"] > 1000
    an = sv.analyze(_img(coffee, "jpeg", 4))
    assert abs(sum(a.likelihood for a in an.values()) - 1) < 1e-3
    assert max(an.values(), key=lambda a: a.likelihood).category == "Compression"


def test_blur_that_also_smears_like_jpeg2000_is_reported_as_blur():
    # Strong blur drives the JPEG2000 detector as high as the blur one or higher (rocket, gaussian blur
    # L5: Compression came first by level before the category model); the model weighs both together.
    for ref, type_name in [(load_reference("rocket"), "gaussian blur"), (load_reference("coffee"), "motion blur")]:
        assert sv.detect(_img(ref, type_name, 5))[0].category == "Blurs", type_name


def _analysis(category, severity, level, likelihood):
    return sv.CategoryAnalysis(category, severity, level, 0.5, "", "d", likelihood=likelihood)


def test_ranking_puts_present_categories_first_then_the_most_likely():
    a = _analysis("Blurs", "moderate", 3.0, 0.7)
    b = _analysis("Compression", "severe", 3.8, 0.25)
    c = _analysis("Noise", "none", 0.2, 0.05)
    assert [x.category for x in sv.ranked([c, b, a])] == ["Blurs", "Compression", "Noise"]
    # An absent category stays behind even when the model would favour it.
    c.likelihood = 0.9
    assert sv.ranked([c, b, a])[-1].category == "Noise"
    # Without a model (thresholds fitted before it existed): worst severity first, as before.
    for x in (a, b, c):
        x.likelihood = None
    assert [x.category for x in sv.ranked([a, c, b])] == ["Compression", "Blurs", "Noise"]


def test_category_model_learns_which_detector_to_believe():
    # Blur also drives the JPEG2000 detector, here even higher than the blur one; JPEG2000 damage drives
    # the blur detector only weakly. The model must name Blurs where both fire with j2k reading higher.
    rng = np.random.default_rng(0)
    dets = [d.name for d in sv.DETECTORS]
    i_blur, i_j2k = dets.index("blur"), dets.index("j2k")
    levels, cats = [], []
    for _ in range(200):
        lv = int(rng.integers(2, 6))
        blurred, smeared = np.full(len(dets), -1.0), np.full(len(dets), -1.0)
        blurred[i_blur], blurred[i_j2k] = lv - 0.5, lv + 0.3
        smeared[i_j2k], smeared[i_blur] = lv, 0.2 * lv
        levels += [blurred + rng.normal(0, 0.1, len(dets)), smeared + rng.normal(0, 0.1, len(dets))]
        cats += ["Blurs", "Compression"]
    model = sv.category_model(np.array(levels), cats)
    probe = np.full(len(dets), -1.0)
    probe[i_blur], probe[i_j2k] = 3.5, 4.3
    p = sv.category_probabilities({"category_model": {"nr": model}}, "nr", probe)
    assert p["Blurs"] > 0.9 and p["Compression"] < 0.1
    # A model fitted for another set of detectors is not applied (thresholds older than the code).
    stale = {**model, "detectors": dets[:-1]}
    assert sv.category_probabilities({"category_model": {"nr": stale}}, "nr", probe) is None


def test_hard_saturation_clip_counts_only_saturated_pixels_clipped_to_zero():
    x = np.full((40, 40, 3), 0.5, np.float32)  # gray: nothing saturated
    assert st.hard_saturation_clip(*st.channel_range(x)) == (0.0, 0.0)
    x[:20] = (0.9, 0.02, 0.01)  # vivid red, weakest channel kept
    x[20:30] = (0.9, 0.0, 0.3)  # saturated (S > 0.9), blue-green clipped to 0
    share, of_saturated = st.hard_saturation_clip(*st.channel_range(x))
    assert share == pytest.approx(0.25)
    assert of_saturated == pytest.approx(400 / (1200 + 0.002 * 1600))


# ------------------------------------------------------------------------------------ FR: levels in order

_BLOCKS = (2.5, 3.5, 5.0, 8.0, 10.0)       # pixelation block sizes (px): the corpus' "alt" ladder
_LENGTHS = (4.0, 7.0, 12.0, 20.0, 25.0)    # motion-blur lengths (px), a new random angle at each


def test_pixelate_and_motion_fits_recover_the_damage(coffee):
    from agentic_iqa.bench import synth

    yr = st.luma(coffee)
    for block in _BLOCKS:
        b, explained = st.best_pixelate_fit(st.luma(synth.pixelate(coffee, block, None)), yr)
        assert b == block and explained > 0.99, (block, b, explained)
    # JPEG's 8x8 blocks keep detail and shift block means: not an exact mosaic of the reference.
    assert st.best_pixelate_fit(st.luma(_img(coffee, "jpeg", 5)), yr)[1] < 0.5
    rng = np.random.default_rng(3)
    lengths = [st.best_motion_fit(st.luma(synth.motion_blur(coffee, n, rng)), yr) for n in _LENGTHS]
    assert [v for v, _ in lengths] == sorted(v for v, _ in lengths) and lengths[0][0] < lengths[-1][0]
    assert all(e > 0.8 for _, e in lengths), lengths
    assert st.best_pixelate_fit(yr, yr) == st.best_motion_fit(yr, yr) == (0.0, 0.0)


@pytest.mark.parametrize("seed", range(3))
def test_motion_fit_length_lies_between_grid_lengths(coffee, seed):
    # 12 and 25 px fall between the fit's grid lengths (10/14 and 20/28 px at full size): on the grid alone they
    # read 10 and 28 px, and on held-out photos a 25 px blur read 20 px like a 20 px one, then milder than it.
    from agentic_iqa.bench import synth

    yr, rng = st.luma(coffee), np.random.default_rng(seed)
    for n in (12.0, 20.0, 25.0):
        length, explained = st.best_motion_fit(st.luma(synth.motion_blur(coffee, n, rng)), yr)
        assert abs(length - n) <= 0.1 * n and explained > 0.9, (n, length, explained)


def test_fr_colored_clip_gain_grows_with_a_boost_at_the_gamut_edge(coffee):
    # A reference whose colours already sit at the gamut edge (coffee boosted 3x, in 8 bits): a further boost
    # barely raises its chroma (fr_chroma_ratio < 0.25 at every factor), but pushes ever more colours to pure
    # primaries, which the over-saturation detector reads with a reference (mate's Blinds in the corpus).
    from agentic_iqa.bench import synth

    boost = synth.TYPES["color saturation 2"].apply
    vivid = (np.round(np.clip(boost(coffee, 3.0, None), 0, 1) * 255) / 255).astype(np.float32)
    gains = []
    for factor in (1.4, 1.8, 2.3, 3.0, 4.0):
        y = (np.round(np.clip(boost(vivid, factor, None), 0, 1) * 255) / 255).astype(np.float32)
        m = st.measure_fr(y, vivid)
        assert m["fr_chroma_ratio"] < 0.25, (factor, m["fr_chroma_ratio"])
        gains.append(m["fr_colored_clip_gain"])
    assert gains == sorted(gains) and gains[0] > 0.1 and gains[-1] > gains[0] + 0.1, gains
    assert st.measure_fr(vivid, vivid)["fr_colored_clip_gain"] == 0.0
    assert abs(st.measure_fr(_img(coffee, "gaussian blur", 3), coffee)["fr_colored_clip_gain"]) < 0.01
    assert "fr_log_colored_clip_gain" in next(d for d in sv.DETECTORS if d.name == "oversaturated").fr


@pytest.mark.parametrize("type_name, params", [("pixelate", _BLOCKS), ("motion blur", _LENGTHS)])
def test_fr_analyst_quality_falls_with_every_level(coffee, type_name, params):
    # Issue 10 part 6: an 8 px mosaic drew JPEG's grid exactly and the JPEG detector went off its scale
    # (pixelation's level 4 scored below its level 5); motion blur's random angle reordered its levels
    # under the isotropic blur fit. Each seed draws new angles.
    from agentic_iqa.bench import synth

    apply = synth.TYPES[type_name].apply
    for seed in range(3):
        rng = np.random.default_rng(seed)
        scores = [sv.expected_level(sv.level_distribution(sv.analyze(apply(coffee, p, rng), coffee))) for p in params]
        if type_name == "pixelate":
            assert all(a > b for a, b in zip(scores, scores[1:])), (seed, [round(s, 3) for s in scores])
        else:
            # Neighbouring motion-blur levels can still swap when the longer blur's angle runs along the
            # photo's edges (held out: motion blur 0.77-0.96 FR intra SRCC per fold, RESULTS.md); every
            # level two steps apart must hold (the isotropic fit alone swapped those too).
            assert all(a > b for a, b in zip(scores, scores[2:])), (seed, [round(s, 3) for s in scores])
            assert scores[0] > max(scores[1:]) and scores[4] < min(scores[:3]), (seed, [round(s, 3) for s in scores])


def test_jpeg_detector_is_gated_off_exact_mosaics_only_with_a_reference(coffee):
    from agentic_iqa.bench import synth

    mosaic = synth.pixelate(coffee, 8, None)
    jpeg = next(d for d in sv.DETECTORS if d.name == "jpeg")
    s = {**st.measure(mosaic), **st.measure_fr(mosaic, coffee)}
    assert "mosaic" in jpeg.gate(s)
    assert jpeg.gate(st.measure(mosaic)) is None  # no reference: the NR detectors are unchanged
    real_jpeg = _img(coffee, "jpeg", 5)
    assert jpeg.gate({**st.measure(real_jpeg), **st.measure_fr(real_jpeg, coffee)}) is None
    compression = sv.analyze(mosaic, coffee)["Compression"]
    assert compression.detectors["jpeg"] == 0 and "mosaic" in compression.explanations["jpeg"]


# ------------------------------------------------------------------------------------ directional blur, clipping

class _Angle:
    """A stand-in for synth.motion_blur's generator: the blur's angle, fixed (radians)."""

    def __init__(self, angle: float):
        self.angle = angle

    def uniform(self, lo, hi):
        return self.angle


def test_directional_detail_grows_with_motion_blur_whatever_its_angle_and_not_with_isotropic_blur(coffee):
    from agentic_iqa.bench import synth

    def streak(x):
        return st.directional_detail(st.luma(st.in_8bit_steps(np.clip(x, 0, 1))))[0]

    clean = streak(coffee)
    isotropic = max(streak(synth.gaussian_blur(coffee, s, None)) for s in (1, 2, 5))
    assert clean < 0.5 and isotropic < 0.5
    for angle in (0.0, 0.5, 1.2, 2.0, 2.8):
        by_length = [streak(synth.motion_blur(coffee, n, _Angle(angle))) for n in (9, 15, 25)]
        # A line blur keeps fine detail in one orientation only: far above the clean photo and any Gaussian blur.
        assert min(by_length) > 0.9 > 0.5 > max(clean, isotropic), (angle, by_length)
        assert by_length[-1] > by_length[0], (angle, by_length)


def test_colored_full_clip_counts_coloured_pixels_driven_to_pure_primaries():
    x = np.full((40, 40, 3), 0.5, np.float32)  # gray: nothing coloured
    assert st.colored_full_clip(*st.channel_range(x)) == 0.0
    x[:20] = (0.6, 0.4, 0.3)    # coloured, in gamut
    x[20:30] = (0.7, 0.3, 0.0)  # weakest channel clipped only (a vivid colour can be)
    x[30:35] = (1.0, 0.6, 0.0)  # clipped at both ends: what a strong saturation boost makes
    assert st.colored_full_clip(*st.channel_range(x)) == pytest.approx(200 / (1400 + 0.002 * 1600))
