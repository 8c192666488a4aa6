"""Issue 10: the offline answer fuses the tools and η chosen held out (benchmarks/choose_fusion.py), and the
assessment runs exactly that choice."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from agentic_iqa.api import Assessor
from agentic_iqa.bench.synth import distort, load_reference
from agentic_iqa.config import load_settings
from agentic_iqa.fusion import ScoreFusion
from agentic_iqa.offline import analyst
from agentic_iqa.offline import severity as sv
from agentic_iqa.offline.stats import at_working_size
from iqa_tools import load_image
from signatures.models import OVERALL

RECORD = Path(__file__).resolve().parents[1] / "benchmarks/corpus/fusion_choice.json"
SHIPPED_ONLY_RECORD = RECORD.with_name("fusion_choice_shipped_only.json")


def _fitted_sources() -> list[str]:
    """The sources the shipped thresholds were fitted on (both records must cover exactly these)."""
    return sorted(json.loads(sv.THRESHOLDS_PATH.read_text())["provenance"]["sources"])


@pytest.fixture(scope="module")
def assessor(tmp_path_factory):
    return Assessor(load_settings(tmp_path_factory.mktemp("cfg"), backend="offline", cache={"enabled": False}))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A clean photo and its blurred copy, as files (the assessment reads files)."""
    d = tmp_path_factory.mktemp("img")
    x = load_reference("coffee")
    y = distort(x, "gaussian blur", 3)
    for name, a in (("ref.png", x), ("img.png", y)):
        Image.fromarray((np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8)).save(d / name)
    return d / "img.png", d / "ref.png"


def test_the_shipped_choice_is_the_choice_scripts_output():
    shipped = json.loads(analyst.FUSION_CHOICE_FILE.read_text())
    record = json.loads(RECORD.read_text())
    for mode in ("NR", "FR"):
        assert {"eta": shipped[mode]["eta"], "tools": shipped[mode]["tools"]} == {
            "eta": record["shipped"][mode]["eta"], "tools": record["shipped"][mode]["tools"]}
        assert analyst.fusion_choice()[mode]["eta"] == shipped[mode]["eta"]
    assert record["folds"] and all(set(f) == {"nr", "fr"} for f in record["folds"].values())
    # the nested run's folds are the sources the shipped thresholds were fitted on (its held-out figures are quoted)
    assert sorted(record["folds"]) == _fitted_sources()


def test_the_choice_made_again_on_every_training_source_is_the_shipped_one():
    """`choose_fusion.py --shipped-only` re-made the choice on all the fit's sources (no nested evaluation): it
    chose what ships, and its record covers exactly the sources the shipped thresholds were fitted on."""
    shipped = json.loads(analyst.FUSION_CHOICE_FILE.read_text())
    record = json.loads(SHIPPED_ONLY_RECORD.read_text())
    assert sorted(record["sources"]) == _fitted_sources()
    for mode in ("NR", "FR"):
        assert record["shipped"][mode]["tools"] == shipped[mode]["tools"]
        assert record["shipped"][mode]["eta"] == shipped[mode]["eta"]
        best = record["shipped"][mode]["fit_figures"]["J"]
        # the record's every-tool table agrees: nothing beats the choice by the margin a change must gain
        others = [f["J"] for t in record["every_tool"][mode.lower()].values() for f in t.values()]
        assert max(others) <= best + record["margin"]


def _expected(result, image, reference, mode):
    """What the shipped choice says the answer is: the tools it names for the detected categories, fused by
    the spec's formula with its η and the analyst's distribution measured independently here."""
    yl = at_working_size(load_image(image).float_pixels())
    xl = at_working_size(load_image(reference).float_pixels()) if reference else None
    an = sv.analyze(yl, xl, look=True)  # the whole image: without a reference, its look counts too
    choice = analyst.fusion_choice()[mode]
    detected = [c for c, a in an.items() if a.severity != "none"] or [OVERALL]
    names = {choice["tools"].get(c, choice["tools"][OVERALL]) for c in detected}
    dist = sv.level_distribution(an)
    scores = {lg.tool_name: lg.normalized_score for lg in result.evidence.tool_logs if lg.ok}
    fused = ScoreFusion(eta=choice["eta"], prob_mode="analyst").fuse(
        [scores[t] for t in sorted(names)], probabilities={str(c): p for c, p in zip(range(1, 6), dist)})
    return names, fused.score


@pytest.mark.parametrize("mode", ["NR", "FR"])
def test_the_assessment_runs_the_shipped_choice(assessor, pair, mode):
    image, reference = pair[0], (pair[1] if mode == "FR" else None)
    result = assessor.assess(image, reference=reference, use_cache=False)
    names, score = _expected(result, image, reference, mode)
    ran = {lg.tool_name for lg in result.evidence.tool_logs if lg.ok}
    assert ran == names
    assert result.score == pytest.approx(score, abs=1e-9)


def test_another_choice_changes_what_runs_and_how_much_it_weighs(assessor, pair, tmp_path, monkeypatch):
    """The mechanism, not just today's file: PIQE at η 3 instead of the shipped NR choice."""
    other = {"NR": {"eta": 3.0, "tools": {OVERALL: "PIQE"}}, "FR": {"eta": 0.0, "tools": {OVERALL: "GMSD"}}}
    path = tmp_path / "fusion_choice.json"
    path.write_text(json.dumps(other))
    monkeypatch.setattr(analyst, "FUSION_CHOICE_FILE", path)
    analyst.fusion_choice.cache_clear()
    try:
        nr = assessor.assess(pair[0], use_cache=False)
        assert {lg.tool_name for lg in nr.evidence.tool_logs if lg.ok} == {"PIQE"}
        assert nr.score == pytest.approx(_expected(nr, pair[0], None, "NR")[1], abs=1e-9)
        fr = assessor.assess(pair[0], reference=pair[1], use_cache=False)
        assert {lg.tool_name for lg in fr.evidence.tool_logs if lg.ok} == {"GMSD"}
        an = sv.analyze(at_working_size(load_image(pair[0]).float_pixels()), at_working_size(load_image(pair[1]).float_pixels()))
        assert fr.score == pytest.approx(sv.expected_level(sv.level_distribution(an)), abs=1e-9)  # η 0: analyst alone
    finally:
        analyst.fusion_choice.cache_clear()


@pytest.mark.parametrize("bad, message", [
    ({"NR": {"eta": -1, "tools": {OVERALL: "NIQE"}}, "FR": {"eta": 1, "tools": {OVERALL: "FSIM"}}}, "eta"),
    ({"NR": {"eta": 1, "tools": {"Noise": "NIQE"}}, "FR": {"eta": 1, "tools": {OVERALL: "FSIM"}}}, "Overall"),
    ({"NR": {"eta": 1, "tools": {OVERALL: "NIQE"}}}, "FR"),
    ("{not json", "cannot read"),
    ([1, 2], "JSON object"),
])
def test_a_broken_choice_file_is_named(tmp_path, monkeypatch, bad, message):
    path = tmp_path / "fusion_choice.json"
    path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    monkeypatch.setattr(analyst, "FUSION_CHOICE_FILE", path)
    analyst.fusion_choice.cache_clear()
    try:
        with pytest.raises(ValueError, match=message) as info:
            analyst.fusion_choice()
        assert str(path) in str(info.value)
    finally:
        analyst.fusion_choice.cache_clear()
