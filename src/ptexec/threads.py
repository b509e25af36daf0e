"""One thread setting for the process: ATen's intra-op threads and ExecuTorch's thread pool.

ptexec's kernels are ATen's, which use torch's intra-op threads. XNNPACK delegates run
under ``xnnpack="auto"`` (or ``"executorch"``) by ExecuTorch's XNNPACK backend, which uses
ExecuTorch's process-wide pthreadpool. :func:`set_num_threads` sets both, so one number
says how many threads a call may use.

ExecuTorch's pool is replaced, not resized: ``_unsafe_reset_threadpool(n)`` destroys the
pool and creates another, and every XNNPACK runtime made before keeps the address of the
destroyed one (a later call hangs, aborts or runs on freed memory). ptexec's runners
therefore check, before each call, that the pool they were loaded with is still the
current one (its address and size, :class:`ExecuTorchPool`), and load their payload again
when it is not; whoever resets the pool (ptexec, ExecuTorch's own ``portable_lib``, a
benchmark script), ptexec's methods keep working. The check cannot cover a reset made
while a call is running on another thread: change the setting between calls.

A compiled method (``compile=True``) runs its compiled regions on the count set when it
was loaded: AOTInductor's CPU code is made for one count (the cache keeps an entry per
count), so load it again after a change. A method whose every CPU region calls delegates
is the exception: its kernels run serially beside XNNPACK's pool, and its code (one cache
entry) serves every count.

torch's count is kept per OS thread (OpenMP's): ``torch.set_num_threads`` sets the calling
thread's, and a thread takes the process's count only when it first runs a kernel. A thread
that ran kernels before :func:`set_num_threads` would keep its old count, so a method's call
gives its calling thread the setting first where that thread has not had it yet
(:func:`follow`; a thread-local read a call, once a setting was made while other threads
lived: :data:`WATCH`), and so does a compiled load (its code is made for the loading
thread's count, which its cache key names).

The setting is process-wide (torch's threads and ExecuTorch's pool are both), so there is
no per-method thread count: a method that set its own around each call would change the
threads of every other method running meanwhile, and would replace ExecuTorch's pool (and
reload every XNNPACK payload) on each call.

A child of ``os.fork`` (``multiprocessing``'s fork start, a preloading server's workers)
inherits no running threads: torch's OpenMP threads do not come back, and a child forked
after kernels ran on more than one thread waits for ever in its first parallel kernel, as
eager PyTorch's does. Call ``set_num_threads(1)`` in the child before its first call (or
fork before the first multi-threaded call); ExecuTorch's pool makes its threads again.

ExecuTorch's pool is changed only by an explicit :func:`set_num_threads`, at once
(importing ExecuTorch's runtime if it is installed and not yet imported): while nobody
asked, ptexec leaves it as ExecuTorch made it, because replacing it also breaks the
XNNPACK methods loaded by ExecuTorch's own runtime, which nobody checks.
"""

from __future__ import annotations

import ctypes
import importlib
import operator
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = [
    "APPLIED",
    "SETTING",
    "WATCH",
    "ExecuTorchPool",
    "executorch_pool",
    "follow",
    "follow_setting",
    "get_num_threads",
    "set_num_threads",
]

# ExecuTorch's pybindings: the extension module whose presence says its runtime is loaded
PYBINDINGS = "executorch.extension.pybindings._C"
# the library that owns the pool, and its (C++) accessor of the current pthreadpool_t
_LIBRARY = "libexecutorch_threadpool.so"
_CURRENT = "_ZN10executorch9extension10threadpool15get_pthreadpoolEv"
_SIZE = "pthreadpool_get_threads_count"

_LOCK = threading.Lock()


SETTING: list[tuple[int] | None] = [None]
"""The last :func:`set_num_threads`, as a new object each time (None before any): a thread
whose :data:`APPLIED` setting is not this object has not had it."""

WATCH = [False]
"""Whether a :func:`set_num_threads` was made while other threads lived (one of them may
have run kernels at the count before): only then do calls check their thread's setting.
A thread started later takes torch's process-wide count (the setting) at its first kernel.
Cheaper than the thread-local read for every call of a process that sets its count before
starting threads (the command line, the server)."""

APPLIED = threading.local()
"""Per thread, ``setting``: the :data:`SETTING` object its torch count was last given (no
such attribute before :func:`follow` ran on it; a plain ``threading.local`` reads faster
than one with a class default, and a method's call reads it)."""


def _count(n: Any, what: str) -> int:
    """``n`` as a thread count: an int of 1 or more (a bool is not a count)."""
    if isinstance(n, bool):
        raise TypeError(f"{what}: the thread count must be an int, got {n!r}")
    try:
        value = operator.index(n)
    except TypeError:
        raise TypeError(
            f"{what}: the thread count must be an int, got {type(n).__name__}"
        ) from None
    if not 1 <= value <= MAX_THREADS:
        raise ValueError(f"{what}: the thread count must be 1 to {MAX_THREADS}, got {value}")
    return value


MAX_THREADS = 4096
"""The most threads :func:`set_num_threads` takes: more than any machine's cores, far below
what makes torch's and ExecuTorch's pools fail to start (2**31 - 1 takes torch's OpenMP
down at its next kernel, and leaves ExecuTorch's pool with none)."""


