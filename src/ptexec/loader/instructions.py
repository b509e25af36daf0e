"""Every instruction of a plan as one prepared statement (an :class:`Statement`).

Kernel calls go to the factory the kernel registry finds for their operator, delegate
calls to their backend's factory; moves, frees and jumps are written here. Operators with
no kernel are collected, so that loading reports all of them at once.

A kernel's statement is kept for loading the same plan again (the decoded plan is shared
by the loads of the same bytes, :mod:`ptexec.format.pte`) when it is a function of what
the key holds alone: the plan, the instruction, the devices of the plan's values and the
load options. So it is kept only when its factory read no value of the method's values
table but the plan's scalars (no tensor: a constant's bytes may differ under the same
plan), and its names are bound to nothing a method owns: torch's operators, functions
without closures, plain scalars and the read-only tensors a factory made from literals
alone (:func:`~ptexec.kernels.registry.literal_tensor`), and tuples and tables of those;
no other tensor, no call record, no prune form but a function of its arguments alone.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..accounting import CallRecord
from ..delegates import DelegateContext, Renewal, Renewing, find_backend, registered_backends
from ..device import Device
from ..effects import Effects, effects
from ..errors import BackendUnavailableError, PteFormatError
from ..format import program as p
from ..format.lru import Key, Lru
from ..kernels.registry import (
    KernelContext,
    KernelFactory,
    Statement,
    UnsupportedKernel,
    find_kernel,
    is_literal_tensor,
)

if TYPE_CHECKING:
    from ..program import Program

__all__ = ["InstructionPreparer", "clear_kept_statements", "truth"]

KEPT_STATEMENTS = 1 << 15
# (plan, the factory that made it, statement): a kernel registered since is asked afresh
_kept: Lru[tuple[p.ExecutionPlan, Any, Statement]] = Lru(KEPT_STATEMENTS, 0)
_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.memory_format)


_SHARED = (*_PLAIN, torch._ops.OpOverload, torch._ops.OpOverloadPacket)
_UNASKED = object()


def clear_kept_statements() -> None:
    """Forget the kept kernel statements, and the renewals of delegate calls."""
    _kept.clear()
    _renewals.clear()
    _effects.clear()
    _made_effects.clear()
    _placements.clear()
    _placed.clear()
    _chains.clear()


class _Watched(list[Any]):
    """The values table as a factory sees it, noting whether it read anything but a plain
    scalar."""

    __slots__ = ("table", "tainted")

    def __init__(self, table: list[Any]) -> None:
        super().__init__()
        self.table = table
        self.tainted = False

    def __getitem__(self, index: Any) -> Any:
        got = self.table[index]
        if not isinstance(got, _PLAIN):
            self.tainted = True
        return got

    def __len__(self) -> int:
        return len(self.table)

    def __iter__(self) -> Any:
        self.tainted = True
        return iter(self.table)

    def __contains__(self, value: object) -> bool:
        self.tainted = True
        return value in self.table

    def __setitem__(self, index: Any, value: Any) -> None:
        self.tainted = True
        self.table[index] = value


# what backends left for later loads of their calls (DelegateContext.renew_with), by the
# call's place in its plan and the placement (as kept kernel statements are): (plan, the
# backend's factory that left it, the renewal); a backend registered since is asked afresh
_renewals: Lru[tuple[p.ExecutionPlan, Any, Renewal]] = Lru(KEPT_STATEMENTS, 0)

# the effects of kept statements: (statement, instruction, effects)
_effects: Lru[tuple[Any, p.Instruction, Effects]] = Lru(KEPT_STATEMENTS, 0)
# the effects of the statements each load makes afresh (a delegate call's, bound to the
# load's runner), by the instruction and every fact of the statement effects() reads:
# (the plan's values, instruction, effects)
_made_effects: Lru[tuple[Any, p.Instruction, Effects]] = Lru(KEPT_STATEMENTS, 0)

# the devices of a plan's values and the load options, interned: the key of every kept
# statement of a method holds the one object, compared by identity on a hit
_placements: Lru[Key] = Lru(256, 0)


# a chain's prepared statements that are functions of the plan and the placement alone:
# per instruction, the kept statement of a kernel (with its factory) or the statement of
# a move, free or jump written here, and its effects; None where each load prepares its
# own (a statement not kept, a delegate's). (plan, factories, names, statements,
# effects); a hit still asks the registry for each kept kernel's factory
_chains: Lru[
    tuple[
        p.ExecutionPlan,
        tuple[Any, ...],
        tuple[str, ...],
        tuple[Statement | None, ...],
        tuple[Effects | None, ...],
    ]
] = Lru(1024, 0)


# the same, by the identity of the devices' sequence (value_devices gives the loads of one
# plan the same tuple): (that sequence, kept alive so that its id stays its own, the key)
_placed: Lru[tuple[Sequence[Device | None], Key]] = Lru(256, 0)


def _placement(devices: Sequence[Device | None], options: Mapping[str, Any]) -> Key | None:
    try:
        opts = tuple(sorted(options.items()))
        short = Key(id(devices), opts)
    except TypeError:  # an option value that cannot be hashed
        return None
    frozen = type(devices) is tuple  # (a list could change under the same id)
    hit = _placed.get(short) if frozen else None
    if hit is not None and hit[0] is devices:
        return hit[1]
    key = Key(tuple(devices), opts)
    known = _placements.get(key)
    if known is None:
        _placements.put(key, key)
        known = key
    if frozen:
        _placed.put(short, (devices, known))
    return known


def _shareable(obj: Any) -> bool:
    """Whether a bound name's object belongs to no method (safe in two methods at once)."""
    if isinstance(obj, _SHARED):
        return True
    if isinstance(obj, torch.Tensor):
        return is_literal_tensor(obj)
    if type(obj) is tuple or type(obj) is frozenset:
        return all(_shareable(o) for o in obj)
    if type(obj) is dict:  # (a prune form's table of lines, never written)
        return all(_shareable(k) and _shareable(o) for k, o in obj.items())
    if isinstance(obj, types.BuiltinFunctionType):
        owner = getattr(obj, "__self__", None)
        return owner is None or isinstance(owner, types.ModuleType | type) or _pybind_free(owner)
    if isinstance(obj, types.MethodDescriptorType):  # a type's own method (Tensor.copy_)
        return True
    if isinstance(obj, types.FunctionType):
        return obj.__closure__ is None and all(_shareable(d) for d in obj.__defaults__ or ())
    return False


