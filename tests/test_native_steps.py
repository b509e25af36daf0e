"""Native steps (:mod:`ptexec.native`): runs of statements called from C++ compute
what the Python statements compute, bit for bit, and fail, warn and recover as they do.

Each fixture is run with the steps and without (``PTEXEC_NATIVE_STEPS=0`` when it is
loaded): outputs (dtype, sizes, strides, values) and the program's recorded outputs must
agree, call after call. The library is built into the test session's cache once."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from ptexec import native

FIX = Path(__file__).parent / "fixtures"
# every fixture with recorded calls, each program once (openvino's need OpenVINO)
PROGRAMS = sorted(
    p
    for p in FIX.rglob("*.pte")
    if p.with_suffix(".io.pt").exists() and p.parent.name not in ("openvino", "vulkan")
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the native steps are built on Linux"
)


@pytest.fixture(scope="module")
def library() -> Any:
    found = native.wait()
    assert found is not None, native.unavailable()
    return found


def _load(
    path: Path, method: str, steps: bool, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> Any:
    with monkeypatch.context() as m:
        m.setenv("PTEXEC_NATIVE_STEPS", "1" if steps else "0")
        return ptexec.load(path).load_method(method, **options)


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), where
        if a.numel():
            assert a.stride() == b.stride(), where
        assert torch.equal(a, b) or (
            a.is_floating_point()
            and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.nan_to_num(), b.nan_to_num())
        ), where
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert type(a) is type(b) and a == b, where


def _clone(x: Any) -> Any:
    return x.clone() if isinstance(x, torch.Tensor) else x


def test_the_library_builds_and_loads(library: Any) -> None:
    assert native.unavailable() is None
    assert native.copies() is library.copies


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: str(p.relative_to(FIX)))
def test_native_steps_compute_what_the_statements_compute(
    library: Any, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = torch.load(path.with_suffix(".io.pt"), weights_only=False)["calls"]
    methods: dict[str, tuple[Any, Any]] = {}
    for n, call in enumerate(calls):
        name = call.get("method", "forward")
        if name not in methods:
            # a program placed on a device no test machine may have runs on the CPU
            options = {} if torch.cuda.is_available() else {"device_map": "cpu"}
            try:
                methods[name] = (
                    _load(path, name, True, monkeypatch, **options),
                    _load(path, name, False, monkeypatch, **options),
                )
            except ptexec.BackendUnavailableError as e:  # (a backend this machine lacks)
                pytest.skip(str(e))
        with_steps, without = methods[name]
        inputs = [_clone(x) for x in call["inputs"]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = with_steps.execute([_clone(x) for x in inputs])
            want = without.execute([_clone(x) for x in inputs])
        assert len(got) == len(want)
        for k, (a, b) in enumerate(zip(got, want, strict=True)):
            _same(a, b, f"{path.name} call {n} output {k}")


def test_the_tiny_programs_run_as_native_steps(library: Any) -> None:
    for name in ("mlp", "int_ops", "stateful", "dynamic_mlp"):
        m = ptexec.load(FIX / f"{name}.pte").load_method("forward")
        assert "_s = _n" in m.source(), name


def test_a_step_that_fails_is_reported_on_its_instruction_and_the_method_recovers(
    library: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mlp's first addmm (instruction 1) reads a weight given other sizes (in place: the
    same object): both paths raise the same ExecutionError on that instruction; with the
    weight back, the next call is right."""
    x = torch.load(FIX / "mlp.io.pt", weights_only=False)["calls"][0]["inputs"][0]
    errors = []
    for steps in (True, False):
        m = _load(FIX / "mlp.pte", "forward", steps, monkeypatch)
        assert ("_s = _n1.run(" in m.source()) is steps
        want = m.execute([x])[0].clone()
        v = m.state.values
        weight = v[5]
        kept = (weight.untyped_storage(), weight.storage_offset(), weight.shape, weight.stride())
        weight.set_(torch.zeros(3, 3))
        with pytest.raises(ptexec.ExecutionError) as info:
            m.execute([x])
        errors.append((info.value.instruction, info.value.operator, str(info.value)))
        weight.set_(*kept)
        assert torch.equal(m.execute([x])[0], want)
    assert errors[0] == errors[1]
    assert errors[0][:2] == (1, "aten::addmm.out")


