"""Export recipe: a ``torch.export`` program -> a ``.pte`` whose activations live on a device.

    import ptexec.export
    data = ptexec.export.to_pte(model, (x,), device="cuda:0", path="model.pte")
    fwd = ptexec.load(data).load_method("forward")   # planned buffer allocated on cuda:0
    y, = fwd(x.cuda())                                # x shared, y on cuda:0

What the file says, for every method:

- every activation (every tensor an instruction writes, and mutable buffers) is memory
  planned in a buffer on ``device``, listed in the plan's ``non_const_buffer_device``;
- graph inputs and outputs are not planned (``MemoryPlanningPass(alloc_graph_input=False,
  alloc_graph_output=False)``) and are labelled ``device``: the runtime uses the caller's
  memory for inputs and gives outputs memory on ``device``, so nothing crosses between host
  and device inside a call (no ``et_copy`` instruction);
- constants (weights) stay in the file, stored once, and are labelled ``device`` as well.
  The label says where a runtime must put a tensor, not where its bytes are stored: ptexec
  uploads a labelled constant once, at method load, so every kernel sees all of its operands
  on one device. Left on the host, a weight would meet device activations in every kernel
  that uses it, which ATen's CUDA kernels refuse (0-dim tensors aside).

Export needs no GPU. The file runs with ptexec on a CUDA machine as is, and anywhere with
``load_method(..., device_map="cpu")``. It is meant for runtimes whose kernels run on the
device, as ptexec's do: ExecuTorch's own runtime allocates the cuda buffer (with its CUDA
allocator) but runs non-delegated instructions with host kernels.
On the CPU, ExecuTorch 1.5.1's runtime returns zeros for every output of a method that returns
one of its own inputs (``return x, x * 2`` of ``[1, 2, 3]`` gives ``[0, 0, 0]`` twice); ptexec
returns eager's values.

This module needs ExecuTorch's exporter (``pip install '.[export]'`` in ptexec's source tree); it imports
``executorch`` only when a function here is called. The rest of ptexec never does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .device import CPU, Device, DeviceType, parse_device, schema_device
from .errors import ExportError, UnsupportedDeviceError

if TYPE_CHECKING:
    import torch

__all__ = ["check_device_plan", "planning_pass", "to_pte"]

_INSTALL_HINT = (
    "ptexec.export needs ExecuTorch's exporter: pip install '.[export]' in ptexec's source tree"
)

# ExecutorchBackendConfig fields the recipe sets itself.
_OWNED_CONFIG = frozenset({"memory_planning_pass", "enable_non_cpu_memory_planning"})


def _require_executorch() -> None:
    try:
        import executorch.exir  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e


_MAX_INDEX = 127
"""The largest device index a ``.pte`` holds (the schema's ``device_index`` is an int8)."""


def _target_device(device: Any) -> Device:
    """The device the recipe plans on; a bare ``cuda`` means ``cuda:0`` (files are portable)."""
    import torch

    if isinstance(device, str) and device.strip().lower() == "cuda":
        return Device(DeviceType.CUDA, 0)
    if isinstance(device, torch.device) and device.type == "cuda" and device.index is None:
        return Device(DeviceType.CUDA, 0)
    try:
        target = parse_device(device)
    except (UnsupportedDeviceError, TypeError) as e:
        raise UnsupportedDeviceError(
            f"cannot export for device {device!r}: a .pte names cpu or cuda devices only ({e})"
        ) from None
    if not 0 <= target.index <= _MAX_INDEX:
        raise UnsupportedDeviceError(
            f"cannot export for device {device!r}: a .pte's device index is 0 to {_MAX_INDEX}"
        )
    return target


def planning_pass(device: Any = "cuda:0", **memory_planning: Any) -> Any:
    """A ``MemoryPlanningPass`` that puts every tensor of a method on ``device``.

    Before planning it labels every tensor spec of the graph (activations, graph inputs and
    outputs, mutable buffers and constants) with ``device``, so ExecuTorch's per-device
    planner (``ExecutorchBackendConfig(enable_non_cpu_memory_planning=True)``, the default)
    plans the activations in a buffer on that device. Graph inputs and outputs are left to
    the caller unless ``alloc_graph_input`` / ``alloc_graph_output`` say otherwise; other
    keyword arguments go to ``MemoryPlanningPass``. Use it in your own
    ``ExecutorchBackendConfig(memory_planning_pass=...)``, or let :func:`to_pte` do it.

    Methods with control flow (cond, map, scan, while) and ``share_mutable_buffers`` are
    refused on a device other than the host: ExecuTorch plans the tensors of their
    sub-graphs, and shared state, in host memory.
    """
    _require_executorch()
    import torch
    from executorch.exir import schema
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.tensor import TensorSpec

    target = _target_device(device)
    if memory_planning.get("share_mutable_buffers") and not target.is_cpu:
        raise ValueError(
            f"cannot plan on {target} with share_mutable_buffers: ExecuTorch plans the "
            "state methods share in a buffer of its own in host memory"
        )
    type_ = schema.DeviceType.CPU if target.is_cpu else schema.DeviceType.CUDA
    index = target.index
    memory_planning.setdefault("alloc_graph_input", False)
    memory_planning.setdefault("alloc_graph_output", False)

    class DevicePlanningPass(MemoryPlanningPass):  # type: ignore[misc]
        """Labels every tensor spec with one device, then plans memory per device."""

        target_device = target

        def run(self, graph_module: torch.fx.GraphModule, graph_signature: Any = None) -> Any:
            for name, child in graph_module.named_children():
                if isinstance(child, torch.fx.GraphModule) and not target.is_cpu:
                    raise ValueError(
                        f"cannot plan this method on {target}: it has control flow (sub-graph "
                        f"'{name}'), whose tensors ExecuTorch's planner keeps in host memory"
                    )
            for node in graph_module.graph.nodes:
                spec = node.meta.get("spec")
                for s in spec if isinstance(spec, list | tuple) else (spec,):
                    if isinstance(s, TensorSpec):
                        s.device = type_
                        s.device_index = index
            return super().run(graph_module, graph_signature)

    return DevicePlanningPass(**memory_planning)


def _as_dict(value: Any, names: list[str], what: str) -> dict[str, Any]:
    if value is None:
        return dict.fromkeys(names)
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{what} must be a dict keyed by method name when programs are given by name"
        )
    unknown = set(value) - set(names)
    if unknown:
        raise ValueError(f"{what} names method(s) {sorted(unknown)} that are not being exported")
    return {n: value.get(n) for n in names}


