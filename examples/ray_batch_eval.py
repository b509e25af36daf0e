"""Check an exported classifier against eager PyTorch over a whole dataset, on Ray Data.

    pip install '.[ray,export]' in ptexec's source tree
    python examples/ray_batch_eval.py                          # 200,000 rows; 1 and 2 actors
    python examples/ray_batch_eval.py --rows 2000000 --concurrency 8 16 --address auto

It trains a small classifier on generated data (a second or two), exports it with
ExecuTorch's exporter (batch dimension bounded by --program-batch), scores a generated
dataset with ptexec on Ray Data once per --concurrency value, and compares the scores with
eager PyTorch: top-1 agreement, the largest logit difference, the accuracy of both against
the labels, and rows per second (wall time of the whole Ray job, actor start included).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch

import ptexec
import ptexec.ray

Rates = dict[str, dict[str, float]]  # what -> {"job" | "steady" | "wall" | "cpu": rows/s}


class Classifier(torch.nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_data(rows: int, features: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Points around one centre per class, with enough noise that classes overlap."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).standard_normal((classes, features)).astype(np.float32)
    labels = rng.integers(0, classes, rows)
    noise = 2.0 * rng.standard_normal((rows, features)).astype(np.float32)
    return centres[labels] + noise, labels


def train(features: int, hidden: int, classes: int, steps: int = 200) -> Classifier:
    torch.manual_seed(0)
    model = Classifier(features, hidden, classes)
    x, y = make_data(8192, features, classes, seed=1)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        i = torch.arange(step * 256, (step + 1) * 256) % len(xs)
        loss = torch.nn.functional.cross_entropy(model(xs[i]), ys[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def export(model: torch.nn.Module, features: int, program_batch: int, path: str) -> None:
    """The ``.pte`` of ``model`` with ExecuTorch's exporter, batch dimension 1..program_batch."""
    try:
        from executorch.exir import to_edge
    except ImportError as e:
        raise SystemExit(
            f"exporting needs ExecuTorch: pip install '.[export]' in ptexec's source tree ({e})"
        ) from e
    example = (torch.randn(min(4, program_batch), features),)
    batch = torch.export.Dim("batch", min=1, max=program_batch)
    exported = torch.export.export(model, example, dynamic_shapes={"x": {0: batch}})
    with open(path, "wb") as f:
        f.write(to_edge(exported).to_executorch().buffer)


def in_process_rates(path: str, x: np.ndarray, batch_size: int, per_call: int) -> Rates:
    """The same work in this process, no Ray: PteMapper on batches of ``batch_size`` rows
    and, for its overhead, a bare ``Method.execute`` loop over calls of ``per_call`` rows;
    median of 5 alternating blocks."""
    mapper = ptexec.ray.PteMapper(path, inputs=["features"], outputs=["logits"])
    method = ptexec.load(path).load_method()
    xt = torch.from_numpy(x)
    timings: dict[str, list[tuple[float, float]]] = {"mapper": [], "execute": []}
    for _ in range(5):
        wall, cpu = time.perf_counter(), time.process_time()
        for lo in range(0, len(x), batch_size):
            mapper({"features": x[lo : lo + batch_size]})
        timings["mapper"].append((time.perf_counter() - wall, time.process_time() - cpu))
        wall, cpu = time.perf_counter(), time.process_time()
        for lo in range(0, len(x), per_call):
            method.execute([xt[lo : lo + per_call]])
        timings["execute"].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {
        name: {
            "wall": len(x) / statistics.median(w for w, _ in t),
            "cpu": len(x) / statistics.median(c for _, c in t),
        }
        for name, t in timings.items()
    }


class TimedMapper(ptexec.ray.PteMapper):
    """PteMapper that also says when each batch was done (``done_at``, seconds since the
    epoch) and the CPU time it took (``cpu_s``): the actors' throughput without their
    start-up, and without the waits of a machine shared with other work."""

    def __call__(self, batch: Any) -> dict[str, np.ndarray]:
        cpu = time.process_time()
        out = super().__call__(batch)
        rows = len(out["logits"])
        out["done_at"] = np.full(rows, time.time())
        out["cpu_s"] = np.full(rows, (time.process_time() - cpu) / max(rows, 1))
        return out


def job_rates(out: Any, seconds: float) -> dict[str, float]:
    """Rows/s of one Ray job: ``job`` from submission to the last row (actor start
    included), ``steady`` from the first batch done to the last (the first batch excluded),
    ``cpu`` per second of CPU time in the actors' mappers."""
    times, counts = np.unique(out["done_at"].to_numpy(), return_counts=True)
    span = times[-1] - times[0]
    return {
        "job": len(out) / seconds,
        "steady": float(counts[1:].sum() / span) if span > 0 else float("nan"),
        "cpu": len(out) / float(out["cpu_s"].sum()),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--program-batch", type=int, default=64, help="the export's batch bound")
    ap.add_argument("--batch-size", type=int, default=1024, help="rows per Ray batch")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2], help="actors")
    ap.add_argument("--num-gpus", type=float, default=0, help="GPUs per actor")
    ap.add_argument("--blocks", type=int, default=16, help="blocks of the generated dataset")
    ap.add_argument("--repeat", type=int, default=1, help="runs per concurrency (median)")
    ap.add_argument("--address", default=None, help="a Ray cluster (default: start one here)")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    torch.set_num_threads(1)  # as in each actor (one CPU each): comparable in-process figures
    workdir = tempfile.TemporaryDirectory(prefix="ptexec-ray-eval-")
    try:
        return evaluate(args, os.path.join(workdir.name, "classifier.pte"))
    finally:
        workdir.cleanup()


