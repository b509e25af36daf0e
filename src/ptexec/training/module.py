"""``TrainingModule``: ExecuTorch's training API over a ptexec program, and more.

ExecuTorch's names work as there (``forward_backward(method_name, inputs)`` returns the
loss and the user outputs, ``named_parameters()``, ``named_gradients()``, and
:func:`ptexec.training.get_sgd_optimizer` steps on them). Beyond them:

- Parameters are the method's planned tensors themselves and each parameter's ``.grad``
  is the method's planned gradient, so any ``torch.optim`` optimizer, LR scheduler and
  ``torch.nn.utils.clip_grad_norm_`` work on :meth:`TrainingModule.parameters` in place,
  and the next call reads what they wrote. ``forward_backward(..., accumulate=True)``
  adds into ``.grad`` as ``loss.backward()`` does (``optimizer.zero_grad()`` clears it);
  the default replaces it, as ExecuTorch does.
- ``device_map`` places the program's planned memory (its parameters, gradients and
  activations) on another device, as for any ptexec method.
- :meth:`save_pte` / :meth:`save_ptd` write the trained parameters back to a program file
  that ptexec and ExecuTorch's runtime load; :meth:`state_dict` gives them by name.
- :meth:`check_gradients` compares the program's gradients with eager autograd.

Only what the program marks trainable (the names its exporter listed) is a parameter
here: frozen weights of a LoRA program are constants of the program and stay so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import InputError, NotFoundError, StateError
from ..loader import DeviceMapSpec
from ..runtime import load_source
from .layout import Layout, read_layout, training_methods
from .save import ptd_with, pte_with, write_atomically

if TYPE_CHECKING:
    from ..method import Method
    from ..program import Program
    from .check import GradientCheck

__all__ = [
    "TrainingModule",
    "_load_for_executorch_for_training",
    "_load_for_executorch_for_training_from_buffer",
    "load",
]


class _Trained:
    """One loaded training method: the method and its layout."""

    __slots__ = ("layout", "method", "stash")

    def __init__(self, method: Method, layout: Layout) -> None:
        self.method = method
        self.layout = layout
        self.stash: list[torch.Tensor] | None = None  # gradients kept while accumulating


class TrainingModule:
    """A training program loaded for training (module docstring).

    Load it with :func:`load` (or ExecuTorch's ``_load_for_executorch_for_training``).
    ``load_options`` go to every ``load_method`` (``device_map``, ``compile``, ...); the
    methods load on first use. Not for concurrent use from several threads.
    """

    def __init__(
        self, program: Program, *, device_map: DeviceMapSpec = None, **load_options: Any
    ) -> None:
        self._program = program
        self._options: dict[str, Any] = dict(load_options, device_map=device_map)
        self._options["outputs"] = "view"
        self._loaded: dict[str, _Trained] = {}
        self._last: str | None = None  # the method of the last forward_backward

    # -- description ---------------------------------------------------------------------
    @property
    def program(self) -> Program:
        return self._program

    @property
    def methods(self) -> tuple[str, ...]:
        """The program's training methods (those with ExecuTorch's training getters)."""
        return training_methods(self._program)

    def method(self, method_name: str = "forward") -> Method:
        """The loaded :class:`ptexec.Method` behind training method ``method_name``."""
        return self._get(method_name).method

    def layout(self, method_name: str = "forward") -> Layout:
        """Where ``method_name`` keeps its outputs, gradients and parameters."""
        return self._get(method_name).layout

    def _get(self, name: str) -> _Trained:
        trained = self._loaded.get(name)
        if trained is None:
            if not isinstance(name, str):
                raise TypeError(f"method_name must be a str, not {type(name).__name__}")
            method = self._program.load_method(name, **self._options)
            trained = self._loaded[name] = _Trained(
                method, read_layout(self._program, name, method)
            )
        return trained

    def _name(self, method_name: str | None) -> str:
        if method_name is not None:
            return method_name
        return self._last if self._last is not None else "forward"

    # -- training ------------------------------------------------------------------------
    def forward_backward(
        self, method_name: str = "forward", inputs: Sequence[Any] = (), *, accumulate: bool = False
    ) -> list[Any]:
        """Run training method ``method_name`` on ``inputs``: the loss and the user outputs
        come back (copies); each parameter's ``.grad`` is then its gradient (the method's
        planned memory, rewritten by the next call). With ``accumulate``, a parameter
        whose ``.grad`` is set gets this call's gradient added to it, as in eager
        PyTorch. Inputs the method refuses raise before anything is written."""
        trained = self._get(method_name)
        layout = trained.layout
        params, grads = layout.parameters, layout.gradients
        if accumulate:
            self._stash(trained)
        outs = trained.method.execute(inputs)
        user = [
            o.clone() if isinstance(o, torch.Tensor) else o for o in outs[: layout.gradient_start]
        ]
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                prev = p.grad
                if not accumulate or prev is None:
                    if prev is not g:
                        p.grad = g
                elif prev is g:
                    stash = trained.stash
                    assert stash is not None
                    g.add_(stash[i])
                else:
                    prev.add_(g)
        self._last = method_name
        return user

    def _stash(self, trained: _Trained) -> None:
        """Keep the gradients that ``.grad`` holds in planned memory before a call
        overwrites them."""
        layout = trained.layout
        for i, (p, g) in enumerate(zip(layout.parameters, layout.gradients, strict=True)):
            if p.grad is g:
                if trained.stash is None:
                    trained.stash = [torch.empty_like(t) for t in layout.gradients]
                trained.stash[i].copy_(g)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's ``.grad`` (as ``torch.optim.Optimizer.zero_grad``)."""
        for trained in self._loaded.values():
            for p in trained.layout.parameters:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()

    def parameters(self, method_name: str = "forward") -> list[torch.Tensor]:
        """The trainable parameters of ``method_name``, in the program's order: the
        method's own memory, for ``torch.optim`` optimizers."""
        return list(self._get(method_name).layout.parameters)

    def named_parameters(self, method_name: str | None = None) -> dict[str, torch.Tensor]:
        """Parameter name -> parameter (the method's memory: writing it changes the model).
        ``method_name`` defaults to the last trained method, else ``"forward"``."""
        layout = self._get(self._name(method_name)).layout
        return dict(zip(layout.names, layout.parameters, strict=True))

    def named_gradients(self, method_name: str | None = None) -> dict[str, torch.Tensor]:
        """Parameter name -> its ``.grad`` (set by :meth:`forward_backward`)."""
        name = self._name(method_name)
        if name not in self._loaded:
            raise StateError("call forward_backward before named_gradients")
        layout = self._loaded[name].layout
        out = {n: p.grad for n, p in zip(layout.names, layout.parameters, strict=True)}
        if any(g is None for g in out.values()):
            raise StateError(
                f"method '{name}': no gradients (cleared since the last forward_backward)"
            )
        return out  # type: ignore[return-value]

    # -- weights -------------------------------------------------------------------------
    def _all(self, method_name: str | None) -> Iterator[_Trained]:
        if method_name is not None:
            yield self._get(method_name)
            return
        if not self._loaded:
            for name in self.methods:
                self._get(name)
        yield from self._loaded.values()

    def state_dict(self, method_name: str | None = None) -> dict[str, torch.Tensor]:
        """The trainable parameters by fully qualified name, as copies (for
        ``torch.save`` or safetensors); of every loaded training method by default."""
        return {
            n: p.detach().clone()
            for t in self._all(method_name)
            for n, p in zip(t.layout.names, t.layout.parameters, strict=True)
        }

    def load_state_dict(
        self, state: Mapping[str, torch.Tensor], method_name: str = "forward", strict: bool = True
    ) -> None:
        """Copy ``state`` (name -> tensor) into the parameters of ``method_name``; every
        entry is checked before any is written. ``strict``: the names must be exactly the
        method's."""
        layout = self._get(method_name).layout
        params = dict(zip(layout.names, layout.parameters, strict=True))
        if strict and set(state) != set(params):
            missing = sorted(set(params) - set(state))
            extra = sorted(set(state) - set(params))
            raise NotFoundError(f"state_dict: missing {missing}, unexpected {extra}")
        for name, value in state.items():
            p = params.get(name)
            if p is None:
                continue
            if not isinstance(value, torch.Tensor) or value.shape != p.shape:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
                raise InputError(f"state_dict['{name}']: expected {tuple(p.shape)}, got {got}")
        with torch.no_grad():
            for name, value in state.items():
                if name in params:
                    params[name].copy_(value)

    def _updates(self) -> list[tuple[Any, int, torch.Tensor]]:
        return [
            (t.method.state.plan, slot, p)
            for t in self._all(None)
            for slot, p in zip(t.layout.parameter_slots, t.layout.parameters, strict=True)
        ]

    def pte_bytes(self) -> bytes:
        """The program as a ``.pte`` whose parameters start at their current values."""
        return pte_with(self._program, self._updates())

    def ptd_bytes(self) -> bytes:
        """The program's ``.ptd`` (``external_mutable_weights``) with the current values."""
        return ptd_with(self._program, self._updates())

    def save_pte(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`pte_bytes` to ``path`` (atomically)."""
        write_atomically(path, self.pte_bytes())

    def save_ptd(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`ptd_bytes` to ``path`` (atomically); the ``.pte`` is unchanged."""
        write_atomically(path, self.ptd_bytes())

    # -- checks --------------------------------------------------------------------------
    def check_gradients(
        self,
        module: torch.nn.Module,
        inputs: Sequence[Any],
        method_name: str = "forward",
        *,
        rtol: float = 1e-4,
        atol: float = 1e-5,
    ) -> GradientCheck:
        """Compare this program's loss and gradients at its current parameters with eager
        autograd on ``module`` (the source module, first output the loss); see
        :func:`ptexec.training.check.check_gradients`."""
        from .check import check_gradients

        trained = self._get(method_name)
        return check_gradients(trained.method, trained.layout, module, inputs, rtol, atol)

    def __repr__(self) -> str:
        return f"<ptexec.training.TrainingModule methods={list(self.methods)}>"


def load(
    source: Any,
    data_path: str | os.PathLike[str] | bytes | bytearray | None = None,
    *,
    device_map: DeviceMapSpec = None,
    **load_options: Any,
) -> TrainingModule:
    """Load a training program (a path, bytes or a file object; its ``.ptd`` as
    ``data_path``, a path or bytes) as a :class:`TrainingModule`."""
    return TrainingModule(load_source(source, data_path), device_map=device_map, **load_options)


def _load_for_executorch_for_training(
    path: str | os.PathLike[str], data_path: str | os.PathLike[str] | None = None
) -> TrainingModule:
    """ExecuTorch's name: the training program at ``path`` (and its ``.ptd``)."""
    return load(path, data_path)


def _load_for_executorch_for_training_from_buffer(
    buffer: bytes | bytearray | memoryview, data_buffer: bytes | bytearray | None = None
) -> TrainingModule:
    """ExecuTorch's name: the training program in ``buffer`` (and its ``.ptd`` bytes)."""
    return load(bytes(buffer) if isinstance(buffer, memoryview) else buffer, data_buffer)
