"""Array producers for tests: objects that describe memory ptexec cannot reach."""

from __future__ import annotations

from typing import Any


class CudaArray:
    """An array on cuda:0 (DLPack device code 2) that is never consumed."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise RuntimeError("this producer cannot export its memory")
