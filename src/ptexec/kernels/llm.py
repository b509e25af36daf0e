"""``llama::`` kernels: ExecuTorch's LLM custom ops (KV-cache update and attention).

Layouts and rules follow ExecuTorch's ``extension/llm/custom_ops``:

- caches and projections are ``[batch, seq, heads, head_dim]`` (``custom_quantized_sdpa``
  with ``is_seq_at_dim_2`` takes ``[batch, heads, seq, head_dim]``);
- ``update_cache(value, cache, start_pos)`` writes ``value`` into
  ``cache[:, start_pos : start_pos + value.size(1)]`` in place (``start_pos < cache.size(1)``
  and the rows must fit); the op's own ``out`` tensor is a placeholder left untouched;
  ``update_cache_with_indices`` writes ``value[b, s]`` into ``cache[b, indices[b, s]]``;
- ``custom_sdpa(q, k, v, start_pos, attn_mask, dropout_p, is_causal, scale)`` attends query
  row ``i`` (absolute position ``start_pos + i``) over the first ``start_pos + q.size(1)``
  rows of the caches; causal masking lets it see keys ``<= start_pos + i``; a float
  ``attn_mask`` ``[q_len, kv_len]`` (over the whole cache) is added to the scaled scores
  instead (the two exclude each other); ``scale`` defaults to ``1 / sqrt(head_dim)``;
  ``dropout_p`` is ignored; query heads share key/value heads in groups (GQA, query head
  ``h`` reads kv head ``h // (q_heads // kv_heads)``); the result has the query's shape;
- ``sdpa_with_kv_cache`` is ``update_cache`` of both caches, then ``custom_sdpa`` on them;
- ``custom_quantized_sdpa`` takes int8 q/k/v with per-row float scales and int8 zero
  points (``[batch, seq, heads, 1]``), dequantized as ``(x - zero_point) * scale``; as in
  ExecuTorch, the number of query rows used for the key range is ``q.size(1)`` unless q is
  int8 with ``is_seq_at_dim_2``.

Reduced-precision inputs are computed in float32 and converted to the output's dtype.

``gated_delta_rule`` (and its older name ``channelwise_gated_delta_rule``) has no kernel
here: it runs through ExecuTorch's ahead-of-time library when that is loaded, as its
functional form (the library's out form refuses a final state sharing a storage with the
initial one, as a method's planned tensors all do; ExecuTorch's runtime checks memory).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .aten import functional_only
from .fixed_args import Param, Signature, register_signature, traced_indices

_torch: Any = torch  # symbolic-value helpers torch does not annotate

__all__ = [
    "custom_quantized_sdpa",
    "custom_sdpa",
    "sdpa_with_kv_cache",
    "update_cache",
    "update_cache_with_indices",
]


def _check_cache_args(what: str, value: torch.Tensor, cache: torch.Tensor) -> None:
    vs, cs = value.shape, cache.shape
    if (
        len(vs) == 4
        and len(cs) == 4
        and vs[0] == cs[0]
        and vs[2:] == cs[2:]
        and (value.dtype == cache.dtype or value.element_size() == cache.element_size())
    ):
        return  # the common case, checked in one pass
    if value.dim() != 4 or cache.dim() != 4:
        raise ValueError(
            f"{what}: value and cache must be 4-D [batch, seq, heads, head_dim], got "
            f"{list(value.shape)} and {list(cache.shape)}"
        )
    for d, name in ((0, "batch"), (2, "heads"), (3, "head_dim")):
        if value.shape[d] != cache.shape[d]:
            raise ValueError(
                f"{what}: value {name} {value.shape[d]} differs from the cache's {cache.shape[d]}"
            )
    raise ValueError(
        f"{what}: value ({value.dtype}) and cache ({cache.dtype}) have different element sizes"
    )


def _same_bits(value: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """``value`` as the cache's dtype, bit for bit (ExecuTorch copies raw bytes)."""
    return value if value.dtype == cache.dtype else value.contiguous().view(cache.dtype)


