"""Outputs of dynamic shape the fast call hands over as the new tensor their last op
makes (the op's functional form, the same kernel) instead of writing planned memory and
copying it out:
where that is allowed, the results equal the general path's bit for bit, call after
call; where the output is read or viewed afterwards, it is still copied; where the new
tensor is not what the program declares, the out's own statement runs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from export_util import export_program
from ptexec.kernels import aten

FIX = Path(__file__).parent / "fixtures"


def _inputs(name: str) -> list[Any]:
    calls = torch.load(FIX / f"{name}.io.pt", weights_only=False)["calls"]
    return list(calls[0]["inputs"])


def _made_new(m: ptexec.Method) -> set[int]:
    """The slots of the outputs the fast call returns as new tensors."""
    return {int(s) for s in re.findall(r"^\s*_f(\d+) = ", m.source(), re.MULTILINE)}


def _planned(m: ptexec.Method) -> list[tuple[int, int]]:
    out = []
    for t in m.state.values:
        if isinstance(t, torch.Tensor) and t.numel():
            out.append((t.data_ptr(), t.data_ptr() + t.nbytes))
    return out


def _apart(x: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    lo, hi = x.data_ptr(), x.data_ptr() + x.nbytes
    return all(hi <= a or b <= lo for a, b in ranges)


@pytest.mark.parametrize("name", ["mlp", "dynamic_mlp", "stateful", "int_ops", "transformer"])
def test_new_outputs_equal_the_general_path(name: str) -> None:
    """Only outputs of dynamic shape are made new: a static output is in the method's
    memory after every call (what ``Method.values`` and training's gradients read)."""
    fast = ptexec.load(FIX / f"{name}.pte").load_method("forward")
    general = ptexec.load(FIX / f"{name}.pte").load_method("forward", fast_path=False)
    dynamic = {o.slot for o in fast.state.outputs if o.info.dynamism != "static"}
    assert _made_new(fast) == dynamic, name
    assert bool(dynamic) is (name == "dynamic_mlp")
    inputs = _inputs(name)
    kept: list[list[torch.Tensor]] = []
    for step in range(4):  # stateful: the state moves on alike
        xs = [x + step if x.dtype.is_floating_point else x for x in inputs]
        got, want = fast.execute(xs), general.execute(xs)
        for x, y, out in zip(got, want, fast.state.outputs, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
            assert torch.equal(x, y), name
            assert _apart(x, _planned(fast))  # the caller's own memory
            if out.info.dynamism == "static":
                assert torch.equal(fast.values()[out.slot], x)
                assert torch.equal(general.values()[out.slot], x)
        kept.append([x.clone() for x in got])
        kept[-1].extend(got)
    for k in kept:  # a later call changed no tensor handed over before
        half = len(k) // 2
        for a, b in zip(k[:half], k[half:], strict=True):
            assert torch.equal(a, b)


class _ReadAfter(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.sigmoid(x)
        return y, y * 2  # y is read after the op writing it


class _Viewed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 1
        return y, y.view(-1) * 2  # a view of the first output (made at load) is read after


class _Last(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(x) - 1
        return y.sum(1), torch.softmax(y, -1)


def _batched(module: torch.nn.Module, *shape: int) -> bytes:
    """``module`` exported for inputs of ``shape`` whose first dim is 2..8."""
    batch = torch.export.Dim("batch", min=2, max=8)
    return export_program(module, (torch.randn(4, *shape),), dynamic_shapes={"x": {0: batch}})


@pytest.mark.parametrize(
    ("module", "dynamic", "new"),
    [
        (_ReadAfter(), True, {1}),
        (_Viewed(), True, {1}),
        (_Last(), True, {0, 1}),
        (_Last(), False, set()),
    ],
)
def test_only_outputs_nothing_else_reads_are_made_new(
    module: torch.nn.Module, dynamic: bool, new: set[int]
) -> None:
    """A dynamic output is made new only where nothing reads its memory after; a static
    one never."""
    data = _batched(module, 4) if dynamic else export_program(module, (torch.randn(3, 4),))
    fast = ptexec.load(data).load_method("forward")
    general = ptexec.load(data).load_method("forward", fast_path=False)
    slots = [o.slot for o in fast.state.outputs]
    assert _made_new(fast) == {slots[i] for i in new}
    for step, n in enumerate([3, 8, 2, 8] if dynamic else [3, 3]):
        xs = [torch.randn(n, 4, generator=torch.Generator().manual_seed(step))]
        got, want = fast.execute(xs), general.execute(xs)
        eager = module(*xs)
        for a, b, c in zip(got, want, eager, strict=True):
            assert torch.equal(a, b)
            torch.testing.assert_close(a, c)


@pytest.mark.parametrize("name", ["dynamic_mlp"])
def test_a_new_tensor_not_of_the_output_dtype_runs_the_out_statement(name: str) -> None:
    """The check after the functional form: another dtype than the output's (type
    promotion where the out variant casts) runs the out variant and copies, as before."""
    m = ptexec.load(FIX / f"{name}.pte").load_method("forward")
    general = ptexec.load(FIX / f"{name}.pte").load_method("forward", fast_path=False)
    (slot,) = _made_new(m)
    fn = m._fast  # the generated fast call
    assert fn is not None
    fn.__globals__[f"_FT{slot}"] = torch.float64  # no new tensor is of it now
    (x,) = _inputs(name)
    for step in range(2):
        got = m.execute([x + step])[0]
        want = general.execute([x + step])[0]
        assert got.dtype == torch.float32 and torch.equal(got, want)
        assert _apart(got, _planned(m))
    assert torch.equal(m.values()[slot], got)  # the out was written this time


def test_statements_offer_the_functional_form_of_one_kernel_only() -> None:
    """``Statement.fresh`` is given for out variants whose functional form runs the same
    kernel (generated ones, structured matrix products, pointwise ops, reductions), and
    not for others."""
    same = aten._same_kernel_functional
    for name, overload in [
        ("addmm", "out"),
        ("mm", "out"),
        ("add", "out"),
        ("sum", "IntList_out"),
        ("convolution", "out"),  # generated
        ("cumsum", "out"),
    ]:
        op = getattr(getattr(torch.ops.aten, name), overload)
        functional = aten._functional_of(op) if torch.Tag.generated in op.tags else None
        assert same(op, functional) is not None, name
    for name, overload in [("linear", "out"), ("index", "Tensor_out"), ("floor_divide", "out")]:
        op = getattr(getattr(torch.ops.aten, name), overload)
        assert same(op, None) is None, name


@pytest.mark.parametrize(
    ("bias", "shape", "new"), [(True, (3, 8), False), (False, (3, 8), True), (True, (8,), True)]
)
def test_linear_is_made_new_where_both_forms_run_one_product(
    bias: bool, shape: tuple[int, ...], new: bool
) -> None:
    """``aten::linear`` kept whole (as LLM exports keep it): its functional form folds a
    bias into the product of a batched input, where the out variant adds it after (other
    bits), so only a matrix input or no bias is made new; results equal the out
    variant's bit for bit."""
    pytest.importorskip("executorch")
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    torch.manual_seed(0)
    module = torch.nn.Linear(8, 4, bias=bias)
    batch = torch.export.Dim("batch", min=2, max=8)
    ep = torch.export.export(
        module, (torch.randn(4, *shape),), dynamic_shapes={"input": {0: batch}}
    )
    config = EdgeCompileConfig(preserve_ops=[torch.ops.aten.linear.default])
    data = bytes(to_edge_transform_and_lower(ep, compile_config=config).to_executorch().buffer)
    fast = ptexec.load(data).load_method("forward")
    general = ptexec.load(data).load_method("forward", fast_path=False)
    assert "aten::linear.out" in fast.state.chains[0].names
    assert bool(_made_new(fast)) is new
    for step, n in enumerate([2, 7]):
        x = torch.randn(n, *shape, generator=torch.Generator().manual_seed(step))
        (a,), (b,) = fast.execute([x]), general.execute([x])
        assert torch.equal(a, b)
