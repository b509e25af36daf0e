"""The fast paths of the ``llama::`` and ``quantized_decomposed::`` kernels against the general
ones they replace: attention without masks or repeated heads, in-place cache updates,
per-token quantization in a few fused steps, quantization parameters chosen with scalars,
and embedding tables dequantized once at load."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ptexec.kernels import llm as L
from ptexec.kernels import quantized as Q


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start_pos: int,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """The general form: [B, S, H, D] over caches, keys cut to start_pos + S (no mask) or
    all of them (mask), an explicit causal mask, key/value heads repeated for the groups."""
    qt, kt, vt = (t.float().transpose(1, 2) for t in (q, k, v))
    if attn_mask is None:
        keys = start_pos + q.shape[1]
        kt, vt = kt[:, :, :keys], vt[:, :, :keys]
    mask = None
    if attn_mask is not None:
        mask = attn_mask.float()
    elif is_causal:
        rows = torch.arange(qt.shape[2])[:, None] + start_pos
        mask = torch.arange(kt.shape[2])[None, :] <= rows
    reps = qt.shape[1] // kt.shape[1]
    kt, vt = kt.repeat_interleave(reps, 1), vt.repeat_interleave(reps, 1)
    factor = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=factor).transpose(1, 2)


CASES = [
    # (q rows, heads, kv heads, start_pos, causal)
    (1, 4, 2, 0, True),
    (1, 4, 2, 17, True),
    (1, 4, 4, 30, True),
    (1, 8, 1, 5, False),
    (6, 4, 2, 0, True),  # prefill from 0: torch's causal rule
    (5, 4, 2, 9, True),  # a chunk after position 0: explicit mask
    (5, 4, 4, 9, False),
    (3, 6, 3, 0, False),
]


@pytest.mark.parametrize(("rows", "heads", "kv_heads", "start", "causal"), CASES)
def test_custom_sdpa_matches_the_masked_form(
    rows: int, heads: int, kv_heads: int, start: int, causal: bool
) -> None:
    q = _rand(2, rows, heads, 16, seed=1)
    kc, vc = _rand(2, 40, kv_heads, 16, seed=2), _rand(2, 40, kv_heads, 16, seed=3)
    for scale in (None, 0.3):
        got = L.custom_sdpa(q, kc, vc, start, None, 0.0, causal, scale)
        want = masked_attention(q, kc, vc, start, None, causal, scale)
        assert got.shape == q.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_custom_sdpa_float_mask_and_half_inputs() -> None:
    q, kc, vc = _rand(1, 3, 4, 8, seed=4), _rand(1, 10, 2, 8, seed=5), _rand(1, 10, 2, 8, seed=6)
    mask = torch.where(
        torch.rand(3, 10, generator=torch.Generator().manual_seed(7)) > 0.3, 0.0, -math.inf
    )
    mask[:, 0] = 0.0
    got = L.custom_sdpa(q, kc, vc, 0, mask, 0.0, False, None)
    torch.testing.assert_close(got, masked_attention(q, kc, vc, 0, mask, False, None))
    h = [t.half() for t in (q, kc, vc)]
    got_h = L.custom_sdpa(*h, 4, None, 0.0, True, None)
    assert got_h.dtype == torch.float32  # computed in float32; the out's dtype decides
    torch.testing.assert_close(got_h, masked_attention(*h, 4, None, True, None))


def test_single_query_makes_no_mask_and_no_copies() -> None:
    """One decode step: SDPA reads views of the caches; no mask, no repeated heads."""

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    q, kc, vc = (
        _rand(1, 1, 4, 32, seed=8),
        _rand(1, 64, 2, 32, seed=9),
        _rand(1, 64, 2, 32, seed=10),
    )
    with Ops() as ops:
        L.custom_sdpa(q, kc, vc, 20, None, 0.0, True, None)
    joined = " ".join(ops.names)
    for forbidden in ("arange", "repeat_interleave", "index_select", "clone", "le.", "copy_"):
        assert forbidden not in joined, ops.names
    with Ops() as ops:
        cache = torch.zeros(1, 64, 2, 32)
        ptr = cache.data_ptr()
        ops.names.clear()
        L.update_cache(_rand(1, 1, 2, 32), cache, 7)
    assert cache.data_ptr() == ptr
    assert [n for n in ops.names if "copy" in n] == ["aten.copy_.default"], ops.names
    assert not any("empty" in n or "clone" in n for n in ops.names), ops.names


@pytest.mark.parametrize("seq", [1, 2, 3, 6, 13])
def test_traced_attention_sums_a_few_rows_and_calls_the_kernel_past_them(seq: int) -> None:
    """The compiled tier's form: up to SUMMED_ROWS query rows (grouped heads count as rows:
    three query heads a key/value head here) as sums of products, more through the
    attention kernel; both equal the general form, causal or not, from any position."""
    rows = seq * 3
    assert (rows <= L.SUMMED_ROWS) == (seq <= 2)
    q = _rand(2, seq, 6, 16, seed=21)
    kc, vc = _rand(2, 40, 2, 16, seed=22), _rand(2, 40, 2, 16, seed=23)
    for start, causal in ((0, True), (11, True), (11, False)):
        got = L.custom_sdpa(q, kc, vc, start, None, 0.0, causal, None, traced=True)
        want = masked_attention(q, kc, vc, start, None, causal, None)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_traced_attention_of_a_symbolic_row_count_is_a_cond() -> None:
    """Traced with a dynamic query length, the choice between the two forms is made per
    call by the graph (a ``torch.cond`` on the row count): the exported program gives the
    general form's result for a decode step and for a long chunk alike."""

    class Attend(torch.nn.Module):
        def forward(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor):  # type: ignore[no-untyped-def]
            return L.custom_sdpa(q, kc, vc, pos.item(), None, 0.0, True, None, traced=True)

    kc, vc = _rand(1, 48, 2, 16, seed=24), _rand(1, 48, 2, 16, seed=25)
    seq = torch.export.Dim.AUTO(min=1, max=24)  # as the compiled tier traces it
    example = (_rand(1, 4, 6, 16, seed=26), kc, vc, torch.tensor(3))
    ep = torch.export.export(Attend(), example, dynamic_shapes=({1: seq}, None, None, None))
    assert "torch.ops.higher_order.cond" in ep.graph_module.code
    run = ep.module()
    for n, start in ((1, 30), (2, 2), (3, 0), (20, 9)):  # 3, 6, 9 and 60 rows
        q = _rand(1, n, 6, 16, seed=n)
        got = run(q, kc, vc, torch.tensor(start))
        torch.testing.assert_close(got, masked_attention(q, kc, vc, start, None, True, None))


