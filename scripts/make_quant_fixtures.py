#!/usr/bin/env python3
"""Make the fixtures for ``quantized_decomposed::`` and ``llama::`` kernels.

Usage:
    python scripts/make_quant_fixtures.py [--out tests/fixtures] [--only NAME ...] [--no-check]

Same conventions as ``make_fixtures.py`` (``NAME.pte``, ``NAME.io.pt`` and an entry merged
into ``manifest.json``; see ``tests/fixtures/README.md``), exported with ExecuTorch's own
exporter and no delegate, so every quantized or LLM op stays a KernelCall:

* pt2e-quantized models (``XNNPACKQuantizer`` with the symmetric config through
  ``prepare_pt2e`` / ``convert_pt2e``, then ``to_edge`` + ``to_executorch`` without the
  XNNPACK partitioner): static per-tensor, static per-channel, dynamic (``choose_qparams``);
* modules calling the ``quantized_decomposed`` ops directly: per-token dynamic
  quantization, per-channel activations, quantized embeddings (8/4/2-bit), ``mixed_mm`` /
  ``mixed_linear`` / ``add``;
* attention modules with ExecuTorch's ``llama`` custom ops and a KV cache carried between
  calls (``update_cache`` + ``custom_sdpa``, ``sdpa_with_kv_cache``,
  ``update_cache_with_indices`` with an explicit mask, an int8 cache with
  ``custom_quantized_sdpa``).

Expected outputs are eager PyTorch on the same module. Where the eager op is itself
ExecuTorch's ahead-of-time kernel (the ``llama`` ops, ``mixed_*``, quantized ``add``),
every eager call is also checked against an independent pure-PyTorch reference, and the
script stops when they disagree. After writing, the fixtures are replayed with ExecuTorch's
runtime (``check_fixtures.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim, export

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

sys.path.insert(0, str(HERE.parent / "tests"))

import make_fixtures as mf  # noqa: E402

from fixture_data import compare_outputs  # noqa: E402

# The tags these fixtures add to the vocabulary of make_fixtures.py.
EXTRA_TAGS = frozenset({"quantized", "llm"})
mf.TAGS = mf.TAGS | EXTRA_TAGS

# One quantization step of the outputs may flip where float intermediates (convolutions,
# matmuls) round differently on another runtime or device; these tolerances allow that.
TOL_QUANT = (1e-3, 5e-2)
TOL_QUANT_FLOAT = (1e-4, 1e-4)
TOL_LLM = (1e-4, 1e-4)
TOL_LLM_QUANT = (1e-3, 2e-2)


def _load_executorch_ops() -> None:
    """Register the quantized and LLM ops (and their out variants) with torch."""
    import executorch.exir.passes._quant_patterns_and_replacements
    import executorch.kernels.quantized  # noqa: F401
    import torch.ao.quantization.fx._decomposed  # noqa: F401
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401


# Python modules that register ExecuTorch's kernels for a namespace with its runtime
# (``executorch.runtime`` has neither library linked in by default).
KERNEL_MODULES = {
    "quantized_decomposed": "executorch.kernels.quantized",
    "llama": "executorch.extension.llm.custom_ops.custom_ops",
}


def executorch_imports(operators: Sequence[str]) -> list[str]:
    """The modules to import before ``executorch.runtime`` can run these operators."""
    namespaces = {op.split("::", 1)[0] for op in operators}
    return sorted(KERNEL_MODULES[ns] for ns in namespaces if ns in KERNEL_MODULES)


def _register_fakes() -> None:
    """Fake kernels for ops ExecuTorch defines without one (export traces with fakes)."""
    from torch.library import register_fake

    def mixed_linear_fake(x, weight, scales, zero_points, dtype=None):  # type: ignore[no-untyped-def]
        return x.new_empty((x.shape[0], weight.shape[0]), dtype=dtype or x.dtype)

    def mixed_mm_fake(x, weight, scales, zero_points):  # type: ignore[no-untyped-def]
        return x.new_empty((x.shape[0], weight.shape[1]))

    def add_fake(a, *args):  # type: ignore[no-untyped-def]
        return torch.empty_like(a)

    for name, fn in (
        ("quantized_decomposed::mixed_linear", mixed_linear_fake),
        ("quantized_decomposed::mixed_mm", mixed_mm_fake),
        ("quantized_decomposed::add", add_fake),
    ):
        with contextlib.suppress(RuntimeError):  # already registered elsewhere
            register_fake(name)(fn)


def _close(name: str, got: Any, want: Any, rtol: float, atol: float) -> None:
    got_l = mf.flatten_values(got)
    want_l = mf.flatten_values(want)
    problem = compare_outputs(got_l, want_l, rtol, atol)
    if problem is not None:
        raise RuntimeError(f"{name}: eager and the pure-PyTorch reference disagree: {problem}")


# --------------------------------------------------------------------------------------
# pt2e-quantized models


class SmallNet(nn.Module):
    """Conv2d(3->4) - ReLU - add(y) - spatial mean - Linear(4->5)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel_size=3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)) + y
        return self.fc(h.mean(dim=(2, 3)))


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _pt2e(
    module: nn.Module, example: tuple[Any, ...], calib: Sequence[tuple[Any, ...]], **config: Any
) -> nn.Module:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    graph = export(module, example).module()
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(**config))
    prepared = prepare_pt2e(graph, quantizer)
    for args in calib:
        prepared(*args)
    return convert_pt2e(prepared)


