"""`agentic-iqa assess`: one image (plus optional reference) → answer, level, score and the evidence;
or a batch — several images, folders, or a manifest — streamed into a JSONL results file.

    agentic-iqa assess photo.jpg -q "Is the sky blurry? A. Yes B. No"
    agentic-iqa assess shots/ --recursive --out results.jsonl --concurrency 8
    agentic-iqa assess --manifest data/manifest.jsonl --out results.jsonl --resume
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from agentic_iqa.cli.common import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, ALLOW_ABSOLUTE_HELP, DEVICE_HELP, NO_PROGRESS_HELP, TOOLS_FILE, WEIGHTS_DIR,
                                     fail, flag, folding, note_unused_api_base, refuse_empty, unexpected)


def assess_command(
    images: Optional[List[str]] = typer.Argument(
        None, show_default=False,
        help="Image(s) to assess ('example:chelsea' for a bundled sample), or folder(s) of images. "
             "Several images, a folder or --manifest make a batch, which needs --out.",
    ),
    query: Optional[str] = typer.Option(None, "--query", "-q", help="Question or request; default: rate the overall quality. In a batch: for every image (a manifest row's question wins)."),
    reference: Optional[str] = typer.Option(None, "--reference", "-r", help="Reference (pristine) image for full-reference tools (in a batch: for every image)."),
    lm: Optional[str] = typer.Option(None, "--lm", help="DSPy model string for all three roles, e.g. openai/gpt-4o.",
                                     callback=refuse_empty),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="Base URL of an OpenAI-compatible server.",
                                           callback=refuse_empty),
    config: Optional[Path] = typer.Option(None, "--config", help="Folder holding pipeline.yaml / model_backends.yaml."),
    device: Optional[str] = typer.Option(None, "--device", help=DEVICE_HELP),
    weights_dir: Optional[Path] = WEIGHTS_DIR,
    tools_file: Optional[List[Path]] = TOOLS_FILE,
    offline: bool = flag("--offline", help="Use the offline analyst even if an LM is configured."),
    image_transport: Optional[str] = typer.Option(
        None, "--image-transport",
        help="How images travel to the VLM: auto (the file's bytes; lossless / JPEG 95 only above 3.75 MB), original, "
             "jpeg[:Q], side:N, jpeg:Q,side:N. Default: image_transport in pipeline.yaml (auto). Tools always read the file."),
    mode: str = typer.Option("auto", "--mode", help="auto | score | answer."),
    program: List[str] = typer.Option([], "--program", help="Compiled program JSON to use (repeatable)."),
    no_cache: bool = flag("--no-cache", help="Do not read or write the tool-score cache."),
    resize_reference: bool = flag("--resize-reference", help="Resize a reference of another size to the image's size instead of refusing it."),
    as_json: bool = flag("--json", help="Print one JSON document instead of the summary (a batch: the batch summary)."),
    save_trace: Optional[Path] = typer.Option(None, "--save-trace", help="Also write the full result with its trace to this JSON file (one image)."),
    verbose: bool = flag("--verbose", "-v", help="Show timings, tool logs and the trace."),
    # ── batches ──
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Batch results file (JSONL, one line per image, written as each finishes)."),
    manifest: Optional[Path] = typer.Option(None, "--manifest", "-m", help="Assess the rows of an eval manifest (JSONL; paths relative to it)."),
    recursive: bool = flag("--recursive", "-R", help="Also take images from subfolders of the folders given."),
    resume: bool = flag("--resume", help="Continue --out: skip images that already have a result line (and repair a cut-off last line)."),
    retry_failed: bool = flag("--retry-failed", help="Like --resume, and run again the images that failed before, and those the offline analyst answered because the LM was unreachable or gave no usable reply."),
    overwrite: bool = flag("--overwrite", help="Start --out afresh even if it holds results."),
    concurrency: int = typer.Option(4, "--concurrency", "-j", min=1, max=64, help="Images assessed at once (LM calls overlap; tool runs take turns)."),
    allow_absolute: bool = flag("--allow-absolute", help=ALLOW_ABSOLUTE_HELP),
    with_trace: bool = flag("--with-trace", help="Keep each result's full trace in the results file (with --engine ray: in each row's result)."),
    no_progress: bool = flag("--no-progress", help=NO_PROGRESS_HELP + "; with --engine ray: no Ray progress bars or progress log lines)."),
    # ── scale-out ──
    engine: str = typer.Option("local", "--engine", help="local | ray: run the batch on a Ray cluster (needs the \\[ray] extra); --out is then a folder of result shards."),
    address: Optional[str] = typer.Option(None, "--address", help="With --engine ray: the cluster to join (auto, ray://host:10001); default: start Ray on this machine."),
    fmt: str = typer.Option("jsonl", "--format", help="With --engine ray: result shards as jsonl or parquet."),
    actors: Optional[int] = typer.Option(None, "--actors", min=1, show_default=False, help="With --engine ray: worker actors, each holding one assessor (default: $AGENTIC_IQA_RAY_ACTORS, else one per CPU of the cluster, at most one per batch)."),
    ray_batch_size: Optional[int] = typer.Option(None, "--ray-batch-size", min=1, show_default=False, help="With --engine ray: items per batch, i.e. per result shard and per retry unit (default: $AGENTIC_IQA_RAY_BATCH_SIZE, else 16)."),
    gpus_per_worker: Optional[float] = typer.Option(None, "--gpus-per-worker", min=0.0, show_default=False, help="With --engine ray: GPU share per actor, e.g. 0.25 = four actors per GPU; tools then run on CUDA (default: $AGENTIC_IQA_RAY_GPUS_PER_WORKER, else 0)."),
    lm_max_in_flight: Optional[int] = typer.Option(None, "--lm-max-in-flight", min=1, show_default=False, help="With --engine ray: LM requests in flight across the whole cluster (default: $AGENTIC_IQA_RAY_LM_MAX_IN_FLIGHT, else no cap)."),
) -> None:
    """Assess image quality, or answer a question about an image, with evidence from real IQA tools.
    Several images, folders or a manifest run as a batch into --out (resumable with --resume)."""
    from agentic_iqa.cli.common import setup_logging

    setup_logging(verbose)
    if mode not in {"auto", "score", "answer"}:
        fail(f"--mode must be auto, score or answer (got {mode!r})")
    images = list(images or [])
    _refuse_flag_values(images)
    tool_options = (device, weights_dir, image_transport, tools_file)
    if resume and overwrite:
        fail("--resume and --overwrite contradict each other; choose one")
    is_batch = manifest is not None or out is not None or len(images) > 1 or (len(images) == 1 and Path(images[0]).is_dir())
    if engine not in {"local", "ray"}:
        fail(f"--engine must be local or ray (got {engine!r})")
    ray_only = [name for name, given in (("--address", address is not None), ("--format", fmt != "jsonl"),
                                         ("--actors", actors is not None), ("--ray-batch-size", ray_batch_size is not None),
                                         ("--gpus-per-worker", gpus_per_worker is not None),
                                         ("--lm-max-in-flight", lm_max_in_flight is not None)) if given]
    if not is_batch:
        if not images:
            fail("nothing to assess: give an image (or several, or a folder, or --manifest FILE with --out FILE)")
        for flag, given in (("--resume", resume), ("--retry-failed", retry_failed), ("--overwrite", overwrite)):
            if given:
                fail(f"{flag} is for batches: it needs --out results.jsonl")
        if engine == "ray":
            fail("--engine ray is for batches: it needs --out (a folder of result shards); one image runs here")
        if ray_only:
            _refuse_ray_only(ray_only)
        _single(images[0], query, reference, lm, api_base, config, offline, mode, program, no_cache,
                resize_reference, as_json, save_trace, verbose, tool_options)
        return
    if out is None:
        what = f"{images[0]} is a folder" if len(images) == 1 and not manifest else "several images (or a manifest) make a batch"
        fail(f"{what}: pass --out results.jsonl to assess it as a batch (add --recursive for subfolders)")
    if save_trace:
        fail("--save-trace is for one image; in a batch, pass --with-trace to keep traces in the results file")
    if manifest is not None and images:
        fail("give either images/folders or --manifest, not both")
    cluster = {"actors": actors, "batch_size": ray_batch_size, "gpus_per_worker": gpus_per_worker,
               "lm_max_in_flight": lm_max_in_flight}
    if engine == "ray":
        if gpus_per_worker is not None and gpus_per_worker != gpus_per_worker:
            fail("--gpus-per-worker must be a number of at least 0 (got nan)")
        _ray_batch(images, manifest, out, query, reference, lm, api_base, config, offline, mode, program, no_cache,
                   resize_reference, as_json, recursive, resume, retry_failed, overwrite, concurrency, allow_absolute,
                   address, fmt, tool_options, cluster, with_trace, no_progress or as_json)
        return
    if ray_only:
        _refuse_ray_only(ray_only)
    _batch(images, manifest, out, query, reference, lm, api_base, config, offline, mode, program, no_cache,
           resize_reference, as_json, recursive, resume, retry_failed, overwrite, concurrency, allow_absolute,
           with_trace, no_progress or as_json, tool_options)


def _refuse_ray_only(flags: List[str]) -> None:
    fail(f"{', '.join(flags)}: only with --engine ray (add --engine ray, or leave {'them' if len(flags) > 1 else 'it'} out)")


_FLAG_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0"}


def _refuse_flag_values(images: List[str]) -> None:
    """`--offline true`: flags take no value, so the word would be read as an image; say so instead."""
    for word in images:
        if word.lower() in _FLAG_WORDS and not Path(word).exists():
            fail(f"{word!r} is not an image: flags such as --offline, --json or --verbose take no value "
                 f"(write --offline, not --offline {word})")


def _settings(lm, api_base, config, offline, programs, tool_options=(None, None, None)):
    """`tool_options`: (--device, --weights-dir, --image-transport[, --tools-file])."""
    from agentic_iqa.cli.common import with_tool_options
    from agentic_iqa.config import load_settings
    from agentic_iqa.programs import read_program
    from rich.markup import escape

    device, weights_dir, transport, tools_files = (*tool_options, None, None)[:4]
    overrides = {"image_transport": transport} if transport is not None else {}
    def read(**more):
        return load_settings(config, lm=lm, api_base=api_base, backend="offline" if offline else None,
                             **overrides, **more)

    settings = read()
    if programs:
        given = {}
        for spec in programs:
            module, _, path = spec.rpartition("=")
            header = read_program(path)[0]  # checked now, model or not: a bad file is one line at once
            given[module or header.get("module", "")] = Path(path)
        # Read again with them, so that --program gets the checks pipeline.yaml's programs: get (module names, files).
        settings = read(programs={**settings.pipeline.programs, **given})
    settings = with_tool_options(settings, device, weights_dir, tools_files)
    if lm and not offline and settings.pipeline.backend == "offline":
        from rich.console import Console

        from agentic_iqa.config import env_settings

        where = ("AGENTIC_IQA_BACKEND" if env_settings().BACKEND == "offline"
                 else " / ".join(str(p) for p in settings.config_files if p.name == "pipeline.yaml") or "the configuration")
        Console(stderr=True, highlight=False).print(
            f"[yellow]note:[/] --lm is ignored: the backend is 'offline' ({escape(where)}), so the offline analyst "
            "answers; set it to auto (or vlm) to use the model", soft_wrap=True)
    if settings.uses_model:
        from agentic_iqa.cli.common import quiet_dspy_logs

        quiet_dspy_logs()
    if settings.pipeline.programs and not settings.uses_model:  # --program or pipeline.yaml's programs:
        from rich.console import Console

        given = "--program" if programs else "programs: in pipeline.yaml"
        Console(stderr=True, highlight=False).print(
            f"[yellow]note:[/] {given} is ignored: no model is configured (the offline analyst answers); "
            "pass --lm MODEL to use it", soft_wrap=True)
    note_unused_api_base(settings, api_base)
    return settings


# ── one image ───────────────────────────────────────────────────────────────────────────────────


def _single(image, query, reference, lm, api_base, config, offline, mode, program, no_cache, resize_reference,
            as_json, save_trace, verbose, tool_options=(None, None, None)) -> None:
    from agentic_iqa.config import ConfigError

    if save_trace:
        _refuse_trace_over_an_input(save_trace, image, reference)
    try:
        result = _run(image, query, reference, lm, api_base, config, offline, mode, program, no_cache,
                      verbose and not as_json, resize_reference, tool_options)
    except typer.Exit:
        raise
    except ConfigError as exc:
        fail(escape(str(exc)), EXIT_BAD_INPUT)
    except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        fail(escape(str(exc)), EXIT_BAD_INPUT)
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback
        unexpected(exc, "assessment failed")
    try:
        if as_json:
            typer.echo(result.model_dump_json(indent=2, exclude={"trace"} if not verbose else None))
        else:
            render(result, verbose)
    finally:  # after the result is shown (a trace that cannot be written must not lose it), and even if it
        if save_trace:  # could not be (a full or closed stdout): the trace keeps the result then
            _save_trace(result, save_trace)


def _refuse_trace_over_an_input(path: Path, image: str, reference: Optional[str]) -> None:
    """--save-trace naming the image or the reference itself (a slip): refused before assessing."""
    for what, name in (("image", image), ("reference image", reference)):
        try:
            same = bool(name) and os.path.samefile(path, name)
        except (OSError, ValueError):
            same = False
        if same:
            fail(f"--save-trace {path} would replace the {what} {name} with the trace; give another file name "
                 "(e.g. trace.json)")


def _save_trace(result, path: Path) -> None:
    import stat
    import tempfile

    from agentic_iqa.redact import redact

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = result.model_dump_json(indent=2).encode("utf-8")
        if path.exists() and not path.is_file():
            if not stat.S_ISCHR(path.stat().st_mode):  # a folder, a FIFO (which would block), a socket
                raise OSError(f"{'a folder' if path.is_dir() else 'not a regular file'}; give a file path")
            with open(path, "wb") as fh:  # /dev/null, /dev/full: written in place, never replaced
                fh.write(data)
            return
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
    except OSError as exc:
        fail(escape(redact(f"the result above is complete, but the trace could not be written to {path}: "
                            f"{exc.strerror or exc}")), EXIT_FAILED)


def _run(image, query, reference, lm, api_base, config, offline, mode, programs, no_cache, show_progress,
         resize_reference=False, tool_options=(None, None, None)):
    from agentic_iqa.api import Assessor
    from iqa_tools.examples import resolve_example

    image_path = resolve_example(image)
    reference_path = resolve_example(reference) if reference else None
    from agentic_iqa.cli.compile import lm_or_demo

    assessor = Assessor(_settings(lm, api_base, config, offline, programs, tool_options), make_lm=lm_or_demo)
    kw = dict(mode=mode, use_cache=not no_cache, resize_reference=resize_reference)
    if not show_progress:
        return _interruptible(lambda on_event: assessor.assess(image_path, query, reference_path, on_event=on_event, **kw))
    from rich.console import Console

    console = Console(stderr=True)
    with console.status("assessing…") as status:
        def on_event(ev: dict) -> None:
            if ev.get("event") == "start":
                status.update(f"{ev['stage']}…")
            elif ev.get("event") == "tool_start":
                status.update(f"running {ev['tool']}…")

        return _interruptible(lambda watch: assessor.assess(
            image_path, query, reference_path, on_event=lambda ev: (watch(ev), on_event(ev)), **kw))


STOPPING = "stopping after the current step… (Ctrl-C again to stop now)"


def _interruptible(run):
    """`run(on_event)` with two-stage Ctrl-C: the first stops when the step in flight (an LM call, a tool
    run) ends and no further step is waited for; the second stops at once. Either way: exit 130.

    The assessment runs in a daemon thread and this (main) thread only waits: a Ctrl-C is handled at
    once, not after the LM call or tool run in flight returns (their worker threads would otherwise
    hold the interpreter open until they finish, up to the LM timeout)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return run(lambda ev: None)
    # `wake`: the run ended, or a step ended after a Ctrl-C. The main thread waits on it rather than polling
    # the worker, so it reacts at once: with tools that take milliseconds (torch-free NR kernels) a poll
    # interval is long enough for the remaining steps, the summarizer's LM call included, to run.
    wake, requested = threading.Event(), threading.Event()
    current: list[str] = []
    done: dict = {}

    def watch(ev: dict) -> None:
        if ev.get("event") == "start":
            current[:] = [ev.get("stage", "")]
        if ev.get("event") in ("end", "tool_end") and requested.is_set():
            wake.set()

    def work() -> None:
        try:
            done["result"] = run(watch)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread as is
            done["error"] = exc
        finally:
            wake.set()

    def on_sigint(signum, frame) -> None:
        if requested.is_set():
            _exit_now("stopped")
        requested.set()
        sys.stderr.write(STOPPING + "\n")
        sys.stderr.flush()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        worker = threading.Thread(target=work, name="assess", daemon=True)
        worker.start()
        while not wake.wait(0.1):  # a timed wait, so that the SIGINT handler runs promptly
            pass
    finally:
        signal.signal(signal.SIGINT, previous)
    # (not worker.is_alive(): the worker may still be winding down just after setting `wake`)
    if requested.is_set() or not ("result" in done or "error" in done):  # after a Ctrl-C no result is shown
        _exit_now(f"stopped after the {current[0]} step" if current else "stopped")
    if "error" in done:
        raise done["error"]
    return done["result"]


