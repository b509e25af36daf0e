"""The per-actor program runner for ``Dataset.map_batches``: :class:`PteMapper`."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from .. import MethodMeta
from ..device import Device, DeviceType, parse_device
from ..errors import DeviceUnavailableError, StatefulMethodError
from ..program import Program, load
from .batching import Batcher, BatchStats, Cast, OnError, Pad, default_outputs

__all__ = [
    "PteMapper",
    "State",
    "assigned_device",
    "choose_device_map",
    "program_devices",
    "state_tensors",
]

State = Literal["refuse", "reset", "carry"]
ProgramSource = str | os.PathLike[str] | bytes | bytearray | memoryview | np.ndarray | Any

# load_method options the mapper decides itself
_RESERVED = frozenset({"device_map", "outputs"})


class PteMapper:
    """Runs one method of an ExecuTorch program over batches of a Ray dataset.

    Give the class to ``Dataset.map_batches`` with its arguments in
    ``fn_constructor_kwargs``; every actor builds one and loads the program once::

        ds.map_batches(PteMapper, fn_constructor_kwargs={"path": "model.pte",
                       "inputs": ["image"], "outputs": ["logits"]},
                       compute=ray.data.ActorPoolStrategy(size=4), batch_size=256)

    ``path`` is a file every node can read (read into the actor's memory, or with
    ``mmap=True`` memory-mapped, so that actors on one node share its pages; the file must
    then stay as it is while they run), or the program's bytes: ``bytes``, a uint8 numpy
    array, or a Ray ``ObjectRef`` to either (:func:`ptexec.ray.map_program` ships them
    this way); ``data_path`` is the program's ``.ptd`` the same ways. ``inputs`` names one
    column per method input (a non-``str`` entry is a constant passed to every call);
    ``outputs`` names one column per output (``None`` drops it; default ``output`` or
    ``output_0, output_1, ...``).

    ``device="auto"`` runs on the GPU Ray assigned the actor (``num_gpus``), else on the
    CPU: a program whose memory is on CUDA then raises
    :class:`~ptexec.errors.DeviceUnavailableError` (pass ``device="cpu"`` to run it on the
    CPU); a CPU program on a GPU actor runs on that GPU. ``"cpu"``, ``"cuda"`` and
    ``"cuda:N"`` say where explicitly; ``device_map`` is passed to ``load_method`` as is.

    ``state`` is what to do with a method that keeps state between calls (mutable
    buffers): ``"refuse"`` raises :class:`~ptexec.errors.StatefulMethodError`; ``"reset"``
    starts every call from the program's initial state (the method is reloaded before each
    call); ``"carry"`` lets state run on from call to call on each actor, so results depend
    on how Ray splits and orders the rows (use one actor and ``preserve_order``), and
    calls are never padded or retried.

    ``on_error``, ``error_column``, ``id_column``, ``keep_columns``, ``pad`` and ``cast``
    are described in :mod:`ptexec.ray`; ``load_options`` go to ``load_method``.
    """

    def __init__(
        self,
        path: ProgramSource,
        *,
        inputs: Sequence[Any],
        outputs: Sequence[str | None] | None = None,
        method: str = "forward",
        data_path: ProgramSource | None = None,
        device: str = "auto",
        device_map: Any = None,
        state: State = "refuse",
        on_error: OnError = "raise",
        error_column: str = "error",
        id_column: str | None = None,
        keep_columns: bool | Sequence[str] = True,
        pad: Pad = "auto",
        cast: Cast = "same_kind",
        mmap: bool = False,
        load_options: Mapping[str, Any] | None = None,
    ) -> None:
        if state not in ("refuse", "reset", "carry"):
            raise ValueError(f"state must be 'refuse', 'reset' or 'carry', not {state!r}")
        options = dict(load_options or {})
        reserved = sorted(_RESERVED & set(options))
        if reserved:
            raise ValueError(f"load_options cannot set {', '.join(reserved)}: the mapper does")
        data = None if data_path is None else _source(data_path)
        self.program: Program = load(_source(path), data_path=data, share_state="never", mmap=mmap)
        meta = self.program.method_meta(method)
        check_state(self.program, method, state)
        dmap = choose_device_map(device, device_map, program_devices(meta), assigned_device())
        self._load = dict(options, device_map=dmap)
        self._name = method
        self._reset = state == "reset"
        self._used = False
        self._lock = threading.Lock()
        self.method = self.program.load_method(method, **self._load)
        infos = self.method.meta
        self._batcher = Batcher(
            self._execute,
            infos.inputs,
            infos.outputs,
            inputs,
            default_outputs(len(infos.outputs)) if outputs is None else outputs,
            method=method,
            on_error=on_error,
            error_column=error_column,
            id_column=id_column,
            keep_columns=keep_columns,
            pad=pad,
            cast=cast,
            isolate=state != "carry",
            allow_padding=state != "carry",
            written_inputs=written_inputs(self.method),
        )

    def __call__(self, batch: Any) -> dict[str, np.ndarray]:
        """Map one batch (``{column: array}`` or a pandas DataFrame) to its output columns."""
        return self._batcher(batch)

    @property
    def stats(self) -> BatchStats:
        """Batches, rows, calls, padding, retries and failures of this actor so far."""
        return self._batcher.stats

    @property
    def device(self) -> Device:
        """Where the method's inputs go (the device of its first tensor input)."""
        for info in self.method.meta.inputs:
            dev = info.device
            if dev is not None:
                return dev
        return parse_device("cpu")

    def _execute(self, args: list[Any]) -> list[Any]:
        with self._lock:  # a fresh method and its call go together (threaded actors)
            if self._reset and self._used:
                self.method = self.program.load_method(self._name, **self._load)
            self._used = True
            return self.method.execute(args)


