"""``ptexec run``, ``trace`` and ``profile``: call a method and show what happened."""

from __future__ import annotations

import argparse
import statistics
import time

from .common import Progress, apply_threads, json_text, report_has_warnings, save, threads_used
from .compile import compile_option
from .inputs import method_and_inputs, summary

DEFAULT_DEBUG_BUFFER = 256 << 20
"""``ptexec run --debug-buffer``'s default limit, in bytes (used as values are recorded)."""


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    if args.debug_buffer and not args.etdump:
        raise ValueError("--debug-buffer records into an ETDump: give --etdump too")
    if args.debug_buffer_size is not None and not args.debug_buffer:
        raise ValueError("--debug-buffer-size limits --debug-buffer: give --debug-buffer too")
    apply_threads(args)
    with report_has_warnings():
        method, inputs = method_and_inputs(args, **compile_option(args))
    if method.compile_report is not None:
        print("  " + method.compile_report.summary().replace("\n", "\n  "))
    if args.etdump:
        from ..etdump import ETDumpRecorder

        size = args.debug_buffer_size or DEFAULT_DEBUG_BUFFER
        recorder = ETDumpRecorder(size if args.debug_buffer else 0)
        outputs = recorder.execute(method, inputs)
        recorder.write(args.etdump, args.debug_buffer)
        also = f" and its values to {args.debug_buffer}" if args.debug_buffer else ""
        print(f"  the first call recorded as an ETDump in {args.etdump}{also}")
    else:
        outputs = method.execute(inputs)
    cuda = torch.cuda.is_available()
    for _ in range(min(args.repeat, 5)):  # warm-up calls, not timed
        method.execute(inputs)
    if cuda:
        torch.cuda.synchronize()  # the warm-up's queued work is not the first call's time
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        method.execute(inputs)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    for i, y in enumerate(outputs):
        print(f"  output {i}: {summary(y)}")
    rec = method.last_call
    copied = ", ".join(f"{k} {v}" for k, v in rec.bytes_copied.items() if v) or "none"
    print(f"  inputs bound: {', '.join(rec.inputs) or 'none'}; bytes copied: {copied}")
    if times:
        med = statistics.median(times)
        print(
            f"  latency: median {med * 1e3:.3f} ms over {len(times)} call(s) (min {min(times) * 1e3:.3f} ms)"
            f" {threads_used()}"
        )
    if args.output:
        save(outputs, args.output)
        print(f"  outputs saved to {args.output}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    if args.worst is not None and not args.reference:
        raise ValueError("--worst lists errors against --reference: give --reference too")
    apply_threads(args)
    method, inputs = method_and_inputs(args, optimize=not args.no_optimize)
    progress = Progress("trace: {done} instructions run ({total} in the program)")
    try:
        tr = method.trace(
            inputs,
            tensors=bool(args.save_tensors),
            reference=args.reference,
            stop_on=args.stop_on,
            reads=args.reads,
            progress=progress,
        )
    finally:
        progress.close()
    print(tr.table(limit=args.limit))
    print(f"  ran {threads_used()}")
    if tr.outputs is not None:
        for i, y in enumerate(tr.outputs):
            print(f"  output {i}: {summary(y)}")
    if args.reference and tr.records:
        worst = tr.worst(5 if args.worst is None else args.worst)
        if worst:
            print("largest errors against the float64 reference:")
            for r in worst:
                print(f"  instruction {r.index} {r.name}: {r.error}")
    if args.json:
        with open(args.json, "w") as f:
            f.write(json_text(tr.to_dict(), indent=1))
        print(f"  trace saved to {args.json}")
    if args.save_tensors:
        save(tr.tensors(), args.save_tensors)
        print(f"  tensors saved to {args.save_tensors}")
    return 2 if tr.stopped is not None else 0


def cmd_profile(args: argparse.Namespace) -> int:
    apply_threads(args)
    method, inputs = method_and_inputs(args, optimize=not args.no_optimize)
    progress = Progress("profile: call {done} of {total}")
    try:
        prof = method.profile(inputs, repeat=args.repeat, warmup=args.warmup, progress=progress)
    finally:
        progress.close()
    by = ["operator", "instruction"] if args.by == "both" else [args.by]
    for k, table in enumerate(by):
        if k:
            print()
        print(prof.table(by=table, top=args.top))
    print(f"  ran {threads_used()}")
    if args.chrome_trace:
        prof.save_chrome_trace(args.chrome_trace)
        print(
            f"  Chrome trace saved to {args.chrome_trace} (open it in Perfetto or chrome://tracing)"
        )
    return 0
