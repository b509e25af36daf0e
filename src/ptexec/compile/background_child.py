"""The child process of a background compile (``python -m ptexec.compile.background_child``).

It reads one JSON request on stdin (the program's files, the method, its load options, the
thread count, the cache key the parent computed), loads the program as the parent did,
compiles the method's regions into the cache, and writes one JSON line (``ok``, ``reason``)
on the stdout it was given. It ends when its parent closes stdin without saying ``detach``.
Only this entry point imports the package's API (nothing imports it), so the compile tier
keeps no import of the layers above it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import warnings

import torch

from .background import NICE
from .report import CompileWarning
from .runner import CompileOptions, RegionBuilder


def _watch_stdin() -> None:
    """End this process when its parent closes our stdin without detaching it."""
    for line in sys.stdin.buffer:
        if line.strip() == b"detach":
            return
    os._exit(3)


def _child_main() -> int:
    result = os.dup(1)
    os.dup2(2, 1)  # whatever torch or a compiler prints goes to stderr, not the result
    line = sys.stdin.buffer.readline()
    threading.Thread(target=_watch_stdin, daemon=True).start()
    with contextlib.suppress(OSError, AttributeError):
        os.nice(NICE)

    def answer(ok: bool, reason: str) -> int:
        with contextlib.suppress(OSError):  # a detached child's parent may be gone
            os.write(result, (json.dumps({"ok": ok, "reason": reason}) + "\n").encode())
        return 0 if ok else 1

    try:
        request = json.loads(line)
        torch.set_num_threads(int(request["threads"]))
        import ptexec

        files = [str(f) for f in request["files"]]
        prog = ptexec.load(
            files[0],
            data_path=files[1:] or None,
            share_state=request["share_state"],
            # read as the parent read them: a private copy unless it mapped them, so that
            # a file rewritten in place after the key was checked compiles nothing else
            mmap=request["mmap"] is True,
        )
        method = prog.load_method(str(request["method"]), fast_path=False, **request["load"])
        opts = request["options"]
        options = CompileOptions(
            min_instructions=int(opts["min_instructions"]),
            autotune=bool(opts["autotune"]),
            progress=False,
        )
        builder = RegionBuilder(method.state, prog, options)
        entry = builder.entry()
        if entry is None or entry.key != request["key"]:
            return answer(
                False,
                "the cache key here is not the loading process's: the program's files, "
                "ptexec's sources or the compile settings changed since it was loaded",
            )
        builder.build()
        report = builder.report()
        if builder.cache_path is None:
            return answer(False, report.warning or "nothing was kept in the compile cache")
        if report.warning:  # some regions failed: nothing was kept (the next load tries)
            return answer(False, report.warning)
        return answer(True, "")
    except Exception as e:
        return answer(False, f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompileWarning)
        sys.exit(_child_main())
