#!/usr/bin/env python3
"""Tiny speech-to-text and encoder-decoder programs, exported the way users export them.

Usage:
    python scripts/seq2seq_programs.py [VARIANT ...]   # export (or find) them; print paths
    python scripts/seq2seq_programs.py --list

Each variant is a directory holding ``model.pte`` and the Hugging Face checkpoint it was
exported from (``config.json``, ``generation_config.json``, the weights, the feature
extractor's ``preprocessor_config.json`` and a ``tokenizer.json`` whose vocabulary is the
model's), so the eager model is the reference for the same weights:

=======================  ==================================================================
``whisper_portable``     a tiny random ``WhisperForConditionalGeneration`` (``from_config``)
                         exported by optimum-executorch's ``main_export`` (task
                         ``automatic-speech-recognition``, recipe ``portable``): methods
                         ``encoder(features f32[1, 80, 3000])``, ``text_decoder(ids
                         i64[1, 1], encoder_hidden f32[1, 1500, d], cache_position
                         i64[1])`` with self- and cross-attention caches, ``sampler``
                         and the metadata methods (``decoder_start_token_id``, ...)
``whisper_xnnpack``      the same model, recipe ``xnnpack``
``t5_portable``          a tiny random ``T5ForConditionalGeneration`` in the same layout
                         (``encoder(ids i64[1, 48])``, ``text_decoder(ids i64[1, 1],
                         hidden f32[1, 48, d], cache_position i64[1])``), made from
                         optimum-executorch's own wrapper modules and lowered as its
                         ``portable`` recipe lowers them, with a static encoder length
                         (see below)
``t5_xnnpack``           the same T5 lowered with ``XnnpackPartitioner`` (optimum's
                         ``xnnpack`` recipe's partitioner; static encoder length as above)
``preprocessor``         ExecuTorch's ``WhisperAudioProcessor`` (80 mel bins, 16 kHz, up to
                         60 s of audio) exported by its own ``export_processor`` (XNNPACK):
                         ``forward(waveform f32[n]) -> f32[1, 80, 3000 * chunks]``
=======================  ==================================================================

Why T5 is not exported by ``main_export``: optimum-executorch 1.1.0 (with transformers
5.0.0rc1) exports T5's encoder with a dynamic length, but the decoder's cross-attention cache
is a static cache of ``max_seq_len`` positions (T5's config has no ``max_source_positions``),
so the cross-attention scores have ``max_seq_len`` columns while the encoder mask has the
dynamic length, and the export fails ("The size of tensor a (32) must match the size of
tensor b (s96)"). No configuration value makes the two agree for a dynamic length; with the
encoder's length fixed to the cache's, the shapes agree and the attention is exact (every
cached cross-attention position is a real encoder position), so ``t5_portable`` is exported
that way and takes exactly ``MAX_SEQ_LEN`` input ids.

Directories live under ``$PTEXEC_LLM_CACHE`` (default ``<temp dir>/ptexec-llm-<uid>``, shared
with ``llm_programs.py``), named by a digest of the configuration, the recipe and the
versions of executorch, optimum-executorch, transformers and torch; each export runs in a
child process, under a lock, and is renamed into place whole.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_programs

RECIPE = 1

VOCAB = 256
START_ID = 1  # <|startoftranscript|>: the tokenizer's BOS
EOS_ID = 2
# forced decoder tokens after the start token (as Whisper's language and task tokens)
FORCED = ((1, 10), (2, 11))
MAX_TARGET = 64
MAX_SEQ_LEN = 48  # the decoder's self-attention cache

WHISPER = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "max_target_positions": MAX_TARGET,
    "decoder_start_token_id": START_ID,
    "pad_token_id": 0,
    "bos_token_id": START_ID,
    "eos_token_id": EOS_ID,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}

T5 = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 64,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": EOS_ID,
    "relative_attention_num_buckets": 8,
}

VARIANTS: dict[str, dict[str, Any]] = {
    "whisper_portable": {"kind": "whisper", "recipe": "portable"},
    "whisper_xnnpack": {"kind": "whisper", "recipe": "xnnpack"},
    "t5_portable": {"kind": "t5"},
    "t5_xnnpack": {"kind": "t5", "recipe": "xnnpack"},
    "preprocessor": {"kind": "preprocessor", "max_audio_len": 60},
}


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for name in ("executorch", "optimum-executorch", "transformers", "torch"):
        try:
            out[name] = version(name)
        except Exception:
            out[name] = "-"
    return out


def cache_key(variant: str) -> str:
    spec = {
        "recipe": RECIPE,
        "variant": VARIANTS[variant],
        "whisper": WHISPER,
        "forced": FORCED,
        "max_seq_len": MAX_SEQ_LEN,
        "versions": _versions(),
    }
    if VARIANTS[variant]["kind"] == "t5":  # the other variants' keys stay as they were
        spec["t5"] = T5
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def program_dir(variant: str) -> Path:
    """The directory of ``variant`` (``model.pte`` and its checkpoint), exported on first use."""
    if variant not in VARIANTS:
        raise KeyError(f"unknown variant {variant!r}; expected one of {sorted(VARIANTS)}")
    d = llm_programs.cache_dir()
    target = d / f"seq2seq_{variant}_{cache_key(variant)}"
    if (target / "model.pte").exists():
        return target
    with _lock(d / f"{target.name}.lock"):
        if (target / "model.pte").exists():
            return target
        work = Path(tempfile.mkdtemp(dir=d))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", variant, str(work)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
        if proc.returncode != 0 or not (work / "model.pte").exists():
            raise RuntimeError(
                f"exporting {variant} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        os.replace(work, target)
    return target


def generation_config() -> dict[str, Any]:
    """What the checkpoint's ``generation_config.json`` says (start and forced tokens)."""
    return {
        "decoder_start_token_id": START_ID,
        "bos_token_id": START_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": 0,
        "forced_decoder_ids": [list(p) for p in FORCED],
        "max_length": MAX_TARGET,
    }


