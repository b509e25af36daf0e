"""Opaque XNNPACK calls of compiled code run by ExecuTorch's C++ runtime directly.

:mod:`ptexec.compile.native` builds a small library whose CPU kernel of
``ptexec::external_call`` hands the tensors to ExecuTorch's runtime without entering
Python. Checked against the same calls through ExecuTorch's pybindings (the Python path,
``PTEXEC_NATIVE_CALLS=0``) and the interpreter: the same XNNPACK kernels, so equal
outputs bit for bit; after a change of ExecuTorch's thread pool; from two threads at once;
and the library's cache entry is checked like any compiled library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from compile_util import XNNPACK, XNNPACK_DIR, _clone, dynamic_batch_program, session_cache_dir
from ptexec.compile import CompileOptions, external, native
from ptexec.compile.report import CompileWarning
from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

GRAPH = CompileOptions(backend="graph")

pytestmark = pytest.mark.skipif(
    executorch_unavailable() is not None or native.unavailable() is not None,
    reason="needs ExecuTorch's XNNPACK backend, its headers and a C++ compiler",
)


@pytest.fixture(autouse=True)
def _setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))
    monkeypatch.setattr(external, "MIN_WEIGHT_BYTES", 0)  # every delegate an opaque call


def _calls(name: str) -> list[dict[str, Any]]:
    return torch.load(XNNPACK_DIR / f"{name}.io.pt", weights_only=True)["calls"]  # type: ignore[no-any-return]


def _compiled(name: str, monkeypatch: pytest.MonkeyPatch, natively: bool) -> ptexec.Method:
    with monkeypatch.context() as m:
        if not natively:
            m.setenv("PTEXEC_NATIVE_CALLS", "0")
        path = XNNPACK_DIR / XNNPACK[name]["pte"]
        method = ptexec.load(path).load_method("forward", xnnpack="auto", compile=GRAPH)
    report = method.compile_report
    assert report is not None and report.xnnpack_calls
    assert report.native_calls == (len(report.xnnpack_calls) if natively else 0)
    return method


@pytest.mark.parametrize(
    "name",
    ["op_attention", "transformer_int8_dynamic_int4w_pc", "dynconv_padmodes_int8_dynamic_pc"],
)
def test_native_calls_equal_the_python_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _compiled(name, monkeypatch, natively=True)
    slow = _compiled(name, monkeypatch, natively=False)
    plain = ptexec.load(XNNPACK_DIR / XNNPACK[name]["pte"]).load_method("forward")
    start = native.runs()
    calls = _calls(name)
    for k, call in enumerate(calls * 2):  # twice: the second time every call is warm
        want = plain.execute(_clone(call["inputs"]))
        a = fast.execute(_clone(call["inputs"]))
        b = slow.execute(_clone(call["inputs"]))
        for j, (x, y, z) in enumerate(zip(a, b, want, strict=True)):
            assert torch.equal(x, y), f"{name} call {k} output {j}: native and Python differ"
            assert torch.equal(x, z), f"{name} call {k} output {j}: native and interpreter differ"
    report = fast.compile_report
    assert report is not None
    assert native.runs() - start >= 2 * len(calls) * len(report.xnnpack_calls)
    assert "run by ExecuTorch's C++ runtime directly" in report.summary()


def test_shapes_that_come_and_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A native call hands a tensor over again only when its memory or sizes changed, and
    returns the view of a dynamic output it made for the same shape last time: calls whose
    batch sizes alternate, repeat and return (same memory, other sizes; same sizes, other
    contents) give the interpreter's outputs bit for bit, at their own shapes."""
    model, path = dynamic_batch_program(tmp_path)
    compiled = ptexec.load(path).load_method("forward", xnnpack="auto", compile=GRAPH)
    report = compiled.compile_report
    assert report is not None and report.fully_compiled and len(report.xnnpack_calls) == 2
    assert report.native_calls == 2
    plain = ptexec.load(path).load_method("forward")
    start = native.runs()
    batches = [3, 1, 1, 16, 3, 3, 16, 1, 7]
    memory = torch.empty(16, 8)
    for r, n in enumerate(batches):
        x = memory[:n]  # the same memory every call (other sizes), new contents
        x.normal_()
        want = plain.execute([x.clone()])[0]
        got = compiled.execute([x])[0]
        assert got.shape == (n, 4), f"call {r} (batch {n})"
        assert torch.equal(got, want), f"call {r} (batch {n})"
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    assert native.runs() - start == 2 * len(batches)


