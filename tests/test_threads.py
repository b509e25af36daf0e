"""One thread setting (``ptexec.set_num_threads``) and ExecuTorch's thread pool.

Anything that replaces ExecuTorch's pool runs in a subprocess: the pool is process-wide,
and a program loaded by ExecuTorch's own runtime in the test process would keep the
destroyed one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from ptexec import threads

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "tests" / "fixtures" / "xnnpack"


def _subprocess(code: str, timeout: float = 300) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter on this tree; its last line of output is JSON.
    A hang is the failure this guards against: the timeout ends it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the subprocess hung (killed after {timeout} s): {e.stdout!r}")
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout}{proc.stderr}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def et() -> None:
    from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

    reason = executorch_unavailable()
    if reason is not None:
        pytest.skip(reason)


# what the subprocesses share: a CNN whose convolutions XNNPACK parallelizes, loaded by
# ptexec under xnnpack="auto", and a way to make the memory of a destroyed pool hold
# something else (as anything allocating in the process would)
_PRELUDE = f"""
import json, torch, ptexec
from ptexec import threads
# ExecuTorch's pybindings; its portable_lib re-exports these very functions
import executorch.extension.pybindings._C as et

def spray():
    return [bytes([1]) * n for n in range(64, 8192, 8) for _ in range(4)]

calls = torch.load({str(DIR / "cnn.io.pt")!r}, weights_only=True)["calls"]
inputs = calls[0]["inputs"]
def load():
    return ptexec.load({str(DIR / "cnn.pte")!r}).load_method("forward", xnnpack="auto")

def held(m):  # the pool (address, size) each of m's ExecuTorch runners was loaded with
    return [
        (fn.__globals__["_at"], fn.__globals__["_n"])
        for chain in m.state.chains
        for st in chain.statements
        for fn in st.env.values()
        if getattr(fn, "__name__", "") == "_xnnpack_et_run"
    ]
