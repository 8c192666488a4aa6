"""Tool execution subtask (spec 000), shared by both backends: run the selected tools through the
registry (its cache and fallback chain), one forward per tool however many distortions it serves."""
from __future__ import annotations

from typing import Optional

from agentic_iqa.agents.context import AssessmentContext
from iqa_tools.records import ToolExecutionLog
from signatures.models import GLOBAL, OVERALL, ExecutorOutput, PlannerOutput


def required_tool_assignments(
    plan: PlannerOutput, distortion_set: Optional[dict[str, list[str]]]
) -> dict[str, dict[str, str]]:
    """`required_tool` skips selection: every named tool runs for every distortion (spec 000).

    With several named tools, each distortion gets the first; the others run under "Overall" so the
    user sees every tool they asked for.
    """
    tools = plan.required_tool or []
    if not tools:
        return {}
    targets = distortion_set or {obj: [OVERALL] for obj in plan.query_scope} or {GLOBAL: [OVERALL]}
    out: dict[str, dict[str, str]] = {}
    for obj, dists in targets.items():
        out[obj] = {d: tools[0] for d in (dists or [OVERALL])}
    for extra in tools[1:]:
        out.setdefault(GLOBAL, {})[f"{OVERALL} ({extra})"] = extra
    return out


def execute_tools(
    ctx: AssessmentContext, selected: dict[str, dict[str, str]]
) -> tuple[list[ToolExecutionLog], dict[str, dict[str, tuple[str, float]]]]:
    """Run each assigned tool; returns all logs (failures and fallbacks included) and quality_scores."""
    logs: list[ToolExecutionLog] = []
    scores: dict[str, dict[str, tuple[str, float]]] = {}
    runs: dict[str, list[ToolExecutionLog]] = {}
    ref = str(ctx.reference_path) if ctx.reference_path else None
    for obj, by_dist in selected.items():
        for dist, tool in by_dist.items():
            if tool not in runs:
                ctx.emit({"stage": "execute", "event": "tool_start", "tool": tool})
                runs[tool] = ctx.registry.run(
                    tool,
                    str(ctx.image_path),
                    ref,
                    object_name=obj,
                    distortion=dist,
                    use_cache=ctx.use_cache,
                    fallback=True,
                )
                run_logs = runs[tool]
                failed = None  # the tool that failed just before each fallback: the chain, step by step
                for log in run_logs:
                    if log.fallback:
                        why = ""
                        if failed is not None:  # the tools table has the whole error; one short line here
                            why = failed.error.splitlines()[0].removeprefix(f"{failed.tool_name}: ")
                            why = f" ({why[:100]}…)" if len(why) > 100 else f" ({why})"
                        ctx.trace.add("execute", "fallback",
                                      f"{failed.tool_name if failed else log.fallback_for} failed{why} → {log.tool_name}",
                                      tool=log.tool_name)
                    if log.error:
                        failed = log
                ok = [lg for lg in run_logs if lg.ok]
                ctx.emit({
                    "stage": "execute", "event": "tool_end", "tool": tool,
                    "score": ok[-1].normalized_score if ok else None,
                    "cached": bool(ok and ok[-1].cached),
                    "error": None if ok else (run_logs[-1].error if run_logs else "no result"),
                })
            else:
                run_logs = [lg.model_copy(update={"object_name": obj, "distortion": dist}) for lg in runs[tool]]
            logs.extend(run_logs)
            ok = [lg for lg in run_logs if lg.ok]
            if ok:
                scores.setdefault(obj, {})[dist] = (ok[-1].tool_name, ok[-1].normalized_score)
    return logs, scores


def unique_tool_scores(evidence: ExecutorOutput) -> list[float]:
    """One normalized score per tool (a tool serving several distortions counts once in the mean)."""
    seen: dict[str, float] = {}
    for by_dist in (evidence.quality_scores or {}).values():
        for tool, score in by_dist.values():
            seen.setdefault(tool, score)
    return list(seen.values())
