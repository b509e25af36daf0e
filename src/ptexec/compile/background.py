"""Compiling in the background: a method runs interpreted while another process compiles it.

``load_method(name, compile="background")`` (or ``CompileOptions(background=True)``)
returns a method that runs interpreted at once. Its regions are planned at load, as for
``compile=True``, and then:

- when the cache has their code already, it is loaded at once (the method starts
  compiled: no process is started);
- else a child Python process (``ptexec.compile.background_child``, started by
  ``subprocess``: a new interpreter, never a fork of this one, whose torch threads a fork
  would leave in an undefined state, and with nothing imported from the working
  directory: :func:`child_command`) loads the same program and method with the same load
  options and thread count (its files read as this process read them: into private
  memory unless they were mapped, so a file rewritten in place after the child's key
  check cannot reach the code), checks that its cache key is the parent's (a program file
  changed on disk since it was loaded is a failed compile, not a wrong one), compiles the
  regions and commits them to the cache (:mod:`.cache`: staged, synced, renamed);
- when it has finished, a thread of this process loads the entry as any cache hit does
  (the cache's trust checks, the manifest compared with the regions planned at load) and
  builds the compiled runner, then hands it to the method, which swaps its runner and fast
  call under the method's lock: a call runs entirely on the runner it started with; the
  next call runs compiled. Nothing is compiled in this process.

Methods of one process waiting for the same cache key (several sessions of one server)
share one child. The child runs at a lower priority (``nice`` 10), so the interpreted calls
keep the cores they need. A compile that fails (no C++ compiler, a compiler error, the
process dying, the cache refusing the entry) leaves the method interpreted and says why
once (a :class:`~.report.CompileWarning`, the status, the report). Dropping the method
(or the end of the process) ends the child's process group and reaps it; what it staged
in the cache is removed by the cache's own cleanup of dead compiles. :meth:`~BackgroundCompile.detach`
instead leaves the child to finish on its own (``ptexec generate``: the next run starts
compiled); a child whose parent dies without detaching it stops (it watches its stdin).
A process forked from this one owns none of its compiles: a job pending at the fork fails
there (its method runs interpreted), and neither its end nor its dropping the method ends
the parent's compile.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..device import Device
from .cache import Cache, CacheEntry
from .report import CompileReport, CompileWarning
from .runner import CompiledRunner, CompileOptions, RegionBuilder

if TYPE_CHECKING:
    from ..loader.state import MethodState
    from ..program import Program

__all__ = ["BackgroundCompile", "LoadRequest", "child_command", "start"]

PENDING = "pending"
COMPILED = "compiled"
FAILED = "failed"
_RESULT_LIMIT = 64 * 1024
_STDERR_TAIL = 2000
_KILL_WAIT_SECONDS = 5.0
FORKED = "the process was forked while its compile ran; the compile is the parent's"
NICE = 10  # the child's niceness

Install = Callable[[CompiledRunner], None]


@dataclass(frozen=True)
class LoadRequest:
    """How the method was loaded, for the child to load it the same way: the load
    options that decide what the method's instructions are."""

    method: str
    device_map: Any
    optimize: bool
    xnnpack: str
    max_planned_bytes: int
    max_instructions: int

    def load_options(self) -> dict[str, Any]:
        """As JSON: ``device_map`` as text (a device, or ``{from: to}``); a function or
        other map is :class:`ValueError` (a child cannot be given it)."""
        dm = self.device_map
        if dm is None or isinstance(dm, str):
            device_map: Any = dm
        elif isinstance(dm, Mapping):
            device_map = {str(k): str(v) for k, v in dm.items()}
        elif isinstance(dm, torch.device | Device):
            device_map = str(dm)
        else:
            raise ValueError(f"a device_map of type {type(dm).__name__} cannot be passed on")
        return {
            "device_map": device_map,
            "optimize": bool(self.optimize),
            "xnnpack": str(self.xnnpack),
            "max_planned_bytes": int(self.max_planned_bytes),
            "max_instructions": int(self.max_instructions),
        }


