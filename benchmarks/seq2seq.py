#!/usr/bin/env python3
"""Encoder-decoder decode speed: ptexec's Seq2SeqRunner vs the eager model vs optimum's loop.

Usage:
    python benchmarks/seq2seq.py [--variants whisper_portable whisper_xnnpack t5_portable t5_xnnpack]
                                 [--decode 24] [--blocks 5] [--threads 1]

The programs are the tiny Whisper exports of ``scripts/seq2seq_programs.py``
(optimum-executorch, portable and XNNPACK recipes) and its tiny T5 (built from
optimum-executorch's modules, encoder of 48 ids; portable and lowered with XNNPACK's
partitioner). Each runtime encodes one input once
and then decodes ``--decode`` tokens greedily, one decoder call a token, from the start
token (EOS ignored, so every runtime does the same number of steps):

* ``ptexec``: ``Seq2SeqRunner.generate`` (its ``Stats.tokens_per_second``: the decode
  after the first token, sampling included);
* ``eager``: the Hugging Face model, ``model(encoder_outputs=..., decoder_input_ids=...,
  past_key_values=...)`` one token a call with its dynamic cache, argmax in between;
* ``optimum``: ``ExecuTorchModelForSpeechSeq2Seq.forward`` (``...ForSeq2SeqLM`` for T5) with the encoder output given
  (the step of optimum's own ``generate`` loop) on ExecuTorch's runtime, argmax between.

Runtimes alternate in blocks (``--blocks``, median of blocks) on ``--threads`` threads.
Ratios are ptexec's tokens/s over the other's (above 1: ptexec decodes faster). Greedy
tokens are compared and the agreement printed.
"""

from __future__ import annotations

import argparse
import os
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import seq2seq_programs  # noqa: E402

# one block: decode n tokens after encoding; returns (seconds per token, tokens)
Run = Callable[[int], tuple[float, list[int]]]


def ptexec_run(folder: Path, features: torch.Tensor) -> Run:
    from ptexec.llm import DecoderPrompt, GenerationConfig, Seq2SeqRunner

    runner = Seq2SeqRunner(folder / "model.pte", folder)
    start = runner.prompt.start

    def run(n: int) -> tuple[float, list[int]]:
        config = GenerationConfig(temperature=0.0, max_new_tokens=n, ignore_eos=True)
        ids = runner.generate(features, config, prompt=DecoderPrompt(start))
        return 1.0 / runner.stats.tokens_per_second, ids

    return run


def eager_run(folder: Path, features: torch.Tensor, start: int) -> Run:
    import transformers

    cls = (
        transformers.T5ForConditionalGeneration
        if features.dtype == torch.int64
        else transformers.WhisperForConditionalGeneration
    )
    model = cls.from_pretrained(folder).eval()

    def run(n: int) -> tuple[float, list[int]]:
        with torch.no_grad():
            hidden = model.get_encoder()(features).last_hidden_state
            cache = transformers.EncoderDecoderCache(
                transformers.DynamicCache(), transformers.DynamicCache()
            )
            ids, cur, first = [], start, 0.0
            for i in range(n):
                out = model(
                    encoder_outputs=(hidden,),
                    decoder_input_ids=torch.tensor([[cur]]),
                    past_key_values=cache,
                    use_cache=True,
                )
                cache = out.past_key_values
                cur = int(out.logits[0, -1].argmax())
                ids.append(cur)
                if i == 0:
                    first = time.perf_counter()
            return (time.perf_counter() - first) / max(n - 1, 1), ids

    return run


def optimum_run(folder: Path, features: torch.Tensor, start: int) -> Run:
    from optimum.executorch import ExecuTorchModelForSeq2SeqLM, ExecuTorchModelForSpeechSeq2Seq

    cls = (
        ExecuTorchModelForSeq2SeqLM
        if features.dtype == torch.int64
        else ExecuTorchModelForSpeechSeq2Seq
    )
    model = cls.from_pretrained(str(folder))

    def run(n: int) -> tuple[float, list[int]]:
        ids, cur, hidden, first = [], start, None, 0.0
        for i in range(n):
            logits, hidden = model.forward(
                features, torch.tensor([[cur]]), torch.tensor([i]), hidden
            )
            cur = int(torch.argmax(logits[:, -1, :], dim=-1).item())
            ids.append(cur)
            if i == 0:
                first = time.perf_counter()
        return (time.perf_counter() - first) / max(n - 1, 1), ids

    return run


def bench(variant: str, decode: int, blocks: int) -> dict[str, Any]:
    folder = seq2seq_programs.program_dir(variant)
    g = torch.Generator().manual_seed(0)
    if seq2seq_programs.VARIANTS[variant]["kind"] == "t5":
        features = torch.randint(3, seq2seq_programs.VOCAB, (1, seq2seq_programs.MAX_SEQ_LEN),
                                 generator=g)  # fmt: skip
        start = int(seq2seq_programs.T5["decoder_start_token_id"])
    else:
        features = torch.randn(1, 80, 3000, generator=g)
        start = seq2seq_programs.START_ID
    runs = {
        "ptexec": ptexec_run(folder, features),
        "eager": eager_run(folder, features, start),
        "optimum": optimum_run(folder, features, start),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    tokens: dict[str, list[int]] = {}
    for name, run in runs.items():  # warm-up
        tokens[name] = run(decode)[1]
    for _ in range(blocks):
        for name, run in runs.items():
            times[name].append(run(decode)[0])
    tps = {k: 1.0 / statistics.median(v) for k, v in times.items()}
    same = {k: tokens[k] == tokens["eager"] for k in runs if k != "eager"}
    return {"variant": variant, "tokens_per_s": tps, "same_tokens": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["whisper_portable", "whisper_xnnpack", "t5_portable", "t5_xnnpack"],
    )
    parser.add_argument("--decode", type=int, default=24, help="tokens per block (default 24)")
    parser.add_argument("--blocks", type=int, default=5, help="interleaved blocks (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="threads (0: defaults)")
    args = parser.parse_args(argv)
    if args.threads:
        import ptexec

        ptexec.set_num_threads(args.threads)
    rows = [bench(v, args.decode, args.blocks) for v in args.variants]
    print(
        f"{args.decode} decode steps, median of {args.blocks} blocks, "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(
        f"{'program':18} {'ptexec tok/s':>13} {'eager tok/s':>12} {'optimum tok/s':>14} "
        f"{'vs eager':>9} {'vs optimum':>11}  same tokens as eager"
    )
    for r in rows:
        t = r["tokens_per_s"]
        same = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in r["same_tokens"].items())
        print(
            f"{r['variant']:18} {t['ptexec']:13.1f} {t['eager']:12.1f} {t['optimum']:14.1f} "
            f"{t['ptexec'] / t['eager']:9.2f} {t['ptexec'] / t['optimum']:11.2f}  {same}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
