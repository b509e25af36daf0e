"""Lifetimes and leaks.

- 10,000 calls leave resident memory and the number of live Python objects flat (every
  binding path: planned copy, shared input, caller-given outputs, view outputs, refused
  inputs, failing kernels);
- outputs are copies by default and stay valid after the Method and Program are dropped;
  ``outputs="view"`` returns the method's memory, valid until the next call;
- a program loaded from bytes, a bytearray, a memoryview or a file object keeps what it
  needs alive; a Method keeps its Program alive; dropped programs are freed.
"""

from __future__ import annotations

import copy
import gc
import io
import os
import pickle
import subprocess
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import ptexec
from conftest import executorch_runtime
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance

# --------------------------------------------------------------------------------------
# measuring


def _rss() -> int | None:
    """Resident bytes of this process (Linux), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _flat(run: Callable[[int], None], calls: int, warmup: int = 1000) -> tuple[int | None, int]:
    """Run ``warmup`` calls, then ``calls`` more; (resident growth, live-object growth)."""
    run(warmup)
    gc.collect()
    rss0, objs0 = _rss(), len(gc.get_objects())
    run(calls)
    gc.collect()
    rss1, objs1 = _rss(), len(gc.get_objects())
    growth = None if rss0 is None or rss1 is None else rss1 - rss0
    return growth, objs1 - objs0


def _check_flat(
    run: Callable[[int], None],
    calls: int = 10_000,
    *,
    warmup: int = 1000,
    objects_bound: int = 100,
    rss_bound: int = 1 << 20,
) -> None:
    """No more live objects after ``calls`` calls, and resident memory flat over a window
    of ``calls`` calls. Memory settling (the allocator growing its heap to where frees and
    allocations balance, other tests' memory returned or kept) moves RSS for a while; a
    leak moves it in every window. Up to six windows are measured and one must stay
    within ``rss_bound``: the mlp fixture's calls have settled over the first 10,000 to
    30,000 (windows of +1.0, +1.2 and +2.8 MB), then stayed flat for 400,000 more."""
    growth, objects = _flat(run, calls, warmup)
    assert objects < objects_bound, f"{objects} more live objects after {calls} calls"
    windows = [growth]
    while growth is not None and growth >= rss_bound and len(windows) < 6:
        growth, _ = _flat(run, calls, warmup=0)
        windows.append(growth)
    if growth is not None:
        assert growth < rss_bound, (
            f"resident memory grew by {windows} bytes over windows of {calls} calls"
        )


def _method(name: str, method: str = "forward", **options):
    pte, ptd = fixture_paths(name)
    return ptexec.load(pte, data_path=ptd).load_method(method, **options)


def _checked(name: str, **options) -> Callable[[int], None]:
    """n calls cycling through the fixture's calls, every output checked."""
    m = _method(name, **options)
    calls = fixture_calls(name)
    rtol, atol = tolerance(name)

    def run(n: int) -> None:
        for i in range(n):
            call = calls[i % len(calls)]
            assert compare_outputs(m.execute(call["inputs"]), call["outputs"], rtol, atol) is None

    return run


# --------------------------------------------------------------------------------------
# 10,000 calls


@pytest.mark.parametrize("name", ["mlp", "mlp_unplanned", "dynamic_mlp", "cond", "scalar_io"])
def test_ten_thousand_calls_are_flat(name: str) -> None:
    _check_flat(_checked(name))


def test_ten_thousand_view_calls_are_flat() -> None:
    _check_flat(_checked("mlp_unplanned", outputs="view"))


def test_ten_thousand_calls_with_out_are_flat() -> None:
    m = _method("mlp_unplanned")
    call = fixture_calls("mlp_unplanned")[0]
    y = torch.empty(2, 4)

    def run(n: int) -> None:
        for _ in range(n):
            (got,) = m.execute(call["inputs"], out=[y])
            assert got is y
        assert compare_outputs([y], call["outputs"], *tolerance("mlp_unplanned")) is None

    _check_flat(run)


def test_ten_thousand_stateful_calls_are_flat() -> None:
    m = _method("stateful")
    x = torch.ones(4)
    made = [0]

    def run(n: int) -> None:
        for _ in range(n):
            m.execute([x])
        made[0] += n

    _check_flat(run)  # runs one to six windows of calls
    _, total, count = m.execute([torch.zeros(4)])
    assert int(count.item()) == made[0] + 1 and torch.equal(total, torch.full((4,), float(made[0])))


def test_refused_inputs_do_not_leak() -> None:
    m = _method("mlp")
    bad = torch.zeros(3, 8)

    def run(n: int) -> None:
        for _ in range(n):
            with pytest.raises(ptexec.InputError):
                m.execute([bad])

    _check_flat(run, calls=5_000)


def test_failing_kernels_do_not_leak() -> None:
    m = _method("int_ops")
    call = fixture_calls("int_ops")[0]
    ids = call["inputs"][0].clone()
    ids[0, 0] = 100
    bad = [ids, *call["inputs"][1:]]

    def run(n: int) -> None:
        for _ in range(n):
            with pytest.raises(ptexec.ExecutionError):
                m.execute(bad)
        assert (
            compare_outputs(m.execute(call["inputs"]), call["outputs"], *tolerance("int_ops"))
            is None
        )

    _check_flat(run, calls=3_000)


def test_loading_again_and_again_is_flat() -> None:
    data = fixture_paths("stateful")[0].read_bytes()
    call = fixture_calls("stateful")[0]

    def run(n: int) -> None:
        for _ in range(n):
            m = ptexec.load(data).load_method()  # fresh state every time
            assert (
                compare_outputs(m.execute(call["inputs"]), call["outputs"], *tolerance("stateful"))
                is None
            )

    # a leaked load keeps its generated code and buffers (tens of KiB): 300 of them would
    # grow every window past the bound
    _check_flat(run, calls=300, warmup=50, objects_bound=200, rss_bound=4 << 20)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("mlp", {}),
        ("stateful", {}),
        ("cond", {}),
        ("dynamic_mlp", {"outputs": "view"}),
        ("xnnpack/cnn", {"xnnpack": "executorch"}),
        ("xnnpack/cnn", {"xnnpack": "torch"}),
        ("xnnpack/dynamic_mlp", {"xnnpack": "executorch"}),
    ],
)
def test_a_dropped_method_is_freed_without_the_cyclic_collector(
    name: str, options: dict[str, str]
) -> None:
    """Nothing a loaded method holds (generated code, planned memory, ExecuTorch's methods
    of its delegates) is a reference cycle: dropping the method frees it at once, not at
    the collector's next full pass (which, with torch imported, walks every object)."""
    xnnpack = name.startswith("xnnpack/")
    if xnnpack and options.get("xnnpack") == "executorch":
        from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

        reason = executorch_unavailable()
        if reason is not None:
            pytest.skip(reason)
    if xnnpack:
        pte = Path(__file__).parent / "fixtures" / f"{name}.pte"
        calls = torch.load(pte.with_suffix(".io.pt"), weights_only=True)["calls"]
    else:
        pte = fixture_paths(name)[0]
        calls = fixture_calls(name)

    def load_call_drop() -> None:
        m = ptexec.load(pte).load_method("forward", **options)
        for call in calls:
            m.execute(call["inputs"])

    load_call_drop()  # the first load of a kind fills the process's caches
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        load_call_drop()
        unreachable = gc.collect()
    finally:
        if was:
            gc.enable()
    assert unreachable == 0, f"{unreachable} objects of a dropped method were left in cycles"


