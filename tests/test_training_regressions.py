"""Regressions of ptexec.training: values gathered over several training methods, failed
calls, and ExecuTorch's ``named_gradients`` copies.

References are eager PyTorch (same modules, same weights, same optimizer) and ExecuTorch's
own runtime and ``TrainingModule``. The two-method program is exported once per session by
ExecuTorch's exporter (with parameters in the ``.pte`` and in a ``.ptd``); the rest use
the committed MLP fixture.
"""

from __future__ import annotations

import copy
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import ptexec.training as T
from producers import CudaArray
from ptexec.errors import DeviceUnavailableError, ExecutionError, InputError, StateError
from ptexec.training.save import pte_with
from training_models import MLP, example_inputs, export_training

FIX = Path(__file__).resolve().parent / "fixtures" / "training"


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _mlp() -> MLP:
    module = MLP()
    module.load_state_dict(torch.load(FIX / "state.pt")["mlp"])
    return module


def _eager_grads(
    module: nn.Module, batches: list[tuple[torch.Tensor, ...]]
) -> dict[str, torch.Tensor]:
    """Eager gradients of ``module`` summed over ``batches`` (on a copy)."""
    ref = copy.deepcopy(module)
    for batch in batches:
        ref(*batch)[0].backward()
    return {n: p.grad.clone() for n, p in ref.named_parameters()}  # type: ignore[union-attr]


# -- two training methods sharing parameters -------------------------------------------------


class _Classify(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.extra = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.cross_entropy(self.fc(x), y),)


class _Regress(nn.Module):
    """The same layers (shared with a :class:`_Classify`), another loss that uses both."""

    def __init__(self, a: _Classify) -> None:
        super().__init__()
        self.fc = a.fc
        self.extra = a.extra

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.mse_loss(self.extra(self.fc(x)), t),)


_G = torch.Generator().manual_seed(3)
_X, _Y, _T = (
    torch.randn(5, 4, generator=_G),
    torch.randint(0, 3, (5,), generator=_G),
    torch.randn(5, 3, generator=_G),
)


def _two_losses() -> tuple[_Classify, _Regress]:
    torch.manual_seed(0)
    a = _Classify()
    return a, _Regress(a)


@pytest.fixture(scope="module", params=[False, True], ids=["pte", "ptd"])
def two_methods(request: pytest.FixtureRequest) -> tuple[bytes, bytes | None]:
    """``forward`` (cross-entropy through ``fc``) and ``second`` (MSE through ``fc`` and
    ``extra``) in one program; for ``ptd``, with the parameters in a ``.ptd``."""
    pytest.importorskip("executorch.exir")
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from torch.export.experimental import _export_forward_backward

    a, b = _two_losses()
    ea = _export_forward_backward(torch.export.export(a, (_X, _Y), strict=True))
    eb = _export_forward_backward(torch.export.export(b, (_X, _T), strict=True))
    config = ExecutorchBackendConfig(external_mutable_weights=request.param)
    prog = to_edge({"forward": ea, "second": eb}).to_executorch(config)
    ptd = None
    if request.param:
        (blob,) = prog._tensor_data.values()
        ptd = bytes(blob)
    return bytes(prog.buffer), ptd


def _train(
    tm: T.TrainingModule, method: str, inputs: tuple[torch.Tensor, ...], steps: int = 3
) -> None:
    opt = torch.optim.SGD(tm.parameters(method), lr=0.5)
    for _ in range(steps):
        opt.zero_grad()
        tm.forward_backward(method, inputs)
        opt.step()


def _eager_train(module: nn.Module, inputs: tuple[torch.Tensor, ...], steps: int = 3) -> None:
    opt = torch.optim.SGD([p for p in module.parameters()], lr=0.5)
    for _ in range(steps):
        opt.zero_grad()
        module(*inputs)[0].backward()
        opt.step()


def _saved(tm: T.TrainingModule, pte: bytes, ptd: bytes | None) -> tuple[bytes, bytes | None]:
    return (pte, tm.ptd_bytes()) if ptd is not None else (tm.pte_bytes(), None)


