"""Any ATen operator through torch, with arguments mapped by the op's schema.

The emitter writes a KernelCall's ``args`` as every schema argument in order (positional,
then keyword-only, ``out`` included), then the return value(s). For an out variant the
returns are the ``out`` arguments again (several outs: one TensorList), so they are
ignored; for a functional op the statement assigns the result to the return slot(s).

Two things make the call cheap:

- arguments whose literal value equals the schema default are left out (torch then skips
  converting them, which is measurably faster for Scalars);
- the call goes through torch's Python function of the same name (``torch.addmm``, ...)
  rather than the generic ``torch.ops`` entry point when that function is *proven* to run
  the same overload: at load, the call is replayed once on meta tensors under a dispatch
  mode that records which overload torch dispatches, and the faster entry point is used
  only when it is exactly this op's overload.

Copies that are views in eager PyTorch (``permute_copy``, ``view_copy``, ``slice_copy``,
``split_with_sizes_copy``, ``clone``, ...) also carry an :class:`~.registry.Alias` form; the
method uses it where its alias analysis shows the copy is not needed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..dtypes import CODE_TO_DTYPE
from ..format import program as p
from .checks import check_arguments
from .registry import (
    Alias,
    KernelContext,
    KernelFactory,
    NativeCall,
    Slots,
    Statement,
    UnsupportedKernel,
    emptying,
    literal_tensor,
    register_namespace,
)

__all__ = [
    "Probe",
    "fastest_entry",
    "functional_only",
    "resolve_overload",
    "schema_kernel",
    "spread",
    "torch_operator_names",
]


def resolve_overload(qualified_name: str) -> Any:
    """``'ns::op.overload'`` -> the ``torch.ops`` OpOverload, or None when torch has none."""
    ns, _, rest = qualified_name.partition("::")
    opname, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), opname)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None


def draws_random(qualified_name: str) -> bool:
    """Whether operator ``'ns::op.overload'`` draws from torch's random generator (its
    schema is tagged ``nondeterministic_seeded``: ``rand``, ``bernoulli``, dropout...):
    running it again draws other numbers, and moves the generator on."""
    overload = resolve_overload(qualified_name)
    return torch.Tag.nondeterministic_seeded in getattr(overload, "tags", ())


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


# ---- proving a faster entry point ----------------------------------------------------------


class _Dispatched(Exception):
    """Stops a probe at its first dispatched overload (nothing is computed)."""


class _FirstOp(TorchDispatchMode):
    """Records the first overload dispatched and stops the call there."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # nothing here is compiled; wrapping would import torch's compiler stack

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.first: Any = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.first = func
        raise _Dispatched


# torch's functions, then its tensor methods (in-place ops such as ``copy_`` have no
# function), called unbound: ``TensorBase.copy_(self, src)``
_PY_NAMESPACES: tuple[Any, ...] = (
    *(
        getattr(torch._C, ns)
        for ns in ("_VariableFunctions", "_nn", "_special", "_linalg", "_fft")
        if hasattr(torch._C, ns)
    ),
    torch._C.TensorBase,
)
_PROVEN: dict[tuple[Any, ...], Callable[..., Any] | None] = {}


def _meta_value(ctx: KernelContext, index: int) -> Any:
    """A stand-in for value ``index`` with the same Python type: for a tensor, one element
    of its dtype at its rank (the probe stops before any kernel runs, so shapes do not
    matter; meta tensors would import torch's compiler stack on first use)."""
    v = ctx.values[index]
    if isinstance(v, p.Tensor):
        from ..dtypes import CODE_TO_DTYPE

        dtype = CODE_TO_DTYPE.get(v.scalar_type, torch.uint8)
        return torch.empty((1,) * len(v.sizes), dtype=dtype)
    if isinstance(v, p.TensorList):
        return [_meta_value(ctx, i) for i in v.items]
    if isinstance(v, p.OptionalTensorList):
        return [
            None if i < 0 or isinstance(ctx.values[i], p.Null) else _meta_value(ctx, i)
            for i in v.items
        ]
    if isinstance(v, p.IntList):
        return [ctx.initial[i] for i in v.items]
    if isinstance(v, p.Null):
        return None
    return ctx.initial[index]


def _kind(ctx: KernelContext, index: int) -> Any:
    """What a probe cares about of value ``index``: the Python type of its stand-in
    (:func:`_meta_value`), without making one."""
    v = ctx.values[index]
    if isinstance(v, p.Tensor):
        return "T"
    if isinstance(v, p.TensorList):
        return ("list", tuple("T" for _ in v.items))
    if isinstance(v, p.OptionalTensorList):
        return (
            "list",
            tuple(
                "NoneType" if i < 0 or isinstance(ctx.values[i], p.Null) else "T" for i in v.items
            ),
        )
    if isinstance(v, p.IntList):
        return ("list", tuple(type(ctx.initial[i]).__name__ for i in v.items))
    if isinstance(v, p.Null):
        return "NoneType"
    return type(ctx.initial[index]).__name__


class Probe:
    """The arguments of one call, as a probe needs them: their kinds (which decide the
    overload torch dispatches) at once, their stand-in values only when a probe runs."""

    def __init__(self, ctx: KernelContext, given: Mapping[int, Any] | None = None) -> None:
        self.ctx = ctx
        self.pos: list[int] = []
        self.kw: dict[str, int] = {}
        self.given = given if given is not None else {}  # values passed as these objects

    def _kind(self, i: int) -> Any:
        found = self.given.get(i, _MISSING)
        return _kind(self.ctx, i) if found is _MISSING else type(found).__name__

    def _value(self, i: int) -> Any:
        found = self.given.get(i, _MISSING)
        return _meta_value(self.ctx, i) if found is _MISSING else found

    def key(self, overload: Any, head: tuple[str, str] | None = None) -> tuple[Any, ...]:
        """The key :func:`fastest_entry` proves an entry point under; ``head``: the
        overload's :func:`schema_head`, when the caller has it."""
        name, overload_name = schema_head(overload) if head is None else head
        return (
            name,
            overload_name,
            tuple(self._kind(i) for i in self.pos),
            tuple(sorted(self.kw)),
            tuple(self._kind(i) for _, i in sorted(self.kw.items())),
        )

    def values(self) -> tuple[list[Any], dict[str, Any]]:
        return [self._value(i) for i in self.pos], {k: self._value(i) for k, i in self.kw.items()}


def schema_head(overload: Any) -> tuple[str, str]:
    """(name, overload name) of ``overload``'s schema: what a probe's key begins with."""
    schema = overload._schema
    return (schema.name, schema.overload_name)


