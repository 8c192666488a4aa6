"""The bad-input matrix (issue 6), one test per row, through the real `agentic-iqa assess` command
(typer's CliRunner, offline backend): a clear message naming the input, the documented exit code,
never a traceback. The README table is produced from the same inputs by `python tests/bad_inputs.py`.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bad_inputs import DROP_DAC, LONG_QUERY, Case, build, png_claiming

from agentic_iqa.cli import app
from agentic_iqa.cli.common import EXIT_BAD_INPUT, EXIT_OK, EXIT_PARTIAL

runner = CliRunner()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return build(tmp_path_factory.mktemp("bad inputs"))


def cli(*args: str):
    result = runner.invoke(app, ["assess", *args, "--offline", "--no-cache"])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def refused(case, code: int = EXIT_BAD_INPUT) -> str:
    """Run a row that must be refused; returns the (single) error line."""
    r = cli(*case.args)
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: "), r.output
    return " ".join(" ".join(lines).split())  # rich wraps long lines; compare as one line


def assessed(case) -> dict:
    """Run a row that must complete; returns the JSON result."""
    r = cli(*case.args, "--json")
    assert r.exit_code == EXIT_OK, r.output
    out = json.loads(r.stdout)
    assert out["result"]["final_answer"]
    return out


def test_missing_file(cases):
    msg = refused(cases["missing file"])
    assert "nope.jpg: file not found; check the path" in msg


def test_directory_where_a_file_is_expected(cases):
    assert "a_folder: is a directory, not an image file" in refused(cases["directory where a file is expected"])
    # A folder as *the* image is a batch: the user is told how to run one.
    msg = refused(cases["folder without --out"])
    assert "is a folder" in msg and "--out results.jsonl" in msg


def test_zero_byte_file(cases):
    assert "file is empty (0 bytes)" in refused(cases["0-byte file"])


def test_truncated_jpeg(cases):
    assert "truncated.jpg: truncated or corrupt image data" in refused(cases["truncated JPEG"])


def test_text_file_named_jpg(cases):
    assert "text.jpg: not an image" in refused(cases["text file named .jpg"])


def test_16_bit_png_is_scaled_not_saturated(cases):
    out = assessed(cases["16-bit PNG"])
    assert any("16-bit grayscale scaled to [0, 1]" in n for n in out["notes"])


def test_rgba_png_is_composited_on_white(cases):
    out = assessed(cases["RGBA PNG"])
    assert any("alpha channel composited on white" in n for n in out["notes"])


def test_cmyk_jpeg_is_converted(cases):
    out = assessed(cases["CMYK JPEG"])
    assert any("CMYK converted to RGB" in n for n in out["notes"])


def test_grayscale(cases):
    out = assessed(cases["grayscale"])
    assert any("grayscale: gray copied to R, G, B" in n for n in out["notes"])


def test_palette_gif(cases):
    out = assessed(cases["palette GIF"])
    assert any("P converted to RGB" in n for n in out["notes"])


def test_animated_gif_uses_the_first_frame_and_says_so(cases):
    out = assessed(cases["animated GIF"])
    assert any("animated image: the first of 3 frames is scored" in n for n in out["notes"])


def test_8x8_image_is_refused_with_its_size_and_the_minimum(cases):
    """Before, it was assessed: every tool refused it, the statistics raised, and the answer was a
    neutral "Level C · score 3.00 … rests on no evidence", exit 0."""
    msg = refused(cases["8×8 image"])
    assert "tiny8.png: 8×8 px is too small to assess (at least 48 px on each side); pass a larger image" in msg


@pytest.mark.parametrize("size", [(1, 1), (40, 40), (200, 47), (1, 400)])
def test_images_below_the_minimum_side_are_refused_not_misjudged(tmp_path, size):
    """A clean 40×40 downscale was "E (Bad) 1.35: Severe motion blur"; a 1×1 image got a neutral level C
    labelled "answered by offline analyst" with "ValueError: the image is 1×1 px…" in its notes."""
    from bad_inputs import _rgb
    from PIL import Image

    path = tmp_path / "small.png"
    Image.fromarray(_rgb(7)).resize(size, Image.LANCZOS).save(path)
    msg = refused(Case([str(path)], "small"))
    w, h = size
    assert f"small.png: {w}×{h} px is too small to assess (at least 48 px on each side)" in msg
    assert "Error" not in msg


def test_an_image_of_the_minimum_side_is_assessed(tmp_path):
    from agentic_iqa import assess
    from agentic_iqa.api import MIN_IMAGE_SIDE
    from bad_inputs import _rgb
    from PIL import Image

    edge = tmp_path / "edge.png"
    Image.fromarray(_rgb(8)[:MIN_IMAGE_SIDE, :MIN_IMAGE_SIDE + 20]).save(edge)
    r = assess(str(edge), backend="offline", use_cache=False)
    assert r.level in list("ABCDE") and not any("too small" in n for n in r.notes + r.fallbacks)


def test_fallback_notes_do_not_show_exception_class_names(tmp_path, monkeypatch):
    """When the offline statistics refuse an image, the summary's fallback lines said
    "ValueError: the image is 1×1 px: …"; the message is the user's, the class name is not."""
    from agentic_iqa import assess
    from agentic_iqa.offline import severity

    def refuse(*a, **k):
        raise ValueError("the image is 20×20 px: too small for the offline analyst's statistics (at least 24 px a side)")

    monkeypatch.setattr(severity, "analyze", refuse)
    img = tmp_path / "ok.png"
    from bad_inputs import _rgb
    from PIL import Image

    Image.fromarray(_rgb(11)).save(img)
    r = assess(str(img), backend="offline", use_cache=False)
    assert any("too small for the offline analyst's statistics" in f for f in r.fallbacks), r.fallbacks
    assert not any("ValueError" in line for line in r.fallbacks + r.notes), r.fallbacks + r.notes


