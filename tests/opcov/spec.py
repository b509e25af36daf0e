"""Building blocks for the operator-coverage table: input specs, the Case record, tolerances.

Everything here is deterministic: inputs come from a generator seeded by the case name and dtype,
and a case's ``fingerprint`` (used as the export cache key) is computed from what the case does,
not from object addresses, so it is stable across processes.
"""

from __future__ import annotations

import hashlib
import types
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
i64, i32 = torch.int64, torch.int32
b8 = torch.bool

FLOAT: tuple[torch.dtype, ...] = (f32, f16, bf16)
INT: tuple[torch.dtype, ...] = (i64, i32)
NUM: tuple[torch.dtype, ...] = FLOAT + INT
ALL: tuple[torch.dtype, ...] = (*NUM, b8)
INT_BOOL: tuple[torch.dtype, ...] = (*INT, b8)

# Default (rtol, atol) per floating dtype, applied to floating outputs unless a case overrides
# them. Integer and bool outputs are always compared exactly.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    f32: (1e-5, 1e-5),
    f16: (1e-3, 1e-3),
    bf16: (1.6e-2, 1e-2),
    torch.float64: (1e-7, 1e-7),
}

DTYPE_NAMES: dict[torch.dtype, str] = {
    f32: "float32",
    f16: "float16",
    bf16: "bfloat16",
    i64: "int64",
    i32: "int32",
    b8: "bool",
}
DTYPES_BY_NAME: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}


@dataclass(frozen=True)
class In:
    """How to make one input tensor.

    ``dtype=None`` means "the dtype the case is being run at". ``kind`` selects the value
    distribution (see ``make_tensor``); ``low``/``high`` bound it where that makes sense.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    kind: str = "rand"
    low: float | None = None
    high: float | None = None


def T(
    *shape: int,
    dtype: torch.dtype | None = None,
    low: float | None = None,
    high: float | None = None,
) -> In:
    """Random values of the case dtype (normal for floats, small ints, random bools)."""
    kind = "rand" if low is None and high is None else "uniform"
    return In(tuple(shape), dtype, kind, low, high)


def Pos(*shape: int, dtype: torch.dtype | None = None) -> In:
    """Strictly positive values (for log, sqrt, ...)."""
    return In(tuple(shape), dtype, "uniform", 0.25, 4.0)


def Unit(*shape: int, dtype: torch.dtype | None = None) -> In:
    """Values inside (-1, 1) (for asin, atanh, ...)."""
    return In(tuple(shape), dtype, "uniform", -0.95, 0.95)


def NZ(*shape: int, dtype: torch.dtype | None = None) -> In:
    """Values bounded away from zero, with both signs (divisors)."""
    return In(tuple(shape), dtype, "nonzero")


def Idx(*shape: int, high: int, dtype: torch.dtype = i64, low: int = 0) -> In:
    """Integer indices in [low, high)."""
    return In(tuple(shape), dtype, "index", low, high)


def Perm(n: int, dtype: torch.dtype = i64) -> In:
    """A permutation of range(n) (distinct indices)."""
    return In((n,), dtype, "perm")


def Distinct(*shape: int, dtype: torch.dtype | None = None) -> In:
    """Pairwise distinct values (exact in every dtype), so sorts and arg-reductions have no ties."""
    return In(tuple(shape), dtype, "distinct")


def Uniq(*shape: int, high: int, dim: int = -1, dtype: torch.dtype = i64) -> In:
    """Indices in [0, high) that are distinct along ``dim`` (deterministic scatters)."""
    return In(tuple(shape), dtype, f"uniq{dim}", 0, high)


def Mask(*shape: int) -> In:
    """A random boolean mask."""
    return In(tuple(shape), b8, "mask")


def Special(*shape: int, dtype: torch.dtype | None = None) -> In:
    """Random floats with some nan, +inf and -inf sprinkled in."""
    return In(tuple(shape), dtype, "special")


def make_tensor(spec: In, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    dt = spec.dtype if spec.dtype is not None else dtype
    shape = spec.shape
    if spec.kind == "mask" or dt == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if spec.kind == "index":
        assert spec.low is not None and spec.high is not None
        return torch.randint(int(spec.low), int(spec.high), shape, generator=gen).to(dt)
    if spec.kind == "perm":
        return torch.randperm(shape[0], generator=gen).to(dt)
    if spec.kind.startswith("uniq"):
        assert spec.high is not None
        dim = int(spec.kind[4:]) % len(shape)
        moved = [*shape[:dim], *shape[dim + 1 :], shape[dim]]
        rows = [
            torch.randperm(int(spec.high), generator=gen)[: shape[dim]]
            for _ in range(max(1, int(torch.tensor(moved[:-1]).prod().item())))
        ]
        return torch.stack(rows).reshape(moved).movedim(-1, dim).contiguous().to(dt)
    if spec.kind == "distinct":
        n = 1
        for d in shape:
            n *= d
        vals = torch.randperm(n, generator=gen).reshape(shape) - n // 2
        return (vals * 0.25).to(dt) if dt.is_floating_point else vals.to(dt)
    if dt.is_floating_point:
        if spec.kind == "rand":
            x = torch.randn(shape, generator=gen)
        elif spec.kind == "uniform":
            lo = -1.0 if spec.low is None else spec.low
            hi = 1.0 if spec.high is None else spec.high
            x = torch.rand(shape, generator=gen) * (hi - lo) + lo
        elif spec.kind == "nonzero":
            x = torch.randn(shape, generator=gen)
            x = torch.where(x >= 0, x.abs() + 0.5, -(x.abs() + 0.5))
        elif spec.kind == "special":
            x = torch.randn(shape, generator=gen)
            flat = x.view(-1)
            pick = torch.randint(0, 6, flat.shape, generator=gen)
            flat[pick == 0] = float("nan")
            flat[pick == 1] = float("inf")
            flat[pick == 2] = float("-inf")
        else:
            raise ValueError(f"unknown input kind {spec.kind!r}")
        return x.to(dt)
    # integer dtypes
    if spec.kind == "rand":
        return torch.randint(-8, 9, shape, generator=gen).to(dt)
    if spec.kind == "uniform":
        lo = -8 if spec.low is None else int(spec.low)
        hi = 8 if spec.high is None else int(spec.high)
        return torch.randint(lo, hi + 1, shape, generator=gen).to(dt)
    if spec.kind == "nonzero":
        mag = torch.randint(1, 9, shape, generator=gen)
        sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
        return (mag * sign).to(dt)
    if spec.kind == "special":
        return torch.randint(-8, 9, shape, generator=gen).to(dt)
    raise ValueError(f"unknown input kind {spec.kind!r}")


class FnModule(nn.Module):
    """Wraps a plain function so it can be exported as a module."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


