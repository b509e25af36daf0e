"""Native libraries ptexec builds for itself, kept on disk between processes.

A library is loaded into the process, so it is kept under the trust rules of the cache
root (:mod:`ptexec.cachedir`, as compiled methods and generated code are): in ``native/``
under a trusted root, a real directory owned by this user (or root) and not writable by
group or others; each library a regular file so owned, never a symbolic link, beside a
file recording its SHA-256, both checked on the opened files before the library's path
is handed out (a library changed since or torn is a miss, removed when this user writes
the root; one whose library or digest is not there yet is a miss left alone: another
process may be writing it). A library is built into a staging directory beside its place
(named by the process and host, removed when that process is gone or after a day) and
renamed into place, its digest after it, so a reader finds a whole library or none. A
library that does not load is dropped by its user (:func:`discard`) to be built again.
Where no trusted root can be used, a library is built in a private temporary directory
for the process, removed once loaded (:func:`release`). Imports no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .cachedir import (
    MissingFile,
    alive,
    cache_dir,
    host,
    read_trusted,
    root_status,
    subdir_problem,
    trusted_subdir,
)
from .errors import CacheEntryError

__all__ = [
    "SUBDIR",
    "clear",
    "discard",
    "kept",
    "libraries",
    "makes",
    "release",
    "unfinished",
]

SUBDIR = "native"
MAX_BYTES = 256 << 20  # a library larger than this is no library of ours
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_KEY = re.compile(r"[0-9a-f]{64}")


def _directory(create: bool, root: Path | None = None) -> tuple[Path, bool] | None:
    """``native/`` under the cache root (``root``, by default :func:`cache_dir`) and
    whether this user writes it, when trusted (made when ``create`` and this user writes
    the root); None otherwise."""
    root = cache_dir() if root is None else root
    problem, writable = root_status(root, create=create)
    if problem is not None:
        return None
    directory = trusted_subdir(root, SUBDIR, writable, create)
    return None if directory is None else (directory, writable)


def _state(library: Path, digest: Path) -> str:
    """``"ok"`` when ``library`` is there, trusted, with the digest ``digest`` records;
    ``"missing"`` when either is not there; ``"bad"`` otherwise."""
    try:
        data = read_trusted(library, MAX_BYTES)
        recorded = read_trusted(digest, 64).decode("ascii", "replace")
    except MissingFile:
        return "missing"
    except CacheEntryError:
        return "bad"
    return "ok" if hashlib.sha256(data).hexdigest() == recorded else "bad"


_PRIVATE: set[Path] = set()  # directories of libraries built for this process alone
_STAGING = ".staging-"
# a build's staging directory: ``.staging-<pid>-<host>-`` and ``mkdtemp``'s 8 characters
# (the host a digest of its name; earlier versions wrote the name itself, up to 32 of
# these characters, and before that the 8 characters alone), and nothing else
_STAGING_NAME = re.compile(r"\.staging-(?:([0-9]+)-([A-Za-z0-9_]{1,32})-)?[a-z0-9_]{8}")
_STALE_SECONDS = 24 * 3600  # a staging directory this old (or of a dead process): removed


def _tidy(directory: Path) -> None:
    """Remove the staging directories of builds that died: of this host and a process
    that is gone, or older than a day."""
    now = time.time()
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            staged = _STAGING_NAME.fullmatch(path.name)
            if staged is None or path.is_symlink() or not path.is_dir():
                continue
            pid, here = staged.groups()
            dead = here == host() and pid is not None and not alive(int(pid))
            if dead or now - path.lstat().st_mtime > _STALE_SECONDS:
                shutil.rmtree(path, ignore_errors=True)


def kept(name: str, key: str, build: Callable[[Path], None] | None) -> Path | None:
    """The path of the library ``name`` (a file name) kept for ``key`` (a SHA-256 of all
    it depends on, in hex), checked as the module docstring says; when it is not kept,
    ``build(directory)``, which writes ``name`` into ``directory``, makes it (its errors
    are raised) and it is kept, or None when ``build`` is None."""
    if _NAME.fullmatch(name) is None or _KEY.fullmatch(key) is None:
        raise ValueError(f"not a library name and key: {name!r}, {key!r}")
    found = _directory(create=build is not None)
    if found is not None:
        directory, writable = found
        library, digest = directory / f"{key}-{name}", directory / f"{key}.sha256"
        state = _state(library, digest)
        if state == "ok":
            return library
        if writable and state == "bad":  # (a missing half may be another's build)
            for stale in (digest, library):
                with contextlib.suppress(OSError):
                    os.unlink(stale)
        if build is None:
            return None
        if writable:
            _tidy(directory)
            prefix = f"{_STAGING}{os.getpid()}-{host()}-"
            staging = Path(tempfile.mkdtemp(prefix=prefix, dir=directory))
            try:
                build(staging)
                made = staging / name
                recorded = staging / "digest"
                with open(made, "rb") as f:
                    os.fsync(f.fileno())
                    text = hashlib.sha256(f.read()).hexdigest()
                with open(recorded, "w", encoding="ascii") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                share = stat.S_IMODE(os.stat(directory).st_mode) & 0o044
                os.chmod(made, 0o700 | share | (share >> 2))
                os.chmod(recorded, 0o600 | share)
                os.rename(made, library)
                os.rename(recorded, digest)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            if _state(library, digest) == "ok":
                return library
    elif build is None:
        return None
    private = Path(tempfile.mkdtemp(prefix="ptexec-native-"))  # 0700, this process's
    _PRIVATE.add(private)
    try:
        build(private)
    except BaseException:
        release(private / name)
        raise
    return private / name


def release(path: Path) -> None:
    """After ``path`` (from :func:`kept`) is loaded (or failed to): a library built for
    this process alone is removed from disk (the process keeps what it loaded)."""
    if path.parent in _PRIVATE:
        _PRIVATE.discard(path.parent)
        shutil.rmtree(path.parent, ignore_errors=True)


def discard(path: Path) -> None:
    """Drop the kept library ``path`` (one that does not load here) and its digest, when
    this user writes the store, so that it is built again."""
    found = _directory(create=False)
    if found is None or not found[1] or path.parent != found[0]:
        return
    key = path.name.partition("-")[0]
    for stale in (found[0] / f"{key}.sha256", path):
        with contextlib.suppress(OSError):
            os.unlink(stale)


def libraries(root: Path | None = None) -> list[tuple[Path, str | None]]:
    """The libraries kept under ``root`` (by default :func:`cache_dir`), each with what is
    wrong with it (None: it would be loaded), and builds that did not finish (their
    staging directories: ``"left by a build that did not finish"``). A ``native`` no
    library is loaded from (a link, writable by others) is listed alone, with why."""
    root = cache_dir() if root is None else root
    problem = subdir_problem(root, SUBDIR)
    if problem is not None:
        return [(root / SUBDIR, f"{problem}: no library in it is loaded")]
    found = _directory(create=False, root=root)
    if found is None:
        return []
    directory, _ = found
    listed: list[tuple[Path, str | None]] = []
    for path in sorted(directory.iterdir()):
        if unfinished(path.name):
            listed.append((path, "left by a build that did not finish"))
            continue
        key = _library_key(path.name)
        if key is None:
            continue  # a digest (read with its library), or nothing of ours
        digest = directory / f"{key}.sha256"
        try:
            data = read_trusted(path, MAX_BYTES)
            recorded = read_trusted(digest, 64).decode("ascii", "replace")
            problem = None if hashlib.sha256(data).hexdigest() == recorded else "digest differs"
        except CacheEntryError as e:
            problem = str(e)
        listed.append((path, problem))
    return listed


def unfinished(name: str) -> bool:
    """Whether ``name`` is one a build gives its staging directory in ``native``."""
    return _STAGING_NAME.fullmatch(name) is not None


def _library_key(name: str) -> str | None:
    """The key of a library's file name (``<key>-<name>``); None for any other name."""
    key, _, rest = name.partition("-")
    return key if rest and _KEY.fullmatch(key) is not None else None


def makes(name: str) -> bool:
    """Whether ``name`` is one the store gives what it writes in ``native``: a library
    (``<key>-<name>``), its digest (``<key>.sha256``) or a build's staging directory."""
    digest = name.endswith(".sha256") and _KEY.fullmatch(name[: -len(".sha256")]) is not None
    return digest or unfinished(name) or _library_key(name) is not None


def clear(root: Path | None = None) -> int:
    """Remove every kept library, digest and unfinished build under ``root`` (the names
    the store writes, :func:`makes`: any other is kept) that this user may remove,
    whatever the directory's mode; how many libraries (what :func:`libraries` lists as
    kept or damaged) were removed. A link is removed itself, never followed, ``native``
    included."""
    root = cache_dir() if root is None else root
    problem, writable = root_status(root)
    if problem is not None or not writable:
        return 0
    directory = root / SUBDIR
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            os.unlink(directory)
            return 0
        paths = list(directory.iterdir())
    except OSError:
        return 0
    removed = 0
    for path in paths:
        if not makes(path.name):
            continue
        if unfinished(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed += _library_key(path.name) is not None
    return removed
