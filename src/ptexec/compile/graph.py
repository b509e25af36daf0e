"""One region as an exported torch graph, and the checks its compiled code needs.

:func:`export_region` traces a region's instructions through their functional forms
(:class:`~.functional.FunctionalForms`) with ``torch.export``. The graph takes the region's
:attr:`~.regions.Region.graph_inputs` (tensors as the values table holds them, in the
program's dim order, at their upper bounds for a dynamic shape; scalars as 0-d tensors),
writes its ``inplace`` values into their input tensors and returns its ``copy`` and
``replace`` values (scalars as 0-d tensors), and a copy of each ``returned`` one (an output
it wrote in place). The method's constants are buffers of the
traced module, so that the compiled code embeds them.

A dynamic dimension is traced as an automatic dimension bounded by the program
(``Dim.AUTO(min=0, max=bound)``): ``torch.export`` keeps it symbolic where it can and
specializes it where the computation requires a size. The compiled code is then valid only
for the sizes the exported graph allows; :class:`Guard` says which (a dimension fixed to
a value, a range, dimensions that must be equal, a size computed from others), and a call
outside them runs the region interpreted (it gets the interpreter's result or error).
An empty dimension is outside them: AOTInductor's kernels are not made for no elements
(its CPU matrix product divides by the row count, and a maximum over none is -inf where
ATen raises). That holds for the graph's own sizes too: a size computed from the inputs'
(``x[1:]``: one less; ``x[:, 2:]``: ``max(0, w - min(2, w))``) that may be 0 within the
inputs' ranges gets a guard that it is at least 1 (a ``.pte`` keeps only upper bounds, so
an input the export said had 3 rows or more may come with 1). Where such a size has a form
no guard holds (``x[: n // m]``: a division by another size), no call could be kept from
the compiled code when it is empty, so the region is not compiled (it runs interpreted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from ..dtypes import CODE_TO_DTYPE
from ..errors import CacheEntryError
from ..format import program as p
from ..tensor import dim_order_strides
from .functional import Env, FunctionalForms
from .quiet import quiet

if TYPE_CHECKING:
    from .regions import Branch, Region

__all__ = ["BinOp", "Guard", "GuardError", "Size", "export_region", "scalar_kind"]


@dataclass(frozen=True)
class Size:
    """The size of graph input ``k``'s dimension ``d`` (in a guard's expression)."""

    k: int
    d: int


@dataclass(frozen=True)
class BinOp:
    """``left op right`` over sizes and integers; ``op`` one of :data:`OPERATORS` (``max``
    and ``min`` are the larger and the smaller of the two)."""

    op: str
    left: SizeExpr
    right: SizeExpr


SizeExpr: TypeAlias = int | Size | BinOp
OPERATORS = ("+", "-", "*", "//", "%", "max", "min")
GUARD_KINDS = ("eq", "range", "same", "expr", "positive")
_MAX_NODES = 256  # an expression a guard may hold (derived ones have a handful)
_FIELDS = {
    "eq": {"kind", "k", "d", "value"},
    "range": {"kind", "k", "d", "lo", "hi"},
    "same": {"kind", "k", "d", "k2", "d2"},
    "expr": {"kind", "k", "d", "expr"},
    "positive": {"kind", "k", "d", "expr"},
}


class GuardError(CacheEntryError):
    """A stored guard that is not one :class:`Guard` writes (what, and where in it)."""


def _int(value: Any, what: str, lo: int | None = 0) -> int:
    if type(value) is not int:  # a bool is not a size
        raise GuardError(f"{what} must be an int, not {type(value).__name__}")
    if lo is not None and value < lo:
        raise GuardError(f"{what} must be at least {lo}, not {value}")
    return value


@dataclass(frozen=True)
class Guard:
    """A check on the sizes of a region's graph inputs (module docstring): ``kind`` is
    ``"eq"`` (input ``k`` dim ``d`` equals ``value``), ``"range"`` (``lo <= size <= hi``,
    ``hi`` -1 for no upper bound), ``"same"`` (equals input ``k2`` dim ``d2``) or
    ``"expr"`` (equals ``expr``, integers and other inputs' sizes under ``+ - * // %``,
    ``max`` and ``min``)
    or ``"positive"`` (``expr``, a size of the graph computed from the inputs', is at least
    1; ``k`` and ``d`` name the first input size it reads).

    A guard becomes Python source (:meth:`code`) that runs on every call, so it is data
    with fixed types: :meth:`from_json` accepts exactly what :meth:`to_json` writes, and
    :meth:`check` that every size it names exists."""

    kind: str
    k: int
    d: int
    value: int = 0
    lo: int = 0
    hi: int = -1
    k2: int = 0
    d2: int = 0
    expr: SizeExpr = 0

    def code(self, name: str = "x") -> str:
        """The check as a Python expression over the inputs ``{name}0``, ``{name}1``, ..."""
        size = f"{name}{self.k}.shape[{self.d}]"
        if self.kind == "eq":
            return f"{size} == {int(self.value)}"
        if self.kind == "range":
            text = f"{int(self.lo)} <= {size}"
            return text + (f" <= {int(self.hi)}" if self.hi >= 0 else "")
        if self.kind == "same":
            return f"{size} == {name}{int(self.k2)}.shape[{int(self.d2)}]"
        if self.kind == "expr":
            return f"{size} == {_code(self.expr, name)}"
        if self.kind == "positive":
            return f"{_code(self.expr, name)} >= 1"
        raise GuardError(f"unknown guard kind {self.kind!r}")

    def sizes(self) -> list[Size]:
        """Every input size the guard reads."""
        out = [Size(self.k, self.d)]
        if self.kind == "same":
            out.append(Size(self.k2, self.d2))
        elif self.kind in ("expr", "positive"):
            out.extend(_refs(self.expr))
        return out

    def check(self, ranks: Sequence[int | None]) -> None:
        """Raise :class:`GuardError` unless every size it reads is a dimension of a tensor
        input (``ranks``: each graph input's rank, None for a scalar)."""
        for s in self.sizes():
            if s.k >= len(ranks) or ranks[s.k] is None:
                raise GuardError(f"guard on x{self.k}: input {s.k} is not a tensor input")
            rank = ranks[s.k]
            assert rank is not None
            if s.d >= rank:
                raise GuardError(f"guard on x{self.k}: input {s.k} has no dimension {s.d}")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "k": self.k, "d": self.d}
        if self.kind == "eq":
            data["value"] = self.value
        elif self.kind == "range":
            data.update(lo=self.lo, hi=self.hi)
        elif self.kind == "same":
            data.update(k2=self.k2, d2=self.d2)
        else:
            data["expr"] = _expr_json(self.expr)
        return data

    @staticmethod
    def from_json(data: Any) -> Guard:
        """The guard ``data`` describes, validated (:class:`GuardError` otherwise)."""
        if not isinstance(data, dict):
            raise GuardError(f"a guard must be an object, not {type(data).__name__}")
        kind = data.get("kind")
        if not isinstance(kind, str) or kind not in GUARD_KINDS:
            raise GuardError(f"guard kind must be one of {', '.join(GUARD_KINDS)}, not {kind!r}")
        if set(data) != _FIELDS[kind]:
            raise GuardError(
                f"a {kind!r} guard has the fields {sorted(_FIELDS[kind])}, not {sorted(data)}"
            )
        k, d = _int(data["k"], "guard k"), _int(data["d"], "guard d")
        if kind == "eq":
            return Guard(kind, k, d, value=_int(data["value"], "guard value"))
        if kind == "range":
            lo, hi = _int(data["lo"], "guard lo", None), _int(data["hi"], "guard hi", -1)
            return Guard(kind, k, d, lo=lo, hi=hi)
        if kind == "same":
            return Guard(
                kind, k, d, k2=_int(data["k2"], "guard k2"), d2=_int(data["d2"], "guard d2")
            )
        budget = [_MAX_NODES]
        return Guard(kind, k, d, expr=_expr_from_json(data["expr"], budget))


