"""Hooks: how tools watch a call without running it themselves.

A tool (a trace, a profile, an ETDump recorder) is a :class:`Hooks` object. The block
compiler builds an instrumented variant of a method's blocks (:mod:`.blocks`) that calls
``before(step, v)`` and ``after(step, v, result)`` around each instruction's statement —
the very statement ``execute`` runs — and the call envelope calls ``begin(v)`` once the
inputs are bound and ``end(v)`` when the last instruction has run. A hook may stop the
call by raising :class:`StopCall` (it propagates unchanged, after the envelope has
restored the method); any other exception raised inside an instruction becomes the
:class:`~ptexec.errors.ExecutionError` that ``execute`` would raise.

A :class:`Step` describes one instruction for the hooks: where it is, what it is, what it
reads and writes (:func:`.effects.effects`), and how ptexec runs it when the load-time
rewrites changed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..effects import effects, kind
from ..format import program as p
from ..kernels.registry import Statement
from ..loader.dataflow import FUSED_AWAY, is_fused
from ..loader.state import Kept, MethodState, PreparedChain

__all__ = ["Hooks", "Step", "StopCall", "steps_of"]


class StopCall(Exception):
    """Raised by a hook to end a call early; the envelope restores the method and
    re-raises it to the tool that asked."""


@dataclass(frozen=True, slots=True)
class Step:
    """One instruction, as the hooks see it.

    ``chain``/``index``: where it is; ``kind``: ``kernel``, ``delegate``, ``move``,
    ``free`` or ``jump_false``; ``name``: the operator, ``delegate:<id>`` or the kind;
    ``frame``: its exported call stack, when the program carries one; ``destination``: a
    jump's target; ``reads``/``writes``: tensor values it reads and values it changes, as
    its kernel made it (``writes`` also lists what a load-time rewrite made it write);
    ``tensor_args``: every tensor it refers to; ``note``: how ptexec runs it when not as
    the file says (``folded at load``, ``view made at load``, ``runs as a view``, ``skips
    outputs nothing reads``, ``runs with the next ones as one``, ``done by a fused
    instruction before it``: then ``writes`` is empty, its values are never written);
    ``statement``/``loaded``: the statement ``execute`` runs and the one its kernel made.
    """

    chain: int
    index: int
    kind: str
    name: str
    frame: str | None
    destination: int | None
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    tensor_args: tuple[int, ...]
    note: str | None
    statement: Statement
    loaded: Statement

    @property
    def is_copy(self) -> bool:
        """A device copy (``et_copy::*``)."""
        return self.name.startswith("et_copy::")


class Hooks:
    """Base class of a tool's hooks; every method does nothing unless overridden.
    ``nodes``: whether the tool takes delegates' node events (:meth:`node`); only then do
    delegate runners that can report them run their slower, reporting variant."""

    nodes = False

    def begin(self, v: list[Any]) -> None:
        """The inputs are bound into values table ``v``; no instruction has run."""

    def before(self, step: Step, v: list[Any]) -> None:
        """``step`` is about to run."""

    def after(self, step: Step, v: list[Any], result: Any) -> None:
        """``step`` ran; ``result`` is a jump's condition (None for other instructions)."""

    def node(self, name: str, start: int, end: int) -> None:
        """A node of the delegate call now running (between its ``before`` and ``after``)
        ran from ``start`` to ``end`` (:func:`time.perf_counter_ns`); ``name`` says which
        (``FullyConnected #2``: its type, and its place among the nodes of that type).
        Delegates whose runner knows its nodes report them; others report none."""

    def end(self, v: list[Any]) -> None:
        """The last instruction ran; the outputs are about to be collected."""


def _note(
    values: list[Any], executed: Statement, loaded: Statement, writes: tuple[int, ...]
) -> str | None:
    if executed is loaded:
        return None
    if executed is FUSED_AWAY:
        return "done by a fused instruction before it"
    if is_fused(executed):
        return "runs with the next ones as one"
    if executed.code.strip() != "pass":
        if set(executed.outs) < set(loaded.outs):
            return "skips outputs nothing reads"
        if executed.outs and executed.outs == loaded.outs:
            return "copies a view made once"  # the same writes, from a held view
        return "runs as a view"
    if loaded.code.strip() == "pass":
        return None
    alias = loaded.alias
    if alias is not None and isinstance(values[alias.source], torch.Tensor):
        base = values[alias.source].untyped_storage().data_ptr()
        if all(
            isinstance(values[w], torch.Tensor) and values[w].untyped_storage().data_ptr() == base
            for w in writes
        ):
            return "view made at load"
    return "folded at load"


def _chain_steps(state: MethodState, chain: PreparedChain) -> list[Step]:
    values = state.plan.values
    out = []
    for i, ins in enumerate(chain.instructions):
        executed, loaded = chain.statements[i], chain.loaded[i]
        source = effects(values, ins, loaded)
        ran = effects(values, ins, executed)
        if executed is FUSED_AWAY:
            writes: tuple[int, ...] = ()  # its values are never written
        elif executed.code.strip() != "pass":
            writes = ran.written
        else:
            writes = source.written
        out.append(
            Step(
                chain=chain.index,
                index=i,
                kind=kind(ins),
                name=chain.names[i],
                frame=chain.frame(i),
                destination=ins.destination_instruction
                if isinstance(ins, p.JumpFalseCall)
                else None,
                reads=source.reads,
                writes=writes,
                tensor_args=p.tensor_indices(values, p.instruction_values(ins)),
                note=_note(state.values, executed, loaded, writes),
                statement=executed,
                loaded=loaded,
            )
        )
    return out


def _steps(state: MethodState) -> list[list[Step]]:
    return [_chain_steps(state, chain) for chain in state.chains]


steps_of = Kept(_steps)
"""``steps_of(state)``: the :class:`Step` of every instruction, per chain (made once per
method)."""
