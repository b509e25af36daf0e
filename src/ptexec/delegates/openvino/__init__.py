"""The OpenVINO delegate: run ``OpenvinoBackend`` payloads with the ``openvino`` runtime.

An OpenVINO payload is a model OpenVINO compiled for one device at export
(``CompiledModel.export_model()``). ptexec hands it to OpenVINO's own runtime (the optional
``openvino`` package: ``pip install 'ptexec[openvino]'``), on the device the program's
compile spec names, and exchanges tensors with it without copies where the layouts allow.
Importing this package registers the backend; :mod:`.runner` (which imports ``openvino``)
is imported when a method with an OpenVINO delegate is loaded, and a missing package is a
:class:`~ptexec.errors.BackendUnavailableError` then.
"""

from __future__ import annotations

from ...kernels.registry import Emission
from .. import DelegateContext, register_backend, register_describer
from .blob import describe_payload

__all__ = ["BACKEND_ID", "describe_payload"]

BACKEND_ID = "OpenvinoBackend"


register_describer(BACKEND_ID)(describe_payload)


@register_backend(BACKEND_ID)
def _prepare(ctx: DelegateContext) -> Emission:
    from .runner import prepare

    return prepare(ctx)
