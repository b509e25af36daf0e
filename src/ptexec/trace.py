"""See inside a call: one record per executed instruction, a float64 reference, NaN hunting.

:meth:`Method.execute` runs compiled basic blocks and nothing else, so tracing costs it
nothing. A trace runs the same method through a second, instrumented interpreter: every
instruction's statement (the very :class:`~ptexec.kernels.registry.Emission` that
``execute`` runs) is compiled into a function of its own, and a program-counter loop runs
them with JumpFalseCall semantics and the instruction cap of the block compiler, calling
hooks before and after each one. Inputs are validated, bound and the outputs collected by
the method's own code, so a trace computes exactly what ``execute`` computes.

    tr = method.trace([x])                     # records: what each instruction wrote
    tr = method.trace([x], tensors=True)       # ... and a copy of every tensor written
    tr = method.trace([x], reference=True)     # error of each result against float64
    tr = method.trace([x], stop_on="nan")      # stop at the first NaN; tr.stopped says where
    print(tr)                                  # a table

Instructions that the load-time rewrites (:mod:`ptexec.dataflow`) made free still show,
marked ``folded at load`` or ``view made at load``, with the values they hold. Load with
``optimize=False`` to trace the program exactly as the file says.

**The float64 reference** is a shadow run in lockstep: a second values table in which
every floating tensor is float64, running the statements as the kernels made them (before
the rewrites, so folded work is recomputed in float64). Constants and inputs are the
program's, widened. ExecuTorch's memory plan gives some values the same bytes (a static
``view`` is a second value at the same offset, read but never written), so the shadow's
planned memory keeps the plan's layout: each shadow buffer is the program's buffer with
every byte offset multiplied by ``8 / s`` (``s`` the narrowest floating element size in
that buffer), which maps a floating tensor of the narrowest size onto exactly the widened
bytes, keeps every value planned at the same offset at the same place, and keeps values
that do not overlap in the plan apart. The shadow starts each call from the program's
state (mutable buffers widened) and follows the program's branches. A statement that
cannot run in float64 (a kernel or delegate that insists on its own dtypes) runs on the
shadow's values narrowed to the program's dtypes, and its results are widened again; if
even that fails, the shadow takes the program's results. Either is noted on the record.
"""

from __future__ import annotations

import itertools
import linecache
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from .dtypes import dtype_name
from .errors import ExecutionError, LimitExceededError
from .format import program as p
from .kernels.registry import Emission
from .memory import BufferInfo, allocate, resize_to, strided_view

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
# summaries


