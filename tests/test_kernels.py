"""Kernel resolution: missing operators all reported at load; custom ops torch knows run."""

from __future__ import annotations

import pytest
import torch

import ptexec
from export_util import export_program
from fixture_data import fixture_paths
from ptexec.errors import OperatorMissingError


def test_every_missing_operator_is_reported_at_load() -> None:
    data = fixture_paths("mlp")[0].read_bytes()
    # rename two operators in place (same length): the program now needs ops nobody has
    data = data.replace(b"aten::relu", b"aten::relX").replace(b"aten::addmm", b"aten::addmX")
    prog = ptexec.load(data)
    with pytest.raises(OperatorMissingError) as err:
        prog.load_method("forward")
    assert set(err.value.operators) == {"aten::relX.out", "aten::addmX.out"}
    assert "method 'forward' needs 2 operator(s)" in str(err.value)


_lib = torch.library.Library("ptexec_test", "DEF")
_lib.define("scale(Tensor x, float k) -> Tensor")
_lib.define("scale.out(Tensor x, float k, *, Tensor(a!) out) -> Tensor(a!)")


@torch.library.impl(_lib, "scale", "CompositeExplicitAutograd")
def _scale(x: torch.Tensor, k: float) -> torch.Tensor:
    return x * k


@torch.library.impl(_lib, "scale.out", "CompositeExplicitAutograd")
def _scale_out(x: torch.Tensor, k: float, *, out: torch.Tensor) -> torch.Tensor:
    return torch.mul(x, k, out=out)


@torch.library.register_fake("ptexec_test::scale")
def _scale_fake(x: torch.Tensor, k: float) -> torch.Tensor:
    return torch.empty_like(x)


class UsesCustomOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.ptexec_test.scale(x + 1, 3.0)


def test_a_custom_op_registered_in_torch_runs() -> None:
    data = export_program(UsesCustomOp(), (torch.randn(4),))
    m = ptexec.load(data).load_method("forward")
    assert "ptexec_test::scale.out" in m.meta.operators
    x = torch.randn(4)
    torch.testing.assert_close(m(x)[0], (x + 1) * 3.0)


def test_execution_error_names_instruction_operator_and_source_line() -> None:
    pytest.importorskip("executorch")
    from executorch.exir import ExecutorchBackendConfig, to_edge

    class Lookup(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Embedding(10, 4)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.table(ids) * 2  # the lookup line

    ids = torch.tensor([1, 2, 3])
    ep = torch.export.export(Lookup(), (ids,))
    data = to_edge(ep).to_executorch(ExecutorchBackendConfig(emit_stacktrace=True)).buffer
    m = ptexec.load(bytes(data)).load_method("forward")
    with pytest.raises(ptexec.ExecutionError) as info:
        m(torch.tensor([1, 20, 3]))
    e = info.value
    assert e.instruction == 0 and e.operator == "aten::embedding.out"
    assert e.frame is not None and "the lookup line" in e.frame
    assert "the lookup line" in str(e)
    assert isinstance(e.__cause__, IndexError)
    torch.testing.assert_close(m(ids)[0], Lookup.forward(_same(m), ids))


def _same(m: ptexec.Method) -> torch.nn.Module:
    lookup = torch.nn.Module()
    table = next(v for v in m.values() if isinstance(v, torch.Tensor) and v.shape == (10, 4))
    lookup.table = torch.nn.Embedding.from_pretrained(table)  # type: ignore[assignment]
    return lookup
