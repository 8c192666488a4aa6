"""`agentic-iqa bench make` (synthetic KADID-style benchmark), `agentic-iqa bench convert` (a public data set's
scores into a manifest) and `agentic-iqa eval MANIFEST`."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from agentic_iqa.cli.progress import LineProgress
from agentic_iqa.cli.common import (EXIT_BAD_INPUT, EXIT_PARTIAL, catch_sigint, fail, flag, folding, note_unused_api_base, quiet_dspy_logs, refuse_empty,
                                     restore_sigint, setup_logging, stop_now, with_tool_options, ALLOW_ABSOLUTE_HELP, DEVICE_HELP, NO_PROGRESS_HELP,
                                     TOOLS_FILE, WEIGHTS_DIR)

app = typer.Typer(help="Make the synthetic benchmark, or a manifest for a public data set.", no_args_is_help=True,
                  add_completion=False)


@app.command("make")
def make_command(
    out: Path = typer.Argument(..., help="Folder to write the images and manifest.jsonl into."),
    seed: int = typer.Option(0, "--seed", help="Same seed → byte-identical benchmark."),
    refs: Optional[list[str]] = typer.Option(None, "--ref", help="Reference image names (repeatable; default: all)."),
    types: Optional[list[str]] = typer.Option(None, "--type", help="Distortion types (repeatable; default: all)."),
    no_mcq: bool = flag("--no-mcq", help="Do not add multiple-choice question rows."),
) -> None:
    """Generate the KADID-style synthetic benchmark from scikit-image's sample photos (offline, deterministic)."""
    from rich.console import Console

    from agentic_iqa.bench.synth import REFERENCES, TYPES, make_benchmark
    from rich.markup import escape

    # Checked here, not in synth.py: that file's bytes key the accuracy corpus' statistics cache.
    problems = [_unknown(what, [n for n in names or () if n not in valid], valid)
                for what, names, valid in (("distortion type", types, TYPES), ("reference", refs, REFERENCES))]
    if any(problems):
        fail(escape("; ".join(p for p in problems if p)), EXIT_BAD_INPUT)  # repeats the user's names, brackets included
    if out.exists() and not out.is_dir():
        fail(escape(f"{out} is a file, not a folder: the benchmark is a folder of images and manifest.jsonl; "
                    "give a folder name"), EXIT_BAD_INPUT)
    try:
        with Console(stderr=True).status("generating…"):
            manifest = make_benchmark(out, seed=seed, refs=refs or None, types=types or None, mcq=not no_mcq)
    except (ValueError, OSError) as exc:
        fail(escape(str(exc)), EXIT_BAD_INPUT)
    n = sum(1 for _ in manifest.open())
    typer.echo(f"wrote {n} rows to {manifest}")


CONVERTERS = {  # data set -> (what to pass, converter name in agentic_iqa.bench.manifest)
    "clive": ("the ChallengeDB_release folder (LIVE In the Wild: Images/ and Data/)", "clive_to_manifest"),
    "kadid": ("KADID-10k's dmos.csv (its images in images/ beside it)", "kadid_to_manifest"),
}


@app.command("convert")
def convert_command(
    dataset: str = typer.Argument(..., help="clive (LIVE In the Wild, human MOS) or kadid (KADID-10k, DMOS)."),
    source: Path = typer.Argument(..., help="clive: the ChallengeDB_release folder; kadid: its dmos.csv."),
    out: Optional[Path] = typer.Option(None, "--out", help="Manifest to write (default: manifest.jsonl beside the data)."),
) -> None:
    """Write a manifest for a data set you downloaded, for `agentic-iqa eval` (its MOS correlations)."""
    from rich.markup import escape

    from agentic_iqa.bench import manifest as mf

    if dataset not in CONVERTERS:
        fail(escape(_unknown("data set", [dataset], CONVERTERS)), EXIT_BAD_INPUT)
    what, converter = CONVERTERS[dataset]
    if not source.exists():
        fail(escape(f"{source}: not found; pass {what}"), EXIT_BAD_INPUT)
    try:
        path = getattr(mf, converter)(source, out)
    except (ValueError, OSError) as exc:  # e.g. a binary file as the CSV: name it
        message = str(exc) if str(source) in str(exc) else f"{source}: {exc}"
        fail(escape(message), EXIT_BAD_INPUT)
    n = sum(1 for _ in path.open(encoding="utf-8"))
    # eval keeps a manifest's paths inside its folder: a manifest written elsewhere (--out) needs the option
    data = source.resolve() if source.is_dir() else source.resolve().parent
    outside = " --allow-absolute" if not data.is_relative_to(path.parent.resolve()) else ""
    typer.echo(f"wrote {n} rows to {path}; next: agentic-iqa eval --offline --mode nr{outside} {path}")


