"""The ``ptexec`` command: ``inspect`` a program, ``run`` a method, ``trace``/``profile`` a
call, show a method's memory ``plan``, ``generate`` text with an exported LLM, ``compile``
its methods (fill the cache)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["main"]

DEBUG_VARIABLE = "PTEXEC_DEBUG"  # set to 1: failures show their traceback


# ---- arguments and failures ------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (``ptexec run: argument --repeat: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _at_least(lowest: int, what: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


_positive = _at_least(1, "a positive integer")
_non_negative = _at_least(0, "an integer of 0 or more")


def _output_file(text: str) -> str:
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


def _save(obj: Any, path: str) -> None:
    """``torch.save`` into a file opened here, so that a failure is the OS's error."""
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)


def _one_line(text: str) -> str:
    """``text`` on one line: its lines joined with "; " (with a space after a colon)."""
    out = ""
    for line in filter(None, (line.strip() for line in text.splitlines())):
        out += (" " if out.endswith(":") else "; " if out else "") + line
    return out


def _failure(e: BaseException, args: argparse.Namespace) -> str:
    """The one line that reports ``e`` (without the ``ptexec:`` prefix)."""
    from .errors import DeviceUnavailableError

    if isinstance(e, DeviceUnavailableError) and e.hint:
        # the library's advice names device_map=; here, the flag
        flag = "--device" if hasattr(args, "device") else "--device-map"
        if e.cuda_devices:
            hint = f"run it on another GPU with {flag} " + (
                "cuda:0" if flag == "--device" else f"{e.device}=cuda:0"
            )
        else:
            hint = f"run it on the CPU with {flag} cpu"
        return f"{type(e).__name__}: {_one_line(e.reason)}; {hint}"
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        return f"{type(e).__name__}: {e.filename}: {e.strerror}"
    return f"{type(e).__name__}: {_one_line(str(e))}"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def _load(args: argparse.Namespace) -> Any:
    import ptexec

    return ptexec.load(args.file, data_path=args.data)


def _device_map(args: argparse.Namespace) -> Any:
    spec = getattr(args, "device_map", None)
    if not spec:
        return None
    if "=" in spec:
        pairs = [item.split("=", 1) for item in spec.split(",")]
        return {k.strip(): v.strip() for k, v in pairs}
    return spec


def _threads(args: argparse.Namespace) -> None:
    """Apply ``--threads`` as ptexec's one thread setting, before anything is loaded."""
    from .threads import set_num_threads

    n = args.threads
    if n is not None:
        if n < 1:
            raise ValueError(f"--threads must be 1 or more, got {n}")
        set_num_threads(n)


def _on_threads() -> str:
    """How many threads ran: torch's, and ExecuTorch's XNNPACK pool where it has another
    count (without ``--threads`` each keeps its default)."""
    from .threads import executorch_pool, get_num_threads

    n = get_num_threads()
    text = f"on {n} thread{'s' if n != 1 else ''}"
    pool = executorch_pool()
    if pool is not None and pool.threads() != n:
        text += f" (ExecuTorch's XNNPACK pool: {pool.threads()})"
    return text


def _add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=int,
        help="threads of torch's kernels and ExecuTorch's XNNPACK pool (default: torch's)",
    )


# ---- inspect ---------------------------------------------------------------------------


def _value_line(i: int, info: Any) -> str:
    from .loader import ScalarInfo

    if isinstance(info, ScalarInfo):
        return f"    {i}: {info.kind} (traced value {info.value!r})"
    dims = ", ".join(str(s) for s in info.sizes)
    dyn = "" if info.dynamism == "static" else f", {info.dynamism.replace('_', ' ')}"
    planned = "planned" if info.is_memory_planned else "unplanned (caller's memory)"
    return (
        f"    {i}: {str(info.dtype).removeprefix('torch.')}[{dims}] {info.layout} "
        f"on {info.device}, {planned}{dyn}"
    )


def _method_report(prog: Any, name: str, device_map: Any) -> dict[str, Any]:
    from .device import schema_device
    from .format import program as p

    meta = prog.method_meta(name, device_map=device_map)
    plan = next(pl for pl in prog.pte.program.execution_plan if pl.name == name)
    ops: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for chain in plan.chains:
        for ins in chain.instructions:
            kinds[type(ins).__name__] += 1
            if isinstance(ins, p.KernelCall):
                ops[plan.operators[ins.op_index].qualified_name] += 1
    devices: Counter[str] = Counter()
    for value in plan.values:
        if isinstance(value, p.Tensor):
            devices[str(schema_device(*value.device))] += 1
    delegates = []
    for d in plan.delegates:
        entry: dict[str, Any] = {
            "id": d.id,
            "compile_specs": {s.key: _spec_text(s.value) for s in d.compile_specs},
        }
        nodes = _delegate_nodes(prog, d)
        if nodes is not None:
            entry["nodes"] = nodes
        delegates.append(entry)
    return {
        "meta": meta,
        "operators": ops,
        "instructions": kinds,
        "tensor_devices": devices,
        "delegates": delegates,
    }


