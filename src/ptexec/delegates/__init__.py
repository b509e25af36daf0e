"""Delegate backends: the registry (:mod:`.registry`) and ptexec's built-in backends.

The built-in backends are registered below, one line each, and nowhere else. A backend
package exports the function that prepares a ``DelegateCall`` (importing its torch code
only when a method that uses it is loaded) and, optionally, one that describes a payload
without torch. Other code registers its own with :func:`register_backend` the same way.
"""

from __future__ import annotations

from . import openvino, vulkan, xnnpack
from .registry import (
    Backend,
    BackendFactory,
    DelegateContext,
    PayloadChecker,
    PayloadDescriber,
    Renewal,
    Renewing,
    backend_available,
    backend_runner,
    describe_payload,
    find_backend,
    payload_gaps,
    register_backend,
    registered_backends,
)

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

# ptexec's built-in backends: id, how its calls are prepared, how its payload is described,
# what of a payload it does not run, what runs it, and whether that is here (a backend
# without a probe always is)
for _backend in (openvino, vulkan, xnnpack):
    register_backend(
        _backend.BACKEND_ID,
        _backend.prepare,
        _backend.describe_payload,
        _backend.payload_gaps,
        _backend.RUNNER,
        getattr(_backend, "available", None),
    )
