"""A loaded program: the mapped file, its external data, and its methods."""

from __future__ import annotations

import copy
import errno
import io
import mmap as _mmap
import os
import stat
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal, NoReturn, SupportsIndex

import torch

from .effects import constants_written
from .errors import (
    FileMissingError,
    FileUnreadableError,
    MethodNotFoundError,
    ProgramChangedError,
    PteFormatError,
)
from .format import program as p
from .format.identify import describe
from .format.ptd import DataFiles, PtdFile, merge_ptd, read_ptd
from .format.pte import PteFile, read_pte
from .gcpause import paused
from .loader import MethodMeta, method_meta
from .memory import BufferInfo, PlannedBuffer, allocate
from .method import Method
from .readonly import from_buffer

__all__ = ["Program", "load"]

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO
ShareState = Literal["auto", "never"]


def _stamp_key(st: os.stat_result) -> tuple[int, ...]:
    # ctime is in the key because no caller can set it back: a same-size rewrite with
    # the old mtime restored (os.utime, touch -r, rsync, tar) still moves it.
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _FileStamp:
    """What a memory-mapped file was when it was loaded, to notice it changing on disk."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.key = _stamp_key(os.fstat(fd))

    def check(self, what: str) -> None:
        try:
            st = os.stat(self.path)
        except OSError as e:
            raise ProgramChangedError(f"{what} {self.path} is gone ({e.strerror})") from None
        if _stamp_key(st) != self.key:
            raise ProgramChangedError(
                f"{what} {self.path} changed on disk since it was loaded with mmap=True; "
                "load it again (or load without mmap to keep a private copy)"
            )


def _private_memory(size: int) -> Any:
    """``size`` bytes of memory of this process's own: anonymous and private (a child made
    by fork gets a copy-on-write copy, never a shared view), page-aligned like a mapping."""
    flags = getattr(_mmap, "MAP_PRIVATE", 0) | getattr(_mmap, "MAP_ANONYMOUS", 0)
    if flags:
        return _mmap.mmap(-1, size, flags=flags)
    return bytearray(size)  # no such mapping here: still private, aligned as malloc aligns


def _open(path: Path, what: str) -> io.BufferedReader:
    """``path`` opened for reading, or the typed error saying why it cannot be: missing,
    a directory or other file that is not a regular one (a FIFO would block), no
    permission."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            kind = "a directory" if path.is_dir() else "not a regular file"
            code = errno.EISDIR if path.is_dir() else errno.EINVAL
            raise FileUnreadableError(code, f"the {what} is {kind}", str(path))
        f = open(path, "rb")  # noqa: SIM115 (the caller closes it: a with block)
    except FileNotFoundError as e:
        raise FileMissingError(e.errno, f"no such {what}", str(path)) from None
    except FileUnreadableError:
        raise
    except OSError as e:
        raise FileUnreadableError(
            e.errno, f"cannot read the {what}: {e.strerror}", str(path)
        ) from None
    return f


READ_IN_PLACE = 1 << 20  # bytes of at least this size are read in place, not copied


