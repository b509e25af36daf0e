"""Refused and failed calls, every way a method is called: nothing a refused call could
touch changes, and the next good call gives the reference's answer.

A refused call (:data:`ptexec.errors.CALL_REFUSALS`: a wrong input count, dtype, rank,
shape past its bound, device, layout, read-only memory for an input the program writes, a
non-tensor for a tensor) raises before anything is written. Before each one the test
takes every byte a call could reach: the method's values (planned memory, mutable state,
KV caches), the outputs of the previous good call that the caller still holds (copies, or
views of the method's memory with ``outputs="view"``) and the caller's input tensors; all
of them are the same afterwards. The bad input is the last one, so that a check made
input by input, after the earlier inputs were bound, would show. The good calls between
the refused ones replay the fixture's recorded sequence (eager PyTorch's outputs; for
XNNPACK programs, ExecuTorch's runtime's), so a refused call that changed any state fails
them.

A call that fails inside the program (an index out of range) stops at its instruction, as
ExecuTorch's runtime does: what earlier instructions wrote in place stays written in both
(README, "Same contract"), and the next good call gives what ExecuTorch's gives.

Paths: the fast call with torch tensors and with numpy arrays, the general path (an
explicit ``transfers="auto"``, the default policy given), ``Method.__call__``; XNNPACK
programs under both runners; :class:`ptexec.llm.TextLLMRunner`'s refused requests;
:mod:`ptexec.training`'s ``forward_backward``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptexec
from export_util import export_program
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance
from producers import CudaArray
from ptexec.errors import (
    CALL_REFUSALS,
    DeviceUnavailableError,
    ExecutionError,
    InputError,
    UnsupportedDeviceError,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PATHS = ("fast", "numpy", "general", "call")


# --------------------------------------------------------------------------------------
# what a call could touch


def _bytes(x: Any) -> Any:
    """The value of ``x`` to compare: a tensor's bytes, sizes and dtype; others as are."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            return ("meta", tuple(x.shape))
        # (a clone: numpy's view of a tensor's own memory would make it unable to grow)
        flat = x.detach().cpu().clone().reshape(-1).view(torch.uint8)
        return (tuple(x.shape), x.dtype, bytes(flat.numpy()))
    if isinstance(x, int | float | bool | str) or x is None:
        return x
    return id(x)


def snapshot(methods: list[ptexec.Method], *held: Any) -> list[Any]:
    """Every byte of the values of ``methods`` (those loaded of a program: they may share
    state) and of the tensors in ``held`` (sequences of the caller's inputs and outputs)."""
    out = [_bytes(v) for m in methods for v in m.values()]
    for group in held:
        out.extend(_bytes(v) for v in group)
    return out


# --------------------------------------------------------------------------------------
# the refusals, made from a good call's inputs


@dataclass
class Refusal:
    kind: str
    inputs: list[Any]
    error: type[Exception]


def _last_tensor(method: ptexec.Method, inputs: list[Any]) -> int | None:
    tensors = [i for i, s in enumerate(method.state.inputs) if s.kind == "tensor"]
    return tensors[-1] if tensors and isinstance(inputs[tensors[-1]], torch.Tensor) else None


