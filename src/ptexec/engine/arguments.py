"""A call's arguments: the caller's inputs and ``out=`` tensors in, the outputs out.

The call envelope (:class:`ptexec.Method`) runs these in order: :func:`check_inputs` and
:func:`check_out` validate everything the caller passed and write nothing;
:func:`bind_inputs` and :func:`bind_out` put it into the values table (sharing or copying
each input by the placement decision of :func:`ptexec.binding.decide`); after the run,
:func:`collect` returns the outputs and :func:`release` drops the caller's tensors from
the table. :attr:`MethodState.record` is filled in on the way.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from ..binding import Action, Policy, common_action, decide, fits_layout, shape_error, shape_test
from ..dtypes import dtype_name
from ..errors import ExecutionError, InputError, PtexecError
from ..loader.specs import InputSpec, OutputSpec
from ..loader.state import MethodState
from ..memory import resize_to
from ..readonly import from_numpy
from ..tensor import (
    DLPACK_IS_COPIED,
    DLPACK_READ_ONLY,
    TensorInfo,
    describe,
    dim_order_from_strides,
    dim_order_strides,
    subclass_hook,
    to_torch,
    to_torch_flagged,
)

_SLOT: Any = object()  # output_error: the value is the one in the output's slot

__all__ = [
    "BoundInputs",
    "OutputMode",
    "array_views",
    "bind_inputs",
    "bind_out",
    "check_inputs",
    "check_out",
    "collect",
    "float_fits",
    "float_tolerance",
    "held_outputs",
    "output_checks",
    "output_error",
    "output_memory",
    "planned_ranges",
    "release",
    "scalar_fits",
    "scalar_test",
]

OutputMode = Literal["copy", "view"]
BoundInputs = list[tuple[Action | None, Any]]  # per input: the action and the tensor (or value)

try:  # numpy's bool is not a Python bool (nor an int)
    from numpy import bool_ as _NP_BOOL
except ImportError:  # pragma: no cover
    _NP_BOOL = bool  # type: ignore[misc,assignment]

_DEFAULT = Policy()


def _is_numpy(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray | np.generic)


def _where(state: MethodState, i: int) -> str:
    return f"input {i} of '{state.name}'"


# --------------------------------------------------------------------------------------
# inputs


def check_inputs(
    state: MethodState, inputs: Sequence[Any], policy: Policy, default_policy: bool
) -> BoundInputs:
    """Validate every input; return (action, tensor-or-value) per input. Writes nothing.
    ``default_policy``: ``policy`` is the default one (the common case is checked first)."""
    specs = state.inputs
    if len(inputs) != len(specs):
        raise InputError(f"'{state.name}' takes {len(specs)} input(s), got {len(inputs)}")
    bound: BoundInputs = []
    for i, (spec, x) in enumerate(zip(specs, inputs, strict=True)):
        if spec.kind != "tensor":
            _check_scalar(state, i, spec, x)
            bound.append((None, x))
            continue
        # a torch tensor that already matches exactly
        if (
            type(x) is torch.Tensor
            and x.dtype is spec.dtype
            and spec.fast_shape is not None
            and not x.is_nested
            and x.shape == spec.fast_shape
            and x.device == spec.torch_device
            and x.layout is torch.strided
        ):
            assert spec.info is not None
            action = common_action(spec.info, x.is_contiguous())
            if action is Action.COPY or (
                action is Action.SHARE and default_policy and not _lazy(x)
            ):
                bound.append((action, x))
                continue
        bound.append(_judge(state, i, spec, x, policy))
    _check_written_apart(state, bound)
    return bound


# torch dtype -> numpy's (None: it has none), found once each (a method's load asks)
_NUMPY_DTYPES: dict[torch.dtype, Any] = {}


def _numpy_dtype(dtype: torch.dtype) -> Any:
    """The numpy dtype ``torch.from_numpy`` maps to ``dtype``; None for none (bfloat16,
    quantized types)."""
    try:
        return _NUMPY_DTYPES[dtype]
    except KeyError:
        pass
    try:
        found = torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):
        found = None
    _NUMPY_DTYPES[dtype] = found
    return found


def array_views(state: MethodState) -> Callable[[Sequence[Any]], list[Any] | None] | None:
    """For the fast call: ``views(inputs)``, the call's inputs with each numpy array given
    for a CPU tensor input replaced by ``torch.from_numpy``'s view of it, the tensor the
    general path takes of it (:func:`~ptexec.tensor.to_torch`); None (the general path
    judges the call) when no input is such an array, or when one is not plainly what the
    input expects: an array of exactly ``np.ndarray`` (a memmap or another subclass is
    not), of the input's dtype in native byte order, C-contiguous and aligned, and
    writable where the program writes the input in place (a read-only one is refused
    there, :func:`_judge`). A view of such an array is a plain dense CPU tensor over
    the caller's memory, which the fast call judges as it judges any tensor. None too
    when numpy is not loaded or no CPU tensor input has a numpy dtype."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    wanted: list[tuple[int, Any, bool]] = []  # (position, numpy dtype, read-only allowed)
    for spec in state.inputs:
        if spec.kind != "tensor" or spec.dtype is None or not spec.device.is_cpu:
            continue
        dtype = _numpy_dtype(spec.dtype)
        if dtype is None:
            continue
        wanted.append((spec.index, dtype, not spec.written))
    if not wanted:
        return None
    array = np.ndarray
    n = len(state.inputs)
    entries = tuple(wanted)

    def views(inputs: Sequence[Any]) -> list[Any] | None:
        if len(inputs) != n:
            return None
        given: list[Any] | None = None
        for i, dtype, frozen in entries:
            a = inputs[i]
            if type(a) is not array:
                continue
            if a.dtype != dtype:
                return None
            flags = a.flags
            if not (flags.c_contiguous and flags.aligned):
                return None
            try:
                if flags.writeable:
                    t = torch.from_numpy(a)  # (torch warns of read-only memory alone)
                elif frozen:
                    t = from_numpy(a)
                else:
                    return None
            except (TypeError, ValueError):
                return None  # a negative stride on an axis of one element: the general path
            if given is None:
                given = list(inputs)
            given[i] = t
        return given

    return views


