"""ExecuTorch's XNNPACK backend inside ptexec's method (``load_method(xnnpack=...)``).

The outputs of both runners are compared with ExecuTorch's over every XNNPACK fixture in
tests/test_xnnpack.py; here: which runner an option picks, that ptexec's tensors are
handed over without copies (ExecuTorch writes the method's own output memory), that the
hand-over happens once while addresses stay, dynamic shapes, inputs ptexec keeps as strided
views, the one-delegate program ptexec writes, and ptexec without ExecuTorch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from fixture_data import compare_outputs
from ptexec.delegates.xnnpack import backend
from ptexec.delegates.xnnpack.schema import decode_payload
from ptexec.errors import BackendUnavailableError
from ptexec.format import program as p
from ptexec.format.pte import read_pte
from ptexec.format.pte_write import DelegateCallSpec, delegate_program, one_delegate_program

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "tests" / "fixtures" / "xnnpack"
MANIFEST: dict[str, Any] = json.loads((DIR / "manifest.json").read_text())


def _calls(name: str) -> list[dict[str, Any]]:
    return torch.load(DIR / f"{name}.io.pt", weights_only=True)["calls"]  # type: ignore[no-any-return]


def _method(name: str, **options: Any) -> ptexec.Method:
    return ptexec.load(DIR / MANIFEST[name]["pte"]).load_method("forward", **options)


def _runners(method: ptexec.Method) -> dict[str, Any]:
    """The XNNPACK runner functions a method's statements call, by name."""
    found: dict[str, Any] = {}
    for chain in method.state.chains:
        for st in chain.statements:
            for fn in st.env.values():
                name = getattr(fn, "__name__", "")
                if name.startswith("_xnnpack"):
                    found.setdefault(name, fn)
    return found


@pytest.fixture(scope="module")
def et() -> None:
    from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

    reason = executorch_unavailable()
    if reason is not None:
        pytest.skip(reason)


# -- which runner ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "choice, device, unavailable, want",
    [
        ("torch", "cpu", None, "torch"),
        ("torch", "cuda", "not installed", "torch"),
        ("executorch", "cpu", None, "executorch"),
        ("executorch", "cpu", "not installed", BackendUnavailableError),
        ("executorch", "cuda", None, BackendUnavailableError),
        ("auto", "cpu", None, backend.AUTO_RUNNER),
        ("auto", "cpu", "not installed", "torch"),
        ("auto", "cuda", None, "torch"),  # CUDA keeps ptexec's runner
        ("xla", "cpu", None, ValueError),
    ],
)
def test_choose_runner(choice: str, device: str, unavailable: str | None, want: Any) -> None:
    if isinstance(want, str):
        assert backend.choose_runner(choice, device, unavailable) == want
    else:
        with pytest.raises(want):
            backend.choose_runner(choice, device, unavailable, "forward.delegates[0]")


def test_auto_runs_executorch_on_the_cpu(et: None) -> None:
    assert backend.AUTO_RUNNER == "executorch"
    assert set(_runners(_method("mlp"))) == {"_xnnpack_et_run"}
    assert set(_runners(_method("mlp", xnnpack="torch"))) == {"_xnnpack_run"}
    assert set(_runners(_method("mlp", xnnpack="executorch"))) == {"_xnnpack_et_run"}


def test_unknown_option_value_is_refused() -> None:
    with pytest.raises(ValueError, match="xnnpack"):
        _method("mlp", xnnpack="xnn")


@pytest.mark.cuda
def test_cuda_keeps_the_torch_runner() -> None:
    assert set(_runners(_method("mlp", device_map="cuda"))) == {"_xnnpack_run"}
    with pytest.raises(BackendUnavailableError, match="runs on the CPU"):
        _method("mlp", device_map="cuda", xnnpack="executorch")


# -- tensors handed over, not copied --------------------------------------------------------


def _delegate_args(method: ptexec.Method) -> tuple[int, ...]:
    plan = method.state.plan
    (call,) = [i for i in plan.chains[0].instructions if isinstance(i, p.DelegateCall)]
    return call.args


