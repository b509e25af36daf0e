#!/usr/bin/env python3
"""Where a call of a small XNNPACK program goes, with ExecuTorch's backend inside ptexec.

Usage:
    python benchmarks/xnnpack_envelope.py [NAME ...] [--repeat 2000]

For each XNNPACK fixture named (default: op_abs, mlp, cnn), one thread, interleaved
blocks, the median per call of: ExecuTorch's own ``Method.execute`` on the file; the
``execute()`` of the one-delegate method ptexec hands the payload to (the delegate
alone); ptexec with ``xnnpack="executorch"``; ptexec with ``xnnpack="torch"``. The
difference between the third and the second is ptexec's envelope around the delegate
(input checks and copies, the runner's address check, output checks and copies).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "xnnpack"


def _median_us(fns: list[Callable[[], Any]], repeat: int) -> list[float]:
    for fn in fns:
        for _ in range(50):
            fn()
    block = max(repeat // 20, 1)
    times: list[list[float]] = [[] for _ in fns]
    while len(times[0]) < repeat:
        for fn, t in zip(fns, times, strict=True):
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                t.append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e6 for t in times]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=["op_abs", "mlp", "cnn"])
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    import ptexec

    portable_lib._unsafe_reset_threadpool(1)
    print(
        f"{'program':10s} {'ExecuTorch':>11s} {'delegate':>9s} {'executorch':>11s} "
        f"{'torch':>8s}   us per call (median); envelope = executorch - delegate"
    )
    for name in args.names:
        pte = FIXTURES / f"{name}.pte"
        inputs = torch.load(FIXTURES / f"{name}.io.pt", weights_only=True)["calls"][0]["inputs"]
        em = Runtime.get().load_program(pte).load_method("forward")
        prog = ptexec.load(pte)
        pe = prog.load_method("forward", xnnpack="executorch")
        pt = prog.load_method("forward", xnnpack="torch")
        pe.execute(inputs)
        runner = next(
            fn
            for chain in pe.state.chains
            for st in chain.statements
            for fn in st.env.values()
            if getattr(fn, "__name__", "") == "_xnnpack_et_run"
        )
        delegate = runner.__globals__["_execute"]  # the one-delegate method's execute()
        calls: list[Callable[[], Any]] = [
            lambda em=em, x=inputs: em.execute(x),
            delegate,
            lambda pe=pe, x=inputs: pe.execute(x),
            lambda pt=pt, x=inputs: pt.execute(x),
        ]
        e, d, x, t = _median_us(calls, args.repeat)
        print(f"{name:10s} {e:11.1f} {d:9.1f} {x:11.1f} {t:8.1f}   envelope {x - d:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
