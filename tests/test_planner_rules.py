"""DESIGN §3's planner rules, applied by code (the offline planner and the VLM planner's fallback)."""
from __future__ import annotations

import pytest

from agentic_iqa.agents.planner_rules import mcq_options, named_distortions, question_part, rule_plan

TOOLS = ["TOPIQ_FR", "QAlign", "LPIPS", "PSNR", "PIQE", "MS-SSIM"]
F = lambda d, a, s, e: {"distortion_detection": d, "distortion_analysis": a, "tool_selection": s, "tool_execution": e}  # noqa: E731


# The paper's worked cases (DESIGN §3 flag table) plus the other rows of the table.
@pytest.mark.parametrize("query,ref,qtype,scope,source,dists,tools,flags", [
    ("Is the sky in this photo blurry? A. Yes B. No", False, "IQA", ["sky"], "Explicit", {"sky": ["Blurs"]}, None, F(False, True, False, False)),
    ("Use LPIPS to check the compression artifacts on the building.", True, "IQA", ["building"], "Explicit", {"building": ["Compression"]}, ["LPIPS"], F(False, True, False, True)),
    ("Rate the quality of this image with QAlign.", False, "IQA", ["Global"], "Inferred", None, ["QAlign"], F(True, True, False, True)),
    ("How good is the overall quality of this image?", False, "IQA", ["Global"], "Inferred", None, None, F(True, True, True, True)),
    ("Does this photo feel calm or tense?", False, "Other", ["Global"], "Inferred", None, None, F(False, False, False, False)),
    ("How does the building look?", False, "IQA", ["building"], "Inferred", None, None, F(True, True, False, False)),
    ("Which distortion is most visible? A. Blurs B. Noise C. Compression", False, "IQA", ["Global"], "Explicit", {"Global": ["Blurs", "Noise", "Compression"]}, None, F(False, True, True, True)),
    ("Is the image noisy?", False, "IQA", ["Global"], "Explicit", {"Global": ["Noise"]}, None, F(False, True, True, True)),
])
def test_flag_table(query, ref, qtype, scope, source, dists, tools, flags):
    p = rule_plan(query, has_reference=ref, tool_names=TOOLS)
    assert (p.query_type, p.query_scope, p.distortion_source, p.distortions, p.required_tool) == (qtype, scope, source, dists, tools)
    assert p.plan.model_dump() == flags
    assert p.reference_mode == ("Full-Reference" if ref else "No-Reference")
    assert p.plan == p.expected_flags()  # agrees with the models' own statement of the rules


def test_mcq_options_are_parsed():
    assert mcq_options("Is it blurry? A. Yes B. No") == {"A": "Yes", "B": "No"}
    assert mcq_options("Rate it. A) Good B) Bad C) Fair") == {"A": "Good", "B": "Bad", "C": "Fair"}
    assert mcq_options("Rate this photo") == {}


@pytest.mark.parametrize("query,options", [
    # Labels as people write them; these were read as no options (a Yes/No answer instead of a label).
    ("Is it blurry? A: Yes B: No", {"A": "Yes", "B": "No"}),
    ("Is it blurry? [A] Yes [B] No", {"A": "Yes", "B": "No"}),
    ("is it blurry? a. yes b. no", {"a": "yes", "b": "no"}),
    ("Is it blurry?\n(a) yes\n(b) no", {"a": "yes", "b": "no"}),
    ("Is it blurry? 1. Yes 2. No", {"1": "Yes", "2": "No"}),
    ("Choose: (1) sharp (2) blurry", {"1": "sharp", "2": "blurry"}),
    ("Is it blurry? B. No A. Yes", {"B": "No", "A": "Yes"}),  # capitals in any order, as before
    # Small letters and numbers must run in order from the first: these are sentences, not options.
    ("Rate the quality from 1 to 10", {}),
    ("It is 1.5 stops under. Is it dark?", {}),
    ("Is it a. blurry?", {}),
    ("Rate it 2. Or 3. Is it blurry?", {}),
])
def test_mcq_options_in_the_forms_people_write(query, options):
    assert mcq_options(query) == options
    assert all(text not in question_part(query) for text in options.values())  # the question without its options


@pytest.mark.parametrize("query,scope", [
    ("Is the bottom half blurry? A. Yes B. No", ["bottom half"]),
    ("Is the top-left corner noisy?", ["top-left corner"]),
    ("Is the left side of the image too dark?", ["left side"]),
    ("Is the image blurry in the bottom right corner?", ["bottom right corner"]),
    ("Is the boat on the left sharp?", ["boat on the left"]),  # "on the left" still places the object before it
    ("Is the image blurry?", ["Global"]),
])
def test_a_part_of_the_frame_is_a_region(query, scope):
    # "Is the bottom half blurry?" was planned for the whole image ("bottom" is not an object, "half" had no
    # determiner), so the offline analyst answered it for the whole frame without saying so.
    p = rule_plan(query, has_reference=False)
    assert p.query_scope == scope
    assert p.plan.tool_execution is (scope == ["Global"])


