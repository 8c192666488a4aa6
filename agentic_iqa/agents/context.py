"""What every role implementation gets for one assessment, and the interface the graph calls.

Two backends implement `Roles`: the VLM agents (`agentic_iqa.agents.vlm`) and the offline analyst
(`agentic_iqa.offline.analyst`). The graph, the state models, the tool registry and score fusion are
shared; only the roles differ.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from agentic_iqa.config import Settings
from agentic_iqa.state import Trace
from signatures.models import DistortionAnalysis, ExecutorOutput, PlannerOutput, SummarizerOutput


@dataclass
class AssessmentContext:
    query: str
    image_path: Path
    reference_path: Optional[Path]
    registry: Any                      # iqa_tools.ToolRegistry (typed loosely to keep imports light)
    settings: Settings
    trace: Trace = field(default_factory=Trace)
    scoring: bool = True               # scoring mode (level A–E + fused score) vs explanation/QA mode
    use_cache: bool = True
    emit: Callable[[dict], None] = lambda event: None   # progress events (per node, per tool)
    memo: dict = field(default_factory=dict)            # per-assessment values computed once (images, stats)

    @property
    def has_reference(self) -> bool:
        return self.reference_path is not None

    def known_tools(self) -> list[str]:
        return self.registry.names()


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
