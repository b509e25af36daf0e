"""Small models lowered to OpenVINO the way users lower them (ExecuTorch's exporter with
``OpenvinoPartitioner``), made when the tests run: an OpenVINO payload is a model compiled
by the installed OpenVINO for this machine, so it is not kept as a file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(y.flatten(1))


class Split(MLP):
    """expm1, which OpenVINO's partitioner does not take, between two linear layers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.expm1(self.a(x)))


class TwoInTwoOut(nn.Module):
    """A float and an int64 input; a float and a bool output."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 6)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.emb(idx) * x
        return y.sum(-1), y.amax(-1) > 0


@dataclass
class Lowered:
    name: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    pte: bytes
    batch_max: int | None = None  # the bound of a dynamic batch dim


def lower(
    name: str,
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    *,
    device: bytes = b"CPU",
    batch_max: int | None = None,
    plan_inputs: bool = True,
) -> Lowered:
    from executorch.backends.openvino.partitioner import OpenvinoPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.passes import MemoryPlanningPass

    dynamic: Any = None
    if batch_max is not None:
        batch = torch.export.Dim("batch", min=1, max=batch_max)
        dynamic = tuple({0: batch} for _ in inputs)
    exported = torch.export.export(model.eval(), inputs, dynamic_shapes=dynamic)
    partitioner = OpenvinoPartitioner([CompileSpec("device", device)])
    program = to_edge_transform_and_lower(exported, partitioner=[partitioner]).to_executorch(
        ExecutorchBackendConfig(
            memory_planning_pass=MemoryPlanningPass(alloc_graph_input=plan_inputs)
        )
    )
    return Lowered(name, model, inputs, program.buffer, batch_max)


def models() -> dict[str, Lowered]:
    torch.manual_seed(0)
    return {
        "mlp": lower("mlp", MLP(), (torch.randn(2, 8),)),
        "cnn": lower("cnn", CNN(), (torch.randn(1, 3, 16, 16),)),
        "two_in_two_out": lower(
            "two_in_two_out",
            TwoInTwoOut(),
            (torch.randn(3, 5, 6), torch.randint(0, 20, (3, 5))),
        ),
        # expm1 left to the portable kernel: two OpenVINO delegates around it
        "split": lower("split", Split(), (torch.randn(2, 8),)),
        "dynamic": lower("dynamic", MLP(), (torch.randn(3, 8),), batch_max=8),
        "unplanned": lower("unplanned", MLP(), (torch.randn(2, 8),), plan_inputs=False),
    }
