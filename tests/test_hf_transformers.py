"""ptexec as transformers' runner of ExecuTorch exports (``ptexec.hf.register()``).

Needs transformers >= 5.23 (``transformers.exporters``), which optimum-executorch 1.1.0's
pin excludes: it runs in the environment of the ``hf`` extra (see the README), and skips
elsewhere. Tiny random models from ``from_config``; the reference is transformers' own
runner on ExecuTorch's runtime for the same saved export, and eager PyTorch.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
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
from transformers.exporters.utils import decompose_for_generation  # noqa: E402

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


def test_register_replaces_quietly_and_leaves_other_warnings(
    registered: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Replacing ExecuTorch's runner is what register() is for: transformers' overwrite
    note is not logged, the runner is ptexec's, and the logger keeps no filter after."""
    from ptexec.hf.transformers_runner import PtexecModelRunner

    logger = logging.getLogger(auto.__name__)
    logger.propagate, was = True, logger.propagate
    try:
        with caplog.at_level(logging.WARNING, logger=auto.__name__):
            ptexec.hf.register()
            logger.warning("another note")
    finally:
        logger.propagate = was
    assert [r.getMessage() for r in caplog.records] == ["another note"]
    assert auto.EXPORT_BACKENDS["executorch"].runner is PtexecModelRunner
    assert not logger.filters


_MAX_CACHE = 16  # the static KV cache of the generation exports


def _seeded(cls: Any, config: Any) -> Any:
    torch.manual_seed(0)
    return cls(config).eval()


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
    return _seeded(t.LlamaForCausalLM, config)


def _qwen3() -> Any:
    t = transformers
    config = t.Qwen3Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    return _seeded(t.Qwen3ForCausalLM, config)