def _map(source: Source, what: str, mapped: bool) -> tuple[memoryview, Any, _FileStamp | None]:
    """The bytes of ``source`` as a memoryview (writable unless ``bytes`` read in place),
    the object that owns them, and for a memory-mapped file its stamp.

    A path is read into private memory (``mapped`` False, the default): later changes to
    the file cannot reach the loaded program. With ``mapped``, it is memory-mapped
    copy-on-write: the file is read lazily and constants are views of the mapping (resident
    memory grows only with the pages used), but the file must stay as it is while the
    program lives (truncating it in place kills the process with SIGBUS when a constant is
    next read, as with any memory map; rewriting it in place changes the constants).
    ``bytes`` (and what a file object's ``read`` returns) of :data:`READ_IN_PLACE` bytes or
    more are immutable and read in place, constants too unless an instruction may write
    one (then those are copied on first use, since torch has no read-only tensors:
    :meth:`Program.tensor_from_memory`); smaller ones, and a read-only memoryview, are
    copied once into a ``bytearray``; a ``bytearray`` or writable memoryview is copied once
    into private memory (its owner may fill it again: a read buffer reused, a file mapped
    for writing), as ExecuTorch's ``Runtime.load_program`` copies a bytearray.
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        with _open(path, what) as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise PteFormatError("header", f"{what} {path}: {describe(b'')}")
            if mapped:
                stamp = _FileStamp(path, f.fileno())
                mapping = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_COPY)
                return memoryview(mapping), mapping, stamp
            private = _private_memory(size)
            view = memoryview(private)
            got = f.readinto(view)
            if got != size or f.read(1):
                raise ProgramChangedError(f"{what} {path} changed size while it was read")
        return view, private, None
    if isinstance(source, bytes) and len(source) >= READ_IN_PLACE:
        # immutable: read in place (a delegate's payload and the constants are only ever
        # read; Program.tensor_from_memory copies those an instruction may write)
        return memoryview(source), source, None
    if isinstance(source, bytes):  # small: one copy costs less than a copy per constant
        owner = bytearray(source)
        return memoryview(owner), owner, None
    if isinstance(source, bytearray | memoryview):
        view = memoryview(source)
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        if view.readonly:
            owner = bytearray(view)
            return memoryview(owner), owner, None
        # the caller's and writable: what it writes later must not reach the program
        private = _private_memory(max(len(view), 1))
        copy = memoryview(private)[: len(view)]
        copy[:] = view
        return copy, private, None
    if isinstance(source, io.IOBase) or hasattr(source, "read"):
        read = source.read()
        if isinstance(read, bytes) and len(read) >= READ_IN_PLACE:  # nobody else holds it
            return memoryview(read), read, None
        owner = bytearray(read)
        return memoryview(owner), owner, None
    raise TypeError(f"cannot load a program from {type(source).__name__}")


class Program:
    """An ExecuTorch program loaded from a ``.pte``: validated, memory-mapped, ready to load
    its methods. Create it with :func:`ptexec.load`."""

    def __init__(
        self,
        pte: PteFile,
        owner: Any,
        ptd: DataFiles | None = None,
        ptd_owner: Any = None,
        share_state: ShareState = "auto",
        stamps: tuple[_FileStamp | None, ...] = (),
        paths: tuple[Path | None, ...] = (),
        mapped: bool = False,
    ) -> None:
        self.pte = pte
        # where the program's file and its data files were read from (None: bytes), for
        # a compile in another process (ptexec.compile.background)
        self.paths = paths
        # whether its files are memory-mapped (``load(..., mmap=True)``): only then may
        # another process compiling it map them too (a file read into private memory may
        # be rewritten under a mapping between the key's digest and the compile)
        self.mapped = mapped
        self.ptd = ptd
        self._owners = (owner, ptd_owner)
        self._stamps = tuple(s for s in stamps if s is not None)
        self._lock = threading.Lock()
        self.state_lock = threading.Lock()  # held by calls of methods using shared state
        self._shared: dict[int, PlannedBuffer] = {}
        # (address, size) -> a copy, of read-only bytes that tensors view, where an
        # instruction may write them
        self._copies: dict[tuple[int, int], torch.Tensor] = {}
        # whether an instruction of a method may write a constant (None: not yet asked)
        self._constants_written: bool | None = None
        self.shared_buffer_indices = _shared_state_buffers(pte.program, share_state)
        # a key in both is the data file's, as external tensors read it (external_bytes)
        # and as ExecuTorch's runtime looks its data file up before the program's
        named: dict[str, memoryview] = dict(pte.named_data())
        if ptd is not None:
            for key in ptd.entries:
                named[key] = ptd.bytes_of(key)
        self.named_data: Mapping[str, memoryview] = named

    # -- methods -------------------------------------------------------------------------
    @property
    def method_names(self) -> tuple[str, ...]:
        """The names of the program's methods, in file order."""
        return tuple(plan.name for plan in self.pte.program.execution_plan)

    def _plan_index(self, name: str) -> int:
        for i, plan in enumerate(self.pte.program.execution_plan):
            if plan.name == name:
                return i
        raise MethodNotFoundError(
            f"no method '{name}' in this program (methods: {', '.join(self.method_names)})"
        )

    def load_method(self, name: str = "forward", **options: Any) -> Method:
        """Load method ``name``: allocate its planned buffers on their devices and prepare
        its instructions. Options: ``device_map``, ``transfers``, ``layout``, ``outputs``,
        ``max_planned_bytes``, ``max_instructions``, ``optimize``, ``fast_path``,
        ``cuda_graph``, ``compile`` (see :class:`Method`). Each call
        returns a new Method with its own planned memory (state shared between methods
        stays shared). A program loaded with ``mmap=True`` whose file changed on disk is
        refused with :class:`~ptexec.errors.ProgramChangedError`. The method's memory is
        made of ordinary tensors whatever the caller's mode: under ``torch.inference_mode``
        they would be inference tensors, which no call outside that mode (another thread's,
        whose mode is off) could write."""
        for stamp in self._stamps:
            stamp.check("the program's file")
        with paused(), torch.inference_mode(False):
            return Method(self, self._plan_index(name), **options)

    def with_own_state(self) -> Program:
        """This program with state of its own: methods loaded from the result share the
        state the program's methods share (``share_mutable_buffers``) among themselves,
        never with methods loaded from ``self``. The file, its data files and the constants
        stay the ones ``self`` holds (nothing is read or copied again). What a session
        keeping a context of its own (an LLM runner's KV cache) loads its methods from; a
        program whose methods share no state is returned as it is."""
        if not self.shared_buffer_indices:
            return self
        other = copy.copy(self)
        other._shared = {}  # (``_lock`` stays one: it also guards the constants' copies)
        other.state_lock = threading.Lock()
        return other

    def method_meta(self, name: str = "forward", device_map: Any = None) -> MethodMeta:
        """Inputs, outputs and memory plan of method ``name``, without loading it."""
        return method_meta(
            self, self.pte.program.execution_plan[self._plan_index(name)], device_map
        )

    @property
    def version(self) -> int:
        return self.pte.program.version

    def __repr__(self) -> str:
        return f"<ptexec.Program methods={list(self.method_names)}>"

    def __copy__(self) -> Program:
        """A shallow copy: the same file, constants and state (:meth:`with_own_state`
        makes one whose methods have state of their own)."""
        other = Program.__new__(Program)
        other.__dict__.update(self.__dict__)
        return other

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        # (pickle reached the file's memoryview and named only that; a deep copy too)
        raise TypeError(
            "cannot pickle or deep-copy a ptexec.Program (it holds its file's memory): "
            "ptexec.load its file where it is needed, or use with_own_state() for "
            "methods with state of their own"
        )

    # -- memory (for methods) ------------------------------------------------------------
    def shared_buffer(self, info: BufferInfo) -> tuple[PlannedBuffer, bool]:
        """The program-wide buffer holding state shared by all methods; (buffer, is_new)."""
        with self._lock:
            buf = self._shared.get(info.index)
            if buf is not None:
                if buf.info.device != info.device or buf.info.size < info.size:
                    raise PteFormatError(
                        f"non_const_buffer_sizes[{info.index}]",
                        f"shared state buffer {info.index} is {buf.info.size} bytes on "
                        f"{buf.info.device}; this method wants {info.size} bytes on {info.device}",
                    )
                return buf, False
            buf = allocate(info)
            self._shared[info.index] = buf
            return buf, True

    def tensor_from_memory(self, data: memoryview) -> torch.Tensor:
        """A uint8 tensor over ``data`` (a slice of the program's or data file's bytes).

        The bytes are viewed in place when no instruction of any of the program's methods
        may write a constant (:func:`~ptexec.effects.constants_written`: ExecuTorch's
        exporter writes none); otherwise they are copied, once per program and slice: torch
        has no read-only tensors, nothing a program does may write into its caller's
        ``bytes``, and a data file's private copy is shared by the programs that read it
        (one program's writes would change another's weights)."""
        return self.tensors_from_memory((data,))[0]

    def tensors_from_memory(self, data: Sequence[memoryview]) -> list[torch.Tensor]:
        """:meth:`tensor_from_memory` of each of ``data``, in order (a load's constants
        at once: one warnings block for all the read-only ones)."""
        with self._lock:
            if self._constants_written is None:
                plans = self.pte.program.execution_plan
                self._constants_written = any(constants_written(plan) for plan in plans)
            written = self._constants_written
        over = [from_buffer(d) for d in data]  # read-only bytes: read, never written
        if not written:
            return over
        out = []
        with self._lock:
            for t, d in zip(over, data, strict=True):
                key = (t.data_ptr(), len(d))
                copy = self._copies.get(key)
                if copy is None:
                    copy = self._copies[key] = t.clone()
                out.append(copy)
        return out

    def external_bytes(self, t: p.Tensor, path: str) -> memoryview:
        """The bytes of an external tensor (from the ``.ptd``, or the program's named data)."""
        extra = t.extra_tensor_info
        key = extra.fully_qualified_name if extra is not None else None
        if not key:
            raise PteFormatError(path, "external tensor without a name")
        if self.ptd is not None and key in self.ptd.entries:
            entry = self.ptd.entries[key]
            layout = entry.layout
            if layout is not None and (
                layout.scalar_type != t.scalar_type
                or layout.sizes != t.sizes
                or layout.dim_order != t.dim_order
            ):
                raise PteFormatError(
                    path,
                    f"external tensor '{key}' is {layout.sizes} (type {layout.scalar_type}, dim "
                    f"order {layout.dim_order}) in the data file, the program expects {t.sizes} "
                    f"(type {t.scalar_type}, dim order {t.dim_order})",
                )
            if entry.size < t.nbytes:
                raise PteFormatError(
                    path, f"external tensor '{key}' has {entry.size} bytes, needs {t.nbytes}"
                )
            return self.ptd.bytes_of(key)[: t.nbytes]
        data = self.named_data.get(key)
        if data is not None and len(data) >= t.nbytes:
            return data[: t.nbytes]
        if self.ptd is None:
            raise PteFormatError(
                path,
                f"external tensor '{key}' lives in a separate data file (.ptd); pass it with "
                "ptexec.load(..., data_path=...)",
            )
        raise PteFormatError(path, f"external tensor '{key}' is not in the data file")


