"""Where a first load's time goes: what each in-process cache saves a repeated load, and
how many distinct forms a program's kernel instructions have.

    python benchmarks/load_anatomy.py                      # fixtures and a 25-step LSTM
    python benchmarks/load_anatomy.py --rounds 9 my.pte    # any programs

For each program: the median first load (``load`` + ``load_method``, every in-process
cache emptied, as ``load_time.py``'s "first"), the median repeated load ("again"), and,
per cache, a repeated load with that one cache emptied: the difference is the part of a
first load that cache stands for (caches named by the function that empties them,
``load_time.caches``). The decoded descriptions (``pte.clear_decoded``) are part of the key
of most others (they are kept per decoded plan), so without them those miss too: that line
is the decoding and checking of the program and everything kept per plan.

"forms" counts the kernel instructions' distinct *local forms*: the operator and its
arguments' descriptions (a tensor's dtype, sizes, dim order, dynamism, constant or not,
its buffer and its offset relative to the other arguments in that buffer; a scalar's
value), with the value slots renumbered in order of appearance. Instructions of one form
differ only in which slots they read and write, as a model's repeated layers do: a
statement prepared for one form, its slots renumbered, could serve the others, and the
ratio of instructions to forms bounds what that saves (``docs/load_time.md`` has the
measurement of it: in Python, keying and renumbering cost about what a factory does).
All times are process CPU time at one thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load_time

import ptexec
from ptexec.format import program as p


def local_forms(plan: p.ExecutionPlan) -> tuple[int, int]:
    """(kernel instructions, their distinct local forms) of ``plan`` (see the module's
    docstring)."""
    forms: set[Any] = set()
    n = 0
    for chain in plan.chains:
        for ins in chain.instructions:
            if isinstance(ins, p.KernelCall):
                n += 1
                forms.add(_local_form(plan, ins))
    return n, len(forms)


def _local_form(plan: p.ExecutionPlan, ins: p.KernelCall) -> Any:
    order: dict[int, int] = {}

    def slot(i: int) -> int:
        return order.setdefault(i, len(order))

    def describe(i: int) -> Any:
        if i < 0:
            return None
        v = plan.values[i]
        if isinstance(v, p.Tensor):
            planned = None if v.allocation_info is None else v.allocation_info.memory_id
            return (
                slot(i),
                v.scalar_type,
                v.sizes,
                v.dim_order,
                v.shape_dynamism,
                v.storage_offset,
                v.data_buffer_idx != 0,
                planned,
                v.extra_tensor_info,
            )
        if isinstance(v, p.IntList | p.TensorList | p.OptionalTensorList):
            return (slot(i), type(v).__name__, tuple(describe(j) for j in v.items))
        return (slot(i), v)

    args = tuple(describe(a) for a in ins.args)
    offsets: dict[int, list[tuple[int, int]]] = {}
    for i, k in order.items():
        v = plan.values[i]
        if isinstance(v, p.Tensor) and v.allocation_info is not None:
            a = v.allocation_info
            offsets.setdefault(a.memory_id, []).append((k, a.memory_offset))
    relative = tuple(
        sorted(
            (m, tuple((k, o - min(x for _, x in at)) for k, o in at)) for m, at in offsets.items()
        )
    )
    return plan.operators[ins.op_index].qualified_name, args, relative


def _median_load(data: bytes, method: str, rounds: int, before: Callable[[], None]) -> float:
    times = []
    for _ in range(rounds):
        before()
        t = time.process_time()
        load_time.ptexec_load(data, method)
        times.append(time.process_time() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("programs", nargs="*", help=".pte files (default: the fixtures)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=25, help="the default LSTM's length")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ptexec.set_num_threads(1)
    if args.programs:
        programs = {Path(f).stem: Path(f).read_bytes() for f in args.programs}
    else:
        programs = load_time.benchmark_programs([args.steps], llm=False)
    caches = load_time.caches()
    for name, data in programs.items():
        prog = ptexec.load(data)
        method = "forward" if "forward" in prog.method_names else prog.method_names[0]
        plan = prog.pte.program.execution_plan[prog.method_names.index(method)]
        load_time.ptexec_load(data, method)  # operators resolved, code kept on disk
        first = _median_load(data, method, args.rounds, load_time.forget_loads)
        again = _median_load(data, method, args.rounds, lambda: None)
        kernels, forms = local_forms(plan)
        print(
            f"{name}: first {first * 1e3:.2f} ms, again {again * 1e3:.2f} ms; "
            f"{kernels} kernel instructions in {forms} local forms"
        )
        for cache, clear in caches.items():
            without = _median_load(data, method, args.rounds, clear)
            saved = without - again
            if saved > 0.02 * first:
                print(
                    f"  {cache:<36} {saved * 1e3:8.2f} ms  ({100 * saved / first:4.1f}% of a first load)"
                )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
