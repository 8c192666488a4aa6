"""Measured image statistics, one family per spec distortion category.

``measure(image)`` is no-reference: it sees only the image. ``measure_fr(image, reference)`` adds
comparisons against a pristine reference, which pin a change down far better than any NR guess.
All statistics are plain floats with readable units: luminance-like values are on the 0-255 scale.

Images are float32 RGB in [0, 1] (``as_float_rgb`` converts uint8/uint16 arrays, gray arrays, PIL images
and paths). Everything runs on cv2/numpy; a 512x384 image takes a few tens of ms.

Statistics are measured at a working size of at most WORKING_PIXELS (area-downscaled, aspect kept):
the thresholds were fitted on photos at long side 512 and checked at 1024 (benchmarks/fit_corpus.py),
so a 12 MP photo is judged at the scale the thresholds know, in a fraction of the time and memory.
Images at or below that size are measured as they are, in 8-bit steps (``in_8bit_steps``).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence, Union

import cv2
import numpy as np
from PIL import Image

ImageLike = Union[np.ndarray, Image.Image, str, Path]

_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def as_float_rgb(image: ImageLike) -> np.ndarray:
    """float32 HxWx3 in [0, 1] from a path, a PIL image or an array (gray, RGB or RGBA; any int dtype)."""
    if isinstance(image, (str, Path)):
        with Image.open(image) as im:
            im.load()
            image = im
            return as_float_rgb(np.asarray(im.convert("RGB")))
    if isinstance(image, Image.Image):
        # Convert in PIL: it knows the mode (16-bit gray, palette, alpha) that a raw array hides.
        return as_float_rgb(np.asarray(image.convert("RGB")))
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise ValueError(f"expected an HxW or HxWx3 image, got shape {arr.shape}")
    arr = arr[..., :3]
    if np.issubdtype(arr.dtype, np.integer):
        return arr.astype(np.float32) / np.float32(np.iinfo(arr.dtype).max)
    return np.clip(arr, 0, 1).astype(np.float32)


WORKING_PIXELS = 1024 * 768


def working_size(width: int, height: int, max_pixels: int = WORKING_PIXELS) -> tuple[int, int]:
    """(width, height) the statistics are measured at: the image's own, or downscaled to max_pixels."""
    if width * height <= max_pixels:
        return width, height
    scale = (max_pixels / (width * height)) ** 0.5
    return max(1, int(width * scale)), max(1, int(height * scale))


def at_working_size(x: np.ndarray, max_pixels: int = WORKING_PIXELS) -> np.ndarray:
    """`x` itself when small enough, else an area-averaged copy (how the fitting corpus was downscaled)."""
    h, w = x.shape[:2]
    size = working_size(w, h, max_pixels)
    if size == (w, h):
        return x
    return cv2.resize(x, size, interpolation=cv2.INTER_AREA)


def in_8bit_steps(x: np.ndarray) -> np.ndarray:
    """`x` rounded to the 256 levels of an 8-bit file, as the fitting corpus's working copies and damage
    were (benchmarks/fit_corpus.py). Float, 16-bit or area-downscaled input would otherwise show smooth
    areas without the rounding grain every 8-bit file has, which the flatness and noise statistics read as
    damage (or miss). `x` is in [0, 1] (``as_float_rgb``), so OpenCV's rounding, saturating conversion
    (5x faster than numpy's round) is exact here."""
    return cv2.convertScaleAbs(x, alpha=255.0).astype(np.float32) * np.float32(1 / 255)


def luma(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x @ _LUMA)


