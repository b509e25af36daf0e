"""XNNPACK delegates inside compiled regions keep XNNPACK's kernels.

Under ``xnnpack="auto"`` with ExecuTorch installed, the interpreter runs an XNNPACK
delegate with ExecuTorch's XNNPACK backend; compiled, the delegate stays one opaque call
(``ptexec::external_call``) of the region's graph, and the portable instructions around
it are compiled. Checked against the interpreter (the same XNNPACK kernels: equal
outputs, bit for bit, on these fixtures) and, for the LLMs, ExecuTorch's own greedy
tokens. Default run: the ``graph`` backend, plus one small AOTInductor compile; the rest
with AOTInductor under ``-m slow``.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import ptexec
from compile_util import (
    XNNPACK,
    XNNPACK_DIR,
    _clone,
    assert_report_partitions,
    replay_xnnpack,
    session_cache_dir,
    skip_slow_unless_asked,
    xnnpack_pair,
)
from ptexec.compile import CompileOptions, external, native
from ptexec.compile.external import ExternalCall
from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable
from ptexec.delegates.xnnpack.node_types import approximated_float_nodes, quantized_products
from ptexec.delegates.xnnpack.schema import decode_payload
from ptexec.format import program as p

GRAPH = CompileOptions(backend="graph")
MIXED = ["transformer", "transformer_int8_dynamic_int4w_pc", "op_attention"]
DYNAMIC = ["dynconv_padmodes_int8_dynamic_pc"]
ALONE = ["cnn", "cnn_int8_static_pc"]

pytestmark = pytest.mark.skipif(
    executorch_unavailable() is not None, reason="needs ExecuTorch's XNNPACK backend"
)


@pytest.fixture(autouse=True)
def _setup(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_slow_unless_asked(request)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))


@pytest.fixture
def every_delegate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every XNNPACK delegate an opaque call, whatever its work (the fixtures' and tiny
    LLMs' matrices are below the rule's threshold)."""
    monkeypatch.setattr(external, "MIN_WEIGHT_BYTES", 0)


class _Seen:
    """The opaque calls made from now on: ``keys`` those run through Python, and its
    length counts those ExecuTorch's C++ runtime ran (:mod:`ptexec.compile.native`) too."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.native_start = native.runs()

    @property
    def native(self) -> int:
        return native.runs() - self.native_start

    def __len__(self) -> int:
        return len(self.keys) + self.native


def _counting(monkeypatch: pytest.MonkeyPatch) -> _Seen:
    seen = _Seen()
    run = ExternalCall.run

    def counted(self: ExternalCall, inputs: Any) -> list[torch.Tensor]:
        seen.keys.append(self.key)
        return run(self, inputs)

    monkeypatch.setattr(ExternalCall, "run", counted)
    return seen


NATIVE = native.unavailable() is None  # this machine builds and loads the native calls


def _native_count(report: Any) -> int:
    """How many of the report's calls run natively where the library can be used."""
    return len(report.xnnpack_calls) if NATIVE and native.enabled() else 0


def _replay_equal(name: str, plain: ptexec.Method, compiled: ptexec.Method) -> None:
    calls = torch.load(XNNPACK_DIR / f"{name}.io.pt", weights_only=True)["calls"]
    for k, call in enumerate(calls):
        want = plain.execute(_clone(call["inputs"]))
        got = compiled.execute(_clone(call["inputs"]))
        for j, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(a, b), f"{name} call {k} output {j}"


