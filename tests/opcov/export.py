"""Export coverage cases to ``.pte`` with ExecuTorch's own exporter, with an on-disk cache.

For a (case, dtype) pair this produces the program file, the example inputs and the eager
PyTorch outputs (flattened the way ExecuTorch returns them), plus the operator names recorded in
the program's execution plan. Results are cached under ``cache_dir()`` keyed by a digest of the
case definition, the dtype, and the torch/executorch versions, so an unchanged case is exported
once.

Cache directory: ``$PTEXEC_OPCOV_CACHE`` if set, else ``<system temp dir>/ptexec-opcov-<uid>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from .spec import DTYPE_NAMES, DTYPES_BY_NAME, Case, FnModule

# Bump when the layout of cached entries or the export recipe changes.
CACHE_FORMAT = 3
CACHE_ENV = "PTEXEC_OPCOV_CACHE"


def executorch_version() -> str:
    from executorch.version import __version__

    return str(__version__)


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    if override is not None:
        d = Path(override)
    elif os.environ.get(CACHE_ENV):
        d = Path(os.environ[CACHE_ENV])
    else:
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        d = Path(tempfile.gettempdir()) / f"ptexec-opcov-{uid}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def cache_key(case: Case, dtype: torch.dtype) -> str:
    h = hashlib.sha256()
    for part in (
        case.fingerprint(dtype),
        executorch_version(),
        torch.__version__,
        str(CACHE_FORMAT),
    ):
        h.update(part.encode())
        h.update(b"\x00")
    return h.hexdigest()[:32]


@dataclass
class Exported:
    case: str
    dtype: torch.dtype
    pte_path: Path
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    operators: list[str]  # "namespace::name.overload" (".overload" omitted when empty)
    export_seconds: float  # wall clock
    export_cpu_seconds: float  # CPU time of the exporting process
    cached: bool

    @property
    def id(self) -> str:
        return f"{self.case}-{DTYPE_NAMES[self.dtype]}"


def program_operators(data: bytes) -> list[str]:
    """Operator names in the first execution plan of a serialized program."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(data)
    program = getattr(pte, "program", pte)
    ops = []
    for op in program.execution_plan[0].operators:
        ops.append(f"{op.name}.{op.overload}" if op.overload else op.name)
    return ops


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    leaves = tree_leaves(out)
    res = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            res.append(leaf.detach().clone())
        else:
            res.append(torch.tensor(leaf))
    return res


_SPEEDUPS_INSTALLED = False


def _install_export_speedups() -> None:
    """Make repeated exports in one process cheaper without changing what they produce.

    ``ExportedProgram.run_decompositions`` re-walks the whole operator registry (every
    CompositeImplicitAutograd op) on every call, which costs more than decomposing one small
    graph. Nothing registers operators while coverage cases export, so the walk's result is
    memoised per process. (Exported bytes were checked to be identical with and without.)
    """
    global _SPEEDUPS_INSTALLED
    if _SPEEDUPS_INSTALLED:
        return
    _SPEEDUPS_INSTALLED = True
    try:
        import torch.export.decomp_utils as decomp_utils
        import torch.export.exported_program as exported_program
    except ImportError:
        return
    original = getattr(exported_program, "_collect_all_valid_cia_ops", None)
    if (
        original is None
        or getattr(decomp_utils, "_collect_all_valid_cia_ops", None) is not original
    ):
        return
    cache: list[Any] = []

    def collect_once() -> Any:
        if not cache:
            cache.append(original())
        return cache[0]

    exported_program._collect_all_valid_cia_ops = collect_once  # type: ignore[attr-defined]
    decomp_utils._collect_all_valid_cia_ops = collect_once  # type: ignore[attr-defined]


def _export_program(
    case: Case, dtype: torch.dtype
) -> tuple[bytes, list[torch.Tensor], list[torch.Tensor]]:
    """torch.export -> to_edge (core ATen decompositions, no delegates) -> to_executorch."""
    from executorch.exir import EdgeCompileConfig, to_edge

    _install_export_speedups()
    module = case.build(dtype)
    inputs = case.make_inputs(dtype)
    eager_inputs = [t.clone() for t in inputs]
    with torch.no_grad():
        user_outputs = flatten_outputs(module(*eager_inputs))
    dynamic_shapes = case.dynamic_shapes()
    if dynamic_shapes is not None and isinstance(module, FnModule):
        dynamic_shapes = (dynamic_shapes,)  # forward(*args): one positional, a tuple
    ep = torch.export.export(
        module, tuple(t.clone() for t in inputs), dynamic_shapes=dynamic_shapes
    )
    edge = to_edge(ep, compile_config=EdgeCompileConfig(preserve_ops=case.preserve_ops()))
    program = edge.to_executorch()
    expected = _program_order(
        program.exported_program().graph_signature, eager_inputs, user_outputs
    )
    return bytes(program.buffer), inputs, expected