def _checkpoint(work: Path) -> Path:
    import torch
    import transformers as t

    ck = work / "checkpoint"
    torch.manual_seed(0)
    model = t.WhisperForConditionalGeneration(t.WhisperConfig(**WHISPER)).eval()
    with torch.no_grad():  # larger weights than the default init: tokens vary with the audio
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(ck)
    t.WhisperFeatureExtractor(feature_size=80).save_pretrained(ck)
    (ck / "generation_config.json").write_text(json.dumps(generation_config(), indent=1))
    model_spec = llm_programs.TinyLlama(vocab_size=VOCAB, bos_id=START_ID, eos_id=EOS_ID)
    llm_programs.make_tokenizer(ck / "tokenizer.json", model_spec)
    return ck


def _export_t5(work: Path, recipe: str = "portable") -> None:
    import torch
    import transformers as t
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from optimum.executorch.passes.remove_padding_idx_embedding_pass import (
        RemovePaddingIdxEmbeddingPass,
    )
    from optimum.exporters.executorch.integrations import (
        Seq2SeqLMDecoderExportableModuleWithStaticCache,
        Seq2SeqLMEncoderExportableModule,
    )
    from optimum.exporters.executorch.utils import save_config_to_constant_methods

    torch.manual_seed(0)
    model = t.T5ForConditionalGeneration(t.T5Config(**T5)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    model.save_pretrained(work)
    gen = {"decoder_start_token_id": 0, "eos_token_id": EOS_ID, "pad_token_id": 0}
    (work / "generation_config.json").write_text(json.dumps(gen, indent=1))
    spec = llm_programs.TinyLlama(vocab_size=VOCAB, bos_id=START_ID, eos_id=EOS_ID)
    llm_programs.make_tokenizer(work / "tokenizer.json", spec)
    ids = torch.ones((1, MAX_SEQ_LEN), dtype=torch.long)
    with torch.no_grad():
        encoder = Seq2SeqLMEncoderExportableModule(model.get_encoder()).eval()
        ep_encoder = torch.export.export(encoder, (ids,), strict=True)
        hidden = ep_encoder.module()(ids)
        decoder = Seq2SeqLMDecoderExportableModuleWithStaticCache(
            model, max_static_cache_length=MAX_SEQ_LEN, batch_size=1
        ).eval()
        example = (torch.tensor([[0]]), hidden, torch.tensor([0]))
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
            ep_decoder = torch.export.export(decoder, example, strict=True)
    metadata = save_config_to_constant_methods(model.config, get_max_seq_len=MAX_SEQ_LEN)
    partitioner: list[Any] = []
    if recipe == "xnnpack":  # as optimum's xnnpack recipe lowers: XNNPACK's partitioner
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    program = to_edge_transform_and_lower(
        {"encoder": ep_encoder, "text_decoder": ep_decoder},
        partitioner=partitioner,
        compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
        constant_methods=metadata,
        transform_passes=[RemovePaddingIdxEmbeddingPass()],
    ).to_executorch()
    with open(work / "model.pte", "wb") as f:
        program.write_to_file(f)


def _export_child(variant: str, work: Path) -> None:
    spec = VARIANTS[variant]
    if spec["kind"] == "t5":
        _export_t5(work, spec.get("recipe", "portable"))
        return
    if spec["kind"] == "preprocessor":
        from executorch.extension.audio.mel_spectrogram import export_processor

        export_processor(
            str(work / "model.pte"), "xnnpack", feature_size=80, max_audio_len=spec["max_audio_len"]
        )
        return
    from optimum.exporters.executorch import main_export

    ck = _checkpoint(work)
    main_export(
        str(ck),
        "automatic-speech-recognition",
        spec["recipe"],
        str(work / "out"),
        local_files_only=True,
        max_seq_len=MAX_SEQ_LEN,
    )
    os.replace(work / "out" / "model.pte", work / "model.pte")
    (work / "out").rmdir()
    for f in ck.iterdir():
        os.replace(f, work / f.name)
    ck.rmdir()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        _export_child(argv[1], Path(argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(VARIANTS))
        return 0
    for v in args.variants or list(VARIANTS):
        print(program_dir(v))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
