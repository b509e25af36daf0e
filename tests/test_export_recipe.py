"""The GPU-activation export recipe (ptexec.export) and the device-annotated fixtures.

CPU tests read the files, load them with ``device_map`` and compare with eager PyTorch;
tests marked ``cuda`` run the same files on a GPU without a ``device_map``.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, load_manifest, tolerance
from ptexec import CPU, Device, DeviceType

CUDA0 = Device(DeviceType.CUDA, 0)
MANIFEST = load_manifest()
RECIPE = [n for n in MANIFEST if n.startswith("gpu_") and n != "gpu_legacy"]
DEVICE_RUNNABLE = [n for n, e in MANIFEST.items() if "device" in e["tags"] and e.get("runs", True)]
ET_COPY = {"et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out"}

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


def _program(name: str) -> ptexec.Program:
    return ptexec.load(fixture_paths(name)[0])


def _replay(name: str, **options: Any) -> tuple[list[list[Any]], dict[str, ptexec.Method]]:
    prog = _program(name)
    methods: dict[str, ptexec.Method] = {}
    results = []
    for call in fixture_calls(name):
        m = methods.get(call["method"])
        if m is None:
            m = methods[call["method"]] = prog.load_method(call["method"], **options)
        results.append(m.execute(call["inputs"]))
    return results, methods


def _check_replay(name: str, results: list[list[Any]]) -> None:
    for i, (got, call) in enumerate(zip(results, fixture_calls(name), strict=True)):
        problem = compare_outputs(got, call["outputs"], *tolerance(name))
        assert problem is None, f"{name} call {i} ({call['method']}): {problem}"


def _raw_program(name: str) -> Any:
    """The program as ExecuTorch's own deserializer reads it (an independent reader)."""
    pytest.importorskip("executorch.exir")
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header

    data = fixture_paths(name)[0].read_bytes()
    eh = _get_extended_header(data)
    size = eh.program_size if eh is not None and eh.is_valid() else len(data)
    return _flatbuffer_to_program(data[:size])


# --------------------------------------------------------------------------------------
# The recipe's files, as ExecuTorch's own reader sees them


@pytest.mark.parametrize("name", RECIPE)
def test_recipe_file_plans_activations_on_cuda(name: str) -> None:
    """Every activation lies in a buffer listed on CUDA:0; inputs and outputs are unplanned
    and labelled CUDA:0; constants are labelled CUDA:0; no et_copy instruction."""
    prog = _raw_program(name)
    for plan in prog.execution_plan:
        ops = {f"{op.name}.{op.overload}" if op.overload else op.name for op in plan.operators}
        assert not ops & ET_COPY
        cuda_buffers = {
            e.buffer_idx
            for e in plan.non_const_buffer_device or []
            if int(e.device_type) == 1 and e.device_index == 0
        }
        assert cuda_buffers == set(range(1, len(plan.non_const_buffer_sizes)))
        io = set(plan.inputs) | set(plan.outputs)
        planned = 0
        for j, v in enumerate(plan.values):
            t = v.val
            if type(t).__name__ != "Tensor":
                continue
            info = t.extra_tensor_info
            assert info is not None and int(info.device_type) == 1 and info.device_index == 0, (
                f"{plan.name} value {j} is not labelled cuda:0"
            )
            if j in io:
                assert t.allocation_info is None, f"{plan.name} value {j} (input/output) is planned"
            elif t.allocation_info is not None:
                assert t.allocation_info.memory_id in cuda_buffers
                planned += 1
            else:
                assert t.data_buffer_idx > 0, f"{plan.name} value {j}: unplanned activation"
        assert planned > 0


@pytest.mark.parametrize("name", RECIPE)
def test_recipe_method_meta(name: str) -> None:
    prog = _program(name)
    for method in prog.method_names:
        meta = prog.method_meta(method)
        tensors = [i for i in meta.inputs + meta.outputs if isinstance(i, ptexec.TensorInfo)]
        assert tensors
        for info in tensors:
            assert info.device == CUDA0
            assert not info.is_memory_planned
        assert meta.buffers and all(b.device == CUDA0 for b in meta.buffers)
        assert all(b.device_source == "program" for b in meta.buffers)
        assert not set(meta.operators) & ET_COPY


@pytest.mark.parametrize("name", RECIPE)
def test_check_device_plan_accepts_recipe_files(name: str) -> None:
    from ptexec.export import check_device_plan

    assert check_device_plan(fixture_paths(name)[0].read_bytes(), "cuda:0") == []


