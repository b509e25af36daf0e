"""Delegate backends, found by the id a program's ``BackendDelegate`` names.

A backend prepares each ``DelegateCall`` at method load (decoding and validating its
payload, building its torch steps) and returns an
:class:`~ptexec.kernels.registry.Emission`, exactly as a kernel does. A program that names
a backend with no registration fails at load with
:class:`~ptexec.errors.BackendUnavailableError` naming the id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..format import program as p
from ..kernels.registry import Emission, KernelContext

__all__ = [
    "BackendFactory",
    "DelegateContext",
    "describe_payload",
    "find_backend",
    "register_backend",
    "register_describer",
    "registered_backends",
]


class DelegateContext(KernelContext):
    """A :class:`KernelContext` plus the delegate's payload and compile specs.

    ``processed`` is the delegate's data (a zero-copy view of the file), ``compile_specs``
    its key -> bytes options, ``named_data`` the program's (and external file's) named blobs.
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

    def compile_spec(self, key: str) -> bytes | None:
        for spec in self.compile_specs:
            if spec.key == key:
                return spec.value
        return None


BackendFactory = Callable[[DelegateContext], Emission]

_BACKENDS: dict[str, BackendFactory] = {}


def register_backend(backend_id: str) -> Callable[[BackendFactory], BackendFactory]:
    """Register the factory that prepares ``DelegateCall``s of backend ``backend_id``."""

    def deco(factory: BackendFactory) -> BackendFactory:
        _BACKENDS[backend_id] = factory
        return factory

    return deco


def find_backend(backend_id: str) -> BackendFactory | None:
    return _BACKENDS.get(backend_id)


def registered_backends() -> list[str]:
    return sorted(_BACKENDS)


_DESCRIBERS: dict[str, Callable[[memoryview], dict[str, int]]] = {}


def register_describer(
    backend_id: str,
) -> Callable[[Callable[[memoryview], dict[str, int]]], Callable[[memoryview], dict[str, int]]]:
    """Register a function that summarises a backend's payload as node type -> count."""

    def deco(fn: Callable[[memoryview], dict[str, int]]) -> Callable[[memoryview], dict[str, int]]:
        _DESCRIBERS[backend_id] = fn
        return fn

    return deco


def describe_payload(backend_id: str, data: memoryview) -> dict[str, int] | None:
    """Node types and counts of a delegate payload (None when its backend has no describer)."""
    fn = _DESCRIBERS.get(backend_id)
    return None if fn is None else fn(data)


# Built-in backends register themselves on import (their torch code loads when a method
# that uses them is prepared).
from . import vulkan as _vulkan  # noqa: E402,F401
from . import xnnpack as _xnnpack  # noqa: E402,F401