def test_the_trained_methods_copy_is_gathered(two_methods: tuple[bytes, bytes | None]) -> None:
    """Train ``forward`` only, then run ``second`` (its own, untrained copy of ``fc``):
    state_dict and the saved file hold the trained ``fc``, as eager training gives it,
    and ExecuTorch's runtime runs the saved file with it."""
    pte, ptd = two_methods
    tm = T.load(pte, ptd)
    _train(tm, "forward", (_X, _Y))
    a, b = _two_losses()
    initial = {k: v.clone() for k, v in a.state_dict().items()}
    _eager_train(a, (_X, _Y))
    tm.forward_backward("second", (_X, _T))  # loads "second"; its fc is the file's
    state = tm.state_dict()
    assert list(state) == ["fc.weight", "fc.bias", "extra.weight", "extra.bias"]
    for name, value in a.state_dict().items():
        torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(state["fc.weight"], initial["fc.weight"])
    # the same the other way round: 'second' trained, 'forward' only ran
    other = T.load(pte, ptd)
    other.forward_backward("forward", (_X, _Y))
    _train(other, "second", (_X, _T))
    a2, b2 = _two_losses()
    _eager_train(b2, (_X, _T))
    for name, value in a2.state_dict().items():
        torch.testing.assert_close(other.state_dict()[name], value, rtol=1e-5, atol=1e-6)

    # the saved program starts from the trained values, in ExecuTorch's runtime
    et = _in_executorch(tm, pte, ptd)
    for method, inputs, ref in (("forward", (_X, _Y), a), ("second", (_X, _T), b)):
        _starts_from(et, method, inputs, a, ref)


_KEPT: list[Any] = []  # ExecuTorch's module reads the bytes it was given, not a copy


def _in_executorch(tm: T.TrainingModule, pte: bytes, ptd: bytes | None) -> Any:
    """The program ``tm`` saves, loaded by ExecuTorch's runtime."""
    pl = pytest.importorskip("executorch.extension.pybindings.portable_lib")
    saved_pte, saved_ptd = _saved(tm, pte, ptd)
    _KEPT.append((saved_pte, saved_ptd))
    if saved_ptd is not None:
        return pl._load_for_executorch_from_buffer(saved_pte, saved_ptd)
    return pl._load_for_executorch_from_buffer(saved_pte)


def _starts_from(
    et: Any, method: str, inputs: tuple[torch.Tensor, ...], trained: nn.Module, ref: nn.Module
) -> None:
    """ExecuTorch's ``method`` of a saved program: its parameters are ``trained``'s, its
    loss ``ref``'s on ``inputs``."""
    outs = et.run_method(method, inputs)
    start = et.run_method("__et_training_parameters_index_" + method, ())[0]
    names = et.run_method("__et_training_fqn_" + method, ())
    for i, name in enumerate(names):
        torch.testing.assert_close(
            outs[start + i], trained.state_dict()[name], rtol=1e-5, atol=1e-6
        )
    torch.testing.assert_close(outs[0], ref(*inputs)[0].detach(), rtol=1e-5, atol=1e-6)


def test_a_method_never_loaded_is_saved_with_the_trained_copy(
    two_methods: tuple[bytes, bytes | None],
) -> None:
    """Train ``forward`` only and never load ``second``: the saved file's ``second``
    starts from the trained ``fc`` too (in ExecuTorch's runtime), not from the file's."""
    pte, ptd = two_methods
    tm = T.load(pte, ptd)
    _train(tm, "forward", (_X, _Y))
    a, b = _two_losses()
    _eager_train(a, (_X, _Y))
    _starts_from(_in_executorch(tm, pte, ptd), "second", (_X, _T), a, b)
    saved_pte, saved_ptd = _saved(tm, pte, ptd)
    assert set(T.load(saved_pte, saved_ptd).state_dict()) == set(a.state_dict())


def test_copies_trained_apart_are_refused(two_methods: tuple[bytes, bytes | None]) -> None:
    pte, ptd = two_methods
    tm = T.load(pte, ptd)
    _train(tm, "forward", (_X, _Y))
    _train(tm, "second", (_X, _T))
    for call in (tm.state_dict, tm.pte_bytes if ptd is None else tm.ptd_bytes):
        with pytest.raises(StateError, match=r"'fc\.weight'.*'forward', 'second'"):
            call()
    # one method's copy, copied into the other, resolves it
    a, _ = _two_losses()
    _eager_train(a, (_X, _Y))
    tm.load_state_dict(tm.state_dict("forward"), "second", strict=False)
    for name, value in a.state_dict().items():
        if name.startswith("fc."):
            torch.testing.assert_close(tm.state_dict()[name], value, rtol=1e-5, atol=1e-6)


