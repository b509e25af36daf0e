"""A whole ``.pte`` file: header, program description and zero-copy access to its data.

Decoding and validating the program description is the larger part of reading a file, and
a process often reads one file many times (a method loaded per worker, a program loaded
again after it was freed). So the validated description is kept in a small in-process
cache keyed by the flatbuffer's bytes and the file's size: the same bytes decode to the
same frozen dataclasses, and the same description with the same segment sizes passes the
same checks, so a hit skips work that would give an equal result. A flatbuffer of at
most :data:`COMPARED_MAX_BYTES` is kept as a copy and compared with the new bytes in
full (a byte comparison costs a thirtieth of hashing them, and such flatbuffers are
every load's case); a larger one is known by its SHA-256. Only descriptions that passed
every check are kept (a defective file is decoded and refused again each time); the
entries hold plain frozen data (offsets and sizes, no view of the file) and the copies,
so they keep no file's memory alive; the cache holds at most :data:`DECODED_PROGRAMS`
descriptions and :data:`COMPARED_BYTES` bytes of copies, least recently used first out.
Nothing is kept on disk.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ..errors import PteFormatError
from . import program as p
from .decode import decode_program
from .flatbuf import Buffer
from .header import PteHeader, read_pte_header, truncated
from .lru import Lru
from .validate import validate_program

Bytes = bytes | bytearray | memoryview

DECODED_PROGRAMS = 32  # validated program descriptions kept in the process
DECODED_MAX_BYTES = 64 << 20  # a larger flatbuffer is decoded each time (hashing costs)
COMPARED_MAX_BYTES = 1 << 20  # a flatbuffer up to this size is kept as a copy, compared
COMPARED_BYTES = 16 << 20  # what the kept copies may hold together
SAMPLED = 64  # bytes of a compared flatbuffer, evenly spaced, in its key
# (digest, (file size,)), or (flatbuffer size, file size, sampled bytes) of a compared one
_Key = tuple[Any, ...]
# per key: the flatbuffer's copy (None: known by its digest) and its description
_decoded: Lru[tuple[bytes | None, p.Program]] = Lru(DECODED_PROGRAMS, COMPARED_BYTES)


def _key(flat: memoryview, size: int) -> _Key | None:
    """The cache key of flatbuffer ``flat`` in a file of ``size`` bytes (None: not kept)."""
    n = len(flat)
    if n <= COMPARED_MAX_BYTES:
        # (a key for the lookup only: a hit is compared byte for byte, see _cached)
        return (n, size, bytes(flat[:: max(1, n // SAMPLED)]))
    if n <= DECODED_MAX_BYTES:
        # the segment table is part of the flatbuffer: the same bytes give the same
        # ranges, so the file's size is the one other thing the checks depend on
        return (hashlib.sha256(flat).digest(), (size,))
    return None


def _cached(key: _Key | None, flat: memoryview) -> p.Program | None:
    hit = None if key is None else _decoded.get(key)
    if hit is None:
        return None
    copy, program = hit
    if copy is not None and not copy.startswith(flat):  # (the same length: in the key)
        return None  # another flatbuffer of the same sampled bytes
    return program


def _keep(key: _Key | None, flat: memoryview, program: p.Program) -> None:
    if key is None:
        return
    if len(flat) <= COMPARED_MAX_BYTES:  # kept as a copy, which counts against the budget
        copy = bytes(flat)
        _decoded.put(key, (copy, program), len(copy))
    else:
        _decoded.put(key, (None, program))


def clear_decoded() -> None:
    """Forget every cached program description (see the module docstring)."""
    _decoded.clear()


@dataclass(frozen=True)
class PteFile:
    """A validated program and the bytes it came from.

    ``data`` is the whole file (typically a memory map); every accessor returns a
    ``memoryview`` slice of it, never a copy.
    """

    data: memoryview
    header: PteHeader | None
    program: p.Program
    segments: tuple[p.DataRef, ...]  # absolute byte ranges of the data segments

    def segment(self, index: int) -> memoryview:
        ref = self.segments[index]
        return self.data[ref.offset : ref.offset + ref.size]

    def constant(self, data_buffer_idx: int, nbytes: int) -> memoryview:
        """The bytes of constant ``data_buffer_idx`` (constant segment or legacy buffer)."""
        const = self.program.constant_segment
        if const is not None and len(const.offsets) > 1:
            start = self.segments[const.segment_index].offset + const.offsets[data_buffer_idx]
            return self.data[start : start + nbytes]
        ref = self.program.constant_buffer[data_buffer_idx]
        return self.data[ref.offset : ref.offset + nbytes]

    def mutable_initial_value(self, data_buffer_idx: int, nbytes: int) -> memoryview:
        """Initial bytes of a planned tensor (always ``mutable_data_segments[0]``)."""
        start = self.mutable_initial_offset(data_buffer_idx)
        return self.data[start : start + nbytes]

    def mutable_initial_offset(self, data_buffer_idx: int) -> int:
        """Where in the file the initial bytes of a planned tensor start (writers that
        replace a program's initial state write there)."""
        sub = self.program.mutable_data_segments[0]
        return self.segments[sub.segment_index].offset + sub.offsets[data_buffer_idx]

    def delegate_data(self, ref: p.BackendDelegateDataReference) -> memoryview:
        if ref.location == p.DATA_INLINE:
            r = self.program.backend_delegate_data[ref.index]
            return self.data[r.offset : r.offset + r.size]
        return self.segment(ref.index)

    def named_data(self) -> dict[str, memoryview]:
        """Named blobs stored in the program (read by delegates)."""
        return {n.key: self.segment(n.segment_index) for n in self.program.named_data}


def read_pte(data: Bytes) -> PteFile:
    """Parse and validate a ``.pte``; raises :class:`PteFormatError` on any defect."""
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    header = read_pte_header(view)
    size = len(view)
    flat_end = size
    segments: list[p.DataRef] = []
    complete = False  # whether the header says how long the file is (and it is that long)
    if header is not None:
        if header.program_size < 8 + header.length:
            raise PteFormatError(
                "extended_header.program_size",
                f"{header.program_size} bytes cannot hold the headers ({8 + header.length} bytes)",
            )
        # the file must hold the program and, when the header gives its size, the segment
        # data (as ExecuTorch's runtime requires)
        need = header.program_size
        if header.segment_base_offset and header.segment_data_size is not None:
            need = max(need, header.segment_base_offset + header.segment_data_size)
            complete = True
        if need > size:
            raise truncated("extended_header", need, size)
        flat_end = header.program_size
    flat = view[:flat_end]
    key = _key(flat, size)
    known = _cached(key, flat)
    program = known if known is not None else decode_program(Buffer(flat))
    if program.segments and (header is None or header.segment_base_offset == 0):
        # no segment data in the file: only empty segments can be described
        for i, seg in enumerate(program.segments):
            if seg.size:
                raise PteFormatError(
                    f"segments[{i}]",
                    f"{seg.size} bytes of segment data but the file has no segment base offset",
                )
            segments.append(p.DataRef(flat_end, 0))
    elif program.segments:
        assert header is not None
        base = header.segment_base_offset
        if base < flat_end:
            raise PteFormatError(
                "extended_header.segment_base_offset",
                f"{base} lies inside the program data (which ends at {flat_end})",
            )
        for i, seg in enumerate(program.segments):
            start = base + seg.offset
            if start + seg.size > size:
                if not complete:  # no size in the header: the segment says how long it is
                    end = max(base + s.offset + s.size for s in program.segments)
                    raise truncated(f"segments[{i}]", end, size)
                raise PteFormatError(
                    f"segments[{i}]",
                    f"bytes {start}..{start + seg.size} lie past the end of the file "
                    f"({size} bytes, as long as its header says)",
                )
            segments.append(p.DataRef(start, seg.size))
    if known is None:
        validate_program(program, [s.size for s in segments])
        _keep(key, flat, program)
    return PteFile(view, header, program, tuple(segments))
