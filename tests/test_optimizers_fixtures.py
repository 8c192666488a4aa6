"""The shipped fixtures: formats, coverage of DESIGN §3's flag table, real images with known labels."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from PIL import Image

from bad_inputs import png_claiming

from agentic_iqa.agents.planner_rules import rule_decision
from agentic_iqa.bench.manifest import KNOWN_TYPES
from optimizers.fixtures import FIXTURE_DIR, FixtureError, default_catalog, load_dataset, load_fixture_file
from signatures.models import PlanControlFlags


@pytest.fixture(scope="module")
def files():
    return {m: load_fixture_file(m) for m in ("planner", "detect", "analyze", "select", "summarize")}


def _table_row(decision) -> tuple:
    return (decision.query_type, decision.distortion_source, decision.region_named, bool(decision.required_tool))


def test_planner_fixtures_cover_every_row_of_the_flag_table(files):
    lines = files["planner"].lines
    paper = [line for line in lines if line.source == "paper"]
    assert len(paper) >= 4
    assert len(lines) - len(paper) >= 30
    rows = Counter(_table_row(line.planner_output) for line in lines if line.planner_output.query_type == "IQA")
    # Explicit/Inferred x region named x tool named: all eight IQA rows, each more than once.
    assert len(rows) == 8 and min(rows.values()) >= 2, rows
    assert sum(line.planner_output.query_type == "Other" for line in lines) >= 3
    assert any(line.has_reference for line in lines) and any(not line.has_reference for line in lines)
    # Multiple-choice options that name distortions make the source explicit.
    mcq = next(line for line in lines if line.id == "exp-mcq-options")
    assert mcq.planner_output.distortion_source == "Explicit"
    assert mcq.planner_output.distortions == {"Global": ["Blurs", "Noise", "Compression", "Contrast"]}


def test_every_planner_label_follows_the_rules_for_its_own_fields(files):
    for line in files["planner"].lines:
        d = line.planner_output
        expected = PlanControlFlags.from_rules(
            query_type=d.query_type, distortion_source=d.distortion_source,
            region_named=d.region_named, tool_named=bool(d.required_tool),
        )
        assert d.plan == expected, line.id


def test_paper_lines_use_the_papers_spellings_and_are_normalized(files):
    raw = [json.loads(t) for t in (FIXTURE_DIR / "planner.jsonl").read_text().splitlines() if t and not t.startswith("#")]
    paper_raw = [r for r in raw if r.get("source") == "paper"]
    assert any(r["planner_output"]["distortion_source"] == "Explict" for r in paper_raw)
    assert any("tool_execute" in r["planner_output"]["plan"] for r in paper_raw)
    assert any(isinstance(r["planner_output"]["query_scope"], str) for r in paper_raw)
    loaded = {line.id: line.planner_output for line in files["planner"].lines}
    first = loaded["paper-1-region-mcq"]
    assert first.distortion_source == "Explicit" and first.query_scope == ["sky"]
    assert first.plan.model_dump() == {"distortion_detection": False, "distortion_analysis": True,
                                       "tool_selection": False, "tool_execution": False}


def test_labels_mostly_agree_with_the_independent_rule_planner(files):
    # planner_rules reads the query text with regexes; the fixtures were labelled by hand. They must
    # agree on the paper examples and on most lines (the rest are documented gaps of the regexes).
    names = files["planner"].catalog.names
    agree = []
    for line in files["planner"].lines:
        r, g = rule_decision(line.query, names), line.planner_output
        same = (r.query_type, r.distortion_source, r.plan) == (g.query_type, g.distortion_source, g.plan)
        same = same and set(r.required_tool or []) == set(g.required_tool or [])
        if line.source == "paper":
            assert same, line.id
        agree.append(same)
    assert sum(agree) / len(agree) >= 0.85


def test_image_fixtures_are_real_images_with_labels_from_their_known_distortion(files):
    detect = files["detect"]
    for line in detect.lines:
        img = Image.open(detect.resolve(line.image))
        assert img.size == (256, 192)
        assert line.distortion_set.root == {"Global": [KNOWN_TYPES[line.meta["type"]]]}
        assert line.meta["level"] >= 2
    severity = {2: "slight", 3: "moderate", 4: "severe", 5: "extreme"}
    for line in files["analyze"].lines:
        items = {a.type: a.severity for a in line.distortion_analysis.root["Global"]}
        if "type" in line.meta:
            assert items.pop(KNOWN_TYPES[line.meta["type"]]) == severity[line.meta["level"]]
        assert set(items.values()) == {"none"}  # the unrelated category, or both on an undistorted image
    level = {2: "B", 3: "C", 4: "D", 5: "E"}
    for line in files["summarize"].lines:
        if line.mode == "score":
            assert line.level == (level[line.meta["level"]] if "type" in line.meta else "A")
            assert line.evidence.quality_scores  # a real tool score rides along
    # JPEG fixtures keep the encoder's bytes.
    jpeg = next(line for line in detect.lines if line.meta["type"] == "jpeg")
    assert Image.open(detect.resolve(jpeg.image)).format == "JPEG"


def test_committed_images_stay_small_and_splits_share_no_content(files):
    images = list((FIXTURE_DIR / "images").iterdir())
    assert sum(p.stat().st_size for p in images) < 3_000_000
    for module in ("detect", "analyze", "summarize"):
        f = files[module]
        train_refs = {line.meta["reference"] for line in f.split("train")}
        val_refs = {line.meta["reference"] for line in f.split("val")}
        assert train_refs and val_refs and not (train_refs & val_refs)


def test_selection_labels_follow_the_tool_tables_strengths(files):
    catalog = default_catalog()
    for line in files["select"].lines:
        kind = "FR" if line.reference_mode == "Full-Reference" else "NR"
        for obj, by in line.acceptable.items():
            for dist, tools in by.items():
                assert tools and all(catalog.modes[t] == kind and dist in catalog.strengths[t] for t in tools)
    assert {line.reference_mode for line in files["select"].lines} == {"Full-Reference", "No-Reference"}


def test_datasets_become_examples_with_signature_fields():
    ds = load_dataset("summarize")
    parts = Counter(ex.part for ex in ds.train)
    assert parts["explain"] > 0 and parts["score"] > 0
    ex = next(e for e in ds.train if e.part == "score")
    assert set(ex.inputs().keys()) == {"query", "image", "evidence"}
    assert "PIQE" in ex.evidence and ex.level in "ABCDE"
    planner = load_dataset("planner")
    assert all(e.reference_mode in ("Full-Reference", "No-Reference") for e in planner.train)


def test_bad_fixture_lines_are_all_reported_with_line_numbers(tmp_path):
    good_line = json.loads((FIXTURE_DIR / "planner.jsonl").read_text().splitlines()[-1])
    good_line["image"] = str(FIXTURE_DIR / good_line["image"])  # absolute paths work from anywhere
    good = json.dumps(good_line)
    bad_key = json.loads(good) | {"id": "x1", "distortion_sets": {}}
    bad_flag = json.loads(good) | {"id": "x2"}
    bad_flag["planner_output"]["query_type"] = "Aesthetic"
    path = tmp_path / "planner.jsonl"
    path.write_text("\n".join([good, "{not json", json.dumps(bad_key), json.dumps(bad_flag), good]) + "\n")
    with pytest.raises(FixtureError) as err:
        load_fixture_file("planner", path)
    msg = str(err.value)
    assert "line 2" in msg and "bad JSON" in msg
    assert "line 3" in msg and "distortion_sets" in msg
    assert "line 4" in msg and "query_type" in msg
    assert "line 5" in msg and "duplicate id" in msg


def test_missing_images_and_wrong_acceptable_tools_are_refused(tmp_path):
    detect = json.loads((FIXTURE_DIR / "detect.jsonl").read_text().splitlines()[-1])
    (tmp_path / "detect.jsonl").write_text(json.dumps(detect) + "\n")
    with pytest.raises(FixtureError, match="does not exist"):
        load_fixture_file("detect", tmp_path / "detect.jsonl")
    select = json.loads((FIXTURE_DIR / "select.jsonl").read_text().splitlines()[-1])
    select["selected_tools"] = {"Global": {d: "NoSuchTool" for d in select["distortion_set"]["Global"]}}
    (tmp_path / "select.jsonl").write_text(json.dumps(select) + "\n")
    with pytest.raises(FixtureError, match="unknown tool"):
        load_fixture_file("select", tmp_path / "select.jsonl")


def _detect_lines_with_images(tmp_path, *images):
    line = json.loads((FIXTURE_DIR / "detect.jsonl").read_text().splitlines()[-1])
    rows = [json.dumps(line | {"id": f"d{i}", "image": str(FIXTURE_DIR / line["image"]) if img is None else img})
            for i, img in enumerate(images)]
    path = tmp_path / "detect.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_images_that_cannot_be_sent_are_refused_with_their_line(tmp_path):
    """A 60000×60000 header failed the compile with "compile failed: DecompressionBombError" (exit 1), naming
    neither the file nor the line; a truncated PNG was accepted as a fixture without a word."""
    png_claiming(tmp_path / "bomb.png", 60000, 60000)
    good = FIXTURE_DIR / json.loads((FIXTURE_DIR / "detect.jsonl").read_text().splitlines()[-1])["image"]
    (tmp_path / "cut.png").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    path = _detect_lines_with_images(tmp_path, None, "bomb.png", "cut.png")
    with pytest.raises(FixtureError) as err:
        load_fixture_file("detect", path)
    msg = str(err.value)
    assert f"{path}: 2 bad line(s)" in msg, msg
    assert "line 2 (d1): image bomb.png: 60000×60000 = 3,600,000,000 pixels exceeds the limit" in msg, msg
    assert "line 3 (d2): image cut.png: truncated or corrupt image data" in msg, msg


def test_fixture_files_are_size_capped_regular_files(tmp_path, monkeypatch):
    """A 100 MB trainset took 2 min 11 s and 1.26 GB before anything was said; a FIFO would hang."""
    import os

    import optimizers.fixtures as fixtures

    path = _detect_lines_with_images(tmp_path, None)
    monkeypatch.setattr(fixtures, "MAX_FIXTURE_BYTES", path.stat().st_size - 1)
    with pytest.raises(FixtureError, match=r"exceeds the .*-byte limit for a fixture file.*split it"):
        load_fixture_file("detect", path)
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(FixtureError, match="FIFO"):
        load_fixture_file("detect", tmp_path / "fifo.jsonl")


def test_another_modules_file_is_named_once_instead_of_an_error_per_line():
    """`compile --module planner --trainset summarize.jsonl` listed "planner_output: Field required" 34 times."""
    with pytest.raises(FixtureError) as err:
        load_fixture_file("planner", FIXTURE_DIR / "summarize.jsonl")
    msg = str(err.value)
    assert "looks like a fixture file for the 'summarize' module, not 'planner'" in msg and "--module summarize" in msg, msg
    assert "Field required" not in msg
