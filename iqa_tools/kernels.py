"""Faster exact paths for pyiqa metrics whose time goes to a slow formulation, not to the maths.

pyiqa's SSIM and MS-SSIM filter in float64 with a full 11×11 `F.conv2d`: torch has no fast float64
convolution on CPU, so each of the five filterings of an SSIM unfolds the image into an 11·11-times larger
buffer (≈180 MB at 512×384) and multiplies through it. The Gaussian window is separable, so the same
filtering is two 11-tap passes (OpenCV, float64, SIMD). Everything else — the Y channel and its MATLAB-style
rounding (pyiqa's own `preprocess_rgb`), the constants, the ReLU of the contrast term, the 2×2 average
pooling between MS-SSIM scales, the weights — is pyiqa's code or a line-by-line copy of it, so scores equal
pyiqa's to ~1e-7 relative (pyiqa rounds its 2-D window to float32; the 1-D passes use float64 weights).
tests/test_kernels.py compares them; benchmarks/tools_bench.py --vs-raw times them.

The NR tools BRISQUE, NIQE and PIQE (iqa_tools.nss) and the FR tools NLPD, GMSD, PSNR, FSIM
and VIF (iqa_tools.frmetrics) have torch-free kernels: NumPy/SciPy/OpenCV on the decoded pixels, so an assessment
that runs only those never imports torch or pyiqa (~3 s of a cold call).

A kernel replaces a metric only with pyiqa's default options (no `metric_kwargs`) on the CPU.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import cv2
import numpy as np

from iqa_tools import backend

_WIN, _SIGMA = 11, 1.5


def _gauss_1d() -> np.ndarray:
    m = (_WIN - 1) / 2.0
    x = np.arange(-m, m + 1)
    g = np.exp(-(x * x) / (2.0 * _SIGMA * _SIGMA))
    return g / g.sum()  # outer(g, g) is pyiqa's fspecial(11, 1.5) window (normalized alike)


_G = _gauss_1d()


def _filter_valid(x: np.ndarray) -> np.ndarray:
    """`F.conv2d(x, fspecial(11, 1.5), padding=0)` for one H×W float64 plane, as two 1-D passes."""
    r = _WIN // 2
    out = cv2.sepFilter2D(x, cv2.CV_64F, _G, _G, borderType=cv2.BORDER_REFLECT)
    return out[r:x.shape[0] - r, r:x.shape[1] - r]


def _ssim_plane(x: np.ndarray, y: np.ndarray, data_range: float = 255.0) -> tuple[float, float]:
    """pyiqa.archs.ssim_arch.ssim(get_cs=True, downsample=False) on one plane: (ssim, cs)."""
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu1, mu2 = _filter_valid(x), _filter_valid(y)
    mu1_sq, mu2_sq, mu1_mu2 = mu1 * mu1, mu2 * mu2, mu1 * mu2
    sigma1_sq = _filter_valid(x * x) - mu1_sq
    sigma2_sq = _filter_valid(y * y) - mu2_sq
    sigma12 = _filter_valid(x * y) - mu1_mu2
    cs_map = np.maximum((2 * sigma12 + c2) / (sigma1_sq + sigma2_sq + c2), 0.0)
    ssim_map = ((2 * mu1_mu2 + c1) / (mu1_sq + mu2_sq + c1)) * cs_map
    return float(ssim_map.mean()), float(cs_map.mean())


def _y255(t: Any) -> Any:
    """pyiqa's preprocess_rgb(x, test_y_channel=True, data_range=255, 'yiq') in float64, as its metrics do."""
    preprocess_rgb = backend.pyiqa_module("pyiqa.archs.func_util").preprocess_rgb
    return preprocess_rgb(t, True, 255, "yiq").to(backend.torch().float64)


class SSIM:
    """pyiqa `ssim` (downsample=False, Y channel of YIQ): returns an N-vector like the metric."""

    def __call__(self, x: Any, ref: Any) -> Any:
        torch = backend.torch()
        if x.shape != ref.shape:
            raise ValueError(f"Input {tuple(x.shape)} and reference {tuple(ref.shape)} images should have the same shape")
        a, b = _y255(x), _y255(ref)
        return torch.tensor([_ssim_plane(a[i, 0].numpy(), b[i, 0].numpy())[0] for i in range(a.shape[0])], dtype=torch.float64)


