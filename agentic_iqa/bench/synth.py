"""A deterministic KADID-10k-style synthetic benchmark built from scikit-image's offline sample images.

Why synthetic: no IQA dataset can be downloaded here, but graded synthetic distortions (KADID-10k's
recipe: 25 types x 5 levels) still measure what matters offline: whether scores fall as a distortion
grows (intra-group SRCC) and whether the right distortion category is named (detection accuracy).

References (``REFERENCES``): the photographic RGB samples plus gray ones converted to RGB, centre-cropped
to 4:3 and resized to 512x384. "motorcycle" is the left view of ``stereo_motorcycle``, a garage scene
that ships with scikit-image like the others. ``clock`` (already motion-blurred), ``moon`` (visible 8x8 JPEG blocking:
blockiness 2.4 where clean photos measure < 1.1), ``hubble_deep_field`` (almost all black) and ``retina``
(a disc on black) are left out: a reference must be a clean photo.
Split (fixed, by reference, so no content is shared): test = coffee, rocket, coins, gravel (two colour,
two gray); every other reference is train.

Types (``TYPES``): 16 KADID-style types and four of ours (``contrast decrease``; ``overexposure``: a camera's
exposure raised in linear light, which clips highlights as KADID's tone-curve ``brighten`` does not; and
``luminance noise`` and ``gray impulse noise``: noise with no colour in it, which KADID's per-channel white and
impulse noise never are), covering
the seven spec categories, 5 levels each. The KADID
ladders are used where the issue gives them (gaussian blur sigma, JPEG quality, white-noise variance);
the others are our own KADID-like ladders, listed in each type's ``params``. Colour-saturation types need
colour, so they are applied to the RGB references only. The saturation decrease stops short of fully gray
because a gray image is a legitimate monochrome photo that no no-reference method can call desaturated.

Output of ``make_benchmark``: ``references/<ref>.png``, ``images/<ref>/<ref>__<type>__L<k>.(png|jpg)``
(JPEG rows are the encoder's bytes, everything else lossless PNG), ``manifest.jsonl`` (see
``agentic_iqa.bench.manifest``) and ``benchmark.json`` (seed, types, ladders, split).
"""
from __future__ import annotations

import io
import json
import os
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import cv2
import numpy as np
from PIL import Image

from iqa_tools.categories import DISTORTION_CATEGORIES

from .manifest import KNOWN_TYPES, ManifestRow, write_manifest

SIZE = (512, 384)  # width, height
TEST_REFS = ("coffee", "rocket", "coins", "gravel")
# name -> True when the sample is colour
REFERENCES: dict[str, bool] = {
    "astronaut": True, "chelsea": True, "coffee": True, "rocket": True, "immunohistochemistry": True,
    "motorcycle": True,
    "camera": False, "coins": False, "brick": False, "grass": False, "gravel": False,
}

# ---------------------------------------------------------------------------------------------
# Distortions. Each takes a float32 RGB image in [0, 1], one ladder parameter and a seeded RNG, and
# returns a float image, or encoded bytes for types whose artefacts come from a real encoder.


def _luma(x: np.ndarray) -> np.ndarray:
    return x @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def gaussian_blur(x, sigma, rng):
    return cv2.GaussianBlur(x, (0, 0), sigma, borderType=cv2.BORDER_REFLECT)


def lens_blur(x, radius, rng):
    # A disc (defocus) kernel, anti-aliased by supersampling so small radii still differ.
    k = int(np.ceil(radius)) * 2 + 1
    fine = 8
    yy, xx = np.mgrid[0:k * fine, 0:k * fine]
    c = (k * fine - 1) / 2
    disc = ((xx - c) ** 2 + (yy - c) ** 2 <= (radius * fine) ** 2).astype(np.float32)
    kernel = disc.reshape(k, fine, k, fine).mean(axis=(1, 3))
    return cv2.filter2D(x, -1, kernel / kernel.sum(), borderType=cv2.BORDER_REFLECT)