@dataclass(frozen=True, slots=True)
class TensorStats:
    """A tensor in numbers: shape, dtype, device, and min/max/mean over its finite
    elements (None when it has none), with its NaN and Inf counts."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    min: float | None
    max: float | None
    mean: float | None
    nan: int = 0
    inf: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def finite(self) -> bool:
        return not self.nan and not self.inf

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)}[{', '.join(str(s) for s in self.shape)}]"

    def __str__(self) -> str:
        text = f"{self.describe()} on {self.device}"
        if self.min is not None:
            text += f"  min {_num(self.min)}  max {_num(self.max)}  mean {_num(self.mean)}"
        if self.nan:
            text += f"  NaN {self.nan}"
        if self.inf:
            text += f"  Inf {self.inf}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "device": self.device,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "nan": self.nan,
            "inf": self.inf,
        }


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def summarize(x: torch.Tensor) -> TensorStats:
    """The :class:`TensorStats` of ``x`` (complex tensors by magnitude, bools as 0/1)."""
    t = x.detach()
    shape = tuple(t.shape)
    device = str(t.device)
    dtype = t.dtype
    if t.numel() == 0:
        return TensorStats(shape, dtype, device, None, None, None)
    if t.is_complex():
        t = t.abs()
    elif dtype == torch.bool:
        t = t.to(torch.uint8)
    nan = inf = 0
    try:
        if t.is_floating_point():
            nan, inf = (int(c) for c in torch.stack([t.isnan().sum(), t.isinf().sum()]).tolist())
            if nan or inf:
                t = t[t.isfinite()]
                if t.numel() == 0:
                    return TensorStats(shape, dtype, device, None, None, None, nan, inf)
            lo, hi, mean = torch.stack(
                [t.min().double(), t.max().double(), t.mean(dtype=torch.float64)]
            ).tolist()
        else:
            lo, hi = torch.stack([t.min(), t.max()]).tolist()
            mean = t.mean(dtype=torch.float64).item()
    except (RuntimeError, TypeError):  # a dtype torch cannot reduce (float8, uint16, ...)
        return TensorStats(shape, dtype, device, None, None, None)
    return TensorStats(shape, dtype, device, lo, hi, mean, nan, inf)


@dataclass(frozen=True, slots=True)
class RefError:
    """How far a program value is from its float64 reference.

    ``max_abs``: the largest absolute difference over elements finite in both;
    ``max_rel``: ``max_abs`` over the largest finite magnitude of the reference (a
    normwise relative error); ``eps``: the machine epsilon of the program's dtype (so
    ``max_rel / eps`` is the error in units of its precision); ``mismatched``: elements
    where the two disagree outright (a NaN or Inf on one side only; any difference for
    integers and bools).
    """

    max_abs: float
    max_rel: float
    eps: float | None
    mismatched: int = 0
    note: str | None = None

    @property
    def in_eps(self) -> float | None:
        return None if not self.eps else self.max_rel / self.eps

    def __str__(self) -> str:
        if self.note:
            return self.note
        text = f"abs {self.max_abs:.3g}  rel {self.max_rel:.3g}"
        if self.eps:
            text += f" ({self.max_rel / self.eps:.3g} eps)"
        if self.mismatched:
            text += f"  {self.mismatched} mismatched"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "eps": self.eps,
            "mismatched": self.mismatched,
            "note": self.note,
        }


def compare(x: Any, ref: Any) -> RefError | None:
    """The :class:`RefError` of program value ``x`` against reference ``ref`` (None when
    there is nothing to compare)."""
    if isinstance(x, torch.Tensor) and isinstance(ref, torch.Tensor):
        if tuple(x.shape) != tuple(ref.shape):
            return RefError(
                math.inf, math.inf, None, x.numel(), f"shape {list(x.shape)} vs {list(ref.shape)}"
            )
        if x.numel() == 0:
            return RefError(0.0, 0.0, None)
        a = x.detach()
        r = ref.detach().to(a.device)
        if not (a.is_floating_point() or a.is_complex()):
            return RefError(0.0, 0.0, None, int((a != r.to(a.dtype)).sum()))
        eps = torch.finfo(a.dtype).eps if a.is_floating_point() else None
        a64 = a.to(torch.complex128 if a.is_complex() else torch.float64)
        r64 = r.to(a64.dtype)
        both = a64.isfinite() & r64.isfinite()
        same = (a64 == r64) | (a64.isnan() & r64.isnan())
        mismatched = int((~both & ~same).sum())
        diff = torch.where(both, (a64 - r64).abs(), 0.0)
        mag = torch.where(r64.isfinite(), r64.abs(), 0.0)
        max_abs, scale = torch.stack([diff.max().double(), mag.max().double()]).tolist()
        rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
        return RefError(max_abs, rel, eps, mismatched)
    if isinstance(x, bool | int | float) and isinstance(ref, bool | int | float):
        d = abs(float(x) - float(ref))
        return RefError(
            d, d / abs(float(ref)) if ref else d, None, int(d != 0 and not isinstance(x, float))
        )
    return None


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
    file says (``folded at load``, ``view made at load``, ``runs as a view``);
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
        """The largest relative error among the values it wrote (reference runs)."""
        worst: RefError | None = None
        for w in self.writes:
            e = w.error
            if e is not None and e.note is None and (worst is None or e.max_rel > worst.max_rel):
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
        """The ``n`` instructions with the largest relative error against the reference."""
        scored = [r for r in self.records if r.error is not None and r.error.max_rel > 0]
        scored.sort(key=lambda r: -r.error.max_rel)  # type: ignore[union-attr]
        return scored[:n]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors recorded with ``tensors=True``, as ``{"<step>:v<index>": tensor}``."""
        return {
            f"{r.step}:v{w.index}": w.value
            for r in self.records
            for w in r.writes
            if isinstance(w.value, torch.Tensor)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "num_instructions": self.num_instructions,
            "executed": len(self.records),
            "skipped": self.skipped,
            "stopped": None if self.stopped is None else self.stopped.to_dict(),
            "reason": self.reason,
            "records": [r.to_dict() for r in self.records],
        }

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
                    line += f"{_short(s.describe(), wt):<{wt}} {_num(s.min):>10} "
                    line += (
                        f"{_num(s.max):>10} {_num(s.mean):>10} {s.nan or '':>4} {s.inf or '':>4}"
                    )
                if ref:
                    e = w.error
                    if e is None:
                        line += " " * 21
                    elif e.note:
                        line += f"  {e.note}"
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
# the instrumented interpreter


