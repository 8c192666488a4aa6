"""The agent modules, in one table: `AGENT_MODULES[name] = ModuleSpec(signatures, role, validator, metric, fixtures)`.

The pipeline (`agents.vlm.VLMRoles`) and `agentic-iqa compile` (`optimizers`) build and call a module the
same way: `AgentModule(spec)` holds one `StructuredPredict` per signature ("part"), and each call passes
the `Facts` its validator checks the reply against as an explicit input. The module names are those of
`agentic-iqa compile --module` and `programs:`; a program's state keys are `<attribute>.predict`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from agentic_iqa.agents.structured import StructuredPredict, StructuredResult, Validator, _derived_from  # noqa: E402
from signatures import signatures_by_name  # noqa: E402
from signatures.image import REFERENCE_FIELD, with_reference  # noqa: E402
from signatures.models import PlannerDecision, ToolAssignment, check_analysis_matches  # noqa: E402


@dataclass(frozen=True)
class Facts:
    """What a validator checks a reply against, given per call (never read from module-level state)."""

    known_tools: list[str] = field(default_factory=list)
    allowed_tools: dict[str, str] = field(default_factory=dict)  # tool -> "" if usable here, else why not
    distortion_set: Optional[dict[str, list[str]]] = None
    options: tuple[str, ...] = ()  # the letters a multiple-choice query offers ("A", "B", …)


def check_plan(pred: dspy.Prediction, facts: Facts) -> dspy.Prediction:
    pred.planner_output = PlannerDecision.model_validate(
        pred.planner_output.model_dump(), context={"known_tools": facts.known_tools}
    )
    return pred


def check_selection(pred: dspy.Prediction, facts: Facts) -> dspy.Prediction:
    allowed = facts.allowed_tools
    assignment = ToolAssignment.model_validate(pred.selected_tools.model_dump(), context={"known_tools": list(allowed)})
    problems = [
        f"{tool!r} for {obj}/{dist} cannot be used: {allowed[tool]}"
        for obj, by_dist in assignment.root.items()
        for dist, tool in by_dist.items()
        if allowed.get(tool)
    ]
    if problems:
        usable = sorted(t for t, why in allowed.items() if not why)
        raise ValueError("; ".join(problems) + f". Choose only from: {usable}")
    pred.selected_tools = assignment
    return pred


def check_answer(pred: dspy.Prediction, facts: Optional[Facts]) -> dspy.Prediction:
    """A multiple-choice answer must be one of the offered letters ('B', '(B)', 'B. No' read as 'B')."""
    if facts is None or not facts.options or not hasattr(pred, "final_answer"):
        return pred
    text = str(pred.final_answer or "").strip()
    m = re.match(r"^[\s\"'(]*([A-Za-z])(?:[\s.)\"':]|$)", text)
    letter = m.group(1).upper() if m else None
    if letter not in facts.options:
        raise ValueError(f"final_answer must be the letter of one of the offered options "
                         f"({', '.join(facts.options)}), got {text[:40]!r}")
    pred.final_answer = letter
    return pred


def check_analysis(pred: dspy.Prediction, facts: Facts) -> dspy.Prediction:
    check_analysis_matches(pred.distortion_analysis.root, facts.distortion_set)
    return pred


@dataclass(frozen=True)
class ModuleSpec:
    """One compilable agent module.

    parts: part name (the signature's short name) -> the module attribute holding its StructuredPredict.
    role: the configured role (configs/model_backends.yaml) whose LM plays it.
    validator: the extra check of its replies, or None.
    metric: what `optimizers.metrics` grades for it (shown by `compile`, written into program headers).
    fixtures: its fixture file under optimizers/fixtures/.
    """

    parts: Mapping[str, str]
    role: str
    validator: Optional[Validator]
    metric: str
    fixtures: str

    @property
    def signatures(self) -> dict[str, type[dspy.Signature]]:
        every = signatures_by_name()
        return {part: every[part] for part in self.parts}


AGENT_MODULES: Mapping[str, ModuleSpec] = MappingProxyType({
    "planner": ModuleSpec({"plan": "step"}, "planner", check_plan,
                          "plan: weighted per-field agreement (flags 40 %)", "planner.jsonl"),
    "detect": ModuleSpec({"detect": "step"}, "executor", None, "detect: F1 over (object, category)", "detect.jsonl"),
    "analyze": ModuleSpec({"analyze": "step"}, "executor", check_analysis,
                          "analyze: 1 - severity steps off / 4", "analyze.jsonl"),
    "select": ModuleSpec({"select": "step"}, "executor", check_selection,
                         "select: acceptable tool 1, right FR/NR kind 0.4", "select.jsonl"),
    "summarize": ModuleSpec({"explain": "explain", "score": "score"}, "summarizer", check_answer,
                            "explain: answer 0.9 + replan 0.1; score: 0.9 x (1 - level error / 4) + replan 0.1",
                            "summarize.jsonl"),
})
MODULE_NAMES = tuple(AGENT_MODULES)


class AgentModule(dspy.Module):
    """One agent module of the table: a StructuredPredict per part, called with that part's facts."""

    def __init__(self, name: str, max_retries: int = 3):
        super().__init__()
        try:
            spec = AGENT_MODULES[name]
        except KeyError:
            raise ValueError(f"unknown module {name!r}; use one of {', '.join(MODULE_NAMES)}") from None
        self.name = name
        self.parts = dict(spec.parts)
        for part, signature in spec.signatures.items():
            setattr(self, spec.parts[part], StructuredPredict(signature, max_retries, validate=spec.validator))

    def part(self, part: Optional[str] = None) -> StructuredPredict:
        return getattr(self, self.parts[part] if part else next(iter(self.parts.values())))

    def _signature_for(self, predictor: StructuredPredict, inputs: dict) -> Optional[type[dspy.Signature]]:
        """The signature this call needs when it differs from the module's: with a reference image, the
        full-reference form (made once per signature; the module's own, possibly compiled, one is its base)."""
        if inputs.get(REFERENCE_FIELD) is None:
            inputs.pop(REFERENCE_FIELD, None)  # no reference: the prompt is the no-reference one, one image
            return None
        base = predictor.signature
        memo = _derived_from(base)
        if "with reference" not in memo:
            memo["with reference"] = with_reference(base)
        return memo["with reference"]

    def forward(self, part: Optional[str] = None, facts: Any = None, **inputs: Any) -> StructuredResult:
        predictor = self.part(part)
        return predictor(facts=facts, signature=self._signature_for(predictor, inputs), **inputs)

    async def aforward(self, part: Optional[str] = None, facts: Any = None, **inputs: Any) -> StructuredResult:
        predictor = self.part(part)
        return await predictor.acall(facts=facts, signature=self._signature_for(predictor, inputs), **inputs)
