"""ptexec as transformers' runner of ExecuTorch exports (``ptexec.hf.register()``).

Needs transformers >= 5.23 (``transformers.exporters``), which optimum-executorch 1.1.0's
pin excludes: it runs in the environment of the ``hf`` extra (see the README), and skips
elsewhere. Tiny random models from ``from_config``; the reference is transformers' own
runner on ExecuTorch's runtime for the same saved export, and eager PyTorch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.slow  # each export takes a minute or more on two cores

transformers = pytest.importorskip("transformers")
auto = pytest.importorskip("transformers.exporters.auto")
pytest.importorskip("executorch.exir")

from transformers.exporters import ExportedModel  # noqa: E402
from transformers.exporters.configs import ExecutorchConfig  # noqa: E402
from transformers.exporters.exporter_executorch import ExecutorchExporter  # noqa: E402

import ptexec.hf  # noqa: E402
from ptexec.errors import DeviceUnavailableError  # noqa: E402


@pytest.fixture
def registered() -> Any:
    """ptexec registered for ``executorch`` during the test, transformers' own after it."""
    saved = auto.EXPORT_BACKENDS["executorch"]
    ptexec.hf.register()
    try:
        yield
    finally:
        auto.EXPORT_BACKENDS["executorch"] = saved


def _llama() -> Any:
    t = transformers
    config = t.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return t.LlamaForCausalLM(config).eval()


def _vit() -> Any:
    t = transformers
    config = t.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=5,
    )
    torch.manual_seed(0)
    return t.ViTForImageClassification(config).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any, dict]]:
    """Each model exported by transformers' ExecuTorch exporter and saved, with its inputs."""
    root = tmp_path_factory.mktemp("transformers")
    out = {}
    g = torch.Generator().manual_seed(0)
    cases = {
        "llama": (_llama(), {"input_ids": torch.randint(0, 128, (1, 8), generator=g)}),
        "vit": (_vit(), {"pixel_values": torch.randn(1, 3, 32, 32, generator=g)}),
    }
    for name, (model, inputs) in cases.items():
        exported = ExecutorchExporter().export(model, dict(inputs), ExecutorchConfig())
        exported.save_pretrained(root / name)
        out[name] = (root / name, model, inputs)
    return out


def _main_output(result: Any) -> torch.Tensor:
    return result.logits


@pytest.mark.parametrize("name", ["llama", "vit"])
def test_exported_model_on_ptexec_matches_executorch_and_eager(
    saved: dict[str, tuple[Path, Any, dict]], name: str, request: pytest.FixtureRequest
) -> None:
    folder, model, inputs = saved[name]
    reference = ExportedModel.from_pretrained(folder)  # transformers' runner, ExecuTorch
    assert type(reference.runners["model"]).__name__ == "ExecutorchModelRunner"
    want = _main_output(reference(**inputs))
    request.getfixturevalue("registered")
    ours = ExportedModel.from_pretrained(folder)
    runner = ours.runners["model"]
    assert isinstance(runner, ptexec.hf.transformers_runner.PtexecModelRunner)
    assert ours.device == torch.device("cpu")
    got = ours(**inputs)
    assert type(got) is type(reference(**inputs))  # the model's own output class
    torch.testing.assert_close(_main_output(got), want, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        eager = _main_output(model(**inputs))
    torch.testing.assert_close(_main_output(got), eager, rtol=1e-4, atol=1e-5)
    if name == "llama":
        assert _main_output(got).argmax(-1).tolist() == want.argmax(-1).tolist()


def test_share_outputs_gives_views_and_copies_otherwise(
    saved: dict[str, tuple[Path, Any, dict]], registered: None
) -> None:
    folder, _, inputs = saved["llama"]
    model = ExportedModel.from_pretrained(folder)
    a = _main_output(model(share_outputs=True, **inputs))
    b = _main_output(model(share_outputs=True, **inputs))
    assert a.data_ptr() == b.data_ptr()  # the method's own memory, no copy
    c = _main_output(model(**inputs))
    d = _main_output(model(**inputs))
    assert c.data_ptr() != d.data_ptr()
    torch.testing.assert_close(c, d, rtol=0, atol=0)


def test_to_device_reaches_ptexec(
    saved: dict[str, tuple[Path, Any, dict]], registered: None, tmp_path: Path
) -> None:
    folder, _, inputs = saved["vit"]
    model = ExportedModel.from_pretrained(folder, device="cpu")
    assert model.device == torch.device("cpu")
    if torch.cuda.is_available():
        got = _main_output(model.to("cuda")(**inputs))  # host inputs are taken across
        assert got.is_cuda
        want = _main_output(model.to("cpu")(**inputs))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-3, atol=1e-4)
    else:
        with pytest.raises(DeviceUnavailableError, match="cuda"):
            model.to("cuda")
    # saved again from a program ptexec read: the file is copied as it was
    model.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "model.pte").read_bytes() == (folder / "model.pte").read_bytes()
