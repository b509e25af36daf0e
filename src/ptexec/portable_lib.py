"""The names of ``executorch.extension.pybindings.portable_lib``, backed by ptexec.

Scripts written for ExecuTorch's older Python bindings switch by one import::

    from ptexec.portable_lib import _load_for_executorch_from_buffer
    module = _load_for_executorch_from_buffer(open("model.pte", "rb").read())
    y = module.forward([x])[0]

Modules (``_load_for_executorch*``) read their program on first use, as ExecuTorch's do,
and load each method once, lazily; programs (``_load_program*``) read and validate it at
once and give a new method on every ``load_method``. A ``bytearray`` or ``memoryview``
given as a program or its ``.ptd`` is copied when the loader is called (ExecuTorch's
bindings take only ``bytes``; a copy keeps the same guarantee: later changes to the
caller's buffer cannot reach the program). ``clone_outputs=False`` returns
views of the method's memory (valid until its next call), as ExecuTorch returns aliases.
Devices follow ptexec's rules everywhere (a CUDA program's buffers live on its GPU,
unplanned inputs are shared, outputs come back on their device); an input on a device
ptexec does not model is refused with ExecuTorch's words. Every error is a
``RuntimeError`` (and the ptexec type, see :mod:`ptexec.errors`). A memory-planned
input is kept as given (a copy), so ``plan_execute`` runs on it after the caller reuses
its tensor, as ExecuTorch copies it into the plan; one the program writes in place is kept
as each run leaves it, as ExecuTorch's next run reads the plan.

Two differences on purpose. Each loaded method has its own memory: ExecuTorch's
program-loaded methods share one pool, so calling one method can overwrite another's
state and a second ``load_method`` of a method continues the first's state; here a method's
state is its own. A program exported with ``share_mutable_buffers=True`` shares its state
between methods, as the export asks, also through a module; ExecuTorch's ``Module`` gives
each method its own.

ETDump: ``enable_etdump=True`` records every call (``debug_buffer_size`` bytes for the
intermediate values), ``write_etdump_result_to_file`` writes it for ExecuTorch's Inspector
(see :mod:`ptexec.etdump`; while recording, outputs are copies). Bundled programs
(``.bpte``): ``_load_bundled_program_from_buffer`` reads one;
``verify_result_with_bundled_expected_output`` runs a test case and compares. Not here:
``_load_for_executorch_from_data_loader`` (it takes an ExecuTorch C++ data loader); the
legacy profiler calls behave as in ExecuTorch's wheel, where that profiler is compiled
out (``_dump_profile_results()`` is empty: use ETDump or :mod:`ptexec.profile`).
"""

from __future__ import annotations

import errno
import math
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import method as _method
from . import program as _program
from .delegates import backend_available, registered_backends
from .errors import (
    FileMissingError,
    InputError,
    MethodNotFoundError,
    NotFoundError,
    OutputMismatchError,
    StateError,
    UnsupportedDeviceError,
)
from .etdump import ETDumpRecorder, check_debug_buffer_size
from .format.bundled import BundledProgram, BundledTensor, BundledValue, TestCase, read_bundled
from .kernels.registry import operator_names
from .loader import DeviceMapSpec
from .loader.values import scalar_type_dtype
from .runtime import (
    MethodMeta,
    TensorInfo,
    Verification,
    load_method,
    load_source,
    method_attributes,
    method_meta,
    set_output,
    write_etdump,
)
from .tensor import dim_order_strides
from .threads import executorch_pool, get_num_threads, set_num_threads

__all__ = [
    "BundledModule",
    "ExecuTorchMethod",
    "ExecuTorchModule",
    "ExecuTorchProgram",
    "MethodMeta",
    "TensorInfo",
    "Verification",
    "_create_profile_block",
    "_dump_profile_results",
    "_get_operator_names",
    "_get_registered_backend_names",
    "_is_available",
    "_load_bundled_program_from_buffer",
    "_load_for_executorch",
    "_load_for_executorch_from_buffer",
    "_load_for_executorch_from_bundled_program",
    "_load_program",
    "_load_program_from_buffer",
    "_reset_profile_results",
    "_threadpool_get_thread_count",
    "_unsafe_reset_threadpool",
    "default_device",
    "set_default_device",
]

