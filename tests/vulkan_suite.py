"""ExecuTorch's backend operator test suite through its ``vulkan`` flows, run on ptexec.

The suite (``executorch/backends/test/suite/operators/``, in the installed wheel) is a set
of module-level test functions ``test_x(test_runner[, dtype, ...])`` that call
``test_runner.lower_and_run_model(model, inputs)``. :class:`CaseRunner` is that runner:
it lowers the model with the flow's exporter (``VulkanPartitioner``; the int8 flow first
quantizes with ``VulkanQuantizer``'s symmetric config, as the suite's Vulkan flow does),
runs the program with ptexec and compares every output with eager PyTorch (the quantized
flow: the quantized model run eagerly). ExecuTorch's own runtime cannot run these programs
(the wheel has no Vulkan backend), so eager PyTorch is the only reference.

A case is ``match``, ``mismatch`` (with the worst difference), ``ptexec_error`` (with the
error), ``not_lowered`` (nothing went to the Vulkan delegate) or ``export_error`` (the
exporter failed); the Vulkan-lowered cases are those that are neither of the last two.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import itertools
import pkgutil
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FLOWS = ("vulkan", "vulkan_static_int8_per_channel")
RTOL = {"vulkan": 1e-3, "vulkan_static_int8_per_channel": 1e-2}
ATOL = {"vulkan": 1e-3, "vulkan_static_int8_per_channel": 1e-2}


@dataclass
class Case:
    module: str
    name: str
    call: Callable[[Any], None]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        extra = ",".join(f"{k}={_show(v)}" for k, v in self.params.items())
        return f"{self.module}::{self.name}" + (f"[{extra}]" if extra else "")


def _show(v: Any) -> str:
    return str(v).removeprefix("torch.")


def discover(select: str | None = None) -> list[Case]:
    """Every case of the suite's operator tests, parametrizations expanded."""
    import executorch.backends.test.suite.operators as ops_pkg

    cases: list[Case] = []
    for info in sorted(pkgutil.iter_modules(ops_pkg.__path__), key=lambda i: i.name):
        if not info.name.startswith("test_"):
            continue
        if select and select not in info.name:
            continue
        mod = importlib.import_module(f"{ops_pkg.__name__}.{info.name}")
        for name in sorted(vars(mod)):
            fn = getattr(mod, name)
            if not name.startswith("test_") or not callable(fn):
                continue
            grids: list[list[tuple[str, Any]]] = []
            for mark in getattr(fn, "pytestmark", []):
                if mark.name != "parametrize":
                    continue
                names, values = mark.args[0], mark.args[1]
                names = [n.strip() for n in names.split(",")] if isinstance(names, str) else names
                rows = []
                for v in values:
                    v = getattr(v, "values", v)  # pytest.param
                    row = v if len(names) > 1 else (v,)
                    rows.append(list(zip(names, row, strict=True)))
                grids.append(rows)
            for combo in itertools.product(*grids) if grids else [()]:
                params = dict(kv for row in combo for kv in row)
                cases.append(Case(info.name, name, fn, params))
    return cases


@dataclass
class Result:
    case: str
    flow: str
    status: str
    detail: str = ""
    ops: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _flow(name: str) -> Any:
    from executorch.backends.test.suite.flows import vulkan as vf

    return vf.VULKAN_TEST_FLOW if name == "vulkan" else vf.VULKAN_STATIC_INT8_PER_CHANNEL_TEST_FLOW


