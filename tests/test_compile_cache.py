"""The compile cache under hostile and careless use: who may write it, what is loaded from
it, what a damaged entry does, what an unusable cache does, housekeeping and the key.

Hostile entries are planted as an attacker would plant them: a real shared library, built
here with the C compiler, whose constructor writes a marker file when anything loads it,
described by a manifest of the regions ptexec plans for the program (the key is computed
with ptexec, as anyone holding the program can). A refused entry is a miss: with no C++
compiler for the compile that follows (``CXX`` names nothing) the method runs interpreted,
and its outputs are checked against the interpreter's. The publishing tests replace
AOTInductor by the traced graph (``fake_aoti``): everything around the compiler (staging,
manifest, digests, rename, hits, eviction) runs for real, in a fraction of a second.
"""

from __future__ import annotations

import copy
import errno
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from fixture_data import fixture_calls, fixture_paths
from ptexec import cachedir
from ptexec.compile import CompileOptions, CompileWarning
from ptexec.compile import cache as cache_mod
from ptexec.compile.cache import (
    LAYOUT_VERSION,
    MANIFEST,
    Cache,
    cache_key,
    content_digest,
    open_cache,
)
from ptexec.compile.graph import BinOp, Guard, GuardError, Size
from ptexec.compile.manifest import Manifest, RegionRecord
from ptexec.errors import CacheEntryError

PTE = fixture_paths("mlp")[0]
HOSTILE_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *path = getenv("PTEXEC_TEST_MARKER");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) { fputs("ran", f); fclose(f); }
}
"""


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    cache_mod._warned.clear()  # each test sees its own once-only warnings
    yield
    cache_mod._warned.clear()


@pytest.fixture(scope="module")
def hostile_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("needs a C compiler to build the planted library")
    d = tmp_path_factory.mktemp("hostile")
    (d / "planted.c").write_text(HOSTILE_C)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(d / "planted.so"), str(d / "planted.c")], check=True
    )
    return d / "planted.so"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    r = tmp_path / "cache"
    r.mkdir(mode=0o700)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(r))
    monkeypatch.setenv("PTEXEC_TEST_MARKER", str(tmp_path / "marker"))
    return r


@functools.cache
def _key() -> str:
    return cache_key(
        content_digest([ptexec.load(PTE).pte.data]), "forward", "cpu", CompileOptions().key()
    )


def _records() -> list[dict[str, Any]]:
    """The region records ptexec plans for the program (what a planted manifest copies)."""
    return copy.deepcopy(_planned())


@functools.cache
def _planned() -> list[dict[str, Any]]:
    from ptexec.compile.runner import RegionBuilder

    state = ptexec.load(PTE).load_method("forward").state
    builder = RegionBuilder(state, ptexec.load(PTE), CompileOptions())
    return [
        RegionRecord.of(r, [], {}, f"r{k}", f"r{k}.so").to_json()
        for k, r in enumerate(builder.regions)
    ]


def plant(
    root: Path, library: Path, edit: Callable[[dict[str, Any], Path], None] | None = None
) -> Path:
    """An entry for the program's key: the library as every region's file, a manifest that
    records their true sizes and digests; ``edit(manifest, entry)`` spoils it."""
    entry = root / _key()
    entry.mkdir(mode=0o700)
    regions = _records()
    files = {}
    for r in regions:
        shutil.copyfile(library, entry / r["file"])
        data = (entry / r["file"]).read_bytes()
        files[r["file"]] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {
        "layout": LAYOUT_VERSION,
        "method": "forward",
        "regions": regions,
        "failed": [],
        "compile_seconds": 1.0,
        "files": files,
    }
    if edit is not None:
        edit(manifest, entry)
    (entry / MANIFEST).write_text(json.dumps(manifest))
    return entry


def load_compiled(monkeypatch: pytest.MonkeyPatch) -> tuple[ptexec.Method, list[str]]:
    """Load with compile=True and no C++ compiler (a miss runs interpreted); the method and
    the compile warnings; its outputs are the interpreter's."""
    monkeypatch.setenv("CXX", "ptexec-no-such-compiler")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = ptexec.load(PTE).load_method("forward", compile=True)
    x, want = _reference()
    assert torch.equal(m.execute(x)[0], want)
    return m, [str(w.message) for w in caught if issubclass(w.category, CompileWarning)]


@functools.cache
def _reference() -> tuple[list[Any], torch.Tensor]:
    """The first stored call's inputs and the interpreter's output."""
    x = fixture_calls("mlp")[0]["inputs"]
    return x, ptexec.load(PTE).load_method("forward").execute(x)[0]


