"""``quantized_decomposed::`` kernels: fixtures against eager PyTorch and ExecuTorch's runtime,
and each kernel against an independent scalar reference (float32 arithmetic emulated in
Python), PyTorch's own quantizer, and ExecuTorch's ahead-of-time kernels when installed."""

from __future__ import annotations

import importlib
import math
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from compile_util import one_kernel_forms
from fixture_data import compare_outputs, fixture_calls, fixture_paths, load_manifest, tolerance
from ptexec.format import program as p
from ptexec.kernels import quantized as Q
from ptexec.kernels.fixed_args import Param, fixed_kernel
from ptexec.kernels.registry import KernelContext, UnsupportedKernel

MANIFEST = load_manifest()
FIXTURES = sorted(
    n for n, e in MANIFEST.items() if "quantized" in e["tags"] and "llm" not in e["tags"]
)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# --------------------------------------------------------------------------------------
# scalar references (Python floats are doubles; float32 steps are rounded explicitly)


def f32(x: float) -> float:
    """``x`` rounded to float32 (overflow gives an infinity, as a C cast does)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def ref_quantize(x: float, scale: float, zp: int, qmin: int, qmax: int) -> int:
    inv = f32(1.0 / f32(scale))
    prod = f32(inv * x)  # exact in double, then rounded once to float32
    return min(max(round(prod) + zp, qmin), qmax)  # round(): half to even


def ref_dequantize(q: int, scale: float, zp: int) -> float:
    return f32((q - zp) * f32(scale))


def ref_qparams(lo: float, hi: float, qmin: int, qmax: int) -> tuple[float, int]:
    """ExecuTorch's choose_qparams rule, written out with scalars."""
    small = f32(6.1e-5)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / (qmax - qmin)
    if f32(scale) == 0.0 or math.isinf(f32(1.0 / f32(scale))):
        scale = 0.1
    if scale < small:
        org = f32(scale)
        scale = small
        if lo == 0.0:
            hi = f32(small * (qmax - qmin))
        elif hi == 0.0:
            lo = f32(-small * (qmax - qmin))
        else:
            amp = f32(small / org)
            lo, hi = f32(lo * amp), f32(hi * amp)
    from_min, from_max = qmin - lo / scale, qmax - hi / scale
    err_min, err_max = abs(qmin) - abs(lo / scale), abs(qmax) - abs(hi / scale)
    initial = from_min if err_min < err_max else from_max
    if initial < qmin:
        zp = qmin
    elif initial > qmax:
        zp = qmax
    else:
        zp = round(f32(initial))
    return scale, zp


def quantize_list(x: torch.Tensor, scale: float, zp: int, qmin: int, qmax: int) -> list[int]:
    return [ref_quantize(v, scale, zp, qmin, qmax) for v in x.double().flatten().tolist()]


# --------------------------------------------------------------------------------------
# fixtures


def _replay(name: str, **options: Any) -> list[list[Any]]:
    pte, ptd = fixture_paths(name)
    method = ptexec.load(pte, data_path=ptd).load_method("forward", **options)
    return [method.execute(call["inputs"]) for call in fixture_calls(name)]


def test_fixtures_present() -> None:
    assert {"quant_static", "quant_dynamic", "quant_per_token", "quant_embedding"} <= set(FIXTURES)


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_eager(name: str) -> None:
    for i, (got, call) in enumerate(zip(_replay(name), fixture_calls(name), strict=True)):
        problem = compare_outputs(got, call["outputs"], *tolerance(name))
        assert problem is None, f"{name} call {i}: {problem}"


def executorch_runtime_for(name: str) -> Any:
    """ExecuTorch's runtime with the kernel libraries the fixture needs (or skip)."""
    runtime = pytest.importorskip("executorch.runtime").Runtime.get()
    for module in MANIFEST[name].get("executorch_imports", []):
        importlib.import_module(module)
    return runtime


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_executorch_runtime(name: str) -> None:
    runtime = executorch_runtime_for(name)
    pte, _ = fixture_paths(name)
    et_method = runtime.load_program(pte).load_method("forward")
    for i, (got, call) in enumerate(zip(_replay(name), fixture_calls(name), strict=True)):
        expected = list(et_method.execute(call["inputs"]))
        problem = compare_outputs(got, expected, *tolerance(name))
        assert problem is None, f"{name} call {i} vs ExecuTorch: {problem}"


@pytest.mark.parametrize("name", ["quant_embedding", "quant_mixed"])
def test_fixture_exact_parts(name: str) -> None:
    """Outputs made only by the kernels (no float op between) match eager exactly."""
    for got, call in zip(_replay(name), fixture_calls(name), strict=True):
        if name == "quant_mixed":
            got, want = got[2:], call["outputs"][2:]  # the uint8 add
        else:
            want = call["outputs"]
        assert compare_outputs(got, want, 0.0, 0.0) is None