def _require_ops(*names: str) -> Callable[[Any, Any], str]:
    def inspect(et: Any, prog: Any) -> str:
        have = set(mf.operator_names(prog))
        missing = [n for n in names if n not in have]
        if missing:
            raise RuntimeError(f"the program lacks {missing}; it has {sorted(have)}")
        quant = sorted(
            n for n in have if not n.startswith(("aten::", "executorch_prim::", "dim_order_ops::"))
        )
        return "Custom-namespace operators: " + ", ".join(quant) + "."

    return inspect


def build_quant_static(name: str) -> mf.Built:
    per_channel = "per_channel" in name
    m = SmallNet().eval()

    def sample() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(2, 3, 8, 8), torch.randn(2, 4, 8, 8)

    calib = [sample() for _ in range(4)]
    q = _pt2e(m, calib[0], calib, is_per_channel=per_channel)
    calls = [sample() for _ in range(3)]
    ops = [
        "quantized_decomposed::quantize_per_tensor.out",
        "quantized_decomposed::dequantize_per_tensor.out",
    ]
    if per_channel:
        ops.append("quantized_decomposed::dequantize_per_channel.out")
    return mf.single(q, calls[0], calls, inspect=_require_ops(*ops))


def build_quant_dynamic(name: str) -> mf.Built:
    m = TwoLinear().eval()
    calib = [(torch.randn(3, 8),) for _ in range(2)]
    q = _pt2e(m, calib[0], calib, is_per_channel=True, is_dynamic=True)
    calls = [(torch.randn(3, 8) * s,) for s in (1.0, 0.1, 5.0)]
    return mf.single(
        q,
        calls[0],
        calls,
        inspect=_require_ops(
            "quantized_decomposed::choose_qparams.Tensor_out",
            "quantized_decomposed::quantize_per_tensor.Tensor_out",
            "quantized_decomposed::dequantize_per_tensor.Tensor_out",
            "quantized_decomposed::dequantize_per_channel.out",
        ),
    )


# --------------------------------------------------------------------------------------
# modules calling quantized_decomposed ops directly


def _per_row_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scales = w.abs().amax(dim=1).clamp(min=1e-6) / 127.0
    q = torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8)
    return q, scales


