"""The ptexec command on every fixture."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
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


@pytest.mark.parametrize("order", ["<", ">", "F"])
def test_run_with_npy_inputs_of_any_byte_order_and_layout(tmp_path: Path, order: str) -> None:
    """A ``.npy`` input saved big-endian (or Fortran-ordered) is the array numpy reads."""
    import numpy as np
    import torch

    from fixture_data import fixture_calls

    call = fixture_calls("mlp")[0]
    x = call["inputs"][0].numpy()
    array = np.asfortranarray(x) if order == "F" else x.astype(x.dtype.newbyteorder(order))
    np.save(tmp_path / "x.npy", array)
    out_path = tmp_path / "y.pt"
    argv = ["run", str(fixture_paths("mlp")[0]), "--input", str(tmp_path / "x.npy")]
    assert main([*argv, "--output", str(out_path)]) == 0
    torch.testing.assert_close(torch.load(out_path)[0], call["outputs"][0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "order"),
    [("mlp_unplanned", "F"), ("channels_last_unplanned", "C"), ("channels_last_unplanned", "F")],
)
def test_input_files_feed_an_unplanned_input_in_any_layout(
    name: str, order: str, tmp_path: Path
) -> None:
    """A ``.npy`` file holds an array, not a layout (numpy writes C or Fortran order, never
    channels last): the values eager PyTorch gave come out for a program that reads its
    input in place in another layout (it was refused, pointing to an option the command
    does not have)."""
    import numpy as np

    from fixture_data import fixture_calls

    call = fixture_calls(name)[0]
    x = call["inputs"][0].contiguous().numpy()
    np.save(tmp_path / "x.npy", np.asfortranarray(x) if order == "F" else x)
    out_path = tmp_path / "y.pt"
    argv = ["run", str(fixture_paths(name)[0]), "--input", str(tmp_path / "x.npy")]
    assert main([*argv, "--repeat", "1", "--output", str(out_path)]) == 0
    for got, want in zip(torch.load(out_path), call["outputs"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_integer_outputs_are_printed_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An integer output's least and greatest values print as the integers they are (they
    were rounded to 4 digits through float64: -123456784 printed as -1.235e+08, and
    values past 2**53 as another number)."""
    from fixture_data import fixture_calls

    ids, x, _ = fixture_calls("int_ops")[0]["inputs"]
    for k in (123456789, 2**60 + 1):
        torch.save([ids, x, torch.tensor(k)], tmp_path / "in.pt")
        argv = ["run", str(fixture_paths("int_ops")[0]), "--input", str(tmp_path / "in.pt")]
        assert main([*argv, "--repeat", "1", "--output", str(tmp_path / "out.pt")]) == 0
        line = next(s for s in capsys.readouterr().out.splitlines() if "output 6:" in s)
        arith = torch.load(tmp_path / "out.pt")[6]  # (ids * 3 + 7) // 2 % 5 - k
        torch.testing.assert_close(arith, (ids * 3 + 7).div(2, rounding_mode="floor") % 5 - k)
        assert f"min {arith.min().item()}  max {arith.max().item()}  mean " in line


