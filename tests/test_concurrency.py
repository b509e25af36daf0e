"""Threads: calls on one Method are serialized; methods loaded separately run in parallel.

8 threads x 1000 calls in each test, every result checked: against eager PyTorch's outputs
recorded in the fixtures, or, for stateful programs, against the state the calls must have
built (exact: the inputs are small integers, so float sums are exact).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance

THREADS = 8
CALLS = 1000


def run_threads(work: Callable[[int], None], n: int = THREADS) -> None:
    """Run ``work(t)`` on ``n`` threads started together; re-raise the first failure."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def body(t: int) -> None:
        try:
            start.wait()
            work(t)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def _program(name: str) -> ptexec.Program:
    pte, ptd = fixture_paths(name)
    return ptexec.load(pte, data_path=ptd)


# --------------------------------------------------------------------------------------
# one Method, many threads: calls are serialized


@pytest.mark.parametrize("name", ["mlp", "mlp_unplanned", "int_ops", "cond"])
def test_one_method_many_threads(name: str) -> None:
    """Stateless programs: each thread cycles through the fixture's calls on the same Method;
    every output equals eager PyTorch's."""
    m = _program(name).load_method()
    calls = fixture_calls(name)
    rtol, atol = tolerance(name)
    checked = [0] * THREADS

    def work(t: int) -> None:
        for i in range(CALLS):
            call = calls[(t + i) % len(calls)]
            got = m.execute(call["inputs"])
            problem = compare_outputs(got, call["outputs"], rtol, atol)
            assert problem is None, f"thread {t} call {i}: {problem}"
            checked[t] += 1

    run_threads(work)
    assert sum(checked) == THREADS * CALLS


def test_one_stateful_method_serializes_calls() -> None:
    """stateful: total += x, count += 1, returns (total / count, total, count). Calls from 8
    threads on one Method never interleave: every call sees its own count (1..8000, each
    once), its total is consistent with it, and nothing is lost at the end."""
    m = _program("stateful").load_method()
    seen: list[list[tuple[int, torch.Tensor]]] = [[] for _ in range(THREADS)]

    def work(t: int) -> None:
        x = torch.full((4,), float(t + 1))
        for _ in range(CALLS):
            mean, total, count = m.execute([x])
            c = int(count.item())
            assert torch.equal(mean, total / c)
            seen[t].append((c, total))

    run_threads(work)
    counts = sorted(c for per in seen for c, _ in per)
    assert counts == list(range(1, THREADS * CALLS + 1))
    # replay the calls in count order: each total is the previous plus that thread's x
    order = sorted((c, t, total) for t, per in enumerate(seen) for c, total in per)
    running = torch.zeros(4)
    for _, t, total in order:
        running += t + 1
        assert torch.equal(total, running)
    final = m.execute([torch.zeros(4)])
    assert torch.equal(final[1], torch.full((4,), float(CALLS * sum(range(1, THREADS + 1)))))
    assert int(final[2].item()) == THREADS * CALLS + 1


def test_view_outputs_are_valid_until_the_next_call() -> None:
    """outputs="view" returns the method's memory: the next call (from any thread) rewrites it."""
    m = _program("mlp").load_method(outputs="view")
    calls = fixture_calls("mlp")
    (y0,) = m.execute(calls[0]["inputs"])
    kept = y0.clone()
    assert compare_outputs([y0], calls[0]["outputs"], *tolerance("mlp")) is None
    (y1,) = m.execute(calls[1]["inputs"])
    assert y1.data_ptr() == y0.data_ptr()  # the same memory, now holding call 1's answer
    assert compare_outputs([y0], calls[1]["outputs"], *tolerance("mlp")) is None
    assert compare_outputs([kept], calls[0]["outputs"], *tolerance("mlp")) is None


# --------------------------------------------------------------------------------------
# methods loaded separately: their own memory and lock, so they run in parallel


@pytest.mark.parametrize("name", ["mlp", "transformer_unplanned", "channels_last"])
def test_separate_methods_in_parallel(name: str) -> None:
    prog = _program(name)
    methods = [prog.load_method() for _ in range(THREADS)]
    assert len({id(m._lock) for m in methods}) == THREADS  # nothing shared to wait on
    calls = fixture_calls(name)
    rtol, atol = tolerance(name)

    def work(t: int) -> None:
        for i in range(CALLS):
            call = calls[(t + i) % len(calls)]
            problem = compare_outputs(
                methods[t].execute(call["inputs"]), call["outputs"], rtol, atol
            )
            assert problem is None, f"thread {t} call {i}: {problem}"

    run_threads(work)


