"""The values table of a method: every value of its plan as what runs on it.

Planned tensors become views of their buffer (initialised from the file's mutable data
segment or the external data file when the buffer is new), constants views of the
program's bytes (moved to their device when it is not the CPU), unplanned tensors that are
not inputs get memory of their own on their device, scalars their value, and int lists
tuples of their items. Unplanned inputs and the lists a kernel renders per use are None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from .. import native
from ..dtypes import CODE_TO_DTYPE
from ..errors import LimitExceededError, PteFormatError
from ..format import program as p
from ..format.lru import Key, Lru
from ..format.scalar_type import scalar_type_name
from ..memory import PlannedBuffer, check_aligned, empty_maker, fixed_empty
from ..tensor import dim_order_strides
from .devices import DeviceMap, check_device_available
from .state import Owned, read_back

if TYPE_CHECKING:
    from ..program import Program

__all__ = ["build_values", "clear_recipes", "scalar_type_dtype", "tensor_dtype"]

# torch's quantized dtypes: a tensor of one needs quantizer parameters a program lacks
_QUANTIZED = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4})


def tensor_dtype(t: p.Tensor, path: str) -> torch.dtype:
    """The torch dtype of program tensor ``t``; a :class:`PteFormatError` for scalar types
    ptexec cannot hold."""
    return scalar_type_dtype(t.scalar_type, f"{path}.scalar_type")


def scalar_type_dtype(code: int, where: str) -> torch.dtype:
    """The torch dtype of a tensor a file describes with scalar type ``code`` (at
    ``where``); a :class:`PteFormatError` for scalar types ptexec cannot hold: those torch
    lacks, and torch's quantized types (a tensor of one needs its scale and zero point)."""
    dtype = CODE_TO_DTYPE.get(code)
    if dtype is None:
        raise PteFormatError(where, f"{scalar_type_name(code)} has no torch dtype")
    if dtype in _QUANTIZED:
        raise PteFormatError(
            where,
            f"{scalar_type_name(code)} is a quantized type whose scale and zero point the "
            "file does not carry; ptexec does not run such tensors",
        )
    return dtype