def test_one_method_saves_as_before() -> None:
    """With one training method nothing is compared: the bytes of each parameter."""
    tm = T.load(FIX / "mlp.pte")
    opt = torch.optim.SGD(tm.parameters(), lr=0.1)
    tm.forward_backward("forward", example_inputs("mlp"))
    opt.step()
    layout, plan = tm.layout(), tm.method().state.plan
    want = pte_with(
        tm.program,
        [(plan, s, p) for s, p in zip(layout.parameter_slots, layout.parameters, strict=True)],
    )
    assert tm.pte_bytes() == want


# -- an inference method beside the training method ------------------------------------------


class _Predict(nn.Module):
    """The inference method: the same layers as a :class:`_Classify`, under the same names
    (so external weights of both methods are one key of the ``.ptd``)."""

    def __init__(self, a: _Classify) -> None:
        super().__init__()
        self.fc = a.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


@pytest.fixture(scope="module", params=[False, True], ids=["pte", "ptd"])
def with_inference(request: pytest.FixtureRequest) -> tuple[bytes, bytes | None]:
    """``forward`` (inference through ``fc``) beside ``train`` (cross-entropy through
    ``fc``); for ``ptd``, with the weights of both methods in a ``.ptd``
    (``external_constants`` and ``external_mutable_weights``)."""
    pytest.importorskip("executorch.exir")
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from torch.export.experimental import _export_forward_backward

    a, _ = _two_losses()
    methods = {
        "forward": torch.export.export(_Predict(a), (_X,), strict=True),
        "train": _export_forward_backward(torch.export.export(a, (_X, _Y), strict=True)),
    }
    external = request.param
    config = ExecutorchBackendConfig(external_constants=external, external_mutable_weights=external)
    prog = to_edge(methods).to_executorch(config)
    ptd = None
    if external:
        (blob,) = prog._tensor_data.values()
        ptd = bytes(blob)
    return bytes(prog.buffer), ptd


