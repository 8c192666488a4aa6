"""`agentic-iqa fixtures record`: saved assessments (assess --save-trace) become fixture lines that compile."""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from canned import CannedVLM, Reply, disable_dspy_cache, valid_reply

from agentic_iqa.agents.vlm import VLMRoles
from agentic_iqa.api import Assessor
from agentic_iqa.cli import app
from agentic_iqa.config import load_settings
from optimizers.fixtures import FIXTURE_DIR, load_fixture_file

runner = CliRunner()
SELECT_PIQE = {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}}


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """One real assessment (graph, agents, PIQE via pyiqa) with a canned VLM, saved as --save-trace does."""
    disable_dspy_cache()
    d = tmp_path_factory.mktemp("run")
    image = shutil.copy(FIXTURE_DIR / "images" / "coffee__gaussian-blur__L3.png", d / "photo.png")
    settings = load_settings(d, cache={"enabled": False})
    vlm = CannedVLM({
        "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "select": SELECT_PIQE, "score": Reply(valid_reply("score", level="B"), level_logprobs={"B": -0.2, "C": -1.8}),
    }, logprobs=True)
    roles = VLMRoles(settings, lms={"planner": vlm.lm, "executor": vlm.lm, "summarizer": vlm.lm})
    result = Assessor(settings, roles=roles).assess(image, "Rate the quality of this photo")
    path = d / "run.json"
    path.write_text(result.model_dump_json(indent=2))
    return path, result


def test_record_writes_one_valid_line_per_module_and_copies_the_image(tmp_path, trace):
    path, result = trace
    out = tmp_path / "fx"
    res = runner.invoke(app, ["fixtures", "record", str(path), "--out", str(out), "--level", "c", "--split", "val"])
    assert res.exit_code == 0, res.output
    files = {m: load_fixture_file(m, out / f"{m}.jsonl") for m in ("planner", "detect", "analyze", "select", "summarize")}
    plan = files["planner"].lines[0]
    assert plan.query == "Rate the quality of this photo" and plan.split == "val" and not plan.has_reference
    assert plan.planner_output.plan == result.plan.plan
    assert files["detect"].lines[0].distortion_set.root == result.evidence.distortion_set
    severities = {a.type: a.severity for a in files["analyze"].lines[0].distortion_analysis.root["Global"]}
    assert severities == {"Blurs": "moderate", "Noise": "slight"}
    sel = files["select"].lines[0]
    assert sel.acceptable == {"Global": {"Blurs": ["PIQE"], "Noise": ["PIQE"]}} and sel.reference_mode == "No-Reference"
    summary = files["summarize"].lines[0]
    assert summary.mode == "score" and summary.level == "C" and summary.label_source == "user"
    assert summary.evidence.quality_scores["Global"]["Blurs"][0] == "PIQE"
    assert plan.label_source.startswith("recorded")  # the pipeline's own plan: flagged for review
    copied = files["planner"].resolve(plan.image)
    assert copied.parent == out / "images" and copied.read_bytes() == (path.parent / "photo.png").read_bytes()
    # Recording the same trace again adds nothing.
    again = runner.invoke(app, ["fixtures", "record", str(path), "--out", str(out)])
    assert again.exit_code == 0 and "nothing new" in again.output
    assert len(files["planner"].path.read_text().splitlines()) == 1


def test_recorded_lines_compile_as_a_trainset(tmp_path, trace):
    path, _ = trace
    out = tmp_path / "fx"
    assert runner.invoke(app, ["fixtures", "record", str(path), "--out", str(out), "-m", "summarize"]).exit_code == 0
    assert not (out / "planner.jsonl").exists()
    program = tmp_path / "summarize.json"
    res = runner.invoke(app, ["compile", "-m", "summarize", "-O", "labeled", "--trainset", str(out / "summarize.jsonl"),
                              "--out", str(program), "--json", "--config", str(tmp_path)])
    assert res.exit_code == 0, res.output
    header = json.loads(program.read_text())["agentic_iqa_program"]
    assert header["fixtures"]["train"]["path"] == str(out / "summarize.jsonl") and header["demos"]["score.predict"] == 1


def test_a_plan_that_contradicts_the_rules_is_recorded_with_a_warning(tmp_path, trace):
    path, _ = trace
    data = json.loads(path.read_text())
    data["plan"]["plan"]["tool_selection"] = False  # no region, no tool: the rules say select tools
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    res = runner.invoke(app, ["fixtures", "record", str(bad), "--out", str(tmp_path / "fx"), "-m", "planner"])
    assert res.exit_code == 0 and "tool_selection" in res.output and "contradict" in res.output