def _pybind_free(owner: Any) -> bool:
    """Whether ``owner`` is the record pybind11 gives a free function as its ``__self__``
    (an operator's C++ entry point, ``OpOverload._op``): the function's definition, no
    object's state."""
    kind = type(owner)
    return kind.__module__ == "pybind11_builtins" and kind.__name__.startswith(
        "pybind11_detail_function_record"
    )


def _keepable(st: Statement) -> bool:
    if st.external is not None or st.instrumented is not None:
        return False
    if st.prune is not None and not _shareable(st.prune):
        return False
    if st.alias is not None and not all(_shareable(o) for o in st.alias.env.values()):
        return False
    return all(_shareable(o) for o in st.env.values())


def truth(x: Any) -> bool:
    """A JumpFalseCall condition: a bool, or a bool tensor that is true when all elements are."""
    if isinstance(x, bool):
        return x
    if isinstance(x, torch.Tensor):
        return bool(x.all()) if x.numel() != 1 else bool(x)
    raise TypeError(f"a jump condition must be a bool or a bool tensor, got {type(x).__name__}")


class InstructionPreparer:
    """Prepares the instructions of one plan; ``missing`` collects operators with no kernel."""

    def __init__(
        self,
        program: Program,
        plan: p.ExecutionPlan,
        path: str,
        values: list[Any],
        dynamic: frozenset[int],
        devices: Sequence[Device | None],
        record: CallRecord,
        options: Mapping[str, Any],
    ) -> None:
        self.program = program
        self.plan = plan
        self.path = path
        self.values = values
        self.dynamic = dynamic
        self.devices = devices
        self.record = record
        self.options = options
        self.missing: list[str] = []
        # what to run once the method is freed (KernelContext.when_unloaded)
        self.unloaded: list[Callable[[], None]] = []
        self._placement = _placement(devices, options)
        self._shared: set[int] = set()  # ids of the kept statements this method uses
        # operator index -> (its qualified name, its factory), asked once a load
        self._operators: dict[int, tuple[str, KernelFactory | None]] = {}

    def _context(self, kind: type[KernelContext], **kwargs: Any) -> Any:
        return kind(
            **kwargs,
            values=self.plan.values,
            dynamic=self.dynamic,
            initial=self.values,
            method_name=self.plan.name,
            devices=self.devices,
            record=self.record,
            options=self.options,
            unloaded=self.unloaded,
        )

    def _key(self, i: int, c: int) -> Key | None:
        """The key of a kernel's statement (None: the options cannot be a key)."""
        if self._placement is None:
            return None
        return Key(id(self.plan), c, i, self._placement)

    def prepare_chain(self, c: int) -> tuple[list[str], list[Statement], list[Effects] | None]:
        """(names, statements, their effects) of chain ``c``; no effects once an operator
        is missing (in this chain or an earlier one). What :data:`_chains` keeps for this
        plan and placement is taken, the rest prepared."""
        chain = self.plan.chains[c]
        kept = self._kept_chain(c)
        if kept is not None:
            names, held, known = kept
            statements: list[Any] = list(held)
            found: list[Any] = list(known)
            fresh = [i for i, st in enumerate(held) if st is None]
            for i in fresh:
                names[i], statements[i] = self.prepare(chain.instructions[i], i, c)
            if self.missing:
                return names, statements, None
            for i in fresh:
                found[i] = self.effects(chain.instructions[i], statements[i])
            return names, statements, found
        prepared = [self.prepare(ins, i, c) for i, ins in enumerate(chain.instructions)]
        names = [name for name, _ in prepared]
        loaded = [st for _, st in prepared]
        if self.missing:
            return names, loaded, None
        effects = [
            self.effects(ins, st) for ins, st in zip(chain.instructions, loaded, strict=True)
        ]
        self._keep_chain(c, names, loaded, effects)
        return names, loaded, effects

    def _kept_chain(
        self, c: int
    ) -> tuple[list[str], tuple[Statement | None, ...], tuple[Effects | None, ...]] | None:
        """What :meth:`_keep_chain` kept of chain ``c`` for this plan and placement, when
        each kept kernel statement's operator still has the factory that made it."""
        key = self._key(-1, c)
        if key is None:
            return None
        hit = _chains.get(key)
        if hit is None or hit[0] is not self.plan:
            return None
        _, factories, names, statements, found = hit
        checked: dict[str, Any] = {}  # name -> its factory now (asked once a name)
        for name, factory in zip(names, factories, strict=True):
            if factory is None:
                continue
            now = checked.get(name, _UNASKED)
            if now is _UNASKED:
                now = checked[name] = find_kernel(name)
            if now is not factory:
                return None
        return list(names), statements, found

    def _keep_chain(
        self,
        c: int,
        names: Sequence[str],
        statements: Sequence[Statement],
        found: Sequence[Effects],
    ) -> None:
        """Keep what of chain ``c`` is a function of the plan and the placement alone: the
        kept kernel statements and those of moves, frees and jumps, with their effects."""
        key = self._key(-1, c)
        if key is None or self.missing:
            return
        factories: list[Any] = []
        held: list[Statement | None] = []
        known: list[Effects | None] = []
        chain = self.plan.chains[c]
        for ins, name, st, e in zip(chain.instructions, names, statements, found, strict=True):
            factory = None
            if isinstance(ins, p.KernelCall):
                if id(st) in self._shared:
                    factory = find_kernel(name)
                else:
                    st = e = None  # type: ignore[assignment]
            elif not isinstance(ins, p.MoveCall | p.FreeCall | p.JumpFalseCall):
                st = e = None  # type: ignore[assignment]
            factories.append(factory)
            held.append(st)
            known.append(e)
        _chains.put(key, (self.plan, tuple(factories), tuple(names), tuple(held), tuple(known)))

    def effects(self, ins: p.Instruction, st: Statement) -> Effects:
        """:func:`ptexec.effects.effects` of ``st`` (running ``ins``), kept with a kept
        statement (a pure function of the two, both frozen), and for a statement each
        load makes afresh (a delegate call's), by the instruction and the statement's
        facts that function reads."""
        values = self.plan.values
        owner: Any
        if id(st) in self._shared:
            kept, key, owner = _effects, Key(id(st)), st
        elif st.external is not None:
            facts = (st.code, st.writes, st.mutates, st.outs, st.reads)
            kept, key, owner = _made_effects, Key(id(values), id(ins), *facts), values
        else:
            return effects(values, ins, st)
        hit = kept.get(key)
        if hit is not None and hit[0] is owner and hit[1] is ins:
            return hit[2]
        found = effects(values, ins, st)
        kept.put(key, (owner, ins, found))  # (the owner kept alive: its id stays its own)
        return found

    def prepare(self, ins: p.Instruction, i: int, c: int) -> tuple[str, Statement]:
        """(name, statement) of instruction ``i`` of chain ``c``."""
        plan = self.plan
        where = f"{self.path}.chains[{c}].instructions[{i}]"
        if isinstance(ins, p.KernelCall):
            operator = self._operators.get(ins.op_index)
            if operator is None:
                name = plan.operators[ins.op_index].qualified_name
                operator = self._operators[ins.op_index] = (name, find_kernel(name))
            name, factory = operator
            if factory is None:
                self.missing.append(name)
                return name, Statement("pass")
            key = self._key(i, c)
            if key is not None:
                hit = _kept.get(key)
                if hit is not None and hit[0] is plan and hit[1] is factory:
                    self._shared.add(id(hit[2]))
                    return name, hit[2]
            watched = _Watched(self.values)
            ctx = self._context(
                KernelContext, op_name=name, instruction=i, args=ins.args, where=where
            )
            ctx.initial = watched
            try:
                st = factory(ctx)
            except UnsupportedKernel as e:
                self.missing.append(f"{name} ({e})")
                return name, Statement("pass")
            if key is not None and not watched.tainted and _keepable(st):
                _kept.put(key, (plan, factory, st))  # the plan kept alive: its id stays its own
                self._shared.add(id(st))
            return name, st
        if isinstance(ins, p.DelegateCall):
            delegate = plan.delegates[ins.delegate_index]
            backend = find_backend(delegate.id)
            if backend is None:
                raise BackendUnavailableError(
                    f"method '{plan.name}' delegates to backend '{delegate.id}', which ptexec "
                    f"cannot run (available: {', '.join(registered_backends()) or 'none'})"
                )
            processed = self.program.pte.delegate_data(delegate.processed)
            key = self._key(i, c)
            renewed = None if key is None else _renewals.get(key)
            if renewed is not None and renewed[0] is plan and renewed[1] is backend:
                later = Renewing(processed, self.program.named_data, self.values, self.unloaded)
                again = renewed[2](later)
                if again is not None:
                    return f"delegate:{delegate.id}", again
            dctx = self._context(
                DelegateContext,
                backend_id=delegate.id,
                delegate_index=ins.delegate_index,
                processed=processed,
                compile_specs=delegate.compile_specs,
                named_data=self.program.named_data,
                instruction=i,
                args=ins.args,
                where=where,
            )
            try:
                st = backend(dctx)
            except UnsupportedKernel as e:
                raise BackendUnavailableError(f"backend '{delegate.id}': {e}") from None
            if key is not None and dctx.renewal is not None:
                _renewals.put(key, (plan, backend, dctx.renewal))  # (the plan kept alive)
            return f"delegate:{delegate.id}", st
        if isinstance(ins, p.MoveCall):
            return "move", Statement(
                f"v[{ins.move_to}] = v[{ins.move_from}]",
                writes=(ins.move_to,),
                mutates=(),
                reads=(ins.move_from,),
            )
        if isinstance(ins, p.FreeCall):
            value = plan.values[ins.value_index]
            if isinstance(value, p.Tensor) and (
                value.allocation_info is not None or value.is_constant
            ):
                # the plan's (or the file's) memory is not the method's to free
                return "free", Statement("pass", mutates=())
            return "free", Statement(f"v[{ins.value_index}].set_()", mutates=(ins.value_index,))
        if isinstance(ins, p.JumpFalseCall):
            cond = ins.cond_value_index
            value = plan.values[cond]
            if isinstance(value, p.Bool) and cond not in self.dynamic:
                expr = repr(bool(value.value))
            elif (
                isinstance(value, p.Tensor)
                and value.numel == 1
                and value.shape_dynamism == p.STATIC
            ):
                expr = f"bool(v[{cond}])"  # one element: true when it is
            else:
                expr = f"_truth(v[{cond}])"
            return "jump_false", Statement(expr, {"_truth": truth}, mutates=(), reads=(cond,))
        raise PteFormatError(where, "unknown instruction")