def test_executorch_writes_the_methods_own_memory(et: None) -> None:
    """With outputs='view', the output is the method's planned tensor itself; ExecuTorch's
    method holds exactly the addresses of the delegate call's tensors."""
    m = _method("cnn", xnnpack="executorch", outputs="view")
    call = _calls("cnn")[0]
    (got,) = m.execute(call["inputs"])
    assert compare_outputs([got], call["executorch"], *MANIFEST["cnn"]["tol_executorch"]) is None
    args = _delegate_args(m)
    values = m.values()
    assert got.data_ptr() == values[m.state.outputs[0].slot].data_ptr()
    binder = _runners(m)["_xnnpack_et_run"].__globals__["_binder"]
    assert binder.key == tuple(values[a].data_ptr() for a in args)


def test_tensors_are_handed_over_once_while_their_memory_stays(et: None) -> None:
    """Planned tensors keep their addresses: ExecuTorch's set_inputs runs on the first call
    only, also for inputs ptexec keeps as expanded views (copied to the same dense memory
    each call)."""
    for name in ("mlp", "op_bmm"):
        m = _method(name, xnnpack="executorch")
        binder = _runners(m)["_xnnpack_et_run"].__globals__["_binder"]
        real = binder.bind
        seen: list[int] = []
        binder.bind = lambda ns, key, ts, *given, real=real, seen=seen: (
            seen.append(1),
            real(ns, key, ts, *given),
        )
        call = _calls(name)[0]
        for _ in range(3):
            got = m.execute(call["inputs"])
            assert (
                compare_outputs(got, call["executorch"], *MANIFEST[name]["tol_executorch"]) is None
            )
        assert len(seen) == 1, name


def test_planned_tensors_take_the_short_way_and_others_the_long_one(et: None) -> None:
    """While the delegate call's arguments are the method's planned tensors handed over
    last, a call is the pool check and ``execute``; other tensors (and the planned ones
    after them, and after the pool changed) are handed over again, and every call writes
    what ExecuTorch's runtime computes."""
    from executorch.runtime import Runtime

    name = "mlp"
    m = _method(name, xnnpack="executorch")
    ref = Runtime.get().load_program(DIR / MANIFEST[name]["pte"]).load_method("forward")
    fn = _runners(m)["_xnnpack_et_run"]
    ns = fn.__globals__
    binder = ns["_binder"]
    real = binder.bind
    binds: list[int] = []
    binder.bind = lambda ns, key, ts, *given: (binds.append(1), real(ns, key, ts, *given))
    args = _delegate_args(m)
    (x,) = _calls(name)[0]["inputs"]

    def check(expected_binds: int) -> None:
        y = torch.randn_like(x)
        (got,) = m.execute([y])
        (want,) = ref.execute([y])
        assert torch.equal(got, want.clone())
        assert len(binds) == expected_binds

    check(1)
    values = m.values()
    assert all(ns[f"_o{k}"] is values[a] for k, a in enumerate(args))  # open
    check(1)
    # other tensors (a copy of each argument): handed over, written, the way closed
    others = [values[a].clone() for a in args]
    others[-1].zero_()
    fn(*others)
    assert len(binds) == 2 and ns["_o0"] is None
    (want,) = ref.execute([others[0]])
    assert torch.equal(others[-1], want.clone())
    check(3)  # the planned tensors again: handed over again, the way open again
    assert ns["_o0"] is values[args[0]]
    check(3)
    # a new thread pool: the program is loaded again and the tensors handed over again
    before = ptexec.get_num_threads()
    try:
        ptexec.set_num_threads(2 if before == 1 else 1)
        check(4)
    finally:
        ptexec.set_num_threads(before)
    check(5)
    check(5)


def _random_calls_agree(
    m: ptexec.Method, name: str, seed: int, holds: Callable[[], bool] = lambda: True
) -> None:
    """Four calls of ``m`` on random inputs each return what ExecuTorch's runtime returns
    and exactly what a new method's first call (handing every tensor over) returns; after
    each, ``holds()``."""
    from executorch.runtime import Runtime

    em = Runtime.get().load_program(DIR / MANIFEST[name]["pte"]).load_method("forward")
    gen = torch.Generator().manual_seed(seed)
    inputs = _calls(name)[0]["inputs"]
    for _ in range(4):
        xs = [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in inputs]
        got = m.execute(xs)
        want = [w.clone() for w in em.execute(xs)]
        assert compare_outputs(got, want, *MANIFEST[name]["tol_executorch"]) is None
        first = _method(name, xnnpack="executorch").execute(xs)
        assert all(torch.equal(g, f) for g, f in zip(got, first, strict=True))
        assert holds()


