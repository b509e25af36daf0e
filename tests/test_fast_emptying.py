"""The fast call empties a kernel's dynamic-shape ``out`` only when its sizes may change.

Torch resizes an ``out`` of other sizes with a warning unless it is empty, so the
statements of dynamic-shape outs empty them first. When every tensor the instructions
write gets sizes that follow from the inputs' sizes alone, and the inputs have the sizes
of the last run that completed, every out already has its sizes and the fast call skips
the emptying (``if _e:``). Here the results must equal eager PyTorch's on every call,
whatever ran before (other batch sizes, the general path, a failed call), with torch's
resize warning an error; and programs where sizes may follow from something else keep
emptying on every call.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import ptexec
from export_util import export_program
from ptexec.errors import PtexecError


@pytest.fixture(autouse=True)
def _warnings_are_errors() -> Iterator[None]:
    with warnings.catch_warnings():
        # torch's warning for an out of other sizes, resized
        warnings.filterwarnings("error", message=".*resized")
        yield


class Tokens(torch.nn.Module):
    """Embedding rows (a dynamic number of ids), then a linear layer and relu."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(10, 8)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(self.emb(ids)))


def _tokens() -> tuple[Tokens, ptexec.Method]:
    module = Tokens().eval()
    n = torch.export.Dim("n", min=1, max=16)
    data = export_program(module, (torch.arange(4),), dynamic_shapes={"ids": {0: n}})
    return module, ptexec.load(data).load_method("forward")


def _empties_when_sizes_change(source: str) -> bool:
    """The fast call empties outs only under ``_e``: in its statements, or in the native
    steps it hands ``_e``."""
    return "if _e: v[" in source or ".run(_e)" in source


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 10, (n,), generator=torch.Generator().manual_seed(seed))


def test_the_fast_call_empties_only_when_sizes_change() -> None:
    module, m = _tokens()
    assert _empties_when_sizes_change(m.source())
    # the load-time sizes first, repeats, growth, shrinkage, each on the fast path
    for k, n in enumerate([16, 16, 3, 3, 3, 7, 1, 1, 16, 2, 2]):
        ids = _ids(n, k)
        (got,) = m.execute([ids])
        with torch.no_grad():
            want = module(ids)
        assert got.shape == want.shape == (n, 4)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_other_paths_between_fast_calls() -> None:
    module, m = _tokens()
    calls = [
        (3, "fast"),
        (5, "general"),  # the general path leaves sizes of 5
        (3, "fast"),
        (5, "general"),
        (5, "fast"),  # sizes as the general path left them
        (6, "fail"),  # resized, then restored to the load-time sizes
        (6, "fast"),
        (6, "fail"),
        (16, "fast"),  # the load-time sizes
        (4, "fast"),
        (4, "view"),
        (4, "fast"),
    ]
    for k, (n, how) in enumerate(calls):
        ids = _ids(n, 100 + k)
        if how == "fail":
            bad = ids.clone()
            bad[-1] = 99  # no such row: the embedding fails after the input is bound
            with pytest.raises(PtexecError):
                m.execute([bad])
            continue
        if how == "fast":
            (got,) = m.execute([ids])
        elif how == "view":
            (got,) = m.execute([ids], outputs="view")
            got = got.clone()
        else:
            (got,) = m.execute((ids,), out=[torch.empty(n, 4)])  # out=: the general path
        with torch.no_grad():
            want = module(ids)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


class Widened(torch.nn.Module):
    """A dtype cast of a dynamic-shape tensor (a copy that sizes its out itself), then a
    linear layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.to(torch.float32))


def test_a_copy_that_sizes_its_out() -> None:
    module = Widened().eval()
    b = torch.export.Dim("b", min=1, max=8)
    data = export_program(
        module, (torch.ones(4, 3, dtype=torch.int32),), dynamic_shapes={"x": {0: b}}
    )
    # the output (the linear's) copied out of planned memory: emptied when its sizes
    # change; handed over as a new tensor: nothing to empty
    viewed = ptexec.load(data).load_method("forward", outputs="view")
    assert _empties_when_sizes_change(viewed.source())
    m = ptexec.load(data).load_method("forward")
    # (the fallback's, or its native step's)
    assert "_e = " not in m.source() and ("resize_(0)" in m.source() or ".run(True)" in m.source())
    for k, n in enumerate([2, 2, 5, 8, 8, 1, 1]):
        g = torch.Generator().manual_seed(k)
        x = torch.randint(-5, 5, (n, 3), dtype=torch.int32, generator=g)
        (got,) = m.execute([x])
        (seen,) = viewed.execute([x])
        with torch.no_grad():
            torch.testing.assert_close(got, module(x), rtol=0, atol=1e-6)
            torch.testing.assert_close(seen, module(x), rtol=0, atol=1e-6)


class Positive(torch.nn.Module):
    """Sizes from the data: the positions of the positive elements, doubled."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x > 0) * 2


def test_sizes_from_the_data_keep_emptying() -> None:
    n = torch.export.Dim("n", min=1, max=8)
    data = export_program(Positive(), (torch.randn(6),), dynamic_shapes={"x": {0: n}})
    m = ptexec.load(data).load_method("forward")
    source = m.source()
    assert "if _e:" not in source and ".resize_(0)" in source
    # the same input sizes, other counts of positive elements
    for x in ([1.0, -1.0, 2.0], [1.0, 1.0, 2.0], [-1.0, -1.0, 2.0], [-1.0, -1.0, -2.0], [3.0]):
        t = torch.tensor(x)
        (got,) = m.execute([t])
        torch.testing.assert_close(got, torch.nonzero(t > 0) * 2, rtol=0, atol=0)


class Folded(torch.nn.Module):
    """Sizes computed from an input's sizes (``sym_size``, scalar ops, a view), then an
    elementwise op on the view."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.lin = torch.nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y.reshape(y.shape[0] * 2, 2) + 1.0


def test_sizes_computed_from_the_inputs_sizes() -> None:
    module = Folded().eval()
    b = torch.export.Dim("b", min=1, max=8)
    data = export_program(module, (torch.randn(4, 3),), dynamic_shapes={"x": {0: b}})
    m = ptexec.load(data).load_method("forward")
    source = m.source().split("# chain 0")[0]
    assert _empties_when_sizes_change(source) and "sym_size" in source
    for k, n in enumerate([2, 2, 5, 8, 8, 1, 3, 3]):
        x = torch.randn(n, 3, generator=torch.Generator().manual_seed(k))
        (got,) = m.execute([x])
        with torch.no_grad():
            torch.testing.assert_close(got, module(x), rtol=0, atol=1e-6)
