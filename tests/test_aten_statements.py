"""The cheaper forms ATen statements take (a scalar as a 0-d tensor, a tensor method for an
in-place op, ``out.fill_`` for ``*_like``, one live result of a multi-output op copied
directly): each statement, run on a values table, gives what the operator itself gives,
bit for bit, on edge values. The op's own ``torch.ops`` overload is the reference."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from ptexec.dtypes import DTYPE_TO_CODE
from ptexec.format import program as p
from ptexec.kernels.aten import resolve_overload
from ptexec.kernels.registry import KernelContext, Statement, find_kernel


def _desc(x: Any) -> p.EValue:
    if isinstance(x, torch.Tensor):
        return p.Tensor(
            DTYPE_TO_CODE[x.dtype],
            0,
            tuple(x.shape),
            tuple(range(x.dim())),
            False,
            0,
            None,
            0,
            p.STATIC,
            None,
        )
    if x is None:
        return p.Null()
    if isinstance(x, bool):
        return p.Bool(x)
    if isinstance(x, int):
        return p.Int(x)
    return p.Double(x)


def _statement(name: str, args: list[Any], outs: int = 1) -> tuple[Statement, list[Any]]:
    """The statement for ``name`` called with ``args`` (every schema argument, its ``outs``
    outs last), then the return slot (the out again, or a list of the outs); and its
    values table."""
    table = list(args)
    values = [_desc(x) for x in table]
    n = len(table)
    ret = n - 1
    if outs > 1:
        ret = n
        table.append(None)
        values.append(p.TensorList(tuple(range(n - outs, n))))
    ctx = KernelContext(name, 0, (*range(n), ret), tuple(values), frozenset(), table)
    factory = find_kernel(name)
    assert factory is not None
    return factory(ctx), table


def _run(st: Statement, table: list[Any]) -> None:
    exec(st.code, {**st.env, "v": table})


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        return torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) and torch.equal(
            a.isnan(), b.isnan()
        )
    return torch.equal(a, b)


def _assert_written(st: Statement, table: list[Any], want: torch.Tensor, again: bool) -> None:
    """The out (the table's last slot) holds ``want`` after a run; with ``again``, once
    more after a second run into the out (of self's shape now: written in place)."""
    assert _same(table[-1], want)
    if again:
        table[-1].fill_(7.0)
        _run(st, table)
        assert _same(table[-1], want)


def _operands(dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        special = [0.0, -0.0, 5.0, -5.0, 7.5, float("inf"), -float("inf"), float("nan")]
        return torch.cat(
            [torch.randn(64, generator=torch.Generator().manual_seed(0)) * 9, torch.tensor(special)]
        ).to(dtype)
    info = torch.iinfo(dtype)
    gen = torch.Generator().manual_seed(0)
    return torch.randint(info.min, info.max, (64,), dtype=torch.int64, generator=gen).to(dtype)


SCALAR_OPS = ["remainder", "fmod", "floor_divide", "bitwise_and", "bitwise_or", "bitwise_xor"]
DTYPES = [
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
]


@pytest.mark.parametrize("op", SCALAR_OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_scalar_operand_as_a_tensor_computes_what_the_scalar_op_does(
    op: str, dtype: torch.dtype
) -> None:
    if op.startswith("bitwise") and dtype.is_floating_point:
        pytest.skip("bitwise ops take integers")
    overload = getattr(torch.ops.aten, op).Scalar_out
    scalars: list[Any] = [5, 3, 2, 7] if dtype == torch.uint8 else [5, -3, 1, 7]
    if dtype.is_floating_point:
        scalars += [2.5, -0.7, 1e-3, float("inf")]
    for s in scalars:
        x = _operands(dtype)
        st, table = _statement(f"aten::{op}.Scalar_out", [x, s, torch.empty_like(x)])
        assert any(isinstance(c, torch.Tensor) and c.dim() == 0 for c in st.env.values())
        _run(st, table)
        want = overload(x, s, out=torch.empty_like(x))
        assert _same(table[-1], want), f"{op} {dtype} {s}"


def test_a_scalar_out_of_the_dtypes_range_keeps_the_scalar_path() -> None:
    x = torch.tensor([1, -2, 100], dtype=torch.int8)
    for name, s in (("add", 300), ("remainder", 300), ("bitwise_and", -129)):
        args: list[Any] = (
            [x, s, 1, torch.empty_like(x)] if name == "add" else [x, s, torch.empty_like(x)]
        )
        st, table = _statement(f"aten::{name}.Scalar_out", args)  # loads (did not: overflow)
        _run(st, table)
        ref = getattr(torch.ops.aten, name).Scalar_out
        want = (
            ref(x, s, 1, out=torch.empty_like(x))
            if name == "add"
            else ref(x, s, out=torch.empty_like(x))
        )
        assert torch.equal(table[-1], want)


def _in_place_copy() -> tuple[Any, list[Any], torch.Tensor, torch.Tensor]:
    """``aten::copy_``'s statement of ``src`` into ``dst``, its table, dst and src."""
    dst, src = torch.zeros(2, 3), torch.arange(6.0).reshape(2, 3)
    table: list[Any] = [dst, src, False, None]
    values = (_desc(dst), _desc(src), p.Bool(False), _desc(dst))
    ctx = KernelContext("aten::copy_", 0, (0, 1, 2, 3), values, frozenset(), table)
    factory = find_kernel("aten::copy_")
    assert factory is not None
    return factory(ctx), table, dst, src


def test_an_in_place_copy_runs_as_the_tensor_method() -> None:
    st, table, dst, src = _in_place_copy()
    assert torch._C.TensorBase.copy_ in st.env.values()
    _run(st, table)
    assert table[3] is dst and torch.equal(dst, src)


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("aten::full_like.out", [2.5, 1]),
        ("aten::full_like.out", [7, None]),
        ("aten::full_like.out", [True, 0]),
        ("aten::zeros_like.out", [None]),
        ("aten::ones_like.out", [0]),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool], ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_a_like_op_fills_its_out(
    name: str, extra: list[Any], dtype: torch.dtype, out_dtype: torch.dtype
) -> None:
    x = torch.zeros(2, 3, dtype=dtype)
    out = torch.full((2, 3), 3, dtype=out_dtype)
    st, table = _statement(name, [x, *extra, out])
    assert ".fill_(" in st.code
    _run(st, table)
    overload = getattr(torch.ops.aten, name.split("::")[1].split(".")[0]).out
    fmt = {None: None, 0: torch.contiguous_format, 1: torch.preserve_format}[extra[-1]]
    want = overload(x, *extra[:-1], memory_format=fmt, out=torch.empty(2, 3, dtype=out_dtype))
    assert _same(out, want)


def test_a_channels_last_like_op_still_refuses_a_matrix() -> None:
    x = torch.zeros(2, 3)
    st, table = _statement("aten::ones_like.out", [x, 2, torch.empty(2, 3)])
    assert ".fill_(" not in st.code
    with pytest.raises(RuntimeError):
        _run(st, table)


def test_a_like_op_of_other_sizes_is_not_a_fill() -> None:
    x = torch.zeros(2, 3, dtype=torch.int32)
    out = torch.empty(3, 2)
    st, _ = _statement("aten::full_like.out", [x, 2.5, None, out])
    assert ".fill_(" not in st.code


def test_one_live_result_of_layer_norm_is_copied_straight() -> None:
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))
    w, b = torch.randn(4), torch.randn(4)
    outs = [torch.empty(2, 3, 4), torch.empty(2, 3, 1), torch.empty(2, 3, 1)]
    st, table = _statement("aten::native_layer_norm.out", [x, [4], w, b, 1e-5, *outs], outs=3)
    assert st.prune is not None
    pruned = st.prune(frozenset({6, 7}))
    assert "[0]" in pruned and "store" not in pruned.split("(")[0]
    exec(pruned, {**st.env, "v": table})
    want = torch.ops.aten.native_layer_norm.default(x, [4], w, b, 1e-5)[0]
    assert torch.equal(table[5], want)


# ---- slice_scatter.out and copy.out written straight into out ------------------------------


def _dynamic(table: list[Any], name: str) -> Statement:
    """The statement for ``name`` on ``table`` with every tensor described as of a bounded
    dynamic shape."""
    values = tuple(
        dataclasses.replace(d, shape_dynamism=p.DYNAMIC_BOUND) if isinstance(d, p.Tensor) else d
        for d in (_desc(a) for a in table)
    )
    n = len(table)
    ctx = KernelContext(name, 0, (*range(n), n - 1), values, frozenset(), table)
    factory = find_kernel(name)
    assert factory is not None
    return factory(ctx)


SLICES = [
    (2, 1, 10, 1),
    (3, 0, 1, 1),
    (3, -1, None, 1),
    (2, -20, 3, 1),  # start before the first element: clamped
    (2, 4, 99, 1),  # end past the last: clamped
    (-1, None, None, 3),
    (1, 1, -1, 2),
    (0, 1, 2, 1),
    (2, 5, 2, 1),  # end before start: an empty slice
    (3, 11, 40, 1),  # start at the end: an empty slice
]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize(("dim", "start", "end", "step"), SLICES)
def test_slice_scatter_writes_out_directly(
    dim: int, start: int | None, end: int | None, step: int, dynamic: bool
) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(11, 11, 11, 11, generator=gen).permute(3, 1, 0, 2)[:2, :4]  # strided
    picked = torch.ops.aten.slice.Tensor(x, dim, start, end, step)
    src = (torch.randn(*reversed(picked.shape), generator=gen) * 9).permute(
        *reversed(range(picked.dim()))
    )
    assert not x.is_contiguous() and (src.numel() < 2 or not src.is_contiguous())
    name = "aten::slice_scatter.out"
    table: list[Any] = [x, src, dim, start, end, step, torch.full(x.shape, 7.0)]
    if dynamic:
        st = _dynamic(table, name)
        table[-1] = torch.empty(0)
    else:
        st, table = _statement(name, table)
    made = (
        torch.slice_scatter,
        torch.ops.aten.slice_scatter.default,
        torch.ops.aten.slice_scatter.out,
    )
    assert not any(f in made for f in st.env.values())  # no temporary result
    _run(st, table)
    want = torch.ops.aten.slice_scatter.out(x, src, dim, start, end, step, out=torch.empty(0))
    _assert_written(st, table, want, again=dynamic)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_slice_scatter_keeps_torchs_errors(dynamic: bool) -> None:
    x = torch.randn(4, 6)
    name = "aten::slice_scatter.out"
    bad: list[list[Any]] = [
        [x, torch.randn(4, 2), 1, 0, 6, -1],  # a negative step
        [x, torch.randn(4, 2), 1, 0, 6, 0],  # a zero step
        [x, torch.randn(4, 3), 1, 0, 6, 1],  # src not the slice's size
        [x, torch.randn(4, 6), 2, 0, 6, 1],  # no such dim
    ]
    for args in bad:
        table = [*args, torch.empty(4, 6)]
        if dynamic:
            st = _dynamic(table, name)
        else:
            st, table = _statement(name, table)
        with pytest.raises((RuntimeError, IndexError)):
            _run(st, table)
    # a dynamic one resized to self's shape
    table = [x, torch.randn(4, 2), 1, 1, 5, 2, torch.empty(0)]
    st = _dynamic(table, name)
    _run(st, table)
    assert _same(table[-1], torch.slice_scatter(x, table[1], 1, 1, 5, 2))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize(
    ("src_shape", "src_dtype"),
    [((2, 3, 4), torch.float32), ((3, 1), torch.float32), ((4,), torch.float64), ((), torch.int32)],
)
def test_copy_out_copies_src_into_out(
    src_shape: tuple[int, ...], src_dtype: torch.dtype, dynamic: bool
) -> None:
    gen = torch.Generator().manual_seed(5)
    self_ = torch.randn(4, 3, 2, generator=gen).permute(2, 1, 0)  # (2, 3, 4), strided
    src = (torch.randn(src_shape, generator=gen) * 50).to(src_dtype)
    if src.dim() > 1:
        src = src.mT.contiguous().mT  # strided too
    name = "aten::copy.out"
    table: list[Any] = [self_, src, False, torch.full((2, 3, 4), 7.0)]
    if dynamic:
        st = _dynamic(table, name)
        table[-1] = torch.empty(0)
    else:
        st, table = _statement(name, table)
        assert st.code == "v[3].copy_(v[1])"
    _run(st, table)
    want = torch.ops.aten.copy.out(self_, src, False, out=torch.empty(0))
    _assert_written(st, table, want, again=dynamic)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_copy_out_keeps_torchs_error_for_a_src_that_does_not_broadcast(dynamic: bool) -> None:
    table: list[Any] = [torch.randn(2, 3), torch.randn(4), False, torch.empty(2, 3)]
    if dynamic:
        st = _dynamic(table, "aten::copy.out")
    else:
        st, table = _statement("aten::copy.out", table)
    with pytest.raises(RuntimeError):
        _run(st, table)


def test_copy_out_into_another_dtype_keeps_the_functional_path() -> None:
    self_ = torch.randn(2, 3, dtype=torch.float64) * 1e30
    src = torch.randn(2, 3, dtype=torch.float64) * 1e-30
    st, table = _statement("aten::copy.out", [self_, src, False, torch.empty(2, 3)])
    assert st.code != "v[3].copy_(v[1])"
    _run(st, table)
    assert _same(table[-1], torch.ops.aten.copy.default(self_, src).float())


@pytest.mark.parametrize("src_shape", [(2, 3, 4), (3, 1), (4,), ()])
def test_copy_out_views_src_broadcast_to_self(src_shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(6)
    self_ = torch.randn(2, 3, 4, generator=gen)
    src = torch.randn(src_shape, generator=gen)
    st, table = _statement("aten::copy.out", [self_, src, False, torch.empty(2, 3, 4)])
    assert st.alias is not None and st.alias.source == 1 and st.alias.reads == (1,)
    exec(st.alias.code, {**st.alias.env, "v": table})
    view = table[3]
    assert isinstance(view, torch.Tensor) and view.data_ptr() == src.data_ptr()
    assert _same(view, torch.ops.aten.copy.out(self_, src, False, out=torch.empty(0)))


def test_copy_out_has_no_view_across_dtypes_or_for_a_src_that_does_not_broadcast() -> None:
    cases: list[list[Any]] = [
        [torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64), False, torch.empty(2, 3)],
        [torch.randn(2, 3), torch.randn(4), False, torch.empty(2, 3)],
        [torch.randn(2, 3), torch.randn(3, 2, 3), False, torch.empty(2, 3)],  # out is smaller
    ]
    for args in cases:
        st, _ = _statement("aten::copy.out", args)
        assert st.alias is None
    table: list[Any] = [torch.randn(2, 3), torch.randn(3), False, torch.empty(2, 3)]
    st = _dynamic(table, "aten::copy.out")
    assert st.alias is None


def _planned(x: torch.Tensor) -> p.EValue:
    """``x``'s description as a static tensor in planned memory."""
    d = _desc(x)
    assert isinstance(d, p.Tensor)
    return dataclasses.replace(d, allocation_info=p.AllocationDetails(0, 0))


@pytest.mark.parametrize(("dim", "start", "end", "step"), SLICES)
def test_slice_scatter_into_planned_memory_writes_the_slice_made_at_load(
    dim: int, start: int | None, end: int | None, step: int
) -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 4, 11, 11, generator=gen)
    picked = torch.ops.aten.slice.Tensor(x, dim, start, end, step)
    src = torch.randn(picked.shape, generator=gen) * 9
    name = "aten::slice_scatter.out"
    out = torch.full(x.shape, 7.0)
    table: list[Any] = [x, src, dim, start, end, step, out]
    values = (*(_desc(a) for a in table[:-1]), _planned(out))
    ctx = KernelContext(name, 0, (*range(7), 6), values, frozenset(), table)
    factory = find_kernel(name)
    assert factory is not None
    st = factory(ctx)
    if picked.numel():
        assert any(t is out for t in st.env.values())  # the planned out, checked per call
    want = torch.ops.aten.slice_scatter.out(x, src, dim, start, end, step, out=torch.empty(0))
    _run(st, table)
    assert table[-1] is out and _same(out, want)
    # another tensor in the out's slot (a moved value, say) gets its own slice
    other = torch.full(x.shape, 5.0)
    table[-1] = other
    _run(st, table)
    assert _same(other, want)
    out.fill_(3.0)
    table[-1] = out
    _run(st, table)
    assert _same(out, want)


