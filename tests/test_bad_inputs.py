"""Bad inputs and errors during execution.

Every bad input raises :class:`ptexec.InputError` (or :class:`ptexec.UnsupportedDeviceError`,
or :class:`ptexec.DeviceUnavailableError` for CUDA memory on a machine without CUDA) naming
the input, what was expected and what came, before anything is written: the method's memory
(a stateful program's buffers included) is bit-for-bit unchanged and the next good call gives
exactly the answer it would have given. A kernel that fails raises
:class:`ptexec.ExecutionError` with the instruction index, the operator and (when the program
carries stack traces) the source frame, and the method works for the next call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec.format import program as fp

# --------------------------------------------------------------------------------------
# helpers


class Session:
    """One loaded program replaying its fixture calls (methods loaded on first use)."""

    def __init__(self, name: str, **options: Any) -> None:
        self.name = name
        pte, ptd = fixture_paths(name)
        self.program = ptexec.load(pte, data_path=ptd)
        self.calls = fixture_calls(name)
        self.options = options
        self.methods: dict[str, ptexec.Method] = {}

    def method(self, name: str) -> ptexec.Method:
        if name not in self.methods:
            self.methods[name] = self.program.load_method(name, **self.options)
        return self.methods[name]

    def replay(self, k: int) -> None:
        """Call ``k`` of the fixture; its outputs must be exactly the recorded ones."""
        call = self.calls[k]
        got = self.method(call["method"]).execute(call["inputs"])
        problem = compare_outputs(got, call["outputs"], *tolerance(self.name))
        assert problem is None, f"{self.name} call {k}: {problem}"

    def snapshot(self) -> list[tuple[int, int, bytes]]:
        """Every byte of every tensor the loaded methods hold."""
        out = []
        for m in self.methods.values():
            for j, v in enumerate(m.values()):
                if isinstance(v, torch.Tensor):
                    raw = v.detach().reshape(-1).contiguous().view(torch.uint8)
                    out.append((id(m), j, bytes(raw.numpy())))
        return out


class FakeArray:
    """A DLPack producer claiming memory on some device (consuming it is never reached)."""

    def __init__(self, code: int, shape: tuple[int, ...]) -> None:
        self.code = code
        self.shape = shape

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.code, 0)

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise RuntimeError("this producer cannot export its memory")


@dataclass
class Bad:
    """A bad call: ``make(inputs) -> (inputs, execute kwargs)``; the error and the words its
    message must contain (where, expected, got)."""

    id: str
    fixture: str
    make: Callable[[list[Any]], tuple[list[Any], dict[str, Any]]]
    words: tuple[str, ...]
    error: type[Exception] = ptexec.InputError
    method: str = "forward"
    options: dict[str, Any] = field(default_factory=dict)
    xfail: str = ""  # a known bug, fixed in a later commit


def _params(cases: list[Bad]) -> list[Any]:
    return [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=c.xfail)) if c.xfail else c
        for c in cases
    ]


def replace(i: int, fn: Callable[[Any], Any]) -> Callable[[list[Any]], tuple[list[Any], dict]]:
    def make(inputs: list[Any]) -> tuple[list[Any], dict]:
        new = list(inputs)
        new[i] = fn(new[i])
        return new, {}

    return make


def inputs(fn: Callable[[list[Any]], list[Any]]) -> Callable[[list[Any]], tuple[list[Any], dict]]:
    return lambda xs: (fn(list(xs)), {})


def out(fn: Callable[[list[Any]], list[Any]]) -> Callable[[list[Any]], tuple[list[Any], dict]]:
    return lambda xs: (list(xs), {"out": fn(xs)})


def noncontiguous(x: torch.Tensor) -> torch.Tensor:
    """The same values, every other element of a wider tensor."""
    wide = torch.stack([x, torch.zeros_like(x)], dim=-1)
    return wide[..., 0]


def with_size(x: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = n
    return torch.zeros(shape, dtype=x.dtype)


IN0 = "input 0 of 'forward'"
OUT0 = "out[0] of 'forward'"

BAD: list[Bad] = [
    # wrong count
    Bad("count-none", "mlp", inputs(lambda xs: []), ("'forward' takes 1 input(s), got 0",)),
    Bad("count-extra", "mlp", inputs(lambda xs: [*xs, xs[0]]), ("takes 1 input(s), got 2",)),
    Bad(
        "count-missing-scalar", "scalar_io", inputs(lambda xs: xs[:3]), ("takes 4 input(s), got 3",)
    ),
    Bad("count-cond", "cond", inputs(lambda xs: xs[:1]), ("takes 2 input(s), got 1",)),
    Bad(
        "count-zero-input-method",
        "shared_state",
        inputs(lambda xs: [torch.ones(4)]),
        ("'read' takes 0 input(s), got 1",),
        method="read",
    ),
    # wrong kind where a tensor goes
    Bad(
        "kind-none",
        "mlp",
        replace(0, lambda x: None),
        (IN0, "expected a tensor float32[2, 8]", "got NoneType"),
    ),
    Bad("kind-list", "mlp", replace(0, lambda x: x.tolist()), (IN0, "float32[2, 8]", "got list")),
    Bad("kind-str", "mlp_unplanned", replace(0, lambda x: "x"), (IN0, "float32[2, 8]", "got str")),
    Bad("kind-int", "mlp", replace(0, lambda x: 3), (IN0, "float32[2, 8]", "got int 3")),
    Bad("kind-dict", "mlp_unplanned", replace(0, lambda x: {"x": x}), (IN0, "got dict")),
    Bad("kind-object", "mlp", replace(0, lambda x: object()), (IN0, "float32[2, 8]", "got object")),
    # a dynamic input is named by its bounds, as the shape errors name it
    Bad(
        "kind-none-dynamic",
        "dynamic_mlp",
        replace(0, lambda x: None),
        (IN0, "expected a tensor float32[<=16, <=8] on cpu", "got NoneType"),
    ),
    Bad(
        "kind-python-int-for-0dim",
        "int_ops",
        replace(2, lambda k: int(k)),
        ("input 2 of 'forward'", "int64[]", "got int 3"),
    ),
    Bad(
        "kind-none-second",
        "cond",
        replace(1, lambda y: None),
        ("input 1 of 'forward'", "got NoneType"),
    ),
    Bad(
        "kind-broken-array",
        "mlp",
        replace(0, lambda x: FakeArray(1, (2, 8))),
        (IN0, "float32[2, 8]", "reading the FakeArray failed: RuntimeError"),
    ),
    Bad("kind-sparse", "mlp", replace(0, lambda x: x.to_sparse()), (IN0, "sparse_coo", "strided")),
    # dtype
    Bad(
        "dtype-float64",
        "mlp",
        replace(0, lambda x: x.double()),
        (IN0, "float32[2, 8]", "float64[2, 8]"),
    ),
    Bad(
        "dtype-float16",
        "mlp_unplanned",
        replace(0, lambda x: x.half()),
        (IN0, "float32[2, 8]", "float16[2, 8]"),
    ),
    Bad(
        "dtype-half-got-float",
        "half_mlp",
        replace(0, lambda x: x.float()),
        (IN0, "float16[2, 8]", "float32[2, 8]"),
    ),
    Bad(
        "dtype-bf16-got-half",
        "bf16_mlp",
        replace(0, lambda x: x.half()),
        (IN0, "bfloat16[2, 8]", "float16[2, 8]"),
    ),
    Bad(
        "dtype-int32-ids",
        "int_ops",
        replace(0, lambda x: x.int()),
        (IN0, "int64[2, 5]", "int32[2, 5]"),
    ),
    Bad(
        "dtype-float-k",
        "int_ops_unplanned",
        replace(2, lambda k: k.float()),
        ("input 2 of 'forward'", "int64[]", "float32[]"),
    ),
    Bad(
        "dtype-int-x",
        "int_ops",
        replace(1, lambda x: x.long()),
        ("input 1 of 'forward'", "float32[2, 5]", "int64[2, 5]"),
    ),
    Bad(
        "dtype-stateful",
        "stateful",
        replace(0, lambda x: x.long()),
        (IN0, "float32[4]", "int64[4]"),
    ),
    Bad("dtype-complex", "cnn", replace(0, lambda x: x.to(torch.complex64)), (IN0, "complex64")),
    # rank
    Bad(
        "rank-flat",
        "mlp",
        replace(0, lambda x: x.reshape(16)),
        (IN0, "float32[2, 8]", "float32[16]", "rank 1, expected rank 2"),
    ),
    Bad(
        "rank-extra",
        "mlp_unplanned",
        replace(0, lambda x: x[None]),
        (IN0, "float32[1, 2, 8]", "rank 3"),
    ),
    Bad(
        "rank-cnn",
        "cnn",
        replace(0, lambda x: x[0]),
        (IN0, "float32[2, 3, 16, 16]", "float32[3, 16, 16]"),
    ),
    Bad(
        "rank-0dim",
        "int_ops",
        replace(2, lambda k: k.reshape(1)),
        ("input 2 of 'forward'", "int64[]", "int64[1]"),
    ),
    Bad(
        "rank-unbound",
        "dynamic_unbound",
        replace(0, lambda x: x[:, None]),
        (IN0, "rank 1", "float32[6, 1]"),
    ),
    # shape past its bound
    Bad(
        "bound-batch",
        "dynamic_mlp",
        replace(0, lambda x: with_size(x, 0, 17)),
        (IN0, "float32[<=16, <=8]", "float32[17, 8]", "exceeds the upper bound"),
    ),
    Bad(
        "bound-batch-unplanned",
        "dynamic_mlp_unplanned",
        replace(0, lambda x: with_size(x, 0, 17)),
        (IN0, "[<=16, <=8]", "float32[17, 8]"),
    ),
    Bad(
        "bound-feature",
        "dynamic_mlp",
        replace(0, lambda x: with_size(x, 1, 9)),
        (IN0, "float32[<=16, <=8]", ", 9] on cpu", "dimension 1 exceeds"),
    ),
    Bad(
        "bound-rows",
        "scalar_io",
        replace(0, lambda x: with_size(x, 0, 9)),
        (IN0, "[<=8, <=3]", "float32[9, 3]"),
    ),
    # static shape mismatch
    Bad(
        "shape-batch",
        "mlp",
        replace(0, lambda x: with_size(x, 0, 3)),
        (IN0, "float32[2, 8]", "float32[3, 8]", "shape differs"),
    ),
    Bad(
        "shape-feature",
        "mlp_unplanned",
        replace(0, lambda x: with_size(x, 1, 9)),
        (IN0, "float32[2, 9]"),
    ),
    Bad(
        "shape-cnn",
        "cnn",
        replace(0, lambda x: with_size(x, 3, 15)),
        (IN0, "float32[2, 3, 16, 15]"),
    ),
    Bad(
        "shape-stateful",
        "stateful",
        replace(0, lambda x: with_size(x, 0, 5)),
        (IN0, "float32[4]", "float32[5]"),
    ),
    Bad(
        "shape-transformer",
        "transformer",
        replace(0, lambda x: with_size(x, 1, 7)),
        (IN0, "float32[2, 7, 16]"),
    ),
    Bad(
        "shape-map",
        "map_unplanned",
        replace(0, lambda x: with_size(x, 0, 5)),
        (IN0, "float32[4, 2, 3]", "float32[5, 2, 3]"),
    ),
    Bad("shape-empty", "mlp", replace(0, lambda x: with_size(x, 0, 0)), (IN0, "float32[0, 8]")),
    # memory on a device ptexec does not model
    Bad(
        "device-meta",
        "mlp",
        replace(0, lambda x: x.to("meta")),
        (IN0, "meta"),
        ptexec.UnsupportedDeviceError,
    ),
    Bad(
        "device-meta-unplanned",
        "mlp_unplanned",
        replace(0, lambda x: x.to("meta")),
        (IN0, "meta"),
        ptexec.UnsupportedDeviceError,
    ),
    Bad(
        "device-rocm",
        "mlp",
        replace(0, lambda x: FakeArray(10, (2, 8))),
        (IN0, "kDLROCM (10)"),
        ptexec.UnsupportedDeviceError,
    ),
    Bad(
        "device-metal",
        "cnn_unplanned",
        replace(0, lambda x: FakeArray(8, (2, 3, 16, 16))),
        (IN0, "kDLMetal (8)"),
        ptexec.UnsupportedDeviceError,
    ),
    Bad(
        "device-meta-second",
        "cond",
        replace(1, lambda y: y.to("meta")),
        ("input 1 of 'forward'", "meta"),
        ptexec.UnsupportedDeviceError,
    ),
    # layouts an unplanned input cannot be read in place from (layout="strict")
    Bad(
        "layout-noncontiguous",
        "mlp_unplanned",
        replace(0, noncontiguous),
        (IN0, "laid out contiguous", "strided layout"),
    ),
    Bad(
        "layout-transposed",
        "mlp_unplanned",
        replace(0, lambda x: x.t().contiguous().t()),
        (IN0, "laid out contiguous", "got dim_order[1, 0] layout"),
    ),
    Bad(
        "layout-expanded",
        "mlp_unplanned",
        replace(0, lambda x: x[:1].expand(2, 8)),
        (IN0, "laid out contiguous"),
    ),
    Bad(
        "layout-negative-strides",
        "mlp_unplanned",
        replace(0, lambda x: np.flip(x.numpy(), 0)),
        (IN0, "laid out contiguous", "got strided layout"),
    ),
    Bad(
        "layout-negative-strides-cnn",
        "cnn_unplanned",
        replace(0, lambda x: np.flip(x.numpy(), 3)),
        (IN0, "laid out contiguous"),
    ),
    Bad(
        "layout-channels-last-into-contiguous",
        "cnn_unplanned",
        replace(0, lambda x: x.contiguous(memory_format=torch.channels_last)),
        (IN0, "laid out contiguous", "got channels_last layout"),
    ),
    Bad(
        "layout-contiguous-into-channels-last",
        "channels_last_unplanned",
        replace(0, lambda x: x.contiguous()),
        (IN0, "laid out channels_last", "got contiguous layout"),
    ),
    Bad(
        "layout-transformer",
        "transformer_unplanned",
        replace(0, lambda x: x.transpose(0, 1).contiguous().transpose(0, 1)),
        (IN0, "laid out contiguous"),
    ),
    # scalars that differ from the traced value
    Bad(
        "scalar-float",
        "scalar_io",
        replace(1, lambda a: 0.25),
        ("input 1 of 'forward'", "traced with float 0.5", "got float 0.25"),
    ),
    Bad(
        "scalar-int",
        "scalar_io",
        replace(2, lambda n: 4),
        ("input 2 of 'forward'", "traced with int 3", "got int 4"),
    ),
    Bad(
        "scalar-bool",
        "scalar_io",
        replace(3, lambda f: False),
        ("input 3 of 'forward'", "traced with bool True", "got bool False"),
    ),
    Bad(
        "scalar-bool-for-int",
        "scalar_io",
        replace(2, lambda n: True),
        ("input 2 of 'forward'", "int 3", "got bool True"),
    ),
    Bad(
        "scalar-int-for-bool",
        "scalar_io_unplanned",
        replace(3, lambda f: 1),
        ("input 3 of 'forward'", "bool True", "got int 1"),
    ),
    Bad(
        "scalar-str",
        "scalar_io",
        replace(1, lambda a: "0.5"),
        ("input 1 of 'forward'", "float 0.5", "got str '0.5'"),
    ),
    Bad(
        "scalar-tensor",
        "scalar_io",
        replace(2, lambda n: torch.tensor(3)),
        ("input 2 of 'forward'", "int 3", "got Tensor"),
    ),
    Bad(
        "scalar-none",
        "scalar_io_unplanned",
        replace(1, lambda a: None),
        ("input 1 of 'forward'", "float 0.5", "got NoneType"),
    ),
    Bad(
        "scalar-nan",
        "scalar_io",
        replace(1, lambda a: float("nan")),
        ("input 1 of 'forward'", "float 0.5", "got float nan"),
    ),
    # caller-given outputs
    Bad("out-shape", "mlp", out(lambda xs: [torch.empty(3, 4)]), (OUT0, "float32[2, 4]", "[3, 4]")),
    Bad(
        "out-shape-unplanned",
        "mlp_unplanned",
        out(lambda xs: [torch.empty(2, 5)]),
        (OUT0, "float32[2, 4]", "[2, 5]"),
    ),
    Bad(
        "out-dtype",
        "mlp",
        out(lambda xs: [torch.empty(2, 4, dtype=torch.float64)]),
        (OUT0, "float32[2, 4]", "float64"),
    ),
    Bad(
        "out-device",
        "mlp",
        out(lambda xs: [torch.empty(2, 4, device="meta")]),
        (OUT0, "meta"),
        ptexec.UnsupportedDeviceError,
    ),
    Bad("out-count", "mlp", out(lambda xs: [None, None]), ("has 1 output(s), out= gives 2",)),
    Bad(
        "out-layout",
        "mlp_unplanned",
        out(lambda xs: [torch.empty(4, 2).t()]),
        (OUT0, "laid out contiguous"),
    ),
    Bad(
        "out-not-tensor",
        "mlp",
        out(lambda xs: [np.empty((2, 4), np.float32)]),
        (OUT0, "expected a torch tensor", "ndarray"),
    ),
    Bad(
        "out-for-scalar",
        "scalar_io",
        out(lambda xs: [None, torch.empty(()), *[None] * 5]),
        ("out[1] of 'forward'", "is a int, not a tensor"),
    ),
    Bad(
        "out-rank",
        "dynamic_mlp",
        out(lambda xs: [torch.empty(16)]),
        (OUT0, "expected rank 2", "[16]"),
    ),
    Bad(
        "out-stateful",
        "stateful",
        out(lambda xs: [torch.empty(5), None, None]),
        (OUT0, "float32[4]", "[5]"),
    ),
    Bad(
        "out-second-bad",
        "stateful_unplanned",
        out(lambda xs: [torch.empty(4), torch.empty(4, dtype=torch.int64), None]),
        ("out[1] of 'forward'", "float32[4]", "int64"),
    ),
]


@pytest.mark.parametrize("case", _params(BAD), ids=lambda c: c.id)
def test_bad_input(case: Bad) -> None:
    s = Session(case.fixture, **case.options)
    s.replay(0)
    k = next((i for i, c in enumerate(s.calls) if c["method"] == case.method), 0)
    m = s.method(case.method)
    args, kwargs = case.make(s.calls[k]["inputs"] if s.calls[k]["method"] == case.method else [])
    before = s.snapshot()
    with pytest.raises(case.error) as info:
        m.execute(args, **kwargs)
    message = str(info.value)
    for word in case.words:
        assert word in message, f"{word!r} not in {message!r}"
    assert s.snapshot() == before, "a refused call wrote to the method's memory"
    s.replay(1)  # exactly the answer of the recorded sequence: nothing changed


def test_the_matrix_is_large_enough() -> None:
    assert len(BAD) >= 50
    assert len({c.fixture for c in BAD}) >= 15


# --------------------------------------------------------------------------------------
# inputs that are fine (they must not be refused, and give the right answer)

GOOD: list[tuple[str, str, Callable[[list[Any]], list[Any]], dict[str, Any]]] = [
    ("planned-noncontiguous", "mlp", lambda xs: [noncontiguous(xs[0])], {}),
    (
        "planned-negative-strides",
        "mlp",
        lambda xs: [np.flip(np.flip(xs[0].numpy(), 0).copy(), 0)],
        {},
    ),
    (
        "planned-channels-last-into-contiguous",
        "cnn",
        lambda xs: [xs[0].contiguous(memory_format=torch.channels_last)],
        {},
    ),
    ("planned-contiguous-into-channels-last", "channels_last", lambda xs: [xs[0].contiguous()], {}),
    (
        "convert-noncontiguous",
        "mlp_unplanned",
        lambda xs: [noncontiguous(xs[0])],
        {"layout": "convert"},
    ),
    (
        "convert-negative-strides",
        "mlp_unplanned",
        lambda xs: [np.flip(np.flip(xs[0].numpy(), 0).copy(), 0)],
        {"layout": "convert"},
    ),
    (
        "convert-contiguous-into-channels-last",
        "channels_last_unplanned",
        lambda xs: [xs[0].contiguous()],
        {"layout": "convert"},
    ),
    ("requires-grad", "mlp", lambda xs: [xs[0].clone().requires_grad_()], {}),
    ("requires-grad-unplanned", "mlp_unplanned", lambda xs: [xs[0].clone().requires_grad_()], {}),
    ("numpy", "mlp_unplanned", lambda xs: [xs[0].numpy()], {}),
    ("numpy-float64-scalar", "scalar_io", lambda xs: [xs[0], np.float64(xs[1]), xs[2], xs[3]], {}),
    ("smaller-dynamic", "dynamic_mlp", lambda xs: [xs[0][:1]], {}),
]


def _good_params() -> list[Any]:
    known = {}
    return [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=known[c[0]]))
        if c[0] in known
        else c
        for c in GOOD
    ]


@pytest.mark.parametrize("case", _good_params(), ids=lambda c: c[0])
def test_good_input(case) -> None:
    _, name, make, kwargs = case
    s = Session(name)
    call = s.calls[0]
    args = make(list(call["inputs"]))
    m = s.method(call["method"])
    got = m.execute(args, **kwargs)
    expected = m.execute(call["inputs"]) if case[0] == "smaller-dynamic" else call["outputs"]
    if case[0] == "smaller-dynamic":  # compare with the first row of a full call
        expected = [e[:1] for e in expected]
    assert compare_outputs(got, expected, *tolerance(name)) is None
    for g in got:
        if isinstance(g, torch.Tensor):
            assert not g.requires_grad
    s.replay(1)  # and the method is fine afterwards


def test_requires_grad_input_does_not_poison_the_method() -> None:
    """An input that requires grad must not leave autograd state in the method's memory."""
    s = Session("mlp")
    x = s.calls[0]["inputs"][0].clone().requires_grad_()
    s.method("forward").execute([x])
    for v in s.method("forward").values():
        if isinstance(v, torch.Tensor):
            assert not v.requires_grad and v.grad_fn is None
    s.replay(0)
    s.replay(1)


