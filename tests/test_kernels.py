"""iqa_tools.kernels: the faster SSIM / MS-SSIM give pyiqa's own scores (issue 14: within 1e-4 relative;
they agree to ~1e-7: pyiqa rounds its window to float32), through the registry too."""
from __future__ import annotations

import numpy as np
import pytest
import skimage.data
from PIL import Image, ImageFilter

from iqa_tools import ToolRegistry, ToolRunError, backend, kernels


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


# ── torch-free NR kernels (iqa_tools.nss): BRISQUE, NIQE, PIQE ─────────────────────────────────


def _nr_images() -> dict[str, np.ndarray]:
    """Several sizes and odd shapes, a greyscale photo, noise and a 16-bit-like float input."""
    ast = Image.fromarray(skimage.data.astronaut())
    coffee = skimage.data.coffee()
    noisy = np.clip(coffee + np.random.default_rng(3).normal(0, 12, coffee.shape), 0, 255).astype(np.uint8)
    return {
        "512x384": np.asarray(ast.resize((512, 384), Image.Resampling.LANCZOS)),
        "odd 333x201 blurred": np.asarray(ast.resize((333, 201)).filter(ImageFilter.GaussianBlur(1.2))),
        "small 130x97": np.asarray(ast.resize((130, 97))),
        "greyscale 512x512": np.repeat(skimage.data.camera()[..., None], 3, axis=2),
        "noisy 600x400": noisy,
        "odd crop 427x299": skimage.data.chelsea()[:299, :427],
        "float 301x250": (skimage.data.astronaut()[:250, :301].astype(np.float32) / 255 * 0.9).astype(np.float32),
        "1024x768": np.asarray(Image.fromarray(skimage.data.rocket()).resize((1024, 768))),
    }


NR_IMAGES = _nr_images()


def _pyiqa_tensor(px: np.ndarray):
    """The tensor LoadedImage.tensor gives pyiqa for these pixels."""
    torch = backend.torch()
    t = torch.from_numpy(px.copy()).permute(2, 0, 1).unsqueeze(0).float()
    return t.div_(255.0) if px.dtype == np.uint8 else t


@pytest.fixture(scope="module")
def pyiqa_nr():
    from iqa_tools.model_files import BRISQUE_MODEL, NIQE_PARAMS

    torch, pyiqa = backend.torch(), backend.pyiqa()
    cpu = torch.device("cpu")
    return {
        "niqe": pyiqa.create_metric("niqe", device=cpu, pretrained_model_path=str(NIQE_PARAMS)),
        "piqe": pyiqa.create_metric("piqe", device=cpu),
        "brisque": pyiqa.create_metric("brisque", device=cpu, pretrained_model_path=str(BRISQUE_MODEL)),
    }


@pytest.mark.parametrize("metric", ["niqe", "piqe"])
@pytest.mark.parametrize("image", list(NR_IMAGES))
def test_numpy_niqe_piqe_equal_pyiqa(pyiqa_nr, metric, image):
    torch = backend.torch()
    px = NR_IMAGES[image]
    with torch.inference_mode():
        expected = float(pyiqa_nr[metric](_pyiqa_tensor(px)).reshape(-1)[0])
    got = kernels.numpy_kernel_for(metric, {}, "cpu")(px)
    assert got == pytest.approx(expected, rel=1e-5), (metric, image, got, expected)  # measured ≤ 4e-7