def fastest_entry(
    overload: Any, probe: Probe, head: tuple[str, str] | None = None
) -> Callable[..., Any] | None:
    """torch's Python function that dispatches exactly ``overload`` for these arguments
    (proven once per overload and argument kinds in a process); ``head``: the overload's
    :func:`schema_head`, when the caller has it (read once per overload, not per call)."""
    key = probe.key(overload, head)
    if key in _PROVEN:
        return _PROVEN[key]
    pos, kw = probe.values()
    name = overload._schema.name.split("::", 1)[1]
    found = None
    for ns in _PY_NAMESPACES:
        fn = getattr(ns, name, None)
        if fn is None or (ns is torch._C.TensorBase and not (pos and type(pos[0]) is torch.Tensor)):
            continue
        mode = _FirstOp()
        try:
            with mode:
                fn(*pos, **kw)
        except _Dispatched:
            pass
        except Exception:
            continue
        if mode.first is overload:
            found = fn
            break
    _PROVEN[key] = found
    return found


# ---- view forms of copies --------------------------------------------------------------------


def spread(sizes: str) -> str:
    """A rendered int list as the arguments of a method taking ``*sizes``: torch parses
    ``x.permute(1, 0)`` faster than ``x.permute([1, 0])`` (an empty list stays a list)."""
    if sizes.startswith("[") and sizes.endswith("]") and sizes[1:-1].strip():
        return sizes[1:-1]
    return sizes


# qualified name -> how the view reads the rendered arguments (self first)
_VIEWS: dict[str, Callable[[list[str]], str]] = {
    "aten::permute_copy.out": lambda a: f"{a[0]}.permute({spread(a[1])})",
    "aten::view_copy.out": lambda a: f"{a[0]}.reshape({spread(a[1])})",
    "aten::_unsafe_view.out": lambda a: f"{a[0]}.reshape({spread(a[1])})",
    "aten::expand_copy.out": lambda a: f"{a[0]}.expand({spread(a[1])})",
    "aten::t_copy.out": lambda a: f"{a[0]}.t()",
    "aten::transpose_copy.int_out": lambda a: f"{a[0]}.transpose({a[1]}, {a[2]})",
    "aten::unsqueeze_copy.out": lambda a: f"{a[0]}.unsqueeze({a[1]})",
    "aten::squeeze_copy.out": lambda a: f"{a[0]}.squeeze()",
    "aten::squeeze_copy.dim_out": lambda a: f"{a[0]}.squeeze({a[1]})",
    "aten::squeeze_copy.dims_out": lambda a: f"{a[0]}.squeeze({a[1]})",
    "aten::select_copy.int_out": lambda a: f"{a[0]}.select({a[1]}, {a[2]})",
    "aten::slice_copy.Tensor_out": lambda a: f"_slice({a[0]}, {a[1]}, {a[2]}, {a[3]}, {a[4]})",
    "aten::alias_copy.out": lambda a: a[0],
    "aten::diagonal_copy.out": lambda a: f"{a[0]}.diagonal({a[1]}, {a[2]}, {a[3]})",
    "aten::clone.out": lambda a: a[0],
    "aten::split_with_sizes_copy.out": lambda a: f"{a[0]}.split_with_sizes({a[1]}, {a[2]})",
    "aten::split_copy.Tensor_out": lambda a: f"{a[0]}.split({a[1]}, {a[2]})",
    "aten::unbind_copy.int_out": lambda a: f"{a[0]}.unbind({a[1]})",
}
_SLICE = torch.ops.aten.slice.Tensor


def _alias_form(
    ctx: KernelContext, name: str, rendered: list[str], outs: tuple[int, ...]
) -> Alias | None:
    view = _VIEWS.get(name)
    if view is None or not outs:
        return None
    source = ctx.args[0]
    if not isinstance(ctx.values[source], p.Tensor):
        return None
    if name == "aten::clone.out":  # a clone in another memory format is not a plain alias
        fmt = ctx.args[1]
        if not isinstance(ctx.values[fmt], p.Null) and not (
            ctx.is_literal(fmt) and ctx.literal(fmt) in (None, 1)
        ):
            return None
    expr = rendered[0] if _same_sizes(ctx, name) else view(rendered)
    targets = ", ".join(f"v[{t}]" for t in outs)
    code = f"{targets}, = {expr}" if len(outs) > 1 or name in _MULTI_OUT else f"{targets} = {expr}"
    return Alias(code, {"_slice": _SLICE}, source, outs, ctx.reads(outs))


def _same_sizes(ctx: KernelContext, name: str) -> bool:
    """An ``expand_copy`` to the sizes its static source already has: its view is the
    source itself (as a clone's), so a copy that stays is a plain one."""
    if name != "aten::expand_copy.out" or len(ctx.args) < 2:
        return False
    source, sizes = ctx.values[ctx.args[0]], ctx.args[1]
    return (
        isinstance(source, p.Tensor)
        and source.shape_dynamism == p.STATIC
        and isinstance(ctx.values[sizes], p.IntList)
        and ctx.is_literal(sizes)
        and tuple(ctx.literal(sizes)) == tuple(source.sizes)
    )


_MULTI_OUT = {
    "aten::split_with_sizes_copy.out",
    "aten::split_copy.Tensor_out",
    "aten::unbind_copy.int_out",
}


# ---- scalar operands as 0-d tensors ----------------------------------------------------------

