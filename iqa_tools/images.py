"""Turn whatever the caller has (path, bytes, PIL image, array, tensor) into what pyiqa needs.

pyiqa itself rejects `pathlib.Path` and numpy arrays, silently saturates 16-bit PNGs and drops alpha
(DESIGN §6), so we decode and convert ourselves and always hand it a float32 1×3×H×W tensor in [0, 1].

Conversions (each one leaves a note on the LoadedImage):
  * grayscale → the gray value copied to R, G and B
  * alpha (RGBA, LA, palette with transparency) → composited on white, as a viewer would show it
  * 16-bit → scaled by 1/65535 (not clipped at 255)
  * palette, CMYK, YCbCr, 1-bit … → RGB via Pillow
  * animated (GIF, APNG, WebP) → the first frame
EXIF orientation is *not* applied: pixels are scored as stored, the way pyiqa reads files.

Reading (`read_source`) is split from decoding (`decode`) so that the registry can compute the cache key
from the source bytes and skip decoding entirely on a cache hit.

One assessment decodes the same file several times (input check, offline statistics, each tool), which
costs ~0.3-0.5 s a time for a 12 MP JPEG: `decode` keeps the last few decoded files' pixels (by content
hash, bounded in count and bytes; the arrays are read-only) and hands out new LoadedImages over them.
"""
from __future__ import annotations

import hashlib
import io
import os
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

import numpy as np
from PIL import Image, UnidentifiedImageError

from iqa_tools import backend
from iqa_tools.errors import ImageError
from iqa_tools.files import MAX_IMAGE_FILE_BYTES, read_regular_file

DEFAULT_MAX_PIXELS = 100_000_000  # decompression-bomb guard; configs/pipeline.yaml max_image_pixels


def max_pixels_default() -> int:
    """The guard when no `max_pixels` is passed (agentic_iqa passes pipeline.max_image_pixels)."""
    return DEFAULT_MAX_PIXELS


@dataclass(frozen=True)
class ImageSource:
    """An input read but not decoded: its label for messages and the payload. Its content hash is
    computed on first use only (≈1 ms per 500 KB file), so uncached scoring does not pay for it."""

    label: str
    data: Optional[bytes] = None  # encoded file bytes (paths and bytes inputs)
    obj: Any = None  # PIL image / numpy array / torch tensor inputs

    @cached_property
    def sha256(self) -> str:
        if self.data is not None:
            return _sha(self.data)
        obj = self.obj
        if isinstance(obj, Image.Image):
            return _sha(f"PIL:{obj.mode}:{obj.size}".encode(), obj.tobytes())
        if isinstance(obj, np.ndarray):
            return _sha(f"ndarray:{obj.dtype.str}:{obj.shape}".encode(), np.ascontiguousarray(obj).tobytes())
        arr = np.ascontiguousarray(obj.detach().cpu().float().numpy())  # torch tensor
        return _sha(f"tensor:{arr.shape}".encode(), arr.tobytes())


@dataclass
class LoadedImage:
    """A decoded image. `pixels` is numpy; the torch tensor pyiqa needs is made on first use, so that
    validating an image, the offline statistics and cached tool scores never import torch (~3 s)."""

    pixels: np.ndarray  # H×W×3: uint8, or float32 in [0, 1]
    size: tuple[int, int]  # (width, height), as PIL reports it
    label: str
    source: ImageSource
    format: Optional[str] = None  # e.g. "PNG", "JPEG"; None for in-memory inputs
    notes: list[str] = field(default_factory=list)

    @cached_property
    def tensor(self) -> Any:
        """torch.FloatTensor, shape 1×3×H×W, values in [0, 1]."""
        torch = backend.torch()

        with warnings.catch_warnings():  # shared decoded pixels are read-only; the tensor below is a copy
            warnings.simplefilter("ignore", UserWarning)
            chw = torch.from_numpy(self.pixels).permute(2, 0, 1).unsqueeze(0)
        tensor = chw.to(dtype=torch.float32, memory_format=torch.contiguous_format)
        if tensor.data_ptr() == chw.data_ptr():  # already float32 and contiguous (1-pixel-wide images)
            tensor = tensor.clone()
        return tensor.div_(255.0) if self.pixels.dtype == np.uint8 else tensor  # scaling in torch: ~2× numpy

    def float_pixels(self) -> np.ndarray:
        """H×W×3 float32 in [0, 1] (the same values as `tensor`, without torch)."""
        if self.pixels.dtype == np.uint8:
            return self.pixels.astype(np.float32) / np.float32(255.0)
        return self.pixels

    @property
    def sha256(self) -> str:
        """sha256 of the file bytes (or of array/pixel bytes with dtype and shape for in-memory inputs)."""
        return self.source.sha256

    @cached_property
    def pixels_sha256(self) -> str:
        """sha256 of the decoded pixels with their dtype and shape: one picture saved as two files (re-saved, another
        format) has two `sha256` but one of these (~20 ms for a 12 MP photo)."""
        px = np.ascontiguousarray(self.pixels)
        return _sha(f"pixels:{px.dtype.str}:{px.shape}".encode(), px.data)

    @property
    def width(self) -> int:
        return self.size[0]

    @property
    def height(self) -> int:
        return self.size[1]