def test_separate_stateful_methods_keep_their_own_state() -> None:
    """Each load of stateful's forward has its own buffers (the program shares none)."""
    prog = _program("stateful")
    methods = [prog.load_method() for _ in range(THREADS)]

    def work(t: int) -> None:
        x = torch.full((4,), float(t + 1))
        for i in range(1, CALLS + 1):
            mean, total, count = methods[t].execute([x])
            assert int(count.item()) == i
            assert torch.equal(total, x * i)
            assert torch.equal(mean, x)

    run_threads(work)


def test_methods_sharing_state_share_it_and_serialize() -> None:
    """shared_state's inc and read share one state buffer (the program says so): every
    separately loaded method uses it, and their calls are serialized, so 8 threads x 1000
    incs lose nothing and every read sees a state some inc produced."""
    prog = _program("shared_state")
    incs = [prog.load_method("inc") for _ in range(THREADS)]
    reads = [prog.load_method("read") for _ in range(2)]
    assert len({id(m._lock) for m in incs + reads}) == 1
    seen: list[list[float]] = [[] for _ in range(THREADS)]
    stop = threading.Event()
    read_values: list[float] = []

    def reader() -> None:
        while not stop.is_set():
            (state,) = reads[0].execute([])
            assert bool((state == state[0]).all())
            read_values.append(float(state[0]))

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:

        def work(t: int) -> None:
            x = torch.ones(4)
            for _ in range(CALLS):
                (state,) = incs[t].execute([x])
                assert bool((state == state[0]).all())
                seen[t].append(float(state[0]))

        run_threads(work)
    finally:
        stop.set()
        watcher.join()
    values = sorted(v for per in seen for v in per)
    assert values == [float(k) for k in range(1, THREADS * CALLS + 1)]  # each inc its own step
    assert all(0 <= v <= THREADS * CALLS and v == int(v) for v in read_values)
    (final,) = reads[1].execute([])
    assert torch.equal(final, torch.full((4,), float(THREADS * CALLS)))


