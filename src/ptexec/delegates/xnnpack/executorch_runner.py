"""Run an XNNPACK payload with ExecuTorch's own XNNPACK backend (when ``executorch`` is installed).

At load, the payload (its flatbuffer graph and constant data, and the named data its
constants refer to) becomes a one-delegate program
(:func:`program_of`, written by
:func:`ptexec.format.pte_write.one_delegate_program`) whose inputs are all the delegate
call's tensors, outputs included, with no memory plan; ExecuTorch's runtime loads it
(its pybindings' ``_load_program_from_buffer``), and ExecuTorch's XNNPACK backend
compiles the graph as it would for the original file.

A call hands the method's own tensors over: ExecuTorch shares the memory of unplanned
inputs, so XNNPACK reads the inputs and writes the outputs in place, with no copies.
``set_inputs`` runs only when a tensor's address (or a dynamic input's shape) differs
from the last call's; otherwise a call is one ``execute``. Where every argument is static
and each tensor handed over last is one the method keeps (in planned memory: its planned
tensor or a view of it the method holds from call to call; or the program's constant),
whose geometry never changes, a call checks only that each argument is that same object
and that the planned memory has not moved, then runs ``execute`` (the short way: no
per-argument layout or address checks). A dynamic output is resized
afterwards to the shape XNNPACK computed, read back through ``get_attribute`` (each such
output carries a name in the written program) after the first call of each binding: the
shapes XNNPACK computes depend only on the shapes of the inputs ExecuTorch holds, so while
the binding stays, the next calls reuse the shapes read (``get_attribute`` costs about what
a small graph's ``execute`` does), and a runner keeps the shapes read for each shape of its
inputs (:func:`_output_shapes`): an LLM's runners, which alternate between a prompt's
shapes and a decode step's, read them once for each. Before memory is handed over, every
dynamic output is checked to hold its declared bound: XNNPACK may write that much.
Each pybindings call redirects C++'s streams to Python's, importing ``sys`` from C;
:func:`_settle_sys_spec` (as each payload is loaded) spares that import the
exception CPython 3.11 raises and clears on every call, half of a small call's cost.

The written program keeps the payload's bytes and its named data alive (one copy, made
at load, which a later load of the same bytes shares: :class:`EtProgram`, kept by
:mod:`.backend`); ExecuTorch's backend packs the weights at each load as it does for any
program.
Recorded calls (an ETDump) run through a second load of the payload with ExecuTorch's
ETDump on, made on the first such call, and take the events its backend logs per node.
Threads: the method's lock serializes calls; ExecuTorch's XNNPACK uses ExecuTorch's
thread pool, whose size :func:`ptexec.set_num_threads` sets. XNNPACK's runtime keeps the
pool it was made with, and resetting the pool (from anywhere in the process) destroys that
one, so each call first checks that the pool is still the one the payload was loaded with
(:class:`ptexec.threads.ExecuTorchPool`), and loads the payload again when it is not; a
method call running several payloads checks once, as it starts, and each payload loaded
with the pool it found skips its own check.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from ...codegen import Template
from ...errors import BackendUnavailableError
from ...format import program as p
from ...format.etdump import ProfileEvent, decode_etdump
from ...format.lru import Key, Lru
from ...format.pte_write import delegate_spans, one_delegate_program
from ...tensor import dim_order_strides
from ...threads import executorch_pool
from . import schema as s
from .runtime import OutputShapeError

__all__ = [
    "EtProgram",
    "EtRunner",
    "clear_sources",
    "deferred_loads",
    "executorch_unavailable",
    "load_deferred",
    "program_of",
    "pybindings_module",
    "runner_of",
]

BACKEND_ID = "XnnpackBackend"

_MODULE: list[ModuleType | str | None] = [None]  # the pybindings module, or why not


def _pybindings() -> ModuleType | str:
    """ExecuTorch's pybindings (imported once), or the reason they cannot run XNNPACK."""
    cached = _MODULE[0]
    if cached is not None:
        return cached
    try:
        # the extension itself: portable_lib re-exports it but imports the whole exporter
        # (seconds) for a warning category
        import executorch.extension.pybindings._C as module
    except ImportError as e:
        result: ModuleType | str = f"ExecuTorch's runtime is not installed ({e})"
    else:
        names = list(module._get_registered_backend_names())
        result = (
            module
            if BACKEND_ID in names
            else f"ExecuTorch's runtime here has no {BACKEND_ID} (it has {', '.join(names) or 'none'})"
        )
    _MODULE[0] = result
    return result


