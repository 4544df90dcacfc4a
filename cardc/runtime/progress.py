"""Training progress through tqdm: a live bar in a terminal, a few plain lines in a log."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

# The stats ride in tqdm's {desc}; a log line has no bar, only the numbers.
_BAR = "step {n_fmt}/{total_fmt} |{bar}| {desc} | ETA {remaining}"
_PLAIN = "step {n_fmt}/{total_fmt} | {desc} | ETA {remaining}"


class ProgressBar:
    """A tqdm bar when ``stream`` is a terminal; otherwise a plain line every ``plain_every``
    of the run, as CI logs are not terminals and thousands of ``\\r`` redraws would bloat them."""

    def __init__(self, total: int, stream: TextIO | None = None, plain_every: float = 0.1,
                 initial: int = 0) -> None:
        """`initial`: the steps made before (a resumed run's)."""
        self.total = max(total, 1)
        self.stream = stream if stream is not None else sys.stdout
        self.plain_step = max(1, round(self.total * plain_every))
        self._next_plain = (initial // self.plain_step + 1) * self.plain_step
        self._start = time.perf_counter()
        self._bar = tqdm(total=self.total, initial=initial, file=self.stream, bar_format=_BAR,
                         dynamic_ncols=True, leave=True) if _isatty(self.stream) else None

    def update(
        self, step: int, loss: float | None = None, tokens_per_s: float | None = None
    ) -> None:
        """Show progress after ``step`` of ``total`` steps."""
        stats = " | ".join(s for s in (
            None if loss is None else f"loss {loss:.4f}",
            None if tokens_per_s is None else f"{tqdm.format_sizeof(tokens_per_s)} tok/s") if s)
        if self._bar is not None:
            self._bar.set_description_str(stats, refresh=False)
            self._bar.update(step - self._bar.n)
        elif step >= self._next_plain or step >= self.total:
            line = tqdm.format_meter(min(step, self.total), self.total,
                                     time.perf_counter() - self._start, bar_format=_PLAIN,
                                     prefix=stats)
            self.stream.write(line + "\n")
            self.stream.flush()
            self._next_plain = (step // self.plain_step + 1) * self.plain_step

    def clear(self) -> None:
        """Erase the bar so another message can be printed on a clean line; the next update
        draws it again."""
        if self._bar is not None:
            self._bar.clear()

    def close(self) -> None:
        """Leave the last bar on screen and move to a fresh line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def format_duration(seconds: float) -> str:
    """``75`` → ``1m15s``; compact enough for a log line."""
    s = max(0, round(seconds))
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
