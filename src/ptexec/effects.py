"""What an instruction is, reads and writes, and where a value's bytes are: the one
definition the loader, the engine, the tools, the compiled tier and the memory plan use.

- :func:`kind`: ``kernel``, ``delegate``, ``move``, ``free`` or ``jump_false``.
- :func:`byte_range`: the bytes a planned tensor occupies in its buffer.
- :func:`referenced`: every value a kernel's or delegate's statement can read from the
  values table (what :meth:`~ptexec.kernels.registry.KernelContext.emit` declares).
- :func:`effects` of a prepared statement (a :class:`~ptexec.kernels.registry.Statement`):
  the tensor values whose content it reads, those whose memory it writes in place, the
  slots it gives new objects, and every value it takes from the table (scalars too).
- :func:`file_effects` of an instruction as the file describes it, without loading
  anything (ExecuTorch's conventions: a kernel writes its last argument, and any argument
  it is given twice; a delegate writes the tensors it is first to touch). The memory plan
  (:mod:`ptexec.plan`) uses it, for programs this machine may not be able to load;
  :func:`dynamic_scalars` is the scalars' side of the same conventions, and
  :func:`constants_written` the constants' (whether a program's bytes may be viewed).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .format import program as p
from .format.lru import Lru

if TYPE_CHECKING:
    from .kernels.registry import Statement

__all__ = [
    "KINDS",
    "Effects",
    "byte_range",
    "clear_dynamic_scalars",
    "constants_written",
    "dynamic_scalars",
    "effects",
    "file_effects",
    "kind",
    "referenced",
    "replaced",
    "tensor_items",
]

KINDS = ("kernel", "delegate", "move", "free", "jump_false")
# isinstance against a tuple (not an ``X | Y`` made on every call): these run per value
_TENSOR_LISTS = (p.TensorList, p.OptionalTensorList)
_LISTS = (p.TensorList, p.OptionalTensorList, p.IntList)


def kind(ins: p.Instruction) -> str:
    """What ``ins`` is: one of :data:`KINDS`."""
    if isinstance(ins, p.KernelCall):
        return "kernel"
    if isinstance(ins, p.DelegateCall):
        return "delegate"
    if isinstance(ins, p.MoveCall):
        return "move"
    if isinstance(ins, p.FreeCall):
        return "free"
    return "jump_false"


def byte_range(value: p.EValue) -> tuple[int, int, int] | None:
    """(buffer, first byte, end byte) of a planned tensor in its planned buffer; None for
    any other value (a constant, an unplanned tensor, a scalar)."""
    if not isinstance(value, p.Tensor) or value.allocation_info is None:
        return None
    start = value.allocation_info.memory_offset
    return (value.allocation_info.memory_id, start, start + value.nbytes)


@dataclass(frozen=True, slots=True)
class Effects:
    """``reads``: tensor values whose content is read (every tensor argument that is not
    only written); ``writes``: tensor values whose memory is written in place;
    ``replaces``: value slots given a new object (an in-place op's return slot, its
    mutated argument again, is not); ``written``: every value whose content changes
    (the slots the statement assigns, then the memory it writes); ``inputs``: every value
    the statement takes from the values table, as precisely as the statement says
    (scalars an instruction computes included; a slot it only gives a new object
    excluded)."""

    reads: tuple[int, ...]
    writes: tuple[int, ...]
    replaces: tuple[int, ...]
    written: tuple[int, ...]
    inputs: tuple[int, ...]


NOTHING = Effects((), (), (), (), ())


def tensor_items(values: tuple[p.EValue, ...], index: int) -> list[int]:
    """The tensor values behind value ``index`` (itself, or a tensor list's items)."""
    v = values[index]
    if isinstance(v, p.Tensor):
        return [index]
    if isinstance(v, _TENSOR_LISTS):
        return [i for i in v.items if i >= 0 and isinstance(values[i], p.Tensor)]
    return []


def referenced(
    values: tuple[p.EValue, ...], args: tuple[int, ...], dynamic: Set[int]
) -> tuple[int, ...]:
    """Every value a statement given arguments ``args`` can read from the values table:
    its tensor arguments (the items of tensor lists too) and the scalars among its
    arguments (or their int lists' items) that an instruction computes (``dynamic``);
    literals are rendered into the statement."""
    found: dict[int, None] = {}
    for a in args:
        v = values[a]
        if isinstance(v, p.Tensor):
            found[a] = None
        elif isinstance(v, _TENSOR_LISTS):
            for i in v.items:
                if i >= 0 and isinstance(values[i], p.Tensor):
                    found[i] = None
        elif isinstance(v, p.IntList):
            for i in v.items:
                if i in dynamic:
                    found[i] = None
        elif a in dynamic:
            found[a] = None
    return tuple(found)


def _all_referenced(values: tuple[p.EValue, ...], ins: p.Instruction) -> set[int]:
    """Every value ``ins`` names, list items included (for a statement that does not say
    what it reads)."""
    out: set[int] = set()
    for a in p.instruction_values(ins):
        out.add(a)
        v = values[a]
        if isinstance(v, _LISTS):
            out.update(i for i in v.items if i >= 0)
    return out


def effects(values: tuple[p.EValue, ...], ins: p.Instruction, st: Statement) -> Effects:
    """The effects of ``st``, the statement that runs ``ins``. A statement that does
    nothing (``pass``: work done at load, or nothing to do) has none. ``st.mutates`` None
    means the kernel did not say, read as "every tensor argument"; ``st.reads`` None
    means it did not say what it reads, read as "every value it names"."""
    if st.code.strip() == "pass":
        return NOTHING
    what = kind(ins)
    if what == "move":
        assert isinstance(ins, p.MoveCall)
        return Effects(
            tuple(tensor_items(values, ins.move_from)),
            (),
            (ins.move_to,),
            (ins.move_to,),
            (ins.move_from,),
        )
    tensors = p.tensor_indices(values, p.instruction_values(ins))
    mutated = tensors if st.mutates is None else st.mutates
    outs = set(st.outs)
    reads = tuple(t for t in tensors if t not in outs) if outs else tensors
    writes = tuple(dict.fromkeys((*mutated, *st.outs)))
    replaces = _replaces(st, mutated)
    if what == "jump_false":
        assert isinstance(ins, p.JumpFalseCall)
        inputs: tuple[int, ...] = (ins.cond_value_index,)
    else:
        declared = st.reads if st.reads is not None else _all_referenced(values, ins)
        skip = outs
        if replaces:
            # a slot given a new object is read only when it is an operand too (v7 = v7 + 1)
            operands: set[int] = set()
            if isinstance(ins, p.KernelCall):
                for a in ins.args[:-1]:
                    operands.add(a)
                    item = values[a]
                    if isinstance(item, _LISTS):
                        operands.update(item.items)
            skip = outs | (set(replaces) - operands)
        inputs = tuple(sorted(j for j in declared if j not in skip) if skip else sorted(declared))
    written = tuple(dict.fromkeys((*st.writes, *writes)))
    return Effects(reads, writes, replaces, written, inputs)


def _replaces(st: Statement, mutated: tuple[int, ...]) -> tuple[int, ...]:
    # an in-place op's return slot is its mutated argument again: not a new object
    if not st.writes:
        return ()
    kept = set(mutated)
    return tuple(w for w in st.writes if w not in kept)


def replaced(values: tuple[p.EValue, ...], ins: p.Instruction, st: Statement) -> tuple[int, ...]:
    """``effects(values, ins, st).replaces`` alone (the slots ``st`` gives a new object),
    without working out the rest."""
    if st.code.strip() == "pass":
        return ()
    if isinstance(ins, p.MoveCall):
        return (ins.move_to,)
    if not st.writes:
        return ()
    if st.mutates is not None:
        return _replaces(st, st.mutates)
    return _replaces(st, p.tensor_indices(values, p.instruction_values(ins)))


# by the decoded plan (shared by the loads of the same bytes): a pure function of it
_dynamic: Lru[tuple[p.ExecutionPlan, frozenset[int]]] = Lru(256, 0)
_constants: Lru[tuple[p.ExecutionPlan, frozenset[int]]] = Lru(256, 0)


def clear_dynamic_scalars() -> None:
    """Forget the kept :func:`dynamic_scalars` (and :func:`constants_written`) of plans."""
    _dynamic.clear()
    _constants.clear()


def dynamic_scalars(plan: p.ExecutionPlan) -> frozenset[int]:
    """Scalar values that an instruction may replace, by the file's conventions (a kernel
    writes its last argument, a move its destination, a delegate any of its arguments), so
    that statements read them at run time instead of rendering them as literals."""
    hit = _dynamic.get(id(plan))
    if hit is not None and hit[0] is plan:
        return hit[1]
    found = _dynamic_scalars(plan)
    _dynamic.put(id(plan), (plan, found))  # the plan kept alive: its id stays its own
    return found


def _dynamic_scalars(plan: p.ExecutionPlan) -> frozenset[int]:
    dyn: set[int] = set()
    for chain in plan.chains:
        for ins in chain.instructions:
            if isinstance(ins, p.KernelCall) and ins.args:
                dyn.add(ins.args[-1])
            elif isinstance(ins, p.MoveCall):
                dyn.add(ins.move_to)
            elif isinstance(ins, p.DelegateCall):
                dyn.update(ins.args)
    scalars = (p.Int, p.Double, p.Bool, p.Null, p.String)
    return frozenset(i for i in dyn if isinstance(plan.values[i], scalars))


def file_effects(
    plan: p.ExecutionPlan, ins: p.Instruction, seen: Set[int]
) -> tuple[list[int], list[int]]:
    """(tensor values ``ins`` reads, tensor values it writes) by the file's conventions
    (module docstring); ``seen``: values touched by earlier instructions, for delegates."""
    values = plan.values
    what = kind(ins)
    if what == "kernel":
        assert isinstance(ins, p.KernelCall)
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
    if what == "delegate":
        assert isinstance(ins, p.DelegateCall)
        used = [i for a in ins.args for i in tensor_items(values, a)]
        inputs = set(plan.inputs)
        return (
            [i for i in used if i in seen or i in inputs],
            [i for i in used if i not in seen and i not in inputs],
        )
    if what == "move":
        assert isinstance(ins, p.MoveCall)
        return tensor_items(values, ins.move_from), tensor_items(values, ins.move_to)
    if what == "free":
        return [], []
    assert isinstance(ins, p.JumpFalseCall)
    return tensor_items(values, ins.cond_value_index), []


def constants_written(plan: p.ExecutionPlan) -> frozenset[int]:
    """Constant tensors (data from the program's bytes or a data file) that a kernel or a
    move of ``plan`` may write, by the file's conventions (:func:`file_effects`).
    ExecuTorch's exporter writes none: its constants are read-only memory to its runtime.
    A delegate's constant arguments are its inputs (the loader refuses a delegate whose
    prepared statement writes one)."""
    hit = _constants.get(id(plan))
    if hit is not None and hit[0] is plan:
        return hit[1]
    values = plan.values
    found: set[int] = set()
    for chain in plan.chains:
        for ins in chain.instructions:
            if isinstance(ins, p.DelegateCall):
                continue
            for i in file_effects(plan, ins, frozenset())[1]:
                v = values[i]
                if isinstance(v, p.Tensor) and v.is_constant:
                    found.add(i)
    result = frozenset(found)
    _constants.put(id(plan), (plan, result))  # the plan kept alive: its id stays its own
    return result
