"""The memory plan of a method: which tensor lives where, and when.

ExecuTorch's memory planner places every planned tensor at a byte offset of a planned
buffer, reusing bytes once a tensor is dead. :func:`memory_plan` reads that plan back from
the file (nothing is loaded or allocated) and gives every planned tensor a lifetime in
instruction indices:

- a tensor lives from the first to the last instruction that touches it (writes it or
  reads it); instructions are numbered across chains;
- program inputs live from the start, outputs to the end; mutable state (a tensor some
  instruction reads before any instruction wrote it, or a tensor with an initial value in
  the file, or one in a buffer shared by all methods) lives the whole method;
- values planned at the same bytes with the same size (ExecuTorch plans a static ``view``
  as a second value at its base's offset) are one tensor with all their value indices;
- a backward jump (a loop) extends every lifetime that crosses the loop to cover it.

Which arguments an instruction writes is read from the file's conventions: the outputs of
an ``.out`` kernel are its last argument (a tensor or a list of them) and the arguments
passed twice (an ``out`` argument and the returned value), ``et_copy_index`` writes its
first; a delegate is taken to write the values it is first to touch.

    plan = memory_plan(program, "forward")
    print(plan.summary())                      # buffer sizes, peak bytes live, largest tensors
    plan.draw("plan.png")                      # needs matplotlib (the ``plot`` extra)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .effects import byte_range, file_effects
from .format import program as p
from .format.scalar_type import scalar_type_name

if TYPE_CHECKING:
    from .device import Device
    from .program import Program

__all__ = ["BufferPlan", "MemoryPlan", "PlannedTensor", "memory_plan"]

KINDS = ("input", "output", "input/output", "state", "intermediate", "unused")
_COLORS = {
    "input": "#4c72b0",
    "output": "#dd8452",
    "input/output": "#c44e52",
    "state": "#55a868",
    "intermediate": "#8172b3",
    "unused": "#bbbbbb",
}


@dataclass(frozen=True, slots=True)
class PlannedTensor:
    """One planned tensor: the value(s) at its bytes, where they are and when they live
    (``first``/``last`` instruction, inclusive; None for a tensor no instruction uses)."""

    values: tuple[int, ...]
    buffer: int
    offset: int
    nbytes: int
    dtype: str
    sizes: tuple[int, ...]
    dynamic: bool
    first: int | None
    last: int | None
    kind: str

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def describe(self) -> str:
        text = f"{self.dtype}[{', '.join(str(s) for s in self.sizes)}]"
        return text + (" (upper bound)" if self.dynamic else "")

    def names(self, limit: int = 4) -> str:
        shown = ",".join(f"v{j}" for j in self.values[:limit])
        return shown + (",..." if len(self.values) > limit else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": list(self.values),
            "buffer": self.buffer,
            "offset": self.offset,
            "nbytes": self.nbytes,
            "dtype": self.dtype,
            "sizes": list(self.sizes),
            "dynamic": self.dynamic,
            "first": self.first,
            "last": self.last,
            "kind": self.kind,
        }


@dataclass
class BufferPlan:
    """One planned buffer: size, device, its tensors, and how full it gets.

    ``peak``: the most bytes live at once (bytes covered by live tensors), at instruction
    ``peak_at``; ``utilization``: ``peak / size``; ``tensor_bytes``: the bytes of all its
    tensors together (more than ``size`` where the plan reuses memory).
    """

    index: int
    size: int
    device: Device
    tensors: list[PlannedTensor] = field(default_factory=list)
    peak: int = 0
    peak_at: int | None = None
    live: list[int] = field(default_factory=list)  # bytes live at each instruction

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def utilization(self) -> float:
        return self.peak / self.size if self.size else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "size": self.size,
            "device": str(self.device),
            "tensors": len(self.tensors),
            "tensor_bytes": self.tensor_bytes,
            "peak": self.peak,
            "peak_at": self.peak_at,
            "utilization": self.utilization,
        }


@dataclass
class MemoryPlan:
    """A method's planned memory (see the module docstring)."""

    method: str
    num_instructions: int
    buffers: list[BufferPlan]
    unplanned: list[tuple[int, str, str]]  # (value, tensor, why): runtime-provided tensors

    @property
    def tensors(self) -> list[PlannedTensor]:
        return [t for b in self.buffers for t in b.tensors]

    @property
    def planned_bytes(self) -> int:
        return sum(b.size for b in self.buffers)

    @property
    def live(self) -> list[int]:
        """Bytes live in all buffers together, per instruction."""
        return [sum(col) for col in zip(*(b.live for b in self.buffers), strict=True)] or []

    @property
    def peak(self) -> tuple[int, int | None]:
        """(most bytes live at once over all buffers, at which instruction)."""
        live = self.live
        if not live:
            return 0, None
        top = max(live)
        return top, live.index(top)

    def largest(self, n: int = 10) -> list[PlannedTensor]:
        return sorted(self.tensors, key=lambda t: (-t.nbytes, t.buffer, t.offset))[:n]

    def summary(self, top: int = 10) -> str:
        """Buffer sizes, peak bytes live, utilization and the largest tensors, as text."""
        lines = [
            f"method '{self.method}': {self.num_instructions} instructions, "
            f"{len(self.buffers)} planned buffer(s), {_size(self.planned_bytes)} planned"
        ]
        for b in self.buffers:
            at = f" at instruction {b.peak_at}" if b.peak_at is not None else ""
            reuse = b.tensor_bytes / b.size if b.size else 0.0
            lines.append(
                f"  buffer {b.index} on {b.device}: {b.size} bytes ({_size(b.size)}), "
                f"{len(b.tensors)} tensors holding {_size(b.tensor_bytes)} (reuse {reuse:.2f}x); "
                f"peak {b.peak} bytes live{at}, utilization {b.utilization * 100:.1f}%"
            )
        peak, peak_at = self.peak
        if len(self.buffers) > 1:
            where = f" at instruction {peak_at}" if peak_at is not None else ""
            lines.append(f"  all buffers: peak {peak} bytes live{where}")
        kinds: dict[str, int] = {}
        for t in self.tensors:
            kinds[t.kind] = kinds.get(t.kind, 0) + 1
        if kinds:
            lines.append(
                "  tensors by kind: " + ", ".join(f"{k} {kinds[k]}" for k in KINDS if k in kinds)
            )
        if self.unplanned:
            lines.append(
                f"  unplanned tensors (memory from the caller or the runtime): {len(self.unplanned)}"
            )
            for j, desc, why in self.unplanned[:top]:
                lines.append(f"    v{j}: {desc}, {why}")
        largest = self.largest(top)
        if largest:
            lines.append("  largest tensors:")
            lines.append(
                f"    {'bytes':>10}  {'buffer':>6} {'offset':>10}  {'lifetime':>11}  "
                f"{'kind':<12} {'values':<16} tensor"
            )
            for t in largest:
                life = "-" if t.first is None else f"{t.first}..{t.last}"
                lines.append(
                    f"    {t.nbytes:>10}  {t.buffer:>6} {t.offset:>10}  {life:>11}  "
                    f"{t.kind:<12} {t.names():<16} {t.describe()}"
                )
        return "\n".join(lines)

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """The plan as JSON values: every tensor in buffer order, or with ``top`` the
        ``top`` largest (the rows :meth:`summary` lists) and the first ``top`` unplanned
        ones; ``num_tensors`` and ``num_unplanned`` count them all."""
        peak, at = self.peak
        tensors = self.tensors if top is None else self.largest(top)
        unplanned = self.unplanned if top is None else self.unplanned[:top]
        return {
            "method": self.method,
            "num_instructions": self.num_instructions,
            "planned_bytes": self.planned_bytes,
            "peak": peak,
            "peak_at": at,
            "buffers": [b.to_dict() for b in self.buffers],
            "num_tensors": len(self.tensors),
            "tensors": [t.to_dict() for t in tensors],
            "num_unplanned": len(self.unplanned),
            "unplanned": [{"value": j, "tensor": d, "why": w} for j, d, w in unplanned],
        }

    def draw(
        self, path: str | os.PathLike[str], *, title: str | None = None, dpi: int = 110
    ) -> None:
        """Draw the plan to ``path`` (``.png``, ``.svg``, ``.pdf``): one panel per buffer,
        instruction index across, byte offset down, one box per tensor over its lifetime,
        coloured by kind. Needs matplotlib."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            raise ImportError(
                "drawing the memory plan needs matplotlib: pip install '.[plot]' in ptexec's source tree"
            ) from None
        _draw(self, path, title, dpi, Figure, FigureCanvasAgg)


def _size(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


# --------------------------------------------------------------------------------------
# building the plan


def _dtype_name(code: int) -> str:
    from .dtypes import CODE_TO_DTYPE, dtype_name

    dtype = CODE_TO_DTYPE.get(code)
    return dtype_name(dtype) if dtype is not None else scalar_type_name(code)


def memory_plan(program: Program, method: str = "forward", *, device_map: Any = None) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``method`` (read from the file; nothing is allocated).
    ``device_map`` relabels devices as in :meth:`Program.load_method`."""
    meta = program.method_meta(method, device_map=device_map)  # raises for a wrong name
    plan = next(pl for pl in program.pte.program.execution_plan if pl.name == method)
    values = plan.values
    n = sum(len(c.instructions) for c in plan.chains)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    written_first: dict[int, bool] = {}  # is a value's first touch a write
    seen: set[int] = set()
    loops: list[tuple[int, int]] = []
    base = 0
    for chain in plan.chains:
        for i, ins in enumerate(chain.instructions):
            g = base + i
            reads, writes = file_effects(plan, ins, seen)
            for j in writes:
                written_first.setdefault(j, True)
            for j in reads:
                written_first.setdefault(j, False)
            for j in (*reads, *writes):
                seen.add(j)
                first.setdefault(j, g)
                last[j] = g
            if isinstance(ins, p.JumpFalseCall) and ins.destination_instruction <= i:
                loops.append((base + ins.destination_instruction, g))
        base += len(chain.instructions)
    end = max(n - 1, 0)
    inputs, outputs = set(plan.inputs), set(plan.outputs)
    shared = program.shared_buffer_indices
    groups: dict[tuple[int, int, int], list[int]] = {}
    unplanned: list[tuple[int, str, str]] = []
    for j, t in enumerate(values):
        if not isinstance(t, p.Tensor):
            continue
        found = byte_range(t)
        if found is None:
            if not t.is_constant:
                why = "input" if j in inputs else "output" if j in outputs else "intermediate"
                unplanned.append((j, f"{_dtype_name(t.scalar_type)}{list(t.sizes)}", why))
            continue
        buffer, start, stop = found
        groups.setdefault((buffer, start, stop - start), []).append(j)
    buffers = {b.index: BufferPlan(b.index, b.size, b.device) for b in meta.buffers}
    for j in first:  # a value alive across a loop lives through all of it
        for lo, hi in loops:
            if first[j] <= hi and last[j] >= lo and (first[j] < lo or last[j] > hi):
                first[j], last[j] = min(first[j], lo), max(last[j], hi)
    for (mem, offset, nbytes), members in sorted(groups.items()):
        buf = buffers.get(mem)
        if buf is None:
            continue
        for cluster in _clusters(members, first, last, written_first, inputs):
            buf.tensors.append(
                _tensor(
                    values,
                    cluster,
                    mem,
                    offset,
                    nbytes,
                    first,
                    last,
                    written_first,
                    end,
                    inputs,
                    outputs,
                    mem in shared,
                )
            )
    for b in buffers.values():
        b.live = _live_bytes(b.tensors, max(n, 1))
        if b.live:
            b.peak = max(b.live)
            b.peak_at = b.live.index(b.peak) if b.peak else None
    return MemoryPlan(method, n, list(buffers.values()), unplanned)


