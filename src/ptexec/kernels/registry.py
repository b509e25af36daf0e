"""The kernel registry: ``'ns::op.overload'`` -> a factory that prepares one instruction.

A factory runs once, at method load, with a :class:`KernelContext` describing the
instruction's arguments. It returns an :class:`Statement`: one Python statement that runs
the instruction, with the names it uses. The method compiles its instructions' statements
into straight-line functions, so the hot path is plain Python calling torch, with every
lookup done at load.

In a statement, ``v`` is the method's values list (``v[3]`` is value 3). Literal
arguments (constants of the program that no instruction writes) are rendered inline or
bound as names; everything else is read from ``v`` at run time.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..effects import referenced, tensor_items
from ..format import program as p

if TYPE_CHECKING:
    from ..accounting import CallRecord
    from ..device import Device

_TENSORISH = (p.Tensor, p.TensorList, p.OptionalTensorList)  # a tuple: checked per value

__all__ = [
    "Alias",
    "KernelContext",
    "KernelFactory",
    "NativeCall",
    "Slots",
    "Statement",
    "UnsupportedKernel",
    "emptied",
    "emptying",
    "find_kernel",
    "is_literal_tensor",
    "literal_tensor",
    "operator_names",
    "register",
    "register_namespace",
    "registered_names",
]


@dataclass(frozen=True)
class Alias:
    """How an instruction could run as a view instead of a copy.

    ``code`` assigns views of value ``source`` to the slots ``targets`` (e.g.
    ``v[9] = v[4].permute([1, 0])``). The method uses it when its alias analysis proves
    that nothing writes the source's memory while a target is in use. ``reads``: every
    value the code reads (``source``, and any scalar an instruction computes; None: unknown).
    """

    code: str
    env: Mapping[str, Any]
    source: int
    targets: tuple[int, ...]
    reads: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Slots:
    """An argument of a :class:`NativeCall` read from the values table: the tensor in
    slot ``items[0]`` (``single``), or the list of the tensors in the slots ``items``.
    ``view``: for a single slot, the tensor seen with these sizes (``Tensor.view``), made
    once per load; the slot's tensor then keeps its geometry for the method's life."""

    items: tuple[int, ...]
    single: bool = True
    view: tuple[int, ...] | None = None


@dataclass(frozen=True)
class NativeCall:
    """A statement as one call of a torch operator, ``name.overload`` (``aten::add``,
    ``out``), with one value per argument of its schema, in order: a :class:`Slots`, or
    the argument's fixed value (None, a bool, int, float, str, or a list of them; a
    dtype or memory format as its code), which computes what the statement's Python
    computes: the operator the statement's code calls, with the same arguments. It writes
    only the statement's outs (see :mod:`ptexec.native`). ``empties``: the outs
    the statement's code empties first on every run (its :attr:`Statement.empties` the
    fast call may skip; any others, not). ``fallback``: the same computation without
    views of slots (:attr:`Slots.view`)."""

    name: str
    overload: str
    args: tuple[Any, ...]
    empties: tuple[int, ...] = ()  # outs the statement empties before the call, always
    # the same statement as a call with no views, for a load whose tensors cannot be seen
    # with a view's sizes
    fallback: NativeCall | None = None


@dataclass(frozen=True)
class Statement:
    """One statement of Python that runs an instruction, and the names it refers to.

    ``writes``: value slots the statement replaces (assigns a new object to).
    ``reads``: every value the statement reads from ``v`` (tensors, and scalars an
    instruction computes), its ``outs`` excepted.
    ``mutates``: tensor values whose memory the statement writes in place; None when the
    kernel does not say, which the method reads as "any tensor argument".
    ``outs``: the values among ``mutates`` that are only written (``out`` arguments), not
    read. ``alias``: a view form of the instruction, for copies that may become views.
    ``pure``: the statement computes its ``outs`` from its arguments alone (no randomness,
    no other effect), so with fixed arguments it may run once, at load.
    ``prune``: for a statement that can skip writing some of its ``outs``, the statement
    that does not write the given ones (used for outputs nothing reads, e.g. batch norm's
    saved statistics). ``reads`` None means unknown (nothing is proven of such a statement).
    ``instrumented``: the statement the instrumented blocks run instead, when the
    instruction has steps of its own to report (a delegate's nodes): the same work, also
    calling the tool's hooks (``h``, see :meth:`ptexec.engine.hooks.Hooks.node`).
    ``external``: for an instruction a library outside torch runs (ExecuTorch's XNNPACK
    backend), that library's runner: callable with the values of all the instruction's
    arguments, in order, writing its ``outs`` in place. The compiled tier keeps such an
    instruction as one call instead of tracing it into torch operations.
    ``sized``: every tensor the statement writes or puts in a slot gets sizes, and every
    scalar it puts in a slot a value, that follow from its arguments' sizes and values
    other than tensors' contents alone (no data-dependent shape, no tensor's element). ``empties``: dynamic-shape ``outs`` the code
    empties before the kernel writes them (its first lines, ``v[o].resize_(0)`` each, see
    :func:`emptied`), so that torch resizes them without a warning; given only with
    ``sized``. An out that already has the sizes the kernel gives it needs no emptying
    (torch leaves it as it is). ``fresh``: for a statement writing one ``out`` of dynamic
    shape from its arguments alone (``pure``), an expression that computes the same value
    as a new tensor through the op's functional form, run by the same kernel (see
    :func:`ptexec.kernels.aten.schema_kernel`); a call that hands the value to its caller
    may run it instead of writing the out and copying it. Its dtype or layout may differ
    from the out's (torch's type promotion, strides that follow the inputs'): its user
    checks.
    """

    code: str
    env: Mapping[str, Any] = field(default_factory=dict)
    writes: tuple[int, ...] = ()
    mutates: tuple[int, ...] | None = None
    alias: Alias | None = None
    outs: tuple[int, ...] = ()
    pure: bool = False
    prune: Callable[[frozenset[int]], str] | None = None
    reads: tuple[int, ...] | None = None
    instrumented: str | None = None
    external: Callable[..., None] | None = None
    sized: bool = False
    empties: tuple[int, ...] = ()
    fresh: str | None = None
    native: NativeCall | None = None


def emptying(outs: Iterable[int]) -> str:
    """The lines that empty the tensors ``outs`` (a statement's ``empties``), one a line."""
    return "".join(f"v[{o}].resize_(0)\n" for o in outs)


def emptied(st: Statement) -> str:
    """``st``'s code without its lines emptying ``st.empties``."""
    head = emptying(st.empties)
    if not st.code.startswith(head):
        raise ValueError(f"the statement does not begin by emptying {st.empties}: {st.code!r}")
    return st.code[len(head) :]


class UnsupportedKernel(Exception):
    """Raised by a factory for an instruction it cannot run (becomes OperatorMissingError)."""


class KernelContext:
    """What a factory knows about its instruction, and helpers to render arguments.

    ``values`` are the plan's values (descriptions), ``initial`` the method's values table
    as loading made it (constants, planned views, literals), ``dynamic`` the scalar values
    an instruction may replace. ``devices[j]`` is the device value ``j`` lives on (None for
    non-tensors), the caller's device for an unplanned input; ``record`` receives the bytes
    a copying kernel moves per call; ``options`` are the method's backend options (e.g.
    ``{"xnnpack": "torch"}``); ``method_name`` and ``where`` name the instruction in messages;
    ``unloaded`` collects what to run once the method is freed (:meth:`when_unloaded`).
    """

    def __init__(
        self,
        op_name: str,
        instruction: int,
        args: tuple[int, ...],
        values: tuple[p.EValue, ...],
        dynamic: frozenset[int],
        initial: list[Any],
        *,
        where: str = "",
        method_name: str = "",
        devices: Sequence[Device | None] = (),
        record: CallRecord | None = None,
        options: Mapping[str, Any] | None = None,
        unloaded: list[Callable[[], None]] | None = None,
    ) -> None:
        self.op_name = op_name
        self.instruction = instruction
        self.where = where or f"instructions[{instruction}]"  # path of the instruction in the file
        self.method_name = method_name
        self.args = args
        self.values = values
        self.dynamic = dynamic
        self.initial = initial
        self.devices = devices
        self.record = record
        self.options: Mapping[str, Any] = options or {}
        self.unloaded = unloaded
        self.env: dict[str, Any] = {}
        self._names = itertools.count()
        self._prefix = f"_i{instruction}_"

    def when_unloaded(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the method being loaded is freed (its loaded state collected),
        for what the statement made that a later load may take over (ExecuTorch's method
        of a delegate's payload, say). A context made outside a method's load never runs
        it."""
        if self.unloaded is not None:
            self.unloaded.append(fn)

    def device_of(self, index: int) -> Device | None:
        """The device value ``index`` lives on (None for a non-tensor, or when unknown)."""
        return self.devices[index] if 0 <= index < len(self.devices) else None

    # ---- names -----------------------------------------------------------------------
    def bind(self, obj: Any, hint: str = "c") -> str:
        """Bind ``obj`` to a fresh name in the statement's environment; return the name."""
        name = f"{self._prefix}{hint}{next(self._names)}"
        self.env[name] = obj
        return name

    def emit(
        self,
        code: str,
        writes: Iterable[int] = (),
        mutates: Iterable[int] | None = None,
        alias: Alias | None = None,
        outs: Iterable[int] = (),
        pure: bool = False,
        prune: Callable[[frozenset[int]], str] | None = None,
        instrumented: str | None = None,
        external: Callable[..., None] | None = None,
        sized: bool = False,
        empties: Iterable[int] = (),
        fresh: str | None = None,
        native: NativeCall | None = None,
    ) -> Statement:
        """The instruction's statement; ``mutates`` lists the tensor values it writes in
        place (leave it None only when unknown), ``outs`` those of them it does not read;
        ``instrumented``, ``external``, ``sized``, ``empties``, ``fresh`` and ``native``:
        see :class:`Statement`."""
        empties = tuple(empties)
        if empties and not sized:
            raise ValueError("a statement empties its outs only where its sizes follow")
        outs = tuple(outs)
        return Statement(
            code,
            dict(self.env),
            tuple(writes),
            None if mutates is None else tuple(mutates),
            alias,
            outs,
            pure,
            prune,
            self.reads(outs),
            instrumented,
            external,
            sized,
            empties,
            fresh if pure and len(outs) == 1 else None,
            native,
        )

    def referenced(self) -> tuple[int, ...]:
        """Every value the instruction's statement can read from ``v``: its tensor
        arguments (the items of tensor lists too) and the scalars among its arguments (or
        their int lists' items) that an instruction computes."""
        return referenced(self.values, self.args, self.dynamic)

    def reads(self, outs: Iterable[int] = ()) -> tuple[int, ...]:
        """:meth:`referenced`, less the values in ``outs`` (written, not read)."""
        found = self.referenced()
        skip = set(outs)
        return tuple(r for r in found if r not in skip) if skip else found

    def tensors_of(self, index: int) -> tuple[int, ...]:
        """The tensor values behind value ``index`` (itself, or a list's items)."""
        return tuple(tensor_items(self.values, index))

    def only_written(self, outs: Iterable[int], inputs: Iterable[int]) -> tuple[int, ...]:
        """``outs`` less every value the arguments ``inputs`` (value indices: the
        instruction's arguments it reads) also pass. A program may pass one value as an
        input and as an out (``relu.out(b, out=b)``, writing a constant in place): the
        kernel reads it, so it is no out of the statement (a value it only writes, which
        a fold at load would run into fresh memory); a statement with such a value is
        not pure and has nothing emptied before it runs."""
        read = {i for a in inputs for i in self.tensors_of(a)}
        return tuple(o for o in outs if o not in read)

    # ---- values ----------------------------------------------------------------------
    def value(self, index: int) -> p.EValue:
        return self.values[index]

    def is_literal(self, index: int) -> bool:
        """A scalar/list value whose content is fixed for the life of the method."""
        v = self.values[index]
        if isinstance(v, _TENSORISH):
            return False
        if isinstance(v, p.IntList):
            return index not in self.dynamic and all(i not in self.dynamic for i in v.items)
        return index not in self.dynamic

    def literal(self, index: int) -> Any:
        """The load-time content of a literal value (see :meth:`is_literal`)."""
        v = self.values[index]
        if isinstance(v, p.IntList):
            return tuple(self.initial[i] for i in v.items)
        return self.initial[index]

    def expr(self, index: int) -> str:
        """A Python expression that evaluates value ``index`` at run time."""
        v = self.values[index]
        if isinstance(v, p.Tensor):  # (the most common: first)
            return f"v[{index}]"
        if isinstance(v, p.Null):
            return "None"
        if isinstance(v, p.IntList):
            if self.is_literal(index):
                return repr(self.literal(index))
            return "[" + ", ".join(self._int_item(i) for i in v.items) + "]"
        if isinstance(v, p.TensorList):
            return "[" + ", ".join(f"v[{i}]" for i in v.items) + "]"
        if isinstance(v, p.OptionalTensorList):
            items = (
                "None" if i < 0 or isinstance(self.values[i], p.Null) else f"v[{i}]"
                for i in v.items
            )
            return "[" + ", ".join(items) + "]"
        if index in self.dynamic:
            return f"v[{index}]"
        return self.const(self.initial[index])

    def _int_item(self, i: int) -> str:
        return f"v[{i}]" if i in self.dynamic else repr(self.initial[i])

    def const(self, obj: Any) -> str:
        """Render a constant inline when its repr is exact, else bind it."""
        if obj is None or isinstance(obj, bool | int):
            return repr(obj)
        if isinstance(obj, float) and obj == obj and obj not in (float("inf"), float("-inf")):
            return repr(obj)
        return self.bind(obj)


KernelFactory = Callable[[KernelContext], Statement]

_KERNELS: dict[str, KernelFactory] = {}
_NAMESPACES: dict[str, Callable[[str], KernelFactory | None]] = {}
_LISTERS: dict[str, Callable[[], Iterable[str]]] = {}


def register(*names: str) -> Callable[[KernelFactory], KernelFactory]:
    """Register a factory under one or more qualified names (``ns::op.overload``)."""

    def deco(factory: KernelFactory) -> KernelFactory:
        for name in names:
            _KERNELS[name] = factory
        return factory

    return deco


def register_namespace(
    ns: str,
    resolver: Callable[[str], KernelFactory | None],
    names: Callable[[], Iterable[str]] | None = None,
) -> None:
    """A fallback for a whole namespace: ``resolver(qualified_name)`` finds a factory or
    None; ``names()``, when given, lists the qualified names it accepts (for
    :func:`operator_names`)."""
    _NAMESPACES[ns] = resolver
    if names is not None:
        _LISTERS[ns] = names


# tensors a factory made from a plan's literals alone, that no statement writes: like the
# literals, they belong to no method (id -> weak reference, checked by identity)
_literal_tensors: dict[int, weakref.ref[Any]] = {}


def literal_tensor(tensor: Any) -> Any:
    """Note ``tensor`` (made by a factory from literals of the plan alone, and only ever
    read by its statement) as owned by no method, so that a statement binding it may be
    kept for the next load of the same plan; returns ``tensor``."""
    key = id(tensor)

    def forget(_: weakref.ref[Any]) -> None:
        _literal_tensors.pop(key, None)

    _literal_tensors[key] = weakref.ref(tensor, forget)
    return tensor


def is_literal_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a tensor :func:`literal_tensor` noted (and still alive)."""
    ref = _literal_tensors.get(id(obj))
    return ref is not None and ref() is obj


def find_kernel(qualified_name: str) -> KernelFactory | None:
    """The factory for an operator: exact registrations first, then its namespace's
    resolver, then any operator torch knows by that name (``"*"``: custom ops a user
    registered with ``torch.library``, with their out variants)."""
    factory = _KERNELS.get(qualified_name)
    if factory is not None:
        return factory
    ns = qualified_name.split("::", 1)[0]
    resolver = _NAMESPACES.get(ns) or _NAMESPACES.get("*")
    return resolver(qualified_name) if resolver is not None else None


def registered_names() -> list[str]:
    """Operators with an explicit registration (namespace fallbacks not listed)."""
    return sorted(_KERNELS)


def operator_names() -> list[str]:
    """Every operator :func:`find_kernel` resolves by name, sorted, each once.

    Explicit registrations, and the names each namespace's resolver lists (``"*"``: those
    of namespaces without a resolver of their own). A default overload is one operator
    however it is spelled; it is listed the way ExecuTorch programs spell it: bare for
    ATen (``aten::sym_numel``, as the exporter writes an empty overload), ``.default``
    elsewhere (``executorch_prim::et_view.default``). Whether a kernel accepts a
    particular program's arguments is still decided when the method loads.
    """
    names = set(_KERNELS)
    for ns, lister in _LISTERS.items():
        for name in lister():
            if ns == "*" and name.split("::", 1)[0] in _NAMESPACES:
                continue
            names.add(name)
    for name in list(names):
        if name.endswith(".default"):
            bare = name[: -len(".default")]
            if bare in names:
                names.discard(name if name.startswith("aten::") else bare)
    return sorted(names)
