"""The Summarizer's two modes (spec 003): explanation/QA and scoring, plus the evidence text both read."""
from typing import Literal, Optional

import dspy

from signatures.models import LEVEL_NAMES, ExecutorOutput

_REPLAN_RULES = """\
- need_replan: true only if the evidence is insufficient or contradicts what you see, so that the query
cannot be answered reliably; then replan_reason says what is missing or wrong (it is sent back to the
Planner). Otherwise need_replan is false and replan_reason is null. A plan that deliberately ran no
tools (a question about a specific region, or a non-technical question) is not by itself a reason to
replan."""


class ExplainSignature(dspy.Signature):
    # Built from parts (shared replan rules), so written flush-left rather than as a literal docstring.
    __doc__ = f"""\
You are an image quality assessment expert answering a user's question about an image.
Combine the evidence collected by the Executor (distortion analysis and IQA tool scores, on a 1-5
scale where 5 is best) with what you see in the image.

- Multiple-choice question: final_answer is only the letter of the chosen option (e.g. "B").
- Any other question: final_answer is a short, direct answer.
- quality_reasoning: a brief explanation citing the visual evidence and tool scores behind the answer.
{_REPLAN_RULES}
"""

    query: str = dspy.InputField(desc="the user's question about the image")
    image: dspy.Image = dspy.InputField(desc="the image")
    evidence: str = dspy.InputField(desc="what the Executor found: distortions, severities, tool scores")
    final_answer: str = dspy.OutputField(desc="the option letter for multiple choice, else a short answer")
    quality_reasoning: str = dspy.OutputField(desc="brief reasoning grounded in the evidence and the image")
    need_replan: bool = dspy.OutputField(desc="true only if the evidence cannot support an answer")
    replan_reason: Optional[str] = dspy.OutputField(desc="what is missing or wrong, when need_replan; else null")


_LEVELS = ", ".join(f"{letter}. {name}" for letter, name in LEVEL_NAMES.items())


class ScoreSignature(dspy.Signature):
    __doc__ = f"""\
You are an image quality assessment expert. Rate the overall quality of the image.
Combine the evidence collected by the Executor (distortion analysis and IQA tool scores, on a 1-5
scale where 5 is best) with what you see in the image.

Choose exactly one quality level: {_LEVELS}.
- level: only the letter (A, B, C, D or E). It comes first in your answer.
- quality_reasoning: a brief explanation citing the visual evidence and tool scores behind the level.
{_REPLAN_RULES}
"""

    query: str = dspy.InputField(desc="the user's request")
    image: dspy.Image = dspy.InputField(desc="the image")
    evidence: str = dspy.InputField(desc="what the Executor found: distortions, severities, tool scores")
    # First output field on purpose: its letter is the first value token of the JSON reply, and its
    # log-probabilities give the fusion's p_c (signatures.logprobs).
    level: Literal["A", "B", "C", "D", "E"] = dspy.OutputField(desc=f"one letter: {_LEVELS}")
    quality_reasoning: str = dspy.OutputField(desc="brief reasoning grounded in the evidence and the image")
    need_replan: bool = dspy.OutputField(desc="true only if the evidence cannot support a rating")
    replan_reason: Optional[str] = dspy.OutputField(desc="what is missing or wrong, when need_replan; else null")


def format_evidence(evidence: Optional[ExecutorOutput]) -> str:
    """The Executor's findings as the plain text both Summarizer signatures read.

    Deterministic (same evidence, same text) so prompts, caches and compiled demos stay stable.
    """
    if evidence is None:
        return "No evidence was collected; judge from the image alone."
    lines: list[str] = []
    if evidence.distortion_analysis:
        lines.append("Distortion analysis:")
        for obj, items in evidence.distortion_analysis.items():
            for item in items:
                lines.append(f"- {obj} / {item.type}: {item.severity}. {item.explanation.strip()}")
    elif evidence.distortion_set:
        lines.append("Distortions to consider (not analysed):")
        for obj, types in evidence.distortion_set.items():
            lines.append(f"- {obj}: {', '.join(types) if types else 'none found'}")
    if evidence.quality_scores:
        lines.append("Tool scores (normalized to 1-5, 5 = best):")
        for obj, by_type in evidence.quality_scores.items():
            for dist, (tool, score) in by_type.items():
                lines.append(f"- {obj} / {dist}: {tool} = {score:.2f}")
    notes = []
    for log in evidence.tool_logs:
        if log.fallback:
            instead = f" instead of {log.fallback_for}" if log.fallback_for else ""
            notes.append(f"- {log.tool_name} ran as a fallback{instead} ({log.object_name} / {log.distortion})")
        elif log.error:
            notes.append(f"- {log.tool_name} failed on {log.object_name} / {log.distortion}: {log.error}")
    if notes:
        lines.append("Tool notes:")
        lines.extend(notes)
    if not lines:
        return "No evidence was collected; judge from the image alone."
    return "\n".join(lines)