# ``op.Scalar_out(self, other)`` -> torch.<op>(self, other_as_0d_tensor, out=...). Wrapping a
# Python scalar costs torch more than the arithmetic on a small tensor. With the scalar
# stored as a 0-d tensor of self's dtype the two compute the same: a scalar never promotes
# a tensor of its own or a higher category (an int scalar with a float tensor, say), so the
# common dtype is self's either way and the scalar is rounded to it once. Only for dtypes
# that compute in their own precision: half and bfloat16 compute in float, so they keep the
# scalar path.
_SCALAR_OPS = {
    "aten::add.Scalar_out": torch.add,
    "aten::sub.Scalar_out": torch.sub,
    "aten::mul.Scalar_out": torch.mul,
    "aten::div.Scalar_out": torch.div,
    "aten::eq.Scalar_out": torch.eq,
    "aten::ne.Scalar_out": torch.ne,
    "aten::lt.Scalar_out": torch.lt,
    "aten::le.Scalar_out": torch.le,
    "aten::gt.Scalar_out": torch.gt,
    "aten::ge.Scalar_out": torch.ge,
    "aten::remainder.Scalar_out": torch.remainder,
    "aten::fmod.Scalar_out": torch.fmod,
    "aten::floor_divide.Scalar_out": torch.floor_divide,
    "aten::bitwise_and.Scalar_out": torch.bitwise_and,
    "aten::bitwise_or.Scalar_out": torch.bitwise_or,
    "aten::bitwise_xor.Scalar_out": torch.bitwise_xor,
}
# the overload each of them calls with a tensor ``other``, and whether it takes ``alpha``
_TENSOR_FORMS = {
    "aten::add.Scalar_out": ("out", True),
    "aten::sub.Scalar_out": ("out", True),
    "aten::mul.Scalar_out": ("out", False),
    "aten::div.Scalar_out": ("out", False),
    "aten::eq.Scalar_out": ("Tensor_out", False),
    "aten::ne.Scalar_out": ("Tensor_out", False),
    "aten::lt.Scalar_out": ("Tensor_out", False),
    "aten::le.Scalar_out": ("Tensor_out", False),
    "aten::gt.Scalar_out": ("Tensor_out", False),
    "aten::ge.Scalar_out": ("Tensor_out", False),
    "aten::remainder.Scalar_out": ("Tensor_out", False),
    "aten::fmod.Scalar_out": ("Tensor_out", False),
    "aten::floor_divide.Scalar_out": ("out", False),
    "aten::bitwise_and.Scalar_out": ("Tensor_out", False),
    "aten::bitwise_or.Scalar_out": ("Tensor_out", False),
    "aten::bitwise_xor.Scalar_out": ("Tensor_out", False),
}
_COMPARISONS = {
    "aten::eq.Scalar_out",
    "aten::ne.Scalar_out",
    "aten::lt.Scalar_out",
    "aten::le.Scalar_out",
    "aten::gt.Scalar_out",
    "aten::ge.Scalar_out",
}
_SAME_PRECISION = {
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
}


def _scalar_as_tensor(ctx: KernelContext, name: str) -> Statement | None:
    from ..dtypes import CODE_TO_DTYPE

    fn = _SCALAR_OPS.get(name)
    if fn is None:
        return None
    args = ctx.args
    if len(args) < 3:
        return None
    self_, other, out = args[0], args[1], args[-1]
    tself, tout = ctx.values[self_], ctx.values[out]
    if (
        not isinstance(tself, p.Tensor)
        or not isinstance(tout, p.Tensor)
        or not ctx.is_literal(other)
    ):
        return None
    if name in ("aten::add.Scalar_out", "aten::sub.Scalar_out"):  # (self, other, alpha, out)
        alpha = args[2]
        if not ctx.is_literal(alpha) or ctx.literal(alpha) != 1:
            return None
    dtype = CODE_TO_DTYPE.get(tself.scalar_type)
    if dtype not in _SAME_PRECISION:
        return None
    if name not in _COMPARISONS and tout.scalar_type != tself.scalar_type:
        return None
    value = ctx.literal(other)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not dtype.is_floating_point:
        return None  # a float scalar promotes an integer tensor: keep torch's scalar path
    if name == "aten::div.Scalar_out" and not dtype.is_floating_point:
        return None
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        if not info.min <= value <= info.max:
            return None  # a 0-d tensor of self's dtype cannot hold it: torch's scalar path
    scalar = literal_tensor(torch.tensor(value, dtype=dtype))  # read only, as a literal
    f, s = ctx.bind(fn, "op"), ctx.bind(scalar, "s")
    outs = (out,)
    empties = _dynamic(ctx, outs)
    code = f"{emptying(empties)}{f}({ctx.expr(self_)}, {s}, out=v[{out}])"
    overload, alpha = _TENSOR_FORMS[name]
    native = NativeCall(
        name.split(".", 1)[0],
        overload,
        (Slots((self_,)), scalar, *((1,) if alpha else ()), Slots(outs)),
        empties,
    )
    # elementwise with a scalar: the result has self's sizes
    return ctx.emit(
        code, mutates=outs, outs=outs, pure=True, sized=True, empties=empties, native=native
    )


def _copy_code(ctx: KernelContext, out: int, expr: str, env: Mapping[str, Any]) -> str:
    """``out`` receives the value of ``expr`` (resized first when ``out`` is dynamic)."""
    for name, obj in env.items():
        ctx.env.setdefault(name, obj)
    value = ctx.values[out]
    if isinstance(value, p.Tensor) and value.shape_dynamism == p.STATIC:
        return f"v[{out}].copy_({expr})"
    store = ctx.bind(_store, "store")
    return f"{store}(v[{out}], {expr})"


def _dynamic(ctx: KernelContext, outs: tuple[int, ...]) -> tuple[int, ...]:
    """The dynamic-shape tensors among ``outs``: emptied before the kernel writes them,
    since torch resizes an empty ``out`` without a warning (and will stop resizing
    non-empty ones)."""
    return tuple(
        o
        for o in outs
        if isinstance(ctx.values[o], p.Tensor) and ctx.values[o].shape_dynamism != p.STATIC  # type: ignore[union-attr]
    )


# ops whose results' sizes (or the scalars they return) depend on the values they read
_DATA_SIZED = tuple(
    t
    for t in (
        getattr(torch.Tag, n, None) for n in ("dynamic_output_shape", "data_dependent_output")
    )
    if t is not None
)


def _sized_by_arguments(overload: Any) -> bool:
    """Whether ``overload``'s results' sizes follow from its arguments' sizes and values
    other than tensors' contents: an ``aten`` op none of whose overloads torch tags as
    sized by data (the functional overloads carry the tags; an out variant's may lack
    them: ``index.Tensor_out``'s, ``bincount.out``'s). Other namespaces' ops say nothing."""
    schema_name = overload._schema.name
    if not schema_name.startswith("aten::") or not _DATA_SIZED:
        return False
    packet = getattr(torch.ops.aten, schema_name.split("::", 1)[1], None)
    if packet is None:
        return False
    for name in packet.overloads():
        tags = getattr(getattr(packet, name, None), "tags", None)
        if tags is None or any(t in tags for t in _DATA_SIZED):
            return False
    return True


# ---- out variants that torch generates -------------------------------------------------------

# An out variant tagged ``generated`` is, in torch itself, the functional op followed by a
# copy into ``out``. Calling the functional op through its (faster) Python binding and
# copying is therefore the same computation. Where a view is the functional op (a
# ``*_copy``), the copy reads the view directly; ``relu`` is ``clamp_min(x, 0)`` in ATen.


