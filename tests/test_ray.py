"""Batch inference over datasets (ptexec.ray).

The first part runs :class:`PteMapper` in this process, as each Ray actor does, and checks
every mapping rule against eager PyTorch (the fixtures' recorded outputs) and against
ptexec called row by row. The tests marked ``ray`` run the same on a local Ray cluster
(``ray.init(num_cpus=2)``); they skip when Ray is not installed (``pip install
'.[ray]'`` in ptexec's source tree).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec.device import CPU, Device, DeviceType
from ptexec.errors import (
    ColumnError,
    DeviceUnavailableError,
    ExecutionError,
    InputError,
    RowError,
    StatefulMethodError,
)
from ptexec.ray import PteMapper, assigned_device, choose_device_map, state_tensors


def pte(name: str) -> str:
    return str(fixture_paths(name)[0])


def rows_of(name: str, arg: int = 0) -> np.ndarray:
    """The fixture's recorded inputs ``arg``, all calls' rows stacked (a numpy column)."""
    return torch.cat([c["inputs"][arg] for c in fixture_calls(name)]).numpy()


def eager(name: str, out: int = 0) -> np.ndarray:
    """Eager PyTorch's recorded output ``out`` for those rows."""
    return torch.cat([c["outputs"][out] for c in fixture_calls(name)]).numpy()


def assert_rows_close(got: np.ndarray, want: np.ndarray, name: str) -> None:
    rtol, atol = tolerance(name)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def single_process(name: str, rows: np.ndarray, per_call: int) -> np.ndarray:
    """ptexec called on each row alone, the row repeated to fill ``per_call`` rows."""
    method = ptexec.load(pte(name)).load_method()
    outs = []
    for row in rows:
        x = torch.from_numpy(np.repeat(row[None], per_call, axis=0))
        outs.append(method.execute([x])[0][0].numpy())
    return np.stack(outs)


# ------------------------------------------------------------------------------------------
# batch sizes the program takes


def test_static_batch_splits_pads_and_trims() -> None:
    x = rows_of("mlp")  # 6 rows recorded in calls of 2
    mapper = PteMapper(pte("mlp"), inputs=["x"], outputs=["y"])
    out = mapper({"x": x, "label": np.arange(6)})
    assert_rows_close(out["y"], eager("mlp"), "mlp")
    np.testing.assert_array_equal(out["label"], np.arange(6))  # batch columns are kept
    odd = np.random.default_rng(0).standard_normal((7, 8)).astype(np.float32)
    got = mapper({"x": odd})["y"]
    np.testing.assert_allclose(got, single_process("mlp", odd, 2), rtol=1e-6, atol=1e-7)
    s = mapper.stats
    assert (s.batches, s.rows, s.calls, s.padded_rows, s.failed_rows) == (2, 13, 7, 1, 0)


def test_bounded_dynamic_batch_used_up_to_its_bound() -> None:
    x = rows_of("dynamic_mlp")  # 23 rows: calls of up to 16, the last one unpadded
    mapper = PteMapper(pte("dynamic_mlp"), inputs=["x"], outputs=["y"])
    assert_rows_close(mapper({"x": x})["y"], eager("dynamic_mlp"), "dynamic_mlp")
    assert (mapper.stats.calls, mapper.stats.padded_rows) == (2, 0)
    padded = PteMapper(pte("dynamic_mlp"), inputs=["x"], outputs=["y"], pad="always")
    assert_rows_close(padded({"x": x})["y"], eager("dynamic_mlp"), "dynamic_mlp")
    assert (padded.stats.calls, padded.stats.padded_rows) == (2, 9)


def test_one_call_per_row_when_rows_have_the_inputs_shape() -> None:
    x = np.stack([c["inputs"][0].numpy() for c in fixture_calls("mlp")])  # 3 rows of [2, 8]
    mapper = PteMapper(pte("mlp"), inputs=["x"], outputs=["y"])
    out = mapper({"x": x})["y"]
    want = np.stack([c["outputs"][0].numpy() for c in fixture_calls("mlp")])
    assert out.shape == (3, 2, 4)
    assert_rows_close(out, want, "mlp")
    assert mapper.stats.calls == 3


def test_several_outputs_constants_and_integer_columns() -> None:
    calls = fixture_calls("int_ops")
    ids = rows_of("int_ops", 0).astype(np.int32)  # cast to int64 ("same_kind")
    x = rows_of("int_ops", 1)
    names = [f"o{k}" for k in range(len(calls[0]["outputs"]))]
    mapper = PteMapper(pte("int_ops"), inputs=["ids", "x", 3], outputs=names)
    out = mapper({"ids": ids, "x": x})
    for k, name in enumerate(names):
        want = torch.cat([c["outputs"][k] for c in calls])
        problem = compare_outputs([torch.from_numpy(out[name])], [want], *tolerance("int_ops"))
        assert problem is None, f"{name}: {problem}"
    dropped = PteMapper(pte("int_ops"), inputs=["ids", "x", 3], outputs=["a", *[None] * 8])
    assert set(dropped({"ids": ids, "x": x})) == {"ids", "x", "a"}


def test_scalar_columns_and_rows_of_varying_shapes() -> None:
    calls = fixture_calls("scalar_io")  # x: [rows<=8, 3] with rows 2, 5, 8; alpha, n, flag
    xs = np.empty(len(calls), dtype=object)
    xs[:] = [c["inputs"][0].numpy() for c in calls]
    batch = {
        "x": xs,
        "alpha": np.array([c["inputs"][1] for c in calls]),
        "n": np.array([c["inputs"][2] for c in calls]),
        "flag": np.array([c["inputs"][3] for c in calls]),
    }
    names = ["y", "rows", "m", "none", "a2", "f", "half"]
    out = PteMapper(pte("scalar_io"), inputs=list(batch), outputs=names)(batch)
    rtol, atol = tolerance("scalar_io")
    for i, call in enumerate(calls):
        np.testing.assert_allclose(out["y"][i], call["outputs"][0].numpy(), rtol=rtol, atol=atol)
        got = [out[k][i] for k in names[1:]]
        assert got == call["outputs"][1:]


