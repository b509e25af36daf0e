"""XNNPACK's static int8 arithmetic as ptexec reproduces it (delegates/xnnpack/quant.py).

Each helper is checked against a literal transcription of XNNPACK's scalar kernel in plain
Python integers and numpy float32 (one element at a time), on values chosen to sit on
rounding boundaries. Whole programs are checked against ExecuTorch's runtime by the
fixtures (tests/test_xnnpack.py), where real int8 networks match it exactly.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ptexec
from ptexec.delegates.xnnpack import quant as qa

f32 = np.float32
scales = st.floats(min_value=1e-3, max_value=0.5, allow_nan=False).map(lambda x: float(f32(x)))
zps = st.integers(min_value=-128, max_value=127)


def _lrintf(x: np.float32) -> int:
    return int(np.rint(x))


def _asr(x: int, shift: int) -> int:
    return x >> shift  # Python's >> on ints is the arithmetic (flooring) shift


def test_f32_rounds_to_nearest_even() -> None:
    for x in (0.1, 1 / 3, 1e-30, 3.4028235e38, -2.5e-8, 1 + 2**-24, 1 + 3 * 2**-24):
        assert qa.f32(x) == float(f32(x))
    assert qa.f32(1e39) == math.inf
    assert math.isnan(qa.f32(math.nan))


@settings(max_examples=200, deadline=None)
@given(value=st.floats(-10, 10, allow_nan=False), scale=scales, zp=zps)
def test_quantize_bound_is_xnn_qs8_quantize(value: float, scale: float, zp: int) -> None:
    # lrintf(fminf(fmaxf(val / scale + (float) zero_point, -128.0f), 127.0f))
    want = _lrintf(np.minimum(np.maximum(f32(f32(value) / f32(scale)) + f32(zp), f32(-128)), 127))
    assert qa.quantize_bound(value, scale, zp, -128, 127) == want
    assert qa.quantize_bound(math.inf, scale, zp, -128, 127) == 127
    assert qa.quantize_bound(-math.inf, scale, zp, -128, 127) == -128


def _add_literal(a: int, b: int, sa: float, za: int, sb: float, zb: int, so: float, zo: int,
                 sign_b: int) -> int:  # fmt: skip
    """xnn_init_qs8_add_minmax_scalar_params + xnn_qs8_vadd_minmax_ukernel__scalar_u1."""
    a_os = f32(f32(sa) / f32(so))
    b_os = f32(f32(f32(sb) * f32(sign_b)) / f32(so))
    top = max(abs(a_os), abs(b_os))
    exponent = int(np.frombuffer(f32(top).tobytes(), np.uint32)[0] >> 23) - 127
    shift = 20 - exponent
    am = _lrintf(f32(abs(a_os) * f32(2.0**shift)))
    bm = _lrintf(f32(abs(b_os) * f32(2.0**shift)))
    am, bm = (-am if a_os < 0 else am), (-bm if b_os < 0 else bm)
    bias = (1 << (shift - 1)) - am * za - bm * zb
    out = _asr(bias + a * am + b * bm, shift) + zo
    return min(max(out, -128), 127)


@settings(max_examples=300, deadline=None)
@given(
    sa=scales, za=zps, sb=scales, zb=zps, so=scales, zo=zps, sign=st.sampled_from([1, -1]),
    data=st.data(),
)  # fmt: skip
def test_add_is_xnnpack_fixed_point(
    sa: float, za: int, sb: float, zb: int, so: float, zo: int, sign: int, data: st.DataObject
) -> None:
    try:
        p = qa.add_params(sa, sb, so, sign)
    except ValueError:
        return  # ratios outside XNNPACK's range
    a = data.draw(st.lists(st.integers(-128, 127), min_size=8, max_size=8))
    b = data.draw(st.lists(st.integers(-128, 127), min_size=8, max_size=8))
    ta = torch.tensor(a, dtype=torch.float32) - za
    tb = torch.tensor(b, dtype=torch.float32) - zb
    got = qa.add(ta, tb, p.a_mult, p.b_mult, p.rounding, p.shift, -128 - zo, 127 - zo) + zo
    want = [_add_literal(x, y, sa, za, sb, zb, so, zo, sign) for x, y in zip(a, b, strict=True)]
    assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(sa=scales, za=zps, sb=scales, zb=zps, so=scales, zo=zps, data=st.data())
def test_mul_is_xnnpack_fp32_requantization(
    sa: float, za: int, sb: float, zb: int, so: float, zo: int, data: st.DataObject
) -> None:
    scale = f32(f32(f32(sa) * f32(sb)) / f32(so))
    if not 2**-16 <= scale < 256:
        return
    a = data.draw(st.lists(st.integers(-128, 127), min_size=8, max_size=8))
    b = data.draw(st.lists(st.integers(-128, 127), min_size=8, max_size=8))
    got = qa.mul(
        torch.tensor(a, dtype=torch.float32) - za,
        torch.tensor(b, dtype=torch.float32) - zb,
        qa.mul_scale(sa, sb, so), -128 - zo, 127 - zo,
    ) + zo  # fmt: skip
    want = []
    for x, y in zip(a, b, strict=True):
        acc = f32((x - za) * (y - zb)) * scale
        want.append(min(max(_lrintf(f32(acc)) + zo, -128), 127))
    assert got.tolist() == want


def test_requantize_rounds_half_to_even_and_clamps() -> None:
    acc = torch.tensor([5.0, 15.0, 25.0, -5.0, -15.0, 1e6, -1e6, 7.0])
    got = qa.requantize_(acc.clone(), 0.1, -100, 100)
    want = [min(max(_lrintf(f32(f32(a) * f32(0.1))), -100), 100) for a in acc.tolist()]
    assert got.tolist() == want
    # a float64 accumulator is converted to float32 first, as XNNPACK converts its int32
    big = torch.tensor([16777217.0, 16777219.0], dtype=torch.float64)
    assert qa.requantize_(big, 1.0, -(2**30), 2**30).tolist() == [16777216.0, 16777220.0]


@settings(max_examples=200, deadline=None)
@given(si=scales, zi=zps, so=scales, zo=zps, n=st.integers(1, 300), data=st.data())
def test_mean_is_xnnpack_reduce(
    si: float, zi: int, so: float, zo: int, n: int, data: st.DataObject
) -> None:
    q = data.draw(st.lists(st.integers(-128, 127), min_size=n, max_size=n))
    # reduce-nd.c: int32 sum of q, then the reference int32 -> qint8 convert with
    # inv_y_scale = (si / so) * (1 / n), y_zero_point = zo - (n * zi) * inv_y_scale
    s = f32(f32(f32(si) / f32(so)) * f32(f32(1.0) / f32(n)))
    zp = f32(f32(zo) - f32(f32(n * zi) * s))
    want = min(max(_lrintf(f32(f32(f32(sum(q)) * s) + zp)), -128), 127)
    mean = qa.Mean(si, zi, so, zo)
    x = torch.tensor(q, dtype=torch.float32).reshape(1, n, 1, 1) - zi
    got = mean(x, (1, 2), False) + zo
    assert got.reshape(-1).tolist() == [want]


@settings(max_examples=100, deadline=None)
@given(si=scales, zi=zps, so=scales, zo=zps)
def test_int8_convert_is_xnnpack_q8_fixed_point(si: float, zi: int, so: float, zo: int) -> None:
    ratio = f32(f32(si) / f32(so))
    if not 2**-8 <= ratio <= 2**7:
        return
    mult, _ = qa.requantize_params(si, zi, so, zo)
    q = list(range(-128, 128))
    got = qa.convert(torch.tensor(q, dtype=torch.float32) - zi, mult, -128 - zo, 127 - zo) + zo
    bias = (zo << 8) - mult * zi + 0x80
    want = [min(max(_asr(bias + x * mult, 8), -128), 127) for x in q]
    assert got.tolist() == want


def test_hardswish_table_is_xnnpack_reference() -> None:
    si, zi, so, zo = 0.05, -3, 0.03, -100
    table = qa.unary_table("Hardswish", si, zi, so, zo)
    assert table is not None
    for q in range(-128, 128):
        x = f32(f32(q) - f32(zi)) * f32(si)
        y = f32(f32(x / f32(6)) * min(max(f32(x + f32(3)), f32(0)), f32(6)))
        want = min(max(_lrintf(f32(f32(y * f32(f32(1) / f32(so))) + f32(zo))), -128), 127)
        assert table[q + 128].item() == want - zo, q


def test_exactness_bound() -> None:
    assert qa.exact_in_float32(1000.0, 255, 1000.0)
    assert not qa.exact_in_float32(70000.0, 255, 0.0)
    # the bound is what float32 needs: past 2**24 an odd integer is not representable
    assert float(f32(2**24 + 1)) != 2**24 + 1


def test_add_scales_without_a_rounding_shift_are_refused() -> None:
    """An output scale 2**21 times smaller than an input's leaves no shift to round with."""
    qa.add_params(0.5, 0.5, 1e-6)  # XNNPACK asserts on this one; its arithmetic still holds
    with pytest.raises(ValueError, match="out of range"):
        qa.add_params(1.0, 1.0, 1e-7)


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 40])
def test_row_parameters_agree_on_every_path(rows: int) -> None:
    """Python floats (one row), numpy float32 (more) and torch (off the CPU) compute the
    same per-row multiplier and zero point, including rows of zeros and one-signed rows."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 33, generator=gen) * torch.logspace(-3, 3, rows).reshape(-1, 1)
    x[0] = 0.0
    if rows > 2:
        x[1] = x[1].abs()
        x[2] = -x[2].abs()
    mn, mx = torch.aminmax(x, dim=1, keepdim=True)
    py = [
        qa._row_params(a, b)
        for a, b in zip(mn.view(-1).tolist(), mx.view(-1).tolist(), strict=True)
    ]
    m_np, z_np = qa._row_params_np(mn.numpy(), mx.numpy())
    m_t, z_t = qa._row_params_torch(mn, mx)
    assert [p[0] for p in py] == m_np.reshape(-1).tolist() == m_t.reshape(-1).tolist()
    assert [p[1] for p in py] == z_np.reshape(-1).tolist() == z_t.reshape(-1).tolist()
    r = qa.quantize_rows(x, 1)
    assert torch.equal(r.centered, torch.round(x * m_t).clamp(-128 - z_t, 127 - z_t))


@pytest.mark.parametrize("layout", ["contiguous", "nchw memory", "strided"])
def test_table_lookup_keeps_values_and_layout(layout: str) -> None:
    table = torch.randn(256)
    x = torch.randint(-128, 128, (2, 5, 6, 3)).float()
    if layout == "nchw memory":
        x = x.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
    elif layout == "strided":
        x = x[:, ::2]
    got = qa.lookup(x, table, 128.0)
    assert torch.equal(got, table[(x + 128).long()])
    assert got.shape == x.shape


def _three_passes(scales: torch.Tensor) -> str | None:
    """The scale check as three separate reductions in double precision."""
    d = scales.double()
    if not bool(torch.isfinite(d).all()) or not bool((d > 0).all()):
        return "a scale that is not a finite positive number"
    if bool((d < 2.0**-126).any()):
        return "a subnormal scale"
    return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_scale_check_in_one_pass_finds_what_three_do(dtype: torch.dtype) -> None:
    """XNNPACK refuses a scale that is not a finite, positive, normal number: one min/max
    pass over the scales (a NaN anywhere, first, last or alone, propagates to both ends)
    finds exactly what a pass for each condition finds, in the stored precision."""
    from ptexec.delegates.xnnpack import backend
    from ptexec.delegates.xnnpack import schema as s

    value = s.XnnValue(0, 0, 1, (4,), 0, s.INVALID_ID, 0)
    normal = [0.5, 2.0**-126, 1e-3, 3e38]
    odd = [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 2.0**-127, 1e-45, 2.0**-126 / 2]
    cases = [[], normal, *([x] for x in odd)]
    for x in odd:
        for where in (0, 1, len(normal)):
            cases.append([*normal[:where], x, *normal[where:]])
    cases += [[math.nan] * 5000 + [1.0], [1.0] * 5000 + [math.nan], [1.0] * 4097 + [0.0]]
    for case in cases:
        scales = torch.tensor(case, dtype=torch.float64).to(dtype)
        assert backend._scale_problem(value, scales) == _three_passes(scales), case


def _export_pt2e(model: torch.nn.Module, example: tuple[Any, ...], recipe: str, **kw: Any) -> bytes:
    """``model`` quantized and lowered as the fixtures are (scripts/make_xnnpack_fixtures.py)."""
    pytest.importorskip("executorch")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import make_xnnpack_fixtures as mk

    quantized = mk._quantize_pt2e(model.eval(), example, [example], recipe, kw.get("dynamic"))
    return bytes(mk._lower(quantized, example, recipe, kw.get("dynamic")).buffer)


def test_per_row_int8_linear_subtracts_the_zero_point_in_integers() -> None:
    """A linear of rows quantized at run time by int8 weights, wide enough for an int8
    product (2048 inputs): XNNPACK accumulates ``sum((q - zp) * w)`` exactly in int32 and
    converts that once to float. A row of small negative values (zero point 127) against a
    channel of equal weights puts ``sum(q * w)`` and ``zp * sum(w)`` past 2**24 while
    their difference is small: subtracted after both were rounded to float32, it lost a
    unit of the accumulator (-0.49998 for ExecuTorch's -0.5)."""
    from torch.export import Dim

    from conftest import executorch_runtime

    torch.manual_seed(0)
    model = torch.nn.Linear(2048, 2)
    with torch.no_grad():
        model.weight[0] = 0.5
        model.weight[1] = torch.rand(2048) * 0.5
        model.bias.zero_()
    batch = {0: Dim("batch", min=1, max=4)}
    data = _export_pt2e(model, (torch.randn(3, 2048),), "int8_dynamic_pc", dynamic=(batch,))
    x = torch.full((3, 2048), -1e-3)
    x[:, 0] = -1.0
    x[1] = torch.rand(2048) * 0.01
    x[1, 5] = 1.0
    program = executorch_runtime().load_program(data)  # alive while its method runs
    theirs = program.load_method("forward")
    ours = ptexec.load(data).load_method("forward", xnnpack="torch")
    for rows in (x, x[:1].clone()):  # several rows, and one (host-side row parameters)
        (want,) = theirs.execute([rows.clone()])
        (got,) = ours.execute([rows.clone()])
        assert want[0, 0].item() == -0.5
        assert torch.equal(got, want)


def test_per_image_int8_convolution_accumulates_exactly_past_float32() -> None:
    """A dynamically quantized convolution whose filter lets partial sums pass 2**24
    (64 channels of 3x3 at full scale): XNNPACK's int32 accumulator is exact, and so is
    ptexec's in float64 (it convolved dequantized floats there, 5e-5 off ExecuTorch)."""
    from conftest import executorch_runtime

    torch.manual_seed(0)
    model = torch.nn.Conv2d(64, 2, 3, padding=1)
    with torch.no_grad():
        model.weight[0] = 0.5
        model.weight[1] = torch.rand_like(model.weight[1])
        model.bias.zero_()
    data = _export_pt2e(model, (torch.randn(2, 64, 5, 5),), "int8_dynamic_pc")
    x = torch.rand(2, 64, 5, 5)
    x[:, 0] = 2.0
    program = executorch_runtime().load_program(data)  # alive while its method runs
    (want,) = program.load_method("forward").execute([x.clone()])
    (got,) = ptexec.load(data).load_method("forward", xnnpack="torch").execute([x.clone()])
    assert torch.equal(got, want)


@pytest.mark.parametrize("value", [math.nan, -math.inf])
def test_one_row_with_a_non_finite_value_is_quantized_as_several_are(value: float) -> None:
    """A token whose row holds a NaN (or -inf) gets no finite quantization parameters:
    ExecuTorch returns NaN for it, and so does ptexec's runner for several rows. Its
    one-row path (parameters in Python floats) raised instead (NaN to an integer)."""
    from conftest import executorch_runtime

    torch.manual_seed(0)
    data = _export_pt2e(torch.nn.Linear(16, 4), (torch.randn(1, 16),), "int8_dynamic_pc")
    x = torch.randn(1, 16)
    x[0, 3] = value
    program = executorch_runtime().load_program(data)  # alive while its method runs
    (want,) = program.load_method("forward").execute([x.clone()])
    method = ptexec.load(data).load_method("forward", xnnpack="torch")
    (got,) = method.execute([x.clone()])
    assert torch.isnan(want).all() and torch.isnan(got).all()
    (after,) = method.execute([torch.ones(1, 16)])  # and the next call is a good one
    assert torch.isfinite(after).all()
