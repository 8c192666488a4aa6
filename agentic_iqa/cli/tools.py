"""`agentic-iqa tools …`: list the IQA tools, run one on an image, manage the score cache.

Heavy imports (torch, pyiqa, the registry) happen inside the commands: `agentic-iqa --help` stays fast.
"""
from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from agentic_iqa.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, fail, flag, folding, unexpected, DEVICE_HELP, TOOLS_FILE, WEIGHTS_DIR

if TYPE_CHECKING:
    from iqa_tools import ToolRegistry

app = typer.Typer(
    help="List the IQA tools (pyiqa metrics), run one on an image, manage the score cache.",
    no_args_is_help=True,
    add_completion=False,
)
cache_app = typer.Typer(help="The persistent score cache (SQLite in the user cache directory).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


class ModeChoice(str, Enum):
    FR = "FR"
    NR = "NR"


def _registry(tools_files: Optional[List[Path]], weights_dir: Optional[Path], device: Optional[str] = None, cache: bool = True) -> "ToolRegistry":
    """A registry configured like the pipeline (configs/pipeline.yaml + env), with CLI overrides."""
    from agentic_iqa.config import load_settings

    return load_settings().build_registry(extra_tables=tools_files or [], device=device, weights_dir=weights_dir, cache=cache)


def _fail_for(exc: BaseException) -> None:
    """Turn any expected error into one line and the documented exit code (never a traceback)."""
    from agentic_iqa.config import ConfigError
    from iqa_tools import ImageError, ToolError, ToolRunError, ToolTableError

    from rich.markup import escape  # messages hold "[metrics]" and paths: print them literally

    if isinstance(exc, ToolRunError):
        fail(escape(str(exc)), EXIT_FAILED)  # the tool crashed: not the user's input
    # ToolError includes a missing package or weight file: this machine's configuration (the message says what
    # to install or where to put the file), so exit 2; README's exit codes keep 1 for unexpected failures.
    if isinstance(exc, (ImageError, ToolError, ToolTableError, ConfigError)):
        fail(escape(str(exc)), EXIT_BAD_INPUT)
    unexpected(exc, "unexpected error")


def _image_arg(value: str) -> str:
    from iqa_tools.examples import resolve_example

    return str(resolve_example(value))


@app.command("list")
def list_tools(
    available: bool = flag("--available", help="Only tools that can run on this machine."),
    mode: Optional[ModeChoice] = typer.Option(None, "--mode", case_sensitive=False, help="Only FR or NR tools."),
    as_json: bool = flag("--json", help="Machine-readable output."),
    tools_file: Optional[List[Path]] = TOOLS_FILE,
    weights_dir: Optional[Path] = WEIGHTS_DIR,
) -> None:
    """Show every tool: type, strengths, and whether it runs here (and why not)."""
    try:
        reg = _registry(tools_file, weights_dir, cache=False)
        rows = []
        for spec in reg.table.tools.values():
            if mode is not None and spec.mode != mode.value:
                continue
            ok, why = reg.availability(spec.name)
            if available and not ok:
                continue
            rows.append((spec, ok, why))
    except Exception as exc:  # noqa: BLE001 - every error becomes one line
        _fail_for(exc)

    if as_json:
        out = [
            {**spec.model_dump(mode="json", exclude={"source", "metric_kwargs"}), "available": ok, "reason": why}
            for spec, ok, why in rows
        ]
        typer.echo(json.dumps(out, indent=2))
        return

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from iqa_tools import weights
    from iqa_tools.paths import hf_hub_cache, torch_hub_dir

    table = Table(title=f"IQA tools ({len(rows)})")
    table.add_column("Tool", style="bold", no_wrap=True)
    table.add_column("Type", no_wrap=True)
    table.add_column("Strengths")
    table.add_column("Runs here?", no_wrap=True)
    table.add_column("Why not / notes")
    for spec, ok, why in rows:
        strengths = ", ".join(spec.strengths) or "[dim]–[/]"
        if ok:
            runs, note = "[green]yes[/]", f"[dim]{escape(why)}[/]"
        else:  # the short form; `--json` and `tools run` give the full instructions
            runs, note = "[red]no[/]", escape(weights.summarize_missing(weights.check(spec, reg.weights_dir)))
        table.add_row(spec.name, spec.mode, strengths, runs, note)
    console = Console()
    console.print(folding(table))
    if any(not ok for _, ok, _ in rows):
        hub = torch_hub_dir()
        console.print(
            escape(
                f"Weights go in {hub}/pyiqa (torchvision backbones: {hub}/checkpoints, CLIP: {hub}/clip, "
                f"timm/transformers: {hf_hub_cache()}), or a tool's main checkpoint in --weights-dir. "
                "Online, pyiqa downloads them on first use (not with HF_HUB_OFFLINE=1 / AGENTIC_IQA_OFFLINE=1). "
                "Packages for weight-based tools: pip install 'agentic-iqa[metrics]'. Full reasons: --json."
            ),
            style="dim",
        )


@app.command("run")
def run_tool(
    tool: str = typer.Argument(..., help="Tool name, e.g. PIQE, NIQE, SSIM, TOPIQ_FR (case and -/_ do not matter)."),
    image: str = typer.Argument(..., help="Image file, or example:NAME for a bundled sample (e.g. example:chelsea)."),
    reference: Optional[str] = typer.Option(None, "--reference", "-r", help="Reference image (full-reference tools)."),
    as_json: bool = flag("--json", help="Machine-readable output."),
    no_cache: bool = flag("--no-cache", help="Neither read nor write the score cache."),
    device: Optional[str] = typer.Option(None, "--device", help=DEVICE_HELP),
    fallback: bool = flag("--fallback", help="If the tool fails, run the fallback chain (NIQE, BRISQUE, best NR) as the agents do."),
    tools_file: Optional[List[Path]] = TOOLS_FILE,
    weights_dir: Optional[Path] = WEIGHTS_DIR,
) -> None:
    """Score IMAGE with one tool: raw score, normalized 1–5 score, time, cached or not."""
    try:
        reg = _registry(tools_file, weights_dir, device, cache=not no_cache)
        image_path = _image_arg(image)
        ref_path = _image_arg(reference) if reference is not None else None
        if fallback:
            logs = reg.run(tool, image_path, ref_path, use_cache=not no_cache)
        else:
            result = reg.score(tool, image_path, ref_path, use_cache=not no_cache)
    except Exception as exc:  # noqa: BLE001
        _fail_for(exc)

    if fallback:
        _print_logs(logs, image_path, as_json)
        if not any(entry.ok for entry in logs):
            raise typer.Exit(EXIT_FAILED)
        return

    if as_json:
        typer.echo(json.dumps({**json.loads(result.model_dump_json()), "image": image_path, "reference": ref_path}, indent=2))
        return
    from rich.console import Console

    where = "from cache" if result.cached else f"computed on {result.device}"
    console = Console(highlight=False)
    console.print(
        f"[bold]{result.tool}[/]  raw {result.raw_score:.4g}  →  [bold]{result.normalized_score:.2f}[/] / 5 "
        f"({result.normalization})   {result.seconds * 1000:.1f} ms, {where}"
    )
    for note in result.notes:
        console.print(f"note: {note}", style="dim", markup=False)


def _print_logs(logs, image_path: str, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"image": image_path, "logs": [json.loads(entry.model_dump_json()) for entry in logs]}, indent=2))
        return
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    for entry in logs:
        tag = f" [yellow](fallback for {entry.fallback_for})[/]" if entry.fallback else ""
        if entry.ok:
            where = "from cache" if entry.cached else f"computed on {entry.device}"
            console.print(
                f"[bold]{entry.tool_name}[/]{tag}  raw {entry.raw_score:.4g}  →  [bold]{entry.normalized_score:.2f}[/] / 5 "
                f"({entry.normalization})   {entry.execution_time * 1000:.1f} ms, {where}"
            )
        else:
            console.print(f"[bold]{entry.tool_name}[/]{tag}  [red]failed[/]: {escape(entry.error or '')}")


