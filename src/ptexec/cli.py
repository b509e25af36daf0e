"""The ``ptexec`` command: ``inspect`` a program, ``run`` a method, ``trace``/``profile`` a
call, show a method's memory ``plan``, ``generate`` text with an exported LLM, ``compile``
its methods (fill the cache)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]


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
    import torch

    inputs: list[Any] = []
    for path in paths:
        suffix = Path(path).suffix
        if suffix == ".npy":
            import numpy as np

            inputs.append(torch.from_numpy(np.load(path)))
        else:
            data = torch.load(path, weights_only=True)
            if isinstance(data, list | tuple):
                inputs.extend(data)
            else:
                inputs.append(data)
    return inputs


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
        gen = torch.Generator().manual_seed(args.seed)
        inputs = [_random_input(info, gen) for info in method.meta.inputs]
        print(f"method '{name}': {len(inputs)} random input(s) from the method's metadata")
    for i, x in enumerate(inputs):
        print(f"  input {i}: {_summary(x)}")
    return method, inputs


def cmd_run(args: argparse.Namespace) -> int:
    import torch

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
        )
    if args.output:
        torch.save(outputs, args.output)
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

    method = prog.load_method(name, device_map=device_map, compile=CompileOptions(progress=None))
    report = method.compile_report
    print("  " + report.summary().replace("\n", "\n  "))
    return report


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile every method (or ``--method``) for ``--device``, filling the cache, so that
    ``load_method(..., compile=True)`` later compiles nothing."""
    prog = _load(args)
    device_map = args.device or _device_map(args)
    names = [args.method] if args.method else list(prog.method_names)
    status = 0
    for name in names:
        print(f"method '{name}':")
        report = _print_compiled(prog, name, device_map)
        if report.warning and not report.compiled_instructions:
            status = 1
    return status


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
    import torch

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
        torch.save(tr.tensors(), args.save_tensors)
        print(f"  tensors saved to {args.save_tensors}")
    return 2 if tr.stopped is not None else 0


def cmd_profile(args: argparse.Namespace) -> int:
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

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    device_map = args.device if args.device else None
    runner = TextLLMRunner(
        args.file,
        args.tokenizer,
        args.data,
        device_map=device_map,
        compile=args.compile,
        print_output=False,
    )
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
        f"{stats.num_generated_tokens} tokens generated, {stats.tokens_per_second:.1f} tokens/s",
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
    p.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's)")
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
    parser = argparse.ArgumentParser(
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
        "--repeat", type=int, default=20, help="timed calls after the first (default 20)"
    )
    p_run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p_run.add_argument("--output", help="save the outputs (torch.save) to this file")
    p_run.add_argument(
        "--compile",
        action="store_true",
        help="run the compiled tier (compile=True); show its report",
    )
    p_run.set_defaults(func=cmd_run)

    p_compile = sub.add_parser(
        "compile",
        help="compile methods with AOTInductor into the cache (PTEXEC_CACHE_DIR); show the report",
    )
    common(p_compile)
    p_compile.add_argument(
        "--device", help="compile for this device (as --device-map: 'cpu', 'cuda:0', ...)"
    )
    p_compile.set_defaults(func=cmd_compile)

    def inputs(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--input",
            action="append",
            help="input file (.pt: a tensor or a list; .npy); repeatable",
        )
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
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
    p_trace.add_argument("--limit", type=int, help="show at most this many instructions")
    p_trace.add_argument(
        "--worst", type=int, default=5, help="largest errors to list (--reference)"
    )
    p_trace.add_argument("--json", help="save the trace as JSON to this file")
    p_trace.add_argument(
        "--save-tensors", help="save every tensor written (torch.save) to this file"
    )
    p_trace.set_defaults(func=cmd_trace)

    p_profile = sub.add_parser(
        "profile", help="time every instruction; tables by operator and instruction, Chrome trace"
    )
    common(p_profile)
    inputs(p_profile)
    p_profile.add_argument("--repeat", type=int, default=10, help="timed calls (default 10)")
    p_profile.add_argument("--warmup", type=int, default=1, help="untimed calls first (default 1)")
    p_profile.add_argument(
        "--by", choices=["operator", "instruction", "both"], default="operator", help="table rows"
    )
    p_profile.add_argument("--top", type=int, default=20, help="rows to show (default 20)")
    p_profile.add_argument(
        "--chrome-trace", help="save a Chrome trace (JSON; Perfetto, chrome://tracing)"
    )
    p_profile.set_defaults(func=cmd_profile)

    p_plan = sub.add_parser(
        "plan", help="the memory plan: buffers, tensor lifetimes, peak bytes live; a picture"
    )
    common(p_plan)
    p_plan.add_argument(
        "--out", help="draw the plan to this file (.png, .svg, .pdf; needs matplotlib)"
    )
    p_plan.add_argument("--top", type=int, default=10, help="largest tensors to list (default 10)")
    p_plan.add_argument("--json", action="store_true", help="print JSON")
    p_plan.set_defaults(func=cmd_plan)
    _add_generate(sub)
    _add_serve(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .errors import PtexecError

    try:
        return int(args.func(args))
    except PtexecError as e:
        print(f"ptexec: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError, TypeError) as e:
        print(f"ptexec: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