def motion_blur(x, length, rng):
    # A line kernel of the given length at a random angle, splatted bilinearly at sub-pixel steps.
    angle = rng.uniform(0, np.pi)
    k = int(np.ceil(length)) | 1
    kernel = np.zeros((k + 2, k + 2), np.float32)
    c = (k + 1) / 2
    for t in np.linspace(-(length - 1) / 2, (length - 1) / 2, int(length * 8)):
        px, py = c + t * np.cos(angle), c + t * np.sin(angle)
        x0, y0 = int(np.floor(px)), int(np.floor(py))
        fx, fy = px - x0, py - y0
        kernel[y0, x0] += (1 - fx) * (1 - fy)
        kernel[y0, x0 + 1] += fx * (1 - fy)
        kernel[y0 + 1, x0] += (1 - fx) * fy
        kernel[y0 + 1, x0 + 1] += fx * fy
    return cv2.filter2D(x, -1, kernel / kernel.sum(), borderType=cv2.BORDER_REFLECT)


def pixelate(x, block, rng):
    h, w = x.shape[:2]
    small = cv2.resize(x, (max(1, round(w / block)), max(1, round(h / block))), interpolation=cv2.INTER_AREA)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST)


def _hsv_saturation(x, factor):
    hsv = cv2.cvtColor(x, cv2.COLOR_RGB2HSV)
    hsv[..., 1] = np.clip(hsv[..., 1] * factor, 0, 1)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def saturation_decrease(x, factor, rng):
    return _hsv_saturation(x, factor)


def saturation_increase(x, factor, rng):
    # Chroma scaled in CIELAB: the garish over-saturated look, with clipping in saturated colours.
    lab = cv2.cvtColor(x, cv2.COLOR_RGB2LAB)
    lab[..., 1:] *= factor
    return cv2.cvtColor(lab, cv2.COLOR_LAB2RGB)


