"""`agentic-iqa compile` (tune an agent module against fixtures) and `agentic-iqa fixtures record`.

    agentic-iqa compile --module planner --optimizer bootstrap --lm demo
    agentic-iqa compile --module all --optimizer gepa --lm openai/gpt-4o --reflection-lm openai/gpt-4o
    agentic-iqa fixtures record run.json --out my_fixtures --level B

The work is done by the optimizers package; this module turns options into LMs and datasets,
draws progress and prints the before/after table.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import typer

from agentic_iqa.cli.common import (EXIT_BAD_INPUT, EXIT_FAILED, catch_sigint, fail, flag, folding, refuse_empty, restore_sigint,
                                     stop_now, unexpected)

DEMO = "demo"
DEMO_NOTE = ("demo LM: scripted answers from the fixtures' own labels, right with a probability that rises "
             "with the number of demos (optimizers/demo_lm.py). It shows the workflow; it measures no model.")

fixtures_app = typer.Typer(help="Grow your own fixtures from saved assessments.", no_args_is_help=True)


def compile_command(
    module: str = typer.Option(..., "--module", "-m", help="planner | detect | analyze | select | summarize | all."),
    optimizer: str = typer.Option("bootstrap", "--optimizer", "-O", help="labeled | bootstrap | mipro | gepa."),
    lm: Optional[str] = typer.Option(None, "--lm", help="Model that plays the module, e.g. openai/gpt-4o; 'demo' for the offline demo LM. Default: the configured role's model.", callback=refuse_empty),
    teacher: Optional[str] = typer.Option(None, "--teacher", help="bootstrap/mipro: a (stronger) model that produces the demos; mipro: also proposes instructions.", callback=refuse_empty),
    reflection_lm: Optional[str] = typer.Option(None, "--reflection-lm", help="gepa: the model that reflects on failures and rewrites instructions (default: --teacher, then --lm).", callback=refuse_empty),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="Base URL of an OpenAI-compatible server.",
                                           callback=refuse_empty),
    config: Optional[Path] = typer.Option(None, "--config", help="Folder holding pipeline.yaml / model_backends.yaml."),
    trainset: Optional[Path] = typer.Option(None, "--trainset", help="Fixture JSONL to train on (all its lines). Default: the shipped fixtures' train split."),
    valset: Optional[Path] = typer.Option(None, "--valset", help="Fixture JSONL to validate on (all its lines). Default: the shipped fixtures' val split."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Program file to write (a folder with --module all). Default: programs/<module>.json."),
    max_demos: int = typer.Option(4, "--max-demos", help="Few-shot demos per predictor."),
    budget: str = typer.Option("light", "--budget", help="mipro/gepa search budget: light | medium | heavy."),
    max_metric_calls: Optional[int] = typer.Option(None, "--max-metric-calls", help="gepa: stop after this many metric calls (instead of --budget)."),
    threads: int = typer.Option(1, "--threads", help="Parallel LM calls."),
    seed: int = typer.Option(0, "--seed", help="Seed for the optimizers' sampling."),
    as_json: bool = flag("--json", help="Print a JSON summary instead of the table."),
    verbose: bool = flag("--verbose", "-v", help="Log lines and the optimizers' own output."),
) -> None:
    """Tune an agent module's prompt (demos and/or instructions) on fixtures; report validation scores before and after."""
    # DSPy's optimizers draw tqdm bars of their own; ours replace them (tqdm reads this when first imported).
    os.environ.setdefault("TQDM_DISABLE", "1")
    from agentic_iqa.cli.common import quiet_dspy_logs, setup_logging
    from agentic_iqa.config import ConfigError

    from rich.markup import escape  # messages quote paths and pip extras ("dspy[optuna]"), not markup

    setup_logging(verbose)
    quiet_dspy_logs()
    from agentic_iqa.agents.modules import MODULE_NAMES  # the one table of agent modules

    modules = list(MODULE_NAMES) if module == "all" else [module]
    if module != "all" and module not in MODULE_NAMES:
        fail(f"--module must be one of {', '.join(MODULE_NAMES)} or all (got {module!r})")
    if module == "all" and (trainset or valset):
        fail("--trainset/--valset are per module: use them with one --module, not all")
    if api_base is not None:
        from agentic_iqa.config import checked_base_url

        try:  # a typo fails now, as in assess and eval, not at the first LM call
            checked_base_url(api_base, "--api-base")
        except ConfigError as exc:
            fail(escape(str(exc)), EXIT_BAD_INPUT)
        if lm == DEMO and {teacher, reflection_lm} <= {None, DEMO}:
            from rich.console import Console

            Console(stderr=True, highlight=False).print(
                "[yellow]note:[/] --api-base is not used: the demo LM (--lm demo) sends no requests", soft_wrap=True)
    previous = catch_sigint()
    try:
        results = _compile(modules, optimizer, lm, teacher, reflection_lm, api_base, config, trainset, valset, out,
                           max_demos, budget, max_metric_calls, threads, seed, as_json, verbose)
    except KeyboardInterrupt:
        stop_now("compile stopped; programs already written are kept, the module in progress was not saved")
    except typer.Exit:
        raise
    except ConfigError as exc:
        fail(escape(str(exc)), EXIT_BAD_INPUT)
    except ValueError as exc:  # CompileError, FixtureError, ProgramError: bad options or inputs
        fail(escape(str(exc)), EXIT_BAD_INPUT)
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback
        from agentic_iqa.lm import lm_setup_problem, lm_unreachable

        problem = lm_setup_problem(exc, otherwise="try the flow with the scripted demo LM (--lm demo)")
        if problem is not None:
            fail(escape(problem), EXIT_BAD_INPUT)
        if lm_unreachable(exc):  # the user's setup (a server down, a wrong port, too slow), not our failure
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            fail(escape(f"the LM could not be reached: {type(exc).__name__}: {first}; the module in progress was not "
                        "saved. Check the server (--api-base) and the model (--lm), or try the flow with the scripted "
                        "demo LM (--lm demo)"), EXIT_BAD_INPUT)
        unexpected(exc, "compile failed", EXIT_FAILED)  # AGENTIC_IQA_DEBUG=1 shows the traceback
    finally:
        restore_sigint(previous)
    if as_json:
        from agentic_iqa.redact import redact_data

        typer.echo(json.dumps(redact_data(results), indent=2))


