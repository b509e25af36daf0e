"""Generated Python: compiled once, shown in tracebacks, forgotten with its owner.

ptexec turns a program's instructions (and a delegate's graph) into Python source at load.
Everything that does so compiles through :class:`Sources`: each piece gets a unique file
name (so a traceback names the method, the chain and the block), is registered with
:mod:`linecache` (so the traceback shows the generated line), and keeps a map from its
lines to the instructions they run (so a failure names its instruction). When the owner of
a :class:`Sources` is freed, its entries leave :mod:`linecache`: loading and freeing
methods in a loop leaves nothing behind.
"""

from __future__ import annotations

import itertools
import linecache
import types
import weakref
from collections.abc import Mapping
from typing import Any

__all__ = ["Sources"]

_NAMES = itertools.count()


def _forget(filenames: list[str]) -> None:
    for name in filenames:
        linecache.cache.pop(name, None)


class Sources:
    """The generated code of one owner (a loaded method, a delegate runner).

    ``label`` names the owner in every file name (a NUL byte, which :func:`compile` refuses
    in a file name, is escaped). :meth:`compile` returns the namespace the source defined;
    :meth:`locate` maps a traceback back to the ``(chain, instruction)`` whose line failed.
    """

    def __init__(self, label: str) -> None:
        self.label = label.replace("\0", "\\x00")
        self._files: list[str] = []
        self._lines: dict[str, tuple[int, Mapping[int, int]]] = {}
        self._finalizer = weakref.finalize(self, _forget, self._files)

    def compile(
        self,
        source: str,
        what: str,
        env: Mapping[str, Any] | None = None,
        *,
        chain: int = 0,
        lines: Mapping[int, int] | None = None,
    ) -> dict[str, Any]:
        """Compile and run ``source`` in a namespace made from ``env``; return it.

        ``what`` says which piece it is (``"chain 0 block 2"``); ``lines`` maps a 1-based
        line of ``source`` to the instruction of ``chain`` it runs."""
        filename = f"<ptexec #{next(_NAMES)} {self.label} {what}>"
        code = compile(source, filename, "exec")
        namespace: dict[str, Any] = dict(env or {})
        namespace["__ptexec_sources__"] = self  # the code keeps its sources registered
        exec(code, namespace)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        self._files.append(filename)
        if lines:
            self._lines[filename] = (chain, lines)
        return namespace

    def locate(self, tb: types.TracebackType | None) -> tuple[int, int] | None:
        """The innermost ``(chain, instruction)`` of this owner's code in traceback ``tb``."""
        found = None
        while tb is not None:
            where = self._lines.get(tb.tb_frame.f_code.co_filename)
            if where is not None:
                index = where[1].get(tb.tb_lineno)
                if index is not None:
                    found = (where[0], index)
            tb = tb.tb_next
        return found

    @property
    def filenames(self) -> tuple[str, ...]:
        return tuple(self._files)

    def close(self) -> None:
        """Forget every source now (also done when this object is freed)."""
        self._finalizer()
