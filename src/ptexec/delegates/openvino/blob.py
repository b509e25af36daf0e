"""What ptexec can read of an OpenVINO payload without running it (no torch).

The payload is OpenVINO's own export of a compiled model; its layout belongs to the OpenVINO
plugin that wrote it. ptexec reads only the plain-text description the CPU plugin puts near
its start (``meta=...;ov=<version>;isa=<instruction set>``) to say, when OpenVINO refuses a
payload, which version and machine made it. The contents are checked by OpenVINO when it
imports the model, and the imported model's inputs and outputs are checked against the
program's tensors (:mod:`.runner`).
"""

from __future__ import annotations

import importlib.util
import io
from collections import Counter
from dataclasses import dataclass

__all__ = ["BlobInfo", "blob_info", "describe_payload", "installed", "payload_gaps"]

_SCAN = 512  # the description sits in the first bytes of the CPU plugin's export


@dataclass(frozen=True)
class BlobInfo:
    """What the payload says made it (None: it does not say)."""

    openvino_version: str | None
    isa: str | None


def blob_info(data: bytes | memoryview) -> BlobInfo:
    """The OpenVINO version and instruction set named in the payload's description."""
    head = bytes(data[:_SCAN])
    start = head.find(b"meta=")
    if start < 0:
        return BlobInfo(None, None)
    end = start
    while end < len(head) and 0x20 <= head[end] < 0x7F:
        end += 1
    fields: dict[str, str] = {}
    for item in head[start:end].decode("ascii").split(";"):
        key, sep, value = item.partition("=")
        if sep:
            fields[key] = value
    return BlobInfo(fields.get("ov"), fields.get("isa"))


def describe_payload(data: memoryview) -> dict[str, int]:
    """Layer types and counts of the compiled model (as OpenVINO's runtime model names
    them: ``FullyConnected``, ``Convolution``, ...), when ``openvino`` is installed and
    imports the payload on the CPU; otherwise what the payload says made it."""
    try:
        import openvino as ov
    except ImportError:
        info = blob_info(data)
        return {f"(a compiled model of OpenVINO {info.openvino_version or '?'})": 1}

    compiled = ov.Core().import_model(io.BytesIO(bytes(data)), "CPU")
    counts: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        if kind not in ("Input", "Output", "Parameter", "Result", "Const"):
            counts[kind] += 1
    return dict(counts)


def installed() -> bool:
    """Whether the ``openvino`` package, which runs every OpenVINO payload, is installed
    (found without importing it)."""
    return importlib.util.find_spec("openvino") is not None


def payload_gaps(data: memoryview) -> list[str]:
    """[] when the ``openvino`` package (which runs the whole compiled model) is installed;
    else that it is missing. Whether OpenVINO accepts the payload shows when it is loaded."""
    if not installed():
        return ["any of it: the openvino package is not installed (pip install 'ptexec[openvino]')"]
    return []
