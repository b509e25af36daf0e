"""What the ExecuTorch-compatible entry points and ETDump cost per call, side by side.

    python benchmarks/compat_overhead.py             # 1 thread, 9 blocks
    python benchmarks/compat_overhead.py --blocks 5 --calls 200

On committed fixtures (no export): the same program run by ptexec's ``Method.execute``,
``ptexec.runtime``'s ``Method.execute``, ``ptexec.portable_lib``'s ``forward`` (copies and
``clone_outputs=False``), and recorded as ETDump (timings only; with a debug buffer);
ExecuTorch's ``portable_lib`` ``forward`` for reference when it is installed. Runners are
interleaved block by block in a shuffled order; each figure is the median over blocks of
the per-call time, and the ratios are to ptexec's ``Method.execute`` in the same run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import ptexec  # noqa: E402
from fixture_data import fixture_calls, fixture_paths  # noqa: E402
from ptexec import portable_lib  # noqa: E402
from ptexec.etdump import ETDumpRecorder  # noqa: E402
from ptexec.runtime import Runtime  # noqa: E402


def runners(name: str) -> tuple[dict[str, Callable[[], Any]], Callable[[], None]]:
    pte = fixture_paths(name)[0]
    inputs = fixture_calls(name)[0]["inputs"]
    method = ptexec.load(pte).load_method("forward")
    facade = Runtime.get().load_program(pte).load_method("forward")
    module = portable_lib._load_for_executorch(str(pte))
    timing = ETDumpRecorder(0)
    full = ETDumpRecorder(1 << 26)
    timed_method = ptexec.load(pte).load_method("forward")
    out: dict[str, Callable[[], Any]] = {
        "ptexec Method.execute": lambda: method.execute(inputs),
        "ptexec.runtime execute": lambda: facade.execute(inputs),
        "portable_lib forward": lambda: module.forward(inputs),
        "portable_lib forward, clone_outputs=False": lambda: module.forward(inputs, False),
        "ETDump, timings only": lambda: timing.execute(timed_method, inputs),
        "ETDump, with debug buffer": lambda: full.execute(timed_method, inputs),
    }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from executorch.extension.pybindings import portable_lib as et
        et_module = et._load_for_executorch(str(pte))
        out["ExecuTorch portable_lib forward"] = lambda: et_module.forward(inputs)
    except ImportError:
        pass

    def reset() -> None:  # recorders keep every run: start each block empty
        timing.clear()
        full.clear()

    return out, reset


def measure(name: str, blocks: int, calls: int) -> None:
    fns, reset = runners(name)
    for fn in fns.values():
        for _ in range(5):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    rng = random.Random(0)
    for _ in range(blocks):
        rng.shuffle(order)
        for key in order:
            reset()
            fn = fns[key]
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[key].append((time.perf_counter() - t) / calls)
    base = statistics.median(samples["ptexec Method.execute"])
    print(f"\n{name} ({blocks} blocks x {calls} calls, median per call)")
    for key in fns:
        m = statistics.median(samples[key])
        print(f"  {key:<44} {m * 1e6:>10.1f} us   x{m / base:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--models", nargs="*", default=["mlp", "transformer"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.models:
        measure(name, args.blocks, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
