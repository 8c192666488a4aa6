"""The image as the VLM sees it.

Quality work needs the file's own bytes: re-encoding a JPEG (which `dspy.Image(pil_image)` and
`dspy.Image(raw_bytes)` both do through PIL) changes exactly what is being judged. So the data URL is
built from the bytes on disk, with the MIME type sniffed from the content rather than the file name.

Only when the image is larger than the VLM's limit (or in a format VLM APIs do not take, e.g. BMP or
TIFF) is a copy made for the VLM: downscaled if needed and encoded losslessly as PNG, with a note for
the trace. IQA tools always read the original file; this copy is for the VLM only.
"""
from __future__ import annotations

import base64
import io
import os
from typing import Optional

import dspy

__all__ = ["vlm_image", "with_reference", "REFERENCE_FIELD", "VLM_FORMATS"]

#: Formats the common VLM APIs accept inline (OpenAI, Anthropic, Gemini all take these four).
VLM_FORMATS: dict[str, str] = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp", "GIF": "image/gif"}


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


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


def vlm_image(path: str | os.PathLike, max_side: Optional[int] = None) -> tuple[dspy.Image, Optional[str]]:
    """The image at `path` as a `dspy.Image` for the VLM, and a note when it is not the original bytes.

    - Within the limit and in a format VLMs accept: the file's bytes, untouched; note is None.
    - Longer side above `max_side` (None = no limit): downscaled (Lanczos, aspect kept, EXIF orientation
      applied) and PNG-encoded; the note says so, e.g. "downscaled 4000×3000 → 1536×1152 PNG for the VLM;
      tools use the original".
    - A format VLM APIs do not take (BMP, TIFF, ...): converted to PNG at full size, with a note.

    Raises FileNotFoundError for a missing file and ValueError for a file PIL cannot read as an image.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side must be a positive number of pixels or None, got {max_side}")
    path = os.fspath(path)
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        img = Image.open(io.BytesIO(data))  # lazy: reads the header only
    except UnidentifiedImageError as exc:
        raise ValueError(f"{path} is not an image format PIL can read") from exc
    fmt = img.format or "?"
    width, height = img.size
    too_big = max_side is not None and max(width, height) > max_side
    if fmt in VLM_FORMATS and not too_big:
        return dspy.Image(_data_url(VLM_FORMATS[fmt], data)), None

    img = ImageOps.exif_transpose(img)  # the copy should look like the original does in a viewer
    if too_big:
        scale = max_side / max(img.size)
        size = (max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale)))
        img = _to_png_ready(img).resize(size, Image.Resampling.LANCZOS)
        note = f"downscaled {width}×{height} → {size[0]}×{size[1]} PNG for the VLM; tools use the original"
    else:
        img = _to_png_ready(img)
        note = f"converted {fmt} to PNG for the VLM (format not accepted by VLM APIs); tools use the original"
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return dspy.Image(_data_url("image/png", buf.getvalue())), note


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
