"""The on-disk cache of compiled methods: one directory per key, trusted, checked, atomic.

**Key.** It digests everything the compiled code depends on: the program's bytes (and its
external data file's), the method, the device and what the code is built for (on the CPU
the instruction-set extensions ``-march=native`` resolves to, read from the CPU's feature
flags, or the ``-march`` AOTInductor is configured with, and the thread count the code is
made for, unless every CPU region runs serial kernels; on CUDA the GPU's compute capability), the compile options, and the versions of
torch, Python, ptexec (its version and a digest of its sources) and this cache's layout.

**Entry.** A directory holding the compiled regions (a shared library per CPU region, one
package of the CUDA ones) and ``manifest.json`` (:mod:`.manifest`: the regions, their
guards, what fell back and why, and the size and sha256 of every file). It is assembled
in a staging directory next to its final place, every file and the directory synced, and
renamed there in one step, so a reader sees a complete entry or none, and two processes
compiling one key cannot corrupt it (the second rename loses and its copy is dropped).

**Trust.** Loading a library runs its code, so whoever can write to the cache must be the
user who loads from it. The root is used only when it, and every directory above it, is
owned by this user or by root and not writable by group or others (a sticky directory
such as ``/tmp`` above it is fine); an entry and its files likewise, each a real directory
or regular file (never a symbolic link), with exactly the files its manifest lists, each
of its recorded size and digest, checked before anything is loaded (a file this process
hashed before is not hashed again while its inode, size and modification and change
times are the ones it had then: writing it changes them; a file changed in the two
seconds before it was hashed is hashed every time, as a write within one time stamp may
not show; writes through a shared memory map, which only the file's owner or root can
make, may not show until the system writes them back). A root owned by root
while this user is not (a cache an administrator filled) is read only: its entries are
used, what this user compiles is not kept. Entries are created with the root's read
permissions, so such a shared cache is readable by those the administrator chose. A root
that fails these rules is not used at all (:func:`open_cache` warns once and the load
compiles in a private temporary directory); an entry that fails them is a miss (one
warning; it is replaced when the cache is writable). No cache problem fails a load. (On
Windows, where files have no POSIX owner, the per-user directory's own permissions are
relied on.)

**Housekeeping.** After each new entry, staging directories of compiles that died are
removed and the least recently used entries (a hit marks its entry used) are evicted
while the cache holds more than ``PTEXEC_CACHE_MAX_BYTES`` (bytes, or with a ``K``, ``M``,
``G`` suffix; 0 for no limit; default 10G); not in a root that holds anything a cache
does not (a project's folder named as the root: its files are not the cache's to remove,
one warning). ``ptexec cache list|verify|clear`` shows,
checks and empties it.

The root is ``PTEXEC_CACHE_DIR`` when set, else ``ptexec`` under the user's cache
directory (``XDG_CACHE_HOME`` or ``~/.cache``; ``~/Library/Caches`` on macOS,
``LOCALAPPDATA`` on Windows).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cachedir import READ_FLAGS, alive, cache_dir, host, root_status
from ..cachedir import check_trusted as _check
from ..errors import CacheEntryError
from ..version import __version__
from .manifest import FileRecord, Manifest, parse, valid_name
from .report import CompileWarning

if TYPE_CHECKING:
    from ..program import Program

__all__ = [
    "INDUCTOR_SUBDIR",
    "Cache",
    "CacheEntry",
    "cache_dir",
    "cache_key",
    "content_digest",
    "foreign_names",
    "max_bytes",
    "open_cache",
    "program_digest",
    "root_status",
    "start_program_digest",
    "warn_once",
]

LAYOUT_VERSION = 2  # bump when what is stored, or how it is read, changes
MANIFEST = "manifest.json"
DEFAULT_MAX_BYTES = 10 * 1024**3
_MANIFEST_LIMIT = 16 * 1024**2
_KEY = re.compile(r"[0-9a-f]{64}")
_STAGING = ".staging-"
_TRASH = ".trash-"
# the names compiles give what they leave in the root (and only these are theirs): a
# staging directory, ``.staging-<pid>-<host>-<the key's first 16 digits>-`` and
# ``mkdtemp``'s 8 characters; an entry being removed, ``.trash-<16 digits of its key>-``
# and 8 hex digits
_STAGING_NAME = re.compile(r"\.staging-([0-9]+)-([0-9a-f]{8})-[0-9a-f]{16}-[a-z0-9_]{8}")
_TRASH_NAME = re.compile(r"\.trash-[0-9a-f]{16}-[0-9a-f]{8}")
_STALE_SECONDS = 24 * 3600  # a staging directory of another host, or older: its compile died
INDUCTOR_SUBDIR = "inductor"
"""The directory under the cache root that holds torch's kernels
(:func:`ptexec.compile.aoti.inductor_cache`)."""


_warned: set[str] = set()


def warn_once(text: str, stacklevel: int = 2) -> None:
    """One :class:`CompileWarning` per distinct text in a process."""
    if text not in _warned:
        _warned.add(text)
        warnings.warn(text, CompileWarning, stacklevel=stacklevel + 1)


def max_bytes() -> int:
    """The size cap (``PTEXEC_CACHE_MAX_BYTES``; 0: none)."""
    text = os.environ.get("PTEXEC_CACHE_MAX_BYTES", "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    m = re.fullmatch(r"([0-9]+)\s*([kKmMgGtT]?)[bB]?", text)
    if m is None:
        warn_once(f"PTEXEC_CACHE_MAX_BYTES={text!r} is not a size (like 500M or 10G): using 10G")
        return DEFAULT_MAX_BYTES
    scale = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[m.group(2).lower()]
    return int(m.group(1)) * scale


# ---- the key ---------------------------------------------------------------------------


@functools.cache
def _cpu_features() -> str:
    """The CPU's instruction-set feature flags (what ``-march=native`` builds for)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    flags = sorted(set(value.split()))
                    return hashlib.sha256(" ".join(flags).encode()).hexdigest()[:32]
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_target() -> str:
    """What AOTInductor's C++ compiler builds CPU code for: its configured ``-march``, else
    this CPU's features (``-march=native``, its default)."""
    config = sys.modules.get("torch._inductor.config")
    cpp = getattr(config, "cpp", None)
    march = getattr(cpp, "march", None) if cpp is not None else None
    if march is None:
        march = os.environ.get("TORCHINDUCTOR_CPP_MARCH")
    if march and march != "native":
        return f"march={march}"
    return f"native features {_cpu_features()}"


