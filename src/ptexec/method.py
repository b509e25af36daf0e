"""A loaded method: the facade over its loaded state, and the one call envelope.

Loading (:func:`ptexec.loader.load_state`) produces the method's state as data; a runner
chosen at load (:mod:`ptexec.engine.runner`) executes its instructions. A call goes
through one envelope, whoever makes it (``execute``, a trace, a profile, any tool with
hooks): no autograd, validate every input and ``out=`` tensor before writing anything,
bind them, run, collect the outputs, restore the method's tensors if anything failed, and
release the caller's memory. The common call (inputs already as the program expects, the
default options) takes a generated fast path that does the same in one function.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex

import torch

from .accounting import CallRecord
from .binding import Policy
from .engine import arguments
from .engine.arguments import OutputMode
from .engine.cuda_graph import CudaGraphRunner
from .engine.fastcall import NOT_FAST, build_fast_call, runs_inline
from .engine.hooks import Hooks
from .engine.runner import BlockRunner, InstrumentedRunner, Runner, below_autograd
from .errors import BackendUnavailableError, PtexecError, StateError
from .loader import (
    DEFAULT_MAX_INSTRUCTIONS,
    DEFAULT_MAX_PLANNED_BYTES,
    DeviceMapSpec,
    LoadOptions,
    MethodMeta,
    ScalarInfo,
    load_state,
)
from .loader.state import MethodState
from .threads import APPLIED, SETTING, WATCH, follow, follow_setting

if TYPE_CHECKING:
    from .compile import CompiledRunner, CompileOptions, CompileReport
    from .compile.background import BackgroundCompile
    from .profile import Profile
    from .program import Program
    from .trace import Trace

__all__ = [
    "DEFAULT_MAX_INSTRUCTIONS",
    "DEFAULT_MAX_PLANNED_BYTES",
    "Method",
    "MethodMeta",
    "ScalarInfo",
]

_DEFAULT_POLICY = Policy()


class Method:
    """A loaded method of a program. Call it, or use :meth:`execute`.

    Options (set at load, each overridable per call): ``transfers`` and ``layout`` (the
    input policy, see :class:`ptexec.binding.Policy`) and ``outputs`` (``"copy"``: fresh
    tensors, the default; ``"view"``: views of the method's memory, valid until the next
    call on this method, from any thread; an output in the program's constants, or in
    state its methods share, is a copy either way). Load-only options: ``device_map``,
    ``max_planned_bytes``, ``max_instructions``, ``optimize`` (default True: copies that
    are views in eager PyTorch run as views, and work on constants alone runs once at load,
    where :mod:`ptexec.loader.dataflow` proves it safe), ``fast_path`` (default True: the
    common call runs as one generated function; False sends every call through the
    general path, which computes the same), ``cuda_graph`` (capture a static CUDA
    method once and replay it), ``xnnpack`` (``"auto"``, ``"torch"`` or
    ``"executorch"``: which runner runs XNNPACK payloads, see
    :mod:`ptexec.delegates.xnnpack.backend`) and ``compile`` (True, or a
    :class:`ptexec.compile.CompileOptions`: run the method's straight-line regions as
    AOTInductor-compiled code, cached on disk; see :attr:`compile_report`;
    ``"background"``: run interpreted at once while another process compiles, and switch
    to the compiled code between calls when it is ready, see :attr:`compile_status`,
    :meth:`wait_compiled` and :mod:`ptexec.compile.background`).

    Limits: ``max_planned_bytes`` (default :data:`DEFAULT_MAX_PLANNED_BYTES`, 16 GiB): loading
    refuses, before allocating anything, a plan whose buffers (shared state included) add up
    to more, and likewise unplanned tensors of bounded shape, counted on their own against
    the same number (:class:`~ptexec.errors.LimitExceededError`). ``max_instructions``
    (default :data:`DEFAULT_MAX_INSTRUCTIONS`, 10,000,000 as ExecuTorch's runtime): a call
    that executes more stops with :class:`~ptexec.errors.InstructionLimitError`, which is
    both an :class:`~ptexec.errors.ExecutionError` and a ``LimitExceededError``. Both must
    be positive.

    Threads: calls on one Method are serialized by a lock (a method owns one set of planned
    buffers, so two calls cannot run in it at once; a second caller waits). Methods loaded
    separately (``load_method`` again, from any thread) have their own memory and lock and
    run in parallel, except methods that share the program's state buffer
    (``share_mutable_buffers`` programs): those share one lock, as they share the state.
    In a child forked while a call ran on another thread, the method (and those sharing
    its state) refuses its calls with :class:`~ptexec.errors.StateError`: that call never
    ends there, and its memory is as it left it half-way (load the method again).
    """

    def __init__(
        self,
        program: Program,
        plan_index: int,
        *,
        device_map: DeviceMapSpec = None,
        transfers: str = "auto",
        layout: str = "strict",
        outputs: OutputMode = "copy",
        max_planned_bytes: int = DEFAULT_MAX_PLANNED_BYTES,
        max_instructions: int = DEFAULT_MAX_INSTRUCTIONS,
        optimize: bool = True,
        fast_path: bool = True,
        cuda_graph: bool = False,
        xnnpack: str = "auto",
        compile: bool | str | CompileOptions = False,
    ) -> None:
        if xnnpack not in ("auto", "torch", "executorch"):
            raise ValueError(f"xnnpack must be 'auto', 'torch' or 'executorch', not {xnnpack!r}")
        self._program = program
        self._policy = Policy(transfers, layout)  # type: ignore[arg-type]
        self._output_mode: OutputMode = _output_mode(outputs)
        options = LoadOptions(
            device_map,
            max_planned_bytes,
            max_instructions,
            optimize,
            backend_options={"xnnpack": xnnpack},
        )
        background = _background_options(compile, cuda_graph)
        if compile:
            follow_setting()  # compiled code (and its cache key) is for this thread's count
        cached = getattr(compile, "cache", True) and getattr(compile, "backend", "aoti") == "aoti"
        if compile and cached:
            from .compile.cache import start_program_digest

            start_program_digest(program)  # the cache key's, hashed beside the loading
        foreground = compile if compile and background is None else None
        try:
            state, runner, report = _prepared(
                program, plan_index, options, foreground, cuda_graph, defer=xnnpack != "torch"
            )
        except _Refused:  # ExecuTorch refused a payload: load as usual, which falls back
            state, runner, report = _prepared(
                program, plan_index, options, foreground, cuda_graph, defer=False
            )
        self._state = state
        self.name = state.name
        plan = state.plan
        # methods sharing the program's state buffer share one lock; others run in parallel
        shared = program.shared_buffer_indices & set(range(1, len(plan.non_const_buffer_sizes)))
        self._lock = program.state_lock if shared else threading.Lock()
        _methods.add(self)
        self._compile_report: CompileReport | None = report
        self._background: BackgroundCompile | None = None
        self._runner = runner
        self._fast_path = fast_path and self._policy == _DEFAULT_POLICY
        self._fast: Callable[[Sequence[Any]], Any] | None = None
        # the fast call of the other output mode (``outputs=`` given per call), made on
        # its first use; NOT_FAST: the method has none
        self._fast_other: Any = None
        # run before a call writes the method's memory (before_each_call)
        self._before_call: Callable[[], None] | None = None
        if self._fast_path:
            self._fast = build_fast_call(state, runner, self._output_mode == "copy")
        # numpy arrays as the fast call takes them, where they are plainly what it takes
        self._arrays = arguments.array_views(state) if self._fast_path else None
        if isinstance(runner, BlockRunner) and (self._fast is None or not runner.straight_line):
            runner.prepare()  # else the fast path compiled the statements, and the blocks wait
        if background is not None:
            from .compile import background as bg

            request = bg.LoadRequest(
                self.name, device_map, optimize, xnnpack, max_planned_bytes, max_instructions
            )
            job = bg.start(state, program, background, request, self._install_compiled)
            self._background = job
            weakref.finalize(self, job.cancel)  # dropping the method ends its compile

    # -- description ---------------------------------------------------------------------
    @property
    def meta(self) -> MethodMeta:
        return self._state.meta

    @property
    def program(self) -> Program:
        return self._program

    @property
    def state(self) -> MethodState:
        """The loaded state (values table, buffers, specs, prepared chains), for tools;
        read it, do not modify it."""
        return self._state

    @property
    def compile_report(self) -> CompileReport | None:
        """What runs compiled (``load_method(..., compile=True)``); None otherwise, and
        while a background compile is pending (a failed one: its report, nothing compiled)."""
        report = self._compile_report
        if report is None and self._background is not None:
            return self._background.report
        return report

    @property
    def compile_status(self) -> str:
        """How the method runs now: ``"interpreted"`` (loaded without ``compile``),
        ``"compiled"``, ``"pending"`` (``compile="background"``: interpreted until the
        compile finishes) or ``"failed: <why>"`` (it runs interpreted)."""
        job = self._background
        if job is not None:
            return job.status
        report = self._compile_report
        if report is None:
            return "interpreted"
        if report.warning and not report.compiled_instructions:
            return f"failed: {report.warning}"
        return "compiled"

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds) for a background compile to finish; whether
        the method runs compiled now. Returns at once without one."""
        job = self._background
        if job is None:
            return self.compile_status == "compiled"
        return job.wait(timeout)

    @property
    def background_compile(self) -> BackgroundCompile | None:
        """The background compile (``compile="background"``): status, process id,
        ``wait``, ``cancel``, ``detach``; None otherwise."""
        return self._background

    def _install_compiled(self, runner: CompiledRunner) -> None:
        """Switch to the compiled runner (a background compile finished): between calls,
        under the call lock, runner and fast call together."""
        fast = build_fast_call(self._state, runner, self._output_mode == "copy")
        with self._lock:
            self._runner = runner
            if self._fast_path:
                self._fast = fast
                self._fast_other = None
            self._compile_report = runner.report

    @property
    def last_call(self) -> CallRecord:
        """What the last call did (actions per input, bytes copied by direction)."""
        return self._state.record

    @property
    def record(self) -> CallRecord:
        return self._state.record

    def before_each_call(self, hook: Callable[[], None] | None) -> None:
        """Run ``hook`` before each later call writes anything in this method's memory,
        under the call lock, in every path (the fast call, the general one, traces and
        profiles); None stops it. For whoever holds tensors over memory a call overwrites
        (:class:`ptexec.training.TrainingModule`'s gradients), so it may run more than
        once for one call: it must do nothing the second time. A hook that raises refuses
        the call, with nothing written. One hook at a time (:class:`StateError`)."""
        if hook is not None and self._before_call is not None and hook is not self._before_call:
            raise StateError(f"method '{self.name}' runs another hook before each call")
        self._before_call = hook

    def values(self) -> list[Any]:
        """The method's values table (tensors, scalars), for inspection; do not modify.

        An output of dynamic shape that only the caller reads may be handed to the caller
        as the instruction writing it made it, not copied into the method's memory: its
        slot then keeps the tensor loading made. A compiled call (``compile=True``) does
        so (the compile report's regions say which instructions wrote it), and so does an
        interpreted one where the instruction's functional form runs the same kernel as
        its out variant. Static outputs are always in the method's memory after a call."""
        return self._state.values

    def source(self) -> str:
        """The generated Python this method runs, for reading (as torch.fx's
        ``print_readable``): the fast call, when the method has one, then what its runner
        runs (every chain's basic blocks; with ``compile=True`` also each compiled
        region's call, the spans it covers named). Each piece comes under a header saying
        which chain, block or region it is, and each instruction's lines under a comment
        naming the instruction; every piece compiles as printed."""
        state = self._state
        parts = [f"# '{self.name}': the generated code it runs"]
        fast = self._fast
        if fast is not None:
            inline = runs_inline(state, self._runner)
            how = "the instructions of chain 0 inline" if inline else "the runner below (_run(v))"
            names = state.chains[0].names if state.chains else ()
            parts.append(
                "# the fast call: common calls (inputs as the program expects, default "
                f"options) run this, and it runs {how}; other calls validate and bind in "
                "the general path, then run the code below\n" + state.sources.listing(fast, names)
            )
        parts.append(self._runner.source())
        return "\n".join(parts)

    def __repr__(self) -> str:
        s = self._state
        return f"<ptexec.Method '{self.name}': {len(s.inputs)} inputs, {len(s.outputs)} outputs>"

    def __copy__(self) -> Method:
        """A shallow copy: the same memory, state and call lock as this method."""
        other = Method.__new__(Method)
        other.__dict__.update(self.__dict__)
        return other

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        # (pickle reached the program's memoryview and named only that; a deep copy too)
        raise TypeError(
            f"cannot pickle or deep-copy a ptexec.Method ('{self.name}': it holds its "
            "program's memory and its own): load_method again for a method with memory "
            "and state of its own, or ptexec.load the program's file in another process"
        )

    # -- calling -------------------------------------------------------------------------
    def __call__(self, *inputs: Any, **options: Any) -> list[Any]:
        return self.execute(list(inputs), **options)

    def execute(
        self,
        inputs: Sequence[Any] = (),
        *,
        outputs: OutputMode | None = None,
        out: Sequence[Any] | None = None,
        transfers: str | None = None,
        layout: str | None = None,
    ) -> list[Any]:
        """Run the method on ``inputs`` (a flat sequence) and return its outputs as a list.

        ``out`` gives tensors to receive the outputs (None entries for the others); an
        unplanned output is written straight into the caller's tensor (one of dynamic
        shape when the tensor itself, dense, holds the bound: not a view of a larger
        tensor), others are copied into it after the run (resized as torch's ``out=``
        resizes). Every input and ``out`` tensor is checked before anything is
        written: a bad one raises one of :data:`ptexec.errors.CALL_REFUSALS`
        (:class:`InputError`, :class:`UnsupportedDeviceError`, or
        :class:`DeviceUnavailableError` for CUDA memory without CUDA) and leaves the
        method's state as it was.
        """
        if WATCH[0]:  # torch's count is per thread: this one may not have the setting
            try:
                stale = APPLIED.setting is not SETTING[0]
            except AttributeError:  # the thread's first call
                stale = True
            if stale:
                follow()
        kind = type(inputs)
        if (
            self._fast is not None
            and (kind is list or kind is tuple)
            and (outputs is None or outputs == "copy" or outputs == "view")
            and out is None
            and transfers is None
            and layout is None
        ):
            with self._lock:
                before = self._before_call
                if before is not None:
                    before()
                # read under the lock: a background compile swaps it
                fast = (
                    self._fast
                    if outputs is None or outputs == self._output_mode
                    else self._other_fast(outputs)
                )
                try:
                    result = fast(inputs) if fast is not None else NOT_FAST
                    if result is NOT_FAST and fast is not None and self._arrays is not None:
                        # refused untouched: the same call with numpy arrays as torch's
                        # views of them, where they are plainly what the inputs take
                        views = self._arrays(inputs)
                        if views is not None:
                            result = fast(views)
                except BaseException as e:  # KeyboardInterrupt too: the next call must work
                    self._state.restore()
                    if isinstance(e, PtexecError) or not isinstance(e, Exception):
                        raise
                    raise self._state.execution_error(e) from e
            if result is not NOT_FAST:
                return result  # type: ignore[no-any-return]
        return self._call(inputs, None, outputs, out, transfers, layout)

    def _other_fast(self, outputs: OutputMode) -> Callable[[Sequence[Any]], Any] | None:
        """The fast call returning outputs as ``outputs`` says, where the method was
        loaded with the other mode; built once (under the call lock)."""
        if self._fast_other is None:
            made = build_fast_call(self._state, self._runner, outputs == "copy")
            self._fast_other = NOT_FAST if made is None else made
        return None if self._fast_other is NOT_FAST else self._fast_other

    def run_with(
        self,
        hooks: Hooks,
        inputs: Sequence[Any] = (),
        *,
        outputs: OutputMode | None = "copy",
        transfers: str | None = None,
        layout: str | None = None,
    ) -> list[Any]:
        """One call through the same envelope as :meth:`execute`, running the instrumented
        blocks with ``hooks`` (:class:`ptexec.engine.hooks.Hooks`) called around every
        instruction: how traces, profiles and recorders watch a call."""
        follow_setting()
        return self._call(
            inputs, InstrumentedRunner(self._state, hooks), outputs, None, transfers, layout
        )

    def _call(
        self,
        inputs: Sequence[Any],
        runner: Runner | None,
        outputs: OutputMode | None,
        out: Sequence[Any] | None,
        transfers: str | None,
        layout: str | None,
    ) -> list[Any]:
        """The call envelope (module docstring); ``runner`` None: the method's own, read
        under the lock (a background compile swaps it between calls)."""
        if (
            type(inputs) is not list
            and type(inputs) is not tuple
            and (isinstance(inputs, torch.Tensor) or not isinstance(inputs, Sequence))
        ):
            inputs = [inputs]  # a single tensor or array counts as one input
        policy = self._policy
        if transfers is not None or layout is not None:
            # (None alone means the method's own: any other value is checked as at load)
            policy = Policy(
                policy.transfers if transfers is None else transfers,  # type: ignore[arg-type]
                policy.layout if layout is None else layout,  # type: ignore[arg-type]
            )
        mode = self._output_mode if outputs is None else _output_mode(outputs)
        state = self._state
        # inference: autograd must not touch the memory (nor cost time)
        with self._lock, torch.no_grad(), below_autograd():
            if runner is None:
                runner = self._runner
            bound = arguments.check_inputs(state, inputs, policy, policy == _DEFAULT_POLICY)
            given = None
            if out is not None:
                given = arguments.check_out(state, out)
                arguments.check_aliasing(state, bound, given)
            before = self._before_call
            if before is not None:
                before()
            try:
                # binding may fail part-way (a copy into planned memory, a runner's own
                # binding): what it wrote is restored and released like a failed run's
                arguments.bind_inputs(state, bound)
                runner.bind(state)
                if given is not None:
                    arguments.bind_out(state, given, runner.direct_outputs)
                runner.run(state.values)
                return arguments.collect(state, mode, given)
            except BaseException:
                state.restore()
                raise
            finally:
                arguments.release(state, given is not None)

    # -- tools ---------------------------------------------------------------------------
    def trace(self, inputs: Sequence[Any] = (), **options: Any) -> Trace:
        """Run the method once, instruction by instruction, and record what each one wrote;
        options as :func:`ptexec.trace.trace` (``tensors``, ``reference``, ``stop_on``, ...)."""
        from .trace import trace

        return trace(self, inputs, **options)

    def profile(self, inputs: Sequence[Any] = (), **options: Any) -> Profile:
        """Time every instruction over repeated calls; options as
        :func:`ptexec.profile.profile` (``repeat``, ``warmup``, ``sync``, ...)."""
        from .profile import profile

        return profile(self, inputs, **options)


class _Refused(Exception):
    """ExecuTorch refused a payload whose load a compiled load deferred."""


# every live method: a child of a fork looks for those whose lock a call held (_forked)
_methods: weakref.WeakSet[Method] = weakref.WeakSet()


def _forked() -> None:
    """In a child of a fork: a method whose call lock was held, by a call on a thread of
    the parent that does not exist here, would wait for that call for ever, and its memory
    (its state too) is as that call left it. Its lock is made again (one for all the
    methods that shared it) and its calls are refused, naming why."""
    fresh: dict[int, threading.Lock] = {}
    for method in list(_methods):
        held = method._lock
        if not held.locked():
            continue
        lock = fresh.setdefault(id(held), threading.Lock())
        if method._program.state_lock is held:
            method._program.state_lock = lock
        method._lock = lock
        method._before_call = _refuser(method.name)


def _refuser(name: str) -> Callable[[], None]:
    def refuse() -> None:
        raise StateError(
            f"method '{name}' was running a call on another thread when this process was "
            "forked: that call never ends here and the method's memory and state are as it "
            "left them; load the method (or the program, for fresh state) again"
        )

    return refuse


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _prepared(
    program: Program,
    plan_index: int,
    options: LoadOptions,
    compile: Any,
    cuda_graph: bool,
    defer: bool,
) -> tuple[MethodState, Runner, CompileReport | None]:
    """The method's state and runner (the compiled one with ``compile``, and its report).

    A compiled load with ``defer`` defers ExecuTorch's pybindings' loads of the XNNPACK
    payloads (:func:`~ptexec.delegates.xnnpack.executorch_runner.deferred_loads`): those
    whose calls the compiled code runs through ExecuTorch's C++ runtime are never loaded
    there, the others are loaded before returning. A payload ExecuTorch then refuses
    raises :class:`_Refused`, and the caller loads again without deferring (where such a
    payload falls back to ptexec's own XNNPACK code under ``xnnpack="auto"``, or raises)."""
    if not compile or not defer:
        state = load_state(program, plan_index, options)
        made: list[Any] = []
    else:
        from .delegates.xnnpack.executorch_runner import deferred_loads

        with deferred_loads() as made:
            state = load_state(program, plan_index, options)
    runner: Runner = CudaGraphRunner(state) if cuda_graph else BlockRunner(state)
    report: CompileReport | None = None
    if compile:
        from .compile import compiled_runner

        runner = compiled = compiled_runner(state, program, compile, cuda_graph)
        report = compiled.report
    if made:
        from .delegates.xnnpack.executorch_runner import load_deferred

        try:
            load_deferred(made)
        except BackendUnavailableError as e:
            raise _Refused(str(e)) from e
    return state, runner, report


def _background_options(compile: Any, cuda_graph: bool) -> CompileOptions | None:
    """The options of a background compile (``compile="background"`` or a
    ``CompileOptions(background=True)``); None for any other ``compile``."""
    if isinstance(compile, str):
        if compile != "background":
            raise ValueError(
                f"compile must be a bool, 'background' or a CompileOptions, not {compile!r}"
            )
        from .compile import CompileOptions

        compile = CompileOptions(background=True, progress=False)
    if not getattr(compile, "background", False):
        return None
    if cuda_graph:
        raise ValueError("compile and cuda_graph cannot be combined: choose one runner")
    return compile  # type: ignore[no-any-return]


def _output_mode(mode: Any) -> OutputMode:
    if mode not in ("copy", "view"):
        raise ValueError(f"outputs must be 'copy' or 'view', not {mode!r}")
    return mode  # type: ignore[no-any-return]
