"""How the rows of a batch become calls of a method, and its outputs become columns.

A batch is a mapping of column name to column (numpy arrays, torch tensors or lists, one
entry per row). Each method input comes from a column or is a constant. The rows reach the
method in one of two ways, decided from the column shapes:

- **batched**: a row has one dimension less than the method's input, which takes rows
  along dim 0. A static dim 0 of ``B`` takes exactly ``B`` rows per call: the batch is split
  into chunks of ``B`` and the last chunk is padded by repeating its last row (a real row,
  so the padding is as valid an input as the data), and the outputs are trimmed. A bounded
  dynamic dim 0 takes up to its bound, passed as is (``pad="always"`` pads to the bound, for
  programs whose dim 0 is static while another dimension is dynamic: the file records
  dynamism per tensor, not per dimension). An unbounded dim 0 takes the whole batch.
- **per row**: a row has the method input's own shape (or the input is a scalar); every row
  is one call.

Outputs become columns with one entry per row: in batched mode an output must carry the
rows along dim 0. A call that the method refuses (:class:`~ptexec.errors.InputError`) or
that fails while running (:class:`~ptexec.errors.ExecutionError`) is retried one row at a
time, so the rows that fail on their own are found and every other row still gets its
outputs; those rows raise :class:`~ptexec.errors.RowError` or, with ``on_error="record"``,
get an error message in the error column and fill values in the output columns (NaN for
floating outputs, 0 or False otherwise, None in columns of varying shape). A missing row
(None; a block of null rows reaches a mapper as a float array of NaN, one per row, and
an integer column with nulls as floats, NaN at the nulls: there an integer past 2**53,
which the float may have rounded, is a bad row too) is such a row (a NaN in a float
column of one value per row is data: Ray hands a null and a NaN over alike there, unless
earlier rows reached a 1-d input one per call, as vectors); a batch of only missing rows
says nothing of how rows reach the method, so it takes the way the batch before it took,
or before any, the way the method's shapes allow (batched when every input and kept output
carries the rows along dim 0), and its fill values have the shape a good batch's rows
would have.

Column problems that concern every row (a missing column, a shape or dtype that cannot fit
the input, an output without the rows' dimension) raise
:class:`~ptexec.errors.ColumnError` in both error modes: recording them would only hide
a mistake in the mapping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import numpy as np
import torch

from .. import ScalarInfo
from ..errors import ColumnError, ExecutionError, InputError, PtexecError, RowError
from ..tensor import TensorInfo, dim_order_strides, to_torch

__all__ = ["BatchStats", "Batcher", "Cast", "OnError", "Pad"]

OnError = Literal["raise", "record"]
Cast = Literal["no", "same_kind", "unsafe"]
Pad = Literal["auto", "always"]
Execute = Callable[[list[Any]], list[Any]]
ValueInfo = TensorInfo | ScalarInfo  # what MethodMeta says of an input or output

_ROW_FAILURES = (InputError, ExecutionError)


@dataclass
class BatchStats:
    """What a :class:`Batcher` has done so far: ``batches`` and ``rows`` seen, method
    ``calls`` made, ``padded_rows`` added to fill calls, ``retried_rows`` run alone after
    their call failed, ``failed_rows`` refused or failed (recorded or raised)."""

    batches: int = 0
    rows: int = 0
    calls: int = 0
    padded_rows: int = 0
    retried_rows: int = 0
    failed_rows: int = 0


@dataclass(frozen=True)
class _Input:
    """Where method input ``index`` comes from: ``column`` or ``constant``."""

    index: int
    info: ValueInfo
    column: str | None
    constant: Any = None


class _Column:
    """One input column of one batch, ready for the method: either ``regular`` (all rows
    in one tensor of shape ``(n, *row)`` on the input's device, in its dtype and layout) or
    ``rows`` (one value per row; ``None`` where the row was refused, see ``errors``)."""

    __slots__ = ("errors", "regular", "rows", "spec")

    def __init__(self, spec: _Input) -> None:
        self.spec = spec
        self.regular: torch.Tensor | None = None
        self.rows: list[Any] | None = None
        self.errors: dict[int, str] = {}


class _Outputs:
    """The kept outputs of the calls of one batch, gathered by row position."""

    def __init__(self, names: Sequence[str | None]) -> None:
        self.kept = [k for k, name in enumerate(names) if name is not None]
        self.parts: list[list[tuple[Sequence[int], Any]]] = [[] for _ in names]

    def add(self, positions: Sequence[int], values: list[Any], batched: bool) -> None:
        for k in self.kept:
            parts, value = self.parts[k], values[k]
            if batched:
                parts.append((positions, value[: len(positions)]))
            elif isinstance(value, torch.Tensor):
                parts.append((positions, value.unsqueeze(0)))
            else:
                parts.append((positions, [value]))


class Batcher:
    """Runs batches of rows through ``execute`` (one method call per chunk or row).

    ``inputs`` name a column per method input (``str``) or give a constant (anything
    else); ``outputs`` name a column per method output (``None`` drops that output).
    ``isolate`` says whether a failed call may be retried row by row (False when calls
    carry state from one to the next). ``written_inputs``: the inputs the method writes in
    place, which are given a copy of the batch's values (never the batch's own memory).
    """

    def __init__(
        self,
        execute: Execute,
        input_infos: Sequence[ValueInfo],
        output_infos: Sequence[ValueInfo],
        inputs: Sequence[Any],
        outputs: Sequence[str | None],
        *,
        method: str = "forward",
        on_error: OnError = "raise",
        error_column: str = "error",
        id_column: str | None = None,
        keep_columns: bool | Sequence[str] = True,
        pad: Pad = "auto",
        cast: Cast = "same_kind",
        isolate: bool = True,
        allow_padding: bool = True,
        written_inputs: Collection[int] = (),
    ) -> None:
        if on_error not in ("raise", "record"):
            raise ValueError(f"on_error must be 'raise' or 'record', not {on_error!r}")
        if pad not in ("auto", "always"):
            raise ValueError(f"pad must be 'auto' or 'always', not {pad!r}")
        if cast not in ("no", "same_kind", "unsafe"):
            raise ValueError(f"cast must be 'no', 'same_kind' or 'unsafe', not {cast!r}")
        check_mapping(
            method,
            input_infos,
            output_infos,
            inputs,
            outputs,
            on_error=on_error,
            error_column=error_column,
            id_column=id_column,
            keep_columns=keep_columns,
        )
        self._execute = execute
        self._method = method
        self._output_infos = tuple(output_infos)
        self._outputs = tuple(outputs)
        self._on_error = on_error
        self._error_column = error_column
        self._id_column = id_column
        self._keep = keep_columns
        self._pad_always = pad == "always"
        self._cast = cast
        self._isolate = isolate
        self._allow_padding = allow_padding
        self._written = frozenset(written_inputs)
        self._specs = [
            _Input(i, info, src, None) if isinstance(src, str) else _Input(i, info, None, src)
            for i, (info, src) in enumerate(zip(input_infos, inputs, strict=True))
        ]
        self._constants = {s.index: _constant(s, method) for s in self._specs if s.column is None}
        self._columns = [s for s in self._specs if s.column is not None]
        self._chunking: tuple[int | None, bool] | None = None
        self._mode: bool | None = None  # per row (True) or batched, as rows last said
        self.stats = BatchStats()

    # -- one batch -------------------------------------------------------------------------
    def __call__(self, data: Any) -> dict[str, np.ndarray]:
        """The output columns of a batch (``{column: array}`` or a pandas DataFrame) as
        numpy arrays, one entry per row, after the batch's kept columns (an output column
        replaces a kept one of the same name), and the error column under
        ``on_error="record"``."""
        batch = _columns_of(data)
        n = _num_rows(batch)
        self._missing_as_none(batch)
        per_row = self._per_row(batch)
        cols = [self._column(batch[s.column], s, n, per_row) for s in self._columns if s.column]
        self.stats.batches += 1
        self.stats.rows += n
        errors: dict[int, BaseException | str] = {}
        for col in cols:
            for row, message in col.errors.items():
                errors.setdefault(row, message)
        if errors and self._on_error == "raise":
            self.stats.failed_rows += 1
            self._raise(min(errors), errors[min(errors)], batch)
        got = _Outputs(self._outputs)
        good: Sequence[int] = [i for i in range(n) if i not in errors] if errors else range(n)
        if per_row:
            for i in good:
                self._run(got, [i], cols, [i], False, errors, batch)
        else:
            groups = list(_groups(cols, good, in_order=not self._isolate))
            if not self._allow_padding:  # refused before any call could change the state
                size, pad = self._rows_per_call()
                for positions, _ in groups:
                    if pad and size is not None and len(positions) % size:
                        self._refuse_padding(size, len(positions) % size)
            for positions, group in groups:
                self._run_batched(got, positions, group, errors, batch)
        self.stats.failed_rows += len(errors)
        return self._result(batch, n, got, errors, per_row)

    def _per_row(self, batch: Mapping[str, Any]) -> bool:
        """True when every row is one call, False when rows are batched along dim 0."""
        modes: dict[str, bool] = {}
        for spec in self._columns:
            assert spec.column is not None
            if spec.column not in batch:
                raise ColumnError(
                    spec.column,
                    f"input {spec.index} of '{self._method}' reads column '{spec.column}', "
                    f"which the batch does not have (columns: {', '.join(map(str, batch))})",
                )
            info = spec.info
            if not isinstance(info, TensorInfo):
                modes[spec.column] = True
                continue
            rank = _row_rank(batch[spec.column])
            if rank is None:
                continue
            if rank == len(info.sizes) - 1:
                modes[spec.column] = False
            elif rank == len(info.sizes):
                modes[spec.column] = True
            else:
                raise ColumnError(
                    spec.column,
                    f"rows of column '{spec.column}' have {rank} dimension(s); input "
                    f"{spec.index} of '{self._method}' is {_describe(info)}, so a row needs "
                    f"{len(info.sizes) - 1} (rows batched along dim 0) or {len(info.sizes)} "
                    "(one call per row)"
                    if info.sizes
                    else f"rows of column '{spec.column}' have {rank} dimension(s); input "
                    f"{spec.index} of '{self._method}' is {_describe(info)}, a scalar per row",
                )
        if len(set(modes.values())) > 1:
            described = ", ".join(
                f"'{c}' {'one call per row' if m else 'batched'}" for c, m in modes.items()
            )
            raise ColumnError(
                next(iter(modes)),
                f"the input columns of '{self._method}' disagree on how rows reach it: "
                f"{described}; every column must have the input's shape per row, or every "
                "one the input's shape without dim 0",
            )
        if not modes:  # every row of every column is missing: the rows cannot say
            return self._mode if self._mode is not None else self._mode_from_program()
        self._mode = next(iter(modes.values()))
        return self._mode

    def _mode_from_program(self) -> bool:
        """How rows reach the method when no row has said so yet: batched (False) when it
        can take rows along dim 0 (every tensor input and kept output has a dim 0, and a
        static output's dim 0 is the inputs' static one), else one call per row (True).
        A batch of only missing rows then gets output columns shaped as a good batch's."""
        rows: set[int] = set()
        for spec in self._columns:
            info = spec.info
            if not isinstance(info, TensorInfo) or not info.sizes:
                return True
            if info.dynamism == "static":
                rows.add(info.sizes[0])
        for info, name in zip(self._output_infos, self._outputs, strict=True):
            if name is None:
                continue
            if not isinstance(info, TensorInfo) or not info.sizes:
                return True
            if info.dynamism == "static" and rows and info.sizes[0] not in rows:
                return True
        return False

    def _missing_as_none(self, batch: dict[str, Any]) -> None:
        """Turn a column Ray made of a block of null rows back into missing rows: Ray
        hands such a block over as a 1-d float array of NaN, a scalar per row, which
        cannot be a row of an input of two or more dimensions in either mode, nor of a
        1-d input its rows have reached one per call; and an integer input's column with
        nulls (a tensor's or an int scalar's), which Ray hands over as floats, into its
        rows (integers, None at the NaN)."""
        for spec in self._columns:
            info, name = spec.info, spec.column
            raw = batch.get(name) if name is not None else None
            if (
                name is not None
                and _takes_integers(info)
                and isinstance(raw, np.ndarray)
                and raw.ndim == 1
                and raw.dtype.kind == "f"
            ):
                # an integer column with nulls: Ray hands it over as floats with NaN where
                # the nulls are (an integer holds no NaN); a float column's NaN is its data
                missing = np.isnan(raw)
                if missing.any():
                    rows = np.empty(len(raw), dtype=object)
                    rows[:] = [None if m else _integer_of(v)
                               for v, m in zip(raw.tolist(), missing.tolist(), strict=True)]  # fmt: skip
                    batch[name] = rows
                continue
            if (
                name is not None
                and isinstance(info, TensorInfo)
                # a 1-d input read per row takes vectors: a scalar per row is no row of it
                and (len(info.sizes) >= 2 or (len(info.sizes) == 1 and self._mode is True))
                and isinstance(raw, np.ndarray)
                and raw.ndim == 1
                and raw.dtype.kind == "f"
                and len(raw)
                and bool(np.isnan(raw).all())
            ):
                batch[name] = np.full(len(raw), None, dtype=object)

    # -- columns -> tensors ----------------------------------------------------------------
    def _column(self, raw: Any, spec: _Input, n: int, per_row: bool) -> _Column:
        col = _Column(spec)
        info = spec.info
        name = spec.column
        assert name is not None
        if _is_ragged(raw):
            col.rows = [None] * n
            for i, value in enumerate(raw):
                try:
                    col.rows[i] = self._value(
                        value, info, per_row, f"column '{name}'", spec.index in self._written
                    )
                except (InputError, TypeError) as e:
                    col.errors[i] = f"{type(e).__name__}: {e}"
            return col
        if not isinstance(info, TensorInfo):
            try:
                col.rows = [_scalar(v, info, f"column '{name}'") for v in _as_list(raw)]
            except InputError as e:
                raise ColumnError(name, str(e)) from None
            return col
        try:
            t = _tensor(raw, f"column '{name}'")
        except (TypeError, InputError) as e:
            raise ColumnError(name, str(e)) from None
        problem = _shape_problem(info, tuple(t.shape[1:]), per_row)
        if problem is not None:
            raise ColumnError(
                name,
                f"column '{name}' has rows of shape {list(t.shape[1:])}; input {spec.index} "
                f"of '{self._method}' is {_describe(info)} ({problem})",
            )
        try:
            col.regular = self._convert(
                t, info, per_row, _readonly(raw) or spec.index in self._written, f"column '{name}'"
            )
        except InputError as e:
            raise ColumnError(name, str(e)) from None
        return col

    def _value(
        self, value: Any, info: ValueInfo, per_row: bool, what: str, written: bool = False
    ) -> Any:
        """One row's value of a ragged column, converted (``InputError`` if it cannot be)."""
        if value is None:
            raise InputError(f"{what}: the row has no value (None)")
        if isinstance(value, _Rounded):
            raise InputError(
                f"{what}: the integer {value.value:.0f} reached the method as a float "
                "(Ray hands an integer column with nulls over as floats), past 2**53, where "
                "a float may have rounded it: it cannot be trusted"
            )
        if not isinstance(info, TensorInfo):
            return _scalar(value, info, what)
        if not isinstance(value, torch.Tensor) and not hasattr(value, "__dlpack__"):
            value = np.asarray(value)
        t = _tensor(value, what)
        problem = _shape_problem(info, tuple(t.shape), per_row)
        if problem is not None:
            raise InputError(
                f"{what}: the row has shape {list(t.shape)}; the input is {_describe(info)} "
                f"({problem})"
            )
        t = t.unsqueeze(0)
        return self._convert(t, info, per_row, _readonly(value) or written, what)[0]

    def _convert(
        self, t: torch.Tensor, info: TensorInfo, per_row: bool, readonly: bool, what: str
    ) -> torch.Tensor:
        """``t`` (rows along dim 0) in the input's dtype, on its device, in its layout;
        ``readonly``: its memory is not for the method to write (a copy is made)."""
        if t.dtype != info.dtype:
            if not _can_cast(t.dtype, info.dtype, self._cast):
                raise InputError(
                    f"{what} is {_name(t.dtype)}; the method's input is {_describe(info)}, "
                    f"and cast='{self._cast}' does not convert {_name(t.dtype)} to "
                    f"{_name(info.dtype)}"
                )
            cast = t.to(info.dtype)
            if self._cast == "same_kind" and not _kept_values(t, cast):
                raise InputError(
                    f"{what} is {_name(t.dtype)}; the method's input is {_describe(info)}, "
                    f"and some values change in {_name(info.dtype)} (out of its range or "
                    "precision); convert the column, or pass cast='unsafe'"
                )
            t = cast
            readonly = False
        device = info.device.to_torch()
        if t.device != device:
            t = t.to(device)
            readonly = False
        laid = _in_layout(t, info, per_row)
        if laid is t and readonly and not info.is_memory_planned:
            # the method reads (and may write) unplanned inputs in place: not read-only memory
            laid = t.clone()
        return laid

    # -- calls -----------------------------------------------------------------------------
    def _args(self, cols: list[_Column], select: Callable[[_Column], Any]) -> list[Any]:
        args: list[Any] = [None] * len(self._specs)
        for index, value in self._constants.items():
            args[index] = value
        for col in cols:
            args[col.spec.index] = select(col)
        return args

    def _run_batched(
        self,
        got: _Outputs,
        positions: Sequence[int],
        group: list[_Column],
        errors: dict[int, BaseException | str],
        batch: Mapping[str, Any],
    ) -> None:
        size, _ = self._rows_per_call()
        count = len(positions)
        step = size or max(count, 1)
        for lo in range(0, count, step):
            hi = min(lo + step, count)
            self._run(got, positions[lo:hi], group, range(lo, hi), True, errors, batch)

    def _rows_per_call(self) -> tuple[int | None, bool]:
        """(rows per call or None for any number, whether a short chunk is padded)."""
        if self._chunking is None:
            self._chunking = self._chunk_rule()
        return self._chunking

    def _chunk_rule(self) -> tuple[int | None, bool]:
        static: set[int] = set()
        bounds: list[int] = []
        for spec in self._columns:
            info = spec.info
            if isinstance(info, TensorInfo):
                if info.dynamism == "static":
                    static.add(info.sizes[0])
                elif info.dynamism == "dynamic_bound":
                    bounds.append(info.sizes[0])
        if len(static) > 1:
            raise ColumnError(
                self._columns[0].column or "",
                f"the inputs of '{self._method}' take different numbers of rows per call "
                f"({sorted(static)}); batched inputs must agree on dim 0",
            )
        if static:
            size = static.pop()
            if size < 1:
                raise ColumnError(
                    self._columns[0].column or "",
                    f"'{self._method}' takes 0 rows per call: no row can reach it",
                )
            return size, True
        if bounds:
            return max(min(bounds), 1), self._pad_always
        return None, False

    def _refuse_padding(self, size: int, rows: int) -> NoReturn:
        raise ColumnError(
            self._columns[0].column or "",
            f"'{self._method}' takes {size} rows per call and carries state from call to "
            f"call; a call of {rows} row(s) would need {size - rows} padding row(s), which "
            f"would change its state. Give it batches of a multiple of {size} rows",
        )

    def _run(
        self,
        got: _Outputs,
        positions: Sequence[int],
        cols: list[_Column],
        rows: Sequence[int],
        batched: bool,
        errors: dict[int, BaseException | str],
        batch: Mapping[str, Any],
    ) -> None:
        """Call the method for ``rows`` of ``cols`` (batch ``positions``), gather outputs."""
        lo, hi = rows[0], rows[-1] + 1
        need = 0
        if batched:
            size, pad = self._rows_per_call()
            if pad and size is not None:
                need = size - (hi - lo)
            if need > 0 and not self._allow_padding:
                assert size is not None
                self._refuse_padding(size, hi - lo)

            def select(col: _Column) -> Any:
                assert col.regular is not None
                t = col.regular[lo:hi]
                if need > 0:
                    last = t[-1:]
                    t = torch.cat([t, last.expand(need, *last.shape[1:])])
                return t

        else:

            def select(col: _Column) -> Any:
                if col.regular is not None:
                    return col.regular[lo]
                assert col.rows is not None
                return col.rows[positions[0]]

        args = self._args(cols, select)
        stats = self.stats
        stats.calls += 1
        stats.padded_rows += need
        try:
            values = self._execute(args)
        except _ROW_FAILURES as e:
            if len(rows) > 1 and self._isolate:
                stats.retried_rows += len(rows)
                for j, pos in zip(rows, positions, strict=True):
                    self._run(got, [pos], cols, [j], batched, errors, batch)
                return
            for pos in positions:
                errors[pos] = e
            if self._on_error == "raise":
                stats.failed_rows += len(positions)
                self._raise(positions[0], e, batch, len(positions))
            return
        if batched:
            self._check_batched(values, hi - lo + need)
        got.add(positions, values, batched)

    def _check_batched(self, values: list[Any], rows: int) -> None:
        for k, (name, value) in enumerate(zip(self._outputs, values, strict=True)):
            if name is None:
                continue
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != rows:
                what = (
                    f"a {list(value.shape)} tensor"
                    if isinstance(value, torch.Tensor)
                    else f"the {type(value).__name__} {value!r}"
                )
                raise ColumnError(
                    name,
                    f"output {k} of '{self._method}' (column '{name}') is {what} for a call of "
                    f"{rows} rows; only outputs with the rows along dim 0 become columns "
                    "(pass None for it in outputs to drop it)",
                )

    def _raise(
        self,
        row: int,
        cause: BaseException | str,
        batch: Mapping[str, Any],
        count: int = 1,
    ) -> None:
        ident = self._ident(batch, row)
        message = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        err = RowError(row, ident, message, count)
        if isinstance(cause, BaseException):
            raise err from cause
        raise err

    def _ident(self, batch: Mapping[str, Any], row: int) -> Any:
        if self._id_column is None or self._id_column not in batch:
            return None
        value = batch[self._id_column][row]
        return value.item() if isinstance(value, np.generic | torch.Tensor) else value

    # -- outputs -> columns ----------------------------------------------------------------
    def _result(
        self,
        batch: Mapping[str, Any],
        n: int,
        got: _Outputs,
        errors: dict[int, BaseException | str],
        per_row: bool,
    ) -> dict[str, np.ndarray]:
        result: dict[str, np.ndarray] = {}
        keep = self._keep
        names = list(batch) if keep is True else [] if keep is False else list(keep)
        for name in names:
            if name not in batch:
                raise ColumnError(name, f"keep_columns names '{name}', which the batch lacks")
            if self._on_error == "record" and name == self._error_column:
                raise ColumnError(
                    name,
                    f"the batch has a column '{name}', which error_column would overwrite; "
                    "give error_column another name or leave that column out of keep_columns",
                )
            result[name] = _numpy_column(batch[name])
        for k, out in enumerate(self._outputs):
            if out is not None:
                info = self._output_infos[k]
                result[out] = _output_column(got.parts[k], n, errors, info, per_row)
        if self._on_error == "record":
            col = np.empty(n, dtype=object)
            for i in range(n):
                e = errors.get(i)
                col[i] = (
                    None if e is None else e if isinstance(e, str) else f"{type(e).__name__}: {e}"
                )
            result[self._error_column] = col
        return result


