"""Generated code kept on disk between processes (``ptexec.codestore``): a later load reads
what an earlier one compiled, computes the same, and never runs a file the compiled
methods' trust rules would refuse (another owner, writable by others, a link, damaged)."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ptexec
from fixture_data import fixture_calls, fixture_paths
from ptexec import cachedir, codegen, codestore

PTE = fixture_paths("transformer")[0]  # its fast call is a few thousand characters


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cache root, an empty in-process cache before and after."""
    r = tmp_path / "cache"
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(r))
    monkeypatch.delenv("PTEXEC_CODE_CACHE", raising=False)
    codegen.clear_compiled()
    codestore.clear_trusted()
    yield r
    codegen.clear_compiled()
    codestore.clear_trusted()


class Compiles:
    """Counts the texts of at least :data:`codestore.MIN_CHARS` ptexec compiles."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.long = 0
        real = builtins.compile

        def counting(source: str, *args: object, **kwargs: object) -> object:
            if isinstance(source, str) and len(source) >= codestore.MIN_CHARS:
                self.long += 1
            return real(source, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(codegen, "compile", counting, raising=False)


def _run(m: ptexec.Method) -> None:
    """The method gives the fixture's recorded outputs (eager PyTorch's)."""
    for call in fixture_calls("transformer"):
        got = m.execute(call["inputs"])
        for g, want in zip(got, call["outputs"], strict=True):
            torch.testing.assert_close(g, want)


def _load_fresh() -> ptexec.Method:
    """A load that finds nothing in the process (as a new process's first load)."""
    codegen.clear_compiled()
    codestore.clear_trusted()
    from ptexec.engine import fastcall
    from ptexec.format import pte
    from ptexec.loader import instructions

    pte.clear_decoded()
    fastcall.clear_generated()
    instructions.clear_kept_statements()
    return ptexec.load(PTE).load_method("forward")


def test_a_later_load_reads_the_code_an_earlier_one_compiled(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = Compiles(monkeypatch)
    _run(_load_fresh())
    written = codestore.files(root)
    assert counted.long >= 1 and len(written) == counted.long
    assert all(f.problem is None and f.current for f in written)
    for f in written:  # private to this user, like the root
        assert f.path.stat().st_mode & 0o077 == 0
    counted.long = 0
    _run(_load_fresh())
    assert counted.long == 0  # every long text read from disk, none compiled
    assert [f.path for f in codestore.files(root)] == [f.path for f in written]


def test_off_or_short_texts_keep_nothing(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTEXEC_CODE_CACHE", "0")
    _run(_load_fresh())
    assert not codestore.code_dir(root).exists()
    monkeypatch.delenv("PTEXEC_CODE_CACHE")
    short = "x = 1\n"
    codestore.store(short, compile(short, "<t>", "exec"))
    assert codestore.load(short) is None and codestore.files(root) == []


def _planted(root: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The store filled by one load; the in-process caches emptied after it."""
    Compiles(monkeypatch)
    _run(_load_fresh())
    paths = [f.path for f in codestore.files(root)]
    assert paths
    return paths


def _refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next load compiles every long text again, and computes as it should."""
    counted = Compiles(monkeypatch)
    _run(_load_fresh())
    assert counted.long >= 1


def test_damaged_files_are_misses_and_are_written_again(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _planted(root, monkeypatch)
    for p in paths:
        data = bytearray(p.read_bytes())
        data[-3] ^= 0xFF  # one byte of the code object
        p.write_bytes(bytes(data))
    assert all("sha256" in (f.problem or "") for f in codestore.files(root))
    _refused(monkeypatch)
    assert all(f.problem is None for f in codestore.files(root))  # replaced
    for p in paths:
        p.write_bytes(p.read_bytes()[:20])  # torn
    _refused(monkeypatch)
    for p in paths:  # the right digest over a payload that is not a code object
        import hashlib
        import marshal

        payload = marshal.dumps(("not", "code"))
        head = p.read_bytes()[: codestore._HEADER - 32]
        p.write_bytes(head + hashlib.sha256(payload).digest() + payload)
    assert all("not a code object" in (f.problem or "") for f in codestore.files(root))
    _refused(monkeypatch)


def test_a_file_that_fails_to_read_is_a_miss(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error reading a kept file (a failing disk: EIO) is a miss, as a damaged file is:
    the load compiles the text and computes as it should."""
    _planted(root, monkeypatch)
    real = os.fdopen

    class Failing:
        def __init__(self, f: object) -> None:
            self.f = f

        def __enter__(self) -> Failing:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()  # type: ignore[attr-defined]

        def __getattr__(self, name: str) -> object:  # (writes go through)
            return getattr(self.f, name)

        def read(self, n: int) -> bytes:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(cachedir.os, "fdopen", lambda fd, *a, **k: Failing(real(fd, *a, **k)))
    _refused(monkeypatch)


def test_files_writable_by_others_or_links_are_not_run(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _planted(root, monkeypatch)
    for p in paths:
        p.chmod(0o666)
    assert all("writable by" in (f.problem or "") for f in codestore.files(root))
    _refused(monkeypatch)
    # a link to a file elsewhere, whoever wrote it
    paths = [f.path for f in codestore.files(root)]
    for p in paths:
        elsewhere = tmp_path / f"elsewhere-{p.name}"
        os.replace(p, elsewhere)
        p.symlink_to(elsewhere)
    _refused(monkeypatch)
    for p in paths:
        assert not p.is_symlink()  # replaced by a file of this user's
    # the code directory writable by others: nothing in it is read
    codestore.code_dir(root).chmod(0o777)
    _refused(monkeypatch)
    codestore.code_dir(root).chmod(0o700)


def test_files_or_roots_of_another_owner_are_not_run(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _planted(root, monkeypatch)
    if os.getuid() == 0:  # really another owner
        for f in codestore.files(root):
            os.chown(f.path, 65534, 65534)
        assert all("owned by uid 65534" in (f.problem or "") for f in codestore.files(root))
    else:  # this user seen as another one
        monkeypatch.setattr(cachedir, "_uid", lambda: os.getuid() + 1)
    _refused(monkeypatch)


@pytest.mark.parametrize("where", ["root", "above"])
def test_a_root_made_writable_by_others_later_in_the_process_is_not_used(
    root: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    _planted(root, monkeypatch)
    codegen.clear_compiled()  # (the trusted root stays known to the process)
    target = root if where == "root" else root.parent
    mode = target.stat().st_mode & 0o7777
    target.chmod(0o777)  # (above: not sticky, others may rename the root)
    try:
        counted = Compiles(monkeypatch)
        _run(ptexec.load(PTE).load_method("forward"))
        assert counted.long >= 1
    finally:
        target.chmod(mode)


def test_another_python_never_reads_a_file(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _planted(root, monkeypatch)
    for p in paths:
        data = bytearray(p.read_bytes())
        data[len(codestore._MAGIC) + 1] ^= 0xFF  # the interpreter's bytecode version
        p.write_bytes(bytes(data))
    files = codestore.files(root)
    assert all(f.problem is None and not f.current for f in files)  # kept for that one
    _refused(monkeypatch)


def test_a_new_process_reads_what_another_kept(root: Path) -> None:
    script = (
        "import builtins, ptexec, torch\n"
        "from ptexec import codegen, codestore\n"
        "real = builtins.compile; n = [0]\n"
        "def counting(s, *a, **k):\n"
        "    n[0] += isinstance(s, str) and len(s) >= codestore.MIN_CHARS\n"
        "    return real(s, *a, **k)\n"
        "codegen.compile = counting\n"
        f"m = ptexec.load({str(PTE)!r}).load_method('forward')\n"
        "print(n[0])\n"
    )
    env = {**os.environ, "PTEXEC_CACHE_DIR": str(root), "PTEXEC_CODE_CACHE": "1"}
    runs = [
        subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout.split()[-1]
        for _ in range(2)
    ]
    assert int(runs[0]) >= 1 and runs[1] == "0"


def test_the_cache_command_lists_verifies_and_clears_it(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptexec.cli import main

    paths = _planted(root, monkeypatch)
    assert main(["cache", "verify"]) == 0
    out = capsys.readouterr().out
    assert f"generated code: {len(paths)} file" in out and "0 damaged" in out
    paths[0].write_bytes(b"garbage")
    assert main(["cache", "verify"]) == 1
    assert "1 damaged" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert f"{len(paths)} file(s) of generated code" in capsys.readouterr().out
    assert codestore.files(root) == []


def test_clearing_a_folder_that_is_no_cache_removes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cache clear --dir`` naming a project's folder: clearing removes the stores' whole
    directories by name, so a folder holding anything a cache does not hold is refused,
    and its own ``code`` and ``inductor`` folders keep their files."""
    from ptexec.cli import main

    project = tmp_path / "project"
    (project / "code").mkdir(parents=True, mode=0o700)
    (project / "inductor").mkdir(mode=0o700)
    project.chmod(0o700)
    mine = [project / "code" / "train.py", project / "inductor" / "notes.txt", project / "a.txt"]
    for f in mine:
        f.write_text("kept")
    assert main(["cache", "clear", "--dir", str(project)]) == 1
    out = capsys.readouterr().out
    assert "not cleared" in out and "a.txt" in out
    assert all(f.read_text() == "kept" for f in mine)
    # a cache's own root is cleared as before, but for the names no store writes
    (project / "a.txt").unlink()
    assert main(["cache", "clear", "--dir", str(project)]) == 0
    assert "code/train.py" in capsys.readouterr().out
    assert not (project / "inductor").exists() and list((project / "code").iterdir()) == [
        project / "code" / "train.py"
    ]


def test_no_home_directory_is_no_store(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user without a home directory (a container's arbitrary uid, no HOME) loads as
    without the store."""

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(codestore, "cache_dir", no_home)
    counted = Compiles(monkeypatch)
    _run(_load_fresh())
    _run(_load_fresh())
    assert counted.long >= 2 and not root.exists()


def test_the_code_read_is_the_code_compiling_gives(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import marshal

    texts: list[str] = []
    real = codestore.store

    def keeping(source: str, code: object) -> None:
        texts.append(source)
        real(source, code)  # type: ignore[arg-type]

    monkeypatch.setattr(codestore, "store", keeping)
    _run(_load_fresh())
    long = [t for t in texts if len(t) >= codestore.MIN_CHARS]
    assert long
    for text in long:
        read = codestore.load(text)
        assert read is not None
        assert marshal.dumps(read) == marshal.dumps(
            compile(text, codegen._PLACEHOLDER, "exec", dont_inherit=False)
        )


def test_a_fifo_in_place_of_a_file_never_holds_the_load(root: Path) -> None:
    import threading

    source = "x = 1\n" * 400
    codestore.store(source, compile(source, "<t>", "exec"))
    path = codestore.code_dir(root) / codestore.key(source)
    path.unlink()
    os.mkfifo(path, 0o600)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(codestore.load(source)), daemon=True)
    reader.start()
    reader.join(30)
    assert got == [None]  # (a blocking open would still be waiting for a writer)
    assert any(f.problem and "regular file" in f.problem for f in codestore.files(root))


def test_the_key_follows_the_optimisation_level() -> None:
    """``python -O`` compiles without asserts: its code is another entry."""
    script = "from ptexec.codestore import key; print(key('assert False\\n' * 100))"
    keys = {
        subprocess.run(
            [sys.executable, *flags, "-c", script], capture_output=True, text=True, check=True
        ).stdout.strip()
        for flags in ([], ["-O"])
    }
    assert len(keys) == 2


def test_a_shared_root_shares_its_code_directory_and_stale_temporaries_go(root: Path) -> None:
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    source = "y = 2\n" * 400
    codestore.store(source, compile(source, "<t>", "exec"))
    directory = codestore.code_dir(root)
    assert directory.stat().st_mode & 0o777 == 0o755
    assert (directory / codestore.key(source)).stat().st_mode & 0o777 == 0o644
    stale, fresh = directory / ".tmp-dead0000", directory / ".tmp-writing0"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (1, 1))
    other = "z = 3\n" * 400
    codestore.store(other, compile(other, "<t>", "exec"))
    assert not stale.exists() and fresh.exists()


def test_a_relative_root_is_checked_where_it_leads_after_a_change_of_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative ``PTEXEC_CACHE_DIR`` names another directory once the process changes
    its working directory; the root found trusted before must not vouch for that one."""
    monkeypatch.delenv("PTEXEC_CODE_CACHE", raising=False)
    source = "x = 0\n" + "# a long generated text\n" * (codestore.MIN_CHARS // 20)
    trusted, shared = tmp_path / "trusted", tmp_path / "shared"
    for where, value in ((trusted, 1), (shared, 2)):
        (where / "c").mkdir(parents=True, mode=0o700)
        monkeypatch.setenv("PTEXEC_CACHE_DIR", str(where / "c"))
        codestore.store(source, compile(f"x = {value}", "<kept>", "exec"))
    (shared / "c").chmod(0o777)  # others may replace what it holds
    monkeypatch.setenv("PTEXEC_CACHE_DIR", "c")
    codestore.clear_trusted()
    try:
        monkeypatch.chdir(trusted)
        code = codestore.load(source)
        assert code is not None
        namespace: dict[str, object] = {}
        exec(code, namespace)
        assert namespace["x"] == 1
        monkeypatch.chdir(shared)
        assert codestore.load(source) is None
    finally:
        codestore.clear_trusted()


def test_the_cache_command_never_follows_a_linked_code_directory(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``code`` that is a link (to a directory of someone's files) is not the store: the
    loads read nothing through it, so verify says so and clear removes the link alone."""
    from ptexec.cli import main

    _planted(root, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    os.replace(codestore.code_dir(root), elsewhere)
    codestore.code_dir(root).symlink_to(elsewhere)
    kept = sorted(p.name for p in elsewhere.iterdir())
    _refused(monkeypatch)  # (what loads make of it)
    capsys.readouterr()
    assert main(["cache", "verify"]) == 1
    assert "is a symbolic link" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert sorted(p.name for p in elsewhere.iterdir()) == kept
    assert not os.path.lexists(codestore.code_dir(root))


def test_the_cache_command_reports_a_code_directory_others_may_write(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Loads read nothing from a ``code`` directory writable by its group: verify says so,
    not that its files are fine."""
    from ptexec.cli import main

    _planted(root, monkeypatch)
    codestore.code_dir(root).chmod(0o770)
    _refused(monkeypatch)
    capsys.readouterr()
    assert main(["cache", "verify"]) == 1
    assert "writable by its group" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert list(codestore.code_dir(root).iterdir()) == []


def test_trimming_removes_only_the_files_the_store_wrote(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``code`` folder that holds files of someone else's (a project's folder named as
    the root): the least recently read of the store's own files are removed, never those,
    however old, and they do not count towards :data:`codestore.MAX_ENTRIES`."""
    monkeypatch.setattr(codestore, "MAX_ENTRIES", 4)
    directory = codestore.code_dir(root)
    directory.mkdir(parents=True, mode=0o700)
    mine = [directory / "train.py", directory / ".tmp-notes.txt", directory / "data.bin"]
    for f in mine:
        f.write_text("kept")
        os.utime(f, (1, 1))  # older than anything the store writes
    sources = [f"y = {i}\n" * 400 for i in range(4)]
    for i, source in enumerate(sources):
        codestore.store(source, compile(source, "<t>", "exec"))
        os.utime(directory / codestore.key(source), (10 + i, 10 + i))
    assert all(f.read_text() == "kept" for f in mine)
    kept = sorted(p.name for p in directory.iterdir() if p not in mine)
    assert kept == sorted(codestore.key(s) for s in sources)  # 4: none removed yet
    extra = "z = 1\n" * 400
    codestore.store(extra, compile(extra, "<t>", "exec"))  # 5 > 4: down to 3, oldest first
    assert all(f.read_text() == "kept" for f in mine)
    kept = sorted(p.name for p in directory.iterdir() if p not in mine)
    assert kept == sorted(codestore.key(s) for s in [*sources[2:], extra])
