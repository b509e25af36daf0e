"""A whole ``.pte`` file: header, program description and zero-copy access to its data."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PteFormatError
from . import program as p
from .decode import decode_program
from .flatbuf import Buffer
from .header import PteHeader, read_pte_header, truncated
from .validate import validate_program

Bytes = bytes | bytearray | memoryview


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
    program = decode_program(Buffer(view[:flat_end]))
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
    validate_program(program, [s.size for s in segments])
    return PteFile(view, header, program, tuple(segments))
