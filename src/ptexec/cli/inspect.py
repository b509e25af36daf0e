"""``ptexec inspect`` (methods, values, delegates) and ``ptexec plan`` (the memory plan)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from .common import device_map_of, json_text, load_program, size_text
from .compile import compiled_report, print_compiled


def _value_line(i: int, info: Any, value: Any = None) -> str:
    """One input or output of a method: ``info`` its description, ``value`` the plan's
    value (a constant is the program's data, though ExecuTorch counts it memory-planned)."""
    from ..format import program as p
    from ..loader import ScalarInfo

    if isinstance(info, ScalarInfo):
        return f"    {i}: {info.kind} (traced value {info.value!r})"
    dims = ", ".join(str(s) for s in info.sizes)
    dyn = "" if info.dynamism == "static" else f", {info.dynamism.replace('_', ' ')}"
    if isinstance(value, p.Tensor) and value.is_constant:
        planned = "constant (the program's data)"
    else:
        planned = "planned" if info.is_memory_planned else "unplanned (caller's memory)"
    return (
        f"    {i}: {str(info.dtype).removeprefix('torch.')}[{dims}] {info.layout} "
        f"on {info.device}, {planned}{dyn}"
    )


def method_report(prog: Any, name: str, device_map: Any) -> dict[str, Any]:
    from ..format import program as p
    from ..loader import DeviceMap

    meta = prog.method_meta(name, device_map=device_map)
    plan = next(pl for pl in prog.pte.program.execution_plan if pl.name == name)
    ops: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for chain in plan.chains:
        for ins in chain.instructions:
            kinds[type(ins).__name__] += 1
            if isinstance(ins, p.KernelCall):
                ops[plan.operators[ins.op_index].qualified_name] += 1
    # where each tensor is once loaded: its label, mapped as the inputs' and buffers' are
    dmap = DeviceMap(device_map)
    devices: Counter[str] = Counter()
    for value in plan.values:
        if isinstance(value, p.Tensor):
            devices[str(dmap.label(value))] += 1
    delegates = []
    for d in plan.delegates:
        entry: dict[str, Any] = {
            "id": d.id,
            "compile_specs": {s.key: _spec_text(s.value) for s in d.compile_specs},
        }
        nodes = _delegate_nodes(prog, d)
        if nodes is not None:
            entry["nodes"] = nodes
        entry.update(_delegate_coverage(prog, d))
        delegates.append(entry)
    return {
        "meta": meta,
        "operators": ops,
        "instructions": kinds,
        "tensor_devices": devices,
        "delegates": delegates,
    }


def _spec_text(value: bytes) -> str:
    try:
        text = value.decode("utf-8")
        if text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return value.hex() if len(value) <= 16 else f"{len(value)} bytes"


def _delegate_nodes(prog: Any, delegate: Any) -> dict[str, int] | None:
    """Node types and counts of a delegate payload, when its backend can describe it."""
    from ..delegates import describe_payload

    try:
        return describe_payload(delegate.id, prog.pte.delegate_data(delegate.processed))
    except Exception:  # a payload the describer cannot read: inspect still reports the rest
        return None


def _delegate_coverage(prog: Any, delegate: Any) -> dict[str, Any]:
    """What runs a delegate (``runner``) and what of its payload ptexec does not run
    (``not_run``: [] for all of it runs; absent when the backend cannot tell)."""
    from ..delegates import backend_runner, payload_gaps

    out: dict[str, Any] = {"runner": backend_runner(delegate.id)}
    try:
        gaps = payload_gaps(delegate.id, prog.pte.delegate_data(delegate.processed))
    except Exception as e:  # a payload the checker cannot read: loading it will say more
        gaps = [f"the payload does not decode ({type(e).__name__})"]
    if gaps is not None:
        out["not_run"] = gaps
    return out


def _coverage_line(d: dict[str, Any]) -> str:
    if d["runner"] is None:
        return "not run: ptexec has no backend of this id"
    gaps = d.get("not_run")
    if gaps is None:
        what = "whether all of it runs shows at load"
    elif gaps:
        what = "does not run: " + "; ".join(gaps)
    elif "nodes" in d:
        what = f"runs all of it ({len(d['nodes'])} node/op types)"
    else:
        what = "runs all of it"
    return f"run by {d['runner']}; {what}"


def cmd_inspect(args: argparse.Namespace) -> int:
    prog = load_program(args)
    pte = prog.pte
    device_map = device_map_of(args)
    names = [args.method] if args.method else list(prog.method_names)
    reports = {name: method_report(prog, name, device_map) for name in names}
    if args.json:
        report = json_report(prog, reports)
        if args.values:
            for name in names:
                report["methods"][name]["values"] = _values(prog, name, device_map)
        if args.compile:
            for name in names:
                compiled = compiled_report(prog, name, device_map)
                report["methods"][name]["compile"] = dataclasses.asdict(compiled)
        if args.code:
            for name in names:
                report["methods"][name]["code"] = method_code(prog, name, device_map, args.compile)
        print(json_text(report, indent=2))
        return 0
    header = "extended header, " if pte.header is not None else ""
    print(
        f"{args.file}: ExecuTorch program, {size_text(len(pte.data))}, {header}"
        f"{len(pte.segments)} segment(s), {len(prog.method_names)} method(s)"
    )
    if prog.ptd is not None:
        files = ", ".join(str(q) for q in prog.paths[1:] if q is not None) or args.data
        print(f"  external data: {files} ({len(prog.ptd.entries)} tensors)")
    for name, rep in reports.items():
        meta = rep["meta"]
        plan = next(pl for pl in pte.program.execution_plan if pl.name == name)
        print(f"\nmethod '{name}': {meta.num_instructions} instructions")
        print("  inputs:")
        for i, info in enumerate(meta.inputs):
            print(_value_line(i, info, plan.values[plan.inputs[i]]))
        print("  outputs:")
        for i, info in enumerate(meta.outputs):
            print(_value_line(i, info, plan.values[plan.outputs[i]]))
        print(f"  memory plan: {size_text(meta.planned_bytes)}")
        for b in meta.buffers:
            print(f"    {b}")
        print(
            "  tensors by device: "
            + ", ".join(f"{d}: {n}" for d, n in sorted(rep["tensor_devices"].items()))
        )
        if args.values:
            _print_values(prog, name, device_map)
        kinds = rep["instructions"]
        print("  instructions: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
        print(f"  operators ({len(rep['operators'])}):")
        for op, n in rep["operators"].most_common():
            print(f"    {n:5d}  {op}")
        if rep["delegates"]:
            print("  delegates:")
            for d in rep["delegates"]:
                specs = ", ".join(f"{k}={v}" for k, v in d["compile_specs"].items())
                print(f"    {d['id']}" + (f" ({specs})" if specs else ""))
                print(f"      {_coverage_line(d)}")
                for node, n in sorted(d.get("nodes", {}).items(), key=lambda kv: -kv[1]):
                    print(f"      {n:5d}  {node}")
        if args.compile:
            print_compiled(prog, name, device_map)
        if args.code:
            print("  generated code:\n")
            print(method_code(prog, name, device_map, args.compile))
    return 0


def method_code(prog: Any, name: str, device_map: Any, compiled: bool) -> str:
    """The generated Python method ``name`` runs (:meth:`ptexec.Method.source`), loaded
    compiled (from the cache, or compiling it) when ``compiled``."""
    from ..compile import CompileOptions

    options = CompileOptions(progress=False) if compiled else False
    return str(prog.load_method(name, device_map=device_map, compile=options).source())


def _values(prog: Any, name: str, device_map: Any) -> list[dict[str, Any]]:
    """Every tensor value of a method: its type, layout, device (its label under
    ``device_map``, where loading puts it) and where its memory comes from."""
    from ..format import program as p
    from ..format.scalar_type import scalar_type_name
    from ..loader import DeviceMap
    from ..tensor import layout_name

    plan = next(pl for pl in prog.pte.program.execution_plan if pl.name == name)
    inputs = {slot: i for i, slot in enumerate(plan.inputs)}
    outputs = {slot: i for i, slot in enumerate(plan.outputs)}
    dmap = DeviceMap(device_map)
    rows = []
    for j, t in enumerate(plan.values):
        if not isinstance(t, p.Tensor):
            continue
        alloc = t.allocation_info
        if alloc is not None:
            memory = "planned"
        elif t.is_external:
            memory = "external data"
        elif t.is_constant:
            memory = "constant"
        else:
            memory = "unplanned"
        roles = [f"input {inputs[j]}"] if j in inputs else []
        roles += [f"output {outputs[j]}"] if j in outputs else []
        rows.append(
            {
                "value": j,
                "dtype": scalar_type_name(t.scalar_type),
                "sizes": list(t.sizes),
                "layout": layout_name(t.dim_order),
                "dynamism": p.DYNAMISM_NAMES[t.shape_dynamism]
                if t.shape_dynamism != p.STATIC
                else "static",
                "device": str(dmap.label(t)),
                "memory": memory,
                "buffer": alloc.memory_id if alloc is not None else None,
                "offset": alloc.memory_offset if alloc is not None else None,
                "roles": roles,
            }
        )
    return rows


def _print_values(prog: Any, name: str, device_map: Any) -> None:
    """:func:`_values`, a line each."""
    print("  tensors:")
    for v in _values(prog, name, device_map):
        dims = ", ".join(str(s) for s in v["sizes"])
        dyn = "" if v["dynamism"] == "static" else f" {v['dynamism']}"
        where = (
            f"buffer {v['buffer']} at {v['offset']}" if v["memory"] == "planned" else v["memory"]
        )
        roles = f" ({', '.join(v['roles'])})" if v["roles"] else ""
        print(
            f"    v{v['value']:<5} {v['dtype']}[{dims}] {v['layout']}{dyn}"
            f" on {v['device']}, {where}{roles}"
        )


def json_report(prog: Any, reports: dict[str, Any]) -> dict[str, Any]:
    from ..loader import ScalarInfo

    def value(info: Any) -> dict[str, Any]:
        if isinstance(info, ScalarInfo):
            return {"kind": info.kind, "value": info.value}
        return {
            "kind": "tensor",
            "dtype": str(info.dtype).removeprefix("torch."),
            "sizes": list(info.sizes),
            "dim_order": list(info.dim_order) if info.dim_order is not None else None,
            "device": str(info.device),
            "is_memory_planned": info.is_memory_planned,
            "dynamism": info.dynamism,
            "nbytes": info.nbytes,
        }

    methods = {}
    for name, rep in reports.items():
        meta = rep["meta"]
        methods[name] = {
            "inputs": [value(i) for i in meta.inputs],
            "outputs": [value(o) for o in meta.outputs],
            "buffers": [
                {
                    "index": b.index,
                    "size": b.size,
                    "device": str(b.device),
                    "device_source": b.device_source,
                    "shared": b.shared,
                }
                for b in meta.buffers
            ],
            "instructions": dict(rep["instructions"]),
            "operators": dict(rep["operators"]),
            "tensor_devices": dict(rep["tensor_devices"]),
            "delegates": rep["delegates"],
        }
    return {"methods": methods, "segments": len(prog.pte.segments), "size": len(prog.pte.data)}


def cmd_plan(args: argparse.Namespace) -> int:
    from ..plan import memory_plan

    prog = load_program(args)
    names = [args.method] if args.method else list(prog.method_names)
    plans = [memory_plan(prog, name, device_map=device_map_of(args)) for name in names]
    if args.json:
        print(json_text([mp.to_dict(top=args.top) for mp in plans], indent=1))
    else:
        for k, mp in enumerate(plans):
            if k:
                print()
            print(mp.summary(top=10 if args.top is None else args.top))
    if args.out:
        out = Path(args.out)
        for mp in plans:
            path = out if len(plans) == 1 else out.with_name(f"{out.stem}.{mp.method}{out.suffix}")
            try:
                mp.draw(path)
            except ImportError as e:
                print(f"ptexec: {e}", file=sys.stderr)
                return 1
            print(f"  picture saved to {path}", file=sys.stderr if args.json else sys.stdout)
    return 0
