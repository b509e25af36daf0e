"""Write a one-delegate ``.pte``: one method that hands all its tensors to one delegate.

Used to run a delegate payload of a loaded program through another runtime (ExecuTorch's
own backends): the written program has one method whose values are the delegate call's
tensors, every one an unplanned input of the method (the caller provides all memory, the
delegate's outputs included), one ``DelegateCall`` over all of them and no outputs. The
payload and the named data it reads are segments of the file (after the empty constant
segment ExecuTorch's runtime expects; an ``eh00`` header says where), as ExecuTorch's
exporter writes them. :func:`delegate_program` writes the same with several
``DelegateCall``s in order, each over some of the tensors (a run of consecutive calls, the
tensors one writes and the next reads included). Imports no torch.

The flatbuffer part of such a program depends only on the tensors' descriptions, the
backend, the compile specs, the names and sizes of the segments, never on their bytes; a
program's delegates are often alike (one per layer), and a program is often loaded again,
so the written flatbuffers are kept in an in-process cache keyed by all of those (up to
:data:`WRITTEN_FLATBUFFERS` of them and :data:`WRITTEN_BYTES` bytes, least recently used
first out: more than a large program has delegates). The named data keys count by their
lengths alone: the layers of a model read weights of other names, and a string's place
in the flatbuffer depends only on the lengths of those before it, so a kept flatbuffer
serves a call whose keys differ, with its keys written in their places.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import program as p
from .flatbuf_write import String, Table, TableVector, Vector, finish_placed
from .header import PTE_HEADER_MAGIC, PTE_IDENTIFIER, read_pte_header
from .lru import Key, Lru

__all__ = [
    "SEGMENT_ALIGN",
    "DelegateCallSpec",
    "clear_written",
    "delegate_program",
    "delegate_spans",
    "one_delegate_program",
]

SEGMENT_ALIGN = 128  # as ExecuTorch's serializer aligns segments
_HEADER_LENGTH = 32  # eh00, length, program size, segment base offset, segment data size

_KERNEL_TENSOR = 5  # KernelTypes.Tensor
_INSTRUCTION_DELEGATE = 2  # InstructionArguments.DelegateCall
_SEGMENT = 1  # DataLocation.SEGMENT

WRITTEN_FLATBUFFERS = 4096
WRITTEN_BYTES = 32 << 20
# a written flatbuffer, where each named data key lies in it, and those keys (UTF-8)
_Written = tuple[bytes, tuple[int, ...], tuple[bytes, ...]]
_written: Lru[_Written] = Lru(WRITTEN_FLATBUFFERS, WRITTEN_BYTES)


def clear_written() -> None:
    """Forget the written flatbuffers."""
    _written.clear()


def _tensor_facts(t: p.Tensor) -> tuple[Any, ...]:
    """What :func:`_tensor` writes of ``t`` (the rest of its description, its memory plan
    say, is no part of a written program: calls whose tensors differ only there, a
    model's layers, are the same flatbuffer)."""
    return (t.scalar_type, t.sizes, t.dim_order, t.shape_dynamism)


def _tensor(t: p.Tensor, name: str | None) -> Table:
    table = (
        Table()
        .scalar(0, "i8", t.scalar_type)
        .ref(2, Vector("i32", t.sizes))
        .ref(3, Vector("u8", t.dim_order))
        .scalar(8, "i8", t.shape_dynamism)
    )
    if name is not None:
        table.ref(9, Table().ref(1, String(name)))
    return table


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def one_delegate_program(
    tensors: Sequence[p.Tensor],
    backend_id: str,
    payload: bytes | bytearray | memoryview,
    compile_specs: Sequence[p.CompileSpec] = (),
    named_data: Mapping[str, bytes | bytearray | memoryview] | None = None,
    names: Mapping[int, str] | None = None,
    method: str = "forward",
) -> bytes:
    """The bytes of a program whose method ``method`` takes ``tensors`` (scalar type,
    sizes, dim order and shape dynamism as given; no memory plan, no constants) as its
    inputs, in order, and runs ``DelegateCall(backend_id, args=all of them)``.

    ``named_data`` becomes the program's named data (key -> bytes); ``names`` gives some
    tensors a fully qualified name (index -> name), by which ExecuTorch's
    ``Method.get_attribute`` finds them after a call.
    """
    call = DelegateCallSpec(backend_id, payload, tuple(compile_specs), tuple(range(len(tensors))))
    return delegate_program(tensors, [call], named_data, names, method)


@dataclass(frozen=True)
class DelegateCallSpec:
    """One ``DelegateCall`` of :func:`delegate_program`: its backend, payload, compile
    specs and arguments (indices into the program's tensors)."""

    backend_id: str
    payload: bytes | bytearray | memoryview
    compile_specs: tuple[p.CompileSpec, ...]
    args: tuple[int, ...]


def delegate_program(
    tensors: Sequence[p.Tensor],
    calls: Sequence[DelegateCallSpec],
    named_data: Mapping[str, bytes | bytearray | memoryview] | None = None,
    names: Mapping[int, str] | None = None,
    method: str = "forward",
) -> bytes:
    """The bytes of a program whose method ``method`` takes ``tensors`` as its inputs, in
    order (as :func:`one_delegate_program`), and runs ``calls`` in order, delegate ``k``
    being call ``k``'s backend and payload (segment ``k + 1``). A tensor one call writes
    and a later one reads is an input like the others: the caller provides its memory."""
    if not calls:
        raise ValueError("a delegate program needs at least one call")
    n = len(tensors)
    for c in calls:
        if any(not 0 <= a < n for a in c.args):
            raise ValueError(f"a call's arguments {list(c.args)} name tensors beyond {n}")
    names = names or {}
    # segment 0: the (empty) constant segment ExecuTorch's runtime requires, then the payloads
    blobs: list[bytes | bytearray | memoryview] = [b""] + [c.payload for c in calls]
    keys = tuple((named_data or {}).keys())
    blobs.extend((named_data or {}).values())
    offsets = _offsets(blobs)
    shape = tuple((c.backend_id, c.compile_specs, c.args) for c in calls)
    if len(calls) == 1 and calls[0].args == tuple(range(n)):
        # the one-delegate program's key, as it always was
        shape_key: Any = (calls[0].backend_id, calls[0].compile_specs)
    else:
        shape_key = ("calls", shape)
    raw_keys = tuple(k.encode("utf-8") for k in keys)
    key = Key(
        tuple(map(_tensor_facts, tensors)),
        *shape_key,
        tuple(map(len, raw_keys)),
        tuple(len(b) for b in blobs),
        tuple(sorted(names.items())),
        method,
    )
    written = _written.get(key)
    if written is None:
        written = _flatbuffer(tensors, calls, keys, offsets, blobs, names, method)
        _written.put(key, written, len(written[0]))
    flat = _with_keys(written, raw_keys)
    base = _align(len(flat), SEGMENT_ALIGN)
    parts: list[bytes | bytearray | memoryview] = [flat]
    end = len(flat)
    for off, b in zip(offsets, blobs, strict=True):
        parts += [bytes(base + off - end), b]
        end = base + off + len(b)
    return b"".join(parts)  # the one copy of each payload


def _with_keys(written: _Written, keys: tuple[bytes, ...]) -> bytes:
    """The written flatbuffer with these named data keys (the same lengths as those it
    was written with, in the same places)."""
    flat, placed, own = written
    if keys == own:
        return flat
    out = bytearray(flat)
    for at, raw in zip(placed, keys, strict=True):
        out[at : at + len(raw)] = raw
    return bytes(out)


def _offsets(blobs: Sequence[bytes | bytearray | memoryview]) -> list[int]:
    """Where each segment starts, from the segment base: one after the other, aligned."""
    offsets = []
    size = 0
    for b in blobs:
        size = _align(size, SEGMENT_ALIGN)
        offsets.append(size)
        size += len(b)
    return offsets


def delegate_spans(
    data: bytes, blobs: Sequence[bytes | bytearray | memoryview]
) -> tuple[tuple[int, int], ...]:
    """(offset, length) in ``data``, a program :func:`delegate_program` wrote, of each of
    the ``blobs`` it was written with: its payloads, then its named data, in order."""
    header = read_pte_header(memoryview(data))
    if header is None:
        raise ValueError("not a program delegate_program wrote (no extended header)")
    base = header.segment_base_offset
    offsets = _offsets([b"", *blobs])[1:]  # segment 0: the empty constant segment
    return tuple((base + o, len(b)) for o, b in zip(offsets, blobs, strict=True))


def _flatbuffer(
    tensors: Sequence[p.Tensor],
    calls: Sequence[DelegateCallSpec],
    keys: Sequence[str],
    offsets: Sequence[int],
    blobs: Sequence[bytes | bytearray | memoryview],
    names: Mapping[int, str],
    method: str,
) -> _Written:
    """The flatbuffer of :func:`delegate_program` (its header filled in), where each
    named data key lies in it, and the keys (UTF-8)."""
    # named data k is segment k + 1 + len(calls) (after the constant segment and payloads)
    first = 1 + len(calls)
    strings = [String(key) for key in keys]
    named = [Table().ref(0, s).scalar(1, "u32", k + first) for k, s in enumerate(strings)]
    size = offsets[-1] + len(blobs[-1])
    n = len(tensors)
    instructions = [
        Table()
        .scalar(0, "u8", _INSTRUCTION_DELEGATE)
        .ref(1, Table().scalar(0, "i32", k).ref(1, Vector("i32", c.args)))
        for k, c in enumerate(calls)
    ]
    delegates = [
        Table()
        .ref(0, String(c.backend_id))
        .ref(1, Table().scalar(0, "i8", _SEGMENT).scalar(1, "u32", k + 1))
        .ref(
            2,
            TableVector(
                [
                    Table().ref(0, String(s.key)).ref(1, Vector("u8", raw=s.value))
                    for s in c.compile_specs
                ]
            ),
        )
        for k, c in enumerate(calls)
    ]
    plan = (
        Table()
        .ref(0, String(method))
        .ref(
            2,
            TableVector(
                [
                    Table().scalar(0, "u8", _KERNEL_TENSOR).ref(1, _tensor(t, names.get(i)))
                    for i, t in enumerate(tensors)
                ]
            ),
        )
        .ref(3, Vector("i32", range(n)))
        .ref(4, Vector("i32", ()))
        .ref(
            5,
            TableVector(
                [
                    Table()
                    .ref(0, Vector("i32", range(n)))
                    .ref(1, Vector("i32", ()))
                    .ref(2, TableVector(instructions))
                ]
            ),
        )
        .ref(6, TableVector([]))
        .ref(7, TableVector(delegates))
        .ref(8, Vector("i64", (0,)))
    )
    program = (
        Table()
        .scalar(0, "u32", 0)
        .ref(1, TableVector([plan]))
        # no inline delegate data (payloads are segments), but the list is written:
        # ExecuTorch's Python deserializer takes it as present
        .ref(3, TableVector([]))
        .ref(
            4,
            TableVector(
                [
                    Table().scalar(0, "u64", off).scalar(1, "u64", len(b))
                    for off, b in zip(offsets, blobs, strict=True)
                ]
            ),
        )
        .ref(5, Table().scalar(0, "u32", 0).ref(1, Vector("u64", (0,))))
        .ref(7, TableVector(named))
    )
    flat, placed = finish_placed(program, PTE_IDENTIFIER, strings, reserve=_HEADER_LENGTH)
    base = _align(len(flat), SEGMENT_ALIGN)
    struct.pack_into("<4sIQQQ", flat, 8, PTE_HEADER_MAGIC, _HEADER_LENGTH, len(flat), base, size)
    return bytes(flat), placed, tuple(k.encode("utf-8") for k in keys)