def _et_runners(m: ptexec.Method) -> list[Any]:
    """The generated functions through which ``m`` calls ExecuTorch's delegates."""
    return [
        f
        for chain in m.state.chains
        for st in chain.statements
        for f in st.env.values()
        if getattr(f, "__name__", "") == "_xnnpack_et_run"
    ]


def test_views_the_method_holds_take_the_short_way(et: None) -> None:
    """Delegate calls that read views of planned memory the method holds from call to call
    (expanded attention scores, say) take the short way too, and every call returns what
    ExecuTorch's runtime returns, and exactly what a method's first call (handing every
    tensor over) returns."""
    name = "op_attention"
    m = _method(name, xnnpack="executorch")
    _random_calls_agree(m, name, 11)
    runners = _et_runners(m)
    assert len(runners) == 4 and all(f.__globals__["_o0"] is not None for f in runners)
    # some argument held is not the planned tensor of its value: a view of planned memory
    assert any(
        f.__globals__[f"_o{k}"] is not made
        for f in runners
        for k, made in enumerate(f.__globals__["_binder"].planned)
    )


@pytest.mark.parametrize("name", ["op_bmm", "op_attention"])
def test_strided_views_take_the_short_way(et: None, name: str) -> None:
    """Delegate calls reading a strided view the method holds (an expand: handed over as a
    dense copy, copied into it again on each call) take the short way, hand over nothing
    again, and every call returns exactly what a method's first call (handing every
    tensor over) returns, and what ExecuTorch's runtime returns."""
    m = _method(name, xnnpack="executorch")
    runners = _et_runners(m)
    binds: list[int] = []
    for f in runners:
        binder = f.__globals__["_binder"]
        binder.bind = lambda ns, key, ts, *given, real=binder.bind: (
            binds.append(1),
            real(ns, key, ts, *given),
        )
    # after each call: the first call's bindings only
    _random_calls_agree(m, name, 5, lambda: len(binds) == len(runners))
    assert all(f.__globals__["_o0"] is not None for f in runners)
    if name == "op_bmm":  # its two expanded operands are copied on the short way
        assert sum(len(f.__globals__["_dc"]) for f in runners) == 2


@pytest.mark.parametrize("name", ["op_add", "transformer", "dynconv_padmodes_int8_dynamic_pc"])
def test_delegate_chains_settle(et: None, name: str) -> None:
    """A straight-line chain of XNNPACK delegate calls (ExecuTorch's runner) and sized
    kernels settles: XNNPACK computes its outputs' sizes from its inputs' sizes, so once a
    call leaves the table as it found it the fast call skips the outputs' checks (and
    copies between planned tensors as bytes); every call still returns what ExecuTorch's
    runtime returns, and exactly what a method's first call returns."""
    m = _method(name, xnnpack="executorch")
    assert "_unsettled" in m.source()
    _random_calls_agree(m, name, 9)


def test_unplanned_inputs_are_shared_per_call(et: None) -> None:
    """A program with unplanned inputs reads the caller's memory: a new caller tensor is a
    new address, handed over again, and the results follow the inputs."""
    m = _method("dynamic_mlp", xnnpack="executorch")
    ref = _method("dynamic_mlp", xnnpack="torch")
    for call in _calls("dynamic_mlp"):
        (x,) = call["inputs"]
        (got,) = m.execute([x])
        (want,) = ref.execute([x])
        assert got.shape == want.shape == (x.shape[0], 4)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_dynamic_output_shapes_follow_each_call(et: None) -> None:
    m = _method("dynamic_mlp_int8_dynamic_pc", xnnpack="executorch", outputs="view")
    entry = MANIFEST["dynamic_mlp_int8_dynamic_pc"]
    for call in _calls("dynamic_mlp_int8_dynamic_pc"):
        got = m.execute(call["inputs"])
        assert got[0].shape[0] == call["inputs"][0].shape[0]
        assert compare_outputs(got, call["executorch"], *entry["tol_executorch"]) is None


