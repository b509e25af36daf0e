"""ptexec.training against eager PyTorch training and ExecuTorch's own training runtime.

The programs are the committed fixtures of ``scripts/make_training_fixtures.py``; the eager
reference is the same module (``tests/training_models.py``) with the same initial weights
(``state.pt``), trained with the same optimizer on the same data.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
import ptexec.training as T
from ptexec.errors import (
    DeviceUnavailableError,
    InputError,
    MethodNotFoundError,
    NotFoundError,
    StateError,
)
from training_models import MODELS, example_inputs

FIX = Path(__file__).resolve().parent / "fixtures" / "training"
STEPS = 50


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny layers: one intra-op thread is many times faster than two on a busy machine
    (the eager reference's and the program's kernels alike)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _module(name: str) -> torch.nn.Module:
    module = MODELS[name]()
    module.load_state_dict(torch.load(FIX / "state.pt")[name])
    return module


def _batches(name: str, n: int) -> list[tuple[torch.Tensor, ...]]:
    """``n`` steps over a dataset of four batches (so that training can fit it)."""
    return [example_inputs(name, step % 4) for step in range(n)]


def _eager_run(
    module: torch.nn.Module,
    make_opt: Callable[[Any], Any],
    batches: list[tuple[torch.Tensor, ...]],
    scheduler: Callable[[Any], Any] | None = None,
) -> list[float]:
    params = [p for p in module.parameters() if p.requires_grad]
    opt = make_opt(params)
    sched = scheduler(opt) if scheduler else None
    losses = []
    for batch in batches:
        opt.zero_grad()
        loss = module(*batch)[0]
        loss.backward()
        opt.step()
        if sched:
            sched.step()
        losses.append(float(loss.detach()))
    return losses


def _ptexec_run(
    tm: T.TrainingModule,
    make_opt: Callable[[Any], Any],
    batches: list[tuple[torch.Tensor, ...]],
    scheduler: Callable[[Any], Any] | None = None,
) -> list[float]:
    opt = make_opt(tm.parameters())
    sched = scheduler(opt) if scheduler else None
    losses = []
    for batch in batches:
        opt.zero_grad()
        loss = tm.forward_backward("forward", batch)[0]
        opt.step()
        if sched:
            sched.step()
        losses.append(float(loss))
    return losses


def _assert_same_params(tm: T.TrainingModule, module: torch.nn.Module, atol: float) -> None:
    named = dict(module.named_parameters())
    state = tm.state_dict()
    assert state, "no parameters"
    for name, value in state.items():
        torch.testing.assert_close(value, named[name].detach(), rtol=1e-4, atol=atol)


# -- the layout ExecuTorch's exporter emits ---------------------------------------------------


def test_parameters_and_gradients_are_the_methods_planned_memory() -> None:
    tm = T.load(FIX / "mlp.pte")
    method = tm.method()
    layout = tm.layout()
    assert layout.names == ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    assert (layout.gradient_start, layout.parameter_start) == (2, 6)
    buffers = [b.data for b in method.state.buffers]

    def inside(t: torch.Tensor) -> bool:
        return any(
            b.data_ptr() <= t.data_ptr() < b.data_ptr() + b.numel() * b.element_size()
            for b in buffers
        )

    assert all(inside(t) for t in layout.parameters + layout.gradients)
    # the initial parameters are the module's
    for name, p in tm.named_parameters().items():
        torch.testing.assert_close(p, _module("mlp").state_dict()[name], rtol=0, atol=0)
    x, y = example_inputs("mlp")
    loss, logits = tm.forward_backward("forward", (x, y))
    ref = _module("mlp")
    ref_loss, ref_logits = ref(x, y)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss.detach())
    torch.testing.assert_close(logits, ref_logits)
    for name, p in tm.named_parameters().items():
        assert p.grad is layout.gradients[layout.names.index(name)]
        torch.testing.assert_close(p.grad, dict(ref.named_parameters())[name].grad)
    assert tm.named_gradients().keys() == tm.named_parameters().keys()
    # writing a parameter changes what the next call computes
    with torch.no_grad():
        tm.named_parameters()["fc2.bias"].add_(1.0)
        dict(ref.named_parameters())["fc2.bias"].add_(1.0)
    torch.testing.assert_close(tm.forward_backward("forward", (x, y))[1], ref(x, y)[1])


def test_not_a_training_program() -> None:
    prog = ptexec.load(Path(__file__).parent / "fixtures" / "mlp.pte")
    tm = T.TrainingModule(prog)
    assert tm.methods == ()
    with pytest.raises(MethodNotFoundError, match="not a training method"):
        tm.forward_backward("forward", (torch.randn(2, 4),))


def test_a_refused_call_leaves_the_module_working() -> None:
    tm = T.load(FIX / "mlp.pte")
    with pytest.raises(StateError):
        tm.named_gradients()
    x, y = example_inputs("mlp")
    with pytest.raises(InputError):
        tm.forward_backward("forward", (x[:, :3], y))
    with pytest.raises(InputError):
        tm.forward_backward("forward", (x, y.float()))
    loss = tm.forward_backward("forward", (x, y))[0]
    torch.testing.assert_close(loss, _module("mlp")(x, y)[0].detach())


def test_the_method_behind_the_module_returns_copies_as_any_method() -> None:
    """``tm.method()`` is a ``ptexec.Method``: called plainly it returns copies (its
    documented default), so a loss kept from one call is not the next call's; the
    gradients and parameters stay the method's memory for ``forward_backward``."""
    tm = T.load(FIX / "mlp.pte")
    first, second = example_inputs("mlp", 0), example_inputs("mlp", 1)
    ref = _module("mlp")
    want = [t.detach() for t in ref(*first)]
    kept = tm.method()(*first)
    tm.method()(*second)
    torch.testing.assert_close(kept[0], want[0])
    torch.testing.assert_close(kept[1], want[1])
    params = tm.parameters()
    assert kept[-1].data_ptr() != params[-1].data_ptr()
    loss = tm.forward_backward("forward", first)[0]
    torch.testing.assert_close(loss, want[0])
    ref(*first)[0].backward()
    for name, p in tm.named_parameters().items():
        assert p.grad is tm.layout().gradients[tm.layout().names.index(name)]
        torch.testing.assert_close(p.grad, dict(ref.named_parameters())[name].grad)