class PerTokenLinear(nn.Module):
    """8-bit dynamic per-token activations times per-channel int8 weights, plus a
    per-channel quantize/dequantize round trip of the input along its last axis."""

    def __init__(self) -> None:
        super().__init__()
        wq, ws = _per_row_int8(torch.randn(6, 8))
        self.register_buffer("wq", wq)
        self.register_buffer("ws", ws.to(torch.float64))
        self.register_buffer("wz", torch.zeros(6, dtype=torch.int64))
        self.register_buffer("cs", (torch.rand(8, dtype=torch.float64) + 0.5) * 0.02)
        self.register_buffer("cz", torch.randint(-10, 10, (8,), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ops = torch.ops.quantized_decomposed
        s, z = ops.choose_qparams_per_token_asymmetric(x, torch.int8)
        xq = ops.quantize_per_token(x, s, z, -128, 127, torch.int8)
        xd = ops.dequantize_per_token(xq, s, z, -128, 127, torch.int8, torch.float32)
        wd = ops.dequantize_per_channel(self.wq, self.ws, self.wz, 0, -128, 127, torch.int8)
        y = F.linear(xd, wd)
        cq = ops.quantize_per_channel(x, self.cs, self.cz, 2, -128, 127, torch.int8)
        cd = ops.dequantize_per_channel(cq, self.cs, self.cz, 2, -128, 127, torch.int8)
        return y, cd


def build_quant_per_token(name: str) -> mf.Built:
    m = PerTokenLinear().eval()
    calls = [(torch.randn(2, 3, 8) * s,) for s in (1.0, 0.05, 3.0)]
    return mf.single(
        m,
        calls[0],
        calls,
        inspect=_require_ops(
            "quantized_decomposed::choose_qparams_per_token_asymmetric.out",
            "quantized_decomposed::quantize_per_token.out",
            "quantized_decomposed::dequantize_per_token.out",
            "quantized_decomposed::quantize_per_channel.out",
            "quantized_decomposed::dequantize_per_channel.out",
        ),
    )


def _pack(values: torch.Tensor, nbit: int) -> torch.Tensor:
    """Pack signed ``nbit`` values [rows, dim] the way ExecuTorch's embedding kernels read them."""
    shifted = (values.to(torch.int16) + (1 << (nbit - 1))).to(torch.uint8)
    per = 8 // nbit
    grouped = shifted.reshape(values.shape[0], -1, per)
    packed = torch.zeros(grouped.shape[:2], dtype=torch.uint8)
    for i in range(per):
        shift = (8 - nbit - i * nbit) if nbit == 4 else i * nbit  # 4-bit: high nibble first
        packed |= grouped[:, :, i] << shift
    return packed


class QuantEmbeddings(nn.Module):
    """The same 10x8 table looked up four ways: 8-bit grouped with zero points, 8-bit per
    row (the ``.out`` overload), 4-bit with float16 scales and output, 2-bit grouped."""

    def __init__(self) -> None:
        super().__init__()
        vocab, dim = 10, 8
        self.register_buffer("w8", torch.randint(-128, 128, (vocab, dim), dtype=torch.int8))
        self.register_buffer("s8g", torch.rand(vocab, 2) * 0.05 + 0.01)
        self.register_buffer("z8g", torch.randint(-5, 5, (vocab, 2)).to(torch.float32))
        self.register_buffer("s8", torch.rand(vocab) * 0.05 + 0.01)
        self.register_buffer("w4", _pack(torch.randint(-8, 8, (vocab, dim)), 4))
        self.register_buffer("s4", (torch.rand(vocab) * 0.5 + 0.1).to(torch.float16))
        self.register_buffer("w2", _pack(torch.randint(-2, 2, (vocab, dim)), 2))
        self.register_buffer("s2", torch.rand(vocab, 2) + 0.5)

    def forward(self, ids: torch.Tensor):  # type: ignore[no-untyped-def]
        ops = torch.ops.quantized_decomposed
        a = ops.embedding_byte.dtype(
            self.w8, self.s8g, self.z8g, -128, 127, ids, dtype=torch.float32
        )
        b = ops.embedding_byte(self.w8, self.s8, None, -128, 127, ids)
        c = ops.embedding_4bit.dtype(self.w4, self.s4, None, -8, 7, ids, dtype=torch.float16)
        d = ops.embedding_2bit.dtype(self.w2, self.s2, None, -2, 1, ids, dtype=torch.float32)
        return a, b, c, d


def build_quant_embedding(name: str) -> mf.Built:
    m = QuantEmbeddings().eval()
    calls = [(torch.randint(0, 10, (2, 3)),) for _ in range(2)] + [
        (torch.tensor([[0, 9, 9]]).expand(2, 3).clone(),)
    ]
    return mf.single(
        m,
        calls[0],
        calls,
        inspect=_require_ops(
            "quantized_decomposed::embedding_byte.dtype_out",
            "quantized_decomposed::embedding_byte.out",
            "quantized_decomposed::embedding_4bit.dtype_out",
            "quantized_decomposed::embedding_2bit.dtype_out",
        ),
    )


class MixedOps(nn.Module):
    """``mixed_linear`` (grouped scales), ``mixed_mm`` and a quantized uint8 ``add``."""

    def __init__(self, reference: bool = False) -> None:
        super().__init__()
        self.reference = reference
        self.register_buffer("w", torch.randint(-127, 128, (5, 6), dtype=torch.int8))
        self.register_buffer("s", torch.rand(5, 2) * 0.05 + 0.01)  # groups of 3 columns
        self.register_buffer("w2", torch.randint(-127, 128, (6, 4), dtype=torch.int8))
        self.register_buffer("s2", torch.rand(6) * 0.05 + 0.01)

    def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor):  # type: ignore[no-untyped-def]
        ops = torch.ops.quantized_decomposed
        qa = (0.05, 128, 0, 255)
        qb = (0.03, 120, 0, 255)
        qo = (0.07, 125, 0, 255)
        if not self.reference:
            y = ops.mixed_linear(x, self.w, self.s, None, None)
            z = ops.mixed_mm(x, self.w2, self.s2, None)
            c = ops.add(a, *qa, b, *qb, *qo)
            return y, z, c
        wd = self.w.float() * self.s.repeat_interleave(3, dim=1)
        y = x @ wd.T
        z = x @ (self.w2.float() * self.s2[:, None])
        fa = ops.dequantize_per_tensor(a, *qa, torch.uint8)
        fb = ops.dequantize_per_tensor(b, *qb, torch.uint8)
        c = ops.quantize_per_tensor(fa + fb, *qo, torch.uint8)
        return y, z, c


def build_quant_mixed(name: str) -> mf.Built:
    _register_fakes()
    m = MixedOps().eval()
    ref = MixedOps(reference=True).eval()
    ref.load_state_dict(m.state_dict())

    def sample() -> tuple[torch.Tensor, ...]:
        u8 = (4, 5)
        return (
            torch.randn(3, 6),
            torch.randint(0, 256, u8, dtype=torch.uint8),
            torch.randint(0, 256, u8, dtype=torch.uint8),
        )

    calls = [sample() for _ in range(3)]
    ep = export(copy.deepcopy(m), calls[0])

    def eager(method: str, args: tuple[Any, ...]) -> Any:
        # mixed_* and add have no eager CPU kernel: the reference is the eager result
        return ref(*args)

    return mf.Built(
        exported={"forward": ep},
        calls=[("forward", c) for c in calls],
        eager=eager,
        inspect=_require_ops(
            "quantized_decomposed::mixed_linear.out",
            "quantized_decomposed::mixed_mm.out",
            "quantized_decomposed::add.out",
        ),
    )


# --------------------------------------------------------------------------------------
# llama custom ops


class CachedAttention(nn.Module):
    """Attention with a [1, 8, kv_heads, head_dim] KV cache written at ``input_pos[0]``.

    ``kind``: "custom" (``update_cache`` + causal ``custom_sdpa``), "kv"
    (``sdpa_with_kv_cache``), "indices" (``update_cache_with_indices`` + ``custom_sdpa``
    with a float mask and an explicit scale), "reference" (plain PyTorch: slicing and
    ``F.scaled_dot_product_attention``, the independent reference for the others).
    """

    def __init__(
        self, kind: str, dim: int = 16, heads: int = 4, kv_heads: int = 2, max_len: int = 8
    ) -> None:
        super().__init__()
        self.kind = kind
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        shape = (1, max_len, kv_heads, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def forward(
        self, x: torch.Tensor, input_pos: torch.Tensor, extra: Any = None, mask: Any = None
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim)
        pos = input_pos[0].item()
        torch._check_is_size(pos)
        torch._check(pos + t <= self.k_cache.size(1))
        if self.kind == "custom":
            torch.ops.llama.update_cache(k, self.k_cache, pos)
            torch.ops.llama.update_cache(v, self.v_cache, pos)
            y = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, pos, None, 0.0, True)
        elif self.kind == "kv":
            y = torch.ops.llama.sdpa_with_kv_cache(
                q, k, v, self.k_cache, self.v_cache, pos, t, None, 0.0, True
            )
        elif self.kind == "indices":
            torch.ops.llama.update_cache_with_indices(k, self.k_cache, pos, extra)
            torch.ops.llama.update_cache_with_indices(v, self.v_cache, pos, extra)
            y = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, 0, mask, 0.0, False, 0.3)
        else:
            y = self._reference(q, k, v, pos, extra, mask)
        return self.wo(y.reshape(b, t, -1))

    def _reference(self, q, k, v, pos, indices, mask):  # type: ignore[no-untyped-def]
        t = q.shape[1]
        if indices is None:
            self.k_cache[:, pos : pos + t] = k
            self.v_cache[:, pos : pos + t] = v
            keys = pos + t
        else:
            self.k_cache[0, indices[0]] = k[0]
            self.v_cache[0, indices[0]] = v[0]
            keys = self.k_cache.shape[1]
        kh = (
            self.k_cache[:, :keys].transpose(1, 2).repeat_interleave(self.heads // self.kv_heads, 1)
        )
        vh = (
            self.v_cache[:, :keys].transpose(1, 2).repeat_interleave(self.heads // self.kv_heads, 1)
        )
        qh = q.transpose(1, 2)
        if mask is None:
            allowed = torch.arange(keys)[None, :] <= (torch.arange(t)[:, None] + pos)
            y = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed)
        else:
            y = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=0.3)
        return y.transpose(1, 2)