def _clusters(
    members: list[int],
    first: dict[int, int],
    last: dict[int, int],
    written_first: dict[int, bool],
    inputs: set[int],
) -> list[list[int]]:
    """Split the values planned at the same bytes into tensors: a value that only reads
    those bytes, or is in use while another one is, shares its tensor (a view); one that
    writes them after the others are done is a new tensor (the plan reusing memory)."""
    used = sorted((j for j in members if j in first), key=lambda j: (first[j], j))
    clusters: list[list[int]] = []
    end = -1
    for j in used:
        writer = written_first[j] or j in inputs
        if clusters and (not writer or first[j] <= end):
            clusters[-1].append(j)
            end = max(end, last[j])
        else:
            clusters.append([j])
            end = last[j]
    unused = [j for j in members if j not in first]
    if unused:
        if clusters:
            clusters[0].extend(unused)
        else:
            clusters.append(unused)
    return clusters


def _tensor(
    values: tuple[p.EValue, ...],
    members: list[int],
    mem: int,
    offset: int,
    nbytes: int,
    first: dict[int, int],
    last: dict[int, int],
    written_first: dict[int, bool],
    end: int,
    inputs: set[int],
    outputs: set[int],
    shared: bool,
) -> PlannedTensor:
    t0 = values[members[0]]
    assert isinstance(t0, p.Tensor)
    is_in = any(j in inputs for j in members)
    is_out = any(j in outputs for j in members)
    used = [j for j in members if j in first]
    lo = min((first[j] for j in used), default=None)
    hi = max((last[j] for j in used), default=None)
    # state: its bytes are read before anything writes them (and it is no input)
    read_first = lo is not None and not any(first[j] == lo and written_first[j] for j in used)
    state = (
        shared or (read_first and not is_in) or any(values[j].data_buffer_idx > 0 for j in members)  # type: ignore[union-attr]
    )
    if state:
        kind, lo, hi = "state", 0, end
    elif is_in or is_out:
        kind = "input/output" if is_in and is_out else "input" if is_in else "output"
        lo = 0 if is_in else (lo if lo is not None else end)
        hi = end if is_out else (hi if hi is not None else 0)
    elif lo is None:
        kind = "unused"
    else:
        kind = "intermediate"
    return PlannedTensor(
        tuple(members),
        mem,
        offset,
        nbytes,
        _dtype_name(t0.scalar_type),
        t0.sizes,
        any(values[j].shape_dynamism != p.STATIC for j in members),  # type: ignore[union-attr]
        lo,
        hi,
        kind,
    )


