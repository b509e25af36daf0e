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
"""

from __future__ import annotations

from typing import Any

import torch

from ..loader.state import MethodState
from ..memory import resize_to
from ..tensor import TensorInfo
from .arguments import output_error
from .runner import BlockRunner, Runner, below_autograd_for

__all__ = ["NOT_FAST", "build_fast_call"]


class _NotFast:
    def __repr__(self) -> str:
        return "NOT_FAST"


NOT_FAST: Any = _NotFast()


def build_fast_call(state: MethodState, runner: Runner, copy_outputs: bool) -> Any:
    """The function for the common calls of the method (it takes the list of inputs), or
    None when its calls always need the general path (options other than the defaults are
    the caller's to rule out). ``copy_outputs``: the outputs are returned as copies."""
    if not runner.direct_outputs:
        return None  # a runner that binds inputs itself (a CUDA graph): the general path
    env: dict[str, Any] = {
        "NOT_FAST": NOT_FAST,
        "Tensor": torch.Tensor,
        "strided": torch.strided,
        "v": state.values,
        "rec": state.record,
        "resize_to": resize_to,
    }
    checks: list[str] = []
    binds: list[str] = []
    actions: list[str] = []
    copied = []  # (static nbytes | expression) per planned input
    shared: list[int] = []
    n = len(state.inputs)
    for spec in state.inputs:
        i = spec.index
        x = f"x{i}"
        if spec.kind != "tensor":
            env[f"w{i}"] = spec.scalar
            if spec.kind == "int":
                checks.append(f"if type({x}) is not int or {x} != w{i}: return NOT_FAST")
            elif spec.kind == "bool":
                checks.append(f"if {x} is not w{i}: return NOT_FAST")
            elif spec.kind == "none":
                checks.append(f"if {x} is not None: return NOT_FAST")
            elif spec.kind == "str":
                checks.append(f"if type({x}) is not str or {x} != w{i}: return NOT_FAST")
            else:  # float: within ExecuTorch's tolerance of the traced value
                tol = 1e-4 + 1e-5 * abs(float(spec.scalar))
                checks.append(
                    f"if type({x}) is not float or not abs({x} - w{i}) <= {tol!r}: return NOT_FAST"
                )
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
        identity = spec.dim_order == tuple(range(len(spec.dim_order)))
        if info.dynamism == "static":
            if 0 in info.sizes:
                return None  # empty inputs bind as EMPTY: the general path
            env[f"s{i}"] = torch.Size(info.sizes)
            checks.append(f"if {x}.shape != s{i}: return NOT_FAST")
        elif info.dynamism == "dynamic_bound":
            bound = info.sizes
            dims = " or ".join(f"not 0 < {x}s[{d}] <= {b}" for d, b in enumerate(bound))
            checks.append(f"{x}s = {x}.shape")
            checks.append(
                f"if len({x}s) != {len(bound)}"
                + (f" or {dims}" if dims else "")
                + ": return NOT_FAST"
            )
        else:
            return None  # unbounded inputs: the general path
        if spec.view is not None:
            env[f"V{i}"] = spec.view
            env[f"o{i}"] = spec.dim_order
            if info.dynamism != "static":
                binds.append(f"if V{i}.shape != {x}s: resize_to(V{i}, {x}s, o{i})")
            binds.append(f"V{i}.copy_({x})")
            copied.append(info.nbytes if info.dynamism == "static" else f"{x}.nbytes")
            actions.append("copy")
        else:
            if not identity:
                return None  # other layouts: the general path decides
            checks.append(f"if not {x}.is_contiguous(): return NOT_FAST")
            binds.append(f"v[{spec.slot}] = {x}.detach()")
            shared.append(spec.slot)
            actions.append("share")
    direction = "h2h" if all(s.device.is_cpu for s in state.inputs) else None
    if direction is None and copied:
        return None  # planned inputs on a device: counted per call by the general path
    total = " + ".join(str(c) for c in copied) or "0"
    env["ACTIONS"] = actions
    env["NO_OUT"] = [""] * len(state.outputs)
    lines = ["def _fast(inputs):"]
    lines.append(f"    if len(inputs) != {n}: return NOT_FAST")
    if n:
        lines.append("    " + ", ".join(f"x{i}" for i in range(n)) + ", = inputs")
    if checks:  # a tensor torch cannot describe (a nested one, say): the general path says so
        lines.append("    try:")
        lines.extend("        " + c for c in checks)
        lines.append("    except Exception:")
        lines.append("        return NOT_FAST")
    lines.extend("    " + b for b in binds)
    lines.append(f"    rec.h2h = {total}")
    lines.append("    rec.h2d = rec.d2h = rec.d2d = 0")
    lines.append("    rec.inputs[:] = ACTIONS")
    lines.append("    rec.outputs[:] = NO_OUT")
    line_map: dict[int, int] = {}
    lines.append("    try:")
    pad = "        "
    guard = below_autograd_for(state)
    if guard is not None:
        env["_below"] = guard
        lines.append("        with _below():")
        pad += "    "
    if isinstance(runner, BlockRunner) and runner.straight_line:
        chain = state.chains[0]
        if len(chain.instructions) > state.max_instructions:
            return None
        for k, st in enumerate(chain.statements):  # straight-line: the instructions, inline
            for part in st.code.splitlines():
                line_map[len(lines) + 1] = k
                lines.append(pad + part)
            env.update(st.env)
        lines.append(pad + "pass")
    else:  # the runner: control flow, the instruction limit, its own error reports
        env["_run"] = runner.run
        lines.append(pad + "_run(v)")
    outs = []

    def refuse(k: int) -> None:
        error = output_error(state, k)
        if error is not None:
            raise error

    env["_refuse"] = refuse
    for out in state.outputs:
        if out.kind == "tensor":  # what execution left there is what the program declares
            declared = out.info
            x = f"v[{out.slot}]"
            if isinstance(declared, TensorInfo) and declared.dynamism == "static":
                env[f"O{out.index}"] = torch.Size(declared.sizes)
                env[f"T{out.index}"] = declared.dtype
                test = (
                    f"type({x}) is not Tensor or {x}.shape != O{out.index} "
                    f"or {x}.dtype is not T{out.index}"
                )
                lines.append(f"        if {test}: _refuse({out.index})")
            elif isinstance(declared, TensorInfo):  # a bound (or none) on each dim, inline
                env[f"T{out.index}"] = declared.dtype
                rank = len(declared.sizes)
                test = f"type({x}) is not Tensor or {x}.dtype is not T{out.index} or {x}.dim() != {rank}"
                if declared.dynamism == "dynamic_bound" and rank:
                    dims = " and ".join(
                        f"{x}.shape[{d}] <= {b}" for d, b in enumerate(declared.sizes)
                    )
                    test += f" or not ({dims})"
                lines.append(f"        if {test}: _refuse({out.index})")
        if out.kind == "tensor" and copy_outputs:
            outs.append(f"v[{out.slot}].clone()")
        else:
            outs.append(f"v[{out.slot}]")
    lines.append(f"        return [{', '.join(outs)}]")
    lines.append("    finally:")
    lines.extend(f"        v[{slot}] = None" for slot in shared)
    lines.append("        pass")
    namespace = state.sources.compile("\n".join(lines) + "\n", "call", env, lines=line_map)
    return namespace["_fast"]
