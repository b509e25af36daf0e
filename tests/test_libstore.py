"""Native libraries kept between processes (:mod:`ptexec.libstore`): kept once, checked
on every read, never handed out when changed, linked or in an untrusted directory."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ptexec import libstore

KEY = hashlib.sha256(b"a library").hexdigest()
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX owners and modes")


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _builder(calls: list[Path], data: bytes = b"\x7fELF library") -> Callable[[Path], None]:
    def build(directory: Path) -> None:
        calls.append(directory)
        (directory / "lib.so").write_bytes(data)

    return build


def test_a_library_is_built_once_and_found_after(root: Path) -> None:
    calls: list[Path] = []
    path = libstore.kept("lib.so", KEY, _builder(calls))
    assert path is not None and path.read_bytes() == b"\x7fELF library"
    assert path.parent == root / libstore.SUBDIR and len(calls) == 1
    assert libstore.kept("lib.so", KEY, None) == path
    assert libstore.kept("lib.so", KEY, _builder(calls)) == path
    assert len(calls) == 1
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".staging-")]


def test_a_changed_library_is_never_handed_out(root: Path) -> None:
    calls: list[Path] = []
    path = libstore.kept("lib.so", KEY, _builder(calls))
    assert path is not None
    with open(path, "ab") as f:
        f.write(b"\0")
    assert libstore.kept("lib.so", KEY, None) is None
    assert not path.exists()  # removed: this user writes the root
    again = libstore.kept("lib.so", KEY, _builder(calls))
    assert again == path and len(calls) == 2 and path.read_bytes() == b"\x7fELF library"


def test_a_linked_library_or_digest_is_a_miss(root: Path, tmp_path: Path) -> None:
    calls: list[Path] = []
    path = libstore.kept("lib.so", KEY, _builder(calls))
    assert path is not None
    elsewhere = tmp_path / "elsewhere.so"
    elsewhere.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(elsewhere)
    assert libstore.kept("lib.so", KEY, None) is None


def test_an_untrusted_directory_is_not_used(root: Path) -> None:
    calls: list[Path] = []
    path = libstore.kept("lib.so", KEY, _builder(calls))
    assert path is not None
    os.chmod(path.parent, 0o777)
    assert libstore.kept("lib.so", KEY, None) is None
    private = libstore.kept("lib.so", KEY, _builder(calls))
    assert private is not None and root not in private.parents and len(calls) == 2


def test_names_and_keys_are_checked(root: Path) -> None:
    for name, key in (("../lib.so", KEY), ("lib.so", "abc"), ("lib.so", KEY.upper())):
        with pytest.raises(ValueError):
            libstore.kept(name, key, None)


def test_listed_checked_and_cleared(root: Path) -> None:
    calls: list[Path] = []
    path = libstore.kept("lib.so", KEY, _builder(calls))
    other = libstore.kept("lib.so", hashlib.sha256(b"another").hexdigest(), _builder(calls))
    assert path is not None and other is not None
    unfinished = path.parent / f".staging-999999999-{libstore.host()}-dead1234"
    unfinished.mkdir()
    with open(other, "ab") as f:
        f.write(b"\0")
    listed = dict(libstore.libraries())
    assert listed[path] is None and listed[other] == "digest differs"
    assert listed[unfinished] == "left by a build that did not finish"
    assert libstore.clear() == 2
    assert libstore.libraries() == [] and list(path.parent.iterdir()) == []


def test_builds_that_died_are_tidied_and_halves_are_left_alone(root: Path) -> None:
    calls: list[Path] = []
    path = libstore.kept("lib.so", KEY, _builder(calls))
    assert path is not None
    directory = path.parent
    host = libstore.host()
    dead = directory / f".staging-999999999-{host}-abc12345"  # no such process
    mine = directory / f".staging-{os.getpid()}-{host}-abc12345"  # this one: alive
    for d in (dead, mine):
        d.mkdir()
    # a library whose digest is not there yet (another process renaming it in): a miss,
    # left in place
    other = hashlib.sha256(b"other").hexdigest()
    half = directory / f"{other}-lib.so"
    half.write_bytes(b"half")
    assert libstore.kept("lib.so", other, None) is None and half.exists()
    assert libstore.kept("lib.so", other, _builder(calls)) == half  # built: tidied first
    assert not dead.exists() and mine.exists()


def test_a_directory_where_a_library_belongs_is_a_miss_without_leaking(root: Path) -> None:
    calls: list[Path] = []
    path = libstore.kept("lib.so", KEY, _builder(calls))
    assert path is not None
    path.unlink()
    path.mkdir()
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    for _ in range(5):
        assert libstore.kept("lib.so", KEY, None) is None
    if before:
        assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("how", ["group-writable", "link"])
def test_the_cache_command_reports_a_directory_no_library_is_loaded_from(
    root: Path, tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``native`` directory writable by its group, or a link, hands out no library: verify
    says so (not "0 damaged"), and clear empties it, never where a link leads."""
    from ptexec.cli import main

    path = libstore.kept("lib.so", KEY, _builder([]))
    assert path is not None
    directory = path.parent
    if how == "link":
        elsewhere = tmp_path / "elsewhere"
        os.replace(directory, elsewhere)
        directory.symlink_to(elsewhere)
        what = "is a symbolic link"
    else:
        directory.chmod(0o770)
        what = "writable by its group"
    assert libstore.kept("lib.so", KEY, None) is None  # (what loads make of it)
    capsys.readouterr()
    assert main(["cache", "verify"]) == 1
    out = capsys.readouterr().out
    assert what in out and "1 damaged" in out
    assert main(["cache", "clear"]) == 0
    if how == "link":
        assert not os.path.lexists(directory) and len(list(elsewhere.iterdir())) == 2
    else:
        assert list(directory.iterdir()) == []


