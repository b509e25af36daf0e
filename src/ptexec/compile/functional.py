"""A method's instructions as functional torch code: what each one computes, with no memory.

The interpreter runs an instruction by writing into the memory the plan gave its outputs
(``torch.add(a, b, out=v[7])``). To compile a run of instructions, the same computation is
needed as a function of values: ``v7 = torch.add(a, b)``. :class:`Rebuild` gives it, one
instruction at a time, on an :class:`Env` (value index -> the traced tensor, symbolic
integer or Python value it holds), so that tracing a run of instructions with
``torch.export`` yields a functional graph:

- ATen out variants call the functional overload of the same operator whose arguments
  are the out variant's others (``add.out`` -> ``add.Tensor``; factory ops such as
  ``full.out`` get the out tensor's dtype and device); a result of another dtype than the
  program's out tensor is converted to it, as writing into the out tensor would. In-place
  ATen ops (``copy_``) call their functional form and the result replaces the value;
- ``executorch_prim::`` scalar ops and ``sym_size``/``sym_numel`` run the interpreter's own
  bodies (:data:`ptexec.kernels.prim.PRIM_OPS`, their traced form) on the (possibly
  symbolic) values; ``sym_stride`` reads the program's dim order;
- ``dim_order_ops::`` copies convert the dtype (the layout is the memory's business, kept
  when a value is written back); ``et_view`` is a reshape; ``et_copy`` a device move;
- ``quantized_decomposed::`` and ``llama::`` ops call the functions the interpreter's
  kernels are made of (:mod:`ptexec.kernels.quantized`, :mod:`ptexec.kernels.llm`), with
  trace-safe versions where those test data at run time (a bounds check on an index, a
  branch on whether a scale is tiny); an op that updates a cache in place updates the
  value it is given (a compiled region's state is then written in place) or a copy;
- an XNNPACK delegate runs the torch code its payload was compiled to
  (:mod:`ptexec.delegates.xnnpack.runtime`), traced like everything else, so that fusion
  crosses the delegate's boundary; its outputs are taken from where the code writes them.
  A Vulkan delegate the same way (:mod:`ptexec.delegates.vulkan.runtime`).

:meth:`Rebuild.reason` says why an instruction cannot be rebuilt (then it is interpreted).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

import torch

from ..delegates.vulkan.backend import runner_for as vulkan_runner_for
from ..delegates.xnnpack.runtime import ArgInfo, build_runner
from ..delegates.xnnpack.schema import decode_payload
from ..dtypes import CODE_TO_DTYPE
from ..format import program as p
from ..kernels import llm, quantized
from ..kernels.aten import resolve_overload
from ..kernels.fixed_args import to_dtype
from ..kernels.prim import PRIM_OPS
from ..tensor import dim_order_strides

if TYPE_CHECKING:
    from ..engine.state import MethodState
    from ..program import Program

__all__ = ["Env", "Rebuild", "RebuildError"]

_torch: Any = torch  # symbolic-integer helpers torch does not annotate


class RebuildError(Exception):
    """An instruction that has no functional form here (its message says why)."""


class Env:
    """The values of a traced run: ``env[j]`` for value ``j``, with the method's literals
    and constants behind it. ``frozen``: ids of tensors an op must not update in place
    (inputs of the traced region whose memory the region does not write itself): an op
    that mutates one updates a copy instead."""

    def __init__(self, read_constant: Callable[[int], Any]) -> None:
        self.values: dict[int, Any] = {}
        self.read_constant = read_constant
        self.frozen: set[int] = set()

    def __contains__(self, j: int) -> bool:
        return j in self.values

    def __getitem__(self, j: int) -> Any:
        if j in self.values:
            return self.values[j]
        return self.read_constant(j)

    def __setitem__(self, j: int, x: Any) -> None:
        self.values[j] = x


# ---------------------------------------------------------------------------------------
# ATen: an out variant's functional overload


def _writes(arg: Any) -> bool:
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
    written = [a for a in schema.arguments if _writes(a)]
    if not written:
        return overload, "functional"
    ns, name = schema.name.split("::", 1)
    if all(a.kwarg_only for a in written):
        wanted = [(a.name, str(a.type), a.kwarg_only) for a in schema.arguments if not _writes(a)]
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is None:
            return None
        best: tuple[int, Any] | None = None
        for overload_name in packet.overloads():
            candidate = getattr(packet, overload_name)
            cs = candidate._schema
            if any(_writes(a) for a in cs.arguments):
                continue
            have = [(a.name, str(a.type), a.kwarg_only) for a in cs.arguments]
            extra = [a for a in cs.arguments if (a.name, str(a.type), a.kwarg_only) not in wanted]
            if [h for h in have if h in wanted] != wanted:
                continue
            if any(not (a.kwarg_only and a.name in _FACTORY_KWARGS) for a in extra):
                continue
            outs = [a for a in schema.arguments if _writes(a)]
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
            if any(_writes(a) for a in cs.arguments):
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


def _shares_memory(t: Any, m: torch.Tensor) -> bool:
    """``t`` is another view of ``m``'s memory (as traced)."""
    if not isinstance(t, torch.Tensor) or t is m:
        return False
    base = t._base if t._base is not None else t
    mbase = m._base if m._base is not None else m
    return base is mbase


