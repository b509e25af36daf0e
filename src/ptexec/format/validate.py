"""Cross-reference checks of a decoded program, before any tensor exists.

Every index (values, operators, delegates, segments, buffers, instructions, list items) is
in range, every planned tensor lies inside its buffer, every constant inside its segment,
and every tensor description is well formed. Each failure is a
:class:`~ptexec.errors.PteFormatError` whose path points into the file.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PteFormatError
from . import program as p
from .scalar_type import element_size, is_known

MAX_RANK = 16
SCHEMA_VERSION = 0  # the program schema's version ExecuTorch's runtime reads (and no later)
KNOWN_DEVICE_TYPES = (p.DEVICE_CPU, p.DEVICE_CUDA)


def validate_program(program: p.Program, segment_sizes: Sequence[int]) -> None:
    """Check ``program``; ``segment_sizes[i]`` is the number of bytes of segment ``i``."""
    if program.version > SCHEMA_VERSION:
        # (a later schema may give the fields read here another meaning)
        raise PteFormatError(
            "version",
            f"schema version {program.version} is newer than {SCHEMA_VERSION}, the one "
            "ExecuTorch's runtime and ptexec read",
        )
    nseg = len(segment_sizes)
    const = program.constant_segment
    if const is not None and len(const.offsets) > 1:
        _check_subsegments(const, segment_sizes, "constant_segment")
        if len(program.constant_buffer) > 1:
            raise PteFormatError(
                "constant_buffer",
                "both constant_buffer and constant_segment hold constants; a program has one",
            )
    for i, sub in enumerate(program.mutable_data_segments):
        _check_subsegments(sub, segment_sizes, f"mutable_data_segments[{i}]")
    keys: set[str] = set()
    for i, named in enumerate(program.named_data):
        if named.segment_index >= nseg:
            raise PteFormatError(
                f"named_data[{i}].segment_index",
                f"segment {named.segment_index} out of range ({nseg} segments)",
            )
        if named.key in keys:
            raise PteFormatError(f"named_data[{i}].key", f"duplicate key {named.key!r}")
        keys.add(named.key)
    names: set[str] = set()
    for i, plan in enumerate(program.execution_plan):
        path = f"execution_plan[{i}]"
        if plan.name in names:
            raise PteFormatError(f"{path}.name", f"duplicate method name {plan.name!r}")
        names.add(plan.name)
        _check_plan(program, plan, segment_sizes, path)


def _check_subsegments(sub: p.SubsegmentOffsets, segment_sizes: Sequence[int], path: str) -> None:
    if sub.segment_index >= len(segment_sizes):
        raise PteFormatError(
            f"{path}.segment_index",
            f"segment {sub.segment_index} out of range ({len(segment_sizes)} segments)",
        )
    size = segment_sizes[sub.segment_index]
    for j, off in enumerate(sub.offsets):
        if off > size:
            raise PteFormatError(
                f"{path}.offsets[{j}]",
                f"offset {off} lies past the end of segment {sub.segment_index} ({size} bytes)",
            )


def _index(value: int, count: int, path: str, what: str) -> None:
    if not 0 <= value < count:
        raise PteFormatError(path, f"{what} {value} out of range ({count} {what}s)")


def _check_plan(
    program: p.Program, plan: p.ExecutionPlan, segment_sizes: Sequence[int], path: str
) -> None:
    values = plan.values
    nvalues = len(values)
    sizes = plan.non_const_buffer_sizes
    for j, size in enumerate(sizes):
        if size < 0:
            raise PteFormatError(f"{path}.non_const_buffer_sizes[{j}]", f"negative size {size}")
    seen_buffers: set[int] = set()
    for j, entry in enumerate(plan.non_const_buffer_device or ()):
        epath = f"{path}.non_const_buffer_device[{j}]"
        if not 1 <= entry.buffer_idx < len(sizes):
            raise PteFormatError(
                f"{epath}.buffer_idx",
                f"buffer {entry.buffer_idx} out of range (buffers are 1..{len(sizes) - 1})",
            )
        if entry.buffer_idx in seen_buffers:
            raise PteFormatError(f"{epath}.buffer_idx", f"buffer {entry.buffer_idx} listed twice")
        seen_buffers.add(entry.buffer_idx)
        _check_device(entry.device_type, entry.device_index, epath)

    for j, value in enumerate(values):
        vpath = f"{path}.values[{j}]"
        if isinstance(value, p.Tensor):
            _check_tensor(program, plan, value, segment_sizes, f"{vpath}.tensor")
        elif isinstance(value, p.IntList):
            for k, item in enumerate(value.items):
                _index(item, nvalues, f"{vpath}.int_list.items[{k}]", "value")
                if not isinstance(values[item], p.Int):
                    raise PteFormatError(
                        f"{vpath}.int_list.items[{k}]",
                        f"value {item} is a {p.evalue_kind(values[item])}, expected Int",
                    )
        elif isinstance(value, p.TensorList):
            for k, item in enumerate(value.items):
                _index(item, nvalues, f"{vpath}.tensor_list.items[{k}]", "value")
                if not isinstance(values[item], p.Tensor):
                    raise PteFormatError(
                        f"{vpath}.tensor_list.items[{k}]",
                        f"value {item} is a {p.evalue_kind(values[item])}, expected Tensor",
                    )
        elif isinstance(value, p.OptionalTensorList):
            for k, item in enumerate(value.items):
                if item == -1:
                    continue
                _index(item, nvalues, f"{vpath}.optional_tensor_list.items[{k}]", "value")
                if not isinstance(values[item], p.Tensor | p.Null):
                    raise PteFormatError(
                        f"{vpath}.optional_tensor_list.items[{k}]",
                        f"value {item} is a {p.evalue_kind(values[item])}, expected Tensor or Null",
                    )

    for k, idx in enumerate(plan.inputs):
        _index(idx, nvalues, f"{path}.inputs[{k}]", "value")
    for k, idx in enumerate(plan.outputs):
        _index(idx, nvalues, f"{path}.outputs[{k}]", "value")

    for k, op in enumerate(plan.operators):
        if not op.name:
            raise PteFormatError(f"{path}.operators[{k}].name", "empty operator name")

    nseg = len(segment_sizes)
    for k, delegate in enumerate(plan.delegates):
        dpath = f"{path}.delegates[{k}]"
        ref = delegate.processed
        if ref.location == p.DATA_INLINE:
            _index(
                ref.index,
                len(program.backend_delegate_data),
                f"{dpath}.processed.index",
                "inline delegate data entry",
            )
        elif ref.location == p.DATA_SEGMENT:
            _index(ref.index, nseg, f"{dpath}.processed.index", "segment")
        else:
            raise PteFormatError(
                f"{dpath}.processed.location", f"unknown data location {ref.location}"
            )

    for c, chain in enumerate(plan.chains):
        _check_chain(plan, chain, f"{path}.chains[{c}]")


def _check_device(device_type: int, device_index: int, path: str) -> None:
    if device_type not in KNOWN_DEVICE_TYPES:
        raise PteFormatError(
            f"{path}.device_type", f"unknown device type {device_type} (0 = cpu, 1 = cuda)"
        )
    if device_index < 0:
        raise PteFormatError(f"{path}.device_index", f"negative device index {device_index}")


def _check_tensor(
    program: p.Program,
    plan: p.ExecutionPlan,
    t: p.Tensor,
    segment_sizes: Sequence[int],
    path: str,
) -> None:
    if not is_known(t.scalar_type):
        raise PteFormatError(f"{path}.scalar_type", f"unknown scalar type {t.scalar_type}")
    if t.storage_offset != 0:
        raise PteFormatError(f"{path}.storage_offset", f"{t.storage_offset}, must be 0")
    rank = len(t.sizes)
    if rank > MAX_RANK:
        raise PteFormatError(f"{path}.sizes", f"rank {rank} exceeds {MAX_RANK}")
    extent = 1  # the largest product of sizes torch forms for it (strides, numel, bytes)
    for d, s in enumerate(t.sizes):
        if s < 0:
            raise PteFormatError(f"{path}.sizes[{d}]", f"negative size {s}")
        extent *= max(s, 1)
    if extent * element_size(t.scalar_type) >= 1 << 63:
        raise PteFormatError(f"{path}.sizes", f"{list(t.sizes)} exceeds what a tensor can hold")
    if len(t.dim_order) != rank:
        raise PteFormatError(
            f"{path}.dim_order", f"{len(t.dim_order)} entries for a rank-{rank} tensor"
        )
    if sorted(t.dim_order) != list(range(rank)):
        raise PteFormatError(
            f"{path}.dim_order", f"{list(t.dim_order)} is not a permutation of 0..{rank - 1}"
        )
    if t.shape_dynamism not in p.DYNAMISM_NAMES:
        raise PteFormatError(f"{path}.shape_dynamism", f"unknown value {t.shape_dynamism}")
    extra = t.extra_tensor_info
    if extra is not None:
        _check_device(extra.device_type, extra.device_index, f"{path}.extra_tensor_info")
        if extra.location not in (p.LOCATION_SEGMENT, p.LOCATION_EXTERNAL):
            raise PteFormatError(
                f"{path}.extra_tensor_info.location", f"unknown location {extra.location}"
            )
        if extra.location == p.LOCATION_EXTERNAL and not extra.fully_qualified_name:
            raise PteFormatError(
                f"{path}.extra_tensor_info.fully_qualified_name",
                "external tensor without a name to find it by",
            )
    nbytes = t.nbytes
    alloc = t.allocation_info
    if alloc is not None:
        nbuf = len(plan.non_const_buffer_sizes)
        if not 1 <= alloc.memory_id < nbuf:
            raise PteFormatError(
                f"{path}.allocation_info.memory_id",
                f"buffer {alloc.memory_id} out of range (buffers are 1..{nbuf - 1})",
            )
        size = plan.non_const_buffer_sizes[alloc.memory_id]
        end = alloc.memory_offset + nbytes
        if end > size:
            raise PteFormatError(
                f"{path}.allocation_info",
                f"bytes {alloc.memory_offset}..{end} exceed buffer {alloc.memory_id} ({size} bytes)",
            )
        if t.data_buffer_idx > 0 and not t.is_external:
            _check_mutable_init(program, t, segment_sizes, path)
    elif t.data_buffer_idx > 0 and not t.is_external:
        _check_constant(program, t, segment_sizes, path)


def _check_in_subsegment(
    sub: p.SubsegmentOffsets,
    t: p.Tensor,
    segment_sizes: Sequence[int],
    path: str,
    what: str,
    segment: str,
) -> None:
    """Entry ``t.data_buffer_idx`` of ``sub`` holds ``t``'s bytes inside its segment."""
    idx = t.data_buffer_idx
    if idx >= len(sub.offsets):
        raise PteFormatError(
            f"{path}.data_buffer_idx",
            f"{what} {idx} out of range ({len(sub.offsets)} in the {segment})",
        )
    start = sub.offsets[idx]
    size = segment_sizes[sub.segment_index]
    if start + t.nbytes > size:
        raise PteFormatError(
            f"{path}.data_buffer_idx",
            f"{what} {idx} at bytes {start}..{start + t.nbytes} exceeds the {segment} "
            f"({size} bytes)",
        )


