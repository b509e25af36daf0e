#!/usr/bin/env python3
"""Image/audio-prompt generation: ptexec's MultimodalRunner vs the eager model vs optimum.

Usage:
    python benchmarks/multimodal.py [--models llava voxtral] [--decode 32] [--blocks 5]
                                    [--threads 1]

The models are the tiny random LLaVA and Voxtral of ``tests/multimodal_models.py``
(optimum-executorch exports, cached per machine). Each runtime generates greedily from the
same processor output (the LLaVA prompt with a 40x30 image; the Voxtral prompt with 2 s of
audio features): a prefill (encoder, embeddings, decoder over the prompt) then ``--decode``
single-token steps past EOS.

- ptexec: ``MultimodalRunner.generate_hf`` (``ignore_eos``); prefill is the time to the
  first token, decode rate from its ``Stats``;
- eager: the Hugging Face model's forward with its KV cache, the same greedy loop;
- optimum: ``ExecuTorchModelForMultiModalToText.forward`` on ExecuTorch's runtime (the
  calls optimum's own ``generate`` makes), the same loop.

Runtimes alternate within each block in one process (median of ``--blocks``), on
``--threads`` threads. The tokens of each runtime are compared with the eager model's.
Ratios: ptexec / other for decode tokens/s (above 1: ptexec faster) and prefill time (below
1: ptexec faster).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.append(str(ROOT / "src"))  # after PYTHONPATH: another tree may be measured
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import multimodal_models as mm  # noqa: E402

Run = Callable[[], tuple[float, float, list[int]]]  # -> prefill ms, decode tok/s, tokens


def _inputs(name: str, d: Path) -> tuple[dict[str, torch.Tensor], Any]:
    import transformers as t

    ck = d / "checkpoint"
    torch.manual_seed(0)
    if mm.MODELS[name]["kind"] == "image":
        from PIL import Image

        px = torch.randint(0, 256, (30, 40, 3), dtype=torch.uint8)
        processor = t.AutoProcessor.from_pretrained(ck)
        out = processor(
            text=mm.PROMPTS["image"], images=Image.fromarray(px.numpy()), return_tensors="pt"
        )
        model = t.LlavaForConditionalGeneration.from_pretrained(ck).eval()
        return {k: out[k] for k in ("input_ids", "pixel_values")}, model
    from ptexec.llm import audio_features

    wave = 0.3 * torch.sin(2 * torch.pi * 440 * torch.arange(32000) / 16000)
    feats = audio_features(wave, 16000, ck)
    tok = t.AutoTokenizer.from_pretrained(ck)
    before, after = mm.PROMPTS["audio"].split("<audio>")
    ids = (
        tok.encode(before, add_special_tokens=False)
        + [mm.AUDIO] * 25
        + tok.encode(after, add_special_tokens=False)
    )
    model = t.VoxtralForConditionalGeneration.from_pretrained(ck).eval()
    return {"input_ids": torch.tensor([ids]), "input_features": feats}, model


def ptexec_run(d: Path, inputs: dict[str, torch.Tensor], decode: int) -> Run:
    from ptexec.llm import GenerationConfig, MultimodalRunner

    ck = d / "checkpoint"
    runner = MultimodalRunner(
        str(d / "model.pte"), str(ck / "tokenizer.json"), processor=ck, print_output=False
    )
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=decode + 1, echo=False, ignore_eos=True)

    def run() -> tuple[float, float, list[int]]:
        runner.reset()
        runner.generate_hf(inputs, cfg)
        s = runner.stats
        return s.time_to_first_token_ms, s.tokens_per_second, list(runner.generated_tokens)

    return run


def _loop(
    first: Callable[[], torch.Tensor], step: Callable[[int, int], torch.Tensor], n: int, decode: int
) -> tuple[float, float, list[int]]:
    t0 = time.perf_counter()
    logits = first()
    tok = int(logits.reshape(-1, logits.shape[-1])[-1].argmax())
    t1 = time.perf_counter()
    out = [tok]
    for i in range(decode):
        logits = step(tok, n + i)
        tok = int(logits.reshape(-1, logits.shape[-1])[-1].argmax())
        out.append(tok)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, decode / (t2 - t1), out


def eager_run(model: Any, inputs: dict[str, torch.Tensor], decode: int) -> Run:
    n = int(inputs["input_ids"].shape[1])

    def run() -> tuple[float, float, list[int]]:
        state: dict[str, Any] = {}

        @torch.no_grad()
        def first() -> torch.Tensor:
            out = model(**inputs, attention_mask=torch.ones(1, n, dtype=torch.long), use_cache=True)
            state["past"] = out.past_key_values
            return out.logits

        @torch.no_grad()
        def step(tok: int, pos: int) -> torch.Tensor:
            out = model(
                input_ids=torch.tensor([[tok]]),
                attention_mask=torch.ones(1, pos + 1, dtype=torch.long),
                past_key_values=state["past"],
                use_cache=True,
            )
            state["past"] = out.past_key_values
            return out.logits

        return _loop(first, step, n, decode)

    return run


def optimum_run(d: Path, inputs: dict[str, torch.Tensor], decode: int, work: Path) -> Run | None:
    try:
        from optimum.executorch import ExecuTorchModelForMultiModalToText
    except ImportError:
        return None
    folder = work / d.name
    folder.mkdir(exist_ok=True)
    shutil.copy(d / "checkpoint" / "config.json", folder / "config.json")
    if not (folder / "model.pte").exists():
        (folder / "model.pte").symlink_to(d / "model.pte")
    model = ExecuTorchModelForMultiModalToText.from_pretrained(str(folder))
    ids = inputs["input_ids"]
    feats = inputs.get("pixel_values", inputs.get("input_features"))
    n = int(ids.shape[1])

    def run() -> tuple[float, float, list[int]]:
        def first() -> torch.Tensor:
            return model.forward(ids, torch.arange(n), feats)

        def step(tok: int, pos: int) -> torch.Tensor:
            return model.forward(torch.tensor([[tok]]), torch.tensor([pos]))

        return _loop(first, step, n, decode)

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", nargs="+", default=["llava", "voxtral"], choices=sorted(mm.MODELS)
    )
    parser.add_argument("--decode", type=int, default=32, help="decode steps after the first token")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="threads (0: defaults)")
    args = parser.parse_args()
    if args.threads:
        import ptexec

        torch.set_num_threads(args.threads)
        ptexec.set_num_threads(args.threads)
    print(
        f"decode {args.decode} tokens, median of {args.blocks} blocks, {torch.get_num_threads()} thread(s)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            d = mm.model_dir(name)
            inputs, model = _inputs(name, d)
            runs: dict[str, Run] = {
                "ptexec": ptexec_run(d, inputs, args.decode),
                "eager": eager_run(model, inputs, args.decode),
            }
            opt = optimum_run(d, inputs, args.decode, Path(tmp))
            if opt is not None:
                runs["optimum (ExecuTorch)"] = opt
            for run in runs.values():  # warm up: loading, first calls
                run()
            prefill: dict[str, list[float]] = {k: [] for k in runs}
            rate: dict[str, list[float]] = {k: [] for k in runs}
            tokens: dict[str, list[int]] = {}
            for _ in range(args.blocks):
                for k, run in runs.items():
                    p, r, toks = run()
                    prefill[k].append(p)
                    rate[k].append(r)
                    tokens[k] = toks
            print(
                f"\n{name} ({mm.MODELS[name]['recipe']}), prompt {inputs['input_ids'].shape[1]} positions"
            )
            print(f"  {'runtime':22s} {'prefill ms':>11s} {'decode tok/s':>13s}  tokens = eager's")
            med = {k: (statistics.median(prefill[k]), statistics.median(rate[k])) for k in runs}
            for k in runs:
                same = tokens[k] == tokens["eager"]
                print(f"  {k:22s} {med[k][0]:11.2f} {med[k][1]:13.1f}  {same}")
            for k in runs:
                if k == "ptexec":
                    continue
                print(
                    f"  ptexec / {k}: prefill time x{med['ptexec'][0] / med[k][0]:.2f}, "
                    f"decode rate x{med['ptexec'][1] / med[k][1]:.2f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
