"""The XNNPACK delegate: run ``XnnpackBackend`` payloads with torch.

Importing this package registers the backend; the torch half (:mod:`.runtime`) is imported
when a method with an XNNPACK delegate is loaded. :func:`describe_payload` (node type ->
count) needs no torch.
"""

from __future__ import annotations

from ...kernels.registry import Emission
from .. import DelegateContext, register_backend, register_describer
from .schema import describe_payload

__all__ = ["BACKEND_ID", "describe_payload"]

BACKEND_ID = "XnnpackBackend"


register_describer(BACKEND_ID)(describe_payload)


@register_backend(BACKEND_ID)
def _prepare(ctx: DelegateContext) -> Emission:
    from .backend import prepare

    return prepare(ctx)
