"""Reading a file the caller named: regular files only, size-capped, never a hang.

A FIFO, a character device (/dev/zero), a socket or a directory given as an image, reference or tool file
gets a one-line error at once: the file is opened non-blocking (so opening a FIFO without a writer cannot
hang), checked with fstat on that same descriptor, and read up to its cap plus one byte.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_IMAGE_FILE_BYTES = 1 << 30  # 1 GiB: a 90 MP 16-bit PNG is ~0.5 GB; the pixel guard applies after decoding
MAX_TOOL_FILE_BYTES = 1 << 20  # 1 MiB: the bundled tools.yaml is ~20 KB


class FileTooLarge(ValueError):
    """`read_regular_file`'s refusal of a file over its byte cap (a ValueError like its other refusals), so a
    caller can add advice for that case without reading the message."""


def read_regular_file(path: Path | str, label: str, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of `path`; OSError-free: raises ValueError(message) naming `label` and what to do
    (FileTooLarge, a ValueError, when the file is over `max_bytes`)."""
    path = Path(path).expanduser()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ValueError(f"{label}: file not found; check the path") from None
    except IsADirectoryError:
        raise ValueError(f"{label}: is a directory, not {what}") from None
    except PermissionError:
        raise ValueError(f"{label}: permission denied; make the file readable (chmod +r)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # named as what it is, with the fix (the same words as a manifest row's)
            raise ValueError(f"{label}: symlink loop (too many levels of symbolic links); fix or remove the link") from None
        raise ValueError(f"{label}: cannot be opened ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ValueError(f"{label}: is a directory, not {what}")
        if not stat.S_ISREG(info.st_mode):
            kind = "a FIFO (named pipe)" if stat.S_ISFIFO(info.st_mode) else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file"
            raise ValueError(f"{label}: is {kind}, not a regular file; save it to a regular file and pass that")
        if info.st_size > max_bytes:
            raise FileTooLarge(f"{label}: {info.st_size:,} bytes exceeds the {max_bytes:,}-byte limit for {what}")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 24, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise FileTooLarge(f"{label}: grew beyond the {max_bytes:,}-byte limit for {what} while being read")
        return b"".join(chunks)
    except OSError as exc:
        raise ValueError(f"{label}: cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def yaml_error_line(exc: Exception) -> str:
    """A PyYAML error as one line: "line L, column C: <problem> (<context>)". PyYAML's own text spans
    several lines and names "<unicode string>" instead of the file."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or ""
    context = getattr(exc, "context", None) or ""
    if mark is None or not (problem or context):
        return " ".join(str(exc).split())
    what = problem + (f" ({context})" if context and problem else context)
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
