"""Shared by the LLM tests: the exported tiny Llama programs, a tokenizer, and a greedy
reference loop on ExecuTorch's own runtime."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import llm_programs  # noqa: E402

PROMPT = "Once upon a time"


def program(variant: str) -> Path:
    """The variant's program, exported once per machine (skips without ExecuTorch)."""
    pytest.importorskip("executorch.extension.llm.export")
    if llm_programs.VARIANTS[variant].exporter == "optimum":
        pytest.importorskip("optimum.exporters.executorch")
    return llm_programs.program_path(variant)


def executorch_logits(pte: Path, tokens: list[int]) -> list[torch.Tensor]:
    """The logits after each of ``tokens`` (one token a call from position 0), run on
    ExecuTorch's runtime: row ``i`` predicts ``tokens[i + 1]``."""
    pytest.importorskip("executorch.runtime")
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: kernels)
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (llama:: kernels)
    from executorch.runtime import Runtime

    method: Any = Runtime.get().load_program(str(pte)).load_method("forward")
    rows = []
    for i, t in enumerate(tokens):
        out = method.execute([torch.tensor([[t]]), torch.tensor([i])])[0]
        rows.append(out.reshape(-1, out.shape[-1])[-1].float().clone())
    return rows


def executorch_greedy(
    pte: Path, prompt: list[int], count: int, dynamic: bool, cache_positions: bool = False
) -> list[int]:
    """``count`` greedy tokens after ``prompt``, run on ExecuTorch's runtime: the prompt in
    one call when the program is dynamic, else one token a call; then one token a call.
    The position input is the start position, or with ``cache_positions`` the position of
    every token (Hugging Face exports)."""
    pytest.importorskip("executorch.runtime")
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: kernels)
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (llama:: kernels)
    from executorch.runtime import Runtime

    method: Any = Runtime.get().load_program(str(pte)).load_method("forward")

    def call(tokens: list[int], pos: int) -> torch.Tensor:
        where = torch.arange(pos, pos + len(tokens)) if cache_positions else torch.tensor([pos])
        out = method.execute([torch.tensor([tokens]), where])[0]
        return out.reshape(-1, out.shape[-1])[-1]

    if dynamic:
        logits = call(prompt, 0)
    else:
        for i, t in enumerate(prompt):
            logits = call([t], i)
    pos = len(prompt)
    out = [int(logits.argmax())]
    while len(out) < count:
        logits = call([out[-1]], pos)
        pos += 1
        out.append(int(logits.argmax()))
    return out
