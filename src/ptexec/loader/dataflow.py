"""Dataflow over a chain's memory plan, and the two rewrites it proves safe.

ExecuTorch programs copy where eager PyTorch takes a view (``permute_copy``,
``view_copy``, ``split_with_sizes_copy``, a same-dtype ``_to_dim_order_copy``, ...), and
recompute on every call what depends on constants alone (a causal mask, say). Two
rewrites remove that work:

**Copies become views.** ``D = copy(S)`` runs as ``D = view(S)`` when nothing can tell:

1. ``D`` is written by this instruction only, and is neither an input nor an output of the
   method (an output must own its memory);
2. whoever later reads the bytes this instruction wrote reads them through ``D`` (or a view
   of ``D``). ExecuTorch's emitter turns a static ``view`` into a second value planned at
   the same bytes, and the plan hands bytes to a new tensor once the old one is dead, so
   reads are followed byte range by byte range: a value read before anything else wrote its
   bytes reads ``D``'s data. Such a value at exactly ``D``'s bytes, with the same number of
   elements, becomes a reshaped view of ``D``; any other reader of those bytes keeps the copy;
3. nothing writes the memory ``S`` reads from (following views back to planned bytes,
   constants or a tensor's own memory) until the last read of ``D``.

A view whose source is the same tensor object on every call (a static tensor in planned
memory, or such a view itself) is made once and held: the statement assigns the held view
while the slot holds the object it was made from (``v[9] = h[0][1] if v[4] is h[0][0]
else ...``), and makes and holds a new one otherwise; what the expression makes is held
only where it shares its source's memory (a ``reshape`` of a transposed view copies). A
static tensor in planned memory keeps its storage, offset, sizes and strides for the
method's life (a failed call's restore gives them back), so the held view is the view the
statement would make; making one costs a few microseconds of torch's dispatch, checking
the object tens of nanoseconds.

**Outputs nothing reads are not written.** An instruction that can skip some of its
outputs (batch norm's saved statistics, say) skips those that no later instruction reads,
under conditions 1 and 2.

**A negated reduction of a negation is the other reduction.** The mask an exported
attention computes, ``logical_not(any(logical_not(m), dim))``, runs as ``all(m, dim)``
(the same booleans, two kernel calls fewer) where the three instructions follow one
another, every tensor is a static bool one, the two intermediates are written by these
instructions alone and read by nothing else, and the result is read only through its
own value (conditions 1 and 2): the first instruction then puts ``all``'s new tensor in
the result's slot (its planned bytes may be ``m``'s), the other two do nothing.

**Work on constants runs once.** A pure instruction (no randomness, writing only its
``out`` arguments) whose tensor arguments are all constants or results of such folded
instructions, and whose other arguments are fixed, runs at load; its results get memory
of their own (up to a byte budget), under conditions 1 and 2 above.

A chain loaded again (the same plan, statements of the same facts) replays the
decisions the first load recorded rather than analysing it afresh; what a fold computes
from the plan alone (no tensor of the program read: a causal mask) is kept and shared by
those loads, and a view of constants that an earlier instruction made already (the same
expression of the same source) is an alias of that one.

Chains with jumps are left alone.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import types
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from ..codegen import run_once
from ..effects import Effects, byte_range, effects, kind, tensor_items
from ..format import program as p
from ..format.lru import Key, Lru
from ..format.scalar_type import BOOL
from ..kernels.registry import Statement

__all__ = ["FUSED_AWAY", "clear_recipes", "is_fused", "rewrite_chain"]

_ET_VIEW = ("executorch_prim::et_view.default", "executorch_prim::et_view")
# the statement of an instruction done at load (folded, or a view of constants made):
# nothing, the same (immutable) object for every method
_DONE = Statement("pass", types.MappingProxyType({}), (), ())
# the statement of an instruction a fused one before it does (its values are never written)
FUSED_AWAY = Statement("pass", types.MappingProxyType({}), (), ())

_NOT = "aten::logical_not.out"
# any's out overloads, and all's entry point (torch's own: the same arguments, no out)
_ANY = ("aten::any.out", "aten::any.dims_out", "aten::any.all_out")
_ALL = types.MappingProxyType({"_all": torch.all})


def is_fused(st: Statement) -> bool:
    """Whether ``st`` runs its instruction and the next ones as one (:data:`FUSED_AWAY`
    stands for those)."""
    return st.env is _ALL


Region = tuple[Any, ...]


def _overlaps(a: Region, b: Region) -> bool:
    if a[0] == "fixed" or b[0] == "fixed":
        return False
    if a[0] == "planned" and b[0] == "planned":
        return bool(a[1] == b[1] and a[2] < b[3] and b[2] < a[3])
    return a == b


def _covers(a: Region, b: Region) -> bool:
    """``a`` contains every byte of ``b``."""
    if a[0] == "planned" and b[0] == "planned":
        return bool(a[1] == b[1] and a[2] <= b[2] and b[3] <= a[3])
    return a == b and a[0] != "fixed"


class _Ranges:
    """Byte ranges in planned buffers, each tagged with an instruction and a value, found by
    overlap and by instruction window in time proportional to what is found: every buffer
    is cut into at most about 128 buckets, a range is filed under each bucket it touches,
    and each bucket keeps its entries in instruction order (they are added in that order)."""

    def __init__(self, buffer_sizes: Sequence[int]) -> None:
        self.width = {m: max(256, size // 128) for m, size in enumerate(buffer_sizes)}
        # per bucket: its entries, and their instructions (bisected without a key function)
        self.buckets: dict[tuple[int, int], tuple[list[tuple[int, int, int, int]], list[int]]] = {}

    def _span(self, mem: int, start: int, end: int) -> range:
        w = self.width.get(mem, 4096)
        return range(start // w, max(start, end - 1) // w + 1)

    def add(self, k: int, region: Region, value: int) -> None:
        _, mem, start, end = region
        entry = (k, start, end, value)
        buckets = self.buckets
        for b in self._span(mem, start, end):
            found = buckets.get((mem, b))
            if found is None:
                buckets[(mem, b)] = ([entry], [k])
            else:
                found[0].append(entry)
                found[1].append(k)

    def within(self, region: Region, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        """(instruction, start, end, value) of the ranges overlapping ``region`` filed by
        instructions ``lo < k < hi``, each once, in no particular order (found by
        bisection at both ends of each bucket)."""
        _, mem, start, end = region
        buckets = self.buckets
        found: list[tuple[int, int, int, int]] = []
        span = self._span(mem, start, end)
        for b in span:
            hit = buckets.get((mem, b))
            if hit is None:
                continue
            entries, ks = hit
            first = bisect.bisect_right(ks, lo)
            last = bisect.bisect_left(ks, hi, first)
            found.extend([e for e in entries[first:last] if e[1] < end and start < e[2]])
        if len(span) > 1 and len(found) > 1:  # a range filed under several buckets
            found = list(dict.fromkeys(found))
        return found

    def covering(self, region: Region, lo: int, hi: int) -> Iterator[tuple[int, int, int, int]]:
        """The ranges of :meth:`within` that contain every byte of ``region``, lazily, in
        instruction order. Such a range is filed under every bucket ``region`` touches, so
        the region's first bucket holds them all: one bucket is read, nothing merged."""
        _, mem, start, end = region
        found = self.buckets.get((mem, start // self.width.get(mem, 4096)))
        if found is None:
            return
        entries, ks = found
        for entry in itertools.islice(entries, bisect.bisect_right(ks, lo), None):
            if entry[0] >= hi:
                return
            s, e = entry[1], entry[2]
            if s <= start and end <= e and s < end and start < e:
                yield entry


class _ChainAccesses:
    """Reads and memory writes of each instruction, kept current as the chain is rewritten.

    The rewrites only ever remove writes (an instruction folded or turned into a view writes
    nothing any more) and turn planned values into fixed ones, so the indexes made here
    (who reads each value, which planned bytes each instruction reads and writes) hold a
    superset of the current facts; every query checks its hits against them."""

    def __init__(
        self,
        plan: p.ExecutionPlan,
        chain: p.Chain,
        statements: list[Statement],
        et_views: set[int],
        known: Sequence[Effects] | None = None,
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
        self._planned: dict[int, tuple[int, int, int] | None] = {}  # byte_range, once
        self.fixed: set[int] = set()  # values whose memory is constant: the file's, or folded
        self.held: set[int] = set()  # slots given a held view (see _holdable)
        self.moved = {
            ins.move_to for ins in chain.instructions if isinstance(ins, p.MoveCall)
        }  # slots a move gives an object
        for j, v in enumerate(self.values):
            if isinstance(v, p.Tensor) and v.is_constant:
                self.fixed.add(j)
        self.readers_of: dict[int, list[int]] = {}
        self.read_ranges = _Ranges(plan.non_const_buffer_sizes)
        self.write_ranges = _Ranges(plan.non_const_buffer_sizes)
        self.other_writes: dict[Region, list[int]] = {}
        for k, (ins, st) in enumerate(zip(chain.instructions, statements, strict=True)):
            e = effects(self.values, ins, st) if known is None else known[k]
            reads = set(e.reads)
            if kind(ins) == "move":  # the moved-to slot is kept as read too
                assert isinstance(ins, p.MoveCall)
                reads.update(tensor_items(self.values, ins.move_to))
            self.reads.append(reads)
            for r in reads:
                self.readers_of.setdefault(r, []).append(k)
                reg = self.region(r)
                if reg[0] == "planned":
                    self.read_ranges.add(k, reg, r)
            writes = [self.region(w) for w in e.writes]
            self.writes.append(writes)
            for w, reg in zip(e.writes, writes, strict=True):
                if reg[0] == "planned":
                    self.write_ranges.add(k, reg, w)
                else:
                    self.other_writes.setdefault(reg, []).append(k)
            for w in e.written:
                self.writers.setdefault(w, set()).add(k)

    def writes_between(self, reg: Region, lo: int, hi: int) -> list[Region]:
        """The memory writes of instructions ``lo < j < hi`` that overlap region ``reg``."""
        found = []
        if reg[0] == "planned":
            for j, start, end, _ in self.write_ranges.within(reg, lo, hi):
                r = ("planned", reg[1], start, end)
                if r in self.writes[j]:
                    found.append(r)
        elif reg[0] != "fixed":
            for j in self.other_writes.get(reg, ()):
                if lo < j < hi and reg in self.writes[j]:
                    found.append(reg)
        return found

    def region(self, index: int) -> Region:
        """Where value ``index``'s bytes are, as the plan lays them out."""
        if index in self.fixed:
            return ("fixed", index)
        if index in self._planned:
            found = self._planned[index]
        else:
            found = self._planned[index] = byte_range(self.values[index])
        if found is not None:
            return ("planned", *found)
        if index in self.inputs:
            return ("input", index)
        return ("own", index)

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

    def may_replace(self, i: int, target: int) -> bool:
        """Condition 1: instruction ``i`` alone writes ``target``, an internal tensor."""
        return (
            target not in self.inputs
            and target not in self.outputs
            and self.writers.get(target, set()) == {i}
            and isinstance(self.values[target], p.Tensor)
        )

    def readers(self, i: int, target: int) -> tuple[int, set[int], list[int]] | None:
        """Condition 2: (last read, values reading ``target``'s data, view aliases to
        redirect), or None when some value reads those bytes in a way a view cannot follow.

        Visits, in program order, only the instructions after ``i`` that read a value
        reading ``target``'s data, or a planned value overlapping its bytes before a later
        write covers them all (after that, no read of those bytes sees ``target``'s data)."""
        live = {target}
        redirects: list[int] = []
        last = i
        target_region = self.region(target)
        todo: list[int] = [k for k in self.readers_of.get(target, ()) if k > i]
        if target_region[0] == "planned":
            n = len(self.instructions)
            stop = n
            for j, start, end, _ in self.write_ranges.covering(target_region, i, n):
                if ("planned", target_region[1], start, end) in self.writes[j]:
                    stop = j
                    break
            window = self.read_ranges.within(target_region, i, stop + 1)
            todo.extend(k for k, _, _, _ in window)
        heapq.heapify(todo)
        done: set[int] = set()

        def follow(value: int, after: int) -> None:
            for k in self.readers_of.get(value, ()):
                if k > after:
                    heapq.heappush(todo, k)

        while todo:
            k = heapq.heappop(todo)
            if k in done:
                continue
            done.add(k)
            for w in sorted(self.reads[k]):
                if w in live:
                    last = k
                    continue
                reg = self.region(w)
                if reg[0] != "planned" or not _overlaps(reg, target_region):
                    continue
                between = self.writes_between(reg, i, k)
                if any(_covers(r, reg) for r in between):
                    continue  # a newer tensor lives there now
                if between or not self.is_view_alias(w, target):
                    return None
                redirects.append(w)
                live.add(w)
                follow(w, k)
                last = k
            if k in self.et_views:
                ins = self.instructions[k]
                if isinstance(ins, p.KernelCall) and ins.args[0] in live:
                    live.add(ins.args[-1])
                    follow(ins.args[-1], k)
        if live & self.outputs:
            return None
        return last, live, redirects


def _redirect(c: _ChainAccesses, target: int, w: int) -> str:
    tw = c.values[w]
    assert isinstance(tw, p.Tensor)
    sizes = ", ".join(map(str, tw.sizes)) or "()"  # torch parses separate ints faster
    return f"v[{w}] = v[{target}].reshape({sizes})"


def _fold(
    c: _ChainAccesses,
    i: int,
    st: Statement,
    values: list[Any],
    budget: list[int],
    log: _Log,
) -> Statement | None:
    """Run instruction ``i`` now if its inputs are fixed; None when it must run per call."""
    if not st.pure or not st.outs or st.mutates is None or set(st.mutates) != set(st.outs):
        return None
    if st.reads is None or not all(r in c.fixed for r in st.reads):
        return None  # a tensor computed per call, or a scalar an instruction writes
    outs = st.outs
    nbytes = 0
    plans: list[tuple[int, str, list[int]]] = []
    for o in outs:
        if not c.may_replace(i, o):
            return None
        found = c.readers(i, o)
        if found is None:
            return None
        t = c.values[o]
        assert isinstance(t, p.Tensor)
        nbytes += t.nbytes
        redirects = found[2]
        plans.append((o, "\n".join(_redirect(c, o, w) for w in redirects), redirects))
    if nbytes > budget[0]:
        return None
    folded = tuple((o, code) for o, code, _ in plans)
    touched = [*outs, *(w for _, _, redirects in plans for w in redirects)]
    if not _run_fold(st, folded, touched, values):
        log.ok = False  # the outcome depends on the constants: not a recipe for others
        return None
    log.steps.append(("fold", i, (folded, tuple(touched))))
    budget[0] -= nbytes
    for o, _, redirects in plans:
        c.fixed.add(o)
        c.fixed.update(redirects)
    c.writes[i] = []
    return _DONE


def _run_fold(
    st: Statement, folded: Sequence[tuple[int, str]], touched: Sequence[int], values: list[Any]
) -> bool:
    """Run ``st`` now into memory of its own for each out, then each out's redirects
    (``folded``: (out, redirect code)); False, with ``touched`` slots as they were, when it
    fails on the constants (a malformed program: each call runs it, and fails)."""
    saved = [(k, values[k]) for k in touched]
    for o, _ in folded:  # memory of its own: the plan hands the planned bytes to later tensors
        planned = values[o]
        assert isinstance(planned, torch.Tensor)
        values[o] = torch.empty_like(planned)
    env = dict(st.env)
    env["v"] = values
    try:
        run_once(st.code, env)
        for _, code in folded:
            if code:
                run_once(code, {"v": values})
    except Exception:
        for k, planned in saved:
            values[k] = planned
        return False
    return True


def _elide(
    c: _ChainAccesses, i: int, st: Statement, values: list[Any], log: _Log
) -> Statement | None:
    """Run copy instruction ``i`` as a view when the conditions hold; None otherwise."""
    alias = st.alias
    if alias is None or not all(c.may_replace(i, t) for t in alias.targets):
        return None
    last = i
    lines = [alias.code]
    live_all: set[int] = set()
    for t in alias.targets:
        found = c.readers(i, t)
        if found is None:
            return None
        t_last, live, redirects = found
        last = max(last, t_last)
        live_all |= live
        lines.extend(_redirect(c, t, w) for w in redirects)
    source_region = c.region(c.base(alias.source))
    if c.writes_between(source_region, i, last + 1):
        return None  # condition 3
    for t in live_all:
        if t != alias.source:
            c.root[t] = alias.source
    c.writes[i] = []
    code = "\n".join(lines)
    writes = tuple(sorted(live_all - {alias.source}))
    held = len(lines) == 1 and _holdable(c, alias, source_region)
    if (
        source_region[0] == "fixed"
        and alias.reads is not None
        and set(alias.reads) <= {alias.source}
    ):
        if _view_now(st, code, values):
            log.steps.append(("view", i, (code, tuple(_assigned(code)))))
            c.fixed |= live_all
            return _DONE
        log.ok = False  # the outcome depends on the constants: not a recipe for others
    if held:
        c.held.update(alias.targets)
    log.steps.append(("elide", i, (code, writes, held)))
    return _elided(i, st, code, writes, held)


def _holdable(c: _ChainAccesses, alias: Any, source_region: Region) -> bool:
    """Whether the view ``alias`` makes may be made once and held (module docstring):
    static targets (one, or the pieces of a split), made from its source alone; the
    source a static tensor whose bytes are planned, its slot given no object by a move,
    and either the plan's own tensor or a held view itself."""
    src = alias.source
    ts = c.values[src]
    return (
        source_region[0] == "planned"
        and alias.reads is not None
        and set(alias.reads) <= {src}
        and isinstance(ts, p.Tensor)
        and ts.shape_dynamism == p.STATIC
        and all(
            isinstance(tt := c.values[t], p.Tensor) and tt.shape_dynamism == p.STATIC
            for t in alias.targets
        )
        and src not in c.moved
        and (src not in c.root or src in c.held)
    )


def _elided(i: int, st: Statement, code: str, writes: tuple[int, ...], held: bool) -> Statement:
    """The statement running copy instruction ``i`` as the view ``code`` makes; with
    ``held``, one that makes the view once and assigns it while its source is the same
    object."""
    alias = st.alias
    assert alias is not None
    # a view: its sizes follow from its source's
    head, expr = code.split(" = ", 1) if held else (code, "")
    if not held or expr == f"v[{alias.source}]":  # (the source itself: nothing to hold)
        return Statement(code, alias.env, writes, (), reads=alias.reads, sized=True)
    text, env = _held_view(i, alias.source, expr, alias.env)
    return Statement(f"{head} = {text}", env, writes, (), reads=alias.reads, sized=True)


def _held_view(
    i: int, source: int, expr: str, env: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """An expression giving the view ``expr`` makes of value ``source``: the one held in a
    cell while the source's slot holds the object it was made from, else a new one, then
    held (a cell of its own per statement: each load makes its own statements)."""
    cell, hold, src = f"_i{i}_held", f"_i{i}_hold", f"v[{source}]"
    text = f"{cell}[0][1] if {src} is {cell}[0][0] else {hold}({cell}, {src}, {expr})"
    return text, {**env, cell: [(None, None)], hold: _hold}


def _copy_of_held(c: _ChainAccesses, i: int, st: Statement, log: _Log) -> Statement | None:
    """A copy that stays a copy (its bytes are read elsewhere, say) but reads a view that
    can be held (:func:`_holdable`): the view is held, the copy runs per call."""
    alias = st.alias
    if alias is None or len(alias.targets) != 1:
        return None
    head, _, expr = alias.code.partition(" = ")
    if st.code != f"{head}.copy_({expr})" or expr == f"v[{alias.source}]":
        return None  # not a copy of a view (a clone's "view" is its source itself)
    if not _holdable(c, alias, c.region(c.base(alias.source))):
        return None
    log.steps.append(("held copy", i, expr))
    return _held_copy(i, st, expr)


def _held_copy(i: int, st: Statement, expr: str) -> Statement:
    alias = st.alias
    assert alias is not None
    text, env = _held_view(i, alias.source, expr, st.env)
    return dataclasses.replace(st, code=f"v[{alias.targets[0]}].copy_({text})", env=env)


def _hold(cell: list[tuple[Any, Any]], source: Any, view: Any) -> Any:
    """Hold ``view``, made from ``source``, in ``cell`` (one tuple: replaced at once), when
    it is a view: a ``reshape`` of a source its strides cannot reshape (a transposed view
    an elided copy left) is a copy of today's data, made again on each call."""
    at = source.untyped_storage().data_ptr()
    pieces = view if isinstance(view, tuple | list) else (view,)  # a split's pieces
    if all(t.untyped_storage().data_ptr() == at for t in pieces):
        cell[0] = (source, view)
    return view


def _view_now(st: Statement, code: str, values: list[Any]) -> bool:
    """Make the views of constants ``code`` makes, once, now; False when it fails on the
    constants (a malformed program: each call runs it, and fails)."""
    assert st.alias is not None
    env = dict(st.alias.env)
    env["v"] = values
    try:
        run_once(code, env)
    except Exception:
        return False
    return True


def _fuse_all(
    c: _ChainAccesses, i: int, names: Sequence[str], statements: Sequence[Statement], log: _Log
) -> Statement | None:
    """``logical_not``, ``any``, ``logical_not`` at ``i``, ``i + 1``, ``i + 2`` as one
    ``all`` at ``i`` writing the last one's result, when the conditions hold (module
    docstring); None otherwise. ``not any(not m)`` is ``all(m)`` for booleans, bit for bit."""
    if i + 2 >= len(statements) or names[i] != _NOT or names[i + 2] != _NOT:
        return None
    if names[i + 1] not in _ANY:
        return None
    calls = c.instructions[i : i + 3]
    if not all(isinstance(ins, p.KernelCall) for ins in calls):
        return None
    first, reduce, last = (ins.args for ins in calls if isinstance(ins, p.KernelCall))
    m, b = first[0], first[-1]
    middle, d = last[0], last[-1]
    if reduce[0] != b or reduce[-1] != middle or len({m, b, middle, d}) != 4:
        return None
    if c.region(m)[0] == "fixed":
        return None  # work on constants: folded instead
    for k, out in ((i, b), (i + 1, middle), (i + 2, d)):
        st = statements[k]
        if st.outs != (out,) or st.mutates != (out,) or st.empties or not st.sized:
            return None
    for t in (m, b, middle, d):
        value = c.values[t]
        if not (
            isinstance(value, p.Tensor)
            and value.scalar_type == BOOL
            and value.shape_dynamism == p.STATIC
        ):
            return None
    # the reduction's dims and keepdim: fixed values
    fixed = reduce[1:-2]
    literals = []
    for a in fixed:
        value = c.values[a]
        if c.writers.get(a) or a in c.inputs:
            return None
        if isinstance(value, p.Int | p.Bool):
            literals.append(repr(value.value))
        elif isinstance(value, p.IntList):
            items = [c.values[x] for x in value.items]
            if not all(
                isinstance(x, p.Int) and not c.writers.get(y)
                for x, y in zip(items, value.items, strict=True)
            ):
                return None
            literals.append(repr(tuple(x.value for x in items if isinstance(x, p.Int))))
        else:
            return None  # a missing dims list: every dim, left as it is
    for k, t in ((i, b), (i + 1, middle), (i + 2, d)):
        if not c.may_replace(k, t):
            return None
        found = c.readers(k, t)
        if found is None or found[1] != {t} or found[2]:
            return None
        if t != d and found[0] != k + 1:
            return None
    # the result is a new tensor in the slot (its planned bytes may be ``m``'s, which the
    # reduction reads), which nothing reads through other values (condition 2)
    code = f"v[{d}] = _all(v[{m}]{''.join(f', {x}' for x in literals)})"
    fused = Statement(code, _ALL, (d,), (), None, (), False, reads=(m,), sized=True)
    c.writes[i] = []
    c.writes[i + 1] = c.writes[i + 2] = []
    c.writers[d] = {i}
    log.steps.append(("all", i, fused))
    return fused


def _prune(c: _ChainAccesses, i: int, st: Statement, log: _Log) -> Statement | None:
    """Drop the writes of outputs nothing reads (under conditions 1 and 2), of a pure
    statement: tools that show every output (an ETDump's debug buffer) compute a pruned
    one by running the instruction again, which a random kernel (dropout's mask) or one
    with effects (training batch norm's running statistics) cannot do faithfully."""
    if st.prune is None or not st.pure:
        return None
    dead = set()
    for o in st.outs:
        if not c.may_replace(i, o):
            continue
        found = c.readers(i, o)
        if found is not None and found[0] == i and found[1] == {o} and not found[2]:
            dead.add(o)
    if not dead:
        return None
    c.writes[i] = [c.region(o) for o in st.outs if o not in dead]
    log.steps.append(("prune", i, frozenset(dead)))
    return _pruned(st, frozenset(dead))


def _pruned(st: Statement, dead: frozenset[int]) -> Statement:
    assert st.prune is not None
    kept = tuple(o for o in st.outs if o not in dead)
    return Statement(
        st.prune(dead), st.env, st.writes, kept, None, kept, st.pure, reads=st.reads, sized=st.sized
    )


def rewrite_chain(
    plan: p.ExecutionPlan,
    chain: p.Chain,
    statements: list[Statement],
    names: Sequence[str],
    values: list[Any],
    fold_limit: int,
    known: Sequence[Effects] | None = None,
) -> list[Statement]:
    """``statements`` with copies turned into views and constant work done now (see the
    module docstring). ``values`` is the method's values table; folded results and views
    of constants are stored into it. At most ``fold_limit`` bytes of results are folded.
    ``known``: the effects of ``statements``, when the caller has them already."""
    if chain.jumps:
        return statements
    key = _recipe_key(plan, chain, fold_limit, names, statements)
    known_recipe = _recipes.get(key)
    if known_recipe is not None and known_recipe[0] is plan:
        steps, made = known_recipe[1], known_recipe[2]
        kept = _results.get(key)
        replayed = _replay(steps, statements, values, kept, made)
        if replayed is not None:
            if kept is None:
                _keep_results(key, steps, statements, values)
            return replayed
    c = _ChainAccesses(
        plan, chain, statements, {k for k, name in enumerate(names) if name in _ET_VIEW}, known
    )
    budget = [fold_limit]
    log = _Log()
    result = list(statements)
    skipped: set[int] = set()  # the instructions a fused one covers
    for i, st in enumerate(statements):
        if i in c.et_views:
            ins = chain.instructions[i]
            assert isinstance(ins, p.KernelCall)
            c.root[ins.args[-1]] = ins.args[0]  # out aliases self
            continue
        if i in skipped:
            continue
        fused = _fuse_all(c, i, names, result, log)
        if fused is not None:
            result[i] = fused
            skipped.update((i + 1, i + 2))
            result[i + 1] = result[i + 2] = FUSED_AWAY
            continue
        # a view costs no memory, so a copy of constants becomes a view before it is folded
        rewritten = _elide(c, i, st, values, log)
        if rewritten is None:
            rewritten = _fold(c, i, st, values, budget, log)
        if rewritten is None:
            rewritten = _prune(c, i, st, log)
        if rewritten is None:
            rewritten = _copy_of_held(c, i, st, log)
        if rewritten is not None:
            result[i] = rewritten
    if log.ok:
        steps = _same_views(log.steps)
        _recipes.put(key, (plan, steps, {}))  # the plan kept alive: its id stays its own
        _keep_results(key, steps, statements, values)
    return result


# -- recipes: what the analysis decided, for the same chain loaded again ----------------
#
# The analysis is a function of the plan, the chain, the statements' facts (code, what
# they read and write, their alias and prune forms) and the fold budget; only running
# folds and views of constants at load depends on the constants' bytes, and a chain
# where one of those failed is not recorded. So a chain of a plan met before (the decoded
# plan is shared by the loads of one file, see ptexec.format.pte) with statements of the
# same facts replays the recorded decisions on its own statements and values: the same
# rewrites, the same folds run on its own constants. If a fold or a view fails on them,
# every slot the replay touched is put back and the analysis runs in full.

RECIPES = 64
_Step = tuple[str, int, Any]
# per chain: its plan, its steps, and the statements replaying them made that hold
# nothing of a load (by instruction: the statement rewritten, and what it became)
_Made = dict[int, tuple[Statement, Statement]]
_recipes: Lru[tuple[p.ExecutionPlan, tuple[_Step, ...], _Made]] = Lru(RECIPES, 0)


def clear_recipes() -> None:
    """Forget the recipes of chains, their keys and their kept results."""
    _recipes.clear()
    _keys.clear()
    _results.clear()


class _Log:
    """The decisions of one analysis, in order; ``ok`` False when one depended on the
    constants' bytes (a fold or a view that failed on them)."""

    def __init__(self) -> None:
        self.steps: list[_Step] = []
        self.ok = True


def _signature(st: Statement) -> tuple[Any, ...]:
    """The facts of ``st`` the analysis reads."""
    a = st.alias
    return (
        st.code,
        st.writes,
        st.mutates,
        st.outs,
        st.pure,
        st.reads,
        st.prune is not None,
        None if a is None else (a.code, a.source, a.targets, a.reads),
    )


# per chain, the key last computed and the statements it was computed from (held weakly):
# the same statement objects have the same facts (they are frozen), so a load that
# prepared the chain with the very same objects (kept statements) reuses the key
_keys: Lru[tuple[p.ExecutionPlan, tuple[str, ...], tuple[Any, ...], Key]] = Lru(RECIPES, 0)


def _recipe_key(
    plan: p.ExecutionPlan,
    chain: p.Chain,
    fold_limit: int,
    names: Sequence[str],
    statements: Sequence[Statement],
) -> Key:
    """The key of ``chain``'s recipe: the plan, the chain, the fold budget, the
    instructions' names and the facts of their statements."""
    short = (id(plan), id(chain), fold_limit)
    names = tuple(names)
    last = _keys.get(short)
    if (
        last is not None
        and last[0] is plan
        and last[1] == names
        and len(last[2]) == len(statements)
        and all(r() is st for r, st in zip(last[2], statements, strict=True))
    ):
        return last[3]
    key = Key(*short, names, tuple(map(_signature, statements)))
    _keys.put(short, (plan, names, tuple(weakref.ref(st) for st in statements), key))
    return key


def _replay(
    steps: Sequence[_Step],
    statements: Sequence[Statement],
    values: list[Any],
    kept: Mapping[int, _Kept] | None = None,
    made: _Made | None = None,
) -> list[Statement] | None:
    """``statements`` rewritten as ``steps`` say; None (``values`` as they were) when a
    fold or a view fails on this method's constants. ``kept``: per instruction, results
    of the plan alone to alias rather than make again (:func:`_keep_results`); ``made``:
    rewritten statements that hold nothing of a load (a view that is not held, a pruned
    statement), by instruction, reused for the same statement (kept statements are
    shared by the loads of a plan), and where new ones are noted."""
    if made is None:
        made = {}
    result = list(statements)
    saved: list[tuple[int, Any]] = []
    for what, i, detail in steps:
        st = statements[i]
        done = None if kept is None else kept.get(i)
        if done is not None and _alias_kept(done, values, saved):
            result[i] = _DONE
        elif what == "fold":
            folded, touched = detail
            saved.extend((k, values[k]) for k in touched)
            if not _run_fold(st, folded, touched, values):
                break
            result[i] = _DONE
        elif what == "same view":
            first, slot = detail
            saved.append((slot, values[slot]))
            values[slot] = values[first].detach()
            result[i] = _DONE
        elif what == "view":
            assert st.alias is not None
            code, assigned = detail
            saved.extend((k, values[k]) for k in (*st.alias.targets, *assigned))
            if not _view_now(st, code, values):
                break
            result[i] = _DONE
        elif what == "held copy":
            result[i] = _held_copy(i, st, detail)
        elif what == "elide" and detail[2]:  # a held view: its cell is its load's own
            result[i] = _elided(i, st, *detail)
        elif what == "all":
            result[i] = detail
            result[i + 1] = result[i + 2] = FUSED_AWAY
        else:
            before = made.get(i)
            if before is None or before[0] is not st:
                new = _elided(i, st, *detail) if what == "elide" else _pruned(st, detail)
                before = made[i] = (st, new)
            result[i] = before[1]
    else:
        return result
    for k, value in reversed(saved):
        values[k] = value
    return None


# -- kept results: what the plan alone computes, made once for every load ------------------
#
# A fold that reads no tensor (a causal mask's ``arange`` and ``full``, an initial state of
# zeros), and a fold or a view of constants that reads only the results of such folds, is
# a function of the plan and its statements' facts alone (the recipe's key): not of the
# program's constants, nor of anything a load makes. Its results are read-only memory (no
# instruction writes them, no output hands them out: conditions 1 and 2), like the
# program's constants. So the first load of a chain keeps them, and later loads of it take
# aliases of them: tensors of their own (a failed call's restore sets only its own
# method's), the memory shared, nothing run.

RESULTS_BYTES = 64 << 20  # what the kept results of all chains may hold together


class _Kept(NamedTuple):
    """The slots an instruction's rewrite assigned, and the tensors it put there."""

    slots: tuple[int, ...]
    tensors: tuple[torch.Tensor, ...]


_results: Lru[dict[int, _Kept]] = Lru(RECIPES, RESULTS_BYTES)


def _keep_results(
    key: Key,
    steps: Sequence[_Step],
    statements: Sequence[Statement],
    values: Sequence[Any],
) -> None:
    """Keep, under ``key``, the results of ``steps`` (done on ``values``) that depend on
    the plan alone: folds and views of constants whose every read is such a result."""
    made: set[int] = set()
    kept: dict[int, _Kept] = {}
    storages: dict[int, int] = {}
    for what, i, detail in steps:
        st = statements[i]
        if what == "fold":
            reads, slots = st.reads, tuple(detail[1])
        elif what == "view" and st.alias is not None:
            reads, slots = st.alias.reads, tuple(dict.fromkeys((*st.alias.targets, *detail[1])))
        elif what == "same view":
            reads, slots = (detail[0],), (detail[1],)
        else:
            continue
        if reads is None or not made.issuperset(reads):
            continue
        found = [values[k] for k in slots]
        if not all(type(t) is torch.Tensor for t in found):
            continue
        tensors = tuple(t.detach() for t in found)  # (objects of no load's table)
        made.update(slots)
        kept[i] = _Kept(slots, tensors)
        for t in tensors:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    _results.put(key, kept, sum(storages.values()))  # (none, too: not looked for again)


def _alias_kept(done: _Kept, values: list[Any], saved: list[tuple[int, Any]]) -> bool:
    """Put aliases of the kept tensors ``done`` in their slots of ``values`` (the slots
    noted in ``saved`` first); False, nothing changed, where this load's tensors are on
    another device than the kept ones (a device map the recipe's key does not hold)."""
    slots, tensors = done
    for k, t in zip(slots, tensors, strict=True):
        if getattr(values[k], "device", None) != t.device:
            return False
    for k, t in zip(slots, tensors, strict=True):
        saved.append((k, values[k]))
        values[k] = t.detach()
    return True


def _same_views(steps: Sequence[_Step]) -> tuple[_Step, ...]:
    """``steps``, each view of constants that makes one tensor exactly as an earlier one
    did (the same expression of the same source: an unrolled recurrent model transposes
    its weights once a step) recorded as a ``same view`` of the earlier one's tensor: an
    alias made in a microsecond, rather than the expression run again."""
    first: dict[str, int] = {}
    out: list[_Step] = []
    for step in steps:
        what, i, detail = step
        if what == "view":
            code, assigned = detail
            head, _, expr = code.partition(" = ")
            if len(assigned) == 1 and head == f"v[{assigned[0]}]" and "\n" not in expr:
                made = first.setdefault(expr, assigned[0])
                if made != assigned[0]:
                    step = ("same view", i, (made, assigned[0]))
        out.append(step)
    return tuple(out)


def _assigned(code: str) -> list[int]:
    """The slots ``v[k] = ...`` lines of ``code`` assign."""
    out = []
    for line in code.splitlines():
        head = line.split(" = ", 1)[0].strip()
        if head.startswith("v[") and head.endswith("]") and head[2:-1].isdigit():
            out.append(int(head[2:-1]))
    return out