def _program_order(
    signature: Any, eager_inputs: list[torch.Tensor], user_outputs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Eager results in the order the program returns them.

    A program returns, besides the user outputs, the new value of every user input the model
    mutates in place (buffer mutations stay internal), in the graph signature's order.
    """
    from torch.export.graph_signature import OutputKind

    user_inputs = list(signature.user_inputs)
    expected = []
    outs = iter(user_outputs)
    for spec in signature.output_specs:
        if spec.kind == OutputKind.BUFFER_MUTATION:
            continue
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            expected.append(eager_inputs[user_inputs.index(spec.target)].detach().clone())
        else:
            expected.append(next(outs))
    rest = list(outs)
    if rest:
        raise RuntimeError(f"{len(rest)} eager outputs have no place in the program's outputs")
    return expected


def _paths(cache: Path, key: str) -> tuple[Path, Path, Path]:
    return cache / f"{key}.pte", cache / f"{key}.pt", cache / f"{key}.json"


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def export_case(
    case: Case, dtype: torch.dtype, cache: str | os.PathLike[str] | None = None, force: bool = False
) -> Exported:
    """Export (or fetch from the cache) one case at one dtype."""
    if dtype not in case.dtypes:
        raise ValueError(f"case {case.name!r} does not apply to {dtype}")
    root = cache_dir(cache)
    key = cache_key(case, dtype)
    pte, tensors, meta = _paths(root, key)
    if not force and pte.exists() and tensors.exists() and meta.exists():
        try:
            info = json.loads(meta.read_text())
            saved = torch.load(tensors, weights_only=True)
            return Exported(
                case.name,
                dtype,
                pte,
                list(saved["inputs"]),
                list(saved["outputs"]),
                list(info["operators"]),
                float(info["export_seconds"]),
                float(info["export_cpu_seconds"]),
                cached=True,
            )
        except Exception:  # a damaged entry is simply rebuilt
            pass
    t0, c0 = time.perf_counter(), time.process_time()
    data, inputs, outputs = _export_program(case, dtype)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    operators = program_operators(data)
    _atomic_write(pte, data)
    import io

    buf = io.BytesIO()
    torch.save({"inputs": inputs, "outputs": outputs}, buf)
    _atomic_write(tensors, buf.getvalue())
    info = {
        "case": case.name,
        "dtype": DTYPE_NAMES[dtype],
        "operators": operators,
        "export_seconds": seconds,
        "export_cpu_seconds": cpu_seconds,
        "executorch": executorch_version(),
        "torch": torch.__version__,
    }
    # The metadata file is written last: its presence marks a complete entry.
    _atomic_write(meta, json.dumps(info, indent=1).encode())
    return Exported(
        case.name, dtype, pte, inputs, outputs, operators, seconds, cpu_seconds, cached=False
    )


def all_pairs(cases: Iterable[Case]) -> list[tuple[Case, torch.dtype]]:
    return [(c, d) for c in cases for d in c.dtypes]


def _worker_init() -> None:
    import gc

    torch.set_num_threads(1)
    import executorch.exir  # noqa: F401  (import before freezing)

    _install_export_speedups()
    # The long-lived objects of torch/executorch dominate the heap; keeping them out of the
    # collector's reach halves the time an export spends in garbage collection.
    gc.freeze()


def _worker(case_name: str, dtype_name: str, cache: str) -> tuple[str, str, float, str | None]:
    from .cases import TABLE

    t0 = time.perf_counter()
    try:
        export_case(TABLE[case_name], DTYPES_BY_NAME[dtype_name], cache)
        return case_name, dtype_name, time.perf_counter() - t0, None
    except Exception as e:
        return case_name, dtype_name, time.perf_counter() - t0, f"{type(e).__name__}: {e}"


def export_all(
    pairs: Sequence[tuple[Case, torch.dtype]],
    cache: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: bool = False,
) -> dict[tuple[str, str], str | None]:
    """Export every pair not yet cached, in parallel. Returns {(case, dtype): error or None}.

    Cases must come from ``cases.TABLE`` (workers look them up by name).
    """
    root = cache_dir(cache)
    todo = []
    results: dict[tuple[str, str], str | None] = {}
    for case, dtype in pairs:
        _, _, meta = _paths(root, cache_key(case, dtype))
        if meta.exists():
            results[(case.name, DTYPE_NAMES[dtype])] = None
        else:
            todo.append((case.name, DTYPE_NAMES[dtype]))
    if not todo:
        return results
    jobs = jobs or min(len(todo), os.cpu_count() or 1)
    if jobs <= 1:
        for name, dname in todo:
            _, _, _, err = _worker(name, dname, str(root))
            results[(name, dname)] = err
        return results
    ctx = get_context("spawn")
    done = 0
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init) as pool:
        futs = [pool.submit(_worker, name, dname, str(root)) for name, dname in todo]
        for fut in as_completed(futs):
            name, dname, secs, err = fut.result()
            results[(name, dname)] = err
            done += 1
            if progress:
                status = "ok" if err is None else f"FAILED {err.splitlines()[0][:200]}"
                print(f"[{done}/{len(todo)}] {name}[{dname}] {secs:.2f}s {status}", flush=True)
    return results


__all__ = [
    "CACHE_ENV",
    "Exported",
    "all_pairs",
    "cache_dir",
    "cache_key",
    "executorch_version",
    "export_all",
    "export_case",
    "flatten_outputs",
    "program_operators",
]
