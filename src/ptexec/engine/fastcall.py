"""The common call, as one generated function.

Most calls pass torch tensors that already are what the program expects (its dtype, a
shape within its bounds, its device, a dense layout it can read), with the method's
default options (or only ``outputs=`` given: the other mode has a function of its own,
made on its first use). For those, a call is: check each input, copy the planned ones into their
views and hand the others over, run the instructions, copy the outputs out. At load, all
of that is written out as one Python function with every decision already made, so a call
runs no loops over specs, no policy logic and no per-input dispatch. A dense CPU tensor
of a plain dtype is copied into its static planned view as bytes (C's ``memmove``, with
both addresses' ranges checked apart), about half what torch's ``copy_`` costs a small
tensor; any other is copied by torch. Where the native library (:mod:`ptexec.native`) is
loaded, the checks of the CPU tensor inputs of static or bounded shape are one call of
its ``Guard`` (the same tests, about a tenth of their Python cost).

The function returns :data:`NOT_FAST` (before touching anything) for any call it does not
cover, and :meth:`ptexec.Method.execute` then takes its general path, which validates,
binds and reports errors exactly as always. For the calls it covers, it binds exactly as
the general path's rules would (the placement decision's ``COPY`` and ``SHARE``), and
fills in :attr:`ptexec.Method.last_call` the same way. It runs the method's runner, with
the statements inlined when the runner is the plain blocks of one chain that is
straight-line or whose jumps all go forward.
Failures propagate raw: the envelope restores the method and reports them. A method
loaded as one before (the same plan and load options) takes the code generated for the
first and binds its own memory into it (:func:`build_fast_call`).

It restates no rule: the copy-or-share decision is
:func:`ptexec.binding.common_action`'s, and the scalar, shape and output checks are
rendered by :func:`~.arguments.scalar_test`, :func:`ptexec.binding.shape_test` and
:func:`~.arguments.output_checks`, the generated forms of :func:`~.arguments.scalar_fits`,
:func:`~ptexec.binding.shape_error` and :func:`~.arguments.output_error`, defined beside
them.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .. import native
from ..binding import Action, common_action, shape_test
from ..codegen import Code
from ..dtypes import DTYPE_TO_CODE
from ..effects import byte_range, effects, kind, replaced
from ..format import program as p
from ..format.lru import Key, Lru
from ..kernels.registry import NativeCall, Slots, Statement, emptied
from ..loader.state import MethodState, PreparedChain
from ..memory import resize_to
from ..tensor import TensorInfo
from ..threads import ExecuTorchPool
from .arguments import (
    held_outputs,
    output_checks,
    output_error,
    output_memory,
    planned_ranges,
    scalar_test,
)
from .blocks import basic_blocks, forward_lines
from .runner import BlockRunner, Runner, below_autograd_for

__all__ = [
    "NOT_FAST",
    "build_fast_call",
    "clear_generated",
    "inline_statements",
    "runs_inline",
]


class _NotFast:
    def __repr__(self) -> str:
        return "NOT_FAST"


NOT_FAST: Any = _NotFast()

# clones of a list of tensors in one call, each as ``Tensor.clone`` makes it
_CLONE_ALL: Any = getattr(torch, "_foreach_clone", None)


# -- what a load met before reuses (see build_fast_call) -----------------------------------
#
# A generated fast call's text is a function of what its key holds: the plan (the
# decoded plan is shared by the loads of the same bytes), the load options, the
# statements' facts and whether outputs are copied. Its names are of two kinds: those
# bound to the same objects in every load (torch's types, dtypes, sizes, constants of
# the program), kept with the text, and those taken from the load (its values table,
# views, buffers' addresses, statements' names), each kept as how to take it.

GENERATED = 256  # fast calls kept
GENERATED_CHARS = 8 << 20  # their texts' total length


class _PerLoad:
    """The names of a fast call taken from its load: each set now in ``env`` and
    recorded as how to take it from another load's state and runner."""

    __slots__ = ("env", "names", "ops", "runner", "state")

    def __init__(self, state: MethodState, runner: Runner, env: dict[str, Any]) -> None:
        self.state = state
        self.runner = runner
        self.env = env
        self.ops: list[tuple[str | None, Any]] = []
        self.names: set[str] = set()

    def set(self, name: str, take: Any) -> None:
        """``name`` is ``take(state, runner)``."""
        self.env[name] = take(self.state, self.runner)
        self.ops.append((name, take))
        self.names.add(name)

    def update(self, take: Any) -> None:
        """Every name of the mapping ``take(state, runner)``."""
        found = take(self.state, self.runner)
        self.env.update(found)
        self.ops.append((None, take))
        self.names.update(found)


def _values(state: MethodState, runner: Runner) -> Any:
    return state.values


def _record(state: MethodState, runner: Runner) -> Any:
    return state.record


def _flag(state: MethodState, runner: Runner) -> Any:
    return [True]


def _settled_for(state: MethodState, runner: Runner) -> Any:
    return _settled_test(state)


def _pool_checked(state: MethodState, runner: Runner) -> Any:
    pool = _shared_pool(state)
    assert pool is not None  # (the same statements as the load the text was made for)
    return pool.checked


def _pool_key(state: MethodState, runner: Runner) -> Any:
    pool = _shared_pool(state)
    assert pool is not None
    return pool.key  # (a bound method: a new object each time)


def _unviewed_memory(state: MethodState, runner: Runner) -> Any:
    return state.unviewed_memory


def _run(state: MethodState, runner: Runner) -> Any:
    return runner.run


def _refuser(state: MethodState, runner: Runner) -> Any:
    """``refuse(k)``: raise :func:`~.arguments.output_error`'s error for output ``k``."""

    def refuse(k: int, *value: Any) -> None:  # value: the new tensor handed over instead
        error = output_error(state, k, *value)
        if error is not None:
            raise error

    return refuse


class _Planned:
    """Start (``end`` 0) or end (1) of planned range ``r`` on ``device``."""

    __slots__ = ("device", "end", "r")

    def __init__(self, device: torch.device, r: int, end: int) -> None:
        self.device, self.r, self.end = device, r, end

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        return planned_ranges(state, self.device)[self.r][self.end]


class _OutputRange:
    """Of output memory ``r`` on ``device``: its tensor (``end`` None), the start (0) or
    the end (1) of its storage."""

    __slots__ = ("device", "end", "r")

    def __init__(self, device: torch.device, r: int, end: int | None) -> None:
        self.device, self.r, self.end = device, r, end

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        d = output_memory(state, self.device)[self.r]
        if self.end is None:
            return d
        memory = d.untyped_storage()
        return memory.data_ptr() + (memory.nbytes() if self.end else 0)


class _InputView:
    """Input ``i``'s planned view, or its address as ctypes takes it."""

    __slots__ = ("address", "i")

    def __init__(self, i: int, address: bool = False) -> None:
        self.i, self.address = i, address

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        view = state.inputs[self.i].view
        assert view is not None
        return ctypes.c_void_p(view.data_ptr()) if self.address else view


class _Address:
    """The address of the tensor in slot ``slot``, as ctypes takes it."""

    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        return ctypes.c_void_p(state.values[self.slot].data_ptr())


class _Handed:
    """The runner's load-time tensor of output slot ``slot``."""

    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        return getattr(runner, "handed_outputs", {})[self.slot]


class _StatementNames:
    """The names of inlined statements ``ks``, in order."""

    __slots__ = ("ks",)

    def __init__(self, ks: tuple[int, ...]) -> None:
        self.ks = ks

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        statements = inline_statements(state, runner)
        assert statements is not None
        names: dict[str, Any] = {}
        for k in self.ks:
            names.update(statements[k].env)
        return names


class _ForwardNames:
    """The names of every statement of the runner's forward chain, in order."""

    __slots__ = ()

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        chain = _forward_chain(runner)
        assert chain is not None
        names: dict[str, Any] = {}
        for st in chain.statements:
            names.update(st.env)
        return names


class _NativeGuard:
    """The library's ``Guard`` (:mod:`.native`) of the entries ``entries`` (position,
    dtype, sizes, whether it must be contiguous, whether the sizes are bounds), with a
    load's CPU ranges its inputs must lie apart from: its planned buffers and the fixed
    memory of its unplanned outputs, as the Python checks read them (``S{j}``, ``E{j}``)."""

    __slots__ = ("entries",)

    def __init__(
        self, entries: tuple[tuple[int, torch.dtype, tuple[int, ...], bool, bool], ...]
    ) -> None:
        self.entries = entries

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        cpu = torch.device("cpu")
        ranges = list(planned_ranges(state, cpu))
        for d in output_memory(state, cpu):
            memory = d.untyped_storage()
            ranges.append((memory.data_ptr(), memory.data_ptr() + memory.nbytes()))
        library = native.module()
        if library is not None:
            with contextlib.suppress(RuntimeError, ValueError, TypeError):
                return library.Guard(list(self.entries), ranges).function()
        return _refuse_all  # (the library cannot make it: every call takes the general path)


def _refuse_all(inputs: Any) -> bool:
    return False