def _shared_state_buffers(program: p.Program, share_state: ShareState) -> frozenset[int]:
    """Buffer indices that hold state shared by all methods.

    ExecuTorch's ``share_mutable_buffers=True`` puts every method's mutable state at the
    same offsets of buffer 2, a CPU buffer of equal size appended to every planned method's
    plan, and expects the runtime to give all methods one such buffer. The file has no flag
    for it, so ``"auto"`` recognises that shape: two or more methods with planned memory,
    each with exactly buffers 1 and 2, buffer 2 on the CPU with no device entry, and the
    same size everywhere. Plans without planned memory (the constant methods an LLM's
    metadata is written as) hold no state and are not planned, so they do not count.
    ``"never"`` gives every method its own buffers.
    """
    if share_state == "never":
        return frozenset()
    if share_state != "auto":
        raise ValueError(f"share_state must be 'auto' or 'never', not {share_state!r}")
    # (index 0 of the sizes is reserved: a plan with no more has no planned memory)
    plans = [plan for plan in program.execution_plan if len(plan.non_const_buffer_sizes) > 1]
    if len(plans) < 2:
        return frozenset()
    sizes = set()
    for plan in plans:
        if len(plan.non_const_buffer_sizes) != 3:
            return frozenset()
        if any(e.buffer_idx == 2 for e in plan.non_const_buffer_device or ()):
            return frozenset()
        sizes.add(plan.non_const_buffer_sizes[2])
    return frozenset({2}) if len(sizes) == 1 else frozenset()


