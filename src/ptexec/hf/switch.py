"""Run code written for ExecuTorch's Python runtime on ptexec, unchanged.

After :func:`use_as_executorch` (or with ``PTEXEC_AS_EXECUTORCH=1`` in the environment
when ``ptexec`` is imported), importing ExecuTorch's runtime modules gives ptexec's::

    executorch.runtime                              -> ptexec.runtime
    executorch.extension.pybindings.portable_lib    -> ptexec.portable_lib
    executorch.extension.pybindings._portable_lib   -> ptexec.portable_lib
    executorch.extension.llm.runner                 -> ptexec.llm
    executorch.extension.llm.runner._llm_runner     -> ptexec.llm

Everything else of the installed ``executorch`` package stays ExecuTorch's own: the
exporter (``executorch.exir``, ``executorch.export``), its backends' partitioners, the
quantized operators' registration, devtools, and the C++ extension ``_C`` that those
load. The names resolve through an import hook placed first on ``sys.meta_path``, so the
switch costs nothing until one of them is imported; a module already imported under one of
the names is replaced in ``sys.modules`` and on its package. A module that already took a
name *from* the real runtime (``from executorch.runtime import Runtime`` before the
switch) keeps what it took: turn the switch on first, or run the program with
``python -m ptexec.hf script.py`` which does. The switch is the process's: a child it
starts (a spawned worker, a Python subprocess) imports ExecuTorch's own runtime unless it
turns the switch on itself.

``device`` sets where programs loaded through ``portable_lib`` without a device of their
own are placed (a ``device_map``, as :meth:`ptexec.Program.load_method` takes it): the
choice optimum-executorch's loaders do not offer. ``PTEXEC_AS_EXECUTORCH_DEVICE`` gives
it from the environment.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["ALIASES", "ENV_DEVICE", "ENV_SWITCH", "is_active", "use_as_executorch"]

ENV_SWITCH = "PTEXEC_AS_EXECUTORCH"
ENV_DEVICE = "PTEXEC_AS_EXECUTORCH_DEVICE"

#: ExecuTorch's module name -> the ptexec module that stands for it.
ALIASES: dict[str, str] = {
    "executorch.runtime": "ptexec.runtime",
    "executorch.extension.pybindings.portable_lib": "ptexec.portable_lib",
    "executorch.extension.pybindings._portable_lib": "ptexec.portable_lib",
    "executorch.extension.llm.runner": "ptexec.llm",
    # the bindings' own module (its Audio, RawAudio, stub file), imported by name too
    "executorch.extension.llm.runner._llm_runner": "ptexec.llm",
}

_lock = threading.Lock()


class _AliasLoader(importlib.abc.Loader):
    """Gives the ptexec module itself as the module of the aliased name."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self._target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # the import system set the alias's spec on the module: the module keeps its own
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the aliased names (and nothing else) before any other finder."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        aliased = ALIASES.get(fullname)
        if aliased is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(aliased))


_FINDER = _AliasFinder()


def is_active() -> bool:
    """Whether ExecuTorch's runtime names resolve to ptexec's modules in this process."""
    return _FINDER in sys.meta_path


def use_as_executorch(*, device: Any = None) -> None:
    """Make ``executorch.runtime``, ``executorch.extension.pybindings.portable_lib`` (and
    ``_portable_lib``) and ``executorch.extension.llm.runner`` resolve to ptexec's modules
    in this process; the rest of ``executorch`` stays real. Idempotent. ``device``: where
    ``portable_lib``'s loaders place programs by default (``"cuda"``, ``"cuda:1"``, a
    ``{from: to}`` map; None leaves each program on the devices it names)."""
    with _lock:
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        for name in ALIASES:
            if name in sys.modules:
                _replace(name)
    if device is not None:
        from .. import portable_lib

        portable_lib.set_default_device(device)


def _replace(name: str) -> None:
    """Point an already imported ``name`` (and its package's attribute) at ptexec's module."""
    module = importlib.import_module(ALIASES[name])
    sys.modules[name] = module
    parent_name, _, attr = name.rpartition(".")
    parent = sys.modules.get(parent_name)
    if parent is not None:
        setattr(parent, attr, module)


def from_environment() -> None:
    """Turn the switch on when ``PTEXEC_AS_EXECUTORCH`` is ``1`` (``true``, ``yes``, ``on``);
    called when ``ptexec`` is imported. Any other non-empty value than those and ``0``,
    ``false``, ``no``, ``off`` is a ``ValueError`` naming the variable."""
    value = os.environ.get(ENV_SWITCH, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return
    if value not in ("1", "true", "yes", "on"):
        raise ValueError(f"{ENV_SWITCH} must be 1 or 0 (true/false), not {value!r}")
    device = os.environ.get(ENV_DEVICE, "").strip() or None
    use_as_executorch(device=device)


def run_script(argv: Sequence[str]) -> None:
    """``python -m ptexec.hf script.py args...``: run a script (or ``-m module``, or
    ``-c code``) with the switch on, as ``python`` would run it."""
    import runpy

    use_as_executorch(device=os.environ.get(ENV_DEVICE, "").strip() or None)
    if not argv:
        raise SystemExit(
            "usage: python -m ptexec.hf script.py [args...] | -m module [args...] | -c code "
            "[args...]"
        )
    if argv[0] == "-c":
        if len(argv) < 2:
            raise SystemExit("usage: python -m ptexec.hf -c code [args...]")
        sys.argv = ["-c", *argv[2:]]  # as python gives them
        sys.path[0] = ""  # python -c puts the working directory first
        main = types.ModuleType("__main__")
        # the namespace python -c gives its code: builtins as the module (this module's
        # own __builtins__ is a dict), an empty __annotations__, the builtin importer
        main.__dict__.update(
            __builtins__=builtins,
            __annotations__={},
            __loader__=importlib.machinery.BuiltinImporter,
        )
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("usage: python -m ptexec.hf -m module [args...]")
        sys.argv = list(argv[1:])
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        # the main script's __file__ as python gives it: absolute, not normalized
        script = os.path.join(os.getcwd(), argv[0])
        sys.argv = list(argv)
        if os.path.isfile(script):
            # python puts the script's folder (its links resolved) first on the path, where
            # ``-m`` put the working directory (a folder or zip run_path puts there itself)
            sys.path[0] = os.path.dirname(os.path.realpath(script))
        runpy.run_path(script, run_name="__main__")
