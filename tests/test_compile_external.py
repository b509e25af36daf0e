"""One opaque call of a compiled graph (:class:`ptexec.compile.external.ExternalCall`), with
a runner written here in torch: what it is handed, what it returns, and how it fails.

The runner records the addresses it is handed, so the tests see when an input goes over as
it is (its address held since the last call) and when as a copy in the call's own memory
(a small input whose address moves); values are checked against eager torch.
"""

from __future__ import annotations

import pytest
import torch

from ptexec.compile.external import ExternalCall, OutputSpec


class _Runner:
    """``out = x @ w + b`` into the output it is handed (argument 1), as ExecuTorch's
    runner writes a delegate's outputs in place; records the input addresses it saw."""

    outputs = (1,)

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.w = torch.randn(8, 4)
        self.b = torch.randn(4)
        self.seen: list[int] = []
        self.fail = False

    def fn(self, x: torch.Tensor, out: torch.Tensor) -> None:
        self.seen.append(x.data_ptr())
        if self.fail:
            raise RuntimeError("the library failed")
        torch.addmm(self.b, x.reshape(-1, 8), self.w, out=out.view(-1, 4))

    __call__ = fn

    def digest(self) -> str:
        return "0" * 64


def _call(runner: _Runner) -> ExternalCall:
    spec = OutputSpec(1, torch.float32, (0, 1), (2, 4), False)
    return ExternalCall("test-0-0", runner, 2, [spec], [(0, 1)])


def _want(runner: _Runner, x: torch.Tensor) -> torch.Tensor:
    return torch.addmm(runner.b, x, runner.w)  # eager, on the caller's own tensor


def test_a_settled_input_goes_over_as_it_is() -> None:
    runner = _Runner()
    call = _call(runner)
    x = torch.randn(2, 8)
    outs = [call.run([x])[0].clone() for _ in range(3)]
    for got in outs:
        assert torch.equal(got, _want(runner, x))
    # first call: a copy (the address is new); then x itself, from call to call
    assert runner.seen[0] != x.data_ptr()
    assert runner.seen[1:] == [x.data_ptr(), x.data_ptr()]


def test_a_small_input_whose_address_moves_is_copied() -> None:
    runner = _Runner()
    call = _call(runner)
    xs = [torch.randn(2, 8) for _ in range(4)]  # all alive: four addresses
    for x in xs:
        (got,) = call.run([x])
        assert torch.equal(got, _want(runner, x))
    assert len(set(runner.seen)) == 1  # one copy, at one address, every call
    assert runner.seen[0] not in {x.data_ptr() for x in xs}


def test_outputs_are_the_same_tensors_every_call() -> None:
    runner = _Runner()
    call = _call(runner)
    a = call.run([torch.randn(2, 8)])[0]
    x = torch.randn(2, 8)
    b = call.run([x])[0]
    assert a is b and torch.equal(b, _want(runner, x))


def test_a_non_dense_input_is_read_by_value() -> None:
    runner = _Runner()
    call = _call(runner)
    base = torch.randn(8, 2)
    x = base.t()  # a transposed view: the copy is dense
    for _ in range(2):
        (got,) = call.run([x])
        assert torch.equal(got, _want(runner, x))


def test_wrong_input_count_fails_clearly() -> None:
    call = _call(_Runner())
    with pytest.raises(RuntimeError, match="2 inputs, expected 1"):
        call.run([torch.randn(2, 8), torch.randn(2, 8)])


def test_a_failed_call_leaves_the_call_usable() -> None:
    runner = _Runner()
    call = _call(runner)
    x = torch.randn(2, 8)
    call.run([x])
    runner.fail = True
    with pytest.raises(RuntimeError, match="the library failed"):
        call.run([x])
    runner.fail = False
    y = torch.randn(2, 8)
    (got,) = call.run([y])
    assert torch.equal(got, _want(runner, y))
    assert call.lock.acquire(blocking=False)  # not left held
    call.lock.release()
