"""Load time: ptexec's ``load`` + ``load_method`` against ExecuTorch's, on the same bytes.

    python benchmarks/load_time.py                     # fixtures, LLM programs, long LSTMs
    python benchmarks/load_time.py --steps 25 100 300  # LSTM lengths (instructions grow ~14x)
    python benchmarks/load_time.py --big               # a ~200 MB program: read vs mmap=True
    python benchmarks/load_time.py --llm-model smollm2-135m --llm-only  # SmolLM2-135M's shape

Each program is loaded from bytes by both runtimes, alternately, in one process, one
thread; each figure is the median over the rounds. The unrolled LSTM programs (a cell
applied ``steps`` times, as an exported recurrent model is) show how load time grows with
the number of instructions: it should grow linearly. "first" loads bytes this process has
not decoded before (the in-process caches of validated program descriptions, compiled
generated code, generated fast calls, dataflow decisions, kernel statements, buffer
placements, descriptions and specs of methods, decoded XNNPACK graphs, their checks, the
one-delegate programs written for ExecuTorch, also by each call's place, and the
ExecuTorch methods freed methods left are emptied before each such load) and finds the
generated code an earlier process kept on disk (``ptexec.codestore``, as a new process
loading a program loaded before does); "cold" is the same with the code store off (a
program no process has loaded: every text compiled); "again" loads the same bytes once
more, the earlier load's method freed, as a reload does; "alive" loads them once more
while another method of them is alive, as a second worker does. The two differ for
XNNPACK programs: a freed method's ExecuTorch methods serve the next load
(``executorch_runner.retire``). Exports are cached on disk
(``$PTEXEC_BENCH_CACHE``, default a folder in the temporary directory).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import ptexec  # noqa: E402


class _Unrolled(torch.nn.Module):
    """An LSTM cell applied ``steps`` times in Python: every step is its own instructions."""

    def __init__(self, steps: int, width: int = 16) -> None:
        super().__init__()
        self.steps = steps
        self.cell = torch.nn.LSTMCell(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], self.cell.hidden_size)
        c = torch.zeros_like(h)
        for t in range(self.steps):
            h, c = self.cell(x[:, t % x.shape[1]], (h, c))
        return h


def _cache_dir() -> Path:
    d = Path(os.environ.get("PTEXEC_BENCH_CACHE") or Path(tempfile.gettempdir()) / "ptexec-bench")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _cached(key: str, make: Callable[[], bytes]) -> bytes:
    import executorch

    digest = hashlib.sha256(f"{key} {torch.__version__} {executorch.__file__}".encode()).hexdigest()
    path = _cache_dir() / f"{key}-{digest[:12]}.pte"
    if not path.exists():
        data = make()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path.read_bytes()


def _lstm(steps: int) -> bytes:
    def make() -> bytes:
        from executorch.exir import to_edge

        torch.manual_seed(0)
        module = _Unrolled(steps).eval()
        x = torch.randn(2, 8, 16)
        with torch.no_grad():
            ep = torch.export.export(module, (x,))
        return bytes(to_edge(ep).to_executorch().buffer)

    return _cached(f"lstm{steps}", make)


def benchmark_programs(
    steps: list[int],
    llm: bool,
    llm_model: str = "tiny",
    only_llm: bool = False,
    variants: tuple[str, ...] = ("portable", "xnnpack", "xnnpack_8da4w"),
) -> dict[str, bytes]:
    programs: dict[str, bytes] = {}
    if not only_llm:
        programs = {
            name: (ROOT / "tests" / "fixtures" / f"{name}.pte").read_bytes()
            for name in ("mlp", "transformer", "llama_sdpa_kv")
        }
        xnn = ROOT / "tests" / "fixtures" / "xnnpack" / "cnn.pte"
        programs["xnnpack cnn"] = xnn.read_bytes()
    if llm:
        try:
            import llm_programs

            model = llm_programs.MODELS[llm_model]
            prefix = "llama" if llm_model == "tiny" else llm_model
            for variant in variants:
                path = llm_programs.program_path(variant, model)
                programs[f"{prefix} {variant}"] = Path(path).read_bytes()
            if llm_model == "tiny" and not only_llm:
                # as many layers (and XNNPACK delegates: ten a layer) as SmolLM2-135M, tiny
                # weights
                deep = llm_programs.TinyLlama(n_layers=30)
                programs["llama 8da4w x30"] = Path(
                    llm_programs.program_path("xnnpack_8da4w", deep)
                ).read_bytes()
        except Exception as e:  # the LLM exporter needs more than this benchmark
            print(f"(no LLM programs: {type(e).__name__}: {e})", file=sys.stderr)
    for n in [] if only_llm else steps:
        programs[f"lstm x{n}"] = _lstm(n)
    return programs


_BIG_SCRIPT = r"""
import json, sys, time
def status():
    out = {}
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(('VmRSS', 'RssAnon', 'RssFile', 'RssShmem')):
                k, v = line.split(':')
                out[k] = int(v.split()[0]) * 1024
    return out