@pytest.mark.parametrize("name", ["x.NPY", "x.bin", "x"])
def test_npy_files_are_known_by_their_content(name: str, tmp_path: Path) -> None:
    """A file numpy.save wrote is read as an array whatever its name (under another
    suffix than ``.npy`` it was refused as "not a file torch.save wrote: it is a NumPy
    array", with advice to save it with numpy.save)."""
    import numpy as np

    from fixture_data import fixture_calls

    call = fixture_calls("mlp")[0]
    with open(tmp_path / name, "wb") as f:
        np.save(f, call["inputs"][0].numpy())
    out_path = tmp_path / "y.pt"
    argv = ["run", str(fixture_paths("mlp")[0]), "--input", str(tmp_path / name)]
    assert main([*argv, "--repeat", "1", "--output", str(out_path)]) == 0
    torch.testing.assert_close(torch.load(out_path)[0], call["outputs"][0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("legacy", [False, True])
def test_torch_files_are_known_by_their_content(legacy: bool, tmp_path: Path) -> None:
    """A file torch.save wrote is read as torch.load reads it, under a ``.npy`` name too
    (it went to numpy and was refused as "it holds a NpzFile, not one array")."""
    from fixture_data import fixture_calls

    call = fixture_calls("mlp")[0]
    torch.save(call["inputs"], tmp_path / "x.npy", _use_new_zipfile_serialization=not legacy)
    out_path = tmp_path / "y.pt"
    argv = ["run", str(fixture_paths("mlp")[0]), "--input", str(tmp_path / "x.npy")]
    assert main([*argv, "--repeat", "1", "--output", str(out_path)]) == 0
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


# ---- failures: one line on stderr, a non-zero exit, never a traceback --------------------


class _Planted:
    """A pickle that would create ``marker`` when unpickled by a loader that runs code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        import os

        return (os.mkdir, (self.marker,))


def _status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # a usage error: argparse exits
        return int(e.code or 0)


def _fails_in_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], *parts: str) -> str:
    status = _status(argv)
    err = capsys.readouterr().err
    assert status != 0, argv
    assert err.startswith("ptexec") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for part in parts:
        assert part in err, (part, err)
    return err


def test_input_files_that_are_not_tensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pickle

    import numpy as np
    import torch

    mlp = str(fixture_paths("mlp")[0])
    marker = tmp_path / "planted"
    files = {
        "hostile.pt": pickle.dumps(_Planted(str(marker)), protocol=2),
        "hostile4.pt": pickle.dumps(_Planted(str(marker)), protocol=4),
        "hostile.npy": pickle.dumps(_Planted(str(marker)), protocol=2),
        "empty.pt": b"",
        "program.pt": fixture_paths("mlp")[0].read_bytes(),
        "notes.pt": b"x = 1.5\n",
        "raw.bin": np.arange(16, dtype="<f4").tobytes()[4:],  # bytes as a tensor holds them
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    torch.save({"w": torch.ones(2)}, tmp_path / "state.pt")
    torch.save([torch.ones(2), {"k": 1}], tmp_path / "mixed.pt")
    np.save(tmp_path / "objects.npy", np.array([{}, 1], dtype=object), allow_pickle=True)
    (tmp_path / "empty.npy").write_bytes(b"")
    expected = {
        "hostile.pt": "Python objects other than tensors",
        "hostile4.pt": "Python objects other than tensors",
        "hostile.npy": "Python objects other than tensors",
        "empty.pt": "the file is empty (0 bytes)",
        "program.pt": "it is an ExecuTorch program (.pte)",
        "notes.pt": "it is a text file",
        "raw.bin": "neither torch.save nor numpy.save wrote it (raw bytes",
        "state.pt": "it holds a dict",
        "mixed.pt": "it holds a list holding a dict",
        "objects.npy": "not an array numpy reads safely",
        "empty.npy": "the file is empty",
    }
    for name, why in expected.items():
        path = str(tmp_path / name)
        _fails_in_one_line(
            capsys, ["run", mlp, "--input", path], f"InputError: input file {path}: ", why
        )
    assert not marker.exists()  # nothing in the files ran


@pytest.mark.parametrize(
    "argv, parts",
    [
        (["run", "{mlp}", "--output", "{tmp}"], ["argument --output: ", "is a directory"]),
        (["run", "{mlp}", "--output", "{tmp}/no/y.pt"], ["{tmp}/no does not exist"]),
        (["run", "{mlp}", "--output", "{mlp}/y.pt"], ["is not a directory"]),
        (["trace", "{mlp}", "--save-tensors", "{tmp}/no/t.pt"], ["--save-tensors: "]),
        (["trace", "{mlp}", "--json", "{tmp}/no/t.json"], ["--json: "]),
        (["profile", "{mlp}", "--chrome-trace", "{tmp}/no/t.json"], ["--chrome-trace: "]),
        (["plan", "{mlp}", "--out", "{tmp}/no/p.png"], ["--out: "]),
        (["plan", "{mlp}", "--out", "{tmp}/p.txt"], ["--out: ", "no picture format"]),
        (["run", "{mlp}", "--repeat", "0"], ["--repeat: expected a positive integer, got 0"]),
        (["run", "{mlp}", "--repeat", "-2"], ["--repeat: expected a positive integer, got -2"]),
        (["profile", "{mlp}", "--repeat", "0"], ["--repeat: expected a positive integer"]),
        (["profile", "{mlp}", "--warmup", "-1"], ["--warmup: expected an integer of 0 or more"]),
        (["trace", "{mlp}", "--limit", "0"], ["--limit: "]),
        (["run", "{mlp}", "--repeat", "many"], ["got 'many'"]),
        (["inspect", "{tmp}/missing.pte"], ["FileMissingError: ", "no such program file"]),
        (["inspect", "{tmp}"], ["FileUnreadableError: {tmp}: the program file is a directory"]),
        (
            ["run", "{mlp}", "--data", "{tmp}"],
            ["FileUnreadableError: ", "data file is a directory"],
        ),
        (["run", "{mlp}", "--input", "{tmp}/missing.pt"], ["FileNotFoundError: "]),
        (["run", "{mlp}", "--method", "nope"], ["MethodNotFoundError: no method 'nope'"]),
        (["run", "{mlp}", "--device-map", "cdua"], ["UnsupportedDeviceError: ", "'cdua'"]),
        (["inspect", "{tmp}/empty.pte"], ["PteFormatError: ", "the file is empty"]),
        (["inspect", "{tmp}/state.pte"], ["PteFormatError: ", "a PyTorch checkpoint"]),
    ],
)
def test_failures_are_one_line(
    argv: list[str], parts: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    (tmp_path / "empty.pte").write_bytes(b"")
    torch.save({"w": torch.ones(2)}, tmp_path / "state.pte")
    names = {"mlp": str(fixture_paths("mlp")[0]), "tmp": str(tmp_path)}
    err = _fails_in_one_line(capsys, [a.format(**names) for a in argv])
    for part in parts:
        assert part.format(**names) in err, err
    assert not list(tmp_path.glob("no*"))  # nothing written


def test_outputs_are_checked_before_the_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad output path stops the command before anything runs."""
    mlp = str(fixture_paths("mlp")[0])
    assert _status(["trace", mlp, "--save-tensors", f"{tmp_path}/no/t.pt"]) == 2
    assert capsys.readouterr().out == ""  # no trace was run and printed
    assert main(["trace", mlp, "--save-tensors", f"{tmp_path}/t.pt"]) == 0
    assert (tmp_path / "t.pt").stat().st_size > 0


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_missing_cuda_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The command's advice is its flag; a Python caller's is still device_map."""
    import ptexec

    gpu = str(fixture_paths("gpu_mlp")[0])
    mlp = str(fixture_paths("mlp")[0])
    for argv, hint in [
        (["run", gpu], "run it on the CPU with --device-map cpu"),
        (["run", mlp, "--device-map", "cuda"], "run it on the CPU with --device-map cpu"),
        (["compile", mlp, "--device", "cuda"], "run it on the CPU with --device cpu"),
    ]:
        err = _fails_in_one_line(capsys, argv, "DeviceUnavailableError: ", "no CUDA device", hint)
        assert "device_map=" not in err
    with pytest.raises(ptexec.DeviceUnavailableError, match="device_map='cpu'") as info:
        ptexec.load(gpu).load_method()
    assert info.value.device == "cuda:0" and info.value.cuda_devices == 0


def test_failure_advice_for_a_missing_gpu_index() -> None:
    import argparse

    from ptexec.cli.common import failure as _failure
    from ptexec.errors import DeviceUnavailableError

    e = DeviceUnavailableError("needs cuda:3", "map it with device_map=...", "cuda:3", 2)
    assert str(e) == "needs cuda:3; map it with device_map=..."
    line = _failure(e, argparse.Namespace(device_map=None))
    assert (
        line
        == "DeviceUnavailableError: needs cuda:3; run it on another GPU with --device-map cuda:3=cuda:0"
    )
    line = _failure(e, argparse.Namespace(device=None))
    assert line.endswith("with --device cuda:0")


def test_missing_compiler_is_said_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))
    mlp = str(fixture_paths("mlp")[0])
    missing = str(tmp_path / "bin" / "g++")
    monkeypatch.setenv("CXX", missing)
    assert main(["run", mlp, "--compile", "--repeat", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.count("C++ compiler") == 1 and err == ""
    assert f"CXX is '{missing}', which names no C++ compiler that exists" in out
    assert "set CXX" not in out
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++ on it
    assert main(["run", mlp, "--compile", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("C++ compiler") == 1 and "no C++ compiler found (install g++" in out


def test_inspect_json_compile_holds_the_compile_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``inspect --json --compile`` gives each method's compile report, the one loading it
    compiled gives (``--compile`` was dropped from the JSON: nothing was compiled or read
    from the cache, and the JSON said nothing of it). Without a C++ compiler, quickly."""
    import dataclasses

    from ptexec.compile import CompileOptions, CompileWarning

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "bin" / "g++"))
    mlp = str(fixture_paths("mlp")[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompileWarning)
        method = ptexec.load(mlp).load_method(compile=CompileOptions(progress=None))
    want = json.loads(json.dumps(dataclasses.asdict(method.compile_report)))
    assert main(["inspect", mlp, "--json", "--compile"]) == 0
    got = json.loads(capsys.readouterr().out)["methods"]["forward"]["compile"]
    got.pop("compile_seconds"), want.pop("compile_seconds")
    assert got == want and got["warning"] and "C++ compiler" in got["warning"]
    assert main(["inspect", mlp, "--json"]) == 0  # without --compile, no report
    assert "compile" not in json.loads(capsys.readouterr().out)["methods"]["forward"]


@pytest.mark.parametrize("name", ["mlp", "dynamic_mlp", "external"])
def test_inspect_json_values_are_the_programs_tensors(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``inspect --json --values`` lists every tensor value as ExecuTorch's own reader of
    the file sees it (``--values`` was dropped from the JSON)."""
    pytest.importorskip("executorch.exir")
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import Tensor

    from ptexec.format.scalar_type import scalar_type_name

    pte, ptd = fixture_paths(name)
    plan = deserialize_pte_binary(pte.read_bytes()).program.execution_plan[0]
    want = [
        (i, scalar_type_name(int(v.val.scalar_type)), list(v.val.sizes))
        for i, v in enumerate(plan.values)
        if isinstance(v.val, Tensor)
    ]
    data = ["--data", str(ptd)] if ptd else []
    assert main(["inspect", str(pte), *data, "--json", "--values"]) == 0
    values = json.loads(capsys.readouterr().out)["methods"]["forward"]["values"]
    assert [(v["value"], v["dtype"], v["sizes"]) for v in values] == want
    for v in values:
        info = plan.values[v["value"]].val.allocation_info
        if info is not None:
            assert (v["memory"], v["buffer"], v["offset"]) == (
                "planned",
                info.memory_id,
                info.memory_offset_low + (info.memory_offset_high << 32),
            )
    roles = {r: v["value"] for v in values for r in v["roles"]}
    assert roles == {
        **{f"input {i}": s for i, s in enumerate(plan.inputs)},
        **{f"output {i}": s for i, s in enumerate(plan.outputs)},
    }


def test_debug_shows_the_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PTEXEC_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["inspect", str(tmp_path / "missing.pte")])


def test_unexpected_failures_and_interrupts_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ptexec

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("division by zero")

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    mlp = str(fixture_paths("mlp")[0])
    monkeypatch.setattr(ptexec, "load", broken)
    _fails_in_one_line(capsys, ["inspect", mlp], "ZeroDivisionError: ", "PTEXEC_DEBUG=1")
    monkeypatch.setattr(ptexec, "load", interrupted)
    assert main(["inspect", mlp]) == 130
    assert capsys.readouterr().err == "ptexec: interrupted\n"


class _Cancels(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((x + y) - x) - y  # 0 in float64, rounding residue in float32


class _Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, alpha: float) -> tuple[torch.Tensor, float]:
        return x * 2, alpha


def test_json_files_are_strict_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An infinite relative error (a float64 reference of exactly 0) and an infinite
    scalar are written as strings: the files parse with a strict JSON reader."""
    from export_util import export_program

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))

    g = torch.Generator().manual_seed(0)
    pte = tmp_path / "cancels.pte"
    pte.write_bytes(export_program(_Cancels(), (torch.randn(64, generator=g),) * 2))
    out = tmp_path / "trace.json"
    assert main(["trace", str(pte), "--reference", "--json", str(out), "--seed", "1"]) == 0
    text = out.read_text()
    strict(text)
    assert '"inf"' in text  # the residue against an exact 0
    scaled = tmp_path / "scaled.pte"
    scaled.write_bytes(export_program(_Scaled(), (torch.ones(3), float("inf"))))
    capsys.readouterr()
    assert main(["inspect", "--json", str(scaled)]) == 0
    strict(capsys.readouterr().out)


