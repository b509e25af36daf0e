"""A method's instructions as functional torch code: what each one computes, with no memory.

The interpreter runs an instruction by writing into the memory the plan gave its outputs
(``torch.add(a, b, out=v[7])``). To compile a run of instructions, the same computation is
needed as a function of values: ``v7 = torch.add(a, b)``. :class:`FunctionalForms` gives
it, one instruction at a time, on an :class:`~.env.Env` (value index -> the traced tensor,
symbolic integer or Python value it holds), so that tracing a run of instructions with
``torch.export`` yields a functional graph. This module translates; the computations are
the kernels' and torch's own:

- ATen out variants call the functional overload of the same operator whose arguments
  are the out variant's others (:mod:`.overloads`: ``add.out`` -> ``add.Tensor``; factory
  ops such as ``full.out`` get the out tensor's dtype and device); a result of another
  dtype than the program's out tensor is converted to it, as writing into the out tensor
  would. In-place ATen ops (``copy_``) call their functional form and the result replaces
  the value;
- ``executorch_prim::`` scalar ops and ``sym_size``/``sym_numel`` run the interpreter's own
  bodies (:data:`ptexec.kernels.prim.PRIM_OPS`, their traced form) on the (possibly
  symbolic) values; ``sym_stride`` reads the program's dim order;
- ``dim_order_ops::`` copies convert the dtype (the layout is the memory's business, kept
  when a value is written back); ``et_view`` is a reshape; ``et_copy`` a device move;
- ``quantized_decomposed::`` and ``llama::`` ops call their kernel's own function
  (:data:`ptexec.kernels.fixed_args.SIGNATURES`) in its traced form: it leaves out the
  checks that read data and masks what it slices on the host; an op that updates a cache
  in place updates the value it is given (a compiled region's state is then written in
  place) or a copy;
- an XNNPACK or Vulkan delegate runs the torch code its payload was compiled to
  (:mod:`.delegate_code`), except an XNNPACK delegate the method runs with ExecuTorch's
  XNNPACK backend (``xnnpack="auto"`` with ExecuTorch installed, or ``"executorch"``):
  that one is a single opaque call, ``ptexec::external_call`` (:mod:`.external`), which
  keeps XNNPACK's kernels.

:meth:`FunctionalForms.reason` says why an instruction has no functional form (then it is
interpreted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..delegates.xnnpack import schema as s
from ..delegates.xnnpack.node_types import quantizes_activations
from ..delegates.xnnpack.schema import decode_payload
from ..dtypes import CODE_TO_DTYPE
from ..format import program as p
from ..kernels.aten import resolve_overload
from ..kernels.fixed_args import SIGNATURES, Signature, to_dtype
from ..kernels.prim import PRIM_OPS
from ..tensor import dim_order_strides
from .delegate_code import DelegateCode
from .env import Env, NoFunctionalForm
from .external import ExternalCall, external_call, register, worth_a_call
from .overloads import call_overload, functional_overload, view_overload, writes

if TYPE_CHECKING:
    from ..loader.state import MethodState
    from ..program import Program

__all__ = ["Env", "FunctionalForms", "NoFunctionalForm"]


def _shares_memory(t: Any, m: torch.Tensor) -> bool:
    """``t`` is another view of ``m``'s memory (as traced)."""
    if not isinstance(t, torch.Tensor) or t is m:
        return False
    base = t._base if t._base is not None else t
    mbase = m._base if m._base is not None else m
    return base is mbase


_STRIDE = "aten::sym_stride.int"  # from the program's dim order: a traced tensor has no memory
_ET_VIEW = ("executorch_prim::et_view.default", "executorch_prim::et_view")
_DIM_ORDER_COPY = ("dim_order_ops::_to_dim_order_copy.out", "dim_order_ops::_clone_dim_order.out")
_DEVICE_COPY = ("et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out")
_SQUEEZES = ("aten::squeeze_copy.out", "aten::squeeze_copy.dim_out", "aten::squeeze_copy.dims_out")
EXTERNAL = "runs with XNNPACK's kernels (ExecuTorch's XNNPACK backend), between compiled regions"