def test_the_inference_method_sees_trained_weights_where_executorch_does(
    with_inference: tuple[bytes, bytes | None],
) -> None:
    """Training ``train`` changes what ``forward`` computes only where ExecuTorch's does:
    not in the session (each method has memory of its own, in both runtimes), nor in a
    saved ``.pte`` (``forward``'s weights are constants of the program); in a saved
    ``.ptd`` whose keys both methods read, ``forward`` reads the trained values."""
    et_training = pytest.importorskip("executorch.extension.training")
    pl = pytest.importorskip("executorch.extension.pybindings.portable_lib")
    pte, ptd = with_inference
    a, _ = _two_losses()
    untrained = a.fc(_X).detach()
    _eager_train(a, (_X, _Y))
    trained_params = a.state_dict()
    trained = a.fc(_X).detach()
    assert not torch.allclose(trained, untrained, atol=1e-3)

    def loaded(pte: bytes, ptd: bytes | None) -> Any:
        _KEPT.append((pte, ptd))
        if ptd is None:
            return pl._load_for_executorch_from_buffer(pte)
        return pl._load_for_executorch_from_buffer(pte, ptd)

    # ExecuTorch's TrainingModule: the training method's copy trains, forward's does not
    et = loaded(pte, ptd)
    etm = et_training.TrainingModule(et)
    etm.forward_backward("train", (_X, _Y))
    opt = et_training.get_sgd_optimizer(etm.named_parameters(), 0.5, 0, 0, 0, False)
    for step in range(3):
        if step:
            etm.forward_backward("train", (_X, _Y))
        opt.step(etm.named_gradients())
    for name, p in etm.named_parameters().items():
        torch.testing.assert_close(p, trained_params[name], rtol=1e-5, atol=1e-6)
    et_forward = et.run_method("forward", (_X,))[0]
    torch.testing.assert_close(et_forward, untrained, rtol=1e-5, atol=1e-6)

    # ptexec, in the session: the same
    tm = T.load(pte, ptd)
    assert tm.methods == ("train",)
    forward = tm.program.load_method("forward")
    _train(tm, "train", (_X, _Y))
    for name, p in tm.named_parameters("train").items():
        torch.testing.assert_close(p, trained_params[name], rtol=1e-5, atol=1e-6)
    for method in (forward, tm.program.load_method("forward")):
        torch.testing.assert_close(method(_X)[0], et_forward, rtol=1e-5, atol=1e-6)

    # the saved files, in both runtimes
    saved_pte, saved_ptd = _saved(tm, pte, ptd)
    want = untrained if ptd is None else trained
    torch.testing.assert_close(
        loaded(saved_pte, saved_ptd).run_method("forward", (_X,))[0], want, rtol=1e-5, atol=1e-6
    )
    again = T.load(saved_pte, saved_ptd)
    torch.testing.assert_close(again.program.load_method("forward")(_X)[0], want,
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    for name, p in again.named_parameters("train").items():
        torch.testing.assert_close(p, trained_params[name], rtol=1e-5, atol=1e-6)


# -- a call that fails inside the program ----------------------------------------------------


def _bad(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, _ = example_inputs("mlp", seed)
    return x, torch.full((6,), 7)  # a label out of range: the program's gather raises


def test_failed_micro_batch_leaves_the_accumulated_gradients() -> None:
    module = _mlp()
    tm = T.load(FIX / "mlp.pte")
    good = [example_inputs("mlp", 1), example_inputs("mlp", 2), example_inputs("mlp", 3)]
    tm.forward_backward("forward", good[0], accumulate=True)
    with pytest.raises(ExecutionError):
        tm.forward_backward("forward", _bad(9), accumulate=True)
    with pytest.raises(IndexError):  # eager PyTorch refuses it too
        copy.deepcopy(module)(*_bad(9))
    tm.forward_backward("forward", good[1], accumulate=True)
    with pytest.raises(ExecutionError):
        tm.forward_backward("forward", _bad(8), accumulate=True)
    ref = _eager_grads(module, good[:2])
    for name, p in tm.named_parameters().items():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p, module.state_dict()[name], rtol=0, atol=0)
    # a .grad of the caller's own is left as it was
    p0 = tm.parameters()[0]
    p0.grad = torch.ones_like(p0)
    with pytest.raises(ExecutionError):
        tm.forward_backward("forward", _bad(7), accumulate=True)
    torch.testing.assert_close(p0.grad, torch.ones_like(p0), rtol=0, atol=0)


def test_failed_call_leaves_no_garbage_gradients() -> None:
    module = _mlp()
    first = example_inputs("mlp", 1)
    ref = _eager_grads(module, [first])
    # ExecuTorch's loop: the gradients named_gradients gave stay the previous call's
    tm = T.load(FIX / "mlp.pte")
    tm.forward_backward("forward", first)
    given = tm.named_gradients()
    with pytest.raises(ExecutionError):
        tm.forward_backward("forward", _bad(9))
    for name, p in tm.named_parameters().items():
        assert p.grad is None  # the planned memory holds what the failed call left
        torch.testing.assert_close(p, module.state_dict()[name], rtol=0, atol=0)
    assert tm.named_gradients() is given
    for name, g in given.items():
        torch.testing.assert_close(g, ref[name], rtol=1e-5, atol=1e-6)
    # torch's loop: no gradient, so a step changes nothing; named_gradients says why
    tm = T.load(FIX / "mlp.pte")
    opt = torch.optim.SGD(tm.parameters(), lr=0.1)
    tm.forward_backward("forward", first)
    with pytest.raises(ExecutionError):
        tm.forward_backward("forward", _bad(9))
    with pytest.raises(StateError, match="failed"):
        tm.named_gradients()
    opt.step()
    for name, p in tm.named_parameters().items():
        assert p.grad is None
        torch.testing.assert_close(p, module.state_dict()[name], rtol=0, atol=0)
    # the next call works as before
    tm.forward_backward("forward", first)
    for name, g in tm.named_gradients().items():
        torch.testing.assert_close(g, ref[name], rtol=1e-5, atol=1e-6)
    # a refused input writes nothing: the gradients stay
    with pytest.raises(InputError):
        tm.forward_backward("forward", (first[0][:, :3], first[1]))
    for name, p in tm.named_parameters().items():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only without CUDA")
@pytest.mark.parametrize("accumulate", [False, True])
def test_an_input_on_a_missing_device_is_a_refusal_that_keeps_the_gradients(
    accumulate: bool,
) -> None:
    """CUDA memory on a machine without CUDA is refused before anything is written, like
    any refused input: eager PyTorch keeps the gradients of the last backward, and so does
    the module (it dropped them, as after a call that failed inside the program)."""
    module = _mlp()
    first = example_inputs("mlp", 1)
    ref = _eager_grads(module, [first])
    tm = T.load(FIX / "mlp.pte")
    tm.forward_backward("forward", first, accumulate=accumulate)
    with pytest.raises(DeviceUnavailableError):
        bad = (CudaArray(tuple(first[0].shape)), first[1])
        tm.forward_backward("forward", bad, accumulate=accumulate)
    for name, p in tm.named_parameters().items():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6)
    for name, g in tm.named_gradients().items():
        torch.testing.assert_close(g, ref[name], rtol=1e-5, atol=1e-6)
    # the next call (accumulating: onto the kept gradients) is eager's
    second = example_inputs("mlp", 2)
    tm.forward_backward("forward", second, accumulate=accumulate)
    ref = _eager_grads(module, [first, second] if accumulate else [second])
    for name, p in tm.named_parameters().items():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6)