def _exported(name: str, program: Any, example_inputs: Any, dynamic_shapes: Any) -> Any:
    from torch.export import ExportedProgram, export
    from torch.nn import Module

    if isinstance(program, ExportedProgram):
        if dynamic_shapes is not None:
            raise ValueError(
                f"method '{name}': dynamic_shapes applies when exporting a module; this "
                "ExportedProgram's shapes were fixed by torch.export"
            )
        return program
    if isinstance(program, Module):
        if example_inputs is None:
            raise ValueError(f"method '{name}': exporting a module needs example_inputs")
        args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        return export(program, args, dynamic_shapes=dynamic_shapes)
    raise TypeError(
        f"method '{name}': expected a torch.export.ExportedProgram or a torch.nn.Module, got "
        f"{type(program).__name__}"
    )


def to_pte(
    program: Any,
    example_inputs: Any = None,
    *,
    device: Any = "cuda:0",
    path: str | os.PathLike[str] | None = None,
    dynamic_shapes: Any = None,
    backend_config: Mapping[str, Any] | None = None,
) -> bytes:
    """Lower ``program`` to an ExecuTorch program whose activations live on ``device``.

    ``program`` is a ``torch.export.ExportedProgram``, an ``nn.Module`` (exported here with
    ``example_inputs`` and ``dynamic_shapes``), or a dict of either keyed by method name
    (then ``example_inputs`` and ``dynamic_shapes`` are dicts keyed by method name too). A
    plain module becomes the method ``forward``. ``device`` is ``"cuda:0"``, ``"cuda:1"``,
    ... (a bare ``"cuda"`` means ``cuda:0``) or ``"cpu"`` (a host program with caller-owned
    inputs and outputs). ``backend_config`` holds extra ``ExecutorchBackendConfig``
    arguments (``emit_stacktrace``, ``external_constants``, ...), all but the memory
    planning, which this recipe owns; with ``external_constants`` the weights go to a
    ``.ptd`` data file written beside ``path`` (then required) as ``<stem>.ptd`` (tagged
    constants: one file per tag), where loading the program from ``path`` finds them. The
    result is checked with :func:`check_device_plan` before it is returned (and written to
    ``path`` if given).

    Raises :class:`~ptexec.errors.UnsupportedDeviceError` for a device a ``.pte`` cannot
    name, ``ValueError`` for methods with control flow on a device other than the host,
    :class:`~ptexec.errors.ExportError` when the exporter's file breaks the recipe's
    contract, and ``ImportError`` without ExecuTorch's exporter.
    """
    _require_executorch()
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from torch.export import ExportedProgram
    from torch.nn import Module

    target = _target_device(device)
    if isinstance(program, ExportedProgram | Module):
        programs = {"forward": _exported("forward", program, example_inputs, dynamic_shapes)}
    elif isinstance(program, Mapping):
        names = list(program)
        if not names:
            raise ValueError("no methods to export")
        examples = _as_dict(example_inputs, names, "example_inputs")
        shapes = _as_dict(dynamic_shapes, names, "dynamic_shapes")
        programs = {n: _exported(n, program[n], examples[n], shapes[n]) for n in names}
    else:
        raise TypeError(
            "expected a torch.export.ExportedProgram, an nn.Module, or a dict of them keyed "
            f"by method name, got {type(program).__name__}"
        )
    extra = dict(backend_config or {})
    owned = sorted(_OWNED_CONFIG & set(extra))
    if owned:
        raise ValueError(f"backend_config cannot set {', '.join(owned)}: the recipe sets them")
    external = bool(extra.get("external_constants"))
    if external and path is None:
        raise ValueError(
            "backend_config external_constants puts the weights in .ptd data files beside "
            "the program: give path, where the program and its data files are written"
        )
    config = ExecutorchBackendConfig(
        memory_planning_pass=planning_pass(target),
        enable_non_cpu_memory_planning=True,
        **extra,
    )
    manager = to_edge(programs).to_executorch(config)
    data = bytes(manager.buffer)
    problems = check_device_plan(data, target)
    if problems:
        raise ExportError(
            f"ExecuTorch's exporter did not give a {target}-activation program:\n  "
            + "\n  ".join(problems)
        )
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
        if external:
            _write_data_files(manager, path)
    return data