def _unknown(what: str, unknown: list[str], valid) -> str:
    """One clause naming the unknown names (with a close match, e.g. 'gaussian_blur' → 'gaussian blur')
    and every valid one; '' when all are known."""
    import difflib

    if not unknown:
        return ""
    guesses = [g for u in unknown for g in difflib.get_close_matches(u.replace("_", " "), list(valid), n=1, cutoff=0.6)]
    hint = f" (did you mean {', '.join(repr(g) for g in guesses)}?)" if guesses else ""
    return (f"unknown {what} {', '.join(repr(u) for u in unknown)}{hint}; valid {what}s: "
            f"{', '.join(repr(v) for v in valid)}")


def eval_command(
    manifest: Path = typer.Argument(..., help="JSONL manifest (see `agentic_iqa.bench.manifest`)."),
    mode: str = typer.Option("both", "--mode", help="nr | fr | both: assess without and/or with the reference."),
    split: str = typer.Option("test", "--split", help="test | train | all rows of the manifest."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N rows (after the split filter)."),
    lm: Optional[str] = typer.Option(None, "--lm", help="DSPy model string; default: the configured LM, else offline.",
                                     callback=refuse_empty),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="Base URL of an OpenAI-compatible server.",
                                           callback=refuse_empty),
    config: Optional[Path] = typer.Option(None, "--config", help="Folder holding pipeline.yaml / model_backends.yaml."),
    device: Optional[str] = typer.Option(None, "--device", help=DEVICE_HELP),
    weights_dir: Optional[Path] = WEIGHTS_DIR,
    tools_file: Optional[list[Path]] = TOOLS_FILE,
    offline: bool = flag("--offline", help="Use the offline analyst."),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Items assessed at once (useful with a remote LM)."),
    as_json: bool = flag("--json", help="Print the report as JSON."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of score vs level per type."),
    verbose: bool = flag("--verbose", "-v", help="Show log lines (INFO and above) while evaluating."),
    no_progress: bool = flag("--no-progress", help=NO_PROGRESS_HELP + ")."),
    allow_absolute: bool = flag("--allow-absolute", help=ALLOW_ABSOLUTE_HELP),
) -> None:
    """Assess every manifest row and report SRCC/KRCC/PLCC, intra-group SRCC, detection and MCQ accuracy."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from agentic_iqa.api import Assessor
    from agentic_iqa.bench import evaluate as ev
    from agentic_iqa.config import ConfigError, load_settings

    setup_logging(verbose)
    if mode not in {"nr", "fr", "both"} or split not in {"test", "train", "all"}:
        fail("--mode must be nr, fr or both; --split test, train or all")
    if not os.path.lexists(manifest):
        fail(f"manifest {manifest} does not exist (make one with `agentic-iqa bench make DIR`)")
    try:
        settings = load_settings(config, lm=lm, api_base=api_base, backend="offline" if offline else None)
        note_unused_api_base(settings, api_base)
        if settings.uses_model:
            quiet_dspy_logs()
        assessor = Assessor(with_tool_options(settings, device, weights_dir, tools_file))
    except ConfigError as exc:
        from rich.markup import escape

        fail(escape(str(exc)))  # a YAML error quotes the file's text ('[', ']')
    modes = ["nr", "fr"] if mode == "both" else [mode]
    console = Console(stderr=True)
    # On a terminal a live bar; otherwise (a log file, CI) a plain line per N items or per few seconds.
    quiet = as_json or no_progress
    lines = None if (quiet or console.is_terminal) else LineProgress("eval")
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=console, disable=quiet or lines is not None) as progress:
        task = progress.add_task("assessing", total=None)

        def on_item(item) -> None:
            progress.advance(task)
            if lines:
                lines.advance(failed=item.error is not None)

        def on_start(n: int) -> None:
            progress.update(task, total=n)
            if lines:
                lines.start(n)

        previous = catch_sigint()
        try:
            report, items, problems = ev.evaluate(
                manifest, assessor, modes=modes, split=split, limit=limit, concurrency=concurrency,
                on_item=on_item, on_start=on_start, allow_outside=allow_absolute)
        except KeyboardInterrupt:
            progress.stop()
            stop_now("eval stopped; no report (run it again, or with --limit N for a part)")
        except ValueError as exc:  # the manifest itself cannot be read (rows' problems are reported, not raised)
            progress.stop()
            from rich.markup import escape

            fail(escape(str(exc)))
        finally:
            restore_sigint(previous)
    if lines:
        lines.finish()
    report["backend"] = assessor.roles.name
    if plot_path:
        ev.plot(items, plot_path)
        report["plot"] = str(plot_path)
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        render(report, console=Console())
    for p in problems:
        Console(stderr=True).print(f"[yellow]skipped manifest {p}[/]")
    # Exit 3: some rows were skipped (unusable manifest rows) or failed; unscored questions are neither.
    if problems or report["errors"]:
        raise typer.Exit(EXIT_PARTIAL)


def render(report: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    from agentic_iqa.bench.evaluate import fmt

    for mode in ("nr", "fr"):
        part = report.get(mode)
        if not part:
            continue
        t = Table(title=f"{mode.upper()} mode — {part['items']} items ({part['failed']} failed), {report['backend']}")
        for c in ("metric", "n", "SRCC", "KRCC", "PLCC"):
            t.add_column(c)
        if "vs_level" in part:
            c = part["vs_level"]
            t.add_row("score vs −level (all)", str(c["n"]), fmt(c["srcc"]), fmt(c["krcc"]), fmt(c["plcc"]))
            for typ, c in sorted(part["vs_level_per_type"].items(), key=lambda kv: str(kv[0])):
                t.add_row(f"  {typ}", str(c["n"]), fmt(c["srcc"]), fmt(c["krcc"]), fmt(c["plcc"]))
            ig = part["intra_group"]
            t.add_row("intra-group SRCC (level vs score)", str(ig["groups"]), fmt(ig["srcc"]), "", "")
        if "vs_mos" in part:
            c = part["vs_mos"]
            t.add_row("score vs MOS", str(c["n"]), fmt(c["srcc"]), fmt(c["krcc"]), fmt(c["plcc"]))
        console.print(folding(t))
        lines = []
        if "detection" in part:
            d, h = part["detection"], part["detection_levels_3_5"]
            lines.append(f"distortion category: top-1 {fmt(d['top1'])}, recall {fmt(d['recall'])} (n={d['n']}); "
                         f"levels 3–5: top-1 {fmt(h['top1'])}, recall {fmt(h['recall'])} (n={h['n']})")
        if "mcq" in part:
            lines.append(f"multiple choice: accuracy {fmt(part['mcq']['accuracy'])} (n={part['mcq']['n']})")
        if "unscored_answers" in part:
            lines.append(f"questions without an answer key: {len(part['unscored_answers'])} answered, not scored "
                         "(answers below; all of them in --json)")
        if "seconds_per_item_median" in part:
            lines.append(f"median time per item: {part['seconds_per_item_median']:.2f} s")
        for line in lines:
            console.print(line)
        for a in part.get("unscored_answers", [])[:20]:
            console.print(f"  {escape(a['id'])}: {escape(a['question'][:80])} → {escape((a['answer'] or '–')[:120])}",
                          soft_wrap=True)
    for e in report.get("errors", [])[:10]:
        console.print(f"[red]failed[/] {e['id']} ({e['mode']}): {e['error'][:160]}")
