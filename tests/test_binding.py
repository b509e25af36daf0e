"""The input placement rules: the pure decision function, exhaustively, and through Method."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import ptexec
from export_util import export_program
from ptexec.binding import Action, Policy, decide
from ptexec.device import CPU, Device, DeviceType
from ptexec.errors import InputError, UnsupportedDeviceError
from ptexec.tensor import TensorInfo, dim_order_strides

CUDA0 = Device(DeviceType.CUDA, 0)
CUDA1 = Device(DeviceType.CUDA, 1)


def program_tensor(
    planned: bool, device: Device, dynamism: str, dim_order: tuple[int, ...]
) -> TensorInfo:
    sizes = (2, 3, 4, 5)
    return TensorInfo(
        sizes,
        torch.float32,
        dim_order,
        device,
        dim_order_strides(sizes, dim_order),
        planned,
        dynamism,
    )


def caller_tensor(
    sizes: tuple[int, ...], dtype: torch.dtype, device: Device, dim_order: tuple[int, ...] | None
) -> TensorInfo:
    if dim_order is None:  # a strided (non-dense) layout: every other element of a bigger tensor
        strides = tuple(2 * s for s in dim_order_strides(sizes, tuple(range(len(sizes)))))
    else:
        strides = dim_order_strides(sizes, dim_order)
    return TensorInfo(sizes, dtype, dim_order, device, strides)


CONTIGUOUS = (0, 1, 2, 3)
CHANNELS_LAST = (0, 2, 3, 1)

SHAPES = {  # name -> (sizes, acceptable for static, acceptable for dynamic_bound)
    "exact": ((2, 3, 4, 5), True, True),
    "smaller": ((1, 3, 4, 5), False, True),
    "larger": ((3, 3, 4, 5), False, False),
    "rank": ((2, 3, 20), False, False),
    "empty": ((0, 3, 4, 5), False, True),
}


def expected_action(
    planned: bool,
    same_device: bool,
    layout_ok: bool,
    dtype_ok: bool,
    shape_ok: bool,
    empty: bool,
    policy: Policy,
) -> Action | None:
    """The placement table of DESIGN.md, written as a table lookup (None: an InputError)."""
    if not dtype_ok or not shape_ok:
        return None
    if empty:
        return Action.EMPTY
    table = {
        # planned, same device -> action by transfers policy
        (True, True): {"auto": Action.COPY, "allow": Action.COPY, "forbid": Action.COPY},
        (True, False): {"auto": Action.TRANSFER, "allow": Action.TRANSFER, "forbid": None},
        (False, False): {"auto": None, "allow": Action.MOVE, "forbid": None},
    }
    if (planned, same_device) in table:
        return table[(planned, same_device)][policy.transfers]
    if layout_ok:
        return Action.SHARE
    return Action.CONVERT if policy.layout == "convert" else None


CASES = list(
    itertools.product(
        [True, False],  # planned
        ["same", "other_type", "other_index"],  # device
        [CONTIGUOUS, CHANNELS_LAST, None],  # caller layout (program is contiguous)
        [torch.float32, torch.float16],  # dtype
        list(SHAPES),  # shape case
        ["static", "dynamic_bound"],  # program dynamism
        ["auto", "allow", "forbid"],  # transfers
        ["strict", "convert"],  # layout policy
        [CPU, CUDA0],  # program device
    )
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x) for x in c))
def test_decision_table(case: tuple) -> None:  # type: ignore[type-arg]
    planned, dev, layout, dtype, shape, dynamism, transfers, layout_policy, prog_dev = case
    expected = program_tensor(planned, prog_dev, dynamism, CONTIGUOUS)
    if dev == "same":
        got_dev = prog_dev
    elif dev == "other_type":
        got_dev = CUDA0 if prog_dev == CPU else CPU
    else:  # another index of CUDA (for a CPU program: a CUDA device as well)
        got_dev = CUDA1
    sizes, ok_static, ok_dynamic = SHAPES[shape]
    got_layout = layout if layout is None or len(layout) == len(sizes) else tuple(range(len(sizes)))
    got = caller_tensor(sizes, dtype, got_dev, got_layout)
    policy = Policy(transfers, layout_policy)
    shape_ok = ok_static if dynamism == "static" else ok_dynamic
    layout_ok = got_layout is not None and got_layout == CONTIGUOUS
    want = expected_action(
        planned,
        got_dev == prog_dev,
        layout_ok,
        dtype == torch.float32,
        shape_ok,
        0 in sizes,
        policy,
    )
    if want is None:
        with pytest.raises(InputError) as err:
            decide(expected, got, policy, "input 3 of 'forward'")
        message = str(err.value)
        assert message.startswith("input 3 of 'forward': expected float32[")
        assert f"got {str(dtype).removeprefix('torch.')}[" in message or "laid out" in message
        assert str(prog_dev) in message
    else:
        assert decide(expected, got, policy, "input 3 of 'forward'") is want


def test_error_message_names_everything() -> None:
    expected = TensorInfo((2, 3), torch.float32, (0, 1), CPU, (3, 1), True)
    got = TensorInfo((2, 3), torch.float64, (0, 1), CPU, (3, 1))
    with pytest.raises(
        InputError,
        match=r"^input 0 of 'forward': expected float32\[2, 3\] on cpu, got float64\[2, 3\] on cpu",
    ):
        decide(expected, got, Policy(), "input 0 of 'forward'")


def test_a_tensor_reads_the_same_in_every_message() -> None:
    """``TensorInfo.shape_text`` is the one way messages write a dtype and sizes: the
    mismatch errors and ``str`` of a program's tensor, bounds and all."""
    bound = TensorInfo((4, 3), torch.float32, (0, 1), CPU, (3, 1), True, "dynamic_bound")
    unbound = TensorInfo((4, 3), torch.float32, (0, 1), CPU, (3, 1), True, "dynamic_unbound")
    static = TensorInfo((4, 3), torch.float32, (1, 0), CPU, (1, 4), True)
    assert bound.shape_text == "float32[<=4, <=3]"
    assert unbound.shape_text == "float32[rank 2]"
    assert str(bound) == "float32[<=4, <=3] on cpu"
    assert str(static) == "float32[4, 3] (dim_order[1, 0]) on cpu"
    scalar = TensorInfo((), torch.int64, (), CPU, (), True, "dynamic_bound")
    assert scalar.shape_text == "int64[]"
    got = TensorInfo((5, 3), torch.float32, (0, 1), CPU, (3, 1))
    with pytest.raises(
        InputError, match=r"expected float32\[<=4, <=3\] on cpu, got float32\[5, 3\]"
    ):
        decide(bound, got, Policy(), "input 0 of 'forward'")