PathLike = str | os.PathLike[str]
DataFile = PathLike | bytes | bytearray | None

_default_device: list[DeviceMapSpec] = [None]


def set_default_device(device: DeviceMapSpec) -> None:
    """Where modules and programs loaded from now on place their methods, unless given a
    ``device_map`` of their own: a device (``"cuda"``, ``"cuda:1"``), a ``{from: to}`` map
    as :meth:`ptexec.Program.load_method` takes it, or None (the devices each program
    names; the default). ExecuTorch's loaders have no such choice; code written for them
    gets one through :func:`ptexec.use_as_executorch` ``(device=...)``."""
    if device is not None:
        from .loader.devices import DeviceMap

        DeviceMap(device)  # a malformed spec fails here, not at the first call
    _default_device[0] = device


def default_device() -> DeviceMapSpec:
    """The ``device_map`` that loaders use when given none (see :func:`set_default_device`)."""
    return _default_device[0]


def _as_list(inputs: Any) -> list[Any]:
    """A call's inputs: a sequence, or one tensor standing for a list of one."""
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    if isinstance(inputs, list | tuple):
        return list(inputs)
    if isinstance(inputs, Sequence) and not isinstance(inputs, str | bytes):
        return list(inputs)
    raise InputError(
        f"inputs must be a sequence of values or one tensor, not {type(inputs).__name__}"
    )


