"""ptexec.runtime offers executorch.runtime's names; a script switches by one import."""

from __future__ import annotations

import pytest
import torch

from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec.runtime import Runtime, Verification


def test_same_script_both_runtimes() -> None:
    pte = fixture_paths("mlp")[0]
    call = fixture_calls("mlp")[0]
    program = Runtime.get().load_program(pte, verification=Verification.Minimal)
    assert program.method_names == {"forward"}
    method = program.load_method("forward")
    assert program.load_method("forward") is method  # cached, as in ExecuTorch
    assert (
        compare_outputs(list(method.execute(call["inputs"])), call["outputs"], *tolerance("mlp"))
        is None
    )
    meta = method.metadata
    assert meta.name() == "forward" and meta.num_inputs() == 1 and meta.num_outputs() == 1
    info = meta.input_tensor_meta(0)
    assert (
        info.sizes() == (2, 8)
        and info.dtype() == 6
        and info.is_memory_planned()
        and info.nbytes() == 64
    )
    assert info.device() == "cpu" and info.dim_order() == (0, 1)
    assert repr(info).startswith(
        "TensorInfo(sizes=[2, 8], dtype=Float, is_memory_planned=True, nbytes=64"
    )
    with pytest.raises(IndexError):
        meta.input_tensor_meta(1)
    with pytest.raises(KeyError):
        program.load_method("missing")


def test_matches_executorch_metadata() -> None:
    et = pytest.importorskip("executorch.runtime")
    pte = fixture_paths("scalar_io")[0]
    ours = Runtime.get().load_program(pte).metadata("forward")
    theirs = et.Runtime.get().load_program(pte).metadata("forward")
    assert ours.num_inputs() == theirs.num_inputs() and ours.num_outputs() == theirs.num_outputs()
    t0, e0 = ours.input_tensor_meta(0), theirs.input_tensor_meta(0)
    assert tuple(t0.sizes()) == tuple(e0.sizes()) and t0.dtype() == int(e0.dtype())
    assert t0.is_memory_planned() == e0.is_memory_planned() and t0.nbytes() == e0.nbytes()


def test_bytes_and_registries() -> None:
    rt = Runtime.get()
    program = rt.load_program(fixture_paths("mlp")[0].read_bytes())
    assert program.load_method("forward").execute([torch.randn(2, 8)])[0].shape == (2, 4)
    assert "executorch_prim::add.Scalar" in rt.operator_registry.operator_names
    assert isinstance(rt.backend_registry.registered_backend_names, list)