_STRIDE = "aten::sym_stride.int"  # from the program's dim order: a traced tensor has no memory
_ET_VIEW = ("executorch_prim::et_view.default", "executorch_prim::et_view")
_DIM_ORDER_COPY = ("dim_order_ops::_to_dim_order_copy.out", "dim_order_ops::_clone_dim_order.out")
_DEVICE_COPY = ("et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out")


# ---------------------------------------------------------------------------------------
# trace-safe versions of the kernels that test data at run time


def _choose_qparams(
    x: torch.Tensor, quant_min: int, quant_max: int, eps: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    if quant_min >= quant_max or x.dtype != torch.float32:
        return quantized.choose_qparams(x, quant_min, quant_max, eps, dtype)  # raises
    lo, hi = torch.aminmax(x.reshape(-1))
    return quantized.scale_zero_point(lo.reshape(1), hi.reshape(1), quant_min, quant_max)


def _choose_qparams_per_token(
    x: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dtype != torch.float32 or x.dim() == 0:
        return quantized.choose_qparams_per_token_asymmetric(x, dtype)  # raises
    rows = x.reshape(-1, x.shape[-1])
    lo, hi = torch.aminmax(rows, dim=-1)
    scale, zp = quantized.scale_zero_point(lo, hi, -128, 127)
    shape = (*x.shape[:-1], 1)
    return scale.reshape(shape), zp.reshape(shape)


def _embedding(nbit: int) -> Callable[..., torch.Tensor]:
    """:func:`ptexec.kernels.quantized.embedding_xbit`: its checks that read no data, then
    its body (the host-side bounds check is left out: the compiled gather checks its
    indices itself)."""

    def embedding(
        weight: torch.Tensor,
        scales: torch.Tensor,
        zero_points: torch.Tensor | None,
        quant_min: int,
        quant_max: int,
        indices: torch.Tensor,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        quantized.check_embedding(weight, scales, quant_min, quant_max, indices, nbit)
        return quantized.embedding_rows(weight, scales, zero_points, indices, nbit, dtype)

    return embedding


def _update_cache(value: torch.Tensor, cache: torch.Tensor, start_pos: Any) -> None:
    """:func:`ptexec.kernels.llm.update_cache` with its range check as a run-time assert."""
    seq = value.shape[1]
    _torch._check(start_pos >= 0)
    _torch._check(start_pos + seq <= cache.shape[1])
    src = value if value.dtype == cache.dtype else value.contiguous().view(cache.dtype)
    cache.narrow(1, start_pos, seq).copy_(src)


def _update_cache_with_indices(
    value: torch.Tensor, cache: torch.Tensor, start_pos: Any, indices: torch.Tensor
) -> None:
    src = value if value.dtype == cache.dtype else value.contiguous().view(cache.dtype)
    batch = torch.arange(value.shape[0], device=cache.device)[:, None]
    cache.index_put_((batch, indices.to(cache.device)), src)


def _sdpa_over_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start_pos: Any,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    q_len: Any,
) -> torch.Tensor:
    """Attention over ``[batch, heads, seq, dim]`` float tensors: the keys past
    ``start_pos + q_len`` (which :mod:`ptexec.kernels.llm` slices off) masked instead, so
    that shapes stay those of the cache."""
    heads, kv_heads = q.shape[1], k.shape[1]
    kv_len = k.shape[2]
    cols = torch.arange(kv_len, device=q.device)[None, :]
    mask: torch.Tensor | None
    if attn_mask is not None and attn_mask.numel():
        mask = attn_mask.to(q.device, torch.float32)
    elif attn_mask is None:
        _torch._check(start_pos + q_len <= kv_len)
        rows = torch.arange(q.shape[2], device=q.device)[:, None] + start_pos
        mask = cols <= rows if is_causal else (cols < start_pos + q_len).expand(q.shape[2], -1)
    else:
        mask = None
    if heads != kv_heads:
        reps = heads // kv_heads
        k = k.repeat_interleave(reps, dim=1)
        v = v.repeat_interleave(reps, dim=1)
    factor = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=factor)


def _float(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.float32, torch.float64) else t.to(torch.float32)


def _custom_sdpa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start_pos: Any,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    if (
        q.dim() != 4
        or k_cache.dim() != 4
        or not (q.dtype == k_cache.dtype == v_cache.dtype)
        or (attn_mask is not None and is_causal)
    ):
        return llm.custom_sdpa(
            q, k_cache, v_cache, start_pos, attn_mask, dropout_p, is_causal, scale
        )
    out = _sdpa_over_cache(
        _float(q).transpose(1, 2),
        _float(k_cache).transpose(1, 2),
        _float(v_cache).transpose(1, 2),
        start_pos,
        attn_mask,
        is_causal,
        scale,
        q.shape[1],
    )
    return out.transpose(1, 2)


def _sdpa_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start_pos: Any,
    seq_len: Any,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    _update_cache(k, k_cache, start_pos)
    _update_cache(v, v_cache, start_pos)
    return _custom_sdpa(q, k_cache, v_cache, start_pos, attn_mask, dropout_p, is_causal, scale)


def _dequantize_rows(
    x: torch.Tensor, zero_points: torch.Tensor | None, scales: torch.Tensor | None
) -> torch.Tensor:
    assert zero_points is not None and scales is not None
    return (x.to(torch.float32) - zero_points.to(torch.float32)) * scales.to(torch.float32)


def _custom_quantized_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start_pos: Any,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    q_zero_points: torch.Tensor | None = None,
    q_scales: torch.Tensor | None = None,
    k_zero_points: torch.Tensor | None = None,
    k_scales: torch.Tensor | None = None,
    v_zero_points: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    is_seq_at_dim_2: bool = False,
) -> torch.Tensor:
    """:func:`ptexec.kernels.llm.custom_quantized_sdpa` over the whole cache, masked."""
    params = (q_zero_points, q_scales, k_zero_points, k_scales, v_zero_points, v_scales)
    if (
        q.dim() != 4
        or not (q.dtype == k.dtype == v.dtype)
        or (attn_mask is not None and is_causal)
        or (q.dtype == torch.int8 and any(t is None or t.dim() != q.dim() for t in params))
    ):
        return llm.custom_quantized_sdpa(
            q, k, v, start_pos, attn_mask, dropout_p, is_causal, scale, *params, is_seq_at_dim_2
        )
    q_len = q.shape[1]
    if q.dtype == torch.int8:
        if is_seq_at_dim_2:
            q_len = q.shape[2]
        qf = _dequantize_rows(q, q_zero_points, q_scales)
        kf = _dequantize_rows(k, k_zero_points, k_scales)
        vf = _dequantize_rows(v, v_zero_points, v_scales)
    else:
        qf, kf, vf = _float(q), _float(k), _float(v)
    if not is_seq_at_dim_2:
        qf, kf, vf = qf.transpose(1, 2), kf.transpose(1, 2), vf.transpose(1, 2)
    out = _sdpa_over_cache(qf, kf, vf, start_pos, attn_mask, is_causal, scale, q_len)
    return out if is_seq_at_dim_2 else out.transpose(1, 2)


