"""ExecuTorch's own Python-runtime tests, from the installed 1.5.1 wheel, run against ptexec.

The test modules are the wheel's files, unchanged: ``executorch/runtime/test/`` and
``executorch/extension/pybindings/test/`` (and the bundled-program end-to-end test), read
with ``executorch.runtime`` resolved to :mod:`ptexec.runtime` and
``executorch.extension.pybindings.portable_lib`` to :mod:`ptexec.portable_lib`. The names
stay aliased while these tests run (their ``setUp`` imports ``portable_lib`` again) and
are restored afterwards, so the rest of the suite compares against ExecuTorch's runtime.
The exporter is ExecuTorch's own, with its quantized operator library loaded as
ExecuTorch's CI loads it (two of the tests export quantized programs).

Only the test that needs a CUDA build of ExecuTorch (``CudaBackend``) skips itself.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # about a minute: the wheel's tests export every program they run

executorch = pytest.importorskip("executorch")
pytest.importorskip("executorch.exir")

import ptexec.portable_lib  # noqa: E402
import ptexec.runtime  # noqa: E402

with contextlib.suppress(ImportError):
    import executorch.kernels.quantized

_ROOT = Path(next(iter(executorch.__path__)))
_MODULES = {
    "test_runtime": "runtime/test/test_runtime.py",
    "test_runtime_etdump_gen": "runtime/test/test_runtime_etdump_gen.py",
    "test_runtime_xnnpack": "runtime/test/test_runtime_xnnpack.py",
    "test_pybindings": "extension/pybindings/test/test_pybindings.py",
    "test_backend_pybinding": "extension/pybindings/test/test_backend_pybinding.py",
    "test_bundled_end2end": "devtools/bundled_program/test/test_end2end.py",
}
_ALIASES = {
    "executorch.runtime": (ptexec.runtime, "executorch", "runtime"),
    "executorch.extension.pybindings.portable_lib": (
        ptexec.portable_lib,
        "executorch.extension.pybindings",
        "portable_lib",
    ),
}


@contextlib.contextmanager
def _aliased() -> Iterator[None]:
    """``executorch.runtime`` and ``portable_lib`` resolve to ptexec's modules, both in
    ``sys.modules`` and as attributes of their packages (``from pkg import mod`` reads
    the attribute first)."""
    saved: list[tuple[str, object, types.ModuleType, object]] = []
    missing = object()
    for name, (module, parent_name, attr) in _ALIASES.items():
        parent = importlib.import_module(parent_name)
        saved.append(
            (name, sys.modules.get(name, missing), parent, parent.__dict__.get(attr, missing))
        )
        sys.modules[name] = module
        setattr(parent, attr, module)
    try:
        yield
    finally:
        for name, old, parent, old_attr in saved:
            if old is missing:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old  # type: ignore[assignment]
            attr = name.rsplit(".", 1)[1]
            if old_attr is missing:
                parent.__dict__.pop(attr, None)
            else:
                setattr(parent, attr, old_attr)


def _load(key: str, relative: str) -> types.ModuleType:
    path = _ROOT / relative
    spec = importlib.util.spec_from_file_location(f"executorch_wheel_tests.{key}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


with _aliased():
    _loaded = {key: _load(key, rel) for key, rel in _MODULES.items() if (_ROOT / rel).exists()}

assert _loaded["test_runtime"].Runtime is ptexec.runtime.Runtime  # the alias took

# the wheel's test classes, collected here
RuntimeTest = _loaded["test_runtime"].RuntimeTest
RuntimeETDumpGenTest = _loaded["test_runtime_etdump_gen"].RuntimeETDumpGenTest
RuntimeXNNPACKTest = _loaded["test_runtime_xnnpack"].RuntimeXNNPACKTest
PybindingsTest = _loaded["test_pybindings"].PybindingsTest
TestBackendsPybinding = _loaded["test_backend_pybinding"].TestBackendsPybinding
if "test_bundled_end2end" in _loaded:
    BundledProgramE2ETest = _loaded["test_bundled_end2end"].BundledProgramE2ETest


@pytest.fixture(autouse=True, scope="module")
def _ptexec_as_executorch() -> Iterator[None]:
    with _aliased():
        yield


def test_the_aliases_reach_ptexec() -> None:
    """What the wheel's tests import while they run is ptexec (and not afterwards)."""
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    assert portable_lib is ptexec.portable_lib and Runtime is ptexec.runtime.Runtime
