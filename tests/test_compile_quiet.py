"""``ptexec.compile.quiet``: what a compile hides of torch's internals (warnings, the
``torch`` logger, autotuning statistics) is hidden in the process's shared state, and
put back as the host left it, however compiles on several threads overlap."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator

import pytest

from ptexec.compile.quiet import quiet


@pytest.fixture
def host() -> Iterator[None]:
    """The process's filters, torch logger level and stderr, as a test found them."""
    filters = list(warnings.filters)
    level = logging.getLogger("torch").level
    stderr = sys.stderr
    yield
    warnings.filters[:] = filters
    warnings._filters_mutated()  # type: ignore[attr-defined]
    logging.getLogger("torch").setLevel(level)
    sys.stderr = stderr


def _in_thread(entered: threading.Event, leave: threading.Event) -> threading.Thread:
    def run() -> None:
        with quiet():
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=run)
    thread.start()
    assert entered.wait(30)
    return thread


@pytest.mark.usefixtures("host")
def test_overlapping_compiles_on_two_threads_leave_the_process_as_it_was() -> None:
    """The first compile in ends before the second: the filters, the torch logger's level
    and stderr are the host's afterwards (saved and restored wholesale, the second one's
    ignore filters stayed for good: every later UserWarning of the process was dropped)."""
    logging.getLogger("torch").setLevel(logging.WARNING)
    before = list(warnings.filters)
    stderr = sys.stderr
    first_in, first_out = threading.Event(), threading.Event()
    second_in, second_out = threading.Event(), threading.Event()
    first = _in_thread(first_in, first_out)
    second = _in_thread(second_in, second_out)
    assert logging.getLogger("torch").level == logging.CRITICAL
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn("hidden while compiling", UserWarning, stacklevel=1)
    assert not seen
    first_out.set()
    first.join()
    second_out.set()
    second.join()
    assert warnings.filters == before
    assert logging.getLogger("torch").level == logging.WARNING
    assert sys.stderr is stderr
    with pytest.warns(UserWarning, match="shown again"):
        warnings.warn("shown again", UserWarning, stacklevel=1)


@pytest.mark.usefixtures("host")
def test_what_the_host_sets_during_a_compile_is_kept() -> None:
    """A filter, a logger level and a stderr another thread of the host sets while a compile
    runs stay as it set them (put back wholesale, they were lost); a filter equal to the
    compile's that the host had before is still there."""
    warnings.simplefilter("ignore", DeprecationWarning)
    had = warnings.filters[0]
    with quiet():
        warnings.filterwarnings("error", message="the host's own")
        logging.getLogger("torch").setLevel(logging.ERROR)
        mine = io.StringIO()
        sys.stderr = mine
    assert any(f[0] == "error" and f[1] is not None and f[1].pattern == "the host's own"
               for f in warnings.filters)  # fmt: skip
    assert any(f is had for f in warnings.filters)
    assert logging.getLogger("torch").level == logging.ERROR
    assert sys.stderr is mine


def test_autotuning_statistics_are_dropped_and_the_rest_written(
    host: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with quiet():
        sys.stderr.write("Autotune Choices Stats:\n{}\n")  # (as torch writes them)
        print("a line of the host's", file=sys.stderr)
    assert capsys.readouterr().err == "a line of the host's\n"


_FORKED = """
import json, logging, os, sys, threading, warnings
from ptexec.compile.quiet import quiet

host = (logging.getLogger("torch").level, type(sys.stderr).__name__)
inside, leave = threading.Event(), threading.Event()
def compiling():
    with quiet():
        inside.set()
        leave.wait()
worker = threading.Thread(target=compiling)
worker.start()
inside.wait()
child = os.fork()
if child == 0:
    with warnings.catch_warnings(record=True) as caught:  # (the filters as they are)
        warnings.warn("a host's warning", UserWarning)
    level, stream = logging.getLogger("torch").level, type(sys.stderr).__name__
    print(json.dumps([len(caught), [level, stream] == list(host)]), flush=True)
    os._exit(0)
os.waitpid(child, 0)
leave.set()
worker.join()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_during_a_compile_on_another_thread_is_left_as_the_host_was() -> None:
    """A process forked while another thread compiles: that compile never ends in the
    child, which kept every UserWarning ignored, the ``torch`` logger at CRITICAL and
    stderr filtered for good. The child puts them back at once."""
    done = subprocess.run(
        [sys.executable, "-c", _FORKED], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[1,", "true]"]
