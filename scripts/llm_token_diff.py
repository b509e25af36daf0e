#!/usr/bin/env python3
"""Where greedy decoding of an LLM program parts between ExecuTorch and ptexec's tiers.

Usage:
    python scripts/llm_token_diff.py [--model smollm2-4l] [--variant xnnpack_8da4w]
                                     [--prompt 16] [--seed 0] [--decode 32] [--no-compiled]
                                     [--xnnpack-torch] [--pte FILE]

Every runtime is fed the same tokens: the prompt in one call (or one token a call for a
static program), then ExecuTorch's greedy tokens one a call. So each step's logits compare
on the same history, and the first step where a runtime's argmax differs from ExecuTorch's
is where its own greedy decoding would first take another token. Printed per runtime: that
first differing step and the top-2 margin of ExecuTorch's logits there, and per step the
largest absolute logit difference from ExecuTorch's. Runtimes: ExecuTorch
(``executorch.runtime``), ptexec interpreted (``xnnpack="auto"``: ExecuTorch's XNNPACK runs
the delegates), optionally ptexec interpreted with its own XNNPACK runner
(``--xnnpack-torch``), and ptexec compiled (``load_method(..., compile=True)``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import llm_programs  # noqa: E402

Step = Callable[[list[int], int], torch.Tensor]


def executorch_step(pte: Path) -> Step:
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: kernels)
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")

    def step(tokens: list[int], pos: int) -> torch.Tensor:
        out = method.execute([torch.tensor([tokens]), torch.tensor([pos])])[0]
        return out.reshape(-1, out.shape[-1])[-1].clone()

    return step


def ptexec_step(pte: Path, **options: object) -> Step:
    import ptexec

    method = ptexec.load(pte).load_method("forward", **options)

    def step(tokens: list[int], pos: int) -> torch.Tensor:
        out = method.execute([torch.tensor([tokens]), torch.tensor([pos])])[0]
        return out.reshape(-1, out.shape[-1])[-1].clone()

    return step


def run(
    step: Step, prompt: list[int], forced: list[int] | None, decode: int, dynamic: bool
) -> list[torch.Tensor]:
    """Each step's logits: the prompt's last, then one per fed token (``forced``, else the
    runtime's own argmax)."""
    if dynamic:
        logits = [step(prompt, 0)]
    else:
        for i, t in enumerate(prompt):
            last = step([t], i)
        logits = [last]
    pos = len(prompt)
    for i in range(decode):
        tok = forced[i] if forced is not None else int(logits[-1].argmax())
        logits.append(step([tok], pos))
        pos += 1
    return logits


def margin(x: torch.Tensor) -> float:
    top = torch.topk(x.float(), 2).values
    return float(top[0] - top[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-4l", choices=list(llm_programs.MODELS))
    parser.add_argument("--variant", default="xnnpack_8da4w")
    parser.add_argument("--pte", type=Path, help="a program file (instead of the variant's)")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens (default 16)")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="another prompt: token i is (11 i + 5 + 7 seed) %% 500 + 3",
    )
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--no-compiled", action="store_true")
    parser.add_argument("--xnnpack-torch", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import ptexec

    ptexec.set_num_threads(args.threads)
    model = llm_programs.MODELS[args.model]
    pte = args.pte or llm_programs.program_path(args.variant, model)
    dynamic = args.pte is not None or llm_programs.VARIANTS[args.variant].dynamic
    prompt = [(11 * i + 5 + 7 * args.seed) % 500 + 3 for i in range(args.prompt)]

    ref = run(executorch_step(pte), prompt, None, args.decode, dynamic)
    forced = [int(x.argmax()) for x in ref]
    runtimes: dict[str, Step] = {"ptexec": ptexec_step(pte)}
    if args.xnnpack_torch:
        runtimes["ptexec xnnpack=torch"] = ptexec_step(pte, xnnpack="torch")
    if not args.no_compiled:
        runtimes["ptexec compiled"] = ptexec_step(pte, compile=True)
    print(f"{pte.name}: prompt {args.prompt}, {args.decode} steps; ExecuTorch tokens {forced}")
    same_all = True
    for name, step in runtimes.items():
        got = run(step, prompt, forced[:-1], args.decode, dynamic)
        diffs = [float((a.float() - b.float()).abs().max()) for a, b in zip(got, ref, strict=True)]
        tokens = [int(x.argmax()) for x in got]
        first = next(
            (i for i, (a, b) in enumerate(zip(tokens, forced, strict=True)) if a != b), None
        )
        exact = sum(d == 0.0 for d in diffs)
        print(f"\n{name}: {exact}/{len(diffs)} steps' logits bit-identical to ExecuTorch's")
        if first is None:
            print("  greedy tokens: the same at every step")
        else:
            same_all = False
            print(
                f"  first differing step {first}: {tokens[first]} vs ExecuTorch's "
                f"{forced[first]}, ExecuTorch's top-2 margin {margin(ref[first]):.6f}"
            )
        print("  max |logit diff| per step: " + " ".join(f"{d:.3g}" for d in diffs))
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
