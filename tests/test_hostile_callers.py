"""What a careless (or hostile) caller hands a method: aliased out= tensors, read-only
memory the program writes, tensors that cannot hold an output, odd tensor kinds. Each is
refused with an InputError before anything is written, and the method works afterwards."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import ptexec
from export_util import export_program
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance


class _Two(torch.nn.Module):
    """Two inputs, two outputs: the second output reads x after the first is written."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return y * 2.0, x + y


@pytest.fixture(scope="module")
def two() -> bytes:
    x = torch.randn(4, 6)
    return export_program(_Two(), (x, x.clone()), unplanned=True)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)


def _check_still_works(m: ptexec.Method) -> None:
    x, y = _inputs()
    a, b = m.execute([x, y])
    torch.testing.assert_close(a, y * 2.0)
    torch.testing.assert_close(b, x + y)


def test_an_out_tensor_that_is_an_input_is_refused(two: bytes) -> None:
    m = ptexec.load(two).load_method()
    x, y = _inputs()
    kept = x.clone()
    with pytest.raises(ptexec.InputError, match=r"out\[0\].*overlaps the memory of input 0"):
        m.execute([x, y], out=[x, None])
    assert torch.equal(x, kept)  # nothing was written
    _check_still_works(m)


def test_one_tensor_for_two_outputs_is_refused(two: bytes) -> None:
    m = ptexec.load(two).load_method()
    x, y = _inputs()
    z = torch.empty(4, 6)
    with pytest.raises(ptexec.InputError, match=r"out\[1\].*overlaps the memory of out\[0\]"):
        m.execute([x, y], out=[z, z])
    _check_still_works(m)


def test_overlapping_out_tensors_are_refused(two: bytes) -> None:
    m = ptexec.load(two).load_method()
    x, y = _inputs()
    base = torch.empty(10, 6)
    with pytest.raises(ptexec.InputError, match="overlaps"):
        m.execute([x, y], out=[base[0:4], base[2:6]])
    # disjoint parts of one tensor are fine, and get the right answer
    a, b = m.execute([x, y], out=[base[0:4], base[4:8]])
    assert b.data_ptr() == base[4:8].data_ptr()
    torch.testing.assert_close(base[0:4], y * 2.0)
    torch.testing.assert_close(base[4:8], x + y)
    assert a.data_ptr() == base[0:4].data_ptr()


def test_an_out_tensor_over_an_input_view_is_refused(two: bytes) -> None:
    m = ptexec.load(two).load_method()
    big = torch.randn(8, 6)
    x, y = big[:4], big[4:]
    with pytest.raises(ptexec.InputError, match="overlaps the memory of input 1"):
        m.execute([x, y], out=[big[4:8], None])


@pytest.mark.parametrize("unplanned", [False, True])
def test_an_out_tensor_in_the_methods_own_memory_is_refused(unplanned: bool) -> None:
    x, y = _inputs()
    m = ptexec.load(export_program(_Two(), (x, y), unplanned=unplanned)).load_method()
    a, b = m.execute([x, y], outputs="view")
    for given in ([a, None], [None, b], [None, a]):
        with pytest.raises(ptexec.InputError, match="the method's own memory"):
            m.execute([x, y], out=given)
    _check_still_works(m)


def test_out_with_elements_sharing_memory_is_refused() -> None:
    m = ptexec.load(fixture_paths("mlp")[0]).load_method()  # planned output float32[2, 4]
    x = fixture_calls("mlp")[0]["inputs"]
    expanded = torch.zeros(1, 4).expand(2, 4)
    with pytest.raises(ptexec.InputError, match="share memory"):
        m.execute(x, out=[expanded])
    want = fixture_calls("mlp")[0]["outputs"]
    assert compare_outputs(m.execute(x), want, *tolerance("mlp")) is None
    strided = torch.zeros(2, 8)[:, ::2]  # spread out, not overlapping: accepted
    m.execute(x, out=[strided])
    assert compare_outputs([strided], want, *tolerance("mlp")) is None


