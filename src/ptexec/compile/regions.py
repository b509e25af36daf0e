"""Which instructions compile together, and how a compiled run meets the values table.

A *region* is a run of consecutive instructions of one basic block (control flow enters
it only at its first instruction) that all have a functional form
(:meth:`~.functional.FunctionalForms.reason`) and touch tensors of one device. Jumps end regions
and stay in the interpreter; so does anything without a functional form, and a region
too small to gain from compiling (``min_instructions`` kernel calls or delegate calls).

One shape of jumps is taken whole: an if/else as ExecuTorch's exporter writes
``torch.cond`` (:class:`Branch`: a JumpFalseCall over the true branch, which ends with a
jump that always jumps over the false branch), where the instructions before the jump
and both branches are runs of their own and nothing else jumps into it. The region is
the instructions before the jump, both branches and the run after them (where there is
one); its graph computes the branches with ``torch.cond`` and merges what they leave for
later. That holds only where merging is the interpreter's result for either branch
(:meth:`_Planner._branch_stores`); otherwise the runs are planned as they would be
without it.

A compiled region reads its *inputs* (values it reads before writing them) from the
values table and must leave in the table exactly what the interpreter would for every
value anyone can observe after it: values read by an instruction outside the region (in
any chain), the method's inputs and outputs, state (a value read in the region before the
region writes it: it carries over from the last call), and values in a buffer shared by
the program's methods. Values only the region reads stay inside it and are never written.
Each observable value is written back in one of five ways (:class:`Store`):

- ``"inplace"``: the compiled code writes the value's memory itself (a static-shaped value
  whose tensor the method owns for its whole life and whose memory overlaps no other
  tensor the region touches: no copy at all);
- ``"copy"``: the compiled code returns the value and the runner copies it into the table's
  tensor (resized first when its shape is dynamic), as an ``out=`` kernel would;
- ``"replace"``: the table's slot takes the returned object (scalars, and the results of
  ops that return new tensors), as the interpreter's statement assigns it;
- ``"adopt"``: the same for a method output of dynamic shape that nothing but the caller
  reads (no copy into planned memory the caller would get a copy of anyway; a compiled call
  hands that new tensor over as the caller's copy, see :class:`~.runner.CompiledRunner`);
- ``"statement"``: the interpreter's own statement runs after the compiled code, for moves
  and ``et_view`` (their result shares the source's object or memory).

In a method of one straight-line chain, a method output written ``"inplace"`` (static, in
the default dim order, by a region of static tensor inputs and no scalar ones, whose
compiled code no guard ever sets aside) also gets a ``"returned"`` store right after it: the compiled code returns a copy of what it wrote
there, a tensor of its own, which a call may hand to the caller as its copy of the output
instead of copying the planned memory again (see :class:`~.runner.CompiledRunner`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from ..effects import NOTHING, byte_range, effects, kind
from ..engine.blocks import basic_blocks
from ..format import program as p

if TYPE_CHECKING:
    from ..loader.state import MethodState
    from .functional import FunctionalForms

__all__ = [
    "RETURNED",
    "Branch",
    "Fallback",
    "Region",
    "Store",
    "caller_readable",
    "plan_regions",
]

_ET_VIEW = ("executorch_prim::et_view.default", "executorch_prim::et_view")


@dataclass(frozen=True)
class Fallback:
    """Instructions ``first..last`` (inclusive) of ``chain`` run interpreted, and why."""

    chain: int
    first: int
    last: int
    reason: str


@dataclass(frozen=True)
class Store:
    """How value ``slot`` gets its result after a region (module docstring): ``how`` is
    ``inplace``, ``copy``, ``replace`` or ``statement``; ``instruction`` its last writer."""

    slot: int
    how: str
    instruction: int


# the stores whose value the compiled code returns, in the order it returns them
RETURNED = ("copy", "replace", "adopt", "returned")


@dataclass(frozen=True)
class Branch:
    """An if/else inside a region, as ExecuTorch's exporter writes ``torch.cond``: the
    JumpFalseCall ``jump`` on the one-element tensor ``pred`` to the false branch, the
    true branch (instructions ``jump + 1 .. skip - 1``), the jump ``skip`` that always
    goes to ``end``, past the false branch (``skip + 1 .. end - 1``); the region's
    instructions from ``end`` on run after either. ``merged``: the values either branch
    writes that are seen after the branches, each written by both (or before the jump),
    in the order the graph returns them from its ``torch.cond``."""

    jump: int
    pred: int
    skip: int
    end: int
    merged: tuple[int, ...] = ()


@dataclass
class Region:
    """Instructions ``first..last`` of ``chain``, compiled together (module docstring).

    ``inputs``: tensor values read from the table, in order (``inplace`` targets among
    them or appended); ``scalar_inputs``: scalars an instruction outside the region
    computes, passed as 0-d tensors; ``stores`` in the order they are applied;
    ``outputs``: the values the compiled code returns, in order (``copy`` and ``replace``
    stores); ``aliases``: ``(instruction, j, k)``, value ``j`` read by ``instruction``
    is a second name for the bytes value ``k`` wrote earlier in the region (a view the
    exporter planned at the same bytes, with no instruction of its own). ``branch``:
    the if/else the region holds (its jumps then run in the compiled code), or None."""

    chain: int
    first: int
    last: int
    device: torch.device
    inputs: list[int] = field(default_factory=list)
    scalar_inputs: list[int] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    aliases: list[tuple[int, int, int]] = field(default_factory=list)
    branch: Branch | None = None

    @property
    def outputs(self) -> list[int]:
        return [s.slot for s in self.stores if s.how in RETURNED]

    @property
    def inplace(self) -> list[int]:
        return [s.slot for s in self.stores if s.how == "inplace"]

    @property
    def graph_inputs(self) -> list[int]:
        """Tensor inputs, then ``inplace`` targets not read, then the scalar inputs."""
        extra = [j for j in self.inplace if j not in self.inputs]
        return [*self.inputs, *extra, *self.scalar_inputs]

    @property
    def label(self) -> str:
        return (
            f"instructions {self.first}-{self.last}"
            if self.last > self.first
            else (f"instruction {self.first}")
        )


# ---------------------------------------------------------------------------------------
# what each instruction reads and writes (from the statements its kernels made)


class _Effects:
    """Per instruction of a method, by value: what its compiled form takes from the table
    (:attr:`~ptexec.effects.Effects.inputs`), every value it changes and the slots it
    gives new objects (:func:`ptexec.effects.effects` of the statement its kernel made).
    A free does nothing in compiled code (its functional form is empty), so it has no
    effects here."""

    def __init__(self, state: MethodState) -> None:
        values = state.plan.values
        self.reads: list[list[set[int]]] = []
        self.writes: list[list[set[int]]] = []
        self.replaces: list[list[set[int]]] = []
        for chain in state.chains:
            r_chain, w_chain, x_chain = [], [], []
            for ins, st in zip(chain.instructions, chain.loaded, strict=True):
                e = NOTHING if kind(ins) == "free" else effects(values, ins, st)
                r_chain.append(set(e.inputs))
                w_chain.append(set(e.written))
                x_chain.append(set(e.replaces))
            self.reads.append(r_chain)
            self.writes.append(w_chain)
            self.replaces.append(x_chain)


# ---------------------------------------------------------------------------------------
# memory: which tensors may share bytes


def _footprint(t: Any) -> tuple[int, int, int] | None:
    """(storage, first byte, end byte) of a tensor's memory, at the most it can hold."""
    if not isinstance(t, torch.Tensor):
        return None
    storage = t.untyped_storage()
    start = int(t.storage_offset()) * t.element_size()
    return (storage.data_ptr(), start, int(storage.nbytes()))


