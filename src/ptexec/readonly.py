"""Zero-copy torch views of memory that may be read-only, without torch's warning about it.

``torch.from_numpy`` and ``torch.frombuffer`` warn, once a process at each of the two
sites, when the memory is not writable. ptexec views read-only memory by design (a
program's constants in bytes or a mapped file, a caller's read-only array, checked before
anything is written), so the warning says nothing to the user. Silencing it means
changing ``warnings.filters``, which is the whole process's: ``catch_warnings`` swaps the
list for a copy and puts the old one back, so a filter another thread adds meanwhile is
lost (and another thread's own ``catch_warnings`` may keep the ``ignore`` for good). So
the filters are changed only around the conversion that makes torch issue its one
warning, under a lock; every later conversion leaves them alone.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["from_buffer", "from_numpy"]

_LOCK = threading.Lock()
_ISSUED: set[str] = set()  # the sites whose one warning torch has issued in this process


def _quietly(site: str, read_only: bool, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()``, with torch's warning of ``site`` (issued once a process, for read-only
    memory) kept quiet. Writable memory, and read-only memory once torch has warned,
    leave the filters alone."""
    if not read_only or site in _ISSUED:
        return make()
    with _LOCK:
        if site in _ISSUED:
            return make()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", UserWarning)
            out = make()
        # torch warned now, or had warned before (a conversion of the host's own): never again
        _ISSUED.add(site)
        for w in seen:
            if not (issubclass(w.category, UserWarning) and "not writable" in str(w.message)):
                # not the one this module silences: as it was issued
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        return out


def from_numpy(a: Any) -> torch.Tensor:
    """``torch.from_numpy(a)``: a view of the array's memory, read-only or not."""
    return _quietly("from_numpy", not a.flags.writeable, lambda: torch.from_numpy(a))


def from_buffer(buffer: Any, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """``torch.frombuffer(buffer, dtype=dtype)``: a view of the buffer's memory, read-only
    or not (an empty buffer is refused by torch: callers make empty tensors themselves)."""
    with memoryview(buffer) as view:
        read_only = view.readonly
    return _quietly("frombuffer", read_only, lambda: torch.frombuffer(buffer, dtype=dtype))