def _exit_now(what: str):
    """Exit 130 without waiting for LM calls or tool runs still in flight in other threads."""
    sys.stdout.flush()
    sys.stderr.write(f"interrupted: {what}; no result was produced (run the command again to assess the image)\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


_TERMINAL_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"            # CSI: colours, cursor moves, clear screen
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window title, hyperlinks
    r"|\x1b[@-_]?"                          # any other escape
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"        # other control characters (newline and tab stay)
)


def escape(text) -> str:
    """Model and file text made safe for the terminal: control characters and escape sequences removed
    (a reply could retitle the window or clear the screen), rich markup shown literally."""
    from rich.markup import escape as markup_escape

    return markup_escape(_TERMINAL_CONTROL.sub("", str(text)))


def answered_by(result) -> str:
    """The footer: who answered, and which stages fell back to what when the model did not answer all."""
    stages = sorted({f.split(":", 1)[0] for f in result.fallbacks})
    if not stages or not result.backend.startswith("vlm"):
        return f"answered by {result.backend}"
    return f"answered by {result.backend}, with fallbacks in {', '.join(stages)} (see below)"


def render(result, verbose: bool = False) -> None:
    from rich.cells import cell_len
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    from signatures.models import on_asked_scale

    con = Console()
    r = result.result
    head = f"[bold]{escape(r.final_answer)}[/]"
    if result.mode == "score" and r.score is not None:
        head = f"[bold]Level {r.level}[/] · score [bold]{r.score:.2f}[/] / 5"
        asked = on_asked_scale(r.score, result.query)  # "Rate it from 1 to 10": that scale's value too
        if asked:
            head += f" ({asked.lstrip(', ')})"
    body = f"{head}\n\n{escape(r.quality_reasoning)}"
    footer = answered_by(result)
    # A narrow answer must not cut the footer short (it names the stages that fell back).
    width = min(con.width, max(con.measure(body).maximum + 4, cell_len(footer) + 8, len(result.query[:200]) + 8))
    subtitle = escape(footer)
    if cell_len(footer) + 8 > width:  # a panel's subtitle is one line, cut at the border: inside, it wraps
        body, subtitle = f"{body}\n\n[dim]{escape(footer)}[/]", None
    title = f"[b]{escape(result.query)}[/]"
    if cell_len(result.query) + 6 > width:  # the title is one line too, cut with "…": the question opens the body
        body, title = f"{title}\n\n{body}", None
    con.print(Panel(body, title=title, subtitle=subtitle, expand=True, width=width))
    ev = result.evidence
    if ev and ev.distortion_analysis and any(ev.distortion_analysis.values()):
        t = Table(title="Distortions", show_lines=False)
        for col in ("object", "type", "severity", "evidence"):
            t.add_column(col)
        for obj, items in ev.distortion_analysis.items():
            for it in items:
                t.add_row(escape(obj), it.type, it.severity, escape(it.explanation))
        con.print(folding(t))
    if ev and ev.tool_logs:
        from agentic_iqa.graph import clip_text  # loaded already: the assessment ran through it

        t = Table(title="Tools")
        for col in ("tool", "for", "raw", "score 1–5", "time", "note"):
            t.add_column(col)
        for lg, serves in tool_runs(ev.tool_logs):
            note = "cached" if lg.cached else ""
            if lg.fallback:
                note = f"fallback for {lg.fallback_for}"
            if lg.error:  # whole: a missing-weights note ends with the folder to put the file in (the cell folds)
                note = f"[red]{escape(clip_text(lg.error, 600))}[/]"
            raw = "–" if lg.raw_score != lg.raw_score else f"{lg.raw_score:.4g}"
            norm = "–" if lg.normalized_score != lg.normalized_score else f"{lg.normalized_score:.2f}"
            t.add_row(lg.tool_name, escape(", ".join(serves)), raw, norm, f"{lg.execution_time * 1000:.0f} ms", note)
        con.print(folding(t))
    if r.prob_mode:
        con.print(f"[dim]fusion: {r.prob_mode} probabilities — {escape(r.prob_source or '')}[/]")
    for n in result.notes:
        con.print(f"[yellow]note:[/] {escape(n)}")
    for f in result.fallbacks:
        con.print(f"[yellow]fallback:[/] {escape(f)}")
    if verbose:
        if not any(n.startswith("configuration read from") for n in result.notes):
            con.print("[dim]configuration: package defaults (no config files read)[/]")
        con.print(f"[dim]timings: {escape(json.dumps(result.timings))} · total {result.total_seconds:.2f} s · LM calls {result.lm_calls} · retries {result.retries} · replans {result.replans}[/]")
        if result.lm_calls:
            con.print(f"[dim]images sent to the VLM: {result.image_bytes_sent:,} bytes over {result.lm_calls} LM call(s)[/]")


