"""Float XNNPACK nodes that XNNPACK computes its own way stay XNNPACK's in compiled code
that quantizes activations.

XNNPACK approximates some float functions with its own kernels (a reciprocal square root
from a hardware estimate and a Newton step, an exponential or a sigmoid from a polynomial,
a softmax's sums in its own order): torch's result differs from theirs in the last bit for
some inputs. In a quantized LLM such a bit, before a per-token int8 quantization, can
become a whole quantization step, and greedy tokens then part from ExecuTorch's. So in a
method that quantizes activations, a delegate with such a node is an opaque call of
ExecuTorch's XNNPACK in the compiled tier (:func:`ptexec.compile.external.worth_a_call`),
however small, and its outputs equal ExecuTorch's runtime bit for bit, on the fixture's
calls and on random inputs around them. Float programs keep the traced code (a last bit
stays a last bit there). The slow test decodes four of SmolLM2-135M's layers (8da4w)
greedily, compiled, against ExecuTorch's runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from compile_util import XNNPACK, XNNPACK_DIR, _clone, session_cache_dir
from ptexec.compile import CompileOptions, external
from ptexec.delegates.xnnpack import schema as s
from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable
from ptexec.delegates.xnnpack.node_types import approximated_float_nodes, quantizes_activations

pytestmark = pytest.mark.skipif(
    executorch_unavailable() is not None, reason="needs ExecuTorch's XNNPACK backend"
)

# fixture: its payload's approximated node types
APPROXIMATED: dict[str, list[str]] = {
    "op_rsqrt": ["ReciprocalSquareRoot"],
    "op_sqrt": ["SquareRoot"],
    "op_exp": ["Exp"],
    "op_log": ["Log"],
    "op_sin": ["Sin"],
    "op_softmax": ["Softmax"],
    "op_activations": ["Sigmoid", "Tanh", "Gelu", "Hardswish"],
}
# quantized programs with a GELU between per-token quantized matrix products (traced, their
# outputs differed from ExecuTorch's)
QUANTIZED = ["mlp_int8_dynamic_pc", "dynamic_mlp_int8_dynamic_pc", "mlp_int8_dynamic_int4w_pc"]


@pytest.fixture(autouse=True)
def _cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))


def _payloads(path: Path) -> list[s.XnnPayload]:
    program = ptexec.load(path)
    pte = program.pte
    plan = pte.program.execution_plan[0]
    return [s.decode_payload(pte.delegate_data(d.processed), "test") for d in plan.delegates]


def _executorch(path: Path) -> Any:
    pytest.importorskip("executorch.runtime")
    from executorch.runtime import Runtime

    return Runtime.get().load_program(str(path)).load_method("forward")


def _inputs(name: str) -> list[list[Any]]:
    """The fixture's calls, then each call's inputs scaled elementwise by random factors in
    [0.5, 2] (signs kept: the same domain), 20 times."""
    calls = torch.load(XNNPACK_DIR / f"{name}.io.pt", weights_only=True)["calls"]
    gen = torch.Generator().manual_seed(0)
    out = [list(c["inputs"]) for c in calls]
    for k in range(20):
        base = out[k % len(calls)]
        out.append(
            [
                x * torch.empty(x.shape).uniform_(0.5, 2.0, generator=gen)
                if isinstance(x, torch.Tensor) and x.is_floating_point()
                else x
                for x in base
            ]
        )
    return out


@pytest.mark.parametrize("name", list(APPROXIMATED))
def test_approximated_float_nodes_make_a_call_where_activations_are_quantized(name: str) -> None:
    (payload,) = _payloads(XNNPACK_DIR / XNNPACK[name]["pte"])
    assert sorted(approximated_float_nodes(payload)) == sorted(APPROXIMATED[name])
    assert external.traced_weight_bytes(payload) < external.MIN_WEIGHT_BYTES  # small, yet
    assert external.worth_a_call(payload, exact=True)
    assert not external.worth_a_call(payload)


def test_which_payloads_quantize_activations() -> None:
    for name in ("mlp_int8_dynamic_pc", "mlp_int8_dynamic_int4w_pc", "qops_int8_static_pc"):
        payloads = _payloads(XNNPACK_DIR / XNNPACK[name]["pte"])
        assert any(quantizes_activations(q) for q in payloads), name
    for name in ("op_rsqrt", "op_activations", "mlp", "transformer"):  # float activations
        payloads = _payloads(XNNPACK_DIR / XNNPACK[name]["pte"])
        assert not any(quantizes_activations(q) for q in payloads), name


def test_exact_float_nodes_are_not_approximated() -> None:
    """Additions, products, clamps: correctly rounded in both, traced."""
    for name in ("op_add", "op_clamp"):
        for payload in _payloads(XNNPACK_DIR / XNNPACK[name]["pte"]):
            assert approximated_float_nodes(payload) == [], name
    (payload,) = _payloads(XNNPACK_DIR / XNNPACK["op_add"]["pte"])
    assert not external.worth_a_call(payload, exact=True)


@pytest.mark.parametrize("name", QUANTIZED)
def test_compiled_equals_executorch_bit_for_bit(name: str) -> None:
    path = XNNPACK_DIR / XNNPACK[name]["pte"]
    reference = _executorch(path)
    compiled = ptexec.load(path).load_method(
        "forward", compile=CompileOptions(backend="graph"), xnnpack="auto"
    )
    for k, inputs in enumerate(_inputs(name)):
        want = reference.execute(_clone(inputs))
        got = compiled.execute(_clone(inputs))
        for j, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(a, b), f"{name} input {k} output {j}"


@pytest.mark.slow
def test_compiled_greedy_tokens_of_an_8da4w_llm_are_executorchs() -> None:
    """Four layers of SmolLM2-135M's shape, 8da4w (its RMSNorm and SiLU delegates hold a
    reciprocal square root and a sigmoid): 32 greedy tokens after a 16-token prompt,
    compiled, are ExecuTorch's (they parted at the seventh before)."""
    pytest.importorskip("executorch.extension.llm.export")
    from llm_support import executorch_greedy, llm_programs

    pte = llm_programs.program_path("xnnpack_8da4w", llm_programs.MODELS["smollm2-4l"])
    prompt = [(11 * i + 5) % 500 + 3 for i in range(16)]
    want = executorch_greedy(pte, prompt, 32, dynamic=True)
    method = ptexec.load(pte).load_method("forward", compile=True)
    out = method.execute([torch.tensor([prompt]), torch.tensor([0])])[0]
    tokens = [int(out.reshape(-1, out.shape[-1])[-1].argmax())]
    for pos in range(len(prompt), len(prompt) + 31):
        out = method.execute([torch.tensor([[tokens[-1]]]), torch.tensor([pos])])[0]
        tokens.append(int(out.reshape(-1, out.shape[-1])[-1].argmax()))
    assert tokens == want[: len(tokens)]
