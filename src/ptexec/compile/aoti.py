"""AOTInductor: exported region graphs to one package of compiled models, and back.

Each region becomes one model (``r0``, ``r1``, ...), compiled for the region's device: on
the CPU a shared library, loaded in place from the cache; on CUDA a model of the method's
package. A loaded model is called with a flat list of tensors and returns a flat list
(the runner's ``run``, which skips the pytree wrapping of ``torch._inductor``'s Python
wrapper).

:func:`find_compiler` looks for the C++ compiler AOTInductor will use (``CXX``, else
``g++``; ``clang++`` on macOS); without one nothing is compiled.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..cachedir import cache_dir, root_status, subdir_problem, trusted_subdir
from .cache import INDUCTOR_SUBDIR, foreign_names
from .external import external_call
from .quiet import quiet

__all__ = [
    "INDUCTOR_SUBDIR",
    "NATIVE_ENTRY",
    "clear_kernels",
    "compile_models",
    "find_compiler",
    "inductor_cache",
    "inductor_options",
    "kept_kernels",
    "load_model",
    "missing_compiler",
    "native_entry_supported",
    "save_models",
]


def find_compiler() -> str | None:
    """The path of the C++ compiler AOTInductor would run, or None when there is none."""
    name = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    return shutil.which(name)


def missing_compiler() -> str | None:
    """Why there is no C++ compiler to run, as a phrase; None when :func:`find_compiler`
    finds one."""
    if find_compiler() is not None:
        return None
    default = "clang++" if sys.platform == "darwin" else "g++"
    cxx = os.environ.get("CXX")
    if cxx:
        return (
            f"CXX is {cxx!r}, which names no C++ compiler that exists here (point CXX at "
            f"one, or unset it to use {default})"
        )
    return f"no C++ compiler found (install {default}, or set CXX to one)"


def inductor_options(
    device: torch.device, autotune: bool, native_entry: bool = False, serial: bool = False
) -> dict[str, Any]:
    """What AOTInductor is asked for. The method's constants are frozen into the code (the
    compiler folds work on them and packs weights for its kernels); on the CPU, with
    ``autotune``, a matrix product by a constant is a generated C++ kernel (its weights
    packed at compile time), ATen's only where no such kernel applies
    (:func:`_templates_first`). A float16 or bfloat16 intermediate is rounded to its dtype
    as the interpreter (and ExecuTorch) round it, not kept in float32 inside a fused
    kernel, so the compiled code computes the program's own arithmetic; a constant stays
    a tensor of its dtype, never a number inlined in the code. With
    ``native_entry`` (:mod:`.native`'s library is loaded), CPU code calls the delegate
    calls' op through its C entry (:data:`NATIVE_ENTRY`): the library must be loaded
    before the code is. ``serial`` (CPU code of a graph with delegate calls): the generated
    kernels run on the calling thread alone (:func:`runs_delegates`); else on torch's
    thread count of the compile, whatever count is set when they run."""
    options: dict[str, Any] = {
        "aot_inductor.package": True,
        "freezing": True,
        "autotune_num_choices_displayed": 0,
        "emulate_precision_casts": True,
        # a 0-d constant stays a tensor: inlined as a number, some lowerings take it for
        # a float (an integer ``div`` with rounding by ``tensor(3)`` truncated where it
        # should floor, and came back as floats where it should truncate)
        "always_keep_tensor_constants": True,
        # a dict of this compile's own: torch fills the one it is given in place (the
        # device, the CPU's instruction set), and the process's would keep that for the
        # host's later AOTInductor compiles
        "aot_inductor.metadata": {},
    }
    if autotune and device.type == "cpu":
        options["max_autotune"] = True
        options["max_autotune_gemm_backends"] = "CPP,ATEN"
    if native_entry and device.type == "cpu":
        options["aot_inductor.custom_ops_to_c_shims"] = {external_call: [NATIVE_ENTRY]}
    # C++ kernels run on one count, named in their code: left to Inductor, a count equal
    # to the machine's cores makes code that takes the count of each call, while its
    # reductions keep one partial result per thread of the compile's count (more threads
    # at a call write past them). The cache key holds the count (:mod:`.cache`).
    if serial and device.type == "cpu":
        options["cpp.threads"] = 1
    else:
        options["cpp.threads"] = torch.get_num_threads()
    return options


def runs_delegates(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` (or a graph it holds, a branch of a condition) calls a delegate
    (:data:`.external.external_call`). Such a graph's generated kernels are compiled to
    run on the calling thread alone: XNNPACK's own pool has the method's threads, and
    both sets of workers wait for work by spinning, so with OpenMP's workers beside
    XNNPACK's there are more busy threads than threads asked for. The kernels between a
    decode step's delegate calls are too small to gain from threads (the compiled SmolLM2
    8da4w decode step at 2 threads on 2 cores: 7.1 ms with OpenMP's workers, against
    4.6 ms at 1 thread)."""
    return any(
        node.target is external_call
        for module in gm.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
    )


# The C entry of ``ptexec::external_call`` in :mod:`.native`'s library (its "C shim": the
# name AOTInductor gives the op's entry on the CPU). Declared to the generated code, a
# call of the op is a direct call of it, not the proxy executor's boxed call through
# torch's dispatcher (on a tiny 8da4w Llama, 23 calls a decode step: 62 -> 52 us).
NATIVE_ENTRY = (
    "AOTITorchError aoti_torch_cpu_external_call("
    "const char* key, const AtenTensorHandle* inputs, int64_t count, ...)"
)
# torch releases whose generated calls of a C shim were checked to pass these arguments
# (a string as a C string, a list of tensors as an array and its length, one handle's
# address per output); with another, the op goes through the proxy executor
_ENTRY_TORCH = frozenset({(2, 13)})


def native_entry_supported() -> bool:
    """Whether this torch's AOTInductor calls :data:`NATIVE_ENTRY` as it is declared."""
    release = torch.__version__.split("+")[0].split(".")
    try:
        return (int(release[0]), int(release[1])) in _ENTRY_TORCH
    except (IndexError, ValueError):
        return False


def compile_models(
    exported: Mapping[str, Any],
    device: torch.device,
    autotune: bool = True,
    native_entry: bool = False,
    serial: bool = False,
) -> dict[str, list[Any]]:
    """AOTInductor's output files of every exported graph, by model name
    (:func:`inductor_options`); with ``serial``, or where a graph calls delegates
    (:func:`runs_delegates`), its CPU kernels run on the calling thread."""
    from torch._inductor import aot_compile
    from torch.fx.experimental import _config

    shape_config: Any = _config  # its patch() is made at import

    inductor_cache()
    _install_filter()
    files: dict[str, list[Any]] = {}
    for name, ep in exported.items():
        args, kwargs = ep.example_inputs
        # sizes are reasoned about as the graph was traced: a dynamic size may be 1
        with (
            quiet(),
            shape_config.patch(backed_size_oblivious=True),
            _templates_preferred(autotune and device.type == "cpu"),
        ):
            out = aot_compile(
                ep.module(check_guards=False),
                args,
                kwargs,
                options=inductor_options(
                    device, autotune, native_entry, serial or runs_delegates(ep.graph_module)
                ),
            )
        assert isinstance(out, list)
        files[name] = out
    return files


# where torch keeps compiled kernels, and what ptexec compiles with in its place when that
# is not trusted
_KERNEL_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
_inductor_lock = threading.Lock()
_private_inductor: list[Path] = []


def inductor_cache() -> Path:
    """The directory torch's compiler keeps kernels in while ptexec compiles, trusted as
    the cache root is (:mod:`ptexec.cachedir`: this user's or root's, not writable by group
    or others, nor anything on the way to it) and entered by no one else (mode 0700).
    Torch reads back and loads what it finds there (a kernel library already at a kernel's
    path is loaded, not built: the instruction-set probes of every compile are at the same
    paths for every graph), and its default, ``/tmp/torchinductor_<user>``, is a name
    anyone could create first; the directories and files it makes inside follow the
    process's umask (under 002, writable by the group), so only a directory no one else
    may enter keeps what it holds this user's, whatever umask made it (a process-wide
    umask is not changed here: other threads create files meanwhile). So
    ``TORCHINDUCTOR_CACHE_DIR`` (or that default) and ``TRITON_CACHE_DIR`` are used only
    when so; one that is not is replaced, for the rest of the process, by ``inductor``
    under ptexec's cache root (else a private temporary directory), and what torch has
    loaded from it is forgotten."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    with _inductor_lock:
        chosen = Path(os.environ.get(_KERNEL_CACHES[0]) or default_cache_dir())
        if not _kernel_dir(chosen):
            chosen = _trusted_inductor_dir()
            os.environ[_KERNEL_CACHES[0]] = str(chosen)
            _forget_kernels()
        triton = os.environ.get(_KERNEL_CACHES[1])
        if triton and not _kernel_dir(Path(triton)):
            os.environ[_KERNEL_CACHES[1]] = str(chosen / "triton")
            _forget_kernels()
        return chosen


def _writable_trusted(directory: Path) -> bool:
    """Whether ``directory`` (made when missing) is trusted and this user writes it."""
    problem, writable = root_status(directory, create=True)
    return problem is None and writable


def _kernel_dir(directory: Path) -> bool:
    """Whether torch may keep kernels in ``directory`` (made when missing): trusted, this
    user's to write, and no one else's to enter (:func:`inductor_cache`)."""
    if not _writable_trusted(directory):
        return False
    if not hasattr(os, "getuid"):  # no POSIX modes: the per-user directory's permissions
        return True
    try:
        return os.stat(directory).st_mode & 0o077 == 0
    except OSError:
        return False


def _trusted_inductor_dir() -> Path:
    """``inductor`` under ptexec's cache root, mode 0700, when that root is trusted and
    this user's to write; else a private temporary directory of this process. One others
    could enter (made by an earlier ptexec with the access a readable root gives its
    entries) is emptied and made again, what it holds may be theirs; but only in a root
    that holds nothing a cache does not (:func:`~ptexec.compile.cache.foreign_names`): a
    project's folder named as the root keeps its own ``inductor`` folder as it is."""
    try:
        root: Path | None = cache_dir()
    except (RuntimeError, KeyError, OSError):  # no home directory to put it in
        root = None
    if root is not None and _writable_trusted(root):
        with contextlib.suppress(OSError):  # (made no one else's to enter: torch's umask)
            os.mkdir(root / INDUCTOR_SUBDIR, 0o700)
        found = trusted_subdir(root, INDUCTOR_SUBDIR, writable=True, create=False)
        if found is not None and not _kernel_dir(found) and _only_a_cache(root):
            shutil.rmtree(found, ignore_errors=True)  # (removes links, never what they lead to)
            with contextlib.suppress(OSError):
                os.mkdir(found, 0o700)
            found = trusted_subdir(root, INDUCTOR_SUBDIR, writable=True, create=False)
        if found is not None and _kernel_dir(found):
            return found
    if not _private_inductor or not _kernel_dir(_private_inductor[0]):
        # (one removed meanwhile may have been made again by anyone: a new one then)
        private = Path(tempfile.mkdtemp(prefix="ptexec-inductor-"))  # 0700, this process's
        atexit.register(_remove_private, private, os.getpid())
        _private_inductor[:] = [private]
    return _private_inductor[0]


def _remove_private(path: Path, owner: int) -> None:
    """At the end of process ``owner``, its private kernel directory; a child forked from
    it ends leaving the directory to the parent, which compiles on into it."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


def _only_a_cache(root: Path) -> bool:
    """Whether ``root`` holds nothing a cache does not (so its ``inductor`` is the
    cache's); False when it cannot be listed."""
    try:
        return not foreign_names(root)
    except OSError:
        return False


def kept_kernels(root: Path) -> tuple[int, int]:
    """``(files, bytes)`` of torch's kernels under ``root``'s ``inductor`` directory (made
    where torch's own kernel cache was not trusted: :func:`inductor_cache`); links are
    counted as themselves, never followed."""
    found = trusted_subdir(root, INDUCTOR_SUBDIR, writable=False, create=False)
    files = size = 0
    if found is None:
        return 0, 0
    for top, _, names in os.walk(found):
        for name in names:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(top, name)).st_size
                files += 1
    return files, size


def kernels_problem(root: Path) -> str | None:
    """Why ``root``'s ``inductor`` directory is never given to torch (a link, writable by
    others: :func:`inductor_cache` uses a private directory instead), or None."""
    return subdir_problem(root, INDUCTOR_SUBDIR)


def clear_kernels(root: Path) -> int:
    """Remove ``root``'s ``inductor`` directory (:func:`kept_kernels`), trusted or not (a
    link itself, never what it leads to); how many files it held, when trusted."""
    directory = root / INDUCTOR_SUBDIR
    try:
        st = os.lstat(directory)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(OSError):
            os.unlink(directory)
        return 0
    files, _ = kept_kernels(root)
    shutil.rmtree(directory, ignore_errors=True)  # (removes links, never what they lead to)
    return files


def _forget_kernels() -> None:
    """Drop torch's in-process records of kernels found in the directory replaced."""
    from torch._inductor import utils

    clear = getattr(utils, "clear_caches", None)
    if clear is not None:
        clear()


_PREFER_TEMPLATES: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "prefer_templates", default=False
)
_installed = False