def _as_given(value: Any) -> Any:
    """A copy of an array input as it is now (the caller may reuse its buffer before the
    method runs on it again)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    copy = getattr(value, "copy", None)
    if type(value).__module__ == "numpy" and callable(copy):
        return copy()
    return value


class ExecuTorchMethod:
    """One loaded method: ``set_inputs`` / ``execute`` / ``get_outputs``, or ``call``."""

    def __init__(self, method: _method.Method, recorder: ETDumpRecorder | None = None) -> None:
        self._method = method
        self._recorder = recorder
        # ExecuTorch copies a memory-planned input into the plan when it is given; the
        # inputs kept for a later execute (plan_execute) are copies of those
        self._planned = tuple(
            i
            for i, info in enumerate(method.meta.inputs)
            if getattr(info, "is_memory_planned", False)
        )
        # of those, the ones the program writes in place: after a run, the kept copy is
        # what the plan holds then, as ExecuTorch's next execute reads the plan
        state = method.state
        self._written = tuple(
            (i, state.inputs[i]) for i in self._planned if state.inputs[i].written
        )
        self._inputs: list[Any] = []
        self._outputs: list[Any] | None = None
        self._bundled_index = -1
        self._out: list[Any] | None = None

    def set_inputs(self, inputs: Sequence[Any]) -> None:
        """Give the next :meth:`execute` its inputs (checked then, as by
        :meth:`ptexec.Method.execute`; the count and devices are checked now)."""
        values = _as_list(inputs)
        name = self._method.name
        expected = len(self._method.meta.inputs)
        if len(values) != expected:
            raise InputError(f"method '{name}' takes {expected} input(s), got {len(values)}")
        for i, x in enumerate(values):
            if isinstance(x, torch.Tensor) and not (x.is_cpu or x.is_cuda) and x.numel() > 0:
                raise UnsupportedDeviceError(
                    f"Input {i} for method {name} is on device {x.device}, and only CPU and "
                    "CUDA tensors can be passed to a method."
                )
        for i in self._planned:
            values[i] = _as_given(values[i])
        self._inputs = values
        self._bundled_index = -1

    def execute(self) -> None:
        """Run the method on the inputs last set (a memory-planned input the program
        writes in place as the last run left it, as ExecuTorch runs on its plan)."""
        self._outputs = None
        if self._recorder is not None:
            self._outputs = self._recorder.execute(
                self._method, self._inputs, bundled_input_index=self._bundled_index
            )
        elif self._out is not None:
            self._outputs = self._method.execute(self._inputs, out=self._out)
        else:
            self._outputs = self._method.execute(self._inputs, outputs="view")
        self._keep_written()

    def _keep_written(self) -> None:
        """The planned inputs the program writes, kept as the run left them."""
        for i, spec in self._written:
            if spec.view is not None and isinstance(self._inputs[i], torch.Tensor):
                self._inputs[i] = spec.view.clone()

    def get_outputs(self, clone_outputs: bool = True) -> list[Any]:
        """The last execution's outputs: copies, or with ``clone_outputs=False`` views of
        the method's memory, valid until its next call; either way, an output given to
        :meth:`set_output` is the caller's tensor itself."""
        if self._outputs is None:
            raise StateError(f"method '{self._method.name}' has no outputs: execute it first")
        out = self._out or ()
        if not clone_outputs:  # views that keep their shape when the next call resizes
            return [
                x.view(x.shape) if isinstance(x, torch.Tensor) and not _given(out, k, x) else x
                for k, x in enumerate(self._outputs)
            ]
        return [
            x.clone() if isinstance(x, torch.Tensor) and not _given(out, k, x) else x
            for k, x in enumerate(self._outputs)
        ]

    def call(self, inputs: Any = (), clone_outputs: bool = True) -> list[Any]:
        """``set_inputs``, ``execute`` and ``get_outputs`` in one."""
        values = _as_list(inputs)
        if self._recorder is None and clone_outputs and self._out is None:
            self.set_inputs(values)
            self._outputs = None
            self._outputs = self._method.execute(self._inputs)
            self._keep_written()
            return list(self._outputs)
        self.set_inputs(values)
        self.execute()
        return self.get_outputs(clone_outputs)

    def __call__(self, inputs: Any = (), clone_outputs: bool = True) -> list[Any]:
        return self.call(inputs, clone_outputs)

    def set_output(self, output: Any, index: int) -> None:
        """Have every later execution write output ``index`` into the caller's tensor
        ``output`` (as ExecuTorch's ``Module::set_output``), which the call then returns
        as that output, with ``clone_outputs`` or not; None undoes it."""
        self._out = set_output(self._method, self._out, output, index, self._recorder)

    def method_meta(self) -> MethodMeta:
        m = self._method
        return MethodMeta(m.meta, method_attributes(m.program, m.name))

    def get_attribute(self, name: str) -> Any:
        """The method's tensor with fully qualified name ``name``: a named mutable buffer
        as the method's own memory, not a copy; an external constant as a copy (its memory
        is shared by every program loaded from its data file, which a write through it
        would change; ExecuTorch's constants are read-only memory)."""
        m = self._method
        for fqn, index, info in method_attributes(m.program, m.name):
            if fqn == name:
                value = m.values()[index]
                return value if info.is_memory_planned else value.clone()
        names = ", ".join(a[0] for a in method_attributes(m.program, m.name)) or "none"
        raise NotFoundError(f"method '{m.name}' has no attribute '{name}' (attributes: {names})")

    def _load_bundled_input(self, bundle: BundledModule, index: int) -> None:
        self.set_inputs(bundle.inputs(self._method.name, index))
        self._bundled_index = index

    @property
    def method(self) -> _method.Method:
        """The ptexec :class:`ptexec.Method` behind this one."""
        return self._method


def _given(out: Sequence[Any], k: int, x: Any) -> bool:
    return k < len(out) and out[k] is x


class ExecuTorchProgram:
    """A loaded program: its methods by index and name; each ``load_method`` loads anew."""

    def __init__(
        self,
        program: _program.Program,
        recorder: ETDumpRecorder | None = None,
        *,
        device_map: DeviceMapSpec = None,
    ) -> None:
        self._program = program
        self._recorder = recorder
        self._device_map = device_map if device_map is not None else default_device()

    def num_methods(self) -> int:
        return len(self._program.method_names)

    def get_method_name(self, method_index: int) -> str:
        names = self._program.method_names
        if not 0 <= method_index < len(names):
            raise MethodNotFoundError(
                f"method index {method_index} out of range (the program has {len(names)})"
            )
        return names[method_index]

    def load_method(self, method_name: str) -> ExecuTorchMethod:
        return ExecuTorchMethod(
            load_method(self._program, method_name, self._recorder, self._device_map),
            self._recorder,
        )

    def method_meta(self, method_name: str) -> MethodMeta:
        return method_meta(self._program, method_name, self._device_map)

    def has_etdump(self) -> bool:
        return self._recorder is not None

    def write_etdump_result_to_file(
        self, path: PathLike, debug_buffer_path: PathLike | None = None
    ) -> None:
        write_etdump(self._recorder, path, debug_buffer_path)

    @property
    def program(self) -> _program.Program:
        """The ptexec :class:`ptexec.Program` behind this one."""
        return self._program