def _check_written_apart(state: MethodState, bound: BoundInputs) -> None:
    """A shared input the program writes in place may share no byte with another tensor
    input: the program would read values its own write changed (eager PyTorch reads the
    one tensor through both names, in an order the program does not keep)."""
    for spec, (action, x) in zip(state.inputs, bound, strict=True):
        if action is not Action.SHARE or not spec.written or not isinstance(x, torch.Tensor):
            continue
        for other, (_, y) in zip(state.inputs, bound, strict=True):
            if other is not spec and isinstance(y, torch.Tensor) and _shares_memory(x, y):
                raise InputError(
                    f"{_where(state, spec.index)} shares memory with input {other.index}; the "
                    "program writes it in place while reading the other: pass separate "
                    "tensors (a copy)"
                )


def _judge(
    state: MethodState, i: int, spec: InputSpec, x: Any, policy: Policy
) -> tuple[Action, Any]:
    where = _where(state, i)
    assert spec.info is not None
    # (numpy's float64 and int64 scalars are Python floats and ints too: read as numpy's
    # other scalars are, 0-d arrays)
    plain = isinstance(x, bool | int | float | str | list | tuple | dict)
    if x is None or (plain and type(x).__module__ != "numpy"):
        raise InputError(
            f"{where}: expected a tensor {spec.info}, got {type(x).__name__}"
            + (f" {x!r}" if isinstance(x, bool | int | float) else "")
        )
    try:
        t, device, flags = to_torch_flagged(x, where)
    except TypeError as e:
        raise InputError(
            f"{where}: expected a tensor {spec.info}, got {type(x).__name__} ({e})"
        ) from None
    except PtexecError:
        raise
    except Exception as e:  # the caller's array failed to hand over its memory
        raise InputError(
            f"{where}: expected a tensor {spec.info}; reading the {type(x).__name__} "
            f"failed: {type(e).__name__}: {e}"
        ) from e
    if t.is_nested or t.layout != torch.strided:
        kind = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
        raise InputError(
            f"{where}: expected a dense (strided) tensor {spec.info}, got a {kind} tensor"
        )
    readonly = False
    if isinstance(x, torch.Tensor) or not _is_numpy(x):
        sizes, strides = tuple(t.shape), tuple(t.stride())
        info = TensorInfo(sizes, t.dtype, dim_order_from_strides(sizes, strides), device, strides)
        # another DLPack producer's memory may be marked read-only (an immutable buffer)
        readonly = bool(flags & DLPACK_READ_ONLY)
    else:  # numpy: judge the caller's own strides (negative ones have no dim order)
        info = describe(x)
        readonly = not getattr(getattr(x, "flags", None), "writeable", True)
    action = decide(spec.info, info, policy, where)
    if spec.written and action in (Action.CONVERT, Action.MOVE):
        raise InputError(
            f"{where}: the program writes this input in place, and a copy "
            f"({action.value}) would take the write instead of your tensor; pass it in the "
            f"program's layout and on {spec.info.device}"
        )
    if action is Action.SHARE and _lazy(t):
        # a lazy negation or conjugation, or a ZeroTensor (no memory at all): its memory
        # does not hold its values, and code that reads memory (compiled code, a
        # delegate) would see the wrong ones, or read address 0
        if spec.written:
            raise InputError(
                f"{where}: the tensor is a lazy negation or conjugation, or a ZeroTensor (its "
                "memory does not hold its values), but the program writes this input in place "
                "and would use its memory; pass x.resolve_neg().resolve_conj(), or a tensor of "
                "zeros"
            )
        action = Action.CONVERT  # a copy with the values, in the program's layout
    if flags & DLPACK_IS_COPIED and spec.written and action is Action.SHARE:
        raise InputError(
            f"{where}: the {type(x).__name__} handed a copy of its memory (DLPack's "
            "IS_COPIED flag), but the program writes this input in place and its write "
            "would not reach the array; pass an array that exports its own memory"
        )
    if readonly and spec.written and action is Action.SHARE:
        raise InputError(
            f"{where}: the array is read-only, but the program writes this input in place and "
            "would use the array's memory; pass a writable array (or a copy)"
        )
    return action, t


