"""Vulkan-delegated programs (``VulkanBackend``) run with ATen, against eager PyTorch.

Fixtures: tests/fixtures/vulkan (scripts/make_vulkan_fixtures.py), lowered by ExecuTorch's
``VulkanPartitioner``; ExecuTorch's runtime cannot run them (its wheel has no Vulkan
backend), so eager PyTorch is the reference. The payload checks edit a real payload's
decoded graph and hand it to the runner directly.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import ptexec
from ptexec.delegates import describe_payload
from ptexec.delegates.vulkan import schema as s
from ptexec.delegates.vulkan.runtime import ArgInfo, build_runner
from ptexec.errors import BackendUnavailableError, ExecutionError, PteFormatError

FIXTURES = Path(__file__).parent / "fixtures" / "vulkan"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def _calls(name: str) -> list[dict]:
    return torch.load(FIXTURES / f"{name}.io.pt", weights_only=True)["calls"]


def _close(got: torch.Tensor, want: torch.Tensor, tol: list[float]) -> None:
    torch.testing.assert_close(got, want, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_matches_eager(name: str) -> None:
    entry = MANIFEST[name]
    method = ptexec.load(FIXTURES / entry["pte"]).load_method("forward")
    for call in _calls(name):
        outs = method(*call["inputs"])
        assert len(outs) == len(call["eager"])
        for got, want in zip(outs, call["eager"], strict=True):
            _close(got, want, entry["tol_eager"])


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_payload_ops_match_executorchs_reading(name: str) -> None:
    """ptexec's decoder finds the ops ExecuTorch's own deserializer (flatc) found."""
    prog = ptexec.load(FIXTURES / MANIFEST[name]["pte"])
    found = [
        describe_payload(d.id, prog.pte.delegate_data(d.processed))
        for plan in prog.pte.program.execution_plan
        for d in plan.delegates
        if d.id == "VulkanBackend"
    ]
    assert found == MANIFEST[name]["delegates"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_matches_eager_on_cuda(name: str) -> None:
    entry = MANIFEST[name]
    method = ptexec.load(FIXTURES / entry["pte"]).load_method("forward", device_map="cuda")
    for call in _calls(name):
        outs = method(*[x.cuda() for x in call["inputs"]])
        for got, want in zip(outs, call["eager"], strict=True):
            assert got.device.type == "cuda"
            _close(got.cpu(), want, entry["tol_eager"])


def test_int8_weight_linear_follows_the_shader() -> None:
    """The int8-weight linear is the float input times the int8 weights, then the scales."""
    payload, named, args = _payload("mlp_int8_weight")
    assert any(op.name == "aten._weight_int8pack_mm.default" for op in payload.graph.chain)
    runner = build_runner(payload, named, args)
    x = _calls("mlp_int8_weight")[0]["inputs"][0]
    out = torch.empty(args[-1].sizes)
    runner(x, out)
    _close(out, _calls("mlp_int8_weight")[0]["eager"][0], [1e-4, 1e-5])


def test_inspect_names_vulkan_ops(capsys: pytest.CaptureFixture[str]) -> None:
    from ptexec.cli import main

    assert main(["inspect", str(FIXTURES / "cnn.pte")]) == 0
    out = capsys.readouterr().out
    assert "VulkanBackend" in out
    assert "aten.max_pool2d_with_indices.default" in out
    assert "run by ptexec's ATen runner" in out
    assert "runs all of it (7 node/op types)" in out


def _renamed(tmp_path: Path, old: bytes, new: bytes) -> Path:
    """cnn.pte with one string of the file (an op or backend name) replaced in place."""
    assert len(old) == len(new)
    data = (FIXTURES / "cnn.pte").read_bytes()
    assert data.count(old) == 1
    path = tmp_path / "renamed.pte"
    path.write_bytes(data.replace(old, new))
    return path


def test_inspect_names_what_does_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptexec.cli import main

    # an op of the Vulkan registry that ptexec refuses: inspect and load agree
    path = _renamed(tmp_path, b"aten.view_copy.default", b"et_vk.q8ta_add.default")
    assert main(["inspect", "--json", str(path)]) == 0
    entry = json.loads(capsys.readouterr().out)["methods"]["forward"]["delegates"][0]
    assert entry["not_run"] == ["et_vk.q8ta_add.default (int8-activation add)"]
    assert main(["inspect", str(path)]) == 0
    assert "does not run: et_vk.q8ta_add.default (int8-activation add)" in capsys.readouterr().out
    with pytest.raises(BackendUnavailableError, match="q8ta_add"):
        ptexec.load(path).load_method("forward")
    # a backend ptexec does not have
    path = _renamed(tmp_path, b"VulkanBackend", b"VulkanBackenX")
    assert main(["inspect", str(path)]) == 0
    assert "not run: ptexec has no backend of this id" in capsys.readouterr().out


def test_a_call_with_a_wrong_shape_is_refused() -> None:
    method = ptexec.load(FIXTURES / "mlp.pte").load_method("forward")
    with pytest.raises(ptexec.InputError):
        method(torch.randn(3, 8))


def test_a_call_with_an_input_the_serializer_left_out_is_refused(tmp_path: Path) -> None:
    """A circular-padded convolution lowers to a delegate whose call passes an
    uninitialized tensor no op reads; ExecuTorch's Vulkan serializer leaves it out of the
    graph's inputs, so the call has one argument more than the graph. Which argument is
    which input cannot be told (ExecuTorch's Vulkan runtime would take the first by
    position, the uninitialized one): refused at load, saying why."""
    pytest.importorskip("executorch.backends.vulkan.partitioner.vulkan_partitioner")
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model = torch.nn.Conv1d(3, 6, 3, padding=1, padding_mode="circular").eval()
    x = torch.randn(4, 3, 50)
    lowered = to_edge_transform_and_lower(
        torch.export.export(model, (x,)), partitioner=[VulkanPartitioner()]
    ).to_executorch()
    path = tmp_path / "circular.pte"
    path.write_bytes(lowered.buffer)
    program = ptexec.load(path)
    with pytest.raises(PteFormatError, match="leaves out a call input that no op reads"):
        program.load_method("forward")


class _Accumulates(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.acc.add_(x)
        return self.acc * 2


def test_a_call_without_the_update_of_a_buffer_kept_in_the_payload_is_refused() -> None:
    """A buffer updated in place is kept in the payload by ExecuTorch's Vulkan exporter,
    its update an output of the payload but not of the call: one argument fewer than the
    graph's inputs and outputs. Refused at load, naming that case (not the other)."""
    pytest.importorskip("executorch.backends.vulkan.partitioner.vulkan_partitioner")
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    lowered = to_edge_transform_and_lower(
        torch.export.export(_Accumulates(), (torch.ones(4),)), partitioner=[VulkanPartitioner()]
    ).to_executorch()
    with pytest.raises(PteFormatError, match="a buffer the program updates in place"):
        ptexec.load(lowered.buffer).load_method("forward")


