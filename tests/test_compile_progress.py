"""The progress of a compile: a live line that keeps advancing on a terminal, plain lines
(one when a step starts, one when it ends) elsewhere, nothing when asked for nothing."""

from __future__ import annotations

import io
import logging
import threading
import time

import pytest

import ptexec
from fixture_data import fixture_paths
from ptexec.compile import CompileOptions
from ptexec.compile.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _wait_for(stream: io.StringIO, text: str) -> bool:
    """Whether ``text`` appears on ``stream`` (written by another thread) within a generous
    while; the test does not depend on how fast it appears."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if text in stream.getvalue():
            return True
        time.sleep(0.01)
    return False


def test_on_a_terminal_the_elapsed_time_advances_during_a_step() -> None:
    now = [0.0]
    stream = _Terminal()
    with Progress("'forward'", stream=stream, interval=0.01, clock=lambda: now[0]) as progress:
        progress.start("compiling region 1/2 (instructions 0-4)")
        assert "(0 s)" in stream.getvalue()
        now[0] = 7.0  # a long compile: no call into the progress while it runs
        assert _wait_for(stream, "compiling region 1/2 (instructions 0-4) (7 s)")
        now[0] = 63.0
        assert _wait_for(stream, "(63 s)")
        progress.done("5 instruction(s) in 1 region(s), 63.0 s")
    out = stream.getvalue()
    last = out.rpartition("\r")[2]
    assert last.rstrip() == "ptexec: compiled 'forward': 5 instruction(s) in 1 region(s), 63.0 s"
    assert out.endswith("\n") and "\n" not in out[:-1]  # one line, rewritten in place
    assert not any(t.name == "ptexec-progress" for t in threading.enumerate())


def test_elsewhere_one_line_per_step_start_and_finish() -> None:
    now = [0.0]
    stream = io.StringIO()
    with Progress("'forward'", stream=stream, clock=lambda: now[0]) as progress:
        progress.start("compiling region 1/2 (instructions 0-4)")
        now[0] = 2.5
        progress.finish("compiled")
        progress.start("compiling region 2/2 (instruction 6)")
        progress.finish("failed")
        progress.done("5 instruction(s) in 1 region(s), 2.5 s")
    assert stream.getvalue().splitlines() == [
        "ptexec: compiling 'forward': compiling region 1/2 (instructions 0-4)",
        "ptexec: compiling 'forward': compiling region 1/2 (instructions 0-4): compiled (2.5 s)",
        "ptexec: compiling 'forward': compiling region 2/2 (instruction 6)",
        "ptexec: compiling 'forward': compiling region 2/2 (instruction 6): failed (0.0 s)",
        "ptexec: compiled 'forward': 5 instruction(s) in 1 region(s), 2.5 s",
    ]


def test_lines_go_to_logging_when_it_is_configured(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ptexec.compile")
    stream = io.StringIO()
    with Progress("'forward'", stream=stream) as progress:
        progress.start("tracing region 1/1 (instructions 0-4)")
        progress.done("1 region(s) traced")
    assert stream.getvalue() == ""
    assert [r.getMessage() for r in caplog.records if r.name == "ptexec.compile"] == [
        "ptexec: compiling 'forward': tracing region 1/1 (instructions 0-4)",
        "ptexec: compiled 'forward': 1 region(s) traced",
    ]


def test_disabled_is_silent_on_a_terminal_too() -> None:
    stream = _Terminal()
    with Progress("'forward'", stream=stream, enabled=False, interval=0.01) as progress:
        progress.start("compiling region 1/1")
        progress.done("done")
    assert stream.getvalue() == ""


def test_a_load_that_compiles_says_so_outside_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pte = fixture_paths("mlp")[0]
    ptexec.load(pte).load_method("forward", compile=CompileOptions(backend="graph"))
    err = capsys.readouterr().err.splitlines()
    assert "ptexec: compiling 'forward': tracing region 1/1 (instructions 0-4)" in err
    assert any("tracing region 1/1 (instructions 0-4): traced (" in line for line in err)
    ptexec.load(pte).load_method("forward", compile=CompileOptions(backend="graph", progress=False))
    assert capsys.readouterr().err == ""