def _build_lm(spec: Optional[str], role: str, api_base: Optional[str], config: Optional[Path], *, proposal: bool = False):
    """A dspy.LM for a model string (or the configured role's model when spec is None)."""
    from agentic_iqa.config import load_settings
    from agentic_iqa.lm import build_lm

    settings = load_settings(config, lm=spec, api_base=api_base)
    role_lm = settings.backends.role(role).model_copy()
    if role_lm.model is None:
        return None
    if proposal:
        # Instruction proposals want variety and room to write (DSPy's advice for reflection LMs).
        role_lm.temperature, role_lm.max_tokens, role_lm.logprobs = 1.0, max(role_lm.max_tokens, 8192), False
    return build_lm(role_lm, role)


def _role_of(module: str) -> str:
    from agentic_iqa.agents.modules import AGENT_MODULES

    return AGENT_MODULES[module].role


def shipped_demo_lm():
    """`--lm demo`: the scripted fixture-echo LM of `optimizers.demo_lm` (NOT a model) over every shipped
    fixture, so compile → assess --program can be tried offline. Unknown images get uninformed answers.
    Only the CLI knows this name; the core builds real LMs only."""
    from optimizers.demo_lm import FixtureEchoEngine, demo_lm
    from agentic_iqa.agents.modules import MODULE_NAMES
    from optimizers.fixtures import default_catalog, load_dataset

    catalog = default_catalog()
    examples = []
    for module in MODULE_NAMES:
        data = load_dataset(module, catalog=catalog)
        examples += data.train + data.val
    return demo_lm([], engine=FixtureEchoEngine(examples, catalog.modes, catalog.strengths))