class ExecuTorchModule:
    """A program and its methods, read on first use and loaded once each."""

    def __init__(
        self,
        opener: Callable[[], _program.Program],
        recorder: ETDumpRecorder | None = None,
        *,
        device_map: DeviceMapSpec = None,
    ) -> None:
        self._opener: Callable[[], _program.Program] | None = opener
        self._program: _program.Program | None = None
        self._recorder = recorder
        self._device_map = device_map if device_map is not None else default_device()
        self._methods: dict[str, ExecuTorchMethod] = {}
        self._lock = threading.Lock()

    @property
    def program(self) -> _program.Program:
        """The ptexec :class:`ptexec.Program` (read now if it was not yet)."""
        with self._lock:
            if self._program is None:
                assert self._opener is not None
                self._program = self._opener()
                self._opener = None
            return self._program

    def _get(self, method_name: str) -> ExecuTorchMethod:
        method = self._methods.get(method_name)
        if method is not None:
            return method
        program = self.program
        with self._lock:
            method = self._methods.get(method_name)
            if method is None:
                method = ExecuTorchMethod(
                    load_method(program, method_name, self._recorder, self._device_map),
                    self._recorder,
                )
                self._methods[method_name] = method
            return method

    def run_method(
        self, method_name: str, inputs: Any = (), clone_outputs: bool = True
    ) -> list[Any]:
        """Call method ``method_name`` (loaded on its first call) on ``inputs``."""
        return self._get(method_name).call(inputs, clone_outputs)

    def forward(self, inputs: Any = (), clone_outputs: bool = True) -> list[Any]:
        return self.run_method("forward", inputs, clone_outputs)

    def __call__(self, inputs: Any = (), clone_outputs: bool = True) -> list[Any]:
        return self.run_method("forward", inputs, clone_outputs)

    def plan_execute(self, method_name: str, clone_outputs: bool = True) -> list[Any]:
        """Run ``method_name`` on the inputs it was last given (none, the first time)."""
        method = self._get(method_name)
        method.execute()
        return method.get_outputs(clone_outputs)

    def method_meta(self, method_name: str) -> MethodMeta:
        return method_meta(self.program, method_name, self._device_map)

    def method_names(self) -> list[str]:
        return list(self.program.method_names)

    @property
    def device_map(self) -> DeviceMapSpec:
        """Where this module places its methods (None: the devices the program names)."""
        return self._device_map

    def to(self, device: DeviceMapSpec) -> ExecuTorchModule:
        """Place the module's methods with ``device`` (a ``device_map``) from now on: the
        methods loaded so far are dropped and load again there on their next call (their
        state, such as a KV cache, starts anew). Returns the module."""
        with self._lock:
            self._device_map = device
            self._methods = {}
        return self

    def set_output(self, method_name: str, output: Any, index: int) -> None:
        """Method ``method_name``'s output ``index`` is written into ``output`` from now on
        (ExecuTorch's ``Module::set_output``; see :meth:`ExecuTorchMethod.set_output`)."""
        self._get(method_name).set_output(output, index)

    def has_etdump(self) -> bool:
        return self._recorder is not None

    def write_etdump_result_to_file(
        self, path: PathLike, debug_buffer_path: PathLike | None = None
    ) -> None:
        write_etdump(self._recorder, path, debug_buffer_path)

    def load_bundled_input(self, bundle: BundledModule, method_name: str, testset_idx: int) -> None:
        """Set method ``method_name``'s inputs to those of the bundle's test case."""
        self._get(method_name)._load_bundled_input(bundle, testset_idx)

    def verify_result_with_bundled_expected_output(
        self,
        bundle: BundledModule,
        method_name: str,
        testset_idx: int,
        rtol: float = 1e-5,
        atol: float = 1e-8,
    ) -> list[Any]:
        """Compare the method's last outputs with the test case's expected ones; returns
        them, raises :class:`~ptexec.errors.OutputMismatchError` where they differ."""
        outputs = self._get(method_name).get_outputs(clone_outputs=True)
        bundle.compare(method_name, testset_idx, outputs, rtol, atol)
        return outputs


