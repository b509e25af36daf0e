"""OpenVINO delegates (``OpenvinoBackend``) run with the ``openvino`` runtime.

Programs are lowered when the tests run (tests/openvino_models.py) and their outputs
compared with the eager model's, within the precision OpenVINO's CPU plugin computes in
(bfloat16 on CPUs with AMX, float32 elsewhere). ExecuTorch's own runtime is no reference
here: the 1.5.1 wheel's OpenVINO backend supports OpenVINO 2025 only, and the exporter
needs the 2026 line (its quantizer's nncf). Needs the ``openvino`` extra and nncf (the
exporter's import); run with ``pytest -m openvino``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import ptexec
from ptexec.errors import BackendUnavailableError, InputError, PteFormatError

pytestmark = pytest.mark.openvino

ov = pytest.importorskip("openvino")
pytest.importorskip("nncf")
pytest.importorskip("executorch.backends.openvino.partitioner")

from openvino_models import Lowered, lower, models  # noqa: E402


@pytest.fixture(scope="module")
def lowered() -> Iterator[dict[str, Lowered]]:
    yield models()


def _tolerance() -> tuple[float, float]:
    precision = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    return (3e-2, 3e-2) if precision in ("bf16", "f16") else (1e-4, 1e-5)


def _close(got: Any, want: Any) -> None:
    rtol, atol = _tolerance()
    if want.dtype == torch.bool:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def _eager(low: Lowered, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = low.model(*inputs)
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("name", ["mlp", "cnn", "two_in_two_out", "split", "unplanned"])
def test_outputs_equal_the_eager_model(lowered: dict[str, Lowered], name: str) -> None:
    low = lowered[name]
    m = ptexec.load(low.pte).load_method()
    for seed in range(3):  # new values each call; the unplanned input is new memory each time
        g = torch.Generator().manual_seed(seed)
        inputs = tuple(
            torch.randint(0, 20, x.shape, generator=g)
            if x.dtype == torch.int64
            else torch.randn(x.shape, generator=g)
            for x in low.inputs
        )
        got = m.execute(list(inputs))
        want = _eager(low, inputs)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            _close(a, b)


def test_a_program_split_around_a_portable_kernel(lowered: dict[str, Lowered]) -> None:
    """expm1 left to the portable kernel: two OpenVINO delegates with ptexec's kernel
    between them, in one method."""
    from ptexec.format.pte import read_pte

    plan = read_pte(lowered["split"].pte).program.execution_plan[0]
    assert [d.id for d in plan.delegates] == ["OpenvinoBackend", "OpenvinoBackend"]
    assert [op.name for op in plan.operators] == ["aten::expm1"]


def test_dynamic_batch(lowered: dict[str, Lowered]) -> None:
    low = lowered["dynamic"]
    m = ptexec.load(low.pte).load_method()
    for batch in (1, 3, 8, 2):
        x = torch.randn(batch, 8)
        (got,) = m.execute([x])
        _close(got, _eager(low, (x,))[0])
    with pytest.raises(InputError):
        m.execute([torch.randn(9, 8)])
    (got,) = m.execute([x])  # the method still works after the refusal
    _close(got, _eager(low, (x,))[0])


def test_outputs_in_place_and_views(lowered: dict[str, Lowered]) -> None:
    """Static outputs are written by OpenVINO into the method's memory: view outputs are
    that memory, and a caller's ``out=`` tensor receives the result."""
    low = lowered["mlp"]
    m = ptexec.load(low.pte).load_method(outputs="view")
    x = torch.randn(2, 8)
    (a,) = m.execute([x])
    _close(a, _eager(low, (x,))[0])
    x2 = torch.randn(2, 8)
    (b,) = m.execute([x2])
    assert a.data_ptr() == b.data_ptr()
    _close(b, _eager(low, (x2,))[0])
    copy = ptexec.load(low.pte).load_method()
    y = torch.empty(2, 4)
    (c,) = copy.execute([x], out=[y])
    assert c is y
    _close(y, _eager(low, (x,))[0])


