"""The block compiler: a chain's statements become one Python function per basic block.

A basic block is a run of instructions that control flow enters only at its first one and
leaves only after its last (ExecuTorch's only branch is ``JumpFalseCall``). Its function
runs the statements in order on the values table ``v`` and returns the index of the next
block, or -1 at the end of the chain:

    def _block(v):
        torch.add(v[1], v[2], out=v[3])          # instruction 0
        return 1 if bool(v[3]) else 2            # instruction 1, a jump

The instrumented variant of the same blocks (``steps`` given) takes a second argument,
the tool's :class:`~.hooks.Hooks`, and calls ``h.before(step, v)`` and
``h.after(step, v, result)`` around every statement; the statements themselves are the
same objects. Every line that runs a statement maps back to its instruction (through
:class:`~ptexec.codegen.Sources`), so a failure names the instruction in both variants.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..codegen import Code, Sources
from ..format import program as p
from ..loader.state import PreparedChain
from .hooks import Step

__all__ = [
    "CompiledChain",
    "basic_blocks",
    "chain_listing",
    "compile_chain",
    "compile_forward",
    "compile_statement",
    "forward_lines",
    "forward_only",
]


@dataclass(frozen=True, slots=True)
class CompiledChain:
    """A chain's block functions, with the number of instructions in each and where it
    starts (for the instruction limit) and ends."""

    blocks: tuple[Callable[..., int], ...]
    sizes: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]  # where each block's instructions end (exclusive)


def basic_blocks(instructions: Sequence[p.Instruction]) -> list[tuple[int, int]]:
    """``(start, end)`` of each basic block, in order (an empty chain has one, empty)."""
    n = len(instructions)
    leaders = {0}
    for i, ins in enumerate(instructions):
        if isinstance(ins, p.JumpFalseCall):
            leaders.add(ins.destination_instruction)
            leaders.add(i + 1)
    starts = sorted(s for s in leaders if s < n) or [0]
    return [(s, starts[k + 1] if k + 1 < len(starts) else n) for k, s in enumerate(starts)]


def compile_chain(
    chain: PreparedChain, sources: Sources, steps: Sequence[Step] | None = None
) -> CompiledChain:
    """The block functions of ``chain``; instrumented when ``steps`` (the chain's
    :class:`Step` list) is given."""
    ins = chain.instructions
    n = len(ins)
    spans = basic_blocks(ins)
    block_of = {s: k for k, (s, _) in enumerate(spans)}
    hooked = steps is not None
    funcs: list[Callable[..., int]] = []
    for k, (start, end) in enumerate(spans):
        code = Code(chain.index)
        code.add("def _block(v, h):" if hooked else "def _block(v):")
        nxt = block_of.get(end, -1) if end < n else -1
        with code.indented():
            ends_in_jump = False
            for i in range(start, min(end, n)):
                st = chain.statements[i]
                code.env.update(st.env)
                if hooked:
                    assert steps is not None
                    code.env[f"_S{i}"] = steps[i]
                    code.add(f"h.before(_S{i}, v)")
                jump = ins[i]
                if isinstance(jump, p.JumpFalseCall):
                    dest = jump.destination_instruction
                    target = block_of.get(dest, -1) if dest < n else -1
                    if hooked:
                        code.add(f"_c = {st.code}", i)
                        code.add(f"h.after(_S{i}, v, _c)")
                        code.add(f"return {nxt} if _c else {target}")
                    else:
                        code.add(f"return {nxt} if {st.code} else {target}", i)
                    ends_in_jump = True
                else:
                    body = st.instrumented if hooked and st.instrumented is not None else st.code
                    code.add(body, i)
                    if hooked:
                        code.add(f"h.after(_S{i}, v, None)")
            if not ends_in_jump:
                code.add(f"return {nxt}")
        what = f"chain {chain.index} block {k}" + (" (instrumented)" if hooked else "")
        funcs.append(code.function(sources, what, "_block"))
    return CompiledChain(
        tuple(funcs),
        tuple(max(e - s, 1) for s, e in spans),
        tuple(s for s, _ in spans),
        tuple(e for _, e in spans),
    )


def forward_only(chain: PreparedChain) -> bool:
    """Every jump of ``chain`` goes forward: a call runs each instruction at most once."""
    for i in chain.jumps:
        jump = chain.instructions[i]
        assert isinstance(jump, p.JumpFalseCall)
        if jump.destination_instruction <= i:
            return False
    return True


def compile_forward(chain: PreparedChain, sources: Sources) -> Callable[[list[Any]], None]:
    """The plain blocks of a :func:`forward_only` chain as one function of the values
    table, each block under ``if b == k:`` in order (a jump only ever selects a later
    block, so one pass runs them all); no per-block call and nothing to count:

        def _chain(v):
            torch.add(v[1], v[2], out=v[3])          # block 0
            b = 1 if bool(v[3]) else 2
            if b == 1:
                ...
    """
    code = Code(chain.index)
    code.add("def _chain(v):")
    with code.indented():
        forward_lines(chain, code)
        code.add("return None")
    fn: Callable[[list[Any]], None] = code.function(
        sources, f"chain {chain.index} in one function", "_chain"
    )
    return fn


def forward_lines(
    chain: PreparedChain,
    code: Code,
    instead: Mapping[int, str] | None = None,
    runs: Mapping[int, Callable[[], Sequence[int]]] | None = None,
) -> None:
    """Add the body of :func:`compile_forward`'s function to ``code`` at its indentation,
    each line tagged with its instruction: the blocks under ``if b == k:`` in order (``b``
    a local of the function the lines are in). ``instead``: code to run in place of some
    instructions' statements (a jump's: its condition), by instruction. ``runs``: by
    instruction, what adds the lines of a run of instructions within its block, which
    returns the instructions it ran (their own lines are not added)."""
    instead = instead or {}
    runs = runs or {}
    covered: set[int] = set()
    ins = chain.instructions
    n = len(ins)
    spans = basic_blocks(ins)
    block_of = {s: k for k, (s, _) in enumerate(spans)}
    for k, (start, end) in enumerate(spans):
        nxt = block_of.get(end, -1) if end < n else -1
        with contextlib.ExitStack() as stack:
            if k:
                code.add(f"if b == {k}:")
                stack.enter_context(code.indented())
            jumped = False
            for i in range(start, min(end, n)):
                st = chain.statements[i]
                code.env.update(st.env)
                if i in runs:
                    covered.update(runs[i]())
                if i in covered:
                    continue
                text = instead.get(i, st.code)
                jump = ins[i]
                if isinstance(jump, p.JumpFalseCall):
                    dest = jump.destination_instruction
                    target = block_of.get(dest, -1) if dest < n else -1
                    code.add(f"b = {nxt} if {text} else {target}", i)
                    jumped = True
                else:
                    code.add(text, i)
            if not jumped:
                code.add(f"b = {nxt}")


def chain_listing(state: PreparedChain, compiled: CompiledChain, sources: Sources) -> str:
    """The source of ``compiled``'s blocks (chain ``state``), each under a header saying
    which block it is and which instructions it runs, instructions named."""
    parts = []
    for k, fn in enumerate(compiled.blocks):
        start, end = compiled.starts[k], compiled.ends[k]
        span = f"instructions {start}-{end - 1}" if end > start else "no instructions"
        text = sources.listing(fn, state.names)
        parts.append(f"# chain {state.index} block {k}: {span}\n{text}")
    return "\n".join(parts)


def compile_statement(
    st: Any, jump: bool, sources: Sources, what: str
) -> Callable[[list[Any]], Any]:
    """One statement as a function of the values table (returning a jump's condition), for
    tools that run a statement on a table of their own (the float64 reference)."""
    code = Code()
    code.env.update(st.env)
    code.add("def _step(v):")
    with code.indented():
        code.add(f"return {st.code}" if jump else st.code)
        code.add("pass")
    fn: Callable[[list[Any]], Any] = code.function(sources, what, "_step")
    return fn
