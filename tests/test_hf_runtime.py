"""What Hugging Face's generation loops need from the runtime: ``set_output`` on
``ptexec.runtime`` and ``ptexec.portable_lib`` methods, several ``.ptd`` files for one
program, and ``.ptd`` files found beside the ``.pte``.

References: the fixtures' eager outputs, ExecuTorch's own runtime on the same program
(its ``execute`` for the values ``set_output`` must write; one ``.ptd`` per program, which
is all its Python runtime takes), and eager PyTorch for the programs exported here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import ptexec
import ptexec.portable_lib as pl
from fixture_data import FIXTURES_DIR, fixture_calls, fixture_paths
from ptexec.errors import InputError, PteFormatError
from ptexec.runtime import Runtime

# ---- set_output -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "mlp_unplanned"])
def test_runtime_set_output_writes_into_the_callers_tensor(name: str) -> None:
    pte, _ = fixture_paths(name)
    method = Runtime.get().load_program(pte).load_method("forward")
    calls = fixture_calls(name)
    out = torch.full_like(calls[0]["outputs"][0], float("nan"))
    method.set_output(out, 0)
    for call in calls:
        (got,) = method.execute(call["inputs"])
        assert got is out  # the caller's tensor, filled
        torch.testing.assert_close(out, call["outputs"][0], rtol=1e-5, atol=1e-6)
    if name == "mlp_unplanned":  # unplanned: computed in the caller's memory, not copied
        assert method.method.last_call.outputs[0] == "direct"
    method.set_output(None, 0)
    (fresh,) = method.execute(calls[0]["inputs"])
    assert fresh is not out


def test_one_tensor_set_for_two_outputs_is_refused_when_set() -> None:
    """A tensor given for output 6 that output 5 already writes is refused by that
    set_output (every later execute would refuse the pair); the earlier one stays set and
    the next call writes it with the fixture's eager values."""
    pte, _ = fixture_paths("int_ops")
    method = Runtime.get().load_program(pte).load_method("forward")
    call = fixture_calls("int_ops")[0]
    base = torch.empty(3, 5, dtype=call["outputs"][5].dtype)
    out = base[:2]
    method.set_output(out, 5)
    with pytest.raises(InputError):
        method.set_output(out, 6)
    with pytest.raises(InputError):
        method.set_output(base[1:], 6)  # (a row of the same memory)
    got = method.execute(call["inputs"])
    assert got[5] is out
    for g, want in zip(got, call["outputs"], strict=True):
        torch.testing.assert_close(g, want)


