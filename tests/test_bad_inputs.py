"""Bad inputs and errors during execution.

Every bad input raises :class:`ptexec.InputError` (or :class:`ptexec.UnsupportedDeviceError`)
naming the input, what was expected and what came, before anything is written: a stateful
program's buffers are unchanged and the next good call gives exactly the right answer. A
kernel that fails raises :class:`ptexec.ExecutionError` with the instruction index, the
operator and (when the program carries stack traces) the source frame, and the method
works for the next call.
"""

from __future__ import annotations

import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance

# --------------------------------------------------------------------------------------
# errors during execution


def _int_ops():
    calls = fixture_calls("int_ops")
    m = ptexec.load(fixture_paths("int_ops")[0]).load_method()
    return m, calls


def _check_call(m, name: str, call) -> None:
    got = m.execute(call["inputs"])
    assert compare_outputs(got, call["outputs"], *tolerance(name)) is None


def test_index_out_of_range_in_input_data() -> None:
    m, calls = _int_ops()
    ids, x, k = calls[0]["inputs"]
    bad = ids.clone()
    bad[1, 3] = 100  # Embedding(10, 4)
    try:
        m.execute([bad, x, k])
    except ptexec.ExecutionError as e:
        assert e.instruction == 0
        assert e.operator == "aten::embedding.out"
        assert e.method == "forward"
        assert isinstance(e.__cause__, IndexError)
        assert "instruction 0 (aten::embedding.out)" in str(e)
        assert e.frame is None  # the fixtures carry no stack traces
    else:
        raise AssertionError("an index out of range must fail")
    for call in calls:
        _check_call(m, "int_ops", call)


def test_a_failed_call_restores_the_method_memory() -> None:
    """A kernel that fails while resizing its output leaves sizes its memory does not hold
    (torch sets them first); the failed call restores every tensor the method owns, so the
    next call neither reads past the memory nor gives a wrong answer."""
    m, calls = _int_ops()
    owned = [v for v in m.values() if isinstance(v, torch.Tensor) and v.numel()]
    victim = owned[-1]
    geometry = (victim.data_ptr(), tuple(victim.shape), tuple(victim.stride()))
    # what a half-done resize leaves behind: more elements than the memory holds
    with pytest.raises(RuntimeError):
        torch.add(torch.zeros(1, dtype=victim.dtype).expand(1 << 40), 1, out=victim)
    assert victim.numel() == 1 << 40
    ids, x, k = calls[0]["inputs"]
    bad = ids.clone()
    bad[0, 0] = -1000
    with pytest.raises(ptexec.ExecutionError):
        m.execute([bad, x, k])
    assert (victim.data_ptr(), tuple(victim.shape), tuple(victim.stride())) == geometry
    for call in calls:
        _check_call(m, "int_ops", call)
