#!/usr/bin/env python3
"""Make the XNNPACK-delegated test fixtures with ExecuTorch's real exporter.

Usage:
    python scripts/make_xnnpack_fixtures.py [--out tests/fixtures/xnnpack] [--only NAME ...]

Every fixture is a module lowered with ``to_edge_transform_and_lower(...,
partitioner=[XnnpackPartitioner(...)])`` under one recipe:

  fp32              float32 graph
  fp16              the module and its inputs cast to float16
  int8_static_pt    PT2E static int8, per-tensor weights (XNNPACKQuantizer)
  int8_static_pc    PT2E static int8, per-channel weights
  int8_dynamic_pc   PT2E dynamic int8 activations (per token at run time), per-channel weights
  int8_dynamic_int4w_pc  the same with 4-bit weights (weight range [-8, 7]: XNNPACK qcint4)
  int4_pc           torchao Int8DynamicActivationIntxWeightConfig, int4 weights, per channel
  int4_group        the same with group-wise int4 weights (group size 32)

For every fixture NAME this writes, under the output directory:

* ``NAME.pte``    the program;
* ``NAME.io.pt``  ``torch.save({"calls": [{"inputs", "eager", "executorch"}, ...]})``: the
  inputs of each call, what the eager (quantized, for quantized recipes) module returns,
  and what ExecuTorch's runtime with its XNNPACK backend returns for the same file;

and ``manifest.json``: per fixture its recipe, tags, description, the tolerances
(``tol_eager``, ``tol_executorch``: (rtol, atol)), the XNNPACK node types of each
delegate decoded by ``flatc`` with the installed ``schema.fbs`` (an independent
reading of the payload), the operators left outside the delegates, and
``executorch_runtime``: "ok" or why ExecuTorch's runtime disagrees with eager.

Everything is seeded: running the script twice gives the same programs and inputs.
"""

from __future__ import annotations

import argparse
import copy
import importlib.resources
import json
import os
import re
import sys
import tempfile
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim, export

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "xnnpack"
sys.path.insert(0, str(ROOT / "scripts"))

from make_fixtures import CNN, MLP, Block, randomize_bn  # noqa: E402

RECIPES = (
    "fp32",
    "fp16",
    "int8_static_pt",
    "int8_static_pc",
    "int8_dynamic_pc",
    "int8_dynamic_int4w_pc",
    "int4_pc",
    "int4_group",
)

# tolerances against eager PyTorch: (rtol, atol)
TOL_F32 = (1e-4, 1e-5)
TOL_F32_LOOSE = (1e-3, 1e-4)  # transcendental approximations, long reductions
TOL_F16 = (1e-2, 1e-2)


@dataclass
class Spec:
    name: str
    recipe: str
    make: Callable[[], tuple[nn.Module, list[tuple[Any, ...]]]]
    description: str
    tags: list[str] = field(default_factory=list)
    dynamic_shapes: Any = None
    tol: tuple[float, float] | None = None  # vs eager; None: recipe default
    expect_nodes: tuple[str, ...] = ()  # node types the fixture exists for
    output_step: bool = False  # vs ExecuTorch: within one step of the quantized outputs


