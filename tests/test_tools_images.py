"""load_image: every input kind becomes a float32 1×3×H×W tensor in [0, 1]; bad inputs say what is wrong."""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from iqa_tools import ImageError, example_image, load_image
from iqa_tools.examples import resolve_example

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (40, 60, 3), dtype=np.uint8)


def _png(arr_or_im, **kw) -> bytes:
    im = arr_or_im if isinstance(arr_or_im, Image.Image) else Image.fromarray(arr_or_im)
    buf = io.BytesIO()
    im.save(buf, format=kw.pop("format", "PNG"), **kw)
    return buf.getvalue()


def _check(loaded, w=60, h=40):
    assert loaded.tensor.dtype == torch.float32
    assert tuple(loaded.tensor.shape) == (1, 3, h, w)
    assert loaded.size == (w, h)
    assert 0.0 <= float(loaded.tensor.min()) and float(loaded.tensor.max()) <= 1.0
    assert len(loaded.sha256) == 64


def test_path_str_and_bytes_agree(tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(_png(RGB))
    a, b, c = load_image(p), load_image(str(p)), load_image(p.read_bytes())
    for x in (a, b, c):
        _check(x)
    assert a.sha256 == b.sha256 == c.sha256  # the hash is of the file's bytes
    assert torch.equal(a.tensor, c.tensor)
    assert np.allclose(a.tensor[0].permute(1, 2, 0).numpy() * 255, RGB, atol=1e-3)
    assert a.format == "PNG" and a.notes == []


def test_pil_and_numpy_inputs():
    _check(load_image(Image.fromarray(RGB)))
    _check(load_image(RGB))
    _check(load_image(RGB.astype(np.float64) / 255))  # float64 is converted to float32
    _check(load_image(torch.from_numpy(RGB).permute(2, 0, 1).float() / 255))
    assert load_image(RGB).sha256 != load_image(RGB[::-1].copy()).sha256


def test_grayscale_is_copied_to_three_channels():
    gray = RNG.integers(0, 256, (40, 60), dtype=np.uint8)
    loaded = load_image(_png(gray))
    _check(loaded)
    assert torch.equal(loaded.tensor[0, 0], loaded.tensor[0, 2])
    assert any("grayscale" in n for n in loaded.notes)


def test_sixteen_bit_png_is_scaled_not_saturated():
    ramp = np.linspace(0, 65535, 40 * 60).reshape(40, 60).astype(np.uint16)
    loaded = load_image(_png(ramp))
    _check(loaded)
    assert float(loaded.tensor.max()) == pytest.approx(1.0)
    assert float(loaded.tensor[0, 0, 20, 30]) == pytest.approx(ramp[20, 30] / 65535, abs=1e-6)
    assert any("16-bit" in n for n in loaded.notes)
    assert float(load_image(ramp).tensor.max()) == pytest.approx(1.0)  # uint16 arrays too


def test_rgba_is_composited_on_white():
    rgba = np.zeros((40, 60, 4), dtype=np.uint8)
    rgba[..., 0] = 255  # red
    rgba[:, :30, 3] = 255  # left half opaque, right half transparent
    loaded = load_image(_png(rgba))
    _check(loaded)
    assert loaded.tensor[0, :, 5, 5].tolist() == [1.0, 0.0, 0.0]
    assert loaded.tensor[0, :, 5, 50].tolist() == [1.0, 1.0, 1.0]
    assert "alpha channel composited on white" in loaded.notes
    assert load_image(rgba).tensor[0, :, 5, 50].tolist() == [1.0, 1.0, 1.0]


def test_palette_cmyk_and_animated():
    pal = Image.fromarray(RGB).convert("P", palette=Image.Palette.ADAPTIVE)
    _check(load_image(_png(pal)))
    cmyk = Image.fromarray(RGB).convert("CMYK")
    loaded = load_image(_png(cmyk, format="JPEG"))
    _check(loaded)
    assert "CMYK converted to RGB" in loaded.notes
    frames = [Image.fromarray(np.full((40, 60, 3), v, np.uint8)) for v in (0, 255)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    gif = load_image(buf.getvalue())
    _check(gif)
    assert float(gif.tensor.max()) == 0.0  # the first frame
    assert any("first of 2 frames" in n for n in gif.notes)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "nope.png", "nope.png: file not found"),
        (lambda d: d, "is a directory"),
        (lambda d: _write(d / "empty.png", b""), "empty.png: file is empty"),
        (lambda d: _write(d / "cut.png", _png(RGB)[:200]), "cut.png: truncated or corrupt"),
        (lambda d: _write(d / "notes.png", b"hello, I am text" * 20), "notes.png: not an image"),
        (lambda d: "https://example.com/cat.jpg", "download the image first"),
    ],
)
def test_bad_files_give_clear_errors(tmp_path, make, message):
    with pytest.raises(ImageError, match=message):
        load_image(make(tmp_path))