def test_size_one_dims_do_not_decide_the_layout() -> None:
    expected = TensorInfo(
        (2, 1, 4, 4),
        torch.float32,
        CHANNELS_LAST,
        CPU,
        dim_order_strides((2, 1, 4, 4), CHANNELS_LAST),
        False,
    )
    contiguous = TensorInfo(
        (2, 1, 4, 4), torch.float32, CONTIGUOUS, CPU, dim_order_strides((2, 1, 4, 4), CONTIGUOUS)
    )
    assert (
        decide(expected, contiguous) is Action.SHARE
    )  # with C == 1 both layouts are the same memory


def test_policy_rejects_unknown_values() -> None:
    with pytest.raises(ValueError, match="transfers"):
        Policy("sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layout"):
        Policy("auto", "loose")  # type: ignore[arg-type]


# ---- through a real method ---------------------------------------------------------------


class AddMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x * y + 1


@pytest.fixture(scope="module")
def unplanned() -> ptexec.Method:
    data = export_program(AddMul(), (torch.randn(3, 4), torch.randn(3, 4)), unplanned=True)
    return ptexec.load(data).load_method("forward", outputs="view")


@pytest.fixture(scope="module")
def planned() -> ptexec.Method:
    data = export_program(AddMul(), (torch.randn(3, 4), torch.randn(3, 4)))
    return ptexec.load(data).load_method("forward", outputs="view")


def test_unplanned_input_is_shared(unplanned: ptexec.Method) -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    alias, result = unplanned(x, y)
    assert alias.data_ptr() == x.data_ptr(), "the program must read the caller's memory"
    torch.testing.assert_close(result, x * y + 1)
    assert unplanned.last_call.inputs == ["share", "share"]
    assert unplanned.last_call.copies == 0


def test_planned_input_is_copied(planned: ptexec.Method) -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    alias, result = planned(x, y)
    assert alias.data_ptr() != x.data_ptr()
    torch.testing.assert_close(alias, x)
    torch.testing.assert_close(result, x * y + 1)
    assert planned.last_call.inputs == ["copy", "copy"]
    assert planned.last_call.h2h == 2 * x.nbytes


