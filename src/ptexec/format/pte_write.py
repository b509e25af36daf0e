"""Write a one-delegate ``.pte``: one method that hands all its tensors to one delegate.

Used to run a delegate payload of a loaded program through another runtime (ExecuTorch's
own backends): the written program has one method whose values are the delegate call's
tensors, every one an unplanned input of the method (the caller provides all memory, the
delegate's outputs included), one ``DelegateCall`` over all of them and no outputs. The
payload and the named data it reads are segments of the file (after the empty constant
segment ExecuTorch's runtime expects; an ``eh00`` header says where), as ExecuTorch's
exporter writes them. Imports no torch.

The flatbuffer part of such a program depends only on the tensors' descriptions, the
backend, the compile specs, the names and sizes of the segments, never on their bytes; a
program's delegates are often alike (one per layer), and a program is often loaded again,
so the written flatbuffers are kept in an in-process cache keyed by all of those (up to
:data:`WRITTEN_FLATBUFFERS` of them and :data:`WRITTEN_BYTES` bytes, least recently used
first out: more than a large program has delegates).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from . import program as p
from .flatbuf_write import String, Table, TableVector, Vector, finish
from .header import PTE_HEADER_MAGIC, PTE_IDENTIFIER
from .lru import Key, Lru

__all__ = ["SEGMENT_ALIGN", "clear_written", "one_delegate_program"]

SEGMENT_ALIGN = 128  # as ExecuTorch's serializer aligns segments
_HEADER_LENGTH = 32  # eh00, length, program size, segment base offset, segment data size

_KERNEL_TENSOR = 5  # KernelTypes.Tensor
_INSTRUCTION_DELEGATE = 2  # InstructionArguments.DelegateCall
_SEGMENT = 1  # DataLocation.SEGMENT

WRITTEN_FLATBUFFERS = 4096
WRITTEN_BYTES = 32 << 20
_written: Lru[bytes] = Lru(WRITTEN_FLATBUFFERS, WRITTEN_BYTES)


def clear_written() -> None:
    """Forget the written flatbuffers."""
    _written.clear()


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
    names = names or {}
    # segment 0: the (empty) constant segment ExecuTorch's runtime requires, then the payload
    blobs: list[bytes | bytearray | memoryview] = [b"", payload]
    keys = tuple((named_data or {}).keys())
    blobs.extend((named_data or {}).values())
    offsets = []
    size = 0
    for b in blobs:
        size = _align(size, SEGMENT_ALIGN)
        offsets.append(size)
        size += len(b)
    key = Key(
        tuple(tensors),
        backend_id,
        tuple(compile_specs),
        keys,
        tuple(len(b) for b in blobs),
        tuple(sorted(names.items())),
        method,
    )
    flat = _written.get(key)
    if flat is None:
        flat = _flatbuffer(tensors, backend_id, compile_specs, keys, offsets, blobs, names, method)
        _written.put(key, flat, len(flat))
    base = _align(len(flat), SEGMENT_ALIGN)
    parts: list[bytes | bytearray | memoryview] = [flat]
    end = len(flat)
    for off, b in zip(offsets, blobs, strict=True):
        parts += [bytes(base + off - end), b]
        end = base + off + len(b)
    return b"".join(parts)  # the one copy of the payload


def _flatbuffer(
    tensors: Sequence[p.Tensor],
    backend_id: str,
    compile_specs: Sequence[p.CompileSpec],
    keys: Sequence[str],
    offsets: Sequence[int],
    blobs: Sequence[bytes | bytearray | memoryview],
    names: Mapping[int, str],
    method: str,
) -> bytes:
    """The flatbuffer of :func:`one_delegate_program` (its header filled in)."""
    # named data k is segment k + 2 (after the constant segment and the payload)
    named = [Table().ref(0, String(key)).scalar(1, "u32", k + 2) for k, key in enumerate(keys)]
    size = offsets[-1] + len(blobs[-1])
    n = len(tensors)
    call = Table().scalar(0, "i32", 0).ref(1, Vector("i32", range(n)))
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
                    .ref(
                        2,
                        TableVector([Table().scalar(0, "u8", _INSTRUCTION_DELEGATE).ref(1, call)]),
                    )
                ]
            ),
        )
        .ref(6, TableVector([]))
        .ref(
            7,
            TableVector(
                [
                    Table()
                    .ref(0, String(backend_id))
                    .ref(1, Table().scalar(0, "i8", _SEGMENT).scalar(1, "u32", 1))
                    .ref(
                        2,
                        TableVector(
                            [
                                Table().ref(0, String(s.key)).ref(1, Vector("u8", raw=s.value))
                                for s in compile_specs
                            ]
                        ),
                    )
                ]
            ),
        )
        .ref(8, Vector("i64", (0,)))
    )
    program = (
        Table()
        .scalar(0, "u32", 0)
        .ref(1, TableVector([plan]))
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
    flat = finish(program, PTE_IDENTIFIER, reserve=_HEADER_LENGTH)
    base = _align(len(flat), SEGMENT_ALIGN)
    struct.pack_into("<4sIQQQ", flat, 8, PTE_HEADER_MAGIC, _HEADER_LENGTH, len(flat), base, size)
    return bytes(flat)
