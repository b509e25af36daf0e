"""ptexec.portable_lib offers executorch.extension.pybindings.portable_lib's names.

ExecuTorch's own module is the reference where it is installed: the same files through
both, compared. (The wheel's own tests run against this module in test_executorch_suite.)
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fixture_data import FIXTURES_DIR, compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec import portable_lib as pl
from ptexec.errors import (
    DeviceUnavailableError,
    MethodNotFoundError,
    NotFoundError,
    OutputMismatchError,
    PteFormatError,
    StateError,
    UnsupportedDeviceError,
)
from ptexec.format.bundled import BundledTensor, read_bundled
from ptexec.format.flatbuf import Buffer

COMPAT = FIXTURES_DIR / "compat"


def _et() -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("executorch.extension.pybindings.portable_lib")


def _bundled_io() -> dict[str, Any]:
    return torch.load(COMPAT / "compat.io.pt", weights_only=True)["bundled"]  # type: ignore[no-any-return]


def test_every_name_of_executorchs_module_is_here() -> None:
    theirs = {n for n in dir(_et()) if not n.startswith("__")}
    theirs -= {"glob", "importlib", "logger", "logging", "os", "spec", "sys"}  # its imports
    missing = theirs - set(dir(pl))
    assert missing == {"_load_for_executorch_from_data_loader"}  # takes an ExecuTorch C++ loader


def test_module_methods_and_calls() -> None:
    name = "two_method_state"
    data = fixture_paths(name)[0].read_bytes()
    module = pl._load_for_executorch_from_buffer(data)
    assert sorted(module.method_names()) == ["other", "step"]
    for call in fixture_calls(name):
        got = module.run_method(call["method"], call["inputs"])
        assert compare_outputs(got, call["outputs"], *tolerance(name)) is None
    assert not module.has_etdump()
    with pytest.raises(StateError):
        module.write_etdump_result_to_file("x.etdp")
    with pytest.raises(RuntimeError):
        module.run_method("not_a_method", [])


def test_single_tensor_call_and_plan_execute() -> None:
    pte = fixture_paths("mlp")[0]
    call = fixture_calls("mlp")[0]
    module = pl._load_for_executorch(str(pte))
    (x,) = call["inputs"]
    first = module(x)  # one tensor stands for a list of one
    assert compare_outputs(first, call["outputs"], *tolerance("mlp")) is None
    again = module.plan_execute("forward")  # the inputs it was last given
    assert compare_outputs(again, call["outputs"], *tolerance("mlp")) is None


@pytest.mark.parametrize("name", ["mlp", "mlp_unplanned"])
def test_the_inputs_kept_for_plan_execute_are_as_given(name: str) -> None:
    """ExecuTorch copies a memory-planned input into the plan when it is given, so a
    caller reusing its tensor afterwards does not change what plan_execute runs on; an
    unplanned input is the caller's memory itself. Both runtimes, the same file."""
    path = str(FIXTURES_DIR / f"{name}.pte")
    got, want = [], []
    for lib, results in ((pl, got), (_et(), want)):
        module = lib._load_for_executorch(path)
        x = torch.ones(2, 8)
        results.append(module.forward([x])[0])
        x.mul_(3)
        results.append(module.plan_execute("forward")[0])
        method = lib._load_program(path).load_method("forward")
        y = torch.ones(2, 8)
        method.set_inputs([y])
        y.mul_(-2)
        method.execute()
        results.append(method.get_outputs()[0])
    for ours, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(ours, theirs)
    planned = pl._load_for_executorch(path).method_meta("forward").input_tensor_meta(0)
    assert torch.equal(got[0], got[1]) == planned.is_memory_planned()