def _overlap(a: tuple[int, int, int], b: tuple[int, int, int], a_bytes: int, b_bytes: int) -> bool:
    if a[0] != b[0]:
        return False
    return a[1] < b[1] + b_bytes and b[1] < a[1] + a_bytes


# ---------------------------------------------------------------------------------------
# the plan


class _Planner:
    def __init__(
        self,
        state: MethodState,
        rebuild: FunctionalForms,
        shared_buffers: frozenset[int],
        min_instructions: int,
    ) -> None:
        self.state = state
        self.plan = state.plan
        self.rebuild = rebuild
        self.shared_buffers = shared_buffers
        self.min_instructions = min_instructions
        self.effects = _Effects(state)
        for c, chain in enumerate(self.effects.reads):  # what the rebuilt code never reads
            for i, reads in enumerate(chain):
                ignored = rebuild.ignored(c, i)
                if ignored:
                    chain[i] = reads - ignored
        self.inputs = set(self.plan.inputs)
        self.outputs = set(self.plan.outputs)
        # one straight-line chain: the fast call runs the regions' code in its own lines
        self.straight = len(state.chains) == 1 and not state.chains[0].has_jumps
        self.unplanned_inputs = {
            s.slot for s in state.inputs if s.kind == "tensor" and s.view is None
        }
        self.unplanned_outputs = {
            o.slot for o in state.outputs if o.kind == "tensor" and not o.planned
        }
        # every slot a statement gives a new object (moves, views, scalars, returns; the
        # statements as loaded and as rewritten to run), and whose memory that object may be
        self.replaced: set[int] = set()
        self.sources: dict[int, set[int]] = {}
        plan = self.plan
        for ch in state.chains:
            for i, ins in enumerate(ch.instructions):
                for st in (ch.loaded[i], ch.statements[i]):
                    for j in effects(plan.values, ins, st).replaces:
                        self.replaced.add(j)
                        if kind(ins) == "move":
                            assert isinstance(ins, p.MoveCall)
                            from_ = {ins.move_from}
                        else:
                            refs = st.reads if st.reads is not None else p.instruction_values(ins)
                            from_ = set(p.tensor_indices(plan.values, tuple(refs)))
                        self.sources.setdefault(j, set()).update(from_ - {j})
        for chain in self.effects.replaces:
            for x in chain:
                self.replaced.update(x)
        # where each planned value's bytes are, and the values no instruction writes
        # (second names for bytes another value writes: the exporter's static views)
        self.ranges: dict[int, tuple[int, int, int]] = {}
        for j, v in enumerate(self.plan.values):
            found = byte_range(v)
            if found is not None:
                self.ranges[j] = found
        written_anywhere: set[int] = set()
        for chain in self.effects.writes:
            for w in chain:
                written_anywhere.update(w)
        self.unwritten = {
            j for j in self.ranges if j not in written_anywhere and j not in self.inputs
        }
        self.written_anywhere = written_anywhere
        # readers and writers of each value: (chain, instruction)
        self.readers: dict[int, set[tuple[int, int]]] = {}
        for c, chain in enumerate(self.effects.reads):
            for i, reads in enumerate(chain):
                for j in reads:
                    self.readers.setdefault(j, set()).add((c, i))
        self.writers: dict[int, set[tuple[int, int]]] = {}
        for c, chain in enumerate(self.effects.writes):
            for i, writes in enumerate(chain):
                for j in writes:
                    self.writers.setdefault(j, set()).add((c, i))

    # -- devices ------------------------------------------------------------------------
    def device_of(self, j: int) -> torch.device | None:
        t = self.state.values[j]
        if isinstance(t, torch.Tensor):
            return t.device
        for spec in self.state.inputs:
            if spec.slot == j and spec.torch_device is not None:
                return spec.torch_device
        return None

    def instruction_device(self, c: int, i: int) -> torch.device | str | None:
        """The one device an instruction's tensors are on ("mixed" for several)."""
        found: set[torch.device] = set()
        refs = self.effects.reads[c][i] | self.effects.writes[c][i]
        for j in refs:
            if isinstance(self.plan.values[j], p.Tensor):
                d = self.device_of(j)
                if d is not None:
                    found.add(d)
        if len(found) > 1:
            return "mixed"
        return next(iter(found)) if found else None

    # -- candidate runs ------------------------------------------------------------------
    def runs(self) -> tuple[list[tuple[int, int, int, torch.device]], list[Fallback]]:
        """Runs of rebuildable instructions of one device inside basic blocks, and the
        instructions left interpreted (with why)."""
        runs: list[tuple[int, int, int, torch.device]] = []
        fallbacks: list[Fallback] = []
        for c, chain in enumerate(self.state.chains):
            for start, end in basic_blocks(chain.instructions):
                run_start: int | None = None
                run_device: torch.device | None = None

                def close(upto: int, c: int = c) -> None:
                    nonlocal run_start, run_device
                    if run_start is not None and upto >= run_start:
                        runs.append((c, run_start, upto, run_device or torch.device("cpu")))
                    run_start, run_device = None, None

                for i in range(start, end):
                    why = self.rebuild.reason(c, i)
                    device = self.instruction_device(c, i)
                    if why is None and device == "mixed":
                        why = "tensors on several devices"
                    if (
                        why is None
                        and isinstance(device, torch.device)
                        and run_device is not None
                        and device != run_device
                    ):
                        close(i - 1)
                    if why is not None:
                        close(i - 1)
                        if not isinstance(chain.instructions[i], p.JumpFalseCall):
                            fallbacks.append(Fallback(c, i, i, why))
                        continue
                    if run_start is None:
                        run_start = i
                    if isinstance(device, torch.device):
                        run_device = device
                close(end - 1)
        return runs, fallbacks

    def worth(self, c: int, first: int, last: int) -> bool:
        ins = self.state.chains[c].instructions
        work = 0
        for i in range(first, last + 1):
            if isinstance(ins[i], p.DelegateCall):
                if not self.rebuild.opaque(c, i):  # an opaque call gains nothing alone
                    work += self.min_instructions  # a delegate's graph is worth compiling alone
            elif isinstance(ins[i], p.KernelCall):
                name = self.state.chains[c].names[i]
                if not (name.startswith("executorch_prim::") or name.startswith("aten::sym_")):
                    work += 1
        return work >= self.min_instructions

    # -- if/else -----------------------------------------------------------------------------
    def _never(self, j: int) -> bool:
        """Value ``j`` is the constant False (a jump on it always jumps)."""
        value = self.plan.values[j]
        return (
            isinstance(value, p.Bool)
            and not value.value
            and j not in self.state.dynamic_scalars
            and j not in self.written_anywhere
        )

    def if_else(
        self, runs: list[tuple[int, int, int, torch.device]]
    ) -> list[tuple[int, int, int, torch.device, Branch | None]]:
        """``runs`` with each if/else (:class:`Branch`) whose three parts are whole runs
        of one device (the instructions before the jump, from where their run starts,
        each branch entire, and the run after the false branch where there is one of the
        same device) as one run: control enters it only at its first instruction (no
        other jump lands inside it)."""
        at = {(c, first, last): k for k, (c, first, last, _) in enumerate(runs)}
        ends = {(c, last): k for k, (c, _, last, _) in enumerate(runs)}
        starts = {(c, first): k for k, (c, first, _, _) in enumerate(runs)}
        taken: dict[int, tuple[int, int, int, torch.device, Branch]] = {}  # by pre run
        dropped: set[int] = set()
        for c, chain in enumerate(self.state.chains):
            ins = chain.instructions
            n = len(ins)
            for i, jump in enumerate(ins):
                if not isinstance(jump, p.JumpFalseCall):
                    continue
                d = jump.destination_instruction
                if not i + 1 < d - 1 < n - 1:  # a true branch, then the jump over the false
                    continue
                skip = ins[d - 1]
                if not isinstance(skip, p.JumpFalseCall) or not self._never(skip.cond_value_index):
                    continue
                e = skip.destination_instruction
                pred = self.plan.values[jump.cond_value_index]
                if not (
                    d < e <= n
                    and isinstance(pred, p.Tensor)
                    and pred.numel == 1
                    and pred.shape_dynamism == p.STATIC
                ):
                    continue
                parts = (ends.get((c, i - 1)), at.get((c, i + 1, d - 2)), at.get((c, d, e - 1)))
                if any(k is None or k in dropped or k in taken for k in parts):
                    continue
                pre, true, false = (runs[k] for k in parts if k is not None)
                if not pre[3] == true[3] == false[3]:
                    continue
                first = pre[1]
                after = starts.get((c, e))
                if after is not None and (
                    after in dropped or after in taken or runs[after][3] != pre[3]
                ):
                    after = None
                last = runs[after][2] if after is not None else e - 1
                if any(
                    isinstance(x, p.JumpFalseCall)
                    and k not in (i, d - 1)
                    and first < x.destination_instruction <= last
                    for k, x in enumerate(ins)
                ):
                    continue
                k0 = parts[0]
                assert k0 is not None
                branch = Branch(i, jump.cond_value_index, d - 1, e)
                taken[k0] = (c, first, last, pre[3], branch)
                dropped.update(k for k in (*parts[1:], after) if k is not None)
        out: list[tuple[int, int, int, torch.device, Branch | None]] = []
        for k, run in enumerate(runs):
            if k in taken:
                out.append(taken[k])
            elif k not in dropped:
                out.append((*run, None))
        return out

    def _private(self, j: int, c: int, first: int, last: int) -> bool:
        """No instruction outside instructions ``first..last`` of chain ``c`` reads or
        writes value ``j`` or bytes it shares, and nobody else sees it."""
        if self.observed(j, c, first, last) or j in self.outputs or j in self.inputs:
            return False

        def inside(j: int) -> bool:
            return all(
                rc == c and first <= ri <= last
                for rc, ri in (*self.readers.get(j, ()), *self.writers.get(j, ()))
            )

        if not inside(j):
            return False
        if j not in self.ranges:
            return True
        mid, start, end = self.ranges[j]
        return all(
            inside(a)
            for a, (am, astart, aend) in self.ranges.items()
            if am == mid and astart < end and start < aend
        )

    def _branch_stores(
        self,
        c: int,
        first: int,
        last: int,
        branch: Branch,
        arms: list[tuple[dict[int, int], dict[int, set[str]]]],
        before: dict[int, int],
        read_first: set[int],
        needed: set[int],
        after: set[int],
    ) -> tuple[list[Store], tuple[int, ...]] | None:
        """The values the branches of ``branch`` write that are read after them (in the
        region, ``needed``, or after it), and the stores of those the region's last
        instructions do not write again (``after``); ``arms``: what each branch writes, by
        its last writer; ``before``: what the instructions before the jump write. Each
        must be a tensor that both branches write, or one branch and the instructions
        before the jump (the other branch passes that on), in place or given a new object
        alike (the planner's kinds); a move that gives it its object takes it from a
        value only the region touches (:meth:`_private`: the slot gets an object of its
        own instead), and no view (``et_view``) gives it one. None when any is otherwise."""
        chain = self.state.chains[c]
        (wt, _), (wf, _) = arms
        stores: list[Store] = []
        slots: list[int] = []
        for j in sorted(set(wt) | set(wf)):
            seen = (self.observed(j, c, first, last) or j in read_first) and j not in after
            if not seen and j not in needed:
                continue
            if not isinstance(self.plan.values[j], p.Tensor):
                return None
            if not ((j in wt or j in before) and (j in wf or j in before)):
                return None
            how = "copy"
            for w in (wt, wf):
                i = w.get(j)
                if i is None:
                    continue
                ins = chain.instructions[i]
                if chain.names[i] in _ET_VIEW:
                    return None
                if isinstance(ins, p.MoveCall) and not self._private(ins.move_from, c, first, last):
                    return None
                if j in self.effects.replaces[c][i]:
                    how = "replace"
            slots.append(j)
            if seen:
                stores.append(Store(j, how, max(w.get(j, -1) for w in (wt, wf))))
        return stores, tuple(slots)

    # -- one region ------------------------------------------------------------------------
    def observed(self, j: int, c: int, first: int, last: int) -> bool:
        """Whether value ``j``, written in the region, can be seen after it."""
        if j in self.inputs or j in self.outputs:
            return True
        value = self.plan.values[j]
        if (
            isinstance(value, p.Tensor)
            and value.allocation_info is not None
            and value.allocation_info.memory_id in self.shared_buffers
        ):
            return True
        outside = any(rc != c or not first <= ri <= last for rc, ri in self.readers.get(j, ()))
        if outside or j not in self.ranges:
            return outside
        # a second name for its bytes read elsewhere reads what it wrote
        mid, start, end = self.ranges[j]
        for a in self.unwritten:
            am, astart, aend = self.ranges[a]
            if (
                am == mid
                and astart < end
                and start < aend
                and any(rc != c or not first <= ri <= last for rc, ri in self.readers.get(a, ()))
            ):
                return True
        return False

    def region(
        self, c: int, first: int, last: int, device: torch.device, branch: Branch | None = None
    ) -> Region | int | None:
        """The region of instructions ``first..last``, or the index of the first
        instruction it cannot take (it then ends just before); with ``branch``, the
        region holding that if/else, or None when it cannot (:meth:`_branch_stores`)."""
        eff = self.effects
        region = Region(c, first, last, device)
        written: dict[int, int] = {}  # value -> its last writer in the region
        kinds: dict[int, set[str]] = {}  # value -> how instructions write it
        read_first: set[int] = set()  # read before the region writes it: state
        inputs: dict[int, None] = {}
        scalars: dict[int, None] = {}
        chain = self.state.chains[c]
        bytes_written: list[tuple[tuple[int, int, int], int]] = []  # (range, value), in order
        aliases: list[tuple[int, int, int]] = []
        merged: list[Store] = []  # the branches' values, merged by the graph's torch.cond

        def visit(
            i: int,
            written: dict[int, int],
            kinds: dict[int, set[str]],
            bytes_written: list[tuple[tuple[int, int, int], int]],
        ) -> int | None:
            """Take instruction ``i`` (its reads, then its writes); where to split instead."""
            for j in sorted(eff.reads[c][i]):
                if j in written:
                    continue
                if j in self.unwritten:
                    source = self._written_bytes(j, bytes_written)
                    if source is not None:
                        if source < 0:
                            return i if i > first else i + 1  # partly written: cannot follow
                        aliases.append((i, j, source))
                        continue
                read_first.add(j)
                value = self.plan.values[j]
                if isinstance(value, p.Tensor):
                    if not value.is_constant:
                        inputs[j] = None
                elif j in self.state.dynamic_scalars and j not in self.inputs:
                    scalars[j] = None
            for j in eff.writes[c][i]:
                how = "replace" if j in eff.replaces[c][i] else "write"
                kinds.setdefault(j, set()).add(how)
                if len(kinds[j]) > 1 and i > first:
                    return i  # replaced here and written in place there: split
                written[j] = i
                if j in self.ranges:
                    bytes_written.append((self.ranges[j], j))
            return None

        if branch is None:
            for i in range(first, last + 1):
                split = visit(i, written, kinds, bytes_written)
                if split is not None:
                    return split
        else:
            for i in range(first, branch.jump + 1):
                if visit(i, written, kinds, bytes_written) is not None:
                    return None
            before = dict(written)
            arms = []  # per branch: what it writes (by its last writer), and how
            for lo, hi in ((branch.jump + 1, branch.skip), (branch.skip + 1, branch.end - 1)):
                w, k = dict(written), {j: set(x) for j, x in kinds.items()}
                for i in range(lo, hi + 1):
                    if visit(i, w, k, list(bytes_written)) is not None or any(
                        j in self.state.dynamic_scalars for j in eff.reads[c][i]
                    ):
                        return None
                arms.append(({j: i for j, i in w.items() if i >= lo}, k))
            for w, _ in arms:  # after the branches, either's bytes may hold what it wrote
                bytes_written.extend((self.ranges[j], j) for j in w if j in self.ranges)
            for w, k in arms:
                for j, i in w.items():
                    written[j] = max(i, written.get(j, i))
                    kinds.setdefault(j, set()).update(k[j])
            if any(len(kinds[j]) > 1 for w, _ in arms for j in w):
                return None  # replaced in one branch, written in place in the other
            # after the branches: what only one of them writes is not there for the other
            (wt, _), (wf, _) = arms
            partial = {j for j in set(wt) ^ set(wf) if j not in before}
            needed: set[int] = set()  # read after the branches before written there
            after: set[int] = set()  # written after the branches
            for i in range(branch.end, last + 1):
                if any(j in partial for j in eff.reads[c][i] if j not in after):
                    return None
                needed.update(j for j in eff.reads[c][i] if j not in after)
                if visit(i, written, kinds, bytes_written) is not None:
                    return None
                after.update(eff.writes[c][i])
            if any(i > branch.jump for i, _, _ in aliases):
                return None  # a second name read in a branch or after: not followed
            found = self._branch_stores(
                c, first, last, branch, arms, before, read_first, needed, after
            )
            if found is None:
                return None
            merged, slots = found
            branch = replace(branch, merged=slots)
            region.branch = branch
        stores: list[Store] = []
        post: list[Store] = []
        observed = {j for j in written if self.observed(j, c, first, last) or j in read_first}
        stores.extend(merged)
        done = {s.slot for s in stores}
        for j in sorted(observed - done, key=lambda j: written[j]):
            i = written[j]
            ins = chain.instructions[i]
            value = self.plan.values[j]
            if isinstance(ins, p.MoveCall) or chain.names[i] in _ET_VIEW:
                post.append(Store(j, "statement", i))
            elif "replace" in kinds[j] or not isinstance(value, p.Tensor):
                stores.append(Store(j, "replace", i))
            else:
                stores.append(Store(j, "copy", i))
        if branch is not None and post:
            return None  # a move or view before the jump: its statement would run after
        # a statement run afterwards reads the table: what it reads must be current there
        for s in post:
            for r in eff.reads[c][s.instruction]:
                later = [k for k in range(s.instruction + 1, last + 1) if r in eff.writes[c][k]]
                if later:
                    return s.instruction if s.instruction > first else s.instruction + 1
                if r in written and r not in observed:
                    observed.add(r)
                    value = self.plan.values[r]
                    how = (
                        "copy"
                        if isinstance(value, p.Tensor) and "replace" not in kinds[r]
                        else "replace"
                    )
                    if chain.names[written[r]] in _ET_VIEW or isinstance(
                        chain.instructions[written[r]], p.MoveCall
                    ):
                        return written[r] if written[r] > first else written[r] + 1
                    stores.append(Store(r, how, written[r]))

        region.inputs = list(inputs)
        region.scalar_inputs = list(scalars)
        region.aliases = aliases
        region.stores = self._inplace(region, stores) + post
        return region

    def _written_bytes(self, j: int, written: list[tuple[tuple[int, int, int], int]]) -> int | None:
        """The value whose write in the region value ``j``'s bytes hold (a second name for
        them), None when the region has not written them, -1 when it wrote only part."""
        mid, start, end = self.ranges[j]
        tj = self.plan.values[j]
        for (m, s, e), k in reversed(written):
            if m != mid or not (s < end and start < e):
                continue
            tk = self.plan.values[k]
            if (
                (s, e) == (start, end)
                and isinstance(tj, p.Tensor)
                and isinstance(tk, p.Tensor)
                and tj.scalar_type == tk.scalar_type
                and tj.numel == tk.numel
                and tj.shape_dynamism == p.STATIC
                and tk.shape_dynamism == p.STATIC
            ):
                return k
            return -1
        return None

    def _memory(self, j: int) -> list[tuple[tuple[int, int, int], int]]:
        """Every memory value ``j``'s object may be, with its size: its tensor at load and,
        for a slot statements give new objects, what those may view (transitively)."""
        out: list[tuple[tuple[int, int, int], int]] = []
        todo, seen = [j], set()
        while todo:
            k = todo.pop()
            if k in seen:
                continue
            seen.add(k)
            fp = _footprint(self.state.values[k])
            value = self.plan.values[k]
            if fp is not None and isinstance(value, p.Tensor):
                out.append((fp, value.nbytes))
            if k in self.replaced:
                todo.extend(self.sources.get(k, ()))
        return out

    def _inplace(self, region: Region, stores: list[Store]) -> list[Store]:
        """``copy`` stores whose tensor the compiled code may write itself, and dynamic
        outputs whose slot may take the compiled code's result (module docstring)."""
        values = self.state.values
        others = {
            j: self._memory(j) for j in dict.fromkeys([*region.inputs, *(s.slot for s in stores)])
        }
        # the compiled code runs on every call: no input whose size or kind a guard checks
        # (a call outside the guards runs the statements, which return no copy)
        unguarded = not region.scalar_inputs and all(
            getattr(self.plan.values[j], "shape_dynamism", p.STATIC) == p.STATIC
            for j in region.inputs
        )
        out: list[Store] = []
        for s in stores:
            j = s.slot
            value = self.plan.values[j]
            fp = _footprint(values[j])
            if self._adoptable(s, region):
                out.append(Store(j, "adopt", s.instruction))
                continue
            ok = (
                s.how == "copy"
                and isinstance(value, p.Tensor)
                and value.shape_dynamism == p.STATIC
                and fp is not None
                and j not in self.replaced
                and j not in self.unplanned_inputs
                and j not in self.unplanned_outputs
                and value.nbytes > 0
            )
            if ok:
                assert isinstance(value, p.Tensor) and fp is not None
                ok = not any(
                    _overlap(fp, other, value.nbytes, nbytes)
                    for k, memory in others.items()
                    if k != j
                    for other, nbytes in memory
                )
            out.append(Store(j, "inplace", s.instruction) if ok else s)
            if (
                ok
                and unguarded
                and self.straight
                and j in self.outputs
                and isinstance(value, p.Tensor)
                and value.dim_order == tuple(range(len(value.dim_order)))
            ):
                out.append(Store(j, "returned", s.instruction))
        return out

    def _adoptable(self, s: Store, region: Region) -> bool:
        """A method output of dynamic shape that only the caller reads: its slot may take
        the compiled code's result instead of a copy of it (the output is then a tensor of
        its own, as a copy of the planned view would be). A static output is written into
        its planned memory, as the interpreter writes it: what reads planned memory after
        a call (training's gradients and parameters, ``Method.values``) reads it there."""
        j = s.slot
        value = self.plan.values[j]
        return (
            s.how == "copy"
            and isinstance(value, p.Tensor)
            and value.shape_dynamism != p.STATIC
            and value.allocation_info is not None
            and value.allocation_info.memory_id not in self.shared_buffers
            and value.dim_order == tuple(range(len(value.dim_order)))
            and j in self.outputs
            and j not in self.inputs
            and j not in self.replaced
            and all(
                rc == region.chain and region.first <= ri <= region.last
                for rc, ri in self.readers.get(j, ())
            )
            and not any(
                self.ranges[a][0] == self.ranges[j][0]
                and self.ranges[a][1] < self.ranges[j][2]
                and self.ranges[j][1] < self.ranges[a][2]
                for a in self.unwritten
            )
        )


