"""File identifiers and extended headers of ``.pte`` (ET12/eh00) and ``.ptd`` (FT01/FH01) files."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import PteFormatError
from .identify import describe

PTE_IDENTIFIER = b"ET12"
PTD_IDENTIFIER = b"FT01"
PTE_HEADER_MAGIC = b"eh00"
PTD_HEADER_MAGIC = b"FH01"
HEADER_OFFSET = 8
PTE_HEADER_MIN_LENGTH = 24
PTD_HEADER_MIN_LENGTH = 40

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class PteHeader:
    """The ``eh00`` extended header of a ``.pte`` (present when the file has segments)."""

    length: int
    program_size: int  # flatbuffer bytes, headers included
    segment_base_offset: int  # file offset of the first segment (0: none)
    segment_data_size: int | None  # None for headers shorter than 32 bytes


@dataclass(frozen=True, slots=True)
class PtdHeader:
    """The ``FH01`` header of a ``.ptd`` external data file."""

    length: int
    flatbuffer_offset: int
    flatbuffer_size: int
    segment_base_offset: int
    segment_data_size: int


def truncated(path: str, need: int, have: int) -> PteFormatError:
    """The error for a file that ends before what it describes does."""
    return PteFormatError(path, f"the file is truncated: needs {need} bytes, has {have}")


def _identifier(data: bytes | bytearray | memoryview, expected: bytes, what: str) -> None:
    ident = bytes(data[4:8]) if len(data) >= 8 else b""
    if ident == expected:
        return
    found = describe(data)
    if len(data) < 8:
        if found is not None and len(data) == 0:
            raise PteFormatError("header", f"not {what}: {found}")
        raise PteFormatError("header", f"{len(data)} bytes is too short for {what}")
    prefix = expected[:2]
    if ident[:2] == prefix and ident[2:].isalnum():
        raise PteFormatError(
            "header",
            f"unsupported {what.removeprefix('an ')} version '{ident.decode('ascii')}'; ptexec reads "
            f"'{expected.decode('ascii')}' (ExecuTorch 0.4 to 1.5)",
        )
    if found is not None:
        raise PteFormatError("header", f"not {what}: {found}")
    raise PteFormatError(
        "header", f"not {what}: file identifier {ident!r}, expected {expected.decode('ascii')!r}"
    )


def read_pte_header(data: bytes | bytearray | memoryview) -> PteHeader | None:
    """Check the ``ET12`` identifier and read the optional ``eh00`` header."""
    _identifier(data, PTE_IDENTIFIER, "an ExecuTorch program")
    if bytes(data[HEADER_OFFSET : HEADER_OFFSET + 4]) != PTE_HEADER_MAGIC:
        return None
    if len(data) < HEADER_OFFSET + 8:
        raise truncated("extended_header", HEADER_OFFSET + 8, len(data))
    length = _U32.unpack_from(data, HEADER_OFFSET + 4)[0]
    if length < PTE_HEADER_MIN_LENGTH:
        raise PteFormatError(
            "extended_header.length", f"{length} bytes, expected at least {PTE_HEADER_MIN_LENGTH}"
        )
    if len(data) < HEADER_OFFSET + length:
        raise truncated("extended_header", HEADER_OFFSET + length, len(data))
    program_size = _U64.unpack_from(data, HEADER_OFFSET + 8)[0]
    base = _U64.unpack_from(data, HEADER_OFFSET + 16)[0]
    seg_size = _U64.unpack_from(data, HEADER_OFFSET + 24)[0] if length >= 32 else None
    return PteHeader(length, program_size, base, seg_size)


def read_ptd_header(data: bytes | bytearray | memoryview) -> PtdHeader:
    """Check the ``FT01`` identifier and read the ``FH01`` header of a ``.ptd`` file."""
    _identifier(data, PTD_IDENTIFIER, "an ExecuTorch data file (.ptd)")
    if len(data) < HEADER_OFFSET + PTD_HEADER_MIN_LENGTH:
        raise truncated("ptd.header", HEADER_OFFSET + PTD_HEADER_MIN_LENGTH, len(data))
    if bytes(data[HEADER_OFFSET : HEADER_OFFSET + 4]) != PTD_HEADER_MAGIC:
        raise PteFormatError("ptd.header", f"missing {PTD_HEADER_MAGIC.decode()} header magic")
    length = _U32.unpack_from(data, HEADER_OFFSET + 4)[0]
    if length < PTD_HEADER_MIN_LENGTH:
        raise PteFormatError(
            "ptd.header.length", f"{length} bytes, expected at least {PTD_HEADER_MIN_LENGTH}"
        )
    fields = struct.unpack_from("<4Q", data, HEADER_OFFSET + 8)
    return PtdHeader(length, *fields)