def tool_runs(logs) -> list:
    """One entry per tool run: the executor logs a run once per (object, distortion) it serves, with the
    same score and time; the table shows the run once with everything it served."""
    runs: dict = {}
    for lg in logs:
        key = (lg.tool_name, repr(lg.raw_score), lg.execution_time,
               lg.cached, lg.fallback_for, lg.error)
        first, serves = runs.setdefault(key, (lg, []))
        label = f"{lg.object_name}/{lg.distortion}"
        if label not in serves:
            serves.append(label)
    return list(runs.values())


# ── batches ─────────────────────────────────────────────────────────────────────────────────────


def _batch(images, manifest, out, query, reference, lm, api_base, config, offline, mode, program, no_cache,
           resize_reference, as_json, recursive, resume, retry_failed, overwrite, concurrency, allow_absolute,
           with_trace, quiet, tool_options=(None, None, None)) -> None:
    from agentic_iqa.api import Assessor
    from agentic_iqa.batch import BatchError, run_batch
    from agentic_iqa.config import ConfigError
    from iqa_tools import ImageError, ToolTableError

    try:
        settings = _settings(lm, api_base, config, offline, program, tool_options)
        items, problems, notes = _items(images, manifest, query, reference, mode, recursive, allow_absolute)
        from agentic_iqa.cli.compile import lm_or_demo

        assessor = Assessor(settings, make_lm=lm_or_demo)
        progress = _Progress(enabled=not quiet)
        stop = _batch_sigint()
        with progress, stop:
            summary = run_batch(
                items, out, assessor, concurrency=concurrency, resume=resume, retry_failed=retry_failed,
                overwrite=overwrite, use_cache=not no_cache, with_trace=with_trace, resize_reference=resize_reference,
                manifest_problems=problems, notes=notes, on_start=progress.start, on_result=progress.update,
            )
    except typer.Exit:
        raise
    except KeyboardInterrupt:  # while the items were planned or the assessor built (run_batch handles its own)
        _interrupted_outside_the_run()
    except (BatchError, ConfigError, ImageError, ToolTableError) as exc:  # a bad --tools-file: bad input too
        fail(escape(str(exc)), EXIT_BAD_INPUT)
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback
        unexpected(exc, "batch failed")

    code = _finish_batch(summary, as_json, exit=False, interrupted_code=stop.exit_code)
    if summary.interrupted:
        # Assessments still running in worker threads would keep the interpreter alive until their LM
        # calls return (up to the timeout); every finished item is already fsync'd, so leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code)