def test_numpy_and_dlpack_inputs_are_shared(unplanned: ptexec.Method) -> None:
    x = np.random.rand(3, 4).astype(np.float32)
    y = torch.randn(3, 4)

    class Producer:  # a minimal DLPack producer wrapping numpy
        def __init__(self, a: np.ndarray) -> None:
            self.a = a

        def __dlpack__(self, **kw: object) -> object:
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self) -> tuple[int, int]:
            return self.a.__dlpack_device__()

    for given in (x, Producer(x)):
        alias, result = unplanned(given, y)
        assert alias.data_ptr() == x.ctypes.data
        torch.testing.assert_close(result, torch.from_numpy(x) * y + 1)


def test_layout_mismatch_for_an_unplanned_input(unplanned: ptexec.Method) -> None:
    x = torch.randn(4, 3).t()  # right shape, transposed layout
    y = torch.randn(3, 4)
    with pytest.raises(
        InputError, match=r"input 0 of 'forward'.*laid out contiguous, got dim_order\[1, 0\]"
    ):
        unplanned(x, y)
    alias, result = unplanned.execute([x, y], layout="convert")
    assert unplanned.last_call.inputs == ["convert", "share"]
    torch.testing.assert_close(result, x * y + 1)
    assert alias.is_contiguous()


def test_a_view_of_a_converted_input_is_read_before_the_next_conversion(
    unplanned: ptexec.Method,
) -> None:
    """An output that is a converted input is a view of the memory the conversion copies
    into; fed back as another input of a call that converts again, it is read before that
    copy overwrites it (it read the new input's values instead of its own)."""
    x1 = torch.arange(12.0).reshape(4, 3).t()
    alias, _ = unplanned.execute([x1, torch.ones(3, 4)], layout="convert")
    assert unplanned.last_call.inputs == ["convert", "share"] and torch.equal(alias, x1)
    x2 = torch.full((4, 3), 5.0).t()
    _, result = unplanned.execute([x2, alias], layout="convert")
    torch.testing.assert_close(result, AddMul()(x2, x1.clone())[1])


def test_negative_strides_numpy(unplanned: ptexec.Method, planned: ptexec.Method) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-1]
    y = torch.ones(3, 4)
    with pytest.raises(InputError, match="strided"):
        unplanned(x, y)
    _, result = planned(x, y)
    torch.testing.assert_close(result, torch.from_numpy(x.copy()) + 1)


@pytest.mark.parametrize("option", ["transfers", "layout"])
@pytest.mark.parametrize("value", ["", False, 0])
def test_a_call_refuses_a_policy_load_refuses(
    unplanned: ptexec.Method, option: str, value: object
) -> None:
    """A per-call ``transfers`` or ``layout`` is checked as at load: a value that is not
    one of the policy's raises, as ``load_method`` does with it (a false one ran under the
    method's own policy)."""
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.raises(ValueError, match=option):
        unplanned.program.load_method("forward", **{option: value})
    with pytest.raises(ValueError, match=option):
        unplanned.execute([x, y], **{option: value})
    torch.testing.assert_close(unplanned(x, y)[1], x * y + 1)


def test_unmodeled_device_is_named(unplanned: ptexec.Method) -> None:
    with pytest.raises(
        UnsupportedDeviceError,
        match=r"input 0 of 'forward' is on meta; ptexec runs tensors on cpu and cuda",
    ):
        unplanned(torch.empty(3, 4, device="meta"), torch.randn(3, 4))
    # the method still works
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(unplanned(x, y)[1], x * y + 1)


def test_empty_tensor_on_unmodeled_device_is_exempt() -> None:
    data = export_program(AddMul(), (torch.randn(0, 4), torch.randn(0, 4)), unplanned=True)
    m = ptexec.load(data).load_method("forward")
    alias, _result = m(torch.empty(0, 4, device="meta"), torch.empty(0, 4))
    assert alias.shape == (0, 4) and alias.device.type == "cpu"
    assert m.last_call.inputs == ["empty", "empty"]


def test_wrong_count_and_kind(planned: ptexec.Method) -> None:
    with pytest.raises(InputError, match="takes 2 input"):
        planned(torch.randn(3, 4))
    with pytest.raises(InputError, match=r"input 1 of 'forward': expected a tensor .*got str"):
        planned(torch.randn(3, 4), "y")
    with pytest.raises(InputError, match=r"input 0 of 'forward': expected a tensor .*got NoneType"):
        planned(None, torch.randn(3, 4))


