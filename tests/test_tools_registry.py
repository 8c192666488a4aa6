"""ToolRegistry on real pyiqa: offline tools score, metrics are shared, tools fail fast, cache and fallbacks work."""
from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from PIL import Image

import iqa_tools.registry as registry_module
from iqa_tools import (
    DependencyMissingError,
    ImageError,
    ImageSizeMismatchError,
    ImageTooSmallError,
    ToolCache,
    ToolError,
    ToolExecutionLog,
    ToolModeError,
    ToolRegistry,
    ToolRunError,
    ToolScore,
    WeightsMissingError,
    default_registry,
)

SIDE = 192  # ≥ the largest minimum side of the offline tools (MS-SSIM: 161) and small enough to be quick


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A pristine photo crop, a noisy and a blurred version, a tiny image and a wrong-size one (PNG files)."""
    import skimage.data
    from PIL import ImageFilter

    d = tmp_path_factory.mktemp("imgs")
    ref = Image.fromarray(skimage.data.astronaut()).resize((SIDE, SIDE), Image.Resampling.LANCZOS)
    arr = np.asarray(ref).astype(np.float32)
    noisy = Image.fromarray(np.clip(arr + np.random.default_rng(0).normal(0, 25, arr.shape), 0, 255).astype(np.uint8))
    paths = {
        "ref": d / "ref.png",
        "noisy": d / "noisy.png",
        "blur": d / "blur.png",
        "tiny": d / "tiny.png",
        "small": d / "small.png",
        "mini": d / "mini.png",
        "other": d / "other.png",
    }
    ref.save(paths["ref"])
    noisy.save(paths["noisy"])
    ref.filter(ImageFilter.GaussianBlur(3)).save(paths["blur"])
    ref.resize((8, 8)).save(paths["tiny"])
    ref.resize((64, 64)).save(paths["small"])
    ref.resize((16, 16)).save(paths["mini"])
    ref.resize((SIDE, SIDE - 10)).save(paths["other"])
    return paths


@pytest.fixture(scope="module")
def reg():
    """One shared registry without a cache, so every score is computed."""
    return ToolRegistry(cache=False, offline=True, device="cpu")


@pytest.fixture
def count_creations(monkeypatch):
    """Counts metric creations (pyiqa metrics and torch-free kernels alike), by pyiqa metric name."""
    calls: list[str] = []
    real = ToolRegistry._create

    def spy(self, spec, *a, **kw):
        calls.append(spec.metric)
        return real(self, spec, *a, **kw)

    monkeypatch.setattr(ToolRegistry, "_create", spy)
    return calls


def _offline_tools() -> list[str]:
    r = ToolRegistry(cache=False, offline=True)
    return [s.name for s in r.table.tools.values() if r.availability(s.name)[0]]


def test_offline_tools_are_the_weight_free_ones():
    assert set(_offline_tools()) == {"FSIM", "GMSD", "SSIM", "VIF", "MS-SSIM", "PSNR", "VSI", "NIQE", "BRISQUE", "PIQE", "NLPD", "CW-SSIM"}


@pytest.mark.parametrize("tool", _offline_tools())
def test_every_offline_tool_returns_a_finite_score(reg, images, tool):
    spec = reg.spec(tool)
    ref = images["ref"] if spec.mode == "FR" else None
    s = reg.score(tool, images["noisy"], ref)
    assert isinstance(s, ToolScore) and s.tool == tool
    assert math.isfinite(s.raw_score) and 1.0 <= s.normalized_score <= 5.0
    assert s.normalization == ("logistic" if spec.beta else "linear")
    assert s.device == "cpu" and not s.cached and s.seconds >= 0
    if spec.mode == "FR":  # the reference against itself must score at least as well as the noisy image
        assert reg.score(tool, images["ref"], images["ref"]).normalized_score >= s.normalized_score


def test_quality_ordering_on_nr_tools(reg, images):
    for tool in ("NIQE", "BRISQUE", "PIQE"):
        clean, noisy = reg.score(tool, images["ref"]).raw_score, reg.score(tool, images["noisy"]).raw_score
        assert clean < noisy, tool  # both lower-is-better
    assert reg.score("NIQE", images["blur"]).raw_score > reg.score("NIQE", images["ref"]).raw_score


def test_metric_is_created_once_and_shared_by_threads(images, count_creations):
    r = ToolRegistry(cache=False, offline=True, device="cpu")
    results: list[float] = []

    def work():
        results.append(r.score("GMSD", images["noisy"], images["ref"]).raw_score)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r.score("GMSD", images["blur"], images["ref"])
    assert count_creations == ["gmsd"]
    assert len(set(results)) == 1 and len(results) == 4


def test_mode_misuse_is_a_clear_error(reg, images):
    with pytest.raises(ToolModeError, match="SSIM is a full-reference tool: it needs a reference image"):
        reg.score("SSIM", images["noisy"])
    with pytest.raises(ToolModeError, match="PIQE is a no-reference tool"):
        reg.score("PIQE", images["noisy"], images["ref"])


def test_too_small_and_mismatched_images(reg, images):
    with pytest.raises(ImageTooSmallError, match=r"tiny.png is 8×8, too small for SSIM, which needs at least 11 px"):
        reg.score("SSIM", images["tiny"], images["tiny"])
    with pytest.raises(ImageTooSmallError, match="needs at least 161 px"):
        reg.score("MS-SSIM", images["small"], images["small"])
    with pytest.raises(ImageSizeMismatchError, match=r"is 192×192 but the reference .*other.png is 192×182"):
        reg.score("PSNR", images["noisy"], images["other"])
    for bad, msg in ((images["ref"].parent / "missing.png", "file not found"), (images["ref"].parent, "is a directory")):
        with pytest.raises(ImageError, match=msg):
            reg.score("PIQE", bad)


def test_weight_tool_fails_fast_with_file_and_place(images, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    r = ToolRegistry(cache=False, offline=True)
    t0 = time.perf_counter()
    with pytest.raises(WeightsMissingError) as info:
        r.score("MUSIQ", images["noisy"])
    assert time.perf_counter() - t0 < 1.0
    msg = str(info.value)
    assert "musiq_koniq_ckpt-e95806b9.pth" in msg and f"{tmp_path}/torch/hub/pyiqa/" in msg and "offline mode" in msg
    ok, why = r.availability("MUSIQ")
    assert not ok and "musiq_koniq_ckpt-e95806b9.pth" in why

    t0 = time.perf_counter()
    with pytest.raises(DependencyMissingError, match="timm"):
        r.score("TOPIQ_FR", images["noisy"], images["ref"])
    assert time.perf_counter() - t0 < 1.0


def test_online_without_network_fails_fast_too(images, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    r = ToolRegistry(cache=False, offline=False)
    assert "downloads it on first use" in r.availability("MUSIQ")[1]
    t0 = time.perf_counter()
    with pytest.raises(WeightsMissingError, match="cannot reach 127.0.0.1 to download it"):
        r.score("MUSIQ", images["noisy"])
    assert time.perf_counter() - t0 < 1.5


def test_offline_setting_from_environment(monkeypatch):
    from agentic_iqa.config import load_settings

    def offline():
        return load_settings().build_registry(cache=False).offline

    monkeypatch.setenv("AGENTIC_IQA_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert offline() is False
    monkeypatch.setenv("AGENTIC_IQA_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert offline() is True
    monkeypatch.delenv("AGENTIC_IQA_OFFLINE")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert offline() is True
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert offline() is False
    assert ToolRegistry(cache=False).offline is False  # iqa_tools itself reads no environment


def test_weights_dir_checkpoint_is_passed_to_pyiqa(images, tmp_path):
    import torch

    torch.save({"not": torch.zeros(1)}, tmp_path / "musiq_koniq_ckpt-e95806b9.pth")  # plain data, wrong content
    r = ToolRegistry(cache=False, offline=True, weights_dir=tmp_path)
    assert r.availability("MUSIQ") == (True, "weights present")
    with pytest.raises(ToolRunError, match="pyiqa could not create metric 'musiq'"):
        r.score("MUSIQ", images["noisy"])  # pyiqa really tried to load our file


def test_cache_hit_across_registries_does_no_forward(images, tmp_path, count_creations):
    first = ToolRegistry(cache=ToolCache(tmp_path), offline=True)
    a = first.score("PIQE", images["noisy"])
    assert not a.cached and count_creations == ["piqe"]

    second = ToolRegistry(cache=ToolCache(tmp_path), offline=True)
    logs = second.run("PIQE", images["noisy"])
    assert len(logs) == 1 and logs[0].cached and logs[0].ok
    assert logs[0].raw_score == a.raw_score and logs[0].normalized_score == a.normalized_score
    assert count_creations == ["piqe"] and second._metrics == {}  # no metric created, so no forward pass

    assert not second.score("PIQE", images["noisy"], use_cache=False).cached  # bypass
    assert not second.score("PIQE", images["blur"]).cached  # other image
    assert second.score("PIQE", str(images["noisy"])).cached  # same bytes, other spelling of the path
    fr = second.score("PSNR", images["noisy"], images["ref"])
    assert not fr.cached and second.score("PSNR", images["noisy"], images["ref"]).cached
    assert not second.score("PSNR", images["noisy"], images["blur"]).cached  # other reference


def test_tool_version_bump_invalidates(images, tmp_path):
    cache = ToolCache(tmp_path / "c")
    ToolRegistry(cache=cache, offline=True).score("PIQE", images["ref"])
    bumped = tmp_path / "bump.yaml"
    bumped.write_text("tools:\n  - name: PIQE\n    version: '2'\n")
    assert not ToolRegistry(table_paths=[bumped], cache=cache, offline=True).score("PIQE", images["ref"]).cached


def test_fallback_chain_for_missing_weights(reg, images):
    logs = reg.run("MUSIQ", images["noisy"], object_name="sky", distortion="Noise")
    assert [entry.tool_name for entry in logs] == ["MUSIQ", "NIQE"]
    failed, used = logs
    assert "musiq_koniq_ckpt" in failed.error and not failed.fallback and math.isnan(failed.normalized_score)
    assert used.ok and used.fallback and used.fallback_for == "MUSIQ"
    assert (used.object_name, used.distortion) == ("sky", "Noise")
    for entry in logs:  # they are valid spec-001 records and survive JSON
        assert ToolExecutionLog.model_validate_json(entry.model_dump_json()).tool_name == entry.tool_name


def test_fallback_order_niqe_brisque_then_best_nr_tool(reg, images):
    logs = reg.run("MUSIQ", images["small"])  # 64 px: below NIQE's 96, above BRISQUE's 32
    assert [(e.tool_name, e.ok) for e in logs] == [("MUSIQ", False), ("NIQE", False), ("BRISQUE", True)]
    assert "too small for NIQE" in logs[1].error
    logs = reg.run("MUSIQ", images["mini"])  # 16 px: only PIQE (8) takes it
    assert [(e.tool_name, e.ok) for e in logs] == [("MUSIQ", False), ("NIQE", False), ("BRISQUE", False), ("PIQE", True)]
    assert all(e.fallback and e.fallback_for == "MUSIQ" for e in logs[1:])


def test_brisque_model_not_installed_says_how(images, tmp_path):
    table = tmp_path / "t.yaml"
    table.write_text("tools:\n  - name: BRISQUE\n    model_path: nowhere/brisque_live_allmodel.pt\n")
    r = ToolRegistry(table_paths=[table], cache=False, offline=False, device="cpu")
    ok, why = r.availability("BRISQUE")
    assert not ok and "python -m iqa_tools.model_files install brisque" in why and "downloads" not in why
    with pytest.raises(WeightsMissingError, match="install brisque"):
        r.score("BRISQUE", images["ref"])  # at once, no network attempt: pyiqa cannot fetch this file


def test_model_file_that_is_code_is_refused(images, tmp_path):
    import torch

    bad = tmp_path / "brisque_live_allmodel.pt"
    torch.save((print, torch.zeros(3)), bad)  # a pickled reference to a callable: weights_only refuses it
    table = tmp_path / "t.yaml"
    table.write_text(f"tools:\n  - name: BRISQUE\n    model_path: {bad}\n")
    with pytest.raises(ToolRunError, match="not a plain tensor file"):
        ToolRegistry(table_paths=[table], cache=False, offline=True, device="cpu").score("BRISQUE", images["ref"])


def test_fallback_for_misuse_unknown_tool_and_nan(reg, images, monkeypatch):
    logs = reg.run("SSIM", images["noisy"])  # FR without reference
    assert "needs a reference image" in logs[0].error and logs[-1].tool_name == "NIQE" and logs[-1].ok

    logs = reg.run("SuperIQA-9000", images["noisy"])
    assert "unknown tool" in logs[0].error and logs[-1].ok and logs[-1].fallback_for == "SuperIQA-9000"

    real = ToolRegistry._forward

    def nan_for_psnr(metric, lock, spec, x, ref):
        return [float("nan")] if spec.name == "PSNR" else real(metric, lock, spec, x, ref)

    monkeypatch.setattr(reg, "_forward", nan_for_psnr)
    logs = reg.run("psnr", images["noisy"], images["ref"])
    assert logs[0].tool_name == "PSNR" and "non-finite score (nan)" in logs[0].error
    assert logs[1].ok and logs[1].fallback_for == "PSNR"
    assert reg.run("PSNR", images["noisy"], images["ref"], fallback=False)[0].error


def test_run_success_nr_with_reference_and_image_errors(reg, images):
    (ok,) = reg.run("PSNR", images["noisy"], images["ref"])
    assert ok.ok and not ok.fallback and ok.normalization == "linear" and ok.device == "cpu"
    (nr,) = reg.run("PIQE", images["noisy"], images["ref"])  # run() lets NR tools ignore a reference
    assert nr.ok
    with pytest.raises(ImageError, match="file not found"):
        reg.run("PIQE", images["ref"].parent / "missing.png")
    with pytest.raises(ImageSizeMismatchError):
        reg.run("PSNR", images["noisy"], images["other"])


def test_score_many_batches_and_isolates_bad_items(images, tmp_path):
    r = ToolRegistry(cache=ToolCache(tmp_path), offline=True, batch_size=2)
    items = [images["noisy"], tmp_path / "missing.png", images["tiny"], images["blur"], images["ref"]]
    refs = [images["ref"], images["ref"], images["tiny"], images["ref"], None]
    out = r.score_many("SSIM", items, refs)
    assert isinstance(out[0], ToolScore) and isinstance(out[3], ToolScore)
    assert isinstance(out[1], ImageError) and isinstance(out[2], ImageTooSmallError)
    assert isinstance(out[4], ToolModeError)
    single = ToolRegistry(cache=False, offline=True)
    assert out[0].raw_score == pytest.approx(single.score("SSIM", images["noisy"], images["ref"]).raw_score, abs=1e-6)
    assert out[3].raw_score == pytest.approx(single.score("SSIM", images["blur"], images["ref"]).raw_score, abs=1e-6)
    again = r.score_many("SSIM", items[:1], refs[:1])
    assert again[0].cached

    nr = r.score_many("PIQE", [images["noisy"], images["blur"], images["ref"]], use_cache=False)
    assert [round(s.raw_score, 4) for s in nr] == [round(single.score("PIQE", p).raw_score, 4) for p in (images["noisy"], images["blur"], images["ref"])]
    with pytest.raises(WeightsMissingError):
        r.score_many("MUSIQ", [images["noisy"]])
    with pytest.raises(ToolModeError):
        r.score_many("PIQE", [images["noisy"]], [images["ref"]])


def test_in_memory_inputs(reg, images):
    arr = np.asarray(Image.open(images["noisy"]))
    from_file = reg.score("PIQE", images["noisy"]).raw_score
    assert reg.score("PIQE", arr).raw_score == pytest.approx(from_file, abs=1e-5)
    assert reg.score("PIQE", Image.open(images["noisy"])).raw_score == pytest.approx(from_file, abs=1e-5)
    assert reg.score("PIQE", images["noisy"].read_bytes()).raw_score == from_file


def test_devices():
    assert ToolRegistry(cache=False, device="cpu").device == "cpu"
    import torch

    if not torch.cuda.is_available():
        assert ToolRegistry(cache=False).device in ("cpu", "mps")
        with pytest.raises(ToolError, match="CUDA is not available"):
            ToolRegistry(cache=False, device="cuda:0").device
    with pytest.raises(ToolError, match="unknown device 'gpu0'"):
        ToolRegistry(cache=False, device="gpu0").device


def test_default_registry_is_shared():
    a = default_registry(cache=False, offline=True)
    assert default_registry(cache=False, offline=True) is a
    assert default_registry(cache=False, offline=True, device="cpu") is not a
    assert isinstance(registry_module.default_registry(), ToolRegistry)


def test_availability_is_reused_then_rechecked(tmp_path, monkeypatch):
    """Tool-selection prompts ask for every tool's availability: answers are kept for a few seconds."""
    r = ToolRegistry(cache=False, offline=True, weights_dir=tmp_path)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    assert r.availability("MUSIQ")[0] is False
    (tmp_path / "musiq_koniq_ckpt-e95806b9.pth").write_bytes(b"x")
    assert r.availability("MUSIQ")[0] is False  # still the remembered answer
    monkeypatch.setattr(registry_module, "AVAILABILITY_TTL", 0.0)
    assert r.availability("MUSIQ") == (True, "weights present")


