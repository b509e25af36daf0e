"""``TrainingModule``: ExecuTorch's training API over a ptexec program, and more.

ExecuTorch's names work as there (``forward_backward(method_name, inputs)`` returns the
loss and the user outputs, ``named_parameters()``, ``named_gradients()``, and
:func:`ptexec.training.get_sgd_optimizer` steps on them). As there, ``named_gradients()``
hands out copies, which a later call does not overwrite. Beyond them:

- Parameters are the method's planned tensors themselves and each parameter's ``.grad``
  is the method's planned gradient, so any ``torch.optim`` optimizer, LR scheduler and
  ``torch.nn.utils.clip_grad_norm_`` work on :meth:`TrainingModule.parameters` in place,
  and the next call reads what they wrote. ``forward_backward(..., accumulate=True)``
  adds into ``.grad`` as ``loss.backward()`` does (``optimizer.zero_grad()`` clears it);
  the default replaces it, as ExecuTorch does. Where the program returns one gradient
  value for several parameters, each parameter after the first gets a copy as ``.grad``
  (clipping or summing one ``.grad`` in place changes no other). A call of the method
  itself (:meth:`TrainingModule.method`, for an evaluation batch, a trace) first gives
  each ``.grad`` over the gradient memory a copy (``Method.before_each_call``), so the
  gradients stay the last ``forward_backward``'s.
- ``device_map`` places the program's planned memory (its parameters, gradients and
  activations) on another device, as for any ptexec method.
- :meth:`save_pte` / :meth:`save_ptd` write the trained parameters back to a program file
  that ptexec and ExecuTorch's runtime load; :meth:`state_dict` gives them by name.
- :meth:`check_gradients` compares the program's gradients with eager autograd.

Only what the program marks trainable (the names its exporter listed) is a parameter
here: frozen weights of a LoRA program are constants of the program and stay so.

A program may have several training methods that share a parameter (one module, several
losses). ExecuTorch's exporter gives their copies the same initial bytes in the file, but
each loaded method keeps its own copy, and training one method changes only its copy.
Where the value of a name is gathered (:meth:`state_dict` without a method, over the
loaded methods; :meth:`save_pte` and :meth:`save_ptd`, over every training method, so that
what a file saved holds does not depend on which methods were loaded), copies that agree
give that value; where
they differ, the copy that differs from the file's initial value (the trained one) wins;
two or more copies that differ from it and from each other are a :class:`StateError`
naming the parameter and the methods (:meth:`TrainingModule._gathered`). Copies the file
starts from different values are not one parameter (two modules' weights of one name):
saving keeps each method's own, and gathering them by name is a :class:`StateError`.

A call that fails inside the program (a kernel raises) may have overwritten the gradient
memory, which the method's forward intermediates reuse; see :meth:`forward_backward` for
what ``.grad`` and ``named_gradients()`` hold then. The parameters are never changed by a
failed call.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..errors import CALL_REFUSALS, InputError, NotFoundError, StateError
from ..files import write_atomically
from ..loader import DeviceMapSpec
from ..runtime import load_source
from .layout import Layout, read_layout, training_methods
from .save import initial_bytes, parameter_bytes, ptd_with, pte_with

if TYPE_CHECKING:
    from ..method import Method
    from ..program import Program
    from .check import GradientCheck

__all__ = [
    "LoadedKeys",
    "TrainingModule",
    "_load_for_executorch_for_training",
    "_load_for_executorch_for_training_from_buffer",
    "load",
]


class _Trained:
    """One loaded training method: the method and its layout."""

    __slots__ = ("__weakref__", "failed", "layout", "live", "method", "named_grads", "stash")

    def __init__(self, method: Method, layout: Layout) -> None:
        self.method = method
        self.layout = layout
        self.stash: list[torch.Tensor] | None = None  # gradients kept while accumulating
        # named_gradients()'s copies since the last successful call (None: not made yet)
        self.named_grads: dict[str, torch.Tensor] | None = None
        self.failed = False  # the last call failed inside the program (gradients lost)
        # .grad may be the gradient memory a forward_backward filled: a call of the method
        # outside forward_backward must first give those .grad memory of their own
        self.live = False
        method.before_each_call(_keeper(weakref.ref(self)))

    def keep_gradients(self) -> None:
        """Before a call of the method other than :meth:`TrainingModule.forward_backward`
        (an evaluation batch, a trace) overwrites the gradient memory: each ``.grad`` over
        it becomes a copy, so ``.grad``, ``named_gradients()`` and an accumulated sum stay
        the last ``forward_backward``'s, as in eager PyTorch and ExecuTorch."""
        if not self.live:
            return
        self.live = False
        with torch.no_grad():
            for p, g in zip(self.layout.parameters, self.layout.gradients, strict=True):
                if p.grad is not None and _holds(p.grad, g):
                    p.grad = g.clone()


