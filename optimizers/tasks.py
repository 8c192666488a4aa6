"""What an optimizer actually compiles: one part (predictor) of an agent module, wrapped so that it
runs exactly as in the pipeline.

Each agent module (agentic_iqa.agents.vlm) holds one StructuredPredict per signature; the Summarizer
holds two. A `PartProgram` wraps one of them and, per call, passes the facts the pipeline's
validators check (the known tools, which tools may be used, the distortion set being analysed), so a
reply the pipeline would reject and retry is rejected and retried here too. Compiling per part keeps
each predictor's demos to its own kind of example. `assemble()` puts the compiled parts back into a
fresh agent module, which is what a program file stores and `assess --program` loads.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import dspy

from agentic_iqa.agents.modules import AgentModule, Facts
from agentic_iqa.agents.structured import StructuredPredict
from optimizers.examples import BOOKKEEPING, MODULE_PARTS
from optimizers.fixtures import ToolCatalog

#: Input fields left out of saved demos. The planner decides from the query text, and a demo image
#: would cost a VLM a whole image per demo for nothing; the tool list is already in the real input.
DEMO_DROPPED_INPUTS: dict[str, tuple[str, ...]] = {"plan": ("image", "available_tools")}


def new_module(module: str, max_retries: int = 3) -> dspy.Module:
    """A fresh, uncompiled agent module of the kind the pipeline uses."""
    return AgentModule(module, max_retries)


def facts_for(part: str, inputs: dict[str, Any], catalog: ToolCatalog) -> Facts:
    """What the part's validator checks a reply against, as VLMRoles gives it in the pipeline."""
    if part == "plan":
        return Facts(known_tools=list(inputs.get("available_tools") or catalog.names))
    if part == "analyze":
        return Facts(distortion_set=inputs.get("distortion_set"))
    if part == "select":
        full_reference = inputs.get("reference_mode") == "Full-Reference"
        return Facts(allowed_tools={
            name: "" if full_reference or mode == "NR" else "it is a full-reference tool and no reference image was given"
            for name, mode in catalog.modes.items()
        })
    return Facts()


class PartProgram(dspy.Module):
    """One compilable part: `step` is the agent module's StructuredPredict for signature `part`.

    Returns the accepted prediction, or `Prediction(failed=True, errors=…)` when every attempt was
    rejected — never raises for a model mistake, so one bad reply cannot abort an optimizer run.
    """

    def __init__(self, part: str, step: StructuredPredict, catalog: ToolCatalog):
        super().__init__()
        self.part = part
        self.step = step
        self.catalog = catalog

    def forward(self, **inputs: Any) -> dspy.Prediction:
        trace = dspy.settings.trace
        start = len(trace) if trace is not None else 0
        result = self.step(facts=facts_for(self.part, inputs, self.catalog), **inputs)
        if trace is not None:
            _drop_rejected(trace, start, result.prediction)
        if result.ok:
            return result.prediction
        return dspy.Prediction(failed=True, errors=list(result.errors), attempts=result.attempts)


def _drop_rejected(trace: list, start: int, accepted: Optional[dspy.Prediction]) -> None:
    """Remove trace entries of replies our validators rejected.

    DSPy records every successful parse in the trace, including replies our validators then
    rejected (an unknown tool, an analysis of the wrong types). BootstrapFewShot turns trace entries
    into demos, so a rejected reply would be taught as an example; only the accepted one stays.
    """
    added = trace[start:]
    keep = [entry for entry in added if entry[2] is accepted]
    del trace[start:]
    trace.extend(keep)


def part_programs(module: str, catalog: ToolCatalog, max_retries: int = 3, source: Optional[dspy.Module] = None) -> dict[str, PartProgram]:
    """The parts of `module` (from `source`, or from a fresh module) as programs to compile."""
    full = source if source is not None else new_module(module, max_retries)
    return {part: PartProgram(part, getattr(full, attr), catalog) for part, attr in MODULE_PARTS[module].items()}


def clean_demos(program: PartProgram, train: Iterable[Any] = ()) -> int:
    """Keep demos that are complete examples of this part, holding only what a prompt should show.

    LabeledFewShot and BootstrapFewShot copy whole examples into the demos; a saved program should
    hold signature fields (minus DEMO_DROPPED_INPUTS) and the fixture id for provenance. A
    bootstrapped demo (the module's own answer to a training input) gets the id of the training
    example with the same inputs. Returns the number of demos kept.
    """
    predictor = program.step.predict
    signature = predictor.signature
    inputs = list(signature.input_fields)
    by_inputs = [(tuple(ex.get(k) for k in inputs), ex.get("fixture_id")) for ex in train]
    dropped = set(DEMO_DROPPED_INPUTS.get(program.part, ()))
    keep_keys = (set(signature.fields) - dropped) | {"augmented", *BOOKKEEPING}
    cleaned = []
    for demo in predictor.demos:
        data = dict(demo.items()) if hasattr(demo, "items") else dict(demo)
        if not all(k in data for k in signature.output_fields):
            continue
        if "fixture_id" not in data:
            key = tuple(data.get(k) for k in inputs)
            data["fixture_id"] = next((fid for values, fid in by_inputs if values == key), None)
        # A signature field may legitimately be None (replan_reason); an unmatched fixture id is just left out.
        cleaned.append(dspy.Example(**{k: v for k, v in data.items()
                                       if k in keep_keys and (v is not None or k in signature.fields)}))
    predictor.demos = cleaned
    return len(cleaned)


def assemble(module: str, parts: dict[str, PartProgram], max_retries: int = 3) -> dspy.Module:
    """A fresh agent module carrying the compiled state (instructions, demos) of each part."""
    full = new_module(module, max_retries)
    for part, attr in MODULE_PARTS[module].items():
        getattr(full, attr).load_state(parts[part].step.dump_state())
    return full


def instructions(module_obj: dspy.Module) -> dict[str, str]:
    """Each predictor's instructions, by predictor name (what an instruction optimizer changes)."""
    return {name: p.signature.instructions for name, p in module_obj.named_predictors()}


def demo_counts(module_obj: dspy.Module) -> dict[str, int]:
    return {name: len(p.demos) for name, p in module_obj.named_predictors()}
