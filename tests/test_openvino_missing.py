"""An OpenVINO program where the openvino package is missing, and one made by another
OpenVINO (the fixture in tests/fixtures/openvino, made by scripts/make_openvino_fixtures.py)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from ptexec.errors import BackendUnavailableError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "openvino"
PTE = FIXTURE / "mlp.pte"


def _io() -> dict[str, Any]:
    return torch.load(FIXTURE / "mlp.io.pt", weights_only=True)  # type: ignore[no-any-return]


@pytest.fixture
def without_openvino(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "openvino" or m.startswith("openvino.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino: ImportError


def test_loading_says_what_to_install(without_openvino: None) -> None:
    prog = ptexec.load(PTE)  # the program itself reads without it
    assert prog.method_names == ("forward",) or list(prog.method_names) == ["forward"]
    with pytest.raises(BackendUnavailableError, match=r"pip install 'ptexec\[openvino\]'"):
        prog.load_method()


def test_the_backend_is_listed_but_not_available(without_openvino: None) -> None:
    """As ExecuTorch's registries answer where openvino is missing: OpenvinoBackend is
    registered, but not available (a script choosing a program by it picked the OpenVINO
    one, whose load then failed)."""
    from ptexec import portable_lib as pl
    from ptexec.runtime import Runtime

    registry = Runtime.get().backend_registry
    assert "OpenvinoBackend" in registry.registered_backend_names
    assert "OpenvinoBackend" in pl._get_registered_backend_names()
    assert not registry.is_available("OpenvinoBackend")
    assert not pl._is_available("OpenvinoBackend")
    assert registry.is_available("XnnpackBackend") and pl._is_available("VulkanBackend")
    if importlib.util.find_spec("executorch") is not None and not _really_installed():
        et = pytest.importorskip("executorch.extension.pybindings.portable_lib")
        for name in et._get_registered_backend_names():
            if name in pl._get_registered_backend_names():
                assert pl._is_available(name) == et._is_available(name), name


def _really_installed() -> bool:
    """Whether openvino is installed (the fixture only hides it from imports)."""
    try:
        importlib.metadata.distribution("openvino")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_inspect_shows_the_backend_and_who_made_the_payload(
    without_openvino: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptexec.cli import main

    made = _io()["openvino"].split("-")[0]
    assert main(["inspect", str(PTE)]) == 0
    out = capsys.readouterr().out
    assert "OpenvinoBackend" in out
    assert f"a compiled model of OpenVINO {made}" in out
    assert "run by OpenVINO's runtime" in out
    assert "does not run: any of it: the openvino package is not installed" in out


def test_the_payload_description_is_read_without_openvino() -> None:
    from ptexec.delegates.openvino.blob import blob_info
    from ptexec.format.pte import read_pte

    pte = read_pte(PTE.read_bytes())
    delegate = pte.program.execution_plan[0].delegates[0]
    info = blob_info(pte.delegate_data(delegate.processed))
    assert info.openvino_version is not None
    assert _io()["openvino"].startswith(info.openvino_version)
    assert blob_info(b"not a blob") == type(info)(None, None)


def test_a_payload_of_another_openvino_runs_or_says_who_made_it() -> None:
    """With openvino installed: the fixture runs (and equals the eager model) where this
    OpenVINO and machine can import it, and is refused naming the version that made it
    where they cannot."""
    ov = pytest.importorskip("openvino")
    io = _io()
    try:
        method = ptexec.load(PTE).load_method()
    except BackendUnavailableError as e:
        assert f"made by OpenVINO {io['openvino'].split('-')[0]}" in str(e)
        assert ov.get_version() != io["openvino"] or "for " in str(e)
        return
    (got,) = method.execute(io["inputs"])
    tol = 3e-2 if io["precision"] in ("bf16", "f16") else 1e-4
    torch.testing.assert_close(got, io["outputs"][0], rtol=tol, atol=tol)
