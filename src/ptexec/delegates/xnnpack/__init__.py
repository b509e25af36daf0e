"""The XNNPACK delegate: run ``XnnpackBackend`` payloads with torch.

:mod:`ptexec.delegates` registers it under :data:`BACKEND_ID`. :func:`prepare` imports the
torch half (:mod:`.backend`, :mod:`.runtime`) when a method with an XNNPACK delegate is
loaded; :func:`describe_payload` (node type -> count) needs no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .node_types import payload_gaps
from .schema import describe_payload

if TYPE_CHECKING:
    from ...kernels.registry import Statement
    from ..registry import DelegateContext

__all__ = ["BACKEND_ID", "RUNNER", "describe_payload", "payload_gaps", "prepare"]

BACKEND_ID = "XnnpackBackend"
RUNNER = (
    "ExecuTorch's XNNPACK kernels where installed (CPU), else ptexec's torch runner"
    " (the load option xnnpack chooses)"
)


def prepare(ctx: DelegateContext) -> Statement:
    """The statement that runs one XNNPACK ``DelegateCall`` (see :mod:`.backend`)."""
    from .backend import prepare as prepare_payload  # torch code, loaded on first use

    return prepare_payload(ctx)
