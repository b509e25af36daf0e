"""ptexec vs ExecuTorch's runtime vs eager PyTorch, side by side, on the same programs.

    python benchmarks/compare.py                 # everything, 1 and 2 threads
    python benchmarks/compare.py --quick         # fewer repetitions
    python benchmarks/compare.py --models mlp cnn --threads 1 --json out.json
    python benchmarks/compare.py --threads 1 --xnnpack   # + the XNNPACK-lowered programs
    python benchmarks/compare.py --no-compile    # without the compiled tier

The compiled tier (``load_method(..., compile=True)``) gets its own columns: every program
is compiled once into a fresh cache (and, unless ``--warm-inductor-cache``, with a fresh
inductor cache: the compile time is what a first compile costs), its compile time is
recorded, loading it again from the cache is timed against the interpreter's load, and
its calls are interleaved with the others. With ``--xnnpack`` each model is also lowered
with ``XnnpackPartitioner``: ExecuTorch+XNNPACK runs that file, and so does ptexec
compiled (the delegate's graph traced with its neighbours).

Every model is exported here with ExecuTorch's exporter (the test fixtures' builders plus
a larger transformer stack and a MobileNet-like CNN), and the same ``.pte`` bytes are run
by ptexec, by ``executorch.runtime`` and by ``portable_lib``; eager PyTorch runs the module
the program came from. Runners are interleaved block by block, in a shuffled order, and
each figure is the median of the blocks' per-call times. Also measured: per-instruction
overhead (a program of 1000 tiny ops), load time and resident memory of a ~200 MB
program (in a fresh process), and allocations per call.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import ptexec  # noqa: E402
from ptexec import native  # noqa: E402

native.wait()  # the native steps, built (once per machine) before anything is timed


@dataclass
class Case:
    name: str
    pte: bytes
    eager: Callable[[], Any]
    inputs: list[Any]
    method: str = "forward"
    note: str = ""
    runners: dict[str, Callable[[], Any]] = field(default_factory=dict)
    exported: Any = None  # what was exported (for the XNNPACK lowering)
    xnn_pte: bytes | None = None
    compiled: dict[str, Any] = field(default_factory=dict)  # compile and load figures


COMPILE = True  # set by --no-compile
XNNPACK = False  # set by --xnnpack


def _export(module: torch.nn.Module, inputs: tuple[Any, ...], dynamic_shapes: Any = None) -> bytes:
    from executorch.exir import to_edge

    ep = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes)
    return bytes(to_edge(ep).to_executorch().buffer)


def _fixture_case(name: str, call_index: int = 0) -> Case:
    """A model of the test fixtures, rebuilt with its builder (same seed, same weights)."""
    import make_fixtures as mf

    spec = next(s for s in mf.FIXTURES if s.name == name)
    torch.manual_seed(mf.seed_for(name))
    with torch.no_grad():
        built = spec.build(name)
    data = bytes(mf.to_executorch(built, False).buffer)
    method, args = built.calls[call_index]
    inputs = mf.flatten_values(list(args))
    case = Case(name, data, lambda: built.eager(method, args), inputs, method)
    case.exported = built.exported
    return case


def _module_case(
    name: str, module: torch.nn.Module, inputs: tuple[Any, ...], note: str = ""
) -> Case:
    module = module.eval()
    with torch.no_grad():
        data = _export(module, inputs)
        exported = torch.export.export(module, inputs) if XNNPACK else None
    case = Case(name, data, lambda: module(*inputs), list(inputs), note=note)
    case.exported = exported
    return case


def _lower_xnnpack(case: Case) -> bytes | None:
    """The case's program lowered with ``XnnpackPartitioner`` (None when that fails)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    try:
        edge = to_edge_transform_and_lower(case.exported, partitioner=[XnnpackPartitioner()])
        return bytes(edge.to_executorch().buffer)
    except Exception as e:  # a model the partitioner or exporter refuses: no column
        print(f"{case.name}: XNNPACK lowering failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def build_cases(names: list[str]) -> list[Case]:
    from models import MobileNetLike, TransformerStack

    makers: dict[str, Callable[[], Case]] = {
        "mlp": lambda: _fixture_case("mlp"),
        "cnn": lambda: _fixture_case("cnn"),
        "transformer": lambda: _fixture_case("transformer"),
        "dynamic_mlp": lambda: _fixture_case("dynamic_mlp", 1),  # batch 3 of a 1..16 bound
        "stateful": lambda: _fixture_case("stateful"),
        "cond": lambda: _fixture_case("cond"),
        "int_ops": lambda: _fixture_case("int_ops"),
        "transformer_stack": lambda: _module_case(
            "transformer_stack",
            TransformerStack(),
            (torch.randn(1, 64, 256),),
            "4 blocks, d=256, seq 64",
        ),
        "mobilenet": lambda: _module_case(
            "mobilenet", MobileNetLike(), (torch.randn(1, 3, 96, 96),), "MobileNetV2-like, 3x96x96"
        ),
    }
    return [makers[n]() for n in names]


def _runners(case: Case) -> dict[str, Callable[[], Any]]:
    runners: dict[str, Callable[[], Any]] = {}
    method = ptexec.load(case.pte).load_method(case.method)
    inputs = case.inputs
    runners["ptexec"] = lambda: method.execute(inputs)
    with contextlib.suppress(ImportError):
        from executorch.runtime import Runtime

        et_method = Runtime.get().load_program(case.pte).load_method(case.method)
        runners["executorch.runtime"] = lambda: et_method.execute(inputs)
    with contextlib.suppress(ImportError):
        from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

        module = _load_for_executorch_from_buffer(case.pte)
        runners["portable_lib"] = lambda: module.run_method(case.method, inputs)

    def eager() -> Any:
        with torch.inference_mode():
            return case.eager()

    runners["eager"] = eager
    if COMPILE:
        compiled = ptexec.load(case.pte).load_method(case.method, compile=True)
        runners["ptexec compiled"] = lambda: compiled.execute(inputs)
    if XNNPACK and case.xnn_pte is not None:
        from executorch.runtime import Runtime

        xnn = Runtime.get().load_program(case.xnn_pte).load_method(case.method)
        runners["executorch+xnnpack"] = lambda: xnn.execute(inputs)
        if COMPILE:
            xc = ptexec.load(case.xnn_pte).load_method(case.method, compile=True)
            runners["ptexec compiled (xnnpack .pte)"] = lambda: xc.execute(inputs)
    return runners


def _per_call(fn: Callable[[], Any], seconds: float) -> tuple[int, float]:
    """Calls per block so that a block lasts about ``seconds``."""
    fn()
    t = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t, 1e-7)
    n = max(1, min(20000, int(seconds / one)))
    return n, one


