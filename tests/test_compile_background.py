"""``load_method(..., compile="background")``: interpreted at once, compiled by another
process, swapped between calls.

The default run checks what needs no finished compile (a missing compiler, dropping a
method while its compile runs, the options). The tests marked ``slow`` wait for real
compiles (a minute or more each on a busy machine): they share one cache directory for
this module, so each program compiles once, and the cache starts empty, so the first load
of each is a miss that a child process fills.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from compile_util import skip_slow_unless_asked
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec.compile import CompileOptions, CompileWarning

_WAIT = 900.0  # seconds a test waits for one compile at most (a busy machine)


@pytest.fixture(scope="module")
def module_cache() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ptexec-background-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _cache(
    request: pytest.FixtureRequest, module_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_slow_unless_asked(request)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(module_cache))


def _clone(xs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _reference(name: str) -> list[list[Any]]:
    """The interpreter's outputs of the fixture's stored calls, in order, on its own
    program."""
    pte, ptd = fixture_paths(name)
    prog = ptexec.load(pte, data_path=ptd)
    methods = {m: prog.load_method(m) for m in prog.method_names}
    return [methods[c["method"]].execute(_clone(c["inputs"])) for c in fixture_calls(name)]


def _background(name: str, method: str = "forward") -> ptexec.Method:
    pte, ptd = fixture_paths(name)
    return ptexec.load(pte, data_path=ptd).load_method(method, compile="background")


def _not_running(pid: int) -> bool:
    """The process is gone and reaped (no zombie left behind)."""
    return not os.path.exists(f"/proc/{pid}")


def _leftovers(root: Path) -> list[str]:
    return [n for n in os.listdir(root) if n.startswith(".")] if root.exists() else []


# ---- without a finished compile -------------------------------------------------------


def test_options_are_checked() -> None:
    pte = fixture_paths("mlp")[0]
    prog = ptexec.load(pte)
    with pytest.raises(ValueError, match="'background'"):
        prog.load_method("forward", compile="later")
    with pytest.raises(ValueError, match="cuda_graph"):
        prog.load_method("forward", compile="background", cuda_graph=True)
    with pytest.raises(ValueError, match="backend='aoti'"):
        CompileOptions(background=True, backend="graph")
    with pytest.raises(ValueError, match="cache=True"):
        CompileOptions(background=True, cache=False)
    assert prog.load_method("forward").compile_status == "interpreted"
    assert prog.load_method("forward").background_compile is None


def test_without_a_compiler_it_fails_at_once_and_runs_interpreted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "ptexec-no-such-compiler")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = _background("mlp")
    ours = [w for w in caught if issubclass(w.category, CompileWarning)]
    assert len(ours) == 1 and "C++ compiler" in str(ours[0].message), ours
    assert m.compile_status.startswith("failed: ") and "C++ compiler" in m.compile_status
    job = m.background_compile
    assert job is not None and job.pid is None  # no process was started
    assert m.wait_compiled(0) is False
    report = m.compile_report
    assert report is not None and report.compiled_instructions == 0 and report.warning
    want = _reference("mlp")
    for call, expected in zip(fixture_calls("mlp"), want, strict=True):
        assert torch.equal(m.execute(_clone(call["inputs"]))[0], expected[0])
    assert not list(tmp_path.iterdir())


def test_first_call_is_answered_while_compiling_and_dropping_ends_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))  # empty: it must compile
    want = _reference("mlp")
    m = _background("mlp")
    job = m.background_compile
    assert job is not None and m.compile_status == "pending"
    pid = job.pid
    assert pid is not None
    call = fixture_calls("mlp")[0]
    got = m.execute(_clone(call["inputs"]))
    assert m.compile_status == "pending"  # answered before the compile finished
    assert compare_outputs(got, want[0], *tolerance("mlp")) is None
    assert torch.equal(got[0], want[0][0])  # the interpreter's own result
    del m, job
    gc.collect()
    assert _not_running(pid)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already
    assert _leftovers(tmp_path) == []
    assert [n for n in os.listdir(tmp_path) if len(n) == 64] == []


def test_a_detached_compile_outlives_its_method(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))
    m = _background("mlp")
    job = m.background_compile
    assert job is not None and job.pid is not None
    pid = job.pid
    job.detach()
    del m, job
    gc.collect()
    try:
        assert not _not_running(pid)  # dropping the method did not end it
    finally:
        os.killpg(pid, signal.SIGTERM)  # not needed here: end it (it is reaped by its thread)


def test_a_compile_into_another_cache_root_is_not_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load compiling into one cache root does not wait for a child compiling the same
    key into another (``PTEXEC_CACHE_DIR`` changed in between): that child's entry is not
    where this load looks, and its end (a kill, a cancel) was this load's failure."""
    from ptexec.compile import background

    idle = tmp_path / "idle_child.py"
    idle.write_text("import time\ntime.sleep(120)\n")
    monkeypatch.setattr(background, "child_command", lambda: [sys.executable, str(idle)])
    pte = fixture_paths("mlp")[0]
    jobs = []
    for root in ("a", "b", "b"):
        monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path / root))
        m = ptexec.load(pte).load_method("forward", compile="background")
        job = m.background_compile
        assert job is not None and job.pid is not None, m.compile_status
        jobs.append((m, job))
    try:
        pids = [job.pid for _, job in jobs]
        assert pids[0] != pids[1] and pids[1] == pids[2], pids  # one child per root and key
    finally:
        for _, job in jobs:
            job.cancel()