def test_ptexec_does_not_import_executorch() -> None:
    pte, _ = fixture_paths("quant_dynamic")
    inputs = fixture_calls("quant_dynamic")[0]["inputs"]
    code = (
        "import sys, torch, ptexec\n"
        f"m = ptexec.load({str(pte)!r}).load_method('forward')\n"
        f"m.execute([torch.randn({list(inputs[0].shape)})])\n"
        "assert not [k for k in sys.modules if k.startswith('executorch')], 'executorch imported'\n"
    )
    src = str(Path(ptexec.__file__).resolve().parent.parent)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": src, "PATH": ""},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]


# --------------------------------------------------------------------------------------
# quantize / dequantize per tensor


@pytest.mark.parametrize(
    ("dtype", "qmin", "qmax"),
    [
        (torch.int8, -128, 127),
        (torch.int8, -127, 127),
        (torch.uint8, 0, 255),
        (torch.uint8, 10, 100),
        (torch.int16, -32768, 32767),
        (torch.int32, -(2**31), 2**31 - 1),
    ],
)
@pytest.mark.parametrize("scale", [0.02, 0.0123456789, 1 / 3, 0.1, 7.5])
def test_quantize_per_tensor_reference(
    dtype: torch.dtype, qmin: int, qmax: int, scale: float
) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, generator=g) * 3 * scale * 100
    zp = 3 if qmin < 0 else 100
    got = Q.quantize_per_tensor(x, scale, zp, qmin, qmax, dtype)
    assert got.dtype == dtype
    assert got.tolist() == quantize_list(x, scale, zp, qmin, qmax)


def test_quantize_rounds_ties_to_even() -> None:
    scale = 0.25  # a power of two: (k + 0.5) * scale is exact, so every value is a tie
    k = torch.arange(-20, 20, dtype=torch.float32)
    x = (k + 0.5) * scale
    got = Q.quantize_per_tensor(x, scale, 0, -128, 127, torch.int8)
    assert got.tolist() == [round(v + 0.5) for v in k.tolist()]
    assert got[k.tolist().index(0.0)].item() == 0  # 0.5 -> 0
    assert got[k.tolist().index(1.0)].item() == 2  # 1.5 -> 2
    assert got[k.tolist().index(-1.0)].item() == 0  # -0.5 -> 0
    assert got[k.tolist().index(-2.0)].item() == -2  # -1.5 -> -2


def test_quantize_clamps_to_quant_range() -> None:
    x = torch.tensor([-1e9, -12.8, -12.7, -0.05, 0.0, 0.05, 12.7, 12.8, 1e9, math.inf, -math.inf])
    got = Q.quantize_per_tensor(x, 0.1, 0, -127, 127, torch.int8)
    assert got.tolist() == [-127, -127, -127, 0, 0, 0, 127, 127, 127, 127, -127]
    u = Q.quantize_per_tensor(x, 0.1, 5, 0, 100, torch.uint8)
    assert u.tolist() == [0, 0, 0, 5, 5, 5, 100, 100, 100, 100, 0]  # -0.5, 0.5: to even


def test_quantize_inv_scale_is_float32() -> None:
    """x * (1.0f / (float)scale) in float32, not x / scale: a value where they differ."""
    scale, x = 0.16418302059173584, 15.67947769165039  # x / scale = 95.49999528...
    assert round(x / scale) == 95
    inv32 = f32(1.0 / f32(scale))
    assert round(f32(inv32 * x)) == 96
    got = Q.quantize_per_tensor(torch.tensor([x]), scale, 0, -128, 127, torch.int8)
    assert got.item() == 96


@pytest.mark.parametrize("in_dtype", [torch.float16, torch.float64, torch.bfloat16])
def test_quantize_other_float_inputs(in_dtype: torch.dtype) -> None:
    x = (torch.randn(300, generator=torch.Generator().manual_seed(1)) * 2).to(in_dtype)
    got = Q.quantize_per_tensor(x, 0.03, -4, -128, 127, torch.int8)
    if in_dtype == torch.float64:
        want = [min(max(round(f32(f32(1 / f32(0.03)) * v)) - 4, -128), 127) for v in x.tolist()]
    else:
        want = quantize_list(x.float(), 0.03, -4, -128, 127)
    assert got.tolist() == want


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation:UserWarning")
def test_quantize_matches_torch_quantizer() -> None:
    x = torch.randn(10000, generator=torch.Generator().manual_seed(2)) * 4
    for scale, zp, dtype, qdtype in [
        (0.05, 0, torch.int8, torch.qint8),
        (0.0317, -7, torch.int8, torch.qint8),
        (0.041, 128, torch.uint8, torch.quint8),
    ]:
        lo, hi = (-128, 127) if dtype == torch.int8 else (0, 255)
        want = torch.quantize_per_tensor(x, scale, zp, qdtype).int_repr()
        assert torch.equal(Q.quantize_per_tensor(x, scale, zp, lo, hi, dtype), want)
        back = torch.quantize_per_tensor(x, scale, zp, qdtype).dequantize()
        assert torch.equal(Q.dequantize_per_tensor(want, scale, zp, lo, hi, dtype), back)