def _short(text: str, limit: int = 500) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------
# one child process, shared by the methods waiting for its key


def child_command() -> list[str]:
    """The command that starts a compile child. ``-m`` and ``-c`` put the working
    directory first on the module path (a downloaded model's folder may hold a
    ``torch.py``); the child's first statement takes it off, before anything is imported
    from there (Python imports nothing from it before the code runs)."""
    return [
        sys.executable,
        "-c",
        "import sys\n"
        "if sys.path and sys.path[0] == '':\n"
        "    del sys.path[0]\n"
        "import runpy\n"
        "runpy.run_module('ptexec.compile.background_child', run_name='__main__', "
        "alter_sys=True)\n",
    ]


class _Child:
    """The compile process of one cache key, and the thread waiting for it."""

    def __init__(self, key: str, cache: Cache, request: dict[str, Any], scratch: Path | None):
        self.key = key
        self.cache = cache
        self.scratch = scratch  # a private directory of program bytes written for the child
        self.waiters: list[BackgroundCompile] = []
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.ok = False
        self.reason = ""
        self.detached = False
        self.cancelled = False
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the waiting thread)
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parent.parent.parent)  # the ptexec the child runs
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            child_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            start_new_session=True,  # its compiler processes end with it (a process group)
            close_fds=True,
        )
        self.pid = self.proc.pid
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()  # kept open: the child stops when it closes
        self.thread = threading.Thread(
            target=self._wait, name=f"ptexec-compile-{self.pid}", daemon=True
        )
        self.thread.start()

    def _wait(self) -> None:
        assert self.proc.stdout is not None
        try:
            out = self.proc.stdout.read(_RESULT_LIMIT)
            code = self.proc.wait()
        except Exception as e:  # the pipe broke under us: the child is ended below
            out, code = b"", -1
            self.reason = f"the compile process could not be read ({e})"
        self.ok, reason = self._result(out, code)
        self.reason = self.reason or reason
        self._cleanup()
        _forget(self)
        with self.lock:
            waiters = list(self.waiters)
            self.finished.set()
        for w in waiters:
            w.child_finished(self)

    def _result(self, out: bytes, code: int) -> tuple[bool, str]:
        if self.cancelled:
            return False, "cancelled"
        try:
            data = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
            ok, reason = data["ok"], data["reason"]
            if type(ok) is bool and isinstance(reason, str):
                return ok, _short(reason)
        except (ValueError, IndexError, KeyError, TypeError):
            pass
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - _STDERR_TAIL))
        tail = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        last = tail[-1] if tail else "no output"
        return False, _short(f"the compile process exited with status {code}: {last}")

    def _cleanup(self) -> None:
        with contextlib.suppress(OSError):
            self._stderr.close()
        for pipe in (self.proc.stdin, self.proc.stdout):  # both ours, the result read
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if self.scratch is not None:
            import shutil

            shutil.rmtree(self.scratch, ignore_errors=True)
        self.cache.remove_leftovers()  # what a child that died had staged

    def add(self, waiter: BackgroundCompile) -> None:
        """``waiter`` is told when the child finishes (at once if it has)."""
        with self.lock:
            done = self.finished.is_set()
            if not done:
                self.waiters.append(waiter)
        if done:
            waiter.child_finished(self)

    def remove(self, waiter: BackgroundCompile) -> None:
        """``waiter`` no longer waits; the last one to go ends the child (unless it was
        detached)."""
        with self.lock:
            if waiter in self.waiters:
                self.waiters.remove(waiter)
            last = not self.waiters and not self.detached
        if last and not self.finished.is_set():
            self.cancel()

    def cancel(self) -> None:
        """End the child's process group and reap it (the waiting thread does)."""
        self.cancelled = True
        _signal_group(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(_KILL_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc, signal.SIGKILL)
            self.proc.wait()
        _signal_group(self.proc, signal.SIGKILL)  # its compiler processes, if any are left
        if threading.current_thread() is not self.thread:
            self.thread.join(_KILL_WAIT_SECONDS)

    def detach(self) -> None:
        """Let the child finish on its own after this process ends."""
        with self.lock:
            self.detached = True
        if self.proc.stdin is not None and not self.finished.is_set():
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.write(b"detach\n")
                self.proc.stdin.flush()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, sig)  # the child leads its own group (start_new_session)