def lm_or_demo(role, role_name: str = "lm"):
    """`agentic_iqa.lm.build_lm`, except that the model name `demo` gives the shipped demo LM."""
    from agentic_iqa.lm import build_lm

    return shipped_demo_lm() if role.model == DEMO else build_lm(role, role_name)


def _lms(module: str, optimizer: str, lm: Optional[str], teacher: Optional[str], reflection_lm: Optional[str],
         api_base, config, dataset, catalog) -> dict[str, Any]:
    """The task, teacher and proposal LMs for one module (see compile_command's help for the fallbacks)."""
    from optimizers.demo_lm import FixtureEchoEngine, demo_lm

    role = _role_of(module)
    engine: Optional[FixtureEchoEngine] = None

    def make(spec: Optional[str], proposal: bool = False):
        nonlocal engine
        if spec == DEMO:
            # One engine (one index of fixtures) behind every demo LM instance; instances stay
            # distinct so LM calls are counted per role.
            engine = engine or FixtureEchoEngine(dataset.train + dataset.val, catalog.modes, catalog.strengths)
            return demo_lm([], engine=engine)
        return _build_lm(spec, role, api_base, config, proposal=proposal)

    task = make(lm)
    teacher_lm = make(teacher) if teacher else None
    proposal_spec = (reflection_lm or teacher or lm) if optimizer == "gepa" else (teacher or lm)
    proposal = None
    if optimizer in ("mipro", "gepa"):
        proposal = make(proposal_spec, proposal=True) if proposal_spec else (
            _build_lm(None, role, api_base, config, proposal=True) if task is not None else None)
    return {"task": task, "teacher": teacher_lm if optimizer in ("bootstrap", "mipro") else None,
            "proposal": proposal, "demo": DEMO in (lm, teacher, reflection_lm, proposal_spec)}


def _compile(modules, optimizer, lm, teacher, reflection_lm, api_base, config, trainset, valset, out,
             max_demos, budget, max_metric_calls, threads, seed, as_json, verbose) -> list[dict]:
    from rich.console import Console

    from agentic_iqa.programs import check_program_target
    from optimizers.fixtures import default_catalog, load_dataset
    from optimizers.runner import METRIC_NAMES, CompileError, CompileOptions, compile_module, require_optuna

    console = Console(stderr=True, highlight=False)
    options = CompileOptions(optimizer, max_demos=max_demos, budget=budget, max_metric_calls=max_metric_calls,
                             threads=threads, seed=seed)
    catalog = default_catalog()
    if optimizer == "mipro":
        require_optuna()
    from agentic_iqa.config import load_settings

    max_pixels = load_settings(config).pipeline.max_image_pixels  # fixture images go to the model like any other
    rows: list[dict] = []
    plan = []
    for module in modules:  # check everything (fixtures, LMs) before spending any LM call
        dataset = load_dataset(module, trainset, valset, catalog=catalog, max_pixels=max_pixels)
        lms = _lms(module, optimizer, lm, teacher, reflection_lm, api_base, config, dataset, catalog)
        if lms["task"] is None and optimizer != "labeled":
            raise CompileError(
                f"no LM for the {module} module: pass --lm MODEL (or --lm demo for the offline demo LM), or configure "
                f"the {_role_of(module)} role in configs/model_backends.yaml"
                + ("; MIPROv2 and GEPA also need it (or --teacher / --reflection-lm) to propose instructions"
                   if optimizer in ("mipro", "gepa") else "")
            )
        target = check_program_target(_target(module, out, len(modules) > 1))
        plan.append((module, dataset, lms, target))
    if any(lms["demo"] for _, _, lms, _ in plan) and not as_json:
        console.print(f"[yellow]note:[/] {DEMO_NOTE}")
    for module, dataset, lms, target in plan:
        extra = {"demo_lm": DEMO_NOTE} if lms["demo"] else {}
        with _RichProgress(console, module, enabled=not as_json) as progress:
            result = compile_module(module, dataset, lm=lms["task"], options=options, catalog=catalog,
                                    proposal_lm=lms["proposal"], teacher_lm=lms["teacher"], progress=progress,
                                    extra_header=extra)
        saved = result.save(target)
        if verbose and result.log.strip():  # the optimizers' chatter quotes the model's answers
            from rich.markup import escape

            from agentic_iqa.redact import redact

            console.print(f"[dim]{escape(redact(result.log.strip()))}[/]")
        rows.append({
            "module": module, "optimizer": optimizer, "lm": result.header["lm"], "metric": METRIC_NAMES[module],
            "val_examples": len(dataset.val), "train_examples": len(dataset.train),
            "before": round(result.before.mean, 4) if result.before else None,
            "after": round(result.after.mean, 4) if result.after else None,
            "delta": round(result.delta, 4) if result.delta is not None else None,
            "failures_before": result.before.failures if result.before else None,
            "failures_after": result.after.failures if result.after else None,
            "lm_calls": result.lm_calls, "demos": result.header["demos"],
            "instructions_changed": result.header["instructions_changed"],
            "seconds": round(result.seconds, 2), "program": str(saved),
        })
    if not as_json:
        _print_table(rows)
    return rows