def test_sdpa_with_kv_cache_matches_update_then_attend() -> None:
    q, k, v = _rand(1, 2, 4, 8, seed=11), _rand(1, 2, 2, 8, seed=12), _rand(1, 2, 2, 8, seed=13)
    kc, vc = torch.zeros(1, 12, 2, 8), torch.zeros(1, 12, 2, 8)
    kc2, vc2 = kc.clone(), vc.clone()
    got = L.sdpa_with_kv_cache(q, k, v, kc, vc, 3, 2, None, 0.0, True, None)
    kc2[:, 3:5], vc2[:, 3:5] = k, v
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    torch.testing.assert_close(got, masked_attention(q, kc2, vc2, 3, None, True, None))


def test_quantized_sdpa_dequantizes_only_the_rows_it_reads() -> None:
    """Cutting the caches to start_pos + q rows before dequantizing changes nothing (the
    rows past them are never read); garbage there proves it."""
    g = torch.Generator().manual_seed(14)

    def qrows(*shape: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
        s = torch.rand(*shape[:-1], 1, generator=g) * 0.05 + 0.01
        zp = torch.randint(-5, 5, (*shape[:-1], 1), generator=g, dtype=torch.int8)
        return x, zp, s

    q, qz, qs = qrows(1, 1, 4, 16)
    k, kz, ks = qrows(1, 32, 2, 16)
    v, vz, vs = qrows(1, 32, 2, 16)
    got = L.custom_quantized_sdpa(q, k, v, 9, None, 0.0, True, None, qz, qs, kz, ks, vz, vs)

    def deq(x: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (x.float() - z.float()) * s

    want = masked_attention(deq(q, qz, qs), deq(k, kz, ks), deq(v, vz, vs), 9, None, True, None)
    torch.testing.assert_close(got, want)
    ks[:, 10:] = float("nan")  # rows past start_pos + 1 are not read
    again = L.custom_quantized_sdpa(q, k, v, 9, None, 0.0, True, None, qz, qs, kz, ks, vz, vs)
    assert torch.equal(again, got)


# --------------------------------------------------------------------------------------
# quantization parameters: scalars against the vectorized rule


EDGE_ROWS = [
    (-1.0, 2.5),
    (0.5, 3.0),
    (-3.0, -0.25),
    (0.0, 0.0),
    (-1e-6, 2e-6),
    (1e-7, 3e-7),
    (-3e-7, 0.0),
    (0.0, 4e-7),
    (-1e30, 1e30),
    (-0.9999, 123.456),
    (-1.17549435e-38, 1.17549435e-38),
    (-5e-40, 7e-40),  # subnormal
    (-3.4e38, 3.4e38),
]


@pytest.mark.parametrize(("qmin", "qmax"), [(-128, 127), (0, 255), (-127, 127), (-8, 7)])
def test_scalar_qparams_equal_the_vectorized_rule(qmin: int, qmax: int) -> None:
    g = torch.Generator().manual_seed(15)
    rand = torch.randn(300, 2, generator=g) * torch.logspace(-9, 3, 300)[:, None]
    ranges = torch.tensor(EDGE_ROWS, dtype=torch.float32)
    pairs = torch.cat([ranges, rand.sort(dim=1).values.float()])
    lo, hi = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
    want_s, want_z = Q.scale_zero_point(lo, hi, qmin, qmax)
    for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        s, z = Q._scale_zero_point_scalar(a, b, qmin, qmax)
        assert s == want_s[i].item() and z == want_z[i].item(), (a, b)


def test_choose_rows_same_below_and_above_the_scalar_limit() -> None:
    x = _rand(Q._SCALAR_ROWS + 7, 24, seed=16) * torch.logspace(-8, 2, Q._SCALAR_ROWS + 7)[:, None]
    many_s, many_z = Q._choose_rows(x, -128, 127)  # vectorized
    few_s, few_z = Q._choose_rows(x[: Q._SCALAR_ROWS], -128, 127)  # scalars
    assert torch.equal(few_s, many_s[: Q._SCALAR_ROWS]) and torch.equal(
        few_z, many_z[: Q._SCALAR_ROWS]
    )
    assert few_s.dtype == torch.float64 and few_z.dtype == torch.int64


def test_per_token_fast_paths_equal_per_channel() -> None:
    x = _rand(3, 5, 32, seed=17) * 3
    s, z = Q.choose_qparams_per_token_asymmetric(x, torch.int8)
    q = Q.quantize_per_token(x, s, z, -128, 127, torch.int8)
    rows = x.reshape(-1, 32)
    want = Q.quantize_per_channel(rows, s.reshape(-1), z.reshape(-1), 0, -128, 127, torch.int8)
    assert torch.equal(q, want.reshape(x.shape))
    d = Q.dequantize_per_token(q, s, z, -128, 127, torch.int8, torch.float32)
    want_d = Q.dequantize_per_channel(want, s.reshape(-1), z.reshape(-1), 0, -128, 127, torch.int8)
    assert torch.equal(d, want_d.reshape(x.shape))
    # ties round to even, and the clamp holds, in the fused path too
    ties = torch.tensor([[0.5, 1.5, 2.5, -0.5, 1000.0, -1000.0]])
    one = torch.ones(1, 1, dtype=torch.float64)
    zero = torch.zeros(1, 1, dtype=torch.int64)
    assert Q.quantize_per_token(ties, one, zero, -128, 127, torch.int8).tolist() == [
        [0, 2, 2, 0, 127, -128]
    ]
    # the caller's float32 scales are not modified
    s32 = torch.full((1, 1), 0.5)
    Q.quantize_per_token(ties, s32, zero, -128, 127, torch.int8)
    assert s32.item() == 0.5


# --------------------------------------------------------------------------------------
# embedding tables dequantized at load


@pytest.mark.parametrize("name", ["quant_embedding"])
def test_prepared_embedding_tables_match_the_per_call_kernel(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ptexec
    from fixture_data import fixture_calls, fixture_paths

    pte, _ = fixture_paths(name)
    made: list[bool] = []
    real = Q._prepared_table

    def spy(ctx, nbit):  # type: ignore[no-untyped-def]
        table = real(ctx, nbit)
        made.append(table is not None)
        return table

    monkeypatch.setattr(Q, "_prepared_table", spy)
    prepared = ptexec.load(pte).load_method("forward")
    assert made and all(made)  # every embedding of the fixture was prepared at load
    monkeypatch.setattr(Q, "_PREPARED_TABLE_BYTES", 0)  # every table stays packed
    per_call = ptexec.load(pte).load_method("forward")
    for call in fixture_calls(name):
        a, b = prepared.execute(call["inputs"]), per_call.execute(call["inputs"])
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


def test_gather_checks_indices() -> None:
    table = _rand(6, 4, seed=18)
    assert torch.equal(
        Q._gather(table, torch.tensor([[5, 0]]), None, "embedding_4bit"),
        table[torch.tensor([[5, 0]])],
    )
    assert (
        Q._gather(table, torch.tensor([1], dtype=torch.int32), torch.float16, "e").dtype
        == torch.float16
    )
    with pytest.raises(IndexError, match=r"out of range \[0, 6\)"):
        Q._gather(table, torch.tensor([6]), None, "embedding_4bit")
    with pytest.raises(ValueError, match="int64 or int32"):
        Q._gather(table, torch.tensor([1.0]), None, "embedding_4bit")


def test_mixed_matmul_weights_prepared_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """quant_mixed's int8 weights are constants: dequantized once at load, with the same
    results as dequantizing on every call."""
    import ptexec
    from fixture_data import fixture_calls, fixture_paths

    pte, _ = fixture_paths("quant_mixed")
    seen: list[bool] = []
    real = Q._constant_tensors

    def spy(ctx, positions):  # type: ignore[no-untyped-def]
        found = real(ctx, positions)
        seen.append(found is not None)
        return found

    monkeypatch.setattr(Q, "_constant_tensors", spy)
    prepared = ptexec.load(pte).load_method("forward")
    assert seen.count(True) == 2  # mixed_mm and mixed_linear
    monkeypatch.setattr(Q, "_constant_tensors", lambda ctx, positions: None)
    per_call = ptexec.load(pte).load_method("forward")
    for call in fixture_calls("quant_mixed"):
        for x, y in zip(
            prepared.execute(call["inputs"]), per_call.execute(call["inputs"]), strict=True
        ):
            assert torch.equal(x, y)


def test_mixed_matmul_prepared_weight_checks_the_input() -> None:
    w = torch.randint(-128, 128, (5, 6), dtype=torch.int8)
    s = torch.rand(5, 2) + 0.5
    prepared = Q._mixed_linear_weight(w, s, None)
    x = _rand(3, 6, seed=19)
    assert torch.equal(
        Q._mixed_linear_apply(x, prepared, None), Q.mixed_linear(x, w, s, None, None)
    )
    with pytest.raises(ValueError, match="do not fit"):
        Q._mixed_linear_apply(_rand(3, 5), prepared, None)
    with pytest.raises(ValueError, match="zero points"):
        Q._mixed_mm_weight(w, s[:, 0], torch.zeros(5))