def test_quantize_tensor_args_match_scalars() -> None:
    x = torch.randn(64, generator=torch.Generator().manual_seed(3))
    a = Q.quantize_per_tensor(x, 0.02, 3, -128, 127, torch.int8)
    b = Q.quantize_per_tensor(
        x, torch.tensor([0.02], dtype=torch.float64), torch.tensor([3]), -128, 127, torch.int8
    )
    assert torch.equal(a, b)
    d1 = Q.dequantize_per_tensor(a, 0.02, 3, -128, 127, torch.int8)
    d2 = Q.dequantize_per_tensor(
        a, torch.tensor([0.02], dtype=torch.float64), torch.tensor([3]), -128, 127, torch.int8
    )
    assert torch.equal(d1, d2)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32])
def test_dequantize_per_tensor_reference(dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    q = torch.randint(
        max(info.min, -(2**20)),
        min(info.max, 2**20),
        (400,),
        generator=torch.Generator().manual_seed(4),
    ).to(dtype)
    got = Q.dequantize_per_tensor(q, 0.0123456789, 7, info.min, info.max, dtype)
    assert got.dtype == torch.float32
    assert got.tolist() == [ref_dequantize(v, 0.0123456789, 7) for v in q.tolist()]
    half = Q.dequantize_per_tensor(q, 0.0123456789, 7, info.min, info.max, dtype, torch.float16)
    assert half.dtype == torch.float16
    assert torch.equal(half, got.to(torch.float16))  # one rounding, from the float32 value


def test_quantize_errors() -> None:
    with pytest.raises(ValueError, match="floating"):
        Q.quantize_per_tensor(torch.zeros(2, dtype=torch.int32), 0.1, 0, -128, 127, torch.int8)
    with pytest.raises(ValueError, match="outside"):
        Q.quantize_per_tensor(torch.zeros(2), 0.1, 0, -129, 127, torch.int8)
    with pytest.raises(ValueError, match="dtype argument"):
        Q.dequantize_per_tensor(torch.zeros(2, dtype=torch.uint8), 0.1, 0, 0, 255, torch.int8)


# --------------------------------------------------------------------------------------
# per channel / per token


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_per_channel_reference(axis: int) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 5, generator=g) * 2
    channels = x.shape[axis]
    scales = torch.rand(channels, generator=g, dtype=torch.float64) * 0.05 + 0.01
    zps = torch.randint(-10, 10, (channels,), generator=g)
    q = Q.quantize_per_channel(x, scales, zps, axis, -128, 127, torch.int8)
    moved = x.movedim(axis, 0)
    qm = q.movedim(axis, 0)
    for c in range(channels):
        s, z = scales[c].item(), int(zps[c])
        assert qm[c].flatten().tolist() == quantize_list(moved[c], s, z, -128, 127)
    d = Q.dequantize_per_channel(q, scales, zps, axis, -128, 127, torch.int8)
    dm = d.movedim(axis, 0)
    for c in range(channels):
        s, z = scales[c].item(), int(zps[c])
        assert dm[c].flatten().tolist() == [
            ref_dequantize(v, s, z) for v in qm[c].flatten().tolist()
        ]
    no_zp = Q.dequantize_per_channel(q, scales, None, axis, -128, 127, torch.int8)
    assert torch.equal(
        no_zp, Q.dequantize_per_channel(q, scales, zps * 0, axis, -128, 127, torch.int8)
    )


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation:UserWarning")
def test_per_channel_matches_torch_quantizer() -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(6, 50, generator=g) * 3
    scales = torch.rand(6, generator=g, dtype=torch.float64) * 0.05 + 0.01
    zps = torch.randint(-5, 5, (6,), generator=g)
    want = torch.quantize_per_channel(x, scales, zps, 0, torch.qint8)
    got = Q.quantize_per_channel(x, scales, zps, 0, -128, 127, torch.int8)
    assert torch.equal(got, want.int_repr())


def test_per_token_is_per_row() -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 16, generator=g)
    scales, zps = Q.choose_qparams_per_token_asymmetric(x, torch.int8)
    assert scales.shape == (2, 3, 1) and scales.dtype == torch.float64
    assert zps.shape == (2, 3, 1) and zps.dtype == torch.int64
    q = Q.quantize_per_token(x, scales, zps, -128, 127, torch.int8)
    d = Q.dequantize_per_token(q, scales, zps, -128, 127, torch.int8, torch.float32)
    rows = x.reshape(-1, 16)
    for r in range(rows.shape[0]):
        lo, hi = rows[r].min().item(), rows[r].max().item()
        s, z = ref_qparams(lo, hi, -128, 127)
        assert scales.reshape(-1)[r].item() == s and zps.reshape(-1)[r].item() == z
        qr = quantize_list(rows[r], s, z, -128, 127)
        assert q.reshape(-1, 16)[r].tolist() == qr
        assert d.reshape(-1, 16)[r].tolist() == [ref_dequantize(v, s, z) for v in qr]
    # the dequantized values are within half a step of the input
    assert ((d - x).abs() <= scales.float() / 2 + 1e-6).all()


# --------------------------------------------------------------------------------------
# choose_qparams


