"""The ExecuTorch program schema (``program.fbs``) as frozen dataclasses.

These describe a program; they hold no tensors and import no torch. Byte ranges of data
inside the file are kept as :class:`DataRef` (absolute offsets), never copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from .scalar_type import element_size, scalar_type_name

# enum TensorShapeDynamism
STATIC = 0
DYNAMIC_BOUND = 1
DYNAMIC_UNBOUND = 2
DYNAMISM_NAMES = {
    STATIC: "static",
    DYNAMIC_BOUND: "dynamic_bound",
    DYNAMIC_UNBOUND: "dynamic_unbound",
}

# enum TensorDataLocation
LOCATION_SEGMENT = 0
LOCATION_EXTERNAL = 1

# enum DeviceType
DEVICE_CPU = 0
DEVICE_CUDA = 1
DEVICE_TYPE_NAMES = {DEVICE_CPU: "cpu", DEVICE_CUDA: "cuda"}

# enum DataLocation (delegate data)
DATA_INLINE = 0
DATA_SEGMENT = 1


@dataclass(frozen=True, slots=True)
class DataRef:
    """A byte range ``[offset, offset + size)`` of the file."""

    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class AllocationDetails:
    memory_id: int
    memory_offset: int  # low | high << 32


@dataclass(frozen=True, slots=True)
class ExtraTensorInfo:
    mutable_data_segments_idx: int = 0
    fully_qualified_name: str | None = None
    location: int = LOCATION_SEGMENT
    device_type: int = DEVICE_CPU
    device_index: int = 0


@dataclass(frozen=True, slots=True)
class Tensor:
    scalar_type: int
    storage_offset: int
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    requires_grad: bool
    data_buffer_idx: int
    allocation_info: AllocationDetails | None
    layout: int
    shape_dynamism: int
    extra_tensor_info: ExtraTensorInfo | None

    @property
    def numel(self) -> int:
        return prod(self.sizes)

    @property
    def nbytes(self) -> int:
        """Bytes at ``sizes`` (the upper bound for a dynamic tensor)."""
        return self.numel * element_size(self.scalar_type)

    @property
    def is_external(self) -> bool:
        extra = self.extra_tensor_info
        return extra is not None and extra.location == LOCATION_EXTERNAL

    @property
    def is_constant(self) -> bool:
        """Data comes from the program (constant segment or external data), not a buffer."""
        if self.allocation_info is not None:
            return False
        return self.data_buffer_idx > 0 or self.is_external

    @property
    def is_memory_planned(self) -> bool:
        """As ExecuTorch's ``TensorInfo.is_memory_planned``: planned or constant."""
        return self.allocation_info is not None or self.data_buffer_idx != 0

    @property
    def device(self) -> tuple[int, int]:
        """The (device_type, device_index) label, CPU/0 when absent."""
        extra = self.extra_tensor_info
        if extra is None:
            return (DEVICE_CPU, 0)
        return (extra.device_type, extra.device_index)

    def describe(self) -> str:
        dims = ", ".join(str(s) for s in self.sizes)
        return f"{scalar_type_name(self.scalar_type)}[{dims}]"


@dataclass(frozen=True, slots=True)
class Null:
    pass


@dataclass(frozen=True, slots=True)
class Int:
    value: int


@dataclass(frozen=True, slots=True)
class Bool:
    value: bool


@dataclass(frozen=True, slots=True)
class Double:
    value: float


@dataclass(frozen=True, slots=True)
class String:
    value: str


@dataclass(frozen=True, slots=True)
class IntList:
    """Items are indices into the plan's values (each an Int), not literal integers."""

    items: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DoubleList:
    items: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class BoolList:
    items: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class TensorList:
    """Items are indices into the plan's values (each a Tensor)."""

    items: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OptionalTensorList:
    """Items are value indices of Tensors or Nulls; -1 also means None."""

    items: tuple[int, ...]


EValue = (
    Null
    | Int
    | Bool
    | Double
    | String
    | Tensor
    | IntList
    | DoubleList
    | BoolList
    | TensorList
    | OptionalTensorList
)

# union KernelTypes: type code -> name (NONE=0 is "no value", read as Null)
KERNEL_TYPE_NAMES = {
    1: "Null",
    2: "Int",
    3: "Bool",
    4: "Double",
    5: "Tensor",
    6: "String",
    7: "IntList",
    8: "DoubleList",
    9: "BoolList",
    10: "TensorList",
    11: "OptionalTensorList",
}


