"""Turn saved assessments (`agentic-iqa assess --save-trace run.json`) into fixture lines.

Each trace yields up to one line per module, from what the pipeline did:

- planner:   the query, whether a reference was given, and the plan;
- detect:    the distortion set, when detection ran;
- analyze:   the severities of the distortion analysis;
- select:    the chosen tools (each counted acceptable), when tool selection ran;
- summarize: the answer (explain mode) or level (score mode) with the evidence the Summarizer read.

These labels are the pipeline's own answers until someone checks them: lines say so in
`label_source`, and the summarizer label can be given outright (`level=` / `answer=`). A recorded
plan whose flags contradict DESIGN §3's rules for its own fields is reported, since it would teach
the contradiction. A stage that fell back (the trace's `fallbacks`: a rejected reply, an unreachable LM)
gave the rules' or the offline analyst's answer, not the model's: its line is skipped with the reason, or,
for a summary labelled with --level/--answer, kept with the fallback in `meta.fallback`. Images are copied next to the fixture files (under images/, named by content
hash) so a fixture folder stays usable when the original files move.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from pydantic import ValidationError

from optimizers.fixtures import FIXTURE_FILES, LINE_MODELS, ToolCatalog, default_catalog
from signatures.models import ExecutorOutput, PlannerOutput, normalize_level

RECORDED = "recorded (the pipeline's own answer: review before training on it)"


#: The trace stage (graph node) whose answer each module's line records.
STAGE_OF = {"planner": "planner", "detect": "detect", "analyze": "analyze", "select": "select", "summarize": "summarizer"}


class RecordError(ValueError):
    """A trace file cannot be turned into fixtures."""


@dataclass
class RecordResult:
    lines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # module -> new lines
    skipped: list[str] = field(default_factory=list)    # "module: why" for what could not be recorded
    warnings: list[str] = field(default_factory=list)


#: A saved assessment is a few hundred KB (every trace event included); a FIFO or a huge file is refused at once.
MAX_TRACE_BYTES = 64 * 1024 * 1024


def _read_trace(path: Path) -> dict[str, Any]:
    from iqa_tools.files import read_regular_file

    if not path.exists() and not path.is_symlink():
        raise RecordError(f"trace file {path} does not exist")
    try:
        raw = read_regular_file(path, f"trace file {path}", MAX_TRACE_BYTES, "a saved assessment")
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"trace file {path} is not readable JSON ({exc})") from None
    except ValueError as exc:  # not a regular file, too big, unreadable: read_regular_file's one line
        raise RecordError(f"{exc}; pass the JSON written by assess --save-trace") from None
    if not isinstance(data, dict) or not {"query", "image", "result"} <= set(data):
        raise RecordError(f"{path} is not a saved assessment (expected the JSON written by assess --save-trace)")
    return data


@functools.lru_cache(maxsize=1)
def _stages_after() -> dict[str, frozenset[str]]:
    """{stage: the stages that run after it}, read from the assessment graph's own nodes and edges (the
    summarizer's conditional route back to the planner, a replan, aside). analyze and select run in parallel:
    neither is after the other."""
    from agentic_iqa.graph import build_graph

    drawn = build_graph().get_graph()
    following: dict[str, set[str]] = {}
    for edge in drawn.edges:
        if not edge.conditional:
            following.setdefault(edge.source, set()).add(edge.target)
    after: dict[str, frozenset[str]] = {}
    for stage in drawn.nodes:
        seen: set[str] = set()
        todo = list(following.get(stage, ()))
        while todo:
            nxt = todo.pop()
            if nxt not in seen:
                seen.add(nxt)
                todo.extend(following.get(nxt, ()))
        after[stage] = frozenset(seen)
    return after


def _fallbacks_by_module(data: dict[str, Any]) -> dict[str, str]:
    """{module: the fallback that answered instead of the model} from the trace's `fallbacks` ("stage: why →
    instead"): the stages with an entry, and, once the LM was unreachable at a stage, every stage that ran after
    it (the offline analyst's, without an entry of its own). A stage running in parallel with the one that found
    the LM unreachable (analyze ‖ select) asked the model itself: it has its own entry if the model failed it too."""
    from agentic_iqa.graph import LM_UNREACHABLE

    after = _stages_after()
    found: dict[str, str] = {}
    unreachable_before: dict[str, str] = {}  # module -> the first stage before it that found the LM unreachable
    entries = data.get("fallbacks")
    for entry in entries if isinstance(entries, list) else []:
        stage, _, why = str(entry).partition(": ")
        if stage not in after:
            continue
        for module, module_stage in STAGE_OF.items():
            if module_stage == stage:
                found.setdefault(module, why)
        if why.startswith(LM_UNREACHABLE):
            for module, module_stage in STAGE_OF.items():
                if module_stage in after[stage]:
                    unreachable_before.setdefault(module, stage)
    for module, stage in unreachable_before.items():
        found.setdefault(module, f"the LM was unreachable from the {stage} stage on → the offline analyst answered")
    return found


def _find_image(raw: str, trace_path: Path) -> Path:
    p = Path(raw)
    for candidate in (p, trace_path.parent / p):
        if candidate.is_file():
            return candidate.resolve()
    raise RecordError(f"image {raw} named in {trace_path} was not found (looked relative to the current "
                      f"directory and to the trace file)")


def _place_image(src: Path, out_dir: Path, copy: bool) -> str:
    """The image path to write in a fixture line (relative to out_dir)."""
    if copy:
        digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
        dest = out_dir / "images" / f"{digest}{src.suffix.lower()}"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        return dest.relative_to(out_dir).as_posix()
    try:
        return Path(os.path.relpath(src, out_dir.resolve())).as_posix()
    except ValueError:  # another drive on Windows
        return str(src)


def lines_from_trace(
    trace_path: str | Path,
    out_dir: str | Path,
    *,
    modules: Iterable[str] = FIXTURE_FILES,
    split: str = "train",
    level: Optional[str] = None,
    answer: Optional[str] = None,
    copy_images: bool = True,
    catalog: Optional[ToolCatalog] = None,
) -> RecordResult:
    """Fixture lines (validated, not yet written) for one saved assessment."""
    trace_path = Path(trace_path)
    out_dir = Path(out_dir)
    catalog = catalog or default_catalog()
    data = _read_trace(trace_path)
    modules = list(modules)
    unknown = [m for m in modules if m not in FIXTURE_FILES]
    if unknown:
        raise RecordError(f"unknown module(s) {unknown}; use {', '.join(FIXTURE_FILES)}")
    if split not in ("train", "val"):
        raise RecordError(f"split must be train or val, got {split!r}")
    if level is not None and normalize_level(level) not in ("A", "B", "C", "D", "E"):
        raise RecordError(f"level must be one of A-E, got {level!r}")
    context = {"known_tools": catalog.names}
    try:
        plan = PlannerOutput.model_validate(data["plan"], context=context) if data.get("plan") else None
        evidence = ExecutorOutput.model_validate(data["evidence"]) if data.get("evidence") else None
    except ValidationError as exc:
        raise RecordError(f"{trace_path}: the saved plan or evidence does not validate: {exc.errors()[0]['msg']}") from None
    result = data["result"] or {}
    image = _place_image(_find_image(data["image"], trace_path), out_dir, copy_images)
    key = hashlib.sha256(json.dumps([data["query"], data["image"], data.get("reference"), result],
                                    sort_keys=True, default=str).encode()).hexdigest()[:12]
    common = {"split": split, "source": f"recorded:{trace_path.name}", "label_source": RECORDED,
              "meta": {"trace": str(trace_path), "backend": data.get("backend")}}
    out = RecordResult()
    candidates: dict[str, dict[str, Any]] = {}

    if "planner" in modules:
        if plan is None:
            out.skipped.append("planner: the trace has no plan")
        else:
            decision = plan.model_dump(mode="json", exclude={"reference_mode"})
            candidates["planner"] = {"query": data["query"], "image": image, "has_reference": data.get("reference") is not None,
                                     "planner_output": decision}
            expected = plan.expected_flags()
            if plan.plan != expected:
                wrong = [f for f in type(expected).model_fields if getattr(plan.plan, f) != getattr(expected, f)]
                out.warnings.append(f"planner: the recorded flags {wrong} contradict DESIGN §3's rules for the plan's own "
                                    "fields; fix the line before training on it")
    if "detect" in modules:
        if plan is None or evidence is None or evidence.distortion_set is None:
            out.skipped.append("detect: the trace has no distortion set")
        elif not plan.plan.distortion_detection:
            out.skipped.append("detect: detection did not run (the query named its distortions)")
        else:
            candidates["detect"] = {"image": image, "query": data["query"], "query_scope": plan.query_scope,
                                    "distortion_set": evidence.distortion_set}
    if "analyze" in modules:
        if evidence is None or not evidence.distortion_analysis or not evidence.distortion_set:
            out.skipped.append("analyze: the trace has no distortion analysis")
        else:
            analysis = {o: [a.model_dump() for a in items] for o, items in evidence.distortion_analysis.items()}
            analysed = {o: [a["type"] for a in items] for o, items in analysis.items()}
            candidates["analyze"] = {"image": image, "query": data["query"], "distortion_set": analysed,
                                     "distortion_analysis": analysis}
    if "select" in modules:
        if plan is None or evidence is None or not evidence.selected_tools or not plan.plan.tool_selection:
            out.skipped.append("select: tool selection did not run")
        elif not evidence.distortion_set:
            out.skipped.append("select: the tools were chosen without a distortion set")
        else:
            chosen = {o: {d: t for d, t in by.items() if d in (evidence.distortion_set.get(o) or [])}
                      for o, by in evidence.selected_tools.items()}
            chosen = {o: by for o, by in chosen.items() if by}
            candidates["select"] = {
                "reference_mode": plan.reference_mode,
                "distortion_set": {o: list(by) for o, by in chosen.items()},
                "selected_tools": chosen,
                "acceptable": {o: {d: [t] for d, t in by.items()} for o, by in chosen.items()},
            }
    if "summarize" in modules:
        mode = "score" if data.get("mode") == "score" else "explain"
        line: dict[str, Any] = {"mode": mode, "image": image, "query": data["query"],
                                "evidence": json.loads(evidence.model_dump_json()) if evidence else None,
                                "quality_reasoning": result.get("quality_reasoning") or "(no reasoning recorded)",
                                "need_replan": False, "replan_reason": None}
        if mode == "score":
            line["level"] = normalize_level(level) if level else result.get("level")
        else:
            line["final_answer"] = answer if answer is not None else result.get("final_answer")
        if (mode == "score" and level) or (mode == "explain" and answer is not None):
            line["label_source"] = "user"
        elif mode == "score" and answer is not None:
            out.warnings.append(f"summarize: --answer is for question traces; this one rates quality (score mode), "
                                f"so the pipeline's level {line['level']} was recorded: pass --level A-E to label it")
        elif mode == "explain" and level:
            out.warnings.append("summarize: --level is for quality-rating traces; this one answers a question, so "
                                "the pipeline's answer was recorded: pass --answer to label it")
        candidates["summarize"] = line

    fell_back = _fallbacks_by_module(data)
    for module in list(candidates):
        why = fell_back.get(module)
        if why is None:
            continue
        if candidates[module].get("label_source") == "user":  # the user's label; the reasoning is the fallback's
            candidates[module]["meta"] = {**common["meta"], "fallback": why}
            out.warnings.append(f"{module}: the model did not answer this stage (fallback: {why}); your label was "
                                "recorded, but the quality_reasoning is the fallback's: rewrite it before training on it")
            continue
        # Recorded, it would teach the rules' or the analyst's answer as the model's (meta.backend says "vlm").
        del candidates[module]
        out.skipped.append(f"{module}: the model did not give this answer (fallback: {why}); "
                           + ("pass --level/--answer to label it yourself" if module == "summarize"
                              else "write the right answer into a fixture line by hand"))

    for module, fields in candidates.items():
        line = {"id": f"rec-{key}-{module}", **common, **fields}
        try:
            LINE_MODELS[module].model_validate(line, context=context)
        except ValidationError as exc:
            err = exc.errors()[0]
            out.skipped.append(f"{module}: {'.'.join(map(str, err['loc']))}: {err['msg']}")
            continue
        out.lines[module] = [json.loads(json.dumps(line, default=str))]
    return out


def append_lines(out_dir: str | Path, lines: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
    """Append lines to out_dir/<module>.jsonl, skipping ids already there. Returns lines written per module."""
    from agentic_iqa.redact import redact_data

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = redact_data(lines)  # a trace from an older version, or edited by hand, may hold a key
    written: dict[str, int] = {}
    for module, new in lines.items():
        path = out_dir / FIXTURE_FILES[module]
        existing: set[str] = set()
        if path.exists():
            for raw in path.read_text(encoding="utf-8").splitlines():
                raw = raw.strip()
                if raw and not raw.startswith("#"):
                    try:
                        existing.add(json.loads(raw).get("id"))
                    except (json.JSONDecodeError, AttributeError):
                        continue
        fresh = [line for line in new if line["id"] not in existing]
        if fresh:
            if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
                with path.open("a", encoding="utf-8") as fh:
                    fh.write("\n")  # a hand-edited file may lack its final newline
            with path.open("a", encoding="utf-8") as fh:
                for line in fresh:
                    fh.write(json.dumps(line, ensure_ascii=False) + "\n")
        written[module] = len(fresh)
    return written