class BundledModule:
    """A bundled program: the program and its test cases (see :mod:`ptexec.format.bundled`)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        owner = bytearray(data)  # tensors need writable memory, and the bytes must stay
        self._bundled: BundledProgram = read_bundled(owner)
        self._owner = owner
        self._module: ExecuTorchModule | None = None
        self._lock = threading.Lock()

    @property
    def bundled(self) -> BundledProgram:
        """The parsed bundle: its program's bytes and test suites."""
        return self._bundled

    def program_bytes(self) -> memoryview:
        return self._bundled.program_bytes()

    def module(
        self,
        data_file: DataFile = None,
        enable_etdump: bool = False,
        debug_buffer_size: int = 0,
    ) -> ExecuTorchModule:
        """A module running the bundle's program (``data_file``: its ``.ptd``, a path or
        bytes)."""
        program = self.program_bytes()
        ptd = _taken_now(data_file)
        recorder = _recorder(enable_etdump, debug_buffer_size)
        return ExecuTorchModule(lambda: load_source(program, ptd), recorder)

    def case(self, method_name: str, testset_idx: int) -> TestCase:
        suite = self._bundled.suite(method_name)
        if suite is None:
            names = ", ".join(s.method_name for s in self._bundled.suites) or "none"
            raise MethodNotFoundError(
                f"the bundle has no test cases for method '{method_name}' (it has: {names})"
            )
        if not 0 <= testset_idx < len(suite.test_cases):
            raise NotFoundError(
                f"test case {testset_idx} of method '{method_name}' out of range "
                f"({len(suite.test_cases)} test cases)"
            )
        return suite.test_cases[testset_idx]

    def _value(self, v: BundledValue, where: str) -> Any:
        if not isinstance(v, BundledTensor):
            return v
        dtype = scalar_type_dtype(v.scalar_type, where)
        raw = torch.frombuffer(self._bundled.tensor_bytes(v), dtype=torch.uint8).clone()
        flat = raw.view(dtype) if raw.numel() else torch.empty(0, dtype=dtype)
        return flat.as_strided(v.sizes, dim_order_strides(v.sizes, v.dim_order))

    def inputs(self, method_name: str, testset_idx: int) -> list[Any]:
        """The test case's inputs as tensors and scalars (fresh copies)."""
        case = self.case(method_name, testset_idx)
        where = f"'{method_name}' test case {testset_idx}"
        return [self._value(v, f"{where} input {k}") for k, v in enumerate(case.inputs)]

    def expected_outputs(self, method_name: str, testset_idx: int) -> list[Any]:
        case = self.case(method_name, testset_idx)
        where = f"'{method_name}' test case {testset_idx}"
        return [
            self._value(v, f"{where} expected output {k}")
            for k, v in enumerate(case.expected_outputs)
        ]

    def compare(
        self, method_name: str, testset_idx: int, outputs: Sequence[Any], rtol: float, atol: float
    ) -> None:
        """Raise :class:`~ptexec.errors.OutputMismatchError` unless ``outputs`` match the
        test case's expected outputs, as ExecuTorch compares them: float, double and half
        tensors within ``atol + rtol * |output|`` (NaN equal to NaN), every other dtype
        (integers, bools, bfloat16) byte for byte; scalars as numbers."""
        expected = self.expected_outputs(method_name, testset_idx)
        where = f"'{method_name}' test case {testset_idx}"
        if len(outputs) != len(expected):
            raise OutputMismatchError(
                f"{where}: {len(outputs)} output(s), {len(expected)} expected"
            )
        for k, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            why = _mismatch(got, want, rtol, atol)
            if why is not None:
                raise OutputMismatchError(f"{where}: output {k} {why}")

    def _get_module(self) -> ExecuTorchModule:
        with self._lock:
            if self._module is None:
                self._module = self.module()
            return self._module

    def verify_result_with_bundled_expected_output(
        self, method_name: str, testset_idx: int, rtol: float = 1e-5, atol: float = 1e-8
    ) -> list[Any]:
        """Run method ``method_name`` on test case ``testset_idx``'s inputs and compare its
        outputs with the expected ones; returns the outputs."""
        module = self._get_module()
        module.load_bundled_input(self, method_name, testset_idx)
        outputs = module.plan_execute(method_name)
        self.compare(method_name, testset_idx, outputs, rtol, atol)
        return outputs