def refusals(method: ptexec.Method, inputs: list[Any]) -> Iterator[Refusal]:
    """Each kind of refused call that applies to ``method``, made from its good ``inputs``
    (torch tensors) by changing the last tensor input (or the count)."""
    yield Refusal("count-more", [*inputs, torch.zeros(2)], InputError)
    if inputs:
        yield Refusal("count-fewer", inputs[:-1], InputError)
    scalars = [i for i, s in enumerate(method.state.inputs) if s.kind in ("int", "float", "bool")]
    if scalars:
        j = scalars[-1]
        for kind, bad in (
            ("scalar-text", "3"),
            ("scalar-2d", torch.ones(2, 2)),
            ("scalar-none", None),
        ):
            yield Refusal(kind, [*inputs[:j], bad, *inputs[j + 1 :]], InputError)
        if method.state.inputs[j].kind == "int":
            yield Refusal("scalar-float", [*inputs[:j], 2.5, *inputs[j + 1 :]], InputError)
            yield Refusal("scalar-past-int64", [*inputs[:j], 2**64, *inputs[j + 1 :]], InputError)
    i = _last_tensor(method, inputs)
    if i is None:
        return
    x: torch.Tensor = inputs[i]
    info = method.meta.inputs[i]
    spec = method.state.inputs[i]

    def with_(bad: Any) -> list[Any]:
        new = list(inputs)
        new[i] = bad
        return new

    other = torch.float64 if x.dtype.is_floating_point else torch.float32
    yield Refusal("dtype", with_(x.to(other)), InputError)
    yield Refusal("rank", with_(x.unsqueeze(0)), InputError)
    if info.sizes:
        past = list(info.sizes)
        past[-1] += 1  # one past the bound (a static size's bound is itself)
        yield Refusal("shape", with_(torch.zeros(past, dtype=x.dtype)), InputError)
    yield Refusal("device-meta", with_(x.to("meta")), UnsupportedDeviceError)
    if not torch.cuda.is_available():
        yield Refusal("device-cuda", with_(CudaArray(tuple(x.shape))), DeviceUnavailableError)
    if not info.is_memory_planned and x.dim() >= 2 and min(x.shape[-2:]) > 1:
        # the program shares an unplanned input's memory: another dim order is refused
        other_order = x.mT.contiguous().mT if x.is_contiguous() else x.contiguous()
        yield Refusal("layout", with_(other_order), InputError)
    if spec.written and not info.is_memory_planned:
        frozen = x.numpy().copy()
        frozen.flags.writeable = False
        yield Refusal("read-only", with_(frozen), InputError)
    yield Refusal("none", with_(None), InputError)
    yield Refusal("text", with_("a tensor"), InputError)
    yield Refusal("list", with_(x.tolist()), InputError)


def _as_numpy(inputs: list[Any]) -> list[Any]:
    """CPU tensors as numpy arrays (where numpy has their dtype)."""
    return [
        x.numpy()
        if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype != torch.bfloat16
        else x
        for x in inputs
    ]


def _caller(method: ptexec.Method, path: str) -> Callable[[list[Any]], list[Any]]:
    """How ``path`` calls the method with torch inputs (the numpy path converts them)."""
    if path == "fast":
        return lambda xs: method.execute(xs)
    if path == "numpy":
        return lambda xs: method.execute(_as_numpy(xs))
    if path == "general":
        # the default policy given explicitly: the envelope's general path
        return lambda xs: method.execute(xs, transfers="auto")
    return lambda xs: method(*xs)


def _fresh(inputs: list[Any]) -> list[Any]:
    """The caller's own copies of recorded inputs (a program may write an input)."""
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


# --------------------------------------------------------------------------------------
# interpreted programs, replaying their fixtures

INTERPRETED = [
    "mlp",
    "mlp_unplanned",
    "stateful",
    "stateful_unplanned",
    "mutable_init",
    "dynamic_mlp",
    "dynamic_mlp_unplanned",
    "int_ops",
    "scalar_io",
    "channels_last_unplanned",
    "llama_sdpa",
    "cond",
    "shared_state",
    "two_method_state",
    "dynamic_unbound",
    "external",
    "quant_static",
    "bf16_mlp",
]