def test_set_output_matches_executorchs_execute() -> None:
    et_runtime = pytest.importorskip("executorch.runtime")
    pte, _ = fixture_paths("mlp_unplanned")
    x = fixture_calls("mlp_unplanned")[0]["inputs"]
    (want,) = et_runtime.Runtime.get().load_program(pte).load_method("forward").execute(x)
    module = pl._load_for_executorch(str(pte))
    out = torch.empty_like(want)
    module.set_output("forward", out, 0)
    (got,) = module.forward(x)
    assert got is out
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    # and with clone_outputs=False, set_inputs/execute/get_outputs
    method = pl._load_program(str(pte)).load_method("forward")
    out2 = torch.empty_like(want)
    method.set_output(out2, 0)
    method.set_inputs(x)
    method.execute()
    assert method.get_outputs()[0] is out2
    torch.testing.assert_close(out2, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dynamic_mlp", "dynamic_mlp_unplanned"])
def test_set_output_returns_the_callers_tensor_without_clones_too(name: str) -> None:
    """``clone_outputs=False`` returns the tensor given to ``set_output`` itself, filled
    and at the sizes of the call, as ``Module::set_output`` promises; the other outputs
    are the method's views, as ever."""
    et = pytest.importorskip("executorch.runtime").Runtime.get()
    pte, _ = fixture_paths(name)
    reference = et.load_program(pte).load_method("forward")
    module = pl._load_for_executorch(str(pte))
    out = torch.empty(16, 4)
    module.set_output("forward", out, 0)
    for rows in (5, 3):
        x = torch.randn(rows, 8)
        (want,) = reference.execute([x])
        (got,) = module.forward([x], clone_outputs=False)
        assert got is out and out.shape == want.shape
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
        (got,) = module.plan_execute("forward", clone_outputs=False)
        assert got is out


def test_set_output_is_checked_when_set_and_the_method_keeps_working() -> None:
    pte, _ = fixture_paths("mlp")
    method = Runtime.get().load_program(pte).load_method("forward")
    call = fixture_calls("mlp")[0]
    want = call["outputs"][0]
    with pytest.raises(InputError, match="out of range"):
        method.set_output(torch.empty_like(want), 1)
    with pytest.raises(InputError, match="dtype"):
        method.set_output(torch.empty_like(want, dtype=torch.float64), 0)
    with pytest.raises(InputError, match="shape"):
        method.set_output(torch.empty(want.shape[0] + 1, *want.shape[1:]), 0)
    (got,) = method.execute(call["inputs"])  # nothing was set by the bad calls
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_set_output_refused_while_recording_an_etdump() -> None:
    pte, _ = fixture_paths("mlp")
    method = Runtime.get().load_program(pte, enable_etdump=True).load_method("forward")
    with pytest.raises(ptexec.errors.StateError, match="ETDump"):
        method.set_output(torch.empty(2, 4), 0)


# ---- several .ptd files -----------------------------------------------------------------


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _export(model: torch.nn.Module, tag, folder: Path) -> Path:
    from executorch.exir import ExecutorchBackendConfig, to_edge

    folder.mkdir(parents=True, exist_ok=True)
    x = (torch.randn(2, 8),)
    et = to_edge(torch.export.export(model, x)).to_executorch(
        ExecutorchBackendConfig(external_constants=tag)
    )
    (folder / "model.pte").write_bytes(et.buffer)
    et.write_tensor_data_to_file(str(folder))
    return folder / "model.pte"


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One MLP with its weights in weights.ptd and its biases in biases.ptd, and a second
    MLP (other values) with everything in weights.ptd."""
    pytest.importorskip("executorch.exir")
    root = tmp_path_factory.mktemp("ptd")
    torch.manual_seed(1)
    model = _MLP().eval()
    pte = _export(model, lambda node: "biases" if "bias" in node.name else "weights", root / "a")
    torch.manual_seed(2)
    other = _MLP().eval()
    _export(other, lambda node: "weights", root / "b")
    return {"model": model, "other": other, "pte": pte, "a": root / "a", "b": root / "b"}


def test_two_ptd_files_merge(split: dict[str, object]) -> None:
    a = split["a"]
    assert isinstance(a, Path)
    x = torch.randn(2, 8)
    program = ptexec.load(split["pte"], data_path=[a / "weights.ptd", a / "biases.ptd"])
    (got,) = program.load_method("forward")(x)
    with torch.no_grad():
        torch.testing.assert_close(got, split["model"](x))  # type: ignore[operator]
    assert len(program.ptd.files) == 2
    # the same through ExecuTorch's names, in either order
    prog = Runtime.get().load_program(split["pte"], data_path=[a / "biases.ptd", a / "weights.ptd"])
    torch.testing.assert_close(prog.load_method("forward").execute([x])[0], got)


def test_one_file_is_not_enough_and_says_where(split: dict[str, object]) -> None:
    a = split["a"]
    assert isinstance(a, Path)
    program = ptexec.load(split["pte"], data_path=a / "weights.ptd")
    with pytest.raises(PteFormatError, match="bias"):
        program.load_method("forward")


def test_a_key_in_two_files_must_agree(split: dict[str, object], tmp_path: Path) -> None:
    a, b = split["a"], split["b"]
    assert isinstance(a, Path) and isinstance(b, Path)
    copy = tmp_path / "weights-copy.ptd"
    shutil.copyfile(a / "weights.ptd", copy)
    x = torch.randn(2, 8)
    same = ptexec.load(split["pte"], data_path=[a / "weights.ptd", copy, a / "biases.ptd"])
    with torch.no_grad():
        torch.testing.assert_close(same.load_method("forward")(x)[0], split["model"](x))  # type: ignore[operator]
    with pytest.raises(PteFormatError, match="different bytes"):
        ptexec.load(split["pte"], data_path=[a / "weights.ptd", b / "weights.ptd"])


def test_a_data_file_is_read_once_for_all_live_programs(split: dict[str, object]) -> None:
    a = split["a"]
    assert isinstance(a, Path)
    files = [a / "weights.ptd", a / "biases.ptd"]
    p1 = ptexec.load(split["pte"], data_path=files)
    p2 = ptexec.load(split["pte"], data_path=files)
    for f1, f2 in zip(p1.ptd.files, p2.ptd.files, strict=True):
        assert f1 is f2
    x = torch.randn(2, 8)
    torch.testing.assert_close(
        p1.load_method("forward")(x)[0], p2.load_method("forward")(x)[0], rtol=0, atol=0
    )


def test_ptd_files_beside_the_pte_are_found(split: dict[str, object], tmp_path: Path) -> None:
    a = split["a"]
    assert isinstance(a, Path)
    folder = tmp_path / "saved"
    shutil.copytree(a, folder)
    x = torch.randn(2, 8)
    with torch.no_grad():
        want = split["model"](x)  # type: ignore[operator]
    torch.testing.assert_close(ptexec.load(folder / "model.pte").load_method("forward")(x)[0], want)
    module = pl._load_for_executorch(str(folder / "model.pte"))  # as optimum-executorch calls it
    torch.testing.assert_close(module.forward([x])[0], want)
    (folder / "biases.ptd").unlink()
    with pytest.raises(PteFormatError, match="bias"):
        ptexec.load(folder / "model.pte").load_method("forward")


def test_a_single_ptd_as_executorch_takes_it(split: dict[str, object]) -> None:
    et_runtime = pytest.importorskip("executorch.runtime")
    pte, ptd = fixture_paths("external")
    assert ptd is not None
    x = torch.randn(2, 8)
    want = et_runtime.Runtime.get().load_program(pte, data_path=ptd).load_method("forward")
    got = Runtime.get().load_program(pte, data_path=ptd).load_method("forward")
    torch.testing.assert_close(got.execute([x])[0], want.execute([x])[0], rtol=1e-5, atol=1e-6)


def test_data_files_beside_that_disagree_on_a_key_are_not_guessed(
    split: dict[str, object], tmp_path: Path
) -> None:
    """Two data files beside a program that both hold a tensor it needs (two checkpoints,
    LoRA adapters side by side) are refused, naming them: taking the first by name ran
    the program on the other model's weights. ``<stem>.ptd`` is the program's own, and
    ``data_path`` chooses."""
    a, b = split["a"], split["b"]
    assert isinstance(a, Path) and isinstance(b, Path)
    folder = tmp_path / "two"
    folder.mkdir()
    shutil.copyfile(a / "model.pte", folder / "model.pte")
    shutil.copyfile(a / "biases.ptd", folder / "biases.ptd")
    shutil.copyfile(a / "weights.ptd", folder / "x_weights.ptd")
    # the other model's, first by name: every key the program needs (taken, before)
    shutil.copyfile(b / "weights.ptd", folder / "a_other.ptd")
    with pytest.raises(
        PteFormatError, match=r"several data files beside it hold it \(a_other\.ptd, .*data_path"
    ):
        ptexec.load(folder / "model.pte")
    x = torch.randn(2, 8)
    with pytest.raises(PteFormatError, match="data_path"):  # (read on first use)
        pl._load_for_executorch(str(folder / "model.pte")).forward([x])
    with torch.no_grad():
        want = split["model"](x)  # type: ignore[operator]
    chosen = ptexec.load(
        folder / "model.pte", data_path=[folder / "x_weights.ptd", folder / "biases.ptd"]
    )
    torch.testing.assert_close(chosen.load_method("forward")(x)[0], want)
    (folder / "a_other.ptd").rename(folder / "model.ptd")  # the program's own, by name
    got = ptexec.load(folder / "model.pte").load_method("forward")(x)[0]
    with torch.no_grad():
        other = split["other"](x)  # type: ignore[operator]
    torch.testing.assert_close(got, other)


def test_a_data_file_key_the_program_also_holds_is_read_from_the_data_file(
    tmp_path: Path,
) -> None:
    """A key in both the program's named data and a ``.ptd`` (a delegate's weights given
    anew) is read from the ``.ptd``, as ExecuTorch's runtime reads it: the data file's map
    comes first. The program's own bytes were taken, a delegate ran on other weights."""
    et_runtime = pytest.importorskip("executorch.runtime")
    from ptexec.format.ptd_write import ptd_bytes

    pte = FIXTURES_DIR / "xnnpack" / "channels_last.pte"
    x = torch.load(pte.with_suffix(".io.pt"), weights_only=True)["calls"][0]["inputs"]
    named = dict(ptexec.load(pte).pte.named_data())
    key = sorted(named)[0]
    ptd = tmp_path / "other.ptd"
    ptd.write_bytes(ptd_bytes([(key, None, bytes(len(named[key])))]))
    want = et_runtime.Runtime.get().load_program(pte, data_path=ptd).load_method("forward")
    (expected,) = want.execute(x)
    own = Runtime.get().load_program(pte).load_method("forward").execute(x)[0]
    assert not torch.allclose(own, expected)  # the two weights give other outputs
    for data_path in (ptd, [ptd]):
        got = Runtime.get().load_program(pte, data_path=data_path).load_method("forward")
        torch.testing.assert_close(got.execute(x)[0], expected, rtol=1e-5, atol=1e-5)