_MS_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)


class MS_SSIM:
    """pyiqa `ms_ssim` (is_prod=True, downsample=False, Y channel of YIQ)."""

    def __call__(self, x: Any, ref: Any) -> Any:
        torch = backend.torch()
        F = torch.nn.functional

        if x.shape != ref.shape:
            raise ValueError("Input and reference images should have the same shape")
        X, Y = _y255(x), _y255(ref)
        # pyiqa builds the weights as a FloatTensor moved to float64: the float32-rounded values.
        w = torch.tensor(_MS_WEIGHTS, dtype=torch.float32).to(torch.float64)
        scores = []
        for i in range(X.shape[0]):
            xi, yi = X[i:i + 1], Y[i:i + 1]
            mcs = []
            for _ in range(len(_MS_WEIGHTS)):
                ssim_val, cs = _ssim_plane(xi[0, 0].numpy(), yi[0, 0].numpy())
                mcs.append(cs)
                padding = (xi.shape[2] % 2, xi.shape[3] % 2)
                xi = F.avg_pool2d(xi, kernel_size=2, padding=padding)
                yi = F.avg_pool2d(yi, kernel_size=2, padding=padding)
            m = torch.tensor(mcs[:-1], dtype=torch.float64)
            scores.append(float(torch.prod(m ** w[:-1]) * (torch.tensor(ssim_val, dtype=torch.float64) ** w[-1])))
        return torch.tensor(scores, dtype=torch.float64)


KERNELS: dict[str, Callable[[], Any]] = {"ssim": SSIM, "ms_ssim": MS_SSIM}


class NumpyKernel:
    """A torch-free kernel: called with one H×W×3 pixel array (uint8, or float32 in [0, 1]) — and, for a
    full-reference metric, the reference's pixels of the same shape — returns the score."""

    def __init__(self, metric: str, model_path: Optional[str] = None):
        from iqa_tools import frmetrics, nss

        # Without torch, nothing else raises glibc's mmap threshold: FSIM's few-MB FFT buffers were then mapped
        # and zeroed afresh per call (40 → 23 ms per 512×384 pair once reused; backend.tune_malloc).
        backend.tune_malloc()
        self.metric = metric
        self.full_reference = metric in frmetrics.NUMPY_FR_TOOLS
        make = frmetrics.NUMPY_FR_TOOLS[metric] if self.full_reference else nss.NUMPY_TOOLS[metric]
        self._score = make(Path(model_path)) if model_path else make()

    def __call__(self, pixels: Any, reference: Any = None) -> float:
        if self.full_reference:
            if reference is None:
                raise ValueError(f"{self.metric} is a full-reference metric: it needs the reference's pixels")
            return self._score(pixels, reference)
        return self._score(pixels)


NUMPY_NR_METRICS = ("brisque", "niqe", "piqe")  # iqa_tools.nss
NUMPY_FR_METRICS = ("nlpd", "gmsd", "psnr", "fsim", "vif")  # iqa_tools.frmetrics
NUMPY_METRICS = NUMPY_NR_METRICS + NUMPY_FR_METRICS


def numpy_kernel_applies(metric: str, metric_kwargs: dict) -> bool:
    """Whether `metric` with these options has a torch-free kernel (pyiqa's defaults only)."""
    return metric in NUMPY_METRICS and not metric_kwargs


def numpy_kernel_for(metric: str, metric_kwargs: dict, device: str, model_path: Optional[str] = None) -> Optional[NumpyKernel]:
    """A torch-free kernel standing in for pyiqa's `metric` on the CPU, or None. `device` is a device
    string ("cpu", "cuda:0", …); checking it does not import torch."""
    if not numpy_kernel_applies(metric, metric_kwargs) or device.split(":")[0] != "cpu":
        return None
    return NumpyKernel(metric, model_path)


def kernel_for(metric: str, metric_kwargs: dict, device: str) -> Optional[Any]:
    """A kernel standing in for pyiqa's `metric`, or None when pyiqa's own metric must run."""
    make = KERNELS.get(metric)
    if make is None or metric_kwargs or device != "cpu":
        return None
    return make()