# -- ExecuTorch's SGD ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "momentum,dampening,weight_decay,nesterov",
    [(0, 0, 0, False), (0.9, 0, 0, False), (0.9, 0.1, 1e-2, False), (0.9, 0, 1e-2, True)],
)
def test_sgd_is_executorchs(
    momentum: float, dampening: float, weight_decay: float, nesterov: bool
) -> None:
    """Step for step ExecuTorch's C++ SGD's floats exactly, and torch.optim.SGD's within
    rounding."""
    et_training = pytest.importorskip("executorch.extension.training")
    g = torch.Generator().manual_seed(1)
    start = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
    grads = [{k: torch.randn(v.shape, generator=g) for k, v in start.items()} for _ in range(6)]
    ours = {k: v.clone() for k, v in start.items()}
    theirs = {k: v.clone() for k, v in start.items()}
    eager = {k: v.clone() for k, v in start.items()}
    args = (0.1, momentum, dampening, weight_decay, nesterov)
    opt = T.get_sgd_optimizer(ours, *args)
    et_opt = et_training.get_sgd_optimizer(theirs, *args)
    torch_opt = torch.optim.SGD(
        list(eager.values()),
        lr=0.1,
        momentum=momentum,
        dampening=dampening,
        weight_decay=weight_decay,
        nesterov=nesterov,
        foreach=False,
    )
    for step in grads:
        mine = {k: v.clone() for k, v in step.items()}
        et_grads = {k: v.clone() for k, v in step.items()}
        opt.step(mine)
        et_opt.step(et_grads)
        for k, p in eager.items():
            p.grad = step[k].clone()
        torch_opt.step()
        for k in start:
            torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=0)
            torch.testing.assert_close(ours[k], eager[k], rtol=1e-6, atol=1e-6)
            # ExecuTorch writes weight decay and Nesterov into the caller's gradients
            torch.testing.assert_close(mine[k], et_grads[k], rtol=0, atol=0)