def test_check_device_plan_reports_other_programs() -> None:
    from ptexec.export import check_device_plan

    plain = check_device_plan(fixture_paths("mlp")[0].read_bytes(), "cuda:0")
    assert any("labelled cpu, expected cuda:0" in p for p in plain)
    assert any("graph input/output, planned" in p for p in plain)
    copies = check_device_plan(fixture_paths("h2d_copy")[0].read_bytes(), "cuda:0")
    assert any("et_copy::_h2d_copy.out" in p for p in copies)
    assert any("planned in buffer 1, which is on cpu" in p for p in copies)
    legacy = check_device_plan(fixture_paths("gpu_legacy")[0].read_bytes(), "cuda:0")
    assert any("has no device entry" in p for p in legacy)


# --------------------------------------------------------------------------------------
# Loading and running on the CPU


@no_cuda
@pytest.mark.parametrize("name", [*RECIPE, "gpu_legacy", "h2d_copy"])
def test_without_device_map_cuda_is_unavailable(name: str) -> None:
    prog = _program(name)
    with pytest.raises(ptexec.DeviceUnavailableError) as info:
        prog.load_method(prog.method_names[0])
    text = str(info.value)
    assert "cuda:0" in text and "device_map" in text


@pytest.mark.parametrize("device_map", ["cpu", {"cuda:0": "cpu"}], ids=["cpu", "cuda0-to-cpu"])
@pytest.mark.parametrize("name", DEVICE_RUNNABLE)
def test_device_map_to_cpu_matches_eager(name: str, device_map: Any) -> None:
    results, methods = _replay(name, device_map=device_map)
    _check_replay(name, results)
    for m in methods.values():
        assert all(b.device == CPU for b in m.meta.buffers)
        assert all(b.device_source == "device_map" for b in m.meta.buffers)


@pytest.mark.parametrize("name", RECIPE)
def test_recipe_inputs_are_shared(name: str) -> None:
    """Unplanned inputs on the mapped device are used in place: nothing is copied."""
    prog = _program(name)
    methods: dict[str, ptexec.Method] = {}
    for call in fixture_calls(name):
        m = methods.get(call["method"]) or methods.setdefault(
            call["method"], prog.load_method(call["method"], device_map="cpu")
        )
        m.execute(call["inputs"])
        assert m.last_call.inputs == ["share"] * len(call["inputs"])
        assert m.last_call.copies == 0


def test_unplanned_input_is_written_in_place() -> None:
    """gpu_inplace mutates its input acc: the caller's own tensor receives acc + x, and
    output 0 (the mutated input) is that tensor's memory."""
    m = _program("gpu_inplace").load_method(device_map="cpu", outputs="view")
    x = torch.randn(4)
    acc = torch.randn(4)
    before = acc.clone()
    ptr = acc.data_ptr()
    new_acc, doubled = m(x, acc)
    assert m.last_call.inputs == ["share", "share"]
    assert acc.data_ptr() == ptr
    torch.testing.assert_close(acc, before + x)
    assert new_acc.data_ptr() == ptr
    torch.testing.assert_close(doubled, (before + x) * 2)


def test_dynamic_batch_follows_the_caller() -> None:
    m = _program("gpu_dynamic_mlp").load_method(device_map="cpu")
    (info,) = m.meta.inputs
    assert isinstance(info, ptexec.TensorInfo) and info.dynamism == "dynamic_bound"
    for call in fixture_calls("gpu_dynamic_mlp"):
        (y,) = m.execute(call["inputs"])
        assert y.shape == call["outputs"][0].shape
        assert m.last_call.inputs == ["share"]


def test_stateful_state_lives_in_the_device_buffer() -> None:
    prog = _program("gpu_stateful")
    assert [str(b.device) for b in prog.method_meta().buffers] == ["cuda:0"]
    results, _ = _replay("gpu_stateful", device_map="cpu")
    _check_replay("gpu_stateful", results)
    assert [int(r[2].reshape(-1)[0]) for r in results] == [1, 2, 3, 4]


def test_two_methods_each_have_a_device_buffer() -> None:
    prog = _program("gpu_two_methods")
    assert set(prog.method_names) == {"encode", "decode"}
    for name in prog.method_names:
        assert [b.device for b in prog.method_meta(name).buffers] == [CUDA0]


# --------------------------------------------------------------------------------------
# Legacy tagging, device copies, delegates


