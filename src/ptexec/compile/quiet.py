"""Compiling without torch's notes for its own developers, in a host's process.

Tracing and AOTInductor warn and log about their own internals (deprecations inside the
compiler, a region that cannot be traced, autotuning statistics), which say nothing to a
user of ptexec. Hiding them means changing process-wide state: ``warnings.filters``, the
``torch`` logger's level, ``sys.stderr``. ``warnings.catch_warnings`` and
``contextlib.redirect_stderr`` save that state and put it back wholesale, which is wrong
in a process with other threads: what another thread added meanwhile is lost, and two
compiles on two threads that overlap leave the second one's changes in place for good
(every later UserWarning of the process ignored, the ``torch`` logger silent).

:func:`quiet` counts the compiles under way instead. The first one in adds exactly its
own filters, level and stream; the last one out removes exactly those (a filter, level or
stream the host set meanwhile is left as the host set it). A child forked while compiles
ran on other threads of its parent puts back what they changed at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["quiet"]

_LOCK = threading.Lock()
_DEPTH = 0
_FILTERS: list[Any] = []  # the filter entries the first compile in added
_LEVEL: int | None = None  # the torch logger's level before it
_STDERR: _Filtered | None = None  # the stream it put in sys.stderr
_CATEGORIES = (UserWarning, FutureWarning, DeprecationWarning)


class _Filtered:
    """stderr without the autotuner's statistics (it writes them unconditionally)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if text.startswith("Autotune Choices Stats:"):
            return len(text)
        return int(self.stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No warnings of torch's internals, no ``torch`` log records below CRITICAL and no
    autotuning statistics on stderr while any compile of the process is in this block."""
    _enter()
    try:
        yield
    finally:
        _leave()


def _enter() -> None:
    global _DEPTH, _LEVEL, _STDERR
    with _LOCK:
        _DEPTH += 1
        if _DEPTH > 1:
            return
        # simplefilter's entries, inserted as it inserts them but without removing an
        # equal one the host has (which leaving would then remove)
        _FILTERS[:] = [("ignore", None, category, None, 0) for category in _CATEGORIES]
        filters: list[Any] = warnings.filters  # type: ignore[assignment]
        filters[:0] = _FILTERS
        warnings._filters_mutated()  # type: ignore[attr-defined]
        logger = logging.getLogger("torch")
        _LEVEL = logger.level
        logger.setLevel(logging.CRITICAL)
        _STDERR = _Filtered(sys.stderr)
        sys.stderr = _STDERR


def _leave() -> None:
    global _DEPTH, _LEVEL, _STDERR
    with _LOCK:
        _DEPTH -= 1
        if _DEPTH > 0:
            return
        ours = {id(f) for f in _FILTERS}
        filters: list[Any] = warnings.filters  # type: ignore[assignment]
        kept = [f for f in filters if id(f) not in ours]
        if len(kept) != len(filters):
            filters[:] = kept
            warnings._filters_mutated()  # type: ignore[attr-defined]
        _FILTERS.clear()
        logger = logging.getLogger("torch")
        if logger.level == logging.CRITICAL and _LEVEL is not None:
            logger.setLevel(_LEVEL)
        if _STDERR is not None and sys.stderr is _STDERR:
            sys.stderr = _STDERR.stream
        _LEVEL = _STDERR = None


def _forked() -> None:
    """In a child of a fork: the compiles under way are other threads' of the parent,
    which never end here (the child kept torch's warnings ignored, the ``torch`` logger
    silent and stderr filtered for good); what they changed is put back as their end
    would put it."""
    global _LOCK, _DEPTH
    _LOCK = threading.Lock()
    if _DEPTH > 0:
        _DEPTH = 1
        _leave()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