def measure(case: Case, blocks: int, block_seconds: float) -> dict[str, float]:
    """Median per-call seconds of each runner, interleaved block by block."""
    runners = _runners(case)
    counts = {k: _per_call(f, block_seconds)[0] for k, f in runners.items()}
    samples: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners)
    rng = random.Random(0)
    for _ in range(blocks):
        rng.shuffle(order)
        for k in order:
            fn, n = runners[k], counts[k]
            gc.collect()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            samples[k].append((time.perf_counter() - t) / n)
    return {k: statistics.median(v) for k, v in samples.items()}


# ---- the compiled tier: compile time, load from the cache, agreement ------------------------------


def _median_seconds(fn: Callable[[], Any], n: int = 5) -> float:
    times = []
    for _ in range(n):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def compile_figures(case: Case, data: bytes, label: str) -> dict[str, Any]:
    """Compile ``data`` (into the benchmark's fresh cache), then: the compile time, the
    load time from the cache against the interpreter's, what the report says, and whether
    the outputs agree with the interpreter's."""
    t = time.perf_counter()
    compiled = ptexec.load(data).load_method(case.method, compile=True)
    first_load = time.perf_counter() - t
    report = compiled.compile_report
    assert report is not None
    hit = _median_seconds(
        lambda: ptexec.load(data).load_method(case.method, compile=True).compile_report
    )
    plain = _median_seconds(lambda: ptexec.load(data).load_method(case.method))
    again = ptexec.load(data).load_method(case.method, compile=True).compile_report
    want = ptexec.load(data).load_method(case.method).execute(case.inputs)
    got = compiled.execute(case.inputs)
    agree = all(
        not isinstance(a, torch.Tensor)
        or (
            torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-4)
            if a.is_floating_point()
            else torch.equal(a, b)
        )
        for a, b in zip(got, want, strict=True)
    )
    return {
        "program": label,
        "compile_s": report.compile_seconds,
        "first_load_s": first_load,
        "cache_hit": bool(again is not None and again.cache_hit),
        "cache_hit_load_s": hit,
        "interpreter_load_s": plain,
        "load_ratio": hit / plain if plain else float("nan"),
        "compiled_instructions": report.compiled_instructions,
        "total_instructions": report.total_instructions,
        "regions": len(report.regions),
        "fallbacks": [list(f) for f in report.fallbacks],
        "outputs_agree": agree,
    }


