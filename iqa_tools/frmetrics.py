"""pyiqa's full-reference `nlpd`, `gmsd`, `psnr` and `fsim` (default options) in NumPy/OpenCV, without torch.

The offline FR path and users' FR picks run these weight-free metrics; through pyiqa each cold call first
imports torch and pyiqa (~3 s), and pyiqa's formulations are 1.1–1.6× slower than the maths needs (issue 14).
A sibling of iqa_tools.nss (the NR statistics) rather than part of it: these compare two images and share
nothing with the NSS fits but the colour conversion, which they import from there.

Each function computes what pyiqa/archs/{nlpd,gmsd,psnr,fsim}_arch.py compute, vectorized, in float32 as
pyiqa does for float32 input tensors; quirks of pyiqa's code that change scores are kept and marked
"as pyiqa". tests/test_kernels.py compares the scores on odd sizes, greyscale and float input.

Inputs are (distorted, reference) H×W×3 pixel arrays as iqa_tools.images decodes them (uint8, or float32
in [0, 1]), of the same shape.
"""
from __future__ import annotations

import cv2
import numpy as np

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


NUMPY_FR_TOOLS = {"nlpd": lambda: nlpd, "gmsd": lambda: gmsd, "psnr": lambda: psnr}
