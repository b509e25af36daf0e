"""The operator-coverage table: small modules that each apply one core ATen op.

Each ``Case`` names a function (or module factory), seeded example inputs and the dtypes it is
run at. Floating outputs are compared with ``spec.DEFAULT_TOLERANCES`` unless a case gives
``tol=`` (none needs to at present: the exported graphs, run with ATen kernels, stay well inside
the defaults, the worst being logsumexp in float16 at about a third of the allowance).

Which ``aten::`` operators a case really exercises is not declared here: it is read back from
the exported program (see ``export.py``), so coverage numbers cannot drift from reality.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .spec import (
    ALL,
    FLOAT,
    INT,
    INT_BOOL,
    NUM,
    NZ,
    Case,
    Distinct,
    Idx,
    Mask,
    Perm,
    Pos,
    Special,
    T,
    Uniq,
    Unit,
    b8,
    bf16,
    case_table,
    f16,
    f32,
    i32,
    i64,
)

CASES: list[Case] = []


def case(name, fn, *inputs, dtypes=FLOAT, **kw) -> None:
    CASES.append(Case(name, fn, tuple(inputs), tuple(dtypes), **kw))


def mcase(name, module, *inputs, dtypes=FLOAT, **kw) -> None:
    CASES.append(Case(name, None, tuple(inputs), tuple(dtypes), module=module, **kw))


# --------------------------------------------------------------------------------------------
# Unary elementwise math
# --------------------------------------------------------------------------------------------
case("abs", torch.abs, T(3, 5), dtypes=NUM)
case("neg", torch.neg, T(3, 5), dtypes=NUM)
case("exp", torch.exp, T(3, 5), dtypes=(*FLOAT, i64))
case("expm1", torch.expm1, T(3, 5))
case("log", torch.log, Pos(3, 5))
case("log_int", torch.log, T(3, 5, low=1, high=9), dtypes=INT)
case("log10", torch.log10, Pos(3, 5))
case("log2", torch.log2, Pos(3, 5))
case("log1p", torch.log1p, T(3, 5, low=-0.9, high=4.0))
case("sqrt", torch.sqrt, Pos(3, 5))
case("sqrt_int", torch.sqrt, T(3, 5, low=0, high=20), dtypes=INT)
case("rsqrt", torch.rsqrt, Pos(3, 5))
case("reciprocal", torch.reciprocal, NZ(3, 5))
case("sin", torch.sin, T(3, 5), dtypes=(*FLOAT, i32))
case("cos", torch.cos, T(3, 5))
case("tan", torch.tan, T(3, 5, low=-1.2, high=1.2))
case("sinh", torch.sinh, T(3, 5))
case("cosh", torch.cosh, T(3, 5))
case("tanh", torch.tanh, T(3, 5))
case("asin", torch.asin, Unit(3, 5))
case("acos", torch.acos, Unit(3, 5))
case("atan", torch.atan, T(3, 5))
case("asinh", torch.asinh, T(3, 5))
case("acosh", torch.acosh, T(3, 5, low=1.1, high=5.0))
case("atanh", torch.atanh, Unit(3, 5))
case("sigmoid", torch.sigmoid, T(3, 5))
case("erf", torch.erf, T(3, 5))
case("ceil", torch.ceil, T(3, 5, low=-4, high=4))
case("floor", torch.floor, T(3, 5, low=-4, high=4))
case("round", torch.round, T(3, 5, low=-4, high=4))
case("trunc", torch.trunc, T(3, 5, low=-4, high=4))
case("frac", torch.frac, T(3, 5, low=-4, high=4))
case("sign", torch.sign, T(3, 5), dtypes=NUM)
case("isnan", torch.isnan, Special(4, 6))
case("isinf", torch.isinf, Special(4, 6))
case("isfinite", torch.isfinite, Special(4, 6))
case("nan_to_num", lambda x: torch.nan_to_num(x, nan=0.5, posinf=3.0, neginf=-3.0), Special(4, 6))
case("bitwise_not", torch.bitwise_not, T(3, 5), dtypes=INT_BOOL)
case("logical_not", torch.logical_not, T(3, 5), dtypes=ALL)
case("square", torch.square, T(3, 5), dtypes=NUM)

# --------------------------------------------------------------------------------------------
# Activations
# --------------------------------------------------------------------------------------------
case("relu", torch.relu, T(3, 5), dtypes=NUM)
case("relu6", F.relu6, T(3, 5, low=-8, high=8))
case("gelu", F.gelu, T(3, 5))
case("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), T(3, 5))
case("elu", lambda x: F.elu(x, alpha=0.7), T(3, 5))
case("celu", lambda x: F.celu(x, alpha=1.3), T(3, 5))
case("selu", F.selu, T(3, 5))
case("leaky_relu", lambda x: F.leaky_relu(x, 0.2), T(3, 5))
case("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.75), T(3, 5))
case("hardswish", F.hardswish, T(3, 5, low=-5, high=5))
case("hardsigmoid", F.hardsigmoid, T(3, 5, low=-5, high=5))
case("silu", F.silu, T(3, 5))
case("mish", F.mish, T(3, 5))
case("softplus", lambda x: F.softplus(x, beta=2.0, threshold=3.0), T(3, 5))
case("logsigmoid", F.logsigmoid, T(3, 5))
case("softsign", F.softsign, T(3, 5))
case("threshold", lambda x: F.threshold(x, 0.1, -2.0), T(3, 5))
case("hardshrink", lambda x: F.hardshrink(x, 0.5), T(3, 5))
case("softshrink", lambda x: F.softshrink(x, 0.5), T(3, 5))
case("prelu", F.prelu, T(2, 3, 4), T(3))
case("glu", lambda x: F.glu(x, dim=-1), T(3, 8), preserve=("aten.glu.default",))
case(
    "logit",
    lambda x: torch.logit(x, eps=1e-3),
    T(3, 5, low=0.01, high=0.99),
    preserve=("aten.logit.default",),
)
case("softmax", lambda x: torch.softmax(x, dim=-1), T(3, 7))
case("softmax_dim0", lambda x: torch.softmax(x, dim=0), T(3, 7))
case("log_softmax", lambda x: torch.log_softmax(x, dim=1), T(2, 5, 3))

# --------------------------------------------------------------------------------------------
# Binary elementwise, with broadcasting
# --------------------------------------------------------------------------------------------
case("add", torch.add, T(3, 4), T(4), dtypes=ALL)
case("add_alpha", lambda a, b: torch.add(a, b, alpha=2), T(3, 1, 4), T(2, 1), dtypes=NUM)
case("add_scalar", lambda a: a + 2, T(3, 4), dtypes=NUM)
case("sub", torch.sub, T(3, 4), T(4), dtypes=NUM)
case("sub_alpha", lambda a, b: torch.sub(a, b, alpha=3), T(2, 3), T(3), dtypes=NUM)
case("rsub_scalar", lambda a: 1.5 - a, T(3, 4), preserve=("aten.rsub.Scalar",))
case("rsub_decomposed", lambda a: 2 - a, T(3, 4), dtypes=INT)
case("mul", torch.mul, T(3, 4), T(3, 1), dtypes=ALL)
case("mul_scalar", lambda a: a * 3, T(3, 4), dtypes=NUM)
case("div", torch.div, T(3, 4), NZ(4))
case("div_int", torch.div, T(3, 4), NZ(4), dtypes=INT)
case(
    "div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), T(3, 4), NZ(3, 1), dtypes=NUM
)
case("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), T(3, 4), NZ(4), dtypes=NUM)
case("div_scalar", lambda a: a / 4, T(3, 4))
case(
    "floor_divide",
    torch.floor_divide,
    T(3, 4),
    NZ(4),
    dtypes=NUM,
    preserve=("aten.floor_divide.default",),
)
case("pow", torch.pow, Pos(3, 4), T(3, 4, low=-2, high=2))
case("pow_int", torch.pow, T(3, 4), Idx(3, 4, high=4), dtypes=INT)
case("pow_tensor_scalar", lambda a: torch.pow(a, 3), T(3, 4), dtypes=NUM)
case("pow_sqrt", lambda a: a**0.5, Pos(3, 4))
case("pow_scalar_tensor", lambda a: torch.pow(2.0, a), T(3, 4))
case("remainder", torch.remainder, T(3, 4), NZ(4), dtypes=NUM)
case("remainder_scalar", lambda a: torch.remainder(a, 3), T(3, 4), dtypes=NUM)
case("fmod", torch.fmod, T(3, 4), NZ(4), dtypes=NUM)
case("fmod_scalar", lambda a: torch.fmod(a, 3), T(3, 4), dtypes=NUM)
case("maximum", torch.maximum, T(3, 4), T(4), dtypes=NUM)
case("minimum", torch.minimum, T(3, 4), T(3, 1), dtypes=NUM)
case("maximum_nan", torch.maximum, Special(3, 4), T(3, 4))
case("atan2", torch.atan2, T(3, 4), T(4))
case("bitwise_and", torch.bitwise_and, T(3, 4), T(4), dtypes=INT_BOOL)
case("bitwise_or", torch.bitwise_or, T(3, 4), T(4), dtypes=INT_BOOL)
case("bitwise_xor", torch.bitwise_xor, T(3, 4), T(3, 1), dtypes=INT_BOOL)
case("bitwise_and_scalar", lambda a: a & 6, T(3, 4), dtypes=INT)
case("bitwise_or_scalar", lambda a: a | 5, T(3, 4), dtypes=INT)
case("bitwise_xor_scalar", lambda a: a ^ 3, T(3, 4), dtypes=INT)
case(
    "bitwise_left_shift",
    torch.bitwise_left_shift,
    T(3, 4),
    Idx(4, high=5),
    dtypes=INT,
    preserve=("aten.bitwise_left_shift.Tensor",),
)
case(
    "bitwise_right_shift",
    torch.bitwise_right_shift,
    T(3, 4),
    Idx(4, high=5),
    dtypes=INT,
    preserve=("aten.bitwise_right_shift.Tensor",),
)
case("logical_and", torch.logical_and, T(3, 4), T(4), dtypes=ALL)
case("logical_or", torch.logical_or, T(3, 4), T(4), dtypes=ALL)
case("logical_xor", torch.logical_xor, T(3, 4), T(4), dtypes=ALL)
case("eq", torch.eq, T(3, 4, low=-2, high=2), T(4, low=-2, high=2), dtypes=ALL)
case("ne", torch.ne, T(3, 4, low=-2, high=2), T(4, low=-2, high=2), dtypes=ALL)
case("lt", torch.lt, T(3, 4), T(4), dtypes=NUM)
case("le", torch.le, T(3, 4, low=-2, high=2), T(4, low=-2, high=2), dtypes=NUM)
case("gt", torch.gt, T(3, 4), T(3, 1), dtypes=NUM)
case("ge", torch.ge, T(3, 4, low=-2, high=2), T(4, low=-2, high=2), dtypes=NUM)
case("eq_scalar", lambda a: a == 1, T(3, 4, low=-2, high=2), dtypes=NUM)
case("ne_scalar", lambda a: a != 1, T(3, 4, low=-2, high=2), dtypes=NUM)
case("lt_scalar", lambda a: a < 0.5, T(3, 4), dtypes=NUM)
case("le_scalar", lambda a: a <= 1, T(3, 4), dtypes=NUM)
case("gt_scalar", lambda a: a > 0, T(3, 4), dtypes=NUM)
case("ge_scalar", lambda a: a >= -1, T(3, 4), dtypes=NUM)
case("where", torch.where, Mask(3, 4), T(3, 4), T(4), dtypes=ALL)
case("where_scalar", lambda c, a: torch.where(c, a, 0.5), Mask(3, 4), T(3, 4))
case("clamp", lambda a: torch.clamp(a, -0.5, 0.7), T(3, 4))
case("clamp_int", lambda a: torch.clamp(a, -3, 4), T(3, 4), dtypes=INT)
case("clamp_min", lambda a: torch.clamp(a, min=0.1), T(3, 4))
case("clamp_tensor", torch.clamp, T(3, 4), T(4, low=-2, high=-0.1), T(3, 1, low=0.1, high=2))
case("lerp", torch.lerp, T(3, 4), T(3, 4), T(4, low=0, high=1))
case("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.5), T(3, 4), T(4), T(3, 1))
case("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c, value=0.5), T(3, 4), T(4), NZ(3, 1))
case("xlogy", torch.xlogy, T(3, 4), Pos(3, 4), dtypes=(f32,))

# --------------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------------
case("sum", torch.sum, T(3, 4), dtypes=NUM)
case("sum_dim", lambda x: torch.sum(x, dim=1, keepdim=True), T(3, 4, 5), dtypes=NUM)
case("sum_dims", lambda x: torch.sum(x, dim=(0, 2)), T(3, 4, 5), dtypes=NUM)
case("sum_bool", lambda x: torch.sum(x, dim=-1), T(3, 4), dtypes=(b8,))
case("mean", lambda x: torch.mean(x, dim=-1), T(3, 4, 5))
case("mean_keepdim", lambda x: torch.mean(x, dim=(0, 1), keepdim=True), T(3, 4, 5))
case("mean_all", torch.mean, T(3, 4))
case("amax", lambda x: torch.amax(x, dim=1), T(3, 4, 5), dtypes=NUM)
case("amin", lambda x: torch.amin(x, dim=(0, 2), keepdim=True), T(3, 4, 5), dtypes=NUM)
case("prod", torch.prod, T(2, 3, low=0.5, high=1.5))
case("prod_dim", lambda x: torch.prod(x, dim=1, keepdim=True), T(3, 4, low=-2, high=2), dtypes=NUM)
case("var", lambda x: torch.var(x, dim=1), T(3, 6))
case("var_keepdim", lambda x: torch.var(x, dim=(0, 1), correction=0, keepdim=True), T(3, 4, 2))
case("var_all", torch.var, T(3, 6))
case("std", lambda x: torch.std(x, dim=-1, keepdim=True), T(3, 6))
case(
    "var_mean", lambda x: torch.var_mean(x, dim=1), T(3, 6), preserve=("aten.var_mean.correction",)
)
case("any", torch.any, T(3, 4), dtypes=ALL)
case("any_dim", lambda x: torch.any(x, dim=1, keepdim=True), T(3, 4), dtypes=ALL)
case("any_dims", lambda x: torch.any(x, dim=(0, 2)), Mask(3, 4, 2), dtypes=(b8,))
case("all", torch.all, T(3, 4), dtypes=ALL)
case("all_dim", lambda x: torch.all(x, dim=0), T(3, 4), dtypes=ALL)
case("argmax", lambda x: torch.argmax(x, dim=1), Distinct(3, 5), dtypes=NUM)
case("argmax_keepdim", lambda x: torch.argmax(x, dim=0, keepdim=True), Distinct(3, 5))
case("argmax_all", torch.argmax, Distinct(3, 5))
case("argmin", lambda x: torch.argmin(x, dim=-1), Distinct(3, 5), dtypes=NUM)
case("logsumexp", lambda x: torch.logsumexp(x, dim=1), T(3, 5))
case("logsumexp_keepdim", lambda x: torch.logsumexp(x, dim=(0, 1), keepdim=True), T(2, 3, 4))
case("max_dim", lambda x: tuple(torch.max(x, dim=1)), Distinct(3, 5), dtypes=NUM)
case("max_dim_keepdim", lambda x: tuple(torch.max(x, dim=0, keepdim=True)), Distinct(3, 5))
case("min_dim", lambda x: tuple(torch.min(x, dim=-1)), Distinct(3, 5), dtypes=NUM)
case("max_all", torch.max, T(3, 5), dtypes=NUM)
case("min_all", torch.min, T(3, 5), dtypes=NUM)
case("norm", lambda x: torch.linalg.vector_norm(x, ord=2, dim=-1), T(3, 5))
case("norm_l1", lambda x: torch.linalg.vector_norm(x, ord=1, dim=0), T(3, 5))
case("cumsum", lambda x: torch.cumsum(x, dim=1), T(3, 5), dtypes=NUM)
case("cumsum_dim0", lambda x: torch.cumsum(x, dim=0), T(4, 3))
case("count_nonzero", lambda x: torch.count_nonzero(x, dim=1), T(3, 5), dtypes=NUM)

# --------------------------------------------------------------------------------------------
# Indexing, gather/scatter, masking
# --------------------------------------------------------------------------------------------
case("index", lambda x, i: x[i], T(5, 3), Idx(4, high=5), dtypes=ALL)
case("index_2d", lambda x, i, j: x[i, j], T(5, 4), Idx(3, high=5), Idx(3, high=4), dtypes=NUM)
case("index_mid", lambda x, i: x[:, i], T(3, 5, 2), Idx(2, 2, high=5))
case("index_bool", lambda x, i: x[i], T(5, 3), Idx(6, high=5, dtype=i32))
case(
    "index_put", lambda x, i, v: torch.index_put(x, (i,), v), T(5, 3), Perm(5), T(5, 3), dtypes=ALL
)
case(
    "index_put_accumulate",
    lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
    T(5, 3),
    Idx(7, high=5),
    T(7, 3),
    dtypes=NUM,
)
case(
    "index_put_2d",
    lambda x, i, j, v: torch.index_put(x, (i, j), v),
    T(4, 4),
    Idx(3, high=4),
    Perm(3),
    T(3),
)
case("index_select", lambda x, i: torch.index_select(x, 1, i), T(3, 5), Idx(4, high=5), dtypes=ALL)
case(
    "index_add",
    lambda x, i, s: x.index_add(0, i, s),
    T(5, 3),
    Idx(4, high=5),
    T(4, 3),
    dtypes=(f32, i64),
)
case("gather", lambda x, i: torch.gather(x, 1, i), T(3, 5), Idx(3, 4, high=5), dtypes=ALL)
case("take_along_dim", lambda x, i: torch.take_along_dim(x, i, dim=0), T(4, 3), Idx(2, 3, high=4))
case(
    "scatter_src",
    lambda x, i, s: torch.scatter(x, 1, i, s),
    T(3, 5),
    Uniq(3, 2, high=5),
    T(3, 2),
    dtypes=NUM,
)
case("scatter_value", lambda x, i: torch.scatter(x, 0, i, 1.5), T(4, 3), Idx(2, 3, high=4))
case(
    "scatter_add",
    lambda x, i, s: torch.scatter_add(x, 1, i, s),
    T(3, 5),
    Idx(3, 4, high=5),
    T(3, 4),
    dtypes=NUM,
)
case(
    "scatter_reduce_sum",
    lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "sum"),
    T(4, 3),
    Idx(5, 3, high=4),
    T(5, 3),
    dtypes=NUM,
)
case(
    "scatter_reduce_prod",
    lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "prod", include_self=False),
    T(4, 3),
    Idx(5, 3, high=4),
    T(5, 3),
    dtypes=(f32, i64),
)
case(
    "scatter_reduce_amax",
    lambda x, i, s: torch.scatter_reduce(x, 1, i, s, "amax"),
    T(3, 4),
    Idx(3, 6, high=4),
    T(3, 6),
    dtypes=NUM,
)
case(
    "scatter_reduce_amin",
    lambda x, i, s: torch.scatter_reduce(x, 1, i, s, "amin", include_self=False),
    T(3, 4),
    Idx(3, 6, high=4),
    T(3, 6),
    dtypes=(f32, i32),
)
case(
    "scatter_reduce_mean",
    lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "mean"),
    T(4, 3),
    Idx(5, 3, high=4),
    T(5, 3),
    dtypes=(f32,),
)
case(
    "masked_fill",
    lambda x, m: x.masked_fill(m, -1.5),
    T(3, 4),
    Mask(4),
    preserve=("aten.masked_fill.Scalar",),
)
case(
    "masked_fill_int",
    lambda x, m: x.masked_fill(m, 7),
    T(3, 4),
    Mask(3, 4),
    dtypes=INT_BOOL,
    preserve=("aten.masked_fill.Scalar",),
)
case(
    "masked_fill_decomposed",
    lambda x, m: x.masked_fill(m, 2),
    T(3, 4),
    Mask(3, 1),
    dtypes=(f32, i64),
)
case(
    "masked_fill_tensor", lambda x, m, v: x.masked_fill(m, v), T(3, 4), Mask(3, 4), T(), dtypes=NUM
)
case(
    "masked_scatter", lambda x, m, s: x.masked_scatter(m, s), T(3, 4), Mask(3, 4), T(12), dtypes=ALL
)
case("select", lambda x: x.select(1, 2), T(3, 4, 5), dtypes=ALL)
case("select_neg", lambda x: x[-1], T(3, 4))
case("slice", lambda x: x[:, 1:4], T(3, 5), dtypes=ALL)
case("slice_step", lambda x: x[::2, 1::3], T(5, 7), dtypes=NUM)
case("narrow", lambda x: torch.narrow(x, 0, 1, 2), T(4, 3), dtypes=ALL)
case(
    "narrow_copy",
    lambda x: torch.narrow_copy(x, 1, 1, 2),
    T(3, 4),
    dtypes=NUM,
    preserve=("aten.narrow_copy.default",),
)
case(
    "select_scatter",
    lambda x, s: torch.select_scatter(x, s, 0, 1),
    T(3, 4),
    T(4),
    dtypes=NUM,
    preserve=("aten.select_scatter.default",),
)
case("select_scatter_decomposed", lambda x, s: torch.select_scatter(x, s, 1, -1), T(3, 4), T(3))
case(
    "slice_scatter",
    lambda x, s: torch.slice_scatter(x, s, 1, 0, 4, 2),
    T(3, 5),
    T(3, 2),
    dtypes=NUM,
)
case("diagonal", lambda x: torch.diagonal(x, offset=1), T(4, 5), dtypes=NUM)
case("diagonal_3d", lambda x: torch.diagonal(x, 0, 1, 2), T(2, 3, 3))

# --------------------------------------------------------------------------------------------
# Views, reshapes, joins and splits. Pure views are followed by nothing: the exporter turns
# them into *_copy ops, which is what appears in the program.
# --------------------------------------------------------------------------------------------
case("view", lambda x: x.view(4, 3), T(2, 6), dtypes=ALL)
case("reshape", lambda x: x.reshape(-1, 2), T(2, 3, 2), dtypes=NUM)
case("flatten", lambda x: torch.flatten(x, 1), T(2, 3, 2))
case("permute", lambda x: x.permute(2, 0, 1), T(2, 3, 4), dtypes=ALL)
case("transpose", lambda x: x.transpose(0, 1), T(3, 4), dtypes=NUM)
case(
    "transpose_copy",
    lambda x: torch.transpose_copy(x, 0, 2),
    T(2, 3, 4),
    dtypes=NUM,
    preserve=("aten.transpose_copy.int",),
)
case("t", lambda x: x.t(), T(3, 4))
case(
    "t_copy",
    lambda x: torch.t_copy(x),
    T(3, 4),
    dtypes=(f32, i64),
    preserve=("aten.t_copy.default",),
)
case(
    "detach_copy",
    lambda x: torch.detach_copy(x),
    T(3, 4),
    dtypes=(f32, i32),
    preserve=("aten.detach_copy.default",),
)
case("movedim", lambda x: torch.movedim(x, 0, -1), T(2, 3, 4))
case("expand", lambda x: x.expand(3, 2, 4), T(2, 1), dtypes=ALL)
case("expand_as", lambda x, y: x.expand_as(y), T(1, 4), T(3, 4))
case("squeeze", lambda x: x.squeeze(1), T(3, 1, 4), dtypes=ALL)
case("squeeze_all", lambda x: x.squeeze(), T(1, 3, 1, 4))
case("squeeze_dims", lambda x: torch.squeeze(x, (0, 2)), T(1, 3, 1, 4), dtypes=NUM)
case("unsqueeze", lambda x: x.unsqueeze(1), T(3, 4), dtypes=ALL)
case("flip", lambda x: torch.flip(x, (0, 2)), T(2, 3, 4), dtypes=ALL)
case("roll", lambda x: torch.roll(x, 2, 1), T(3, 5), dtypes=NUM, preserve=("aten.roll.default",))
case(
    "roll_multi", lambda x: torch.roll(x, (1, -2), (0, 1)), T(3, 5), preserve=("aten.roll.default",)
)
case("roll_decomposed", lambda x: torch.roll(x, 1, 0), T(4, 3))
case("repeat", lambda x: x.repeat(2, 1, 3), T(2, 3), dtypes=ALL)
case("tile", lambda x: torch.tile(x, (2, 2)), T(2, 3))
case("repeat_interleave", lambda x: torch.repeat_interleave(x, 2, dim=0), T(2, 3))
case("cat", lambda a, b: torch.cat([a, b], dim=1), T(3, 2), T(3, 4), dtypes=ALL)
case("cat3", lambda a, b, c: torch.cat([a, b, c]), T(1, 3), T(2, 3), T(3, 3))
case(
    "stack",
    lambda a, b: torch.stack([a, b], dim=1),
    T(3, 4),
    T(3, 4),
    dtypes=ALL,
    preserve=("aten.stack.default",),
)
case("stack_decomposed", lambda a, b, c: torch.stack([a, b, c]), T(2, 3), T(2, 3), T(2, 3))
case("split", lambda x: torch.split(x, 2, dim=1), T(3, 5), dtypes=NUM)
case(
    "split_copy",
    lambda x: torch.split_copy(x, 2, dim=0),
    T(5, 3),
    dtypes=(f32, bf16, i64),
    preserve=("aten.split_copy.Tensor",),
)
case("split_with_sizes", lambda x: torch.split(x, [1, 3, 1], dim=1), T(3, 5), dtypes=ALL)
case("unbind", lambda x: torch.unbind(x, 1), T(2, 3, 2), dtypes=NUM)
case(
    "unbind_copy",
    lambda x: torch.unbind_copy(x, 0),
    T(3, 2, 2),
    dtypes=(f32, f16, i32),
    preserve=("aten.unbind_copy.int",),
)
case("chunk", lambda x: torch.chunk(x, 3, dim=0), T(6, 2))
case("tril", lambda x: torch.tril(x), T(4, 5), dtypes=NUM, preserve=("aten.tril.default",))
case("tril_diag", lambda x: torch.tril(x, -1), T(4, 4))
case("triu", lambda x: torch.triu(x, 1), T(4, 5), dtypes=NUM)
case(
    "pixel_shuffle",
    lambda x: F.pixel_shuffle(x, 2),
    T(1, 8, 2, 3),
    dtypes=NUM,
    preserve=("aten.pixel_shuffle.default",),
)
case(
    "pixel_unshuffle",
    lambda x: F.pixel_unshuffle(x, 2),
    T(1, 2, 4, 6),
    preserve=("aten.pixel_unshuffle.default",),
)
case("pixel_shuffle_decomposed", lambda x: F.pixel_shuffle(x, 2), T(1, 8, 2, 3))
# Tensor.unfold is a view the exporter refuses to preserve; unfold_copy is the functional form.
case(
    "unfold_copy",
    lambda x: torch.ops.aten.unfold_copy(x, 1, 3, 2),
    T(2, 7),
    dtypes=NUM,
    preserve=("aten.unfold_copy.default",),
)
case("as_strided", lambda x: torch.as_strided(x, (3, 2), (1, 3)), T(4, 3))
case("clone", lambda x: torch.clone(x), T(3, 4), dtypes=ALL)
case(
    "contiguous_channels_last",
    lambda x: x.contiguous(memory_format=torch.channels_last),
    T(1, 3, 2, 2),
)
case("diag_embed", lambda x: torch.diag_embed(x), T(2, 3))
case("broadcast_to", lambda x: torch.broadcast_to(x, (2, 3, 4)), T(3, 1))
case("alias", lambda x: torch.ops.aten.alias(x), T(3, 4))

# --------------------------------------------------------------------------------------------
# Tensor creation inside the graph (mixed with the input so there is something to compare)
# --------------------------------------------------------------------------------------------
case("arange", lambda x: x + torch.arange(5, dtype=x.dtype), T(3, 5), dtypes=NUM)
case(
    "arange_start_step",
    lambda x: x * torch.arange(1, 9, 2, dtype=torch.float32),
    T(2, 4),
    dtypes=(f32,),
)
case("full", lambda x: x + torch.full((3, 4), 2.5), T(3, 4), dtypes=(f32,))
case(
    "zeros",
    lambda x: torch.cat([x, torch.zeros(1, 4, dtype=x.dtype)]),
    T(3, 4),
    dtypes=ALL,
    preserve=("aten.zeros.default",),
)
case("zeros_decomposed", lambda x: x + torch.zeros(3, 4), T(3, 4), dtypes=(f32,))
case(
    "ones",
    lambda x: x - torch.ones(3, 4, dtype=x.dtype),
    T(3, 4),
    dtypes=NUM,
    preserve=("aten.ones.default",),
)
case("full_like", lambda x: torch.full_like(x, 7), T(3, 4), dtypes=NUM)
case("zeros_like", lambda x: torch.zeros_like(x) + x, T(3, 4))
case("ones_like", lambda x: torch.ones_like(x), T(3, 4), dtypes=ALL)
case("empty_fill", lambda x: torch.empty(3, 4, dtype=x.dtype).fill_(1.25) * x, T(3, 4))
case("fill_scalar", lambda x: torch.fill(x, 2.5), T(3, 4), preserve=("aten.fill.Scalar",))
case(
    "fill_tensor",
    lambda x, v: torch.fill(x, v),
    T(3, 4),
    T(),
    dtypes=NUM,
    preserve=("aten.fill.Tensor",),
)
case("fill_decomposed", lambda x, v: torch.fill(x, v), T(2, 3), T(), dtypes=(f32,))
case("scalar_tensor", lambda x: x * torch.scalar_tensor(3.0), T(3, 4), dtypes=(f32,))
case("eye", lambda x: x + torch.eye(3, dtype=x.dtype), T(3, 3))
case("linspace", lambda x: x + torch.linspace(0, 1, 5), T(2, 5), dtypes=(f32,))
case("new_full", lambda x: x.new_full((2, 2), 4), T(3, 4), dtypes=NUM)
case("copy", lambda x, y: torch.ops.aten.copy(x, y), T(3, 4), T(4), dtypes=NUM)
case("tensor_constant", lambda x: x + torch.tensor([1.0, 2.0, 3.0]), T(2, 3), dtypes=(f32,))
case("item", lambda x, s: x * s.item(), T(3, 4), T(), dtypes=(f32, i64))
case(
    "native_dropout_p0",
    lambda x: torch.ops.aten.native_dropout(x, 0.0, True),
    T(3, 4),
    note="p=0 in training mode keeps every element: deterministic",
)


def _mutate_input(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(y)
    return x * 2


case(
    "input_mutation",
    _mutate_input,
    T(3, 4),
    T(4),
    dtypes=(f32, i64),
    note="in-place update of a user input: the program writes it back",
)

# --------------------------------------------------------------------------------------------
# Casts
# --------------------------------------------------------------------------------------------
case("to_float32", lambda x: x.to(torch.float32), T(3, 4), dtypes=(f16, bf16, i64, i32, b8))
case("to_float16", lambda x: x.to(torch.float16), T(3, 4), dtypes=(f32, bf16, i64, b8))
case("to_bfloat16", lambda x: x.to(torch.bfloat16), T(3, 4), dtypes=(f32, f16, i32))
case("to_int64", lambda x: x.to(torch.int64), T(3, 4, low=-6, high=6), dtypes=(f32, f16, i32, b8))
case("to_int32", lambda x: x.to(torch.int32), T(3, 4, low=-6, high=6), dtypes=(f32, bf16, i64))
case("to_bool", lambda x: x.to(torch.bool), T(3, 4, low=-2, high=2), dtypes=NUM)
case("type_as", lambda x, y: x.type_as(y), T(3, 4), T(2, dtype=f16), dtypes=(f32, i64))

# --------------------------------------------------------------------------------------------
# Padding
# --------------------------------------------------------------------------------------------
case("constant_pad", lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), T(2, 3, 4))
case("constant_pad_int", lambda x: F.pad(x, (2, 1), value=3), T(2, 3), dtypes=INT_BOOL)
case("constant_pad_negative", lambda x: F.pad(x, (-1, 2)), T(2, 5))
# The default decomposition table rewrites these pads into arange/index arithmetic; the
# portable kernels implement them whole, so they are preserved (the decomposed form is kept
# once as well).
case(
    "reflection_pad1d",
    lambda x: F.pad(x, (2, 1), mode="reflect"),
    T(2, 3, 5),
    preserve=("aten.reflection_pad1d.default",),
)
case(
    "reflection_pad2d",
    lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"),
    T(1, 2, 4, 5),
    preserve=("aten.reflection_pad2d.default",),
)
case(
    "reflection_pad3d",
    lambda x: F.pad(x, (1, 1, 1, 0, 0, 1), mode="reflect"),
    T(1, 2, 3, 3, 4),
    preserve=("aten.reflection_pad3d.default",),
)
case("reflection_pad2d_decomposed", lambda x: F.pad(x, (1, 1, 2, 0), mode="reflect"), T(1, 2, 3, 4))
case(
    "replication_pad1d",
    lambda x: F.pad(x, (2, 1), mode="replicate"),
    T(2, 3, 5),
    preserve=("aten.replication_pad1d.default",),
)
case(
    "replication_pad2d",
    lambda x: F.pad(x, (1, 2, 2, 1), mode="replicate"),
    T(1, 2, 4, 5),
    preserve=("aten.replication_pad2d.default",),
)
case(
    "replication_pad3d",
    lambda x: F.pad(x, (1, 1, 1, 0, 0, 1), mode="replicate"),
    T(1, 2, 3, 3, 4),
    preserve=("aten.replication_pad3d.default",),
)
case(
    "replication_pad2d_decomposed",
    lambda x: F.pad(x, (0, 2, 1, 1), mode="replicate"),
    T(1, 2, 3, 4),
)
case("circular_pad2d", lambda x: F.pad(x, (1, 1, 1, 0), mode="circular"), T(1, 2, 3, 4))

# --------------------------------------------------------------------------------------------
# Linear algebra
# --------------------------------------------------------------------------------------------
mcase("linear", lambda: nn.Linear(6, 4), T(3, 6))
mcase("linear_nobias", lambda: nn.Linear(6, 4, bias=False), T(2, 3, 6))
case("linear_fn", F.linear, T(3, 6), T(4, 6), T(4))
case("mm", torch.mm, T(3, 4), T(4, 5), dtypes=NUM)
case("bmm", torch.bmm, T(2, 3, 4), T(2, 4, 5), dtypes=NUM)
case("addmm", lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2.0), T(5), T(3, 4), T(4, 5))
case(
    "baddbmm",
    lambda b, x, y: torch.baddbmm(b, x, y, beta=0.5, alpha=1.5),
    T(2, 1, 5),
    T(2, 3, 4),
    T(2, 4, 5),
)
case("matmul", torch.matmul, T(2, 3, 4), T(4, 5))
case("matmul_vec", torch.matmul, T(3, 4), T(4))
case("einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b), T(2, 3, 4), T(2, 4, 2))
case("outer", torch.outer, T(3), T(4))
case("dot", torch.dot, T(5), T(5))
case("cdist", lambda a, b: torch.cdist(a, b), T(1, 4, 3), T(1, 5, 3), dtypes=(f32,))
case("pdist", lambda a: F.pdist(a), T(5, 3), dtypes=(f32,))

# --------------------------------------------------------------------------------------------
# Convolutions
# --------------------------------------------------------------------------------------------
mcase("conv1d", lambda: nn.Conv1d(3, 4, 3, padding=1), T(2, 3, 8))
mcase("conv1d_stride_dilation", lambda: nn.Conv1d(2, 4, 3, stride=2, dilation=2), T(1, 2, 11))
mcase("conv2d", lambda: nn.Conv2d(3, 4, 3), T(1, 3, 6, 6))
mcase(
    "conv2d_stride_pad",
    lambda: nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 2)),
    T(2, 2, 7, 5),
)
mcase("conv2d_groups", lambda: nn.Conv2d(4, 6, 3, groups=2, bias=False), T(1, 4, 5, 5))
mcase("conv2d_depthwise", lambda: nn.Conv2d(3, 3, 3, groups=3, padding=1), T(1, 3, 5, 5))
mcase("conv3d", lambda: nn.Conv3d(2, 3, 2), T(1, 2, 4, 4, 4))
mcase("conv_transpose1d", lambda: nn.ConvTranspose1d(3, 2, 3, stride=2), T(1, 3, 5))
mcase(
    "conv_transpose2d",
    lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
    T(1, 3, 4, 4),
)
mcase("conv_transpose3d", lambda: nn.ConvTranspose3d(2, 2, 2, stride=2), T(1, 2, 2, 3, 2))
case("conv2d_fn", lambda x, w: F.conv2d(x, w, padding=1), T(1, 2, 4, 4), T(3, 2, 3, 3))

# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------
case("max_pool1d", lambda x: F.max_pool1d(x, 2), T(2, 3, 8))
case("max_pool2d", lambda x: F.max_pool2d(x, 3, stride=2, padding=1), T(1, 2, 7, 7))
case("max_pool2d_indices", lambda x: F.max_pool2d(x, 2, return_indices=True), Distinct(1, 2, 6, 6))
case("max_pool2d_ceil", lambda x: F.max_pool2d(x, 2, ceil_mode=True), T(1, 2, 5, 5))
case("max_pool2d_dilation", lambda x: F.max_pool2d(x, 2, dilation=2), T(1, 2, 6, 6))
case("max_pool3d", lambda x: F.max_pool3d(x, 2), T(1, 2, 4, 4, 4))
case("avg_pool1d", lambda x: F.avg_pool1d(x, 3, stride=2), T(2, 3, 9))
case("avg_pool2d", lambda x: F.avg_pool2d(x, 2), T(1, 2, 6, 6))
case(
    "avg_pool2d_pad",
    lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
    T(1, 2, 7, 7),
)
case("avg_pool2d_ceil", lambda x: F.avg_pool2d(x, 2, ceil_mode=True), T(1, 2, 5, 5))
case("avg_pool3d", lambda x: F.avg_pool3d(x, 2), T(1, 2, 4, 4, 4), dtypes=(f32,))
case("adaptive_avg_pool1d", lambda x: F.adaptive_avg_pool1d(x, 4), T(1, 3, 8))
case("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (2, 3)), T(1, 3, 4, 6))
case("adaptive_avg_pool2d_uneven", lambda x: F.adaptive_avg_pool2d(x, 3), T(1, 2, 5, 7))
case("adaptive_avg_pool3d", lambda x: F.adaptive_avg_pool3d(x, 2), T(1, 2, 4, 4, 4))


# --------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------
def _batchnorm2d() -> nn.Module:
    m = nn.BatchNorm2d(3)
    m.running_mean.uniform_(-0.5, 0.5)
    m.running_var.uniform_(0.5, 2.0)
    m.weight.data.uniform_(0.5, 1.5)
    m.bias.data.uniform_(-0.5, 0.5)
    return m


mcase("batch_norm", _batchnorm2d, T(2, 3, 4, 4))
mcase("batch_norm1d", lambda: nn.BatchNorm1d(4), T(3, 4, 5))
case(
    "batch_norm_train",
    lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
    T(4, 3, 2, 2),
    T(3),
    T(3),
)
mcase("layer_norm", lambda: nn.LayerNorm(6), T(2, 3, 6))
case("layer_norm_nowb", lambda x: F.layer_norm(x, (3, 4)), T(2, 3, 4))
mcase("group_norm", lambda: nn.GroupNorm(2, 4), T(2, 4, 3, 3))
mcase("instance_norm", lambda: nn.InstanceNorm2d(3, affine=True), T(2, 3, 4, 4))
case("rms_norm", lambda x, w: F.rms_norm(x, (6,), w), T(2, 3, 6), T(6))
case("normalize", lambda x: F.normalize(x, dim=-1), T(3, 5))
case("local_response_norm", lambda x: F.local_response_norm(x, 3), T(1, 4, 3, 3), dtypes=(f32,))

# --------------------------------------------------------------------------------------------
# Upsampling / resampling
# --------------------------------------------------------------------------------------------
case(
    "upsample_nearest2d",
    lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    T(1, 2, 3, 4),
    dtypes=FLOAT,
)
case(
    "upsample_nearest2d_size",
    lambda x: F.interpolate(x, size=(5, 7), mode="nearest"),
    T(1, 2, 3, 4),
)
case("upsample_nearest1d", lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), T(1, 2, 5))
case(
    "upsample_nearest3d",
    lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    T(1, 1, 2, 3, 2),
)
case(
    "upsample_bilinear2d",
    lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    T(1, 2, 3, 4),
)
case(
    "upsample_bilinear2d_align",
    lambda x: F.interpolate(x, size=(5, 6), mode="bilinear", align_corners=True),
    T(1, 2, 3, 4),
)
case(
    "upsample_bicubic2d", lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), T(1, 2, 3, 4)
)
case("upsample_linear1d", lambda x: F.interpolate(x, scale_factor=2, mode="linear"), T(1, 2, 5))
case(
    "upsample_trilinear3d",
    lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"),
    T(1, 1, 2, 3, 2),
)
case(
    "upsample_bilinear2d_aa",
    lambda x: F.interpolate(x, size=(3, 2), mode="bilinear", antialias=True),
    T(1, 2, 6, 5),
    dtypes=(f32,),
    preserve=("aten._upsample_bilinear2d_aa.default",),
)
case(
    "grid_sample",
    lambda x, g: F.grid_sample(x, g, align_corners=False),
    T(1, 2, 4, 5),
    Unit(1, 3, 3, 2),
)
case("fold", lambda x: F.fold(x, (4, 5), (2, 2)), T(1, 8, 12), preserve=("aten.col2im.default",))
case("fold_decomposed", lambda x: F.fold(x, (3, 4), (2, 2), stride=(1, 2)), T(1, 8, 4))
case("unfold_im2col", lambda x: F.unfold(x, (2, 2)), T(1, 2, 4, 4))

# --------------------------------------------------------------------------------------------
# Sorting and selection
# --------------------------------------------------------------------------------------------
case("sort", lambda x: tuple(torch.sort(x, dim=-1)), Distinct(3, 6), dtypes=NUM)
case("sort_descending", lambda x: tuple(torch.sort(x, dim=0, descending=True)), Distinct(4, 3))
case("argsort", lambda x: torch.argsort(x, dim=1), Distinct(3, 6), dtypes=NUM)
case("topk", lambda x: tuple(torch.topk(x, 3, dim=-1)), Distinct(3, 6), dtypes=NUM)
case("topk_smallest", lambda x: tuple(torch.topk(x, 2, dim=0, largest=False)), Distinct(5, 3))
case("nonzero", torch.nonzero, T(3, 4), dtypes=ALL)
case(
    "masked_select",
    torch.masked_select,
    T(3, 4),
    Mask(3, 4),
    preserve=("aten.masked_select.default",),
)

# --------------------------------------------------------------------------------------------
# Embedding and friends
# --------------------------------------------------------------------------------------------
mcase("embedding", lambda: nn.Embedding(10, 4), Idx(2, 3, high=10))
case("embedding_fn", F.embedding, Idx(5, high=6), T(6, 3), dtypes=NUM)
mcase(
    "embedding_bag", lambda: nn.EmbeddingBag(10, 3, mode="sum"), Idx(2, 4, high=10), dtypes=(f32,)
)
case("one_hot", lambda i: F.one_hot(i, 5), Idx(4, high=5), dtypes=(i64,))

# --------------------------------------------------------------------------------------------
# Dynamic shapes: exported with a dynamic dim (the program holds upper bounds and size
# arithmetic); run at a size below the bound.
# --------------------------------------------------------------------------------------------
case("dynamic_add", torch.add, T(3, 4), T(4), dynamic=((0, 0, 1, 8),), dtypes=(f32, i64))
case("dynamic_view", lambda x: x.view(-1, 2) * 2, T(3, 4), dynamic=((0, 0, 1, 8),), dtypes=(f32,))
case(
    "dynamic_sum",
    lambda x: x.sum(dim=0) / x.shape[0],
    T(3, 4),
    dynamic=((0, 0, 2, 8),),
    dtypes=(f32,),
)
case(
    "dynamic_cat",
    lambda a, b: torch.cat([a, b]),
    T(2, 3),
    T(3, 3),
    dynamic=((0, 0, 1, 6), (1, 0, 1, 6)),
    dtypes=(f32,),
)

# --------------------------------------------------------------------------------------------
# Left out, because ExecuTorch 1.5.1's exporter (to_edge, default decompositions) rejects them:
# the op is outside core ATen, has no decomposition into core ATen, and has no portable kernel
# that would justify preserving it:
#   torch.round(x, decimals=n) (aten.round.decimals), torch.exp2, torch.erfc, torch.hypot,
#   torch.copysign, torch.cumprod, torch.kthvalue, torch.addmv, F.adaptive_max_pool2d,
#   torch.sort(stable=True) (aten.sort.stable).
# Tensor.unfold is a view and cannot be preserved ("Cannot preserve operator aten.unfold.default
# because it is a view"); its functional twin unfold_copy is covered instead.
# dtypes left out because eager PyTorch itself has no CPU kernel for them (so there is no
# reference): avg_pool3d and antialiased bilinear upsampling in float16/bfloat16.
# --------------------------------------------------------------------------------------------

TABLE = case_table(CASES)

__all__ = ["CASES", "TABLE"]
