"""Runs optimum-executorch's ``ExecuTorchModelFor*`` classes on exported tiny models and
saves what they return; the same script, unchanged, on ExecuTorch's runtime (``python
hf_optimum_driver.py ...``) and on ptexec (``python -m ptexec.hf hf_optimum_driver.py ...``).

    python hf_optimum_driver.py OUT.pt KIND=DIR [KIND=DIR ...]

KIND is causal, seq2seq, speech, image or masked; DIR holds ``model.pte`` and the model's
``config.json``. Inputs are fixed (seeded), so both runs see the same ones.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def run(kind: str, folder: str) -> dict[str, Any]:
    from optimum.executorch import (
        ExecuTorchModelForCausalLM,
        ExecuTorchModelForImageClassification,
        ExecuTorchModelForMaskedLM,
        ExecuTorchModelForSeq2SeqLM,
        ExecuTorchModelForSpeechSeq2Seq,
    )

    g = torch.Generator().manual_seed(0)
    result: dict[str, Any] = {}
    if kind == "causal":
        model = ExecuTorchModelForCausalLM.from_pretrained(folder)
        prompt = [1, 5, 9, 17, 33]
        result["tokens"] = model.generate(prompt_tokens=prompt, max_seq_len=20)
        result["runtime"] = type(model.model).__module__
    elif kind == "seq2seq":
        model = ExecuTorchModelForSeq2SeqLM.from_pretrained(folder)
        # the encoder's declared length (a program exported with a fixed one takes exactly it)
        length = model.model.method_meta("encoder").input_tensor_meta(0).sizes()[-1]
        ids = torch.randint(3, 100, (1, length), generator=g)
        result["tokens"] = model.generate(ids, max_seq_len=12)
        result["runtime"] = type(model.model).__module__
    elif kind == "speech":
        model = ExecuTorchModelForSpeechSeq2Seq.from_pretrained(folder)
        meta = model.model.method_meta("encoder").input_tensor_meta(0).sizes()
        features = torch.randn(*meta, generator=g)
        result["tokens"] = model.generate(features, max_seq_len=12)
        result["runtime"] = type(model.model).__module__
    elif kind == "image":
        model = ExecuTorchModelForImageClassification.from_pretrained(folder)
        meta = model.model.method_meta("forward").input_tensor_meta(0).sizes()
        result["logits"] = model.forward(torch.randn(*meta, generator=g))
        result["runtime"] = type(model.model).__module__
    elif kind == "masked":
        model = ExecuTorchModelForMaskedLM.from_pretrained(folder)
        meta = model.model.method_meta("forward").input_tensor_meta(0).sizes()
        ids = torch.randint(3, 100, tuple(meta), generator=g)
        mask = torch.ones(tuple(meta), dtype=torch.long)
        result["logits"] = model.forward(ids, mask)
        result["runtime"] = type(model.model).__module__
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    return result


def main(argv: list[str]) -> None:
    out, jobs = argv[0], argv[1:]
    results = {}
    for job in jobs:
        kind, _, folder = job.partition("=")
        results[kind] = run(kind, folder)
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1:])