def test_program_from_bytes_is_written_for_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))
    pte = fixture_paths("mlp")[0]
    prog = ptexec.load(pte.read_bytes())
    assert prog.paths == (None,)
    m = prog.load_method("forward", compile="background")
    assert m.compile_status == "pending"
    job = m.background_compile
    assert job is not None
    job.cancel()
    assert m.compile_status == "failed: cancelled"
    assert m.wait_compiled(0) is False
    x = fixture_calls("mlp")[0]["inputs"]
    assert torch.equal(m.execute(_clone(x))[0], _reference("mlp")[0][0])


_REWRITING_CHILD = """
import os
import sys

import torch

import ptexec.compile.aoti as aoti
from ptexec.compile.runner import RegionBuilder


def compile_models(exported, device, autotune=True, native_entry=False, serial=False):
    out = {}
    for name, ep in exported.items():
        path = os.path.join(os.environ["PTEXEC_TEST_OUT"], f"{name}-{os.getpid()}.so")
        torch.export.save(ep, path)
        out[name] = [path]
    return out


def load_model(path, name, device):
    module = torch.export.load(str(path)).module(check_guards=False)
    return lambda xs: list(module(*xs))


def build(self, _build=RegionBuilder.build):
    at, size = (int(v) for v in os.environ["PTEXEC_TEST_ZEROED"].split(","))
    with open(os.environ["PTEXEC_TEST_PTE"], "r+b") as f:
        f.seek(at)
        f.write(bytes(size))
    return _build(self)


aoti.compile_models, aoti.load_model = compile_models, load_model
aoti.find_compiler = lambda: "c++"
RegionBuilder.build = build
from ptexec.compile import background_child

sys.exit(background_child._child_main())
"""


def test_a_file_rewritten_after_the_childs_key_check_compiles_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child read the program's file through a memory map even where the caller read
    it into private memory: a file rewritten in place after the child's key check (here
    its constants zeroed) was compiled as rewritten and kept under the key of the bytes
    the caller loaded, whose method then answered zeros. The graphs stand in for
    AOTInductor's libraries (saved by torch.export in the child, run by torch here)."""
    import ptexec.compile.aoti as aoti
    from ptexec.compile import background

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PTEXEC_TEST_OUT", str(tmp_path))
    pte = tmp_path / "mlp.pte"
    shutil.copyfile(fixture_paths("mlp")[0], pte)
    prog = ptexec.load(pte)  # a private copy: the file may change afterwards
    constants = prog.pte.segments[prog.pte.program.constant_segment.segment_index]
    monkeypatch.setenv("PTEXEC_TEST_PTE", str(pte))
    monkeypatch.setenv("PTEXEC_TEST_ZEROED", f"{constants.offset},{constants.size}")
    child = tmp_path / "rewriting_child.py"
    child.write_text(_REWRITING_CHILD)
    monkeypatch.setattr(background, "child_command", lambda: [sys.executable, str(child)])

    def load_model(path: Path, name: str, device: Any) -> Any:
        module = torch.export.load(str(path)).module(check_guards=False)
        return lambda xs: list(module(*xs))

    monkeypatch.setattr(aoti, "load_model", load_model)
    monkeypatch.setattr(aoti, "find_compiler", lambda: "c++")
    m = prog.load_method("forward", compile="background")
    assert m.wait_compiled(_WAIT), m.compile_status
    (call,) = fixture_calls("mlp")[:1]
    problem = compare_outputs(m.execute(_clone(call["inputs"])), call["outputs"], *tolerance("mlp"))
    assert problem is None, problem


# ---- with real compiles (slow) --------------------------------------------------------


