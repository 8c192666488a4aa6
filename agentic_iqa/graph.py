"""The LangGraph graph: planner → executor (detect → {analyze ‖ select → execute} → evidence) →
summarizer → planner again if the Summarizer asks for a replan (at most `max_replan` times).

Distortion analysis and tool selection/execution only need the distortion set, so they run in
parallel branches: an assessment's critical path is four LM calls (plan, detect, select, summarize).
The dependencies (tool registry, settings, roles) come from LangGraph's run context
(`context_schema=GraphContext`, read through `Runtime`); every per-assessment fact is a typed state key
(`agentic_iqa.state.AgenticIQAState`), the trace is an append-only state list, and progress goes out
through LangGraph's stream writer (`stream_mode="custom"`). Each node is written once, as steps that
yield their LM calls (`agents.steps`): `build_graph()` compiles them for `invoke`, `build_graph(asynchronous=True)`
for `ainvoke` (DSPy's `acall`). Every node is wrapped the same way: timing,
progress events, and the spec's failure rules (a failing executor subtask leaves its field null and never
fails the executor; an unreachable LM hands the rest of the assessment to the offline analyst).
"""
from __future__ import annotations

import logging
import re
import time
from typing import Callable, Optional

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from agentic_iqa.agents.context import AssessmentContext, GraphContext, NoValidReply, Roles
from agentic_iqa.agents.planner_rules import rule_plan
from agentic_iqa.agents.steps import Steps, run_async, run_sync, steps
from agentic_iqa.agents.tool_execution import execute_tools, required_tool_assignments
from agentic_iqa.config import LMSetupError
from agentic_iqa.lm import lm_setup_problem, lm_unreachable
from agentic_iqa.redact import redact
from agentic_iqa.state import AgenticIQAState
from signatures.models import GLOBAL, OVERALL, ExecutorOutput, PlannerOutput, SummarizerOutput

log = logging.getLogger("agentic_iqa.graph")

#: How a stage's fallback entry begins when the LM could not be reached and the offline analyst took over
#: (the trace's `fallbacks` read "stage: LM unreachable (…); offline analyst answers"; optimizers.record reads it).
LM_UNREACHABLE = "LM unreachable"


def _offline(roles: Roles) -> Optional[Roles]:
    return getattr(roles, "offline", None)


def _stage(name: str, body: Callable, on_error: Callable) -> tuple[Callable, Callable]:
    """A node (sync, for `invoke`) and its async twin (for `ainvoke`) from one body: timing, progress
    events and failure handling are written once, as steps (`agents.steps`) that either driver runs."""

    def run(state: AgenticIQAState, runtime: Runtime[GraphContext]) -> Steps[dict]:
        deps = runtime.context
        writer = get_stream_writer()
        ctx = AssessmentContext.for_node(state, deps, writer)
        roles = deps.roles
        offline = _offline(roles)
        unreachable = state.get("lm_unreachable")
        update: dict = {}
        ctx.emit({"stage": name, "event": "start"})
        t0 = time.perf_counter()
        try:
            out = yield from steps(body(state, ctx, offline if unreachable and offline is not None else roles))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded degradation
            problem = lm_setup_problem(exc)
            if problem is not None:  # the user's setup, not the model's mistake: stop and say so
                raise LMSetupError(problem) from exc
            if lm_unreachable(exc) and offline is not None and not unreachable:
                first_line = redact((str(exc).strip().splitlines() or [""])[0])  # DSPy appends multi-line "To fix:" advice
                update["lm_unreachable"] = f"{type(exc).__name__}: {clip_text(first_line)}"
                ctx.trace.add(name, "fallback", f"{LM_UNREACHABLE} ({update['lm_unreachable']}); offline analyst answers")
                try:
                    out = yield from steps(body(state, ctx, offline))
                except Exception as exc2:  # noqa: BLE001
                    out = on_error(state, ctx, exc2)
            else:
                out = on_error(state, ctx, exc)
        dt = time.perf_counter() - t0
        ctx.trace.add(name, "end", seconds=dt)
        ctx.emit({"stage": name, "event": "end", "seconds": dt})
        update.update(out or {})
        update.update(ctx.updates)
        update.update(trace=ctx.trace.events, lm_calls=ctx.trace.lm_calls, retries=ctx.trace.retries,
                      image_bytes=ctx.trace.image_bytes)
        return update

    def node(state: AgenticIQAState, runtime: Runtime[GraphContext]) -> dict:
        return run_sync(run(state, runtime))

    async def anode(state: AgenticIQAState, runtime: Runtime[GraphContext]) -> dict:
        return await run_async(run(state, runtime))

    node.__name__ = anode.__name__ = name
    return node, anode


