"""Emitters of convolutions (Conv2d, DepthwiseConv2d, ConvTranspose2d: float, static int8,
per-batch quantized inputs) and pools (max, average, global average, argmax)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...errors import BackendUnavailableError
from . import quant as qa
from . import schema as s
from .emitter import GraphEmitter, NodeEmitter
from .thresholds import CL_POOL_ELEMENTS, TINY_CONV_FLOPS
from .values import dtype_expr

__all__ = ["EMITTERS"]


@dataclass(frozen=True, slots=True)
class _ConvOperands:
    """A convolution's operands as its node runs: the input expression (NHWC), the compute
    dtype, the bias expression, the paddings, the filter in XNNPACK's dims, and
    ``finish(code, nchw)``, which turns the NHWC result ``code`` into the node's output
    (``nchw``: the same result as the NCHW tensor it is a view of, for a result in NCHW
    memory; a per-channel requantization scales it along its contiguous dims)."""

    x: str
    dtype: torch.dtype
    b: str
    pads: tuple[int, int, int, int]
    w: torch.Tensor
    finish: Callable[..., None]


def _conv_common(
    g: GraphEmitter, n: s.XnnNode, channel_dim: int, channels: int, per_pixel: bool = False
) -> _ConvOperands:
    """What every convolution needs: its input expression, compute dtype, bias,
    paddings and filter (dequantized float, or integers when the node runs in int8),
    and how the result becomes the output. Half-precision convolutions on the CPU
    compute in float32 (torch's half convolutions there are slow; XNNPACK's half
    kernels accumulate in float32 too) and round the result to half. ``per_pixel``: a
    dynamically quantized input is quantized per pixel, not per image (see
    :func:`_pointwise`)."""
    g.check_flags(n, 0)
    g.rank(n, n["input1_id"], 4)
    g.rank(n, n["filter_id"], 4)
    fv = g.value(n["filter_id"])
    if not fv.is_constant:
        raise BackendUnavailableError(
            f"XNNPACK {n.type} node {n.index} with a non-constant filter is not supported"
        )
    pads = (n["padding_top"], n["padding_right"], n["padding_bottom"], n["padding_left"])
    src = n["input1_id"]
    qw = g.int8_weights(n, channel_dim, channels)
    if qw is not None:  # static int8: exact integer accumulation, then requantization
        w, scale, bias = qw
        exact = g.exact_in_float32(n, w, channel_dim, bias)
        dt = torch.float32 if exact else torch.float64
        x = g.as_carried(src) + ("" if exact else ".double()")
        b = g.bind(bias.to(g.device, dt), "b") if bias is not None else "None"
        return _ConvOperands(
            x,
            dt,
            b,
            pads,
            w.to(dt),
            lambda code, nchw=None: g.requantize_output(n, code, scale, nchw),
        )
    if src in g.pending_qd and g.pending_qd[src][1] == 3:
        qd = _qd_conv(g, n, channel_dim, channels, src, per_pixel)
        if qd is not None:
            return _ConvOperands(qd[0], qd[1].dtype, "None", pads, qd[1], qd[2])
    dt = g.compute_dtype(n)
    x = g.as_float(src, dt)
    post = ""
    if g.device.type == "cpu" and dt in (torch.float16, torch.bfloat16):
        x, post, dt = f"{x}.float()", f".to({dtype_expr(dt)})", torch.float32
    bias_id = n["bias_id"]
    b = g.as_float(bias_id, dt) if bias_id is not None else "None"
    w = g.consts.value(fv, dt)
    return _ConvOperands(
        x, dt, b, pads, w, lambda code, nchw=None: g.write_float(n, f"{code}{post}", fresh=True)
    )


def _qd_conv(
    g: GraphEmitter, n: s.XnnNode, channel_dim: int, channels: int, src: int, per_pixel: bool
) -> tuple[str, torch.Tensor, Callable[[str], None]] | None:
    """A convolution of an input quantized per batch element (XNNPACK's dynamically
    quantized convolution), or per pixel (``per_pixel``): the centered integers
    convolved with the integer weights, then scaled by the input's and the filter's
    scales, plus the float bias. The integer accumulator is exact: in float32 where the
    weights prove every partial sum below 2**24, else in float64, rounded to float32
    once (as XNNPACK converts its int32 accumulator)."""
    fv = g.value(n["filter_id"])
    q = fv.quant
    if not (
        fv.dtype_name == "qcint8"
        and isinstance(q, s.PerChannelQuant)
        and q.channel_dim == channel_dim
        and g.carried(n.outputs[0]).kind == "float"
    ):
        return None
    w = g.consts.ints(fv).to(torch.float32)
    wscale = g.consts.scales(q).reshape(-1).contiguous()
    if wscale.numel() != channels:
        raise g.fail(n, f"{wscale.numel()} filter scales for {channels} channels")
    other = [d for d in range(w.dim()) if d != channel_dim]
    exact = qa.exact_in_float32(float(w.abs().sum(dim=other).max()), 255, 0.0)
    rows = g.qd_rows(src, 1 if per_pixel else None)
    fsrc = g.pending_qd[src][0]
    x = f"{rows}.centered.reshape({fsrc}.shape)"
    acc = ""
    if not exact:
        x, w, acc = f"{x}.double()", w.double(), ".float()"
    bias_id = n["bias_id"]
    b = g.as_float(bias_id, torch.float32) if bias_id is not None else "None"
    ws = g.bind(wscale.to(g.device), "s")
    dt = g.carried(n.outputs[0]).dtype
    cast = "" if dt == torch.float32 else f".to({dtype_expr(dt)})"

    def finish(code: str, nchw: str | None = None) -> None:
        g.write_float(n, f"_qd_scale({code}{acc}, {rows}, {ws}, {b}){cast}", fresh=True)

    return x, w, finish


def _at_least_one(a: int, b: int) -> tuple[int, int]:
    """A stride or dilation pair as XNNPACK reads it: 0 means 1."""
    return (max(a, 1), max(b, 1))


def _check_conv_shape(
    g: GraphEmitter, n: s.XnnNode, w: torch.Tensor, out_ch: int, in_per_group: int
) -> None:
    kh, kw = n["kernel_height"], n["kernel_width"]
    if tuple(w.shape[2:]) != (kh, kw) or w.shape[0] != out_ch or w.shape[1] != in_per_group:
        raise g.fail(
            n,
            f"filter {list(g.value(n['filter_id']).dims)} does not match kernel {kh}x{kw}, "
            f"{n['groups']} groups of {n['group_input_channels']} -> {n['group_output_channels']} channels",
        )


def _conv_out(g: GraphEmitter, n: s.XnnNode, pads: tuple[int, int, int, int], out_ch: int) -> None:
    dims = g.dims(n["input1_id"])
    top, right, bottom, left = pads
    k = (n["kernel_height"], n["kernel_width"])
    st = _at_least_one(n["subsampling_height"], n["subsampling_width"])
    dil = _at_least_one(n["dilation_height"], n["dilation_width"])
    h = (dims[1] + top + bottom - dil[0] * (k[0] - 1) - 1) // st[0] + 1
    w = (dims[2] + left + right - dil[1] * (k[1] - 1) - 1) // st[1] + 1
    g.expect_dims(n, {1: h, 2: w, 3: out_ch})


def _conv_input(
    g: GraphEmitter, x: str, pads: tuple[int, int, int, int]
) -> tuple[str, tuple[int, int]]:
    """The NHWC input as the NCHW view torch convolves (channels-last memory), and the
    symmetric padding left to the convolution (asymmetric padding is applied in NHWC,
    which keeps the memory channels last)."""
    top, right, bottom, left = pads
    if top == bottom and left == right:
        return f"{x}.permute(0, 3, 1, 2)", (top, left)
    return f"F.pad({x}, (0, 0, {left}, {right}, {top}, {bottom})).permute(0, 3, 1, 2)", (0, 0)


def conv2d(g: GraphEmitter, n: s.XnnNode) -> None:
    groups = n["groups"]
    if groups < 1:
        raise g.fail(n, "groups must be at least 1")
    out_ch = groups * n["group_output_channels"]
    c = _conv_common(g, n, 0, out_ch, _pointwise(n))
    raw = c.w  # [OC, KH, KW, IC/g]
    w = raw.permute(0, 3, 1, 2)
    _check_conv_shape(g, n, w, out_ch, n["group_input_channels"])
    _conv_out(g, n, c.pads, out_ch)
    stride = _at_least_one(n["subsampling_height"], n["subsampling_width"])
    dil = _at_least_one(n["dilation_height"], n["dilation_width"])
    x, b = c.x, c.b
    if groups == 1 and w.shape[2:] == (1, 1) and not any(c.pads):
        # a 1x1 convolution of NHWC values is a linear layer over channels
        x = g.channels_last(x)
        xs = x if stride == (1, 1) else f"{x}[:, ::{stride[0]}, ::{stride[1]}]"
        wn = g.bind(raw.reshape(raw.shape[0], raw.shape[3]).to(g.device), "w")
        c.finish(f"F.linear({xs}, {wn}, {b})")
        return
    if _tiny_conv(g, n, groups, dil, c.dtype):
        # torch's direct (im2col) kernel: far less fixed cost than oneDNN's for tiny
        # work; it convolves NCHW memory and gives NCHW memory
        xc, pad = _conv_input(g, x, c.pads)
        wn = g.bind(w.contiguous().to(g.device), "w")
        k = tuple(w.shape[2:])
        code = f"_slow_conv2d({xc}, {wn}, {k}, {b}, {stride}, {pad})"
        c.finish(f"{code}.permute(0, 2, 3, 1)", code)
        g.mark_nchw_memory(n.outputs[0])
        return
    xc, pad = _conv_input(g, g.channels_last(x), c.pads)
    wn = g.bind(_channels_last_filter(w).to(g.device), "w")
    code = f"F.conv2d({xc}, {wn}, {b}, {stride}, {pad}, {dil}, {groups})"
    c.finish(f"{code}.permute(0, 2, 3, 1)")


def _pointwise(n: s.XnnNode) -> bool:
    """Whether convolution ``n`` is a product per pixel (a 1x1 filter, stride 1, no
    padding, one group), which XNNPACK runs as a fully connected layer over the pixels:
    dynamically quantized, its input is quantized per pixel then, as a linear layer's is
    per token, where other convolutions quantize it per image."""
    pads = (n["padding_top"], n["padding_right"], n["padding_bottom"], n["padding_left"])
    return (
        n["groups"] == 1
        and (n["kernel_height"], n["kernel_width"]) == (1, 1)
        and _at_least_one(n["subsampling_height"], n["subsampling_width"]) == (1, 1)
        and not any(pads)
    )


def _tiny_conv(
    g: GraphEmitter, n: s.XnnNode, groups: int, dil: tuple[int, int], dt: torch.dtype
) -> bool:
    # traced code takes conv2d: the direct kernel's shape function gives its output
    # channels-last strides where the kernel writes NCHW memory
    if g.traced or g.device.type != "cpu" or groups != 1 or dil != (1, 1):
        return False
    if dt != torch.float32:
        return False
    out = g.value(n.outputs[0]).dims
    k = int(n["kernel_height"] * n["kernel_width"] * n["group_input_channels"])
    return math.prod(out) * k * 2 < TINY_CONV_FLOPS


def depthwise_conv2d(g: GraphEmitter, n: s.XnnNode) -> None:
    channels = n["groups"]
    gi = n["group_input_channels"]
    if channels < 1 or gi < 1 or n["group_output_channels"] % gi:
        raise g.fail(n, "depthwise channels and multiplier must be positive")
    out_ch = channels * (n["group_output_channels"] // gi)
    c = _conv_common(g, n, 3, out_ch)
    w = c.w.permute(3, 0, 1, 2).contiguous()  # [1, KH, KW, C * mult] -> [C * mult, 1, KH, KW]
    _check_conv_shape(g, n, w, out_ch, 1)
    _conv_out(g, n, c.pads, out_ch)
    xc, pad = _conv_input(g, g.channels_last(c.x), c.pads)
    stride = _at_least_one(n["subsampling_height"], n["subsampling_width"])
    dil = _at_least_one(n["dilation_height"], n["dilation_width"])
    wn = g.bind(_channels_last_filter(w).to(g.device), "w")
    c.finish(f"F.conv2d({xc}, {wn}, {c.b}, {stride}, {pad}, {dil}, {channels}).permute(0, 2, 3, 1)")


def conv_transpose2d(g: GraphEmitter, n: s.XnnNode) -> None:
    groups = n["groups"]
    gi, go = n["group_input_channels"], n["group_output_channels"]
    if groups < 1:
        raise g.fail(n, "groups must be at least 1")
    c = _conv_common(g, n, 0, groups * go)
    oihw = c.w.permute(0, 3, 1, 2)  # [OC, KH, KW, IC/g] -> [OC, IC/g, KH, KW]
    _check_conv_shape(g, n, oihw, groups * go, gi)
    kh, kw = oihw.shape[2:]
    # torch's layout: [IC, OC/g, KH, KW]
    w = (
        oihw.reshape(groups, go, gi, kh, kw)
        .permute(0, 2, 1, 3, 4)
        .reshape(groups * gi, go, kh, kw)
        .contiguous()
    )
    stride = _at_least_one(n["subsampling_height"], n["subsampling_width"])
    dil = _at_least_one(n["dilation_height"], n["dilation_width"])
    adj = (n["adjustment_height"], n["adjustment_width"])
    if adj[0] >= max(stride[0], dil[0]) or adj[1] >= max(stride[1], dil[1]):
        raise g.fail(
            n, f"adjustment {adj} must be smaller than the stride {stride} or dilation {dil}"
        )
    top, right, bottom, left = c.pads
    dims = g.dims(n["input1_id"])
    h = stride[0] * (dims[1] - 1) + adj[0] + dil[0] * (kh - 1) + 1 - top - bottom
    wd = stride[1] * (dims[2] - 1) + adj[1] + dil[1] * (kw - 1) + 1 - left - right
    g.expect_dims(n, {1: h, 2: wd, 3: groups * go})
    wn = g.bind(w.to(g.device), "w")
    sym = top == bottom and left == right
    pad = (top, left) if sym else (0, 0)
    direct = g.device.type == "cpu" and groups == 1
    if direct:
        # torch's direct kernel: 1.7-2.7x faster than oneDNN's on these shapes
        # (benchmarks/xnnpack_kernels.py --only deconv); NCHW memory in and out
        xc = f"{c.x}.permute(0, 3, 1, 2)"
        call = f"_slow_deconv2d({xc}, {wn}, {(kh, kw)}, {c.b}, {stride}, {pad}, {adj}, {dil})"
    else:
        xc = f"{g.channels_last(c.x)}.permute(0, 3, 1, 2)"
        call = f"F.conv_transpose2d({xc}, {wn}, {c.b}, {stride}, {pad}, {adj}, {groups}, {dil})"
    if sym:
        code = call
    else:  # asymmetric padding: run unpadded, then crop
        full = f"_full{n.index}"
        g.emit(f"{full} = {call}")
        code = f"{full}[:, :, {top}:{full}.shape[2] - {bottom}, {left}:{full}.shape[3] - {right}]"
    c.finish(f"{code}.permute(0, 2, 3, 1)", code if direct else None)
    if direct:
        g.mark_nchw_memory(n.outputs[0])


def _pool_args(
    g: GraphEmitter, n: s.XnnNode, raw: bool = False
) -> tuple[str, tuple[int, int], tuple[int, int], tuple[int, int, int, int]]:
    g.check_flags(n, s.FLAG_KEEP_DIMS)
    g.rank(n, n["input_id"], 4)
    k = (n["pooling_height"], n["pooling_width"])
    if k[0] < 1 or k[1] < 1:
        raise g.fail(n, f"pooling window {k}")
    st = _at_least_one(n["stride_height"], n["stride_width"])
    pads = (n["padding_top"], n["padding_right"], n["padding_bottom"], n["padding_left"])
    x = g.as_carried(n["input_id"]) if raw else g.as_float(n["input_id"])
    if math.prod(g.dims(n["input_id"])) >= CL_POOL_ELEMENTS:
        x = g.channels_last(x)
    return x, k, st, pads


def max_pooling2d(g: GraphEmitter, n: s.XnnNode) -> None:
    same = g.same_q(n["input_id"], n["output_id"])
    x, k, st, pads = _pool_args(g, n, raw=same)
    dil = _at_least_one(n["dilation_height"], n["dilation_width"])
    top, right, bottom, left = pads
    eff = ((k[0] - 1) * dil[0] + 1, (k[1] - 1) * dil[1] + 1)
    if top == bottom and left == right and 2 * top <= eff[0] and 2 * left <= eff[1]:
        code = f"F.max_pool2d({x}.permute(0, 3, 1, 2), {k}, {st}, {(top, left)}, {dil}).permute(0, 2, 3, 1)"
    else:
        code = f"_max_pool({x}, {k}, {st}, {pads}, {dil})"
    if same:  # the maximum of integers is the integer of the maximum
        g.write_carried(n, code, fresh=True)
    else:
        g.write_float(n, code, fresh=True)


def avg_pooling2d(g: GraphEmitter, n: s.XnnNode) -> None:
    x, k, st, pads = _pool_args(g, n)
    top, right, bottom, left = pads
    if top == bottom and left == right and 2 * top <= k[0] and 2 * left <= k[1]:
        code = f"F.avg_pool2d({x}.permute(0, 3, 1, 2), {k}, {st}, {(top, left)}, False, False).permute(0, 2, 3, 1)"
    else:
        code = f"_avg_pool({x}, {k}, {st}, {pads})"
    g.write_float(n, code, fresh=True)


def global_avg_pooling2d(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, s.FLAG_KEEP_DIMS)
    src, o = n.inputs[0], n.outputs[0]
    rank = len(g.dims(src))
    if rank < 3:
        raise g.fail(n, f"input has {rank} dims, expected at least 3")
    dims = tuple(range(1, rank - 1))
    keep = bool(n.flags & s.FLAG_KEEP_DIMS)
    if g.all_qs8((src, o)) and not g.value(src).is_constant:
        ri, ro = g.carried(src), g.carried(o)
        mean = g.bind(qa.Mean(ri.scale, ri.zp, ro.scale, ro.zp), "mean")
        g.write_carried(n, f"{mean}({g.as_carried(src)}, {dims}, {keep})", fresh=True)
        return
    g.write_float(n, f"{g.as_float(src)}.mean(dim={dims}, keepdim={keep})", fresh=True)


def argmax_pooling2d(g: GraphEmitter, n: s.XnnNode) -> None:
    g.check_flags(n, 0)
    g.rank(n, n["input_id"], 4)
    k = (n["pooling_height"], n["pooling_width"])
    if k[0] < 1 or k[1] < 1:
        raise g.fail(n, f"pooling window {k}")
    pads = (n["padding_top"], n["padding_right"], n["padding_bottom"], n["padding_left"])
    vo, io = n["output_value_id"], n["output_index_id"]
    g.emit(f"t{vo}, t{io} = _argmax_pool({g.as_float(n['input_id'])}, {k[0]}, {k[1]}, {pads})")
    g.expr[vo] = f"t{vo}"
    g.expr[io] = f"t{io}"


def _channels_last_filter(w: torch.Tensor) -> torch.Tensor:
    """A 4-d filter in channels-last memory (oneDNN then convolves channels-last
    activations without reordering them)."""
    return w.contiguous(memory_format=torch.channels_last)


EMITTERS: dict[str, NodeEmitter] = {
    "Conv2d": conv2d,
    "DepthwiseConv2d": depthwise_conv2d,
    "ConvTranspose2d": conv_transpose2d,
    "MaxPooling2d": max_pooling2d,
    "AvgPooling2d": avg_pooling2d,
    "GlobalAvgPooling2d": global_avg_pooling2d,
    "ArgMaxPooling2d": argmax_pooling2d,
}