def test_dynamic_output_shapes_are_read_once_per_input_shape(et: None) -> None:
    """ExecuTorch's get_attribute (the shape XNNPACK computed) runs after the first call of
    a hand-over whose input shapes the runner has not met; the shapes read are kept for
    those input shapes, so alternating shapes (a prompt, then decode steps) read nothing
    more, and an output resized elsewhere since gets the kept shape back."""
    name = "dynamic_mlp_int8_dynamic_pc"
    m = _method(name, xnnpack="executorch", outputs="view")
    ref = _method(name, xnnpack="torch")
    fn = _runners(m)["_xnnpack_et_run"]
    real = fn.__globals__["_get"]
    reads: list[str] = []

    def counted(attr: str) -> Any:
        reads.append(attr)
        return real(attr)

    fn.__globals__["_get"] = counted
    # (a runner of the same program freed by an earlier test may have been taken over,
    # with the shapes it kept)
    fn.__globals__["_memo"].clear()
    features = _calls(name)[0]["inputs"][0].shape[1:]
    small, large = (torch.randn(n, *features) for n in (3, 7))
    other = torch.randn(3, *features)  # small's shape, other values
    expected_reads = 0
    # a new shape is a new hand-over, read once; the same tensor again is not; a shape met
    # before is a new hand-over, not read
    steps = ((small, True), (small, False), (large, True), (large, False))
    steps += ((other, False), (large, False), (small, False))
    for x, new in steps:
        (got,) = m.execute([x])
        (want,) = ref.execute([x])
        expected_reads += 1 if new else 0
        assert got.shape == want.shape == (x.shape[0], *want.shape[1:])
        assert compare_outputs([got], [want], *MANIFEST[name]["tol_executorch"]) is None
        assert len(reads) == expected_reads
    # the method's tensor resized elsewhere (same memory, another shape): given the shape
    # kept for the inputs' (a view output is the caller's own tensor: resizing it reaches
    # nothing of the method's)
    m.values()[m.state.outputs[0].slot].resize_(1, got.shape[1])
    (again,) = m.execute([x])
    assert len(reads) == expected_reads
    assert again.shape == (x.shape[0], got.shape[1])
    assert compare_outputs([again], [want], *MANIFEST[name]["tol_executorch"]) is None


def test_output_shapes_are_checked_against_their_bounds_and_kept() -> None:
    """The shapes a runner reads back are refused beyond an output's declared bound (any
    dim, or another rank) or in other memory, and kept, with their dense strides in the
    output's dim order, under the inputs' shapes, at most MEMO_SHAPES of them."""
    from ptexec.delegates.xnnpack import executorch_runner as er
    from ptexec.delegates.xnnpack.runtime import OutputShapeError

    x = torch.empty(64)  # (room for the shapes refused below)
    outputs = ((4, "ptexec_output_4", (0, 2, 1), (2, 5, 3)),)

    def get_as(shape: tuple[int, ...], base: torch.Tensor = x) -> Callable[[str], torch.Tensor]:
        def get(name: str) -> torch.Tensor:
            assert name == "ptexec_output_4"
            return base[: int(torch.tensor(shape).prod())].view(shape)

        return get

    memo: dict[tuple[Any, ...], Any] = {}
    got = er._output_shapes(get_as((2, 4, 3)), outputs, (x,), memo, ((2, 4),))
    assert got == ((torch.Size((2, 4, 3)), (12, 1, 4)),)
    assert memo == {((2, 4),): got}
    for beyond in ((3, 4, 3), (2, 6, 1), (2, 4, 4), (2, 4)):
        with pytest.raises(OutputShapeError, match=r"float32\[2, 5, 3\]"):
            er._output_shapes(get_as(beyond), outputs, (x,), memo, ("other",))
    with pytest.raises(RuntimeError, match="wrote elsewhere"):
        er._output_shapes(get_as((1, 1, 1), torch.empty(1)), outputs, (x,), memo, ("other",))
    assert list(memo) == [((2, 4),)]  # nothing refused was kept
    for k in range(er.MEMO_SHAPES):
        er._output_shapes(get_as((1, 1, 1)), outputs, (x,), memo, (k,))
    assert len(memo) == 1 and (er.MEMO_SHAPES - 1,) in memo  # full: forgotten, then kept


def test_sys_spec_is_settled_once_executorch_is_loaded(et: None) -> None:
    """ExecuTorch's pybindings import ``sys`` from C on every call; its spec carries
    ``_initializing`` (False) as every importlib-made module's does, so that import does
    not raise and clear an AttributeError each time."""
    _method("mlp", xnnpack="executorch")
    assert getattr(sys.__spec__, "_initializing", None) is False


