"""Images and audio into an LLM: ``MultimodalRunner`` and the program side it drives.

A multimodal program has three kinds of method (:class:`MultimodalMethods` finds them by
name, in the conventions exporters write):

=====================  ==================================================================
embedding              token ids ``int64[1, n]`` -> embeddings ``[1, n, hidden]``:
                       ``token_embedding`` (ExecuTorch's runner, optimum-executorch),
                       ``token_embeddings`` (ExecuTorch's earlier name), ``embed_text``
decoder                embeddings and positions -> logits: ``text_decoder`` (ExecuTorch,
                       optimum-executorch), ``decoder`` (earlier), or gemma-style
                       ``prefill`` with a ``decode`` method for the one-token steps
encoders               ``vision_encoder`` (ExecuTorch, optimum-executorch) or
                       ``image_encoder``: pixels -> embeddings; ``audio_encoder``:
                       features ``[batch, bins, frames]`` -> embeddings
=====================  ==================================================================

The decoder's inputs are the embeddings (float, ``[1, seq, hidden]``) and a position input,
in either order: the cache positions ``int64[seq]`` (Hugging Face exports) or the start
position ``int64[1]``. Metadata methods name the rest: ``get_max_seq_len`` (required, as for
text programs), ``get_eos_id(s)``, ``get_bos_id``, the placeholder ids
``vision_token_id``/``image_token_id`` and ``audio_token_id`` (optimum-executorch writes
them), and preprocessing fields when the exporter kept them (``image_mean``,
``image_std``, ``rescale_factor``, ...).

How a prompt becomes the decoder's embeddings (the runner's rule):

1. each input becomes a part in order: text (encoded) and token ids give ids, with
   ``config.num_bos`` BOS ids beginning the prompt and ``num_eos`` EOS ids ending it, as
   the text runner puts them (before media that come first, after media that come
   last); an image or audio
   input runs its encoder and gives its embedding rows;
2. when the ids hold placeholders of a modality that hold exactly its inputs
   (:func:`media_slots`), the k-th image (audio) fills the k-th: a run of placeholders as
   long as the next inputs' embeddings together is replaced row for row (what a Hugging
   Face processor writes), else each placeholder of the run is one input, widened to all
   of its rows (a prompt that says ``<image>``, or ``<image><image>`` for two). Without
   placeholders an image (audio) goes where it is in the input list (ExecuTorch's runner
   convention: ``[text, image, text]``). Any other mismatch raises;
3. the embeddings are prefilled in chunks the decoder takes, and decoding runs the text
   runner's loop, each step embedding the sampled token and calling the decoder.

Logits processors see the prompt as transformers' ``input_ids`` hold it: the modality's
placeholder id at every embedding row (0 when the program names none).

Images: an image input holding floats of the encoder's size is taken as the processor's
``pixel_values`` (what ``generate_hf`` passes); uint8 pixels are resized and normalised by
:class:`~ptexec.llm.image.ImagePreprocessor` with the settings of the runner's
``processor`` directory, else the program's metadata; an image that needs preprocessing
the runner has no settings for raises (there is no silent default). Audio: an audio input
holds features (``make_audio_input``); raw audio (``make_raw_audio_input``, samples at the
feature extractor's rate) goes through :func:`audio_features`, the one boundary to the
feature code.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import GenerationError
from .config import GenerationConfig, _now_ms
from .decoder import (
    LlmMetadata,
    TextDecoder,
    constant_method,
    constant_outputs,
    handed_logits,
    read_metadata,
    token_ids,
)
from .image import ImagePreprocessor
from .inputs import MultimodalInput, make_audio_input, make_image_input, make_token_input
from .runner import StatsCallback, TokenCallback, _Runner

if TYPE_CHECKING:
    from ..program import Program

__all__ = [
    "Media",
    "MultimodalDecoder",
    "MultimodalMethods",
    "MultimodalRunner",
    "audio_features",
    "generate_hf",
    "generate_text_hf",
    "hf_inputs",
    "media_slots",
    "placeholder_runs",
]

_EMBEDDING = ("token_embedding", "token_embeddings", "embed_text")
_DECODER = ("text_decoder", "decoder", "prefill")
_VISION = ("vision_encoder", "image_encoder")
_AUDIO = ("audio_encoder",)
_PLACEHOLDERS = {
    "image": ("vision_token_id", "image_token_id", "image_token_index"),
    "audio": ("audio_token_id", "audio_token_index"),
}
# metadata fields an image preprocessor reads (exporters copy preprocessor_config.json)
_IMAGE_FIELDS = (
    "size",
    "crop_size",
    "do_resize",
    "do_center_crop",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "resample",
)

Media = tuple[int, torch.Tensor]
"""Embedding rows ``[n, hidden]`` and the prompt offset where they start."""


class MultimodalMethods:
    """The method names of a multimodal program (see the module docstring), or
    ``None`` from :meth:`find` when the program has no embedding + decoder pair."""

    def __init__(
        self,
        embedding: str,
        decoder: str,
        decode: str,
        vision: str | None,
        audio: str | None,
    ) -> None:
        self.embedding = embedding
        self.decoder = decoder
        self.decode = decode
        self.vision = vision
        self.audio = audio

    @classmethod
    def find(cls, names: Sequence[str]) -> MultimodalMethods | None:
        have = set(names)

        def first(options: Sequence[str]) -> str | None:
            return next((n for n in options if n in have), None)

        embedding, decoder = first(_EMBEDDING), first(_DECODER)
        if embedding is None or decoder is None:
            return None
        decode = "decode" if decoder == "prefill" and "decode" in have else decoder
        return cls(embedding, decoder, decode, first(_VISION), first(_AUDIO))

    def encoder(self, kind: str) -> str | None:
        return self.vision if kind == "image" else self.audio

    def __repr__(self) -> str:
        return (
            f"MultimodalMethods(embedding={self.embedding!r}, decoder={self.decoder!r}, "
            f"decode={self.decode!r}, vision={self.vision!r}, audio={self.audio!r})"
        )


def _metadata_values(program: Any, skip: set[str]) -> dict[str, Any]:
    """Every metadata method (no inputs, only constants: :func:`constant_method`) of
    ``program`` not in ``skip``: its one value, or its list of values."""
    out: dict[str, Any] = {}
    for name in program.method_names:
        if name in skip or program.method_meta(name).inputs:
            continue
        if not constant_method(program, name):
            continue  # (reading it would run the program's computation)
        values = constant_outputs(program, name)
        out[name] = values[0] if len(values) == 1 else list(values)
    return out


class _DecoderCall:
    """How one decoder method is called: which input is the embeddings, which the
    position, and the most rows a call takes."""

    def __init__(self, meta: Any, name: str) -> None:
        ins = meta.inputs
        emb = [i for i, t in enumerate(ins) if hasattr(t, "sizes") and len(t.sizes) == 3]
        pos = [
            i
            for i, t in enumerate(ins)
            if hasattr(t, "sizes") and len(t.sizes) == 1 and t.dtype in (torch.int64, torch.int32)
        ]
        if len(ins) != 2 or len(emb) != 1 or len(pos) != 1:
            raise GenerationError(
                f"'{name}' should take the embeddings [1, seq, hidden] and a position input "
                f"(int64[seq] cache positions or int64[1] start position); it takes {list(ins)}"
            )
        self.name = name
        self.emb_index, self.pos_index = emb[0], pos[0]
        e, p = ins[self.emb_index], ins[self.pos_index]
        self.device: torch.device = e.device.to_torch()
        self.dtype: torch.dtype = e.dtype
        self.hidden = int(e.sizes[2])
        self.max_chunk = int(e.sizes[1])
        if e.dynamism == "static" and self.max_chunk != 1:
            self.fixed = self.max_chunk  # a static prefill shape: every call that many rows
        else:
            self.fixed = 0
        self.pos_dtype: torch.dtype = p.dtype
        self.pos_vector = p.dynamism != "static" or int(p.sizes[0]) > 1
        outs = meta.outputs
        if not outs or not hasattr(outs[0], "sizes") or len(outs[0].sizes) not in (2, 3):
            raise GenerationError(
                f"'{name}' should return the logits, [1, vocab] or [1, seq, vocab], first"
            )
        self.vocab_size = int(outs[0].sizes[-1])

    def inputs(self, embeds: torch.Tensor, pos: int) -> list[torch.Tensor]:
        n = int(embeds.shape[1])
        if self.pos_vector:
            where = torch.arange(pos, pos + n, dtype=self.pos_dtype, device=self.device)
        else:
            where = torch.tensor([pos], dtype=self.pos_dtype, device=self.device)
        out = [embeds, where]
        if self.emb_index == 1:
            out.reverse()
        return out


class MultimodalDecoder:
    """Runs a multimodal program's embedding, encoder and decoder methods.

    It has :class:`~ptexec.llm.decoder.TextDecoder`'s interface (``prefill``, ``step``,
    ``metadata``, ``max_context_len``, ``vocab_size``, ``execution_ms``) so the runners'
    loop drives it unchanged; ``prefill`` also takes the media rows to splice in.
    ``options`` go to ``load_method`` (``device_map``, ``compile``, ...). The logits are
    the caller's to keep unless ``share_logits`` (views, valid until the next call), as
    the text decoder's.
    """

    def __init__(
        self,
        program: Any,
        methods: MultimodalMethods,
        share_logits: bool = False,
        **options: Any,
    ) -> None:
        self.methods = methods
        self.share_logits = share_logits
        self.metadata: LlmMetadata = read_metadata(program)
        models = {methods.embedding, methods.decoder, methods.decode}
        models |= {m for m in (methods.vision, methods.audio) if m}
        self.extra: dict[str, Any] = _metadata_values(program, models | set(self.metadata.values))
        """Metadata beyond the LLM fields: placeholder ids, modality, preprocessing."""
        device_map = options.get("device_map")
        self._prefill = _DecoderCall(
            program.method_meta(methods.decoder, device_map), methods.decoder
        )
        self._decode = (
            self._prefill
            if methods.decode == methods.decoder
            else _DecoderCall(program.method_meta(methods.decode, device_map), methods.decode)
        )
        max_seq = self.metadata.get("get_max_seq_len")
        if max_seq is None:
            raise GenerationError(
                "the program has no get_max_seq_len method (an LLM export writes it); it "
                "cannot be driven as a generation program"
            )
        self.max_seq_len = int(max_seq)
        self.max_context_len = int(self.metadata.get("get_max_context_len", self.max_seq_len))
        self.use_kv_cache = bool(self.metadata.get("use_kv_cache", True))
        if not self.use_kv_cache:
            raise GenerationError(
                "multimodal programs without a KV cache are not supported (use_kv_cache is "
                "False): every step would re-run the encoders"
            )
        self.vocab_size = self._prefill.vocab_size
        self.hidden = self._prefill.hidden
        self.device = self._prefill.device
        emb_meta = program.method_meta(methods.embedding, device_map)
        tokens = emb_meta.inputs[0]
        if not hasattr(tokens, "sizes") or len(tokens.sizes) != 2:
            raise GenerationError(
                f"'{methods.embedding}' should take the token ids int64[1, n]; it takes "
                f"{list(emb_meta.inputs)}"
            )
        self.token_dtype: torch.dtype = tokens.dtype
        self.embed_chunk = int(tokens.sizes[1]) if tokens.dynamism != "static" else 0
        self.embed_fixed = int(tokens.sizes[1]) if tokens.dynamism == "static" else 0
        self.token_device: torch.device = tokens.device.to_torch()
        view = {**options, "outputs": "view"}  # logits are sampled before the next call
        self._embedding = program.load_method(methods.embedding, **options)
        self._decoder = program.load_method(methods.decoder, **view)
        self._decoder_step = (
            self._decoder
            if methods.decode == methods.decoder
            else program.load_method(methods.decode, **view)
        )
        self._encoders: dict[str, Any] = {}
        self.encoder_meta: dict[str, Any] = {}
        for kind in ("image", "audio"):
            name = methods.encoder(kind)
            if name is not None:
                self._encoders[kind] = program.load_method(name, **options)
                self.encoder_meta[kind] = program.method_meta(name, device_map)
        self.execution_ms = 0.0  # time in the embedding and decoder methods
        self.encoder_ms = 0.0  # time in the encoders

    @property
    def loaded(self) -> tuple[Any, ...]:
        """The program's methods this decoder loaded (embedding, decoder, encoders)."""
        found = [self._embedding, self._decoder, self._decoder_step, *self._encoders.values()]
        return tuple(m for k, m in enumerate(found) if all(m is not n for n in found[:k]))

    # -- metadata ------------------------------------------------------------------------
    def placeholder(self, kind: str) -> int | None:
        """The placeholder token id of ``kind`` ("image" or "audio") the program names."""
        for name in _PLACEHOLDERS[kind]:
            v = self.extra.get(name)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return None

    def image_settings(self) -> dict[str, Any]:
        """The preprocessing fields the program's metadata holds (may be empty)."""
        return {k: self.extra[k] for k in _IMAGE_FIELDS if k in self.extra}

    def has(self, kind: str) -> bool:
        return kind in self._encoders

    def media_rows(self, kind: str, items: int = 1) -> int:
        """The embedding rows the ``kind`` encoder makes of an input of ``items`` entries
        in its first dimension (an image; audio windows): its output rows of ``hidden``
        values, in proportion when that dimension is dynamic (the most rows for the most
        entries)."""
        meta = self.encoder_meta.get(kind)
        if meta is None:
            raise GenerationError(f"the program has no {kind} encoder")
        most = math.prod(int(s) for s in meta.outputs[0].sizes) // max(self.hidden, 1)
        sizes = meta.inputs[0].sizes
        entries = int(sizes[0]) if len(sizes) == 3 and kind == "audio" else 1
        return most * items // max(entries, 1)

    # -- running ---------------------------------------------------------------------------
    def _run(self, method: Any, inputs: list[torch.Tensor]) -> torch.Tensor:
        start = time.perf_counter()
        out: torch.Tensor = method.execute(inputs)[0]
        self.execution_ms += (time.perf_counter() - start) * 1e3
        return out

    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        """The embedding rows ``[n, hidden]`` of token ids (checked first: integers)."""
        ids = token_ids(ids, self.token_dtype)
        rows = []
        step = self.embed_fixed or self.embed_chunk or len(ids)
        for i in range(0, len(ids), step):
            chunk = list(ids[i : i + step])
            n = len(chunk)
            if self.embed_fixed and n < self.embed_fixed:
                chunk += [0] * (self.embed_fixed - n)  # a static shape: pad, keep n rows
            t = torch.tensor([chunk], dtype=self.token_dtype, device=self.token_device)
            rows.append(self._run(self._embedding, [t]).reshape(-1, self.hidden)[:n])
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def encode(self, kind: str, value: torch.Tensor) -> torch.Tensor:
        """The embedding rows ``[n, hidden]`` the ``kind`` encoder makes of ``value`` (its
        input, already shaped and typed as the encoder takes it)."""
        method = self._encoders.get(kind)
        if method is None:
            raise GenerationError(
                f"the program has no {kind} encoder (methods {self.methods!r}); it cannot "
                f"take {kind} inputs"
            )
        start = time.perf_counter()
        out: torch.Tensor = method.execute([value])[0]
        self.encoder_ms += (time.perf_counter() - start) * 1e3
        if out.shape[-1] != self.hidden:
            raise GenerationError(
                f"the {kind} encoder returns rows of {out.shape[-1]} values; the decoder "
                f"takes embeddings of {self.hidden}"
            )
        return out.reshape(-1, self.hidden)

    def _decode_rows(
        self, call: _DecoderCall, method: Any, rows: torch.Tensor, pos: int
    ) -> torch.Tensor:
        embeds = rows.to(dtype=call.dtype, device=call.device).unsqueeze(0)
        logits = self._run(method, call.inputs(embeds, pos))
        if logits.dim() == 3:
            logits = logits[:, -1, :]
        return logits

    def prefill(self, tokens: Sequence[int], pos: int, media: Sequence[Media] = ()) -> torch.Tensor:
        """Evaluate the prompt ``tokens`` at positions ``pos, pos + 1, ...``, the rows of
        each ``media`` entry replacing the tokens from its offset on; the last position's
        logits."""
        n = len(tokens)
        if n == 0:
            raise GenerationError("prefill needs at least one token")
        if pos + n > self.max_context_len:
            raise GenerationError(
                f"{n} prompt rows at position {pos} do not fit the context of "
                f"{self.max_context_len} tokens"
            )
        pieces: list[torch.Tensor] = []
        at = 0
        for offset, rows in sorted(media, key=lambda m: m[0]):
            if offset > at:
                pieces.append(self.embed(tokens[at:offset]))
            pieces.append(rows.to(self.device))
            at = offset + int(rows.shape[0])
        if at < n:
            pieces.append(self.embed(tokens[at:]))
        embeds = torch.cat([p.to(self.device) for p in pieces]) if len(pieces) > 1 else pieces[0]
        if int(embeds.shape[0]) != n:
            raise GenerationError(f"the prompt has {n} positions but {embeds.shape[0]} embeddings")
        call = self._prefill
        step = call.fixed or call.max_chunk
        logits: torch.Tensor | None = None
        if call.fixed:
            raise GenerationError(
                f"'{call.name}' takes exactly {call.fixed} rows a call; prefill of other "
                "lengths needs a dynamic-shape export"
            )
        for i in range(0, n, step):
            logits = self._decode_rows(call, self._decoder, embeds[i : i + step], pos + i)
        assert logits is not None
        return handed_logits(logits, self.share_logits)

    def step(self, token: int, pos: int, history: Sequence[int] = ()) -> torch.Tensor:
        """Evaluate one token at ``pos``; its logits."""
        if pos >= self.max_context_len:
            raise GenerationError(
                f"position {pos} is past the context of {self.max_context_len} tokens"
            )
        logits = self._decode_rows(self._decode, self._decoder_step, self.embed((token,)), pos)
        return handed_logits(logits, self.share_logits)