# -- ExecuTorch's named_gradients hands out copies -------------------------------------------


def test_named_gradients_are_copies_as_in_executorch() -> None:
    """Gradients kept from one call survive the next, and an averaged ExecuTorch SGD step
    gives ExecuTorch's TrainingModule's parameters bit for bit."""
    et_training = pytest.importorskip("executorch.extension.training")
    pte = (FIX / "mlp.pte").read_bytes()
    b1, b2 = example_inputs("mlp", 1), example_inputs("mlp", 2)
    module = _mlp()
    ref1, ref2 = _eager_grads(module, [b1]), _eager_grads(module, [b2])
    results = {}
    for lib in (T, et_training):
        tm = lib._load_for_executorch_for_training_from_buffer(pte)
        tm.forward_backward("forward", b1)
        g1 = tm.named_gradients()
        tm.forward_backward("forward", b2)
        g2 = tm.named_gradients()
        assert tm.named_gradients() is g2  # the same dict until the next call, as there
        for name in ref1:
            torch.testing.assert_close(g1[name], ref1[name], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(g2[name], ref2[name], rtol=1e-5, atol=1e-6)
        opt = lib.get_sgd_optimizer(tm.named_parameters(), 0.1, 0.9, 0, 0.01, True)
        opt.step({k: (g1[k] + g2[k]) / 2 for k in g1})
        opt.step(g2)  # weight decay and Nesterov are written into the given gradients
        results[lib] = (
            {k: v.clone() for k, v in tm.named_parameters().items()},
            {k: v.clone() for k, v in tm.named_gradients().items()},
        )
        if lib is T:  # .grad is the planned gradient, not what the optimizer wrote
            for name, p in tm.named_parameters().items():
                torch.testing.assert_close(p.grad, ref2[name], rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(results[T], results[et_training], strict=True):
        for name in ours:  # the programs' gradients differ in rounding only
            torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-7)


def test_a_call_between_backward_and_step_leaves_the_gradients() -> None:
    """Running the training method for its outputs (an evaluation batch) between a
    backward and the optimizer's step writes the method's gradient memory: ``.grad``,
    ``named_gradients()`` and the sum of accumulated micro-batches stay those of the
    ``forward_backward`` calls, as eager PyTorch's ``.grad`` and ExecuTorch's
    ``TrainingModule`` (which copies the gradients at each ``forward_backward``) keep
    them."""
    module = _mlp()
    a, b, c = (example_inputs("mlp", k) for k in (1, 2, 3))
    ref_a, ref_ac = _eager_grads(module, [a]), _eager_grads(module, [a, c])
    tm = T.load(FIX / "mlp.pte")
    tm.forward_backward("forward", a)
    evaluate = tm.method()
    evaluate(*b)
    evaluate.trace(b)
    for name, p in tm.named_parameters().items():
        torch.testing.assert_close(p.grad, ref_a[name], rtol=1e-5, atol=1e-6)
    for name, g in tm.named_gradients().items():
        torch.testing.assert_close(g, ref_a[name], rtol=1e-5, atol=1e-6)
    # micro-batches summed around an evaluation call
    tm = T.load(FIX / "mlp.pte")
    tm.forward_backward("forward", a, accumulate=True)
    tm.method()(*b)
    tm.forward_backward("forward", c, accumulate=True)
    for name, p in tm.named_parameters().items():
        torch.testing.assert_close(p.grad, ref_ac[name], rtol=1e-5, atol=1e-6)
    # ExecuTorch's TrainingModule, running its program between the calls, agrees
    et_training = pytest.importorskip("executorch.extension.training")
    et = et_training._load_for_executorch_for_training(str(FIX / "mlp.pte"))
    et.forward_backward("forward", a)
    et.model.run_method("forward", b)
    tm = T.load(FIX / "mlp.pte")
    tm.forward_backward("forward", a)
    tm.method()(*b)
    theirs, ours = et.named_gradients(), tm.named_gradients()
    for name in ref_a:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-7)