def _functional_of(overload: Any) -> Any:
    """The functional overload an out variant was generated from (or stands beside, in
    its own namespace), or None."""
    schema = overload._schema
    inputs = [
        (a.name, str(a.type))
        for a in schema.arguments
        if not (a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)
    ]
    ns, _, opname = schema.name.partition("::")
    packet = getattr(getattr(torch.ops, ns), opname, None)
    if packet is None:
        return None
    for name in packet.overloads():
        candidate = getattr(packet, name)
        cs = candidate._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in cs.arguments):
            continue
        if [(a.name, str(a.type)) for a in cs.arguments] == inputs and len(cs.returns) == len(
            schema.returns
        ):
            return candidate
    return None


# out variants whose functional form runs the same implementation (structured kernels:
# the out form and the functional one share their meta and impl functions); torch's
# pointwise ops and reductions are structured TensorIterator kernels, whose tags say so
_STRUCTURED = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_softmax",
        "aten::_log_softmax",
        "aten::cumsum",
    }
)


def _same_kernel_functional(overload: Any, functional: Any) -> Any:
    """The functional overload computing what out variant ``overload`` writes, by the same
    kernel (``functional``: the one a generated out variant is made of), or None."""
    if functional is not None:
        return functional  # a generated out variant is its functional op and a copy
    found = _functional_of(overload)
    if found is None:
        return None
    tags = getattr(found, "tags", ())
    if torch.Tag.pointwise in tags or torch.Tag.reduction in tags:
        return found
    return found if overload._schema.name in _STRUCTURED else None


def _linear_is_one_product(ctx: KernelContext) -> bool:
    """``linear``'s out variant and its functional form run one matrix product the same
    way when there is no bias (both a ``matmul``) or the input is a matrix (both an
    ``addmm``); for a batched input with a bias the functional form folds the bias into
    the product where the out variant adds it after."""
    args = ctx.args
    x, bias = ctx.values[args[0]], ctx.values[args[2]] if len(args) > 2 else p.Null()
    return isinstance(bias, p.Null) or (isinstance(x, p.Tensor) and len(x.sizes) == 2)


def _store(out: torch.Tensor, result: torch.Tensor) -> None:
    """``out`` takes ``result``'s shape and values (the tail of a generated out variant)."""
    if out.shape != result.shape:
        out.resize_(result.shape)
    out.copy_(result)


def _store_all(outs: tuple[torch.Tensor | None, ...], results: tuple[torch.Tensor, ...]) -> None:
    """Each result into its ``out`` (None: a result nothing reads, not copied)."""
    for out, result in zip(outs, results, strict=True):
        if out is not None:
            _store(out, result)


_CLAMP_MIN = torch.clamp_min

# ``*_like.out(self, ..., memory_format, out)``: a tensor of self's sizes in out's dtype
# filled with one value, copied into ``out`` -- ``out.fill_(value)`` when ``out`` already
# has those sizes (the copy then changes nothing); the value's position among the
# arguments, or the value
_FILLS: dict[str, int | str] = {
    "aten::full_like.out": 1,
    "aten::zeros_like.out": "0",
    "aten::ones_like.out": "1",
}


def _fills_in_place(ctx: KernelContext, out: int, fmt: int) -> bool:
    """Whether ``out`` of a ``*_like`` op has its ``self``'s sizes for good and the memory
    format asked for (value ``fmt``) is one every tensor has (the op refuses a channels-last
    one for a tensor of another rank). The op makes its tensor in ``out``'s dtype."""
    self_, o = ctx.values[ctx.args[0]], ctx.values[out]
    if not isinstance(ctx.values[fmt], p.Null) and not (
        ctx.is_literal(fmt) and ctx.literal(fmt) in (0, 1)
    ):
        return False
    return (
        isinstance(self_, p.Tensor)
        and isinstance(o, p.Tensor)
        and self_.shape_dynamism == p.STATIC
        and o.shape_dynamism == p.STATIC
        and tuple(self_.sizes) == tuple(o.sizes)
    )


def _gathers_rows(ctx: KernelContext, out: int) -> bool:
    """embedding(weight, indices) is index_select(weight, 0, indices) when the weight is a
    2-D table and the output a static, contiguous tensor (its forward does not depend on
    padding_idx, scale_grad_by_freq or sparse)."""
    w, o = ctx.values[ctx.args[0]], ctx.values[out]
    return (
        isinstance(w, p.Tensor)
        and isinstance(o, p.Tensor)
        and len(w.sizes) == 2
        and o.shape_dynamism == p.STATIC
        and o.dim_order == tuple(range(len(o.sizes)))
    )


def _gather_width(ctx: KernelContext) -> str | None:
    """For embedding as a row gather: the table's width when it is fixed. (The indices
    are flattened with ``reshape``: the load-time rewrites may have made them a view of
    any strides.)"""
    w = ctx.values[ctx.args[0]]
    if isinstance(w, p.Tensor) and w.shape_dynamism == p.STATIC:
        return str(w.sizes[1])
    return None


def _native_gather(
    ctx: KernelContext, weight: int, ids: int, out: int, fallback: NativeCall | None
) -> NativeCall | None:
    """embedding as ``index_select.out`` of rows of ``weight`` at the flattened ``ids``
    into ``out`` seen as rows (what the statement's Python calls), for static ``ids`` and a
    table of fixed width (the out is static: the caller's rule), with ``fallback``
    (embedding's own out form) for a load whose tensors cannot be seen so; otherwise
    ``fallback`` itself."""
    w, i = ctx.values[weight], ctx.values[ids]
    if (
        fallback is None
        or not (isinstance(w, p.Tensor) and isinstance(i, p.Tensor))
        or w.shape_dynamism != p.STATIC
        or i.shape_dynamism != p.STATIC
    ):
        return fallback
    rows = (-1, w.sizes[1])
    return NativeCall(
        "aten::index_select",
        "out",
        (Slots((weight,)), 0, Slots((ids,), view=(-1,)), Slots((out,), view=rows)),
        (),
        fallback,
    )


_INDEX = torch.ops.aten.index.Tensor_out
_INDEX_SELECT = torch.index_select


def _gathers_along(ctx: KernelContext) -> tuple[int, int] | None:
    """For ``index.Tensor_out(self, indices, out)`` on the CPU whose indices are one 1-d
    integer tensor after nothing but Nones: its dim and value. Indexing with one such
    tensor gathers along that dim, as ``index_select`` does."""
    self_, indices = ctx.args[0], ctx.args[1]
    listed = ctx.values[indices]
    if not isinstance(ctx.values[self_], p.Tensor) or not isinstance(listed, p.OptionalTensorList):
        return None
    given = [
        (d, k)
        for d, k in enumerate(listed.items)
        if k >= 0 and not isinstance(ctx.values[k], p.Null)
    ]
    if len(given) != 1:
        return None
    dim, index = given[0]
    value = ctx.values[index]
    devices = (ctx.device_of(self_), ctx.device_of(index))
    if not (
        isinstance(value, p.Tensor)
        and len(value.sizes) == 1
        and CODE_TO_DTYPE.get(value.scalar_type) in (torch.int64, torch.int32)
        and all(d is not None and str(d) == "cpu" for d in devices)
    ):
        return None
    return dim, index


