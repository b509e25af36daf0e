"""See inside a call: one record per executed instruction, a float64 reference, NaN hunting.

A trace is a set of hooks (:class:`ptexec.engine.hooks.Hooks`) on one call made through
the method's own envelope (:meth:`ptexec.Method.run_with`): the instrumented variant of
the very blocks ``execute`` runs calls them around every instruction, so a trace computes
exactly what ``execute`` computes, with the same validation, binding, errors and limits.

    tr = method.trace([x])                     # records: what each instruction wrote
    tr = method.trace([x], tensors=True)       # ... and a copy of every tensor written
    tr = method.trace([x], reference=True)     # error of each result against float64
    tr = method.trace([x], stop_on="nan")      # stop at the first NaN; tr.stopped says where
    print(tr)                                  # a table

Instructions that the load-time rewrites (:mod:`ptexec.loader.dataflow`) made free still
show, marked ``folded at load`` or ``view made at load``, with the values they hold. Load
with ``optimize=False`` to trace the program exactly as the file says. The float64
reference is :mod:`ptexec.shadow`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from .engine.hooks import Hooks, Step, StopCall
from .shadow import Shadow, shadow_of
from .stats import RefError, TensorStats, compare, short_number, summarize

if TYPE_CHECKING:
    from .method import Method

__all__ = [
    "InstructionRecord",
    "RefError",
    "TensorStats",
    "Trace",
    "ValueRecord",
    "summarize",
    "trace",
]

StopOn = Literal["nan", "inf", "nonfinite"]


# --------------------------------------------------------------------------------------
# records


@dataclass(slots=True)
class ValueRecord:
    """One value an instruction wrote (or read): its index in the method's values table,
    its summary (tensors) or value (scalars), and, on request, the tensor itself and its
    float64 reference."""

    index: int
    stats: TensorStats | None = None
    value: Any = None
    error: RefError | None = None
    reference: Any = None

    def __str__(self) -> str:
        if self.stats is not None:
            return f"v{self.index} = {self.stats}"
        return f"v{self.index} = {self.value!r}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.stats is not None:
            out["tensor"] = self.stats.to_dict()
        else:
            out["value"] = self.value if _jsonable(self.value) else repr(self.value)
        if self.error is not None:
            out["error"] = self.error.to_dict()
        return out


def _jsonable(x: Any) -> bool:
    if x is None or isinstance(x, bool | int | str):
        return True
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, list | tuple):
        return all(_jsonable(i) for i in x)
    return False


@dataclass(slots=True)
class InstructionRecord:
    """One executed instruction.

    ``step``: its position in the run; ``chain``/``index``: where it is in the program;
    ``kind``: ``kernel``, ``delegate``, ``move``, ``free`` or ``jump_false``; ``name``: the
    operator (``aten::add.out``), ``delegate:<id>`` or the kind; ``frame``: the source line
    when the program carries stack traces; ``note``: how ptexec runs it when not as the
    file says (``folded at load``, ``view made at load``, ``runs as a view``,
    ``copies a view made once``, ``runs with the next ones as one``, ``done by a fused
    instruction before it``: it writes nothing);
    ``writes``: what it wrote; ``reads``: what it read, as it was before it ran (recorded
    for the instruction a NaN hunt stops at, or for all with ``reads=True``); ``jumped``: for
    a jump, whether it jumped (to ``destination``); ``reference_note``: where the float64
    reference could not follow.
    """

    step: int
    chain: int
    index: int
    kind: str
    name: str
    frame: str | None = None
    note: str | None = None
    writes: list[ValueRecord] = field(default_factory=list)
    reads: list[ValueRecord] | None = None
    jumped: bool | None = None
    destination: int | None = None
    reference_note: str | None = None

    @property
    def error(self) -> RefError | None:
        """The worst error among the values it wrote (reference runs): a mismatched
        element (a NaN or Inf where the reference is finite, or the reverse) before any
        finite error, then the largest relative error (:attr:`RefError.rank`)."""
        worst: RefError | None = None
        for w in self.writes:
            e = w.error
            if e is not None and e.note is None and (worst is None or e.rank > worst.rank):
                worst = e
        return worst

    def __str__(self) -> str:
        head = f"[{self.step}] instruction {self.index} {self.name}"
        if self.chain:
            head = f"[{self.step}] chain {self.chain} instruction {self.index} {self.name}"
        if self.note:
            head += f" ({self.note})"
        lines = [head]
        if self.frame:
            lines.append(f"    at {self.frame}")
        if self.jumped is not None:
            lines.append(f"    jumped to {self.destination}" if self.jumped else "    fell through")
        for r in self.reads or ():
            lines.append(f"    read  {r}")
        for w in self.writes:
            lines.append(f"    wrote {w}" + (f"  err {w.error}" if w.error is not None else ""))
        if self.reference_note:
            lines.append(f"    reference: {self.reference_note}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            "chain": self.chain,
            "index": self.index,
            "kind": self.kind,
            "name": self.name,
            "frame": self.frame,
            "note": self.note,
            "writes": [w.to_dict() for w in self.writes],
        }
        if self.reads is not None:
            out["reads"] = [r.to_dict() for r in self.reads]
        if self.jumped is not None:
            out["jumped"] = self.jumped
            out["destination"] = self.destination
        if self.reference_note:
            out["reference_note"] = self.reference_note
        return out


@dataclass
class Trace:
    """What one traced call did.

    ``outputs``: the call's outputs (None when a NaN hunt stopped it); ``records``: one
    :class:`InstructionRecord` per executed instruction, in order; ``stopped``: the record
    a ``stop_on`` hunt stopped at, and ``reason`` why; ``reference_outputs``: the float64
    reference's outputs (reference runs); ``num_instructions``: instructions per chain.
    """

    method: str
    outputs: list[Any] | None
    records: list[InstructionRecord]
    num_instructions: list[int]
    stopped: InstructionRecord | None = None
    reason: str | None = None
    reference_outputs: list[Any] | None = None
    reference: bool = False

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Any:
        return iter(self.records)

    @property
    def executed(self) -> list[set[int]]:
        """Per chain, the instructions that ran at least once."""
        ran: list[set[int]] = [set() for _ in self.num_instructions]
        for r in self.records:
            ran[r.chain].add(r.index)
        return ran

    @property
    def skipped(self) -> list[list[int]]:
        """Per chain, the instructions that did not run (control flow, or a stopped hunt)."""
        return [
            [i for i in range(n) if i not in ran]
            for n, ran in zip(self.num_instructions, self.executed, strict=True)
        ]

    def worst(self, n: int = 5) -> list[InstructionRecord]:
        """The ``n`` instructions with the worst errors against the reference, worst first:
        those with mismatched elements (a NaN or Inf on one side only) before the largest
        relative errors (:attr:`InstructionRecord.error`)."""
        scored = [(r, r.error) for r in self.records]
        ranked = [(r, e) for r, e in scored if e is not None and e.is_error]
        ranked.sort(key=lambda pair: pair[1].rank, reverse=True)
        return [r for r, _ in ranked[:n]]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors recorded with ``tensors=True``, as ``{"<step>:v<index>": tensor}``."""
        return {
            f"{r.step}:v{w.index}": w.value
            for r in self.records
            for w in r.writes
            if isinstance(w.value, torch.Tensor)
        }

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method,
            "num_instructions": self.num_instructions,
            "executed": len(self.records),
            "skipped": self.skipped,
            "stopped": None if self.stopped is None else self.stopped.to_dict(),
            "reason": self.reason,
            "records": [r.to_dict() for r in self.records],
        }
        if self.reference:  # the records' steps, worst first, as :meth:`worst` ranks them
            out["worst"] = [r.step for r in self.worst(len(self.records))]
        return out

    def table(self, limit: int | None = None) -> str:
        """The records as a text table (``limit``: at most that many instructions)."""
        ref = self.reference
        records = self.records if limit is None else self.records[:limit]
        wn = min(max((len(r.name) for r in records), default=8), 38)
        wt = min(
            max((len(w.stats.describe()) for r in records for w in r.writes if w.stats), default=6),
            24,
        )
        head = f"{'step':>5} {'ins':>4}  {'operator':<{wn}} {'value':>6}  {'tensor':<{wt}}"
        head += f" {'min':>10} {'max':>10} {'mean':>10} {'nan':>4} {'inf':>4}"
        if ref:
            head += f"  {'abs err':>9} {'rel err':>9}"
        lines = [head]
        for r in records:
            name = r.name if len(r.name) <= wn else r.name[: wn - 1] + "~"
            prefix = f"{r.step:>5} {r.index:>4}  {name:<{wn}}"
            extra = r.note or ""
            if r.jumped is not None:
                extra = f"jumped to {r.destination}" if r.jumped else "fell through"
            if not r.writes:
                lines.append(f"{prefix} {'':>6}  {extra}".rstrip())
            for k, w in enumerate(r.writes):
                first = prefix if k == 0 else " " * len(prefix)
                line = f"{first} {'v' + str(w.index):>6}  "
                s = w.stats
                if s is None:
                    line += f"{_short(w.value, wt):<{wt}}" + " " * 43
                else:
                    line += f"{_short(s.describe(), wt):<{wt}} {short_number(s.min):>10} "
                    line += f"{short_number(s.max):>10} {short_number(s.mean):>10} {s.nan or '':>4} {s.inf or '':>4}"
                if ref:
                    e = w.error
                    if e is None:
                        line += " " * 21
                    elif e.note:
                        line += f"  {e.note}"
                    elif e.mismatched:  # NaN or Inf on one side only: no finite error says it
                        line += f"  {e.mismatched} mismatched"
                    else:
                        line += f"  {e.max_abs:>9.2e} {e.max_rel:>9.2e}"
                if k == 0 and extra:
                    line += f"  ({extra})"
                lines.append(line.rstrip())
            if r.frame:
                lines.append(" " * 12 + "at " + " ".join(r.frame.split()))
            if r.reference_note:
                lines.append(" " * 12 + f"reference: {r.reference_note}")
        if limit is not None and len(self.records) > limit:
            lines.append(f"... {len(self.records) - limit} more instruction(s)")
        skipped = sum(len(s) for s in self.skipped)
        lines.append(
            f"{len(self.records)} instruction(s) executed"
            + (f", {skipped} not run" if skipped else "")
        )
        if self.stopped is not None:
            lines.append(f"stopped: {self.reason}")
            lines.append(str(self.stopped))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _short(x: Any, width: int) -> str:
    text = x if isinstance(x, str) else repr(x)
    return text if len(text) <= width else text[: width - 1] + "~"


