"""Where ptexec keeps things on disk between processes, and when it may trust them.

One root holds what a process leaves for the next: compiled methods
(:mod:`ptexec.compile.cache`).
The root is ``PTEXEC_CACHE_DIR`` when set, else ``ptexec`` under the user's cache
directory (``XDG_CACHE_HOME`` or ``~/.cache``; ``~/Library/Caches`` on macOS,
``LOCALAPPDATA`` on Windows).

It holds code that a load runs, so whoever can write there must be the user who loads
from it: a directory or file is trusted when it is owned by this user or by root and not
writable by group or others; the root, when every directory above it is too (a sticky
directory such as ``/tmp`` above it is fine). A root owned by root while this user is not
is read only. The way to the root is checked as the kernel resolves it, one name at a
time (:func:`way_to`): every symbolic link followed must be this user's or root's, and every
directory looked into must be trusted as the ones above the root are, so no one else can
redirect the way between a check and a later open or library load. (On Windows, where
files have no POSIX owner, the per-user directory's own permissions are relied on.)
Imports no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import stat
import sys
from pathlib import Path

from .errors import CacheEntryError

__all__ = [
    "READ_FLAGS",
    "MissingFile",
    "alive",
    "cache_dir",
    "check_trusted",
    "checked_root",
    "files_under",
    "host",
    "read_trusted",
    "root_status",
    "subdir_problem",
    "trusted_subdir",
    "untrusted_because",
    "way_to",
]


# opening a cached file: never through a link, never waiting (a FIFO put where a file was
# checked holds nothing up: the checks of the opened file refuse it)
READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
)


def cache_dir() -> Path:
    """The root of ptexec's cache (module docstring), absolute: a relative setting is taken
    from the working directory of now, so that what was checked there is not taken for
    the directory the same name leads to after a change of directory."""
    env = os.environ.get("PTEXEC_CACHE_DIR")
    if env:
        return _absolute(Path(env).expanduser())
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return _absolute(base / "ptexec")


def _absolute(path: Path) -> Path:
    try:
        return path.absolute()
    except OSError:  # the working directory was removed: a relative name leads nowhere
        return path


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)
    return int(getuid()) if getuid is not None else None  # None: no POSIX owners (Windows)


def untrusted_because(owner: int, mode: int) -> str | None:
    """Why a file of ``owner`` and ``mode`` may not be trusted, or None."""
    me = _uid()
    if me is None:
        return None
    if owner not in (me, 0):
        return f"is owned by uid {owner}, not by this user (uid {me}) or root"
    if mode & 0o022:
        by = {0o022: "group and others", 0o020: "its group", 0o002: "others"}[mode & 0o022]
        return f"is writable by {by} (mode {stat.S_IMODE(mode):04o})"
    return None


def check_trusted(path: Path, st: os.stat_result, directory: bool) -> None:
    """Raise :class:`CacheEntryError` unless ``path`` (lstat ``st``) is a trusted real
    directory or regular file."""
    if stat.S_ISLNK(st.st_mode):
        raise CacheEntryError(f"{path} is a symbolic link")
    if directory and not stat.S_ISDIR(st.st_mode):
        raise CacheEntryError(f"{path} is not a directory")
    if not directory and not stat.S_ISREG(st.st_mode):
        raise CacheEntryError(f"{path} is not a regular file")
    why = untrusted_because(st.st_uid, st.st_mode)
    if why is not None:
        raise CacheEntryError(f"{path} {why}")


def _sticky_trust(st: os.stat_result) -> str | None:
    """Why a directory above the cache may not be trusted: others may create in a sticky
    directory (/tmp), not rename what is ours."""
    sticky = st.st_mode & stat.S_ISVTX
    return untrusted_because(st.st_uid, st.st_mode & ~0o022 if sticky else st.st_mode)


_MAX_LINKS = 40  # links followed resolving one path (the kernel's own limit)


def way_to(root: Path) -> tuple[str | None, list[Path]]:
    """Resolve ``root`` one name at a time, as the kernel does, and check everything the
    resolution meets: ``(why it may not be trusted, or None; every directory looked into
    and every link followed, in order, the resolved root last)``.

    A symbolic link met must be this user's or root's, and a directory looked into must
    be trusted as the ones above the root are (others may create in a sticky one, not
    rename what is ours): whoever could change either could point the rest of the way
    at a directory of their choosing. The resolved root itself is checked by the
    caller."""
    met: list[Path] = []
    me = _uid()
    pending = list(reversed(Path(os.path.join(os.getcwd(), root)).parts))
    current = Path(pending.pop())  # the anchor ("/")
    known: os.stat_result | None = None  # current's lstat, when the step to it took one
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent
            known = None
            continue
        met.append(current)
        try:
            dst = os.lstat(current) if known is None else known
        except OSError as e:
            return f"{current} cannot be read ({e.strerror or e})", met
        why = _sticky_trust(dst) if me is not None else None
        if why is not None:
            return f"{current}, above the cache or a link to it, {why}", met
        step = current / name
        known = None
        try:
            st = os.lstat(step)
        except OSError as e:
            return f"{step} cannot be read ({e.strerror or e})", met
        if not stat.S_ISLNK(st.st_mode):
            current = step
            known = st  # (what the next name is looked up in: checked from this lstat)
            continue
        met.append(step)
        if me is not None and st.st_uid not in (me, 0):
            return (
                f"{step}, on the way to the cache, is a symbolic link owned by uid "
                f"{st.st_uid}, not by this user (uid {me}) or root",
                met,
            )
        links += 1
        if links > _MAX_LINKS:
            return f"{root}: too many symbolic links on the way", met
        try:
            target = Path(os.readlink(step))
        except OSError as e:  # (it changed since the lstat: not what was checked)
            return f"{step} cannot be read as a link ({e.strerror or e})", met
        if target.is_absolute():
            current = Path(target.anchor)
            pending.extend(reversed(target.parts[1:]))
        else:
            pending.extend(reversed(target.parts))
    met.append(current)
    return None, met


def root_status(root: Path, create: bool = False) -> tuple[str | None, bool]:
    """``(why root is not used, or None; whether this user writes into it)`` (module
    docstring); ``create`` makes a missing root, and any missing directory above it,
    mode 0700."""
    problem, writable, _ = checked_root(root, create)
    return problem, writable


def checked_root(root: Path, create: bool = False) -> tuple[str | None, bool, list[Path]]:
    """:func:`root_status`, and the way to the root its check walked (:func:`way_to`;
    empty when the check ended before it)."""
    try:
        try:
            st = os.stat(root)
        except FileNotFoundError:
            if not create:
                return f"{root} does not exist", False, []
            _make_private(root)
            st = os.stat(root)
    except OSError as e:
        return f"{root} cannot be used ({e.strerror or e})", False, []
    if not stat.S_ISDIR(st.st_mode):
        return f"{root} is not a directory", False, []
    why = untrusted_because(st.st_uid, st.st_mode)
    if why is not None:
        return f"{root} {why}", False, []
    why, way = way_to(root)
    if why is not None:
        return why, False, way
    me = _uid()
    writable = (me is None or st.st_uid == me) and os.access(root, os.W_OK | os.X_OK)
    return None, writable, way


def _make_private(directory: Path) -> None:
    """Make ``directory`` and every missing one above it mode 0700 (less the umask). Not
    ``os.makedirs``, which makes those above with the umask alone: under a umask of 002
    (a user's own group) ``~/.cache`` came out writable by its group and the root under
    it was refused for good, and under 000 it came out writable by everyone."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        if directory.parent == directory:
            raise
        _make_private(directory.parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)


class MissingFile(CacheEntryError):
    """A file that is not there."""


def read_trusted(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` after checking the opened file (never a link, trusted, not
    larger than ``limit``, which it may exceed by one byte read); :class:`CacheEntryError`
    says what is wrong (:class:`MissingFile` when it is not there)."""
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        raise MissingFile(f"{path} is not there") from None
    except OSError as e:
        raise CacheEntryError(f"{path} cannot be opened ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)  # (before fdopen, which refuses a directory: the fd is closed)
        check_trusted(path, st, directory=False)
        if st.st_size > limit:
            raise CacheEntryError(f"{path} is {st.st_size} bytes")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read(st.st_size + 1)
    except OSError as e:  # a read that fails (EIO): the entry is as good as damaged
        raise CacheEntryError(f"{path} cannot be read ({e.strerror or e})") from None
    finally:
        if fd >= 0:
            os.close(fd)


def trusted_subdir(root: Path, name: str, writable: bool, create: bool) -> Path | None:
    """The directory ``name`` under the trusted root ``root`` (``writable``: this user
    writes it), when it is trusted; made (readable by those the root admits, as the
    root's entries are) when ``create`` and ``writable``; None otherwise."""
    directory = root / name
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        if not (create and writable):
            return None
        try:
            os.mkdir(directory, 0o700)
            os.chmod(directory, 0o700 | (stat.S_IMODE(os.stat(root).st_mode) & 0o055))
            st = os.lstat(directory)
        except OSError:
            return None
    except OSError:
        return None
    try:
        check_trusted(directory, st, directory=True)
    except CacheEntryError:
        return None
    return directory


def subdir_problem(root: Path, name: str) -> str | None:
    """Why the directory ``name`` under ``root`` is not trusted (:func:`check_trusted`:
    a link, not a directory, another owner's, writable by others), so that nothing in it
    is read; None when it is trusted or not there."""
    directory = root / name
    try:
        check_trusted(directory, os.lstat(directory), directory=True)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{directory} cannot be read ({e.strerror or e})"
    except CacheEntryError as e:
        return str(e)
    return None


def files_under(root: Path) -> list[Path]:
    """Everything under ``root`` that is not a directory (files, links, FIFOs), links not
    followed: what a clear of the whole root left."""
    out: list[Path] = []
    for top, dirs, names in os.walk(root):  # (a link to a directory is among dirs, not entered)
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        out.extend(Path(top, name) for name in sorted(names + links))
    return out


def host() -> str:
    """This machine, as staging directories' names say it (a digest of its host name)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
