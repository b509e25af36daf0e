"""What a call did: per input whether it was shared or copied, and bytes copied by direction."""

from __future__ import annotations

import torch

__all__ = ["CallRecord"]


class CallRecord:
    """Filled in by each call of a method (one object, reused; read it after the call).

    ``inputs[i]`` is the binding action of input ``i`` (``"share"``, ``"copy"``,
    ``"transfer"``, ``"convert"``, ``"move"``, ``"empty"``, or ``"value"`` for a non-tensor;
    an input lying in memory the method writes, a view-mode output fed back, is read into
    a copy before anything is written: ``"copy"`` where it would have been shared),
    and ``h2h``/``h2d``/``d2h``/``d2d`` count the bytes copied in that direction by input
    binding, device-copy instructions and caller-given outputs.
    """

    __slots__ = ("d2d", "d2h", "h2d", "h2h", "inputs", "outputs")

    def __init__(self, num_inputs: int = 0, num_outputs: int = 0) -> None:
        self.inputs: list[str] = ["" for _ in range(num_inputs)]
        self.outputs: list[str] = ["" for _ in range(num_outputs)]
        self.h2h = 0
        self.h2d = 0
        self.d2h = 0
        self.d2d = 0

    def reset(self) -> None:
        """Forget the last call's byte counts and output actions (inputs are rewritten by
        every call)."""
        self.h2h = self.h2d = self.d2h = self.d2d = 0
        self.outputs[:] = [""] * len(self.outputs)

    def count(self, src: torch.Tensor, dst: torch.Tensor, nbytes: int) -> None:
        """Add ``nbytes`` copied from ``src``'s device to ``dst``'s device."""
        if src.is_cuda:
            if dst.is_cuda:
                self.d2d += nbytes
            else:
                self.d2h += nbytes
        elif dst.is_cuda:
            self.h2d += nbytes
        else:
            self.h2h += nbytes

    @property
    def bytes_copied(self) -> dict[str, int]:
        return {"h2h": self.h2h, "h2d": self.h2d, "d2h": self.d2h, "d2d": self.d2d}

    @property
    def copies(self) -> int:
        """Total bytes copied in the last call, all directions together."""
        return self.h2h + self.h2d + self.d2h + self.d2d

    def __repr__(self) -> str:
        return (
            f"CallRecord(inputs={self.inputs}, outputs={self.outputs}, "
            f"bytes_copied={self.bytes_copied})"
        )
