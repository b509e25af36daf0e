"""The device model and its translators; describing tensors, arrays and DLPack producers."""

from __future__ import annotations

import enum

import numpy as np
import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths
from ptexec.device import (
    CPU,
    Device,
    DeviceType,
    from_dlpack_device,
    from_torch_device,
    parse_device,
)
from ptexec.errors import UnsupportedDeviceError
from ptexec.tensor import describe, dim_order_from_strides


def test_schema_codes() -> None:
    assert DeviceType.CPU == 0 and DeviceType.CUDA == 1


@pytest.mark.parametrize(
    ("torch_device", "expected"),
    [
        ("cpu", CPU),
        ("cpu:0", CPU),
        ("cuda:0", Device(DeviceType.CUDA, 0)),
        ("cuda:3", Device(DeviceType.CUDA, 3)),
    ],
)
def test_from_torch(torch_device: str, expected: Device) -> None:
    assert from_torch_device(torch.device(torch_device)) == expected


def test_bare_cuda_is_the_current_device() -> None:
    index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    assert from_torch_device(torch.device("cuda")) == Device(DeviceType.CUDA, index)


@pytest.mark.parametrize("name", ["meta", "mps", "xpu", "hpu", "privateuseone", "xla"])
def test_unmodeled_torch_devices_are_named(name: str) -> None:
    with pytest.raises(
        UnsupportedDeviceError, match=rf"is on {name}(:0)?; ptexec runs tensors on cpu and cuda"
    ):
        from_torch_device(torch.device(name, 0) if name != "meta" else torch.device(name))


@pytest.mark.parametrize(
    ("code", "dev_id", "expected"),
    [
        (1, 0, CPU),
        (3, 0, CPU),
        (2, 0, Device(DeviceType.CUDA, 0)),
        (2, 5, Device(DeviceType.CUDA, 5)),
        (13, 1, Device(DeviceType.CUDA, 1)),
    ],
)
def test_from_dlpack(code: int, dev_id: int, expected: Device) -> None:
    assert from_dlpack_device(code, dev_id) == expected


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (4, "kDLOpenCL"),
        (7, "kDLVulkan"),
        (8, "kDLMetal"),
        (10, "kDLROCM"),
        (14, "kDLOneAPI"),
        (99, "unknown DLPack device"),
    ],
)
def test_unmodeled_dlpack_devices_are_named(code: int, name: str) -> None:
    with pytest.raises(UnsupportedDeviceError, match=rf"{name} \({code}\)"):
        from_dlpack_device(code, 0)


def test_round_trip_to_torch() -> None:
    assert CPU.to_torch() == torch.device("cpu")
    assert Device(DeviceType.CUDA, 2).to_torch() == torch.device("cuda", 2)
    assert str(Device(DeviceType.CUDA, 2)) == "cuda:2" and str(CPU) == "cpu"


def test_parse() -> None:
    assert parse_device("cpu") == CPU
    assert parse_device("cuda:1") == Device(DeviceType.CUDA, 1)
    assert parse_device(torch.device("cuda", 2)) == Device(DeviceType.CUDA, 2)
    with pytest.raises(UnsupportedDeviceError, match="'mps'"):
        parse_device("mps")


class FakeProducer:
    """A DLPack producer reporting any device; wraps numpy for the data."""

    def __init__(self, array: np.ndarray, device: tuple[int, int], versioned: bool = True) -> None:
        self.array = array
        self.device = device
        self.versioned = versioned
        self.calls: list[dict[str, object]] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, **kwargs: object) -> object:
        self.calls.append(kwargs)
        if not self.versioned and "max_version" in kwargs:
            raise TypeError("unexpected keyword argument 'max_version'")
        return self.array.__dlpack__(**kwargs)


def test_describe_dlpack_versioned_then_legacy() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    new = FakeProducer(a, (1, 0))
    info = describe(new)
    assert info.sizes == (2, 3) and info.dtype == torch.float32 and info.device == CPU
    assert new.calls == [{"max_version": (1, 0)}]
    old = FakeProducer(a, (1, 0), versioned=False)
    assert describe(old).sizes == (2, 3)
    assert old.calls == [{"max_version": (1, 0)}, {}]


class _PlainDeviceType(enum.Enum):
    """The DLPack protocol's ``__dlpack_device__`` returns ``tuple[Enum, int]``: a plain
    enum member is as valid as torch's IntEnum."""

    CPU = 1