def test_large_images_are_scored_at_the_tool_working_size(tmp_path):
    rng = np.random.default_rng(1)
    big = tmp_path / "big.png"
    arr = (rng.random((1500, 2000, 3)) * 255).astype(np.uint8)  # 3 MP
    Image.fromarray(arr).save(big)
    r = ToolRegistry(cache=False, offline=True, device="cpu")
    piqe = r.score("PIQE", big)  # PIQE's working size: 786,432 px (1024×768)
    assert piqe.working_size == (1024, 768) and any("downscaled from 2000×1500" in n for n in piqe.notes)
    assert piqe.to_log().working_size == (1024, 768)
    fr = r.score("MS-SSIM", big, big)  # 1,000,000 px for MS-SSIM; image and reference alike
    assert fr.working_size == (1154, 866) and fr.raw_score == pytest.approx(1.0, abs=1e-6)
    small = r.score("PIQE", Image.fromarray(arr[:600, :800]))
    assert small.working_size == (800, 600) and not any("downscaled" in n for n in small.notes)


def test_example_names_work_in_the_registry_as_in_the_cli(reg):
    # `ToolRegistry().score("PIQE", "example:chelsea")` said "file not found" though the CLI and assess() take it.
    from iqa_tools.examples import example_image

    by_name = reg.score("PIQE", "example:chelsea")
    assert math.isfinite(by_name.raw_score) and by_name.raw_score == reg.score("PIQE", str(example_image("chelsea"))).raw_score
    with pytest.raises(ImageError, match="unknown example image"):
        reg.score("PIQE", "example:nosuchphoto")