def test_executorch_without_its_backend_is_a_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ptexec.delegates.xnnpack import executorch_runner

    monkeypatch.setattr(
        executorch_runner, "_pybindings", lambda: "ExecuTorch's runtime is not installed"
    )
    with pytest.raises(BackendUnavailableError, match=r"xnnpack='executorch'.*not installed"):
        _method("mlp", xnnpack="executorch")
    m = _method("mlp")  # auto: ptexec's runner
    assert set(_runners(m)) == {"_xnnpack_run"}
    call = _calls("mlp")[0]
    assert compare_outputs(m.execute(call["inputs"]), call["executorch"], 1e-4, 1e-5) is None


def test_ptexec_runs_xnnpack_programs_without_executorch_installed() -> None:
    """In a process where ``import executorch`` fails, 'auto' runs ptexec's own runner and
    'executorch' is a BackendUnavailableError."""
    code = f"""
import sys
sys.modules["executorch"] = None  # import executorch -> ImportError
import torch, ptexec
from ptexec.errors import BackendUnavailableError
prog = ptexec.load({str(DIR / "mlp.pte")!r})
m = prog.load_method("forward")
out, = m.execute([torch.ones(2, 8)])
assert out.shape == (2, 4), out.shape
try:
    prog.load_method("forward", xnnpack="executorch")
except BackendUnavailableError as e:
    assert "not installed" in str(e), e
else:
    raise SystemExit("xnnpack='executorch' loaded without executorch")
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


# -- the one-delegate program ----------------------------------------------------------------


def test_one_delegate_program_reads_back() -> None:
    """ptexec's reader gives back what the writer was given: the tensors (unplanned), one
    method taking them all, one DelegateCall over them, the payload and the named data."""
    prog = ptexec.load(DIR / MANIFEST["mlp_int8_dynamic_pc"]["pte"])
    plan = prog.pte.program.execution_plan[0]
    (call,) = [i for i in plan.chains[0].instructions if isinstance(i, p.DelegateCall)]
    tensors = [plan.values[a] for a in call.args]
    assert all(isinstance(t, p.Tensor) for t in tensors)
    delegate = plan.delegates[call.delegate_index]
    payload = prog.pte.delegate_data(delegate.processed)
    keys = {
        e.named_key for e in decode_payload(payload).graph.constant_data if e.named_key is not None
    }
    assert keys, "the fixture's weights are named data"
    named = {k: prog.named_data[k] for k in sorted(keys)}
    data = one_delegate_program(
        tensors,  # type: ignore[arg-type]
        delegate.id,
        payload,
        delegate.compile_specs,
        named,
        {1: "out"},
    )
    back = read_pte(data)
    bplan = back.program.execution_plan[0]
    assert bplan.name == "forward"
    n = len(tensors)
    assert bplan.inputs == tuple(range(n)) and bplan.outputs == ()
    for t, u in zip(tensors, bplan.values, strict=True):
        assert isinstance(t, p.Tensor) and isinstance(u, p.Tensor)
        assert (u.scalar_type, u.sizes, u.dim_order, u.shape_dynamism) == (
            t.scalar_type,
            t.sizes,
            t.dim_order,
            t.shape_dynamism,
        )
        assert u.allocation_info is None and u.data_buffer_idx == 0
    u1 = bplan.values[1]
    assert isinstance(u1, p.Tensor) and u1.extra_tensor_info is not None
    assert u1.extra_tensor_info.fully_qualified_name == "out"
    (bcall,) = bplan.chains[0].instructions
    assert isinstance(bcall, p.DelegateCall) and bcall.args == tuple(range(n))
    bdelegate = bplan.delegates[0]
    assert bdelegate.id == delegate.id
    assert bytes(back.delegate_data(bdelegate.processed)) == bytes(payload)
    assert [(s.key, s.value) for s in bdelegate.compile_specs] == [
        (s.key, s.value) for s in delegate.compile_specs
    ]
    assert {k: bytes(v) for k, v in back.named_data().items()} == {
        k: bytes(v) for k, v in named.items()
    }
    for ref in back.segments:
        assert ref.offset % 16 == 0  # XNNPACK reads constants in place


def test_executorchs_deserializer_reads_a_delegate_program() -> None:
    """ExecuTorch's Python deserializer reads the written program (it takes the program's
    list of inline delegate data as present, where the schema leaves every list optional)
    and finds the payload where the runtime does."""
    serialize = pytest.importorskip("executorch.exir._serialize._program")
    t = p.Tensor(6, 0, (2,), (0,), False, 0, None, 0, p.STATIC, None)
    data = one_delegate_program([t, t], "XnnpackBackend", b"payload")
    program = serialize.deserialize_pte_binary(data).program
    (plan,) = program.execution_plan
    assert plan.name == "forward" and list(plan.inputs) == [0, 1]
    (delegate,) = plan.delegates
    assert delegate.id == "XnnpackBackend"
    # the deserializer moves segment payloads inline
    assert [bytes(d.data) for d in program.backend_delegate_data] == [b"payload"]


def _single_delegate(name: str) -> bool:
    plan = ptexec.load(DIR / MANIFEST[name]["pte"]).pte.program.execution_plan[0]
    return all(isinstance(i, p.DelegateCall) for i in plan.chains[0].instructions)


def test_a_delegate_program_names_only_its_tensors() -> None:
    t = p.Tensor(6, 0, (2,), (0,), False, 0, None, 0, p.STATIC, None)
    with pytest.raises(ValueError, match="at least one call"):
        delegate_program([t], [])
    with pytest.raises(ValueError, match="beyond 1"):
        delegate_program([t], [DelegateCallSpec("XnnpackBackend", b"", (), (0, 1))])


def test_consecutive_delegate_calls_as_one_written_program(et: None) -> None:
    """Two consecutive XNNPACK calls (the second reads what the first writes) written as one
    program over the union of their tensors, every one an unplanned input: ExecuTorch's
    runtime runs both in one execute() and writes exactly what it writes running the
    original file."""
    from executorch.extension.pybindings import _C
    from executorch.runtime import Runtime

    from ptexec.dtypes import CODE_TO_DTYPE
    from ptexec.tensor import dim_order_strides

    name = "dynconv_int8_dynamic_pc"
    prog = ptexec.load(DIR / MANIFEST[name]["pte"])
    plan = prog.pte.program.execution_plan[0]
    calls = list(plan.chains[0].instructions)
    assert len(calls) == 2 and all(isinstance(c, p.DelegateCall) for c in calls)
    slots: list[int] = []
    specs = []
    named: dict[str, Any] = {}
    for c in calls:
        assert isinstance(c, p.DelegateCall)
        slots += [a for a in c.args if a not in slots]
        delegate = plan.delegates[c.delegate_index]
        payload = prog.pte.delegate_data(delegate.processed)
        for e in decode_payload(payload).graph.constant_data:
            if e.named_key is not None:
                named[e.named_key] = prog.named_data[e.named_key]
        args = tuple(slots.index(a) for a in c.args)
        specs.append(DelegateCallSpec(delegate.id, payload, delegate.compile_specs, args))
    assert set(calls[0].args) & set(calls[1].args), "the second call reads the first's output"
    tensors = [plan.values[s] for s in slots]
    data = delegate_program(tensors, specs, {k: named[k] for k in sorted(named)})  # type: ignore[arg-type]
    method = _C._load_program_from_buffer(data).load_method("forward")
    em = Runtime.get().load_program(DIR / MANIFEST[name]["pte"]).load_method("forward")
    for call in _calls(name):
        (x,) = call["inputs"]
        values: dict[int, torch.Tensor] = {}
        for s, t in zip(slots, tensors, strict=True):
            assert isinstance(t, p.Tensor)
            strides = dim_order_strides(tuple(t.sizes), tuple(t.dim_order))
            values[s] = torch.empty_strided(t.sizes, strides, dtype=CODE_TO_DTYPE[t.scalar_type])
            values[s].fill_(7)
        values[plan.inputs[0]].copy_(x)
        method.set_inputs([values[s] for s in slots])
        method.execute()
        want = [w.clone() for w in em.execute([x])]
        got = [values[s] for s in plan.outputs]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and torch.equal(g, w)


@pytest.mark.parametrize("name", [n for n in sorted(MANIFEST) if _single_delegate(n)])
def test_bit_identical_to_executorch_on_one_delegate_programs(name: str, et: None) -> None:
    """Where the whole program is XNNPACK delegate calls, ptexec with xnnpack='executorch'
    returns exactly what ExecuTorch's runtime returns in the same process (the same
    kernels on the same memory), dynamic shapes and quantized recipes included."""
    from executorch.runtime import Runtime

    em = Runtime.get().load_program(DIR / MANIFEST[name]["pte"]).load_method("forward")
    m = _method(name, xnnpack="executorch")
    for call in _calls(name):
        got = m.execute(call["inputs"])
        want = [x.clone() for x in em.execute(call["inputs"])]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert torch.equal(g, w), name


def test_quantization_parameters_xnnpack_refuses_are_not_handed_to_it() -> None:
    """A filter scale made huge (a fuzzer's edit of a real int8 network): XNNPACK would
    refuse the requantization when ExecuTorch creates its operators, and ExecuTorch's
    runtime then aborts the process. ptexec checks first: "executorch" is refused with
    the reason, "auto" runs the payload with ptexec's runner."""
    pytest.importorskip("executorch")
    path = Path(__file__).parent / "fuzz_corpus"
    data = (path / "crash-xnnpack-mobilenet_v3_small_int8_static_pc-244932a057.pte").read_bytes()
    with pytest.raises(ptexec.BackendUnavailableError, match="requantizes by"):
        ptexec.load(data).load_method("forward", xnnpack="executorch")
    m = ptexec.load(data).load_method("forward", xnnpack="auto")
    x = torch.randn(*m.meta.inputs[0].sizes)  # type: ignore[union-attr]
    (out,) = m.execute([x])
    assert out.shape == tuple(m.meta.outputs[0].sizes)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "name", ["mlp_int8_static_pc", "qops_int8_static_pc", "cnn_int8_static_pt"]
)
def test_nan_is_quantized_as_xnnpack_quantizes_it(et: None, name: str) -> None:
    """XNNPACK's float-to-int8 Convert saturates NaN to the top of the range, as +inf (its
    x86 kernels' clamp): ExecuTorch's kernels give finite outputs. ptexec's own runner
    (``xnnpack="torch"``: on CUDA, and what the compiled tier traces) kept NaN, so a NaN
    input made whole rows NaN there."""
    inputs = [x.clone() for x in _calls(name)[0]["inputs"]]
    inputs[0].reshape(-1)[1] = float("nan")
    theirs = _method(name, xnnpack="auto").execute([x.clone() for x in inputs])
    ours = _method(name, xnnpack="torch").execute([x.clone() for x in inputs])
    for a, b in zip(theirs, ours, strict=True):
        assert not torch.isnan(a).any()
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