@pytest.mark.parametrize(
    "values",
    [
        [-1.0, 0.3, 2.5],
        [0.5, 1.0, 3.0],  # positive only: range widened to 0
        [-3.0, -0.25],  # negative only
        [0.0, 0.0],  # all zero: scale 0 -> 0.1
        [-1e-6, 2e-6],  # tiny range: scale floor 6.1e-5, range stretched
        [1e-7, 3e-7],  # tiny, positive only
        [-3e-7, 0.0],  # tiny, negative only
        [-1e30, 1e30],
        [-0.9999, 123.456],
    ],
)
@pytest.mark.parametrize(("qmin", "qmax"), [(-128, 127), (0, 255), (-127, 127)])
def test_choose_qparams_reference(values: list[float], qmin: int, qmax: int) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    scale, zp = Q.choose_qparams(x, qmin, qmax, 1e-5, torch.int8)
    assert scale.dtype == torch.float64 and zp.dtype == torch.int64
    lo, hi = x.min().item(), x.max().item()
    want_scale, want_zp = ref_qparams(lo, hi, qmin, qmax)
    assert scale.item() == want_scale
    assert zp.item() == want_zp


def test_choose_qparams_represents_zero_and_range() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(8)) * 5 + 1
    scale, zp = Q.choose_qparams(x, -128, 127, 1e-5, torch.int8)
    q = Q.quantize_per_tensor(x, scale.item(), zp.item(), -128, 127, torch.int8)
    zero = Q.quantize_per_tensor(torch.zeros(1), scale.item(), zp.item(), -128, 127, torch.int8)
    assert Q.dequantize_per_tensor(zero, scale.item(), zp.item(), -128, 127, torch.int8).item() == 0
    back = Q.dequantize_per_tensor(q, scale.item(), zp.item(), -128, 127, torch.int8)
    assert (back - x).abs().max().item() <= scale.item() * 0.5 + 1e-6


def test_choose_qparams_errors() -> None:
    with pytest.raises(ValueError, match="less than"):
        Q.choose_qparams(torch.ones(3), 5, 5, 1e-5, torch.int8)
    with pytest.raises(ValueError, match="float32"):
        Q.choose_qparams(torch.ones(3, dtype=torch.float64), -128, 127, 1e-5, torch.int8)
    with pytest.raises(ValueError, match="empty"):
        Q.choose_qparams(torch.ones(0), -128, 127, 1e-5, torch.int8)


# --------------------------------------------------------------------------------------
# embeddings


