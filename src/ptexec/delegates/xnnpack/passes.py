"""Passes over the node list before code is generated: Clamps fused into their producers,
regions of int8 elementwise nodes that become one table lookup."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from types import MappingProxyType

from . import schema as s
from .node_types import APPLIES_OUTPUT_BOUNDS, ELEMENTWISE
from .values import Carried

__all__ = ["fuse_clamps", "lookup_table_regions"]


def fuse_clamps(g: s.XnnGraph) -> list[s.XnnNode]:
    """The graph's nodes with each Clamp folded into the node that produces its input
    when nothing else reads that value and both values are carried alike (as XNNPACK's
    own subgraph optimizer fuses them): the producer writes the Clamp's output, bounded
    by both. One node less to run, and for int8 values the bounds join the
    requantization."""
    readers: dict[int, int] = {}
    for n in g.nodes:
        for vid in n.inputs:
            readers[vid] = readers.get(vid, 0) + 1
    producer = {vid: i for i, n in enumerate(g.nodes) for vid in n.outputs}
    nodes: list[s.XnnNode | None] = list(g.nodes)
    for i, c in enumerate(g.nodes):
        if c.type != "Clamp" or c.flags or len(c.inputs) != 1:
            continue
        src, dst = c.inputs[0], c.outputs[0]
        j = producer.get(src, i)
        p = nodes[j] if j < i else None
        vs, vd = g.by_id[src], g.by_id[dst]
        if (
            p is None
            or p.type not in APPLIES_OUTPUT_BOUNDS
            or len(p.outputs) != 1
            or readers.get(src) != 1
            or vs.is_output
            or (vs.datatype, vs.quant) != (vd.datatype, vd.quant)
        ):
            continue
        attrs = dict(p.attrs)
        attrs["output_id"] = dst
        nodes[j] = dataclasses.replace(
            p,
            attrs=MappingProxyType(attrs),
            outputs=(dst,),
            output_min=max(p.output_min, c.output_min),
            output_max=min(p.output_max, c.output_max),
        )
        nodes[i] = None
    return [n for n in nodes if n is not None]


def lookup_table_regions(
    g: s.XnnGraph, nodes: Sequence[s.XnnNode], rep: Callable[[int], Carried]
) -> dict[int, tuple[int, int, list[s.XnnNode]] | None]:
    """Regions of elementwise nodes whose every non-constant input derives from one
    int8 value (the root; constants must be scalars) and whose one result read elsewhere
    is int8, with two nodes or more. Returns node position -> the region (root, result,
    nodes) at its last node, None at its other nodes."""
    root_of: dict[int, int] = {}  # value -> the int8 value it derives from
    members: dict[int, list[int]] = {}  # root -> node positions
    for i, n in enumerate(nodes):
        if n.type not in ELEMENTWISE or len(n.outputs) != 1:
            continue
        roots = set()
        ok = True
        for vid in n.inputs:
            v = g.by_id[vid]
            if v.is_constant:
                ok = ok and v.numel <= 1
            elif vid in root_of:
                roots.add(root_of[vid])
            elif rep(vid).is_qs8:
                roots.add(vid)
            else:
                ok = False
        out = g.by_id[n.outputs[0]]
        if not ok or len(roots) != 1 or out.dtype_name == "qdint8":
            continue
        root = roots.pop()
        root_of[n.outputs[0]] = root
        members.setdefault(root, []).append(i)
    readers: dict[int, set[int]] = {}
    for i, n in enumerate(nodes):
        for vid in n.inputs:
            readers.setdefault(vid, set()).add(i)
    regions: dict[int, tuple[int, int, list[s.XnnNode]] | None] = {}
    for root, pos in members.items():
        if len(pos) < 2:
            continue
        inside = set(pos)
        made = {nodes[i].outputs[0] for i in pos}
        exits = [v for v in made if g.by_id[v].is_output or not readers.get(v, set()) <= inside]
        last = max(pos)
        if len(exits) != 1 or exits[0] != nodes[last].outputs[0] or not rep(exits[0]).is_qs8:
            continue
        for i in pos:
            regions[i] = None
        regions[last] = (root, exits[0], [nodes[i] for i in sorted(pos)])
    return regions