@pytest.mark.parametrize("image", list(NR_IMAGES))
def test_numpy_brisque_equals_pyiqa(pyiqa_nr, image):
    """Features: pyiqa's own functions, float32, to 1e-5. Score: pyiqa's SVR formula in float64 on pyiqa's
    features, to 1e-4 relative; pyiqa's float32 score itself only to its rounding noise (see nss.Brisque)."""
    torch = backend.torch()
    from pyiqa.archs import brisque_arch
    from pyiqa.matlab_utils import imresize
    from pyiqa.utils.color_util import to_y_channel

    px = NR_IMAGES[image]
    metric = pyiqa_nr["brisque"]
    arch = metric.net  # pyiqa's InferenceModel wraps the BRISQUE module
    with torch.inference_mode():
        y = to_y_channel(_pyiqa_tensor(px), 255.0)
        feats = torch.cat([brisque_arch.natural_scene_statistics(y, 7, 7 / 6),
                           brisque_arch.natural_scene_statistics(imresize(y, scale=0.5, antialiasing=True), 7, 7 / 6)], -1)
        scaled = brisque_arch.scale_features(feats.double())
        in_f64 = float(brisque_arch.rbf_kernel(scaled, arch.sv.double().t(), 0.05) @ arch.sv_coef.double() - arch.rho)
        pyiqa_score = float(metric(_pyiqa_tensor(px)).reshape(-1)[0])
    ours = kernels.numpy_kernel_for("brisque", {}, "cpu")
    mine, theirs = ours._score.features(px), feats[0].numpy()
    # atol: the eta features are differences of two deviations (~1e-3 after cancellation in float32)
    assert np.allclose(mine, theirs, rtol=1e-5, atol=1e-6), (image, np.abs(mine - theirs) / np.abs(theirs), theirs)
    got = ours(px)
    assert got == pytest.approx(in_f64, rel=1e-4, abs=1e-4), (image, got, in_f64)
    assert got == pytest.approx(pyiqa_score, abs=0.02), (image, got, pyiqa_score)  # measured ≤ 0.007


def test_numpy_resize_and_y_are_pyiqa_bit_for_bit():
    torch = backend.torch()
    from pyiqa.matlab_utils import imresize
    from pyiqa.utils.color_util import to_y_channel

    from iqa_tools import nss

    for px in (NR_IMAGES["odd 333x201 blurred"], NR_IMAGES["odd crop 427x299"]):
        y = to_y_channel(_pyiqa_tensor(px), 255.0)
        assert np.array_equal(nss.y255(px), y[0, 0].numpy())
        assert np.array_equal(nss.imresize(nss.y255(px), 0.5), imresize(y, scale=0.5, antialiasing=True)[0, 0].numpy())


def test_numpy_kernels_only_for_default_options_on_cpu():
    assert isinstance(kernels.numpy_kernel_for("niqe", {}, "cpu"), kernels.NumpyKernel)
    assert kernels.numpy_kernel_for("niqe", {"version": "matlab"}, "cpu") is None
    assert kernels.numpy_kernel_for("brisque", {}, "cuda:0") is None
    assert kernels.numpy_kernel_for("piqe", {}, "mps") is None
    assert kernels.numpy_kernel_for("musiq", {}, "cpu") is None


def test_registry_keeps_pyiqa_for_metric_kwargs_and_gpu(tmp_path, monkeypatch):
    from iqa_tools import registry as registry_module

    table = tmp_path / "t.yaml"
    table.write_text("tools:\n  - name: PIQE\n    metric_kwargs: {}\n  - name: NIQE\n    metric_kwargs: {crop_border: 2}\n")
    reg = ToolRegistry(table_paths=[table], cache=False, offline=True, device="cpu")
    img = NR_IMAGES["512x384"]
    reg.score("NIQE", img)
    assert not isinstance(reg._metrics[("NIQE", "cpu")], kernels.NumpyKernel)  # options: pyiqa's own metric
    reg.score("PIQE", img)
    assert isinstance(reg._metrics[("PIQE", "cpu")], kernels.NumpyKernel)

    # "auto" is decided without torch only where no GPU can exist; elsewhere torch resolves it.
    monkeypatch.setattr(registry_module, "_resolve_device", lambda requested: "cuda")
    monkeypatch.setattr(backend, "accelerator_possible", lambda: True)
    gpu = ToolRegistry(cache=False, offline=True)
    assert gpu._tool_device(gpu.spec("PIQE")) == "cuda"
    assert kernels.numpy_kernel_for("piqe", {}, gpu._tool_device(gpu.spec("PIQE"))) is None
    monkeypatch.setattr(backend, "accelerator_possible", lambda: False)
    cpu = ToolRegistry(cache=False, offline=True)
    assert cpu._tool_device(cpu.spec("PIQE")) == "cpu"


