"""External data files (``.ptd``, ``FT01``/``FH01``): named tensors for programs exported
with external constants."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PteFormatError
from .flatbuf import Buffer, Table
from .header import PtdHeader, read_ptd_header, truncated
from .scalar_type import element_size, is_known
from .validate import MAX_RANK

Bytes = bytes | bytearray | memoryview

SCHEMA_VERSION = 0  # the FlatTensor schema's version ExecuTorch reads (and no later)


@dataclass(frozen=True, slots=True)
class TensorLayout:
    scalar_type: int
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = element_size(self.scalar_type)
        for s in self.sizes:
            n *= s
        return n


@dataclass(frozen=True, slots=True)
class NamedTensor:
    key: str
    offset: int  # absolute byte offset in the file
    size: int  # bytes of the segment
    layout: TensorLayout | None


@dataclass(frozen=True)
class PtdFile:
    """A validated ``.ptd``: key -> bytes (and layout) without copying."""

    data: memoryview
    header: PtdHeader
    version: int
    entries: dict[str, NamedTensor]

    def bytes_of(self, key: str) -> memoryview:
        e = self.entries[key]
        return self.data[e.offset : e.offset + e.size]


def _layout(t: Table) -> TensorLayout:
    sizes = t.scalars(1, "i32", "sizes") or ()
    dim_order = t.scalars(2, "u8", "dim_order") or ()
    return TensorLayout(t.int_(0, "i8", "scalar_type"), sizes, dim_order)


def read_ptd(data: Bytes) -> PtdFile:
    """Parse and validate a ``.ptd`` external data file."""
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    header = read_ptd_header(view)
    size = len(view)
    flat_end = header.flatbuffer_offset + header.flatbuffer_size
    need = max(flat_end, header.segment_base_offset + header.segment_data_size)
    if need > size:
        raise truncated("ptd.header", need, size)
    root = Buffer(view[:flat_end]).root("ptd")
    version = root.int_(0, "u32", "version")
    if version > SCHEMA_VERSION:
        # (a later schema may give the fields read here another meaning)
        raise PteFormatError(
            "ptd.version",
            f"schema version {version} is newer than {SCHEMA_VERSION}, the one ExecuTorch's "
            "runtime and ptexec read",
        )
    segs = (
        root.tables(1, "segments", lambda t: (t.int_(0, "u64", "offset"), t.int_(1, "u64", "size")))
        or ()
    )
    base = header.segment_base_offset
    spans: list[tuple[int, int]] = []
    for i, (off, n) in enumerate(segs):
        start = base + off
        if start + n > size:
            raise PteFormatError(
                f"ptd.segments[{i}]",
                f"bytes {start}..{start + n} lie past the end of the file ({size} bytes, as "
                "long as its header says)",
            )
        spans.append((start, n))

    def named(t: Table) -> tuple[str, int, TensorLayout | None]:
        layout = t.table(2, "tensor_layout")
        return (
            t.string(0, "key") or "",
            t.int_(1, "u32", "segment_index"),
            None if layout is None else _layout(layout),
        )

    entries: dict[str, NamedTensor] = {}
    for i, (key, seg, layout) in enumerate(root.tables(2, "named_data", named) or ()):
        path = f"ptd.named_data[{i}]"
        if seg >= len(spans):
            raise PteFormatError(
                f"{path}.segment_index", f"segment {seg} out of range ({len(spans)} segments)"
            )
        if key in entries:
            raise PteFormatError(f"{path}.key", f"duplicate key {key!r}")
        start, n = spans[seg]
        if layout is not None:
            lpath = f"{path}.tensor_layout"
            if not is_known(layout.scalar_type):
                raise PteFormatError(
                    f"{lpath}.scalar_type", f"unknown scalar type {layout.scalar_type}"
                )
            if len(layout.sizes) > MAX_RANK or any(s < 0 for s in layout.sizes):
                raise PteFormatError(f"{lpath}.sizes", f"invalid sizes {list(layout.sizes)}")
            if sorted(layout.dim_order) != list(range(len(layout.sizes))):
                raise PteFormatError(
                    f"{lpath}.dim_order", f"invalid dim order {list(layout.dim_order)}"
                )
            if layout.nbytes > n:
                raise PteFormatError(lpath, f"{layout.nbytes} bytes needed, segment {seg} has {n}")
        entries[key] = NamedTensor(key, start, n, layout)
    return PtdFile(view, header, version, entries)


@dataclass(frozen=True)
class DataFiles:
    """Several ``.ptd`` files read as one: every key of every file, each from the file that
    holds it. A key in two files is allowed only when both hold the same bytes (and the
    same layout); ``entries`` then names the first."""

    files: tuple[PtdFile, ...]
    entries: dict[str, NamedTensor]
    owner: dict[str, int]  # key -> index in files

    def bytes_of(self, key: str) -> memoryview:
        return self.files[self.owner[key]].bytes_of(key)


def merge_ptd(files: tuple[PtdFile, ...]) -> DataFiles:
    """The named data of ``files`` merged (see :class:`DataFiles`); a key that two files
    give differently is the :class:`~ptexec.errors.PteFormatError`, naming both files by
    their position."""
    entries: dict[str, NamedTensor] = {}
    owner: dict[str, int] = {}
    for i, f in enumerate(files):
        for key, entry in f.entries.items():
            j = owner.get(key)
            if j is None:
                entries[key] = entry
                owner[key] = i
                continue
            first = files[j]
            if first is f:
                continue  # the same file given twice
            if entry.layout != entries[key].layout or f.bytes_of(key) != first.bytes_of(key):
                raise PteFormatError(
                    f"data file {i}, key {key!r}",
                    f"data files {j} and {i} both hold {key!r} with different "
                    f"{'layouts' if entry.layout != entries[key].layout else 'bytes'}; a key may be "
                    "in several data files only with the same contents",
                )
    return DataFiles(files, entries, owner)