def _from_bytes(
    program: Program, data: memoryview, t: p.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    strides = dim_order_strides(t.sizes, t.dim_order)
    if t.nbytes == 0:
        return torch.empty_strided(t.sizes, strides, dtype=dtype)
    return _typed(program.tensor_from_memory(data), dtype, t.sizes, strides)


def _typed(
    raw: torch.Tensor, dtype: torch.dtype, sizes: Sequence[int], strides: Sequence[int]
) -> torch.Tensor:
    """``raw`` (a constant's bytes, uint8) seen as ``dtype`` with ``sizes`` and ``strides``."""
    if raw.data_ptr() % dtype.itemsize:
        raw = raw.clone()  # misaligned in the file: one copy, rather than a bad view
    return raw.view(dtype).as_strided(sizes, strides)


class _Planned(NamedTuple):
    """How to make planned tensor ``slot``: a view of buffer ``memory_id`` at element
    ``offset``; ``init``: its initial state is read from the file when the buffer is new."""

    slot: int
    memory_id: int
    offset: int
    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    init: bool


class _Constant(NamedTuple):
    """How to make constant ``slot`` of the program's own bytes, on the CPU: a view of
    constant ``data`` (``nbytes`` bytes, more than none) as ``dtype``, ``sizes`` and
    ``strides``."""

    slot: int
    data: int
    nbytes: int
    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Recipe:
    """What building the values table of a plan decided that depends on the plan and the
    device map alone: the scalars, how to make each planned tensor (its dtype, geometry
    and alignment checked), and the tensors made per load (constants, unplanned), in the
    order of the plan's values. Kept only for plans whose values passed every check."""

    plan: p.ExecutionPlan
    template: tuple[Any, ...]
    # made per load: an int, the slot of a tensor made as on the first load
    tensors: tuple[_Planned | _Constant | int, ...]
    int_lists: tuple[tuple[int, tuple[int, ...]], ...]
    # the planned views as one object of the native library, the other tensors, and the
    # planned ones initialised when their buffer is new (made with the recipe, or on first
    # use if the library was not ready then; False: it could not be made)
    native: list[
        tuple[Any, tuple[_Constant | int, ...], tuple[_Planned, ...]] | Literal[False] | None
    ] = field(default_factory=lambda: [None], compare=False)


def _native_views(
    recipe: _Recipe,
) -> tuple[Any, tuple[_Constant | int, ...], tuple[_Planned, ...]] | None:
    """``recipe``'s planned views as the native library's ``Views``, with the tensors it
    does not make; None without the library."""
    if not native.enabled():  # (turned off since the recipe was made)
        return None
    split = recipe.native[0]
    if split is None:
        lib = native.module()
        if lib is None:
            return None
        planned = [t for t in recipe.tensors if isinstance(t, _Planned)]
        try:
            views = lib.Views(
                [(t.slot, t.memory_id, t.offset, t.dtype, t.sizes, t.strides) for t in planned]
            )
        except (RuntimeError, ValueError, TypeError):
            split = recipe.native[0] = False
            return None
        rest = tuple(t for t in recipe.tensors if not isinstance(t, _Planned))
        split = recipe.native[0] = (views, rest, tuple(t for t in planned if t.init))
    return split if isinstance(split, tuple) else None


# recipes, by the decoded plan (shared by the loads of the same bytes) and the device map
_recipes: Lru[_Recipe] = Lru(256, 0)


def clear_recipes() -> None:
    """Forget the kept recipes of values tables."""
    _recipes.clear()


def build_values(
    program: Program,
    plan: p.ExecutionPlan,
    path: str,
    dmap: DeviceMap,
    buffers: list[PlannedBuffer],
    fresh: set[int],
    max_unplanned_bytes: int,
) -> tuple[list[Any], list[Owned]]:
    """The values table of ``plan`` (module docstring), and the storage and geometry of
    each tensor in it as made (:meth:`~.state.MethodState.snapshot`'s ``made``: every
    tensor of the table, each in one slot). ``fresh``: buffers allocated for this method
    (their state is initialised); unplanned tensors of bounded shape may take at most
    ``max_unplanned_bytes`` together. What the table is, as far as the plan and the device
    map decide, is its recipe (:class:`_Recipe`): made and checked on the first load of a
    plan, kept for the next; every load makes its tensors from it."""
    key = Key(id(plan), dmap.key)
    recipe = _recipes.get(key)
    if recipe is None or recipe.plan is not plan:
        recipe = _recipe(plan, path, dmap)
        _recipes.put(key, recipe)  # the plan kept alive: its id stays its own
    return _replay(recipe, program, path, dmap, buffers, fresh, max_unplanned_bytes)


def _initialise(
    program: Program,
    value: p.Tensor,
    view: torch.Tensor,
    dtype: torch.dtype,
    tpath: str,
    fresh: bool,
) -> None:
    """Copy the initial state of planned tensor ``value`` into ``view`` where its buffer is
    ``fresh`` (new for this load). A buffer an earlier load made (state shared between
    methods) keeps what it holds; an external initial value must still be in the data,
    as ExecuTorch's runtime reads it on every method's load and refuses a method whose
    data lacks it."""
    if value.is_external:
        init = program.external_bytes(value, tpath)
    elif fresh:
        init = program.pte.mutable_initial_value(value.data_buffer_idx, value.nbytes)
    else:
        return
    if fresh:
        view.copy_(_from_bytes(program, init, value, dtype))


class _Unplanned:
    """Makes the tensors of a values table that are not views of a planned buffer."""

    __slots__ = ("bytes", "dmap", "limit", "name", "program")

    def __init__(self, program: Program, name: str, dmap: DeviceMap, limit: int) -> None:
        self.program = program
        self.name = name
        self.dmap = dmap
        self.limit = limit
        self.bytes = 0

    def make(self, j: int, value: p.Tensor, dtype: torch.dtype, tpath: str) -> Any:
        """Constant ``j`` as a view of the file (on its device), None for an unplanned
        input, memory of its own for other unplanned tensors."""
        device = self.dmap.label(value)
        name = self.name
        if value.is_constant:
            if value.is_external:
                data = self.program.external_bytes(value, tpath)
            else:
                data = self.program.pte.constant(value.data_buffer_idx, value.nbytes)
            const = _from_bytes(self.program, data, value, dtype)
            if not device.is_cpu:
                check_device_available(device, name, f"constant {j}")
                const = const.to(device.to_torch())
            return const
        # unplanned, not an input: the runtime provides memory on its device
        check_device_available(device, name, f"unplanned tensor {j}")
        unbound = value.shape_dynamism == p.DYNAMIC_UNBOUND
        if unbound:
            sizes = tuple(0 for _ in value.sizes)
        else:
            sizes = value.sizes
            self.bytes += value.nbytes
        if self.bytes > self.limit:
            raise LimitExceededError(
                f"method '{name}' needs more than max_planned_bytes="
                f"{self.limit} for its unplanned tensors"
            )
        # bounded shapes get memory that cannot grow; unbound ones must grow
        empty = torch.empty_strided if unbound else fixed_empty
        return empty(
            sizes,
            dim_order_strides(sizes, value.dim_order),
            dtype=dtype,
            device=device.to_torch(),
        )


def _recipe(plan: p.ExecutionPlan, path: str, dmap: DeviceMap) -> _Recipe:
    """The recipe of ``plan``'s values table, every check of it made: each tensor's dtype,
    and each planned tensor's alignment (:mod:`ptexec.format.validate` checked that it
    lies inside its buffer)."""
    inputs = set(plan.inputs)
    template: list[Any] = []
    tensors: list[_Planned | _Constant | int] = []
    int_lists: list[tuple[int, tuple[int, ...]]] = []
    for j, value in enumerate(plan.values):
        if not isinstance(value, p.Tensor):
            if isinstance(value, p.Int | p.Bool | p.Double | p.String):
                template.append(value.value)
            elif isinstance(value, p.DoubleList | p.BoolList):
                template.append(value.items)
            else:  # None, and IntList, TensorList, OptionalTensorList: rendered per use
                template.append(None)
                if isinstance(value, p.IntList):
                    int_lists.append((j, tuple(value.items)))
            continue
        template.append(None)
        tpath = f"{path}.values[{j}].tensor"
        dtype = tensor_dtype(value, tpath)
        alloc = value.allocation_info
        if alloc is not None:
            itemsize = dtype.itemsize
            check_aligned(alloc.memory_offset, itemsize, f"{tpath}.allocation_info")
            tensors.append(
                _Planned(
                    j,
                    alloc.memory_id,
                    alloc.memory_offset // itemsize,
                    dtype,
                    tuple(value.sizes),
                    dim_order_strides(value.sizes, value.dim_order),
                    value.is_external or value.data_buffer_idx > 0,
                )
            )
        elif j not in inputs or value.is_constant:
            tensors.append(_constant(j, value, dtype, dmap) or j)
    return _Recipe(plan, tuple(template), tuple(tensors), tuple(int_lists))


def _constant(j: int, value: p.Tensor, dtype: torch.dtype, dmap: DeviceMap) -> _Constant | None:
    """How to make constant ``j`` again, when it is a CPU view of the program's own bytes;
    None: made as the first load made it."""
    if not value.is_constant or value.is_external or value.nbytes == 0:
        return None
    if not dmap.label(value).is_cpu:
        return None
    strides = dim_order_strides(value.sizes, value.dim_order)
    return _Constant(j, value.data_buffer_idx, value.nbytes, dtype, tuple(value.sizes), strides)


def _replay(
    recipe: _Recipe,
    program: Program,
    path: str,
    dmap: DeviceMap,
    buffers: list[PlannedBuffer],
    fresh: set[int],
    max_unplanned_bytes: int,
) -> tuple[list[Any], list[Owned]]:
    """The values table of ``recipe``'s plan, made for this load; and the storage and
    geometry of each tensor in it as made (each in one slot)."""
    plan = recipe.plan
    storages: dict[int, tuple[Any, torch.device]] = {}
    on_cpu = True
    for b in buffers:
        if b.data.storage_offset():
            raise ValueError("planned storage must start at offset 0")
        storages[b.info.index] = (b.data.untyped_storage(), b.data.device)
        on_cpu = on_cpu and b.data.is_cpu
    unplanned = _Unplanned(program, plan.name, dmap, max_unplanned_bytes)
    values = list(recipe.template)
    made: list[Owned] = []
    append = made.append
    makers: dict[tuple[int, torch.dtype], Any] = {}  # per buffer and dtype: empty_maker's
    pte = program.pte
    tensors: tuple[_Planned | _Constant | int, ...] = recipe.tensors
    split = _native_views(recipe) if on_cpu and buffers else None
    if split is not None:  # the planned views in one call of the native library
        views, tensors, inits = split
        bases: list[Any] = [None] * (max(storages) + 1)
        for b in buffers:
            bases[b.info.index] = (b.data, storages[b.info.index][0])
        try:
            views.make(bases, values, made)
        except (RuntimeError, ValueError, IndexError):  # (never, for buffers of its plan)
            values, tensors, inits = list(recipe.template), recipe.tensors, ()
            made.clear()
        for first in inits:
            value = plan.values[first.slot]
            assert isinstance(value, p.Tensor)
            where = f"{path}.values[{first.slot}].tensor"
            new = first.memory_id in fresh
            _initialise(program, value, values[first.slot], first.dtype, where, new)
    # the constants' bytes, and what the program makes of the read-only ones (views, or
    # its copies where a constant may be written: Program.tensor_from_memory), at once
    constants = [(c, pte.constant(c.data, c.nbytes)) for c in tensors if isinstance(c, _Constant)]
    read_only = [data for _, data in constants if data.readonly]
    made_of = iter(program.tensors_from_memory(read_only) if read_only else ())
    for c, data in constants:
        slot, _, _, dtype, sizes, strides = c
        if data.readonly:  # as _from_bytes makes it (nbytes > 0: a recipe's constant)
            view = values[slot] = _typed(next(made_of), dtype, sizes, strides)
        else:
            const = torch.frombuffer(data, dtype=dtype)
            if const.data_ptr() % dtype.itemsize:
                value = plan.values[slot]
                assert isinstance(value, p.Tensor)
                view = values[slot] = _from_bytes(program, data, value, dtype)
                append(read_back(view))
                continue
            view = values[slot] = const.as_strided(sizes, strides)
        append((view, view.untyped_storage(), 0, sizes, strides))
    for t in tensors:
        if isinstance(t, _Constant):
            continue
        if isinstance(t, int):
            value = plan.values[t]
            assert isinstance(value, p.Tensor)
            tpath = f"{path}.values[{t}].tensor"
            made_here = values[t] = unplanned.make(t, value, tensor_dtype(value, tpath), tpath)
            if isinstance(made_here, torch.Tensor):
                append(read_back(made_here))
            continue
        slot, memory_id, offset, dtype, sizes, strides, init = t
        storage, device = storages[memory_id]
        make = makers.get((memory_id, dtype))
        if make is None:
            make = makers[(memory_id, dtype)] = empty_maker(dtype, device)
        view = make()
        view.set_(storage, offset, sizes, strides)
        append((view, storage, offset, sizes, strides))
        if init:
            value = plan.values[slot]
            assert isinstance(value, p.Tensor)
            where = f"{path}.values[{slot}].tensor"
            _initialise(program, value, view, dtype, where, memory_id in fresh)
        values[slot] = view
    for j, items in recipe.int_lists:
        values[j] = tuple(values[i] for i in items)
    return values, made