# ---- caller-given outputs -------------------------------------------------------------------


def test_out_for_an_unplanned_output_is_written_in_place(unplanned: ptexec.Method) -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    dest = torch.empty(3, 4)
    _, result = unplanned.execute([x, y], out=[None, dest])
    assert result is dest
    torch.testing.assert_close(dest, x * y + 1)
    assert unplanned.last_call.outputs[1] == "direct"
    assert unplanned.last_call.copies == 0
    # the next call without out= uses the method's own memory again
    _, again = unplanned(x, y)
    assert again.data_ptr() != dest.data_ptr()


def test_out_for_a_planned_output_is_copied_into(planned: ptexec.Method) -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    dest = torch.empty(3, 4)
    _, result = planned.execute([x, y], out=[None, dest])
    assert result is dest
    torch.testing.assert_close(dest, x * y + 1)
    assert planned.last_call.outputs[1] == "copy"


@pytest.mark.parametrize(
    ("dest", "message"),
    [
        (torch.empty(3, 4, dtype=torch.float64), "dtype"),
        (torch.empty(4, 3), "shape"),
        (torch.empty(3, 4, device="meta"), "meta"),
        ("not a tensor", "torch tensor"),
    ],
)
def test_out_is_checked_before_anything_runs(
    unplanned: ptexec.Method, dest: object, message: str
) -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.raises((InputError, UnsupportedDeviceError), match=message):
        unplanned.execute([x, y], out=[None, dest])
    with pytest.raises(InputError, match="has 2 output"):
        unplanned.execute([x, y], out=[None])
    torch.testing.assert_close(unplanned(x, y)[1], x * y + 1)


