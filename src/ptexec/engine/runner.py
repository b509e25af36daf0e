"""Runners: what executes a method's instructions once its inputs are bound.

A runner is chosen once, at load (never swapped at run time), and the call envelope
(:class:`ptexec.Method`) drives it: ``bind(state)`` after the inputs are in the values
table, then ``run(values)``. ``direct_outputs`` says whether the runner may write an
unplanned output straight into a tensor the caller passed with ``out=`` (it can when it
writes wherever the values table points, not when it replays fixed addresses).

- :class:`BlockRunner`: the compiled basic blocks (:mod:`.blocks`), chain after chain;
- :class:`InstrumentedRunner`: the same statements in the instrumented blocks, calling a
  tool's :class:`~.hooks.Hooks`; made per traced or profiled call, over blocks compiled
  once per method on first use;
- :class:`~.cuda_graph.CudaGraphRunner`: one captured CUDA graph, replayed.

Both block runners count executed instructions block by block against the method's
``max_instructions`` and turn any failure inside an instruction into the same
:class:`~ptexec.errors.ExecutionError` (instruction, operator, exported call stack).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any, Protocol

import torch

from ..errors import ExecutionError, InstructionLimitError, LimitExceededError, PtexecError
from ..loader.state import Kept, MethodState, PreparedChain
from .blocks import CompiledChain, chain_listing, compile_chain, compile_forward, forward_only
from .hooks import Hooks, StopCall, steps_of

__all__ = [
    "BlockRunner",
    "InstrumentedRunner",
    "Runner",
    "below_autograd",
    "below_autograd_for",
    "instrumented_chains",
    "run_chains",
]

# Inference never needs autograd, yet every op still passes through its dispatch keys
# (about 0.2 us of a small op's 2 us) unless they are excluded for the call; excluding them
# costs about 1 us per call, so it pays from a handful of instructions on.
_BELOW_AUTOGRAD: Callable[[], ContextManager[Any]] | None = getattr(
    torch._C, "_AutoDispatchBelowAutograd", None
)
BELOW_AUTOGRAD_FROM = 8  # instructions
# For the fast call's instructions and output copies: below ADInplaceOrView as well, so
# that views (``reshape``, ``permute``, ``expand``, ``split``: a copy made a view) also
# skip the bookkeeping autograd would need of them, about 0.3 us each. The kernels are the
# same; a view made there is not marked as one (no shared version counter, no ``_base``)
# and a tensor written in place there keeps its version count, which only autograd reads:
# used where the caller is handed copies alone and no tensor of the caller is written.
_BELOW_VIEWS: Callable[[], ContextManager[Any]] | None = getattr(
    torch._C, "_AutoDispatchBelowADInplaceOrView", _BELOW_AUTOGRAD
)


def below_autograd() -> ContextManager[Any]:
    """A context in which torch's ops skip their autograd dispatch (a no-op context where
    this torch has no such guard). Tensors made in it are ordinary tensors."""
    return _BELOW_AUTOGRAD() if _BELOW_AUTOGRAD is not None else contextlib.nullcontext()


def below_autograd_for(
    state: MethodState, copies_out: bool = False, calls: int | None = None
) -> Callable[[], ContextManager[Any]] | None:
    """The guard for the fast calls of ``state`` (their instructions and output copies),
    or None when it would cost more than it saves. ``copies_out``: the caller is handed
    copies alone and none of its tensors is written, so views and in-place writes may
    skip their bookkeeping. ``calls``: how many statements a call runs, when the runner
    runs fewer than the method's instructions (a compiled region is one)."""
    guard = _BELOW_VIEWS if copies_out else _BELOW_AUTOGRAD
    count = state.instruction_count() if calls is None else calls
    if guard is None or count < BELOW_AUTOGRAD_FROM:
        return None
    return guard


class Runner(Protocol):
    """What the call envelope needs of a runner (see the module docstring)."""

    direct_outputs: bool

    def bind(self, state: MethodState) -> None: ...

    def run(self, v: list[Any]) -> None: ...

    def source(self) -> str:
        """The generated Python it runs, piece by piece under headers (for people)."""
        ...


def limit_error(state: MethodState, chain: int, compiled: CompiledChain, b: int) -> Exception:
    """The error of a call stopped by the instruction limit at block ``b`` of ``chain``."""
    i = compiled.starts[b]
    names = state.chains[chain].names
    return InstructionLimitError(
        state.name,
        i if names else -1,
        names[i] if names else "?",
        f"executed more than {state.max_instructions} instructions; stopped (a malformed "
        "jump may loop forever)",
    )