@pytest.mark.parametrize("query,scope", [
    ("Are the top and bottom halves sharp?", ["top half", "bottom half"]),
    ("Are both the left and the right sides noisy?", ["left side", "right side"]),
    ("Is the left or the right side noisy?", ["left side", "right side"]),
    ("Which half is blurrier, the top or the bottom?", ["top half", "bottom half"]),
    ("Which side is darker, the left one or the right one?", ["left side", "right side"]),
    ("Which corner is noisier, the top-left or the bottom-right?", ["top-left corner", "bottom-right corner"]),
    ("Which is worse, the blur or the noise?", ["Global"]),  # two distortions, no part
    ("Compare the sky and the top and bottom halves.", ["sky", "top half", "bottom half"]),  # in the text's order
])
def test_two_parts_in_one_phrase_are_two_regions(query, scope):
    assert rule_plan(query, has_reference=False).query_scope == scope


@pytest.mark.parametrize("query,box,subject", [
    ("Is the bottom half blurry?", (0.5, 0, 1, 1), None),
    ("Is the upper part sharp?", (0, 0, 0.5, 1), None),
    ("Is the left side of the image too dark?", (0, 0, 1, 0.5), None),
    ("Is the right-hand side noisy?", (0, 0.5, 1, 1), None),
    ("Is the top-left corner noisy?", (0, 0, 1 / 3, 1 / 3), None),
    ("Is the image blurry in the bottom right corner?", (2 / 3, 2 / 3, 1, 1), None),
    ("Is the top-right quarter noisy?", (0, 0.5, 0.5, 1), None),    # a quadrant
    ("Is the far left edge dark?", (0, 0, 1, 0.125), None),
    ("Is the centre sharp?", (0.25, 0.25, 0.75, 0.75), None),
    ("Is the boat on the left sharp?", (0, 0, 1, 0.5), "boat"),
    ("Is the tree in the center blurry?", (0.25, 0.25, 0.75, 0.75), "tree"),
    ("Is the sign in the top left corner blurry?", (0, 0, 1 / 3, 1 / 3), "sign"),
    ("Is the sky blurry?", None, None),                              # an object: no place in the frame
    ("Is the tree near the house blurry?", None, None),              # a place that is not a part of the frame
    ("Is the left corner dark?", None, None),                        # which corner?
])
def test_a_part_of_the_frame_has_a_place(query, box, subject):
    from agentic_iqa.agents.planner_rules import frame_part, named_regions

    (region,) = named_regions(query)
    part = frame_part(region)
    if box is None:
        assert part is None, part
    else:
        assert (part.top, part.left, part.bottom, part.right) == pytest.approx(box) and part.subject == subject


def test_named_distortions_keep_the_vocabulary_order_or_the_text_order():
    assert named_distortions("Is the noise worse than the blur?") == ["Blurs", "Noise"]
    assert named_distortions("Is the noise worse than the blur?", in_text_order=True) == ["Noise", "Blurs"]
    assert named_distortions("Is it dark, noisy and dark again?", in_text_order=True) == ["Brightness change", "Noise"]


@pytest.mark.parametrize("query,mode", [
    ("Rate this photo.", "score"),
    ("How good is the overall quality of this image?", "score"),
    ("Evaluate the image quality.", "score"),
    ("What is the quality like?", "answer"),               # a wh-question is answered in words
    ("Is the quality acceptable?", "answer"),
    ("Isn't the quality good enough to print?", "answer"),  # contracted yes/no questions too
    ("Would the quality be fine for a poster?", "answer"),
    ("Did compression hurt the quality?", "answer"),
    ("Rate the sharpness. A. Good B. Bad", "answer"),       # options are answered with a label
])
def test_rating_requests_are_scored_and_questions_answered(query, mode):
    from agentic_iqa.api import decide_mode

    assert decide_mode(query) == mode


@pytest.mark.parametrize("query,scope,dists", [
    # "white" was read as a region ("measured the whole image, not the white alone") and the question as no quality
    # question; white balance, like a colour cast or tint, is the whole image's colour.
    ("Is the white balance off?", ["Global"], {"Global": ["Color distortions"]}),
    ("Is the white-balance correct? A. Yes B. No", ["Global"], {"Global": ["Color distortions"]}),
    ("Is there a colour cast?", ["Global"], {"Global": ["Color distortions"]}),
    ("Does the image have a tint?", ["Global"], {"Global": ["Color distortions"]}),
    # Adjectives are not regions ("the good" was one); the noun after one is, with it.
    ("Is this good enough to print?", ["Global"], None),
    ("Is the good one sharper?", ["Global"], {"Global": ["Blurs"]}),
    ("Is the white car blurry?", ["white car"], {"white car": ["Blurs"]}),
    ("Is the white car on the left blurry?", ["white car on the left"], {"white car on the left": ["Blurs"]}),
    ("Is the new version sharper?", ["Global"], {"Global": ["Blurs"]}),  # still the picture, not a region
])
def test_white_balance_is_colour_and_adjectives_are_not_regions(query, scope, dists):
    p = rule_plan(query, has_reference=False)
    assert (p.query_scope, p.distortions) == (scope, dists)