# -- audio: the one boundary to the feature code ------------------------------------------------


def audio_features(
    samples: torch.Tensor, sampling_rate: int, processor: str | os.PathLike[str]
) -> torch.Tensor:
    """Features ``float32 [batch, bins, frames]`` of mono ``samples`` (float, -1..1) at
    ``sampling_rate``, made by the Hugging Face feature extractor in the directory
    ``processor`` (its ``preprocessor_config.json``; needs ``transformers``). Audio longer
    than a Whisper-style extractor's window is every window of it, one batch row each
    (the last padded), as transformers' Voxtral processor makes them.

    Samples at another rate than the extractor's are resampled to it
    (:func:`ptexec.llm.audio.resample`). Raises :class:`~ptexec.errors.GenerationError`
    when the directory has no feature extractor."""
    try:
        from transformers import AutoFeatureExtractor
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise GenerationError("audio features need transformers' feature extractors") from e
    try:
        auto: Any = AutoFeatureExtractor
        fe = auto.from_pretrained(str(processor))
    except Exception as e:
        raise GenerationError(f"{processor}: no Hugging Face feature extractor ({e})") from e
    rate = int(getattr(fe, "sampling_rate", sampling_rate))
    if rate != sampling_rate:
        from .audio import resample

        samples = resample(samples.reshape(-1).float(), sampling_rate, rate)
    wave = samples.reshape(-1).float().numpy()
    span, frames = getattr(fe, "n_samples", None), getattr(fe, "nb_max_frames", None)
    if isinstance(span, int) and isinstance(frames, int) and wave.size > span:
        # longer than one window (Whisper's extractor would cut it there): padded to whole
        # windows, one batch row each, as transformers' Voxtral processor splits it
        out = fe(
            wave,
            sampling_rate=rate,
            return_tensors="pt",
            padding=True,
            truncation=False,
            pad_to_multiple_of=span,
        )
        whole = torch.as_tensor(out["input_features"]).float()
        return whole.reshape(whole.shape[-2], -1, frames).transpose(0, 1).contiguous()
    out = fe(wave, sampling_rate=rate, return_tensors="pt")
    feats = out["input_features"]
    return feats.float() if isinstance(feats, torch.Tensor) else torch.as_tensor(feats).float()


