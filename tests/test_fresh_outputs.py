"""Outputs the fast call hands over as the new tensor their last op makes (the op's
functional form, the same kernel) instead of writing planned memory and copying it out:
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
    fast = ptexec.load(FIX / f"{name}.pte").load_method("forward")
    general = ptexec.load(FIX / f"{name}.pte").load_method("forward", fast_path=False)
    if name != "transformer":  # (its output is a copy the dataflow pass keeps)
        assert _made_new(fast), name
    inputs = _inputs(name)
    kept: list[list[torch.Tensor]] = []
    for step in range(4):  # stateful: the state moves on alike
        xs = [x + step if x.dtype.is_floating_point else x for x in inputs]
        got, want = fast.execute(xs), general.execute(xs)
        for x, y in zip(got, want, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
            assert torch.equal(x, y), name
            assert _apart(x, _planned(fast))  # the caller's own memory
        kept.append([x.clone() for x in got])
        kept[-1].extend(got)
    for k in kept:  # a later call changed no tensor handed over before
        half = len(k) // 2
        for a, b in zip(k[:half], k[half:], strict=True):
            assert torch.equal(a, b)


class _ReadAfter(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.mm(x, x)
        return y, y * 2  # y is read after the op writing it


class _Viewed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 1
        return y, y.view(-1) * 2  # a view of the first output (made at load) is read after


class _Last(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(x) - 1
        return y.sum(0), torch.softmax(y, -1)


@pytest.mark.parametrize(
    ("module", "new"), [(_ReadAfter(), {1}), (_Viewed(), {1}), (_Last(), {0, 1})]
)
def test_only_outputs_nothing_else_reads_are_made_new(
    module: torch.nn.Module, new: set[int]
) -> None:
    x = torch.randn(4, 4)
    data = export_program(module, (x,))
    fast = ptexec.load(data).load_method("forward")
    general = ptexec.load(data).load_method("forward", fast_path=False)
    slots = [o.slot for o in fast.state.outputs]
    assert _made_new(fast) == {slots[i] for i in new}
    for step in range(3):
        xs = [torch.randn(4, 4, generator=torch.Generator().manual_seed(step))]
        got, want = fast.execute(xs), general.execute(xs)
        eager = module(*xs)
        for a, b, c in zip(got, want, eager, strict=True):
            assert torch.equal(a, b)
            torch.testing.assert_close(a, c)


def test_a_new_tensor_not_of_the_output_dtype_runs_the_out_statement() -> None:
    """The check after the functional form: another dtype than the output's (type
    promotion where the out variant casts) runs the out variant and copies, as before."""
    m = ptexec.load(FIX / "mlp.pte").load_method("forward")
    general = ptexec.load(FIX / "mlp.pte").load_method("forward", fast_path=False)
    (slot,) = _made_new(m)
    fn = m._fast  # the generated fast call
    assert fn is not None
    names = fn.__globals__
    names[f"_FT{slot}"] = torch.float64  # no new tensor is of it now
    (x,) = _inputs("mlp")
    for step in range(2):
        got = m.execute([x + step])[0]
        want = general.execute([x + step])[0]
        assert got.dtype == torch.float32 and torch.equal(got, want)
        assert _apart(got, _planned(m))
    assert torch.equal(m.state.values[slot], got)  # the out was written this time


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