def test_scalar_constants_batch_rows_and_scalar_outputs_need_one_call_per_row() -> None:
    """scalar_io with its scalars given as constants: rows of x batch (<= 8 per call);
    its scalar outputs cannot be columns then, unless dropped."""
    calls = fixture_calls("scalar_io")
    x = rows_of("scalar_io")  # 2 + 5 + 8 rows of 3
    consts = ["x", 0.5, 3, True]
    mapper = PteMapper(pte("scalar_io"), inputs=consts, outputs=["y", *[None] * 6])
    want = np.concatenate([c["outputs"][0].numpy() for c in calls])
    assert_rows_close(mapper({"x": x})["y"], want, "scalar_io")
    assert mapper.stats.calls == 2  # 8 + 7 rows
    keeps = PteMapper(pte("scalar_io"), inputs=consts, outputs=["y", "rows", *[None] * 5])
    with pytest.raises(ColumnError, match=r"output 1 .*'rows'.* the int 8 for a call of 8 rows"):
        keeps({"x": x})


class RowCumsum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * 2).cumsum(1), x.sum(1)


def test_rows_of_varying_shapes_batched_in_groups_of_one_shape() -> None:
    """A program with a dynamic batch and a dynamic row length: rows of one length go
    through together, outputs come back in row order (a column of arrays where lengths
    vary)."""
    from export_util import export_program

    dims = {"x": {0: torch.export.Dim("b", min=1, max=4), 1: torch.export.Dim("s", min=2, max=9)}}
    data = export_program(RowCumsum(), (torch.randn(3, 5),), dynamic_shapes=dims)
    rng = np.random.default_rng(7)
    lengths = [3, 5, 3, 7, 5, 3, 3, 3, 3, 2, 9, 5]
    col = np.empty(len(lengths), dtype=object)
    col[:] = [rng.standard_normal(k).astype(np.float32) for k in lengths]
    mapper = PteMapper(data, inputs=["x"], outputs=["cumsum", "total"])
    out = mapper({"x": col})
    assert out["cumsum"].dtype == object and out["total"].shape == (len(lengths),)
    for i, row in enumerate(col):
        np.testing.assert_allclose(out["cumsum"][i], np.cumsum(row * 2), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["total"][i], row.sum(), rtol=1e-5, atol=1e-5)
    # lengths 3 (6 rows: calls of 4 + 2), 5 (3), 7, 2, 9: one group per length
    assert mapper.stats.calls == 6 and mapper.stats.padded_rows == 0


def test_layout_converted_to_the_programs_dim_order() -> None:
    nchw = np.ascontiguousarray(rows_of("channels_last"))  # the program wants channels-last
    mapper = PteMapper(pte("channels_last"), inputs=["image"], outputs=["features", "logits"])
    out = mapper({"image": nchw})
    assert_rows_close(out["features"], eager("channels_last", 0), "channels_last")
    assert_rows_close(out["logits"], eager("channels_last", 1), "channels_last")


def test_torch_columns_pandas_batches_bytes_and_empty_batches() -> None:
    x = rows_of("mlp")
    with open(pte("mlp"), "rb") as f:
        data = f.read()
    for source in (data, np.frombuffer(data, dtype=np.uint8)):
        mapper = PteMapper(source, inputs=["x"], outputs=["y"])
        assert_rows_close(mapper({"x": torch.from_numpy(x)})["y"], eager("mlp"), "mlp")
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"id": np.arange(6), "x": list(x)})
    out = PteMapper(pte("mlp"), inputs=["x"], outputs=["y"], keep_columns=["id"])(frame)
    assert set(out) == {"id", "y"}
    assert_rows_close(out["y"], eager("mlp"), "mlp")
    empty = PteMapper(pte("mlp"), inputs=["x"], outputs=["y"])({"x": np.zeros((0, 8), "f4")})
    assert empty["y"].shape == (0, 4) and empty["y"].dtype == np.float32


def test_read_only_columns_are_not_written() -> None:
    """Ray hands batches as read-only views of its object store; an unplanned input is
    the caller's memory, so the mapper gives the method a copy of a read-only column."""
    x = rows_of("mlp")
    x.setflags(write=False)
    mapper = PteMapper(pte("mlp_unplanned"), inputs=["x"], outputs=["y"])
    assert_rows_close(mapper({"x": x})["y"], eager("mlp"), "mlp")