def channel_range(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel max and min over R, G, B (elementwise: numpy's axis=2 reduction is 30x slower)."""
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    return np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)


def _smooth_chroma(x: np.ndarray) -> np.ndarray:
    """Chroma (max - min over RGB) of a smoothed copy: coherent colour survives, the chroma of
    per-pixel noise averages out, so a noisy gray photo still reads as gray."""
    return np.subtract(*channel_range(_blur(x, 3.0)))


def _blur(y: np.ndarray, sigma: float) -> np.ndarray:
    return cv2.GaussianBlur(y, (0, 0), sigma, borderType=cv2.BORDER_REFLECT)


# ------------------------------------------------------------------------------------ blur / detail

def reblur_score(y: np.ndarray) -> float:
    """Crété-Roffet's blur measure in [0, 1]: how little of the image's neighbour-difference energy
    survives a 9-tap re-blur. A sharp image loses much of it (near 0); a blurred one has nothing left
    to lose (towards 1). Ratio-based, so it ignores global contrast."""
    scores = []
    for axis in (0, 1):
        k = (9, 1) if axis == 0 else (1, 9)
        b = cv2.blur(y, k[::-1], borderType=cv2.BORDER_REFLECT)
        d_f = np.abs(np.diff(y, axis=axis))
        d_b = np.abs(np.diff(b, axis=axis))
        s_f = d_f.sum()
        if s_f <= 0:
            return 1.0
        scores.append(float((s_f - np.maximum(0, d_f - d_b).sum()) / s_f))
    return max(scores)


def band_energies(y: np.ndarray) -> tuple[float, float, float]:
    """Energy (variance) of three octave-spaced bands: fine (< sigma 1), middle (1-2), coarse (2-4)."""
    g1, g2, g4 = _blur(y, 1.0), _blur(y, 2.0), _blur(y, 4.0)
    return float(np.var(y - g1)), float(np.var(g1 - g2)), float(np.var(g2 - g4))


def _white_noise_band_shares() -> tuple[float, float]:
    """Shares of a white noise's variance in the fine and the middle band of ``band_energies``: the sums of
    squares of the two band filters' impulse responses (about 0.76 and 0.036)."""
    d = np.zeros((65, 65), np.float32)
    d[32, 32] = 1
    g1, g2 = _blur(d, 1.0), _blur(d, 2.0)
    return float(((d - g1) ** 2).sum()), float(((g1 - g2) ** 2).sum())


WHITE_NOISE_BAND_SHARES = _white_noise_band_shares()
# ``noise_sigma_across_scales`` reads about 0.85 of a pure noise's sigma. Taken as 0.875, the noise's share is
# under-estimated a little: taken out in full, it read a noisy sharp photo as blurred (RESULTS.md follow-up 41).
NOISE_SCALES_SHARE = 0.875


def fine_to_mid_net_of_noise(fine: float, mid: float, noise_scales: float) -> float:
    """log10(fine / middle band energy) once the noise's own share of each band is taken out. Noise fills the fine
    band and hardly touches the middle one, so on the raw ratio a blurred photo with grain reads as sharp (a
    Gaussian blur with white noise on top was named a blur on 1 of 10 photos; RESULTS.md follow-up 41). The sigma
    is ``noise_sigma_across_scales``'s, which fine texture does not inflate, so a clean photo's ratio stays as it
    was. Each band keeps at least 1 % of its energy: the noise estimate is itself noisy."""
    v = (noise_scales / NOISE_SCALES_SHARE / 255) ** 2
    in_fine, in_mid = WHITE_NOISE_BAND_SHARES
    return float(np.log10((max(fine - in_fine * v, 0.01 * fine) + 1e-9) / (max(mid - in_mid * v, 0.01 * mid) + 1e-9)))


def edge_sharpness(y: np.ndarray) -> float:
    """Steepness of the strongest edges: gradient magnitude over the local 5x5 range at the top 0.5% of
    gradients (about 1/edge-width). Blur widens every edge; JPEG2000 keeps strong edges steep while it
    wipes out texture, which is how the two are told apart."""
    gx = cv2.Sobel(y, cv2.CV_32F, 1, 0, ksize=3) / 8
    gy = cv2.Sobel(y, cv2.CV_32F, 0, 1, ksize=3) / 8
    g = np.hypot(gx, gy)
    kernel = np.ones((5, 5), np.uint8)
    rng = cv2.dilate(y, kernel) - cv2.erode(y, kernel)
    top = g >= np.percentile(g, 99.5)
    return float(np.mean(g[top] / np.maximum(rng[top], 1e-3)))


def fine_band_concentration(y: np.ndarray) -> float:
    """Share of the fine band's energy held by its strongest 5% of pixels. Linear blur shrinks the band
    everywhere alike; wavelet/DCT quantization zeroes it in smooth areas and keeps it at edges."""
    e = (y - _blur(y, 1.0)).ravel() ** 2
    total = e.sum()
    if total <= 0:
        return 1.0
    k = int(0.95 * len(e))
    return float(np.partition(e, k)[k:].sum() / total)  # the top 5%'s sum needs no full sort (4x cheaper)


# ------------------------------------------------------------------------------------ noise

_IMMERKAER = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], dtype=np.float32)