def test_timed_ops_report_each_op() -> None:
    method = ptexec.load(FIXTURES / "mlp.pte").load_method("forward")
    x = _calls("mlp")[0]["inputs"][0]
    prof = method.profile([x])
    text = str(prof)
    assert "linear" in text or "addmm" in text or "Vulkan" in text


# -- payload validation ------------------------------------------------------------------


def _payload(name: str) -> tuple[s.VkPayload, dict, list[ArgInfo | None]]:
    prog = ptexec.load(FIXTURES / MANIFEST[name]["pte"])
    plan = prog.pte.program.execution_plan[0]
    (delegate,) = plan.delegates
    payload = s.decode_payload(prog.pte.delegate_data(delegate.processed), "payload")
    (call,) = [ins for ins in plan.chains[0].instructions if type(ins).__name__ == "DelegateCall"]
    from ptexec.delegates.vulkan.backend import arg_infos

    return payload, dict(prog.named_data), arg_infos(plan.values, call.args, "call")


def _with_graph(payload: s.VkPayload, **changes: object) -> s.VkPayload:
    return dataclasses.replace(payload, graph=dataclasses.replace(payload.graph, **changes))


def _with_value(payload: s.VkPayload, vid: int, value: s.VkValue) -> s.VkPayload:
    values = list(payload.graph.values)
    values[vid] = value
    return _with_graph(payload, values=tuple(values))


def _first_op_with_tensor_output(payload: s.VkPayload) -> s.VkOp:
    g = payload.graph
    return next(op for op in g.chain if g.values[op.args[-1]].kind == "tensor")


