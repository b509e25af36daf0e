"""What a method takes and returns, described from its execution plan alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dtypes import CODE_TO_DTYPE
from ..format import program as p
from ..format.lru import Key, Lru
from ..memory import BufferInfo
from ..tensor import TensorInfo, dim_order_strides
from .devices import DeviceMap, buffer_infos

__all__ = [
    "MethodMeta",
    "ScalarInfo",
    "ValueInfo",
    "clear_metas",
    "plan_meta",
    "scalar_kind",
    "tensor_info",
]

_DYNAMISM = {
    p.STATIC: "static",
    p.DYNAMIC_BOUND: "dynamic_bound",
    p.DYNAMIC_UNBOUND: "dynamic_unbound",
}


@dataclass(frozen=True, slots=True)
class ScalarInfo:
    """A non-tensor input or output: its kind (``int``, ``float``, ``bool``, ``str``,
    ``none``) and the value the program was traced with."""

    kind: str
    value: Any

    @property
    def device(self) -> None:
        return None

    def __str__(self) -> str:
        return f"{self.kind} = {self.value!r}" if self.kind != "none" else "None"


ValueInfo = TensorInfo | ScalarInfo


@dataclass(frozen=True)
class MethodMeta:
    """What a method takes and returns, and its memory plan."""

    name: str
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    buffers: tuple[BufferInfo, ...]
    operators: tuple[str, ...]
    delegates: tuple[str, ...]
    num_instructions: int

    @property
    def planned_bytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def num_inputs(self) -> int:
        return len(self.inputs)

    def num_outputs(self) -> int:
        return len(self.outputs)


def scalar_kind(value: p.EValue) -> str:
    """``int``, ``float``, ``bool``, ``str`` or ``none`` for a scalar value, else its kind."""
    if isinstance(value, p.Int):
        return "int"
    if isinstance(value, p.Double):
        return "float"
    if isinstance(value, p.Bool):
        return "bool"
    if isinstance(value, p.String):
        return "str"
    if isinstance(value, p.Null):
        return "none"
    return p.evalue_kind(value)


def tensor_info(t: p.Tensor, dmap: DeviceMap) -> TensorInfo:
    """The :class:`TensorInfo` of a program tensor, on its (mapped) device."""
    return TensorInfo(
        sizes=t.sizes,
        dtype=CODE_TO_DTYPE[t.scalar_type],
        dim_order=t.dim_order,
        device=dmap.label(t),
        strides=dim_order_strides(t.sizes, t.dim_order),
        is_memory_planned=t.is_memory_planned,
        dynamism=_DYNAMISM[t.shape_dynamism],
    )


def _value_info(plan: p.ExecutionPlan, slot: int, dmap: DeviceMap) -> ValueInfo:
    value = plan.values[slot]
    if isinstance(value, p.Tensor):
        return tensor_info(value, dmap)
    return ScalarInfo(scalar_kind(value), getattr(value, "value", None))


# descriptions, by the decoded plan (shared by the loads of the same bytes), the device
# map, the shared buffers and the plan's path: frozen, so the loads of one plan share one
_metas: Lru[tuple[p.ExecutionPlan, MethodMeta]] = Lru(256, 0)


def clear_metas() -> None:
    """Forget the kept descriptions."""
    _metas.clear()


def plan_meta(
    plan: p.ExecutionPlan,
    dmap: DeviceMap,
    shared: frozenset[int] = frozenset(),
    path: str = "execution_plan[0]",
) -> MethodMeta:
    """A method's :class:`MethodMeta` from its plan (nothing is allocated); ``shared``: the
    buffers that hold the program's shared state."""
    key = Key(id(plan), dmap.key, shared, path)
    hit = _metas.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    meta = _plan_meta(plan, dmap, shared, path)
    _metas.put(key, (plan, meta))  # the plan kept alive: its id stays its own
    return meta


def _plan_meta(
    plan: p.ExecutionPlan, dmap: DeviceMap, shared: frozenset[int], path: str
) -> MethodMeta:
    return MethodMeta(
        name=plan.name,
        inputs=tuple(_value_info(plan, s, dmap) for s in plan.inputs),
        outputs=tuple(_value_info(plan, s, dmap) for s in plan.outputs),
        buffers=tuple(buffer_infos(plan, dmap, shared, path)),
        operators=tuple(op.qualified_name for op in plan.operators),
        delegates=tuple(d.id for d in plan.delegates),
        num_instructions=sum(len(c.instructions) for c in plan.chains),
    )
