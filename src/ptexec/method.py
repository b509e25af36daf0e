"""A loaded method: its values, planned memory, prepared instructions, binding and outputs.

Loading does all the work once: planned buffers are allocated on their devices, every
tensor value becomes a torch tensor (constants are views of the file, planned tensors views
of their buffer), every instruction becomes one line of Python, and the lines of each basic
block are compiled into one function. A call validates every input before writing
anything, binds the inputs (share or copy, by :mod:`ptexec.binding`), runs the blocks and
collects the outputs.
"""

from __future__ import annotations

import itertools
import numbers
import sys
import threading
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from . import kernels as _kernels  # noqa: F401  (registers the kernels)
from .accounting import CallRecord
from .binding import Action, Policy, decide, fits_layout, shape_error
from .cuda_graph import CudaGraphRunner, check_capturable
from .dataflow import rewrite_chain
from .delegates import DelegateContext, find_backend
from .device import CPU, Device, DeviceType, schema_device
from .dtypes import CODE_TO_DTYPE, dtype_name
from .errors import (
    BackendUnavailableError,
    DeviceUnavailableError,
    ExecutionError,
    InputError,
    InstructionLimitError,
    LimitExceededError,
    OperatorMissingError,
    PteFormatError,
    PtexecError,
)
from .fastcall import NOT_FAST, build_fast_call
from .format import program as p
from .format.scalar_type import scalar_type_name
from .kernels.registry import Emission, KernelContext, UnsupportedKernel, find_kernel
from .memory import BufferInfo, PlannedBuffer, allocate, fixed_empty, resize_to, strided_view
from .tensor import TensorInfo, describe, dim_order_from_strides, dim_order_strides, to_torch

if TYPE_CHECKING:
    from .profile import Profile
    from .program import Program
    from .trace import Trace

__all__ = [
    "DEFAULT_MAX_INSTRUCTIONS",
    "DEFAULT_MAX_PLANNED_BYTES",
    "Method",
    "MethodMeta",
    "ScalarInfo",
    "plan_meta",
]

DEFAULT_MAX_INSTRUCTIONS = 10_000_000
DEFAULT_MAX_PLANNED_BYTES = 16 << 30  # 16 GiB
FOLD_LIMIT = 16 << 20  # bytes of results a method may precompute at load

OutputMode = Literal["copy", "view"]
# torch's quantized dtypes: a tensor of one needs quantizer parameters a program lacks
_QUANTIZED = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4})
_DYNAMISM = {
    p.STATIC: "static",
    p.DYNAMIC_BOUND: "dynamic_bound",
    p.DYNAMIC_UNBOUND: "dynamic_unbound",
}


@dataclass(frozen=True, slots=True)
class ScalarInfo:
    """A non-tensor input or output: its kind (``int``, ``float``, ``bool``, ``str``,
    ``none``) and the value the program was traced with."""

    kind: str
    value: Any

    @property
    def device(self) -> None:
        return None

    def __str__(self) -> str:
        return f"{self.kind} = {self.value!r}" if self.kind != "none" else "None"


ValueInfo = TensorInfo | ScalarInfo


@dataclass(frozen=True)
class MethodMeta:
    """What a method takes and returns, and its memory plan."""

    name: str
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    buffers: tuple[BufferInfo, ...]
    operators: tuple[str, ...]
    delegates: tuple[str, ...]
    num_instructions: int

    @property
    def planned_bytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def num_inputs(self) -> int:
        return len(self.inputs)

    def num_outputs(self) -> int:
        return len(self.outputs)


# --------------------------------------------------------------------------------------
# device maps


DeviceMapSpec = None | str | torch.device | Device | Mapping[Any, Any]


class DeviceMap:
    """torch's ``map_location`` convention: one target for everything, or ``{from: to}``
    where ``from`` is a device (``"cuda:1"``) or a device type (``"cuda"``)."""

    def __init__(self, spec: DeviceMapSpec) -> None:
        from .device import parse_device

        self.target: Device | None = None
        self.exact: dict[Device, Device] = {}
        self.by_type: dict[DeviceType, Device] = {}
        if spec is None:
            return
        if isinstance(spec, Mapping):
            for key, value in spec.items():
                to = parse_device(value)
                if isinstance(key, str) and key.strip().lower() in ("cpu", "cuda"):
                    if key.strip().lower() == "cpu":
                        self.exact[CPU] = to
                    else:
                        self.by_type[DeviceType.CUDA] = to
                else:
                    self.exact[parse_device(key)] = to
        else:
            self.target = parse_device(spec)

    def __call__(self, device: Device) -> Device:
        if self.target is not None:
            return self.target
        hit = self.exact.get(device)
        if hit is not None:
            return hit
        return self.by_type.get(device.type, device)

    @property
    def is_identity(self) -> bool:
        return self.target is None and not self.exact and not self.by_type


def check_device_available(device: Device, method: str, what: str) -> None:
    """Raise :class:`DeviceUnavailableError` if ``device`` cannot be used here."""
    if device.is_cpu:
        return
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"method '{method}' needs {device} ({what}) but torch has no CUDA device here; "
            f"load it with device_map='cpu' (or {{'{device}': 'cpu'}}) to run it on the CPU"
        )
    count = torch.cuda.device_count()
    if device.index >= count:
        raise DeviceUnavailableError(
            f"method '{method}' needs {device} ({what}) but this machine has {count} CUDA "
            f"device(s); map it with device_map={{'{device}': 'cuda:0'}}"
        )


# --------------------------------------------------------------------------------------
# inputs and outputs


class _Input:
    """How one program input is bound."""

    __slots__ = (
        "device",
        "dim_order",
        "dtype",
        "fast_shape",
        "index",
        "info",
        "kind",
        "scalar",
        "scratch",
        "slot",
        "torch_device",
        "view",
    )

    def __init__(self, index: int, slot: int) -> None:
        self.index = index
        self.slot = slot
        self.kind = "tensor"
        self.info: TensorInfo | None = None
        self.scalar: Any = None
        self.view: torch.Tensor | None = None  # planned view (planned inputs)
        self.scratch: torch.Tensor | None = None  # reused copy target (unplanned, converted)
        self.dtype: torch.dtype | None = None
        self.fast_shape: tuple[int, ...] | None = None  # exact shape for the fast path
        self.torch_device: torch.device | None = None
        self.device: Device = CPU
        self.dim_order: tuple[int, ...] = ()


