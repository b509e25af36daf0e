"""The ``XnnpackBackend`` factory: one ``DelegateCall`` -> one statement calling a runner.

Two runners can run a payload. ptexec's own (:mod:`.runtime`) turns the graph into torch
code and runs on any device. ExecuTorch's XNNPACK backend (:mod:`.executorch_runner`)
runs it on the CPU with XNNPACK's kernels, when ``executorch`` is installed. The load
option ``xnnpack`` chooses (``Program.load_method(..., xnnpack=...)``):

- ``"torch"``: ptexec's runner;
- ``"executorch"``: ExecuTorch's backend, or :class:`~ptexec.errors.BackendUnavailableError`
  at load when it cannot run this delegate (not installed, a delegate off the CPU, an
  unbound dynamic shape, a payload ExecuTorch refuses);
- ``"auto"`` (the default): :data:`AUTO_RUNNER` where it can run, else ptexec's runner.

Whichever runs, the payload is checked against the program at load the same way: every
id, offset and size (:func:`.schema.validate_payload`), every external value against the
call's argument tensor (position, rank, dtype), and the output shapes the graph computes
from the program's static input shapes (:func:`.shapes.infer_dims`) against the output
tensors the program declares; a contradiction is a
:class:`~ptexec.errors.PteFormatError` naming the value. Outputs whose shapes depend on
dynamic inputs are checked after each call (an :class:`~ptexec.errors.ExecutionError`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...dtypes import CODE_TO_DTYPE
from ...errors import BackendUnavailableError, PteFormatError
from ...format import program as p
from ...format.lru import Key, Lru
from ...kernels.registry import Statement
from ..registry import DelegateContext, Renewing
from . import checked
from . import executorch_runner as et
from . import schema as s
from .checked import scales_key, structure_key
from .constants import Constants
from .executorch_runner import EtProgram, EtRunner, executorch_unavailable
from .node_types import UNARY
from .runtime import ArgInfo, build_runner
from .schema import decode_payload
from .shapes import Dims, infer_dims

__all__ = [
    "AUTO_RUNNER",
    "XNNPACK_RUNNERS",
    "check_externals",
    "check_output_shapes",
    "choose_runner",
    "prepare",
    "serialized_dims_problem",
]

XNNPACK_RUNNERS = ("auto", "torch", "executorch")
# what "auto" runs on the CPU when ExecuTorch can: see docs/xnnpack_runners.md
AUTO_RUNNER = "executorch"

# XNNPACK datatype of an external value -> the scalar types its tensor may have
_EXTERNAL_TYPES: dict[str, tuple[int, ...]] = {
    "fp32": (6,),
    "fp16": (5,),
    "bf16": (15,),
    "qint8": (1,),
    "quint8": (0,),
    "int32": (3,),
}


def _device(ctx: DelegateContext) -> torch.device:
    """Where the delegate's tensors live: the device of its first tensor argument (planned,
    preallocated, or an unplanned input the caller passes on the method's device)."""
    for slot in ctx.args:
        device = ctx.device_of(slot)
        if device is not None:
            return device.to_torch()
    return torch.device("cpu")


def _arg_tensors(ctx: DelegateContext, where: str) -> list[p.Tensor | None]:
    """The program's description of each argument (None: not a tensor)."""
    out: list[p.Tensor | None] = []
    for k, slot in enumerate(ctx.args):
        if not 0 <= slot < len(ctx.values):
            raise PteFormatError(f"{where}.args[{k}]", f"value index {slot} out of range")
        value = ctx.values[slot]
        out.append(value if isinstance(value, p.Tensor) else None)
    return out


def _arg_infos(tensors: list[p.Tensor | None], where: str) -> list[ArgInfo | None]:
    infos: list[ArgInfo | None] = []
    for k, t in enumerate(tensors):
        if t is None:
            infos.append(None)
            continue
        dtype = CODE_TO_DTYPE.get(t.scalar_type)
        if dtype is None:
            raise BackendUnavailableError(f"{where}: argument {k} has scalar type {t.scalar_type}")
        infos.append(
            ArgInfo(
                dtype,
                tuple(t.dim_order),
                tuple(t.sizes),
                t.shape_dynamism == p.STATIC,
                t.shape_dynamism == p.DYNAMIC_BOUND,
            )
        )
    return infos