def _spec_text(value: bytes) -> str:
    try:
        text = value.decode("utf-8")
        if text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return value.hex() if len(value) <= 16 else f"{len(value)} bytes"


def _delegate_nodes(prog: Any, delegate: Any) -> dict[str, int] | None:
    """Node types and counts of a delegate payload, when its backend can describe it."""
    from .delegates import describe_payload

    try:
        return describe_payload(delegate.id, prog.pte.delegate_data(delegate.processed))
    except Exception:  # a payload the describer cannot read: inspect still reports the rest
        return None


def cmd_inspect(args: argparse.Namespace) -> int:
    prog = _load(args)
    pte = prog.pte
    device_map = _device_map(args)
    names = [args.method] if args.method else list(prog.method_names)
    reports = {name: _method_report(prog, name, device_map) for name in names}
    if args.json:
        print(json.dumps(_json_report(prog, reports), indent=2))
        return 0
    header = "extended header, " if pte.header is not None else ""
    print(
        f"{args.file}: ExecuTorch program, {_size(len(pte.data))}, {header}"
        f"{len(pte.segments)} segment(s), {len(prog.method_names)} method(s)"
    )
    if prog.ptd is not None:
        print(f"  external data: {args.data} ({len(prog.ptd.entries)} tensors)")
    for name, rep in reports.items():
        meta = rep["meta"]
        print(f"\nmethod '{name}': {meta.num_instructions} instructions")
        print("  inputs:")
        for i, info in enumerate(meta.inputs):
            print(_value_line(i, info))
        print("  outputs:")
        for i, info in enumerate(meta.outputs):
            print(_value_line(i, info))
        print(f"  memory plan: {_size(meta.planned_bytes)}")
        for b in meta.buffers:
            print(f"    {b}")
        print(
            "  tensors by device: "
            + ", ".join(f"{d}: {n}" for d, n in sorted(rep["tensor_devices"].items()))
        )
        if args.values:
            _print_values(prog, name)
        kinds = rep["instructions"]
        print("  instructions: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
        print(f"  operators ({len(rep['operators'])}):")
        for op, n in rep["operators"].most_common():
            print(f"    {n:5d}  {op}")
        if rep["delegates"]:
            print("  delegates:")
            for d in rep["delegates"]:
                specs = ", ".join(f"{k}={v}" for k, v in d["compile_specs"].items())
                print(f"    {d['id']}" + (f" ({specs})" if specs else ""))
                for node, n in sorted(d.get("nodes", {}).items(), key=lambda kv: -kv[1]):
                    print(f"      {n:5d}  {node}")
        if args.compile:
            _print_compiled(prog, name, device_map)
    return 0


def _print_values(prog: Any, name: str) -> None:
    """Every tensor value of a method: its type, layout, device label and where its
    memory comes from."""
    from .device import schema_device
    from .format import program as p
    from .format.scalar_type import scalar_type_name
    from .tensor import layout_name

    plan = next(pl for pl in prog.pte.program.execution_plan if pl.name == name)
    inputs = {slot: i for i, slot in enumerate(plan.inputs)}
    outputs = {slot: i for i, slot in enumerate(plan.outputs)}
    print("  tensors:")
    for j, t in enumerate(plan.values):
        if not isinstance(t, p.Tensor):
            continue
        dims = ", ".join(str(s) for s in t.sizes)
        if t.allocation_info is not None:
            where = f"buffer {t.allocation_info.memory_id} at {t.allocation_info.memory_offset}"
        elif t.is_external:
            where = "external data"
        elif t.is_constant:
            where = "constant"
        else:
            where = "unplanned"
        roles = [f"input {inputs[j]}"] if j in inputs else []
        roles += [f"output {outputs[j]}"] if j in outputs else []
        dyn = "" if t.shape_dynamism == p.STATIC else f" {p.DYNAMISM_NAMES[t.shape_dynamism]}"
        print(
            f"    v{j:<5} {scalar_type_name(t.scalar_type)}[{dims}] {layout_name(t.dim_order)}{dyn}"
            f" on {schema_device(*t.device)}, {where}" + (f" ({', '.join(roles)})" if roles else "")
        )


def _json_report(prog: Any, reports: dict[str, Any]) -> dict[str, Any]:
    from .loader import ScalarInfo

    def value(info: Any) -> dict[str, Any]:
        if isinstance(info, ScalarInfo):
            return {"kind": info.kind, "value": info.value}
        return {
            "kind": "tensor",
            "dtype": str(info.dtype).removeprefix("torch."),
            "sizes": list(info.sizes),
            "dim_order": list(info.dim_order) if info.dim_order is not None else None,
            "device": str(info.device),
            "is_memory_planned": info.is_memory_planned,
            "dynamism": info.dynamism,
            "nbytes": info.nbytes,
        }

    methods = {}
    for name, rep in reports.items():
        meta = rep["meta"]
        methods[name] = {
            "inputs": [value(i) for i in meta.inputs],
            "outputs": [value(o) for o in meta.outputs],
            "buffers": [
                {
                    "index": b.index,
                    "size": b.size,
                    "device": str(b.device),
                    "device_source": b.device_source,
                    "shared": b.shared,
                }
                for b in meta.buffers
            ],
            "instructions": dict(rep["instructions"]),
            "operators": dict(rep["operators"]),
            "tensor_devices": dict(rep["tensor_devices"]),
            "delegates": rep["delegates"],
        }
    return {"methods": methods, "segments": len(prog.pte.segments), "size": len(prog.pte.data)}


# ---- run -------------------------------------------------------------------------------


def _random_input(info: Any, generator: Any) -> Any:
    import torch

    from .loader import ScalarInfo

    if isinstance(info, ScalarInfo):
        return info.value
    dtype = info.dtype
    sizes = info.sizes
    device = info.device.to_torch()
    if dtype == torch.bool:
        x = torch.randint(0, 2, sizes, generator=generator).bool()
    elif dtype.is_floating_point or dtype.is_complex:
        x = torch.randn(sizes, generator=generator).to(dtype)
    else:
        x = torch.randint(0, 8, sizes, generator=generator).to(dtype)
    if info.dim_order is not None and info.dim_order != tuple(range(len(sizes))):
        x = (
            x.permute(info.dim_order)
            .contiguous()
            .permute([info.dim_order.index(d) for d in range(len(sizes))])
        )
    return x.to(device)


def _read_inputs(paths: Sequence[str]) -> list[Any]:
    """The inputs in ``--input`` files: a ``.npy`` array, or a tensor, number or list of
    them saved with ``torch.save``. Read without running anything from the file (numpy
    without pickles, torch with ``weights_only``); a file that does not hold that is an
    :class:`~ptexec.errors.InputError` saying what it holds."""
    import torch

    inputs: list[Any] = []
    for path in paths:
        with open(path, "rb") as f:  # a missing file, a directory: the OS's error
            head = f.read(4096)
        if not head:
            raise _input_error(path, "the file is empty (0 bytes)")
        if Path(path).suffix == ".npy":
            inputs.append(_read_npy(path))
            continue
        try:
            with warnings.catch_warnings():  # the refusal below says what is wrong
                warnings.simplefilter("ignore")
                data = torch.load(path, weights_only=True)
        except Exception as e:  # whatever torch makes of hostile bytes: a refusal
            raise _input_error(path, _unreadable(e, path, head)) from e
        items = list(data) if isinstance(data, list | tuple) else [data]
        for item in items:
            if not (item is None or isinstance(item, torch.Tensor | bool | int | float)):
                kind = "a list holding " if item is not data else ""
                raise _input_error(
                    path,
                    f"it holds {kind}a {type(item).__name__}; expected a tensor, a number "
                    "(or None), or a list or tuple of them",
                )
        inputs.extend(items)
    return inputs


def _read_npy(path: str) -> Any:
    import numpy as np
    import torch

    try:
        array = np.load(path, allow_pickle=False)
        if not isinstance(array, np.ndarray):
            raise ValueError(f"it holds a {type(array).__name__}, not one array")
        return torch.from_numpy(array)
    except Exception as e:
        raise _input_error(path, f"not an array numpy reads safely: {_one_line(str(e))}") from e


def _input_error(path: str, message: str) -> Exception:
    from .errors import InputError

    return InputError(
        f"input file {path}: {message} (save inputs with torch.save(tensor or list) or numpy.save)"
    )


def _unreadable(e: Exception, path: str, head: bytes) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in a phrase."""
    import mmap
    import pickle

    import torch

    from .format.identify import describe

    try:  # the whole file, for what a zip archive holds
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            what = describe(memoryview(m))
    except (OSError, ValueError, BufferError):  # not a file that maps (a pipe, a device)
        what = describe(head)
    what = what.split(";")[0] if what is not None else None
    torch_like = head.startswith(b"PK\x03\x04") or head.startswith(b"\x80")
    text = str(e)
    if what is not None and not torch_like:
        return f"not a file torch.save wrote: {what}"
    if isinstance(e, pickle.UnpicklingError) and text.startswith("Weights only load failed"):
        # torch's first paragraph is advice to load unsafely, its last a link; between them
        # is what it refused
        body = text.partition("\n")[2].split("Check the documentation")[0]
        detail = _one_line(body.rpartition("WeightsUnpickler error:")[2]).rstrip(".")
        return (
            "it holds Python objects other than tensors, which loading without running "
            f"code refuses ({detail or 'no detail'})"
        )
    if "CUDA device" in text and not torch.cuda.is_available():
        return "it holds CUDA tensors, and torch has no CUDA device here"
    if what is not None and not what.startswith(("it is a PyTorch", "it is a Python pickle")):
        return f"not a file torch.save wrote: {what}"
    return f"torch.load cannot read it ({type(e).__name__}: {_one_line(text) or 'no detail'})"


def _summary(x: Any) -> str:
    import torch

    if not isinstance(x, torch.Tensor):
        return f"{type(x).__name__} {x!r}"
    dims = ", ".join(str(s) for s in x.shape)
    text = f"{str(x.dtype).removeprefix('torch.')}[{dims}] on {x.device}"
    if x.numel():
        f = x.detach().double() if not x.is_complex() else x.detach().abs().double()
        finite = f[f.isfinite()]
        if finite.numel():
            text += (
                f"  min {finite.min().item():.4g}  max {finite.max().item():.4g}"
                f"  mean {finite.mean().item():.4g}"
            )
        bad = f.numel() - finite.numel()
        if bad:
            text += f"  ({bad} not finite)"
    return text


def _method_and_inputs(args: argparse.Namespace, **options: Any) -> tuple[Any, list[Any]]:
    """Load the method ``args`` names and make its inputs (``--input`` files, or random
    ones from its metadata and ``--seed``); print what they are."""
    import torch

    prog = _load(args)
    name = args.method or ("forward" if "forward" in prog.method_names else prog.method_names[0])
    if args.device_map:
        options["device_map"] = _device_map(args)
    method = prog.load_method(name, **options)
    if args.input:
        inputs = _read_inputs(args.input)
    else:
        from .llm.decoder import example_inputs

        gen = torch.Generator().manual_seed(args.seed)
        llm_inputs = example_inputs(prog, method.meta, gen)
        if llm_inputs is not None:  # random positions would run past the KV cache
            inputs = llm_inputs
            print(
                f"method '{name}' of an LLM: random tokens at positions from 0 (for text: "
                f"ptexec generate {args.file} --tokenizer tokenizer.json --prompt ...)"
            )
        else:
            inputs = [_random_input(info, gen) for info in method.meta.inputs]
            print(f"method '{name}': {len(inputs)} random input(s) from the method's metadata")
    for i, x in enumerate(inputs):
        print(f"  input {i}: {_summary(x)}")
    return method, inputs


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    _threads(args)
    with _report_has_warnings():
        method, inputs = _method_and_inputs(args, **_compile_option(args))
    if method.compile_report is not None:
        print("  " + method.compile_report.summary().replace("\n", "\n  "))
    outputs = method.execute(inputs)
    cuda = torch.cuda.is_available()
    for _ in range(min(args.repeat, 5)):  # warm-up calls, not timed
        method.execute(inputs)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        method.execute(inputs)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    for i, y in enumerate(outputs):
        print(f"  output {i}: {_summary(y)}")
    rec = method.last_call
    copied = ", ".join(f"{k} {v}" for k, v in rec.bytes_copied.items() if v) or "none"
    print(f"  inputs bound: {', '.join(rec.inputs) or 'none'}; bytes copied: {copied}")
    if times:
        med = statistics.median(times)
        print(
            f"  latency: median {med * 1e3:.3f} ms over {len(times)} call(s) (min {min(times) * 1e3:.3f} ms)"
            f" {_on_threads()}"
        )
    if args.output:
        _save(outputs, args.output)
        print(f"  outputs saved to {args.output}")
    return 0


# ---- compile -----------------------------------------------------------------------------


def _compile_option(args: argparse.Namespace) -> dict[str, Any]:
    if not getattr(args, "compile", False):
        return {}
    from .compile import CompileOptions

    return {"compile": CompileOptions(progress=None)}


def _print_compiled(prog: Any, name: str, device_map: Any) -> Any:
    """Load method ``name`` compiled (from the cache, or compiling it) and print the report."""
    from .compile import CompileOptions

    with _report_has_warnings():
        method = prog.load_method(
            name, device_map=device_map, compile=CompileOptions(progress=None)
        )
    report = method.compile_report
    print("  " + report.summary().replace("\n", "\n  "))
    return report


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile every method (or ``--method``) for ``--device``, filling the cache, so that
    ``load_method(..., compile=True)`` later compiles nothing."""
    _threads(args)
    prog = _load(args)
    device_map = args.device or _device_map(args)
    names = [args.method] if args.method else list(prog.method_names)
    print(f"compiling {_on_threads()}")
    status = 0
    for name in names:
        print(f"method '{name}':")
        report = _print_compiled(prog, name, device_map)
        if report.warning and not report.compiled_instructions:
            status = 1
    return status


def cmd_cache(args: argparse.Namespace) -> int:
    """``ptexec cache list|verify|clear``: the compile cache's entries, checked, or removed."""
    from datetime import datetime

    from .compile.cache import Cache, cache_dir, max_bytes, root_status
    from .errors import CacheEntryError

    root = Path(args.dir).expanduser() if args.dir else cache_dir()
    if not root.exists():
        print(f"compile cache {root}: empty (the directory does not exist yet)")
        return 0
    problem, writable = root_status(root)
    if problem is not None:
        print(f"compile cache {root}: not used: {problem}")
        return 1
    cache = Cache(root, writable)
    if args.action == "clear":
        print(f"compile cache {root}: removed {cache.clear()} entries")
        return 0
    print(f"compile cache {root} ({'writable' if writable else 'read only'})")
    damaged = 0
    total = 0
    entries = cache.entries()
    for entry in entries:
        size = entry.size()
        total += size
        used = datetime.fromtimestamp(entry.last_used()).strftime("%Y-%m-%d %H:%M")
        try:
            manifest = entry.verify()
            what = f"'{manifest.method}', {len(manifest.regions)} region(s)"
        except CacheEntryError as e:
            damaged += 1
            what = f"damaged: {e}"
        print(f"  {entry.key[:16]}  {size / 2**20:9.2f} MiB  used {used}  {what}")
    for path in cache.leftovers():
        print(f"  {path.name}: left by a compile that did not finish")
    cap = max_bytes()
    limit = f"of {cap / 2**30:.1f} GiB (PTEXEC_CACHE_MAX_BYTES)" if cap else "(no size limit)"
    noun = "entry" if len(entries) == 1 else "entries"
    print(f"{len(entries)} {noun}, {total / 2**20:.2f} MiB {limit}; {damaged} damaged")
    return 1 if args.action == "verify" and damaged else 0


# ---- trace, profile, plan ----------------------------------------------------------------


class _Progress:
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


def cmd_trace(args: argparse.Namespace) -> int:

    _threads(args)
    method, inputs = _method_and_inputs(args, optimize=not args.no_optimize)
    progress = _Progress("trace: {done} instructions run ({total} in the program)")
    try:
        tr = method.trace(
            inputs,
            tensors=bool(args.save_tensors),
            reference=args.reference,
            stop_on=args.stop_on,
            reads=args.reads,
            progress=progress,
        )
    finally:
        progress.close()
    print(tr.table(limit=args.limit))
    print(f"  ran {_on_threads()}")
    if tr.outputs is not None:
        for i, y in enumerate(tr.outputs):
            print(f"  output {i}: {_summary(y)}")
    if args.reference and tr.records:
        worst = tr.worst(args.worst)
        if worst:
            print("largest errors against the float64 reference:")
            for r in worst:
                print(f"  instruction {r.index} {r.name}: {r.error}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(tr.to_dict(), f, indent=1, default=repr)
        print(f"  trace saved to {args.json}")
    if args.save_tensors:
        _save(tr.tensors(), args.save_tensors)
        print(f"  tensors saved to {args.save_tensors}")
    return 2 if tr.stopped is not None else 0


def cmd_profile(args: argparse.Namespace) -> int:
    _threads(args)
    method, inputs = _method_and_inputs(args, optimize=not args.no_optimize)
    progress = _Progress("profile: call {done} of {total}")
    try:
        prof = method.profile(inputs, repeat=args.repeat, warmup=args.warmup, progress=progress)
    finally:
        progress.close()
    by = ["operator", "instruction"] if args.by == "both" else [args.by]
    for k, table in enumerate(by):
        if k:
            print()
        print(prof.table(by=table, top=args.top))
    print(f"  ran {_on_threads()}")
    if args.chrome_trace:
        prof.save_chrome_trace(args.chrome_trace)
        print(
            f"  Chrome trace saved to {args.chrome_trace} (open it in Perfetto or chrome://tracing)"
        )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .plan import memory_plan

    prog = _load(args)
    names = [args.method] if args.method else list(prog.method_names)
    plans = [memory_plan(prog, name, device_map=_device_map(args)) for name in names]
    if args.json:
        print(json.dumps([mp.to_dict() for mp in plans], indent=1))
    else:
        for k, mp in enumerate(plans):
            if k:
                print()
            print(mp.summary(top=args.top))
    if args.out:
        out = Path(args.out)
        for mp in plans:
            path = out if len(plans) == 1 else out.with_name(f"{out.stem}.{mp.method}{out.suffix}")
            try:
                mp.draw(path)
            except ImportError as e:
                print(f"ptexec: {e}", file=sys.stderr)
                return 1
            print(f"  picture saved to {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


# ---- main ------------------------------------------------------------------------------


# ---- generate ----------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    """Stream generated text to stdout; timings to stderr at the end."""
    from .llm import GenerationConfig, TextLLMRunner

    # the settings are checked before the program loads; the runner checks the prompt and
    # the budget before it prints anything
    config = GenerationConfig(
        echo=not args.no_echo,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        num_bos=args.bos,
        stop=args.stop or (),
        ignore_eos=args.ignore_eos,
    )
    _threads(args)
    device_map = args.device if args.device else None
    runner = TextLLMRunner(
        args.file,
        args.tokenizer,
        args.data,
        device_map=device_map,
        compile=args.compile,
        print_output=False,
    )

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    prompt = args.prompt
    if args.chat:  # the prompt is the user's message, rendered by the model's chat template
        from .llm.chat import ChatTemplate

        template = ChatTemplate.for_tokenizer(args.tokenizer, args.chat_template)
        if template is None:
            print("ptexec: --chat needs a chat template (tokenizer_config.json or "
                  "--chat-template)", file=sys.stderr)  # fmt: skip
            return 1
        prompt = template.render([{"role": "user", "content": prompt}])
        config.echo = False
    runner.generate(prompt, config, token_callback=show)
    sys.stdout.write("\n")
    stats = runner.stats
    load_ms = stats.model_load_end_ms - stats.model_load_start_ms
    print(
        f"load {load_ms:.1f} ms; prompt {stats.num_prompt_tokens} tokens, prefill "
        f"{stats.prefill_ms:.2f} ms; first token after {stats.time_to_first_token_ms:.2f} ms; "
        f"{stats.num_generated_tokens} tokens generated, {stats.tokens_per_second:.1f} tokens/s "
        f"{_on_threads()}",
        file=sys.stderr,
    )
    if args.stats:
        print(stats.to_json_string(), file=sys.stderr)
    return 0


def _add_generate(sub: Any) -> None:
    p = sub.add_parser(
        "generate", help="generate text with an exported LLM (KV-cache .pte) and its tokenizer"
    )
    p.add_argument("file", help="the .pte program (an LLM export)")
    p.add_argument(
        "--tokenizer",
        required=True,
        help="tokenizer.json (Hugging Face), tiktoken, SentencePiece or llama2.c file",
    )
    p.add_argument("--prompt", required=True, help="the prompt")
    p.add_argument("--data", help="external data file (.ptd) of the program")
    p.add_argument(
        "--max-new-tokens", type=int, default=128, help="most tokens to generate (-1: context)"
    )
    p.add_argument(
        "--temperature", type=float, default=0.8, help="sampling temperature; 0 is greedy"
    )
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling mass (1: off)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: off)")
    p.add_argument("--seed", type=int, help="seed of the sampler (default: random)")
    p.add_argument("--bos", type=int, default=0, help="BOS tokens to put before the prompt")
    p.add_argument("--stop", action="append", help="stop string; repeatable")
    p.add_argument("--ignore-eos", action="store_true", help="generate past EOS tokens")
    p.add_argument("--no-echo", action="store_true", help="do not print the prompt first")
    p.add_argument("--device", help="run the program on this device (cpu, cuda, cuda:1)")
    p.add_argument(
        "--compile", action="store_true", help="run the program through ptexec's compiled tier"
    )
    _add_threads(p)
    p.add_argument("--stats", action="store_true", help="also print the statistics as JSON")
    p.add_argument("--chat", action="store_true", help="the prompt is a user message (template)")
    p.add_argument("--chat-template", help="a Jinja chat template file (with --chat)")
    p.set_defaults(func=cmd_generate)


# ---- serve -------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve an LLM program over OpenAI's HTTP API until SIGTERM drains it."""
    try:
        from .serve import Engine, Server
    except ImportError as e:
        print(f"ptexec: serving needs {e.name} (pip install 'ptexec[serve]')", file=sys.stderr)
        return 1
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    engine = None
    if args.tokenizer:
        engine = Engine(
            args.file,
            args.tokenizer,
            data_path=args.data,
            model_name=args.model_name,
            sessions=args.max_sessions,
            max_queue=args.max_queue,
            timeout=args.timeout,
            device_map=args.device or None,
            compile=args.compile,
            chat_template=args.chat_template,
        )
    programs = None
    if args.programs or engine is None:  # every method at /v1/programs/{method}
        from . import load
        from .serve import ProgramService

        program = engine.program if engine is not None else load(args.file, data_path=args.data)
        device = {"device_map": args.device} if args.device else {}
        programs = ProgramService(program, window=args.batch_window_ms / 1e3, **device)
    server = Server(
        engine,
        args.host,
        args.port,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        log_level=args.log_level,
        programs=programs,
    )
    what = f"'{engine.model_name}'" if engine is not None else "the program's methods"
    print(f"ptexec: serving {what} at {server.url}/v1", file=sys.stderr, flush=True)
    server.run()
    return 0


def _add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve an LLM program over OpenAI's HTTP API")
    p.add_argument("file", help="the .pte program (an LLM export)")
    p.add_argument(
        "--tokenizer", help="tokenizer.json, chat template beside it (without: methods only)"
    )
    p.add_argument("--programs", action="store_true", help="also serve /v1/programs/{method}")
    p.add_argument(
        "--batch-window-ms", type=float, default=2.0, help="micro-batching window of methods"
    )
    p.add_argument("--data", help="external data file (.ptd) of the program")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one)")
    p.add_argument("--model-name", help="the model id clients send (default: the file's stem)")
    p.add_argument("--max-sessions", type=int, default=1, help="concurrent generations")
    p.add_argument("--max-queue", type=int, default=16, help="requests waiting beyond them")
    p.add_argument("--timeout", type=float, help="seconds a request may take (default: none)")
    p.add_argument("--device", help="run the program on this device (cpu, cuda, cuda:1)")
    p.add_argument("--compile", action="store_true", help="use ptexec's compiled tier")
    p.add_argument("--chat-template", help="a Jinja chat template file")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY'")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body")
    p.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    p.set_defaults(func=cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ptexec",
        description="Run and inspect ExecuTorch programs (.pte) with PyTorch kernels.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("file", help="the .pte program")
        p.add_argument("--data", help="external data file (.ptd) of the program")
        p.add_argument("--method", help="method name (default: all for inspect, forward for run)")
        p.add_argument(
            "--device-map", help="remap devices: 'cpu', 'cuda:0', or 'cuda:0=cpu,cuda:1=cpu'"
        )

    p_inspect = sub.add_parser(
        "inspect", help="methods, inputs/outputs with devices, memory plan, operators, delegates"
    )
    common(p_inspect)
    p_inspect.add_argument("--json", action="store_true", help="print JSON")
    p_inspect.add_argument(
        "--values", action="store_true", help="list every tensor with its device and memory"
    )
    p_inspect.add_argument(
        "--compile",
        action="store_true",
        help="also compile each method (or read it from the cache) and show what runs compiled",
    )
    p_inspect.set_defaults(func=cmd_inspect)

    p_run = sub.add_parser(
        "run", help="run a method on random or given inputs; print outputs and latency"
    )
    common(p_run)
    p_run.add_argument(
        "--input", action="append", help="input file (.pt: a tensor or a list; .npy); repeatable"
    )
    p_run.add_argument(
        "--repeat", type=_positive, default=20, help="timed calls after the first (default 20)"
    )
    p_run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p_run.add_argument(
        "--output", type=_output_file, help="save the outputs (torch.save) to this file"
    )
    p_run.add_argument(
        "--compile",
        action="store_true",
        help="run the compiled tier (compile=True); show its report",
    )
    _add_threads(p_run)
    p_run.set_defaults(func=cmd_run)

    p_compile = sub.add_parser(
        "compile",
        help="compile methods with AOTInductor into the cache (PTEXEC_CACHE_DIR); show the report",
    )
    common(p_compile)
    p_compile.add_argument(
        "--device", help="compile for this device (as --device-map: 'cpu', 'cuda:0', ...)"
    )
    _add_threads(p_compile)
    p_compile.set_defaults(func=cmd_compile)

    p_cache = sub.add_parser(
        "cache", help="the compile cache: list its entries, verify them, or clear it"
    )
    p_cache.add_argument("action", choices=["list", "verify", "clear"])
    p_cache.add_argument("--dir", help="the cache directory (default: PTEXEC_CACHE_DIR, ...)")
    p_cache.set_defaults(func=cmd_cache)

    def inputs(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--input",
            action="append",
            help="input file (.pt: a tensor or a list; .npy); repeatable",
        )
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        _add_threads(p)
        p.add_argument(
            "--no-optimize",
            action="store_true",
            help="run every instruction as the file says (no load-time views or folding)",
        )

    p_trace = sub.add_parser(
        "trace", help="run a method once and show what every instruction wrote"
    )
    common(p_trace)
    inputs(p_trace)
    p_trace.add_argument(
        "--reference",
        action="store_true",
        help="also run a float64 reference and show each result's error against it",
    )
    p_trace.add_argument(
        "--stop-on",
        choices=["nan", "inf", "nonfinite"],
        help="stop at the first instruction that writes a NaN / an Inf / either (exit status 2)",
    )
    p_trace.add_argument("--reads", action="store_true", help="also summarise what each one read")
    p_trace.add_argument("--limit", type=_positive, help="show at most this many instructions")
    p_trace.add_argument(
        "--worst", type=_non_negative, default=5, help="largest errors to list (--reference)"
    )
    p_trace.add_argument("--json", type=_output_file, help="save the trace as JSON to this file")
    p_trace.add_argument(
        "--save-tensors",
        type=_output_file,
        help="save every tensor written (torch.save) to this file",
    )
    p_trace.set_defaults(func=cmd_trace)

    p_profile = sub.add_parser(
        "profile", help="time every instruction; tables by operator and instruction, Chrome trace"
    )
    common(p_profile)
    inputs(p_profile)
    p_profile.add_argument("--repeat", type=_positive, default=10, help="timed calls (default 10)")
    p_profile.add_argument(
        "--warmup", type=_non_negative, default=1, help="untimed calls first (default 1)"
    )
    p_profile.add_argument(
        "--by", choices=["operator", "instruction", "both"], default="operator", help="table rows"
    )
    p_profile.add_argument("--top", type=_positive, default=20, help="rows to show (default 20)")
    p_profile.add_argument(
        "--chrome-trace",
        type=_output_file,
        help="save a Chrome trace (JSON; Perfetto, chrome://tracing)",
    )
    p_profile.set_defaults(func=cmd_profile)

    p_plan = sub.add_parser(
        "plan", help="the memory plan: buffers, tensor lifetimes, peak bytes live; a picture"
    )
    common(p_plan)
    p_plan.add_argument(
        "--out",
        type=_output_file,
        help="draw the plan to this file (.png, .svg, .pdf; needs matplotlib)",
    )
    p_plan.add_argument(
        "--top", type=_positive, default=10, help="largest tensors to list (default 10)"
    )
    p_plan.add_argument("--json", action="store_true", help="print JSON")
    p_plan.set_defaults(func=cmd_plan)
    _add_generate(sub)
    _add_serve(sub)
    return parser


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    print(f"ptexec: warning: {_one_line(str(message))}", file=sys.stderr)


@contextmanager
def _report_has_warnings() -> Iterator[None]:
    """Around a load whose compile report is printed: the report carries its warning."""
    from .compile import CompileWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompileWarning)
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ptexec`` command. A failure is one line on stderr (``ptexec: <type>:
    <what>``) and exit status 1 (2 for a usage error, 130 when interrupted);
    ``PTEXEC_DEBUG=1`` shows its traceback instead."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _show_warning
        try:
            return int(args.func(args))
        except KeyboardInterrupt:
            if debug:
                raise
            print("ptexec: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # the reader of stdout went away (ptexec inspect ... | head)
            # nothing more goes to it, not even what the interpreter flushes at exit (when
            # stdout is a file at all)
            with suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        except Exception as e:
            if debug:
                raise
            from .errors import PtexecError

            line = _failure(e, args)
            if not isinstance(e, PtexecError | OSError | ValueError | TypeError):
                line += f" ({DEBUG_VARIABLE}=1 shows where)"
            print(f"ptexec: {line}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
