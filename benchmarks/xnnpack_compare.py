#!/usr/bin/env python3
"""ptexec vs ExecuTorch+XNNPACK on the same XNNPACK-delegated files.

Usage:
    python benchmarks/xnnpack_compare.py [--only NAME ...] [--no-fixtures] [--no-models]
                                         [--baseline SRC] [--baseline-runner torch|executorch]
                                         [--no-et-runner] [--rounds 15]
                                         [--block-ms 20] [--clock cpu|wall] [--threads N]

For every XNNPACK fixture (tests/fixtures/xnnpack) and, unless --no-models, a few larger
models exported here with ``XnnpackPartitioner`` (the MobileNet-style CNN and transformer
stack of benchmarks/models.py and a 3-layer 1024-wide MLP in float32 and quantized
recipes, and the fixture script's four reduced real networks in float32, the twins of
their static int8 fixtures), the same ``.pte`` is run by ptexec with each XNNPACK runner
(``torch``: ptexec's torch code, ``xnnpack="torch"``; ``et-runner``: ExecuTorch's XNNPACK
backend inside ptexec's method, ``xnnpack="executorch"``, unless --no-et-runner), by
ExecuTorch's runtime (``executorch.runtime``, whose pybindings include the XNNPACK
backend), and with ``--baseline SRC`` by a second ptexec (another checkout's ``src``, with
the runner ``--baseline-runner`` names, ``torch`` by default): before and after a change,
in one run.

Each runtime runs in a worker process of its own; the parent asks them for blocks of calls
in a shuffled order per round, so that whatever else the machine does weighs on all alike,
and prints the median per-call time of each, the ratio to ExecuTorch (below 1: faster than
ExecuTorch), the geometric mean per recipe, over the fixtures, the models and all, and for
each network the int8 / float32 ratio of each runtime. The time is the calling thread's CPU time by default
(``--clock cpu``): on a machine shared with other work, wall-clock figures include the
time a thread waits for a core; ``--clock wall`` measures wall-clock time. Every runtime
runs on one thread by default (``--threads N`` sets torch's threads and ExecuTorch's
thread pool; with more than one, CPU time counts only the calling thread: use wall).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "xnnpack"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

_WORKER = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
kind, threads, clock_name, runner = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if threads:
    torch.set_num_threads(threads)
if kind == "executorch":
    from executorch.runtime import Runtime
    if threads:
        from executorch.extension.pybindings import portable_lib
        portable_lib._unsafe_reset_threadpool(threads)
    def load(path):
        return Runtime.get().load_program(path).load_method("forward")
else:
    import ptexec
    if threads and hasattr(ptexec, "set_num_threads"):
        ptexec.set_num_threads(threads)  # also ExecuTorch's pool, for runner "executorch"
    try:  # the native steps, built (once per machine) before anything is timed
        from ptexec import native
    except ImportError:
        try:
            from ptexec.engine import native  # (older checkouts)
        except ImportError:
            native = None
    if native is not None:
        native.wait()
    def load(path):
        prog = ptexec.load(path)
        try:
            return prog.load_method("forward", xnnpack=runner)
        except TypeError:  # a checkout from before the runner option: its one runner
            return prog.load_method("forward")
clock = time.thread_time if clock_name == "cpu" else time.perf_counter
methods = {}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    key = req["path"]
    if key not in methods:
        try:
            m = load(req["path"])
            xs = torch.load(req["inputs"], weights_only=False)
            for _ in range(5):
                m.execute(xs)
            methods[key] = (m, xs)
        except Exception as e:
            methods[key] = f"{type(e).__name__}: {e}"
    if isinstance(methods[key], str):
        print(json.dumps({"error": methods[key][:200]}), flush=True)
        continue
    m, xs = methods[key]
    n = req["calls"]
    t0 = clock()
    for _ in range(n):
        m.execute(xs)
    print(json.dumps({"per_call": (clock() - t0) / n}), flush=True)
"""