@pytest.mark.parametrize("device", [(_PlainDeviceType.CPU, 0), (np.int64(1), np.int32(0)), [1, 0]])
def test_describe_reads_every_well_formed_dlpack_device(device: object) -> None:
    """As torch's and numpy's ``from_dlpack`` take them."""
    a = np.arange(3, dtype=np.float32)
    producer = FakeProducer(a, device)  # type: ignore[arg-type]
    assert torch.equal(torch.from_dlpack(producer), torch.from_numpy(a))
    assert np.array_equal(np.from_dlpack(producer), a)
    info = describe(producer)
    assert info.sizes == (3,) and info.dtype == torch.float32 and info.device == CPU


@pytest.mark.parametrize(
    "device",
    [(1,), (1, 0, 0), ("cpu", 0), (1.5, 0), (1, -1), (2, -1), (1, "0"), (True, 0), "cpu", None, 1],
)
def test_describe_refuses_a_malformed_dlpack_device(device: object) -> None:
    """Not a pair of integers with a non-negative device id: the typed error that names
    what the producer returned (a bare ValueError or TypeError, or a device it never
    named, came before); a method's call raises the same."""
    producer = FakeProducer(np.zeros(3, np.float32), device)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedDeviceError, match=r"__dlpack_device__ returned .*expected"):
        describe(producer)
    m = ptexec.load(fixture_paths("mlp_unplanned")[0]).load_method()
    call = fixture_calls("mlp_unplanned")[0]
    x = call["inputs"][0].numpy()
    with pytest.raises(UnsupportedDeviceError, match=r"input 0 of 'forward'.*__dlpack_device__"):
        m.execute([FakeProducer(x, device)])  # type: ignore[arg-type]
    assert compare_outputs(m.execute([x.copy()]), call["outputs"], 1e-5, 1e-5) is None


@pytest.mark.parametrize(("code", "name"), [(10, "kDLROCM"), (8, "kDLMetal"), (4, "kDLOpenCL")])
def test_describe_rejects_producers_on_other_devices(code: int, name: str) -> None:
    with pytest.raises(UnsupportedDeviceError, match=rf"{name} \({code}\)"):
        describe(FakeProducer(np.zeros(3, np.float32), (code, 0)))


@pytest.mark.parametrize("code", [10, 8, 4])
def test_describe_exempts_an_empty_array_on_another_device(code: int) -> None:
    """As an empty torch tensor on another device is, and as a method's call takes it:
    described as what it declares, on the CPU (its memory is never read)."""
    info = describe(FakeProducer(np.zeros((0, 3), np.float16), (code, 0)))
    assert info.sizes == (0, 3) and info.dtype == torch.float16 and info.device == CPU


def test_describe_pinned_host_memory_is_cpu() -> None:
    a = np.arange(4, dtype=np.float32)
    info = describe(FakeProducer(a, (3, 0)))  # kDLCUDAHost: pinned host memory
    assert info.device == CPU and info.sizes == (4,)


def test_describe_torch_layouts() -> None:
    cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert describe(cl).dim_order == (0, 2, 3, 1) and describe(cl).layout == "channels_last"
    cl3 = torch.randn(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d)
    assert describe(cl3).dim_order == (0, 2, 3, 4, 1)
    assert describe(torch.randn(3, 4).t()).dim_order == (1, 0)
    assert describe(torch.randn(4, 4)[::2]).dim_order is None
    assert describe(torch.randn(4, 4)[::2]).layout == "strided"
    assert describe(torch.randn(3).expand(4, 3)).dim_order is None  # overlapping
    assert describe(torch.tensor(1.0)).dim_order == ()


def test_size_one_dims_keep_the_identity() -> None:
    # with C == 1 the channels-last and contiguous layouts are the same memory
    t = torch.randn(2, 1, 4, 5).to(memory_format=torch.channels_last)
    assert describe(t).dim_order == (0, 1, 2, 3)
    assert dim_order_from_strides((3, 1, 2), (2, 7, 1)) == (0, 1, 2)
    assert dim_order_from_strides((1, 3, 2), (1, 1, 3)) == (0, 2, 1)


def test_describe_numpy() -> None:
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    info = describe(a)
    assert info.sizes == (2, 3, 4) and info.dtype == torch.int32 and info.strides == (12, 4, 1)
    assert describe(a.transpose(2, 0, 1)).dim_order == (1, 2, 0)
    assert describe(a[:, ::-1]).dim_order is None  # negative strides
    assert describe(a[:, ::-1]).strides == (12, -4, 1)
    ro = a.copy()
    ro.flags.writeable = False
    assert describe(ro).sizes == (2, 3, 4)
    assert (
        describe(np.float64(2.5)).sizes == () and describe(np.float64(2.5)).dtype == torch.float64
    )
    assert describe(np.zeros((0, 3))).sizes == (0, 3)