def test_two_methods_with_private_state_in_parallel() -> None:
    """two_method_state: step's counter lives in step's own buffer; 'other' (stateless) runs
    on other threads at the same time and never disturbs it."""
    prog = _program("two_method_state")
    steps = [prog.load_method("step") for _ in range(THREADS // 2)]
    others = [prog.load_method("other") for _ in range(THREADS // 2)]
    x = torch.arange(8, dtype=torch.float32)
    want_other = ((x + 1) * 4 - 4) / 2

    def work(t: int) -> None:
        if t % 2 == 0:
            m = steps[t // 2]
            for i in range(1, CALLS + 1):
                (counter,) = m.execute([x])
                assert counter.tolist() == [i]
        else:
            m = others[t // 2]
            for _ in range(CALLS):
                (y,) = m.execute([x])
                assert torch.allclose(y, want_other)

    run_threads(work)


def test_a_view_of_state_methods_share_is_a_copy() -> None:
    """outputs="view" hands out no view of a state buffer the program's methods share:
    another method's call writes it, so the view would change without a call on its own
    method (which a view is promised not to)."""
    pytest.importorskip("executorch")
    import copy

    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    class State(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", torch.zeros(4))

    class Inc(torch.nn.Module):
        def __init__(self, s: State) -> None:
            super().__init__()
            self.shared = s

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.shared.state.add_(x)
            return self.shared.state * 1.0

    class Peek(torch.nn.Module):
        def __init__(self, s: State) -> None:
            super().__init__()
            self.shared = s

        def forward(self) -> torch.Tensor:
            return self.shared.state

    s = State()
    programs = {
        "inc": torch.export.export(Inc(copy.deepcopy(s)), (torch.ones(4),)),
        "peek": torch.export.export(Peek(copy.deepcopy(s)), ()),
    }
    config = ExecutorchBackendConfig(
        emit_mutable_buffer_names=True,
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
    )
    prog = ptexec.load(to_edge(programs).to_executorch(config).buffer)
    assert prog.shared_buffer_indices
    inc, peek = prog.load_method("inc"), prog.load_method("peek", outputs="view")
    inc.execute([torch.ones(4)])
    (seen,) = peek.execute([])
    assert torch.equal(seen, torch.ones(4))
    inc.execute([torch.ones(4)])
    assert torch.equal(seen, torch.ones(4))  # not 2s: no call on peek since
    assert torch.equal(peek.execute([])[0], torch.full((4,), 2.0))


def test_methods_share_state_beside_constant_methods() -> None:
    """An LLM exported with ``share_mutable_buffers=True`` also has its metadata as
    constant methods (plans without planned memory): its methods still share their state,
    as on ExecuTorch's runtime."""
    pytest.importorskip("executorch.runtime")
    import copy

    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.runtime import Runtime

    class Counting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("total", torch.zeros(1, dtype=torch.long))

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            self.total.add_(tokens.sum(dim=1))
            return self.total * 1

    example = (torch.ones(1, 1, dtype=torch.long),)
    programs = {
        name: torch.export.export(copy.deepcopy(Counting()), example)
        for name in ("forward", "lora_forward")
    }
    config = ExecutorchBackendConfig(
        emit_mutable_buffer_names=True,
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
    )
    metadata = {"get_max_seq_len": 16, "get_vocab_size": 64}
    data = to_edge(programs, constant_methods=metadata).to_executorch(config).buffer

    def calls(
        load: Callable[[str], Callable[[list[torch.Tensor]], list[torch.Tensor]]],
    ) -> list[int]:
        forward, lora = load("forward"), load("lora_forward")
        seen = [int(forward([torch.tensor([[5]])])[0])]
        seen.append(int(lora([torch.tensor([[7]])])[0]))
        seen.append(int(forward([torch.tensor([[1]])])[0]))
        return seen

    et_program: Any = Runtime.get().load_program(data)
    want = calls(lambda name: et_program.load_method(name).execute)
    assert want == [5, 12, 13]  # one total, whichever method adds to it
    prog = ptexec.load(data)
    assert prog.shared_buffer_indices == frozenset({2})
    assert calls(lambda name: prog.load_method(name).execute) == want


_FORK_MID_CALL = """
import json, os, signal, sys, threading
sys.path.insert(0, {tests!r})
import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec.errors import StateError

prog = ptexec.load(fixture_paths("stateful")[0])
m = prog.load_method("forward")
calls = fixture_calls("stateful")
inside, leave = threading.Event(), threading.Event()
def hold():  # runs under the call lock, before the call writes anything
    inside.set()
    leave.wait()
m.before_each_call(hold)
worker = threading.Thread(target=m.execute, args=(calls[0]["inputs"],))
worker.start()
inside.wait()
child = os.fork()
if child == 0:
    signal.alarm(20)  # (a call waiting for the lock for ever)
    seen = {{}}
    try:
        m.execute(calls[0]["inputs"])
        seen["call"] = "answered"
    except StateError as e:
        seen["call"] = str(e)
    fresh = prog.load_method("forward")
    seen["fresh"] = [
        compare_outputs(fresh.execute(c["inputs"]), c["outputs"], *tolerance("stateful"))
        for c in calls
    ]
    print(json.dumps(seen), flush=True)
    os._exit(0)
_, code = os.waitpid(child, 0)
leave.set()
worker.join()
m.before_each_call(None)
parent = [
    compare_outputs(m.execute(c["inputs"]), c["outputs"], *tolerance("stateful"))
    for c in calls[1:]
]
print(json.dumps({{"code": code, "parent": parent}}), flush=True)
"""


def test_a_child_forked_during_a_call_on_another_thread_refuses_that_method() -> None:
    """A process forked while another thread's call holds a method's lock (a host forking
    workers beside a thread that serves): that call never ends in the child, whose call
    waited for its lock for ever. It is refused with StateError there; a method loaded
    again in the child gives eager's outputs, and the parent goes on unchanged."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    code = _FORK_MID_CALL.format(tests=str(Path(__file__).resolve().parent))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert len(lines) == 2, done.stdout
    child, parent = lines
    assert child["call"].startswith("method 'forward' was running a call on another thread")
    assert child["fresh"] == [None] * 4
    assert parent == {"code": 0, "parent": [None] * 3}