# ------------------------------------------------------------------------------------------
# the mapping, checked once


def check_mapping(
    method: str,
    input_infos: Sequence[ValueInfo],
    output_infos: Sequence[ValueInfo],
    inputs: Sequence[Any],
    outputs: Sequence[str | None],
    *,
    on_error: OnError = "raise",
    error_column: str = "error",
    id_column: str | None = None,
    keep_columns: bool | Sequence[str] = True,
) -> None:
    """Raise :class:`ColumnError` unless ``inputs``/``outputs`` fit the method's counts
    and, under ``on_error="record"``, ``error_column`` names no column the mapping uses."""
    if isinstance(inputs, str) or isinstance(outputs, str):
        raise TypeError("inputs and outputs are lists of column names, not one string")
    if len(inputs) != len(input_infos):
        shown = ", ".join(str(i) for i in input_infos)
        raise ColumnError(
            "",
            f"'{method}' takes {len(input_infos)} input(s) ({shown}); inputs names "
            f"{len(inputs)}: {list(inputs)!r}",
        )
    if not any(isinstance(src, str) for src in inputs):
        raise ColumnError("", f"no input of '{method}' comes from a column: {list(inputs)!r}")
    if len(outputs) != len(output_infos):
        shown = ", ".join(str(o) for o in output_infos)
        raise ColumnError(
            "",
            f"'{method}' returns {len(output_infos)} output(s) ({shown}); outputs names "
            f"{len(outputs)}: {list(outputs)!r} (None drops an output)",
        )
    named = [o for o in outputs if o is not None]
    if not named:
        raise ColumnError("", f"outputs keeps none of the outputs of '{method}'")
    dup = sorted({o for o in named if named.count(o) > 1})
    if dup:
        raise ColumnError(dup[0], f"outputs names column '{dup[0]}' more than once")
    if on_error == "record":
        taken = {
            "an output column": set(named),
            "an input column": {src for src in inputs if isinstance(src, str)},
            "the id column": {id_column} if id_column is not None else set(),
            "a kept column": set() if isinstance(keep_columns, bool) else set(keep_columns),
        }
        for what, names in taken.items():
            if error_column in names:
                raise ColumnError(
                    error_column,
                    f"error_column '{error_column}' is also {what}: the errors would "
                    "overwrite it; give error_column another name",
                )


