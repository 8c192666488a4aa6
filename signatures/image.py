"""The image as the VLM sees it.

Quality work needs the file's own bytes: re-encoding a JPEG (which `dspy.Image(pil_image)` and
`dspy.Image(raw_bytes)` both do through PIL) changes exactly what is being judged. So by default the data
URL is built from the bytes on disk, with the MIME type sniffed from the content rather than the file name.

How the image travels is the `image_transport` setting (`agentic_iqa.config.image_transport_parts` parses
it into the keyword arguments of `vlm_image`):

- auto (default, faithful): the file's bytes when VLM APIs take its format, it is within the side limit
  and within `PROVIDER_MAX_BYTES`; otherwise a lossless PNG copy, and only when even that exceeds
  `PROVIDER_MAX_BYTES`, a high-quality JPEG (quality `AUTO_JPEG_QUALITY`).
- original: the file's bytes whatever their size (only a format VLM APIs do not take, or a side above
  the limit, makes a PNG copy).
- jpeg at quality Q: a JPEG copy (a JPEG file within the limits is sent as it is: a second JPEG
  generation would only add loss).
- a longest side N: a copy downscaled to at most N pixels on its longer side (Lanczos), encoded as auto
  or as JPEG.

IQA tools always read the original file; a copy is for the VLM only, and its note says what was done.
"""
from __future__ import annotations

import base64
import io
import os
from typing import Literal, Optional

import dspy

__all__ = ["vlm_image", "image_bytes", "with_reference", "REFERENCE_FIELD", "VLM_FORMATS", "PROVIDER_MAX_BYTES"]

#: Formats the common VLM APIs accept inline (OpenAI, Anthropic, Gemini all take these four).
VLM_FORMATS: dict[str, str] = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp", "GIF": "image/gif"}

#: The largest image `auto` sends losslessly: Anthropic's 5 MB per image counts the base64 text
#: (5 MB × 3/4 of raw bytes); OpenAI and Gemini take 20 MB, so this fits all three.
PROVIDER_MAX_BYTES = 3_750_000
AUTO_JPEG_QUALITY = 95  # above the size limit: visually lossless for quality judgements, ~5-10x smaller than PNG


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image_bytes(image: dspy.Image) -> int:
    """The bytes of image data a `dspy.Image` puts into a request (its data URL decoded), 0 for a URL."""
    url = getattr(image, "url", "") or ""
    if not url.startswith("data:") or "," not in url:
        return 0
    b64 = url.split(",", 1)[1]
    return len(b64) * 3 // 4 - (len(b64) - len(b64.rstrip("=")))


def _to_png_ready(img):
    """A mode PNG can store without losing what the VLM would see (CMYK, YCbCr, 16-bit converted)."""
    import numpy as np
    from PIL import Image

    if img.mode in ("RGB", "RGBA", "L", "LA"):
        return img
    if img.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        # 16-bit/float grayscale: scale to 8 bits instead of letting PIL clip (which saturates, see DESIGN §6).
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if arr.max(initial=0) > 255 else 255.0
        return Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    has_alpha = "A" in img.getbands() or "transparency" in img.info
    return img.convert("RGBA" if has_alpha else "RGB")


