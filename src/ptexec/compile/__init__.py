"""The compiled tier: a method's straight-line regions compiled with AOTInductor.

``Program.load_method(name, compile=True)`` runs a method through
:class:`~.runner.CompiledRunner`: its instructions rebuilt as functional torch code
(:mod:`.functional`), grouped into regions between control-flow instructions
(:mod:`.regions`), traced with ``torch.export`` (:mod:`.graph`), compiled for the
method's device with AOTInductor (:mod:`.aoti`) and kept in an on-disk cache
(:mod:`.cache`), so that a second load compiles nothing. Everything else (validation,
placement, outputs, errors, state) is the interpreter's call envelope, unchanged.
``Method.compile_report`` (:class:`~.report.CompileReport`) says what runs compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cache import cache_dir
from .report import CompileReport, CompileWarning
from .runner import CompiledRunner, CompileOptions

if TYPE_CHECKING:
    from ..loader.state import MethodState
    from ..program import Program

__all__ = [
    "CompileOptions",
    "CompileReport",
    "CompileWarning",
    "CompiledRunner",
    "cache_dir",
    "compiled_runner",
]


def compiled_runner(
    state: MethodState, program: Program, option: bool | CompileOptions, cuda_graph: bool = False
) -> CompiledRunner:
    """The runner ``Method(..., compile=option)`` uses (``True`` or a :class:`CompileOptions`)."""
    if cuda_graph:
        raise ValueError("compile and cuda_graph cannot be combined: choose one runner")
    if not isinstance(option, CompileOptions | bool):
        raise ValueError(f"compile must be a bool or a CompileOptions, not {option!r}")
    return CompiledRunner(state, program, option if isinstance(option, CompileOptions) else None)
