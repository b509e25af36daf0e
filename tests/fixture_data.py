"""Access to the test fixtures made by scripts/make_fixtures.py.

Pure Python + torch; does not import executorch.

    from fixture_data import load_manifest, fixture_paths, fixture_calls, tolerance

    for name in load_manifest():
        pte, ptd = fixture_paths(name)
        for call in fixture_calls(name):
            outputs = run(pte, ptd, call["method"], call["inputs"])
            assert compare_outputs(outputs, call["outputs"], *tolerance(name)) is None

Manifest entry keys: pte, ptd (or None), methods, tags, description, rtol, atol,
operators (sorted 'name.overload' list), known_divergence (optional), and
executorch_runtime ("ok" or "diverges: <why>", what ExecuTorch's own runtime gives).
Device fixtures (scripts/make_device_fixtures.py) add devices (the devices the program
names), runs (False when ptexec cannot replay it as is), runs_note and load_error; replay
them with ``load_method(..., **load_options(name))``.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"


@lru_cache(maxsize=1)
def _manifest() -> dict[str, Any]:
    with open(FIXTURES_DIR / "manifest.json") as f:
        return json.load(f)


def load_manifest() -> dict[str, Any]:
    """The manifest: fixture name -> entry (a fresh copy; safe to modify)."""
    return json.loads(json.dumps(_manifest()))


def _entry(name: str) -> dict[str, Any]:
    try:
        return _manifest()[name]
    except KeyError:
        raise KeyError(f"no fixture named {name!r}") from None


def fixture_paths(name: str) -> tuple[Path, Path | None]:
    """(path of NAME.pte, path of its .ptd or None)."""
    entry = _entry(name)
    ptd = entry.get("ptd")
    return FIXTURES_DIR / entry["pte"], (FIXTURES_DIR / ptd if ptd else None)


def fixture_calls(name: str) -> list[dict[str, Any]]:
    """The ordered calls [{"method", "inputs", "outputs"}] to replay on one loaded program."""
    _entry(name)
    data = torch.load(FIXTURES_DIR / f"{name}.io.pt", weights_only=True)
    return data["calls"]


def tolerance(name: str) -> tuple[float, float]:
    """(rtol, atol) for the fixture's float outputs; ints and bools compare exactly."""
    entry = _entry(name)
    return float(entry["rtol"]), float(entry["atol"])


def missing_devices(name: str) -> list[str]:
    """The devices the fixture's program names that this machine does not have."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [d for d in _entry(name).get("devices", []) if int(d.partition(":")[2] or 0) >= count]


def load_options(name: str) -> dict[str, Any]:
    """``load_method`` options that replay the fixture's stored (CPU) calls on this machine:
    ``device_map="cpu"`` where a device it names is missing, ``transfers="allow"`` where
    they are all here (the stored inputs are CPU tensors), nothing for a CPU program."""
    if missing_devices(name):
        return {"device_map": "cpu"}
    return {"transfers": "allow"} if _entry(name).get("devices") else {}


def fixtures_with_tag(tag: str) -> list[str]:
    return [name for name, entry in _manifest().items() if tag in entry["tags"]]


def compare_outputs(actual: list[Any], expected: list[Any], rtol: float, atol: float) -> str | None:
    """None when `actual` matches `expected`, else a sentence saying where it does not.

    Tensors must have the same dtype and shape; floating values are compared with
    torch.allclose(rtol, atol, equal_nan=True), everything else exactly. Python floats use
    the same tolerance; ints, bools and None compare exactly (bool is not int).
    """
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"output {i}: got {type(a).__name__}, expected a tensor"
            if a.dtype != e.dtype:
                return f"output {i}: dtype {a.dtype}, expected {e.dtype}"
            if tuple(a.shape) != tuple(e.shape):
                return f"output {i}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
            a_cpu, e_cpu = a.detach().cpu(), e.detach().cpu()
            if e.is_floating_point() or e.is_complex():
                ok = torch.allclose(a_cpu, e_cpu, rtol=rtol, atol=atol, equal_nan=True)
            else:
                ok = torch.equal(a_cpu, e_cpu)
            if not ok:
                if e.numel() and (e.is_floating_point() or e.is_complex()):
                    err = (a_cpu.to(e_cpu.dtype) - e_cpu).abs().max().item()
                    return f"output {i}: values differ (max abs err {err:.3g})"
                return f"output {i}: values differ: got {a_cpu.flatten()[:8].tolist()}, expected {e_cpu.flatten()[:8].tolist()}"
        elif e is None or isinstance(e, bool):
            if a is not e and not (type(a) is type(e) and a == e):
                return f"output {i}: got {a!r}, expected {e!r}"
        elif isinstance(e, int):
            if type(a) is not int or a != e:
                return f"output {i}: got {a!r}, expected {e!r}"
        elif isinstance(e, float):
            if not isinstance(a, float) or not math.isclose(a, e, rel_tol=rtol, abs_tol=atol):
                return f"output {i}: got {a!r}, expected {e!r}"
        elif a != e:
            return f"output {i}: got {a!r}, expected {e!r}"
    return None