def update_cache(
    value: torch.Tensor, cache: torch.Tensor, start_pos: int, *, traced: bool = False
) -> None:
    """``cache[:, start_pos : start_pos + value.size(1)] = value``, in place (one copy into
    the cache's rows, nothing else allocated). ``traced``: ``start_pos`` may be symbolic,
    its range is asserted in the traced program instead of checked here."""
    _check_cache_args("update_cache", value, cache)
    seq = value.shape[1]
    if traced:
        _torch._check(start_pos >= 0)
        _torch._check(start_pos + seq <= cache.shape[1])
    else:  # host side: the rows, as numbers
        start_pos = int(start_pos)
        rows = cache.shape[1]
        if not 0 <= start_pos < rows or start_pos + seq > rows:
            raise ValueError(
                f"update_cache: rows [{start_pos}, {start_pos + seq}) do not fit a cache of "
                f"{rows} rows"
            )
    cache.narrow(1, start_pos, seq).copy_(_same_bits(value, cache))


def update_cache_with_indices(
    value: torch.Tensor,
    cache: torch.Tensor,
    start_pos: int,
    indices: torch.Tensor,
    *,
    traced: bool = False,
) -> None:
    """``cache[b, indices[b, s]] = value[b, s]`` for every batch ``b`` and row ``s``
    (``traced``: the indices' range is not checked on the host; the write refuses them)."""
    what = "update_cache_with_indices"
    _check_cache_args(what, value, cache)
    if indices.dim() != 2 or tuple(indices.shape) != tuple(value.shape[:2]):
        raise ValueError(
            f"{what}: indices must be [batch, seq] = {list(value.shape[:2])}, got {list(indices.shape)}"
        )
    if indices.dtype != torch.int64:
        raise ValueError(f"{what}: indices have dtype {indices.dtype}, expected int64")
    if traced:
        indices = traced_indices(indices, cache.shape[1])
    elif indices.numel():  # host side: reads the indices
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= cache.shape[1]:
            raise IndexError(f"{what}: index out of range [0, {cache.shape[1]}): got [{lo}, {hi}]")
    batch = torch.arange(value.shape[0], device=cache.device)[:, None]
    idx = indices.to(cache.device)
    rows = _same_bits(value, cache)
    seq = value.shape[1]
    if not (isinstance(seq, int) and seq <= 1):  # (one row, a decode step: nothing repeats)
        # rows written to one slot (a ring buffer's prefill longer than the window): the
        # last one wins, as ExecuTorch writes them in order; index_put_ writes repeated
        # indices in no set order, so each is given the value of its slot's last writer
        pos = torch.arange(idx.shape[1], device=idx.device).expand_as(idx)
        last = torch.full((idx.shape[0], cache.shape[1]), -1, dtype=idx.dtype, device=idx.device)
        last = last.scatter_reduce(1, idx, pos, "amax")
        rows = rows[batch, last.gather(1, idx)]
    cache.index_put_((batch, idx), rows)


def _check_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    what: str,
) -> None:
    """The checks of :func:`_attention` (shapes and flags, no data)."""
    if attn_mask is not None and is_causal:
        raise ValueError(f"{what}: attn_mask and is_causal cannot both be set")
    if attn_mask is not None and not attn_mask.is_floating_point():
        # ExecuTorch's kernel takes an additive float mask only (a bool one read as 1.0/0.0
        # would be added, not masked)
        raise ValueError(f"{what}: attn_mask must be a float tensor, got {attn_mask.dtype}")
    if q.shape[-1] != k.shape[-1] or k.shape[-1] != v.shape[-1]:
        raise ValueError(f"{what}: q, k and v must have the same head size")
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{what}: {heads} query heads cannot share {kv_heads} key/value heads")
    if (
        attn_mask is not None
        and attn_mask.numel()
        and (attn_mask.dim() != 2 or tuple(attn_mask.shape) != (q.shape[2], k.shape[2]))
    ):
        raise ValueError(
            f"{what}: attn_mask must be [{q.shape[2]}, {k.shape[2]}], got {list(attn_mask.shape)}"
        )


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    factor: float,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    repeat_heads: bool = False,
) -> torch.Tensor:
    """One call of scaled-dot-product attention; grouped key/value heads read in place
    (``enable_gqa``), or ``repeat_heads``: repeated to the query's heads first."""
    gqa = q.shape[1] != k.shape[1]
    if gqa and repeat_heads:
        reps = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(reps, dim=1), v.repeat_interleave(reps, dim=1)
        gqa = False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=factor, enable_gqa=gqa
    )