def _machine(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        major, minor = torch.cuda.get_device_capability(index)
        # its CPU regions, if any, are built for this CPU
        return f"cuda sm_{major}{minor} cuda {torch.version.cuda} {_cpu_target()}"
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{platform.machine()} {capability} {_cpu_target()}"


@functools.cache
def _source_digest() -> str:
    """A digest of ptexec's own Python sources: what traces a program (the kernels' and the
    delegates' torch code, the rebuild) is part of what the compiled code depends on, and a
    changed ptexec must not read an entry an older one wrote (even at the same version)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def content_digest(blobs: Iterable[memoryview | bytes]) -> bytes:
    """sha256 of ``blobs`` (a program's bytes and its data files'), each after its length."""
    h = hashlib.sha256()
    for blob in blobs:
        h.update(len(blob).to_bytes(8, "little"))
        h.update(blob)
    return h.digest()


class _Digest:
    """The content digest of one program, computed once, on a thread of its own when
    asked early (:func:`start_program_digest`): hashing releases the GIL, so a method's
    loading goes on beside it."""

    def __init__(self, blobs: tuple[memoryview | bytes, ...]) -> None:
        self._blobs: tuple[memoryview | bytes, ...] | None = blobs
        self._value: bytes | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._value is not None:
                return
            self._thread = threading.Thread(
                target=self._compute, name="ptexec-program-digest", daemon=True
            )
            self._thread.start()

    def _compute(self) -> None:
        try:
            blobs = self._blobs
            assert blobs is not None
            self._value = content_digest(blobs)
        except BaseException as e:  # given to the caller of value()
            self._error = e
        self._blobs = None

    def value(self) -> bytes:
        with self._lock:
            thread = self._thread
            if thread is None and self._value is None:
                self._compute()
        if thread is not None:
            thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


_DIGESTS: weakref.WeakKeyDictionary[Program, _Digest] = weakref.WeakKeyDictionary()
_DIGESTS_LOCK = threading.Lock()


def _digest_of(program: Program) -> _Digest:
    with _DIGESTS_LOCK:
        found = _DIGESTS.get(program)
        if found is None:
            blobs: list[memoryview | bytes] = [program.pte.data]
            if program.ptd is not None:
                blobs.extend(f.data for f in program.ptd.files)
            found = _DIGESTS[program] = _Digest(tuple(blobs))
        return found


def start_program_digest(program: Program) -> None:
    """Start hashing ``program``'s bytes on a thread of its own (a compiled load asks as
    it begins: the key needs the digest only after the method is prepared)."""
    _digest_of(program).start()


def program_digest(program: Program) -> bytes:
    """:func:`content_digest` of ``program``'s bytes and its data files', computed once
    per loaded program (its methods' keys share it). The bytes are the ones the program
    was validated from, which it keeps read only."""
    return _digest_of(program).value()


def cache_key(
    content: bytes,
    method: str,
    device: str,
    options: Mapping[str, Any],
    threads: bool = True,
) -> str:
    """The key of a compiled method (module docstring); ``content``: the
    :func:`content_digest` of the program's bytes (:func:`program_digest`). ``threads``
    False: the code is the same at any thread count (every CPU region's kernels run on
    the calling thread, or there is no CPU region), so the count is left out of the key.
    A method on another device can have CPU regions too, so the device does not decide."""
    import torch

    h = hashlib.sha256(content)
    meta = {
        "method": method,
        "device": device,
        "machine": _machine(device),
        # AOTInductor's CPU kernels are made for the thread count of the compile
        # (``omp parallel num_threads(n)``): code for another count is another entry
        "threads": torch.get_num_threads() if threads else None,
        "options": dict(options),
        "torch": torch.__version__,
        "ptexec": __version__,
        "sources": _source_digest(),
        "layout": LAYOUT_VERSION,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


def open_cache(root: Path | None = None) -> Cache | None:
    """The cache at ``root`` (default :func:`cache_dir`, made when missing), or None when
    it may not be used (one warning says why)."""
    root = cache_dir() if root is None else root
    problem, writable = root_status(root, create=True)
    if problem is not None:
        warn_once(
            f"the compile cache is not used: {problem}; compiled code goes to a private "
            "temporary directory and is not kept",
            stacklevel=3,
        )
        return None
    return Cache(root, writable)


def foreign_names(root: Path) -> list[str]:
    """The names in ``root`` that no ptexec cache holds, sorted: none in a cache's own
    root; some in a project's folder named as one (``PTEXEC_CACHE_DIR``, ``--dir``),
    whose ``code``, ``native`` or ``inductor`` folders are then its own, never emptied or
    removed as the stores'. ``OSError`` when ``root`` cannot be listed."""
    from .. import codestore, libstore

    stores = {codestore.SUBDIR, libstore.SUBDIR, INDUCTOR_SUBDIR}
    return sorted(n for n in os.listdir(root) if n not in stores and not Cache.makes(n))


# ---- the cache and its entries ---------------------------------------------------------


def _remove(path: Path) -> None:
    """Delete ``path``: a real directory with all it holds, anything else (a link, a
    FIFO) itself, never what a link leads to."""
    try:
        directory = stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return
    if directory:
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _move_aside(path: Path) -> None:
    """Remove an entry: renamed first (readers never see half of one), then deleted."""
    trash = path.parent / f"{_TRASH}{path.name[:16]}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(path, trash)
    except OSError:
        return
    _remove(trash)


def _fsync_dir(path: Path) -> None:
    if os.name == "nt":  # a directory cannot be opened there; its entries are durable
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(f: io.BufferedIOBase, size: int) -> str:
    if size <= 1 << 26:  # one read: the common library is a few MB
        return hashlib.sha256(f.read()).hexdigest()
    h = hashlib.sha256()
    while chunk := f.read(1 << 24):
        h.update(chunk)
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Cache:
    """A usable cache root (:func:`open_cache`); ``writable``: this user keeps new
    entries in it (else it is read only)."""

    root: Path
    writable: bool

    def entry(self, key: str) -> CacheEntry:
        return CacheEntry(self, key)

    def entries(self) -> list[CacheEntry]:
        """Every entry directory (by name), least recently used first."""
        try:
            names = [n for n in os.listdir(self.root) if _KEY.fullmatch(n)]
        except OSError:
            return []
        found = [self.entry(n) for n in names]
        return sorted(found, key=lambda e: e.last_used())

    @staticmethod
    def makes(name: str) -> bool:
        """Whether ``name`` is one the cache makes in its root: an entry, a compile's
        staging directory or an entry being removed, by the exact names it gives them."""
        return any(p.fullmatch(name) for p in (_KEY, _STAGING_NAME, _TRASH_NAME))

    def leftovers(self) -> list[Path]:
        """Staging directories of compiles that died, and half-removed entries, by the
        names compiles give them (:meth:`makes`)."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        now, here = time.time(), host()
        out = []
        for name in names:
            path = self.root / name
            if _TRASH_NAME.fullmatch(name):
                out.append(path)
            elif staged := _STAGING_NAME.fullmatch(name):
                try:
                    age = now - os.lstat(path).st_mtime
                except OSError:
                    continue
                mine = staged.group(2) == here
                if age > _STALE_SECONDS or (mine and not alive(int(staged.group(1)))):
                    out.append(path)
        return out

    def _only_ours(self) -> bool:
        """Whether the root holds nothing a cache does not (:func:`foreign_names`), so that
        what housekeeping removes by its name is the cache's (a project's folder named as
        the root keeps its files, as ``cache clear`` refuses it); one warning when not."""
        try:
            foreign = foreign_names(self.root)
        except OSError:
            return False
        if foreign:
            shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
            warn_once(
                f"the compile cache {self.root} holds what no ptexec cache holds ({shown}): "
                "nothing in it is evicted or removed, so PTEXEC_CACHE_MAX_BYTES is not kept; "
                "give the cache a directory of its own",
                4,
            )
        return not foreign

    def remove_leftovers(self) -> None:
        """Remove what :meth:`leftovers` finds (when this user writes the cache and it
        holds nothing a cache does not: :meth:`_only_ours`)."""
        if self.writable and self._only_ours():
            self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        for path in self.leftovers():
            _remove(path)

    def housekeep(self, keep: str | None = None) -> list[str]:
        """Remove leftovers, then evict least recently used entries (never ``keep``) while
        the cache is over :func:`max_bytes`; the evicted keys. Nothing in a root that holds
        what no cache holds (:meth:`_only_ours`)."""
        if not self.writable or not self._only_ours():
            return []
        self._remove_leftovers()
        cap = max_bytes()
        if cap <= 0:
            return []
        entries = self.entries()
        sizes = {e.key: e.size() for e in entries}
        total = sum(sizes.values())
        evicted = []
        for e in entries:
            if total <= cap:
                break
            if e.key == keep:
                continue
            _move_aside(e.path)
            total -= sizes[e.key]
            evicted.append(e.key)
        return evicted

    def clear(self) -> int:
        """Remove every entry and leftover; how many entries were removed."""
        if not self.writable:
            raise PermissionError(f"the compile cache {self.root} is read only for this user")
        entries = self.entries()
        for e in entries:
            _move_aside(e.path)
        for path in self.leftovers():
            _remove(path)
        return len(entries)


_RACY_SECONDS = 2.0  # a file changed this recently may change again within its time stamp

# path -> (device, inode, size, modification and change times; sha256) of each file this
# process found to have the digest its manifest records: the same file, unchanged (any
# write changes its change time, which only root can set), is not read and hashed again
_hashed: dict[str, tuple[tuple[int, int, int, int, int], str]] = {}
_HASHED_FILES = 4096


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _hashed_as(path: Path, st: os.stat_result) -> str | None:
    """The sha256 this process found for the file at ``path`` while it had the identity,
    size and times of ``st`` (its ``lstat``); None when it has not hashed it so."""
    found = _hashed.get(os.fspath(path))
    return found[1] if found is not None and found[0] == _identity(st) else None


def _hash_file(path: Path, st: os.stat_result) -> str:
    """The sha256 of the file at ``path`` (``st``: its ``lstat``), recorded for
    :func:`_hashed_as` unless it changed too recently for its times to show the next
    change."""
    fd = os.open(path, READ_FLAGS)
    with os.fdopen(fd, "rb") as f:
        digest = _sha256(f, st.st_size)
    if time.time() - max(st.st_mtime, st.st_ctime) >= _RACY_SECONDS:
        if len(_hashed) >= _HASHED_FILES:
            _hashed.clear()
        _hashed[os.fspath(path)] = (_identity(st), digest)
    return digest


class CacheEntry:
    """The entry of one key (module docstring)."""

    def __init__(self, cache: Cache, key: str) -> None:
        self.cache = cache
        self.key = key
        self.path = cache.root / key
        self._hashing: threading.Thread | None = None

    def start_hashing(self) -> bool:
        """Hash the entry's files on a thread of its own, for :meth:`verify` to find done
        (hashing releases the GIL: a load goes on beside it); whether it started (not
        without an entry). What is hashed is recorded as any hash is, by the file's
        identity and times (:func:`_hash_file`); every check is still :meth:`verify`'s."""
        if self._hashing is not None:
            return True
        try:
            names = [n for n in os.listdir(self.path) if n != MANIFEST]
        except OSError:
            return False
        self._hashing = threading.Thread(
            target=self._hash_files, args=(names,), name="ptexec-cache-hash", daemon=True
        )
        self._hashing.start()
        return True

    def _hash_files(self, names: list[str]) -> None:
        for name in names:
            path = self.path / name
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and _hashed_as(path, st) is None:
                    _hash_file(path, st)

    # -- reading -----------------------------------------------------------------------
    def read(self) -> Manifest | None:
        """The manifest of a complete, trusted, intact entry; None when there is none. A
        damaged or untrusted entry is :meth:`reject`-ed (one warning) and None."""
        try:
            os.lstat(self.path)
        except FileNotFoundError:
            return None
        except OSError:
            pass  # verify says what
        try:
            return self.verify()
        except CacheEntryError as e:
            self.reject(str(e))
            return None

    def verify(self) -> Manifest:
        """The entry's manifest, after checking the entry, its manifest and every file (owner,
        mode, kind, the exact set of files, sizes and sha256); :class:`CacheEntryError`
        says what is wrong."""
        if self._hashing is not None:  # (its hashes, recorded, spare this a second read)
            self._hashing.join()
            self._hashing = None
        try:
            _check(self.path, os.lstat(self.path), directory=True)
            names = set(os.listdir(self.path))
            manifest_path = self.path / MANIFEST
            st = os.lstat(manifest_path)
            _check(manifest_path, st, directory=False)
            if st.st_size > _MANIFEST_LIMIT:
                raise CacheEntryError(f"{manifest_path} is {st.st_size} bytes")
            text = self._read_bytes(MANIFEST, st.st_size)
            try:
                data = json.loads(text)
            except (ValueError, RecursionError) as e:
                raise CacheEntryError(f"{manifest_path} is not JSON ({e})") from None
            manifest = parse(data, LAYOUT_VERSION)
            listed = {n for n, _ in manifest.files}
            if names != listed | {MANIFEST}:
                extra = sorted(names - listed - {MANIFEST})
                missing = sorted(listed - names)
                raise CacheEntryError(
                    f"{self.path} holds files its manifest does not list ({extra}) "
                    f"or lacks some it lists ({missing})"
                )
            for name, record in manifest.files:
                self._verify_file(name, record)
        except OSError as e:
            raise CacheEntryError(f"{self.path} cannot be read ({e.strerror or e})") from None
        return manifest

    def _read_bytes(self, name: str, size: int) -> bytes:
        fd = os.open(self.path / name, READ_FLAGS)
        try:
            with os.fdopen(fd, "rb") as f:
                fd = -1
                return f.read(size + 1)
        finally:
            if fd >= 0:
                os.close(fd)

    def _verify_file(self, name: str, record: FileRecord) -> None:
        path = self.path / name
        st = os.lstat(path)
        _check(path, st, directory=False)
        if st.st_size != record.size:
            raise CacheEntryError(
                f"{path} is {st.st_size} bytes, its manifest says {record.size} (truncated?)"
            )
        digest = _hashed_as(path, st)  # hashed in this process, unchanged since
        if digest is None:
            digest = _hash_file(path, st)
        if digest != record.sha256:
            raise CacheEntryError(f"{path} does not have the sha256 its manifest records")

    def reject(self, problem: str) -> None:
        """Not use this entry (one warning), and remove it when the cache is writable (so
        that the compile that follows replaces it)."""
        what = "it is replaced" if self.cache.writable else "compiling again"
        warn_once(f"the compile cache entry {self.path} is not used: {problem}; {what}", 3)
        if self.cache.writable:
            _move_aside(self.path)

    def touch(self) -> None:
        """Mark the entry used now (for least-recently-used eviction)."""
        if self.cache.writable:
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def last_used(self) -> float:
        try:
            return os.lstat(self.path).st_mtime
        except OSError:
            return 0.0

    def size(self) -> int:
        """Bytes its files take (0 when it cannot be read); of a link or other file in
        place of the directory, its own size, never what a link leads to."""
        total = 0
        try:
            st = os.lstat(self.path)
            if not stat.S_ISDIR(st.st_mode):
                return st.st_size
            with os.scandir(self.path) as it:
                for item in it:
                    with contextlib.suppress(OSError):
                        total += item.stat(follow_symlinks=False).st_size
        except OSError:
            return 0
        return total

    # -- writing -----------------------------------------------------------------------
    def staging(self) -> Path:
        """A fresh private directory to assemble the entry in, next to its final place."""
        return Path(
            tempfile.mkdtemp(
                prefix=f"{_STAGING}{os.getpid()}-{host()}-{self.key[:16]}-", dir=self.cache.root
            )
        )

    def commit(self, staging: Path, manifest: Manifest) -> bool:
        """Record every file of ``staging`` (size, sha256) in the manifest, write it, sync
        the files and the directory and move it to its place in one rename; False when
        another process got there first (its entry is kept, ours dropped). ``staging`` is
        gone afterwards, whatever happens (an ``OSError``, e.g. a full disk, is raised)."""
        try:
            root_mode = stat.S_IMODE(os.stat(self.cache.root).st_mode)
            share = root_mode & 0o055  # readers the root admits read the entry too
            files = []
            for name in sorted(os.listdir(staging)):
                path = staging / name
                if not valid_name(name) or name == MANIFEST or not path.is_file():
                    raise CacheEntryError(f"compiled output {path} cannot be kept")
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
                    digest = _sha256(f, os.fstat(f.fileno()).st_size)
                files.append((name, FileRecord(os.path.getsize(path), digest)))
                os.chmod(path, 0o600 | (share & 0o044))
            manifest = dataclasses.replace(manifest, files=tuple(files))
            data = json.dumps(manifest.to_json(LAYOUT_VERSION), indent=1, sort_keys=True)
            with open(staging / MANIFEST, "w", encoding="utf-8") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(staging / MANIFEST, 0o600 | (share & 0o044))
            os.chmod(staging, 0o700 | share)
            _fsync_dir(staging)
        except BaseException:
            self.discard(staging)
            raise
        try:
            os.rename(staging, self.path)
        except OSError:
            self.discard(staging)
            if self.path.exists():
                return False
            raise
        # the rename is done; a crash may lose the entry, never corrupt it
        with contextlib.suppress(OSError):
            _fsync_dir(self.cache.root)
        return True

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)