class FunctionalForms:
    """Functional forms of the instructions of one loaded method (module docstring)."""

    def __init__(self, state: MethodState, program: Program, device: torch.device) -> None:
        self.state = state
        self.plan = state.plan
        self.program = program
        self.device = device
        self._delegates: dict[tuple[int, int], DelegateCode] = {}
        self._externals: dict[tuple[int, int], ExternalCall] = {}
        self._external_how: dict[tuple[int, int], str] = {}
        self._register_externals()

    # -- which instructions have one -------------------------------------------------------
    def reason(self, chain: int, i: int) -> str | None:
        """Why instruction ``i`` of ``chain`` has no functional form, or None when it has."""
        ins = self.state.chains[chain].instructions[i]
        name = self.state.chains[chain].names[i]
        if isinstance(ins, p.JumpFalseCall):
            return "control flow"
        if isinstance(ins, p.MoveCall | p.FreeCall):
            return None
        if isinstance(ins, p.DelegateCall):
            delegate = self.plan.delegates[ins.delegate_index]
            if delegate.id not in ("XnnpackBackend", "VulkanBackend"):
                return f"delegate '{delegate.id}' has no functional form"
            if self._external_how.get((chain, i)) == "between":
                return EXTERNAL
            return None
        assert isinstance(ins, p.KernelCall)
        if name in PRIM_OPS or name == _STRIDE or name in _ET_VIEW:
            return None
        if name in _DIM_ORDER_COPY or name == "dim_order_ops::_empty_dim_order.out":
            return None
        if name in _DEVICE_COPY:
            return "copies between devices"
        if name.startswith("executorch_prim::et_copy_index"):
            return "grows its output row by row (map/scan)"
        if name in SIGNATURES:
            return None
        if name in _SQUEEZES and self._squeezes_a_dynamic_size(ins):
            return "squeezes a dimension of dynamic size (at size 1 it removes it, which traced code does not)"
        form = functional_overload(name)
        if form is None:
            return f"{name} has no functional overload in torch"
        overload = form[0]
        if torch.Tag.nondeterministic_seeded in getattr(overload, "tags", ()):
            return f"{name} draws random numbers"
        return None

    def _squeezes_a_dynamic_size(self, ins: p.KernelCall) -> bool:
        """Whether a squeeze may meet a dimension of size 1 its program was not exported
        with: one of a dynamic tensor whose bound is more than 1. A size is traced as
        possibly any (size-obliviously), so the graph never removes it and its code would
        return the dimension where ATen drops it (the program's rank then fails the call)."""
        x = self.plan.values[ins.args[0]]
        if not isinstance(x, p.Tensor) or x.shape_dynamism == p.STATIC:
            return False
        rank = len(x.sizes)
        dims: list[int] = list(range(rank))  # squeeze_copy.out: every dimension
        if len(ins.args) > 2 and rank:  # dim_out, dims_out: (self, dim or dims, out)
            d = self.plan.values[ins.args[1]]
            given: list[p.EValue] | None = [d] if isinstance(d, p.Int) else None
            if isinstance(d, p.IntList):
                given = [self.plan.values[k] for k in d.items]
            if given is None or not all(isinstance(v, p.Int) for v in given):
                return True
            dims = [v.value % rank for v in given if isinstance(v, p.Int)]
        return any(x.sizes[k] > 1 for k in dims)

    def external(self, chain: int, i: int) -> bool:
        """Instruction ``i`` of ``chain`` is a delegate call a library outside torch runs
        (ExecuTorch's XNNPACK backend, as the method was loaded): it keeps that library's
        kernels as one opaque call of the compiled graph (:mod:`.external`) where they pay
        for the call (:func:`.external.worth_a_call`), runs between compiled regions when
        it cannot be one, and is otherwise traced as ptexec's torch code."""
        return self.state.chains[chain].loaded[i].external is not None

    def opaque(self, chain: int, i: int) -> bool:
        """Instruction ``i`` of ``chain`` is an opaque call of the compiled graph."""
        return (chain, i) in self._externals

    def externals(self) -> list[tuple[int, int, str]]:
        """Every (chain, instruction, how) :meth:`external` holds for (``how``: ``"call"``
        in the graph, ``"traced"`` as torch code, or ``"between"`` regions): what the
        compiled code of the method depends on besides its program and options (the
        cache's key)."""
        return [(c, i, how) for (c, i), how in sorted(self._external_how.items())]

    def external_calls(self) -> list[ExternalCall]:
        """The opaque calls of the method's compiled graphs: whoever runs the compiled
        code keeps them (the registry holds them weakly)."""
        return list(self._externals.values())

    def external_places(self) -> list[tuple[tuple[int, int], ExternalCall]]:
        """:meth:`external_calls`, each with its place: (chain, instruction)."""
        return list(self._externals.items())

    def _register_externals(self) -> None:
        payloads: dict[tuple[int, int], tuple[s.XnnPayload, Any, p.DelegateCall]] = {}
        for c, chain in enumerate(self.state.chains):
            for i, st in enumerate(chain.loaded):
                ins = chain.instructions[i]
                if st.external is None or not isinstance(ins, p.DelegateCall):
                    continue
                delegate = self.plan.delegates[ins.delegate_index]
                where = f"{self.plan.name}.delegates[{ins.delegate_index}].payload"
                payload = decode_payload(self.program.pte.delegate_data(delegate.processed), where)
                payloads[(c, i)] = (payload, st.external, ins)
        # XNNPACK's own results where the method rounds activations to int8 steps
        exact = any(quantizes_activations(q) for q, _, _ in payloads.values())
        for (c, i), (payload, runner, ins) in payloads.items():
            if not worth_a_call(payload, exact, alone=len(payloads) == 1):
                self._external_how[(c, i)] = "traced"
                continue
            call = ExternalCall.of(runner, self.plan.values, ins.args, (c, i))
            if call is None:
                self._external_how[(c, i)] = "between"
                continue
            register(call)
            self._externals[(c, i)] = call
            self._external_how[(c, i)] = "call"

    def ignored(self, chain: int, i: int) -> frozenset[int]:
        """Arguments of instruction ``i`` its functional form never reads (the placeholder
        ``out`` of a kernel that only updates a cache in place, say)."""
        ins = self.state.chains[chain].instructions[i]
        if not isinstance(ins, p.KernelCall):
            return frozenset()
        sig = SIGNATURES.get(self.state.chains[chain].names[i])
        if sig is not None:
            return frozenset(ins.args[len(sig.params) :])
        return frozenset()

    def prepare(self, chain: int, i: int) -> None:
        """Build what instruction ``i`` needs at trace time (a delegate's torch code, with
        its weights): before tracing, where it deals with real tensors."""
        ins = self.state.chains[chain].instructions[i]
        if not isinstance(ins, p.DelegateCall):
            return
        call = self._externals.get((chain, i))
        if call is None:
            self._delegate_code(chain, i, ins)
        elif any(o.dynamic for o in call.outputs) and call.shapes is None:
            # the symbolic shapes of dynamic outputs: ptexec's torch code, traced only
            code = DelegateCode.build(self.plan, self.program, ins, self.device)
            positions = call.inputs
            outs = [o.position for o in call.outputs]

            def shapes(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
                given = dict(zip(positions, inputs, strict=True))
                computed = code.outputs(given.__getitem__)
                return [computed[k] for k in outs]

            call.shapes = shapes

    # -- running one instruction ------------------------------------------------------------
    def step(self, env: Env, chain: int, i: int) -> None:
        """Run instruction ``i`` of ``chain`` on ``env``: its results replace the values it writes."""
        ins = self.state.chains[chain].instructions[i]
        name = self.state.chains[chain].names[i]
        if isinstance(ins, p.MoveCall):
            env[ins.move_to] = env[ins.move_from]
            return
        if isinstance(ins, p.FreeCall):
            return
        if isinstance(ins, p.DelegateCall):
            self._delegate(env, chain, i, ins)
            return
        assert isinstance(ins, p.KernelCall)
        args = ins.args
        prim = PRIM_OPS.get(name)
        if prim is not None:
            if len(args) != prim.arity + 1:
                raise NoFunctionalForm(f"{name}: expected {prim.arity + 1} values, got {len(args)}")
            *operands, out = args
            env[out] = prim.traced(*(self.read(env, a) for a in operands))
            return
        if name == _STRIDE:
            x, dim, out = args
            t, d = self.read(env, x), self.read(env, dim)
            value = self.plan.values[x]
            order = value.dim_order if isinstance(value, p.Tensor) else range(t.dim())
            env[out] = dim_order_strides(t.shape, order)[d]
            return
        if name in _ET_VIEW:
            src, sizes, out = args
            env[out] = self.read(env, src).reshape(self.read(env, sizes))
            return
        if name in _DIM_ORDER_COPY:
            src, out = args[0], args[3]
            env[out] = self._cast(self.read(env, src), out)
            return
        if name == "dim_order_ops::_empty_dim_order.out":
            size, out = args[0], args[2]
            env[out] = torch.empty(
                list(self.read(env, size)), dtype=self._dtype(out), device=self.device
            )
            return
        sig = SIGNATURES.get(name)
        if sig is not None:
            self._custom(env, args, sig)
            return
        self._aten(env, name, args)

    # -- reading values -------------------------------------------------------------------
    def read(self, env: Env, j: int) -> Any:
        """Value ``j`` as an argument: lists element by element, None for Null."""
        value = self.plan.values[j]
        if isinstance(value, p.Null):
            return None
        if isinstance(value, p.IntList):
            return [env[k] for k in value.items]
        if isinstance(value, p.TensorList):
            return [env[k] for k in value.items]
        if isinstance(value, p.OptionalTensorList):
            return [
                None if k < 0 or isinstance(self.plan.values[k], p.Null) else env[k]
                for k in value.items
            ]
        if isinstance(value, p.DoubleList | p.BoolList):
            return list(value.items)
        return env[j]

    def _dtype(self, j: int) -> torch.dtype:
        value = self.plan.values[j]
        assert isinstance(value, p.Tensor)
        return CODE_TO_DTYPE[value.scalar_type]

    def _cast(self, x: torch.Tensor, out: int) -> torch.Tensor:
        """``x`` as value ``out`` holds it (its dtype: writing into it converts)."""
        value = self.plan.values[out]
        if isinstance(value, p.Tensor) and isinstance(x, torch.Tensor):
            dtype = CODE_TO_DTYPE.get(value.scalar_type)
            if dtype is not None and x.dtype != dtype:
                return x.to(dtype)
        return x

    def _store(self, env: Env, out: int, x: Any) -> None:
        value = self.plan.values[out]
        if isinstance(value, p.TensorList):
            for k, item in zip(value.items, x, strict=True):
                env[k] = self._cast(item, k)
        else:
            env[out] = self._cast(x, out)

    # -- ATen ------------------------------------------------------------------------------
    def _aten(self, env: Env, name: str, args: tuple[int, ...]) -> None:
        form = functional_overload(name)
        overload = resolve_overload(name)
        if form is None or overload is None:
            raise NoFunctionalForm(f"{name} has no functional overload in torch")
        functional, kind = form
        arguments = list(overload._schema.arguments)
        nargs = len(arguments)
        values = [self.read(env, a) for a in args[:nargs]]
        rets = args[nargs:]
        if kind == "functional":
            result = call_overload(functional, arguments, values)
            self._returns(env, rets, result)
            return
        if kind == "inplace":
            result = call_overload(functional, arguments, values)
            mutated = [args[k] for k, a in enumerate(arguments) if writes(a)]
            for m in mutated:
                env[m] = self._cast(result, m)
            for r in rets:
                env[r] = env[mutated[0]]
            return
        outs = [k for k, a in enumerate(arguments) if writes(a)]
        inputs = [
            (a, x) for k, (a, x) in enumerate(zip(arguments, values, strict=True)) if k not in outs
        ]
        extra: dict[str, Any] = {}
        names = {a.name for a in functional._schema.arguments}
        first_out = args[outs[0]]
        out_value = self.plan.values[first_out]
        given = {a.name for a, _ in inputs}
        if "dtype" in names and "dtype" not in given and isinstance(out_value, p.Tensor):
            extra["dtype"] = self._dtype(first_out)
        if "device" in names and "device" not in given:
            extra["device"] = self.device
        view = view_overload(functional)
        if view is not None:
            functional = view
        result = call_overload(functional, [a for a, _ in inputs], [x for _, x in inputs], extra)
        results = result if isinstance(result, tuple) else (result,)
        if len(outs) == 1 and len(results) == 1:
            self._store(env, args[outs[0]], results[0])
        else:
            for k, r in zip(outs, results, strict=True):
                self._store(env, args[k], r)
        for r, k in zip(rets, outs, strict=False):
            if r != args[k]:
                env[r] = env[args[k]] if not isinstance(self.plan.values[r], p.TensorList) else None

    def _returns(self, env: Env, rets: tuple[int, ...], result: Any) -> None:
        if not rets:
            return
        if len(rets) == 1 and not isinstance(self.plan.values[rets[0]], p.TensorList):
            env[rets[0]] = result
            return
        value = self.plan.values[rets[0]]
        if isinstance(value, p.TensorList):
            for k, r in zip(value.items, result, strict=True):
                env[k] = r
            return
        for k, r in zip(rets, result, strict=True):
            env[k] = r

    # -- custom ops (quantized, LLM) --------------------------------------------------------
    def _custom(self, env: Env, args: tuple[int, ...], sig: Signature) -> None:
        params = len(sig.params)
        if len(args) < params + max(sig.outs, 1):
            raise NoFunctionalForm(f"expected {params} arguments and the outs, got {len(args)}")
        rendered = [self.read(env, a) for a in args[:params]]
        for k in sig.dtype_positions:
            if rendered[k] is not None:
                rendered[k] = to_dtype(rendered[k])
        for k in sig.mutated_positions:
            if id(rendered[k]) in env.frozen:  # update a copy: the region writes it back
                rendered[k] = rendered[k].clone()
            else:  # views taken of it before keep what they saw (the interpreter copied)
                target = rendered[k]
                for j, x in list(env.values.items()):
                    if _shares_memory(x, target):
                        env[j] = x.clone()
        result = sig.traced(*rendered)
        for k in sig.mutated_positions:
            env[args[k]] = rendered[k]
        if sig.outs == 0:
            return
        outs = args[params : params + sig.outs]
        results = result if sig.outs > 1 else (result,)
        for slot, r in zip(outs, results, strict=True):
            env[slot] = self._cast(r, slot)

    # -- XNNPACK --------------------------------------------------------------------------
    def _delegate_code(self, chain: int, i: int, ins: p.DelegateCall) -> DelegateCode:
        key = (chain, i)
        found = self._delegates.get(key)
        if found is None:
            found = DelegateCode.build(self.plan, self.program, ins, self.device)
            self._delegates[key] = found
        return found

    def _delegate(self, env: Env, chain: int, i: int, ins: p.DelegateCall) -> None:
        call = self._externals.get((chain, i))
        if call is None:
            self._delegate_code(chain, i, ins).run(env, ins, self._cast)
            return
        outs = external_call(call.key, [env[ins.args[k]] for k in call.inputs])
        for o, x in zip(call.outputs, outs, strict=True):
            slot = ins.args[o.position]
            env[slot] = self._cast(x, slot)


# the names the compiled tier's other modules know these by
