"""The native library's functions under their earlier name: the library is
:mod:`ptexec.native` now (the loader uses it too). Kept for code that imports them from
here (``ptexec.engine.native.wait()``)."""

from __future__ import annotations

from ..native import copies, enabled, module, unavailable, wait

__all__ = ["copies", "enabled", "module", "unavailable", "wait"]
