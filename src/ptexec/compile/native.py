"""Delegate calls of compiled code run by ExecuTorch's runtime without entering Python.

Compiled code calls an XNNPACK delegate it keeps opaque through ``ptexec::external_call``
(:mod:`.external`). Its Python implementation costs, per call, the proxy executor's way
into Python, the call's own Python and the pybindings' ``execute``: several microseconds
before XNNPACK starts, dozens of times per decode step of an LLM. This module builds a
small C++ library (``csrc/``) with a CPU kernel of that op: it finds the call in the table
of the method whose compiled code is running on this thread and hands the tensors as they
are (no copies: a tensor not dense in its dim order is copied first, as the Python path
does) to ExecuTorch's backend of the call's one-delegate program, loaded by ExecuTorch's
C++ runtime from the same bytes the Python path loads. The backend's ``init`` and
``execute`` are called directly, with what ExecuTorch's ``Method`` would give them (the
program's named data, the payload, its compile specs, a runtime allocator of the call's
own), not through a ``Method``: one per call would cost its bookkeeping, and the cache
misses on it, two hundred times a decode step. So the call checks each tensor against the
delegate's argument as ``Method.set_input`` would (dtype, rank, dim order, sizes within
the bound). A tensor whose memory and sizes are those of the last call is not handed over
again (a decode step's calls mostly hand over nothing), and a dynamic output's view is
made anew only when its shape changes. Between two calls XNNPACK's work pushes the next
call's data out of the CPU's caches, so each call learns which call followed it last time
on its thread and, as it ends, prefetches what that one reads first (its record, the
delegate's arguments, the tensors it got last time). A call the table does not hold goes
to the Python implementation (``ptexec::external_call_python``), so a method without the
library, or a call the library could not load, computes the same.

**The C entry.** AOTInductor's code calls an op it has no C function for through its
proxy executor: the arguments boxed onto a stack, torch's dispatcher, the boxed kernel
unboxing them, the outputs boxed back (about 0.4 us a call, a sixth of a tiny 8da4w
Llama's decode step of 23 calls). The library also exports the op's C entry
(``aoti_torch_cpu_external_call``, the name AOTInductor gives it, :data:`.aoti.NATIVE_ENTRY`),
and where it is loaded the CPU code of a method with opaque calls is compiled to call it
directly (:meth:`.runner.RegionBuilder.native_entry`, part of the cache key). For that
code to find it, the library is loaded into the process's global scope; it is built with
hidden symbols, so it exports its four C functions and instances of torch's templates
(the same code as torch's), never ExecuTorch's copy of c10.

ExecuTorch's headers carry a copy of c10 that cannot meet torch's in one translation unit,
so the library is two: ``et_calls.cpp`` (ExecuTorch's API, plain types out) and
``external_op.cpp`` (torch's kernel and classes). It links ExecuTorch's runtime library
by name, the one its pybindings loaded into this process, so it shares their backend
registry and thread pool; a delegate initialized with a pool ExecuTorch has since
replaced is initialized again before its next call, as the Python path loads its method
again. So is one whose call failed: XNNPACK's runtimes share one workspace, and a runtime
left with a failed reshape would fail the next call of any runtime that grows it, so a
failed execute destroys the delegate's runtime (as the Python path drops its method).

**Build and trust.** The library is compiled once per key (a digest of the sources, the
compiler and its version, and the versions of torch, ExecuTorch and Python) into the
compile cache (:mod:`.cache`): the same trusted directory, the same manifest with each
file's size and sha256, checked before the library is loaded. Where the cache cannot be
used, it is built in a private temporary directory for this process. Compiling takes
about 15 seconds on two cores, once; a method whose compiled code has opaque calls asks
for it when it is compiled (so a background compile builds it in its child) and when it
is loaded. ``PTEXEC_NATIVE_CALLS=0`` turns it off. Any failure (no compiler, no
ExecuTorch headers, a load error) leaves the Python path, and :func:`unavailable` says
why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ..format.program import STATIC
from ..readonly import from_buffer
from .external import ExternalCall, attach_native_use
from .manifest import Manifest

__all__ = [
    "NativeCalls",
    "call",
    "enabled",
    "entry_runs",
    "find_or_build",
    "library",
    "runs",
    "table",
    "unavailable",
]

_SOURCES = ("et_calls.h", "et_calls.cpp", "external_op.cpp")
_LIBRARY = "libptexec_native.so"
_LAYOUT = "native-calls-2"

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}  # "path": the loaded library, or "why": why there is none
_PRIVATE: set[Path] = set()  # directories of libraries built for this process alone


def _forked() -> None:
    """In a child of a fork: a build another thread of the parent was running, holding
    the lock, never ends here (the child's next compiled load waited for it for ever);
    this process finds or builds the library itself."""
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _csrc() -> Path:
    return Path(__file__).resolve().parent / "csrc"


def _executorch_root() -> Path | str:
    """ExecuTorch's package directory (headers and runtime library), or why not."""
    from ..delegates.xnnpack.executorch_runner import executorch_unavailable, pybindings_module

    why = executorch_unavailable()
    if why is not None:
        return why
    module = pybindings_module()
    root = Path(module.__file__ or "").resolve().parents[2]
    for need in (root / "include" / "executorch", root / "lib" / "libexecutorch.so"):
        if not need.exists():
            return f"ExecuTorch's package has no {need.name} to build against"
    return root


def _compiler() -> str | None:
    found = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    return found or None


def _version(compiler: str) -> str:
    try:
        done = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"the C++ compiler {compiler} does not run ({e})") from None
    return done.stdout


