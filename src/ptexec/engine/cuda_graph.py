"""Run a static CUDA method as one captured CUDA graph.

``load_method(..., cuda_graph=True)`` chooses :class:`CudaGraphRunner` as the method's
runner: it captures the method's blocks once, at the first call, and replays them on
every call after: one launch instead of one per kernel. The placement rules still hold at
the graph's fixed addresses:

- a planned input is copied into its planned view (as always);
- an unplanned input is shared when the caller passes the tensor the graph was captured
  with (same data pointer and strides), and otherwise copied into that captured tensor,
  counted as a copy: a graph reads fixed addresses, so it cannot read a new caller buffer;
- outputs are read from the graph's memory (copied out by default, as always); an ``out=``
  tensor for an unplanned output receives a copy (``direct_outputs`` is False).

A method qualifies when everything it touches is on one CUDA device, every shape is
static, and nothing is decided on the host per call (no jumps, no scalar computed by an
instruction, no delegate). Capture runs the method a few times to warm up kernels; the
planned memory is saved before and restored after, so program state is not advanced.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ExecutionError
from ..format import program as p
from ..loader.state import MethodState
from .runner import BlockRunner

__all__ = ["CudaGraphRunner", "check_capturable"]

_WARMUP = 3


def check_capturable(state: MethodState) -> torch.device:
    """The CUDA device of the method; raises ValueError saying why it cannot be captured."""
    why = f"'{state.name}' cannot run as a CUDA graph"
    devices = {b.info.device for b in state.buffers}
    for spec in state.inputs:
        if spec.info is not None:
            devices.add(spec.info.device)
    for out in state.outputs:
        if out.info is not None and out.info.device is not None:
            devices.add(out.info.device)
    if len(devices) != 1 or next(iter(devices)).is_cpu:
        names = ", ".join(sorted(str(d) for d in devices)) or "none"
        raise ValueError(f"{why}: it must live on one CUDA device (it uses {names})")
    for chain in state.chains:
        for ins in chain.instructions:
            if isinstance(ins, p.JumpFalseCall):
                raise ValueError(f"{why}: it has control flow (jumps are decided on the host)")
            if isinstance(ins, p.DelegateCall):
                raise ValueError(f"{why}: it calls a delegate")
    for j, value in enumerate(state.plan.values):
        if isinstance(value, p.Tensor) and value.shape_dynamism != p.STATIC:
            raise ValueError(f"{why}: value {j} has a dynamic shape")
    if state.dynamic_scalars:
        raise ValueError(f"{why}: instructions compute scalars on the host")
    (device,) = devices
    return device.to_torch()


class CudaGraphRunner:
    """Captures the method's blocks at the first call and replays them afterwards."""

    direct_outputs = False

    def __init__(self, state: MethodState) -> None:
        self.device = check_capturable(state)
        self.state = state
        self.blocks = BlockRunner(state)  # warm-up and capture run the plain blocks
        self.blocks.prepare()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[int, torch.Tensor] = {}  # slot -> captured input tensor

    def bind(self, state: MethodState) -> None:
        """After binding: unplanned inputs move to (or are) the captured tensors."""
        v = state.values
        rec = state.record
        for spec in state.inputs:
            if spec.kind != "tensor" or spec.view is not None:
                continue
            x = v[spec.slot]
            static = self.static.get(spec.slot)
            if static is None:
                static = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=self.device)
                self.static[spec.slot] = static
            if x.data_ptr() == static.data_ptr() and x.stride() == static.stride():
                continue
            static.copy_(x)
            rec.count(x, static, x.nbytes)
            rec.inputs[spec.index] = "copy"
            v[spec.slot] = static

    def run(self, v: list[Any]) -> None:
        try:
            if self.graph is None:
                self._capture(v)
            assert self.graph is not None
            self.graph.replay()
        except Exception as e:
            raise ExecutionError(
                self.state.name, -1, "cuda_graph", f"{type(e).__name__}: {e}"
            ) from e

    def source(self) -> str:
        """The blocks, captured at the first call and replayed after."""
        return (
            "# captured once as a CUDA graph at the first call, replayed on every call after\n"
            + self.blocks.source()
        )

    def _capture(self, v: list[Any]) -> None:
        buffers = self.state.buffers
        saved = [b.data.clone() for b in buffers]
        stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(_WARMUP):
                self.blocks.run(v)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.blocks.run(v)
        for b, data in zip(buffers, saved, strict=True):
            b.data.copy_(data)
        self.graph = graph
