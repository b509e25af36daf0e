"""Loading without garbage-collection pauses.

Loading a program or a method allocates thousands of small objects that all stay alive
(the description of every value and instruction, their statements). Each such burst
makes Python's cyclic collector run, and with torch imported a full collection walks
hundreds of thousands of objects: on a small program that was most of the load time.
:func:`paused` turns the collector off for the burst and back on after (if it was on);
nothing is leaked, collection simply happens later.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused"]


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic garbage collection inside the ``with`` block (reference counting goes on)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