def test_describe_meta_tensor_raises_but_empty_is_exempt() -> None:
    with pytest.raises(UnsupportedDeviceError, match="meta"):
        describe(torch.empty(2, device="meta"))
    assert describe(torch.empty(0, device="meta")).device == CPU


def test_describe_rejects_non_arrays() -> None:
    with pytest.raises(TypeError, match="not a tensor or array"):
        describe([1, 2, 3])


def test_public_names() -> None:
    assert ptexec.Device is Device and ptexec.describe is describe


def _capsule_on(array: np.ndarray, code: int) -> object:
    """A versioned DLPack capsule of ``array`` whose DLTensor names device type ``code``."""
    import ctypes

    capsule = array.__dlpack__(max_version=(1, 0))
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    managed = api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    # DLManagedTensorVersioned: version, manager_ctx, deleter, flags, then the DLTensor:
    # data, then device (type, id)
    ctypes.c_int32.from_address(managed + 40).value = code
    return capsule


class _PinnedCapsule(FakeProducer):
    """Says kDLCUDAHost and hands a capsule that says so too (torch imports neither)."""

    def __dlpack__(self, **kwargs: object) -> object:
        return _capsule_on(self.array, 3)


def test_a_capsule_torch_cannot_take_is_a_typed_error() -> None:
    with pytest.raises(UnsupportedDeviceError, match="cannot take its DLPack memory"):
        describe(_PinnedCapsule(np.zeros(3, np.float32), (3, 0)))


def test_an_empty_capsule_torch_cannot_take_is_exempt_as_other_empty_arrays_are() -> None:
    """Pinned host memory torch cannot import is refused, but an empty array of it has no
    memory to read: described as what it declares, on the CPU, as an empty array on a
    device ptexec does not model is (it was refused)."""
    info = describe(_PinnedCapsule(np.zeros((0, 3), np.float16), (3, 0)))
    assert info.sizes == (0, 3) and info.dtype == torch.float16 and info.device == CPU


def test_the_capsules_device_not_the_producers_word_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A producer whose ``__dlpack_device__`` names another device than its capsule's
    memory is refused (on a GPU machine: device memory claimed as host memory)."""
    import torch.utils.dlpack

    producer = FakeProducer(np.zeros(3, np.float32), (1, 0))
    monkeypatch.setattr(
        torch.utils.dlpack, "from_dlpack", lambda capsule: torch.empty(3, device="meta")
    )
    with pytest.raises(UnsupportedDeviceError, match="says cpu, but its DLPack memory is on meta"):
        describe(producer)
    monkeypatch.undo()
    assert describe(producer).device == CPU


class _CapsuleElsewhere(FakeProducer):
    """Says kDLCPU, and hands a capsule whose DLTensor names another device (``code``)."""

    def __init__(self, array: np.ndarray, code: int) -> None:
        super().__init__(array, (1, 0))
        self.code = code

    def __dlpack__(self, **kwargs: object) -> object:
        return _capsule_on(self.array, self.code)


@pytest.mark.parametrize(("code", "name"), [(4, "kDLOpenCL"), (12, "kDLExtDev")])
def test_a_capsule_on_another_device_is_refused_before_torch_reads_it(code: int, name: str) -> None:
    """The capsule's own device is read from its header and compared with the producer's
    word before torch imports it: torch's import of an OpenCL capsule failed an internal
    assert and corrupted the heap (the next call crashed the process), of an ExtDev one
    raised ModuleNotFoundError. The method answers the next call."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(UnsupportedDeviceError, match=rf"says cpu, .* on {name} \({code}\)"):
        describe(_CapsuleElsewhere(a, code))
    m = ptexec.load(fixture_paths("mlp_unplanned")[0]).load_method()
    call = fixture_calls("mlp_unplanned")[0]
    x = call["inputs"][0].numpy()
    with pytest.raises(UnsupportedDeviceError, match=rf"input 0 of 'forward'.* {name} \({code}\)"):
        m.execute([_CapsuleElsewhere(x, code)])
    assert compare_outputs(m.execute([x.copy()]), call["outputs"], 1e-5, 1e-5) is None