@pytest.mark.parametrize(
    ("natively", "options"),
    [(True, GRAPH), (False, GRAPH), (True, CompileOptions())],
    ids=["native-graph", "python-graph", "native-aoti"],
)
def test_outputs_kept_across_calls_stay_as_computed(
    natively: bool, options: CompileOptions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delegate call writes the same memory at every call: a method output that is a
    call's dynamic output reaches the caller as a tensor of its own (AOTInductor takes
    an opaque op's outputs for new tensors and drops a copy of one in its graph), so
    outputs kept across calls of shapes going up and down still hold what eager PyTorch
    computes."""
    model, path = dynamic_batch_program(tmp_path)
    if not natively:
        monkeypatch.setenv("PTEXEC_NATIVE_CALLS", "0")
    compiled = ptexec.load(path).load_method("forward", xnnpack="auto", compile=options)
    report = compiled.compile_report
    assert report is not None and report.native_calls == (2 if natively else 0)
    torch.manual_seed(1)
    kept = []
    for n in [1, 16, 3, 16, 1]:
        x = torch.randn(n, 8)
        kept.append((x, compiled.execute([x])[0]))
    with torch.no_grad():
        for r, (x, got) in enumerate(kept):
            torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5, msg=f"call {r}")


def test_same_shapes_in_new_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor handed over before with the same sizes, now in other memory, is pointed at
    that memory (ExecuTorch shares an unplanned input's memory): every call's own
    contents reach the delegate, in calls at one shape and at alternating ones."""
    model, path = dynamic_batch_program(tmp_path)
    compiled = ptexec.load(path).load_method("forward", xnnpack="auto", compile=GRAPH)
    report = compiled.compile_report
    assert report is not None and report.native_calls == 2
    plain = ptexec.load(path).load_method("forward")
    kept = []  # every input stays alive, so each call's is in memory of its own
    for r, n in enumerate([5, 5, 5, 2, 5, 2, 2]):
        x = torch.randn(n, 8)
        kept.append(x)
        want = plain.execute([x.clone()])[0]
        got = compiled.execute([x])[0]
        assert torch.equal(got, want), f"call {r} (batch {n})"
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


def test_a_new_thread_pool_initializes_the_delegate_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resizing ExecuTorch's pool destroys the one XNNPACK's runtime was made with: the
    next native call initializes its delegate again and computes the same."""
    name = "transformer_int8_dynamic_int4w_pc"
    compiled = _compiled(name, monkeypatch, natively=True)
    plain = ptexec.load(XNNPACK_DIR / XNNPACK[name]["pte"]).load_method("forward")
    call = _calls(name)[0]
    want = plain.execute(_clone(call["inputs"]))
    before = torch.get_num_threads()
    try:
        for threads in (2, 1):
            ptexec.set_num_threads(threads)
            got = compiled.execute(_clone(call["inputs"]))
            for x, y in zip(got, want, strict=True):
                assert torch.equal(x, y)
    finally:
        ptexec.set_num_threads(before)


def test_methods_of_one_program_on_two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two methods loaded from one file have the same call keys; each thread's compiled
    code finds its own method's calls (their own memory), never the other's."""
    name = "op_attention"
    methods = [_compiled(name, monkeypatch, natively=True) for _ in range(2)]
    plain = ptexec.load(XNNPACK_DIR / XNNPACK[name]["pte"]).load_method("forward")
    calls = _calls(name)
    wants = [plain.execute(_clone(c["inputs"])) for c in calls]
    problems: list[str] = []

    def work(method: ptexec.Method, shift: int) -> None:
        for r in range(30):
            k = (r + shift) % len(calls)
            got = method.execute(_clone(calls[k]["inputs"]))
            if not all(torch.equal(x, y) for x, y in zip(got, wants[k], strict=True)):
                problems.append(f"round {r} call {k}")

    threads = [threading.Thread(target=work, args=(m, s)) for s, m in enumerate(methods)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems


def test_turned_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _compiled("op_attention", monkeypatch, natively=False)
    report = compiled.compile_report
    assert report is not None and report.native_unavailable == "PTEXEC_NATIVE_CALLS=0"


def test_a_damaged_library_is_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library is a compile cache entry: a changed byte makes it a miss (one warning)
    and it is built again, never loaded as it is."""
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path / "cache"))
    first = native.find_or_build()
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.warns(CompileWarning, match="sha256"):
        again = native.find_or_build()
    assert again.read_bytes() != bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.find_or_build() == again  # now a clean hit
    # an intact entry of the key that holds no library (made by hand): replaced, not
    # taken for the library
    manifest = again.parent / "manifest.json"
    record = json.loads(manifest.read_text())
    record["files"] = {"other.so": record["files"].pop(again.name)}
    manifest.write_text(json.dumps(record))
    again.rename(again.parent / "other.so")
    with pytest.warns(CompileWarning, match=f"holds no {again.name}"):
        built = native.find_or_build()
    assert built.is_file() and built.name == again.name


def test_a_library_built_for_the_process_alone_leaves_no_files(tmp_path: Path) -> None:
    """Where the cache cannot keep the library (a root others may write), it is built in a
    private directory of the process, loaded, and the directory removed: nothing is left
    behind in the temporary directory, whatever the number of processes."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    temp = tmp_path / "tmp"
    temp.mkdir()
    script = (
        "from ptexec.compile import native\n"
        "assert native.library() is not None, native.unavailable()\n"
        "print(native.runs())\n"
    )
    env = {**os.environ, "PTEXEC_CACHE_DIR": str(shared), "TMPDIR": str(temp)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0"
    assert not list(temp.glob("ptexec-native-*"))
    assert not list(shared.iterdir())  # (nothing kept where others may write)


def test_a_released_runner_loads_its_payload_again() -> None:
    """A call whose native counterpart runs it releases the pybindings' method (one copy
    of the packed weights); a later call through the pybindings loads it again."""
    name = "op_attention"
    method = ptexec.load(XNNPACK_DIR / XNNPACK[name]["pte"]).load_method(
        "forward", xnnpack="executorch"
    )
    runners = [st.external for chain in method.state.chains for st in chain.loaded if st.external]
    assert runners
    call = _calls(name)[0]
    want = method.execute(_clone(call["inputs"]))
    for r in runners:
        r.release()  # type: ignore[attr-defined]
    for _ in range(2):
        got = method.execute(_clone(call["inputs"]))
        for x, y in zip(got, want, strict=True):
            assert torch.equal(x, y)


def _binder_loads(monkeypatch: pytest.MonkeyPatch, refuse: bool = False) -> list[str]:
    """Counts the pybindings' loads of one-delegate programs (each binder's ``where``);
    with ``refuse``, ExecuTorch refuses every one."""
    from ptexec.delegates.xnnpack import executorch_runner as etr

    etr.clear_idle()  # no method a freed one left: every runner loads its own
    loads: list[str] = []
    real = etr._Binder._load

    def counted(self: Any) -> None:
        loads.append(self.where)
        if refuse:
            raise RuntimeError("refused here")
        real(self)

    monkeypatch.setattr(etr._Binder, "_load", counted)
    return loads


def test_a_call_outside_every_compiled_region_stays_the_interpreters() -> None:
    """A delegate call no compiled region makes (a program that is one delegate call:
    nothing around it to compile) is run by the interpreter as loaded: no native call is
    made of it, so its payload is neither released nor loaded a second time."""
    path = XNNPACK_DIR / XNNPACK["cnn"]["pte"]
    method = ptexec.load(path).load_method("forward", xnnpack="auto", compile=GRAPH)
    report = method.compile_report
    assert report is not None and report.regions == () and report.native_calls == 0
    binders = [
        st.external._binder  # type: ignore[union-attr]
        for chain in method.state.chains
        for st in chain.loaded
        if st.external
    ]
    assert binders and all(b.method is not None for b in binders)  # loaded, kept
    plain = ptexec.load(path).load_method("forward")
    for call in _calls("cnn"):
        for x, y in zip(
            method.execute(_clone(call["inputs"])), plain.execute(call["inputs"]), strict=True
        ):
            assert torch.equal(x, y)


@pytest.mark.parametrize(
    "name", ["transformer_int8_dynamic_int4w_pc", "dynconv_padmodes_int8_dynamic_pc"]
)
def test_a_compiled_load_never_loads_what_the_native_calls_run(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled load defers the pybindings' loads: the payloads the native calls run are
    never loaded there (they were loaded, then released at once), every other payload is
    loaded before the method is handed out. Outputs as the interpreter's."""
    path = XNNPACK_DIR / XNNPACK[name]["pte"]
    plain = ptexec.load(path).load_method("forward")
    runners = [st.external for chain in plain.state.chains for st in chain.loaded if st.external]
    loads = _binder_loads(monkeypatch)
    method = ptexec.load(path).load_method("forward", xnnpack="auto", compile=GRAPH)
    report = method.compile_report
    assert report is not None and report.native_calls
    assert len(loads) == len(runners) - report.native_calls
    binders = [
        st.external._binder  # type: ignore[union-attr]
        for chain in method.state.chains
        for st in chain.loaded
        if st.external
    ]
    assert not any(b.deferred for b in binders)  # loaded, or released to the native calls
    assert sum(b.method is None for b in binders) == report.native_calls
    for call in _calls(name):
        want = plain.execute(_clone(call["inputs"]))
        got = method.execute(_clone(call["inputs"]))
        for x, y in zip(got, want, strict=True):
            assert torch.equal(x, y)


def test_a_refused_deferred_load_falls_back_as_a_load_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A payload ExecuTorch refuses falls back to ptexec's own XNNPACK code under
    ``xnnpack="auto"`` (and raises under ``"executorch"``), deferred or not."""
    name = "transformer_int8_dynamic_int4w_pc"
    path = XNNPACK_DIR / XNNPACK[name]["pte"]
    plain = ptexec.load(path).load_method("forward", xnnpack="torch")
    with monkeypatch.context() as m:
        monkeypatch.setenv("PTEXEC_NATIVE_CALLS", "0")  # nothing released to native calls
        loads = _binder_loads(m, refuse=True)
        method = ptexec.load(path).load_method("forward", xnnpack="auto", compile=GRAPH)
        assert loads  # tried, refused
        assert not [st for chain in method.state.chains for st in chain.loaded if st.external]
        with pytest.raises(ptexec.BackendUnavailableError, match="refused here"):
            ptexec.load(path).load_method("forward", xnnpack="executorch", compile=GRAPH)
    for call in _calls(name):
        want = plain.execute(_clone(call["inputs"]))
        got = method.execute(_clone(call["inputs"]))
        for x, y in zip(got, want, strict=True):
            assert torch.allclose(x, y, rtol=1e-5, atol=1e-5)


def test_a_tensor_that_does_not_fit_the_delegate_is_refused(tmp_path: Path) -> None:
    """A native call runs ExecuTorch's backend on the delegate directly, so it checks each
    tensor against the delegate's argument as ExecuTorch's ``Method.set_input`` would:
    another dtype or rank, or more elements than the bound, is an error that names the
    tensor, and the next good call computes what eager PyTorch does."""
    model, path = dynamic_batch_program(tmp_path)
    method = ptexec.load(path).load_method("forward", xnnpack="executorch")
    runners = [st.external for chain in method.state.chains for st in chain.loaded if st.external]
    program = runners[0].program()  # type: ignore[union-attr]
    assert program is not None
    tensors = program.tensors
    (out,) = program.outputs
    assert [t.shape_dynamism != 0 for t in tensors] == [True, True]  # batch 1-16
    c = native.call(
        program,
        [out],
        [1],
        [torch.empty(list(tensors[out].sizes))],
        [list(t.dim_order) for t in tensors],
    )

    def good(n: int) -> None:
        x = torch.randn(n, 8)
        (y,) = c.run([x])
        assert y.shape == (n, 16)
        torch.testing.assert_close(y, model.a(x), rtol=1e-5, atol=1e-5)

    good(3)
    for bad in (torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, 1), torch.randn(17, 8)):
        with pytest.raises(RuntimeError, match=r"(tensor|input) 0 (does not fit|has 3 dims)"):
            c.run([bad])
        good(5)
    with pytest.raises(RuntimeError, match="one shape kind per argument"):  # a third tensor
        orders = [[0, 1]] * 3
        native.call(program, [out], [1], [torch.empty(list(tensors[out].sizes))], orders)


_FORK_MID_BUILD = """
import json, os, signal, threading
from ptexec.compile import native

parent = os.getpid()
inside, leave = threading.Event(), threading.Event()
def building():  # a first build: minutes on a busy machine
    if os.getpid() == parent:
        inside.set()
        leave.wait()
    raise RuntimeError(f"not built in {{'the parent' if os.getpid() == parent else 'the child'}}")
native.find_or_build = building
worker = threading.Thread(target=native.library)
worker.start()
inside.wait()
child = os.fork()
if child == 0:
    signal.alarm(30)  # (a load waiting for the parent's build for ever)
    print(json.dumps({{"child": [native.library(), native.unavailable()]}}), flush=True)
    os._exit(0)
_, code = os.waitpid(child, 0)
leave.set()
worker.join()
print(json.dumps({{"code": code, "parent": [native.library(), native.unavailable()]}}), flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_during_the_librarys_build_finds_or_builds_its_own() -> None:
    """A process forked while another thread builds the library (a compiled load on a
    thread beside the one forking workers): the build never ends in the child, whose
    compiled loads waited for its lock for ever. The child looks for the library itself."""
    done = subprocess.run(
        [sys.executable, "-c", _FORK_MID_BUILD.format()],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert len(lines) == 2, done.stdout
    child, parent = lines
    assert child["child"][0] is None and "not built in the child" in child["child"][1]
    assert parent["code"] == 0
    assert parent["parent"][0] is None and "not built in the parent" in parent["parent"][1]