def _code(e: SizeExpr, name: str = "x") -> str:
    if isinstance(e, Size):
        return f"{name}{int(e.k)}.shape[{int(e.d)}]"
    if isinstance(e, BinOp):
        if e.op not in OPERATORS:
            raise GuardError(f"unknown operator {e.op!r}")
        if e.op in _CHOICES:
            return f"{e.op}({_code(e.left, name)}, {_code(e.right, name)})"
        return f"({_code(e.left, name)} {e.op} {_code(e.right, name)})"
    return f"({int(e)})"


def _refs(e: SizeExpr) -> list[Size]:
    if isinstance(e, Size):
        return [e]
    if isinstance(e, BinOp):
        return [*_refs(e.left), *_refs(e.right)]
    return []


def _expr_json(e: SizeExpr) -> Any:
    """An integer, ``["size", k, d]`` or ``[op, left, right]``."""
    if isinstance(e, Size):
        return ["size", e.k, e.d]
    if isinstance(e, BinOp):
        return [e.op, _expr_json(e.left), _expr_json(e.right)]
    return e


def _expr_from_json(data: Any, budget: list[int]) -> SizeExpr:
    budget[0] -= 1
    if budget[0] < 0:
        raise GuardError(f"a guard expression has more than {_MAX_NODES} terms")
    if type(data) is int:
        return data
    if not isinstance(data, list) or len(data) != 3:
        raise GuardError(f"a guard term is an int or a list of 3, not {data!r:.80}")
    head = data[0]
    if head == "size":
        return Size(_int(data[1], "size k"), _int(data[2], "size d"))
    if not isinstance(head, str) or head not in OPERATORS:
        raise GuardError(f"guard operator must be one of {' '.join(OPERATORS)}, not {head!r:.40}")
    right = _expr_from_json(data[2], budget)
    if head in _DIVISIONS and not _positive(right):
        raise GuardError(f"a guard divides by {data[2]!r:.40}: only by a positive integer")
    return BinOp(head, _expr_from_json(data[1], budget), right)


