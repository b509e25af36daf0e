"""The custom kernels whose traced form differs from the one the interpreter runs (checks
that read data left out, keys masked instead of sliced, every cached row dequantized, the
vectorized choice of quantization parameters) on edge values: the interpreter's statement
and the compiled tier's functional form of the same instruction give equal results, and
refuse the same arguments. The reference for each kernel's numbers is in its own tests
(``test_llm_ops.py``, ``test_quantized_ops.py``); here the two tiers are held to each other."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from compile_util import one_kernel_forms
from ptexec.compile.functional import Env
from ptexec.dtypes import DTYPE_TO_CODE
from ptexec.format import program as p
from ptexec.kernels.fixed_args import SIGNATURES
from ptexec.kernels.registry import KernelContext, find_kernel

OUT = object()  # stands for an out tensor in a list of arguments


def _desc(x: Any, constant: bool = False) -> p.EValue:
    if isinstance(x, torch.Tensor):
        dims = tuple(range(x.dim()))
        return p.Tensor(
            DTYPE_TO_CODE[x.dtype],
            0,
            tuple(x.shape),
            dims,
            False,
            1 if constant else 0,
            None,
            0,
            p.DYNAMIC_UNBOUND,
            None,
        )
    if x is None:
        return p.Null()
    if isinstance(x, bool):
        return p.Bool(x)
    if isinstance(x, int):
        return p.Int(x)
    return p.Double(x)


def _instruction(
    name: str, args: list[Any], constant: frozenset[int], out_dtypes: tuple[torch.dtype, ...]
) -> tuple[tuple[p.EValue, ...], list[Any], tuple[int, ...], list[int]]:
    """Values, the values table, the KernelCall's arguments and the out slots for ``name``
    on ``args`` (a torch dtype becomes its ScalarType code; outs are empty tensors of
    ``out_dtypes``, which the program may resize)."""
    sig = SIGNATURES[name]
    given = [DTYPE_TO_CODE[a] if isinstance(a, torch.dtype) else a for a in args]
    dtypes = out_dtypes[: max(sig.outs, 1)]
    outs = [torch.empty(0, dtype=d) for d in dtypes]
    table: list[Any] = [*given, *outs]
    values = [_desc(x, k in constant) for k, x in enumerate(table)]
    slots = list(range(len(given), len(table)))
    if len(slots) == 1:
        ret = slots[0]
    else:
        ret = len(table)
        table.append(None)
        values.append(p.TensorList(tuple(slots)))
    return tuple(values), table, (*range(len(table) - (len(slots) > 1)), ret), slots


def _outcome(run: Any) -> Any:
    try:
        return run()
    except (ValueError, IndexError, RuntimeError) as e:
        return ("raises", e)


def _interpreted(
    name: str,
    args: list[Any],
    constant: frozenset[int] = frozenset(),
    out_dtypes: tuple[torch.dtype, ...] = (torch.float32,),
) -> Any:
    """The interpreter's statement for ``name``: its outs, then the tensors it mutated."""
    values, table, call_args, slots = _instruction(name, _cloned(args), constant, out_dtypes)
    ctx = KernelContext(name, 0, call_args, values, frozenset(), table)
    factory = find_kernel(name)
    assert factory is not None
    sig = SIGNATURES[name]

    def run() -> Any:
        emission = factory(ctx)
        exec(emission.code, {**emission.env, "v": table})
        outs = [table[s] for s in slots] if sig.outs else []
        return [*outs, *(table[k] for k in sig.mutated_positions)]

    return _outcome(run)


def _compiled(
    name: str, args: list[Any], out_dtypes: tuple[torch.dtype, ...] = (torch.float32,)
) -> Any:
    """The compiled tier's functional form of the same instruction, run on an :class:`Env`."""
    values, table, call_args, slots = _instruction(name, _cloned(args), frozenset(), out_dtypes)
    forms = one_kernel_forms(values, call_args, name)
    assert forms.reason(0, 0) is None
    sig = SIGNATURES[name]
    env = Env(lambda j: table[j])

    def run() -> Any:
        forms.step(env, 0, 0)
        outs = [env[s] for s in slots] if sig.outs else []
        return [*outs, *(env[k] for k in sig.mutated_positions)]

    return _outcome(run)