DataSource = str | os.PathLike[str] | bytes | bytearray | memoryview
DataPath = DataSource | Sequence[DataSource] | None


class _SharedData:
    """One data file read once, for every program loaded from it while any lives."""

    def __init__(
        self,
        view: memoryview,
        owner: Any,
        stamp: _FileStamp | None,
        ptd: PtdFile,
        path: Path | None = None,
    ) -> None:
        self.view, self.owner, self.stamp, self.ptd = view, owner, stamp, ptd
        self.path = path


_shared_data: weakref.WeakValueDictionary[tuple[Any, ...], _SharedData] = (
    weakref.WeakValueDictionary()
)
_shared_lock = threading.Lock()


def _read_data_file(source: DataSource, mapped: bool) -> _SharedData:
    """A data file, read and validated; a path already read (the same file, unchanged, read
    the same way) by a program still alive is not read again (a LoRA adapter's foundation
    weights shared by several programs live in memory once)."""
    if not isinstance(source, str | os.PathLike):
        view, owner, stamp = _map(source, "data file", mapped)
        return _SharedData(view, owner, stamp, read_ptd(view))
    path = Path(source)
    try:
        st = os.stat(path)
        key: tuple[Any, ...] | None = (
            os.path.realpath(path),
            st.st_dev,
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            mapped,
        )
    except OSError:
        key = None  # _map reports it
    with _shared_lock:
        found = _shared_data.get(key) if key is not None else None
        if found is not None:
            return found
        view, owner, stamp = _map(source, "data file", mapped)
        data = _SharedData(view, owner, stamp, read_ptd(view), Path(os.path.realpath(path)))
        if key is not None:
            _shared_data[key] = data
        return data


