"""Trained parameters written back into a program's files.

A training program's parameters start from bytes in the file: the ``.pte``'s mutable data
segment, or the ``.ptd`` for programs exported with ``external_mutable_weights``. Saving
writes a copy of that file in which exactly those bytes are the current parameters and
everything else (the program, its instructions, its constants, the other methods) is the
original, byte for byte. The result is a valid program of the same shape, which
ExecuTorch's runtime and ptexec load as they loaded the original; its parameters start
where training stopped. A method that reads a parameter's ``.ptd`` key as a constant (an
inference method exported with external constants under the same names) reads the trained
value from the saved data file; one whose weights are constants of the ``.pte`` keeps
them. Rewriting only the initial state, rather than re-serialising the program, keeps every
field ptexec does not model exactly as ExecuTorch wrote it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..errors import PteFormatError, StateError
from ..format import program as p
from ..format.ptd import TensorLayout
from ..format.ptd_write import ptd_bytes
from ..format.pte_mutable import with_new_entries

if TYPE_CHECKING:
    from ..program import Program

__all__ = ["initial_bytes", "parameter_bytes", "ptd_with", "pte_with"]


def parameter_bytes(t: torch.Tensor, dim_order: Sequence[int]) -> bytes:
    """The bytes of ``t`` as a file holds them: elements in ``dim_order``, on the host."""
    host = t.detach().permute(*dim_order).contiguous().cpu() if t.dim() else t.detach().cpu()
    return host.reshape(-1).view(torch.uint8).numpy().tobytes()


def _tensor(program: Program, plan: p.ExecutionPlan, slot: int) -> p.Tensor:
    value = plan.values[slot]
    assert isinstance(value, p.Tensor)
    return value


def initial_bytes(program: Program, plan: p.ExecutionPlan, slot: int) -> bytes:
    """The bytes planned tensor ``slot`` of ``plan`` starts from in the loaded files (the
    ``.pte``'s mutable data segment, or its ``.ptd`` entry), as :func:`parameter_bytes`
    gives a tensor's: what a parameter was before training."""
    value = _tensor(program, plan, slot)
    if value.is_external:
        extra = value.extra_tensor_info
        key = extra.fully_qualified_name if extra is not None else None
        merged = program.ptd
        if merged is None or not key or key not in merged.entries:
            raise StateError(
                f"method '{plan.name}': value {slot} starts from a data file (.ptd) that "
                "was not loaded"
            )
        return bytes(merged.bytes_of(key)[: value.nbytes])
    if value.data_buffer_idx <= 0:
        raise StateError(f"method '{plan.name}': value {slot} starts from no bytes in the program")
    pte = program.pte
    start = pte.mutable_initial_offset(value.data_buffer_idx)
    return bytes(pte.data[start : start + value.nbytes])


# a place in a file (start, end) and the bytes to save there, or None for a value that is
# not saved (it keeps the file's bytes)
_Held = tuple[int, int, bytes | None]


def _differ_in_place(places: Sequence[_Held], data: bytes | bytearray | memoryview) -> bool:
    """Whether two values that start from the same bytes of the file (ExecuTorch's
    exporter stores equal initial values once: LayerNorm weights, LoRA's zero matrices)
    would be saved with different bytes there (written as they are, one would silently
    load with the other's values). A value that is not saved keeps the file's bytes."""
    ordered = sorted(places, key=lambda h: (h[0], h[1]))
    for k, (start, end, new) in enumerate(ordered):
        for other_start, other_end, other_new in ordered[k + 1 :]:
            if other_start >= end:
                break
            if new is None and other_new is None:
                continue
            mine = new if new is not None else bytes(data[start:end])
            theirs = other_new if other_new is not None else bytes(data[other_start:other_end])
            if (start, end) != (other_start, other_end) or mine != theirs:
                return True  # (equal: one value, the same parameter of two methods)
    return False


def pte_with(
    program: Program, updates: Sequence[tuple[p.ExecutionPlan, int, torch.Tensor]]
) -> bytes:
    """The program's ``.pte`` with each ``(plan, value slot, tensor)`` as that planned
    tensor's initial value. Where the file stores values that now differ in one entry
    (equal initial values stored once), each distinct value gets an entry of its own
    (:func:`ptexec.format.pte_mutable.with_new_entries`)."""
    pte = program.pte
    saved = {(plan.name, slot): t for plan, slot, t in updates}
    plans = {plan.name: k for k, plan in enumerate(pte.program.execution_plan)}
    places: list[_Held] = []
    refs: list[tuple[int, int, int]] = []  # each place's plan index, value slot and entry
    for k, plan in enumerate(pte.program.execution_plan):  # values starting from mutable data
        for slot, value in enumerate(plan.values):
            if (
                isinstance(value, p.Tensor)
                and not value.is_external
                and value.data_buffer_idx > 0
                and value.allocation_info is not None
                and (plan.name, slot) not in saved
            ):
                start = pte.mutable_initial_offset(value.data_buffer_idx)
                places.append((start, start + value.nbytes, None))
                refs.append((k, slot, value.data_buffer_idx))
    for plan, slot, t in updates:
        value = _tensor(program, plan, slot)
        if value.is_external or value.data_buffer_idx <= 0:
            raise StateError(
                f"method '{plan.name}': value {slot} starts from "
                + (
                    "the data file (.ptd); save that with save_ptd"
                    if value.is_external
                    else "no bytes in the program"
                )
            )
        start = pte.mutable_initial_offset(value.data_buffer_idx)
        raw = parameter_bytes(t, value.dim_order)
        if len(raw) != value.nbytes:
            raise StateError(f"method '{plan.name}': value {slot} has {value.nbytes} bytes")
        places.append((start, start + len(raw), raw))
        refs.append((plans[plan.name], slot, value.data_buffer_idx))
    if _differ_in_place(places, pte.data):
        return _own_entries(program, places, refs)
    data = bytearray(pte.data)
    for start, _, new in places:
        if new is not None:
            data[start : start + len(new)] = new
    return bytes(data)


def _own_entries(
    program: Program, places: Sequence[_Held], refs: Sequence[tuple[int, int, int]]
) -> bytes:
    """The ``.pte`` of :func:`pte_with` where values the file stores in one entry now
    differ: in each entry stays the file's value when a value not saved reads it (else the
    first saved one); every other distinct value gets a new entry."""
    pte = program.pte
    groups: dict[tuple[int, int], list[int]] = {}  # (start, end) -> the places there
    for k, (start, end, _) in enumerate(places):
        groups.setdefault((start, end), []).append(k)
    for (_, end), (start, _) in itertools.pairwise(sorted(groups)):
        if start < end:  # entries overlapping without being one: not a layout to guess at
            raise StateError(
                "cannot save: the program's mutable data has entries that overlap in part"
            )
    moves: list[tuple[int, int, bytes]] = []
    keep: list[tuple[int, bytes]] = []
    for (start, end), members in groups.items():
        original = bytes(pte.data[start:end])
        news = [places[k][2] for k in members]
        contents = [original if new is None else new for new in news]
        stay = original if None in news else contents[0]
        if stay != original:
            keep.append((refs[members[0]][2], stay))
        for k, content in zip(members, contents, strict=True):
            if content != stay:
                plan, slot, _ = refs[k]
                moves.append((plan, slot, content))
    try:
        return with_new_entries(pte, moves, keep)
    except PteFormatError as e:
        raise StateError(f"cannot save: values the program stores in one entry differ ({e})") from e


def ptd_with(
    program: Program, updates: Sequence[tuple[p.ExecutionPlan, int, torch.Tensor]]
) -> bytes:
    """The program's ``.ptd`` with each external planned tensor's bytes replaced (the one
    data file that holds them all, where the program reads several). Where the file stores
    keys that now differ in one place (equal initial values stored once), the file is
    written anew with each key in a segment of its own."""
    merged = program.ptd
    if merged is None:
        raise StateError("the program was loaded without a data file (.ptd): nothing to save to")
    located: list[tuple[str, int, p.ExecutionPlan, int, torch.Tensor]] = []
    for plan, slot, t in updates:
        value = _tensor(program, plan, slot)
        extra = value.extra_tensor_info
        key = extra.fully_qualified_name if extra is not None else None
        if not value.is_external or not key or key not in merged.entries:
            raise StateError(
                f"method '{plan.name}': value {slot} does not start from the data file; "
                "save the program with save_pte"
            )
        located.append((key, merged.owner[key], plan, slot, t))
    files = sorted({i for _, i, *_ in located})
    if len(files) > 1:
        raise StateError(
            f"the trained parameters start from {len(files)} data files (positions "
            f"{files}); save_ptd writes one: save the program with save_pte"
        )
    ptd = merged.files[files[0]] if files else merged.files[0]
    data = bytearray(ptd.data)
    written: dict[str, bytes] = {}
    for key, _, plan, slot, t in located:
        value = _tensor(program, plan, slot)
        entry = ptd.entries[key]
        raw = parameter_bytes(t, value.dim_order)
        if len(raw) != value.nbytes or len(raw) > entry.size:
            raise StateError(f"'{key}' takes {entry.size} bytes in the data file, not {len(raw)}")
        if written.get(key, raw) != raw:
            raise StateError(f"cannot save: '{key}' has two different trained values")
        written[key] = raw
    # every entry of the file: one stored at the bytes of another (equal initial values
    # stored once) must not change with it
    places: list[_Held] = [
        (e.offset, e.offset + (len(written[k]) if k in written else e.size), written.get(k))
        for k, e in ptd.entries.items()
    ]
    if _differ_in_place(places, ptd.data):
        # keys the file stores in one place, now different: each in a segment of its own
        fresh: list[tuple[str, TensorLayout | None, bytes | memoryview]] = []
        for k, e in ptd.entries.items():
            held = ptd.data[e.offset : e.offset + e.size]
            mine = written.get(k)
            fresh.append((k, e.layout, held if mine is None else mine + bytes(held[len(mine) :])))
        return ptd_bytes(fresh, ptd.version)
    for start, _, new in places:
        if new is not None:
            data[start : start + len(new)] = new
    return bytes(data)