def test_out_that_cannot_grow_for_a_dynamic_output_is_refused() -> None:
    pte, _ = fixture_paths("dynamic_mlp")
    m = ptexec.load(pte).load_method()
    call = fixture_calls("dynamic_mlp")[0]
    info = m.meta.outputs[0]
    assert isinstance(info, ptexec.TensorInfo) and info.dynamism != "static"
    small = torch.from_numpy(np.zeros((1, *info.sizes[1:]), dtype=np.float32))
    with pytest.raises(ptexec.InputError, match="cannot grow"):
        m.execute(call["inputs"], out=[small])
    roomy = torch.from_numpy(np.zeros(info.sizes, dtype=np.float32))[:1]  # capacity for the bound
    got = m.execute(call["inputs"], out=[roomy])
    assert compare_outputs(got, call["outputs"], *tolerance("dynamic_mlp")) is None
    grows = torch.empty(0, *info.sizes[1:])  # torch's own memory grows as needed
    assert (
        compare_outputs(m.execute(call["inputs"], out=[grows]), call["outputs"], 1e-5, 1e-5) is None
    )


@pytest.mark.parametrize("unplanned", [False, True])
@pytest.mark.parametrize("layout", ["default", "convert"])  # the fast path and the general one
def test_inputs_in_the_methods_own_memory_are_read_before_it_is_written(
    unplanned: bool, layout: str
) -> None:
    """Views of an earlier call's outputs (``outputs="view"``), passed back in: wherever they
    lie in the method's planned memory, the outputs are those of the same values in memory
    of their own (copying one input into its planned view, or the run, may overwrite the
    other before it is read)."""
    x0, y0 = _inputs()
    m = ptexec.load(export_program(_Two(), (x0, y0), unplanned=unplanned)).load_method()
    options = {} if layout == "default" else {"layout": layout}
    a, _ = m.execute([x0, y0], outputs="view")
    memory = a.untyped_storage()
    floats = memory.nbytes() // 4
    assert floats >= 24  # the method's planned memory holds at least the outputs
    g = torch.Generator().manual_seed(5)
    for offset in range(0, floats - 24 + 1):
        for other in range(0, floats - 24 + 1, 5):
            x = torch.empty(0).set_(memory, offset, (4, 6))
            y = torch.empty(0).set_(memory, other, (4, 6))
            x.copy_(torch.randn(4, 6, generator=g))
            if other != offset:
                y.copy_(torch.randn(4, 6, generator=g))
            want = (y * 2.0, x + y)  # eager, on copies made now
            got = m.execute([x, y], **options)
            torch.testing.assert_close(got[0], want[0])
            torch.testing.assert_close(got[1], want[1])
    _check_still_works(m)


