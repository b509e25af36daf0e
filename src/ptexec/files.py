"""Files written as ``open(path, "wb")`` writes them, and atomically.

A reader of a path sees its old bytes or its new ones, never part of a file: each file is
written in full to a new temporary file beside its target and then renamed over it. What
``open`` would do is kept: an existing file keeps its mode, a new one is made with the
umask applied (not a temporary file's private 0600); a symbolic link is followed (the file
it names is replaced, the link kept); a file this process may not write is refused with
``PermissionError`` and a folder with ``IsADirectoryError``, never replaced.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path

__all__ = ["write_atomically", "write_together"]


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` (see the module docstring)."""
    write_together([(path, data)])


def write_together(files: Sequence[tuple[str | os.PathLike[str], bytes]]) -> None:
    """Write several files that belong together, in the order given: every target is
    checked and every temporary file written before the first rename, so a failure while
    writing (a full disk, a refused target) leaves every target as it was; the renames then
    follow in order, so a file is never in place before the files listed ahead of it."""
    targets = [_target(path) for path, _ in files]
    written: list[str] = []
    try:
        for (target, mode), (_, data) in zip(targets, files, strict=True):
            fd, tmp = _created_beside(target, mode)
            written.append(tmp)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if mode is not None:
                os.chmod(tmp, mode)
        for (target, _), tmp in zip(targets, list(written), strict=True):
            os.replace(tmp, target)
            written.remove(tmp)
    finally:
        for tmp in written:
            Path(tmp).unlink(missing_ok=True)


def _target(path: str | os.PathLike[str]) -> tuple[Path, int | None]:
    """The file ``open(path, "wb")`` would write, and its mode (None for a new file)."""
    target = Path(os.path.realpath(path))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target, None
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
    if not os.access(target, os.W_OK):
        raise PermissionError(errno.EACCES, "cannot write the file", str(path))
    return target, stat.S_IMODE(st.st_mode)


def _created_beside(target: Path, mode: int | None) -> tuple[int, str]:
    """A new file in ``target``'s folder, open for writing, made with mode 0666 less the
    umask as ``open`` makes files (``tempfile.mkstemp`` makes them 0600), or, written over
    an existing file of mode ``mode``, with no more access than that file gives (less the
    umask): the new bytes are never readable by anyone the old file kept out."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    access = 0o666 if mode is None else mode & 0o777
    for _ in range(100):
        tmp = str(target.parent / f".{target.name}.{secrets.token_hex(6)}")
        try:
            return os.open(tmp, flags, access), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")