def test_registry_nr_scores_equal_pyiqa_path(tmp_path, pyiqa_nr):
    """The registry's kernels against pyiqa through the same registry code (working size, decoding)."""
    torch = backend.torch()
    path = tmp_path / "photo.jpg"
    Image.fromarray(NR_IMAGES["noisy 600x400"]).save(path, quality=85)
    reg = ToolRegistry(cache=False, offline=True, device="cpu")
    for tool, metric in (("NIQE", "niqe"), ("PIQE", "piqe"), ("BRISQUE", "brisque")):
        s = reg.score(tool, path)
        assert isinstance(reg._metrics[(tool, "cpu")], kernels.NumpyKernel) and s.working_size == (600, 400)
        many = reg.score_many(tool, [path, path])
        assert [m.raw_score for m in many] == [s.raw_score] * 2
        with torch.inference_mode():
            expected = float(pyiqa_nr[metric](str(path)).reshape(-1)[0])
        assert s.raw_score == pytest.approx(expected, rel=1e-5, abs=0.02 if tool == "BRISQUE" else 0)


NO_TORCH = r"""
import json, sys
from agentic_iqa.api import create_assessor
r = create_assessor(offline=True, device=sys.argv[2]).assess(sys.argv[1], use_cache=False)
logs = [(lg.tool_name, lg.raw_score, lg.working_size) for lg in r.evidence.tool_logs]
print(json.dumps({"logs": logs, "loaded": sorted(m for m in ("torch", "pyiqa", "torchvision") if m in sys.modules)}))
"""


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_offline_nr_assessment_never_imports_torch(tmp_path, device):
    """A cold offline assessment whose tools all have torch-free kernels loads neither torch nor pyiqa."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from iqa_tools.model_files import load_brisque_arrays

    if device == "auto" and backend.accelerator_possible():
        pytest.skip("a GPU device node exists here: 'auto' needs torch to decide")
    load_brisque_arrays()  # the .npz `install brisque` writes (made here from the .pt on older installs)
    path = tmp_path / "photo.jpg"
    Image.fromarray(NR_IMAGES["512x384"]).save(path, quality=90)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", NO_TORCH, str(path), device], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["logs"], result
    assert {name for name, _, _ in result["logs"]} <= {"BRISQUE", "NIQE", "PIQE"}
    assert all(raw is not None and size == [512, 384] for _, raw, size in result["logs"])
    assert result["loaded"] == []


def test_numpy_kernels_fail_where_pyiqa_fails(pyiqa_nr):
    """Flat and degenerate images: pyiqa gives NaN or raises, and so do the kernels (the registry turns
    both into a ToolRunError); PIQE's 100 for a flat image is kept."""
    torch = backend.torch()
    grey = np.full((128, 160, 3), 128, np.uint8)
    checker = (np.indices((128, 128)).sum(0) % 2 * 255).astype(np.uint8)[..., None].repeat(3, 2)
    for px in (grey, checker):
        assert np.isnan(kernels.numpy_kernel_for("brisque", {}, "cpu")(px))
        with pytest.raises(np.linalg.LinAlgError):
            kernels.numpy_kernel_for("niqe", {}, "cpu")(px)
        with torch.inference_mode():
            expected = float(pyiqa_nr["piqe"](_pyiqa_tensor(px)).reshape(-1)[0])
        assert kernels.numpy_kernel_for("piqe", {}, "cpu")(px) == pytest.approx(expected, rel=1e-5)
    reg = ToolRegistry(cache=False, offline=True, device="cpu")
    for tool, match in (("BRISQUE", "non-finite"), ("NIQE", "NIQE failed")):
        with pytest.raises(ToolRunError, match=match):
            reg.score(tool, grey)


def test_unreadable_niqe_model_is_a_clear_tool_error(tmp_path):
    import scipy.io

    bad = tmp_path / "params.mat"
    scipy.io.savemat(bad, {"something": np.zeros(3)})
    table = tmp_path / "t.yaml"
    table.write_text(f"tools:\n  - name: NIQE\n    model_path: {bad}\n")
    reg = ToolRegistry(table_paths=[table], cache=False, offline=True, device="cpu")
    with pytest.raises(ToolRunError, match="not a NIQE parameter file"):
        reg.score("NIQE", NR_IMAGES["512x384"])


# ── torch-free FR kernels (iqa_tools.frmetrics): NLPD, GMSD, PSNR, FSIM, VIF ───────────────────

FR_METRICS = ("nlpd", "gmsd", "psnr", "fsim", "vif")