def _quantize(model: torch.nn.Module, inputs: tuple[Any, ...]) -> torch.nn.Module:
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import (
        VulkanQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = VulkanQuantizer()
    quantizer.set_global(get_symmetric_quantization_config())
    graph = torch.export.export(model, inputs, strict=True).module()
    prepared = prepare_pt2e(graph, quantizer)  # type: ignore[arg-type]
    prepared(*inputs)
    return convert_pt2e(prepared)  # type: ignore[return-value]


def _cache_pattern_graphs() -> None:
    """Build the Vulkan backend's fusion pattern graphs (rotary embeddings and the like) once.

    The partitioner and the preprocessor export every pattern graph again on each call
    (most of a small case's lowering time); they only match against them, so the graphs of
    the first call serve every later one and the lowering is unchanged."""
    from executorch.backends.vulkan.patterns import fusable_patterns

    for entry in fusable_patterns.values():
        fn = entry.get_graphs_fn
        if fn is not None and not hasattr(fn, "cache_info"):
            entry.get_graphs_fn = functools.cache(fn)


def lower(model: torch.nn.Module, inputs: tuple[Any, ...], flow: str) -> tuple[bytes, Any]:
    """The program's bytes and the eager reference outputs for ``flow``."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    _cache_pattern_graphs()
    model = model.eval()
    if flow != "vulkan":
        model = _quantize(model, inputs)
    with torch.no_grad():
        reference = model(*[_clone(x) for x in inputs])
    exported = torch.export.export(model, inputs, strict=True)
    program = to_edge_transform_and_lower(exported, partitioner=[VulkanPartitioner()])
    return program.to_executorch().buffer, reference


def _clone(x: Any) -> Any:
    """A copy of ``x`` with every tensor in it cloned (inputs nest: a tuple of indices)."""
    return torch.utils._pytree.tree_map(
        lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x
    )


def _flat(x: Any) -> list[Any]:
    if isinstance(x, tuple | list):
        return [y for item in x for y in _flat(item)]
    return [x]


def compare(got: list[Any], want: Any, rtol: float, atol: float) -> str | None:
    """None when every output matches, else what differs."""
    want_flat = [w for w in _flat(want) if isinstance(w, torch.Tensor)]
    if len(got) != len(want_flat):
        return f"{len(got)} outputs, eager gives {len(want_flat)}"
    for i, (g, w) in enumerate(zip(got, want_flat, strict=True)):
        if tuple(g.shape) != tuple(w.shape):
            return f"output {i}: shape {list(g.shape)}, eager {list(w.shape)}"
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, eager {w.dtype}"
        if w.dtype.is_floating_point:
            gf, wf = g.double(), w.double()
            same_nan = torch.isnan(gf) == torch.isnan(wf)
            close = torch.isclose(gf, wf, rtol=rtol, atol=atol) | (
                torch.isnan(gf) & torch.isnan(wf)
            )
            if not bool(same_nan.all()) or not bool(close.all()):
                diff = (gf - wf).abs().nan_to_num(float("inf")).max().item()
                return f"output {i}: max |diff| {diff:.3g}"
        elif not torch.equal(g, w):
            return f"output {i}: {int((g != w).sum())} elements differ"
    return None


def _delegated_ops(data: bytes) -> list[str] | None:
    """Op names of the program's Vulkan delegates (None: it has none)."""
    import ptexec
    from ptexec.delegates import describe_payload

    with tempfile.NamedTemporaryFile(suffix=".pte") as f:
        f.write(data)
        f.flush()
        prog = ptexec.load(f.name)
        found: list[str] | None = None
        for plan in prog.pte.program.execution_plan:
            for d in plan.delegates:
                if d.id == "VulkanBackend":
                    counts = describe_payload(d.id, prog.pte.delegate_data(d.processed)) or {}
                    found = sorted(set(found or []) | set(counts))
        return found


def run_program(data: bytes, inputs: tuple[Any, ...], device: str = "cpu") -> list[Any]:
    import ptexec

    with tempfile.NamedTemporaryFile(suffix=".pte") as f:
        f.write(data)
        f.flush()
        device_map = None if device == "cpu" else device
        method = ptexec.load(f.name).load_method("forward", device_map=device_map)
        # the program takes the inputs flattened, as ExecuTorch's runtime does
        leaves = torch.utils._pytree.tree_leaves(inputs)
        args = [x.to(device) if isinstance(x, torch.Tensor) else x for x in leaves]
        out = method(*args)
        want = torch.device(device).type
        for o in out:
            if isinstance(o, torch.Tensor) and o.device.type != want:
                raise RuntimeError(f"an output is on {o.device}, not {device}")
        return [o.cpu() if isinstance(o, torch.Tensor) else o for o in out]


class CaseRunner:
    """The suite's ``test_runner``: lowers, runs on ptexec, compares; results in ``results``."""

    def __init__(self, flow: str, case: str, device: str = "cpu") -> None:
        self._flow = _flow(flow)
        self.flow = flow
        self.case = case
        self.device = device
        self.results: list[Result] = []

    def lower_and_run_model(
        self,
        model: torch.nn.Module,
        inputs: tuple[Any, ...],
        generate_random_test_inputs: bool = True,
        dynamic_shapes: Any = None,
        **_: Any,
    ) -> None:
        name = self.case + (f"#{len(self.results)}" if self.results else "")
        start = time.perf_counter()
        torch.manual_seed(0)
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                data, reference = lower(model, tuple(inputs), self.flow)
        except Exception as e:  # the exporter's failure: not a Vulkan-lowered case
            self.results.append(Result(name, self.flow, "export_error", _line(e)))
            return
        ops = _delegated_ops(data)
        if ops is None:
            self.results.append(Result(name, self.flow, "not_lowered"))
            return
        try:
            got = run_program(data, tuple(_clone(x) for x in inputs), self.device)
        except Exception as e:
            self.results.append(
                Result(name, self.flow, "ptexec_error", f"{type(e).__name__}: {_line(e)}", ops)
            )
            return
        problem = compare(got, reference, RTOL[self.flow], ATOL[self.flow])
        self.results.append(
            Result(
                name,
                self.flow,
                "match" if problem is None else "mismatch",
                problem or "",
                ops,
                time.perf_counter() - start,
            )
        )


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


def run_case(case: Case, flow: str, device: str = "cpu") -> list[Result]:
    import unittest

    runner = CaseRunner(flow, case.id, device)
    try:
        case.call(runner, **case.params)
    except unittest.SkipTest as e:
        runner.results.append(Result(case.id, flow, "skipped", _line(e)))
    except Exception as e:
        if not runner.results:
            runner.results.append(Result(case.id, flow, "export_error", _line(e)))
    return runner.results


def run_all(
    flows: tuple[str, ...] = FLOWS,
    select: str | None = None,
    device: str = "cpu",
    seed: int | None = None,
    done: frozenset[tuple[str, str]] = frozenset(),
) -> Iterator[Result]:
    """Every case, round-robin over the test modules (each module's first case, then each
    one's second, ...), so that a run cut short has covered the most ops. With ``seed``,
    each module's cases are shuffled first (a run cut short is then a seeded random sample
    stratified by module). ``(case id, flow)`` pairs in ``done`` are skipped (a resumed run)."""
    by_module: dict[str, list[Case]] = {}
    for case in discover(select):
        by_module.setdefault(case.module, []).append(case)
    if seed is not None:
        rng = random.Random(seed)
        for cases in by_module.values():
            rng.shuffle(cases)
    for row in itertools.zip_longest(*by_module.values()):
        for case in row:
            if case is None:
                continue
            for flow in flows:
                if (case.id, flow) not in done:
                    yield from run_case(case, flow, device)


def case_of(result: Result) -> str:
    """The suite case a result belongs to (a case lowering several models gives ``id#n``)."""
    return result.case.split("#", 1)[0]


def summary(results: list[Result]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts


def lowered(results: list[Result]) -> list[Result]:
    return [r for r in results if r.status in ("match", "mismatch", "ptexec_error")]


REPO = Path(__file__).resolve().parent.parent
