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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..accounting import CallRecord
from ..codegen import Sources
from ..device import CPU, Device
from ..errors import ExecutionError
from ..format import program as p
from ..kernels.registry import Emission
from ..loader.meta import MethodMeta, ValueInfo
from ..memory import PlannedBuffer
from ..tensor import TensorInfo

if TYPE_CHECKING:
    from .blocks import CompiledChain
    from .hooks import Step

__all__ = ["ChainState", "InputSpec", "MethodState", "OutputSpec"]


class InputSpec:
    """How input ``index`` (value ``slot``) is bound: its description, and for a tensor the
    planned view it is copied into (None: the caller's memory is used in place)."""

    __slots__ = (
        "device",
        "dim_order",
        "dtype",
        "fast_shape",
        "index",
        "info",
        "kind",
        "scalar",
        "scratch",
        "slot",
        "torch_device",
        "view",
        "written",
    )

    def __init__(self, index: int, slot: int) -> None:
        self.index = index
        self.slot = slot
        self.kind = "tensor"  # or the scalar kind: int, float, bool, str, none
        self.written = False  # an instruction writes the input's memory in place
        self.info: TensorInfo | None = None
        self.scalar: Any = None  # the traced value of a scalar input
        self.view: torch.Tensor | None = None  # planned view (planned inputs)
        self.scratch: torch.Tensor | None = None  # reused copy target (unplanned, converted)
        self.dtype: torch.dtype | None = None
        self.fast_shape: tuple[int, ...] | None = None  # exact static shape, if any
        self.torch_device: torch.device | None = None
        self.device: Device = CPU
        self.dim_order: tuple[int, ...] = ()


class OutputSpec:
    """Output ``index`` (value ``slot``): its description, whether the program plans its
    memory, and the memory the method gives an unplanned one between calls."""

    __slots__ = ("default", "index", "info", "kind", "planned", "slot")

    def __init__(self, index: int, slot: int) -> None:
        self.index = index
        self.slot = slot
        self.kind = "tensor"
        self.info: ValueInfo | None = None
        self.planned = False
        self.default: torch.Tensor | None = None


@dataclass(eq=False)
class ChainState:
    """One chain of the plan, prepared: per instruction its name (``aten::add.out``,
    ``delegate:<id>``, ``move``, ...), the statement that runs it (after the load-time
    rewrites) and the statement as its kernel made it."""

    index: int
    instructions: tuple[p.Instruction, ...]
    names: tuple[str, ...]
    statements: tuple[Emission, ...]
    loaded: tuple[Emission, ...]
    stacktrace: tuple[tuple[p.Frame, ...] | None, ...] | None

    @property
    def has_jumps(self) -> bool:
        return any(isinstance(ins, p.JumpFalseCall) for ins in self.instructions)

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
    which ``out=`` may replace for one call; ``owned``: every tensor made at load, with its
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
    chains: list[ChainState]
    dynamic_scalars: frozenset[int]
    meta: MethodMeta
    max_instructions: int
    record: CallRecord
    sources: Sources
    owned: list[tuple[torch.Tensor, Any, int, tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=list
    )
    # made on first use by the tools' machinery (never by a plain call)
    steps: list[list[Step]] | None = None
    instrumented: list[CompiledChain] | None = None
    caches: dict[str, Any] = field(default_factory=dict)  # what tools build once per method

    @property
    def shared_slots(self) -> list[int]:
        return [s.slot for s in self.inputs if s.kind == "tensor" and s.view is None]

    @property
    def unplanned_outputs(self) -> list[OutputSpec]:
        return [o for o in self.outputs if o.kind == "tensor" and not o.planned]

    def snapshot(self) -> None:
        """Remember the storage and geometry of every tensor in the values table now (after
        loading), for :meth:`restore`."""
        self.owned = [
            (t, t.untyped_storage(), int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))
            for t in self.values
            if isinstance(t, torch.Tensor)
        ]

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
