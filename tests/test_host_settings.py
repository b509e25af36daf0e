"""ptexec inside a host's process: the host's torch settings (inference mode, no_grad, the
default dtype, deterministic algorithms) neither change ptexec's results nor are changed
by it, whatever settings were on when a program or method was loaded."""

from __future__ import annotations

import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance


def _replay(methods: dict[str, ptexec.Method], name: str) -> None:
    """Every stored call of fixture ``name`` against its eager outputs."""
    for i, call in enumerate(fixture_calls(name)):
        got = methods[call["method"]].execute(call["inputs"])
        problem = compare_outputs(list(got), call["outputs"], *tolerance(name))
        assert problem is None, f"{name} call {i}: {problem}"


def _on_another_thread(work: Callable[[], None]) -> None:
    """Run ``work`` on a thread of its own (where inference mode is off) and raise what
    it raised here."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # reported by the test's thread
            failures.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if failures:
        raise failures[0]


def _methods(prog: ptexec.Program, name: str) -> dict[str, ptexec.Method]:
    return {call["method"]: prog.load_method(call["method"]) for call in fixture_calls(name)}


@pytest.mark.parametrize("name", ["mlp", "stateful", "scalar_io", "dynamic_mlp_unplanned"])
def test_a_method_loaded_in_inference_mode_runs_outside_it(name: str) -> None:
    """A host that loads under ``torch.inference_mode()`` (a server's start-up) and calls
    outside it, or on another thread (where the mode is off): eager's results."""
    prog = ptexec.load(fixture_paths(name)[0])
    with torch.inference_mode():
        methods = _methods(prog, name)
    _replay(methods, name)
    assert not torch.is_inference_mode_enabled()

    with torch.inference_mode():
        on_thread = _methods(ptexec.load(fixture_paths(name)[0]), name)
    _on_another_thread(lambda: _replay(on_thread, name))


def test_a_runner_made_in_inference_mode_generates_outside_it(tmp_path: Path) -> None:
    """An LLM runner made under ``torch.inference_mode()`` generates, outside it and on
    another thread, the tokens of ExecuTorch's greedy loop."""
    pytest.importorskip("tokenizers")
    from llm_support import PROMPT, executorch_greedy, llm_programs, program
    from ptexec.llm import GenerationConfig, TextLLMRunner

    tokenizer = llm_programs.make_tokenizer(tmp_path / "tokenizer.json")
    greedy = GenerationConfig(max_new_tokens=8, temperature=0.0, echo=False)
    with torch.inference_mode():
        runner = TextLLMRunner(str(program("portable")), str(tokenizer), print_output=False)
    want = executorch_greedy(
        program("portable"), runner.tokenizer.encode(PROMPT), greedy.max_new_tokens, True
    )
    runner.generate_text(PROMPT, greedy)
    assert runner.generated_tokens == want

    got: list[list[int]] = []

    def run() -> None:
        runner.reset()  # the prompt again from position 0
        runner.generate_text(PROMPT, greedy)
        got.append(list(runner.generated_tokens))

    _on_another_thread(run)
    assert got == [want]


def test_calls_with_read_only_arrays_keep_the_filters_other_threads_add() -> None:
    """A method called with a read-only numpy array (on one thread) while the host adds
    warning filters (on another): every filter stays, and the outputs are eager's."""
    np = pytest.importorskip("numpy")
    name = "mlp"
    call = fixture_calls(name)[0]
    method = ptexec.load(fixture_paths(name)[0]).load_method(call["method"])
    array = call["inputs"][0].numpy().copy()
    array.setflags(write=False)
    assert isinstance(array, np.ndarray)
    method.execute([array])  # the first conversion of read-only memory in any case
    stop = threading.Event()
    wrong: list[str] = []

    def calls() -> None:
        while not stop.is_set():
            problem = compare_outputs(
                list(method.execute([array])), call["outputs"], *tolerance(name)
            )
            if problem is not None:
                wrong.append(problem)

    worker = threading.Thread(target=calls)
    before = list(warnings.filters)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns often
    worker.start()
    try:
        for i in range(3000):
            warnings.filterwarnings("ignore", message=f"host filter {i}")
            time.sleep(0)  # let the calls run between additions
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(interval)
    kept = {f[1].pattern for f in warnings.filters if f[1] is not None}
    lost = [i for i in range(3000) if f"host filter {i}" not in kept]
    warnings.filters[:] = before
    assert not wrong, wrong[:3]
    assert not lost, f"{len(lost)} of the host's filters lost"


_FILTERS_KEPT = """
import sys, threading, time, warnings
import numpy as np
import torch
import ptexec

path, mode = sys.argv[1], sys.argv[2]
method = ptexec.load(path).load_method("forward")
x = np.random.default_rng(0).standard_normal(method.meta.inputs[0].sizes).astype(np.float32)
frozen = x.copy()
frozen.setflags(write=False)
if mode == "host_first":  # the host's own view of read-only memory takes torch's one warning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.from_numpy(frozen)
stop = threading.Event()

def calls():
    while not stop.is_set():
        method.execute([x if mode == "writable" else frozen])

worker = threading.Thread(target=calls)
sys.setswitchinterval(1e-6)
worker.start()
for i in range(3000):
    warnings.filterwarnings("ignore", message=f"host filter {i}")
    time.sleep(0)
stop.set()
worker.join()
kept = {f[1].pattern for f in warnings.filters if f[1] is not None}
print(sum(f"host filter {i}" not in kept for i in range(3000)))
"""


@pytest.mark.parametrize("mode", ["writable", "host_first"])
def test_calls_with_writable_arrays_or_after_the_hosts_own_warning_keep_filters(
    mode: str,
) -> None:
    """In a process of its own (torch warns once a process): calls with writable arrays
    never touch the warning filters, and neither do calls with read-only ones after a
    host's own view of read-only memory took torch's one warning (each such call swapped
    the filter list, and filters the host added meanwhile were lost)."""
    import subprocess

    pytest.importorskip("numpy")
    done = subprocess.run(
        [sys.executable, "-c", _FILTERS_KEPT, str(fixture_paths("mlp")[0]), mode],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "0", f"{done.stdout.split()[-1]} of the host's filters lost"
