"""Manifest format: round trip, broken rows reported by line number, the KADID-10k and LIVE In the Wild converters."""
from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from agentic_iqa.bench.manifest import (KADID_TYPES, NON_MONOTONE_TYPES, ManifestRow, clive_to_manifest,
                                        kadid_to_manifest, read_manifest, write_manifest)


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "img").mkdir()
    for name in ("a.png", "b.png", "ref.png"):
        (tmp_path / "img" / name).write_bytes(b"not read by the manifest reader")
    return tmp_path


def test_round_trip(folder):
    rows = [
        ManifestRow(id="a", image="img/a.png", reference="img/ref.png", type="jpeg", level=4, split="train", source="r"),
        ManifestRow(id="b", image="img/b.png", mos=3.25, question="Blurry? A. Yes B. No",
                    options={"A": "Yes", "B": "No"}, answer="B"),
    ]
    path = write_manifest(rows, folder / "m.jsonl")
    back, problems = read_manifest(path)
    assert problems == []
    assert [r.model_dump() for r in back] == [r.model_dump() for r in rows]
    assert back[0].category == "Compression"  # filled in from the type
    assert back[0].image_path == folder / "img/a.png" and back[1].reference_path is None
    assert back[0].group == ("r", "jpeg")
    assert "category" not in path.read_text().splitlines()[1]  # nulls are left out


def test_broken_rows_are_skipped_with_their_line_numbers(folder):
    good = {"id": "ok", "image": "img/a.png", "type": "white noise", "level": 2}
    lines = [
        json.dumps(good),                                                    # 1
        '{"id": "x", "image": "img/a.png", "type": "jpeg", "level": 2',      # 2 bad JSON
        "",                                                                  # 3 blank: ignored
        json.dumps({**good, "id": "gone", "image": "img/missing.png"}),      # 4 missing file
        json.dumps({**good, "id": "t", "type": "sepia"}),                    # 5 unknown type
        json.dumps({**good, "id": "l", "level": 7}),                         # 6 bad level
        json.dumps({**good, "id": "ok"}),                                    # 7 duplicate id
        "# a comment",                                                       # 8 ignored
        json.dumps({**good, "id": "r", "reference": "img/nope.png"}),        # 9 missing reference
        json.dumps({"id": "n", "image": "img/b.png"}),                       # 10 nothing to assess
        json.dumps({**good, "id": "c", "category": "Blurs"}),                # 11 category contradicts type
        "[1, 2]",                                                            # 12 not an object
        json.dumps({**good, "id": "ok2", "image": "img/b.png"}),             # 13 fine
    ]
    path = folder / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rows, problems = read_manifest(path)
    assert [r.id for r in rows] == ["ok", "ok2"]
    by_line = {p.line: str(p) for p in problems}
    assert sorted(by_line) == [2, 4, 5, 6, 7, 9, 10, 11, 12]
    assert "bad JSON" in by_line[2]
    assert "missing image file img/missing.png" in by_line[4] and "(gone)" in by_line[4]
    assert "unknown distortion type 'sepia'" in by_line[5]
    assert "level" in by_line[6]
    assert "duplicate id" in by_line[7]
    assert "missing reference file" in by_line[9]
    assert "nothing to assess" in by_line[10]
    assert "belongs to 'Noise'" in by_line[11]
    assert by_line[2].startswith("line 2:")


def test_answer_must_be_an_option():
    with pytest.raises(ValidationError, match="not one of the options"):
        ManifestRow(id="q", image="x.png", question="?", options={"A": "Yes", "B": "No"}, answer="C")
    with pytest.raises(ValidationError, match="an answer needs its question"):
        ManifestRow(id="q", image="x.png", level=1, answer="A")
    # A question without an answer key is a row of its own: asked, answered, not scored.
    assert ManifestRow(id="q", image="x.png", question="What is the main distortion?").answer is None


def test_kadid_csv_converter(folder):
    csv = folder / "dmos.csv"
    csv.write_text("dist_img,ref_img,dmos,var\n"
                   "I01_03_05.png,I01.png,2.57,0.9\n"
                   "I70_25_01.png,I70.png,4.1,0.5\n")
    out = kadid_to_manifest(csv, folder / "sub" / "kadid.jsonl")
    rows, problems = read_manifest(out, check_files=False)
    assert problems == []
    first, second = rows
    assert (first.type, first.category, first.level, first.mos, first.split) == ("motion blur", "Blurs", 5, 2.57, "train")
    assert first.image == "../images/I01_03_05.png" and first.reference == "../images/I01.png"
    assert (second.type, second.split, second.source) == ("contrast change", "test", "I70")
    assert second.type in NON_MONOTONE_TYPES and len(KADID_TYPES) == 25
    bad = folder / "bad.csv"
    bad.write_text("dist_img,ref_img,dmos,var\nweird.png,I01.png,1,1\n")
    with pytest.raises(ValueError, match="unexpected KADID image name"):
        kadid_to_manifest(bad)


