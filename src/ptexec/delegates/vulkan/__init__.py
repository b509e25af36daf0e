"""The Vulkan delegate: run ``VulkanBackend`` payloads with ATen, on the CPU or CUDA.

Importing this package registers the backend; the torch half (:mod:`.runtime`) is imported
when a method with a Vulkan delegate is loaded. :func:`describe_payload` (op name ->
count) needs no torch.
"""

from __future__ import annotations

from ...kernels.registry import Emission
from .. import DelegateContext, register_backend, register_describer
from .schema import describe_payload

__all__ = ["BACKEND_ID", "describe_payload"]

BACKEND_ID = "VulkanBackend"


register_describer(BACKEND_ID)(describe_payload)


@register_backend(BACKEND_ID)
def _prepare(ctx: DelegateContext) -> Emission:
    from .backend import prepare

    return prepare(ctx)