def _templates_first(choices: list[Any]) -> list[Any]:
    """The autotuner's choices for one matrix product, while :func:`compile_models` runs:
    the generated C++ kernels alone where there are any and the product's sizes are not
    all fixed. The autotuner times its choices at the traced sizes (a dynamic size at its
    bound: a whole prompt), where a library call may win; a decode step then multiplies
    one row, which the library runs as a general matrix-vector product, several times
    slower than the generated kernel made for these weights (measured on small LLMs: a
    quarter of a compiled decode step). Where every size of the product is fixed, the
    traced sizes are the only ones, so the autotuner's own choice stands (ATen's matrix
    product ran a 4-block transformer at 64 tokens 1.6x as fast as the generated kernels).
    Outside a compile, or with no generated kernel among them, the choices as they are."""
    if not _PREFER_TEMPLATES.get():
        return choices
    from torch._inductor.select_algorithm import ExternKernelCaller

    generated = [c for c in choices if not isinstance(c, ExternKernelCaller)]
    if not generated or _one_size(choices):
        return choices
    return generated


def _one_size(choices: list[Any]) -> bool:
    """Whether the product the autotuner chooses for has one size only: every size of its
    result a number (rows and columns: a product of two activations may vary in either)."""
    size = getattr(getattr(choices[0], "layout", None), "size", None)
    if not size or len(size) < 2:
        return False
    return all(isinstance(s, int) or bool(getattr(s, "is_number", False)) for s in size)