import torch, ptexec
import ptexec.method  # import ptexec fully: importing is not loading a program
x = torch.randn(1, 2048)
torch.mm(torch.randn(64, 64), torch.randn(64, 64))
s0 = status()
t0 = time.perf_counter()
prog = ptexec.load(sys.argv[1], mmap=sys.argv[2] == "mmap")
m = prog.load_method('forward')
t1 = time.perf_counter()
m.execute([x])
t2 = time.perf_counter()
s1 = status()
print(json.dumps({'load': t1 - t0, 'first_call': t2 - t0, 'before': s0, 'after': s1}))
"""


def big_program(rounds: int) -> None:
    """Load + first call of a ~200 MB program in fresh processes, read into private memory
    (the default) and memory-mapped (``mmap=True``), alternately; medians, and memory growth."""
    import subprocess

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from models import BigMLP

    def make() -> bytes:
        from executorch.exir import to_edge

        torch.manual_seed(0)
        module = BigMLP().eval()
        with torch.no_grad():
            ep = torch.export.export(module, (torch.randn(1, 2048),))
        return bytes(to_edge(ep).to_executorch().buffer)

    data = _cached("big_mlp", make)
    path = next(_cache_dir().glob("big_mlp-*.pte"))
    runs: dict[str, list[dict[str, Any]]] = {"read": [], "mmap": []}
    for _ in range(rounds):
        for how in runs:
            out = subprocess.run(
                [sys.executable, "-c", _BIG_SCRIPT, str(path), how],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[how].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"a {len(data) / 1e6:.0f} MB program (page cache warm), median of {rounds} processes:")
    for how, rs in runs.items():
        load = statistics.median(r["load"] for r in rs)
        first = statistics.median(r["first_call"] for r in rs)
        anon = statistics.median(
            sum(r["after"].get(k, 0) - r["before"].get(k, 0) for k in ("RssAnon", "RssShmem"))
            for r in rs
        )
        rss = statistics.median(r["after"]["VmRSS"] - r["before"]["VmRSS"] for r in rs)
        print(
            f"  {how:<5} load {load * 1e3:7.1f} ms, load + first call {first * 1e3:7.1f} ms, "
            f"anonymous memory +{anon / 1e6:6.1f} MB, resident +{rss / 1e6:6.1f} MB"
        )


def _executorch_loader() -> Callable[[bytes, str], Any] | None:
    try:
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
        from executorch.runtime import Runtime
    except ImportError:
        return None
    runtime = Runtime.get()

    def load(data: bytes, method: str) -> Any:
        return runtime.load_program(data).load_method(method)

    return load


def ptexec_load(data: bytes, method: str) -> Any:
    return ptexec.load(data).load_method(method)


def caches() -> dict[str, Callable[[], None]]:
    """The in-process caches a repeated load reuses, each by the name of the function that
    empties it (``module.clear_...``), in the order a first load meets them; what an older
    checkout lacks (side-by-side runs) is left out."""
    import importlib

    found: dict[str, Callable[[], None]] = {}
    for module, name in (
        ("ptexec.format.pte", "clear_decoded"),
        ("ptexec.codegen", "clear_compiled"),
        ("ptexec.codestore", "clear_trusted"),
        ("ptexec.delegates.xnnpack.schema", "clear_decoded_graphs"),
        ("ptexec.format.pte_write", "clear_written"),
        ("ptexec.delegates.xnnpack.checked", "clear_checked"),
        ("ptexec.delegates.xnnpack.executorch_runner", "clear_sources"),
        ("ptexec.delegates.xnnpack.backend", "clear_kept_programs"),
        ("ptexec.loader.instructions", "clear_kept_statements"),
        ("ptexec.loader.devices", "clear_placements"),
        ("ptexec.loader.values", "clear_recipes"),
        ("ptexec.effects", "clear_dynamic_scalars"),
        ("ptexec.engine.fastcall", "clear_generated"),
        ("ptexec.loader.meta", "clear_metas"),
        ("ptexec.loader.specs", "clear_specs"),
        ("ptexec.loader.dataflow", "clear_recipes"),
    ):
        try:
            clear = getattr(importlib.import_module(module), name, None)
        except ImportError:  # (older checkouts, for side-by-side runs)
            continue
        if clear is not None:
            found[f"{module.rsplit('.', 1)[1]}.{name}"] = clear
    return found


def forget_loads() -> None:
    """Empty the in-process caches a repeated load reuses (a first load finds nothing)."""
    from ptexec.delegates.xnnpack import schema
    from ptexec.format import pte_write
    from ptexec.loader import dataflow

    for clear in caches().values():
        clear()
    for module, name in (
        (dataflow, "_recipes"),  # (older checkouts: no clear_recipes)
        (dataflow, "_keys"),
        (schema, "_graphs"),  # (older checkouts: plain dicts)
        (pte_write, "_written"),
    ):
        getattr(module, name, {}).clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", nargs="*", type=int, default=[25, 50, 100, 200, 300])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-llm", action="store_true", help="skip the exported LLM programs")
    parser.add_argument("--big", action="store_true", help="only the ~200 MB program")
    parser.add_argument(
        "--llm-model",
        default="tiny",
        help="shape of the LLM programs (scripts/llm_programs.py MODELS; default tiny)",
    )
    parser.add_argument("--llm-only", action="store_true", help="only the LLM programs")
    parser.add_argument(
        "--llm-variants",
        nargs="*",
        default=["portable", "xnnpack", "xnnpack_8da4w"],
        help="the LLM programs (scripts/llm_programs.py VARIANTS)",
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with this process's CPU clock (steadier on a machine others load)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.big:
        big_program(args.rounds)
        return 0
    clock = time.process_time if args.cpu_time else time.perf_counter
    et = _executorch_loader()
    programs = benchmark_programs(
        args.steps, not args.no_llm, args.llm_model, args.llm_only, tuple(args.llm_variants)
    )
    print(
        f"{'program':<20} {'instructions':>12} {'cold':>10} {'first':>10} {'again':>10} "
        f"{'alive':>10} {'ExecuTorch':>11} {'cold':>6} {'first':>6} {'again':>6} {'alive':>6}"
    )
    ratios: dict[str, list[float]] = {"cold": [], "first": [], "again": [], "alive": []}
    store = os.environ.get("PTEXEC_CODE_CACHE")
    for name, data in programs.items():
        prog = ptexec.load(data)
        method = "forward" if "forward" in prog.method_names else prog.method_names[0]
        n = prog.method_meta(method).num_instructions
        ptexec_load(data, method)  # resolves its operators, keeps its code on disk
        times: dict[str, list[float]] = {
            "cold": [],
            "first": [],
            "again": [],
            "alive": [],
            "executorch": [],
        }
        for _ in range(args.rounds):
            forget_loads()
            os.environ["PTEXEC_CODE_CACHE"] = "0"
            t = clock()
            ptexec_load(data, method)
            times["cold"].append(clock() - t)
            if store is None:
                del os.environ["PTEXEC_CODE_CACHE"]
            else:
                os.environ["PTEXEC_CODE_CACHE"] = store
            forget_loads()
            t = clock()
            ptexec_load(data, method)
            times["first"].append(clock() - t)
            t = clock()
            ptexec_load(data, method)
            times["again"].append(clock() - t)
            held = ptexec_load(data, method)
            t = clock()
            ptexec_load(data, method)
            times["alive"].append(clock() - t)
            del held
            if et is not None:
                t = clock()
                et(data, method)
                times["executorch"].append(clock() - t)
        cold = statistics.median(times["cold"])
        first = statistics.median(times["first"])
        again = statistics.median(times["again"])
        alive = statistics.median(times["alive"])
        theirs = statistics.median(times["executorch"]) if times["executorch"] else float("nan")
        ratios["cold"].append(cold / theirs)
        ratios["first"].append(first / theirs)
        ratios["again"].append(again / theirs)
        ratios["alive"].append(alive / theirs)
        print(
            f"{name:<20} {n:>12} {cold * 1e3:>8.2f}ms {first * 1e3:>8.2f}ms "
            f"{again * 1e3:>8.2f}ms {alive * 1e3:>8.2f}ms {theirs * 1e3:>9.2f}ms "
            f"{cold / theirs:>6.1f} {first / theirs:>6.1f} {again / theirs:>6.1f} "
            f"{alive / theirs:>6.1f}",
            flush=True,
        )
    if et is not None and ratios["first"]:
        for what, rs in ratios.items():
            print(
                f"{what}: geomean {statistics.geometric_mean(rs):.1f}x ExecuTorch, "
                f"max {max(rs):.1f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
