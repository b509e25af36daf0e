#!/usr/bin/env python3
"""Make the fixtures of the ExecuTorch-compatibility tests with ExecuTorch's real exporter.

Usage:
    python scripts/make_compat_fixtures.py [--out tests/fixtures/compat]

Writes, under the output directory:

* ``ops.pte`` / ``ops.etrecord``: a small portable program (linear, split into a tensor
  list, layer norm with its three outputs, mul, relu, add) and the ETRecord the exporter
  makes for it (``generate_etrecord=True``, representative inputs included), for
  ExecuTorch's Inspector;
* ``xnnpack.pte`` / ``xnnpack.etrecord``: the same module with its linear layers and the
  ops around them lowered to XNNPACK;
* ``bundled.bpte``: a two-method program (``forward``: x + y, ``forward2``: x + y + 1)
  bundled with test cases; ``forward``'s case 1 deliberately expects ``x + y + 0.5``, so
  verifying it must fail;
* ``compat.io.pt``: ``torch.save`` of ``{"ops": {"inputs", "outputs"}, "xnnpack": ...,
  "bundled": {"forward": [(inputs, expected), ...], "forward2": [...]}}`` with the eager
  PyTorch results.

Everything is seeded: running the script twice gives the same programs and inputs (the
ETRecords differ: ExecuTorch records graph ids taken from object addresses, and times).
Stack traces in the ETRecords name files relative to site-packages or this repository.
"""

from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import export

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "compat"


class Ops(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = torch.split(self.fc(x), 4, dim=1)
        return torch.layer_norm(a, [4]) * 2, torch.relu(self.fc2(b)) + 1


class Add(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class AddOne(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y + 1


_FILE = re.compile(r'File "([^"]*)"')


def _relative(path: str) -> str:
    """A source path without this machine's directories (site-packages/..., scripts/...)."""
    if "site-packages/" in path:
        return path[path.index("site-packages/") :]
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return Path(path).name


def _scrub(program: Any) -> None:
    """Stack traces in node metadata name files by relative paths only (they are committed)."""
    if program is None:
        return
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            trace = node.meta.get("stack_trace")
            if isinstance(trace, str):
                node.meta["stack_trace"] = _FILE.sub(
                    lambda m: f'File "{_relative(m.group(1))}"', trace
                )


def _etdump_program(out: Path, name: str, xnnpack: bool) -> dict[str, Any]:
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(7)
    model = Ops().eval()
    inputs = (torch.randn(3, 8),)
    partitioner: list[Any] = []
    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )

        partitioner = [XnnpackPartitioner()]
    with torch.no_grad():
        eager = list(model(*inputs))
        exported = export(model, inputs, strict=True)
        _scrub(exported)
        edge = to_edge_transform_and_lower(
            exported, partitioner=partitioner, generate_etrecord=True
        )
    program = edge.to_executorch()
    record = program.get_etrecord()
    record.update_representative_inputs([inputs])
    _scrub(record.exported_program)
    _scrub(record.edge_dialect_program)
    (out / f"{name}.pte").write_bytes(program.buffer)
    record.save(str(out / f"{name}.etrecord"))
    return {"inputs": list(inputs), "outputs": eager}


def _bundled(out: Path) -> dict[str, Any]:
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import (
        serialize_from_bundled_program_to_flatbuffer,
    )
    from executorch.exir import to_edge

    torch.manual_seed(11)
    xs = [(torch.randn(2, 3), torch.randn(2, 3)) for _ in range(3)]
    methods = {
        "forward": export(Add(), xs[0], strict=True),
        "forward2": export(AddOne(), xs[0], strict=True),
    }
    program = to_edge(methods).to_executorch()
    cases = {
        "forward": [(xs[0], [xs[0][0] + xs[0][1]]), (xs[1], [xs[1][0] + xs[1][1] + 0.5])],
        "forward2": [(x, [x[0] + x[1] + 1]) for x in xs],
    }
    suites = [
        MethodTestSuite(
            method_name=name,
            test_cases=[MethodTestCase(inputs=i, expected_outputs=o) for i, o in c],
        )
        for name, c in cases.items()
    ]
    data = serialize_from_bundled_program_to_flatbuffer(BundledProgram(program, suites))
    (out / "bundled.bpte").write_bytes(data)
    (out / "bundled.pte").write_bytes(program.buffer)
    return {name: [(list(i), o) for i, o in c] for name, c in cases.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    io = {
        "ops": _etdump_program(args.out, "ops", xnnpack=False),
        "xnnpack": _etdump_program(args.out, "xnnpack", xnnpack=True),
        "bundled": _bundled(args.out),
    }
    torch.save(io, args.out / "compat.io.pt")
    for path in sorted(args.out.iterdir()):
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
