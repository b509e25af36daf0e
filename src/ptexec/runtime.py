"""The names of ``executorch.runtime``, backed by ptexec.

A script written for ExecuTorch's Python runtime switches by changing one import::

    from ptexec.runtime import Runtime          # was: from executorch.runtime import Runtime
    program = Runtime.get().load_program("model.pte")
    method = program.load_method("forward")
    outputs = method.execute([x])

What ExecuTorch's objects say, these say the same way: ``str()`` of a ``TensorInfo`` or
``MethodMeta`` is ExecuTorch's text (a tensor not on the CPU adds ``device=cuda:0``), and
every error is a ``RuntimeError`` as ExecuTorch's are (and still the ptexec type with
ptexec's message: an :class:`~ptexec.errors.InputError` is also a ``ValueError``).
``TensorInfo`` here has ExecuTorch's accessor methods (``sizes()``, ``dtype()`` as the
scalar-type code, ``is_memory_planned()``, ``nbytes()``) plus ``device()`` and
``dim_order()``, which ExecuTorch's lacks. ``load_program(..., enable_etdump=True,
debug_buffer_size=N)`` records every call as ExecuTorch's ETDump (see :mod:`ptexec.etdump`)
for ``executorch.devtools.Inspector``; ``write_etdump_result_to_file`` writes it.
"""

from __future__ import annotations

import enum
import functools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from . import method as _method
from . import program as _program
from .delegates import backend_available, registered_backends
from .device import schema_device
from .dtypes import CODE_TO_DTYPE, DTYPE_TO_CODE
from .engine.arguments import check_aliasing, check_out
from .errors import InputError, MethodNotFoundError, StateError
from .etdump import ETDumpRecorder, check_debug_buffer_size
from .format import program as _p
from .format.scalar_type import scalar_type_name
from .kernels.registry import operator_names
from .tensor import TensorInfo as _TensorInfo
from .tensor import dim_order_strides

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
        text = (
            f"TensorInfo(sizes={sizes}, dtype={name}, is_memory_planned="
            f"{self._info.is_memory_planned}, nbytes={self._info.nbytes}"
        )
        if not self._info.device.is_cpu:
            text += f", device={self._info.device}"
        return text + ")"


def _attributes(plan: _p.ExecutionPlan) -> tuple[tuple[str, int, _TensorInfo], ...]:
    """The method's attributes as ExecuTorch counts them: every tensor value with a
    fully qualified name (named mutable buffers, external constants), in value order;
    (name, value index, description)."""
    found = []
    for j, value in enumerate(plan.values):
        if not isinstance(value, _p.Tensor) or value.extra_tensor_info is None:
            continue
        name = value.extra_tensor_info.fully_qualified_name
        dtype = CODE_TO_DTYPE.get(value.scalar_type)
        if not name or dtype is None:
            continue
        info = _TensorInfo(
            sizes=value.sizes,
            dtype=dtype,
            dim_order=value.dim_order,
            device=schema_device(*value.device),
            strides=dim_order_strides(value.sizes, value.dim_order),
            is_memory_planned=value.is_memory_planned,
            dynamism=_p.DYNAMISM_NAMES.get(value.shape_dynamism, "static"),
        )
        found.append((name, j, info))
    return tuple(found)


def _plan(program: _program.Program, name: str) -> _p.ExecutionPlan:
    for plan in program.pte.program.execution_plan:
        if plan.name == name:
            return plan
    raise MethodNotFoundError(
        f"no method '{name}' in this program (methods: {', '.join(program.method_names)})"
    )


#: ExecuTorch's names of the value tags where they are not the kind capitalised.
_TAG_NAMES = {"float": "Double", "str": "String"}