def _checked_eager(
    module: nn.Module, reference: nn.Module, name: str, tol: tuple[float, float]
) -> Callable[[str, tuple[Any, ...]], Any]:
    def eager(method: str, args: tuple[Any, ...]) -> Any:
        out = module(*args)
        _close(name, out, reference(*copy.deepcopy(args)), *tol)
        return out

    return eager


def build_llama(kind: str) -> Callable[[str], mf.Built]:
    def build(name: str) -> mf.Built:
        _load_executorch_ops()
        # input_pos up to 7 with up to 4 tokens fits a 12-row cache (random inputs too)
        max_len = 8 if kind == "indices" else 12
        m = CachedAttention(kind, max_len=max_len).eval()
        ref = CachedAttention("reference", max_len=max_len).eval()
        ref.load_state_dict(m.state_dict())
        seq = Dim("seq", min=1, max=4)
        if kind == "indices":
            rows = [[0, 1, 2], [3], [7, 4], [5]]
            calls = []
            written: set[int] = set()
            for idx in rows:
                written.update(idx)
                mask = torch.full((len(idx), 8), float("-inf"))
                mask[:, sorted(written)] = 0.0
                calls.append(
                    (torch.randn(1, len(idx), 16), torch.tensor([0]), torch.tensor([idx]), mask)
                )
            dynamic = {"x": {1: seq}, "input_pos": None, "extra": {1: seq}, "mask": {0: seq}}
        else:
            calls = [
                (torch.randn(1, t, 16), torch.tensor([p]))
                for t, p in ((3, 0), (1, 3), (2, 4), (4, 6), (1, 10), (1, 11))
            ]
            dynamic = {"x": {1: seq}, "input_pos": None}
        ep = export(copy.deepcopy(m), calls[0], dynamic_shapes=dynamic)
        ops = {
            "custom": ["llama::update_cache.out", "llama::custom_sdpa.out"],
            "kv": ["llama::sdpa_with_kv_cache.out"],
            "indices": ["llama::update_cache_with_indices.out", "llama::custom_sdpa.out"],
        }[kind]
        return mf.Built(
            exported={"forward": ep},
            calls=[("forward", c) for c in calls],
            eager=_checked_eager(m, ref, name, TOL_LLM),
            inspect=_require_ops(*ops),
        )

    return build