def _live_bytes(tensors: list[PlannedTensor], n: int) -> list[int]:
    """Bytes covered by live tensors at each instruction (overlaps counted once)."""
    starts: dict[int, list[PlannedTensor]] = {}
    for t in tensors:
        if t.first is not None and t.last is not None and t.nbytes:
            starts.setdefault(t.first, []).append(t)
    active: list[PlannedTensor] = []
    live = []
    for step in range(n):
        active = [t for t in active if t.last is not None and t.last >= step]
        active.extend(starts.get(step, ()))
        spans = sorted((t.offset, t.end) for t in active)
        total = 0
        cur_lo = cur_hi = -1
        for lo, hi in spans:
            if lo > cur_hi:
                total += cur_hi - cur_lo if cur_hi > cur_lo else 0
                cur_lo, cur_hi = lo, hi
            else:
                cur_hi = max(cur_hi, hi)
        total += cur_hi - cur_lo if cur_hi > cur_lo else 0
        live.append(total)
    return live


# --------------------------------------------------------------------------------------
# the picture


def _draw(
    mp: MemoryPlan,
    path: str | os.PathLike[str],
    title: str | None,
    dpi: int,
    figure_cls: Any,
    canvas_cls: Any,
) -> None:
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

    buffers = [b for b in mp.buffers if b.size] or mp.buffers
    rows = max(len(buffers), 1)
    fig = figure_cls(figsize=(12, 1.2 + 3.6 * rows), dpi=dpi)
    canvas_cls(fig)
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0]
    n = max(mp.num_instructions, 1)
    used_kinds: set[str] = set()
    for ax, b in zip(axes, buffers, strict=False):
        patches = []
        colors = []
        labels = []
        for t in b.tensors:
            if t.first is None or t.last is None or not t.nbytes:
                continue
            x0, width = t.first - 0.45, t.last - t.first + 0.9
            patches.append(Rectangle((x0, t.offset), width, t.nbytes))
            colors.append(_COLORS[t.kind])
            used_kinds.add(t.kind)
            if width >= n * 0.04 and t.nbytes >= max(b.size, 1) * 0.05:
                labels.append((x0 + width / 2, t.offset + t.nbytes / 2, t.names(2)))
        if patches:
            ax.add_collection(
                PatchCollection(
                    patches, facecolor=colors, edgecolor="white", linewidth=0.6, alpha=0.9
                )
            )
        for x, y, text in labels:
            ax.text(x, y, text, ha="center", va="center", fontsize=7, color="white", clip_on=True)
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_ylim(max(b.size, 1), 0)  # byte offset down
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        step = 2 ** max(0, math.ceil(math.log2(max(b.size, 1) / 6)))  # ~6 ticks, round bytes
        ax.yaxis.set_major_locator(MultipleLocator(step))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _size(v) if v >= 0 else ""))
        ax.set_ylabel("byte offset")
        at = f" at instruction {b.peak_at}" if b.peak_at is not None else ""
        ax.set_title(
            f"buffer {b.index} on {b.device}: {_size(b.size)}, {len(b.tensors)} tensors, "
            f"peak {_size(b.peak)} live{at} ({b.utilization * 100:.0f}%)",
            fontsize=10,
            loc="left",
        )
        if b.peak_at is not None:
            ax.axvline(b.peak_at, color="#333333", linewidth=0.8, linestyle=":")
        ax.grid(axis="x", color="#eeeeee", linewidth=0.5)
        ax.set_axisbelow(True)
    axes[-1].set_xlabel("instruction")
    for ax in axes[len(buffers) :]:
        ax.set_visible(False)
    handles = [Patch(color=_COLORS[k], label=k) for k in KINDS if k in used_kinds]
    if handles:
        fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(
        title or f"memory plan of '{mp.method}' ({mp.num_instructions} instructions)",
        x=0.01,
        ha="left",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97 if rows > 1 else 0.93))
    fig.savefig(os.fspath(path))