def _ref_rows(
    values: list[list[int]], scales: torch.Tensor, zps: torch.Tensor | None, ids: list[int]
) -> list[list[float]]:
    out = []
    groups = scales.shape[1] if scales.dim() == 2 else 1
    for i in ids:
        dim = len(values[i])
        gs = dim // groups
        row = []
        for j, w in enumerate(values[i]):
            s = scales[i].reshape(-1)[j // gs].float().item()
            z = zps[i].reshape(-1)[j // gs].float().item() if zps is not None else 0.0
            row.append(f32(f32(w - z) * s))
        out.append(row)
    return out


def _pack_bits(values: list[list[int]], nbit: int) -> torch.Tensor:
    rows = []
    for row in values:
        packed = []
        if nbit == 4:
            for a, b in zip(row[0::2], row[1::2], strict=True):
                packed.append(((a + 8) << 4) | (b + 8))
        else:
            for k in range(0, len(row), 4):
                byte = 0
                for i, v in enumerate(row[k : k + 4]):
                    byte |= (v + 2) << (2 * i)
                packed.append(byte)
        rows.append(packed)
    return torch.tensor(rows, dtype=torch.uint8)


@pytest.mark.parametrize("nbit", [8, 4, 2])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("with_zp", [False, True])
def test_embedding_reference(nbit: int, groups: int, with_zp: bool) -> None:
    g = torch.Generator().manual_seed(9)
    lo, hi = -(1 << (nbit - 1)), (1 << (nbit - 1))
    values = torch.randint(lo, hi, (6, 8), generator=g).tolist()
    weight = torch.tensor(values, dtype=torch.int8) if nbit == 8 else _pack_bits(values, nbit)
    scales = torch.rand(6, groups, generator=g) * 0.1 + 0.01
    if groups == 1:
        scales = scales[:, 0]
    zps = torch.randint(-3, 3, scales.shape, generator=g).float() if with_zp else None
    ids = torch.tensor([[5, 0, 3], [3, 3, 1]])
    got = Q.embedding_xbit(weight, scales, zps, lo, hi - 1, ids, nbit)
    assert got.shape == (2, 3, 8)
    want = _ref_rows(values, scales, zps, ids.flatten().tolist())
    assert got.reshape(-1, 8).tolist() == want
    ids32 = Q.embedding_xbit(weight, scales, zps, lo, hi - 1, ids.to(torch.int32), nbit)
    assert torch.equal(ids32, got)


def test_embedding_4bit_nibble_order() -> None:
    weight = torch.tensor([[0x9F, 0x08]], dtype=torch.uint8)  # values 1, 7, -8, 0
    got = Q.embedding_xbit(weight, torch.ones(1), None, -8, 7, torch.tensor([0]), 4)
    assert got.tolist() == [[1.0, 7.0, -8.0, 0.0]]
    two = torch.tensor([[0b11100100]], dtype=torch.uint8)  # lowest bits first: 0,1,2,3 -> -2..1
    got2 = Q.embedding_xbit(two, torch.ones(1), None, -2, 1, torch.tensor([0]), 2)
    assert got2.tolist() == [[-2.0, -1.0, 0.0, 1.0]]


def test_embedding_half_params_and_output() -> None:
    g = torch.Generator().manual_seed(10)
    weight = torch.randint(-128, 128, (4, 6), generator=g, dtype=torch.int8)
    scales = (torch.rand(4, generator=g) * 0.5).to(torch.float16)
    ids = torch.tensor([2, 0])
    f = Q.embedding_xbit(weight, scales, None, -128, 127, ids, 8)
    assert f.dtype == torch.float32
    assert f.tolist() == [
        [f32(w * scales[i].float().item()) for w in weight[i].tolist()] for i in (2, 0)
    ]
    h = Q.embedding_xbit(weight, scales, None, -128, 127, ids, 8, torch.float16)
    assert h.dtype == torch.float16 and torch.equal(h, f.half())


def test_embedding_errors() -> None:
    w = torch.zeros(4, 8, dtype=torch.int8)
    with pytest.raises(IndexError, match="out of range"):
        Q.embedding_xbit(w, torch.ones(4), None, -128, 127, torch.tensor([4]), 8)
    with pytest.raises(IndexError, match="out of range"):
        Q.embedding_xbit(w, torch.ones(4), None, -128, 127, torch.tensor([-1]), 8)
    with pytest.raises(ValueError, match="groups"):
        Q.embedding_xbit(w, torch.ones(4, 3), None, -128, 127, torch.tensor([0]), 8)
    with pytest.raises(ValueError, match="indices"):
        Q.embedding_xbit(w, torch.ones(4), None, -128, 127, torch.tensor([0.0]), 8)


def _compiled_embedding(weight: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor) -> Any:
    """``embedding_byte.out`` on these tensors through the compiled tier's functional form."""
    from ptexec.compile.functional import Env

    def desc(t: torch.Tensor) -> p.Tensor:
        code = {torch.int8: 1, torch.int64: 4, torch.float32: 6}[t.dtype]
        dims = tuple(range(t.dim()))
        return p.Tensor(code, 0, tuple(t.shape), dims, False, 0, None, 0, p.STATIC, None)

    out = torch.empty(0)
    given = [weight, scales, None, -128, 127, ids, out]
    values = (desc(weight), desc(scales), p.Null(), p.Int(-128), p.Int(127), desc(ids), desc(out))
    name = "quantized_decomposed::embedding_byte.out"
    rebuild = one_kernel_forms(values, range(7), name)
    assert rebuild.reason(0, 0) is None
    env = Env(lambda j: given[j])
    rebuild.step(env, 0, 0)
    return env[6]


def test_compiled_embedding_checks_what_the_kernel_checks() -> None:
    w = torch.arange(-12, 12, dtype=torch.int8).reshape(4, 6)
    ids = torch.tensor([[3, 0], [1, 1]])
    for scales in (torch.ones(4, 4), torch.ones(4, 0)):  # 4 groups (or none) in 6 columns
        with pytest.raises(ValueError, match="scale groups do not divide the embedding dim 6"):
            Q.embedding_xbit(w, scales, None, -128, 127, ids, 8)
        with pytest.raises(ValueError, match="scale groups do not divide the embedding dim 6"):
            _compiled_embedding(w, scales, ids)
    with pytest.raises(ValueError, match="scales must be"):
        _compiled_embedding(w, torch.ones(3), ids)
    scales = torch.tensor([[0.5, 2.0], [1.0, 1.0], [0.25, 4.0], [3.0, 0.125]])
    want = Q.embedding_xbit(w, scales, None, -128, 127, ids, 8)
    assert torch.equal(_compiled_embedding(w, scales, ids), want)


# --------------------------------------------------------------------------------------
# mixed_mm / mixed_linear / add


def test_mixed_mm_reference() -> None:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 6, generator=g)
    w = torch.randint(-128, 128, (6, 4), generator=g, dtype=torch.int8)
    s = torch.rand(6, generator=g)
    want = x.double() @ (w.double() * s.double()[:, None])
    got = Q.mixed_mm(x, w, s, None)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="zero points"):
        Q.mixed_mm(x, w, s, torch.zeros(6))