@pytest.mark.slow
def test_two_threads_call_across_the_swap() -> None:
    want = _reference("mlp")
    calls = fixture_calls("mlp")
    rtol, atol = tolerance("mlp")
    m = _background("mlp")
    assert m.compile_status == "pending"
    first = m.execute(_clone(calls[0]["inputs"]))
    assert m.compile_status == "pending"
    assert compare_outputs(first, want[0], rtol, atol) is None

    problems: list[str] = []
    seen: list[tuple[str, str]] = []  # (status before the call, after it)
    abort = threading.Event()  # the compile failed: no swap to wait for

    def caller() -> None:
        after_swap = 0  # each thread calls on until it has made 20 calls after the swap
        while after_swap < 20 and not abort.is_set():
            for k, call in enumerate(calls):
                before = m.compile_status
                got = m.execute(_clone(call["inputs"]))
                seen.append((before, m.compile_status))
                problem = compare_outputs(got, want[k], rtol, atol)
                if problem is not None:
                    problems.append(f"call {k} ({before}): {problem}")
                if before == "compiled":
                    after_swap += 1

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    compiled = False
    try:
        compiled = m.wait_compiled(_WAIT)
    finally:
        if not compiled:
            abort.set()
        for t in threads:
            t.join()
    assert compiled, m.compile_status
    assert problems == []
    assert any(b == "pending" for b, _ in seen) and any(b == "compiled" for b, _ in seen)
    report = m.compile_report
    assert report is not None and report.fully_compiled, report
    assert m.background_compile is not None and m.background_compile.pid is None
    for k, call in enumerate(calls):
        assert compare_outputs(m.execute(_clone(call["inputs"])), want[k], rtol, atol) is None
    # a second load finds the entry: compiled at once, no process
    again = _background("mlp")
    assert again.compile_status == "compiled"
    job = again.background_compile
    assert job is not None and job.pid is None