def test_clone_outputs_false_gives_the_methods_memory() -> None:
    module = pl._load_for_executorch(str(fixture_paths("mlp")[0]))
    x = torch.randn(2, 8)
    view = module.forward([x], clone_outputs=False)[0]
    copy = module.forward([x], clone_outputs=True)[0]
    assert torch.equal(view, copy)
    module.forward([x * 2], clone_outputs=False)
    assert not torch.equal(view, copy)  # the view is the method's memory, rewritten
    again = module.forward([x], clone_outputs=False)[0]
    assert again.data_ptr() == view.data_ptr()


def test_views_of_a_dynamic_method_keep_their_shape_as_executorchs() -> None:
    """clone_outputs=False: a view keeps the shape it had; the next call rewrites its data."""
    path = str(FIXTURES_DIR / "dynamic_mlp.pte")
    seen = []
    for lib in (pl, _et()):
        module = lib._load_for_executorch(path)
        g = torch.Generator().manual_seed(0)
        first = module.forward([torch.randn(5, 8, generator=g)], clone_outputs=False)[0]
        second = module.forward([torch.randn(3, 8, generator=g)], clone_outputs=False)[0]
        seen.append((first.clone(), second.clone()))
        assert tuple(first.shape) == (5, 4) and tuple(second.shape) == (3, 4)
        assert torch.equal(first[:3], second)  # the same memory
    for ours, theirs in zip(*seen, strict=True):
        torch.testing.assert_close(ours, theirs)


def test_method_meta_names_non_tensor_values_as_executorch() -> None:
    """ExecuTorch names a value by its tag: Double and String, not Float and Str (its own
    repr of this method raises at the first non-tensor input, so the names are checked
    here)."""
    path = str(FIXTURES_DIR / "scalar_io.pte")
    ours = str(pl._load_for_executorch(path).method_meta("forward"))
    assert "'Double', 'Int', 'Bool']" in ours
    assert "'Int', 'Int', 'None', 'Double', 'Bool', 'Int']" in ours


def test_modules_read_their_program_on_first_use_programs_at_once() -> None:
    """As ExecuTorch's: a module of junk fails when used, a program of junk when loaded."""
    module = pl._load_for_executorch_from_buffer(b"junk" * 16)
    with pytest.raises(PteFormatError) as e:
        module.forward([])
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(RuntimeError):
        pl._load_program_from_buffer(b"junk" * 16)
    with pytest.raises(FileNotFoundError) as missing:
        pl._load_program("no_such_file.pte")
    assert isinstance(missing.value, RuntimeError)


def test_program_and_method_by_parts() -> None:
    name = "two_method_state"
    program = pl._load_program(str(fixture_paths(name)[0]))
    names = [program.get_method_name(i) for i in range(program.num_methods())]
    assert names == list(program.program.method_names)
    with pytest.raises(MethodNotFoundError) as e:
        program.get_method_name(program.num_methods())
    assert isinstance(e.value, RuntimeError)
    method = program.load_method("step")
    assert program.load_method("step") is not method  # a new method every time
    with pytest.raises(StateError):
        method.get_outputs()
    call = fixture_calls("mlp")[0]
    mlp = pl._load_program(str(fixture_paths("mlp")[0])).load_method("forward")
    mlp.set_inputs(call["inputs"])
    mlp.execute()
    assert compare_outputs(mlp.get_outputs(), call["outputs"], *tolerance("mlp")) is None
    assert str(mlp.method_meta()).startswith("MethodMeta(name='forward', num_inputs=1")


def test_get_attribute_matches_executorch() -> None:
    pte, ptd = (str(p) for p in fixture_paths("external"))
    ours = pl._load_program(pte, data_path=ptd).load_method("forward")
    theirs = _et()._load_program(pte, data_path=ptd).load_method("forward")
    for fqn in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
        assert torch.equal(ours.get_attribute(fqn), theirs.get_attribute(fqn))
    with pytest.raises(NotFoundError, match="no attribute 'nope'") as e:
        ours.get_attribute("nope")
    assert isinstance(e.value, RuntimeError)