def test_sgd_checks_every_gradient_before_stepping() -> None:
    params = {"a": torch.zeros(3), "b": torch.zeros(2)}
    opt = T.get_sgd_optimizer(params, 0.5)
    with pytest.raises(InputError, match="gradient 'b'"):
        opt.step({"a": torch.ones(3), "b": torch.ones(3)})
    assert not params["a"].any()
    opt.step({"a": torch.ones(3), "unknown": torch.ones(1)})  # other names are ignored
    torch.testing.assert_close(params["a"], torch.full((3,), -0.5))


# -- 50 steps against eager training ---------------------------------------------------------


def _sgd_et(params: Any) -> Any:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True)


def _adamw(params: Any) -> Any:
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)


def _cosine(opt: Any) -> Any:
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)


@pytest.mark.parametrize("name", ["mlp", "cnn", "lora"])
@pytest.mark.parametrize("optimizer", ["executorch_sgd", "adamw"])
def test_training_equals_eager(name: str, optimizer: str) -> None:
    batches = _batches(name, STEPS)
    module = _module(name)
    frozen = {k: v.clone() for k, v in module.state_dict().items()}
    tm = T.load(FIX / f"{name}.pte")
    if optimizer == "adamw":
        ours = _ptexec_run(tm, _adamw, batches, _cosine)
        ref = _eager_run(module, _adamw, batches, _cosine)
    else:
        # ExecuTorch's own optimizer on the program, torch's SGD on the eager module
        opt = T.get_sgd_optimizer(tm.named_parameters(), 0.05, 0.9, 0, 1e-3, True)
        ours = []
        for batch in batches:
            ours.append(float(tm.forward_backward("forward", batch)[0]))
            opt.step(tm.named_gradients())
        ref = _eager_run(module, _sgd_et, batches)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=1e-4, atol=1e-5)
    assert float(tm.forward_backward("forward", batches[0])[0]) < ours[0]  # it learned
    _assert_same_params(tm, module, atol=1e-5)
    if name == "lora":  # only the adapters train; the frozen base is the program's constant
        assert set(tm.state_dict()) == {"q.lora_a", "q.lora_b", "v.lora_a", "v.lora_b"}
        for k, v in module.state_dict().items():
            if "lora" not in k:
                torch.testing.assert_close(v, frozen[k], rtol=0, atol=0)


def test_clipping_and_accumulation_as_in_eager() -> None:
    """Two micro-batches accumulated into .grad, clipped, one AdamW step; ten times."""
    module = _module("mlp")
    tm = T.load(FIX / "mlp.pte")
    opt = _adamw(tm.parameters())
    ref_opt = _adamw(list(module.parameters()))
    for step in range(10):
        a, b = example_inputs("mlp", 2 * step), example_inputs("mlp", 2 * step + 1)
        opt.zero_grad()
        tm.forward_backward("forward", a, accumulate=True)
        tm.forward_backward("forward", b, accumulate=True)
        norm = torch.nn.utils.clip_grad_norm_(tm.parameters(), 0.5)
        opt.step()
        ref_opt.zero_grad()
        module(*a)[0].backward()
        module(*b)[0].backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(module.parameters(), 0.5)
        ref_opt.step()
        torch.testing.assert_close(norm, ref_norm)
    _assert_same_params(tm, module, atol=1e-6)
    # without accumulate, each call's gradients replace the last (ExecuTorch's semantics)
    x = example_inputs("mlp", 99)
    tm.forward_backward("forward", x)
    first = {k: v.clone() for k, v in tm.named_gradients().items()}
    tm.forward_backward("forward", x)
    for k, v in tm.named_gradients().items():
        torch.testing.assert_close(v, first[k])
    # a .grad the caller set is added to
    p = tm.parameters()[0]
    p.grad = torch.ones_like(p)
    tm.forward_backward("forward", x, accumulate=True)
    torch.testing.assert_close(p.grad, first["fc1.weight"] + 1)
    tm.zero_grad()
    assert all(q.grad is None for q in tm.parameters())


