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

import contextlib
import dataclasses
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..codegen import Code
from ..effects import effects, kind
from ..engine.runner import BlockRunner
from ..errors import ExecutionError, PtexecError
from ..format import program as p
from ..kernels.fixed_args import store as store_resizing
from ..kernels.registry import Statement
from ..loader.capacity import CHECK, capacity, check_capacity
from ..loader.state import MethodState, PreparedChain
from .cache import CacheEntry, cache_key, open_cache, program_digest, warn_once
from .external import Calls, ExternalCall, own_tensor
from .external import use as use_external
from .graph import Guard, GuardError, scalar_kind
from .manifest import FailedRecord, Manifest, RegionRecord
from .native import NativeCalls
from .native import library as native_library
from .native import table as native_table
from .native import unavailable as native_unavailable
from .progress import Progress
from .regions import (
    RETURNED,
    Fallback,
    Region,
    caller_readable,
    interpreted_ranges,
    plan_regions,
)
from .report import CompileReport, CompileWarning

if TYPE_CHECKING:
    from ..program import Program

__all__ = ["CompileOptions", "CompiledRunner", "RegionBuilder"]

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
    ``progress``: show the progress of a compile on stderr (None or True: a live line
    on a terminal, one line per step elsewhere; False: nothing); ``autotune``: on
    the CPU, time generated matrix-product kernels against ATen's and keep the faster
    (:func:`ptexec.compile.aoti.inductor_options`; longer compiles, faster calls);
    ``background``: the method runs interpreted at once while another process compiles
    its regions into the cache, and switches to them between calls when they are ready
    (:mod:`ptexec.compile.background`; ``compile="background"`` is these defaults)."""

    min_instructions: int = 2
    cache: bool = True
    backend: str = "aoti"
    progress: bool | None = None
    autotune: bool = True
    background: bool = False

    def __post_init__(self) -> None:
        if self.backend not in ("aoti", "graph"):
            raise ValueError(f"backend must be 'aoti' or 'graph', not {self.backend!r}")
        if isinstance(self.min_instructions, bool) or not isinstance(self.min_instructions, int):
            raise ValueError(f"min_instructions must be an int, not {self.min_instructions!r}")
        if self.background and (self.backend != "aoti" or not self.cache):
            raise ValueError(
                "background compiles hand their code over through the cache: they need "
                "backend='aoti' and cache=True"
            )

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


def _value_names(plan: p.ExecutionPlan, slots: list[int]) -> str:
    """``buffer 'kv.k_cache'`` or ``value 12`` for each slot, joined."""
    names = []
    for j in slots:
        value = plan.values[j]
        extra = value.extra_tensor_info if isinstance(value, p.Tensor) else None
        fqn = extra.fully_qualified_name if extra is not None else None
        names.append(f"buffer {fqn!r}" if fqn else f"value {j}")
    return ", ".join(names)


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return first if len(first) <= 300 else first[:297] + "..."


class RegionBuilder:
    """Finds or makes the compiled code of a method's regions. The regions are planned
    when it is made, on the values table as loading left it (plan it before the method's
    first call: a call replaces some slots' tensors)."""

    def __init__(self, state: MethodState, program: Program, options: CompileOptions) -> None:
        from .functional import FunctionalForms

        self.state = state
        self.program = program
        self.options = options
        self.device = _method_device(state)
        self.rebuild = FunctionalForms(state, program, self.device)
        self.regions, self.fallbacks = plan_regions(
            state, self.rebuild, program.shared_buffer_indices, options.min_instructions
        )
        self.compiled: list[_Compiled] = []
        self.failed: list[Fallback] = []
        self.compile_seconds = 0.0
        self.cache_hit = False
        self.cache_path: str | None = None
        self.warning: str | None = None
        self._entry: tuple[CacheEntry | None] | None = None
        self._native_entry: bool | None = None

    def native_entry(self) -> bool:
        """Whether the compiled code calls its opaque delegate calls through the C entry
        of :mod:`.native`'s library (:data:`.aoti.NATIVE_ENTRY`), not through torch's
        dispatcher: the method has such calls, AOTInductor compiles it, this torch calls
        a C entry as declared (:func:`.aoti.native_entry_supported`) and the library is
        loaded here (this loads it, built on first use). Part of the cache key: code made
        with the entry loads only where the library is."""
        if self._native_entry is None:
            from .aoti import native_entry_supported

            self._native_entry = (
                bool(self.rebuild.externals())
                and self.options.backend == "aoti"
                and native_entry_supported()
                and native_library() is not None
            )
        return self._native_entry

    # -- the cache ---------------------------------------------------------------------
    def calls_in(self, regions: Sequence[Region]) -> list[ExternalCall]:
        """The opaque delegate calls the compiled code of ``regions`` makes."""
        spans = [(r.chain, r.first, r.last) for r in regions]
        return [
            call
            for (c, i), call in self.rebuild.external_places()
            if any(ch == c and first <= i <= last for ch, first, last in spans)
        ]

    def start_hashing(self) -> bool:
        """Start hashing the files of this method's cache entry on a thread of its own, for
        the check before its code loads (:meth:`.cache.CacheEntry.start_hashing`); whether
        there is such an entry."""
        if not self.regions or not (self.options.cache and self.options.backend == "aoti"):
            return False
        entry = self.entry()
        return entry is not None and entry.start_hashing()

    def entry(self) -> CacheEntry | None:
        """This method's entry in the cache; None when the cache may not be used. Its key
        is fixed by the first call (the thread count and machine at that time)."""
        if self._entry is None:
            self._entry = (self._find_entry(),)
        return self._entry[0]

    def _find_entry(self) -> CacheEntry | None:
        cache = open_cache()
        if cache is None:
            return None
        options = self.options.key()
        externals = self.rebuild.externals()
        if externals:  # other code than a traced delegate's
            options["external"] = [list(x) for x in externals]
            options["native_entry"] = self.native_entry()
        # the CPU regions' kernels, whatever the method's device, are made for the count
        threads = not all(self.serial(r) for r in self.regions if r.device.type == "cpu")
        key = cache_key(
            program_digest(self.program), self.state.name, str(self.device), options, threads
        )
        return cache.entry(key)

    def serial(self, region: Region) -> bool:
        """Whether ``region``'s CPU kernels are compiled to run on the calling thread
        alone: the region calls a delegate (:func:`.aoti.runs_delegates`, decided here
        from the plan, before its graph exists, so that the cache key can leave the
        thread count out where every CPU region's code is the same at any count)."""
        return any(
            how == "call" and c == region.chain and region.first <= i <= region.last
            for c, i, how in self.rebuild.externals()
        )

    def _mismatch(self, manifest: Manifest) -> str | None:
        """Why a (well-formed) manifest is not the record of this method's regions."""
        if manifest.method != self.state.name:
            return f"it is the entry of method {manifest.method!r:.80}"
        mine = {(r.chain, r.first, r.last): r for r in self.regions}
        seen: set[tuple[int, int, int]] = {f.span for f in manifest.failed}
        plan = self.state.plan
        for record in manifest.regions:
            r = mine.get(record.span)
            if r is None or not record.matches(r):
                return f"region {record.span} is not one this method plans"
            ranks = [
                None if j in r.scalar_inputs else len(getattr(plan.values[j], "sizes", ()))
                for j in r.graph_inputs
            ]
            try:
                for g in record.guards:
                    g.check(ranks)
            except GuardError as e:
                return str(e)
            seen.add(record.span)
        if seen != set(mine):
            return "its regions are not the ones this method plans"
        return None

    def from_cache(self, entry: CacheEntry) -> bool:
        manifest = entry.read()
        if manifest is None:
            return False
        problem = self._mismatch(manifest)
        if problem is not None:
            entry.reject(problem)
            return False
        from .aoti import load_model

        mine = {(r.chain, r.first, r.last): r for r in self.regions}
        compiled = []
        try:
            for record in manifest.regions:
                r = mine[record.span]
                model = load_model(entry.path / record.file, record.model, r.device)
                compiled.append(
                    _Compiled(r, model, list(record.guards), dict(record.kinds), record.file)
                )
        except Exception as e:  # e.g. evicted by another process between check and load
            entry.reject(f"its code did not load ({_short(e)})")
            return False
        entry.touch()
        self.compiled = compiled
        self.failed = [Fallback(f.chain, f.first, f.last, f.reason) for f in manifest.failed]
        self.cache_hit = True
        self.cache_path = str(entry.path)
        return True

    def load_cached(self) -> bool:
        """Take every region's code from the cache, compiling nothing; whether that
        worked (True too when there is nothing to compile)."""
        if not self.regions:
            return True
        entry = self.entry()
        return entry is not None and self.from_cache(entry)

    # -- compiling ---------------------------------------------------------------------
    def build(self) -> None:
        """Find or make the compiled code (and, for its opaque delegate calls, the library
        that runs them natively, :mod:`.native`); warn once when a compile failed."""
        self._build()
        if self.rebuild.external_calls():
            native_library()
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
            from .aoti import missing_compiler

            problem = missing_compiler()
            if problem is not None:
                self.warning = f"{problem}: the method runs interpreted"
                self._all_interpreted(self.warning)
                return
        start = time.perf_counter()
        with Progress(f"'{self.state.name}'", enabled=options.progress) as progress:
            self._trace_and_compile(entry, progress, start)

    def _trace_and_compile(
        self, entry: CacheEntry | None, progress: Progress, start: float
    ) -> None:
        options = self.options
        exported: dict[str, Any] = {}
        guards: dict[str, tuple[list[Guard], dict[int, str]]] = {}
        owners: dict[str, Region] = {}
        from .graph import export_region

        n = len(self.regions)
        for k, r in enumerate(self.regions):
            progress.start(f"tracing region {k + 1}/{n} ({r.label})")
            try:
                ep, g, kinds = export_region(self.rebuild, r, r.device)
            except Exception as e:
                self.failed.append(
                    Fallback(r.chain, r.first, r.last, f"not traceable: {_short(e)}")
                )
                progress.finish("not traceable")
                continue
            progress.finish("traced")
            name = f"r{k}"
            exported[name] = ep
            guards[name] = (g, kinds)
            owners[name] = r
        if options.backend == "graph":
            for name, ep in exported.items():
                self.compiled.append(_Compiled(owners[name], _graph_model(ep), *guards[name]))
            self.compile_seconds = time.perf_counter() - start
            progress.done(f"{len(self.compiled)} region(s) traced")
            return
        try:
            staging = self._compile(entry, exported, guards, owners, progress)
        except Exception as e:
            self.warning = f"compiling failed, the method runs interpreted: {_short(e)}"
            self._all_interpreted(self.warning)
            progress.done("failed")
            return
        self.compile_seconds = time.perf_counter() - start
        if staging is not None and entry is not None:
            if any(f.reason.startswith(_COMPILE_FAILED) for f in self.failed):
                # not kept: the next load tries again (the failure may be this machine's)
                entry.discard(staging)
            else:
                self._keep(entry, staging)
        done = sum(c.region.last - c.region.first + 1 for c in self.compiled)
        progress.done(
            f"{done} instruction(s) in {len(self.compiled)} region(s), {self.compile_seconds:.1f} s"
        )

    def _keep(self, entry: CacheEntry, staging: Path) -> None:
        """Publish the compiled entry; a cache that cannot take it costs a warning, never
        the load (the models are loaded already)."""
        manifest = Manifest(
            self.state.name,
            tuple(
                RegionRecord.of(
                    c.region, c.guards, c.kinds, f"r{self.regions.index(c.region)}", c.file
                )
                for c in self.compiled
            ),
            tuple(FailedRecord(f.chain, f.first, f.last, f.reason) for f in self.failed),
            self.compile_seconds,
        )
        try:
            entry.commit(staging, manifest)  # False: another process's equal entry won
            self.cache_path = str(entry.path)
            entry.cache.housekeep(keep=entry.key)
        except (OSError, PtexecError) as e:
            warn_once(f"the compiled code of '{self.state.name}' is not kept in the cache: {e}", 6)
            self.cache_path = None

    def _compile(
        self,
        entry: CacheEntry | None,
        exported: dict[str, Any],
        guards: dict[str, tuple[list[Guard], dict[int, str]]],
        owners: dict[str, Region],
        progress: Progress,
    ) -> Path | None:
        """Compile and load every region; the staging directory holding their files, to be
        kept (None: nothing to keep; they were loaded from a private temporary directory,
        already removed: a loaded library stays mapped)."""
        from .aoti import compile_models, load_model, save_models

        files: dict[str, list[Any]] = {}
        n = len(self.regions)
        for name, ep in exported.items():
            r = owners[name]
            progress.start(f"compiling region {self.regions.index(r) + 1}/{n} ({r.label})")
            try:
                files.update(
                    compile_models(
                        {name: ep},
                        r.device,
                        self.options.autotune,
                        self.native_entry(),
                        serial=self.serial(r),
                    )
                )
            except Exception as e:
                self.failed.append(
                    Fallback(r.chain, r.first, r.last, f"{_COMPILE_FAILED}: {_short(e)}")
                )
                progress.finish("failed")
                continue
            progress.finish("compiled")
        if not files:
            return None
        devices = {n: owners[n].device for n in files}
        staging = self._staging(entry)
        scratch: Path | None = None
        try:
            if staging is not None:
                try:
                    stored = save_models(files, devices, staging)
                except OSError as e:  # a full disk, a cache gone read-only
                    warn_once(f"the compile cache cannot take '{self.state.name}': {e}", 6)
                    assert entry is not None
                    entry.discard(staging)
                    staging = None
            if staging is None:
                scratch = Path(tempfile.mkdtemp(prefix="ptexec-compile-"))
                stored = save_models(files, devices, scratch)
            directory = staging if staging is not None else scratch
            assert directory is not None
            # a loaded model stays valid when its file moves to its place in the cache
            # (a library stays mapped; a package is unpacked) or, uncached, is deleted
            for name, filename in stored.items():
                r = owners[name]
                model = load_model(directory / filename, name, r.device)
                self.compiled.append(_Compiled(r, model, *guards[name], filename))
        except BaseException:
            if staging is not None and entry is not None:
                entry.discard(staging)
            raise
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        self.compiled.sort(key=lambda c: (c.region.chain, c.region.first))
        return staging

    def _staging(self, entry: CacheEntry | None) -> Path | None:
        """Where to assemble the entry: None (a private temporary directory) when there is
        no cache, it is read only, or it refuses a staging directory."""
        if entry is None or not self.options.cache:
            return None
        if not entry.cache.writable:
            warn_once(
                f"the compile cache {entry.cache.root} is read only for this user: what this "
                "load compiles is not kept",
                7,
            )
            return None
        try:
            return entry.staging()
        except OSError as e:
            warn_once(f"the compile cache {entry.cache.root} cannot take new entries: {e}", 7)
            return None

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
        opaque = {(c, i) for c, i, how in self.rebuild.externals() if how == "call"}
        calls = tuple(
            i
            for x in compiled
            for i in range(x.region.first, x.region.last + 1)
            if (x.region.chain, i) in opaque
        )
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
            xnnpack_calls=calls,
        )