def _settle_sys_spec() -> None:
    """Give ``sys.__spec__`` the ``_initializing = False`` every module imported through
    importlib carries (``sys`` is set up before importlib, and lacks it).

    Each call into ExecuTorch's pybindings redirects C++'s ``cout`` and ``cerr`` to
    Python's, which imports ``sys`` from C; CPython 3.11 asks the module's spec whether it
    is still initializing, and a spec without the attribute answers through an
    AttributeError raised and cleared, about half of what such a call costs (``execute``
    of a small graph included). With the attribute the answer is the same, False, at the
    cost of a lookup; later versions look it up without raising, so nothing changes
    there."""
    spec = getattr(sys, "__spec__", None)
    if spec is None or hasattr(spec, "_initializing"):
        return
    with contextlib.suppress(AttributeError, TypeError):  # a spec that takes none: leave it
        spec._initializing = False


def pybindings_module() -> ModuleType:
    """ExecuTorch's pybindings extension, loaded (:func:`executorch_unavailable` first)."""
    m = _pybindings()
    if isinstance(m, str):
        raise BackendUnavailableError(m)
    return m


def executorch_unavailable() -> str | None:
    """Why ExecuTorch's XNNPACK backend cannot be used here (None when it can)."""
    m = _pybindings()
    return m if isinstance(m, str) else None


class EtRunner:
    """A payload loaded by ExecuTorch: ``runner(*tensors)`` runs it on the delegate call's
    tensors (all its arguments, in order) and writes the outputs in place.
    :meth:`run_nodes` runs it and reports the events ExecuTorch's backend logs per node.
    ``pool``: ExecuTorch's thread pool it runs on; it checks that the pool is still the
    one it was loaded with unless the method call running it checked first
    (:attr:`ptexec.threads.ExecuTorchPool.checked`)."""

    def __init__(
        self,
        fn: Callable[..., None],
        source: str,
        binder: _Binder,
        traced: Callable[[], tuple[Callable[..., None], _Binder]] | None = None,
    ) -> None:
        self.fn = fn
        self.source = source
        self._binder = binder  # ExecuTorch's method, and the program (and bytes) it needs
        self._make_traced = traced
        self._traced: tuple[Callable[..., None], _Binder] | None = None
        self.outputs: tuple[int, ...] = ()  # the arguments the payload writes
        self.pool = binder.pool
        self._digest: str | None = None
        self._program: EtProgram | None = None

    def digest(self) -> str:
        """sha256 of the one-delegate program ExecuTorch loaded (the payload, the named
        data it reads, the call's tensors): what the runner computes, in any process."""
        if self._digest is None:
            self._digest = hashlib.sha256(self._binder.data).hexdigest()
        return self._digest

    def __call__(self, *tensors: torch.Tensor) -> None:
        self.fn(*tensors)

    def program_data(self) -> bytes:
        """The one-delegate program ExecuTorch loaded (read only)."""
        return self._binder.data

    def program(self) -> EtProgram | None:
        """What the one-delegate program was written from (None: not known)."""
        return self._program

    def release(self) -> None:
        """Drop ExecuTorch's method of the payload (XNNPACK's packed weights with it) until
        the next call, which loads it again: for a caller that runs the payload another
        way meanwhile (:mod:`ptexec.compile.native`)."""
        self._binder.release(self.fn.__globals__)

    def load_deferred(self) -> None:
        """Load ExecuTorch's method now if its load was deferred (:func:`deferred_loads`)
        and nothing released it since; raises BackendUnavailableError when ExecuTorch
        cannot load the payload."""
        binder = self._binder
        if binder.deferred:
            binder.load_now(self.fn.__globals__)

    def run_nodes(self, report: Callable[[str, int, int], None], *tensors: torch.Tensor) -> None:
        """Run the payload as ``runner(*tensors)`` does, with ExecuTorch's backend, loaded
        once more with ExecuTorch's ETDump on (on first use: the plain runner never pays
        for it), and ``report(name, start, end)`` each node event the backend logged
        (XNNPACK's operator names, ``Fully Connected (NC, F32) GEMM #1``), its times moved
        to this process's clock, where the call began."""
        if self._traced is None:
            if self._make_traced is None:
                self.fn(*tensors)
                return
            self._traced = self._make_traced()
        fn, binder = self._traced
        start = time.perf_counter_ns()
        fn(*tensors)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "delegate.etdp")
            # the binder's program of now: a pool change reloads it
            binder.program.write_etdump_result_to_file(path, None)
            with open(path, "rb") as f:
                dump = decode_etdump(f.read())
        runs = [r for r in dump.run_data if r.name == "Execute"]
        if not runs:
            return
        events = [e for e in runs[-1].events if isinstance(e, ProfileEvent)]
        nodes = [e for e in events if e.name is None and e.delegate_debug_id_str]
        if not nodes:
            return
        origin = min(e.start_time for e in events)
        for e in nodes:
            name = e.delegate_debug_id_str
            assert name is not None
            report(name, start + e.start_time - origin, start + e.end_time - origin)

    def __repr__(self) -> str:
        return "EtRunner(ExecuTorch XnnpackBackend)"