def _target(module: str, out: Optional[Path], many: bool) -> Path:
    if out is None:
        return Path("programs") / f"{module}.json"
    if many or out.is_dir() or out.suffix == "":
        return out / f"{module}.json"
    return out


def _print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    table = Table(title="validation score before/after compiling (0-1, higher is better)")
    for col in ("module", "val", "before", "after", "Δ", "LM calls", "program"):
        table.add_column(col, no_wrap=col in ("module", "Δ"))
    for r in rows:
        fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
        colour = "green" if (r["delta"] or 0) > 0 else "red" if (r["delta"] or 0) < 0 else "white"
        delta = "–" if r["delta"] is None else f"[{colour}]{r['delta']:+.3f}[/]"
        table.add_row(r["module"], str(r["val_examples"]), fmt(r["before"]), fmt(r["after"]), delta,
                      str(r["lm_calls"].get("total", 0)), r["program"])
    con.print(folding(table))
    for r in rows:
        calls = r["lm_calls"]
        evals = sum(calls.get(p, {}).get("task", 0) for p in ("evaluate_before", "evaluate_after"))
        spent = ", ".join(f"{n} {role}" for role, n in sorted(calls.get("compile", {}).items())) or "none"
        demos = ", ".join(f"{n} in {name}" for name, n in r["demos"].items())
        instr = "rewritten" if r["instructions_changed"] else "as shipped"
        con.print(f"[dim]{r['module']} ({r['optimizer']}): demos {demos}; instructions {instr}; LM calls: "
                  f"{evals} scoring, compile {spent}; metric {r['metric']}[/]")
    for r in rows:
        if r.get("failures_before") or r.get("failures_after"):
            n = r["val_examples"]
            con.print(f"[yellow]note:[/] {r['module']}: {r['failures_before'] or 0} of {n} validation answers before "
                      f"compiling and {r['failures_after'] or 0} of {n} after were unusable (every try rejected: no "
                      "valid reply) and scored 0; if that is most of them, the scores measure the connection or the "
                      "reply format, not the model: check it with agentic-iqa assess IMAGE --lm MODEL --verbose")
    if any(r["before"] is None for r in rows):
        con.print("[yellow]note:[/] no LM was configured, so nothing was scored; the labelled demos were saved anyway")