def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()


def _is_tensor(src: Any) -> bool:
    return type(src).__module__.startswith("torch") and hasattr(src, "detach")


def is_image_input(src: Any) -> bool:
    """Whether `read_source` takes `src`: a path (str or os.PathLike), encoded bytes, a PIL image, a numpy
    array or a torch tensor (an `ImageSource` too)."""
    return isinstance(src, (ImageSource, str, os.PathLike, bytes, bytearray, memoryview, Image.Image, np.ndarray)) \
        or _is_tensor(src)


def read_source(src: Any, label: Optional[str] = None) -> ImageSource:
    """Read the input (not decoded, not yet hashed). Raises ImageError for missing/empty/unreadable inputs."""
    if isinstance(src, ImageSource):
        return src
    if isinstance(src, str) and "://" in src[:12]:
        raise ImageError(f"{src}: URLs are not fetched; download the image first and pass the local file")
    if isinstance(src, str) and src.startswith("example:"):  # "example:chelsea", as the CLI and assess() take it
        from iqa_tools.examples import resolve_example

        label, src = label or src, resolve_example(src)
    if isinstance(src, (str, os.PathLike)):
        name = label or str(src)
        try:
            data = read_regular_file(src, name, MAX_IMAGE_FILE_BYTES, "an image file")
        except ValueError as exc:
            raise ImageError(str(exc)) from None
        if not data:
            raise ImageError(f"{name}: file is empty (0 bytes); re-export or re-download the image")
        return ImageSource(label=name, data=data)
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
        if not data:
            raise ImageError(f"{label or 'image bytes'}: empty (0 bytes)")
        return ImageSource(label=label or f"<{len(data)} bytes>", data=data)
    if isinstance(src, Image.Image):
        return ImageSource(label=label or f"<PIL {src.mode} {src.size[0]}×{src.size[1]}>", obj=src)
    if isinstance(src, np.ndarray):
        return ImageSource(label=label or f"<array {src.dtype} {src.shape}>", obj=src)
    if _is_tensor(src):
        return ImageSource(label=label or f"<tensor {tuple(src.shape)}>", obj=src)
    raise ImageError(
        f"{label or repr(src)[:60]}: unsupported image input of type {type(src).__name__}; "
        "pass a file path, bytes, a PIL image or a numpy array"
    )


def _too_many_pixels(label: str, w: int, h: int, max_pixels: int) -> ImageError:
    return ImageError(
        f"{label}: {w}×{h} = {w * h:,} pixels exceeds the limit of {max_pixels:,} "
        "(decompression-bomb guard); downscale it or raise max_image_pixels / AGENTIC_IQA_MAX_PIXELS"
    )


def _header_size(data: bytes) -> Optional[tuple[int, int]]:
    """(width, height) from the file's header, read by the format plugin without Pillow's own pixel check,
    which `Image.open` applies first and which refuses headers above 2 × Image.MAX_IMAGE_PIXELS with its
    own text. Nothing is decoded. None when no plugin reads it (or the plugin checks the size itself)."""
    prefix = data[:16]
    for registry in (Image.preinit, Image.init):
        registry()
        for fmt in list(Image.ID):
            factory, accept = Image.OPEN[fmt]
            try:
                accepted = accept(prefix) if accept is not None else True
                if not accepted or isinstance(accepted, str):  # a str is Pillow's "almost this format" warning
                    continue
                return tuple(factory(io.BytesIO(data), None).size)  # type: ignore[return-value]
            except Exception:  # noqa: BLE001 - not this format (or not readable): try the next
                continue
    return None


def _check_min_side(label: str, w: int, h: int, min_side: int) -> None:
    if min_side and min(w, h) < min_side:
        raise ImageError(f"{label}: {w}×{h} px is too small to assess (at least {min_side} px on each side); "
                         "pass a larger image")


