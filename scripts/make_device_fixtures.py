#!/usr/bin/env python3
"""Make ptexec's device-annotated test fixtures (tag ``device``) with ExecuTorch's exporter.

Usage:
    python scripts/make_device_fixtures.py [--out tests/fixtures] [--only NAME ...] [--no-check]

Same conventions as ``make_fixtures.py`` (whose models and helpers this script uses): per
fixture ``NAME.pte`` and ``NAME.io.pt`` (calls replayed on one loaded program, outputs from
eager PyTorch on the CPU), and an entry merged into ``manifest.json`` (entries of other
fixtures are kept). Extra manifest keys:

* ``devices``: the devices the program names (``["cuda:0"]``); on a machine without them,
  load with ``load_method(..., device_map="cpu")``;
* ``runs``: ``false`` when ptexec cannot replay the calls as the file stands (a delegate
  ptexec has no backend for, or a plan that needs a ``device_map``), with ``runs_note``
  saying why;
* ``load_error``: the error ``load_method`` raises on a machine that has the program's
  devices, without a ``device_map`` (without them it is ``DeviceUnavailableError`` first).

Fixtures:

* ``gpu_*``: made by the recipe ``ptexec.export.to_pte(..., device="cuda:0")``: every
  activation planned in a cuda:0 buffer, inputs and outputs unplanned and labelled cuda:0,
  constants labelled cuda:0, no ``et_copy`` instruction.
* ``gpu_legacy``: the recipe's labels with ``enable_non_cpu_memory_planning=False``: one
  planned buffer with no device entry, all of its tensors labelled cuda:0.
* ``h2d_copy``: a region of ordinary ops labelled cuda:0 with ``et_copy::_h2d_copy.out`` /
  ``_d2h_copy.out`` around it (inserted by a small pass here, the way ExecuTorch's
  ``PropagateDevicePass`` does around a device delegate), planned per device: a cpu buffer
  and a cuda:0 buffer. ptexec runs it (on the CPU with ``device_map``).
* ``h2d_copy_legacy``: the same region labelled cuda:0 without copies, legacy planning:
  one buffer whose tensors name cpu and cuda:0 (ptexec refuses it without a device_map).
* ``delegate_device`` / ``delegate_legacy``: ``aten.add`` delegated to ExecuTorch's test
  backend ``BackendWithCompilerDemo`` with CompileSpec ``target_device=b"cuda:0"``, default
  config (copies and a cuda:0 buffer) and legacy config (labels only). ptexec has no such
  backend; these are for describing programs, not running them.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim, ExportedProgram, export

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "src"))

import make_fixtures as mf  # noqa: E402

DEFAULT_OUT = ROOT / "tests" / "fixtures"
DEVICE = "cuda:0"
VERDICT_CHARS = 400

TAGS = mf.TAGS | {"device", "delegate", "et_copy", "legacy_device", "input_mutation"}

DELEGATE_NOTE = (
    "delegates to BackendWithCompilerDemo (ExecuTorch's test backend), which ptexec does not "
    "run: loading the method raises BackendUnavailableError; inspect it with method_meta"
)
ET_DELEGATE_DIVERGENCE = (
    "ExecuTorch's pip runtime has neither BackendWithCompilerDemo nor, without CUDA, an "
    "allocator for a cuda:0 buffer, so the method does not load"
)
ET_NO_CUDA_ALLOCATOR = (
    "ExecuTorch's runtime allocates the cuda:0 planned buffer with its registered CUDA "
    "device allocator; a build without one (the CPU-only pip runtime) fails at load_method "
    "('Failed to allocate N bytes for buffer 0 on device 1:0')"
)
ET_LEGACY_OUTPUT = (
    "ExecuTorch's runtime plans the buffer in host memory (no device entry) and runs, but "
    "wraps the outputs labelled cuda:0 as CUDA torch tensors, which a CPU-only torch cannot make"
)
ET_LEGACY_INPUT = (
    "ExecuTorch's set_input refuses to copy into a planned input labelled cuda:0 "
    "(NotSupported, 0x10): its planned-buffer copy needs host memory on both sides"
)


@dataclass
class DeviceFixture:
    name: str
    tags: list[str]
    description: str
    # Returns (data, calls, eager, notes): the .pte bytes, the call sequence as
    # (method, args), the eager replay and extra sentences for the description.
    build: Callable[[], tuple[bytes, list[tuple[str, tuple[Any, ...]]], Callable[..., Any], str]]
    tol: tuple[float, float] = mf.TOL_F32
    runs: bool = True
    runs_note: str | None = None
    load_error: str | None = None
    known_divergence: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------


class Accumulate(nn.Module):
    """Adds x into the caller's tensor acc (a mutated user input) and returns acc * 2."""

    def forward(self, x: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        acc.add_(x)
        return acc * 2.0


class Encode(nn.Module):
    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class Decode(nn.Module):
    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, z: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.lin(z) * scale


class RegionModel(nn.Module):
    """h = a * b on the host; g = sin(h + b) in the device region; relu(g) - a on the host."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h = a * b
        g = torch.sin(h + b)
        return torch.relu(g) - a


class AddThenSin(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.sin(a + b)


class AddOnly(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


# --------------------------------------------------------------------------------------
# EXIR helpers
# --------------------------------------------------------------------------------------


def region_pass(region_ops: set[str], device: str, insert_copies: bool) -> Any:
    """A pass for ``ExecutorchBackendConfig.sym_shape_eval_pass`` that labels a region.

    The region is every call whose op name (``aten.add.Tensor``) is in ``region_ops``. With
    ``insert_copies`` each region input from outside gets an ``et_copy._h2d_copy`` (its
    output labelled ``device``) and each region output used outside a ``_d2h_copy`` (host),
    as ExecuTorch's PropagateDevicePass does around a device delegate; without, the region's
    inputs and outputs are only labelled (its legacy mode). It runs after SpecPropPass and
    before ToOutVarPass (the slot of the sym-shape pass, which it then runs).
    """
    import executorch.exir.passes._device_copy_ops_registry  # noqa: F401 (registers et_copy)
    from executorch.exir import schema
    from executorch.exir.capture._config import ExecutorchBackendConfig
    from executorch.exir.pass_base import PassBase
    from executorch.exir.tensor import TensorSpec

    kind, _, number = device.partition(":")
    if kind != "cuda":
        raise ValueError(f"region device must be cuda[:N], not {device!r}")
    dev_type, dev_index = schema.DeviceType.CUDA, int(number or 0)
    inner = ExecutorchBackendConfig().sym_shape_eval_pass

    def label(spec: Any, t: Any, i: int) -> None:
        if isinstance(spec, TensorSpec):
            spec.device, spec.device_index = t, i

    def relabelled(spec: TensorSpec, t: Any, i: int) -> TensorSpec:
        new = copy.copy(spec)
        new.init_mem_planning_fields()
        new.device, new.device_index = t, i
        return new

    def copy_meta(src: torch.fx.Node, dst: torch.fx.Node) -> None:
        for key in ("val", "tensor_meta"):
            if key in src.meta:
                dst.meta[key] = src.meta[key]

    def op_name(node: torch.fx.Node) -> str:
        return getattr(node.target, "__name__", str(node.target))

    class RegionPass(PassBase):  # type: ignore[misc]
        def call(self, gm: torch.fx.GraphModule) -> Any:
            graph = gm.graph
            region = [
                n for n in graph.nodes if n.op == "call_function" and op_name(n) in region_ops
            ]
            if not region:
                raise RuntimeError(f"no node in the region {sorted(region_ops)}")
            members = set(region)
            h2d: dict[torch.fx.Node, torch.fx.Node] = {}
            for node in region:
                for arg in list(node.all_input_nodes):
                    if arg in members or not isinstance(arg.meta.get("spec"), TensorSpec):
                        continue
                    if not insert_copies:
                        label(arg.meta["spec"], dev_type, dev_index)
                        continue
                    copy_node = h2d.get(arg)
                    if copy_node is None:
                        with graph.inserting_before(node):
                            copy_node = graph.call_function(
                                torch.ops.et_copy._h2d_copy.default, (arg,)
                            )
                        copy_meta(arg, copy_node)
                        copy_node.meta["spec"] = relabelled(arg.meta["spec"], dev_type, dev_index)
                        h2d[arg] = copy_node
                    node.replace_input_with(arg, copy_node)
                label(node.meta.get("spec"), dev_type, dev_index)
            if insert_copies:
                for node in region:
                    outside = [u for u in node.users if u not in members]
                    if not outside:
                        continue
                    with graph.inserting_after(node):
                        d2h = graph.call_function(torch.ops.et_copy._d2h_copy.default, (node,))
                    copy_meta(node, d2h)
                    d2h.meta["spec"] = relabelled(node.meta["spec"], schema.DeviceType.CPU, 0)
                    for user in outside:
                        user.replace_input_with(node, d2h)
            gm.recompile()
            return inner(gm)

    return RegionPass()


def device_partitioner(device: str) -> Any:
    """Delegates every ``aten.add.Tensor`` to BackendWithCompilerDemo, with a
    ``target_device`` CompileSpec (as ExecuTorch's own device tests do)."""
    # Importing the demo backend registers it with the lowering machinery by name.
    from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import (
        generate_pattern_op_partitions,
    )
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
    from executorch.exir.backend.test import backend_with_compiler_demo  # noqa: F401
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.passes.propagate_device_pass import TARGET_DEVICE_COMPILE_SPEC_KEY
    from torch.fx.passes.operator_support import OperatorSupportBase

    class AddSupport(OperatorSupportBase):  # type: ignore[misc]
        def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
            return node.op == "call_function" and node.target == exir_ops.edge.aten.add.Tensor

    spec = DelegationSpec(
        "BackendWithCompilerDemo",
        [
            CompileSpec("max_value", bytes([4])),
            CompileSpec(TARGET_DEVICE_COMPILE_SPEC_KEY, device.encode()),
        ],
    )

    class AddOnDevice(Partitioner):  # type: ignore[misc]
        def partition(self, ep: ExportedProgram) -> PartitionResult:
            tags = {}
            for part in generate_pattern_op_partitions(ep.graph_module, op_support=AddSupport()):
                tag = f"device_tag{part.id}"
                for node in part.nodes:
                    node.meta["delegation_tag"] = tag
                tags[tag] = spec
            return PartitionResult(tagged_exported_program=ep, partition_tags=tags)

    return AddOnDevice()


def lower(programs: dict[str, ExportedProgram], **config: Any) -> bytes:
    from executorch.exir import ExecutorchBackendConfig, to_edge

    return bytes(to_edge(programs).to_executorch(ExecutorchBackendConfig(**config)).buffer)


def lower_delegated(ep: ExportedProgram, **config: Any) -> bytes:
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge

    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    edge = edge.to_backend(device_partitioner(DEVICE))
    return bytes(edge.to_executorch(ExecutorchBackendConfig(**config)).buffer)


def eager_of(module: nn.Module) -> Callable[[str, tuple[Any, ...]], Any]:
    def run(method: str, args: tuple[Any, ...]) -> Any:
        assert method == "forward"
        return module(*args)

    return run


# --------------------------------------------------------------------------------------
# Plan summaries (for the descriptions; checked, so a changed exporter is noticed)
# --------------------------------------------------------------------------------------


def plan_summary(data: bytes) -> str:
    """Buffers with their devices and how many tensors each device labels, per method."""
    from ptexec.format import program as p
    from ptexec.format.pte import read_pte

    prog = read_pte(memoryview(bytearray(data))).program
    notes = []
    for plan in prog.execution_plan:
        bufs = []
        for idx in range(1, len(plan.non_const_buffer_sizes)):
            t, i = plan.buffer_device(idx)
            listed = any(e.buffer_idx == idx for e in plan.non_const_buffer_device or ())
            where = f"on {'cpu' if t == 0 else f'cuda:{i}'}" if listed else "no device entry"
            bufs.append(f"{idx}: {plan.non_const_buffer_sizes[idx]} B, {where}")
        labels: dict[str, int] = {}
        for v in plan.values:
            if isinstance(v, p.Tensor):
                t, i = v.device
                key = "cpu" if t == 0 else f"cuda:{i}"
                labels[key] = labels.get(key, 0) + 1
        notes.append(
            f"{plan.name}: buffers [{'; '.join(bufs)}], tensor labels {labels}, "
            f"{sum(len(c.instructions) for c in plan.chains)} instructions"
        )
    return "Plan: " + " | ".join(notes) + "."


def require_ops(data: bytes, present: Sequence[str] = (), absent: Sequence[str] = ()) -> None:
    ops = set(mf.operator_names(mf.raw_program(data)))
    for op in present:
        if op not in ops:
            raise RuntimeError(f"expected operator {op} in the program, got {sorted(ops)}")
    for op in absent:
        if op in ops:
            raise RuntimeError(f"operator {op} should not be in the program")


def recipe_checked(data: bytes) -> bytes:
    from ptexec.export import check_device_plan

    problems = check_device_plan(data, DEVICE)
    if problems:
        raise RuntimeError("; ".join(problems))
    return data


# --------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------

Calls = list[tuple[str, tuple[Any, ...]]]


def build_gpu_mlp() -> tuple[bytes, Calls, Any, str]:
    from ptexec.export import to_pte

    m = mf.MLP().eval()
    calls = [(torch.randn(2, 8),), (torch.randn(2, 8),), (torch.randn(2, 8) * 3,)]
    data = to_pte(copy.deepcopy(m), calls[0], device=DEVICE)
    return data, [("forward", c) for c in calls], eager_of(m), plan_summary(data)


def build_gpu_cnn() -> tuple[bytes, Calls, Any, str]:
    from ptexec.export import to_pte

    m = mf.CNN().eval()
    calls = [(torch.randn(2, 3, 16, 16),), (torch.randn(2, 3, 16, 16),)]
    data = to_pte(copy.deepcopy(m), calls[0], device=DEVICE)
    return data, [("forward", c) for c in calls], eager_of(m), plan_summary(data)


def build_gpu_dynamic_mlp() -> tuple[bytes, Calls, Any, str]:
    from ptexec.export import to_pte

    m = mf.MLP().eval()
    calls = [(torch.randn(b, 8),) for b in (1, 3, 16, 3)]
    data = to_pte(
        copy.deepcopy(m),
        (torch.randn(4, 8),),
        device=DEVICE,
        dynamic_shapes={"x": {0: Dim("batch", min=1, max=16)}},
    )
    return data, [("forward", c) for c in calls], eager_of(m), plan_summary(data)


def build_gpu_stateful() -> tuple[bytes, Calls, Any, str]:
    from ptexec.export import to_pte

    m = mf.Accumulator()
    calls = [(torch.randn(4),) for _ in range(4)]
    data = to_pte(copy.deepcopy(m), calls[0], device=DEVICE)
    return data, [("forward", c) for c in calls], eager_of(m), plan_summary(data)


def build_gpu_inplace() -> tuple[bytes, Calls, Any, str]:
    from ptexec.export import to_pte

    m = Accumulate()
    calls = [(torch.randn(4), torch.randn(4)) for _ in range(3)]
    data = to_pte(m, calls[0], device=DEVICE)

    def eager(method: str, args: tuple[Any, ...]) -> Any:
        # ExecuTorch returns a mutated user input as an extra leading output.
        x, acc = args
        y = m(x, acc)
        return [acc, y]

    prog = mf.raw_program(data)
    plan = prog.execution_plan[0]
    if len(plan.outputs) != 2 or plan.outputs[0] != plan.inputs[1]:
        raise RuntimeError(
            f"expected outputs (acc, y) with acc = input 1, got {list(plan.outputs)}"
        )
    return data, [("forward", c) for c in calls], eager, plan_summary(data)


def build_gpu_two_methods() -> tuple[bytes, Calls, Any, str]:
    from ptexec.export import to_pte

    enc, dec = Encode(nn.Linear(6, 3)), Decode(nn.Linear(3, 6))
    x, z, s = torch.randn(2, 6), torch.randn(2, 3), torch.rand(6) + 0.5
    data = to_pte(
        {"encode": copy.deepcopy(enc), "decode": copy.deepcopy(dec)},
        {"encode": (x,), "decode": (z, s)},
        device=DEVICE,
    )
    calls: Calls = [
        ("encode", (torch.randn(2, 6),)),
        ("decode", (torch.randn(2, 3), torch.rand(6) + 0.5)),
        ("encode", (torch.randn(2, 6),)),
    ]

    def eager(method: str, args: tuple[Any, ...]) -> Any:
        return (enc if method == "encode" else dec)(*args)

    return data, calls, eager, plan_summary(data)


def build_gpu_legacy() -> tuple[bytes, Calls, Any, str]:
    from ptexec.export import planning_pass

    m = mf.MLP().eval()
    calls = [(torch.randn(2, 8),), (torch.randn(2, 8),)]
    data = lower(
        {"forward": export(copy.deepcopy(m), calls[0])},
        memory_planning_pass=planning_pass(DEVICE),
        enable_non_cpu_memory_planning=False,
    )
    plan = mf.raw_program(data).execution_plan[0]
    if plan.non_const_buffer_device:
        raise RuntimeError("legacy planning wrote a non_const_buffer_device table")
    return data, [("forward", c) for c in calls], eager_of(m), plan_summary(data)


REGION = {"aten.add.Tensor", "aten.sin.default"}


def build_h2d_copy() -> tuple[bytes, Calls, Any, str]:
    m = RegionModel()
    calls = [(torch.randn(3, 4), torch.randn(3, 4)) for _ in range(3)]
    data = lower(
        {"forward": export(m, calls[0])},
        sym_shape_eval_pass=region_pass(REGION, DEVICE, insert_copies=True),
    )
    require_ops(data, present=["et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out"])
    return data, [("forward", c) for c in calls], eager_of(m), plan_summary(data)


def build_h2d_copy_legacy() -> tuple[bytes, Calls, Any, str]:
    m = RegionModel()
    calls = [(torch.randn(3, 4), torch.randn(3, 4)) for _ in range(2)]
    data = lower(
        {"forward": export(m, calls[0])},
        sym_shape_eval_pass=region_pass(REGION, DEVICE, insert_copies=False),
        enable_non_cpu_memory_planning=False,
    )
    require_ops(data, absent=["et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out"])
    return data, [("forward", c) for c in calls], eager_of(m), plan_summary(data)


def build_delegate_device() -> tuple[bytes, Calls, Any, str]:
    m = AddThenSin()
    calls = [(torch.randn(2, 3), torch.randn(2, 3)) for _ in range(2)]
    data = lower_delegated(export(m, calls[0]))
    require_ops(data, present=["et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out"])
    return data, [("forward", c) for c in calls], eager_of(m), plan_summary(data)


def build_delegate_legacy() -> tuple[bytes, Calls, Any, str]:
    m = AddOnly()
    calls = [(torch.randn(2, 3), torch.randn(2, 3)) for _ in range(2)]
    data = lower_delegated(export(m, calls[0]), enable_non_cpu_memory_planning=False)
    require_ops(data, absent=["et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out"])
    return data, [("forward", c) for c in calls], eager_of(m), plan_summary(data)


RECIPE = "Made with ptexec.export.to_pte(..., device='cuda:0'): "

FIXTURES: list[DeviceFixture] = [
    DeviceFixture(
        "gpu_mlp",
        ["mlp", "device"],
        RECIPE + "the MLP (Linear(8->16)-ReLU-Linear(16->4), float32, batch 2).",
        build_gpu_mlp,
        known_divergence=ET_NO_CUDA_ALLOCATOR,
    ),
    DeviceFixture(
        "gpu_cnn",
        ["cnn", "device"],
        RECIPE + "the CNN of 'cnn' (Conv2d, BatchNorm2d, ReLU, MaxPool2d, AdaptiveAvgPool2d, "
        "flatten, Linear), input [2, 3, 16, 16]. Tolerance allows TF32 convolutions.",
        build_gpu_cnn,
        tol=mf.TOL_CONV,
        known_divergence=ET_NO_CUDA_ALLOCATOR,
    ),
    DeviceFixture(
        "gpu_dynamic_mlp",
        ["mlp", "dynamic", "device"],
        RECIPE + "the MLP with Dim('batch', min=1, max=16), exported with batch 4; calls use "
        "batch sizes 1, 3, 16, 3. Activations are planned at the upper bound on cuda:0; the "
        "unplanned DYNAMIC_BOUND input and output follow the caller's batch.",
        build_gpu_dynamic_mlp,
        known_divergence=ET_NO_CUDA_ALLOCATOR,
    ),
    DeviceFixture(
        "gpu_stateful",
        ["stateful", "device"],
        RECIPE + "the Accumulator of 'stateful' (mutable buffers total float32[4] and count "
        "int64[1], written back with aten::copy_ each call): the state is planned in the "
        "cuda:0 buffer and survives between calls. Four calls.",
        build_gpu_stateful,
        known_divergence=ET_NO_CUDA_ALLOCATOR,
    ),
    DeviceFixture(
        "gpu_inplace",
        ["device", "input_mutation"],
        RECIPE + "forward(x, acc): acc.add_(x); return acc * 2. ExecuTorch keeps the mutated "
        "user input: an aten::copy_ writes the new acc into input 1, which is also output 0, "
        "so the outputs are [acc after the call, acc * 2]. Input 1 is unplanned, so the "
        "program writes into the caller's own tensor: after a call, the tensor passed as acc "
        "holds acc + x.",
        build_gpu_inplace,
        known_divergence=ET_NO_CUDA_ALLOCATOR,
    ),
    DeviceFixture(
        "gpu_two_methods",
        ["multimethod", "device"],
        RECIPE + "two methods from a dict: encode(x[2, 6]) = tanh(Linear(6->3)(x)) and "
        "decode(z[2, 3], scale[6]) = Linear(3->6)(z) * scale, each with its own cuda:0 "
        "buffer. Calls: encode, decode, encode.",
        build_gpu_two_methods,
        known_divergence=ET_NO_CUDA_ALLOCATOR,
    ),
    DeviceFixture(
        "gpu_legacy",
        ["mlp", "device", "legacy_device"],
        "The MLP with the recipe's labels (ptexec.export.planning_pass('cuda:0')) but "
        "ExecutorchBackendConfig(enable_non_cpu_memory_planning=False): every tensor is "
        "labelled cuda:0 while the one planned buffer has no non_const_buffer_device entry "
        "(legacy tagging). ptexec places the buffer on cuda:0 because all of its tensors "
        "name cuda:0 (BufferInfo.device_source 'tensors').",
        build_gpu_legacy,
        known_divergence=ET_LEGACY_OUTPUT,
    ),
    DeviceFixture(
        "h2d_copy",
        ["device", "et_copy"],
        "forward(a, b) = relu(sin(a * b + b)) - a on float32[3, 4], with the region "
        "{aten.add.Tensor, aten.sin} labelled cuda:0 and et_copy::_h2d_copy.out before its "
        "two inputs (a * b and b) and et_copy::_d2h_copy.out after its output, inserted by a "
        "pass the way PropagateDevicePass does around a device delegate; default "
        "(per-device) planning gives a cpu buffer and a cuda:0 buffer. Nothing is "
        "delegated: ptexec runs it, with device_map='cpu' on a machine without CUDA.",
        build_h2d_copy,
        known_divergence=ET_NO_CUDA_ALLOCATOR,
    ),
    DeviceFixture(
        "h2d_copy_legacy",
        ["device", "legacy_device"],
        "The program of 'h2d_copy' with the region's tensors (inputs and outputs included) "
        "labelled cuda:0 but no copies, and enable_non_cpu_memory_planning=False: one "
        "planned buffer, no device entry, holding tensors labelled cpu and cuda:0. Loading "
        "it without a device_map is a PteFormatError (a buffer whose tensors name different "
        "devices); with device_map='cpu' every label is cpu and it runs.",
        build_h2d_copy_legacy,
        runs=False,
        runs_note="its planned buffer holds tensors labelled cpu and cuda:0; load it with "
        "device_map='cpu'",
        load_error="PteFormatError",
        known_divergence=ET_LEGACY_INPUT,
    ),
    DeviceFixture(
        "delegate_device",
        ["device", "delegate", "et_copy"],
        "forward(a, b) = sin(a + b), float32[2, 3], with aten.add delegated to "
        "BackendWithCompilerDemo under CompileSpec target_device=b'cuda:0', default "
        "ExecutorchBackendConfig: et_copy::_h2d_copy.out for a and b, the DelegateCall, "
        "et_copy::_d2h_copy.out, aten::sin.out on the host; a cpu buffer and a cuda:0 buffer.",
        build_delegate_device,
        runs=False,
        runs_note=DELEGATE_NOTE,
        load_error="BackendUnavailableError",
        known_divergence=ET_DELEGATE_DIVERGENCE,
    ),
    DeviceFixture(
        "delegate_legacy",
        ["device", "delegate", "legacy_device"],
        "forward(a, b) = a + b, float32[2, 3], delegated to BackendWithCompilerDemo under "
        "target_device=b'cuda:0' with enable_non_cpu_memory_planning=False: no copies; the "
        "inputs and the delegate's output are labelled cuda:0 and planned in the one buffer, "
        "which has no device entry (legacy tagging; ptexec describes it as a cuda:0 buffer).",
        build_delegate_legacy,
        runs=False,
        runs_note=DELEGATE_NOTE,
        load_error="BackendUnavailableError",
        known_divergence=ET_DELEGATE_DIVERGENCE,
    ),
]


# --------------------------------------------------------------------------------------
# Write
# --------------------------------------------------------------------------------------


def program_devices(data: bytes) -> list[str]:
    from ptexec.format import program as p
    from ptexec.format.pte import read_pte

    prog = read_pte(memoryview(bytearray(data))).program
    found = set()
    for plan in prog.execution_plan:
        for e in plan.non_const_buffer_device or ():
            if e.device_type:
                found.add(f"cuda:{e.device_index}")
        for v in plan.values:
            if isinstance(v, p.Tensor) and v.device[0]:
                found.add(f"cuda:{v.device[1]}")
    return sorted(found)


def make(fx: DeviceFixture, out: Path) -> dict[str, Any]:
    torch.manual_seed(mf.seed_for(fx.name))
    with torch.no_grad():
        data, calls_in, eager, notes = fx.build()
    (out / f"{fx.name}.pte").write_bytes(data)
    calls = []
    with torch.no_grad():
        for method, args in calls_in:
            inputs = mf.flatten_values(list(args))
            outputs = mf.flatten_values(eager(method, copy.deepcopy(args)))
            calls.append({"method": method, "inputs": inputs, "outputs": outputs})
    torch.save({"calls": calls}, out / f"{fx.name}.io.pt")
    prog = mf.raw_program(data)
    unknown = set(fx.tags) - TAGS
    if unknown:
        raise ValueError(f"{fx.name}: tags outside the vocabulary: {sorted(unknown)}")
    rtol, atol = fx.tol
    entry: dict[str, Any] = {
        "pte": f"{fx.name}.pte",
        "ptd": None,
        "methods": [plan.name for plan in prog.execution_plan],
        "tags": list(fx.tags),
        "description": f"{fx.description} {notes}",
        "rtol": rtol,
        "atol": atol,
        "operators": mf.operator_names(prog),
        "devices": program_devices(data),
    }
    if not fx.runs:
        entry["runs"] = False
        entry["runs_note"] = fx.runs_note
    if fx.load_error:
        entry["load_error"] = fx.load_error
    if fx.known_divergence:
        entry["known_divergence"] = fx.known_divergence
    entry.update(fx.extra)
    return entry


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="fixtures to (re)make")
    parser.add_argument(
        "--no-check", action="store_true", help="skip replaying with executorch.runtime"
    )
    parser.add_argument("--list", action="store_true", help="list fixture names and exit")
    args = parser.parse_args(argv)
    jobs = [fx for fx in FIXTURES if not args.only or fx.name in args.only]
    if args.list:
        print("\n".join(fx.name for fx in jobs))
        return 0
    if args.only:
        missing = set(args.only) - {fx.name for fx in FIXTURES}
        if missing:
            parser.error(f"unknown fixture(s): {', '.join(sorted(missing))}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    failed = []
    for fx in jobs:
        print(f"[make] {fx.name}", flush=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                manifest[fx.name] = make(fx, out)
        except Exception as exc:
            msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            print(f"[skip] {fx.name}: exporter could not make it: {msg}", flush=True)
            failed.append(fx.name)
            manifest.pop(fx.name, None)
            for suffix in (".pte", ".io.pt"):
                (out / f"{fx.name}{suffix}").unlink(missing_ok=True)
    manifest = dict(sorted(manifest.items()))
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"[done] {len(jobs) - len(failed)} device fixtures written to {out}")
    if not args.no_check:
        import check_fixtures

        names = [fx.name for fx in jobs if fx.name in manifest]
        verdicts = check_fixtures.check(out, names=names, update_manifest=True)
        failed += [n for n, v in verdicts.items() if "unexpected" in v]
        # Errors raised inside ExecuTorch's runtime can carry a C++ trace with this
        # machine's paths: keep the first line, bounded.
        manifest = json.loads(manifest_path.read_text())
        for name in names:
            verdict = manifest[name].get("executorch_runtime", "")
            short = verdict.splitlines()[0] if verdict else verdict
            if len(short) > VERDICT_CHARS:
                short = short[:VERDICT_CHARS].rstrip() + " ..."
            manifest[name]["executorch_runtime"] = short
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