def evaluate(args: argparse.Namespace, path: str) -> dict[str, Any]:
    import ray
    import ray.data

    model = train(args.features, args.hidden, args.classes)
    export(model, args.features, args.program_batch, path)
    x, labels = make_data(args.rows, args.features, args.classes, seed=2)
    with torch.no_grad():
        eager = torch.cat([model(torch.from_numpy(c)) for c in np.array_split(x, 64)]).numpy()

    started = not ray.is_initialized()
    if started:
        ray.init(
            address=args.address,
            num_cpus=args.num_cpus if args.address is None else None,
            include_dashboard=False,
            logging_level=logging.ERROR,
        )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        rows = [{"id": i, "features": x[i], "label": labels[i]} for i in range(len(x))]
        ds = ray.data.from_items(rows, override_num_blocks=args.blocks).materialize()
        runs: dict[int, list[dict[str, float]]] = {a: [] for a in args.concurrency}
        for _ in range(args.repeat):  # interleaved, so load from elsewhere hits all alike
            for actors in args.concurrency:
                start = time.perf_counter()
                scored = ptexec.ray.map_program(
                    ds,
                    path,
                    inputs=["features"],
                    outputs=["logits"],
                    keep_columns=["id"],
                    concurrency=actors,
                    batch_size=args.batch_size,
                    num_gpus=args.num_gpus,
                    mapper=TimedMapper,
                )
                out = scored.to_pandas()
                runs[actors].append(job_rates(out, time.perf_counter() - start))
    finally:
        if started:
            ray.shutdown()
    local = in_process_rates(path, x[: min(len(x), 20_000)], args.batch_size, args.program_batch)
    out = out.sort_values("id")
    assert (out["id"].to_numpy() == np.arange(len(x))).all()
    logits = np.stack(out["logits"].to_numpy())
    ours, theirs = logits.argmax(1), eager.argmax(1)
    ray_rates: Rates = {
        f"{actors} actor(s)": {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        for actors, rs in runs.items()
    }
    result = {
        "rows": len(out),
        "agreement": float((ours == theirs).mean()),
        "max_abs_diff": float(np.abs(logits - eager).max()),
        "accuracy_ptexec": float((ours == labels).mean()),
        "accuracy_eager": float((theirs == labels).mean()),
        "in_process": local,
        "ray": ray_rates,
    }

    size = os.path.getsize(path)
    print(
        f"model: MLP {args.features}-{args.hidden}-{args.hidden}-{args.classes}, exported with "
        f"batch <= {args.program_batch} ({size / 1e6:.2f} MB)"
    )
    print(
        f"dataset: {len(x):,} rows x {args.features} features, {args.classes} classes; "
        f"Ray batches of {args.batch_size} rows, {args.blocks} blocks"
    )
    print(f"eager PyTorch:  accuracy {result['accuracy_eager']:.4f}")
    print(
        f"ptexec on Ray:  accuracy {result['accuracy_ptexec']:.4f}; top-1 agreement with eager "
        f"{result['agreement']:.6f} ({int((ours == theirs).sum()):,}/{len(x):,} rows); "
        f"largest logit difference {result['max_abs_diff']:.2e}"
    )
    print(
        f"throughput, rows/s (median of {args.repeat} interleaved run(s)): whole job = from "
        "submission to the last row, actor start included; steady = from the first batch "
        "done to the last; per CPU-second = rows per second of CPU time in the mapper"
    )
    print(f"  {'':<24}{'whole job':>12}{'steady':>12}{'per CPU-s':>12}")
    mapper, loop = local["mapper"], local["execute"]
    print(f"  {'in-process PteMapper':<24}{'':>12}{mapper['wall']:>12,.0f}{mapper['cpu']:>12,.0f}")
    print(f"  {'in-process execute loop':<24}{'':>12}{loop['wall']:>12,.0f}{loop['cpu']:>12,.0f}")
    first = next(iter(ray_rates.values()))
    for name, r in ray_rates.items():
        print(f"  {'Ray, ' + name:<24}{r['job']:>12,.0f}{r['steady']:>12,.0f}{r['cpu']:>12,.0f}")
    for name, r in list(ray_rates.items())[1:]:
        print(
            f"  {name} / {next(iter(ray_rates))}: whole job {r['job'] / first['job']:.2f}x, "
            f"steady {r['steady'] / first['steady']:.2f}x"
        )
    print(f"  PteMapper / bare execute loop, per CPU-second: {mapper['cpu'] / loop['cpu']:.2f}")
    return result


if __name__ == "__main__":
    main()
