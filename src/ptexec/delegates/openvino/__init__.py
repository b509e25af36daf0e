"""The OpenVINO delegate: run ``OpenvinoBackend`` payloads with the ``openvino`` runtime.

An OpenVINO payload is a model OpenVINO compiled for one device at export
(``CompiledModel.export_model()``). ptexec hands it to OpenVINO's own runtime (the optional
``openvino`` package: ``pip install 'ptexec[openvino]'``), on the device the program's
compile spec names, and exchanges tensors with it without copies where the layouts allow.
:mod:`ptexec.delegates` registers it under :data:`BACKEND_ID`; :func:`prepare` imports
:mod:`.runner` (torch and ``openvino``) when a method with an OpenVINO delegate is loaded,
and a missing package is a :class:`~ptexec.errors.BackendUnavailableError` then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .blob import describe_payload, payload_gaps
from .blob import installed as available

if TYPE_CHECKING:
    from ...kernels.registry import Statement
    from ..registry import DelegateContext

__all__ = ["BACKEND_ID", "RUNNER", "available", "describe_payload", "payload_gaps", "prepare"]

BACKEND_ID = "OpenvinoBackend"
RUNNER = "OpenVINO's runtime (the openvino package), on the device the blob was compiled for"


def prepare(ctx: DelegateContext) -> Statement:
    """The statement that runs one OpenVINO ``DelegateCall`` (see :mod:`.runner`)."""
    from .runner import prepare as prepare_payload  # torch and openvino, loaded on first use

    return prepare_payload(ctx)
