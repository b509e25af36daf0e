"""The names of ``executorch.runtime``, backed by ptexec.

A script written for ExecuTorch's Python runtime switches by changing one import::

    from ptexec.runtime import Runtime          # was: from executorch.runtime import Runtime
    program = Runtime.get().load_program("model.pte")
    method = program.load_method("forward")
    outputs = method.execute([x])

``TensorInfo`` here has ExecuTorch's accessor methods (``sizes()``, ``dtype()`` as the
scalar-type code, ``is_memory_planned()``, ``nbytes()``) plus ``device()`` and
``dim_order()``, which ExecuTorch's lacks.
"""

from __future__ import annotations

import enum
import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from . import method as _method
from . import program as _program
from .delegates import registered_backends
from .dtypes import DTYPE_TO_CODE
from .errors import MethodNotFoundError
from .format.scalar_type import scalar_type_name
from .kernels.registry import registered_names
from .tensor import TensorInfo as _TensorInfo

__all__ = [
    "BackendRegistry",
    "Method",
    "MethodMeta",
    "OperatorRegistry",
    "Program",
    "Runtime",
    "TensorInfo",
    "Verification",
]


class Verification(enum.IntEnum):
    """Accepted for compatibility; ptexec always validates the whole program."""

    Minimal = 0
    InternalConsistency = 1


class TensorInfo:
    """ExecuTorch-style description of one tensor (accessor methods, not attributes)."""

    def __init__(self, info: _TensorInfo) -> None:
        self._info = info

    def sizes(self) -> tuple[int, ...]:
        return self._info.sizes

    def dtype(self) -> int:
        """The ExecuTorch scalar type code (e.g. 6 for float32)."""
        return DTYPE_TO_CODE[self._info.dtype]

    def is_memory_planned(self) -> bool:
        return self._info.is_memory_planned

    def nbytes(self) -> int:
        return self._info.nbytes

    def dim_order(self) -> tuple[int, ...] | None:
        return self._info.dim_order

    def device(self) -> str:
        return str(self._info.device)

    @property
    def info(self) -> _TensorInfo:
        """The ptexec :class:`ptexec.TensorInfo` behind this one."""
        return self._info

    def __repr__(self) -> str:
        sizes = list(self._info.sizes)
        name = scalar_type_name(self.dtype())
        return (
            f"TensorInfo(sizes={sizes}, dtype={name}, is_memory_planned="
            f"{self._info.is_memory_planned}, nbytes={self._info.nbytes}, device={self._info.device})"
        )


class MethodMeta:
    """ExecuTorch-style method metadata."""

    def __init__(self, meta: _method.MethodMeta) -> None:
        self._meta = meta

    def name(self) -> str:
        return self._meta.name

    def num_inputs(self) -> int:
        return len(self._meta.inputs)

    def num_outputs(self) -> int:
        return len(self._meta.outputs)

    def num_attributes(self) -> int:
        return 0

    def _tensor(self, infos: Sequence[Any], index: int, what: str) -> TensorInfo:
        if not 0 <= index < len(infos):
            raise IndexError(f"{what} index {index} out of range ({len(infos)} {what}s)")
        info = infos[index]
        if not isinstance(info, _TensorInfo):
            raise IndexError(f"{what} {index} is a {info.kind}, not a tensor")
        return TensorInfo(info)

    def input_tensor_meta(self, index: int) -> TensorInfo:
        return self._tensor(self._meta.inputs, index, "input")

    def output_tensor_meta(self, index: int) -> TensorInfo:
        return self._tensor(self._meta.outputs, index, "output")

    def attribute_tensor_meta(self, index: int) -> TensorInfo:
        raise IndexError(f"attribute index {index} out of range (0 attributes)")

    @property
    def meta(self) -> _method.MethodMeta:
        return self._meta

    def _list(self, infos: Sequence[Any]) -> str:
        parts = []
        for info in infos:
            parts.append(
                repr(TensorInfo(info)) if isinstance(info, _TensorInfo) else info.kind.capitalize()
            )
        return "[" + ", ".join(parts) + "]"

    def __repr__(self) -> str:
        m = self._meta
        return (
            f"MethodMeta(name='{m.name}', num_inputs={len(m.inputs)}, input_tensor_meta="
            f"{self._list(m.inputs)}, num_outputs={len(m.outputs)}, output_tensor_meta="
            f"{self._list(m.outputs)})"
        )


class Method:
    """ExecuTorch-style method: ``execute(inputs)`` returns copies of the outputs."""

    def __init__(self, method: _method.Method) -> None:
        self._method = method

    def execute(self, inputs: Sequence[Any]) -> Sequence[Any]:
        return self._method.execute(inputs)

    def __call__(self, inputs: Sequence[Any]) -> Sequence[Any]:
        return self._method.execute(inputs)

    @property
    def metadata(self) -> MethodMeta:
        return MethodMeta(self._method.meta)

    @property
    def method(self) -> _method.Method:
        """The ptexec :class:`ptexec.Method` behind this one."""
        return self._method


class Program:
    """ExecuTorch-style program: methods are loaded once and cached."""

    def __init__(self, program: _program.Program) -> None:
        self._program = program
        self._methods: dict[str, Method] = {}

    @property
    def method_names(self) -> set[str]:
        return set(self._program.method_names)

    def load_method(self, name: str) -> Method:
        method = self._methods.get(name)
        if method is None:
            if name not in self._program.method_names:
                raise MethodNotFoundError(f"no method '{name}' in this program")
            method = Method(self._program.load_method(name))
            self._methods[name] = method
        return method

    def metadata(self, method_name: str) -> MethodMeta:
        return MethodMeta(self._program.method_meta(method_name))

    @property
    def program(self) -> _program.Program:
        """The ptexec :class:`ptexec.Program` behind this one."""
        return self._program


class BackendRegistry:
    @property
    def registered_backend_names(self) -> list[str]:
        return registered_backends()

    def is_available(self, backend_name: str) -> bool:
        return backend_name in registered_backends()


class OperatorRegistry:
    @property
    def operator_names(self) -> set[str]:
        """Operators with an explicit kernel (any ``aten::`` op torch has also runs)."""
        return set(registered_names())


class Runtime:
    """The process-wide runtime (``Runtime.get()``)."""

    def __init__(self) -> None:
        self.backend_registry = BackendRegistry()
        self.operator_registry = OperatorRegistry()

    @staticmethod
    @functools.lru_cache(maxsize=1)
    def get() -> Runtime:
        return Runtime()

    def load_program(
        self,
        data: bytes | bytearray | BinaryIO | Path | str,
        *,
        verification: Verification = Verification.InternalConsistency,
        enable_etdump: bool = False,
        debug_buffer_size: int = 0,
        data_path: str | os.PathLike[str] | None = None,
    ) -> Program:
        """Load a program from a path, bytes or a binary file object."""
        if enable_etdump:
            raise NotImplementedError(
                "ETDump is not produced by ptexec; use ptexec's tracing instead"
            )
        return Program(_program.load(data, data_path=data_path))
