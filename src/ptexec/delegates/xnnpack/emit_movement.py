"""Emitters of nodes that move or convert data: transposes, reshapes, slices, constant
pads, bilinear resizes, concatenations, copies, and Convert (between float types, to
and between int8 types, to per-token quantized values)."""

from __future__ import annotations

import torch

from ...errors import BackendUnavailableError
from . import quant as qa
from . import schema as s
from .emitter import GraphEmitter, NodeEmitter
from .values import Carried, dtype_expr

__all__ = ["EMITTERS"]


def static_transpose(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, 0)
    perm = tuple(n["perm"])
    rank = len(g.dims(n.inputs[0]))
    if sorted(perm) != list(range(rank)) or n["num_dims"] != rank:
        raise g.fail(n, f"perm {list(perm)} is not a permutation of {rank} dims")
    src = g.expr.get(n.inputs[0])
    g.alias(n, lambda e: f"{e}.permute({perm})")
    if perm == (0, 2, 3, 1) and rank == 4 and src not in g.nchw_memory:
        # into XNNPACK's NHWC: a view of NCHW memory, copied to channels-last memory
        # where a node wants it (oneDNN convolutions and pools), once
        g.mark_nchw_memory(n.outputs[0])


def static_reshape(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, 0)
    shape = tuple(d if d != 0 else -1 for d in n["new_shape"])
    if n["num_dims"] != len(shape) or shape.count(-1) > 1 or len(shape) > s.MAX_DIMS:
        raise g.fail(n, f"new shape {list(n['new_shape'])} (num_dims {n['num_dims']})")
    out_dims = g.value(n.outputs[0]).dims
    if len(out_dims) != len(shape):
        raise g.fail(
            n,
            f"new shape {list(n['new_shape'])} does not match the output dims {list(out_dims)}",
        )
    g.alias(n, lambda e: f"{e}.reshape({shape})")


def static_slice(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, 0)
    offsets, sizes = n["offsets"], n["sizes"]
    rank = len(g.dims(n.inputs[0]))
    if len(offsets) != rank or len(sizes) != rank or n["num_dims"] != rank:
        raise g.fail(n, f"offsets {list(offsets)} and sizes {list(sizes)} for {rank} dims")
    parts = []
    for o, z in zip(offsets, sizes, strict=True):
        end = o + z
        parts.append(f"{o}:{end}" if end > 0 else f"{o}:")
    g.alias(n, lambda e: f"{e}[{', '.join(parts)}]")


def static_constant_pad(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, 0)
    pre, post = n["pre_paddings"], n["post_paddings"]
    in_dims = g.dims(n.inputs[0])
    rank = len(in_dims)
    if len(pre) != rank or len(post) != rank:
        raise g.fail(n, f"paddings {list(pre)}, {list(post)} for {rank} dims")
    g.expect_dims(n, {d: in_dims[d] + pre[d] + post[d] for d in range(rank)})
    pads: list[int] = []
    for d in reversed(range(rank)):
        pads += [pre[d], post[d]]
    value = float(n["padding_value"])
    src, o = n.inputs[0], n.outputs[0]
    r = g.carried(o)
    if r.kind == "q":  # the padding value, as XNNPACK stores it: quantized
        q = qa.quantize_bound(value, r.scale, r.zp, r.qmin, r.qmax)
        if g.same_q(src, o):
            code = f"F.pad({g.as_carried(src)}, {tuple(pads)}, value={float(q - r.zp)!r})"
            g.write_carried(n, code, fresh=True)
            return
        value = (q - r.zp) * r.scale
    g.write_float(n, f"F.pad({g.as_float(src)}, {tuple(pads)}, value={value!r})", fresh=True)