# -- saved files get the mode a plain write gives them ---------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_saved_files_have_the_mode_a_plain_write_gives(tmp_path: Path) -> None:
    """A new file is made as ``open(path, "wb")`` makes one (the umask applies), and a
    file written over keeps its mode, as there: saving went through a private temporary
    file (mode 0600), so a trained model another user serves could not be read."""
    tm = T.load(FIX / "mlp_ext.pte", FIX / "mlp_ext.ptd")
    old = os.umask(0o022)
    try:
        plain = tmp_path / "plain"
        plain.write_bytes(b"")
        kept = tmp_path / "kept.ptd"
        kept.write_bytes(b"")
        os.chmod(kept, 0o640)
        tm.save_ptd(tmp_path / "new.ptd")
        tm.save_ptd(kept)
        T.load(FIX / "mlp.pte").save_pte(tmp_path / "new.pte")
    finally:
        os.umask(old)
    assert _mode(plain) == 0o644
    assert _mode(tmp_path / "new.ptd") == _mode(tmp_path / "new.pte") == _mode(plain)
    assert _mode(kept) == 0o640
    assert (tmp_path / "new.ptd").read_bytes() == kept.read_bytes() == tm.ptd_bytes()


def test_saving_over_a_private_file_never_shows_its_new_bytes_to_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written over that only its owner may read (0600): ``open(path, "wb")`` never
    lets anyone else read the new bytes, so neither may the temporary file they are
    written to before the rename (made with the umask's 0644, it was readable by all
    while written, and whoever opened it then kept reading it)."""
    tm = T.load(FIX / "mlp_ext.pte", FIX / "mlp_ext.ptd")
    secret = tmp_path / "secret.ptd"
    secret.write_bytes(b"old")
    os.chmod(secret, 0o600)
    seen: list[int] = []
    real = os.fdopen

    def opened(fd: int, *args: Any, **kwargs: Any) -> Any:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))  # before a byte is written
        return real(fd, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", opened)
    old = os.umask(0o022)
    try:
        tm.save_ptd(secret)
    finally:
        os.umask(old)
    monkeypatch.undo()
    assert seen and all(mode & 0o077 == 0 for mode in seen), [oct(m) for m in seen]
    assert _mode(secret) == 0o600 and secret.read_bytes() == tm.ptd_bytes()


def test_saving_through_a_link_writes_the_file_it_names(tmp_path: Path) -> None:
    """Saving to a symbolic link writes the file the link names, as ``open(path, "wb")``
    does, and the link stays a link: the link itself was replaced by a new file and the
    file it named kept its old bytes (a ``latest.pte`` link to a versioned file)."""
    tm = T.load(FIX / "mlp_ext.pte", FIX / "mlp_ext.ptd")
    named = tmp_path / "v1.ptd"
    named.write_bytes(b"old")
    link = tmp_path / "latest.ptd"
    link.symlink_to(named.name)
    dangling = tmp_path / "next.ptd"
    dangling.symlink_to("v2.ptd")
    tm.save_ptd(link)
    tm.save_ptd(dangling)
    assert link.is_symlink() and dangling.is_symlink()
    assert named.read_bytes() == (tmp_path / "v2.ptd").read_bytes() == tm.ptd_bytes()
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "latest.ptd",
        "next.ptd",
        "v1.ptd",
        "v2.ptd",
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="the superuser may write any file")
def test_saving_over_a_read_only_file_is_refused_as_a_plain_write_is(tmp_path: Path) -> None:
    """A file this process may not write is refused with ``PermissionError``, as
    ``open(path, "wb")`` refuses it, and left as it was (it was replaced, mode 0444 kept)."""
    tm = T.load(FIX / "mlp_ext.pte", FIX / "mlp_ext.ptd")
    kept = tmp_path / "kept.ptd"
    kept.write_bytes(b"old")
    os.chmod(kept, 0o444)
    with pytest.raises(PermissionError):
        tm.save_ptd(kept)
    assert kept.read_bytes() == b"old"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["kept.ptd"]


# -- one gradient value for two parameters ---------------------------------------------------


class _TwoBiases(nn.Module):
    """Two biases added to one sum: their gradients are equal."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))
        self.b1 = nn.Parameter(torch.randn(3))
        self.b2 = nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.mse_loss(x @ self.w + self.b1 + self.b2, y),)


