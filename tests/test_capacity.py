"""A size computed from data (an ``item()``, a ``nonzero``) past the bound the program
planned for it: ExecuTorch refuses to resize the tensor past its capacity, and so must
ptexec, rather than write over the planned memory beside it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ptexec
from export_util import export_program
from ptexec.errors import ExecutionError


class _ItemSized(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        y = x * 3.0
        k = n.item()
        torch._check(k >= 1)
        torch._check(k <= 4)
        w = torch.ones(k, 8) * x.sum()  # planned at its bound, [4, 8]
        return y + w.sum(0)


class _Stateful(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(4))

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = n.item()
        torch._check(k >= 1)
        torch._check(k <= 4)
        w = torch.ones(k, 4) * x
        self.acc.add_(w.sum(0))
        return self.acc * 1.0


@pytest.fixture(scope="module")
def item_sized() -> bytes:
    return export_program(_ItemSized(), (torch.ones(8), torch.tensor(2)))


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_data_sized_tensor_past_its_bound_is_refused(item_sized: bytes, fast_path: bool) -> None:
    method = ptexec.load(item_sized).load_method("forward", fast_path=fast_path)
    x = torch.arange(8.0)
    for k in (1, 3, 4):  # within the bound: eager's values
        (got,) = method(x, torch.tensor(k))
        torch.testing.assert_close(got, x * 3.0 + k * x.sum())
    with pytest.raises(ExecutionError, match="capacity of 32 elements"):
        method(x, torch.tensor(5))  # 40 elements: ExecuTorch refuses the resize too
    (got,) = method(x, torch.tensor(2))  # the next good call is right
    torch.testing.assert_close(got, x * 3.0 + 2 * x.sum())


def test_the_refusal_is_executorchs(item_sized: bytes) -> None:
    rt = pytest.importorskip("executorch.runtime")
    et = rt.Runtime.get().load_program(item_sized).load_method("forward")
    with pytest.raises(RuntimeError):
        et.execute([torch.arange(8.0), torch.tensor(5)])


def test_the_state_is_not_updated_past_a_refused_size() -> None:
    method = ptexec.load(export_program(_Stateful(), (torch.ones(4), torch.tensor(2)))).load_method(
        "forward"
    )
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    method(x, torch.tensor(2))
    with pytest.raises(ExecutionError):
        method(x, torch.tensor(7))
    (acc,) = method(x, torch.tensor(4))
    # ExecuTorch stops at the refused resize: the state holds the two good calls only
    torch.testing.assert_close(acc, x * 6)


class _ItemSizedOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = n.item()
        torch._check(k >= 1)
        torch._check(k <= 4)
        return torch.ones(k, 8) * x.sum(), x * 3.0


def test_a_compiled_result_sized_from_data_past_its_bound_is_refused(tmp_path: Path) -> None:
    """A compiled region computes in memory of its own: a result past its bound is
    refused before it is stored into planned memory, or handed over."""
    from ptexec.compile import CompileOptions

    pte = tmp_path / "item.pte"
    pte.write_bytes(export_program(_ItemSizedOutput(), (torch.ones(8), torch.tensor(2))))
    method = ptexec.load(pte).load_method("forward", compile=CompileOptions(backend="graph"))
    assert method.compile_status == "compiled"
    x = torch.arange(8.0)
    for k in (1, 4):
        w, y = method(x, torch.tensor(k))
        torch.testing.assert_close(w, torch.full((k, 8), float(x.sum())))
        torch.testing.assert_close(y, x * 3.0)
    with pytest.raises(ExecutionError, match=r"capacity of 32 elements|exceeds the upper bound"):
        method(x, torch.tensor(5))
    w, y = method(x, torch.tensor(3))
    torch.testing.assert_close(w, torch.full((3, 8), float(x.sum())))
    torch.testing.assert_close(y, x * 3.0)


class _TwoSized(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        y = x * 3.0
        k, j = n.item(), m.item()
        torch._check(k >= 1)
        torch._check(k <= 4)
        torch._check(j >= 1)
        torch._check(j <= 8)
        a = torch.ones(k, j) * x.sum()  # planned at its bound, [4, 8]
        s = a.sum(0)  # planned at [8]: sized from a's sizes
        return y + s.sum()


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_tensor_sized_from_a_data_sized_one_past_its_bound_is_refused(fast_path: bool) -> None:
    # a [2, 16] is within its capacity of 32 elements, its sum over dim 0 (16 elements)
    # is not within its 8 (where ExecuTorch refuses): each planned apart, that sum was
    # written over y; a's dimension 1 is past its bound, refused as an input's would be
    program = export_program(
        _TwoSized(), (torch.ones(8), torch.tensor(2), torch.tensor(3)), naive_plan=True
    )
    method = ptexec.load(program).load_method("forward", fast_path=fast_path)
    x = torch.arange(8.0)
    (got,) = method(x, torch.tensor(4), torch.tensor(8))
    torch.testing.assert_close(got, x * 3.0 + 32 * x.sum())
    with pytest.raises(ExecutionError, match=r"sizes \[2, 16\] are past the bound \[4, 8\]"):
        method(x, torch.tensor(2), torch.tensor(16))
    rt = pytest.importorskip("executorch.runtime")
    et = rt.Runtime.get().load_program(program).load_method("forward")
    with pytest.raises(RuntimeError):
        et.execute([x, torch.tensor(2), torch.tensor(16)])
    (got,) = method(x, torch.tensor(2), torch.tensor(3))  # the next good call is right
    torch.testing.assert_close(got, x * 3.0 + 6 * x.sum())
