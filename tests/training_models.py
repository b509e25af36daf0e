"""Small training programs for the training tests and benchmark: each module returns its
loss first, and each program is exported with ExecuTorch's real exporter
(``_export_forward_backward``), once per test session."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self, d_in: int = 8, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.fc2(torch.tanh(self.fc1(x)))
        return F.cross_entropy(logits, y), logits.detach()


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 8, 3, stride=2)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.relu(self.conv2(h))
        return (F.cross_entropy(self.fc(h.flatten(1)), y),)


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update ``B @ A``."""

    def __init__(self, d_in: int, d_out: int, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, d_in) / math.sqrt(d_in))
        self.lora_b = nn.Parameter(torch.zeros(d_out, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t()) @ self.lora_b.t()


class TinyLoRATransformer(nn.Module):
    """One pre-norm attention block and MLP, every weight frozen but the LoRA adapters of
    the query and value projections; regression loss on the mean token."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.q = LoRALinear(d, d)
        self.k = nn.Linear(d, d)
        self.v = LoRALinear(d, d)
        self.o = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        for frozen in (self.norm1, self.k, self.o, self.norm2, self.mlp):
            frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor]:
        b, t, d = x.shape
        h = self.norm1(x)

        def split(z: torch.Tensor) -> torch.Tensor:
            return z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.norm2(x))
        return (F.mse_loss(x.mean(dim=1), target),)


def example_inputs(name: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    if name == "mlp":
        return torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
    if name == "cnn":
        return torch.randn(2, 3, 12, 12, generator=g), torch.randint(0, 5, (2,), generator=g)
    if name == "lora":
        return torch.randn(2, 5, 16, generator=g), torch.randn(2, 16, generator=g)
    raise KeyError(name)


MODELS: dict[str, type[nn.Module]] = {"mlp": MLP, "cnn": CNN, "lora": TinyLoRATransformer}


def make_module(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]()


def export_training(
    module: nn.Module, inputs: tuple[Any, ...], *, external: bool = False
) -> tuple[bytes, bytes | None]:
    """The ``.pte`` (and with ``external``, the ``.ptd``) of ``module`` exported for
    training by ExecuTorch's exporter."""
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from torch.export.experimental import _export_forward_backward

    ep = _export_forward_backward(torch.export.export(module, inputs, strict=True))
    prog = to_edge(ep).to_executorch(ExecutorchBackendConfig(external_mutable_weights=external))
    ptd = None
    if external:
        (blob,) = prog._tensor_data.values()
        ptd = bytes(blob)
    return bytes(prog.buffer), ptd
