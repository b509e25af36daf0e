"""Loading a method: from its execution plan to a :class:`~.state.MethodState`.

:func:`load_state` does all the work a method needs once: places and allocates its
planned buffers (:mod:`.devices`), builds its values table (:mod:`.values`), describes its
inputs and outputs (:mod:`.specs`), prepares every instruction as a statement
(:mod:`.instructions`) and, with ``optimize``, rewrites what the plan proves safe
(:mod:`.dataflow`).
Nothing here runs a call; nothing here knows :class:`ptexec.Method`.
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import kernels as _kernels  # noqa: F401  (registers the kernels)
from ..accounting import CallRecord
from ..codegen import Sources
from ..effects import Effects, dynamic_scalars
from ..errors import LimitExceededError, OperatorMissingError, PteFormatError
from ..format import program as p
from ..format.lru import Key
from ..memory import BufferInfo, PlannedBuffer, allocate
from .capacity import guard_capacity
from .dataflow import rewrite_chain
from .devices import (
    DeviceMap,
    DeviceMapSpec,
    buffer_infos,
    check_device_available,
    value_devices,
)
from .instructions import InstructionPreparer
from .meta import MethodMeta, ScalarInfo, plan_meta, scalar_kind, tensor_info
from .specs import io_specs
from .state import MethodState, PreparedChain
from .values import build_values

if TYPE_CHECKING:
    from ..program import Program

__all__ = [
    "DEFAULT_MAX_INSTRUCTIONS",
    "DEFAULT_MAX_PLANNED_BYTES",
    "FOLD_LIMIT",
    "DeviceMap",
    "DeviceMapSpec",
    "LoadOptions",
    "MethodMeta",
    "ScalarInfo",
    "load_state",
    "method_meta",
    "scalar_kind",
    "tensor_info",
]

DEFAULT_MAX_INSTRUCTIONS = 10_000_000
DEFAULT_MAX_PLANNED_BYTES = 16 << 30  # 16 GiB
FOLD_LIMIT = 16 << 20  # bytes of results a method may precompute at load


@dataclass(frozen=True)
class LoadOptions:
    """What loading takes from ``load_method``'s options (see :class:`ptexec.Method`)."""

    device_map: DeviceMapSpec = None
    max_planned_bytes: int = DEFAULT_MAX_PLANNED_BYTES
    max_instructions: int = DEFAULT_MAX_INSTRUCTIONS
    optimize: bool = True
    backend_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_planned_bytes", "max_instructions"):
            limit = getattr(self, name)
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"{name} must be a positive int, not {limit!r}")


def _path(program: Program, plan: p.ExecutionPlan) -> str:
    return f"execution_plan[{program.pte.program.execution_plan.index(plan)}]"


def method_meta(program: Program, plan: p.ExecutionPlan, device_map: DeviceMapSpec) -> MethodMeta:
    """A method's :class:`MethodMeta` without loading it (no memory is allocated)."""
    return plan_meta(
        plan, DeviceMap(device_map), program.shared_buffer_indices, _path(program, plan)
    )


def _allocate(
    program: Program, name: str, infos: list[BufferInfo], limit: int
) -> tuple[list[PlannedBuffer], set[int]]:
    total = sum(i.size for i in infos)  # shared state counts too: it may be new
    if total > limit:
        raise LimitExceededError(
            f"method '{name}' plans {total} bytes, over max_planned_bytes={limit}; pass a "
            "larger max_planned_bytes to load it"
        )
    for info in infos:
        check_device_available(info.device, name, f"planned buffer {info.index}, {info.size} bytes")
    buffers = []
    fresh: set[int] = set()
    for info in infos:
        if info.shared:
            buf, new = program.shared_buffer(info)
            if new:
                fresh.add(info.index)
        else:
            buf = allocate(info)
            fresh.add(info.index)
        buffers.append(buf)
    return buffers, fresh


