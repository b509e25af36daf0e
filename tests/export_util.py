"""Export small programs on the fly with ExecuTorch's exporter (tests that need it skip
when executorch is not installed)."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def export_program(
    module: torch.nn.Module,
    inputs: tuple[Any, ...],
    *,
    unplanned: bool = False,
    dynamic_shapes: Any = None,
    naive_plan: bool = False,
) -> bytes:
    """The ``.pte`` bytes of ``module`` exported with ExecuTorch (no delegates); with
    ``naive_plan``, every planned tensor gets bytes of its own (ExecuTorch's naive
    memory planning algorithm, where the default greedy one reuses bytes)."""
    pytest.importorskip("executorch")
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.memory_planning import MemoryPlanningAlgorithmSuite, naive
    from executorch.exir.passes import MemoryPlanningPass

    ep = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes)
    algo = MemoryPlanningAlgorithmSuite(algo_list=[naive]) if naive_plan else None
    config = ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(
            memory_planning_algo=algo,
            alloc_graph_input=not unplanned,
            alloc_graph_output=not unplanned,
        )
    )
    return bytes(to_edge(ep).to_executorch(config).buffer)


class _OneOp(torch.nn.Module):
    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def forward(self, *xs: torch.Tensor) -> Any:
        return self.op(*xs)


def one_op_program(op: Any, inputs: tuple[torch.Tensor, ...]) -> bytes:
    """The ``.pte`` bytes of a method calling ``op`` on its inputs (a custom op the edge
    dialect's checks do not know is taken as it is)."""
    pytest.importorskip("executorch")
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(_OneOp(op), inputs)
    config = EdgeCompileConfig(_check_ir_validity=False)
    return bytes(to_edge(ep, compile_config=config).to_executorch().buffer)


def xnnpack_program(
    module: torch.nn.Module, inputs: tuple[Any, ...], dynamic_shapes: Any = None
) -> bytes:
    """The ``.pte`` bytes of ``module`` with every part XNNPACK takes lowered to it."""
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes)
    lowered = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    return bytes(lowered.to_executorch().buffer)
