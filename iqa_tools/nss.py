"""pyiqa's `brisque`, `niqe` and `piqe` (default options) in NumPy/SciPy/OpenCV, without torch.

A cold one-photo offline call runs one of these natural-scene-statistics tools, and importing torch and pyiqa
to run it cost ~3 s of a ~5 s call (issue 14); the maths itself takes tens of milliseconds. So these compute
what pyiqa's code computes (pyiqa/archs/{brisque,niqe,piqe}_arch.py, func_util.py, matlab_utils/resize.py),
vectorized over the whole image or all blocks at once, in the dtypes pyiqa uses — float32 for BRISQUE, PIQE
and the MATLAB-style resize, float64 for NIQE's features. NIQE and PIQE equal pyiqa's scores to < 1e-6
relative, BRISQUE's features too (its score: see Brisque). tests/test_kernels.py compares them on odd sizes,
greyscale and float input, test_tools_calibration.py on pyiqa's MATLAB calibration set. Quirks of pyiqa's code
that change scores are kept on purpose and marked "as pyiqa".

Inputs are H×W×3 pixel arrays as iqa_tools.images decodes them (uint8, or float32 in [0, 1]).
"""
from __future__ import annotations

import math
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Optional

import cv2
import numpy as np
from scipy.special import gammaln

F32, F64 = np.float32, np.float64

# ── colour and MSCN ────────────────────────────────────────────────────────────────────────────


def to_float(pixels: np.ndarray) -> np.ndarray:
    """H×W×3 float32 in [0, 1], the values of LoadedImage.tensor (uint8 / 255 in float32)."""
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected H×W×3 pixels, got shape {pixels.shape}")
    if pixels.dtype == np.uint8:
        return pixels.astype(F32) / F32(255.0)
    return pixels.astype(F32, copy=False)


def y_channel(rgb: np.ndarray) -> np.ndarray:
    """Y of YIQ (pyiqa's rgb2yiq row 0) in float32: bit-identical to pyiqa's matmul on all 2^24 uint8
    colours, since the products are summed in this order (checked once against torch)."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return (r * F32(0.299) + g * F32(0.587)) + b * F32(0.114)


def y255(pixels: np.ndarray) -> np.ndarray:
    """pyiqa's to_y_channel(x, 255, 'yiq'): Y × 255 rounded half to even, float32."""
    return np.round(y_channel(to_float(pixels)) * F32(255.0))


@lru_cache(maxsize=None)
def _fspecial(size: int, sigma: float) -> np.ndarray:
    """pyiqa's fspecial(size, sigma): MATLAB's Gaussian window, rounded to float32 as pyiqa stores it."""
    m = (size - 1.0) / 2.0
    y, x = np.ogrid[-m:m + 1, -m:m + 1]
    h = np.exp(-(x * x + y * y) / (2.0 * sigma * sigma))
    h[h < np.finfo(h.dtype).eps * h.max()] = 0
    h /= h.sum()
    return h.astype(F32)


_BORDERS = {"same": cv2.BORDER_CONSTANT, "replicate": cv2.BORDER_REPLICATE}


def mscn(img: np.ndarray, padding: str, size: int = 7, sigma: float = 7.0 / 6) -> np.ndarray:
    """pyiqa's normalize_img_with_gauss(img, 7, 7/6, C=1, padding) on one H×W plane, in img's dtype.

    'same' pads with zeros, 'replicate' repeats the edge (odd window: 3 px each side, as ExactPadding2d)."""
    kernel = _fspecial(size, sigma).astype(img.dtype)  # float32 values, widened for float64 images
    border = _BORDERS[padding]
    mu = cv2.filter2D(img, -1, kernel, borderType=border)
    ex2 = cv2.filter2D(img * img, -1, kernel, borderType=border)
    sd = np.sqrt(np.abs(ex2 - mu * mu) + np.finfo(img.dtype).eps)  # safe_sqrt
    return (img - mu) / (sd + 1)


# ── MATLAB-style bicubic resize (pyiqa.matlab_utils.imresize, antialiasing) ─────────────────────


