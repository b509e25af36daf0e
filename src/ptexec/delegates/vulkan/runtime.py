"""A Vulkan graph as torch code: each operator call one statement calling its ATen op.

:func:`build_runner` turns a validated payload into one generated Python function
``_vulkan_run(x0, x1, ...)`` over the delegate call's arguments (inputs, then outputs):
inputs are converted to the payload's datatypes, each op of the chain is one line calling
the ATen op the payload names with the arguments it serialized (scalars and lists bound
as named constants, never pasted into the source), and each output is resized (within
what the program declares) and written in place.

Arithmetic follows the Vulkan backend where it is not ATen's float32:

- values carry the payload's datatypes: the exporter narrows int64 to int32 and float64 to
  float32 (and, with ``force_fp16``, float32 to float16), so integer arithmetic wraps at
  32 bits and indices are int32, as on the GPU; results are converted back to the program's
  dtypes when they are written out;
- an op whose dtype argument the exporter wrote as null (``_to_copy``, ``full``,
  ``full_like``, ``arange``) is called with the output's datatype, so it computes in it
  (a float fill of an integer tensor's ``full_like`` is the float, as in eager), float32
  for a half output, converted after (a fill past half's range is its infinity);
- the weight-only int8 linear multiplies the float input by the int8 weights and then by
  the per-channel scales (``(x @ w.T) * s``), as the shader does, rather than dequantizing
  the weights first;
- the GPU representation (storage type, texel packing, shared memory objects) changes no
  result: packing pads to whole texels, and the shaders read only the logical elements.

At build time the graph is also run on meta tensors: every value's dims must be the
serialized ones (exactly when every input shape is static; the rank otherwise), every
argument's kind must fit the op's schema, and a value the op cannot be computed from is
a :class:`~ptexec.errors.PteFormatError` naming the op.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...codegen import Sources
from ...errors import BackendUnavailableError, PteFormatError
from ...memory import resize_to
from ...readonly import from_buffer
from . import schema as s
from .ops import OPS

__all__ = ["VK_DTYPES", "ArgInfo", "OutputShapeError", "VulkanRunner", "build_runner"]

VK_DTYPES: dict[int, torch.dtype] = {
    0: torch.bool,
    1: torch.uint8,
    2: torch.int8,
    3: torch.int32,
    4: torch.float16,
    5: torch.float32,
    6: torch.float64,
    7: torch.int64,
}

# payload datatype -> the program dtypes its external tensors may have
EXTERNAL_DTYPES: dict[torch.dtype, tuple[torch.dtype, ...]] = {
    torch.float32: (torch.float32, torch.float64),
    torch.float16: (torch.float16, torch.float32),
    torch.int32: (torch.int32, torch.int64),
    torch.int64: (torch.int64,),
    torch.float64: (torch.float64,),
    torch.bool: (torch.bool,),
    torch.uint8: (torch.uint8,),
    torch.int8: (torch.int8,),
}

_SYM: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "floordiv": operator.floordiv,
    "lt": operator.lt,
    "gt": operator.gt,
    "ge": operator.ge,
    "le": operator.le,
    "eq": operator.eq,
}

# dim-order copies: (name, keyword-only arguments after self)
_DIM_ORDER = {
    "dim_order_ops._to_dim_order_copy.default": (
        "dtype",
        "layout",
        "device",
        "pin_memory",
        "non_blocking",
        "dim_order",
    ),
    "dim_order_ops._clone_dim_order.default": ("non_blocking", "dim_order"),
}


@dataclass(frozen=True, slots=True)
class ArgInfo:
    """What the method says about one delegate argument: its dtype and sizes, and whether
    they are exact (``static``) or an upper bound on each dim (``bounded``); ``scalar``:
    an integer value (a symbolic integer input), not a tensor; ``dim_order``: the layout
    its memory keeps when it is resized (empty: the default order)."""

    dtype: torch.dtype
    sizes: tuple[int, ...]
    static: bool = True
    bounded: bool = False
    scalar: bool = False
    dim_order: tuple[int, ...] = ()


class OutputShapeError(RuntimeError):
    """The graph computed an output the program's output tensor cannot hold (the method
    reports it as an :class:`~ptexec.errors.ExecutionError` of the delegate call)."""


def _resize(x: torch.Tensor, shape: Sequence[int], arg: ArgInfo, k: int) -> None:
    """Resize output ``x`` (delegate argument ``k``) to the computed ``shape`` when the
    program allows it: a static output keeps its sizes, a bounded one stays in its bound."""
    shape = tuple(int(d) for d in shape)
    declared = f"{str(arg.dtype).removeprefix('torch.')}{list(arg.sizes)}"
    if len(shape) != len(arg.sizes):
        raise OutputShapeError(
            f"delegate argument {k}: the graph computed {list(shape)} for a {declared} output"
        )
    if arg.static:
        raise OutputShapeError(
            f"delegate argument {k}: the graph computed {list(shape)}, the program declares "
            f"{declared}"
        )
    if arg.bounded and any(a > b for a, b in zip(shape, arg.sizes, strict=True)):
        raise OutputShapeError(
            f"delegate argument {k}: the graph computed {list(shape)}, beyond the bound {declared}"
        )
    # the program's dim order, as every other resize of a method's tensor keeps it
    order = arg.dim_order if len(arg.dim_order) == len(shape) else tuple(range(len(shape)))
    try:
        resize_to(x, shape, order)
    except RuntimeError:
        x.resize_(math.prod(shape))
        resize_to(x, shape, order)


def _int8_weight_linear(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``_weight_int8pack_mm`` as the Vulkan shader computes it: the float input times the
    int8 weights (``[out, in]``), accumulated in the input's type, then the per-output-channel
    scales."""
    return torch.matmul(x, w.to(x.dtype).t()) * scales.to(x.dtype)


