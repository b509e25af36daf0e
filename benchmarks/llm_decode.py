#!/usr/bin/env python3
"""LLM decode and prefill: ptexec (interpreted, compiled) vs ExecuTorch, same programs.

Usage:
    python benchmarks/llm_decode.py [--variants portable xnnpack xnnpack_8da4w]
                                    [--prompt 32] [--decode 64] [--blocks 7] [--threads 1]
                                    [--model tiny|smollm2-135m|smollm2-4l] [--no-compiled]

The programs are tiny Llamas exported with ExecuTorch's LLM exporter
(``scripts/llm_programs.py``: KV cache, custom SDPA, a seeded checkpoint; portable,
XNNPACK fp32, XNNPACK 8da4w, ...). Each runtime runs the same greedy loop on the same file:
prefill ``--prompt`` tokens from position 0 (one call on a dynamic program), then
``--decode`` steps of one token each (feeding back the argmax). ptexec runs through
``ptexec.llm.TextDecoder`` (what ``TextLLMRunner`` uses); ExecuTorch through
``executorch.runtime`` with its LLM custom ops loaded. The column "ptexec compiled" uses
``load_method(..., compile=True)`` where this ptexec has it, and is skipped otherwise (or
with ``--no-compiled``); the time that compile took (a cold compile cache compiles, a warm
one loads the library) is printed. ``--model`` picks the model shape
(``llm_programs.MODELS``: the tiny default, ``smollm2-135m``, SmolLM2-135M's shape, or
``smollm2-4l``, four of its layers).

Runtimes alternate in blocks within one process (``--blocks``, median of blocks); all run
on ``--threads`` threads (default 1: torch's and XNNPACK's thread pools would otherwise
compete for the same cores). Greedy tokens of every runtime are compared with ExecuTorch's
and the agreement is printed. Ratios are ptexec / ExecuTorch tokens per second (above 1:
ptexec decodes faster) and prefill time (below 1: ptexec is faster). A last table gives each
runtime's first decode step after the prompt (the first call with a step's shapes after the
prompt's) beside its median step: with a dynamic program the difference is what a change
of shapes costs, paid once per prompt.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.append(str(ROOT / "src"))  # after PYTHONPATH: another tree may be measured

import llm_programs  # noqa: E402

Step = Callable[[list[int], int], torch.Tensor]


def ptexec_step(pte: Path, compile: bool = False) -> Step | None:
    """A step function of ptexec's ``TextDecoder`` on ``pte`` (``None``: this ptexec cannot
    compile the program); ``step.setup_s`` is how long the decoder took to make."""
    import ptexec
    from ptexec.errors import GenerationError
    from ptexec.llm import TextDecoder

    t0 = time.perf_counter()
    try:
        decoder = TextDecoder(ptexec.load(pte), compile=True) if compile else None
    except GenerationError:
        return None
    if decoder is None:
        decoder = TextDecoder(ptexec.load(pte))
    d = decoder

    def step(tokens: list[int], pos: int) -> torch.Tensor:
        return d.prefill(tokens, pos) if len(tokens) > 1 else d.step(tokens[0], pos)

    step.dynamic = d.dynamic  # type: ignore[attr-defined]
    step.setup_s = time.perf_counter() - t0  # type: ignore[attr-defined]
    return step


def executorch_step(pte: Path, cache_positions: bool = False) -> Step:
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: kernels)
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")

    def step(tokens: list[int], pos: int) -> torch.Tensor:
        where = torch.arange(pos, pos + len(tokens)) if cache_positions else torch.tensor([pos])
        out = method.execute([torch.tensor([tokens]), where])[0]
        return out.reshape(-1, out.shape[-1])[-1]

    return step


def profile_step(pte: Path, prompt_len: int) -> str:
    """ptexec's per-operator table of one decode step after a prefill (one token a call,
    so the same for both position layouts: one token's cache position is its start)."""
    import ptexec

    method = ptexec.load(pte).load_method("forward")
    tokens = [(11 * i + 5) % 500 + 3 for i in range(prompt_len)]
    for i, t in enumerate(tokens):  # works for static and dynamic programs alike
        method.execute([torch.tensor([[t]]), torch.tensor([i])])
    pos = prompt_len + 8
    prof = method.profile([torch.tensor([[5]]), torch.tensor([pos])], repeat=30)
    return str(prof.table(top=12))


def run_once(
    step: Step, prompt: list[int], decode: int, dynamic: bool
) -> tuple[float, float, float, list[int]]:
    """(prefill seconds, seconds of the first decode step after it, decode seconds per
    token over all steps, tokens). The first step is the first call with a decode step's
    shapes after the prompt's (a dynamic program's runners meet new shapes there)."""
    t0 = time.perf_counter()
    if dynamic:
        logits = step(prompt, 0)
    else:
        for i, t in enumerate(prompt):
            logits = step([t], i)
    t1 = time.perf_counter()
    tokens = [int(logits.argmax())]
    pos = len(prompt)
    t2 = time.perf_counter()
    first = 0.0
    for k in range(decode):
        logits = step([tokens[-1]], pos)
        if k == 0:
            first = time.perf_counter() - t2
        pos += 1
        tokens.append(int(logits.argmax()))
    t3 = time.perf_counter()
    return t1 - t0, first, (t3 - t2) / decode, tokens