def test_a_plain_list_of_paths_is_refused_as_a_whole_with_the_way_to_pass_it(folder):
    # A new user's first try: `assess --manifest list.txt` with one path per line. Before, every line
    # became its own "bad JSON: Expecting value at column 1" (a 10,000-line list: 10,000 such lines).
    path = folder / "list.txt"
    path.write_text("img/a.png\nimg/b.png\n\n# a comment\n")
    with pytest.raises(ValueError) as err:
        read_manifest(path, require_target=False)
    msg = str(err.value)
    assert msg.startswith(f"manifest {path}: no line is a JSON object") and "line 1" in msg
    assert '{"image": ' in msg and "pass the image paths as arguments" in msg
    # One good row among bad lines is still a manifest: its bad lines are problems, as before.
    path.write_text('img/a.png\n{"image": "img/b.png"}\n')
    rows, problems = read_manifest(path, require_target=False)
    assert [r.image for r in rows] == ["img/b.png"] and [p.line for p in problems] == [1]


def _fake_clive(root, names, mos):
    """A ChallengeDB_release folder as LIVE ships it: names and MOS in MATLAB files under Data/."""
    from scipy.io import savemat

    (root / "Data").mkdir(parents=True)
    (root / "Images").mkdir()
    cells = np.empty((len(names), 1), dtype=object)
    for i, n in enumerate(names):
        cells[i, 0] = np.array([n])
    savemat(root / "Data" / "AllImages_release.mat", {"AllImages_release": cells})
    savemat(root / "Data" / "AllMOS_release.mat", {"AllMOS_release": np.array([mos], dtype=float)})
    return root


def test_clive_converter_keeps_the_rated_photos_and_their_mos(tmp_path):
    names = [f"t{i}.bmp" for i in range(1, 8)] + ["10.bmp", "1002.JPG"]
    root = _fake_clive(tmp_path / "ChallengeDB_release", names, [50.0] * 7 + [32.5, 71.25])
    out = clive_to_manifest(root)
    assert out == root / "manifest.jsonl"
    rows, problems = read_manifest(out, check_files=False)
    assert problems == []
    assert [(r.id, r.image, r.mos, r.mos_higher_better, r.reference, r.level, r.source) for r in rows] == [
        ("10.bmp", "Images/10.bmp", 32.5, True, None, None, "clive"),
        ("1002.JPG", "Images/1002.JPG", 71.25, True, None, None, "clive")]  # the 7 practice images are left out


@pytest.mark.parametrize("names, mos, message", [
    ([f"t{i}" for i in range(7)] + ["../../etc/passwd"], [1.0] * 8, "not a plain file name"),
    ([f"t{i}" for i in range(9)], [1.0] * 8, "9 image names but 8 scores"),
    ([f"t{i}" for i in range(7)] + [""], [1.0] * 8, "'' is not a plain file name"),
    ([f"t{i}" for i in range(8)], [1.0] * 7 + [float("nan")], "the score of t7 is nan, not a number"),
])
def test_clive_converter_refuses_what_is_not_the_release(tmp_path, names, mos, message):
    root = _fake_clive(tmp_path / "c", names, mos)
    with pytest.raises(ValueError, match=message):
        clive_to_manifest(root)
    (root / "Data" / "AllMOS_release.mat").write_text("not a MATLAB file")
    with pytest.raises(ValueError, match="not a readable MATLAB .mat file"):
        clive_to_manifest(root)
    with pytest.raises(ValueError, match="not a folder"):
        clive_to_manifest(root / "Data" / "AllMOS_release.mat")


def test_a_row_with_several_problems_names_each(folder):
    # {"image": 42} said only "id: Field required" (a batch row without an id is named by its image), not that the
    # image itself was no path.
    path = folder / "m.jsonl"
    path.write_text(json.dumps({"image": 42}) + "\n")
    _, (problem,) = read_manifest(path, require_target=False)
    assert str(problem) == "line 1: id: Field required; image: Input should be a valid string", str(problem)