@dataclass(slots=True)
class Step:
    """One instruction, prepared for the instrumented interpreter."""

    chain: int
    index: int
    kind: str
    name: str
    run: Callable[[list[Any]], Any]  # the statement execute runs
    source: Callable[[list[Any]], Any]  # the statement as the kernel made it
    destination: int | None  # a jump's target
    writes: tuple[int, ...]  # values it writes (replaces or writes in place)
    source_writes: tuple[int, ...]  # values the kernel's own statement writes
    reads: tuple[int, ...]  # tensors it reads
    tensor_args: tuple[int, ...]
    note: str | None
    frame: str | None
    is_copy: bool  # a device copy (et_copy::*)


def _kind(ins: p.Instruction) -> str:
    if isinstance(ins, p.KernelCall):
        return "kernel"
    if isinstance(ins, p.DelegateCall):
        return "delegate"
    if isinstance(ins, p.MoveCall):
        return "move"
    if isinstance(ins, p.FreeCall):
        return "free"
    return "jump_false"


def _written(st: Emission, tensor_args: tuple[int, ...]) -> tuple[int, ...]:
    if st.code.strip() == "pass":
        return ()
    mem = tensor_args if st.mutates is None else st.mutates
    return tuple(dict.fromkeys((*st.writes, *mem, *st.outs)))


def _compile(st: Emission, jump: bool, filename: str) -> Callable[[list[Any]], Any]:
    lines = ["def _step(v):"]
    if jump:
        lines.append(f"    return {st.code}")
    else:
        lines.extend("    " + part for part in st.code.splitlines() or ["pass"])
    source = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = dict(st.env)
    exec(compile(source, filename, "exec"), namespace)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    fn: Callable[[list[Any]], Any] = namespace["_step"]
    return fn


def _frame(plan: p.ExecutionPlan, chain: int, index: int) -> str | None:
    trace = plan.chains[chain].stacktrace
    if not trace or index >= len(trace) or not trace[index]:
        return None
    frames = trace[index]
    assert frames is not None
    return str(frames[-1])


def _note(
    method: Method, executed: Emission, loaded: Emission, writes: tuple[int, ...]
) -> str | None:
    if executed is loaded:
        return None
    if executed.code.strip() != "pass":
        return "runs as a view"
    if loaded.code.strip() == "pass":
        return None
    alias = loaded.alias
    values = method._values
    if alias is not None and isinstance(values[alias.source], torch.Tensor):
        base = values[alias.source].untyped_storage().data_ptr()
        if all(
            isinstance(values[w], torch.Tensor) and values[w].untyped_storage().data_ptr() == base
            for w in writes
        ):
            return "view made at load"
    return "folded at load"


_SOURCES = itertools.count()  # a unique file name per compiled statement, for tracebacks
_PREPARED: weakref.WeakKeyDictionary[Any, list[list[Step]]] = weakref.WeakKeyDictionary()


