"""The loader fuzzer (scripts/fuzz_loader.py) on Vulkan-delegated fixtures.

The seeds are tests/fixtures/vulkan, named ``vulkan-NAME``. Their field maps are the
harness's (the program's flatbuffer, headers and constant data) plus every field of each
Vulkan payload (:func:`vulkan_fields`): the ``VH00`` header, and every integer of the
``VkGraph`` flatbuffer (op argument ids, value kinds, tensor datatypes, dims, constant
ids, list items, input/output ids, constant offsets and lengths, the characters of op
names), in the harness's payload kinds (``x...``). Any case must load and run, or raise a
:class:`ptexec.PtexecError`; the bounded run's size is ``PTEXEC_FUZZ_EXAMPLES`` / 4.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ptexec
from ptexec.format import program as p
from ptexec.format.flatbuf import Buffer, Table

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "vulkan"
PREFIX = "vulkan-"


def _harness() -> Any:
    module = sys.modules.get("fuzz_loader")
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(
        "fuzz_loader", ROOT / "scripts" / "fuzz_loader.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_loader"] = module
    spec.loader.exec_module(module)
    return module


fl = _harness()

# VkGraph's tables: slot -> (name, kind); kinds: an int width, "str", ("vec", width),
# ("tables", table), ("union", {code: table})
_UNION = {
    1: "Null",
    2: "Int",
    3: "Double",
    4: "Bool",
    5: "VkTensor",
    6: "IntList",
    7: "DoubleList",
    8: "BoolList",
    9: "ValueList",
    10: "String",
    11: "SymInt",
}
SCHEMA: dict[str, list[tuple[int, str, Any]]] = {
    "VkGraph": [
        (0, "version", "str"),
        (1, "chain", ("tables", "OperatorCall")),
        (2, "values", ("tables", "VkValue")),
        (3, "input_ids", ("vec", 4)),
        (4, "output_ids", ("vec", 4)),
        (5, "constants", ("tables", "VkBytes")),
        (6, "shaders", ("tables", "VkBytes")),
        (7, "storage_type_override", 1),
        (8, "memory_layout_override", 1),
    ],
    "OperatorCall": [(0, "node_id", 4), (1, "name", "name"), (2, "args", ("vec", 4))],
    "VkValue": [(0, "value", ("union", _UNION))],
    "VkTensor": [
        (0, "datatype", 1),
        (1, "dims", ("vec", 4)),
        (2, "constant_id", 4),
        (3, "mem_obj_id", 4),
        (4, "storage_type", 1),
        (5, "memory_layout", 1),
        (6, "staging_datatype", 1),
    ],
    "Null": [],
    "Int": [(0, "int_val", 8)],
    "Double": [(0, "double_val", 8)],
    "Bool": [(0, "bool_val", 1)],
    "String": [(0, "string_val", "str")],
    "SymInt": [(0, "value", 4)],
    "IntList": [(0, "items", ("vec", 8))],
    "DoubleList": [(0, "items", ("vec", 8))],
    "BoolList": [(0, "items", ("vec", 1))],
    "ValueList": [(0, "items", ("vec", 4))],
    "VkBytes": [(0, "offset", 8), (1, "length", 8), (2, "named_key", "str")],
}


def _u32(buf: Buffer, pos: int) -> int:
    return int(struct.unpack_from("<I", buf.data, pos)[0])


def _walk(buf: Buffer, t: Table, name: str, base: int, path: str, out: list[Any]) -> None:
    field = fl.Field
    for slot, fname, kind in SCHEMA[name]:
        if isinstance(kind, tuple) and kind[0] == "union":
            tag_off = t.offsets[slot] if slot < len(t.offsets) else 0
            if not tag_off:
                continue
            code = t.buf.data[t.pos + tag_off]
            out.append(field(base + t.pos + tag_off, 1, "xtag", f"{path}.{fname}_type"))
            slot += 1
        off = t.offsets[slot] if slot < len(t.offsets) else 0
        if not off:
            continue
        pos = t.pos + off
        where = f"{path}.{fname}"
        if isinstance(kind, int):
            out.append(field(base + pos, kind, "xscalar", where))
            continue
        out.append(field(base + pos, 4, "xoffset", where))
        target = pos + _u32(buf, pos)
        if kind in ("str", "name"):
            out.append(field(base + target, 4, "xlen", f"{where}.length"))
            if kind == "name":  # a few characters of an op's name
                n = _u32(buf, target)
                for k in range(0, n, max(1, n // 4)):
                    out.append(field(base + target + 4 + k, 1, "xscalar", f"{where}[{k}]"))
            continue
        out.append(field(base + target, 4, "xlen", f"{where}.length"))
        n = _u32(buf, target)
        if kind[0] == "vec":
            for k in range(min(n, 64)):
                out.append(
                    field(base + target + 4 + k * kind[1], kind[1], "xitem", f"{where}[{k}]")
                )
        elif kind[0] == "tables":
            for k in range(min(n, 4096)):
                at = target + 4 + 4 * k
                sub = Table.at(buf, at + _u32(buf, at), "")
                _walk(buf, sub, kind[1], base, f"{where}[{k}]", out)
        else:
            table = kind[1].get(code)
            if table is not None:
                _walk(buf, Table.at(buf, target, ""), table, base, where, out)


def vulkan_fields(pte: bytes) -> list[Any]:
    """Every field of every Vulkan payload of a program, at its position in the file."""
    prog = ptexec.load(pte)
    out: list[Any] = []
    program = prog.pte.program
    for i, plan in enumerate(program.execution_plan):
        for j, d in enumerate(plan.delegates):
            if d.id != "VulkanBackend":
                continue
            ref = d.processed
            if ref.location == p.DATA_INLINE:
                start = program.backend_delegate_data[ref.index].offset
            else:
                start = prog.pte.segments[ref.index].offset
            view = prog.pte.delegate_data(ref)
            path = f"execution_plan[{i}].delegates[{j}].payload"
            fb_off = 0
            if bytes(view[4:8]) == b"VH00":
                for at, width, name in (
                    (8, 2, "length"),
                    (10, 4, "flatbuffer_offset"),
                    (14, 4, "flatbuffer_size"),
                    (18, 4, "bytes_offset"),
                    (22, 8, "bytes_size"),
                ):
                    out.append(fl.Field(start + at, width, "xheader", f"{path}.header.{name}"))
                fb_off, fb_size = struct.unpack_from("<II", view, 10)
                view = view[fb_off : fb_off + fb_size]
            out.append(fl.Field(start + fb_off, 4, "xoffset", f"{path}.root offset"))
            buf = Buffer(view)
            _walk(buf, buf.root(path), "VkGraph", start + fb_off, path, out)
    return out


def load_seeds() -> dict[str, Any]:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    seeds: dict[str, Any] = {}
    for base in sorted(manifest):
        pte = (FIXTURES / manifest[base]["pte"]).read_bytes()
        calls = torch.load(FIXTURES / f"{base}.io.pt", weights_only=True)["calls"]
        fields = fl.field_map(pte, "pte") + vulkan_fields(pte)
        seeds[PREFIX + base] = fl.Seed(
            PREFIX + base,
            pte,
            None,
            ("forward",),
            {"forward": list(calls[0]["inputs"])},
            fl.Mutator(pte, fields),
            None,
        )
    return seeds


SEEDS = load_seeds()
METER = fl.PeakMeter()
EXAMPLES = max(1, int(os.environ.get("PTEXEC_FUZZ_EXAMPLES", "600")) // 4)


def _check(outcome: Any) -> None:
    assert not outcome.is_finding, f"{outcome.status} at {outcome.stage}: {outcome.detail}"


def test_payload_fields_are_found() -> None:
    """The walk reaches op arguments, tensor dims, value kinds and the header."""
    paths = [f.path for f in SEEDS[PREFIX + "cnn"].pte_mutator.by_kind.get("xitem", [])]
    assert any(".chain[" in x and ".args[" in x for x in paths)
    assert any(".dims[" in x for x in paths)
    kinds = SEEDS[PREFIX + "cnn"].pte_mutator.by_kind
    assert kinds.get("xtag") and kinds.get("xheader")


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_unmutated_seed_runs(name: str) -> None:
    seed = SEEDS[name]
    outcome = fl.guarded(seed.pte, None, seed.inputs, METER)
    assert outcome.status == "ok", outcome.detail


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(name=st.sampled_from(sorted(SEEDS)), rng=st.randoms(use_true_random=False))
def test_fuzz_vulkan_bounded(name: str, rng: Any) -> None:
    case = fl.draw_case({name: SEEDS[name]}, rng)
    pte, ptd = case.files(SEEDS)
    _check(fl.guarded(pte, ptd, SEEDS[name].inputs, METER))