def _write_data_files(manager: Any, path: str | os.PathLike[str]) -> None:
    """The exporter's ``.ptd`` data files beside the program at ``path``, where loading it
    finds them: one file (``external_constants=True``) as ``<stem>.ptd``, the name loading
    tries first, so that programs exported into one folder keep their own weights (the
    exporter names it the same for every program); several (tagged) under their tags."""
    import shutil
    import tempfile

    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        manager.write_tensor_data_to_file(scratch)
        names = sorted(os.listdir(scratch))
        for name in names:
            dest = (
                os.path.splitext(target)[0] + ".ptd"
                if len(names) == 1
                else os.path.join(folder, name)
            )
            shutil.move(os.path.join(scratch, name), dest)


def check_device_plan(data: bytes | bytearray | memoryview, device: Any = "cuda:0") -> list[str]:
    """What in a ``.pte`` breaks the recipe's contract for ``device``; empty when nothing.

    Per method: every planned tensor lies in a buffer on ``device`` and is labelled
    ``device``; every graph input and tensor output is unplanned and labelled ``device`` (a
    constant output is exempt from the first); every other tensor, constants included, is
    labelled ``device``, and is planned unless it is a constant, a view (``et_view``: the
    memory of the tensor it views), unbound or empty; no instruction copies between host
    and device (``et_copy``).
    Reads the file with ptexec's format layer (no torch, no ExecuTorch).
    """
    from .format import program as p
    from .format.pte import read_pte

    target = _target_device(device)
    prog = read_pte(memoryview(bytearray(data))).program
    problems: list[str] = []
    for plan in prog.execution_plan:
        where = f"method '{plan.name}'"
        for op in plan.operators:
            if op.name.startswith("et_copy::"):
                problems.append(
                    f"{where}: instruction operator {op.qualified_name} copies between devices"
                )
        io = set(plan.inputs) | set(plan.outputs)
        # a view's tensor has the memory of the tensor it views, planned or the caller's
        views = {
            ins.args[-1]
            for chain in plan.chains
            for ins in chain.instructions
            if isinstance(ins, p.KernelCall)
            and ins.args
            and plan.operators[ins.op_index].name == "executorch_prim::et_view"
        }
        for j, value in enumerate(plan.values):
            if not isinstance(value, p.Tensor):
                continue
            label = schema_device(*value.device)
            what = f"{where} value {j}"
            if label != target:
                problems.append(f"{what}: labelled {label}, expected {target}")
            alloc = value.allocation_info
            if j in io:
                if alloc is not None:
                    problems.append(
                        f"{what}: a graph input/output, planned in buffer {alloc.memory_id}"
                    )
                continue
            if (
                alloc is None
                and not value.is_constant
                and j not in views
                and value.shape_dynamism != p.DYNAMIC_UNBOUND  # memory made per call, on its label
                and value.numel  # nothing to hold
            ):
                problems.append(f"{what}: written by an instruction, but not planned")
            if alloc is not None:
                buffer = schema_device(*plan.buffer_device(alloc.memory_id))
                if buffer != target:
                    problems.append(
                        f"{what}: planned in buffer {alloc.memory_id}, which is on {buffer}"
                    )
        if target != CPU:
            listed = {e.buffer_idx for e in plan.non_const_buffer_device or ()}
            for idx in range(1, len(plan.non_const_buffer_sizes)):
                if plan.non_const_buffer_sizes[idx] and idx not in listed:
                    problems.append(f"{where}: buffer {idx} has no device entry (host memory)")
    return problems
