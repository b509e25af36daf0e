"""Generated code kept on disk between processes, as Python keeps a module's bytecode.

A load turns a method's instructions into Python text (:mod:`ptexec.codegen`), and
compiling that text is a large share of a first load: the code of a 400-instruction
method takes about 4 ms to compile, an eighth of its whole first load, and a 5-instruction
method's fast call (about 770 characters) 150-250 us, a tenth of its first load. The same
program gives the same text in every process, so a text of at least :data:`MIN_CHARS`
characters that a process compiles is kept as its code object under ``code/`` in the cache
root (:func:`ptexec.cachedir.cache_dir`), and a later process that generates the same
text reads the code object instead of compiling it (a read is tens of microseconds).
Only code objects are kept: the text itself is always generated afresh by the load, and
what the code runs with (kernels, tensors) is bound by the load, never read from disk.

**Key.** An entry's file name is the SHA-256 of the text, of the interpreter's bytecode
version (:data:`importlib.util.MAGIC_NUMBER`, the implementation's cache tag), its
optimisation level (``-O``) and of this store's layout: another Python never reads it.

**Trust.** Code read here runs, so it follows the compiled methods' rules
(:mod:`ptexec.cachedir`): the root must be trusted, the ``code`` directory and each file
must be a real directory or regular file owned by this user or root and not writable by
group or others (checked on the opened file, which is never a symbolic link, opened
without waiting: a FIFO there holds nothing up), and a
file's bytes must have the SHA-256 its header records (a torn or damaged file is a miss).
Anyone who can write there could run code as the loading user, which those rules exclude.
A problem of any kind is a miss: the text is compiled as if nothing were kept (and kept
again when this user writes the root); a load never fails or warns because of this store.

**Writing.** A file is written under a temporary name in the ``code`` directory and renamed
into place in one step, so readers see a whole file or none. The directory holds at most
:data:`MAX_ENTRIES` files of the store's, the least recently read removed first (a file
not named as the store names its files is never removed). ``PTEXEC_CODE_CACHE=0`` turns the
store off; ``ptexec cache list|verify|clear`` covers it. Imports no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import os
import re
import stat
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

from .cachedir import (
    cache_dir,
    checked_root,
    read_trusted,
    subdir_problem,
    trusted_subdir,
)
from .errors import CacheEntryError

__all__ = [
    "MAX_ENTRIES",
    "MIN_CHARS",
    "CodeFile",
    "clear",
    "clear_trusted",
    "code_dir",
    "enabled",
    "files",
    "load",
    "makes",
    "store",
]

# shorter texts compile in about the time a read (and its checks) takes; from 256 characters
# on, generated code takes 100-300 us to compile (about 0.2-0.3 us a character)
MIN_CHARS = 256
MAX_ENTRIES = 4096  # files kept in the directory, least recently read removed first
MAX_FILE_BYTES = 64 << 20  # a larger file is not read (none this store writes is near it)
LAYOUT = 1  # bump when what a file holds, or how it is read, changes
_MAGIC = b"ptexec-code\0"
_TAG = importlib.util.MAGIC_NUMBER + (sys.implementation.cache_tag or "").encode()
_HEADER = len(_MAGIC) + 1 + len(_TAG) + 32  # magic, layout, interpreter, payload digest
_NAME = re.compile(r"[0-9a-f]{64}")
_TEMP = ".tmp-"
_TEMP_NAME = re.compile(r"\.tmp-[a-z0-9_]{8}")  # (tempfile.mkstemp's: 8 of these characters)
SUBDIR = "code"


def _root() -> Path | None:
    """The cache root, or None when there is none (no home directory to put it in)."""
    try:
        return cache_dir()
    except (RuntimeError, KeyError, OSError):  # Path.home() of a user without one
        return None


def enabled() -> bool:
    """Whether the store is used (``PTEXEC_CODE_CACHE`` is not ``0``)."""
    return os.environ.get("PTEXEC_CODE_CACHE", "1").strip() not in ("0", "false", "no", "off")


def code_dir(root: Path | None = None) -> Path:
    """The directory of kept code under cache root ``root`` (default: ptexec's root)."""
    return (cache_dir() if root is None else root) / SUBDIR


def key(source: str) -> str:
    """The file name of ``source``'s code (module docstring)."""
    h = hashlib.sha256(_MAGIC)
    h.update(bytes([LAYOUT, sys.flags.optimize]))  # (-O drops asserts from the code)
    h.update(_TAG)
    h.update(source.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


# root -> (every directory and link its resolution meets (cachedir.way_to), each with its
# identity, owner and mode when found trusted; whether this user writes the root)
_Seen = tuple[tuple[str, tuple[int, int, int, int]], ...]
_roots: dict[str, tuple[_Seen, bool]] = {}


def _identity(path: str) -> tuple[int, int, int, int] | None:
    """A path's device, inode, owner and mode, links on it not followed at its end (the
    way as written holds links; what they lead to is among the resolved directories)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_uid, st.st_mode)


def _root_status(root: Path, create: bool) -> bool | None:
    """Whether this user writes trusted root ``root``; None when it is not trusted (or
    missing and not ``create``). The rules (:func:`ptexec.cachedir.checked_root`) are
    checked in full once per root in a process; later uses ``lstat`` every directory and
    link its resolution met again, and check in full when any identity, owner or mode has
    changed."""
    name = os.fspath(root)
    known = _roots.get(name)
    if known is not None and all(_identity(d) == seen for d, seen in known[0]):
        return known[1]
    problem, writable, way = checked_root(root, create=create)
    if problem is not None:
        _roots.pop(name, None)
        return None
    chain = [os.fspath(d) for d in way]
    seen = tuple((d, _identity(d)) for d in dict.fromkeys(chain))
    if any(i is None for _, i in seen):
        return None
    _roots[name] = (tuple((d, i) for d, i in seen if i is not None), writable)
    return writable


def clear_trusted() -> None:
    """Forget which roots were found trusted (the next use walks up each again)."""
    _roots.clear()


def _trusted_dir(root: Path, create: bool) -> tuple[Path, bool] | None:
    """The code directory under ``root`` and whether this user writes it, when trusted
    (made when ``create`` and the root is this user's); None otherwise."""
    writable = _root_status(root, create)
    if writable is None:
        return None
    directory = trusted_subdir(root, SUBDIR, writable, create)
    return None if directory is None else (directory, writable)


class _Foreign(CacheEntryError):
    """A whole file, for another interpreter or layout of this store (never read here)."""


def _read(path: Path) -> bytes:
    """The bytes of ``path`` after checking the opened file (never a link, trusted, not too
    large); :class:`CacheEntryError` says what is wrong."""
    return read_trusted(path, MAX_FILE_BYTES)


def _decode(path: Path, data: bytes) -> types.CodeType:
    """The code object a file's bytes hold; :class:`CacheEntryError` when they are not
    a whole, intact file of this store and interpreter."""
    head = len(_MAGIC)
    if len(data) < _HEADER or data[:head] != _MAGIC:
        raise CacheEntryError(f"{path} is not a file of ptexec's code store")
    if data[head] != LAYOUT or data[head + 1 : head + 1 + len(_TAG)] != _TAG:
        raise _Foreign(f"{path} was written for another ptexec or Python")
    digest, payload = data[_HEADER - 32 : _HEADER], data[_HEADER:]
    if hashlib.sha256(payload).digest() != digest:
        raise CacheEntryError(f"{path} does not have the sha256 its header records")
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError) as e:
        raise CacheEntryError(f"{path} holds no code object ({e})") from None
    if not isinstance(code, types.CodeType):
        raise CacheEntryError(f"{path} holds a {type(code).__name__}, not a code object")
    return code


def load(source: str) -> types.CodeType | None:
    """The kept code of ``source`` (compiled from it by an earlier process), or None: not
    kept, too short to be kept, the store off or not trusted, or the file damaged."""
    if len(source) < MIN_CHARS or not enabled():
        return None
    root = _root()
    found = None if root is None else _trusted_dir(root, create=False)
    if found is None:
        return None
    directory, writable = found
    path = directory / key(source)
    try:
        code = _decode(path, _read(path))
    except CacheEntryError:
        return None
    if writable:
        with contextlib.suppress(OSError):
            os.utime(path)  # read now: the last to be removed
    return code


def store(source: str, code: types.CodeType) -> None:
    """Keep ``code``, compiled from ``source``, for later processes (nothing when the text
    is short, the store off, or the root not this user's to write; a failure to write is
    ignored)."""
    if len(source) < MIN_CHARS or not enabled():
        return
    root = _root()
    found = None if root is None else _trusted_dir(root, create=True)
    if root is None or found is None or not found[1]:
        return
    directory = found[0]
    payload = marshal.dumps(code)
    data = b"".join((_MAGIC, bytes([LAYOUT]), _TAG, hashlib.sha256(payload).digest(), payload))
    try:
        share = stat.S_IMODE(os.stat(root).st_mode) & 0o044  # readers the root admits
        fd, temp = tempfile.mkstemp(prefix=_TEMP, dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(temp, 0o600 | share)
            os.replace(temp, directory / key(source))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
    except OSError:
        return
    _trim(directory)


def _trim(directory: Path) -> None:
    """Remove temporary files a writer that died left (an hour old), and the least
    recently read files while the directory holds more than :data:`MAX_ENTRIES` (down to
    three quarters of it). Only names the store makes are counted and removed: a ``code``
    folder of a project's (its folder named as the root) keeps its own files."""
    try:
        with os.scandir(directory) as it:
            names = [e.name for e in it]
    except OSError:
        return
    stale = time.time() - 3600
    for name in names:
        if _TEMP_NAME.fullmatch(name):
            with contextlib.suppress(OSError):
                if os.lstat(directory / name).st_mtime < stale:
                    os.unlink(directory / name)
    names = [name for name in names if _NAME.fullmatch(name)]
    if len(names) <= MAX_ENTRIES:
        return
    dated = []
    for name in names:
        with contextlib.suppress(OSError):
            dated.append((os.lstat(directory / name).st_mtime, name))
    dated.sort()
    for _, name in dated[: len(dated) - MAX_ENTRIES * 3 // 4]:
        with contextlib.suppress(OSError):
            os.unlink(directory / name)


@dataclass(frozen=True)
class CodeFile:
    """One file of the store as ``ptexec cache`` shows it: its path, its size, what is
    wrong with it (None: a whole, trusted file) and whether this interpreter reads it
    (a file another Python wrote is kept for that one)."""

    path: Path
    size: int
    problem: str | None
    current: bool


def files(root: Path | None = None) -> list[CodeFile]:
    """Every file in the store under cache root ``root`` (default ptexec's), checked; a
    directory loads read nothing from (a link, writable by others) is one file, that
    directory, with its problem."""
    directory = code_dir(root)
    problem = subdir_problem(directory.parent, SUBDIR)
    if problem is not None:
        return [CodeFile(directory, 0, f"{problem}: nothing in it is read", True)]
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out = []
    for name in names:
        path = directory / name
        try:
            size = os.lstat(path).st_size
        except OSError:
            continue
        problem, current = None, True
        try:
            if not _NAME.fullmatch(name):
                raise CacheEntryError(f"{path} is not named as this store names its files")
            _decode(path, _read(path))
        except _Foreign:
            current = False
        except CacheEntryError as e:
            problem = str(e)
        out.append(CodeFile(path, size, problem, current))
    return out


def makes(name: str) -> bool:
    """Whether ``name`` is one the store gives a file in ``code``: a code object (its
    key) or a writer's temporary file."""
    return bool(_NAME.fullmatch(name) or _TEMP_NAME.fullmatch(name))


def clear(root: Path | None = None) -> int:
    """Remove every file of the store under ``root`` (the names it writes,
    :func:`makes`: any other is kept); how many were removed. A ``code`` that is not a
    directory (a link) is removed itself, never followed: what it leads to is not the
    store's."""
    directory = code_dir(root)
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            os.unlink(directory)
            return 0
        names = os.listdir(directory)
    except OSError:
        return 0
    removed = 0
    for name in filter(makes, names):
        with contextlib.suppress(OSError):
            os.unlink(directory / name)
            removed += 1
    return removed
