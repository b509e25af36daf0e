#!/usr/bin/env python3
"""Make ptexec's test fixtures with ExecuTorch's real exporter.

Usage:
    python scripts/make_fixtures.py [--out tests/fixtures] [--only NAME ...] [--no-check]

For every fixture NAME this writes, under the output directory:

* ``NAME.pte``   the program, exported with ``torch.export`` + ``executorch.exir``;
* ``NAME.ptd``   its constants, for fixtures exported with external constants;
* ``NAME.io.pt`` ``torch.save`` of ``{"calls": [{"method", "inputs", "outputs"}, ...]}``:
  an ordered sequence of calls to replay on ONE loaded program, with the outputs that
  eager PyTorch gives for the same sequence (stateful modules are run through the same
  sequence). ``inputs`` is the flat list passed to ``method.execute(inputs)``; ``outputs``
  is the flat list ExecuTorch returns (tensors, or Python int/float/bool/None).

and one ``manifest.json`` describing all fixtures (see ``tests/fixture_data.py``).

Most fixtures come in two variants: the default export, and ``NAME_unplanned``, exported
with ``MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)`` so that graph
inputs and outputs are left to the caller.

After writing, every fixture is replayed with ExecuTorch's own runtime
(``executorch.runtime``) and the result is recorded in the manifest as
``"executorch_runtime": "ok"`` or ``"diverges: <why>"`` (see ``check_fixtures.py``).

Everything is seeded: running the script twice gives the same files.

Tag vocabulary (``TAGS``):
  mlp, cnn, transformer      model family
  dynamic                    a DYNAMIC_BOUND input dimension
  dynamic_unbound            a DYNAMIC_UNBOUND tensor in the program
  stateful                   mutable buffers carried between calls
  mutable_init               a mutable buffer with a serialized initial value
  multimethod                more than one method in the program
  shared_state               mutable state shared between methods (share_mutable_buffers)
  cond, map, scan            control-flow higher-order ops
  int_ops                    integer / bool tensors and ops
  scalar_io                  non-tensor (int/float/bool/None) inputs or outputs
  unplanned                  graph inputs/outputs not memory planned
  external_data              constants in a separate .ptd file
  channels_last              a channels-last (dim order [0, 2, 3, 1]) input
  half                       float16 or bfloat16 tensors
  data_dependent             a data-dependent output shape
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim, ExportedProgram, export

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures"

TAGS = frozenset(
    {
        "mlp",
        "cnn",
        "transformer",
        "dynamic",
        "dynamic_unbound",
        "stateful",
        "mutable_init",
        "multimethod",
        "shared_state",
        "cond",
        "map",
        "scan",
        "int_ops",
        "scalar_io",
        "unplanned",
        "external_data",
        "channels_last",
        "half",
        "data_dependent",
    }
)

# Tolerances. Float32 fixtures without convolutions are tight; convolutions get room for
# TF32 (cuDNN allows it by default on CUDA); half types get room for their precision.
TOL_F32 = (1e-4, 1e-5)
TOL_F32_ATTN = (1e-4, 1e-4)
TOL_CONV = (2e-3, 2e-3)
TOL_F16 = (1e-2, 1e-2)
TOL_BF16 = (3e-2, 3e-2)


# --------------------------------------------------------------------------------------
# Fixture description
# --------------------------------------------------------------------------------------


@dataclass
class Built:
    """What a fixture builder returns.

    ``exported`` maps method name to ExportedProgram. ``calls`` is the call sequence as
    (method, args); ``eager`` runs one call on the eager model (keeping its state between
    calls). ``config`` holds extra ExecutorchBackendConfig keyword arguments and
    ``planning`` extra MemoryPlanningPass keyword arguments.
    """

    exported: dict[str, ExportedProgram]
    calls: list[tuple[str, tuple[Any, ...]]]
    eager: Callable[[str, tuple[Any, ...]], Any]
    config: dict[str, Any] = field(default_factory=dict)
    planning: dict[str, Any] = field(default_factory=dict)
    # Called with (ExecutorchProgramManager, raw program) after export; returns notes to
    # append to the description, or raises if the program is not what the fixture wants.
    inspect: Callable[[Any, Any], str] | None = None
    external: bool = False


@dataclass
class FixtureSpec:
    name: str
    tags: list[str]
    description: str
    build: Callable[[str], Built]  # receives the fixture (variant) name
    tol: tuple[float, float] = TOL_F32
    unplanned: bool = True  # also make NAME_unplanned
    # Why ExecuTorch's runtime is expected to disagree with eager, when it is.
    known_divergence: str | None = None


def seed_for(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def single(
    module: nn.Module,
    example: tuple[Any, ...],
    call_args: Sequence[tuple[Any, ...]],
    dynamic_shapes: Any = None,
    **built_kwargs: Any,
) -> Built:
    """A one-method ('forward') fixture; the eager replay runs on `module` itself."""
    ep = export(copy.deepcopy(module), example, dynamic_shapes=dynamic_shapes)

    def eager(method: str, args: tuple[Any, ...]) -> Any:
        assert method == "forward"
        return module(*args)

    return Built(
        exported={"forward": ep},
        calls=[("forward", tuple(a)) for a in call_args],
        eager=eager,
        **built_kwargs,
    )


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d_in: int = 8, d_hidden: int = 16, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def randomize_bn(bn: nn.BatchNorm2d) -> None:
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)
        randomize_bn(self.bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(self.gap(x), 1))


class Block(nn.Module):
    """Pre-norm transformer block with causal multi-head attention."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(d, dim=-1)
        q = q.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Accumulator(nn.Module):
    """Running sum and call counter, both mutated in forward."""

    def __init__(self, init_total: torch.Tensor | None = None, init_count: int = 0) -> None:
        super().__init__()
        total = torch.zeros(4) if init_total is None else init_total
        self.register_buffer("total", total.clone())
        self.register_buffer("count", torch.tensor([init_count], dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.total.add_(x)
        self.count.add_(1)
        mean = self.total / self.count.to(torch.float32)
        return mean, self.total.clone(), self.count.clone()


class CounterState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("counter", torch.zeros(1, dtype=torch.int64))


class StepMethod(nn.Module):
    def __init__(self, state: CounterState) -> None:
        super().__init__()
        self.state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.counter.add_(1)
        return self.state.counter + 0


class OtherMethod(nn.Module):
    """Stateless: returns 2 * x through a few intermediates (planned activations)."""

    def __init__(self, state: CounterState) -> None:
        super().__init__()
        self.state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 1.0
        z = y * 4.0
        w = z - 4.0
        return w / 2.0


class SharedState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(4))


class IncMethod(nn.Module):
    def __init__(self, shared: SharedState) -> None:
        super().__init__()
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shared.state.add_(x)
        return self.shared.state * 1.0


class ReadMethod(nn.Module):
    def __init__(self, shared: SharedState) -> None:
        super().__init__()
        self.shared = shared

    def forward(self) -> torch.Tensor:
        return self.shared.state.clone()


class CondModel(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def positive(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.sin() + y

        def negative(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.cos() * y - 1.0

        return torch.cond(x.sum() > 0, positive, negative, (x, y))


# Planner note: ExecuTorch 1.5.1's planner loses the map/scan body's arena when the
# top-level graph has no planned tensor of its own: with alloc_graph_input=False and alloc_graph_output=False
# and nothing else at the top level, `apply_algo` runs no per-device planning (it loops
# over the devices of the top-level specs, and there are none), so the submodule buffer
# sizes never reach non_const_buffer_sizes: the program says [0, 0] while the body's
# tensors sit at offsets in buffer 1, and ExecuTorch refuses to load it
# ("offset_bytes (48) + size_bytes (24) >= allocator size (0)"). A little top-level work
# before and after the loop gives the top level planned tensors and a correct plan.
class MapModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 3))

    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.map import map as hop_map

        def body(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return (x @ w) * 2.0 + y

        # The top-level ops around the map matter: see the planner note above.
        return hop_map(body, xs - 1.0, y, self.weight).relu()


class ScanModel(nn.Module):
    def forward(self, init: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from torch._higher_order_ops.scan import scan

        def combine(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            new = carry * 0.5 + x
            return new, new.sum(0, keepdim=True) + 0.0

        # The top-level ops around the scan matter: see the planner note above MapModel.
        carry, ys = scan(combine, init, xs * 1.5)
        return carry - 1.0, ys.relu()


class IntOps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor, x: torch.Tensor, k: torch.Tensor):  # type: ignore[no-untyped-def]
        e = self.emb(ids)  # [2, 5, 4] float
        best = e.sum(-1).argmax(dim=1)  # int64 [2]
        pos = x > 0  # bool
        small = ids < 5
        both = pos & small
        either = pos | ~small
        only_one = pos ^ small
        w = torch.where(both, x, -x)
        cs = torch.cumsum(ids, dim=1)
        arith = torch.remainder(torch.floor_divide(ids * 3 + 7, 2), 5) - k
        narrow = ids.to(torch.int32) * 2 + 1
        eq = (ids == k).to(torch.int64).sum(1)
        return best, both, either, only_one, w, cs, arith, narrow, eq


class ScalarIO(nn.Module):
    def forward(self, x: torch.Tensor, alpha: float, n: int, flag: bool):  # type: ignore[no-untyped-def]
        y = x * alpha + n
        if flag:
            y = torch.relu(y)
        rows = x.shape[0]
        return y, rows, rows * n + 1, None, alpha * 2.0, flag, rows / 2


class SmallCNN(nn.Module):
    # No batch norm: ExecuTorch's portable batch-norm kernel refuses channels-last input.
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel_size=3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feat = torch.relu(self.conv(x))
        return feat, self.fc(feat.mean(dim=(2, 3)))


class MaskedSum(nn.Module):
    """Boolean-mask indexing: the selected values have a data-dependent length."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        picked = x[x > 0]
        return (picked * 2.0).sum().reshape(1), x.cumsum(0)


# --------------------------------------------------------------------------------------
# Raw-program helpers (used by inspections)
# --------------------------------------------------------------------------------------


def raw_program(data: bytes) -> Any:
    """The flatbuffer Program with its segment tables intact (not restored inline)."""
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header

    eh = _get_extended_header(data)
    size = eh.program_size if eh is not None and eh.is_valid() else len(data)
    return _flatbuffer_to_program(data[:size])


def tensor_values(plan: Any) -> list[tuple[int, Any]]:
    return [(i, v.val) for i, v in enumerate(plan.values) if type(v.val).__name__ == "Tensor"]


def describe_io(plan: Any) -> str:
    def one(i: int) -> str:
        val = plan.values[i].val
        kind = type(val).__name__
        if kind == "Tensor":
            dyn = ["STATIC", "DYNAMIC_BOUND", "DYNAMIC_UNBOUND"][int(val.shape_dynamism)]
            return f"Tensor{list(val.sizes)}/{dyn}"
        if kind == "Int":
            return f"Int({val.int_val})"
        if kind == "Double":
            return f"Double({val.double_val})"
        if kind == "Bool":
            return f"Bool({val.bool_val})"
        return kind

    ins = ", ".join(one(i) for i in plan.inputs)
    outs = ", ".join(one(i) for i in plan.outputs)
    return f"{plan.name}: inputs [{ins}] -> outputs [{outs}]"


# --------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------


def build_mlp(name: str) -> Built:
    m = MLP().eval()
    calls = [(torch.randn(2, 8),), (torch.randn(2, 8),), (torch.randn(2, 8) * 3,)]
    return single(m, calls[0], calls)


def build_cnn(name: str) -> Built:
    m = CNN().eval()
    calls = [(torch.randn(2, 3, 16, 16),), (torch.randn(2, 3, 16, 16),)]
    return single(m, calls[0], calls)


def build_transformer(name: str) -> Built:
    m = Block().eval()
    calls = [(torch.randn(2, 6, 16),), (torch.randn(2, 6, 16),)]
    return single(m, calls[0], calls)


def build_dynamic_mlp(name: str) -> Built:
    m = MLP().eval()
    batch = Dim("batch", min=1, max=16)
    calls = [(torch.randn(b, 8),) for b in (1, 3, 16, 3)]
    return single(m, (torch.randn(4, 8),), calls, dynamic_shapes={"x": {0: batch}})


def build_stateful(name: str) -> Built:
    m = Accumulator()
    calls = [(torch.randn(4),) for _ in range(4)]
    return single(m, calls[0], calls)


def build_mutable_init(name: str) -> Built:
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    m = Accumulator(init_total=torch.tensor([1.0, -2.0, 3.0, 0.5]), init_count=5)
    calls = [(torch.randn(4),) for _ in range(3)]

    def inspect(et: Any, prog: Any) -> str:
        segs = prog.mutable_data_segments or []
        if not segs or len(segs[0].offsets) < 2:
            raise RuntimeError("mutable_init: program has no mutable_data_segments")
        idx = []
        for _, t in tensor_values(prog.execution_plan[0]):
            if t.data_buffer_idx and t.allocation_info is not None:
                idx.append(t.data_buffer_idx)
        return (
            f"mutable_data_segments[0]: segment {segs[0].segment_index}, "
            f"offsets {list(segs[0].offsets)}; planned tensors with initial state use "
            f"data_buffer_idx {sorted(set(idx))}."
        )

    return single(
        m,
        calls[0],
        calls,
        config={"passes": [InitializedMutableBufferPass(["total", "count"])]},
        inspect=inspect,
    )


def build_two_method_state(name: str) -> Built:
    base = CounterState()
    step, other = StepMethod(base), OtherMethod(base)
    ex = (torch.randn(8),)
    exported = {
        "step": export(StepMethod(copy.deepcopy(base)), ex),
        "other": export(OtherMethod(copy.deepcopy(base)), ex),
    }
    seq = ["step", "step", "other", "step", "other", "step", "step"]
    calls = [(m, (torch.randn(8),)) for m in seq]

    def eager(method: str, args: tuple[Any, ...]) -> Any:
        return (step if method == "step" else other)(*args)

    def inspect(et: Any, prog: Any) -> str:
        notes = []
        for plan in prog.execution_plan:
            sizes = list(plan.non_const_buffer_sizes)
            notes.append(f"{plan.name}: non_const_buffer_sizes {sizes}")
            if plan.name == "step":
                for i, t in tensor_values(plan):
                    if list(t.sizes) == [1] and int(t.scalar_type) == 4 and t.allocation_info:
                        a = t.allocation_info
                        notes.append(
                            f"step int64[1] value {i} at memory_id {a.memory_id} "
                            f"offset {a.memory_offset_low}"
                        )
        head = "Plan (the first step int64[1] value is the counter buffer): "
        return head + "; ".join(notes) + "."

    return Built(exported, calls, eager, inspect=inspect)


def build_shared_state(name: str) -> Built:
    base = SharedState()
    inc, read = IncMethod(base), ReadMethod(base)
    exported = {
        "inc": export(IncMethod(copy.deepcopy(base)), (torch.randn(4),)),
        "read": export(ReadMethod(copy.deepcopy(base)), ()),
    }
    seq = ["read", "inc", "read", "inc", "inc", "read", "read"]
    calls = [(m, (torch.randn(4),) if m == "inc" else ()) for m in seq]

    def eager(method: str, args: tuple[Any, ...]) -> Any:
        return (inc if method == "inc" else read)(*args)

    def inspect(et: Any, prog: Any) -> str:
        notes = []
        for plan in prog.execution_plan:
            for i, t in tensor_values(plan):
                info = t.extra_tensor_info
                if info is not None and info.fully_qualified_name:
                    a = t.allocation_info
                    notes.append(
                        f"{plan.name}: value {i} '{info.fully_qualified_name}' at memory_id "
                        f"{a.memory_id} offset {a.memory_offset_low} "
                        f"(non_const_buffer_sizes {list(plan.non_const_buffer_sizes)})"
                    )
                    if a.memory_id != 2:
                        raise RuntimeError("shared_state: shared buffer not in memory_id 2")
        if not notes:
            raise RuntimeError("shared_state: no named mutable buffer found")
        return (
            "The shared state lives in planned buffer memory_id 2, i.e. "
            "non_const_buffer_sizes[2] (the second planned buffer; index 0 is reserved), "
            "the same index, offset and size in every method; activations use memory_id 1. "
            + "; ".join(notes)
            + "."
        )

    return Built(
        exported,
        calls,
        eager,
        config={"emit_mutable_buffer_names": True},
        planning={"share_mutable_buffers": True},
        inspect=inspect,
    )


def build_cond(name: str) -> Built:
    m = CondModel()
    calls = []
    for sign in (1.0, -1.0, 1.0, -1.0):
        x = torch.rand(3, 4) * sign
        calls.append((x, torch.randn(3, 4)))
    return single(m, calls[0], calls)


def build_map(name: str) -> Built:
    m = MapModel()
    calls = [(torch.randn(4, 2, 3), torch.randn(3)) for _ in range(2)]
    return single(m, calls[0], calls)


def build_scan(name: str) -> Built:
    m = ScanModel()
    calls = [(torch.randn(2, 3), torch.randn(5, 2, 3)) for _ in range(2)]
    return single(m, calls[0], calls)


def build_int_ops(name: str) -> Built:
    m = IntOps().eval()
    calls = [(torch.randint(0, 10, (2, 5)), torch.randn(2, 5), torch.tensor(3)) for _ in range(3)]
    return single(m, calls[0], calls)


def build_scalar_io(name: str) -> Built:
    m = ScalarIO()
    rows = Dim("rows", min=1, max=8)
    # alpha, n and flag are specialized by torch.export: every call must pass the traced
    # values again (ExecuTorch checks them; it cannot change them).
    calls = [(torch.randn(r, 3), 0.5, 3, True) for r in (2, 5, 8)]

    def inspect(et: Any, prog: Any) -> str:
        return "Program IO: " + describe_io(prog.execution_plan[0]) + "."

    return single(
        m,
        calls[0],
        calls,
        dynamic_shapes={"x": {0: rows}, "alpha": None, "n": None, "flag": None},
        inspect=inspect,
    )


def build_external(name: str) -> Built:
    m = MLP().eval()
    calls = [(torch.randn(2, 8),), (torch.randn(2, 8),)]

    def tag(node: torch.fx.Node) -> str:
        return name  # all constants go to NAME.ptd

    def inspect(et: Any, prog: Any) -> str:
        ext = [
            t.extra_tensor_info.fully_qualified_name
            for _, t in tensor_values(prog.execution_plan[0])
            if t.extra_tensor_info is not None and int(t.extra_tensor_info.location) == 1
        ]
        if not ext:
            raise RuntimeError("external: no EXTERNAL tensors in the program")
        return f"External tensor keys: {sorted(ext)}."

    return single(
        m,
        calls[0],
        calls,
        config={"external_constants": tag},
        inspect=inspect,
        external=True,
    )


def build_channels_last(name: str) -> Built:
    m = SmallCNN().eval()
    cl = torch.channels_last
    calls = [(torch.randn(2, 3, 8, 8).to(memory_format=cl),) for _ in range(2)]

    def inspect(et: Any, prog: Any) -> str:
        plan = prog.execution_plan[0]
        orders = []
        for kind, idxs in (("input", plan.inputs), ("output", plan.outputs)):
            for i in idxs:
                orders.append(f"{kind} {i} dim_order {list(plan.values[i].val.dim_order)}")
        if list(plan.values[plan.inputs[0]].val.dim_order) != [0, 2, 3, 1]:
            raise RuntimeError("channels_last: input dim order is not [0, 2, 3, 1]")
        return "Dim orders: " + "; ".join(orders) + "."

    return single(m, calls[0], calls, inspect=inspect)


def build_half(dtype: torch.dtype) -> Callable[[str], Built]:
    def build(name: str) -> Built:
        m = MLP().eval().to(dtype)
        calls = [(torch.randn(2, 8).to(dtype),) for _ in range(2)]
        return single(m, calls[0], calls)

    return build


def mark_data_dependent_unbound_pass() -> Any:
    """A sym-shape-eval pass that marks tensors with data-dependent sizes DYNAMIC_UNBOUND.

    ExecuTorch 1.5.1's exporter never marks a tensor DYNAMIC_UNBOUND on its own: its
    default ConstraintBasedSymShapeEvalPass gives every data-dependent size its upper bound
    (DYNAMIC_BOUND) or fails when there is none. This pass runs the default one, then
    marks every non-output tensor whose fake value has unbacked symbols in its shape.
    Graph outputs stay DYNAMIC_BOUND (the planner requires outputs all planned or none).
    """
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass
    from executorch.exir.schema import TensorShapeDynamism
    from executorch.exir.tensor import TensorSpec
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    from torch.utils import _pytree as pytree

    class _Pass(ConstraintBasedSymShapeEvalPass):
        def call(self, graph_module: torch.fx.GraphModule) -> Any:
            marked = []
            for sub in graph_module.modules():
                if not isinstance(sub, torch.fx.GraphModule):
                    continue
                output_node = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
                returned = {id(a) for a in pytree.tree_flatten(output_node.args)[0]}
                for node in sub.graph.nodes:
                    if id(node) in returned or node.op in ("placeholder", "output"):
                        continue
                    specs = pytree.tree_flatten(node.meta.get("spec", []))[0]
                    vals = pytree.tree_flatten(node.meta.get("val"))[0]
                    for spec, val in zip(specs, vals, strict=False):
                        if (
                            isinstance(spec, TensorSpec)
                            and isinstance(val, torch.Tensor)
                            and free_unbacked_symbols(val.shape)
                        ):
                            marked.append(spec)
            result = super().call(graph_module)
            for spec in marked:
                spec.shape_dynamism = TensorShapeDynamism.DYNAMIC_UNBOUND
            return result

    return _Pass()


def build_dynamic_unbound(name: str) -> Built:
    m = MaskedSum()
    calls = [
        (torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, 0.5]),),
        (torch.randn(6),),
        (-torch.rand(6),),  # nothing selected: an empty intermediate
    ]

    def inspect(et: Any, prog: Any) -> str:
        plan = prog.execution_plan[0]
        unbound = [
            f"value {i} sizes {list(t.sizes)}"
            for i, t in tensor_values(plan)
            if int(t.shape_dynamism) == 2
        ]
        if not unbound:
            raise RuntimeError("dynamic_unbound: no DYNAMIC_UNBOUND tensor in the program")
        return (
            "DYNAMIC_UNBOUND tensors (unplanned, no allocation_info): " + "; ".join(unbound) + "."
        )

    return single(
        m,
        calls[0],
        calls,
        config={"sym_shape_eval_pass": mark_data_dependent_unbound_pass()},
        inspect=inspect,
    )


TWO_METHOD_DIVERGENCE = (
    "executorch.runtime gives every host-only method of a program one shared set of "
    "planned arenas, so 'other' overwrites the planned 'counter' buffer of 'step'; the "
    "counter is corrupted after the first 'other' call"
)
UNBOUND_DIVERGENCE = (
    "the portable tensor parser rejects DYNAMIC_UNBOUND tensors at method load "
    "(NotSupported: 'Fully dynamic tensor shapes not yet supported')"
)

FIXTURES: list[FixtureSpec] = [
    FixtureSpec(
        "mlp",
        ["mlp"],
        "Linear(8->16)-ReLU-Linear(16->4), float32, batch 2.",
        build_mlp,
    ),
    FixtureSpec(
        "cnn",
        ["cnn"],
        "Conv2d(3->8, 3x3, pad 1), BatchNorm2d (eval, non-trivial running stats), ReLU, "
        "MaxPool2d(2), AdaptiveAvgPool2d(1), flatten, Linear(8->5); input [2, 3, 16, 16] "
        "float32. Tolerance allows TF32 convolutions.",
        build_cnn,
        tol=TOL_CONV,
    ),
    FixtureSpec(
        "transformer",
        ["transformer"],
        "Pre-norm transformer block, dim 16, 2 heads, seq 6, batch 2: LayerNorm, fused qkv "
        "Linear, F.scaled_dot_product_attention(is_causal=True), output projection, "
        "residual, LayerNorm, Linear-GELU-Linear MLP, residual. float32.",
        build_transformer,
        tol=TOL_F32_ATTN,
    ),
    FixtureSpec(
        "dynamic_mlp",
        ["mlp", "dynamic"],
        "The MLP with a dynamic batch dimension Dim('batch', min=1, max=16), exported with "
        "batch 4; the calls use batch sizes 1, 3, 16, 3 (DYNAMIC_BOUND input and output, "
        "upper bound 16).",
        build_dynamic_mlp,
    ),
    FixtureSpec(
        "stateful",
        ["stateful"],
        "Two mutable buffers, total (float32[4], +=x) and count (int64[1], +=1), mutated in "
        "forward; returns (total / count, total, count). Four calls. The initial state is "
        "not serialized (no et_init_buffer): ExecuTorch starts from zero-filled planned "
        "memory, which is what the eager module starts from.",
        build_stateful,
    ),
    FixtureSpec(
        "mutable_init",
        ["stateful", "mutable_init"],
        "Like 'stateful' but the buffers start non-zero (total = [1, -2, 3, 0.5], count = 5) "
        "and InitializedMutableBufferPass(['total', 'count']) marks them et_init_buffer, so "
        "their initial values are serialized in the program's mutable data segment and "
        "copied into planned memory at method load.",
        build_mutable_init,
    ),
    FixtureSpec(
        "two_method_state",
        ["multimethod", "stateful"],
        "One program, two methods. 'step'(x: float32[8]) increments an int64[1] counter "
        "buffer (a mutable buffer planned in step's buffer 1; initial state not serialized, "
        "i.e. zero-filled memory) and returns counter + 0; 'other'(x: float32[8]) is stateless and returns "
        "((x + 1) * 4 - 4) / 2 through planned intermediates. Sequence: step, step, other, "
        "step, other, step, step; eager counter goes 1, 2, 3, 4, 5.",
        build_two_method_state,
        unplanned=False,
        known_divergence=TWO_METHOD_DIVERGENCE,
    ),
    FixtureSpec(
        "shared_state",
        ["multimethod", "stateful", "shared_state"],
        "One program, two methods sharing one mutable buffer 'shared.state' (float32[4]), "
        "exported with MemoryPlanningPass(share_mutable_buffers=True) and "
        "ExecutorchBackendConfig(emit_mutable_buffer_names=True): 'inc'(x) adds x to the "
        "state and returns state * 1; 'read'() (no inputs) returns a copy of the state. "
        "Sequence: read, inc, read, inc, inc, read, read; each read sees what inc wrote.",
        build_shared_state,
        unplanned=False,
    ),
    FixtureSpec(
        "cond",
        ["cond"],
        "torch.cond(x.sum() > 0, sin(x) + y, cos(x) * y - 1) on float32[3, 4] inputs; the "
        "calls alternate positive and negative x so both branches run (JumpFalseCall / "
        "MoveCall in the program).",
        build_cond,
    ),
    FixtureSpec(
        "map",
        ["map"],
        "torch._higher_order_ops.map over xs float32[4, 2, 3] with extra operands y[3] and "
        "a 3x3 weight: relu(map(body, xs - 1)), body (x @ w) * 2 + y, results stacked into "
        "[4, 2, 3] (loop via JumpFalseCall and executorch_prim::et_copy_index). The top-level "
        "ops around the map work around an ExecuTorch 1.5.1 planner bug for the unplanned "
        "variant (with nothing planned at the top level the body's arena size is lost).",
        build_map,
    ),
    FixtureSpec(
        "scan",
        ["scan"],
        "torch._higher_order_ops.scan with carry float32[2, 3] over xs[5, 2, 3] * 1.5: "
        "carry' = carry * 0.5 + x, per-step output carry'.sum(0, keepdim=True); returns "
        "(final carry - 1 [2, 3], relu(stacked outputs) [5, 1, 3]). The top-level ops "
        "around the scan work around the same planner bug as 'map'.",
        build_scan,
    ),
    FixtureSpec(
        "int_ops",
        ["int_ops"],
        "Inputs ids int64[2, 5] in [0, 10), x float32[2, 5], k int64[] (0-dim). Embedding(10, "
        "4), argmax, comparisons, bool &, |, ^, ~, torch.where, cumsum, floor_divide, "
        "remainder, int64->int32 cast and int32 arithmetic, equality count. Outputs: "
        "int64, bool, float32 and int32 tensors (ints/bools compared exactly).",
        build_int_ops,
    ),
    FixtureSpec(
        "scalar_io",
        ["scalar_io", "dynamic"],
        "forward(x: float32[rows, 3] with Dim('rows', 1..8), alpha: float, n: int, flag: "
        "bool) -> (relu(x * alpha + n), rows, rows * n + 1, None, alpha * 2.0, flag, "
        "rows / 2). torch.export specializes the Python scalars: the program keeps them as "
        "Double/Int/Bool inputs with the traced values (0.5, 3, True), which every call must "
        "pass unchanged. rows and rows * n + 1 are computed at run time (aten::sym_size.int, "
        "executorch_prim::mul.Scalar / add.Scalar) into Int outputs; None is a Null output; "
        "alpha * 2.0 and flag are constant Double(1.0) / Bool(True) outputs; rows / 2 is "
        "computed by executorch_prim::truediv.Scalar, which writes a Double into an output "
        "EValue that the program declares as Int(0) (the kind changes at run time). "
        "Outputs per call: [Tensor, int, int, None, float, bool, float].",
        build_scalar_io,
    ),
    FixtureSpec(
        "external",
        ["mlp", "external_data"],
        "The MLP exported with ExecutorchBackendConfig(external_constants=<callable naming "
        "the fixture>), so every weight and bias lives in NAME.ptd (FlatTensor, 'FT01') "
        "and the .pte holds only EXTERNAL tensor references keyed by fully qualified name.",
        build_external,
    ),
    FixtureSpec(
        "channels_last",
        ["cnn", "channels_last"],
        "Conv2d(3->4, 3x3, pad 1), ReLU, exported with a "
        "torch.channels_last example input [2, 3, 8, 8]; returns (feature map [2, 4, 8, 8], "
        "Linear(4->3) of its spatial mean). Call inputs are channels-last tensors. A "
        "contiguous (NCHW) input is accepted silently by ExecuTorch 1.5.1's runtime and gives "
        "wrong values (set_input moves raw bytes without checking the dim order). "
        "Tolerance allows TF32 convolutions.",
        build_channels_last,
        tol=TOL_CONV,
    ),
    FixtureSpec(
        "half_mlp",
        ["mlp", "half"],
        "The MLP in float16 (weights, input and output).",
        build_half(torch.float16),
        tol=TOL_F16,
    ),
    FixtureSpec(
        "bf16_mlp",
        ["mlp", "half"],
        "The MLP in bfloat16 (weights, input and output).",
        build_half(torch.bfloat16),
        tol=TOL_BF16,
    ),
    FixtureSpec(
        "dynamic_unbound",
        ["dynamic_unbound", "data_dependent"],
        "x float32[6] -> ((x[x > 0] * 2).sum().reshape(1), x.cumsum(0)). The mask-indexed "
        "intermediate has a data-dependent length. ExecuTorch 1.5.1's default export gives "
        "it DYNAMIC_BOUND with upper bound 6; this fixture passes a custom sym_shape_eval_pass "
        "(ExecutorchBackendConfig(sym_shape_eval_pass=...)) that marks the data-dependent "
        "intermediates DYNAMIC_UNBOUND, so the planner leaves them unplanned and a runtime "
        "must allocate them. No FreeCall is emitted: 1.5.1's planner only inserts frees for "
        "specs it collected, and it skips DYNAMIC_UNBOUND specs. The last call selects "
        "nothing (empty intermediate).",
        build_dynamic_unbound,
        unplanned=False,
        known_divergence=UNBOUND_DIVERGENCE,
    ),
]


# --------------------------------------------------------------------------------------
# Export and write
# --------------------------------------------------------------------------------------


def flatten_values(obj: Any) -> list[Any]:
    """Flatten a pytree the way ExecuTorch flattens method inputs/outputs (None kept)."""
    from torch.utils import _pytree as pytree

    leaves = pytree.tree_flatten(obj, is_leaf=lambda x: x is None)[0]
    out: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append(leaf.detach().clone(memory_format=torch.preserve_format))
        elif isinstance(leaf, torch.SymInt | torch.SymFloat | torch.SymBool):
            raise TypeError(f"symbolic value in eager output: {leaf!r}")
        else:
            out.append(leaf)
    return out


def to_executorch(built: Built, unplanned: bool) -> Any:
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    planning = dict(built.planning)
    if unplanned:
        planning.update(alloc_graph_input=False, alloc_graph_output=False)
    config = ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(**planning), **built.config
    )
    edge = to_edge(built.exported)
    return edge.to_executorch(config)


def make_fixture(spec: FixtureSpec, unplanned: bool, out: Path) -> dict[str, Any]:
    name = spec.name + ("_unplanned" if unplanned else "")
    torch.manual_seed(seed_for(spec.name))  # same weights/inputs for both variants
    with torch.no_grad():
        built = spec.build(name)
    et = to_executorch(built, unplanned)
    data = et.buffer
    prog = raw_program(data)

    pte = out / f"{name}.pte"
    pte.write_bytes(data)
    ptd: str | None = None
    if built.external:
        et.write_tensor_data_to_file(str(out))
        if not (out / f"{name}.ptd").exists():
            raise RuntimeError(f"{name}: expected {name}.ptd to be written")
        ptd = f"{name}.ptd"

    calls = []
    with torch.no_grad():
        for method, args in built.calls:
            inputs = flatten_values(list(args))
            outputs = flatten_values(built.eager(method, copy.deepcopy(args)))
            calls.append({"method": method, "inputs": inputs, "outputs": outputs})
    torch.save({"calls": calls}, out / f"{name}.io.pt")

    description = spec.description
    if unplanned:
        description += (
            " Variant exported with MemoryPlanningPass(alloc_graph_input=False, "
            "alloc_graph_output=False): graph inputs and outputs are not planned."
        )
    if built.inspect is not None:
        description += " " + built.inspect(et, prog)

    methods = [plan.name for plan in prog.execution_plan]
    tags = list(spec.tags) + (["unplanned"] if unplanned else [])
    if len(methods) > 1 and "multimethod" not in tags:
        tags.append("multimethod")
    unknown = set(tags) - TAGS
    if unknown:
        raise ValueError(f"{name}: tags outside the vocabulary: {sorted(unknown)}")
    rtol, atol = spec.tol
    entry: dict[str, Any] = {
        "pte": pte.name,
        "ptd": ptd,
        "methods": methods,
        "tags": tags,
        "description": description,
        "rtol": rtol,
        "atol": atol,
        "operators": operator_names(prog),
    }
    if spec.known_divergence:
        entry["known_divergence"] = spec.known_divergence
    return {name: entry}


def operator_names(prog: Any) -> list[str]:
    names = set()
    for plan in prog.execution_plan:
        for op in plan.operators:
            names.add(f"{op.name}.{op.overload}" if op.overload else op.name)
    return sorted(names)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="fixtures to (re)make (base names or variants)"
    )
    parser.add_argument(
        "--no-check", action="store_true", help="skip replaying with executorch.runtime"
    )
    parser.add_argument("--list", action="store_true", help="list fixture names and exit")
    args = parser.parse_args(argv)

    jobs = []
    for spec in FIXTURES:
        for unplanned in (False, True) if spec.unplanned else (False,):
            variant = spec.name + ("_unplanned" if unplanned else "")
            if args.only and spec.name not in args.only and variant not in args.only:
                continue
            jobs.append((spec, unplanned, variant))
    if args.list:
        for _, _, variant in jobs:
            print(variant)
        return 0
    if args.only:
        known = {v for _, _, v in jobs} | {s.name for s, _, _ in jobs}
        missing = [n for n in args.only if n not in known]
        if missing:
            parser.error(f"unknown fixture(s): {', '.join(missing)}")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    # entries made by the other fixture scripts (device, quantized, ...) are kept
    manifest: dict[str, Any] = (
        json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    )
    if not args.only:
        for _, _, variant in jobs:
            manifest.pop(variant, None)

    failed = []
    for spec, unplanned, variant in jobs:
        print(f"[make] {variant}", flush=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                manifest.update(make_fixture(spec, unplanned, out))
        except Exception as exc:  # a fixture the exporter cannot make: report, go on
            msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            print(f"[skip] {variant}: exporter could not make it: {msg}", flush=True)
            failed.append(variant)
            manifest.pop(variant, None)
            for suffix in (".pte", ".ptd", ".io.pt"):
                (out / f"{variant}{suffix}").unlink(missing_ok=True)

    manifest = dict(sorted(manifest.items()))
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"[done] wrote {len(manifest)} fixtures to {out}")

    if not args.no_check:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import check_fixtures

        names = None if not args.only else [v for _, _, v in jobs if v in manifest]
        verdicts = check_fixtures.check(out, names=names, update_manifest=True)
        failed += [n for n, v in verdicts.items() if "unexpected" in v]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