def _keeper(ref: weakref.ReferenceType[_Trained]) -> Callable[[], None]:
    """The method's hook before each call; it holds the module's state weakly (the state
    holds the method)."""

    def keep() -> None:
        trained = ref()
        if trained is not None:
            trained.keep_gradients()

    return keep


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as raw bytes (logical order), to compare values bit for bit."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else flat


class LoadedKeys(NamedTuple):
    """What :meth:`TrainingModule.load_state_dict` did not load: the method's parameters
    the state left out, and the state's names that are no parameter of the method."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _holds(grad: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether ``grad`` (a parameter's ``.grad``) is the planned gradient ``g``'s memory,
    as ``g`` itself or another tensor over it (``g.detach()``, ``g.view_as(...)``): a call
    overwrites it. Memory of ``g`` in another layout is refused (:class:`StateError`)."""
    if grad is g:
        return True
    if grad.device != g.device or grad.numel() == 0 or g.numel() == 0:
        return False
    start, size = g.data_ptr(), g.numel() * g.element_size()
    other = grad.data_ptr()
    if other + grad.numel() * grad.element_size() <= start or start + size <= other:
        return False
    if other == start and grad.shape == g.shape and grad.stride() == g.stride():
        return True
    raise StateError(
        "a parameter's .grad lies in the method's planned gradient memory in another layout "
        f"(sizes {list(grad.shape)}, strides {list(grad.stride())}): the next call overwrites "
        "it; set .grad to None or to a tensor of its own"
    )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same value, bit for bit."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device == b.device and a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True
    return torch.equal(_bits(a), _bits(b.to(a.device)))


