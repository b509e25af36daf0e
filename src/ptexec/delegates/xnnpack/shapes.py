"""The dims an XNNPACK graph computes, from the dims of its inputs. Imports no torch.

:func:`infer_dims` propagates dims through the node list with XNNPACK's rules (the rules
ptexec's torch runner follows too): broadcasting for binary nodes, the output size
arithmetic of convolutions and pools, reshapes, slices, paddings and concatenations. It
starts from the dims the caller knows (the program's static tensors) and the constants'
serialized dims; a value computed from something unknown (a dynamic input, a node type
without a rule here) is unknown (None). A node whose inputs contradict each other (shapes
that do not broadcast, a filter that does not match its input's channels, a pooling window
larger than its padded input) raises :class:`~ptexec.errors.PteFormatError` naming the
node: such a graph cannot run, and the program should say so when it is loaded.

The serialized dims of intermediate and output values are not trusted: XNNPACK itself
recomputes every shape from the inputs when it sets a graph up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ...errors import PteFormatError
from . import schema as s

__all__ = ["Dims", "infer_dims"]

Dims = tuple[int, ...]

_SAME = frozenset(
    {
        "Abs", "Negate", "Floor", "Ceiling", "SquareRoot", "ReciprocalSquareRoot", "Square",
        "Log", "Exp", "Sin", "Cos", "Tanh", "Sigmoid", "Gelu", "Hardswish", "Softmax",
        "Clamp", "LeakyReLU", "ELU", "PReLU", "Copy", "Convert",
    }
)  # fmt: skip
_BROADCAST = frozenset({"Add", "Subtract", "Multiply", "Div", "Minimum", "Maximum"})


class _Fail(Exception):
    """A contradiction inside one node (becomes a PteFormatError with the node's path)."""


def _broadcast(a: Dims, b: Dims) -> Dims:
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + a
    pb = (1,) * (n - len(b)) + b
    out = []
    for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
        if x != y and x != 1 and y != 1:
            raise _Fail(f"dims {list(a)} and {list(b)} do not broadcast (dim {i})")
        out.append(y if x == 1 else x)
    return tuple(out)


def _window(size: int, pad: int, kernel: int, stride: int, dilation: int, what: str) -> int:
    """Output length of a window of ``kernel`` taps ``dilation`` apart, moved by ``stride``."""
    span = dilation * (kernel - 1) + 1
    if size + pad < span:
        raise _Fail(f"the {what} window spans {span}, the padded input has {size + pad}")
    return (size + pad - span) // stride + 1


def _rank(d: Dims, want: int, what: str) -> None:
    if len(d) != want:
        raise _Fail(f"{what} has dims {list(d)}, expected {want}")


def _two(a: int, b: int) -> tuple[int, int]:
    return max(a, 1), max(b, 1)


def _fully_connected(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x, w = ins[0], ins[1]
    _rank(w, 2, "the filter")
    if not x:
        raise _Fail("the input has no dims")
    out_ch, k = (w[1], w[0]) if n.flags & s.FLAG_TRANSPOSE_WEIGHTS else w
    if x[-1] != k:
        raise _Fail(f"input dims {list(x)} and filter dims {list(w)}: {x[-1]} != {k} channels")
    if len(ins) > 2 and math.prod(ins[2]) != out_ch:
        raise _Fail(f"bias dims {list(ins[2])} for {out_ch} output channels")
    return [(*x[:-1], out_ch)]


def _bmm(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    a, b = ins
    if len(a) < 2 or len(b) < 2:
        raise _Fail(f"dims {list(a)} and {list(b)}: both need at least 2")
    bk, bn = (b[-1], b[-2]) if n.flags & s.FLAG_TRANSPOSE_WEIGHTS else (b[-2], b[-1])
    if a[-1] != bk:
        raise _Fail(f"dims {list(a)} and {list(b)}: {a[-1]} != {bk}")
    return [(*_broadcast(a[:-2], b[:-2]), a[-2], bn)]


def _conv_io(n: s.XnnNode, ins: list[Dims]) -> tuple[Dims, Dims]:
    x, w = ins[0], ins[1]
    _rank(x, 4, "the input")
    _rank(w, 4, "the filter")
    return x, w


def _conv(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x, w = _conv_io(n, ins)
    groups, gi, go = n["groups"], n["group_input_channels"], n["group_output_channels"]
    kh, kw = n["kernel_height"], n["kernel_width"]
    if n.type == "DepthwiseConv2d":
        if gi < 1 or go % gi:
            raise _Fail("depthwise channels and multiplier must be positive")
        in_ch, out_ch = groups, groups * (go // gi)
        want_w: Dims = (1, kh, kw, out_ch)
    else:
        in_ch, out_ch = groups * gi, groups * go
        want_w = (out_ch, kh, kw, gi)
    if groups < 1 or w != want_w:
        raise _Fail(
            f"filter dims {list(w)} do not match kernel {kh}x{kw}, {groups} groups of "
            f"{gi} -> {go} channels"
        )
    if x[3] != in_ch:
        raise _Fail(f"input dims {list(x)}: {x[3]} channels, the filter takes {in_ch}")
    if len(ins) > 2 and math.prod(ins[2]) != out_ch:
        raise _Fail(f"bias dims {list(ins[2])} for {out_ch} output channels")
    st = _two(n["subsampling_height"], n["subsampling_width"])
    dil = _two(n["dilation_height"], n["dilation_width"])
    h = _window(x[1], n["padding_top"] + n["padding_bottom"], kh, st[0], dil[0], "kernel")
    wd = _window(x[2], n["padding_left"] + n["padding_right"], kw, st[1], dil[1], "kernel")
    return [(x[0], h, wd, out_ch)]


def _deconv(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x, w = _conv_io(n, ins)
    groups, gi, go = n["groups"], n["group_input_channels"], n["group_output_channels"]
    kh, kw = n["kernel_height"], n["kernel_width"]
    if groups < 1 or w != (groups * go, kh, kw, gi):
        raise _Fail(
            f"filter dims {list(w)} do not match kernel {kh}x{kw}, {groups} groups of "
            f"{gi} -> {go} channels"
        )
    if x[3] != groups * gi:
        raise _Fail(f"input dims {list(x)}: {x[3]} channels, the filter takes {groups * gi}")
    if len(ins) > 2 and math.prod(ins[2]) != groups * go:
        raise _Fail(f"bias dims {list(ins[2])} for {groups * go} output channels")
    st = _two(n["subsampling_height"], n["subsampling_width"])
    dil = _two(n["dilation_height"], n["dilation_width"])
    h = st[0] * (x[1] - 1) + n["adjustment_height"] + dil[0] * (w[1] - 1) + 1
    wd = st[1] * (x[2] - 1) + n["adjustment_width"] + dil[1] * (w[2] - 1) + 1
    h -= n["padding_top"] + n["padding_bottom"]
    wd -= n["padding_left"] + n["padding_right"]
    if h < 1 or wd < 1:
        raise _Fail(f"the paddings leave an output of {h}x{wd}")
    return [(x[0], h, wd, groups * go)]


def _pool(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x = ins[0]
    _rank(x, 4, "the input")
    k = (n["pooling_height"], n["pooling_width"])
    if k[0] < 1 or k[1] < 1:
        raise _Fail(f"pooling window {k}")
    st = _two(n["stride_height"], n["stride_width"])
    dil = _two(n["dilation_height"], n["dilation_width"]) if n.type == "MaxPooling2d" else (1, 1)
    h = _window(x[1], n["padding_top"] + n["padding_bottom"], k[0], st[0], dil[0], "pooling")
    w = _window(x[2], n["padding_left"] + n["padding_right"], k[1], st[1], dil[1], "pooling")
    return [(x[0], h, w, x[3])]


def _argmax_pool(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x = ins[0]
    _rank(x, 4, "the input")
    k = (n["pooling_height"], n["pooling_width"])
    if k[0] < 1 or k[1] < 1:
        raise _Fail(f"pooling window {k}")
    h = _window(x[1], n["padding_top"] + n["padding_bottom"], k[0], k[0], 1, "pooling")
    w = _window(x[2], n["padding_left"] + n["padding_right"], k[1], k[1], 1, "pooling")
    out = (x[0], h, w, x[3])
    return [out, out]


def _global_pool(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x = ins[0]
    if len(x) < 3:
        raise _Fail(f"input has {len(x)} dims, expected at least 3")
    if n.flags & s.FLAG_KEEP_DIMS:
        return [(x[0], *(1,) * (len(x) - 2), x[-1])]
    return [(x[0], x[-1])]


def _transpose(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x = ins[0]
    perm = tuple(n["perm"])
    if sorted(perm) != list(range(len(x))):
        raise _Fail(f"perm {list(perm)} is not a permutation of {len(x)} dims")
    return [tuple(x[p] for p in perm)]


def _reshape(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    numel = math.prod(ins[0])
    shape = list(n["new_shape"])
    if len(shape) > s.MAX_DIMS:
        raise _Fail(f"new shape {shape} has more than {s.MAX_DIMS} dims")
    free = [i for i, d in enumerate(shape) if d == 0]  # 0: inferred
    known = math.prod(d for d in shape if d != 0)
    if len(free) > 1:
        raise _Fail(f"new shape {shape} leaves {len(free)} dims to infer")
    if free:
        if known == 0 or numel % known:
            raise _Fail(f"new shape {shape} does not fit {numel} elements")
        shape[free[0]] = numel // known
    elif known != numel:
        raise _Fail(f"new shape {shape} holds {known} elements, the input {numel}")
    return [tuple(shape)]


def _slice(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x = ins[0]
    offsets, sizes = n["offsets"], n["sizes"]
    if len(offsets) != len(x) or len(sizes) != len(x):
        raise _Fail(f"offsets {list(offsets)} and sizes {list(sizes)} for {len(x)} dims")
    out = []
    for d, o, z in zip(x, offsets, sizes, strict=True):
        start = min(o, d)
        end = min(o + z, d) if o + z > 0 else d  # a zero size and offset: the whole dim
        out.append(max(end - start, 0))
    return [tuple(out)]


def _pad(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x = ins[0]
    pre, post = n["pre_paddings"], n["post_paddings"]
    if len(pre) != len(x) or len(post) != len(x):
        raise _Fail(f"paddings {list(pre)}, {list(post)} for {len(x)} dims")
    return [tuple(d + a + b for d, a, b in zip(x, pre, post, strict=True))]


def _resize(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    x = ins[0]
    _rank(x, 4, "the input")
    size = (n["new_height"], n["new_width"])
    if size[0] < 1 or size[1] < 1:
        raise _Fail(f"new size {size}")
    return [(x[0], size[0], size[1], x[3])]


def _concat(n: s.XnnNode, ins: list[Dims]) -> list[Dims]:
    first = ins[0]
    axis = n["axis"]
    if axis >= len(first):
        raise _Fail(f"axis {axis} for {len(first)} dims")
    total = 0
    for d in ins:
        if len(d) != len(first) or any(
            a != b for i, (a, b) in enumerate(zip(d, first, strict=True)) if i != axis
        ):
            raise _Fail(f"inputs of dims {[list(x) for x in ins]} along axis {axis}")
        total += d[axis]
    return [(*first[:axis], total, *first[axis + 1 :])]


_RULES: dict[str, Callable[[s.XnnNode, list[Dims]], list[Dims]]] = {
    "FullyConnected": _fully_connected,
    "BatchMatrixMultiply": _bmm,
    "Conv2d": _conv,
    "DepthwiseConv2d": _conv,
    "ConvTranspose2d": _deconv,
    "MaxPooling2d": _pool,
    "AvgPooling2d": _pool,
    "ArgMaxPooling2d": _argmax_pool,
    "GlobalAvgPooling2d": _global_pool,
    "StaticTranspose": _transpose,
    "StaticReshape": _reshape,
    "StaticSlice": _slice,
    "StaticConstantPad": _pad,
    "StaticResizeBilinear2D": _resize,
    "Concatenate2": _concat,
    "Concatenate3": _concat,
    "Concatenate4": _concat,
    "Concatenate5": _concat,
}


def _rule(n: s.XnnNode, ins: list[Dims]) -> list[Dims] | None:
    t = n.type
    if t in _SAME:
        if t == "PReLU":
            _broadcast(ins[0], ins[1])
        return [ins[0]]
    if t in _BROADCAST:
        return [_broadcast(ins[0], ins[1])]
    rule = _RULES.get(t)
    return None if rule is None else rule(n, ins)


def infer_dims(payload: s.XnnPayload, known: Mapping[int, Dims | None]) -> dict[int, Dims | None]:
    """Value id -> the dims the graph computes for it (None: unknown), starting from
    ``known`` (value id -> dims, for external inputs; those absent are unknown) and the
    constants' dims. The payload must be validated (:func:`schema.validate_payload`)."""
    g = payload.graph
    dims: dict[int, Dims | None] = {}
    for v in g.values:
        if v.is_constant:
            dims[v.id] = tuple(v.dims)
        elif v.is_input:
            dims[v.id] = known.get(v.id)
    for n in g.nodes:
        ins = [dims.get(vid) for vid in n.inputs]
        outs: list[Dims] | None = None
        if all(d is not None for d in ins):
            try:
                outs = _rule(n, [d for d in ins if d is not None])
            except _Fail as e:
                raise PteFormatError(f"{payload.path}.xnodes[{n.index}].{n.type}", str(e)) from None
        for k, vid in enumerate(n.outputs):
            dims[vid] = outs[k] if outs is not None and k < len(outs) else None
    return dims