def default_outputs(count: int) -> list[str]:
    """``["output"]`` for one output, else ``["output_0", "output_1", ...]``."""
    return ["output"] if count == 1 else [f"output_{k}" for k in range(count)]


# ------------------------------------------------------------------------------------------
# helpers


def _columns_of(batch: Any) -> dict[str, Any]:
    """The batch as ``{name: column}``, each column a numpy array (an object array for
    rows that are separate arrays) or a torch tensor or DLPack producer as given."""
    if isinstance(batch, Mapping):
        items = list(batch.items())
    elif hasattr(batch, "columns") and hasattr(batch, "iloc"):  # a pandas DataFrame
        items = [(name, batch[name]) for name in batch.columns]
    else:
        raise TypeError(
            "a batch is a mapping of column name to column (batch_format='numpy') or a "
            f"pandas DataFrame, not {type(batch).__name__}"
        )
    return {str(name): _normalize(col) for name, col in items}


def _normalize(col: Any) -> Any:
    if isinstance(col, np.ndarray | torch.Tensor):
        return col
    if hasattr(col, "to_numpy") and not hasattr(col, "__dlpack__"):  # a pandas Series
        col = col.to_numpy()
        if isinstance(col, np.ndarray):
            return col
    if isinstance(col, list | tuple):
        if any(getattr(v, "ndim", 0) > 0 or isinstance(v, list | tuple) for v in col):
            out = np.empty(len(col), dtype=object)
            out[:] = [v if v is None or hasattr(v, "shape") else np.asarray(v) for v in col]
            return out
        return np.asarray(col)
    return col