def _data_sources(data_path: DataPath) -> list[DataSource]:
    if data_path is None:
        return []
    if isinstance(data_path, str | os.PathLike | bytes | bytearray | memoryview) or hasattr(
        data_path, "read"
    ):
        return [data_path]  # type: ignore[list-item]  # a binary file object, read as a source
    if isinstance(data_path, Sequence):
        sources: list[DataSource] = []
        for i, item in enumerate(data_path):
            if not isinstance(item, str | os.PathLike | bytes | bytearray | memoryview):
                raise TypeError(
                    f"data_path[{i}]: expected a path or bytes of a .ptd file, got "
                    f"{type(item).__name__}"
                )
            sources.append(item)
        return sources
    raise TypeError(
        f"data_path: expected a path, bytes or a list of them, got {type(data_path).__name__}"
    )


def missing_external_keys(pte: PteFile) -> set[str]:
    """The names of the program's external tensors that its own named data lacks: what
    a data file must give."""
    named = set(pte.named_data())
    keys = set()
    for plan in pte.program.execution_plan:
        for value in plan.values:
            if isinstance(value, p.Tensor) and value.is_external:
                extra = value.extra_tensor_info
                key = extra.fully_qualified_name if extra is not None else None
                if key and key not in named:
                    keys.add(key)
    return keys