def _physical(t: p.Tensor) -> Dims:
    """A tensor's sizes in its dim order: the dims XNNPACK sees."""
    return tuple(t.sizes[d] for d in t.dim_order)


def _describe(t: p.Tensor) -> str:
    dtype = CODE_TO_DTYPE.get(t.scalar_type)
    name = str(dtype).removeprefix("torch.") if dtype is not None else f"type {t.scalar_type}"
    return f"{name}{list(t.sizes)}"


def check_externals(payload: s.XnnPayload, tensors: list[p.Tensor | None]) -> None:
    """Every external value names a tensor argument of the call, of its rank and a dtype
    its datatype allows."""
    for v in payload.graph.values:
        if not (v.is_input or v.is_output):
            continue
        where = f"{payload.path}.xvalues[{v.index}].external_id"
        t = tensors[v.external_id] if v.external_id < len(tensors) else None
        if t is None:
            raise PteFormatError(
                where,
                f"external id {v.external_id} is not a tensor argument of the delegate call "
                f"({len(tensors)} arguments)",
            )
        rank = len(t.sizes)
        if rank != len(v.dims) and not (rank == 0 and v.dims in ((), (1,))):
            raise PteFormatError(
                where, f"the value has {len(v.dims)} dims {list(v.dims)}, its tensor has {rank}"
            )
        allowed = _EXTERNAL_TYPES.get(v.dtype_name)
        if allowed is None:
            raise BackendUnavailableError(f"{where}: an external {v.dtype_name} value")
        if v.dtype_name == "fp32" and v.is_output and not v.is_input:
            allowed = (6, 4)  # argmax indices: int64 tensors in ExecuTorch
        if t.scalar_type not in allowed:
            raise PteFormatError(where, f"a {v.dtype_name} value bound to a {_describe(t)} tensor")


def check_output_shapes(payload: s.XnnPayload, tensors: list[p.Tensor | None]) -> None:
    """The shapes the graph computes from the program's static inputs fit the output
    tensors the program declares (exactly when static; within the bound of every dim when
    dynamic). Outputs that depend on dynamic inputs are left to the call."""
    known: dict[int, Dims | None] = {}
    for v in payload.graph.values:
        if v.is_input:
            t = tensors[v.external_id]
            assert t is not None  # check_externals ran
            if t.shape_dynamism == p.STATIC:
                known[v.id] = _physical(t) if t.sizes else tuple(v.dims)
    dims = infer_dims(payload, known)
    for v in payload.graph.values:
        if not v.is_output or v.is_input:
            continue
        got = dims.get(v.id)
        t = tensors[v.external_id]
        assert t is not None
        if got is None or t.shape_dynamism == p.DYNAMIC_UNBOUND:
            continue
        want = _physical(t)
        where = f"{payload.path}.xvalues[{v.index}]"
        what = f"external output {v.external_id}"
        if not t.sizes:  # a 0-d tensor: one element in any XNNPACK dims
            if math.prod(got) != 1:
                raise PteFormatError(
                    where, f"the graph computes dims {list(got)} for {what}, a 0-d {_describe(t)}"
                )
            continue
        order = (
            ""
            if list(t.dim_order) == sorted(t.dim_order)
            else f" (in dim order {list(t.dim_order)}: {list(want)})"
        )
        if len(got) != len(want):
            ok = False
        elif t.shape_dynamism == p.STATIC:
            ok = got == want
        else:
            ok = all(a <= b for a, b in zip(got, want, strict=True))
        if not ok:
            kind = "declares" if t.shape_dynamism == p.STATIC else "bounds it by"
            raise PteFormatError(
                where,
                f"the graph computes dims {list(got)} for {what}; the program {kind} "
                f"{_describe(t)}{order}",
            )


def choose_runner(choice: str, device: str, unavailable: str | None, where: str = "") -> str:
    """The runner for option ``choice`` on a delegate whose tensors are on ``device`` (a
    torch device type), ``unavailable`` saying why ExecuTorch's backend cannot run here
    (None: it can): ``"torch"`` or ``"executorch"``. ``"executorch"`` that cannot be
    honoured raises BackendUnavailableError; ``"auto"`` then takes ptexec's runner, as it
    does on every device but the CPU."""
    if choice not in XNNPACK_RUNNERS:
        raise ValueError(f"xnnpack must be one of {', '.join(XNNPACK_RUNNERS)}, not {choice!r}")
    if choice == "torch" or (choice == "auto" and AUTO_RUNNER == "torch"):
        return "torch"
    reason = unavailable
    if device != "cpu":
        reason = (
            f"ExecuTorch's XNNPACK backend runs on the CPU; this delegate's tensors are on {device}"
        )
    if reason is None:
        return "executorch"
    if choice == "executorch":
        raise BackendUnavailableError(f"{where}: xnnpack='executorch': {reason}")
    return "torch"