# the interpreter's kernel function -> its trace-safe version (same arguments)
_TRACE_SAFE: dict[Callable[..., Any], Callable[..., Any]] = {
    quantized.choose_qparams: _choose_qparams,
    quantized.choose_qparams_per_token_asymmetric: _choose_qparams_per_token,
    llm.update_cache: _update_cache,
    llm.update_cache_with_indices: _update_cache_with_indices,
    llm.custom_sdpa: _custom_sdpa,
    llm.sdpa_with_kv_cache: _sdpa_with_kv_cache,
    llm.custom_quantized_sdpa: _custom_quantized_sdpa,
}


class _Signature:
    """A custom op's argument layout (ExecuTorch's schema, outs excluded): ``fn`` takes the
    first ``params`` arguments (those at ``dtypes`` are ScalarType codes) and returns its
    ``outs`` results; it updates the arguments at ``mutates`` in place."""

    def __init__(
        self,
        fn: Callable[..., Any],
        params: int,
        dtypes: tuple[int, ...] = (),
        outs: int = 1,
        mutates: tuple[int, ...] = (),
    ) -> None:
        self.fn = _TRACE_SAFE.get(fn, fn)
        self.params = params
        self.dtypes = dtypes
        self.outs = outs
        self.mutates = mutates


_Q = "quantized_decomposed::"
_SIGNATURES: dict[str, _Signature] = {
    f"{_Q}quantize_per_tensor.out": _Signature(quantized.quantize_per_tensor, 6, (5,)),
    f"{_Q}quantize_per_tensor.Tensor_out": _Signature(quantized.quantize_per_tensor, 6, (5,)),
    f"{_Q}dequantize_per_tensor.out": _Signature(quantized.dequantize_per_tensor, 7, (5, 6)),
    f"{_Q}dequantize_per_tensor.Tensor_out": _Signature(quantized.dequantize_per_tensor, 7, (5, 6)),
    f"{_Q}quantize_per_channel.out": _Signature(quantized.quantize_per_channel, 7, (6,)),
    f"{_Q}dequantize_per_channel.out": _Signature(quantized.dequantize_per_channel, 8, (6, 7)),
    f"{_Q}quantize_per_token.out": _Signature(quantized.quantize_per_token, 6, (5,)),
    f"{_Q}dequantize_per_token.out": _Signature(quantized.dequantize_per_token, 7, (5, 6)),
    f"{_Q}choose_qparams.Tensor_out": _Signature(quantized.choose_qparams, 5, (4,), outs=2),
    f"{_Q}choose_qparams_per_token_asymmetric.out": _Signature(
        quantized.choose_qparams_per_token_asymmetric, 2, (1,), outs=2
    ),
    f"{_Q}mixed_mm.out": _Signature(quantized.mixed_mm, 4),
    f"{_Q}mixed_linear.out": _Signature(quantized.mixed_linear, 5, (4,)),
    f"{_Q}add.out": _Signature(quantized.quantized_add, 14),
    "llama::update_cache.out": _Signature(llm.update_cache, 3, outs=0, mutates=(1,)),
    "llama::update_cache_with_indices.out": _Signature(
        llm.update_cache_with_indices, 4, outs=0, mutates=(1,)
    ),
    "llama::custom_sdpa.out": _Signature(llm.custom_sdpa, 8),
    "llama::sdpa_with_kv_cache.out": _Signature(llm.sdpa_with_kv_cache, 11, mutates=(3, 4)),
    "llama::custom_quantized_sdpa.out": _Signature(llm.custom_quantized_sdpa, 15),
}
_EMBEDDING_BITS = {
    "quantized_decomposed::embedding_byte": 8,
    "quantized_decomposed::embedding_4bit": 4,
    "quantized_decomposed::embedding_2bit": 2,
}


