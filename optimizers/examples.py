"""Fixture lines as `dspy.Example`s: the signature's input fields, its output fields as the label,
plus two bookkeeping keys (`fixture_id`, `part`) that never reach a prompt.

`part` is the signature the example trains: each module is compiled one predictor ("part") at a
time, so the Summarizer's explanation and scoring predictors each learn from their own examples.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from agentic_iqa.agents.modules import AGENT_MODULES  # noqa: E402
from signatures import format_evidence, vlm_image  # noqa: E402

#: The parts (signature short names, as in signatures.signatures_by_name()) of each module, and the
#: attribute of the agents' module (agentic_iqa.agents.vlm) holding that part's StructuredPredict.
MODULE_PARTS: dict[str, dict[str, str]] = {name: dict(spec.parts) for name, spec in AGENT_MODULES.items()}

#: Input fields per part, in signature order.
PART_INPUTS: dict[str, tuple[str, ...]] = {
    "plan": ("query", "image", "reference_mode", "available_tools", "replan_reason"),
    "detect": ("query", "image", "query_scope"),
    "analyze": ("query", "image", "distortion_set"),
    "select": ("distortion_set", "tool_description", "reference_mode"),
    "explain": ("query", "image", "evidence"),
    "score": ("query", "image", "evidence"),
}

#: Keys an example carries besides signature fields; demos keep them as provenance.
BOOKKEEPING = ("fixture_id", "part")


@lru_cache(maxsize=256)
def _image(path: str) -> dspy.Image:
    # The file's own bytes, as the pipeline sends them (no re-encoding; see signatures.image).
    image, _ = vlm_image(path)
    return image


def load_image(path: str | Path) -> dspy.Image:
    return _image(str(Path(path).resolve()))


def to_example(module: str, line: Any, fixture_file: Any) -> dspy.Example:
    """The example for one validated fixture line of `module`."""
    catalog = fixture_file.catalog
    if module == "planner":
        part = "plan"
        data = dict(
            query=line.query,
            image=load_image(fixture_file.resolve(line.image)),
            reference_mode="Full-Reference" if line.has_reference else "No-Reference",
            available_tools=catalog.names,
            replan_reason=line.replan_reason,
            planner_output=line.planner_output,
        )
    elif module == "detect":
        part = "detect"
        data = dict(
            query=line.query,
            image=load_image(fixture_file.resolve(line.image)),
            query_scope=list(line.query_scope),
            distortion_set=line.distortion_set.root,
        )
    elif module == "analyze":
        part = "analyze"
        data = dict(
            query=line.query,
            image=load_image(fixture_file.resolve(line.image)),
            distortion_set=line.distortion_set.root,
            distortion_analysis={
                obj: [a.model_dump() for a in items] for obj, items in line.distortion_analysis.root.items()
            },
        )
    elif module == "select":
        part = "select"
        description = line.tool_description or catalog.descriptions[line.reference_mode]
        data = dict(
            distortion_set=line.distortion_set.root,
            tool_description=description,
            reference_mode=line.reference_mode,
            selected_tools=line.selected_tools.root,
            acceptable=line.acceptable,  # metric-only: every tool that counts as right
        )
    elif module == "summarize":
        part = line.mode
        data = dict(
            query=line.query,
            image=load_image(fixture_file.resolve(line.image)),
            evidence=format_evidence(line.evidence),
            quality_reasoning=line.quality_reasoning,
            need_replan=line.need_replan,
            replan_reason=line.replan_reason,
        )
        if line.mode == "explain":
            data["final_answer"] = line.final_answer
        else:
            data["level"] = line.level
    else:
        raise ValueError(f"unknown module {module!r}")
    return dspy.Example(fixture_id=line.id, part=part, **data).with_inputs(*PART_INPUTS[part])


def output_fields(part: str) -> tuple[str, ...]:
    from signatures import signatures_by_name

    return tuple(signatures_by_name()[part].output_fields)