def _install_filter() -> None:
    """Put :func:`_templates_first` among the autotuner's choice filters, once (a torch
    without that hook keeps its own choice)."""
    global _installed
    if _installed:
        return
    from torch._inductor import select_algorithm

    add = getattr(select_algorithm, "add_preprocessing_fn", None)
    if add is not None:
        add(_templates_first)
    _installed = True


@contextlib.contextmanager
def _templates_preferred(prefer: bool) -> Iterator[None]:
    token = _PREFER_TEMPLATES.set(prefer)
    try:
        yield
    finally:
        _PREFER_TEMPLATES.reset(token)


def save_models(
    files: Mapping[str, list[Any]], devices: Mapping[str, torch.device], directory: Path
) -> dict[str, str]:
    """Keep compiled models in ``directory``; model name -> its file there. A CPU model is
    its shared library alone (loaded in place, no unpacking); CUDA models go into one
    package (their kernels' binaries travel with them)."""
    from torch._inductor.package import package_aoti  # type: ignore[attr-defined]

    out: dict[str, str] = {}
    packaged: dict[str, list[Any]] = {}
    for name, produced in files.items():
        if devices[name].type == "cpu":
            library = [f for f in produced if isinstance(f, str) and f.endswith(".so")]
            if len(library) != 1:
                raise RuntimeError(f"AOTInductor made {len(library)} libraries for {name}")
            shutil.copyfile(library[0], directory / f"{name}.so")
            # the calls of ops without a C shim, run through the proxy executor: the
            # runner reads them from the JSON file beside the library
            calls = library[0][: -len(".so")] + ".json"
            if os.path.isfile(calls):
                shutil.copyfile(calls, directory / f"{name}.json")
            out[name] = f"{name}.so"
        else:
            packaged[name] = produced
    if packaged:
        package_aoti(str(directory / PACKAGE), packaged)
        out.update({name: PACKAGE for name in packaged})
    return out


PACKAGE = "package.pt2"


def load_model(
    path: Path, name: str, device: torch.device
) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """Model ``name`` (a CPU model's library, or a model of a package) as a function of a
    flat list of tensors."""
    if path.suffix == ".so":
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(path), 1)
        cpu_run: Callable[[list[torch.Tensor]], list[torch.Tensor]] = runner.run
        return cpu_run
    index = device.index if device.type == "cuda" and device.index is not None else -1
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), name, True, 1, index)
    run: Callable[[list[torch.Tensor]], list[torch.Tensor]] = loader.run
    return run