def test_a_shared_input_keeps_its_shape_and_memory() -> None:
    """An unplanned input is read in place, without a copy."""
    s = Session("mlp_unplanned")
    x = s.calls[0]["inputs"][0].clone()
    ptr, shape = x.data_ptr(), tuple(x.shape)
    m = s.method("forward")
    m.execute([x])
    assert (x.data_ptr(), tuple(x.shape)) == (ptr, shape)
    assert m.last_call.inputs == ["share"]


def _kernel_args_at(data: bytes, instruction: int) -> int:
    """File offset of the args vector of KernelCall ``instruction`` (chain 0 of plan 0)."""
    from ptexec.format.flatbuf import Buffer

    root = Buffer(memoryview(data)).root("")
    plan = root.tables(1, "execution_plan", lambda t: t)[0]
    chain = plan.tables(5, "chains", lambda t: t)[0]
    ins = chain.tables(2, "instructions", lambda t: t)[instruction]
    _, call = ins.union(0, "instr_args")
    start, _ = call.vector_span(1, "args", 4)
    return start


def test_a_program_cannot_reshape_the_callers_tensor() -> None:
    """A (hostile) program whose relu writes its [2, 16] result into the input slot: the
    caller's tensor keeps its shape and values; only the program's alias of it changes."""
    data = bytearray(fixture_paths("mlp_unplanned")[0].read_bytes())
    plan = ptexec.load(bytes(data)).pte.program.execution_plan[0]
    assert plan.operators[plan.chains[0].instructions[2].op_index].name == "aten::relu"
    (slot,) = plan.inputs
    at = _kernel_args_at(bytes(data), 2) + 4  # relu.out's out argument
    data[at : at + 4] = slot.to_bytes(4, "little")
    m = ptexec.load(bytes(data)).load_method()
    x = fixture_calls("mlp_unplanned")[0]["inputs"][0].clone()
    m.execute([x])
    assert (tuple(x.shape), x.stride()) == ((2, 8), (8, 1))  # its values are the program's to write


