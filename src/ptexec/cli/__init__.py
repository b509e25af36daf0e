"""The ``ptexec`` command: ``inspect`` a program, ``run`` a method, ``trace``/``profile`` a
call, show a method's memory ``plan``, ``generate`` text with an exported LLM, ``compile``
its methods (fill the cache), ``transcribe`` speech."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from contextlib import suppress

from .common import (
    DEBUG_VARIABLE,
    Parser,
    add_threads,
    failure,
    non_negative,
    output_file,
    picture_file,
    positive,
    show_warning,
)
from .compile import cmd_cache, cmd_compile
from .generate import add_generate
from .inspect import cmd_inspect, cmd_plan
from .run import DEFAULT_DEBUG_BUFFER, cmd_profile, cmd_run, cmd_trace
from .serve import add_serve
from .transcribe import add_transcribe

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ptexec",
        description="Run and inspect ExecuTorch programs (.pte) with PyTorch kernels.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("file", help="the .pte program")
        p.add_argument("--data", help="external data file (.ptd) of the program")
        p.add_argument("--method", help="method name (default: all for inspect, forward for run)")
        p.add_argument(
            "--device-map", help="remap devices: 'cpu', 'cuda:0', or 'cuda:0=cpu,cuda:1=cpu'"
        )

    p_inspect = sub.add_parser(
        "inspect", help="methods, inputs/outputs with devices, memory plan, operators, delegates"
    )
    common(p_inspect)
    p_inspect.add_argument("--json", action="store_true", help="print JSON")
    p_inspect.add_argument(
        "--values", action="store_true", help="list every tensor with its device and memory"
    )
    p_inspect.add_argument(
        "--compile",
        action="store_true",
        help="also compile each method (or read it from the cache) and show what runs compiled",
    )
    p_inspect.add_argument(
        "--code",
        action="store_true",
        help="print the generated Python each method runs (its fast call and blocks; "
        "with --compile, its compiled regions)",
    )
    p_inspect.set_defaults(func=cmd_inspect)

    p_run = sub.add_parser(
        "run", help="run a method on random or given inputs; print outputs and latency"
    )
    common(p_run)
    p_run.add_argument(
        "--input", action="append", help="input file (.pt: a tensor or a list; .npy); repeatable"
    )
    p_run.add_argument(
        "--repeat", type=positive, default=20, help="timed calls after the first (default 20)"
    )
    p_run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p_run.add_argument(
        "--output", type=output_file, help="save the outputs (torch.save) to this file"
    )
    p_run.add_argument(
        "--compile",
        action="store_true",
        help="run the compiled tier (compile=True); show its report",
    )
    p_run.add_argument(
        "--etdump",
        type=output_file,
        help="record the first call as an ETDump (.etdp) for ExecuTorch's Inspector",
    )
    p_run.add_argument(
        "--debug-buffer",
        type=output_file,
        help="with --etdump: record every instruction's outputs too, into this file",
    )
    p_run.add_argument(
        "--debug-buffer-size",
        type=positive,
        help=f"with --debug-buffer: the most bytes it may hold "
        f"(default {DEFAULT_DEBUG_BUFFER >> 20} MiB)",
    )
    add_threads(p_run)
    p_run.set_defaults(func=cmd_run)

    p_compile = sub.add_parser(
        "compile",
        help="compile methods with AOTInductor into the cache (PTEXEC_CACHE_DIR); show the report",
    )
    common(p_compile)
    p_compile.add_argument(
        "--device", help="compile for this device (as --device-map: 'cpu', 'cuda:0', ...)"
    )
    add_threads(p_compile)
    p_compile.set_defaults(func=cmd_compile)

    p_cache = sub.add_parser(
        "cache",
        help="the compile cache and the generated code kept for loads: list, verify or clear",
    )
    p_cache.add_argument("action", choices=["list", "verify", "clear"])
    p_cache.add_argument("--dir", help="the cache directory (default: PTEXEC_CACHE_DIR, ...)")
    p_cache.set_defaults(func=cmd_cache)

    def inputs(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--input",
            action="append",
            help="input file (.pt: a tensor or a list; .npy); repeatable",
        )
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        add_threads(p)
        p.add_argument(
            "--no-optimize",
            action="store_true",
            help="run every instruction as the file says (no load-time views or folding)",
        )

    p_trace = sub.add_parser(
        "trace", help="run a method once and show what every instruction wrote"
    )
    common(p_trace)
    inputs(p_trace)
    p_trace.add_argument(
        "--reference",
        action="store_true",
        help="also run a float64 reference and show each result's error against it",
    )
    p_trace.add_argument(
        "--stop-on",
        choices=["nan", "inf", "nonfinite"],
        help="stop at the first instruction that writes a NaN / an Inf / either (exit status 2)",
    )
    p_trace.add_argument("--reads", action="store_true", help="also summarise what each one read")
    p_trace.add_argument("--limit", type=positive, help="show at most this many instructions")
    p_trace.add_argument(
        "--worst",
        type=non_negative,
        help="with --reference: the largest errors to list (default 5)",
    )
    p_trace.add_argument("--json", type=output_file, help="save the trace as JSON to this file")
    p_trace.add_argument(
        "--save-tensors",
        type=output_file,
        help="save every tensor written (torch.save) to this file",
    )
    p_trace.set_defaults(func=cmd_trace)

    p_profile = sub.add_parser(
        "profile", help="time every instruction; tables by operator and instruction, Chrome trace"
    )
    common(p_profile)
    inputs(p_profile)
    p_profile.add_argument("--repeat", type=positive, default=10, help="timed calls (default 10)")
    p_profile.add_argument(
        "--warmup", type=non_negative, default=1, help="untimed calls first (default 1)"
    )
    p_profile.add_argument(
        "--by", choices=["operator", "instruction", "both"], default="operator", help="table rows"
    )
    p_profile.add_argument("--top", type=positive, default=20, help="rows to show (default 20)")
    p_profile.add_argument(
        "--chrome-trace",
        type=output_file,
        help="save a Chrome trace (JSON; Perfetto, chrome://tracing)",
    )
    p_profile.set_defaults(func=cmd_profile)

    p_plan = sub.add_parser(
        "plan", help="the memory plan: buffers, tensor lifetimes, peak bytes live; a picture"
    )
    common(p_plan)
    p_plan.add_argument(
        "--out",
        type=picture_file,
        help="draw the plan to this file (.png, .svg, .pdf; needs matplotlib)",
    )
    p_plan.add_argument(
        "--top",
        type=positive,
        default=None,
        help="largest tensors to list (default 10; with --json, all)",
    )
    p_plan.add_argument("--json", action="store_true", help="print JSON")
    p_plan.set_defaults(func=cmd_plan)
    add_generate(sub)
    add_serve(sub)
    add_transcribe(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ptexec`` command. A failure is one line on stderr (``ptexec: <type>:
    <what>``) and exit status 1 (2 for a usage error, 130 when interrupted);
    ``PTEXEC_DEBUG=1`` shows its traceback instead."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = show_warning
        try:
            return int(args.func(args))
        except KeyboardInterrupt:
            if debug:
                raise
            print("ptexec: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # the reader of stdout went away (ptexec inspect ... | head)
            # nothing more goes to it, not even what the interpreter flushes at exit (when
            # stdout is a file at all)
            with suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        except Exception as e:
            if debug:
                raise
            from ..errors import PtexecError

            line = failure(e, args)
            if not isinstance(e, PtexecError | OSError | ValueError | TypeError):
                line += f" ({DEBUG_VARIABLE}=1 shows where)"
            print(f"ptexec: {line}", file=sys.stderr)
            return 1