def _check_constant(
    program: p.Program, t: p.Tensor, segment_sizes: Sequence[int], path: str
) -> None:
    idx = t.data_buffer_idx
    const = program.constant_segment
    if const is not None and len(const.offsets) > 1:
        _check_in_subsegment(const, t, segment_sizes, path, "constant", "constant segment")
        return
    if idx >= len(program.constant_buffer):
        raise PteFormatError(
            f"{path}.data_buffer_idx",
            f"constant {idx} out of range ({len(program.constant_buffer)} constant buffers)",
        )
    have = program.constant_buffer[idx].size
    if t.nbytes > have:
        raise PteFormatError(
            f"{path}.data_buffer_idx",
            f"constant {idx} has {have} bytes, the tensor needs {t.nbytes}",
        )


def _check_mutable_init(
    program: p.Program, t: p.Tensor, segment_sizes: Sequence[int], path: str
) -> None:
    if not program.mutable_data_segments:
        raise PteFormatError(
            f"{path}.data_buffer_idx",
            f"initial value {t.data_buffer_idx} but the program has no mutable data segment",
        )
    sub = program.mutable_data_segments[0]
    _check_in_subsegment(sub, t, segment_sizes, path, "initial value", "mutable data segment")


def _check_chain(plan: p.ExecutionPlan, chain: p.Chain, path: str) -> None:
    nvalues = len(plan.values)
    for k, idx in enumerate(chain.inputs):
        _index(idx, nvalues, f"{path}.inputs[{k}]", "value")
    for k, idx in enumerate(chain.outputs):
        _index(idx, nvalues, f"{path}.outputs[{k}]", "value")
    n = len(chain.instructions)
    for k, ins in enumerate(chain.instructions):
        ipath = f"{path}.instructions[{k}]"
        if isinstance(ins, p.KernelCall):
            _index(ins.op_index, len(plan.operators), f"{ipath}.kernel_call.op_index", "operator")
            for a, arg in enumerate(ins.args):
                _index(arg, nvalues, f"{ipath}.kernel_call.args[{a}]", "value")
        elif isinstance(ins, p.DelegateCall):
            _index(
                ins.delegate_index,
                len(plan.delegates),
                f"{ipath}.delegate_call.delegate_index",
                "delegate",
            )
            for a, arg in enumerate(ins.args):
                _index(arg, nvalues, f"{ipath}.delegate_call.args[{a}]", "value")
        elif isinstance(ins, p.MoveCall):
            _index(ins.move_from, nvalues, f"{ipath}.move_call.move_from", "value")
            _index(ins.move_to, nvalues, f"{ipath}.move_call.move_to", "value")
        elif isinstance(ins, p.JumpFalseCall):
            _index(
                ins.cond_value_index, nvalues, f"{ipath}.jump_false_call.cond_value_index", "value"
            )
            if not 0 <= ins.destination_instruction <= n:
                raise PteFormatError(
                    f"{ipath}.jump_false_call.destination_instruction",
                    f"{ins.destination_instruction} out of range (chain has {n} instructions)",
                )
        elif isinstance(ins, p.FreeCall):
            _index(ins.value_index, nvalues, f"{ipath}.free_call.value_index", "value")
            if not isinstance(plan.values[ins.value_index], p.Tensor):
                raise PteFormatError(
                    f"{ipath}.free_call.value_index",
                    f"value {ins.value_index} is a "
                    f"{p.evalue_kind(plan.values[ins.value_index])}, expected Tensor",
                )