class _Unbound:
    """The generated code's ``_key`` while nothing is handed over: every item is None,
    unequal to any address or shape."""

    def __getitem__(self, index: int) -> None:
        return None


_UNBOUND = _Unbound()
_RELEASED = object()  # a released binder's pool address: equals no pool's


class _Binder:
    """ExecuTorch's program and method of one payload: hands tensors to the method and
    remembers what it handed over last; loads the program again when ExecuTorch's thread
    pool is no longer the one the method was made with.

    ``held`` is that pool (address, size). The generated code's globals (``ns``, which
    the code hands over on each call here: held here too, they would make a reference
    cycle with the code) have ``_execute`` and ``_get``, the current method's, and ``_at``
    and ``_n``, its pool's address and size (``_atp``: the address as a ctypes pointer).
    ``key`` is the binding handed over last (None: none), also the generated code's
    ``_key`` (there :data:`_UNBOUND` for none, which equals no address or shape); the
    generated code's ``_known`` is that same object once the dynamic outputs' shapes were
    read back and accepted for it (it keeps them in its ``_shapes``)."""

    def __init__(
        self,
        module: ModuleType,
        data: bytes,
        bounds: Sequence[tuple[int, int]],
        where: str,
        planned: Sequence[torch.Tensor | None] = (),
        memory: Sequence[int] = (),
        etdump: bool = False,
        defer: bool = False,
        at_bound: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
    ) -> None:
        self.key: tuple[Any, ...] | None = None
        self.planned = tuple(planned)
        self.memory = tuple(memory)  # the arguments in planned memory (not constants)
        self.arena = self.memory[0] if self.memory else None
        self.module = module
        self.etdump = etdump  # loaded with ExecuTorch's ETDump on (recorded calls)
        self.data = data  # the one-delegate program; ExecuTorch reads it while loaded
        self.bounds = bounds  # (argument, bytes) of each dynamic output
        # each dynamic output's bound (sizes, dense strides in its dim order)
        self.at_bound = at_bound or {}
        self.where = where
        pool = executorch_pool(module)
        assert pool is not None  # the pybindings are loaded
        self.pool = pool
        self.held: tuple[int | None, int] = (None, 0)
        self.program: Any = None
        self.method: Any = None
        # not loaded yet: the first call loads it, unless load_now() does first
        self.deferred = defer
        if not defer:
            self._load()

    def _set_key(self, ns: dict[str, Any], key: tuple[Any, ...] | None) -> None:
        self.key = key
        ns["_key"] = _UNBOUND if key is None else key
        ns["_o0"] = None  # no argument is None: the short way is closed

    def _open(
        self, ns: dict[str, Any], tensors: list[torch.Tensor], given: Sequence[torch.Tensor]
    ) -> None:
        """Open the generated code's short way (see :func:`_source`) for the binding of
        ``tensors`` just handed over, made of the arguments ``given``, when each argument
        is static and in planned memory or a constant, the constants are the program's
        own tensors, and the others lie in one storage, the planned memory (whose address
        argument ``self.arena`` then stands for): the method's planned tensors and the
        views its statements make of them, held from call to call. None of them changes
        its geometry in place (a static value is never resized, a failed call's restore
        gives the planned tensors theirs back), so each is dense, or strided, as it was.
        A strided one was handed over as its dense copy, which keeps its memory while the
        shape stays: the short way copies the argument into it again."""
        if self.arena is None or not len(self.planned) == len(tensors) == len(given):
            return
        arena = given[self.arena].untyped_storage().data_ptr()
        copies = []
        for k, (t, x, made) in enumerate(zip(tensors, given, self.planned, strict=True)):
            if made is None:
                return
            if k in self.memory:
                if x.untyped_storage().data_ptr() != arena:
                    return
                if t is not x:  # strided: its dense copy was handed over
                    copies.append((t, x))
            elif t is not made or x is not t:
                return
        ns["_a0"] = given[self.arena].data_ptr()
        ns["_dc"] = tuple(copies)
        for k in reversed(range(len(given))):  # the first last: it opens the way
            ns[f"_o{k}"] = given[k]

    def _load(self) -> None:
        self.key = None
        if self.etdump:
            program = self.module._load_program_from_buffer(self.data, enable_etdump=True)
        else:
            program = self.module._load_program_from_buffer(self.data)
        method = program.load_method("forward")
        self.program, self.method = program, method
        self.held = self.pool.key()  # the pool XNNPACK's runtime took as it loaded

    def attach(self, namespace: dict[str, Any]) -> None:
        """Make ``namespace`` (the generated code's globals) call the current method (one
        not loaded yet: the next call loads it)."""
        if self.method is None:
            self._released(namespace)
            return
        namespace["_execute"] = self.method.execute
        namespace["_get"] = self.method.get_attribute
        namespace["_at"], namespace["_n"] = self.held
        namespace["_held"] = self.held
        # the address as ctypes' own pointer object: the size accessor takes it as is,
        # where a Python int is converted on every call
        namespace["_atp"] = ctypes.c_void_p(self.held[0])
        namespace["_key"] = _UNBOUND if self.key is None else self.key
        if self.key is None:
            namespace["_o0"] = None
        namespace.setdefault("_known", None)

    def release(self, ns: dict[str, Any]) -> None:
        """Drop the program and method; the next call through ``ns`` loads them again
        (its pool check fails: ``_at`` is no pool's address)."""
        self.deferred = False  # released: loaded at the next call, if any
        self.key = None
        self.program = self.method = None
        self.held = (None, 0)
        self._released(ns)

    def failed(self, ns: dict[str, Any]) -> None:
        """After ExecuTorch's method failed a call: drop it, so that the next call loads
        the payload again. XNNPACK's runtimes share one workspace, and a runtime that
        grows it sets up again every other runtime set up before it; one whose last
        reshape failed fails that setup, and with it the growing runtime's call, however
        good its inputs. A runtime destroyed leaves the workspace's users."""
        self.release(ns)

    def load_now(self, ns: dict[str, Any]) -> None:
        """Load the deferred program and method, and make ``ns`` call them; raises
        BackendUnavailableError when ExecuTorch cannot load the payload."""
        self._load_into(ns, BackendUnavailableError, "")

    @staticmethod
    def _released(ns: dict[str, Any]) -> None:
        ns["_execute"] = ns["_get"] = None
        ns["_at"], ns["_key"] = _RELEASED, _UNBOUND
        ns["_held"] = _RELEASED  # no key a call found: the check runs, and fails
        ns["_o0"] = None  # the short way closed too (the reload keeps it so)
        ns.setdefault("_known", None)

    def reload(self, ns: dict[str, Any]) -> None:
        """Load the program again, for the pool now current (the old one is destroyed),
        and make ``ns`` call it."""
        ns["_key"] = _UNBOUND
        again = "" if self.deferred else " again after its thread pool changed"
        self._load_into(ns, RuntimeError, again)

    def _load_into(self, ns: dict[str, Any], error: type[RuntimeError], again: str) -> None:
        self.deferred = False
        try:
            self._load()
        except RuntimeError as e:
            raise error(
                f"{self.where}: ExecuTorch's {BACKEND_ID} cannot load the payload{again} ({e})"
            ) from None
        self.attach(ns)

    def bind(
        self,
        ns: dict[str, Any],
        key: tuple[Any, ...],
        tensors: list[torch.Tensor],
        given: Sequence[torch.Tensor] | None = None,
    ) -> None:
        """Hand ``tensors`` over (the arguments ``given``, strided ones as dense copies)."""
        self._set_key(ns, None)
        for k, need in self.bounds:
            t = tensors[k]
            room = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
            if room < need:
                raise RuntimeError(
                    f"delegate argument {k} (a dynamic output) holds {room} bytes; XNNPACK "
                    f"may write its whole bound, {need} bytes"
                )
        for k, (sizes, strides) in self.at_bound.items():
            t = tensors[k]
            if not t.numel():
                # an empty tensor's address is 0, where XNNPACK would write the next
                # call's output: hand its memory over at the bound (the room checked)
                tensors[k] = t.as_strided(sizes, strides)
        self.method.set_inputs(tensors)
        self._set_key(ns, key)
        if given is not None:
            self._open(ns, tensors, given)