def bench(
    variant: str,
    prompt_len: int,
    decode: int,
    blocks: int,
    model: llm_programs.TinyLlama | None = None,
    compiled_too: bool = True,
) -> dict[str, Any]:
    pte = llm_programs.program_path(variant, model or llm_programs.MODELS["tiny"])
    dynamic = llm_programs.VARIANTS[variant].dynamic
    prompt = [(11 * i + 5) % 500 + 3 for i in range(prompt_len)]
    runtimes: dict[str, Step] = {"ptexec": ptexec_step(pte)}  # type: ignore[dict-item]
    compiled = ptexec_step(pte, compile=True) if compiled_too else None
    if compiled is not None:
        took = compiled.setup_s  # type: ignore[attr-defined]
        print(f"{variant}: compiled decoder made in {took:.1f} s", file=sys.stderr, flush=True)
    if compiled is not None:
        runtimes["ptexec compiled"] = compiled
    hf = llm_programs.VARIANTS[variant].exporter == "optimum"
    runtimes["ExecuTorch"] = executorch_step(pte, cache_positions=hf)
    for step in runtimes.values():  # warm up
        run_once(step, prompt, 4, dynamic)
    prefill: dict[str, list[float]] = {k: [] for k in runtimes}
    first: dict[str, list[float]] = {k: [] for k in runtimes}
    per_token: dict[str, list[float]] = {k: [] for k in runtimes}
    tokens: dict[str, list[int]] = {}
    for _ in range(blocks):
        for name, step in runtimes.items():
            p, f, d, toks = run_once(step, prompt, decode, dynamic)
            prefill[name].append(p)
            first[name].append(f)
            per_token[name].append(d)
            tokens[name] = toks
    return {
        "variant": variant,
        "prefill_ms": {k: statistics.median(v) * 1e3 for k, v in prefill.items()},
        "first_step_ms": {k: statistics.median(v) * 1e3 for k, v in first.items()},
        "tokens_per_s": {k: 1.0 / statistics.median(v) for k, v in per_token.items()},
        "same_tokens": {k: tokens[k] == tokens["ExecuTorch"] for k in runtimes},
        "compiled": compiled is not None,
        "compile_s": getattr(compiled, "setup_s", None),
    }


def _rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s:.0f}" if tokens_per_s >= 100 else f"{tokens_per_s:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["portable", "xnnpack", "xnnpack_8da4w", "portable_quant", "hf_xnnpack"],
    )
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens (default 32)")
    parser.add_argument("--decode", type=int, default=64, help="decode steps (default 64)")
    parser.add_argument("--blocks", type=int, default=7, help="interleaved blocks (default 7)")
    parser.add_argument("--threads", type=int, default=1, help="threads (0: defaults)")
    parser.add_argument(
        "--model",
        default="tiny",
        choices=list(llm_programs.MODELS),
        help="model shape (default tiny; smollm2-135m: SmolLM2-135M's shape, random weights; "
        "smollm2-4l: four of its layers)",
    )
    parser.add_argument(
        "--no-compiled", action="store_true", help="skip ptexec compiled (no compile)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also print ptexec's operator table for one decode step of each program",
    )
    args = parser.parse_args(argv)
    if args.threads:
        import ptexec

        ptexec.set_num_threads(args.threads)  # torch's threads and ExecuTorch's pool
    model = llm_programs.MODELS[args.model]
    rows = [
        bench(v, args.prompt, args.decode, args.blocks, model, not args.no_compiled)
        for v in args.variants
    ]
    print(
        f"model {args.model}, prompt {args.prompt} tokens, {args.decode} decode steps, "
        f"median of {args.blocks} blocks, {torch.get_num_threads()} thread(s)"
    )
    header = (
        f"{'program':16} {'ptexec tok/s':>13} {'compiled tok/s':>15} {'ExecuTorch tok/s':>17} "
        f"{'ratio':>7} {'ptexec prefill':>15} {'compiled prefill':>17} {'ET prefill':>11} "
        f"{'ratio':>7}  same tokens"
    )
    print(header)
    for r in rows:
        tps, pf = r["tokens_per_s"], r["prefill_ms"]
        comp_tps = _rate(tps["ptexec compiled"]) if r["compiled"] else "n/a"
        comp_pf = f"{pf['ptexec compiled']:.2f} ms" if r["compiled"] else "n/a"
        same = ", ".join(
            f"{k}: {'yes' if v else 'NO'}" for k, v in r["same_tokens"].items() if k != "ExecuTorch"
        )
        print(
            f"{r['variant']:16} {_rate(tps['ptexec']):>13} {comp_tps:>15} "
            f"{_rate(tps['ExecuTorch']):>17} "
            f"{tps['ptexec'] / tps['ExecuTorch']:7.2f} {pf['ptexec']:12.2f} ms {comp_pf:>17} "
            f"{pf['ExecuTorch']:8.2f} ms {pf['ptexec'] / pf['ExecuTorch']:7.2f}  {same}"
        )
    print("\nthe first decode step after the prompt, and a step's median over all steps:")
    for r in rows:
        parts = (
            f"{k} {r['first_step_ms'][k]:.2f} / {1e3 / r['tokens_per_s'][k]:.2f} ms"
            for k in r["first_step_ms"]
        )
        print(f"{r['variant']:16} " + ", ".join(parts))
    if args.profile:
        for v in args.variants:
            print(f"\n{v}: one decode step at position {args.prompt + 8}")
            print(profile_step(llm_programs.program_path(v, model), args.prompt))
    for r in rows:
        if r["compile_s"] is not None:
            print(f"{r['variant']}: compiled decoder made in {r['compile_s']:.1f} s")
    if args.no_compiled:
        print("ptexec compiled: skipped (--no-compiled)")
    elif not rows[0]["compiled"]:
        print("ptexec compiled: skipped (this ptexec has no load_method(..., compile=True))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