# --------------------------------------------------------------------------------------
# outputs


def test_outputs_outlive_the_program() -> None:
    call = fixture_calls("mlp")[0]
    prog = ptexec.load(fixture_paths("mlp")[0])
    m = prog.load_method()
    outputs = m.execute(call["inputs"])
    gone = weakref.ref(prog)
    del prog, m
    gc.collect()
    assert gone() is None, "the program is freed once nothing uses it"
    junk = [torch.randn(1 << 16) for _ in range(8)]  # reuse freed memory
    assert compare_outputs(outputs, call["outputs"], *tolerance("mlp")) is None
    del junk


def test_view_outputs_are_the_methods_memory_until_the_next_call() -> None:
    calls = fixture_calls("mlp")
    m = _method("mlp", outputs="view")
    (a,) = m.execute(calls[0]["inputs"])
    assert compare_outputs([a], calls[0]["outputs"], *tolerance("mlp")) is None
    (b,) = m.execute(calls[1]["inputs"])
    assert a.data_ptr() == b.data_ptr()
    assert compare_outputs([a], calls[1]["outputs"], *tolerance("mlp")) is None  # overwritten
    (c,) = m.execute(calls[2]["inputs"], outputs="copy")
    assert c.data_ptr() != b.data_ptr()
    assert compare_outputs([c], calls[2]["outputs"], *tolerance("mlp")) is None


