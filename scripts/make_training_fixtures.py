#!/usr/bin/env python3
"""Make the training fixtures with ExecuTorch's real exporter (``_export_forward_backward``).

Usage:
    python scripts/make_training_fixtures.py [--out tests/fixtures/training]

Writes, under the output directory:

* ``mlp.pte``, ``cnn.pte``, ``lora.pte``: the modules of ``tests/training_models.py``
  exported for training (parameters in the program's mutable data);
* ``mlp_ext.pte`` / ``mlp_ext.ptd``: the MLP exported with ``external_mutable_weights``
  (its parameters in the data file);
* ``xor.pte`` and ``xor_ext.pte`` / ``xor.ptd``: ExecuTorch's own XOR example, made by the
  wheel's ``extension/training/examples/XOR/export_model.py`` as its ``main`` makes them;
* ``state.pt``: ``torch.save`` of ``{name: state_dict}``, each module's initial weights
  (frozen ones included), for the eager reference.

Everything is seeded; running the script twice gives the same files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from training_models import example_inputs, export_training, make_module  # noqa: E402

DEFAULT_OUT = ROOT / "tests" / "fixtures" / "training"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for name in ("mlp", "cnn", "lora"):
        module = make_module(name)
        state[name] = {k: v.clone() for k, v in module.state_dict().items()}
        pte, _ = export_training(module, example_inputs(name))
        (out / f"{name}.pte").write_bytes(pte)
    pte, ptd = export_training(make_module("mlp"), example_inputs("mlp"), external=True)
    assert ptd is not None
    (out / "mlp_ext.pte").write_bytes(pte)
    (out / "mlp_ext.ptd").write_bytes(ptd)
    torch.save(state, out / "state.pt")

    from executorch.extension.training.examples.XOR.export_model import _export_model

    for external in (False, True):
        torch.manual_seed(0)  # as the example's main()
        ep = _export_model(external)
        (out / ("xor_ext.pte" if external else "xor.pte")).write_bytes(bytes(ep.buffer))
        if external:
            (blob,) = ep._tensor_data.values()
            (out / "xor.ptd").write_bytes(bytes(blob))
    print(f"wrote {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    main()
