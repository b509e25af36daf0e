"""Delegate calls a library outside torch runs, as one opaque op of a compiled graph.

A delegate call that the interpreter runs with ExecuTorch's XNNPACK backend (the method's
statement carries the backend's runner, :attr:`ptexec.kernels.registry.Statement.external`)
and whose kernels pay for a call (:func:`worth_a_call`) is not traced into torch
operations: the region's graph calls
``torch.ops.ptexec.external_call(key, inputs)``, a custom op whose implementation hands
the inputs to that runner, which runs XNNPACK's own kernels on them, and returns the
outputs. The portable instructions around it are still traced, fused and compiled with
the rest of the region. AOTInductor's CPU code calls the op through the C entry of
:mod:`.native`'s library where that library is loaded (it runs the call in C++, or hands
it to this Python implementation), and otherwise through its proxy executor (the calls
are listed in the JSON file beside a CPU library), which reaches the op's kernel through
torch's dispatcher; the ``graph`` backend calls it directly.

``key`` names what the call computes and where, stable across processes: a digest of the
one-delegate program the runner loaded (the payload, the named data it reads, its
tensors' dtypes, sizes and dim orders) and the call's place in the method (chain and
instruction). The place matters: two calls of one delegate (the same bytes: a layer
applied twice) each keep their own output memory, so the first call's outputs are not
overwritten by the second while the graph still reads them. A compiled library holds only the key; the
method registers its runner under that key when it is loaded (:func:`register`), before
any of its compiled code can run, and the registry holds runners weakly, so a dropped
method leaves nothing behind. Methods that load the same delegate share a key: while a
method's compiled code runs, the thread finds that method's own calls first (:func:`use`),
so each method uses its own runner and memory; the registry serves tracing, and is used
by one call at a time.

Each call is one generated function (:meth:`ExternalCall.run`): its inputs unpacked, the
outputs' tensors in their places, the runner's plain function called. An input whose
address is the one handed over at the last call goes over as it is; one whose address
moved is handed over as it is once it keeps its new address for two calls (the compiled
code's memory settles after a few calls), and a small one is copied into memory of the
call's own while its address keeps moving (a copy costs less than ExecuTorch taking a new
address at every call).

The op's outputs are dense in the program's dim order of each output, and are the same
memory from call to call (the delegate's, as its planned outputs are when interpreted:
ExecuTorch then keeps the addresses it was handed, and a call is one ``execute``). A
dynamic output is allocated at its declared bound and given the shape XNNPACK computed.
At trace time the output shapes come from the program (static outputs) or from ptexec's
torch code of the payload run on the traced inputs (dynamic outputs: the shapes are
symbolic expressions of the inputs'); that code is built only to trace, never to run.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..codegen import Sources
from ..delegates.xnnpack import schema as s
from ..delegates.xnnpack.node_types import approximated_float_nodes, quantized_products
from ..dtypes import CODE_TO_DTYPE
from ..format import program as p

__all__ = [
    "Calls",
    "ExternalCall",
    "ExternalRunner",
    "OutputSpec",
    "attach_native_use",
    "external_call",
    "own_tensor",
    "register",
    "use",
    "worth_a_call",
]


class ExternalRunner(Protocol):
    """What the interpreter's statement carries (:class:`~ptexec.delegates.xnnpack.
    executorch_runner.EtRunner`): callable on the call's arguments, the positions it
    writes, and a digest of what it computes."""

    outputs: tuple[int, ...]
    fn: Callable[..., None]  # the same call as a plain function (no method frame)

    def __call__(self, *tensors: torch.Tensor) -> None: ...

    def digest(self) -> str: ...


@dataclass(frozen=True)
class OutputSpec:
    """Argument ``position`` of the call, an output: its dtype, dim order and (upper
    bound) sizes, and whether its shape is dynamic."""

    position: int
    dtype: torch.dtype
    dim_order: tuple[int, ...]
    sizes: tuple[int, ...]
    dynamic: bool


def _dense(
    sizes: Sequence[int | torch.SymInt], order: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """A new tensor of ``sizes``, dense in ``order`` (what the runner writes)."""
    inverse = [0] * len(order)
    for j, d in enumerate(order):
        inverse[d] = j
    return torch.empty([sizes[d] for d in order], dtype=dtype).permute(inverse)


class ExternalCall:
    """One delegate call run by an outside library's ``runner`` (called with all the
    call's argument tensors in order, writing the outputs in place): ``inputs`` are the
    positions of the arguments it reads (``orders``: their dim orders), ``outputs``
    those it writes."""

    def __init__(
        self,
        key: str,
        runner: Callable[..., None],
        count: int,
        outputs: Sequence[OutputSpec],
        orders: Sequence[Sequence[int]],
    ) -> None:
        self.key = key
        self.runner = runner
        self.count = count
        self.outputs = tuple(outputs)
        written = {o.position for o in self.outputs}
        self.inputs = tuple(k for k in range(count) if k not in written)
        self.lock = threading.Lock()
        self.orders = tuple(tuple(int(d) for d in o) for o in orders)  # the inputs' dim orders
        if len(self.orders) != len(self.inputs):
            raise ValueError(f"{len(self.orders)} dim orders for {len(self.inputs)} inputs")
        # the call itself, made on the first run (:meth:`_build`)
        self._fast: Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]] | None = None
        # the outputs, written by every call: the delegate's own memory, as the planned
        # memory it writes when interpreted (ExecuTorch keeps the addresses it was given,
        # so a call with the addresses of the last one is one execute)
        self._outs: tuple[torch.Tensor, ...] = ()
        # per input: the address handed to the runner last, the address the input had
        # at the last call, and the memory of its own a small input is copied into while
        # its address moves (a copy costs less than handing a new address over)
        self._handed: list[int | None] = [None] * len(self.inputs)
        self._last: list[int | None] = [None] * len(self.inputs)
        self._stage: list[torch.Tensor | None] = [None] * len(self.inputs)
        # while tracing: the torch code that gives dynamic outputs their symbolic shapes
        self.shapes: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None

    @classmethod
    def of(
        cls,
        runner: ExternalRunner,
        values: Sequence[p.EValue],
        args: Sequence[int],
        site: tuple[int, int],
    ) -> ExternalCall | None:
        """The call of ``runner`` on arguments ``args`` (value indices) at ``site`` (chain,
        instruction), or None when an argument is not a tensor of a dtype torch has (such
        a call stays interpreted)."""
        specs: list[OutputSpec] = []
        for k in runner.outputs:
            v = values[args[k]]
            if not isinstance(v, p.Tensor) or v.scalar_type not in CODE_TO_DTYPE:
                return None
            specs.append(
                OutputSpec(
                    k,
                    CODE_TO_DTYPE[v.scalar_type],
                    tuple(v.dim_order),
                    tuple(v.sizes),
                    v.shape_dynamism != p.STATIC,
                )
            )
        orders: list[tuple[int, ...]] = []
        written = set(runner.outputs)
        for k, j in enumerate(args):
            v = values[j]
            if not isinstance(v, p.Tensor) or v.scalar_type not in CODE_TO_DTYPE:
                return None
            if k not in written:
                orders.append(tuple(v.dim_order))
        key = f"{runner.digest()}-{int(site[0])}-{int(site[1])}"
        return cls(key, runner, len(args), specs, orders)

    def run(self, inputs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """Run the call on ``inputs`` (the tensors at :attr:`inputs`): its outputs (the
        same tensors at every call)."""
        fast = self._fast
        if fast is None:
            fast = self._build()
        return fast(inputs)

    def output_memory(self) -> tuple[torch.Tensor, ...]:
        """The outputs' tensors every call writes (made on first use, at their bounds)."""
        with self.lock:
            if not self._outs and self.outputs:
                self._outs = tuple(_dense(o.sizes, o.dim_order, o.dtype) for o in self.outputs)
            return self._outs

    def program(self) -> Any:
        """The one-delegate program the runner loaded into ExecuTorch, as written (an
        ExecuTorch runner's ``EtProgram``: its bytes, where its payload lies, its compile
        specs and tensors), for :mod:`.native` to load the same; None: the runner is not
        ExecuTorch's."""
        program = getattr(self.runner, "program", None)
        return program() if callable(program) else None

    def release_runner(self) -> None:
        """Let the runner drop what it loaded until its next call (another path runs the
        call meanwhile, :mod:`.native`)."""
        release = getattr(self.runner, "release", None)
        if callable(release):
            release()

    def _build(self) -> Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]]:
        """The call as one function of its inputs: an input whose address is the one
        handed over last goes to the runner as it is, with the outputs' tensors in their
        places; any other goes through :meth:`_move` first."""
        self.output_memory()
        with self.lock:
            if self._fast is not None:
                return self._fast
            xs = [f"x{j}" for j in range(len(self.inputs))]
            args: list[str] = [""] * self.count
            for j, k in enumerate(self.inputs):
                args[k] = xs[j]
            for n, o in enumerate(self.outputs):
                args[o.position] = f"_y{n}"
            lines = [
                "def _run(inputs):",
                "    try:",
                f"        {''.join(f'{x}, ' for x in xs)}= inputs",
                "    except ValueError:",
                "        raise _count(inputs) from None",
                "    with _lock:",
            ]
            for j, x in enumerate(xs):
                lines += [
                    f"        if {x}.data_ptr() != _handed[{j}]:",
                    f"            {x} = _move({j}, {x})",
                ]
            lines += [f"        _fn({', '.join(args)})", "    return _outs"]
            runner = self.runner
            env: dict[str, Any] = {
                "_lock": self.lock,
                "_handed": self._handed,
                "_move": self._move,
                "_count": self._count,
                "_fn": getattr(runner, "fn", runner),
                "_outs": self._outs,
                **{f"_y{n}": t for n, t in enumerate(self._outs)},
            }
            code = "\n".join(lines) + "\n"
            sources = Sources(f"external call {self.key[:12]}")  # kept by the function
            fast: Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]] = sources.compile(
                code, "run", env
            )["_run"]
            self._fast = fast
            return fast

    def _move(self, j: int, x: torch.Tensor) -> torch.Tensor:
        """Input ``j``, ``x``, whose address is not the one handed over last: ``x`` itself
        when it had that address at the last call too (the compiled code's memory has
        settled: the runner takes the new address once) or is large, else a copy in
        memory of the call's own (an address that moves from call to call would be
        handed over at every call)."""
        at = x.data_ptr()
        last, self._last[j] = self._last[j], at
        if at == last or x.nbytes > _STAGE_BYTES:
            self._handed[j] = at
            return x
        b = self._stage[j]
        if b is None or b.shape != x.shape or b.dtype != x.dtype:
            b = self._stage[j] = _dense(x.shape, self.orders[j], x.dtype)
        self._handed[j] = b.data_ptr()
        return b.copy_(x)

    def _count(self, inputs: Sequence[torch.Tensor]) -> RuntimeError:
        return RuntimeError(
            f"external call {self.key[:12]}: {len(inputs)} inputs, expected {len(self.inputs)}"
        )

    def fake(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs' metadata for traced ``inputs``."""
        if not any(o.dynamic for o in self.outputs):
            return [_dense(o.sizes, o.dim_order, o.dtype) for o in self.outputs]
        if self.shapes is None:
            raise RuntimeError(
                f"external call {self.key[:12]}: a dynamic output's shape is known only "
                "while the method's regions are traced"
            )
        computed = self.shapes(list(inputs))
        return [
            _dense(list(t.shape) if o.dynamic else o.sizes, o.dim_order, o.dtype)
            for o, t in zip(self.outputs, computed, strict=True)
        ]


def own_tensor(calls: Iterable[ExternalCall]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function of a tensor the compiled code returned: the tensor itself, or a copy
    where it lies in the output memory of one of ``calls`` (their next run writes that
    memory again; the compiled code, traced with each call's outputs as new tensors,
    may return them, or views of them, as they are)."""
    held = frozenset(t.untyped_storage().data_ptr() for c in calls for t in c.output_memory())

    def own(t: torch.Tensor) -> torch.Tensor:
        return t.clone() if t.untyped_storage().data_ptr() in held else t

    return own


_CONVOLUTIONS = frozenset({"Conv2d", "DepthwiseConv2d", "ConvTranspose2d"})
MIN_WEIGHT_BYTES = 1 << 20  # weights from which XNNPACK's matrix kernels pay for a call


def worth_a_call(payload: s.XnnPayload, exact: bool = False, alone: bool = False) -> bool:
    """Whether ``payload`` runs as an opaque call of XNNPACK's kernels (else its torch
    code is traced, and compiled with the region): where only XNNPACK's kernels give
    XNNPACK's results and ``exact`` asks for them, or where they pay for the call.

    Results: with ``exact`` (the method quantizes activations to int8 somewhere,
    :func:`~ptexec.delegates.xnnpack.node_types.quantizes_activations`), a payload with a
    float node that XNNPACK approximates its own way (a sigmoid, a reciprocal square root:
    :data:`~ptexec.delegates.xnnpack.node_types.APPROXIMATED_IN_FLOAT`) is a call. torch's
    result differs from XNNPACK's in the last bit for some inputs, and an int8
    quantization after it can make that a whole step (an 8da4w LLM's greedy tokens then
    part from ExecuTorch's); in float programs a last bit stays a last bit, and the traced
    code is faster.

    Cost: an opaque call costs a few microseconds before any work (the op's dispatch,
    ExecuTorch's ``execute``), where a traced small float matrix product costs a few. So:
    a payload with a convolution (XNNPACK's NHWC kernels beat torch's CPU convolutions
    4-8x, and a convolution's work grows with its image); unless it is the method's only
    delegate (``alone``), one with a product of int8 activations by quantized weights,
    however small (:func:`~ptexec.delegates.xnnpack.node_types.quantized_products`: the
    traced code multiplies the dequantized values in float32, where XNNPACK's integer
    kernels read a quarter to an eighth of the bytes and do several products an
    instruction; a tiny 8da4w Llama's 64-256 KB linears as calls made its compiled
    decode step 15 % faster through the proxy executor, 27 % through the native C entry,
    a quantized DeiT's calls 25 %); or one whose constants (weights)
    hold at least :data:`MIN_WEIGHT_BYTES` as the traced code reads them (a float matrix
    product streams its weights once per call: a megabyte is tens of microseconds). A
    method's only delegate made a call leaves little or nothing to compile around it: a
    small quantized product alone ran faster traced and compiled than called between
    regions (1.1x against 1.3x ExecuTorch's time)."""
    if any(n.type in _CONVOLUTIONS for n in payload.graph.nodes):
        return True
    if exact and approximated_float_nodes(payload):
        return True
    if not alone and quantized_products(payload):
        return True
    return traced_weight_bytes(payload) >= MIN_WEIGHT_BYTES


def traced_weight_bytes(payload: s.XnnPayload) -> float:
    """The bytes of ``payload``'s constants as its traced torch code reads them per call:
    quantized weights dequantized to float32 (4 bytes an element, however few the
    payload stores), others at their own size."""
    weights = 0.0
    for v in payload.graph.values:
        if v.is_constant:
            name, size = s.DATATYPES.get(v.datatype, ("", 4))
            weights += v.numel * (4 if name.startswith("q") else size)
    return weights


_STAGE_BYTES = 256 * 1024  # inputs up to this size are copied into memory of their own

_REGISTRY: dict[str, list[weakref.ref[ExternalCall]]] = {}
_REGISTRY_LOCK = threading.Lock()


def register(call: ExternalCall) -> None:
    """Make ``call`` answer its key (held weakly: the method that made it keeps it)."""
    with _REGISTRY_LOCK:
        alive = [r for r in _REGISTRY.get(call.key, []) if r() is not None]
        alive.append(weakref.ref(call))
        _REGISTRY[call.key] = alive


class Calls(dict[str, ExternalCall]):
    """A method's opaque calls by key, with ``native``: the address of their table in
    :mod:`.native`'s library (0: none; ``keep`` holds the table)."""

    native: int = 0
    keep: Any = None


class _Current(threading.local):
    calls: Mapping[str, ExternalCall] | None = None  # each thread starts with none


_CURRENT = _Current()  # the calls of the method running on this thread
_NATIVE_USE: list[Callable[[int], int] | None] = [None]  # the library's, once loaded


def attach_native_use(use_native: Callable[[int], int]) -> None:
    """Have :func:`use` also make a native table current (:mod:`.native`)."""
    _NATIVE_USE[0] = use_native


def use(calls: Mapping[str, ExternalCall] | None) -> Mapping[str, ExternalCall] | None:
    """Make the compiled code this thread runs next find ``calls`` first (the running
    method's own, with their own memory; and their native table, for the library's
    kernel); returns what was there before."""
    before = _CURRENT.calls
    _CURRENT.calls = calls
    native = _NATIVE_USE[0]
    if native is not None:
        native(getattr(calls, "native", 0) if calls is not None else 0)
    return before


def _find(key: str) -> ExternalCall:
    calls = _CURRENT.calls
    if calls is not None:
        found = calls.get(key)
        if found is not None:
            return found
    with _REGISTRY_LOCK:
        refs = _REGISTRY.get(key, [])
        for r in reversed(refs):
            found = r()
            if found is not None:
                return found
        _REGISTRY.pop(key, None)
    raise RuntimeError(
        f"no loaded method runs the delegate call {key[:12]}... (its runner was not registered)"
    )


# the op, defined once per process: a plain library kernel (torch.library.custom_op's
# wrapper costs several times more per call, and a decode step makes dozens of calls)
_LIB = torch.library.Library("ptexec", "FRAGMENT")  # type: ignore[no-untyped-call]
_LIB.define("external_call(str key, Tensor[] inputs) -> Tensor[]")  # type: ignore[no-untyped-call]


def _external_call(key: str, inputs: list[torch.Tensor]) -> Sequence[torch.Tensor]:
    calls = _CURRENT.calls  # the running method's (a dict), else the registry's
    found = calls.get(key) if calls is not None else None
    return (found or _find(key)).run(inputs)


def _external_call_fake(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return _find(key).fake(inputs)


_LIB.impl("external_call", _external_call, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
# the same, for :mod:`.native`'s kernel of ``external_call`` to send the calls it does not hold
_LIB.define("external_call_python(str key, Tensor[] inputs) -> Tensor[]")  # type: ignore[no-untyped-call]
_LIB.impl("external_call_python", _external_call, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
torch.library.register_fake("ptexec::external_call", _external_call_fake, lib=_LIB)
external_call = torch.ops.ptexec.external_call.default
"""Run the delegate call registered as ``key`` on ``inputs``; its outputs."""