def _write(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    p = _write(tmp_path / "secret.png", _png(RGB))
    p.chmod(0)
    with pytest.raises(ImageError, match="permission denied"):
        load_image(p)


def test_bad_arrays():
    with pytest.raises(ImageError, match=r"float images must be in \[0, 1\]"):
        load_image(RGB.astype(np.float32))
    with pytest.raises(ImageError, match="not an image"):
        load_image(np.zeros((4, 5, 6, 7), np.uint8))
    with pytest.raises(ImageError, match="NaN"):
        load_image(np.full((8, 8), np.nan, np.float32))
    with pytest.raises(ImageError, match="unsupported image input"):
        load_image(12345)


def test_decompression_bomb_guard():
    big = _png(np.zeros((300, 400), np.uint8))
    with pytest.raises(ImageError, match="exceeds the limit of 100,000"):
        load_image(big, max_pixels=100_000)
    _check(load_image(big, max_pixels=120_000), 400, 300)


def test_example_images(tmp_path):
    p = example_image("chelsea", directory=tmp_path)
    assert p.is_file() and load_image(p).size == (451, 300)
    assert example_image("chelsea", directory=tmp_path) == p  # written once
    j = example_image("camera", fmt="jpg", directory=tmp_path)
    assert j.suffix == ".jpg" and load_image(j).format == "JPEG"
    assert Path(resolve_example("example:coffee")).name == "coffee.png"
    assert resolve_example("plain.png") == "plain.png"
    with pytest.raises(ImageError, match="unknown example image 'lena'"):
        example_image("lena")


def test_pixels_and_tensor_agree_and_validation_needs_no_torch(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "x.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(path)
    loaded = load_image(path)
    assert loaded.pixels.dtype == np.uint8 and loaded.pixels.shape == (40, 60, 3)
    assert np.array_equal(loaded.float_pixels(), loaded.tensor[0].permute(1, 2, 0).numpy())
    # A fresh process: decoding for validation (and the offline statistics) must not pay torch's import.
    code = f"import sys; from iqa_tools import load_image; load_image({str(path)!r}).float_pixels(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_repeated_offline_assessment_does_not_import_torch(tmp_path):
    """An offline assessment whose tool has a torch-free kernel needs no torch, the first time (the kernel
    runs) and again (the score is cached)."""
    import subprocess
    import sys

    from iqa_tools.model_files import load_brisque_arrays

    load_brisque_arrays()  # the BRISQUE .npz `install brisque` writes (made here from the .pt on older installs)
    path = example_image("coins")
    code = ("import sys; from agentic_iqa.api import Assessor; from agentic_iqa.config import load_settings; "
            f"r = Assessor(load_settings(backend='offline')).assess({str(path)!r}); "
            "print(r.evidence.tool_logs[0].cached, 'torch' in sys.modules)")
    env = dict(os.environ, AGENTIC_IQA_CACHE_DIR=str(tmp_path / "cache"))
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
            for _ in range(2)]
    assert [r.stdout.split()[-2:] for r in runs] == [["False", "False"], ["True", "False"]], [r.stderr[-500:] for r in runs]


def test_example_images_work_when_the_user_cache_is_not_writable(tmp_path, monkeypatch):
    """A file where the cache folder should be (or a read-only home): examples go to a private temp folder."""
    import iqa_tools.examples as ex

    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(ex, "_fallback_dir", None)
    path = ex.resolve_example("example:coins")
    assert path.is_file() and not str(path).startswith(str(blocker)) and path.stat().st_size > 0