@cache_app.command("info")
def cache_info(as_json: bool = flag("--json", help="Machine-readable output.")) -> None:
    """Where the cache is, how many scores it holds, its size and limit."""
    try:
        info = _cache().info()
    except Exception as exc:  # noqa: BLE001
        _fail_for(exc)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    from rich.console import Console

    console = Console(highlight=False)
    console.print(f"cache: {info['path']}", markup=False)
    console.print(f"entries: {info['entries']}   size: {info['size_bytes'] / 2**20:.2f} MB of {info['max_bytes'] / 2**20:.0f} MB")
    if info["disabled"]:
        console.print(f"disabled: {info['disabled']}", style="red", markup=False)
    for tool, n in info["by_tool"].items():
        console.print(f"  {tool}: {n}")


@cache_app.command("clear")
def cache_clear() -> None:
    """Delete every cached score (a corrupt cache file is deleted and made anew)."""
    from iqa_tools.cache import ScoreCacheError

    try:
        cache = _cache()
        n = cache.clear()
    except ScoreCacheError as exc:  # e.g. the folder is not writable: one line, not "cleared 0"
        from rich.markup import escape

        fail(escape(str(exc)), EXIT_FAILED)
    except Exception as exc:  # noqa: BLE001
        _fail_for(exc)
    if cache.recreated:
        typer.echo(f"recreated the score cache {cache.path} (the old file was corrupt; its scores are gone)")
    else:
        typer.echo(f"cleared {n} cached score{'s' if n != 1 else ''} from {cache.path}")


def _cache():
    import warnings

    from agentic_iqa.config import load_settings
    from iqa_tools import ToolCache
    from iqa_tools.cache import ScoreCacheWarning

    # `cache info` / `cache clear` report the cache's state themselves: no separate warning line.
    warnings.simplefilter("ignore", ScoreCacheWarning)
    settings = load_settings().pipeline
    return ToolCache(settings.cache.dir, max_mb=settings.cache.max_mb)


def _one_line_cache_warnings() -> None:
    """The score cache's warning (corrupt file, unwritable folder) as one `warning: …` line on stderr,
    not Python's two-line warning format (file, line number, source line)."""
    import warnings

    previous = warnings.formatwarning

    def formatwarning(message, category, filename, lineno, line=None):
        if category.__name__ == "ScoreCacheWarning":
            return f"warning: {message}\n"
        return previous(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning


_one_line_cache_warnings()