def _key(compiler: str, et_root: Path) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        et_version = version("executorch")
    except PackageNotFoundError:
        et_version = "unknown"
    h = hashlib.sha256()
    for part in (
        _LAYOUT,
        torch.__version__,
        str(torch._C._GLIBCXX_USE_CXX11_ABI),
        et_version,
        str((et_root / "lib" / "libexecutorch.so").stat().st_size),
        sys.version,
        platform.machine(),
        compiler,
        _version(compiler),
    ):
        h.update(part.encode() + b"\0")
    for name in _SOURCES:
        h.update((_csrc() / name).read_bytes())
    return h.hexdigest()


def _build(directory: Path, compiler: str, et_root: Path) -> None:
    """Compile the two translation units in parallel and link them into ``directory``."""
    from torch.utils.cpp_extension import include_paths

    torch_lib = Path(torch.__file__).resolve().parent / "lib"
    # hidden symbols: the library is loaded into the process's global scope (for compiled
    # code to find its C entry), where ExecuTorch's copy of c10 must not meet torch's
    common = [
        "-O2",
        "-fPIC",
        "-std=c++17",
        "-w",
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
    ]
    et_flags = [
        "-DC10_USING_CUSTOM_GENERATED_MACROS",
        "-DET_EVENT_TRACER_ENABLED",
        f"-I{et_root / 'include'}",
        f"-I{et_root / 'include' / 'executorch' / 'runtime' / 'core' / 'portable_type' / 'c10'}",
    ]
    torch_flags = [
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{p}" for p in include_paths()),
    ]
    src = _csrc()
    jobs = [
        [
            compiler,
            *common,
            *et_flags,
            "-c",
            str(src / "et_calls.cpp"),
            "-o",
            str(directory / "et_calls.o"),
        ],
        [
            compiler,
            *common,
            *torch_flags,
            "-c",
            str(src / "external_op.cpp"),
            "-o",
            str(directory / "external_op.o"),
        ],
    ]

    def run(cmd: list[str]) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:1])} failed: {done.stderr.strip()[-2000:]}")

    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(run, cmd) for cmd in jobs]:
            f.result()
    run(
        [
            compiler,
            "-shared",
            "-o",
            str(directory / _LIBRARY),
            str(directory / "et_calls.o"),
            str(directory / "external_op.o"),
            f"-L{et_root / 'lib'}",
            "-lexecutorch",
            "-lexecutorch_threadpool",
            f"-L{torch_lib}",
            "-ltorch",
            "-ltorch_cpu",
            "-lc10",
        ]
    )
    for name in ("et_calls.o", "external_op.o"):
        (directory / name).unlink()


def find_or_build() -> Path:
    """The verified library's path, from the compile cache or built now (module
    docstring); nothing is loaded. ``RuntimeError`` says why it cannot be built."""
    from .cache import cache_dir, open_cache

    if not sys.platform.startswith("linux"):
        raise RuntimeError("the native delegate calls are built on Linux only")
    et_root = _executorch_root()
    if isinstance(et_root, str):
        raise RuntimeError(et_root)
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ or c++ on PATH, or CXX)")
    key = _key(compiler, et_root)
    cache = open_cache(cache_dir())
    if cache is not None:
        entry = cache.entry(key)
        kept = entry.read()
        if kept is not None and any(name == _LIBRARY for name, _ in kept.files):
            entry.touch()
            return entry.path / _LIBRARY
        if kept is not None:  # intact and trusted, but not this build's (made by hand)
            entry.reject(f"it holds no {_LIBRARY}")
        if cache.writable:
            staging = entry.staging()
            try:
                start = time.monotonic()
                _build(staging, compiler, et_root)
                manifest = Manifest("native delegate calls", (), (), time.monotonic() - start)
            except BaseException:
                entry.discard(staging)
                raise
            entry.commit(staging, manifest)  # False: another process's entry, as good
            if entry.read() is not None:
                return entry.path / _LIBRARY
    private = Path(tempfile.mkdtemp(prefix="ptexec-native-"))  # 0700, this process's
    try:
        _build(private, compiler, et_root)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    _PRIVATE.add(private)
    return private / _LIBRARY