def test_legacy_buffer_takes_its_tensors_device() -> None:
    """No device entry, every tensor labelled cuda:0: the buffer is placed on cuda:0."""
    (buf,) = _program("gpu_legacy").method_meta().buffers
    assert buf.device == CUDA0 and buf.device_source == "tensors"


def test_legacy_buffer_with_mixed_labels_is_a_format_error() -> None:
    prog = _program("h2d_copy_legacy")
    with pytest.raises(ptexec.PteFormatError) as info:
        prog.load_method()
    assert "non_const_buffer_sizes[1]" in info.value.path
    assert "cpu, cuda:0" in str(info.value)
    with pytest.raises(ptexec.PteFormatError):
        prog.method_meta()
    (buf,) = prog.method_meta(device_map="cpu").buffers
    assert buf.device == CPU
    results, _ = _replay("h2d_copy_legacy", device_map="cpu")
    _check_replay("h2d_copy_legacy", results)


def test_h2d_copy_plan() -> None:
    meta = _program("h2d_copy").method_meta()
    assert [(b.device, b.device_source) for b in meta.buffers] == [
        (CPU, "program"),
        (CUDA0, "program"),
    ]
    assert set(meta.operators) >= ET_COPY
    assert all(i.device == CPU and i.is_memory_planned for i in meta.inputs)  # type: ignore[union-attr]
    assert all(o.device == CPU for o in meta.outputs)


def test_h2d_copy_kernels_count_bytes_on_the_cpu() -> None:
    m = _program("h2d_copy").load_method(device_map="cpu")
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    (y,) = m(a, b)
    torch.testing.assert_close(y, torch.relu(torch.sin(a * b + b)) - a)
    assert m.last_call.inputs == ["copy", "copy"]
    # two planned inputs copied in, two host-to-device copies, one device-to-host copy,
    # all host-to-host once cuda:0 is mapped to the CPU
    assert m.last_call.bytes_copied == {"h2h": 5 * a.nbytes, "h2d": 0, "d2h": 0, "d2d": 0}


def test_delegate_device_meta() -> None:
    prog = _program("delegate_device")
    meta = prog.method_meta()
    assert meta.delegates == ("BackendWithCompilerDemo",)
    assert set(meta.operators) >= ET_COPY
    assert [(b.device, b.device_source) for b in meta.buffers] == [
        (CPU, "program"),
        (CUDA0, "program"),
    ]
    assert all(i.device == CPU and i.is_memory_planned for i in meta.inputs)  # type: ignore[union-attr]
    assert all(o.device == CPU for o in meta.outputs)


def test_delegate_legacy_meta() -> None:
    meta = _program("delegate_legacy").method_meta()
    assert meta.delegates == ("BackendWithCompilerDemo",)
    assert not set(meta.operators) & ET_COPY
    (buf,) = meta.buffers
    assert buf.device == CUDA0 and buf.device_source == "tensors"
    for info in meta.inputs + meta.outputs:
        assert info.device == CUDA0 and info.is_memory_planned  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["delegate_device", "delegate_legacy"])
def test_delegate_backend_is_unavailable(name: str) -> None:
    assert MANIFEST[name]["runs"] is False
    prog = _program(name)
    with pytest.raises(ptexec.BackendUnavailableError) as info:
        prog.load_method(device_map="cpu")
    assert "BackendWithCompilerDemo" in str(info.value)


def test_manifest_device_entries() -> None:
    for name, entry in MANIFEST.items():
        if "device" in entry["tags"]:
            assert entry["devices"] == ["cuda:0"], name
            assert (fixture_paths(name)[0].parent / f"{name}.io.pt").exists()
    assert MANIFEST["h2d_copy"].get("runs", True)
    assert MANIFEST["h2d_copy_legacy"]["load_error"] == "PteFormatError"


# --------------------------------------------------------------------------------------
# The recipe API (needs ExecuTorch's exporter)


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.lin(x)) * 2.0


@pytest.fixture(scope="module")
def exporter() -> Any:
    pytest.importorskip("executorch.exir")
    import ptexec.export

    return ptexec.export


