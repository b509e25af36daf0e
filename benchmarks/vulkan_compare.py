#!/usr/bin/env python3
"""Vulkan-lowered programs on ptexec against the same models' XNNPACK programs on ptexec.

Usage:
    python benchmarks/vulkan_compare.py [--rounds 15] [--block-ms 20] [--clock cpu|wall]

For every Vulkan fixture (tests/fixtures/vulkan) whose model has an XNNPACK fixture of the
same name (tests/fixtures/xnnpack: the same module and input shapes), runs on one thread:

- ``vulkan``: the Vulkan program on ptexec (its ATen runner);
- ``xnn-torch``: the XNNPACK program with ptexec's torch runner (``xnnpack="torch"``);
- ``xnn-et``: the XNNPACK program with ExecuTorch's XNNPACK backend inside ptexec
  (``xnnpack="executorch"``), when it can run.

The variants run interleaved: each round asks each for one block of calls (about
``--block-ms``) in a shuffled order, so that whatever else the machine does weighs on all
alike; each figure is the median over the rounds of the per-call time. Prints per model the
times and the ratios vulkan / xnn-torch and vulkan / xnn-et (below 1: the Vulkan program
is faster), and their geometric means.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import ptexec

ROOT = Path(__file__).resolve().parent.parent
VULKAN = ROOT / "tests" / "fixtures" / "vulkan"
XNNPACK = ROOT / "tests" / "fixtures" / "xnnpack"


def _inputs(io: Path) -> list[Any]:
    return list(torch.load(io, weights_only=True)["calls"][0]["inputs"])


def _callers(name: str) -> dict[str, Callable[[], Any]]:
    xs = _inputs(VULKAN / f"{name}.io.pt")
    out: dict[str, Callable[[], Any]] = {}
    vk = ptexec.load(VULKAN / f"{name}.pte").load_method("forward")
    out["vulkan"] = lambda: vk.execute(xs)
    xnn = XNNPACK / f"{name}.pte"
    xt = ptexec.load(xnn).load_method("forward", xnnpack="torch")
    out["xnn-torch"] = lambda: xt.execute(xs)
    try:
        xe = ptexec.load(xnn).load_method("forward", xnnpack="executorch")
    except ptexec.PtexecError:
        pass
    else:
        out["xnn-et"] = lambda: xe.execute(xs)
    return out


def _block(fn: Callable[[], Any], n: int, clock: Callable[[], float]) -> float:
    start = clock()
    for _ in range(n):
        fn()
    return (clock() - start) / n


def measure(
    callers: dict[str, Callable[[], Any]], rounds: int, block_ms: float, clock: Callable[[], float]
) -> dict[str, float]:
    counts = {}
    for key, fn in callers.items():
        for _ in range(3):
            fn()
        t = _block(fn, 5, time.perf_counter)
        counts[key] = max(1, int(block_ms / 1000 / max(t, 1e-7)))
    samples: dict[str, list[float]] = {k: [] for k in callers}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(callers)
        rng.shuffle(order)
        for key in order:
            samples[key].append(_block(callers[key], counts[key], clock))
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block-ms", type=float, default=20.0)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    manifest = json.loads((VULKAN / "manifest.json").read_text())
    names = [n for n in sorted(manifest) if (XNNPACK / f"{n}.pte").exists()]
    results: dict[str, dict[str, float]] = {}
    print(f"{'model':14} {'vulkan':>10} {'xnn-torch':>10} {'xnn-et':>10} {'vk/xt':>7} {'vk/xe':>7}")
    for name in names:
        t = measure(_callers(name), args.rounds, args.block_ms, clock)
        results[name] = t
        xe = t.get("xnn-et")
        print(
            f"{name:14} {t['vulkan'] * 1e6:9.1f}u {t['xnn-torch'] * 1e6:9.1f}u "
            + (f"{xe * 1e6:9.1f}u " if xe else f"{'-':>10} ")
            + f"{t['vulkan'] / t['xnn-torch']:7.2f} "
            + (f"{t['vulkan'] / xe:7.2f}" if xe else f"{'-':>7}"),
            flush=True,
        )
    for other in ("xnn-torch", "xnn-et"):
        ratios = [r["vulkan"] / r[other] for r in results.values() if other in r]
        if ratios:
            gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            print(f"geometric mean vulkan / {other}: {gm:.2f} over {len(ratios)} models")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
