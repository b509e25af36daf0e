"""Where a call's time goes: per instruction, per operator, and as a Chrome trace.

A profile is a set of hooks on calls made through the method's own envelope
(:meth:`ptexec.Method.run_with`, the instrumented variant of the blocks ``execute`` runs):
it reads a clock before and after every instruction; on CUDA it synchronizes the device after each one, so an
instruction's time is its kernels' time, not their launch. The plain ``execute`` is timed
too, interleaved, so the table says what the instrumentation itself costs.

    prof = method.profile([x], repeat=20)
    print(prof.table())                        # operators by total time
    print(prof.table(by="instruction"))
    prof.save_chrome_trace("trace.json")       # open in Perfetto or chrome://tracing

The Chrome trace has one complete ("X") event per executed instruction (name: the
operator; args: its index and the shapes of its tensors), in three tracks: the call's
phases (bind inputs, run, collect outputs), the instructions, and device copies
(``et_copy::*`` instructions, and input binding when it copies).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .engine.hooks import Hooks, Step

if TYPE_CHECKING:
    from .method import Method

__all__ = ["Event", "OperatorRow", "Profile", "profile"]

_TRACKS = {"call": 0, "instructions": 1, "device copies": 2}


@dataclass(frozen=True, slots=True)
class Event:
    """One timed span: an executed instruction or a phase of a call (times in ns from the
    profile's start)."""

    name: str
    category: str  # kernel, delegate, move, free, jump_false, device_copy, phase, binding
    start: int
    duration: int
    call: int  # which repetition
    chain: int = -1
    index: int = -1  # instruction index, -1 for a phase
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def track(self) -> str:
        if self.category in ("device_copy", "binding"):
            return "device copies"
        return "call" if self.index < 0 else "instructions"


@dataclass(frozen=True, slots=True)
class OperatorRow:
    """Time of one operator (or one instruction): ``count`` executions per call, ``total``
    seconds per call (median over the calls), ``mean`` per execution (``total / count``),
    ``min`` the fastest execution, ``share`` of all instruction time."""

    name: str
    count: float
    total: float
    mean: float
    min: float
    share: float
    index: int = -1
    chain: int = 0


@dataclass
class Profile:
    """The timings of ``calls`` instrumented calls of a method (see the module docstring).

    ``events``: every timed span; ``call_times``: wall time of each instrumented call;
    ``execute_times``: wall time of plain ``execute`` calls, interleaved with them
    (seconds); ``outputs``: the last call's outputs.
    """

    method: str
    calls: int
    events: list[Event]
    call_times: list[float]
    execute_times: list[float]
    synchronized: bool
    outputs: list[Any] = field(default_factory=list)

    # -- tables --------------------------------------------------------------------------
    def _instruction_events(self) -> list[Event]:
        return [e for e in self.events if e.index >= 0]

    @property
    def instruction_time(self) -> float:
        """Seconds spent in instructions per call (median over the calls)."""
        per_call = [0] * max(self.calls, 1)
        for e in self._instruction_events():
            per_call[e.call] += e.duration
        return statistics.median(per_call) / 1e9

    def by_operator(self) -> list[OperatorRow]:
        """Operators (and delegates, moves, jumps) by time per call, largest first."""
        return self._rows(lambda e: (e.name, -1, 0))

    def by_instruction(self) -> list[OperatorRow]:
        """Instructions by time per call, largest first."""
        return self._rows(lambda e: (e.name, e.index, e.chain))

    def _rows(self, key: Callable[[Event], tuple[str, int, int]]) -> list[OperatorRow]:
        """Per group: executions per call, time per call (the median over the calls, so
        one stalled call does not decide it), mean and fastest execution, share."""
        calls = max(self.calls, 1)
        per_call: dict[tuple[str, int, int], list[int]] = {}
        durations: dict[tuple[str, int, int], list[int]] = {}
        for e in self._instruction_events():
            k = key(e)
            per_call.setdefault(k, [0] * calls)[e.call] += e.duration
            durations.setdefault(k, []).append(e.duration)
        totals = {k: statistics.median(v) / 1e9 for k, v in per_call.items()}
        grand = sum(totals.values()) or 1.0
        rows = []
        for k, d in durations.items():
            count = len(d) / calls
            rows.append(
                OperatorRow(
                    k[0],
                    count,
                    totals[k],
                    totals[k] / count if count else 0.0,
                    min(d) / 1e9,
                    totals[k] / grand,
                    k[1],
                    k[2],
                )
            )
        rows.sort(key=lambda r: -r.total)
        return rows

    def table(self, by: str = "operator", top: int | None = None) -> str:
        """A text table, ``by`` ``"operator"`` or ``"instruction"``, largest first."""
        if by not in ("operator", "instruction"):
            raise ValueError(f"by must be 'operator' or 'instruction', not {by!r}")
        rows = self.by_operator() if by == "operator" else self.by_instruction()
        shown = rows if top is None else rows[:top]
        label = "operator" if by == "operator" else "instruction"
        # how ptexec runs an instruction when not as the file says (fused with the next
        # ones: their time is its own; folded at load: nothing left to time)
        notes = {(e.chain, e.index): e.args["note"] for e in self.events if "note" in e.args}
        lines = [f"{label:<52} {'calls':>6} {'total':>10} {'mean':>10} {'min':>10} {'share':>7}"]
        for r in shown:
            name = r.name if by == "operator" else f"{r.index:>4}  {r.name}"
            if len(name) > 52:
                name = name[:51] + "~"
            lines.append(
                f"{name:<52} {_count(r.count):>6} {_t(r.total):>10} {_t(r.mean):>10} "
                f"{_t(r.min):>10} {r.share * 100:>6.1f}%"
            )
            note = notes.get((r.chain, r.index)) if by == "instruction" else None
            if note:
                lines.append(f"        ({note})")
        if top is not None and len(rows) > top:
            lines.append(f"... {len(rows) - top} more")
        lines.append(self.summary())
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: instruction time, instrumented and plain call times."""
        text = (
            f"'{self.method}', {self.calls} call(s): instructions {_t(self.instruction_time)} "
            f"per call; instrumented call {_t(_median(self.call_times))}"
        )
        if self.execute_times:
            text += f"; plain execute {_t(_median(self.execute_times))} (median)"
        if self.synchronized:
            text += "; CUDA synchronized after each instruction"
        return text

    def __str__(self) -> str:
        return self.table()

    # -- Chrome trace --------------------------------------------------------------------
    def chrome_trace(self) -> dict[str, Any]:
        """The profile in the Trace Event Format (``{"traceEvents": [...]}``) that Perfetto
        and chrome://tracing open: one "X" event per span, times in microseconds."""
        pid = os.getpid()
        events: list[dict[str, Any]] = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"ptexec '{self.method}'"},
            },
        ]
        for track, tid in _TRACKS.items():
            events.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": track}}
            )
            events.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        for e in self.events:
            args = dict(e.args)
            args["call"] = e.call
            if e.index >= 0:
                args["instruction"] = e.index
                if e.chain:
                    args["chain"] = e.chain
            events.append(
                {
                    "name": e.name,
                    "cat": e.category,
                    "ph": "X",
                    "ts": e.start / 1e3,
                    "dur": e.duration / 1e3,
                    "pid": pid,
                    "tid": _TRACKS[e.track],
                    "args": args,
                }
            )
        return {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {"method": self.method, "calls": self.calls, "tool": "ptexec"},
        }

    def save_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`chrome_trace` as JSON to ``path``."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _count(c: float) -> str:
    return str(int(c)) if c == int(c) else f"{c:.2f}"


