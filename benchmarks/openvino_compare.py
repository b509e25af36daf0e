#!/usr/bin/env python3
"""OpenVINO-lowered programs on ptexec against the same models lowered to XNNPACK.

Usage:
    python benchmarks/openvino_compare.py [--rounds 15] [--block-ms 50] [--threads 1]

Each model (a MobileNet-style CNN on 3x96x96, a transformer stack, a 3-layer 1024-wide MLP,
the small MLP of the tests) is exported three ways with ExecuTorch's exporter:
``OpenvinoPartitioner`` (run by the openvino runtime inside ptexec's method),
``XnnpackPartitioner`` (run by ptexec with ``xnnpack="auto"``: ExecuTorch's XNNPACK kernels)
and no delegate (ptexec's portable kernels). The three methods are timed in interleaved
blocks of calls; printed: the median time per call of each and the ratios to XNNPACK (below
1: faster than XNNPACK). OpenVINO's CPU plugin computes in its default precision (bfloat16
on CPUs with AMX): the ratios compare what each delegate ships, not equal arithmetic. Needs
the openvino extra and nncf.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "tests"))

from models import MobileNetLike, TransformerStack  # noqa: E402

import ptexec  # noqa: E402
from openvino_models import MLP, lower  # noqa: E402


def _mlp1024() -> nn.Module:
    return nn.Sequential(
        nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)
    )


def _cases() -> list[tuple[str, Callable[[], nn.Module], tuple[torch.Tensor, ...]]]:
    return [
        ("mobilenet_like", MobileNetLike, (torch.randn(1, 3, 96, 96),)),
        ("transformer", TransformerStack, (torch.randn(1, 32, 256),)),
        ("mlp1024", _mlp1024, (torch.randn(8, 1024),)),
        ("mlp_small", MLP, (torch.randn(2, 8),)),
    ]


def _xnnpack(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(model, inputs)
    return (
        to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    )


def _portable(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> bytes:
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(torch.export.export(model, inputs)).to_executorch().buffer


def _block(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block-ms", type=float, default=50.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    ptexec.set_num_threads(args.threads)
    import openvino as ov

    print(f"OpenVINO {ov.get_version()}; threads {args.threads}; median of {args.rounds} rounds")
    print(
        f"{'model':16} {'openvino us':>12} {'xnnpack us':>11} {'portable us':>12} "
        f"{'ov/xnn':>7} {'port/xnn':>9}"
    )
    for name, make, inputs in _cases():
        torch.manual_seed(0)
        model = make().eval()
        programs = {
            "openvino": lower(name, model, inputs).pte,
            "xnnpack": _xnnpack(model, inputs),
            "portable": _portable(model, inputs),
        }
        with torch.no_grad():
            want = model(*inputs)
        calls: dict[str, Callable[[], Any]] = {}
        for kind, pte in programs.items():
            method = ptexec.load(pte).load_method()
            (got,) = method.execute(list(inputs))
            err = float((got - want).abs().max())
            if err > 0.1 * float(want.abs().max()) + 1e-3:
                raise SystemExit(f"{name} {kind}: wrong result (max error {err:.3g})")
            args_list = list(inputs)
            calls[kind] = lambda method=method, a=args_list: method.execute(a)
        per = {k: _block(fn, 3) for k, fn in calls.items()}  # warm, and size the blocks
        sizes = {k: max(1, int(args.block_ms / 1000 / max(t, 1e-7))) for k, t in per.items()}
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(args.rounds):
            for k, fn in calls.items():
                times[k].append(_block(fn, sizes[k]))
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        print(
            f"{name:16} {med['openvino']:12.1f} {med['xnnpack']:11.1f} {med['portable']:12.1f} "
            f"{med['openvino'] / med['xnnpack']:7.2f} {med['portable'] / med['xnnpack']:9.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