class _Output:
    __slots__ = ("default", "index", "info", "kind", "planned", "slot")

    def __init__(self, index: int, slot: int) -> None:
        self.index = index
        self.slot = slot
        self.kind = "tensor"
        self.info: ValueInfo | None = None
        self.planned = False
        self.default: torch.Tensor | None = None  # preallocated memory of an unplanned output


def _scalar_kind(value: p.EValue) -> str:
    if isinstance(value, p.Int):
        return "int"
    if isinstance(value, p.Double):
        return "float"
    if isinstance(value, p.Bool):
        return "bool"
    if isinstance(value, p.String):
        return "str"
    if isinstance(value, p.Null):
        return "none"
    return p.evalue_kind(value)


try:  # numpy's bool is not a Python bool (nor an int)
    from numpy import bool_ as _NP_BOOL
except ImportError:  # pragma: no cover
    _NP_BOOL = bool  # type: ignore[misc,assignment]


def _is_numpy(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray | np.generic)


def _truth(x: Any) -> bool:
    """A JumpFalseCall condition: a bool, or a bool tensor that is true when all elements are."""
    if isinstance(x, bool):
        return x
    if isinstance(x, torch.Tensor):
        return bool(x.all()) if x.numel() != 1 else bool(x)
    raise TypeError(f"a jump condition must be a bool or a bool tensor, got {type(x).__name__}")


# --------------------------------------------------------------------------------------
# the method