class _NativePuts:
    """The library's ``Puts`` (:mod:`.native`) of the inputs ``entries`` (position,
    bytes, whether they are a bound's): each dense input copied as bytes into its planned
    view, whose address is the load's."""

    __slots__ = ("entries",)

    def __init__(self, entries: tuple[tuple[int, int, bool], ...]) -> None:
        self.entries = entries

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        made = []
        for i, nbytes, bounded in self.entries:
            view = state.inputs[i].view
            assert view is not None
            made.append((i, view.data_ptr(), nbytes, bounded))
        library = native.module()
        if library is not None:
            with contextlib.suppress(RuntimeError, ValueError, TypeError):
                return library.Puts(made).function()
        return functools.partial(_left_all, (1 << len(state.inputs)) - 1)


def _left_all(left: int, inputs: Any) -> int:
    return left  # (the library cannot make it: every input copied by torch)


# what takes objects each load makes anew (the same kind of object, never the same one)
_FRESH = (_Planned, _OutputRange, _Address)
_FRESH_FUNCTIONS = (_flag, _settled_for, _refuser, _run, _pool_key)


def _makes_anew(take: Any) -> bool:
    if isinstance(take, _InputView):
        return take.address
    return isinstance(take, (*_FRESH, _NativeRun, _Fallback, _NativeGuard, _NativePuts)) or (
        take in _FRESH_FUNCTIONS
    )


def _shared_object(obj: Any) -> bool:
    """Whether a kept name's object belongs to no load (safe in every load's fast call)."""
    if obj is None or obj is NOT_FAST or obj is _MEMMOVE or obj is _CLONE_ALL:
        return True
    if obj is not None and obj is native.copies():
        return True
    if isinstance(obj, bool | int | float | str | bytes | torch.dtype | torch.layout | type):
        return True
    if type(obj) is ctypes.c_size_t:  # (never written)
        return True
    if type(obj) is tuple or type(obj) is frozenset:
        return all(_shared_object(o) for o in obj)
    if isinstance(obj, types.FunctionType):
        return obj.__closure__ is None
    return False


class _Generated:
    """A fast call as generated for one load: its text and line map (None: no fast call),
    the names bound alike in every load, and how to take the others."""

    __slots__ = ("env", "lines", "ops", "plan", "text")

    def __init__(
        self,
        plan: p.ExecutionPlan,
        text: str | None,
        lines: Mapping[int, int],
        env: dict[str, Any],
        ops: tuple[tuple[str | None, Any], ...],
    ) -> None:
        self.plan = plan
        self.text = text
        self.lines = lines
        self.env = env
        self.ops = ops

    @classmethod
    def of(
        cls, state: MethodState, runner: Runner, code: Code, bound: _PerLoad, made: bool
    ) -> _Generated | None:
        """What to keep of the fast call ``code`` generated for ``state``; None when a name
        kept alike would hold an object of this load, or taking the names again from
        this load would not give the names it has."""
        if not made:
            return cls(state.plan, None, {}, {}, ())
        env = code.env
        kept = {k: o for k, o in env.items() if k not in bound.names}
        if not all(_shared_object(o) for o in kept.values()):
            return None
        again = _bind(kept, bound.ops, state, runner)
        if again.keys() != env.keys():
            return None
        fresh = {name for name, take in bound.ops if _makes_anew(take)}
        for k, o in env.items():
            if k in fresh:
                if type(again[k]) is not type(o):
                    return None
            elif again[k] is not o:
                return None
        return cls(state.plan, code.text, code.line_map, kept, tuple(bound.ops))

    def make(self, state: MethodState, runner: Runner) -> Any:
        """The fast call of ``state`` (None: it has none)."""
        if self.text is None:
            return None
        env = _bind(self.env, self.ops, state, runner)
        return state.sources.function(self.text, "call", "_fast", env, lines=self.lines)


def _bind(
    kept: dict[str, Any],
    ops: Sequence[tuple[str | None, Any]],
    state: MethodState,
    runner: Runner,
) -> dict[str, Any]:
    env = dict(kept)
    for name, take in ops:
        if name is None:
            env.update(take(state, runner))
        else:
            env[name] = take(state, runner)
    return env


# (state.key, whether outputs are copied, the statements' facts) -> what was generated
_generated: Lru[_Generated] = Lru(GENERATED, GENERATED_CHARS)


def clear_generated() -> None:
    """Forget the kept fast calls and their keys."""
    _generated.clear()
    _keys.clear()


def _facts(st: Statement) -> tuple[Any, ...]:
    return (st.code, st.writes, st.mutates, st.outs, st.reads, st.sized, st.empties)


# per state key, output mode and steps: the statements the key was last computed from
# (held weakly, per chain) and the key. The same statement objects have the same facts
# (they are frozen): a load whose statements are those (kept statements, shared by the
# loads of a plan) compares only the facts of the others (those each load makes anew)
_Facts = tuple[tuple[tuple[Any, ...], ...], ...]
_keys: Lru[tuple[tuple[tuple[weakref.ref[Statement], ...], ...], _Facts, Key]] = Lru(GENERATED, 0)


def _generated_key(
    state: MethodState, runner: Runner, copy_outputs: bool, steps: bool = False
) -> Key | None:
    """The key of ``state``'s fast call for ``runner``; None: not kept (a runner other
    than the plain blocks: one of its own may differ from load to load). ``steps``: the
    native steps may be used."""
    if state.key is None or type(runner) is not BlockRunner:
        return None
    short = Key(state.key, copy_outputs, steps)
    last = _keys.get(short)
    if last is not None and _same_facts(state.chains, last[0], last[1]):
        return last[2]
    facts = tuple(tuple(map(_facts, c.statements)) for c in state.chains)
    key = Key(state.key, copy_outputs, facts, steps)
    refs = tuple(tuple(map(weakref.ref, c.statements)) for c in state.chains)
    _keys.put(short, (refs, facts, key))
    return key


def _same_facts(
    chains: Sequence[PreparedChain],
    refs: Sequence[Sequence[weakref.ref[Statement]]],
    facts: _Facts,
) -> bool:
    """Whether the statements of ``chains`` have the facts ``facts``: each is the object
    held in ``refs`` or has those facts itself."""
    if len(chains) != len(refs):
        return False
    for chain, held, known in zip(chains, refs, facts, strict=True):
        statements = chain.statements
        if len(statements) != len(held):
            return False
        for st, r, f in zip(statements, held, known, strict=True):
            if r() is not st and _facts(st) != f:
                return False
    return True


def build_fast_call(state: MethodState, runner: Runner, copy_outputs: bool) -> Any:
    """The function for the common calls of the method (it takes the list of inputs), or
    None when its calls always need the general path (options other than the defaults are
    the caller's to rule out). ``copy_outputs``: the outputs are returned as copies.

    What is generated for a method loaded as one before (the same plan, load options and
    statements, the plain blocks) is kept (:data:`_generated`): the text, the names bound
    to the same objects in every load, and how to take the others from this load's state
    (its values table, views, addresses, statements' names); a load met before only
    binds its own objects into the kept code."""
    if not runner.direct_outputs:
        return None  # a runner that binds inputs itself (a CUDA graph): the general path
    steps = native.module() is not None
    key = _generated_key(state, runner, copy_outputs, steps)
    if key is not None:
        hit = _generated.get(key)
        if hit is not None and hit.plan is state.plan:
            return hit.make(state, runner)
    code = Code()
    bound = _PerLoad(state, runner, code.env)
    made = _generate(state, runner, copy_outputs, code, bound, steps)
    fn = None if not made else code.function(state.sources, "call", "_fast")
    if key is not None:
        kept = _Generated.of(state, runner, code, bound, made)
        if kept is not None:
            _generated.put(key, kept, len(kept.text or ""))
    return fn