class _Worker:
    """One runtime in a process of its own, timing blocks of calls on request."""

    def __init__(
        self, kind: str, src: Path, threads: int, clock: str, runner: str = "torch"
    ) -> None:
        env = dict(os.environ, PYTHONPATH=str(src.resolve()))
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, kind, str(threads), clock, runner],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited ({self.proc.wait()})")
        return json.loads(line)  # type: ignore[no-any-return]

    def block(self, pte: Path, inputs: Path, calls: int) -> float:
        assert self.proc.stdin is not None
        req = {"path": str(pte), "inputs": str(inputs), "calls": calls}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        return float(reply["per_call"]) if "per_call" in reply else math.nan

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def measure(
    workers: dict[str, _Worker], pte: Path, inputs: Path, rounds: int, block_s: float
) -> dict[str, float]:
    """Median seconds per call of each runtime, over ``rounds`` shuffled rounds of
    blocks of about ``block_s`` seconds."""
    first = {k: w.block(pte, inputs, 3) for k, w in workers.items()}
    ok = [k for k, t in first.items() if not math.isnan(t)]  # a runtime that cannot run it
    calls = {k: max(1, int(block_s / max(first[k], 1e-7))) for k in ok}
    times: dict[str, list[float]] = {k: [] for k in ok}
    rng = random.Random(str(pte))
    for _ in range(rounds):
        order = list(ok)
        rng.shuffle(order)
        for k in order:
            times[k].append(workers[k].block(pte, inputs, calls[k]))
    out = {k: math.nan for k in workers}
    out.update({k: statistics.median(v) for k, v in times.items()})
    return out


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

    def plain(cls: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
        return cls

    def bn(cls: Callable[[], nn.Module], shape: tuple[int, ...]) -> Callable[[], nn.Module]:
        return lambda: mk.reestimate_bn(cls(), shape)

    plans: list[tuple[str, Callable[[], nn.Module], tuple[int, ...], Sequence[str]]] = [
        ("mobilenet", plain(MobileNetLike), (1, 3, 96, 96), ("fp32", "int8_static_pc")),
        (
            "transformer_stack",
            plain(TransformerStack),
            (1, 64, 256),
            ("fp32", "int8_dynamic_pc", "int4_group"),
        ),
        (
            "wide_mlp",
            plain(WideMLP),
            (8, 1024),
            ("fp32", "int8_dynamic_pc", "int4_pc", "int4_group"),
        ),
        # the float32 twins of the network fixtures (their int8 versions are fixtures)
        ("mobilenet_v2", bn(mk.MobileNetV2, (1, 3, 48, 48)), (1, 3, 48, 48), ("fp32",)),
        (
            "mobilenet_v3_small",
            bn(mk.MobileNetV3Small, (1, 3, 48, 48)),
            (1, 3, 48, 48),
            ("fp32",),
        ),
        ("deit_tiny", bn(mk.DeiT, (1, 3, 32, 32)), (1, 3, 32, 32), ("fp32",)),
        ("yolo", bn(mk.TinyYOLO, (1, 3, 48, 48)), (1, 3, 48, 48), ("fp32",)),
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


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--no-fixtures", action="store_true")
    ap.add_argument("--no-models", action="store_true")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout's src")
    ap.add_argument(
        "--baseline-runner",
        choices=("torch", "executorch"),
        default="torch",
        help="the baseline's XNNPACK runner",
    )
    ap.add_argument("--no-et-runner", action="store_true", help='skip xnnpack="executorch"')
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block-ms", type=float, default=20.0)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    tmp = tempfile.TemporaryDirectory()
    tmpdir = Path(tmp.name)
    cases: list[tuple[str, str, Path, list[Any]]] = []
    if not args.no_fixtures:
        manifest = json.loads((FIXTURES / "manifest.json").read_text())
        for name, entry in manifest.items():
            calls = torch.load(FIXTURES / f"{name}.io.pt", weights_only=True)["calls"]
            cases.append((name, entry["recipe"], FIXTURES / entry["pte"], calls[0]["inputs"]))
    fixtures = {c[0] for c in cases}
    if not args.no_models:
        wanted = set(args.only or [])
        cases += [c for c in _models(tmpdir) if not wanted or c[0] in wanted]
    if args.only:
        cases = [c for c in cases if c[0] in args.only]
    workers = {"torch": _Worker("ptexec", ROOT / "src", args.threads, args.clock)}
    if args.baseline is not None:
        workers["baseline"] = _Worker(
            "ptexec", args.baseline, args.threads, args.clock, args.baseline_runner
        )
    if not args.no_et_runner:
        workers["et-runner"] = _Worker(
            "ptexec", ROOT / "src", args.threads, args.clock, "executorch"
        )
    workers["executorch"] = _Worker("executorch", ROOT / "src", args.threads, args.clock)
    cols = [k for k in workers if k != "executorch"]
    print(
        f"threads {args.threads}; {args.clock} time; median of {args.rounds} rounds; us per call"
        + (f"; baseline: {args.baseline}" if args.baseline else "")
    )
    head = f"{'program':36s} {'recipe':22s}" + "".join(f" {k:>10s}" for k in workers)
    print(head + "".join(f" {k + '/ET':>12s}" for k in cols))
    ratios: dict[str, dict[str, list[float]]] = {k: {} for k in cols}
    times: dict[str, dict[str, float]] = {}
    try:
        for name, recipe, pte, inputs in cases:
            ipath = tmpdir / f"{name}.inputs.pt"
            torch.save(inputs, ipath)
            t = measure(workers, pte, ipath, args.rounds, args.block_ms / 1000)
            times[name] = t
            row = f"{name:36s} {recipe:22s}" + "".join(f" {t[k] * 1e6:10.1f}" for k in workers)
            for k in cols:
                r = t[k] / t["executorch"]
                if not math.isnan(r):
                    ratios[k].setdefault(recipe, []).append(r)
                row += f" {r:12.2f}"
            print(row, flush=True)
    finally:
        for w in workers.values():
            w.close()
    print("\nratio to ExecuTorch (geometric mean; < 1: faster than ExecuTorch)")
    recipes = list(dict.fromkeys(r for k in cols for r in ratios[k]))
    print(f"  {'recipe':22s}" + "".join(f" {k:>10s} {'n':>3s}" for k in cols))
    for recipe in recipes:
        cells = ""
        for k in cols:
            rs = ratios[k].get(recipe, [])
            cells += f" {_geomean(rs):10.2f} {len(rs):3d}"
        print(f"  {recipe:22s}{cells}")
    groups = {
        "fixtures": [n for n in times if n in fixtures],
        "models": [n for n in times if n not in fixtures],
    }
    for label, names in groups.items():
        if names:
            cells = ""
            for k in cols:
                rs = [times[n][k] / times[n]["executorch"] for n in names]
                rs = [r for r in rs if not math.isnan(r)]
                cells += f" {_geomean(rs):10.2f} {len(rs):3d}"
            print(f"  {label:22s}{cells}")
    cells = ""
    for k in cols:
        every = [r for v in ratios[k].values() for r in v]
        cells += f" {_geomean(every):10.2f} {len(every):3d}"
    print(f"  {'all':22s}{cells}")
    if len(cols) > 1:  # over the programs every runtime ran
        both = [n for n, t in times.items() if not any(math.isnan(t[k]) for k in workers)]
        cells = "".join(
            f" {_geomean([times[n][k] / times[n]['executorch'] for n in both]):10.2f}"
            f" {len(both):3d}"
            for k in cols
        )
        print(f"  {'all (run by each)':22s}{cells}")
    pairs = [
        (n[: -len("_int8_static_pc")], n)
        for n in times
        if n.endswith("_int8_static_pc") and n[: -len("_int8_static_pc")] + "_fp32" in times
    ]
    if pairs:
        print("\nint8 / float32 time of the same network (below 1: int8 faster)")
        print(f"  {'network':28s}" + "".join(f" {k:>10s}" for k in workers))
        for base, q in pairs:
            f = times[base + "_fp32"]
            print(f"  {base:28s}" + "".join(f" {times[q][k] / f[k]:10.2f}" for k in workers))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