# the running children, by the cache they compile into and the key: a child compiling
# into another cache root (PTEXEC_CACHE_DIR changed in between) serves no job of this one
_children: dict[tuple[str, str], _Child] = {}
_children_lock = threading.Lock()


# every job of this process (a fork's child orphans the pending ones: :func:`_forked`)
_jobs: weakref.WeakSet[BackgroundCompile] = weakref.WeakSet()


def _forked() -> None:
    """In a child of a fork: no compile process is this one's to join, wait for or end."""
    global _children_lock
    _children_lock = threading.Lock()
    _children.clear()
    for job in list(_jobs):
        job.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _slot(cache: Cache, key: str) -> tuple[str, str]:
    return (str(cache.root), key)


def _forget(child: _Child) -> None:
    slot = _slot(child.cache, child.key)
    with _children_lock:
        if _children.get(slot) is child:
            del _children[slot]


# ---------------------------------------------------------------------------------------
# a method's view of it


class BackgroundCompile:
    """A method's background compile (``Method.background_compile``): its
    :attr:`status`, :meth:`wait`, :meth:`cancel`, :meth:`detach`."""

    def __init__(
        self,
        name: str,
        builder: RegionBuilder,
        state: MethodState,
        program: Program,
        install: Install,
    ) -> None:
        self.name = name
        self._builder = builder
        self._state = state
        self._program = program
        self._status = PENDING
        self._done = threading.Event()
        self._lock = threading.Lock()  # who finishes the job: cancel or the child's end
        self._child: _Child | None = None
        self._install = weakref.WeakMethod(install)
        self.report: CompileReport | None = None
        """The compiled runner's report once compiled; on failure, the interpreted one."""
        self.started = time.monotonic()
        _jobs.add(self)

    @property
    def status(self) -> str:
        """``"pending"``, ``"compiled"`` or ``"failed: <why>"``."""
        return self._status

    @property
    def pid(self) -> int | None:
        """The compile process (None when none was started, or it has finished)."""
        child = self._child
        return child.pid if child is not None and not child.finished.is_set() else None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the compile has finished (at most ``timeout`` seconds); whether the
        method now runs compiled."""
        self._done.wait(timeout)
        return self._status == COMPILED

    def cancel(self) -> None:
        """Stop waiting; the method stays interpreted. The child ends when no other
        method waits for it."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None:  # else it has finished, or is finishing (child_finished)
            child.remove(self)
            self._fail("cancelled", warn=False)

    def detach(self) -> None:
        """Let the compile finish into the cache even after this process ends (the next
        load finds it there); this method keeps waiting for it meanwhile."""
        child = self._child
        if child is not None:
            child.detach()

    # -- outcomes (called by start and by the child's waiting thread) ---------------------
    def _compiled(self) -> None:
        install = self._install()
        if install is None:  # the method is gone: its compile ends as a cancelled one
            self._fail("cancelled", warn=False)
            return
        runner = CompiledRunner(self._state, self._program, builder=self._builder)
        install(runner)
        self.report = runner.report
        self._status = COMPILED
        self._done.set()

    def _fail(self, why: str, warn: bool = True) -> None:
        self._builder.warning = why
        self.report = self._builder.report()
        self._status = f"{FAILED}: {why}"
        self._done.set()
        if warn:
            warnings.warn(
                f"'{self.name}': compiling in the background failed, the method runs "
                f"interpreted: {why}",
                CompileWarning,
                stacklevel=2,
            )

    def forked(self) -> None:
        """In a child of a fork: the compile process and the thread waiting for it are the
        parent's, so this process neither signals it (its end would be the parent's
        failed compile) nor waits for it (nothing here would ever finish the job); a
        pending job fails, its method runs interpreted."""
        self._lock = threading.Lock()  # (another thread of the parent may have held it)
        self._child = None
        if self._status == PENDING:
            self._done = threading.Event()
            self._fail(FORKED, warn=False)

    def child_finished(self, child: _Child) -> None:
        with self._lock:
            if self._child is not child:  # cancelled
                return
            self._child = None
        if not child.ok:
            self._fail(child.reason, warn=child.reason != "cancelled")
            return
        try:
            if not self._builder.load_cached():
                self._fail("the compile process finished, but its cache entry cannot be used")
                return
            self._compiled()
        except Exception as e:  # the entry's code did not load: stay interpreted
            self._fail(_short(f"{type(e).__name__}: {e}"))


