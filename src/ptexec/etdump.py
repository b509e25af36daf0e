"""ETDump of ptexec's calls, for ExecuTorch's devtools (``executorch.devtools.Inspector``).

An :class:`ETDumpRecorder` runs calls of a method and records, per call, one ETDump run
(``"Execute"``) with one profiling event per executed instruction (the operator's name
as ptexec's trace shows it, ``DELEGATE_CALL`` for a delegate call, as ExecuTorch names
it; start and end in nanoseconds of a monotonic clock), inside a delegate call one event
per node the delegate's runner reports (no name; the node in ``delegate_debug_id_str``,
as ExecuTorch's XNNPACK backend logs its operators: see
:meth:`~ptexec.engine.hooks.Hooks.node`), a ``Method::execute`` event around the
instructions, and, when it has a debug buffer, one debug event per value each
instruction wrote (the values ptexec's trace shows) and one per output of the call::

    from ptexec.etdump import ETDumpRecorder
    rec = ETDumpRecorder(debug_buffer_size=1 << 20)
    outputs = rec.execute(method, [x])         # as method.execute([x]), outputs are copies
    rec.write("run.etdp", "run.bin")           # then: Inspector(etdump_path="run.etdp",
                                               #   debug_buffer_path="run.bin", etrecord=...)

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
memory, so an instruction's time is its kernels'. Recorded calls of the methods sharing a
recorder are serialized. The writer (:mod:`ptexec.format.etdump`) needs neither torch nor
ExecuTorch.
"""

from __future__ import annotations

import numbers
import os
import threading
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .dtypes import DTYPE_TO_CODE
from .engine.hooks import Hooks, Step, steps_of
from .errors import LimitExceededError
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
        if offset + nbytes > self.capacity:
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
    """How one method's instructions are recorded: per (chain, index), the event name and
    the groups of written values that make its debug events (a tensor list an
    instruction writes whole is one event, as ExecuTorch logs it)."""

    def __init__(self, state: MethodState) -> None:
        self.names: dict[tuple[int, int], str] = {}
        self.groups: dict[tuple[int, int], list[int | tuple[int, ...]]] = {}
        for chain in steps_of(state):
            for step in chain:
                key = (step.chain, step.index)
                self.names[key] = "DELEGATE_CALL" if step.kind == "delegate" else step.name
                ins = state.chains[step.chain].instructions[step.index]
                self.groups[key] = _groups(state.plan.values, ins, step.writes)


def _groups(
    values: tuple[p.EValue, ...], ins: p.Instruction, writes: tuple[int, ...]
) -> list[int | tuple[int, ...]]:
    written = set(writes)
    lists: dict[int, tuple[int, ...]] = {}  # first item -> the whole written list
    covered: set[int] = set()
    if isinstance(ins, p.KernelCall | p.DelegateCall):
        for a in ins.args:
            v = values[a]
            if not isinstance(v, p.TensorList) or not v.items:
                continue
            items = tuple(v.items)
            if written.issuperset(items) and not covered.intersection(items):
                lists[items[0]] = items
                covered.update(items)
    groups: list[int | tuple[int, ...]] = []
    for w in writes:
        if w in lists:
            groups.append(lists[w])
        elif w not in covered:
            groups.append(w)
    return groups


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
        events = self.events
        events.append(ProfileEvent(self.layout.names[key], step.chain, step.index, self.t0, t1))
        buffer = self.buffer
        if buffer is None:
            return
        what = f"instruction {step.index} ({step.name}) of '{self.method.name}'"
        for group in self.layout.groups[key]:
            if isinstance(group, int):
                data: Any = _data(buffer, v[group], what)
                events.append(DebugEvent(step.chain, step.index, Value.of(data)))
            elif all(_storable(v[j]) for j in group):
                data = tuple(buffer.store(v[j], what) for j in group)
                events.append(DebugEvent(step.chain, step.index, Value.of(data)))
            else:  # a list with items the schema cannot describe: one by one
                for j in group:
                    data = _data(buffer, v[j], what)
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
        then clear what was recorded. A ``debug_buffer_path`` without a debug buffer
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
            data = encode_etdump(ETDump(tuple(self._runs)))
            with open(etdump_path, "wb") as f:
                f.write(data)
            if debug_buffer_path is not None and self._buffer.capacity > 0:
                with open(debug_buffer_path, "wb") as f:
                    f.write(self._buffer.getvalue())
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
