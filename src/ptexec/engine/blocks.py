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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..codegen import Sources
from ..format import program as p
from ..loader.state import PreparedChain
from .hooks import Step

__all__ = ["CompiledChain", "basic_blocks", "compile_chain", "compile_statement"]


@dataclass(frozen=True, slots=True)
class CompiledChain:
    """A chain's block functions, with the number of instructions in each and where it
    starts (for the instruction limit)."""

    blocks: tuple[Callable[..., int], ...]
    sizes: tuple[int, ...]
    starts: tuple[int, ...]


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
        if start >= n:  # an empty chain
            funcs.append((lambda v, h: -1) if hooked else (lambda v: -1))
            continue
        lines = ["def _block(v, h):" if hooked else "def _block(v):"]
        env: dict[str, Any] = {}
        lineno: dict[int, int] = {}
        nxt = block_of.get(end, -1) if end < n else -1
        tail: str | None = f"    return {nxt}"
        for i in range(start, end):
            st = chain.statements[i]
            env.update(st.env)
            if hooked:
                assert steps is not None
                env[f"_S{i}"] = steps[i]
                lines.append(f"    h.before(_S{i}, v)")
            jump = ins[i]
            if isinstance(jump, p.JumpFalseCall):
                dest = jump.destination_instruction
                target = block_of.get(dest, -1) if dest < n else -1
                lineno[len(lines) + 1] = i
                if hooked:
                    lines.append(f"    _c = {st.code}")
                    lines.append(f"    h.after(_S{i}, v, _c)")
                    lines.append(f"    return {nxt} if _c else {target}")
                else:
                    lines.append(f"    return {nxt} if {st.code} else {target}")
                tail = None
            else:
                code = st.instrumented if hooked and st.instrumented is not None else st.code
                for part in code.splitlines():
                    lineno[len(lines) + 1] = i
                    lines.append("    " + part)
                if hooked:
                    lines.append(f"    h.after(_S{i}, v, None)")
        if tail is not None:
            lines.append(tail)
        what = f"chain {chain.index} block {k}" + (" (instrumented)" if hooked else "")
        namespace = sources.compile(
            "\n".join(lines) + "\n", what, env, chain=chain.index, lines=lineno
        )
        funcs.append(namespace["_block"])
    return CompiledChain(
        tuple(funcs), tuple(max(e - s, 1) for s, e in spans), tuple(s for s, _ in spans)
    )


def compile_statement(
    st: Any, jump: bool, sources: Sources, what: str
) -> Callable[[list[Any]], Any]:
    """One statement as a function of the values table (returning a jump's condition), for
    tools that run a statement on a table of their own (the float64 reference)."""
    body = [f"    return {st.code}"] if jump else ["    " + x for x in st.code.splitlines()]
    namespace = sources.compile(
        "def _step(v):\n" + "\n".join(body or ["    pass"]) + "\n", what, st.env
    )
    fn: Callable[[list[Any]], Any] = namespace["_step"]
    return fn