def _num_rows(batch: Mapping[str, Any]) -> int:
    counts = {name: len(col) for name, col in batch.items()}
    if len(set(counts.values())) > 1:
        raise ColumnError(
            next(iter(counts)), f"the batch's columns have different lengths: {counts}"
        )
    return next(iter(counts.values()), 0)


def _is_ragged(raw: Any) -> bool:
    """A column whose rows are separate objects (an object array: variable shapes)."""
    return isinstance(raw, np.ndarray) and raw.dtype == object


def _as_list(raw: Any) -> list[Any]:
    return list(raw.tolist() if isinstance(raw, np.ndarray | torch.Tensor) else raw)


def _row_rank(raw: Any) -> int | None:
    """Dimensions of one row (None when unknown: a ragged column of only missing rows)."""
    if _is_ragged(raw):
        for value in raw:
            if value is not None:
                return int(getattr(value, "ndim", np.ndim(value)))
        return None
    shape = getattr(raw, "shape", None)
    return len(shape) - 1 if shape is not None else 0


def _readonly(raw: Any) -> bool:
    return isinstance(raw, np.ndarray) and not raw.flags.writeable


def _shape_problem(info: TensorInfo, row: tuple[int, ...], per_row: bool) -> str | None:
    """Why rows of shape ``row`` cannot fit ``info`` (None when they can)."""
    want = info.sizes if per_row else info.sizes[1:]
    if len(row) != len(want):
        return f"a row needs {len(want)} dimension(s), these have {len(row)}"
    if info.dynamism == "static":
        if row != want:
            return f"a row must be {list(want)}"
    elif info.dynamism == "dynamic_bound":
        over = [d for d, (s, b) in enumerate(zip(row, want, strict=True)) if s > b]
        if over:
            return f"row dimension {over[0]} is {row[over[0]]}, over its bound {want[over[0]]}"
    return None


