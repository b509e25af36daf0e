"""The ptexec command on every fixture."""

from __future__ import annotations

import json

import pytest

from fixture_data import fixture_paths, load_manifest, missing_devices
from ptexec.cli import main

MANIFEST = load_manifest()


def _args(name: str) -> list[str]:
    pte, ptd = fixture_paths(name)
    return [str(pte)] + (["--data", str(ptd)] if ptd else [])


@pytest.mark.parametrize("name", list(MANIFEST))
def test_inspect(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = _args(name)
    if MANIFEST[name].get("load_error") == "PteFormatError":
        # a buffer whose tensors name different devices; a device_map makes it consistent
        assert main(["inspect", *args]) == 1
        assert "PteFormatError" in capsys.readouterr().err
        args += ["--device-map", "cpu"]
    assert main(["inspect", *args]) == 0
    out = capsys.readouterr().out
    for method in MANIFEST[name]["methods"]:
        assert f"method '{method}'" in out
    assert "memory plan" in out and "tensors by device" in out
    assert main(["inspect", "--json", *args]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["methods"]) == set(MANIFEST[name]["methods"])


@pytest.mark.parametrize("name", [n for n, e in MANIFEST.items() if e.get("runs", True)])
def test_run(name: str, capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    mapped = ["--device-map", "cpu"] if missing_devices(name) else []
    for method in MANIFEST[name]["methods"]:
        assert main(["run", *_args(name), *mapped, "--method", method, "--repeat", "2"]) == 0
        out = capsys.readouterr().out
        assert "output 0" in out and "latency" in out


def test_run_with_input_files(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from fixture_data import fixture_calls

    path = f"{tmp_path}/x.pt"
    call = fixture_calls("mlp")[0]
    torch.save(call["inputs"], path)
    out_path = f"{tmp_path}/y.pt"
    assert main(["run", str(fixture_paths("mlp")[0]), "--input", path, "--output", out_path]) == 0
    torch.testing.assert_close(torch.load(out_path)[0], call["outputs"][0], rtol=1e-4, atol=1e-5)


def test_errors_are_one_line(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    bad = f"{tmp_path}/bad.pte"
    with open(bad, "wb") as f:
        f.write(b"\x00" * 64)
    assert main(["inspect", bad]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ptexec: PteFormatError:") and "\n" not in err
    assert main(["run", str(fixture_paths("mlp")[0]), "--method", "nope"]) == 1
    assert "no method 'nope'" in capsys.readouterr().err
    assert main(["inspect", f"{tmp_path}/missing.pte"]) == 1
