"""pyiqa's full-reference `nlpd`, `gmsd`, `psnr`, `fsim` and `vif` (default options) in NumPy/OpenCV, no torch.

The offline FR path (FSIM and VIF by default) and users' FR picks run these weight-free metrics; through pyiqa a
cold call first imports torch and pyiqa (~3 s and ~800 MB), and pyiqa's formulations spend more time than the
maths needs (issue 14; benchmarks/RESULTS.md has the figures).
A sibling of iqa_tools.nss (the NR statistics) rather than part of it: these compare two images and share
nothing with the NSS fits but the colour conversion, which they import from there.

Each function computes what pyiqa/archs/{nlpd,gmsd,psnr,fsim,vif}_arch.py compute, vectorized, in float32 as
pyiqa does for float32 input tensors (VIF's statistics in float64: see vif); quirks of pyiqa's code that
change scores are kept and marked "as pyiqa". tests/test_kernels.py compares the scores on odd sizes,
greyscale and float input: NLPD, GMSD, PSNR, FSIM equal pyiqa's to < 2e-7 relative, VIF to its float32 noise.

Inputs are (distorted, reference) H×W×3 pixel arrays as iqa_tools.images decodes them (uint8, or float32
in [0, 1]), of the same shape.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np
import scipy.fft

from iqa_tools.nss import F32, to_float, y255, y_channel


def _same_shape(x: np.ndarray, ref: np.ndarray) -> None:
    if x.shape != ref.shape:
        raise ValueError(f"image {x.shape} and reference {ref.shape} pixels should have the same shape")


def _correlate(img: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """`F.conv2d(img, kernel, padding=k//2)` with zero padding (a cross-correlation, as torch's), same size."""
    return cv2.filter2D(img, -1, kernel, borderType=cv2.BORDER_CONSTANT)


# ── NLPD ─────────────────────────────────────────────────────────────────────────────────────────

_LAPLACIAN = np.array([
    [0.0025, 0.0125, 0.0200, 0.0125, 0.0025],
    [0.0125, 0.0625, 0.1000, 0.0625, 0.0125],
    [0.0200, 0.1000, 0.1600, 0.1000, 0.0200],
    [0.0125, 0.0625, 0.1000, 0.0625, 0.0125],
    [0.0025, 0.0125, 0.0200, 0.0125, 0.0025],
], dtype=F32)
# Divisive-normalization neighbourhoods and constants per level (the last: the low-pass residual).
# pyiqa correlates with each filter rotated by 180° (MATLAB's conv2): stored here already flipped.
_DN_FILTERS = [np.flip(np.array(f, dtype=F32)).copy() for f in (
    [[0, 0.1011, 0], [0.1493, 0, 0.1460], [0, 0.1015, 0.0]],
    [[0, 0.0757, 0], [0.1986, 0, 0.1846], [0, 0.0837, 0]],
    [[0, 0.0477, 0], [0.2138, 0, 0.2243], [0, 0.0467, 0]],
    [[0, 0, 0], [0.2503, 0, 0.2616], [0, 0, 0]],
    [[0, 0, 0], [0.2598, 0, 0.2552], [0, 0, 0]],
    [[0, 0, 0], [0.2215, 0, 0.0717], [0, 0, 0]],
)]
_DN_SIGMAS = [F32(s) for s in (0.0248, 0.0185, 0.0179, 0.0191, 0.0220, 0.2782)]
_NLPD_LEVELS = 6


def _nlpd_pyramid(img: np.ndarray) -> list[np.ndarray]:
    """pyiqa NLPD.pyramid for one H×W float32 plane: 5 normalized Laplacian bands and the residual."""
    out = []
    j = img
    for level in range(_NLPD_LEVELS - 1):
        h, w = j.shape
        # Down: symmetric padding of 2 (ExactPadding2d(5, 'symmetric')), 5×5 filter, stride 2.
        low = cv2.filter2D(np.pad(j, 2, mode="symmetric"), -1, _LAPLACIAN, borderType=cv2.BORDER_CONSTANT)
        low = np.ascontiguousarray(low[2:-2:2, 2:-2:2])
        # Up, as pyiqa: replicate-pad the low band by 1, put 4× its values on a zero-interleaved grid
        # (PixelShuffle), filter with zero padding, then crop back to J's size.
        lp = np.pad(low, 1, mode="edge")
        up = np.zeros((2 * lp.shape[0], 2 * lp.shape[1]), F32)
        up[::2, ::2] = lp * F32(4)
        up = _correlate(up, _LAPLACIAN)[2:2 + h, 2:2 + w]
        band = j - up
        out.append(band / (_DN_SIGMAS[level] + _correlate(np.abs(band), _DN_FILTERS[level])))
        j = low
    out.append(j / (_DN_SIGMAS[-1] + _correlate(np.abs(j), _DN_FILTERS[-1])))
    return out


def nlpd(x: np.ndarray, ref: np.ndarray) -> float:
    """pyiqa `nlpd` (channels=1, Y of YIQ in [0, 1], unrounded as pyiqa's default to_y_channel): the mean over
    the 6 levels of the RMS difference of the two normalized Laplacian pyramids. Lower is better."""
    _same_shape(x, ref)
    a = _nlpd_pyramid(y_channel(to_float(x)))
    b = _nlpd_pyramid(y_channel(to_float(ref)))
    rms = [np.sqrt(np.mean(np.square(p - q), dtype=np.float64)) for p, q in zip(a, b)]
    return float(np.mean(rms))


# ── GMSD ─────────────────────────────────────────────────────────────────────────────────────────

_PREWITT_X = (np.array([[1, 0, -1]] * 3, dtype=F32) / F32(3))  # torch.Tensor(...) / 3.0: float32 weights
_PREWITT_Y = np.ascontiguousarray(_PREWITT_X.T)
_GMSD_T = F32(170)


def _gradient_magnitude(y: np.ndarray) -> np.ndarray:
    """pyiqa's gmsd on one Y plane (0–255, rounded): 2×2 mean with stride 2 (odd last row / column dropped,
    as pyiqa's valid convolution), then the Prewitt magnitude with zero padding of 1."""
    h, w = y.shape[0] // 2 * 2, y.shape[1] // 2 * 2
    y = y[:h, :w]
    # Sums of four integers ×0.25: exact in float32, so equal to pyiqa's convolution bit for bit.
    half = (y[0::2, 0::2] + y[0::2, 1::2] + y[1::2, 0::2] + y[1::2, 1::2]) * F32(0.25)
    ix, iy = _correlate(half, _PREWITT_X), _correlate(half, _PREWITT_Y)
    return np.sqrt(ix * ix + iy * iy + F32(1e-12))


def gmsd(x: np.ndarray, ref: np.ndarray) -> float:
    """pyiqa `gmsd` (test_y_channel=True: Y of YIQ ×255, rounded): the standard deviation (unbiased, as
    torch.std) of the gradient-magnitude similarity map. Lower is better."""
    _same_shape(x, ref)
    g1, g2 = _gradient_magnitude(y255(x)), _gradient_magnitude(y255(ref))
    quality = (F32(2) * g1 * g2 + _GMSD_T) / (g1 * g1 + g2 * g2 + _GMSD_T)
    return float(np.std(quality, ddof=1, dtype=np.float64))


# ── PSNR ─────────────────────────────────────────────────────────────────────────────────────────


def psnr(x: np.ndarray, ref: np.ndarray) -> float:
    """pyiqa `psnr` (test_y_channel=False, data_range 1, eps 1e-8): over all three RGB channels of the
    [0, 1] float32 pixels; identical images give 80 dB (the eps), as pyiqa."""
    _same_shape(x, ref)
    mse = np.mean(np.square(to_float(x) - to_float(ref)), dtype=np.float64)
    return float(10 * np.log10(1.0 / (mse + 1e-8)))


# ── FSIM ─────────────────────────────────────────────────────────────────────────────────────────

_EPS32 = np.finfo(F32).eps  # pyiqa's EPS (torch.finfo(float32).eps), in its similarity maps and sums
_PC_SCALES, _PC_ORIENTS, _PC_MIN_LENGTH, _PC_MULT, _PC_SIGMA_F, _PC_DELTA_THETA, _PC_K = 4, 4, 6, 2, 0.55, 1.2, 2.0
_SCHARR_X = np.array([[-3.0, 0.0, 3.0], [-10.0, 0.0, 10.0], [-3.0, 0.0, 3.0]], dtype=F32) / F32(16)
_SCHARR_Y = np.ascontiguousarray(_SCHARR_X.T)


def _centred_axis(n: int) -> np.ndarray:
    """pyiqa's get_meshgrid axis: frequencies centred on 0, divided by n - 1 for odd n (as pyiqa), else n."""
    if n % 2:
        return np.arange(-(n - 1) / 2, n / 2).astype(F32) / F32(n - 1)
    return np.arange(-n / 2, n / 2).astype(F32) / F32(n)


def _ifftshift(a: np.ndarray) -> np.ndarray:
    return np.roll(a, [-(n // 2) for n in a.shape], axis=(0, 1))  # pyiqa's ifftshift: roll by -(n // 2)


@lru_cache(maxsize=8)
def _pc_filters(h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """pyiqa's _construct_filters for an h×w plane — (orientations, scales, h, w) log-Gabor filters, float32 —
    and what _phase_congruency derives from the filters alone, per orientation: the smallest scale's energy
    em_n, and the spatial filters' Σ a_n² and Σ a_i·a_j. They depend on the size only, so they are kept."""
    gx, gy = np.meshgrid(_centred_axis(h), _centred_axis(w), indexing="ij")
    radius = np.sqrt(gx * gx + gy * gy)
    lowpass = _ifftshift(F32(1) / (F32(1) + (radius / F32(0.45)) ** 30))  # Butterworth, cutoff 0.45, n 15
    theta = _ifftshift(np.arctan2(-gy, gx))
    radius = _ifftshift(radius)
    radius[0, 0] = 1
    sin_t, cos_t = np.sin(theta), np.cos(theta)
    log_gabor = []
    for s in range(_PC_SCALES):
        omega_0 = F32(1.0 / (_PC_MIN_LENGTH * _PC_MULT ** s))
        g = np.exp(-(np.log(radius / omega_0) ** 2) / F32(2 * math.log(_PC_SIGMA_F) ** 2)) * lowpass
        g[0, 0] = 0
        log_gabor.append(g)
    theta_sigma = math.pi / (_PC_ORIENTS * _PC_DELTA_THETA)
    spread = []
    for o in range(_PC_ORIENTS):
        angle = o * math.pi / _PC_ORIENTS
        ds = sin_t * F32(math.cos(angle)) - cos_t * F32(math.sin(angle))
        dc = cos_t * F32(math.cos(angle)) + sin_t * F32(math.sin(angle))
        dtheta = np.abs(np.arctan2(ds, dc))
        spread.append(np.exp(-(dtheta ** 2) / F32(2 * theta_sigma ** 2)))
    filters = np.stack(spread)[:, None] * np.stack(log_gabor)[None]  # (orientations, scales, h, w)
    em_n = (filters[:, 0] ** 2).sum(axis=(-2, -1), dtype=F32)
    spatial = (scipy.fft.ifft2(filters).real * F32(math.sqrt(h * w))).astype(F32)
    sum_an2 = (spatial ** 2).sum(axis=1).sum(axis=(-2, -1), dtype=F32)
    sum_ai_aj = sum((spatial[:, s:s + 1] * spatial[:, s + 1:]).sum(axis=1) for s in range(_PC_SCALES - 1)).sum(axis=(-2, -1), dtype=F32)
    return filters, em_n, sum_an2, sum_ai_aj


def _phase_congruency(lum: np.ndarray) -> np.ndarray:
    """pyiqa's _phase_congruency for one H×W float32 plane (Kovesi's, 4 scales × 4 orientations)."""
    filters, em_n, sum_an2, sum_ai_aj = _pc_filters(*lum.shape)
    eo = scipy.fft.ifft2(scipy.fft.fft2(lum) * filters)  # complex64: even (real) and odd (imaginary) responses
    an = np.abs(eo)
    total = eo.sum(axis=1, keepdims=True)  # Σ over scales of even + i·odd
    mean = total / (np.abs(total) + _EPS32)  # (mean_e + i·mean_o)
    # pyiqa's even·mean_e + odd·mean_o − |even·mean_o − odd·mean_e| is Re(z) − |Im(z)| of z = eo·conj(mean).
    z = eo * mean.conj()
    energy = (z.real - np.abs(z.imag)).sum(axis=1)
    # Noise estimate from the smallest scale: torch.median is the lower middle value for an even count (as pyiqa).
    e2 = (an[:, 0] ** 2).reshape(_PC_ORIENTS, -1)
    mid = (e2.shape[1] - 1) // 2
    median_e2n = np.partition(e2, mid, axis=1)[:, mid]
    noise_power = (-median_e2n / F32(math.log(0.5))) / em_n
    tau = np.sqrt((F32(2) * noise_power * sum_an2 + F32(4) * noise_power * sum_ai_aj) / F32(2))
    threshold = (tau * F32(math.sqrt(math.pi / 2)) + F32(_PC_K) * np.sqrt(F32(2 - math.pi / 2) * tau ** 2)) / F32(1.7)
    energy = np.maximum(energy - threshold[:, None, None], F32(0))
    return (energy.sum(axis=0) + _EPS32) / (an.sum(axis=(0, 1)) + _EPS32)


def _similarity(a: np.ndarray, b: np.ndarray, constant: float) -> np.ndarray:
    """pyiqa's similarity_map (alpha 0)."""
    return (F32(2) * a * b + F32(constant)) / (a * a + b * b + F32(constant) + _EPS32)


def _fsim_planes(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Y, I, Q) of YIQ at 0–255 after pyiqa's avg_pool2d by round(min side / 256) (partial blocks dropped)."""
    rgb = to_float(pixels) * F32(255)
    k = max(1, round(min(rgb.shape[:2]) / 256))  # Python's round, as pyiqa: 384 / 256 = 1.5 → 2
    if k > 1:  # summed in the window's row-major order, then divided, as torch's avg_pool2d
        h, w = rgb.shape[0] // k * k, rgb.shape[1] // k * k
        acc = rgb[0:h:k, 0:w:k].copy()
        for a in range(k):
            for b in range(k):
                if a or b:
                    acc += rgb[a:h:k, b:w:k]
        rgb = acc / F32(k * k)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y = (r * F32(0.299) + g * F32(0.587)) + b * F32(0.114)
    i = (r * F32(0.5959) + g * F32(-0.2746)) + b * F32(-0.3213)
    q = (r * F32(0.2115) + g * F32(-0.5227)) + b * F32(0.3112)
    return y, i, q


def _gradient(lum: np.ndarray) -> np.ndarray:
    gx, gy = _correlate(lum, _SCHARR_X), _correlate(lum, _SCHARR_Y)
    return np.sqrt(gx * gx + gy * gy + _EPS32)  # pyiqa's gradient_map (safe_sqrt)


def fsim(x: np.ndarray, ref: np.ndarray) -> float:
    """pyiqa `fsim` (chromatic=True: FSIMc): phase congruency and gradient similarity of the luminance,
    weighted by the larger phase congruency, times the I/Q chroma similarity to the power 0.03."""
    _same_shape(x, ref)
    (y1, i1, q1), (y2, i2, q2) = _fsim_planes(x), _fsim_planes(ref)
    pc1, pc2 = _phase_congruency(y1), _phase_congruency(y2)
    pc_max = np.maximum(pc1, pc2)
    score = _similarity(_gradient(y1), _gradient(y2), 160) * _similarity(pc1, pc2, 0.85) * pc_max
    score = score * np.abs(_similarity(i1, i2, 200) * _similarity(q1, q2, 200)) ** F32(0.03)
    return float(score.sum(dtype=np.float64) / pc_max.sum(dtype=np.float64))


# ── VIF ──────────────────────────────────────────────────────────────────────────────────────────


@lru_cache(maxsize=1)
def _sp5_filters() -> dict[str, np.ndarray]:
    """The steerable pyramid's sp5 filters (hi0filt, lo0filt, lofilt, bfilts) as pyiqa's vif_arch.sp5_filters
    defines them, read from that installed file's literals: importing the module would import torch, and
    copying its ~480 coefficients here would keep a second copy of data pyiqa owns."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("pyiqa")  # a top-level package is located without being imported
    if spec is None or spec.origin is None:
        raise ValueError("VIF needs pyiqa installed (its sp5 pyramid filters are read from pyiqa/archs/vif_arch.py)")
    path = Path(spec.origin).parent / "archs" / "vif_arch.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def array(node: ast.expr) -> np.ndarray:
        if isinstance(node, ast.Call) and node.args:  # np.array([...])
            return np.array(ast.literal_eval(node.args[0]), dtype=np.float64)
        if isinstance(node, ast.Attribute) and node.attr == "T":  # bfilts = np.array([...]).T
            return array(node.value).T
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.left, ast.Constant):
            return node.left.value * array(node.right)  # lofilt = 2 * np.array([...])
        raise ValueError(f"{path}: sp5_filters has an entry this reader does not know ({ast.dump(node)[:80]})")

    out: dict[str, np.ndarray] = {}
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "sp5_filters":
            for node in fn.body:
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                    key = ast.literal_eval(node.targets[0].slice)
                    if key in ("hi0filt", "lo0filt", "lofilt", "bfilts"):
                        out[key] = array(node.value)
    shapes = {k: v.shape for k, v in out.items()}
    if shapes != {"hi0filt": (9, 9), "lo0filt": (5, 5), "lofilt": (9, 9), "bfilts": (49, 6)}:
        raise ValueError(f"{path}: unexpected sp5 filters {shapes}")
    return out


def _corr_reflect(img: np.ndarray, filt: np.ndarray, step: int = 1) -> np.ndarray:
    """pyiqa vif_arch.corrDn: 'reflect' padding by (k − 1) / 2, correlation with the filter as pyiqa rounds it
    (float32), then the stride."""
    out = cv2.filter2D(img, -1, filt.astype(F32).astype(img.dtype), borderType=cv2.BORDER_REFLECT_101)
    return out[::step, ::step] if step > 1 else out


def _vif_subbands(img: np.ndarray) -> dict[int, np.ndarray]:
    """The bands of pyiqa's SteerablePyramidSpace(height 4, order 5) that its vif reads, keyed by vif's
    subband numbers (1-based positions in pyiqa's reversed list [low-pass, level 4 orientations 5…0, …,
    level 1 orientations 5…0, hi0]), float32 as pyiqa's.

    Subband s is level 1 + (25 − s) // 6, orientation (25 − s) % 6: vif's 4, 7, …, 25 are orientations 3 and
    0 of each level, so only those are filtered (pyiqa filters all 26 bands and reads 8)."""
    f = _sp5_filters()
    wanted = {(1 + (25 - s) // 6, (25 - s) % 6): s for s in _VIF_SUBBANDS}
    out = {}
    lo = _corr_reflect(img, f["lo0filt"])
    for level in range(1, 5):
        for b in range(6):
            if (level, b) in wanted:
                out[wanted[(level, b)]] = _corr_reflect(lo, f["bfilts"][:, b].reshape(7, 7).T)
        if level < 4:
            lo = _corr_reflect(lo, f["lofilt"], step=2)
    return out


_VIF_SUBBANDS, _VIF_M, _VIF_SIGMA_NSQ, _VIF_TOL = (4, 7, 10, 13, 16, 19, 22, 25), 3, 0.4, 1e-12


def _vif_channel(ref: np.ndarray, dist: np.ndarray, winsize: int) -> tuple[np.ndarray, np.ndarray]:
    """pyiqa VIF.vifsub_est_M for one subband: the gain g and noise variance vv of the distortion channel,
    on the M×M grid (window sums sampled from row/column 1 every M)."""
    m = _VIF_M
    sel = (slice(1, ref.shape[0] - 1, m), slice(1, ref.shape[1] - 1, m))
    n = winsize * winsize

    def window_sum(img: np.ndarray) -> np.ndarray:  # pyiqa's correlation with ones(winsize²), reflect-padded:
        # a box filter (running sums, O(1) per pixel instead of 289 taps for the finest bands' 17×17 window)
        return cv2.boxFilter(img, -1, (winsize, winsize), normalize=False, borderType=cv2.BORDER_REFLECT_101)[sel]

    w_mean = float(F32(1.0 / n))  # pyiqa's mean window: ones / n rounded to float32
    mean_x, mean_y = window_sum(ref) * w_mean, window_sum(dist) * w_mean
    cov_xy = window_sum(ref * dist) - n * mean_x * mean_y
    ss_x = np.maximum(window_sum(ref * ref) - n * mean_x * mean_x, 0)
    ss_y = np.maximum(window_sum(dist * dist) - n * mean_y * mean_y, 0)
    g = cov_xy / (ss_x + _VIF_TOL)
    vv = (ss_y - g * cov_xy) / n
    flat_x, flat_y = ss_x < _VIF_TOL, ss_y < _VIF_TOL
    g[flat_x] = 0  # the masking order is pyiqa's
    vv[flat_x] = ss_y[flat_x]
    g[flat_y] = 0
    vv[flat_y] = 0
    vv[g < 0] = ss_y[g < 0]
    g = np.maximum(g, 0)
    vv[vv < _VIF_TOL] = _VIF_TOL
    return g, vv


def _vif_reference(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pyiqa VIF.refparams_vecgsm for one subband: (ss, eigenvalues of the 3×3-neighbourhood covariance)."""
    m = _VIF_M
    h, w = y.shape
    # Neighbourhood vectors, one row per offset: column offset j outer, row offset k inner, as pyiqa stacks them.
    nb = np.empty((m * m, (h - m + 1) * (w - m + 1)))
    for r, (j, k) in enumerate((j, k) for j in range(m) for k in range(m)):
        nb[r] = y[k:h - (m - k) + 1, j:w - (m - j) + 1].reshape(-1)
    nb -= nb.mean(axis=1, keepdims=True)
    cu = (nb @ nb.T) / nb.shape[1]
    grid = np.stack([y[k:h + 1:m, j:w + 1:m].reshape(-1) for j in range(m) for k in range(m)], axis=0)
    ss = ((np.linalg.pinv(cu, rcond=1e-15) @ grid) * grid).sum(axis=0) / (m * m)  # torch.pinverse's cut-off
    return ss.reshape(h // m, w // m), np.linalg.eigvalsh(cu, UPLO="U")


def vif(x: np.ndarray, ref: np.ndarray) -> float:
    """pyiqa `vif` (Y of YIQ ×255 rounded, sp5 steerable pyramid, 8 subbands, GSM reference model), in float64.

    pyiqa runs it in float32, where its window sums (Σy² − n·mean², over up to 17×17 windows) and the
    pseudo-inverse of each near-singular 9×9 neighbourhood covariance carry rounding error: its float32 scores
    differ from the same code run in float64 by 1.5e-5–1.1e-3 relative (measured on the test images). Reproducing
    that noise would mean torch's own summation and LAPACK order, so the statistics here are pyiqa's formula in
    float64 on pyiqa's float32 pyramid bands: equal to pyiqa's code run that way to ~1e-10, and within pyiqa's
    float32 noise of its score (tests/test_kernels.py)."""
    _same_shape(x, ref)
    bands_x, bands_r = _vif_subbands(y255(x)), _vif_subbands(y255(ref))  # float32, as pyiqa's pyramid
    num = den = 0.0
    for sub in _VIF_SUBBANDS:
        level = math.ceil((sub - 2) / 6)  # pyiqa: ceil((index − 1) / 6) of the 0-based index sub − 1
        winsize = 2 ** level + 1
        r, d = bands_r[sub].astype(np.float64), bands_x[sub].astype(np.float64)
        h, w = r.shape[0] // _VIF_M * _VIF_M, r.shape[1] // _VIF_M * _VIF_M
        r, d = r[:h, :w], d[:h, :w]
        g, vv = _vif_channel(r, d, winsize)
        ss, eig = _vif_reference(r)
        o = math.ceil((winsize - 1) / 2 / _VIF_M)
        crop = (slice(o, g.shape[0] - o), slice(o, g.shape[1] - o))
        g, vv, ss = g[crop], vv[crop], ss[crop]
        cc = eig[:, None, None]
        num += float(np.log2(1 + g * g * ss * cc / (vv + _VIF_SIGMA_NSQ)).sum())
        den += float(np.log2(1 + ss * cc / _VIF_SIGMA_NSQ).sum())
    return num / (den + 1e-12)


NUMPY_FR_TOOLS = {"nlpd": lambda: nlpd, "gmsd": lambda: gmsd, "psnr": lambda: psnr, "fsim": lambda: fsim, "vif": lambda: vif}