def _distort(ref: np.ndarray, seed: int) -> np.ndarray:
    """Blur plus noise, in the input's own dtype (float input stays float in [0, 1])."""
    rng = np.random.default_rng(seed)
    if ref.dtype != np.uint8:
        return np.clip(ref + rng.normal(0, 0.02, ref.shape), 0, 1).astype(np.float32)
    blurred = np.asarray(Image.fromarray(ref).filter(ImageFilter.GaussianBlur(1.2))).astype(np.float32)
    return np.clip(blurred + rng.normal(0, 5, ref.shape), 0, 255).astype(np.uint8)


FR_PAIRS = {name: (_distort(px, i), px) for i, (name, px) in enumerate(NR_IMAGES.items())}


@pytest.fixture(scope="module")
def pyiqa_fr():
    torch, pyiqa = backend.torch(), backend.pyiqa()
    return {m: pyiqa.create_metric(m, device=torch.device("cpu")) for m in FR_METRICS}


@pytest.mark.parametrize("metric", FR_METRICS)
@pytest.mark.parametrize("pair", list(FR_PAIRS))
def test_numpy_fr_kernels_equal_pyiqa(pyiqa_fr, metric, pair):
    torch = backend.torch()
    x, ref = FR_PAIRS[pair]
    with torch.inference_mode():
        expected = float(pyiqa_fr[metric](_pyiqa_tensor(x), _pyiqa_tensor(ref)).reshape(-1)[0])
    kernel = kernels.numpy_kernel_for(metric, {}, "cpu")
    got = kernel(x, ref)
    # measured ≤ 1.8e-7; VIF: pyiqa's own float32 rounding noise (≤ 1.1e-3, see test_numpy_vif_is_pyiqas_formula)
    assert got == pytest.approx(expected, rel=2e-3 if metric == "vif" else 1e-5), (metric, pair, got, expected)
    same = kernel(ref, ref)  # identical images: the metric's perfect score, as pyiqa's
    assert same == pytest.approx({"psnr": 80.0, "nlpd": 0.0, "gmsd": 0.0, "fsim": 1.0, "vif": 1.0}[metric], abs=1e-6)
    assert (got < same) if metric in ("psnr", "fsim", "vif") else (got > same)


@pytest.mark.parametrize("pair", list(FR_PAIRS))
def test_numpy_vif_is_pyiqas_formula(monkeypatch, pyiqa_fr, pair):
    """pyiqa's own VIF code run in float64 (its filters and Y channel rounded to float32 as in float32 runs)
    equals ours to 1e-6 (measured ≤ 1.9e-7); pyiqa's float32 score is 1.5e-5–1.1e-3 from it on these pairs: its
    rounding noise (iqa_tools.frmetrics.vif), which no other summation order reproduces."""
    import types

    torch = backend.torch()
    from pyiqa.archs import vif_arch

    F = torch.nn.functional
    monkeypatch.setattr(vif_arch, "F", types.SimpleNamespace(pad=F.pad, relu=F.relu,
                                                             conv2d=lambda x, w, **kw: F.conv2d(x, w.to(x.dtype), **kw)))
    to_y = vif_arch.to_y_channel
    monkeypatch.setattr(vif_arch, "to_y_channel", lambda img, r: to_y(img.float(), r).to(img.dtype))
    x, ref = FR_PAIRS[pair]
    with torch.inference_mode():
        in_f64 = float(vif_arch.VIF().vif(_pyiqa_tensor(x).double(), _pyiqa_tensor(ref).double()))
        in_f32 = float(pyiqa_fr["vif"](_pyiqa_tensor(x), _pyiqa_tensor(ref)).reshape(-1)[0])
    got = kernels.numpy_kernel_for("vif", {}, "cpu")(x, ref)
    assert got == pytest.approx(in_f64, rel=1e-6), (pair, got, in_f64)
    assert got == pytest.approx(in_f32, rel=2e-3), (pair, got, in_f32)  # a real comparison, not a constant


def test_numpy_fr_kernels_refuse_bad_input():
    x, ref = FR_PAIRS["512x384"]
    kernel = kernels.numpy_kernel_for("nlpd", {}, "cpu")
    with pytest.raises(ValueError, match="same shape"):
        kernel(x, ref[:-1])
    with pytest.raises(ValueError, match="needs the reference"):
        kernel(x)
    assert kernels.numpy_kernel_for("psnr", {"test_y_channel": True}, "cpu") is None
    assert kernels.numpy_kernel_for("gmsd", {}, "cuda") is None


