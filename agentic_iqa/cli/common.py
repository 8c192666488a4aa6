"""Shared CLI plumbing: one-line errors and the documented exit codes."""
from __future__ import annotations

import sys
from typing import NoReturn, Optional

import typer

# Exit codes (documented in README):
EXIT_OK = 0
EXIT_FAILED = 1      # the work ran but could not produce a result (e.g. a tool failed and no fallback ran)
EXIT_BAD_INPUT = 2   # bad arguments or input: missing/unreadable file, not an image, unknown tool, bad config
EXIT_PARTIAL = 3     # a batch finished but some items were skipped (each one's reason is recorded)
EXIT_INTERRUPTED = 130  # a batch stopped by Ctrl-C: finished items are saved; continue with --resume

#: The core reports how a batch ended (`BatchSummary.status`); the CLI alone knows exit codes.
EXIT_OF_STATUS = {"ok": EXIT_OK, "partial": EXIT_PARTIAL, "stopped": EXIT_BAD_INPUT, "interrupted": EXIT_INTERRUPTED}


def flag(*names: str, help: str, default: bool = False):
    """A boolean option that reads as a flag in --help: typer 0.29's rich help prints every option's
    type (`<bool>`), which made `--offline` look as if it took a value (`--offline true`)."""
    return typer.Option(default, *names, help=help, metavar="")


def refuse_empty(ctx: typer.Context, param: typer.CallbackParam, value: Optional[str]) -> Optional[str]:
    """A model option (`--lm`, `--teacher`, `--reflection-lm`) or `--api-base` given as "" (an unset variable in a
    script) read as "not given": it quietly ran on the configured model, or without one, or sent the requests (and
    the key) to the provider's own endpoint. Refused, naming what to do instead."""
    if value is None or value.strip():
        return value
    opt = param.opts[0]
    if param.name == "api_base":
        fail(f"{opt} is empty: give the server's base URL (e.g. http://127.0.0.1:8000/v1), or leave {opt} "
             "out to use the provider's own endpoint")
    without = "--lm demo (the scripted demo LM)" if ctx.info_name == "compile" else "--offline"
    fail(f"{opt} is empty: give a model as provider/model (e.g. openai/gpt-4o), or leave {opt} out; to run "
         f"without a model, pass {without}")


#: `--no-progress`, shared by `assess` and `eval` (assess adds what it means with --engine ray).
NO_PROGRESS_HELP = "No progress on stderr (a bar on a terminal, else a line per 5 % of the images or per 10 s"

#: `--allow-absolute`, shared by `assess --manifest` and `eval`.
ALLOW_ABSOLUTE_HELP = "Let manifest paths point outside the manifest's folder (absolute paths, '..', symlinks)."

#: `--device` / `--weights-dir`, shared by `assess`, `eval` and `tools run`.
DEVICE_HELP = "Where the tools run: auto (CUDA, MPS, CPU), cpu, cuda, cuda:N, mps. Default: tools.device in the config."
WEIGHTS_DIR_HELP = "Extra folder holding tools' pyiqa checkpoints. Default: tools.weights_dir in the config."
#: It is only read: a folder that does not exist (a typo) is refused, as the variable and config key are.
WEIGHTS_DIR = typer.Option(None, "--weights-dir", help=WEIGHTS_DIR_HELP, exists=True, file_okay=False, dir_okay=True)

#: `--tools-file`, shared by `assess`, `eval` and `tools list/run` (one Option object: the same flag everywhere).
TOOLS_FILE = typer.Option(None, "--tools-file", help="Your own tool file (YAML/JSON) merged over the bundled table; "
                          "repeatable; added after tools.extra_tables and $AGENTIC_IQA_TOOL_FILES.")


def with_tool_options(settings, device=None, weights_dir=None, tools_files=None):
    """`settings` with the CLI's --device / --weights-dir / --tools-file applied to the tools' settings
    (--tools-file adds tables after the configured ones, as AGENTIC_IQA_TOOL_FILES does)."""
    update = {k: v for k, v in (("device", device), ("weights_dir", weights_dir)) if v is not None}
    if tools_files:
        update["extra_tables"] = [*settings.pipeline.tools.extra_tables, *tools_files]
    if update:
        tools = settings.pipeline.tools.model_copy(update=update)
        settings.pipeline = settings.pipeline.model_copy(update={"tools": tools})
    return settings