def test_the_unedited_payload_builds() -> None:
    payload, named, args = _payload("cnn")
    runner = build_runner(payload, named, args)
    assert sum(runner.op_counts.values()) == len(payload.graph.chain)


def test_an_unknown_op_is_unavailable_by_name() -> None:
    payload, named, args = _payload("mlp")
    op = payload.graph.chain[0]
    chain = (dataclasses.replace(op, name="et_vk.q8ta_linear.default"), *payload.graph.chain[1:])
    with pytest.raises(BackendUnavailableError, match="q8ta_linear"):
        build_runner(_with_graph(payload, chain=chain), named, args)


def test_a_value_id_out_of_range_is_refused() -> None:
    payload, named, args = _payload("mlp")
    op = payload.graph.chain[-1]
    bad = dataclasses.replace(op, args=(len(payload.graph.values) + 5, *op.args[1:]))
    chain = (*payload.graph.chain[:-1], bad)
    with pytest.raises(PteFormatError, match=r"chain\[\d+\]\.args\[0\]"):
        build_runner(_with_graph(payload, chain=chain), named, args)


def test_serialized_dims_that_contradict_the_graph_are_refused() -> None:
    payload, named, args = _payload("cnn")
    op = _first_op_with_tensor_output(payload)
    value = payload.graph.values[op.args[-1]]
    assert value.tensor is not None
    wrong = dataclasses.replace(value.tensor, dims=tuple(d + 1 for d in value.tensor.dims))
    bad = _with_value(payload, value.index, dataclasses.replace(value, tensor=wrong))
    with pytest.raises(PteFormatError, match="computes dims"):
        build_runner(bad, named, args)


def test_a_constant_longer_than_its_named_data_is_refused() -> None:
    payload, named, args = _payload("mlp")
    key = payload.graph.constants[0].named_key
    assert key is not None
    short = {**named, key: memoryview(bytes(named[key])[:4])}
    with pytest.raises(PteFormatError, match=r"constants\[0\]"):
        build_runner(payload, short, args)


def test_a_constant_whose_length_contradicts_its_tensor_is_refused() -> None:
    payload, named, args = _payload("mlp")
    entry = payload.graph.constants[0]
    constants = (dataclasses.replace(entry, length=entry.length + 4), *payload.graph.constants[1:])
    with pytest.raises(PteFormatError, match="bytes for"):
        build_runner(_with_graph(payload, constants=constants), named, args)


def test_a_value_read_before_it_is_written_is_refused() -> None:
    payload, named, args = _payload("mlp")
    chain = tuple(reversed(payload.graph.chain))
    with pytest.raises(PteFormatError, match="read before it is written"):
        build_runner(_with_graph(payload, chain=chain), named, args)


def test_an_argument_of_the_wrong_kind_is_refused() -> None:
    payload, named, args = _payload("cnn")
    conv = next(op for op in payload.graph.chain if op.name.startswith("aten.max_pool2d"))
    # the kernel size list replaced by the input tensor
    bad = dataclasses.replace(conv, args=(conv.args[0], conv.args[0], *conv.args[2:]))
    chain = tuple(bad if op is conv else op for op in payload.graph.chain)
    with pytest.raises(PteFormatError, match="takes List"):
        build_runner(_with_graph(payload, chain=chain), named, args)


def test_a_missing_argument_is_refused() -> None:
    payload, named, args = _payload("cnn")
    conv = next(op for op in payload.graph.chain if op.name.startswith("aten.max_pool2d"))
    bad = dataclasses.replace(conv, args=conv.args[1:])
    chain = tuple(bad if op is conv else op for op in payload.graph.chain)
    with pytest.raises(PteFormatError, match="the op takes 6"):
        build_runner(_with_graph(payload, chain=chain), named, args)


def test_inputs_that_contradict_the_call_are_refused() -> None:
    payload, named, args = _payload("mlp")
    assert args[0] is not None
    wider = [dataclasses.replace(args[0], sizes=(2, 9)), *args[1:]]
    with pytest.raises(PteFormatError, match=r"input_ids\[0\]"):
        build_runner(payload, named, wider)
    with pytest.raises(PteFormatError, match="arguments"):
        build_runner(payload, named, args[:1])