def evalue_kind(value: EValue) -> str:
    return type(value).__name__


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    overload: str

    @property
    def qualified_name(self) -> str:
        """``ns::op.overload`` (or ``ns::op`` when the overload is empty)."""
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass(frozen=True, slots=True)
class KernelCall:
    op_index: int
    args: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DelegateCall:
    delegate_index: int
    args: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MoveCall:
    move_from: int
    move_to: int


@dataclass(frozen=True, slots=True)
class JumpFalseCall:
    cond_value_index: int
    destination_instruction: int


@dataclass(frozen=True, slots=True)
class FreeCall:
    value_index: int


Instruction = KernelCall | DelegateCall | MoveCall | JumpFalseCall | FreeCall


def instruction_values(ins: Instruction) -> tuple[int, ...]:
    """The value indices an instruction refers to, in order."""
    if isinstance(ins, (KernelCall, DelegateCall)):
        return ins.args
    if isinstance(ins, MoveCall):
        return (ins.move_from, ins.move_to)
    if isinstance(ins, FreeCall):
        return (ins.value_index,)
    return (ins.cond_value_index,)


def tensor_indices(values: tuple[EValue, ...], indices: tuple[int, ...]) -> tuple[int, ...]:
    """The tensor values among ``indices``, the items of tensor lists included, once each."""
    out: dict[int, None] = {}
    for a in indices:
        v = values[a]
        if isinstance(v, Tensor):
            out[a] = None
        elif isinstance(v, (TensorList, OptionalTensorList)):
            for i in v.items:
                if i >= 0 and isinstance(values[i], Tensor):
                    out[i] = None
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Frame:
    filename: str | None
    lineno: int
    name: str | None
    context: str | None

    def __str__(self) -> str:
        where = f"{self.filename or '?'}:{self.lineno}"
        if self.name:
            where += f" in {self.name}"
        if self.context:
            where += f"\n    {self.context.strip()}"
        return where


@dataclass(frozen=True, slots=True)
class Chain:
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    instructions: tuple[Instruction, ...]
    stacktrace: tuple[tuple[Frame, ...] | None, ...] | None
    # the positions of its jumps and of its delegate calls (found once: every load of the
    # program asks, and a chain can have thousands of instructions)
    jumps: tuple[int, ...] = field(init=False, repr=False, compare=False)
    delegates: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ins = self.instructions
        jumps = tuple(i for i, x in enumerate(ins) if isinstance(x, JumpFalseCall))
        delegates = tuple(i for i, x in enumerate(ins) if isinstance(x, DelegateCall))
        object.__setattr__(self, "jumps", jumps)
        object.__setattr__(self, "delegates", delegates)


@dataclass(frozen=True, slots=True)
class ContainerMetadata:
    encoded_inp_str: str | None
    encoded_out_str: str | None


@dataclass(frozen=True, slots=True)
class BackendDelegateDataReference:
    location: int  # DATA_INLINE or DATA_SEGMENT
    index: int


@dataclass(frozen=True, slots=True)
class CompileSpec:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class BackendDelegate:
    id: str
    processed: BackendDelegateDataReference
    compile_specs: tuple[CompileSpec, ...]


@dataclass(frozen=True, slots=True)
class NonConstBufferDevice:
    buffer_idx: int
    device_type: int
    device_index: int


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    name: str
    container_meta_type: ContainerMetadata | None
    values: tuple[EValue, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    chains: tuple[Chain, ...]
    operators: tuple[Operator, ...]
    delegates: tuple[BackendDelegate, ...]
    non_const_buffer_sizes: tuple[int, ...]
    non_const_buffer_device: tuple[NonConstBufferDevice, ...] | None

    def buffer_device(self, buffer_idx: int) -> tuple[int, int]:
        """(device_type, device_index) of planned buffer ``buffer_idx`` (1-based); CPU/0 if unlisted."""
        for entry in self.non_const_buffer_device or ():
            if entry.buffer_idx == buffer_idx:
                return (entry.device_type, entry.device_index)
        return (DEVICE_CPU, 0)


@dataclass(frozen=True, slots=True)
class DataSegment:
    offset: int  # relative to the segment base offset
    size: int


@dataclass(frozen=True, slots=True)
class SubsegmentOffsets:
    segment_index: int
    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NamedData:
    key: str
    segment_index: int


@dataclass(frozen=True, slots=True)
class Program:
    version: int
    execution_plan: tuple[ExecutionPlan, ...]
    constant_buffer: tuple[DataRef, ...]
    backend_delegate_data: tuple[DataRef, ...]
    segments: tuple[DataSegment, ...]
    constant_segment: SubsegmentOffsets | None
    mutable_data_segments: tuple[SubsegmentOffsets, ...]
    named_data: tuple[NamedData, ...]