def _encode(img, fmt: str, quality: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    if fmt == "PNG":
        img.save(buf, format="PNG")
    else:
        if img.mode in ("RGBA", "LA"):  # JPEG has no alpha: what a viewer shows, over white
            ground = Image.new("RGB", img.size, (255, 255, 255))
            ground.paste(img.convert("RGBA"), mask=img.convert("RGBA").getchannel("A"))
            img = ground
        elif img.mode not in ("RGB", "L"):
            img = img.convert("RGB")
        img.save(buf, format="JPEG", quality=quality, subsampling=0 if quality >= 90 else 2)
    return buf.getvalue()


def vlm_image(
    path: str | os.PathLike,
    max_side: Optional[int] = None,
    *,
    transport: Literal["auto", "original", "jpeg"] = "original",
    quality: Optional[int] = None,
    side: Optional[int] = None,
    max_bytes: int = PROVIDER_MAX_BYTES,
) -> tuple[dspy.Image, Optional[str]]:
    """The image at `path` as a `dspy.Image` for the VLM, and a note when it is not the original bytes.

    `max_side`: the VLM's pixel limit (None = none); `transport`, `quality` (JPEG, 1-100), `side` (a
    longest side to downscale to) and `max_bytes` (auto's lossless limit): see the module docstring.
    Notes read like "downscaled 4000×3000 → 1536×1152 PNG for the VLM; tools use the original".

    Raises FileNotFoundError for a missing file and ValueError for a file PIL cannot read as an image.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    for name, value in (("max_side", max_side), ("side", side)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be a positive number of pixels or None, got {value}")
    if quality is not None and not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality must be 1-100, got {quality}")
    limit = min((v for v in (max_side, side) if v is not None), default=None)
    path = os.fspath(path)
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        img = Image.open(io.BytesIO(data))  # lazy: reads the header only
    except UnidentifiedImageError as exc:
        raise ValueError(f"{path} is not an image format PIL can read") from exc
    fmt = img.format or "?"
    width, height = img.size
    too_big = limit is not None and max(width, height) > limit
    as_is = fmt in VLM_FORMATS and not too_big and (
        transport == "original"
        or (transport == "auto" and len(data) <= max_bytes)
        or (transport == "jpeg" and fmt == "JPEG")
    )
    if as_is:
        return dspy.Image(_data_url(VLM_FORMATS[fmt], data)), None

    img = _to_png_ready(ImageOps.exif_transpose(img))  # the copy should look like the original does in a viewer
    if too_big:
        scale = limit / max(img.size)
        size = (max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale)))
        img = img.resize(size, Image.Resampling.LANCZOS)
    if transport == "jpeg":
        q = quality or 90
        out, how, why = _encode(img, "JPEG", q), f"JPEG (quality {q})", ""
    else:
        out, how, why = _encode(img, "PNG"), "PNG", ""
        if transport == "auto" and len(out) > max_bytes:
            out, how = _encode(img, "JPEG", AUTO_JPEG_QUALITY), f"JPEG (quality {AUTO_JPEG_QUALITY})"
            why = f" (lossless would exceed {max_bytes:,} bytes)"
    if too_big:
        what = f"downscaled {width}×{height} → {img.size[0]}×{img.size[1]} {how}"
    elif fmt not in VLM_FORMATS:
        what, why = f"converted {fmt} to {how}", why or " (format not accepted by VLM APIs)"
    else:
        what = f"re-encoded {fmt} ({len(data):,} bytes) as {how}"
    mime = "image/png" if how == "PNG" else "image/jpeg"
    return dspy.Image(_data_url(mime, out)), f"{what} for the VLM{why}; tools use the original"


#: The input field that carries the reference image in full-reference mode.
REFERENCE_FIELD = "reference_image"

_FR_INSTRUCTIONS = """\
Full-Reference mode: `image` is the distorted image (the one being assessed) and `reference_image` is its
reference, the pristine original of the same scene. Compare the distorted image with the reference image:
what differs between them is the distortion; what both share is the content, not a defect."""


def with_reference(signature: type[dspy.Signature]) -> type[dspy.Signature]:
    """The full-reference form of a signature that shows the VLM `image` (the paper's FR prompts present
    the distorted and the reference image together).

    A new signature, the given one untouched: `image` is labelled the distorted image, a
    `reference_image` input follows it, and the instructions say how to use the pair. Derived at call
    time from whatever signature the module holds, so compiled instructions and demos carry over, and
    the saved signatures (and their fingerprint) stay the no-reference ones.
    """
    if REFERENCE_FIELD in signature.input_fields:
        return signature
    names = list(signature.input_fields)
    if "image" not in names:
        raise ValueError(f"{signature.__name__} has no `image` input to pair a reference image with")
    sig = signature.with_updated_fields("image", desc="the distorted image: the image to assess")
    sig = sig.insert(
        names.index("image") + 1, REFERENCE_FIELD,
        dspy.InputField(desc="the reference image: the pristine original the distorted image is compared with"),
        type_=dspy.Image,
    )
    return sig.with_instructions(f"{signature.instructions.rstrip()}\n\n{_FR_INSTRUCTIONS}")
