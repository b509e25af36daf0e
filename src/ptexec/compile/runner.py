"""The compiled tier as a runner: compiled regions, the rest interpreted, one call envelope.

:class:`CompiledRunner` implements :class:`ptexec.engine.runner.Runner`. At load it plans
the method's regions (:mod:`.regions`), finds their compiled code in the cache or compiles
it (:mod:`.graph`, :mod:`.aoti`, :mod:`.cache`), and builds the method's blocks as the
block compiler does, except that the first instruction of each region calls the region's
code and the region's other instructions are empty. The block structure, the instruction
count (and so ``max_instructions``) and every interpreted statement are the plain blocks'
own; what the envelope does around a call (validation, binding, outputs, restore on
failure) does not change.

A region's call, generated at load as one Python function: read its inputs from the
values table; check the sizes its code was compiled for (a dynamic shape outside them runs
the region's interpreted statements instead); call the compiled code with the flat list;
write back what it returned (:class:`~.regions.Store`); run the statements that must run
in the interpreter (moves, views). A failure inside the compiled code is an
:class:`~ptexec.errors.ExecutionError` naming the region's instruction range.

Anything that goes wrong while compiling never fails the load: a region that cannot be
traced runs interpreted (its reason in the report); without a C++ compiler the whole
method runs interpreted, and a region whose compile fails runs interpreted, with one
:class:`~.report.CompileWarning` and nothing cached (the next load tries again).
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..engine.blocks import compile_chain
from ..engine.runner import limit_error
from ..engine.state import ChainState, MethodState
from ..errors import ExecutionError, LimitExceededError, PtexecError
from ..format import program as p
from ..kernels.fixed_args import store as store_resizing
from ..kernels.registry import Emission
from .cache import CacheEntry, cache_dir, cache_key
from .graph import Guard, scalar_kind
from .progress import Progress
from .regions import Fallback, Region, interpreted_ranges, plan_regions
from .report import CompileReport, CompileWarning

if TYPE_CHECKING:
    from ..program import Program

__all__ = ["CompileOptions", "CompiledRunner"]

Model = Callable[[list[torch.Tensor]], list[torch.Tensor]]
_COMPILE_FAILED = "compile failed"


@dataclass(frozen=True)
class CompileOptions:
    """How ``compile=True`` compiles (``load_method(..., compile=CompileOptions(...))``).

    ``min_instructions``: a region needs at least this many kernel or delegate calls to be
    compiled (fewer run faster interpreted than through a compiled call); ``cache``: read
    and write the on-disk cache (:mod:`ptexec.compile.cache`); ``backend``: ``"aoti"``
    (AOTInductor, the compiled tier) or ``"graph"`` (the traced graphs run by torch, not
    compiled: to check the tier's rebuild and bookkeeping where compiling is too slow);
    ``progress``: show progress on a terminal (None: when stderr is one); ``autotune``: on
    the CPU, time generated matrix-product kernels against ATen's and keep the faster
    (:func:`ptexec.compile.aoti.inductor_options`; longer compiles, faster calls)."""

    min_instructions: int = 2
    cache: bool = True
    backend: str = "aoti"
    progress: bool | None = None
    autotune: bool = True

    def __post_init__(self) -> None:
        if self.backend not in ("aoti", "graph"):
            raise ValueError(f"backend must be 'aoti' or 'graph', not {self.backend!r}")
        if isinstance(self.min_instructions, bool) or not isinstance(self.min_instructions, int):
            raise ValueError(f"min_instructions must be an int, not {self.min_instructions!r}")

    def key(self) -> dict[str, Any]:
        return {
            "min_instructions": self.min_instructions,
            "backend": self.backend,
            "autotune": self.autotune,
        }


@dataclass
class _Compiled:
    region: Region
    model: Model
    guards: list[Guard]
    kinds: dict[int, str]  # slot -> Python kind of a returned scalar
    file: str = ""  # where the model is, in the cache entry


def _method_device(state: MethodState) -> torch.device:
    for b in state.buffers:
        if b.data.numel():
            return b.data.device
    for spec in state.inputs:
        if spec.torch_device is not None:
            return spec.torch_device
    return torch.device("cpu")


def _region_json(c: _Compiled, model: str) -> dict[str, Any]:
    r, guards = c.region, c.guards
    return {
        "chain": r.chain,
        "first": r.first,
        "last": r.last,
        "device": str(r.device),
        "inputs": r.inputs,
        "scalar_inputs": r.scalar_inputs,
        "stores": [[s.slot, s.how, s.instruction] for s in r.stores],
        "aliases": [list(a) for a in r.aliases],
        "guards": [g.to_json() for g in guards],
        "kinds": {str(k): v for k, v in c.kinds.items()},
        "model": model,
        "file": c.file,
    }


def _same_region(r: Region, data: dict[str, Any]) -> bool:
    return (
        data["chain"] == r.chain
        and data["first"] == r.first
        and data["last"] == r.last
        and data["device"] == str(r.device)
        and data["inputs"] == r.inputs
        and data["scalar_inputs"] == r.scalar_inputs
        and [tuple(s) for s in data["stores"]] == [(s.slot, s.how, s.instruction) for s in r.stores]
        and [tuple(a) for a in data["aliases"]] == r.aliases
    )


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return first if len(first) <= 300 else first[:297] + "..."


class _Builder:
    """Finds or makes the compiled code of a method's regions."""

    def __init__(self, state: MethodState, program: Program, options: CompileOptions) -> None:
        from .functional import Rebuild

        self.state = state
        self.program = program
        self.options = options
        self.device = _method_device(state)
        self.rebuild = Rebuild(state, program, self.device)
        self.regions, self.fallbacks = plan_regions(
            state, self.rebuild, program.shared_buffer_indices, options.min_instructions
        )
        self.compiled: list[_Compiled] = []
        self.failed: list[Fallback] = []
        self.compile_seconds = 0.0
        self.cache_hit = False
        self.cache_path: str | None = None
        self.warning: str | None = None

    # -- the cache ---------------------------------------------------------------------
    def entry(self) -> CacheEntry:
        pte = self.program.pte
        blobs: list[memoryview] = [pte.data]
        if self.program.ptd is not None:
            blobs.extend(f.data for f in self.program.ptd.files)
        key = cache_key(blobs, self.state.name, str(self.device), self.options.key())
        return CacheEntry(cache_dir(), key)

    def from_cache(self, entry: CacheEntry) -> bool:
        manifest = entry.read()
        if manifest is None:
            return False
        stored = manifest.get("regions", [])
        failed = manifest.get("failed", [])
        mine = {(r.chain, r.first, r.last): r for r in self.regions}
        seen: set[tuple[int, int, int]] = set()
        for data in failed:
            seen.add((data["chain"], data["first"], data["last"]))
        for data in stored:
            r = mine.get((data["chain"], data["first"], data["last"]))
            if r is None or not _same_region(r, data):
                return False
            seen.add((r.chain, r.first, r.last))
        if seen != set(mine):
            return False
        from .aoti import load_model

        compiled = []
        for data in stored:
            r = mine[(data["chain"], data["first"], data["last"])]
            model = load_model(entry.path / data["file"], data["model"], r.device)
            guards = [Guard.from_json(g) for g in data["guards"]]
            kinds = {int(k): v for k, v in data["kinds"].items()}
            compiled.append(_Compiled(r, model, guards, kinds, data["file"]))
        self.compiled = compiled
        self.failed = [Fallback(f["chain"], f["first"], f["last"], f["reason"]) for f in failed]
        self.cache_hit = True
        self.cache_path = str(entry.path)
        return True

    # -- compiling ---------------------------------------------------------------------
    def build(self) -> None:
        """Find or make the compiled code; warn once when a compile failed."""
        self._build()
        failures = [f for f in self.failed if f.reason.startswith(_COMPILE_FAILED)]
        if failures and self.warning is None:
            listed = "; ".join(f"{f.first}-{f.last}: {f.reason}" for f in failures[:3])
            self.warning = (
                f"{len(failures)} region(s) failed to compile and run interpreted ({listed})"
            )
            warnings.warn(f"'{self.state.name}': {self.warning}", CompileWarning, stacklevel=5)

    def _build(self) -> None:
        if not self.regions:
            return
        options = self.options
        entry = self.entry() if options.cache and options.backend == "aoti" else None
        if entry is not None and self.from_cache(entry):
            return
        if options.backend == "aoti":
            from .aoti import find_compiler

            if find_compiler() is None:
                self.warning = (
                    "no C++ compiler found (set CXX, or install g++): the method runs interpreted"
                )
                self._all_interpreted(self.warning)
                return
        start = time.perf_counter()
        progress = Progress(f"'{self.state.name}'", enabled=options.progress)
        exported: dict[str, Any] = {}
        guards: dict[str, tuple[list[Guard], dict[int, str]]] = {}
        owners: dict[str, Region] = {}
        from .graph import export_region

        n = len(self.regions)
        for k, r in enumerate(self.regions):
            progress.update(f"tracing region {k + 1}/{n} ({r.label})")
            try:
                ep, g, kinds = export_region(self.rebuild, r, r.device)
            except Exception as e:
                self.failed.append(
                    Fallback(r.chain, r.first, r.last, f"not traceable: {_short(e)}")
                )
                continue
            name = f"r{k}"
            exported[name] = ep
            guards[name] = (g, kinds)
            owners[name] = r
        if options.backend == "graph":
            for name, ep in exported.items():
                self.compiled.append(_Compiled(owners[name], _graph_model(ep), *guards[name]))
            self.compile_seconds = time.perf_counter() - start
            return
        staging = entry.staging() if entry is not None else None
        try:
            self._compile(exported, guards, owners, staging, progress)
        except Exception as e:
            if staging is not None and entry is not None:
                entry.discard(staging)
            self.warning = f"compiling failed, the method runs interpreted: {_short(e)}"
            self._all_interpreted(self.warning)
            progress.done("failed")
            return
        self.compile_seconds = time.perf_counter() - start
        if any(f.reason.startswith(_COMPILE_FAILED) for f in self.failed):
            # not kept: the next load tries again (the failure may be this machine's)
            if entry is not None and staging is not None:
                entry.discard(staging)
            staging = None
        if entry is not None and staging is not None:
            manifest = {
                "method": self.state.name,
                "regions": [
                    _region_json(c, f"r{self.regions.index(c.region)}") for c in self.compiled
                ],
                "failed": [
                    {"chain": f.chain, "first": f.first, "last": f.last, "reason": f.reason}
                    for f in self.failed
                ],
                "compile_seconds": self.compile_seconds,
            }
            entry.commit(staging, manifest)  # False: another process's equal entry won
            if entry.read() is not None:
                self.cache_path = str(entry.path)
        done = sum(c.region.last - c.region.first + 1 for c in self.compiled)
        progress.done(
            f"{done} instruction(s) in {len(self.compiled)} region(s), {self.compile_seconds:.1f} s"
        )

    def _compile(
        self,
        exported: dict[str, Any],
        guards: dict[str, tuple[list[Guard], dict[int, str]]],
        owners: dict[str, Region],
        staging: Path | None,
        progress: Progress,
    ) -> None:
        import tempfile

        from .aoti import compile_models, load_model, save_models

        files: dict[str, list[Any]] = {}
        n = len(self.regions)
        for name, ep in exported.items():
            r = owners[name]
            progress.update(f"compiling region {self.regions.index(r) + 1}/{n} ({r.label})")
            try:
                files.update(compile_models({name: ep}, r.device, self.options.autotune))
            except Exception as e:
                self.failed.append(
                    Fallback(r.chain, r.first, r.last, f"{_COMPILE_FAILED}: {_short(e)}")
                )
        if not files:
            return
        scratch = None if staging is not None else Path(tempfile.mkdtemp(prefix="ptexec-"))
        directory = staging if staging is not None else scratch
        assert directory is not None
        try:
            stored = save_models(files, {n: owners[n].device for n in files}, directory)
            # a loaded model stays valid when its file moves to its place in the cache
            # (a library stays mapped; a package is unpacked) or, uncached, is deleted
            for name, filename in stored.items():
                r = owners[name]
                model = load_model(directory / filename, name, r.device)
                self.compiled.append(_Compiled(r, model, *guards[name], filename))
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        self.compiled.sort(key=lambda c: (c.region.chain, c.region.first))

    def _all_interpreted(self, reason: str) -> None:
        self.compiled = []
        self.failed = []
        warnings.warn(f"'{self.state.name}': {reason}", CompileWarning, stacklevel=7)

    # -- the report --------------------------------------------------------------------
    def report(self) -> CompileReport:
        state = self.state
        compiled = sorted(self.compiled, key=lambda c: (c.region.chain, c.region.first))
        done = {(c.region.chain, c.region.first) for c in compiled}
        reasons: dict[tuple[int, int], str] = {}
        for f in [*self.fallbacks, *self.failed]:
            for i in range(f.first, f.last + 1):
                reasons[(f.chain, i)] = f.reason
        for r in self.regions:
            if (r.chain, r.first) not in done and (r.chain, r.first) not in reasons:
                for i in range(r.first, r.last + 1):
                    reasons[(r.chain, i)] = self.warning or "not compiled"
        lengths = [len(c.instructions) for c in state.chains]
        fallbacks: list[tuple[int, int, str]] = []
        for c, first, last in interpreted_ranges(lengths, [x.region for x in compiled]):
            i = first
            while i <= last:  # split the run where the reason changes
                why = reasons.get((c, i), "control flow")
                j = i
                while j + 1 <= last and reasons.get((c, j + 1), "control flow") == why:
                    j += 1
                fallbacks.append((i, j, why))
                i = j + 1
        total = state.instruction_count()
        count = sum(x.region.last - x.region.first + 1 for x in compiled)
        devices = sorted({str(x.region.device) for x in compiled}) or [str(self.device)]
        return CompileReport(
            compiled_instructions=count,
            total_instructions=total,
            fallbacks=tuple(fallbacks),
            compile_seconds=0.0 if self.cache_hit else self.compile_seconds,
            cache_hit=self.cache_hit,
            regions=tuple((x.region.first, x.region.last) for x in compiled),
            device=", ".join(devices),
            cache_path=self.cache_path,
            warning=self.warning,
            chains=tuple(x.region.chain for x in compiled),
        )


def _graph_model(ep: Any) -> Model:
    """An exported graph run by torch with a flat list (the ``graph`` backend)."""
    module = ep.module(check_guards=False)

    def run(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(module(*xs))

    return run


# ---------------------------------------------------------------------------------------
# the region's call, and the blocks around it


def _region_call(state: MethodState, compiled: _Compiled, k: int) -> Callable[[list[Any]], None]:
    region = compiled.region
    chain = state.chains[region.chain]
    plan = state.plan
    first, last = region.first, region.last
    label = region.label
    what = f"compiled {label}"

    def fail(e: BaseException) -> BaseException:
        if isinstance(e, PtexecError):
            return e
        return ExecutionError(
            state.name,
            first,
            what,
            f"the compiled code of {label} failed: {_short(e)}",
            chain.frame(first),
        )

    # the region's interpreted statements: for calls outside the compiled sizes
    interp: Callable[[list[Any]], None] | None = None
    if compiled.guards:
        body: list[str] = ["def _interp(v):"]
        body_lines: dict[int, int] = {}
        interp_env: dict[str, Any] = {}
        for i in range(first, last + 1):
            st = chain.statements[i]
            interp_env.update(st.env)
            for part in st.code.splitlines():
                body_lines[len(body) + 1] = i
                body.append("    " + part)
        body.append("    pass")
        ns = state.sources.compile(
            "\n".join(body) + "\n",
            f"chain {region.chain} region {k} (interpreted)",
            interp_env,
            chain=region.chain,
            lines=body_lines,
        )
        interp = ns["_interp"]
    env: dict[str, Any] = {
        "_run": compiled.model,
        "_fail": fail,
        "_interp": interp,
        "_store": store_resizing,
        "_tensor": torch.tensor,
    }
    lines = ["def _region(v):"]
    lineno: dict[int, int] = {}

    def add(text: str, instruction: int) -> None:
        lineno[len(lines) + 1] = instruction
        lines.append(text)

    scalars = set(region.scalar_inputs)
    xs = []
    for n, j in enumerate(region.graph_inputs):
        if j in scalars:
            dtype = {"int": "torch.int64", "float": "torch.float64", "bool": "torch.bool"}[
                scalar_kind(plan.values[j])
            ]
            env["torch"] = torch
            add(f"    x{n} = _tensor(v[{j}], dtype={dtype})", first)
        else:
            add(f"    x{n} = v[{j}]", first)
        xs.append(f"x{n}")
    if compiled.guards:
        checks = " and ".join(g.code() for g in compiled.guards)
        add(f"    if not ({checks}):", first)
        add("        return _interp(v)", first)
    add("    try:", first)
    add(f"        r = _run([{', '.join(xs)}])", first)
    add("    except Exception as e:", first)
    add("        raise _fail(e) from e", first)
    n_out = 0
    for s in region.stores:
        j = s.slot
        value = plan.values[j]
        if s.how == "copy":
            assert isinstance(value, p.Tensor)
            if value.shape_dynamism == p.STATIC:
                add(f"    v[{j}].copy_(r[{n_out}])", s.instruction)
            else:
                order = f"_o{j}"
                env[order] = tuple(value.dim_order)
                grow = value.shape_dynamism == p.DYNAMIC_UNBOUND
                add(f"    _store(v[{j}], r[{n_out}], {order}, {grow})", s.instruction)
            n_out += 1
        elif s.how in ("replace", "adopt"):
            if isinstance(value, p.Tensor):
                add(f"    v[{j}] = r[{n_out}]", s.instruction)
            else:
                convert = compiled.kinds.get(j, scalar_kind(value))
                add(f"    v[{j}] = {convert}(r[{n_out}])", s.instruction)
            n_out += 1
        elif s.how == "statement":
            st = chain.statements[s.instruction]
            env.update(st.env)
            for part in st.code.splitlines():
                add("    " + part, s.instruction)
    add("    return None", last)
    namespace = state.sources.compile(
        "\n".join(lines) + "\n",
        f"chain {region.chain} region {k}",
        env,
        chain=region.chain,
        lines=lineno,
    )
    fn: Callable[[list[Any]], None] = namespace["_region"]
    return fn


class CompiledRunner:
    """Compiled regions and interpreted statements, in the plain blocks' structure (module
    docstring). ``report`` says what was compiled."""

    direct_outputs = True

    def __init__(
        self, state: MethodState, program: Program, options: CompileOptions | None = None
    ) -> None:
        options = options or CompileOptions()
        self.state = state
        builder = _Builder(state, program, options)
        builder.build()
        self.report = builder.report()
        by_chain: dict[int, list[Emission]] = {c.index: list(c.statements) for c in state.chains}
        for k, compiled in enumerate(builder.compiled):
            r = compiled.region
            call = _region_call(state, compiled, k)
            statements = by_chain[r.chain]
            statements[r.first] = Emission(f"_R{k}(v)", {f"_R{k}": call})
            for i in range(r.first + 1, r.last + 1):
                statements[i] = Emission("pass", mutates=())
        chains = []
        for c in state.chains:
            rewritten = ChainState(
                c.index,
                c.instructions,
                c.names,
                tuple(by_chain[c.index]),
                c.loaded,
                c.stacktrace,
            )
            chains.append(compile_chain(rewritten, state.sources))
        self.chains = chains

    def bind(self, state: MethodState) -> None:
        pass

    def run(self, v: list[Any]) -> None:
        state = self.state
        limit = state.max_instructions
        count = 0
        try:
            for c, compiled in enumerate(self.chains):
                blocks, sizes = compiled.blocks, compiled.sizes
                b = 0
                while b >= 0:
                    count += sizes[b]
                    if count > limit:
                        raise limit_error(state, c, compiled, b)
                    b = blocks[b](v)
        except (LimitExceededError, ExecutionError):
            raise
        except Exception as e:
            raise state.execution_error(e) from e
