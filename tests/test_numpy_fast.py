"""numpy arrays through the fast call: an array that is plainly what a CPU tensor input
takes (exactly ``np.ndarray``, the input's dtype in native byte order, C-contiguous,
aligned, writable where the program writes it) is the fast call's as torch's view of it
is; every other array takes the general path, which judges it as before. Values are
checked against eager PyTorch on the same data, refusals against the general path's
(a method loaded with ``fast_path=False``), and writes into the caller's memory against
eager's writes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptexec
from export_util import export_program
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec.engine import arguments

SHAPE = (1, 3, 4)  # an axis of one element: its stride is never stepped


class _Two(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * y + 1.0, x - y


class _Mutates(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return x + 1.0


@pytest.fixture(scope="module", params=["planned", "unplanned"])
def two(request: pytest.FixtureRequest) -> bytes:
    example = (torch.randn(SHAPE), torch.randn(SHAPE))
    return export_program(_Two(), example, unplanned=request.param == "unplanned")


@pytest.fixture(scope="module", params=["planned", "unplanned"])
def mutates(request: pytest.FixtureRequest) -> bytes:
    return export_program(_Mutates(), (torch.randn(SHAPE),), unplanned=request.param == "unplanned")


@pytest.fixture
def general_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the calls that took the general path."""
    taken: list[int] = []
    check = arguments.check_inputs

    def counted(*args: Any, **kwargs: Any) -> Any:
        taken.append(1)
        return check(*args, **kwargs)

    monkeypatch.setattr(arguments, "check_inputs", counted)
    yield taken


def _data(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def _unaligned(a: np.ndarray) -> np.ndarray:
    raw = np.empty(a.nbytes + 1, np.uint8)[1:]
    b = raw.view(a.dtype).reshape(a.shape)
    b[...] = a
    assert not b.flags.aligned
    return b


def _read_only(a: np.ndarray) -> np.ndarray:
    b = np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)
    assert not b.flags.writeable
    return b


def _odd_stride_on_one(a: np.ndarray) -> np.ndarray:
    # a stride of 7 bytes on the axis of one element: numpy calls it C-contiguous
    b = np.lib.stride_tricks.as_strided(a.copy(), strides=(7, *a.strides[1:]))
    assert b.flags.c_contiguous
    return b


def _memmap(tmp_path: Path, mode: str) -> Callable[[np.ndarray], np.ndarray]:
    def make(a: np.ndarray) -> np.ndarray:
        path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.bin"
        a.tofile(path)
        return np.memmap(path, dtype=a.dtype, mode=mode, shape=a.shape)

    return make


def _arrays(tmp_path: Path) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Each way of handing the values of ``a`` (float32, SHAPE) over as a numpy array."""
    return {
        "plain": lambda a: a.copy(),
        "read-only": _read_only,
        "float64": lambda a: a.astype(np.float64),
        "longdouble": lambda a: a.astype(np.longdouble),
        "big-endian": lambda a: a.astype(np.dtype(np.float32).newbyteorder(">")),
        "f-order": lambda a: np.asfortranarray(a),
        "gapped": lambda a: np.repeat(a, 2, axis=2)[:, :, ::2],
        "negative-strides": lambda a: np.flip(np.flip(a, 2).copy(), 2),
        "negative-stride-on-one": lambda a: np.flip(a.copy(), 0),
        "odd-stride-on-one": _odd_stride_on_one,
        "zero-strides": lambda a: np.broadcast_to(a[:, :1, :], SHAPE),
        "unaligned": _unaligned,
        "memmap": _memmap(tmp_path, "w+"),
        "memmap-read-only": _memmap(tmp_path, "r"),
        "wrong-shape": lambda a: a.reshape(3, 4).copy(),
        "0-d": lambda a: np.array(a[0, 0, 0]),
        "scalar": lambda a: np.float32(a[0, 0, 0]),
    }


# the arrays the fast call takes (the others are the general path's)
FAST = {"plain", "read-only"}


def _outcome(m: ptexec.Method, given: list[Any]) -> tuple[Any, ...]:
    """What a call gives: its outputs and record, or its error's type and message."""
    try:
        out = m.execute(given)
    except Exception as e:
        return ("error", type(e), str(e))
    return ("ok", [t.clone() for t in out], list(m.last_call.inputs), m.last_call.h2h)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert a[1:] == b[1:]
        return
    assert len(a[1]) == len(b[1])
    for x, y in zip(a[1], b[1], strict=True):
        assert torch.equal(x, y)
    assert a[2:] == b[2:]


@pytest.mark.parametrize("how", sorted(_arrays(Path())))
def test_each_array_is_taken_as_the_general_path_takes_it(
    two: bytes, how: str, tmp_path: Path, general_calls: list[int]
) -> None:
    program = ptexec.load(two)
    fast = program.load_method()
    general = program.load_method(fast_path=False)
    make = _arrays(tmp_path)[how]
    for seed in range(3):  # repeated calls, each on data of its own
        a, y = _data(seed), _data(100 + seed)
        given = make(a)
        got = _outcome(fast, [given, y])
        _same(got, _outcome(general, [make(a), y]))
        if got[0] == "ok":  # eager on the same values
            x = torch.tensor(np.array(given, dtype=np.float32))
            want = _Two()(x.expand(SHAPE), torch.from_numpy(y))
            for g, w in zip(got[1], want, strict=True):
                torch.testing.assert_close(g, w, rtol=0, atol=0)
        # a numpy call after it (refused or not) takes the fast call and is right
        del general_calls[:]
        b = _data(200 + seed)
        out = fast.execute([b, y])
        assert not general_calls
        torch.testing.assert_close(out[0], torch.from_numpy(b * y + 1.0), rtol=0, atol=0)
        torch.testing.assert_close(out[1], torch.from_numpy(b - y), rtol=0, atol=0)
    del general_calls[:]
    _outcome(fast, [make(_data(9)), _data(10)])
    assert bool(general_calls) is (how not in FAST)


