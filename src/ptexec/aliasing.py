"""Copy elision: which copies of a straight-line chain can run as views.

ExecuTorch programs copy where eager PyTorch takes a view (``permute_copy``,
``view_copy``, ``split_with_sizes_copy``, a same-dtype ``_to_dim_order_copy``, ...): the
memory plan gives the copy its own bytes. A copy ``D = copy(S)`` may instead run as the
view ``D = view(S)`` when nothing can tell the difference:

1. ``D`` is written by this instruction only, and is neither an input nor an output of the
   method (an output must own its memory).
2. Whoever later reads the bytes this instruction wrote reads them through ``D`` (or a
   view of ``D``). ExecuTorch's emitter turns a static ``view`` into a second value planned
   at the same bytes, and the plan hands bytes to a new tensor once the old one is dead, so
   reads are followed byte range by byte range: a value read before anything else wrote its
   bytes reads ``D``'s data. Such a value at exactly ``D``'s bytes, with the same number of
   elements, becomes a reshaped view of ``D``; any other reader of those bytes keeps the copy.
3. Nothing writes the memory ``S`` reads from (following views back to planned bytes,
   constants or a tensor's own memory) until the last read of ``D``: with the view, ``D``'s
   data stays in ``S``'s memory, which the plan may hand to a later tensor once ``S`` is dead.

Chains with jumps are left alone. A view of a constant whose arguments are fixed is
computed once, at load.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .format import program as p
from .kernels.registry import Emission

__all__ = ["elide_copies"]

_REF = re.compile(r"v\[(\d+)\]")
_ET_VIEW = ("executorch_prim::et_view.default", "executorch_prim::et_view")

Region = tuple[Any, ...]


def _region(values: Sequence[p.EValue], index: int, inputs: set[int]) -> Region:
    t = values[index]
    if isinstance(t, p.Tensor):
        if t.allocation_info is not None:
            start = t.allocation_info.memory_offset
            return ("planned", t.allocation_info.memory_id, start, start + t.nbytes)
        if t.is_constant:
            return ("constant", index)
    if index in inputs:
        return ("input", index)
    return ("own", index)


def _overlaps(a: Region, b: Region) -> bool:
    if a[0] == "constant" or b[0] == "constant":
        return False
    if a[0] == "planned" and b[0] == "planned":
        return bool(a[1] == b[1] and a[2] < b[3] and b[2] < a[3])
    return a == b


def _covers(a: Region, b: Region) -> bool:
    """``a`` contains every byte of ``b``."""
    if a[0] == "planned" and b[0] == "planned":
        return bool(a[1] == b[1] and a[2] <= b[2] and b[3] <= a[3])
    return a == b and a[0] != "constant"


def _tensor_args(values: Sequence[p.EValue], args: Sequence[int]) -> list[int]:
    out: list[int] = []
    for a in args:
        v = values[a]
        if isinstance(v, p.Tensor):
            out.append(a)
        elif isinstance(v, p.TensorList | p.OptionalTensorList):
            out.extend(i for i in v.items if i >= 0 and isinstance(values[i], p.Tensor))
    return out


def _args(ins: p.Instruction) -> tuple[int, ...]:
    if isinstance(ins, p.KernelCall | p.DelegateCall):
        return ins.args
    if isinstance(ins, p.MoveCall):
        return (ins.move_from, ins.move_to)
    if isinstance(ins, p.FreeCall):
        return (ins.value_index,)
    return (ins.cond_value_index,)


class _Chain:
    """Reads and memory writes of each instruction, kept current as copies become views."""

    def __init__(
        self, plan: p.ExecutionPlan, chain: p.Chain, statements: list[Emission], et_views: set[int]
    ) -> None:
        self.et_views = et_views
        self.values = plan.values
        self.inputs = set(plan.inputs)
        self.outputs = set(plan.outputs)
        self.instructions = chain.instructions
        self.reads: list[set[int]] = []
        self.writes: list[list[Region]] = []
        self.writers: dict[int, set[int]] = {}
        self.root: dict[int, int] = {}
        for k, (ins, st) in enumerate(zip(chain.instructions, statements, strict=True)):
            touched = _tensor_args(self.values, _args(ins))
            mem = touched if st.mutates is None else list(st.mutates)
            self.reads.append(set(touched) - set(st.outs))
            self.writes.append([self.region(w) for w in mem])
            for w in (*mem, *st.writes):
                self.writers.setdefault(w, set()).add(k)

    def region(self, index: int) -> Region:
        return _region(self.values, index, self.inputs)

    def base(self, index: int) -> int:
        while index in self.root:
            index = self.root[index]
        return index

    def is_view_alias(self, w: int, d: int) -> bool:
        """``w`` is a second value the emitter planned at exactly ``d``'s bytes."""
        tw, td = self.values[w], self.values[d]
        return (
            isinstance(tw, p.Tensor)
            and isinstance(td, p.Tensor)
            and not self.writers.get(w)
            and w not in self.inputs
            and w not in self.outputs
            and tw.shape_dynamism == p.STATIC
            and tw.scalar_type == td.scalar_type
            and tw.numel == td.numel
            and self.region(w) == self.region(d)
        )

    def readers(self, i: int, target: int) -> tuple[int, set[int], list[int]] | None:
        """(last read, values reading ``target``'s data, view aliases to redirect), or None
        when some value reads those bytes in a way a view cannot reproduce."""
        live = {target}
        redirects: list[int] = []
        last = i
        target_region = self.region(target)
        for k in range(i + 1, len(self.instructions)):
            for w in sorted(self.reads[k]):
                if w in live:
                    last = k
                    continue
                reg = self.region(w)
                if reg[0] != "planned" or not _overlaps(reg, target_region):
                    continue
                between = [r for j in range(i + 1, k) for r in self.writes[j] if _overlaps(r, reg)]
                if any(_covers(r, reg) for r in between):
                    continue  # a newer tensor lives there now
                if between or not self.is_view_alias(w, target):
                    return None
                redirects.append(w)
                live.add(w)
                last = k
            if k in self.et_views:
                ins = self.instructions[k]
                if isinstance(ins, p.KernelCall) and ins.args[0] in live:
                    live.add(ins.args[-1])
        return last, live, redirects


