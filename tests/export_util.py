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