def prepare_compiled(cases: list[Case], progress: Callable[[str], None]) -> None:
    for case in cases:
        if XNNPACK and case.exported is not None:
            progress(f"lowering {case.name} with XnnpackPartitioner ...")
            case.xnn_pte = _lower_xnnpack(case)
        if not COMPILE:
            continue
        progress(f"compiling {case.name} ...")
        case.compiled["portable"] = compile_figures(case, case.pte, "portable")
        if case.xnn_pte is not None:
            progress(f"compiling {case.name} (XNNPACK-lowered) ...")
            case.compiled["xnnpack"] = compile_figures(case, case.xnn_pte, "xnnpack")


# ---- per-instruction overhead, allocations, load ------------------------------------------------


def instruction_overhead(blocks: int) -> dict[str, Any]:
    from models import ManySmallOps

    module = ManySmallOps(1000)
    x = torch.randn(4)
    data = _export(module, (x,))
    method = ptexec.load(data).load_method("forward")
    n = method.meta.num_instructions
    case = Case("many_small_ops", data, lambda: module(x), [x])
    compiled: dict[str, Any] = {}
    if COMPILE:
        compiled = compile_figures(case, data, "portable")
    times = measure(case, blocks, 0.2)
    out: dict[str, Any] = {
        "instructions": n,
        **{f"{k}_us_per_instruction": v / n * 1e6 for k, v in times.items()},
    }
    if compiled:
        out["compile_s"] = compiled["compile_s"]
        out["compiled_instructions"] = compiled["compiled_instructions"]
    return out


def allocations_per_call(case: Case, calls: int = 500) -> dict[str, Any]:
    """What a call allocates, with outputs='view' (copying outputs allocates by design):

    - Python: tracemalloc's net growth per call (the difference of two runs' growth);
    - tensors: values whose storage differs from one call to the next (a kernel that
      allocated a fresh result where the plan provides memory), and outputs whose storage
      is not planned memory.
    """
    method = ptexec.load(case.pte).load_method(case.method, outputs="view")
    inputs = case.inputs

    def storages() -> dict[int, int]:
        return {
            i: v.untyped_storage().data_ptr()
            for i, v in enumerate(method.values())
            if isinstance(v, torch.Tensor) and v.numel()
        }

    for _ in range(20):
        method.execute(inputs)
    first = storages()

    def python_growth(n: int) -> int:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for _ in range(n):
            method.execute(inputs)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        return sum(s.size_diff for s in after.compare_to(before, "filename"))

    # the slope between a short and a long run: tracemalloc's own bookkeeping cancels out
    growth = python_growth(calls + calls // 5) - python_growth(calls // 5)
    method.execute(inputs)
    fresh = sum(1 for i, ptr in storages().items() if first.get(i, ptr) != ptr)
    planned = {b.data.untyped_storage().data_ptr() for b in method.state.buffers}
    outputs = method.execute(inputs)
    outside = sum(
        1
        for y in outputs
        if isinstance(y, torch.Tensor) and planned and y.untyped_storage().data_ptr() not in planned
    )
    return {
        "python_bytes_growth_per_call": growth / calls,
        "values_with_fresh_storage_per_call": fresh,
        "outputs_outside_planned_memory": outside,
    }


_LOAD_SCRIPT = r"""
import os, sys, time, json
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
torch.mm(torch.randn(64, 64), torch.randn(64, 64))  # BLAS set up, as in any process that ran torch
s0 = status()
t0 = time.perf_counter()
prog = ptexec.load(sys.argv[1])
m = prog.load_method('forward')
t1 = time.perf_counter()
m.execute([x])
t2 = time.perf_counter()
s1 = status()
print(json.dumps({'load_s': t1 - t0, 'load_and_first_call_s': t2 - t0, 'before': s0, 'after': s1}))
"""


def large_program(cache: Path) -> dict[str, Any]:
    """Load + first call of a ~200 MB program in a fresh process: time and memory growth."""
    from models import BigMLP

    path = cache / "big_mlp.pte"
    if not path.exists():
        torch.manual_seed(0)
        module = BigMLP().eval()
        with torch.no_grad():
            data = _export(module, (torch.randn(1, 2048),))
        path.write_bytes(data)
    size = path.stat().st_size
    with open(path, "rb") as f:  # read once so the page cache is warm, as in a served model
        while f.read(1 << 24):
            pass
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_SCRIPT, str(path)], capture_output=True, text=True, check=True
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    anon = sum(r["after"].get(k, 0) - r["before"].get(k, 0) for k in ("RssAnon", "RssShmem"))
    rss = r["after"].get("VmRSS", 0) - r["before"].get("VmRSS", 0)
    return {
        "file_bytes": size,
        "load_s": r["load_s"],
        "load_and_first_call_s": r["load_and_first_call_s"],
        "anonymous_memory_growth_bytes": anon,
        "anonymous_growth_fraction_of_file": anon / size,
        "rss_growth_bytes_incl_mapped_file": rss,
    }