def prepare(method: Method) -> list[list[Step]]:
    """The method's instructions as :class:`Step` lists, one per chain (made once, cached)."""
    steps = _PREPARED.get(method)
    if steps is not None:
        return steps
    plan = method._plan
    values = plan.values
    steps = []
    for c, chain in enumerate(plan.chains):
        names = method._instruction_names[c]
        executed = method._statements[c]
        loaded = method._loaded_statements[c]
        chain_steps = []
        for i, ins in enumerate(chain.instructions):
            jump = isinstance(ins, p.JumpFalseCall)
            args = p.tensor_indices(values, p.instruction_values(ins))
            e, src = executed[i], loaded[i]
            label = method.name.replace("\0", "\\x00")  # compile() refuses a NUL in a file name
            filename = f"<ptexec trace {next(_SOURCES)}: {label} chain {c} instruction {i}>"
            run = _compile(e, jump, filename)
            source = run if src is e else _compile(src, jump, filename + " (as loaded)")
            source_writes = _written(src, args)
            writes = _written(e, args) if e.code.strip() != "pass" else source_writes
            chain_steps.append(
                Step(
                    chain=c,
                    index=i,
                    kind=_kind(ins),
                    name=names[i],
                    run=run,
                    source=source,
                    destination=ins.destination_instruction
                    if isinstance(ins, p.JumpFalseCall)
                    else None,
                    writes=writes,
                    source_writes=source_writes,
                    reads=tuple(a for a in args if a not in src.outs)
                    if not isinstance(ins, p.MoveCall)
                    else (ins.move_from,),
                    tensor_args=args,
                    note=_note(method, e, src, writes),
                    frame=_frame(plan, c, i),
                    is_copy=names[i].startswith("et_copy::"),
                )
            )
        steps.append(chain_steps)
    _PREPARED[method] = steps
    return steps


Hook = Callable[[Step, list[Any]], None]
AfterHook = Callable[[Step, list[Any], Any], None]


def interpret(
    method: Method,
    v: list[Any],
    before: Hook | None = None,
    after: AfterHook | None = None,
) -> None:
    """Run the method's instructions on values table ``v`` one at a time, as the compiled
    blocks do: chains in order, a JumpFalseCall jumps to its destination when its condition
    is false, and more than ``max_instructions`` executed instructions stop the run. An
    instruction that fails raises :class:`ExecutionError` naming it."""
    limit = method._max_instructions
    count = 0
    for chain in prepare(method):
        n = len(chain)
        pc = 0
        while pc < n:
            count += 1
            if count > limit:
                raise LimitExceededError(
                    f"'{method.name}' executed more than {limit} instructions; stopped "
                    "(a malformed jump may loop forever)"
                )
            step = chain[pc]
            if before is not None:
                before(step, v)
            try:
                result = step.run(v)
            except Exception as e:
                raise ExecutionError(
                    method.name, step.index, step.name, f"{type(e).__name__}: {e}", step.frame
                ) from e
            if after is not None:
                after(step, v, result)
            if step.destination is not None and not result:
                pc = step.destination
            else:
                pc += 1


# --------------------------------------------------------------------------------------
# the float64 shadow


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype.is_floating_point else dtype