def _can_cast(src: torch.dtype, dst: torch.dtype, rule: Cast) -> bool:
    if rule == "unsafe":
        return True
    if rule == "no":
        return False
    return bool(torch.can_cast(src, dst))


def _inexact(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _kept_values(src: torch.Tensor, cast: torch.Tensor) -> bool:
    """Whether ``cast`` (``src`` converted) holds ``src``'s values: integers exactly, floats
    (and complex numbers) within the new precision but no new infinity (nor NaN)."""
    if _inexact(cast.dtype) and _inexact(src.dtype):
        return bool((torch.isfinite(cast) | ~torch.isfinite(src)).all())
    if _inexact(cast.dtype):  # integers into floats: exactly representable
        back = (cast.real if cast.dtype.is_complex else cast).to(src.dtype)
        return bool((back == src).all()) and bool(torch.isfinite(cast).all())
    if not src.dtype.is_floating_point and src.dtype != torch.bool and src.numel():
        # integers into integers: within the range (a round trip through the new type
        # undoes a wrap: uint64's 2**63 became int64's -2**63 and back)
        limits = torch.iinfo(cast.dtype) if cast.dtype != torch.bool else None
        values = src.detach().cpu().numpy()  # (torch has no min of every unsigned type)
        low, high = int(values.min()), int(values.max())
        if limits is None:
            return low >= 0 and high <= 1
        return limits.min <= low and high <= limits.max
    wide = torch.float64 if src.dtype.is_floating_point else torch.int64
    if src.dtype == torch.uint64 or cast.dtype == torch.uint64:
        return bool((cast.to(src.dtype) == src).all())
    return bool((cast.to(wide) == src.to(wide)).all())


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _describe(info: TensorInfo) -> str:
    """``float32[2, 8] on cpu``; bounded dims as ``<=16``, an unbounded tensor by rank."""
    if info.dynamism == "dynamic_unbound":
        return f"{_name(info.dtype)}[rank {len(info.sizes)}] on {info.device}"
    mark = "<=" if info.dynamism == "dynamic_bound" else ""
    dims = ", ".join(f"{mark}{s}" for s in info.sizes)
    return f"{_name(info.dtype)}[{dims}] on {info.device}"


_SCALAR_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float, int),
    "bool": (bool,),
    "str": (str,),
}


