"""Training and fine-tuning of exported training programs.

ExecuTorch's ``executorch.extension.training`` names, backed by ptexec: a script switches
by one import::

    from ptexec.training import _load_for_executorch_for_training, get_sgd_optimizer
    tm = _load_for_executorch_for_training("model.pte")
    loss, *outputs = tm.forward_backward("forward", (x, y))
    opt = get_sgd_optimizer(tm.named_parameters(), 0.1, 0.9, 0, 1e-4, True)
    opt.step(tm.named_gradients())

and beyond them any ``torch.optim`` optimizer on the parameters in place::

    tm = ptexec.training.load("model.pte")
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-3)
    for x, y in data:
        opt.zero_grad()
        loss = tm.forward_backward("forward", (x, y))[0]
        opt.step()
    tm.save_pte("trained.pte")

See :mod:`ptexec.training.module` for what each part does.
"""

from __future__ import annotations

from .check import GradientCheck
from .layout import Layout
from .module import (
    LoadedKeys,
    TrainingModule,
    _load_for_executorch_for_training,
    _load_for_executorch_for_training_from_buffer,
    load,
)
from .sgd import ExecuTorchSGD, get_sgd_optimizer

__all__ = [
    "ExecuTorchSGD",
    "GradientCheck",
    "Layout",
    "LoadedKeys",
    "TrainingModule",
    "_load_for_executorch_for_training",
    "_load_for_executorch_for_training_from_buffer",
    "get_sgd_optimizer",
    "load",
]