def _generate(
    state: MethodState,
    runner: Runner,
    copy_outputs: bool,
    code: Code,
    bound: _PerLoad,
    steps: bool = False,
) -> bool:
    """Write the fast call into ``code`` (its names in ``code.env``, those taken from this
    load through ``bound``); False: there is none. ``steps``: runs of statements may be
    native steps (:mod:`.native`)."""
    env = code.env
    env.update(NOT_FAST=NOT_FAST, Tensor=torch.Tensor, strided=torch.strided)
    env.update(resize_to=resize_to)
    bound.set("v", _values)
    bound.set("rec", _record)
    checks: list[str] = []
    binds: list[str] = []
    actions: list[str] = []
    copied = []  # (static nbytes | expression) per planned input
    restored: list[tuple[int, str]] = []  # (slot, what it holds between calls)
    aliased = False  # the instructions may write a caller's tensor (through an alias)
    # planned inputs the runner's code only reads (see the module docstring)
    readable: frozenset[int] = getattr(runner, "readable_inputs", frozenset())
    outputs_memory: dict[int, int] = {}  # id of an unplanned output's memory -> its number
    outputs_read: list[str] = []
    buffer_names: dict[int, int] = {}  # a planned buffer's address -> its number
    resized: list[int] = []  # dynamic inputs copied into their planned view (resized first)
    n = len(state.inputs)
    # tensor inputs whose address the checks read (``p{i}``, ``q{i}``): those on a
    # device with planned memory or outputs' memory, which the checks keep them apart from
    addressed = frozenset(
        s.index
        for s in state.inputs
        if s.kind == "tensor"
        and bool(
            planned_ranges(state, s.device.to_torch()) or output_memory(state, s.device.to_torch())
        )
    )
    # the common checks of the CPU tensor inputs of static or bounded shape, in one call of
    # the library's Guard (where it is loaded, and every range they keep apart from is
    # fixed), and their copies into planned views in one call of its Puts
    cpu = torch.device("cpu")
    by_library = steps and all(
        not d.untyped_storage().resizable() for d in output_memory(state, cpu)
    )
    entries: list[tuple[int, torch.dtype, tuple[int, ...], bool, bool]] = []
    # (input, the line that reads its address): kept where the binds use the address
    addresses: list[tuple[int, str]] = []
    # (input, bytes, whether a bound's) copied into their views by the library
    puts: list[tuple[int, int, bool]] = []
    for spec in state.inputs:
        i = spec.index
        x = f"x{i}"
        if spec.kind != "tensor":  # the general path's rule, for the value's own type
            env[f"w{i}"] = spec.scalar
            test = scalar_test(spec.kind, spec.scalar, x, f"w{i}")
            checks.append(f"if not ({test}): return NOT_FAST")
            actions.append("value")
            continue
        info = spec.info
        assert info is not None and spec.dtype is not None
        device = spec.device
        by_guard = by_library and device.is_cpu and info.dynamism in ("static", "dynamic_bound")
        if device.is_cpu:
            where = f"not {x}.is_cpu"
        else:
            where = f"not {x}.is_cuda or {x}.get_device() != {device.index}"
        if not by_guard:
            env[f"d{i}"] = spec.dtype
            checks.append(
                f"if type({x}) is not Tensor or {x}.dtype is not d{i} or {where} "
                f"or {x}.requires_grad or {x}.layout is not strided: return NOT_FAST"
            )
        # a tensor in memory the method writes: the general path reads it first
        # (the buffers' addresses are globals: the text stays the same for every load)
        apart = []
        where_to = device.to_torch()
        for r, (start, _) in enumerate(planned_ranges(state, where_to)):
            j = buffer_names.setdefault(start, len(buffer_names))
            bound.set(f"S{j}", _Planned(where_to, r, 0))
            bound.set(f"E{j}", _Planned(where_to, r, 1))
            apart.append(f"(q{i} <= S{j} or p{i} >= E{j})")
        for r, d in enumerate(output_memory(state, where_to)):
            memory = d.untyped_storage()
            if not memory.resizable():  # it never moves: its range, as a planned buffer's
                start = memory.data_ptr()
                j = buffer_names.setdefault(start, len(buffer_names))
                bound.set(f"S{j}", _OutputRange(where_to, r, 0))
                bound.set(f"E{j}", _OutputRange(where_to, r, 1))
                apart.append(f"(q{i} <= S{j} or p{i} >= E{j})")
                continue
            k = outputs_memory.setdefault(id(d), len(outputs_memory))
            if k == len(outputs_read):  # read once a call, before the inputs' checks
                bound.set(f"U{k}", _OutputRange(where_to, r, None))
                outputs_read.append(
                    f"u{k} = U{k}.untyped_storage(); b{k} = u{k}.data_ptr(); "
                    f"e{k} = b{k} + u{k}.nbytes()"
                )
            apart.append(f"(q{i} <= b{k} or p{i} >= e{k})")
        if apart:
            assert i in addressed
            # a static input's size in bytes, when its shape passes (else: not fast anyway)
            nbytes = info.nbytes if info.dynamism == "static" else f"{x}.nbytes"
            read = f"p{i} = {x}.data_ptr(); q{i} = p{i} + {nbytes}"
            if by_guard:  # read after the guard, where the code below uses it
                addresses.append((i, read))
            else:
                checks.append(read)
                checks.append(f"if not ({' and '.join(apart)}): return NOT_FAST")
        if info.dynamism == "static":
            if 0 in info.sizes:
                return False  # empty inputs bind as EMPTY: the general path
            if not by_guard:
                checks.append(f"if not ({shape_test(info, f'{x}.shape')}): return NOT_FAST")
        elif info.dynamism == "dynamic_bound":  # with elements: else EMPTY, the general path
            checks.append(f"{x}s = {x}.shape")  # (the code below reads it)
            if not by_guard:
                checks.append(f"if not ({shape_test(info, f'{x}s')}) or 0 in {x}s: return NOT_FAST")
        else:
            return False  # unbounded inputs: the general path
        # the placement decision for such a tensor, as the general path takes it
        action = common_action(info, True)
        if action is None:
            return False  # other layouts: the general path decides
        dense = common_action(info, False) is not action
        if by_guard:
            bounded = info.dynamism == "dynamic_bound"
            entries.append((spec.index, spec.dtype, tuple(info.sizes), dense, bounded))
        elif dense:
            checks.append(f"if not {x}.is_contiguous(): return NOT_FAST")
        if action is Action.COPY and spec.slot in readable:
            # the runner's code only reads it: the caller's tensor stands in for the
            # planned view when it is dense in the program's (default) dim order
            assert spec.view is not None
            bound.set(f"V{i}", _InputView(i))
            env[f"o{i}"] = spec.dim_order
            others = _apart(state, i, addressed) + f" and not ({_lazy_test(x, info.dtype)})"
            binds.append(f"if {x}.is_contiguous(){others}: v[{spec.slot}] = {x}")
            binds.append("else:")
            if info.dynamism != "static":
                binds.append(f"    if V{i}.shape != {x}s: resize_to(V{i}, {x}s, o{i})")
            binds.append(f"    V{i}.copy_({x})")
            binds.append(f"    rec.{'h2h' if device.is_cpu else 'd2d'} += {x}.nbytes")
            binds.append(f"    rec.inputs[{i}] = 'copy'")
            restored.append((spec.slot, f"V{i}"))
            action = Action.SHARE
        elif action is Action.COPY:
            assert spec.view is not None
            bound.set(f"V{i}", _InputView(i))
            env[f"o{i}"] = spec.dim_order
            if info.dynamism != "static":
                binds.append(f"e{i} = V{i}.shape != {x}s")
                binds.append(f"if e{i}: resize_to(V{i}, {x}s, o{i})")
                resized.append(i)
            if by_guard and i < 63 and _raw_copy(spec, info, bool(apart)):
                # as below, after the views are resized: one call of the library's Puts
                puts.append((i, info.nbytes, info.dynamism != "static"))
            elif _raw_copy(spec, info, bool(apart)):
                # a dense tensor of a plain dtype: its bytes are the view's (nonzero
                # address: a ZeroTensor has none; no lazy negation)
                # (the view's address is fixed for the method's life, as the planned
                # buffers' ranges above are: both arguments made once, as ctypes takes them)
                env["_memmove"] = _MEMMOVE
                bound.set(f"D{i}", _InputView(i, address=True))
                # a dynamic view, resized to the input's sizes, is dense at the same address
                size = f"N{i}" if info.dynamism == "static" else f"q{i} - p{i}"
                if info.dynamism == "static":
                    env[f"N{i}"] = ctypes.c_size_t(info.nbytes)
                binds.append(
                    f"if p{i} and {x}.is_contiguous() and not {x}.is_neg(): "
                    f"_memmove(D{i}, p{i}, {size})"
                )
                binds.append(f"else: V{i}.copy_({x})")
            else:
                binds.append(f"V{i}.copy_({x})")
            copied.append(info.nbytes if info.dynamism == "static" else f"{x}.nbytes")
        else:
            if spec.written and sum(s.kind == "tensor" for s in state.inputs) > 1:
                return False  # whether it shares memory with another input: the general path
            # an alias of its own: a program that resizes the slot (an out= kernel writing
            # a larger result) changes the alias, never the caller's tensor. A tensor whose
            # memory does not hold its values (a lazy negation) is for the general path.
            checks.append(f"if {_lazy_test(x, info.dtype)}: return NOT_FAST")
            binds.append(f"v[{spec.slot}] = {x}.detach()")
            restored.append((spec.slot, "None"))
            aliased = True
        actions.append(action.value)
    direction = "h2h" if all(s.device.is_cpu for s in state.inputs) else None
    if direction is None and copied:
        return False  # planned inputs on a device: counted per call by the general path
    if puts:
        bound.set("_put", _NativePuts(tuple(puts)))
        left = [f"    if _m & {1 << i}: V{i}.copy_(x{i})" for i, _, _ in puts]
        binds += ["_m = _put(inputs)", "if _m:", *left]
    if entries:
        bound.set("_guard", _NativeGuard(tuple(entries)))
        used = "\n".join(binds)
        reads = [line for j, line in addresses if re.search(rf"\b[pq]{j}\b", used)]
        checks[:0] = ["if not _guard(inputs): return NOT_FAST", *reads]
    total = " + ".join(str(c) for c in copied) or "0"
    env["ACTIONS"] = tuple(actions)
    env["NO_OUT"] = ("",) * len(state.outputs)
    code.add("def _fast(inputs):")
    with code.indented():
        code.add(f"if len(inputs) != {n}: return NOT_FAST")
        if n:
            code.add(", ".join(f"x{i}" for i in range(n)) + ", = inputs")
        if checks:  # a tensor torch cannot describe (a nested one, say): the general path says so
            code.add("try:")
            with code.indented():
                code.add("\n".join(outputs_read + checks))
            code.add("except Exception:")
            code.add("    return NOT_FAST")
        code.add(f"rec.h2h = {total}")
        code.add("rec.h2d = rec.d2h = rec.d2d = 0")
        code.add("rec.inputs[:] = ACTIONS")
        code.add("rec.outputs[:] = NO_OUT")
        code.add("try:")
        pool = _shared_pool(state)
        if pool is not None:
            # ExecuTorch's pool checked once for the call's runners (ExecuTorchPool.checked),
            # the pool the load's statements hold
            bound.set("_pool_checked", _pool_checked)
            bound.set("_pool_key", _pool_key)
        with code.indented(), contextlib.ExitStack() as guarded:
            if pool is not None:
                code.add("_pool_checked[0] = _pool_key()")
            code.add("\n".join(binds))
            tensors = all(out.kind == "tensor" for out in state.outputs)
            # skipping views' bookkeeping skips the version counts of what the program
            # writes in place too: only where no caller's tensor is written or returned
            calls: int | None = getattr(runner, "calls", None)
            if calls is None:
                calls = _kernel_calls(state, runner)
            # outputs whose last statement makes them anew, handed over without a copy
            made_new = _fresh_returns(state, runner) if copy_outputs else {}
            # the runs of native steps (their own guard): not counted
            per_call = frozenset(slot for slot, _ in restored)
            runs = _planned_runs(state, runner, per_call, made_new) if steps else {}
            if calls is not None and runs:
                calls -= sum(len(ks) for ks in runs.values())
            guard = below_autograd_for(state, copy_outputs and tensors and not aliased, calls)
            if guard is not None:
                # the outputs' checks and copies too: a copy below autograd costs less
                env["_below"] = guard
                code.add("with _below():")
                guarded.enter_context(code.indented())
            # the dynamic outs the statements empty first: only where their inputs' sizes
            # changed since the last run, when the sizes follow from the inputs' alone
            needed = _emptying_test(state, runner, resized, made_new)
            if needed is not None:
                code.add(f"_e = {needed}")
            # the outputs' checks stop once a call finds the method settled (see
            # :func:`_settling`): a list of one flag, the table's geometry at the start
            settling = copy_outputs and _settling(state, runner)
            if settling:
                bound.set("_unsettled", _flag)
                env["_geometry"] = _geometry
                bound.set("_settled", _settled_for)
                code.add("if _unsettled[0]: _g = _geometry(v)")
            # copies between tensors of the table: their bytes, once settled
            raw = settling and tensors and not aliased
            if not _run_into(code, state, runner, bound, needed is not None, raw, made_new, runs):
                return False
            new_slots = set(made_new.values())
            outs = []
            bound.set("_refuse", _refuser)
            # slots whose tensor the runner guarantees (written in place only): unchecked
            fixed: frozenset[int] = getattr(runner, "fixed_outputs", frozenset())
            # slots whose tensor is new on every call and held by nothing else: the copy
            fresh: frozenset[int] = getattr(runner, "fresh_outputs", frozenset())
            # slots holding their load-time tensor (copied) or a new one held by nothing
            # else (the copy), which the slot then gives up for the load-time one
            handed: Mapping[int, Any] = getattr(runner, "handed_outputs", {})
            # outputs that stay the tensor loading made: only their sizes can be wrong
            held = held_outputs(state, _replaced(state, runner))
            # fixed outputs whose copy the inlined statements hold (a compiled region's
            # result, a tensor of its own): the caller's copy, for one output each
            returned: dict[int, str] = {}
            if inline_statements(state, runner) is not None:
                returned = dict(getattr(runner, "returned_outputs", {}))
            checked: list[str] = []
            for out in state.outputs:
                x = f"v[{out.slot}]"
                if out.kind == "tensor" and out.slot in new_slots:
                    # a new tensor of the output's dtype, dense: only its sizes to check
                    made = f"_f{out.slot}"
                    checked.extend(
                        output_checks(state, out.index, made, "_refuse", env, True, True)
                    )
                    outs.append(made)
                    continue
                if out.kind == "tensor" and out.slot not in fixed:
                    # what execution left there is what the program declares
                    lines = output_checks(state, out.index, x, "_refuse", env, out.index in held)
                    checked.extend(lines)
                copy = copy_outputs and out.slot not in fresh
                if out.kind == "tensor" and copy and out.slot in handed:
                    bound.set(f"H{out.slot}", _Handed(out.slot))
                    h = f"_h{out.index}"
                    code.add(f"{h} = {x}")
                    outs.append(f"({h} if {h} is not H{out.slot} else {h}.clone())")
                    restored.append((out.slot, f"H{out.slot}"))
                elif out.kind == "tensor" and copy and out.slot in returned:
                    outs.append(returned.pop(out.slot))
                elif out.kind == "tensor" and copy:
                    outs.append(f"{x}.clone()")
                elif out.kind == "tensor" and out.slot in fresh:
                    # new on every call, of no constant or shared memory, and read by
                    # nothing before the next call replaces it: the caller's as it is
                    outs.append(x)
                elif out.kind == "tensor":  # a view, unless of constants or shared state
                    bound.set("K", _unviewed_memory)
                    outs.append(
                        f"(_o.detach() if (_o := {x}).untyped_storage().data_ptr() not in K "
                        "else _o.clone())"
                    )
                else:
                    outs.append(x)
            if settling and checked:
                code.add("if _unsettled[0]:")
                with code.indented():
                    code.add("\n".join(checked))
                    code.add("_unsettled[0] = not _settled(v, _g)")
            else:
                code.add("\n".join(checked))
            tensors = all(out.kind == "tensor" for out in state.outputs)
            copies = [o for o in outs if o.endswith(".clone()") and o.startswith("v[")]
            clone_all = native.copies() if steps else None
            if clone_all is None and len(copies) > 1:
                clone_all = _CLONE_ALL
            if copy_outputs and tensors and copies and clone_all is not None:
                # one call for every copy (torch's own loop, or the native steps' copies
                # of bytes: a Python call per output costs about as much as a small copy)
                env["_clone_all"] = clone_all
                listed = ", ".join(o[: -len(".clone()")] for o in copies)
                if len(copies) == len(outs):
                    code.add(f"return list(_clone_all([{listed}]))")
                else:
                    code.add(f"_c = _clone_all([{listed}])")
                    numbered = iter(range(len(copies)))
                    outs = [f"_c[{next(numbered)}]" if o in copies else o for o in outs]
                    code.add(f"return [{', '.join(outs)}]")
            else:
                code.add(f"return [{', '.join(outs)}]")
            guarded.close()
        code.add("finally:")
        with code.indented():
            code.add("\n".join(f"v[{slot}] = {held}" for slot, held in restored))
            if pool is not None:
                code.add("_pool_checked[0] = None")
            code.add("pass")
    return True