class _Dense:
    """Dense copies of inputs that are not laid out densely in their dim order (ExecuTorch
    takes nothing else; ptexec's views, an expand say, may have other strides). Each
    argument keeps its copy's memory from call to call while its shape stays, so the
    address ExecuTorch holds stays too.

    The generated code copies into argument ``k``'s copy itself, without calling here,
    while the input has the copy's shape and dtype: its globals ``_d{k}``, ``_s{k}`` and
    ``_t{k}`` are that copy, its shape and its dtype (``_s{k}`` None before the first);
    the code hands its globals (``ns``) over when it calls here."""

    def __init__(self, orders: Mapping[int, tuple[int, ...]]) -> None:
        self.orders = orders
        self.copies: dict[int, torch.Tensor] = {}

    @staticmethod
    def names_of(orders: Mapping[int, tuple[int, ...]]) -> dict[str, Any]:
        """The generated code's initial globals for each argument's copy."""
        out: dict[str, Any] = {}
        for k in orders:
            out[f"_d{k}"] = out[f"_s{k}"] = out[f"_t{k}"] = None
        return out

    def __call__(self, ns: dict[str, Any], k: int, x: torch.Tensor) -> torch.Tensor:
        b = self.copies.get(k)
        if b is None or b.shape != x.shape or b.dtype != x.dtype:
            b = torch.empty_strided(
                x.shape, dim_order_strides(x.shape, self.orders[k]), dtype=x.dtype
            )
            self.copies[k] = b
            ns[f"_d{k}"], ns[f"_s{k}"], ns[f"_t{k}"] = b, b.shape, b.dtype
        return b.copy_(x)