"""


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_methods_survive_executorchs_pool_reset(et: None, name: str) -> None:
    """ExecuTorch's ``_unsafe_reset_threadpool`` destroys the pool XNNPACK's runtimes were
    made with. A ptexec method loaded before keeps giving the same outputs afterwards (it
    hung before: XNNPACK waited on the destroyed pool's threads), also when resets bring a
    destroyed pool's address back with another size, and with the memory reused; also a
    method of several delegates, whose call checks the pool once for all of them, and a
    second load, whose call is the text generated for the first."""
    code = (
        _PRELUDE.replace("cnn.", f"{name}.")
        + """
et._unsafe_reset_threadpool(2)  # XNNPACK's runtime is made with a pool of 2 threads
m = load()
again = load()  # its fast call: the text generated for m's load, bound into this one
(want,) = [y.clone() for y in m(*inputs)]
runners = len(held(m))
results = []
for n in (1, 3, 2, 1, 2, 1, 3):
    et._unsafe_reset_threadpool(n)
    junk = spray()
    row = [n, et._threadpool_get_thread_count()]
    for method in (m, again):
        for _ in range(2):
            (got,) = method(*inputs)
        ok = held(method) == [threads.executorch_pool().key()] * runners
        checked = threads.executorch_pool().checked[0]  # None between calls
        row += [torch.equal(got, want), ok, checked]
    results.append(row)
from ptexec.engine import fastcall
kept = len(fastcall._generated)  # the text generated for m's load was kept
print(json.dumps({"results": results, "runners": runners, "kept": kept}))
"""
    )
    out = _subprocess(code)
    assert out["runners"] == (1 if name == "cnn" else 5) and out["kept"] == 1
    assert out["results"] == [[n, n] + [True, True, None] * 2 for n in (1, 3, 2, 1, 2, 1, 3)]


def test_one_setting_sets_torch_and_executorchs_pool(et: None) -> None:
    """``ptexec.set_num_threads`` sets torch's threads and ExecuTorch's pool, at once (it
    imports ExecuTorch's runtime to do so: a pool replaced later, when methods loaded by
    ExecuTorch's own runtime might hold it, would break those). ptexec's
    ``portable_lib._unsafe_reset_threadpool`` is the same setting (0 changes nothing, as
    in ExecuTorch). Methods loaded before each change keep their outputs."""
    code = (
        """
import sys
from ptexec import threads
threads.set_num_threads(1)
assert "executorch.extension.pybindings._C" in sys.modules
"""
        + _PRELUDE
        + """
from ptexec import portable_lib as pl
seen = {"before": [threads.get_num_threads(), et._threadpool_get_thread_count()]}
m = load()
seen["loaded"] = [torch.get_num_threads(), et._threadpool_get_thread_count()]
(want,) = [y.clone() for y in m(*inputs)]
ptexec.set_num_threads(2)
junk = spray()
(got,) = m(*inputs)
seen["set 2"] = [torch.get_num_threads(), et._threadpool_get_thread_count(),
                 torch.equal(got, want), held(m) == [threads.executorch_pool().key()]]
pl._unsafe_reset_threadpool(1)
junk = spray()
(got,) = m(*inputs)
seen["portable_lib 1"] = [torch.get_num_threads(), pl._threadpool_get_thread_count(),
                          et._threadpool_get_thread_count(), torch.equal(got, want)]
pl._unsafe_reset_threadpool(0)
seen["portable_lib 0"] = [torch.get_num_threads(), et._threadpool_get_thread_count()]
from ptexec.cli import common as cli
seen["cli same"] = cli.threads_used()
torch.set_num_threads(3)  # behind ptexec's back: the command line says both counts
seen["cli differ"] = cli.threads_used()
print(json.dumps(seen))
"""
    )
    out = _subprocess(code)
    assert out["before"] == [1, 1]
    assert out["loaded"] == [1, 1]
    assert out["set 2"] == [2, 2, True, True]
    assert out["portable_lib 1"] == [1, 1, 1, True]
    assert out["portable_lib 0"] == [1, 1]
    assert out["cli same"] == "on 1 thread"
    assert out["cli differ"] == "on 3 threads (ExecuTorch's XNNPACK pool: 1)"


@pytest.mark.parametrize(
    "n, error, match",
    [
        (0, ValueError, "1 to 4096, got 0"),
        (-1, ValueError, "1 to 4096, got -1"),
        (4097, ValueError, "1 to 4096, got 4097"),  # 2**31 - 1 took torch's OpenMP down
        (2**31, ValueError, "1 to 4096, got 2147483648"),
        (True, TypeError, "must be an int, got True"),
        (2.0, TypeError, "must be an int, got float"),
        ("2", TypeError, "must be an int, got str"),
    ],
)
def test_a_bad_count_is_refused_before_anything_changes(
    n: Any, error: type[Exception], match: str
) -> None:
    before = torch.get_num_threads()
    with pytest.raises(error, match=match):
        ptexec.set_num_threads(n)
    assert torch.get_num_threads() == before == ptexec.get_num_threads()


def test_the_setting_is_ptexecs_top_level_name() -> None:
    assert ptexec.set_num_threads is threads.set_num_threads
    assert ptexec.get_num_threads is threads.get_num_threads


_WORKER = f"""
import json, queue, threading, torch, ptexec
from ptexec.engine.hooks import Hooks
import executorch.extension.pybindings._C as et

m = ptexec.load({str(ROOT / "tests" / "fixtures" / "mlp.pte")!r}).load_method("forward")
x = torch.ones(2, 8)
jobs, results = queue.Queue(), queue.Queue()

def worker():  # one long-lived thread, as a host's pool keeps them
    for job in iter(jobs.get, None):
        try:
            results.put((job(), None))
        except BaseException as e:
            results.put((None, e))

threading.Thread(target=worker, daemon=True).start()

def on_worker(job):
    jobs.put(job)
    value, error = results.get()
    if error is not None:
        raise error
    return value

def fresh():  # torch's own count for a thread that ran nothing: the setting
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]

class Seen(Hooks):
    def begin(self, v):
        self.count = torch.get_num_threads()

def watched():
    hooks = Seen()
    m.run_with(hooks, [x])
    return hooks.count

def called():
    m(x)
    return torch.get_num_threads()
"""


def test_a_thread_that_ran_calls_before_the_setting_takes_it(et: None) -> None:
    """torch's count is per OS thread: one that ran kernels keeps its count after another
    thread calls ``set_num_threads``. A call on such a thread runs on the setting, as
    ExecuTorch's process-wide pool and a thread that ran nothing do."""
    code = (
        _WORKER
        + """
seen = {}
for n in (1, 2, 1):
    ptexec.set_num_threads(n)
    seen[n] = [on_worker(called), on_worker(watched), et._threadpool_get_thread_count(), fresh()]
ptexec.set_num_threads(2)
seen["asked"] = [on_worker(ptexec.get_num_threads), fresh()]
print(json.dumps(seen))
"""
    )
    out = _subprocess(code)
    assert out["1"] == [1, 1, 1, 1]
    assert out["2"] == [2, 2, 2, 2]
    assert out["asked"] == [2, 2]


def test_a_compiled_load_on_such_a_thread_is_made_for_the_setting(et: None, tmp_path: Path) -> None:
    """Compiled code is made for the loading thread's torch count, and keyed by it: a load
    on a thread that ran calls before ``set_num_threads`` asked its compile (and looked in
    the cache) for the old count, where a thread that ran nothing asks for the setting.
    A stand-in compile process records what it was asked."""
    code = (
        _WORKER
        + f"""
import os, sys
import ptexec.compile.aoti as aoti
from ptexec.compile import background
from ptexec.compile.runner import CompileOptions, RegionBuilder
os.environ["PTEXEC_CACHE_DIR"] = {str(tmp_path / "cache")!r}
asked = {str(tmp_path / "asked.json")!r}
record = (
    "import sys; open(sys.argv[1], 'w').write(sys.stdin.readline()); "
    "print('{{\\"ok\\": false, \\"reason\\": \\"stand-in\\"}}')"
)
background.child_command = lambda: [sys.executable, "-c", record, asked]
aoti.find_compiler = lambda: "c++"
ptexec.set_num_threads(1)
on_worker(called)
ptexec.set_num_threads(2)
prog = ptexec.load({str(ROOT / "tests" / "fixtures" / "mlp.pte")!r})

def load():
    return prog.load_method("forward", compile="background")

method = on_worker(load)
method.wait_compiled(60)
with open(asked) as f:
    request = json.load(f)

def key():  # on a thread that ran nothing: torch gives it the setting
    state = prog.load_method("forward").state
    keys.append(RegionBuilder(state, prog, CompileOptions()).entry().key)

keys = []
t = threading.Thread(target=key)
t.start()
t.join()
print(json.dumps({{"threads": request["threads"], "same key": request["key"] == keys[0]}}))
"""
    )
    out = _subprocess(code)
    assert out == {"threads": 2, "same key": True}


# -- the command line ------------------------------------------------------------------------


@pytest.fixture
def torch_threads(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Commands here set torch's threads only (restored after): ExecuTorch's pool is left
    alone in the test process (the subprocess tests above replace it)."""
    monkeypatch.setattr(threads, "executorch_pool", lambda module=None, load=False: None)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


MLP = str(ROOT / "tests" / "fixtures" / "mlp.pte")


@pytest.mark.parametrize("command", ["run", "profile", "trace", "compile", "generate", "serve"])
@pytest.mark.parametrize("n", ["0", "-2"])
def test_cli_refuses_a_bad_thread_count_in_one_line(
    command: str, n: str, capsys: pytest.CaptureFixture[str], torch_threads: None
) -> None:
    """A usage error (exit 2, as --repeat's), refused before anything is loaded (the file
    does not exist) or printed."""
    from ptexec.cli import main

    argv = [command, "missing.pte", f"--threads={n}"]
    if command == "generate":
        argv += ["--tokenizer", "missing.json", "--prompt", "hi"]
    before = torch.get_num_threads()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"ptexec {command}: argument --threads: expected a positive integer, got {n} "
        f"(see ptexec {command} --help)\n"
    )
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    "command, line",
    [
        (["run", "--repeat", "3"], ") on 1 thread\n"),
        (["profile", "--repeat", "2"], "\n  ran on 1 thread\n"),
        (["trace"], "\n  ran on 1 thread\n"),
    ],
)
def test_cli_runs_on_the_threads_asked_and_says_so(
    command: list[str],
    line: str,
    capsys: pytest.CaptureFixture[str],
    torch_threads: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ptexec.cli import main

    seen: list[int] = []
    real = threads.set_num_threads
    monkeypatch.setattr(threads, "set_num_threads", lambda n: (seen.append(n), real(n))[1])
    torch.set_num_threads(2)
    assert main([command[0], MLP, "--threads", "1", *command[1:]]) == 0
    out = capsys.readouterr().out
    assert line in out, out
    assert seen == [1] and torch.get_num_threads() == 1
    # without --threads, nothing is set: the count is torch's
    torch.set_num_threads(2)
    seen.clear()
    assert main([command[0], MLP, *command[1:]]) == 0
    assert line.replace("1 thread", "2 threads") in capsys.readouterr().out
    assert seen == []


def test_cli_compile_says_its_threads(
    capsys: pytest.CaptureFixture[str], torch_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ptexec compile --threads N`` sets the count before compiling (AOTInductor's CPU
    code is made for the thread count of the compile) and says it; the compile itself is
    tests/test_compile.py's."""
    from types import SimpleNamespace

    from ptexec import cli
    from ptexec.cli import compile as cli_compile

    counts: list[int] = []

    def compiled(prog: Any, name: str, device_map: Any) -> Any:
        counts.append(torch.get_num_threads())
        return SimpleNamespace(warning=None, compiled_instructions=1)

    monkeypatch.setattr(cli_compile, "print_compiled", compiled)
    assert cli.main(["compile", MLP, "--threads", "1"]) == 0
    assert capsys.readouterr().out.startswith("compiling on 1 thread\nmethod 'forward':")
    assert counts == [1]


def test_compiled_code_is_keyed_by_the_thread_count() -> None:
    """AOTInductor's CPU code is made for the thread count of its compile: a method loaded
    compiled at another count compiles (or finds) code for that count, not the other's."""
    from ptexec.compile.runner import CompileOptions, RegionBuilder

    prog = ptexec.load(MLP)
    state = prog.load_method("forward").state
    before = torch.get_num_threads()
    try:
        keys = []
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            keys.append(RegionBuilder(state, prog, CompileOptions()).entry().key)
    finally:
        torch.set_num_threads(before)
    assert keys[0] != keys[1] and keys[0] == keys[2]


class _Reductions(torch.nn.Module):
    """Whole-tensor reductions, which AOTInductor's CPU code splits over its threads."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x * 2.0).sum(), (x * x).amax(), x.to(torch.int64).sum()


def test_compiled_code_runs_on_its_compile_count_after_a_change() -> None:
    """Compiled at the machine's core count, a parallel reduction keeps one partial result
    per thread of that count; the code ran on the threads current at each call, so more
    threads than at the compile wrote past those partials (the process crashed). It runs
    on the compile's count at any count set later, and gives eager PyTorch's values."""
    from compile_util import session_cache_dir
    from export_util import export_program

    x = torch.arange(1 << 20, dtype=torch.float32) % 7 - 3
    pte = export_program(_Reductions(), (x,))
    cores = os.cpu_count() or 1
    want = [float(y) for y in _Reductions()(x)]
    code = f"""
import json, os, sys, torch, ptexec
os.environ["PTEXEC_CACHE_DIR"] = {str(session_cache_dir())!r}
ptexec.set_num_threads({cores})  # AOTInductor's own default count
x = torch.arange(1 << 20, dtype=torch.float32) % 7 - 3
m = ptexec.load(bytes.fromhex({pte.hex()!r})).load_method("forward", compile=True)
assert m.compile_report.compiled_instructions > 0, m.compile_report
seen = {{}}
for n in ({cores}, 1, {cores + 1}, {2 * cores + 1}):
    ptexec.set_num_threads(n)
    seen[n] = [float(y) for y in m(x)]
print(json.dumps(seen))
"""
    out = _subprocess(code)
    assert list(out) == [str(n) for n in (cores, 1, cores + 1, 2 * cores + 1)]
    for n, got in out.items():
        assert got[1:] == want[1:], n  # a maximum and an integer sum: exact
        assert got[0] == pytest.approx(want[0], rel=1e-6, abs=1e-3), n


def test_code_beside_delegate_calls_serves_every_thread_count(et: None) -> None:
    """A method whose CPU regions all call delegates compiles its kernels to run on the
    calling thread (XNNPACK's pool has the threads), so its code is the same at any count:
    one cache entry serves them all. Its regions are compiled serial because the plan
    says they call delegates, whatever the traced graph shows."""
    from ptexec.compile.runner import CompileOptions, RegionBuilder

    prog = ptexec.load(DIR / "transformer_int8_dynamic_pc.pte")
    state = prog.load_method("forward").state
    before = torch.get_num_threads()
    try:
        builders = []
        for n in (1, 2):
            torch.set_num_threads(n)
            builders.append(RegionBuilder(state, prog, CompileOptions()))
        keys = [b.entry().key for b in builders]
    finally:
        torch.set_num_threads(before)
    b = builders[0]
    calls = [(c, i) for c, i, how in b.rebuild.externals() if how == "call"]
    assert b.regions and calls and all(b.serial(r) for r in b.regions)
    assert keys[0] == keys[1]
    # a span without a call is not serial (its kernels keep OpenMP's threads)
    r = b.regions[0]
    plain = next(j for j in range(r.first, r.last + 1) if (r.chain, j) not in calls)
    assert not b.serial(dataclasses.replace(r, first=plain, last=plain))
    assert not b.serial(dataclasses.replace(r, chain=r.chain + 1))


def test_cpu_code_keeps_the_thread_count_on_any_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA method's CPU regions are OpenMP code for the compile's thread count, as a
    CPU method's are: its key holds the count unless the code is the same at any count."""
    from ptexec.compile.cache import cache_key, content_digest

    # (the key names the GPU's architecture: one is made up where there is none)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    digest = content_digest([b"program"])
    before = torch.get_num_threads()
    try:
        keys = {}
        for n in (1, 2):
            torch.set_num_threads(n)
            keys[n] = [
                cache_key(digest, "forward", device, {}, threads)
                for device in ("cpu", "cuda:0")
                for threads in (True, False)
            ]
    finally:
        torch.set_num_threads(before)
    cpu_counted, cpu_serial, cuda_counted, cuda_serial = zip(keys[1], keys[2], strict=True)
    assert cpu_counted[0] != cpu_counted[1] and cuda_counted[0] != cuda_counted[1]
    assert cpu_serial[0] == cpu_serial[1] and cuda_serial[0] == cuda_serial[1]
    assert cuda_serial[0] != cpu_serial[0]


def test_serve_threads_are_the_one_setting(
    torch_threads: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ptexec serve --threads`` sets torch's threads and ExecuTorch's XNNPACK pool, as
    every command does (it set torch's alone)."""
    pytest.importorskip("uvicorn")
    from ptexec.cli import main
    from ptexec.serve import Server

    seen: list[int] = []
    real = threads.set_num_threads
    monkeypatch.setattr(threads, "set_num_threads", lambda n: (seen.append(n), real(n))[1])
    monkeypatch.setattr(Server, "run", lambda self: None)  # made, not started
    torch.set_num_threads(2)
    assert main(["serve", MLP, "--threads", "1", "--port", "0"]) == 0
    assert seen == [1] and torch.get_num_threads() == 1