def noise_sigma_blocks(y: np.ndarray, block: int = 16) -> np.ndarray:
    """Immerkær's noise sigma per block: the mask cancels smooth image structure up to second order,
    so in flat blocks its response is the noise alone. Returns one sigma per block (same units as y)."""
    r = np.abs(cv2.filter2D(y, -1, _IMMERKAER, borderType=cv2.BORDER_REFLECT))[1:-1, 1:-1]
    h, w = (r.shape[0] // block) * block, (r.shape[1] // block) * block
    per_block = r[:h, :w].reshape(h // block, block, w // block, block).mean(axis=(1, 3))
    return per_block.ravel() * np.sqrt(np.pi / 2) / 6


def _block_mean_square(r: np.ndarray, block: int) -> np.ndarray:
    h, w = (r.shape[0] // block) * block, (r.shape[1] // block) * block
    r = r[:h, :w]
    return cv2.resize(r * r, (w // block, h // block), interpolation=cv2.INTER_AREA)  # exact block means, fast


def noise_sigma_across_scales(y255: np.ndarray, block: int = 16) -> float:
    """Noise sigma (0-255) that dense fine texture does not inflate. Averaging 2x2 pixels keeps a quarter of
    white noise's variance, while image detail, roughly alike across scales, keeps its Immerkær energy; so in
    each block (full-size energy - half-size energy) * 4/3 is the noise variance with the detail cancelled.
    ``noise_flat`` needs flat blocks to see the noise alone: a peacock's fan or twigs against the sky have none,
    and read as grain of sigma 13-14. Taken over the quarter of blocks with the least fine energy (median); picking
    the quietest blocks also picks quieter noise, so pure noise reads about 0.85 of its sigma (a fitted feature)."""
    h, w = (y255.shape[0] // 2) * 2, (y255.shape[1] // 2) * 2
    y = np.ascontiguousarray(y255[:h, :w], dtype=np.float32)
    half = cv2.resize(y, (w // 2, h // 2), interpolation=cv2.INTER_AREA)  # 2x2 means
    full_e = _block_mean_square(cv2.filter2D(y, -1, _IMMERKAER, borderType=cv2.BORDER_REFLECT), block) / 36
    half_e = _block_mean_square(cv2.filter2D(half, -1, _IMMERKAER, borderType=cv2.BORDER_REFLECT), block // 2) / 36
    rows, cols = min(full_e.shape[0], half_e.shape[0]), min(full_e.shape[1], half_e.shape[1])
    full_e, half_e = full_e[:rows, :cols], half_e[:rows, :cols]
    quietest = full_e <= np.percentile(full_e, 25)
    return float(np.sqrt(max(np.median((full_e - half_e)[quietest]) * 4 / 3, 0.0)))


def dead_flat_share(y255: np.ndarray, block: int = 8, floor: float = 0.1) -> float:
    """Share of ``block``-px blocks with no noise at all: Immerkær sigma under ``floor`` on the 0-255
    scale. A photo's smooth areas (bokeh, sky, backdrop) still carry sensor grain or 8-bit dither;
    wavelet (JPEG2000) quantization zeroes the fine coefficients of smooth areas and leaves them dead
    flat. Blocks that touch clipped black or white are flat because of the clipping and do not count
    (all blocks do when fewer than 11 are left)."""
    r = np.abs(cv2.filter2D(y255, -1, _IMMERKAER, borderType=cv2.BORDER_REFLECT))[1:-1, 1:-1]
    inner = y255[1:-1, 1:-1]
    h, w = (r.shape[0] // block) * block, (r.shape[1] // block) * block
    size = (w // block, h // block)
    # Block means by an area resize (exact box averages at an integer factor; numpy's reshape-mean is ~3x slower).
    sigma = cv2.resize(np.ascontiguousarray(r[:h, :w]), size, interpolation=cv2.INTER_AREA) * np.sqrt(np.pi / 2) / 6
    clip = ((inner[:h, :w] > 252) | (inner[:h, :w] < 3)).astype(np.float32)
    clipped = cv2.resize(clip, size, interpolation=cv2.INTER_AREA) > 0
    kept = sigma[~clipped] if np.count_nonzero(~clipped) > 10 else sigma.ravel()
    return float(np.mean(kept < floor))


def impulse_fraction(x: np.ndarray) -> float:
    """Fraction of channel values that are saturated (0 or 1) and stand far from their 3x3 median:
    isolated salt-and-pepper dots. Clipped highlights are areas, not dots, so they do not count."""
    u8 = (x * 255 + 0.5).astype(np.uint8)
    med = cv2.medianBlur(u8, 3).astype(np.int16)
    dev = np.abs(u8.astype(np.int16) - med)
    extreme = (u8 == 0) | (u8 == 255)
    return float(np.mean(extreme & (dev > 80)))


# ------------------------------------------------------------------------------------ compression

def _phase_profile(y: np.ndarray, axis: int, period: int) -> np.ndarray:
    d = np.abs(np.diff(y, axis=axis)).mean(axis=1 - axis)
    n = len(d) // period * period
    return d[:n].reshape(-1, period).mean(axis=0)


def blockiness(y: np.ndarray, period: int = 8) -> float:
    """Block-grid strength: mean neighbour difference across the strongest grid phase divided by the
    mean of the other phases (1.0 = no grid). Both directions, averaged. The phase is searched because
    a cropped image need not start on a block boundary."""
    ratios = []
    for axis in (0, 1):
        phase = _phase_profile(y, axis, period)
        best = int(np.argmax(phase))
        ratios.append(float(phase[best] / max(np.delete(phase, best).mean(), 1e-6)))
    return float(np.mean(ratios))


def jpeg_grid(y: np.ndarray) -> float:
    """JPEG's 8x8 grid specifically: the strongest of the 8 phases against the phase 4 pixels away.
    JPEG jumps only at every 8th column; pixelation with 2- or 4-pixel blocks jumps at both, so it
    scores ~1 here while its plain ``blockiness`` is high."""
    ratios = []
    for axis in (0, 1):
        phase = _phase_profile(y, axis, 8)
        best = int(np.argmax(phase))
        ratios.append(float(phase[best] / max(phase[(best + 4) % 8], 1e-6)))
    return float(np.mean(ratios))


# ------------------------------------------------------------------------------------ colour

def colorfulness(x: np.ndarray) -> float:
    """Hasler & Süsstrunk (2003) colourfulness on the 0-255 scale (0 = gray; ~30 average; >80 vivid)."""
    r, g, b = (x[..., i] * 255 for i in range(3))
    rg, yb = r - g, 0.5 * (r + g) - b
    return float(np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(), yb.mean()))


def level_occupancy(x: np.ndarray) -> float:
    """Mean over channels of the fraction of 8-bit levels used between the 1st and 99th percentile.
    Natural photos use nearly every level; colour quantization and posterization leave gaps."""
    u8 = (x * 255 + 0.5).astype(np.uint8)
    fracs = []
    for c in range(3):
        hist = np.bincount(u8[..., c].ravel(), minlength=256)
        cdf = np.cumsum(hist) / hist.sum()
        lo, hi = int(np.searchsorted(cdf, 0.01)), int(np.searchsorted(cdf, 0.99))
        if hi - lo < 2:
            fracs.append(1.0 if hi == lo else float(np.count_nonzero(hist[lo:hi + 1]) / (hi - lo + 1)))
            continue
        fracs.append(float(np.count_nonzero(hist[lo:hi + 1]) / (hi - lo + 1)))
    return float(np.mean(fracs))


def flat_fraction(y: np.ndarray) -> float:
    """Share of pixels whose 8-bit luminance equals both their right and lower neighbour. Pixelation
    makes most of the image such runs; photos, even smooth ones, have few (noise and grain)."""
    u8 = (y * 255 + 0.5).astype(np.uint8)
    same = (u8[:-1, :-1] == u8[:-1, 1:]) & (u8[:-1, :-1] == u8[1:, :-1])
    return float(same.mean())


def grid_sparsity(y: np.ndarray) -> float:
    """Share of pixel columns (and rows) across which the image almost never changes: the mean step to
    the next column is under a quarter of the typical busy column's. Pixelation changes only at block
    edges, so most columns are empty; photos, banding and noise change everywhere."""
    out = []
    for axis in (0, 1):
        profile = np.abs(np.diff(y, axis=axis)).mean(axis=1 - axis)
        busy = float(np.percentile(profile, 90))
        out.append(float(np.mean(profile < 0.25 * busy)) if busy > 0 else 1.0)
    return float(np.mean(out))


def distinct_colors(x: np.ndarray) -> int:
    """Number of distinct 8-bit RGB colours (on every other pixel: enough to find a palette's colours,
    at a quarter of the cost). Photos have tens of thousands; a quantized image has its palette size."""
    u8 = (x[::2, ::2] * 255 + 0.5).astype(np.uint32)
    packed = (u8[..., 0] << 16) | (u8[..., 1] << 8) | u8[..., 2]
    return int(np.unique(packed).size)


def hard_saturation_clip(xmax: np.ndarray, xmin: np.ndarray) -> tuple[float, float]:
    """Saturated pixels (HSV saturation > 0.9, not dark) whose weakest channel is exactly 0 in 8 bits:
    (their share of all pixels, their share of the saturated pixels). Boosting saturation pushes every
    strong colour out of gamut, so its saturated regions are clipped throughout; a naturally vivid
    flower keeps a little of its weakest channel, so most of its saturated pixels are not hard-clipped.
    The second share is shrunk towards 0 (0.2 % of the image added to the count) when few pixels are
    saturated at all."""
    sat = (xmax > 0.15) & (xmax - xmin > 0.9 * xmax)
    hard = sat & (xmin < 0.5 / 255)
    n_hard = float(np.count_nonzero(hard))
    return n_hard / hard.size, n_hard / (float(np.count_nonzero(sat)) + 0.002 * hard.size)


# ------------------------------------------------------------------------------------ sharpening

def halo_overshoot(y: np.ndarray) -> float:
    """Over-sharpening halos: how far pixels next to strong edges overshoot the local range of a lightly
    smoothed copy, relative to the edge contrast. Unsharp masking pushes edge sides past their plateaus;
    natural edges stay inside them."""
    s = _blur(y, 2.0)
    kernel = np.ones((7, 7), np.uint8)
    hi, lo = cv2.dilate(s, kernel), cv2.erode(s, kernel)
    rng = hi - lo
    over = np.maximum(y - hi, 0) + np.maximum(lo - y, 0)
    edges = rng > max(0.08, float(np.percentile(rng, 90)))
    if edges.sum() < 50:
        return 0.0
    return float(over[edges].mean() / rng[edges].mean())


# ------------------------------------------------------------------------------------ directional blur, pure-primary colour
# Statistics that keep growing up to the strongest damage where the ones above level off. Motion blur
# removes detail along one direction only: the isotropic blur measures above see the sharp edges across it
# (level-5 motion blur read as level ~2). A strong saturation boost drives coloured pixels to pure primaries.

ORIENT_BINS = 36  # 5-degree orientation bins of the power spectrum


@lru_cache(maxsize=4)  # bounded: a batch of many image sizes must not keep every size's grids
def _spectrum_grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-frequency radius (cycles/px) and orientation bin of an h x w DFT (flat), and a Hann window."""
    fy, fx = np.fft.fftfreq(h)[:, None], np.fft.fftfreq(w)[None, :]
    bins = np.minimum((np.mod(np.arctan2(fy, fx), np.pi) / np.pi * ORIENT_BINS).astype(np.int32), ORIENT_BINS - 1)
    window = np.outer(np.hanning(h), np.hanning(w)).astype(np.float32)
    return np.hypot(fy, fx).ravel(), bins.ravel(), window


@lru_cache(maxsize=16)
def _band_bins(h: int, w: int, band: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The flat indices of an h x w DFT's frequencies in ``band``, their orientation bins and each bin's count."""
    radius, bins, _ = _spectrum_grid(h, w)
    idx = np.flatnonzero((radius >= band[0]) & (radius < band[1]))
    return idx, bins[idx], np.maximum(np.bincount(bins[idx], minlength=ORIENT_BINS), 1)


def _circular_mean(v: np.ndarray, half: int) -> np.ndarray:
    return np.convolve(np.concatenate([v[-half:], v, v[:half]]), np.ones(2 * half + 1) / (2 * half + 1), "valid")


# Frequency bands (cycles/px) of ``directional_detail``: fine, middle, and the coarse ones each is compared with.
FINE_BAND, MID_BAND = (0.18, 0.45), (0.07, 0.18)
COARSE_BANDS = ((0.01, 0.05), (0.01, 0.035))


def orientation_spectrum(y: np.ndarray, bands: Sequence[tuple[float, float]]) -> list[np.ndarray]:
    """Mean spectral power per 5-degree orientation bin in each frequency band (cycles/px) of the
    Hann-windowed luminance (the window keeps the image border from drawing a false cross). OpenCV's DFT:
    twice as fast as numpy's rfft2 here."""
    h, w = y.shape
    window = _spectrum_grid(h, w)[2]
    f = cv2.dft(np.ascontiguousarray((y - y.mean()) * window), flags=cv2.DFT_COMPLEX_OUTPUT)
    power = (f[..., 0] ** 2 + f[..., 1] ** 2).ravel()
    out = []
    for band in bands:
        idx, bins, counts = _band_bins(h, w, band)
        out.append(np.bincount(bins, weights=power[idx], minlength=ORIENT_BINS) / counts)
    return out


def _peak_over_median(v: np.ndarray) -> float:
    return float(v.max() - np.median(v))


def directional_detail(y: np.ndarray) -> tuple[float, float, float]:
    """Motion blur: (streak, fine peak, middle streak). A line blur multiplies the spectrum by a sinc
    across its direction, so detail survives in one orientation only (edges along the motion) and is lost
    in all others. *streak*: per orientation, fine-band over coarse-band power (log10), strongest
    orientation minus the median one; dividing by the same orientation's coarse power cancels the photo's
    own directional content (a horizon or blinds are strong at every scale), the coarse band averaged over
    +-20 degrees so its few frequencies do not make it noisy. *fine peak*: the same contrast on fine power
    alone, which keeps growing at the longest blurs, where the coarse band is damaged too. *middle streak*:
    the streak of the middle band, which long blurs empty down to the 8-bit rounding floor less than the
    fine one (where the kept orientation has little content of its own, the fine streak falls back)."""
    fine, mid, coarse, coarse_mid = (_circular_mean(v, half) for v, half in
                                     zip(orientation_spectrum(y, (FINE_BAND, MID_BAND) + COARSE_BANDS), (1, 1, 4, 4)))
    streak = np.log10((fine + 1e-12) / (coarse + 1e-12))
    streak_mid = np.log10((mid + 1e-12) / (coarse_mid + 1e-12))
    return _peak_over_median(streak), _peak_over_median(np.log10(fine + 1e-12)), _peak_over_median(streak_mid)


def colored_full_clip(xmax: np.ndarray, xmin: np.ndarray) -> float:
    """Over-saturation past ``hard_saturation_clip``: the share of visibly coloured pixels (HSV saturation
    > 0.15, value > 0.15) clipped at both ends, weakest channel exactly 0 and strongest 255 in 8 bits (a pure
    primary or secondary colour). ``hard_clip_share`` is ~0.9 from the first boost level on; this share
    keeps growing with the boost (corpus medians: level 3 ~2 %, level 4 ~9 %, level 5 ~15 %; clean photos,
    vivid flowers included, at most ~1.5 %). The count is shrunk towards 0 (0.2 % of the image added) when
    few pixels are coloured."""
    colored = (xmax > 0.15) & (xmax - xmin > 0.15 * xmax)
    full = colored & (xmin < 0.5 / 255) & (xmax > 254.5 / 255)
    return float(np.count_nonzero(full)) / (float(np.count_nonzero(colored)) + 0.002 * colored.size)


# ------------------------------------------------------------------------------------ shadows (under-exposure)


def shadow_texture(y255: np.ndarray, block: int = 8) -> float:
    """Median luma std (0-255) of the darkest quarter of ``block``-px blocks: how much detail the
    shadows hold. A gamma > 1 (darkening) compresses the dark tones' detail towards black (corpus
    medians 3.4 at the first `alt` darkening level, 0.7 at the fifth); a low-key photo keeps it (a dark
    forest ~6, moss in shade ~10), a smooth sky, backdrop or black background has none (~0-3)."""
    h, w = (y255.shape[0] // block) * block, (y255.shape[1] // block) * block
    size = (w // block, h // block)
    yc = np.ascontiguousarray(y255[:h, :w], dtype=np.float32)
    # Block means and mean squares by an area resize (exact box averages at an integer factor).
    m = cv2.resize(yc, size, interpolation=cv2.INTER_AREA).ravel()
    sd = np.sqrt(np.maximum(cv2.resize(yc * yc, size, interpolation=cv2.INTER_AREA).ravel() - m * m, 0))
    return float(np.median(sd[np.argsort(m)[: max(len(m) // 4, 1)]]))


# ------------------------------------------------------------------------------------ measure


def _chroma_planes(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.ascontiguousarray(x[..., 2] - y), np.ascontiguousarray(x[..., 0] - y)


MIN_SIDE = 24  # the noise statistics need whole 8×8 blocks clear of the border

# ------------------------------------------------------------------------------------ black point
# Brightening lifts the darkest tones most (a gamma < 1, a raised exposure or shadows curve), so the black point
# rises with it; a high-key photo (a white wall, a bright sky, a pale backdrop) may have hardly any dark area, yet
# it usually keeps a small dark subject or detail at full depth (a clock's hands, a lamp's fitting, cables).
# ``black_point`` is the luminance below which BLACK_POINT_PERCENT of the pixels lie: far enough into the tail
# to see such a small subject (the 5th percentile sees only the bright backdrop), measured in the same call as
# the other luminance percentiles. The percentile was chosen by nested leave-one-source-out (benchmarks/RESULTS.md,
# issue 10 part 4).
BLACK_POINT_PERCENT = 0.1


def measure(image: ImageLike) -> dict[str, float]:
    """No-reference statistics of one image (see the module docstring for units and working size)."""
    x = in_8bit_steps(at_working_size(as_float_rgb(image)))
    if min(x.shape[:2]) < MIN_SIDE:
        raise ValueError(f"the image is {x.shape[1]}×{x.shape[0]} px: too small for the offline analyst's "
                         f"statistics (at least {MIN_SIDE} px a side)")
    y = luma(x)
    y255 = y * 255
    f, m, c = band_energies(y)
    block_sigmas = noise_sigma_blocks(y) * 255
    p = np.percentile(y255, [1, 5, 10, 50, 90, 95, 99, BLACK_POINT_PERCENT])
    xmax, xmin = channel_range(x)
    chroma = xmax - xmin
    smooth_chroma = _smooth_chroma(x) * 255
    cb, cr = _chroma_planes(x, y)
    hard_clip, hard_clip_share = hard_saturation_clip(xmax, xmin)
    local_std = np.sqrt(np.maximum(_blur(y * y, 3.0) - _blur(y, 3.0) ** 2, 0)) * 255
    streak, fine_peak, streak_mid = directional_detail(y)
    noise_scales = noise_sigma_across_scales(y255)
    return {
        # blur / detail
        "lap_var": float(cv2.Laplacian(y255, cv2.CV_32F).var()),
        "reblur": reblur_score(y),
        "fine_to_mid": float(np.log10((f + 1e-9) / (m + 1e-9))),
        "fine_to_mid_net": fine_to_mid_net_of_noise(f, m, noise_scales),
        "mid_to_coarse": float(np.log10((m + 1e-9) / (c + 1e-9))),
        "edge_sharp": edge_sharpness(y),
        "fine_conc": fine_band_concentration(y),
        # noise
        "noise_flat": float(np.percentile(block_sigmas, 10)),
        "noise_scales": noise_scales,
        "dead_flat": dead_flat_share(y255),
        "impulse": impulse_fraction(x),
        "chroma_noise": float(np.percentile(noise_sigma_blocks(cb), 10) + np.percentile(noise_sigma_blocks(cr), 10)) * 127.5,
        # compression
        "blockiness": blockiness(y),
        "jpeg_grid": jpeg_grid(y),
        "flat_frac": flat_fraction(y),
        "grid_sparsity": grid_sparsity(y),
        # brightness
        "mean_luma": float(y255.mean()),
        "p01": float(p[0]), "p05": float(p[1]), "p10": float(p[2]), "median_luma": float(p[3]),
        "p90": float(p[4]), "p95": float(p[5]), "p99": float(p[6]),
        "black_point": float(p[7]),  # see BLACK_POINT_PERCENT
        "clip_low": float(np.mean(y255 < 2.5)),
        "clip_high": float(np.mean(y255 > 252.5)),
        "dark_frac": float(np.mean(y255 < 25)),
        "bright_frac": float(np.mean(y255 > 230)),
        # shadows (see their block above)
        "shadow_texture": shadow_texture(y255),
        # contrast
        "rms_contrast": float(y255.std()),
        "local_contrast": float(np.median(local_std)),
        # colour
        "colorfulness": colorfulness(x),
        "chroma_smooth_p95": float(np.percentile(smooth_chroma, 95)),
        "chroma_smooth_mean": float(smooth_chroma.mean()),
        # Strong colours pushed out of gamut: a channel clipped at 0 or 255 while chroma is high.
        "gamut_clip": float(np.mean(((xmax > 0.995) | (xmin < 0.005)) & (chroma > 0.4))),
        "hard_clip": hard_clip, "hard_clip_share": hard_clip_share,
        "occupancy": level_occupancy(x),
        "colors": float(distinct_colors(x)),
        # sharpening
        "overshoot": halo_overshoot(y),
        # directional blur, pure-primary colour (see their block above)
        "motion_streak": streak, "fine_orient_peak": fine_peak, "motion_streak_mid": streak_mid,
        "colored_full_clip": colored_full_clip(xmax, xmin),
    }


# ------------------------------------------------------------------------------------ full reference

def best_blur_fit(yd: np.ndarray, yr: np.ndarray) -> tuple[float, float]:
    """Which Gaussian blur of the reference comes closest to the image, and what share of the
    difference it explains. Blur is explained almost fully; compression, noise and tone changes are not."""
    base = float(np.mean((yd - yr) ** 2))
    if base <= 1e-10:
        return 0.0, 0.0
    best_sigma, best_err = 0.0, base
    for sigma in (0.5, 0.8, 1.2, 1.8, 2.7, 4.0, 6.0):
        err = float(np.mean((yd - _blur(yr, sigma)) ** 2))
        if err < best_err:
            best_sigma, best_err = sigma, err
    return best_sigma, 1.0 - best_err / base


def _mse(a: np.ndarray, b: np.ndarray) -> float:
    """Mean squared difference, in one pass without temporaries (the fits below call it ~30 times)."""
    return cv2.norm(a, b, cv2.NORM_L2SQR) / a.size


# Block sizes (px) the pixelation fit tries: every size a benchmark or a user's mosaic filter is likely
# to use, fractional ones included (a resize to round(w / b) columns makes non-integer blocks).
PIXEL_BLOCKS = (2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0)


def best_pixelate_fit(yd: np.ndarray, yr: np.ndarray) -> tuple[float, float]:
    """Which block-average-and-upsample of the reference comes closest to the image: (block size, share
    of the difference it explains), (0, 0) when none comes closer than the reference itself. The block
    size grows with the damage whatever the photo; the grid statistics (``grid_sparsity``, ``jpeg_grid``)
    do not: an 8 px mosaic draws exactly JPEG's grid. Assumes the grid starts at the top-left pixel (as
    resize-based mosaics do)."""
    base = _mse(yd, yr)
    if base <= 1e-10:
        return 0.0, 0.0
    h, w = yr.shape
    best_b, best_err = 0.0, base
    for b in PIXEL_BLOCKS:
        small = cv2.resize(yr, (max(1, round(w / b)), max(1, round(h / b))), interpolation=cv2.INTER_AREA)
        err = _mse(yd, cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST))
        if err < best_err:
            best_b, best_err = b, err
    return best_b, 1.0 - best_err / base


MOTION_ANGLES = 12                              # every 15 degrees
MOTION_LENGTHS = (2.0, 3.0, 5.0, 7.0, 10.0, 14.0)  # at half resolution: 4-28 px at full size


def _line_kernel(length: float, angle: float) -> np.ndarray:
    """A normalized anti-aliased line of ``length`` px at ``angle`` (radians): drawn 8x larger, area-reduced."""
    k = int(np.ceil(length)) | 1
    fine = 8
    c = (k * fine - 1) / 2
    half = (length - 1) * fine / 2
    dx, dy = half * np.cos(angle), half * np.sin(angle)
    canvas = np.zeros((k * fine, k * fine), np.float32)
    cv2.line(canvas, (round(c - dx), round(c - dy)), (round(c + dx), round(c + dy)), 1.0, thickness=fine)
    kernel = cv2.resize(canvas, (k, k), interpolation=cv2.INTER_AREA)
    return kernel / kernel.sum()


def best_motion_fit(yd: np.ndarray, yr: np.ndarray) -> tuple[float, float]:
    """Which straight-line (motion) blur of the reference comes closest to the image: (length in px at
    the image's scale, share of the difference explained), (0, 0) when none helps. An isotropic fit
    (``best_blur_fit``) measures a motion blur by how much it happens to cross the photo's edges, which
    changes with the angle; the line fit finds the angle, so its length grows with the blur whatever the
    direction. Fitted at half resolution (a quarter of the pixels; lengths 4-28 px at full size) and
    coarse to fine (the angle at a middle length, the length at that angle, then the neighbouring
    angles, then a length between grid lengths): 21-23 filterings instead of 72."""
    ds, rs = (cv2.resize(v, (v.shape[1] // 2, v.shape[0] // 2), interpolation=cv2.INTER_AREA) for v in (yd, yr))
    base = _mse(ds, rs)
    if base <= 1e-10:
        return 0.0, 0.0
    errs: dict[tuple[float, int], float] = {}

    def err(length: float, i: int) -> float:
        i %= MOTION_ANGLES
        if (length, i) not in errs:
            k = _line_kernel(length, np.pi * i / MOTION_ANGLES)
            errs[length, i] = _mse(ds, cv2.filter2D(rs, -1, k, borderType=cv2.BORDER_REFLECT))
        return errs[length, i]

    angle = min(range(MOTION_ANGLES), key=lambda i: err(MOTION_LENGTHS[3], i))
    length = min(MOTION_LENGTHS, key=lambda v: err(v, angle))
    angle = min((angle - 1, angle, angle + 1), key=lambda i: err(length, i))
    # Between grid lengths: the vertex of the parabola through the best length and its neighbours (the three
    # end lengths at an end of the grid), tried with one more filtering and kept only if it fits better. On the
    # grid alone, blurs of 20 and 25 px both fitted 20 px, and the longer one then looked milder (20 px
    # explains less of it).
    c = min(max(MOTION_LENGTHS.index(length), 1), len(MOTION_LENGTHS) - 2)
    (x0, x1, x2), (e0, e1, e2) = MOTION_LENGTHS[c - 1:c + 2], [err(v, angle) for v in MOTION_LENGTHS[c - 1:c + 2]]
    if (e0 - e1) / (x1 - x0) + (e2 - e1) / (x2 - x1) > 0:  # convex: the parabola has a minimum
        vertex = x1 + 0.5 * ((e0 - e1) * (x2 - x1) ** 2 - (e2 - e1) * (x1 - x0) ** 2) / (
            (e0 - e1) * (x2 - x1) + (e2 - e1) * (x1 - x0))
        vertex = float(min(max(vertex, x0), x2))
        if err(vertex, angle) < err(length, angle):
            length = vertex
    best = err(length, angle)
    if best >= base:
        return 0.0, 0.0
    return 2 * length, 1.0 - best / base


def fr_fidelity(xd: np.ndarray, xr: np.ndarray, yd: np.ndarray, yr: np.ndarray) -> dict[str, float]:
    """FR statistics that grow with the damage within one photo and type (what ranking a distortion's
    levels needs): the pixelation and motion-blur fits, and a colour error on chroma alone."""
    block, block_explained = best_pixelate_fit(yd, yr)
    length, length_explained = best_motion_fit(yd, yr)
    cd, cr = (_chroma_planes(v, y) for v, y in ((xd, yd), (xr, yr)))
    return {
        "fr_pixel_block": block, "fr_pixel_explained": block_explained,
        "fr_motion_len": length, "fr_motion_explained": length_explained,
        # Mean absolute change of the two colour-difference planes (0-255): hue and saturation, not tone.
        "fr_chroma_err": float((np.abs(cd[0] - cr[0]).mean() + np.abs(cd[1] - cr[1]).mean()) * 127.5),
    }


def measure_fr(image: ImageLike, reference: ImageLike, image_stats: Optional[dict] = None,
               reference_stats: Optional[dict] = None) -> dict[str, float]:
    """Full-reference comparison statistics (image vs its pristine reference), prefixed ``fr_``.

    Most are differences of the two images' ``measure`` statistics (pass them in when already computed,
    to save ~60 ms each); the rest compare the pixels directly. Raises ValueError when the sizes differ
    (a reference must be pixel-aligned to be compared)."""
    xd, xr = as_float_rgb(image), as_float_rgb(reference)
    if xd.shape != xr.shape:
        raise ValueError(f"image {xd.shape[1]}x{xd.shape[0]} and reference {xr.shape[1]}x{xr.shape[0]} differ in size")
    xd, xr = (in_8bit_steps(at_working_size(v)) for v in (xd, xr))  # both alike, so they stay pixel-aligned
    d = image_stats or measure(xd)
    r = reference_stats or measure(xr)
    yd, yr = luma(xd), luma(xr)
    # Residual after the best global gain/offset: what a tone change cannot explain.
    cov = float(np.mean((yr - yr.mean()) * (yd - yd.mean())))
    gain = cov / max(float(yr.var()), 1e-12)
    resid = yd - yd.mean() - gain * (yr - yr.mean())
    detail = yr - _blur(yr, 1.5)
    denom = float(np.sqrt((resid ** 2).sum() * (detail ** 2).sum()))
    sigma, explained = best_blur_fit(yd, yr)
    # Band gains relative to the coarse band, so a global contrast change cancels out.
    fine = lambda s: s["fine_to_mid"] + s["mid_to_coarse"]  # noqa: E731  log10(fine / coarse)
    return {
        "fr_mean_shift": d["mean_luma"] - r["mean_luma"],
        "fr_median_shift": d["median_luma"] - r["median_luma"],
        "fr_spread_ratio": float(np.log2(max(d["p90"] - d["p10"], 0.5) / max(r["p90"] - r["p10"], 0.5))),
        "fr_contrast_ratio": float(np.log2(max(d["rms_contrast"], 0.03) / max(r["rms_contrast"], 0.03))),
        "fr_fine_gain": fine(d) - fine(r),
        "fr_mid_gain": d["mid_to_coarse"] - r["mid_to_coarse"],
        "fr_detail_corr": float((resid * detail).sum() / denom) if denom > 0 else 0.0,
        "fr_blur_sigma": sigma,
        "fr_blur_explained": explained,
        "fr_noise": float(np.percentile(noise_sigma_blocks(resid) * 255, 25)),
        "fr_chroma_noise_gain": d["chroma_noise"] - r["chroma_noise"],
        "fr_block_gain": d["blockiness"] - r["blockiness"],
        "fr_jpeg_grid_gain": d["jpeg_grid"] - r["jpeg_grid"],
        "fr_impulse_gain": d["impulse"] - r["impulse"],
        # On smoothed copies: added noise has chroma too, but no coherent colour.
        "fr_chroma_ratio": float(np.log2((d["chroma_smooth_mean"] + 4) / (r["chroma_smooth_mean"] + 4))),
        "fr_ref_chroma": r["chroma_smooth_p95"],
        "fr_occupancy_ratio": d["occupancy"] / max(r["occupancy"], 1e-6),
        "fr_overshoot_gain": d["overshoot"] - r["overshoot"],
        "fr_conc_gain": d["fine_conc"] - r["fine_conc"],
        "fr_color_err": float(np.abs(xd - xr).mean() * 255),
        "fr_flat_gain": d["flat_frac"] - r["flat_frac"],
        "fr_grid_gain": d["grid_sparsity"] - r["grid_sparsity"],
        "fr_colors_ratio": float(np.log10(max(d["colors"], 1) / max(r["colors"], 1))),
        # Colours pushed to pure primaries/secondaries that were not: keeps growing with a saturation boost of a
        # photo whose colours already sit at the gamut edge, where the chroma can hardly rise (fr_chroma_ratio).
        "fr_colored_clip_gain": d["colored_full_clip"] - r["colored_full_clip"],
        **fr_fidelity(xd, xr, yd, yr),
    }
