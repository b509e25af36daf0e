"""ETDump of ptexec's calls, for ExecuTorch's devtools (``executorch.devtools.Inspector``).

An :class:`ETDumpRecorder` runs calls of a method and records, per call, one ETDump run
(``"Execute"``) with the events ExecuTorch's runtime writes for each executed instruction,
in its order: when there is a debug buffer, first the values the instruction logs (a
kernel's ``out`` arguments, one debug event each, a ``Tensor[]`` one as a tensor list;
every argument of a delegate call; nothing for prim ops, jumps, moves and frees), then its
profiling events (start and end in nanoseconds of a monotonic clock), named as ExecuTorch
names them: for a kernel, its wrapper's event (``native_call_addmm.out``: the operator
without its namespace; ``llama::update_cache.out`` for the ``llama::`` custom ops, whose
wrapper names them whole; ``native_call_llama::gated_delta_rule.out``, which logs no
value, for the gated delta rule that ExecuTorch registers by hand) and around it
``OPERATOR_CALL``; ``OPERATOR_CALL`` alone for an operator ExecuTorch registers as a prim
op; ``DELEGATE_CALL`` for a delegate call, inside
it one event per node the delegate's runner reports (no name; the node in
``delegate_debug_id_str``, as ExecuTorch's XNNPACK backend logs its operators: see
:meth:`~ptexec.engine.hooks.Hooks.node`); ``JF_CALL``, ``MOVE_CALL`` and ``FREE_CALL`` for
jumps, moves and frees. A ``Method::execute`` event spans the instructions, and one debug
event follows per output of the call. ptexec's own trace and profile name a kernel by its
operator (``aten::addmm.out``); only the ETDump takes ExecuTorch's names::

    from ptexec.etdump import ETDumpRecorder
    rec = ETDumpRecorder(debug_buffer_size=1 << 20)
    outputs = rec.execute(method, [x])         # as method.execute([x]), outputs are copies
    rec.write("run.etdp", "run.bin")           # then: Inspector(etdump_path="run.etdp",
                                               #   debug_buffer_path="run.bin", etrecord=...)

Values the load-time rewrites leave unwritten (outputs nothing reads, the intermediates of
a fused instruction: :mod:`ptexec.loader.dataflow`) are computed for the dump, by the
instructions' statements as their kernels made them, into memory of their own (the
program's is left as it is), so that every instruction logs its own values, as the
Inspector pairs them with the exported graph's nodes; a fused instruction's result is
logged by the last instruction it stands for, as the program computed it.

The **debug buffer** holds the bytes of every recorded tensor, contiguous, each at an
offset that is a multiple of 64 (a :class:`~ptexec.format.etdump.TensorRef` in the debug
event gives its scalar type, sizes, contiguous strides and offset). ``debug_buffer_size``
bounds it as ExecuTorch's does: a call whose values would not fit raises
:class:`~ptexec.errors.LimitExceededError` and records nothing. The written file holds the
bytes used, not the whole capacity. A tensor on a GPU is copied to the host for the buffer.
Writing clears what was recorded, so each file holds the runs since the previous one.

Calls run through :meth:`ptexec.Method.run_with`: the method's own call envelope (input
checks, binding, outputs as copies) over its instrumented blocks (the statements
``execute`` runs), with a :class:`~ptexec.engine.hooks.Hooks` object recording around each
instruction; CUDA is synchronized after each instruction when the call touches CUDA
memory, so an instruction's time is its kernels'. An instruction's own event spans its
work; the ``OPERATOR_CALL`` around a kernel's also spans the recording of its values, as
ExecuTorch's does. Recorded calls of the methods sharing a recorder are serialized. The
writer (:mod:`ptexec.format.etdump`) needs neither torch nor ExecuTorch.
"""

from __future__ import annotations