# the dtypes ExecuTorch's bundled check compares within a tolerance; the others exactly
_TOLERANT = (torch.float32, torch.float64, torch.float16)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _mismatch(got: Any, want: Any, rtol: float, atol: float) -> str | None:
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"is a {type(got).__name__}, a tensor was expected"
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            return (
                f"is {str(got.dtype).removeprefix('torch.')}{list(got.shape)}, expected "
                f"{str(want.dtype).removeprefix('torch.')}{list(want.shape)}"
            )
        a = got.detach().to("cpu")
        if want.dtype not in _TOLERANT:  # ExecuTorch compares every other dtype's bytes
            if _bytes(a).equal(_bytes(want)):
                return None
            name = str(want.dtype).removeprefix("torch.")
            return f"differs from the expected values ({name}: compared exactly)"
        x, y = a.double(), want.double()
        # ExecuTorch's rule: within atol + rtol * |output| (not |expected|), NaN equal NaN;
        # an error that is no finite number (an infinity on either side) is never within,
        # though an infinite output's allowance is infinite too. The difference is taken in
        # the tensor's type, as ExecuTorch takes it (float32's rounds, and may overflow;
        # half's is taken in double there)
        error = ((a - want) if want.dtype == torch.float32 else (x - y)).abs().double()
        within = error.isfinite() & (error <= atol + rtol * x.abs())
        close = (x == y) | (x.isnan() & y.isnan()) | within
        if bool(close.all()):
            return None
        diff = (x - y).abs().nan_to_num(nan=math.inf).max().item()
        return f"differs from the expected values: max abs difference {diff:.3g} (rtol={rtol}, atol={atol})"
    if isinstance(want, float) and isinstance(got, int | float):
        if math.isclose(got, want, rel_tol=rtol, abs_tol=atol) or (
            math.isnan(got) and math.isnan(want)
        ):
            return None
        return f"is {got!r}, expected {want!r}"
    # (the type first: a tensor == a number is a tensor, whose truth torch refuses)
    return None if type(got) is type(want) and got == want else f"is {got!r}, expected {want!r}"


# ---- loaders ---------------------------------------------------------------------------


def _taken_now(data: Any) -> Any:
    """The bytes of a caller's writable buffer as they are now (a module reads its
    program on first use, and the caller may change the buffer before that); of a list
    of data files, each (and the list itself) as it is now."""
    if isinstance(data, list | tuple):
        return [_taken_now(d) for d in data]
    return bytes(data) if isinstance(data, bytearray | memoryview) else data


def _recorder(enable_etdump: bool, debug_buffer_size: int) -> ETDumpRecorder | None:
    check_debug_buffer_size(debug_buffer_size)  # also without ETDump, as ExecuTorch's types do
    return ETDumpRecorder(debug_buffer_size) if enable_etdump else None


def _load_for_executorch(
    program_path: PathLike,
    data_path: PathLike | None = None,
    enable_etdump: bool = False,
    debug_buffer_size: int = 0,
    program_verification: Verification = Verification.InternalConsistency,
) -> ExecuTorchModule:
    """A module for the program at ``program_path`` (and its ``.ptd`` at ``data_path``):
    the files must exist now, as ExecuTorch opens them here; they are read on first use."""
    for path, what in ((program_path, "program file"), (data_path, "data file")):
        if isinstance(path, str | os.PathLike) and not os.path.exists(path):
            raise FileMissingError(errno.ENOENT, f"no such {what}", os.fspath(path))
    ptd = _taken_now(data_path)
    return ExecuTorchModule(
        lambda: load_source(program_path, ptd),
        _recorder(enable_etdump, debug_buffer_size),
    )


