"""CUDA paths that need a GPU (marked ``cuda``: skipped without one), and the CPU-side
refusals that do not."""

from __future__ import annotations

import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance


def test_cuda_graph_needs_a_cuda_method() -> None:
    prog = ptexec.load(fixture_paths("mlp")[0])
    with pytest.raises(ValueError, match="one CUDA device"):
        prog.load_method("forward", cuda_graph=True)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "stateful"])
def test_portable_program_on_cuda_via_device_map(name: str) -> None:
    pte, _ = fixture_paths(name)
    m = ptexec.load(pte).load_method("forward", device_map="cuda:0", transfers="allow")
    assert all(b.device == ptexec.Device(ptexec.DeviceType.CUDA, 0) for b in m.meta.buffers)
    for call in fixture_calls(name):
        out = m.execute(call["inputs"])
        assert all(y.is_cuda for y in out if isinstance(y, torch.Tensor))
        assert compare_outputs(out, call["outputs"], *tolerance(name)) is None


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_cuda_graph_matches_the_interpreter(name: str) -> None:
    pte, _ = fixture_paths(name)
    prog = ptexec.load(pte)
    plain = prog.load_method("forward", device_map="cuda:0")
    graph = prog.load_method("forward", device_map="cuda:0", cuda_graph=True)
    for call in fixture_calls(name):
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in call["inputs"]]
        want = plain.execute(inputs)
        for _ in range(3):  # capture, then replays
            got = graph.execute(inputs)
            assert compare_outputs(got, want, *tolerance(name)) is None


@pytest.mark.cuda
def test_cuda_graph_keeps_program_state() -> None:
    pte, _ = fixture_paths("stateful")
    calls = fixture_calls("stateful")
    m = ptexec.load(pte).load_method("forward", device_map="cuda:0", cuda_graph=True)
    for call in calls:
        inputs = [x.cuda() for x in call["inputs"]]
        assert compare_outputs(m.execute(inputs), call["outputs"], *tolerance("stateful")) is None


@pytest.mark.cuda
def test_cross_device_copies_are_counted() -> None:
    pte, _ = fixture_paths("mlp")
    m = ptexec.load(pte).load_method("forward", device_map="cuda:0")
    x = fixture_calls("mlp")[0]["inputs"][0]
    m(x)  # a planned input on cpu is copied across (it is copied anyway)
    assert m.last_call.inputs == ["transfer"] and m.last_call.h2d == x.nbytes
    with pytest.raises(ptexec.InputError, match="transfers='forbid'"):
        m.execute([x], transfers="forbid")


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_second_gpu_index() -> None:
    pte, _ = fixture_paths("mlp")
    m = ptexec.load(pte).load_method("forward", device_map="cuda:1")
    x = fixture_calls("mlp")[0]["inputs"][0].to("cuda:1")
    (y,) = m(x)
    assert y.device == torch.device("cuda", 1)
    assert m.last_call.inputs == ["copy"] and m.last_call.d2d == x.nbytes