# ---- report -------------------------------------------------------------------------------------


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    us = seconds * 1e6
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def table(results: dict[str, dict[str, float]], notes: dict[str, str]) -> str:
    head = "| model | ptexec | executorch.runtime | portable_lib | eager | ptexec / ExecuTorch | ptexec / eager |"
    lines = [head, "|" + "---|" * 7]
    ratios_et, ratios_eager = [], []
    for name, r in results.items():
        et = r.get("executorch.runtime")
        pt, eager = r.get("ptexec"), r.get("eager")
        if pt and et:
            ratios_et.append(pt / et)
        if pt and eager:
            ratios_eager.append(pt / eager)
        label = name + (f" ({notes[name]})" if notes.get(name) else "")
        lines.append(
            f"| {label} | {_fmt(pt)} | {_fmt(et)} | {_fmt(r.get('portable_lib'))} | {_fmt(eager)} "
            f"| {_ratio(pt, et)} | {_ratio(pt, eager)} |"
        )
    if ratios_et:
        geo = math.exp(sum(math.log(x) for x in ratios_et) / len(ratios_et))
        geo_e = (
            math.exp(sum(math.log(x) for x in ratios_eager) / len(ratios_eager))
            if ratios_eager
            else float("nan")
        )
        lines.append(f"| geometric mean | | | | | {geo:.2f} | {geo_e:.2f} |")
    return "\n".join(lines)


def _gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def compiled_table(results: dict[str, dict[str, float]], cases: list[Case]) -> str:
    """The compiled tier against ExecuTorch (portable, and XNNPACK where lowered), with the
    compile time and the cache-hit load time against the interpreter's load."""
    head = (
        "| model | ptexec | compiled | ExecuTorch | compiled / ExecuTorch | ExecuTorch+XNNPACK "
        "| compiled (XNNPACK .pte) | compiled / ET+XNNPACK | compile | cache-hit load / "
        "interpreter load |"
    )
    lines = [head, "|" + "---|" * 10]
    portable, xnn, loads = [], [], []
    by_name = {c.name: c for c in cases}
    for name, r in results.items():
        pt, comp, et = r.get("ptexec"), r.get("ptexec compiled"), r.get("executorch.runtime")
        ex, xc = r.get("executorch+xnnpack"), r.get("ptexec compiled (xnnpack .pte)")
        if comp and et:
            portable.append(comp / et)
        if xc and ex:
            xnn.append(xc / ex)
        fig = by_name[name].compiled.get("portable", {})
        compile_s = f"{fig['compile_s']:.1f} s" if fig else "-"
        load = "-"
        if fig:
            loads.append(fig["load_ratio"])
            load = (
                f"{_fmt(fig['cache_hit_load_s'])} / {_fmt(fig['interpreter_load_s'])} = "
                f"{fig['load_ratio']:.2f}"
            )
            if not fig["outputs_agree"]:
                compile_s += " (outputs DIFFER)"
        lines.append(
            f"| {name} | {_fmt(pt)} | {_fmt(comp)} | {_fmt(et)} | {_ratio(comp, et)} | {_fmt(ex)} "
            f"| {_fmt(xc)} | {_ratio(xc, ex)} | {compile_s} | {load} |"
        )
    lines.append(
        f"| geometric mean | | | | {_gmean(portable):.2f} | | | "
        f"{_gmean(xnn):.2f} | | {_gmean(loads):.2f} |"
    )
    return "\n".join(lines)


