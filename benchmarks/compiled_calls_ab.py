#!/usr/bin/env python3
"""The compiled tier's opaque XNNPACK calls, one choice turned off and on, against ExecuTorch.

Usage:
    python benchmarks/compiled_calls_ab.py [--variant xnnpack_8da4w] [--model tiny]
                                           [--off entry|products] [--blocks 25]

Compiles the same LLM program twice in one process (each into a cache of its own, in a
temporary directory): once with one of the compiled tier's choices about its opaque
calls of XNNPACK's kernels turned off, once as ptexec makes it, and runs both decode
loops interleaved with ExecuTorch's on the same file (thread CPU time of a decode step,
``--steps`` steps a block, median over ``--blocks`` blocks of each runtime's time over
ExecuTorch's in the same block). ``--off`` picks the choice:

- ``entry``: the compiled code calls the delegate calls' op through the native
  library's C entry (``RegionBuilder.native_entry``); off, through AOTInductor's proxy
  executor and torch's dispatcher.
- ``products``: a delegate that multiplies int8 activations by quantized weights is an
  opaque call however small (``node_types.quantized_products``); off, only the
  megabyte rule makes such a product a call, and the rest are traced.

Also printed: the 16-token prefill's CPU time, how long each compiled decoder took to
make (a compile, in its fresh cache) and whether each runtime's greedy tokens equal
ExecuTorch's. One thread (``ptexec.set_num_threads``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "scripts"))
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT.parent / "src"))  # after PYTHONPATH

import llm_decode  # noqa: E402
import llm_programs  # noqa: E402

PROMPT = [(11 * i + 5) % 500 + 3 for i in range(16)]


@contextmanager
def _turned_off(choice: str) -> Iterator[None]:
    from ptexec.compile import external
    from ptexec.compile.runner import RegionBuilder

    if choice == "entry":
        saved: Any = RegionBuilder.native_entry
        RegionBuilder.native_entry = lambda self: False  # type: ignore[method-assign]
        try:
            yield
        finally:
            RegionBuilder.native_entry = saved  # type: ignore[method-assign]
    else:
        saved = external.quantized_products
        external.quantized_products = lambda payload: False  # type: ignore[assignment]
        try:
            yield
        finally:
            external.quantized_products = saved


def _decoder(pte: Path, cache: Path) -> tuple[Any, float]:
    import ptexec
    from ptexec.llm import TextDecoder

    os.environ["PTEXEC_CACHE_DIR"] = str(cache)
    start = time.perf_counter()
    decoder = TextDecoder(ptexec.load(pte), compile=True)
    return decoder, time.perf_counter() - start


def _cpu(fn: Callable[[], object]) -> float:
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="xnnpack_8da4w")
    parser.add_argument("--model", default="tiny", choices=list(llm_programs.MODELS))
    parser.add_argument("--off", default="entry", choices=("entry", "products"))
    parser.add_argument("--blocks", type=int, default=25)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args(argv)

    import ptexec

    ptexec.set_num_threads(1)
    pte = llm_programs.program_path(args.variant, llm_programs.MODELS[args.model])
    home = Path(tempfile.mkdtemp(prefix="ptexec-calls-ab-"))
    with _turned_off(args.off):
        off, off_s = _decoder(pte, home / "off")
    on, on_s = _decoder(pte, home / "on")
    print(f"compiled decoders made in {off_s:.1f} s ({args.off} off), {on_s:.1f} s (on)")
    et = llm_decode.executorch_step(pte)
    decoders = {f"{args.off} off": off, f"{args.off} on": on}
    first = PROMPT[-1]
    steps: dict[str, Callable[[int], object]] = {
        name: partial(d.step, first) for name, d in decoders.items()
    }
    steps["ExecuTorch"] = lambda pos: et([first], pos)
    prefills: dict[str, Callable[[], object]] = {
        name: partial(d.prefill, PROMPT, 0) for name, d in decoders.items()
    }
    prefills["ExecuTorch"] = lambda: et(PROMPT, 0)
    end = len(PROMPT) + args.steps
    per_step: dict[str, list[float]] = {k: [] for k in steps}
    prefill: dict[str, list[float]] = {k: [] for k in steps}
    for name in steps:  # warm up
        prefills[name]()
    for _ in range(args.blocks):
        for name, step in steps.items():
            prefill[name].append(_cpu(prefills[name]))
            per_step[name].append(
                _cpu(lambda step=step: [step(pos) for pos in range(len(PROMPT), end)]) / args.steps
            )

    def greedy(step: Callable[[int, int], torch.Tensor], logits: torch.Tensor) -> list[int]:
        tokens = [int(logits.argmax())]
        for pos in range(len(PROMPT), end):
            tokens.append(int(step(tokens[-1], pos).argmax()))
        return tokens

    reference = greedy(lambda t, pos: et([t], pos), et(PROMPT, 0))
    print(
        f"{args.variant} ({args.model}), {args.steps} decode steps after a 16-token prompt, "
        f"median of {args.blocks} interleaved blocks, 1 thread, thread CPU time"
    )
    print(f"{'runtime':<16}{'step':>12}{'/ ExecuTorch':>14}{'prefill':>12}  same tokens")
    for name in steps:
        ratio = statistics.median(
            a / b for a, b in zip(per_step[name], per_step["ExecuTorch"], strict=True)
        )
        same = "yes"
        if name in decoders:
            d = decoders[name]
            same = "yes" if greedy(d.step, d.prefill(PROMPT, 0)) == reference else "NO"
        print(
            f"{name:<16}{statistics.median(per_step[name]) * 1e6:>10.1f}us{ratio:>14.3f}"
            f"{statistics.median(prefill[name]) * 1e3:>10.3f}ms  {same}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