def test_an_infinite_scalar_input_is_taken_as_traced(tmp_path: Path) -> None:
    """A float input traced as inf takes inf again (as ExecuTorch's runtime does)."""
    from export_util import export_program

    pte = export_program(_Scaled(), (torch.ones(3), float("inf")))
    m = ptexec.load(pte).load_method()
    for _ in range(2):  # the general path, then the fast call
        y, alpha = m.execute([torch.ones(3), float("inf")])
        assert torch.equal(y, torch.full((3,), 2.0)) and alpha == float("inf")
    path = tmp_path / "scaled.pte"
    path.write_bytes(pte)
    assert main(["run", str(path), "--repeat", "1"]) == 0
    assert _status(["run", str(path), "--threads", "0"]) == 2


def test_data_files_found_beside_the_program_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --data, the .ptd files that gave the weights are said (they decide them)."""
    import shutil

    pte, ptd = fixture_paths("external")
    assert ptd is not None
    shutil.copy(pte, tmp_path / "model.pte")
    shutil.copy(ptd, tmp_path / "weights.ptd")
    capsys.readouterr()
    assert main(["run", str(tmp_path / "model.pte"), "--repeat", "1"]) == 0
    assert f"external data from {tmp_path / 'weights.ptd'}" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "model.pte")]) == 0
    assert "weights.ptd" in capsys.readouterr().out
    assert _status(["run", str(tmp_path / "model.pte"), "--device-map", "cuda:0=cpu,cuda:1"]) == 1


def test_run_records_the_first_call_as_an_etdump(tmp_path: Path) -> None:
    """``ptexec run --etdump F --debug-buffer B`` writes the first call's ETDump and the
    values it recorded: the outputs logged are the outputs saved."""
    import torch

    from ptexec.format.etdump import RUN_OUTPUT_CHAIN, DebugEvent, ProfileEvent, decode_etdump

    pte = str(fixture_paths("mlp")[0])
    etdp, buf, out = tmp_path / "m.etdp", tmp_path / "m.bin", tmp_path / "y.pt"
    argv = ["run", pte, "--repeat", "1", "--etdump", str(etdp), "--debug-buffer", str(buf)]
    assert main([*argv, "--output", str(out)]) == 0
    (run,) = decode_etdump(etdp.read_bytes()).run_data
    assert any(isinstance(e, ProfileEvent) and e.name == "Method::execute" for e in run.events)
    (logged,) = [
        e for e in run.events if isinstance(e, DebugEvent) and e.chain_index == RUN_OUTPUT_CHAIN
    ]
    (y,) = torch.load(out)
    t = logged.debug_entry.data
    raw = bytearray(buf.read_bytes()[t.offset : t.offset + y.numel() * y.element_size()])
    assert torch.equal(torch.frombuffer(raw, dtype=y.dtype).view(t.sizes), y)
    assert main(["run", pte, "--debug-buffer", str(buf)]) != 0  # needs --etdump


def test_inspect_calls_a_constant_output_a_constant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output that is the program's data (a method returning a weight) is printed as a
    constant, not as planned (ExecuTorch's is_memory_planned is true for constants)."""
    import torch

    from export_util import export_program

    class ReturnsWeight(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3, 4))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x + 1, self.w

    path = tmp_path / "w.pte"
    path.write_bytes(export_program(ReturnsWeight(), (torch.zeros(2),)))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "0: float32[2] contiguous on cpu, planned" in out
    assert "1: float32[3, 4] contiguous on cpu, constant (the program's data)" in out