def color_quantization(x, colors, rng):
    # Median-cut palette from a 1/4-size copy (full-size median cut costs 200 ms; octree collapses gray
    # images to 16 levels whatever is asked), then every pixel mapped to it without dithering.
    im = Image.fromarray(to_uint8(x))
    small = im.resize((im.width // 4, im.height // 4), Image.Resampling.BOX)
    palette = small.quantize(colors=int(colors), method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    q = im.quantize(palette=palette, dither=Image.Dither.NONE)
    return np.asarray(q.convert("RGB"), dtype=np.float32) / 255


def jpeg(x, quality, rng) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(to_uint8(x)).save(buf, "JPEG", quality=int(quality))
    return buf.getvalue()


def jpeg2000(x, ratio, rng):
    # Encoded at the given compression ratio, decoded back and stored losslessly (PNG): few tools
    # read .jp2, and the artefacts are in the pixels either way.
    buf = io.BytesIO()
    Image.fromarray(to_uint8(x)).save(buf, "JPEG2000", quality_mode="rates", quality_layers=[ratio])
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB"), dtype=np.float32) / 255


def white_noise(x, variance, rng):
    return x + rng.normal(0, np.sqrt(variance), x.shape).astype(np.float32)


def chroma_noise(x, variance, rng):
    # Gaussian noise on the two chroma channels only (YCrCb), luminance untouched.
    ycc = cv2.cvtColor(x, cv2.COLOR_RGB2YCrCb)
    ycc[..., 1:] += rng.normal(0, np.sqrt(variance), ycc[..., 1:].shape).astype(np.float32)
    return cv2.cvtColor(ycc, cv2.COLOR_YCrCb2RGB)


def luminance_noise(x, variance, rng):
    # Gaussian noise on luminance only (YCrCb), chroma untouched: grain with no colour in it.
    ycc = cv2.cvtColor(x, cv2.COLOR_RGB2YCrCb)
    ycc[..., 0] += rng.normal(0, np.sqrt(variance), ycc[..., 0].shape).astype(np.float32)
    return cv2.cvtColor(ycc, cv2.COLOR_YCrCb2RGB)


def impulse_noise(x, density, rng):
    # Salt and pepper per channel value, as MATLAB's imnoise does on an RGB array.
    out = x.copy()
    hit = rng.random(x.shape) < density
    out[hit] = (rng.random(int(hit.sum())) < 0.5).astype(np.float32)
    return out


def gray_impulse_noise(x, density, rng):
    # Salt and pepper per pixel, the same in every channel: black and white specks, no colour.
    out = x.copy()
    hit = rng.random(x.shape[:2]) < density
    out[hit] = (rng.random(int(hit.sum())) < 0.5).astype(np.float32)[:, None]
    return out


def multiplicative_noise(x, variance, rng):
    return x * (1 + rng.normal(0, np.sqrt(variance), x.shape).astype(np.float32))


def brighten(x, gamma, rng):
    return np.power(x, gamma)


def darken(x, gamma, rng):
    return np.power(x, gamma)


def _srgb_to_linear(x):
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)


def _linear_to_srgb(x):
    return np.where(x <= 0.0031308, x * 12.92, 1.055 * np.power(x, 1 / 2.4) - 0.055)


def over_exposure(x, stops, rng):
    # A camera exposed `stops` EV too long: a gain in linear light, each channel clipping at the sensor's white,
    # so highlights blow out to flat white (a gamma, ``brighten``, lifts the shadows and clips almost nothing).
    lin = _srgb_to_linear(np.clip(x, 0, 1)) * np.float32(2.0 ** stops)
    return _linear_to_srgb(np.minimum(lin, 1)).astype(np.float32)


def high_sharpen(x, amount, rng):
    # Unsharp masking with a strong gain: halos and overshoot at edges, amplified texture.
    return x + amount * (x - cv2.GaussianBlur(x, (0, 0), 1.5, borderType=cv2.BORDER_REFLECT))


def contrast_decrease(x, factor, rng):
    mean = float(_luma(x).mean())
    return mean + factor * (x - mean)


@dataclass(frozen=True)
class DistortionType:
    name: str                 # KADID-style name (key of manifest.KNOWN_TYPES)
    apply: Callable
    params: tuple             # levels 1..5, increasing severity
    unit: str                 # what the parameter means
    needs_color: bool = False

    @property
    def category(self) -> Optional[str]:
        return KNOWN_TYPES[self.name]


TYPES: dict[str, DistortionType] = {t.name: t for t in [
    DistortionType("gaussian blur", gaussian_blur, (0.1, 0.5, 1, 2, 5), "sigma (px), KADID ladder"),
    DistortionType("lens blur", lens_blur, (1, 2, 3, 5, 8), "disc radius (px)"),
    DistortionType("motion blur", motion_blur, (3, 5, 9, 15, 25), "line length (px), random angle"),
    DistortionType("pixelate", pixelate, (2, 3, 4, 6, 10), "block size (px)"),
    DistortionType("color saturation 1", saturation_decrease, (0.6, 0.4, 0.25, 0.12, 0.05),
                   "HSV saturation factor", needs_color=True),
    DistortionType("color saturation 2", saturation_increase, (1.4, 1.8, 2.3, 3.0, 4.0),
                   "CIELAB chroma factor (over-saturation)", needs_color=True),
    DistortionType("color quantization", color_quantization, (64, 48, 32, 16, 8), "palette colours (median cut, no dithering)"),
    DistortionType("jpeg", jpeg, (43, 36, 24, 7, 4), "JPEG quality, KADID ladder"),
    DistortionType("jpeg2000", jpeg2000, (24, 48, 96, 192, 384), "compression ratio"),
    DistortionType("white noise", white_noise, (0.001, 0.002, 0.003, 0.005, 0.01),
                   "variance in [0,1] units, KADID ladder"),
    DistortionType("white noise in color component", chroma_noise, (0.002, 0.004, 0.008, 0.016, 0.03),
                   "chroma noise variance"),
    DistortionType("luminance noise", luminance_noise, (0.0004, 0.00075, 0.0015, 0.003, 0.006),
                   "luminance noise variance (sigma 5-20 of 255)"),
    DistortionType("impulse noise", impulse_noise, (0.005, 0.01, 0.02, 0.04, 0.08), "salt-and-pepper density"),
    DistortionType("gray impulse noise", gray_impulse_noise, (0.005, 0.01, 0.02, 0.04, 0.08),
                   "salt-and-pepper density per pixel, same in every channel"),
    DistortionType("multiplicative noise", multiplicative_noise, (0.005, 0.01, 0.02, 0.04, 0.08),
                   "speckle variance"),
    DistortionType("brighten", brighten, (0.8, 0.65, 0.5, 0.4, 0.3), "gamma < 1"),
    DistortionType("overexposure", over_exposure, (0.33, 0.67, 1.0, 1.5, 2.0),
                   "exposure raised, EV stops (a linear-light gain; highlights clip)"),
    DistortionType("darken", darken, (1.25, 1.6, 2.0, 2.6, 3.4), "gamma > 1"),
    DistortionType("high sharpen", high_sharpen, (1, 2, 3, 5, 8), "unsharp-mask gain (sigma 1.5)"),
    DistortionType("contrast decrease", contrast_decrease, (0.75, 0.6, 0.45, 0.3, 0.18),
                   "factor towards the mean luminance"),
]}

assert {t.category for t in TYPES.values()} >= set(DISTORTION_CATEGORIES), "every spec category needs a type"

# ---------------------------------------------------------------------------------------------


def to_uint8(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, 0, 1) * 255 + 0.5).astype(np.uint8)


def load_reference(name: str, size: tuple[int, int] = SIZE) -> np.ndarray:
    """A scikit-image sample as float32 RGB in [0, 1]: centre-cropped to the target aspect, resized."""
    import skimage.data

    img = skimage.data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(skimage.data, name)()
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    img = img[..., :3]
    h, w = img.shape[:2]
    tw, th = size
    if w * th > h * tw:          # too wide: crop width
        cw, ch = round(h * tw / th), h
    else:                        # too tall: crop height
        cw, ch = w, round(w * th / tw)
    y0, x0 = (h - ch) // 2, (w - cw) // 2
    img = img[y0:y0 + ch, x0:x0 + cw]
    if (cw, ch) != size:
        # Lanczos via PIL: good for both the down- and the (few) up-scaled samples.
        img = np.asarray(Image.fromarray(img).resize(size, Image.Resampling.LANCZOS))
    return img.astype(np.float32) / 255


def _rng(seed: int, *names) -> np.random.Generator:
    # Stable across processes and Python runs (str hash() is salted; crc32 is not).
    return np.random.default_rng([seed] + [zlib.crc32(str(n).encode()) for n in names])


def distort(image: np.ndarray, type_name: str, level: int, seed: int = 0, key: str = "") -> np.ndarray | bytes:
    """Apply one distortion at one level (1..5). Returns a float RGB image, or bytes for JPEG."""
    t = TYPES[type_name]
    out = t.apply(image.astype(np.float32), t.params[level - 1], _rng(seed, key, type_name, level))
    return out if isinstance(out, bytes) else np.clip(out, 0, 1).astype(np.float32)


def _write_png(path: Path, x: np.ndarray) -> None:
    # cv2's encoder with Huffman-only deflate: ~2x faster than the default strategy and, on noisy
    # images, no larger. Writing dominates generation time.
    ok, buf = cv2.imencode(".png", to_uint8(x)[..., ::-1],
                           [cv2.IMWRITE_PNG_COMPRESSION, 1, cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_HUFFMAN_ONLY])
    assert ok
    path.write_bytes(buf.tobytes())


def slug(name: str) -> str:
    return name.replace(" ", "-")


def _make_one_reference(args) -> list[dict]:
    out_dir, ref, types, seed = args
    out_dir = Path(out_dir)
    img = load_reference(ref)
    ref_rel = Path("references") / f"{ref}.png"
    _write_png(out_dir / ref_rel, img)
    (out_dir / "images" / ref).mkdir(parents=True, exist_ok=True)
    rows = []
    for tname in types:
        t = TYPES[tname]
        if t.needs_color and not REFERENCES.get(ref, True):
            continue
        for level in range(1, 6):
            out = distort(img, tname, level, seed, ref)
            ext = "jpg" if isinstance(out, bytes) else "png"
            rel = Path("images") / ref / f"{ref}__{slug(tname)}__L{level}.{ext}"
            if isinstance(out, bytes):
                (out_dir / rel).write_bytes(out)
            else:
                _write_png(out_dir / rel, out)
            rows.append(dict(id=f"{ref}__{slug(tname)}__L{level}", image=rel.as_posix(),
                             reference=ref_rel.as_posix(), type=tname, level=level, source=ref,
                             split="test" if ref in TEST_REFS else "train"))
    return rows


def _mcq_rows(rows: list[dict], seed: int) -> list[dict]:
    """One multiple-choice question per (reference, type) with a category, at a random level 3..5,
    where the distortion is clearly visible: the applied category plus three others, shuffled."""
    out = []
    for row in rows:
        cat = KNOWN_TYPES[row["type"]]
        # One RNG per (reference, type): the questions do not depend on which other rows exist.
        rng = _rng(seed, "mcq", row["source"], row["type"])
        if cat is None or row["level"] != 3 + int(rng.integers(0, 3)):
            continue
        others = [c for c in DISTORTION_CATEGORIES if c != cat]
        choices = [cat] + [str(c) for c in rng.choice(others, size=3, replace=False)]
        rng.shuffle(choices)
        options = dict(zip("ABCD", choices))
        answer = next(k for k, v in options.items() if v == cat)
        text = " ".join(f"{k}. {v}" for k, v in options.items())
        out.append({**row, "id": row["id"] + "__mcq", "options": options, "answer": answer,
                    "question": f"Which distortion is most visible in this image? {text}"})
    return out


def make_benchmark(out_dir: str | Path, seed: int = 0, refs: Optional[Sequence[str]] = None,
                   types: Optional[Sequence[str]] = None, mcq: bool = True,
                   workers: Optional[int] = None) -> Path:
    """Generate the benchmark under ``out_dir`` and return the manifest path.

    Deterministic: the same seed, refs and types give byte-identical files (each image's RNG is seeded
    from the seed and its reference, type and level, so the worker count does not matter).
    """
    out_dir = Path(out_dir)
    refs = list(refs or REFERENCES)
    types = list(types or TYPES)
    unknown = [t for t in types if t not in TYPES] + [r for r in refs if r not in REFERENCES]
    if unknown:
        raise ValueError(f"unknown reference or type: {unknown}")
    (out_dir / "references").mkdir(parents=True, exist_ok=True)
    jobs = [(str(out_dir), ref, types, seed) for ref in refs]
    workers = workers or min(len(jobs), os.cpu_count() or 1, 4)
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            per_ref = list(pool.map(_make_one_reference, jobs))
    else:
        per_ref = [_make_one_reference(job) for job in jobs]
    rows = [r for chunk in per_ref for r in chunk]
    if mcq:
        rows += _mcq_rows(rows, seed)
    meta = {"seed": seed, "size": SIZE, "references": {r: ("test" if r in TEST_REFS else "train") for r in refs},
            "types": {t: {"category": TYPES[t].category, "params": TYPES[t].params, "unit": TYPES[t].unit}
                      for t in types}}
    (out_dir / "benchmark.json").write_text(json.dumps(meta, indent=1))
    return write_manifest((ManifestRow.model_validate(r) for r in rows), out_dir / "manifest.jsonl")
