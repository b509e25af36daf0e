"""``POST /v1/programs/{method}``: any method of a program over HTTP, micro-batched.

A request carries the method's inputs as the method takes them (dim 0 is the rows), as JSON
(``{"inputs": [[...], {"data": [...], "dtype": "float32"}, ...]}``), as one ``.npy``
(``Content-Type: application/x-npy``, a one-input method) or as safetensors
(``application/x-safetensors``, tensors named by input index ``"0"``, ``"1"``, ...). The
answer has the outputs in the same form (``.npy`` answers become safetensors when there is
more than one output).

By default each request is one call of the method on exactly its inputs, as ``execute``
takes them: the server cannot know whether a method's dim 0 is a batch of independent rows
(it may be a sequence the method sums, sorts or attends over), so it never mixes one
client's values into another's call. With ``join=True`` (``ptexec serve --join-rows``) the
operator says it is: requests for one method that arrive within ``window`` seconds of each
other are joined along dim 0 and run as one batch through :class:`ptexec.ray.Batcher`, the
rules of ``ptexec.ray``: a static dim 0 is filled by splitting and padding, a bounded one is
used up to its bound, and rows are retried alone when a joined call fails, so one bad
request fails alone. Each request gets back its own rows of every output. A method whose
inputs have no rows (scalars, rank 0) runs once per request. A method that keeps state
between calls (mutable buffers) is not served: its answers would depend on other clients'
requests. Calls of a method run on a thread of its own, never on the event loop; nothing
read from a request becomes code (``allow_pickle=False``).

JSON inputs are read as JSON gives them and converted to the method's dtype only where no
value changes (an integer input takes integers in its range, a bool input ``true``/``false``
or 0/1; a float input takes any number, rounded to its precision but not overflowing);
anything else is a 400. A non-finite float in a JSON answer is the string ``"nan"``,
``"inf"`` or ``"-inf"`` (JSON has no such numbers).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ..errors import InputError, PtexecError
from .protocol import ApiError

__all__ = ["ProgramService", "decode_inputs", "encode_outputs"]

_DTYPES = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
    "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_,
}  # fmt: skip
NPY = "application/x-npy"
SAFETENSORS = "application/x-safetensors"


def _numpy_dtype(dtype: torch.dtype) -> Any:
    return torch.empty((), dtype=dtype).numpy().dtype


def decode_inputs(body: bytes, content_type: str, infos: Sequence[Any]) -> list[np.ndarray]:
    """The request's arrays, one per method input. Raises :class:`ApiError` (400)."""
    kind = content_type.split(";")[0].strip().lower()
    try:
        if kind == NPY:
            array = np.load(io.BytesIO(body), allow_pickle=False)
            if isinstance(array, np.ndarray) and not array.dtype.isnative:
                array = array.astype(array.dtype.newbyteorder("="))  # the same values
            arrays = [array]
        elif kind == SAFETENSORS:
            from safetensors.numpy import load

            named = load(body)
            arrays = [named[str(i)] for i in range(len(named))]
        else:
            doc = json.loads(body, parse_float=_finite_float)
            raw = doc.get("inputs") if isinstance(doc, dict) else None
            if not isinstance(raw, list):
                raise ApiError(400, "the body must be {'inputs': [...]}", param="inputs")
            if len(raw) != len(infos):
                raise ApiError(
                    400, f"the method takes {len(infos)} inputs, the request has {len(raw)}",
                    param="inputs",
                )  # fmt: skip
            arrays = [
                _json_array(item, info, i)
                for i, (item, info) in enumerate(zip(raw, infos, strict=True))
            ]
    except ApiError:
        raise
    except KeyError as e:
        raise ApiError(400, f"safetensors inputs are named 0, 1, ...: {e} is missing") from None
    except Exception as e:
        raise ApiError(
            400, f"unreadable inputs ({type(e).__name__}: {e})", param="inputs"
        ) from None
    if len(arrays) != len(infos):
        raise ApiError(
            400,
            f"the method takes {len(infos)} inputs, the request has {len(arrays)}",
            param="inputs",
        )
    return arrays


def _finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent; one past every float (``1e400``) is
    refused, never read as an infinity the client did not write."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text} is past the range of every float")
    return value


