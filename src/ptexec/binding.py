"""The input placement rules, as one pure decision function.

``decide(expected, got, policy)`` compares a program's input tensor (its
:class:`~ptexec.tensor.TensorInfo`) with the caller's and returns what to do, or raises
the error that says why it cannot be done:

============  ============================  ===========================================
program       caller's tensor               action
============  ============================  ===========================================
planned on D  on D (any dense or strided    ``COPY`` into the planned view (the copy
              layout)                       converts the layout)
planned on D  on another modeled device     ``TRANSFER`` (counted); refused under
                                            ``transfers="forbid"``
unplanned, D  on D, strides fit the          ``SHARE``: the program uses the caller's
              program's dim order           memory
unplanned, D  on D, other layout            error naming both layouts; ``CONVERT`` (a
                                            counted copy) under ``layout="convert"``
unplanned, D  on another modeled device     error naming both devices; ``MOVE`` (a
                                            counted copy) under ``transfers="allow"``
any           empty (no elements)           no device check; ``EMPTY``
any           wrong dtype, rank or shape    :class:`InputError`
============  ============================  ===========================================

Memory on a device ptexec does not model never reaches this function: describing it
raises :class:`~ptexec.errors.UnsupportedDeviceError` first. The caller of ``decide``
turns ``SHARE`` of a torch tensor with a lazy negation or conjugation, or of a ZeroTensor
(its memory does not hold its values) into ``CONVERT``, or an :class:`InputError` where the program writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from .errors import InputError
from .tensor import TensorInfo, dim_order_strides, layout_name

__all__ = [
    "Action",
    "Policy",
    "common_action",
    "decide",
    "fits_layout",
    "shape_error",
    "shape_test",
]

Transfers = Literal["allow", "forbid", "auto"]
Layout = Literal["strict", "convert"]


class Action(Enum):
    SHARE = "share"  # unplanned input: the program reads the caller's memory
    COPY = "copy"  # planned input: copy into the planned view on the same device
    TRANSFER = "transfer"  # planned input: copy into the planned view from another device
    CONVERT = "convert"  # unplanned input: copy on the same device into the program's layout
    MOVE = "move"  # unplanned input: copy from another device
    EMPTY = "empty"  # no elements: nothing to share or copy

    @property
    def copies(self) -> bool:
        return self in (Action.COPY, Action.TRANSFER, Action.CONVERT, Action.MOVE)


@dataclass(frozen=True, slots=True)
class Policy:
    """How far binding may go to make an input fit.

    ``transfers``: ``"auto"`` (default) copies a planned input across devices (it is
    copied anyway) but refuses an unplanned one on the wrong device; ``"allow"`` moves both;
    ``"forbid"`` moves neither. ``layout``: ``"strict"`` refuses an unplanned input whose
    layout differs from the program's; ``"convert"`` copies it into the program's layout.
    """

    transfers: Transfers = "auto"
    layout: Layout = "strict"

    def __post_init__(self) -> None:
        if self.transfers not in ("allow", "forbid", "auto"):
            raise ValueError(
                f"transfers must be 'allow', 'forbid' or 'auto', not {self.transfers!r}"
            )
        if self.layout not in ("strict", "convert"):
            raise ValueError(f"layout must be 'strict' or 'convert', not {self.layout!r}")


def fits_layout(expected: TensorInfo, got: TensorInfo) -> bool:
    """Whether ``got``'s strides are those of ``expected``'s dim order at ``got``'s sizes
    (dimensions of size 1 are free)."""
    if got.strides is None or expected.dim_order is None:
        return False
    want = dim_order_strides(got.sizes, expected.dim_order)
    return all(s == w or n == 1 for s, w, n in zip(got.strides, want, got.sizes, strict=True))


def shape_error(expected: TensorInfo, sizes: tuple[int, ...]) -> str | None:
    """Why ``sizes`` cannot be bound to ``expected`` (None when they can)."""
    if len(sizes) != len(expected.sizes):
        return f"rank {len(sizes)}, expected rank {len(expected.sizes)}"
    if expected.dynamism == "static":
        if sizes != expected.sizes:
            return "shape differs"
    elif expected.dynamism == "dynamic_bound":
        over = [d for d, (s, b) in enumerate(zip(sizes, expected.sizes, strict=True)) if s > b]
        if over:
            bound = list(expected.sizes)
            return f"dimension {over[0]} exceeds the upper bound {bound}"
    return None


def shape_test(expected: TensorInfo, shape: str) -> str:
    """:func:`shape_error`'s rule as a Python expression for generated code: true exactly
    when ``shape_error(expected, sizes)`` is None, ``shape`` being the source of an
    expression whose value is the sizes (a ``torch.Size`` or a tuple)."""
    rank = len(expected.sizes)
    if expected.dynamism == "static":
        return f"{shape} == {tuple(expected.sizes)!r}"
    test = f"len({shape}) == {rank}"
    if expected.dynamism == "dynamic_bound":
        test += "".join(f" and {shape}[{d}] <= {b}" for d, b in enumerate(expected.sizes))
    return test


def common_action(expected: TensorInfo, contiguous: bool) -> Action | None:
    """What :func:`decide` returns, under any policy, for a tensor with elements, dense,
    of exactly ``expected``'s dtype and sizes and on its device (``contiguous``: whether
    it is contiguous): ``COPY`` when the input is planned, ``SHARE`` when it is not and
    its dim order is the identity and the tensor is contiguous; None when only
    :func:`decide` can tell (other layouts)."""
    if expected.is_memory_planned:
        return Action.COPY
    if contiguous and expected.dim_order == tuple(range(len(expected.sizes))):
        return Action.SHARE
    return None


def _described(info: TensorInfo) -> str:
    """``info`` in a mismatch message: its dtype and sizes (bounds, for a program's dynamic
    tensor) and device, not its layout (the message names that where it is the problem)."""
    return f"{info.shape_text} on {info.device}"


def decide(
    expected: TensorInfo,
    got: TensorInfo,
    policy: Policy = Policy(),
    where: str = "input",
) -> Action:
    """What to do with the caller's tensor ``got`` for the program tensor ``expected``.

    ``where`` names the input in messages (``input 0 of 'forward'``). Raises
    :class:`InputError` when the tensor cannot be used under ``policy``.
    """
    if got.dtype != expected.dtype:
        raise InputError(f"{where}: expected {_described(expected)}, got {_described(got)} (dtype)")
    problem = shape_error(expected, got.sizes)
    if problem is not None:
        raise InputError(
            f"{where}: expected {_described(expected)}, got {_described(got)} ({problem})"
        )
    if got.numel == 0:
        return Action.EMPTY
    same_device = got.device == expected.device
    if expected.is_memory_planned:
        if same_device:
            return Action.COPY
        if policy.transfers == "forbid":
            raise InputError(
                f"{where}: expected {_described(expected)}, got {_described(got)} "
                f"(a copy from {got.device} to {expected.device} is needed and transfers='forbid')"
            )
        return Action.TRANSFER
    if not same_device:
        if policy.transfers != "allow":
            raise InputError(
                f"{where}: expected {_described(expected)}, got {_described(got)}; the program reads "
                f"this input in place on {expected.device} (it is not memory-planned), so it "
                f"must be on {expected.device}, or pass transfers='allow' to copy it there"
            )
        return Action.MOVE
    if fits_layout(expected, got):
        return Action.SHARE
    if policy.layout == "convert":
        return Action.CONVERT
    raise InputError(
        f"{where}: expected {_described(expected)} laid out {layout_name(expected.dim_order)}, "
        f"got {layout_name(got.dim_order)} layout; the program reads this input in place, so "
        f"pass a tensor in its layout, or layout='convert' to copy it"
    )