def test_to_pte_module_and_path(exporter: Any, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Tiny().eval()
    x = torch.randn(4, 5)
    target = tmp_path / "tiny.pte"
    data = exporter.to_pte(copy.deepcopy(model), (x,), path=target)
    assert target.read_bytes() == data
    prog = ptexec.load(target)
    meta = prog.method_meta("forward")
    assert meta.inputs[0].device == CUDA0 and not meta.inputs[0].is_memory_planned  # type: ignore[union-attr]
    (y,) = prog.load_method(device_map="cpu")(x)
    torch.testing.assert_close(y, model(x))


def test_to_pte_exported_program_and_bare_cuda(exporter: Any) -> None:
    model = _Tiny().eval()
    x = torch.randn(2, 5)
    data = exporter.to_pte(torch.export.export(model, (x,)), device="cuda")
    assert exporter.check_device_plan(data, "cuda:0") == []


def test_to_pte_other_device_index(exporter: Any) -> None:
    model = _Tiny().eval()
    x = torch.randn(2, 5)
    data = exporter.to_pte(model, (x,), device=torch.device("cuda", 1))
    prog = ptexec.load(data)
    assert [str(b.device) for b in prog.method_meta().buffers] == ["cuda:1"]
    if torch.cuda.device_count() < 2:
        with pytest.raises(ptexec.DeviceUnavailableError, match="cuda:1"):
            prog.load_method()
    (y,) = prog.load_method(device_map={"cuda:1": "cpu"})(x)
    torch.testing.assert_close(y, model(x))


def test_to_pte_cpu_device(exporter: Any) -> None:
    """device='cpu': a host program whose inputs and outputs are the caller's memory."""
    model = _Tiny().eval()
    x = torch.randn(2, 5)
    prog = ptexec.load(exporter.to_pte(model, (x,), device="cpu"))
    meta = prog.method_meta()
    assert all(b.device == CPU for b in meta.buffers)
    assert meta.inputs[0].device == CPU and not meta.inputs[0].is_memory_planned  # type: ignore[union-attr]
    m = prog.load_method()
    (y,) = m(x)
    torch.testing.assert_close(y, model(x))
    assert m.last_call.inputs == ["share"]


def test_to_pte_methods_from_a_dict(exporter: Any) -> None:
    a, b = _Tiny().eval(), nn.Sequential(nn.Linear(3, 2), nn.ReLU()).eval()
    xa, xb = torch.randn(2, 5), torch.randn(4, 3)
    data = exporter.to_pte({"first": a, "second": b}, {"first": (xa,), "second": (xb,)})
    prog = ptexec.load(data)
    assert set(prog.method_names) == {"first", "second"}
    torch.testing.assert_close(prog.load_method("first", device_map="cpu")(xa)[0], a(xa))
    torch.testing.assert_close(prog.load_method("second", device_map="cpu")(xb)[0], b(xb))


def test_to_pte_dynamic_shapes_and_transformer(exporter: Any) -> None:
    """A model with views, attention and a dynamic sequence length."""
    layer = nn.TransformerEncoderLayer(
        16, 2, dim_feedforward=32, dropout=0.0, batch_first=True
    ).eval()
    seq = torch.export.Dim("seq", min=2, max=12)
    data = exporter.to_pte(layer, (torch.randn(1, 6, 16),), dynamic_shapes=({1: seq},))
    m = ptexec.load(data).load_method(device_map="cpu")
    for t in (2, 7, 12):
        x = torch.randn(1, t, 16)
        (y,) = m(x)
        torch.testing.assert_close(y, layer(x), rtol=1e-4, atol=1e-4)
        assert m.last_call.inputs == ["share"]


def test_to_pte_refuses_what_it_cannot_do(exporter: Any) -> None:
    model = _Tiny().eval()
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match="mps"):
        exporter.to_pte(model, (x,), device="mps")
    with pytest.raises(ValueError, match="example_inputs"):
        exporter.to_pte(model)
    with pytest.raises(ValueError, match="dynamic_shapes"):
        exporter.to_pte(torch.export.export(model, (x,)), dynamic_shapes={"x": {}})
    with pytest.raises(ValueError, match="memory_planning_pass"):
        exporter.to_pte(model, (x,), backend_config={"memory_planning_pass": None})
    with pytest.raises(TypeError, match="ExportedProgram"):
        exporter.to_pte(object())

    class Branch(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))

    with pytest.raises(ValueError, match="control flow"):
        exporter.to_pte(Branch(), (x,))


