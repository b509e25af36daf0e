"""Zero-copy torch views of memory that may be read-only, without torch's warning about it.

``torch.from_numpy`` and ``torch.frombuffer`` warn, once a process at each of the two
sites, when the memory is not writable. ptexec views read-only memory by design (a
program's constants in bytes or a mapped file, a caller's read-only array, checked before
anything is written), so the warning says nothing to the user. Silencing it means
changing ``warnings.filters``, which is the whole process's: ``catch_warnings`` swaps the
list for a copy and puts the old one back, so a filter another thread adds meanwhile is
lost (and another thread's own ``catch_warnings`` may keep the ``ignore`` for good). So
the filters are changed only around a process's first conversion of read-only memory at a
site (torch's one warning comes then, unless the host's own conversion took it before),
under a lock, and only by inserting one ``ignore`` filter for that warning and removing
exactly it: the list is never replaced, so filters other threads add meanwhile stay.
Every later conversion leaves them alone.
"""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["from_buffer", "from_numpy"]

_LOCK = threading.Lock()
# the filter of torch's one warning ("The given NumPy array is not writable", "The given
# buffer is not writable"), as warnings.filterwarnings would write it
_SILENCED = ("ignore", re.compile(r".*not writable", re.I), UserWarning, None, 0)
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
        filters: list[Any] = warnings.filters  # type: ignore[assignment]
        filters.insert(0, _SILENCED)  # in place: another thread's insertion is kept
        warnings._filters_mutated()  # type: ignore[attr-defined]
        try:
            return make()
        finally:
            # torch warned now, or had warned before (a conversion of the host's own)
            _ISSUED.add(site)
            with contextlib.suppress(ValueError):  # (a host that reset the list took it)
                filters.remove(_SILENCED)
            warnings._filters_mutated()  # type: ignore[attr-defined]


def from_numpy(a: Any) -> torch.Tensor:
    """``torch.from_numpy(a)``: a view of the array's memory, read-only or not."""
    return _quietly("from_numpy", not a.flags.writeable, lambda: torch.from_numpy(a))


def from_buffer(buffer: Any, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """``torch.frombuffer(buffer, dtype=dtype)``: a view of the buffer's memory, read-only
    or not (an empty buffer is refused by torch: callers make empty tensors themselves)."""
    with memoryview(buffer) as view:
        read_only = view.readonly
    return _quietly("frombuffer", read_only, lambda: torch.frombuffer(buffer, dtype=dtype))
