"""ExecuTorch's own training test and XOR example, run against ptexec.

``extension/training/pybindings/test/test.py`` is the installed wheel's file, unchanged,
read with ``executorch.extension.training`` resolved to :mod:`ptexec.training` (restored
afterwards, so the XOR test below can run ExecuTorch's own ``TrainingModule`` beside
ptexec's). The XOR program is the one the wheel's ``examples/XOR/export_model.py`` makes
(the committed fixture), trained as the example's ``train.cpp`` trains it: SGD with
learning rate 0.1, one random sample of the four XOR points per step, 5000 steps.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import random
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # the wheel's test exports its program (~10 s here)

executorch = pytest.importorskip("executorch")
pytest.importorskip("executorch.extension.training")

# ExecuTorch's own modules, bound before any aliasing
from executorch.extension.pybindings import portable_lib  # noqa: E402
from executorch.extension.training.pybindings import _training_lib, _training_module  # noqa: E402

import ptexec.training  # noqa: E402

_ROOT = Path(next(iter(executorch.__path__)))
_TEST = _ROOT / "extension/training/pybindings/test/test.py"
FIX = Path(__file__).resolve().parent / "fixtures" / "training"
XOR = [([1.0, 1.0], 0), ([0.0, 0.0], 0), ([1.0, 0.0], 1), ([0.0, 1.0], 1)]


@contextlib.contextmanager
def _aliased() -> Iterator[None]:
    name = "executorch.extension.training"
    parent = importlib.import_module("executorch.extension")
    missing = object()
    old, old_attr = sys.modules.get(name, missing), parent.__dict__.get("training", missing)
    sys.modules[name] = ptexec.training
    parent.training = ptexec.training  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if old is missing:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = old  # type: ignore[assignment]
        if old_attr is missing:
            parent.__dict__.pop("training", None)
        else:
            parent.training = old_attr  # type: ignore[attr-defined]


def _load_wheel_test() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("executorch_wheel_tests.training", _TEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with _aliased():
        spec.loader.exec_module(module)
    return module


_wheel = _load_wheel_test()
TestTraining = _wheel.TestTraining  # collected here: the wheel's unittest case


@pytest.fixture(autouse=True)
def _ptexec_as_executorch() -> Iterator[None]:
    with _aliased():
        yield


def test_the_wheels_test_reaches_ptexec() -> None:
    assert _wheel._load_for_executorch_for_training_from_buffer is (
        ptexec.training._load_for_executorch_for_training_from_buffer
    )
    assert _wheel.get_sgd_optimizer is ptexec.training.get_sgd_optimizer


def _samples(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        x, label = XOR[rng.randrange(4)]
        out.append((torch.tensor([x]), torch.tensor([label])))
    return out


@pytest.mark.parametrize("external", [False, True])
def test_xor_example(external: bool) -> None:
    """ptexec trains the XOR example to fit XOR, step for step as ExecuTorch's runtime."""
    pte = (FIX / ("xor_ext.pte" if external else "xor.pte")).read_bytes()
    ptd = (FIX / "xor.ptd").read_bytes() if external else None
    ours = ptexec.training._load_for_executorch_for_training_from_buffer(pte, ptd)
    if external:
        et_module = portable_lib._load_for_executorch_from_buffer(pte, ptd)
    else:
        et_module = portable_lib._load_for_executorch_from_buffer(pte)
    theirs = _training_module.TrainingModule(et_module)
    samples = _samples(5000)
    compared = 300  # ExecuTorch's runtime beside it for the first steps
    opt = et_opt = None
    for i, (x, y) in enumerate(samples):
        loss, pred = ours.forward_backward("forward", (x, y))
        if opt is None:
            opt = ptexec.training.get_sgd_optimizer(ours.named_parameters(), 0.1)
        if i < compared:
            et_loss, et_pred = theirs.forward_backward("forward", (x, y))
            if et_opt is None:
                et_opt = _training_lib.get_sgd_optimizer(theirs.named_parameters(), 0.1)
            torch.testing.assert_close(loss, et_loss, rtol=1e-5, atol=1e-6)
            assert torch.equal(pred, et_pred)
            et_opt.step(theirs.named_gradients())
        opt.step(ours.named_gradients())
        if i == compared - 1:
            for name, p in ours.named_parameters().items():
                torch.testing.assert_close(p, theirs.named_parameters()[name], rtol=1e-5, atol=1e-6)
    for x, label in XOR:  # it learned XOR
        _, pred = ours.forward_backward("forward", (torch.tensor([x]), torch.tensor([label])))
        assert int(pred) == label, (x, label)