# -- the runner --------------------------------------------------------------------------


def hf_inputs(inputs: Any) -> list[MultimodalInput]:
    """A Hugging Face processor's output (``input_ids`` with ``pixel_values`` or
    ``input_features``) as runner inputs: the ids (placeholders kept, the runner fills
    them), then the image or audio features. A list of inputs is returned as it is."""
    if isinstance(inputs, list) and all(isinstance(i, MultimodalInput) for i in inputs):
        return inputs
    try:
        ids = inputs["input_ids"]
    except (KeyError, TypeError, IndexError):
        raise GenerationError(
            "inputs must be a list of MultimodalInput or a Hugging Face processor output "
            "with 'input_ids'"
        ) from None
    if hasattr(ids, "dim"):
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise GenerationError(
                    "Expected 'input_ids' with batch size 1 when 2D (shape (1, L))"
                )
            ids = ids[0]
        ids = ids.tolist()
    ids = [int(i) for i in ids]
    mask = inputs.get("attention_mask")
    if mask is not None:
        ids = _unpadded(ids, mask)
    items = [make_token_input(ids)]
    pixels = inputs.get("pixel_values")
    if pixels is not None:
        t = torch.as_tensor(pixels)
        if t.dim() == 5 and t.shape[0] == 1:  # processors that tile: [batch, tiles, C, H, W]
            t = t[0]
        if t.dim() == 4 and t.shape[0] != 1:
            raise GenerationError(
                f"one image per prompt is supported, got pixel_values {list(t.shape)}"
            )
        items.append(make_image_input(t))
    features = inputs.get("input_features")
    if features is not None:
        f = torch.as_tensor(features)
        items.append(make_audio_input(f if f.dim() == 3 else f.unsqueeze(0)))
    return items


