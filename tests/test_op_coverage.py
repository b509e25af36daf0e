"""Breadth test: ptexec against eager PyTorch on single-op programs from ExecuTorch's exporter.

Every (case, dtype) in ``opcov.cases`` is exported to a ``.pte`` (cached, see ``opcov.export``),
run with ptexec and compared with eager PyTorch: integer and bool outputs exactly, floating
outputs within the case's tolerance with NaNs in the same places.

The cache lives in ``$PTEXEC_OPCOV_CACHE`` (default: a directory under the system temp dir).
Exports that are missing are produced up front in parallel (``$PTEXEC_OPCOV_JOBS`` processes,
default: one per CPU).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("executorch")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from opcov.cases import CASES, TABLE
from opcov.check import mismatch
from opcov.export import all_pairs, export_all, export_case
from opcov.spec import DTYPE_NAMES, DTYPES_BY_NAME

pytestmark = pytest.mark.slow

MIN_ATEN_OPERATORS = 150

PAIRS = [(case.name, DTYPE_NAMES[dtype]) for case, dtype in all_pairs(CASES)]


def _jobs() -> int | None:
    env = os.environ.get("PTEXEC_OPCOV_JOBS")
    return int(env) if env else None


def _export_errors(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
    return export_all([(TABLE[c], DTYPES_BY_NAME[d]) for c, d in pairs], jobs=_jobs())


@pytest.fixture(scope="session")
def _exported(request: pytest.FixtureRequest) -> None:
    """Export, in parallel, whatever the selected tests need and the cache lacks."""
    wanted = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "case_name" in callspec.params:
            wanted.append((callspec.params["case_name"], callspec.params["dtype_name"]))
    if wanted:
        _export_errors(wanted)  # failures resurface (with traceback) in their own test


@pytest.mark.parametrize(("case_name", "dtype_name"), PAIRS, ids=[f"{c}-{d}" for c, d in PAIRS])
def test_op_matches_eager(case_name: str, dtype_name: str, _exported: None) -> None:
    case = TABLE[case_name]
    exported = export_case(case, DTYPES_BY_NAME[dtype_name])

    import ptexec

    program = ptexec.load(str(exported.pte_path))
    method = program.load_method("forward")
    outputs = method.execute([t.clone() for t in exported.inputs])
    problem = mismatch(case, list(outputs), exported.outputs)
    assert problem is None, (
        f"{case_name}[{dtype_name}] ({', '.join(exported.operators)}): {problem}"
    )


def test_aten_operator_coverage() -> None:
    """The table exercises at least MIN_ATEN_OPERATORS distinct aten:: operators.

    Counted from the operator tables of the exported programs, not from the case list.
    """
    errors = {k: v for k, v in _export_errors(PAIRS).items() if v}
    assert not errors, f"{len(errors)} exports failed, e.g. {next(iter(errors.items()))}"
    aten = set()
    for case_name, dtype_name in PAIRS:
        exported = export_case(TABLE[case_name], DTYPES_BY_NAME[dtype_name])
        aten.update(op.split(".")[0] for op in exported.operators if op.startswith("aten::"))
    assert len(aten) >= MIN_ATEN_OPERATORS, sorted(aten)
