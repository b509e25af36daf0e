"""A loaded method as data: everything loading produced, and nothing that runs it.

:func:`ptexec.loader.load_state` builds one :class:`MethodState` per loaded method. Runners
(:mod:`ptexec.engine.runner`) execute its chains on its values table; the call envelope
(:class:`ptexec.Method`) validates and binds a call's arguments into that table
(:mod:`ptexec.engine.arguments`) and collects the outputs from it. Tools read it through
this interface only.

The values table ``values`` is the method's memory at run time: ``values[j]`` is value
``j`` of the execution plan (a tensor, a scalar, a tuple of ints; None for what an
instruction or a call fills in). Planned tensors are views of ``buffers``; constants are
views of the program file; unplanned inputs are the caller's tensors during a call and None
between calls.

What other modules build once per method (the steps hooks see, instrumented blocks, an
ETDump layout, the float64 reference) is theirs: each declares a :class:`Kept`, and the
state only holds what it made, so that it lives and dies with the method.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from ..accounting import CallRecord
from ..codegen import Sources
from ..errors import ExecutionError
from ..format import program as p
from ..kernels.registry import Statement
from ..memory import PlannedBuffer
from .meta import MethodMeta
from .specs import InputSpec, OutputSpec

__all__ = ["Kept", "MethodState", "Owned", "PreparedChain", "read_back"]

T = TypeVar("T")


# a tensor of the values table, and the storage and geometry it had when loading ended:
# (tensor, untyped storage, storage offset, sizes, strides)
Owned = tuple[torch.Tensor, Any, int, tuple[int, ...], tuple[int, ...]]


def read_back(t: torch.Tensor) -> Owned:
    """``t``'s storage and geometry now."""
    return (t, t.untyped_storage(), int(t.storage_offset()), tuple(t.shape), t.stride())


@dataclass(eq=False)
class PreparedChain:
    """One chain of the plan, prepared: per instruction its name (``aten::add.out``,
    ``delegate:<id>``, ``move``, ...), the statement that runs it (after the load-time
    rewrites) and the statement as its kernel made it."""

    index: int
    instructions: tuple[p.Instruction, ...]
    names: tuple[str, ...]
    statements: tuple[Statement, ...]
    loaded: tuple[Statement, ...]
    stacktrace: tuple[tuple[p.Frame, ...] | None, ...] | None
    jumps: tuple[int, ...]  # the positions of its jumps (the plan's ``Chain.jumps``)

    @property
    def has_jumps(self) -> bool:
        return bool(self.jumps)

    def frame(self, index: int) -> str | None:
        """The exported call stack of instruction ``index``, outermost call first."""
        trace = self.stacktrace
        if not trace or index >= len(trace) or not trace[index]:
            return None
        frames = trace[index]
        assert frames is not None
        return "\n".join(str(f) for f in frames)