class ExecuTorchPool:
    """ExecuTorch's process-wide thread pool, seen through the runtime library its
    pybindings loaded (nothing is loaded here: the library must already be mapped).

    ``current()`` is the address of the pool now in use and ``size(address)`` its thread
    count (only for that current address: an older one may be freed). A runner loaded with
    pool ``(a, n)`` is valid while ``current() == a and size(a) == n``; an address can come
    back for a new pool, then with its own size, which XNNPACK's reshaped operators may
    depend on. Where the library does not export these, ``current`` returns a count of
    ptexec's own resets (``size`` 0), so only those are seen (``exact`` is False).

    ``key()`` returns the same tuple object while the pool stays, so a runner can tell
    the pool it loaded with from the one a method call found by identity. ``checked`` is
    a cell holding the key a method call found as it started, while that call runs
    (None otherwise): a method running several runners checks the pool once, and each
    runner whose key is that object skips its own check. A kernel cannot replace the
    pool, and a reset made while a call runs is not covered anyway (module docstring)."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module
        self._resets = 0
        self._key: tuple[int | None, int] = (None, -1)
        self._pointer: Any = None  # the key's address, as the size accessor takes it
        self.checked: list[tuple[int | None, int] | None] = [None]
        found = _accessors()
        self.exact = found is not None
        if found is not None:
            self.current, self.size = found
        else:
            self.current = self._generation
            self.size = _no_size

    def _generation(self) -> int:
        return self._resets

    def key(self) -> tuple[int | None, int]:
        """The pool now in use, as a runner records it when it loads: the same object
        as the last call returned while the pool is the same."""
        address = self.current()
        key = self._key
        # the kept address as ctypes' pointer object: no conversion per call
        if key[0] == address and self.size(self._pointer) == key[1]:
            return key
        size = self.size(address)
        key = self._key = (address, size)
        self._pointer = ctypes.c_void_p(address) if self.exact else address
        return key

    def threads(self) -> int:
        """How many threads the pool has (ExecuTorch's count)."""
        return int(self._module._threadpool_get_thread_count())

    def resize(self, n: int) -> None:
        """Give the pool ``n`` threads (ExecuTorch replaces it when the count changes)."""
        if n != self.threads():
            self.checked[0] = None
            self._module._unsafe_reset_threadpool(n)
            self._resets += 1


def _no_size(address: object) -> int:
    return 0


def _accessors() -> tuple[Callable[[], int | None], Callable[[int | None], int]] | None:
    """The library's accessors of the current pool and its size, if it is mapped and
    exports them."""
    try:
        # RTLD_NOLOAD: only a library already in the process (its pybindings loaded it).
        # PyDLL: the calls keep the GIL (two loads and a return, on every delegate call:
        # releasing and taking the GIL back would cost more than the check itself)
        lib = ctypes.PyDLL(_LIBRARY, mode=os.RTLD_NOLOAD)
        current: Any = getattr(lib, _CURRENT)
        size: Any = getattr(lib, _SIZE)
    except (OSError, AttributeError):
        return None
    current.argtypes = []
    current.restype = ctypes.c_void_p
    size.argtypes = [ctypes.c_void_p]
    size.restype = ctypes.c_size_t
    return current, size


_POOL: list[ExecuTorchPool | None] = [None]


def executorch_pool(module: ModuleType | None = None, load: bool = False) -> ExecuTorchPool | None:
    """ExecuTorch's pool, once its runtime is imported (``module``: its pybindings, when
    the caller has just imported them; ``load``: import them if they are installed);
    None while it is not."""
    pool = _POOL[0]
    if pool is not None:
        return pool
    if module is None:
        module = sys.modules.get(PYBINDINGS)
    if module is None and load:
        try:
            module = importlib.import_module(PYBINDINGS)
        except ImportError:
            return None
    if module is None:
        return None
    with _LOCK:
        if _POOL[0] is None:
            _POOL[0] = ExecuTorchPool(module)
        return _POOL[0]


def set_num_threads(n: int) -> None:
    """Run kernels on ``n`` threads (1 or more): torch's intra-op threads and, where
    ExecuTorch is installed, ExecuTorch's thread pool, which XNNPACK delegates use. Call
    it between calls: ptexec's methods load their XNNPACK payloads again for the new pool
    at their next call. A changed count replaces ExecuTorch's pool, and XNNPACK methods
    loaded by ExecuTorch's own runtime before keep the destroyed one (their next call may
    crash the process): set the count before loading those."""
    count = _count(n, "set_num_threads")
    import torch

    pool = executorch_pool(load=True)
    with _LOCK:
        torch.set_num_threads(count)
        if pool is not None:
            pool.resize(count)
        setting = SETTING[0] = (count,)
        APPLIED.setting = setting
        if not WATCH[0]:
            # Python threads, and any thread running Python code now (one not started by
            # ``threading``)
            WATCH[0] = threading.active_count() > 1 or len(sys._current_frames()) > 1


def follow() -> None:
    """Give the calling thread's torch the count of the last :func:`set_num_threads`, if
    any (torch's count is per thread: one that ran kernels before keeps its own). A
    method's call does so where the thread has not had the current setting yet."""
    with _LOCK:  # not between another thread's setting and its record
        setting = SETTING[0]
        if setting is not None:
            import torch

            torch.set_num_threads(setting[0])
        APPLIED.setting = setting


def follow_setting() -> None:
    """:func:`follow`, unless the calling thread has the current setting already (or no
    thread can lack it: :data:`WATCH`)."""
    if WATCH[0] and getattr(APPLIED, "setting", None) is not SETTING[0]:
        follow()


def get_num_threads() -> int:
    """How many threads kernels run on (torch's intra-op threads; ExecuTorch's pool has as
    many after :func:`set_num_threads`), on the calling thread, as its next call runs."""
    import torch

    follow_setting()
    return int(torch.get_num_threads())
