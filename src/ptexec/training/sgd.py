"""ExecuTorch's SGD optimizer (``get_sgd_optimizer``), with ExecuTorch's semantics.

ExecuTorch's C++ optimizer updates each named parameter that has a gradient of the same
name, in place, in this order (``d_p`` is the gradient it was given):

1. weight decay: ``d_p += weight_decay * p`` (written into the given gradient);
2. momentum: the first step keeps a copy of ``d_p`` as the parameter's buffer; later steps
   ``buf = momentum * buf + (1 - dampening) * d_p``. With Nesterov, ``d_p += momentum *
   buf`` (again into the given gradient), otherwise ``d_p`` becomes ``buf``;
3. ``p -= lr * d_p``.

That is ``torch.optim.SGD``'s update. ExecuTorch's kernels compute each of these
operations in float64 and round the result to the tensor's dtype; this class does the
same, so its floats are ExecuTorch's bit for bit (checked against ExecuTorch's runtime;
``torch.optim.SGD``'s fused arithmetic differs from both in the last bit). ExecuTorch
writes weight decay and Nesterov into the caller's gradients; this class does too, so
code that reads the gradients after a step sees what it would see there. Gradients whose
name is not a parameter are ignored, as there.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import InputError

__all__ = ["ExecuTorchSGD", "get_sgd_optimizer"]


class ExecuTorchSGD:
    """SGD over named parameters (see the module docstring); create it with
    :func:`get_sgd_optimizer`."""

    def __init__(
        self,
        named_parameters: Mapping[str, torch.Tensor],
        lr: float,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
    ) -> None:
        for key, value in named_parameters.items():
            if not isinstance(key, str) or not isinstance(value, torch.Tensor):
                raise TypeError("named_parameters must map names (str) to tensors")
        self.params = dict(named_parameters)
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.dampening = float(dampening)
        self.weight_decay = float(weight_decay)
        self.nesterov = bool(nesterov)
        self._buffers: dict[str, torch.Tensor] = {}  # momentum, by parameter name
        self._work: dict[str, _Float64] = {}

    def step(self, named_gradients: Mapping[str, torch.Tensor]) -> None:
        """Update every parameter that has a gradient in ``named_gradients``, in place."""
        checked = []
        for name, p in self.params.items():
            d_p = named_gradients.get(name)
            if d_p is None:
                continue
            if (
                not isinstance(d_p, torch.Tensor)
                or d_p.shape != p.shape
                or d_p.dtype != p.dtype
                or d_p.device != p.device
            ):
                got = (
                    f"{tuple(d_p.shape)} {d_p.dtype} on {d_p.device}"
                    if isinstance(d_p, torch.Tensor)
                    else type(d_p).__name__
                )
                raise InputError(
                    f"gradient '{name}': expected {tuple(p.shape)} {p.dtype} on {p.device} "
                    f"(its parameter), got {got}"
                )
            checked.append((name, p, d_p))
        # every gradient is checked before any parameter changes
        with torch.no_grad():
            for name, p, d_p in checked:
                work = self._work.get(name)
                if work is None:
                    work = self._work[name] = _Float64(p)
                if self.weight_decay != 0:
                    work.axpy(d_p, d_p, p, self.weight_decay)
                if self.momentum != 0:
                    buf = self._buffers.get(name)
                    if buf is None:
                        buf = self._buffers[name] = d_p.clone(memory_format=torch.contiguous_format)
                    else:
                        work.scale(buf, self.momentum)
                        work.axpy(buf, buf, d_p, 1 - self.dampening)
                    if self.nesterov:
                        work.axpy(d_p, d_p, buf, self.momentum)
                    else:
                        d_p = buf
                work.axpy(p, p, d_p, -self.lr)


class _Float64:
    """Two float64 tensors shaped like one parameter, made once: ExecuTorch's arithmetic
    (each operation in float64, rounded into its output) without allocating per step."""

    __slots__ = ("a", "b")

    def __init__(self, like: torch.Tensor) -> None:
        self.a = torch.empty(like.shape, dtype=torch.float64, device=like.device)
        self.b = torch.empty_like(self.a)

    def axpy(self, out: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float) -> None:
        """``out = x + alpha * y``."""
        self.a.copy_(x)
        self.b.copy_(y).mul_(alpha)
        out.copy_(self.a.add_(self.b))

    def scale(self, out: torch.Tensor, alpha: float) -> None:
        """``out = alpha * out``."""
        out.copy_(self.a.copy_(out).mul_(alpha))


def get_sgd_optimizer(
    named_parameters: Mapping[str, torch.Tensor],
    lr: float,
    momentum: float = 0,
    dampening: float = 0,
    weight_decay: float = 0,
    nesterov: bool = False,
) -> ExecuTorchSGD:
    """An SGD optimizer over ``named_parameters`` with ExecuTorch's semantics (module
    docstring); ``step(named_gradients)`` updates them in place."""
    return ExecuTorchSGD(named_parameters, lr, momentum, dampening, weight_decay, nesterov)