def test_header_offsets_outside_the_payload_are_refused() -> None:
    payload, _, _ = _payload("mlp")
    data = bytearray(payload.data)
    data[14:18] = (len(data) * 2).to_bytes(4, "little")
    with pytest.raises(PteFormatError, match="header"):
        s.decode_payload(bytes(data))
    data = bytearray(payload.data)
    data[36:40] = b"XN00"  # the flatbuffer's identifier
    with pytest.raises(PteFormatError, match="identifier"):
        s.decode_payload(bytes(data))


def test_an_output_that_grows_past_its_declaration_fails_the_call() -> None:
    payload, named, args = _payload("mlp")
    runner = build_runner(payload, named, args)
    x = _calls("mlp")[0]["inputs"][0]
    out = torch.empty(3, 4)
    with pytest.raises(RuntimeError, match="delegate argument 1"):
        runner(x, out)


def test_a_failing_call_is_an_execution_error() -> None:
    method = ptexec.load(FIXTURES / "mlp.pte").load_method("forward")
    x = _calls("mlp")[0]["inputs"][0]
    assert method(x)[0].shape == (2, 4)
    with pytest.raises((ExecutionError, ptexec.InputError)):
        method(x.to(torch.int64))


# -- the compiled tier -------------------------------------------------------------------


