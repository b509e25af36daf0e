"""Emitters of matrix products: FullyConnected (float, static int8, per-token quantized
inputs with int8 or int4 weights) and BatchMatrixMultiply."""

from __future__ import annotations

import torch

from . import quant as qa
from . import schema as s
from .emitter import GraphEmitter, NodeEmitter
from .thresholds import INT_MM_WEIGHTS
from .values import dtype_expr

__all__ = ["EMITTERS"]


def fully_connected(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, s.FLAG_TRANSPOSE_WEIGHTS)
    dt = g.compute_dtype(n)
    fv = g.value(n["filter_id"])
    transposed = bool(n.flags & s.FLAG_TRANSPOSE_WEIGHTS)
    if len(fv.dims) != 2:
        raise g.fail(n, f"filter has dims {list(fv.dims)}, expected 2")
    if _qd_int_linear(g, n, fv, transposed):
        return
    out_ch = fv.dims[1] if transposed else fv.dims[0]
    qw = g.int8_weights(n, 1 if transposed else 0, out_ch) if fv.is_constant else None
    if qw is not None:
        w, scale, bias = qw
        wt = w.t() if transposed else w
        exact = g.exact_in_float32(n, wt, 0, bias)
        cast = "" if exact else ".double()"
        wdt = torch.float32 if exact else torch.float64
        wname = g.bind(wt.contiguous().to(g.device, wdt), "w")
        b = g.bind(bias.to(g.device, wdt), "b") if bias is not None else "None"
        acc = f"F.linear({g.as_carried(n['input1_id'])}{cast}, {wname}, {b})"
        g.requantize_output(n, acc, scale)
        return
    x = g.as_float(n.inputs[0], dt)
    bias_id = n["bias_id"]
    b = g.as_float(bias_id, dt) if bias_id is not None else "None"
    if fv.is_constant:
        wt_ = g.consts.value(fv, dt)
        if transposed:
            wt_ = wt_.t().contiguous()
        wname = g.bind(wt_, "w")
        g.write_float(n, f"F.linear({x}, {wname}, {b})", fresh=True)
    else:
        we = g.as_float(fv.id, dt)
        wexpr = we if transposed else f"{we}.t()"
        code = (
            f"torch.matmul({x}, {wexpr})"
            if bias_id is None
            else f"torch.add(torch.matmul({x}, {wexpr}), {b})"
        )
        g.write_float(n, code, fresh=True)


def _qd_int_linear(g: GraphEmitter, n: s.XnnNode, fv: s.XnnValue, transposed: bool) -> bool:
    """A per-token quantized input times int8/int4 weights with one scale per output
    channel accumulates exactly, as XNNPACK's kernels: as a float32 product of the
    integers when the weights prove every partial sum exact, else (on the CPU) as an
    int8 matrix product. Block-wise weights with several blocks per row stay in float."""
    src = n["input1_id"]
    q = fv.quant
    per_channel = (isinstance(q, s.PerChannelQuant) and fv.dtype_name in ("qcint8", "qcint4")) or (
        isinstance(q, s.PerChannelGroupQuant) and q.group_size == fv.dims[1]
    )
    if (
        src not in g.pending_qd
        or g.pending_qd[src][1] != 1
        or transposed
        or not fv.is_constant
        or not per_channel
        or q is None
        or q.channel_dim != 0  # type: ignore[union-attr]
        or g.carried(n.outputs[0]).kind != "float"
    ):
        return False
    assert isinstance(q, s.PerChannelQuant | s.PerChannelGroupQuant)
    ints = g.consts.ints(fv)  # [out, in]
    exact = qa.exact_in_float32(float(ints.abs().sum(dim=1, dtype=torch.int64).max()), 255, 0)
    if not exact and g.device.type != "cpu":
        return False
    wscale = g.bind(g.consts.scales(q).to(torch.float32).contiguous().to(g.device))
    bias = n["bias_id"]
    b = g.as_float(bias, torch.float32) if bias is not None else "None"
    x = g.pending_qd[src][0]
    dt = dtype_expr(g.carried(src).dtype)
    rows = g.qd_rows(src)
    if exact and (g.device.type != "cpu" or ints.numel() < INT_MM_WEIGHTS):
        w = g.bind(ints.to(torch.float32).contiguous().to(g.device), "w")
        code = f"_qd_linear_f({rows}, {x}.shape[:-1], {w}, {wscale}, {b}, {dt})"
    else:
        wt = g.bind(ints.t().contiguous(), "w")
        colsum = g.bind(ints.sum(dim=1, dtype=torch.int32), "w")
        code = f"_qd_linear({rows}, {x}.shape[:-1], {wt}, {colsum}, {wscale}, {b}, {dt})"
    g.write_float(n, code, fresh=True)
    return True


def batch_matrix_multiply(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, s.FLAG_TRANSPOSE_WEIGHTS)
    dt = g.compute_dtype(n)
    a, b = g.as_float(n.inputs[0], dt), g.as_float(n.inputs[1], dt)
    if n.flags & s.FLAG_TRANSPOSE_WEIGHTS:
        b = f"{b}.transpose(-1, -2)"
    g.write_float(n, f"torch.matmul({a}, {b})", fresh=True)


EMITTERS: dict[str, NodeEmitter] = {
    "FullyConnected": fully_connected,
    "BatchMatrixMultiply": batch_matrix_multiply,
}