class Method:
    """A loaded method of a program. Call it, or use :meth:`execute`.

    Options (set at load, each overridable per call): ``transfers`` and ``layout`` (the
    input policy, see :class:`ptexec.binding.Policy`) and ``outputs`` (``"copy"``: fresh
    tensors, the default; ``"view"``: views of the method's memory, valid until the next
    call on this method, from any thread). Load-only options: ``device_map``,
    ``max_planned_bytes``, ``max_instructions``, ``optimize`` (default True: copies that
    are views in eager PyTorch run as views, and work on constants alone runs once at load,
    where :mod:`ptexec.dataflow` proves it safe) and ``xnnpack`` (``"auto"``, ``"torch"``
    or ``"executorch"``: which runner runs XNNPACK payloads, see
    :mod:`ptexec.delegates.xnnpack.backend`).

    Limits: ``max_planned_bytes`` (default :data:`DEFAULT_MAX_PLANNED_BYTES`, 16 GiB): loading
    refuses, before allocating anything, a plan whose buffers (shared state included) add up
    to more, and likewise unplanned tensors of bounded shape, counted on their own against
    the same number (:class:`~ptexec.errors.LimitExceededError`). ``max_instructions``
    (default :data:`DEFAULT_MAX_INSTRUCTIONS`, 10,000,000 as ExecuTorch's runtime): a call
    that executes more stops with :class:`~ptexec.errors.InstructionLimitError`, which is
    both an :class:`~ptexec.errors.ExecutionError` and a ``LimitExceededError``.

    Threads: calls on one Method are serialized by a lock (a method owns one set of planned
    buffers, so two calls cannot run in it at once; a second caller waits). Methods loaded
    separately (``load_method`` again, from any thread) have their own memory and lock and
    run in parallel, except methods that share the program's state buffer
    (``share_mutable_buffers`` programs): those share one lock, as they share the state.
    """

    def __init__(
        self,
        program: Program,
        plan_index: int,
        *,
        device_map: DeviceMapSpec = None,
        transfers: str = "auto",
        layout: str = "strict",
        outputs: OutputMode = "copy",
        max_planned_bytes: int = DEFAULT_MAX_PLANNED_BYTES,
        max_instructions: int = DEFAULT_MAX_INSTRUCTIONS,
        optimize: bool = True,
        cuda_graph: bool = False,
        xnnpack: str = "auto",
    ) -> None:
        if xnnpack not in ("auto", "torch", "executorch"):
            raise ValueError(f"xnnpack must be 'auto', 'torch' or 'executorch', not {xnnpack!r}")
        self._backend_options = {"xnnpack": xnnpack}
        self._program = program
        plan = program.pte.program.execution_plan[plan_index]
        self._plan = plan
        self.name = plan.name
        self._policy = Policy(transfers, layout)  # type: ignore[arg-type]
        if outputs not in ("copy", "view"):
            raise ValueError(f"outputs must be 'copy' or 'view', not {outputs!r}")
        self._output_mode: OutputMode = outputs
        self._max_instructions = max_instructions
        self._device_map = DeviceMap(device_map)
        # methods sharing the program's state buffer share one lock; others run in parallel
        shared = program.shared_buffer_indices & set(range(1, len(plan.non_const_buffer_sizes)))
        self._lock = program.state_lock if shared else threading.Lock()
        self.record = CallRecord(len(plan.inputs), len(plan.outputs))
        _Loader(program, plan, self._device_map, self, max_planned_bytes, optimize).load()
        self._graph: CudaGraphRunner | None = None
        if cuda_graph:
            device = check_capturable(self, plan)
            self._graph = CudaGraphRunner(self, self._run, device)
            self._run = self._graph.run  # type: ignore[method-assign]
        self._fast: Callable[[Sequence[Any]], Any] | None = None
        built = build_fast_call(self, plan) if optimize else None
        if built is not None:
            self._fast, source, lines = built
            self._line_map[source] = (0, lines)
            weakref.finalize(self, _forget_sources, (source,))

    # -- description ---------------------------------------------------------------------
    @property
    def meta(self) -> MethodMeta:
        return self._meta

    @property
    def program(self) -> Program:
        return self._program

    @property
    def last_call(self) -> CallRecord:
        """What the last call did (actions per input, bytes copied by direction)."""
        return self.record

    def __repr__(self) -> str:
        return f"<ptexec.Method '{self.name}': {len(self._inputs)} inputs, {len(self._outputs)} outputs>"

    # -- calling -------------------------------------------------------------------------
    def __call__(self, *inputs: Any, **options: Any) -> list[Any]:
        return self.execute(list(inputs), **options)

    def execute(
        self,
        inputs: Sequence[Any] = (),
        *,
        outputs: OutputMode | None = None,
        out: Sequence[Any] | None = None,
        transfers: str | None = None,
        layout: str | None = None,
    ) -> list[Any]:
        """Run the method on ``inputs`` (a flat sequence) and return its outputs as a list.

        ``out`` gives tensors to receive the outputs (None entries for the others); an
        unplanned output is written straight into the caller's tensor, a planned one is
        copied into it. Every input and ``out`` tensor is checked before anything is
        written: a bad one raises :class:`InputError` (or :class:`UnsupportedDeviceError`)
        and leaves the method's state as it was.
        """
        kind = type(inputs)
        fast = self._fast
        if (
            fast is not None
            and (kind is list or kind is tuple)
            and outputs is None
            and out is None
            and transfers is None
            and layout is None
        ):
            with self._lock:
                try:
                    result = fast(inputs)
                except Exception as e:
                    self._restore()
                    if isinstance(e, PtexecError):
                        raise
                    raise self._execution_error(e) from e
            if result is not NOT_FAST:
                return result  # type: ignore[no-any-return]
        if (
            kind is not list
            and kind is not tuple
            and (isinstance(inputs, torch.Tensor) or not isinstance(inputs, Sequence))
        ):
            inputs = [inputs]  # a single tensor or array counts as one input
        policy = self._policy
        if transfers is not None or layout is not None:
            policy = Policy(transfers or policy.transfers, layout or policy.layout)  # type: ignore[arg-type]
        mode = outputs or self._output_mode
        if mode not in ("copy", "view"):
            raise ValueError(f"outputs must be 'copy' or 'view', not {mode!r}")
        with self._lock, torch.no_grad():  # inference: autograd must not touch the memory
            plan = self._prepare_inputs(inputs, policy)
            out_plan = self._prepare_out(out) if out is not None else None
            self._bind(plan)
            if self._graph is not None:
                self._graph.bind_inputs()  # a graph reads its captured addresses
            elif out_plan is not None:
                self._bind_out(out_plan)
            try:
                self._run()
                return self._collect(mode, out_plan)
            except BaseException:
                self._restore()
                raise
            finally:
                self._release_inputs()
                if out_plan is not None:
                    for spec in self._unplanned_outputs:
                        self._values[spec.slot] = spec.default

    def _restore(self) -> None:
        """After a failed call, give every tensor the method made at load its memory and
        geometry back: a kernel that failed half-way may have left sizes its memory does
        not hold (torch sets them before it grows the storage), which the next read would
        overrun. Data (the state of stateful programs) and the values table are not
        touched."""
        for t, storage, offset, sizes, strides in self._owned:
            t.set_(storage, offset, sizes, strides)

    # -- binding -------------------------------------------------------------------------
    def _where(self, i: int) -> str:
        return f"input {i} of '{self.name}'"

    def _prepare_inputs(
        self, inputs: Sequence[Any], policy: Policy
    ) -> list[tuple[Action | None, Any]]:
        """Validate every input; return (action, tensor-or-value) per input. Writes nothing."""
        specs = self._inputs
        if len(inputs) != len(specs):
            raise InputError(f"'{self.name}' takes {len(specs)} input(s), got {len(inputs)}")
        plan: list[tuple[Action | None, Any]] = []
        default_policy = policy is self._policy or policy == Policy()
        for i, (spec, x) in enumerate(zip(specs, inputs, strict=True)):
            if spec.kind != "tensor":
                self._check_scalar(i, spec, x)
                plan.append((None, x))
                continue
            # fast path: a torch tensor that already matches exactly
            if (
                type(x) is torch.Tensor
                and x.dtype is spec.dtype
                and spec.fast_shape is not None
                and x.shape == spec.fast_shape
                and x.device == spec.torch_device
                and x.layout is torch.strided
            ):
                if spec.view is not None:
                    plan.append((Action.COPY, x))
                    continue
                if (
                    default_policy
                    and spec.dim_order == tuple(range(len(spec.dim_order)))
                    and x.is_contiguous()
                ):
                    plan.append((Action.SHARE, x))
                    continue
            plan.append(self._slow_input(i, spec, x, policy))
        return plan

    def _slow_input(self, i: int, spec: _Input, x: Any, policy: Policy) -> tuple[Action, Any]:
        where = self._where(i)
        assert spec.info is not None
        if x is None or isinstance(x, bool | int | float | str | list | tuple | dict):
            raise InputError(
                f"{where}: expected a tensor {spec.info}, got {type(x).__name__}"
                + (f" {x!r}" if isinstance(x, bool | int | float) else "")
            )
        try:
            t, device = to_torch(x, where)
        except TypeError as e:
            raise InputError(
                f"{where}: expected a tensor {spec.info}, got {type(x).__name__} ({e})"
            ) from None
        except PtexecError:
            raise
        except Exception as e:  # the caller's array failed to hand over its memory
            raise InputError(
                f"{where}: expected a tensor {spec.info}; reading the {type(x).__name__} "
                f"failed: {type(e).__name__}: {e}"
            ) from e
        if t.layout != torch.strided:
            raise InputError(
                f"{where}: expected a dense (strided) tensor {spec.info}, got a "
                f"{str(t.layout).removeprefix('torch.')} tensor"
            )
        if isinstance(x, torch.Tensor) or not _is_numpy(x):
            sizes, strides = tuple(t.shape), tuple(t.stride())
            info = TensorInfo(
                sizes, t.dtype, dim_order_from_strides(sizes, strides), device, strides
            )
        else:  # numpy: judge the caller's own strides (negative ones have no dim order)
            info = describe(x)
        action = decide(spec.info, info, policy, where)
        return action, t

    def _check_scalar(self, i: int, spec: _Input, x: Any) -> None:
        want = spec.scalar
        where = self._where(i)
        kind = spec.kind
        ok: bool
        if kind == "none":
            ok = x is None
        elif kind == "bool":
            ok = isinstance(x, bool | _NP_BOOL) and bool(x) == want
        elif kind == "int":
            ok = (
                isinstance(x, numbers.Integral) and not isinstance(x, bool | _NP_BOOL) and x == want
            )
        elif kind == "float":
            ok = (
                isinstance(x, numbers.Real)
                and not isinstance(x, bool | _NP_BOOL)
                and abs(float(x) - want) <= 1e-4 + 1e-5 * abs(want)
            )
        elif kind == "str":
            ok = isinstance(x, str) and x == want
        else:
            ok = False
        if not ok:
            raise InputError(
                f"{where}: the program was traced with {kind} {want!r} and cannot take another "
                f"value; got {type(x).__name__} {x!r}"
            )

    def _prepare_out(self, out: Sequence[Any]) -> list[torch.Tensor | None]:
        outs = self._outputs
        if len(out) != len(outs):
            raise InputError(f"'{self.name}' has {len(outs)} output(s), out= gives {len(out)}")
        result: list[torch.Tensor | None] = []
        for k, (spec, t) in enumerate(zip(outs, out, strict=True)):
            if t is None:
                result.append(None)
                continue
            where = f"out[{k}] of '{self.name}'"
            info = spec.info
            if spec.kind != "tensor" or not isinstance(info, TensorInfo):
                raise InputError(f"{where}: output {k} is a {spec.kind}, not a tensor")
            if not isinstance(t, torch.Tensor):
                raise InputError(f"{where}: expected a torch tensor, got {type(t).__name__}")
            got_dev = to_torch(t, where)[1]
            got = TensorInfo(tuple(t.shape), t.dtype, None, got_dev, tuple(t.stride()))
            if t.dtype != info.dtype:
                raise InputError(
                    f"{where}: expected {info}, got {dtype_name(t.dtype)} tensor (dtype)"
                )
            if got_dev != info.device:
                raise InputError(
                    f"{where}: expected a tensor on {info.device} (the output's device), got {got_dev}"
                )
            if info.dynamism == "static":
                problem = shape_error(info, got.sizes)
                if problem is not None:
                    raise InputError(
                        f"{where}: expected {info}, got shape {list(got.sizes)} ({problem})"
                    )
            elif len(got.sizes) != len(info.sizes):
                raise InputError(f"{where}: expected rank {len(info.sizes)}, got {list(got.sizes)}")
            if not spec.planned and info.dynamism == "static" and not fits_layout(info, got):
                raise InputError(
                    f"{where}: the method writes this output in place, so it must be laid out "
                    f"{info.layout}"
                )
            result.append(t)
        return result

    def _bind(self, plan: list[tuple[Action | None, Any]]) -> None:
        v = self._values
        rec = self.record
        rec.reset()
        actions = rec.inputs
        for spec, (action, x) in zip(self._inputs, plan, strict=True):
            if action is None:
                actions[spec.index] = "value"
                continue
            actions[spec.index] = action.value
            if action is Action.SHARE:
                # an alias of the caller's memory: what the program does to the tensor's
                # sizes (an out= resize) stays with the alias, not the caller's tensor
                v[spec.slot] = x.detach()
            elif action is Action.COPY or action is Action.TRANSFER:
                view = spec.view
                assert view is not None
                if view.shape != x.shape:
                    resize_to(view, x.shape, spec.dim_order)
                view.copy_(x)
                rec.count(x, view, x.nbytes)
                v[spec.slot] = view
            elif action is Action.EMPTY:
                target = spec.view
                if target is None:
                    target = torch.empty_strided(
                        x.shape,
                        dim_order_strides(x.shape, spec.dim_order),
                        dtype=spec.dtype,
                        device=spec.torch_device,
                    )
                elif target.shape != x.shape:
                    resize_to(target, x.shape, spec.dim_order)
                v[spec.slot] = target
            else:  # CONVERT or MOVE into a reused scratch tensor in the program's layout
                scratch = spec.scratch
                if scratch is None or scratch.shape != x.shape:
                    scratch = torch.empty_strided(
                        x.shape,
                        dim_order_strides(x.shape, spec.dim_order),
                        dtype=spec.dtype,
                        device=spec.torch_device,
                    )
                    spec.scratch = scratch
                scratch.copy_(x)
                rec.count(x, scratch, x.nbytes)
                v[spec.slot] = scratch

    def _release_inputs(self) -> None:
        v = self._values
        for slot in self._shared_slots:
            v[slot] = None

    # -- running -------------------------------------------------------------------------
    def _run(self) -> None:
        v = self._values
        limit = self._max_instructions
        count = 0
        try:
            for c, (blocks, sizes) in enumerate(self._chains):
                b = 0
                while b >= 0:
                    count += sizes[b]
                    if count > limit:
                        i = sum(sizes[:b]) if self._instruction_names[c] else -1
                        raise InstructionLimitError(
                            self.name,
                            i,
                            self._instruction_names[c][i] if i >= 0 else "?",
                            f"executed more than {limit} instructions; stopped (a malformed "
                            "jump may loop forever)",
                        )
                    b = blocks[b](v)
        except PtexecError as e:
            if isinstance(e, LimitExceededError | ExecutionError):
                raise
            raise self._execution_error(e) from e
        except Exception as e:
            raise self._execution_error(e) from e

    def _execution_error(self, e: BaseException) -> ExecutionError:
        index = self._failed_instruction(e.__traceback__)
        if index is None:
            return ExecutionError(self.name, -1, "?", f"{type(e).__name__}: {e}")
        chain, i = index
        name = self._instruction_names[chain][i]
        frame = self._frame(chain, i)
        return ExecutionError(self.name, i, name, f"{type(e).__name__}: {e}", frame)

    def _failed_instruction(self, tb: types.TracebackType | None) -> tuple[int, int] | None:
        found = None
        while tb is not None:
            code = tb.tb_frame.f_code
            where = self._line_map.get(code.co_filename)
            if where is not None:
                chain, lines = where
                idx = lines.get(tb.tb_lineno)
                if idx is not None:
                    found = (chain, idx)
            tb = tb.tb_next
        return found

    def _frame(self, chain: int, index: int) -> str | None:
        trace = self._plan.chains[chain].stacktrace
        if not trace or index >= len(trace) or not trace[index]:
            return None
        frames = trace[index]
        assert frames is not None
        return "\n".join(str(f) for f in frames)  # outermost call first, as Python prints

    # -- outputs -------------------------------------------------------------------------
    def _output_error(self, index: int) -> ExecutionError | None:
        """Why output ``index`` as execution left it contradicts the program's declaration
        (not a tensor; another dtype or rank; other sizes than static ones, or beyond a
        bound): a kernel or delegate wrote what the program does not declare."""
        spec = self._outputs[index]
        x = self._values[spec.slot]
        info = spec.info
        if not isinstance(x, torch.Tensor):
            why = f"execution left a {type(x).__name__} there"
        elif not isinstance(info, TensorInfo):
            return None
        elif x.dtype != info.dtype:
            why = f"execution left a {str(x.dtype).removeprefix('torch.')} tensor there"
        else:
            problem = shape_error(info, tuple(x.shape))
            if problem is None:
                return None
            why = f"execution left sizes {list(x.shape)} ({problem})"
        declared = (
            f"{str(info.dtype).removeprefix('torch.')}{list(info.sizes)} ({info.dynamism})"
            if isinstance(info, TensorInfo)
            else "a tensor"
        )
        return ExecutionError(
            self.name,
            -1,
            "output",
            f"output {index} (value {spec.slot}) is {declared} in the program, but {why}",
        )

    def _collect(self, mode: OutputMode, out: list[torch.Tensor | None] | None) -> list[Any]:
        v = self._values
        for spec in self._outputs:
            if spec.kind == "tensor":
                error = self._output_error(spec.index)
                if error is not None:
                    raise error
        results: list[Any] = []
        for spec in self._outputs:
            x = v[spec.slot]
            if spec.kind != "tensor":
                results.append(x)
                continue
            given = out[spec.index] if out is not None else None
            if given is not None:
                if x is not given:
                    if given.shape != x.shape:
                        given.resize_(x.shape)
                    given.copy_(x)
                    self.record.count(x, given, x.nbytes)
                results.append(given)
            elif mode == "copy":
                results.append(x.clone())
            else:
                results.append(x)
        return results

    def _bind_out(self, out: list[torch.Tensor | None]) -> None:
        """Unplanned outputs are written straight into the caller's tensors."""
        v = self._values
        actions = self.record.outputs
        for spec in self._outputs:
            given = out[spec.index]
            if given is None:
                actions[spec.index] = ""
            elif spec.planned:
                actions[spec.index] = "copy"
            else:
                v[spec.slot] = given
                actions[spec.index] = "direct"

    # -- state (for tools) ---------------------------------------------------------------
    def values(self) -> list[Any]:
        """The method's values table (tensors, scalars), for inspection; do not modify."""
        return self._values

    def trace(self, inputs: Sequence[Any] = (), **options: Any) -> Trace:
        """Run the method once, instruction by instruction, and record what each one wrote;
        options as :func:`ptexec.trace.trace` (``tensors``, ``reference``, ``stop_on``, ...)."""
        from .trace import trace

        return trace(self, inputs, **options)

    def profile(self, inputs: Sequence[Any] = (), **options: Any) -> Profile:
        """Time every instruction over repeated calls; options as
        :func:`ptexec.profile.profile` (``repeat``, ``warmup``, ``sync``, ...)."""
        from .profile import profile

        return profile(self, inputs, **options)

    def _call_with(
        self,
        inputs: Sequence[Any],
        runner: Callable[[list[Any]], None],
        *,
        transfers: str | None = None,
        layout: str | None = None,
        phase: Callable[[str], None] | None = None,
    ) -> list[Any]:
        """A call as :meth:`execute` makes it (same validation, binding and outputs, as
        copies), with ``runner(values)`` in place of the compiled blocks. ``phase(name)``
        is told when ``"bind"``, ``"run"``, ``"collect"`` and ``"end"`` begin."""
        if isinstance(inputs, torch.Tensor) or not isinstance(inputs, Sequence):
            inputs = [inputs]
        policy = self._policy
        if transfers is not None or layout is not None:
            policy = Policy(transfers or policy.transfers, layout or policy.layout)  # type: ignore[arg-type]
        with self._lock:
            plan = self._prepare_inputs(inputs, policy)
            if phase is not None:
                phase("bind")
            self._bind(plan)
            try:
                if phase is not None:
                    phase("run")
                runner(self._values)
                if phase is not None:
                    phase("collect")
                results = self._collect("copy", None)
                if phase is not None:
                    phase("end")
                return results
            finally:
                self._release_inputs()

    # attributes filled by the loader
    _meta: MethodMeta
    _values: list[Any]
    _owned: list[tuple[torch.Tensor, Any, int, tuple[int, ...], tuple[int, ...]]]
    _inputs: list[_Input]
    _outputs: list[_Output]
    _unplanned_outputs: list[_Output]
    _shared_slots: list[int]
    _chains: list[tuple[list[Callable[[list[Any]], int]], list[int]]]
    _line_map: dict[str, tuple[int, dict[int, int]]]
    _instruction_names: list[list[str]]
    _buffers: list[PlannedBuffer]
    _statements: list[list[Emission]]
    _dynamic_scalars: frozenset[int]
    _loaded_statements: list[list[Emission]]  # as the kernels made them, before rewrites


