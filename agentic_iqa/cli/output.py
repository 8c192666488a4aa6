"""The root app's rules for an output that cannot be written: a reader that leaves early (`| head -1`) is
not a failure (exit 0, quietly); a stdout that fails otherwise (a full disk) is one line and exit 1; a stderr
that cannot be written never stops the work."""
from __future__ import annotations

import errno
import os
import sys

import typer

from agentic_iqa.cli.common import EXIT_FAILED, EXIT_OK


class GuardedApp(typer.Typer):
    """The root app. Calling it (`main()`, `python -m agentic_iqa`) runs the command with the rules for an output
    that cannot be written.

    A reader that closes our output early (`agentic-iqa tools list | head -1`, `… 2>&1 | head`) is not a failure
    of ours, so no traceback, no "Exception ignored … BrokenPipeError", and exit 0. Exit 0 rather than 141
    (128 + SIGPIPE): the reader leaving is its choice, and whether a write hits the closed pipe at all is a race
    (output that fits in the pipe buffer is accepted before `head` exits), so 141 would make `set -o pipefail`
    scripts fail at random. Not `signal(SIGPIPE, SIG_DFL)` either: that kills the process at the first write to
    a closed pipe, e.g. a batch's progress line on a closed stderr, with items still to assess and no clean-up
    (the run loop's summary, the score cache, Ray).

    A stdout that fails otherwise (`> /dev/full`, a full disk, an I/O error) is a failure: one line on stderr
    naming the stream and the reason, exit 1 (EXIT_FAILED: the work ran, its output could not be delivered, as
    for a --save-trace that cannot be written). What a command saves to files (a batch's results) is written
    before its summary, so it is complete. stderr is another matter: see `_Guarded`."""

    def __call__(self, *args, **kwargs):
        saved = sys.stdout, sys.stderr
        out = _Guarded(saved[0]) if saved[0] is not None else None
        err = _Guarded(saved[1], carry_on=True) if saved[1] is not None else None
        if out is not None:
            sys.stdout = out
        if err is not None:
            sys.stderr = err
        try:
            failed, ending, result = None, None, None  # failed: the OSError that ended writing to stdout
            try:
                result = super().__call__(*args, **kwargs)
            except SystemExit as exc:
                # typer (an EPIPE out of the command) and rich (a console's write) end a closed stdout with exit 1,
                # raised while handling the EPIPE.
                if out is not None and out.error is not None and exc.__context__ is out.error:
                    failed = out.error
                else:
                    ending = exc
            except OSError as exc:
                if out is None or exc is not out.error:  # not stdout's: as before
                    raise
                failed = exc
            # Flush here, not at interpreter exit, where a failing stdout prints "Exception ignored" (exit 120).
            try:
                if out is not None:
                    out.flush()
            except OSError as exc:
                failed = failed or exc
            if err is not None:
                err.flush()
            if failed is not None:
                _to_devnull(saved[0])  # whatever is still buffered, or written at exit, goes nowhere, quietly
                if _closed_pipe(failed):
                    raise SystemExit(EXIT_OK)
                hint = "free some space or " if failed.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)) else ""
                if err is not None:  # the guard: a stderr that cannot be written either raises nothing
                    err.write(f"error: could not write the output to standard output: {failed.strerror or failed} "
                              f"(errno {failed.errno}); {hint}send the output elsewhere\n")
                    err.flush()
                raise SystemExit(EXIT_FAILED)
            if ending is not None:
                raise ending
            return result
        finally:
            sys.stdout, sys.stderr = saved


class _Guarded:
    """sys.stdout or sys.stderr while a command runs. It keeps the OSError its stream last raised (`error`), so
    the root app knows a failure of stdout from any other OSError. With `carry_on` (stderr), a stream that cannot
    be written (its reader gone, `… 2>&1 | head -1`; a full disk, `2>/dev/full`) is pointed at /dev/null and the
    command carries on: progress lines and notes must not end the work half-way (the first progress line after
    `head` exited ended a batch after one image, an eval and a compile before their results were saved; on
    /dev/full a batch saved none)."""

    def __init__(self, stream, carry_on: bool = False):
        self._stream, self._carry_on, self.error = stream, carry_on, None

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        try:
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.error = exc
        if not self._carry_on:
            raise exc
        _to_devnull(self._stream)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _closed_pipe(exc) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ESHUTDOWN)


def _to_devnull(stream) -> None:
    """Point `stream`'s file descriptor at /dev/null (it cannot be written) and drop what it still buffers there."""
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