def _index_statement(
    x: torch.Tensor, dim: int, index: torch.Tensor, trailing: int
) -> tuple[Statement, list[Any]]:
    """``index.Tensor_out(x, [None] * dim + [index] + [None] * trailing)`` into a new out
    of the result's shape: its statement (every tensor on the CPU) and values table."""
    from ptexec.device import Device, DeviceType

    shape = (*x.shape[:dim], len(index), *x.shape[dim + 1 :])
    out = torch.full(shape, 7.0, dtype=x.dtype)
    # self, the list, out, the index, None
    table: list[Any] = [x, None, out, index, None]
    items = (4,) * dim + (3,) + (-1,) * trailing
    values = (_desc(x), p.OptionalTensorList(items), _desc(out), _desc(index), p.Null())
    cpu = Device(DeviceType.CPU)
    devices = [cpu, None, cpu, cpu, None]
    ctx = KernelContext(
        "aten::index.Tensor_out", 0, (0, 1, 2, 2), values, frozenset(), table, devices=devices
    )
    factory = find_kernel("aten::index.Tensor_out")
    assert factory is not None
    return factory(ctx), table


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
def test_index_with_one_1d_index_gathers_along_its_dim(dim: int, index_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(3, 5, 4, generator=gen).permute(2, 0, 1)  # (4, 3, 5), strided
    size = x.shape[dim]
    for picks in ([1, 0, 1, 2, 2, 1], [size - 1], [], [0, -1, -size, 2], list(range(size))):
        index = torch.tensor(picks, dtype=index_dtype)
        for trailing in (0, 2 - dim):
            st, table = _index_statement(x, dim, index, trailing)
            assert torch.ops.aten.index.Tensor_out not in st.env.values()
            assert st.sized  # the out's sizes: self's, with the index's length at dim
            _run(st, table)
            indices: list[Any] = [None] * dim + [index]
            want = torch.ops.aten.index.Tensor_out(x, indices, out=torch.empty(0))
            assert _same(table[2], want)


def test_index_with_an_index_out_of_range_keeps_torchs_error() -> None:
    x = torch.randn(2, 3, 4)
    for picks in ([0, 4], [-5]):
        st, table = _index_statement(x, 2, torch.tensor(picks), 0)
        with pytest.raises(IndexError):
            _run(st, table)
        with pytest.raises(IndexError):
            torch.ops.aten.index.Tensor_out(
                x, [None, None, torch.tensor(picks)], out=torch.empty(0)
            )


def test_an_in_place_copy_is_sized_and_an_in_place_view_op_not() -> None:
    """An in-place op writing only its ``self`` keeps (or sets from its arguments) its
    sizes: its statement is ``sized``; ops that change ``self``'s view (``unsqueeze_``)
    are not counted."""
    st, _, dst, _ = _in_place_copy()
    assert st.sized
    table: list[Any] = [dst, 0, None]
    values = (_desc(dst), p.Int(0), _desc(dst))
    ctx = KernelContext("aten::unsqueeze_", 0, (0, 1, 2), values, frozenset(), table)
    factory = find_kernel("aten::unsqueeze_")
    assert factory is not None
    assert not factory(ctx).sized


@pytest.mark.parametrize("name", ["aten::sum.IntList_out", "aten::mean.out", "aten::nansum.out"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_an_empty_dim_list_reduces_every_dim_as_none(name: str, keepdim: bool) -> None:
    """A reduction given no dims (an empty list) reduces every dim: the statement passes
    None, which torch parses faster, and writes what the op writes given the list."""
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0)) * 9
    x[1, 2] = float("nan")
    shape = (1, 1, 1) if keepdim else ()
    table: list[Any] = [x, None, keepdim, None, torch.empty(shape)]
    values = (_desc(x), p.IntList(()), p.Bool(keepdim), p.Null(), _desc(table[4]))
    ctx = KernelContext(name, 0, (0, 1, 2, 3, 4, 4), values, frozenset(), table)
    factory = find_kernel(name)
    assert factory is not None
    st = factory(ctx)
    assert "[]" not in st.code  # None, or left out where it is the default
    _run(st, table)
    want = resolve_overload(name)(x, [], keepdim, out=torch.empty(shape))
    assert _same(table[4], want)


@pytest.mark.parametrize("sizes", [(2, 3), (4, 2, 3), (2, -1)])
def test_an_expand_to_its_sources_sizes_is_the_source_itself(sizes: tuple[int, ...]) -> None:
    """``expand_copy`` to the sizes its static source has: the view form is the source
    itself and the copy a plain one; other sizes (more dims, -1) keep the expand."""
    src = torch.randn(2, 3, generator=torch.Generator().manual_seed(8))
    want = torch.ops.aten.expand_copy.default(src, list(sizes))
    n = len(sizes)
    table: list[Any] = [src, *sizes, None, False, torch.empty(want.shape)]
    values = (
        _desc(src),
        *(p.Int(s) for s in sizes),
        p.IntList(tuple(range(1, n + 1))),
        p.Bool(False),
        _desc(table[-1]),
    )
    out = n + 3
    ctx = KernelContext(
        "aten::expand_copy.out", 0, (0, n + 1, n + 2, out, out), values, frozenset(), table
    )
    factory = find_kernel("aten::expand_copy.out")
    assert factory is not None
    st = factory(ctx)
    assert st.alias is not None
    same = sizes == tuple(src.shape)
    assert (st.code == f"v[{out}].copy_(v[0])") is same
    assert (st.alias.code == f"v[{out}] = v[0]") is same
    _run(st, table)
    assert _same(table[out], want)
    exec(st.alias.code, {**st.alias.env, "v": table})
    assert _same(table[out], want)
