"""Every instruction of a plan as one prepared statement (an :class:`Statement`).

Kernel calls go to the factory the kernel registry finds for their operator, delegate
calls to their backend's factory; moves, frees and jumps are written here. Operators with
no kernel are collected, so that loading reports all of them at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..accounting import CallRecord
from ..delegates import DelegateContext, find_backend, registered_backends
from ..device import Device
from ..errors import BackendUnavailableError, PteFormatError
from ..format import program as p
from ..kernels.registry import KernelContext, Statement, UnsupportedKernel, find_kernel

if TYPE_CHECKING:
    from ..program import Program

__all__ = ["InstructionPreparer", "truth"]


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
        )

    def prepare(self, ins: p.Instruction, i: int, c: int) -> tuple[str, Statement]:
        """(name, statement) of instruction ``i`` of chain ``c``."""
        plan = self.plan
        where = f"{self.path}.chains[{c}].instructions[{i}]"
        if isinstance(ins, p.KernelCall):
            name = plan.operators[ins.op_index].qualified_name
            factory = find_kernel(name)
            if factory is None:
                self.missing.append(name)
                return name, Statement("pass")
            ctx = self._context(
                KernelContext, op_name=name, instruction=i, args=ins.args, where=where
            )
            try:
                return name, factory(ctx)
            except UnsupportedKernel as e:
                self.missing.append(f"{name} ({e})")
                return name, Statement("pass")
        if isinstance(ins, p.DelegateCall):
            delegate = plan.delegates[ins.delegate_index]
            backend = find_backend(delegate.id)
            if backend is None:
                raise BackendUnavailableError(
                    f"method '{plan.name}' delegates to backend '{delegate.id}', which ptexec "
                    f"cannot run (available: {', '.join(registered_backends()) or 'none'})"
                )
            dctx = self._context(
                DelegateContext,
                backend_id=delegate.id,
                delegate_index=ins.delegate_index,
                processed=self.program.pte.delegate_data(delegate.processed),
                compile_specs=delegate.compile_specs,
                named_data=self.program.named_data,
                instruction=i,
                args=ins.args,
                where=where,
            )
            try:
                return f"delegate:{delegate.id}", backend(dctx)
            except UnsupportedKernel as e:
                raise BackendUnavailableError(f"backend '{delegate.id}': {e}") from None
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