def _grouped_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    factor: float,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Attention of ``q`` ``[B, H, S, D]`` over ``k``/``v`` ``[B, H_kv, N, D]`` (``H`` a
    multiple of ``H_kv``; ``mask`` ``[S, N]`` or None): the ``H / H_kv`` query heads of
    each key/value head become rows of one query of that head, so the caches are read as
    they are (traced code: :func:`_traced_attention` of those rows)."""
    b, h, s, d = q.shape
    groups = k.shape[1]
    if h == groups:
        return _traced_attention(q, k, v, factor, mask)
    rep = h // groups
    rows = q.reshape(b, groups, rep * s, d)  # head g * rep + r, row i -> group g, row r * s + i
    if mask is not None:
        mask = mask.repeat(rep, 1)
    out = _traced_attention(rows, k, v, factor, mask)
    return out.reshape(b, h, s, d)


SUMMED_ROWS = 8
"""In traced code, attention of at most this many query rows (a decode step's; grouped
query heads count as rows) is computed as sums of products rather than by the
attention kernel: a few rows over a few hundred keys are less work than the kernel's
setup and its library matrix products cost (about 30 us a call on a small model's decode
step), and the compiled code fuses the sums with the softmax. Measured compiled, 64-wide
heads: 3 rows over 25-511 keys take 0.4-0.7x the kernel's time, 8 rows over 512 keys
about the same, 16 rows over 512 keys 1.3x."""


def _summed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, factor: float, mask: torch.Tensor | None
) -> torch.Tensor:
    """Attention of ``q`` ``[B, H, S, D]`` over ``k``/``v`` ``[B, H, N, D]`` (``mask``
    ``[S, N]``, True where a row sees a key, or None) as elementwise products and sums."""
    scores = (q.unsqueeze(3) * k.unsqueeze(2)).sum(-1) * factor
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, -1).unsqueeze(-1) * v.unsqueeze(2)).sum(3)


def _traced_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, factor: float, mask: torch.Tensor | None
) -> torch.Tensor:
    """:func:`_summed_attention` for at most :data:`SUMMED_ROWS` query rows, else the
    attention kernel: with a symbolic row count, both, as a ``torch.cond`` on it."""
    operands = (q, k, v) if mask is None else (q, k, v, mask)

    # each branch returns a tuple (the compiler lowers a cond's results as one)
    def summed(*xs: torch.Tensor) -> tuple[torch.Tensor]:
        mask = xs[3] if len(xs) > 3 else None
        return (_summed_attention(xs[0], xs[1], xs[2], factor, mask),)

    def kernel(*xs: torch.Tensor) -> tuple[torch.Tensor]:
        mask = xs[3] if len(xs) > 3 else None
        return (_sdpa(xs[0], xs[1], xs[2], factor, mask).contiguous(),)

    few = q.shape[2] <= SUMMED_ROWS
    if isinstance(few, bool):
        return (summed if few else kernel)(*operands)[0]
    return torch.ops.higher_order.cond(few, summed, kernel, operands)[0]


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start_pos: int,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    q_len: int,
    what: str,
    masked: bool = False,
) -> torch.Tensor:
    """Attention over ``[batch, heads, seq, dim]`` float tensors with ExecuTorch's key range
    (the first ``start_pos + q_len`` cached rows, unless a mask covers the whole cache).

    On the host: one call of scaled-dot-product attention on views of the caches, the
    rows past the key range sliced off; no mask is made where the causal rule hides
    nothing (a single query row at the end of the keys) or where it is torch's own
    (``is_causal`` from position 0); an explicit mask only for several rows after
    position 0. ``masked`` (a traced program, ``start_pos`` possibly symbolic): the same
    rows, sliced to a symbolic length (only the key range is read, as on the host: the
    cache past it is never read, so what it holds cannot reach the result, and a decode
    step reads ``start_pos + 1`` rows, not the whole cache), with the causal rule as an
    explicit mask and grouped key/value heads attended as groups of query rows (one
    attention over equal head counts, no copy of the caches per query head: the compiled
    code does not depend on how a compiler lowers ``enable_gqa``), a few such rows as sums
    of products (:data:`SUMMED_ROWS`).
    """
    _check_attention(q, k, v, attn_mask, is_causal, what)
    factor = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if attn_mask is not None and attn_mask.numel():
        mask = attn_mask.to(q.device, torch.float32)
        return _sdpa(q, k, v, factor, mask, repeat_heads=masked)
    if masked:
        if attn_mask is not None:  # an empty mask: every cached row is a key
            return _sdpa(q, k, v, factor, repeat_heads=True)
        _torch._check(start_pos >= 0)
        keys = start_pos + q_len
        _torch._check(keys > 0)
        _torch._check(keys <= k.shape[2])
        k, v = k.narrow(2, 0, keys), v.narrow(2, 0, keys)
        causal: torch.Tensor | None = None
        if is_causal:  # the query's rows (q_len counts the key range: they may differ)
            rows = torch.arange(q.shape[2], device=q.device)[:, None] + start_pos
            causal = torch.arange(keys, device=q.device)[None, :] <= rows
        return _grouped_sdpa(q, k, v, factor, causal)
    start = int(start_pos)
    if start < 0:
        raise ValueError(f"{what}: start_pos must be 0 or more, got {start}")
    if attn_mask is None:
        keys_end = start + q_len
        if keys_end > k.shape[2]:
            raise ValueError(
                f"{what}: start_pos {start_pos} + {q_len} query rows exceed the {k.shape[2]} "
                "cached rows"
            )
        k, v = k[:, :, :keys_end], v[:, :, :keys_end]
    kv_len = k.shape[2]
    if not is_causal or kv_len <= start + 1:  # row 0 (position start) already sees every key
        return _sdpa(q, k, v, factor)
    if start == 0:  # row i sees keys <= i: torch's causal rule
        return _sdpa(q, k, v, factor, causal=True)
    rows = torch.arange(q.shape[2], device=q.device)[:, None] + start
    cols = torch.arange(kv_len, device=q.device)[None, :]
    return _sdpa(q, k, v, factor, cols <= rows)


def _float(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.float32, torch.float64) else t.to(torch.float32)


def custom_sdpa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start_pos: int,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    traced: bool = False,
) -> torch.Tensor:
    """Attention of ``q`` [B, S, H, D] over the caches [B, S_max, H_kv, D]; shape of ``q``
    (``traced``: ``start_pos`` may be symbolic; see :func:`_attention`)."""
    what = "custom_sdpa"
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(f"{what}: q, k and v must be 4-D [batch, seq, heads, head_dim]")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(
            f"{what}: q, k and v must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    out = _attention(
        _float(q).transpose(1, 2),
        _float(k_cache).transpose(1, 2),
        _float(v_cache).transpose(1, 2),
        start_pos,
        attn_mask,
        is_causal,
        scale,
        q.shape[1],
        what,
        masked=traced,
    )
    return out.transpose(1, 2)


def sdpa_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start_pos: int,
    seq_len: int,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    traced: bool = False,
) -> torch.Tensor:
    """Write ``k``/``v`` into the caches at ``start_pos``, then :func:`custom_sdpa`."""
    what = "sdpa_with_kv_cache"
    if not traced:  # host side: the rows, as numbers
        start_pos = int(start_pos)
        end = start_pos + int(seq_len)
        for cache in (k_cache, v_cache):
            if cache.dim() != 4 or not 0 <= start_pos < cache.shape[1] or end > cache.shape[1]:
                raise ValueError(
                    f"{what}: rows [{start_pos}, {end}) do not fit a cache of shape "
                    f"{list(cache.shape)}"
                )
    update_cache(k, k_cache, start_pos, traced=traced)
    update_cache(v, v_cache, start_pos, traced=traced)
    return custom_sdpa(
        q, k_cache, v_cache, start_pos, attn_mask, dropout_p, is_causal, scale, traced=traced
    )


def _dequantize_rows(
    x: torch.Tensor, zero_points: torch.Tensor | None, scales: torch.Tensor | None, name: str
) -> torch.Tensor:
    if zero_points is None or scales is None:
        raise ValueError(f"custom_quantized_sdpa: int8 {name} needs its scales and zero points")
    if x.dim() != scales.dim() or x.dim() != zero_points.dim():
        raise ValueError(
            f"custom_quantized_sdpa: {name} scales/zero points must have {x.dim()} dims"
        )
    return (x.to(torch.float32) - zero_points.to(torch.float32)) * scales.to(torch.float32)


def _rows(t: torch.Tensor | None, dim: int, n: int, full: int | None = None) -> torch.Tensor | None:
    """The first ``n`` rows along ``dim`` of per-row parameters (None stays None; so do
    parameters with fewer rows: broadcast ones). ``full``: ``n`` is symbolic, and only
    parameters with ``full`` rows (one per cached row) are cut."""
    if t is None or t.dim() <= dim:
        return t
    if (t.shape[dim] != full) if full is not None else (t.shape[dim] < n):
        return t
    return t.narrow(dim, 0, n)


def custom_quantized_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start_pos: int,
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
    *,
    traced: bool = False,
) -> torch.Tensor:
    """:func:`custom_sdpa` over int8 q/k/v with per-row quantization parameters (or float
    q/k/v, then the parameters are unused); the result is float32 (the out's dtype).
    Only the cached rows in the key range are dequantized (``traced``: a symbolic count of
    them)."""
    what = "custom_quantized_sdpa"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{what}: q, k and v must be 4-D")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"{what}: q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    # the key range ends at start_pos + q_len; as ExecuTorch's kernel counts it, q_len is
    # the sequence dim of int8 inputs and dim 1 of float ones, whatever the layout
    q_len = q.shape[1]
    if q.dtype == torch.int8:
        if is_seq_at_dim_2:
            q_len = q.shape[2]
        seq_dim = 2 if is_seq_at_dim_2 else 1
        # traced: a symbolic count, its range asserted by _attention
        keys = start_pos + q_len if traced else int(start_pos) + q_len
        if attn_mask is None and (traced or 0 <= keys < k.shape[seq_dim]):
            # only the first start_pos + q_len cached rows are read: dequantize those
            full = k.shape[seq_dim] if traced else None
            if traced:
                _torch._check(start_pos >= 0)
                _torch._check(keys > 0)
                _torch._check(keys <= k.shape[seq_dim])
            k, v = k.narrow(seq_dim, 0, keys), v.narrow(seq_dim, 0, keys)
            k_zero_points, k_scales = (
                _rows(k_zero_points, seq_dim, keys, full),
                _rows(k_scales, seq_dim, keys, full),
            )
            v_zero_points, v_scales = (
                _rows(v_zero_points, seq_dim, keys, full),
                _rows(v_scales, seq_dim, keys, full),
            )
        qf = _dequantize_rows(q, q_zero_points, q_scales, "q")
        kf = _dequantize_rows(k, k_zero_points, k_scales, "k")
        vf = _dequantize_rows(v, v_zero_points, v_scales, "v")
    else:
        qf, kf, vf = _float(q), _float(k), _float(v)
    if not is_seq_at_dim_2:
        qf, kf, vf = qf.transpose(1, 2), kf.transpose(1, 2), vf.transpose(1, 2)
    out = _attention(qf, kf, vf, start_pos, attn_mask, is_causal, scale, q_len, what, traced)
    return out if is_seq_at_dim_2 else out.transpose(1, 2)


# --------------------------------------------------------------------------------------
# registration (argument layouts of the llama:: out variants, outs excluded)

functional_only("llama::gated_delta_rule.out", "llama::channelwise_gated_delta_rule.out")

_P = Param
_SDPA_TAIL = (
    _P("start_pos", "int"),
    _P("attn_mask", "T?"),
    _P("dropout_p", "float"),
    _P("is_causal", "bool"),
    _P("scale", "float?"),
)
register_signature(
    "llama::update_cache.out",
    Signature(
        update_cache,
        (_P("value", "T"), _P("cache", "T"), _P("start_pos", "int")),
        outs=0,
        mutates=("cache",),
        flagged=True,
    ),
)
register_signature(
    "llama::update_cache_with_indices.out",
    Signature(
        update_cache_with_indices,
        (_P("value", "T"), _P("cache", "T"), _P("start_pos", "int"), _P("indices", "T")),
        outs=0,
        mutates=("cache",),
        flagged=True,
    ),
)
register_signature(
    "llama::custom_sdpa.out",
    Signature(
        custom_sdpa,
        (_P("query", "T"), _P("key", "T"), _P("value", "T"), *_SDPA_TAIL),
        flagged=True,
    ),
)
register_signature(
    "llama::sdpa_with_kv_cache.out",
    Signature(
        sdpa_with_kv_cache,
        (
            _P("query", "T"),
            _P("key", "T"),
            _P("value", "T"),
            _P("key_cache", "T"),
            _P("value_cache", "T"),
            _P("start_pos", "int"),
            _P("seq_len", "int"),
            *_SDPA_TAIL[1:],
        ),
        mutates=("key_cache", "value_cache"),
        flagged=True,
    ),
)
register_signature(
    "llama::custom_quantized_sdpa.out",
    Signature(
        custom_quantized_sdpa,
        (
            _P("query", "T"),
            _P("key", "T"),
            _P("value", "T"),
            *_SDPA_TAIL,
            _P("q_zero_points", "T?"),
            _P("q_scales", "T?"),
            _P("k_zero_points", "T?"),
            _P("k_scales", "T?"),
            _P("v_zero_points", "T?"),
            _P("v_scales", "T?"),
            _P("is_seq_at_dim_2", "bool"),
        ),
        flagged=True,
    ),
)