class MethodMeta:
    """ExecuTorch-style method metadata."""

    def __init__(
        self,
        meta: _method.MethodMeta,
        attributes: Sequence[tuple[str, int, _TensorInfo]] = (),
    ) -> None:
        self._meta = meta
        self._attributes = tuple(attributes)

    def name(self) -> str:
        return self._meta.name

    def num_inputs(self) -> int:
        return len(self._meta.inputs)

    def num_outputs(self) -> int:
        return len(self._meta.outputs)

    def num_attributes(self) -> int:
        """Tensors with a fully qualified name (named mutable buffers, external constants)."""
        return len(self._attributes)

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
        return self._tensor([a[2] for a in self._attributes], index, "attribute")

    def attribute_names(self) -> tuple[str, ...]:
        """The attributes' fully qualified names, in order (ExecuTorch has no such call)."""
        return tuple(a[0] for a in self._attributes)

    @property
    def meta(self) -> _method.MethodMeta:
        return self._meta

    @staticmethod
    def _list(infos: Sequence[Any]) -> str:
        return str(
            [
                repr(TensorInfo(info))
                if isinstance(info, _TensorInfo)
                else _TAG_NAMES.get(info.kind, info.kind.capitalize())
                for info in infos
            ]
        )

    def __repr__(self) -> str:
        m = self._meta
        return (
            f"MethodMeta(name='{m.name}', num_inputs={len(m.inputs)}, input_tensor_meta="
            f"{self._list(m.inputs)}, num_outputs={len(m.outputs)}, output_tensor_meta="
            f"{self._list(m.outputs)})"
        )


def method_attributes(
    program: _program.Program, name: str
) -> tuple[tuple[str, int, _TensorInfo], ...]:
    """Method ``name``'s attributes: (fully qualified name, value index, description) of
    every tensor value with a name, as ExecuTorch counts them."""
    return _attributes(_plan(program, name))


def method_meta(program: _program.Program, name: str, device_map: Any = None) -> MethodMeta:
    """The ExecuTorch-style :class:`MethodMeta` of method ``name`` (nothing is loaded), its
    tensors on the devices ``device_map`` places them on (as its loads place them)."""
    return MethodMeta(program.method_meta(name, device_map), method_attributes(program, name))


def load_method(
    program: _program.Program,
    name: str,
    recorder: ETDumpRecorder | None,
    device_map: Any = None,
) -> _method.Method:
    """Load method ``name`` of ``program`` (placed with ``device_map``); with a recorder,
    the load is recorded too."""
    if recorder is None:
        return program.load_method(name, device_map=device_map)
    start = time.perf_counter_ns()
    _plan(program, name)
    init = time.perf_counter_ns()
    method = program.load_method(name, device_map=device_map)
    done = time.perf_counter_ns()
    recorder.record_load(start, init, done, time.perf_counter_ns())
    return method


def load_source(
    data: bytes | bytearray | BinaryIO | Path | str | os.PathLike[str] | memoryview,
    data_path: str | os.PathLike[str] | bytes | bytearray | memoryview | None = None,
) -> _program.Program:
    """:func:`ptexec.load` as ExecuTorch's Python APIs load: a caller's writable buffer
    (``bytearray``, ``memoryview``) is copied, never used in place, so changing it
    afterwards cannot reach the program (ExecuTorch's ``Runtime.load_program`` copies a
    bytearray too, and so does :func:`ptexec.load`)."""
    if not isinstance(data, str | os.PathLike | bytes | bytearray | memoryview) and not hasattr(
        data, "read"
    ):
        raise TypeError(
            "expected a program as bytes, bytearray, a path to a .pte file or a file-like "
            f"object, got {type(data).__name__}"
        )
    return _program.load(private_bytes(data), data_path=private_bytes(data_path))


def private_bytes(data: Any) -> Any:
    """``data`` itself, or for a caller's writable buffer a private copy of its bytes."""
    if isinstance(data, bytearray | memoryview):
        return bytearray(data)
    return data


def write_etdump(
    recorder: ETDumpRecorder | None,
    etdump_path: str | os.PathLike[str],
    debug_buffer_path: str | os.PathLike[str] | None,
) -> None:
    if recorder is None:
        raise StateError(
            "no ETDump: the program was loaded without enable_etdump=True (load it with "
            "enable_etdump=True, and a debug_buffer_size for intermediate values)"
        )
    if not recorder.runs:
        return  # nothing recorded: no file, as ExecuTorch writes none without data
    recorder.write(etdump_path, debug_buffer_path)


def set_output(
    method: _method.Method,
    out: list[Any] | None,
    output: Any,
    index: int,
    recorder: ETDumpRecorder | None,
) -> list[Any] | None:
    """The ``out=`` list of a method after ``set_output(output, index)``, checked now as
    :meth:`ptexec.Method.execute` checks ``out=`` (output ``index`` a tensor output, the
    tensor of its dtype, device and shape, apart from the tensors set for the other
    outputs); None when no output is set any more."""
    n = len(method.meta.outputs)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
        raise InputError(
            f"set_output: output index {index!r} out of range (method '{method.name}' has "
            f"{n} output(s))"
        )
    if output is not None and recorder is not None:
        raise StateError(
            f"set_output on method '{method.name}': a method recording an ETDump returns "
            "copies; load the program without enable_etdump to write outputs in place"
        )
    given = list(out) if out is not None else [None] * n
    given[index] = output
    if output is not None:
        state = method.state
        # apart from each other and from the method's memory (inputs are the call's)
        check_aliasing(state, [(None, None)] * len(state.inputs), check_out(state, given))
    return given if any(t is not None for t in given) else None