# C's memmove, called holding the GIL (ctypes' own releases it and takes it back: for a
# copy of a few bytes, a chance for another thread to hold the call up)
_MEMMOVE = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes.cast(ctypes.memmove, ctypes.c_void_p).value or 0
)

# dtypes whose elements are their bytes (no quantization parameters, no complex parts)
_RAW_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)


def _shared_pool(state: MethodState) -> ExecuTorchPool | None:
    """ExecuTorch's thread pool, when two or more of the method's statements run on it
    (each would check it on every call; the call checks once for all)."""
    runs = 0
    for chain in state.chains:
        for st in chain.statements:
            pool = getattr(st.external, "pool", None)
            if isinstance(pool, ExecuTorchPool):
                runs += 1
                if runs == 2:
                    return pool
    return None


def _raw_copy(spec: Any, info: Any, addressed: bool) -> bool:
    """Whether the copy of a caller's tensor into planned input ``spec`` may be a copy of
    its bytes when the tensor is dense (``memmove``: about half what ``Tensor.copy_``
    costs a small tensor): a static shape, or a bounded one (its view resized to the
    tensor's sizes first, in place: dense, at its address), on the CPU in the default
    dim order, a dtype of plain elements, and the tensor's address read by the checks
    (``addressed``)."""
    return (
        addressed
        and info.dynamism in ("static", "dynamic_bound")
        and spec.device.is_cpu
        and spec.dtype in _RAW_DTYPES
        and tuple(spec.dim_order) == tuple(range(len(spec.dim_order)))
    )


def _lazy_test(x: str, dtype: torch.dtype) -> str:
    """A Python expression, true when the tensor ``x`` has a lazy negation or conjugation,
    or is a ZeroTensor (dense, at address 0, no memory): its memory does not hold its
    values, so code that reads the memory (compiled code, a delegate) must not be handed
    it (a conjugation only exists for complex dtypes)."""
    if dtype.is_complex:
        return f"{x}.is_neg() or {x}.is_conj() or {x}._is_zerotensor()"
    return f"{x}.is_neg() or {x}._is_zerotensor()"