def _cubic(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    ax2 = ax * ax
    ax3 = ax * ax2
    a = F32(-0.5)
    c01 = ((a + 2) * ax3 - (a + 3) * ax2 + 1) * (ax <= 1).astype(x.dtype)
    c12 = ((a * ax3) - (5 * a * ax2) + (8 * a * ax) - (4 * a)) * ((ax > 1) & (ax <= 2)).astype(x.dtype)
    return c01 + c12


@lru_cache(maxsize=64)
def _resize_taps(n_in: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(weights, source indices), each taps × n_out, of one axis of pyiqa's resize_1d (float32, like pyiqa,
    whose cast_input always casts to float32). MATLAB's symmetric padding is folded into the indices."""
    size = math.ceil(n_in * scale)
    taps = 4
    factor = 1.0
    if scale < 1:
        factor = scale
        taps = math.ceil(taps / factor)
    taps += 2
    pos = (np.arange(size, dtype=F32) + F32(0.5)) / F32(scale) - F32(0.5)
    base = np.floor(pos) - F32(taps // 2) + F32(1)
    dist = pos - base
    w = _cubic((dist[None, :] - np.arange(taps, dtype=F32)[:, None]) * F32(factor))
    w = w / w.sum(axis=0, keepdims=True, dtype=F32)
    src = base.astype(np.int64)[None, :] + np.arange(taps)[:, None]
    src = np.where(src < 0, -src - 1, src)
    src = np.where(src >= n_in, 2 * n_in - 1 - src, src)
    return w.astype(F32), src


def imresize(img: np.ndarray, scale: float = 0.5) -> np.ndarray:
    """pyiqa's imresize(x, scale, antialiasing=True) for one H×W plane: rows first, then columns, float32."""
    out_dtype = img.dtype
    x = img.astype(F32, copy=False)
    w, src = _resize_taps(x.shape[0], scale)
    acc = w[0][:, None] * x[src[0]]
    for k in range(1, len(w)):
        acc += w[k][:, None] * x[src[k]]
    w, src = _resize_taps(x.shape[1], scale)
    out = w[0] * acc[:, src[0]]
    for k in range(1, len(w)):
        out += w[k] * acc[:, src[k]]
    return out.astype(out_dtype, copy=False)


# ── generalized Gaussian fits (func_util.estimate_ggd_param / estimate_aggd_param) ──────────────


@lru_cache(maxsize=None)
def _grid(dtype: type) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """pyiqa's shape grid 0.2:0.001:10 (a float32 arange, widened to float64 for NIQE) and its ratio tables."""
    gam = (0.2 + 0.001 * np.arange(9801)).astype(F32).astype(dtype)
    l1, l2, l3 = gammaln(1.0 / gam), gammaln(2.0 / gam), gammaln(3.0 / gam)
    r_ggd = np.exp(l1 + l3 - 2 * l2)
    r_aggd = np.exp(2 * l2 - (l1 + l3))
    return gam, r_ggd, r_aggd


def _nearest(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """argmin |values - table| per value (first index on ties, as torch.argmin)."""
    return np.abs(values[..., None] - table).argmin(axis=-1)


def ggd(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, sigma) of a zero-mean generalized Gaussian per plane; x is (..., H, W)."""
    gam, r_ggd, _ = _grid(x.dtype.type)
    sigma_sq = np.mean(x * x, axis=(-1, -2), dtype=x.dtype)
    e = np.mean(np.abs(x), axis=(-1, -2), dtype=x.dtype)
    rho = sigma_sq / (e * e)
    return gam[_nearest(r_ggd, rho)], np.sqrt(sigma_sq)


def aggd(block: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(alpha, left std, right std, beta_l, beta_r) of an asymmetric GGD per plane; block is (..., H, W)."""
    dt = block.dtype.type
    gam, _, r_aggd = _grid(dt)
    sq = block * block
    left, right = block < 0, block > 0
    with np.errstate(divide="ignore", invalid="ignore"):  # an all-positive plane gives NaN, as in pyiqa
        left_std = np.sqrt(np.sum(np.where(left, sq, 0), axis=(-1, -2), dtype=dt) / np.sum(left, axis=(-1, -2)).astype(F32))
        right_std = np.sqrt(np.sum(np.where(right, sq, 0), axis=(-1, -2), dtype=dt) / np.sum(right, axis=(-1, -2)).astype(F32))
        gammahat = left_std / right_std
        mean_abs = np.mean(np.abs(block), axis=(-1, -2), dtype=dt)
        rhat = mean_abs * mean_abs / np.mean(sq, axis=(-1, -2), dtype=dt)
        rhatnorm = (rhat * (gammahat ** 3 + 1) * (gammahat + 1)) / (gammahat ** 2 + 1) ** 2
    alpha = gam[_nearest(r_aggd, rhatnorm)]
    scale = np.sqrt(np.exp(gammaln(1 / alpha) - gammaln(3 / alpha)))
    return alpha, left_std, right_std, left_std * scale, right_std * scale


# ── BRISQUE ─────────────────────────────────────────────────────────────────────────────────────

# Feature ranges of the official MATLAB BRISQUE (as in pyiqa's scale_features), one (low, high) per feature.
_BRISQUE_RANGES = np.array([
    [0.338, 10], [0.017204, 0.806612], [0.236, 1.642], [-0.123884, 0.20293], [0.000155, 0.712298],
    [0.001122, 0.470257], [0.244, 1.641], [-0.123586, 0.179083], [0.000152, 0.710456], [0.000975, 0.470984],
    [0.249, 1.555], [-0.135687, 0.100858], [0.000174, 0.684173], [0.000913, 0.534174], [0.258, 1.561],
    [-0.143408, 0.100486], [0.000179, 0.685696], [0.000888, 0.536508], [0.471, 3.264], [0.012809, 0.703171],
    [0.218, 1.046], [-0.094876, 0.187459], [1.5e-005, 0.442057], [0.001272, 0.40803], [0.222, 1.042],
    [-0.115772, 0.162604], [1.6e-005, 0.444362], [0.001374, 0.40243], [0.227, 0.996], [-0.117188, 0.098323],
    [3e-005, 0.531903], [0.001122, 0.369589], [0.228, 0.99], [-0.12243, 0.098658], [2.8e-005, 0.530092],
    [0.001118, 0.370399],
], dtype=F32)
_BRISQUE_GAMMA, _BRISQUE_RHO = 0.05, -153.591


def _brisque_nss(luma: np.ndarray) -> list:
    """pyiqa's natural_scene_statistics: 18 features of one scale, float32."""
    n = mscn(luma, "same")
    alpha, sigma = ggd(n)
    feats = [alpha, sigma * sigma]
    for shift in ((0, 1), (1, 0), (1, 1), (-1, 1)):
        alpha, sl, sr = aggd(n * np.roll(n, shift, axis=(0, 1)))[:3]
        eta = (sr - sl) * np.exp(gammaln(2.0 / alpha) - (gammaln(1.0 / alpha) + gammaln(3.0 / alpha)) / 2)
        feats += [alpha, eta.astype(F32), sl * sl, sr * sr]
    return feats


def brisque_features(pixels: np.ndarray) -> np.ndarray:
    """BRISQUE's 36 natural-scene features (two scales of 18) of H×W×3 pixels, float32, as pyiqa computes them."""
    x = y255(pixels)
    feats = _brisque_nss(x) + _brisque_nss(imresize(x, 0.5))
    return np.array([F32(f) for f in feats], dtype=F32)


class Brisque:
    """pyiqa `brisque` (version 'original', Y of YIQ, the LIVE SVR) on H×W×3 pixels.

    The 36 features are computed in float32 as pyiqa does (equal to ~1e-6 relative). The SVR sum is done in
    float64: its 774 terms reach ±1024 and cancel to a score of 0–100, so pyiqa's float32 sum carries
    ~±0.005 of rounding noise (moving its features by 1e-6 moves its score by that much); in float64 the
    same formula is stable, and lies within that noise of pyiqa's score."""

    def __init__(self, model_path: Optional[Path] = None):
        from iqa_tools.model_files import BRISQUE_MODEL, load_brisque_arrays

        self.coef, self.sv = load_brisque_arrays(model_path or BRISQUE_MODEL)  # float64

    def features(self, pixels: np.ndarray) -> np.ndarray:
        """The 36 features (two scales of 18), float32."""
        return brisque_features(pixels)

    def svr(self, features: np.ndarray) -> float:
        """The LIVE epsilon-SVR (RBF, γ 0.05, ρ −153.591) on features scaled to [-1, 1] by the MATLAB ranges."""
        lo, hi = _BRISQUE_RANGES[:, 0], _BRISQUE_RANGES[:, 1]
        scaled = (F32(-1) + F32(2) * (features.astype(F32) - lo) / (hi - lo)).astype(F64)
        dist = ((scaled[:, None] - self.sv.T) ** 2).sum(axis=0)
        return float(np.exp(-dist * _BRISQUE_GAMMA) @ self.coef - _BRISQUE_RHO)

    def __call__(self, pixels: np.ndarray) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):  # a flat image: NaN features and score, as pyiqa
            return self.svr(self.features(pixels))


# ── NIQE ────────────────────────────────────────────────────────────────────────────────────────


def _blocks(img: np.ndarray, bh: int, bw: int) -> np.ndarray:
    """Non-overlapping bh×bw blocks of an H×W plane (H, W multiples), as (nh·nw, bh, bw)."""
    nh, nw = img.shape[0] // bh, img.shape[1] // bw
    return img.reshape(nh, bh, nw, bw).transpose(0, 2, 1, 3).reshape(nh * nw, bh, bw)


def _niqe_features(blocks: np.ndarray) -> np.ndarray:
    """pyiqa's niqe compute_feature: 18 features per block (rolls wrap inside each block, as pyiqa)."""
    alpha, _, _, bl, br = aggd(blocks)
    feats = [alpha, (bl + br) / 2]
    for shift in ((0, 1), (1, 0), (1, 1), (1, -1)):
        alpha, _, _, bl, br = aggd(blocks * np.roll(blocks, shift, axis=(1, 2)))
        mean = (br - bl) * np.exp(gammaln(2 / alpha) - gammaln(1 / alpha))
        feats += [alpha, mean, bl, br]
    return np.stack(feats, axis=-1)


class Niqe:
    """pyiqa `niqe` (version 'original', Y of YIQ, 96×96 blocks) with the bundled pristine model."""

    BLOCK = 96

    def __init__(self, model_path: Optional[Path] = None):
        import scipy.io

        from iqa_tools.model_files import NIQE_PARAMS

        path = model_path or NIQE_PARAMS
        params = scipy.io.loadmat(path)
        if "mu_prisparam" not in params or "cov_prisparam" not in params:
            raise ValueError(f"NIQE model {path}: no mu_prisparam / cov_prisparam (not a NIQE parameter file)")
        self.mu = np.ravel(params["mu_prisparam"]).astype(F64)
        self.cov = np.asarray(params["cov_prisparam"], dtype=F64)
        if self.mu.shape != (36,) or self.cov.shape != (36, 36):
            raise ValueError(f"NIQE model {path}: expected a 36-feature mean and a 36×36 covariance, "
                             f"got {self.mu.shape} and {self.cov.shape}")

    def __call__(self, pixels: np.ndarray) -> float:
        img = y255(pixels).astype(F64)
        b = self.BLOCK
        nh, nw = img.shape[0] // b, img.shape[1] // b
        if nh == 0 or nw == 0:
            raise ValueError(f"NIQE needs at least {b}×{b} pixels, got {img.shape[1]}×{img.shape[0]}")
        img = img[:nh * b, :nw * b]
        scale1 = _niqe_features(_blocks(mscn(img, "replicate"), b, b))
        half = imresize(img / 255.0, 0.5).astype(F64) * 255.0
        scale2 = _niqe_features(_blocks(mscn(half, "replicate"), b // 2, b // 2))
        feats = np.concatenate([scale1, scale2], axis=-1)
        with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN blocks (flat image): pinv fails below, as in pyiqa
            mu = np.nanmean(feats, axis=0)
            rows = feats[~np.isnan(feats).any(axis=1)]
            cov = np.cov(rows, rowvar=False, ddof=1 if len(rows) > 1 else 0)
        a = (self.cov + cov) / 2
        inv = np.linalg.pinv(a, rcond=max(a.shape) * np.finfo(F64).eps)  # torch.linalg.pinv's default cut-off
        diff = self.mu - mu
        return float(np.sqrt(diff @ inv @ diff))


# ── PIQE ────────────────────────────────────────────────────────────────────────────────────────


class Piqe:
    """pyiqa `piqe` (16-px blocks, thresholds 0.1, 6-px edge segments); weight-free."""

    N = 16

    def __call__(self, pixels: np.ndarray) -> float:
        n = self.N
        y = y_channel(to_float(pixels))
        with np.errstate(divide="ignore", invalid="ignore"):  # an all-black image gives NaN, as in pyiqa
            img = np.round(F32(255) * (y / y.max()))
        h, w = img.shape
        # As pyiqa: pad by the remainder (not up to a multiple), mirrored; partial blocks are then dropped.
        img = np.pad(img, ((0, h % n), (0, w % n)), mode="symmetric")
        norm = mscn(img, "replicate")
        nh, nw = norm.shape[0] // n, norm.shape[1] // n
        blocks = _blocks(norm[:nh * n, :nw * n], n, n)
        var = blocks.var(axis=(1, 2), ddof=1, dtype=F32)
        active = var > 0.1

        sigma = np.sqrt(var)
        # As pyiqa's cal_center_sur_dev(block, N - 1): centre = columns 7, 8; surround drops 7 and 9.
        centre = blocks[:, :, 7:9]
        surround = blocks[:, :, [c for c in range(n) if c not in (7, 9)]]
        with np.errstate(divide="ignore", invalid="ignore"):
            csd = np.nan_to_num(centre.std(axis=(1, 2), ddof=1, dtype=F32) / surround.std(axis=(1, 2), ddof=1, dtype=F32))
            beta = np.abs(sigma - csd) / np.maximum(sigma, csd)
        noisy = sigma > 2 * beta

        edges = np.stack([blocks[:, 0, :], blocks[:, :, n - 1], blocks[:, n - 1, :], blocks[:, :, 0]], axis=1)
        segs = np.lib.stride_tricks.sliding_window_view(edges, 6, axis=-1)
        impaired = (segs.std(axis=-1, ddof=1, dtype=F32) < 0.1).any(axis=(1, 2))

        act = active.astype(F32)
        scores = act * impaired.astype(F32) * (1 - var) + act * noisy.astype(F32) * var
        return float((scores.sum(dtype=F32) + F32(1)) / F32(1 + active.sum()) * F32(100))


NUMPY_TOOLS = {"brisque": Brisque, "niqe": Niqe, "piqe": Piqe}