def replay_with_refusals(
    method: Callable[[str], ptexec.Method],
    calls: list[dict[str, Any]],
    path: str,
    expected: Callable[[int, list[Any]], str | None],
) -> int:
    """Replay ``calls`` (``method(name)`` loads each method once), every refusal between
    two good calls; the number of refusals. ``expected(k, outputs)`` compares good call
    ``k``'s outputs with the reference."""
    loaded: dict[str, ptexec.Method] = {}

    def get(name: str) -> ptexec.Method:
        if name not in loaded:
            loaded[name] = method(name)
        return loaded[name]

    count = 0
    held: list[Any] = []
    for k, c in enumerate(calls):
        m = get(c.get("method", "forward"))
        call = _caller(m, path)
        given = _fresh(c["inputs"])
        for r in refusals(m, given):
            bad = _as_numpy(r.inputs) if path == "numpy" else r.inputs
            methods = list(loaded.values())
            before = snapshot(methods, held, given, bad)
            with pytest.raises(r.error) as info:
                call(r.inputs)
            assert isinstance(info.value, CALL_REFUSALS)
            assert snapshot(methods, held, given, bad) == before, (
                f"call {k}, refused {r.kind}: something it could reach changed"
            )
            count += 1
        held = call(given)
        problem = expected(k, held)
        assert problem is None, f"call {k} after the refusals: {problem}"
    return count


