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
) -> bytes:
    """The ``.pte`` bytes of ``module`` exported with ExecuTorch (no delegates)."""
    pytest.importorskip("executorch")
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    ep = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes)
    config = ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(
            alloc_graph_input=not unplanned, alloc_graph_output=not unplanned
        )
    )
    return bytes(to_edge(ep).to_executorch(config).buffer)