def _open_bytes(data: bytes, label: str, max_pixels: int, min_side: int = 0) -> Image.Image:
    try:
        with warnings.catch_warnings():
            # We enforce our own (configurable) pixel limit below; Pillow's warning would be noise.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            w, h = im.size
            if w * h > max_pixels:
                raise _too_many_pixels(label, w, h, max_pixels)
            _check_min_side(label, w, h, min_side)  # from the header: a 1-px-tall strip is not decoded
            im.load()
            return im
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(f"{label}: not an image (or a format Pillow cannot read); pass a PNG, JPEG, WebP, TIFF, BMP or GIF file") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # Pillow refuses huge headers (> 2 × its MAX_IMAGE_PIXELS) before we see the size: say it our way.
        size = _header_size(data)
        if size is not None and size[0] * size[1] > max_pixels:
            raise _too_many_pixels(label, *size, max_pixels) from None
        pillow = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        shown = f"{size[0]}×{size[1]} = {size[0] * size[1]:,} pixels" if size else "its size"
        raise ImageError(f"{label}: {shown} exceeds Pillow's own limit of {pillow:,} pixels (decompression-bomb "
                         "guard, above max_image_pixels); downscale it") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"{label}: truncated or corrupt image data ({exc}); re-export or re-download it") from None


def _on_white(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    return rgb * alpha + (1.0 - alpha)


def _pil_to_array(im: Image.Image, notes: list[str]) -> np.ndarray:
    """H×W×3: float32 in [0, 1], or uint8 for 8-bit images (`LoadedImage` scales those by 1/255)."""
    if getattr(im, "n_frames", 1) > 1:
        notes.append(f"animated image: the first of {im.n_frames} frames is scored")
        im.seek(0)
    mode = im.mode
    if mode.startswith("I;16") or mode == "I":
        # 16-bit grayscale (mode "I" is how some formats deliver it): scale to [0, 1] by 65535.
        arr = np.asarray(im).astype(np.float32) / 65535.0
        notes.append("16-bit grayscale scaled to [0, 1]; gray copied to R, G, B")
        return np.repeat(np.clip(arr, 0, 1)[..., None], 3, axis=2)
    if mode == "F":
        arr = np.asarray(im, dtype=np.float32)
        top = float(np.nanmax(arr)) if arr.size else 0.0
        scale = 1.0 if top <= 1.0 else 255.0 if top <= 255.0 else 65535.0
        notes.append(f"32-bit float grayscale divided by {scale:g}; gray copied to R, G, B")
        return np.repeat(np.clip(arr / scale, 0, 1)[..., None], 3, axis=2)
    has_alpha = mode in ("RGBA", "LA", "La", "RGBa", "PA") or (mode == "P" and "transparency" in im.info)
    if has_alpha:
        rgba = np.asarray(im.convert("RGBA"), dtype=np.float32) / 255.0
        if rgba[..., 3].min() < 1.0:
            notes.append("alpha channel composited on white")
        return _on_white(rgba[..., :3], rgba[..., 3:4])
    if mode in ("L", "1"):
        notes.append("grayscale: gray copied to R, G, B")
        return np.repeat(np.asarray(im.convert("L"))[..., None], 3, axis=2)  # np.repeat copies: writable
    if mode != "RGB":
        notes.append(f"{mode} converted to RGB")
    return np.array(im.convert("RGB"))  # uint8, writable (torch.from_numpy wants that)


def _array_to_float(arr: np.ndarray, label: str, notes: list[str]) -> np.ndarray:
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[2] not in (1, 3, 4):
        arr = np.transpose(arr, (1, 2, 0))  # channels-first → channels-last
        notes.append("channels-first array transposed")
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise ImageError(f"{label}: array shape {arr.shape} is not an image; expected H×W, H×W×3 or H×W×4")
    if arr.dtype == np.uint8:
        f = arr.astype(np.float32) / 255.0
    elif arr.dtype == np.uint16:
        f = arr.astype(np.float32) / 65535.0
        notes.append("16-bit array scaled by 1/65535")
    elif arr.dtype == np.bool_:
        f = arr.astype(np.float32)
    elif np.issubdtype(arr.dtype, np.floating):
        f = arr.astype(np.float32)
        if not np.isfinite(f).all():
            raise ImageError(f"{label}: float array contains NaN or Inf")
        if f.min() < -1e-6 or f.max() > 1 + 1e-6:
            raise ImageError(
                f"{label}: float array values span [{f.min():.3g}, {f.max():.3g}]; "
                "float images must be in [0, 1] (divide 8-bit values by 255)"
            )
        f = np.clip(f, 0.0, 1.0)
    else:
        raise ImageError(f"{label}: unsupported array dtype {arr.dtype}; use uint8, uint16 or float in [0, 1]")
    if f.shape[2] == 4:
        if f[..., 3].min() < 1.0:
            notes.append("alpha channel composited on white")
        f = _on_white(f[..., :3], f[..., 3:4])
    elif f.shape[2] == 1:
        notes.append("grayscale: gray copied to R, G, B")
        f = np.repeat(f, 3, axis=2)
    return f


DECODED_CACHE_ENTRIES = 8
DECODED_CACHE_BYTES = 256 * 1024 * 1024
_decoded: "OrderedDict[tuple[str, int], tuple[np.ndarray, tuple[int, int], Optional[str], tuple[str, ...]]]" = OrderedDict()
_decoded_bytes = 0
_decoded_lock = threading.Lock()


def clear_decoded_cache() -> None:
    global _decoded_bytes
    with _decoded_lock:
        _decoded.clear()
        _decoded_bytes = 0


def decode(source: ImageSource, max_pixels: Optional[int] = None, min_side: int = 0) -> LoadedImage:
    """Decode a read source (pixels as numpy; `.tensor` on demand). Raises ImageError, also for an image
    with a side below `min_side` px (0: any size; tools check their own minimum when they run).

    Encoded files and bytes are decoded once while they stay among the recently decoded (see the
    module docstring); the returned pixels are then shared and read-only."""
    global _decoded_bytes
    limit = max_pixels or max_pixels_default()
    if source.data is None:
        return _decode(source, limit, min_side)
    key = (source.sha256, limit)
    with _decoded_lock:
        hit = _decoded.get(key)
        if hit is not None:
            _decoded.move_to_end(key)
    if hit is None:
        img = _decode(source, limit, min_side)
        img.pixels.flags.writeable = False
        size = img.pixels.nbytes
        with _decoded_lock:
            if key not in _decoded and size <= DECODED_CACHE_BYTES // 2:  # one huge image must not evict all
                _decoded[key] = (img.pixels, img.size, img.format, tuple(img.notes))
                _decoded_bytes += size
            while _decoded and (len(_decoded) > DECODED_CACHE_ENTRIES or _decoded_bytes > DECODED_CACHE_BYTES):
                _decoded_bytes -= _decoded.popitem(last=False)[1][0].nbytes
        return img
    pixels, size, fmt, notes = hit
    _check_min_side(source.label, *size, min_side)
    return LoadedImage(pixels=pixels, size=size, label=source.label, source=source, format=fmt, notes=list(notes))


def _decode(source: ImageSource, limit: int, min_side: int = 0) -> LoadedImage:
    notes: list[str] = []
    fmt = None
    obj = source.obj
    if source.data is not None:
        im = _open_bytes(source.data, source.label, limit, min_side)
        fmt = im.format
        hwc = _pil_to_array(im, notes)
    elif isinstance(obj, Image.Image):
        hwc = _pil_to_array(obj, notes)
    elif isinstance(obj, np.ndarray):
        hwc = _array_to_float(obj, source.label, notes)
    else:  # torch tensor: C×H×W or 1×C×H×W, float in [0, 1]
        t = obj.detach().cpu()
        if t.ndim == 4 and t.shape[0] == 1:
            t = t[0]
        if t.ndim != 3 or t.shape[0] not in (1, 3, 4):
            raise ImageError(f"{source.label}: tensor shape {tuple(obj.shape)} is not an image; expected 3×H×W or 1×3×H×W")
        hwc = _array_to_float(t.permute(1, 2, 0).numpy(), source.label, notes)
    h, w = hwc.shape[:2]
    if h == 0 or w == 0:
        raise ImageError(f"{source.label}: image has no pixels ({w}×{h})")
    _check_min_side(source.label, w, h, min_side)
    pixels = np.ascontiguousarray(hwc if hwc.dtype == np.uint8 else hwc.astype(np.float32, copy=False))
    return LoadedImage(pixels=pixels, size=(w, h), label=source.label, source=source, format=fmt, notes=notes)


def load_image(src: Any, *, label: Optional[str] = None, max_pixels: Optional[int] = None, min_side: int = 0) -> LoadedImage:
    """Read and decode one image. Accepts str/Path, bytes, PIL.Image, numpy array, torch tensor."""
    return decode(read_source(src, label), max_pixels, min_side)


def fit_pixels(img: LoadedImage, max_pixels: int) -> LoadedImage:
    """`img` itself if it has at most `max_pixels` pixels, else a downscaled copy (aspect kept, Lanczos)."""
    w, h = img.size
    if w * h <= max_pixels:
        return img
    scale = (max_pixels / (w * h)) ** 0.5
    size = (max(1, int(w * scale)), max(1, int(h * scale)))
    if img.pixels.dtype == np.uint8:
        small = np.array(Image.fromarray(img.pixels).resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0))
    else:  # float32 in [0, 1]: resample each channel in Pillow's 32-bit float mode
        small = np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(img.pixels[..., c])).resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0))
                          for c in range(3)], axis=-1).clip(0.0, 1.0).astype(np.float32)
    return LoadedImage(pixels=np.ascontiguousarray(small), size=size, label=img.label, source=img.source, format=img.format,
                       notes=[*img.notes, f"scored at {size[0]}×{size[1]}, downscaled from {w}×{h} (tool working size ≤ {max_pixels:,} px)"])
