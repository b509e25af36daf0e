"""Run one OpenVINO payload: import it with OpenVINO, check it against the program, call it.

At load, the payload is imported on the device its compile spec names (``device``, as
ExecuTorch's exporter writes it; the CPU when absent) with ptexec's thread count, and the
compiled model's inputs and outputs are checked against the delegate call's tensors: their
number, element types, ranks and static dims. A contradiction is a
:class:`~ptexec.errors.PteFormatError`; a device, element type or layout ptexec cannot
exchange with OpenVINO is a :class:`~ptexec.errors.BackendUnavailableError`.

At a call, each argument is handed to OpenVINO as a view of its memory: inputs are read
in place, and outputs of static shape are written in place. An output whose shape depends
on the inputs is written by OpenVINO into its own memory and copied (resized first) into the
program's tensor. OpenVINO runs host memory here: a delegate whose tensors live on another
device is refused at load.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import torch

from ...errors import BackendUnavailableError, PteFormatError
from ...format import program as p
from ...kernels.registry import Statement
from ..registry import DelegateContext
from .blob import blob_info

__all__ = ["OpenvinoCall", "prepare"]

# OpenVINO element type name -> torch dtype (the types ExecuTorch's scalar types meet)
_TYPES: dict[str, torch.dtype] = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f64": torch.float64,
    "i8": torch.int8,
    "u8": torch.uint8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "boolean": torch.bool,
}

_CORE: list[Any] = []  # one OpenVINO Core per process, made on first use


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as e:
        raise BackendUnavailableError(
            "OpenvinoBackend needs the openvino package: pip install 'ptexec[openvino]'"
        ) from e
    return openvino


def _core(ov: Any) -> Any:
    if not _CORE:
        _CORE.append(ov.Core())
    return _CORE[0]


def _where(ctx: DelegateContext) -> str:
    method = ctx.method_name.replace("\0", "\\x00")
    return (
        f"{method}.delegates[{ctx.delegate_index}]"
        if method
        else f"delegates[{ctx.delegate_index}]"
    )


def _device_name(ctx: DelegateContext, where: str) -> str:
    raw = ctx.compile_spec("device")
    if raw is None:
        return "CPU"
    try:
        name = raw.decode("ascii").strip().rstrip("\0")
    except UnicodeDecodeError:
        raise PteFormatError(f"{where}.compile_specs", f"device {raw[:40]!r} is not text") from None
    if not name or not all(c.isalnum() or c in ".:_-," for c in name):
        raise PteFormatError(f"{where}.compile_specs", f"device {name[:40]!r} is not a device name")
    return name


def _import(ov: Any, ctx: DelegateContext, device: str, where: str) -> Any:
    core = _core(ov)
    available = list(core.available_devices)
    if device.split(".")[0].split(":")[0] not in {d.split(".")[0] for d in available}:
        raise BackendUnavailableError(
            f"{where}: the payload was compiled for OpenVINO device {device}; this machine "
            f"has {', '.join(available) or 'none'}"
        )
    config: dict[str, Any] = {}
    if device.startswith("CPU"):
        config["INFERENCE_NUM_THREADS"] = int(torch.get_num_threads())
    try:
        return core.import_model(io.BytesIO(bytes(ctx.processed)), device, config)
    except Exception as e:  # OpenVINO's refusals are RuntimeErrors (or worse: decode errors)
        made = blob_info(ctx.processed)
        origin = ""
        if made.openvino_version:
            origin = f" (made by OpenVINO {made.openvino_version}"
            origin += f" for {made.isa})" if made.isa else ")"
        reason = str(e).strip().splitlines()
        detail = reason[-1] if reason else type(e).__name__
        raise BackendUnavailableError(
            f"{where}: OpenVINO {ov.get_version()} cannot import the payload{origin}: {detail}"
        ) from e


def _describe(t: p.Tensor) -> str:
    from ...dtypes import CODE_TO_DTYPE

    dtype = CODE_TO_DTYPE.get(t.scalar_type)
    name = str(dtype).removeprefix("torch.") if dtype is not None else f"type {t.scalar_type}"
    return f"{name}{list(t.sizes)}"


def _check_port(port: Any, t: p.Tensor, what: str, where: str) -> torch.dtype:
    """The port's dtype, after checking it against the program's tensor ``t``."""
    from ...dtypes import CODE_TO_DTYPE

    type_name = port.get_element_type().get_type_name()
    dtype = _TYPES.get(type_name)
    if dtype is None:
        raise BackendUnavailableError(f"{where}: {what} has OpenVINO element type {type_name}")
    if CODE_TO_DTYPE.get(t.scalar_type) != dtype:
        raise PteFormatError(
            where, f"{what} is {type_name} in the payload; the program's tensor is {_describe(t)}"
        )
    shape = port.get_partial_shape()
    rank = len(t.sizes)
    if shape.rank.is_static and shape.rank.get_length() != rank:
        raise PteFormatError(
            where,
            f"{what} has {shape.rank.get_length()} dims in the payload; the program's tensor "
            f"is {_describe(t)}",
        )
    if shape.rank.is_static and t.shape_dynamism == p.STATIC:
        for k, dim in enumerate(shape):
            if dim.is_static and dim.get_length() != t.sizes[k]:
                raise PteFormatError(
                    where,
                    f"{what} has shape {shape} in the payload; the program's tensor is "
                    f"{_describe(t)}",
                )
    if list(t.dim_order) != sorted(t.dim_order):
        raise BackendUnavailableError(
            f"{where}: {what} is a tensor of dim order {list(t.dim_order)}; OpenVINO payloads "
            "exchange contiguous tensors"
        )
    return dtype


class OpenvinoCall:
    """One delegate call: ``call(*tensors)`` with the call's inputs, then its outputs.

    OpenVINO's tensor views of the arguments are made, and handed to the request, again only
    when an argument's memory or shape changes (a planned tensor keeps both from call to
    call; the request keeps what it was given)."""

    def __init__(self, ov: Any, compiled: Any, inputs: int, static_outputs: Sequence[bool]):
        self._ov = ov
        self._request = compiled.create_infer_request()
        self._inputs = inputs
        self._static = tuple(static_outputs)
        self._views: list[tuple[tuple[int, tuple[int, ...]], Any] | None] = [None] * (
            inputs + len(static_outputs)
        )
        self._given: list[Any] = [None] * (inputs + len(static_outputs))  # what the request has

    def _view(self, k: int, t: torch.Tensor) -> Any:
        key = (t.data_ptr(), tuple(t.shape))
        cached = self._views[k]
        if cached is not None and cached[0] == key:
            return cached[1]
        if t.device.type != "cpu" or not t.is_contiguous():
            raise RuntimeError(
                f"argument {k} is not a contiguous host tensor ({t.device}, strides "
                f"{list(t.stride())})"
            )
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: the same bits as int16
            view = self._ov.Tensor(t.view(torch.int16).numpy(), list(t.shape), self._ov.Type.bf16)
        else:
            view = self._ov.Tensor(t.numpy(), shared_memory=True)
        self._views[k] = (key, view)
        return view

    def __call__(self, *tensors: torch.Tensor) -> None:
        request = self._request
        n = self._inputs
        given = self._given
        for k in range(n):
            view = self._view(k, tensors[k])
            if view is not given[k]:
                request.set_input_tensor(k, view)
                given[k] = view
        for j, static in enumerate(self._static):
            if static:
                view = self._view(n + j, tensors[n + j])
                if view is not given[n + j]:
                    request.set_output_tensor(j, view)
                    given[n + j] = view
        request.infer()
        for j, static in enumerate(self._static):
            if not static:
                got = request.get_output_tensor(j)
                out = tensors[n + j]
                data = torch.from_numpy(got.data)
                if out.dtype == torch.bfloat16:
                    data = data.view(torch.bfloat16)
                out.resize_(list(got.shape))
                out.copy_(data.reshape(out.shape))

    def __repr__(self) -> str:
        return f"<OpenVINO call: {self._inputs} inputs, {len(self._static)} outputs>"


def prepare(ctx: DelegateContext) -> Statement:
    """Import and check the payload; emit ``_run(v[a], v[b], ...)``."""
    where = _where(ctx)
    ov = _openvino()
    tensors: list[p.Tensor] = []
    for k, slot in enumerate(ctx.args):
        if not 0 <= slot < len(ctx.values):
            raise PteFormatError(f"{where}.args[{k}]", f"value index {slot} out of range")
        value = ctx.values[slot]
        if not isinstance(value, p.Tensor):
            raise BackendUnavailableError(
                f"{where}: argument {k} of the call is a {type(value).__name__}, not a tensor"
            )
        device = ctx.device_of(slot)
        if device is not None and device.to_torch().type != "cpu":
            raise BackendUnavailableError(
                f"{where}: OpenVINO payloads run on host memory; argument {k} lives on "
                f"{device.to_torch()}"
            )
        tensors.append(value)
    compiled = _import(ov, ctx, _device_name(ctx, where), where)
    inputs, outputs = list(compiled.inputs), list(compiled.outputs)
    if len(inputs) + len(outputs) != len(tensors):
        raise PteFormatError(
            f"{where}.args",
            f"the payload has {len(inputs)} inputs and {len(outputs)} outputs; the call "
            f"passes {len(tensors)} tensors",
        )
    for k, port in enumerate(inputs):
        _check_port(port, tensors[k], f"input {k}", where)
    static: list[bool] = []
    for j, port in enumerate(outputs):
        t = tensors[len(inputs) + j]
        _check_port(port, t, f"output {j}", where)
        static.append(port.get_partial_shape().is_static and t.shape_dynamism == p.STATIC)
    call = OpenvinoCall(ov, compiled, len(inputs), static)
    name = ctx.bind(call, "openvino")
    args = ", ".join(f"v[{slot}]" for slot in ctx.args)
    outs = tuple(ctx.args[len(inputs) :])
    return ctx.emit(f"{name}({args})", mutates=outs, outs=outs)
