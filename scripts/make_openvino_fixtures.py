"""Write tests/fixtures/openvino/: a small MLP lowered to OpenVINO, with its inputs and the
eager model's outputs, for the tests that run without the openvino package (refusal, inspect)
and the one that loads a payload another OpenVINO (or machine) made.

Needs the openvino extra and nncf (ExecuTorch's OpenVINO exporter imports it):
    pip install -e '.[openvino]' nncf && python scripts/make_openvino_fixtures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from openvino_models import MLP, lower  # noqa: E402


def main() -> int:
    import openvino as ov

    out = ROOT / "tests" / "fixtures" / "openvino"
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    low = lower("mlp", MLP(), (torch.randn(2, 8),))
    (out / "mlp.pte").write_bytes(low.pte)
    x = torch.randn(2, 8)
    with torch.no_grad():
        y = low.model(x)
    precision = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    torch.save(
        {"inputs": [x], "outputs": [y], "openvino": ov.get_version(), "precision": precision},
        out / "mlp.io.pt",
    )
    print(f"wrote {out}/mlp.pte ({len(low.pte)} bytes) with OpenVINO {ov.get_version()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
