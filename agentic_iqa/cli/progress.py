"""Progress for long commands when the output is not a terminal (CI logs, `nohup`, `| tee`): plain lines,
one per N items or per few seconds, with done/total, rate and ETA. On a terminal the commands use rich's
live bar instead (a bar redrawn in place is unreadable in a log file)."""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class LineProgress:
    """`start(total)`, then `advance(failed=False)` per finished item; `finish()` prints the last line.

    A line is printed when `every_items` items finished since the last line (default: 5 % of the total),
    when `every_seconds` passed since the last line, and at the end:
    `eval: 12/40 (30%) · 0.45 items/s · elapsed 27s · ETA 1m02s · 1 failed`."""

    def __init__(self, label: str, stream: Optional[TextIO] = None, every_items: Optional[int] = None,
                 every_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.label, self.stream, self.clock = label, stream, clock
        self.every_items, self.every_seconds = every_items, every_seconds
        self.total: Optional[int] = None
        self.done = self.failed = 0
        self._t0 = self._last_time = clock()
        self._last_done = 0

    def start(self, total: int) -> None:
        self.total = total
        self._t0 = self._last_time = self.clock()
        if self.every_items is None:
            self.every_items = max(1, total // 20)
        self._write(f"{self.label}: {total} item(s) to assess")

    def advance(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += int(failed)
        now = self.clock()
        if (self.done - self._last_done >= (self.every_items or 1) or now - self._last_time >= self.every_seconds
                or (self.total is not None and self.done >= self.total)):
            self._line(now)

    def finish(self) -> None:
        if self.done != self._last_done:
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self._last_done, self._last_time = self.done, now
        elapsed = now - self._t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.label}: {self.done}/{self.total if self.total is not None else '?'}"]
        if self.total:
            parts[0] += f" ({100 * self.done / self.total:.0f}%)"
        parts.append(f"{rate:.2f} items/s" if rate else "– items/s")
        parts.append(f"elapsed {_duration(elapsed)}")
        if self.total is not None and self.done < self.total:
            parts.append(f"ETA {_duration((self.total - self.done) / rate)}" if rate else "ETA –")
        if self.failed:
            parts.append(f"{self.failed} failed")
        self._write(" · ".join(parts))

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()
