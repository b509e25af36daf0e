"""One call from a dataset to its outputs: :func:`map_program`."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..program import load
from .batching import check_mapping, default_outputs
from .mapper import (
    ProgramSource,
    PteMapper,
    call_shape_hint,
    check_state,
    choose_device_map,
    program_devices,
)

__all__ = ["default_batch_size", "map_program"]

_TARGET_ROWS = 256  # rows per batch when the caller does not say


def map_program(
    dataset: Any,
    path: ProgramSource,
    *,
    inputs: Sequence[Any],
    outputs: Sequence[str | None] | None = None,
    method: str = "forward",
    data_path: ProgramSource | None = None,
    concurrency: int | tuple[int, int] = 1,
    batch_size: int | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    ship: bool = True,
    mapper: type[PteMapper] = PteMapper,
    map_batches_args: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """``dataset`` with the outputs of ``method`` as new columns (a lazy Ray ``Dataset``).

    The program is checked here, before anything runs: the method exists, ``inputs`` and
    ``outputs`` fit its inputs and outputs, its state is handled (``state``), and a CUDA
    program gets a GPU. ``ship=True`` puts the program's bytes in Ray's object store once
    (any node can run it); ``ship=False`` passes ``path`` itself, for files every node can
    read (with ``mmap=True``, memory-mapped there).

    Actors: ``concurrency`` (a size, or ``(min, max)``), each with ``num_cpus`` and
    ``num_gpus`` (default: 1 when the program's memory is on CUDA or ``device`` names CUDA,
    else none). ``batch_size`` defaults to a multiple of the rows the method takes per
    call, about 256. Under ``state="carry"`` each actor takes one batch at a time, so it
    runs them in the order Ray hands them out (with one actor and
    ``DataContext.execution_options.preserve_order``, the dataset's order).

    Other keyword arguments are :class:`PteMapper`'s; ``mapper`` is the class the actors
    run (a subclass of PteMapper can add columns of its own); ``map_batches_args`` go to
    ``Dataset.map_batches``.
    """
    import ray.data

    if not (isinstance(mapper, type) and issubclass(mapper, PteMapper)):
        raise TypeError(f"mapper must be PteMapper or a subclass of it, not {mapper!r}")
    # Ray makes each actor's mapper as mapper(**kwargs): every argument goes by name, and
    # one the mapper does not take fails here, in the driver, before any actor starts
    kwargs: dict[str, Any] = dict(
        path=path, inputs=inputs, outputs=outputs, method=method, data_path=data_path, **options
    )
    inspect.signature(mapper).bind(**kwargs)
    # mapped: the check reads only what validation needs, however large the program
    program = load(_readable(path), data_path=_readable(data_path), share_state="never", mmap=True)
    meta = program.method_meta(method)
    names = default_outputs(len(meta.outputs)) if outputs is None else outputs
    check_mapping(
        method,
        meta.inputs,
        meta.outputs,
        inputs,
        names,
        **{k: options[k] for k in _MAPPING_OPTIONS if k in options},
    )
    check_state(program, method, options.get("state", "refuse"))
    device = options.get("device", "auto")
    device_map = options.get("device_map")
    devices = program_devices(meta)
    if num_gpus is None:
        cuda = any(not d.is_cpu for d in devices)
        on_gpu = device_map is None and (
            (device == "auto" and cuda) or str(device).startswith("cuda")
        )
        num_gpus = 1 if on_gpu else 0
    if not num_gpus:
        choose_device_map(device, device_map, devices, None)  # raises for CUDA on a CPU actor
    del program
    if ship:
        kwargs["path"] = _ship(path)
        if data_path is not None:
            kwargs["data_path"] = _ship(data_path)
    pool: dict[str, Any] = (
        {"min_size": concurrency[0], "max_size": concurrency[1]}
        if isinstance(concurrency, tuple)
        else {"size": concurrency}
    )
    if options.get("state") == "carry":
        # one batch at a time per actor, run in the order Ray hands them out
        pool["max_tasks_in_flight_per_actor"] = 1
    compute = ray.data.ActorPoolStrategy(**pool)
    extra: dict[str, Any] = dict(map_batches_args or {})
    if num_cpus is not None:
        extra["num_cpus"] = num_cpus
    if num_gpus:
        extra["num_gpus"] = num_gpus
    return dataset.map_batches(
        mapper,
        fn_constructor_kwargs=kwargs,
        compute=compute,
        batch_size=default_batch_size(meta) if batch_size is None else batch_size,
        batch_format="numpy",
        **extra,
    )


_MAPPING_OPTIONS = ("on_error", "error_column", "id_column", "keep_columns")


def default_batch_size(meta: Any) -> int:
    """The multiple of the rows a method takes per call nearest above 256."""
    per_call = call_shape_hint(meta)
    return -(-_TARGET_ROWS // per_call) * per_call


def _readable(source: ProgramSource | None) -> Any:
    """Something :func:`ptexec.load` reads, for the check made before shipping."""
    import ray

    if isinstance(source, ray.ObjectRef):
        source = ray.get(source)
    if isinstance(source, np.ndarray):
        return bytearray(source.data)
    return source


def _ship(source: ProgramSource) -> Any:
    """An ObjectRef to the program's bytes, stored once as a uint8 array (each actor makes
    one private, writable copy of it: ptexec's tensors need writable memory)."""
    import ray

    if isinstance(source, ray.ObjectRef):
        return source
    if isinstance(source, str | os.PathLike):
        data: Any = Path(source).read_bytes()
    else:
        data = source
    return ray.put(np.frombuffer(data, dtype=np.uint8))
