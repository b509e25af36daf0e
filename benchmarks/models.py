"""Models the benchmarks export in addition to the test fixtures."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """A pre-norm transformer block: layer norm, causal attention (SDPA), GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TransformerStack(nn.Module):
    """Four transformer blocks (d=256, 4 heads): a larger transformer for the benchmark."""

    def __init__(self, dim: int = 256, heads: int = 4, layers: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.use_res else y


class MobileNetLike(nn.Module):
    """A MobileNetV2-style CNN (depthwise-separable inverted residuals) on 3x96x96 images."""

    def __init__(self, classes: int = 100) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()
        )
        cfg = [
            (16, 24, 2),
            (24, 24, 1),
            (24, 32, 2),
            (32, 32, 1),
            (32, 64, 2),
            (64, 64, 1),
            (64, 96, 1),
            (96, 160, 2),
        ]
        self.blocks = nn.Sequential(*(InvertedResidual(a, b, s) for a, b, s in cfg))
        self.head = nn.Sequential(
            nn.Conv2d(160, 320, 1, bias=False), nn.BatchNorm2d(320), nn.ReLU6()
        )
        self.fc = nn.Linear(320, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(x)))
        return self.fc(x.mean(dim=(2, 3)))


class ManySmallOps(nn.Module):
    """``n`` tiny elementwise ops in a chain: measures per-instruction overhead."""

    def __init__(self, n: int = 1000) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.n):
            x = x * 1.0001 if i % 2 else x + 0.5
        return x


class BigMLP(nn.Module):
    """About 200 MB of float32 weights (12 x 2048x2048 linear layers)."""

    def __init__(self, dim: int = 2048, layers: int = 12) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x
