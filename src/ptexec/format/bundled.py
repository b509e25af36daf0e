"""Bundled programs (``.bpte``, identifier ``BP08``): a program with test cases.

ExecuTorch's ``bundled_program_schema.fbs``: the serialized ``.pte`` itself, and per method
a list of test cases, each the inputs to call it with and the outputs to expect (tensors,
ints, bools, doubles). :func:`read_bundled` validates the whole structure and keeps every
tensor's bytes and the program as byte ranges of the file (no copies, no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PteFormatError
from .flatbuf import Buffer, Table
from .program import DataRef
from .scalar_type import element_size, is_known, scalar_type_name
from .validate import MAX_RANK

__all__ = [
    "FILE_IDENTIFIER",
    "BundledProgram",
    "BundledTensor",
    "TestCase",
    "TestSuite",
    "is_bundled",
    "read_bundled",
]

FILE_IDENTIFIER = b"BP08"

Bytes = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class BundledTensor:
    """A tensor of a test case: scalar type, sizes, dim order and its bytes in the file."""

    scalar_type: int
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    data: DataRef

    def describe(self) -> str:
        return f"{scalar_type_name(self.scalar_type)}[{', '.join(map(str, self.sizes))}]"


BundledValue = BundledTensor | int | bool | float


@dataclass(frozen=True, slots=True)
class TestCase:
    """One call: its inputs and the outputs expected of it."""

    __test__ = False  # not a pytest class

    inputs: tuple[BundledValue, ...]
    expected_outputs: tuple[BundledValue, ...]


@dataclass(frozen=True, slots=True)
class TestSuite:
    """The test cases of one method."""

    __test__ = False

    method_name: str
    test_cases: tuple[TestCase, ...]


@dataclass(frozen=True)
class BundledProgram:
    """A validated bundled program: ``program`` is the byte range of the ``.pte`` inside
    ``data`` (the whole file)."""

    data: memoryview
    version: int
    suites: tuple[TestSuite, ...]
    program: DataRef

    def program_bytes(self) -> memoryview:
        return self.data[self.program.offset : self.program.offset + self.program.size]

    def tensor_bytes(self, t: BundledTensor) -> memoryview:
        return self.data[t.data.offset : t.data.offset + t.data.size]

    def suite(self, method_name: str) -> TestSuite | None:
        for s in self.suites:
            if s.method_name == method_name:
                return s
        return None


def is_bundled(data: Bytes) -> bool:
    """Whether ``data`` starts like a bundled program (its file identifier)."""
    return len(data) >= 8 and bytes(data[4:8]) == FILE_IDENTIFIER


_UNION = {1: "tensor", 2: "int", 3: "bool", 4: "double"}


def _tensor(t: Table) -> BundledTensor:
    code = t.int_(0, "i8", "scalar_type")
    if not is_known(code):
        raise PteFormatError(f"{t.path}.scalar_type", f"unknown scalar type {code}")
    sizes = t.scalars(1, "i32", "sizes") or ()
    if len(sizes) > MAX_RANK:
        raise PteFormatError(f"{t.path}.sizes", f"rank {len(sizes)} exceeds {MAX_RANK}")
    if any(s < 0 for s in sizes):
        raise PteFormatError(f"{t.path}.sizes", f"negative size in {list(sizes)}")
    dim_order = t.scalars(3, "u8", "dim_order") or tuple(range(len(sizes)))
    if sorted(dim_order) != list(range(len(sizes))):
        raise PteFormatError(
            f"{t.path}.dim_order", f"{list(dim_order)} is not a dim order of rank {len(sizes)}"
        )
    span = t.bytes_span(2, "data")
    start, n = span if span is not None else (0, 0)
    want = element_size(code)
    for s in sizes:
        want *= s
    if n != want:
        raise PteFormatError(
            f"{t.path}.data",
            f"{n} bytes for a {scalar_type_name(code)}{list(sizes)} tensor of {want} bytes",
        )
    return BundledTensor(code, tuple(sizes), tuple(dim_order), DataRef(start, n))


def _value(t: Table) -> BundledValue:
    code, inner = t.union(0, "val", _UNION)
    if inner is None:
        raise PteFormatError(f"{t.path}.val", f"missing value (type {code})")
    if code == 1:
        return _tensor(inner)
    if code == 2:
        return inner.int_(0, "i64", "int_val")
    if code == 3:
        return inner.bool_(0, "bool_val")
    if code == 4:
        return inner.f64(0, "double_val")
    raise PteFormatError(f"{t.path}.val", f"unknown value type {code}")


def _case(t: Table) -> TestCase:
    return TestCase(
        t.tables(0, "inputs", _value) or (), t.tables(1, "expected_outputs", _value) or ()
    )


def _suite(t: Table) -> TestSuite:
    name = t.string(0, "method_name")
    if not name:
        raise PteFormatError(f"{t.path}.method_name", "a test suite without a method name")
    return TestSuite(name, t.tables(1, "test_cases", _case) or ())


def read_bundled(data: Bytes) -> BundledProgram:
    """Parse and validate a bundled program (the program inside is not parsed here)."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if not is_bundled(view):
        got = bytes(view[4:8]) if len(view) >= 8 else b""
        raise PteFormatError("file identifier", f"expected {FILE_IDENTIFIER!r}, got {got!r}")
    root = Buffer(view).root("bundled_program")
    suites = root.tables(1, "method_test_suites", _suite) or ()
    names = [s.method_name for s in suites]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise PteFormatError(f"bundled_program.method_test_suites[{i}]", f"'{name}' twice")
    span = root.bytes_span(2, "program")
    if span is None or span[1] == 0:
        raise PteFormatError("bundled_program.program", "no program")
    return BundledProgram(view, root.int_(0, "u32", "version"), suites, DataRef(*span))
