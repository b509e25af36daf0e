#!/usr/bin/env python3
"""Make the Vulkan-delegated test fixtures with ExecuTorch's real exporter.

Usage:
    python scripts/make_vulkan_fixtures.py [--out tests/fixtures/vulkan] [--only NAME ...]

Every fixture is a module of scripts/make_fixtures.py (the same modules, input shapes
and seeds as the XNNPACK fixtures of the same name) lowered with
``to_edge_transform_and_lower(..., partitioner=[VulkanPartitioner()])``, in one recipe:

  fp32              float32 graph
  int8_weight       PT2E with VulkanQuantizer's symmetric config: int8 per-channel
                    weights of the linears (``_weight_int8pack_mm`` in the payload)

For every fixture NAME this writes ``NAME.pte``, ``NAME.io.pt``
(``torch.save({"calls": [{"inputs", "eager"}, ...]})``: each call's inputs and what the
eager module (the quantized module, for int8_weight) returns), and ``manifest.json``:
per fixture its recipe, description, tolerance against eager (rtol, atol), and the op
names of each Vulkan delegate read with ExecuTorch's own deserializer (``flatc`` and the
wheel's ``schema.fbs``: an independent reading of the payload). ExecuTorch's runtime
cannot run these programs (the wheel has no Vulkan backend): eager is the reference.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "vulkan"
sys.path.insert(0, str(ROOT / "scripts"))

from make_fixtures import CNN, MLP, Block  # noqa: E402


@dataclass
class Spec:
    name: str
    recipe: str
    make: Callable[[], nn.Module]
    shape: tuple[int, ...]
    calls: int
    description: str
    tol: tuple[float, float]


SPECS = [
    Spec("mlp", "fp32", MLP, (2, 8), 3, "two linears with a relu", (1e-5, 1e-6)),
    Spec(
        "cnn",
        "fp32",
        CNN,
        (2, 3, 16, 16),
        1,
        "conv, batch norm, relu, max pool, global avg pool, linear",
        (1e-4, 1e-5),
    ),
    Spec("transformer", "fp32", Block, (2, 6, 16), 1, "pre-norm transformer block", (1e-4, 1e-5)),
    Spec("mlp_int8_weight", "int8_weight", MLP, (2, 8), 2, "int8-weight linears", (1e-4, 1e-5)),
]


def seed_for(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _quantize(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> nn.Module:
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import (
        VulkanQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = VulkanQuantizer()
    quantizer.set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
    prepared(*inputs)
    return convert_pt2e(prepared)


def _ops_by_flatc(buffer: bytes) -> list[dict[str, int]]:
    """Each Vulkan delegate's op names and counts, decoded by ``flatc`` with the wheel's
    ``schema.fbs`` (ExecuTorch's own reading; its JSON may hold bare ``inf``/``nan``
    doubles, which are read as numbers here)."""
    import importlib.resources
    import re
    import tempfile

    import executorch.backends.vulkan.serialization as vk_serialization
    from executorch.backends.vulkan.serialization.vulkan_graph_serialize import (
        extract_vk_flatbuffer,
    )
    from executorch.exir._serialize._flatbuffer import _flatc_decompile
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(buffer)
    program = getattr(pte, "program", pte)
    out = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            if d.id != "VulkanBackend":
                continue
            data = program.backend_delegate_data[d.processed.index].data
            with tempfile.TemporaryDirectory() as tmp:
                schema = Path(tmp) / "schema.fbs"
                schema.write_bytes(importlib.resources.read_binary(vk_serialization, "schema.fbs"))
                (Path(tmp) / "schema.bin").write_bytes(extract_vk_flatbuffer(data))
                _flatc_decompile(tmp, str(schema), str(Path(tmp) / "schema.bin"), ["--raw-binary"])
                text = (Path(tmp) / "schema.json").read_text()
            text = re.sub(r"(?<=[:\[,\s])-?(inf|nan)\b", "0", text)
            graph = json.loads(text)
            out.append(dict(sorted(Counter(c["name"] for c in graph["chain"]).items())))
    return out


def make(spec: Spec, out: Path) -> dict[str, Any]:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(seed_for(spec.name.removesuffix("_int8_weight")))
    model = spec.make().eval()
    calls = [(torch.randn(spec.shape),) for _ in range(spec.calls)]
    if spec.recipe == "int8_weight":
        model = _quantize(model, calls[0])
    with torch.no_grad():
        eager = [model(*inputs) for inputs in calls]
    exported = torch.export.export(model, calls[0])
    program = to_edge_transform_and_lower(exported, partitioner=[VulkanPartitioner()])
    buffer = program.to_executorch().buffer
    (out / f"{spec.name}.pte").write_bytes(buffer)
    torch.save(
        {"calls": [{"inputs": list(i), "eager": [e]} for i, e in zip(calls, eager, strict=True)]},
        out / f"{spec.name}.io.pt",
    )
    delegates = _ops_by_flatc(buffer)
    if not delegates:
        raise SystemExit(f"{spec.name}: nothing was lowered to Vulkan")
    return {
        "pte": f"{spec.name}.pte",
        "recipe": spec.recipe,
        "description": spec.description,
        "tol_eager": list(spec.tol),
        "delegates": delegates,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for spec in SPECS:
        if args.only and spec.name not in args.only:
            continue
        print(f"{spec.name} ...", flush=True)
        manifest[spec.name] = make(spec, args.out)
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
