"""Two checkouts of ptexec, side by side, on the same programs: is a change faster or slower?

    python benchmarks/ab.py --a ../old/src --b src tests/fixtures/mlp.pte tests/fixtures/cond.pte
    python benchmarks/ab.py --a ../old/src --b src --option xnnpack=torch tests/fixtures/xnnpack/cnn.pte
    python benchmarks/ab.py --a ../old/src --b src --option compile=True tests/fixtures/mlp.pte
    python benchmarks/ab.py --a ../old/src --b src --load tests/fixtures/transformer.pte

Each side runs in a worker process of its own (``PYTHONPATH`` set to that side's ``src``),
one thread each. The parent asks the two workers for blocks of calls in alternation, in a
shuffled order per round, so that whatever else the machine is doing weighs on both alike;
each figure is the median over the blocks of the per-call time. Inputs are the first call
recorded in the fixture's ``.io.pt`` file when there is one (a call without a ``method`` is
``forward``'s), else random ones from the
method's metadata. With ``--load``, a block is loads instead of calls: ``load`` (from the
file's bytes) + ``load_method`` again and again, each load dropped before the next, the
process's CPU time per load (a repeated load: the process has loaded the bytes before;
with ``--first`` too, each load finds the in-process caches empty, as
``load_time.py``'s first load).
Prints one row per program: A, B and B/A.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

_WORKER = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
import ptexec
if hasattr(ptexec, "set_num_threads"):
    ptexec.set_num_threads(1)  # ExecuTorch's pool too (XNNPACK delegates under "auto")
try:  # the native steps, built (once per machine) before anything is timed
    from ptexec import native
except ImportError:
    try:
        from ptexec.engine import native  # (older checkouts)
    except ImportError:
        native = None
if native is not None:
    native.wait()
from pathlib import Path

sys.path.insert(0, sys.argv[1])  # benchmarks/ (this side's ptexec is on PYTHONPATH)
from load_time import forget_loads

def inputs_for(path, method):
    io = Path(str(path)[:-4] + ".io.pt")
    if io.exists():
        calls = torch.load(io, weights_only=False)["calls"]
        for c in calls:
            if c.get("method", "forward") == method:  # XNNPACK fixtures: forward only
                return list(c["inputs"])
    meta = ptexec.load(path).method_meta(method)
    out = []
    for info in meta.inputs:
        if hasattr(info, "sizes"):
            if info.dtype.is_floating_point:
                out.append(torch.randn(info.sizes).to(info.dtype))
            else:
                out.append(torch.zeros(info.sizes, dtype=info.dtype))
        else:
            out.append(info.value)
    return out

methods = {}
for line in sys.stdin:
    req = json.loads(line)
    if req.get("load"):
        data = Path(req["path"]).read_bytes()
        n = req["calls"]
        dt = 0.0
        if req.get("first"):  # each load as the process's first of these bytes
            for _ in range(n):
                forget_loads()
                t0 = time.process_time()
                ptexec.load(data).load_method(req["method"], **req["options"])
                dt += time.process_time() - t0
            dt /= n
        else:
            t0 = time.process_time()
            for _ in range(n):
                ptexec.load(data).load_method(req["method"], **req["options"])
            dt = (time.process_time() - t0) / n
        print(json.dumps({"per_call": dt, "load": dt}), flush=True)
        continue
    key = req["path"] + "::" + req["method"]
    if key not in methods:
        t0 = time.perf_counter()
        prog = ptexec.load(req["path"])
        m = prog.load_method(req["method"], **req["options"])
        load = time.perf_counter() - t0
        xs = inputs_for(req["path"], req["method"])
        for _ in range(20):
            m.execute(xs)
        methods[key] = (m, xs, load)
    m, xs, load = methods[key]
    n = req["calls"]
    t0 = time.perf_counter()
    for _ in range(n):
        m.execute(xs)
    dt = (time.perf_counter() - t0) / n
    print(json.dumps({"per_call": dt, "load": load}), flush=True)
"""


class _Side:
    def __init__(self, src: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(Path(__file__).resolve().parent)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def block(
        self,
        path: str,
        method: str,
        calls: int,
        options: dict[str, Any],
        load: bool = False,
        first: bool = False,
    ) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"path": path, "method": method, "calls": calls, "options": options}
        if load:
            request["load"] = True
            request["first"] = first
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker failed on {path}")
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def _option_value(text: str) -> Any:
    """An option's value: ``True``, ``False`` and integers as such, else the string."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("programs", nargs="+", help=".pte files")
    parser.add_argument("--a", required=True, help="the src folder of side A (the baseline)")
    parser.add_argument("--b", required=True, help="the src folder of side B (the change)")
    parser.add_argument("--method", default="forward")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block-seconds", type=float, default=0.1)
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a load_method option (xnnpack=torch, compile=True; True, False and integers "
        "are read as such); repeatable",
    )
    parser.add_argument(
        "--load",
        action="store_true",
        help="time load + load_method (repeated, from bytes) instead of calls",
    )
    parser.add_argument(
        "--first",
        action="store_true",
        help="with --load: empty the in-process caches a repeated load reuses before each "
        "load (load_time.py's first load)",
    )
    args = parser.parse_args(argv)
    options: dict[str, Any] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--option {item!r}: expected KEY=VALUE")
        options[key] = _option_value(value)
    sides = {"A": _Side(args.a), "B": _Side(args.b)}
    rng = random.Random(0)
    print(f"{'program':<28} {'A':>10} {'B':>10} {'B/A':>6}")
    try:
        for path in args.programs:
            warm = 5 if args.load else 50
            first = sides["A"].block(path, args.method, warm, options, args.load, args.first)
            sides["B"].block(path, args.method, warm, options, args.load, args.first)
            calls = max(1, int(args.block_seconds / max(first["per_call"], 1e-7)))
            times: dict[str, list[float]] = {"A": [], "B": []}
            for _ in range(args.rounds):
                order = ["A", "B"]
                rng.shuffle(order)
                for name in order:
                    times[name].append(
                        sides[name].block(path, args.method, calls, options, args.load, args.first)[
                            "per_call"
                        ]
                    )
            a, b = statistics.median(times["A"]), statistics.median(times["B"])
            print(f"{Path(path).stem:<28} {_us(a):>10} {_us(b):>10} {b / a:>6.2f}", flush=True)
    finally:
        for side in sides.values():
            side.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