def test_a_payload_executorch_computes_wrongly_runs_ptexecs_own(et: None) -> None:
    """Rows quantized per row against 4-bit weights per channel over an odd number of input
    channels: ExecuTorch 1.5.1's XNNPACK backend gives every row but the first wrong (equal
    rows, different results), so ``auto`` runs ptexec's own runner, which agrees with eager
    PyTorch; ``executorch`` refuses the payload rather than return those numbers."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import make_xnnpack_fixtures as mk

    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3).eval()
    example = (torch.randn(8, 5),)
    quantized = mk._quantize_pt2e(model, example, [example], "int8_dynamic_int4w_pc", None)
    data = mk._lower(quantized, example, "int8_dynamic_int4w_pc", None).buffer
    prog = ptexec.load(data)
    (delegate,) = prog.pte.program.execution_plan[0].delegates
    payload = decode_payload(prog.pte.delegate_data(delegate.processed))
    assert "5 input channels, an odd number" in (backend.miscomputed(payload) or "")
    x = torch.randn(1, 5).repeat(8, 1)  # eight equal rows
    auto = ptexec.load(data).load_method("forward")
    assert set(_runners(auto)) == {"_xnnpack_run"}
    (got,) = auto.execute([x])
    (want,) = ptexec.load(data).load_method("forward", xnnpack="torch").execute([x])
    assert torch.equal(got, want) and torch.equal(got, got[:1].expand(8, 3))
    torch.testing.assert_close(got, quantized(x))  # eager PyTorch
    with pytest.raises(BackendUnavailableError, match="computes wrongly"):
        ptexec.load(data).load_method("forward", xnnpack="executorch")