def run_chains(
    state: MethodState, chains: list[CompiledChain], v: list[Any], h: Hooks | None
) -> None:
    """Run compiled chains on ``v``, block by block, counting instructions against the
    method's limit; instrumented blocks get the hooks ``h``. A failure inside an
    instruction becomes the :class:`ExecutionError` naming it; with hooks, an exception
    raised outside every instruction (by a hook) propagates as it is."""
    limit = state.max_instructions
    count = 0
    try:
        for c, compiled in enumerate(chains):
            blocks, sizes = compiled.blocks, compiled.sizes
            b = 0
            while b >= 0:
                count += sizes[b]
                if count > limit:
                    raise limit_error(state, c, compiled, b)
                b = blocks[b](v) if h is None else blocks[b](v, h)
    except (LimitExceededError, ExecutionError, StopCall):
        raise
    except Exception as e:
        if (
            h is not None
            and not isinstance(e, PtexecError)
            and state.sources.locate(e.__traceback__) is None
        ):
            raise  # not an instruction's failure: the tool's own
        raise state.execution_error(e) from e


def _listing(
    state: MethodState, chains: list[CompiledChain], prepared: list[PreparedChain] | None = None
) -> str:
    return "\n".join(
        chain_listing(c, compiled, state.sources)
        for c, compiled in zip(prepared or state.chains, chains, strict=True)
    )


class BlockRunner:
    """The plain compiled blocks of every chain (compiled at the first run: a method whose
    common calls run its statements inlined in the fast path may never need them).

    When every jump of every chain goes forward (``torch.cond``'s branches) and all the
    instructions together are within the limit, no call can run past it: each chain then
    runs as one function (:func:`~.blocks.compile_forward`), without a call per block or
    counting."""

    direct_outputs = True

    def __init__(self, state: MethodState, chains: list[PreparedChain] | None = None) -> None:
        """``chains``: the method's own (``state.chains``) unless another runner rewrote
        some statements (the compiled tier: a region's call in its first instruction)."""
        self.state = state
        self._prepared = state.chains if chains is None else chains
        self._chains: list[CompiledChain] | None = None
        self._forward: list[Callable[[list[Any]], None]] | None = None
        self.forward = state.instruction_count() <= state.max_instructions and all(
            forward_only(c) for c in self._prepared
        )

    @property
    def chains(self) -> list[CompiledChain]:
        if self._chains is None:
            self._chains = [compile_chain(c, self.state.sources) for c in self._prepared]
        return self._chains

    def _functions(self) -> list[Callable[[list[Any]], None]]:
        if self._forward is None:
            self._forward = [compile_forward(c, self.state.sources) for c in self._prepared]
        return self._forward

    def prepare(self) -> None:
        """Compile the blocks now (a generated statement that does not compile fails at
        load, not at a call)."""
        if self.forward:
            self._functions()
        else:
            _ = self.chains

    def bind(self, state: MethodState) -> None:
        pass

    def run(self, v: list[Any]) -> None:
        if not self.forward:
            run_chains(self.state, self.chains, v, None)
            return
        functions = self._forward if self._forward is not None else self._functions()
        try:
            for fn in functions:
                fn(v)
        except (LimitExceededError, ExecutionError):
            raise
        except Exception as e:
            raise self.state.execution_error(e) from e

    def source(self) -> str:
        """Every chain's blocks, or its one function (compiled now if not yet)."""
        state = self.state
        if not self.forward:
            return _listing(state, self.chains, self._prepared)
        return "\n".join(
            f"# chain {c.index}: its blocks in one function (every jump goes forward)\n"
            + state.sources.listing(fn, c.names)
            for c, fn in zip(self._prepared, self._functions(), strict=True)
        )

    @property
    def forward_chain(self) -> PreparedChain | None:
        """The one chain, when its jumps all go forward within the limit: a caller may run
        its lines (:func:`~.blocks.forward_lines`) in place of :meth:`run`."""
        return self._prepared[0] if self.forward and len(self._prepared) == 1 else None

    @property
    def straight_line(self) -> bool:
        """One chain without jumps: its statements can be inlined into a caller."""
        chains = self._prepared
        return len(chains) == 1 and not chains[0].has_jumps


def _instrumented(state: MethodState) -> list[CompiledChain]:
    steps = steps_of(state)
    return [compile_chain(c, state.sources, steps[c.index]) for c in state.chains]


instrumented_chains = Kept(_instrumented)
"""``instrumented_chains(state)``: the instrumented blocks of a method (compiled on first
use)."""


class InstrumentedRunner:
    """The instrumented blocks, calling ``hooks`` around every instruction; ``begin`` and
    ``end`` before the first and after the last."""

    direct_outputs = True

    def __init__(self, state: MethodState, hooks: Hooks) -> None:
        self.state = state
        self.hooks = hooks
        self.chains = instrumented_chains(state)

    def bind(self, state: MethodState) -> None:
        pass

    def source(self) -> str:
        return _listing(self.state, self.chains)

    def run(self, v: list[Any]) -> None:
        h = self.hooks
        h.begin(v)
        run_chains(self.state, self.chains, v, h)
        h.end(v)