def test_inspect_names_the_devices_a_device_map_gives_every_tensor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Under ``--device-map``, the per-tensor lines and the count by device say where the
    loaded method's tensors are, as its inputs and buffers do (not the labels the map
    replaced)."""
    args = _args("gpu_mlp")
    method = ptexec.load(fixture_paths("gpu_mlp")[0]).load_method(device_map="cpu")
    values = method.state.values
    loaded = {j: str(x.device) for j, x in enumerate(values) if isinstance(x, torch.Tensor)}
    assert set(loaded.values()) == {"cpu"}
    assert main(["inspect", *args, "--device-map", "cpu", "--values"]) == 0
    out = capsys.readouterr().out
    lines = {
        int(line.split()[0][1:]): line
        for line in out.splitlines()
        if line.startswith("    v") and line.split()[0][1:].isdigit()
    }
    assert lines and set(loaded) <= set(lines)
    for line in lines.values():
        assert " on cpu," in line, line
    counts = next(line for line in out.splitlines() if "tensors by device" in line)
    assert counts.strip() == f"tensors by device: cpu: {len(lines)}"
    assert main(["inspect", *args, "--device-map", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["methods"]["forward"]["tensor_devices"] == {"cpu": len(lines)}


@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "nested", "quantized", "meta"])
def test_input_files_of_tensors_a_method_refuses(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file holding a tensor that is not a dense one on a modeled device fails as the
    method refuses that tensor (its typed error, in one line), not while it is described."""
    x = torch.ones(2, 8)
    with warnings.catch_warnings():  # (sparse, nested and quantized tensors are in beta)
        warnings.simplefilter("ignore")
        tensor = {
            "sparse_coo": lambda: x.to_sparse(),
            "sparse_csr": lambda: x.to_sparse_csr(),
            "nested": lambda: torch.nested.nested_tensor([torch.ones(8), torch.ones(3)]),
            "quantized": lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8),
            "meta": lambda: x.to("meta"),
        }[kind]()
        torch.save(tensor, tmp_path / "x.pt")
        mlp = fixture_paths("mlp")[0]
        with pytest.raises(ptexec.errors.PtexecError) as refused:
            ptexec.load(mlp).load_method().execute([torch.load(tmp_path / "x.pt")])
    want = f"ptexec: {type(refused.value).__name__}: {refused.value}\n"
    assert _fails_in_one_line(capsys, ["run", str(mlp), "--input", str(tmp_path / "x.pt")]) == want


