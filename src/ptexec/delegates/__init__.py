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
    PayloadDescriber,
    describe_payload,
    find_backend,
    register_backend,
    registered_backends,
)

__all__ = [
    "Backend",
    "BackendFactory",
    "DelegateContext",
    "PayloadDescriber",
    "describe_payload",
    "find_backend",
    "register_backend",
    "registered_backends",
]

# ptexec's built-in backends: id, how its calls are prepared, how its payload is described
register_backend(openvino.BACKEND_ID, openvino.prepare, openvino.describe_payload)
register_backend(vulkan.BACKEND_ID, vulkan.prepare, vulkan.describe_payload)
register_backend(xnnpack.BACKEND_ID, xnnpack.prepare, xnnpack.describe_payload)
