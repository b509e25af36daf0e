#!/usr/bin/env python3
"""Tiny random image-text and audio-text models, exported the way users export them, cached.

Usage:
    python tests/multimodal_models.py [NAME ...]     # export (or find) them; print the paths

Each model is made with ``from_config`` (seeded, nothing downloaded) and saved as a Hugging
Face checkpoint directory with its processor (a byte-level BPE ``tokenizer.json`` trained in
memory, the image processor or feature extractor, a chat template), then exported by
optimum-executorch 1.1.0's ``main_export`` (what ``optimum-cli export executorch`` runs) with
task ``multimodal-text-to-text``: one ``.pte`` with ``token_embedding``, ``text_decoder``
and a ``vision_encoder`` / ``audio_encoder``, plus the metadata methods.

==================  ======================================================================
``llava``           LLaVA (CLIP vision tower 32x32 in 8x8 patches: 16 image rows; Llama
                    text model), recipe ``xnnpack``
``llava_portable``  the same model, recipe ``portable``
``voxtral``         Voxtral (Whisper-style audio encoder on 16 mel bins x 200 frames: 25
                    audio rows; Llama text model), recipe ``xnnpack``
==================  ======================================================================

optimum's exporter asks the processor for a sample input, which it downloads (an image, a
WAV file). Here no network is reached: for LLaVA the sample image is served from memory (the
exporter's own processor call runs on it); Voxtral's processor needs ``mistral-common`` and
a Tekken tokenizer, so its encoder's sample features (the shape the exporter uses: two
windows, dynamic batch up to 10) are given directly. Everything else is the exporter's path.

Files are cached under ``$PTEXEC_LLM_CACHE`` (default ``<temp dir>/ptexec-llm-<uid>``),
named by a digest of the model's definition and the torch, transformers, executorch and
optimum-executorch versions; the export runs in a child process, under a lock, and the
directory is renamed into place whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Bump when a model's making or its export changes.
RECIPE = 1
SEED = 0
MAX_LENGTH = 128
CORPUS = (
    "USER: What is in this picture? ASSISTANT: a cat sitting on a red mat. "
    "USER: What does the speaker say? ASSISTANT: hello there, how are you today. "
    "The quick brown fox jumps over the lazy dog. "
)
SPECIAL = ["<unk>", "<s>", "</s>", "<image>", "<audio>"]
BOS, EOS, IMAGE, AUDIO = 1, 2, 3, 4
VOCAB = 128
PROMPTS = {
    "image": "USER: <image>\nWhat is in this picture? ASSISTANT:",
    "audio": "USER: <audio>\nWhat does the speaker say? ASSISTANT:",
}
MODELS: dict[str, dict[str, Any]] = {
    "llava": {"kind": "image", "recipe": "xnnpack"},
    "llava_portable": {"kind": "image", "recipe": "portable"},
    "voxtral": {"kind": "audio", "recipe": "xnnpack"},
}
_TEMPLATE = (
    "{% for m in messages %}{{ m['role'].upper() }}: {% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<image>\n{% elif c['type'] == 'audio' %}<audio>\n{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %} {% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def cache_dir() -> Path:
    d = Path(
        os.environ.get("PTEXEC_LLM_CACHE")
        or Path(tempfile.gettempdir()) / f"ptexec-llm-{os.getuid()}"
    )
    d.mkdir(parents=True, exist_ok=True)
    return d


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("torch", "transformers", "executorch", "optimum-executorch")}


def cache_key(name: str) -> str:
    spec = {
        "name": name,
        "model": MODELS[name],
        "recipe": RECIPE,
        "seed": SEED,
        "max_length": MAX_LENGTH,
        "corpus": CORPUS,
        "special": SPECIAL,
        "versions": _versions(),
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def model_dir(name: str) -> Path:
    """The directory of ``name``: ``model.pte`` and ``checkpoint/`` (the Hugging Face
    checkpoint with its processor and ``tokenizer.json``), exported on first use."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    d = cache_dir()
    target = d / f"mm_{name}_{cache_key(name)}"
    if (target / "model.pte").exists():
        return target
    with _locked(d / f"{target.name}.lock"):
        if (target / "model.pte").exists():
            return target
        work = Path(tempfile.mkdtemp(dir=d))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", name, str(work)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
        if proc.returncode != 0 or not (work / "model.pte").exists():
            raise RuntimeError(
                f"exporting the {name} model failed (exit {proc.returncode}):\n"
                f"{proc.stderr[-4000:]}"
            )
        os.replace(work, target)
    return target