def static_resize_bilinear2d(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, s.FLAG_ALIGN_CORNERS)
    g.rank(n, n.inputs[0], 4)
    size = (n["new_height"], n["new_width"])
    if size[0] < 1 or size[1] < 1:
        raise g.fail(n, f"new size {size}")
    g.expect_dims(n, {1: size[0], 2: size[1]})
    ac = bool(n.flags & s.FLAG_ALIGN_CORNERS)
    x = g.as_float(n.inputs[0])
    g.write_float(
        n,
        f"F.interpolate({x}.permute(0, 3, 1, 2), size={size}, mode='bilinear', align_corners={ac}).permute(0, 2, 3, 1)",
        fresh=True,
    )


def _concatenate(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, 0)
    rank = len(g.dims(n.inputs[0]))
    axis = n["axis"]
    if axis >= rank:
        raise g.fail(n, f"axis {axis} for {rank} dims")
    for vid in n.inputs:
        if len(g.dims(vid)) != rank:
            raise g.fail(n, "inputs of different ranks")
    if all(g.same_q(v, n.outputs[0]) for v in n.inputs):
        parts = ", ".join(g.as_carried(v) for v in n.inputs)
        g.write_carried(n, f"torch.cat(({parts}), {axis})", fresh=True)
        return
    dt = g.compute_dtype(n)
    parts = ", ".join(g.as_float(v, dt) for v in n.inputs)
    g.write_float(n, f"torch.cat(({parts}), {axis})", fresh=True)


def copy(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, 0)
    g.alias(n, lambda e: e)


def convert(g: GraphEmitter, n: s.XnnNode) -> None:
    src, dst = g.value(n.inputs[0]), g.value(n.outputs[0])
    g.shapes[dst.id] = g.dims(src.id)
    ri = g.carried(src.id)
    out = dst.dtype_name
    if out == "qdint8":
        q = dst.quant
        if not isinstance(q, s.PerTokenDynamicQuant):
            raise g.fail(n, "a qdint8 output without per-token parameters")
        if ri.kind != "float":
            raise BackendUnavailableError(
                f"XNNPACK Convert from {src.dtype_name} to qdint8 is not supported"
            )
        g.carried_as[dst.id] = Carried("qd", ri.dtype)
        # quantized where it is first needed, once per source: a linear with int8
        # weights or a convolution reads the integers and never the float values
        g.pending_qd[dst.id] = (g.as_float(src.id), q.num_nonbatch_dims)
        return
    ro = g.carried(dst.id)
    if ro.kind == "q" and ri.kind == "q":
        if g.same_q(src.id, dst.id):
            g.write_carried(n, g.as_carried(src.id), fresh=False)
            return
        if g.all_qs8((src.id, dst.id)):
            mult, _ = qa.requantize_params(ri.scale, ri.zp, ro.scale, ro.zp)
            lo, hi = g.node_qbounds(n)
            g.write_bounded(n, f"_qcvt({g.as_carried(src.id)}, {mult}, {lo}, {hi})")
            return
    if ro.kind == "q":
        x = g.as_float(src.id)
        code = x if ri.dtype == torch.float32 else f"{x}.to(torch.float32)"
        g.write_float(n, code, fresh=False)
        return
    if ro.kind == "float" and ri.kind in ("float", "q", "qd"):
        x = g.as_float(src.id)
        dt = g.carried(src.id).dtype
        code = x if dt == ro.dtype else f"{x}.to({dtype_expr(ro.dtype)})"
        g.emit(f"t{dst.id} = {code}")
        g.expr[dst.id] = f"t{dst.id}"
        return
    raise BackendUnavailableError(
        f"XNNPACK Convert from {src.dtype_name} to {out} is not supported"
    )


EMITTERS: dict[str, NodeEmitter] = {
    "StaticTranspose": static_transpose,
    "StaticReshape": static_reshape,
    "StaticSlice": static_slice,
    "StaticConstantPad": static_constant_pad,
    "StaticResizeBilinear2D": static_resize_bilinear2d,
    **dict.fromkeys(("Concatenate2", "Concatenate3", "Concatenate4", "Concatenate5"), _concatenate),
    "Copy": copy,
    "Convert": convert,
}
