"""An XNNPACK or Vulkan delegate call as traced torch code.

The delegate's payload is compiled to torch code (:mod:`ptexec.delegates.xnnpack.runtime`,
:mod:`ptexec.delegates.vulkan.runtime`; ``traced=True``), which is traced like every other instruction, so that fusion crosses the
delegate's boundary (a delegate run by ExecuTorch's XNNPACK backend is an opaque call
instead, :mod:`.external`; its torch code then only gives dynamic outputs their traced
shapes). That code writes its outputs into tensors it is given; traced, each
output is a :class:`_Sink` that keeps what the code writes, in the output's logical dims.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..delegates.vulkan.backend import runner_for as vulkan_runner_for
from ..delegates.xnnpack.runtime import ArgInfo, build_runner
from ..delegates.xnnpack.schema import decode_payload
from ..dtypes import CODE_TO_DTYPE
from ..format import program as p
from .env import Env, NoFunctionalForm

if TYPE_CHECKING:
    from ..program import Program

__all__ = ["DelegateCode"]


class _Sink:
    """Stands for a delegate output while its torch code is traced: the code resizes the
    output and copies its result into it (through a permutation for a layout other than
    the identity); the sink keeps the result, in the output's logical dims."""

    def __init__(self, order: tuple[int, ...] = (), parent: _Sink | None = None) -> None:
        self.order = order
        self.parent = parent
        self.value: torch.Tensor | None = None

    @property
    def shape(self) -> _Sink:
        return self  # compares unequal to any shape: the code then "resizes" its output

    def __ne__(self, other: object) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__

    def permute(self, *order: Any) -> _Sink:
        dims = tuple(order[0]) if len(order) == 1 and isinstance(order[0], Sequence) else order
        return _Sink(tuple(int(d) for d in dims), self)

    def as_strided_(self, *args: Any) -> _Sink:
        return self

    def resize_(self, *args: Any) -> _Sink:
        return self

    def dim(self) -> int:
        raise NoFunctionalForm("the delegate's code reads one of its outputs")

    def copy_(self, src: torch.Tensor) -> _Sink:
        if self.parent is None:
            self.value = src
        else:  # src is the output permuted by ``order``: undo it
            inverse = [0] * len(self.order)
            for j, d in enumerate(self.order):
                inverse[d] = j
            self.parent.value = src.permute(inverse)
        return self


def _arg_infos(plan: p.ExecutionPlan, args: tuple[int, ...]) -> list[ArgInfo | None]:
    infos: list[ArgInfo | None] = []
    for slot in args:
        value = plan.values[slot]
        if isinstance(value, p.Tensor) and value.scalar_type in CODE_TO_DTYPE:
            infos.append(ArgInfo(CODE_TO_DTYPE[value.scalar_type], tuple(value.dim_order)))
        else:
            infos.append(None)
    return infos


class DelegateCode:
    """The torch code of one XNNPACK or Vulkan delegate call, and which of its arguments are
    external values (``ext_ids``) and outputs (``out_ids``)."""

    def __init__(self, fn: Callable[..., None], ext_ids: tuple[int, ...], out_ids: tuple[int, ...]):
        self.fn = fn
        self.ext_ids = ext_ids
        self.out_ids = out_ids

    @classmethod
    def build(
        cls,
        plan: p.ExecutionPlan,
        program: Program,
        ins: p.DelegateCall,
        device: torch.device,
    ) -> DelegateCode:
        """The code of delegate call ``ins`` (decodes its payload, loads its weights)."""
        delegate = plan.delegates[ins.delegate_index]
        where = f"{plan.name}.delegates[{ins.delegate_index}]"
        data = program.pte.delegate_data(delegate.processed)
        if delegate.id == "VulkanBackend":
            vk = vulkan_runner_for(
                data, program.named_data, plan.values, ins.args, where, device, traced=True
            )
            return cls(vk.fn, vk.ext_ids, vk.output_ids)
        payload = decode_payload(data, f"{where}.payload")
        runner = build_runner(
            payload, program.named_data, _arg_infos(plan, ins.args), device, traced=True
        )
        return cls(runner.fn, runner.ext_ids, runner.output_ids)

    def outputs(self, args: Callable[[int], Any]) -> dict[int, torch.Tensor]:
        """Run the code on the call's arguments (``args(k)``: argument ``k``); its
        outputs, by argument position."""
        sinks: dict[int, _Sink] = {}
        call: list[Any] = []
        for k in self.ext_ids:
            if k in self.out_ids:
                sinks[k] = _Sink()
                call.append(sinks[k])
            else:
                call.append(args(k))
        self.fn(*call)
        out: dict[int, torch.Tensor] = {}
        for k, sink in sinks.items():
            if sink.value is None:
                raise NoFunctionalForm(f"delegate output {k} was not written")
            out[k] = sink.value
        return out

    def run(
        self, env: Env, ins: p.DelegateCall, cast: Callable[[torch.Tensor, int], torch.Tensor]
    ) -> None:
        """Run the code on ``env``'s values; each output replaces its value (as ``cast``
        makes it: the dtype of the value it replaces)."""
        for k, value in self.outputs(lambda k: env[ins.args[k]]).items():
            slot = ins.args[k]
            env[slot] = cast(value, slot)
