"""Progress of a compile: it takes seconds to minutes, so say what is happening.

On a terminal, one status line rewritten in place, whose elapsed time a ticker thread
advances while a region compiles (one region can take a minute). Elsewhere (a log file, a
pipe, CI), one plain line when each step starts and when it finishes, through the
``ptexec.compile`` logger when logging is configured, else on the stream itself.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

__all__ = ["Progress"]

log = logging.getLogger("ptexec.compile")


class Progress:
    """Progress on ``stream`` (stderr by default): a live line on a terminal, plain lines
    elsewhere (module docstring); silent when ``enabled`` is False. Use it as a context
    manager (the ticker stops with it); ``interval`` is the ticker's period in seconds."""

    def __init__(
        self,
        what: str,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled is not False
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.what = what
        self.clock = clock
        self.interval = interval
        self.start_time = clock()
        self._step = ""
        self._step_start = self.start_time
        self._width = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.enabled and self.live:
            self._ticker = threading.Thread(target=self._tick, name="ptexec-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            if self.enabled and self.live and self._width:
                self.stream.write("\n")
                self.stream.flush()
                self._width = 0

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if self._step:
                    self._render()

    def _render(self) -> None:
        """Rewrite the live line (the lock held)."""
        elapsed = self.clock() - self.start_time
        line = f"ptexec: compiling {self.what}: {self._step} ({elapsed:.0f} s)"
        pad = max(self._width - len(line), 0)
        self._width = len(line)
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()

    def _line(self, text: str) -> None:
        if log.hasHandlers() and log.isEnabledFor(logging.INFO):
            log.info("%s", text)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def start(self, step: str) -> None:
        """A step begins (``"compiling region 2/5 (instructions 4-9)"``)."""
        if not self.enabled:
            return
        with self._lock:
            self._step, self._step_start = step, self.clock()
            if self.live:
                self._render()
            else:
                self._line(f"ptexec: compiling {self.what}: {step}")

    def finish(self, result: str) -> None:
        """The current step ended with ``result`` (``"compiled"``, ``"failed"``)."""
        if not self.enabled or self.live:
            return
        with self._lock:
            took = self.clock() - self._step_start
            self._line(f"ptexec: compiling {self.what}: {self._step}: {result} ({took:.1f} s)")

    def done(self, text: str) -> None:
        """The whole compile ended: its summary."""
        if not self.enabled:
            return
        with self._lock:
            self._step = ""
            line = f"ptexec: compiled {self.what}: {text}"
            if not self.live:
                self._line(line)
                return
            pad = max(self._width - len(line), 0)
            self.stream.write("\r" + line + " " * pad + "\n")
            self.stream.flush()
            self._width = 0
