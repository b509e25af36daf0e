"""ptexec's own C++ library: runs of an interpreted method's instructions without Python
between them (the native steps), and the planned views of a values table made in one call.

A statement of the plain blocks costs, besides its kernel, torch's Python binding: the
arguments parsed, the autograd layer passed (about half a microsecond for a small op,
which on a tiny program is most of its time). Most of a method's statements are one call
of a torch operator whose tensors are the method's own (planned memory, constants: the
same objects on every call) and whose other arguments are fixed when the method is
loaded (:class:`~ptexec.kernels.registry.NativeCall`). For such statements next to each
other, the fast call (:mod:`.fastcall`) runs one object of a small C++ library
(``csrc/steps.cpp``) that holds each operator's handle and its whole argument stack,
found once, and calls the operators' boxed kernels one after the other below autograd,
with the GIL released: the kernels and arguments the Python statements would reach.

A step that fails, or raises a warning, stops the run: the fast call then raises its
error, or issues its warnings (through torch's own handler), on the instruction's own
line, exactly as the Python statement would; after a warning (the step ran) the rest of
the run is its Python statements. A step never runs again. Steps are statements that
write nothing but their outs, on the CPU.

The fast call checks its CPU tensor inputs (type, dtype, device, sizes, layout, the
planned memory kept apart) in one call of the library's ``Guard``, where the generated
Python would spend about 0.4 us an input, and copies its dense planned inputs into their
views in one call of its ``Puts`` (large ones without the GIL).

A repeated load of a plan makes its planned tensors (views of its CPU buffers, their
geometry recorded by the first load: :mod:`ptexec.loader.values`) with the library's
``Views``: the tensors the Python replay makes, in about a quarter of its time.

**Build and trust.** The library is compiled once per key (a digest of its source, the
compiler's file, and the versions of torch and Python) and kept in the cache root under
its trust rules (:mod:`ptexec.libstore`: a trusted directory, the library's SHA-256
checked before it is loaded). Where no trusted root can be used, it is built in a
private temporary directory for this process. Compiling takes about 15 seconds on two
cores. A load never waits for it: the first method loaded starts the build in a
background thread, and methods loaded once it is done (in this process, or in any later
one, from the cache) use it; a process ending first stops the compiler.
``PTEXEC_NATIVE_STEPS=0`` turns it off; any failure (no compiler, no Python headers)
leaves the Python statements, and :func:`unavailable` says why.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import types
from pathlib import Path
from typing import Any

import torch

from .libstore import discard, kept, release

__all__ = ["copies", "enabled", "module", "unavailable", "wait"]

_SOURCE = "steps.cpp"
_NAME = "ptexec_steps"  # the extension module's name (its PyInit_ function)
_LIBRARY = f"{_NAME}.so"
_LAYOUT = "native-steps-1"

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}  # "module", or "why" there is none; "thread": the build
_COMPILERS: set[subprocess.Popen[str]] = set()  # running: stopped when the process ends


def enabled() -> bool:
    """Whether methods loaded now may use the library (``PTEXEC_NATIVE_STEPS`` is not 0)."""
    return os.environ.get("PTEXEC_NATIVE_STEPS", "1") != "0"


def _source() -> Path:
    return Path(__file__).resolve().parent / "csrc" / _SOURCE


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or None


def _run(cmd: list[str]) -> str:
    """Run ``cmd`` in a process group of its own (stopped, with every process it started,
    if this process ends first); its stdout. ``RuntimeError`` when it fails."""
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as e:
        raise RuntimeError(f"{cmd[0]} does not run ({e})") from None
    _COMPILERS.add(proc)
    try:
        out, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        _stop(proc)
        proc.communicate()
        raise RuntimeError(f"{cmd[0]} ran for more than 900 s") from None
    finally:
        _COMPILERS.discard(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {err.strip()[-2000:]}")
    return out


def _stop(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the compiler it runs


@atexit.register
def _stop_compilers() -> None:
    for proc in list(_COMPILERS):
        _stop(proc)


def _forked() -> None:
    """In a child of a fork: the parent's build is not the child's."""
    global _LOCK
    _LOCK = threading.Lock()
    _COMPILERS.clear()
    if "module" not in _STATE:
        _STATE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _key(compiler: str) -> str:
    """What the library depends on, digested: the compiler is told by its file (its
    resolved path, size and modification time: found without running it)."""
    binary = Path(shutil.which(compiler) or compiler).resolve()
    try:
        facts = binary.stat()
    except OSError as e:
        raise RuntimeError(f"the C++ compiler {compiler} cannot be read ({e})") from None
    h = hashlib.sha256()
    for part in (
        _LAYOUT,
        torch.__version__,
        str(torch.version.git_version),
        compiler,
        str(torch._C._GLIBCXX_USE_CXX11_ABI),
        sys.version,
        str(sysconfig.get_config_var("EXT_SUFFIX")),
        platform.machine(),
        f"{binary} {facts.st_size} {facts.st_mtime_ns}",
    ):
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    h.update(_source().read_bytes())
    return h.hexdigest()


def _build(directory: Path, compiler: str) -> None:
    from torch.utils.cpp_extension import include_paths

    torch_lib = Path(torch.__file__).resolve().parent / "lib"
    _run(
        [
            compiler,
            "-O2",
            "-fPIC",
            "-std=c++17",
            "-w",
            "-shared",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-I{p}" for p in include_paths()),
            f"-I{sysconfig.get_paths()['include']}",
            str(_source()),
            "-o",
            str(directory / _LIBRARY),
            f"-L{torch_lib}",
            "-ltorch_python",
            "-ltorch",
            "-ltorch_cpu",
            "-lc10",
        ]
    )


def _find(build: bool) -> Path | None:
    """The verified library's path, from the compile cache, or built now when ``build``
    (else None when it is not there). ``RuntimeError`` says why it cannot be built."""
    if not sys.platform.startswith("linux"):
        raise RuntimeError("the native steps are built on Linux only")
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ or c++ on PATH, or CXX)")
    how = (lambda d: _build(d, compiler)) if build else None
    return kept(_LIBRARY, _key(compiler), how)


def _import(path: Path) -> types.ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(_NAME, str(path))
    spec = importlib.util.spec_from_file_location(_NAME, str(path), loader=loader)
    if spec is None:
        raise ImportError(f"{path} is not an extension module")
    found = importlib.util.module_from_spec(spec)
    loader.exec_module(found)
    return found


def _load(build: bool) -> bool:
    """Find (or build) the library and import it; False when it is not built yet (or
    the one kept does not import: it is dropped, to be built again)."""
    try:
        path = _find(build)
        if path is None:
            return False
        try:
            found = _import(path)
        except (ImportError, OSError):
            if build:
                raise
            discard(path)  # (another glibc, say): the build makes it again
            return False
        finally:
            release(path)
    except Exception as e:  # no problem here may fail a load
        _STATE["why"] = f"the native steps could not be built or loaded: {e}"
        return True
    _STATE["module"] = found
    return True


def module() -> types.ModuleType | None:
    """The library, when it is loaded (found in the cache, it is loaded now); else None,
    and its build is started in the background (once per process) unless it is turned
    off or has failed."""
    if not enabled():
        return None
    found: types.ModuleType | None = _STATE.get("module")
    if found is not None:
        return found
    with _LOCK:
        if "tried" not in _STATE:
            _STATE["tried"] = True
            if not _load(build=False):
                thread = threading.Thread(
                    target=_load, args=(True,), name="ptexec-native-steps", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError as e:  # no thread to be had
                    _STATE["why"] = f"the native steps could not be built: {e}"
                else:
                    _STATE["thread"] = thread
    found = _STATE.get("module")
    return found


def copies() -> Any:
    """The library's ``copies(tensors)``: new tensors as ``Tensor.clone()`` makes them (a
    dense CPU tensor copied as bytes), in one call; None without the library."""
    found = module()
    return None if found is None else found.copies


def wait(timeout: float | None = None) -> types.ModuleType | None:
    """The library, waiting up to ``timeout`` seconds (None: until done) for its build
    (started now if it was not): for a process that wants the methods it loads next to
    use it from their first call. None when it cannot be used (:func:`unavailable`)."""
    module()
    thread = _STATE.get("thread")
    if thread is not None:
        thread.join(timeout)
    found: types.ModuleType | None = _STATE.get("module")
    return found


def unavailable() -> str | None:
    """Why the methods loaded now do not use the library (None: they do)."""
    if not enabled():
        return "PTEXEC_NATIVE_STEPS=0"
    if module() is not None:
        return None
    why: str = _STATE.get("why", "the native steps are being built")
    return why
