"""The Planner's signature (DESIGN §3; the paper's Planner, not in the spec)."""
from typing import Literal, Optional

import dspy

from signatures.models import PlannerDecision


class PlanSignature(dspy.Signature):
    """You are the planner of an image quality assessment (IQA) system. Read the user's query, look at
    the image, and decide how the query should be answered: what kind of query it is, which parts of the
    image it is about, which distortions matter, whether the user named IQA tools, and which Executor
    steps must run.

    Fill `planner_output` with:
    - query_type: "IQA" for technical quality and distortions (blur, noise, compression, exposure,
      colour, sharpness, contrast, an overall quality rating); "Other" for aesthetics, emotion, style,
      composition or content questions.
    - query_scope: the objects or regions the query names, e.g. ["sky"] or ["face", "background"];
      ["Global"] when the query is about the whole image.
    - distortion_source: "Explicit" if the query names distortions or quality attributes (options of a
      multiple-choice question that name distortions count); otherwise "Inferred".
    - distortions: when Explicit, {"<object or Global>": [distortion types]} using only the categories
      Blurs, Color distortions, Compression, Noise, Brightness change, Sharpness, Contrast; else null.
    - required_tool: the IQA tools the query explicitly asks for, spelled as in available_tools; null
      when the query names no tool. Never add a tool the user did not name.
    - plan, four flags:
      - "Other" queries: all four false.
      - distortion_detection: false when distortion_source is "Explicit", true when "Inferred".
      - distortion_analysis: true for every IQA query.
      - tool_selection / tool_execution: tool and region named -> false / true; region named, no
        tool -> false / false (the region is inspected visually); tool named, no region -> false / true;
        neither named -> true / true.

    reference_mode says whether a reference image was supplied; the system decides it, so plan with it
    and do not change it. If replan_reason is given, an earlier plan was judged insufficient for that
    reason: make a revised plan that addresses it.

    Worked examples (the reasoning, not the output format):
    1. "Is the sky in this photo blurry? A. Yes B. No" -> IQA; scope ["sky"]; Explicit;
       distortions {"sky": ["Blurs"]}; no tool; detection false, analysis true, selection false,
       execution false.
    2. "Use LPIPS to check the compression artifacts on the building." -> IQA; scope ["building"];
       Explicit; distortions {"building": ["Compression"]}; required_tool ["LPIPS"]; detection false,
       analysis true, selection false, execution true.
    3. "Rate the quality of this image with QAlign." -> IQA; scope ["Global"]; Inferred; distortions
       null; required_tool ["QAlign"]; detection true, analysis true, selection false, execution true.
    4. "How good is the overall quality of this image?" -> IQA; scope ["Global"]; Inferred; distortions
       null; no tool; all four flags true.
    5. "Does this photo feel calm or tense?" -> Other; scope ["Global"]; Inferred; distortions null;
       no tool; all four flags false.
    """

    query: str = dspy.InputField(desc="the user's question about the image")
    image: dspy.Image = dspy.InputField(desc="the image to assess")
    reference_mode: Literal["Full-Reference", "No-Reference"] = dspy.InputField(
        desc="Full-Reference when a reference image was supplied, else No-Reference (decided by the system)"
    )
    available_tools: Optional[list[str]] = dspy.InputField(
        default=None, desc="names of the IQA tools that exist; use these exact spellings in required_tool"
    )
    replan_reason: Optional[str] = dspy.InputField(
        default=None, desc="why the previous plan was insufficient (None on the first pass)"
    )
    planner_output: PlannerDecision = dspy.OutputField(desc="the plan, as described in the instructions")