def test_decompression_bomb_is_refused_before_decoding(cases):
    msg = refused(cases["decompression bomb"])
    assert "12000×12000 = 144,000,000 pixels exceeds the limit of 100,000,000" in msg
    assert "decompression-bomb guard" in msg and "max_image_pixels" in msg


def test_a_header_beyond_pillows_own_limit_gets_the_same_message(tmp_path):
    """Pillow refuses headers above 2 × its MAX_IMAGE_PIXELS (~179 M) inside Image.open, before our guard:
    a 60000×60000 header showed Pillow's "could be decompression bomb DOS attack" text, with no fix."""
    huge = png_claiming(tmp_path / "huge.png", 60000, 60000)
    r = cli(str(huge))
    assert r.exit_code == EXIT_BAD_INPUT, r.output
    msg = " ".join(r.stderr.split())
    assert "huge.png: 60000×60000 = 3,600,000,000 pixels exceeds the limit of 100,000,000" in msg
    assert "decompression-bomb guard" in msg and "max_image_pixels" in msg and "DOS attack" not in msg
    wide = png_claiming(tmp_path / "wide.png", 400_000_000, 1)
    assert "400000000×1 = 400,000,000 pixels exceeds the limit" in " ".join(cli(str(wide)).stderr.split())


def test_pixel_limit_is_configurable(cases, tmp_path):
    (tmp_path / "pipeline.yaml").write_text("max_image_pixels: 1000\n")
    image = cases["grayscale"].args[0]
    r = cli(image, "--config", str(tmp_path))
    assert r.exit_code == EXIT_BAD_INPUT
    assert "128×96 = 12,288 pixels exceeds the limit of 1,000" in " ".join(r.stderr.split())


def test_reference_of_another_size_is_a_clear_error(cases):
    msg = refused(cases["reference of another size"])
    assert "is 128×96 but the reference" in msg and "64×48" in msg and "--resize-reference" in msg


def test_reference_of_another_size_is_resized_when_asked(cases):
    out = assessed(cases["reference of another size, --resize-reference"])
    assert any("reference resized from 64×48 to 128×96" in n for n in out["notes"])
    assert out["reference"].endswith("ref_small.png")  # the user's file is reported, not the temporary copy
    assert out["plan"]["reference_mode"] == "Full-Reference"


def test_reference_equal_to_the_image(cases):
    out = assessed(cases["reference equal to the image"])
    assert any("same file content as the image" in n for n in out["notes"])


def test_reference_with_the_same_pixels_in_another_file(cases):
    """The picture re-saved as a PNG passed unnoticed: only the file bytes were compared."""
    notes = assessed(cases["reference equal to the image, another file"])["notes"]
    assert any("the reference has the same pixels as the image (another file of the same picture)" in n for n in notes)
    assert not any("same file content" in n for n in notes)
    other = assessed(cases["reference of another size, --resize-reference"])["notes"]
    assert not any("same pixels" in n or "same file content" in n for n in other)