def _compiled(
    name: str,
    backend: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    device_map: str | None = None,
):
    from ptexec.compile import CompileOptions

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))
    options = CompileOptions(backend=backend) if backend else True
    prog = ptexec.load(FIXTURES / MANIFEST[name]["pte"])
    return prog.load_method("forward", compile=options, device_map=device_map)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_traced_by_the_compiled_tier(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The payload's torch code traced into the compiled tier's graph gives eager's values."""
    method = _compiled(name, "graph", tmp_path, monkeypatch)
    report = method.compile_report
    assert report is not None and report.fully_compiled, report
    for call in _calls(name):
        for got, want in zip(method(*call["inputs"]), call["eager"], strict=True):
            _close(got, want, MANIFEST[name]["tol_eager"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_traced_by_the_compiled_tier_on_cuda(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA, the payload's torch code traced into the compiled tier's graph runs on the
    GPU and gives eager's values."""
    method = _compiled(name, "graph", tmp_path, monkeypatch, device_map="cuda")
    report = method.compile_report
    assert report is not None and report.fully_compiled, report
    for call in _calls(name):
        outs = method(*[x.cuda() for x in call["inputs"]])
        for got, want in zip(outs, call["eager"], strict=True):
            assert got.device.type == "cuda"
            _close(got.cpu(), want, MANIFEST[name]["tol_eager"])


@pytest.mark.slow
def test_fixture_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    from compile_util import skip_slow_unless_asked

    skip_slow_unless_asked(request)
    method = _compiled("cnn", None, tmp_path, monkeypatch)
    report = method.compile_report
    assert report is not None and report.fully_compiled, report
    for call in _calls("cnn"):
        for got, want in zip(method(*call["inputs"]), call["eager"], strict=True):
            _close(got, want, MANIFEST["cnn"]["tol_eager"])


def test_a_half_convolution_with_a_fused_relu_runs(tmp_path: Path) -> None:
    """``force_fp16``: a convolution and relu fuse into ``conv_with_clamp`` whose upper
    bound is float32's largest value, past half's range: it is half's infinity, as
    Vulkan's half shaders read it (torch's clamp refused the bound)."""
    pytest.importorskip("executorch.backends.vulkan.partitioner.vulkan_partitioner")
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    lowered = to_edge_transform_and_lower(
        torch.export.export(model, (x,)), partitioner=[VulkanPartitioner({"force_fp16": True})]
    ).to_executorch()
    (y,) = ptexec.load(lowered.buffer).load_method("forward").execute([x])
    with torch.no_grad():
        want = model(x)
    assert y.min() >= 0 and (y.float() - want).abs().max() < 1e-2


# -- arguments the exporter rewrites ------------------------------------------------------


def _lowered(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    dynamic_shapes: tuple[dict[int, object], ...] | None = None,
) -> ptexec.Method:
    """``model`` lowered whole by ExecuTorch's ``VulkanPartitioner`` and loaded."""
    pytest.importorskip("executorch.backends.vulkan.partitioner.vulkan_partitioner")
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    exported = torch.export.export(model.eval(), inputs, dynamic_shapes=dynamic_shapes)
    lowered = to_edge_transform_and_lower(
        exported, partitioner=[VulkanPartitioner()]
    ).to_executorch()
    program = ptexec.load(lowered.buffer)
    assert any(
        d.id == "VulkanBackend"
        for plan in program.pte.program.execution_plan
        for d in plan.delegates
    )
    return program.load_method("forward")


class _FullLike(torch.nn.Module):
    def forward(self, idx: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.full_like(idx, 0.5, dtype=torch.float32) + y


def test_an_op_whose_dtype_the_exporter_drops_computes_in_the_outputs_type() -> None:
    """The exporter writes ``full_like``'s ``dtype`` as null: a float fill of an integer
    tensor is still 0.5 in the float output, as eager computes it (not 0, the fill in the
    integer tensor's type)."""
    torch.manual_seed(0)
    idx, y = torch.tensor([3, 0, 2, 2, 1]), torch.randn(5)
    (got,) = _lowered(_FullLike(), (idx, y))(idx, y)
    torch.testing.assert_close(got, y + 0.5)


class _SquareThenUnsqueeze(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.pow(x, 2.0).unsqueeze(2)


def test_an_int_argument_the_exporter_shares_with_an_equal_double_runs() -> None:
    """The exporter serializes one value per number, 2 and 2.0 alike: ``unsqueeze``'s dim 2
    names the double 2.0 of the ``pow`` before it, which ExecuTorch's Vulkan runtime reads
    as the int 2."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 7)
    (got,) = _lowered(_SquareThenUnsqueeze(), (x,))(x)
    torch.testing.assert_close(got, torch.pow(x, 2.0).unsqueeze(2))


class _SquareThenView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.pow(x, 2.0).view(x.shape[0], 2, 3)


def test_a_value_list_naming_a_double_is_refused_saying_why() -> None:
    """``view``'s sizes ``[n, 2, 3]`` are a value list whose 2 names the double 2.0 of the
    ``pow`` before it (the exporter keeps one value per number); a value list holds
    tensors, ints, symints and nulls only, and ExecuTorch's Vulkan runtime reads no double
    from one, so the load is refused, saying what was found and what is expected."""
    x = torch.randn(4, 6)
    dims = ({0: torch.export.Dim("n", min=2, max=8)},)
    with pytest.raises(PteFormatError) as info:
        _lowered(_SquareThenView(), (x,), dims)
    message = str(info.value)
    assert ".items[1]" in message and "the double 2.0" in message
    assert "tensors, ints, symints or nulls" in message and "2 and 2.0" in message


class _LargeFills(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(x, -1e9) + x, torch.full((3,), 1e6) * 1.0 + x


def test_a_half_fill_past_halfs_range_is_its_infinity() -> None:
    """``force_fp16``: a fill past half's range is half's infinity, eager's value in the
    payload's type, as Vulkan's half shaders write it (ATen refuses to fill half with it)."""
    pytest.importorskip("executorch.backends.vulkan.partitioner.vulkan_partitioner")
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    x = torch.randn(3)
    model = _LargeFills()
    lowered = to_edge_transform_and_lower(
        torch.export.export(model, (x,)), partitioner=[VulkanPartitioner({"force_fp16": True})]
    ).to_executorch()
    got = ptexec.load(lowered.buffer).load_method("forward")(x)
    for g, want in zip(got, model(x), strict=True):
        assert torch.equal(g, want.half().float())


class _ChannelsLastConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y, y + 1.0


def test_a_resized_output_keeps_the_programs_dim_order() -> None:
    """An output resized to the shape the graph computed keeps the dim order the program
    declares for it (channels last here), as eager's output and the portable kernels'
    resized outputs keep theirs."""
    torch.manual_seed(0)
    model = _ChannelsLastConv().eval().to(memory_format=torch.channels_last)
    x = torch.randn(1, 3, 6, 6).to(memory_format=torch.channels_last)
    rows = 2 * torch.export.Dim("rows", min=2, max=5)
    method = _lowered(model, (x,), dynamic_shapes=({2: rows},))
    for n in (10, 4):
        x = torch.randn(1, 3, n, 6).to(memory_format=torch.channels_last)
        with torch.no_grad():
            want = model(x)
        for got, w in zip(method(x), want, strict=True):
            torch.testing.assert_close(got, w)
            assert got.stride() == w.stride()
