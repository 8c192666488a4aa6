"""`agentic-iqa assess`: one image (plus optional reference) → answer, level, score and the evidence."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from agentic_iqa.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, fail


def assess_command(
    image: str = typer.Argument(..., help="Image to assess (path; 'example:chelsea' for a bundled sample)."),
    query: Optional[str] = typer.Option(None, "--query", "-q", help="Question or request; default: rate the overall quality."),
    reference: Optional[str] = typer.Option(None, "--reference", "-r", help="Reference (pristine) image for full-reference tools."),
    lm: Optional[str] = typer.Option(None, "--lm", help="DSPy model string for all three roles, e.g. openai/gpt-4o."),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="Base URL of an OpenAI-compatible server."),
    config: Optional[Path] = typer.Option(None, "--config", help="Folder holding pipeline.yaml / model_backends.yaml."),
    offline: bool = typer.Option(False, "--offline", help="Use the offline analyst even if an LM is configured."),
    mode: str = typer.Option("auto", "--mode", help="auto | score | answer."),
    program: list[str] = typer.Option([], "--program", help="Compiled program JSON to use (repeatable)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the tool-score cache."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of the summary."),
    save_trace: Optional[Path] = typer.Option(None, "--save-trace", help="Also write the full result with its trace to this JSON file."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show timings, tool logs and the trace."),
) -> None:
    """Assess an image's quality, or answer a question about it, with evidence from real IQA tools."""
    from agentic_iqa.cli.common import setup_logging
    from agentic_iqa.config import ConfigError

    setup_logging(verbose)
    if mode not in {"auto", "score", "answer"}:
        fail(f"--mode must be auto, score or answer (got {mode!r})")
    try:
        result = _run(image, query, reference, lm, api_base, config, offline, mode, program, no_cache, verbose and not as_json)
    except typer.Exit:
        raise
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback
        fail(f"assessment failed: {type(exc).__name__}: {exc}", EXIT_FAILED)
    if save_trace:
        save_trace.parent.mkdir(parents=True, exist_ok=True)
        save_trace.write_text(result.model_dump_json(indent=2), encoding="utf-8")
    if as_json:
        typer.echo(result.model_dump_json(indent=2, exclude={"trace"} if not verbose else None))
    else:
        render(result, verbose)


def _run(image, query, reference, lm, api_base, config, offline, mode, programs, no_cache, show_progress):
    from agentic_iqa.api import Assessor
    from agentic_iqa.config import load_settings
    from iqa_tools.examples import resolve_example

    image_path = resolve_example(image)
    reference_path = resolve_example(reference) if reference else None
    settings = load_settings(config, lm=lm, api_base=api_base, backend="offline" if offline else None)
    for spec in programs:
        module, _, path = spec.rpartition("=")
        if not module:
            from agentic_iqa.programs import read_program

            module = read_program(path)[0].get("module", "")
        settings.pipeline.programs[module] = Path(path)
    assessor = Assessor(settings)
    if not show_progress:
        return assessor.assess(image_path, query, reference_path, mode=mode, use_cache=not no_cache)
    from rich.console import Console

    console = Console(stderr=True)
    with console.status("assessing…") as status:
        def on_event(ev: dict) -> None:
            if ev.get("event") == "start":
                status.update(f"{ev['stage']}…")
            elif ev.get("event") == "tool_start":
                status.update(f"running {ev['tool']}…")

        return assessor.assess(image_path, query, reference_path, mode=mode, use_cache=not no_cache, on_event=on_event)


def render(result, verbose: bool = False) -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    con = Console()
    r = result.result
    head = f"[bold]{r.final_answer}[/]"
    if result.mode == "score" and r.score is not None:
        head = f"[bold]Level {r.level}[/] · score [bold]{r.score:.2f}[/] / 5"
    body = f"{head}\n\n{r.quality_reasoning}"
    con.print(Panel(body, title=f"[b]{result.query}[/]", subtitle=f"answered by {result.backend}", expand=False))
    ev = result.evidence
    if ev and ev.distortion_analysis:
        t = Table(title="Distortions", show_lines=False)
        for col in ("object", "type", "severity", "evidence"):
            t.add_column(col)
        for obj, items in ev.distortion_analysis.items():
            for it in items:
                t.add_row(obj, it.type, it.severity, it.explanation)
        con.print(t)
    if ev and ev.tool_logs:
        t = Table(title="Tools")
        for col in ("tool", "for", "raw", "score 1–5", "time", "note"):
            t.add_column(col)
        for lg in ev.tool_logs:
            note = "cached" if lg.cached else ""
            if lg.fallback:
                note = f"fallback for {lg.fallback_for}"
            if lg.error:
                note = f"[red]{lg.error[:80]}[/]"
            raw = "–" if lg.raw_score != lg.raw_score else f"{lg.raw_score:.4g}"
            norm = "–" if lg.normalized_score != lg.normalized_score else f"{lg.normalized_score:.2f}"
            t.add_row(lg.tool_name, f"{lg.object_name}/{lg.distortion}", raw, norm, f"{lg.execution_time * 1000:.0f} ms", note)
        con.print(t)
    if r.prob_mode:
        con.print(f"[dim]fusion: {r.prob_mode} probabilities — {r.prob_source}[/]")
    for n in result.notes:
        con.print(f"[yellow]note:[/] {n}")
    for f in result.fallbacks:
        con.print(f"[yellow]fallback:[/] {f}")
    if verbose:
        con.print(f"[dim]timings: {json.dumps(result.timings)} · total {result.total_seconds:.2f} s · LM calls {result.lm_calls} · retries {result.retries} · replans {result.replans}[/]")