def plan_regions(
    state: MethodState,
    rebuild: FunctionalForms,
    shared_buffers: Iterable[int] = (),
    min_instructions: int = 2,
) -> tuple[list[Region], list[Fallback]]:
    """The regions of ``state`` to compile, and the instructions left to the interpreter
    with the reason (module docstring)."""
    planner = _Planner(state, rebuild, frozenset(shared_buffers), min_instructions)
    runs, fallbacks = planner.runs()
    regions: list[Region] = []
    pending = planner.if_else(runs)
    while pending:
        c, first, last, device, branch = pending.pop(0)
        if branch is not None:
            found = planner.region(c, first, last, device, branch)
            if isinstance(found, Region) and planner.worth(c, first, last):
                regions.append(found)
            else:  # its three runs, as without the if/else
                pending[:0] = [
                    (c, first, branch.jump - 1, device, None),
                    (c, branch.jump + 1, branch.skip - 1, device, None),
                    (c, branch.skip + 1, branch.end - 1, device, None),
                ]
                if branch.end <= last:
                    pending.insert(3, (c, branch.end, last, device, None))
            continue
        if not planner.worth(c, first, last):
            why = "too little work to gain from compiling"
            if any(rebuild.opaque(c, i) for i in range(first, last + 1)):
                why += "; XNNPACK's kernels run it (ExecuTorch's XNNPACK backend)"
            fallbacks.append(Fallback(c, first, last, why))
            continue
        found = planner.region(c, first, last, device)
        if isinstance(found, int):
            split = max(found, first + 1)
            pending.insert(0, (c, split, last, device, None))
            pending.insert(0, (c, first, split - 1, device, None))
            continue
        assert found is not None
        regions.append(found)
    fallbacks.sort(key=lambda f: (f.chain, f.first))
    return regions, fallbacks