class TrainingModule:
    """A training program loaded for training (module docstring).

    Load it with :func:`load` (or ExecuTorch's ``_load_for_executorch_for_training``).
    ``load_options`` go to every ``load_method`` (``device_map``, ``compile``, ...); the
    methods load on first use. :meth:`method` gives a loaded method as any other, its
    calls returning copies unless ``load_options`` say ``outputs="view"``. Not for
    concurrent use from several threads.

    Training changes only the training methods' own copies of the weights. A method
    exported beside them for inference keeps the exported weights for the session (each
    method has memory of its own, in ExecuTorch's runtime too) and in :meth:`save_pte`'s
    file (constants of the program); it reads the trained values from :meth:`save_ptd`'s
    file where it reads a parameter's key (exported with ``external_constants`` and
    ``external_mutable_weights`` under the same names). Otherwise the training method's
    user outputs (:meth:`forward_backward`) are the trained model's predictions.
    """

    def __init__(
        self, program: Program, *, device_map: DeviceMapSpec = None, **load_options: Any
    ) -> None:
        self._program = program
        self._options: dict[str, Any] = dict(load_options, device_map=device_map)
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
        planned memory, rewritten by the next ``forward_backward``; a call of the method
        itself, for its outputs, first gives each such ``.grad`` a copy, so that it
        changes no gradient, as an evaluation changes none in eager PyTorch). With
        ``accumulate``, a parameter whose ``.grad`` is set gets this call's gradient
        added to it, as in eager PyTorch. Inputs the method refuses raise before anything
        is written.

        A call that fails inside the program (a kernel raises, e.g. on a label out of
        range) re-raises that error and changes no parameter. Its forward intermediates
        may have overwritten the gradient memory, so:

        - with ``accumulate``, the gradients ``.grad`` held before the call (kept aside
          for the sum anyway) are put back, so skipping a failed micro-batch leaves the
          sum of the others, as in eager PyTorch;
        - without it, each ``.grad`` that is the method's gradient memory becomes None
          (a ``.grad`` the caller set to a tensor of their own is left as it was). The
          previous call's gradients could only be put back by copying them out before
          every call, the per-call copy that ``.grad`` being the planned memory exists
          to avoid; None never passes for a gradient (``torch.optim`` optimizers skip
          such a parameter, as after ``zero_grad()`` in eager PyTorch).
          ``named_gradients()`` still gives the copies it gave since the last successful
          call (ExecuTorch's behaviour), and raises :class:`StateError` if it gave none.
        """
        trained = self._get(method_name)
        layout = trained.layout
        params, grads = layout.parameters, layout.gradients
        kept = self._stash(trained) if accumulate else ()
        live, trained.live = trained.live, False  # this call writes what .grad is to hold
        try:
            # views for this call only: the gradients and parameters are the layout's
            # tensors already, and :meth:`method` keeps a Method's own default (copies)
            outs = trained.method.execute(inputs, outputs="view")
        except BaseException as e:
            # refused inputs raise before anything is written (Method.execute)
            if isinstance(e, CALL_REFUSALS):
                trained.live = live
            else:
                self._failed(trained, kept, accumulate)
            raise
        trained.named_grads = None
        trained.failed = False
        trained.live = True
        user = [
            o.clone() if isinstance(o, torch.Tensor) else o for o in outs[: layout.gradient_start]
        ]
        with torch.no_grad():
            # a gradient whose memory another parameter's gradient shares gets a .grad of
            # its own, taken before that memory is summed into below
            for i in layout.shared_gradients:
                p, g, prev = params[i], grads[i], params[i].grad
                if accumulate and prev is not None and not _holds(prev, g):
                    prev.add_(g)
                else:
                    p.grad = g.clone()
            for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                prev = p.grad
                if i in layout.shared_gradients:
                    continue
                if not accumulate or prev is None:
                    if prev is not g:
                        p.grad = g
                elif _holds(prev, g):
                    stash = trained.stash
                    assert stash is not None
                    g.add_(stash[i])
                else:
                    prev.add_(g)
        self._last = method_name
        return user

    def _stash(self, trained: _Trained) -> list[int]:
        """Keep the gradients that ``.grad`` holds in planned memory before a call
        overwrites them; the indices of those kept."""
        layout = trained.layout
        kept = []
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(layout.parameters, layout.gradients, strict=True)):
                if p.grad is not None and _holds(p.grad, g):
                    if trained.stash is None:
                        trained.stash = [torch.empty_like(t) for t in layout.gradients]
                    trained.stash[i].copy_(g)
                    kept.append(i)
        return kept

    def _failed(self, trained: _Trained, kept: Sequence[int], accumulate: bool) -> None:
        """After a call that failed inside the program: the gradient memory holds
        whatever the call left there (:meth:`forward_backward`)."""
        layout = trained.layout
        with torch.no_grad():
            if accumulate:
                stash = trained.stash
                for i in kept:
                    assert stash is not None
                    layout.gradients[i].copy_(stash[i])
                trained.live = True
                return
            for p, g in zip(layout.parameters, layout.gradients, strict=True):
                if p.grad is not None and _holds(p.grad, g):
                    p.grad = None
        trained.failed = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's ``.grad`` (as ``torch.optim.Optimizer.zero_grad``)."""
        for trained in self._loaded.values():
            trained.named_grads = None
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
        """ExecuTorch's: parameter name -> a copy of its gradient, so that gradients kept
        from one call are not overwritten by the next (ExecuTorch's ``TrainingModule``
        clones them too). The copies are of each ``.grad`` as it is at the first call
        after a :meth:`forward_backward`; later calls return the same dict until the
        next successful :meth:`forward_backward` or :meth:`zero_grad`, as ExecuTorch's
        do, so an optimizer that writes into the gradients it is given (ExecuTorch's SGD
        adds weight decay into them) writes into these copies, not into ``.grad``.
        ``.grad`` (:meth:`parameters`) is the planned memory itself, without a copy."""
        name = self._name(method_name)
        trained = self._loaded.get(name)
        if trained is None:
            raise StateError("call forward_backward before named_gradients")
        if trained.named_grads is not None:
            return trained.named_grads
        layout = trained.layout
        grads = [p.grad for p in layout.parameters]
        if any(g is None for g in grads):
            why = (
                "its last forward_backward failed inside the program, which overwrote them"
                if trained.failed
                else "cleared since the last forward_backward"
            )
            raise StateError(f"method '{name}': no gradients ({why})")
        with torch.no_grad():
            trained.named_grads = {
                n: g.detach().clone()  # type: ignore[union-attr]
                for n, g in zip(layout.names, grads, strict=True)
            }
        return trained.named_grads

    # -- weights -------------------------------------------------------------------------
    def _all(self, method_name: str | None) -> Iterator[_Trained]:
        if method_name is not None:
            yield self._get(method_name)
            return
        if not self._loaded:
            for name in self.methods:
                self._get(name)
        yield from self._loaded.values()

    def _copies(self) -> dict[str, list[tuple[_Trained, int]]]:
        """Name -> every loaded training method's copy of it (all of them if none is
        loaded), as (method, parameter index)."""
        copies: dict[str, list[tuple[_Trained, int]]] = {}
        for t in self._all(None):
            for i, n in enumerate(t.layout.names):
                copies.setdefault(n, []).append((t, i))
        return copies

    def _by_start(self, where: Sequence[tuple[_Trained, int]]) -> list[list[tuple[_Trained, int]]]:
        """Copies of one name grouped by the value the file starts them from: copies that
        start apart are not one parameter (two modules' weights of the same name)."""
        if len(where) == 1:
            return [list(where)]
        groups: dict[bytes, list[tuple[_Trained, int]]] = {}
        for t, i in where:
            plan, slot = t.method.state.plan, t.layout.parameter_slots[i]
            groups.setdefault(bytes(initial_bytes(self._program, plan, slot)), []).append((t, i))
        return list(groups.values())

    def _value(self, name: str, where: Sequence[tuple[_Trained, int]]) -> torch.Tensor:
        """The value of one parameter's copies (the same start): the one rule of the module
        docstring. With one copy, that copy, without a comparison."""
        first = where[0][0].layout.parameters[where[0][1]]
        if len(where) == 1 or all(_same(first, t.layout.parameters[i]) for t, i in where[1:]):
            return first
        return self._trained_copy(name, where)

    def _gathered(self) -> dict[str, torch.Tensor]:
        """Name -> the tensor holding that parameter's value over every loaded training
        method (all of them if none is loaded); a name whose copies the file starts from
        different values (different parameters) is a :class:`StateError`."""
        out: dict[str, torch.Tensor] = {}
        for name, where in self._copies().items():
            groups = self._by_start(where)
            if len(groups) > 1:
                listed = ", ".join(f"'{t.layout.method}'" for t, _ in where)
                raise StateError(
                    f"parameter '{name}': the file starts the copies of methods {listed} "
                    "from different values, so they are different parameters of one name; "
                    "state_dict(method_name) gives one method's"
                )
            out[name] = self._value(name, where)
        return out

    def _trained_copy(self, name: str, where: Sequence[tuple[_Trained, int]]) -> torch.Tensor:
        """Of copies of ``name`` that differ: the one that differs from the file's
        initial value, or a :class:`StateError`."""
        changed = []
        for t, i in where:
            p = t.layout.parameters[i]
            plan, slot = t.method.state.plan, t.layout.parameter_slots[i]
            value = plan.values[slot]
            start = initial_bytes(self._program, plan, slot)
            if parameter_bytes(p, value.dim_order) != start:  # type: ignore[union-attr]
                changed.append((t.layout.method, p))
        if changed and all(_same(changed[0][1], p) for _, p in changed[1:]):
            return changed[0][1]
        methods = [m for m, _ in changed] if changed else [t.layout.method for t, _ in where]
        listed = ", ".join(f"'{m}'" for m in methods)
        why = (
            "differ from the file's initial value and from each other"
            if changed
            else "differ, and the file starts them from different values"
        )
        raise StateError(
            f"parameter '{name}': the copies of methods {listed} {why} (each training "
            "method keeps its own copy); state_dict(method_name) gives one method's, "
            "load_state_dict(state, method_name, strict=False) copies it into another"
        )

    def state_dict(self, method_name: str | None = None) -> dict[str, torch.Tensor]:
        """The trainable parameters by fully qualified name, as copies (for
        ``torch.save`` or safetensors); of ``method_name``, or by default gathered over
        every loaded training method (the copy that was trained where several methods
        share a parameter; module docstring)."""
        if method_name is not None:
            layout = self._get(method_name).layout
            return {
                n: p.detach().clone() for n, p in zip(layout.names, layout.parameters, strict=True)
            }
        return {n: p.detach().clone() for n, p in self._gathered().items()}

    def load_state_dict(
        self, state: Mapping[str, torch.Tensor], method_name: str = "forward", strict: bool = True
    ) -> LoadedKeys:
        """Copy ``state`` (name -> tensor) into the parameters of ``method_name``; every
        entry is checked before any is written. ``strict``: the names must be exactly the
        method's. Returns the method's parameters ``state`` left out and the names it has
        that are no parameter of the method (a frozen weight is a constant of the program:
        it cannot be loaded), as ``torch.nn.Module.load_state_dict`` does."""
        layout = self._get(method_name).layout
        params = dict(zip(layout.names, layout.parameters, strict=True))
        missing = sorted(set(params) - set(state))
        extra = sorted(set(state) - set(params))
        if strict and (missing or extra):
            raise NotFoundError(f"state_dict: missing {missing}, unexpected {extra}")
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []
        for name, value in state.items():
            p = params.get(name)
            if p is None:
                continue
            if not isinstance(value, torch.Tensor) or value.shape != p.shape:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
                raise InputError(f"state_dict['{name}']: expected {tuple(p.shape)}, got {got}")
            try:  # each value made the parameter's before any is written
                src = value.detach().to(device=p.device, dtype=p.dtype)
            except (RuntimeError, NotImplementedError, TypeError) as e:
                raise InputError(f"state_dict['{name}']: cannot be read ({e})") from None
            if src.layout != torch.strided:
                raise InputError(f"state_dict['{name}']: a {src.layout} tensor, not a dense one")
            staged.append((p, src))
        with torch.no_grad():
            for p, src in staged:
                p.copy_(src)
        return LoadedKeys(missing, extra)

    def _updates(self) -> list[tuple[Any, int, torch.Tensor]]:
        """Every training method's parameter slots, each with the value of its parameter:
        the copies of a name the file starts from one value are one parameter (the one
        rule); copies it starts apart each keep their own method's value. Every method is
        loaded first: one not loaded yet still holds the file's value of a parameter
        another method trained, and its copy in the saved file must be the trained one."""
        for name in self.methods:
            self._get(name)
        updates = []
        for name, where in self._copies().items():
            for group in self._by_start(where):
                value = self._value(name, group)
                for t, i in group:
                    updates.append((t.method.state.plan, t.layout.parameter_slots[i], value))
        return updates

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