def load_state(program: Program, plan_index: int, options: LoadOptions) -> MethodState:
    """Load method ``plan_index`` of ``program`` (see the module docstring)."""
    plan = program.pte.program.execution_plan[plan_index]
    path = f"execution_plan[{plan_index}]"
    dmap = DeviceMap(options.device_map)
    shared = program.shared_buffer_indices
    infos = buffer_infos(plan, dmap, shared, path)
    buffers, fresh = _allocate(program, plan.name, infos, options.max_planned_bytes)
    values, made = build_values(
        program, plan, path, dmap, buffers, fresh, options.max_planned_bytes
    )
    inputs, outputs = io_specs(plan, path, values, dmap)
    record = CallRecord(len(plan.inputs), len(plan.outputs))
    dynamic = dynamic_scalars(plan)
    preparer = InstructionPreparer(
        program,
        plan,
        path,
        values,
        dynamic,
        value_devices(plan, dmap),
        record,
        options.backend_options,
    )
    chains: list[PreparedChain] = []
    written: set[int] = set()
    # what the load-time rewrites replace in the table is computed from constants alone
    before_rewrites = list(values) if options.optimize else values
    for c, chain in enumerate(plan.chains):
        names, loaded, known = preparer.prepare_chain(c)
        if known is None:
            continue
        loaded = guard_capacity(plan, c, loaded)
        statements = loaded
        written.update(itertools.chain.from_iterable(e.writes for e in known))
        _refuse_written_constants(plan, c, known, path)
        if options.optimize:
            statements = rewrite_chain(plan, chain, loaded, names, values, FOLD_LIMIT, known)
        chains.append(
            PreparedChain(
                c,
                chain.instructions,
                tuple(names),
                tuple(statements),
                tuple(loaded),
                chain.stacktrace,
                chain.jumps,
            )
        )
    if preparer.missing:
        missing = preparer.missing
        raise OperatorMissingError(plan.name, sorted(set(missing), key=missing.index))
    for spec in inputs:
        spec.written = spec.slot in written
    state = MethodState(
        name=plan.name,
        plan=plan,
        path=path,
        values=values,
        buffers=buffers,
        inputs=inputs,
        outputs=outputs,
        chains=chains,
        dynamic_scalars=dynamic,
        meta=plan_meta(plan, dmap, shared, path),
        max_instructions=options.max_instructions,
        record=record,
        sources=Sources(plan.name),
        fixed_slots=tuple(
            itertools.compress(range(len(values)), map(operator.is_not, values, before_rewrites))
        ),
    )
    state.key = _state_key(plan, plan_index, dmap, shared, options)
    # ``made`` holds every tensor the table was made with (build_values), and what
    # replaced one since is in a slot compared with ``before_rewrites``
    replaced = {k: before_rewrites[k] for k in state.fixed_slots} if options.optimize else None
    state.snapshot(made, replaced)
    if preparer.unloaded:
        done = weakref.finalize(state, _run_each, tuple(preparer.unloaded))
        done.atexit = False  # (a process ending frees everything anyway)
    return state


def _run_each(callbacks: tuple[Callable[[], None], ...]) -> None:
    for callback in callbacks:
        callback()


def _refuse_written_constants(
    plan: p.ExecutionPlan, c: int, known: list[Effects], path: str
) -> None:
    """A delegate call whose prepared statement writes a constant of the program (its
    payload maps an output to one) is refused: constants are read-only memory, which
    ptexec may share with the caller's ``bytes`` (:func:`ptexec.effects.constants_written`
    covers kernels and moves)."""
    values = plan.values
    chain = plan.chains[c]
    for i in chain.delegates:
        for w in known[i].writes:
            v = values[w]
            if isinstance(v, p.Tensor) and v.is_constant:
                raise PteFormatError(
                    f"{path}.chains[{c}].instructions[{i}]",
                    f"delegate call writes value {w}, a constant of the program "
                    "(expected a planned or unplanned tensor: constants are read-only)",
                )


def _state_key(
    plan: p.ExecutionPlan,
    plan_index: int,
    dmap: DeviceMap,
    shared: frozenset[int],
    options: LoadOptions,
) -> Key | None:
    """What a loaded state is a function of (with the program's bytes, which the decoded
    plan stands for: it is shared by the loads of the same bytes); None when an option
    cannot be part of a key."""
    try:
        backend = tuple(sorted(options.backend_options.items()))
        return Key(
            id(plan),
            plan_index,
            dmap.key,
            shared,
            options.max_planned_bytes,
            options.max_instructions,
            options.optimize,
            backend,
        )
    except TypeError:
        return None
