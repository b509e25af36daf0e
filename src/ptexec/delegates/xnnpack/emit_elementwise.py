"""Emitters of elementwise nodes: the unary and binary templates, Clamp, LeakyReLU, ELU,
PReLU; int8 additions, subtractions and products with XNNPACK's integer arithmetic,
int8 unary functions as XNNPACK's 256-entry tables."""

from __future__ import annotations

from typing import Any

import torch

from ...errors import BackendUnavailableError
from . import quant as qa
from . import schema as s
from .emitter import GraphEmitter, NodeEmitter
from .node_types import BINARY, UNARY

__all__ = ["EMITTERS"]


def binary(g: GraphEmitter, n: s.XnnNode) -> None:
    t = n.type
    if t in ("Add", "Subtract", "Multiply") and _int8_binary(g, n):
        return
    dt = g.compute_dtype(n)
    a, b = g.as_float(n.inputs[0], dt), g.as_float(n.inputs[1], dt)
    g.write_float(n, BINARY[t].format(a=a, b=b), fresh=True)


def unary(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, 0)
    if _int8_table(g, n):
        return
    dt = g.compute_dtype(n)
    g.write_float(n, UNARY[n.type].format(x=g.as_float(n.inputs[0], dt)), fresh=True)


def _int8_binary(g: GraphEmitter, n: s.XnnNode) -> bool:
    """Add, subtract and multiply on int8 values, as XNNPACK's integer kernels."""
    a, b, o = n.inputs[0], n.inputs[1], n.outputs[0]
    if not g.all_qs8((a, b, o)):
        return False
    ra, rb, ro = g.carried(a), g.carried(b), g.carried(o)
    lo, hi = g.node_qbounds(n)
    xa, xb = g.as_carried(a), g.as_carried(b)
    if n.type == "Multiply":
        scale = qa.mul_scale(ra.scale, rb.scale, ro.scale)
        g.write_bounded(n, f"_qmul({xa}, {xb}, {scale!r}, {lo}, {hi})")
        return True
    try:
        p = qa.add_params(ra.scale, rb.scale, ro.scale, -1 if n.type == "Subtract" else 1)
    except ValueError as e:
        raise BackendUnavailableError(f"XNNPACK {n.type} node {n.index}: {e}") from None
    g.write_bounded(
        n, f"_qadd({xa}, {xb}, {p.a_mult}, {p.b_mult}, {p.rounding}, {p.shift}, {lo}, {hi})"
    )
    return True


def _int8_table(g: GraphEmitter, n: s.XnnNode, fn: Any = None) -> bool:
    """A unary function on int8 values: XNNPACK's 256-entry table of the function of
    the dequantized inputs, quantized."""
    src, o = n.inputs[0], n.outputs[0]
    if not g.all_qs8((src, o)) or g.value(src).is_constant:
        return False
    ri, ro = g.carried(src), g.carried(o)
    table = qa.unary_table(n.type, ri.scale, ri.zp, ro.scale, ro.zp, fn=fn)
    if table is None:
        return False
    lo, hi = g.node_qbounds(n)
    table = table.clamp_(lo, hi).to(g.device)
    name = g.bind(table, "lut")
    g.write_bounded(n, f"_lut({g.as_carried(src)}, {name}, {float(ri.zp + 128)!r})")
    return True


def clamp(g: GraphEmitter, n: s.XnnNode) -> None:
    src, o = n.inputs[0], n.outputs[0]
    if g.carried(o).kind == "q" and not g.same_q(src, o):
        lo, hi = n.output_min, n.output_max
        if _int8_table(g, n, fn=lambda x: x.clamp(lo, hi)):
            return
    g.alias(n, lambda e: e)


def leaky_relu(g: GraphEmitter, n: s.XnnNode) -> None:
    g.write_float(
        n, f"F.leaky_relu({g.as_float(n.inputs[0])}, {n['negative_slope']!r})", fresh=True
    )


def elu(g: GraphEmitter, n: s.XnnNode) -> None:
    alpha = float(n["alpha"])
    if _int8_table(g, n, fn=lambda x: torch.where(x < 0, torch.expm1(x) * alpha, x)):
        return
    g.write_float(n, f"F.elu({g.as_float(n.inputs[0])}, {alpha!r})", fresh=True)


def prelu(g: GraphEmitter, n: s.XnnNode) -> None:
    dt = g.compute_dtype(n)
    x, w = g.as_float(n.inputs[0], dt), g.as_float(n.inputs[1], dt)
    g.write_float(n, f"torch.where({x} >= 0, {x}, {x} * {w})", fresh=True)


EMITTERS: dict[str, NodeEmitter] = {
    **dict.fromkeys(BINARY, binary),
    **dict.fromkeys(UNARY, unary),
    "Clamp": clamp,
    "LeakyReLU": leaky_relu,
    "ELU": elu,
    "PReLU": prelu,
}