def _items(images, manifest, query, reference, mode, recursive, allow_absolute):
    """The batch's items, unusable manifest rows and notes (the same rules for every engine)."""
    from agentic_iqa.batch import items_from_manifest, items_from_paths
    from iqa_tools.examples import resolve_example

    if manifest is not None:
        items, problems = items_from_manifest(manifest, query=query, mode=mode, allow_outside=allow_absolute)
        notes: list[str] = []
    else:
        ref = str(resolve_example(reference)) if reference else None
        items, notes = items_from_paths([str(resolve_example(p)) for p in images], recursive=recursive,
                                        query=query, reference=ref, mode=mode)
        problems = []
    if not items and not problems:
        fail(escape("no images to assess: " + ("; ".join(notes) or "the input is empty")), EXIT_BAD_INPUT)
    return items, problems, notes


def _ray_batch(images, manifest, out, query, reference, lm, api_base, config, offline, mode, program, no_cache,
               resize_reference, as_json, recursive, resume, retry_failed, overwrite, concurrency, allow_absolute,
               address, fmt, tool_options=(None, None, None), cluster=None, with_trace=False, quiet=False) -> None:
    """`--engine ray`: the batch on Ray Data (agentic_iqa.distributed), shards in the folder --out.
    `cluster`: the cluster-size flags (a None value: from $AGENTIC_IQA_RAY_*)."""
    cluster = cluster or {}
    from agentic_iqa.batch import BatchError
    from agentic_iqa.config import ConfigError
    from iqa_tools import ImageError

    try:
        from agentic_iqa.distributed import run_cli_batch

        settings = _settings(lm, api_base, config, offline, program, tool_options)
        items, problems, notes = _items(images, manifest, query, reference, mode, recursive, allow_absolute)
        # Our own SIGINT handler, as for the local batch: Python installs its KeyboardInterrupt handler only
        # when SIGINT is not ignored at start-up, and a command started with `&` by a non-interactive shell
        # (a CI script's `cmd &`) inherits SIGINT ignored: without this, SIGINT did nothing and the run went on.
        stop = _batch_sigint()
        with stop:
            summary = run_cli_batch(items, out, settings, address=address, fmt=fmt, resume=resume, retry_failed=retry_failed,
                                    overwrite=overwrite, concurrency=concurrency, use_cache=not no_cache,
                                    resize_reference=resize_reference, manifest_problems=problems, notes=notes,
                                    actors=cluster.get("actors"), batch_size=cluster.get("batch_size"),
                                    num_gpus_per_worker=cluster.get("gpus_per_worker"),
                                    lm_max_in_flight=cluster.get("lm_max_in_flight"), with_trace=with_trace,
                                    progress=not quiet)
    except typer.Exit:
        raise
    except KeyboardInterrupt:  # while connecting, or after the write while the summary was gathered
        _interrupted_outside_the_run()
    except (BatchError, ConfigError, ImageError, ValueError) as exc:
        fail(escape(str(exc)), EXIT_BAD_INPUT)
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback
        unexpected(exc, "batch failed")
    _finish_batch(summary, as_json, interrupted_code=stop.exit_code)