def serialized_dims_problem(
    payload: s.XnnPayload, tensors: list[p.Tensor | None]
) -> PteFormatError | None:
    """The first value whose serialized dims differ from the dims the graph computes from
    the program's input tensors (their upper bounds, when dynamic), or None.

    XNNPACK defines each value with its serialized dims and sizes its memory by them, so
    dims that contradict the program (a hostile file's, say) are not handed to it.
    ExecuTorch's exporter writes exactly the computed dims, except the permuted dims of a
    dynamically quantized convolution input."""
    known: dict[int, Dims | None] = {}
    for v in payload.graph.values:
        if v.is_input:
            t = tensors[v.external_id]
            assert t is not None  # check_externals ran
            known[v.id] = _physical(t) if t.sizes else tuple(v.dims)
    dims = infer_dims(payload, known)
    for v in payload.graph.values:
        if v.is_constant or v.is_input:
            continue
        got = dims.get(v.id)
        if got is not None and tuple(v.dims) != got:
            if v.dtype_name == "qdint8" and sorted(v.dims) == sorted(got):
                # the exporter writes a dynamically quantized convolution input with the
                # NCHW dims of the tensor it was made from; XNNPACK takes its input's
                # shape, and the memory is the same size
                continue
            return PteFormatError(
                f"{payload.path}.xvalues[{v.index}].dims",
                f"{list(v.dims)}, but the graph computes {list(got)} from the program's inputs",
            )
    return None


_WEIGHTED = ("Conv2d", "DepthwiseConv2d", "ConvTranspose2d", "FullyConnected")
_STATIC_Q = ("qint8", "quint8")
_CONV_RANGE = (2.0**-32, 256.0)  # input * filter / output scale: XNNPACK's requantization
_RATIO_RANGE = (2.0**-8, 2.0**8)  # input / output scale of other quantized nodes


_NORMAL = 2.0**-126  # the least positive normal float32


def _scale_problem(v: s.XnnValue, scales: torch.Tensor) -> str | None:
    if scales.numel():
        # one pass for both ends; a NaN anywhere makes both NaN (aminmax propagates it),
        # and NaN compares false
        lo, hi = (float(x) for x in torch.aminmax(scales))
        if not (lo > 0.0 and hi < math.inf):
            return "a scale that is not a finite positive number"
        if lo < _NORMAL:
            return "a subnormal scale"
    q = v.quant
    if (
        isinstance(q, s.PerTensorQuant)
        and v.dtype_name == "qint8"
        and not -128 <= q.zero_point <= 127
    ):
        return f"zero point {q.zero_point} outside int8"
    if (
        isinstance(q, s.PerTensorQuant)
        and v.dtype_name == "quint8"
        and not 0 <= q.zero_point <= 255
    ):
        return f"zero point {q.zero_point} outside uint8"
    return None