class _Mutates(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return x + 1.0


@pytest.fixture(scope="module")
def mutates() -> bytes:
    return export_program(_Mutates(), (torch.randn(3, 4),), unplanned=True)


def test_a_read_only_array_the_program_writes_is_refused(mutates: bytes) -> None:
    m = ptexec.load(mutates).load_method()
    assert m.state.inputs[0].written
    raw = np.arange(12, dtype=np.float32).tobytes()
    frozen = np.frombuffer(raw, dtype=np.float32).reshape(3, 4)
    assert not frozen.flags.writeable
    with pytest.raises(ptexec.InputError, match="read-only"):
        m.execute([frozen])
    assert raw == np.arange(12, dtype=np.float32).tobytes()  # the bytes object is intact
    writable = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = m.execute([writable])[-1]  # the program also returns the mutated input first
    np.testing.assert_allclose(out.numpy(), np.arange(12).reshape(3, 4) * 2.0 + 1.0)
    np.testing.assert_allclose(writable, np.arange(12).reshape(3, 4) * 2.0)  # as eager does


def test_a_lazily_negated_tensor_the_program_writes_is_refused(mutates: bytes) -> None:
    """Its memory does not hold its values, so the program cannot write it in place; the
    caller's tensor is left as it was."""
    m = ptexec.load(mutates).load_method()
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    lazy = torch._neg_view(base)
    with pytest.raises(ptexec.InputError, match="lazy negation"):
        m.execute([lazy])
    assert torch.equal(base, torch.arange(12, dtype=torch.float32).reshape(3, 4))
    x = lazy.resolve_neg()
    out = m.execute([x])[-1]
    torch.testing.assert_close(out, -base * 2.0 + 1.0)


def test_a_lazily_negated_tensor_the_program_reads_is_converted() -> None:
    m = ptexec.load(fixture_paths("mlp_unplanned")[0]).load_method()
    x = fixture_calls("mlp_unplanned")[0]["inputs"][0]
    lazy = torch._neg_view(-x)
    got = m.execute([lazy])
    assert m.last_call.inputs == ["convert"]
    assert compare_outputs(got, fixture_calls("mlp_unplanned")[0]["outputs"], 1e-5, 1e-5) is None


def test_a_read_only_array_the_program_only_reads_is_shared() -> None:
    m = ptexec.load(fixture_paths("mlp_unplanned")[0]).load_method()
    assert not m.state.inputs[0].written
    x = fixture_calls("mlp_unplanned")[0]["inputs"][0]
    frozen = np.frombuffer(x.numpy().tobytes(), dtype=np.float32).reshape(x.shape)
    got = m.execute([frozen])
    assert m.last_call.inputs == ["share"]
    assert compare_outputs(got, fixture_calls("mlp_unplanned")[0]["outputs"], 1e-5, 1e-5) is None


@pytest.mark.parametrize("layout", ["strict", "convert"])
def test_a_nested_tensor_is_an_input_error(layout: str) -> None:
    m = ptexec.load(fixture_paths("mlp")[0]).load_method()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])
    with pytest.raises(ptexec.InputError, match="nested"):
        m.execute([nested], layout=layout)
    with pytest.raises(ptexec.InputError, match="nested"):
        m.execute([nested])  # the fast path hands it to the general one
    call = fixture_calls("mlp")[0]
    assert compare_outputs(m.execute(call["inputs"]), call["outputs"], *tolerance("mlp")) is None