# ---------------------------------------------------------------------------------------
# XNNPACK: the payload's torch code, outputs collected where it writes them


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
        raise RebuildError("the delegate's code reads one of its outputs")

    def copy_(self, src: torch.Tensor) -> _Sink:
        if self.parent is None:
            self.value = src
        else:  # src is the output permuted by ``order``: undo it
            inverse = [0] * len(self.order)
            for j, d in enumerate(self.order):
                inverse[d] = j
            self.parent.value = src.permute(inverse)
        return self


class _Delegate:
    """The torch code of one XNNPACK delegate call, and its arguments."""

    def __init__(self, fn: Callable[..., None], ext_ids: tuple[int, ...], out_ids: tuple[int, ...]):
        self.fn = fn
        self.ext_ids = ext_ids
        self.out_ids = out_ids


def _arg_infos(plan: p.ExecutionPlan, args: tuple[int, ...]) -> list[ArgInfo | None]:
    infos: list[ArgInfo | None] = []
    for slot in args:
        value = plan.values[slot]
        if isinstance(value, p.Tensor) and value.scalar_type in CODE_TO_DTYPE:
            infos.append(ArgInfo(CODE_TO_DTYPE[value.scalar_type], tuple(value.dim_order)))
        else:
            infos.append(None)
    return infos