def _t5() -> Any:
    t = transformers
    config = t.T5Config(
        vocab_size=128,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return _seeded(t.T5ForConditionalGeneration, config)


def _whisper() -> Any:
    t = transformers
    config = t.WhisperConfig(
        vocab_size=128,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=16,
        max_source_positions=16,
        max_target_positions=32,
        decoder_start_token_id=1,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=1,
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )
    return _seeded(t.WhisperForConditionalGeneration, config)


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
    return _seeded(t.ViTForImageClassification, config)


def _cached_export(kind: str, model: Any, export: Callable[[], Any]) -> Path:
    """The directory ``export().save_pretrained`` wrote for ``model``, reused across runs: keyed
    by the model's config, the export ``kind`` and the exporting packages' versions (a
    transformers export of a tiny model takes minutes on two cores)."""
    import executorch  # noqa: F401  (its version is part of the key)

    key = json.dumps(
        [
            kind,
            model.config.to_dict(),
            transformers.__version__,
            importlib.metadata.version("executorch"),
            torch.__version__,
        ],
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / "ptexec-hf-exports"
    folder = root / f"{kind}-{digest}"
    if (folder / "export.json").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{kind}-"))
    export().save_pretrained(staging)
    try:
        staging.rename(folder)
    except OSError:  # another run saved it first
        shutil.rmtree(staging, ignore_errors=True)
    return folder


@pytest.fixture(scope="module")
def saved() -> dict[str, tuple[Path, Any, dict]]:
    """Each model exported by transformers' ExecuTorch exporter and saved, with its inputs."""
    out = {}
    g = torch.Generator().manual_seed(0)
    cases = {
        "llama": (_llama(), {"input_ids": torch.randint(0, 128, (1, 8), generator=g)}),
        "vit": (_vit(), {"pixel_values": torch.randn(1, 3, 32, 32, generator=g)}),
    }
    for name, (model, inputs) in cases.items():
        folder = _cached_export(
            name,
            model,
            lambda model=model, inputs=inputs: ExecutorchExporter().export(
                model, dict(inputs), ExecutorchConfig()
            ),
        )
        out[name] = (folder, model, inputs)
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


def test_inputs_that_are_not_dense_run_as_transformers_runs_them(registered: None) -> None:
    """A program that reads its inputs in place (``alloc_graph_input=False``) given a
    strided input (a transposed view): transformers' runner makes it contiguous, and so
    does ptexec's (it was refused), with the values of both and of eager."""
    model = _vit()
    g = torch.Generator().manual_seed(1)
    pixels = torch.randn(1, 3, 32, 32, generator=g)
    folder = _cached_export(
        "vit-unplanned-inputs",
        model,
        lambda: ExecutorchExporter().export(
            model, {"pixel_values": pixels}, ExecutorchConfig(alloc_graph_input=False)
        ),
    )
    strided = pixels.transpose(2, 3).contiguous().transpose(2, 3)  # the same values
    assert not strided.is_contiguous()
    ours = ExportedModel.from_pretrained(folder)
    assert isinstance(ours.runners["model"], ptexec.hf.transformers_runner.PtexecModelRunner)
    got = _main_output(ours(pixel_values=strided))
    with torch.no_grad():
        eager = _main_output(model(pixel_values=pixels))
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(_main_output(ours(pixel_values=pixels)), got, rtol=0, atol=0)


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


@pytest.mark.cuda
def test_exported_model_from_pretrained_on_cuda_matches_cpu(
    saved: dict[str, tuple[Path, Any, dict]], registered: None
) -> None:
    for name in ("llama", "vit"):
        folder, _, inputs = saved[name]
        want = _main_output(ExportedModel.from_pretrained(folder)(**inputs))
        model = ExportedModel.from_pretrained(folder, device="cuda")
        assert model.device.type == "cuda"
        got = _main_output(model(**inputs))
        assert got.is_cuda
        torch.testing.assert_close(got.cpu(), want, rtol=1e-3, atol=1e-4)


# ---- export_for_generation: prefill and decode components, greedy decoding ----------------

_STEPS = 6

_GENERATIVE: dict[str, tuple[Callable[[], Any], str]] = {
    "llama": (_llama, "input_ids"),
    "qwen3": (_qwen3, "input_ids"),
    "t5": (_t5, "input_ids"),
    "whisper": (_whisper, "input_features"),
}


def _generation_config(model: Any) -> Any:
    """Greedy, against a static cache of ``_MAX_CACHE`` slots: every step has the same shapes."""
    config = transformers.GenerationConfig(
        do_sample=False, cache_implementation="static", max_cache_len=_MAX_CACHE
    )
    config.pad_token_id = 0
    if model.config.is_encoder_decoder:
        config.decoder_start_token_id = model.config.decoder_start_token_id
    return config


@functools.cache
def _generation_case(name: str) -> tuple[Path, Path | None, Any, dict, dict]:
    """(generation export, encoder export or None, model, generate's inputs, the components'
    traced inputs) for ``name``. An encoder-decoder's encoder runs before ``generate``'s
    loop, outside the components: it is exported on its own with ``export``."""
    build, main = _GENERATIVE[name]
    model = build()
    g = torch.Generator().manual_seed(1)
    if main == "input_ids":
        inputs = {"input_ids": torch.tensor([[5, 9, 17, 33, 2]])}
    else:
        inputs = {main: torch.randn(1, model.config.num_mel_bins, 32, generator=g)}
    config = _generation_config(model)
    stages = decompose_for_generation(
        model, copy.deepcopy(inputs), generation_config=copy.deepcopy(config)
    )
    templates = {stage: stage_inputs for stage, (_, stage_inputs) in stages.items()}
    folder = _cached_export(
        f"{name}-generation",
        model,
        lambda: ExecutorchExporter().export_for_generation(
            model,
            copy.deepcopy(inputs),
            ExecutorchConfig(),
            generation_config=copy.deepcopy(config),
        ),
    )
    encoder = None
    if model.config.is_encoder_decoder:
        encoder = _cached_export(
            f"{name}-encoder",
            model,
            lambda: ExecutorchExporter().export(
                model.get_encoder(), {main: inputs[main]}, ExecutorchConfig()
            ),
        )
    return folder, encoder, model, inputs, templates


def _step_mask(template: Any, position: int) -> Any:
    """A one-token step's mask over the static cache, shaped as the traced one: slots up to
    ``position`` visible (a dict of masks, one per attention kind, for models that
    trace one, as Qwen3 does; this case has full attention only)."""
    if isinstance(template, dict):
        return {kind: _step_mask(mask, position) for kind, mask in template.items()}
    visible = torch.arange(_MAX_CACHE) <= position
    return visible[None, None, None, :].to(template.dtype)


def _greedy(
    exported: Any, templates: dict[str, dict], encoded: torch.Tensor | None = None
) -> tuple[list[int], torch.Tensor]:
    """``_STEPS`` greedy tokens from the ``prefill`` and ``decode`` components, the cache
    each call returns fed to the next; and the last step's logits."""
    prefill = copy.deepcopy(templates["prefill"])
    decode = templates["decode"]
    seq2seq = "decoder_input_ids" in decode
    ids, mask = (
        ("decoder_input_ids", "decoder_attention_mask")
        if seq2seq
        else ("input_ids", "attention_mask")
    )
    if encoded is not None:
        prefill["encoder_outputs"]["last_hidden_state"] = encoded
    out = exported.runners["prefill"](**prefill)
    position = prefill[ids].shape[1]
    tokens = []
    for _ in range(_STEPS):
        token = out.logits[:, -1].argmax(-1)
        tokens.append(int(token))
        step = dict(decode)
        step[ids] = token[:, None]
        if "position_ids" in step:
            step["position_ids"] = torch.tensor([[position]])
        step[mask] = _step_mask(decode[mask], position)
        step["past_key_values"] = out.past_key_values
        if seq2seq:
            step["encoder_outputs"] = prefill["encoder_outputs"]
        out = exported.runners["decode"](**step)
        position += 1
    return tokens, out.logits


@pytest.mark.parametrize("name", list(_GENERATIVE))
def test_generation_components_on_ptexec_match_executorch(
    name: str, request: pytest.FixtureRequest
) -> None:
    folder, encoder_folder, model, inputs, templates = _generation_case(name)
    main = _GENERATIVE[name][1]
    runs = {}
    for runtime, runner in (
        ("executorch", "ExecutorchModelRunner"),
        ("ptexec", "PtexecModelRunner"),
    ):
        if runtime == "ptexec":
            request.getfixturevalue("registered")
        exported = ExportedModel.from_pretrained(folder)
        assert set(exported.components) == {"prefill", "decode"}
        assert {type(r).__name__ for r in exported.runners.values()} == {runner}
        encoded = None
        if encoder_folder is not None:
            encoder = ExportedModel.from_pretrained(encoder_folder)
            assert type(encoder.runners["model"]).__name__ == runner
            encoded = encoder(**{main: inputs[main]}).last_hidden_state
            eager = templates["prefill"]["encoder_outputs"]["last_hidden_state"]
            torch.testing.assert_close(encoded, eager, rtol=1e-4, atol=1e-5)
        runs[runtime] = (*_greedy(exported, templates, encoded), encoded)
    (want, want_logits, want_encoded), (got, got_logits, got_encoded) = runs.values()
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-5)
    if encoder_folder is not None:
        torch.testing.assert_close(got_encoded, want_encoded, rtol=1e-4, atol=1e-5)
    else:  # decoder-only: the tokens of eager generate() as well
        config = _generation_config(model)
        config.max_new_tokens = config.min_new_tokens = _STEPS
        with torch.no_grad():
            eager = model.generate(**copy.deepcopy(inputs), generation_config=config)
        assert got == eager[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.mark.cuda
def test_generation_on_cuda_gives_the_cpu_tokens(registered: None) -> None:
    folder, _, _, _, templates = _generation_case("llama")
    want, want_logits = _greedy(ExportedModel.from_pretrained(folder), templates)
    exported = ExportedModel.from_pretrained(folder, device="cuda")
    assert exported.device.type == "cuda"
    got, got_logits = _greedy(exported, templates)  # host inputs are taken across
    assert got_logits.is_cuda
    assert got == want
    torch.testing.assert_close(got_logits.cpu(), want_logits, rtol=1e-3, atol=1e-4)