def quantization_problem(payload: s.XnnPayload, named_data: Mapping[str, memoryview]) -> str | None:
    """Why XNNPACK itself would refuse the payload's quantization parameters, or None.

    XNNPACK refuses, when it creates its operators, scales that are not positive normal
    numbers and requantization scales outside the ranges its kernels compute in
    (``input * filter / output`` of a convolution or fully connected node in
    ``[2**-32, 256)``); ExecuTorch's runtime then fails in a way that takes the process
    down, so such a payload is not handed to it. Other quantized nodes are held to
    input/output scale ratios in ``[2**-8, 2**8)``, inside every range XNNPACK accepts
    for them (real networks sit near 1)."""
    static = (s.PerTensorQuant, s.PerChannelQuant, s.PerChannelGroupQuant)
    if not any(isinstance(v.quant, static) for v in payload.graph.values):
        return None  # no scale to check (a float graph, or one quantizing inputs per token)
    consts = Constants(payload, named_data, torch.device("cpu"))
    scales: dict[int, torch.Tensor] = {}  # as stored (a float32 holds each exactly)
    for v in payload.graph.values:
        q = v.quant
        if isinstance(q, s.PerTensorQuant):
            scales[v.id] = torch.tensor([q.scale], dtype=torch.float64)
        elif isinstance(q, s.PerChannelQuant | s.PerChannelGroupQuant):
            scales[v.id] = consts.stored_scales(q)
        else:
            continue
        problem = _scale_problem(v, scales[v.id])
        if problem is not None:
            return f"xvalues[{v.index}] has {problem}"
    if not any(v.dtype_name in _STATIC_Q for v in payload.graph.values):
        return None  # no node requantizes (the 4-bit linears of an LLM: float outputs)
    values = {v.id: v for v in payload.graph.values}
    for n in payload.graph.nodes:
        outs = [values[o] for o in n.outputs if o in values]
        if len(outs) != 1 or outs[0].dtype_name not in _STATIC_Q or outs[0].id not in scales:
            continue
        out_scale = scales[outs[0].id].double()  # the ratios in double precision
        ins = [values[i] for i in n.inputs if i in values and i in scales]
        if n.type in _WEIGHTED and len(ins) >= 2:
            ratio = scales[ins[0].id].double() * scales[ins[1].id].double() / out_scale
            lo, hi = _CONV_RANGE
        else:
            statics = [v for v in ins if v.dtype_name in _STATIC_Q]
            if not statics:
                continue
            ratio = torch.cat([scales[v.id].double() for v in statics]) / out_scale
            lo, hi = _RATIO_RANGE
        if not bool(((ratio >= lo) & (ratio < hi)).all()):
            worst = float(ratio.max() if bool((ratio >= hi).any()) else ratio.min())
            return (
                f"xnodes[{n.index}] ({n.type}) requantizes by {worst:.3g}, outside "
                f"[{lo:.3g}, {hi:.3g})"
            )
    return None


def _where(ctx: DelegateContext) -> str:
    method = ctx.method_name
    if method:  # a program may name a method anything; paths name it legibly
        method = method.replace("\0", "\\x00")
    return (
        f"{method}.delegates[{ctx.delegate_index}]"
        if method
        else f"delegates[{ctx.delegate_index}]"
    )


def prepare(ctx: DelegateContext) -> Statement:
    """Decode, validate and prepare the payload with the chosen runner; emit
    ``_run(v[a], v[b], ...)``."""
    where = _where(ctx)
    choice = ctx.options.get("xnnpack", "auto")
    st = _renewed(ctx, choice, where)
    if st is not None:
        return st
    payload = decode_payload(ctx.processed, f"{where}.payload")
    tensors = _arg_tensors(ctx, where)
    device = _device(ctx)
    if choice != "torch":
        unavailable = executorch_unavailable() if device.type == "cpu" else None
        if choose_runner(choice, device.type, unavailable, where) == "executorch":
            return _prepare_executorch(ctx, payload, tensors, where, choice)
    check_externals(payload, tensors)
    return _prepare_torch(ctx, payload, tensors, where, device)


def _prepare_torch(
    ctx: DelegateContext,
    payload: s.XnnPayload,
    tensors: list[p.Tensor | None],
    where: str,
    device: torch.device,
) -> Statement:
    """ptexec's runner (:mod:`.runtime`)."""
    runner = build_runner(payload, ctx.named_data, _arg_infos(tensors, where), device)
    check_output_shapes(payload, tensors)
    name = ctx.bind(runner.fn, "xnnpack")
    timed = ctx.bind(runner.run_nodes, "xnnpack_nodes")
    args = ", ".join(f"v[{ctx.args[k]}]" for k in runner.ext_ids)
    outs = tuple(ctx.args[k] for k in runner.output_ids)
    # the outputs are written in place (resized first) and never read; tools' instrumented
    # blocks run the same statements timed per node, reported to their hooks
    return ctx.emit(
        f"{name}({args})",
        mutates=outs,
        outs=outs,
        instrumented=ctx.node_timed(name, timed, args),
    )


