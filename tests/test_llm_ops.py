"""``llama::`` kernels: KV-cache fixtures against eager PyTorch and ExecuTorch's runtime, and
each kernel against a float64 reference written out loop by loop (and against ExecuTorch's
ahead-of-time kernels when installed)."""

from __future__ import annotations

import importlib
import math
from typing import Any

import pytest
import torch

import ptexec
from export_util import one_op_program
from fixture_data import compare_outputs, fixture_calls, fixture_paths, load_manifest, tolerance
from ptexec.kernels import llm as L

MANIFEST = load_manifest()
FIXTURES = sorted(n for n, e in MANIFEST.items() if "llm" in e["tags"])
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def ref_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start_pos: int,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """q [B, S, H, D] over caches [B, L, H_kv, D], in float64, one query row at a time."""
    q, k, v = q.double(), k.double(), v.double()
    batch, seq, heads, dim = q.shape
    rep = heads // k.shape[2]
    keys = k.shape[1] if mask is not None else start_pos + seq
    factor = scale if scale is not None else 1 / math.sqrt(dim)
    out = torch.zeros(batch, seq, heads, dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            kh = h // rep
            for i in range(seq):
                scores = []
                for j in range(keys):
                    s = float(q[b, i, h] @ k[b, j, kh]) * factor
                    if mask is not None:
                        s += float(mask[i, j])
                    if causal and j > start_pos + i:
                        s = -math.inf
                    scores.append(s)
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for j, w in enumerate(weights):
                    out[b, i, h] += (w / total) * v[b, j, kh]
    return out


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------
# fixtures


def _replay(name: str, **options: Any) -> list[list[Any]]:
    pte, ptd = fixture_paths(name)
    method = ptexec.load(pte, data_path=ptd).load_method("forward", **options)
    return [method.execute(call["inputs"]) for call in fixture_calls(name)]


def test_fixtures_present() -> None:
    assert {"llama_sdpa", "llama_sdpa_kv", "llama_sdpa_indices", "llama_quant_kv"} <= set(FIXTURES)


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_eager(name: str) -> None:
    for i, (got, call) in enumerate(zip(_replay(name), fixture_calls(name), strict=True)):
        problem = compare_outputs(got, call["outputs"], *tolerance(name))
        assert problem is None, f"{name} call {i}: {problem}"


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_executorch_runtime(name: str) -> None:
    runtime = pytest.importorskip("executorch.runtime").Runtime.get()
    for module in MANIFEST[name].get("executorch_imports", []):
        importlib.import_module(module)
    pte, _ = fixture_paths(name)
    et_method = runtime.load_program(pte).load_method("forward")
    for i, (got, call) in enumerate(zip(_replay(name), fixture_calls(name), strict=True)):
        expected = list(et_method.execute(call["inputs"]))
        problem = compare_outputs(got, expected, *tolerance(name))
        assert problem is None, f"{name} call {i} vs ExecuTorch: {problem}"


def test_fixture_cache_state_persists_and_resets_per_load() -> None:
    """The cache lives in the method's planned memory: a fresh load starts from zeros."""
    name = "llama_sdpa"
    calls = fixture_calls(name)
    pte, _ = fixture_paths(name)
    prog = ptexec.load(pte)
    first = prog.load_method("forward")
    for call in calls[:2]:
        first.execute(call["inputs"])
    second = prog.load_method("forward")
    got = second.execute(calls[0]["inputs"])
    assert compare_outputs(got, calls[0]["outputs"], *tolerance(name)) is None


# --------------------------------------------------------------------------------------
# update_cache


def test_update_cache_writes_rows() -> None:
    cache = torch.zeros(2, 6, 3, 4)
    value = _rand(2, 2, 3, 4)
    L.update_cache(value, cache, 3)
    assert torch.equal(cache[:, 3:5], value)
    assert not cache[:, :3].any() and not cache[:, 5:].any()
    L.update_cache(value[:, :1], cache, 5)  # the last row
    assert torch.equal(cache[:, 5], value[:, 0])


def test_update_cache_bounds_and_shapes() -> None:
    cache = torch.zeros(1, 4, 2, 2)
    with pytest.raises(ValueError, match="do not fit"):
        L.update_cache(torch.ones(1, 2, 2, 2), cache, 3)
    with pytest.raises(ValueError, match="do not fit"):
        L.update_cache(torch.ones(1, 1, 2, 2), cache, 4)
    with pytest.raises(ValueError, match="heads"):
        L.update_cache(torch.ones(1, 1, 3, 2), cache, 0)
    with pytest.raises(ValueError, match="element sizes"):
        L.update_cache(torch.ones(1, 1, 2, 2, dtype=torch.float64), cache, 0)


def test_update_cache_copies_bits_between_same_size_dtypes() -> None:
    cache = torch.zeros(1, 2, 1, 2)
    value = torch.tensor([[[[1065353216, -1]]]], dtype=torch.int32)  # 1.0f and a NaN pattern
    L.update_cache(value, cache, 1)
    assert torch.equal(cache[0, 1].view(torch.int32), value[0, 0])


def test_update_cache_with_indices() -> None:
    cache = torch.zeros(2, 5, 1, 3)
    value = _rand(2, 2, 1, 3)
    indices = torch.tensor([[4, 0], [2, 3]])
    L.update_cache_with_indices(value, cache, 99, indices)  # start_pos is ignored
    assert torch.equal(cache[0, 4], value[0, 0]) and torch.equal(cache[0, 0], value[0, 1])
    assert torch.equal(cache[1, 2], value[1, 0]) and torch.equal(cache[1, 3], value[1, 1])
    assert not cache[0, 1:4].any() and not cache[1, [0, 1, 4]].any()
    with pytest.raises(IndexError, match="out of range"):
        L.update_cache_with_indices(value, cache, 0, torch.tensor([[5, 0], [0, 0]]))
    with pytest.raises(IndexError, match="out of range"):
        L.update_cache_with_indices(value, cache, 0, torch.tensor([[-1, 0], [0, 0]]))
    with pytest.raises(ValueError, match="indices must be"):
        L.update_cache_with_indices(value, cache, 0, torch.tensor([0, 1]))


@pytest.mark.parametrize("traced", [False, True])
def test_update_cache_with_repeated_indices_keeps_the_last_row(traced: bool) -> None:
    """A ring-buffer cache whose prefill is longer than its window writes slots more than
    once: the last row written to a slot is its value, as ExecuTorch writes rows in order
    (index_put_ writes repeated indices in no set order)."""
    window, seq = 4, 64
    for batch in (1, 2):
        value = _rand(batch, seq, 8, 64, seed=batch)
        indices = ((torch.arange(seq) + 3 * torch.arange(batch)[:, None]) % window).contiguous()
        cache = torch.zeros(batch, window, 8, 64)
        L.update_cache_with_indices(value, cache, 0, indices, traced=traced)
        for b in range(batch):
            for r in range(seq - window, seq):
                assert torch.equal(cache[b, int(indices[b, r])], value[b, r]), (batch, b, r)


# --------------------------------------------------------------------------------------
# attention


@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 2), (4, 1), (9, 3)])
@pytest.mark.parametrize(("start_pos", "seq"), [(0, 3), (3, 1), (2, 4), (7, 1), (0, 8)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("traced", [False, True])  # traced: the compiled tier's form
def test_custom_sdpa_causal(
    heads: int, kv_heads: int, start_pos: int, seq: int, causal: bool, traced: bool
) -> None:
    q = _rand(2, seq, heads, 4, seed=1)
    k = _rand(2, 8, kv_heads, 4, seed=2)
    v = _rand(2, 8, kv_heads, 4, seed=3)
    got = L.custom_sdpa(q, k, v, start_pos, None, 0.0, causal, traced=traced)
    assert got.shape == q.shape
    want = ref_attention(q, k, v, start_pos, causal=causal)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_custom_sdpa_ignores_rows_past_the_query() -> None:
    """Without a mask only the first start_pos + seq cache rows take part, causal or not."""
    q = _rand(1, 2, 2, 4, seed=4)
    k = _rand(1, 8, 2, 4, seed=5)
    v = _rand(1, 8, 2, 4, seed=6)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, 5:] = 1e4
    poisoned_v[:, 5:] = float("nan")
    poisoned_k[:, 6:] = float("inf")
    for causal in (False, True):
        want = ref_attention(q, k, v, 3, causal=causal)
        for traced in (False, True):  # traced: the compiled tier's form (keys masked)
            got = L.custom_sdpa(q, poisoned_k, poisoned_v, 3, None, 0.0, causal, traced=traced)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_custom_quantized_sdpa_ignores_rows_past_the_query() -> None:
    """The int8 caches' scales past the key range are never read either (NaN there)."""
    q, qs, qz = _quantize_rows(_rand(1, 2, 2, 8, seed=22))
    k, ks, kz = _quantize_rows(_rand(1, 6, 2, 8, seed=23))
    v, vs, vz = _quantize_rows(_rand(1, 6, 2, 8, seed=24))
    deq = [((t.float() - z.float()) * s) for t, s, z in ((q, qs, qz), (k, ks, kz), (v, vs, vz))]
    want = ref_attention(*deq, 3, causal=True)
    ks, vs = ks.clone(), vs.clone()
    ks[:, 5:], vs[:, 5:] = float("nan"), float("inf")
    for traced in (False, True):
        got = L.custom_quantized_sdpa(
            q, k, v, 3, None, 0.0, True, None, qz, qs, kz, ks, vz, vs, traced=traced
        )
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_custom_sdpa_mask_covers_the_whole_cache() -> None:
    q = _rand(1, 3, 4, 4, seed=7)
    k = _rand(1, 6, 2, 4, seed=8)
    v = _rand(1, 6, 2, 4, seed=9)
    mask = torch.zeros(3, 6)
    mask[:, [1, 4]] = float("-inf")
    mask[0, 0] = -1.5
    got = L.custom_sdpa(q, k, v, 0, mask, 0.0, False, 0.3)
    want = ref_attention(q, k, v, 0, mask=mask, scale=0.3)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_custom_sdpa_errors() -> None:
    q, k = torch.zeros(1, 2, 2, 4), torch.zeros(1, 4, 2, 4)
    with pytest.raises(ValueError, match="both"):
        L.custom_sdpa(q, k, k, 0, torch.zeros(2, 4), 0.0, True)
    with pytest.raises(ValueError, match="exceed"):
        L.custom_sdpa(q, k, k, 3, None, 0.0, True)
    # ExecuTorch's kernel takes a float mask only: a bool one was added as 1.0/0.0
    with pytest.raises(ValueError, match="float tensor"):
        L.custom_sdpa(q, k, k, 0, torch.ones(2, 4, dtype=torch.bool), 0.0, False)
    with pytest.raises(ValueError, match="start_pos"):
        L.custom_sdpa(q, k, k, -1, None, 0.0, True)
    with pytest.raises(ValueError, match="share"):
        L.custom_sdpa(torch.zeros(1, 2, 3, 4), k, k, 0, None, 0.0, True)
    with pytest.raises(ValueError, match="attn_mask must be"):
        L.custom_sdpa(q, k, k, 0, torch.zeros(2, 3), 0.0, False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_custom_sdpa_reduced_precision(dtype: torch.dtype) -> None:
    q = _rand(1, 2, 2, 8, seed=10).to(dtype)
    k = _rand(1, 5, 2, 8, seed=11).to(dtype)
    v = _rand(1, 5, 2, 8, seed=12).to(dtype)
    got = L.custom_sdpa(q, k, v, 2, None, 0.0, True)
    want = ref_attention(q, k, v, 2, causal=True)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)  # computed in float32


def test_sdpa_with_kv_cache_updates_then_attends() -> None:
    k_cache, v_cache = torch.zeros(1, 6, 2, 4), torch.zeros(1, 6, 2, 4)
    q = _rand(1, 2, 4, 4, seed=13)
    k = _rand(1, 2, 2, 4, seed=14)
    v = _rand(1, 2, 2, 4, seed=15)
    got = L.sdpa_with_kv_cache(q, k, v, k_cache, v_cache, 1, 2, None, 0.0, True)
    assert torch.equal(k_cache[:, 1:3], k) and torch.equal(v_cache[:, 1:3], v)
    want = ref_attention(q, k_cache, v_cache, 1, causal=True)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        L.sdpa_with_kv_cache(q, k, v, k_cache, v_cache, 5, 2, None, 0.0, True)


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row asymmetric int8 (any reasonable parameters will do for the reference)."""
    lo = x.amin(-1, keepdim=True).clamp(max=0)
    hi = x.amax(-1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 255).clamp(min=1e-6)
    zp = (-128 - torch.round(lo / scale)).clamp(-128, 127)
    q = torch.clamp(torch.round(x / scale) + zp, -128, 127).to(torch.int8)
    return q, scale, zp.to(torch.int8)


@pytest.mark.parametrize("seq_at_dim_2", [False, True])
def test_custom_quantized_sdpa(seq_at_dim_2: bool) -> None:
    q, qs, qz = _quantize_rows(_rand(1, 2, 2, 8, seed=16))
    k, ks, kz = _quantize_rows(_rand(1, 6, 2, 8, seed=17))
    v, vs, vz = _quantize_rows(_rand(1, 6, 2, 8, seed=18))
    deq = [((t.float() - z.float()) * s) for t, s, z in ((q, qs, qz), (k, ks, kz), (v, vs, vz))]
    want = ref_attention(*deq, 3, causal=True)
    args: list[torch.Tensor] = [q, k, v, qz, qs, kz, ks, vz, vs]
    if seq_at_dim_2:
        args = [t.transpose(1, 2).contiguous() for t in args]
    got = L.custom_quantized_sdpa(
        args[0], args[1], args[2], 3, None, 0.0, True, None, *args[3:], seq_at_dim_2
    )
    if seq_at_dim_2:
        got = got.transpose(1, 2)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="scales and zero points"):
        L.custom_quantized_sdpa(q, k, v, 3, None, 0.0, True, None, None, None, kz, ks, vz, vs)


def test_custom_quantized_sdpa_float_inputs_are_custom_sdpa() -> None:
    q, k, v = _rand(1, 2, 2, 4, seed=19), _rand(1, 5, 2, 4, seed=20), _rand(1, 5, 2, 4, seed=21)
    assert torch.equal(
        L.custom_quantized_sdpa(q, k, v, 1, None, 0.0, True),
        L.custom_sdpa(q, k, v, 1, None, 0.0, True),
    )


# --------------------------------------------------------------------------------------
# ExecuTorch's own kernels (its ahead-of-time library)


@pytest.fixture(scope="module")
def llama_ops() -> Any:
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    return torch.ops.llama


@pytest.mark.parametrize(
    ("heads", "kv_heads", "start_pos", "seq"), [(4, 2, 0, 3), (4, 2, 5, 1), (2, 2, 3, 2)]
)
def test_matches_executorch_custom_sdpa(
    llama_ops: Any, heads: int, kv_heads: int, start_pos: int, seq: int
) -> None:
    q = _rand(2, seq, heads, 8, seed=22)
    k = _rand(2, 8, kv_heads, 8, seed=23)
    v = _rand(2, 8, kv_heads, 8, seed=24)
    for causal in (True, False):
        want = llama_ops.custom_sdpa(q, k, v, start_pos, None, 0.0, causal)
        torch.testing.assert_close(
            L.custom_sdpa(q, k, v, start_pos, None, 0.0, causal), want, rtol=1e-5, atol=1e-5
        )
    mask = torch.zeros(seq, 8)
    mask[:, ::3] = float("-inf")
    want = llama_ops.custom_sdpa(q, k, v, start_pos, mask, 0.0, False, 0.2)
    torch.testing.assert_close(
        L.custom_sdpa(q, k, v, start_pos, mask, 0.0, False, 0.2), want, rtol=1e-5, atol=1e-5
    )


def test_matches_executorch_sdpa_with_kv_cache_and_update(llama_ops: Any) -> None:
    caches = [torch.zeros(1, 6, 2, 4) for _ in range(4)]
    for step, (pos, seq) in enumerate([(0, 3), (3, 1), (4, 2)]):
        q = _rand(1, seq, 4, 4, seed=30 + step)
        k = _rand(1, seq, 2, 4, seed=40 + step)
        v = _rand(1, seq, 2, 4, seed=50 + step)
        want = llama_ops.sdpa_with_kv_cache(
            q, k, v, caches[0], caches[1], pos, seq, None, 0.0, True
        )
        got = L.sdpa_with_kv_cache(q, k, v, caches[2], caches[3], pos, seq, None, 0.0, True)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    a, b = torch.zeros(2, 5, 1, 3), torch.zeros(2, 5, 1, 3)
    value = _rand(2, 2, 1, 3, seed=60)
    llama_ops.update_cache(value, a, 2)
    L.update_cache(value, b, 2)
    assert torch.equal(a, b)
    indices = torch.tensor([[4, 0], [1, 3]])
    llama_ops.update_cache_with_indices(value, a, 0, indices)
    L.update_cache_with_indices(value, b, 0, indices)
    assert torch.equal(a, b)


def test_matches_executorch_quantized_sdpa(llama_ops: Any) -> None:
    q, qs, qz = _quantize_rows(_rand(1, 2, 2, 8, seed=70))
    k, ks, kz = _quantize_rows(_rand(1, 6, 2, 8, seed=71))
    v, vs, vz = _quantize_rows(_rand(1, 6, 2, 8, seed=72))
    want = llama_ops.custom_quantized_sdpa(
        q, k, v, 3, None, 0.0, True, None, qz, qs, kz, ks, vz, vs
    )
    got = L.custom_quantized_sdpa(q, k, v, 3, None, 0.0, True, None, qz, qs, kz, ks, vz, vs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seq_at_dim_2", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("quantized", [False, True])
def test_matches_executorch_quantized_sdpa_layouts(
    llama_ops: Any, seq_at_dim_2: bool, causal: bool, quantized: bool
) -> None:
    """Both layouts, int8 or float inputs (float: the parameters unused), on the host and
    in the traced form, as ExecuTorch's kernel computes them (its key range counts the
    query's dim 1 for float inputs, the sequence dim for int8 ones)."""
    shapes = [(1, 3, 4, 8), (1, 9, 2, 8), (1, 9, 2, 8)]  # [B, S, H, D]; 4 heads over 2
    if seq_at_dim_2:
        shapes = [(b, h, s, d) for b, s, h, d in shapes]
    rows = [_quantize_rows(_rand(*shape, seed=90 + i)) for i, shape in enumerate(shapes)]
    (q, qs, qz), (k, ks, kz), (v, vs, vz) = rows
    if not quantized:
        q, k, v = (((t.float() - z.float()) * s) for t, s, z in rows)
    args = (q, k, v, 2, None, 0.0, causal, None, qz, qs, kz, ks, vz, vs, seq_at_dim_2)
    want = llama_ops.custom_quantized_sdpa(*args)
    for traced in (False, True):
        got = L.custom_quantized_sdpa(*args, traced=traced)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gated_delta_rule", "channelwise_gated_delta_rule"])
@pytest.mark.parametrize("seq", [4, 1])
def test_gated_delta_rule_runs_as_executorch_runs_it(llama_ops: Any, name: str, seq: int) -> None:
    """ExecuTorch's gated delta rule, through its ahead-of-time library (the only kernel
    there is): its out form refuses a final state that shares a storage with the initial
    one, as every planned tensor of a method shares its arena's; the method still gives
    what the op gives in eager PyTorch (and ExecuTorch's runtime gives)."""
    op = getattr(llama_ops, name)
    batch, heads, kv_heads, kdim, vdim = 1, 4, 2, 4, 3
    q = torch.nn.functional.normalize(_rand(batch, heads, seq, kdim, seed=90), dim=-1)
    k = torch.nn.functional.normalize(_rand(batch, kv_heads, seq, kdim, seed=91), dim=-1)
    v = _rand(batch, kv_heads, seq, vdim, seed=92)
    decay = -torch.rand(batch, kv_heads, seq, kdim, generator=torch.Generator().manual_seed(93))
    beta = torch.rand(batch, kv_heads, seq, generator=torch.Generator().manual_seed(94))
    state = _rand(batch, kv_heads, kdim, vdim, seed=95)
    inputs = (q, k, v, decay, beta, state)
    want = op(*inputs)
    method = ptexec.load(one_op_program(op, inputs)).load_method("forward")
    assert f"llama::{name}.out" in method.meta.operators
    for _ in range(2):  # the second call over the memory the first one left
        got = method(*inputs)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------
# CUDA


@CUDA
@pytest.mark.parametrize("seq", [1, 6])
def test_cuda_traced_attention_matches_cpu(seq: int) -> None:
    """The compiled tier's attention on the GPU: a decode step's few rows as sums (one
    row, two query heads a key/value head), a chunk through the kernel."""
    dev = torch.device("cuda")
    q, k, v = _rand(1, seq, 4, 8, seed=83), _rand(1, 12, 2, 8, seed=84), _rand(1, 12, 2, 8, seed=85)
    want = L.custom_sdpa(q, k, v, 3, None, 0.0, True, traced=True)
    got = L.custom_sdpa(q.to(dev), k.to(dev), v.to(dev), 3, None, 0.0, True, traced=True)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


@CUDA
def test_cuda_matches_cpu() -> None:
    dev = torch.device("cuda")
    q, k, v = _rand(1, 3, 4, 8, seed=80), _rand(1, 8, 2, 8, seed=81), _rand(1, 8, 2, 8, seed=82)
    want = L.custom_sdpa(q, k, v, 2, None, 0.0, True)
    got = L.custom_sdpa(q.to(dev), k.to(dev), v.to(dev), 2, None, 0.0, True)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    cache = torch.zeros(1, 8, 2, 8, device=dev)
    L.update_cache(k[:, :3].to(dev), cache, 4)
    assert torch.equal(cache[:, 4:7].cpu(), k[:, :3])
    L.update_cache_with_indices(v[:, :2].to(dev), cache, 0, torch.tensor([[7, 0]], device=dev))
    assert torch.equal(cache[0, 7].cpu(), v[0, 0]) and torch.equal(cache[0, 0].cpu(), v[0, 1])


@CUDA
@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_on_cuda(name: str) -> None:
    results = _replay(name, device_map="cuda")
    for i, (got, call) in enumerate(zip(results, fixture_calls(name), strict=True)):
        got = [t.cpu() if isinstance(t, torch.Tensor) else t for t in got]
        problem = compare_outputs(got, call["outputs"], *tolerance(name))
        assert problem is None, f"{name} call {i} on CUDA: {problem}"