@pytest.mark.parametrize("outputs", ["copy", "view"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", INTERPRETED)
def test_refused_calls_change_nothing_interpreted(name: str, path: str, outputs: str) -> None:
    pte, ptd = fixture_paths(name)
    program = ptexec.load(pte, data_path=ptd)
    calls = fixture_calls(name)
    rtol, atol = tolerance(name)
    count = replay_with_refusals(
        lambda m: program.load_method(m, outputs=outputs),
        calls,
        path,
        lambda k, got: compare_outputs(got, calls[k]["outputs"], rtol, atol),
    )
    assert count >= 9 * sum(1 for c in calls if c["inputs"])


# --------------------------------------------------------------------------------------
# an input the program writes in place


class _Accumulates(torch.nn.Module):
    def forward(self, acc: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        acc.add_(x)
        return acc * 2.0


@pytest.fixture(scope="module")
def accumulates() -> bytes:
    return export_program(_Accumulates(), (torch.zeros(3, 4), torch.ones(3, 4)), unplanned=True)


@pytest.mark.parametrize("path", PATHS)
def test_refused_calls_leave_a_written_input_as_it_was(accumulates: bytes, path: str) -> None:
    """The program adds into its first input, shared with the caller: a refused call
    (the bad input either one) leaves that tensor as it was, and the good calls accumulate
    exactly as eager PyTorch does."""
    method = ptexec.load(accumulates).load_method("forward")
    assert method.state.inputs[0].written
    g = torch.Generator().manual_seed(0)
    acc, eager = torch.zeros(3, 4), torch.zeros(3, 4)
    call = _caller(method, path)
    for k in range(3):
        x = torch.randn(3, 4, generator=g)
        bad_first = [
            Refusal("dtype", [acc.double(), x], InputError),
            Refusal("layout", [acc.mT.contiguous().mT, x], InputError),
            Refusal("device-meta", [acc.to("meta"), x], UnsupportedDeviceError),
        ]
        for r in [*refusals(method, [acc, x]), *bad_first]:
            before = snapshot([method], [acc, x])
            with pytest.raises(r.error):
                call(r.inputs)
            assert snapshot([method], [acc, x]) == before, f"call {k}, refused {r.kind}"
        # (numpy: ``acc.numpy()`` shares acc's memory, so acc is written either way)
        got = call([acc, x])[-1]  # (the mutated input comes first, as ExecuTorch's)
        eager.add_(x)
        torch.testing.assert_close(acc, eager, rtol=0, atol=0)
        torch.testing.assert_close(got, eager * 2.0, rtol=0, atol=0)


# --------------------------------------------------------------------------------------
# XNNPACK programs, both runners


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("runner", ["executorch", "torch"])
@pytest.mark.parametrize("name", ["mlp", "dynamic_mlp", "cnn"])
def test_refused_calls_change_nothing_xnnpack(name: str, runner: str, path: str) -> None:
    import json

    if runner == "executorch":
        from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

        if executorch_unavailable():
            pytest.skip("ExecuTorch's XNNPACK backend is not installed")
    entry = json.loads((FIXTURES / "xnnpack" / "manifest.json").read_text())[name]
    rtol, atol = entry["tol_executorch"]
    calls = torch.load(FIXTURES / "xnnpack" / f"{name}.io.pt", weights_only=True)["calls"]
    method = ptexec.load(FIXTURES / "xnnpack" / entry["pte"]).load_method(
        "forward", xnnpack=runner, outputs="view"
    )
    count = replay_with_refusals(
        lambda m: method,
        calls,
        path,
        lambda k, got: compare_outputs(got, calls[k]["executorch"], rtol, atol),
    )
    assert count >= 9 * len(calls)


# --------------------------------------------------------------------------------------
# calls that fail inside the program


@pytest.mark.parametrize("outputs", ["copy", "view"])
@pytest.mark.parametrize("path", PATHS)
def test_an_index_out_of_range_leaves_the_next_call_right(path: str, outputs: str) -> None:
    """int_ops's embedding (instruction 0) given an id past its 10 rows: the call fails
    there; the caller's inputs and copies it holds are unchanged, and the recorded
    sequence goes on (eager's outputs)."""
    pte, _ = fixture_paths("int_ops")
    method = ptexec.load(pte).load_method("forward", outputs=outputs)
    calls = fixture_calls("int_ops")
    rtol, atol = tolerance("int_ops")
    call = _caller(method, path)
    held: list[Any] = []
    for k, c in enumerate(calls):
        given = _fresh(c["inputs"])
        if k:
            ids = given[0].clone()
            ids[-1, -1] = 10
            bad = [ids, *given[1:]]
            held_before = snapshot_of(held) if outputs == "copy" else None
            inputs_before = [_bytes(x) for x in [*given, *bad]]
            with pytest.raises(ExecutionError, match="IndexError"):
                call(bad)
            assert [_bytes(x) for x in [*given, *bad]] == inputs_before
            if held_before is not None:
                assert snapshot_of(held) == held_before
        held = call(given)
        assert compare_outputs(held, c["outputs"], rtol, atol) is None, f"call {k}"


def snapshot_of(values: list[Any]) -> list[Any]:
    return [_bytes(v) for v in values]


class _CacheThenLookup(torch.nn.Module):
    """Writes a KV-cache row in place (``llama::update_cache``, instruction 1), then looks
    rows of a table up (``index_select``, instruction 2): an index out of range fails
    after the cache was written."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 8, 1, 4))
        self.table = torch.nn.Parameter(torch.arange(40.0).reshape(10, 4))

    def forward(self, k: torch.Tensor, pos: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        p = pos.item()
        torch._check_is_size(p)
        torch._check(p < 8)
        torch.ops.llama.update_cache(k, self.cache, p)
        return self.cache.sum((0, 2, 3)) + torch.index_select(self.table, 0, idx).sum()


class _AddThenLookup(torch.nn.Module):
    """Mutable buffers updated functionally: ExecuTorch's exporter writes them back by
    ``copy_`` at the end, after the failing ``index_select``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4))
        self.register_buffer("count", torch.zeros(1, dtype=torch.int64))
        self.table = torch.nn.Parameter(torch.arange(40.0).reshape(10, 4))

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, idx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.total.add_(x.reshape(4) * (pos + 1))
        self.count.add_(1)
        return self.total * 2 + torch.index_select(self.table, 0, idx).sum(0), self.count + 0


@pytest.fixture(scope="module")
def stateful_failing() -> dict[str, bytes]:
    pytest.importorskip("executorch.runtime")
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (llama:: ops)

    example = (torch.ones(1, 1, 1, 4), torch.tensor(0), torch.tensor([1, 2]))
    return {
        "in_place": export_program(_CacheThenLookup(), example),
        "written_back": export_program(_AddThenLookup(), example),
    }


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("program", ["in_place", "written_back"])
def test_a_failed_call_leaves_state_as_executorch_does(
    stateful_failing: dict[str, bytes], program: str, path: str
) -> None:
    """A stateful program failing at its third instruction: state written in place by an
    earlier instruction stays written, state the exporter writes back at the end does not
    change, in ptexec as in ExecuTorch's runtime; every later call gives ExecuTorch's
    outputs."""
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    data = stateful_failing[program]
    ours = ptexec.load(data).load_method("forward")
    theirs = Runtime.get().load_program(data).load_method("forward")
    call = _caller(ours, path)

    def good(p: int) -> list[torch.Tensor]:
        return [torch.full((1, 1, 1, 4), p + 1.0), torch.tensor(p), torch.tensor([1, 2])]

    bad = [torch.full((1, 1, 1, 4), 100.0), torch.tensor(3), torch.tensor([1, 20])]
    for k, inputs in enumerate([good(0), bad, good(1), bad, good(2), good(3)]):
        if inputs is bad:
            with pytest.raises(ExecutionError, match="index_select"):
                call(_fresh(inputs))
            with pytest.raises(RuntimeError):
                theirs.execute(_fresh(inputs))
            continue
        got = call(_fresh(inputs))
        want = theirs.execute(_fresh(inputs))
        assert compare_outputs(got, list(want), 0, 0) is None, f"call {k}"


class _Bmm(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


@pytest.fixture(scope="module")
def bmm_program() -> bytes:
    """``[1, 8, 1] @ [1, 1, n]`` lowered to XNNPACK (n = 0 passes the program's bounds,
    which keep only the upper one; XNNPACK's reshape refuses it)."""
    from export_util import xnnpack_program

    n = torch.export.Dim("n", min=1, max=16)
    return xnnpack_program(_Bmm(), (torch.randn(1, 8, 1), torch.randn(1, 1, 5)), ({}, {2: n}))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("runner", ["executorch", "torch"])
def test_a_failing_xnnpack_reshape_leaves_the_next_call_right(
    bmm_program: bytes, runner: str, path: str
) -> None:
    """ExecuTorch's backend fails the empty product in XNNPACK's reshape (an
    ExecutionError naming the delegate call); ptexec's torch runner computes it as eager
    PyTorch does. Either way the outputs the caller holds and its inputs are unchanged,
    and every later call is eager's."""
    from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

    if runner == "executorch" and executorch_unavailable():
        pytest.skip("ExecuTorch's XNNPACK backend is not installed")
    method = ptexec.load(bmm_program).load_method("forward", xnnpack=runner)
    call = _caller(method, path)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(1, 8, 1, generator=g)
    held: list[Any] = []
    for n in (3, 0, 7, 0, 16, 1):
        b = torch.randn(1, 1, n, generator=g)
        if n == 0 and runner == "executorch":
            before = snapshot([], held, [a, b])
            with pytest.raises(ExecutionError, match="delegate"):
                call([a, b])
            assert snapshot([], held, [a, b]) == before
            continue
        held = call([a, b])
        torch.testing.assert_close(held[0], torch.bmm(a, b), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------
# training


@pytest.mark.parametrize("path", ["forward_backward", "evaluation"])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_refused_training_calls_keep_parameters_and_gradients(
    name: str, accumulate: bool, path: str
) -> None:
    """Each refusal, through ``forward_backward`` or a call of the training method
    itself: the parameters and every ``.grad`` stay eager PyTorch's after the last good
    backward, and the next step (SGD) is eager's."""
    import copy

    import ptexec.training as training
    from training_models import MODELS, example_inputs

    fix = FIXTURES / "training"
    module = MODELS[name]()
    module.load_state_dict(torch.load(fix / "state.pt")[name])
    eager_opt = torch.optim.SGD(module.parameters(), lr=0.1)
    tm = training.load(fix / f"{name}.pte")
    opt = torch.optim.SGD(tm.parameters(), lr=0.1)
    method = tm.method("forward")
    for step in range(3):
        batch = list(example_inputs(name, step))
        if not accumulate:
            opt.zero_grad()
            eager_opt.zero_grad()
        module(*batch)[0].backward()
        tm.forward_backward("forward", batch, accumulate=accumulate)
        eager = {n: p.grad.clone() for n, p in module.named_parameters()}
        own = {n: (p.detach().clone(), p.grad.clone()) for n, p in tm.named_parameters().items()}
        for n, (_, g) in own.items():
            torch.testing.assert_close(g, eager[n], rtol=1e-5, atol=1e-6)
        held = copy.copy(tm.named_gradients())
        for r in refusals(method, list(example_inputs(name, step + 10))):
            with pytest.raises(r.error):
                if path == "forward_backward":
                    tm.forward_backward("forward", r.inputs, accumulate=accumulate)
                else:
                    method.execute(r.inputs)
            for n, p in tm.named_parameters().items():
                assert p.grad is not None, f"{r.kind}: {n}'s gradient is gone"
                assert torch.equal(p, own[n][0]), f"{r.kind}: {n} changed"
                assert torch.equal(p.grad, own[n][1]), f"{r.kind}: {n}'s gradient changed"
            assert tm.named_gradients() == held, r.kind
        opt.step()
        eager_opt.step()
        for n, p in tm.named_parameters().items():
            torch.testing.assert_close(
                p, dict(module.named_parameters())[n].detach(), rtol=1e-4, atol=1e-5
            )


# --------------------------------------------------------------------------------------
# the LLM runner


@pytest.mark.parametrize("variant", ["portable", "xnnpack", "portable_chunked"])
def test_refused_requests_leave_the_runner_where_it_was(
    variant: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Requests the runner refuses (a prompt past the context, a budget of no token, BOS
    and EOS filling the context, continuing with nothing prefilled) between turns, after
    a prefill and before the generation that continues it: the position, the pending
    prefill and every later turn are those of a runner that never saw them, and the
    first turn is ExecuTorch's greedy loop."""
    pytest.importorskip("tokenizers")
    from llm_support import executorch_greedy, llm_programs, program
    from ptexec.errors import GenerationError
    from ptexec.llm import GenerationConfig, TextLLMRunner

    tokenizer = llm_programs.make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    greedy = GenerationConfig(max_new_tokens=6, temperature=0.0, echo=False)

    def runner() -> TextLLMRunner:
        return TextLLMRunner(str(program(variant)), str(tokenizer), print_output=False)

    ours, clean = runner(), runner()
    context = ours.max_context_len

    def refuse(pending: bool) -> None:
        pos = ours.pos
        long = " ".join(["word"] * context)
        attempts: list[Callable[[], Any]] = [
            lambda: ours.generate_text(long, greedy),
            lambda: ours.prefill(long),
            lambda: ours.generate_text(
                "Hi", GenerationConfig(max_new_tokens=4, seq_len=pos + 1, temperature=0.0)
            ),
            lambda: ours.generate_text(
                "Hi", GenerationConfig(num_bos=context, max_new_tokens=2, temperature=0.0)
            ),
        ]
        if not pending:
            attempts.append(lambda: ours.generate_text("", greedy))
        for attempt in attempts:
            with pytest.raises(GenerationError):
                attempt()
            assert ours.pos == pos

    turns: list[tuple[str, str]] = [
        ("generate", "Once upon a time"),
        ("generate", " and then"),
        ("prefill", " the end."),
        ("generate", ""),
        ("generate", " again"),
    ]
    for k, (what, prompt) in enumerate(turns):
        refuse(pending=k == 3)
        if what == "prefill":
            ours.prefill(prompt)
            clean.prefill(prompt)
        else:
            assert ours.generate_text(prompt, greedy) == clean.generate_text(prompt, greedy)
            assert ours.generated_tokens == clean.generated_tokens
        if k == 0:
            want = executorch_greedy(
                program(variant),
                ours.tokenizer.encode(prompt),
                greedy.max_new_tokens,
                ours.decoder.dynamic,
            )
            assert ours.generated_tokens == want
        assert ours.pos == clean.pos
