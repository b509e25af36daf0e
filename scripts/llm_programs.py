#!/usr/bin/env python3
"""Tiny Llama programs exported the way users export LLMs, cached on disk.

Usage:
    python scripts/llm_programs.py [VARIANT ...]      # export (or find) the programs and
                                                      # the tokenizer; print their paths
    python scripts/llm_programs.py --list

Each variant is a ``.pte`` made by ExecuTorch's own LLM exporter
(``executorch.extension.llm.export``: an ``LlmConfig`` passed to its ``export_llama``), from
a tiny Llama configuration and a seeded checkpoint. The checkpoint matters: without one the
exporter leaves the RMSNorm weights uninitialised and every runtime produces NaN. Every
variant has a KV cache, ExecuTorch's custom SDPA op and the metadata methods the exporter
writes (``get_max_seq_len``, ``get_max_context_len``, ``get_vocab_size``, ``get_n_layers``,
``use_kv_cache``, ``use_sdpa_with_kv_cache``, ``enable_dynamic_shape``, plus ``get_bos_id``
and ``get_eos_ids`` from the metadata string, as a user passes them):

========================  ==================================================================
``portable``              no delegate, dynamic-shape prefill (``tokens [1, <=max_seq_len-1]``)
``portable_static``       no delegate, one token a call (``enable_dynamic_shape=False``)
``xnnpack``               XNNPACK fp32, dynamic-shape prefill
``xnnpack_static``        XNNPACK fp32, one token a call
``xnnpack_8da4w``         XNNPACK, 8-bit dynamic activations and 4-bit grouped weights
``portable_chunked``      no delegate, dynamic prefill of at most 15 tokens a call over the
                          128-token context (``max_seq_length`` 16)
``portable_quant``        no delegate, 4-bit grouped embedding (``embedding_4bit``) and an
                          int8 KV cache (per-token ``quantize_per_token`` and
                          ``llama::custom_quantized_sdpa``)
``hf_xnnpack``            the same model as a Hugging Face ``LlamaForCausalLM`` exported by
                          optimum-executorch (recipe ``xnnpack``, custom SDPA and KV cache):
                          ``forward(input_ids [1, seq], cache_position [seq])`` returning
                          ``[1, seq, vocab]`` logits; needs ``optimum-executorch``
========================  ==================================================================

:func:`program_path` returns the file for a variant, exporting it once per machine: files
live under ``$PTEXEC_LLM_CACHE`` (default ``<temp dir>/ptexec-llm-<uid>``), named by a digest
of the model configuration, the variant's options and the executorch and torch versions.
The export runs in a child process (ExecuTorch's exporter registers operators and libraries
in the process that runs it); a lock file keeps two processes from exporting the same key at
once, and the result is renamed into place, so a reader never sees half a file.

:func:`make_tokenizer` writes a Hugging Face ``tokenizer.json`` (a byte-level BPE trained in
memory with the ``tokenizers`` library) whose vocabulary is exactly the model's, with the
special tokens at the ids the programs name as BOS and EOS; :func:`tokenizer_path` writes it
once per machine beside the programs (in a directory of its own, with its
``tokenizer_config.json``), so every printed program runs with
``ptexec generate PROGRAM --tokenizer TOKENIZER --prompt ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Bump when the export recipe or the checkpoint's making changes.
RECIPE = 2
CACHE_ENV = "PTEXEC_LLM_CACHE"


@dataclass(frozen=True)
class TinyLlama:
    """The model configuration (ExecuTorch's ``ModelArgs`` names) and its seed."""

    dim: int = 128
    n_layers: int = 3
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention: two query heads share a key/value head
    vocab_size: int = 512
    hidden_dim: int = 256
    norm_eps: float = 1e-5
    max_seq_len: int = 128
    max_context_len: int = 128
    seed: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def params(self) -> dict[str, Any]:
        """The ``params.json`` content the exporter reads."""
        return {
            "dim": self.dim,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "vocab_size": self.vocab_size,
            "hidden_dim": self.hidden_dim,
            "norm_eps": self.norm_eps,
        }


@dataclass(frozen=True)
class Variant:
    """How one program is exported."""

    dynamic: bool = True
    xnnpack: bool = False
    qmode: str | None = None
    group_size: int | None = None
    embedding_quantize: str | None = None
    quantize_kv_cache: bool = False
    max_seq_len: int | None = None  # tokens one call may take, when below the context
    exporter: str = "executorch"  # or "optimum": Hugging Face's optimum-executorch


# Named model shapes (``--model``). "tiny" is the default everywhere; "smollm2-135m" has the
# shape of SmolLM2-135M (random seeded weights, untied embeddings, ExecuTorch's default RoPE).
_SMOLLM2_135M = TinyLlama(
    dim=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    vocab_size=49152,
    hidden_dim=1536,
    max_seq_len=512,
    max_context_len=512,
)
MODELS: dict[str, TinyLlama] = {
    "tiny": TinyLlama(),
    "smollm2-135m": _SMOLLM2_135M,
    # SmolLM2-135M's layer shape with 4 of its 30 layers: its per-layer costs, exported
    # in minutes rather than an hour
    "smollm2-4l": dataclasses.replace(_SMOLLM2_135M, n_layers=4),
}

_DEFAULT = asdict(Variant())

VARIANTS: dict[str, Variant] = {
    "portable": Variant(),
    "portable_static": Variant(dynamic=False),
    "xnnpack": Variant(xnnpack=True),
    "xnnpack_static": Variant(dynamic=False, xnnpack=True),
    "xnnpack_8da4w": Variant(xnnpack=True, qmode="8da4w", group_size=32),
    "portable_chunked": Variant(max_seq_len=16),
    "portable_quant": Variant(embedding_quantize="4,32", quantize_kv_cache=True),
    "hf_xnnpack": Variant(xnnpack=True, exporter="optimum"),
}

# Special tokens of the tokenizer, at ids 0, 1, 2 (``TinyLlama.bos_id``/``eos_id`` name them).
SPECIAL_TOKENS = ("<unk>", "<|begin_of_text|>", "<|end_of_text|>")

# What the tokenizer is trained on (and what tests and benchmarks prompt with).
CORPUS = """\
Once upon a time there was a little robot who lived in a quiet town by the sea. Every
morning the robot walked along the shore and counted the waves, the boats and the birds.
One day a storm came over the hills, and the people of the town ran to their houses. The
robot stayed on the beach, because it wanted to see how the waves would change. The wind
was strong and the rain was cold, but the robot was not afraid. When the storm was over,
the sun came out again and the children came back to play. They asked the robot what it
had seen, and it told them about the great grey clouds, the white foam on the water and
the lightning that drew bright lines across the sky. The children laughed and said that
they wanted to be as brave as the robot. From that day on they walked with it along the
shore every morning, counting the waves, the boats and the birds together.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 2024. Punctuation: , . ; : ! ? ( ) [ ] { } " '.
In the old library at the end of the street, a girl named Mira found a map drawn on thin
yellow paper. It showed a path through the forest, over a bridge and up to a tower where,
the map said, a lamp had burned for a thousand years. Mira packed bread, cheese, a bottle
of water and her grandfather's compass. She followed the path past tall pines and silver
birches, listening to owls, frogs and the distant river. At noon she reached the bridge,
which swayed and creaked, and at sunset she climbed the tower's spiral stairs. At the top
there was no lamp at all, only a window facing west, and through it the whole valley glowed
gold and purple. Mira understood that the light the map promised was the view itself.
Questions people ask a computer: What is the weather like today? How far away is the moon?
Which planets have rings? Why is the sky blue? Could you write a short poem about autumn?
Please translate this sentence, summarize that article, and explain the result in detail.
"""


def executorch_version() -> str:
    from executorch.version import __version__

    return str(__version__)


def cache_dir() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        d = Path(override)
    else:
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        d = Path(tempfile.gettempdir()) / f"ptexec-llm-{uid}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def cache_key(variant: str, model: TinyLlama = TinyLlama()) -> str:
    """Digest of everything the program depends on."""
    import torch

    spec = {
        "recipe": RECIPE,
        "model": asdict(model),
        # only the options a variant sets: adding an option keeps the other variants' keys
        "variant": {k: v for k, v in asdict(VARIANTS[variant]).items() if v != _DEFAULT[k]},
        "executorch": executorch_version(),
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def program_path(variant: str, model: TinyLlama = TinyLlama()) -> Path:
    """The ``.pte`` of ``variant`` (a key of :data:`VARIANTS`), exported on first use."""
    if variant not in VARIANTS:
        raise KeyError(f"unknown variant {variant!r}; expected one of {sorted(VARIANTS)}")
    d = cache_dir()
    target = d / f"llama_{variant}_{cache_key(variant, model)}.pte"
    if target.exists():
        return target
    with _locked(d / f"{target.name}.lock"):
        if target.exists():  # another process exported it while we waited
            return target
        with tempfile.TemporaryDirectory(dir=d) as work:
            spec = {"variant": variant, "model": asdict(model), "work": work}
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                capture_output=True,
                text=True,
                check=False,
            )
            made = Path(work) / "model.pte"
            if proc.returncode != 0 or not made.exists():
                raise RuntimeError(
                    f"exporting the {variant} Llama program failed (exit {proc.returncode}):\n"
                    f"{proc.stderr[-4000:]}"
                )
            os.replace(made, target)
    return target


# --------------------------------------------------------------------------------------
# the export (runs in a child process)


def _checkpoint(model: TinyLlama, path: Path) -> None:
    """A seeded state dict for ExecuTorch's Llama: linear weights ~ U(+-1/sqrt(fan_in)),
    embeddings ~ N(0, 1), RMSNorm weights 1 + N(0, 0.1)."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    args = ModelArgs(
        max_seq_len=model.max_seq_len, max_context_len=model.max_context_len, **model.params()
    )
    net = construct_transformer(args)
    g = torch.Generator().manual_seed(model.seed)
    state: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, param in net.named_parameters():
            if "norm" in name:
                value = 1.0 + 0.1 * torch.randn(param.shape, generator=g)
            elif param.dim() == 2 and "embeddings" in name:
                value = torch.randn(param.shape, generator=g)
            else:
                bound = 1.0 / max(param.shape[-1], 1) ** 0.5
                value = (torch.rand(param.shape, generator=g) * 2 - 1) * bound
            state[name] = value.to(param.dtype).contiguous()
    torch.save(state, path)


def _export_optimum(model: TinyLlama, variant: Variant, work: Path) -> None:
    """The model as a Hugging Face checkpoint directory, exported by optimum-executorch."""
    import torch
    from optimum.exporters.executorch import main_export
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=model.vocab_size,
        hidden_size=model.dim,
        intermediate_size=model.hidden_dim,
        num_hidden_layers=model.n_layers,
        num_attention_heads=model.n_heads,
        num_key_value_heads=model.n_kv_heads,
        max_position_embeddings=model.max_context_len,
        rms_norm_eps=model.norm_eps,
        bos_token_id=model.bos_id,
        eos_token_id=model.eos_id,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    torch.manual_seed(model.seed)
    LlamaForCausalLM(config).save_pretrained(work / "hf_model")
    main_export(
        str(work / "hf_model"),
        "text-generation",
        "xnnpack" if variant.xnnpack else "portable",
        str(work / "out"),
        local_files_only=True,
        use_custom_sdpa=True,
        use_custom_kv_cache=True,
        max_seq_len=model.max_context_len,
    )
    os.replace(work / "out" / "model.pte", work / "model.pte")


def _export_child(spec: dict[str, Any]) -> None:
    model = TinyLlama(**spec["model"])
    variant = VARIANTS[spec["variant"]]
    work = Path(spec["work"])
    if variant.exporter == "optimum":
        _export_optimum(model, variant, work)
    else:
        _export_llama(model, variant, work)


def _export_llama(model: TinyLlama, variant: Variant, work: Path) -> None:
    from executorch.extension.llm.export.config.llm_config import LlmConfig
    from executorch.extension.llm.export.export_llm import export_llama

    _checkpoint(model, work / "checkpoint.pth")
    (work / "params.json").write_text(json.dumps(model.params()))

    config = LlmConfig()
    config.base.checkpoint = str(work / "checkpoint.pth")
    config.base.params = str(work / "params.json")
    config.base.metadata = json.dumps({"get_bos_id": model.bos_id, "get_eos_ids": [model.eos_id]})
    config.model.use_kv_cache = True
    config.model.use_sdpa_with_kv_cache = True
    config.model.enable_dynamic_shape = variant.dynamic
    config.export.max_seq_length = variant.max_seq_len or model.max_seq_len
    config.export.max_context_length = model.max_context_len
    config.export.output_dir = str(work)
    config.export.output_name = "model.pte"
    if variant.qmode is not None:
        config.quantization.qmode = variant.qmode
        config.quantization.group_size = variant.group_size
    if variant.embedding_quantize is not None:
        config.quantization.embedding_quantize = variant.embedding_quantize
    config.model.quantize_kv_cache = variant.quantize_kv_cache
    if variant.xnnpack:
        config.backend.xnnpack.enabled = True
        config.backend.xnnpack.extended_ops = True
    written = Path(export_llama(config))
    if written.resolve() != (work / "model.pte").resolve():
        os.replace(written, work / "model.pte")


# --------------------------------------------------------------------------------------
# tokenizer


def make_tokenizer(path: str | os.PathLike[str], model: TinyLlama = TinyLlama()) -> Path:
    """Write a byte-level BPE ``tokenizer.json`` with exactly ``model.vocab_size`` tokens
    (the special tokens first: ``<unk>``, BOS, EOS) and a ``tokenizer_config.json`` beside
    it naming BOS and EOS, as a Hugging Face checkpoint directory has them. Past the few
    hundred tokens the corpus trains, the vocabulary is filled with added tokens
    ``<|fill_ID|>``.

    The alphabet is the corpus's characters (ASCII), not all 256 bytes, so every token is
    whole text: ExecuTorch's runner bindings pass each piece to a Python callback as
    ``str`` and fail on a token that is part of a multi-byte character."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[0]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=model.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    # The corpus yields a few hundred merges; a larger vocabulary (a real model's) is filled
    # up with plain added tokens of whole text, after the trained ones.
    trained = tok.get_vocab_size()
    if trained < model.vocab_size:
        tok.add_tokens([f"<|fill_{i}|>" for i in range(trained, model.vocab_size)])
    if tok.get_vocab_size() != model.vocab_size:
        raise RuntimeError(
            f"the trained tokenizer has {tok.get_vocab_size()} tokens, expected {model.vocab_size}"
        )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    config = {
        "bos_token": SPECIAL_TOKENS[model.bos_id],
        "eos_token": SPECIAL_TOKENS[model.eos_id],
    }
    (out.parent / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def tokenizer_path(model: TinyLlama = TinyLlama()) -> Path:
    """The programs' ``tokenizer.json`` (see :func:`make_tokenizer`), written on first use
    into a directory of the cache named by a digest of what it depends on."""
    import tokenizers

    spec = {
        "model": asdict(model),
        "special_tokens": SPECIAL_TOKENS,
        "corpus": hashlib.sha256(CORPUS.encode()).hexdigest(),
        "tokenizers": tokenizers.__version__,
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
    d = cache_dir()
    target = d / f"tokenizer_{key}" / "tokenizer.json"
    if target.exists():
        return target
    with _locked(d / f"tokenizer_{key}.lock"):
        if target.exists():
            return target
        work = Path(tempfile.mkdtemp(dir=d))
        make_tokenizer(work / "tokenizer.json", model)
        os.replace(work, target.parent)  # the directory appears whole, or not at all
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help=f"variants (default: all of {list(VARIANTS)})")
    parser.add_argument("--list", action="store_true", help="list the variants")
    parser.add_argument(
        "--model", default="tiny", choices=list(MODELS), help="model shape (default tiny)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _export_child(json.loads(args.child))
        return 0
    if args.list:
        for name, v in VARIANTS.items():
            print(f"{name:18} {v}")
        return 0
    model = MODELS[args.model]
    paths = [program_path(name, model) for name in args.variants or list(VARIANTS)]
    for name, path in zip(args.variants or list(VARIANTS), paths, strict=True):
        print(f"{name:18} {path}")
    tokenizer = tokenizer_path(model)
    print(f"{'tokenizer':18} {tokenizer}")
    print(f"try: ptexec generate {paths[0]} --tokenizer {tokenizer} --prompt 'Once upon a time'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