@pytest.mark.parametrize(("n", "groups"), [(6, 1), (6, 2), (7, 2), (8, 4)])
def test_mixed_linear_reference(n: int, groups: int) -> None:
    g = torch.Generator().manual_seed(12)
    x = torch.randn(3, n, generator=g)
    w = torch.randint(-128, 128, (5, n), generator=g, dtype=torch.int8)
    s = torch.rand(5, groups, generator=g) + 0.1
    size = math.ceil(n / groups)  # the last group may be shorter
    dq = torch.tensor(
        [[w[j, k].item() * s[j, k // size].item() for k in range(n)] for j in range(5)],
        dtype=torch.float64,
    )
    got = Q.mixed_linear(x, w, s if groups > 1 else s[:, 0], None, None)
    torch.testing.assert_close(got.double(), x.double() @ dq.T, rtol=1e-5, atol=1e-5)
    half = Q.mixed_linear(x, w, s, None, torch.float16)
    assert half.dtype == torch.float16


def test_quantized_add_reference() -> None:
    g = torch.Generator().manual_seed(13)
    a = torch.randint(0, 256, (50,), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 256, (50,), generator=g, dtype=torch.uint8)
    got = Q.quantized_add(a, 0.05, 128, 0, 255, b, 0.03, 120, 0, 255, 0.07, 125, 10, 240)
    want = []
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        total = f32(f32((x - 128) * f32(0.05)) + f32((y - 120) * f32(0.03)))
        want.append(ref_quantize(total, 0.07, 125, 10, 240))
    assert got.tolist() == want
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        Q.quantized_add(a, 0.05, 0, -1, 255, b, 0.03, 0, 0, 255, 0.07, 0, 0, 255)


# --------------------------------------------------------------------------------------
# the factories: argument layout, output storage


def _ctx(values: list[p.EValue], args: list[int], initial: list[Any]) -> KernelContext:
    return KernelContext("test::op.out", 0, tuple(args), tuple(values), frozenset(), initial)


def _tensor(sizes: tuple[int, ...], code: int = 6, dynamism: int = p.STATIC) -> p.Tensor:
    return p.Tensor(code, 0, sizes, tuple(range(len(sizes))), False, 0, None, 0, dynamism, None)


def _run(emission: Any, v: list[Any]) -> None:
    exec(emission.code, dict(emission.env), {"v": v})


def test_factory_runs_and_resizes() -> None:
    factory = fixed_kernel(
        Q.quantize_per_tensor,
        [
            Param("input", "T"),
            Param("scale", "float"),
            Param("zero_point", "int"),
            Param("quant_min", "int"),
            Param("quant_max", "int"),
            Param("dtype", "dtype"),
        ],
    )
    values = [
        _tensor((4,)),
        p.Double(0.5),
        p.Int(1),
        p.Int(-128),
        p.Int(127),
        p.Int(1),
        _tensor((4,), 1, p.DYNAMIC_BOUND),
    ]
    initial = [None, 0.5, 1, -128, 127, 1, None]
    emission = factory(_ctx(values, [0, 1, 2, 3, 4, 5, 6, 6], initial))
    storage = torch.zeros(4, dtype=torch.int8)
    out = storage[:4]
    v = [torch.tensor([0.2, 0.75, -1.0]), None, None, None, None, None, out]
    _run(emission, v)
    assert out.tolist() == [1, 3, -1]  # resized to 3 within its planned storage
    v[0] = torch.arange(5.0)
    with pytest.raises(RuntimeError, match="cannot hold"):
        _run(emission, v)


def test_factory_two_outs() -> None:
    factory = fixed_kernel(
        Q.choose_qparams_per_token_asymmetric,
        [Param("input", "T"), Param("dtype", "dtype")],
        outs=2,
    )
    values = [
        _tensor((2, 3)),
        p.Int(1),
        _tensor((2, 1), 7),
        _tensor((2, 1), 4),
        p.TensorList((2, 3)),
    ]
    emission = factory(_ctx(values, [0, 1, 2, 3, 4], [None, 1, None, None, None]))
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, 1.0]])
    v = [
        x,
        None,
        torch.empty(2, 1, dtype=torch.float64),
        torch.empty(2, 1, dtype=torch.int64),
        None,
    ]
    _run(emission, v)
    scale, zp = Q.choose_qparams_per_token_asymmetric(x, torch.int8)
    assert torch.equal(v[2], scale) and torch.equal(v[3], zp)


def test_factory_rejects_bad_layouts() -> None:
    factory = fixed_kernel(
        Q.mixed_mm, [Param("input", "T"), Param("w", "T"), Param("s", "T"), Param("z", "T?")]
    )
    values = [_tensor((2, 2)), _tensor((2, 2), 1), _tensor((2,)), p.Null(), _tensor((2, 2))]
    with pytest.raises(UnsupportedKernel, match="expected 6 values"):
        factory(_ctx(values, [0, 1, 2, 3, 4], [None] * 5))
    values[1] = p.Int(3)
    with pytest.raises(UnsupportedKernel, match="should be a tensor"):
        factory(_ctx(values, [0, 1, 2, 3, 4, 4], [None, 3, None, None, None]))
    dtype_factory = fixed_kernel(lambda d: torch.zeros(1, dtype=d), [Param("dtype", "dtype")])
    with pytest.raises(UnsupportedKernel, match="no torch dtype"):
        dtype_factory(_ctx([p.Int(99), _tensor((1,))], [0, 1, 1], [99, None]))


def test_unknown_quantized_op_is_reported_missing() -> None:
    from ptexec.kernels.registry import find_kernel

    assert find_kernel("quantized_decomposed::quantize_per_tensor.out") is not None
    assert find_kernel("quantized_decomposed::no_such_op.out") is None