def test_a_constant_attribute_written_changes_no_program() -> None:
    """External constants are shared by the programs loaded from one data file: a write
    into one program's attribute reached every other (ExecuTorch's are read-only memory).
    They are copies now; every program still gives the fixture's eager outputs."""
    pte, ptd = (str(p) for p in fixture_paths("external"))
    call = fixture_calls("external")[0]
    a, b = (pl._load_program(pte, data_path=ptd).load_method("forward") for _ in range(2))
    a.get_attribute("fc1.weight").zero_()
    for m in (a, b, pl._load_program(pte, data_path=ptd).load_method("forward")):
        m.set_inputs(call["inputs"])
        m.execute()
        assert compare_outputs(m.get_outputs(), call["outputs"], *tolerance("external")) is None


def test_an_input_on_another_device_is_refused_in_executorchs_words() -> None:
    method = pl._load_program(str(fixture_paths("mlp")[0])).load_method("forward")
    with pytest.raises(UnsupportedDeviceError, match="is on device meta") as e:
        method.set_inputs([torch.empty(2, 8, device="meta")])
    assert "only CPU and CUDA tensors" in str(e.value) and isinstance(e.value, RuntimeError)
    method.set_inputs([torch.empty(0, 8, device="meta")[:0]])  # an empty tensor is exempt here


def test_devices_follow_ptexecs_rules() -> None:
    """An unplanned input is the caller's memory, shared; a CUDA program needs CUDA."""
    name = "mlp_unplanned"
    module = pl._load_for_executorch(str(fixture_paths(name)[0]))
    call = fixture_calls(name)[0]
    assert (
        compare_outputs(module.forward(call["inputs"]), call["outputs"], *tolerance(name)) is None
    )
    assert module.program.method_names == ("forward",)
    gpu = pl._load_for_executorch(str(fixture_paths("gpu_mlp")[0]))
    if torch.cuda.is_available():
        x = [t.cuda() for t in fixture_calls("gpu_mlp")[0]["inputs"]]
        assert gpu.forward(x)[0].is_cuda
    else:
        with pytest.raises(DeviceUnavailableError, match="on device cuda:0") as e:
            gpu.forward(fixture_calls("gpu_mlp")[0]["inputs"])
        assert isinstance(e.value, RuntimeError)


def test_threadpool_is_executorchs() -> None:
    # resetting it replaces ExecuTorch's pool too: tests/test_threads.py, in a subprocess
    assert pl._threadpool_get_thread_count() == _et()._threadpool_get_thread_count()
    assert pl._dump_profile_results() == _et()._dump_profile_results() == b""
    assert set(_et()._get_operator_names()) <= set(pl._get_operator_names())
    assert "XnnpackBackend" in pl._get_registered_backend_names()
    assert pl._is_available("XnnpackBackend") and not pl._is_available("NoSuchBackend")


def test_etdump_through_a_module(tmp_path: Any) -> None:
    from ptexec.format.etdump import ProfileEvent, decode_etdump

    module = pl._load_for_executorch(
        str(fixture_paths("mlp")[0]), enable_etdump=True, debug_buffer_size=1 << 16
    )
    assert module.has_etdump()
    module.forward(fixture_calls("mlp")[0]["inputs"])
    module.write_etdump_result_to_file(str(tmp_path / "m.etdp"), str(tmp_path / "m.bin"))
    dump = decode_etdump((tmp_path / "m.etdp").read_bytes())
    names = [e.name for e in dump.run_data[-1].events if isinstance(e, ProfileEvent)]
    assert names[-1] == "Method::execute" and "native_call_addmm.out" in names
    assert (tmp_path / "m.bin").stat().st_size > 0


# ---- bundled programs ------------------------------------------------------------------


