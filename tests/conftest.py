"""Shared test setup: make tests/ importable, CUDA marker handling, no generated code kept
on disk unless a test asks (``PTEXEC_CODE_CACHE=1 python -m pytest`` runs every test with
the code store on, in the cache roots the tests choose)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# loads in tests (and the processes they start) keep no generated code in the user's cache
# or in the cache roots tests inspect; tests/test_codestore.py turns the store on
os.environ.setdefault("PTEXEC_CODE_CACHE", "0")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The native steps (:mod:`ptexec.native`) are built before the tests (once,
    into the cache root), so that every test's methods use them as users' methods do;
    ``PTEXEC_NATIVE_STEPS=0 python -m pytest`` runs every test without them."""
    from ptexec import native

    native.wait()


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