def test_a_gradient_value_two_parameters_share_is_summed_and_clipped_as_in_eager() -> None:
    """A program that returns one gradient value for ``b1`` and ``b2`` (equal here), as
    ExecuTorch's runtime runs it: accumulating and clipping ``.grad`` in place change each
    parameter's gradient once, as in eager PyTorch (adding into the one memory for both
    summed the earlier micro-batches twice, and clipping scaled it twice)."""
    serialize = pytest.importorskip("executorch.exir._serialize._program")
    torch.manual_seed(0)
    module = _TwoBiases()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(5, 4, generator=g), torch.randn(5, 3, generator=g)) for _ in range(6)]
    pte, _ = export_training(copy.deepcopy(module), batches[0])
    program = serialize.deserialize_pte_binary(pte)
    plan = next(p for p in program.program.execution_plan if p.name == "forward")
    assert len(plan.outputs) == 7  # [loss, 3 gradients, 3 parameters]
    plan.outputs[3] = plan.outputs[2]  # b2's gradient is b1's value
    shared = bytes(serialize.serialize_pte_binary(program))
    et_training = pytest.importorskip("executorch.extension.training")
    et = et_training._load_for_executorch_for_training_from_buffer(shared)
    et.forward_backward("forward", batches[0])
    ref = _eager_grads(module, batches[:1])
    for name, value in et.named_gradients().items():  # a program ExecuTorch runs as eager
        torch.testing.assert_close(value, ref[name], rtol=1e-5, atol=1e-6)

    tm = T.load(shared)
    opt = torch.optim.AdamW(tm.parameters(), lr=0.1)
    ref_opt = torch.optim.AdamW(list(module.parameters()), lr=0.1)
    for a, b in zip(batches[::2], batches[1::2], strict=True):
        opt.zero_grad()
        tm.forward_backward("forward", a, accumulate=True)
        tm.forward_backward("forward", b, accumulate=True)
        ref_opt.zero_grad()
        module(*a)[0].backward()
        module(*b)[0].backward()
        for (name, p), q in zip(tm.named_parameters().items(), module.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
        norm = torch.nn.utils.clip_grad_norm_(tm.parameters(), 0.5)
        ref_norm = torch.nn.utils.clip_grad_norm_(module.parameters(), 0.5)
        torch.testing.assert_close(norm, ref_norm)
        for (name, p), q in zip(tm.named_parameters().items(), module.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
        opt.step()
        ref_opt.step()
    for name, q in module.named_parameters():
        torch.testing.assert_close(tm.state_dict()[name], q.detach(), rtol=1e-5, atol=1e-6)
    # without accumulate each call's gradient replaces the last, for both parameters
    tm.forward_backward("forward", batches[0])
    tm.forward_backward("forward", batches[1])
    ref = _eager_grads(module, batches[1:2])
    for name, p in tm.named_parameters().items():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6, msg=name)


# -- check_gradients and torch's random generator --------------------------------------------


class _Dropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        h = F.dropout(torch.tanh(self.fc(x)), 0.5, self.training)
        return (F.cross_entropy(self.out(h), y),)


def test_check_gradients_of_a_dropout_program_draws_as_eager_and_leaves_the_generator() -> None:
    """The program and the eager module draw the same dropout mask from one generator
    state, so a check compares like with like, and the generator is left as it was: a
    check between two steps changes neither (the program drew other numbers than eager, a
    false difference, and moved the generator on, changing the next step's mask)."""
    torch.manual_seed(0)
    module = _Dropout()
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g))
    pte, _ = export_training(copy.deepcopy(module), batch)
    ref = copy.deepcopy(module)
    torch.manual_seed(5)
    ref(*batch)[0].backward()
    ref.zero_grad()
    second = ref(*batch)[0]
    second.backward()
    tm = T.load(pte)
    torch.manual_seed(5)
    tm.forward_backward("forward", batch)
    check = tm.check_gradients(module, batch)
    assert check.ok, str(check)
    loss = tm.forward_backward("forward", batch)[0]
    torch.testing.assert_close(loss, second.detach(), rtol=1e-6, atol=1e-6)
    for (name, p), q in zip(tm.named_parameters().items(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