Tol = tuple[float, float]


@dataclass(frozen=True, eq=False)
class Case:
    """One single-op (or tight op cluster) export case.

    fn:       a function of the inputs applying the op (used when ``module`` is None).
    module:   a factory for an ``nn.Module`` (for ops with parameters/buffers); its parameters are
              initialised under a seed derived from the case and cast to floating case dtypes.
    inputs:   input specs, see ``In``.
    dtypes:   dtypes the case applies to (the dtype of inputs whose spec leaves it open, and of
              the module's parameters).
    tol:      (rtol, atol) for every floating dtype, or a mapping dtype -> (rtol, atol);
              anything not given falls back to ``DEFAULT_TOLERANCES``.
    preserve: ATen overloads (e.g. "aten.pixel_shuffle.default") handed to the exporter's
              ``EdgeCompileConfig(preserve_ops=...)`` so that an op that ExecuTorch's portable
              kernels implement stays whole instead of being decomposed.
    dynamic:  (input index, dim, min, max) entries: those dims are exported as dynamic
              (``torch.export.Dim``); the example inputs stay what ``inputs`` says.
    """

    name: str
    fn: Callable[..., Any] | None
    inputs: tuple[In, ...]
    dtypes: tuple[torch.dtype, ...] = FLOAT
    module: Callable[[], nn.Module] | None = None
    tol: Tol | Mapping[torch.dtype, Tol] | None = None
    preserve: tuple[str, ...] = ()
    dynamic: tuple[tuple[int, int, int, int], ...] = ()
    note: str = ""

    def seed(self, dtype: torch.dtype) -> int:
        return zlib.crc32(f"{self.name}/{DTYPE_NAMES[dtype]}".encode())

    def tolerance(self, dtype: torch.dtype) -> Tol:
        """(rtol, atol) for floating outputs when the case runs at ``dtype``.

        Outputs of a floating dtype other than the case dtype (e.g. an int input promoted to
        float32) use that output dtype's tolerance.
        """
        if isinstance(self.tol, tuple):
            return self.tol
        if isinstance(self.tol, Mapping) and dtype in self.tol:
            return self.tol[dtype]
        return DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES[f32])

    def make_inputs(self, dtype: torch.dtype) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed(dtype))
        return [make_tensor(s, dtype, gen) for s in self.inputs]

    def build(self, dtype: torch.dtype) -> nn.Module:
        if self.module is None:
            assert self.fn is not None, self.name
            return FnModule(self.fn).eval()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed(dtype))
            m = self.module()
        if dtype.is_floating_point:
            m = m.to(dtype)
        return m.eval()

    def preserve_ops(self) -> list[torch._ops.OpOverload]:
        out = []
        for qual in self.preserve:
            ns, name, overload = qual.split(".")
            out.append(getattr(getattr(getattr(torch.ops, ns), name), overload))
        return out

    def dynamic_shapes(self) -> tuple[dict[int, Any] | None, ...] | None:
        if not self.dynamic:
            return None
        specs: list[dict[int, Any] | None] = [None] * len(self.inputs)
        for i, dim, lo, hi in self.dynamic:
            d = specs[i] if specs[i] is not None else {}
            d[dim] = torch.export.Dim(f"in{i}_dim{dim}", min=lo, max=hi)
            specs[i] = d
        return tuple(specs)

    def fingerprint(self, dtype: torch.dtype) -> str:
        """A stable digest of everything that determines the exported program and its data."""
        parts = [
            self.name,
            DTYPE_NAMES[dtype],
            repr(self.inputs),
            _stable(self.fn),
            _stable(self.module),
            repr(self.preserve),
            repr(self.dynamic),
        ]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def _stable(obj: Any, _seen: set[int] | None = None) -> str:
    """A process-independent description of ``obj`` (functions by their code, not address)."""
    seen = set() if _seen is None else _seen
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.dtype)):
        return repr(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj).__name__ + "(" + ",".join(_stable(o, seen) for o in obj) + ")"
    if isinstance(obj, dict):
        return (
            "{" + ",".join(f"{_stable(k, seen)}:{_stable(v, seen)}" for k, v in obj.items()) + "}"
        )
    if isinstance(obj, types.FunctionType):
        if id(obj) in seen:
            return f"<recursive {obj.__qualname__}>"
        seen.add(id(obj))
        parts = [
            _code(obj.__code__),
            _stable(obj.__defaults__, seen),
            _stable(obj.__kwdefaults__, seen),
        ]
        if obj.__closure__:
            parts.append(_stable([c.cell_contents for c in obj.__closure__], seen))
        # Helpers defined next to the case (same module) are part of what it does.
        for name in _all_names(obj.__code__):
            g = obj.__globals__.get(name)
            if isinstance(g, types.FunctionType) and g.__module__ == obj.__module__:
                parts.append(name + "=" + _stable(g, seen))
        return "fn(" + "|".join(parts) + ")"
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, torch._ops.OpOverloadPacket | torch._ops.OpOverload):
        return f"op {obj}"
    if callable(obj):
        mod = getattr(obj, "__module__", None) or type(obj).__module__
        qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", type(obj).__name__)
        return f"callable {mod}.{qual}"
    if isinstance(obj, torch.Tensor):
        return f"tensor({obj.dtype},{tuple(obj.shape)},{obj.tolist()})"
    return repr(obj)