# floats hold every integer up to this magnitude; past it, one may stand for several
_EXACT_FLOAT_INTEGERS = 2**53


class _Rounded:
    """The float an integer column's row arrived as, too large to tell which integer it
    was (:func:`_integer_of`); not a sequence, so numpy keeps it one row's object."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


def _integer_of(v: float) -> Any:
    """An integer column's row that arrived as the float ``v`` (Ray's floats for a column
    with nulls): the integer, while floats hold every integer of its magnitude; else a
    :class:`_Rounded` (the row's error); a fraction stays a float (refused as any float
    row of an integer input is)."""
    if not v.is_integer():
        return v
    if abs(v) > _EXACT_FLOAT_INTEGERS:
        return _Rounded(v)
    return int(v)


def _takes_integers(info: ValueInfo) -> bool:
    """Whether an input holds integers only (no NaN): an integer tensor or an int scalar."""
    if isinstance(info, ScalarInfo):
        return info.kind == "int"
    dtype = info.dtype
    return not (dtype.is_floating_point or dtype.is_complex or dtype is torch.bool)


def _scalar(value: Any, info: ValueInfo, what: str) -> Any:
    """A row's value for a scalar input, as the Python type the method takes."""
    if isinstance(value, np.generic | torch.Tensor):
        value = value.item()
    assert isinstance(info, ScalarInfo)
    kinds = _SCALAR_TYPES.get(info.kind)
    if kinds is None:
        raise InputError(f"{what}: the method's input is {info.kind}; no column can give it")
    if isinstance(value, bool) and info.kind != "bool":
        raise InputError(f"{what}: a bool row for a {info.kind} input")
    if not isinstance(value, kinds):
        raise InputError(f"{what}: a {type(value).__name__} row for a {info.kind} input")
    return float(value) if isinstance(value, int) and info.kind == "float" else value