class _Mutates(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        return x * 2.0


@pytest.mark.parametrize("unplanned", [False, True])
def test_a_method_that_writes_its_input_never_writes_the_batch(unplanned: bool) -> None:
    """The method gets a copy of a writable column too: the kept column and a second run
    of the same batch see the batch's own values (eager PyTorch on a copy)."""
    from export_util import export_program

    pte_bytes = export_program(_Mutates(), (torch.zeros(4, 3),), unplanned=unplanned)
    mapper = PteMapper(pte_bytes, inputs=["x"], outputs=[None, "y"])
    x = np.arange(18, dtype=np.float32).reshape(6, 3)  # a padded second call, too
    kept = x.copy()
    for _ in range(2):
        out = mapper({"x": x})
        np.testing.assert_array_equal(x, kept)
        np.testing.assert_array_equal(out["x"], kept)
        np.testing.assert_array_equal(out["y"], (kept + 1) * 2)


def test_same_kind_casts_that_would_change_values_are_refused() -> None:
    """A narrowing cast is taken only when every value survives it (eager PyTorch's
    values), never wrapped or overflowed silently."""
    ids = rows_of("int_ops", 0)  # int64 column into int64: as is
    x = rows_of("int_ops", 1)
    mapper = PteMapper(pte("int_ops"), inputs=["ids", "x", 3], outputs=["a", *[None] * 8])
    big = ids.astype(np.float64)  # float into int: not same kind
    with pytest.raises(ColumnError):
        mapper({"ids": big, "x": x})
    wide = x.astype(np.float64)  # float64 into float32: rounded, fine
    got = mapper({"ids": ids, "x": wide})["a"]
    np.testing.assert_array_equal(got, mapper({"ids": ids, "x": x})["a"])
    with pytest.raises(ColumnError, match="values change"):
        mapper({"ids": ids, "x": np.full_like(wide, 1e300)})  # infinite in float32
    from export_util import export_program

    class Doubles(torch.nn.Module):
        def forward(self, i: torch.Tensor) -> torch.Tensor:
            return i * 2

    small = PteMapper(export_program(Doubles(), (torch.zeros(2, 3, dtype=torch.int32),)),
                      inputs=["i"], outputs=["o"])  # fmt: skip
    fits = np.array([[1, -2, 3], [2**31 - 1, 0, -(2**31)]], dtype=np.int64)
    np.testing.assert_array_equal(small({"i": fits})["o"], (fits.astype(np.int32) * 2))
    for bad in (np.array([[2**31, 0, 0], [0, 0, 0]], dtype=np.int64),
                np.array([[3_000_000_000, 0, 0], [0, 0, 0]], dtype=np.uint32)):  # fmt: skip
        with pytest.raises(ColumnError, match="values change"):
            small({"i": bad})
    # uint64 into int64 and back: a round trip through the other type undid the wrap
    wide = PteMapper(export_program(Doubles(), (torch.zeros(3, dtype=torch.int64),)),
                     inputs=["i"], outputs=["o"])  # fmt: skip
    ok = np.array([5, 2**63 - 1, 0], dtype=np.uint64)
    np.testing.assert_array_equal(wide({"i": ok})["o"], ok.astype(np.int64) * 2)
    for bad in (np.array([5, 2**63, 0], dtype=np.uint64), np.array([5, 2**64 - 1, 0], np.uint64)):
        with pytest.raises(ColumnError, match="values change"):
            wide({"i": bad})
    unsigned = PteMapper(export_program(Doubles(), (torch.zeros(3, dtype=torch.uint8),)),
                         inputs=["i"], outputs=["o"])  # fmt: skip
    with pytest.raises(ColumnError, match="values change"):
        unsigned({"i": np.array([1, -1, 0], dtype=np.int8)})


def test_same_kind_casts_into_a_complex_input() -> None:
    """complex128 into complex64 and float32 into complex64 convert as torch does; a value
    complex64 cannot hold is refused like a float's."""
    from ptexec.ray import Batcher
    from ptexec.tensor import TensorInfo

    info = TensorInfo(sizes=(4, 3), dtype=torch.complex64, dim_order=(0, 1), device=CPU,
                      strides=(3, 1), is_memory_planned=True, dynamism="dynamic_bound")  # fmt: skip
    batcher = Batcher(lambda args: [args[0] * 2], [info], [info], ["z"], ["out"])
    rng = np.random.default_rng(3)
    wide = rng.standard_normal((5, 3)) + 1j * rng.standard_normal((5, 3))
    for col in (wide, wide.real.astype(np.float32)):
        want = (torch.from_numpy(col).to(torch.complex64) * 2).numpy()
        np.testing.assert_array_equal(batcher({"z": col})["out"], want)
    with pytest.raises(ColumnError, match="values change"):
        batcher({"z": np.full((2, 3), 1e300 + 0j)})


class _Counts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n.add_(1.0)
        return x * 0 + self.n


def test_carry_runs_rows_of_varying_shapes_in_the_batchs_order() -> None:
    from export_util import export_program

    b, t = torch.export.Dim("b", min=1, max=8), torch.export.Dim("t", min=1, max=8)
    program = export_program(_Counts(), (torch.zeros(2, 3),), dynamic_shapes=({0: b, 1: t},))
    rows = [np.ones(n, np.float32) for n in (2, 3, 2, 2, 3)]
    col = np.empty(len(rows), dtype=object)
    col[:] = rows
    mapper = PteMapper(program, inputs=["x"], outputs=["y"], state="carry")
    out = mapper({"x": col})
    # one call per run of one shape, in order: (2), (3), (2, 2), (3)
    assert [float(o[0]) for o in out["y"]] == [1.0, 2.0, 3.0, 3.0, 4.0]


# ------------------------------------------------------------------------------------------
# columns that cannot fit


def test_columns_that_cannot_fit_raise_column_error_in_both_modes() -> None:
    x = rows_of("mlp")
    for mode in ("raise", "record"):
        mapper = PteMapper(pte("mlp"), inputs=["x"], outputs=["y"], on_error=mode)
        with pytest.raises(ColumnError, match=r"rows of shape \[9\].*float32\[2, 8\]") as e:
            mapper({"x": np.zeros((4, 9), np.float32)})
        assert e.value.column == "x"
        with pytest.raises(ColumnError, match="'x', which the batch does not have"):
            mapper({"image": x})
        with pytest.raises(ColumnError, match=r"rows of column 'x' have 3 dimension"):
            mapper({"x": np.zeros((4, 2, 2, 8), np.float32)})
        assert_rows_close(mapper({"x": x})["y"], eager("mlp"), "mlp")  # still works
    strict = PteMapper(pte("mlp"), inputs=["x"], outputs=["y"], cast="no")
    with pytest.raises(ColumnError, match=r"float64.*does not convert float64 to float32"):
        strict({"x": x.astype(np.float64)})
    with pytest.raises(ColumnError, match="does not convert float32 to int64"):
        PteMapper(pte("int_ops"), inputs=["ids", "x", 3], outputs=[f"o{k}" for k in range(9)])(
            {"ids": rows_of("int_ops", 1), "x": rows_of("int_ops", 1)}
        )


def test_arrays_torch_cannot_read_are_typed_errors() -> None:
    """An array in the other byte order: the method raises InputError for it; a column of
    them is a ColumnError, one such row a bad row, the other rows still computed."""
    swapped = rows_of("mlp").astype(">f4")
    with pytest.raises(InputError):
        ptexec.load(pte("mlp")).load_method().execute([swapped[:2]])
    for mode in ("raise", "record"):
        mapper = PteMapper(pte("mlp"), inputs=["x"], outputs=["y"], on_error=mode)
        with pytest.raises(ColumnError, match="column 'x'"):
            mapper({"x": swapped})
    col = np.empty(3, dtype=object)
    col[:] = list(rows_of("dynamic_mlp")[:3])
    col[1] = col[1].astype(">f4")
    mapper = PteMapper(pte("dynamic_mlp"), inputs=["x"], outputs=["y"], on_error="record")
    out = mapper({"x": col})
    assert out["error"][0] is None and out["error"][2] is None and "InputError" in out["error"][1]
    assert_rows_close(out["y"][[0, 2]], eager("dynamic_mlp")[[0, 2]], "dynamic_mlp")


def test_mapping_checked_when_the_mapper_is_made() -> None:
    with pytest.raises(ColumnError, match=r"takes 1 input\(s\).*names 2"):
        PteMapper(pte("mlp"), inputs=["x", "z"])
    with pytest.raises(ColumnError, match=r"returns 1 output\(s\).*names 2"):
        PteMapper(pte("mlp"), inputs=["x"], outputs=["a", "b"])
    with pytest.raises(ColumnError, match="more than once"):
        PteMapper(pte("channels_last"), inputs=["x"], outputs=["a", "a"])
    with pytest.raises(ptexec.MethodNotFoundError, match="no method 'predict'"):
        PteMapper(pte("mlp"), inputs=["x"], method="predict")
    with pytest.raises(ValueError, match="on_error"):
        PteMapper(pte("mlp"), inputs=["x"], on_error="skip")


def test_an_output_without_the_rows_dimension_is_refused() -> None:
    # dynamic_unbound: x float32[6] -> (float32[1], float32[6]); scalar rows batch 6 per call
    mapper = PteMapper(pte("dynamic_unbound"), inputs=["x"], outputs=["total", "cumsum"])
    with pytest.raises(ColumnError, match=r"output 0 .*'total'.* \[1\] tensor for a call of 6"):
        mapper({"x": np.ones(6, np.float32)})
    ok = PteMapper(pte("dynamic_unbound"), inputs=["x"], outputs=[None, "cumsum"])
    x = rows_of("dynamic_unbound")
    want = np.concatenate(
        [np.cumsum(c["inputs"][0].numpy()) for c in fixture_calls("dynamic_unbound")]
    )
    np.testing.assert_allclose(ok({"x": x})["cumsum"], want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------
# bad rows


def ragged_rows() -> np.ndarray:
    """Rows for dynamic_mlp ([<=16, 8]): rows 1 (9 features) and 3 (None) are bad."""
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal(8).astype(np.float32) for _ in range(6)]
    rows[1] = np.ones(9, np.float32)
    col = np.empty(6, dtype=object)
    col[:] = rows
    col[3] = None
    return col


def test_bad_rows_fail_the_batch_naming_the_row() -> None:
    mapper = PteMapper(pte("dynamic_mlp"), inputs=["x"], outputs=["y"], id_column="key")
    with pytest.raises(
        RowError, match=r"row 1 \(id 'b'\): InputError: .*\[9\].*over its bound 8"
    ) as e:
        mapper({"x": ragged_rows(), "key": np.array(list("abcdef"))})
    assert isinstance(e.value, InputError) and (e.value.row, e.value.row_id) == (1, "b")
    good = rows_of("dynamic_mlp")
    assert_rows_close(mapper({"x": good})["y"], eager("dynamic_mlp"), "dynamic_mlp")


def test_bad_rows_recorded_and_the_rest_computed() -> None:
    col = ragged_rows()
    mapper = PteMapper(pte("dynamic_mlp"), inputs=["x"], outputs=["y"], on_error="record")
    out = mapper({"x": col})
    errors = list(out["error"])
    assert [e is None for e in errors] == [True, False, True, False, True, True]
    assert "over its bound 8" in errors[1] and "None" in errors[3]
    good = [0, 2, 4, 5]
    want = single_process("dynamic_mlp", np.stack([col[i] for i in good]), 1)
    np.testing.assert_allclose(out["y"][good], want, rtol=1e-6, atol=1e-7)
    assert np.isnan(out["y"][[1, 3]]).all()
    assert mapper.stats.failed_rows == 2


@pytest.mark.parametrize("name", ["mlp", "dynamic_mlp"])
def test_a_batch_of_only_missing_rows_has_the_columns_of_a_good_one(name: str) -> None:
    """Rows all None, or the NaN float array Ray makes of a block of null rows: every row
    recorded as missing, outputs NaN in the shape a good batch's rows have (so that Ray can
    concatenate the blocks), whether or not a good batch came first."""
    good = rows_of(name)
    want = eager(name)
    missing = {
        "None rows": [None] * 3,
        "Ray's null block": np.full(3, np.nan, dtype=np.float32),
    }
    for first_good in (True, False):
        for what, col in missing.items():
            mapper = PteMapper(pte(name), inputs=["x"], outputs=["y"], on_error="record")
            if first_good:
                assert_rows_close(mapper({"x": good})["y"], want, name)
            out = mapper({"x": col})
            assert out["y"].shape == (3, *want.shape[1:]), (what, first_good)
            assert out["y"].dtype == want.dtype and np.isnan(out["y"]).all()
            assert all("no value (None)" in e for e in out["error"]), what
            assert_rows_close(mapper({"x": good})["y"], want, name)  # and it carries on
    raising = PteMapper(pte(name), inputs=["x"], outputs=["y"])
    with pytest.raises(RowError, match=r"row 0: .*no value \(None\)"):
        raising({"x": missing["Ray's null block"]})
    # a rank-1 input takes a float column as data, NaN or not: no rows are missing there
    scalar_rows = PteMapper(pte("dynamic_unbound"), inputs=["x"], outputs=[None, "c"])
    assert np.isnan(scalar_rows({"x": np.full(6, np.nan, np.float32)})["c"]).all()


class _CleanVector(torch.nn.Module):
    """One feature vector per call (no batch dim); NaN features read as 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(x, nan=0.0) * 2.0 + 1.0


def test_a_null_block_of_vector_rows_read_one_per_call_is_missing_rows() -> None:
    """Rows of a vector input reaching it one per call: Ray's NaN array for a block of
    null rows has one value per row, which cannot be such a row, so the rows are missing
    (recorded, fill values of a good row's shape), not run as rows of one scalar each."""
    from export_util import export_program

    data = export_program(_CleanVector(), (torch.zeros(4),))
    good = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = _CleanVector()(torch.from_numpy(good)).numpy()  # eager, row by row alike
    mapper = PteMapper(data, inputs=["x"], outputs=["y"], on_error="record")
    np.testing.assert_array_equal(mapper({"x": good})["y"], want)
    out = mapper({"x": np.full(3, np.nan, np.float32)})
    assert all(e is not None and "no value (None)" in e for e in out["error"])
    assert out["y"].shape == (3, 4) and np.isnan(out["y"]).all()
    np.testing.assert_array_equal(mapper({"x": good})["y"], want)  # and it carries on
    raising = PteMapper(data, inputs=["x"], outputs=["y"])
    raising({"x": good})
    with pytest.raises(RowError, match=r"row 0: .*no value \(None\)"):
        raising({"x": np.full(3, np.nan, np.float32)})


def test_nulls_in_an_integer_column_are_missing_rows() -> None:
    """Ray hands an integer column with nulls over as floats, NaN at the nulls: those rows
    are missing (recorded), the others run with their integers, not the whole column
    refused as floats."""
    calls = fixture_calls("int_ops")  # per row: ids int64[2, 5], x float32[2, 5], k int64[]
    ids = np.stack([c["inputs"][0].numpy() for c in calls])
    x = np.stack([c["inputs"][1].numpy() for c in calls])
    k = np.array([3.0, np.nan, 2.0])  # what Ray makes of [3, None, 2]
    mapper = PteMapper(pte("int_ops"), inputs=["ids", "x", "k"], outputs=["a", *[None] * 8],
                       on_error="record")  # fmt: skip
    out = mapper({"ids": ids, "x": x, "k": k})
    assert [e is None for e in out["error"]] == [True, False, True]
    assert "no value (None)" in out["error"][1]
    method = ptexec.load(pte("int_ops")).load_method()
    for row in (0, 2):
        args = [torch.from_numpy(ids[row]), torch.from_numpy(x[row]), torch.tensor(int(k[row]))]
        np.testing.assert_array_equal(out["a"][row], method.execute(args)[0].numpy())
    with pytest.raises(RowError, match=r"row 1: .*no value \(None\)"):
        PteMapper(pte("int_ops"), inputs=["ids", "x", "k"], outputs=["a", *[None] * 8])(
            {"ids": ids, "x": x, "k": k}
        )
    fractional = PteMapper(pte("int_ops"), inputs=["ids", "x", "k"],
                           outputs=["a", *[None] * 8], on_error="record")  # fmt: skip
    errors = fractional({"ids": ids, "x": x, "k": np.array([3.0, np.nan, 2.5])})["error"]
    assert errors[0] is None and "None" in errors[1] and "float" in errors[2]


def test_nulls_in_a_column_of_an_int_scalar_input_are_missing_rows() -> None:
    """An int scalar input (not a tensor) reads its column the same way: Ray's floats
    with NaN at the nulls are missing rows, the other rows run with their integers."""
    calls = fixture_calls("scalar_io")  # x [rows<=8, 3]; alpha float, n int, flag bool
    xs = np.empty(len(calls), dtype=object)
    xs[:] = [c["inputs"][0].numpy() for c in calls]
    batch = {
        "x": xs,
        "alpha": np.array([c["inputs"][1] for c in calls]),
        "n": np.array([float(calls[0]["inputs"][2]), np.nan, float(calls[2]["inputs"][2])]),
        "flag": np.array([c["inputs"][3] for c in calls]),
    }
    names = ["y", "rows", "m", "none", "a2", "f", "half"]
    mapper = PteMapper(pte("scalar_io"), inputs=list(batch), outputs=names, on_error="record")
    out = mapper(batch)
    assert out["error"][0] is None and out["error"][2] is None
    assert "no value (None)" in out["error"][1]
    rtol, atol = tolerance("scalar_io")
    for i in (0, 2):  # eager PyTorch's recorded outputs
        np.testing.assert_allclose(
            out["y"][i], calls[i]["outputs"][0].numpy(), rtol=rtol, atol=atol
        )
        assert [out[k][i] for k in names[1:]] == calls[i]["outputs"][1:]
    with pytest.raises(RowError, match=r"row 1: .*no value \(None\)"):
        PteMapper(pte("scalar_io"), inputs=list(batch), outputs=names)(batch)


def test_integers_past_what_a_float_holds_in_a_column_with_nulls_are_bad_rows() -> None:
    """Ray hands an integer column with nulls over as floats, which round integers past
    2**53 (2**60 + 1 arrives as 2**60): such a row is refused, not run with an integer
    it may not have been; the rows within stay exact."""
    calls = fixture_calls("scalar_io")  # x [rows<=8, 3]; alpha float, n int, flag bool
    xs = np.empty(len(calls), dtype=object)
    xs[:] = [c["inputs"][0].numpy() for c in calls]
    ns = [float(2**60 + 1), np.nan, float(calls[2]["inputs"][2])]
    batch = {
        "x": xs,
        "alpha": np.array([c["inputs"][1] for c in calls]),
        "n": np.array(ns),
        "flag": np.array([c["inputs"][3] for c in calls]),
    }
    names = ["y", "rows", "m", "none", "a2", "f", "half"]
    mapper = PteMapper(pte("scalar_io"), inputs=list(batch), outputs=names, on_error="record")
    out = mapper(batch)
    assert "cannot be trusted" in out["error"][0] and "2**53" in out["error"][0]
    assert "no value (None)" in out["error"][1]
    assert out["error"][2] is None
    assert [out[k][2] for k in names[1:]] == calls[2]["outputs"][1:]


def test_an_error_column_that_would_overwrite_a_column_is_refused() -> None:
    ok = {"inputs": ["x"], "outputs": ["y"], "on_error": "record"}
    for clash in (
        {"error_column": "y"},
        {"error_column": "x"},
        {"error_column": "key", "id_column": "key"},
        {"error_column": "key", "keep_columns": ["key"]},
    ):
        with pytest.raises(ColumnError, match=r"error_column .* is also") as e:
            PteMapper(pte("mlp"), **{**ok, **clash})  # type: ignore[arg-type]
        assert e.value.column == clash["error_column"]
    assert "y" in PteMapper(pte("mlp"), inputs=["x"], outputs=["y"], error_column="y")(
        {"x": rows_of("mlp")}
    )  # without on_error="record" no error column is written
    kept = PteMapper(pte("mlp"), **ok)  # type: ignore[arg-type]
    with pytest.raises(ColumnError, match="a column 'error', which error_column would"):
        kept({"x": rows_of("mlp"), "error": np.zeros(len(rows_of("mlp")))})


def test_a_row_the_program_fails_on_is_found_by_running_rows_alone() -> None:
    """An embedding index out of range fails the whole call (ExecutionError); each row is
    then run alone, so only that row fails and its neighbour in the call still gets its
    outputs."""
    ids, x = rows_of("int_ops", 0).copy(), rows_of("int_ops", 1)
    ids[3, 2] = 57
    names = [f"o{k}" for k in range(9)]
    mapper = PteMapper(pte("int_ops"), inputs=["ids", "x", 3], outputs=names, on_error="record")
    out = mapper({"ids": ids, "x": x})
    assert [e is None for e in out["error"]] == [True, True, True, False, True, True]
    assert "ExecutionError" in out["error"][3] and "index out of range" in out["error"][3]
    method = ptexec.load(pte("int_ops")).load_method()
    alone = method.execute(
        [torch.from_numpy(ids[[2, 2]]), torch.from_numpy(x[[2, 2]]), torch.tensor(3)]
    )
    for k, name in enumerate(names):  # row 2 shared the failed call with row 3
        np.testing.assert_array_equal(out[name][2], alone[k][0].numpy())
    assert (mapper.stats.retried_rows, mapper.stats.failed_rows) == (2, 1)
    raising = PteMapper(pte("int_ops"), inputs=["ids", "x", 3], outputs=names)
    with pytest.raises(RowError, match="row 3: ExecutionError") as e:
        raising({"ids": ids, "x": x})
    assert isinstance(e.value.__cause__, ExecutionError)


# ------------------------------------------------------------------------------------------
# stateful programs


def test_stateful_program_refused_unless_told() -> None:
    assert sorted(state_tensors(ptexec.load(pte("stateful")), "forward")) == [
        "float32[4]",
        "int64[1]",
    ]
    assert state_tensors(ptexec.load(pte("mlp")), "forward") == []
    with pytest.raises(StatefulMethodError, match=r"keeps state.*state='reset'.*state='carry'"):
        PteMapper(pte("stateful"), inputs=["x"])


def test_stateful_carry_runs_state_on_and_reset_starts_each_call_afresh() -> None:
    calls = fixture_calls("stateful")  # four calls in a row, eager outputs recorded
    x = rows_of("stateful").reshape(len(calls), 4)
    carry = PteMapper(
        pte("stateful"), inputs=["x"], outputs=["mean", "total", "count"], state="carry"
    )
    out = carry({"x": x})
    for k, name in enumerate(["mean", "total", "count"]):
        want = np.stack([c["outputs"][k].numpy() for c in calls])
        assert_rows_close(out[name], want, "stateful")
    reset = PteMapper(
        pte("stateful"), inputs=["x"], outputs=["mean", "total", "count"], state="reset"
    )
    for _ in range(2):
        out = reset({"x": x})
        np.testing.assert_array_equal(out["total"], x)  # each row starts from zero state
        np.testing.assert_array_equal(out["count"], np.ones((len(calls), 1), np.int64))


def test_carry_never_pads_a_call() -> None:
    """Padding rows would change a carried state, so a short call is refused."""
    from ptexec.ray import Batcher

    info = ptexec.load(pte("mlp")).method_meta()
    method = ptexec.load(pte("mlp")).load_method()
    batcher = Batcher(
        method.execute, info.inputs, info.outputs, ["x"], ["y"], isolate=False, allow_padding=False
    )
    np.testing.assert_array_equal(batcher({"x": rows_of("mlp")[:4]})["y"].shape, (4, 4))
    with pytest.raises(ColumnError, match="would need 1 padding row"):
        batcher({"x": rows_of("mlp")[:3]})
    # refused before the batch's first call, which would already have changed the state
    calls: list[int] = []

    def counted(args: list[Any]) -> list[Any]:
        calls.append(1)
        return method.execute(args)

    batcher = Batcher(
        counted, info.inputs, info.outputs, ["x"], ["y"], isolate=False, allow_padding=False
    )
    with pytest.raises(ColumnError, match="would need 1 padding row"):
        batcher({"x": rows_of("mlp")[:5]})
    assert not calls


# ------------------------------------------------------------------------------------------
# devices


CUDA0 = Device(DeviceType.CUDA, 0)
CUDA1 = Device(DeviceType.CUDA, 1)


def test_device_choice() -> None:
    cpu_prog, gpu_prog = {CPU}, {CPU, CUDA0}
    assert choose_device_map("auto", None, cpu_prog, None) is None
    assert choose_device_map("auto", None, cpu_prog, CUDA1) == "cuda:1"
    assert choose_device_map("auto", None, gpu_prog, CUDA0) is None
    assert choose_device_map("auto", None, gpu_prog, CUDA1) == {"cuda": "cuda:1"}
    assert choose_device_map("cpu", None, gpu_prog, CUDA0) == "cpu"
    assert choose_device_map("cpu", None, cpu_prog, None) is None
    assert choose_device_map("cuda:1", None, cpu_prog, None) == "cuda:1"
    assert choose_device_map("auto", {"cuda:0": "cpu"}, gpu_prog, None) == {"cuda:0": "cpu"}
    with pytest.raises(
        DeviceUnavailableError, match=r"cuda:0, and this actor has no GPU.*num_gpus=1.*device='cpu'"
    ):
        choose_device_map("auto", None, gpu_prog, None)
    with pytest.raises(ValueError, match="not both"):
        choose_device_map("cpu", "cpu", gpu_prog, None)
    if not torch.cuda.is_available():  # outside Ray: torch's current CUDA device, if any
        assert assigned_device() is None


def test_cuda_program_on_the_cpu_only_when_asked() -> None:
    x = rows_of("gpu_mlp")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="no GPU"):
            PteMapper(pte("gpu_mlp"), inputs=["x"])
    mapper = PteMapper(pte("gpu_mlp"), inputs=["x"], outputs=["y"], device="cpu")
    assert mapper.device == CPU
    assert_rows_close(mapper({"x": x})["y"], eager("gpu_mlp"), "gpu_mlp")


@pytest.mark.cuda
def test_auto_runs_on_the_gpu() -> None:
    for name in ("gpu_dynamic_mlp", "dynamic_mlp"):  # a CUDA program; a CPU one moved over
        mapper = PteMapper(pte(name), inputs=["x"], outputs=["y"])
        assert not mapper.device.is_cpu
        assert_rows_close(mapper({"x": rows_of(name)})["y"], eager(name), name)


# ------------------------------------------------------------------------------------------
# map_program's arguments to map_batches (a stand-in for Ray records them)


class _Tagged(PteMapper):
    """A mapper that adds a column of its own and hands everything else on as keywords."""

    def __init__(self, path: Any, *, tag: str = "", **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.tag = tag

    def __call__(self, batch: Any) -> dict[str, np.ndarray]:
        out = super().__call__(batch)
        out["tag"] = np.full(len(out["y"]), self.tag)
        return out


def test_map_program_hands_a_subclass_its_keywords_as_ray_passes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray builds each actor's mapper as ``mapper(**fn_constructor_kwargs)``: a subclass
    taking ``**kwargs`` gets every keyword of its own and of PteMapper's by name."""
    import sys
    import types

    from ptexec.ray import map_program

    fake = types.ModuleType("ray")
    fake_data = types.ModuleType("ray.data")
    fake.ObjectRef = type("ObjectRef", (), {})  # type: ignore[attr-defined]
    fake.put = lambda value: value  # type: ignore[attr-defined]
    fake.is_initialized = lambda: False  # type: ignore[attr-defined]
    fake.data = fake_data  # type: ignore[attr-defined]
    fake_data.ActorPoolStrategy = lambda **kw: kw  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray.data", fake_data)
    seen: dict[str, Any] = {}

    class Dataset:
        def map_batches(self, fn: Any, *, fn_constructor_kwargs: dict[str, Any], **kw: Any) -> Any:
            seen.update(fn=fn, kwargs=fn_constructor_kwargs)
            return self

    for ship in (True, False):
        map_program(Dataset(), pte("mlp"), inputs=["x"], outputs=["y"], mapper=_Tagged,
                    tag="run", on_error="record", ship=ship)  # fmt: skip
        actor = seen["fn"](**seen["kwargs"])  # as Ray makes it on an actor
        out = actor({"x": rows_of("mlp")})
        assert_rows_close(out["y"], eager("mlp"), "mlp")
        assert list(out["tag"]) == ["run"] * 6 and "error" in out


# ------------------------------------------------------------------------------------------
# on a local Ray cluster


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local Ray with 2 CPUs for this module's tests, shut down after them."""
    ray = pytest.importorskip("ray")
    data = pytest.importorskip("ray.data")
    import logging

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=256 << 20,
        logging_level=logging.ERROR,
    )
    ctx = data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        yield ray
    finally:
        ray.shutdown()


def frame_by_id(ds: Any) -> Any:
    return ds.to_pandas().sort_values("id").reset_index(drop=True)


@pytest.mark.ray
def test_ray_static_batch_on_two_actors_equals_single_process(ray_cluster: Any) -> None:
    from ptexec.ray import map_program

    x = np.random.default_rng(2).standard_normal((3001, 8)).astype(np.float32)
    ds = ray_cluster.data.from_items(
        [{"id": i, "x": x[i]} for i in range(len(x))], override_num_blocks=4
    )
    out = frame_by_id(map_program(ds, pte("mlp"), inputs=["x"], outputs=["y"], concurrency=2))
    assert list(out.columns) == ["id", "x", "y"] and len(out) == len(x)
    got = np.stack(out["y"].to_numpy())
    np.testing.assert_allclose(got, single_process("mlp", x, 2), rtol=1e-6, atol=1e-7)


@pytest.mark.ray
def test_ray_map_batches_with_pte_mapper_bounded_batch(ray_cluster: Any) -> None:
    """The issue's form: map_batches(PteMapper, fn_constructor_kwargs=...), from a path."""
    x = np.random.default_rng(3).standard_normal((2000, 8)).astype(np.float32)
    ds = ray_cluster.data.from_items(
        [{"id": i, "x": x[i]} for i in range(len(x))], override_num_blocks=2
    )
    mapped = ds.map_batches(
        PteMapper,
        fn_constructor_kwargs={
            "path": pte("dynamic_mlp"),
            "method": "forward",
            "inputs": ["x"],
            "outputs": ["y"],
            "device": "auto",
            "keep_columns": ["id"],
            "mmap": True,
        },
        compute=ray_cluster.data.ActorPoolStrategy(size=1),
        batch_size=100,  # calls of 16, 16, ..., 4 rows
    )
    out = frame_by_id(mapped)
    assert list(out.columns) == ["id", "y"]
    got = np.stack(out["y"].to_numpy())
    np.testing.assert_allclose(got, single_process("dynamic_mlp", x, 1), rtol=1e-6, atol=1e-7)


def ragged_items(n: int) -> tuple[list[dict[str, object]], set[int]]:
    """Rows for dynamic_mlp ([<=16, 8]); every 97th row has 9 features (a bad row)."""
    rng = np.random.default_rng(4)
    bad = set(range(5, n, 97))
    items = [
        {"id": i, "x": rng.standard_normal(9 if i in bad else 8).astype(np.float32)}
        for i in range(n)
    ]
    return items, bad


@pytest.mark.ray
def test_ray_bad_rows_recorded(ray_cluster: Any) -> None:
    from ptexec.ray import map_program

    items, bad = ragged_items(2000)
    ds = ray_cluster.data.from_items(items, override_num_blocks=2)
    mapped = map_program(
        ds, pte("dynamic_mlp"), inputs=["x"], outputs=["y"], on_error="record", concurrency=2
    )
    out = frame_by_id(mapped)
    failed = {int(i) for i in out.loc[out["error"].notna(), "id"]}
    assert failed == bad
    assert all("over its bound 8" in e for e in out.loc[out["error"].notna(), "error"])
    good = [i for i in range(len(items)) if i not in bad]
    want = single_process("dynamic_mlp", np.stack([items[i]["x"] for i in good]), 1)
    got = np.stack(out["y"].to_numpy()[good])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert np.isnan(np.stack(out["y"].to_numpy()[sorted(bad)])).all()


@pytest.mark.ray
def test_ray_blocks_of_null_rows_recorded_and_concatenated(ray_cluster: Any) -> None:
    """Blocks whose rows are all null (Ray hands them over as NaN float arrays) and blocks
    with some null rows: recorded, NaN rows of the good rows' shape, one dataset. (A batch
    per block: Ray itself cannot concatenate a null block's input column with a tensor
    one, before any mapper sees it.)"""
    from ptexec.ray import map_program

    x = np.random.default_rng(5).standard_normal((40, 8)).astype(np.float32)
    null = set(range(10, 20)) | {25, 33}  # block 1 all null, blocks 2 and 3 partly
    items = [{"id": i, "x": None if i in null else x[i]} for i in range(len(x))]
    ds = ray_cluster.data.from_items(items, override_num_blocks=4)
    mapped = map_program(
        ds,
        pte("mlp"),
        inputs=["x"],
        outputs=["y"],
        keep_columns=["id"],
        on_error="record",
        batch_size=10,
    )
    out = frame_by_id(mapped)
    assert list(out["id"]) == list(range(len(x)))
    failed = {int(i) for i in out.loc[out["error"].notna(), "id"]}
    assert failed == null
    y = np.stack(out["y"].to_numpy())
    assert y.shape == (len(x), 4) and np.isnan(y[sorted(null)]).all()
    good = [i for i in range(len(x)) if i not in null]
    np.testing.assert_allclose(y[good], single_process("mlp", x[good], 2), rtol=1e-6, atol=1e-7)
    with pytest.raises(ColumnError, match="error_column 'y' is also an output column"):
        map_program(
            ds, pte("mlp"), inputs=["x"], outputs=["y"], on_error="record", error_column="y"
        )


@pytest.mark.ray
def test_ray_bad_row_fails_the_dataset_naming_it(ray_cluster: Any) -> None:
    from ptexec.ray import map_program

    items, bad = ragged_items(300)
    ds = ray_cluster.data.from_items(items, override_num_blocks=1)
    mapped = map_program(ds, pte("dynamic_mlp"), inputs=["x"], outputs=["y"], id_column="id")
    first = min(bad)
    with pytest.raises(Exception, match=rf"RowError: row {first} \(id {first}\): InputError"):
        mapped.materialize()


@pytest.mark.ray
def test_ray_stateful_refused_before_running_or_carried(ray_cluster: Any) -> None:
    from ptexec.ray import map_program

    x = np.random.default_rng(5).standard_normal((400, 4)).astype(np.float32)
    ds = ray_cluster.data.from_items([{"id": i, "x": x[i]} for i in range(len(x))])
    with pytest.raises(StatefulMethodError, match="keeps state"):
        map_program(ds, pte("stateful"), inputs=["x"])  # in the driver: nothing ran
    ctx = ray_cluster.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    try:
        mapped = map_program(
            ds,
            pte("stateful"),
            inputs=["x"],
            outputs=["mean", "total", "count"],
            state="carry",
            batch_size=64,
        )
        out = mapped.to_pandas()
    finally:
        ctx.execution_options.preserve_order = False
    # one actor, rows in order: the state runs through the dataset as in one process
    np.testing.assert_array_equal(out["id"].to_numpy(), np.arange(len(x)))
    method = ptexec.load(pte("stateful")).load_method()
    want = [method.execute([torch.from_numpy(row)]) for row in x]
    np.testing.assert_array_equal(np.stack(out["count"].to_numpy())[:, 0], np.arange(1, 401))
    np.testing.assert_allclose(
        np.stack(out["total"].to_numpy()), np.stack([w[1].numpy() for w in want]), rtol=1e-6
    )


@pytest.mark.ray
def test_ray_example_agrees_with_eager(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/ray_batch_eval.py as the README runs it, on a smaller dataset and model."""
    import re
    import runpy
    import sys
    from pathlib import Path

    pytest.importorskip("executorch")
    example = Path(__file__).resolve().parent.parent / "examples" / "ray_batch_eval.py"
    args = ["--rows", "4000", "--hidden", "64", "--concurrency", "1", "--blocks", "4"]
    monkeypatch.setattr(sys, "argv", [str(example), *args])
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    agreement = float(re.search(r"top-1 agreement with eager ([0-9.]+)", out).group(1))
    diff = float(re.search(r"largest logit difference ([0-9.e+-]+)", out).group(1))
    accuracy = float(re.search(r"ptexec on Ray:  accuracy ([0-9.]+)", out).group(1))
    assert agreement == 1.0 and diff < 1e-4 and accuracy > 0.5
    assert re.search(r"Ray, 1 actor\(s\) +[0-9,]+ +[0-9,]+ +[0-9,]+\n", out)


@pytest.mark.ray
@pytest.mark.cuda
def test_ray_cuda_program_gets_a_gpu_per_actor(ray_cluster: Any) -> None:
    from ptexec.ray import map_program

    x = np.random.default_rng(6).standard_normal((500, 8)).astype(np.float32)
    ds = ray_cluster.data.from_items([{"id": i, "x": x[i]} for i in range(len(x))])
    out = frame_by_id(map_program(ds, pte("gpu_dynamic_mlp"), inputs=["x"], outputs=["y"]))
    on_cpu = ptexec.load(pte("gpu_dynamic_mlp")).load_method(device_map="cpu")
    want = np.concatenate([on_cpu.execute([torch.from_numpy(x[i : i + 1])])[0] for i in range(500)])
    np.testing.assert_allclose(np.stack(out["y"].to_numpy()), want, rtol=1e-4, atol=1e-5)