def test_compile_takes_one_of_device_and_device_map(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ptexec compile --device D --device-map M`` is refused before anything compiles:
    both name the devices of the compile, and the map was dropped without a word."""
    import ptexec.cli.compile as compile_cli

    compiled: list[Any] = []
    monkeypatch.setattr(compile_cli, "print_compiled", lambda *args: compiled.append(args))
    gpu = str(fixture_paths("gpu_mlp")[0])
    argv = ["compile", gpu, "--device", "cuda:1", "--device-map", "cuda:0=cpu"]
    _fails_in_one_line(capsys, argv, "--device", "--device-map")
    assert compiled == []


def test_a_debug_buffer_size_needs_a_debug_buffer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--debug-buffer-size`` limits the values ``--debug-buffer`` records; without it no
    value is recorded, so the size is refused (it was taken, and the ETDump held no values)."""
    pte = str(fixture_paths("mlp")[0])
    etdp = tmp_path / "m.etdp"
    argv = ["run", pte, "--repeat", "1", "--etdump", str(etdp), "--debug-buffer-size", "4096"]
    _fails_in_one_line(capsys, argv, "--debug-buffer-size", "--debug-buffer")
    assert not etdp.exists()
    buf = tmp_path / "m.bin"
    assert main([*argv, "--debug-buffer", str(buf)]) == 0
    assert 0 < buf.stat().st_size <= 4096


def test_worst_errors_need_a_reference(capsys: pytest.CaptureFixture[str]) -> None:
    """``trace --worst N`` lists the largest errors against the float64 reference; without
    ``--reference`` there are none, so N is refused (it was taken, and nothing listed)."""
    mlp = str(fixture_paths("mlp")[0])
    _fails_in_one_line(capsys, ["trace", mlp, "--worst", "3"], "--worst", "--reference")
    assert main(["trace", mlp, "--worst", "3", "--reference"]) == 0
    out = capsys.readouterr().out
    listed = out.split("largest errors against the float64 reference:\n")[1].splitlines()
    assert len(listed) == 3 and all(line.startswith("  instruction ") for line in listed)


def test_a_device_map_names_each_device_once(capsys: pytest.CaptureFixture[str]) -> None:
    """``--device-map cuda:0=cuda:1,cuda:0=cpu`` gives one device two places: refused,
    naming it (the last one was taken without a word), as a ``device_map`` dict cannot
    hold one key twice."""
    gpu = str(fixture_paths("gpu_mlp")[0])
    argv = ["run", gpu, "--repeat", "1", "--device-map", "cuda:0=cuda:1, cuda:0=cpu"]
    _fails_in_one_line(capsys, argv, "--device-map", "'cuda:0'", "cuda:1", "cpu")