def _gather_along(x: torch.Tensor, dim: int, index: torch.Tensor, out: torch.Tensor) -> None:
    """``index.Tensor_out(x, [None] * dim + [index], out=out)`` for a 1-d ``index``
    (:func:`_gathers_along`): ``index_select``'s gather, the same elements; where that
    refuses (a negative index, which ``index`` counts from the end), ``index`` itself,
    which writes all of ``out`` again or raises its own error."""
    try:
        _INDEX_SELECT(x, dim, index, out=out)
    except Exception:
        _INDEX(x, [None] * dim + [index], out=out)


# ---- copies into ``out`` without a temporary -------------------------------------------------
#
# ``slice_scatter.out`` and ``copy.out`` are generated out variants: torch makes the whole
# result in a new tensor, then copies it into ``out``. Both results are copies of their
# arguments' elements: ``slice_scatter`` is ``self`` with ``src`` in one slice (ATen
# clones ``self`` and copies ``src`` into the clone's slice), ``copy`` is ``src`` broadcast
# to ``self``'s shape in ``self``'s dtype. Written straight into ``out`` (of ``self``'s
# dtype) they are the same elements, one allocation and one copy fewer. ExecuTorch's own
# kernels write ``out`` the same way, so ``out`` never shares a byte with the other
# arguments in a program ExecuTorch runs, and the load-time rewrites make no view that
# would (a view's source is not written while the view is read).


def _static_tensor(ctx: KernelContext, index: int) -> p.Tensor | None:
    t = ctx.values[index]
    return t if isinstance(t, p.Tensor) and t.shape_dynamism == p.STATIC else None


def _slice_bounds(size: int, start: Any, end: Any, step: Any) -> tuple[int, int, int] | None:
    """``(start, end, length)`` of ``aten::slice`` on a dim of ``size`` (None: not a
    plain positive-step slice of ints)."""
    if start is None:
        start = 0
    if end is None:
        end = size
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end, step)):
        return None
    if step <= 0:
        return None  # aten::slice refuses it: torch's own path raises its error
    picked = range(size)[start:end:step]  # ATen's wrapping and clamping are Python's
    return picked.start, picked.stop, len(picked)


def _slice_of_planned(
    ctx: KernelContext, out: int, part: str, bounds: tuple[int, int, int, int]
) -> str:
    """``part``, the slice ``bounds`` (dim, start, end, step) of static ``out``, as an
    expression: when ``out`` is planned, the slice of the tensor loading made for it is
    made now and used while ``out``'s slot holds that tensor (a static tensor in planned
    memory keeps its storage, offset, sizes and strides for the method's life: a failed
    call's restore gives them back), ``part`` otherwise. Making the view costs a few
    microseconds of torch's dispatch, checking the object tens of nanoseconds."""
    value = ctx.values[out]
    planned = ctx.initial[out] if out < len(ctx.initial) else None
    if not (
        isinstance(value, p.Tensor)
        and value.shape_dynamism == p.STATIC
        and value.allocation_info is not None
        and isinstance(planned, torch.Tensor)
        and tuple(planned.shape) == tuple(value.sizes)
    ):
        return part
    d, lo, hi, step = bounds
    view = _SLICE(planned, d, lo, hi, step)
    tensor, held = ctx.bind(planned, "planned"), ctx.bind(view, "slice")
    return f"({held} if v[{out}] is {tensor} else {part})"


def _slice_scatter_into(
    out: torch.Tensor,
    self_: torch.Tensor,
    src: torch.Tensor,
    dim: int,
    start: int | None,
    end: int | None,
    step: int,
) -> None:
    """``slice_scatter.out`` for shapes known only per call: straight into ``out`` when it
    has ``self_``'s shape already and ``src`` the slice's, torch's own path otherwise."""
    if out.shape == self_.shape and _SLICE(self_, dim, start, end, step).shape == src.shape:
        out.copy_(self_)
        _SLICE(out, dim, start, end, step).copy_(src)
    else:
        _store(out, torch.slice_scatter(self_, src, dim, start, end, step))


def _copy_into(out: torch.Tensor, self_: torch.Tensor, src: torch.Tensor) -> None:
    """``copy.out`` for shapes known only per call: straight into ``out`` when it has
    ``self_``'s shape already (``copy_`` checks that ``src`` broadcasts to it before it
    writes), torch's own path otherwise."""
    if out.shape == self_.shape:
        out.copy_(src)
    else:
        _store(out, _COPY(self_, src))


_COPY = torch.ops.aten.copy.default


def _copy_alias(ctx: KernelContext, out: int) -> Alias | None:
    """``copy.out`` of one dtype and fixed shapes is ``src`` broadcast to ``self``'s shape,
    which ``src.expand(self's sizes)`` views (``copy_`` broadcasts by that very expand)."""
    self_, src, blocking = ctx.args[0], ctx.args[1], ctx.args[2]
    ts, tsrc, to = (_static_tensor(ctx, k) for k in (self_, src, out))
    if ts is None or tsrc is None or to is None:
        return None
    if not (ts.scalar_type == tsrc.scalar_type == to.scalar_type):
        return None
    if tuple(to.sizes) != tuple(ts.sizes):
        return None
    if not (ctx.is_literal(blocking) and ctx.literal(blocking) is False):
        return None
    try:
        shape = torch.broadcast_shapes(tuple(tsrc.sizes), tuple(ts.sizes))  # type: ignore[no-untyped-call]
    except RuntimeError:
        return None
    if tuple(shape) != tuple(ts.sizes):
        return None  # src does not broadcast to self: torch's error, per call
    sizes = ", ".join(map(str, ts.sizes)) or "()"
    return Alias(f"v[{out}] = v[{src}].expand({sizes})", {}, src, (out,), (src,))