# --------------------------------------------------------------------------------------
# CUDA memory: each transfer policy (runs on a machine with CUDA)


def test_cuda_input_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    s = Session("mlp")
    s.replay(0)
    with pytest.raises(ptexec.DeviceUnavailableError, match="input 0 of 'forward' is on cuda:0"):
        s.method("forward").execute([FakeArray(2, (2, 8))])
    s.replay(1)


CUDA_CASES = [
    # (fixture, transfers, accepted?, words of the error)
    ("mlp", "auto", True, ()),
    ("mlp", "allow", True, ()),
    ("mlp", "forbid", False, (IN0, "transfers='forbid'")),
    ("mlp_unplanned", "auto", False, (IN0, "must be on cpu", "transfers='allow'")),
    ("mlp_unplanned", "forbid", False, (IN0, "must be on cpu")),
    ("mlp_unplanned", "allow", True, ()),
    ("stateful", "forbid", False, (IN0, "transfers='forbid'")),
]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name, transfers, accepted, words", CUDA_CASES)
def test_cuda_input_under_each_policy(name: str, transfers: str, accepted: bool, words) -> None:
    s = Session(name, transfers=transfers)
    s.replay(0)
    call = s.calls[1]
    x = call["inputs"][0].cuda()
    m = s.method("forward")
    if accepted:
        got = m.execute([x])
        assert compare_outputs(got, call["outputs"], *tolerance(name)) is None
        return
    before = s.snapshot()
    with pytest.raises(ptexec.InputError) as info:
        m.execute([x])
    for word in words:
        assert word in str(info.value)
    assert s.snapshot() == before
    s.replay(1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_out_for_a_cpu_output() -> None:
    s = Session("mlp")
    s.replay(0)
    with pytest.raises(ptexec.InputError, match=r"out\[0\] of 'forward'.*cuda"):
        s.method("forward").execute(s.calls[1]["inputs"], out=[torch.empty(2, 4, device="cuda")])
    s.replay(1)


# --------------------------------------------------------------------------------------
# errors during execution


def test_index_out_of_range_in_input_data() -> None:
    s = Session("int_ops")
    s.replay(0)
    ids, x, k = s.calls[1]["inputs"]
    bad = ids.clone()
    bad[1, 3] = 100  # Embedding(10, 4)
    with pytest.raises(ptexec.ExecutionError) as info:
        s.method("forward").execute([bad, x, k])
    e = info.value
    assert e.instruction == 0
    assert e.operator == "aten::embedding.out"
    assert e.method == "forward"
    assert isinstance(e.__cause__, IndexError)
    assert "'forward' instruction 0 (aten::embedding.out): IndexError" in str(e)
    assert e.frame is None  # the fixtures carry no stack traces
    s.replay(1)
    s.replay(2)


def _int_ops_with_zero_divisor() -> bytes:
    """int_ops with its floor_divide divisor (a constant) set to 0 in the file."""
    data = bytearray(fixture_paths("int_ops")[0].read_bytes())
    pte = ptexec.load(bytes(data)).pte
    plan = pte.program.execution_plan[0]
    (div,) = [
        ins
        for ins in plan.chains[0].instructions
        if isinstance(ins, fp.KernelCall)
        and plan.operators[ins.op_index].qualified_name == "aten::div.out_mode"
    ]
    divisor = plan.values[div.args[1]]
    const = pte.program.constant_segment
    start = pte.segments[const.segment_index].offset + const.offsets[divisor.data_buffer_idx]
    assert int.from_bytes(data[start : start + 8], "little") == 2  # x // 2
    data[start : start + 8] = (0).to_bytes(8, "little")
    return bytes(data)


def test_integer_division_by_zero() -> None:
    m = ptexec.load(_int_ops_with_zero_divisor()).load_method()
    calls = fixture_calls("int_ops")
    with pytest.raises(ptexec.ExecutionError) as info:
        m.execute(calls[0]["inputs"])
    e = info.value
    assert e.operator == "aten::div.out_mode"
    assert "ZeroDivisionError" in str(e)
    program = m.program.pte.program.execution_plan[0]
    assert (
        program.operators[program.chains[0].instructions[e.instruction].op_index].qualified_name
        == e.operator
    )
    with pytest.raises(ptexec.ExecutionError):  # the same error again, not a crash or a hang
        m.execute(calls[1]["inputs"])


def _half_resized() -> tuple[Any, ptexec.Method, torch.Tensor, tuple[Any, ...]]:
    """The int_ops session and method, one of the method's tensors left as a half-done
    resize leaves it (more elements than its memory holds, as torch sets the sizes first),
    and that tensor's geometry as loaded."""
    s = Session("int_ops")
    m = s.method("forward")
    owned = [v for v in m.values() if isinstance(v, torch.Tensor) and v.numel()]
    victim = owned[-1]
    geometry = (victim.data_ptr(), tuple(victim.shape), tuple(victim.stride()))
    with pytest.raises(RuntimeError):
        torch.add(torch.zeros(1, dtype=victim.dtype).expand(1 << 40), 1, out=victim)
    assert victim.numel() == 1 << 40
    return s, m, victim, geometry


def test_a_failed_call_restores_the_method_memory() -> None:
    """A kernel that fails while resizing its output leaves sizes its memory does not hold
    (torch sets them first); the failed call restores every tensor the method owns, so the
    next call neither reads past the memory nor gives a wrong answer."""
    s, m, victim, geometry = _half_resized()
    ids, x, k = s.calls[0]["inputs"]
    bad = ids.clone()
    bad[0, 0] = -1000
    with pytest.raises(ptexec.ExecutionError):
        m.execute([bad, x, k])
    assert (victim.data_ptr(), tuple(victim.shape), tuple(victim.stride())) == geometry
    for k in range(len(s.calls)):
        s.replay(k)


def test_an_interrupted_call_restores_the_method_memory() -> None:
    """A KeyboardInterrupt raised inside the fast call (not an Exception) restores the
    method's tensors too, and is raised as itself: the next call works."""
    import sys

    s, m, victim, geometry = _half_resized()
    lines = [0]

    def interrupt(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_code.co_name != "_fast":
            return None

        def line(frame, event, arg):  # type: ignore[no-untyped-def]
            lines[0] += 1
            if lines[0] == 4:
                raise KeyboardInterrupt
            return line

        return line

    sys.settrace(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            m.execute(s.calls[0]["inputs"])
    finally:
        sys.settrace(None)
    assert lines[0] == 4  # the fast call ran, and was interrupted
    assert (victim.data_ptr(), tuple(victim.shape), tuple(victim.stride())) == geometry
    for k in range(len(s.calls)):
        s.replay(k)


def test_numpy_scalars_are_accepted_for_traced_scalars() -> None:
    import numpy as np

    from fixture_data import fixture_calls, fixture_paths

    call = fixture_calls("scalar_io")[0]
    m = ptexec.load(fixture_paths("scalar_io")[0]).load_method("forward")
    x, alpha, n, flag = call["inputs"]
    want = m.execute([x, alpha, n, flag])
    got = m.execute([x, np.float64(alpha), np.int64(n), np.bool_(flag)])
    assert torch.equal(got[0], want[0]) and got[1:] == want[1:]
    with pytest.raises(ptexec.InputError, match="traced with int"):
        m.execute([x, alpha, np.int64(n + 1), flag])
    with pytest.raises(ptexec.InputError, match="traced with int"):
        m.execute([x, alpha, np.bool_(True), flag])


def test_a_float_traced_as_an_infinity_or_nan_takes_only_itself() -> None:
    """ExecuTorch's rule for a traced float: NaN fits NaN, an infinity only itself (the
    difference from any other value is no finite number), other values within 1e-4 plus
    1e-5 of the traced one. A value that does not fit would be ignored: the program
    computes with the traced one."""
    from conftest import executorch_runtime
    from export_util import export_program

    class Clamp(torch.nn.Module):
        def forward(self, x: torch.Tensor, a: float) -> torch.Tensor:
            return torch.clamp(x, max=a)

    rt = executorch_runtime()
    x = torch.tensor([1.0, 5.0, -3.0])
    inf, nan = float("inf"), float("nan")
    for traced, given in [(inf, [inf, 5.0, 1e30, -inf, nan]), (nan, [nan, 5.0, inf])]:
        pte = export_program(Clamp(), (x, traced))
        m = ptexec.load(pte).load_method("forward")
        for a in given:
            try:
                want = rt.load_program(pte).load_method("forward").execute([x, a])
            except RuntimeError:
                with pytest.raises(ptexec.InputError, match="traced with float"):
                    m.execute([x, a])
                continue
            got = m.execute([x, a])
            torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_number_past_every_float_is_refused_for_a_traced_float(fast_path: bool) -> None:
    """An integer or fraction too large for a float fits no traced float: refused as
    any value that does not fit (ExecuTorch's runtime refuses it too), and the next good
    call works."""
    from fractions import Fraction

    from conftest import executorch_runtime

    call = fixture_calls("scalar_io")[0]
    pte = fixture_paths("scalar_io")[0]
    m = ptexec.load(pte).load_method("forward", fast_path=fast_path)
    et = executorch_runtime().load_program(pte).load_method("forward")
    x, alpha, n, flag = call["inputs"]
    want = et.execute([x, alpha, n, flag])
    for huge in (10**400, -(10**400), Fraction(10**400, 3)):
        with pytest.raises(RuntimeError):
            et.execute([x, huge, n, flag])
        with pytest.raises(ptexec.InputError, match="traced with float"):
            m.execute([x, huge, n, flag])
    got = m.execute([x, alpha, n, flag])
    assert torch.equal(got[0], want[0]) and got[1:] == want[1:]
