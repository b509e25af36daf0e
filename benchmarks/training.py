"""Training steps per second: ptexec.training against ExecuTorch's TrainingModule.

    python benchmarks/training.py                  # committed fixtures + one wider MLP
    python benchmarks/training.py --no-export --blocks 7 --steps 20

One step is what ExecuTorch's examples do: ``forward_backward`` then an SGD step with the
package's own ``get_sgd_optimizer`` (lr 0.01, momentum 0.9), on the same program file, the
same inputs, one intra-op thread. The programs are the committed training fixtures (MLP,
CNN, LoRA'd tiny transformer) and, unless ``--no-export``, an MLP with real layer widths
(512 -> 1024 -> 1024 -> 10, batch 64) exported for training here (about half a minute).
ptexec also runs the step with ``torch.optim.AdamW``. The two runtimes alternate block by
block; each figure is the median over blocks, and the ratio is ExecuTorch's time per step
over ptexec's, measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import ptexec.training  # noqa: E402
from training_models import example_inputs, export_training  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "training"


class WideMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(512, 1024)
        self.fc2 = nn.Linear(1024, 1024)
        self.fc3 = nn.Linear(1024, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.cross_entropy(self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))), y),)


def _programs(export: bool) -> list[tuple[str, bytes, tuple[torch.Tensor, ...], int]]:
    """(name, program, inputs, steps divisor): ExecuTorch takes seconds per step of the
    wide MLP, so its blocks are shorter."""
    out = [
        (n, (FIX / f"{n}.pte").read_bytes(), example_inputs(n), 1) for n in ("mlp", "cnn", "lora")
    ]
    if export:
        torch.manual_seed(0)
        inputs = (torch.randn(64, 512), torch.randint(0, 10, (64,)))
        pte, _ = export_training(WideMLP(), inputs)
        out.append(("mlp 512-1024-1024-10, batch 64", pte, inputs, 5))
    return out


def _steppers(pte: bytes, inputs: tuple[torch.Tensor, ...]) -> dict[str, Callable[[], Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from executorch.extension.pybindings import portable_lib
        from executorch.extension.training.pybindings import _training_lib, _training_module

    ours = ptexec.training._load_for_executorch_for_training_from_buffer(pte)
    ours.forward_backward("forward", inputs)
    sgd = ptexec.training.get_sgd_optimizer(ours.named_parameters(), 0.01, 0.9)
    adam_tm = ptexec.training._load_for_executorch_for_training_from_buffer(pte)
    adamw = torch.optim.AdamW(adam_tm.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExecuTorch's "experimental" warnings
        theirs = _training_module.TrainingModule(portable_lib._load_for_executorch_from_buffer(pte))
        theirs.forward_backward("forward", inputs)
        et_sgd = _training_lib.get_sgd_optimizer(theirs.named_parameters(), 0.01, 0.9)

    def ptexec_sgd() -> None:
        ours.forward_backward("forward", inputs)
        sgd.step(ours.named_gradients())

    def ptexec_adamw() -> None:
        adamw.zero_grad()
        adam_tm.forward_backward("forward", inputs)
        adamw.step()

    def executorch_sgd() -> None:
        theirs.forward_backward("forward", inputs)
        et_sgd.step(theirs.named_gradients())

    return {
        "ExecuTorch TrainingModule + SGD": executorch_sgd,
        "ptexec.training + SGD": ptexec_sgd,
        "ptexec.training + torch AdamW": ptexec_adamw,
    }


def _time(fn: Callable[[], Any], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-export", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.threads} thread(s), {args.blocks} blocks of {args.steps} steps, medians")
    for name, pte, inputs, divisor in _programs(not args.no_export):
        steps = max(1, args.steps // divisor)
        steppers = _steppers(pte, inputs)
        for fn in steppers.values():
            fn()  # warm up
        times: dict[str, list[float]] = {k: [] for k in steppers}
        for _ in range(args.blocks):
            for key, fn in steppers.items():
                times[key].append(_time(fn, steps))
        med = {k: statistics.median(v) for k, v in times.items()}
        et = med["ExecuTorch TrainingModule + SGD"]
        print(f"\n{name} ({steps} steps a block)")
        for key, t in med.items():
            print(f"  {key:34s} {1 / t:10.1f} steps/s   x{et / t:6.2f} vs ExecuTorch")


if __name__ == "__main__":
    main()