@pytest.mark.parametrize("how", sorted(_arrays(Path())))
def test_a_program_that_writes_its_input_writes_the_callers_array_as_eager(
    mutates: bytes, how: str, tmp_path: Path, general_calls: list[int]
) -> None:
    """An unplanned input the program writes is the caller's array, written as eager
    writes it (a read-only one is refused before anything is written); a planned one is
    a copy, on both paths. The fast call takes a writable plain array alone."""
    program = ptexec.load(mutates)
    fast = program.load_method()
    general = program.load_method(fast_path=False)
    unplanned = fast.state.inputs[0].view is None
    assert fast.state.inputs[0].written
    make = _arrays(tmp_path)[how]
    for seed in range(3):
        a = _data(seed)
        mine, theirs = make(a), make(a)
        before = np.array(mine, dtype=np.float32)
        del general_calls[:]
        got = _outcome(fast, [mine])
        took_general = bool(general_calls)
        _same(got, _outcome(general, [theirs]))
        assert np.array_equal(np.asarray(mine), np.asarray(theirs))  # the same writes
        if got[0] == "ok":
            x = torch.tensor(before).expand(SHAPE).clone()
            want = _Mutates()(x)
            torch.testing.assert_close(got[1][-1], want, rtol=0, atol=0)
            if unplanned:  # the caller's array took the write, as eager's tensor did
                assert np.array_equal(np.asarray(mine), x.numpy())
        assert took_general is (how != "plain")
        # the method still works, on the fast call
        b = _data(50 + seed)
        del general_calls[:]
        out = fast.execute([b])[-1]
        assert not general_calls
        torch.testing.assert_close(out, torch.from_numpy(_data(50 + seed) * 2 + 1))
        if unplanned:
            assert np.array_equal(b, _data(50 + seed) * 2)


@pytest.mark.parametrize("name", ["mlp", "mlp_unplanned", "int_ops", "int_ops_unplanned"])
def test_fixtures_with_numpy_and_torch_inputs_alternating(
    name: str, general_calls: list[int]
) -> None:
    program = ptexec.load(fixture_paths(name)[0])
    m = program.load_method()
    m_view = program.load_method(outputs="view")
    again = ptexec.load(fixture_paths(name)[0]).load_method()  # the kept fast call's text
    rtol, atol = tolerance(name)
    for call in fixture_calls(name) * 2:
        xs = call["inputs"]
        arrays = [x.numpy().copy() for x in xs]
        for method, given, options in (
            (m, arrays, {}),
            (m, xs, {}),
            (m, arrays, {"outputs": "view"}),  # the other mode's fast call
            (m_view, arrays, {}),
            (again, arrays, {}),
        ):
            del general_calls[:]
            got = method.execute(given, **options)
            assert not general_calls
            assert compare_outputs(got, call["outputs"], rtol, atol) is None
            general = program.load_method(fast_path=False)
            general.execute(given)
            assert method.last_call.inputs == general.last_call.inputs
            assert method.last_call.h2h == general.last_call.h2h
        # a refused array, then the method works on the fast call again
        wrong = [a.astype(np.float64) if a.dtype == np.float32 else a for a in arrays]
        with pytest.raises(ptexec.InputError, match="float64"):
            m.execute(wrong)
        del general_calls[:]
        assert compare_outputs(m.execute(arrays), call["outputs"], rtol, atol) is None
        assert not general_calls


def test_numpy_scalars_and_0d_arrays_for_a_0d_input(general_calls: list[int]) -> None:
    """int_ops' k is int64[]: a 0-d array takes the fast call, numpy's scalar
    (``np.int64(k)``) the general path, which reads it as a 0-d array; both as eager."""
    m = ptexec.load(fixture_paths("int_ops")[0]).load_method()
    call = fixture_calls("int_ops")[0]
    ids, x, k = (t.numpy().copy() for t in call["inputs"])
    for given, general in (([ids, x, np.array(k)], False), ([ids, x, np.int64(k)], True)):
        del general_calls[:]
        got = m.execute(given)
        assert bool(general_calls) is general
        assert compare_outputs(got, call["outputs"], *tolerance("int_ops")) is None


def test_traces_and_profiles_see_numpy_inputs_as_calls_do() -> None:
    m = ptexec.load(fixture_paths("mlp_unplanned")[0]).load_method()
    call = fixture_calls("mlp_unplanned")[0]
    a = call["inputs"][0].numpy().copy()
    traced = m.trace([a])
    assert traced.outputs is not None
    assert compare_outputs(traced.outputs, call["outputs"], *tolerance("mlp_unplanned")) is None
    profiled = m.profile([a], repeat=2, warmup=0)
    assert compare_outputs(profiled.outputs, call["outputs"], *tolerance("mlp_unplanned")) is None
    assert compare_outputs(m.execute([a]), call["outputs"], *tolerance("mlp_unplanned")) is None
