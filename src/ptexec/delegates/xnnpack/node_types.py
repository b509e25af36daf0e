"""The XNNPACK node types ptexec's torch runner runs, and how its passes group them.

The module itself imports no torch (as :mod:`.schema`).
"""

from __future__ import annotations

from . import schema as s

__all__ = [
    "APPLIES_OUTPUT_BOUNDS",
    "APPROXIMATED_IN_FLOAT",
    "BINARY",
    "ELEMENTWISE",
    "OTHER",
    "SUPPORTED_NODE_TYPES",
    "UNARY",
    "approximated_float_nodes",
    "payload_gaps",
    "quantized_products",
    "quantizes_activations",
    "unsupported_node_types",
]

# unary nodes: type -> template over the input expression {x}
UNARY: dict[str, str] = {
    "Abs": "torch.abs({x})",
    "Negate": "torch.neg({x})",
    "Floor": "torch.floor({x})",
    "Ceiling": "torch.ceil({x})",
    "SquareRoot": "torch.sqrt({x})",
    "ReciprocalSquareRoot": "torch.rsqrt({x})",
    "Square": "torch.square({x})",
    "Log": "torch.log({x})",
    "Exp": "torch.exp({x})",
    "Sin": "torch.sin({x})",
    "Cos": "torch.cos({x})",
    "Tanh": "torch.tanh({x})",
    "Sigmoid": "torch.sigmoid({x})",
    "Gelu": "F.gelu({x})",
    "Hardswish": "F.hardswish({x})",
    "Softmax": "torch.softmax({x}, -1)",
}
BINARY: dict[str, str] = {
    "Add": "torch.add({a}, {b})",
    "Subtract": "torch.sub({a}, {b})",
    "Multiply": "torch.mul({a}, {b})",
    "Div": "torch.div({a}, {b})",
    "Minimum": "torch.minimum({a}, {b})",
    "Maximum": "torch.maximum({a}, {b})",
}
OTHER = frozenset(
    {
        "Clamp",
        "LeakyReLU",
        "ELU",
        "PReLU",
        "FullyConnected",
        "BatchMatrixMultiply",
        "Conv2d",
        "DepthwiseConv2d",
        "ConvTranspose2d",
        "MaxPooling2d",
        "AvgPooling2d",
        "GlobalAvgPooling2d",
        "ArgMaxPooling2d",
        "StaticTranspose",
        "StaticReshape",
        "StaticSlice",
        "StaticConstantPad",
        "StaticResizeBilinear2D",
        "Concatenate2",
        "Concatenate3",
        "Concatenate4",
        "Concatenate5",
        "Copy",
        "Convert",
    }
)
SUPPORTED_NODE_TYPES = frozenset(UNARY) | frozenset(BINARY) | OTHER

# nodes whose emitters apply the node's output bounds (min/max) to their result (a Clamp
# after one of them can join it: passes.fuse_clamps)
APPLIES_OUTPUT_BOUNDS = frozenset(
    {
        "Conv2d",
        "DepthwiseConv2d",
        "ConvTranspose2d",
        "FullyConnected",
        "Add",
        "Subtract",
        "Multiply",
        "MaxPooling2d",
        "AvgPooling2d",
        "GlobalAvgPooling2d",
    }
)


# element-by-element nodes a table region may contain (Softmax reads whole rows)
ELEMENTWISE = (
    (frozenset(UNARY) - {"Softmax"})
    | frozenset(BINARY)
    | {
        "Convert",
        "Clamp",
        "LeakyReLU",
        "ELU",
    }
)


# float nodes whose XNNPACK kernels compute their function their own way: polynomial or
# table approximations (Sigmoid, Tanh, Exp, ...), a hardware reciprocal square root estimate
# refined by a Newton step (ReciprocalSquareRoot, and SquareRoot in some kernels), fused
# multiply-adds (Hardswish), a row's sum in their own order (Softmax). torch's result differs
# from theirs in the last bit for some inputs; an int8 quantization downstream (a dynamically
# quantized matrix product) can turn that bit into a whole quantization step. Int8 nodes of
# these types are lookup tables XNNPACK computes at setup, which the torch runner reproduces.
APPROXIMATED_IN_FLOAT = frozenset(
    {
        "ReciprocalSquareRoot",
        "SquareRoot",
        "Sigmoid",
        "Tanh",
        "Exp",
        "Log",
        "Sin",
        "Cos",
        "Gelu",
        "ELU",
        "Hardswish",
        "Softmax",
    }
)
_FLOAT = frozenset({"fp32", "fp16"})


def approximated_float_nodes(payload: s.XnnPayload) -> list[str]:
    """The node types of ``payload`` in :data:`APPROXIMATED_IN_FLOAT` that compute in float
    (their output is a float value), in graph order, each once ([]: none)."""
    found: list[str] = []
    for n in payload.graph.nodes:
        if n.type not in APPROXIMATED_IN_FLOAT or n.type in found or not n.outputs:
            continue
        out = payload.graph.by_id.get(n.outputs[0])
        if out is not None and out.dtype_name in _FLOAT:
            found.append(n.type)
    return found


_QUANTIZED = frozenset({"qint8", "quint8", "qdint8", "qpint8"})


def quantizes_activations(payload: s.XnnPayload) -> bool:
    """Whether ``payload`` rounds computed values to int8 steps: a value that is not a
    constant (an input or an intermediate) is quantized, statically or per token at run
    time. A last-bit difference in a float value before it can move that value a whole
    step."""
    return any(
        not v.is_constant and (v.dtype_name in _QUANTIZED or v.dq_datatype != 0)
        for v in payload.graph.values
    )


_PRODUCTS = frozenset({"FullyConnected", "BatchMatrixMultiply"})


def quantized_products(payload: s.XnnPayload) -> bool:
    """Whether ``payload`` multiplies int8 activations (quantized statically or per token)
    by constant quantized weights: a matrix product of integers, which XNNPACK runs with
    its integer dot-product kernels and traced torch code in float32 over dequantized
    values."""
    by_id = payload.graph.by_id
    for n in payload.graph.nodes:
        if n.type not in _PRODUCTS or len(n.inputs) < 2:
            continue
        x, w = by_id.get(n.inputs[0]), by_id.get(n.inputs[1])
        if x is None or w is None or x.is_constant or not w.is_constant:
            continue
        if (x.dtype_name in _QUANTIZED or x.dq_datatype != 0) and w.dtype_name.startswith("q"):
            return True
    return False


def unsupported_node_types(payload: s.XnnPayload) -> list[str]:
    """Node types (and unknown type codes) of a payload that this runtime cannot run."""
    bad = sorted({n.type for n in payload.graph.nodes if n.type not in SUPPORTED_NODE_TYPES})
    bad += sorted({f"unknown node type {code}" for _, code in payload.graph.unknown_nodes})
    return bad


def payload_gaps(data: bytes | bytearray | memoryview) -> list[str]:
    """The node types of an XNNPACK payload that ptexec's torch runner does not run
    ([]: all of them); ExecuTorch's XNNPACK kernels, where installed, run them on the CPU."""
    return unsupported_node_types(s.decode_payload(data))