def miscomputed(payload: s.XnnPayload) -> str | None:
    """Why ExecuTorch's XNNPACK backend would compute the payload wrongly, or None.

    A fully connected node that quantizes its input per row (``qdint8``) against 4-bit
    weights per output channel (``qcint4``), over an odd number of input channels: with
    ExecuTorch 1.5.1's backend, every row but the first comes out wrong (eight equal rows
    give eight different results), while eager PyTorch and ptexec's own runner agree. Such
    a payload is not handed to it."""
    values = {v.id: v for v in payload.graph.values}
    for n in payload.graph.nodes:
        if n.type != "FullyConnected" or len(n.inputs) < 2:
            continue
        x, w = values.get(n.inputs[0]), values.get(n["filter_id"])
        if x is None or w is None or len(w.dims) != 2:
            continue
        if x.dtype_name != "qdint8" or w.dtype_name != "qcint4":
            continue
        channels = w.dims[0] if n.flags & s.FLAG_TRANSPOSE_WEIGHTS else w.dims[1]
        if channels % 2:
            return (
                f"xnodes[{n.index}] multiplies per-row int8 inputs by 4-bit weights over "
                f"{channels} input channels, an odd number, which ExecuTorch's XNNPACK "
                "backend computes wrongly"
            )
    return None


# elementwise nodes XNNPACK runs as one unary operator, which computes its output in its
# input's datatype (a Convert is the node that changes it)
_KEEPS_DATATYPE = frozenset(UNARY) | {"Clamp", "LeakyReLU", "ELU"}


def datatype_problem(payload: s.XnnPayload) -> str | None:
    """Why XNNPACK would refuse a node's datatypes, or None: an elementwise node of
    :data:`_KEEPS_DATATYPE` whose output's datatype is not its input's (a Cos from fp32 to
    qint8). XNNPACK defines such a node and refuses to create its operator; ExecuTorch
    1.5.1's backend then frees part of the graph twice, and the process aborts."""
    by_id = payload.graph.by_id
    for n in payload.graph.nodes:
        if n.type not in _KEEPS_DATATYPE or len(n.inputs) != 1 or len(n.outputs) != 1:
            continue
        x, y = by_id.get(n.inputs[0]), by_id.get(n.outputs[0])
        if x is not None and y is not None and x.datatype != y.datatype:
            return f"xnodes[{n.index}] ({n.type}) computes {x.dtype_name} to {y.dtype_name}"
    return None


def _checked(
    payload: s.XnnPayload, named_data: Mapping[str, memoryview], tensors: list[p.Tensor | None]
) -> tuple[PteFormatError | None, str | None]:
    """Check ``payload`` against the call before ExecuTorch's backend gets it: raise on a
    defect; return the serialized dims problem (None: none) and, when there is none, why
    XNNPACK would refuse its quantization or a node's datatypes (:func:`datatype_problem`)
    or ExecuTorch's backend compute it wrongly (:func:`miscomputed`; None: none of them). Verdicts for the same graph,
    sizes, tensors and (a few kilobytes of) scales are kept (:mod:`.checked`); a defect or
    a dims problem is found afresh each time."""
    key = structure_key(payload, named_data, tensors)
    if key is None or checked.structures.get(key) is None:
        s.validate_payload(payload, named_data)
        check_externals(payload, tensors)
        check_output_shapes(payload, tensors)
        problem = serialized_dims_problem(payload, tensors)
        if problem is not None:
            return problem, None  # (not kept: it names this delegate's path)
        if key is not None:
            checked.structures.put(key, True)
    qkey = scales_key(key, payload, named_data) if key is not None else None
    refused = checked.scales.get(qkey) if qkey is not None else None
    if refused is None:
        refused = (
            quantization_problem(payload, named_data)
            or datatype_problem(payload)
            or miscomputed(payload),
        )
        if qkey is not None:
            checked.scales.put(qkey, refused)
    return None, refused[0]


def _planned(
    args: tuple[int, ...], initial: list[Any], tensors: Sequence[p.Tensor]
) -> list[torch.Tensor | None]:
    """Per argument (value ``args[k]``, described by ``tensors[k]``), the tensor loading
    made for it (``initial``: the values table as loading made it) when that is a static
    tensor in planned memory (which keeps its storage, offset, sizes and strides for the
    method's life: a failed call's restore gives them back) or a constant of the program
    (never written), else None."""
    out: list[torch.Tensor | None] = []
    for slot, t in zip(args, tensors, strict=True):
        made = initial[slot] if slot < len(initial) else None
        fixed = (
            t.shape_dynamism == p.STATIC
            and (t.allocation_info is not None or t.is_constant)
            and isinstance(made, torch.Tensor)
            and tuple(made.shape) == tuple(t.sizes)
        )
        out.append(made if fixed else None)
    return out


