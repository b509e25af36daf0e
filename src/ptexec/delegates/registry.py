"""The backend registry: the id a program's ``BackendDelegate`` names -> its backend.

A backend prepares each ``DelegateCall`` at method load (decoding and validating its
payload, building its torch steps) and returns a
:class:`~ptexec.kernels.registry.Statement`, exactly as a kernel does. A program that names
a backend with no registration fails at load with
:class:`~ptexec.errors.BackendUnavailableError` naming the id. ptexec's own backends are
registered in :mod:`ptexec.delegates`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..format import program as p
from ..kernels.registry import KernelContext, Statement

__all__ = [
    "Backend",
    "BackendFactory",
    "DelegateContext",
    "PayloadChecker",
    "PayloadDescriber",
    "Renewal",
    "Renewing",
    "backend_available",
    "backend_runner",
    "describe_payload",
    "find_backend",
    "payload_gaps",
    "register_backend",
    "registered_backends",
]


class Renewing(NamedTuple):
    """What a later load of a method gives the renewal its backend left for a call
    (:meth:`DelegateContext.renew_with`): the call's payload and the program's named data
    as this load reads them, the values table as loading made it (constants, planned
    views), and the list of what to run once the method is freed."""

    processed: memoryview
    named_data: Mapping[str, memoryview]
    initial: list[Any]
    unloaded: list[Callable[[], None]]


Renewal = Callable[[Renewing], Statement | None]


class DelegateContext(KernelContext):
    """A :class:`KernelContext` plus the delegate's payload and compile specs.

    ``processed`` is the delegate's data (a zero-copy view of the file), ``compile_specs``
    its key -> bytes options, ``named_data`` the program's (and external file's) named blobs.
    ``renewal``: what the backend left for later loads of the call (:meth:`renew_with`).
    """

    def __init__(
        self,
        backend_id: str,
        delegate_index: int,
        processed: memoryview,
        compile_specs: tuple[p.CompileSpec, ...],
        named_data: Mapping[str, memoryview],
        **kwargs: Any,
    ) -> None:
        super().__init__(op_name=f"delegate:{backend_id}", **kwargs)
        self.backend_id = backend_id
        self.delegate_index = delegate_index
        self.processed = processed
        self.compile_specs = compile_specs
        self.named_data = named_data
        self.renewal: Renewal | None = None

    def renew_with(self, renewal: Renewal) -> None:
        """Have later loads of this call (the same decoded plan, device placement and
        options, the backend registered as now) make its statement with ``renewal``
        instead of this backend's preparation: given what such a load reads
        (:class:`Renewing`), it returns the statement, or None to have the call prepared
        afresh. For a backend whose statement, but for what a renewal checks and binds,
        is a function of the call's place in the plan (its payload's bytes, the runner
        it loads, the memory it is handed)."""
        self.renewal = renewal

    def node_timed(self, plain: str, timed: str, args: str) -> str:
        """The instrumented statement of a delegate call ``plain(args)`` whose runner can
        report its nodes' times through ``timed(report, args)``: that, for tools whose
        hooks take node events (:attr:`~ptexec.engine.hooks.Hooks.nodes`), else the plain
        call (reporting may cost a runner more than the call: ExecuTorch's writes an
        ETDump)."""
        sep = ", " if args else ""
        return f"{timed}(h.node{sep}{args}) if h.nodes else {plain}({args})"

    def compile_spec(self, key: str) -> bytes | None:
        for spec in self.compile_specs:
            if spec.key == key:
                return spec.value
        return None


BackendFactory = Callable[[DelegateContext], Statement]
PayloadDescriber = Callable[[memoryview], dict[str, int]]
PayloadChecker = Callable[[memoryview], list[str]]
AvailabilityProbe = Callable[[], bool]


@dataclass(frozen=True)
class Backend:
    """A registered backend: ``prepare`` makes the statement of each of its
    ``DelegateCall``s at method load; ``describe``, when given, summarises a payload as node
    type -> count without loading anything; ``check``, when given, lists what of a payload
    ptexec does not run (empty: all of it), also without loading; ``runner`` says in a few
    words what runs the payload; ``available``, when given, says whether what runs it is
    there in this process (a package it needs installed), without loading it."""

    backend_id: str
    prepare: BackendFactory
    describe: PayloadDescriber | None = None
    check: PayloadChecker | None = None
    runner: str = ""
    available: AvailabilityProbe | None = None


_BACKENDS: dict[str, Backend] = {}


def register_backend(
    backend_id: str,
    prepare: BackendFactory,
    describe: PayloadDescriber | None = None,
    check: PayloadChecker | None = None,
    runner: str = "",
    available: AvailabilityProbe | None = None,
) -> None:
    """Register backend ``backend_id`` (replacing an earlier registration of that id)."""
    _BACKENDS[backend_id] = Backend(backend_id, prepare, describe, check, runner, available)


def find_backend(backend_id: str) -> BackendFactory | None:
    """The factory that prepares ``backend_id``'s calls (None: no such backend)."""
    backend = _BACKENDS.get(backend_id)
    return None if backend is None else backend.prepare


def registered_backends() -> list[str]:
    """The ids of every registered backend, sorted."""
    return sorted(_BACKENDS)


def backend_available(backend_id: str) -> bool:
    """Whether ``backend_id`` is registered and can run here (ExecuTorch's
    ``is_available``: a registered backend whose package is missing is not available)."""
    backend = _BACKENDS.get(backend_id)
    if backend is None:
        return False
    return backend.available is None or backend.available()


def describe_payload(backend_id: str, data: memoryview) -> dict[str, int] | None:
    """Node types and counts of a delegate payload (None when its backend has no describer)."""
    backend = _BACKENDS.get(backend_id)
    return None if backend is None or backend.describe is None else backend.describe(data)


def backend_runner(backend_id: str) -> str | None:
    """What runs ``backend_id``'s payloads, in a few words (None: no such backend)."""
    backend = _BACKENDS.get(backend_id)
    return None if backend is None else backend.runner or backend_id


def payload_gaps(backend_id: str, data: memoryview) -> list[str] | None:
    """What of a delegate payload ptexec does not run ([]: all of it; None: its backend
    cannot tell without loading it). A backend with no registration runs none of it."""
    backend = _BACKENDS.get(backend_id)
    if backend is None:
        return [f"no backend registered for {backend_id}"]
    return None if backend.check is None else backend.check(data)