def _interrupted_outside_the_run() -> None:
    """A Ctrl-C that escaped a batch's run loop: exit 130 with a --resume hint, not click's "Aborted!" (exit 1)."""
    sys.stderr.write("interrupted: the results already written are kept; run the same command with --resume to continue\n")
    sys.stderr.flush()
    raise typer.Exit(EXIT_INTERRUPTED) from None


BATCH_STOP_GRACE = 10.0  # seconds a first Ctrl-C leaves the batch to save its summary before the process ends
SAME_INTERRUPT = 0.5     # seconds within which a second signal is the same interrupt, not a second Ctrl-C


class _batch_sigint:
    """Ctrl-C (or SIGTERM) during a batch: the first raises KeyboardInterrupt as usual (the runner stops starting
    items, finished lines are already on disk, the summary is printed) and arms a watchdog that ends the
    process after BATCH_STOP_GRACE seconds, so no interrupt landing in an unlucky spot (a lock held by a
    thread pool, an exit that would wait for worker threads in an LM call) can leave it hanging; a second
    one ends it at once. A signal within SAME_INTERRUPT seconds of the first is the same interrupt: GNU
    `timeout -s INT` and a terminal both signal the child and its process group, so one stop arrives
    twice, and taking the copy as a second Ctrl-C lost the summary. `exit_code`: 130 after SIGINT, 143
    after SIGTERM (128 + the signal). Outside the main thread (library use) nothing is installed."""

    def __enter__(self):
        import signal
        import threading
        import time

        self._previous: dict = {}
        self.exit_code = EXIT_INTERRUPTED
        if threading.current_thread() is not threading.main_thread():
            return self
        first: list[float] = []  # when the first signal came

        def leave() -> None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exit_code)

        def on_signal(signum, frame) -> None:
            if first:
                if time.monotonic() - first[0] < SAME_INTERRUPT:
                    return  # the same stop delivered twice (to us and to our group): already being handled
                leave()
            first.append(time.monotonic())
            self.exit_code = 128 + signum
            _daemon_timer(BATCH_STOP_GRACE, leave)
            raise KeyboardInterrupt

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, on_signal)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def _daemon_timer(seconds: float, action) -> None:
    import threading

    timer = threading.Timer(seconds, action)
    timer.daemon = True  # never keeps the interpreter alive by itself
    timer.start()