def _apart(state: MethodState, i: int, addressed: frozenset[int] = frozenset()) -> str:
    """The `` and ...`` conditions that the dense tensor ``x{i}`` shares no byte with another
    tensor input of the call on its device (one the program may write): only then, and
    apart from the planned buffers (checked for every input), may the caller's tensor
    stand in for the planned view. ``addressed``: inputs whose address range the checks
    read already (``p{j}``, ``q{j}``: a tensor's address does not change in a call)."""
    spec = state.inputs[i]
    others = [
        s.index
        for s in state.inputs
        if s.index != i and s.kind == "tensor" and s.device == spec.device
    ]
    p, q = f"p{i}", f"q{i}"
    conds = [
        f"({q} <= p{j} or {p} >= q{j})"
        if j in addressed
        else f"({q} <= x{j}.data_ptr() or {p} >= x{j}.data_ptr() + x{j}.nbytes)"
        for j in others
    ]
    return "".join(f" and {c}" for c in conds)


def _run_into(
    code: Code,
    state: MethodState,
    runner: Runner,
    bound: _PerLoad,
    guarded: bool = False,
    raw: bool = False,
    made_new: Mapping[int, int] = types.MappingProxyType({}),
    runs: Mapping[int, tuple[int, ...]] = types.MappingProxyType({}),
) -> bool:
    """Add the lines that run the method's instructions: inlined when the runner is the
    plain blocks of one straight-line chain, or of one chain whose jumps all go forward
    (its one function's lines, :func:`~.blocks.forward_lines`), else a call of the runner
    (other control flow, the instruction limit, its own error reports). False: the fast
    path cannot run them. ``guarded``: a statement empties its outs (its ``empties``)
    only when ``_e`` is true (see :func:`_emptying_test`). ``raw``: the fast call settles
    (:func:`_settling`, ``_unsettled``) and may skip version counts: once settled, the
    copies :func:`_byte_copies` finds copy bytes. ``made_new``: statements (by position)
    run in their ``fresh`` form, each leaving its output's new tensor in ``_f{slot}``
    (:func:`_fresh_returns`). ``runs``: the runs of statements that are native steps
    (:func:`_planned_runs`), by their first statement."""
    statements = inline_statements(state, runner)
    if statements is not None:
        if len(statements) > state.max_instructions:
            return False
        env = code.env
        in_run = {k for ks in runs.values() for k in ks}
        raw_copies = _byte_copies(state, statements) if raw else {}
        raw_copies = {k: c for k, c in raw_copies.items() if k not in in_run}
        named: list[int] = []  # the statements with names of their own
        if raw_copies:
            env["_memmove"] = _MEMMOVE

        def text(k: int, st: Statement) -> str:
            if guarded and st.empties:
                emptying = "; ".join(f"v[{o}].resize_(0)" for o in st.empties)
                return f"if _e: {emptying}\n{emptied(st)}"
            return st.code

        def plain(k: int, st: Statement) -> None:
            code.add(text(k, st), k)

        for k, st in enumerate(statements):
            if k in runs:
                # (its statements' names: in the fallback's own namespace, not the call's)
                _run_lines(code, bound, runs[k], statements, text, "_e" if guarded else "True")
                continue
            if k in in_run:
                continue
            if k in made_new:
                o, fresh = made_new[k], st.fresh
                assert fresh is not None
                env[f"_FT{o}"] = state.values[o].dtype
                # the out's own statement, and a copy, where the new tensor's dtype (type
                # promotion) or layout is not the output's
                fallback = "\n".join(f"    {line}" for line in st.code.splitlines())
                code.add(
                    f"_f{o} = {fresh}\n"
                    f"if _f{o}.dtype is not _FT{o} or not _f{o}.is_contiguous():\n"
                    f"{fallback}\n    _f{o} = v[{o}].clone()",
                    k,
                )
            elif k in raw_copies:
                d, s, n = raw_copies[k]
                bound.set(f"_cd{k}", _Address(d))
                bound.set(f"_cs{k}", _Address(s))
                env[f"_cn{k}"] = ctypes.c_size_t(n)
                code.add(f"if _unsettled[0]: {st.code}\nelse: _memmove(_cd{k}, _cs{k}, _cn{k})", k)
            else:
                plain(k, st)
            if st.env:
                named.append(k)
        if named:
            bound.update(_StatementNames(tuple(named)))
    elif (chain := _forward_chain(runner)) is not None:
        instead: dict[int, str] = {}
        emit: dict[int, Any] = {}
        if isinstance(runner, BlockRunner):
            instead = _compared_jumps(state, chain, code.env)

            def own(k: int, st: Statement) -> str:
                return st.code

            for k, ks in runs.items():
                emit[k] = functools.partial(
                    _run_lines, code, bound, ks, chain.statements, own, "True"
                )
        forward_lines(chain, code, instead, emit)
        bound.update(_ForwardNames())
    else:
        bound.set("_run", _run)
        code.add("_run(v)")
        return True
    code.add("pass")
    return True


def _planned_runs(
    state: MethodState, runner: Runner, per_call: frozenset[int], made_new: Mapping[int, int]
) -> dict[int, tuple[int, ...]]:
    """The runs of native steps (:func:`_native_runs`) of the statements the fast call
    inlines for the plain blocks (``made_new``: those run in their fresh form; a jump's
    comparison read as numbers, and what it replaces, stay statements), by first
    statement; none for another runner."""
    if not isinstance(runner, BlockRunner):
        return {}
    statements = inline_statements(state, runner)
    if statements is not None:
        return _native_runs(state, statements, per_call, set(made_new))
    chain = _forward_chain(runner)
    if chain is None:
        return {}
    starts = {start for start, _ in basic_blocks(chain.instructions)}
    fused = set(_compared_jumps(state, chain, {}))
    return _native_runs(state, chain.statements, per_call, fused, starts)


def _run_lines(
    code: Code,
    bound: _PerLoad,
    ks: tuple[int, ...],
    statements: Sequence[Statement],
    text: Callable[[int, Statement], str],
    empty: str,
) -> tuple[int, ...]:
    """Add the lines running the statements ``ks`` (by position in chain 0) as one run of
    native steps (``empty``: whether they empty their outs), and, after the step that
    stopped it, as the statements (``text``: one's code); the positions covered. At
    the step where it stopped, its error is raised, or its warnings issued (it ran), on
    its own line of the fallback (:class:`_Fallback`, compiled on first use: the call's
    text stays two lines a run, and a generated text's length is load time)."""
    k = ks[0]
    bound.set(f"_n{k}", _NativeRun(ks, statements, bound.state.values))
    body: list[tuple[str, int]] = []
    for at, kk in enumerate(ks):
        test = f"if _s < {at} or (_s == {at} and not _n.stopped({at})):"
        line = text(kk, statements[kk])
        if line.isprintable():  # one line
            body.append((f"{test} {line}", kk))
        else:
            body.append((test, kk))
            body.extend(("    " + part, kk) for part in line.splitlines())
    bound.set(f"_f{k}", _Fallback(ks, tuple(body)))
    code.add(f"# native steps: instructions {', '.join(map(str, ks))}")
    code.add(f"_s = _n{k}.run({empty})")
    code.add(f"if _s >= 0: _f{k}(v, _s, {empty}, _n{k})")
    return ks


class _Fallback:
    """How to take, from a load, the statements of a run of native steps after the step
    that stopped it (:func:`_run_lines`): a function compiled on first use (most runs
    never stop), its lines tagged with their instructions, so that an error there names
    its instruction as any statement's does."""

    __slots__ = ("body", "ks")

    def __init__(self, ks: tuple[int, ...], body: tuple[tuple[str, int], ...]) -> None:
        self.ks = ks
        self.body = body

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        return _LazyFallback(state, self)


class _LazyFallback:
    """A load's :class:`_Fallback`: ``(v, _s, _e, _n)`` runs the statements after the
    step ``_s`` of the run ``_n`` stopped at (``_e``: whether they empty their outs)."""

    __slots__ = ("fn", "of", "state")

    def __init__(self, state: MethodState, of: _Fallback) -> None:
        self.state = weakref.ref(state)  # (the state holds the fast call, which holds this)
        self.of = of
        self.fn: Any = None

    def __call__(self, v: list[Any], s: int, e: bool, n: Any) -> None:
        fn = self.fn
        if fn is None:
            state = self.state()
            assert state is not None  # (a method's call runs while its state lives)
            code = Code()
            for kk in self.of.ks:
                code.env.update(state.chains[0].statements[kk].env)
            code.add("def _fb(v, _s, _e, _n):")
            with code.indented():
                for line, kk in self.of.body:
                    code.add(line, kk)
                code.add("pass")
            fn = self.fn = code.function(state.sources, "native steps' statements", "_fb")
        fn(v, s, e, n)


class _NativeRun:
    """The native steps (:mod:`.native`) of the statements ``ks`` of chain 0 (their calls
    and empties, found once: the same in every load of the plan), made of a load's
    tensors: the library's ``Steps``."""

    __slots__ = ("template",)

    def __init__(
        self, ks: tuple[int, ...], statements: Sequence[Statement], values: Sequence[Any]
    ) -> None:
        library = native.module()
        calls = [_native_call(statements[k]) for k in ks]
        empties = [statements[k].empties for k in ks]
        self.template = None if library is None else _template(library, values, calls, empties)

    def __call__(self, state: MethodState, runner: Runner) -> Any:
        if self.template is not None:
            with contextlib.suppress(RuntimeError, ValueError, TypeError):
                return self.template.bind(state.values)
        return _FromTheFirst()


