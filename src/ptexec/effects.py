"""What an instruction reads and writes: the one definition the engine and its tools use.

Two views of the same question:

- :func:`effects` of a prepared statement (an :class:`~ptexec.kernels.registry.Statement`):
  the tensor values whose content it reads, those whose memory it writes in place, and
  the slots it replaces with new objects. The load-time rewrites (:mod:`.dataflow`), traces
  and the float64 reference use it.
- :func:`file_effects` of an instruction as the file describes it, without loading
  anything (ExecuTorch's conventions: a kernel writes its last argument, and any argument
  it is given twice; a delegate writes the tensors it is first to touch). The memory plan
  (:mod:`ptexec.plan`) uses it, for programs this machine may not be able to load.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .format import program as p

if TYPE_CHECKING:
    from .kernels.registry import Statement

__all__ = ["Effects", "effects", "file_effects", "tensor_items"]


@dataclass(frozen=True, slots=True)
class Effects:
    """``reads``: tensor values whose content is read; ``writes``: tensor values whose
    memory is written in place; ``replaces``: value slots given a new object."""

    reads: tuple[int, ...]
    writes: tuple[int, ...]
    replaces: tuple[int, ...]

    @property
    def written(self) -> tuple[int, ...]:
        """Every value whose content changes: replaced slots and written memory."""
        return tuple(dict.fromkeys((*self.replaces, *self.writes)))


NOTHING = Effects((), (), ())


def tensor_items(values: tuple[p.EValue, ...], index: int) -> list[int]:
    """The tensor values behind value ``index`` (itself, or a tensor list's items)."""
    v = values[index]
    if isinstance(v, p.Tensor):
        return [index]
    if isinstance(v, p.TensorList | p.OptionalTensorList):
        return [i for i in v.items if i >= 0 and isinstance(values[i], p.Tensor)]
    return []


def effects(values: tuple[p.EValue, ...], ins: p.Instruction, st: Statement) -> Effects:
    """The effects of ``st``, the statement that runs ``ins``. A statement that does
    nothing (``pass``: work done at load) has none. ``st.mutates`` None means the kernel
    did not say, read as "every tensor argument"."""
    if st.code.strip() == "pass":
        return NOTHING
    if isinstance(ins, p.MoveCall):
        return Effects(tuple(tensor_items(values, ins.move_from)), (), (ins.move_to,))
    tensors = p.tensor_indices(values, p.instruction_values(ins))
    writes = tensors if st.mutates is None else st.mutates
    outs = set(st.outs)
    reads = tuple(t for t in tensors if t not in outs)
    return Effects(reads, tuple(dict.fromkeys((*writes, *st.outs))), st.writes)


def file_effects(
    plan: p.ExecutionPlan, ins: p.Instruction, seen: Set[int]
) -> tuple[list[int], list[int]]:
    """(tensor values ``ins`` reads, tensor values it writes) by the file's conventions
    (module docstring); ``seen``: values touched by earlier instructions, for delegates."""
    values = plan.values
    if isinstance(ins, p.KernelCall):
        args = ins.args
        outs: set[int] = set()
        if args:
            outs.update(tensor_items(values, args[-1]))
            if plan.operators[ins.op_index].name == "executorch_prim::et_copy_index":
                outs.update(tensor_items(values, args[0]))  # copies into its first argument
        counts: dict[int, int] = {}
        for a in args:
            counts[a] = counts.get(a, 0) + 1
        outs.update(i for a, c in counts.items() if c > 1 for i in tensor_items(values, a))
        used = [i for a in args for i in tensor_items(values, a)]
        return [i for i in used if i not in outs], sorted(outs)
    if isinstance(ins, p.DelegateCall):
        used = [i for a in ins.args for i in tensor_items(values, a)]
        inputs = set(plan.inputs)
        return (
            [i for i in used if i in seen or i in inputs],
            [i for i in used if i not in seen and i not in inputs],
        )
    if isinstance(ins, p.MoveCall):
        return tensor_items(values, ins.move_from), tensor_items(values, ins.move_to)
    if isinstance(ins, p.FreeCall):
        return [], []
    return tensor_items(values, ins.cond_value_index), []
