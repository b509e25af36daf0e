"""Any ATen operator through ``torch.ops``, with arguments mapped by the op's schema.

The emitter writes a KernelCall's ``args`` as every schema argument in order (positional,
then keyword-only, ``out`` included), then the return value(s). For an out variant the
returns are the ``out`` arguments again (several outs: one TensorList), so they are
ignored; for a functional op the statement assigns the result to the return slot(s).

Arguments whose literal value equals the schema default are left out of the call: torch
then skips converting them, which is measurably faster for Scalars.
"""

from __future__ import annotations

from typing import Any

import torch

from ..format import program as p
from .registry import Emission, KernelContext, KernelFactory, UnsupportedKernel, register_namespace

__all__ = ["resolve_overload", "schema_kernel"]


def resolve_overload(qualified_name: str) -> Any:
    """``'ns::op.overload'`` -> the ``torch.ops`` OpOverload, or None when torch has none."""
    ns, _, rest = qualified_name.partition("::")
    opname, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), opname)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None


_MISSING = object()


def _default(arg: Any) -> Any:
    if not arg.has_default_value():
        return _MISSING
    return arg.default_value


def _same(a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return False
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def schema_kernel(overload: Any) -> KernelFactory:
    """A factory calling ``overload`` (an OpOverload) with schema-mapped arguments."""
    schema = overload._schema
    arguments = list(schema.arguments)
    returns = list(schema.returns)
    call = getattr(overload, "_op", overload)
    is_out = any(
        a.alias_info is not None and a.alias_info.is_write and a.kwarg_only for a in arguments
    )
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name

    def factory(ctx: KernelContext) -> Emission:
        nargs = len(arguments)
        args = ctx.args
        extra = len(args) - nargs
        if extra < 0 or extra > max(len(returns), 1):
            raise UnsupportedKernel(
                f"{name}: the program passes {len(args)} values, the schema of the installed "
                f"torch has {nargs} arguments and {len(returns)} returns"
            )
        fn = ctx.bind(call, "op")
        positional: list[str] = []
        keywords: list[str] = []
        pending: list[str] = []  # positional defaults held back until a later arg needs them
        for arg, index in zip(arguments, args, strict=False):
            value = ctx.values[index]
            default = _default(arg)
            literal = ctx.is_literal(index)
            if literal and not isinstance(value, p.Tensor | p.TensorList | p.OptionalTensorList):
                lit = None if isinstance(value, p.Null) else ctx.literal(index)
                skip = _same(lit, default) or (
                    lit is None and default is None and arg.has_default_value()
                )
            else:
                skip = False
            text = ctx.expr(index)
            if isinstance(value, p.IntList) and literal:
                text = repr(list(ctx.literal(index)))
            if arg.kwarg_only:
                if not skip:
                    keywords.append(f"{arg.name}={text}")
            elif skip:
                pending.append(text)
            else:
                positional.extend(pending)
                pending.clear()
                positional.append(text)
        callargs = ", ".join(positional + keywords)
        ret_slots = args[nargs:]
        if is_out or not returns or not ret_slots:
            return ctx.emit(f"{fn}({callargs})")
        if len(returns) == 1:
            slot = ret_slots[0]
            if isinstance(ctx.values[slot], p.TensorList):
                raise UnsupportedKernel(f"{name}: a list return is not supported")
            return ctx.emit(f"v[{slot}] = {fn}({callargs})", writes=(slot,))
        # several returns into one TensorList of slots
        slot = ret_slots[0]
        value = ctx.values[slot]
        if not isinstance(value, p.TensorList) or len(value.items) != len(returns):
            raise UnsupportedKernel(f"{name}: cannot map {len(returns)} returns to value {slot}")
        targets = ", ".join(f"v[{i}]" for i in value.items)
        return ctx.emit(f"{targets}, = {fn}({callargs})", writes=value.items)

    return factory


_CACHE: dict[str, KernelFactory | None] = {}


def _resolve(qualified_name: str) -> KernelFactory | None:
    if qualified_name not in _CACHE:
        overload = resolve_overload(qualified_name)
        _CACHE[qualified_name] = None if overload is None else schema_kernel(overload)
    return _CACHE[qualified_name]


register_namespace("aten", _resolve)
