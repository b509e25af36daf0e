#!/usr/bin/env python3
"""Kernel choices for XNNPACK payloads, measured side by side in one run.

Usage:
    python benchmarks/xnnpack_kernels.py [--only linear|int4|conv|deconv|pool] [--clock cpu|wall]

Prints, per shape, the time of each way torch can compute the same node, and the choice
ptexec's XNNPACK runner makes for it:

* ``linear``: a dynamically quantized fully connected node with int8 per-channel weights
  on an input quantized per token. ptexec: XNNPACK's per-row quantization, then either a
  float32 product of the centered integers (exact when the weights prove it) or
  ``torch._int_mm``; for reference ``torch._weight_int8pack_mm`` (weight-only: float
  activations, which would drop the program's activation quantization) and ``F.linear``
  on float weights.
* ``int4``: the same with 4-bit weights in blocks of 32 (8da4w). ptexec: the dequantized
  per-token activations times weights dequantized at load (``F.linear``); for reference
  ``torch._weight_int4pack_mm_for_cpu`` (weight-only) and ``torch._dyn_quant_matmul_4bit``
  (its own activation quantization, not XNNPACK's).
* ``conv``: 2-d convolutions in NHWC (channels-last memory): oneDNN on channels-last
  tensors, oneDNN on NCHW copies, ``torch._C._nn._slow_conv2d_forward`` (im2col + GEMM, NCHW),
  for regular and depthwise filters; transposed convolutions: oneDNN, and
  ``torch.ops.aten.slow_conv_transpose2d`` (direct, NCHW).
* ``pool``: max and average pooling of NHWC values held in NCHW memory (the partitioner's
  transpose of a channels-first input): in place, or after a copy to channels-last memory.

Times are the median over interleaved blocks of the calling thread's CPU time by default
(``--clock cpu``): on a machine shared with other work, wall-clock figures include the time
the thread waits for a core; ``--clock wall`` measures wall-clock time instead.
"""

# ruff: noqa: B023  (each case's lambdas are timed within their own loop iteration)
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from ptexec.delegates.xnnpack import quant as qa  # noqa: E402
from ptexec.delegates.xnnpack import thresholds  # noqa: E402