def _error(stage: str, ctx: AssessmentContext, exc: BaseException) -> None:
    msg = redact(f"{type(exc).__name__}: {exc}")
    log.warning("%s failed: %s", stage, msg)
    ctx.trace.add(stage, "error", msg[:1000])


def _fell_back(stage: str, ctx: AssessmentContext, exc: Optional[BaseException], instead: str) -> None:
    """The step's fallback as one line of the default summary: why, then what was done instead."""
    if exc is None:
        why = "no usable output"
    elif isinstance(exc, NoValidReply):
        why = str(exc)
    elif isinstance(exc, ValueError) and str(exc).strip():
        # Our refusals (a ValueError or ImageError) are written for the reader: the class name adds nothing.
        why = clip_text(redact((str(exc).strip().splitlines() or [""])[0]))
    else:
        why = clip_text(redact(f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"))
    ctx.trace.add(stage, "fallback", f"{why} → {instead}")


def clip_text(text: str, limit: int = 200) -> str:
    """`text` cut to at most `limit` characters, at a word boundary and marked with "…" when cut
    (a provider's message quoting a gateway's page can run to hundreds of characters)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    cut = head.rfind(" ")
    return (head[:cut] if cut > limit // 2 else head).rstrip(" ,;:.") + "…"


# ── node bodies ────────────────────────────────────────────────────────────────────────────────


def _plan(state, ctx, roles):
    plan = yield from steps(roles.plan(ctx, state.get("replan_reason")))
    ctx.emit({"stage": "planner", "event": "plan", "plan": plan.model_dump()})
    return {"plan": plan, "distortion_set": None, "distortion_analysis": None, "selected_tools": None, "tool_logs": []}


def _plan_failed(state, ctx, exc):
    _error("planner", ctx, exc)
    plan = rule_plan(ctx.query, has_reference=ctx.has_reference, tool_names=ctx.known_tools())
    _fell_back("planner", ctx, exc, "rule-based plan")
    return {"plan": plan, "distortion_set": None, "distortion_analysis": None, "selected_tools": None, "tool_logs": []}


def _detect(state, ctx, roles):
    plan: PlannerOutput = state["plan"]
    if plan.plan.distortion_detection:
        found = yield from steps(roles.detect(ctx, plan))
    else:
        found = plan.distortions  # explicit distortions named by the query (or none)
    return {"distortion_set": found}


def _analyze(state, ctx, roles):
    plan: PlannerOutput = state["plan"]
    if not plan.plan.distortion_analysis:
        return {"distortion_analysis": None}
    return {"distortion_analysis": (yield from steps(roles.analyze(ctx, plan, state.get("distortion_set"))))}


def default_tools(ctx: AssessmentContext, distortion_set: Optional[dict[str, list[str]]]) -> dict[str, dict[str, str]]:
    """Spec 000's fallback assignment: TOPIQ_FR (FR) or QAlign (NR), or the best tool that runs here."""
    mode = "FR" if ctx.has_reference else "NR"
    preferred = "TOPIQ_FR" if mode == "FR" else "QAlign"
    ok, _ = ctx.registry.availability(preferred)
    if not ok:
        candidates = ctx.registry.available_tools(mode)
        if not candidates:
            return {}
        preferred = candidates[0].name
    targets = distortion_set or {GLOBAL: [OVERALL]}
    return {obj: {d: preferred for d in (dists or [OVERALL])} for obj, dists in targets.items()}


def prefer_fr_tools(ctx: AssessmentContext, selected: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """With a reference, FR tools are preferred (spec 000): each NR pick is replaced by the best available FR
    tool for its distortion (one listing it among its strengths, else the generic FR default), and the
    replacement is recorded. A tool the query names is kept as asked (a plan's required tool never gets here)."""
    if not ctx.has_reference or not selected:
        return selected
    fr = ctx.registry.available_tools("FR")
    if not fr:
        return selected
    fallback = next((s.name for s in fr if s.name == "TOPIQ_FR"), fr[0].name)
    words = set(re.findall(r"[a-z0-9_]+", ctx.query.lower()))
    out: dict[str, dict[str, str]] = {}
    replaced: list[str] = []
    for obj, by_dist in selected.items():
        out[obj] = {}
        for dist, tool in by_dist.items():
            keep = tool.lower() in words or ctx.registry.spec(tool).mode == "FR"
            if keep:
                out[obj][dist] = tool
                continue
            best = next((s.name for s in fr if dist in s.strengths), fallback)
            out[obj][dist] = best
            replaced.append(f"{obj}/{dist}: {tool} → {best}")
    if replaced:
        ctx.trace.add("select", "note", "a reference is given, so full-reference tools replace no-reference picks "
                      "(name a tool in the query to keep it): " + "; ".join(replaced))
    return out


def _select(state, ctx, roles):
    plan: PlannerOutput = state["plan"]
    dset = state.get("distortion_set")
    if dset is not None and not any(dset.values()):
        dset = None  # nothing detected: tools rate the image as a whole ("Overall")
    selected, failure = None, None
    if plan.plan.tool_selection:
        try:
            selected = yield from steps(roles.select(ctx, plan, dset))
        except Exception as exc:  # noqa: BLE001
            if lm_unreachable(exc) and _offline(roles) is not None:
                raise
            _error("select", ctx, exc)
            failure = exc
        if not (selected and any(selected.values())) and plan.plan.tool_execution:
            selected = default_tools(ctx, dset)
            tools = sorted({t for by_dist in selected.values() for t in by_dist.values()})
            _fell_back("select", ctx, failure, f"generic tools ({', '.join(tools) or 'none available'})")
    elif plan.plan.tool_execution and plan.required_tool:
        selected = required_tool_assignments(plan, dset)
    elif plan.plan.tool_execution:
        selected = default_tools(ctx, dset)
    if selected is not None and not any(selected.values()):
        selected = None
    if selected is not None and not plan.required_tool:
        selected = prefer_fr_tools(ctx, selected)
    return {"selected_tools": selected}


def _execute(state, ctx, roles):
    selected = state.get("selected_tools")
    if not (state["plan"].plan.tool_execution and selected):
        return {"tool_logs": []}
    logs, _ = execute_tools(ctx, selected)
    return {"tool_logs": logs}


def _evidence(state, ctx, roles):
    logs = state.get("tool_logs") or []
    scores: dict[str, dict[str, tuple[str, float]]] = {}
    for lg in logs:
        if lg.ok:
            scores.setdefault(lg.object_name, {})[lg.distortion] = (lg.tool_name, lg.normalized_score)
    evidence = ExecutorOutput(
        distortion_set=state.get("distortion_set"),
        distortion_analysis=state.get("distortion_analysis"),
        selected_tools=state.get("selected_tools"),
        quality_scores=scores or None,
        tool_logs=logs,
    )
    return {"executor_evidence": evidence}


def _summarize(state, ctx, roles):
    plan: PlannerOutput = state["plan"]
    result = yield from steps(roles.summarize(ctx, plan, state["executor_evidence"]))
    replans = state.get("replans", 0)
    if result.need_replan and not plan.plan.tool_execution and re.search(r"tool|score", result.replan_reason or "", re.I):
        # The plan ran no tools on purpose (region-scoped or "Other" query): not a reason to replan.
        ctx.trace.add("summarizer", "note", f"replan request ignored (plan runs no tools by design): {result.replan_reason}")
        result = result.model_copy(update={"need_replan": False})
    will_replan = result.need_replan and replans < ctx.settings.pipeline.max_replan
    update = {"summarizer_result": result, "replan_requested": will_replan}
    if will_replan:
        update["replans"] = replans + 1
        update["replan_reason"] = result.replan_reason or "the evidence was insufficient"
        ctx.trace.add("summarizer", "note", f"replan {replans + 1}: {update['replan_reason']}")
    return update


def _summary_failed(state, ctx, exc):
    _error("summarizer", ctx, exc)
    from agentic_iqa.offline.analyst import OfflineRoles

    evidence = state.get("executor_evidence") or ExecutorOutput()
    try:
        result = OfflineRoles().summarize(ctx, state["plan"], evidence)
        _fell_back("summarizer", ctx, exc, "offline analyst summarized the evidence")
    except Exception as exc2:  # noqa: BLE001 - the last resort must not fail: tools alone
        _error("summarizer", ctx, exc2)
        result = tools_only_summary(ctx, evidence)
        _fell_back("summarizer", ctx, exc, "no summarizer could run; the answer rests on the tool scores alone")
    return {"summarizer_result": result, "replan_requested": False}


def tools_only_summary(ctx: AssessmentContext, evidence: ExecutorOutput) -> SummarizerOutput:
    """Spec 004's failure path: fused from tool scores with uniform level probabilities (3.0 without tools)."""
    from agentic_iqa.agents.tool_execution import unique_tool_scores
    from agentic_iqa.fusion import ScoreFusion

    scores = unique_tool_scores(evidence)
    fused = ScoreFusion(eta=ctx.settings.pipeline.fusion.eta).fuse(scores, prob_mode="uniform")
    basis = f"the mean of {len(scores)} tool score(s), {fused.qbar:.2f}" if scores else "no evidence (neutral 3.0)"
    reasoning = f"Only tool scores were available: the score rests on {basis}."
    if not ctx.scoring:
        return SummarizerOutput(final_answer="Unable to answer reliably: no summarizer could run.", quality_reasoning=reasoning)
    return SummarizerOutput.from_fusion(fused, reasoning, "tools only (summarizer failed)", prob_mode="uniform",
                                        query=ctx.query)


def _null(key: str, stage: str, instead: str):
    def on_error(state, ctx, exc):
        _error(stage, ctx, exc)
        _fell_back(stage, ctx, exc, instead)
        return {key: None}

    return on_error


def _route(state: AgenticIQAState) -> str:
    return "planner" if state.get("replan_requested") else END


_NODES = {
    "planner": (_plan, _plan_failed),
    "detect": (_detect, _null("distortion_set", "detect", "no distortions listed (analysis skipped; tools rate the whole image)")),
    "analyze": (_analyze, _null("distortion_analysis", "analyze", "no severities (the summary rests on the tool scores)")),
    "select": (_select, _null("selected_tools", "select", "no tools run")),
    "execute": (_execute, _null("tool_logs", "execute", "no tool scores")),
    "evidence": (_evidence, _null("executor_evidence", "evidence", "no evidence")),
    "summarizer": (_summarize, _summary_failed),
}


def build_graph(asynchronous: bool = False):
    """Compile the assessment graph (once per process is enough: the roles, registry and settings come
    with each run as its `context=GraphContext(...)`). `asynchronous=True` compiles the same nodes'
    async twins, for `ainvoke`: model calls go through DSPy's `acall` on the event loop."""
    g = StateGraph(AgenticIQAState, context_schema=GraphContext)
    for name, (body, on_error) in _NODES.items():
        g.add_node(name, _stage(name, body, on_error)[1 if asynchronous else 0])
    g.add_edge(START, "planner")
    g.add_edge("planner", "detect")
    g.add_edge("detect", "analyze")
    g.add_edge("detect", "select")
    g.add_edge("select", "execute")
    g.add_edge(["analyze", "execute"], "evidence")
    g.add_edge("evidence", "summarizer")
    g.add_conditional_edges("summarizer", _route, {"planner": "planner", END: END})
    return g.compile()