# --------------------------------------------------------------------------------------
# making and exporting (runs in a child process)


def _tokenizer() -> Any:
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=SPECIAL[0]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False)
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    if tok.get_vocab_size() > VOCAB:
        raise RuntimeError(f"the tokenizer has {tok.get_vocab_size()} ids, more than {VOCAB}")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL[BOS],
        eos_token=SPECIAL[EOS],
        unk_token=SPECIAL[0],
        pad_token=SPECIAL[0],
        chat_template=_TEMPLATE,
    )


def _text_config() -> Any:
    import transformers

    return transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=0,
        tie_word_embeddings=False,
        initializer_range=0.2,  # the default 0.02 makes a random model repeat one token
    )


def make_checkpoint(name: str, out: Path) -> None:
    """The seeded model and its processor as a Hugging Face checkpoint directory."""
    import torch
    import transformers as t

    kind = MODELS[name]["kind"]
    tok = _tokenizer()
    if kind == "image":
        vision = t.CLIPVisionConfig(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            projection_dim=32,
        )
        config = t.LlavaConfig(
            vision_config=vision,
            text_config=_text_config(),
            image_token_id=IMAGE,
            vision_feature_select_strategy="default",
            vision_feature_layer=-1,
            image_seq_length=16,
            initializer_range=0.2,
        )
        torch.manual_seed(SEED)
        model: Any = t.LlavaForConditionalGeneration(config).eval()
        images = t.CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        )
        processor: Any = t.LlavaProcessor(
            image_processor=images,
            tokenizer=tok,
            patch_size=8,
            vision_feature_select_strategy="default",
            chat_template=_TEMPLATE,
            image_token=SPECIAL[IMAGE],
            num_additional_image_tokens=1,
        )
        processor.save_pretrained(out)
        images.save_pretrained(out)  # preprocessor_config.json, as checkpoints have it
    else:
        audio = t.VoxtralEncoderConfig(
            hidden_size=16,
            intermediate_size=64,  # 4 frames of 16 per projector row
            num_hidden_layers=1,
            num_attention_heads=2,
            num_mel_bins=16,
            max_source_positions=100,
        )
        config = t.VoxtralConfig(
            audio_config=audio.to_dict(),
            text_config=_text_config().to_dict(),
            audio_token_id=AUDIO,
        )
        torch.manual_seed(SEED)
        model = t.VoxtralForConditionalGeneration(config).eval()
        t.WhisperFeatureExtractor(feature_size=16, chunk_length=2).save_pretrained(out)
        tok.save_pretrained(out)
    model.save_pretrained(out)


def _export(name: str, work: Path) -> None:
    import httpx
    import optimum.exporters.executorch.integrations as integrations
    import torch
    from optimum.exporters.executorch import main_export
    from PIL import Image

    checkpoint = work / "checkpoint"
    make_checkpoint(name, checkpoint)
    kind = MODELS[name]["kind"]
    if kind == "image":

        def sample_image(url: str, *args: Any, **kwargs: Any) -> httpx.Response:
            buf = io.BytesIO()
            Image.new("RGB", (40, 30), (120, 30, 200)).save(buf, format="PNG")
            return httpx.Response(200, content=buf.getvalue(), request=httpx.Request("GET", url))

        httpx.get = sample_image  # type: ignore[assignment]
    else:

        def sample_features(self: Any) -> tuple[torch.Tensor, dict[str, Any]]:
            batch = torch.export.Dim("enc_batch_size_dim", min=1, max=10)
            return torch.randn(2, 16, 200), {"input_features": {0: batch}}

        integrations.AudioExportableModule.prepare_export_inputs = sample_features  # type: ignore[method-assign]
    out = work / "export"
    main_export(
        str(checkpoint),
        "multimodal-text-to-text",
        MODELS[name]["recipe"],
        str(out),
        local_files_only=True,
        max_length=MAX_LENGTH,
    )
    os.replace(out / "model.pte", work / "model.pte")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        _export(argv[1], Path(argv[2]))
        return 0
    for name in argv or sorted(MODELS):
        print(model_dir(name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