def _written_in_place(ctx: KernelContext, name: str, rendered: list[str], out: int) -> str | None:
    """The statement writing ``slice_scatter.out`` or ``copy.out`` straight into ``out``
    (see above), or None for torch's own path."""
    if name not in ("aten::slice_scatter.out", "aten::copy.out"):
        return None
    args = ctx.args
    self_, src = ctx.values[args[0]], ctx.values[args[1]]
    o = ctx.values[out]
    if not (
        isinstance(self_, p.Tensor)
        and isinstance(src, p.Tensor)
        and isinstance(o, p.Tensor)
        and o.scalar_type == self_.scalar_type
        and (name == "aten::copy.out" or src.scalar_type == self_.scalar_type)
    ):
        return None
    static = _static_tensor(ctx, args[0]) is not None and _static_tensor(ctx, out) is not None
    if static and tuple(o.sizes) != tuple(self_.sizes):
        return None  # torch resizes out (with a warning): its own path
    if name == "aten::copy.out":
        blocking = args[2]
        if not (ctx.is_literal(blocking) and ctx.literal(blocking) is False):
            return None
        if static and _static_tensor(ctx, args[1]) is not None:
            try:
                torch.broadcast_shapes(tuple(src.sizes), tuple(self_.sizes))  # type: ignore[no-untyped-call]
            except RuntimeError:
                return None  # torch's own path raises its error
            return f"v[{out}].copy_({rendered[1]})"
        f = ctx.bind(_copy_into, "op")
        return f"{f}(v[{out}], {rendered[0]}, {rendered[1]})"
    dim, start, end, step = args[2:6]
    fixed = all(ctx.is_literal(a) for a in (dim, start, end, step))
    if static and fixed and _static_tensor(ctx, args[1]) is not None:
        sizes = list(self_.sizes)
        d = ctx.literal(dim)
        if isinstance(d, int) and -len(sizes) <= d < len(sizes):
            d %= len(sizes)
            bounds = _slice_bounds(
                sizes[d], ctx.literal(start), ctx.literal(end), ctx.literal(step)
            )
            if bounds is not None and tuple(src.sizes) == (
                *sizes[:d],
                bounds[2],
                *sizes[d + 1 :],
            ):
                lo, hi, length = bounds
                s = ctx.literal(step)
                part = (
                    f"v[{out}].narrow({d}, {lo}, {length})"
                    if s == 1
                    else f"{ctx.bind(_SLICE, 'op')}(v[{out}], {d}, {lo}, {hi}, {s})"
                )
                part = _slice_of_planned(ctx, out, part, (d, lo, hi, s))
                return f"v[{out}].copy_({rendered[0]})\n{part}.copy_({rendered[1]})"
        return None  # a bad dim, step or src size: torch's own path raises its error
    f = ctx.bind(_slice_scatter_into, "op")
    return f"{f}(v[{out}], {', '.join(rendered[:6])})"


# ---- the factory -----------------------------------------------------------------------------


def _is_scalar_type(arg: Any) -> bool:
    """Whether a schema argument is a ``ScalarType`` (or ``ScalarType?``)."""
    return "ScalarType" in str(getattr(arg, "real_type", arg.type))


def _is_memory_format(arg: Any) -> bool:
    """Whether a schema argument is a ``MemoryFormat`` (or ``MemoryFormat?``)."""
    return "MemoryFormat" in str(getattr(arg, "real_type", arg.type))


# c10::MemoryFormat's codes (a program stores the code): torch's Python functions take only
# the objects, the generic entry point either
_MEMORY_FORMATS = {
    0: torch.contiguous_format,
    1: torch.preserve_format,
    2: torch.channels_last,
    3: torch.channels_last_3d,
}


def _check_scalar_type(name: str, arg: Any, ctx: KernelContext, index: int) -> None:
    """A dtype argument must be a constant code torch knows: torch casts any integer to a
    ScalarType unchecked, and an out-of-range one crashes the process."""
    value = ctx.values[index]
    if isinstance(value, p.Null):
        return
    if isinstance(value, p.Int) and ctx.is_literal(index) and ctx.literal(index) in CODE_TO_DTYPE:
        return
    got = f"{value.value}" if isinstance(value, p.Int) else f"a {p.evalue_kind(value)}"
    raise UnsupportedKernel(
        f"{name}: argument '{arg.name}' must be a constant scalar type code, the program "
        f"passes {got} (value {index})"
    )


_TENSORISH = (p.Tensor, p.TensorList, p.OptionalTensorList)  # a tuple: checked per argument

# out variants run as their functional overload, the results copied into the outs: a
# library's out form that refuses outs sharing a storage with its inputs, as every planned
# tensor of a method shares its arena's (a check of storages, not of the memory they cover)
_FUNCTIONAL_ONLY: set[str] = set()


def functional_only(*names: str) -> None:
    """Run the out variants ``names`` (``ns::op.out``) through their functional overload
    and copy the results into the outs: for an out form that refuses outs sharing a storage
    with its inputs. Takes effect for an operator not resolved yet."""
    _FUNCTIONAL_ONLY.update(names)


