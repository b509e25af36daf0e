"""The torch overload that computes an ATen instruction without writing memory.

The interpreter runs an ATen out variant by writing into the planned ``out`` tensor
(``add.out``); a traced program needs the same computation as a function of values. This
module finds that function in torch's operator tables (``add.out`` -> ``add.Tensor``, the
functional form of an in-place op, the view a ``*_copy`` op copies) and calls it with
arguments as a program stores them (a dtype, memory format or layout as its code).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import torch

from ..dtypes import LAYOUTS, MEMORY_FORMATS
from ..kernels.aten import resolve_overload
from ..kernels.fixed_args import to_dtype

__all__ = ["call_overload", "functional_overload", "view_overload", "writes"]


def writes(arg: Any) -> bool:
    """Whether schema argument ``arg`` is written by the op (``Tensor(a!)``)."""
    return arg.alias_info is not None and arg.alias_info.is_write


_FACTORY_KWARGS = frozenset({"dtype", "layout", "device", "pin_memory", "memory_format"})


@cache
def functional_overload(qualified_name: str) -> tuple[Any, str] | None:
    """``(overload, kind)`` computing ``qualified_name`` without writing memory: kind
    ``"out"`` (a functional overload for an out variant), ``"inplace"`` (the functional
    form of an in-place op), ``"functional"`` (the op itself writes nothing); None when
    torch has no such overload."""
    overload = resolve_overload(qualified_name)
    if overload is None:
        return None
    schema = overload._schema
    written = [a for a in schema.arguments if writes(a)]
    if not written:
        return overload, "functional"
    ns, name = schema.name.split("::", 1)
    if all(a.kwarg_only for a in written):
        wanted = [(a.name, str(a.type), a.kwarg_only) for a in schema.arguments if not writes(a)]
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is None:
            return None
        best: tuple[int, Any] | None = None
        for overload_name in packet.overloads():
            candidate = getattr(packet, overload_name)
            cs = candidate._schema
            if any(writes(a) for a in cs.arguments):
                continue
            have = [(a.name, str(a.type), a.kwarg_only) for a in cs.arguments]
            extra = [a for a in cs.arguments if (a.name, str(a.type), a.kwarg_only) not in wanted]
            if [h for h in have if h in wanted] != wanted:
                continue
            if any(not (a.kwarg_only and a.name in _FACTORY_KWARGS) for a in extra):
                continue
            outs = [a for a in schema.arguments if writes(a)]
            if len(cs.returns) != len(outs) and not (
                len(outs) == 1 and "[]" in str(outs[0].type) and len(cs.returns) == 1
            ):
                continue
            if best is None or len(extra) < best[0]:
                best = (len(extra), candidate)
        return (best[1], "out") if best is not None else None
    if name.endswith("_") and all(not a.kwarg_only for a in written):
        packet = getattr(getattr(torch.ops, ns), name[:-1], None)
        if packet is None:
            return None
        plain = [(a.name, str(a.type).replace("(a!)", "")) for a in schema.arguments]
        for overload_name in packet.overloads():
            candidate = getattr(packet, overload_name)
            cs = candidate._schema
            if any(writes(a) for a in cs.arguments):
                continue
            if [(a.name, str(a.type)) for a in cs.arguments] == plain:
                return candidate, "inplace"
    return None


_RESHAPES = frozenset({"aten::view_copy", "aten::_unsafe_view"})


@cache
def view_overload(functional: Any) -> Any:
    """The view op a functional ``*_copy`` op copies (``permute_copy.default`` ->
    ``permute.default``; ``view_copy`` -> ``reshape``), or None. In a functional graph the
    two compute the same values, and the view lets the compiler read the source in place
    (a transposed weight, say) instead of materializing a copy."""
    schema = functional._schema
    ns, name = schema.name.split("::", 1)
    if schema.name in _RESHAPES:
        return torch.ops.aten.reshape.default
    if not name.endswith("_copy"):
        return None
    packet = getattr(getattr(torch.ops, ns), name[: -len("_copy")], None)
    if packet is None:
        return None
    overload = getattr(packet, schema.overload_name or "default", None)
    if overload is None:
        return None
    want = [(a.name, str(a.type)) for a in schema.arguments]
    have = [(a.name, str(a.type).replace("(a)", "")) for a in overload._schema.arguments]
    return overload if have == want else None


def _type_name(arg: Any) -> str:
    return str(getattr(arg, "real_type", arg.type))


def _as_torch(arg: Any, x: Any) -> Any:
    """Argument value ``x`` as torch's Python binding takes it: a program stores a dtype, a
    memory format and a layout as integer codes (ExecuTorch's codes are torch's)."""
    if not isinstance(x, int) or isinstance(x, bool):
        return x
    kind = _type_name(arg)
    if "ScalarType" in kind:
        return to_dtype(x)
    if "MemoryFormat" in kind:
        return MEMORY_FORMATS.get(x, torch.preserve_format)
    if "Layout" in kind:
        return LAYOUTS.get(x, torch.strided)
    return x


def call_overload(
    overload: Any,
    arguments: Sequence[Any],
    values: Sequence[Any],
    extra: dict[str, Any] | None = None,
) -> Any:
    """``overload`` called with ``values`` for its schema ``arguments`` (keyword-only ones
    by name) and the keywords ``extra``."""
    pos: list[Any] = []
    kw: dict[str, Any] = dict(extra or {})
    for a, x in zip(arguments, values, strict=True):
        x = _as_torch(a, x)
        if a.kwarg_only:
            kw[a.name] = x
        else:
            pos.append(x)
    return overload(*pos, **kw)