def _lazy(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory does not hold its values: a lazy negation or conjugation,
    or a ZeroTensor (autograd's efficient zeros: dense, at address 0, no memory)."""
    return t.is_neg() or t.is_conj() or t._is_zerotensor()


def float_tolerance(traced: float) -> float:
    """How far a float input may be from the value the program was traced with
    (ExecuTorch's rule: 1e-4 plus 1e-5 of the traced value)."""
    return 1e-4 + 1e-5 * abs(traced)


def float_fits(traced: float, got: float) -> bool:
    """Whether ``got`` may be passed for a float input traced as ``traced``: NaN for NaN,
    an infinity for the same infinity alone (the difference from any other value is no
    finite number, as ExecuTorch requires), any other value within
    :func:`float_tolerance`."""
    if math.isnan(traced):
        return math.isnan(got)
    if math.isinf(traced) or math.isinf(got):
        return got == traced
    return got == traced or abs(got - traced) <= float_tolerance(traced)


def scalar_fits(kind: str, traced: Any, x: Any) -> bool:
    """Whether ``x`` may be passed for a scalar input of ``kind`` traced with the value
    ``traced``: the same value of the same kind (a float within :func:`float_tolerance`;
    numpy's scalars count as Python's)."""
    if kind == "float":
        if type(x) is not float and (
            not isinstance(x, numbers.Real) or isinstance(x, bool | _NP_BOOL)
        ):
            return False
        try:
            got = x if type(x) is float else float(x)
        except OverflowError:
            return False  # an integer or fraction past every float fits no traced float
        return float_fits(traced, got)
    if kind == "int":
        if type(x) is not int and (
            not isinstance(x, numbers.Integral) or isinstance(x, bool | _NP_BOOL)
        ):
            return False
        return bool(x == traced)
    if kind == "bool":
        return isinstance(x, bool | _NP_BOOL) and bool(x) == traced
    if kind == "none":
        return x is None
    if kind == "str":
        return isinstance(x, str) and x == traced
    return False


def scalar_test(kind: str, traced: Any, x: str, w: str) -> str:
    """:func:`scalar_fits`'s rule for a value of the kind's own Python type, as a Python
    expression for generated code (``x``: the value's source, ``w``: the traced value's):
    true exactly when ``x`` has that type and fits; a value of another type that fits
    (numpy's scalars) makes it false, and is for :func:`scalar_fits` to judge."""
    if kind == "float":
        if math.isnan(traced):
            return f"type({x}) is float and {x} != {x}"
        if math.isinf(traced):
            return f"type({x}) is float and {x} == {w}"
        # (an infinite x: its difference is no number <= a finite bound)
        bound = repr(float_tolerance(traced))
        return f"type({x}) is float and ({x} == {w} or abs({x} - {w}) <= {bound})"
    if kind in ("int", "str"):
        return f"type({x}) is {kind} and {x} == {w}"
    if kind == "bool":
        return f"{x} is {w}"
    if kind == "none":
        return f"{x} is None"
    return "False"


def _check_scalar(state: MethodState, i: int, spec: InputSpec, x: Any) -> None:
    if not scalar_fits(spec.kind, spec.scalar, x):
        raise InputError(
            f"{_where(state, i)}: the program was traced with {spec.kind} {spec.scalar!r} and "
            f"cannot take another value; got {type(x).__name__} {x!r}"
        )


def planned_ranges(state: MethodState, device: torch.device) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` of the method's planned buffers on ``device``. They
    are fixed at load: a buffer's memory never moves or grows."""
    return [
        (b.data.data_ptr(), b.data.data_ptr() + b.data.nbytes)
        for b in state.buffers
        if b.data.nbytes and b.data.device == device
    ]


def output_memory(state: MethodState, device: torch.device) -> list[torch.Tensor]:
    """The tensors whose memory the method gives its unplanned outputs on ``device``
    between calls (a call may grow it, unless its storage is not resizable: read its
    range at the call)."""
    return [
        o.default
        for o in state.unplanned_outputs
        if o.default is not None and o.default.device == device
    ]


def _in_method_memory(state: MethodState, x: torch.Tensor) -> bool:
    """Whether ``x`` shares a byte with memory the method writes: its planned buffers, its
    unplanned outputs' memory and the tensors converted or moved inputs are copied into
    (an output that is such an input is a view of one)."""
    if x.numel() == 0:
        return False
    start, end = _span(x)
    ranges = planned_ranges(state, x.device)
    scratch = [s.scratch for s in state.inputs if s.scratch is not None]
    for d in [*output_memory(state, x.device), *(t for t in scratch if t.device == x.device)]:
        memory = d.untyped_storage()
        ranges.append((memory.data_ptr(), memory.data_ptr() + memory.nbytes()))
    return any(start < e and s < end for s, e in ranges)


def bind_inputs(state: MethodState, bound: BoundInputs) -> None:
    """Put the validated inputs into the values table and record what each one took.

    A caller's tensor in memory the method writes (a view of an earlier call's output,
    say) is read once, before anything is written: copying another input into its planned
    view, or the run itself, may overwrite it."""
    v = state.values
    rec = state.record
    rec.reset()
    actions = rec.inputs
    # every such tensor read before the first write (a list, not a generator)
    read = [
        x.clone()
        if action is not None
        and action is not Action.EMPTY
        and isinstance(x, torch.Tensor)
        and _in_method_memory(state, x)
        else None
        for action, x in bound
    ]
    for spec, (action, x), copy in zip(state.inputs, bound, read, strict=True):
        if action is None:
            actions[spec.index] = "value"
            continue
        actions[spec.index] = action.value
        if copy is not None:
            # what the program gets is the copy, not the caller's memory: a copy, counted
            rec.count(x, copy, x.nbytes)
            if action is Action.SHARE:
                actions[spec.index] = Action.COPY.value
            x = copy
        if action is Action.SHARE:
            # an alias of the caller's memory: what the program does to the tensor's
            # sizes (an out= resize) stays with the alias, not the caller's tensor
            v[spec.slot] = x.detach()
        elif action is Action.COPY or action is Action.TRANSFER:
            view = spec.view
            assert view is not None
            if view.shape != x.shape:
                resize_to(view, x.shape, spec.dim_order)
            view.copy_(x)
            rec.count(x, view, x.nbytes)
            v[spec.slot] = view
        elif action is Action.EMPTY:
            target = spec.view
            if target is None:
                target = torch.empty_strided(
                    x.shape,
                    dim_order_strides(x.shape, spec.dim_order),
                    dtype=spec.dtype,
                    device=spec.torch_device,
                )
            elif target.shape != x.shape:
                resize_to(target, x.shape, spec.dim_order)
            v[spec.slot] = target
        else:  # CONVERT or MOVE into a reused scratch tensor in the program's layout
            scratch = spec.scratch
            if scratch is None or scratch.shape != x.shape:
                scratch = torch.empty_strided(
                    x.shape,
                    dim_order_strides(x.shape, spec.dim_order),
                    dtype=spec.dtype,
                    device=spec.torch_device,
                )
                spec.scratch = scratch
            scratch.copy_(x)
            rec.count(x, scratch, x.nbytes)
            v[spec.slot] = scratch


def release(state: MethodState, out_given: bool) -> None:
    """After a call: the caller's tensors leave the values table (unplanned inputs, and
    ``out=`` tensors that stood in for unplanned outputs)."""
    v = state.values
    for spec in state.inputs:
        if spec.kind == "tensor" and spec.view is None:
            v[spec.slot] = None
    if out_given:
        for o in state.outputs:
            if o.kind == "tensor" and not o.planned:
                v[o.slot] = o.default


# --------------------------------------------------------------------------------------
# outputs


def check_out(state: MethodState, out: Sequence[Any]) -> list[torch.Tensor | None]:
    """Validate the caller's ``out=`` tensors (None entries: outputs returned as usual)."""
    outs = state.outputs
    if len(out) != len(outs):
        raise InputError(f"'{state.name}' has {len(outs)} output(s), out= gives {len(out)}")
    result: list[torch.Tensor | None] = []
    for k, (spec, t) in enumerate(zip(outs, out, strict=True)):
        if t is None:
            result.append(None)
            continue
        where = f"out[{k}] of '{state.name}'"
        info = spec.info
        if spec.kind != "tensor" or not isinstance(info, TensorInfo):
            raise InputError(f"{where}: output {k} is a {spec.kind}, not a tensor")
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{where}: expected a torch tensor, got {type(t).__name__}")
        hook = subclass_hook(t)
        if hook is not None:
            # the kernels' writes into it would run the hook instead of writing
            raise InputError(
                f"{where}: expected a torch tensor, got a {type(t).__name__}, a subclass "
                f"with its own {hook}; pass a plain tensor"
            )
        got_dev = to_torch(t, where)[1]
        got = TensorInfo(tuple(t.shape), t.dtype, None, got_dev, tuple(t.stride()))
        if t.dtype != info.dtype:
            raise InputError(f"{where}: expected {info}, got {dtype_name(t.dtype)} tensor (dtype)")
        if got_dev != info.device:
            raise InputError(
                f"{where}: expected a tensor on {info.device} (the output's device), got {got_dev}"
            )
        if info.dynamism == "static":
            problem = shape_error(info, got.sizes)
            if problem is not None:
                raise InputError(
                    f"{where}: expected {info}, got shape {list(got.sizes)} ({problem})"
                )
        elif len(got.sizes) != len(info.sizes):
            raise InputError(f"{where}: expected rank {len(info.sizes)}, got {list(got.sizes)}")
        if not spec.planned and info.dynamism == "static" and not fits_layout(info, got):
            raise InputError(
                f"{where}: the method writes this output in place, so it must be laid out "
                f"{info.layout}"
            )
        if t.numel() > 1 and _overlaps_itself(t):
            raise InputError(
                f"{where}: several of its elements share memory (strides {list(t.stride())}), "
                "so it cannot receive an output"
            )
        if info.dynamism != "static" and not t.untyped_storage().resizable():
            need = None if info.dynamism == "dynamic_unbound" else info.nbytes
            have = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
            if need is None or have < need:
                bound = "has no bound" if need is None else f"can take up to {need} bytes"
                raise InputError(
                    f"{where}: its memory cannot grow (it is not resizable, e.g. a numpy "
                    f"array's) and holds {have} bytes, but the output {bound}"
                )
        result.append(t)
    return result


def _overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory: unless, taking its dimensions from the
    smallest stride up, each stride steps past everything the smaller ones reach."""
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz > 1)
    reach = 1
    for stride, size in dims:
        if stride < reach:
            return True
        reach = stride * size
    return False


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The byte range ``t``'s elements lie in."""
    start = t.data_ptr()
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))
    return start, start + (extent + 1) * t.element_size()


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    sa, ea = _span(a)
    sb, eb = _span(b)
    return sa < eb and sb < ea


def check_aliasing(state: MethodState, bound: BoundInputs, out: list[torch.Tensor | None]) -> None:
    """Refuse ``out=`` tensors whose memory overlaps an input's, another ``out=`` tensor's or
    the method's own: the method may read an input after writing an output, two outputs in
    one memory overwrite each other, and the run writes its own memory. Memory ranges are compared (elements interleaved in one range
    count as overlapping)."""
    taken: list[tuple[str, torch.Tensor]] = [
        (f"input {spec.index}", x)
        for spec, (action, x) in zip(state.inputs, bound, strict=True)
        if action is not None and isinstance(x, torch.Tensor)
    ]
    for k, t in enumerate(out):
        if t is None:
            continue
        if _in_method_memory(state, t):
            raise InputError(
                f"out[{k}] of '{state.name}' lies in the method's own memory (a view of an "
                "earlier call's output?), which the call overwrites; give outputs memory of "
                "their own"
            )
        for what, other in taken:
            if _shares_memory(t, other):
                raise InputError(
                    f"out[{k}] of '{state.name}' overlaps the memory of {what}; the method "
                    "would overwrite what it still reads (give outputs memory of their own)"
                )
        taken.append((f"out[{k}]", t))


def bind_out(state: MethodState, out: list[torch.Tensor | None], direct: bool) -> None:
    """Record what each ``out=`` tensor gets; with ``direct``, unplanned outputs are
    written straight into the caller's tensors (they stand in the values table for the
    call), else they are copied into them after the run, like planned ones."""
    v = state.values
    actions = state.record.outputs
    for spec in state.outputs:
        given = out[spec.index]
        if given is None:
            actions[spec.index] = ""
        elif spec.planned or not direct or not _holds_bound(spec, given):
            actions[spec.index] = "copy"
        else:
            v[spec.slot] = given
            actions[spec.index] = "direct"


def _holds_bound(spec: OutputSpec, given: torch.Tensor) -> bool:
    """Whether ``given`` may stand in the values table for unplanned output ``spec``: every
    byte a run may write there is the tensor's own. A dynamic output is written densely
    from the tensor's first element at whatever shape the run computes, so the tensor must
    be dense in the output's dim order and hold the output's bound itself (runners may
    write a bounded output in place without growing it, as compiled code does), or, with
    no bound, be the whole of a memory the run may grow. (Memory beyond the tensor, in a
    larger tensor it is a view of, may be another tensor's, an input's even: such a tensor
    receives a copy after the run instead.)"""
    info = spec.info
    if not isinstance(info, TensorInfo) or info.dynamism == "static":
        return True  # check_out took only the static layout, which the run writes in place
    got = TensorInfo(tuple(given.shape), given.dtype, None, info.device, tuple(given.stride()))
    if not fits_layout(info, got):
        return False
    own = given.numel() * given.element_size()
    if info.dynamism == "dynamic_bound":
        return own >= info.nbytes
    storage = given.untyped_storage()
    return given.storage_offset() == 0 and storage.nbytes() == own and storage.resizable()


def output_error(state: MethodState, index: int, value: Any = _SLOT) -> ExecutionError | None:
    """Why output ``index`` as execution left it (in its slot, or ``value`` when given:
    the new tensor a call hands over instead) contradicts the program's declaration
    (not a tensor; another dtype or rank; other sizes than static ones, or beyond a
    bound): a kernel or delegate wrote what the program does not declare. None when it
    is what the program declares."""
    spec = state.outputs[index]
    x = state.values[spec.slot] if value is _SLOT else value
    info = spec.info
    if not isinstance(x, torch.Tensor):
        why = f"execution left a {type(x).__name__} there"
    elif not isinstance(info, TensorInfo):
        return None
    elif x.dtype != info.dtype:
        why = f"execution left a {dtype_name(x.dtype)} tensor there"
    else:
        problem = shape_error(info, tuple(x.shape))
        if problem is None:
            return None
        why = f"execution left sizes {list(x.shape)} ({problem})"
    declared = (
        f"{dtype_name(info.dtype)}{list(info.sizes)} ({info.dynamism})"
        if isinstance(info, TensorInfo)
        else "a tensor"
    )
    return ExecutionError(
        state.name,
        -1,
        "output",
        f"output {index} (value {spec.slot}) is {declared} in the program, but {why}",
    )


def held_outputs(state: MethodState, replaced: frozenset[int] | None) -> frozenset[int]:
    """The outputs whose slot holds, through every call, the tensor of the program's dtype
    that loading put there: planned outputs, in no input's slot, in none of ``replaced``
    (the slots something run by the call may give a new object; None: any slot). A
    tensor's dtype never changes in place, so :func:`output_error` can find only its
    sizes wrong."""
    if replaced is None:
        return frozenset()
    inputs = {spec.slot for spec in state.inputs}
    held = set()
    for spec in state.outputs:
        x = state.values[spec.slot]
        info = spec.info
        if (
            spec.kind == "tensor"
            and spec.planned
            and spec.slot not in inputs
            and spec.slot not in replaced
            and isinstance(info, TensorInfo)
            and type(x) is torch.Tensor
            and x.dtype == info.dtype
        ):
            held.add(spec.index)
    return frozenset(held)


def output_checks(
    state: MethodState,
    index: int,
    x: str,
    refuse: str,
    env: dict[str, Any],
    held: bool = False,
    passed: bool = False,
) -> list[str]:
    """:func:`output_error`'s rule as lines of generated code: they call ``refuse(index)``
    where ``output_error(state, index)`` may find a problem, and only there (``x``: the
    source of the output's value; names the lines use are added to ``env``; ``held``: the
    output is one of :func:`held_outputs`, or a new tensor of its dtype, whose sizes
    alone are checked; ``passed``: the value is not the slot's, and the lines call
    ``refuse(index, x)``)."""
    info = state.outputs[index].info
    if not isinstance(info, TensorInfo):
        return []
    call = f"{refuse}({index}, {x})" if passed else f"{refuse}({index})"
    env["Tensor"] = torch.Tensor
    env[f"T{index}"] = info.dtype
    test = f"type({x}) is not Tensor or {x}.dtype is not T{index}"
    if info.dynamism == "static":
        if held:
            return [f"if not ({shape_test(info, f'{x}.shape')}): {call}"]
        return [f"if {test} or not ({shape_test(info, f'{x}.shape')}): {call}"]
    shape = f"_s{index}"
    return [
        *([] if held else [f"if {test}: {call}"]),
        f"{shape} = {x}.shape",
        f"if not ({shape_test(info, shape)}): {call}",
    ]


def collect(
    state: MethodState, mode: OutputMode, out: list[torch.Tensor | None] | None
) -> list[Any]:
    """The call's outputs: copies (``"copy"``), views of the method's memory (``"view"``),
    or the caller's ``out=`` tensors, filled; an output that contradicts the program's
    declaration is an ExecutionError (:func:`output_error`). An output in the program's
    constants or in state its methods share is copied in either mode
    (:attr:`MethodState.unviewed_memory`)."""
    v = state.values
    constant = state.unviewed_memory
    for spec in state.outputs:
        if spec.kind == "tensor":
            error = output_error(state, spec.index)
            if error is not None:
                raise error
    results: list[Any] = []
    for spec in state.outputs:
        x = v[spec.slot]
        if spec.kind != "tensor":
            results.append(x)
            continue
        given = out[spec.index] if out is not None else None
        if given is not None:
            if x is not given:
                if given.shape != x.shape:
                    given.resize_(x.shape)
                given.copy_(x)
                state.record.count(x, given, x.nbytes)
            results.append(given)
        elif mode == "copy" or x.untyped_storage().data_ptr() in constant:
            results.append(x.clone())
        else:  # the same memory, its own sizes: the caller's t_() cannot reach the table
            results.append(x.detach())
    return results