class Method:
    """ExecuTorch-style method: ``execute(inputs)`` returns copies of the outputs."""

    def __init__(self, method: _method.Method, recorder: ETDumpRecorder | None = None) -> None:
        self._method = method
        self._recorder = recorder
        self._out: list[Any] | None = None
        self._call: Callable[[Sequence[Any]], Sequence[Any]] = (
            method.execute if recorder is None else functools.partial(recorder.execute, method)
        )

    def execute(self, inputs: Sequence[Any]) -> Sequence[Any]:
        """Run the method; returns its outputs (copies, except those given to
        :meth:`set_output`, which are the caller's tensors)."""
        return self._call(inputs)

    def set_output(self, output: Any, index: int) -> None:
        """Have every later :meth:`execute` write output ``index`` into the caller's tensor
        ``output`` and return it as that output (ExecuTorch's ``Module::set_output``):
        an output the program leaves unplanned is computed in that memory, a planned one is
        copied into it. The tensor must have the output's dtype, device and shape; None
        undoes it."""
        self._out = set_output(self._method, self._out, output, index, self._recorder)
        out = self._out
        self._call = (
            functools.partial(self._method.execute, out=out)
            if out is not None
            else self._method.execute
            if self._recorder is None
            else functools.partial(self._recorder.execute, self._method)
        )

    def __call__(self, inputs: Sequence[Any]) -> Sequence[Any]:
        return self._call(inputs)

    @property
    def metadata(self) -> MethodMeta:
        m = self._method
        return MethodMeta(m.meta, method_attributes(m.program, m.name))

    @property
    def method(self) -> _method.Method:
        """The ptexec :class:`ptexec.Method` behind this one."""
        return self._method


class Program:
    """ExecuTorch-style program: methods are loaded once and cached."""

    def __init__(self, program: _program.Program, recorder: ETDumpRecorder | None = None) -> None:
        self._program = program
        self._recorder = recorder
        self._methods: dict[str, Method] = {}

    @property
    def method_names(self) -> set[str]:
        return set(self._program.method_names)

    def load_method(self, name: str) -> Method:
        method = self._methods.get(name)
        if method is None:
            method = Method(load_method(self._program, name, self._recorder), self._recorder)
            self._methods[name] = method
        return method

    def metadata(self, method_name: str) -> MethodMeta:
        return method_meta(self._program, method_name)

    def write_etdump_result_to_file(
        self,
        etdump_path: str | os.PathLike[str],
        debug_buffer_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """Write the ETDump of the calls since the last write (and the debug buffer, when
        the program was loaded with a ``debug_buffer_size``)."""
        write_etdump(self._recorder, etdump_path, debug_buffer_path)

    @property
    def etdump(self) -> ETDumpRecorder | None:
        """The recorder of this program's calls (None without ``enable_etdump``)."""
        return self._recorder

    @property
    def program(self) -> _program.Program:
        """The ptexec :class:`ptexec.Program` behind this one."""
        return self._program


class BackendRegistry:
    @property
    def registered_backend_names(self) -> list[str]:
        return registered_backends()

    def is_available(self, backend_name: str) -> bool:
        """Registered and able to run here (OpenVINO's needs the openvino package)."""
        return backend_available(backend_name)


class OperatorRegistry:
    @property
    def operator_names(self) -> set[str]:
        """Every operator ptexec runs by name (``ns::op.overload``), ATen's by schema."""
        return set(operator_names())


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
        """Load a program from a path, bytes or a binary file object. ``enable_etdump``:
        record every call as an ETDump (``debug_buffer_size`` bytes for intermediate
        values; 0 records timings only)."""
        check_debug_buffer_size(debug_buffer_size)
        program = load_source(data, data_path)
        recorder = ETDumpRecorder(debug_buffer_size) if enable_etdump else None
        return Program(program, recorder)