def test_accumulating_into_another_tensor_over_the_gradient_memory() -> None:
    """A ``.grad`` set to another tensor over the planned gradient (``p.grad.detach()``)
    is that memory: accumulated calls sum the micro-batches (they gave twice the last), and
    the same memory in another layout is refused rather than overwritten."""
    module = _module("mlp")
    tm = T.load(FIX / "mlp.pte")
    a, b = example_inputs("mlp", 0), example_inputs("mlp", 1)
    tm.forward_backward("forward", a)
    for p in tm.parameters():
        assert p.grad is not None
        p.grad = p.grad.detach()
    tm.forward_backward("forward", b, accumulate=True)
    module(*a)[0].backward()
    module(*b)[0].backward()
    for (name, p), q in zip(tm.named_parameters().items(), module.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)
    w = tm.parameters()[0]
    assert w.grad is not None and w.grad.dim() == 2
    w.grad = w.grad.t().contiguous().t()  # (its own memory: fine)
    tm.forward_backward("forward", b, accumulate=True)
    planned = tm.parameters()[1]
    assert planned.grad is not None
    flat = planned.grad.reshape(-1)
    planned.grad = flat[: planned.numel()].view(planned.shape)  # the same memory and layout
    tm.forward_backward("forward", b, accumulate=True)
    g = tm.parameters()[0]
    tm.forward_backward("forward", b)  # .grad is the planned gradient again
    assert g.grad is not None
    rows, cols = g.shape
    g.grad = g.grad.as_strided((rows, cols), (1, rows))  # its memory, another layout
    with pytest.raises(StateError, match="another layout"):
        tm.forward_backward("forward", b, accumulate=True)


def test_load_state_dict_says_what_it_did_not_load() -> None:
    """``load_state_dict(strict=False)`` returns the parameters left out and the names that
    are no parameter (a frozen weight is a constant of the program), as torch's does."""
    tm = T.load(FIX / "mlp.pte")
    state = tm.state_dict()
    first = next(iter(state))
    partial = {k: v for k, v in state.items() if k != first}
    keys = tm.load_state_dict({**partial, "frozen.weight": torch.zeros(1)}, strict=False)
    assert keys == T.LoadedKeys([first], ["frozen.weight"])
    assert tm.load_state_dict(state) == T.LoadedKeys([], [])


# -- saving ----------------------------------------------------------------------------------


def _train_a_little(tm: T.TrainingModule, name: str) -> None:
    opt = _adamw(tm.parameters())
    for batch in _batches(name, 5):
        opt.zero_grad()
        tm.forward_backward("forward", batch)
        opt.step()