def _processed(inputs: Any) -> bool:
    """Whether ``inputs`` is a processor's output (not a list of runner inputs)."""
    return not (isinstance(inputs, list) and all(isinstance(i, MultimodalInput) for i in inputs))


def _unpadded(ids: list[int], mask: Any) -> list[int]:
    """``ids`` without the padding ``mask`` marks (zeros on one side, as a processor pads a
    batch to one length); a mask with holes inside raises."""
    m = torch.as_tensor(mask).reshape(-1).tolist()
    if len(m) != len(ids):
        raise GenerationError(f"'attention_mask' has {len(m)} positions for {len(ids)} 'input_ids'")
    kept = [i for i, on in zip(ids, m, strict=True) if on]
    first = next((k for k, on in enumerate(m) if on), len(m))
    if not kept or any(not on for on in m[first : first + len(kept)]):
        raise GenerationError(
            "'attention_mask' must mark one run of the ids (padding on one side only)"
        )
    return kept


class MultimodalRunner(_Runner):
    """ExecuTorch's multimodal runner API: generate from text, token, image and audio inputs.

    ``model_path``/``tokenizer_path``/``data_path`` as in ExecuTorch. ptexec options:
    ``processor`` (a Hugging Face processor or checkpoint directory: image preprocessing
    settings and the audio feature extractor), ``device_map``, ``compile``, ``xnnpack``,
    ``temperature``, ``print_output`` (the text runner's). A program without multimodal methods (a text LLM's
    ``forward``) runs as :class:`~ptexec.llm.TextLLMRunner` runs it, for text and token
    inputs.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | Program,
        tokenizer_path: Any,
        data_path: str | os.PathLike[str] | None = None,
        *,
        processor: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        self.processor = Path(processor) if processor is not None else None
        super().__init__(model_path, tokenizer_path, data_path, **options)
        self._images: ImagePreprocessor | None = None

    def _load_decoder(self, program: Any, method: str, options: dict[str, Any]) -> Any:
        methods = MultimodalMethods.find(program.method_names)
        # the loop samples from each call's logits before the next (and copies what it keeps)
        if methods is None:
            return TextDecoder(program, method, share_logits=True, **options)
        return MultimodalDecoder(program, methods, share_logits=True, **options)

    def _extra_execution_ms(self) -> float:
        return float(self.decoder.encoder_ms) if self.multimodal else 0.0

    @property
    def multimodal(self) -> bool:
        """Whether the program has multimodal methods (else it is a text LLM)."""
        return isinstance(self.decoder, MultimodalDecoder)

    # -- inputs to ids and media ---------------------------------------------------------------
    def _image_rows(self, item: MultimodalInput) -> torch.Tensor:
        spec = self._image_spec()
        x = self.image_input(item).to(dtype=spec.dtype, device=spec.device.to_torch())
        if len(spec.sizes) == 4:
            x = x.unsqueeze(0)
        rows: torch.Tensor = self.decoder.encode("image", x)
        return rows

    def _image_spec(self) -> Any:
        meta = self.decoder.encoder_meta.get("image") if self.multimodal else None
        if meta is None:
            raise GenerationError("the program has no vision encoder; it cannot take images")
        spec = meta.inputs[0]
        if len(spec.sizes) not in (3, 4):
            sizes = tuple(int(s) for s in spec.sizes)
            raise GenerationError(f"the vision encoder takes {sizes}; expected [1, C, H, W]")
        return spec

    def image_input(self, item: MultimodalInput) -> torch.Tensor:
        """What the vision encoder reads of the image input ``item``, ``[C, H, W]``:
        uint8 pixels resized and normalised by the model's preprocessing, float pixels
        as given (they must have the encoder's shape), uint8 pixels as they are for an
        encoder that takes uint8 (of its size). Raises
        :class:`~ptexec.errors.GenerationError` for an image the encoder cannot take."""
        spec = self._image_spec()
        image = item.get_image()
        if image is None:
            raise GenerationError(f"expected an image input, got {item.type!r}")
        sizes = tuple(int(s) for s in spec.sizes)
        target = (sizes[-2], sizes[-1])
        pixels = image.to_tensor()
        if spec.dtype == torch.uint8:
            if not image.is_uint8() or tuple(pixels.shape[-2:]) != target:
                raise GenerationError(
                    f"the vision encoder takes uint8 pixels of {target[0]}x{target[1]}; the "
                    f"image is {image!r}"
                )
            return pixels[: sizes[-3]]
        if image.is_float():
            if tuple(pixels.shape) != sizes[-3:]:
                raise GenerationError(
                    f"a float image is taken as preprocessed pixel values and must have the "
                    f"encoder's shape {list(sizes[-3:])}; it is {list(pixels.shape)} (pass "
                    "uint8 pixels to have them resized and normalised)"
                )
            return pixels
        return self._preprocessor(target)(pixels)

    def _preprocessor(self, target: tuple[int, int]) -> ImagePreprocessor:
        if self._images is None:
            if self.processor is not None:
                self._images = ImagePreprocessor.from_dir(self.processor, target)
            else:
                settings = self.decoder.image_settings()
                if "image_mean" not in settings or "image_std" not in settings:
                    raise GenerationError(
                        "uint8 image pixels need the model's preprocessing (its mean and std): "
                        "pass processor= (a directory with preprocessor_config.json), or "
                        "give preprocessed float pixel values of the encoder's shape"
                    )
                self._images = ImagePreprocessor(settings, target)
        return self._images

    @property
    def audio_rate(self) -> int | None:
        """The sample rate raw audio is taken at (the processor's feature extractor's);
        None without a processor."""
        return None if self.processor is None else _extractor_rate(self.processor)

    def _audio_rows(self, item: MultimodalInput) -> torch.Tensor:
        feats = self.audio_input(item)
        spec = self.decoder.encoder_meta["audio"].inputs[0]
        rows: torch.Tensor = self.decoder.encode(
            "audio", feats.to(dtype=spec.dtype, device=spec.device.to_torch())
        )
        return rows

    def audio_input(self, item: MultimodalInput) -> torch.Tensor:
        """What the audio encoder reads of the audio input ``item``: its features
        ``[windows, bins, frames]``, made by the processor's feature extractor from raw
        samples. Raises :class:`~ptexec.errors.GenerationError` for audio the encoder
        cannot take."""
        meta = self.decoder.encoder_meta.get("audio") if self.multimodal else None
        if meta is None:
            raise GenerationError("the program has no audio encoder; it cannot take audio")
        spec = meta.inputs[0]
        if item.is_raw_audio():
            raw = item.get_raw_audio()
            assert raw is not None
            if self.processor is None:
                raise GenerationError(
                    "raw audio needs a feature extractor: pass processor= (a directory with "
                    "the model's preprocessor_config.json), or give features (make_audio_input)"
                )
            count = raw.batch_size * raw.n_channels * raw.n_samples
            samples = _bytes_tensor(raw.data, count, raw.dtype or torch.float32)
            samples = samples.reshape(raw.batch_size, raw.n_channels, raw.n_samples)
            if raw.batch_size != 1:
                raise GenerationError(f"raw audio is one clip, got {raw.batch_size}")
            rate = _extractor_rate(self.processor)
            mono = samples[0].float().mean(dim=0)  # the channels averaged
            feats = audio_features(mono, rate, self.processor)
        else:
            audio = item.get_audio()
            assert audio is not None
            count = audio.batch_size * audio.n_bins * audio.n_frames
            feats = _bytes_tensor(audio.data, count, audio.dtype or spec.dtype, audio.dtype)
            feats = feats.reshape(audio.batch_size, audio.n_bins, audio.n_frames)
        sizes = [int(s) for s in spec.sizes]
        if len(sizes) != 3 or list(feats.shape[1:]) != sizes[1:]:
            raise GenerationError(
                f"the audio encoder takes features [batch, {sizes[1:]}]; got {list(feats.shape)}"
            )
        if feats.shape[0] > sizes[0] or (spec.dynamism == "static" and feats.shape[0] != sizes[0]):
            raise GenerationError(
                f"the audio encoder takes {'at most ' if spec.dynamism != 'static' else ''}"
                f"{sizes[0]} feature windows; got {feats.shape[0]}"
            )
        return feats

    def _encode_multimodal(
        self,
        inputs: Sequence[MultimodalInput],
        num_bos: int,
        num_eos: int,
        image_token_id: int | None = None,
        placed: bool = False,
    ) -> tuple[list[int], list[Media]]:
        """The prompt's ids (placeholders at the media rows) and its media (see the module
        docstring's rule); ``image_token_id`` replaces the program's image placeholder.
        ``placed``: the media must go to placeholders (a processor's output: its ids say
        where), never after the ids."""
        if not self.multimodal:
            return self._encode_inputs(inputs, num_bos, num_eos), []
        d = self.decoder
        marks = {k: d.placeholder(k) for k in ("image", "audio")}
        if image_token_id is not None:
            marks["image"] = int(image_token_id)
        parts: list[tuple[str, Any]] = []  # ("ids", list[int]) | ("image"/"audio", rows)
        text_items = []
        for item in inputs:
            if item.is_text() or item.is_tokens():
                text_items.append(item)
                parts.append(("ids", None))
            elif item.is_image():
                parts.append(("image", self._image_rows(item)))
            else:
                parts.append(("audio", self._audio_rows(item)))
        lead = parts and parts[0][0] != "ids" and num_bos > 0
        trail = parts and parts[-1][0] != "ids" and num_eos > 0
        encoded = iter(
            self._encode_each(text_items, 0 if lead else num_bos, 0 if trail else num_eos)
        )
        parts = [(k, next(encoded)) if k == "ids" else (k, v) for k, v in parts]
        if lead:  # BOS begins the prompt, before media that come first
            parts.insert(0, ("ids", [self.tokenizer.bos_id] * num_bos))
        if trail:  # EOS ends it, after media that come last
            parts.append(("ids", [self.tokenizer.eos_id] * num_eos))
        texts = [v for k, v in parts if k == "ids"]
        # (text part, start, end) of each medium's placeholders -> the medium's rows
        slots: dict[tuple[int, int, int], torch.Tensor] = {}
        for kind in ("image", "audio"):
            media = [v for k, v in parts if k == kind]
            token = marks[kind]
            runs = sum(len(placeholder_runs(t, token)) for t in texts) if token is not None else 0
            found = media_slots(texts, token, [int(m.shape[0]) for m in media]) if runs else None
            if media and found is not None:
                slots.update(zip(found, media, strict=True))
                parts = [(k, v) for k, v in parts if k != kind]
            elif placed and media and not runs:
                raise GenerationError(
                    f"{len(media)} {kind} input(s) given, but the ids hold no {kind} "
                    f"placeholder (token {token}) to put them at"
                )
            elif runs:
                raise GenerationError(
                    f"the prompt's {kind} placeholders (token {token}) do not hold the "
                    f"{len(media)} {kind} input(s) given: one placeholder each, or as many as "
                    f"its embedding rows ({[int(m.shape[0]) for m in media]})"
                )
        ids: list[int] = []
        out_media: list[Media] = []
        part = 0
        for kind, value in parts:
            if kind == "ids":
                at = 0
                for (_, start, end), rows in sorted(
                    ((k, v) for k, v in slots.items() if k[0] == part), key=lambda kv: kv[0]
                ):
                    ids += value[at:start]
                    out_media.append((len(ids), rows))
                    ids += [value[start]] * int(rows.shape[0])
                    at = end
                ids += value[at:]
                part += 1
            else:
                token = marks[kind]
                out_media.append((len(ids), value))
                ids += [token if token is not None else 0] * int(value.shape[0])
        return ids, out_media

    # -- ExecuTorch's API ------------------------------------------------------------------------
    def generate(
        self,
        inputs: Sequence[MultimodalInput],
        config: GenerationConfig,
        token_callback: TokenCallback | None = None,
        stats_callback: StatsCallback | None = None,
    ) -> None:
        """Generate after the inputs, in order."""
        self.generate_text(inputs, config, token_callback, stats_callback)

    def generate_text(
        self,
        inputs: Sequence[MultimodalInput],
        config: GenerationConfig | None = None,
        token_callback: TokenCallback | None = None,
        stats_callback: StatsCallback | None = None,
    ) -> str:
        """Generate after the inputs and return the generated text."""
        return self._generate(list(inputs), config, token_callback, stats_callback)

    def _generate(
        self,
        items: list[MultimodalInput],
        config: GenerationConfig | None,
        token_callback: TokenCallback | None,
        stats_callback: StatsCallback | None,
        image_token_id: int | None = None,
        placed: bool = False,
    ) -> str:
        config = config or GenerationConfig()
        with self._lock:
            started = _now_ms()
            if self.multimodal:
                self.decoder.encoder_ms = 0.0
            ids, media = (
                self._encode_multimodal(
                    items, config.num_bos, config.num_eos, image_token_id, placed
                )
                if items
                else (None, [])
            )
            # echo streams the last input's text, when it is a text (ExecuTorch's runner's
            # rule): the texts before it are around media and stream nothing
            prompt = (items[-1].get_text() or "") if items and items[-1].is_text() else ""
            return self._generate_ids(
                ids, prompt, config, token_callback, stats_callback, media=media, started_ms=started
            )

    def prefill(self, inputs: Sequence[MultimodalInput]) -> None:
        """Evaluate the inputs into the context without generating."""
        with self._lock:
            ids, media = self._encode_multimodal(list(inputs), 0, 0)
            self._prefill_ids(ids, media)

    def generate_hf(
        self,
        inputs: Any,
        config: GenerationConfig,
        image_token_id: int | None = None,
        token_callback: TokenCallback | None = None,
        stats_callback: StatsCallback | None = None,
    ) -> None:
        """Generate from a Hugging Face processor's output (``input_ids`` with
        ``pixel_values`` or ``input_features``, padding dropped by its ``attention_mask``)
        or a list of inputs. ``image_token_id``, when given, is the image placeholder id
        (else the program's). A processor's media go to its ids' placeholders (none:
        :class:`~ptexec.errors.GenerationError`)."""
        self._generate(
            hf_inputs(inputs), config, token_callback, stats_callback, image_token_id,
            _processed(inputs),
        )  # fmt: skip

    def generate_text_hf(
        self, inputs: Any, config: GenerationConfig, image_token_id: int | None = None
    ) -> str:
        """:meth:`generate_hf`, returning the text."""
        return self._generate(
            hf_inputs(inputs), config, None, None, image_token_id, _processed(inputs)
        )

    def __repr__(self) -> str:
        kinds = [k for k in ("image", "audio") if self.multimodal and self.decoder.has(k)]
        return (
            f"<ptexec.llm.MultimodalRunner context {self.max_context_len}, vocab "
            f"{self.vocab_size}, inputs text{''.join(' + ' + k for k in kinds)}, position "
            f"{self.pos}>"
        )


def _bytes_tensor(
    data: Sequence[int],
    count: int,
    dtype: torch.dtype = torch.float32,
    stored: torch.dtype | None = None,
) -> torch.Tensor:
    """``count`` values stored as the bytes ``data`` (what ``make_audio_input`` keeps): of
    ``stored``, the dtype they were made from, when known; else float32 when there are 4
    bytes a value, else ``dtype`` when its width fits."""
    raw = torch.tensor(list(data), dtype=torch.uint8)
    if count <= 0 or raw.numel() % count:
        raise GenerationError(
            f"audio holds {raw.numel()} bytes, not a whole number of {count} values"
        )
    width = raw.numel() // count
    if stored is not None and width == stored.itemsize:
        return raw.view(stored)
    if width == 4:
        return raw.view(torch.float32)
    if width == dtype.itemsize:
        return raw.view(dtype)
    raise GenerationError(
        f"audio holds {width}-byte values; the encoder takes {dtype} (give float32 features)"
    )


def _extractor_rate(processor: Path) -> int:
    import json

    f = processor / "preprocessor_config.json"
    try:
        rate = json.loads(f.read_text()).get("sampling_rate")
    except (OSError, ValueError) as e:
        raise GenerationError(f"{f}: no feature extractor settings ({e})") from e
    if not isinstance(rate, int):
        raise GenerationError(f"{f}: no sampling_rate")
    return rate


def placeholder_runs(ids: Sequence[int], token: int | None) -> list[tuple[int, int]]:
    """(start, end) of each run of ``token`` in ``ids``."""
    out: list[tuple[int, int]] = []
    i, n = 0, len(ids)
    while token is not None and i < n:
        if ids[i] == token:
            j = i
            while j < n and ids[j] == token:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def media_slots(
    texts: Sequence[Sequence[int]], token: int | None, rows: Sequence[int]
) -> list[tuple[int, int, int]] | None:
    """Where each of ``len(rows)`` media of one kind goes among the ids of ``texts`` (in
    order): ``(text, start, end)`` of its placeholder tokens; None when the placeholders do
    not hold exactly those media. Each run of the placeholder holds the next media either
    written out as a processor writes them (``rows[i]`` tokens each: the run is as long as
    their rows together) or one token each (placeholders side by side, as a chat template
    writes several images)."""
    out: list[tuple[int, int, int]] = []
    n = 0
    for t, ids in enumerate(texts):
        for start, end in placeholder_runs(ids, token):
            length, total, k = end - start, 0, 0
            while n + k < len(rows) and total < length:  # written out: their rows
                total += rows[n + k]
                k += 1
            if total == length:
                for r in rows[n : n + k]:
                    out.append((t, start, start + r))
                    start += r
            elif n + length <= len(rows):  # one token each
                out.extend((t, start + i, start + i + 1) for i in range(length))
                k = length
            else:
                return None
            n += k
    return out if n == len(rows) else None


def generate_hf(
    runner: MultimodalRunner,
    inputs: Any,
    config: GenerationConfig,
    image_token_id: int | None = None,
    token_callback: TokenCallback | None = None,
    stats_callback: StatsCallback | None = None,
) -> None:
    """``runner.generate_hf(...)``, as ExecuTorch's runner module offers it."""
    runner.generate_hf(inputs, config, image_token_id, token_callback, stats_callback)


def generate_text_hf(
    runner: MultimodalRunner,
    inputs: Any,
    config: GenerationConfig,
    image_token_id: int | None = None,
) -> str:
    """``runner.generate_text_hf(...)``, as ExecuTorch's runner module offers it."""
    return runner.generate_text_hf(inputs, config, image_token_id)