def _json_array(item: Any, info: Any, index: int) -> np.ndarray:
    dtype: Any = None
    data = item
    if isinstance(item, dict):
        data = item.get("data")
        name = item.get("dtype")
        if name is not None:
            if name not in _DTYPES:
                raise ApiError(400, f"inputs[{index}]: unknown dtype {name!r}", param="inputs")
            dtype = _DTYPES[name]
    if dtype is None and hasattr(info, "dtype"):
        dtype = _numpy_dtype(info.dtype)
    try:
        natural = np.asarray(data)
    except ValueError:
        natural = np.asarray(data, dtype=object)
    if natural.dtype.kind not in "biuf":
        raise ApiError(400, f"inputs[{index}] is not a regular array of numbers", param="inputs")
    if dtype is None:
        return natural
    if (
        np.dtype(dtype).kind in "iu"
        and natural.dtype.kind == "f"
        and natural.size
        and float(np.nanmax(np.abs(natural))) >= 2.0**53
    ):
        # a float among the numbers made numpy read every one as a float64, which holds
        # integers exactly only below 2**53: read each number as JSON gave it
        return _exact_integers(data, natural.shape, np.dtype(dtype), index)
    return _exact_cast(natural, np.dtype(dtype), index)


def _exact_integers(
    data: Any, shape: tuple[int, ...], dtype: np.dtype[Any], index: int
) -> np.ndarray:
    """The numbers of the nested lists ``data`` (``shape``, regular) as integers of
    ``dtype``, each exactly as written (a float only when it is a whole number); else a
    400."""
    flat = np.asarray(data, dtype=object).reshape(-1)
    info = np.iinfo(dtype)
    values: list[int] = []
    for v in flat.tolist():
        if isinstance(v, float) and math.isfinite(v) and v == math.floor(v):
            v = int(v)  # JSON's 1.0
        if not isinstance(v, int) or not info.min <= v <= info.max:
            raise ApiError(
                400,
                f"inputs[{index}]: the values do not fit the method's {dtype} input without "
                "changing",
                param="inputs",
            )
        values.append(v)
    return np.array(values, dtype=dtype).reshape(shape)


def _exact_cast(a: np.ndarray, dtype: np.dtype[Any], index: int) -> np.ndarray:
    """``a`` as ``dtype`` when no value changes but a float's rounding; else a 400."""
    if a.dtype == dtype:
        return a
    where = f"inputs[{index}]"
    with np.errstate(all="ignore"):
        out = a.astype(dtype)
        if dtype.kind == "b":
            ok = a.dtype.kind == "b" or bool(np.isin(a, (0, 1)).all())
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            if a.dtype.kind in "biu":
                ok = a.size == 0 or (int(a.min()) >= info.min and int(a.max()) <= info.max)
            else:  # integral floats (JSON's 1.0) within range
                ok = a.size == 0 or (
                    bool(np.isfinite(a).all())
                    and bool((np.floor(a) == a).all())
                    and float(a.min()) >= info.min
                    and float(a.max()) < float(info.max) + 1.0  # (2**63 as a float: out)
                )
        else:  # float: rounded, but not to an infinity the value was not
            ok = bool((np.isfinite(out) | ~np.isfinite(a.astype(np.float64))).all())
    if not ok:
        raise ApiError(
            400,
            f"{where}: the values do not fit the method's {dtype} input without changing",
            param="inputs",
        )
    return out


def encode_outputs(outputs: Sequence[np.ndarray], kind: str) -> tuple[bytes, str]:
    """The outputs as a body of the request's kind: (bytes, content type)."""
    if kind == NPY and len(outputs) == 1:
        buf = io.BytesIO()
        np.save(buf, outputs[0], allow_pickle=False)
        return buf.getvalue(), NPY
    if kind in (NPY, SAFETENSORS):
        from safetensors.numpy import save

        return save({str(i): np.ascontiguousarray(o) for i, o in enumerate(outputs)}), SAFETENSORS
    doc = {
        "outputs": [
            {"data": _json_data(o), "dtype": str(o.dtype), "shape": list(o.shape)} for o in outputs
        ]
    }
    return json.dumps(doc, allow_nan=False).encode(), "application/json"


def _json_data(o: np.ndarray) -> Any:
    """``o`` as JSON values: a non-finite float as the string "nan", "inf" or "-inf"."""
    if o.dtype.kind != "f" or bool(np.isfinite(o).all()):
        return o.tolist()
    names = np.where(np.isnan(o), "nan", np.where(o > 0, "inf", "-inf"))
    return np.where(np.isfinite(o), o.astype(object), names.astype(object)).tolist()


