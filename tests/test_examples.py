"""The README's examples run as written."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_gpu_activation_workflow(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("executorch")
    runpy.run_path(str(EXAMPLES / "gpu_activation.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "on cuda:0" in out and "inputs=['share']" in out
    assert "'h2h': 0, 'h2d': 0, 'd2h': 0, 'd2d': 0" in out