def _check_mixed(name: str, options: CompileOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, compiled = xnnpack_pair(name, options, xnnpack="auto")
    report = compiled.compile_report
    assert report is not None and report.fully_compiled, report
    assert_report_partitions(report)
    delegates = [
        i
        for i, ins in enumerate(compiled.state.chains[0].instructions)
        if type(ins).__name__ == "DelegateCall"
    ]
    assert list(report.xnnpack_calls) == delegates
    assert report.native_calls == _native_count(report), report.native_unavailable
    assert "XNNPACK call(s) with XNNPACK's kernels" in report.summary()
    seen = _counting(monkeypatch)
    if options.backend == "graph":  # the interpreter's kernels around XNNPACK's: equal
        _replay_equal(name, plain, compiled)
    else:  # AOTInductor fuses the float math around the calls: the fixture's tolerance
        replay_xnnpack(name, plain, compiled)
    assert len(seen) >= len(delegates)


@pytest.mark.usefixtures("every_delegate")
@pytest.mark.parametrize("name", MIXED + DYNAMIC)
def test_delegates_are_opaque_calls_in_the_traced_graph(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check_mixed(name, GRAPH, monkeypatch)


def _payloads_of(method: ptexec.Method) -> dict[int, Any]:
    """The decoded payload of each delegate call of ``method``'s first chain, by instruction."""
    pte, delegates = method.program.pte, method.state.plan.delegates
    return {
        i: decode_payload(pte.delegate_data(delegates[ins.delegate_index].processed), "t")
        for i, ins in enumerate(method.state.chains[0].instructions)
        if isinstance(ins, p.DelegateCall)
    }


def test_the_rule_keeps_convolutions_and_traces_small_matrices() -> None:
    """By default a payload with a convolution is an opaque call; one with a megabyte of
    weights or less and no convolution is traced (its torch code fuses), unless it
    multiplies int8 activations by quantized weights, or the method quantizes activations
    and it holds a float node XNNPACK approximates its own way."""
    _, conv = xnnpack_pair(DYNAMIC[0], GRAPH, xnnpack="auto")
    assert conv.compile_report is not None and conv.compile_report.xnnpack_calls
    _, small = xnnpack_pair("transformer", GRAPH, xnnpack="auto")
    report = small.compile_report
    assert report is not None and report.fully_compiled and report.xnnpack_calls == ()
    # quantized activations: the delegates with a softmax or a GELU, and those with an
    # integer matrix product (however small), keep XNNPACK's kernels; the others are traced
    _, quantized = xnnpack_pair("transformer_int8_dynamic_pc", GRAPH, xnnpack="auto")
    report = quantized.compile_report
    assert report is not None and report.fully_compiled
    payloads = _payloads_of(quantized)
    approximated = [i for i, q in payloads.items() if approximated_float_nodes(q)]
    products = [i for i, q in payloads.items() if quantized_products(q)]
    assert approximated and products
    assert all(
        external.traced_weight_bytes(payloads[i]) < external.MIN_WEIGHT_BYTES for i in products
    )
    assert list(report.xnnpack_calls) == sorted(set(approximated) | set(products))
    assert len(report.xnnpack_calls) < len(payloads)  # the rest traced
    # a method's only delegate stays traced: as a call nothing would be compiled around it
    _, alone = xnnpack_pair("qkv_int8_dynamic_pc", GRAPH, xnnpack="auto")
    report = alone.compile_report
    assert report is not None and report.fully_compiled and report.xnnpack_calls == ()
    (payload,) = _payloads_of(alone).values()
    assert quantized_products(payload)
    assert not external.worth_a_call(payload, exact=True, alone=True)
    assert external.worth_a_call(payload, exact=True)


@pytest.mark.parametrize("name", ALONE)
def test_a_delegate_alone_runs_interpreted_with_xnnpack(name: str) -> None:
    plain, compiled = xnnpack_pair(name, GRAPH, xnnpack="auto")
    report = compiled.compile_report
    assert report is not None and report.compiled_instructions == 0
    assert all("XNNPACK's kernels run it" in why for *_, why in report.fallbacks), report
    _replay_equal(name, plain, compiled)


def test_torch_runner_is_still_traced() -> None:
    """``xnnpack="torch"``: the payload's torch code is traced, no opaque call."""
    _, compiled = xnnpack_pair("transformer", GRAPH, xnnpack="torch")
    report = compiled.compile_report
    assert report is not None and report.fully_compiled and report.xnnpack_calls == ()


def test_opaque_call_without_a_loaded_method_fails_clearly() -> None:
    with pytest.raises(RuntimeError, match="no loaded method runs the delegate call"):
        torch.ops.ptexec.external_call("0" * 64, [torch.zeros(1)])


@pytest.mark.usefixtures("every_delegate")
def test_cache_hit_registers_the_calls_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second load takes the compiled graph from the cache; its opaque calls find the
    second method's runners (the first method is gone)."""
    name = "op_attention"
    path = XNNPACK_DIR / XNNPACK[name]["pte"]
    options = CompileOptions(min_instructions=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = ptexec.load(path).load_method("forward", compile=options)
    assert first.compile_report is not None and first.compile_report.xnnpack_calls
    del first
    plain, again = xnnpack_pair(name, options, xnnpack="auto")
    report = again.compile_report
    assert report is not None and report.cache_hit and report.xnnpack_calls
    seen = _counting(monkeypatch)
    _replay_equal(name, plain, again)
    assert seen


class _TwiceShared(torch.nn.Module):
    """One linear layer applied twice, a portable cumulative sum between (XNNPACK does not
    take it), both results returned: the first call's output is still read after the
    second call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.lin(x)
        return y, self.lin(torch.cumsum(torch.cumsum(y, -1), 0))


@pytest.mark.usefixtures("every_delegate")
@pytest.mark.parametrize("natively", [True, False], ids=["native", "python"])
def test_two_calls_of_the_same_delegate_keep_their_own_outputs(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, natively: bool
) -> None:
    """Two delegate calls whose one-delegate programs are the same bytes (here made so:
    every runner says the same digest) are two opaque calls, each with its own output
    memory: the second does not overwrite the first's output while the graph holds it."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from ptexec.delegates.xnnpack.executorch_runner import EtRunner

    torch.manual_seed(0)
    model = _TwiceShared().eval()
    x = torch.randn(2, 8)
    lowered = to_edge_transform_and_lower(
        torch.export.export(model, (x,)), partitioner=[XnnpackPartitioner()]
    ).to_executorch()
    path = tmp_path / "twice.pte"
    path.write_bytes(lowered.buffer)
    monkeypatch.setattr(EtRunner, "digest", lambda self: "same" * 16)
    if not natively:
        monkeypatch.setenv("PTEXEC_NATIVE_CALLS", "0")
    compiled = ptexec.load(path).load_method("forward", xnnpack="auto", compile=GRAPH)
    report = compiled.compile_report
    assert report is not None and report.fully_compiled and len(report.xnnpack_calls) == 2
    assert report.native_calls == _native_count(report)
    seen = _counting(monkeypatch)
    want = model(x)
    for _ in range(2):
        got = compiled.execute([x])
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert len(seen) == 4
    if report.native_calls:
        assert seen.native == 4 and not seen.keys
    else:
        assert len(set(seen.keys)) == 2


@pytest.mark.slow
@pytest.mark.usefixtures("every_delegate")
@pytest.mark.parametrize("name", MIXED + DYNAMIC)
def test_delegates_are_opaque_calls_compiled(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_mixed(name, CompileOptions(), monkeypatch)


# ---- LLMs: greedy tokens equal ExecuTorch's ---------------------------------------------


def _llm(variant: str, options: CompileOptions | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_support import executorch_greedy, program
    from ptexec.llm import TextDecoder

    pte = program(variant)
    prompt = [1, 17, 42, 99, 7, 300, 5]
    d = TextDecoder(ptexec.load(pte), compile=options or True)
    report = d.method.compile_report
    assert report is not None and report.fully_compiled, report
    assert report.xnnpack_calls
    seen = _counting(monkeypatch)
    logits = d.prefill(prompt, 0)
    got = [int(logits.argmax())]
    pos = len(prompt)
    while len(got) < 16:
        logits = d.step(got[-1], pos)
        pos += 1
        got.append(int(logits.argmax()))
    assert len(seen) >= 16 * len(report.xnnpack_calls)
    assert got == executorch_greedy(pte, prompt, 16, dynamic=True)


@pytest.mark.usefixtures("every_delegate")
@pytest.mark.parametrize("variant", ["xnnpack", "xnnpack_8da4w"])
def test_llm_traced_with_xnnpack_kernels(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _llm(variant, GRAPH, monkeypatch)


@pytest.mark.slow
@pytest.mark.usefixtures("every_delegate")
@pytest.mark.parametrize("variant", ["xnnpack", "xnnpack_8da4w"])
def test_llm_compiled_with_xnnpack_kernels(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _llm(variant, None, monkeypatch)