def _release(path: Path) -> None:
    """After ``path`` is loaded (or failed to): a library built for this process alone is
    removed from disk (the process keeps what it loaded)."""
    if path.parent in _PRIVATE:
        _PRIVATE.discard(path.parent)
        shutil.rmtree(path.parent, ignore_errors=True)


def enabled() -> bool:
    """Whether methods loaded now may use the library (``PTEXEC_NATIVE_CALLS`` is not 0)."""
    return os.environ.get("PTEXEC_NATIVE_CALLS", "1") != "0"


def library() -> Path | None:
    """The loaded library's path (built and loaded on first use), or None when it cannot
    be used here (:func:`unavailable` says why)."""
    if not enabled():
        return None
    with _LOCK:
        if "path" in _STATE or "why" in _STATE:
            return _STATE.get("path")
        try:
            path = find_or_build()
            try:
                loaded = ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL)
                torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]
            finally:
                _release(path)
            use = loaded.ptexec_native_use
            use.argtypes = [ctypes.c_int64]
            use.restype = ctypes.c_int64
            count = loaded.ptexec_native_runs
            count.argtypes = []
            count.restype = ctypes.c_int64
            entered = loaded.ptexec_native_entry_runs
            entered.argtypes = []
            entered.restype = ctypes.c_int64
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            _STATE["why"] = f"the native delegate calls could not be built or loaded: {e}"
            return None
        attach_native_use(use)
        _STATE["path"] = path
        _STATE["runs"] = count
        _STATE["entry_runs"] = entered
        return path


def unavailable() -> str | None:
    """Why compiled code's delegate calls go through Python here (None: they need not)."""
    if not enabled():
        return "PTEXEC_NATIVE_CALLS=0"
    library()
    return _STATE.get("why")


def runs() -> int:
    """How many delegate calls the library has run in this process (0 before it loads)."""
    count = _STATE.get("runs")
    return int(count()) if count is not None else 0


def entry_runs() -> int:
    """How many delegate calls compiled code made through the library's C entry in this
    process (:data:`.aoti.NATIVE_ENTRY`), whether the library or Python ran them."""
    count = _STATE.get("entry_runs")
    return int(count()) if count is not None else 0


class NativeCalls:
    """The native calls of one method's compiled code (a table its thread makes current
    while the code runs): ``address`` for :func:`.external.use`, 0 when empty."""

    def __init__(self, table: Any, count: int) -> None:
        self.table = table
        self.count = count
        self.address = int(table.address()) if count else 0


def table(calls: Iterable[ExternalCall]) -> NativeCalls | None:
    """The native counterparts of ``calls`` (those whose runner is ExecuTorch's and which
    ExecuTorch's C++ runtime loads), or None when the library cannot be used here."""
    calls = list(calls)
    if not calls or library() is None:
        return None
    made = torch.classes.ptexec_native.Table()
    count = 0
    for c in calls:
        program = c.program()
        if program is None:
            continue
        outs = c.output_memory()
        orders: list[list[int]] = [[] for _ in range(c.count)]
        for j, k in enumerate(c.inputs):
            orders[k] = list(c.orders[j])
        for o in c.outputs:
            orders[o.position] = list(o.dim_order)
        try:
            made_call = call(
                program,
                [o.position for o in c.outputs],
                [int(o.dynamic) for o in c.outputs],
                list(outs),
                orders,
            )
        except RuntimeError:
            continue  # this call stays on the Python path
        made.add(c.key, made_call)
        c.release_runner()  # one copy of the packed weights: the Python path reloads its own
        count += 1
    return NativeCalls(made, count)


def call(
    program: Any,
    writes: list[int],
    dynamic: list[int],
    outs: list[torch.Tensor],
    orders: list[list[int]],
) -> Any:
    """The native call of ``program`` (an ``EtProgram``: the one-delegate program, where
    its payload lies, its compile specs and tensors): ``writes`` the argument positions
    it writes, ``dynamic`` whether each output's shape is dynamic, ``outs`` their memory
    (at their bounds), ``orders`` each argument's dim order. Its ``run(inputs)`` returns
    the outputs. Raises RuntimeError where ExecuTorch refuses the program."""
    specs = program.compile_specs
    data = from_buffer(program.data)  # read only: ExecuTorch never writes it
    return torch.classes.ptexec_native.Call(
        data,
        writes,
        dynamic,
        outs,
        orders,
        list(program.spans[0]),
        [s.key for s in specs],
        [_bytes_tensor(s.value) for s in specs],
        [int(t.shape_dynamism == STATIC) for t in program.tensors],
    )


def _bytes_tensor(value: bytes) -> torch.Tensor:
    """``value`` as a uint8 tensor of its own memory (a compile spec's value)."""
    return torch.tensor(list(value), dtype=torch.uint8)