def test_record_refuses_files_that_are_not_saved_assessments(tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    res = runner.invoke(app, ["fixtures", "record", str(junk), "--out", str(tmp_path / "fx")])
    assert res.exit_code == 2 and "not a saved assessment" in res.output
    res = runner.invoke(app, ["fixtures", "record", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "does not exist" in res.output
    import os

    os.mkfifo(tmp_path / "fifo.json")  # before: read_text waited for a writer forever
    res = runner.invoke(app, ["fixtures", "record", str(tmp_path / "fifo.json"), "--out", str(tmp_path / "fx")])
    assert res.exit_code == 2 and "is a FIFO (named pipe), not a regular file" in " ".join(res.output.split()), res.output


def test_a_label_for_the_other_mode_is_said_to_be_unused(tmp_path, trace):
    # The trace rates quality (score mode): --answer labels question traces. Before, it was dropped
    # without a word and the pipeline's own level was recorded in its place.
    path, result = trace
    res = runner.invoke(app, ["fixtures", "record", str(path), "--out", str(tmp_path / "fx"), "-m", "summarize",
                              "--answer", "B"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "warning:" in text and "--answer is for question traces" in text and "--level" in text, text
    line = load_fixture_file("summarize", tmp_path / "fx" / "summarize.jsonl").lines[0]
    assert line.level == result.result.level and line.label_source.startswith("recorded")


def test_record_into_a_file_instead_of_a_folder_is_one_line(tmp_path, trace):
    # Before: a traceback ending "NotADirectoryError: [Errno 20] Not a directory: 'notes.txt/images'".
    path, _ = trace
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    res = runner.invoke(app, ["fixtures", "record", str(path), "--out", str(notes)])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "notes.txt is a file, not a folder" in " ".join(res.output.split()), res.output
    assert notes.read_text() == "mine"


def _record_with_fallbacks(tmp_path, data: dict, name: str, fallbacks: list[str]):
    """`fixtures record` of the trace `data` with these fallback lines: (the trace file, the output folder, the result)."""
    path, out = tmp_path / f"{name}.json", tmp_path / f"fx-{name}"
    path.write_text(json.dumps({**data, "fallbacks": fallbacks}))
    return path, out, runner.invoke(app, ["fixtures", "record", str(path), "--out", str(out)])


def test_stages_that_fell_back_are_not_recorded_as_the_models_answers(tmp_path, trace):
    """A trace where every stage fell back was recorded whole: the rule-based plan and the analyst's summary,
    with meta.backend "vlm (…)" and no word of the fallback, to be trained on as the model's answers."""
    path, _ = trace
    data = json.loads(path.read_text())
    assert data["backend"].startswith("vlm")
    fell, out, res = _record_with_fallbacks(tmp_path, data, "fell", [
        "planner: model reply rejected 4× (invalid JSON) → rule-based plan",
        "select: model reply rejected 4× (unknown tool 'X') → generic tools (PIQE)",
        "summarizer: model reply rejected 4× (invalid JSON) → offline analyst summarized the evidence"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "skipped planner: the model did not give this answer (fallback: model reply rejected 4× (invalid JSON) → rule-based plan)" in text, text
    assert "skipped select:" in text and "skipped summarize:" in text, text
    assert {p.name for p in out.glob("*.jsonl")} == {"detect.jsonl", "analyze.jsonl"}  # the model's own answers
    # A level given by the user is the user's label: recorded, the fallback kept in meta and said.
    res = runner.invoke(app, ["fixtures", "record", str(fell), "--out", str(out), "-m", "summarize", "--level", "C"])
    line = load_fixture_file("summarize", out / "summarize.jsonl").lines[0]
    assert line.label_source == "user" and "offline analyst" in line.meta["fallback"]
    assert "warning:" in res.output and "quality_reasoning" in res.output
    # The LM unreachable from detect on: every later stage is the offline analyst's (one fallback entry only).
    _, out2, res = _record_with_fallbacks(
        tmp_path, data, "cut", ["detect: LM unreachable (LMTransportError: refused); offline analyst answers"])
    assert res.exit_code == 0, res.output
    assert {p.name for p in out2.glob("*.jsonl")} == {"planner.jsonl"}, res.output


@pytest.mark.parametrize("first, kept", [
    ("analyze", {"planner.jsonl", "detect.jsonl", "select.jsonl"}),
    ("select", {"planner.jsonl", "detect.jsonl", "analyze.jsonl"}),
])
def test_an_outage_seen_by_one_parallel_branch_keeps_the_other_branchs_answer(tmp_path, trace, first, kept):
    """analyze and select run in parallel: an LM found unreachable at analyze left select on the model (it has no
    fallback entry), yet select's line was skipped as the offline analyst's, since select came later in a list."""
    path, _ = trace
    data = json.loads(path.read_text())
    _, out, res = _record_with_fallbacks(
        tmp_path, data, "cut", [f"{first}: LM unreachable (LMTransportError: refused); offline analyst answers"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert {p.name for p in out.glob("*.jsonl")} == kept, text
    assert f"skipped {first}: the model did not give this answer (fallback: LM unreachable" in text, text
    assert f"skipped summarize: the model did not give this answer (fallback: the LM was unreachable from the {first} stage on" in text, text
