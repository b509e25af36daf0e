"""Torch's own kernel cache while ptexec compiles: code torch reads back from a directory
others may write is never loaded.

AOTInductor keeps the kernels it builds under ``TORCHINDUCTOR_CACHE_DIR`` (by default
``/tmp/torchinductor_<user>``, a name anyone can create first) and loads a library already
at a kernel's path instead of building it: the instruction-set probes every compile runs
are at the same paths for every graph. A library is planted there as an attacker would
plant it (its constructor writes a marker file when anything loads it).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import ptexec
from ptexec.cachedir import untrusted_because
from ptexec.compile import aoti
from test_compile_cache import HOSTILE_C

SRC = str(Path(ptexec.__file__).resolve().parent.parent)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    r = tmp_path / "cache"
    r.mkdir(mode=0o700)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(r))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)  # restored after the test
    return r


def _trusted(path: Path) -> bool:
    st = path.lstat()
    return stat.S_ISDIR(st.st_mode) and untrusted_because(st.st_uid, st.st_mode) is None


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_an_inductor_cache_others_may_write_is_replaced(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    chosen = aoti.inductor_cache()
    assert chosen == root / "inductor" and _trusted(chosen)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(chosen)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(chosen)  # where torch itself now builds and loads kernels


def test_an_inductor_cache_under_a_directory_others_may_write_is_replaced(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    above = tmp_path / "above"
    above.mkdir()
    inner = above / "inductor"
    inner.mkdir(mode=0o700)
    above.chmod(0o777)  # whoever writes here may swap ``inductor`` for their own
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inner))
    assert aoti.inductor_cache() == root / "inductor"


def test_a_trusted_inductor_cache_is_kept(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))
    triton = tmp_path / "triton"
    triton.mkdir(mode=0o700)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton))
    assert aoti.inductor_cache() == mine
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(mine)
    assert os.environ["TRITON_CACHE_DIR"] == str(triton)
    assert not (root / "inductor").exists()
    missing = tmp_path / "new"  # made, as this user's alone
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(missing))
    assert aoti.inductor_cache() == missing and _trusted(missing)


def _others_may_write(path: Path, top: Path) -> str | None:
    """Who besides this user may write ``path`` or replace it (its directory), reaching it
    from ``top`` (a directory they may enter all the way to), or None."""
    for who, enter, write in (("group", 0o010, 0o020), ("others", 0o001, 0o002)):
        way = [top, *reversed([p for p in path.parents if top in p.parents])]
        entered = all(d.stat().st_mode & enter for d in way)
        if entered and (path.stat().st_mode | way[-1].stat().st_mode) & write:
            return who
    return None


@pytest.mark.parametrize("made", ["kernel cache", "cache root"])
def test_what_torch_writes_under_a_umask_of_002_no_one_else_may_write(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: str
) -> None:
    """Torch makes the directories and files of its kernel cache with the process's umask:
    under 002 they are writable by the group, and a kernel library a member puts there is
    loaded by the next compile. The directory a compile gives torch is one no one else
    may enter: a kernel cache others may read is replaced, and ``inductor`` under a cache
    root others may read is made 0700."""
    from torch._inductor import codecache

    if made == "kernel cache":
        readable = tmp_path / "readable"
        readable.mkdir()
        readable.chmod(0o755)
    else:
        root.chmod(0o755)
        readable = tmp_path / "shared"
        readable.mkdir()
        readable.chmod(0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(readable))
    old = os.umask(0o002)
    try:
        chosen = aoti.inductor_cache()
        _, written = codecache.write("int ptexec_kernel(void) { return 1; }\n", "cpp")
    finally:
        os.umask(old)
    path = Path(written)
    assert chosen in path.parents
    assert _others_may_write(path, chosen) is None
    assert _others_may_write(path.parent, chosen) is None
    assert chosen == root / "inductor" and _trusted(chosen)


def test_a_triton_cache_others_may_write_is_replaced(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))
    shared = tmp_path / "triton"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared))
    assert aoti.inductor_cache() == mine
    assert os.environ["TRITON_CACHE_DIR"] == str(mine / "triton")


def test_without_a_usable_root_a_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(shared / "cache"))  # under an untrusted one
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    chosen = aoti.inductor_cache()
    assert shared not in chosen.parents and chosen != shared
    assert _trusted(chosen) and stat.S_IMODE(chosen.stat().st_mode) == 0o700


def test_a_private_directory_made_again_by_another_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The private directory is removed (a forked child's end removed it) and its name,
    known from the environment, made again by someone else, others may write: a new one,
    where the same name was handed to torch again."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(shared / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    first = aoti.inductor_cache()
    shutil.rmtree(first)
    first.mkdir()
    first.chmod(0o777)
    chosen = aoti.inductor_cache()
    assert chosen != first and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(chosen)
    assert _trusted(chosen) and stat.S_IMODE(chosen.stat().st_mode) == 0o700


_FORKED = """
import os, sys
from ptexec.compile import aoti
chosen = aoti.inductor_cache()
child = os.fork()
if child == 0:
    sys.exit(0)  # an ordinary end: exit functions run