def test_devices_a_pte_cannot_name_are_refused_before_exporting(exporter: Any) -> None:
    """Each is a ptexec error (UnsupportedDeviceError, a ValueError) raised before any
    export work, not a file that fails later or a device that was never meant."""
    for bad in ("mps", "cuda:x", "cuda:-1", "cpu:0", "cuda:\u00b2", "cuda:\u0663", "cuda:300",
                torch.device("meta"), None, 1.5, True, -1, 300, Device(DeviceType.CUDA, -2),
                Device(DeviceType.CUDA, 128), torch.device("cuda:128")):  # fmt: skip
        with pytest.raises(ptexec.UnsupportedDeviceError):
            exporter.planning_pass(bad)
        with pytest.raises(ptexec.UnsupportedDeviceError):
            exporter.check_device_plan(b"", bad)
        with pytest.raises(ptexec.UnsupportedDeviceError):
            exporter.to_pte(object(), device=bad)
    assert exporter.planning_pass("cuda:127").target_device == Device(DeviceType.CUDA, 127)
    with pytest.raises(ValueError, match="share_mutable_buffers"):
        exporter.planning_pass("cuda:0", share_mutable_buffers=True)
    assert exporter.planning_pass("cpu", share_mutable_buffers=True).target_device == CPU


def test_external_constants_are_written_beside_the_program(exporter: Any, tmp_path: Path) -> None:
    model = _Tiny().eval()
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match="give path"):
        exporter.to_pte(model, (x,), backend_config={"external_constants": True})
    target = tmp_path / "tiny.pte"
    exporter.to_pte(model, (x,), path=target, backend_config={"external_constants": True})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.ptd", "tiny.pte"]
    # a second program exported into the folder keeps its own weights, and the first its
    other = _Tiny().eval()
    exporter.to_pte(
        other, (x,), path=tmp_path / "other.pte", backend_config={"external_constants": True}
    )
    for path, module in ((target, model), (tmp_path / "other.pte", other)):
        (y,) = ptexec.load(path).load_method(device_map="cpu")(x)
        torch.testing.assert_close(y, module(x))


def test_check_device_plan_reports_an_activation_left_unplanned(exporter: Any) -> None:
    from executorch.exir._serialize._program import (
        deserialize_pte_binary,
        serialize_pte_binary,
    )

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    data = exporter.to_pte(model, (torch.randn(2, 4),))
    found = deserialize_pte_binary(data)  # a PTEFile: the program and its segments
    plan = found.program.execution_plan[0]
    io = set(plan.inputs) | set(plan.outputs)
    victim = next(
        j
        for j, v in enumerate(plan.values)
        if type(v.val).__name__ == "Tensor" and v.val.allocation_info is not None and j not in io
    )
    plan.values[victim].val.allocation_info = None
    edited = bytes(serialize_pte_binary(found))
    assert exporter.check_device_plan(edited) == [
        f"method 'forward' value {victim}: written by an instruction, but not planned"
    ]
    # unbound tensors (memory made per call) are not reported as unplanned
    unbound = fixture_paths("dynamic_unbound")[0].read_bytes()
    assert not any("not planned" in p for p in exporter.check_device_plan(unbound, "cpu"))


def test_a_host_program_may_have_control_flow(exporter: Any) -> None:
    class Branch(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))

    m = ptexec.load(exporter.to_pte(Branch(), (torch.randn(3),), device="cpu")).load_method()
    for x in (torch.ones(3), -torch.ones(3)):
        torch.testing.assert_close(m(x)[0], Branch()(x))


def test_planning_pass_in_a_users_config(exporter: Any) -> None:
    from executorch.exir import ExecutorchBackendConfig, to_edge

    model = _Tiny().eval()
    x = torch.randn(2, 5)
    config = ExecutorchBackendConfig(memory_planning_pass=exporter.planning_pass("cuda:0"))
    data = to_edge(torch.export.export(model, (x,))).to_executorch(config).buffer
    assert exporter.check_device_plan(data) == []


def test_import_does_not_pull_in_executorch() -> None:
    src = Path(__file__).resolve().parent.parent / "src"
    code = "import sys, ptexec.export; print('executorch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    assert out.stdout.strip() == "False"