def schema_kernel(overload: Any) -> KernelFactory:
    """A factory calling ``overload`` (an OpOverload) with schema-mapped arguments."""
    schema = overload._schema
    arguments = list(schema.arguments)
    returns = list(schema.returns)
    generic = getattr(overload, "_op", overload)
    is_out = any(
        a.alias_info is not None and a.alias_info.is_write and a.kwarg_only for a in arguments
    )
    written = [
        k for k, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write
    ]
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    only_outs = all(arguments[k].kwarg_only for k in written)
    seeded = torch.Tag.nondeterministic_seeded in getattr(overload, "tags", ())
    out_args = {k for k in written if arguments[k].kwarg_only}
    generated = is_out and only_outs and torch.Tag.generated in getattr(overload, "tags", ())
    by_functional = generated or (is_out and only_outs and name in _FUNCTIONAL_ONLY)
    functional = _functional_of(overload) if by_functional else None
    # what a caller handed the result may run instead of writing ``out`` (Statement.fresh)
    same_kernel = (
        _same_kernel_functional(overload, functional)
        if is_out and only_outs and len(returns) == 1 and not seeded
        else None
    )
    by_arguments = _sized_by_arguments(overload)
    # an in-place op returning its ``self`` (``copy_``, ``add_``): what it puts in its
    # slot is ``self``, whose sizes it keeps (ops that change them, ``inplace_view``, not)
    tags = getattr(overload, "tags", ())
    in_place = (
        torch.Tag.inplace in tags
        and torch.Tag.inplace_view not in tags
        and len(returns) == 1
        and bool(arguments)
        and _writes_alias(returns[0])
        and _writes_alias(arguments[0])
        and returns[0].alias_info.before_set == arguments[0].alias_info.before_set
    )
    # per argument, once: name, keyword-only, a ScalarType, a MemoryFormat, its default
    facts = [
        (a, a.name, a.kwarg_only, _is_scalar_type(a), _is_memory_format(a), _default(a))
        for a in arguments
    ]
    # what of the schema every call reads, read from torch once per overload
    nargs = len(arguments)
    scalar_op = name in _SCALAR_OPS
    out_positions = tuple(k for k in written if arguments[k].kwarg_only)
    in_positions = tuple(k for k in range(nargs) if k not in out_args)
    head = schema_head(overload)
    functional_head = None if functional is None else schema_head(functional)
    same_kernel_head = None if same_kernel is None else schema_head(same_kernel)

    def factory(ctx: KernelContext) -> Statement:
        args = ctx.args
        if scalar_op and len(args) == nargs + 1:
            rewritten = _scalar_as_tensor(ctx, name)
            if rewritten is not None:
                return rewritten
        extra = len(args) - nargs
        if extra < 0 or extra > max(len(returns), 1):
            raise UnsupportedKernel(
                f"{name}: the program passes {len(args)} values, the schema of the installed "
                f"torch has {nargs} arguments and {len(returns)} returns"
            )
        check_arguments(ctx)  # (the argument count is known to fit the schema here)
        positional: list[str] = []
        keywords: list[str] = []
        in_keywords: list[str] = []  # keywords without the outs (for the functional op)
        given: dict[int, Any] = {}  # memory formats, as torch's objects
        probe = Probe(ctx, given)
        in_probe = Probe(ctx, given)
        pending: list[tuple[str, int]] = []  # positional defaults held back until needed
        rendered: list[str] = []
        for k, (fact, index) in enumerate(zip(facts, args, strict=False)):
            arg, arg_name, kwarg_only, scalar_type, memory_format, default = fact
            value = ctx.values[index]
            if scalar_type:
                _check_scalar_type(name, arg, ctx, index)
            literal = ctx.is_literal(index)
            skip = False
            if literal and not isinstance(value, _TENSORISH):
                lit = None if isinstance(value, p.Null) else ctx.literal(index)
                skip = _same(lit, default)
            text = ctx.expr(index)
            if isinstance(value, p.IntList) and literal:
                items = list(ctx.literal(index))
                text = repr(items)
                if not items and name in _ALL_DIMS_WHEN_EMPTY and arg_name == "dim":
                    # no dims: every dim, as None says, which torch parses faster
                    given[index] = None
                    text = "None"
                    skip = _same(None, default)
                elif len(items) == 1 and getattr(arg, "N", None) == 1 and not skip:
                    # an ``int[1]`` (sum's dims, say) takes the int itself, parsed faster
                    given[index] = items[0]
                    text = repr(items[0])
            elif memory_format and literal and isinstance(value, p.Int) and not skip:
                fmt = _MEMORY_FORMATS.get(ctx.literal(index))
                if fmt is not None:
                    given[index] = fmt
                    text = ctx.bind(fmt, "mf")
            rendered.append(text)
            if kwarg_only:
                if not skip:
                    keywords.append(f"{arg_name}={text}")
                    probe.kw[arg_name] = index
                    if k not in out_args:
                        in_keywords.append(f"{arg_name}={text}")
                        in_probe.kw[arg_name] = index
            elif skip:
                pending.append((text, index))
            else:
                for t, i in pending:
                    positional.append(t)
                    probe.pos.append(i)
                    in_probe.pos.append(i)
                pending.clear()
                positional.append(text)
                probe.pos.append(index)
                in_probe.pos.append(index)
        mutates = tuple(i for k in written for i in ctx.tensors_of(args[k]))
        ret_slots = args[nargs:]
        if is_out or not returns or not ret_slots:
            outs = tuple(i for k in out_positions for i in ctx.tensors_of(args[k]))
            alias = _alias_form(ctx, name, rendered, outs)
            if name == "aten::copy.out" and len(outs) == 1:
                alias = _copy_alias(ctx, outs[0])
            pure = only_outs and not seeded and bool(outs)
            single = len(outs) == 1 and all(
                isinstance(ctx.values[a], p.Tensor) for a in (args[k] for k in out_args)
            )
            code = None
            fresh = None
            prune = None
            native: NativeCall | None = None
            fills = None  # a ``*_like`` filling its out in place: reads only its sizes
            gathers = False  # a gather along one dim: its out's sizes follow the index's
            written_only = ctx.only_written(outs, (args[k] for k in in_positions))
            overlap = written_only != outs  # an out is also read (KernelContext.only_written)
            empties = () if overlap else _dynamic(ctx, outs)
            if name == "aten::relu.out" and single:
                f = ctx.bind(_CLAMP_MIN, "op")
                code = f"{emptying(empties)}{f}({rendered[0]}, 0, out=v[{outs[0]}])"
                if isinstance(ctx.values[args[0]], p.Tensor):
                    native = NativeCall(
                        "aten::clamp_min", "out", (Slots((args[0],)), 0, Slots(outs)), empties
                    )
            elif name in _FILLS and single and _fills_in_place(ctx, outs[0], args[nargs - 2]):
                fill = _FILLS[name]
                filler = rendered[fill] if isinstance(fill, int) else fill
                code = f"v[{outs[0]}].fill_({filler})"
                fills = args[0]
            elif name == "aten::embedding.out" and single and _gathers_rows(ctx, outs[0]):
                # embedding's forward is a row gather: straight into out, no temporary
                f = ctx.bind(torch.index_select, "op")
                w, ids, o = rendered[0], rendered[1], outs[0]
                width = _gather_width(ctx) or f"{w}.size(1)"
                code = f"{f}({w}, 0, {ids}.reshape(-1), out=v[{o}].view(-1, {width}))"
                # as a native step, the same row gather into the out (views of the
                # indices and the out made once per load, where both are static), else
                # embedding's own out form: torch's generated one runs that gather (the
                # same kernel, values and errors) into a temporary and copies it
                if not _dynamic(ctx, outs):
                    native = _native_call(ctx, head, args[:nargs], ())
                    native = _native_gather(ctx, args[0], args[1], o, native)
            elif (
                name == "aten::index.Tensor_out"
                and single
                and (along := _gathers_along(ctx)) is not None
            ):
                # one 1-d index: a gather along its dim, which index_select does directly
                f = ctx.bind(_gather_along, "op")
                dim, index = along
                code = f"{emptying(empties)}{f}({rendered[0]}, {dim}, v[{index}], v[{outs[0]}])"
                gathers = True
            elif single and (into := _written_in_place(ctx, name, rendered, outs[0])):
                code = into
            elif generated and alias is not None and single and "," not in alias.code.split("=")[0]:
                view = alias.code.split(" = ", 1)[1]
                code = _copy_code(ctx, outs[0], view, alias.env)
            elif (
                by_functional
                and functional is not None
                and all(isinstance(ctx.values[args[k]], p.Tensor) for k in out_args)
            ):
                fast_f = fastest_entry(functional, in_probe, functional_head)
                ff = ctx.bind(
                    fast_f if fast_f is not None else getattr(functional, "_op", functional), "op"
                )
                call = f"{ff}({', '.join(positional + in_keywords)})"
                if single:
                    code = _copy_code(ctx, outs[0], call, {})
                    fresh = call if empties else None
                else:
                    store = ctx.bind(_store_all, "store")
                    # one result left (the others pruned): copied without a loop
                    one = {o: _copy_code(ctx, o, f"{call}[{k}]", {}) for k, o in enumerate(outs)}

                    def stored(
                        dead: frozenset[int],
                        store: str = store,
                        call: str = call,
                        one: dict[int, str] = one,
                        outs: tuple[int, ...] = outs,
                    ) -> str:  # no closure: a function of its arguments alone
                        live = [o for o in outs if o not in dead]
                        if len(live) == 1:
                            return one[live[0]]
                        targets = ", ".join("None" if o in dead else f"v[{o}]" for o in outs)
                        return f"{store}(({targets},), {call})"

                    code, prune = stored(frozenset()), stored
            if code is None:
                fast = fastest_entry(overload, probe, head)
                fn = ctx.bind(fast if fast is not None else generic, "op")
                code = f"{emptying(empties)}{fn}({', '.join(positional + keywords)})"
                native = _native_call(ctx, head, args[:nargs], empties) if pure else None
                # (for outs of dynamic shape alone: the fast call hands only those over)
                form = same_kernel if empties else None
                form_head = same_kernel_head
                if empties and name == "aten::linear.out" and _linear_is_one_product(ctx):
                    form, form_head = torch.ops.aten.linear.default, None
                if single and pure and form is not None:
                    fast_f = fastest_entry(form, in_probe, form_head)
                    ff = ctx.bind(
                        fast_f if fast_f is not None else getattr(form, "_op", form), "op"
                    )
                    fresh = f"{ff}({', '.join(positional + in_keywords)})"
            if overlap:  # only what it does not read is an out; nothing is proven of it
                outs = written_only
                pure = False
                alias = fresh = prune = native = None
                empties = ()
            # sized: writes only its outs, and torch does not say their sizes depend on
            # what the op reads
            sized = (by_arguments or gathers) and only_outs and set(mutates) == set(outs)
            if not code.startswith(emptying(empties)) or not sized:
                empties = ()  # not emptied by its first lines, or sized by what it reads
            st = ctx.emit(
                code,
                mutates=mutates,
                alias=alias,
                outs=outs,
                pure=pure,
                prune=prune,
                sized=sized,
                empties=empties,
                fresh=fresh,
                native=native if set(mutates) == set(outs) else None,
            )
            if fills is not None and st.reads is not None:
                # the fill reads no element of ``self`` (its sizes are fixed): with a fixed
                # value it may run once, at load
                st = dataclasses.replace(st, reads=tuple(r for r in st.reads if r != fills))
            return st
        fast = fastest_entry(overload, probe, head)
        fn = ctx.bind(fast if fast is not None else generic, "op")
        callargs = ", ".join(positional + keywords)
        if len(returns) == 1:
            slot = ret_slots[0]
            if isinstance(ctx.values[slot], p.TensorList):
                raise UnsupportedKernel(f"{name}: a list return is not supported")
            # sized: an in-place op writing only its ``self``, of sizes torch does not say
            # depend on what the op reads
            sized = in_place and by_arguments and mutates == tuple(ctx.tensors_of(args[0]))
            return ctx.emit(
                f"v[{slot}] = {fn}({callargs})", writes=(slot,), mutates=mutates, sized=sized
            )
        slot = ret_slots[0]
        value = ctx.values[slot]
        if not isinstance(value, p.TensorList) or len(value.items) != len(returns):
            raise UnsupportedKernel(f"{name}: cannot map {len(returns)} returns to value {slot}")
        targets = ", ".join(f"v[{i}]" for i in value.items)
        return ctx.emit(f"{targets}, = {fn}({callargs})", writes=value.items, mutates=mutates)

    return factory