class _RichProgress:
    """Progress bars for the runner's phases, with a live count of LM calls."""

    LABELS = {"evaluate_before": "score before", "compile": "compile", "evaluate_after": "score after"}

    def __init__(self, console, module: str, enabled: bool = True):
        self.console, self.module, self.enabled = console, module, enabled
        self.calls = 0
        self.phase_start = 0
        self.tasks: dict[str, Any] = {}
        self.progress = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("[dim]{task.fields[calls]} LM calls"),
                                     console=self.console, transient=False)
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self._finish_open_tasks()
            self.progress.stop()

    def _finish_open_tasks(self) -> None:
        # An optimizer may stop early (BootstrapFewShot once it has enough demos): show the phase as done.
        for task_id in self.tasks.values():
            task = self.progress._tasks[task_id]
            self.progress.update(task_id, total=task.completed)

    def phase(self, name: str, total: Optional[int]) -> None:
        if self.progress is not None and name not in self.tasks:
            self._finish_open_tasks()
            label = f"{self.module}: {self.LABELS.get(name, name)}"
            self.phase_start = self.calls
            self.tasks[name] = self.progress.add_task(label, total=total, calls=0)

    def advance(self, name: str, n: int = 1) -> None:
        if self.progress is not None and name in self.tasks:
            self.progress.update(self.tasks[name], advance=n)

    def lm_call(self) -> None:
        self.calls += 1  # LM calls of the current phase are shown on its bar
        if self.progress is not None and self.tasks:
            last = list(self.tasks.values())[-1]
            self.progress.update(last, calls=self.calls - self.phase_start)


@fixtures_app.command("record")
def record_command(
    traces: list[Path] = typer.Argument(..., help="Saved assessments (assess --save-trace FILE)."),
    out: Path = typer.Option(Path("fixtures"), "--out", "-o", help="Fixture folder: lines are appended to <module>.jsonl there."),
    module: list[str] = typer.Option([], "--module", "-m", help="Only these modules (repeatable). Default: every module the trace has data for."),
    split: str = typer.Option("train", "--split", help="train | val."),
    level: Optional[str] = typer.Option(None, "--level", help="The right quality level A-E (score mode); default: the pipeline's level."),
    answer: Optional[str] = typer.Option(None, "--answer", help="The right answer (question mode); default: the pipeline's answer."),
    copy_images: bool = flag("--copy-images/--no-copy-images", default=True, help="Copy images into <out>/images (default) or refer to them where they are."),
) -> None:
    """Turn saved assessments into fixture lines, to review and then compile with (--trainset/--valset)."""
    from rich.console import Console

    from optimizers.fixtures import FIXTURE_FILES
    from optimizers.record import RecordError, append_lines, lines_from_trace

    con = Console()
    modules = module or list(FIXTURE_FILES)
    totals: dict[str, int] = {}
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file, not a folder: fixture lines go to <folder>/<module>.jsonl (and images to "
             "<folder>/images); give a folder", EXIT_BAD_INPUT)
    try:
        for trace in traces:
            rec = lines_from_trace(trace, out, modules=modules, split=split, level=level, answer=answer,
                                   copy_images=copy_images)
            written = append_lines(out, rec.lines)
            for m, n in written.items():
                totals[m] = totals.get(m, 0) + n
            for w in rec.warnings:
                con.print(f"[yellow]warning:[/] {trace.name}: {w}")
            for s in rec.skipped:
                con.print(f"[dim]{trace.name}: skipped {s}[/]")
    except RecordError as exc:
        from rich.markup import escape

        fail(escape(str(exc)), EXIT_BAD_INPUT)
    except OSError as exc:  # the folder cannot be written (read-only, full disk, …): one line, no traceback
        from rich.markup import escape

        fail(escape(f"cannot write fixtures to {out}: {exc.strerror or exc} ({exc.filename})"), EXIT_FAILED)
    if not any(totals.values()):
        con.print("nothing new recorded (lines with these ids are already there, or the traces hold nothing usable)")
        return
    for m, n in totals.items():
        if n:
            con.print(f"{m}: {n} line(s) → {out / FIXTURE_FILES[m]}")
    con.print(f"[dim]Review the labels (label_source says which are the pipeline's own answers), then: "
              f"agentic-iqa compile --module <module> --trainset {out}/<module>.jsonl[/]")