def _program_files(program: Program) -> tuple[list[str], Path | None]:
    """Paths of the program's file and data files for the child; bytes loaded without a
    path are written to a private directory (returned, to be removed after)."""
    blobs: list[memoryview] = [program.pte.data]
    if program.ptd is not None:
        blobs.extend(f.data for f in program.ptd.files)
    paths = list(program.paths) + [None] * (len(blobs) - len(program.paths))
    out: list[str] = []
    scratch: Path | None = None
    for k, (path, blob) in enumerate(zip(paths, blobs, strict=True)):
        if path is not None:
            out.append(str(path))
            continue
        if scratch is None:
            scratch = Path(tempfile.mkdtemp(prefix="ptexec-background-"))  # mode 0700
        target = scratch / (f"data{k}.ptd" if k else "program.pte")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        out.append(str(target))
    return out, scratch


def start(
    state: MethodState,
    program: Program,
    options: CompileOptions,
    request: LoadRequest,
    install: Install,
) -> BackgroundCompile:
    """Plan the method's regions now and get their code (module docstring): from the cache
    at once, or from a child process; ``install`` (a method of the Method, held weakly)
    receives the compiled runner. Never raises for a compile that cannot happen: the
    returned job says ``failed: ...``."""
    builder = RegionBuilder(state, program, options)
    job = BackgroundCompile(state.name, builder, state, program, install)
    if builder.load_cached():  # the cache has it, or there is nothing to compile
        job._compiled()
        return job
    entry = builder.entry()
    problem = _why_not(entry)
    if problem is None:
        try:
            _join_child(job, entry, program, options, request)
        except (OSError, ValueError) as e:
            problem = _short(f"the compile process could not start: {e}")
    if problem is not None:
        job._fail(problem)
    return job


def _why_not(entry: CacheEntry | None) -> str | None:
    from .aoti import missing_compiler

    if entry is None:
        return "the compile cache cannot be used (see the warning above)"
    if not entry.cache.writable:
        return f"the compile cache {entry.cache.root} is read only for this user"
    return missing_compiler()


def _join_child(
    job: BackgroundCompile,
    entry: CacheEntry | None,
    program: Program,
    options: CompileOptions,
    request: LoadRequest,
) -> None:
    assert entry is not None
    slot = _slot(entry.cache, entry.key)
    with _children_lock:
        child = _children.get(slot)
        if child is None or child.cancelled:  # a child being ended is no use
            files, scratch = _program_files(program)
            message = {
                "files": files,
                "share_state": "auto" if program.shared_buffer_indices else "never",
                "mmap": program.mapped,
                "method": request.method,
                "load": request.load_options(),
                "options": {
                    "min_instructions": options.min_instructions,
                    "autotune": options.autotune,
                },
                "threads": torch.get_num_threads(),
                "key": entry.key,
            }
            try:
                child = _Child(entry.key, entry.cache, message, scratch)
            except BaseException:
                if scratch is not None:
                    import shutil

                    shutil.rmtree(scratch, ignore_errors=True)
                raise
            _children[slot] = child
        job._child = child
    child.add(job)  # outside the registry's lock: a finished child calls back at once
