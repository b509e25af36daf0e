"""Per-call latency on a GPU: eager PyTorch vs ptexec (interpreter) vs ptexec (CUDA graph).

    python benchmarks/gpu_bench.py [--json out.json] [--extra DIR]

Runs the test fixtures' programs with ``device_map="cuda:0"`` (no ExecuTorch needed: the
eager modules come from the fixture builders), plus any ``NAME.pte`` with ``NAME.inputs.pt``
found in ``--extra``. Also reports the GPU time of one replay (CUDA events), which is the
floor a host-side runtime can reach.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

import ptexec  # noqa: E402


def timed(fn: Callable[[], Any], blocks: int = 7, seconds: float = 0.2) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    n = max(1, int(seconds / max(time.perf_counter() - t, 1e-6)))
    samples = []
    for _ in range(blocks):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t) / n)
    return statistics.median(samples)


def gpu_time(method: ptexec.Method, inputs: list[Any]) -> float:
    method.execute(inputs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        method.execute(inputs, outputs="view")
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 20 / 1e3


def fixture(name: str) -> tuple[bytes, Callable[[], Any] | None, list[Any]]:
    import make_fixtures as mf

    from fixture_data import fixture_paths

    spec = next(s for s in mf.FIXTURES if s.name == name)
    torch.manual_seed(mf.seed_for(name))
    with torch.no_grad():
        built = spec.build(name)
    _, args = built.calls[0]
    module_args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    eager = None
    module = getattr(built.eager, "__closure__", None)
    for cell in module or ():
        if isinstance(cell.cell_contents, torch.nn.Module):
            m = cell.cell_contents.cuda().eval()
            eager = lambda m=m: m(*module_args)  # noqa: E731
    inputs = [a.cuda() if isinstance(a, torch.Tensor) else a for a in mf.flatten_values(list(args))]
    return fixture_paths(name)[0].read_bytes(), eager, inputs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="gpu-bench.json")
    parser.add_argument("--extra", help="directory of NAME.pte + NAME.inputs.pt")
    parser.add_argument(
        "--models", nargs="*", default=["mlp", "cnn", "transformer", "dynamic_mlp", "stateful"]
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    cases = [(n, *fixture(n)) for n in args.models]
    if args.extra:
        for pte in sorted(Path(args.extra).glob("*.pte")):
            inputs = [x.cuda() for x in torch.load(pte.with_suffix(".inputs.pt"))]
            cases.append((pte.stem, pte.read_bytes(), None, inputs))
    results: dict[str, dict[str, float]] = {}
    for name, data, eager, inputs in cases:
        print(f"{name} ...", file=sys.stderr, flush=True)
        prog = ptexec.load(data)
        plain = prog.load_method("forward", device_map="cuda:0")
        row = {"ptexec": timed(lambda m=plain, x=inputs: m.execute(x))}
        try:
            graph = prog.load_method("forward", device_map="cuda:0", cuda_graph=True)
            row["ptexec_cuda_graph"] = timed(lambda m=graph, x=inputs: m.execute(x))
            row["gpu_time_per_replay"] = gpu_time(graph, inputs)
        except ValueError as e:
            row["cuda_graph_refused"] = str(e)  # type: ignore[assignment]
        if eager is not None:
            with torch.inference_mode():
                row["eager"] = timed(eager)
        results[name] = row
    print("| model | eager | ptexec | ptexec + CUDA graph | GPU time of a replay |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        cells = [r.get(k) for k in ("eager", "ptexec", "ptexec_cuda_graph", "gpu_time_per_replay")]
        text = [f"{v * 1e6:.1f} us" if isinstance(v, float) else "-" for v in cells]
        print(f"| {name} | " + " | ".join(text) + " |")
    Path(args.json).write_text(
        json.dumps(
            {
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name(0),
                "results": results,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