def test_bundled_format_holds_the_cases_and_the_program() -> None:
    data = (COMPAT / "bundled.bpte").read_bytes()
    bundle = read_bundled(data)
    assert bytes(bundle.program_bytes()) == (COMPAT / "bundled.pte").read_bytes()
    io = _bundled_io()
    assert [s.method_name for s in bundle.suites] == ["forward", "forward2"]
    for suite in bundle.suites:
        assert len(suite.test_cases) == len(io[suite.method_name])
        for case, (inputs, expected) in zip(suite.test_cases, io[suite.method_name], strict=True):
            for got, want in zip(
                (*case.inputs, *case.expected_outputs), (*inputs, *expected), strict=True
            ):
                assert isinstance(got, BundledTensor) and got.sizes == tuple(want.shape)
                raw = bytes(bundle.tensor_bytes(got))
                assert raw == want.contiguous().numpy().tobytes()


def test_bundled_format_refuses_malformed_bytes() -> None:
    data = bytearray((COMPAT / "bundled.bpte").read_bytes())
    with pytest.raises(PteFormatError, match="file identifier"):
        read_bundled(bytes(data[:4]) + b"ET12" + bytes(data[8:]))
    with pytest.raises(PteFormatError):
        read_bundled(bytes(data[: len(data) // 3]))
    for pos in range(8, len(data), 37):  # a byte changed anywhere: parsed, or the format error
        bad = bytearray(data)
        bad[pos] ^= 0xFF
        with contextlib.suppress(PteFormatError):
            read_bundled(bytes(bad))


def test_bundled_verification_as_executorch() -> None:
    data = (COMPAT / "bundled.bpte").read_bytes()
    ours = pl._load_bundled_program_from_buffer(data)
    theirs = _et()._load_bundled_program_from_buffer(data)
    for method, cases in _bundled_io().items():
        for k, (inputs, expected) in enumerate(cases):
            bad = method == "forward" and k == 1  # deliberately wrong expected output
            if bad:
                with pytest.raises(RuntimeError):
                    theirs.verify_result_with_bundled_expected_output(method, k)
                with pytest.raises(OutputMismatchError, match="output 0 differs"):
                    ours.verify_result_with_bundled_expected_output(method, k)
                continue
            got = ours.verify_result_with_bundled_expected_output(method, k)
            ref = theirs.verify_result_with_bundled_expected_output(method, k)
            assert torch.allclose(got[0], ref[0]) and torch.allclose(got[0], expected[0])
            assert torch.allclose(got[0], inputs[0] + inputs[1] + (method == "forward2"))
    with pytest.raises(NotFoundError, match="out of range") as e:
        ours.verify_result_with_bundled_expected_output("forward", 5)
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(MethodNotFoundError):
        ours.verify_result_with_bundled_expected_output("nope", 0)
    # looser tolerances accept the off-by-0.5 case
    ours.verify_result_with_bundled_expected_output("forward", 1, rtol=0, atol=0.6)


def test_bundled_tensor_of_a_quantized_type_is_a_format_error() -> None:
    """A test case's float32 input retyped qint32 (the same bytes). torch holds no
    quantized tensor without its scale and zero point: ptexec's verification raised torch's
    untyped 'empty_strided not supported on quantized tensors'; ExecuTorch's fails the
    case with an error too."""
    data = bytearray((COMPAT / "bundled.bpte").read_bytes())
    root = Buffer(memoryview(data)).root("bundled_program")
    suites = root.tables(1, "method_test_suites", lambda t: t) or ()
    (suite,) = [s for s in suites if s.string(0, "method_name") == "forward2"]
    case = (suite.tables(1, "test_cases", lambda t: t) or ())[2]
    _, tensor = (case.tables(0, "inputs", lambda t: t) or ())[0].union(0, "val")
    assert tensor is not None
    at = tensor.pos + tensor.offsets[0]  # the input's scalar type
    assert data[at] == 6  # float32
    data[at] = 14  # qint32
    bad = bytes(data)
    theirs = _et()._load_bundled_program_from_buffer(bad)
    with pytest.raises(RuntimeError):
        theirs.verify_result_with_bundled_expected_output("forward2", 2)
    ours = pl._load_bundled_program_from_buffer(bad)
    with pytest.raises(PteFormatError, match=r"'forward2' test case 2 input 0.*quantized"):
        ours.verify_result_with_bundled_expected_output("forward2", 2)
    module = pl._load_for_executorch_from_bundled_program(ours)
    with pytest.raises(PteFormatError, match="QInt32 is a quantized type"):
        module.load_bundled_input(ours, "forward2", 2)
    # the bundle's other cases still verify, as ExecuTorch's
    got = ours.verify_result_with_bundled_expected_output("forward2", 0)
    ref = theirs.verify_result_with_bundled_expected_output("forward2", 0)
    assert torch.equal(got[0], ref[0])


def test_module_from_a_bundle_and_bundled_inputs(tmp_path: Any) -> None:
    from ptexec.format.etdump import decode_etdump

    bundle = pl._load_bundled_program_from_buffer((COMPAT / "bundled.bpte").read_bytes())
    module = pl._load_for_executorch_from_bundled_program(
        bundle, enable_etdump=True, debug_buffer_size=1 << 12
    )
    (inputs, expected), _ = _bundled_io()["forward"]
    assert torch.allclose(module.forward(inputs)[0], expected[0])
    module.load_bundled_input(bundle, "forward2", 2)
    module.plan_execute("forward2")
    out = module.verify_result_with_bundled_expected_output(bundle, "forward2", 2)
    assert torch.allclose(out[0], _bundled_io()["forward2"][2][1][0])
    module.write_etdump_result_to_file(str(tmp_path / "b.etdp"), str(tmp_path / "b.bin"))
    runs = decode_etdump((tmp_path / "b.etdp").read_bytes()).run_data
    assert [r.bundled_input_index for r in runs if r.name == "Execute"] == [-1, 2]


# ---- what the loaders take from the caller ---------------------------------------------


def _writable_buffers(data: bytes) -> list[Any]:
    return [bytearray(data), memoryview(bytearray(data))]


def test_a_callers_writable_buffer_is_copied_by_every_loader() -> None:
    """Zeroing the bytearray or memoryview a program was loaded from changes nothing, for
    programs (read now), modules (read on first use) and their ``.ptd`` bytes; ExecuTorch's
    own ``Runtime.load_program`` copies a bytearray too."""
    from ptexec.runtime import Runtime

    name = "external"
    pte, ptd = (p.read_bytes() for p in fixture_paths(name)[:2])
    call = fixture_calls(name)[0]
    for buffer, data_map in zip(_writable_buffers(pte), _writable_buffers(ptd), strict=True):
        module = pl._load_for_executorch_from_buffer(buffer, data_map)
        for b in (buffer, data_map):
            b[:] = bytes(len(b))  # before the module's first use
        assert (
            compare_outputs(module.forward(call["inputs"]), call["outputs"], *tolerance(name))
            is None
        )
    mlp = fixture_paths("mlp")[0].read_bytes()
    mcall = fixture_calls("mlp")[0]
    for buffer in _writable_buffers(mlp):
        programs = [pl._load_program_from_buffer(buffer)]
        if isinstance(buffer, bytearray):
            programs.append(Runtime.get().load_program(buffer))  # type: ignore[arg-type]
        buffer[:] = bytes(len(buffer))
        for program in programs:
            method = program.load_method("forward")
            run = method.call if isinstance(method, pl.ExecuTorchMethod) else method.execute
            assert (
                compare_outputs(run(mcall["inputs"]), mcall["outputs"], *tolerance("mlp")) is None
            )


def test_a_list_of_data_files_is_taken_when_the_module_is_made() -> None:
    """``.ptd`` bytes given as a list are taken when the loader is called, as one
    ``.ptd`` is: a caller rewriting its bytearray before the module's first use does not
    change the weights the module runs on."""
    name = "external"
    pte, ptd = (p.read_bytes() for p in fixture_paths(name)[:2])
    call = fixture_calls(name)[0]
    for data_map in _writable_buffers(ptd):
        module = pl._load_for_executorch_from_buffer(pte, [data_map])  # type: ignore[arg-type]
        data_map[512:] = bytes(len(data_map) - 512)  # the tensors' bytes, not the header
        assert (
            compare_outputs(module.forward(call["inputs"]), call["outputs"], *tolerance(name))
            is None
        )


def _loaders(ext: Any) -> dict[str, Any]:
    import ptexec
    from ptexec.runtime import Runtime

    ext_bytes = ext.read_bytes()
    return {
        "ptexec.load": lambda p: ptexec.load(p),
        "ptexec.load mmap": lambda p: ptexec.load(p, mmap=True),
        "ptexec.load data_path": lambda p: ptexec.load(ext, data_path=p),
        "Runtime.load_program": lambda p: Runtime.get().load_program(p),
        "Runtime.load_program data_path": lambda p: Runtime.get().load_program(ext, data_path=p),
        "_load_program": lambda p: pl._load_program(p),
        "_load_program data_path": lambda p: pl._load_program(ext, data_path=p),
        "_load_program_from_buffer data_path": lambda p: pl._load_program_from_buffer(
            ext_bytes, data_path=p
        ),
        "_load_for_executorch": lambda p: pl._load_for_executorch(p).method_names(),
        "_load_for_executorch data_path": lambda p: pl._load_for_executorch(ext, p).method_names(),
    }


@pytest.mark.parametrize("case", ["directory", "missing", "unreadable"])
def test_every_loader_says_why_a_file_cannot_be_read(
    case: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory, a missing path or a file without read permission: one typed ptexec
    error from every loading entry point, a ``RuntimeError`` as ExecuTorch raises, and
    still the ``OSError`` it was (errno, filename)."""
    import errno

    import ptexec.program
    from ptexec.errors import FileMissingError, FileUnreadableError, PtexecError

    path = tmp_path / "model.pte"
    if case == "directory":
        path.mkdir()
        kind, code, words = FileUnreadableError, errno.EISDIR, "is a directory"
        with pytest.raises(RuntimeError):  # ExecuTorch's runtime refuses it too
            _et()._load_program(str(path))
    elif case == "missing":
        kind, code, words = FileMissingError, errno.ENOENT, "no such"
    else:
        path.write_bytes(fixture_paths("mlp")[0].read_bytes())
        real_open = open

        def no_permission(file: Any, *args: Any, **kwargs: Any) -> Any:
            if str(file) == str(path):  # as chmod 000 does, which root would not feel
                raise PermissionError(errno.EACCES, "Permission denied", str(file))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(ptexec.program, "open", no_permission, raising=False)
        kind, code, words = FileUnreadableError, errno.EACCES, "Permission denied"
    for name, load in _loaders(fixture_paths("external")[0]).items():
        with pytest.raises(kind) as e:
            load(path)
        err = e.value
        assert isinstance(err, PtexecError) and isinstance(err, RuntimeError), name
        assert isinstance(err, OSError) and err.errno == code, name
        assert err.filename == str(path) and words in str(err), name


class _AddsOneToItsInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2


def test_a_rerun_reads_the_planned_input_as_the_program_left_it(tmp_path: Any) -> None:
    """``plan_execute`` and ``execute()`` again run on the plan's copy of a memory-planned
    input, which the program writes in place: each run sees the last one's write, as on
    ExecuTorch (the copy kept at ``set_inputs`` was given again: the same answer every
    time). The caller's tensor is never written."""
    from export_util import export_program

    path = tmp_path / "inplace.pte"
    path.write_bytes(export_program(_AddsOneToItsInput(), (torch.zeros(3),)))
    # (the mutated input comes first among the outputs, then the sum)
    want = [[[k] * 3, [2 * k] * 3] for k in (1.0, 2.0, 3.0)]
    x = torch.zeros(3)
    for lib in (pl, _et()):
        module = lib._load_for_executorch(str(path))
        got = [[y.tolist() for y in module.forward([x])]]
        got += [[y.tolist() for y in module.plan_execute("forward")] for _ in range(2)]
        assert got == want, lib.__name__
        method = lib._load_program(str(path)).load_method("forward")
        method.set_inputs([torch.zeros(3)])
        runs = []
        for _ in range(3):
            method.execute()
            runs.append([y.tolist() for y in method.get_outputs()])
        assert runs == want, lib.__name__
    assert x.tolist() == [0.0] * 3


class _Scaled(torch.nn.Module):
    def __init__(self, by: float | int) -> None:
        super().__init__()
        self.by = by

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x * self.by,)


class _Positive(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x > 0,)


def test_a_number_expected_where_a_tensor_came_is_a_verdict_not_a_crash() -> None:
    """A bundle (made by hand: ExecuTorch's bundler writes none) expecting a number where
    the method returns a tensor fails verification with a message; comparing the two
    with ``==`` would give a tensor, whose truth torch refuses to tell."""
    from ptexec.portable_lib import _mismatch

    for want in (2, 2.0, True):
        found = _mismatch(torch.full((3,), 2.0), want, 1e-5, 1e-8)
        assert found is not None and "expected" in found
    assert _mismatch(3, 3, 0.0, 0.0) is None and _mismatch(3, 4, 0.0, 0.0) is not None


def test_bundled_verdicts_follow_executorchs_rule() -> None:
    """Bundled outputs are compared as ExecuTorch compares them: float, double and half
    within ``atol + rtol * |output|`` (the output's magnitude, not the expected one's);
    integers, bools and bfloat16 byte for byte whatever the tolerances; an infinite value
    matches only the same infinity (its error is no number, whatever the tolerances). Each
    case's verdict is ExecuTorch's on the same bundle (several used to pass here and fail
    there)."""
    pytest.importorskip("executorch.devtools.bundled_program.core")
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import (
        serialize_from_bundled_program_to_flatbuffer,
    )
    from executorch.exir import to_edge

    ints = torch.tensor([1, 2, 3])
    halves = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    floats = torch.tensor([1.0])
    inf = torch.tensor([math.inf, 1.0])
    infs = [torch.tensor([v, 2.0]) for v in (2.0, -math.inf, math.inf)]
    cases = [  # module, input, expected outputs (each a test case), rtol, atol
        (_Scaled(3), ints, [ints * 3, ints * 3 + 1], 0.0, 10.0),
        (_Scaled(3), ints, [ints * 3 + 1], 1.0, 0.0),
        (_Positive(), floats, [floats < 0], 0.0, 10.0),
        (_Scaled(1.5), halves, [halves * 1.5 + 0.01], 0.1, 2.0),
        (_Scaled(2.0), floats, [floats * 4, floats * 1], 0.6, 0.0),  # output 2.0
        (_Scaled(2.0), floats.half(), [floats.half() * 2.001], 1e-3, 0.0),
        # output [inf, 2]: not a finite value, nor the other infinity, at the default tolerances
        (_Scaled(2.0), inf, infs, 1e-5, 1e-8),
    ]
    verdicts = []
    for module, x, expected, rtol, atol in cases:
        program = to_edge(torch.export.export(module, (x,))).to_executorch()
        suite = MethodTestSuite(
            "forward", [MethodTestCase(inputs=(x,), expected_outputs=(e,)) for e in expected]
        )
        data = serialize_from_bundled_program_to_flatbuffer(BundledProgram(program, [suite]))
        for k in range(len(expected)):
            got = []
            for lib in (pl, _et()):
                bundle = lib._load_bundled_program_from_buffer(data)
                try:
                    bundle.verify_result_with_bundled_expected_output("forward", k, rtol, atol)
                    got.append(True)
                except RuntimeError:
                    got.append(False)
            assert got[0] == got[1], (module, k, got)
            verdicts.append(got[0])
    assert verdicts == [True, False, False, False, False, False, True, True, False, False, True]


def test_a_float_difference_is_taken_in_float_as_executorch_takes_it() -> None:
    """ExecuTorch subtracts float32 values in float32 before it compares the difference
    with the tolerance: 4 - (1 + 2**-23) rounds to 3, above an atol of 3 - 2**-23, and
    3e38 - (-3e38) overflows to infinity, which no atol covers. Both cases used to pass
    here, computed in float64, and fail there."""
    pytest.importorskip("executorch.devtools.bundled_program.core")
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import (
        serialize_from_bundled_program_to_flatbuffer,
    )
    from executorch.exir import to_edge

    x = torch.tensor([4.0, 3e38])
    cases = [  # expected output, rtol, atol
        ([1 + 2**-23, 3e38], 0.0, 3 - 2**-23),
        ([1 + 2**-22, 3e38], 0.0, 3 - 2**-23),  # 3 - 2**-22 exactly, within
        ([4.0, -3e38], 0.0, 1e39),
        ([4.0, 3e38 * (1 + 1e-6)], 1e-5, 0.0),
    ]
    program = to_edge(torch.export.export(_Scaled(1.0), (x,))).to_executorch()
    suite = MethodTestSuite(
        "forward",
        [MethodTestCase(inputs=(x,), expected_outputs=(torch.tensor(e),)) for e, _, _ in cases],
    )
    data = serialize_from_bundled_program_to_flatbuffer(BundledProgram(program, [suite]))
    verdicts = {}
    for lib in (pl, _et()):
        bundle = lib._load_bundled_program_from_buffer(data)
        verdicts[lib] = []
        for k, (_, rtol, atol) in enumerate(cases):
            try:
                bundle.verify_result_with_bundled_expected_output("forward", k, rtol, atol)
                verdicts[lib].append(True)
            except RuntimeError:
                verdicts[lib].append(False)
    assert verdicts[pl] == verdicts[_et()] == [False, True, False, True]


def test_method_meta_describes_the_devices_the_methods_run_on() -> None:
    """A module moved to the CPU (``.to("cpu")``, or the default device) describes its
    methods' tensors on the CPU, as the methods it loads run there (it said cuda:0, the
    file's device, while the loaded method said cpu)."""
    path = str(fixture_paths("gpu_mlp")[0])
    on_file = pl._load_for_executorch(path).method_meta("forward")
    assert "cuda:0" in repr(on_file)
    moved = pl._load_for_executorch(path).to("cpu")
    meta = moved.method_meta("forward")
    (y,) = moved.forward(fixture_calls("gpu_mlp")[0]["inputs"])
    assert y.device.type == "cpu" and "cuda" not in repr(meta)
    assert repr(meta) == repr(moved._get("forward").method_meta())
    pl.set_default_device("cpu")
    try:
        assert "cuda" not in repr(pl._load_program(path).method_meta("forward"))
    finally:
        pl.set_default_device(None)


def test_a_missing_file_fails_at_load_and_an_empty_etdump_writes_nothing(tmp_path: Path) -> None:
    """As ExecuTorch's bindings: ``_load_for_executorch`` of a path that does not exist
    fails there (it failed at the first call), and an ETDump with nothing recorded yet
    writes no file (an empty one was written)."""
    missing = tmp_path / "nothing.pte"
    for lib in (_et(), pl):
        with pytest.raises(RuntimeError):
            lib._load_for_executorch(str(missing))
    data = fixture_paths("mlp")[0].read_bytes()
    for k, lib in enumerate((_et(), pl)):
        module = lib._load_for_executorch_from_buffer(data, enable_etdump=True)
        module.write_etdump_result_to_file(str(tmp_path / f"{k}.etdp"))
        assert not (tmp_path / f"{k}.etdp").exists(), lib
        module.forward(fixture_calls("mlp")[0]["inputs"])
        module.write_etdump_result_to_file(str(tmp_path / f"{k}.etdp"))
        assert (tmp_path / f"{k}.etdp").stat().st_size > 0, lib
