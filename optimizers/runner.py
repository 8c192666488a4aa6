"""Compile one agent module against its fixtures: evaluate, optimize, evaluate again, save.

    result = compile_module("planner", load_dataset("planner"), lm=lm, options=CompileOptions("bootstrap"))
    result.before.mean, result.after.mean, result.delta
    result.save("programs/planner.json")

Each part (predictor) of the module is optimized on its own training examples (see
optimizers.tasks), then the parts are put back into a fresh agent module, evaluated on the
validation examples and saved as DSPy JSON with a header (agentic_iqa.programs).

What each optimizer does here, and what it needs:

- labeled:   LabeledFewShot — k labelled fixtures become the demos. No LM needed to compile.
- bootstrap: BootstrapFewShot — the module (with labelled demos, optionally on a --teacher LM)
             answers the training inputs; answers the metric grades fully correct become the demos.
- mipro:     MIPROv2 — bootstraps demo sets, has a proposal LM write instruction candidates, and
             searches combinations (Optuna) on half of the training fixtures. Needs `optuna`.
- gepa:      GEPA — a reflection LM reads the metric's feedback on failures and rewrites the
             instructions; candidates are kept on a Pareto front over the training fixtures.

MIPROv2 and GEPA choose among candidates using training fixtures only, so the validation score
after compiling is measured on examples no optimizer has seen.
"""
from __future__ import annotations

import contextvars
import io
import contextlib
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

import dspy
from dspy.utils.callback import BaseCallback

from agentic_iqa.agents.modules import AGENT_MODULES
from optimizers.fixtures import Dataset, ToolCatalog
from optimizers.metrics import Grade, ModuleMetric, grade
from optimizers.tasks import PartProgram, assemble, clean_demos, demo_counts, instructions, part_programs

OPTIMIZERS = ("labeled", "bootstrap", "mipro", "gepa")
BUDGETS = ("light", "medium", "heavy")
#: What the metric of each module measures (recorded in program headers and shown by the CLI).
METRIC_NAMES = {name: spec.metric for name, spec in AGENT_MODULES.items()}
#: A bootstrapped demo must be graded (almost) fully correct: demos teach, so a half-right one teaches mistakes.
DEMO_THRESHOLD = 0.999


class CompileError(ValueError):
    """The compile run cannot start (missing LM, missing optional package, no examples)."""


class ProgressSink(Protocol):
    """What the runner reports while it works (the CLI draws progress bars from it)."""

    def phase(self, name: str, total: Optional[int]) -> None: ...

    def advance(self, name: str, n: int = 1) -> None: ...

    def lm_call(self) -> None: ...


class _NoProgress:
    def phase(self, name, total):
        pass

    def advance(self, name, n=1):
        pass

    def lm_call(self):
        pass


@dataclass
class CompileOptions:
    optimizer: str
    max_demos: int = 4             # demos per predictor (labeled k; bootstrap/MIPRO max demos)
    budget: str = "light"          # MIPROv2 / GEPA auto budget
    max_metric_calls: Optional[int] = None  # GEPA: exact budget instead of `budget`
    threads: int = 1               # parallel LM calls during evaluation and optimization
    seed: int = 0
    max_retries: int = 3           # as the pipeline: re-asks after a rejected reply

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise CompileError(f"unknown optimizer {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if self.budget not in BUDGETS:
            raise CompileError(f"unknown budget {self.budget!r}; use one of {', '.join(BUDGETS)}")
        if self.max_demos < 0:
            raise CompileError("max_demos must be >= 0")
        if self.threads < 1:
            raise CompileError("threads must be >= 1")

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_demos": self.max_demos, "seed": self.seed, "max_retries": self.max_retries}
        if self.optimizer in ("mipro", "gepa"):
            out["budget"] = self.budget if self.max_metric_calls is None else None
        if self.optimizer == "gepa" and self.max_metric_calls is not None:
            out["max_metric_calls"] = self.max_metric_calls
        if self.optimizer == "bootstrap":
            out["demo_threshold"] = DEMO_THRESHOLD
        return out


class LMCallCounter(BaseCallback):
    """Counts LM calls by phase (evaluate_before, compile, evaluate_after) and by which LM made them."""

    def __init__(self, roles: dict[int, str], progress: ProgressSink):
        self.roles = roles
        self.progress = progress
        self.phase = "setup"
        self.counts: Counter = Counter()
        self._lock = threading.Lock()

    def on_lm_start(self, call_id, instance, inputs):
        role = self.roles.get(id(instance), "task")  # copies the optimizers make of the task LM are task calls
        with self._lock:
            self.counts[(self.phase, role)] += 1
        self.progress.lm_call()

    def by_phase(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for (phase, role), n in sorted(self.counts.items()):
            out.setdefault(phase, {})[role] = n
        out["total"] = sum(self.counts.values())
        return out


@dataclass
class Evaluation:
    """Scores of one module on the validation examples."""

    scores: dict[str, float]
    feedback: dict[str, str]
    failures: int  # examples where every attempt was rejected

    @property
    def mean(self) -> float:
        return sum(self.scores.values()) / len(self.scores) if self.scores else 0.0

    def describe(self) -> dict[str, Any]:
        return {"mean": round(self.mean, 4), "n": len(self.scores), "failures": self.failures}


def evaluate(
    parts: dict[str, PartProgram],
    examples: list,
    *,
    tool_modes: dict[str, str],
    threads: int = 1,
    progress: ProgressSink = _NoProgress(),
    phase: str = "evaluate",
) -> Evaluation:
    """Run each example through its part and grade it. The LM comes from the caller's dspy.context."""
    progress.phase(phase, len(examples))
    scores: dict[str, float] = {}
    feedback: dict[str, str] = {}
    failures = 0
    lock = threading.Lock()

    def one(example) -> None:
        nonlocal failures
        pred = parts[example.part](**example.inputs())
        result: Grade = grade(example, pred, tool_modes)
        with lock:
            scores[example.fixture_id] = result.score
            feedback[example.fixture_id] = result.feedback
            failures += bool(getattr(pred, "failed", False))
        progress.advance(phase)

    if threads <= 1:
        for example in examples:
            one(example)
    else:
        # Each worker runs in a copy of this context, so dspy.context(lm=..., callbacks=...) applies there too.
        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, ex) for ex in examples]
            for f in futures:
                f.result()
    return Evaluation(scores, feedback, failures)