def _prepare_executorch(
    ctx: DelegateContext,
    payload: s.XnnPayload,
    tensors: list[p.Tensor | None],
    where: str,
    choice: str,
) -> Statement:
    """ExecuTorch's XNNPACK backend, after ptexec's own checks of the payload. When it
    cannot load the payload, ``choice`` ``"executorch"`` raises; otherwise ptexec's
    runner takes over."""
    strict = choice == "executorch"
    if payload.graph.unknown_nodes:
        index, code = payload.graph.unknown_nodes[0]
        raise BackendUnavailableError(
            f"XNNPACK payload {payload.path} uses unknown node type {code} (xnodes[{index}])"
        )
    problem, refused = _checked(payload, ctx.named_data, tensors)
    if problem is not None:
        if strict:
            raise problem
        return _prepare_torch(ctx, payload, tensors, where, torch.device("cpu"))
    if refused is not None:
        if strict:
            raise BackendUnavailableError(
                f"{where}: xnnpack='executorch': XNNPACK would refuse {payload.path}: {refused}"
            )
        return _prepare_torch(ctx, payload, tensors, where, torch.device("cpu"))
    bad = [k for k, t in enumerate(tensors) if t is None]
    if bad:
        if strict:
            raise BackendUnavailableError(
                f"{where}: xnnpack='executorch': argument {bad[0]} of the call is not a tensor"
            )
        return _prepare_torch(ctx, payload, tensors, where, torch.device("cpu"))
    args = [t for t in tensors if t is not None]
    outputs = sorted({v.external_id for v in payload.graph.values if v.is_output})
    try:
        program = et.program_of(
            payload, ctx.processed, args, ctx.compile_specs, ctx.named_data, outputs, where
        )
        runner = et.runner_of(program, where, _planned(ctx.args, ctx.initial, args))
    except BackendUnavailableError:
        if strict:
            raise
        return _prepare_torch(ctx, payload, tensors, where, torch.device("cpu"))
    kept = _keep_program(ctx, choice, program)
    ctx.when_unloaded(functools.partial(et.retire, runner, program))
    return _statement(ctx, runner, kept, choice)


# The one-delegate programs of the calls loading prepared for ExecuTorch's backend, by the
# call's place in its plan (a decoded plan is shared by the loads of the same program
# bytes, :mod:`ptexec.format.pte`) and the runner chosen; bounded by their bytes. A
# program's segments (the payloads, the named data) are not part of what the plan stands
# for, so a kept program is used only where the call's payload and named data are,
# byte for byte, those it was written with: then everything loading found about them
# (decoded graph, checks, written program, runner source) holds again, and a repeated
# load goes from the call's place to ExecuTorch's load of the same bytes.
KEPT_PROGRAMS = 4096
KEPT_PROGRAM_BYTES = 32 << 20


class _Form:
    """What the statement of a call on ExecuTorch's runner is, but for the runner: its
    code, instrumented code and the names they give the runner's two functions, and the
    values it writes and reads. A function of the call's place alone (its arguments, the
    plan's values and computed scalars, the runner's outputs), made by the first load
    and given to every later load of the call with that load's runner."""

    __slots__ = ("code", "instrumented", "name", "outputs", "outs", "reads", "timed")

    def __init__(self, st: Statement, name: str, timed: str, outputs: tuple[int, ...]) -> None:
        assert st.instrumented is not None and st.reads is not None
        self.code = st.code
        self.instrumented = st.instrumented
        self.name = name
        self.timed = timed
        self.outputs = outputs
        self.outs = st.outs
        self.reads = st.reads

    def statement(self, runner: EtRunner) -> Statement:
        """The statement of the call on ``runner``: the first load's, bound to it."""
        return Statement(
            self.code,
            {self.name: runner.fn, self.timed: runner.run_nodes},
            mutates=self.outs,
            outs=self.outs,
            reads=self.reads,
            instrumented=self.instrumented,
            external=runner,
            sized=True,
        )


class _Kept:
    """A call's kept program, and the form of its statement (None until one is made)."""

    __slots__ = ("form", "program", "values")

    def __init__(self, values: tuple[p.EValue, ...], program: EtProgram) -> None:
        self.values = values  # the plan's values, kept alive: their id stays theirs
        self.program = program
        self.form: _Form | None = None


