"""The float64 reference: a shadow of a call, run in lockstep, instruction by instruction.

A second values table in which every floating tensor is float64 runs the statements as the
kernels made them (before the load-time rewrites, so folded work is recomputed in float64).
Constants and inputs are the program's, widened. ExecuTorch's memory plan gives some
values the same bytes (a static ``view`` is a second value at the same offset, read but
never written), so the shadow's planned memory keeps the plan's layout: each shadow buffer
is the program's buffer with every byte offset multiplied by ``8 / s`` (``s`` the narrowest
floating element size in that buffer), which maps a floating tensor of the narrowest size
onto exactly the widened bytes, keeps every value planned at the same offset at the same
place, and keeps values that do not overlap in the plan apart. The shadow starts each call
from the program's state (mutable buffers widened) and follows the program's branches. A
statement that cannot run in float64 (a kernel or delegate that insists on its own dtypes)
runs on the shadow's values narrowed to the program's dtypes, and its results are widened
again; if even that fails, the shadow takes the program's results. Either is noted.

A trace drives it from its hooks: :meth:`Shadow.start` once the inputs are bound,
:meth:`Shadow.step` after each instruction ran in the program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .codegen import Sources
from .dtypes import CODE_TO_DTYPE
from .effects import byte_range, effects
from .engine.blocks import compile_statement
from .engine.hooks import Step, steps_of
from .format import program as p
from .kernels.aten import draws_random
from .loader.dataflow import FUSED_AWAY, is_fused
from .loader.state import Kept, MethodState
from .memory import BufferInfo, allocate, resize_to, strided_view

__all__ = ["Shadow", "shadow_of"]


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype.is_floating_point else dtype


def _sync(s: list[Any], j: int, x: Any) -> None:
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


class Shadow:
    """The reference's plan for one method: its widened memory layout, and each loaded
    statement compiled to run on a values table of its own (made once per method)."""

    def __init__(self, state: MethodState) -> None:
        plan = state.plan
        self.plan = plan
        self.scale: dict[int, int] = {b.info.index: 1 for b in state.buffers}
        self.planned: list[tuple[int, int, int, torch.dtype, tuple[int, ...], tuple[int, ...]]] = []
        self.constants: dict[int, Any] = {}
        self.fresh: list[int] = []
        inputs = set(plan.inputs)
        values = state.values
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
        self.sources = Sources(f"{state.name} float64 reference")
        self.steps = steps_of(state)
        self.writes = [
            [
                effects(plan.values, ins, st).written
                for ins, st in zip(c.instructions, c.loaded, strict=True)
            ]
            for c in state.chains
        ]
        self.runs: dict[tuple[int, int], Callable[[list[Any]], Any]] = {}
        self.live_in = self._live_in()

    def _live_in(self) -> set[int]:
        """Planned values whose content at the start of a call matters (mutable state):
        read before anything writes any of their bytes, in program order."""
        region: dict[int, tuple[int, int, int]] = {}
        for j, t in enumerate(self.plan.values):
            found = byte_range(t)
            if found is not None:
                region[j] = found
        written: list[tuple[int, int, int]] = []
        live: set[int] = set()
        seen: set[int] = set()
        for c, chain in enumerate(self.steps):
            for step in chain:
                for j in step.reads:
                    r = region.get(j)
                    if r is None or j in seen:
                        continue
                    seen.add(j)
                    if not any(w[0] == r[0] and w[1] < r[2] and r[1] < w[2] for w in written):
                        live.add(j)
                for j in self.writes[c][step.index]:
                    r = region.get(j)
                    if r is not None:
                        written.append(r)
        return live

    def _run(self, step: Step) -> Callable[[list[Any]], Any]:
        key = (step.chain, step.index)
        fn = self.runs.get(key)
        if fn is None:
            what = f"chain {step.chain} instruction {step.index}"
            fn = compile_statement(step.loaded, step.destination is not None, self.sources, what)
            self.runs[key] = fn
        return fn

    def start(self, state: MethodState, v: list[Any]) -> list[Any]:
        """A shadow table for this call, from the program's table ``v`` (inputs bound)."""
        s = [None if j in self.constants else x for j, x in enumerate(v)]
        bufs = {}
        prog = {}
        for b in state.buffers:
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

    def step(
        self, step: Step, v: list[Any], s: list[Any], result: Any
    ) -> tuple[str | None, frozenset[int]]:
        """Run ``step`` on the shadow table ``s`` after the program ran it on ``v``
        (``result``: the program's jump condition). Returns a note when the reference could
        not follow in float64, and the values it took from the program instead of
        computing them (they have no reference of their own). A fused instruction
        (:mod:`ptexec.loader.dataflow`) runs, in the reference, every instruction it
        stands for, so that the value it wrote has its reference now; those instructions
        then have nothing left to run."""
        if step.statement is FUSED_AWAY:
            return None, frozenset()
        if not is_fused(step.statement):
            note, taken = self._step(step, v, s, result)
            return note, frozenset(taken)
        chain = self.steps[step.chain]
        notes = [self._step(step, v, s, result)]
        for k in range(step.index + 1, len(chain)):
            if chain[k].statement is not FUSED_AWAY:
                break
            notes.append(self._step(chain[k], v, s, None))
        note = next((n for n, _ in notes if n is not None), None)
        return note, frozenset(j for _, taken in notes for j in taken)

    def _step(
        self, step: Step, v: list[Any], s: list[Any], result: Any
    ) -> tuple[str | None, tuple[int, ...]]:
        writes = self.writes[step.chain][step.index]
        if step.kind == "kernel" and draws_random(step.name):
            # run again it would draw other numbers (nothing to compare with) and move
            # torch's generator on, changing what the program draws after it
            taken = (*writes, *step.writes)
            for j in taken:
                _sync(s, j, v[j])
            return "draws random numbers; took the program's values", taken
        try:
            ref_result = self._run(step)(s)
        except Exception as e:
            why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
            if self._narrow(step, v, s, writes):
                return f"ran in the program's precision (not in float64: {why})", ()
            taken = (*writes, *step.writes)
            for j in taken:
                _sync(s, j, v[j])
            return f"cannot run ({why}); took the program's values", taken
        if step.destination is not None and bool(ref_result) != bool(result):
            return "the reference would branch the other way; it follows the program", ()
        return None, ()

    def _narrow(self, step: Step, v: list[Any], s: list[Any], writes: tuple[int, ...]) -> bool:
        """Run ``step`` on the shadow's values narrowed to the program's dtypes and widen
        what it wrote back into the shadow (for kernels and delegates that cannot take
        float64: the reference keeps its own inputs, only this instruction computes
        narrow)."""
        tmp = list(s)
        for j in step.tensor_args:
            x, r = v[j], s[j]
            if isinstance(x, torch.Tensor) and isinstance(r, torch.Tensor) and r.dtype != x.dtype:
                tmp[j] = r.to(x.dtype)
        try:
            self._run(step)(tmp)
        except Exception:
            return False
        for j in dict.fromkeys((*writes, *step.writes)):
            _sync(s, j, tmp[j])
        return True


shadow_of = Kept(Shadow)
"""``shadow_of(state)``: the :class:`Shadow` of a method (made once per method)."""