def _bench(
    fns: dict[str, Callable[[], Any]], clock: Callable[[], float], n: int = 20
) -> dict[str, float]:
    """Median microseconds per call of each function, timed in interleaved blocks."""
    for f in fns.values():
        for _ in range(3):
            f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(15):
        for k, f in fns.items():
            t0 = clock()
            for _ in range(n):
                f()
            times[k].append((clock() - t0) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def _row(label: str, r: dict[str, float], choice: str) -> None:
    cells = "  ".join(f"{k} {v:8.1f}" for k, v in r.items())
    print(f"{label:28s} {cells}   ptexec: {choice}")


def linear(clock: Callable[[], float]) -> None:
    print("dynamically quantized linear, int8 per-channel weights (us)")
    for m, k, n in ((1, 128, 384), (1, 512, 512), (8, 128, 384), (64, 256, 768), (1, 2048, 2048)):
        x = torch.randn(m, k)
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        ws = torch.rand(n) * 0.01
        b = torch.randn(n)
        wf, wt = w.float(), w.t().contiguous()
        colsum = w.sum(1, dtype=torch.int32)
        exact = qa.exact_in_float32(float(w.abs().sum(1, dtype=torch.int64).max()), 255, 0)
        fns: dict[str, Callable[[], Any]] = {
            "float32": lambda: qa.rows_linear_float(
                qa.quantize_rows(x, 1), (m,), wf, ws, b, torch.float32
            ),
            "int_mm": lambda: qa.rows_linear_int(
                qa.quantize_rows(x, 1), (m,), wt, colsum, ws, b, torch.float32
            ),
            "int8pack(w-only)": lambda: torch._weight_int8pack_mm(x, w, ws),
            "F.linear": lambda: F.linear(x, wf, b),
        }
        choice = "float32" if exact and w.numel() < thresholds.INT_MM_WEIGHTS else "int_mm"
        _row(f"{m}x{k} @ {k}x{n}", _bench(fns, clock), choice)


def int4(clock: Callable[[], float]) -> None:
    print("8da4w linear, 4-bit weights in blocks of 32 (us)")
    g = 32
    for m, k, n in ((1, 128, 384), (1, 512, 1536), (8, 128, 384), (1, 2048, 2048)):
        x = torch.randn(m, k)
        w = torch.randint(-8, 8, (n, k), dtype=torch.int32)
        scales = torch.rand(n, k // g) * 0.01 + 1e-3
        wf = (w.float().reshape(n, k // g, g) * scales[:, :, None]).reshape(n, k)
        fns: dict[str, Callable[[], Any]] = {
            "ptexec": lambda: F.linear(
                qa.rows_values(qa.quantize_rows(x, 1), (m, k), torch.float32), wf
            ),
        }
        try:  # tinygemm: w = (q - 8) * scale + zero, q = w + 8 unsigned
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu((w + 8).to(torch.int32), 1)
            sz = torch.stack([scales.t(), torch.zeros_like(scales.t())], dim=-1).contiguous()
            fns["int4pack(w-only)"] = lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, packed, g, sz
            )
        except (RuntimeError, NotImplementedError) as e:
            print(f"  _weight_int4pack_mm_for_cpu: {str(e).splitlines()[0][:80]}")
        try:  # two unsigned nibbles per byte, low first
            nib = ((w[:, 1::2] + 8) << 4 | (w[:, ::2] + 8)).to(torch.uint8)
            pw = torch.ops.aten._dyn_quant_pack_4bit_weight(nib, scales, torch.zeros(n), g, k, n)
            fns["dyn_quant_4bit"] = lambda: torch.ops.aten._dyn_quant_matmul_4bit(x, pw, g, k, n)
        except (RuntimeError, NotImplementedError) as e:
            print(f"  _dyn_quant_matmul_4bit: {str(e).splitlines()[0][:80]}")
        _row(f"{m}x{k} @ {k}x{n}", _bench(fns, clock), "ptexec")


def conv(clock: Callable[[], float]) -> None:
    print("conv2d on NHWC activations (us); shape: N, C, H, W -> OC, kernel, stride, groups")
    slow = torch.ops.aten._slow_conv2d_forward
    shapes = [
        (2, 4, 10, 9, 6, 3, 1, 1),
        (1, 3, 48, 48, 8, 3, 2, 1),
        (1, 16, 24, 24, 32, 3, 1, 1),
        (1, 32, 12, 12, 64, 3, 1, 1),
        (2, 4, 9, 9, 4, 3, 2, 4),
        (1, 48, 24, 24, 48, 3, 1, 48),
        (1, 96, 48, 48, 96, 3, 2, 96),
        (1, 32, 112, 112, 32, 3, 1, 32),
    ]
    for nb, c, h, w, oc, k, s, groups in shapes:
        xh = torch.randn(nb, h, w, c)  # NHWC, contiguous: channels-last memory
        wt = torch.randn(oc, c // groups, k, k)
        b = torch.randn(oc)
        x_cl = xh.permute(0, 3, 1, 2)
        w_cl = wt.contiguous(memory_format=torch.channels_last)
        p = k // 2
        fns: dict[str, Callable[[], Any]] = {
            "onednn CL": lambda: F.conv2d(x_cl, w_cl, b, s, p, 1, groups),
            "onednn NCHW": lambda: F.conv2d(x_cl.contiguous(), wt, b, s, p, 1, groups),
        }
        if groups == 1:
            fns["slow_conv2d"] = lambda: slow(x_cl.contiguous(), wt, (k, k), b, (s, s), (p, p))
        flops = 2 * nb * oc * (h // s) * (w // s) * k * k * (c // groups)
        tiny = groups == 1 and flops < thresholds.TINY_CONV_FLOPS
        _row(
            f"{(nb, c, h, w)} {oc} k{k} s{s} g{groups}",
            _bench(fns, clock),
            "slow_conv2d" if tiny else "onednn CL",
        )


def deconv(clock: Callable[[], float]) -> None:
    print("transposed conv2d on NHWC activations (us); N, C, H, W -> OC, kernel, stride, groups")
    slow = torch.ops.aten.slow_conv_transpose2d
    for nb, c, h, w, oc, k, s, groups in (
        (2, 4, 5, 6, 6, 3, 2, 1),
        (2, 4, 5, 6, 6, 3, 2, 2),
        (1, 32, 12, 12, 16, 4, 2, 1),
        (1, 64, 24, 24, 32, 2, 2, 1),
    ):
        x_cl = torch.randn(nb, h, w, c).permute(0, 3, 1, 2)
        wt = torch.randn(c, oc // groups, k, k)
        b = torch.randn(oc)
        fns: dict[str, Callable[[], Any]] = {
            "onednn CL": lambda: F.conv_transpose2d(x_cl, wt, b, s, 1, 0, groups),
            "onednn NCHW": lambda: F.conv_transpose2d(x_cl.contiguous(), wt, b, s, 1, 0, groups),
        }
        if groups == 1:
            fns["slow_conv_transpose2d"] = lambda: slow(
                x_cl, wt, (k, k), b, (s, s), (1, 1), (0, 0), (1, 1)
            )
        choice = "slow_conv_transpose2d" if groups == 1 else "onednn CL"
        _row(f"{(nb, c, h, w)} {oc} k{k} s{s} g{groups}", _bench(fns, clock), choice)


def pool(clock: Callable[[], float]) -> None:
    print("pooling NHWC values held in NCHW memory (us); N, C, H, W, window, stride")
    for shape, k, s in (
        ((2, 3, 9, 8), 3, 2),
        ((2, 8, 16, 16), 2, 2),
        ((1, 16, 48, 48), 3, 2),
        ((1, 64, 12, 12), 5, 1),
        ((1, 32, 96, 96), 3, 2),
    ):
        xh = torch.randn(*shape).permute(0, 2, 3, 1)  # an NHWC view of NCHW memory
        p = k // 2
        fns: dict[str, Callable[[], Any]] = {
            "max NCHW": lambda: F.max_pool2d(xh.permute(0, 3, 1, 2), k, s, p),
            "max copy+CL": lambda: F.max_pool2d(xh.contiguous().permute(0, 3, 1, 2), k, s, p),
            "avg NCHW": lambda: F.avg_pool2d(xh.permute(0, 3, 1, 2), k, s, p),
            "avg copy+CL": lambda: F.avg_pool2d(xh.contiguous().permute(0, 3, 1, 2), k, s, p),
        }
        choice = "copy+CL" if xh.numel() >= thresholds.CL_POOL_ELEMENTS else "NCHW"
        _row(f"{shape} k{k} s{s}", _bench(fns, clock), choice)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("linear", "int4", "conv", "deconv", "pool"), default=None)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    cases = (("linear", linear), ("int4", int4), ("conv", conv), ("deconv", deconv), ("pool", pool))
    for name, fn in cases:
        if args.only in (None, name):
            fn(clock)
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