def elide_copies(
    plan: p.ExecutionPlan,
    chain: p.Chain,
    statements: list[Emission],
    names: Sequence[str],
    values: list[Any],
) -> list[Emission]:
    """``statements`` with provably unneeded copies replaced by views (see module doc).

    ``values`` is the method's values table: views of constants are computed into it.
    """
    if any(isinstance(ins, p.JumpFalseCall) for ins in chain.instructions):
        return statements
    c = _Chain(plan, chain, statements, {k for k, name in enumerate(names) if name in _ET_VIEW})
    result = list(statements)
    for i, st in enumerate(statements):
        if i in c.et_views:
            ins = chain.instructions[i]
            assert isinstance(ins, p.KernelCall)
            c.root[ins.args[-1]] = ins.args[0]  # out aliases self
            continue
        alias = st.alias
        if alias is None:
            continue
        targets = alias.targets
        if any(
            t in c.inputs
            or t in c.outputs
            or c.writers.get(t, set()) != {i}
            or not isinstance(c.values[t], p.Tensor)
            for t in targets
        ):
            continue
        last = i
        lines = [alias.code]
        live_all: set[int] = set()
        ok = True
        for t in targets:
            found = c.readers(i, t)
            if found is None:
                ok = False
                break
            t_last, live, redirects = found
            last = max(last, t_last)
            live_all |= live
            for w in redirects:
                tw = c.values[w]
                assert isinstance(tw, p.Tensor)
                lines.append(f"v[{w}] = v[{t}].reshape({list(tw.sizes)})")
        if not ok or live_all & c.outputs:
            continue
        source_region = c.region(c.base(alias.source))
        if any(_overlaps(r, source_region) for k in range(i + 1, last + 1) for r in c.writes[k]):
            continue
        for t in live_all:
            if t != alias.source:
                c.root[t] = alias.source
        c.writes[i] = []
        code = "\n".join(lines)
        refs = {int(m) for m in _REF.findall(code)}
        if source_region[0] == "constant" and refs <= {alias.source, *live_all}:
            env = dict(alias.env)
            env["v"] = values
            exec(code, env)  # a view of a constant: once, now
            result[i] = Emission("pass", {}, (), ())
        else:
            result[i] = Emission(code, alias.env, tuple(sorted(live_all - {alias.source})), ())
    return result