def test_unreadable_permissions(cases):
    """Root reads mode-000 files through its DAC capabilities, so as root the command runs with them
    dropped. A subprocess (the capability set is per process); the CLI gets no further than reading
    the file, so this imports no torch and takes about a second."""
    case = cases["unreadable permissions"]
    cmd = [sys.executable, "-c", "from agentic_iqa.cli import main; main()", "assess", *case.args, "--offline"]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a file unreadable")
        cmd = [*DROP_DAC, *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert p.returncode == EXIT_BAD_INPUT, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert "locked.jpg: permission denied; make the file readable (chmod +r)" in p.stderr


def test_path_with_spaces_and_non_ascii(cases):
    out = assessed(cases["path with spaces and non-ASCII"])
    assert out["image"].endswith("my photos/café ☕ été.jpg")


def test_symlink_loop_as_the_image_is_named_with_the_fix(cases):
    """It said "cannot be opened (Too many levels of symbolic links)", where a manifest row said what to do."""
    msg = refused(cases["symlink loop as the image"])
    assert "loop1: symlink loop (too many levels of symbolic links); fix or remove the link" in msg


def test_symlink_loop_in_a_scanned_folder_is_one_failed_line_with_the_fix(cases):
    """README promised "symlink loop …; fix or remove the link" for a loop in a scanned folder; its line said
    "cannot be opened (Too many levels of symbolic links)"."""
    case = cases["symlink loop in a scanned folder"]
    r = cli(*case.args)
    assert r.exit_code == EXIT_PARTIAL, r.output
    out = Path(case.args[case.args.index("--out") + 1])
    lines = {Path(rec["image"]).name: rec for rec in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    assert lines["ok.jpg"]["status"] == "ok"
    assert lines["loop.jpg"]["status"] == "failed" and lines["loop.jpg"]["error"].endswith(
        "loop.jpg: symlink loop (too many levels of symbolic links); fix or remove the link")


def test_url_is_refused_with_a_hint(cases):
    assert "URLs are not fetched; download the image first and pass the local file" in refused(cases["URL"])


def test_empty_query_defaults_to_scoring_and_says_so(cases):
    out = assessed(cases["empty query"])
    assert out["query"] == "Rate the overall quality of this image." and out["mode"] == "score"
    assert any(n.startswith("no query given: using the scoring query") for n in out["notes"])
    assert out["result"]["level"] in list("ABCDE")


def test_absurdly_long_query_is_truncated_with_a_warning(cases):
    out = assessed(cases["absurdly long query"])
    assert len(out["query"]) == 2000
    assert any(f"query truncated from {len(LONG_QUERY.strip())} to 2000 characters" in n for n in out["notes"])


def test_every_bad_input_in_one_batch_gets_exactly_one_line(cases, tmp_path):
    """The same inputs as a batch: nothing stops it; each gets one line (failed ones with the same
    reason as above), and the exit code says some were skipped."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    names = ["missing file", "0-byte file", "truncated JPEG", "text file named .jpg", "16-bit PNG", "RGBA PNG",
             "CMYK JPEG", "palette GIF", "animated GIF", "8×8 image", "decompression bomb", "URL"]
    images = [cases[n].args[0] for n in names]
    out = tmp_path / "results.jsonl"
    r = cli(*images, "--out", str(out), "--concurrency", "3", "--json")
    assert r.exit_code == EXIT_PARTIAL, r.output
    summary = json.loads(r.stdout)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(rec["image"] for rec in records) == sorted(images)
    by_image = {Path(rec["image"]).name if "://" not in rec["image"] else rec["image"]: rec for rec in records}
    bad = {"nope.jpg", "empty.jpg", "truncated.jpg", "text.jpg", "tiny8.png", "bomb.png", "https://example.com/photo.jpg"}
    for name, rec in by_image.items():
        assert rec["status"] == ("failed" if name in bad else "ok"), rec
        if name in bad:
            assert rec["error_type"] == "bad_input" and rec["error"]
    assert "8×8 px is too small to assess (at least 48 px on each side)" in by_image["tiny8.png"]["error"]
    assert summary["failed"] == len(bad) and summary["ok"] == len(images) - len(bad)