_DIVISIONS = ("//", "%")
_CHOICES = ("max", "min")  # written as calls of the builtins


def _positive(e: SizeExpr) -> bool:
    """Whether ``e`` is a positive integer: the divisors a guard takes (a guard that
    could divide by zero would fail every call instead of refusing one)."""
    return type(e) is int and e > 0


def scalar_kind(value: p.EValue) -> str:
    """How a scalar value enters a graph as a 0-d tensor: int, float, bool (by its type in
    the program; a value computed at run time may differ, see :func:`export_region`)."""
    if isinstance(value, p.Bool):
        return "bool"
    if isinstance(value, p.Double):
        return "float"
    return "int"


_SCALAR_DTYPES = {"int": torch.int64, "float": torch.float64, "bool": torch.bool}


class _RegionModule(torch.nn.Module):
    def __init__(
        self,
        rebuild: FunctionalForms,
        region: Region,
        constants: dict[int, torch.Tensor],
        scalar_kinds: dict[int, str],
    ) -> None:
        super().__init__()
        self.rebuild = rebuild
        self.region = region
        self.constant_slots = sorted(constants)
        for j, t in constants.items():
            self.register_buffer(f"c{j}", t)
        self.literals = rebuild.state.values
        # slot -> the Python kind a traced scalar had (a dict of the caller's: tracing
        # does not keep what the module itself records)
        self.scalar_kinds = scalar_kinds

    def _read(self, j: int) -> Any:
        if j in self.constant_slots:
            return getattr(self, f"c{j}")
        return self.literals[j]

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        region = self.region
        plan = self.rebuild.plan
        env = Env(self._read)
        slots = region.graph_inputs
        placeholder: dict[int, torch.Tensor] = {}
        scalars = set(region.scalar_inputs)
        for j, x in zip(slots, xs, strict=True):
            if j in scalars:
                kind = scalar_kind(plan.values[j])
                env[j] = x.item() if kind != "bool" else bool(x.item())
            else:
                env[j] = x
                placeholder[j] = x
        inplace = set(region.inplace)
        env.frozen = {id(t) for j, t in placeholder.items() if j not in inplace}
        aliases: dict[int, list[tuple[int, int]]] = {}
        for i, j, k in region.aliases:
            aliases.setdefault(i, []).append((j, k))
        branch = region.branch
        straight = region.last if branch is None else branch.jump - 1
        for i in range(region.first, straight + 1):
            for j, k in aliases.get(i, ()):
                value = plan.values[j]
                assert isinstance(value, p.Tensor)
                env[j] = env[k].reshape(value.sizes)
            self.rebuild.step(env, region.chain, i)
        if branch is not None:
            self._if_else(env, branch)
            for i in range(branch.end, region.last + 1):
                self.rebuild.step(env, region.chain, i)
        results: dict[int, Any] = {}
        for s in region.stores:
            if s.how in ("inplace", "copy", "replace", "adopt"):
                results[s.slot] = env[s.slot]
        # the graph's inputs and the method's constants: never returned as they are
        originals = {id(t) for t in placeholder.values()}
        originals.update(id(getattr(self, f"c{j}")) for j in self.constant_slots)

        def owned(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and (id(t) in originals or t._is_view()):
                return t.clone()
            return t

        sources = {j: owned(results[j]) for j in inplace if results[j] is not placeholder.get(j)}
        for j, src in sources.items():
            target = placeholder[j]
            if src.shape != target.shape:
                src = src.reshape(target.shape)
            target.copy_(src)
        outputs: list[torch.Tensor] = []
        # an adopted output is a tensor of its own (the caller may get it as its copy):
        # not one another returned value or written value also is
        counts: dict[int, int] = {}
        for x in results.values():
            counts[id(x)] = counts.get(id(x), 0) + 1
        for s in region.stores:
            if s.how == "returned":  # a copy of what the region wrote in place
                outputs.append(placeholder[s.slot].clone())
                continue
            if s.how not in ("copy", "replace", "adopt"):
                continue
            x = results[s.slot]
            if isinstance(x, torch.Tensor):
                if s.how != "adopt":
                    outputs.append(owned(x))
                elif counts[id(x)] > 1:
                    outputs.append(x.clone(memory_format=torch.contiguous_format))
                else:
                    outputs.append(owned(x).contiguous())
            else:
                kind = _kind_of(x)
                self.scalar_kinds[s.slot] = kind
                outputs.append(torch.full((), x, dtype=_SCALAR_DTYPES[kind]))
        return tuple(outputs)

    def _if_else(self, env: Env, branch: Branch) -> None:
        """The region's if/else as one ``torch.cond`` (its operator): each branch a function of every
        tensor the region holds so far (the method's constants among them), returning
        ``branch.merged`` (a value a branch leaves as it was passes on a copy: a branch's
        results may not be its operands)."""
        region = self.region
        slots = [j for j, x in env.values.items() if isinstance(x, torch.Tensor)]
        slots += [j for j in self.constant_slots if j not in env]
        operands = tuple(env[j] for j in slots)
        scalars = {j: x for j, x in env.values.items() if not isinstance(x, torch.Tensor)}

        def arm(lo: int, hi: int) -> Any:
            def run(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                sub = Env(self._read)
                sub.values.update(scalars)
                sub.values.update(zip(slots, xs, strict=True))
                sub.frozen = {id(x) for x in xs}  # an op that updates one updates a copy
                for i in range(lo, hi + 1):
                    self.rebuild.step(sub, region.chain, i)
                given = {id(x) for x in xs}
                out = []
                for j in branch.merged:
                    x = sub[j]
                    out.append(x.clone() if id(x) in given or x._is_view() else x)
                return tuple(out)

            return run

        pred = env[branch.pred].reshape(()).bool()
        # the operator itself: torch.cond would first capture the branches with dynamo,
        # which does not follow the functional forms' Python
        results = torch.ops.higher_order.cond(
            pred,
            arm(branch.jump + 1, branch.skip - 1),
            arm(branch.skip + 1, branch.end - 1),
            operands,
        )
        for j, x in zip(branch.merged, results, strict=True):
            env[j] = x


def _kind_of(x: Any) -> str:
    if isinstance(x, bool | torch.SymBool):
        return "bool"
    if isinstance(x, float | torch.SymFloat):
        return "float"
    return "int"


def _example(state: Any, j: int, device: torch.device) -> torch.Tensor:
    """A tensor like value ``j`` at its largest (the traced input), in its dim order."""
    value = state.plan.values[j]
    assert isinstance(value, p.Tensor)
    dtype = CODE_TO_DTYPE[value.scalar_type]
    sizes = tuple(value.sizes)
    held = state.values[j]
    if isinstance(held, torch.Tensor) and value.shape_dynamism == p.DYNAMIC_UNBOUND:
        sizes = tuple(held.shape) if held.numel() else sizes
    strides = dim_order_strides(sizes, value.dim_order)
    return torch.empty_strided(sizes, strides, dtype=dtype, device=device).zero_()


def _dims(value: p.EValue, example: torch.Tensor) -> dict[int, Any] | None:
    if not isinstance(value, p.Tensor) or value.shape_dynamism == p.STATIC:
        return None
    auto = torch.export.Dim.AUTO
    dims: dict[int, Any] = {}
    for d, bound in enumerate(example.shape):
        if value.shape_dynamism == p.DYNAMIC_BOUND:
            if bound > 1:
                dims[d] = auto(min=0, max=int(bound))
        else:
            dims[d] = auto(min=0)
    return dims or None


def export_region(
    rebuild: FunctionalForms, region: Region, device: torch.device
) -> tuple[torch.export.ExportedProgram, list[Guard], dict[int, str]]:
    """The exported graph of ``region``, the guards its compiled code needs, and the
    Python kind (int, float, bool) of each scalar it returns, by slot."""
    state = rebuild.state
    plan = state.plan
    constants: dict[int, torch.Tensor] = {}
    for i in range(region.first, region.last + 1):
        rebuild.prepare(region.chain, i)
        ins = state.chains[region.chain].instructions[i]
        for a in p.instruction_values(ins):
            v = plan.values[a]
            items = [a]
            if isinstance(v, p.TensorList | p.OptionalTensorList):
                items = [k for k in v.items if k >= 0]
            for k in items:
                vk = plan.values[k]
                if isinstance(vk, p.Tensor) and vk.is_constant:
                    t = state.values[k]
                    constants[k] = t if t.device == device else t.to(device)
    kinds: dict[int, str] = {}
    module = _RegionModule(rebuild, region, constants, kinds)
    examples: list[torch.Tensor] = []
    dynamic: list[Any] = []
    scalars = set(region.scalar_inputs)
    for j in region.graph_inputs:
        if j in scalars:
            kind = scalar_kind(plan.values[j])
            held = state.values[j]
            initial = held if isinstance(held, int | float | bool) else 0
            examples.append(torch.tensor(initial, dtype=_SCALAR_DTYPES[kind], device=device))
            dynamic.append(None)
            continue
        x = _example(state, j, device)
        examples.append(x)
        dynamic.append(_dims(plan.values[j], x))
    from torch.fx.experimental import _config

    shape_config: Any = _config  # its patch() is made at import

    with torch.no_grad(), quiet(), shape_config.patch(backed_size_oblivious=True):
        ep = torch.export.export(
            module,
            tuple(examples),
            dynamic_shapes={"xs": tuple(dynamic)} if any(d is not None for d in dynamic) else None,
            strict=False,
        )
    guards = _guards(ep, [plan.values[j] for j in region.graph_inputs], examples)
    return ep, guards, dict(kinds)


def _guards(
    ep: torch.export.ExportedProgram, values: Sequence[p.EValue], examples: Sequence[torch.Tensor]
) -> list[Guard]:
    import sympy

    sig = ep.graph_signature
    user = list(sig.user_inputs)
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    ranges = ep.range_constraints
    guards: list[Guard] = []
    defined: dict[Any, tuple[int, int]] = {}
    pending: list[tuple[int, int, Any]] = []
    for k, (name, value, example) in enumerate(zip(user, values, examples, strict=True)):
        if not isinstance(value, p.Tensor) or value.shape_dynamism == p.STATIC:
            continue
        fake = nodes[name].meta.get("val")
        if fake is None:
            continue
        bound = tuple(example.shape)
        for d, size in enumerate(fake.shape):
            expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
            if expr.is_number:
                guards.append(Guard("eq", k, d, value=int(expr)))
            elif isinstance(expr, sympy.Symbol) and expr not in defined:
                defined[expr] = (k, d)
                vr = ranges.get(expr)
                lo = int(vr.lower) if vr is not None and vr.lower.is_finite else 0
                hi = int(vr.upper) if vr is not None and vr.upper.is_finite else -1
                top = bound[d] if value.shape_dynamism == p.DYNAMIC_BOUND else -1
                if 0 <= top <= hi:
                    hi = -1  # the program's bound: no size past it reaches the region
                # an empty dimension runs interpreted (module docstring)
                guards.append(Guard("range", k, d, lo=max(lo, 1), hi=hi))
            elif isinstance(expr, sympy.Symbol):
                k2, d2 = defined[expr]
                guards.append(Guard("same", k, d, k2=k2, d2=d2))
            else:
                pending.append((k, d, expr))
    for k, d, expr in pending:
        missing = [s for s in expr.free_symbols if s not in defined]
        if missing:
            raise ValueError(f"input {k} dim {d} has size {expr}, which no input dimension defines")
        guards.append(Guard("expr", k, d, expr=_size_expr(expr, defined)))
    guards.extend(_positive_sizes(ep, guards, defined))
    return guards


def _positive_sizes(
    ep: torch.export.ExportedProgram, guards: Sequence[Guard], defined: dict[Any, tuple[int, int]]
) -> list[Guard]:
    """A ``"positive"`` guard for each size of the graph's values that is computed from
    the inputs' sizes and may be 0 (or less) within the ranges ``guards`` give them (module
    docstring). Sizes of data (a nonzero's count) are no input's: nothing checks them. A
    size that may be 0 in a form :func:`_size_expr` does not write (a division by a size)
    is a ValueError: no guard could keep an empty one from the compiled code, so the
    region runs interpreted whole."""
    import sympy
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    ranges: dict[Any, ValueRanges[Any]] = {}
    for symbol, (k, d) in defined.items():
        g = next(g for g in guards if g.kind == "range" and (g.k, g.d) == (k, d))
        ranges[symbol] = ValueRanges(g.lo, g.hi if g.hi >= 0 else sympy.oo)
    seen: set[Any] = set()
    out: list[Guard] = []
    for node in ep.graph.nodes:
        found = node.meta.get("val")
        for value in found if isinstance(found, list | tuple) else (found,):
            if not isinstance(value, torch.Tensor):
                continue
            for size in value.shape:
                if not isinstance(size, torch.SymInt):
                    continue
                expr = size.node.expr
                if expr in seen or isinstance(expr, sympy.Symbol) or expr.is_number:
                    continue
                seen.add(expr)
                if not expr.free_symbols <= ranges.keys():
                    continue
                try:
                    low = bound_sympy(expr, ranges).lower
                except (TypeError, ValueError):  # no bound known: it may be 0
                    low = sympy.S.NegativeInfinity
                if low.is_finite and low >= 1:
                    continue
                try:
                    term = _size_expr(expr, defined)
                except ValueError as e:
                    raise ValueError(
                        f"a size of the graph may be 0 and has no guard: {e}"
                    ) from None
                first = _refs(term)[0]
                out.append(Guard("positive", first.k, first.d, expr=term))
    return out


def _size_expr(expr: Any, defined: dict[Any, tuple[int, int]]) -> SizeExpr:
    """``expr`` (sympy, over symbols that input dims define) as a guard expression."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max, Min, Mod, ModularIndexing

    if isinstance(expr, sympy.Symbol):
        k, d = defined[expr]
        return Size(k, d)
    if expr.is_Integer:
        return int(expr)
    args = [_size_expr(a, defined) for a in expr.args]

    def fold(op: str, terms: list[SizeExpr]) -> SizeExpr:
        out = terms[0]
        for t in terms[1:]:
            out = BinOp(op, out, t)
        return out

    if isinstance(expr, sympy.Add):
        return fold("+", args)
    if isinstance(expr, sympy.Mul):
        return fold("*", args)
    if isinstance(expr, Max | sympy.Max):
        return fold("max", args)
    if isinstance(expr, Min | sympy.Min):
        return fold("min", args)
    if isinstance(expr, FloorDiv | Mod | ModularIndexing) and not all(
        _positive(a) for a in args[1:]
    ):
        raise ValueError(f"cannot check a size of the form {expr} (a divisor that is no constant)")
    if isinstance(expr, FloorDiv):
        return BinOp("//", args[0], args[1])
    if isinstance(expr, Mod):
        return BinOp("%", args[0], args[1])
    if isinstance(expr, ModularIndexing):
        return BinOp("%", BinOp("//", args[0], args[1]), args[2])
    if isinstance(expr, sympy.Pow) and expr.args[1].is_Integer and 0 < int(expr.args[1]) <= 8:
        return fold("*", [args[0]] * int(expr.args[1]))
    raise ValueError(f"cannot check a size of the form {expr}")
