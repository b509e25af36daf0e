"""What every command shares: argument types, one-line failures, threads, progress."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

DEBUG_VARIABLE = "PTEXEC_DEBUG"  # set to 1: failures show their traceback


class Parser(argparse.ArgumentParser):
    """Usage errors in one line (``ptexec run: argument --repeat: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def at_least(lowest: int, what: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


positive = at_least(1, "a positive integer")


non_negative = at_least(0, "an integer of 0 or more")


PICTURE_FORMATS = ("eps", "jpeg", "jpg", "pdf", "png", "ps", "svg", "svgz", "tif", "tiff", "webp")
"""The file types a picture is drawn to (matplotlib's ``savefig`` formats, by suffix)."""


def picture_file(text: str) -> str:
    """:func:`output_file` whose suffix names a picture format (checked before the work,
    not by matplotlib after it)."""
    suffix = Path(text).suffix.lower().lstrip(".")
    if suffix not in PICTURE_FORMATS:
        raise argparse.ArgumentTypeError(
            f"cannot draw to {text}: its suffix names no picture format "
            f"({', '.join('.' + f for f in PICTURE_FORMATS)})"
        )
    return output_file(text)


def output_file(text: str) -> str:
    """An argument naming a file to write: refused at once (before the work that fills
    it) when it is a directory or its directory is missing or not writable."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give the name of a file")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"cannot write {text}: {parent} {what}")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return text


def save(obj: Any, path: str) -> None:
    """``torch.save`` into a file opened here, so that a failure is the OS's error."""
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)


def one_line(text: str) -> str:
    """``text`` on one line: its lines joined with "; " (with a space after a colon)."""
    out = ""
    for line in filter(None, (line.strip() for line in text.splitlines())):
        out += (" " if out.endswith(":") else "; " if out else "") + line
    return out


def failure(e: BaseException, args: argparse.Namespace) -> str:
    """The one line that reports ``e`` (without the ``ptexec:`` prefix)."""
    from ..errors import DeviceUnavailableError

    if isinstance(e, DeviceUnavailableError) and e.hint:
        # the library's advice names device_map=; here, the flag
        flag = "--device" if hasattr(args, "device") else "--device-map"
        if e.cuda_devices:
            hint = f"run it on another GPU with {flag} " + (
                "cuda:0" if flag == "--device" else f"{e.device}=cuda:0"
            )
        else:
            hint = f"run it on the CPU with {flag} cpu"
        return f"{type(e).__name__}: {one_line(e.reason)}; {hint}"
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        return f"{type(e).__name__}: {e.filename}: {e.strerror}"
    return f"{type(e).__name__}: {one_line(str(e))}"


def size_text(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def load_program(args: argparse.Namespace) -> Any:
    """The program of ``args.file``; the external data files found beside it (no
    ``--data``) are named on stderr, as they decide the weights."""
    import ptexec

    prog = ptexec.load(args.file, data_path=args.data)
    if not args.data:
        found = [str(q) for q in prog.paths[1:] if q is not None]
        if found:
            print(f"ptexec: external data from {', '.join(found)}", file=sys.stderr)
    return prog


def device_map_of(args: argparse.Namespace) -> Any:
    spec = getattr(args, "device_map", None)
    if not spec:
        return None
    if "=" in spec:
        items = spec.split(",")
        bad = [item for item in items if "=" not in item]
        if bad:
            raise ValueError(
                f"--device-map: '{bad[0]}' is not FROM=TO (e.g. cuda:0=cpu,cuda:1=cpu)"
            )
        mapping: dict[str, str] = {}
        for item in items:
            source, _, target = (part.strip() for part in item.partition("="))
            if source in mapping:  # (a dict would keep the last without a word)
                raise ValueError(
                    f"--device-map: '{source}' is mapped twice ({mapping[source]} and "
                    f"{target}): give each device one place"
                )
            mapping[source] = target
        return mapping
    return spec


def apply_threads(args: argparse.Namespace) -> None:
    """Apply ``--threads`` as ptexec's one thread setting, before anything is loaded."""
    from ..threads import set_num_threads

    n = args.threads
    if n is not None:
        if n < 1:
            raise ValueError(f"--threads must be 1 or more, got {n}")
        set_num_threads(n)


def threads_used() -> str:
    """How many threads ran: torch's, and ExecuTorch's XNNPACK pool where it has another
    count (without ``--threads`` each keeps its default)."""
    from ..threads import executorch_pool, get_num_threads

    n = get_num_threads()
    text = f"on {n} thread{'s' if n != 1 else ''}"
    pool = executorch_pool()
    if pool is not None and pool.threads() != n:
        text += f" (ExecuTorch's XNNPACK pool: {pool.threads()})"
    return text


def json_text(value: Any, indent: int | None = None) -> str:
    """``value`` as strict JSON: a non-finite float is the string "nan", "inf" or "-inf"
    (JSON has no such numbers, and strict readers such as jq refuse Python's NaN)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(value), indent=indent, allow_nan=False, default=repr)


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=positive,
        help="threads of torch's kernels and ExecuTorch's XNNPACK pool (default: torch's)",
    )


def add_xnnpack(p: argparse.ArgumentParser) -> None:
    # checked by the runners' one rule (ptexec.llm.decoder.load_options)
    p.add_argument(
        "--xnnpack",
        default="auto",
        metavar="RUNNER",
        help="which runner runs the program's XNNPACK payloads: auto (ExecuTorch's XNNPACK "
        "backend on the CPU where it can, else ptexec's; the default), torch (ptexec's), "
        "executorch",
    )


class Progress:
    """Progress of a long run on stderr: nothing for the first second, then a line at most
    every half second (rewritten in place on a terminal)."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt  # with {done} and {total}
        self.start = time.perf_counter()
        self.last = self.start
        self.shown = False
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self.start < 1.0 or now - self.last < 0.5:
            return
        self.last = now
        self.shown = True
        text = self.fmt.format(done=done, total=total) + f" ({now - self.start:.0f} s)"
        if self.tty:
            print("\r" + text, end="", file=sys.stderr, flush=True)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.shown and self.tty:
            print(file=sys.stderr)


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    print(f"ptexec: warning: {one_line(str(message))}", file=sys.stderr)


@contextmanager
def report_has_warnings() -> Iterator[None]:
    """Around a load whose compile report is printed: the report carries its warning."""
    from ..compile import CompileWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompileWarning)
        yield
