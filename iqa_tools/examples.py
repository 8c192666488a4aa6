"""Example images for quick starts and tests: scikit-image's bundled samples written to the user cache dir.

    example_image("chelsea")              -> ~/.cache/agentic-iqa/examples/chelsea.png
    example_image("coffee", fmt="jpg")    -> …/coffee_q90.jpg
The CLI accepts `example:NAME` wherever it takes an image path.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal, Optional

from iqa_tools.errors import ImageError
from iqa_tools.paths import user_cache_dir

# scikit-image samples that ship inside the package (no download needed).
EXAMPLES = (
    "astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina",
    "camera", "brick", "grass", "gravel", "moon", "coins", "clock",
)  # fmt: skip
PREFIX = "example:"


def example_image(
    name: str = "chelsea",
    *,
    fmt: Literal["png", "jpg"] = "png",
    quality: int = 90,
    directory: Optional[Path | str] = None,
) -> Path:
    """Write scikit-image sample `name` as PNG (lossless) or JPEG (`quality`) once; return its path."""
    if name not in EXAMPLES:
        raise ImageError(f"unknown example image {name!r}; choose one of: {', '.join(EXAMPLES)}")
    if fmt not in ("png", "jpg"):
        raise ValueError(f"fmt must be 'png' or 'jpg', not {fmt!r}")
    filename = f"{name}.png" if fmt == "png" else f"{name}_q{quality}.jpg"
    folder = Path(directory) if directory else user_cache_dir() / "examples"
    try:
        return _written(name, fmt, quality, folder / filename)
    except OSError:
        if directory:
            raise
    # The user cache is not writable (read-only home, a file where the folder should be): the samples are
    # regenerable, so a private temporary folder of this process does as well.
    global _fallback_dir
    if _fallback_dir is None:
        _fallback_dir = Path(tempfile.mkdtemp(prefix="agentic-iqa-examples-"))
    return _written(name, fmt, quality, _fallback_dir / filename)


_fallback_dir: Optional[Path] = None


def _written(name: str, fmt: str, quality: int, path: Path) -> Path:
    """`path`, written from the scikit-image sample once (atomically)."""
    folder = path.parent
    if path.is_file():
        return path

    import skimage.data
    from PIL import Image

    im = Image.fromarray(getattr(skimage.data, name)())
    folder.mkdir(parents=True, exist_ok=True)
    # Write to a temporary name and rename, so a concurrent reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            if fmt == "png":
                im.save(fh, format="PNG")
            else:
                im.convert("RGB").save(fh, format="JPEG", quality=quality)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def resolve_example(src: str) -> Path | str:
    """`example:NAME[.jpg]` → the written file's path; anything else unchanged."""
    if isinstance(src, str) and src.startswith(PREFIX):
        name = src[len(PREFIX):]
        if name.endswith((".jpg", ".jpeg")):
            return example_image(name.rsplit(".", 1)[0], fmt="jpg")
        return example_image(name.removesuffix(".png"))
    return src