def test_a_step_that_warns_warns_as_the_statement_does(
    library: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An out of other sizes than its kernel gives it is resized by torch with a warning:
    the step stops, the statement runs in Python and warns there, as without the steps;
    the results agree."""
    x = torch.load(FIX / "mlp.io.pt", weights_only=False)["calls"][0]["inputs"][0]
    results = []
    messages = []
    for steps in (True, False):
        m = _load(FIX / "mlp.pte", "forward", steps, monkeypatch)
        out = m.state.values[9]  # the first addmm's out, (2, k)
        with pytest.warns(UserWarning, match="resized") as caught:
            out.resize_(1, 1)
            results.append(m.execute([x])[0])
        messages.append([(w.category, str(w.message)) for w in caught])
    _same(results[0], results[1], "after the warning")
    assert messages[0] == messages[1]  # torch's own text ("Triggered internally at ...")


def test_tensor_forms_of_scalar_ops_are_the_overloads_torch_dispatches() -> None:
    """The statements of ``*.Scalar_out`` ops call torch's function with a 0-d tensor:
    their native form names the overload that call reaches."""
    from ptexec.kernels import aten

    for name, (overload, alpha) in aten._TENSOR_FORMS.items():
        fn: Any = aten._SCALAR_OPS[name]
        a = torch.ones(3, dtype=torch.int64)
        b = torch.tensor(2, dtype=torch.int64)
        out = torch.empty(3, dtype=torch.int64)
        if name.split("::")[1].split(".")[0] in ("eq", "ne", "lt", "le", "gt", "ge"):
            out = torch.empty(3, dtype=torch.bool)
        mode = aten._FirstOp()
        with pytest.raises(aten._Dispatched), mode:
            fn(a, b, out=out)
        base = name.split("::")[1].split(".")[0]
        op = getattr(getattr(torch.ops.aten, base), overload)
        assert mode.first is op, name
        assert ("alpha" in [x.name for x in op._schema.arguments]) is alpha, name


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2, 3),
        lambda: torch.randn(3, 2).t(),
        lambda: torch.randn(1, 4).as_strided((1, 4), (7, 1)),
        lambda: torch.randn(2, 3).neg().conj(),
        lambda: torch.randn(2, 3, dtype=torch.complex64).conj(),
        lambda: torch.tensor([True, False]),
        lambda: torch.randn(2, 2, dtype=torch.bfloat16),
        lambda: torch.empty(0, 3),
        lambda: torch.tensor(5),
        lambda: torch.randn(2, 3)._neg_view(),
        lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8),
    ],
)
def test_copies_are_clones(library: Any, make: Any) -> None:
    x = make()
    (got,) = library.copies([x])
    want = x.clone()
    assert (got.dtype, got.shape, got.stride(), got.is_neg(), got.is_conj()) == (
        want.dtype,
        want.shape,
        want.stride(),
        want.is_neg(),
        want.is_conj(),
    )
    if x.is_quantized:
        assert torch.equal(got.dequantize(), want.dequantize())
    else:
        assert torch.equal(got.resolve_neg().resolve_conj(), want.resolve_neg().resolve_conj())
    assert got.data_ptr() != x.data_ptr() or x.numel() == 0


def test_the_library_is_kept_checked_and_never_loaded_when_changed(tmp_path: Path) -> None:
    """Built into a cache root once, found there by the next process (loaded at once);
    a library changed on disk is not loaded (the entry fails its manifest)."""
    script = textwrap.dedent(
        """
        import sys, warnings
        warnings.simplefilter("ignore")
        from ptexec import native
        found = native.module()
        print("found" if found is not None else "missing")
        if sys.argv[1] == "wait":
            print("built" if native.wait() is not None else native.unavailable())
        """
    )
    env = {**os.environ, "PTEXEC_CACHE_DIR": str(tmp_path / "cache"), "PTEXEC_NATIVE_STEPS": "1"}

    def run(how: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", script, how],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return done.stdout.split()

    assert run("wait") == ["missing", "built"]
    assert run("now") == ["found"]
    (library,) = list((tmp_path / "cache").rglob("*ptexec_steps.so"))
    with open(library, "ab") as f:
        f.write(b"\0")
    assert run("now") == ["missing"]
    # a library kept with its digest that does not load here is dropped and built again
    junk = b"not a library"
    library.write_bytes(junk)
    library.with_name(library.name.split("-")[0] + ".sha256").write_text(
        hashlib.sha256(junk).hexdigest()
    )
    assert run("wait") == ["missing", "built"]
    assert run("now") == ["found"] and library.read_bytes() != junk


@pytest.mark.parametrize(
    "compiler", ["/nonexistent/g++", "fails", "/tmp/\udcff/g++"], ids=["missing", "fails", "bytes"]
)
def test_a_compiler_that_cannot_build_leaves_the_python_statements(
    compiler: str, tmp_path: Path
) -> None:
    """No compiler, one that fails (saying so in bytes that are no UTF-8), or a path that
    is no text: loads and calls go on without the steps, and ``unavailable`` says why."""
    if compiler == "fails":
        script = tmp_path / "cxx.sh"
        script.write_bytes(b"#!/bin/sh\nprintf '\\377 no\\n' >&2\nexit 1\n")
        script.chmod(0o755)
        compiler = str(script)
    code = textwrap.dedent(
        f"""
        import warnings
        warnings.simplefilter("ignore")
        import torch, ptexec
        from ptexec import native
        m = ptexec.load({str(FIX / "mlp.pte")!r}).load_method("forward")
        m.execute([torch.ones(2, 8)])
        native.wait()
        print(native.unavailable() or "none")
        m = ptexec.load({str(FIX / "mlp.pte")!r}).load_method("forward")
        print(m.execute([torch.ones(2, 8)])[0].shape)
        """
    )
    env = {
        **os.environ,
        "PTEXEC_CACHE_DIR": str(tmp_path / "cache"),
        "PTEXEC_NATIVE_STEPS": "1",
        "CXX": compiler,
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={k: v.encode("utf-8", "surrogateescape") for k, v in env.items()},
        capture_output=True,
        text=True,
        errors="replace",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    why, shape = done.stdout.splitlines()[-2:]
    assert why.startswith("the native steps could not be built"), why
    assert shape == "torch.Size([2, 4])"


def test_off_means_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTEXEC_NATIVE_STEPS", "0")
    assert native.module() is None and native.copies() is None
    assert native.unavailable() == "PTEXEC_NATIVE_STEPS=0"
    m = ptexec.load(FIX / "mlp.pte").load_method("forward")
    assert "_s = _n" not in m.source()


def test_a_template_binds_each_loads_tensors_and_keeps_none(library: Any) -> None:
    """Steps made as a template (where each tensor comes from in a values table) hold no
    tensor; bound to a table they run on its tensors, lists of tensors and of optional
    tensors (``index``'s indices) included; a template itself does not run."""
    import gc
    import weakref

    x = torch.arange(12.0).reshape(3, 4)
    idx = torch.tensor([2, 0])
    out = torch.empty(2, 4)
    parts = [torch.empty(1, 4), torch.empty(2, 4)]
    table = [x, idx, out, parts[0], parts[1]]
    template = library.Steps()
    template.add(
        "aten::index", "Tensor_out", [x, [idx], out], [], [], [(1, [0]), (2, [1]), (1, [2])], [], []
    )
    template.add(
        "aten::split_with_sizes_copy",
        "out",
        [x, [1, 2], 0, parts],
        [],
        [],
        [(1, [0]), (0, []), (0, []), (2, [3, 4])],
        [],
        [],
    )
    with pytest.raises(RuntimeError, match="template"):
        template.run(True)
    kept = weakref.ref(x)
    for k in range(2):
        table = [torch.arange(12.0).reshape(3, 4) + k, idx, torch.empty(2, 4)]
        table += [torch.empty(1, 4), torch.empty(2, 4)]
        steps = template.bind(table)
        assert steps.run(True) == -1
        assert torch.equal(table[2], table[0][idx])
        assert torch.equal(table[3], table[0][:1]) and torch.equal(table[4], table[0][1:])
    del x, table, steps
    gc.collect()
    assert kept() is None  # the template never held the first table's tensor


def test_an_index_out_of_range_fails_alike(library: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """int_ops gathers embedding rows by its first input (a step of index_select's out form
    on views of the indices and the out, as the statement gathers): an index past the
    table fails on that instruction with torch's message either way, and the method goes
    on."""
    inputs = torch.load(FIX / "int_ops.io.pt", weights_only=False)["calls"][0]["inputs"]
    outcomes = []
    for steps in (True, False):
        m = _load(FIX / "int_ops.pte", "forward", steps, monkeypatch)
        assert ("_s = _n0.run(" in m.source()) is steps
        bad = [inputs[0].clone().fill_(10**6), *inputs[1:]]
        with pytest.raises(ptexec.ExecutionError) as info:
            m.execute(bad)
        outcomes.append((info.value.instruction, str(info.value), m.execute(inputs)))
    assert outcomes[0][:2] == outcomes[1][:2] and outcomes[0][0] == 0
    assert "index out of range" in outcomes[0][1]
    for a, b in zip(outcomes[0][2], outcomes[1][2], strict=True):
        _same(a, b, "after the error")


def test_a_step_on_views_of_slots_and_its_fallback(library: Any) -> None:
    """A step may read a slot's tensor seen with other sizes (``Slots.view``: embedding
    as a row gather into its out seen as rows), the views made once per load. A load whose
    tensors cannot be seen so (indices that are not contiguous) makes the step of the
    call's fallback (embedding's own out form) instead, and a bound load that cannot
    raises, which leaves its statements to Python: every way gives embedding's rows."""
    from ptexec.engine.fastcall import _template
    from ptexec.kernels.registry import NativeCall, Slots

    plain = NativeCall(
        "aten::embedding", "out", (Slots((0,)), Slots((1,)), -1, False, False, Slots((2,)))
    )
    gather = NativeCall(
        "aten::index_select",
        "out",
        (Slots((0,)), 0, Slots((1,), view=(-1,)), Slots((2,), view=(-1, 4))),
        (),
        plain,
    )
    weight = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 9, 3], [0, 0, 7]])
    strided = torch.tensor([[1, 0], [9, 0], [3, 7]]).t()  # the same indices, not contiguous
    assert torch.equal(strided, ids) and not strided.is_contiguous()
    want = torch.nn.functional.embedding(ids, weight)
    for first in (ids, strided):
        template = _template(library, [weight, first, torch.empty(2, 3, 4)], [gather], [()])
        assert template is not None
        for table_ids in (ids, ids.clone()):
            table = [weight, table_ids, torch.full((2, 3, 4), float("nan"))]
            assert template.bind(table).run(True) == -1
            assert torch.equal(table[2], want)
    # made where the view works, bound where it does not: the load's statements are Python
    template = _template(library, [weight, ids, torch.empty(2, 3, 4)], [gather], [()])
    with pytest.raises(RuntimeError):
        template.bind([weight, strided, torch.empty(2, 3, 4)])