# ---------------------------------------------------------------------------------------
# the rebuild


class Rebuild:
    """Functional forms of the instructions of one loaded method (module docstring)."""

    def __init__(self, state: MethodState, program: Program, device: torch.device) -> None:
        self.state = state
        self.plan = state.plan
        self.program = program
        self.device = device
        self._delegates: dict[tuple[int, int], _Delegate] = {}

    # -- what can be rebuilt -------------------------------------------------------------
    def reason(self, chain: int, i: int) -> str | None:
        """Why instruction ``i`` of ``chain`` cannot be rebuilt, or None when it can."""
        ins = self.state.chains[chain].instructions[i]
        name = self.state.chains[chain].names[i]
        if isinstance(ins, p.JumpFalseCall):
            return "control flow"
        if isinstance(ins, p.MoveCall | p.FreeCall):
            return None
        if isinstance(ins, p.DelegateCall):
            delegate = self.plan.delegates[ins.delegate_index]
            if delegate.id not in ("XnnpackBackend", "VulkanBackend"):
                return f"delegate '{delegate.id}' has no functional form"
            return None
        assert isinstance(ins, p.KernelCall)
        if name in PRIM_OPS or name == _STRIDE or name in _ET_VIEW:
            return None
        if name in _DIM_ORDER_COPY or name == "dim_order_ops::_empty_dim_order.out":
            return None
        if name in _DEVICE_COPY:
            return "copies between devices"
        if name.startswith("executorch_prim::et_copy_index"):
            return "grows its output row by row (map/scan)"
        if name.rsplit(".", 1)[0] in _EMBEDDING_BITS:
            return None
        if name in _SIGNATURES:
            return None
        form = functional_overload(name)
        if form is None:
            return f"{name} has no functional overload in torch"
        overload = form[0]
        if torch.Tag.nondeterministic_seeded in getattr(overload, "tags", ()):
            return f"{name} draws random numbers"
        return None

    def ignored(self, chain: int, i: int) -> frozenset[int]:
        """Arguments of instruction ``i`` its functional form never reads (the placeholder
        ``out`` of a kernel that only updates a cache in place, say)."""
        ins = self.state.chains[chain].instructions[i]
        if not isinstance(ins, p.KernelCall):
            return frozenset()
        name = self.state.chains[chain].names[i]
        base = name.rsplit(".", 1)[0]
        if base in _EMBEDDING_BITS:
            return frozenset(ins.args[7 if name.endswith(".dtype_out") else 6 :])
        sig = _SIGNATURES.get(name)
        if sig is not None:
            return frozenset(ins.args[sig.params :])
        return frozenset()

    def prepare(self, chain: int, i: int) -> None:
        """Build what instruction ``i`` needs at trace time (a delegate's torch code, with
        its weights): before tracing, where it deals with real tensors."""
        ins = self.state.chains[chain].instructions[i]
        if isinstance(ins, p.DelegateCall):
            self._delegate_code(chain, i, ins)

    # -- running one instruction ------------------------------------------------------------
    def step(self, env: Env, chain: int, i: int) -> None:
        """Run instruction ``i`` of ``chain`` on ``env``: its results replace the values it writes."""
        ins = self.state.chains[chain].instructions[i]
        name = self.state.chains[chain].names[i]
        if isinstance(ins, p.MoveCall):
            env[ins.move_to] = env[ins.move_from]
            return
        if isinstance(ins, p.FreeCall):
            return
        if isinstance(ins, p.DelegateCall):
            self._delegate(env, chain, i, ins)
            return
        assert isinstance(ins, p.KernelCall)
        args = ins.args
        prim = PRIM_OPS.get(name)
        if prim is not None:
            if len(args) != prim.arity + 1:
                raise RebuildError(f"{name}: expected {prim.arity + 1} values, got {len(args)}")
            *operands, out = args
            env[out] = prim.traced(*(self.read(env, a) for a in operands))
            return
        if name == _STRIDE:
            x, dim, out = args
            t, d = self.read(env, x), self.read(env, dim)
            value = self.plan.values[x]
            order = value.dim_order if isinstance(value, p.Tensor) else range(t.dim())
            env[out] = dim_order_strides(t.shape, order)[d]
            return
        if name in _ET_VIEW:
            src, sizes, out = args
            env[out] = self.read(env, src).reshape(self.read(env, sizes))
            return
        if name in _DIM_ORDER_COPY:
            src, out = args[0], args[3]
            env[out] = self._cast(self.read(env, src), out)
            return
        if name == "dim_order_ops::_empty_dim_order.out":
            size, out = args[0], args[2]
            env[out] = torch.empty(
                list(self.read(env, size)), dtype=self._dtype(out), device=self.device
            )
            return
        base = name.rsplit(".", 1)[0]
        if base in _EMBEDDING_BITS:
            # (weight, scales, zero_points, quant_min, quant_max, indices[, dtype], out, out)
            with_dtype = name.endswith(".dtype_out")
            n = 7 if with_dtype else 6
            given: list[Any] = [self.read(env, a) for a in args[:n]]
            if with_dtype and given[6] is not None:
                given[6] = to_dtype(given[6])
            out = args[n]
            env[out] = self._cast(_embedding(_EMBEDDING_BITS[base])(*given), out)
            return
        sig = _SIGNATURES.get(name)
        if sig is not None:
            self._custom(env, args, sig)
            return
        self._aten(env, name, args)

    # -- reading values -------------------------------------------------------------------
    def read(self, env: Env, j: int) -> Any:
        """Value ``j`` as an argument: lists element by element, None for Null."""
        value = self.plan.values[j]
        if isinstance(value, p.Null):
            return None
        if isinstance(value, p.IntList):
            return [env[k] for k in value.items]
        if isinstance(value, p.TensorList):
            return [env[k] for k in value.items]
        if isinstance(value, p.OptionalTensorList):
            return [
                None if k < 0 or isinstance(self.plan.values[k], p.Null) else env[k]
                for k in value.items
            ]
        if isinstance(value, p.DoubleList | p.BoolList):
            return list(value.items)
        return env[j]

    def _dtype(self, j: int) -> torch.dtype:
        value = self.plan.values[j]
        assert isinstance(value, p.Tensor)
        return CODE_TO_DTYPE[value.scalar_type]

    def _cast(self, x: torch.Tensor, out: int) -> torch.Tensor:
        """``x`` as value ``out`` holds it (its dtype: writing into it converts)."""
        value = self.plan.values[out]
        if isinstance(value, p.Tensor) and isinstance(x, torch.Tensor):
            dtype = CODE_TO_DTYPE.get(value.scalar_type)
            if dtype is not None and x.dtype != dtype:
                return x.to(dtype)
        return x

    def _store(self, env: Env, out: int, x: Any) -> None:
        value = self.plan.values[out]
        if isinstance(value, p.TensorList):
            for k, item in zip(value.items, x, strict=True):
                env[k] = self._cast(item, k)
        else:
            env[out] = self._cast(x, out)

    # -- ATen ------------------------------------------------------------------------------
    def _aten(self, env: Env, name: str, args: tuple[int, ...]) -> None:
        form = functional_overload(name)
        overload = resolve_overload(name)
        if form is None or overload is None:
            raise RebuildError(f"{name} has no functional overload in torch")
        functional, kind = form
        arguments = list(overload._schema.arguments)
        nargs = len(arguments)
        values = [self.read(env, a) for a in args[:nargs]]
        rets = args[nargs:]
        if kind == "functional":
            result = self._call(functional, arguments, values)
            self._returns(env, rets, result)
            return
        if kind == "inplace":
            result = self._call(functional, arguments, values)
            mutated = [args[k] for k, a in enumerate(arguments) if _writes(a)]
            for m in mutated:
                env[m] = self._cast(result, m)
            for r in rets:
                env[r] = env[mutated[0]]
            return
        outs = [k for k, a in enumerate(arguments) if _writes(a)]
        inputs = [
            (a, x) for k, (a, x) in enumerate(zip(arguments, values, strict=True)) if k not in outs
        ]
        extra: dict[str, Any] = {}
        names = {a.name for a in functional._schema.arguments}
        first_out = args[outs[0]]
        out_value = self.plan.values[first_out]
        given = {a.name for a, _ in inputs}
        if "dtype" in names and "dtype" not in given and isinstance(out_value, p.Tensor):
            extra["dtype"] = self._dtype(first_out)
        if "device" in names and "device" not in given:
            extra["device"] = self.device
        view = view_overload(functional)
        if view is not None:
            functional = view
        result = self._call(functional, [a for a, _ in inputs], [x for _, x in inputs], extra)
        results = result if isinstance(result, tuple) else (result,)
        if len(outs) == 1 and len(results) == 1:
            self._store(env, args[outs[0]], results[0])
        else:
            for k, r in zip(outs, results, strict=True):
                self._store(env, args[k], r)
        for r, k in zip(rets, outs, strict=False):
            if r != args[k]:
                env[r] = env[args[k]] if not isinstance(self.plan.values[r], p.TensorList) else None

    @staticmethod
    def _call(
        overload: Any,
        arguments: Sequence[Any],
        values: Sequence[Any],
        extra: dict[str, Any] | None = None,
    ) -> Any:
        pos: list[Any] = []
        kw: dict[str, Any] = dict(extra or {})
        for a, x in zip(arguments, values, strict=True):
            if _is_scalar_type(a) and isinstance(x, int) and not isinstance(x, bool):
                x = to_dtype(x)
            elif _is_memory_format(a) and isinstance(x, int) and not isinstance(x, bool):
                x = _MEMORY_FORMATS.get(x, torch.preserve_format)
            elif _is_layout(a) and isinstance(x, int) and not isinstance(x, bool):
                x = torch.strided
            if a.kwarg_only:
                kw[a.name] = x
            else:
                pos.append(x)
        return overload(*pos, **kw)

    def _returns(self, env: Env, rets: tuple[int, ...], result: Any) -> None:
        if not rets:
            return
        if len(rets) == 1 and not isinstance(self.plan.values[rets[0]], p.TensorList):
            env[rets[0]] = result
            return
        value = self.plan.values[rets[0]]
        if isinstance(value, p.TensorList):
            for k, r in zip(value.items, result, strict=True):
                env[k] = r
            return
        for k, r in zip(rets, result, strict=True):
            env[k] = r

    # -- custom ops (quantized, LLM) --------------------------------------------------------
    def _custom(self, env: Env, args: tuple[int, ...], sig: _Signature) -> None:
        if len(args) < sig.params + max(sig.outs, 1):
            raise RebuildError(f"expected {sig.params} arguments and the outs, got {len(args)}")
        rendered = [self.read(env, a) for a in args[: sig.params]]
        for k in sig.dtypes:
            if rendered[k] is not None:
                rendered[k] = to_dtype(rendered[k])
        for k in sig.mutates:
            if id(rendered[k]) in env.frozen:  # update a copy: the region writes it back
                rendered[k] = rendered[k].clone()
            else:  # views taken of it before keep what they saw (the interpreter copied)
                target = rendered[k]
                for j, x in list(env.values.items()):
                    if _shares_memory(x, target):
                        env[j] = x.clone()
        result = sig.fn(*rendered)
        for k in sig.mutates:
            env[args[k]] = rendered[k]
        if sig.outs == 0:
            return
        outs = args[sig.params : sig.params + sig.outs]
        results = result if sig.outs > 1 else (result,)
        for slot, r in zip(outs, results, strict=True):
            env[slot] = self._cast(r, slot)

    # -- XNNPACK --------------------------------------------------------------------------
    def _delegate_code(self, chain: int, i: int, ins: p.DelegateCall) -> _Delegate:
        key = (chain, i)
        found = self._delegates.get(key)
        if found is None:
            delegate = self.plan.delegates[ins.delegate_index]
            where = f"{self.plan.name}.delegates[{ins.delegate_index}]"
            data = self.program.pte.delegate_data(delegate.processed)
            if delegate.id == "VulkanBackend":
                vk = vulkan_runner_for(
                    data,
                    self.program.named_data,
                    self.plan.values,
                    ins.args,
                    where,
                    self.device,
                    traced=True,
                )
                found = self._delegates[key] = _Delegate(vk.fn, vk.ext_ids, vk.output_ids)
                return found
            payload = decode_payload(
                self.program.pte.delegate_data(delegate.processed), f"{where}.payload"
            )
            runner = build_runner(
                payload,
                self.program.named_data,
                _arg_infos(self.plan, ins.args),
                self.device,
                traced=True,
            )
            found = _Delegate(runner.fn, runner.ext_ids, runner.output_ids)
            self._delegates[key] = found
        return found

    def _delegate(self, env: Env, chain: int, i: int, ins: p.DelegateCall) -> None:
        code = self._delegate_code(chain, i, ins)
        sinks: dict[int, _Sink] = {}
        call: list[Any] = []
        for k in code.ext_ids:
            if k in code.out_ids:
                sinks[k] = _Sink()
                call.append(sinks[k])
            else:
                call.append(env[ins.args[k]])
        code.fn(*call)
        for k, sink in sinks.items():
            if sink.value is None:
                raise RebuildError(f"delegate output {k} was not written")
            slot = ins.args[k]
            env[slot] = self._cast(sink.value, slot)


def _is_scalar_type(arg: Any) -> bool:
    return "ScalarType" in str(getattr(arg, "real_type", arg.type))


def _is_memory_format(arg: Any) -> bool:
    return "MemoryFormat" in str(getattr(arg, "real_type", arg.type))


def _is_layout(arg: Any) -> bool:
    return "Layout" in str(getattr(arg, "real_type", arg.type))


# ExecuTorch's MemoryFormat codes (a program stores them as ints)
_MEMORY_FORMATS = {
    0: torch.contiguous_format,
    1: torch.preserve_format,
    2: torch.channels_last,
    3: torch.channels_last_3d,
}