def _not_dense(k: int) -> RuntimeError:
    return RuntimeError(f"delegate argument {k} (an output) is not dense in its dim order")


# distinct shapes of a runner's inputs whose outputs' shapes it keeps (then it forgets all)
MEMO_SHAPES = 64


def _output_shapes(
    get: Callable[[str], torch.Tensor],
    outputs: tuple[tuple[int, str, tuple[int, ...], tuple[int, ...]], ...],
    xs: tuple[torch.Tensor, ...],
    memo: dict[tuple[Any, ...], tuple[tuple[torch.Size, tuple[int, ...]], ...]],
    shapes: tuple[Any, ...],
) -> tuple[tuple[torch.Size, tuple[int, ...]], ...]:
    """The shapes (and dense strides in their dim orders) ExecuTorch gave the dynamic
    outputs ``xs`` in the call just run, read back through ``get``: ``outputs`` holds each
    one's argument position, name in the written program, dim order and declared bound.
    Each must lie in its own memory (unless empty) and within its bound in every dim
    (ExecuTorch checks only the element count). They depend only on the ``shapes`` of the inputs ExecuTorch
    holds: they are kept in ``memo`` under those."""
    found = []
    for (k, name, order, bound), x in zip(outputs, xs, strict=True):
        y = get(name)
        # an empty tensor's address reads 0: compare where its memory lies
        at = x.untyped_storage().data_ptr() + x.storage_offset() * x.element_size()
        if y.numel() and y.data_ptr() != at:
            raise RuntimeError(f"delegate argument {k}: ExecuTorch wrote elsewhere")
        shape = y.shape
        if len(shape) != len(bound) or any(a > b for a, b in zip(shape, bound, strict=True)):
            declared = f"{str(x.dtype).removeprefix('torch.')}{list(bound)}"
            raise OutputShapeError(
                f"delegate argument {k}: the graph computed {list(shape)}, beyond the bound "
                f"{declared} the program declares"
            )
        found.append((shape, dim_order_strides(shape, order)))
    if len(memo) >= MEMO_SHAPES:
        memo.clear()
    made = memo[shapes] = tuple(found)
    return made


@dataclass(frozen=True, eq=False)
class EtProgram:
    """The one-delegate program of a delegate call (``data``, what ExecuTorch loads) and
    what its runner is generated from: the call's ``tensors``, the arguments it writes
    (``outputs``), the names given to its dynamic outputs, their bounds in bytes and the
    runner's ``source``. ``spans``: where the payload and each named blob the graph reads
    (``named``, in that order) lie in ``data`` (offset, length), so that the same program
    can be recognized by its bytes (:meth:`same_bytes`); ``compile_specs``: the
    delegate's, as written in ``data``."""

    data: bytes
    tensors: tuple[p.Tensor, ...]
    outputs: tuple[int, ...]
    names: Mapping[int, str]
    bounds: tuple[tuple[int, int], ...]
    source: str
    named: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    orders: Mapping[int, tuple[int, ...]]  # each input's dim order
    globals: Mapping[str, Any]  # what every runner's namespace starts with
    compile_specs: tuple[p.CompileSpec, ...] = ()

    def same_bytes(self, processed: memoryview, named_data: Mapping[str, memoryview]) -> bool:
        """Whether ``processed`` and ``named_data`` hold exactly the bytes this program was
        written with (compared in place, without copies)."""
        blobs: list[memoryview | None] = [processed]
        blobs += [named_data.get(k) for k in self.named]
        data = self.data
        for blob, (offset, length) in zip(blobs, self.spans, strict=True):
            if blob is None or blob.nbytes != length:
                return False
            try:
                if not data.startswith(blob, offset):
                    return False
            except (BufferError, TypeError):  # not one contiguous run of bytes
                return False
        return True