@dataclass(eq=False)
class MethodState:
    """Everything loading a method produced (see the module docstring).

    ``dynamic_scalars``: scalar values an instruction may replace (read at run time);
    ``shared_slots``: unplanned tensor inputs (the caller's memory during a call);
    ``unplanned_outputs``: outputs whose memory the method provides (``OutputSpec.default``),
    which ``out=`` may replace for one call; ``fixed_slots``: the values the load-time
    rewrites made from constants alone (folds, views of constants), see
    :attr:`unviewed_memory`; ``owned``: every tensor made at load, with its
    storage and geometry, for :meth:`restore`; ``sources``: the generated code of the
    method's blocks; ``record``: what the last call did.
    """

    name: str
    plan: p.ExecutionPlan
    path: str  # the plan's path in the file, for messages
    values: list[Any]
    buffers: list[PlannedBuffer]
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    chains: list[PreparedChain]
    dynamic_scalars: frozenset[int]
    meta: MethodMeta
    max_instructions: int
    record: CallRecord
    sources: Sources
    fixed_slots: tuple[int, ...] = ()
    owned: list[Owned] = field(default_factory=list)
    kept: dict[Kept[Any], Any] = field(default_factory=dict)  # see Kept; never read here
    # what the loaded state is a function of (the decoded plan, its index, the load
    # options), for what others keep for loading it again; None: nothing may be kept
    key: Any = None

    @property
    def shared_slots(self) -> list[int]:
        return [s.slot for s in self.inputs if s.kind == "tensor" and s.view is None]

    @functools.cached_property
    def unviewed_memory(self) -> frozenset[int]:
        """The addresses of the storages an output is never handed out as a view of, in
        either output mode: the program's constants and what loading computed from them
        alone (read-only memory, perhaps the caller's ``bytes``, shared by every load of
        the program), and the state buffers the program's methods share (another method's
        call writes them: a view would change without a call on this method). Found on
        first use (a view-mode call), as nothing replaces those slots or buffers."""
        found = {b.data.untyped_storage().data_ptr() for b in self.buffers if b.info.shared}
        plan_values = self.plan.values
        for k, t in enumerate(self.values):
            if isinstance(t, torch.Tensor):
                v = plan_values[k]
                if isinstance(v, p.Tensor) and v.is_constant:
                    found.add(t.untyped_storage().data_ptr())
        for k in self.fixed_slots:
            t = self.values[k]
            if isinstance(t, torch.Tensor):
                found.add(t.untyped_storage().data_ptr())
        found.discard(0)  # no memory at all (an empty tensor): nothing to write through
        return frozenset(found)

    @property
    def unplanned_outputs(self) -> list[OutputSpec]:
        return [o for o in self.outputs if o.kind == "tensor" and not o.planned]

    def snapshot(
        self, made: Sequence[Owned] = (), replaced: Mapping[int, Any] | None = None
    ) -> None:
        """Remember the storage and geometry of every tensor in the values table now (after
        loading), for :meth:`restore`, one entry per slot holding one (in no set order).
        ``made``: entries known already, of tensors whose geometry nothing changed since
        they were made (loading never resizes a tensor: it replaces it in the table).
        ``replaced``: ``made`` holds an entry for every tensor the table held when it was
        made, each in a slot of its own, and these slots hold another object since (the
        object they held then): only those slots are read; None: every slot is."""
        tensor = torch.Tensor
        values = self.values
        if replaced is None:
            known = {id(e[0]): e for e in made}.get
            self.owned = [known(id(t)) or read_back(t) for t in values if isinstance(t, tensor)]
            return
        gone = {id(t) for t in replaced.values()}
        owned = [e for e in made if id(e[0]) not in gone] if gone else list(made)
        for k in replaced:
            t = values[k]
            if isinstance(t, tensor):
                owned.append(read_back(t))
        self.owned = owned

    def restore(self) -> None:
        """After a failed call, give every tensor made at load its memory and geometry
        back: a kernel that failed half-way may have left sizes its memory does not hold
        (torch sets them before it grows the storage), which the next read would overrun.
        Data (the state of stateful programs) and the values table are not touched."""
        for t, storage, offset, sizes, strides in self.owned:
            t.set_(storage, offset, sizes, strides)

    def execution_error(self, e: BaseException, where: Sources | None = None) -> ExecutionError:
        """``e``, raised while running this method, as an :class:`ExecutionError` naming
        the instruction whose generated line failed (found in ``where``, by default the
        method's own blocks), its operator and its exported call stack."""
        found = (where or self.sources).locate(e.__traceback__)
        if found is None:
            return ExecutionError(self.name, -1, "?", f"{type(e).__name__}: {e}")
        c, i = found
        chain = self.chains[c]
        return ExecutionError(
            self.name, i, chain.names[i], f"{type(e).__name__}: {e}", chain.frame(i)
        )

    def instruction_count(self) -> int:
        return sum(len(c.instructions) for c in self.chains)

    def output_slots(self) -> Sequence[int]:
        return [o.slot for o in self.outputs]


class Kept(Generic[T]):
    """Something a module builds once per method, from its state, on first use: calling
    ``kept(state)`` returns it. The module owns the :class:`Kept` (its key) and the type;
    the state holds the object in ``kept`` and knows nothing of it. Being held by the state
    (not by a weak mapping elsewhere), it is freed together with the method, generated code
    and all."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[MethodState], T]) -> None:
        self.make = make

    def __call__(self, state: MethodState) -> T:
        found = state.kept.get(self)
        if found is None:
            found = state.kept[self] = self.make(state)
        return found