# --------------------------------------------------------------------------------------
# ExecuTorch's own kernels (its ahead-of-time library), bit for bit


@pytest.fixture(scope="module")
def et_ops() -> Any:
    pytest.importorskip("executorch.kernels.quantized")
    import executorch.exir.passes._quant_patterns_and_replacements
    import executorch.kernels.quantized  # noqa: F401

    return torch.ops.quantized_decomposed


def test_matches_executorch_quantize_dequantize(et_ops: Any) -> None:
    g = torch.Generator().manual_seed(14)
    x = torch.randn(4000, generator=g) * 3
    ties = ((torch.arange(-200, 200) + 0.5) * 0.0123456789).float()
    for data in (x, ties):
        for scale, zp, dtype, lo, hi in [
            (0.0123456789, 0, torch.int8, -128, 127),
            (1 / 3, -3, torch.int8, -127, 127),
            (0.02, 128, torch.uint8, 0, 255),
            (0.001, 0, torch.int16, -32768, 32767),
        ]:
            out = torch.empty(data.shape, dtype=dtype)
            et_ops.quantize_per_tensor.out(data, scale, zp, lo, hi, dtype, out=out)
            mine = Q.quantize_per_tensor(data, scale, zp, lo, hi, dtype)
            assert torch.equal(out, mine)
            back = torch.empty(data.shape)
            et_ops.dequantize_per_tensor.out(mine, scale, zp, lo, hi, dtype, out=back)
            assert torch.equal(back, Q.dequantize_per_tensor(mine, scale, zp, lo, hi, dtype))


def test_matches_executorch_qparams(et_ops: Any) -> None:
    g = torch.Generator().manual_seed(15)
    for data in (
        torch.randn(64, generator=g),
        torch.randn(64, generator=g) * 1e-6,
        torch.zeros(8),
        torch.rand(10, generator=g) + 1,
        -torch.rand(10, generator=g) - 1,
        torch.tensor([1e-5, 3e-5]),
    ):
        for lo, hi, dtype in [(-128, 127, torch.int8), (0, 255, torch.uint8)]:
            s = torch.empty(1, dtype=torch.float64)
            z = torch.empty(1, dtype=torch.int64)
            et_ops.choose_qparams.Tensor_out(
                data, lo, hi, 1e-5, dtype, scale_out=s, zero_point_out=z
            )
            ms, mz = Q.choose_qparams(data, lo, hi, 1e-5, dtype)
            assert torch.equal(s, ms) and torch.equal(z, mz)
    x = torch.randn(5, 7, 16, generator=g) * torch.logspace(-8, 2, 7)[None, :, None]
    s = torch.empty(5, 7, 1, dtype=torch.float64)
    z = torch.empty(5, 7, 1, dtype=torch.int64)
    et_ops.choose_qparams_per_token_asymmetric.out(x, torch.int8, scale_out=s, zero_point_out=z)
    ms, mz = Q.choose_qparams_per_token_asymmetric(x, torch.int8)
    assert torch.equal(s, ms) and torch.equal(z, mz)
    q = torch.empty(x.shape, dtype=torch.int8)
    et_ops.quantize_per_token.out(x, s, z, -128, 127, torch.int8, out=q)
    assert torch.equal(q, Q.quantize_per_token(x, s, z, -128, 127, torch.int8))
    d = torch.empty(x.shape)
    et_ops.dequantize_per_token.out(q, s, z, -128, 127, torch.int8, torch.float32, out=d)
    assert torch.equal(d, Q.dequantize_per_token(q, s, z, -128, 127, torch.int8, torch.float32))


def test_matches_executorch_per_channel(et_ops: Any) -> None:
    g = torch.Generator().manual_seed(16)
    x = torch.randn(4, 6, 5, generator=g)
    scales = torch.rand(6, generator=g, dtype=torch.float64) * 0.05 + 0.01
    zps = torch.randint(-10, 10, (6,), generator=g)
    q = torch.empty(x.shape, dtype=torch.int8)
    et_ops.quantize_per_channel.out(x, scales, zps, 1, -128, 127, torch.int8, out=q)
    assert torch.equal(q, Q.quantize_per_channel(x, scales, zps, 1, -128, 127, torch.int8))
    d = torch.empty(x.shape)
    et_ops.dequantize_per_channel.out(q, scales, zps, 1, -128, 127, torch.int8, out=d)
    assert torch.equal(d, Q.dequantize_per_channel(q, scales, zps, 1, -128, 127, torch.int8))