# ------------------------------------------------------------------------------------------
# the program: where it comes from, its devices, its state


def _source(source: ProgramSource) -> Any:
    """A path as is; bytes (or an ObjectRef to them) as writable bytes ptexec uses in place."""
    ray = sys.modules.get("ray")
    if ray is not None and isinstance(source, ray.ObjectRef):
        source = ray.get(source)
    if isinstance(source, np.ndarray):
        if source.dtype != np.uint8 or source.ndim != 1:
            raise TypeError(
                "a program's bytes as an array must be 1-D uint8, not "
                f"{source.dtype}{list(source.shape)}"
            )
        return bytearray(source.data)
    return source


def program_devices(meta: MethodMeta) -> set[Device]:
    """Every device a method's inputs, outputs and planned buffers name."""
    devices = {info.device for info in (*meta.inputs, *meta.outputs) if info.device is not None}
    return devices | {b.device for b in meta.buffers}


def state_tensors(program: Program, method: str) -> list[str]:
    """The tensors whose content a call of ``method`` leaves for the next (its state)."""
    from ..plan import memory_plan

    return [t.describe() for t in memory_plan(program, method).tensors if t.kind == "state"]


def written_inputs(method: Any) -> frozenset[int]:
    """The inputs ``method`` writes in place (a batch's column never gives it its memory)."""
    return frozenset(s.index for s in method.state.inputs if s.written)


def check_state(program: Program, method: str, state: State) -> None:
    """Raise :class:`StatefulMethodError` for a method with state under ``state="refuse"``."""
    if state != "refuse":
        return
    found = state_tensors(program, method)
    if found:
        raise StatefulMethodError(
            f"method '{method}' keeps state from call to call ({len(found)} mutable "
            f"tensor(s): {', '.join(found)}), so its outputs for a row depend on the rows "
            "before it. Pass state='reset' to start every call from the program's initial "
            "state, or state='carry' to let the state run on from call to call on each actor "
            "(results then depend on how rows are split and ordered)"
        )


def assigned_device() -> Device | None:
    """The GPU this process should use: in a Ray actor, the one Ray assigned it (None when
    it assigned none); elsewhere torch's current CUDA device, or None without CUDA."""
    ray = sys.modules.get("ray")
    in_actor = False
    if ray is not None and ray.is_initialized():
        in_actor = ray.get_runtime_context().get_actor_id() is not None
    if in_actor:
        assert ray is not None
        ids = ray.get_gpu_ids()
        if not ids:
            return None
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"Ray assigned GPU(s) {list(ids)} to this actor, but torch sees no CUDA device"
            )
        if torch.cuda.device_count() > len(ids):  # Ray left CUDA_VISIBLE_DEVICES alone
            return Device(DeviceType.CUDA, int(ids[0]))
        return Device(DeviceType.CUDA, torch.cuda.current_device())
    if torch.cuda.is_available():
        return Device(DeviceType.CUDA, torch.cuda.current_device())
    return None


def choose_device_map(
    device: str, device_map: Any, devices: set[Device], assigned: Device | None
) -> Any:
    """The ``device_map`` that runs a program naming ``devices`` where ``device`` says.

    ``"auto"`` means ``assigned`` (a GPU, or None for the CPU). A program with CUDA memory
    keeps its CPU parts and has its CUDA devices mapped to the target GPU; a CPU program
    moves to the target GPU whole. A CUDA program asked onto the CPU is mapped there only
    when the caller says ``"cpu"``; under ``"auto"`` it is an error.
    """
    if device_map is not None:
        if device != "auto":
            raise ValueError("pass device or device_map, not both")
        return device_map
    cuda = sorted((d for d in devices if not d.is_cpu), key=str)
    if device == "auto":
        if assigned is None:
            if cuda:
                raise DeviceUnavailableError(
                    f"the program's memory is on {', '.join(map(str, cuda))}, and this actor "
                    "has no GPU: request one for each actor (num_gpus=1 in map_batches), or "
                    "pass device='cpu' to run the program on the CPU"
                )
            return None
        target = assigned
    else:
        target = parse_device(device)
    if target.is_cpu:
        return "cpu" if cuda else None
    if cuda:
        return None if all(d == target for d in cuda) else {"cuda": str(target)}
    return str(target)


def call_shape_hint(meta: MethodMeta) -> int:
    """Rows per call when a method batches rows along dim 0 of its first tensor input
    (its static size or bound), else 1."""
    from ..tensor import TensorInfo

    for info in meta.inputs:
        if isinstance(info, TensorInfo) and info.sizes and info.dynamism != "dynamic_unbound":
            return max(info.sizes[0], 1)
    return 1