class QuantizedCacheAttention(nn.Module):
    """int8 KV cache (per-token asymmetric, like ExecuTorch's QuantizedKVCache) updated with
    ``update_cache`` and attended with ``custom_quantized_sdpa`` (causal, from
    ``input_pos[0]``); ``reference=True`` dequantizes and runs plain PyTorch attention."""

    def __init__(
        self, reference: bool = False, dim: int = 16, heads: int = 2, max_len: int = 12
    ) -> None:
        super().__init__()
        self.reference = reference
        self.heads, self.head_dim = heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        shape = (1, max_len, heads, self.head_dim)
        pshape = (1, max_len, heads, 1)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=torch.int8))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=torch.int8))
        self.register_buffer("k_scales", torch.ones(pshape))
        self.register_buffer("v_scales", torch.ones(pshape))
        self.register_buffer("k_zps", torch.zeros(pshape, dtype=torch.int8))
        self.register_buffer("v_zps", torch.zeros(pshape, dtype=torch.int8))

    def _quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ops = torch.ops.quantized_decomposed
        s, z = ops.choose_qparams_per_token_asymmetric(x, torch.int8)
        q = ops.quantize_per_token(x, s, z, -128, 127, torch.int8)
        return q, s.to(torch.float32), z.to(torch.int8)

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim)
        k = self.wk(x).view(b, t, self.heads, self.head_dim)
        v = self.wv(x).view(b, t, self.heads, self.head_dim)
        pos = input_pos[0].item()
        torch._check_is_size(pos)
        torch._check(pos + t <= self.k_cache.size(1))
        kq, ks, kz = self._quantize(k)
        vq, vs, vz = self._quantize(v)
        qq, qs, qz = self._quantize(q)
        if self.reference:
            for cache, val in (
                (self.k_cache, kq),
                (self.k_scales, ks),
                (self.k_zps, kz),
                (self.v_cache, vq),
                (self.v_scales, vs),
                (self.v_zps, vz),
            ):
                cache[:, pos : pos + t] = val
            keys = pos + t
            deq = lambda c, s, z: (c[:, :keys].float() - z[:, :keys].float()) * s[:, :keys]  # noqa: E731
            kf = deq(self.k_cache, self.k_scales, self.k_zps).transpose(1, 2)
            vf = deq(self.v_cache, self.v_scales, self.v_zps).transpose(1, 2)
            qf = ((qq.float() - qz.float()) * qs).transpose(1, 2)
            allowed = torch.arange(keys)[None, :] <= (torch.arange(t)[:, None] + pos)
            y = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=allowed).transpose(1, 2)
        else:
            llama = torch.ops.llama
            for val, cache in (
                (kq, self.k_cache),
                (ks, self.k_scales),
                (kz, self.k_zps),
                (vq, self.v_cache),
                (vs, self.v_scales),
                (vz, self.v_zps),
            ):
                llama.update_cache(val, cache, pos)
            y = llama.custom_quantized_sdpa(
                qq,
                self.k_cache,
                self.v_cache,
                pos,
                None,
                0.0,
                True,
                None,
                qz,
                qs,
                self.k_zps,
                self.k_scales,
                self.v_zps,
                self.v_scales,
            )
        return y.reshape(b, t, -1)