def test_registry_fr_scores_equal_pyiqa_path(tmp_path, pyiqa_fr):
    """NLPD, GMSD, PSNR, FSIM, VIF through the registry (files decoded, score_many batching references) against pyiqa."""
    torch = backend.torch()
    x, ref = FR_PAIRS["noisy 600x400"]
    xp, rp = tmp_path / "x.png", tmp_path / "r.png"
    Image.fromarray(x).save(xp)
    Image.fromarray(ref).save(rp)
    reg = ToolRegistry(cache=False, offline=True, device="cpu")
    for tool, metric in (("NLPD", "nlpd"), ("GMSD", "gmsd"), ("PSNR", "psnr"), ("FSIM", "fsim"), ("VIF", "vif")):
        s = reg.score(tool, xp, rp)
        assert isinstance(reg._metrics[(tool, "cpu")], kernels.NumpyKernel)
        many = reg.score_many(tool, [xp, rp], [rp, rp])
        assert many[0].raw_score == s.raw_score and many[1].raw_score == pytest.approx({"PSNR": 80.0, "FSIM": 1.0, "VIF": 1.0}.get(tool, 0.0), abs=1e-6)
        with torch.inference_mode():
            expected = float(pyiqa_fr[metric](str(xp), str(rp)).reshape(-1)[0])
        assert s.raw_score == pytest.approx(expected, rel=2e-3 if tool == "VIF" else 1e-5), (tool, s.raw_score, expected)


NO_TORCH_FR = r"""
import json, sys
from iqa_tools import ToolRegistry, kernels

# The offline analyst picks the first available FR tools of the table; keep only those with a kernel, so that
# the whole assessment (reference decoding, analyst, fusion) runs on them alone.
orig = ToolRegistry.available_tools
ToolRegistry.available_tools = lambda self, mode=None: [s for s in orig(self, mode) if s.mode != "FR" or kernels.numpy_kernel_applies(s.metric, s.metric_kwargs)]
from agentic_iqa.api import create_assessor
r = create_assessor(offline=True, device="cpu").assess(sys.argv[1], reference=sys.argv[2], use_cache=False)
logs = [(lg.tool_name, lg.raw_score, lg.working_size) for lg in r.evidence.tool_logs]
direct = {t: ToolRegistry(cache=False, offline=True, device="cpu").score(t, sys.argv[1], sys.argv[2]).raw_score for t in ("NLPD", "GMSD", "PSNR", "FSIM", "VIF")}
print(json.dumps({"logs": logs, "direct": direct, "loaded": sorted(m for m in ("torch", "pyiqa", "torchvision") if m in sys.modules)}))
"""


def test_offline_fr_assessment_with_kernel_tools_never_imports_torch(tmp_path):
    """A cold offline FR assessment whose tools all have torch-free kernels loads neither torch nor pyiqa."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    x, ref = FR_PAIRS["512x384"]
    xp, rp = tmp_path / "x.png", tmp_path / "r.png"
    Image.fromarray(x).save(xp)
    Image.fromarray(ref).save(rp)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", NO_TORCH_FR, str(xp), str(rp)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    fr_logs = [(name, raw) for name, raw, _ in result["logs"] if name in ("NLPD", "GMSD", "PSNR", "FSIM", "VIF")]
    assert fr_logs and all(raw is not None for _, raw in fr_logs), result
    assert all(raw is not None and size == [512, 384] for _, raw, size in result["logs"])
    assert set(result["direct"]) == {"NLPD", "GMSD", "PSNR", "FSIM", "VIF"} and all(v > 0 for v in result["direct"].values())
    assert result["loaded"] == []


def test_the_torch_free_metric_lists_name_exactly_the_kernels_that_exist():
    """kernels.py lists the torch-free metrics without importing nss/frmetrics (lazy imports); the lists
    and the modules' tables must not drift apart."""
    from iqa_tools import frmetrics, kernels, nss

    assert set(kernels.NUMPY_NR_METRICS) == set(nss.NUMPY_TOOLS)
    assert set(kernels.NUMPY_FR_METRICS) == set(frmetrics.NUMPY_FR_TOOLS)