def program_of(
    payload: s.XnnPayload,
    processed: memoryview,
    tensors: Sequence[p.Tensor],
    compile_specs: Sequence[p.CompileSpec],
    named_data: Mapping[str, memoryview],
    outputs: Sequence[int],
    where: str,
) -> EtProgram:
    """The one-delegate program of ``processed`` (the decoded and validated ``payload``)
    for a call whose arguments are ``tensors`` (``outputs``: the positions the graph
    writes). Raises BackendUnavailableError when ExecuTorch's runtime cannot take it."""
    for k, t in enumerate(tensors):
        if t.shape_dynamism == p.DYNAMIC_UNBOUND:
            raise BackendUnavailableError(
                f"{where}: argument {k} has an unbound dynamic shape, which ExecuTorch's "
                "runtime does not accept"
            )
    keys = tuple(sorted({e.named_key for e in payload.graph.constant_data if e.named_key}))
    dynamic_out = [k for k in outputs if tensors[k].shape_dynamism != p.STATIC]
    names = {k: f"ptexec_output_{k}" for k in dynamic_out}
    blobs = {key: named_data[key] for key in keys}
    data = one_delegate_program(tensors, BACKEND_ID, processed, compile_specs, blobs, names)
    spans = delegate_spans(data, [processed, *blobs.values()])
    orders = {k: tuple(t.dim_order) for k, t in enumerate(tensors) if k not in outputs}
    return EtProgram(
        data,
        tuple(tensors),
        tuple(outputs),
        names,
        tuple((k, tensors[k].nbytes) for k in names),
        _runner_source(tensors, outputs, names),
        keys,
        spans,
        orders,
        _globals(tensors, orders),
        tuple(compile_specs),
    )


# while a compiled method loads: the runners made meanwhile, whose loads are deferred
_DEFERRED: contextvars.ContextVar[list[EtRunner] | None] = contextvars.ContextVar(
    "ptexec_deferred_executorch_loads", default=None
)


@contextlib.contextmanager
def deferred_loads() -> Iterator[list[EtRunner]]:
    """Runners made in this context (:func:`runner_of`) do not load ExecuTorch's method
    yet; the list yielded collects them. A compiled method loads in one: the delegate
    calls its compiled code runs through ExecuTorch's C++ runtime (:mod:`ptexec.compile.
    native`) never need the pybindings' load (it was made, and released at once), and
    :func:`load_deferred` loads the others before the method is handed out, so a payload
    ExecuTorch refuses still fails the load."""
    made: list[EtRunner] = []
    token = _DEFERRED.set(made)
    try:
        yield made
    finally:
        _DEFERRED.reset(token)


def load_deferred(runners: Sequence[EtRunner]) -> None:
    """Load each of ``runners`` whose load is still deferred (not released since: a runner
    whose payload another path runs loads at its first call, if one comes); raises
    BackendUnavailableError for a payload ExecuTorch cannot load."""
    for runner in runners:
        runner.load_deferred()


def runner_of(
    program: EtProgram, where: str, planned: Sequence[torch.Tensor | None] = ()
) -> EtRunner:
    """A runner of ``program`` loaded with ExecuTorch's XNNPACK backend. ``planned``: per
    argument, the tensor the method made for it when that is a static tensor in planned
    memory or a constant, whose geometry never changes (None, or nothing: not known).
    Raises BackendUnavailableError when ExecuTorch cannot run it."""
    module = _pybindings()
    if isinstance(module, str):
        raise BackendUnavailableError(f"{where}: {module}")
    _settle_sys_spec()  # each load: importlib.reload(sys) gives sys a new spec
    memory = _in_memory(program.tensors)
    idle = _idle.take(id(program))
    fn: Callable[..., None] | None = None
    deferred = _DEFERRED.get()

    def bind(etdump: bool = False, defer: bool = False) -> _Binder:
        """The payload loaded by ExecuTorch's backend for this runner's arguments."""
        return _Binder(
            module,
            program.data,
            program.bounds,
            where,
            planned,
            memory,
            etdump=etdump,
            defer=defer,
            at_bound=_at_bound(program),
        )

    if idle is not None and idle[0] is program:
        _, fn, binder = idle  # (loaded: nothing to defer)
        binder.planned = tuple(planned)
    else:
        try:
            binder = bind(defer=deferred is not None)
        except RuntimeError as e:
            raise BackendUnavailableError(
                f"{where}: ExecuTorch's {BACKEND_ID} cannot load the payload ({e})"
            ) from None

    def traced() -> tuple[Callable[..., None], _Binder]:
        # the same payload loaded again with ExecuTorch's ETDump on, for recorded calls
        with_events = bind(etdump=True)
        return _generate(with_events, program).fn, with_events

    runner = _generate(binder, program) if fn is None else EtRunner(fn, program.source, binder)
    runner._make_traced = traced
    runner._program = program
    runner.outputs = program.outputs
    if binder.deferred and deferred is not None:
        deferred.append(runner)
    return runner


