"""Prim scalar ops on edge values: the interpreter's statement and the compiled tier's
functional form give the same result, and both match float64/int64 tensor arithmetic."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from compile_util import one_kernel_forms
from ptexec.compile.functional import Env
from ptexec.format import program as p
from ptexec.kernels.prim import PRIM_OPS
from ptexec.kernels.registry import KernelContext, find_kernel

INF, NAN = math.inf, math.nan
FLOATS = [0.0, -0.0, 2.5, -3.0, INF, -INF, NAN]
INTS = [0, 3, -7]
NUMBERS = FLOATS + INTS
BOOLS = [True, False]


def _evalue(x: Any) -> p.EValue:
    if isinstance(x, torch.Tensor):
        code = {torch.float32: 6, torch.int64: 4}[x.dtype]
        dims = tuple(range(x.dim()))
        return p.Tensor(code, 0, tuple(x.shape), dims, False, 0, None, 0, p.STATIC, None)
    if isinstance(x, bool):
        return p.Bool(x)
    return p.Int(x) if isinstance(x, int) else p.Double(x)


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (ZeroDivisionError, OverflowError, ValueError) as e:
        return type(e)


def _interpreted(name: str, operands: tuple[Any, ...]) -> Any:
    """The interpreter's statement for ``name`` on values table slots holding ``operands``."""
    n = len(operands)
    values = (*tuple(_evalue(x) for x in operands), p.Int(0))
    table: list[Any] = [*operands, 0]
    ctx = KernelContext(name, 0, tuple(range(n + 1)), values, frozenset(range(n + 1)), table)
    factory = find_kernel(name)
    assert factory is not None
    emission = factory(ctx)

    def run() -> Any:
        exec(emission.code, {**emission.env, "v": table})
        return table[n]

    return _outcome(run)


def _compiled(name: str, operands: tuple[Any, ...]) -> Any:
    """The compiled tier's functional form of the same instruction, on an :class:`Env`."""
    n = len(operands)
    values = (*tuple(_evalue(x) for x in operands), p.Int(0))
    rebuild = one_kernel_forms(values, range(n + 1), name)
    assert rebuild.reason(0, 0) is None
    env = Env(lambda j: operands[j])

    def run() -> Any:
        rebuild.step(env, 0, 0)
        return env[n]

    return _outcome(run)


def _t(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64 if isinstance(x, float) else torch.int64)


def _floor_div(a: Any, b: Any) -> Any:
    if isinstance(a, float) or isinstance(b, float):
        return float(torch.floor(_t(float(a)) / _t(float(b))))
    if b == 0:
        return ZeroDivisionError
    return int(torch.div(_t(a), _t(b), rounding_mode="floor"))


def _trunc_div(a: int, b: int) -> Any:
    return ZeroDivisionError if b == 0 else int(torch.div(_t(a), _t(b), rounding_mode="trunc"))


def _arith(f: Any) -> Any:
    def ref(a: Any, b: Any) -> Any:
        r = f(_t(a), _t(b))
        return float(r) if isinstance(a, float) or isinstance(b, float) else int(r)

    return ref


def _to_int(f: Any) -> Any:
    def ref(a: float) -> Any:
        return OverflowError if math.isinf(a) else ValueError if math.isnan(a) else int(f(_t(a)))

    return ref