@pytest.mark.parametrize("fast_path", [True, False])
def test_views_asked_per_call_of_a_method_loaded_for_copies(fast_path: bool) -> None:
    """``outputs="view"`` on one call of a method loaded with the default: that call's
    outputs are the method's memory, and the next plain call returns copies again."""
    calls = fixture_calls("mlp")
    m = _method("mlp", fast_path=fast_path)
    (a,) = m.execute(calls[0]["inputs"], outputs="view")
    assert compare_outputs([a], calls[0]["outputs"], *tolerance("mlp")) is None
    (b,) = m.execute(calls[1]["inputs"], outputs="view")
    assert a.data_ptr() == b.data_ptr()
    assert compare_outputs([a], calls[1]["outputs"], *tolerance("mlp")) is None  # overwritten
    (c,) = m.execute(calls[2]["inputs"])
    assert c.data_ptr() != b.data_ptr()
    assert compare_outputs([b], calls[2]["outputs"], *tolerance("mlp")) is None
    (d,) = m.execute(calls[0]["inputs"])
    assert compare_outputs([c], calls[2]["outputs"], *tolerance("mlp")) is None  # kept
    assert compare_outputs([d], calls[0]["outputs"], *tolerance("mlp")) is None


class _ReturnsConstants(torch.nn.Module):
    """Outputs in the program's constant memory: a weight, a view of a buffer, work on
    constants alone (folded at load), and one computed per call."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(3.0))
        self.register_buffer("b", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x + 1, self.w, self.b.view(2, 2), self.w * 2, self.b.t()


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("optimize", [True, False])
def test_view_outputs_never_hand_out_the_constants(
    monkeypatch: pytest.MonkeyPatch, fast_path: bool, optimize: bool
) -> None:
    """``outputs="view"`` of an output in the program's constant memory (a weight, a view
    of one, a fold of constants) is a copy: writing into it changes neither the next call,
    nor another load of the program, nor the caller's ``bytes`` the constants are read
    from. Outputs in the method's own memory stay views."""
    import ptexec.program
    from export_util import export_program

    monkeypatch.setattr(ptexec.program, "READ_IN_PLACE", 0)  # constants viewed in the bytes
    module = _ReturnsConstants()
    x = torch.zeros(3)
    data = export_program(module, (x,))
    before = bytes(data)
    with torch.no_grad():
        expected = module(x)
    m = ptexec.load(data).load_method(fast_path=fast_path, optimize=optimize)
    first = m.execute([x], outputs="view")
    for got, want in zip(first, expected, strict=True):
        torch.testing.assert_close(got, want)
        got.fill_(-7.0)
    second = m.execute([x], outputs="view")
    for got, want in zip(second, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert second[0].data_ptr() == first[0].data_ptr()  # the method's memory: a view
    for got, want in zip(
        ptexec.load(data).load_method(fast_path=fast_path).execute([x]), expected, strict=True
    ):
        torch.testing.assert_close(got, want)
    assert data == before


class _ReturnsItsInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x * 2 + 1


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_view_outputs_geometry_is_the_callers(fast_path: bool) -> None:
    """A view output shares the method's memory, not its tensor object: transposing it in
    place changes what the caller holds, never what the next call computes (the values
    table's own tensor was handed out: the next input was copied into the planned memory
    as laid out, then read through the transposed strides)."""
    from export_util import export_program

    m = ptexec.load(export_program(_ReturnsItsInput(), (torch.zeros(3, 3),))).load_method(
        fast_path=fast_path, outputs="view"
    )
    x = torch.arange(9.0).reshape(3, 3)
    a, _ = m.execute([x])
    a.t_()
    for k in range(2):
        y, z = m.execute([x + k])
        torch.testing.assert_close(y, x + k)
        torch.testing.assert_close(z, (x + k) * 2 + 1)
    assert y.data_ptr() == a.data_ptr()  # still the method's memory


def test_views_keep_the_memory_alive() -> None:
    """A view outlives its method as a valid tensor (it holds the planned storage)."""
    call = fixture_calls("mlp")[0]
    (view,) = _method("mlp", outputs="view").execute(call["inputs"])
    gc.collect()
    assert compare_outputs([view], call["outputs"], *tolerance("mlp")) is None


# --------------------------------------------------------------------------------------
# what a program keeps alive


def _sources(path: Path) -> dict[str, Callable[[], object]]:
    return {
        "bytes": lambda: path.read_bytes(),
        "bytearray": lambda: bytearray(path.read_bytes()),
        "memoryview": lambda: memoryview(bytearray(path.read_bytes())),
        "readonly memoryview": lambda: memoryview(path.read_bytes()),
        "file object": lambda: io.BytesIO(path.read_bytes()),
        "path": lambda: path,
        "str path": lambda: str(path),
    }


@pytest.mark.parametrize("kind", list(_sources(Path("."))))
@pytest.mark.parametrize("name", ["mlp", "external", "mutable_init"])
def test_a_program_keeps_its_bytes_alive(name: str, kind: str) -> None:
    pte, ptd = fixture_paths(name)
    source = _sources(pte)[kind]()
    data = None if ptd is None else _sources(ptd)[kind if kind != "file object" else "bytes"]()
    m = ptexec.load(source, data_path=data).load_method()
    del source, data  # the caller lets go of everything
    gc.collect()
    junk = [bytearray(1 << 16) for _ in range(64)]  # reuse freed memory
    for call in fixture_calls(name):
        assert compare_outputs(m.execute(call["inputs"]), call["outputs"], *tolerance(name)) is None
    del junk


def test_a_method_keeps_its_program_alive() -> None:
    m = ptexec.load(fixture_paths("two_method_state")[0]).load_method("step")
    gc.collect()
    x = torch.zeros(8)
    assert [m.execute([x])[0].item() for _ in range(3)] == [1, 2, 3]
    assert m.program.method_names == ("other", "step")


def test_a_loaded_file_may_be_replaced_on_disk(tmp_path: Path) -> None:
    """Replacing the file (a new file renamed over it, as editors and exporters do) leaves a
    loaded program intact, whether it was read or mapped."""
    for mapped in (False, True):
        path = tmp_path / "model.pte"
        path.write_bytes(fixture_paths("mlp")[0].read_bytes())
        m = ptexec.load(path, mmap=mapped).load_method()
        fresh = tmp_path / "other.pte"
        fresh.write_bytes(fixture_paths("cnn")[0].read_bytes())
        fresh.replace(path)
        call = fixture_calls("mlp")[0]
        got = m.execute(call["inputs"])
        assert compare_outputs(got, call["outputs"], *tolerance("mlp")) is None


_CHANGE = """
import sys, ptexec, torch
path, how = sys.argv[1], sys.argv[2]
m = ptexec.load(path).load_method()
x = torch.ones(2, 8)
before = m.execute([x])[0]
if how == "truncate":
    open(path, "wb").close()
else:  # rewrite in place: every byte after the header becomes another value
    data = bytearray(open(path, "rb").read())
    data[64:] = bytes([0x3F]) * (len(data) - 64)
    with open(path, "r+b") as f:
        f.write(data)
after = m.execute([x])[0]
print(bool(torch.equal(before, after)))
"""


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_a_file_changed_in_place_does_not_reach_a_loaded_program(tmp_path: Path, how: str) -> None:
    """Read into private memory (the default), a program is immune to its file being
    truncated or rewritten in place: no SIGBUS, no changed constants (run in a subprocess:
    under a memory map, truncation would kill it)."""
    path = tmp_path / "model.pte"
    path.write_bytes(fixture_paths("mlp")[0].read_bytes())
    proc = subprocess.run(
        [sys.executable, "-c", _CHANGE, str(path), how], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"


def test_a_mapped_file_that_changed_is_refused_at_load_method(tmp_path: Path) -> None:
    path = tmp_path / "model.pte"
    data = fixture_paths("mlp")[0].read_bytes()
    path.write_bytes(data)
    prog = ptexec.load(path, mmap=True)
    prog.load_method()
    with open(path, "r+b") as f:  # the same bytes, written again in place: a new mtime
        f.write(data)
    os.utime(path, ns=(1, 1))
    with pytest.raises(ptexec.errors.ProgramChangedError, match="changed on disk"):
        prog.load_method()
    assert isinstance(ptexec.errors.ProgramChangedError("x"), RuntimeError)


def test_a_same_size_rewrite_with_its_mtime_restored_is_refused(tmp_path: Path) -> None:
    """Other bytes of the same size written in place, then the old mtime set back (as
    ``touch -r``, rsync or tar do): the ctime still moved, so the mapped program refuses."""
    path = tmp_path / "model.pte"
    data = fixture_paths("mlp")[0].read_bytes()
    path.write_bytes(data)
    before = os.stat(path)
    prog = ptexec.load(path, mmap=True)
    prog.load_method()
    other = data[:64] + bytes([0x3F]) * (len(data) - 64)
    for _ in range(1000):  # ctime ticks with the kernel's clock: write until it moved
        with open(path, "r+b") as f:
            f.write(other)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        if os.stat(path).st_ctime_ns != before.st_ctime_ns:
            break
        time.sleep(0.001)
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )
    with pytest.raises(ptexec.errors.ProgramChangedError, match="changed on disk"):
        prog.load_method()


def test_a_read_program_owns_its_memory(tmp_path: Path) -> None:
    """Constants of a program read from a path are views of its private copy, not of the
    file: the file can be deleted at once."""
    path = tmp_path / "model.pte"
    path.write_bytes(fixture_paths("mlp")[0].read_bytes())
    m = ptexec.load(path).load_method()
    path.unlink()
    call = fixture_calls("mlp")[0]
    assert compare_outputs(m.execute(call["inputs"]), call["outputs"], *tolerance("mlp")) is None


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("stateful", {}),
        ("mutable_init", {}),
        ("xnnpack/cnn", {"xnnpack": "torch"}),
        ("xnnpack/cnn", {"xnnpack": "executorch"}),
    ],
)
@pytest.mark.parametrize("in_place", [True, False])
def test_bytes_are_read_in_place_and_never_written(
    name: str, options: dict[str, str], in_place: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program loaded from ``bytes`` (of at least ``READ_IN_PLACE`` bytes, here all)
    reads them in place (a delegate's payload and the constants are not copied), but
    state starts as a copy of its initial value: calls that write state leave the caller's
    bytes as they were, and two programs loaded from the same bytes do not share state.
    Smaller ones are copied whole, with the same results."""
    import ptexec.program

    monkeypatch.setattr(ptexec.program, "READ_IN_PLACE", 0 if in_place else 1 << 40)
    if options.get("xnnpack") == "executorch":
        from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

        reason = executorch_unavailable()
        if reason is not None:
            pytest.skip(reason)
    if name.startswith("xnnpack/"):
        pte = Path(__file__).parent / "fixtures" / f"{name}.pte"
        calls = torch.load(pte.with_suffix(".io.pt"), weights_only=True)["calls"]
        rtol, atol = 1e-4, 1e-4
    else:
        pte = fixture_paths(name)[0]
        calls = fixture_calls(name)
        rtol, atol = tolerance(name)
    data = pte.read_bytes()
    before = bytes(data)  # a copy to compare with
    for _ in range(2):  # the second program starts from the file's state again
        m = ptexec.load(data).load_method(calls[0].get("method", "forward"), **options)
        for call in calls:
            # (the XNNPACK fixtures record ExecuTorch's own outputs)
            expected = call["outputs"] if "outputs" in call else call["executorch"]
            assert compare_outputs(m.execute(call["inputs"]), expected, rtol, atol) is None
        assert data == before


def _address_range(data: bytes) -> tuple[int, int]:
    import numpy as np

    start = int(np.frombuffer(data, dtype=np.uint8).ctypes.data)
    return start, start + len(data)


def _constants(m: ptexec.Method) -> list[torch.Tensor]:
    plan = ptexec.load(FIXTURES / "mlp.pte").pte.program.execution_plan[0]
    return [m.values()[i] for i, v in enumerate(plan.values) if getattr(v, "is_constant", False)]


FIXTURES = Path(__file__).parent / "fixtures"


def _writing_a_constant(copy: bool = False) -> bytes:
    """The mlp fixture with one instruction put first: ``relu.out(b1, out=b1)``, which
    writes the first linear's bias (a constant) in place on every call (``copy``:
    ``_to_dim_order_copy.out(b1, out=b1)``, which copies it onto itself)."""
    serialize = pytest.importorskip("executorch.exir._serialize._program")
    from executorch.exir import schema

    pte = serialize.deserialize_pte_binary((FIXTURES / "mlp.pte").read_bytes())
    plan = pte.program.execution_plan[0]
    bias = 1
    assert plan.values[bias].val.data_buffer_idx > 0 and list(plan.values[bias].val.sizes) == [16]
    if copy:
        op = len(plan.operators)
        plan.operators.append(
            schema.Operator(name="dim_order_ops::_to_dim_order_copy", overload="out")
        )
        plan.values.append(schema.EValue(val=schema.Bool(bool_val=False)))
        plan.values.append(schema.EValue(val=schema.Null()))
        n = len(plan.values)
        args = [bias, n - 2, n - 1, bias, bias]
    else:
        op = next(i for i, o in enumerate(plan.operators) if o.name == "aten::relu")
        args = [bias, bias, bias]
    plan.chains[0].instructions.insert(
        0, schema.Instruction(instr_args=schema.KernelCall(op_index=op, args=args))
    )
    return bytes(serialize.serialize_pte_binary(pte))


@pytest.mark.parametrize("optimize", [True, False])
def test_an_instruction_writing_its_own_input_is_not_folded(optimize: bool) -> None:
    """``relu.out(b1, out=b1)`` on a constant reads what it writes: it is neither run once
    at load into fresh memory (which read that memory, uninitialised) nor emptied first;
    every call computes what eager PyTorch does."""
    m0 = ptexec.load(FIXTURES / "mlp.pte").load_method()
    w1, b1, w2, b2 = (c.clone() for c in _constants(m0))
    assert b1.min() < 0  # (the relu changes it)
    m = ptexec.load(bytearray(_writing_a_constant())).load_method(optimize=optimize)
    x = torch.randn(2, 8)
    for _ in range(3):
        (y,) = m.execute([x])
        torch.testing.assert_close(y, torch.relu(x @ w1.T + b1.relu()) @ w2.T + b2)


@pytest.mark.parametrize("optimize", [True, False])
def test_a_constant_copied_onto_itself_is_left_as_it_is(optimize: bool) -> None:
    """``_to_dim_order_copy.out(b1, out=b1)`` changes nothing: it is not run once at load
    into fresh memory (which it would then read, uninitialised)."""
    m0 = ptexec.load(FIXTURES / "mlp.pte").load_method()
    w1, b1, w2, b2 = (c.clone() for c in _constants(m0))
    m = ptexec.load(bytearray(_writing_a_constant(copy=True))).load_method(optimize=optimize)
    x = torch.randn(2, 8)
    for _ in range(2):
        (y,) = m.execute([x])
        torch.testing.assert_close(y, torch.relu(x @ w1.T + b1) @ w2.T + b2)


def test_constants_of_bytes_are_viewed_in_place_unless_an_instruction_writes_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program loaded from ``bytes`` read in place views its constants in those bytes
    (no copy) when no instruction writes a constant; one whose instruction writes a
    constant gets private copies (its calls compute what eager PyTorch does with the
    written bias, and the caller's bytes stay as they were)."""
    import ptexec.program

    monkeypatch.setattr(ptexec.program, "READ_IN_PLACE", 0)
    data = (FIXTURES / "mlp.pte").read_bytes()
    lo, hi = _address_range(data)
    m = ptexec.load(data).load_method()
    consts = _constants(m)
    assert len(consts) == 4
    assert all(lo <= c.data_ptr() and c.data_ptr() + c.nbytes <= hi for c in consts)
    w1, b1, w2, b2 = (c.clone() for c in consts)
    x = torch.randn(2, 8)
    (y,) = m.execute([x])
    torch.testing.assert_close(y, torch.relu(x @ w1.T + b1) @ w2.T + b2)
    # a later load (the values table made from the first load's recipe) views them too,
    # with the same geometry, kept for a failed call's restore
    again = ptexec.load(data).load_method()
    for c, first in zip(_constants(again), consts, strict=True):
        assert c.data_ptr() == first.data_ptr() and c.stride() == first.stride()
        assert torch.equal(c, first)
    owned = {id(e[0]): e for e in again.state.owned}
    assert all(owned[id(c)][1].data_ptr() == c.data_ptr() for c in _constants(again))
    again.state.restore()
    (y,) = again.execute([x])
    torch.testing.assert_close(y, torch.relu(x @ w1.T + b1) @ w2.T + b2)
    # the compiled tier reads the same views (the session's cache: mlp compiles once)
    from compile_util import session_cache_dir
    from ptexec.compile import CompileWarning

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        (y,) = ptexec.load(data).load_method(compile=True).execute([x])
    torch.testing.assert_close(y, torch.relu(x @ w1.T + b1) @ w2.T + b2)
    assert data == (FIXTURES / "mlp.pte").read_bytes()

    written = _writing_a_constant()
    before = bytes(written)
    lo, hi = _address_range(written)
    assert b1.min() < 0  # (the relu changes it)
    for _ in range(2):  # a second program starts from the file's constants again
        m = ptexec.load(written).load_method()
        consts = _constants(m)
        assert not any(lo <= c.data_ptr() < hi for c in consts)
        assert all(torch.equal(c, f) for c, f in zip(consts, (w1, b1, w2, b2), strict=True))
        for _ in range(2):
            (y,) = m.execute([x])
            torch.testing.assert_close(y, torch.relu(x @ w1.T + b1.relu()) @ w2.T + b2)
        assert written == before


def test_a_delegate_writing_a_constant_is_refused() -> None:
    """An XNNPACK call whose output argument is a constant of the program is refused at
    load, naming the instruction (constants are read-only, and may be the caller's
    ``bytes``)."""
    serialize = pytest.importorskip("executorch.exir._serialize._program")
    from executorch.exir import schema

    pte = serialize.deserialize_pte_binary((FIXTURES / "xnnpack" / "op_abs.pte").read_bytes())
    program = pte.program
    plan = program.execution_plan[0]
    out = plan.values[plan.outputs[0]].val
    program.constant_buffer.append(schema.Buffer(storage=bytes(2 * 3 * 8 * 4)))
    const = schema.Tensor(
        scalar_type=out.scalar_type,
        storage_offset=0,
        sizes=list(out.sizes),
        dim_order=list(out.dim_order),
        requires_grad=False,
        layout=0,
        data_buffer_idx=len(program.constant_buffer) - 1,
        allocation_info=None,
        shape_dynamism=out.shape_dynamism,
    )
    plan.values.append(schema.EValue(val=const))
    call = plan.chains[0].instructions[0].instr_args
    call.args = [call.args[0], len(plan.values) - 1]
    data = bytes(serialize.serialize_pte_binary(pte))
    for options in ({"xnnpack": "torch"}, {}):
        with pytest.raises(
            ptexec.PteFormatError, match=r"instructions\[0\].*writes value 2, a constant"
        ):
            ptexec.load(data).load_method("forward", **options)


def test_a_freed_method_leaves_no_generated_source() -> None:
    """Generated code is registered for tracebacks while its method lives, and only then."""
    import linecache

    before = set(linecache.cache)
    m = _method("cond")
    new = set(linecache.cache) - before
    assert new and all(name.startswith("<ptexec") for name in new)
    del m
    gc.collect()
    assert not new & set(linecache.cache)


@pytest.mark.parametrize("size", [1, 100, 4096, 64 << 10, (64 << 10) + 1, 1 << 20])
def test_planned_host_buffers_are_zero_aligned_and_cannot_grow(size: int) -> None:
    """Buffers of any size: zero-filled, 64-byte aligned, the storage starting at the
    tensor, each its own memory, and never resized by a kernel."""
    from ptexec.device import CPU
    from ptexec.memory import BufferInfo, allocate

    buffers = [allocate(BufferInfo(1, size, CPU)).data for _ in range(8)]
    for data in buffers:
        assert data.shape == (size,) and data.dtype == torch.uint8
        assert data.storage_offset() == 0 and data.data_ptr() % 64 == 0
        assert not data.any()
        data.fill_(7)
        with pytest.raises(RuntimeError, match="not resizable"):
            data[:].resize_(size + 1)  # (a view: a failed resize leaves its sizes wrong)
    assert all(int(d.sum()) == 7 * size for d in buffers)  # each its own memory


def test_fixed_storage_is_the_same_memory_and_cannot_grow() -> None:
    """What CUDA buffers are made with (its rule is the device's own: checked here on the
    host): the same memory, alive as long as the fixed tensor, never resized."""
    from ptexec.memory import fixed_storage

    t = torch.arange(64, dtype=torch.uint8)
    fixed = fixed_storage(t)
    address = t.data_ptr()
    del t
    assert fixed.data_ptr() == address and fixed.tolist() == list(range(64))
    view = fixed[8:16].view(torch.float32)
    with pytest.raises(RuntimeError, match="not resizable"):
        view.resize_(100)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_planned_cuda_buffers_cannot_grow() -> None:
    """A kernel writing a planned view past its CUDA buffer raises instead of moving the
    buffer (views would follow it, addresses taken before it would not)."""
    from ptexec.device import Device, DeviceType
    from ptexec.memory import BufferInfo, allocate

    data = allocate(BufferInfo(1, 4096, Device(DeviceType.CUDA, 0))).data
    assert data.is_cuda and not data.any()
    address = data.data_ptr()
    with pytest.raises(RuntimeError, match="not resizable"):
        data[4000:].view(torch.float32).resize_(1000)
    assert data.data_ptr() == address


def test_a_program_writing_an_external_constant_changes_no_other_programs_weights(
    tmp_path: Path,
) -> None:
    """Programs loaded from the same data file share its private copy; one whose
    instruction writes a constant (``relu.out(b1, out=b1)`` on the external ``fc1.bias``)
    writes a copy of its own: another program loaded beside it, or later, computes with
    the file's weights (it computed with the first one's writes)."""
    serialize = pytest.importorskip("executorch.exir._serialize._program")
    from executorch.exir import schema

    pte, ptd = FIXTURES / "external.pte", FIXTURES / "external.ptd"
    program = serialize.deserialize_pte_binary(pte.read_bytes())
    plan = program.program.execution_plan[0]
    bias = 1
    info = plan.values[bias].val.extra_tensor_info
    assert info is not None and info.fully_qualified_name == "fc1.bias"
    relu = next(i for i, o in enumerate(plan.operators) if o.name == "aten::relu")
    plan.chains[0].instructions.insert(
        0, schema.Instruction(instr_args=schema.KernelCall(op_index=relu, args=[bias] * 3))
    )
    writer = tmp_path / "writer.pte"
    writer.write_bytes(bytes(serialize.serialize_pte_binary(program)))
    x = torch.randn(2, 8)
    reader = ptexec.load(pte, data_path=ptd).load_method()
    (want,) = reader.execute([x])
    (b1,) = [c for c in _constants(reader) if c.shape == (16,)]
    assert b1.min() < 0  # (the relu changes it)
    writing = ptexec.load(writer, data_path=ptd).load_method()
    writing.execute([x])
    (again,) = reader.execute([x])
    (fresh,) = ptexec.load(pte, data_path=ptd).load_method().execute([x])
    assert torch.equal(again, want) and torch.equal(fresh, want)


def test_pickling_or_deep_copying_a_program_or_method_is_refused_naming_it() -> None:
    """A program or method cannot go to another process by pickle, nor be deep-copied, as
    ExecuTorch's own cannot: the TypeError names the object and what to do instead
    (pickle named only the file's memoryview it reached). A shallow copy is the same
    method, its state shared, as a shallow copy of ExecuTorch's method is."""
    pte, _ = fixture_paths("stateful")
    et = executorch_runtime().load_program(pte)
    for theirs in (et, et.load_method("forward")):
        with pytest.raises(TypeError, match="ExecuTorch"):
            pickle.dumps(theirs)
        with pytest.raises(TypeError, match="ExecuTorch"):
            copy.deepcopy(theirs)
    prog = ptexec.load(pte)
    m = prog.load_method("forward")
    for ours, name in ((prog, "ptexec.Program"), (m, "ptexec.Method")):
        with pytest.raises(TypeError, match=f"cannot pickle or deep-copy a {name}"):
            pickle.dumps(ours)
        with pytest.raises(TypeError, match=f"cannot pickle or deep-copy a {name}"):
            copy.deepcopy(ours)
    calls = fixture_calls("stateful")
    methods = [m, copy.copy(m), m, copy.copy(copy.copy(m))]
    for call, method in zip(calls, methods, strict=True):
        got = method.execute(call["inputs"])
        assert compare_outputs(got, call["outputs"], *tolerance("stateful")) is None