import itertools
import numbers
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .codegen import Sources
from .dtypes import DTYPE_TO_CODE
from .effects import effects
from .engine.blocks import compile_statement
from .engine.hooks import Hooks, Step, steps_of
from .errors import LimitExceededError
from .files import write_together
from .format import program as p
from .format.etdump import (
    RUN_OUTPUT_CHAIN,
    DebugEvent,
    ETDump,
    Event,
    ProfileEvent,
    RunData,
    TensorRef,
    Value,
    encode_etdump,
)
from .kernels.prim import PRIM_OPS
from .loader.dataflow import FUSED_AWAY, is_fused
from .loader.state import Kept, MethodState

if TYPE_CHECKING:
    from .method import Method

__all__ = ["DEBUG_ALIGNMENT", "DebugBuffer", "ETDumpRecorder", "check_debug_buffer_size"]

DEBUG_ALIGNMENT = 64  # byte alignment of every tensor in the debug buffer


def check_debug_buffer_size(size: Any) -> int:
    """``size`` as a number of bytes, or the error saying why it is not one: an integer
    (not a bool, not a float, even 1.0: a size is counted, not measured) and >= 0."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise TypeError(
            f"debug_buffer_size must be an int number of bytes, not {type(size).__name__} {size!r}"
        )
    if size < 0:
        raise ValueError(f"debug_buffer_size must be >= 0, got {size}")
    return int(size)


class DebugBuffer:
    """Tensor bytes at aligned offsets, up to ``capacity`` bytes (see the module docstring).

    Each stored tensor is one host copy, kept until the bytes are asked for; the buffer's
    bytes are assembled only then (:meth:`getvalue`)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = check_debug_buffer_size(capacity)
        self._chunks: list[tuple[int, torch.Tensor]] = []  # (offset, contiguous host copy)
        self._end = 0

    @property
    def used(self) -> int:
        """Bytes up to the end of the last stored tensor."""
        return self._end

    def store(self, t: torch.Tensor, what: str) -> TensorRef:
        """Copy ``t``'s elements (contiguous, on the host); its :class:`TensorRef`."""
        code = DTYPE_TO_CODE.get(t.dtype)
        if code is None:
            raise TypeError(f"{what}: {t.dtype} has no ExecuTorch scalar type")
        offset = -(-self._end // DEBUG_ALIGNMENT) * DEBUG_ALIGNMENT
        nbytes = t.numel() * t.element_size()
        if nbytes and offset + nbytes > self.capacity:  # (an empty tensor writes nothing)
            raise LimitExceededError(
                f"ETDump debug buffer full: {what} needs {nbytes} bytes at offset {offset}, "
                f"past debug_buffer_size={self.capacity}; load with a larger debug_buffer_size"
            )
        sizes = tuple(t.shape)
        strides, step = [], 1
        for s in reversed(sizes):
            strides.append(step)
            step *= max(s, 1)
        if nbytes:
            copy = t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
            self._chunks.append((offset, copy))
            self._end = offset + nbytes
        return TensorRef(code, sizes, tuple(reversed(strides)), offset)

    def truncate(self, size: int) -> None:
        """Forget everything stored past ``size`` bytes (a failed call's values)."""
        while self._chunks and self._chunks[-1][0] >= size:
            self._chunks.pop()
        last = self._chunks[-1] if self._chunks else None
        self._end = 0 if last is None else last[0] + last[1].numel() * last[1].element_size()

    def getvalue(self) -> bytes:
        data = bytearray(self._end)
        for offset, t in self._chunks:
            raw = t.reshape(-1).view(torch.uint8)
            data[offset : offset + raw.numel()] = raw.numpy().tobytes()
        return bytes(data)


class _Layout:
    """How one method's instructions are recorded: per (chain, index), the names of its
    profiling events, innermost first (:func:`_event_names`), and what its debug events
    log, as ExecuTorch logs it (:func:`_logged`); per instruction whose logged values the
    load-time rewrites leave unwritten (outputs nothing reads, the intermediates of a
    fused instruction), the instructions to run again, as the file says, to compute them
    (:meth:`recompute`)."""

    def __init__(self, state: MethodState) -> None:
        self.names: dict[tuple[int, int], tuple[str, ...]] = {}
        self.logged: dict[tuple[int, int], list[int | tuple[int, ...]]] = {}
        # head of a group -> the steps whose loaded statements compute the group's values
        self.groups: dict[tuple[int, int], tuple[Step, ...]] = {}
        self._runs: dict[tuple[int, int], Callable[[list[Any]], Any]] = {}
        self._sources = Sources(f"{state.name} ETDump values")
        values = state.plan.values
        for chain in steps_of(state):
            for step in chain:
                key = (step.chain, step.index)
                ins = state.chains[step.chain].instructions[step.index]
                prim = step.name.startswith("executorch_prim::") or step.name in _PRIM
                self.names[key] = _event_names(step, prim)
                self.logged[key] = [] if prim else _logged(values, ins, step)
            for k, step in enumerate(chain):
                executed = step.statement
                if executed is FUSED_AWAY or executed.code.strip() == "pass":
                    continue
                group = [step]
                if is_fused(executed):
                    group += itertools.takewhile(
                        lambda s: s.statement is FUSED_AWAY, chain[k + 1 :]
                    )
                # outputs the executed statement does not write are computed again by
                # the loaded statements, which only pure ones may be (dataflow prunes
                # nothing else): run again, a random kernel would draw other numbers
                unwritten = any(o not in step.writes for s in group for o in s.loaded.outs)
                if unwritten and all(s.loaded.pure for s in group):
                    self.groups[(step.chain, step.index)] = tuple(group)

    def recompute(self, group: tuple[Step, ...], v: list[Any]) -> dict[int, Any]:
        """Run ``group``'s loaded statements on a copy of the values table ``v`` whose
        outputs are new tensors (the program's memory is left as it is); the values the
        head's executed statement did not write, by index."""
        tmp = list(v)
        head = group[0]
        for step in group:
            for o in step.loaded.outs:
                x = v[o]
                if isinstance(x, torch.Tensor):
                    tmp[o] = torch.empty_strided(
                        x.shape, x.stride(), dtype=x.dtype, device=x.device
                    )
        for step in group:
            self._run(step)(tmp)
        return {o: tmp[o] for step in group for o in step.loaded.outs if o not in head.writes}

    def _run(self, step: Step) -> Callable[[list[Any]], Any]:
        key = (step.chain, step.index)
        fn = self._runs.get(key)
        if fn is None:
            what = f"chain {step.chain} instruction {step.index}"
            fn = compile_statement(step.loaded, False, self._sources, what)
            self._runs[key] = fn
        return fn


# the operators ExecuTorch registers as prim ops: no generated wrapper, nothing logged
_PRIM = frozenset(PRIM_OPS) | {"aten::sym_stride.int"}

# ExecuTorch's names of the instructions it times without a kernel wrapper of its own; a
# prim op's only event there is OPERATOR_CALL, which the Inspector leaves out of module
# totals and numeric gaps (named as the operator, a prim op, which logs no values, is
# paired with its graph node, and the numeric gap fails on its missing value)
_EXECUTORCH_NAMES = {
    "delegate": "DELEGATE_CALL",
    "move": "MOVE_CALL",
    "free": "FREE_CALL",
    "jump_false": "JF_CALL",
}
_OPERATOR_CALL = "OPERATOR_CALL"  # the event ExecuTorch's interpreter puts around any kernel

# namespaces whose kernels ExecuTorch registers through EXECUTORCH_LIBRARY, whose wrapper
# times a kernel under its registered name (``llama::update_cache.out``); the wrappers its
# codegen makes (every other kernel ExecuTorch runs) drop the namespace and prefix
# ``native_call_``
_REGISTERED_NAMES = frozenset({"llama"})

# kernels ExecuTorch registers by hand, as a boxed function that times itself under a name
# of its own (one function serves both names of the gated delta rule) and logs no value
_HAND_REGISTERED = {
    "llama::gated_delta_rule.out": "native_call_llama::gated_delta_rule.out",
    "llama::channelwise_gated_delta_rule.out": "native_call_llama::gated_delta_rule.out",
}


def _event_names(step: Step, prim: bool) -> tuple[str, ...]:
    """The names of the profiling events ExecuTorch writes for ``step``, innermost first:
    a kernel's wrapper event and ``OPERATOR_CALL`` around it; ``OPERATOR_CALL`` alone for
    a prim op (no wrapper); one event for any other instruction."""
    if step.kind != "kernel":
        return (_EXECUTORCH_NAMES.get(step.kind, step.name),)
    if prim:
        return (_OPERATOR_CALL,)
    hand = _HAND_REGISTERED.get(step.name)
    if hand is not None:
        return (hand, _OPERATOR_CALL)
    _, sep, operator = step.name.partition("::")
    if not sep or _registered(step):
        return (step.name, _OPERATOR_CALL)
    return (f"native_call_{operator}", _OPERATOR_CALL)


def _registered(step: Step) -> bool:
    """Whether ExecuTorch runs ``step``'s kernel through an EXECUTORCH_LIBRARY wrapper."""
    return step.kind == "kernel" and step.name.partition("::")[0] in _REGISTERED_NAMES


def _logged(
    values: tuple[p.EValue, ...], ins: p.Instruction, step: Step
) -> list[int | tuple[int, ...]]:
    """What ExecuTorch logs for instruction ``ins`` (``step``, run by ``step.loaded``,
    its statement as its kernel made it), one debug event each: a value index, or the
    items of a tensor list logged whole. A kernel's generated wrapper logs each of its
    ``out`` arguments, in order: a ``Tensor[]`` argument as one list, each ``Tensor`` on
    its own (the value the emitter appends for the kernel's return, a list of those outs
    or the one out again, is not logged twice); an EXECUTORCH_LIBRARY wrapper logs its
    last argument, the ``out`` (``llama::update_cache.out``'s too, which the kernel leaves
    unwritten: it updates ``cache``); a kernel registered by hand (the gated delta rule)
    logs nothing; a delegate call logs every argument; jumps, moves and frees log
    nothing."""
    if isinstance(ins, p.DelegateCall):
        return [
            tuple(v.items) if isinstance(v, p.TensorList) else a
            for a, v in ((a, values[a]) for a in ins.args)
        ]
    if not isinstance(ins, p.KernelCall) or step.name in _HAND_REGISTERED:
        return []
    loaded = step.loaded
    if _registered(step) and ins.args:
        return [ins.args[-1]]  # the return the emitter appends: the out argument again
    outs = set(loaded.outs) or set(effects(values, ins, loaded).written)
    logged: list[int | tuple[int, ...]] = []
    covered: set[int] = set()
    for a in ins.args:
        v = values[a]
        if isinstance(v, p.TensorList) and v.items and outs.issuperset(v.items):
            if not covered.issuperset(v.items):
                logged.append(tuple(v.items))
                covered.update(v.items)
        elif a in outs and a not in covered:
            logged.append(a)
            covered.add(a)
    return logged


_layout = Kept(_Layout)  # made once per method


class _Recorder(Hooks):
    """The hooks of one recorded call: a profiling event per instruction, a debug event
    per value it wrote (with a debug buffer), ``Method::execute`` around them all."""

    nodes = True  # delegates' operators, as ExecuTorch's backends log them

    def __init__(self, method: Method, layout: _Layout, buffer: DebugBuffer | None) -> None:
        self.method = method
        self.layout = layout
        self.buffer = buffer
        self.events: list[Event] = []
        self.sync = False
        self.t0 = 0
        self.start = 0
        self.step: Step | None = None
        # (chain, index, value) -> the value computed for that instruction's debug event
        self.pending: dict[tuple[int, int, int], Any] = {}

    def begin(self, v: list[Any]) -> None:
        self.sync = any(isinstance(x, torch.Tensor) and x.is_cuda for x in v)
        if self.sync:
            torch.cuda.synchronize()
        self.start = time.perf_counter_ns()

    def before(self, step: Step, v: list[Any]) -> None:
        self.step = step
        self.t0 = time.perf_counter_ns()

    def node(self, name: str, start: int, end: int) -> None:
        # as ExecuTorch's XNNPACK backend logs its operators: no name, the node named by
        # delegate_debug_id_str, the delegate call's chain and instruction, empty metadata
        step = self.step
        if step is not None:
            self.events.append(
                ProfileEvent(None, step.chain, step.index, start, end, -1, name, b"")
            )

    def after(self, step: Step, v: list[Any], result: Any) -> None:
        if self.sync:
            torch.cuda.synchronize()
        t1 = time.perf_counter_ns()
        key = (step.chain, step.index)
        self._log(step, key, v)
        # as ExecuTorch writes them: the values first, then the profiling events as their
        # scopes close, innermost first; the instruction's own event spans its work, the
        # OPERATOR_CALL around a kernel also the recording of its values
        *inner, outer = self.layout.names[key]
        for name in inner:
            self.events.append(ProfileEvent(name, step.chain, step.index, self.t0, t1))
        t2 = time.perf_counter_ns() if outer == _OPERATOR_CALL else t1
        self.events.append(ProfileEvent(outer, step.chain, step.index, self.t0, t2))

    def _log(self, step: Step, key: tuple[int, int], v: list[Any]) -> None:
        """The debug events of ``step``'s logged values (none without a debug buffer)."""
        buffer = self.buffer
        if buffer is None:
            return
        events = self.events
        what = f"instruction {step.index} ({step.name}) of '{self.method.name}'"
        layout = self.layout
        group = layout.groups.get(key)
        if group is not None:  # values the rewrites left unwritten, computed for the dump
            for s, (j, x) in itertools.product(group, layout.recompute(group, v).items()):
                if j in s.loaded.outs:
                    self.pending[(s.chain, s.index, j)] = x
        pending = self.pending

        def value(j: int) -> Any:
            return pending.pop((step.chain, step.index, j), v[j])

        for entry in layout.logged[key]:
            if isinstance(entry, int):
                data: Any = _data(buffer, value(entry), what)
                events.append(DebugEvent(step.chain, step.index, Value.of(data)))
                continue
            items = [value(j) for j in entry]
            if all(_storable(x) for x in items):
                data = tuple(buffer.store(x, what) for x in items)
                events.append(DebugEvent(step.chain, step.index, Value.of(data)))
            else:  # a list with items the schema cannot describe: one by one
                for x in items:
                    data = _data(buffer, x, what)
                    events.append(DebugEvent(step.chain, step.index, Value.of(data)))

    def end(self, v: list[Any]) -> None:
        self.events.append(
            ProfileEvent("Method::execute", -1, 0, self.start, time.perf_counter_ns())
        )

    def outputs(self, outputs: Sequence[Any]) -> None:
        if self.buffer is None:
            return
        for k, out in enumerate(outputs):
            what = f"output {k} of '{self.method.name}'"
            entry = Value.of(_data(self.buffer, out, what), output=True)
            self.events.append(DebugEvent(RUN_OUTPUT_CHAIN, 0, entry))


class ETDumpRecorder:
    """Records calls as ETDump runs (see the module docstring). ``debug_buffer_size``: 0
    records timings only; more also records every intermediate value and output, in a
    debug buffer of at most that many bytes."""

    def __init__(self, debug_buffer_size: int = 0) -> None:
        self._buffer = DebugBuffer(debug_buffer_size)
        self._runs: list[RunData] = []
        self._lock = threading.Lock()

    @property
    def debug_buffer_size(self) -> int:
        return self._buffer.capacity

    @property
    def runs(self) -> tuple[RunData, ...]:
        """The runs recorded since the last :meth:`write` (or :meth:`clear`)."""
        return tuple(self._runs)

    def record_load(self, start: int, init_start: int, init_end: int, end: int) -> None:
        """Record a method load as ExecuTorch does (a ``"Default"`` run with
        ``Program::load_method`` from ``start`` to ``end`` around ``Method::init``);
        times from :func:`time.perf_counter_ns`."""
        with self._lock:
            self._runs.append(
                RunData(
                    "Default",
                    (
                        ProfileEvent("Method::init", -1, 0, init_start, init_end),
                        ProfileEvent("Program::load_method", -1, 0, start, end),
                    ),
                )
            )

    def execute(
        self,
        method: Method,
        inputs: Sequence[Any] = (),
        *,
        bundled_input_index: int = -1,
        transfers: str | None = None,
        layout: str | None = None,
    ) -> list[Any]:
        """Call ``method`` on ``inputs`` (checked and bound as by :meth:`Method.execute`)
        and record the call; returns the outputs (copies)."""
        buffer = self._buffer if self._buffer.capacity > 0 else None
        hooks = _Recorder(method, _layout(method.state), buffer)
        with self._lock:
            mark = self._buffer.used
            try:
                outputs = method.run_with(hooks, inputs, transfers=transfers, layout=layout)
                hooks.outputs(outputs)
            except BaseException:
                self._buffer.truncate(mark)
                raise
            self._runs.append(RunData("Execute", tuple(hooks.events), bundled_input_index))
        return outputs

    # -- results -------------------------------------------------------------------------
    def etdump(self) -> ETDump:
        """Everything recorded since the last write, as an ETDump."""
        with self._lock:
            return ETDump(tuple(self._runs))

    def debug_buffer(self) -> bytes:
        """The debug buffer's bytes (what the debug events' offsets refer to)."""
        with self._lock:
            return self._buffer.getvalue()

    def write(
        self,
        etdump_path: str | os.PathLike[str],
        debug_buffer_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """Write the ETDump (and, with a debug buffer, its bytes to ``debug_buffer_path``),
        then clear what was recorded. Each file is written as ``open(path, "wb")`` writes
        it, but atomically (:func:`ptexec.files.write_together`), the debug buffer first: a
        failed write leaves both files as they were and keeps what was recorded. A ``debug_buffer_path`` without a debug buffer
        (``debug_buffer_size=0``) writes no such file and warns: ExecuTorch's scripts pass
        both paths whatever the size, and its runtime accepts that silently."""
        if debug_buffer_path is not None and self._buffer.capacity == 0:
            warnings.warn(
                f"no debug buffer written to {os.fspath(debug_buffer_path)!r}: the program "
                "was loaded with debug_buffer_size=0, so no values were recorded (load it "
                "with enable_etdump=True and a debug_buffer_size in bytes to record them)",
                UserWarning,
                stacklevel=2,
            )
        with self._lock:
            files: list[tuple[str | os.PathLike[str], bytes]] = []
            # the buffer first: an ETDump in place always has the buffer its offsets name
            if debug_buffer_path is not None and self._buffer.capacity > 0:
                files.append((debug_buffer_path, self._buffer.getvalue()))
            files.append((etdump_path, encode_etdump(ETDump(tuple(self._runs)))))
            write_together(files)
            self._runs.clear()
            self._buffer.truncate(0)

    def clear(self) -> None:
        """Forget every recorded run and value."""
        with self._lock:
            self._runs.clear()
            self._buffer.truncate(0)


def _storable(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in DTYPE_TO_CODE


def _data(buffer: DebugBuffer, x: Any, what: str) -> Any:
    """What a debug event records for value ``x``: a tensor in the buffer, a number, or
    None (a value the schema cannot describe)."""
    if isinstance(x, torch.Tensor):
        return buffer.store(x, what) if x.dtype in DTYPE_TO_CODE else None
    if isinstance(x, bool | int | float):
        return x
    return None