def _conv_with_clamp(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    lo: float | None,
    hi: float | None,
) -> torch.Tensor:
    y = torch.ops.aten.convolution.default(
        x, w, b, stride, padding, dilation, transposed, output_padding, groups
    )
    if y.is_floating_point():
        # a bound past the dtype's range (a relu's upper bound is float32's largest
        # value) is the infinity it becomes in that dtype, as in Vulkan's half shaders
        top = torch.finfo(y.dtype).max
        lo, hi = (
            None if v is None else (math.copysign(math.inf, v) if abs(v) > top else v)
            for v in (lo, hi)
        )
    return torch.clamp(y, lo, hi)


# custom ops: name -> (function, the schema type of each argument)
_CUSTOM: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "aten._weight_int8pack_mm.default": (_int8_weight_linear, ("Tensor", "Tensor", "Tensor")),
    "et_vk.conv_with_clamp.default": (
        _conv_with_clamp,
        (
            "Tensor",
            "Tensor",
            "Optional[Tensor]",
            "List[int]",
            "List[int]",
            "List[int]",
            "bool",
            "List[int]",
            "int",
            "Optional[Scalar]",
            "Optional[Scalar]",
        ),
    ),
}

_ENV: dict[str, Any] = {"torch": torch, "_resize": _resize, "_now": time.perf_counter_ns}


class VulkanRunner:
    """A prepared Vulkan graph: ``runner(*args)`` runs it on the delegate call's arguments
    (inputs then outputs) and writes the outputs in place. :meth:`run_nodes` runs the same
    statements and reports each op's time."""

    def __init__(
        self,
        fn: Callable[..., None],
        source: str,
        ext_ids: tuple[int, ...],
        output_ids: tuple[int, ...],
        op_counts: dict[str, int],
        timed: Callable[..., None],
    ) -> None:
        self.fn = fn
        self.source = source
        self.ext_ids = ext_ids  # the delegate call arguments it takes, in order
        self.output_ids = output_ids  # those of them it writes
        self.op_counts = op_counts
        self._timed = timed

    def run_nodes(self, report: Callable[[str, int, int], None], *args: Any) -> None:
        """Run the graph as ``runner(*args)`` does, calling ``report(name, start, end)``
        after each op (``aten.linear.default #1``)."""
        self._timed(report, *args)

    def __call__(self, *args: Any) -> None:
        self.fn(*args)

    def __repr__(self) -> str:
        return f"VulkanRunner({sum(self.op_counts.values())} ops, arguments {list(self.ext_ids)})"


