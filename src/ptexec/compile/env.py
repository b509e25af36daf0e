"""The values of a traced run of instructions, and the error for an instruction that has
no functional form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Env", "NoFunctionalForm"]


class NoFunctionalForm(Exception):
    """An instruction that has no functional form here (its message says why)."""


class Env:
    """The values of a traced run: ``env[j]`` for value ``j``, with the method's literals
    and constants behind it. ``frozen``: ids of tensors an op must not update in place
    (inputs of the traced region whose memory the region does not write itself): an op
    that mutates one updates a copy instead."""

    def __init__(self, read_constant: Callable[[int], Any]) -> None:
        self.values: dict[int, Any] = {}
        self.read_constant = read_constant
        self.frozen: set[int] = set()

    def __contains__(self, j: int) -> bool:
        return j in self.values

    def __getitem__(self, j: int) -> Any:
        if j in self.values:
            return self.values[j]
        return self.read_constant(j)

    def __setitem__(self, j: int, x: Any) -> None:
        self.values[j] = x