# --------------------------------------------------------------------------------------
# loading


class _Loader:
    """Builds a :class:`Method`'s state from its execution plan (runs once, at load)."""

    def __init__(
        self,
        program: Program,
        plan: p.ExecutionPlan,
        dmap: DeviceMap,
        method: Method | None = None,
        max_planned_bytes: int = DEFAULT_MAX_PLANNED_BYTES,
        optimize: bool = True,
    ) -> None:
        self._method = method
        self.optimize = optimize
        self.fold_limit = FOLD_LIMIT
        self.plan = plan
        self.max_planned_bytes = max_planned_bytes
        self.program = program
        self.pte = program.pte
        self.dmap = dmap
        self.path = f"execution_plan[{program.pte.program.execution_plan.index(plan)}]"

    @property
    def m(self) -> Method:
        assert self._method is not None, "loading needs a Method"
        return self._method

    def meta(self) -> MethodMeta:
        """The method's description, computed from the plan alone (nothing allocated)."""
        plan = self.plan
        inputs: list[ValueInfo] = []
        for slot in plan.inputs:
            value = plan.values[slot]
            if isinstance(value, p.Tensor):
                inputs.append(self._tensor_info(value))
            else:
                inputs.append(ScalarInfo(_scalar_kind(value), getattr(value, "value", None)))
        outputs: list[ValueInfo] = []
        for slot in plan.outputs:
            value = plan.values[slot]
            if isinstance(value, p.Tensor):
                outputs.append(self._tensor_info(value))
            else:
                outputs.append(ScalarInfo(_scalar_kind(value), getattr(value, "value", None)))
        return MethodMeta(
            name=plan.name,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            buffers=tuple(self._buffer_infos()),
            operators=tuple(op.qualified_name for op in plan.operators),
            delegates=tuple(d.id for d in plan.delegates),
            num_instructions=sum(len(c.instructions) for c in plan.chains),
        )

    # -- devices and buffers -------------------------------------------------------------
    def _label(self, t: p.Tensor) -> Device:
        return self.dmap(schema_device(*t.device))

    def _buffer_infos(self) -> list[BufferInfo]:
        plan = self.plan
        sizes = plan.non_const_buffer_sizes
        listed = {e.buffer_idx for e in plan.non_const_buffer_device or ()}
        labels: dict[int, set[Device]] = {}
        for _j, value in enumerate(plan.values):
            if isinstance(value, p.Tensor) and value.allocation_info is not None:
                labels.setdefault(value.allocation_info.memory_id, set()).add(self._label(value))
        shared = self.program.shared_buffer_indices
        infos = []
        for idx in range(1, len(sizes)):
            device = self.dmap(schema_device(*plan.buffer_device(idx)))
            source = "program" if self.dmap.is_identity else "device_map"
            seen = labels.get(idx, set())
            if idx not in listed and len(seen) == 1:
                (only,) = seen
                if only != device:
                    device, source = only, "tensors"
            if len(seen) > 1 or (seen and device not in seen):
                raise PteFormatError(
                    f"{self.path}.non_const_buffer_sizes[{idx}]",
                    f"buffer {idx} is on {device} but its tensors name "
                    + ", ".join(sorted(str(d) for d in seen)),
                )
            infos.append(BufferInfo(idx, sizes[idx], device, source, idx in shared))
        return infos

    def _allocate(self, infos: list[BufferInfo]) -> tuple[list[PlannedBuffer], set[int]]:
        total = sum(i.size for i in infos)  # shared state counts too: it may be new
        if total > self.max_planned_bytes:
            raise LimitExceededError(
                f"method '{self.m.name}' plans {total} bytes, over max_planned_bytes="
                f"{self.max_planned_bytes}; pass a larger max_planned_bytes to load it"
            )
        for info in infos:
            check_device_available(
                info.device, self.m.name, f"planned buffer {info.index}, {info.size} bytes"
            )
        buffers = []
        fresh: set[int] = set()
        for info in infos:
            if info.shared:
                buf, new = self.program.shared_buffer(info)
                if new:
                    fresh.add(info.index)
            else:
                buf = allocate(info)
                fresh.add(info.index)
            buffers.append(buf)
        return buffers, fresh

    # -- values --------------------------------------------------------------------------
    def _constant(self, t: p.Tensor, path: str) -> torch.Tensor:
        dtype = self._dtype(t, path)
        if t.is_external:
            data = self.program.external_bytes(t, path)
        else:
            data = self.pte.constant(t.data_buffer_idx, t.nbytes)
        return self._from_bytes(data, t, dtype, path)

    def _from_bytes(
        self, data: memoryview, t: p.Tensor, dtype: torch.dtype, path: str
    ) -> torch.Tensor:
        strides = dim_order_strides(t.sizes, t.dim_order)
        if t.nbytes == 0:
            return torch.empty_strided(t.sizes, strides, dtype=dtype)
        raw = self.program.tensor_from_memory(data)
        if raw.data_ptr() % dtype.itemsize:
            raw = raw.clone()  # misaligned in the file: one copy, rather than a bad view
        return raw.view(dtype).as_strided(t.sizes, strides)

    def _dtype(self, t: p.Tensor, path: str) -> torch.dtype:
        dtype = CODE_TO_DTYPE.get(t.scalar_type)
        if dtype is None:
            raise PteFormatError(
                f"{path}.scalar_type", f"{scalar_type_name(t.scalar_type)} has no torch dtype"
            )
        if dtype in _QUANTIZED:
            raise PteFormatError(
                f"{path}.scalar_type",
                f"{scalar_type_name(t.scalar_type)} is a quantized type whose scale and zero "
                "point a program does not carry; ptexec does not run such tensors",
            )
        return dtype

    def load(self) -> None:
        m = self.m
        plan = self.plan
        infos = self._buffer_infos()
        buffers, fresh = self._allocate(infos)
        m._buffers = buffers
        by_id = {b.info.index: b for b in buffers}
        input_slots = set(plan.inputs)
        output_slots = set(plan.outputs)
        values: list[Any] = []
        unplanned_bytes = 0
        for j, value in enumerate(plan.values):
            path = f"{self.path}.values[{j}]"
            if isinstance(value, p.Tensor):
                tpath = f"{path}.tensor"
                dtype = self._dtype(value, tpath)
                device = self._label(value)
                alloc = value.allocation_info
                if alloc is not None:
                    buf = by_id[alloc.memory_id]
                    view = strided_view(
                        buf.data,
                        alloc.memory_offset,
                        dtype,
                        value.sizes,
                        value.dim_order,
                        f"{tpath}.allocation_info",
                    )
                    if alloc.memory_id in fresh:
                        if value.is_external:
                            init = self.program.external_bytes(value, tpath)
                            view.copy_(self._from_bytes(init, value, dtype, tpath))
                        elif value.data_buffer_idx > 0:
                            init = self.pte.mutable_initial_value(
                                value.data_buffer_idx, value.nbytes
                            )
                            view.copy_(self._from_bytes(init, value, dtype, tpath))
                    values.append(view)
                elif value.is_constant:
                    const = self._constant(value, tpath)
                    if not device.is_cpu:
                        check_device_available(device, m.name, f"constant {j}")
                        const = const.to(device.to_torch())
                    values.append(const)
                elif j in input_slots:
                    values.append(None)
                else:
                    # unplanned, not an input: the runtime provides memory on its device
                    check_device_available(device, m.name, f"unplanned tensor {j}")
                    if value.shape_dynamism == p.DYNAMIC_UNBOUND:
                        sizes = tuple(0 for _ in value.sizes)
                    else:
                        sizes = value.sizes
                        unplanned_bytes += value.nbytes
                    if unplanned_bytes > self.max_planned_bytes:
                        raise LimitExceededError(
                            f"method '{m.name}' needs more than max_planned_bytes="
                            f"{self.max_planned_bytes} for its unplanned tensors"
                        )
                    # bounded shapes get memory that cannot grow; unbound ones must grow
                    empty = (
                        torch.empty_strided
                        if value.shape_dynamism == p.DYNAMIC_UNBOUND
                        else fixed_empty
                    )
                    values.append(
                        empty(
                            sizes,
                            dim_order_strides(sizes, value.dim_order),
                            dtype=dtype,
                            device=device.to_torch(),
                        )
                    )
            elif isinstance(value, p.Null):
                values.append(None)
            elif isinstance(value, p.Int | p.Bool | p.Double | p.String):
                values.append(value.value)
            elif isinstance(value, p.DoubleList | p.BoolList):
                values.append(value.items)
            else:  # IntList, TensorList, OptionalTensorList: rendered per use
                values.append(None)
        for j, value in enumerate(plan.values):
            if isinstance(value, p.IntList):
                values[j] = tuple(values[i] for i in value.items)
        m._values = values
        self._io(values, input_slots, output_slots)
        self._compile(values)  # may fold work on constants into values
        m._owned = [
            (t, t.untyped_storage(), int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))
            for t in values
            if isinstance(t, torch.Tensor)
        ]
        m._meta = self.meta()

    def _tensor_info(self, t: p.Tensor) -> TensorInfo:
        dtype = CODE_TO_DTYPE[t.scalar_type]
        return TensorInfo(
            sizes=t.sizes,
            dtype=dtype,
            dim_order=t.dim_order,
            device=self._label(t),
            strides=dim_order_strides(t.sizes, t.dim_order),
            is_memory_planned=t.is_memory_planned,
            dynamism=_DYNAMISM[t.shape_dynamism],
        )

    def _io(self, values: list[Any], input_slots: set[int], output_slots: set[int]) -> None:
        m = self.m
        plan = self.plan
        inputs = []
        shared_slots = []
        for i, slot in enumerate(plan.inputs):
            value = plan.values[slot]
            spec = _Input(i, slot)
            if isinstance(value, p.Tensor):
                info = self._tensor_info(value)
                spec.info = info
                spec.dtype = info.dtype
                spec.device = info.device
                spec.torch_device = info.device.to_torch()
                spec.dim_order = value.dim_order
                # the fast path binds exact static shapes with elements (EMPTY goes the slow way)
                spec.fast_shape = (
                    value.sizes if value.shape_dynamism == p.STATIC and value.numel else None
                )
                if value.allocation_info is not None:
                    spec.view = values[slot]
                elif value.is_constant:
                    raise PteFormatError(
                        f"{self.path}.inputs[{i}]", f"input {i} (value {slot}) is a constant"
                    )
                else:
                    shared_slots.append(slot)
            else:
                spec.kind = _scalar_kind(value)
                if spec.kind not in ("int", "float", "bool", "str", "none"):
                    raise PteFormatError(
                        f"{self.path}.inputs[{i}]", f"an input of kind {spec.kind} is not supported"
                    )
                spec.scalar = values[slot]
            inputs.append(spec)
        outputs = []
        unplanned = []
        for k, slot in enumerate(plan.outputs):
            value = plan.values[slot]
            spec_o = _Output(k, slot)
            if isinstance(value, p.Tensor):
                spec_o.info = self._tensor_info(value)
                spec_o.planned = value.is_memory_planned or slot in input_slots
                if not spec_o.planned:
                    spec_o.default = values[slot]
                    unplanned.append(spec_o)
            else:
                spec_o.kind = _scalar_kind(value)
                spec_o.info = ScalarInfo(
                    spec_o.kind, values[slot] if not isinstance(value, p.IntList) else None
                )
            outputs.append(spec_o)
        m._inputs = inputs
        m._outputs = outputs
        m._unplanned_outputs = unplanned
        m._shared_slots = shared_slots

    # -- instructions --------------------------------------------------------------------
    def _dynamic_scalars(self) -> frozenset[int]:
        """Scalar values that an instruction may replace (so they are read at run time)."""
        dyn: set[int] = set()
        for chain in self.plan.chains:
            for ins in chain.instructions:
                if isinstance(ins, p.KernelCall) and ins.args:
                    dyn.add(ins.args[-1])
                elif isinstance(ins, p.MoveCall):
                    dyn.add(ins.move_to)
                elif isinstance(ins, p.DelegateCall):
                    dyn.update(ins.args)
        scalars = (p.Int, p.Double, p.Bool, p.Null, p.String)
        return frozenset(i for i in dyn if isinstance(self.plan.values[i], scalars))

    def _compile(self, values: list[Any]) -> None:
        m = self.m
        plan = self.plan
        dynamic = self._dynamic_scalars()
        m._dynamic_scalars = dynamic
        missing: list[str] = []
        chains = []
        names_all: list[list[str]] = []
        statements_all: list[list[Emission]] = []
        loaded_all: list[list[Emission]] = []
        line_map: dict[str, tuple[int, dict[int, int]]] = {}
        for c, chain in enumerate(plan.chains):
            statements: list[Emission] = []
            names: list[str] = []
            for i, ins in enumerate(chain.instructions):
                name, emission = self._prepare(ins, i, c, values, dynamic, missing)
                names.append(name)
                statements.append(emission)
            loaded_all.append(statements)
            if not missing and self.optimize:
                statements = rewrite_chain(plan, chain, statements, names, values, self.fold_limit)
            names_all.append(names)
            statements_all.append(statements)
            if not missing:
                chains.append(self._blocks(c, chain, statements, line_map))
        if missing:
            raise OperatorMissingError(m.name, sorted(set(missing), key=missing.index))
        m._chains = chains
        m._line_map = line_map
        weakref.finalize(m, _forget_sources, tuple(line_map))  # their names are unique
        m._instruction_names = names_all
        m._statements = statements_all
        m._loaded_statements = loaded_all

    def _prepare(
        self,
        ins: p.Instruction,
        i: int,
        c: int,
        values: list[Any],
        dynamic: frozenset[int],
        missing: list[str],
    ) -> tuple[str, Emission]:
        plan = self.plan
        if isinstance(ins, p.KernelCall):
            op = plan.operators[ins.op_index]
            name = op.qualified_name
            factory = find_kernel(name)
            if factory is None:
                missing.append(name)
                return name, Emission("pass")
            where = f"{self.path}.chains[{c}].instructions[{i}]"
            ctx = KernelContext(name, i, ins.args, plan.values, dynamic, values, self.m, where)
            try:
                return name, factory(ctx)
            except UnsupportedKernel as e:
                missing.append(f"{name} ({e})")
                return name, Emission("pass")
        if isinstance(ins, p.DelegateCall):
            delegate = plan.delegates[ins.delegate_index]
            backend = find_backend(delegate.id)
            if backend is None:
                from .delegates import registered_backends

                raise BackendUnavailableError(
                    f"method '{plan.name}' delegates to backend '{delegate.id}', which ptexec "
                    f"cannot run (available: {', '.join(registered_backends()) or 'none'})"
                )
            dctx = DelegateContext(
                delegate.id,
                ins.delegate_index,
                self.pte.delegate_data(delegate.processed),
                delegate.compile_specs,
                self.program.named_data,
                self.m._backend_options,
                instruction=i,
                args=ins.args,
                values=plan.values,
                dynamic=dynamic,
                initial=values,
                method=self.m,
            )
            try:
                return f"delegate:{delegate.id}", backend(dctx)
            except UnsupportedKernel as e:
                raise BackendUnavailableError(f"backend '{delegate.id}': {e}") from None
        if isinstance(ins, p.MoveCall):
            return "move", Emission(
                f"v[{ins.move_to}] = v[{ins.move_from}]", writes=(ins.move_to,), mutates=()
            )
        if isinstance(ins, p.FreeCall):
            value = plan.values[ins.value_index]
            if isinstance(value, p.Tensor) and (
                value.allocation_info is not None or value.is_constant
            ):
                # the plan's (or the file's) memory is not the method's to free
                return "free", Emission("pass", mutates=())
            return "free", Emission(f"v[{ins.value_index}].set_()", mutates=(ins.value_index,))
        if isinstance(ins, p.JumpFalseCall):
            cond = ins.cond_value_index
            value = plan.values[cond]
            if isinstance(value, p.Bool) and cond not in dynamic:
                expr = repr(bool(value.value))
            elif (
                isinstance(value, p.Tensor)
                and value.numel == 1
                and value.shape_dynamism == p.STATIC
            ):
                expr = f"bool(v[{cond}])"  # one element: true when it is
            else:
                expr = f"_truth(v[{cond}])"
            return "jump_false", Emission(expr, {"_truth": _truth}, mutates=())
        raise PteFormatError(f"{self.path}.chains[{c}].instructions[{i}]", "unknown instruction")

    def _blocks(
        self,
        c: int,
        chain: p.Chain,
        statements: list[Emission],
        line_map: dict[str, tuple[int, dict[int, int]]],
    ) -> tuple[list[Callable[[list[Any]], int]], list[int]]:
        """Compile the chain's basic blocks, one function each; a block returns the index
        of the next block, or -1 at the end of the chain."""
        ins = chain.instructions
        n = len(ins)
        leaders = {0}
        for i, x in enumerate(ins):
            if isinstance(x, p.JumpFalseCall):
                leaders.add(x.destination_instruction)
                leaders.add(i + 1)
        starts = sorted(s for s in leaders if s < n) or [0]
        block_of = {s: k for k, s in enumerate(starts)}
        funcs: list[Callable[[list[Any]], int]] = []
        sizes: list[int] = []
        for k, start in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else n
            label = self.m.name.replace("\0", "\\x00")  # compile() refuses a NUL in a file name
            filename = f"<ptexec #{next(_SOURCES)} {label} chain {c} block {k}>"
            lines = ["def _block(v):"]
            env: dict[str, Any] = {}
            lineno: dict[int, int] = {}
            nxt = block_of.get(end, -1) if end < n else -1
            tail = f"    return {nxt}"
            for i in range(start, end):
                st = statements[i]
                env.update(st.env)
                if isinstance(ins[i], p.JumpFalseCall):
                    dest = ins[i].destination_instruction  # type: ignore[union-attr]
                    target = block_of.get(dest, -1) if dest < n else -1
                    lineno[len(lines) + 1] = i
                    tail = f"    return {nxt} if {st.code} else {target}"
                    lines.append(tail)
                    tail = ""
                else:
                    for part in st.code.splitlines():
                        lineno[len(lines) + 1] = i
                        lines.append("    " + part)
            if tail:
                lines.append(tail)
            source = "\n".join(lines) + "\n"
            code = compile(source, filename, "exec")
            namespace: dict[str, Any] = dict(env)
            exec(code, namespace)
            funcs.append(namespace["_block"])
            sizes.append(max(end - start, 1))
            line_map[filename] = (c, lineno)
            _register_source(filename, source)
        if not funcs:
            funcs.append(lambda v: -1)
            sizes.append(1)
        return funcs, sizes


def plan_meta(
    program: Program, plan: p.ExecutionPlan, device_map: DeviceMapSpec = None
) -> MethodMeta:
    """A method's :class:`MethodMeta` without loading it (no memory is allocated)."""
    return _Loader(program, plan, DeviceMap(device_map)).meta()


_SOURCES = itertools.count()  # a unique name per compiled block, for tracebacks


def _forget_sources(filenames: tuple[str, ...]) -> None:
    """Drop a freed method's generated source from the traceback cache."""
    import linecache

    for name in filenames:
        linecache.cache.pop(name, None)


def _register_source(filename: str, source: str) -> None:
    """Make generated code show in tracebacks."""
    import linecache

    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