# --------------------------------------------------------------------------------------
# tracing


_NO_REFERENCE = RefError(0.0, 0.0, None, 0, "no reference (the program's value)")
"""The error of a value the float64 reference took from the program (a random kernel's,
or one it cannot run): nothing to measure it against."""


class _Stop(StopCall):
    def __init__(self, record: InstructionRecord, reason: str) -> None:
        self.record = record
        self.reason = reason


def _is_bad(stats: TensorStats | None, stop_on: StopOn) -> bool:
    if stats is None:
        return False
    if stop_on == "nan":
        return stats.nan > 0
    if stop_on == "inf":
        return stats.inf > 0
    return stats.nan > 0 or stats.inf > 0


class _Recorder(Hooks):
    """The hooks of one traced call."""

    def __init__(
        self,
        method: Method,
        *,
        tensors: bool,
        reads: bool,
        stop_on: StopOn | None,
        shadow: Shadow | None,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.state = method.state
        self.tensors = tensors
        self.keep_reads = reads
        self.stop_on = stop_on
        self.shadow = shadow
        self.s: list[Any] | None = None
        self.progress = progress
        self.total = self.state.instruction_count()
        self.records: list[InstructionRecord] = []
        self.pending_reads: list[ValueRecord] | None = None
        self.reference_outputs: list[Any] | None = None

    def _value(self, j: int, x: Any, keep: bool) -> ValueRecord:
        if isinstance(x, torch.Tensor):
            rec = ValueRecord(j, summarize(x))
            if keep:
                rec.value = x.detach().clone()
            return rec
        return ValueRecord(j, None, x)

    def begin(self, v: list[Any]) -> None:
        if self.shadow is not None:
            self.s = self.shadow.start(self.state, v)

    def before(self, step: Step, v: list[Any]) -> None:
        if self.keep_reads or self.stop_on is not None:
            self.pending_reads = [self._value(j, v[j], False) for j in step.reads]

    def after(self, step: Step, v: list[Any], result: Any) -> None:
        rec = InstructionRecord(
            step=len(self.records),
            chain=step.chain,
            index=step.index,
            kind=step.kind,
            name=step.name,
            frame=step.frame,
            note=step.note,
            writes=[self._value(j, v[j], self.tensors) for j in step.writes],
        )
        if step.destination is not None:
            rec.jumped = not result
            rec.destination = step.destination
        if self.keep_reads:
            rec.reads = self.pending_reads
        if self.s is not None:
            self._reference(step, v, rec, result)
        self.records.append(rec)
        if self.progress is not None:
            self.progress(len(self.records), self.total)
        if self.stop_on is not None:
            bad = [w for w in rec.writes if _is_bad(w.stats, self.stop_on)]
            if bad:
                rec.reads = self.pending_reads
                what = {"nan": "NaN", "inf": "Inf", "nonfinite": "NaN or Inf"}[self.stop_on]
                values = ", ".join(f"v{w.index}" for w in bad)
                raise _Stop(
                    rec,
                    f"instruction {step.index} ({step.name}) wrote {what} to {values}",
                )

    def end(self, v: list[Any]) -> None:
        if self.s is not None:
            self.reference_outputs = [
                x.detach().clone() if isinstance(x, torch.Tensor) else x
                for x in (self.s[j] for j in self.state.plan.outputs)
            ]

    def _reference(self, step: Step, v: list[Any], rec: InstructionRecord, result: Any) -> None:
        s, shadow = self.s, self.shadow
        assert s is not None and shadow is not None
        record = self.state.record
        saved = record.bytes_copied if step.is_copy else None
        rec.reference_note, taken = shadow.step(step, v, s, result)
        if saved is not None:  # the reference's copies are not the call's
            record.h2h, record.h2d, record.d2h, record.d2d = (
                saved[k] for k in ("h2h", "h2d", "d2h", "d2d")
            )
        for w in rec.writes:
            ref = s[w.index]
            # a value the reference took from the program is not exact: it has no reference
            w.error = _NO_REFERENCE if w.index in taken else compare(v[w.index], ref)
            if self.tensors:
                w.reference = ref.detach().clone() if isinstance(ref, torch.Tensor) else ref


def trace(
    method: Method,
    inputs: Sequence[Any] = (),
    *,
    tensors: bool = False,
    reference: bool = False,
    stop_on: StopOn | None = None,
    reads: bool = False,
    transfers: str | None = None,
    layout: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Trace:
    """Call ``method`` on ``inputs`` and record each instruction it executes.

    ``tensors``: keep a copy of every tensor written (``ValueRecord.value``; with
    ``reference``, the float64 one in ``ValueRecord.reference``). ``reference``: run a
    float64 shadow in lockstep and give each written value its :class:`RefError`.
    ``stop_on``: ``"nan"``, ``"inf"`` or ``"nonfinite"``: stop after the first instruction
    that writes such a value (``Trace.stopped``; its inputs as they were before it ran are
    in ``reads``; ``outputs`` is None; the method is left as a failed call leaves it: what
    ran before the stop, mutable state included, stays written, and the next call runs as
    usual). ``reads``: record every instruction's inputs too.
    ``progress(done, total)`` is called after each instruction. Inputs are bound as by
    :meth:`Method.execute` (``transfers``, ``layout`` likewise); outputs are copies.
    """
    if stop_on not in (None, "nan", "inf", "nonfinite"):
        raise ValueError(f"stop_on must be 'nan', 'inf' or 'nonfinite', not {stop_on!r}")
    state = method.state
    shadow = shadow_of(state) if reference else None
    rec = _Recorder(
        method, tensors=tensors, reads=reads, stop_on=stop_on, shadow=shadow, progress=progress
    )
    counts = [len(c.instructions) for c in state.chains]
    try:
        outputs = method.run_with(rec, inputs, transfers=transfers, layout=layout)
    except _Stop as stop:
        return Trace(
            method.name, None, rec.records, counts, stop.record, stop.reason, None, reference
        )
    return Trace(
        method.name, outputs, rec.records, counts, None, None, rec.reference_outputs, reference
    )
