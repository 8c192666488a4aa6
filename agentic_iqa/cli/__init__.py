"""`agentic-iqa` command line. Sub-commands live in sibling modules; heavy imports stay inside commands
so that `agentic-iqa --help` does not pay for torch, pyiqa or DSPy."""
from __future__ import annotations

import errno
import os
import sys

import typer

from agentic_iqa.cli import assess as _assess
from agentic_iqa.cli import bench as _bench
from agentic_iqa.cli import compile as _compile
from agentic_iqa.cli import tools as _tools
from agentic_iqa.cli.common import EXIT_OK


class _Cli(typer.Typer):
    """The root app. Calling it (`main()`, `python -m agentic_iqa`) runs the command with the one rule for a reader
    that closes our output early (`agentic-iqa tools list | head -1`, `… 2>&1 | head`): that is not a failure of
    ours, so no traceback, no "Exception ignored … BrokenPipeError", and exit 0.

    Exit 0 rather than 141 (128 + SIGPIPE): the reader leaving is its choice, and whether a write hits the closed
    pipe at all is a race (output that fits in the pipe buffer is accepted before `head` exits), so 141 would make
    `set -o pipefail` scripts fail at random. Not `signal(SIGPIPE, SIG_DFL)` either: that kills the process at the
    first write to a closed pipe, e.g. a batch's progress line on a closed stderr, with items still to assess and
    no clean-up (the run loop's summary, the score cache, Ray)."""

    def __call__(self, *args, **kwargs):
        stderr = sys.stderr
        guarded = _StderrWithoutReader(stderr) if stderr is not None else None
        if guarded is not None:
            sys.stderr = guarded
        try:
            reader_gone, ending, result = False, None, None
            try:
                result = super().__call__(*args, **kwargs)
            except SystemExit as exc:
                # typer (an EPIPE out of the command) and rich (a console's write) end a closed stdout with exit 1,
                # raised while handling the EPIPE. With stderr guarded, that EPIPE was stdout's.
                if _closed_pipe(exc.__context__):
                    reader_gone = True
                else:
                    ending = exc
            except OSError as exc:
                if not _closed_pipe(exc):
                    raise
                reader_gone = True
            # Flush here, not at interpreter exit, where a closed pipe prints "Exception ignored" and exits 120.
            for stream in (sys.stdout, guarded):
                try:
                    if stream is not None:
                        stream.flush()
                except OSError as exc:  # another error (a full disk) is left to the exit's flush, as before
                    reader_gone = reader_gone or (stream is sys.stdout and _closed_pipe(exc))
            if reader_gone:
                _to_devnull(sys.stdout)  # whatever is still buffered, or written at exit, goes nowhere, quietly
                raise SystemExit(EXIT_OK)
            if ending is not None:
                raise ending
            return result
        finally:
            if guarded is not None and sys.stderr is guarded:
                sys.stderr = stderr


class _StderrWithoutReader:
    """sys.stderr while a command runs: if its reader goes away (`… 2>&1 | head -1`), it is pointed at /dev/null
    and the command carries on. Progress lines and notes must not end the work half-way: the first progress line
    after `head` exited ended a batch after one image, an eval and a compile before their results were saved."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as exc:
            if not _closed_pipe(exc):
                raise
            _to_devnull(self._stream)
            return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        try:
            self._stream.flush()
        except OSError as exc:
            if not _closed_pipe(exc):
                raise
            _to_devnull(self._stream)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _closed_pipe(exc) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ESHUTDOWN)


def _to_devnull(stream) -> None:
    """Point `stream`'s file descriptor at /dev/null (its reader is gone) and drop what it still buffers there."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's StringIO): nothing to do
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    try:
        stream.flush()
    except (OSError, ValueError):
        pass


app = _Cli(
    name="agentic-iqa",
    help="Explainable image quality assessment with a planner, an executor and a summarizer over real IQA tools.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(_tools.app, name="tools")
app.command("assess")(_assess.assess_command)
app.command("compile")(_compile.compile_command)
app.add_typer(_compile.fixtures_app, name="fixtures")
app.add_typer(_bench.app, name="bench")
app.command("eval")(_bench.eval_command)


def main() -> None:
    app()