def interpreted_ranges(
    lengths: Sequence[int], regions: Sequence[Region]
) -> list[tuple[int, int, int]]:
    """``(chain, first, last)`` of every run of instructions no region covers."""
    covered = {(r.chain, i) for r in regions for i in range(r.first, r.last + 1)}
    out: list[tuple[int, int, int]] = []
    for c, n in enumerate(lengths):
        start = None
        for i in range(n + 1):
            inside = i < n and (c, i) not in covered
            if inside and start is None:
                start = i
            elif not inside and start is not None:
                out.append((c, start, i - 1))
                start = None
    return out


def caller_readable(
    state: MethodState, readers: Iterable[int], shared_buffers: Iterable[int] = ()
) -> frozenset[int]:
    """The planned method inputs (their slots) whose caller's tensor may stand in for the
    planned view: copying it in first would change nothing anyone can observe.

    That holds for an input that only ``readers`` read (instructions of chain 0 whose
    code reads the values table's slot at each call: compiled code, and the kernel and
    delegate statements a guarded region falls back to, which pass the slot's tensor as
    they run), that nothing writes or gives a new object, that is no method
    output and not in a buffer the program's methods share, of the default dim order,
    and whose planned bytes no other value reads before an instruction writes them (a
    second name for them, a view of the input made at load, an output left unwritten):
    the memory plan reuses an input's bytes for values computed after it, which write
    them before they read them. That order is the order of the instructions in a
    straight-line chain; with jumps, no other value may share the input's bytes at all.
    Methods of more than one chain get nothing."""
    if len(state.chains) != 1:
        return frozenset()
    chain = state.chains[0]
    straight = not chain.has_jumps
    values = state.plan.values
    compiled = set(readers)
    outputs = set(state.plan.outputs)
    shared = frozenset(shared_buffers)
    forms = []  # per form of the statements (as loaded, as rewritten): per instruction
    for statements in (chain.loaded, chain.statements):
        form = []
        for ins, st in zip(chain.instructions, statements, strict=True):
            e = NOTHING if kind(ins) == "free" else effects(values, ins, st)
            form.append((set(e.reads) | set(e.inputs), set(e.written) | set(e.replaces)))
        forms.append(form)
    unsafe: set[int] = set()  # read (by an instruction or the caller) before written
    for form in forms:
        seen: set[int] = set()
        for reads, writes in form:
            unsafe.update(reads - seen)
            seen.update(reads, writes)
        unsafe.update(outputs - seen)
    out: set[int] = set()
    for spec in state.inputs:
        j = spec.slot
        value = values[j]
        if (
            spec.kind != "tensor"
            or spec.view is None
            or not isinstance(value, p.Tensor)
            or value.allocation_info is None
            or value.allocation_info.memory_id in shared
            or value.dim_order != tuple(range(len(value.dim_order)))
            or j in outputs
            or any(
                j in w or (j in r and i not in compiled)
                for form in forms
                for i, (r, w) in enumerate(form)
            )
        ):
            continue
        fp = _footprint(state.values[j])
        if fp is None:
            continue
        clash = False
        for k, other in enumerate(values):
            if k == j or (straight and k not in unsafe) or not isinstance(other, p.Tensor):
                continue
            fk = _footprint(state.values[k])
            if fk is not None and _overlap(fp, fk, value.nbytes, other.nbytes):
                clash = True
                break
        if not clash:
            out.add(j)
    return frozenset(out)