def test_clear_counts_the_libraries_it_removed(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The count is of the libraries ``cache list`` lists, kept or damaged, that clear
    removed: a digest without its library is removed and not counted; a file and a link
    of names the store does not write are kept (each was counted as a library, then
    removed); a link is removed itself, never what it leads to."""
    from ptexec.cli import main

    path = libstore.kept("lib.so", KEY, _builder([]))
    assert path is not None
    directory = path.parent
    precious = tmp_path / "precious"
    precious.write_bytes(b"not the cache's")
    (directory / "notes.txt").write_text("a stray file")
    (directory / f"{hashlib.sha256(b'gone').hexdigest()}.sha256").write_text("0" * 64)
    (directory / "link").symlink_to(precious)
    linked = directory / f"{hashlib.sha256(b'linked').hexdigest()}-lib.so"
    linked.symlink_to(precious)
    listed = dict(libstore.libraries())
    assert listed.keys() == {path, linked} and listed[path] is None
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    assert "native libraries: 1 kept, 1 damaged, 0 unfinished builds" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "2 native librar(ies)" in out and "native/link, native/notes.txt" in out
    assert sorted(p.name for p in directory.iterdir()) == ["link", "notes.txt"]
    assert precious.read_bytes() == b"not the cache's"
    path = libstore.kept("lib.so", KEY, _builder([]))
    assert path is not None
    assert libstore.clear() == 1
    assert sorted(p.name for p in directory.iterdir()) == ["link", "notes.txt"]


def test_only_the_builds_staging_names_are_tidied(root: Path) -> None:
    """A build that died is tidied by the names builds give their staging directories:
    ``.staging-`` then the pid, the host and ``mkdtemp``'s eight characters (earlier
    versions: the host name itself, or the eight characters alone); a directory that only
    begins like one (``.staging-drafts``) is not the store's, however old."""
    path = libstore.kept("lib.so", KEY, _builder([]))
    assert path is not None
    directory = path.parent
    dead = directory / f".staging-999999999-{libstore.host()}-k3_9abcd"
    named = directory / ".staging-999999999-build_host01-abcd1234"
    bare = directory / ".staging-a1b2c3d4"
    drafts = directory / ".staging-drafts"
    for d in (dead, named, bare, drafts):
        d.mkdir()
    (drafts / "a.txt").write_text("kept")
    for d in (named, bare, drafts):
        os.utime(d, (1000, 1000))
    listed = dict(libstore.libraries())
    assert drafts not in listed and listed[bare] == "left by a build that did not finish"
    libstore.kept("lib.so", hashlib.sha256(b"other").hexdigest(), _builder([]))
    assert not dead.exists() and not named.exists() and not bare.exists()
    assert (drafts / "a.txt").read_text() == "kept"