class _Pending:
    __slots__ = ("arrays", "future", "rows")

    def __init__(self, arrays: list[np.ndarray], future: asyncio.Future[list[np.ndarray]]) -> None:
        self.arrays = arrays
        self.future = future
        self.rows = int(arrays[0].shape[0]) if arrays and arrays[0].ndim else 0


class _MethodQueue:
    """One loaded method, its batcher, its thread and its pending requests."""

    def __init__(self, service: ProgramService, name: str) -> None:
        from ..errors import StatefulMethodError
        from ..ray.batching import Batcher, default_outputs
        from ..ray.mapper import check_state, written_inputs

        try:
            check_state(service.program, name, "refuse")
        except StatefulMethodError as e:
            raise ApiError(
                400,
                f"method '{name}' is not served: it keeps state between calls, so its answers "
                f"would depend on other clients' requests ({e})",
                param="method",
                code="stateful_method",
            ) from None
        self.method = service.program.load_method(name, **service.load_options)
        meta = self.method.meta
        self.inputs = list(meta.inputs)
        self.outputs = list(meta.outputs)
        self.batchable = (
            service.join
            and bool(self.inputs)
            and all(hasattr(i, "sizes") and len(i.sizes) >= 1 for i in self.inputs)
        )
        self.columns = [f"input{i}" for i in range(len(self.inputs))]
        self.out_columns = default_outputs(len(self.outputs))
        self.batcher: Batcher | None = None
        if self.batchable:  # a method without row inputs is called once per request
            self.batcher = Batcher(
                self._execute, self.inputs, self.outputs, self.columns, self.out_columns,
                method=name, on_error="record", keep_columns=False,
                written_inputs=written_inputs(self.method),
            )  # fmt: skip
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"ptexec-{name}")
        self.pending: list[_Pending] = []
        self.flush_task: asyncio.Task[None] | None = None
        self.window = service.window
        self.max_rows = service.max_rows
        self.service = service

    def _execute(self, args: list[Any]) -> list[Any]:
        return list(self.method.execute(args))

    def submit(self, arrays: list[np.ndarray]) -> asyncio.Future[list[np.ndarray]]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[np.ndarray]] = loop.create_future()
        if not self.batchable:
            return loop.run_in_executor(self.executor, self._direct, arrays)
        for i, (a, info) in enumerate(zip(arrays, self.inputs, strict=True)):
            if a.ndim != len(info.sizes):
                raise ApiError(
                    400,
                    f"input {i} has {a.ndim} dims; the method takes {len(info.sizes)} "
                    f"({list(info.sizes)}, dim 0 the rows)",
                    param="inputs",
                )
            if a.shape[0] != arrays[0].shape[0]:
                raise ApiError(
                    400, "every input needs the same number of rows (dim 0)", param="inputs"
                )
        if arrays[0].shape[0] == 0:
            raise ApiError(400, "the inputs have no rows", param="inputs")
        self.pending.append(_Pending(arrays, fut))
        if sum(p.rows for p in self.pending) >= self.max_rows:
            self._flush_now()
        elif self.flush_task is None:
            self.flush_task = asyncio.ensure_future(self._flush_later())
        return fut

    def _direct(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        # a tensor input as a tensor of the request's own rank; a scalar input as a number
        args = [
            torch.from_numpy(np.array(a, order="C")) if hasattr(info, "sizes") else a.item()
            for a, info in zip(arrays, self.inputs, strict=True)
        ]
        try:
            out = self.method.execute(args)
        except (InputError, PtexecError) as e:
            raise ApiError(400, str(e), param="inputs") from None
        return [_to_numpy(o) for o in out]

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.window)
        self.flush_task = None
        self._flush_now()

    def _flush_now(self) -> None:
        if self.flush_task is not None:
            self.flush_task.cancel()
            self.flush_task = None
        batch, self.pending = self.pending, []
        if not batch:
            return
        loop = asyncio.get_running_loop()
        run = loop.run_in_executor(self.executor, self._run_batch, batch)

        def done(f: asyncio.Future[list[Any]]) -> None:
            try:
                results = f.result()
            except BaseException as e:
                results = [e] * len(batch)
            for p, r in zip(batch, results, strict=True):
                if p.future.done():
                    continue
                if isinstance(r, BaseException):
                    p.future.set_exception(r)
                else:
                    p.future.set_result(r)

        run.add_done_callback(done)

    def _run_batch(self, batch: list[_Pending]) -> list[Any]:
        """Runs on the method's thread: one Batcher call over the joined rows of each set
        of requests whose arrays have the same dtypes and row shapes (joined, one request's
        dtype would change another's)."""
        kinds: dict[tuple[Any, ...], list[int]] = {}
        for k, p in enumerate(batch):
            kinds.setdefault(tuple((a.dtype, a.shape[1:]) for a in p.arrays), []).append(k)
        out: list[Any] = [None] * len(batch)
        for ks in kinds.values():
            for k, r in zip(ks, self._run_joined([batch[k] for k in ks]), strict=True):
                out[k] = r
        return out

    def _run_joined(self, batch: list[_Pending]) -> list[Any]:
        start = time.perf_counter()
        columns = {
            name: np.concatenate([p.arrays[i] for p in batch])
            if all(p.arrays[i].shape[1:] == batch[0].arrays[i].shape[1:] for p in batch)
            else [row for p in batch for row in p.arrays[i]]
            for i, name in enumerate(self.columns)
        }
        assert self.batcher is not None
        try:
            result = self.batcher(columns)
        except PtexecError as e:  # a problem of every row (shape, dtype) or of one request's
            if len(batch) > 1:  # (values its dtype cannot take): each alone, so it is its own
                return [self._run_joined([p])[0] for p in batch]
            return [ApiError(400, str(e), param="inputs")]
        errors = result.get("error")
        out: list[Any] = []
        offset = 0
        for p in batch:
            rows = slice(offset, offset + p.rows)
            offset += p.rows
            bad = [e for e in (errors[rows] if errors is not None else []) if e is not None]
            if bad:
                out.append(
                    ApiError(400, f"the method refused the inputs: {bad[0]}", param="inputs")
                )
            else:
                out.append([np.asarray(result[c][rows]) for c in self.out_columns])
        self.service.metrics_batch(len(batch), offset, time.perf_counter() - start)
        return out

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: float32 holds it exactly
            t = t.float()
        return t.numpy()
    return np.asarray(value)