class _FromTheFirst:
    """A run whose steps could not be made: every statement runs in Python."""

    def run(self, empty: bool) -> int:
        return 0

    def stopped(self, k: int) -> bool:
        return False


def _native_call(st: Statement) -> NativeCall | None:
    """The native call of ``st``: its own :class:`~ptexec.kernels.registry.NativeCall`
    when it writes nothing but its outs, or ``Tensor.copy_`` of one tensor of the table
    into another (``v[d].copy_(v[s])``, or the same returning ``v[d]`` into its slot);
    else None."""
    call = st.native
    if call is not None:
        if st.writes or st.mutates is None or not st.outs or set(st.mutates) != set(st.outs):
            return None
        return call
    m = _COPY.fullmatch(st.code)
    if m is not None:
        d, s = int(m.group(1)), int(m.group(2))
    else:
        m = _RETURNED_COPY.fullmatch(st.code)
        if m is None or st.env.get(m.group(2)) is not torch._C.TensorBase.copy_:
            return None
        d, s = int(m.group(1)), int(m.group(3))
    if d == s or st.mutates != (d,):
        return None
    return NativeCall("aten::copy_", "", (Slots((d,)), Slots((s,)), False))


def _native_args(values: Sequence[Any], call: NativeCall) -> list[Any]:
    """``call``'s arguments, its slots read from ``values``."""
    args: list[Any] = []
    for a in call.args:
        if type(a) is Slots and a.view is not None:
            args.append(values[a.items[0]].view(a.view))  # (raises where it cannot)
        elif type(a) is Slots:
            args.append(values[a.items[0]] if a.single else [values[j] for j in a.items])
        else:
            args.append(a)
    return args


def _places(call: NativeCall) -> list[tuple[int, list[int]]]:
    """Where each argument of ``call`` comes from, as the library's ``Steps.add`` takes
    it: (0, []) a fixed value, (1, [slot]) a slot's tensor, (2, slots) the list of those
    of slots, (3, [slot, *sizes]) a slot's tensor seen with sizes."""
    places: list[tuple[int, list[int]]] = []
    for a in call.args:
        if type(a) is not Slots:
            places.append((0, []))
        elif a.view is not None:
            places.append((3, [a.items[0], *a.view]))
        else:
            places.append(((1 if a.single else 2), list(a.items)))
    return places


def _template(
    library: Any,
    values: Sequence[Any],
    calls: Sequence[NativeCall | None],
    empties: Sequence[tuple[int, ...]],
) -> Any:
    """The library's steps of ``calls`` (each emptying its ``empties`` first when a run
    asks, and the others its call empties always) as a template: the arguments' types
    checked on ``values`` (a load's table), where each tensor comes from kept, the
    tensors not (``bind`` makes a load's steps); None when one cannot be made."""
    made = library.Steps()
    try:
        for call, outs in zip(calls, empties, strict=True):
            if call is None:
                return None
            always = [o for o in call.empties if o not in outs]
            try:
                args = _native_args(values, call)
            except RuntimeError:  # a view this load's tensors do not allow
                if call.fallback is None:
                    raise
                call = call.fallback
                args = _native_args(values, call)
            made.add(
                call.name,
                call.overload,
                args,
                [values[o] for o in outs],
                [values[o] for o in always],
                _places(call),
                list(outs),
                always,
            )
    except (RuntimeError, ValueError, TypeError, IndexError):
        return None
    return made


def _native_runs(
    state: MethodState,
    statements: Sequence[Statement],
    per_call: frozenset[int],
    skipped: set[int],
    starts: set[int] | frozenset[int] = frozenset(),
) -> dict[int, tuple[int, ...]]:
    """The runs of statements (by position in the one straight-line chain) the fast call
    runs as native steps: the first of each, and all of them. A step is a statement with
    a :class:`~ptexec.kernels.registry.NativeCall` (the operator and arguments its code
    calls: the same kernels on the same memory) that writes nothing but its outs, and
    whose tensors are the method's own CPU tensors that keep their objects from call to
    call: no statement puts another object in their slots, the call binds none of them
    (``per_call``), none requires grad. (A step is never run again, so what its outs
    share with what it reads is as in Python.)
    ``skipped``: statements the call runs otherwise. Statements that do nothing
    (``pass``) do not end a run; ``starts`` (blocks' first statements, which jumps go
    to) begin one."""
    library = native.module()
    if library is None:
        return {}
    values = state.values
    plan_values = state.plan.values
    instructions = state.chains[0].instructions
    given = set(per_call)  # slots given objects (a copy returning its ``self`` gives none)
    for ins, st in zip(instructions, statements, strict=True):
        given.update(replaced(plan_values, ins, st))

    def own(j: int) -> bool:
        t = values[j]
        return (
            j not in given
            and type(t) is torch.Tensor
            and t.device.type == "cpu"
            and not t.requires_grad
        )

    def step(st: Statement) -> bool:
        call = _native_call(st)
        if call is None:
            return False
        slots = [j for a in call.args if type(a) is Slots for j in a.items]
        return all(own(j) for j in (*slots, *st.empties, *call.empties))

    runs: dict[int, tuple[int, ...]] = {}
    current: list[int] = []
    for k, st in enumerate(statements):
        if k in starts and current:
            runs[current[0]] = tuple(current)
            current = []
        if k not in skipped and step(st):
            current.append(k)
            continue
        if st.code == "pass" and k not in skipped:
            continue
        if current:
            runs[current[0]] = tuple(current)
            current = []
    if current:
        runs[current[0]] = tuple(current)
    return runs


# the statement ``v[d].copy_(v[s])``, and the same through a name for ``Tensor.copy_``
# returning ``v[d]`` into its slot (``aten::copy_``)
_COPY = re.compile(r"v\[(\d+)\]\.copy_\(v\[(\d+)\]\)")
_RETURNED_COPY = re.compile(r"v\[(\d+)\] = (\w+)\(v\[\1\], v\[(\d+)\]\)")


def _fresh_returns(state: MethodState, runner: Runner) -> dict[int, int]:
    """The statements (by position in the one straight-line chain of plain blocks) the fast
    call runs in their ``fresh`` form (:class:`~ptexec.kernels.registry.Statement`): each
    writes one output of the method, which the call then hands to its caller as the new
    tensor the form makes, where it would write the output's memory and copy it out. The
    slot of each.

    Only outputs of dynamic shape: a static output's memory holds its value after every
    call, which :meth:`ptexec.Method.values` and training's gradients read there (the
    compiled tier keeps the same rule). A dynamic output's memory is left as it was, so
    nothing may read it: it is one output (not also an input, an unplanned output or
    another output), dense in the default dim order, and that statement alone touches its
    slot, reading it not; no statement after it, and no other output, touches a tensor
    whose bytes overlap the output's (a view of it made at load, or an object a statement
    makes from one per call); each such tensor a statement before it touches is an input,
    first written there, or a view of bytes written before it is read (tensors that share
    the bytes at another time, as the memory plan reuses them:
    :func:`_written_before_read`)."""
    if not isinstance(runner, BlockRunner) or not runner.straight_line:
        return {}
    statements = state.chains[0].statements
    table = state.values
    slots = [out.slot for out in state.outputs]
    inputs = {spec.slot for spec in state.inputs}
    bound = inputs | {o.slot for o in state.unplanned_outputs}
    # the outputs whose last writer offers the form: the cheap tests first
    writer: dict[int, int] = {}
    for k, st in enumerate(statements):
        for o in st.outs:
            writer[o] = k
    candidates = []
    for out in state.outputs:
        o = out.slot
        t = table[o]
        info = out.info
        if (
            o in writer
            and statements[writer[o]].fresh is not None
            and out.kind == "tensor"
            and slots.count(o) == 1
            and o not in bound
            and type(t) is torch.Tensor
            and isinstance(info, TensorInfo)
            and info.dim_order == tuple(range(len(info.sizes)))
            and t.is_contiguous()
            and t.numel() > 0
            and info.dynamism != "static"
        ):
            candidates.append(o)
    if not candidates:
        return {}
    values = state.plan.values
    instructions = state.chains[0].instructions
    # statements giving slots new objects: what each takes, and those slots
    making: list[tuple[frozenset[int], tuple[int, ...]]] = []
    for ins, st in zip(instructions, statements, strict=True):
        if st.writes or st.mutates is None or not isinstance(ins, _DECLARING):
            taken, _, replaces = _touches(values, ins, st)
            if replaces:
                making.append((taken, replaces))
    spans = _spans(state)
    ranges = {j: (start, end) for start, end, j in spans if type(table[j]) is torch.Tensor}
    near: dict[int, set[int]] = {}
    for o in candidates:
        found_near = _overlapping(spans, table[o]) - {o}
        for taken, replaces in making:  # objects made from them: views of the bytes too
            if not found_near.isdisjoint(taken) or o in taken:
                found_near.update(replaces)
        near[o] = found_near
    relevant = set(candidates).union(*near.values())
    # per relevant slot: how many statements touch it, the first and the last, and
    # whether the first reads it
    count: dict[int, int] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    read_first: set[int] = set()
    touches: dict[int, tuple[frozenset[int], tuple[int, ...]]] = {}
    for k, (ins, st) in enumerate(zip(instructions, statements, strict=True)):
        if (
            st.reads is not None
            and st.mutates is not None
            and relevant.isdisjoint(st.reads)
            and relevant.isdisjoint(st.mutates)
            and relevant.isdisjoint(st.outs)
            and relevant.isdisjoint(st.writes)
        ):
            continue  # (what it declares is all it touches: see _touches)
        taken, written, _ = _touches(values, ins, st)
        touches[k] = (taken, written)
        for j in relevant & taken.union(written):
            count[j] = count.get(j, 0) + 1
            last[j] = k
            if j not in first:
                first[j] = k
                if j in taken:
                    read_first.add(j)
    found: dict[int, int] = {}
    for o in candidates:
        k = writer[o]
        taken, written = touches.get(k, (frozenset(), ()))
        if (
            written != (o,)
            or o in taken
            or count.get(o) != 1
            or near[o] & set(slots)
            or any(last.get(j, -1) > k for j in near[o])
            or not _written_before_read(near[o] - inputs, read_first, first, ranges)
        ):
            continue
        found[k] = o
    return found