def build_llama_quant_kv(name: str) -> mf.Built:
    _load_executorch_ops()
    m = QuantizedCacheAttention().eval()
    ref = QuantizedCacheAttention(reference=True).eval()
    ref.load_state_dict(m.state_dict())
    calls = [
        (torch.randn(1, t, 16), torch.tensor([p]))
        for t, p in ((3, 0), (1, 3), (2, 4), (4, 6), (2, 10))
    ]
    ep = export(
        copy.deepcopy(m),
        calls[0],
        dynamic_shapes={"x": {1: Dim("seq", min=1, max=4)}, "input_pos": None},
    )
    return mf.Built(
        exported={"forward": ep},
        calls=[("forward", c) for c in calls],
        eager=_checked_eager(m, ref, name, (1e-4, 1e-4)),
        inspect=_require_ops(
            "llama::custom_quantized_sdpa.out",
            "llama::update_cache.out",
            "quantized_decomposed::choose_qparams_per_token_asymmetric.out",
            "quantized_decomposed::quantize_per_token.out",
        ),
    )


# --------------------------------------------------------------------------------------

QUANT_DESC = (
    "Dequantized outputs: the tolerance allows one quantization step where float "
    "intermediates round differently (another runtime's convolution or matmul)."
)

FIXTURES: list[mf.FixtureSpec] = [
    mf.FixtureSpec(
        "quant_static",
        ["cnn", "quantized"],
        "SmallNet (Conv2d(3->4, 3x3, pad 1), ReLU, + y, spatial mean, Linear(4->5)) quantized "
        "with pt2e: XNNPACKQuantizer, symmetric int8 per-tensor config, 4 calibration batches, "
        "convert_pt2e; exported with to_edge + to_executorch and no partitioner, so "
        "quantize_per_tensor.out / dequantize_per_tensor.out run as kernels around float ops "
        "(weights are stored quantized and dequantized at run time). Inputs x[2, 3, 8, 8], "
        "y[2, 4, 8, 8]. " + QUANT_DESC,
        build_quant_static,
        tol=TOL_QUANT,
    ),
    mf.FixtureSpec(
        "quant_per_channel",
        ["cnn", "quantized"],
        "SmallNet quantized like quant_static with the per-channel symmetric config: weights "
        "go through dequantize_per_channel.out (int8, float64 scales, int64 zero points). "
        + QUANT_DESC,
        build_quant_static,
        tol=TOL_QUANT,
        unplanned=False,
    ),
    mf.FixtureSpec(
        "quant_dynamic",
        ["mlp", "quantized"],
        "Linear(8->16)-ReLU-Linear(16->4) with pt2e dynamic quantization (XNNPACKQuantizer, "
        "symmetric per-channel, is_dynamic=True): activations get choose_qparams.Tensor_out "
        "then quantize/dequantize_per_tensor.Tensor_out at run time, weights "
        "dequantize_per_channel.out. Input [3, 8] at three magnitudes. " + QUANT_DESC,
        build_quant_dynamic,
        tol=TOL_QUANT,
        unplanned=False,
    ),
    mf.FixtureSpec(
        "quant_per_token",
        ["mlp", "quantized"],
        "x[2, 3, 8] -> choose_qparams_per_token_asymmetric, quantize_per_token, "
        "dequantize_per_token, times int8 per-channel weights (dequantize_per_channel, axis "
        "0) = y[2, 3, 6]; and x quantized per channel along axis 2 (quantize_per_channel, "
        "float64 scales, non-zero int64 zero points) and dequantized back. Eager uses "
        "PyTorch's per-token parameter choice, which computes the scale in float32 where "
        "ExecuTorch uses double; the results agree to float rounding.",
        build_quant_per_token,
        tol=TOL_QUANT_FLOAT,
        unplanned=False,
    ),
    mf.FixtureSpec(
        "quant_embedding",
        ["quantized", "int_ops"],
        "ids int64[2, 3] looked up in one 10x8 table four ways: embedding_byte.dtype_out (int8, "
        "2 groups of 4 columns, float zero points), embedding_byte.out (per-row scales, no "
        "zero points), embedding_4bit.dtype_out (two values a byte, high nibble first, "
        "float16 scales and output), embedding_2bit.dtype_out (four values a byte, "
        "lowest bits first, 2 groups). The last call repeats the first and last rows.",
        build_quant_embedding,
        tol=TOL_QUANT_FLOAT,
        unplanned=False,
    ),
    mf.FixtureSpec(
        "quant_mixed",
        ["quantized"],
        "mixed_linear.out (x[3, 6] times int8 weight [5, 6] with scales [5, 2]: groups of 3 "
        "columns), mixed_mm.out (x times int8 [6, 4] with per-row scales) and "
        "quantized_decomposed::add.out of two uint8 [4, 5] tensors with their own "
        "(scale, zero point) requantized to a third. These ops have no eager CPU kernel, so "
        "the expected outputs come from a plain-PyTorch reference (dequantize, matmul / "
        "add, quantize with PyTorch's own quantized_decomposed functions).",
        build_quant_mixed,
        tol=TOL_QUANT_FLOAT,
        unplanned=False,
    ),
    mf.FixtureSpec(
        "llama_sdpa",
        ["transformer", "llm", "stateful", "dynamic"],
        "Attention (dim 16, 4 query heads sharing 2 key/value heads, head dim 4) with a KV "
        "cache [1, 12, 2, 4] in two planned buffers: llama::update_cache.out writes k and v "
        "at input_pos[0] (read with aten::_local_scalar_dense), llama::custom_sdpa.out "
        "attends causally from that position. Dynamic sequence length 1..4; the calls go (3 "
        "tokens at 0), (1 at 3), (2 at 4), (4 at 6), (1 at 10), (1 at 11), filling the cache "
        "(12 rows: any input_pos below 8 with up to 4 tokens fits, so random inputs run). "
        "Eager runs the same custom ops and is checked call by call against plain PyTorch "
        "attention.",
        build_llama("custom"),
        tol=TOL_LLM,
        unplanned=False,
    ),
    mf.FixtureSpec(
        "llama_sdpa_kv",
        ["transformer", "llm", "stateful", "dynamic"],
        "The llama_sdpa attention with llama::sdpa_with_kv_cache.out doing the cache update "
        "and the causal attention in one op (query, key, value, both caches, start_pos, "
        "seq_len). Same call sequence; eager checked against plain PyTorch attention.",
        build_llama("kv"),
        tol=TOL_LLM,
        unplanned=False,
    ),
    mf.FixtureSpec(
        "llama_sdpa_indices",
        ["transformer", "llm", "stateful", "dynamic"],
        "The llama_sdpa attention writing k and v with llama::update_cache_with_indices.out "
        "at explicit cache rows (indices int64[1, seq]: [0, 1, 2], [3], [7, 4], [5]) and "
        "attending with llama::custom_sdpa.out over the whole cache with a float mask input "
        "[seq, 8] (0 where a row was written, -inf elsewhere), is_causal False, scale 0.3.",
        build_llama("indices"),
        tol=TOL_LLM,
        unplanned=False,
    ),
    mf.FixtureSpec(
        "llama_quant_kv",
        ["transformer", "llm", "stateful", "dynamic", "quantized"],
        "int8 KV cache attention (2 heads, head dim 8): k, v and q quantized per token "
        "(choose_qparams_per_token_asymmetric, quantize_per_token), the int8 rows, float32 "
        "scales and int8 zero points written with llama::update_cache.out into six planned "
        "buffers, attention by llama::custom_quantized_sdpa.out (causal from input_pos[0]). "
        "Cache of 12 rows; calls (3 tokens at 0), (1 at 3), (2 at 4), (4 at 6), (2 at 10). "
        "Eager uses PyTorch's per-token "
        "parameter choice (float32 scale) where ExecuTorch's kernels use double, so int8 "
        "values can differ by one step; the tolerance allows it.",
        build_llama_quant_kv,
        tol=TOL_LLM_QUANT,
        unplanned=False,
    ),
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=mf.DEFAULT_OUT, help="output directory")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="fixtures to (re)make")
    parser.add_argument("--no-check", action="store_true", help="skip executorch.runtime replay")
    parser.add_argument("--list", action="store_true", help="list fixture names and exit")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    _load_executorch_ops()

    jobs = []
    for spec in FIXTURES:
        for unplanned in (False, True) if spec.unplanned else (False,):
            variant = spec.name + ("_unplanned" if unplanned else "")
            if args.only and spec.name not in args.only and variant not in args.only:
                continue
            jobs.append((spec, unplanned, variant))
    if args.list:
        for _, _, variant in jobs:
            print(variant)
        return 0

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest: dict[str, Any] = (
        json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    )
    failed = []
    for spec, unplanned, variant in jobs:
        print(f"[make] {variant}", flush=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                made = mf.make_fixture(spec, unplanned, out)
            for entry in made.values():
                entry["executorch_imports"] = executorch_imports(entry["operators"])
            manifest.update(made)
        except Exception as exc:
            msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            print(f"[fail] {variant}: {msg}", flush=True)
            failed.append(variant)
    manifest = dict(sorted(manifest.items()))
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"[done] {len(jobs) - len(failed)} fixtures written to {out}")
    if not args.no_check:
        import check_fixtures

        names = [v for _, _, v in jobs if v not in failed]
        verdicts = check_fixtures.check(out, names=names, update_manifest=True)
        failed += [n for n, v in verdicts.items() if "unexpected" in v]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
