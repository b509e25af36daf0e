#!/usr/bin/env python
"""Write XNNPACK programs whose delegate outputs contradict the program's declared outputs.

Each file is a fixture of tests/fixtures/xnnpack with one schema field changed (located by
the fuzzer's field map, ``scripts/fuzz_loader.py``), so that the graph computes an output
the program does not declare. Before ptexec checked delegate outputs, each of these ran
and returned the contradicting tensor. ``tests/fixtures/xnnpack_bad/manifest.json`` says
what each file changes and what ptexec must raise (checked by tests/test_delegate_outputs.py).

Usage::

    python scripts/make_bad_xnnpack_outputs.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests" / "fixtures" / "xnnpack"
OUT = ROOT / "tests" / "fixtures" / "xnnpack_bad"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "src"))

PAYLOAD = "execution_plan[0].delegates[0].payload"

# name -> (fixture, field path, new value, what it does, what ptexec must raise)
CASES: dict[str, tuple[str, str, int, str, dict[str, str]]] = {
    "cat_axis": (
        "op_cat",
        f"{PAYLOAD}.xnodes[0].concatenate2.axis",
        0,
        "cat of two [2, 3, 4, 5] tensors along axis 0 instead of 1: the graph computes "
        "[4, 3, 4, 5] (as many elements) where float32[2, 6, 4, 5] is declared",
        {
            "stage": "load",
            "error": "PteFormatError",
            "path": "forward.delegates[0].payload.xvalues[2]",
            "match": r"computes dims \[4, 3, 4, 5\] for external output 5; the program declares float32\[2, 6, 4, 5\]",
        },
    ),
    "pool_window": (
        "op_pools",
        f"{PAYLOAD}.xnodes[5].max_pooling2d.pooling_width",
        1,
        "a dilated 3x3 max pool made 3x1: its width stays 8 where the program declares "
        "float32[2, 3, 5, 4]",
        {
            "stage": "load",
            "error": "PteFormatError",
            "path": "forward.delegates[0].payload.xvalues[7]",
            "match": r"computes dims \[2, 3, 5, 8\] for external output 3; the program declares float32\[2, 3, 5, 4\]",
        },
    ),
    "output_dtype": (
        "op_abs",
        f"{PAYLOAD}.xvalues[1].tensor_value.datatype",
        2,
        "the graph's output value is fp16; the program's output tensor is float32",
        {
            "stage": "load",
            "error": "PteFormatError",
            "path": "forward.delegates[0].payload.xvalues[1].external_id",
            "match": r"a fp16 value bound to a float32\[2, 3, 8\] tensor",
        },
    ),
    "dynamic_bound": (
        "dynamic_mlp",
        "execution_plan[0].values[1].tensor.sizes[1]",
        3,
        "the dynamic output's bound shrinks from [16, 4] to [16, 3]; the graph still computes "
        "4 columns, known only when the call gives the batch size",
        {
            "stage": "call",
            "error": "ExecutionError",
            "match": r"delegate argument 1: the graph computed \[\d+, 4\], beyond the bound",
        },
    ),
}


def main() -> int:
    import fuzz_loader as fl

    manifest_in = json.loads((SRC / "manifest.json").read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, dict[str, object]] = {}
    for name, (fixture, path, value, what, expect) in CASES.items():
        data = (SRC / manifest_in[fixture]["pte"]).read_bytes()
        (field,) = [f for f in fl.field_map(data) if f.path == path]
        old = int.from_bytes(data[field.pos : field.pos + field.size], "little")
        raw = value.to_bytes(field.size, "little")
        mutated = fl.apply_edits(data, [("set", field.pos, raw.hex())])
        (OUT / f"{name}.pte").write_bytes(mutated)
        manifest[name] = {
            "fixture": fixture,
            "field": path,
            "was": old,
            "now": value,
            "description": what,
            "expect": expect,
        }
        print(f"{name}: {fixture} {path} {old} -> {value}")
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