def test_a_device_this_machine_lacks_is_refused_at_load(
    lowered: dict[str, Lowered], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter refuses a device it cannot compile for; a program made elsewhere (here,
    the MLP's with its compile spec naming an NPU) is refused at load, naming both."""
    from ptexec.delegates.openvino import runner
    from ptexec.format import program as p

    real = runner.prepare

    def prepare(ctx: Any) -> Any:
        ctx.compile_specs = (p.CompileSpec("device", b"NPU"),)
        return real(ctx)

    monkeypatch.setattr(runner, "prepare", prepare)
    prog = ptexec.load(lowered["mlp"].pte)
    with pytest.raises(BackendUnavailableError, match="OpenVINO device NPU; this machine has CPU"):
        prog.load_method()
    monkeypatch.undo()
    assert len(prog.load_method().execute([torch.randn(2, 8)])) == 1


def _with_payload(monkeypatch: pytest.MonkeyPatch, payload: bytes) -> None:
    """Every OpenVINO delegate of the next load reads ``payload``."""
    from ptexec.delegates import openvino as backend
    from ptexec.delegates.openvino import runner

    real = runner.prepare

    def prepare(ctx: Any) -> Any:
        ctx.processed = memoryview(payload)
        return real(ctx)

    monkeypatch.setattr(runner, "prepare", prepare)
    assert backend.BACKEND_ID == "OpenvinoBackend"


def _payload(pte: bytes) -> bytes:
    from ptexec.format.pte import read_pte

    pte_file = read_pte(pte)
    delegate = pte_file.program.execution_plan[0].delegates[0]
    return bytes(pte_file.delegate_data(delegate.processed))


def test_a_damaged_payload_is_refused_and_the_next_load_works(
    lowered: dict[str, Lowered], monkeypatch: pytest.MonkeyPatch
) -> None:
    low = lowered["mlp"]
    payload = _payload(low.pte)
    for damaged in (payload[:200], payload[:64] + bytes(len(payload) - 64), b""):
        with monkeypatch.context() as patch:
            _with_payload(patch, damaged)
            with pytest.raises(BackendUnavailableError, match="cannot import the payload"):
                ptexec.load(low.pte).load_method()
    x = torch.randn(2, 8)
    (got,) = ptexec.load(low.pte).load_method().execute([x])
    _close(got, _eager(low, (x,))[0])


def test_a_payload_that_does_not_fit_the_call_is_a_format_error(
    lowered: dict[str, Lowered], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The imported model's inputs and outputs are checked against the program's tensors:
    the CNN's payload in the MLP's call names other shapes; the two-input model's, another
    count."""
    with monkeypatch.context() as patch:
        _with_payload(patch, _payload(lowered["cnn"].pte))
        with pytest.raises(PteFormatError, match=r"input 0 has 4 dims in the payload"):
            ptexec.load(lowered["mlp"].pte).load_method()
    with monkeypatch.context() as patch:
        _with_payload(patch, _payload(lowered["two_in_two_out"].pte))
        with pytest.raises(PteFormatError, match="2 inputs and 2 outputs; the call passes 2"):
            ptexec.load(lowered["mlp"].pte).load_method()


def test_the_thread_setting_reaches_openvino(
    lowered: dict[str, Lowered], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptexec.delegates.openvino import runner

    seen: list[Any] = []
    real = runner.OpenvinoCall.__init__

    def init(self: Any, ov_module: Any, compiled: Any, *args: Any) -> None:
        seen.append(compiled.get_property("INFERENCE_NUM_THREADS"))
        real(self, ov_module, compiled, *args)

    monkeypatch.setattr(runner.OpenvinoCall, "__init__", init)
    ptexec.set_num_threads(1)
    ptexec.load(lowered["mlp"].pte).load_method()
    assert seen == [1]


def test_inspect_names_the_backend_and_its_layers(
    lowered: dict[str, Lowered], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptexec.cli import main

    path = tmp_path / "cnn.pte"
    path.write_bytes(lowered["cnn"].pte)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "OpenvinoBackend" in out
    assert "Convolution" in out
    assert main(["run", str(path), "--repeat", "2"]) == 0


@pytest.mark.slow  # a few minutes on 2 cores: run with -m openvino
@pytest.mark.parametrize(
    ("net", "shape"),
    [
        ("MobileNetV2", (1, 3, 48, 48)),
        ("MobileNetV3Small", (1, 3, 48, 48)),
        ("DeiT", (1, 3, 32, 32)),
        ("TinyYOLO", (1, 3, 48, 48)),
    ],
)
def test_real_networks(net: str, shape: tuple[int, ...]) -> None:
    """The reduced real networks of the XNNPACK fixtures (scripts/make_xnnpack_fixtures.py),
    in float32, lowered to OpenVINO."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import make_xnnpack_fixtures as mk

    torch.manual_seed(0)
    model = getattr(mk, net)().eval()
    x = torch.randn(shape)
    low = lower(net, model, (x,))
    got = ptexec.load(low.pte).load_method().execute([x])
    want = _eager(low, (x,))
    for a, b in zip(got, want, strict=True):
        # bfloat16 through a whole network: compared against the output's scale
        scale = float(b.abs().max())
        rtol, _ = _tolerance()
        assert float((a - b).abs().max()) <= max(4 * rtol, 1e-4) * max(scale, 1.0), net