def _renamed(data: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and data.count(old) >= 1
    return data.replace(old, new)


def test_a_method_name_with_a_nul_byte_loads_everywhere() -> None:
    xnn = fixture_paths("mlp")[0].parent / "xnnpack" / "mlp.pte"
    data = _renamed(xnn.read_bytes(), b"forward", b"forw\0rd")
    prog = ptexec.load(data)
    assert prog.method_names == ("forw\0rd",)
    m = prog.load_method("forw\0rd")
    inputs = [torch.randn(info.sizes) for info in m.meta.inputs]  # type: ignore[union-attr]
    (out,) = m.execute(inputs)
    assert out.shape == tuple(m.meta.outputs[0].sizes)  # type: ignore[union-attr]


class _Producer:
    """A DLPack producer of another library (not numpy or torch), over a numpy array."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kwargs: object) -> object:
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.a.__dlpack_device__()


class _ExportsOnce(_Producer):
    """A producer whose memory is exported once: a second ``__dlpack__`` raises."""

    def __init__(self, a: np.ndarray) -> None:
        super().__init__(a)
        self.exported = False

    def __dlpack__(self, **kwargs: object) -> object:
        if self.exported:
            raise BufferError("exported already")
        self.exported = True
        return super().__dlpack__(**kwargs)


@pytest.mark.parametrize("producer", [_Producer, _ExportsOnce])
def test_read_only_memory_through_dlpack_is_not_written(
    mutates: bytes, producer: type[_Producer]
) -> None:
    """DLPack 1.x marks read-only memory (here an immutable bytes object): a program that
    writes the input in place is refused, as for the numpy array itself. The flag is read
    from the capsule the program's view is made of, not from another export: a producer
    that exports once is refused as one that exports again (its bytes were written)."""
    m = ptexec.load(mutates).load_method()
    raw = np.arange(12, dtype=np.float32).tobytes()
    frozen = np.frombuffer(raw, dtype=np.float32).reshape(3, 4)
    with pytest.raises(ptexec.InputError, match="read-only"):
        m.execute([producer(frozen)])
    assert raw == np.arange(12, dtype=np.float32).tobytes()
    writable = np.arange(12, dtype=np.float32).reshape(3, 4)
    m.execute([producer(writable)])  # a writable one is shared and written, as eager
    np.testing.assert_allclose(writable, np.arange(12).reshape(3, 4) * 2.0)


class _Copies(_Producer):
    """A producer that hands a copy of its memory and says so (DLPack 1.x's IS_COPIED
    flag), as ``copy=None`` lets it."""

    def __dlpack__(self, **kwargs: object) -> object:
        import ctypes

        capsule = self.a.copy().__dlpack__(**kwargs)
        api = ctypes.pythonapi
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        managed = api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        # DLManagedTensorVersioned: version, manager_ctx, deleter, then the flags
        ctypes.c_uint64.from_address(managed + 24).value |= 2  # IS_COPIED
        return capsule


def test_a_copy_handed_for_a_written_input_is_refused(mutates: bytes) -> None:
    """Eager writes the caller's array; the program would write the producer's copy, and
    the caller's array would keep its values: refused. A program that only reads the
    input reads the copy's values, which are the array's."""
    m = ptexec.load(mutates).load_method()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(ptexec.InputError, match="copy"):
        m.execute([_Copies(a)])
    np.testing.assert_array_equal(a, np.arange(12).reshape(3, 4))
    m.execute([_Producer(a)])
    np.testing.assert_allclose(a, np.arange(12).reshape(3, 4) * 2.0)  # as eager does
    reads = ptexec.load(fixture_paths("mlp_unplanned")[0]).load_method()
    call = fixture_calls("mlp_unplanned")[0]
    got = reads.execute([_Copies(call["inputs"][0].numpy())])
    assert compare_outputs(got, call["outputs"], 1e-5, 1e-5) is None


def test_a_written_input_is_never_converted_into_a_copy(mutates: bytes) -> None:
    """layout='convert' would hand the program a copy, and its write would never reach the
    caller's tensor (eager writes it): refused, the tensor untouched."""
    m = ptexec.load(mutates).load_method()
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3).t()  # another layout
    kept = x.clone()
    with pytest.raises(ptexec.InputError, match="writes this input in place"):
        m.execute([x], layout="convert")
    assert torch.equal(x, kept)
    out = m.execute([x.contiguous()], layout="convert")[-1]
    torch.testing.assert_close(out, kept * 2.0 + 1.0)


def test_a_negative_stride_on_a_size_one_axis_is_read() -> None:
    """numpy calls such an array contiguous, and torch cannot view its stride as is: it is
    read through a view of the same memory with a stride of 0 along that axis."""
    m = ptexec.load(fixture_paths("dynamic_mlp")[0]).load_method()
    x = fixture_calls("dynamic_mlp")[0]["inputs"][0].numpy()
    flipped = x[:1][::-1]  # strides (-32, 4)
    assert flipped.strides[0] < 0 and flipped.flags.c_contiguous
    got = m.execute([flipped])[0]
    torch.testing.assert_close(got, m.execute([torch.from_numpy(flipped.copy())])[0])