@pytest.mark.slow
def test_state_carries_over_the_swap() -> None:
    """A stateful method's calls before and after the swap give the interpreter's
    sequence: the compiled runner continues the state the interpreted calls left."""
    name = "stateful"
    want = _reference(name)
    calls = fixture_calls(name)
    rtol, atol = tolerance(name)
    m = _background(name)
    assert m.compile_status == "pending"
    half = max(1, len(calls) // 2)
    for k in range(half):
        got = m.execute(_clone(calls[k]["inputs"]))
        assert compare_outputs(got, want[k], rtol, atol) is None, k
    pending_calls = m.compile_status == "pending"
    assert m.wait_compiled(_WAIT), m.compile_status
    assert pending_calls  # the first half ran interpreted
    for k in range(half, len(calls)):
        got = m.execute(_clone(calls[k]["inputs"]))
        assert compare_outputs(got, want[k], rtol, atol) is None, k


@pytest.mark.slow
def test_a_failing_compile_leaves_it_interpreted_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    false = shutil.which("false")
    if false is None:
        pytest.skip("no 'false' program to stand for a broken compiler")
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("CXX", false)  # exists, and fails every compile
    want = _reference("mlp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = _background("mlp")
        assert m.compile_status == "pending"
        assert m.wait_compiled(_WAIT) is False
    ours = [w for w in caught if issubclass(w.category, CompileWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert m.compile_status.startswith("failed: "), m.compile_status
    report = m.compile_report
    assert report is not None and report.compiled_instructions == 0
    x = fixture_calls("mlp")[0]["inputs"]
    assert torch.equal(m.execute(_clone(x))[0], want[0][0])
    assert _leftovers(tmp_path / "cache") == []


def test_a_finished_compile_leaves_no_pipe_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's pipes are closed when its result is read, not left to the collector
    (which warned of an unclosed file)."""
    false = shutil.which("false")
    if false is None:
        pytest.skip("no 'false' program to stand for a broken compiler")
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("CXX", false)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = _background("mlp")
        assert m.wait_compiled(_WAIT) is False
        del m
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == []


# ---- the server ------------------------------------------------------------------------


def test_server_sessions_share_one_compile_and_health_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    httpx = pytest.importorskip("httpx")
    from serve_support import running_server, tokenizer_folder

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path / "cache"))  # empty: it compiles
    tok = tokenizer_folder(tmp_path)
    with running_server(tok, compile="background", sessions=2) as server:
        engine = server.engine
        jobs = [r.decoder.method.background_compile for r in engine.runners]
        assert all(j is not None for j in jobs)
        pids = {j.pid for j in jobs}  # type: ignore[union-attr]
        assert len(pids) == 1 and None not in pids  # one child for both sessions
        health = httpx.get(server.url + "/health", timeout=30).json()
        assert health["compile"] == "pending"
        r = httpx.post(
            server.url + "/v1/completions",
            json={"model": "tiny-llama", "prompt": "Once", "max_tokens": 3, "temperature": 0},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        (pid,) = pids
    for j in jobs:
        j.cancel()  # type: ignore[union-attr]
    assert _not_running(pid)


def test_the_child_imports_nothing_from_the_working_directory(tmp_path: Path) -> None:
    """The compile child is started with the caller's working directory, which ``-m``
    and ``-c`` put first on the module path: a ``torch.py`` in a downloaded model's folder
    ran as the user in the child (the parent never imports it). The child takes that
    entry off before importing anything."""
    import subprocess

    from ptexec.compile import background

    ran = tmp_path / "planted.ran"
    for name in ("torch", "json", "runpy", "ptexec"):
        (tmp_path / f"{name}.py").write_text(f"open({str(ran)!r}, 'a').write('{name} ')\n")
    here = str(Path(background.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": here}
    done = subprocess.run(
        background.child_command(),
        cwd=tmp_path,
        env=env,
        # no request, then "detach" (else the child ends as its stdin closes, maybe before
        # it answers): it answers that it failed, and ends
        input=b"\ndetach\n",
        capture_output=True,
        timeout=300,
    )
    assert not ran.exists(), ran.read_text()
    assert b'"ok": false' in done.stdout  # it ran, and said so


def test_a_method_dropped_while_its_compile_is_taken_in_ends_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method dropped after its compile process finished, while the compiled code was
    being loaded, left its job pending for ever: ``wait()`` without a timeout never
    returned and ``status`` said ``pending`` of a compile that was over. It ends as a
    cancelled one does."""
    import ptexec.compile.aoti as aoti
    from ptexec.compile import background
    from ptexec.compile.runner import RegionBuilder

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))
    answer = 'import sys; sys.stdin.readline(); print(\'{"ok": true, "reason": ""}\')'
    monkeypatch.setattr(background, "child_command", lambda: [sys.executable, "-c", answer])
    monkeypatch.setattr(aoti, "find_compiler", lambda: "c++")
    entered, go = threading.Event(), threading.Event()
    load_cached = RegionBuilder.load_cached

    def loading(self: RegionBuilder) -> bool:
        if not threading.current_thread().name.startswith("ptexec-compile-"):
            return load_cached(self)  # the load's own look into the cache: a miss
        entered.set()  # the process has finished: its entry is being loaded
        go.wait(60)
        return True  # (nothing to install but the plain statements)

    monkeypatch.setattr(RegionBuilder, "load_cached", loading)
    m = _background("mlp")
    job = m.background_compile
    assert job is not None and m.compile_status == "pending"
    assert entered.wait(60)
    del m
    gc.collect()
    go.set()
    assert job.wait(30) is False
    assert job.status == "failed: cancelled"


_FORKED = """
import gc, json, os, sys
sys.path.insert(0, {tests!r})
import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec.compile import background

background.child_command = lambda: [sys.executable, {idle!r}]
m = ptexec.load(fixture_paths("mlp")[0]).load_method("forward", compile="background")
pid = m.background_compile.pid
call = fixture_calls("mlp")[0]
read, write = os.pipe()
fork = os.fork()
if fork == 0:  # a worker of a preloading server
    os.close(read)
    wrong = compare_outputs(m.execute(call["inputs"]), call["outputs"], *tolerance("mlp"))
    waited = m.wait_compiled(10)
    seen = dict(wrong=wrong, waited=waited, status=m.compile_status)
    os.write(write, json.dumps(seen).encode())
    del m
    gc.collect()
    sys.exit(0)  # an ordinary end: finalizers and exit functions run
os.close(write)
with os.fdopen(read) as f:
    child = json.loads(f.read())
_, code = os.waitpid(fork, 0)
try:
    with open(f"/proc/{{pid}}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
except FileNotFoundError:
    state = "gone"
print(json.dumps(dict(child=child, code=code, state=state, status=m.compile_status)))
m.background_compile.cancel()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_leaves_the_parents_compile_alone(tmp_path: Path) -> None:
    """A process forked while its method compiles (a preloading server's worker) does not
    own the compile process: the child's end, or its dropping the method, ended the
    parent's compile with SIGTERM (the parent's method then failed its compile), and the
    child's job stayed pending for ever (``wait`` without a timeout never returned). The
    child's method answers interpreted, its job failed; the parent's compile runs on."""
    import json
    import subprocess

    idle = tmp_path / "idle_child.py"
    idle.write_text("import time\ntime.sleep(120)\n")
    code = _FORKED.format(tests=str(Path(__file__).resolve().parent), idle=str(idle))
    env = {**os.environ, "PTEXEC_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["code"] == 0
    assert seen["child"]["wrong"] is None  # the fixture's eager outputs
    assert seen["child"]["waited"] is False
    assert seen["child"]["status"].startswith("failed: the process was forked")
    assert seen["state"] in ("S", "R")  # the parent's compile process runs on
    assert seen["status"] == "pending"