_programs: Lru[_Kept] = Lru(KEPT_PROGRAMS, KEPT_PROGRAM_BYTES)


def clear_kept_programs() -> None:
    """Forget the kept one-delegate programs, and ExecuTorch's methods of them kept for
    later loads."""
    _programs.clear()
    et.clear_idle()


def _program_key(ctx: DelegateContext, choice: Any) -> Key | None:
    try:
        return Key(id(ctx.values), ctx.where, ctx.args, choice)
    except TypeError:  # an option that cannot be part of a key
        return None


def _keep_program(ctx: DelegateContext, choice: Any, program: EtProgram) -> _Kept | None:
    key = _program_key(ctx, choice)
    if key is None:
        return None
    kept = _Kept(ctx.values, program)
    _programs.put(key, kept, len(program.data))
    return kept


def _renewed(ctx: DelegateContext, choice: Any, where: str) -> Statement | None:
    """The statement of a call whose program was kept, made as a later load's renewal
    makes it (None: prepare it afresh). For a load that has no renewal for the call (a
    context the loader did not keep one for, or a renewal forgotten since)."""
    if choice == "torch" or _device(ctx).type != "cpu":
        return None
    key = _program_key(ctx, choice)
    if key is None:
        return None
    renewal = _Renewal(key, ctx, where, choice)
    unloaded = ctx.unloaded if ctx.unloaded is not None else []
    st = renewal(Renewing(ctx.processed, ctx.named_data, ctx.initial, unloaded))
    if st is not None:
        ctx.renew_with(renewal)
    return st


class _Renewal:
    """A later load's statement of a call on ExecuTorch's runner, left with the load
    that kept its program and made its statement's form (:meth:`DelegateContext.
    renew_with`), from the call's place alone. The kept program is looked up again (it
    may have been dropped), ExecuTorch's runner chosen again, and the payload and named
    data the load reads compared with the program's bytes; anything else (the device,
    options, the plan) is the same by the renewal's own key (:func:`_renewed` checks the
    device where there is none). None: the call is prepared afresh."""

    __slots__ = ("args", "choice", "key", "values", "where")

    def __init__(self, key: Key, ctx: DelegateContext, where: str, choice: Any) -> None:
        self.key = key
        self.values = ctx.values  # (its id is in the key: kept alive with the plan)
        self.args = ctx.args
        self.where = where
        self.choice = choice

    def __call__(self, later: Renewing) -> Statement | None:
        kept = _programs.get(self.key)
        if kept is None or kept.values is not self.values:
            return None
        program, form = kept.program, kept.form
        if form is None or form.outputs != program.outputs:
            return None
        if choose_runner(self.choice, "cpu", executorch_unavailable(), self.where) != "executorch":
            return None
        if not program.same_bytes(later.processed, later.named_data):
            return None
        planned = _planned(self.args, later.initial, program.tensors)
        try:
            runner = et.runner_of(program, self.where, planned)
        except BackendUnavailableError:
            return None
        later.unloaded.append(functools.partial(et.retire, runner, program))
        return form.statement(runner)


def _statement(
    ctx: DelegateContext, runner: EtRunner, kept: _Kept | None = None, choice: Any = None
) -> Statement:
    """``_run(v[a], v[b], ...)`` of ``runner``, ExecuTorch's backend on the call's tensors;
    for a kept call, its form is kept and later loads renew it (:class:`_Renewal`)."""
    outputs = runner.outputs
    key = _program_key(ctx, choice) if kept is not None else None
    if key is not None:
        ctx.renew_with(_Renewal(key, ctx, _where(ctx), choice))
    name = ctx.bind(runner.fn, "xnnpack")
    timed = ctx.bind(runner.run_nodes, "xnnpack_nodes")
    outs = tuple(ctx.args[k] for k in outputs)
    call = ", ".join(f"v[{slot}]" for slot in ctx.args)
    # sized: XNNPACK computes its outputs' shapes from its inputs' shapes alone (a static
    # output keeps its sizes; a dynamic one is resized to what XNNPACK computed)
    st = ctx.emit(
        f"{name}({call})",
        mutates=outs,
        outs=outs,
        instrumented=ctx.node_timed(name, timed, call),
        external=runner,
        sized=True,
    )
    if kept is not None:
        kept.form = _Form(st, name, timed, outputs)
    return st