def _native_call(
    ctx: KernelContext, head: tuple[str, str], args: Sequence[int], empties: tuple[int, ...]
) -> NativeCall | None:
    """The statement as one call of the overload ``head`` (:func:`schema_head`) with the
    values ``args`` (one per argument of its schema), emptying ``empties`` first, when
    every one is a tensor or tensor list of the values table or fixed at load, and the
    operator is one of torch's own (``aten``); else None."""
    if not head[0].startswith("aten::"):
        return None
    given: list[Any] = []
    for index in args:
        value = ctx.values[index]
        if isinstance(value, p.Tensor):
            given.append(Slots((index,)))
        elif isinstance(value, p.TensorList):
            given.append(Slots(tuple(value.items), single=False))
        elif isinstance(value, p.Null):
            given.append(None)
        elif isinstance(value, _TENSORISH) or not ctx.is_literal(index):
            return None  # optional tensor lists; a scalar an instruction computes
        else:
            literal = ctx.literal(index)
            given.append(list(literal) if isinstance(literal, tuple) else literal)
    return NativeCall(head[0], head[1], tuple(given), empties)


# reductions whose ``dim`` reduces every dim when it is empty, as when it is None (the same
# kernel, the same dims: the results are the same bits)
_ALL_DIMS_WHEN_EMPTY = frozenset({"aten::sum.IntList_out", "aten::mean.out", "aten::nansum.out"})


def _writes_alias(arg: Any) -> bool:
    """The schema argument (or return) is written through an alias (``Tensor(a!)``)."""
    info = arg.alias_info
    return info is not None and bool(info.is_write)


_CACHE: dict[str, KernelFactory | None] = {}


def _resolve(qualified_name: str) -> KernelFactory | None:
    if qualified_name not in _CACHE:
        overload = resolve_overload(qualified_name)
        _CACHE[qualified_name] = None if overload is None else schema_kernel(overload)
    return _CACHE[qualified_name]


def torch_operator_names(namespace: str | None = None) -> list[str]:
    """The operators torch's dispatcher has now (those of ``namespace``, or of every
    namespace but ``aten`` when None), spelled ``ns::op.overload`` (bare for a default
    overload): what :func:`resolve_overload` finds. Ops registered later with
    ``torch.library`` appear once registered."""
    names = torch._C._dispatch_get_all_op_names()
    if namespace is None:
        return [n for n in names if not n.startswith("aten::")]
    prefix = f"{namespace}::"
    return [n for n in names if n.startswith(prefix)]


register_namespace("aten", _resolve, lambda: torch_operator_names("aten"))
# any other op torch has (e.g. a user's torch.library op)
register_namespace("*", _resolve, torch_operator_names)
