"""iqa_tools.kernels: the faster SSIM / MS-SSIM give pyiqa's own scores (issue 14: within 1e-4 relative;
they agree to ~1e-7: pyiqa rounds its window to float32), through the registry too."""
from __future__ import annotations

import numpy as np
import pytest
import skimage.data
from PIL import Image, ImageFilter

from iqa_tools import ToolRegistry, backend, kernels


def _pair(size: tuple[int, int], blur: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ref = Image.fromarray(skimage.data.astronaut()).resize(size, Image.Resampling.LANCZOS)
    dist = np.asarray(ref.filter(ImageFilter.GaussianBlur(blur))).astype(np.float32)
    dist += np.random.default_rng(seed).normal(0, 4, dist.shape)
    return np.clip(dist, 0, 255).astype(np.uint8), np.asarray(ref)


def _tensor(a: np.ndarray):
    torch = backend.torch()
    return torch.from_numpy(a.copy()).permute(2, 0, 1).unsqueeze(0).float().div(255.0)


@pytest.mark.parametrize("metric", ["ssim", "ms_ssim"])
@pytest.mark.parametrize("size", [(256, 192), (333, 201)])  # odd sides exercise MS-SSIM's pooling padding
def test_kernel_equals_pyiqa(metric, size):
    torch, pyiqa = backend.torch(), backend.pyiqa()
    (d1, r1), (d2, r2) = _pair(size, 1.5, 0), _pair(size, 0.6, 1)
    x, ref = torch.cat([_tensor(d1), _tensor(d2)]), torch.cat([_tensor(r1), _tensor(r2)])
    expected = pyiqa.create_metric(metric, device=torch.device("cpu"))(x, ref).double().reshape(-1)
    got = kernels.kernel_for(metric, {}, "cpu")(x, ref)
    assert got.shape == expected.shape == (2,)
    assert torch.allclose(got, expected, rtol=1e-6, atol=0), (got, expected)
    assert got[0] < got[1] < 1.0  # the stronger blur scores lower: a real comparison, not a constant


def test_kernels_only_for_default_options_on_cpu():
    assert isinstance(kernels.kernel_for("ssim", {}, "cpu"), kernels.SSIM)
    assert kernels.kernel_for("ssim", {"downsample": True}, "cpu") is None
    assert kernels.kernel_for("ssim", {}, "cuda") is None
    assert kernels.kernel_for("psnr", {}, "cpu") is None


def test_registry_scores_ssim_with_the_kernel(tmp_path):
    torch, pyiqa = backend.torch(), backend.pyiqa()
    d, r = _pair((320, 240), 1.0, 2)
    dp, rp = tmp_path / "d.png", tmp_path / "r.png"
    Image.fromarray(d).save(dp)
    Image.fromarray(r).save(rp)
    reg = ToolRegistry(cache=False, offline=True, device="cpu")
    for tool, metric in (("SSIM", "ssim"), ("MS-SSIM", "ms_ssim")):
        s = reg.score(tool, dp, rp)
        assert isinstance(reg._metrics[(tool, "cpu")], kernels.KERNELS[metric])
        raw = float(pyiqa.create_metric(metric, device=torch.device("cpu"))(str(dp), str(rp)))
        assert s.raw_score == pytest.approx(raw, rel=1e-6)
