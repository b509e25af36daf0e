"""Run a validated XNNPACK graph with torch: the node list becomes one compiled function.

At load, every node becomes one or two lines of Python calling torch, every constant is
prepared once (zero-copy views of the file where torch can use XNNPACK's layout as is,
repacked otherwise), and the lines are compiled into one function ``run(x0, x1, ...)``
whose arguments are the delegate's tensors in external-id order. The method calls it with
one statement per ``DelegateCall``.

Layout. Each value is a torch tensor whose shape is the value's XNNPACK dims (XNNPACK's
own layout: channels last for 4-d activations). An external tensor enters as
``x.permute(dim_order)`` (how XNNPACK reads its memory) and leaves through
``out.permute(dim_order).copy_(...)``, after the output is resized as ExecuTorch's
runtime resizes it. The transposes the partitioner inserts between NCHW and NHWC become
torch permutations (views); convolutions and pools run on ``permute(0, 3, 1, 2)`` views,
so a channels-first model runs channels first with no copies.

Quantized values. A static int8 value is carried as a float32 tensor holding its centered
integers ``q - zero_point`` and computed with XNNPACK's own integer arithmetic
(:mod:`.quant`): convolutions and fully connected nodes accumulate exactly and requantize
once, additions use XNNPACK's fixed-point multipliers, means sum in integers, unary
functions are XNNPACK's 256-entry tables. A node XNNPACK has no integer kernel for reads
dequantized values (``(q - zero_point) * scale``, as XNNPACK's Convert computes them) and
quantizes its result as XNNPACK's float-to-int8 Convert does. Dynamically quantized
values (per token, or per batch element for a convolution) are quantized at run time with
XNNPACK's choice of scale and zero point, once per distinct input however many nodes read
it. Weights are prepared once, at load.

The parts: :mod:`.node_types` (what runs), :mod:`.values` (how a value is described and
carried), :mod:`.constants` (constants prepared once), :mod:`.passes` (Clamp fusion,
lookup-table regions), :mod:`.emitter` (the generator's shared rules and ``build``), the
node emitters by family (:mod:`.emit_elementwise`, :mod:`.emit_matmul`,
:mod:`.emit_convolution`, :mod:`.emit_movement`), :mod:`.run_helpers` (what the
generated code calls) and :mod:`.runner` (the prepared graph).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ...errors import BackendUnavailableError
from . import emit_convolution, emit_elementwise, emit_matmul, emit_movement
from . import schema as s
from .emitter import GraphEmitter, NodeEmitter
from .node_types import SUPPORTED_NODE_TYPES, unsupported_node_types
from .run_helpers import OutputShapeError
from .runner import XnnRunner
from .values import UNSUPPORTED_DATATYPES, ArgInfo

__all__ = [
    "EMITTERS",
    "SUPPORTED_NODE_TYPES",
    "ArgInfo",
    "OutputShapeError",
    "XnnRunner",
    "build_runner",
    "unsupported_node_types",
]

# node type -> the function that emits its statements, every family's
EMITTERS: Mapping[str, NodeEmitter] = {
    **emit_elementwise.EMITTERS,
    **emit_matmul.EMITTERS,
    **emit_convolution.EMITTERS,
    **emit_movement.EMITTERS,
}


def build_runner(
    payload: s.XnnPayload,
    named_data: Mapping[str, memoryview],
    args: Sequence[ArgInfo | None],
    device: torch.device | str = "cpu",
    traced: bool = False,
) -> XnnRunner:
    """Check that every node and datatype is supported, validate the payload and compile its
    node list; ``args`` describes the delegate call's arguments (None: not a tensor).
    ``traced``: the code is to be traced (the compiled tier), so it uses only operations
    whose shape functions give the strides their kernels produce."""
    bad = unsupported_node_types(payload)
    if bad:
        raise BackendUnavailableError(
            f"XNNPACK payload {payload.path} uses node type(s) ptexec cannot run: {', '.join(bad)}"
        )
    kinds = sorted(
        {v.dtype_name for v in payload.graph.values if v.dtype_name in UNSUPPORTED_DATATYPES}
    )
    s.validate_payload(payload, named_data)
    if kinds:
        raise BackendUnavailableError(
            f"XNNPACK payload {payload.path} uses datatype(s) ptexec cannot run: {', '.join(kinds)}"
        )
    return GraphEmitter(payload, named_data, args, torch.device(device), EMITTERS, traced).build()