def _finish_batch(summary, as_json: bool, exit: bool = True, interrupted_code: int = EXIT_INTERRUPTED) -> int:
    """Print the batch summary (JSON or a table) and map its status to the exit code (raised unless `exit=False`);
    `interrupted_code`: the code of an interrupted batch (143 after SIGTERM)."""
    from agentic_iqa.cli.common import EXIT_OF_STATUS

    code = interrupted_code if summary.status == "interrupted" else EXIT_OF_STATUS[summary.status]
    if as_json:
        typer.echo(json.dumps({**summary.as_dict(), "exit_code": code}, indent=2, ensure_ascii=False))
    else:
        render_summary(summary)
    if exit:
        raise typer.Exit(code)
    return code


class _Progress:
    """A rich progress bar on stderr (rate, ETA, failures) on a terminal; otherwise plain lines
    (`LineProgress`: one per N images or per few seconds)."""

    def __init__(self, enabled: bool, console=None):
        from rich.console import Console

        from agentic_iqa.cli.progress import LineProgress
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        console = console or Console(stderr=True)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("assessing"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=console, disable=not (enabled and console.is_terminal), transient=False,
        )
        self.lines = LineProgress("assess") if enabled and not console.is_terminal else None
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)
        if self.lines and exc[0] is None:
            self.lines.finish()

    def start(self, summary, n: int) -> None:
        self.task = self.progress.add_task("assess", total=n, rate="", status="")
        if self.lines:
            self.lines.start(n)

    def update(self, res, summary) -> None:
        if self.lines:
            self.lines.advance(failed=not res.ok)
        elapsed = self.progress.tasks[self.task].elapsed or 0.0
        rate = f"{summary.ran / elapsed:.2f} img/s" if elapsed > 0 else ""
        status = []
        if summary.failed:
            status.append(f"[red]✗ {summary.failed} failed[/]")
        if summary.degraded:
            status.append(f"[yellow]⚠ {summary.degraded} degraded[/]")
        self.progress.update(self.task, advance=1, rate=rate, status=" ".join(status))