os.waitpid(child, 0)
print(chosen.is_dir())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_childs_end_leaves_the_private_directory(tmp_path: Path) -> None:
    """A child forked from a process compiling into its private directory (a preloading
    server's worker) removed that directory as it ended: the parent's kernels were gone
    and the name was free for anyone to make again."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "PTEXEC_CACHE_DIR": str(shared / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(shared),
    }
    done = subprocess.run(
        [sys.executable, "-c", _FORKED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True"]


_PROBE = "import torch._inductor.cpu_vec_isa as isa; isa.pick_vec_isa()"
_COMPILE = """
import torch
from ptexec.compile.aoti import compile_models
class M(torch.nn.Module):
    def forward(self, x):
        return (torch.relu(x) * 2,)
ep = torch.export.export(M(), (torch.randn(4, 8),))
compile_models({"r0": ep}, torch.device("cpu"), autotune=False)
"""


def _python(code: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_compile_loads_no_kernel_planted_where_others_may_write(
    root: Path, tmp_path: Path
) -> None:
    if aoti.find_compiler() is None or shutil.which("gcc") is None:
        pytest.skip("needs a C++ compiler")
    env = {**os.environ, "PYTHONPATH": SRC, "PTEXEC_CACHE_DIR": str(root)}
    env.pop("TRITON_CACHE_DIR", None)
    # the kernels torch builds in any compile (the instruction-set probes), at their
    # paths: built once into the directory ptexec compiles with in place of the shared one
    mine = root / "inductor"
    mine.mkdir(mode=0o700)
    _python(_PROBE, {**env, "TORCHINDUCTOR_CACHE_DIR": str(mine)})
    libraries = sorted(p.relative_to(mine) for p in mine.rglob("*.so"))
    assert libraries
    # a directory others may write, with a planted library at each of those paths
    (tmp_path / "planted.c").write_text(HOSTILE_C)
    planted = tmp_path / "planted.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(planted), str(tmp_path / "planted.c")], check=True
    )
    shared = tmp_path / "shared"
    shutil.copytree(mine, shared)
    for name in libraries:
        shutil.copyfile(planted, shared / name)
    for d in [shared, *(p for p in shared.rglob("*") if p.is_dir())]:
        d.chmod(0o777)
    marker = tmp_path / "marker"
    _python(
        _COMPILE,
        {**env, "TORCHINDUCTOR_CACHE_DIR": str(shared), "PTEXEC_TEST_MARKER": str(marker)},
    )
    assert not marker.exists(), "a library planted in the shared kernel cache was loaded"
    assert sorted(p.relative_to(shared) for p in shared.rglob("*.so")) == libraries


def test_the_cache_command_lists_and_clears_the_kernels_compiled_in_the_root(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The kernels torch compiled under the root (where its own cache was not trusted) are
    part of the cache: ``ptexec cache list`` counts them, ``clear`` removes them."""
    from ptexec.cli import main

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    chosen = aoti.inductor_cache()
    (chosen / "ab").mkdir()
    (chosen / "ab" / "kernel.so").write_bytes(b"\0" * 2048)
    assert aoti.kept_kernels(root) == (1, 2048)
    assert main(["cache", "list"]) == 0
    assert "torch's kernels compiled here: 1 file(s)" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "1 file(s) of torch's kernels" in capsys.readouterr().out
    assert not chosen.exists() and aoti.kept_kernels(root) == (0, 0)


@pytest.mark.parametrize("how", ["group-writable", "link"])
def test_the_cache_command_reports_and_clears_a_kernel_directory_not_used(
    root: Path, tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ``inductor`` under the root that torch is never given (writable by its group, or a
    link): verify says why, and clear removes it (a link itself, never what it leads to)."""
    from ptexec.cli import main

    kernels = root / "inductor"
    if how == "link":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "kernel.so").write_bytes(b"\0")
        kernels.symlink_to(elsewhere)
        what = "is a symbolic link"
    else:
        kernels.mkdir(mode=0o700)
        (kernels / "kernel.so").write_bytes(b"\0")
        kernels.chmod(0o770)
        what = "writable by its group"
    capsys.readouterr()
    assert main(["cache", "verify"]) == 1
    assert what in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert not os.path.lexists(kernels)
    if how == "link":
        assert (elsewhere / "kernel.so").exists()


def test_an_inductor_folder_of_a_project_used_as_the_root_keeps_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PTEXEC_CACHE_DIR`` naming a project's folder that has an ``inductor`` folder of its
    own, others may enter (0755): a compile never empties it (nothing says it is the
    cache's, as ``cache clear`` refuses such a folder too); torch gets a private
    directory instead. A root holding only what a cache holds still has its ``inductor``
    emptied and made again."""
    project = tmp_path / "project"
    (project / "inductor").mkdir(parents=True)
    for d in (project, project / "inductor"):
        d.chmod(0o755)
    mine = [project / "inductor" / "notes.txt", project / "train.py"]
    for f in mine:
        f.write_text("kept")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(project))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    chosen = aoti.inductor_cache()
    assert [f.read_text() for f in mine] == ["kept", "kept"]
    assert stat.S_IMODE((project / "inductor").stat().st_mode) == 0o755
    assert project not in chosen.parents and shared not in chosen.parents
    assert _trusted(chosen) and stat.S_IMODE(chosen.stat().st_mode) == 0o700
    # the cache's own root: its inductor others may enter is made again, private
    (project / "train.py").unlink()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    assert aoti.inductor_cache() == project / "inductor"
    assert stat.S_IMODE((project / "inductor").stat().st_mode) == 0o700