def _graph_model(ep: Any) -> Model:
    """An exported graph run by torch with a flat list (the ``graph`` backend)."""
    module = ep.module(check_guards=False)

    def run(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(module(*xs))

    return run


# ---------------------------------------------------------------------------------------
# the region's call, and the blocks around it


_Call = Callable[[list[Any]], None]


def _region_call(
    state: MethodState,
    compiled: _Compiled,
    k: int,
    externals: dict[str, ExternalCall] | None = None,
) -> tuple[_Call, _Call | None, Statement]:
    """The region's call, the interpreted statements it runs outside the sizes its code
    was compiled for (None: it has no such sizes), and the call's body as a statement to
    inline in its place (its names end in ``k``: regions inlined together do not clash).
    ``externals``: the delegate calls the method's compiled code makes
    (:mod:`.external`), made current around the compiled call."""
    region = compiled.region
    chain = state.chains[region.chain]
    plan = state.plan
    first, last = region.first, region.last
    label = region.label
    what = f"compiled {label}"

    # values the region reads and writes in place (the method's state, kept between
    # calls): its code may have written them before the instruction that failed, in an
    # order of its own; the interpreter stops at that instruction
    kept = [j for j in region.inplace if j in region.inputs]
    partly = ""
    if kept:
        partly = (
            f"; it writes {_value_names(plan, kept)} in place, which may be left partly "
            "updated (the interpreter stops at the failing instruction: load the method "
            "without compile=... for that)"
        )

    def fail(e: BaseException) -> BaseException:
        if isinstance(e, PtexecError):
            return e
        return ExecutionError(
            state.name,
            first,
            what,
            f"the compiled code of {label} failed: {_short(e)}{partly}",
            chain.frame(first),
        )

    # a scalar input is traced as the kind the program declares; a value written at run
    # time may be another (truediv's float into a value declared Int): such a call runs
    # the region's interpreted statements, as one outside the compiled sizes does
    scalars = set(region.scalar_inputs)
    kinds = [
        f"type(v[{j}]) is {scalar_kind(plan.values[j])}"
        for j in region.graph_inputs
        if j in scalars
    ]
    checks = [g.code(f"_a{k}_") for g in compiled.guards] + kinds
    # the region's interpreted statements: for calls outside the compiled sizes and kinds
    interp: _Call | None = None
    if checks:
        body = Code(region.chain)
        body.add("def _interp(v):")
        with body.indented():
            _interpreted(chain, region, body)
        interp = body.function(
            state.sources, f"chain {region.chain} region {k} (interpreted)", "_interp"
        )
    code = Code(region.chain)  # the body, at the indentation of a statement
    env = code.env
    env.update(
        {f"_M{k}": compiled.model, f"_F{k}": fail, f"_I{k}": interp},
        _store=store_resizing,
        _tensor=torch.tensor,
    )
    xs = []
    for n, j in enumerate(region.graph_inputs):
        x = f"_a{k}_{n}"
        if j in scalars:
            dtype = {"int": "torch.int64", "float": "torch.float64", "bool": "torch.bool"}[
                scalar_kind(plan.values[j])
            ]
            env["torch"] = torch
            code.add(f"{x} = _tensor(v[{j}], dtype={dtype})", first)
        else:
            code.add(f"{x} = v[{j}]", first)
        xs.append(x)
    guarded = contextlib.ExitStack()
    with guarded:
        if checks:
            code.add(f"if not ({' and '.join(checks)}):", first)
            code.add(f"    _I{k}(v)", first)
            code.add("else:", first)
            guarded.enter_context(code.indented())
        if externals:
            env[f"_X{k}"] = externals
            env["_use"] = use_external
            code.add(f"_b{k} = _use(_X{k})", first)
        code.add("try:", first)
        code.add(f"    _r{k} = _M{k}([{', '.join(xs)}])", first)
        code.add("except Exception as e:", first)
        code.add(f"    raise _F{k}(e) from e", first)
        if externals:
            code.add("finally:", first)
            code.add(f"    _use(_b{k})", first)
        n_out = 0
        for s in region.stores:
            j = s.slot
            value = plan.values[j]
            r = f"_r{k}[{n_out}]"
            if s.how == "copy":
                assert isinstance(value, p.Tensor)
                if value.shape_dynamism == p.STATIC:
                    code.add(f"v[{j}].copy_({r})", s.instruction)
                else:
                    order = f"_o{j}"
                    env[order] = tuple(value.dim_order)
                    grow = value.shape_dynamism == p.DYNAMIC_UNBOUND
                    cap = capacity(value)
                    if cap is not None:  # a size from data may pass it: refused first
                        env[CHECK] = check_capacity
                        code.add(f"{CHECK}({r}, {j}, {cap})", s.instruction)
                    code.add(f"_store(v[{j}], {r}, {order}, {grow})", s.instruction)
                n_out += 1
            elif s.how in ("replace", "adopt"):
                if isinstance(value, p.Tensor) and s.how == "adopt" and externals:
                    # the caller may get it as its own (handed_outputs): not a delegate
                    # call's memory, which the next call writes
                    env[f"_O{k}"] = own_tensor(externals.values())
                    code.add(f"v[{j}] = _O{k}({r})", s.instruction)
                elif isinstance(value, p.Tensor):
                    code.add(f"v[{j}] = {r}", s.instruction)
                else:
                    convert = compiled.kinds.get(j, scalar_kind(value))
                    code.add(f"v[{j}] = {convert}({r})", s.instruction)
                n_out += 1
            elif s.how == "statement":
                st = chain.statements[s.instruction]
                env.update(st.env)
                code.add(st.code, s.instruction)
            elif s.how == "returned":  # a copy of an output written in place: the caller's
                n_out += 1
    inline = Statement(code.text, dict(env))
    call = Code(region.chain)
    call.env.update(env)
    call.add("def _region(v):")
    with call.indented():
        for line in code.text.splitlines():
            call.add(line, first)
        call.add("return None", last)
    fn: _Call = call.function(state.sources, f"chain {region.chain} region {k}", "_region")
    return fn, interp, inline


def _interpreted(chain: PreparedChain, region: Region, code: Code) -> None:
    """The interpreter's statements of ``region``, its if/else as one (at the indentation
    of ``code``)."""
    branch = region.branch

    def lines(lo: int, hi: int) -> None:
        for i in range(lo, hi + 1):
            st = chain.statements[i]
            code.env.update(st.env)
            code.add(st.code, i)
        code.add("pass")

    if branch is None:
        lines(region.first, region.last)
        return
    lines(region.first, branch.jump - 1)
    jump = chain.statements[branch.jump]
    code.env.update(jump.env)
    code.add(f"if {jump.code}:", branch.jump)
    with code.indented():
        lines(branch.jump + 1, branch.skip - 1)
    code.add("else:", branch.jump)
    with code.indented():
        lines(branch.skip + 1, branch.end - 1)
    lines(branch.end, region.last)


def _fixed_outputs(state: MethodState, unguarded: list[_Compiled]) -> frozenset[int]:
    """The method's static tensor outputs that one region without guards writes in place
    (an ``inplace`` store) and no other instruction writes or replaces."""
    values = state.plan.values
    owner: dict[int, tuple[int, int, int]] = {}  # slot -> (chain, first, last) of its region
    for c in unguarded:
        r = c.region
        for store in r.stores:
            if store.how == "inplace":
                owner[store.slot] = (r.chain, r.first, r.last)
    found: set[int] = set()
    for out in state.outputs:
        j = out.slot
        value = values[j]
        if (
            out.kind != "tensor"
            or j not in owner
            or not isinstance(value, p.Tensor)
            or value.shape_dynamism != p.STATIC
        ):
            continue
        chain, first, last = owner[j]
        written = False
        for ch in state.chains:
            for i, ins in enumerate(ch.instructions):
                if ch.index == chain and first <= i <= last:
                    continue
                for st in (ch.loaded[i], ch.statements[i]):
                    if kind(ins) != "free" and j in effects(values, ins, st).written:
                        written = True
        if not written:
            found.add(j)
    return frozenset(found)


def _fresh_outputs(
    state: MethodState, unguarded: list[_Compiled], shared_buffers: Iterable[int]
) -> frozenset[int]:
    """The method's tensor outputs (each named once, no input, in no buffer the methods
    share) that are the one tensor an if/else's region without guards returns, a result
    of its ``torch.cond`` nothing after the branches writes, when no instruction outside that region reads, writes or
    replaces their slot. Such a tensor is new on every call (a branch returns a copy of
    an operand; AOTInductor returns a copy of a constant), and the table only keeps it
    until the next call replaces it: it may be the caller's copy."""
    values = state.plan.values
    shared = frozenset(shared_buffers)
    named = [o.slot for o in state.outputs]
    inputs = {spec.slot for spec in state.inputs}
    found: set[int] = set()
    for c in unguarded:
        r = c.region
        returned = [st for st in r.stores if st.how in ("copy", "replace", "adopt")]
        if r.branch is None or len(returned) != 1:
            continue
        st = returned[0]
        j = st.slot
        value = values[j]
        if (
            st.how != "replace"
            or j not in r.branch.merged
            or st.instruction >= r.branch.end  # written again after the branches
            or named.count(j) != 1
            or j in inputs
            or not isinstance(value, p.Tensor)
            or (value.allocation_info is not None and value.allocation_info.memory_id in shared)
        ):
            continue
        touched = False
        for ch in state.chains:
            for i, ins in enumerate(ch.instructions):
                if (ch.index == r.chain and r.first <= i <= r.last) or kind(ins) == "free":
                    continue
                for statement in (ch.loaded[i], ch.statements[i]):
                    e = effects(values, ins, statement)
                    if j in (*e.inputs, *e.reads, *e.written, *e.replaces):
                        touched = True
        if not touched:
            found.add(j)
    return frozenset(found)


def _handed_outputs(state: MethodState, compiled: list[_Compiled]) -> dict[int, torch.Tensor]:
    """The method's outputs (each named once) that a region adopts (its slot takes the
    tensor the compiled code returns: a method output only the caller reads, which no
    statement gives a new object, :class:`~.regions.Store`), which no statement the
    region runs after its compiled code reads; with the tensor in their slot now (the
    one loading made: no statement replaces it). After a call such a slot holds that
    tensor (a guarded region's interpreted statements, or a general call's code, wrote
    it) or the compiled code's new tensor, which no other slot holds, when a call puts
    the load-time tensor back after handing the new one over: nothing in the method
    then holds what the caller got."""
    values = state.plan.values
    named = [o.slot for o in state.outputs]
    found: dict[int, torch.Tensor] = {}
    for c in compiled:
        r = c.region
        chain = state.chains[r.chain]
        read_after: set[int] = set()
        for st in r.stores:
            if st.how == "statement":
                i = st.instruction
                e = effects(values, chain.instructions[i], chain.statements[i])
                read_after.update(e.reads, e.inputs)
        for st in r.stores:
            j = st.slot
            held = state.values[j]
            if (
                st.how == "adopt"
                and named.count(j) == 1
                and j not in read_after
                and isinstance(held, torch.Tensor)
            ):
                found[j] = held
    return found


def _returned_outputs(
    fixed: frozenset[int], unguarded: list[tuple[int, _Compiled]]
) -> dict[int, str]:
    """Per fixed output (:func:`_fixed_outputs`: one region without guards writes it in
    place, nothing else writes it) whose copy that region returns (a ``returned`` store),
    the expression of that copy in the region's body (its ``k``-th region's results)."""
    found: dict[int, str] = {}
    for k, c in unguarded:
        n = 0
        for st in c.region.stores:
            if st.how not in RETURNED:
                continue
            if st.how == "returned" and st.slot in fixed:
                found[st.slot] = f"_r{k}[{n}]"
            n += 1
    return found


class CompiledRunner:
    """Compiled regions and interpreted statements, in the plain blocks' structure (module
    docstring). ``report`` says what was compiled."""

    direct_outputs = True

    def __init__(
        self,
        state: MethodState,
        program: Program,
        options: CompileOptions | None = None,
        builder: RegionBuilder | None = None,
    ) -> None:
        self.state = state
        native: NativeCalls | None = None
        made = False  # the native calls' table
        if builder is None:  # else the builder has its code already (load_cached)
            builder = RegionBuilder(state, program, options or CompileOptions())
            calls = builder.calls_in(builder.regions)
            if calls and builder.start_hashing():
                # ExecuTorch's C++ runtime loads the calls while the entry's files are hashed
                native, made = native_table(calls), True
            builder.build()
        self.report = builder.report()
        # the delegate calls the compiled code makes through ptexec::external_call (those
        # of no compiled region stay the interpreter's: no native call, no second load)
        compiled_calls = builder.calls_in([x.region for x in builder.compiled])
        self._externals = Calls((c.key, c) for c in compiled_calls)
        for ext in self._externals.values():
            ext.shapes = None  # only tracing needs them (with ptexec's torch code)
        if self._externals:
            if not made:
                native = native_table(self._externals.values())
            if native is not None and native.count:  # run by ExecuTorch's C++ runtime
                self._externals.native = native.address
                self._externals.keep = native
            self.report = dataclasses.replace(
                self.report,
                native_calls=native.count if native is not None else 0,
                native_unavailable=native_unavailable() if native is None else None,
            )
        aoti = builder.options.backend == "aoti"
        self._backend = "AOTInductor" if aoti else "its traced graph, by torch"
        self._regions: list[tuple[_Compiled, _Call, _Call | None]] = []
        by_chain: dict[int, list[Statement]] = {c.index: list(c.statements) for c in state.chains}
        # the same with each region's body in place of its call, for the fast call to inline
        inlined: dict[int, list[Statement]] = {c.index: list(c.statements) for c in state.chains}
        readers: set[int] = set()  # instructions whose code reads the table at each call
        for k, compiled in enumerate(builder.compiled):
            r = compiled.region
            call, fallback, body = _region_call(state, compiled, k, self._externals or None)
            # not a region whose code returns tensors into slots others read (one may be
            # the input itself, or a view of it, and a later read would see the caller's
            # memory; an adopted output only the caller reads, as a copy, is fine), nor
            # the statements run after the compiled code (a move or a view would hand the
            # caller's tensor itself to another slot)
            # (an if/else's merged results are never: a branch returns a copy of an operand)
            merged = r.branch.merged if r.branch is not None else ()
            returns = any(
                st.how == "replace"
                and isinstance(state.plan.values[st.slot], p.Tensor)
                and st.slot not in merged
                for st in r.stores
            )
            if r.chain == 0 and not returns:
                after = {st.instruction for st in r.stores if st.how == "statement"}
                readers.update(
                    i
                    for i in range(r.first, r.last + 1)
                    if i not in after
                    and (
                        fallback is None
                        or isinstance(
                            state.chains[0].instructions[i], p.KernelCall | p.DelegateCall
                        )
                    )
                )
            self._regions.append((compiled, call, fallback))
            statements = by_chain[r.chain]
            note = f"instructions {r.first}-{r.last}, compiled"
            statements[r.first] = Statement(f"_R{k}(v)  # {note}", {f"_R{k}": call})
            inlined[r.chain][r.first] = body
            for i in range(r.first + 1, r.last + 1):
                statements[i] = inlined[r.chain][i] = Statement("pass", mutates=())
            if r.branch is not None:
                # the blocks still pass its jumps: on through the true branch (empty), then
                # over the false one by its own jump, which always jumps
                go_on = Statement("True", mutates=(), reads=())
                statements[r.branch.jump] = inlined[r.chain][r.branch.jump] = go_on
                skip = state.chains[r.chain].statements[r.branch.skip]
                statements[r.branch.skip] = inlined[r.chain][r.branch.skip] = skip
        chains = []
        for c in state.chains:
            rewritten = PreparedChain(
                c.index,
                c.instructions,
                c.names,
                tuple(by_chain[c.index]),
                c.loaded,
                c.stacktrace,
                c.jumps,
            )
            chains.append(rewritten)
        # run as the interpreter runs its own chains (forward-only ones as one function)
        self._blocks = BlockRunner(state, chains)
        self._blocks.prepare()
        self.forward_chain: PreparedChain | None = None
        """The one chain whose jumps all go forward, each region's code in its first
        instruction's place, for the fast call to run in its own lines; or None."""
        forward = self._blocks.forward_chain
        if forward is not None:
            self.forward_chain = replace(forward, statements=tuple(inlined[forward.index]))
        self._inlined = inlined
        self.readable_inputs = caller_readable(state, readers, program.shared_buffer_indices)
        """Planned inputs (their slots) whose caller's tensor the compiled code may read in
        place of the planned view (:func:`~.regions.caller_readable`): the fast call
        passes such an input when it is dense in the program's dim order."""
        self.fixed_outputs = _fixed_outputs(state, [c for c, _, f in self._regions if f is None])
        """Output slots whose tensor only compiled code writes, in place (the planned view
        of a static output): its dtype and shape cannot change, and the fast call does not
        check them."""
        self.calls = state.instruction_count() - sum(
            c.region.last - c.region.first + 1 - 1 for c, _, _ in self._regions
        )
        """How many statements a call runs (a compiled region is one): the fast call
        leaves autograd's dispatch keys in place for a few (:func:`below_autograd_for`)."""
        self.fresh_outputs = _fresh_outputs(
            state, [c for c, _, f in self._regions if f is None], program.shared_buffer_indices
        )
        """Output slots that hold a new tensor after every call, which nothing else holds
        or reads (:func:`_fresh_outputs`): the fast call hands it to the caller as its
        copy."""
        self.handed_outputs = _handed_outputs(state, [c for c, _, _ in self._regions])
        """Output slots (with the tensor loading put there) that hold, after a call, that
        tensor or a new one of the compiled code's that nothing else holds
        (:func:`_handed_outputs`): the fast call hands the new one to the caller as its
        copy (the other it copies) and puts the load-time tensor back."""
        self.returned_outputs = _returned_outputs(
            self.fixed_outputs, [(k, c) for k, (c, _, f) in enumerate(self._regions) if f is None]
        )
        """Output slots (each a fixed output) whose copy the compiled code returns, with the
        expression naming it in the region's inlined body (``_r{k}[n]``): the fast call,
        which runs that body in its own lines (:meth:`inline`), hands it to the caller as
        its copy of the output."""
        self.report = replace(
            self.report,
            read_in_place=tuple(s.index for s in state.inputs if s.slot in self.readable_inputs),
        )

    def bind(self, state: MethodState) -> None:
        pass

    def run(self, v: list[Any]) -> None:
        self._blocks.run(v)

    def inline(self) -> tuple[Statement, ...] | None:
        """The statements of the method's one straight-line chain, each compiled region's
        call written out in its first instruction's place, for a caller to run in place of
        :meth:`run`; None with jumps or more chains."""
        chains = self.state.chains
        if len(chains) != 1 or chains[0].has_jumps:
            return None
        return tuple(self._inlined[chains[0].index])

    def source(self) -> str:
        """The generated code this runner runs: each compiled region's call (and the
        interpreted statements it falls back to outside its compiled sizes), then the
        blocks, in which a region's first instruction calls it and its others are empty."""
        parts = []
        for k, (compiled, call, fallback) in enumerate(self._regions):
            r = compiled.region
            parts.append(
                f"# chain {r.chain} region {k}: instructions {r.first}-{r.last} run compiled "
                f"({self._backend}), called as _R{k}(v)\n"
                + self.state.sources.listing(call, self.state.chains[r.chain].names)
            )
            if fallback is not None:
                parts.append(
                    f"# chain {r.chain} region {k}, interpreted: outside the sizes it was "
                    "compiled for\n"
                    + self.state.sources.listing(fallback, self.state.chains[r.chain].names)
                )
        parts.append(self._blocks.source())
        return "\n".join(parts)