def note_unused_api_base(settings, api_base: Optional[str]) -> None:
    """A server given with no model to send to was ignored without a word (like --program, it gets a note)."""
    if settings.backends.any_model:
        return
    from agentic_iqa.config import env_settings

    source = "--api-base" if api_base else "AGENTIC_IQA_API_BASE" if env_settings().API_BASE else None
    if source:
        from rich.console import Console

        Console(stderr=True, highlight=False).print(
            f"[yellow]note:[/] {source} is not used: no model is set (--lm, AGENTIC_IQA_LM or model_backends.yaml), "
            "so the offline analyst answers; pass --lm MODEL to use the server", soft_wrap=True)


def folding(table):
    """`table` with every wrapping column folding a word longer than the column (a path, "Global/Overall")
    instead of rich's default, cutting it with "…": on a narrow terminal nothing the user asked for is lost.
    Where everything fits, the table prints as before."""
    for column in table.columns:
        if not column.no_wrap:
            column.overflow = "fold"
    return table


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one clear line to stderr (no traceback) and exit with `code`."""
    from rich.console import Console

    from agentic_iqa.redact import redact

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {redact(message)}")
    raise typer.Exit(code)


def unexpected(exc: BaseException, what: str, code: int = EXIT_FAILED) -> NoReturn:
    """An error we did not foresee: one line, or with AGENTIC_IQA_DEBUG=1 the (redacted) traceback first."""
    import traceback

    from rich.markup import escape

    from agentic_iqa.config import debug_enabled
    from agentic_iqa.redact import redact

    if debug_enabled():
        print(redact("".join(traceback.format_exception(exc))), file=sys.stderr, end="")
        hint = ""
    else:
        hint = " (set AGENTIC_IQA_DEBUG=1 for the traceback)"
    fail(escape(f"{what}: {type(exc).__name__}: {exc}") + hint, code)


_LOG_LEVEL = 50  # logging.CRITICAL until setup_logging chooses (INFO with --verbose)


def setup_logging(verbose: bool = False) -> None:
    """Every command's logging, in this one place. Degradations are reported in the result (fallbacks,
    notes); log lines only with --verbose, and every log line redacted: servers echo keys into messages
    that we and the libraries log, and DSPy and LiteLLM log through handlers of their own."""
    import logging

    from agentic_iqa.redact import redact_all_log_records

    global _LOG_LEVEL
    _LOG_LEVEL = logging.INFO if verbose else logging.CRITICAL
    redact_all_log_records()
    logging.basicConfig(level=_LOG_LEVEL, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("LiteLLM", "litellm", "httpx", "httpcore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING if verbose else logging.CRITICAL)
    if "dspy" in sys.modules:  # already loaded (by the caller): its level now; else when a model is used
        quiet_dspy_logs()
    warn_unknown_env()


def quiet_dspy_logs() -> None:
    """DSPy sets its logger to INFO, with a handler of its own, when first imported ("INFO
    dspy.evaluate.evaluate: Average Metric: …" lines in `compile`): give it the level `setup_logging` chose.
    Called by a command once it knows it will use a model; it imports DSPy, which an offline run never needs
    (about 0.3-1 s)."""
    import logging

    import dspy  # noqa: F401 - configures the "dspy" logger

    logging.getLogger("dspy").setLevel(_LOG_LEVEL)


def warn_unknown_env() -> None:
    """One stderr line per AGENTIC_IQA_* variable nothing reads (e.g. AGENTIC_IQA_DEVICES for _DEVICE)."""
    from agentic_iqa.config import unknown_env_vars

    for name, close in unknown_env_vars():
        hint = f" (did you mean {close}?)" if close else ""
        sys.stderr.write(f"warning: {name} is not a variable agentic-iqa reads{hint}; it has no effect\n")


def catch_sigint():
    """Make Ctrl-C raise KeyboardInterrupt, also in a command started as a script's background job
    (`cmd &`), which inherits SIGINT ignored. Returns the handler for `restore_sigint` (None outside the
    main thread, where nothing is installed). For commands that then call `stop_now`."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def on_sigint(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, on_sigint)


def restore_sigint(previous) -> None:
    if previous is not None:
        import signal

        signal.signal(signal.SIGINT, previous)


def stop_now(what: str) -> NoReturn:
    """After a Ctrl-C: one line, exit 130 at once. A normal exit would wait for the worker threads, i.e. for
    an LM call in flight (up to its call budget), and a second Ctrl-C there printed a traceback."""
    import os

    sys.stdout.flush()
    sys.stderr.write(f"\ninterrupted: {what}\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)
