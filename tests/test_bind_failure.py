"""A call whose binding fails part-way: the envelope restores the method's tensors and
releases the caller's, and the next good call gives the right answer."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec.engine.hooks import Hooks
from ptexec.engine.runner import InstrumentedRunner


class BindFailed(RuntimeError):
    pass


def _failing_bind(self: Any, state: Any) -> None:
    raise BindFailed("the runner could not bind")


@pytest.mark.parametrize("name", ["dynamic_mlp", "dynamic_mlp_unplanned"])
def test_failed_binding_restores_and_releases(name: str, monkeypatch: Any) -> None:
    pte, _ = fixture_paths(name)
    method = ptexec.load(pte).load_method("forward")
    slot = method.state.inputs[0].slot
    at_load = method.values()[slot]
    load_shape = None if at_load is None else tuple(at_load.shape)
    first, *rest = fixture_calls(name)
    x = first["inputs"][0].clone()  # batch 1: a planned view is resized to it when bound
    assert load_shape is None or tuple(x.shape) != load_shape
    caller = weakref.ref(x)

    with monkeypatch.context() as m:
        m.setattr(InstrumentedRunner, "bind", _failing_bind)
        with pytest.raises(BindFailed):
            method.run_with(Hooks(), [x])  # the input was bound before the runner failed

    bound = method.values()[slot]
    if load_shape is None:  # unplanned: the caller's tensor left the values table
        assert bound is None
        del x
        gc.collect()
        assert caller() is None, "the method still holds the caller's tensor"
    else:  # planned: the view has its geometry of load again
        assert tuple(bound.shape) == load_shape

    rtol, atol = tolerance(name)
    for call in [first, *rest]:
        got = method.execute(list(call["inputs"]))
        assert compare_outputs(got, call["outputs"], rtol, atol) is None
        traced = method.run_with(Hooks(), list(call["inputs"]))
        assert compare_outputs(traced, call["outputs"], rtol, atol) is None