# name -> (operand sets, reference) ; the reference is float64/int64 tensor arithmetic
CASES: dict[str, tuple[list[Any], Any]] = {
    "executorch_prim::add.Scalar": ([NUMBERS] * 2, _arith(torch.add)),
    "executorch_prim::sub.Scalar": ([NUMBERS] * 2, _arith(torch.sub)),
    "executorch_prim::mul.Scalar": ([NUMBERS] * 2, _arith(torch.mul)),
    "executorch_prim::truediv.Scalar": (
        [NUMBERS] * 2,
        lambda a, b: float(_t(float(a)) / _t(float(b))),
    ),
    "executorch_prim::floordiv.Scalar": ([NUMBERS] * 2, _floor_div),
    "executorch_prim::floordiv.int": ([INTS] * 2, _trunc_div),
    "executorch_prim::mod.int": (
        [INTS] * 2,
        lambda a, b: ZeroDivisionError if b == 0 else int(torch.fmod(_t(a), _t(b))),
    ),
    "executorch_prim::mod.Scalar": (
        [INTS] * 2,
        lambda a, b: ZeroDivisionError if b == 0 else int(torch.fmod(_t(a), _t(b))),
    ),
    "executorch_prim::sym_max.Scalar": ([INTS] * 2, lambda a, b: int(torch.maximum(_t(a), _t(b)))),
    "executorch_prim::sym_min.Scalar": ([INTS] * 2, lambda a, b: int(torch.minimum(_t(a), _t(b)))),
    "executorch_prim::eq.Scalar": ([NUMBERS] * 2, lambda a, b: bool(_t(a) == _t(b))),
    "executorch_prim::gt.Scalar": ([NUMBERS] * 2, lambda a, b: bool(_t(a) > _t(b))),
    "executorch_prim::lt.Scalar": ([NUMBERS] * 2, lambda a, b: bool(_t(a) < _t(b))),
    "executorch_prim::ge.Scalar": ([NUMBERS] * 2, lambda a, b: bool(_t(a) >= _t(b))),
    "executorch_prim::le.Scalar": ([NUMBERS] * 2, lambda a, b: bool(_t(a) <= _t(b))),
    "executorch_prim::neg.Scalar": (
        [NUMBERS],
        lambda a: float(-_t(a)) if isinstance(a, float) else int(-_t(a)),
    ),
    "executorch_prim::sym_float.Scalar": ([NUMBERS + BOOLS], lambda a: float(_t(float(a)))),
    "executorch_prim::sym_int.Scalar": ([FLOATS], _to_int(torch.trunc)),
    "executorch_prim::ceil.Scalar": ([FLOATS], _to_int(torch.ceil)),
    "executorch_prim::trunc.Scalar": ([FLOATS], _to_int(torch.trunc)),
    "executorch_prim::round.Scalar": ([[*FLOATS, 0.5, 1.5, -2.5]], _to_int(torch.round)),
    "executorch_prim::sym_not.Scalar": ([BOOLS], lambda a: not a),
    "executorch_prim::sym_ite.Scalar": ([BOOLS, NUMBERS, INTS], lambda c, a, b: a if c else b),
}


def _same(x: Any, y: Any) -> bool:
    """Equal, of the same type, nan equal to nan, and zeros of the same sign."""
    if type(x) is not type(y):
        return False
    if isinstance(x, float):
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)
    return bool(x == y)


def _combinations(sets: list[list[Any]]) -> list[tuple[Any, ...]]:
    combos: list[tuple[Any, ...]] = [()]
    for s in sets:
        combos = [(*c, x) for c in combos for x in s]
    return combos


def test_every_scalar_prim_op_is_covered() -> None:
    scalar = {n for n in PRIM_OPS if n.startswith("executorch_prim::")}
    assert scalar == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_prim_op_edge_values_agree_across_tiers(name: str) -> None:
    sets, reference = CASES[name]
    for operands in _combinations(sets):
        expected = reference(*operands)
        interpreted = _interpreted(name, operands)
        compiled = _compiled(name, operands)
        assert _same(interpreted, expected), (name, operands, interpreted, expected)
        assert _same(compiled, interpreted), (name, operands, compiled, interpreted)


def test_true_division_by_a_float_zero_is_ieee_in_both_tiers() -> None:
    for a, b, want in [(1, 0.0, INF), (-1.0, 0.0, -INF), (2.5, -0.0, -INF), (0.0, 0.0, NAN)]:
        for tier in (_interpreted, _compiled):
            got = tier("executorch_prim::truediv.Scalar", (a, b))
            assert _same(got, want), (tier.__name__, a, b, got)


def test_size_ops_agree_across_tiers() -> None:
    t = torch.zeros(3, 5)
    for name, operands, want in [
        ("aten::sym_size.int", (t, 1), 5),
        ("aten::sym_size.int", (t, -2), 3),
        ("aten::sym_numel", (t,), 15),
        ("aten::sym_numel.default", (t,), 15),
        ("aten::sym_storage_offset", (t,), 0),
        ("aten::_local_scalar_dense", (torch.tensor([-0.0]),), -0.0),
        ("aten::_local_scalar_dense.default", (torch.tensor([7]),), 7),
    ]:
        interpreted = _interpreted(name, operands)
        assert _same(interpreted, want), (name, interpreted)
        assert _same(_compiled(name, operands), interpreted), name
