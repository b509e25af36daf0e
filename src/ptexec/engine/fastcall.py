"""The common call, as one generated function.

Most calls pass torch tensors that already are what the program expects (its dtype, a
shape within its bounds, its device, a dense layout it can read), with the method's
default options. For those, a call is: check each input, copy the planned ones into their
views and hand the others over, run the instructions, copy the outputs out. At load, all
of that is written out as one Python function with every decision already made, so a call
runs no loops over specs, no policy logic and no per-input dispatch.

The function returns :data:`NOT_FAST` (before touching anything) for any call it does not
cover, and :meth:`ptexec.Method.execute` then takes its general path, which validates,
binds and reports errors exactly as always. For the calls it covers, it binds exactly as
the general path's rules would (the placement decision's ``COPY`` and ``SHARE``), and
fills in :attr:`ptexec.Method.last_call` the same way. It runs the method's runner, with
the statements inlined when the runner is the plain blocks of one straight-line chain.
Failures propagate raw: the envelope restores the method and reports them.

It restates no rule: the copy-or-share decision is
:func:`ptexec.binding.common_action`'s, and the scalar, shape and output checks are
rendered by :func:`~.arguments.scalar_test`, :func:`ptexec.binding.shape_test` and
:func:`~.arguments.output_checks`, the generated forms of :func:`~.arguments.scalar_fits`,
:func:`~ptexec.binding.shape_error` and :func:`~.arguments.output_error`, defined beside
them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from ..binding import Action, common_action, shape_test
from ..codegen import Code
from ..kernels.registry import Statement
from ..loader.state import MethodState
from ..memory import resize_to
from .arguments import output_checks, output_error, scalar_test
from .runner import BlockRunner, Runner, below_autograd_for

__all__ = ["NOT_FAST", "build_fast_call", "inline_statements"]


class _NotFast:
    def __repr__(self) -> str:
        return "NOT_FAST"


NOT_FAST: Any = _NotFast()

# clones of a list of tensors in one call, each as ``Tensor.clone`` makes it
_CLONE_ALL: Any = getattr(torch, "_foreach_clone", None)


def build_fast_call(state: MethodState, runner: Runner, copy_outputs: bool) -> Any:
    """The function for the common calls of the method (it takes the list of inputs), or
    None when its calls always need the general path (options other than the defaults are
    the caller's to rule out). ``copy_outputs``: the outputs are returned as copies."""
    if not runner.direct_outputs:
        return None  # a runner that binds inputs itself (a CUDA graph): the general path
    code = Code()
    env = code.env
    env.update(NOT_FAST=NOT_FAST, Tensor=torch.Tensor, strided=torch.strided)
    env.update(v=state.values, rec=state.record, resize_to=resize_to)
    checks: list[str] = []
    binds: list[str] = []
    actions: list[str] = []
    copied = []  # (static nbytes | expression) per planned input
    restored: list[tuple[int, str]] = []  # (slot, what it holds between calls)
    # planned inputs the runner's code only reads (see the module docstring)
    readable: frozenset[int] = getattr(runner, "readable_inputs", frozenset())
    n = len(state.inputs)
    for spec in state.inputs:
        i = spec.index
        x = f"x{i}"
        if spec.kind != "tensor":  # the general path's rule, for the value's own type
            env[f"w{i}"] = spec.scalar
            test = scalar_test(spec.kind, spec.scalar, x, f"w{i}")
            checks.append(f"if not ({test}): return NOT_FAST")
            actions.append("value")
            continue
        info = spec.info
        assert info is not None and spec.dtype is not None
        env[f"d{i}"] = spec.dtype
        device = spec.device
        if device.is_cpu:
            where = f"not {x}.is_cpu"
        else:
            where = f"not {x}.is_cuda or {x}.get_device() != {device.index}"
        checks.append(
            f"if type({x}) is not Tensor or {x}.dtype is not d{i} or {where} "
            f"or {x}.requires_grad or {x}.layout is not strided: return NOT_FAST"
        )
        if info.dynamism == "static":
            if 0 in info.sizes:
                return None  # empty inputs bind as EMPTY: the general path
            checks.append(f"if not ({shape_test(info, f'{x}.shape')}): return NOT_FAST")
        elif info.dynamism == "dynamic_bound":  # with elements: else EMPTY, the general path
            checks.append(f"{x}s = {x}.shape")
            checks.append(f"if not ({shape_test(info, f'{x}s')}) or 0 in {x}s: return NOT_FAST")
        else:
            return None  # unbounded inputs: the general path
        # the placement decision for such a tensor, as the general path takes it
        action = common_action(info, True)
        if action is None:
            return None  # other layouts: the general path decides
        if common_action(info, False) is not action:
            checks.append(f"if not {x}.is_contiguous(): return NOT_FAST")
        if action is Action.COPY and spec.slot in readable:
            # the runner's code only reads it: the caller's tensor stands in for the
            # planned view when it is dense in the program's (default) dim order
            assert spec.view is not None
            env[f"V{i}"] = spec.view
            env[f"o{i}"] = spec.dim_order
            where_x, apart = _apart(state, i)
            if where_x:
                binds.append(where_x)
            binds.append(f"if {x}.is_contiguous(){apart}: v[{spec.slot}] = {x}")
            binds.append("else:")
            if info.dynamism != "static":
                binds.append(f"    if V{i}.shape != {x}s: resize_to(V{i}, {x}s, o{i})")
            binds.append(f"    V{i}.copy_({x})")
            binds.append(f"    rec.{'h2h' if device.is_cpu else 'd2d'} += {x}.nbytes")
            binds.append(f"    rec.inputs[{i}] = 'copy'")
            restored.append((spec.slot, f"V{i}"))
            action = Action.SHARE
        elif action is Action.COPY:
            assert spec.view is not None
            env[f"V{i}"] = spec.view
            env[f"o{i}"] = spec.dim_order
            if info.dynamism != "static":
                binds.append(f"if V{i}.shape != {x}s: resize_to(V{i}, {x}s, o{i})")
            binds.append(f"V{i}.copy_({x})")
            copied.append(info.nbytes if info.dynamism == "static" else f"{x}.nbytes")
        else:
            # an alias of its own: a program that resizes the slot (an out= kernel writing
            # a larger result) changes the alias, never the caller's tensor
            binds.append(f"v[{spec.slot}] = {x}.detach()")
            restored.append((spec.slot, "None"))
        actions.append(action.value)
    direction = "h2h" if all(s.device.is_cpu for s in state.inputs) else None
    if direction is None and copied:
        return None  # planned inputs on a device: counted per call by the general path
    total = " + ".join(str(c) for c in copied) or "0"
    env["ACTIONS"] = actions
    env["NO_OUT"] = [""] * len(state.outputs)
    code.add("def _fast(inputs):")
    with code.indented():
        code.add(f"if len(inputs) != {n}: return NOT_FAST")
        if n:
            code.add(", ".join(f"x{i}" for i in range(n)) + ", = inputs")
        if checks:  # a tensor torch cannot describe (a nested one, say): the general path says so
            code.add("try:")
            with code.indented():
                code.add("\n".join(checks))
            code.add("except Exception:")
            code.add("    return NOT_FAST")
        code.add(f"rec.h2h = {total}")
        code.add("rec.h2d = rec.d2h = rec.d2d = 0")
        code.add("rec.inputs[:] = ACTIONS")
        code.add("rec.outputs[:] = NO_OUT")
        code.add("try:")
        with code.indented():
            code.add("\n".join(binds))
            if not _run_into(code, state, runner):
                return None
            outs = []

            def refuse(k: int) -> None:
                error = output_error(state, k)
                if error is not None:
                    raise error

            env["_refuse"] = refuse
            # slots whose tensor the runner guarantees (written in place only): unchecked
            fixed: frozenset[int] = getattr(runner, "fixed_outputs", frozenset())
            for out in state.outputs:
                x = f"v[{out.slot}]"
                if out.kind == "tensor" and out.slot not in fixed:
                    # what execution left there is what the program declares
                    code.add("\n".join(output_checks(state, out.index, x, "_refuse", env)))
                outs.append(f"{x}.clone()" if out.kind == "tensor" and copy_outputs else x)
            tensors = all(out.kind == "tensor" for out in state.outputs)
            if copy_outputs and tensors and len(outs) > 1 and _CLONE_ALL is not None:
                # one call for every copy (torch's own loop: a Python call per output
                # costs about as much as a small copy)
                env["_clone_all"] = _CLONE_ALL
                code.add(
                    f"return list(_clone_all([{', '.join(o[: -len('.clone()')] for o in outs)}]))"
                )
            else:
                code.add(f"return [{', '.join(outs)}]")
        code.add("finally:")
        with code.indented():
            code.add("\n".join(f"v[{slot}] = {held}" for slot, held in restored))
            code.add("pass")
    return code.compile(state.sources, "call")["_fast"]


def _apart(state: MethodState, i: int) -> tuple[str, str]:
    """(the line that reads input ``i``'s address range, the `` and ...`` conditions) that
    the dense tensor ``x{i}`` shares no byte with the method's planned buffers on its
    device (a view of an earlier call's output, say, which the run may overwrite while it
    reads it) nor with another tensor input of the call on that device (one the program
    may write): only then may the caller's tensor stand in for the planned view. The
    buffers' address ranges are fixed at load (their memory never moves or grows)."""
    spec = state.inputs[i]
    device = spec.device.to_torch()
    ranges = [
        (b.data.data_ptr(), b.data.data_ptr() + b.data.nbytes)
        for b in state.buffers
        if b.data.nbytes and b.data.device == device
    ]
    others = [
        s.index
        for s in state.inputs
        if s.index != i and s.kind == "tensor" and s.device == spec.device
    ]
    if not ranges and not others:
        return "", ""
    p, q = f"p{i}", f"q{i}"
    conds = [f"({q} <= {start} or {p} >= {end})" for start, end in ranges]
    conds += [f"({q} <= x{j}.data_ptr() or {p} >= x{j}.data_ptr() + x{j}.nbytes)" for j in others]
    return f"{p} = x{i}.data_ptr(); {q} = {p} + x{i}.nbytes", "".join(f" and {c}" for c in conds)


def _run_into(code: Code, state: MethodState, runner: Runner) -> bool:
    """Add the lines that run the method's instructions: inlined when the runner is the
    plain blocks of one straight-line chain, else a call of the runner (control flow, the
    instruction limit, its own error reports). False: the fast path cannot run them."""
    guard = below_autograd_for(state)
    with contextlib.ExitStack() as stack:
        if guard is not None:
            code.env["_below"] = guard
            code.add("with _below():")
            stack.enter_context(code.indented())
        statements = inline_statements(state, runner)
        if statements is not None:
            if len(statements) > state.max_instructions:
                return False
            env = code.env
            for k, st in enumerate(statements):
                code.add(st.code, k)
                if st.env:
                    env.update(st.env)
            code.add("pass")
        else:
            code.env["_run"] = runner.run
            code.add("_run(v)")
    return True


def inline_statements(state: MethodState, runner: Runner) -> Sequence[Statement] | None:
    """The statements to inline for ``runner``: the plain blocks' one straight-line chain,
    or what a runner offers as its ``inline()`` (the compiled tier's chain, each region
    one call); None: call its ``run``."""
    if isinstance(runner, BlockRunner):
        return state.chains[0].statements if runner.straight_line else None
    offer = getattr(runner, "inline", None)
    return offer() if offer is not None else None
