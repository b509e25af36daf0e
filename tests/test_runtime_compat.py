"""ptexec.runtime offers executorch.runtime's names; a script switches by one import.

ExecuTorch's own runtime is the reference: the same files, the same calls, compared.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, load_manifest, tolerance
from ptexec.errors import (
    FileMissingError,
    InputError,
    MethodNotFoundError,
    PteFormatError,
    PtexecError,
    UnsupportedDeviceError,
)
from ptexec.kernels.registry import find_kernel, operator_names
from ptexec.runtime import Runtime, Verification


def _et():  # type: ignore[no-untyped-def]
    return pytest.importorskip("executorch.runtime").Runtime.get()


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
    assert repr(info) == "TensorInfo(sizes=[2, 8], dtype=Float, is_memory_planned=True, nbytes=64)"
    with pytest.raises(IndexError):
        meta.input_tensor_meta(1)
    with pytest.raises(KeyError):
        program.load_method("missing")


@pytest.mark.parametrize("name", ["mlp", "transformer", "stateful", "channels_last", "external"])
def test_str_is_executorchs(name: str) -> None:
    pte, ptd = fixture_paths(name)
    ours = Runtime.get().load_program(pte, data_path=ptd)
    theirs = _et().load_program(pte, data_path=ptd)
    for method in ours.method_names:
        a, b = ours.metadata(method), theirs.metadata(method)
        assert str(a) == str(b)
        for i in range(a.num_outputs()):
            assert repr(a.output_tensor_meta(i)) == repr(b.output_tensor_meta(i))
        assert a.num_attributes() == b.num_attributes()
        for i in range(a.num_attributes()):
            assert repr(a.attribute_tensor_meta(i)) == repr(b.attribute_tensor_meta(i))
        with pytest.raises(IndexError):
            a.attribute_tensor_meta(a.num_attributes())


def test_attributes_are_the_named_tensors() -> None:
    """ExecuTorch counts every tensor with a fully qualified name: external constants here
    (named mutable buffers in the wheel's own test, run in test_executorch_suite)."""
    pte, ptd = fixture_paths("external")
    meta = Runtime.get().load_program(pte, data_path=ptd).metadata("forward")
    assert meta.num_attributes() == 4
    assert meta.attribute_names() == ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    assert [meta.attribute_tensor_meta(i).sizes() for i in range(4)] == [
        (16, 8),
        (16,),
        (4, 16),
        (4,),
    ]
    plain = Runtime.get().load_program(fixture_paths("mlp")[0]).metadata("forward")
    assert plain.num_attributes() == 0


def test_a_device_is_shown_where_it_is_not_the_cpu() -> None:
    """ExecuTorch's text, with the device added for a tensor that is not on the CPU."""
    pte = fixture_paths("gpu_mlp")[0]
    ours = Runtime.get().load_program(pte).metadata("forward")
    theirs = _et().load_program(pte).metadata("forward")
    info = ours.input_tensor_meta(0)
    if info.device() == "cpu":
        pytest.skip("the fixture's input is not labelled cuda")
    et_text = repr(theirs.input_tensor_meta(0))
    assert repr(info) == et_text[:-1] + f", device={info.device()})"


def test_operator_names_each_once_as_programs_spell_them() -> None:
    names = Runtime.get().operator_registry.operator_names
    listed = operator_names()
    assert len(listed) == len(set(listed)) == len(names)
    assert "aten::add.out" in names and "aten::convolution.out" in names  # ATen by schema
    assert "aten::sym_numel" in names and "aten::sym_numel.default" not in names
    assert "executorch_prim::et_view.default" in names and "executorch_prim::et_view" not in names
    assert "quantized_decomposed::quantize_per_tensor.out" in names  # registered kernels
    # every operator of every fixture program is listed, and a sample of the list resolves
    for entry in load_manifest().values():
        for op in entry.get("operators", []):
            assert op in names, op
    for name in random.Random(0).sample(listed, 200):
        assert find_kernel(name) is not None, name


def test_operator_names_cover_executorchs() -> None:
    theirs = _et().operator_registry.operator_names
    assert len(theirs) > 100
    assert theirs <= Runtime.get().operator_registry.operator_names


def test_bytes_file_objects_and_registries() -> None:
    rt = Runtime.get()
    data = fixture_paths("mlp")[0].read_bytes()
    for source in (data, bytearray(data), io.BytesIO(data)):
        program = rt.load_program(source)
        assert program.load_method("forward").execute([torch.randn(2, 8)])[0].shape == (2, 4)
    with pytest.raises(TypeError):
        rt.load_program(12345)  # type: ignore[arg-type]
    assert rt.backend_registry.is_available("XnnpackBackend")
    assert not rt.backend_registry.is_available("NoSuchBackend")
    assert "XnnpackBackend" in rt.backend_registry.registered_backend_names


# ---- errors: a RuntimeError wherever ExecuTorch raises one, and still ptexec's type -------


def _call(runtime, pte, inputs, data_path=None):  # type: ignore[no-untyped-def]
    return runtime.load_program(pte, data_path=data_path).load_method("forward").execute(inputs)


def _cases():  # type: ignore[no-untyped-def]
    mlp = fixture_paths("mlp")[0]
    ext = fixture_paths("external")[0]
    x = torch.randn(2, 8)
    return {
        "wrong input count": (lambda rt: _call(rt, mlp, [x, x]), InputError),
        "wrong dtype": (lambda rt: _call(rt, mlp, [x.double()]), InputError),
        "wrong shape": (lambda rt: _call(rt, mlp, [torch.randn(3, 8)]), InputError),
        "junk bytes": (
            lambda rt: rt.load_program(b"junk" * 64).load_method("forward"),
            PteFormatError,
        ),
        "missing file": (lambda rt: rt.load_program("no_such_file.pte"), FileMissingError),
        # from bytes: ptexec finds a .ptd beside a program loaded from a path
        "missing .ptd": (
            lambda rt: _call(rt, ext.read_bytes(), [torch.randn(2, 8)]),
            PteFormatError,
        ),
        "meta-device input": (
            lambda rt: _call(rt, mlp, [torch.empty(2, 8, device="meta")]),
            UnsupportedDeviceError,
        ),
        "unknown method metadata": (
            lambda rt: rt.load_program(mlp).metadata("nope"),
            MethodNotFoundError,
        ),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_errors_are_runtime_errors_like_executorchs(case: str) -> None:
    fn, kind = _cases()[case]
    with pytest.raises(RuntimeError) as theirs:
        fn(_et())
    with pytest.raises(kind) as ours:
        fn(Runtime.get())
    assert isinstance(ours.value, RuntimeError) and isinstance(ours.value, PtexecError)
    assert type(theirs.value) is RuntimeError  # ExecuTorch's is the plain builtin
    assert str(ours.value)  # ptexec's own message, not ExecuTorch's error code


def test_the_python_bases_stay() -> None:
    """``except ValueError`` / ``KeyError`` / ``FileNotFoundError`` keep working."""
    for cls in (InputError, PteFormatError, UnsupportedDeviceError):
        assert issubclass(cls, ValueError) and issubclass(cls, RuntimeError)
    assert issubclass(MethodNotFoundError, KeyError) and issubclass(
        MethodNotFoundError, RuntimeError
    )
    with pytest.raises(FileNotFoundError) as e:
        Runtime.get().load_program("no_such_file.pte")
    assert e.value.errno == 2 and e.value.filename == "no_such_file.pte"
    with pytest.raises(ValueError):
        ptexec.load(b"junk" * 64)


def test_a_method_works_after_each_error() -> None:
    program = Runtime.get().load_program(fixture_paths("mlp")[0])
    method = program.load_method("forward")
    call = fixture_calls("mlp")[0]
    for bad in ([], [torch.randn(2, 8).double()], [torch.randn(5, 8)], ["text"]):
        with pytest.raises(RuntimeError):
            method.execute(bad)
        got = list(method.execute(call["inputs"]))
        assert compare_outputs(got, call["outputs"], *tolerance("mlp")) is None


def test_a_planned_external_tensor_missing_from_the_data_is_refused_on_every_load(
    tmp_path: Path,
) -> None:
    """Methods sharing their state, exported with external constants: the method that
    only reads the state names it as an external tensor the data file lacks. ExecuTorch's
    runtime refuses to load that method whichever was loaded first; so does ptexec."""
    import copy

    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    class Write(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", torch.zeros(4))
            self.register_buffer("scale", torch.full((4,), 2.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.state.add_(x)
            return self.state * self.scale

    class Read(Write):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.state * x

    example = (torch.ones(4),)
    programs = {
        "write": torch.export.export(Write(), example),
        "read": torch.export.export(copy.deepcopy(Read()), example),
    }
    config = ExecutorchBackendConfig(
        external_constants=True,
        emit_mutable_buffer_names=True,
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
    )
    exported = to_edge(programs).to_executorch(config)
    pte = tmp_path / "model.pte"
    pte.write_bytes(exported.buffer)
    exported.write_tensor_data_to_file(str(tmp_path))
    (ptd,) = tmp_path.glob("*.ptd")
    et_program = _et().load_program(pte, data_path=ptd)
    assert et_program.load_method("write") is not None
    with pytest.raises(RuntimeError):
        et_program.load_method("read")
    for order in (("read", "write"), ("write", "read")):
        prog = ptexec.load(pte, data_path=ptd)
        for name in order:
            if name == "read":
                with pytest.raises(PteFormatError, match="'state' is not in the data file"):
                    prog.load_method(name)
            else:
                got = prog.load_method(name)(torch.ones(4))[0]
                assert torch.equal(got, torch.full((4,), 2.0))