class _TwoLarge(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y


def test_large_inputs_are_copied_without_the_gil_as_small_ones(library: Any) -> None:
    """Inputs past the size from which ``Puts`` copies without the GIL (64 KB; 128 KB each
    here) are copied into their planned views as small ones are: dense ones as bytes,
    another layout and a lazy negation by torch, each call's values its own."""
    from export_util import export_program

    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(64, 512, generator=gen), torch.randn(64, 512, generator=gen)
    m = ptexec.load(export_program(_TwoLarge(), (x, y))).load_method("forward")
    assert "_put(inputs)" in m.source()
    wide = torch.randn(64, 1024, generator=gen)
    cases = [
        (x, y),
        (y, x),
        (wide[:, :512], y),  # another layout: torch's copy, the other as bytes
        (torch._neg_view(x), y.clone()),
        (x.t().contiguous().t(), y),
    ]
    for a, b in cases:
        got = m.execute([a, b])[0]
        assert torch.equal(got, a.clone() * 2 + b.clone())
        assert m.last_call.inputs == ["copy", "copy"]


def test_the_library_answers_under_its_earlier_name() -> None:
    """``ptexec.engine.native`` (the name the library had) gives the same functions."""
    from ptexec.engine import native as earlier

    assert earlier.wait is native.wait and earlier.module is native.module
    assert earlier.unavailable is native.unavailable and earlier.copies is native.copies


class _Sub(torch.Tensor):
    """A tensor subclass: the fast call's checks send it to the general path."""


def _variants(x: torch.Tensor) -> list[Any]:
    """An input's good, odd and bad forms for the inputs' checks."""
    cases: list[Any] = [
        x,
        x.clone(),
        x.double() if x.dtype != torch.float64 else x.float(),
        x.unsqueeze(0),
        torch.empty(x.shape, dtype=x.dtype, device="meta"),
        x.tolist(),
        3,
        None,
        x.as_subclass(_Sub),
        torch._neg_view(x) if x.dtype.is_floating_point else -x,
        torch._efficientzerotensor(x.shape, dtype=x.dtype),  # no memory: address 0
    ]
    if x.dtype != torch.bfloat16:  # (numpy has none)
        cases.append(x.numpy())
    if x.dim():
        cases += [x[:1], x[:0], torch.cat([x, x]).view(2, *x.shape)[1]]
    if x.dim() >= 2:
        cases.append(x.t().contiguous().t())  # the right sizes, another layout
        cases.append(x.to_sparse())
    if x.dtype.is_floating_point:
        cases += [x.clone().requires_grad_(), torch.nn.Parameter(x.clone())]
    return cases


@pytest.mark.parametrize(
    "name",
    [
        "mlp",
        "mlp_unplanned",
        "cond",
        "cond_unplanned",
        "int_ops",
        "scalar_io",
        "dynamic_mlp",
        "bf16_mlp_unplanned",
    ],
)
def test_the_guard_takes_exactly_the_calls_the_python_checks_take(
    library: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library's ``Guard`` checks the fast call's CPU tensor inputs of static or
    bounded shape in one call where it is loaded: every input the Python checks send to the general path,
    it sends there too, and every call they take it takes, with the same outcome (values,
    the call's record, or the error) and the same tensors, as a list or a tuple. Among the
    inputs: a view of the method's own planned memory (an output handed out as a view)."""
    from ptexec.engine import arguments

    general: list[bool] = []
    check = arguments.check_inputs

    def watched(*args: Any, **kwargs: Any) -> Any:
        general.append(True)
        return check(*args, **kwargs)

    monkeypatch.setattr(arguments, "check_inputs", watched)
    path = FIX / f"{name}.pte"
    guarded = _load(path, "forward", True, monkeypatch)
    plain = _load(path, "forward", False, monkeypatch)
    assert "_guard(inputs)" in guarded.source() and "_guard" not in plain.source()
    inputs = list(torch.load(path.with_suffix(".io.pt"), weights_only=False)["calls"][0]["inputs"])
    cases: list[list[Any]] = [list(inputs)]
    for k, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            cases += [[*inputs[:k], v, *inputs[k + 1 :]] for v in _variants(x)]
    cases += [inputs[:-1], [*inputs, inputs[-1]]]

    def outcome(m: Any, call: Any) -> tuple[Any, ...]:
        general.clear()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = m.execute(call)
        except Exception as e:
            return ("error", type(e), str(e), bool(general))
        rec = m.last_call
        return ("ok", result, (list(rec.inputs), rec.h2h), bool(general))

    taken = 0
    for n, case in enumerate(cases):
        for form in (list, tuple):
            a = outcome(guarded, form(case))
            b = outcome(plain, form(case))
            assert a[0] == b[0] and a[2:] == b[2:], (name, n, a, b)
            if a[0] == "ok":
                for k, (x, y) in enumerate(zip(a[1], b[1], strict=True)):
                    _same(x, y, f"{name} case {n} output {k}")
            taken += not a[3]
    assert taken >= 2  # (the recorded call, as a list and a tuple)
    # a view of each method's own planned memory (an output it handed out), as an input
    views = 0
    for k, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            continue
        found = []
        for m in (guarded, plain):
            for out in m.execute([_clone(y) for y in inputs], outputs="view"):
                if isinstance(out, torch.Tensor) and (out.shape, out.dtype) == (x.shape, x.dtype):
                    found.append(outcome(m, [*inputs[:k], out, *inputs[k + 1 :]]))
                    break
        if len(found) == 2:
            a, b = found
            assert a[0] == b[0] and a[2:] == b[2:], (name, k, a, b)
            views += 1
    if name in ("cond", "cond_unplanned"):
        assert views