ALL_MODELS = [
    "mlp",
    "cnn",
    "transformer",
    "dynamic_mlp",
    "stateful",
    "cond",
    "int_ops",
    "transformer_stack",
    "mobilenet",
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="*", default=ALL_MODELS)
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.25)
    parser.add_argument("--quick", action="store_true", help="3 blocks of 0.1 s")
    parser.add_argument("--skip-extras", action="store_true", help="only the model table")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results.json"))
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled tier")
    parser.add_argument(
        "--xnnpack", action="store_true", help="also lower each model with XnnpackPartitioner"
    )
    parser.add_argument(
        "--warm-inductor-cache",
        action="store_true",
        help="keep torch's inductor cache (compile times then reuse earlier compiles)",
    )
    args = parser.parse_args()
    global COMPILE, XNNPACK
    COMPILE, XNNPACK = not args.no_compile, args.xnnpack
    scratch = Path(tempfile.mkdtemp(prefix="ptexec-bench-compile-"))
    os.environ["PTEXEC_CACHE_DIR"] = str(scratch / "ptexec")  # every compile is a first one
    if not args.warm_inductor_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor")
    if args.quick:
        args.blocks, args.block_seconds = 3, 0.1
    cache = Path(os.environ.get("PTEXEC_BENCH_CACHE", Path(tempfile.gettempdir()) / "ptexec-bench"))
    cache.mkdir(parents=True, exist_ok=True)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    progress(f"exporting {len(args.models)} models with ExecuTorch ...")
    cases = build_cases(args.models)
    ptexec.set_num_threads(1)
    prepare_compiled(cases, progress)
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "ptexec": ptexec.__version__,
        "machine": {"cpus": os.cpu_count()},
        "method": f"median of {args.blocks} interleaved blocks of ~{args.block_seconds} s",
        "threads": {},
    }
    notes = {c.name: c.note for c in cases}
    for threads in args.threads:
        # torch's threads and ExecuTorch's pool (its XNNPACK runs on it); every runner of
        # the row is loaded after this, so none holds a replaced pool
        ptexec.set_num_threads(threads)
        results: dict[str, dict[str, float]] = {}
        for i, case in enumerate(cases, 1):
            progress(f"[{threads} thread(s)] {i}/{len(cases)} {case.name} ...")
            results[case.name] = measure(case, args.blocks, args.block_seconds)
        report["threads"][str(threads)] = results
        print(f"\n### {threads} thread(s)\n")
        print(table(results, notes))
        if COMPILE or XNNPACK:
            print(f"\n### the compiled tier, {threads} thread(s)\n")
            print(compiled_table(results, cases))
    report["compiled"] = {c.name: c.compiled for c in cases}
    ptexec.set_num_threads(1)
    if not args.skip_extras:
        progress("per-instruction overhead (1000 small ops) ...")
        report["instruction_overhead"] = instruction_overhead(args.blocks)
        progress("allocations per call ...")
        report["allocations"] = {c.name: allocations_per_call(c) for c in cases}
        progress("load time and memory of a ~200 MB program ...")
        report["large_program"] = large_program(cache)
        print("\n### per-instruction overhead (1 thread)\n")
        for k, v in report["instruction_overhead"].items():
            print(f"- {k}: {v:.2f}" if isinstance(v, float) else f"- {k}: {v}")
        print("\n### allocations per call (outputs='view')\n")
        print(
            "| model | Python bytes growth / call | values with fresh storage / call "
            "| outputs outside planned memory |"
        )
        print("|---|---|---|---|")
        for name, a in report["allocations"].items():
            print(
                f"| {name} | {a['python_bytes_growth_per_call']:.2f} "
                f"| {a['values_with_fresh_storage_per_call']} "
                f"| {a['outputs_outside_planned_memory']} |"
            )
        lp = report["large_program"]
        print("\n### a ~200 MB program\n")
        print(
            f"- file {lp['file_bytes'] / 1e6:.0f} MB; load {lp['load_s'] * 1e3:.0f} ms; load + first call "
            f"{lp['load_and_first_call_s'] * 1e3:.0f} ms; anonymous memory growth "
            f"{lp['anonymous_memory_growth_bytes'] / 1e6:.1f} MB ({lp['anonymous_growth_fraction_of_file']:.1%} of the file); "
            f"RSS growth including the mapped file {lp['rss_growth_bytes_incl_mapped_file'] / 1e6:.0f} MB"
        )
    Path(args.json).write_text(json.dumps(report, indent=2))
    progress(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
