"""The bad-input matrix's inputs, built from scratch (tests/test_bad_inputs.py; the README table is
made by running the real CLI on these). `build(folder)` writes them all and returns {row: Case}."""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from canned import write_test_image

SIZE = (128, 96)  # large enough for every weight-free NR tool (NIQE, the offline default, needs 96 px a side)
LONG_QUERY = "Rate the quality of this photo, paying attention to " + "every little detail " * 600


@dataclass
class Case:
    """One row: the CLI arguments after `assess` (the image first) and what the row is about."""

    args: list[str]
    what: str
    extra: dict = field(default_factory=dict)


def _rgb(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w, h = SIZE
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / (w - 1), yy * 255 / (h - 1), (xx + yy) * 127 / (w + h - 2)], -1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def build(folder: Path) -> dict[str, Case]:
    folder.mkdir(parents=True, exist_ok=True)
    good = write_test_image(folder / "good.jpg", size=SIZE, quality=70)
    cases: dict[str, Case] = {}

    cases["missing file"] = Case([str(folder / "nope.jpg")], "a path that does not exist")
    (folder / "a_folder").mkdir(exist_ok=True)
    cases["directory where a file is expected"] = Case(
        [str(good), "--reference", str(folder / "a_folder")], "--reference names a folder")
    cases["folder without --out"] = Case([str(folder / "a_folder")], "a folder given as the image, no --out")

    (folder / "empty.jpg").write_bytes(b"")
    cases["0-byte file"] = Case([str(folder / "empty.jpg")], "an empty file")

    data = good.read_bytes()
    (folder / "truncated.jpg").write_bytes(data[: len(data) // 2])
    cases["truncated JPEG"] = Case([str(folder / "truncated.jpg")], "the first half of a JPEG")

    (folder / "text.jpg").write_text("this is not an image, just text with a .jpg name\n")
    cases["text file named .jpg"] = Case([str(folder / "text.jpg")], "plain text")

    gray16 = (np.linspace(0, 65535, SIZE[0] * SIZE[1]).reshape(SIZE[1], SIZE[0])).astype(np.uint16)
    Image.fromarray(gray16).save(folder / "gray16.png")  # uint16 → mode I;16, written as a 16-bit PNG
    cases["16-bit PNG"] = Case([str(folder / "gray16.png")], "16-bit grayscale PNG")

    rgba = np.dstack([_rgb(1), np.full(SIZE[::-1], 128, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(folder / "rgba.png")
    cases["RGBA PNG"] = Case([str(folder / "rgba.png")], "RGBA PNG, half transparent")

    Image.fromarray(_rgb(2), "RGB").convert("CMYK").save(folder / "cmyk.jpg", format="JPEG", quality=90)
    cases["CMYK JPEG"] = Case([str(folder / "cmyk.jpg")], "CMYK JPEG")

    Image.fromarray(_rgb(3), "RGB").convert("L").save(folder / "gray.jpg", format="JPEG", quality=90)
    cases["grayscale"] = Case([str(folder / "gray.jpg")], "8-bit grayscale JPEG")

    Image.fromarray(_rgb(4), "RGB").convert("P", palette=Image.ADAPTIVE, colors=64).save(folder / "palette.gif")
    cases["palette GIF"] = Case([str(folder / "palette.gif")], "64-colour palette GIF")

    frames = [Image.fromarray(_rgb(10 + i), "RGB").convert("P", palette=Image.ADAPTIVE) for i in range(3)]
    frames[0].save(folder / "animated.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    cases["animated GIF"] = Case([str(folder / "animated.gif")], "3-frame animated GIF")

    Image.fromarray(_rgb(5)[:8, :8], "RGB").save(folder / "tiny8.png")
    cases["8×8 image"] = Case([str(folder / "tiny8.png")], "8×8 PNG (below the 48 px an assessment needs a side)")

    # 12000×12000 = 144 M pixels: above our default limit (100 M), below Pillow's own hard refusal
    # (2 × 89 M), so our guard is the one that speaks. Bilevel PNG: ~0.1 MB on disk.
    bomb = folder / "bomb.png"
    if not bomb.exists():
        Image.new("1", (12000, 12000), 0).save(bomb, optimize=True)
    cases["decompression bomb"] = Case([str(bomb)], "12000×12000 PNG of 0.1 MB")

    small_ref = write_test_image(folder / "ref_small.png", size=(64, 48), fmt="PNG")
    cases["reference of another size"] = Case([str(good), "--reference", str(small_ref)], "128×96 image, 64×48 reference")
    cases["reference of another size, --resize-reference"] = Case(
        [str(good), "--reference", str(small_ref), "--resize-reference"], "same, resizing asked for")
    cases["reference equal to the image"] = Case([str(good), "--reference", str(good)], "the image as its own reference")
    copy = folder / "good_copy.png"
    with Image.open(good) as im:
        im.save(copy)
    cases["reference equal to the image, another file"] = Case([str(good), "--reference", str(copy)],
                                                               "the image's pixels saved as a PNG")

    locked = folder / "locked.jpg"
    locked.write_bytes(data)
    locked.chmod(0)
    cases["unreadable permissions"] = Case([str(locked)], "mode 000 (root: without its DAC capabilities)", {"needs_non_root": True})

    odd_dir = folder / "my photos"
    odd_dir.mkdir(exist_ok=True)
    odd = odd_dir / "café ☕ été.jpg"
    odd.write_bytes(data)
    cases["path with spaces and non-ASCII"] = Case([str(odd)], "my photos/café ☕ été.jpg")

    for name, target in (("loop1", "loop2"), ("loop2", "loop1")):
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(target)
    cases["symlink loop as the image"] = Case([str(folder / "loop1")], "loop1 → loop2 → loop1")
    scanned = folder / "scanned"
    scanned.mkdir(exist_ok=True)
    (scanned / "ok.jpg").write_bytes(data)
    if not (scanned / "loop.jpg").is_symlink():
        (scanned / "loop.jpg").symlink_to("loop.jpg")
    cases["symlink loop in a scanned folder"] = Case(
        [str(scanned), "--out", str(folder / "scanned.jsonl"), "--overwrite"], "a photo and loop.jpg → itself",
        {"batch": True})

    cases["URL"] = Case(["https://example.com/photo.jpg"], "an https URL")
    cases["empty query"] = Case([str(good), "--query", ""], '--query ""')
    cases["absurdly long query"] = Case([str(good), "--query", LONG_QUERY], f"a {len(LONG_QUERY):,}-character query")
    return cases


def jpeg_bytes(arr: np.ndarray, quality: int = 80) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def png_claiming(path: Path, width: int, height: int) -> Path:
    """A tiny PNG whose IHDR claims `width`×`height` (CRC fixed): a huge header without a huge file."""
    import struct
    import zlib

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (90, 120, 150)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))
    return path


# ── the README table: run the real CLI on every row ─────────────────────────────────────────────


# Root reads a mode-000 file through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH; without them (dropped
# from the bounding set before exec) root is refused like any other owner.
DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def _run_cli(args: list[str], env: dict, as_user: bool = False) -> tuple[int, str, str, float]:
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-c", "from agentic_iqa.cli import main; main()", "assess", *args, "--offline"]
    if as_user:
        cmd = [*DROP_DAC, *cmd]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0


def _seen(code: int, out: str, err: str) -> str:
    """What the user sees, condensed: the error line, or the answer line plus notes/fallbacks."""
    import re

    if code == 3:  # a batch that finished with failed items: what their lines say
        failed = re.findall(r"failed: (.*?)(?= failed: | manifest: | note: |$)", " ".join(out.split()))
        return "; ".join(f"failed line: {f.strip()}" for f in failed) + "; the other images are assessed"
    if code != 0:
        return " ".join(err.split())
    text = " ".join(out.split())
    head = re.search(r"(Level [A-E] · score [\d.]+ / 5)", text)
    # Tools that could not run say why in the Tools table; the minimum-size refusals matter here.
    small = sorted(set(re.findall(r"too small for [\w-]+", text)))
    extras = re.findall(r"(?:note|fallback): (.*?)(?= note: | fallback: |$)", text)
    parts = [head.group(1) if head else text[:80]] + (["tools table: " + ", ".join(small)] if small else [])
    return "; ".join(parts + [e.strip() for e in extras])


def markdown_table(folder: Path) -> str:
    import os
    import tempfile

    cases = build(folder)
    cache = Path(tempfile.mkdtemp(prefix="aiqa-table-cache-"))
    env = {**os.environ, "AGENTIC_IQA_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1", "COLUMNS": "400"}
    rows = ["| input | what the user sees | exit code |", "|---|---|---|"]
    for name, case in cases.items():
        as_user = bool(case.extra.get("needs_non_root")) and os.geteuid() == 0
        code, out, err, secs = _run_cli(case.args, env, as_user)
        seen = _seen(code, out, err).replace(f"{folder}/", "").replace("|", "\\|")
        tb = " **TRACEBACK**" if "Traceback" in out + err else ""
        rows.append(f"| {name} ({case.what}) | {seen}{tb} | {code} |")
        print(f"{name}: exit {code} in {secs:.1f} s", flush=True)
    return "\n".join(rows)


if __name__ == "__main__":
    import sys
    import tempfile

    print(markdown_table(Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="aiqa-bad-"))))
