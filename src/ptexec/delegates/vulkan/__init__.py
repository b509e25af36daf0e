"""The Vulkan delegate: run ``VulkanBackend`` payloads with ATen, on the CPU or CUDA.

:mod:`ptexec.delegates` registers it under :data:`BACKEND_ID`. :func:`prepare` imports the
torch half (:mod:`.backend`, :mod:`.runtime`) when a method with a Vulkan delegate is
loaded; :func:`describe_payload` (op name -> count) needs no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .schema import describe_payload, payload_gaps

if TYPE_CHECKING:
    from ...kernels.registry import Statement
    from ..registry import DelegateContext

__all__ = ["BACKEND_ID", "RUNNER", "describe_payload", "payload_gaps", "prepare"]

BACKEND_ID = "VulkanBackend"
RUNNER = "ptexec's ATen runner (each op of the payload as its ATen op)"


def prepare(ctx: DelegateContext) -> Statement:
    """The statement that runs one Vulkan ``DelegateCall`` (see :mod:`.backend`)."""
    from .backend import prepare as prepare_payload  # torch code, loaded on first use

    return prepare_payload(ctx)