def _load_for_executorch_from_buffer(
    buffer: bytes | bytearray | memoryview,
    data_map_buffer: bytes | bytearray | None = None,
    enable_etdump: bool = False,
    debug_buffer_size: int = 0,
    program_verification: Verification = Verification.InternalConsistency,
) -> ExecuTorchModule:
    """A module for the program in ``buffer`` (and its ``.ptd`` bytes), both copied now
    when they are a ``bytearray`` or ``memoryview``: the module reads them on first use,
    and a caller's later changes must not reach it."""
    data, ptd = _taken_now(buffer), _taken_now(data_map_buffer)
    return ExecuTorchModule(
        lambda: load_source(data, ptd), _recorder(enable_etdump, debug_buffer_size)
    )


def _load_for_executorch_from_bundled_program(
    module: BundledModule,
    data_map_buffer: DataFile = None,
    enable_etdump: bool = False,
    debug_buffer_size: int = 0,
    *,
    data_path: PathLike | None = None,
) -> ExecuTorchModule:
    """A module for a bundled program's program; its ``.ptd`` as bytes or a path."""
    return module.module(
        data_path if data_path is not None else data_map_buffer, enable_etdump, debug_buffer_size
    )


def _load_bundled_program_from_buffer(
    buffer: bytes | bytearray | memoryview, non_const_pool_size: int = 16384
) -> BundledModule:
    """Read a bundled program (``non_const_pool_size`` is accepted and unused: ptexec
    plans memory from the program itself)."""
    return BundledModule(buffer)


def _load_program(
    path: PathLike,
    enable_etdump: bool = False,
    debug_buffer_size: int = 0,
    program_verification: Verification = Verification.Minimal,
    data_path: PathLike | None = None,
) -> ExecuTorchProgram:
    """Read and validate the program at ``path`` now."""
    return ExecuTorchProgram(
        load_source(path, data_path), _recorder(enable_etdump, debug_buffer_size)
    )


def _load_program_from_buffer(
    buffer: bytes | bytearray | memoryview,
    enable_etdump: bool = False,
    debug_buffer_size: int = 0,
    program_verification: Verification = Verification.Minimal,
    data_path: PathLike | None = None,
) -> ExecuTorchProgram:
    """Read and validate the program in ``buffer`` now."""
    return ExecuTorchProgram(
        load_source(buffer, data_path), _recorder(enable_etdump, debug_buffer_size)
    )


# ---- the runtime -----------------------------------------------------------------------


def _get_operator_names() -> list[str]:
    """Every operator ptexec runs by name (``ns::op.overload``), ATen's by schema."""
    return operator_names()


def _get_registered_backend_names() -> list[str]:
    return registered_backends()


def _is_available(backend_name: str) -> bool:
    """Registered and able to run here (OpenVINO's needs the openvino package)."""
    return backend_available(backend_name)


def _unsafe_reset_threadpool(num_threads: int) -> None:
    """Set the number of threads the kernels use: :func:`ptexec.set_num_threads` (torch's
    intra-op threads and ExecuTorch's pool, which XNNPACK delegates use). 0 changes
    nothing, as in ExecuTorch."""
    if num_threads == 0 and not isinstance(num_threads, bool):
        return
    set_num_threads(num_threads)


def _threadpool_get_thread_count() -> int:
    """ExecuTorch's pool's thread count, as ExecuTorch's gives it (torch's where
    ExecuTorch is not installed)."""
    pool = executorch_pool(load=True)
    return pool.threads() if pool is not None else get_num_threads()


def _create_profile_block(name: str) -> None:
    """ExecuTorch's legacy profiler; compiled out in its wheel, and absent here."""


def _dump_profile_results() -> bytes:
    """ExecuTorch's legacy profiler's results: empty, as in its wheel."""
    return b""


def _reset_profile_results() -> None:
    """ExecuTorch's legacy profiler; nothing to reset."""
