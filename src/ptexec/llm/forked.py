"""Runners in a child of a fork.

A runner's lock is held for a whole generation. A process forked while a generation ran
on another thread (a host forking workers beside a thread that serves) holds a copy of
the runner whose lock nothing in the child will ever release, and whose context (the
position, the KV cache, the method's memory) is as that generation left it half-way: its
next call waited for ever. :func:`watch` registers a runner; in such a child its lock is
replaced by one that refuses every call with :class:`~ptexec.errors.StateError`, naming
why (a new runner there works).
"""

from __future__ import annotations

import os
import weakref
from types import TracebackType
from typing import Any

from ..errors import StateError

__all__ = ["watch"]

# every live runner (an object whose calls take ``self._lock``)
_runners: weakref.WeakSet[Any] = weakref.WeakSet()


def watch(runner: Any) -> None:
    """Have ``runner`` refuse its calls in a child forked while its lock was held."""
    _runners.add(runner)


class _Refusing:
    """In place of a lock whose holder does not exist in this process: entering it raises."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        raise StateError(
            f"this {self.kind} was generating on another thread when this process was "
            "forked: that generation never ends here, and its context is as it left it; "
            "make a new runner in this process"
        )

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


def _forked() -> None:
    for runner in list(_runners):
        lock = runner._lock
        if lock.acquire(blocking=False):  # free (or this thread's own, reentrant)
            lock.release()
            continue
        runner._lock = _Refusing(type(runner).__name__)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
