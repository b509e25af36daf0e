"""The generator's state and the rules every node shares: names bound into the generated
code, how each value is carried and read, how a result becomes a node's output, the
delegate's inputs and outputs, int8 weights and requantization, and :meth:`GraphEmitter.build`,
which runs the passes, calls each node's emitter (a table from node type to function, the
families in ``emit_*.py``) and compiles the statements into an :class:`~.runner.XnnRunner`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ...codegen import Sources
from ...errors import BackendUnavailableError, PteFormatError
from . import quant as qa
from . import schema as s
from .constants import Constants
from .node_types import ELEMENTWISE
from .passes import fuse_clamps, lookup_table_regions
from .run_helpers import HELPERS
from .runner import XnnRunner, timed_source
from .values import FLOAT_DTYPES, QUANTIZED_CONSTANT_TYPES, STATIC_QUANT_RANGES, ArgInfo, Carried

__all__ = ["GraphEmitter", "NodeEmitter"]


def _float32_reciprocal(scale: float) -> float:
    """1 / scale, computed in float32 as XNNPACK and PyTorch's quantizers compute it."""
    return qa.f32(1.0 / qa.f32(scale))


class GraphEmitter:
    """Turns one payload's graph into the statements of one function (:meth:`build`)."""

    def __init__(
        self,
        payload: s.XnnPayload,
        named_data: Mapping[str, memoryview],
        args: Sequence[ArgInfo | None],
        device: torch.device,
        emitters: Mapping[str, NodeEmitter],
        traced: bool = False,
    ) -> None:
        self.payload = payload
        self.emitters = emitters
        self.traced = traced
        self.graph = payload.graph
        self.path = payload.path
        self.args = args
        self.device = device
        self.consts = Constants(payload, named_data, device)
        self.lines: list[str] = []
        self.env: dict[str, Any] = dict(HELPERS)
        self.expr: dict[int, str] = {}
        self.carried_as: dict[int, Carried] = {}
        # per-token quantized values not computed yet: value -> (float source, nonbatch dims)
        self.pending_qd: dict[int, tuple[str, int]] = {}
        self.qd_rows_made: dict[tuple[str, int], str] = {}  # (float source, nonbatch) -> rows
        self.qd_values_made: dict[tuple[str, int], str] = {}  # ... -> their dequantized values
        self.dequantized: dict[int, str] = {}  # static quantized value -> its dequantized values
        self.shapes: dict[int, tuple[int, ...]] = {}  # dims computed from the input's
        # expressions of NHWC values whose memory is NCHW (the partitioner's transpose of a
        # channels-first input, the result of a direct convolution), and the
        # channels-last copies made of them for the nodes that want one
        self.nchw_memory: set[str] = set()
        self.channels_last_copies: dict[str, str] = {}
        self._bound = 0
        # every piece of generated code: the graph, its timed variant, the lookup tables
        self.sources = Sources(f"xnnpack {self.path}")

    # -- names -------------------------------------------------------------------------
    def bind(self, obj: Any, hint: str = "k") -> str:
        self._bound += 1
        name = f"_{hint}{self._bound}"
        self.env[name] = obj
        return name

    def emit(self, code: str) -> None:
        self.lines.append(code)

    def fail(self, node: s.XnnNode, msg: str) -> PteFormatError:
        return PteFormatError(f"{self.path}.xnodes[{node.index}].{node.type}", msg)

    def value(self, vid: int) -> s.XnnValue:
        return self.graph.by_id[vid]

    # -- how values are carried -----------------------------------------------------------
    def carried_form(self, v: s.XnnValue) -> Carried:
        name = v.dtype_name
        if name in FLOAT_DTYPES:
            return Carried("float", FLOAT_DTYPES[name])
        if name in STATIC_QUANT_RANGES:
            q = v.quant
            if not isinstance(q, s.PerTensorQuant):
                raise PteFormatError(
                    f"{self.path}.xvalues[{v.index}]", f"{name} value without per-tensor parameters"
                )
            lo, hi = STATIC_QUANT_RANGES[name]
            if not (q.scale > 0 and math.isfinite(q.scale)):
                raise PteFormatError(
                    f"{self.path}.xvalues[{v.index}].quant_params.scale",
                    f"{q.scale} is not a positive finite scale",
                )
            if not lo <= q.zero_point <= hi:
                raise PteFormatError(
                    f"{self.path}.xvalues[{v.index}].quant_params.zero_point",
                    f"{q.zero_point} outside [{lo}, {hi}]",
                )
            return Carried("q", torch.float32, q.scale, q.zero_point, lo, hi)
        if name == "qdint8":
            return Carried("qd", torch.float32)
        if name == "int32":
            return Carried("int", torch.int32)
        if name in QUANTIZED_CONSTANT_TYPES:  # weights and biases: constants, dequantized at load
            return Carried("float", torch.float32)
        raise BackendUnavailableError(f"XNNPACK values of datatype {name} are not supported")

    def carried(self, vid: int) -> Carried:
        r = self.carried_as.get(vid)
        if r is None:
            r = self.carried_form(self.value(vid))
            self.carried_as[vid] = r
        return r

    def as_float(self, vid: int, dtype: torch.dtype | None = None) -> str:
        """A float expression for value ``vid``: constants bound at load (cast to
        ``dtype``), static quantized values dequantized (once), per-token quantized ones
        quantized and dequantized (once)."""
        v = self.value(vid)
        if v.is_constant:
            return self.bind(self.consts.value(v, dtype), "c")
        r = self.carried(vid)
        if r.kind == "q":
            d = self.dequantized.get(vid)
            if d is None:
                d = self.dequantized[vid] = f"d{vid}"
                src = self.as_carried(vid)
                self.emit(f"{d} = {src} * {qa.f32(r.scale)!r}")
                if src in self.nchw_memory:
                    self.nchw_memory.add(d)
            return d
        e = self.expr.get(vid)
        if e is None and vid in self.pending_qd:
            src = self.pending_qd[vid][0]
            e = self.qd_values_made.get(self.pending_qd[vid])
            if e is None:  # once per source, whichever Convert made the value
                e = self.qd_values_made[self.pending_qd[vid]] = f"t{vid}"
                self.emit(f"{e} = _qd_values({self.qd_rows(vid)}, {src}.shape, {src}.dtype)")
            self.expr[vid] = e
        if e is None:  # validation guarantees order; this is a defect of ours
            raise AssertionError(f"value {vid} used before it is computed")
        return e

    def as_carried(self, vid: int) -> str:
        """The value as carried: centered integers for a static quantized value (constants
        too), else as :meth:`x`."""
        v = self.value(vid)
        if self.carried(vid).kind != "q":
            return self.as_float(vid)
        if v.is_constant:
            return self.bind(self.consts.centered(v), "c")
        e = self.expr.get(vid)
        if e is None:
            raise AssertionError(f"value {vid} used before it is computed")
        return e

    def qd_rows(self, vid: int, nonbatch: int | None = None) -> str:
        """The per-row quantization (q, zero point, scale) of a per-token quantized value,
        computed once for each distinct float source, whichever Convert made it; rows of
        the trailing ``nonbatch`` dims when given (else the Convert's)."""
        src, k = self.pending_qd[vid]
        if nonbatch is not None:
            k = nonbatch
        name = self.qd_rows_made.get((src, k))
        if name is None:
            name = self.qd_rows_made[(src, k)] = f"qr{len(self.qd_rows_made)}"
            self.emit(f"{name} = _qd8({src}, {k})")
        return name

    def compute_dtype(self, node: s.XnnNode) -> torch.dtype:
        for vid in node.inputs:
            v = self.value(vid)
            if not v.is_constant:
                r = self.carried(vid)
                if r.kind != "int":
                    return r.dtype
        return self.carried(node.outputs[0]).dtype

    def dims(self, vid: int) -> tuple[int, ...]:
        """A value's dims as the graph computes them: a Convert's output has its input's
        (the serialized dims of a per-batch quantized convolution input are those of the
        NCHW tensor it was made from; XNNPACK recomputes them from the input)."""
        return self.shapes.get(vid) or self.value(vid).dims

    # -- outputs of nodes ----------------------------------------------------------------
    def qbounds(self, r: Carried, lo: float, hi: float) -> tuple[int, int]:
        """A node's output bounds in centered integers: the type's range narrowed by its
        activation bounds, quantized as XNNPACK quantizes them."""
        qlo, qhi = r.qmin, r.qmax
        if lo != -math.inf:
            qlo = qa.quantize_bound(lo, r.scale, r.zp, r.qmin, r.qmax)
        if hi != math.inf:
            qhi = qa.quantize_bound(hi, r.scale, r.zp, r.qmin, r.qmax)
        if qhi < qlo:
            qhi = qlo
        return qlo - r.zp, qhi - r.zp

    def node_qbounds(self, node: s.XnnNode, vid: int | None = None) -> tuple[int, int]:
        r = self.carried(node.outputs[0] if vid is None else vid)
        return self.qbounds(r, node.output_min, node.output_max)

    def write_float(
        self, node: s.XnnNode, code: str, fresh: bool, vid: int | None = None, clamp: bool = True
    ) -> None:
        """Assign the float result ``code`` to the node's output, apply its output clamp,
        and quantize it when the output is static int8 (as XNNPACK's Convert does)."""
        vid = node.outputs[0] if vid is None else vid
        name = f"t{vid}"
        r = self.carried(vid)
        lo, hi = (node.output_min, node.output_max) if clamp else (-math.inf, math.inf)
        if r.kind == "q":
            qlo, qhi = self.qbounds(r, lo, hi)
            fq = "_fq_" if fresh else "_fq"
            self.emit(f"{name} = {fq}({code}, {_float32_reciprocal(r.scale)!r}, {qlo}, {qhi})")
        else:
            self.emit(f"{name} = {code}")
            bounds = []
            if lo != -math.inf:
                bounds.append(f"min={lo!r}")
            if hi != math.inf:
                bounds.append(f"max={hi!r}")
            if bounds:
                if fresh:
                    self.emit(f"{name}.clamp_({', '.join(bounds)})")
                else:
                    self.emit(f"{name} = {name}.clamp({', '.join(bounds)})")
        self.expr[vid] = name

    def write_carried(
        self, node: s.XnnNode, code: str, fresh: bool, vid: int | None = None
    ) -> None:
        """Assign ``code``, already in the output's representation (centered integers for
        a static quantized output), and apply the node's output clamp in it."""
        vid = node.outputs[0] if vid is None else vid
        r = self.carried(vid)
        if r.kind != "q":
            self.write_float(node, code, fresh, vid)
            return
        name = f"t{vid}"
        self.emit(f"{name} = {code}")
        if node.has_clamp:
            qlo, qhi = self.node_qbounds(node, vid)
            if fresh:
                self.emit(f"{name}.clamp_({qlo}, {qhi})")
            else:
                self.emit(f"{name} = {name}.clamp({qlo}, {qhi})")
        self.expr[vid] = name

    def same_q(self, a: int, b: int) -> bool:
        """Both values carried alike: float, or static quantized with equal parameters."""
        ra, rb = self.carried(a), self.carried(b)
        if ra.kind == "q" or rb.kind == "q":
            return (ra.kind, ra.scale, ra.zp, ra.qmin) == (rb.kind, rb.scale, rb.zp, rb.qmin)
        return True

    def alias(self, node: s.XnnNode, make: Callable[[str], str]) -> None:
        """An output that only moves data (``make`` builds it from the input expression):
        the values as they are, requantized only when the parameters differ."""
        src, vid = node.inputs[0], node.outputs[0]
        if self.same_q(src, vid):
            self.write_carried(node, make(self.as_carried(src)), fresh=False)
        else:
            self.write_float(node, make(self.as_float(src)), fresh=False)

    # -- regions of int8 elementwise nodes -------------------------------------------------
    def emit_lookup_table(self, region: tuple[int, int, list[s.XnnNode]]) -> None:
        """Nodes whose result depends only on one int8 value, element by element (a
        dequantize, a float function, a requantize, a product with the input itself, ...):
        their own code is run once at load on the 256 possible inputs, and the region
        becomes one lookup in that table. The same float operations, so the same result."""
        root, exit_, nodes = region
        r = self.carried(root)
        saved = (self.lines, dict(self.expr), dict(self.dequantized))
        self.lines = []
        self.expr[root] = "_lut_x"
        self.dequantized.pop(root, None)
        for n in nodes:
            self.node(n)
        result = self.as_carried(exit_)
        body = self.lines
        self.lines, self.expr, self.dequantized = saved
        source = "def _lut_fn(_lut_x):\n" + "".join(f"    {line}\n" for line in body)
        source += f"    return {result}\n"
        lut_fn = self.sources.function(source, "lookup table", "_lut_fn", self.env)
        inputs = torch.arange(r.qmin, r.qmax + 1, dtype=torch.float32) - float(r.zp)
        with torch.no_grad():
            table = lut_fn(inputs.to(self.device))
        table = table.reshape(-1).to(torch.float32).contiguous()
        name = self.bind(table, "lut")
        self.emit(f"t{exit_} = _lut({self.as_carried(root)}, {name}, {float(r.zp - r.qmin)!r})")
        self.expr[exit_] = f"t{exit_}"

    # -- externals -----------------------------------------------------------------------
    def externals(self) -> tuple[list[s.XnnValue], list[s.XnnValue]]:
        ins = sorted((v for v in self.graph.values if v.is_input), key=lambda v: v.external_id)
        outs = sorted((v for v in self.graph.values if v.is_output), key=lambda v: v.external_id)
        for v in ins + outs:
            where = f"{self.path}.xvalues[{v.index}].external_id"
            if v.external_id >= len(self.args) or self.args[v.external_id] is None:
                raise PteFormatError(
                    where,
                    f"external id {v.external_id} is not a tensor argument of the delegate call ({len(self.args)} arguments)",
                )
            a = self.args[v.external_id]
            assert a is not None
            rank = len(a.dim_order)
            if rank != len(v.dims) and not (rank == 0 and v.dims in ((), (1,))):
                raise PteFormatError(
                    where, f"the value has {len(v.dims)} dims {list(v.dims)}, its tensor has {rank}"
                )
            self._check_dtype(v, a, where)
        return ins, outs

    def _check_dtype(self, v: s.XnnValue, a: ArgInfo, where: str) -> None:
        name = v.dtype_name
        if name not in ("fp32", "fp16", "bf16", "qint8", "quint8", "int32"):
            raise BackendUnavailableError(f"{where}: an external {name} value is not supported")
        ok: tuple[torch.dtype, ...] = {
            "fp32": (torch.float32,),
            "fp16": (torch.float16,),
            "bf16": (torch.bfloat16,),
            "qint8": (torch.int8,),
            "quint8": (torch.uint8,),
            "int32": (torch.int32,),
        }[name]
        if name == "fp32" and v.is_output and not v.is_input:
            ok = (torch.float32, torch.int64)  # argmax indices: int64 tensors in ExecuTorch
        if a.dtype not in ok:
            raise PteFormatError(
                where, f"a {name} value bound to a {str(a.dtype).removeprefix('torch.')} tensor"
            )

    def load_input(self, v: s.XnnValue) -> None:
        k = v.external_id
        a = self.args[k]
        assert a is not None
        x = f"x{k}"
        order = a.dim_order
        if order != tuple(range(len(order))):
            x = f"{x}.permute{order}"
        name = f"t{v.id}"
        if v.dq_datatype:
            if s.DATATYPES.get(v.dq_datatype, ("",))[0] != "qint8":
                raise BackendUnavailableError(
                    f"dynamic quantization of an input to {s.DATATYPES.get(v.dq_datatype)} is not supported"
                )
            # an older payload's input quantized per token as it enters: like a Convert
            self.carried_as[v.id] = Carried("qd", FLOAT_DTYPES.get(v.dtype_name, torch.float32))
            self.emit(f"f{v.id} = {x}")
            self.pending_qd[v.id] = (f"f{v.id}", 1)
            return
        r = self.carried(v.id)
        if r.kind == "q":
            self.emit(f"{name} = {x}.to(torch.float32) - {r.zp}")
        else:
            self.emit(f"{name} = {x}")
        if len(v.dims) and a.dim_order == ():
            self.emit(f"{name} = {name}.reshape({tuple(v.dims)!r})")
        self.expr[v.id] = name

    def store_output(self, v: s.XnnValue) -> None:
        k = v.external_id
        a = self.args[k]
        assert a is not None
        src = self.expr.get(v.id)
        if src is None:
            if v.is_input:
                src = self.expr[v.id]
            else:  # validated: every output is written
                raise AssertionError(f"output value {v.id} never computed")
        r = self.carried(v.id)
        if r.kind == "q" and not a.dtype.is_floating_point:
            src = f"({src} + {r.zp})"
        x = f"x{k}"
        order = a.dim_order
        if len(order) == 0:
            self.emit(f"{x}.copy_({src}.reshape(()))")
            return
        tmp = f"y{k}"
        info = self.bind(a, "a")  # what the program declares: checked before resizing
        self.emit(f"{tmp} = {src}")
        if order == tuple(range(len(order))):
            self.emit(f"if {x}.shape != {tmp}.shape:")
            self.emit(f"    _resize({x}, {tmp}.shape, {order!r}, {info}, {k})")
            self.emit(f"{x}.copy_({tmp})")
        else:
            self.emit(f"{x}p = {x}.permute{order}")
            self.emit(f"if {x}p.shape != {tmp}.shape:")
            self.emit(f"    _resize({x}, {tmp}.shape, {order!r}, {info}, {k})")
            self.emit(f"    {x}p = {x}.permute{order}")
            self.emit(f"{x}p.copy_({tmp})")

    # -- the graph -----------------------------------------------------------------------
    def build(self) -> XnnRunner:
        ins, outs = self.externals()
        ext_ids = tuple(sorted({v.external_id for v in ins + outs}))
        for v in ins:
            self.load_input(v)
        counts: dict[str, int] = {}
        for node in self.graph.nodes:
            counts[node.type] = counts.get(node.type, 0) + 1
        nodes = fuse_clamps(self.graph)
        tables = lookup_table_regions(self.graph, nodes, self.carried)
        spans: list[tuple[str, int, int]] = []  # (node name, its first line, past its last)
        seen: dict[str, int] = {}

        def named(kind: str) -> str:
            seen[kind] = seen.get(kind, 0) + 1
            return f"{kind} #{seen[kind]}"

        for i, node in enumerate(nodes):
            first = len(self.lines)
            if i not in tables:
                self.node(node)
                spans.append((named(node.type), first, len(self.lines)))
                continue
            region = tables[i]
            if region is not None:  # the last node of a region: one table lookup
                self.emit_lookup_table(region)
                kinds = "+".join(n.type for n in region[2])
                spans.append((named(f"Lookup table ({kinds})"), first, len(self.lines)))
        for v in outs:
            self.store_output(v)
        params = ", ".join(f"x{k}" for k in ext_ids)
        body = self.lines or ["pass"]
        source = f"def _xnnpack_run({params}):\n" + "".join(f"    {line}\n" for line in body)
        sources = self.sources
        fn = sources.function(source, "graph", "_xnnpack_run", self.env)
        out_ids = tuple(sorted(v.external_id for v in outs))
        timed = timed_source(self.lines, spans, params)
        return XnnRunner(
            fn,
            source,
            ext_ids,
            counts,
            out_ids,
            lambda: sources.function(timed, "graph, timed per node", "_xnnpack_nodes", self.env),
        )

    def node(self, n: s.XnnNode) -> None:
        """Emit the statements of one node (its family's emitter), and keep track of the
        memory layout of an elementwise result."""
        self.emitters[n.type](self, n)
        if n.type in ELEMENTWISE and n.outputs[0] in self.expr:
            # an elementwise result keeps the memory layout of its (first) input
            first = next((v for v in n.inputs if not self.value(v).is_constant), None)
            if first is not None and self.expr.get(first) in self.nchw_memory:
                self.nchw_memory.add(self.expr[n.outputs[0]])

    def channels_last(self, x: str) -> str:
        """``x`` (an NHWC expression) in channels-last (contiguous NHWC) memory: itself, or
        one copy made where it is first needed."""
        if x not in self.nchw_memory:
            return x
        name = self.channels_last_copies.get(x)
        if name is None:
            name = self.channels_last_copies[x] = f"cl{len(self.channels_last_copies)}"
            self.emit(f"{name} = {x}.contiguous()")
        return name

    def mark_nchw_memory(self, vid: int) -> None:
        e = self.expr.get(vid)
        if e is not None:
            self.nchw_memory.add(e)

    def expect_dims(self, n: s.XnnNode, expected: dict[int, int]) -> None:
        """The output's serialized dims agree with what the node computes from its input's
        (XNNPACK checks the same when it defines the node)."""
        dims = self.value(n.outputs[0]).dims
        for i, want in expected.items():
            if i >= len(dims) or dims[i] != want:
                raise self.fail(
                    n, f"output dims {list(dims)}, the node computes {want} for dim {i}"
                )

    def check_flags(self, n: s.XnnNode, allowed: int) -> None:
        if n.flags & ~allowed:
            raise BackendUnavailableError(
                f"XNNPACK {n.type} node {n.index} has flags {n.flags:#x} that ptexec does not support"
            )

    def rank(self, n: s.XnnNode, vid: int, want: int) -> None:
        dims = self.dims(vid)
        if len(dims) != want:
            raise self.fail(n, f"value {vid} has {len(dims)} dims {list(dims)}, expected {want}")

    # -- static int8 arithmetic ----------------------------------------------------------
    def all_qs8(self, vids: Sequence[int]) -> bool:
        return all(self.carried(v).is_qs8 for v in vids)

    def write_bounded(self, n: s.XnnNode, code: str) -> None:
        """A centered result that already carries the node's output bounds."""
        vid = n.outputs[0]
        self.emit(f"t{vid} = {code}")
        self.expr[vid] = f"t{vid}"

    def int8_weights(
        self, n: s.XnnNode, channel_dim: int, channels: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """For a node whose input and output are static int8 and whose filter is int8
        (per tensor, or per channel along ``channel_dim``): (integer weights as float32
        in XNNPACK's dims, one float32 requantization scale per output channel, the int32
        bias as float32 or None). None when the node is not of that kind."""
        src, o = n["input1_id"], n.outputs[0]
        if not self.all_qs8((src, o)) or self.value(src).is_constant:
            return None
        fv = self.value(n["filter_id"])
        q = fv.quant
        if not fv.is_constant:
            return None
        if not 0 <= channel_dim < len(fv.dims) or fv.dims[channel_dim] != channels:
            raise self.fail(n, f"filter dims {list(fv.dims)} for {channels} output channels")
        if fv.dtype_name == "qint8" and isinstance(q, s.PerTensorQuant):
            w = self.consts.ints(fv).to(torch.float32) - float(q.zero_point)
            wscale = torch.full((channels,), q.scale, dtype=torch.float32)
        elif (
            fv.dtype_name == "qcint8"
            and isinstance(q, s.PerChannelQuant)
            and q.channel_dim == channel_dim
            and q.num_scales in (channels, 0)
        ):
            w = self.consts.ints(fv).to(torch.float32)
            wscale = self.consts.scales(q).reshape(-1)
            if wscale.numel() != channels:
                raise self.fail(n, f"{wscale.numel()} filter scales for {channels} channels")
        else:
            return None
        bias = None
        bid = n["bias_id"]
        if bid is not None:
            bv = self.value(bid)
            if not bv.is_constant or bv.dtype_name not in ("qint32", "qcint32"):
                return None
            bias = self.consts.ints(bv).reshape(-1)  # int32: exact in float64
            if bias.numel() != channels:
                raise self.fail(n, f"bias of {bias.numel()} values for {channels} channels")
        scale = qa.requant_scales(self.carried(src).scale, wscale, self.carried(o).scale)
        return w, scale, bias

    def exact_in_float32(
        self, n: s.XnnNode, w: torch.Tensor, channel_dim: int, bias: torch.Tensor | None
    ) -> bool:
        """Whether float32 accumulation is exact for this node (see :mod:`.quant`). Off the
        CPU never: cuDNN may convolve by FFT or Winograd transforms, which are not exact
        on integers; float64 keeps their error far below a rounding step."""
        if self.device.type != "cpu":
            return False
        r = self.carried(n["input1_id"])
        amax = max(r.zp - r.qmin, r.qmax - r.zp)
        other = [d for d in range(w.dim()) if d != channel_dim]
        wsum = float(w.abs().sum(dim=other).max()) if w.numel() else 0.0
        bmax = float(bias.double().abs().max()) if bias is not None and bias.numel() else 0.0
        return qa.exact_in_float32(wsum, amax, bmax)

    def requantize_output(
        self, n: s.XnnNode, acc: str, scale: torch.Tensor, nchw: str | None = None
    ) -> None:
        """Requantize an exact accumulator (NHWC, or [..., channels]) into the output; with
        ``nchw``, the same accumulator as an NCHW tensor, requantized in that layout."""
        lo, hi = self.node_qbounds(n)
        if nchw is not None:
            sname = self.bind(scale.reshape(-1, 1, 1).to(self.device), "s")
            self.write_bounded(n, f"_rq({nchw}, {sname}, {lo}, {hi}).permute(0, 2, 3, 1)")
            return
        sname = self.bind(scale.to(self.device), "s")
        self.write_bounded(n, f"_rq({acc}, {sname}, {lo}, {hi})")


NodeEmitter = Callable[[GraphEmitter, s.XnnNode], None]
"""Emits one node's statements (``emitter(g, node)``)."""
