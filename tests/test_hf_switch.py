"""``ptexec.use_as_executorch()`` / ``PTEXEC_AS_EXECUTORCH=1``: ExecuTorch's runtime
module names resolve to ptexec's while the rest of ``executorch`` stays real, and the
device it gives reaches ptexec's loaders.

The switch changes a process's imports, so each case runs in a fresh interpreter; the
rest of the suite keeps comparing against ExecuTorch's own runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ptexec.portable_lib as pl
from fixture_data import fixture_calls, fixture_paths
from ptexec.errors import DeviceUnavailableError, UnsupportedDeviceError

pytest.importorskip("executorch")
# each starts an interpreter that imports executorch: several seconds of CPU apiece
_fresh_interpreter = pytest.mark.slow
_SRC = str(Path(__file__).resolve().parents[1] / "src")


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter with this tree's ptexec; it prints one JSON line."""
    full = {**os.environ, "PYTHONPATH": _SRC, **(env or {})}
    if env is None:
        full.pop("PTEXEC_AS_EXECUTORCH", None)
    done = subprocess.run(
        [sys.executable, *args, "-c", textwrap.dedent(code)]
        if not args
        else [sys.executable, *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_CHECK = """
import json, sys
import executorch.runtime as rt
from executorch.extension.pybindings import portable_lib
import executorch.extension.pybindings._portable_lib as legacy
import executorch.extension.llm.runner as runner
import executorch.exir, executorch.extension.pybindings._C as real_c
import ptexec, ptexec.runtime, ptexec.portable_lib, ptexec.llm
print(json.dumps({
    "runtime": rt is ptexec.runtime,
    "portable_lib": portable_lib is ptexec.portable_lib,
    "legacy": legacy is ptexec.portable_lib,
    "runner": runner is ptexec.llm,
    "exir": executorch.exir.__name__,
    "exir_file": executorch.exir.__file__.startswith(executorch.__path__[0]),
    "c_real": real_c.__name__,
    "spec": ptexec.runtime.__spec__.name,
    "active": ptexec.hf.is_active(),
}))
"""


@_fresh_interpreter
def test_environment_variable_switches_the_names() -> None:
    got = _python("import ptexec\n" + _CHECK, env={"PTEXEC_AS_EXECUTORCH": "1"})
    assert got["runtime"] and got["portable_lib"] and got["legacy"] and got["runner"]
    # the rest of executorch is its own
    assert got["exir"] == "executorch.exir" and got["exir_file"]
    assert got["c_real"] == "executorch.extension.pybindings._C"
    assert got["spec"] == "ptexec.runtime"  # the module keeps its own spec
    assert got["active"]


@_fresh_interpreter
def test_without_the_switch_nothing_changes() -> None:
    code = """
    import json, ptexec, executorch.runtime as rt
    from executorch.extension.pybindings import portable_lib
    print(json.dumps({"rt": rt.__name__, "pl": portable_lib.__name__, "on": ptexec.hf.is_active()}))
    """
    got = _python(code, env={"PTEXEC_AS_EXECUTORCH": "0"})
    assert got == {
        "rt": "executorch.runtime",
        "pl": "executorch.extension.pybindings.portable_lib",
        "on": False,
    }


@_fresh_interpreter
def test_switch_replaces_modules_imported_before_it() -> None:
    code = """
    import json, sys
    import executorch.runtime, executorch.extension.pybindings.portable_lib
    import ptexec
    before = executorch.runtime.__name__
    ptexec.use_as_executorch()
    ptexec.use_as_executorch()  # idempotent
    import executorch.runtime as rt
    from executorch.extension.pybindings import portable_lib
    print(json.dumps({"before": before, "rt": rt is ptexec.runtime,
                      "attr": sys.modules["executorch"].runtime is ptexec.runtime,
                      "pl": portable_lib is ptexec.portable_lib,
                      "hooks": sum(type(f).__name__ == "_AliasFinder" for f in sys.meta_path)}))
    """
    got = _python(code)
    assert got == {"before": "executorch.runtime", "rt": True, "attr": True, "pl": True, "hooks": 1}


@_fresh_interpreter
def test_a_bad_value_of_the_variable_is_refused() -> None:
    full = {**os.environ, "PYTHONPATH": _SRC, "PTEXEC_AS_EXECUTORCH": "maybe"}
    done = subprocess.run(
        [sys.executable, "-c", "import ptexec"], capture_output=True, text=True, env=full
    )
    assert done.returncode != 0
    assert "PTEXEC_AS_EXECUTORCH must be 1 or 0" in done.stderr


@_fresh_interpreter
def test_python_m_ptexec_hf_runs_a_script_unchanged(tmp_path: Path) -> None:
    pte, _ = fixture_paths("mlp")
    call = fixture_calls("mlp")[0]
    torch.save(call["inputs"], tmp_path / "x.pt")
    script = tmp_path / "user.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys, torch
            from executorch.extension.pybindings.portable_lib import _load_for_executorch
            module = _load_for_executorch({str(pte)!r})
            y = module.forward(torch.load({str(tmp_path / "x.pt")!r}))[0]
            torch.save(y, {str(tmp_path / "y.pt")!r})
            print(json.dumps({{"module": type(module).__module__, "argv": sys.argv[1:]}}))
            """
        )
    )
    got = _python("", "-m", "ptexec.hf", str(script), "--flag")
    assert got == {"module": "ptexec.portable_lib", "argv": ["--flag"]}
    torch.testing.assert_close(torch.load(tmp_path / "y.pt"), call["outputs"][0])


def test_python_m_ptexec_hf_imports_beside_the_script_as_python_does(tmp_path: Path) -> None:
    """The script's own folder comes first on ``sys.path`` (not the working directory, as
    ``-m`` left it), so a module beside the script is the one imported, and ``__file__``
    is what ``python script.py`` gives it."""
    (tmp_path / "app").mkdir()
    (tmp_path / "cwd").mkdir()
    (tmp_path / "app" / "helper.py").write_text("WHERE = 'beside the script'\n")
    (tmp_path / "cwd" / "helper.py").write_text("WHERE = 'the working directory'\n")
    (tmp_path / "app" / "main.py").write_text(
        "import json, sys, helper\n"
        "print(json.dumps([helper.WHERE, sys.path[0], __file__, sys.argv]))\n"
    )
    env = {**os.environ, "PYTHONPATH": _SRC}
    env.pop("PTEXEC_AS_EXECUTORCH", None)
    runs = [
        subprocess.run(
            [sys.executable, *head, os.path.join("..", "app", "main.py"), "--flag"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path / "cwd",
            timeout=600,
        )
        for head in ([], ["-m", "ptexec.hf"])
    ]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
    plain, switched = (json.loads(done.stdout.splitlines()[-1]) for done in runs)
    assert plain[0] == "beside the script"
    assert switched[:3] == plain[:3]  # (runpy gives argv[0] the path it ran: absolute)
    assert switched[3][1:] == plain[3][1:] == ["--flag"]


def test_python_m_ptexec_hf_runs_code_given_with_c_as_python_does(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "from executorch.extension.pybindings import portable_lib\n"
        "print(json.dumps([portable_lib.__name__, __name__, sys.argv, sys.path[0]]))"
    )
    env = {**os.environ, "PYTHONPATH": _SRC}
    env.pop("PTEXEC_AS_EXECUTORCH", None)
    done = subprocess.run(
        [sys.executable, "-m", "ptexec.hf", "-c", code, "--flag"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [
        "ptexec.portable_lib", "__main__", ["-c", "--flag"], ""
    ]  # fmt: skip


@_fresh_interpreter
def test_python_m_ptexec_hf_gives_code_given_with_c_pythons_main_namespace(
    tmp_path: Path,
) -> None:
    """The names ``python -c`` defines in ``__main__`` (``__builtins__`` the module,
    ``__annotations__``, ``__loader__``) are there, as python gives them."""
    code = (
        "import json\n"
        "print(json.dumps([__builtins__.len('abc'), __annotations__, str(__loader__),"
        " sorted(k for k in globals() if k.startswith('__'))]))"
    )
    env = {**os.environ, "PYTHONPATH": _SRC}
    env.pop("PTEXEC_AS_EXECUTORCH", None)
    runs = [
        subprocess.run(
            [sys.executable, *head, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=600,
        )
        for head in ([], ["-m", "ptexec.hf"])
    ]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
    plain, switched = (json.loads(done.stdout.splitlines()[-1]) for done in runs)
    assert plain[0] == 3
    assert switched == plain


# ---- the device that optimum's loaders lack ---------------------------------------------


def test_default_device_reaches_portable_lib_loaders() -> None:
    pte, _ = fixture_paths("mlp")
    call = fixture_calls("mlp")[0]
    try:
        pl.set_default_device("cpu")
        module = pl._load_for_executorch(str(pte))
        assert module.device_map == "cpu"
        torch.testing.assert_close(module.forward(call["inputs"])[0], call["outputs"][0])
        if not torch.cuda.is_available():
            pl.set_default_device("cuda")
            with pytest.raises(DeviceUnavailableError, match="cuda"):
                pl._load_for_executorch(str(pte)).forward(call["inputs"])
            with pytest.raises(DeviceUnavailableError, match="cuda"):
                pl._load_program(str(pte)).load_method("forward")
        with pytest.raises((ValueError, UnsupportedDeviceError)):
            pl.set_default_device("tpu:0")
    finally:
        pl.set_default_device(None)
    assert pl._load_for_executorch(str(pte)).device_map is None


def test_module_to_moves_its_methods() -> None:
    pte, _ = fixture_paths("mlp")
    call = fixture_calls("mlp")[0]
    module = pl._load_for_executorch(str(pte))
    torch.testing.assert_close(module.forward(call["inputs"])[0], call["outputs"][0])
    if torch.cuda.is_available():
        (y,) = module.to("cuda").forward([call["inputs"][0].cuda()])
        assert y.is_cuda
        torch.testing.assert_close(y.cpu(), call["outputs"][0], rtol=1e-4, atol=1e-5)
    else:
        with pytest.raises(DeviceUnavailableError, match="cuda"):
            module.to("cuda").forward(call["inputs"])
    (y,) = module.to(None).forward(call["inputs"])  # back where the program says
    torch.testing.assert_close(y, call["outputs"][0])


@_fresh_interpreter
def test_switch_device_argument_sets_the_default() -> None:
    code = """
    import json, ptexec
    ptexec.use_as_executorch(device="cpu")
    from executorch.extension.pybindings.portable_lib import _load_for_executorch, default_device
    print(json.dumps({"device": default_device()}))
    """
    assert _python(code) == {"device": "cpu"}
    env = {"PTEXEC_AS_EXECUTORCH": "1", "PTEXEC_AS_EXECUTORCH_DEVICE": "cpu"}
    code = """
    import json, ptexec
    from executorch.extension.pybindings.portable_lib import default_device
    print(json.dumps({"device": default_device()}))
    """
    assert _python(code, env=env) == {"device": "cpu"}


@pytest.mark.cuda
def test_module_on_the_gpu_writes_into_a_gpu_output() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pte, _ = fixture_paths("mlp_unplanned")
    call = fixture_calls("mlp_unplanned")[0]
    module = pl._load_for_executorch(str(pte)).to("cuda")
    out = torch.empty_like(call["outputs"][0], device="cuda")
    module.set_output("forward", out, 0)
    (y,) = module.forward([call["inputs"][0].cuda()])
    assert y is out
    torch.testing.assert_close(out.cpu(), call["outputs"][0], rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_default_device_cuda_runs_portable_lib_programs_on_the_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pte, _ = fixture_paths("mlp")
    call = fixture_calls("mlp")[0]
    try:
        pl.set_default_device("cuda")  # what use_as_executorch(device="cuda") sets
        module = pl._load_for_executorch(str(pte))
        assert module.device_map == "cuda"
        (y,) = module.forward([call["inputs"][0].cuda()])
        assert y.is_cuda
        torch.testing.assert_close(y.cpu(), call["outputs"][0], rtol=1e-4, atol=1e-5)
    finally:
        pl.set_default_device(None)


@pytest.mark.cuda
@_fresh_interpreter
def test_switch_device_variable_cuda_places_loaded_programs_on_the_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pte, _ = fixture_paths("mlp")
    call = fixture_calls("mlp")[0]
    env = {"PTEXEC_AS_EXECUTORCH": "1", "PTEXEC_AS_EXECUTORCH_DEVICE": "cuda"}
    code = f"""
    import json, torch, ptexec
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    module = _load_for_executorch({str(pte)!r})
    (y,) = module.forward([torch.zeros({tuple(call["inputs"][0].shape)!r}).cuda()])
    print(json.dumps({{"device_map": module.device_map, "cuda": y.is_cuda}}))
    """
    assert _python(code, env=env) == {"device_map": "cuda", "cuda": True}