def render_summary(summary) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(stderr=False, highlight=False)
    d = summary.as_dict()
    t = Table(title="Batch" + (" (interrupted)" if summary.interrupted else ""), show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("items", str(summary.total))
    t.add_row("assessed now", f"{summary.ran}  (ok {summary.ok}, of which degraded {summary.degraded}; failed {summary.failed})")
    if summary.already_done:
        t.add_row("already done", f"{summary.already_done} (skipped: result line present)")
    if summary.failed_before:
        t.add_row("failed before", f"{summary.failed_before} (not retried; --retry-failed)")
    if summary.duplicates:
        t.add_row("duplicates", str(summary.duplicates))
    if summary.manifest_problems:
        t.add_row("unusable manifest rows", str(len(summary.manifest_problems)))
    t.add_row("time", f"{summary.seconds:.1f} s · {summary.rate:.2f} images/s")
    if d["mean_score"] is not None:
        t.add_row("mean score", f"{d['mean_score']:.2f} / 5")
    t.add_row("results", escape(summary.out))
    con.print(folding(t))
    failures = [f for f in summary.failures if f["error_type"] != "lm_setup"]  # said once, under "stopped"
    setup_failed = len(summary.failures) - len(failures)
    shown = failures[:10]
    for f in shown:
        con.print(f"[red]failed:[/] {escape(f['image'])} — {escape(f['error'] or '')}")
    more = summary.failed - setup_failed - len(shown)
    if more > 0:
        con.print(f"[dim]… {more} more failure(s): lines with \"status\": \"failed\" in {escape(summary.out)}[/]")
    for p in summary.manifest_problems[:10]:
        con.print(f"[red]manifest:[/] {escape(p)}")
    for n in summary.notes:
        con.print(f"[yellow]note:[/] {escape(n)}")
    if summary.interrupted:
        left = f"{summary.not_attempted} item(s) not finished; " if summary.not_attempted else ""
        con.print(f"[yellow]interrupted:[/] finished items are saved; {left}run the same command with --resume to continue")
    if summary.stopped:
        con.print(f"[bold red]stopped:[/] {escape(summary.stopped)}")
        con.print(f"{setup_failed} item(s) failed for this reason and {summary.not_attempted} were not attempted; once fixed, "
                  "run the same command with --resume --retry-failed")
