"""What the graph gives every role for one assessment, and the interface the graph calls.

The graph's dependencies are LangGraph's run context (`GraphContext`, via `context_schema` and
`Runtime`): the tool registry, the settings and the roles. The per-assessment facts live in the graph's
state (`agentic_iqa.state.AgenticIQAState`). Each node hands its role an `AssessmentContext`: a view of
both, plus the node's own trace recorder and progress writer; what a role computes once per assessment
(`once`) goes back into typed state keys.

Two backends implement `Roles`: the VLM agents (`agentic_iqa.agents.vlm`) and the offline analyst
(`agentic_iqa.offline.analyst`). The graph, the state models, the tool registry and score fusion are
shared; only the roles differ.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from agentic_iqa.config import Settings
from agentic_iqa.state import ONCE_KEYS, Trace
from signatures.models import DistortionAnalysis, ExecutorOutput, PlannerOutput, SummarizerOutput


@dataclass(frozen=True)
class GraphContext:
    """The run context (LangGraph `context_schema`): what every node may use and no node changes."""

    registry: Any                      # iqa_tools.ToolRegistry (typed loosely to keep imports light)
    settings: Settings
    roles: "Roles"


@dataclass
class AssessmentContext:
    query: str
    image_path: Path
    reference_path: Optional[Path]
    registry: Any
    settings: Settings
    scoring: bool = True               # scoring mode (level A–E + fused score) vs explanation/QA mode
    use_cache: bool = True
    trace: Trace = field(default_factory=Trace)
    emit: Callable[[dict], None] = lambda event: None   # progress events (LangGraph's stream writer)
    state: dict = field(default_factory=dict)          # the graph state this node was called with
    updates: dict = field(default_factory=dict)        # values computed once, returned into the state

    @classmethod
    def for_node(cls, state: dict, deps: GraphContext, emit: Callable[[dict], None]) -> "AssessmentContext":
        return cls(
            query=state["query"],
            image_path=Path(state["image_path"]),
            reference_path=Path(state["reference_path"]) if state.get("reference_path") else None,
            registry=deps.registry,
            settings=deps.settings,
            scoring=state["scoring"],
            use_cache=state["use_cache"],
            emit=emit,
            state=state,
        )

    @property
    def has_reference(self) -> bool:
        return self.reference_path is not None

    def known_tools(self) -> list[str]:
        return self.registry.names()

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """The state's `key` (one of `state.ONCE_KEYS`), computed on first use in this assessment."""
        if key not in ONCE_KEYS:
            raise KeyError(f"{key!r} is not a once-per-assessment state key ({', '.join(sorted(ONCE_KEYS))})")
        value = self.updates.get(key, self.state.get(key))
        if value is None:
            value = self.updates[key] = compute()
        return value


class NoValidReply(ValueError):
    """A role's step got no usable reply from the model (every attempt rejected). The message is one line
    for people, e.g. "model reply rejected 4× (invalid JSON)"; the graph shows it with the fallback taken."""


class Roles(Protocol):
    """The three agents' judgement. Each method may raise; the graph turns failures into nulls/fallbacks."""

    name: str  # "vlm" or "offline": shown in results

    def plan(self, ctx: AssessmentContext, replan_reason: Optional[str]) -> PlannerOutput: ...

    def detect(self, ctx: AssessmentContext, plan: PlannerOutput) -> Optional[dict[str, list[str]]]: ...

    def analyze(
        self, ctx: AssessmentContext, plan: PlannerOutput, distortion_set: Optional[dict[str, list[str]]]
    ) -> Optional[dict[str, list[DistortionAnalysis]]]: ...

    def select(
        self, ctx: AssessmentContext, plan: PlannerOutput, distortion_set: Optional[dict[str, list[str]]]
    ) -> Optional[dict[str, dict[str, str]]]: ...

    def summarize(self, ctx: AssessmentContext, plan: PlannerOutput, evidence: ExecutorOutput) -> SummarizerOutput: ...