def _t(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def _describe(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
    if isinstance(x, list | tuple):
        return [_describe(i) for i in x]
    return repr(x) if not isinstance(x, int | float | bool | str | type(None)) else x


def _uses_cuda(v: list[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in v)


class _Timer(Hooks):
    def __init__(self, method: Method, origin: int, sync: bool | None) -> None:
        self.method = method
        self.origin = origin
        self.sync = sync
        self.synchronized = False
        self.events: list[Event] = []
        self.call = 0
        self.t0 = 0
        self.phase_name: str | None = None
        self.phase_start = 0

    def phase(self, name: str) -> None:
        now = time.perf_counter_ns()
        if self.phase_name is not None:
            label = {"bind": "bind inputs", "run": "run", "collect": "collect outputs"}
            self.events.append(
                Event(
                    label.get(self.phase_name, self.phase_name),
                    "phase",
                    self.phase_start - self.origin,
                    now - self.phase_start,
                    self.call,
                )
            )
            if self.phase_name == "bind":
                rec = self.method.last_call
                if rec.copies:
                    self.events.append(
                        Event(
                            "copy inputs",
                            "binding",
                            self.phase_start - self.origin,
                            now - self.phase_start,
                            self.call,
                            args={"actions": list(rec.inputs), "bytes": rec.bytes_copied},
                        )
                    )
        self.phase_name = None if name == "end" else name
        self.phase_start = time.perf_counter_ns()

    def begin(self, v: list[Any]) -> None:
        self.phase("run")
        sync = self.sync if self.sync is not None else _uses_cuda(v)
        self.synchronized = sync
        if sync:
            torch.cuda.synchronize()

    def end(self, v: list[Any]) -> None:
        self.phase("collect")

    def before(self, step: Step, v: list[Any]) -> None:
        self.t0 = time.perf_counter_ns()

    def after(self, step: Step, v: list[Any], result: Any) -> None:
        if self.synchronized:
            torch.cuda.synchronize()
        t1 = time.perf_counter_ns()
        shapes = [_describe(v[a]) for a in step.tensor_args]
        args: dict[str, Any] = {"shapes": shapes}
        category = "device_copy" if step.is_copy else step.kind
        if step.is_copy and step.writes:
            out = v[step.writes[0]]
            if isinstance(out, torch.Tensor):
                args["bytes"] = out.nbytes
                args["to"] = str(out.device)
        if step.note:
            args["note"] = step.note
        if step.destination is not None:
            args["jumped"] = not result
        self.events.append(
            Event(
                step.name,
                category,
                self.t0 - self.origin,
                t1 - self.t0,
                self.call,
                step.chain,
                step.index,
                args,
            )
        )


def profile(
    method: Method,
    inputs: Sequence[Any] = (),
    *,
    repeat: int = 10,
    warmup: int = 1,
    sync: bool | None = None,
    compare: bool = True,
    transfers: str | None = None,
    layout: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Profile:
    """Time ``repeat`` instrumented calls of ``method`` on ``inputs`` (after ``warmup`` plain
    ones). ``sync``: synchronize CUDA after each instruction (default: when the call
    touches CUDA memory). ``compare``: also time a plain ``execute`` before each
    instrumented call. ``progress(done, repeat)`` is called after each call. Programs with
    state advance it with every call, as they would under ``execute``."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    options: dict[str, Any] = {}
    if transfers is not None:
        options["transfers"] = transfers
    if layout is not None:
        options["layout"] = layout
    for _ in range(warmup):
        method.execute(inputs, **options)
    timer = _Timer(method, time.perf_counter_ns(), sync)
    call_times: list[float] = []
    execute_times: list[float] = []
    outputs: list[Any] = []
    cuda = torch.cuda.is_available()
    for k in range(repeat):
        if compare:
            t = time.perf_counter()
            method.execute(inputs, **options)
            if cuda:
                torch.cuda.synchronize()
            execute_times.append(time.perf_counter() - t)
        timer.call = k
        t = time.perf_counter()
        timer.phase("bind")
        try:
            outputs = method.run_with(timer, inputs, transfers=transfers, layout=layout)
        finally:
            timer.phase("end")
        if cuda:
            torch.cuda.synchronize()
        call_times.append(time.perf_counter() - t)
        if progress is not None:
            progress(k + 1, repeat)
    return Profile(
        method.name, repeat, timer.events, call_times, execute_times, timer.synchronized, outputs
    )
