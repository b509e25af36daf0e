"""Writing an external data file (``.ptd``): named tensors, each in a segment of its own.

The layout is the one ExecuTorch's serializer writes and :func:`ptexec.format.ptd.read_ptd`
reads: the ``FlatTensor`` flatbuffer (file identifier ``FT01``) with the ``FH01`` header
in the space after its identifier, padded to :data:`SEGMENT_ALIGN`, then the segments, each
starting at a multiple of :data:`SEGMENT_ALIGN` from the segment base. Nothing here imports
torch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .flatbuf_write import String, Table, TableVector, Vector, finish
from .header import HEADER_OFFSET, PTD_HEADER_MAGIC, PTD_IDENTIFIER
from .ptd import TensorLayout

__all__ = ["SEGMENT_ALIGN", "ptd_bytes"]

SEGMENT_ALIGN = 128  # ExecuTorch's serializer's default segment alignment
_HEADER_LENGTH = 40  # magic, length, four u64
_HEADER_SPACE = 48  # the header padded to the flatbuffer's alignment


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def ptd_bytes(
    entries: Sequence[tuple[str, TensorLayout | None, bytes | bytearray | memoryview]],
    version: int = 0,
) -> bytes:
    """A ``.ptd`` holding each ``(key, layout, bytes)`` in a segment of its own."""
    offsets: list[int] = []
    size = 0
    for _, _, data in entries:
        size = _align(size, SEGMENT_ALIGN)
        offsets.append(size)
        size += len(data)
    named = []
    for k, (key, layout, _) in enumerate(entries):
        t = Table().ref(0, String(key)).scalar(1, "u32", k)
        if layout is not None:
            t.ref(
                2,
                Table()
                .scalar(0, "i8", layout.scalar_type)
                .ref(1, Vector("i32", list(layout.sizes)))
                .ref(2, Vector("u8", list(layout.dim_order))),
            )
        named.append(t)
    segments = [
        Table().scalar(0, "u64", off).scalar(1, "u64", len(data))
        for off, (_, _, data) in zip(offsets, entries, strict=True)
    ]
    root = (
        Table().scalar(0, "u32", version).ref(1, TableVector(segments)).ref(2, TableVector(named))
    )
    flat = finish(root, PTD_IDENTIFIER, reserve=_HEADER_SPACE)
    base = _align(len(flat), SEGMENT_ALIGN)
    header = PTD_HEADER_MAGIC + struct.pack(
        "<I4Q", _HEADER_LENGTH, _HEADER_SPACE, len(flat) - _HEADER_SPACE, base, size
    )
    flat[HEADER_OFFSET : HEADER_OFFSET + len(header)] = header
    parts: list[bytes | bytearray | memoryview] = [flat, bytes(base - len(flat))]
    end = 0
    for off, (_, _, data) in zip(offsets, entries, strict=True):
        parts += [bytes(off - end), data]
        end = off + len(data)
    return b"".join(parts)