def _type_name(arg: Any) -> str:
    """A schema argument's type as text (``number`` is a Scalar)."""
    return str(getattr(arg, "real_type", arg.type)).replace("number", "Scalar")


class _Builder:
    def __init__(
        self,
        payload: s.VkPayload,
        named_data: Mapping[str, memoryview],
        args: Sequence[ArgInfo | None],
        device: torch.device,
    ) -> None:
        self.p = payload
        self.g = payload.graph
        self.named_data = named_data
        self.args = args
        self.device = device
        self.env: dict[str, Any] = dict(_ENV)
        self.lines: list[str] = []
        self.spans: list[tuple[str, int, int]] = []
        self.expr: dict[int, str] = {}
        self.meta: dict[int, Any] = {}  # value id -> its meta tensor / int (None: unknown)
        self.static = all(a is None or a.static or a.scalar for a in args)
        # values something reads: the others (the unused extra outputs of batch norm,
        # whose dims the exporter writes as 0) are not checked
        self.used = set(self.g.output_ids)
        for op in self.g.chain:
            for vid in op.args[:-1]:
                self.used.add(vid)
                value = self.g.values[vid]
                if value.kind == "value_list":
                    self.used.update(int(i) for i in value.items)
        self._n = 0

    # -- helpers -------------------------------------------------------------------------
    def bind(self, obj: Any, prefix: str = "_k") -> str:
        self._n += 1
        name = f"{prefix}{self._n}"
        self.env[name] = obj
        return name

    def fail(self, op: s.VkOp, message: str, j: int | None = None) -> PteFormatError:
        at = f"{self.p.path}.chain[{op.index}]" + (f".args[{j}]" if j is not None else "")
        return PteFormatError(at, f"{op.name}: {message}")

    def tensor(self, vid: int) -> s.VkTensor:
        t = self.g.values[vid].tensor
        assert t is not None
        return t

    def constant(self, vid: int) -> str:
        t = self.tensor(vid)
        entry = self.g.constants[t.constant_id]
        dtype = VK_DTYPES[t.datatype]
        if entry.length == 0:
            value = torch.empty(t.dims, dtype=dtype)
        else:
            if entry.offset == s.NAMED_OFFSET:
                assert entry.named_key is not None
                mv = memoryview(self.named_data[entry.named_key]).cast("B")[: entry.length]
            else:
                mv = self.p.constant_region()[entry.offset : entry.offset + entry.length]
            raw = from_buffer(mv)  # read-only: never written
            if raw.data_ptr() % dtype.itemsize:
                raw = raw.clone()
            value = raw.view(dtype).reshape(t.dims)
        value = value.to(self.device)
        name = self.bind(value, "_c")
        self.meta[vid] = value.to("meta")
        return name

    def read(self, vid: int) -> str:
        """The expression of value ``vid`` (a constant is bound on first use)."""
        e = self.expr.get(vid)
        if e is None:
            e = self.expr[vid] = self.constant(vid)
        return e

    def emit(self, line: str) -> None:
        self.lines.append(line)

    # -- arguments -----------------------------------------------------------------------
    def argument(self, op: s.VkOp, j: int, vid: int, type_name: str) -> tuple[str, Any]:
        """(expression, meta value) of serialized argument ``j`` for a schema type."""
        value = self.g.values[vid]
        kind = value.kind
        optional = type_name.startswith("Optional[")
        inner = type_name[len("Optional[") : -1] if optional else type_name
        if kind == "null":
            if inner == "Device":
                return self.bind(self.device), torch.device("meta")
            if optional or inner in ("ScalarType", "Layout", "MemoryFormat", "Generator"):
                return "None", None
            raise self.fail(op, f"a null value where the op takes {type_name}", j)
        if inner == "Tensor":
            if kind != "tensor":
                raise self.fail(op, f"a {kind} value where the op takes a tensor", j)
            return self.read(vid), self.meta.get(vid)
        if inner in ("int", "SymInt"):
            if kind == "int" or (kind == "double" and float(value.scalar or 0).is_integer()):
                # the exporter keeps one value per number, 2 and 2.0 alike: an int argument
                # may name the double another op's argument made (ExecuTorch's Vulkan
                # runtime reads either as an int)
                return self.bind(int(value.scalar or 0)), int(value.scalar or 0)
            if kind == "symint":
                return self.expr[vid], self.meta.get(vid)
        elif inner == "float":
            if kind in ("double", "int"):
                x = float(value.scalar or 0)
                return self.bind(x), x
        elif inner == "bool":
            if kind == "bool":
                return self.bind(bool(value.scalar)), bool(value.scalar)
        elif inner == "Scalar":
            if kind in ("int", "double", "bool"):
                return self.bind(value.scalar), value.scalar
            if kind == "symint":
                return self.expr[vid], self.meta.get(vid)
        elif inner == "str":
            if kind == "string":
                return self.bind(value.scalar), value.scalar
        elif inner in ("List[int]", "List[SymInt]") or inner.startswith("int["):
            if kind == "int_list":
                items = [int(i) for i in value.items]
                return self.bind(items), items
            if kind == "value_list":
                return self._value_list(op, j, value, ("int", "symint"))
        elif inner == "List[float]":
            if kind in ("double_list", "int_list"):
                items_f = [float(i) for i in value.items]
                return self.bind(items_f), items_f
        elif inner == "List[bool]" or inner.startswith("bool["):
            if kind == "bool_list":
                items_b = [bool(i) for i in value.items]
                return self.bind(items_b), items_b
        elif inner == "List[Tensor]":
            if kind == "value_list":
                return self._value_list(op, j, value, ("tensor",))
        elif inner == "List[Optional[Tensor]]":
            if kind == "value_list":
                return self._value_list(op, j, value, ("tensor", "null"))
        else:
            raise BackendUnavailableError(
                f"Vulkan payload {self.p.path}: {op.name} takes a {type_name} argument"
            )
        raise self.fail(op, f"a {kind} value where the op takes {type_name}", j)

    def _value_list(
        self, op: s.VkOp, j: int, value: s.VkValue, kinds: tuple[str, ...]
    ) -> tuple[str, Any]:
        exprs: list[str] = []
        metas: list[Any] = []
        for item in value.items:
            v = self.g.values[int(item)]
            if v.kind not in kinds:
                expected = " or ".join(kinds)
                raise self.fail(
                    op, f"a list holding a {v.kind} value (value {v.index}) of {expected} items", j
                )
            if v.kind == "null":
                exprs.append("None")
                metas.append(None)
            elif v.kind == "int":
                exprs.append(self.bind(int(v.scalar or 0)))
                metas.append(int(v.scalar or 0))
            elif v.kind == "symint":
                exprs.append(self.expr[v.index])
                metas.append(self.meta.get(v.index))
            else:
                exprs.append(self.read(v.index))
                metas.append(self.meta.get(v.index))
        return "[" + ", ".join(exprs) + ("," if len(exprs) == 1 else "") + "]", metas

    # -- the graph -----------------------------------------------------------------------
    def inputs(self) -> None:
        g = self.g
        n_in, n_out = len(g.input_ids), len(g.output_ids)
        if len(self.args) != n_in + n_out:
            why = (
                "ExecuTorch's Vulkan serializer leaves out a call input that no op reads"
                if len(self.args) > n_in + n_out
                else "ExecuTorch's Vulkan exporter keeps a buffer the program updates in "
                "place in the payload, its update an output of the payload but not of the "
                "call: lower such an update outside the delegate"
            )
            raise PteFormatError(
                f"{self.p.path}.input_ids",
                f"{n_in} inputs and {n_out} outputs, but the delegate call has "
                f"{len(self.args)} arguments, so which argument is which cannot be told, "
                f"as ExecuTorch's Vulkan runtime would take them by position ({why})",
            )
        for k, vid in enumerate(g.input_ids):
            a = self.args[k]
            value = g.values[vid]
            where = f"{self.p.path}.input_ids[{k}]"
            if value.kind == "symint":
                if a is None or not a.scalar:
                    raise PteFormatError(where, "a symbolic integer bound to a tensor argument")
                self.expr[vid] = name = f"s{vid}"
                self.emit(f"{name} = int(x{k})")
                self.meta[vid] = a.sizes[0] if a.sizes else 1
                continue
            t = value.tensor
            assert t is not None
            self._check_external(t, a, where, k)
            assert a is not None
            dtype = VK_DTYPES[t.datatype]
            name = self.expr[vid] = f"t{vid}"
            self.emit(f"{name} = x{k}" if a.dtype == dtype else f"{name} = x{k}.to({dtype})")
            self.meta[vid] = torch.empty(t.dims, dtype=dtype, device="meta")

    def _check_external(self, t: s.VkTensor, a: ArgInfo | None, where: str, k: int) -> None:
        if a is None or a.scalar:
            raise PteFormatError(where, f"a tensor bound to delegate argument {k}, not a tensor")
        dtype = VK_DTYPES[t.datatype]
        if a.dtype not in EXTERNAL_DTYPES[dtype]:
            raise PteFormatError(
                where, f"a {t.dtype_name} value bound to a {str(a.dtype)[6:]} tensor (argument {k})"
            )
        sizes = tuple(a.sizes)
        dims = t.dims
        if len(sizes) != len(dims) or (a.static and sizes != dims):
            raise PteFormatError(
                where, f"dims {list(dims)}, but argument {k} is {str(a.dtype)[6:]}{list(sizes)}"
            )

    def op(self, op: s.VkOp) -> None:
        spec = OPS[op.name]
        *reads, out = op.args
        if spec.kind == "none":
            return
        if spec.kind == "prepack":
            if len(reads) != 1 or self.g.values[reads[0]].kind != "tensor":
                raise self.fail(op, f"takes one tensor, got {len(reads)} arguments")
            self._finish(op, out, self.read(reads[0]), self.meta.get(reads[0]))
            return
        if spec.kind == "sym":
            self._sym(op, reads, out)
            return
        fn, types, kw = self._target(op, spec.kind)
        if len(reads) != len(types):
            raise self.fail(op, f"{len(reads)} arguments, the op takes {len(types)}")
        exprs: list[str] = []
        metas: list[Any] = []
        for j, (vid, type_name) in enumerate(zip(reads, types, strict=True)):
            if kw[j] == "dtype" and self.g.values[vid].kind == "null":
                e, m = self._output_dtype(out)
            else:
                e, m = self.argument(op, j, vid, type_name)
            metas.append(m)
            if kw[j] != "_skip":
                exprs.append(f"{kw[j]}={e}" if kw[j] else e)
        call_name = self.bind(fn, "_op")
        self._finish(
            op, out, f"{call_name}({', '.join(exprs)})", self._meta_call(op, fn, metas, kw)
        )

    def _output_dtype(self, out: int) -> tuple[str, Any]:
        """(expression, meta value) of a ``dtype`` argument the exporter wrote as null: the
        output value's datatype, so the op computes in it (``full_like(int_x, 0.5,
        dtype=float)`` fills 0.5, where filling ``int_x``'s type and converting gives 0);
        None when the output is not one tensor. A half output is computed in float32 and
        converted: a value past half's range is its infinity, as in Vulkan's half shaders
        (``force_fp16``'s ``full_like(x, -1e9)``), where ATen refuses it."""
        t = self.g.values[out].tensor
        if t is None:
            return "None", None
        dtype = VK_DTYPES[t.datatype]
        if dtype == torch.float16:
            dtype = torch.float32
        return self.bind(dtype), dtype

    def _target(
        self, op: s.VkOp, kind: str
    ) -> tuple[Callable[..., Any], tuple[str, ...], tuple[str | None, ...]]:
        """The callable, its argument types and each one's keyword (None: positional)."""
        if kind == "custom":
            fn, types = _CUSTOM[op.name]
            return fn, types, (None,) * len(types)
        if kind == "dim_order":
            names = _DIM_ORDER[op.name]
            types = ("Tensor", "Optional[ScalarType]", "Optional[Layout]", "Optional[Device]")
            if "dtype" not in names:
                types = ("Tensor",)
                return (
                    torch.clone,
                    (*types, "bool", "Optional[List[int]]"),
                    (None, "_skip", "_skip"),
                )
            return (
                torch.ops.aten._to_copy.default,
                (*types, "Optional[bool]", "bool", "Optional[List[int]]"),
                (None, "dtype", "layout", "device", "pin_memory", "non_blocking", "_skip"),
            )
        _, name, overload = op.name.split(".")
        packet = getattr(torch.ops.aten, name, None)
        target = getattr(packet, overload, None) if packet is not None else None
        if target is None:
            raise BackendUnavailableError(
                f"Vulkan payload {self.p.path}: torch has no ATen op {op.name}"
            )
        schema_args = target._schema.arguments
        types = tuple(_type_name(a) for a in schema_args)
        kws = tuple(a.name if a.kwarg_only else None for a in schema_args)
        return target, types, kws

    def _meta_call(
        self, op: s.VkOp, fn: Callable[..., Any], metas: list[Any], kw: tuple[str | None, ...]
    ) -> Any:
        args = [m for m, k in zip(metas, kw, strict=True) if k is None]
        kwargs = {k: m for m, k in zip(metas, kw, strict=True) if k is not None and k != "_skip"}
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            return None  # no meta kernel: the shapes are checked when it runs
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            raise self.fail(
                op, f"cannot be computed from its arguments ({_first_line(e)})"
            ) from None

    def _sym(self, op: s.VkOp, reads: list[int], out: int) -> None:
        if self.g.values[out].kind != "symint":
            raise self.fail(op, "writes a symbolic integer into a non-symint value")
        if op.name == "sym_size.int":
            if len(reads) != 2:
                raise self.fail(op, f"{len(reads)} arguments, the op takes 2")
            x, xm = self.argument(op, 0, reads[0], "Tensor")
            d, dm = self.argument(op, 1, reads[1], "int")
            rank = len(self.tensor(reads[0]).dims)
            if not -rank <= int(dm) < rank:
                raise self.fail(op, f"dim {dm} out of range for a {rank}-d tensor", 1)
            self.expr[out] = name = f"s{out}"
            self.emit(f"{name} = {x}.size({d})")
            self.meta[out] = int(xm.shape[dm]) if isinstance(xm, torch.Tensor) else None
            return
        if len(reads) != 2:
            raise self.fail(op, f"{len(reads)} arguments, the op takes 2")
        a, am = self.argument(op, 0, reads[0], "int")
        b, bm = self.argument(op, 1, reads[1], "int")
        fn = self.bind(_SYM[op.name], "_sym")
        self.expr[out] = name = f"s{out}"
        self.emit(f"{name} = {fn}({a}, {b})")
        if op.name == "floordiv" and bm == 0:
            raise self.fail(op, "divides by zero", 1)
        self.meta[out] = None if am is None or bm is None else _SYM[op.name](am, bm)

    def _finish(self, op: s.VkOp, out: int, call: str, meta: Any) -> None:
        """Assign the op's result to its output value(s), converted to their datatypes,
        and check the dims it computes on meta tensors."""
        value = self.g.values[out]
        if value.kind == "value_list":
            r = f"r{op.index}"
            self.emit(f"{r} = {call}")
            results = list(meta) if isinstance(meta, tuple | list) else None
            items = [int(i) for i in value.items]
            if results is not None and len(results) != len(items):
                raise self.fail(
                    op, f"computes {len(results)} outputs, the payload names {len(items)}"
                )
            for j, vid in enumerate(items):
                if vid not in self.used:  # an extra output nothing reads (pool indices)
                    self.meta[vid] = None if results is None else results[j]
                    continue
                self._assign(op, vid, f"{r}[{j}]", None if results is None else results[j])
            return
        if isinstance(meta, tuple):
            # ops returning several tensors (native_layer_norm, max_pool2d_with_indices)
            # whose payload keeps only the first
            call, meta = f"{call}[0]", meta[0]
        self._assign(op, out, call, meta)

    def _assign(self, op: s.VkOp, vid: int, src: str, meta: Any) -> None:
        value = self.g.values[vid]
        if value.kind == "symint":
            self.expr[vid] = name = f"s{vid}"
            self.emit(f"{name} = int({src})")
            self.meta[vid] = int(meta) if isinstance(meta, int | torch.SymInt) else None
            return
        t = self.tensor(vid)
        dtype = VK_DTYPES[t.datatype]
        name = self.expr[vid] = f"t{vid}"
        if isinstance(meta, torch.Tensor):
            got = tuple(int(d) for d in meta.shape)
            wrong = (self.static and got != t.dims) or len(got) != len(t.dims)
            if wrong and vid in self.used:
                raise self.fail(
                    op,
                    f"computes dims {list(got)} for value {vid}, the payload says {list(t.dims)}",
                )
            if meta.dtype != dtype:
                src = f"{src}.to({dtype})"
            self.meta[vid] = meta.to(dtype)
        else:
            src = f"{src}.to({dtype})"
            self.meta[vid] = torch.empty(t.dims, dtype=dtype, device="meta")
        self.emit(f"{name} = {src}")

    def outputs(self) -> list[int]:
        n_in = len(self.g.input_ids)
        ks = []
        for j, vid in enumerate(self.g.output_ids):
            k = n_in + j
            a = self.args[k]
            t = self.tensor(vid)
            where = f"{self.p.path}.output_ids[{j}]"
            self._check_external(t, a, where, k)
            assert a is not None
            m = self.meta.get(vid)
            if isinstance(m, torch.Tensor) and (a.static or a.bounded):
                got = tuple(m.shape)
                fits = (
                    got == a.sizes
                    if a.static
                    else all(x <= y for x, y in zip(got, a.sizes, strict=True))
                )
                if not fits and self.static:
                    raise PteFormatError(
                        where,
                        f"the graph computes {list(got)}; argument {k} is "
                        f"{str(a.dtype)[6:]}{list(a.sizes)}",
                    )
            src = self.read(vid)
            info = self.bind(a, "_a")
            x = f"x{k}"
            if not a.sizes:
                self.emit(f"{x}.copy_({src}.reshape(()))")
            else:
                self.emit(f"if {x}.shape != {src}.shape:")
                self.emit(f"    _resize({x}, {src}.shape, {info}, {k})")
                self.emit(f"{x}.copy_({src})")
            ks.append(k)
        return ks

    def build(self) -> VulkanRunner:
        self.inputs()
        self.spans.append(("inputs", 0, len(self.lines)))
        counts: dict[str, int] = {}
        for op in self.g.chain:
            counts[op.name] = counts.get(op.name, 0) + 1
            first = len(self.lines)
            self.op(op)
            self.spans.append((f"{op.name} #{counts[op.name]}", first, len(self.lines)))
        first = len(self.lines)
        out_ks = self.outputs()
        self.spans.append(("outputs", first, len(self.lines)))
        params = ", ".join(f"x{k}" for k in range(len(self.args)))
        body = self.lines or ["pass"]
        source = f"def _vulkan_run({params}):\n" + "".join(f"    {ln}\n" for ln in body)
        timed_lines: list[str] = []
        for name, a, b in self.spans:
            if a == b:
                continue
            label = self.bind(name, "_n")
            timed_lines.append("_t0 = _now()")
            timed_lines.extend(self.lines[a:b])
            timed_lines.append(f"_report({label}, _t0, _now())")
        timed = f"def _vulkan_nodes(_report{', ' if params else ''}{params}):\n" + "".join(
            f"    {ln}\n" for ln in timed_lines or ["pass"]
        )
        sources = Sources(f"vulkan {self.p.path}")
        fn = sources.function(source, "graph", "_vulkan_run", self.env)
        timed_fn = sources.function(timed, "graph, timed per op", "_vulkan_nodes", self.env)
        return VulkanRunner(
            fn, source, tuple(range(len(self.args))), tuple(out_ks), counts, timed_fn
        )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def build_runner(
    payload: s.VkPayload,
    named_data: Mapping[str, memoryview],
    args: Sequence[ArgInfo | None],
    device: torch.device | str = "cpu",
    traced: bool = False,
) -> VulkanRunner:
    """Validate the payload against the delegate call's arguments (``args``, None: not a
    tensor or integer) and compile its chain for ``device``; ``traced``: the code is to be
    traced by the compiled tier (outputs are not resized)."""
    s.validate_payload(payload, named_data)
    with torch.no_grad():
        builder = _Builder(payload, named_data, args, torch.device(device))
        if traced:  # the compiled tier collects outputs where the code writes them
            builder.env["_resize"] = _no_resize
        return builder.build()


def _no_resize(*_: Any) -> None:
    """Stands for :func:`_resize` while the code is traced (the compiled tier checks and
    sizes its outputs itself)."""
