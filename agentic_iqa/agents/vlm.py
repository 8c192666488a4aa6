"""The three agents played by a vision-language model through DSPy.

Each subtask is a `dspy.Module` around one signature (so optimizers can compile it and programs can be
saved and loaded per module); `VLMRoles` asks for them with each role's LM (its methods are steps that
yield `LMCall`s, run sync or async by the graph: `agents.steps`) and turns their results into the shared
state models. Model mistakes are retried with feedback
(`StructuredPredict`); a subtask that still fails returns None and the graph records it.
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from agentic_iqa.agents.context import AssessmentContext, NoValidReply  # noqa: E402
from agentic_iqa.agents.planner_rules import mcq_options  # noqa: E402
from agentic_iqa.agents.modules import AGENT_MODULES, MODULE_NAMES, AgentModule, Facts  # noqa: E402,F401
from agentic_iqa.agents.steps import LMCall, Steps  # noqa: E402
from agentic_iqa.agents.structured import StructuredResult  # noqa: E402
from agentic_iqa.agents.tool_execution import unique_tool_scores  # noqa: E402
from agentic_iqa.config import Settings, image_transport_parts  # noqa: E402
from agentic_iqa.fusion import ScoreFusion  # noqa: E402
from agentic_iqa.lm import build_role_lms  # noqa: E402
from signatures import format_evidence, vlm_image  # noqa: E402
from signatures.image import REFERENCE_FIELD, image_bytes  # noqa: E402
from signatures.logprobs import read_level_logprobs  # noqa: E402
from signatures.models import (  # noqa: E402
    ExecutorOutput,
    PlannerOutput,
    SummarizerOutput,
)

def _option_probabilities(pred, options: tuple[str, ...]) -> str:
    """The answer's probability over the offered letters, from the answer token's log-probs."""
    reading = read_level_logprobs(pred, field="final_answer")
    if reading is None:
        return f"answer {pred.final_answer} of {', '.join(options)}: the provider returned no log-probs for it"
    ranked = {x: lp for x, lp in reading.logprobs.items() if x in options and x in reading.ranked}
    if not ranked:
        return f"answer {pred.final_answer} of {', '.join(options)}: no offered letter was ranked at that token"
    top = max(ranked.values())
    weights = {x: math.exp(ranked[x] - top) if x in ranked else 0.0 for x in options}
    total = sum(weights.values())
    probs = ", ".join(f"{x} {weights[x] / total:.2f}" for x in options)
    return (f"answer {pred.final_answer} with probability {weights.get(pred.final_answer, 0.0) / total:.2f} "
            f"over the offered options ({probs}), from the answer token's log-probs")


class VLMRoles:
    """Roles played by the configured VLM(s); `offline` takes over when the LM is unreachable."""

    def __init__(self, settings: Settings, offline: Any = None, lms: Optional[dict] = None):
        self.settings = settings
        self.offline = offline
        self.lms = lms or build_role_lms(settings.backends)
        retries = settings.pipeline.max_retries
        self.modules: dict[str, AgentModule] = {name: AgentModule(name, retries) for name in AGENT_MODULES}
        self.fusion = ScoreFusion(eta=settings.pipeline.fusion.eta, prob_mode=settings.pipeline.fusion.prob_mode)
        models = sorted({lm.model for lm in self.lms.values() if lm is not None})
        self.name = f"vlm ({', '.join(models)})"
        for module, path in settings.pipeline.programs.items():
            self.load_program(module, path)

    def load_program(self, module: str, path) -> None:
        from agentic_iqa.programs import load_program

        load_program(self.modules, module, path)

    # ── helpers ─────────────────────────────────────────────────────────────────────────────────

    def _encode(self, ctx: AssessmentContext, path, label: str = "") -> dspy.Image:
        p = ctx.settings.pipeline
        transport, quality, side = image_transport_parts(p.image_transport)
        image, note = vlm_image(path, p.vlm_image_max_side, transport=transport, quality=quality, side=side)
        if note:
            ctx.trace.add("input", "note", f"{label}{note} (image_transport: {p.image_transport})")
        return image

    def _image(self, ctx: AssessmentContext) -> dspy.Image:
        return ctx.once("vlm_image", lambda: self._encode(ctx, ctx.image_path))

    def _images(self, ctx: AssessmentContext) -> dict[str, dspy.Image]:
        """The image inputs of a step that looks at the image: in full-reference mode the reference too,
        labelled, so the VLM compares the pair as the paper's FR prompts do."""
        images = {"image": self._image(ctx)}
        if ctx.has_reference:
            images[REFERENCE_FIELD] = ctx.once("vlm_reference", lambda: self._encode(ctx, ctx.reference_path, "reference: "))
        return images

    def _call(self, ctx: AssessmentContext, stage: str, module: str, facts: Optional[Facts] = None,
              part: Optional[str] = None, **inputs) -> Steps[StructuredResult]:
        """Steps of one module call (the graph's driver runs it sync or async: `agents.steps`)."""
        role = AGENT_MODULES[module].role
        lm = self.lms.get(role)
        if lm is None:
            raise RuntimeError(f"no LM configured for the {role} role")
        images = [v for v in inputs.values() if isinstance(v, dspy.Image)]
        per_request = sum(map(image_bytes, images))
        sent = f"; {len(images)} image(s), {per_request:,} bytes per request" if images else ""
        ctx.trace.add(stage, "lm_call", f"{module} via {lm.model}{sent}", image_bytes=per_request)
        # DSPy otherwise keeps every request, image included, in its history and trace (up to 10,000
        # entries per process): a long-lived service would grow by the size of each image, per call.
        quiet = {} if ctx.settings.pipeline.lm_history else {"disable_history": True, "trace": None}
        # lm_calls counts every HTTP request sent (the LM's own retries included), also when the call fails;
        # an LM that sends none (the demo LM, DSPy's DummyLM) counts its structured attempts instead.
        call = LMCall(self.modules[module], lm, dict(part=part, facts=facts, **inputs), quiet)
        try:
            result: StructuredResult = yield call
        except Exception:
            ctx.trace.count_lm(call.requests, max(0, call.requests - 1), image_bytes=per_request * call.requests)
            raise
        if call.requests:
            ctx.trace.count_lm(call.requests, call.requests - 1, image_bytes=per_request * call.requests)
        else:
            ctx.trace.count_lm(result.lm_calls, result.retries, image_bytes=per_request * result.lm_calls)
        for err in result.errors:
            ctx.trace.add(stage, "retry", err[:500])
        if not result.ok:  # the graph records the step's fallback, with this one-line reason
            raise NoValidReply(result.rejection())
        return result

    def _reference_mode(self, ctx: AssessmentContext) -> str:
        return "Full-Reference" if ctx.has_reference else "No-Reference"

    # ── roles ───────────────────────────────────────────────────────────────────────────────────

    def plan(self, ctx: AssessmentContext, replan_reason: Optional[str]) -> Steps[PlannerOutput]:
        known = ctx.known_tools()
        result = yield from self._call(
            ctx, "planner", "planner", Facts(known_tools=known),
            query=ctx.query, image=self._image(ctx), reference_mode=self._reference_mode(ctx),
            available_tools=known, replan_reason=replan_reason,
        )
        return PlannerOutput.from_decision(
            result.prediction.planner_output, has_reference=ctx.has_reference, context={"known_tools": known}
        )

    def detect(self, ctx: AssessmentContext, plan: PlannerOutput):
        result = yield from self._call(
            ctx, "detect", "detect", query=ctx.query, **self._images(ctx), query_scope=plan.query_scope
        )
        return result.prediction.distortion_set.root

    def analyze(self, ctx: AssessmentContext, plan: PlannerOutput, distortion_set):
        if not distortion_set:
            return None
        result = yield from self._call(
            ctx, "analyze", "analyze", Facts(distortion_set=distortion_set), query=ctx.query, **self._images(ctx),
            distortion_set=distortion_set,
        )
        return result.prediction.distortion_analysis.root

    def select(self, ctx: AssessmentContext, plan: PlannerOutput, distortion_set):
        mode = "FR" if ctx.has_reference else "NR"
        allowed: dict[str, str] = {}
        for name in ctx.registry.names():
            spec = ctx.registry.spec(name)
            ok, why = ctx.registry.availability(name)
            if not ok:
                allowed[name] = why or "it cannot run on this machine"
            elif spec.mode == "FR" and not ctx.has_reference:
                allowed[name] = "it is a full-reference tool and no reference image was given"
            else:
                allowed[name] = ""
        # FR tools first when a reference exists (spec 000); NR tools are offered only without one.
        parts = [ctx.registry.describe_tools("FR", available_only=True)] if mode == "FR" else []
        parts.append(ctx.registry.describe_tools("NR", available_only=True))
        description = "\n".join(p for p in parts if p)
        result = yield from self._call(
            ctx, "select", "select", Facts(allowed_tools=allowed),
            distortion_set=distortion_set or {"Global": ["Overall"]},
            tool_description=description, reference_mode=self._reference_mode(ctx),
        )
        return result.prediction.selected_tools.root

    def summarize(self, ctx: AssessmentContext, plan: PlannerOutput, evidence: ExecutorOutput) -> Steps[SummarizerOutput]:
        inputs = dict(query=ctx.query, **self._images(ctx), evidence=format_evidence(evidence))
        options = () if ctx.scoring else tuple(mcq_options(ctx.query))
        result = yield from self._call(ctx, "summarizer", "summarize", Facts(options=options),
                            part="score" if ctx.scoring else "explain", **inputs)
        pred = result.prediction
        if options:
            ctx.trace.add("summarizer", "note", _option_probabilities(pred, options))
        if not ctx.scoring:
            return SummarizerOutput(
                final_answer=pred.final_answer,
                quality_reasoning=pred.quality_reasoning,
                need_replan=bool(pred.need_replan),
                replan_reason=pred.replan_reason,
            )
        return self._fused(ctx, plan, evidence, pred)

    def _fused(self, ctx, plan, evidence: ExecutorOutput, pred) -> SummarizerOutput:
        scores = unique_tool_scores(evidence)
        reading = read_level_logprobs(pred)
        fused = self.fusion.fuse(
            scores,
            level_logprobs=reading.logprobs if reading else None,
            level=pred.level,
            prob_note=reading.note() if reading else "the provider returned no token log-probs",
        )
        need_replan = bool(pred.need_replan)
        reason = pred.replan_reason
        if fused.need_replan and plan.plan.tool_execution:
            need_replan, reason = True, reason or "; ".join(fused.warnings) or "score fusion failed"
        return SummarizerOutput.from_fusion(
            fused, pred.quality_reasoning,
            f"VLM chose {pred.level}; {fused.prob_note}; tool mean "
            + (f"{fused.qbar:.2f} from {len(scores)} score(s)" if fused.qbar is not None else "n/a (no tool scores)"),
            need_replan=need_replan, replan_reason=reason, query=ctx.query,
        )