def _constant(spec: _Input, method: str) -> Any:
    """A constant input, converted once: tensors on the input's device in its dtype."""
    info = spec.info
    value = spec.constant
    if not isinstance(info, TensorInfo):
        return _scalar(value, info, f"constant input {spec.index} of '{method}'")
    if not isinstance(value, torch.Tensor) and not hasattr(value, "__dlpack__"):
        value = np.asarray(value)
    t = _tensor(value, f"constant input {spec.index} of '{method}'")
    return t.to(device=info.device.to_torch(), dtype=info.dtype).contiguous()


def _tensor(value: Any, what: str) -> torch.Tensor:
    """``value`` as a torch tensor (a view); :class:`InputError` for an array torch cannot
    view (numpy's other byte order), as the method says of one."""
    try:
        t, _ = to_torch(value, what)
    except PtexecError:
        raise
    except ValueError as e:
        raise InputError(f"{what}: torch cannot read it ({e})") from None
    return t


def _in_layout(t: torch.Tensor, info: TensorInfo, per_row: bool) -> torch.Tensor:
    """``t`` (rows along dim 0) laid out in the input's dim order (a copy only if needed),
    so that every call gets its input as the method lays it out."""
    order = info.dim_order or tuple(range(len(info.sizes)))
    if per_row:
        order = (0, *(d + 1 for d in order))
    shape = tuple(t.shape)
    want = dim_order_strides(shape, order)
    if all(s == w or n == 1 for s, w, n in zip(t.stride(), want, shape, strict=True)):
        return t
    return torch.empty_strided(shape, want, dtype=t.dtype, device=t.device).copy_(t)