class ProgramService:
    """The methods of ``program`` served with micro-batching (see the module docstring).

    ``join``: the methods' dim 0 is a batch of independent rows, so requests may be joined
    (and padded) into one call; ``window``: seconds a request waits for others to join its
    batch; ``max_rows``: a batch is run at once when it reaches this many rows.
    ``load_options`` go to ``load_method``.
    """

    def __init__(
        self,
        program: Any,
        *,
        join: bool = False,
        window: float = 0.002,
        max_rows: int = 256,
        methods: Sequence[str] | None = None,
        **load_options: Any,
    ) -> None:
        self.program = program
        self.join = bool(join)
        self.window = float(window)
        self.max_rows = int(max_rows)
        self.load_options = load_options
        self.allowed = tuple(methods) if methods is not None else tuple(program.method_names)
        self.draining = False
        self.batches = 0
        self.batched_requests = 0
        self._queues: dict[str, _MethodQueue] = {}
        self._lock = threading.Lock()
        self._running = 0
        self._idle = asyncio.Event()

    def _queue(self, name: str) -> _MethodQueue:
        if name not in self.allowed:
            raise ApiError(
                404,
                f"no method '{name}' (methods: {', '.join(self.allowed)})",
                param="method",
                code="method_not_found",
            )
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _MethodQueue(self, name)
        return q

    def infos(self, name: str) -> list[Any]:
        return self._queue(name).inputs

    async def call(self, name: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The outputs of method ``name`` on one request's inputs (joined with others)."""
        if self.draining:
            raise ApiError(503, "the server is shutting down", "server_error", code="draining")
        fut = self._queue(name).submit(arrays)
        self._running += 1
        try:
            return await fut
        finally:
            self._running -= 1
            self._changed()

    def metrics_batch(self, requests: int, rows: int, seconds: float) -> None:
        with self._lock:
            self.batches += 1
            self.batched_requests += requests

    @property
    def idle(self) -> bool:
        return self._running == 0

    def _changed(self) -> None:
        if self.idle:
            self._idle.set()

    async def wait_idle(self) -> None:
        while not self.idle:
            self._idle.clear()
            await self._idle.wait()

    def close(self) -> None:
        for q in self._queues.values():
            q.close()