def test_matches_executorch_mixed(et_ops: Any) -> None:
    g = torch.Generator().manual_seed(17)
    x = torch.randn(3, 7, generator=g)
    w = torch.randint(-128, 128, (5, 7), generator=g, dtype=torch.int8)
    for scales in (torch.rand(5, generator=g), torch.rand(5, 2, generator=g)):
        out = torch.empty(3, 5)
        et_ops.mixed_linear.out(x, w, scales, None, None, out=out)
        # a 7-term float32 dot product of values up to ~500 in magnitude: summed in another
        # order (ExecuTorch's loop, torch's matmul) the results differ by a few ulp
        torch.testing.assert_close(
            Q.mixed_linear(x, w, scales, None, None), out, rtol=1e-5, atol=1e-5
        )
    w2 = torch.randint(-128, 128, (7, 4), generator=g, dtype=torch.int8)
    s2 = torch.rand(7, generator=g)
    out = torch.empty(3, 4)
    et_ops.mixed_mm.out(x, w2, s2, None, out=out)
    torch.testing.assert_close(Q.mixed_mm(x, w2, s2, None), out, rtol=1e-6, atol=1e-6)


def test_matches_executorch_add(et_ops: Any) -> None:
    g = torch.Generator().manual_seed(18)
    a = torch.randint(0, 256, (64,), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 256, (64,), generator=g, dtype=torch.uint8)
    args = (0.05, 128, 0, 255, b, 0.03, 120, 0, 255, 0.07, 125, 0, 255)
    out = torch.empty(64, dtype=torch.uint8)
    et_ops.add.out(a, *args, out=out)
    assert torch.equal(out, Q.quantized_add(a, *args))


# --------------------------------------------------------------------------------------
# CUDA: the same numbers on the device


@CUDA
def test_cuda_matches_cpu() -> None:
    g = torch.Generator().manual_seed(19)
    x = torch.randn(2, 5, 16, generator=g) * 3
    dev = torch.device("cuda")
    q = Q.quantize_per_tensor(x, 0.0123456789, 3, -128, 127, torch.int8)
    assert torch.equal(
        Q.quantize_per_tensor(x.to(dev), 0.0123456789, 3, -128, 127, torch.int8).cpu(), q
    )
    assert torch.equal(
        Q.dequantize_per_tensor(q.to(dev), 0.0123456789, 3, -128, 127, torch.int8).cpu(),
        Q.dequantize_per_tensor(q, 0.0123456789, 3, -128, 127, torch.int8),
    )
    s, z = Q.choose_qparams_per_token_asymmetric(x, torch.int8)
    sd, zd = Q.choose_qparams_per_token_asymmetric(x.to(dev), torch.int8)
    assert torch.equal(sd.cpu(), s) and torch.equal(zd.cpu(), z)
    qt = Q.quantize_per_token(x, s, z, -128, 127, torch.int8)
    assert torch.equal(Q.quantize_per_token(x.to(dev), sd, zd, -128, 127, torch.int8).cpu(), qt)
    w = torch.randint(-128, 128, (6, 8), generator=g, dtype=torch.int8)
    sc = torch.rand(6, 2, generator=g)
    ids = torch.tensor([[1, 5]])
    assert torch.equal(
        Q.embedding_xbit(w.to(dev), sc.to(dev), None, -128, 127, ids.to(dev), 8).cpu(),
        Q.embedding_xbit(w, sc, None, -128, 127, ids, 8),
    )


@CUDA
@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_on_cuda(name: str) -> None:
    results = _replay(name, device_map="cuda")
    for i, (got, call) in enumerate(zip(results, fixture_calls(name), strict=True)):
        got = [t.cpu() if isinstance(t, torch.Tensor) else t for t in got]
        problem = compare_outputs(got, call["outputs"], *tolerance(name))
        assert problem is None, f"{name} call {i} on CUDA: {problem}"


def test_a_nan_is_left_out_of_the_range_as_executorch_leaves_it(et_ops: Any) -> None:
    """ExecuTorch's choose_qparams kernels compare with NaN, which leaves it out of the
    range (when it is not a row's first value, the one its loops start from). ptexec's
    host path raised (``round(nan)``) and its vectorized and traced paths made NaN scales
    and zero points, so compiled code answered with NaNs where the interpreter raised."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(70, 16, generator=g) * 3  # more rows than the host path takes
    x[::7, 5] = float("nan")
    x[3, 1:] = float("nan")  # all NaN but the first
    s = torch.empty(70, 1, dtype=torch.float64)
    z = torch.empty(70, 1, dtype=torch.int64)
    et_ops.choose_qparams_per_token_asymmetric.out(x, torch.int8, scale_out=s, zero_point_out=z)
    for rows, traced in ((x, False), (x[:10], False), (x, True)):
        ms, mz = Q.choose_qparams_per_token_asymmetric(rows, torch.int8, traced=traced)
        n = rows.shape[0]
        assert torch.equal(ms, s[:n]) and torch.equal(mz, z[:n]), (n, traced)
    flat = x[6:8].reshape(-1)  # per tensor: a NaN inside (row 7)
    s1 = torch.empty(1, dtype=torch.float64)
    z1 = torch.empty(1, dtype=torch.int64)
    et_ops.choose_qparams.Tensor_out(flat, -128, 127, 1e-5, torch.int8, scale_out=s1,
                                     zero_point_out=z1)  # fmt: skip
    ms, mz = Q.choose_qparams(flat, -128, 127, 1e-5, torch.int8)
    assert torch.equal(ms, s1) and torch.equal(mz, z1)