@dataclass
class CompileResult:
    module: str
    optimizer: str
    program: dspy.Module
    before: Optional[Evaluation]
    after: Optional[Evaluation]
    lm_calls: dict[str, Any]
    seconds: float
    header: dict[str, Any] = field(default_factory=dict)
    log: str = ""  # what the DSPy optimizers printed

    @property
    def delta(self) -> Optional[float]:
        if self.before is None or self.after is None:
            return None
        return self.after.mean - self.before.mean

    def save(self, path: str | Path) -> Path:
        from agentic_iqa.programs import save_program

        return save_program(self.program, self.module, path, **self.header)


def _lm_name(lm: Any) -> Optional[str]:
    return getattr(lm, "model", None) if lm is not None else None


def require_optuna() -> None:
    """Raise CompileError unless optuna (MIPROv2's search library) is importable."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise CompileError(
            "the mipro optimizer (MIPROv2) needs the optional package optuna: pip install 'dspy[optuna]' "
            "(or use --optimizer gepa, which needs nothing extra)"
        ) from None


def _optimize(
    program: PartProgram,
    train: list,
    options: CompileOptions,
    metric: ModuleMetric,
    *,
    proposal_lm: Any,
    teacher_lm: Any,
) -> PartProgram:
    opt = options.optimizer
    if opt == "labeled":
        return dspy.LabeledFewShot(k=options.max_demos).compile(program, trainset=train)
    if opt == "bootstrap":
        return dspy.BootstrapFewShot(
            metric=metric,
            metric_threshold=DEMO_THRESHOLD,
            max_bootstrapped_demos=options.max_demos,
            max_labeled_demos=options.max_demos,
            teacher_settings={"lm": teacher_lm} if teacher_lm is not None else None,
        ).compile(program, trainset=train)
    if opt == "mipro":
        require_optuna()
        if len(train) < 4:
            raise CompileError(f"MIPROv2 needs at least 4 training examples per predictor, got {len(train)}")
        # MIPROv2 searches on its own validation split: half the training fixtures, never the real valset.
        half = len(train) // 2
        search_train, search_val = train[:half], train[half:]
        mipro = dspy.MIPROv2(
            metric=metric,
            prompt_model=proposal_lm,
            task_model=dspy.settings.lm,
            teacher_settings={"lm": teacher_lm} if teacher_lm is not None else None,
            max_bootstrapped_demos=options.max_demos,
            max_labeled_demos=options.max_demos,
            auto=options.budget,
            num_threads=options.threads,
            seed=options.seed,
            verbose=False,
            track_stats=False,
        )
        minibatch = len(search_val) > 35
        return mipro.compile(program, trainset=search_train, valset=search_val, minibatch=minibatch)
    if opt == "gepa":
        budget = {"max_metric_calls": options.max_metric_calls} if options.max_metric_calls else {"auto": options.budget}
        gepa = dspy.GEPA(
            metric=metric,
            reflection_lm=proposal_lm,
            num_threads=options.threads,
            seed=options.seed,
            track_stats=False,
            **budget,
        )
        return gepa.compile(program, trainset=train)
    raise CompileError(f"unknown optimizer {opt!r}")


def compile_module(
    module: str,
    dataset: Dataset,
    *,
    lm: Any,
    options: CompileOptions,
    catalog: ToolCatalog,
    proposal_lm: Any = None,
    teacher_lm: Any = None,
    progress: Optional[ProgressSink] = None,
    extra_header: Optional[dict[str, Any]] = None,
) -> CompileResult:
    """Evaluate `module` on `dataset.val`, compile it on `dataset.train`, evaluate again.

    `lm` answers as the module (None is allowed only for `labeled`, which then skips evaluation);
    `proposal_lm` writes instructions for mipro/gepa; `teacher_lm` (optional) produces the demos
    for bootstrap/mipro. Raises CompileError when a required LM or package is missing.
    """
    progress = progress or _NoProgress()
    opt = options.optimizer
    if lm is None and opt != "labeled":
        raise CompileError(f"the {opt} optimizer runs the module, so it needs an LM: pass --lm MODEL "
                           "(or --lm demo for the offline demo LM)")
    if opt in ("mipro", "gepa") and proposal_lm is None:
        what = "MIPROv2 asks an LM to propose instructions" if opt == "mipro" else "GEPA asks a reflection LM to rewrite instructions"
        flag = "--teacher" if opt == "mipro" else "--reflection-lm"
        raise CompileError(f"{what}, and none is configured: pass --lm MODEL or {flag} MODEL")
    if opt == "mipro":
        require_optuna()

    t0 = time.perf_counter()
    parts = part_programs(module, catalog, options.max_retries)
    tool_modes = catalog.modes
    roles = {id(x): role for role, x in (("teacher", teacher_lm), ("proposal", proposal_lm), ("task", lm)) if x is not None}
    counter = LMCallCounter(roles, progress)
    metric = ModuleMetric(tool_modes, on_call=lambda score: progress.advance("compile"))
    log = io.StringIO()
    before = after = None
    with dspy.context(lm=lm, callbacks=[counter]):
        if lm is not None:
            counter.phase = "evaluate_before"
            before = evaluate(parts, dataset.val, tool_modes=tool_modes, threads=options.threads,
                              progress=progress, phase="evaluate_before")
        counter.phase = "compile"
        progress.phase("compile", _expected_metric_calls(options, dataset, parts))
        compiled: dict[str, PartProgram] = {}
        for part, program in parts.items():
            train = [ex for ex in dataset.train if ex.part == part]
            if not train:
                compiled[part] = program  # nothing to learn from: the part stays as it is
                continue
            # The DSPy optimizers print their own chatter; it is kept for --verbose instead of
            # interleaving with the progress display.
            with contextlib.redirect_stdout(log):
                compiled[part] = _optimize(program, train, options, metric, proposal_lm=proposal_lm, teacher_lm=teacher_lm)
            clean_demos(compiled[part], train)
        if lm is not None:
            counter.phase = "evaluate_after"
            after = evaluate(compiled, dataset.val, tool_modes=tool_modes, threads=options.threads,
                             progress=progress, phase="evaluate_after")
    program = assemble(module, compiled, options.max_retries)
    base = assemble(module, parts, options.max_retries)
    changed = sorted(k for k, v in instructions(program).items() if instructions(base)[k] != v)
    result = CompileResult(module, opt, program, before, after, counter.by_phase(), time.perf_counter() - t0, log=log.getvalue())
    result.header = {
        "optimizer": opt,
        "optimizer_settings": options.describe(),
        "lm": _lm_name(lm),
        "teacher_lm": _lm_name(teacher_lm),
        "proposal_lm": _lm_name(proposal_lm),
        "metric": METRIC_NAMES[module],
        "fixtures": dataset.describe(),
        "scores": {
            "before": before.describe() if before else None,
            "after": after.describe() if after else None,
            "delta": round(result.delta, 4) if result.delta is not None else None,
        },
        "lm_calls": result.lm_calls,
        "demos": demo_counts(program),
        "instructions_changed": changed,
        "dspy_version": dspy.__version__,
        "seconds": round(result.seconds, 2),
        **(extra_header or {}),
    }
    return result


def _expected_metric_calls(options: CompileOptions, dataset: Dataset, parts: dict) -> Optional[int]:
    """How many metric calls the optimizer will make, when that is known in advance (progress total)."""
    n = len(dataset.train)
    if options.optimizer == "labeled":
        return 0
    if options.optimizer == "bootstrap":
        return n  # at most one per training example (it stops once it has enough demos)
    if options.optimizer == "gepa" and options.max_metric_calls:
        return options.max_metric_calls * sum(1 for p in parts if any(ex.part == p for ex in dataset.train))
    return None