def data_files_beside(path: Path, needed: set[str], mapped: bool) -> list[_SharedData]:
    """The ``.ptd`` files in the program's folder that give ``needed`` keys, as exporters
    save them (``model.pte`` next to ``model.ptd`` or ``<tag>.ptd``): ``<stem>.ptd``
    first; the keys it lacks from the other files, each of which is read and validated and
    kept when it holds one of them. A key still needed that two of those files hold (the
    adapters of a LoRA export side by side, two checkpoints of one model) is a
    :class:`PteFormatError` naming them: which file is the program's is the caller's to
    say (``data_path``), never a guess by file name."""
    folder = path.parent
    stem = folder / (path.stem + ".ptd")
    found: list[_SharedData] = []
    left = set(needed)
    if stem.is_file():
        data = _read_data_file(stem, mapped)
        if left & data.ptd.entries.keys():
            found.append(data)
            left -= data.ptd.entries.keys()
    if not left:
        return found
    holders: dict[str, list[str]] = {}
    candidates: list[_SharedData] = []
    for candidate in sorted(q for q in folder.glob("*.ptd") if q != stem and q.is_file()):
        data = _read_data_file(candidate, mapped)
        held = left & data.ptd.entries.keys()
        if held:
            candidates.append(data)
            for key in held:
                holders.setdefault(key, []).append(candidate.name)
    shared = sorted(key for key, names in holders.items() if len(names) > 1)
    if shared:
        key = shared[0]
        raise PteFormatError(
            f"external tensor '{key}'",
            f"{path.name} needs it ({len(shared)} such keys) and several data files beside "
            f"it hold it ({', '.join(holders[key])}): pass the program's own with data_path",
        )
    return found + candidates


def load(
    source: Source,
    *,
    data_path: DataPath = None,
    share_state: ShareState = "auto",
    mmap: bool = False,
) -> Program:
    """Load and validate an ExecuTorch program (a path, bytes, or a binary file object).

    ``data_path`` is the external data file (``.ptd``) of a program exported with external
    constants, or a list of them: their named data is merged (a key in two files must have
    the same bytes in both, else :class:`~ptexec.errors.PteFormatError`), and a file that a
    live program already read is shared, not read again. Without ``data_path``, a program
    loaded from a path that needs external tensors finds them in the ``.ptd`` files beside
    it (``<stem>.ptd`` first; a tensor two other files there hold is refused, not guessed),
    the way optimum-executorch saves them. Files, and a ``bytearray`` or writable
    ``memoryview``, are read into private memory, so nothing done to them afterwards
    reaches the program (``bytes`` are immutable and read in place); ``mmap=True`` maps them instead (copy-on-write: loading reads
    only what it needs, constants are views of the file and resident memory grows with
    the pages used), for programs too large to copy, on the condition that the files stay
    as they are while the program lives (``load_method`` refuses a file whose device,
    inode, size, mtime or ctime changed). A mapped file truncated by another process
    kills this process with SIGBUS (not an exception) when a constant past the new end
    is next read; so replace a mapped file by writing a new one and renaming it over the
    old (the mapping keeps the old file), never rewrite it in place, and load without
    ``mmap`` a file others may rewrite.
    Raises :class:`~ptexec.errors.PteFormatError` for any defect in either file,
    :class:`~ptexec.errors.FileMissingError` for a path that is not there and
    :class:`~ptexec.errors.FileUnreadableError` for one that cannot be read (a directory,
    no permission), each also a ``RuntimeError`` and an ``OSError``.
    """
    sources = _data_sources(data_path)
    view, owner, stamp = _map(source, "program file", mmap)
    with paused():
        pte = read_pte(view)
        files = [_read_data_file(s, mmap) for s in sources]
        if not sources and isinstance(source, str | os.PathLike):
            needed = missing_external_keys(pte)
            if needed:
                files = data_files_beside(Path(source), needed, mmap)
        ptd = merge_ptd(tuple(f.ptd for f in files)) if files else None
        where = Path(os.path.realpath(source)) if isinstance(source, str | os.PathLike) else None
        return Program(
            pte,
            owner,
            ptd,
            tuple(files),
            share_state,
            (stamp, *(f.stamp for f in files)),
            (where, *(f.path for f in files)),
            mapped=mmap,
        )
