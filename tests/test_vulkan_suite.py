"""ExecuTorch's backend operator test suite, ``vulkan`` flows, run on ptexec (tests/vulkan_suite.py).

The default run lowers a small sample (a few ops, both flows); the whole suite (every case
of every operator test, both flows, against eager PyTorch: >= 99% of the Vulkan-lowered
cases must match) is marked slow, and is also ``python scripts/vulkan_suite.py``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.backends.vulkan.partitioner.vulkan_partitioner")

import vulkan_suite as vs

SAMPLE = [
    ("test_add", "test_add_f32_bcast_first", "vulkan"),
    ("test_linear", "test_linear_unbatched", "vulkan_static_int8_per_channel"),
    ("test_relu", "test_relu_f32_multi_dim", "vulkan"),
]


def _case(module: str, name: str) -> vs.Case:
    found = [c for c in vs.discover(module) if c.name == name]
    if not found:
        pytest.skip(f"{module}::{name} is not in this ExecuTorch's suite")
    return found[0]


@pytest.mark.parametrize(("module", "name", "flow"), SAMPLE)
def test_sample_case_matches_eager(module: str, name: str, flow: str) -> None:
    results = vs.run_case(_case(module, name), flow)
    assert results
    for r in results:
        assert r.status == "match", f"{r.case} ({r.flow}): {r.status} {r.detail}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("module", "name", "flow"), SAMPLE)
def test_sample_case_matches_eager_on_cuda(module: str, name: str, flow: str) -> None:
    """The same cases with the program's tensors on the GPU: the payload runs there."""
    results = vs.run_case(_case(module, name), flow, device="cuda")
    assert results
    for r in results:
        assert r.status == "match", f"{r.case} ({r.flow}, cuda): {r.status} {r.detail}"


@pytest.mark.slow
def test_whole_suite(request: pytest.FixtureRequest) -> None:
    from compile_util import skip_slow_unless_asked

    skip_slow_unless_asked(request)  # exports every case of the suite: run with -m slow
    results = list(vs.run_all())
    low = vs.lowered(results)
    assert low
    bad = [r for r in low if r.status != "match"]
    assert len(bad) <= 0.01 * len(low), "\n".join(f"{r.case} {r.flow}: {r.detail}" for r in bad)