def _written_before_read(
    near: set[int],
    read_first: set[int],
    first: Mapping[int, int],
    ranges: Mapping[int, tuple[int, int]],
) -> bool:
    """Whether, of the slots ``near`` (an output's bytes overlap theirs), each one a call
    reads before it writes it (``read_first``; ``first``: where each is first touched)
    has its bytes written before that through another of them (a view made at load of a
    tensor the call writes first, in memory the plan reuses): no bytes there carry a
    value from one call to the next. (An input is written first: the call binds it.)"""
    for j in near & read_first:
        if j not in ranges:
            return False  # an object a statement made, read before it makes it again
        lo, hi = ranges[j]
        if not any(
            t not in read_first
            and first[t] < first[j]
            and ranges[t][0] <= lo
            and hi <= ranges[t][1]
            for t in near
            if t in first and t in ranges
        ):
            return False
    return True


def _touches(
    values: tuple[p.EValue, ...], ins: p.Instruction, st: Statement
) -> tuple[frozenset[int], tuple[int, ...], tuple[int, ...]]:
    """What ``st`` takes from the table, what it writes (slots it assigns, memory it
    writes) and the slots it gives new objects: from what a kernel's or delegate's
    statement declares, else (it does not say, or another instruction) from
    :func:`~ptexec.effects.effects`."""
    if (
        st.reads is not None
        and st.mutates is not None
        and isinstance(ins, _DECLARING)
        and st.code.strip() != "pass"
    ):
        written = tuple(dict.fromkeys((*st.writes, *st.mutates, *st.outs)))
        mutated = set(st.mutates)
        return frozenset(st.reads), written, tuple(w for w in st.writes if w not in mutated)
    e = effects(values, ins, st)
    return frozenset((*e.inputs, *e.reads)), e.written, e.replaces


_DECLARING = (p.KernelCall, p.DelegateCall)  # instructions whose statements declare reads
_SCALARS = frozenset({int, float, bool, str})
_SEQUENCES = frozenset({list, tuple})


def _spans(state: MethodState) -> list[tuple[int, int, int]]:
    """(first byte's address, end, slot) of every tensor in the values table (a list's
    items too) with elements; the geometry of those made at load as
    :meth:`~ptexec.loader.state.MethodState.snapshot` took it."""
    geometry = {id(e[0]): (e[3], e[4]) for e in state.owned}
    out = []
    tensor = torch.Tensor
    for j, x in enumerate(state.values):
        if x is None or type(x) in _SCALARS:
            continue
        for item in x if type(x) in _SEQUENCES else (x,):
            if not isinstance(item, tensor):
                continue
            shape, stride = geometry.get(id(item)) or (tuple(item.shape), item.stride())
            if 0 in shape:
                continue
            span = 1
            for n, d in zip(shape, stride, strict=True):
                span += (n - 1) * abs(d)
            start = item.data_ptr()
            out.append((start, start + span * item.dtype.itemsize, j))
    return out


def _overlapping(spans: list[tuple[int, int, int]], t: torch.Tensor) -> set[int]:
    """The slots whose tensors' bytes (``spans``, :func:`_spans`) overlap dense ``t``'s."""
    lo = t.data_ptr()
    hi = lo + t.nbytes
    return {j for start, end, j in spans if start < hi and lo < end}


def _byte_copies(state: MethodState, statements: Sequence[Statement]) -> dict[int, Any]:
    """The statements (by position in the one straight-line chain) that copy one tensor
    of the table into another, which the fast call of a settled method (see
    :func:`_settling`) may run as a copy of bytes (``memmove``: about half of what
    ``Tensor.copy_`` costs a small tensor): the slots copied to and from, and how many
    bytes.

    Such a copy is between two tensors made at load, each held by its slot alone through
    every call (no statement gives the slot a new object, nor another slot the tensor:
    none that gives a slot an object reads either), neither an input nor an unplanned
    output, of one plain dtype and the same sizes, dense, in planned memory that never
    moves (their address ranges apart), and no later statement writes either of them.
    Once the method is settled every tensor made at load ends each call in its load-time
    geometry; what no statement after the copy touches has that geometry at the copy
    already, where ``copy_`` copies exactly those bytes."""
    chain = state.chains[0]
    values = state.plan.values
    table = state.values
    found: dict[int, Any] = {}
    pairs: dict[int, tuple[int, int]] = {}
    for k, st in enumerate(statements):
        m = _COPY.fullmatch(st.code)
        if m is not None:
            pairs[k] = (int(m.group(1)), int(m.group(2)))
            continue
        m = _RETURNED_COPY.fullmatch(st.code)
        if m is not None and st.env.get(m.group(2)) is torch._C.TensorBase.copy_:
            pairs[k] = (int(m.group(1)), int(m.group(3)))
    if not pairs:
        return found
    every = [
        effects(values, ins, st) for ins, st in zip(chain.instructions, statements, strict=True)
    ]
    bound = {spec.slot for spec in state.inputs}
    bound.update(o.slot for o in state.unplanned_outputs)
    replaced = {j for e in every for j in e.replaces}
    handing = {j for e in every if e.replaces for j in (*e.inputs, *e.reads)}
    owned = {id(t) for t, *_ in state.owned}
    for k, (d, s) in pairs.items():
        if d == s or {d, s} & (bound | replaced | handing):
            continue
        if any(d in e.written or s in e.written for e in every[k + 1 :]):
            continue
        dst, src = table[d], table[s]
        if not all(
            type(t) is torch.Tensor
            and id(t) in owned
            and sum(x is t for x in table) == 1
            and t.is_cpu
            and t.dtype in _RAW_DTYPES
            and t.is_contiguous()
            and not t.is_neg()
            and not t.is_conj()
            and t.data_ptr() != 0
            and not t.untyped_storage().resizable()
            for t in (dst, src)
        ):
            continue
        n = dst.nbytes
        if dst.dtype != src.dtype or dst.shape != src.shape or n == 0:
            continue
        a, b = dst.data_ptr(), src.data_ptr()
        if not (a + n <= b or b + n <= a):
            continue
        found[k] = (d, s, n)
    return found