def _groups(
    cols: list[_Column], good: Sequence[int], in_order: bool = False
) -> list[tuple[Sequence[int], list[_Column]]]:
    """The rows of a batch in groups of equal shapes, each as regular columns; with
    ``in_order`` (calls carry state) only runs of consecutive rows, so the rows are still
    run in the batch's order."""
    ragged = [c for c in cols if c.rows is not None]
    if not ragged:
        return [(good, cols)] if good else []
    runs: list[list[int]] = []
    by_shape: dict[tuple[tuple[int, ...], ...], list[int]] = {}
    last: tuple[tuple[int, ...], ...] | None = None
    for i in good:
        key = tuple(tuple(c.rows[i].shape) for c in ragged if c.rows is not None)
        if in_order:
            if key != last or not runs:
                runs.append([])
            runs[-1].append(i)
            last = key
        else:
            by_shape.setdefault(key, []).append(i)
    groups: list[tuple[Sequence[int], list[_Column]]] = []
    for rows in runs if in_order else list(by_shape.values()):
        group = []
        for c in cols:
            g = _Column(c.spec)
            if c.regular is not None:
                g.regular = c.regular[rows] if len(rows) != c.regular.shape[0] else c.regular
            else:
                assert c.rows is not None and isinstance(c.spec.info, TensorInfo)
                g.regular = _in_layout(torch.stack([c.rows[i] for i in rows]), c.spec.info, False)
            group.append(g)
        groups.append((rows, group))
    return groups


def _in_order(positions: list[Sequence[int]], n: int) -> bool:
    """Whether ``positions``, one after the other, are exactly ``0, 1, ..., n - 1``."""
    nxt = 0
    for p in positions:
        if not isinstance(p, range) or p.step != 1:
            return [pos for q in positions for pos in q] == list(range(n))
        if p.start != nxt:
            return False
        nxt = p.stop
    return nxt == n


def _fill(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    return False if dtype == torch.bool else 0


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:  # numpy (and Arrow) have no bfloat16: widened, exactly
        t = t.float()
    return t.cpu().numpy()


def _numpy_column(raw: Any) -> np.ndarray:
    if isinstance(raw, np.ndarray):
        return raw
    if isinstance(raw, torch.Tensor):
        return _to_numpy(raw)
    if hasattr(raw, "__dlpack__"):
        return _to_numpy(to_torch(raw, "column")[0])
    return np.asarray(raw)


def _output_column(
    parts: list[tuple[Sequence[int], Any]],
    n: int,
    errors: Mapping[int, Any],
    info: ValueInfo,
    per_row: bool,
) -> np.ndarray:
    """One output column of ``n`` rows from the pieces the calls produced."""
    tensors = [v for _, v in parts if isinstance(v, torch.Tensor)]
    if len(tensors) != len(parts):  # scalars (one call per row)
        scalars: list[Any] = [None] * n
        for positions, values in parts:
            for pos, v in zip(positions, values, strict=True):
                scalars[pos] = v
        kind = info.kind if isinstance(info, ScalarInfo) else "none"
        fill = {"float": math.nan, "int": 0, "bool": False}.get(kind)
        for pos in errors:
            scalars[pos] = fill
        if any(v is None for v in scalars):
            col = np.empty(n, dtype=object)
            col[:] = scalars
            return col
        return np.asarray(scalars)
    if not tensors:
        if not isinstance(info, TensorInfo):
            return np.full(n, None, dtype=object)
        rest = info.sizes if per_row else info.sizes[1:]
        # a bounded output batched: its rows are at most the bound's, which good rows
        # of a method bounded only along dim 0 (the common case) have exactly
        unbound = info.dynamism == "dynamic_unbound"
        if n and (unbound or (per_row and info.dynamism != "static")):
            return np.full(n, None, dtype=object)
        dtype = torch.float32 if info.dtype == torch.bfloat16 else info.dtype
        return _to_numpy(torch.full((n, *rest), _fill(dtype), dtype=dtype))
    shapes = {tuple(t.shape[1:]) for t in tensors}
    if len(shapes) == 1:
        whole = torch.cat(tensors) if len(tensors) > 1 else tensors[0]
        if _in_order([positions for positions, _ in parts], n):
            return _to_numpy(whole)
        order = [pos for positions, _ in parts for pos in positions]
        out = torch.full(
            (n, *whole.shape[1:]), _fill(whole.dtype), dtype=whole.dtype, device=whole.device
        )
        out[torch.as_tensor(order, device=whole.device)] = whole
        return _to_numpy(out)
    col = np.empty(n, dtype=object)
    for positions, t in parts:
        values = _to_numpy(t)
        for j, pos in enumerate(positions):
            col[pos] = values[j]
    return col