def assert_refused(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    _, messages = load_compiled(monkeypatch)
    assert not (tmp_path / "marker").exists(), "the planted library ran"
    assert any(what in m for m in messages), messages


# ---- the control: a planted library that is loaded does run ---------------------------------


def test_control_a_trusted_intact_entry_is_loaded(
    root: Path, tmp_path: Path, hostile_library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness is real: the same entry, owned by this user, intact, reaches dlopen
    (its constructor writes the marker); every test below spoils one thing about it."""
    plant(root, hostile_library)
    _, messages = load_compiled(monkeypatch)
    assert (tmp_path / "marker").exists()
    assert any("did not load" in m for m in messages)  # not an AOTInductor model: a miss


# ---- 1. who owns the cache ------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_group_or_world_writable_root_is_not_used(
    root: Path, tmp_path: Path, hostile_library: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    plant(root, hostile_library)
    root.chmod(mode)
    assert_refused(root, tmp_path, monkeypatch, "the compile cache is not used")


def test_a_root_or_entry_owned_by_another_user_is_not_used(
    root: Path, tmp_path: Path, hostile_library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = plant(root, hostile_library)
    if os.getuid() == 0:  # really another owner
        for p in [entry, *entry.iterdir()]:
            os.chown(p, 65534, 65534)
        assert_refused(root, tmp_path, monkeypatch, "is owned by uid 65534")
        plant(root, hostile_library)
        os.chown(root, 65534, 65534)
    else:  # this user seen as another one
        monkeypatch.setattr(cachedir, "_uid", lambda: os.getuid() + 1)
    assert_refused(root, tmp_path, monkeypatch, "is owned by uid")


def test_a_writable_entry_or_library_is_not_used(
    root: Path, tmp_path: Path, hostile_library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = plant(root, hostile_library)
    (entry / "r0.so").chmod(0o666)
    assert_refused(root, tmp_path, monkeypatch, "is writable by")
    entry = plant(root, hostile_library)
    entry.chmod(0o777)
    assert_refused(root, tmp_path, monkeypatch, "is writable by")


def test_a_directory_above_the_root_writable_by_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    above = tmp_path / "shared"
    above.mkdir()
    (above / "cache").mkdir(mode=0o700)
    above.chmod(0o777)
    problem, _ = cache_mod.root_status(above / "cache")
    assert problem is not None and "above the cache" in problem
    above.chmod(0o1777)  # sticky (as /tmp): others cannot move what is ours
    assert cache_mod.root_status(above / "cache") == (None, True)


# ---- 2. confined to the entry ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["ABSOLUTE", "../outside.so", "sub/r0.so", ".hidden.so", ""])
def test_a_region_file_must_be_a_bare_name(
    root: Path, tmp_path: Path, hostile_library: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    name = str(hostile_library) if name == "ABSOLUTE" else name
    (root / "outside.so").write_bytes(hostile_library.read_bytes())

    def edit(m: dict[str, Any], entry: Path) -> None:
        m["regions"][0]["file"] = name

    plant(root, hostile_library, edit)
    assert_refused(root, tmp_path, monkeypatch, "must be a bare file name")


def test_a_symlinked_library_or_entry_is_not_used(
    root: Path, tmp_path: Path, hostile_library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def link(m: dict[str, Any], entry: Path) -> None:
        (entry / "r0.so").unlink()
        (entry / "r0.so").symlink_to(hostile_library)

    plant(root, hostile_library, link)
    assert_refused(root, tmp_path, monkeypatch, "is a symbolic link")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    entry = plant(elsewhere, hostile_library)
    (root / entry.name).symlink_to(entry)
    assert_refused(root, tmp_path, monkeypatch, "is a symbolic link")


# ---- 3. the manifest is data ----------------------------------------------------------------

INJECTED = "__import__('os').system('touch ' + __import__('os').environ['PTEXEC_TEST_MARKER'])"


@pytest.mark.parametrize(
    "guard",
    [
        {"kind": "expr", "k": 0, "d": 0, "expr": INJECTED + " + 2"},
        {"kind": "eq", "k": 0, "d": 0, "value": INJECTED},
        {"kind": "range", "k": 0, "d": 0, "lo": 0, "hi": "1) or " + INJECTED + " or (1"},
        {"kind": "eq", "k": True, "d": 0, "value": 2},
        {"kind": "eq", "k": 0, "d": 0, "value": 2, "expr": INJECTED},
        {"kind": "exec", "k": 0, "d": 0, "value": 2},
        {"kind": "expr", "k": 0, "d": 0, "expr": ["__import__", 1, 2]},
        {"kind": "positive", "k": 0, "d": 0, "expr": INJECTED},
        {"kind": "positive", "k": 0, "d": 0, "expr": ["size", 5, 0]},  # no such input
        {"kind": "eq", "k": 7, "d": 0, "value": 2},  # no such input
        {"kind": "same", "k": 0, "d": 9, "k2": 0, "d2": 0},  # no such dimension
    ],
)
def test_guards_from_disk_are_validated_before_any_code_is_made(
    root: Path,
    tmp_path: Path,
    hostile_library: Path,
    monkeypatch: pytest.MonkeyPatch,
    guard: dict[str, Any],
) -> None:
    def edit(m: dict[str, Any], entry: Path) -> None:
        m["regions"][0]["guards"] = [guard]

    plant(root, hostile_library, edit)
    _, messages = load_compiled(monkeypatch)
    assert not (tmp_path / "marker").exists()
    assert any("is not used" in m for m in messages), messages


@pytest.mark.parametrize(
    "kinds", [[[0, "__import__('os').system"]], {"3": "int"}, [[True, "int"]], [[10**6, "int"]]]
)
def test_region_kinds_come_from_a_fixed_set(
    root: Path,
    tmp_path: Path,
    hostile_library: Path,
    monkeypatch: pytest.MonkeyPatch,
    kinds: Any,
) -> None:
    def edit(m: dict[str, Any], entry: Path) -> None:
        m["regions"][0]["kinds"] = kinds

    plant(root, hostile_library, edit)
    assert_refused(root, tmp_path, monkeypatch, "manifest regions[0].kinds")


def test_guard_round_trip_and_generated_code() -> None:
    expr = BinOp("+", BinOp("//", Size(1, 0), 2), -3)
    guards = [
        Guard("eq", 0, 1, value=4),
        Guard("range", 0, 0, lo=1, hi=-1),
        Guard("same", 1, 0, k2=0, d2=0),
        Guard("expr", 0, 0, expr=expr),
        Guard("positive", 1, 0, expr=BinOp("-", Size(1, 0), 1)),
    ]
    for g in guards:
        assert Guard.from_json(json.loads(json.dumps(g.to_json()))) == g
    assert guards[3].code() == "x0.shape[0] == ((x1.shape[0] // (2)) + (-3))"
    assert guards[4].code() == "(x1.shape[0] - (1)) >= 1"
    assert [s.k for s in guards[4].sizes()] == [1, 1]
    sliced = Guard(
        "positive", 0, 1, expr=BinOp("max", 0, BinOp("-", Size(0, 1), BinOp("min", 2, Size(0, 1))))
    )
    assert Guard.from_json(json.loads(json.dumps(sliced.to_json()))) == sliced
    assert sliced.code() == "max((0), (x0.shape[1] - min((2), x0.shape[1]))) >= 1"
    with pytest.raises(GuardError):
        Guard.from_json({"kind": "expr", "k": 0, "d": 0, "expr": 1.5})
    deep: Any = 1
    for _ in range(300):
        deep = ["+", deep, 1]
    with pytest.raises(GuardError, match="more than"):
        Guard.from_json({"kind": "expr", "k": 0, "d": 0, "expr": deep})
    # a divisor that may be 0 would fail every call (a damaged entry is a miss, never a
    # crash): only positive constants divide
    for divisor in (0, -2, ["size", 0, 0], ["-", 1, 1]):
        for op in ("//", "%"):
            with pytest.raises(GuardError, match="divides by"):
                Guard.from_json({"kind": "expr", "k": 0, "d": 0, "expr": [op, 7, divisor]})


# ---- 4. damaged entries ---------------------------------------------------------------------


def _truncate(m: dict[str, Any], entry: Path) -> None:
    data = (entry / "r0.so").read_bytes()
    (entry / "r0.so").write_bytes(data[: len(data) // 3])


def _flip(m: dict[str, Any], entry: Path) -> None:
    data = bytearray((entry / "r0.so").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (entry / "r0.so").write_bytes(bytes(data))


def _extra_file(m: dict[str, Any], entry: Path) -> None:
    (entry / "r0.json").write_text("{}")


@pytest.mark.parametrize(
    ("spoil", "what"),
    [
        (_truncate, "truncated"),
        (_flip, "sha256"),
        (_extra_file, "does not list"),
        (lambda m, e: m.pop("files"), "missing keys ['files']"),
        (lambda m, e: m["regions"][0].pop("guards"), "missing keys ['guards']"),
        (lambda m, e: m["regions"][0].pop("chain"), "missing keys ['chain']"),
        (lambda m, e: m["regions"][0].update(extra=1), "unexpected keys ['extra']"),
        (lambda m, e: m["regions"][0].update(kinds=3), "must be a list"),
        (lambda m, e: m["regions"][0].update(first=True), "non-negative int"),
        (lambda m, e: m["regions"][0].update(stores=[[0, "exec", 1]]), "stores[0]"),
        (lambda m, e: m.update(regions={}), "must be a list"),
        (lambda m, e: m["files"]["r0.so"].update(size=-1), "non-negative int"),
    ],
)
def test_a_damaged_entry_is_a_miss_with_one_warning_and_is_replaced(
    root: Path,
    tmp_path: Path,
    hostile_library: Path,
    monkeypatch: pytest.MonkeyPatch,
    spoil: Callable[[dict[str, Any], Path], Any],
    what: str,
) -> None:
    entry = plant(root, hostile_library, spoil)
    _, messages = load_compiled(monkeypatch)
    assert not (tmp_path / "marker").exists()
    ours = [m for m in messages if "is not used" in m]
    assert len(ours) == 1 and what in ours[0], messages
    assert not entry.exists()  # removed: the next compile can publish its own


@pytest.mark.parametrize("text", ["[]", "{not json", "[" * 100000, '"x"', "null"])
def test_a_manifest_that_is_not_an_object_is_a_miss(
    root: Path, tmp_path: Path, hostile_library: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    entry = plant(root, hostile_library)
    (entry / MANIFEST).write_text(text)
    assert_refused(root, tmp_path, monkeypatch, "is not used")


# ---- publishing and housekeeping, with AOTInductor replaced by the traced graph ----------


@pytest.fixture
def fake_aoti(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """``compile_models`` writes a small file per region (not a library) and remembers the
    graph; ``load_model`` runs the graph of the file's contents. Counts the compiles."""
    import ptexec.compile.aoti as aoti
    from ptexec.compile.runner import _graph_model

    graphs: dict[bytes, Any] = {}
    counts = {"compiled": 0, "loaded": 0}

    def compile_models(
        exported: Any,
        device: Any,
        autotune: bool = True,
        native_entry: bool = False,
        serial: bool = False,
    ) -> Any:
        out = {}
        for name, ep in exported.items():
            token = uuid.uuid4().hex.encode()
            graphs[token] = ep
            path = Path(os.environ["PTEXEC_TEST_OUT"]) / f"{token.decode()}.so"
            path.write_bytes(token)
            out[name] = [str(path)]
            counts["compiled"] += 1
        return out

    def load_model(path: Path, name: str, device: Any) -> Any:
        counts["loaded"] += 1
        return _graph_model(graphs[Path(path).read_bytes()])

    monkeypatch.setattr(aoti, "compile_models", compile_models)
    monkeypatch.setattr(aoti, "load_model", load_model)
    monkeypatch.setattr(aoti, "find_compiler", lambda: "c++")
    return counts


@pytest.fixture
def out_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "compiler-output"
    d.mkdir()
    monkeypatch.setenv("PTEXEC_TEST_OUT", str(d))
    return d


def _load(**kw: Any) -> tuple[ptexec.Method, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = ptexec.load(PTE).load_method("forward", compile=CompileOptions(**kw))
    x, want = _reference()
    assert torch.allclose(m.execute(x)[0], want, atol=1e-6)
    return m, [str(w.message) for w in caught if issubclass(w.category, CompileWarning)]


def test_an_entry_is_published_with_digests_and_then_hit(
    root: Path, fake_aoti: dict[str, int], out_dir: Path
) -> None:
    m, messages = _load()
    assert messages == [] and fake_aoti["compiled"] == 1
    report = m.compile_report
    assert report is not None and not report.cache_hit and report.cache_path
    entry = Path(report.cache_path)
    manifest = json.loads((entry / MANIFEST).read_text())
    data = (entry / "r0.so").read_bytes()
    assert manifest["files"] == {
        "r0.so": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    }
    assert oct(entry.stat().st_mode & 0o777) == oct(0o700)
    assert sorted(p.name for p in root.iterdir()) == [entry.name]  # no staging left
    again, messages = _load()
    assert messages == [] and fake_aoti["compiled"] == 1
    assert again.compile_report is not None and again.compile_report.cache_hit


def test_a_damaged_entry_is_replaced_by_the_next_compile(
    root: Path, fake_aoti: dict[str, int], out_dir: Path
) -> None:
    m, _ = _load()
    assert m.compile_report is not None and m.compile_report.cache_path
    entry = Path(m.compile_report.cache_path)
    (entry / "r0.so").write_bytes(b"x")
    _, messages = _load()
    assert len(messages) == 1 and "truncated" in messages[0]
    assert fake_aoti["compiled"] == 2 and entry.is_dir()  # compiled again and published
    again, messages = _load()
    assert messages == [] and again.compile_report is not None and again.compile_report.cache_hit


def _no_home(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    # a home that cannot hold a cache (as /nonexistent for a user who may not create it)
    (tmp / "not-a-home").write_text("")
    mp.delenv("PTEXEC_CACHE_DIR")
    mp.delenv("XDG_CACHE_HOME", raising=False)
    mp.setenv("HOME", str(tmp / "not-a-home" / "home"))


def _a_file(tmp: Path, mp: pytest.MonkeyPatch) -> None:
    (tmp / "file").write_text("")
    mp.setenv("PTEXEC_CACHE_DIR", str(tmp / "file"))


def _shared(tmp: Path, mp: pytest.MonkeyPatch) -> None:  # root's cache, read by a user
    mp.setattr(cachedir, "_uid", lambda: 4242)


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (_no_home, "cannot be used"),
        (_a_file, "is not a directory"),
        (_shared, "read only"),
    ],
)
def test_an_unusable_cache_never_fails_the_load(
    root: Path,
    tmp_path: Path,
    fake_aoti: dict[str, int],
    out_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[Path, pytest.MonkeyPatch], None],
    what: str,
) -> None:
    if make is _shared and os.getuid() != 0:  # the root must be root's
        pytest.skip("needs a root-owned cache directory")
    make(tmp_path, monkeypatch)
    before = set(root.iterdir())
    m, messages = _load()
    assert m.compile_report is not None and m.compile_report.compiled_instructions == 5
    assert len(messages) == 1 and what in messages[0], messages
    assert set(root.iterdir()) == before  # nothing written, no staging left
    _, messages = _load()
    assert messages == []  # once per process


def test_a_shared_read_only_cache_is_used(
    root: Path, fake_aoti: dict[str, int], out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An administrator (root) fills a cache whose root admits readers; a user loads from
    it: the entries are readable, hits are used, nothing is written."""
    if os.getuid() != 0:
        pytest.skip("needs a root-owned cache directory")
    root.chmod(0o755)
    m, _ = _load()
    assert m.compile_report is not None and m.compile_report.cache_path
    entry = Path(m.compile_report.cache_path)
    assert entry.stat().st_mode & 0o777 == 0o755
    assert (entry / "r0.so").stat().st_mode & 0o777 == 0o644
    monkeypatch.setattr(cachedir, "_uid", lambda: 4242)  # now as a user
    again, messages = _load()
    assert messages == [] and again.compile_report is not None and again.compile_report.cache_hit


def test_a_full_disk_while_publishing(
    root: Path, fake_aoti: dict[str, int], out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ptexec.compile.aoti as aoti

    real = aoti.save_models

    def full(files: Any, devices: Any, directory: Path) -> Any:
        if root in directory.parents:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(files, devices, directory)

    monkeypatch.setattr(aoti, "save_models", full)
    m, messages = _load()
    assert m.compile_report is not None and m.compile_report.compiled_instructions == 5
    assert len(messages) == 1 and "No space left" in messages[0]
    assert list(root.iterdir()) == []  # the staging directory is gone
    monkeypatch.setattr(aoti, "save_models", real)
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
    m, messages = _load()
    assert len(messages) == 1 and "not kept" in messages[0]
    assert list(root.iterdir()) == []


def test_stale_staging_is_removed_and_lru_entries_evicted(
    root: Path, fake_aoti: dict[str, int], out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    host = cache_mod.host()
    stale = root / f".staging-{dead.pid}-{host}-0123456789abcdef-x1_abcde"
    live = root / f".staging-{os.getpid()}-{host}-0123456789abcdef-y2_abcde"
    for d in (stale, live):
        d.mkdir()
        (d / "r0.so").write_bytes(b"half")
    old = []
    for n in range(3):
        e = root / f"{n:064x}"
        e.mkdir()
        (e / "r0.so").write_bytes(b"x" * 1000)
        os.utime(e, (1000 + n, 1000 + n))
        old.append(e)
    monkeypatch.setenv("PTEXEC_CACHE_MAX_BYTES", "2500")
    m, _ = _load()
    assert not stale.exists() and live.exists()
    assert m.compile_report is not None and m.compile_report.cache_path
    kept = {p.name for p in root.iterdir() if not p.name.startswith(".")}
    # the new entry (tens of bytes) and the most recently used old one fit in 2500 bytes
    assert kept == {Path(m.compile_report.cache_path).name, old[2].name}


def test_housekeeping_removes_nothing_in_a_root_holding_what_no_cache_holds(
    root: Path, fake_aoti: dict[str, int], out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project's folder named as the root (``PTEXEC_CACHE_DIR``): its files named as an
    entry, a staging directory or an entry being removed would be, however old and
    large, are the project's (``cache clear`` refuses such a folder too); a compile keeps
    its entry there and removes nothing, and says once why the cap is not kept."""
    blob = root / ("ab" * 32)  # a file named by its sha256, as downloads often are
    blob.write_bytes(b"x" * 3000)
    notes = root / ".trash-notes"
    notes.write_text("kept")
    drafts = root / ".staging-drafts"
    drafts.mkdir()
    (drafts / "a.txt").write_text("kept")
    (root / "train.py").write_text("kept")
    for p in (blob, notes, drafts):
        os.utime(p, (1000, 1000))
    monkeypatch.setenv("PTEXEC_CACHE_MAX_BYTES", "2500")
    m, messages = _load()
    assert m.compile_report is not None and m.compile_report.cache_path
    assert Path(m.compile_report.cache_path).is_dir()
    assert blob.read_bytes() == b"x" * 3000 and notes.read_text() == "kept"
    assert (drafts / "a.txt").read_text() == "kept" and (root / "train.py").exists()
    assert len(messages) == 1 and "train.py" in messages[0]


@pytest.mark.parametrize(
    ("text", "size"), [("", 10 * 1024**3), ("0", 0), ("500M", 500 * 1024**2), ("2g", 2 * 1024**3)]
)
def test_the_size_cap(monkeypatch: pytest.MonkeyPatch, text: str, size: int) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_MAX_BYTES", text)
    assert cache_mod.max_bytes() == size


# ---- the command line -----------------------------------------------------------------------


def test_cli_cache_list_verify_clear(
    root: Path,
    fake_aoti: dict[str, int],
    out_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ptexec.cli import main

    m, _ = _load()
    assert m.compile_report is not None and m.compile_report.cache_path
    entry = Path(m.compile_report.cache_path)
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert entry.name[:16] in out and "forward" in out and "1 entr" in out
    assert main(["cache", "verify"]) == 0
    (entry / "r0.so").write_bytes(b"damaged")
    assert main(["cache", "verify"]) == 1
    out = capsys.readouterr().out
    assert "damaged" in out and entry.name[:16] in out
    assert main(["cache", "clear"]) == 0
    assert list(root.iterdir()) == []


# ---- 7. the key -----------------------------------------------------------------------------


def test_the_key_follows_what_the_build_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CPUs of one capability level with different extensions get different keys
    (AOTInductor builds with -march=native); a configured -march is keyed by name."""
    base = cache_key(content_digest([b"program"]), "forward", "cpu", {})
    monkeypatch.setattr(cache_mod, "_cpu_features", lambda: "another cpu's features")
    other = cache_key(content_digest([b"program"]), "forward", "cpu", {})
    assert other != base
    monkeypatch.setenv("TORCHINDUCTOR_CPP_MARCH", "x86-64-v3")
    import torch._inductor.config as inductor_config

    # the config's own patch: monkeypatch would delete the class attribute on undo, and
    # every later compile in the process would fail
    with inductor_config.patch({"cpp.march": "x86-64-v3"}):
        named = cache_key(content_digest([b"program"]), "forward", "cpu", {})
        monkeypatch.setattr(cache_mod, "_cpu_features", lambda: "a third cpu")
        assert cache_key(content_digest([b"program"]), "forward", "cpu", {}) == named != other


def test_a_program_is_hashed_once_for_the_keys_of_its_methods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The key digests the program's bytes and its data file's; a loaded program is
    hashed once (on a thread of its own when a compiled load starts it), and the keys of
    its methods, and of later loads of them, share that digest."""
    hashed: list[int] = []
    real = cache_mod.content_digest

    def counted(blobs: Any) -> bytes:
        blobs = list(blobs)
        hashed.append(sum(len(b) for b in blobs))
        return real(blobs)

    monkeypatch.setattr(cache_mod, "content_digest", counted)
    pte, ptd = fixture_paths("external")[:2]
    prog = ptexec.load(pte, data_path=ptd)
    assert prog.ptd is not None
    blobs = [prog.pte.data, *(f.data for f in prog.ptd.files)]
    cache_mod.start_program_digest(prog)
    cache_mod.start_program_digest(prog)  # (already started)
    digest = cache_mod.program_digest(prog)
    assert (
        digest
        == real(blobs)
        == hashlib.sha256(b"".join(len(b).to_bytes(8, "little") + bytes(b) for b in blobs)).digest()
    )
    assert cache_mod.program_digest(prog) == digest
    assert hashed == [sum(len(b) for b in blobs)]
    # another load of the same files is another program: hashed again, to the same digest
    assert cache_mod.program_digest(ptexec.load(pte, data_path=ptd)) == digest
    assert len(hashed) == 2
    key = cache_key(digest, "forward", "cpu", {"a": 1})
    # the data file is part of what is digested
    assert key != cache_key(real([prog.pte.data]), "forward", "cpu", {"a": 1})


def test_the_cpu_features_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("reads /proc/cpuinfo")
    cache_mod._cpu_features.cache_clear()
    assert len(cache_mod._cpu_features()) == 32


def test_open_cache_makes_a_private_root(tmp_path: Path) -> None:
    cache = open_cache(tmp_path / "new" / "cache")
    assert isinstance(cache, Cache) and cache.writable
    assert (tmp_path / "new" / "cache").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("umask", [0o002, 0o000])
def test_directories_made_on_the_way_to_a_new_root_are_private(tmp_path: Path, umask: int) -> None:
    """A missing ``~/.cache`` is made with the root, 0700 as the root is: made with the
    umask alone, a user's own group's umask (002) left it writable by the group, and the
    root under it was refused for good (no umask leaves it writable by everyone)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    old = os.umask(umask)
    try:
        cache = open_cache(home / ".cache" / "ptexec")
    finally:
        os.umask(old)
    assert isinstance(cache, Cache) and cache.writable
    for made in (home / ".cache", home / ".cache" / "ptexec"):
        assert made.stat().st_mode & 0o777 == 0o700


def test_verify_names_what_is_wrong(root: Path, hostile_library: Path) -> None:
    def edit(m: dict[str, Any], entry: Path) -> None:
        m["regions"][0]["guards"] = [{"kind": "eq", "k": 0, "d": 0, "value": 1.5}]

    plant(root, hostile_library, edit)
    cache = open_cache(root)
    assert cache is not None
    (entry,) = cache.entries()
    with pytest.raises(CacheEntryError, match=r"regions\[0\].guards\[0\].*value must be an int"):
        entry.verify()


def test_a_library_changed_after_a_check_is_hashed_again(
    root: Path, hostile_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process hashes an unchanged file once; a file written since (even to the same size
    and modification time) is hashed again and refused, and its planted code never runs."""
    monkeypatch.setattr(cache_mod, "_RACY_SECONDS", 0.0)  # (the file was written just now)
    entry = plant(root, hostile_library)
    cache = open_cache(root)
    assert cache is not None
    (found,) = cache.entries()
    found.verify()
    library = next(entry.glob("*.so"))
    assert os.fspath(library) in cache_mod._hashed  # (hashed once: the next check skips it)
    st = library.stat()
    data = bytearray(library.read_bytes())
    data[-1] ^= 0xFF
    library.write_bytes(bytes(data))
    os.utime(library, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(CacheEntryError, match="does not have the sha256"):
        found.verify()
    assert_refused(root, tmp_path, monkeypatch, "does not have the sha256")


def test_files_hashed_ahead_are_checked_as_any(
    root: Path, hostile_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry's files hashed on a thread ahead of its check (while a load goes on) are
    read once; what that thread found is a record of the file's bytes, not a verdict: a
    file that differs from its manifest is still refused, and a changed one hashed again."""
    monkeypatch.setattr(cache_mod, "_RACY_SECONDS", 0.0)  # (the file was written just now)
    reads: list[int] = []
    real = cache_mod._sha256

    def counted(f: Any, size: int) -> str:
        reads.append(size)
        return real(f, size)

    monkeypatch.setattr(cache_mod, "_sha256", counted)
    entry = plant(root, hostile_library)
    cache = open_cache(root)
    assert cache is not None
    (found,) = cache.entries()
    assert found.start_hashing() and found.start_hashing()  # (once)
    found.verify()
    found.verify()
    assert len(reads) == 1
    library = next(entry.glob("*.so"))
    data = bytearray(library.read_bytes())
    data[-1] ^= 0xFF
    library.write_bytes(bytes(data))
    (again,) = cache.entries()
    assert again.start_hashing()
    with pytest.raises(CacheEntryError, match="does not have the sha256"):
        again.verify()
    assert len(reads) == 2  # the changed file: hashed ahead, once, and refused
    assert not cache_mod.CacheEntry(cache, "0" * 64).start_hashing()  # no such entry
    assert_refused(root, tmp_path, monkeypatch, "does not have the sha256")


def test_a_library_written_just_before_its_check_is_hashed_every_time(
    root: Path, hostile_library: Path
) -> None:
    """A write within one time stamp of the last may not change it (coarse clocks): a file
    changed in the seconds before it was hashed is not remembered as hashed."""
    entry = plant(root, hostile_library)
    cache = open_cache(root)
    assert cache is not None
    (found,) = cache.entries()
    found.verify()
    assert os.fspath(next(entry.glob("*.so"))) not in cache_mod._hashed


def test_the_way_to_the_root_as_written_is_checked(tmp_path: Path) -> None:
    """A link on the way to the root leads where its owner says: the directories on the
    way as written are checked as those above the resolved root are, and a link another
    user owns is refused."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: others may replace the link in it
    (shared / "cache").symlink_to(real)
    problem, _ = cache_mod.root_status(shared / "cache")
    assert problem is not None and f"{shared}, above the cache" in problem
    shared.chmod(0o1777)  # sticky: only the link's owner may replace it
    assert cache_mod.root_status(shared / "cache") == (None, True)
    if os.getuid() == 0:
        os.lchown(shared / "cache", 65534, 65534)
        problem, _ = cache_mod.root_status(shared / "cache")
        assert problem is not None and "symbolic link owned by uid 65534" in problem


def test_entries_appear_whole_and_the_first_one_wins(tmp_path: Path) -> None:
    """Two writers of one key: each assembles its entry apart; the first rename wins, the
    second is dropped, and a reader only ever sees a complete entry."""
    cache = open_cache(tmp_path)
    assert cache is not None
    a, b = cache.entry("k" * 64), cache.entry("k" * 64)
    sa, sb = a.staging(), b.staging()
    assert a.read() is None
    (sa / "r0.so").write_bytes(b"A")
    (sb / "r0.so").write_bytes(b"B")
    manifest = Manifest("forward", (), (), 1.0)
    assert a.commit(sa, manifest)
    assert not b.commit(sb, manifest)
    got = b.read()
    assert got is not None and [n for n, _ in got.files] == ["r0.so"]
    assert (a.path / "r0.so").read_bytes() == b"A"
    assert [p.name for p in tmp_path.iterdir()] == ["k" * 64]  # no staging left behind


def test_files_and_directory_are_synced_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("names synced files through /proc/self/fd")
    cache = open_cache(tmp_path)
    assert cache is not None
    entry = cache.entry("s" * 64)
    staging = entry.staging()
    (staging / "r0.so").write_bytes(b"library")
    events: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(a: Any, b: Any) -> None:
        events.append("rename")
        real_rename(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    assert entry.commit(staging, Manifest("forward", (), (), 1.0))
    before = events[: events.index("rename")]
    assert {"fsync r0.so", f"fsync {MANIFEST}", f"fsync {staging.name}"} <= set(before)
    assert events[-1] == f"fsync {tmp_path.name}"  # the rename itself, made durable


def test_every_link_and_directory_met_resolving_the_root_is_checked(tmp_path: Path) -> None:
    """The way to the root is checked as the kernel resolves it. A link of this user's
    leading to a link in a directory others may write (or to a link another user owns) was
    trusted: neither is on the path as written nor above the resolved root, yet whoever
    controls it could point the root elsewhere between the check and a library load."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    hops = tmp_path / "hops"
    hops.mkdir(mode=0o755)
    (hops / "hop").symlink_to(real)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "cache").symlink_to(Path("..") / "hops" / "hop")  # relative, then absolute
    assert cache_mod.root_status(home / "cache") == (None, True)
    hops.chmod(0o777)
    problem, _ = cache_mod.root_status(home / "cache")
    assert problem is not None and str(hops) in problem and "writable by" in problem
    hops.chmod(0o1777)  # sticky: others may not replace our link
    assert cache_mod.root_status(home / "cache") == (None, True)
    hops.chmod(0o755)
    if os.getuid() == 0:  # a link another user owns
        os.lchown(hops / "hop", 65534, 65534)
        problem, _ = cache_mod.root_status(home / "cache")
        assert problem is not None and "symbolic link owned by uid 65534" in problem
    (hops / "hop").unlink()
    (hops / "hop").symlink_to(hops / "hop")  # a loop is refused, not followed forever
    problem, _ = cache_mod.root_status(home / "cache")
    assert problem is not None


def test_cli_cache_an_entry_that_is_a_link_or_fifo_is_counted_and_removed_as_itself(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link named as an entry (to a directory of someone's files) and a FIFO so named:
    list counts their own size, not what a link leads to; clear removes them, never what
    the link leads to, and leaves nothing behind."""
    from ptexec.cli import main

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "big").write_bytes(b"\0" * (3 << 20))
    (root / ("a" * 64)).symlink_to(elsewhere)
    os.mkfifo(root / ("b" * 64))
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "2 entries, 0.00 MiB" in out and "2 damaged" in out
    assert main(["cache", "verify"]) == 1
    assert main(["cache", "clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert list(root.iterdir()) == []
    assert (elsewhere / "big").stat().st_size == 3 << 20


def test_cli_cache_clear_says_what_it_could_not_remove(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file clear may not remove (EPERM, as of another user's directory or an immutable
    file) is named, and the exit status is 1; everything else is removed."""
    from ptexec.cli import main

    entry = root / ("c" * 64)
    (entry / "sub").mkdir(parents=True)
    (entry / "sub" / "stuck").write_bytes(b"x")
    code = root / "code"
    code.mkdir()
    stuck = "5" * 64  # (the names the code store writes: only those are removed)
    (code / stuck).write_bytes(b"x")
    (code / ("6" * 64)).write_bytes(b"x")
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.path.basename(path) in ("stuck", stuck):
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    capsys.readouterr()
    assert main(["cache", "clear"]) == 1
    out = capsys.readouterr().out
    assert "2 file(s) not removed" in out and f"code/{stuck}" in out and "sub/stuck" in out
    left = sorted(p.name for p in root.rglob("*") if p.is_file())
    assert left == [stuck, "stuck"]


def test_leftovers_are_the_names_compiles_write_and_nothing_else(root: Path) -> None:
    """Housekeeping removes what a compile that died left by the exact names compiles
    give them (a staging directory: pid, host, the key's first 16 digits and
    ``mkdtemp``'s eight characters; an entry being removed: ``.trash-``, 16 digits of its
    key and 8 more); a file that only begins like one (``.trash-notes``) is no cache's,
    so a root holding one is not housekept at all."""
    host = cache_mod.host()
    entry = root / ("d" * 64)
    entry.mkdir()
    dead = root / f".staging-999999999-{host}-0123456789abcdef-ab_c9xyz"
    old = root / ".staging-12-0f0f0f0f-fedcba9876543210-q1w2e3r4"  # another host, a day old
    trash = root / ".trash-0123456789abcdef-89abcdef"
    for d in (dead, old, trash):
        d.mkdir()
        (d / "r0.so").write_bytes(b"half")
    os.utime(old, (1000, 1000))
    cache = cache_mod.Cache(root, writable=True)
    assert sorted(p.name for p in cache.leftovers()) == sorted(p.name for p in (dead, old, trash))
    assert cache.housekeep() == []
    assert sorted(os.listdir(root)) == [entry.name]

    notes = root / ".trash-notes"
    notes.write_text("kept")
    drafts = root / ".staging-drafts"
    drafts.mkdir()
    (drafts / "a.txt").write_text("kept")
    for p in (notes, drafts):
        os.utime(p, (1000, 1000))
    assert cache_mod.foreign_names(root) == [".staging-drafts", ".trash-notes"]
    assert cache.leftovers() == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.housekeep()
    assert notes.read_text() == "kept" and (drafts / "a.txt").read_text() == "kept"
    assert [str(w.message) for w in caught if ".staging-drafts" in str(w.message)]


def test_cli_cache_clear_removes_only_the_names_the_stores_write(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a cache's own root, ``code`` and ``native`` lose the files their stores write
    (a code object named by its digest, a writer's temporary file; a library, its digest,
    a build's staging directory) and keep any other, which the output names; nothing
    failed, so the status is 0."""
    from ptexec.cli import main

    key = "e" * 64
    code, native = root / "code", root / "native"
    for d in (code, native):
        d.mkdir(mode=0o700)
    ours = [code / key, code / ".tmp-ab_12xyz", native / f"{key}-lib.so", native / f"{key}.sha256"]
    staging = native / ".staging-999999999-0a0b0c0d-k3_9abcd"
    staging.mkdir()
    (staging / "lib.so").write_bytes(b"half")
    theirs = [code / "notes.txt", native / "README", native / f"{key}.txt"]
    for f in ours + theirs:
        f.write_bytes(b"x")
    capsys.readouterr()
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "2 file(s) of generated code" in out and "1 native librar(ies)" in out
    assert not any(os.path.lexists(p) for p in [*ours, staging])
    assert all(f.read_bytes() == b"x" for f in theirs)
    assert "3 file(s) kept" in out
    assert all(str(f.relative_to(root)) in out for f in theirs)