def _code(code: types.CodeType) -> str:
    consts = []
    for c in code.co_consts:
        consts.append(_code(c) if isinstance(c, types.CodeType) else repr(c))
    return hashlib.sha256(
        b"|".join(
            [
                code.co_code,
                repr(code.co_names).encode(),
                repr(code.co_varnames).encode(),
                repr(consts).encode(),
            ]
        )
    ).hexdigest()


def _all_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.extend(_all_names(c))
    return names


def case_table(cases: Sequence[Case]) -> dict[str, Case]:
    table: dict[str, Case] = {}
    for c in cases:
        if c.name in table:
            raise ValueError(f"duplicate case name {c.name!r}")
        table[c.name] = c
    return table


__all__ = [
    "ALL",
    "DEFAULT_TOLERANCES",
    "DTYPES_BY_NAME",
    "DTYPE_NAMES",
    "FLOAT",
    "INT",
    "INT_BOOL",
    "NUM",
    "NZ",
    "Case",
    "Distinct",
    "FnModule",
    "Idx",
    "In",
    "Mask",
    "Perm",
    "Pos",
    "Special",
    "T",
    "Uniq",
    "Unit",
    "b8",
    "bf16",
    "case_table",
    "f16",
    "f32",
    "i32",
    "i64",
    "make_tensor",
]
