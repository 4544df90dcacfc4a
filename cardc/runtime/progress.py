"""A dependency-free terminal progress bar that stays quiet in logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """Redraws one line in a terminal; prints a plain line every ``plain_every`` otherwise.

    CI logs are not terminals, and thousands of ``\\r`` updates would bloat them.
    """

    def __init__(
        self, total: int, stream: TextIO | None = None, width: int = 24, plain_every: float = 0.1
    ) -> None:
        self.total = max(total, 1)
        self.stream = stream if stream is not None else sys.stdout
        self.width = width
        self.tty = _isatty(self.stream)
        self.plain_step = max(1, round(self.total * plain_every))
        self._next_plain = self.plain_step
        self._start = time.perf_counter()
        self._shown = 0  # length of the line on screen, for clearing it

    def update(
        self, step: int, loss: float | None = None, tokens_per_s: float | None = None
    ) -> None:
        """Show progress after ``step`` of ``total`` steps."""
        if self.tty:
            line = self._line(step, loss, tokens_per_s)
            self.stream.write("\r" + line.ljust(self._shown))
            self.stream.flush()
            self._shown = len(line)
        elif step >= self._next_plain or step >= self.total:
            self.stream.write(self._line(step, loss, tokens_per_s) + "\n")
            self.stream.flush()
            self._next_plain = (step // self.plain_step + 1) * self.plain_step

    def clear(self) -> None:
        """Erase the bar so another message can be printed on a clean line."""
        if self.tty and self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0

    def close(self) -> None:
        """Leave the last bar on screen and move to a fresh line."""
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = 0

    def _line(self, step: int, loss: float | None, tokens_per_s: float | None) -> str:
        frac = min(max(step / self.total, 0.0), 1.0)
        filled = round(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        parts = [f"step {step:>{len(str(self.total))}}/{self.total} [{bar}]"]
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        if tokens_per_s is not None:
            parts.append(f"{_si(tokens_per_s)} tok/s")
        parts.append(f"ETA {_eta(time.perf_counter() - self._start, frac)}")
        return " | ".join(parts)


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def _eta(elapsed: float, frac: float) -> str:
    if frac <= 0.0:
        return "?"
    return format_duration(elapsed * (1.0 - frac) / frac)


def format_duration(seconds: float) -> str:
    """``75`` → ``1m15s``; compact enough for a progress line."""
    s = max(0, round(seconds))
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