class _Affine(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


@pytest.mark.parametrize("bounded", [True, False])
@pytest.mark.parametrize("fast_path", [True, False])
def test_out_for_a_dynamic_unplanned_output_writes_only_the_tensor_given(
    bounded: bool, fast_path: bool
) -> None:
    """An ``out=`` tensor of a dynamic unplanned output that is a view of a larger tensor
    (its memory goes on past it) receives the output as eager torch's ``out=`` does: the
    rest of the larger tensor, the caller's input among it, is not written (the output was
    written densely from the view's start, over memory that was not the view's)."""
    rows = torch.export.Dim("rows", min=1, max=4) if bounded else torch.export.Dim("rows")
    data = export_program(
        _Affine(), (torch.randn(4, 5),), unplanned=True, dynamic_shapes=({0: rows},)
    )
    m = ptexec.load(data).load_method("forward", fast_path=fast_path)
    x = torch.arange(20.0).reshape(4, 5)
    # a column slice of the shape of the result
    base = torch.full((4, 10), 7.0)
    got = m.execute([x], out=[base[:, :5]])[0]
    want = torch.full((4, 10), 7.0)
    torch.add(x * 2, 1, out=want[:, :5])
    assert torch.equal(got, x * 2 + 1) and torch.equal(base, want)
    # rows of a tensor whose other rows are the input: the input stays as it was
    base = torch.arange(50.0).reshape(10, 5)
    x = base[5:9]
    before = x.clone()
    got = m.execute([x], out=[base[0:4]])[0]
    assert torch.equal(x, before) and torch.equal(got, before * 2 + 1)
    assert torch.equal(base[0:4], before * 2 + 1)
    # a tensor of its own, dense, holding the bound: written in place (no copy)
    own = torch.empty(4, 5)
    got = m.execute([x], out=[own])[0]
    assert got is own and torch.equal(own, before * 2 + 1)


class _Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x * s


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_numpy_scalars_are_zero_dim_arrays(dtype: type) -> None:
    """A numpy scalar for a 0-d input is read as a 0-d array, whichever its type (numpy's
    float64 and int64 are Python floats and ints as well, and were refused as those)."""
    t = torch.from_numpy(np.zeros((), dtype=dtype)).dtype
    data = export_program(_Scale(), (torch.ones(3, dtype=t), torch.tensor(2, dtype=t)))
    m = ptexec.load(data).load_method("forward")
    got = m.execute([torch.ones(3, dtype=t), dtype(3)])[0]
    assert torch.equal(got, torch.full((3,), 3, dtype=t))
    with pytest.raises(InputError, match=r"got float 3\.0"):
        m.execute([torch.ones(3, dtype=t), 3.0])


class _Accumulate(torch.nn.Module):
    def forward(self, x: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        acc.add_(x)
        return acc * 2


@pytest.mark.parametrize("fast_path", [True, False])
def test_an_input_in_the_methods_memory_is_a_counted_copy(fast_path: bool) -> None:
    """A view-mode output fed back as an unplanned input that the program writes is read
    into a copy first (the call overwrites the method's memory): the call says so, a copy
    of its bytes, not a share of the caller's memory."""
    data = export_program(_Accumulate(), (torch.ones(4, 1), torch.zeros(4, 1)), unplanned=True)
    m = ptexec.load(data).load_method("forward", fast_path=fast_path, outputs="view")
    x = torch.ones(4, 1)
    _, doubled = m(x, torch.zeros(4, 1))
    fed = doubled.clone()
    mutated, result = m(x, doubled)
    assert m.last_call.inputs == ["share", "copy"] and m.last_call.h2h == doubled.nbytes
    acc = fed.clone()
    want = _Accumulate()(x, acc)
    assert torch.equal(mutated, acc) and torch.equal(result, want)


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_negative_stride_along_one_element_still_shares_the_array(fast_path: bool) -> None:
    """A numpy array whose axis of one element has a negative stride is dense: an unplanned
    input the program writes in place writes the caller's array, as eager PyTorch's
    ``add_`` writes the caller's tensor (the array was copied, and the write lost)."""
    data = export_program(_Accumulate(), (torch.ones(4, 1), torch.zeros(4, 1)), unplanned=True)
    m = ptexec.load(data).load_method("forward", fast_path=fast_path)
    x = torch.arange(4.0).reshape(4, 1)
    base = np.linspace(1, 4, 4, dtype=np.float32).reshape(4, 1)
    acc = base[:, ::-1]
    assert acc.strides[1] < 0 and np.shares_memory(acc, base)
    expected_acc = torch.from_numpy(base.copy())
    expected = _Accumulate()(x, expected_acc)
    mutated, doubled = m(x, acc)
    assert m.last_call.inputs == ["share", "share"]
    assert torch.equal(torch.from_numpy(base), expected_acc), "the caller's array is written"
    assert torch.equal(mutated, expected_acc) and torch.equal(doubled, expected)


class _ElsewhereArray:
    """A DLPack producer of ``t``'s memory that says it lives on Metal (kDLMetal, 8), a
    device ptexec does not model: its capsules are torch's, with the device rewritten."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.shape = tuple(t.shape)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (8, 0)

    def __dlpack__(self, **kwargs: object) -> object:
        import ctypes

        capsule = self.t.__dlpack__(**kwargs)
        api = ctypes.pythonapi
        api.PyCapsule_GetName.restype = ctypes.c_char_p
        api.PyCapsule_GetName.argtypes = [ctypes.py_object]
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        name = api.PyCapsule_GetName(capsule)
        # the DLTensor's device type: after the data pointer, in a versioned capsule after
        # the version, the manager context, the deleter and the flags
        at = api.PyCapsule_GetPointer(capsule, name) + 8 + (32 if b"versioned" in name else 0)
        ctypes.c_int32.from_address(at).value = 8
        return capsule


@pytest.mark.parametrize("planned", [True, False], ids=["planned", "unplanned"])
def test_an_empty_array_on_an_unmodeled_device_keeps_its_shape_and_dtype(planned: bool) -> None:
    """An empty DLPack array on a device ptexec does not model is exempt from the device
    check, as an empty torch tensor is: it binds with its own sizes and dtype (it was bound
    as a 1-d float32 tensor: a [0, 8] batch was refused for its rank, and an empty array of
    another dtype could pass the dtype check)."""
    name = "dynamic_mlp" if planned else "dynamic_mlp_unplanned"
    from fixture_data import fixture_paths

    m = ptexec.load(fixture_paths(name)[0]).load_method("forward")
    (y,) = m(_ElsewhereArray(torch.empty(0, 8)))
    # eager PyTorch: a linear stack on an empty batch gives an empty batch of its width
    assert y.shape == (0, 4) and y.dtype == torch.float32
    assert m.last_call.inputs == ["empty"]
    with pytest.raises(InputError, match=r"got int64\[0, 8\] on cpu \(dtype\)"):
        m(_ElsewhereArray(torch.empty(0, 8, dtype=torch.int64)))
    with pytest.raises(UnsupportedDeviceError, match=r"kDLMetal"):
        m(_ElsewhereArray(torch.ones(1, 8)))
