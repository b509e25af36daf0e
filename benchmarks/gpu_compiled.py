"""The compiled tier on a GPU: ptexec compiled for CUDA vs eager CUDA vs the interpreter
(plain and with a CUDA graph), on the same programs.

    python benchmarks/gpu_compiled.py [--json out.json] [--models mlp cnn ...]

The test fixtures' programs run with ``device_map="cuda:0"`` (their eager modules come from
the fixture builders, as in ``benchmarks/gpu_bench.py``), and so do the programs exported
for CUDA (``gpu_*`` fixtures). Every compiled method's outputs are checked against the
interpreter's; its compile time and report are printed. Per-call times are medians of
interleaved blocks, synchronized.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from gpu_bench import fixture, timed  # noqa: E402

import ptexec  # noqa: E402


def _agree(a: list[Any], b: list[Any]) -> bool:
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            if x.is_floating_point():
                if not torch.allclose(x.float(), y.float(), rtol=1e-3, atol=1e-4):
                    return False
            elif not torch.equal(x, y):
                return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="gpu-compiled.json")
    parser.add_argument(
        "--models", nargs="*", default=["mlp", "cnn", "transformer", "dynamic_mlp", "stateful"]
    )
    parser.add_argument(
        "--cuda-fixtures", nargs="*", default=["gpu_mlp", "gpu_cnn", "gpu_stateful"]
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    os.environ.setdefault("PTEXEC_CACHE_DIR", tempfile.mkdtemp(prefix="ptexec-gpu-cache-"))
    from fixture_data import fixture_calls, fixture_paths

    cases = [(n, *fixture(n)) for n in args.models]
    for name in args.cuda_fixtures:
        inputs = [
            x.cuda() if isinstance(x, torch.Tensor) else x for x in fixture_calls(name)[0]["inputs"]
        ]
        cases.append((name, fixture_paths(name)[0].read_bytes(), None, inputs))
    results: dict[str, dict[str, Any]] = {}
    for name, data, eager, inputs in cases:
        print(f"{name} ...", file=sys.stderr, flush=True)
        row: dict[str, Any] = {}
        plain = ptexec.load(data).load_method("forward", device_map="cuda:0")
        t = time.perf_counter()
        compiled = ptexec.load(data).load_method("forward", device_map="cuda:0", compile=True)
        row["load_and_compile_s"] = time.perf_counter() - t
        report = compiled.compile_report
        assert report is not None
        row["report"] = report.summary()
        row["agree"] = _agree(compiled.execute(inputs), plain.execute(inputs))
        row["ptexec"] = timed(lambda m=plain, x=inputs: m.execute(x))
        row["ptexec_compiled"] = timed(lambda m=compiled, x=inputs: m.execute(x))
        try:
            graph = ptexec.load(data).load_method("forward", device_map="cuda:0", cuda_graph=True)
            row["ptexec_cuda_graph"] = timed(lambda m=graph, x=inputs: m.execute(x))
        except ValueError as e:
            row["cuda_graph_refused"] = str(e)
        if eager is not None:
            with torch.inference_mode():
                row["eager"] = timed(eager)
        results[name] = row
        print(report.summary(), file=sys.stderr)
    print(
        "| model | eager CUDA | ptexec | ptexec + CUDA graph | ptexec compiled | compiled / eager "
        "| compiled / CUDA graph | agree | load + compile |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():

        def us(key: str, r: dict[str, Any] = r) -> str:
            v = r.get(key)
            return f"{v * 1e6:.1f} us" if isinstance(v, float) else "-"

        def ratio(a: str, b: str, r: dict[str, Any] = r) -> str:
            x, y = r.get(a), r.get(b)
            return f"{x / y:.2f}" if isinstance(x, float) and isinstance(y, float) else "-"

        print(
            f"| {name} | {us('eager')} | {us('ptexec')} | {us('ptexec_cuda_graph')} "
            f"| {us('ptexec_compiled')} | {ratio('ptexec_compiled', 'eager')} "
            f"| {ratio('ptexec_compiled', 'ptexec_cuda_graph')} | {r['agree']} "
            f"| {r['load_and_compile_s']:.1f} s |"
        )
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
    return 0 if all(r["agree"] for r in results.values()) else 2


if __name__ == "__main__":
    sys.exit(main())
