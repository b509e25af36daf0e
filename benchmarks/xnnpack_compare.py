#!/usr/bin/env python3
"""ptexec vs ExecuTorch+XNNPACK on the same XNNPACK-delegated files.

Usage:
    python benchmarks/xnnpack_compare.py [--only NAME ...] [--no-fixtures] [--no-models]
                                         [--repeat 200] [--threads N]

For every XNNPACK fixture (tests/fixtures/xnnpack) and, unless --no-models, a few larger
models exported here with ``XnnpackPartitioner`` (the MobileNet-style CNN and transformer
stack of benchmarks/models.py and a 3-layer 1024-wide MLP, in float32 and quantized
recipes), the same ``.pte`` is loaded by ptexec and by ExecuTorch's runtime
(``executorch.runtime``, whose pybindings include the XNNPACK backend); ptexec runs it
twice, with each XNNPACK runner (``xnnpack="torch"``: ptexec's torch code;
``xnnpack="executorch"``: ExecuTorch's XNNPACK backend inside ptexec's method). Calls
alternate between the three in blocks; the median latency of each is printed with the
ratios ptexec / ExecuTorch (below 1: ptexec is faster). Both run on one thread by default
(--threads N sets torch.set_num_threads and ExecuTorch's thread pool; 0 leaves both at
their defaults): in one process, torch's OpenMP threads and XNNPACK's spinning pool
threads compete for the same cores, which distorts multi-threaded figures.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "xnnpack"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))


def _timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


RUNNERS = ("torch", "executorch")


def measure(pte: Path, inputs: list[Any], repeat: int) -> tuple[float, float, float]:
    """Median seconds per call: (ptexec with xnnpack="torch", ptexec with
    xnnpack="executorch", ExecuTorch), the three interleaved in blocks."""
    from executorch.runtime import Runtime

    import ptexec

    prog = ptexec.load(pte)
    calls: list[Callable[[], Any]] = []
    for runner in RUNNERS:
        m = prog.load_method("forward", xnnpack=runner)
        calls.append(lambda m=m: m.execute(inputs))
    em = Runtime.get().load_program(pte).load_method("forward")
    calls.append(lambda: em.execute(inputs))
    for _ in range(5):
        for fn in calls:
            fn()
    block = max(repeat // 10, 1)
    times: list[list[float]] = [[] for _ in calls]
    while len(times[0]) < repeat:
        for fn, t in zip(calls, times, strict=True):
            t += _timed(fn, block)
    med = [statistics.median(t) for t in times]
    return med[0], med[1], med[2]


def _models(out: Path) -> list[tuple[str, str, Path, list[Any]]]:
    """Larger models, exported with the fixture script's recipes."""
    import make_xnnpack_fixtures as mk
    from models import MobileNetLike, TransformerStack
    from torch import nn

    class WideMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(1024, 1024)
            self.b = nn.Linear(1024, 1024)
            self.c = nn.Linear(1024, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    plans: list[tuple[str, Callable[[], torch.nn.Module], tuple[int, ...], Sequence[str]]] = [
        ("mobilenet", MobileNetLike, (1, 3, 96, 96), ("fp32", "int8_static_pc")),
        (
            "transformer_stack",
            TransformerStack,
            (1, 64, 256),
            ("fp32", "int8_dynamic_pc", "int4_group"),
        ),
        ("wide_mlp", WideMLP, (8, 1024), ("fp32", "int8_dynamic_pc", "int4_pc", "int4_group")),
    ]
    made = []
    for base, make, shape, recipes in plans:
        for recipe in recipes:
            torch.manual_seed(0)
            m = make().eval()
            x = torch.randn(*shape)
            calls = [(x,), (torch.randn(*shape),)]
            with torch.no_grad():
                if recipe.startswith("int8"):
                    m = mk._quantize_pt2e(m, calls[0], calls, recipe, None)
                elif recipe.startswith("int4"):
                    m = mk._quantize_torchao(m, recipe)
                et = mk._lower(m, calls[0], recipe, None)
            path = out / f"{base}_{recipe}.pte"
            path.write_bytes(et.buffer)
            made.append((f"{base}_{recipe}", recipe, path, [x]))
    return made


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--no-fixtures", action="store_true")
    ap.add_argument("--no-models", action="store_true")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(args.threads)
    cases: list[tuple[str, str, Path, list[Any]]] = []
    if not args.no_fixtures:
        manifest = json.loads((FIXTURES / "manifest.json").read_text())
        for name, entry in manifest.items():
            calls = torch.load(FIXTURES / f"{name}.io.pt", weights_only=True)["calls"]
            cases.append((name, entry["recipe"], FIXTURES / entry["pte"], calls[0]["inputs"]))
    fixtures = {c[0] for c in cases}
    tmp = tempfile.TemporaryDirectory()
    if not args.no_models:
        cases += _models(Path(tmp.name))
    if args.only:
        cases = [c for c in cases if c[0] in args.only]
    print(
        f"torch threads: {torch.get_num_threads()}; repeat {args.repeat}; median latency per call"
    )
    print(
        f"{'program':34s} {'recipe':22s} {'torch us':>9s} {'et-runner us':>13s} "
        f"{'ExecuTorch us':>14s} {'torch/ET':>9s} {'et-runner/ET':>13s}"
    )
    ratios: dict[str, list[tuple[float, float]]] = {}
    rows = []
    for name, recipe, pte, inputs in cases:
        tt, tx, te = measure(pte, inputs, args.repeat)
        r = (tt / te, tx / te)
        ratios.setdefault(recipe, []).append(r)
        rows.append((name, r))
        print(
            f"{name:34s} {recipe:22s} {tt * 1e6:9.1f} {tx * 1e6:13.1f} {te * 1e6:14.1f} "
            f"{r[0]:9.2f} {r[1]:13.2f}",
            flush=True,
        )

    def gmean(xs: Sequence[float]) -> float:
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    print(
        "\nratio ptexec / ExecuTorch+XNNPACK, geometric mean per recipe (< 1: ptexec faster);"
        '\ncolumns: xnnpack="torch", xnnpack="executorch"'
    )
    for recipe, rs in ratios.items():
        print(
            f"  {recipe:22s} {gmean([a for a, _ in rs]):6.2f} {gmean([b for _, b in rs]):6.2f}"
            f"  ({len(rs)} programs)"
        )
    groups = [
        ("fixtures", [r for n, r in rows if n in fixtures]),
        ("models", [r for n, r in rows if n not in fixtures]),
        ("all", [r for _, r in rows]),
    ]
    for label, rs in groups:
        if rs:
            print(
                f"  {label:22s} {gmean([a for a, _ in rs]):6.2f} {gmean([b for _, b in rs]):6.2f}"
                f"  ({len(rs)} programs)"
            )
    for k, label in enumerate(RUNNERS):
        wins = [n for n, r in rows if r[k] < 1]
        print(f"\nxnnpack={label!r} faster than ExecuTorch on {len(wins)} of {len(rows)}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