def _at_bound(program: EtProgram) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each dynamic output's bound and its dense strides in the output's dim order."""
    out = {}
    for k, _ in program.bounds:
        t = program.tensors[k]
        sizes = tuple(t.sizes)
        out[k] = (sizes, tuple(dim_order_strides(sizes, tuple(t.dim_order))))
    return out


# ExecuTorch's methods whose runner's method was freed (:func:`retire`), by program: the
# next runner of the program takes one over instead of loading the program again (and
# generating its code). At most one a program, bounded by the programs' bytes (XNNPACK's
# packed weights take about as much).
IDLE_BYTES = 64 << 20
_idle: Lru[tuple[EtProgram, Callable[..., None], _Binder]] = Lru(4096, IDLE_BYTES)


def clear_idle() -> None:
    """Drop the ExecuTorch methods kept for later runners."""
    _idle.clear()


def retire(runner: EtRunner, program: EtProgram) -> None:
    """Keep ``runner``'s ExecuTorch method, and its generated code, for the next runner of
    ``program``: called once the method that ran it is freed, so nothing calls it any more.
    What it held of that method (the tensors it was given last, their addresses) is
    dropped: the next runner's first call hands its own tensors over. A method loaded
    with ETDump on, or released, is not kept."""
    binder = runner._binder
    if binder.etdump or binder.method is None:
        return
    ns = runner.fn.__globals__
    for k in range(len(program.tensors)):
        ns[f"_o{k}"] = None  # the short way closed (its tensors were the method's)
    ns["_a0"], ns["_dc"], ns["_key"], ns["_known"] = None, (), _UNBOUND, None
    binder.key = None
    binder.planned = ()
    _idle.put(id(program), (program, runner.fn, binder), len(program.data))


# the generated source depends only on the call's tensors, outputs and names; a program's
# delegates are often alike, and a program is often loaded again
_sources: Lru[str] = Lru(4096, 32 << 20)


def clear_sources() -> None:
    """Forget the generated runner sources, and their compiled functions."""
    _sources.clear()
    _templates.clear()


def _runner_source(
    tensors: Sequence[p.Tensor], outputs: Sequence[int], names: Mapping[int, str]
) -> str:
    facts = tuple(
        (t.sizes, t.dim_order, t.shape_dynamism, t.allocation_info is not None) for t in tensors
    )  # what _source reads of each tensor: calls on a model's layers share a text
    key = Key(facts, tuple(outputs), tuple(names.items()))
    source = _sources.get(key)
    if source is None:
        source = _source(tensors, outputs, names)
        _sources.put(key, source, len(source))
    return source


def _generate(binder: _Binder, program: EtProgram) -> EtRunner:
    dense = _Dense(program.orders)
    env: dict[str, Any] = {
        **program.globals,
        "_binder": binder,
        "_pool": binder.pool.current,
        "_size": binder.pool.size,
        "_checked": binder.pool.checked,
        "_dense": dense,
    }
    if program.names:
        env["_shapes"] = [None] * len(program.names)
        env["_memo"] = {}  # the outputs' shapes by the inputs' (see _output_shapes)
    fn = _template(program.source).function(env)
    binder.attach(env)
    return EtRunner(fn, program.source, binder)


# the runners' function, compiled once per text (each runner's globals are its own)
_templates: Lru[Template] = Lru(4096, 32 << 20)


def _template(source: str) -> Template:
    found = _templates.get(source)
    if found is None:
        found = Template(source, "xnnpack executorch runner", "_xnnpack_et_run")
        _templates.put(source, found, len(source))
    return found


def _globals(tensors: Sequence[p.Tensor], orders: Mapping[int, tuple[int, ...]]) -> dict[str, Any]:
    """The generated runner's initial globals that are the same for every runner of a
    call (each runner's namespace starts as a copy: none of them is mutable)."""
    return {
        **_Dense.names_of(orders),
        **{f"_o{k}": None for k in range(len(tensors))},
        "_a0": None,
        "_dc": (),
        "_output_shapes": _output_shapes,
        "_not_dense": _not_dense,
        "_channels_last": torch.channels_last,
    }


def _in_memory(tensors: Sequence[p.Tensor]) -> tuple[int, ...]:
    """The arguments in planned memory (of the plan's buffers, not the program's
    constants)."""
    return tuple(k for k, t in enumerate(tensors) if t.allocation_info is not None)


def _source(tensors: Sequence[p.Tensor], outputs: Sequence[int], names: Mapping[int, str]) -> str:
    """The text of the runner function for a call on ``tensors``."""
    n = len(tensors)
    args = [f"x{k}" for k in range(n)]
    key = [f"x{k}.data_ptr()" for k in range(n)]
    key += [
        f"x{k}.shape"
        for k, t in enumerate(tensors)
        if t.shape_dynamism != p.STATIC and k not in outputs
    ]
    # the pool first: the method may hold a destroyed one (its size is read only for the
    # current address, which is alive); not while the method call running this found the
    # pool it was loaded with (see ExecuTorchPool.checked)
    lines = [
        "if _held is not _checked[0] and (_pool() != _at or _size(_atp) != _n):",
        "    _binder.reload(globals())",
    ]
    memory = _in_memory(tensors)
    short = bool(memory) and all(t.shape_dynamism == p.STATIC for t in tensors)
    if short:
        # the short way: every argument the fixed tensor given last (its geometry never
        # changes, so it is dense, or strided, as it was), the planned memory where it
        # was; a strided one is copied into the dense copy handed over for it (``_dc``)
        same = " and ".join(f"x{k} is _o{k}" for k in range(n))
        lines += [
            f"if {same} and x{memory[0]}.data_ptr() == _a0:",
            "    for _c in _dc:",
            "        _c[0].copy_(_c[1])",
            "    try:",
            "        _execute()",
            "    except BaseException:",
            "        _binder.failed(globals())",
            "        raise",
            "    return",
            f"_given = ({''.join(f'{a}, ' for a in args)})",
        ]
    for k, t in enumerate(tensors):
        order = tuple(t.dim_order)
        ident = order == tuple(range(len(order)))
        if ident:
            dense = f"x{k}.is_contiguous()"
        elif order == (0, 2, 3, 1):
            dense = f"x{k}.is_contiguous(memory_format=_channels_last)"
        else:
            dense = f"x{k}.permute({order!r}).is_contiguous()"
        if k in outputs:
            lines += [f"if not {dense}:", f"    raise _not_dense({k})"]
        else:
            # the copy of the last call's shape and dtype, else a new one (see _Dense)
            same = f"x{k}.shape == _s{k} and x{k}.dtype is _t{k}"
            lines += [
                f"if not {dense}:",
                f"    x{k} = _d{k}.copy_(x{k}) if {same} else _dense(globals(), {k}, x{k})",
            ]
    # each part against the binding's own, stopping at the first that differs (the key is
    # built only to hand over)
    same = " or ".join(f"{e} != _key[{i}]" for i, e in enumerate(key))
    lines += [
        f"if {same}:",
        f"    _binder.bind(globals(), ({', '.join(key)},), [{', '.join(args)}]"
        + (", _given)" if short else ")"),
        "try:",
        "    _execute()",
        "except BaseException:",
        "    _binder.failed(globals())",
        "    raise",
    ]
    if names:
        # the shapes read after the binding's first call hold while it stays (a new binding
        # or a reload replaces the key object); an output resized since is resized again.
        # They follow from the shapes of the inputs handed over (the key's last items):
        # the shapes kept for those are used without reading them back
        same = " and ".join(f"x{k}.shape == _shapes[{i}]" for i, k in enumerate(names))
        held = len(key) - n  # the inputs' shapes in the key
        outs = tuple(
            (k, name, tuple(tensors[k].dim_order), tuple(tensors[k].sizes))
            for k, name in names.items()
        )
        xs = "".join(f"x{k}, " for k in names)
        lines += [
            f"if _known is not _key or not ({same}):",
            f"    _in = _key[{n}:]" if held else "    _in = ()",
            "    _out = _memo.get(_in)",
            "    if _out is None:",
            f"        _out = _output_shapes(_get, {outs!r}, ({xs}), _memo, _in)",
        ]
        for i, k in enumerate(names):
            lines += [
                f"    if x{k}.shape != _out[{i}][0]:",
                f"        x{k}.as_strided_(_out[{i}][0], _out[{i}][1])",
            ]
        lines += [
            f"    _shapes[:] = ({''.join(f'_out[{i}][0], ' for i in range(len(names)))})",
            "    _known = _key",
        ]
        lines.insert(0, "global _known")
    return f"def _xnnpack_et_run({', '.join(args)}):\n" + "".join(f"    {x}\n" for x in lines)
