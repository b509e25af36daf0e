"""Shared test setup: make tests/ importable, CUDA marker handling."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _keep_torch_threads() -> Iterator[None]:
    """A test that sets torch's thread count (the CLI's ``--threads`` run in-process) does
    not change it for the tests after it."""
    n = torch.get_num_threads()
    yield
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def executorch_runtime():  # type: ignore[no-untyped-def]
    """ExecuTorch's Python runtime, or skip the test when it is not installed."""
    rt = pytest.importorskip("executorch.runtime")
    return rt.Runtime.get()
