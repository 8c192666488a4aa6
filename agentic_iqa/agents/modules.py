"""The agent modules, in one table: `AGENT_MODULES[name] = ModuleSpec(signatures, role, validator, metric, fixtures)`.

The pipeline (`agents.vlm.VLMRoles`) and `agentic-iqa compile` (`optimizers`) build and call a module the
same way: `AgentModule(spec)` holds one `StructuredPredict` per signature ("part"), and each call passes
the `Facts` its validator checks the reply against as an explicit input. The module names are those of
`agentic-iqa compile --module` and `programs:`; a program's state keys are `<attribute>.predict`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from agentic_iqa.agents.structured import StructuredPredict, StructuredResult, Validator  # noqa: E402
from signatures import signatures_by_name  # noqa: E402
from signatures.models import PlannerDecision, ToolAssignment, check_analysis_matches  # noqa: E402


@dataclass(frozen=True)
class Facts:
    """What a validator checks a reply against, given per call (never read from module-level state)."""

    known_tools: list[str] = field(default_factory=list)
    allowed_tools: dict[str, str] = field(default_factory=dict)  # tool -> "" if usable here, else why not
    distortion_set: Optional[dict[str, list[str]]] = None


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
    "summarize": ModuleSpec({"explain": "explain", "score": "score"}, "summarizer", None,
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

    def forward(self, part: Optional[str] = None, facts: Any = None, **inputs: Any) -> StructuredResult:
        return self.part(part)(facts=facts, **inputs)

    async def aforward(self, part: Optional[str] = None, facts: Any = None, **inputs: Any) -> StructuredResult:
        return await self.part(part).acall(facts=facts, **inputs)