class _AddsInto(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(y)
        return x * 3.0 + y


def test_a_written_input_sharing_memory_with_another_is_refused() -> None:
    """The program writes x while reading y: the same tensor for both (or overlapping
    ones) would give neither eager's answer nor the program's; refused, untouched, and the
    method answers as eager for separate tensors, every call."""
    x0 = torch.randn(4, 6)
    m = ptexec.load(export_program(_AddsInto(), (x0, x0.clone()), unplanned=True)).load_method()
    for _ in range(2):  # the general path, and again where a fast call would be
        t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        kept = t.clone()
        with pytest.raises(ptexec.InputError, match="shares memory with input 1"):
            m.execute([t, t])
        assert torch.equal(t, kept)
        big = torch.arange(30, dtype=torch.float32)
        with pytest.raises(ptexec.InputError, match="shares memory"):
            m.execute([big[:24].view(4, 6), big[6:].view(4, 6)])
        x, y = t.clone(), t.clone() + 1
        eager_x = x.clone()
        eager_x.add_(y)
        want = eager_x * 3.0 + y
        torch.testing.assert_close(m.execute([x, y])[-1], want)  # (after the written input)
        torch.testing.assert_close(x, eager_x)


class _Pair(torch.Tensor):
    """A wrapper subclass holding two tensors, each op applied to both (as torch's own
    test subclass TwoTensor): its values are not in its memory."""

    @staticmethod
    def __new__(cls, a: torch.Tensor, b: torch.Tensor) -> _Pair:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, a.shape, dtype=a.dtype, device=a.device, strides=a.stride()
        )

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.a, self.b = a, b

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        from torch.utils._pytree import tree_map

        kwargs = kwargs or {}
        first = tree_map(lambda t: t.a if isinstance(t, _Pair) else t, (args, kwargs))
        second = tree_map(lambda t: t.b if isinstance(t, _Pair) else t, (args, kwargs))
        out_a, out_b = func(*first[0], **first[1]), func(*second[0], **second[1])
        if isinstance(out_a, torch.Tensor) and isinstance(out_b, torch.Tensor):
            return _Pair(out_a, out_b)
        return out_a


class _Logged(torch.Tensor):
    """A subclass over its own memory whose torch functions run a Python hook."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") in ("add", "mul", "add_", "mul_"):
            return torch.zeros(())  # a hook that would change the program's answer
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("program", ["two", "mutates"])
def test_a_tensor_subclass_is_read_by_its_memory_or_refused(
    program: str, two: bytes, mutates: bytes
) -> None:
    """A subclass whose values are in its memory is read as a plain tensor over that
    memory (its Python hooks run no kernel of the program, as ExecuTorch's runtime runs
    the program on memory alone): the answer is eager PyTorch's on the plain tensor. One
    with its own ``__torch_dispatch__`` keeps its values elsewhere and is refused."""
    data = two if program == "two" else mutates
    m = ptexec.load(data).load_method()
    x, y = _inputs()
    if program == "mutates":
        x, y = x[:3, :4].contiguous(), None
    inputs = [x] if y is None else [x, y]
    pair = _Pair(x.clone(), x + 100.0)
    with pytest.raises(ptexec.InputError, match="__torch_dispatch__"):
        m.execute([pair, *inputs[1:]])
    assert torch.equal(pair.a, x) and torch.equal(pair.b, x + 100.0)

    reference = [t.clone() for t in inputs]
    if program == "two":
        want = list(_Two()(*reference))
    else:
        want = [reference[0], _Mutates()(reference[0])]  # the written input, then x + 1
    logged = x.clone().as_subclass(_Logged)
    got = m.execute([logged, *inputs[1:]])
    for g, w in zip(got, want, strict=True):
        assert type(g) is torch.Tensor
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    # the program's write of the input lands in the caller's memory, as in the plain one
    torch.testing.assert_close(logged.as_subclass(torch.Tensor), reference[0], rtol=0, atol=0)


def test_an_out_tensor_whose_subclass_hooks_torch_is_refused(two: bytes) -> None:
    """The method writes an unplanned output straight into the ``out=`` tensor by the
    kernels' ``out=``: a subclass's hook would take those writes (``_Logged`` returns
    zeros instead of writing, and the caller got uninitialized memory). A subclass that
    overrides neither hook (a Parameter) receives the output."""
    m = ptexec.load(two).load_method()
    x, y = _inputs()
    for given in (
        torch.zeros(4, 6).as_subclass(_Logged),
        _Pair(torch.zeros(4, 6), torch.zeros(4, 6)),
    ):
        with pytest.raises(ptexec.InputError, match=r"out\[0\].*subclass with its own __torch"):
            m.execute([x, y], out=[given, None])
    param = torch.nn.Parameter(torch.zeros(4, 6), requires_grad=False)
    got = m.execute([x, y], out=[param, None])
    assert got[0] is param
    torch.testing.assert_close(param.detach(), y * 2.0, rtol=0, atol=0)
    _check_still_works(m)