class _Shadow:
    """The float64 reference's values table and planned memory (see the module docstring)."""

    def __init__(self, method: Method) -> None:
        from .dtypes import CODE_TO_DTYPE

        plan = method._plan  # no reference to the method: it keys the cache of shadows
        self.plan = plan
        self.scale: dict[int, int] = {b.info.index: 1 for b in method._buffers}
        self.planned: list[tuple[int, int, int, torch.dtype, tuple[int, ...], tuple[int, ...]]] = []
        self.constants: dict[int, Any] = {}
        self.fresh: list[int] = []
        inputs = set(plan.inputs)
        values = method._values
        for j, t in enumerate(plan.values):
            if not isinstance(t, p.Tensor):
                continue
            dtype = CODE_TO_DTYPE[t.scalar_type]
            alloc = t.allocation_info
            if alloc is not None:
                if dtype.is_floating_point:
                    s = max(1, 8 // dtype.itemsize)
                    self.scale[alloc.memory_id] = max(self.scale.get(alloc.memory_id, 1), s)
                self.planned.append(
                    (j, alloc.memory_id, alloc.memory_offset, dtype, t.sizes, t.dim_order)
                )
            elif t.is_constant:
                c = values[j]
                if isinstance(c, torch.Tensor) and c.is_floating_point():
                    c = c.to(torch.float64)
                self.constants[j] = c
            elif j not in inputs:
                self.fresh.append(j)
        self.planned_slots = {e[0] for e in self.planned}
        self.inputs = [j for j in plan.inputs if isinstance(plan.values[j], p.Tensor)]
        self.planned_inputs = self.planned_slots & inputs
        self.live_in = self._live_in(method)

    def _live_in(self, method: Method) -> set[int]:
        """Planned values whose content at the start of a call matters (mutable state):
        read before anything writes any of their bytes, in program order."""
        region: dict[int, tuple[int, int, int]] = {}
        for j, t in enumerate(self.plan.values):
            if isinstance(t, p.Tensor) and t.allocation_info is not None:
                a = t.allocation_info
                region[j] = (a.memory_id, a.memory_offset, a.memory_offset + t.nbytes)
        written: list[tuple[int, int, int]] = []
        live: set[int] = set()
        seen: set[int] = set()
        for chain in prepare(method):
            for step in chain:
                for j in step.reads:
                    r = region.get(j)
                    if r is None or j in seen:
                        continue
                    seen.add(j)
                    if not any(w[0] == r[0] and w[1] < r[2] and r[1] < w[2] for w in written):
                        live.add(j)
                for j in step.source_writes:
                    r = region.get(j)
                    if r is not None:
                        written.append(r)
        return live

    def start(self, m: Method, v: list[Any]) -> list[Any]:
        """A shadow table for this call of ``m``, from its state ``v`` (inputs bound)."""
        s = [None if j in self.constants else x for j, x in enumerate(v)]
        bufs = {}
        prog = {}
        for b in m._buffers:
            idx = b.info.index
            bufs[idx] = allocate(
                BufferInfo(idx, b.info.size * self.scale.get(idx, 1), b.info.device)
            ).data
            prog[idx] = b.data
        for j, mem, off, dtype, sizes, order in self.planned:
            where = f"shadow of value {j}"
            shadow = strided_view(
                bufs[mem], off * self.scale[mem], _wide(dtype), sizes, order, where
            )
            if j in self.live_in:
                shadow.copy_(strided_view(prog[mem], off, dtype, sizes, order, where))
            s[j] = shadow
        for j, _mem, _off, _dtype, _sizes, order in self.planned:
            if j not in self.planned_inputs:
                continue
            x, planned = v[j], s[j]
            assert isinstance(x, torch.Tensor) and isinstance(planned, torch.Tensor)
            try:  # last: a live value never shares bytes with an input, a dead one may
                if x.shape != planned.shape:
                    resize_to(planned, x.shape, order)
                planned.copy_(x)
            except RuntimeError:
                s[j] = x.to(_wide(x.dtype), copy=True)
        for j, c in self.constants.items():
            s[j] = c
        for j in self.fresh:
            x = v[j]
            if isinstance(x, torch.Tensor):
                s[j] = torch.empty_strided(
                    x.shape, x.stride(), dtype=_wide(x.dtype), device=x.device
                )
        for j in self.inputs:  # unplanned inputs: the caller's tensor, widened (a copy)
            x = v[j]
            if j not in self.planned_slots and isinstance(x, torch.Tensor):
                s[j] = x.to(_wide(x.dtype), copy=True)
        return s

    @staticmethod
    def sync(s: list[Any], j: int, x: Any) -> None:
        """Give shadow value ``j`` the program's value ``x`` (widened)."""
        cur = s[j]
        if isinstance(x, torch.Tensor):
            if isinstance(cur, torch.Tensor) and cur.dtype == _wide(x.dtype):
                try:
                    if cur.shape != x.shape:
                        cur.resize_(x.shape)
                    cur.copy_(x)
                    return
                except RuntimeError:
                    pass
            s[j] = x.to(_wide(x.dtype), copy=True)
        else:
            s[j] = x


_SHADOWS: weakref.WeakKeyDictionary[Any, _Shadow] = weakref.WeakKeyDictionary()


# --------------------------------------------------------------------------------------
# tracing


def _narrow_run(step: Step, v: list[Any], s: list[Any]) -> bool:
    """Run ``step`` on the shadow's values narrowed to the program's dtypes and widen what
    it wrote back into the shadow (for kernels and delegates that cannot take float64:
    the reference keeps its own inputs, only this instruction computes narrow)."""
    tmp = list(s)
    for j in step.tensor_args:
        x, r = v[j], s[j]
        if isinstance(x, torch.Tensor) and isinstance(r, torch.Tensor) and r.dtype != x.dtype:
            tmp[j] = r.to(x.dtype)
    try:
        step.source(tmp)
    except Exception:
        return False
    for j in dict.fromkeys((*step.source_writes, *step.writes)):
        _Shadow.sync(s, j, tmp[j])
    return True


class _Stop(Exception):
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


class _Recorder:
    def __init__(
        self,
        method: Method,
        *,
        tensors: bool,
        reads: bool,
        stop_on: StopOn | None,
        shadow: _Shadow | None,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.method = method
        self.tensors = tensors
        self.keep_reads = reads
        self.stop_on = stop_on
        self.shadow = shadow
        self.s: list[Any] | None = None
        self.progress = progress
        self.total = sum(len(c.instructions) for c in method._plan.chains)
        self.records: list[InstructionRecord] = []
        self.pending_reads: list[ValueRecord] | None = None

    def _value(self, j: int, x: Any, keep: bool) -> ValueRecord:
        if isinstance(x, torch.Tensor):
            rec = ValueRecord(j, summarize(x))
            if keep:
                rec.value = x.detach().clone()
            return rec
        return ValueRecord(j, None, x)

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

    def _reference(self, step: Step, v: list[Any], rec: InstructionRecord, result: Any) -> None:
        s = self.s
        assert s is not None
        record = self.method.record
        saved = record.bytes_copied if step.is_copy else None
        try:
            ref_result = step.source(s)
        except Exception as e:
            why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
            if _narrow_run(step, v, s):
                rec.reference_note = f"ran in the program's precision (not in float64: {why})"
            else:
                rec.reference_note = f"cannot run ({why}); took the program's values"
                for j in (*step.source_writes, *step.writes):
                    _Shadow.sync(s, j, v[j])
        else:
            if step.destination is not None and bool(ref_result) != bool(result):
                rec.reference_note = (
                    "the reference would branch the other way; it follows the program"
                )
        if saved is not None:  # the reference's copies are not the call's
            record.h2h, record.h2d, record.d2h, record.d2d = (
                saved[k] for k in ("h2h", "h2d", "d2h", "d2d")
            )
        for w in rec.writes:
            ref = s[w.index]
            w.error = compare(v[w.index], ref)
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
    """Call ``method`` on ``inputs`` instruction by instruction and record each one.

    ``tensors``: keep a copy of every tensor written (``ValueRecord.value``; with
    ``reference``, the float64 one in ``ValueRecord.reference``). ``reference``: run a
    float64 shadow in lockstep and give each written value its :class:`RefError`.
    ``stop_on``: ``"nan"``, ``"inf"`` or ``"nonfinite"``: stop after the first instruction
    that writes such a value (``Trace.stopped``; its inputs as they were before it ran are
    in ``reads``; ``outputs`` is None). ``reads``: record every instruction's inputs too.
    ``progress(done, total)`` is called after each instruction. Inputs are bound as by
    :meth:`Method.execute` (``transfers``, ``layout`` likewise); outputs are copies.
    """
    if stop_on not in (None, "nan", "inf", "nonfinite"):
        raise ValueError(f"stop_on must be 'nan', 'inf' or 'nonfinite', not {stop_on!r}")
    prepare(method)
    shadow = None
    if reference:
        shadow = _SHADOWS.get(method)
        if shadow is None:
            shadow = _SHADOWS[method] = _Shadow(method)
    rec = _Recorder(
        method, tensors=tensors, reads=reads, stop_on=stop_on, shadow=shadow, progress=progress
    )
    ref_outputs: list[Any] | None = None

    def runner(v: list[Any]) -> None:
        nonlocal ref_outputs
        if shadow is not None:
            rec.s = shadow.start(method, v)
        interpret(method, v, rec.before, rec.after)
        if rec.s is not None:
            ref_outputs = [
                x.detach().clone() if isinstance(x, torch.Tensor) else x
                for x in (rec.s[j] for j in method._plan.outputs)
            ]

    counts = [len(c.instructions) for c in method._plan.chains]
    try:
        outputs = method._call_with(inputs, runner, transfers=transfers, layout=layout)
    except _Stop as stop:
        return Trace(
            method.name, None, rec.records, counts, stop.record, stop.reason, None, reference
        )
    return Trace(method.name, outputs, rec.records, counts, None, None, ref_outputs, reference)