# comparisons with a scalar (as a 0-d tensor of self's dtype, see
# :func:`ptexec.kernels.aten._scalar_as_tensor`), as Python compares two numbers
_COMPARED = {
    torch.gt: ">",
    torch.lt: "<",
    torch.ge: ">=",
    torch.le: "<=",
    torch.eq: "==",
    torch.ne: "!=",
}
_COMPARE = re.compile(r"(\w+)\(v\[(\d+)\], (\w+), out=v\[(\d+)\]\)")
# dtypes whose every value a Python number holds exactly (the 0-d scalar is of self's)
_EXACT_ITEMS = frozenset(
    {torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
)


def _kernel_calls(state: MethodState, runner: Runner) -> int | None:
    """For the plain blocks of one chain the fast call runs in its own lines: how many of
    its statements call a kernel or a delegate (not ``pass``, not a comparison a jump
    reads as numbers, :func:`_compared_jumps`), both branches of an if counted; None
    for another runner (every instruction counts)."""
    if not isinstance(runner, BlockRunner):
        return None
    chain = _forward_chain(runner)
    if inline_statements(state, runner) is not None:
        chain = state.chains[0]
    if chain is None:
        return None
    fused = _compared_jumps(state, chain, {})
    return sum(
        1
        for i, (ins, st) in enumerate(zip(chain.instructions, chain.statements, strict=True))
        if kind(ins) in ("kernel", "delegate") and st.code.strip() != "pass" and i not in fused
    )


def _compared_jumps(
    state: MethodState, chain: PreparedChain, env: dict[str, Any]
) -> dict[int, str]:
    """For the fast call's lines of a chain whose jumps go forward: a jump on whether a
    one-element tensor compares true with a scalar, just computed (``torch.gt(v[a], s,
    out=v[c])`` then ``bool(v[c])``), as the comparison of the two numbers (``v[a].item()
    > 0.0``), and the comparison's statement as nothing: by instruction, the code for
    each (the names it uses added to ``env``).

    The two compare alike: self's one element and the scalar (a 0-d tensor of self's
    dtype) are numbers a Python int or float holds exactly, and torch compares them in
    self's dtype, of which both are values. The result nobody else sees: ``v[c]`` is a
    one-element bool tensor in planned bytes that no other value of the plan shares,
    no input or output, and no statement of any chain but these two touches it; the
    jump does not start a block (nothing jumps to it), so the comparison runs right
    before it."""
    found: dict[int, str] = {}
    values = state.plan.values
    ins = chain.instructions
    targets = {j.destination_instruction for j in ins if isinstance(j, p.JumpFalseCall)}
    if not targets:
        return found  # no jumps
    slots = {spec.slot for spec in state.inputs} | {o.slot for o in state.outputs}
    touched: dict[int, set[tuple[int, int]]] = {}  # value -> (chain, instruction) using it
    for ch in state.chains:
        for i, (instruction, st) in enumerate(zip(ch.instructions, ch.statements, strict=True)):
            e = effects(values, instruction, st)
            for j in (*e.reads, *e.writes, *e.replaces, *e.written, *e.inputs):
                touched.setdefault(j, set()).add((ch.index, i))
    for i, jump in enumerate(ins):
        if not isinstance(jump, p.JumpFalseCall) or i == 0 or i in targets:
            continue
        c = jump.cond_value_index
        if chain.statements[i].code != f"bool(v[{c}])" or isinstance(ins[i - 1], p.JumpFalseCall):
            continue
        before = chain.statements[i - 1]
        m = _COMPARE.fullmatch(before.code)
        if m is None or int(m.group(4)) != c:
            continue
        op, scalar = before.env.get(m.group(1)), before.env.get(m.group(3))
        a = int(m.group(2))
        sign = _COMPARED.get(op) if op is not None else None
        self_, out = values[a], values[c]
        if (
            sign is None
            or not isinstance(scalar, torch.Tensor)
            or scalar.dim() != 0
            or not isinstance(self_, p.Tensor)
            or not isinstance(out, p.Tensor)
            or self_.numel != 1
            or out.numel != 1
            or self_.shape_dynamism != p.STATIC
            or out.shape_dynamism != p.STATIC
            or out.scalar_type != DTYPE_TO_CODE[torch.bool]
            or DTYPE_TO_CODE.get(scalar.dtype) != self_.scalar_type
            or scalar.dtype not in _EXACT_ITEMS
            or c in slots
            or touched.get(c, set()) != {(chain.index, i - 1), (chain.index, i)}
        ):
            continue
        where = byte_range(out)
        if where is None or any(
            k != c
            and (r := byte_range(v)) is not None
            and r[0] == where[0]
            and r[1] < where[2]
            and where[1] < r[2]
            for k, v in enumerate(values)
        ):
            continue
        name = f"_jc{i}"
        env[name] = scalar.item()
        found[i - 1] = "pass"
        found[i] = f"v[{a}].item() {sign} {name}"
    return found


def _emptying_test(
    state: MethodState,
    runner: Runner,
    resized: Sequence[int],
    made_new: Mapping[int, int] = types.MappingProxyType({}),
) -> str | None:
    """The test, on the fast call's names, that the statements must empty their
    ``empties`` this call; None when the fast call cannot tell (they always do). False
    means every dynamic-shape tensor the instructions write already has the sizes this
    call gives it, which torch leaves as they are.

    It is false when every dynamic input (``resized``: each copied into its planned view,
    resized first where its sizes differ, ``e{i}``) has the sizes its view already had, and
    not every one has the sizes loading gave its view. Every call's binding, on any path,
    resizes a planned input's view to the input, and a failed call gives every tensor made
    at load its load-time geometry back: views not all as loading made them hold the sizes
    of the last run that completed. That run computed every other tensor's sizes from its
    inputs' sizes alone, the same as this call's, when the method takes no values but
    tensors and every instruction of its one straight-line chain is a move, a free, or a
    kernel or delegate call whose statement is ``sized`` (what it makes follows from its
    arguments' sizes and values, not from tensors' contents). None too when no statement
    empties anything (the statements ``made_new`` runs in their fresh form empty nothing:
    :func:`_fresh_returns`)."""
    if not resized or not _sized_chain(state, runner):
        return None
    statements = state.chains[0].statements
    if not any(st.empties for k, st in enumerate(statements) if k not in made_new):
        return None  # nothing to empty: no test to make
    loaded = {id(t): tuple(sizes) for t, _, _, sizes, _ in state.owned}
    initial = []  # every view as loading made it
    for i in resized:
        sizes = loaded.get(id(state.inputs[i].view))
        if sizes is None:
            return None
        initial.append(f"x{i}s == {tuple(int(n) for n in sizes)!r}")
    return " or ".join([*(f"e{i}" for i in resized), f"({' and '.join(initial)})"])


def _sized_chain(state: MethodState, runner: Runner) -> bool:
    """The method takes no values but tensors, and ``runner`` is the plain blocks of one
    straight-line chain, every instruction of which is a move, a free, or a kernel or a
    delegate call whose statement is ``sized``: every size (and every scalar) a call
    computes follows from the sizes (and values) it reads, never from tensors' contents."""
    if not isinstance(runner, BlockRunner) or not runner.straight_line:
        return False
    if any(spec.kind != "tensor" for spec in state.inputs):
        return False  # a value may size a result
    chain = state.chains[0]
    for ins, st in zip(chain.instructions, chain.statements, strict=True):
        what = kind(ins)
        if what in ("move", "free") or st.code.strip() == "pass":
            continue
        if what not in ("kernel", "delegate") or not st.sized:
            return False
    return True


def _settling(state: MethodState, runner: Runner) -> bool:
    """Whether the fast call may stop checking its outputs once a call finds the method
    settled (:func:`_settled_test`); the caller is handed copies alone.

    A call of such a method computes every size, dtype and scalar from those its table
    holds when it starts and from its inputs' sizes (:func:`_sized_chain`), which are
    the program's, every input being static. A call whose outputs passed their checks
    and that left the table's geometry (:func:`_geometry`) as it found it, with every
    tensor made at load in its load-time geometry, is settled: the next call, on any
    path, starts from that same geometry and computes the same sizes, and so does every
    call after it. A failed call changes nothing of it: the tensors made at load get
    their geometry back, and a kernel of a settled method sets no other sizes than
    those it finds. So the outputs' checks, which only a call's sizes and dtypes
    decide, pass on every later call, and the fast call skips them."""
    if not _sized_chain(state, runner):
        return False
    return all(spec.info is not None and spec.info.dynamism == "static" for spec in state.inputs)


def _geometry(values: Sequence[Any]) -> list[Any]:
    """What the sizes a call computes may follow from, per slot of the values table: a
    tensor's type, dtype and sizes, a list's items' so, a plain scalar's value, another
    object's identity."""
    return [_shape_of(x) for x in values]


def _shape_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (type(x), x.dtype, tuple(x.shape))
    if isinstance(x, list | tuple):
        return (type(x), tuple(_shape_of(y) for y in x))
    if x is None or type(x) in (bool, int, float, str):
        return (type(x), x)
    return (type(x), id(x))


def _settled_test(state: MethodState) -> Any:
    """``settled(v, before)``: the table's geometry is ``before`` (:func:`_geometry`, taken
    when the call started) and every tensor made at load has its load-time geometry."""
    owned = state.owned  # (never replaced once loading ends: MethodState.snapshot)

    def settled(v: Sequence[Any], before: list[Any]) -> bool:
        if _geometry(v) != before:
            return False
        return all(
            tuple(t.shape) == sizes and t.stride() == strides and t.storage_offset() == offset
            for t, _, offset, sizes, strides in owned
        )

    return settled


def _replaced(state: MethodState, runner: Runner) -> frozenset[int] | None:
    """The slots an instruction of the plain blocks may give a new object (their
    statements' effects), or None (every slot) for another runner."""
    if not isinstance(runner, BlockRunner):
        return None
    values = state.plan.values
    return frozenset(
        k
        for chain in state.chains
        for ins, st in zip(chain.instructions, chain.statements, strict=True)
        for k in replaced(values, ins, st)
    )


def _forward_chain(runner: Runner) -> PreparedChain | None:
    """The runner's one chain whose jumps all go forward, with what each instruction runs
    (a compiled region's code in its first instruction's place), or None."""
    chain: PreparedChain | None = getattr(runner, "forward_chain", None)
    return chain


def runs_inline(state: MethodState, runner: Runner) -> bool:
    """The fast call runs the instructions of chain 0 in its own lines (no call of the
    runner)."""
    return inline_statements(state, runner) is not None or _forward_chain(runner) is not None


def inline_statements(state: MethodState, runner: Runner) -> Sequence[Statement] | None:
    """The statements to inline for ``runner``: the plain blocks' one straight-line chain,
    or what a runner offers as its ``inline()`` (the compiled tier's chain, each region
    one call); None: call its ``run``."""
    if isinstance(runner, BlockRunner):
        return state.chains[0].statements if runner.straight_line else None
    offer = getattr(runner, "inline", None)
    return offer() if offer is not None else None