def test_missing_exporter_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import ptexec.export

    for mod in [m for m in sys.modules if m == "executorch" or m.startswith("executorch.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "executorch", None)
    with pytest.raises(ImportError, match=r"pip install '\.\[export\]'"):
        ptexec.export.to_pte(_Tiny(), (torch.randn(1, 5),))


# --------------------------------------------------------------------------------------
# On a GPU


def _cuda(values: list[Any]) -> list[Any]:
    return [v.cuda() if isinstance(v, torch.Tensor) else v for v in values]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", DEVICE_RUNNABLE)
def test_cuda_replay_matches_eager(name: str) -> None:
    prog = _program(name)
    methods: dict[str, ptexec.Method] = {}
    results = []
    for call in fixture_calls(name):
        m = methods.get(call["method"]) or methods.setdefault(
            call["method"], prog.load_method(call["method"])
        )
        meta = m.meta
        inputs = [
            x.to(info.device.to_torch()) if isinstance(x, torch.Tensor) else x
            for x, info in zip(call["inputs"], meta.inputs, strict=True)
        ]
        out = m.execute(inputs)
        for y, info in zip(out, meta.outputs, strict=True):
            if isinstance(y, torch.Tensor):
                assert y.device == info.device.to_torch()
        if name in RECIPE or name == "gpu_legacy":
            assert m.last_call.inputs == ["share"] * len(inputs)
            assert m.last_call.copies == 0
            assert all(y.is_cuda for y in out if isinstance(y, torch.Tensor))
        results.append(out)
    _check_replay(name, results)


@pytest.mark.cuda
@needs_cuda
def test_cuda_input_is_shared() -> None:
    m = _program("gpu_inplace").load_method(outputs="view")
    x = torch.randn(4, device="cuda")
    acc = torch.randn(4, device="cuda")
    before = acc.clone()
    new_acc, doubled = m(x, acc)
    assert m.last_call.inputs == ["share", "share"]
    assert new_acc.data_ptr() == acc.data_ptr()
    torch.testing.assert_close(acc, before + x)
    assert doubled.device == torch.device("cuda", 0)
    assert m.last_call.copies == 0


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", ["gpu_mlp", "gpu_cnn", "gpu_dynamic_mlp"])
def test_cuda_memory_grows_at_load_not_per_call(name: str) -> None:
    prog = _program(name)
    call = fixture_calls(name)[0]
    inputs = _cuda(call["inputs"])
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    m = prog.load_method(outputs="view")
    torch.cuda.synchronize()
    loaded = torch.cuda.memory_allocated()
    meta = m.meta
    planned = meta.planned_bytes
    assert [b.device for b in meta.buffers] == [CUDA0]
    # what load allocated: the plan, the uploaded constants and the outputs' memory, each
    # one allocation (the caching allocator rounds to 512 bytes)
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in m.values()
        if isinstance(t, torch.Tensor) and t.is_cuda
    }
    held = sum(-(-n // 512) * 512 for n in storages.values())
    assert planned <= loaded - start <= held + (64 << 10)
    m(*inputs)  # the first call may set up library workspaces (cuBLAS, cuDNN)
    torch.cuda.synchronize()
    after_first = torch.cuda.memory_allocated()
    for _ in range(5):
        m(*inputs)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == after_first


@pytest.mark.cuda
@needs_cuda
def test_cuda_h2d_copy_counts_transfers() -> None:
    m = _program("h2d_copy").load_method()
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    (y,) = m(a, b)
    assert y.device == torch.device("cpu")
    torch.testing.assert_close(y, torch.relu(torch.sin(a * b + b)) - a)
    assert m.last_call.bytes_copied == {
        "h2h": 2 * a.nbytes,
        "h2d": 2 * a.nbytes,
        "d2h": a.nbytes,
        "d2d": 0,
    }


@pytest.mark.cuda
@needs_cuda
def test_cuda_delegate_backend_is_unavailable() -> None:
    with pytest.raises(ptexec.BackendUnavailableError, match="BackendWithCompilerDemo"):
        _program("delegate_device").load_method()


@pytest.mark.cuda
@needs_cuda
def test_cuda_fresh_export_runs(exporter: Any) -> None:
    model = _Tiny().eval()
    x = torch.randn(3, 5)
    m = ptexec.load(exporter.to_pte(model, (x,))).load_method()
    xc = x.cuda()
    (y,) = m(xc)
    assert y.device == torch.device("cuda", 0)
    assert m.last_call.inputs == ["share"]
    torch.testing.assert_close(y.cpu(), model(x), rtol=1e-4, atol=1e-4)


def test_inspect_says_where_a_legacy_buffer_lives(capsys: pytest.CaptureFixture[str]) -> None:
    from ptexec.cli import main

    assert main(["inspect", str(fixture_paths("gpu_legacy")[0])]) == 0
    assert "buffer 1: 640 bytes on cuda:0 (device from tensors)" in capsys.readouterr().out