def seed_for(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


# --------------------------------------------------------------------------------------
# single-op modules
# --------------------------------------------------------------------------------------


class Fn(nn.Module):
    """forward = fn(*inputs); parameters given as named tensors."""

    def __init__(self, fn: Callable[..., Any], **params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_parameter(k, nn.Parameter(v, requires_grad=False))

    def forward(self, *xs: Any) -> Any:
        return self.fn(self, *xs)


def unary(
    fn: Callable[[torch.Tensor], torch.Tensor],
    shape: Sequence[int] = (2, 3, 8),
    positive: bool = False,
):
    def make() -> tuple[nn.Module, list[tuple[Any, ...]]]:
        def gen() -> torch.Tensor:
            x = torch.randn(*shape) * 2
            return x.abs() + 0.1 if positive else x

        return Fn(lambda self, x: fn(x)), [(gen(),), (gen(),)]

    return make


def binary(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    a=(2, 3, 4, 5),
    b=(3, 1, 5),
    nonzero: bool = False,
):
    def make() -> tuple[nn.Module, list[tuple[Any, ...]]]:
        def gen() -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.randn(*b)
            if nonzero:
                y = y.sign() * (y.abs() + 0.5)
            return torch.randn(*a), y

        return Fn(lambda self, x, y: fn(x, y)), [gen(), gen()]

    return make


def module(m: Callable[[], nn.Module], *shapes: Sequence[int], calls: int = 2):
    def make() -> tuple[nn.Module, list[tuple[Any, ...]]]:
        mod = m().eval()
        return mod, [tuple(torch.randn(*s) for s in shapes) for _ in range(calls)]

    return make


class ConvAct(nn.Module):
    def __init__(
        self, cin: int = 4, cout: int = 6, k: int = 3, act: str = "relu", **kw: Any
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, **kw)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.act == "relu":
            return torch.relu(y)
        if self.act == "hardtanh":
            return F.hardtanh(y, -0.5, 0.5)
        return y


class LinearAct(nn.Module):
    def __init__(self, d_in: int = 16, d_out: int = 8, bias: bool = True, act: str = "") -> None:
        super().__init__()
        self.fc = nn.Linear(d_in, d_out, bias=bias)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if self.act == "relu":
            return torch.relu(y)
        if self.act == "relu6":
            return F.relu6(y)
        return y


class MM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8), requires_grad=False)
        self.b = nn.Parameter(torch.randn(8), requires_grad=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.mm(x, self.w), torch.addmm(self.b, x, self.w) + torch.mm(x, y)


class BMM(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.bmm(a, b), torch.matmul(
            a.unsqueeze(1).expand(3, 2, 4, 5), b.unsqueeze(1).expand(3, 2, 5, 6)
        )


class Pools(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.max_pool2d(x, 3, stride=2, padding=1),
            F.max_pool2d(x, 2, stride=2, ceil_mode=True),
            F.max_pool2d(x, 3, stride=1, dilation=2),
            F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
            F.avg_pool2d(x, 2),
        )


class MeanDims(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.mean(dim=(2, 3), keepdim=True), F.adaptive_avg_pool2d(x * 2.0, 1)


class MaxDim(nn.Module):
    """max.dim whose indices are unused (the partitioner takes no other form)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.max(x, dim=3, keepdim=True)[0], torch.max(x * 2.0, dim=2, keepdim=True)[
            0
        ] + 1.0


class Clone(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


class Cats(nn.Module):
    def forward(
        self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, e: torch.Tensor
    ):  # type: ignore[no-untyped-def]
        return (
            torch.cat([a, b], dim=1),
            torch.cat([a, b, c], dim=2),
            torch.cat([a, b, c, d], dim=-1),
            torch.cat([a, b, c, d, e], dim=0),
        )


class CatConv(nn.Module):
    """Concatenation along channels between convolutions (NHWC inside the delegate)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.c2 = nn.Conv2d(3, 2, 1)
        self.c3 = nn.Conv2d(6, 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c3(torch.cat([self.c1(x), self.c2(x)], dim=1))


class Shapes(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2.0
        return (
            y[:, 1:3],
            y[:, :, 2:5, 1:],
            y.permute(0, 2, 3, 1) + 1.0,
            y.reshape(2, -1) - 1.0,
            y.unsqueeze(2) * 3.0,
            F.pad(y, (1, 2, 0, 1), value=0.5),
        )


class ConvShapes(nn.Module):
    """Slice, pad and reshape of NHWC activations between convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.c2 = nn.Conv2d(4, 4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.c1(x)
        z = self.c2(F.pad(y[:, 1:5], (1, 1, 2, 0)))
        return z, torch.flatten(z, 1)


class Upsample(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
            F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=True),
        )


class ToChannelsLast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y.clone(), (y + 1.0).to(memory_format=torch.channels_last)


class PReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.act = nn.PReLU(4, init=0.2)
        with torch.no_grad():
            self.act.weight.copy_(torch.tensor([0.1, 0.25, -0.3, 0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


class BatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(4)
        randomize_bn(self.bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(5)
        randomize_bn(self.bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardswish(self.bn(self.conv(x)))


class Depthwise(nn.Module):
    def __init__(self, mult: int = 1) -> None:
        super().__init__()
        self.dw = nn.Conv2d(4, 4 * mult, 3, padding=1, groups=4, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dw(x)


class Transposed(nn.Module):
    def __init__(self, groups: int = 1) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


class Conv1d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Softmax(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.softmax(x, dim=-1), torch.log_softmax(x, dim=-1)


class Attention(nn.Module):
    """Matmuls, softmax and reshapes of multi-head attention, written out."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        h = self.heads
        q = q.reshape(b, t, h, d // h).transpose(1, 2)
        k = k.reshape(b, t, h, d // h).transpose(1, 2)
        v = v.reshape(b, t, h, d // h).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) * (d // h) ** -0.5, dim=-1)
        return self.out((a @ v).transpose(1, 2).reshape(b, t, d))


class SDPA(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class Clamps(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.relu(x),
            F.hardtanh(x, -1.0, 2.0),
            torch.clamp(x, min=-0.5),
            torch.clamp(x, -0.25, 0.75),
            F.relu6(x * 4),
        )


class Activations(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.sigmoid(x),
            torch.tanh(x),
            F.gelu(x),
            F.hardswish(x),
            F.leaky_relu(x, 0.1),
            F.elu(x, 0.5),
        )


class Unary(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = x.abs() + 0.5
        return (
            torch.abs(x),
            torch.neg(x),
            torch.floor(x),
            torch.ceil(x),
            torch.sqrt(p),
            torch.rsqrt(p),
            x**2,
            torch.log(p),
            torch.exp(x),
            torch.sin(x),
            torch.cos(x),
        )


class Misc(nn.Module):
    """Clamps, softmax, min, concatenation, mean, upsampling, prelu."""

    def __init__(self) -> None:
        super().__init__()
        self.prelu = PReLU()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.clamp(x, -0.5, 0.5),
            torch.relu(y),
            torch.softmax(x, dim=-1),
            torch.minimum(x, y),
            torch.cat([x, y, x], dim=1),
            x.mean(dim=(2, 3), keepdim=True),
            F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
            self.prelu(x),
        )


class SmallCNN(nn.Module):
    """A quantization-friendly CNN: conv, relu, pool, add, mean, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(x))
        y = F.max_pool2d(y, 2)
        y = torch.relu(self.c2(y) + y)
        y = y.mean(dim=(2, 3), keepdim=True)
        return self.fc(torch.flatten(y, 1))


class QOps(nn.Module):
    """Elementwise and shape ops on int8 activations."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = self.c(x)
        s = a + y
        m = a * y
        c = torch.cat([s, m], dim=1)
        return torch.relu(c), F.max_pool2d(s, 2), torch.sigmoid(m).mean(dim=(2, 3), keepdim=True)


class DWNet(nn.Module):
    """Depthwise, transposed and grouped convolutions (quantized per channel)."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.g = nn.Conv2d(4, 4, 3, padding=1, groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c(x))
        y = torch.relu(self.dw(y))
        return self.g(self.up(y))


class TwoLinear(nn.Module):
    """Linears over a 3-d input, bias and no bias (dynamic and 4-bit recipes)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 96)
        self.b = nn.Linear(96, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.gelu(self.a(x)))


class QKV(nn.Module):
    """Separate query, key and value projections of one normalized input, as in Llama
    (three dynamically quantized linears reading the same activation), one decode token."""

    def __init__(self, dim: int = 128, kv: int = 64) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv, bias=False)
        self.wv = nn.Linear(dim, kv, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.norm(x)
        return self.wq(h), self.wk(h), self.wv(h)


# --------------------------------------------------------------------------------------
# fixture list
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# real networks, torchvision-style, at reduced widths and resolutions (random weights;
# batch-norm statistics re-estimated on random images so activations keep their scale)
# --------------------------------------------------------------------------------------


def _divisible(v: float, divisor: int = 8) -> int:
    """torchvision's _make_divisible: round channels to a multiple of 8, never below 90%."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class ConvBNAct(nn.Sequential):
    def __init__(
        self, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1, act: Any = nn.ReLU6
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class InvertedResidualV2(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = round(cin * expand)
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBNAct(cin, hidden, 1))
        layers += [
            ConvBNAct(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNet v2 (all 17 inverted residual blocks); reduced here to
    width 0.25, a 64-channel last layer (1280) and 10 classes (1000)."""

    SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
               (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip

    def __init__(self, width: float = 0.25, last: int = 64, classes: int = 10) -> None:
        super().__init__()
        cin = _divisible(32 * width)
        layers: list[nn.Module] = [ConvBNAct(3, cin, 3, 2)]
        for t, c, n, s in self.SETTING:
            cout = _divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidualV2(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(ConvBNAct(cin, last, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(last, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class SqueezeExcitation(nn.Module):
    def __init__(self, c: int, squeeze: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))
        return x * s


class InvertedResidualV3(nn.Module):
    def __init__(
        self, cin: int, k: int, exp: int, cout: int, se: bool, act: Any, stride: int
    ) -> None:
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act=act))
        layers.append(ConvBNAct(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcitation(exp, _divisible(exp // 4)))
        layers.append(ConvBNAct(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.use_res else self.block(x)


class MobileNetV3Small(nn.Module):
    """torchvision's MobileNet v3-small (11 blocks, squeeze-excitation, hardswish); reduced
    here to width 0.35, a 64-wide classifier (1024) and 10 classes (1000)."""

    RE, HS = nn.ReLU, nn.Hardswish
    SETTING = ((3, 16, 16, True, RE, 2), (3, 72, 24, False, RE, 2), (3, 88, 24, False, RE, 1),
               (5, 96, 40, True, HS, 2), (5, 240, 40, True, HS, 1), (5, 240, 40, True, HS, 1),
               (5, 120, 48, True, HS, 1), (5, 144, 48, True, HS, 1), (5, 288, 96, True, HS, 2),
               (5, 576, 96, True, HS, 1), (5, 576, 96, True, HS, 1))  # fmt: skip

    def __init__(self, width: float = 0.35, last: int = 64, classes: int = 10) -> None:
        super().__init__()
        cin = _divisible(16 * width)
        layers: list[nn.Module] = [ConvBNAct(3, cin, 3, 2, act=nn.Hardswish)]
        for k, exp, c, se, act, s in self.SETTING:
            cout = _divisible(c * width)
            layers.append(InvertedResidualV3(cin, k, _divisible(exp * width), cout, se, act, s))
            cin = cout
        final = 6 * cin
        layers.append(ConvBNAct(cin, final, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(final, last), nn.Hardswish(), nn.Linear(last, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.heads
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        a = torch.softmax((q @ k.transpose(-2, -1)) * (d // h) ** -0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class DeiT(nn.Module):
    """DeiT-tiny (timm's VisionTransformer: patch embedding, class token, learned position
    embedding, pre-norm blocks, head on the class token); reduced here to 32x32 images in
    8x8 patches (224, 16), width 48 (192), 2 heads (3), 4 blocks (12) and 10 classes."""

    def __init__(
        self, img: int = 32, patch: int = 8, dim: int = 48, heads: int = 2, depth: int = 4,
        classes: int = 10,
    ) -> None:  # fmt: skip
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(ViTBlock(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


class YConv(ConvBNAct):
    """YOLO's Conv: convolution, batch norm, SiLU."""

    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1) -> None:
        super().__init__(cin, cout, k, stride, act=nn.SiLU)


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool = True) -> None:
        super().__init__()
        self.cv1 = YConv(c, c, 3)
        self.cv2 = YConv(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    def __init__(self, cin: int, cout: int, n: int = 1, shortcut: bool = True) -> None:
        super().__init__()
        self.c = cout // 2
        self.cv1 = YConv(cin, 2 * self.c)
        self.cv2 = YConv((2 + n) * self.c, cout)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 5) -> None:
        super().__init__()
        self.cv1 = YConv(cin, cin // 2)
        self.cv2 = YConv(cin * 2, cout)
        self.pool = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        return self.cv2(torch.cat(y, 1))


class TinyYOLO(nn.Module):
    """A YOLOv8-style detector (Conv/C2f backbone, SPPF, an upsampling neck with two
    scales, raw box and class maps per scale, flattened and concatenated); reduced to
    widths 8-64 on 64x64 images with 3 classes."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(YConv(3, 8, 3, 2), YConv(8, 16, 3, 2), C2f(16, 16))
        self.p3 = nn.Sequential(YConv(16, 32, 3, 2), C2f(32, 32))
        self.p4 = nn.Sequential(YConv(32, 64, 3, 2), C2f(64, 64), SPPF(64, 64))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.n3 = C2f(96, 32, shortcut=False)
        self.down = YConv(32, 32, 3, 2)
        self.n4 = C2f(96, 64, shortcut=False)
        self.out = 4 + classes
        self.h3 = nn.Sequential(YConv(32, 32, 3), nn.Conv2d(32, self.out, 1))
        self.h4 = nn.Sequential(YConv(64, 32, 3), nn.Conv2d(32, self.out, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        n3 = self.n3(torch.cat([self.up(p4), p3], 1))
        n4 = self.n4(torch.cat([self.down(n3), p4], 1))
        b = x.shape[0]
        return torch.cat(
            [self.h3(n3).reshape(b, self.out, -1), self.h4(n4).reshape(b, self.out, -1)], 2
        )


def reestimate_bn(m: nn.Module, shape: Sequence[int], batches: int = 4) -> nn.Module:
    """Batch-norm running statistics measured on random images (cumulative averages), so
    that each normalized activation has unit scale despite random weights."""
    bns = [b for b in m.modules() if isinstance(b, nn.BatchNorm2d)]
    for b in bns:
        b.reset_running_stats()
        b.momentum = None
    m.train()
    with torch.no_grad():
        for _ in range(batches):
            m(torch.randn(max(shape[0], 8), *shape[1:]))
    return m.eval()


def network(cls: Callable[[], nn.Module], shape: Sequence[int], calls: int = 2):
    def make() -> tuple[nn.Module, list[tuple[Any, ...]]]:
        m = reestimate_bn(cls(), shape)
        return m, [(torch.randn(*shape),) for _ in range(calls)]

    return make


def core(cls: Callable[[], nn.Module], shape: Sequence[int], calls: int = 2):
    return module(cls, shape, calls=calls)


SPECS: list[Spec] = []


def add(
    name: str, recipe: str, make, description: str, expect: Sequence[str] = (), **kw: Any
) -> None:  # type: ignore[no-untyped-def]
    SPECS.append(Spec(name, recipe, make, description, expect_nodes=tuple(expect), **kw))


# core models
for recipe in ("fp32", "fp16"):
    sfx = "" if recipe == "fp32" else "_fp16"
    add(
        f"mlp{sfx}",
        recipe,
        core(MLP, (2, 8), 3),
        "two linears with a relu",
        ["FullyConnected"],
        tags=["core"],
    )
    add(
        f"cnn{sfx}",
        recipe,
        core(CNN, (2, 3, 16, 16)),
        "conv, batch norm, relu, max pool, global avg pool, linear",
        ["Conv2d", "MaxPooling2d", "GlobalAvgPooling2d", "FullyConnected"],
        tags=["core"],
    )
    add(
        f"transformer{sfx}",
        recipe,
        core(Block, (2, 6, 16)),
        "pre-norm transformer block",
        tags=["core"],
        tol=TOL_F32_LOOSE if recipe == "fp32" else None,
    )
add(
    "dynamic_mlp",
    "fp32",
    lambda: (MLP().eval(), [(torch.randn(b, 8),) for b in (3, 1, 16, 3)]),
    "MLP with a dynamic batch (outputs resized per call)",
    ["FullyConnected"],
    tags=["core", "dynamic"],
    dynamic_shapes=({0: Dim("batch", min=1, max=16)},),
)
add(
    "channels_last",
    "fp32",
    lambda: (
        ConvAct(3, 4, 3, padding=1).eval(),
        [(torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last),) for _ in range(2)],
    ),
    "a channels-last (dim order 0,2,3,1) input",
    ["Conv2d"],
    tags=["core", "channels_last"],
)

# binary
for op, fn, extra in (
    ("add", torch.add, {}),
    ("sub", torch.sub, {}),
    ("mul", torch.mul, {}),
    ("div", torch.div, {"nonzero": True}),
    ("minimum", torch.minimum, {}),
    ("maximum", torch.maximum, {}),
):
    node = {
        "add": "Add",
        "sub": "Subtract",
        "mul": "Multiply",
        "div": "Div",
        "minimum": "Minimum",
        "maximum": "Maximum",
    }[op]
    add(f"op_{op}", "fp32", binary(fn, **extra), f"{op} with broadcasting", [node], tags=["op"])
add(
    "op_add_relu",
    "fp32",
    binary(lambda x, y: torch.relu(x + y)),
    "add with a fused relu (output clamp)",
    ["Add"],
    tags=["op"],
)

# unary
for op, fn, node, kw in (
    ("abs", torch.abs, "Abs", {}),
    ("neg", torch.neg, "Negate", {}),
    ("floor", torch.floor, "Floor", {}),
    ("ceil", torch.ceil, "Ceiling", {}),
    ("sqrt", torch.sqrt, "SquareRoot", {"positive": True}),
    ("rsqrt", torch.rsqrt, "ReciprocalSquareRoot", {"positive": True}),
    ("square", lambda x: x**2, "Square", {}),
    ("log", torch.log, "Log", {"positive": True}),
    ("exp", torch.exp, "Exp", {}),
    ("sin", torch.sin, "Sin", {}),
    ("cos", torch.cos, "Cos", {}),
):
    add(f"op_{op}", "fp32", unary(fn, **kw), op, [node], tags=["op"], tol=TOL_F32_LOOSE)
add(
    "op_clamp",
    "fp32",
    module(Clamps, (2, 3, 8)),
    "relu, hardtanh, clamp, relu6",
    ["Clamp"],
    tags=["op"],
)
add(
    "op_activations",
    "fp32",
    module(Activations, (2, 3, 8)),
    "sigmoid, tanh, gelu, hardswish, leaky relu, elu",
    ["Sigmoid", "Tanh", "Gelu", "Hardswish", "LeakyReLU"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)

# gemm
add(
    "op_linear",
    "fp32",
    module(lambda: LinearAct(16, 8), (3, 16)),
    "linear",
    ["FullyConnected"],
    tags=["op"],
)
add(
    "op_linear_3d_nobias_relu6",
    "fp32",
    module(lambda: LinearAct(16, 8, bias=False, act="relu6"), (2, 3, 16)),
    "linear over a 3-d input without bias, fused relu6",
    ["FullyConnected"],
    tags=["op"],
)
add(
    "op_mm",
    "fp32",
    module(MM, (4, 16), (16, 8)),
    "mm and addmm, constant and activation weights",
    ["FullyConnected"],
    tags=["op"],
)
add(
    "op_bmm",
    "fp32",
    module(BMM, (3, 4, 5), (3, 5, 6)),
    "bmm and a 4-d matmul",
    ["BatchMatrixMultiply"],
    tags=["op"],
)

# convolution
add(
    "op_conv2d",
    "fp32",
    module(lambda: ConvAct(4, 6, 3, act="", stride=2, padding=1, dilation=1), (2, 4, 9, 9)),
    "conv2d, stride 2, padding 1",
    ["Conv2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_conv2d_relu",
    "fp32",
    module(
        lambda: ConvAct(4, 6, 3, act="relu", padding=(2, 1), dilation=2, groups=2), (2, 4, 10, 9)
    ),
    "grouped, dilated conv2d with a fused relu",
    ["Conv2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_conv2d_hardtanh",
    "fp32",
    module(lambda: ConvAct(4, 3, (3, 2), act="hardtanh", bias=False), (1, 4, 7, 6)),
    "conv2d without bias with a fused hardtanh",
    ["Conv2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_depthwise",
    "fp32",
    module(Depthwise, (2, 4, 9, 9)),
    "depthwise conv2d",
    ["DepthwiseConv2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_depthwise_mult2",
    "fp32",
    module(lambda: Depthwise(2), (2, 4, 9, 9)),
    "depthwise conv2d, multiplier 2",
    ["DepthwiseConv2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_conv_transpose",
    "fp32",
    module(Transposed, (2, 4, 5, 6)),
    "transposed conv2d, stride 2, output padding 1",
    ["ConvTranspose2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_conv_transpose_grouped",
    "fp32",
    module(lambda: Transposed(2), (2, 4, 5, 6)),
    "grouped transposed conv2d",
    ["ConvTranspose2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_conv1d",
    "fp32",
    module(Conv1d, (2, 4, 12)),
    "conv1d (lowered as a 2-d convolution)",
    ["Conv2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_conv_bn_hardswish",
    "fp32",
    module(ConvBN, (2, 3, 10, 10)),
    "conv2d + batch norm (fused) + hardswish",
    ["Conv2d", "Hardswish"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_batchnorm",
    "fp32",
    module(BatchNorm, (2, 4, 5, 5)),
    "a standalone batch norm",
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_prelu",
    "fp32",
    module(PReLU, (2, 3, 5, 5)),
    "prelu with per-channel slopes",
    ["PReLU"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)

# pooling, reductions
add(
    "op_pools",
    "fp32",
    module(Pools, (2, 3, 9, 8)),
    "max pool (padding, ceil mode, dilation) and avg pool",
    ["MaxPooling2d", "AvgPooling2d"],
    tags=["op"],
)
add(
    "op_mean",
    "fp32",
    module(MeanDims, (2, 3, 5, 6)),
    "mean over H, W (keepdim) and adaptive avg pool 1",
    ["GlobalAvgPooling2d"],
    tags=["op"],
)
add(
    "op_max_dim",
    "fp32",
    module(MaxDim, (2, 3, 5, 6)),
    "max.dim over W and over H, values only",
    ["MaxPooling2d"],
    tags=["op"],
)
add(
    "op_softmax",
    "fp32",
    module(Softmax, (2, 3, 10)),
    "softmax and log-softmax over the last dim",
    ["Softmax"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)

# data movement
add(
    "op_cat",
    "fp32",
    module(Cats, (2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 5)),
    "cat of 2, 3, 4 and 5 tensors",
    ["Concatenate2", "Concatenate3", "Concatenate4", "Concatenate5"],
    tags=["op"],
)
add(
    "op_cat_conv",
    "fp32",
    module(CatConv, (2, 3, 8, 8)),
    "cat along channels between convolutions (NHWC)",
    ["Concatenate2", "Conv2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_shapes",
    "fp32",
    module(Shapes, (2, 6, 7, 8)),
    "slice, permute, reshape, unsqueeze, constant pad",
    ["StaticSlice", "StaticTranspose", "StaticReshape", "StaticConstantPad"],
    tags=["op"],
)
add(
    "op_conv_shapes",
    "fp32",
    module(ConvShapes, (2, 3, 8, 8)),
    "slice, pad, flatten of NHWC activations",
    ["StaticSlice", "StaticConstantPad", "StaticReshape", "Conv2d"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_upsample",
    "fp32",
    module(Upsample, (2, 3, 4, 5)),
    "bilinear upsampling, align_corners False and True",
    ["StaticResizeBilinear2D"],
    tags=["op"],
)
add(
    "op_copy_to_channels_last",
    "fp32",
    module(ToChannelsLast, (2, 3, 6, 6)),
    "clone and a memory-format change",
    ["StaticTranspose"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add("op_clone", "fp32", module(Clone, (2, 3, 4)), "clone of an input", ["Copy"], tags=["op"])
add(
    "op_attention",
    "fp32",
    module(Attention, (2, 5, 16)),
    "attention written with matmuls and softmax",
    ["BatchMatrixMultiply", "Softmax", "FullyConnected"],
    tags=["op"],
    tol=TOL_F32_LOOSE,
)
add(
    "op_sdpa",
    "fp32",
    module(SDPA, (2, 2, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8)),
    "scaled_dot_product_attention (decomposed by the exporter)",
    tags=["op"],
    tol=TOL_F32_LOOSE,
)

# half precision
add(
    "op_binary_fp16",
    "fp16",
    binary(lambda x, y: torch.maximum(x * y + x, y) - y / 2.0),
    "binary ops in float16",
    ["Multiply", "Add", "Maximum", "Subtract"],
    tags=["op"],
)
add("op_unary_fp16", "fp16", module(Unary, (2, 3, 8)), "unary ops in float16", tags=["op"])
add(
    "op_misc_fp16",
    "fp16",
    module(Misc, (2, 3, 4, 5), (2, 3, 4, 5)),
    "clamp, softmax, minimum, cat, mean, upsampling, prelu in float16",
    tags=["op"],
)
add(
    "op_activations_fp16",
    "fp16",
    module(Activations, (2, 3, 8)),
    "activations in float16",
    tags=["op"],
)
add(
    "op_conv_fp16",
    "fp16",
    module(DWNet, (1, 3, 8, 8)),
    "conv, depthwise, transposed, grouped in float16",
    tags=["op"],
)
add("op_pools_fp16", "fp16", module(Pools, (2, 3, 9, 8)), "pooling in float16", tags=["op"])
add("op_shapes_fp16", "fp16", module(Shapes, (2, 6, 7, 8)), "shape ops in float16", tags=["op"])
add("op_attention_fp16", "fp16", module(Attention, (2, 5, 16)), "attention in float16", tags=["op"])

# quantized
for recipe in ("int8_static_pt", "int8_static_pc"):
    add(
        f"mlp_{recipe}",
        recipe,
        core(MLP, (2, 8), 3),
        "MLP",
        ["FullyConnected", "Convert"],
        tags=["core", "quant"],
    )
    add(
        f"cnn_{recipe}",
        recipe,
        core(SmallCNN, (2, 3, 16, 16)),
        "conv, relu, pool, add, mean, linear",
        ["Conv2d", "Convert"],
        tags=["core", "quant"],
    )
    add(
        f"qops_{recipe}",
        recipe,
        module(QOps, (2, 3, 8, 8), (2, 4, 8, 8)),
        "add, mul, cat, relu, pool, mean on int8",
        tags=["quant"],
    )
    add(
        f"dwnet_{recipe}",
        recipe,
        core(DWNet, (1, 3, 8, 8)),
        "depthwise, transposed, grouped conv",
        tags=["quant"],
    )
for recipe in ("int8_dynamic_pc", "int8_dynamic_int4w_pc", "int4_pc", "int4_group"):
    add(
        f"mlp_{recipe}",
        recipe,
        core(TwoLinear, (2, 5, 64)),
        "two linears with gelu (3-d input)",
        ["FullyConnected", "Convert"],
        tags=["core", "quant"],
    )
    add(
        f"transformer_{recipe}",
        recipe,
        core(lambda: Block(dim=32, heads=2), (2, 6, 32)),
        "transformer block",
        ["FullyConnected", "Convert"],
        tags=["core", "quant"],
    )
for recipe in ("int8_dynamic_pc", "int4_group"):
    add(
        f"qkv_{recipe}",
        recipe,
        core(QKV, (1, 1, 128), 3),
        "query, key and value projections of one token (one input, three linears)",
        ["FullyConnected", "Convert"],
        tags=["quant"],
    )
add(
    "dynamic_mlp_int8_dynamic_pc",
    "int8_dynamic_pc",
    lambda: (TwoLinear().eval(), [(torch.randn(b, 64),) for b in (3, 7, 1)]),
    "dynamic batch, dynamically quantized linears",
    ["FullyConnected", "Convert"],
    tags=["quant", "dynamic"],
    dynamic_shapes=({0: Dim("batch", min=1, max=8)},),
)


# dynamically quantized convolutions (inputs quantized per batch element at run time)
class DynConvs(nn.Module):
    """Convolutions reading one input: strides, asymmetric and 'same' padding, dilation,
    groups, a depthwise one (which the partitioner keeps in float), and a second
    dynamically quantized convolution after a relu."""

    def __init__(self) -> None:
        super().__init__()
        self.basic = nn.Conv2d(3, 6, 3)
        self.strided = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.wide = nn.Conv2d(3, 4, (3, 5), stride=(1, 2), padding=(2, 1), dilation=(2, 1))
        self.same = nn.Conv2d(3, 4, 3, padding="same", dilation=2, bias=False)
        self.depthwise = nn.Conv2d(3, 6, 3, groups=3)
        self.grouped = nn.Conv2d(6, 6, 3, padding=1, groups=3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.basic(x)
        z = self.grouped(torch.relu(y))
        return y, self.strided(x), self.wide(x), self.same(x), self.depthwise(x), z


class DynConvPadModes(nn.Module):
    """The padding modes (reflect, replicate, circular): a pad the partitioner leaves
    outside, then a dynamically quantized convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv2d(3, 4, 3, padding=1, padding_mode=m)
            for m in ("reflect", "replicate", "circular")
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(c(x) for c in self.convs)


add(
    "dynconv_int8_dynamic_pc",
    "int8_dynamic_pc",
    module(DynConvs, (3, 3, 9, 9)),
    "dynamically quantized conv2d: strides, padding, dilation, groups, a conv chain",
    ["Conv2d", "Convert"],
    tags=["quant"],
)
add(
    "dynconv_padmodes_int8_dynamic_pc",
    "int8_dynamic_pc",
    module(DynConvPadModes, (2, 3, 9, 9)),
    "dynamically quantized conv2d after reflect, replicate and circular padding",
    ["Conv2d", "Convert"],
    tags=["quant"],
)


class DynConvPointwise(nn.Module):
    """1x1 convolutions (stride 1, no padding, one group: XNNPACK runs them as a fully
    connected layer and quantizes the input per pixel) beside a 1x1 convolution of stride
    2 (quantized per image) of another input. (One quantized input read by both kinds:
    XNNPACK quantizes it per pixel and the strided convolution reads those parameters as
    if per image, far from eager PyTorch; not made here.)"""

    def __init__(self) -> None:
        super().__init__()
        self.pointwise = nn.Conv2d(8, 8, 1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.project = nn.Conv2d(8, 4, 1)
        self.strided = nn.Conv2d(8, 4, 1, stride=2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.pointwise(x)
        z = self.project(self.depthwise(torch.relu(y)) + y)
        return y, z, self.strided(torch.relu(x))


add(
    "dynconv_pointwise_int8_dynamic_pc",
    "int8_dynamic_pc",
    module(DynConvPointwise, (2, 8, 8, 8)),
    "dynamically quantized 1x1 convolutions: quantized per pixel (a fully connected layer "
    "to XNNPACK), and per image with stride 2",
    ["Conv2d", "Convert"],
    tags=["quant"],
)
add(
    "dynconv_b1_int8_dynamic_pc",
    "int8_dynamic_pc",
    lambda: (
        nn.Conv2d(3, 5, 3, padding=1).eval(),
        [(torch.randn(1, 3, 10, 10) * s,) for s in (1.0, 4.0)],
    ),
    "dynamically quantized conv2d, batch 1 (a dynamic batch, or a fused relu, the "
    "quantizer leaves in float)",
    ["Conv2d", "Convert"],
    tags=["quant"],
)

# real networks in static int8 (reduced: see each class)
for _name, _cls, _shape in (
    ("mobilenet_v2", MobileNetV2, (1, 3, 48, 48)),
    ("mobilenet_v3_small", MobileNetV3Small, (1, 3, 48, 48)),
    ("deit_tiny", DeiT, (1, 3, 32, 32)),
    ("yolo", TinyYOLO, (1, 3, 48, 48)),
):
    add(
        f"{_name}_int8_static_pc",
        "int8_static_pc",
        network(_cls, _shape),
        f"{_cls.__doc__.split(';')[0].strip()} (reduced), static int8",
        tags=["quant", "network"],
        output_step=True,
    )


# --------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------


def _quantize_pt2e(
    m: nn.Module,
    example: tuple[Any, ...],
    calls: list[tuple[Any, ...]],
    recipe: str,
    dynamic_shapes: Any,
) -> nn.Module:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    q = XNNPACKQuantizer()
    dynamic = recipe.startswith("int8_dynamic")
    wrange = (-8, 7) if recipe == "int8_dynamic_int4w_pc" else (-127, 127)
    q.set_global(
        get_symmetric_quantization_config(
            is_per_channel=recipe != "int8_static_pt",
            is_dynamic=dynamic,
            weight_qmin=wrange[0],
            weight_qmax=wrange[1],
        )
    )
    gm = export(m, example, dynamic_shapes=dynamic_shapes).module()
    prepared = prepare_pt2e(gm, q)  # type: ignore[arg-type]
    for args in calls:
        prepared(*args)
    for _ in range(4):  # a little more calibration data
        prepared(
            *(torch.randn_like(a) * 1.5 if isinstance(a, torch.Tensor) else a for a in example)
        )
    return convert_pt2e(prepared)


def _quantize_torchao(m: nn.Module, recipe: str) -> nn.Module:
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, quantize_

    gran = PerAxis(0) if recipe == "int4_pc" else PerGroup(32)
    quantize_(
        m, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=gran)
    )
    return m


def _lower(m: nn.Module, example: tuple[Any, ...], recipe: str, dynamic_shapes: Any) -> Any:
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.utils.configs import (
        get_xnnpack_edge_compile_config,
        get_xnnpack_executorch_backend_config,
    )
    from executorch.exir import to_edge_transform_and_lower

    precision = None
    if recipe.startswith("int8_static"):
        precision = ConfigPrecisionType.STATIC_QUANT
    elif recipe.startswith("int8_dynamic"):
        precision = ConfigPrecisionType.DYNAMIC_QUANT
    ep = export(m, example, dynamic_shapes=dynamic_shapes)
    part = (
        XnnpackPartitioner(precision_type=precision)
        if precision is not None
        else XnnpackPartitioner()
    )
    edge = to_edge_transform_and_lower(
        ep, partitioner=[part], compile_config=get_xnnpack_edge_compile_config()
    )
    return edge.to_executorch(get_xnnpack_executorch_backend_config())


def _flat(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [o for x in out for o in _flat(x)]
    return [out]


def _delegates(buffer: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    """Per XNNPACK delegate: node type counts and value datatypes, decoded by flatc; and the
    operators of the program outside the delegates."""
    import executorch.backends.xnnpack.serialization as ser
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader
    from executorch.exir._serialize._flatbuffer import _flatc_decompile
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(buffer)
    prog = pte.program
    ops = sorted(
        {
            f"{o.name}.{o.overload}" if o.overload else o.name
            for plan in prog.execution_plan
            for o in plan.operators
        }
    )
    out = []
    schema = Path(str(importlib.resources.files(ser).joinpath("schema.fbs")))
    for plan in prog.execution_plan:
        for d in plan.delegates:
            if d.id != "XnnpackBackend":
                continue
            blob = bytes(prog.backend_delegate_data[d.processed.index].data)
            h = XNNHeader.from_bytes(blob[: XNNHeader.EXPECTED_LENGTH])
            fb = blob[h.flatbuffer_offset : h.flatbuffer_offset + h.flatbuffer_size]
            with tempfile.TemporaryDirectory() as tmp:
                bin_path = os.path.join(tmp, "graph.bin")
                with open(bin_path, "wb") as f:
                    f.write(fb)
                _flatc_decompile(tmp, str(schema), bin_path, ["--raw-binary"])
                with open(os.path.join(tmp, "graph.json")) as f:
                    text = re.sub(
                        r":\s*(-?)(inf|nan)\b",
                        lambda m: f": {m.group(1)}{'Infinity' if m.group(2) == 'inf' else 'NaN'}",
                        f.read(),
                    )
                graph = json.loads(text)
            nodes = Counter(n["xnode_union_type"].removeprefix("XNN") for n in graph["xnodes"])
            dtypes = Counter()
            for v in graph["xvalues"]:
                tv = v["xvalue_union"]
                tv = tv.get("tensor_value", tv)
                dtypes[tv["datatype"].removeprefix("xnn_datatype_")] += 1
            out.append(
                {
                    "node_types": dict(sorted(nodes.items())),
                    "datatypes": dict(sorted(dtypes.items())),
                }
            )
    return out, ops


def _tol_executorch(recipe: str, outputs: list[Any], qstep: float) -> tuple[float, float]:
    if recipe == "fp32":
        return (1e-4, 1e-5)
    if recipe == "fp16":
        return (1e-2, 1e-2)
    return (0.0, qstep)


def _run_executorch(buffer: bytes, calls: list[tuple[Any, ...]]) -> list[list[Any]]:
    from executorch.runtime import Runtime

    prog = Runtime.get().load_program(buffer)
    meth = prog.load_method("forward")
    return [
        [
            o.clone() if isinstance(o, torch.Tensor) else o
            for o in meth.execute(list(copy.deepcopy(c)))
        ]
        for c in calls
    ]


def _qstep(m: nn.Module, outputs: list[Any]) -> float:
    """The largest output quantization step of a quantized module (per-tensor scales of the
    graph's quantize nodes), as a bound on one-step rounding differences."""
    scales = [0.0]
    gm = m if isinstance(m, torch.fx.GraphModule) else None
    if gm is not None:
        for node in gm.graph.nodes:
            if (
                node.op == "call_function"
                and "quantize_per_tensor" in str(node.target)
                and "dequantize" not in str(node.target)
            ):
                s = node.args[1]
                if isinstance(s, float):
                    scales.append(s)
                elif isinstance(s, torch.fx.Node) and s.op == "get_attr":
                    scales.append(float(getattr(gm, s.target).max()))
    return max(scales)


_PASSTHROUGH = ("view", "reshape", "permute", "cat", "select", "flatten", "clone", "squeeze",
                "unsqueeze", "transpose", "contiguous", "slice", "split", "getitem")  # fmt: skip


def _output_step(m: nn.Module) -> float:
    """The quantization step of a quantized module's outputs: the scale of the dequantize
    each output comes from (through ops that only move data), the largest over outputs;
    0.0 when an output is computed in float after its last dequantize."""
    gm = m if isinstance(m, torch.fx.GraphModule) else None
    if gm is None:
        return 0.0

    def scale(node: Any) -> float | None:
        if not isinstance(node, torch.fx.Node):
            return None
        target = str(node.target)
        if node.op == "call_function" and "dequantize_per_tensor" in target:
            s = node.args[1]
            return float(getattr(gm, s.target)) if isinstance(s, torch.fx.Node) else float(s)
        if node.op == "call_function" and any(k in target for k in _PASSTHROUGH):
            found = [scale(a) for a in node.all_input_nodes]
            if found and all(f is not None for f in found):
                return max(f for f in found if f is not None)
        return None

    steps = []
    for node in gm.graph.nodes:
        if node.op == "output":
            for o in _flat(node.args[0]):
                steps.append(scale(o))
    if not steps or any(x is None for x in steps):
        return 0.0
    return max(x for x in steps if x is not None)


def build(spec: Spec, out_dir: Path) -> dict[str, Any]:
    torch.manual_seed(seed_for(spec.name))
    m, calls = spec.make()
    m = m.eval()
    if spec.recipe == "fp16":
        m = m.half()
        calls = [
            tuple(
                a.half() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in c
            )
            for c in calls
        ]
    example = calls[0]
    qstep = 0.0
    with torch.no_grad():
        if spec.recipe.startswith("int8"):
            m = _quantize_pt2e(m, example, calls, spec.recipe, spec.dynamic_shapes)
            qstep = _qstep(m, [])
        elif spec.recipe.startswith("int4"):
            m = _quantize_torchao(m, spec.recipe)
        eager = [[o.clone() for o in _flat(m(*copy.deepcopy(c)))] for c in calls]
        et = _lower(m, example, spec.recipe, spec.dynamic_shapes)
    buffer = et.buffer
    (out_dir / f"{spec.name}.pte").write_bytes(buffer)
    et_out = _run_executorch(buffer, calls)
    torch.save(
        {
            "calls": [
                {"inputs": list(c), "eager": e, "executorch": x}
                for c, e, x in zip(calls, eager, et_out, strict=True)
            ]
        },
        out_dir / f"{spec.name}.io.pt",
    )
    delegates, ops = _delegates(buffer)
    tol = spec.tol or {"fp32": TOL_F32, "fp16": TOL_F16}.get(spec.recipe, (0.0, 0.0))
    if spec.recipe.startswith("int"):
        tol = _quant_tol_eager(eager, et_out, qstep)
    if spec.recipe == "fp16":
        tol = TOL_F16
    tol_et = _tol_executorch(spec.recipe, et_out[0], qstep)
    if spec.output_step:
        step = _output_step(m)
        if step <= 0.0:
            raise ValueError(f"{spec.name}: an output is not the dequantized int8 value")
        tol_et = (0.0, float(f"{step * 1.001:.4g}"))  # one step, and the float error of it
    if spec.recipe in ("int8_dynamic_pc", "int8_dynamic_int4w_pc", "int4_pc", "int4_group"):
        # fp32 outputs of dynamically quantized linears: a one-step change of one activation
        # moves an output by about scale_x * |w|; bound it by a small fraction of the range
        span = max(float(o.abs().max()) for c in eager for o in c if isinstance(o, torch.Tensor))
        tol_et = (1e-3, 2e-3 * max(span, 1.0))
    verdict = _compare(et_out, eager, tol)
    nodes: Counter[str] = Counter()
    for d in delegates:
        nodes.update(d["node_types"])
    missing = [n for n in spec.expect_nodes if n not in nodes]
    if missing:
        print(f"  warning: {spec.name}: expected node types not emitted: {missing}")
    return {
        "pte": f"{spec.name}.pte",
        "recipe": spec.recipe,
        "tags": spec.tags,
        "description": spec.description,
        "tol_eager": list(tol),
        "tol_executorch": list(tol_et),
        "quant_step": qstep,
        "delegates": delegates,
        "node_types": dict(sorted(nodes.items())),
        "operators": ops,
        "executorch_runtime": verdict,
    }


def _quant_tol_eager(
    eager: list[list[Any]], et_out: list[list[Any]], qstep: float
) -> tuple[float, float]:
    """Eager quantized modules quantize activations per tensor where XNNPACK quantizes per
    token, and round differently in places: the tolerance is the observed ExecuTorch error
    (rounded up), at least two quantization steps."""
    worst = 0.0
    for e, x in zip(eager, et_out, strict=True):
        for a, b in zip(e, x, strict=True):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                worst = max(worst, float((a.float() - b.float()).abs().max()))
    atol = max(2 * qstep, worst * 1.5, 1e-4)
    return (0.0, float(f"{atol:.3g}"))


def _compare(actual: list[list[Any]], expected: list[list[Any]], tol: tuple[float, float]) -> str:
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if len(a) != len(e):
            return f"diverges: call {i}: {len(a)} outputs, expected {len(e)}"
        for k, (x, y) in enumerate(zip(a, e, strict=True)):
            if isinstance(y, torch.Tensor):
                if x.dtype != y.dtype or x.shape != y.shape:
                    return f"diverges: call {i} output {k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"
                if y.is_floating_point():
                    if not torch.allclose(x.float(), y.float(), rtol=tol[0], atol=tol[1]):
                        err = float((x.float() - y.float()).abs().max())
                        return f"diverges: call {i} output {k}: max abs err {err:.3g}"
                elif not torch.equal(x, y):
                    return f"diverges: call {i} output {k}: values differ"
    return "ok"


# node types of the schema that no fixture contains: why, and what tests them instead
NOT_EMITTED = {
    "ArgMaxPooling2d": (
        "not emitted: `max.dim` is partitioned only when its indices are unused, and then "
        "becomes `MaxPooling2d`",
        "`test_argmax_pooling_values_and_window_indices` (payload written with ExecuTorch's serializer)",
    ),
    "ELU": (
        "not emitted: the partitioner's ELU config is disabled in 1.5.1",
        "`test_elu_from_a_written_payload` (payload written with ExecuTorch's serializer)",
    ),
    "ScaledDotProductAttention": (
        "not emitted: no partitioner config; `scaled_dot_product_attention` is decomposed "
        "into `BatchMatrixMultiply` + `Softmax` (see `op_sdpa`)",
        "refused at load: `BackendUnavailableError` naming it (`test_sdpa_node_is_refused_by_name`)",
    ),
}


def coverage_table(manifest: dict[str, Any]) -> str:
    """The node type table of docs/xnnpack_coverage.md, from the manifest."""
    sys.path.insert(0, str(ROOT / "src"))
    from ptexec.delegates.xnnpack.runtime import SUPPORTED_NODE_TYPES
    from ptexec.delegates.xnnpack.schema import NODE_TYPES

    emitted: dict[str, list[tuple[str, str]]] = {}
    for name, entry in manifest.items():
        for node in entry["node_types"]:
            emitted.setdefault(node, []).append((entry["recipe"], name))
    lines = ["| node type | 1.5.1 partitioner | ptexec runs it | tested by |", "|---|---|---|---|"]
    for node in sorted(NODE_TYPES.values(), key=str.lower):
        runs = "yes" if node in SUPPORTED_NODE_TYPES else "no"
        if node not in emitted:
            why, tested = NOT_EMITTED[node]
            lines.append(f"| `{node}` | {why} | {runs} | {tested} |")
            continue
        recipes = sorted({r for r, _ in emitted[node]}, key=RECIPES.index)
        picks: list[str] = []
        for r in recipes:
            names = sorted(
                (n for rr, n in emitted[node] if rr == r),
                key=lambda n: (not n.startswith("op_"), len(n), n),
            )
            if names[0] not in picks:
                picks.append(names[0])
        tested = ", ".join(f"`{p}`" for p in picks[:5])
        lines.append(f"| `{node}` | emitted: {', '.join(recipes)} | {runs} | {tested} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument(
        "--coverage-table",
        action="store_true",
        help="print the coverage table of the manifest and exit",
    )
    args = ap.parse_args(argv)
    if args.coverage_table:
        print(coverage_table(json.loads((args.out / "manifest.json").read_text())), end="")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest: dict[str, Any] = {}
    if args.only and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
    warnings.filterwarnings("ignore")
    for spec in SPECS:
        if args.only and spec.name not in args.only:
            continue
        print(f"{spec.name} ({spec.recipe})", flush=True)
        try:
            manifest[spec.name] = build(spec, args.out)
        except Exception as exc:  # a fixture the exporter cannot make is reported, not fatal
            print(f"  FAILED: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        e = manifest[spec.name]
        print(
            f"  nodes {e['node_types']}  ops {e['operators']}  executorch: {e['executorch_runtime']}"
        )
    manifest = dict(sorted(manifest.items()))
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