def _cloned(args: list[Any]) -> list[Any]:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _agree(
    name: str,
    args: list[Any],
    exact: bool = True,
    constant: frozenset[int] = frozenset(),
    outs: tuple[torch.dtype, ...] = (torch.float32,),
) -> None:
    want = _interpreted(name, args, constant, outs)
    got = _compiled(name, args, outs)
    if isinstance(want, tuple) or isinstance(got, tuple):
        assert isinstance(want, tuple) and isinstance(got, tuple), f"{name}: {want} vs {got}"
        return  # both refuse the arguments (each tier with its own message)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact:
            assert torch.equal(g, w), f"{name}: {g} != {w}"
        else:  # the same attention, over the rows in range or masked past them
            torch.testing.assert_close(g, w)


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return x.to(dtype)


# ---- KV caches ---------------------------------------------------------------------------

ROWS = 6


@pytest.mark.parametrize("seq", [1, 3])
@pytest.mark.parametrize("start", [0, 2, ROWS - 3, ROWS - 1, ROWS, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_update_cache(seq: int, start: int, dtype: torch.dtype) -> None:
    value = _rand(1, seq, 2, 4, seed=seq)
    cache = _rand(1, ROWS, 2, 4, seed=7).to(dtype)  # int32: the bits of float32 values
    _agree("llama::update_cache.out", [value, cache, start])


@pytest.mark.parametrize(
    "indices",
    [[[0, 5]], [[5, 0]], [[2, 3]], [[6, 0]], [[-1, 1]]],
)
def test_update_cache_with_indices(indices: list[list[int]]) -> None:
    value = _rand(1, 2, 2, 4, seed=1)
    cache = _rand(1, ROWS, 2, 4, seed=2)
    ids = torch.tensor(indices)
    _agree("llama::update_cache_with_indices.out", [value, cache, 0, ids])


KV = 10  # cached rows; the rows past a query's range hold stale (finite) values


def _mask(seq: int, kind: str) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "empty":
        return torch.empty(0)
    mask = torch.zeros(seq, KV)
    mask[:, 1::3] = -torch.inf
    return mask


@pytest.mark.parametrize("seq", [1, 4])
@pytest.mark.parametrize("start", [0, 1, KV - 4, KV - 1, KV])
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize(("causal", "mask"), [(False, "none"), (True, "none"), (False, "given")])
def test_custom_sdpa(seq: int, start: int, kv_heads: int, causal: bool, mask: str) -> None:
    q = _rand(1, seq, 4, 8, seed=1)
    k = _rand(1, KV, kv_heads, 8, seed=2)
    v = _rand(1, KV, kv_heads, 8, seed=3)
    args = [q, k, v, start, _mask(seq, mask), 0.0, causal, None]
    _agree("llama::custom_sdpa.out", args, exact=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_custom_sdpa_reduced_precision_and_empty_mask(dtype: torch.dtype) -> None:
    q = _rand(1, 3, 4, 8, seed=4, dtype=dtype)
    k = _rand(1, KV, 2, 8, seed=5, dtype=dtype)
    v = _rand(1, KV, 2, 8, seed=6, dtype=dtype)
    for start, mask, causal in ((2, None, True), (0, "empty", False), (5, None, False)):
        args = [q, k, v, start, _mask(3, mask or "none"), 0.0, causal, 0.25]
        _agree("llama::custom_sdpa.out", args, exact=False, outs=(dtype,))


def test_custom_sdpa_refuses_what_the_interpreter_refuses() -> None:
    q, k = _rand(1, 2, 4, 8, seed=1), _rand(1, KV, 3, 8, seed=2)
    name = "llama::custom_sdpa.out"
    _agree(name, [q, k, k, 0, None, 0.0, False, None])  # 4 heads cannot share 3
    k = _rand(1, KV, 2, 8, seed=2)
    _agree(name, [q, k, k, 0, torch.zeros(2, KV), 0.0, True, None])  # mask and causal
    _agree(name, [q, k, k, 0, torch.zeros(3, KV), 0.0, False, None])  # mask's shape
    _agree(name, [q, k, k.double(), 0, None, 0.0, False, None])  # dtypes differ


@pytest.mark.parametrize("start", [0, 3, KV - 2, KV - 1])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_with_kv_cache(start: int, causal: bool) -> None:
    q, k, v = _rand(1, 2, 4, 8, seed=1), _rand(1, 2, 2, 8, seed=2), _rand(1, 2, 2, 8, seed=3)
    kc, vc = _rand(1, KV, 2, 8, seed=4), _rand(1, KV, 2, 8, seed=5)
    args = [q, k, v, kc, vc, start, 2, None, 0.0, causal, None]
    _agree("llama::sdpa_with_kv_cache.out", args, exact=False)


def _quantized_rows(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """int8 rows of ``x`` with per-row float scales and int8 zero points (last dim 1)."""
    lo = x.amin(dim=-1, keepdim=True).clamp(max=0)
    hi = x.amax(dim=-1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 255).clamp(min=1e-6)
    zp = (-128 - torch.round(lo / scale)).clamp(-128, 127)
    q = (torch.round(x / scale) + zp).clamp(-128, 127).to(torch.int8)
    return q, scale, zp.to(torch.int8)


@pytest.mark.parametrize("seq_at_dim_2", [False, True])
@pytest.mark.parametrize("start", [0, 4, KV - 3, KV - 2])
@pytest.mark.parametrize("causal", [False, True])
def test_custom_quantized_sdpa(seq_at_dim_2: bool, start: int, causal: bool) -> None:
    seq = 3
    shapes = [(1, seq, 4, 8), (1, KV, 2, 8), (1, KV, 2, 8)]
    if seq_at_dim_2:
        shapes = [(b, h, s, d) for b, s, h, d in shapes]
    (q, qs, qz), (k, ks, kz), (v, vs, vz) = (
        _quantized_rows(_rand(*shape, seed=i)) for i, shape in enumerate(shapes)
    )
    args = [q, k, v, start, None, 0.0, causal, None, qz, qs, kz, ks, vz, vs, seq_at_dim_2]
    _agree("llama::custom_quantized_sdpa.out", args, exact=False)
    floats = [t.float() for t in (q, k, v)]
    _agree("llama::custom_quantized_sdpa.out", [*floats, *args[3:]], exact=False)


def test_custom_quantized_sdpa_refuses_missing_parameters() -> None:
    q, s, z = _quantized_rows(_rand(1, 2, 4, 8, seed=1))
    k, ks, kz = _quantized_rows(_rand(1, KV, 4, 8, seed=2))
    name = "llama::custom_quantized_sdpa.out"
    _agree(name, [q, k, k, 0, None, 0.0, False, None, z, s, None, ks, kz, ks, False])
    _agree(name, [q, k, k, 0, None, 0.0, False, None, z, s, kz[..., 0], ks, kz, ks, False])


# ---- quantized embeddings and parameters ----------------------------------------------------


def _packed(rows: int, dim: int, nbit: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if nbit == 8:
        return torch.randint(-128, 128, (rows, dim), generator=g, dtype=torch.int8)
    return torch.randint(0, 256, (rows, dim * nbit // 8), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize(
    ("op", "nbit"), [("embedding_byte", 8), ("embedding_4bit", 4), ("embedding_2bit", 2)]
)
@pytest.mark.parametrize("groups", [0, 1, 4])
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("constant", [False, True])
def test_quantized_embedding(
    op: str, nbit: int, groups: int, zero_points: bool, constant: bool
) -> None:
    rows, dim = 5, 16
    weight = _packed(rows, dim, nbit, seed=nbit)
    shape = (rows,) if groups == 0 else (rows, groups)
    scales = torch.rand(shape, generator=torch.Generator().manual_seed(1)) + 0.01
    zp = (
        torch.randint(-8, 8, shape, generator=torch.Generator().manual_seed(2)).float()
        if zero_points
        else None
    )
    # constant: the interpreter dequantizes the whole table at load and gathers rows
    fixed = frozenset({0, 1, 2}) if constant else frozenset()
    lo, hi = (-128, 127) if nbit == 8 else (-(1 << (nbit - 1)), (1 << (nbit - 1)) - 1)
    ids = torch.tensor([[0, 4], [4, 4]])
    for given in (ids, torch.tensor([2, 0], dtype=torch.int32)):
        args = [weight, scales, zp, lo, hi, given]
        _agree(f"quantized_decomposed::{op}.out", args, constant=fixed)
        for dtype in (torch.float16, None):
            name = f"quantized_decomposed::{op}.dtype_out"
            _agree(name, [*args, dtype], constant=fixed, outs=(dtype or torch.float32,))
    for bad in (torch.tensor([rows]), torch.tensor([-1]), torch.tensor([0.0])):
        _agree(f"quantized_decomposed::{op}.out", [weight, scales, zp, lo, hi, bad])
    if groups == 0:  # 3 groups do not divide the dim
        _agree(f"quantized_decomposed::{op}.out", [weight, torch.ones(rows, 3), zp, lo, hi, ids])


def _edge_rows() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = [
        torch.zeros(3, 5),
        torch.full((3, 5), 2.5),
        -torch.rand(3, 5, generator=g),
        torch.tensor([[3e38, -3e38, 1.0]]),
        torch.tensor([[-torch.inf, 1.0]]),
        torch.tensor([[1e-30, -1e-30, 0.0]]),  # a scale under the floor, the range stretched
        torch.tensor([[1e-40, 2e-45, 0.0]]),  # subnormal values
        torch.randn(80, 6, generator=g),  # more rows than the interpreter takes one by one
    ]
    rows += [torch.randn(8, 5, generator=g) * 10.0**e for e in range(-40, 1, 4)]
    return rows


@pytest.mark.parametrize("x", _edge_rows(), ids=lambda x: f"{tuple(x.shape)}")
def test_choose_qparams(x: torch.Tensor) -> None:
    # (a NaN or +inf in the input has no defined zero point, in ExecuTorch either)
    name, pair = "quantized_decomposed::choose_qparams.Tensor_out", (torch.float64, torch.int64)
    _agree(name, [x, -128, 127, 1e-5, torch.int8], outs=pair)
    _agree(name, [x, 0, 255, 1e-5, torch.uint8], outs=pair)
    per_token = "quantized_decomposed::choose_qparams_per_token_asymmetric.out"
    _agree(per_token, [x, torch.int8], outs=pair)


def test_choose_qparams_refuses_what_the_interpreter_refuses() -> None:
    name, pair = "quantized_decomposed::choose_qparams.Tensor_out", (torch.float64, torch.int64)
    _agree(name, [torch.ones(3), 5, 5, 1e-5, torch.int8], outs=pair)
    _agree(name, [torch.ones(3).double(), -128, 127, 1e-5, torch.int8], outs=pair)
    _agree(name, [torch.ones(0), -128, 127, 1e-5, torch.int8], outs=pair)
    per_token = "quantized_decomposed::choose_qparams_per_token_asymmetric.out"
    _agree(per_token, [torch.ones(3, 0), torch.int8], outs=pair)
    _agree(per_token, [torch.ones(0, 4), torch.int8], outs=pair)  # no rows: empty results


# ---- traced for real: a symbolic start position ---------------------------------------------


class _Traced(torch.nn.Module):
    """One instruction's functional form in a module, ``start_pos`` a traced input."""

    def __init__(self, name: str, args: list[Any], start: int) -> None:
        super().__init__()
        self.name = name
        self.values, self.table, self.call_args, self.slots = _instruction(
            name, args, frozenset(), (torch.float32,)
        )
        self.start = start
        self.forms = one_kernel_forms(self.values, self.call_args, name)

    def forward(self, pos: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env = Env(lambda j: self.table[j])
        k = 0
        for j, x in enumerate(self.table):
            if isinstance(x, torch.Tensor) and j not in self.slots:
                env[j] = tensors[k]
                k += 1
        env[self.start] = pos.item()
        self.forms.step(env, 0, 0)
        sig = SIGNATURES[self.name]
        outs = [env[s] for s in self.slots] if sig.outs else []
        return (*outs, *(env[j].clone() for j in sig.mutated_positions))


@pytest.mark.parametrize(
    "name", ["llama::sdpa_with_kv_cache.out", "llama::custom_sdpa.out", "llama::update_cache.out"]
)
def test_exported_with_a_symbolic_start_position(name: str) -> None:
    """Exported once, the form runs at every start position as the interpreter does."""
    q, k, v = _rand(1, 2, 4, 8, seed=1), _rand(1, 2, 2, 8, seed=2), _rand(1, 2, 2, 8, seed=3)
    kc, vc = _rand(1, KV, 2, 8, seed=4), _rand(1, KV, 2, 8, seed=5)
    if name == "llama::sdpa_with_kv_cache.out":
        args: list[Any] = [q, k, v, kc, vc, 0, 2, None, 0.0, True, None]
        start = 5
    elif name == "llama::custom_sdpa.out":
        args, start = [q, kc, vc, 0, None, 0.0, True, None], 3
    else:
        args, start = [k, kc, 0], 2
    module = _Traced(name, args, start)
    tensors = [x for x in args if isinstance(x, torch.Tensor)]
    ep = torch.export.export(module, (torch.tensor(0), *tensors), strict=False)
    for pos in (0, 1, KV - 3, KV - 2):
        given = list(args)
        given[start] = pos
        want = _interpreted(name, given)
        got = ep.module()(torch.tensor(pos), *(t.clone() for t in tensors))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    with pytest.raises(RuntimeError):  # past the cache: the traced program's own assert
        ep.module()(torch.tensor(KV - 1), *(t.clone() for t in tensors))
