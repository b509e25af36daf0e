"""Progress of a compile, on a terminal: it takes seconds, so say what is happening."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """One status line on ``stream`` (stderr by default), rewritten in place; silent when
    the stream is not a terminal (or ``enabled`` is False)."""

    def __init__(self, what: str, stream: TextIO | None = None, enabled: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.what = what
        self.start = time.perf_counter()
        self._width = 0

    def update(self, text: str) -> None:
        if not self.enabled:
            return
        line = f"ptexec: compiling {self.what}: {text} ({time.perf_counter() - self.start:.0f} s)"
        pad = max(self._width - len(line), 0)
        self._width = len(line)
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()

    def done(self, text: str) -> None:
        if not self.enabled:
            return
        line = f"ptexec: compiled {self.what}: {text}"
        pad = max(self._width - len(line), 0)
        self.stream.write("\r" + line + " " * pad + "\n")
        self.stream.flush()
        self._width = 0
