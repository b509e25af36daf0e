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
is read only. The way to the root is checked as its path is written too: a symbolic link
on it must be this user's or root's, and a directory on it must be trusted as the ones
above the root are. (On Windows, where files have no POSIX owner, the per-user directory's
own permissions are relied on.) Imports no torch.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from .errors import CacheEntryError

__all__ = [
    "READ_FLAGS",
    "cache_dir",
    "check_trusted",
    "root_status",
    "untrusted_because",
    "way_as_written",
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
    """The root of ptexec's cache (module docstring)."""
    env = os.environ.get("PTEXEC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ptexec"


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


def way_as_written(root: Path) -> list[Path]:
    """Every directory or link on the way to ``root`` as its path is written (absolute,
    links not resolved), the root last."""
    path = Path(os.path.abspath(root))
    return [*reversed(path.parents), path]


def _way_as_written(root: Path) -> str | None:
    """Why the way to ``root`` as written may not be trusted: a symbolic link on it that
    another user owns (they could point it at a directory of their choosing), or a
    directory on it that others may write (they could replace what follows)."""
    me = _uid()
    if me is None:
        return None
    way = way_as_written(root)
    for step in way:
        try:
            st = os.lstat(step)
        except OSError as e:
            return f"{step} cannot be read ({e.strerror or e})"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (me, 0):
                return (
                    f"{step}, on the way to the cache, is a symbolic link owned by uid "
                    f"{st.st_uid}, not by this user (uid {me}) or root"
                )
        elif step != way[-1]:
            why = _sticky_trust(st)
            if why is not None:
                return f"{step}, above the cache, {why}"
    return None


def root_status(root: Path, create: bool = False) -> tuple[str | None, bool]:
    """``(why root is not used, or None; whether this user writes into it)`` (module
    docstring); ``create`` makes a missing root (mode 0700)."""
    try:
        try:
            st = os.stat(root)
        except FileNotFoundError:
            if not create:
                return f"{root} does not exist", False
            os.makedirs(root, mode=0o700, exist_ok=True)
            st = os.stat(root)
    except OSError as e:
        return f"{root} cannot be used ({e.strerror or e})", False
    if not stat.S_ISDIR(st.st_mode):
        return f"{root} is not a directory", False
    why = untrusted_because(st.st_uid, st.st_mode)
    if why is not None:
        return f"{root} {why}", False
    why = _way_as_written(root)
    if why is not None:
        return why, False
    for parent in Path(os.path.realpath(root)).parents:
        try:
            pst = os.stat(parent)
        except OSError as e:
            return f"{parent} cannot be read ({e.strerror or e})", False
        why = _sticky_trust(pst)
        if why is not None:
            return f"{parent}, above the cache, {why}", False
    me = _uid()
    writable = (me is None or st.st_uid == me) and os.access(root, os.W_OK | os.X_OK)
    return None, writable