def test_saved_pte_has_the_trained_weights(tmp_path: Path) -> None:
    tm = T.load(FIX / "mlp.pte")
    _train_a_little(tm, "mlp")
    x, y = example_inputs("mlp", 123)
    want = tm.forward_backward("forward", (x, y))
    tm.save_pte(tmp_path / "trained.pte")
    data = (tmp_path / "trained.pte").read_bytes()
    assert len(data) == (FIX / "mlp.pte").stat().st_size
    again = T.load(tmp_path / "trained.pte")
    for k, v in tm.state_dict().items():
        torch.testing.assert_close(again.named_parameters()[k], v, rtol=0, atol=0)
    torch.testing.assert_close(again.forward_backward("forward", (x, y)), want, rtol=0, atol=0)
    plain = ptexec.load(data).load_method("forward")(x, y)
    torch.testing.assert_close(plain[:2], want, rtol=0, atol=0)
    rt = pytest.importorskip("executorch.runtime").Runtime.get()
    et_program = rt.load_program(data)  # kept: its methods read the program's memory
    et_out = et_program.load_method("forward").execute([x, y])
    torch.testing.assert_close(et_out[0], want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(et_out[1], want[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(StateError, match="data file"):
        tm.save_ptd(tmp_path / "x.ptd")


def test_saved_ptd_has_the_trained_weights(tmp_path: Path) -> None:
    tm = T.load(FIX / "mlp_ext.pte", FIX / "mlp_ext.ptd")
    for k, v in tm.named_parameters().items():  # the same initial weights as the .pte
        torch.testing.assert_close(v, _module("mlp").state_dict()[k], rtol=0, atol=0)
    _train_a_little(tm, "mlp")
    x, y = example_inputs("mlp", 7)
    want = tm.forward_backward("forward", (x, y))
    tm.save_ptd(tmp_path / "trained.ptd")
    again = T.load(FIX / "mlp_ext.pte", tmp_path / "trained.ptd")
    torch.testing.assert_close(again.forward_backward("forward", (x, y)), want, rtol=0, atol=0)
    pl = pytest.importorskip("executorch.extension.pybindings.portable_lib")
    et = pl._load_for_executorch(str(FIX / "mlp_ext.pte"), str(tmp_path / "trained.ptd"))
    et_out = et.forward((x, y))
    torch.testing.assert_close(et_out[0], want[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(StateError, match="save_ptd"):
        tm.pte_bytes()


def test_parameters_the_file_stores_in_the_same_bytes_are_saved_each_in_its_own(
    tmp_path: Path,
) -> None:
    """ExecuTorch's exporter stores equal initial values once: the LoRA fixture's two B
    matrices (zeros) start from one entry. While they are equal they save as one; once
    training makes them differ each gets an entry of its own, and ptexec and ExecuTorch's
    runtime load the trained values (one was written over the other, silently)."""
    tm = T.load(FIX / "lora.pte")
    plan = tm.method("forward").state.plan
    slots = dict(zip(tm.layout("forward").names, tm.layout("forward").parameter_slots, strict=True))
    a, b = plan.values[slots["q.lora_b"]], plan.values[slots["v.lora_b"]]
    assert a.data_buffer_idx == b.data_buffer_idx  # (the shared entry this is about)
    tm.save_pte(tmp_path / "untrained.pte")  # equal still: written in place
    assert (tmp_path / "untrained.pte").stat().st_size == (FIX / "lora.pte").stat().st_size
    _train_a_little(tm, "lora")
    trained = tm.state_dict()
    assert not torch.equal(trained["q.lora_b"], trained["v.lora_b"])
    x = _batches("lora", 1)[0]
    want = tm.forward_backward("forward", x)
    tm.save_pte(tmp_path / "trained.pte")
    again = T.load(tmp_path / "trained.pte")
    for k, v in again.state_dict().items():
        assert torch.equal(v, trained[k]), k
    torch.testing.assert_close(again.forward_backward("forward", x), want, rtol=0, atol=0)
    saved = again.method("forward").state.plan.values
    assert saved[slots["q.lora_b"]].data_buffer_idx != saved[slots["v.lora_b"]].data_buffer_idx
    rt = pytest.importorskip("executorch.runtime").Runtime.get()
    # the program (and the bytes it holds) kept while its method runs: a method of
    # ExecuTorch's runtime does not keep them alive, and reads freed memory without them
    et_program = rt.load_program((tmp_path / "trained.pte").read_bytes())
    et_out = et_program.load_method("forward")
    torch.testing.assert_close(et_out.execute(list(x))[0], want[0], rtol=1e-5, atol=1e-6)


def test_executorchs_loaders_by_path_and_buffer() -> None:
    x, y = example_inputs("mlp")
    want = _module("mlp")(x, y)[0].detach()
    by_path = T._load_for_executorch_for_training(str(FIX / "mlp_ext.pte"), FIX / "mlp_ext.ptd")
    by_buffer = T._load_for_executorch_for_training_from_buffer(
        memoryview((FIX / "mlp_ext.pte").read_bytes()), (FIX / "mlp_ext.ptd").read_bytes()
    )
    for tm in (by_path, by_buffer):
        torch.testing.assert_close(tm.forward_backward("forward", (x, y))[0], want)
        assert set(tm.named_gradients()) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


def test_state_dict_round_trips(tmp_path: Path) -> None:
    tm = T.load(FIX / "cnn.pte")
    _train_a_little(tm, "cnn")
    buf = io.BytesIO()
    torch.save(tm.state_dict(), buf)
    fresh = T.load(FIX / "cnn.pte")
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    batch = example_inputs("cnn", 3)
    torch.testing.assert_close(
        fresh.forward_backward("forward", batch), tm.forward_backward("forward", batch)
    )
    # into the eager module too, by the same names
    module = _module("cnn")
    module.load_state_dict(tm.state_dict())
    torch.testing.assert_close(module(*batch)[0].detach(), tm.forward_backward("forward", batch)[0])
    with pytest.raises(NotFoundError, match="missing"):
        fresh.load_state_dict({"conv1.weight": torch.zeros(6, 3, 3, 3)})
    bad = dict(tm.state_dict(), **{"fc.bias": torch.zeros(4)})
    before = fresh.state_dict()
    with pytest.raises(InputError, match=r"fc\.bias"):
        fresh.load_state_dict(bad)
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


# -- checks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "cnn", "lora"])
def test_check_gradients(name: str) -> None:
    tm = T.load(FIX / f"{name}.pte")
    batch = example_inputs(name, 5)
    tm.forward_backward("forward", batch)
    kept = {k: v.clone() for k, v in tm.named_gradients().items()}
    result = tm.check_gradients(_module(name), batch)
    assert result.ok, str(result)
    assert set(result.errors) == set(tm.layout().names)
    for k, p in tm.named_parameters().items():  # the check put the gradients back
        torch.testing.assert_close(p.grad, kept[k], rtol=0, atol=0)
    if name == "lora":  # a base that differs from the program's frozen one is caught
        other = _module(name)
        with torch.no_grad():
            other.q.base.weight.mul_(1.5)
        wrong = tm.check_gradients(other, batch)
        assert not wrong.ok and not all(wrong.within.values())
    else:  # a module without the program's parameter names is refused
        with pytest.raises(InputError, match="no parameters named"):
            tm.check_gradients(torch.nn.Linear(2, 2), batch)


# -- devices ---------------------------------------------------------------------------------


def test_device_map_rules_on_the_cpu() -> None:
    tm = T.load(FIX / "mlp.pte", device_map={"cpu": "cpu"})
    assert all(p.device.type == "cpu" for p in tm.parameters())
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError):
            T.load(FIX / "mlp.pte", device_map="cuda").parameters()


@pytest.mark.cuda
def test_training_on_cuda_equals_the_cpu() -> None:
    batches = _batches("cnn", 20)
    cpu = T.load(FIX / "cnn.pte")
    gpu = T.load(FIX / "cnn.pte", device_map="cuda")
    assert all(p.is_cuda and p.grad is None for p in gpu.parameters())
    a = _ptexec_run(cpu, _adamw, batches)
    b = _ptexec_run(gpu, _adamw, batches)  # CPU inputs are copied into the planned views
    assert all(p.is_cuda and p.grad is not None and p.grad.is_cuda for p in gpu.parameters())
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-3, atol=1e-4)
    for k, v in gpu.state_dict().items():
        torch.testing.assert_close(v.cpu(), cpu.state_dict()[k], rtol=1e-3, atol=1e-4)
    sgd = T.get_sgd_optimizer(gpu.named_parameters(), 0.1, 0.9)
    gpu.forward_backward("forward", batches[0])
    sgd.step(gpu.named_gradients())
    again = T.load(gpu.pte_bytes())
    for k, v in gpu.state_dict().items():
        torch.testing.assert_close(again.named_parameters()[k], v.cpu(), rtol=0, atol=0)


@pytest.mark.slow  # tracing the regions takes ~20 s here
def test_compiled_regions_read_what_the_optimizer_wrote() -> None:
    """The compiled tier's bookkeeping (graph backend: no build) trains as the interpreter."""
    from ptexec.compile import CompileOptions

    plain = T.load(FIX / "mlp.pte")
    compiled = T.load(FIX / "mlp.pte", compile=CompileOptions(backend="graph"))
    batches = _batches("mlp", 10)
    a = _ptexec_run(plain, _adamw, batches)
    b = _ptexec_run(compiled, _adamw, batches)
    assert a == b
    for k, v in compiled.state_dict().items():
        torch.testing.assert_close(v, plain.state_dict()[k], rtol=0, atol=0)


@pytest.mark.parametrize("bad", ["meta", "sparse"])
def test_load_state_dict_writes_nothing_when_an_entry_cannot_be_read(bad: str) -> None:
    tm = T.load(FIX / "mlp.pte")
    before = tm.state_dict()
    state = {k: torch.full_like(v, 7.0) for k, v in before.items()}
    last = list(state)[-1]
    state[last] = (
        torch.empty(before[last].shape, device="meta")
        if bad == "meta"
        else torch.ones_like(before[last]).to_sparse()
    )
    with pytest.raises(InputError, match=last):
        tm.load_state_dict(state)
    for k, v in tm.state_dict().items():
        assert torch.equal(v, before[k]), k


class _TwoNorms(torch.nn.Module):
    """Two LayerNorms, whose weights (ones) and biases (zeros) the exporter stores once."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.ln1 = torch.nn.Linear(6, 6), torch.nn.LayerNorm(6)
        self.fc2, self.ln2 = torch.nn.Linear(6, 3), torch.nn.LayerNorm(6)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        h = self.ln2(torch.tanh(self.ln1(self.fc1(x))) * 2 + x)
        return (torch.nn.functional.cross_entropy(self.fc2(h), y),)


def test_a_data_file_storing_parameters_in_one_place_is_saved_with_each_its_own(
    tmp_path: Path,
) -> None:
    """External weights the exporter stored once (equal at export) and training made
    differ: the saved .ptd gives each its own bytes, and ptexec and ExecuTorch's runtime
    both load the trained values (one was written over the other)."""
    exir = pytest.importorskip("executorch.exir")
    from torch.export.experimental import _export_forward_backward

    torch.manual_seed(0)
    module = _TwoNorms()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g))
               for _ in range(3)]  # fmt: skip
    joint = _export_forward_backward(torch.export.export(module, batches[0], strict=True))
    prog = exir.to_edge(joint).to_executorch(
        exir.ExecutorchBackendConfig(external_mutable_weights=True)
    )
    (blob,) = prog._tensor_data.values()
    pte, ptd = tmp_path / "m.pte", tmp_path / "m.ptd"
    pte.write_bytes(bytes(prog.buffer))
    ptd.write_bytes(bytes(blob))
    from ptexec.format.ptd import read_ptd

    entries = read_ptd(ptd.read_bytes()).entries
    assert entries["ln1.weight"].offset == entries["ln2.weight"].offset  # stored once
    tm = T.load(pte, ptd)
    opt = torch.optim.SGD(tm.parameters(), lr=0.5)
    for s in range(5):
        opt.zero_grad()
        tm.forward_backward("forward", batches[s % 3])
        opt.step()
    trained = tm.state_dict()
    assert not torch.equal(trained["ln1.weight"], trained["ln2.weight"])
    want = tm.forward_backward("forward", batches[0])[0]
    tm.save_ptd(tmp_path / "trained.ptd")
    again = T.load(pte, tmp_path / "trained.ptd")
    for k, v in again.state_dict().items():
        assert torch.equal(v, trained[k]), k
    torch.testing.assert_close(again.forward_backward("forward", batches[0])[0], want,
                               rtol=0, atol=0)  # fmt: skip
    pl = pytest.importorskip("executorch.extension.pybindings.portable_lib")
    et = pl._load_for_executorch(str(pte), str(tmp_path / "trained.ptd"))
    torch.testing.assert_close(et.forward(batches[0])[0], want, rtol=1e-5, atol=1e-6)
    # the same layout in the program itself: new entries in its mutable data
    joint = _export_forward_backward(torch.export.export(module, batches[0], strict=True))
    inner = tmp_path / "inner.pte"
    inner.write_bytes(bytes(exir.to_edge(joint).to_executorch().buffer))
    tm = T.load(inner)
    tm.load_state_dict(trained)
    tm.save_pte(tmp_path / "trained.pte")
    again = T.load(tmp_path / "trained.pte")
    for k, v in again.state_dict().items():
        assert torch.equal(v, trained[k]), k
    torch.testing.assert_close(again.forward_backward("forward", batches[0])[0], want,
                               rtol=0, atol=0)  # fmt: skip
    et = pl._load_for_executorch(str(tmp_path / "trained.pte"))
    torch.testing.assert_close(et.forward(batches[0])[0], want, rtol=1e-5, atol=1e-6)


class _Head(torch.nn.Module):
    def __init__(self, loss: str) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        torch.nn.init.zeros_(self.fc.bias)  # (both methods' biases start equal: one entry)
        self.loss = loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        out = self.fc(x)
        if self.loss == "ce":
            return (torch.nn.functional.cross_entropy(out, y),)
        return (torch.nn.functional.mse_loss(out, y),)


def test_a_method_not_loaded_is_saved_by_the_one_rule(tmp_path: Path) -> None:
    """Two methods whose biases the exporter stored in one entry (equal starting values:
    one parameter by the one rule); only the first is loaded and trained: saving takes
    the trained bias for both, as it does when both are loaded (what the file holds does
    not depend on which methods were loaded), and the second's weight, which the file
    starts apart, keeps its own value."""
    exir = pytest.importorskip("executorch.exir")
    from torch.export.experimental import _export_forward_backward

    g = torch.Generator().manual_seed(3)
    x, y, t = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g), torch.randn(5, 3, generator=g)  # fmt: skip
    torch.manual_seed(0)
    first, second = _Head("ce"), _Head("mse")
    joint = {
        "forward": _export_forward_backward(torch.export.export(first, (x, y), strict=True)),
        "second": _export_forward_backward(torch.export.export(second, (x, t), strict=True)),
    }
    path = tmp_path / "two.pte"
    path.write_bytes(bytes(exir.to_edge(joint).to_executorch().buffer))
    tm = T.load(path)  # ("second" is not loaded: none of its values is saved)
    opt = torch.optim.SGD(tm.parameters("forward"), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        tm.forward_backward("forward", (x, y))
        opt.step()
    trained = tm.state_dict()
    assert trained["fc.bias"].abs().max() > 0
    tm.save_pte(tmp_path / "trained.pte")
    again = T.load(tmp_path / "trained.pte")
    for k, v in again.state_dict("forward").items():
        assert torch.equal(v, trained[k]), k
    untouched = T.load(path).state_dict("second")
    assert torch.equal(again.state_dict("second")["fc.weight"], untouched["fc.weight"])
    assert torch.equal(again.state_dict("second")["fc.bias"], trained["fc.bias"])
    both = T.load(path)
    both.method("second")  # loaded first: the same file
    opt = torch.optim.SGD(both.parameters("forward"), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        both.forward_backward("forward", (x, y))
        opt.step()
    assert both.pte_bytes() == tm.pte_bytes()


def test_copies_of_a_name_the_file_starts_apart_are_saved_apart(tmp_path: Path) -> None:
    """Two methods of two modules whose weights share a name but not a value: loading the
    untrained one (its ``named_parameters``) made saving write the trained method's weight
    over its own; copies the file starts from different values are different parameters,
    each saved from its own method (equal starting values, the zero biases, cannot be told
    from one shared parameter: the trained copy is saved for both)."""
    exir = pytest.importorskip("executorch.exir")
    from torch.export.experimental import _export_forward_backward

    g = torch.Generator().manual_seed(3)
    x, y, t = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g), torch.randn(5, 3, generator=g)  # fmt: skip
    torch.manual_seed(0)
    first, second = _Head("ce"), _Head("mse")
    assert not torch.equal(first.fc.weight, second.fc.weight)
    joint = {
        "forward": _export_forward_backward(torch.export.export(first, (x, y), strict=True)),
        "second": _export_forward_backward(torch.export.export(second, (x, t), strict=True)),
    }
    path = tmp_path / "two.pte"
    path.write_bytes(bytes(exir.to_edge(joint).to_executorch().buffer))
    tm = T.load(path)
    own = {k: v.detach().clone() for k, v in tm.named_parameters("second").items()}
    opt = torch.optim.SGD(tm.parameters("forward"), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        tm.forward_backward("forward", (x, y))
        opt.step()
    trained = tm.state_dict("forward")
    tm.save_pte(tmp_path / "trained.pte")
    again = T.load(tmp_path / "trained.pte")
    assert torch.equal(again.state_dict("forward")["fc.weight"], trained["fc.weight"])
    assert torch.equal(again.state_dict("second")["fc.weight"], own["fc.weight"])
    assert torch.equal(again.state_dict("second")["fc.bias"], trained["fc.bias"])
    with pytest.raises(StateError, match="different parameters of one name"):
        tm.state_dict()
