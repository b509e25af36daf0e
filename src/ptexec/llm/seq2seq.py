"""``Seq2SeqRunner``: encoder-decoder generation and speech recognition.

The program layout is the one optimum-executorch writes for Whisper
(``ExecuTorchModelForSpeechSeq2Seq``) and T5 (``ExecuTorchModelForSeq2SeqLM``) and
ExecuTorch's C++ ASR runner reads:

==========================  ==========================================================
``encoder``                 the encoder's input (log-mel features ``f32[1, mels, frames]``
                            for speech; token ids ``i64[1, seq]`` for text) -> hidden
                            states ``[1, source, d]``
``text_decoder``            ``(ids i64[1, 1], hidden [1, source, d], cache_position
                            i64[1])`` -> logits ``[1, 1, vocab]``; the self-attention and
                            cross-attention caches are the method's own buffers
``decoder_start_token_id``  the first decoder token (optional, as the other metadata:
                            ``get_max_seq_len`` bounds the decoder's positions,
                            ``get_eos_id``/``get_eos_ids`` end a generation)
``sampler``                 an exported argmax (unused: ptexec samples the logits itself)
==========================  ==========================================================

A generation encodes once, then feeds the decoder one token a call: the start token at
position 0, then the forced tokens (Whisper's language, task and no-timestamps tokens, from
the model's ``generation_config.json`` or arguments, by the rules of transformers' Whisper
``generate``: a language not given is detected from the start token's logits), then each
sampled token, until EOS, the token budget or :meth:`Seq2SeqRunner.stop`. The config's
``suppress_tokens``, ``begin_suppress_tokens`` and, with timestamps, Whisper's timestamp
rules are logits processors run before the generation's own. Sampling, logits processors and statistics
are the text runner's (:class:`~ptexec.llm.Sampler`, :mod:`ptexec.llm.logits`,
:class:`~ptexec.llm.Stats`); processors see the decoder's tokens. Stop strings are not
supported here (a config with ``stop`` raises).

:meth:`Seq2SeqRunner.transcribe` takes audio (a file or samples), resamples it to the
feature extractor's rate, cuts it into 30 s windows, and transcribes each; with timestamp
tokens in the output (Whisper without ``<|notimestamps|>``) it returns timed segments.
"""

from __future__ import annotations

import copy
import errno
import json
import operator
import os
import sys
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigValueError, FileMissingError, GenerationError
from . import forked
from .audio import FeatureExtractor, load_audio, windows
from .config import GenerationConfig, Stats, _now_ms
from .decoder import load_options, read_metadata
from .inputs import token_id
from .languages import language_code
from .logits import (
    BadWords,
    ForceToken,
    MinLength,
    NoRepeatNGram,
    RepetitionPenalty,
    SuppressTokens,
    SuppressTokensAtBegin,
    TimestampRules,
    as_processors,
)
from .sampling import Sampler
from .tokenizer import TextStream, Tokenizer, load_tokenizer

__all__ = [
    "DecoderPrompt",
    "Segment",
    "Seq2SeqRunner",
    "Transcription",
    "WindowScores",
    "compression_ratio",
    "split_segments",
]

ENCODER = "encoder"
DECODER = "text_decoder"

TokenCallback = Callable[[str], None]
StatsCallback = Callable[[Stats], None]


@dataclass(frozen=True)
class DecoderPrompt:
    """The decoder's first tokens: ``start`` at position 0, then the ``forced`` tokens
    (Whisper's language and task tokens); sampling starts after them. With ``detect``
    (Whisper's language ids), the token at position 1 is the likeliest of those after the
    start token (language detection, as transformers' ``detect_language``) and the
    ``forced`` tokens follow it."""

    start: int
    forced: tuple[int, ...] = ()
    detect: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # ids as ExecuTorch's bindings take them: a float's fraction would be cut when the
        # decoder's token input is filled (0.7 ran as token 0)
        try:
            start = token_id(self.start)
            forced = tuple(token_id(t) for t in self.forced)
            detect = tuple(token_id(t) for t in self.detect)
        except TypeError as e:
            raise GenerationError(f"decoder prompt: {e}") from None
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "forced", forced)
        object.__setattr__(self, "detect", detect)

    @classmethod
    def of(cls, start: int, forced: Mapping[int, int]) -> DecoderPrompt:
        """From forced ``{position: id}``; the positions must be 1, 2, ... without a gap
        (what generation configs write)."""
        if sorted(forced) != list(range(1, len(forced) + 1)):
            raise GenerationError(
                f"forced decoder tokens must fill positions 1, 2, ... after the start token; "
                f"got positions {sorted(forced)}"
            )
        return cls(start, tuple(forced[i] for i in range(1, len(forced) + 1)))

    def prefix(self) -> list[int]:
        """The start token and the forced tokens (raises while a language is to detect:
        see :meth:`detected`)."""
        if self.detect:
            raise GenerationError(
                "this decoder prompt detects its language from the audio: its tokens are "
                "known once a generation has begun (DecoderPrompt.detected(language id))"
            )
        return [self.start, *self.forced]

    def detected(self, language: int) -> DecoderPrompt:
        """The prompt with ``language`` at position 1, nothing left to detect."""
        try:
            language = token_id(language)
        except TypeError as e:
            raise GenerationError(f"decoder prompt: {e}") from None
        if self.detect and language not in self.detect:
            raise GenerationError(f"token {language} is not one of the languages to detect")
        return DecoderPrompt(self.start, (language, *self.forced))

    def __len__(self) -> int:
        return 1 + bool(self.detect) + len(self.forced)


def _read_json(path: str | os.PathLike[str] | None, given: bool = True) -> dict[str, Any]:
    """The generation config at ``path`` (a file, or a directory holding
    ``generation_config.json``). One the caller named (``given``) must be there: a missing
    one is a :class:`FileMissingError` (a mistyped path would otherwise drop Whisper's
    language, task and suppression rules without a word); one only looked for (beside the
    program) may be absent: ``{}``."""
    if path is None:
        return {}
    p = Path(path)
    if p.is_dir():
        p = p / "generation_config.json"
    if not p.is_file():
        if given:
            raise FileMissingError(
                errno.ENOENT,
                "no generation config here (a generation_config.json, or its directory)",
                str(p),
            )
        return {}
    try:
        value = json.loads(p.read_text())
    except ValueError as e:
        raise GenerationError(f"{p}: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise GenerationError(f"{p}: a generation config is a JSON object")
    return value


def _ids(value: Any, what: str) -> list[int]:
    """``value`` (one id or a list of them, as transformers takes ``eos_token_id``) as
    ids; a bool, a float or a string is not an id."""
    items = value if isinstance(value, list | tuple) else [value]
    out = []
    for v in items:
        try:
            if isinstance(v, bool):
                raise TypeError
            out.append(operator.index(v))
        except TypeError:
            raise GenerationError(f"{what} must be token ids, got {v!r}") from None
    return out


def _forced_pairs(gen: Mapping[str, Any]) -> dict[int, int | None]:
    """A generation config's ``forced_decoder_ids`` ([position, id] pairs; Whisper's
    configs leave the language open with a None id)."""
    forced: dict[int, int | None] = {}
    for pair in gen.get("forced_decoder_ids") or ():
        if (
            not isinstance(pair, list | tuple)
            or len(pair) != 2
            or not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in pair)
            or pair[0] is None
        ):
            raise GenerationError(f"forced_decoder_ids holds [position, id] pairs, got {pair!r}")
        forced[int(pair[0])] = None if pair[1] is None else int(pair[1])
    if sorted(forced) != list(range(1, len(forced) + 1)):
        raise GenerationError(
            f"forced_decoder_ids must fill positions 1, 2, ... after the start token; got "
            f"positions {sorted(forced)}"
        )
    return forced


def _language_id(langs: Mapping[str, Any], language: str) -> int:
    key = language if language.startswith("<|") else f"<|{language_code(language).lower()}|>"
    if key not in langs:
        names = sorted(k.strip("<|>") for k in langs)
        raise GenerationError(f"language {language!r} is not one of the model's: {names}")
    return int(langs[key])


def _prompt_from(gen: Mapping[str, Any], start: int, language: str | None, task: str | None,
                 timestamps: bool) -> DecoderPrompt:  # fmt: skip
    """The decoder prompt a generation config gives, by the rules of transformers'
    Whisper ``generate``: ``forced_decoder_ids`` (read only when neither a language nor a
    task is asked for, from the arguments or the config's ``language`` / ``task``); the
    asked language at position 1, else, when the config has ``lang_to_id`` and position 1
    is open, a language detected from the audio; the asked task appended (with a language
    but no task, ``transcribe``); ``<|notimestamps|>`` last unless ``timestamps``."""
    langs = gen.get("lang_to_id") or {}
    tasks = gen.get("task_to_id") or {}
    no_ts = gen.get("no_timestamps_token_id")
    if timestamps and no_ts is None:  # (Whisper's timestamps follow <|notimestamps|>)
        raise GenerationError(
            "timestamps need a generation config naming no_timestamps_token_id (Whisper's); "
            "this one names none"
        )
    if not (langs or tasks or no_ts is not None):
        if language or task:
            raise GenerationError("the generation config names no languages or tasks")
        plain = _forced_pairs(gen)
        return DecoderPrompt.of(start, {p: t for p, t in plain.items() if t is not None})
    if gen.get("is_multilingual") is False and (language or task):
        raise GenerationError("this model is English-only: it takes no language or task")
    language = language or gen.get("language")
    task = task or gen.get("task")
    seq: list[int | None] = []
    if not language and not task:
        seq = [t for _, t in sorted(_forced_pairs(gen).items())]
    detect: tuple[int, ...] = ()
    if language:
        lang: int | None = _language_id(langs, str(language))
    elif langs and (not seq or seq[0] is None):
        lang, detect = None, tuple(sorted({int(v) for v in langs.values()}))
    else:
        lang = seq[0] if seq else None
    if seq:
        seq[0] = lang
    else:
        seq.append(lang)
    if task:
        if task not in tasks:
            raise GenerationError(f"task {task!r} is not one of {sorted(tasks)}")
        seq.append(int(tasks[task]))
    elif language and tasks and not any(t in set(tasks.values()) for t in seq):
        seq.append(int(tasks.get("transcribe", next(iter(tasks.values())))))
    last = next((t for t in reversed(seq) if t is not None), None)
    if no_ts is not None and not timestamps and last != no_ts:
        seq.append(int(no_ts))
    elif timestamps and no_ts is not None and seq and seq[-1] == no_ts:
        seq.pop()
    if detect:  # position 1 (None here) is the detected language's
        return DecoderPrompt(start, tuple(int(t) for t in seq[1:] if t is not None), detect)
    return DecoderPrompt(start, tuple(int(t) for t in seq if t is not None))


class _JoinedStream:
    """A transcription's text as it streams, window after window, joined as
    :meth:`Seq2SeqRunner.transcribe` joins the windows' texts: each stripped, one space
    between (whitespace at a window's end is held until more text comes)."""

    def __init__(self, out: TokenCallback) -> None:
        self.out = out
        self.wrote = False  # any text yet
        self.started = False  # text in this window yet
        self.held = ""

    def next_window(self) -> None:
        self.started = False
        self.held = ""

    def __call__(self, piece: str) -> None:
        if not self.started:
            piece = piece.lstrip()
            if not piece:
                return
            self.started = True
            if self.wrote:
                piece = " " + piece
        text = self.held + piece
        body = text.rstrip()
        self.held = text[len(body) :]
        if body:
            self.out(body)
            self.wrote = True


@dataclass
class Segment:
    """A timed piece of a transcription (seconds from the start of the audio)."""

    start: float
    end: float
    text: str
    tokens: list[int]
    """The segment's ids, its timestamp tokens included (as Whisper's segments carry them)."""
    window: int = 0
    """The number of the window it was transcribed in (:attr:`Transcription.windows`)."""


@dataclass
class Transcription:
    """What :meth:`Seq2SeqRunner.transcribe` returns."""

    text: str
    tokens: list[list[int]]
    """The generated ids of each window."""
    segments: list[Segment]
    """Timed segments (empty when the model emitted no timestamp tokens)."""
    finish_reasons: list[str] = field(default_factory=list)
    """Why each window's generation ended: "stop" (EOS), "length" (the token budget or the
    decoder's cache: the window's text may be cut) or "interrupted"."""
    language: str | None = None
    """The language code of the decoder prompt (asked or detected), when the model has a
    language table (Whisper)."""
    windows: list[WindowScores] = field(default_factory=list)
    """Each window's start and scores, as Whisper reports them for its segments."""


@dataclass(frozen=True)
class WindowScores:
    """One window of a transcription: where it starts and how its generation scored (the
    quantities Whisper gives each segment)."""

    start: float
    """Seconds from the start of the audio."""
    avg_logprob: float
    """The sampled tokens' log-probabilities (under the processed logits, before
    temperature), summed and divided by the number of tokens before EOS plus one."""
    no_speech_prob: float | None
    """The probability of the no-speech token at the start token's step (None: the model
    names none)."""
    compression_ratio: float
    """The window's text in UTF-8 over its zlib-compressed size (1.0 for no text)."""


def split_segments(
    tokens: Sequence[int],
    timestamp_begin: int,
    offset: float = 0.0,
    precision: float = 0.02,
    ignore: Collection[int] = (),
) -> list[tuple[float, float, list[int]]]:
    """Timed segments of Whisper output, ``(start, end, ids)``: text between a pair of
    timestamp tokens (ids from ``timestamp_begin``, each ``precision`` seconds apart) is one
    segment, whose ids include those two timestamps; text after the last timestamp ends
    where the window ends (``end`` is then -1). Ids in ``ignore`` (EOS) are dropped first; a
    piece without text is no segment. ``offset`` is the window's start."""
    out: list[tuple[float, float, list[int]]] = []
    start: float | None = None
    piece: list[int] = []  # since the last segment ended: the latest timestamp, then text
    has_text = False
    for t in tokens:
        if t in ignore:
            continue
        if t >= timestamp_begin:
            time_s = offset + (t - timestamp_begin) * precision
            if has_text:
                out.append((offset if start is None else start, time_s, [*piece, int(t)]))
                has_text = False
            piece = [int(t)]  # the next segment starts here (a later timestamp replaces it)
            start = time_s
        else:
            piece.append(int(t))
            has_text = True
    if has_text:
        out.append((offset if start is None else start, -1.0, piece))
    return out


def compression_ratio(text: str) -> float:
    """``text``'s UTF-8 size over its zlib-compressed size, as Whisper scores a window
    (repetitive text compresses well: a high ratio); 1.0 for no text."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 1.0


class _Decoder:
    """The two methods, their input layout and reusable input tensors."""

    def __init__(self, program: Any, options: dict[str, Any]) -> None:
        names = set(program.method_names)
        missing = [m for m in (ENCODER, DECODER) if m not in names]
        if missing:
            raise GenerationError(
                f"a seq2seq program has methods '{ENCODER}' and '{DECODER}'; this one lacks "
                f"{missing} (it has {sorted(names)})"
            )
        device_map = options.get("device_map")
        emeta = program.method_meta(ENCODER, device_map)
        dmeta = program.method_meta(DECODER, device_map)
        ins = dmeta.inputs
        if (
            len(ins) != 3
            or not hasattr(ins[0], "sizes")
            or ins[0].dtype not in (torch.int64, torch.int32)
            or list(ins[0].sizes) != [1, 1]
            or ins[2].dtype not in (torch.int64, torch.int32)
        ):
            raise GenerationError(
                f"'{DECODER}' should take (ids int64[1, 1], encoder hidden states, "
                f"cache_position int64[1]); it takes {list(ins)}"
            )
        if not emeta.inputs or not hasattr(emeta.inputs[0], "sizes"):
            raise GenerationError(f"'{ENCODER}' should take one tensor; it takes {emeta.inputs}")
        self.encoder_input = emeta.inputs[0]
        self.encoder = program.load_method(ENCODER, **options)
        self.decoder = program.load_method(DECODER, **{"outputs": "view", **options})
        self.vocab_size = int(dmeta.outputs[0].sizes[-1])
        dev = ins[0].device.to_torch()
        self.device = dev
        # refilled before each step: ordinary tensors whatever the caller's mode (an
        # inference tensor could not be refilled outside torch.inference_mode)
        with torch.inference_mode(False):
            self._ids = torch.zeros((1, 1), dtype=ins[0].dtype, device=dev)
            self._pos = torch.zeros((1,), dtype=ins[2].dtype, device=ins[2].device.to_torch())
        self.hidden_device = ins[1].device.to_torch()
        self.execution_ms = 0.0

    @property
    def takes_tokens(self) -> bool:
        return not self.encoder_input.dtype.is_floating_point

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        info = self.encoder_input
        x = x.to(device=info.device.to_torch(), dtype=info.dtype)
        if x.dim() == len(info.sizes) - 1:
            x = x.unsqueeze(0)
        start = time.perf_counter()
        out: torch.Tensor = self.encoder.execute([x])[0]
        self.execution_ms += (time.perf_counter() - start) * 1e3
        return out.to(self.hidden_device)

    def step(self, token: int, pos: int, hidden: torch.Tensor) -> torch.Tensor:
        self._ids.fill_(token)
        self._pos.fill_(pos)
        start = time.perf_counter()
        logits: torch.Tensor = self.decoder.execute([self._ids, hidden, self._pos])[0]
        self.execution_ms += (time.perf_counter() - start) * 1e3
        return logits.reshape(-1, logits.shape[-1])[-1]


def _constant(program: Any, name: str) -> Any:
    if name not in program.method_names or program.method_meta(name).inputs:
        return None
    values = program.load_method(name).execute([])
    if len(values) != 1:
        return None
    v = values[0]
    return v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v


class Seq2SeqRunner:
    """Generate with an encoder-decoder program (``encoder`` + ``text_decoder``).

    ``tokenizer_path`` (a file, a directory, a :class:`~ptexec.llm.Tokenizer` or None:
    ids only). ``generation_config`` is a ``generation_config.json`` (or its directory)
    or a dict; absent, the program's directory is looked in. The decoder's start token is
    ``decoder_start_token_id`` if given, else the generation config's (its
    ``decoder_start_token_id``, else its ``bos_token_id``, as transformers falls back), else
    the program's ``decoder_start_token_id`` method, else the tokenizer's BOS; forced tokens are
    ``forced_decoder_ids`` ({position: id} or [position, id] pairs) if given (then no
    ``language``, ``task`` or ``timestamps``), else the generation config's (with those
    three choosing Whisper's tokens); EOS ids are ``eos_ids``, else the generation config's, else the program's, else
    the tokenizer's. ``device_map`` places the program (``"cuda"``); ``compile`` runs the
    compiled tier (``True``: compiled at load; ``"background"``: interpreted at once, compiled
    in another process and switched to between calls); ``xnnpack`` chooses the runner of
    XNNPACK payloads (:func:`~ptexec.llm.decoder.load_options`, as the text runner's).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | Any,
        tokenizer_path: str | os.PathLike[str] | Tokenizer | None = None,
        data_path: str | os.PathLike[str] | None = None,
        *,
        generation_config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        decoder_start_token_id: int | None = None,
        forced_decoder_ids: Mapping[int, int] | Sequence[Sequence[int]] | None = None,
        eos_ids: int | Sequence[int] | None = None,
        language: str | None = None,
        task: str | None = None,
        timestamps: bool = False,
        device_map: Any = None,
        compile: bool | str = False,
        xnnpack: str = "auto",
        print_output: bool = False,
    ) -> None:
        import ptexec

        options = load_options(device_map, compile, xnnpack)  # checked before loading
        self.stats = Stats()
        self.stats.model_load_start_ms = _now_ms()
        if isinstance(model_path, ptexec.Program):
            # runners over one program keep their own state (the decoder's cache), also
            # where the program's methods share it
            program = model_path.with_own_state()
            where: Path | None = None
        else:
            program = ptexec.load(model_path, data_path=data_path)
            where = Path(model_path).parent
        self.program = program
        self._model = _Decoder(program, options)
        self.loaded: tuple[Any, ...] = (self._model.encoder, self._model.decoder)
        """The program's methods this runner loaded (encoder, decoder)."""
        self.tokenizer: Tokenizer | None = (
            tokenizer_path
            if isinstance(tokenizer_path, Tokenizer) or tokenizer_path is None
            else load_tokenizer(tokenizer_path)
        )
        if isinstance(generation_config, Mapping):
            gen = dict(generation_config)
        elif generation_config is not None:
            gen = _read_json(generation_config)
        else:  # looked for beside the program
            gen = _read_json(where, given=False)
        self.generation_config = gen
        speech = not self._model.takes_tokens
        if speech and not gen and generation_config is None and forced_decoder_ids is None:
            warnings.warn(
                "a speech model without its generation config (generation_config.json beside "
                "the program, or generation_config=): it decodes from the start token alone, "
                "without the language, task, timestamp and suppression rules it was trained "
                "with",
                RuntimeWarning,
                stacklevel=2,
            )
        md = read_metadata(program)
        self.max_seq_len = int(md.get("get_max_seq_len", 0)) or None
        start = decoder_start_token_id
        if start is None and gen.get("decoder_start_token_id") is not None:
            start = _ids(gen["decoder_start_token_id"], "decoder_start_token_id")[0]
        if start is None and gen.get("bos_token_id") is not None:  # transformers' fallback
            start = _ids(gen["bos_token_id"], "bos_token_id")[0]
        if start is None:
            value = _constant(program, "decoder_start_token_id")
            start = int(value) if value is not None else None
        if start is None and self.tokenizer is not None and self.tokenizer.bos_id >= 0:
            start = self.tokenizer.bos_id
        if start is None:
            raise GenerationError(
                "no decoder start token: give decoder_start_token_id, a generation config "
                "naming it, or a program with a decoder_start_token_id method"
            )
        if forced_decoder_ids is not None:
            chosen = [n for n, v in (("language", language), ("task", task),
                                     ("timestamps", timestamps)) if v]  # fmt: skip
            if chosen:  # (they choose forced tokens; these are given whole)
                raise GenerationError(
                    f"forced_decoder_ids are the decoder's whole prompt: {', '.join(chosen)} "
                    "cannot change it (give one or the other)"
                )
            pairs = (
                forced_decoder_ids.items()
                if isinstance(forced_decoder_ids, Mapping)
                else forced_decoder_ids
            )
            self.prompt = DecoderPrompt.of(int(start), {int(p): int(t) for p, t in pairs})
        else:
            self.prompt = _prompt_from(gen, int(start), language, task, timestamps)
        """The decoder prompt of :meth:`generate` and :meth:`transcribe` (settable)."""
        if eos_ids is not None:
            eos = _ids(list(eos_ids) if isinstance(eos_ids, Iterable) else eos_ids, "eos_ids")
        elif gen.get("eos_token_id") is not None:
            eos = _ids(gen["eos_token_id"], "eos_token_id")
        elif md.eos_ids is not None:
            eos = list(md.eos_ids)
        elif self.tokenizer is not None:
            eos = [self.tokenizer.eos_id]
        else:
            eos = []
        self.eos_ids: frozenset[int] = frozenset(int(e) for e in eos)
        """The ids that end a generation (settable)."""
        no_ts = gen.get("no_timestamps_token_id")
        self.timestamp_begin: int | None = int(no_ts) + 1 if isinstance(no_ts, int) else None
        """The first timestamp token (Whisper), or None."""
        self.languages: dict[int, str] = {
            int(v): str(k).strip("<|>") for k, v in (gen.get("lang_to_id") or {}).items()
        }
        """Language token id -> code (``"en"``), from the generation config (Whisper)."""
        self.language_id: int | None = None
        """The language token of the last generation (asked or detected), or None."""
        self.rules: tuple[Any, ...] = _config_rules(gen, sorted(self.eos_ids))
        """The generation config's processors, run before a generation's own, in
        transformers' order (settable, ``()`` turns them off): ``repetition_penalty``,
        ``no_repeat_ngram_size``, ``bad_words_ids``, ``min_length``, ``min_new_tokens``,
        ``forced_bos_token_id``, ``suppress_tokens`` and ``begin_suppress_tokens``
        (``forced_eos_token_id`` and ``max_length`` bound each generation's budget)."""
        forced_eos = gen.get("forced_eos_token_id")
        self.forced_eos: list[int] | None = (
            None if forced_eos is None else _ids(forced_eos, "forced_eos_token_id")
        )
        """The tokens the last step of a generation's budget chooses from (the generation
        config's ``forced_eos_token_id``, one id or several), or None (settable)."""
        length = gen.get("max_length")
        self.max_length: int | None = None if length is None else _count(length, "max_length")
        """The decoder's most tokens, its prompt included, for a generation that does not
        bound its own (the generation config's ``max_length``), or None."""
        ignored = _not_applied(gen)
        if ignored:
            warnings.warn(
                f"the generation config asks for {', '.join(ignored)}, which ptexec does not "
                "do (it decodes one sequence: greedy or sampled, by the GenerationConfig "
                "given): its outputs differ from transformers' generate",
                RuntimeWarning,
                stacklevel=2,
            )
        self.timestamp_rules: TimestampRules | None = None
        """Whisper's timestamp rules, applied after :attr:`rules` to a generation whose
        prompt asks for timestamps (no ``<|notimestamps|>``); settable, None turns them
        off."""
        self._no_timestamps = int(no_ts) if isinstance(no_ts, int) else None
        self.no_speech_id: int | None = (
            self._no_timestamps - 1 if self._no_timestamps is not None else None
        )
        """Whisper's no-speech token (the id before ``<|notimestamps|>``, as transformers
        takes it), whose probability at the start token's step a transcription reports;
        None for a model without timestamps (settable)."""
        self.scores: tuple[float, float | None] = (0.0, None)
        """The last :meth:`generate` with ``score=True``: its average log-probability and
        no-speech probability (:class:`WindowScores`)."""
        if self._no_timestamps is not None:
            stop = sorted(eos) if eos else _ids(gen.get("bos_token_id", 0), "bos_token_id")
            initial = gen.get("max_initial_timestamp_index")
            self.timestamp_rules = TimestampRules(
                self._no_timestamps + 1,
                self._no_timestamps,
                stop[0],
                None if initial is None else int(initial),
                from_logprob=bool(gen.get("_detect_timestamp_from_logprob", True)),
            )
        self.vocab_size = self._model.vocab_size
        self._width: int | None = None
        if self.tokenizer is not None:
            tv = self.tokenizer.vocab_size
            if tv > self.vocab_size:
                raise GenerationError(
                    f"the tokenizer has {tv} ids but the program's logits only "
                    f"{self.vocab_size} (is it this program's tokenizer?)"
                )
            if 0 < tv < self.vocab_size and self.timestamp_begin is None:
                # ids past the tokenizer's are padding, never sampled; a model with
                # timestamp tokens (Whisper) has them there when its tokenizer lacks them
                self._width = tv
        self.print_output = print_output
        self.generated_tokens: list[int] = []
        """The ids the last generation produced (EOS included)."""
        self.finish_reason = ""
        """Why the last generation ended: "stop" (EOS), "length" or "interrupted"."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        forked.watch(self)
        self.stats.model_load_end_ms = _now_ms()

    # -- properties -----------------------------------------------------------------------
    @property
    def takes_tokens(self) -> bool:
        """Whether the encoder takes token ids (T5) rather than features (Whisper)."""
        return self._model.takes_tokens

    @property
    def encoder_input(self) -> Any:
        """The encoder input's description (``TensorInfo``)."""
        return self._model.encoder_input

    def stop(self) -> None:
        """Stop the generation in progress after the current token (any thread)."""
        self._stop.set()

    # -- generation -------------------------------------------------------------------------
    def encode(self, inputs: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The encoder's hidden states for ``inputs`` (features, or ids for a text encoder)."""
        x = inputs if isinstance(inputs, torch.Tensor) else torch.tensor([list(inputs)])
        info = self._model.encoder_input
        if x.dim() == len(info.sizes) - 1:
            x = x.unsqueeze(0)
        bounds = list(info.sizes)
        static = info.dynamism == "static"
        shape = list(x.shape)
        fits = len(shape) == len(bounds) and all(
            (s == b) if static else (s <= b) for s, b in zip(shape, bounds, strict=True)
        )
        if not info.dtype.is_floating_point and x.numel():
            if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
                # (cast to ids, 3.7 would silently be token 3)
                raise GenerationError(f"the encoder takes token ids; got a {x.dtype} tensor")
            low, high = int(x.min()), int(x.max())
            if low < 0 or high >= self.vocab_size:
                raise GenerationError(
                    f"token id {low if low < 0 else high} is outside the vocabulary "
                    f"[0, {self.vocab_size})"
                )
        if not fits or x.numel() == 0:
            need = "exactly" if static else "at most"
            raise GenerationError(f"the encoder takes {need} {bounds} ({info.dtype}); got {shape}")
        return self._model.encode(x)

    def decoder_prompt(
        self, language: str | None = None, task: str | None = None, timestamps: bool = False
    ) -> DecoderPrompt:
        """The decoder prompt the generation config gives for ``language``, ``task`` and
        ``timestamps`` (Whisper; the rules of the constructor's arguments of those names),
        for one generation or transcription (``prompt=``)."""
        return _prompt_from(self.generation_config, self.prompt.start, language, task, timestamps)

    def _rules_for(self, prompt: DecoderPrompt, budget: int) -> tuple[Any, ...]:
        """The generation config's processors for a generation after ``prompt`` of at most
        ``budget`` tokens: :attr:`rules`, the forced EOS at the budget's last step before
        their token masks (transformers' order), and Whisper's timestamp rules."""
        rules = self.rules
        if self.forced_eos is not None:
            force = ForceToken(self.forced_eos, len(prompt) + budget - 1)
            cut = next(
                (i for i, r in enumerate(rules) if isinstance(r, SuppressTokens)), len(rules)
            )
            rules = (*rules[:cut], force, *rules[cut:])
        if self.timestamp_rules is None or self._no_timestamps in prompt.forced:
            return rules
        return (*rules, self.timestamp_rules)

    def _budget(self, config: GenerationConfig, prompt: int) -> int:
        budget = self._own_budget(config, prompt)
        if self.max_length is not None and config.max_new_tokens == -1 and config.seq_len == -1:
            # the config's bound, counting the decoder prompt; transformers takes a
            # max_length of exactly its default, 20, as new tokens (the prompt added)
            length = self.max_length + (prompt if self.max_length == 20 else 0)
            if length <= prompt:
                raise GenerationError(
                    f"the generation config's max_length {self.max_length} leaves no token to "
                    f"generate after the decoder prompt's {prompt}"
                )
            budget = min(budget, length - prompt)
        return budget

    def _own_budget(self, config: GenerationConfig, prompt: int) -> int:
        """Tokens after a decoder prompt of ``prompt`` tokens: ``seq_len`` counts the
        decoder's tokens, the prompt's and every generated one (transformers'
        ``max_length``); the cache of ``max_seq_len`` positions holds one token fewer than
        its sequence (the last sampled token is never fed)."""
        if self.max_seq_len is None:
            if config.max_new_tokens == -1 and config.seq_len == -1:
                return 256
            context = sys.maxsize
        else:
            context = self.max_seq_len + 1
        budget = config.resolve_max_new_tokens(context, prompt)
        if budget <= 0:
            bound = (
                f"seq_len {config.seq_len}"
                if config.seq_len != -1 and config.seq_len <= prompt
                else f"the decoder's cache {self.max_seq_len} positions"
            )
            raise GenerationError(
                f"no token can be generated: the decoder prompt has {prompt} tokens and {bound}"
            )
        return budget

    def generate(
        self,
        inputs: torch.Tensor | Sequence[int],
        config: GenerationConfig | None = None,
        token_callback: TokenCallback | None = None,
        stats_callback: StatsCallback | None = None,
        *,
        prompt: DecoderPrompt | None = None,
        score: bool = False,
    ) -> list[int]:
        """Encode ``inputs`` once and decode: the generated ids (after the decoder prompt,
        EOS included when sampled). Each token's text goes to ``token_callback`` (with a
        tokenizer). ``score``: also keep Whisper's scores of the generation in
        :attr:`scores`."""
        config = config or GenerationConfig(temperature=0.0)
        if config.stop:
            raise ConfigValueError("stop", "stop strings are not supported by Seq2SeqRunner")
        dp = prompt or self.prompt
        with self._lock:
            budget = self._budget(config, len(dp))
            sampler = Sampler(
                config.temperature,
                config.top_p,
                config.top_k,
                config.seed,
                min_p=config.min_p,
                processors=(
                    *self._rules_for(dp, budget),
                    *as_processors(config.logits_processor),
                ),
            )
            self._stop.clear()
            stats = self.stats
            stats.reset()
            stats.inference_start_ms = stats.token_encode_end_ms = _now_ms()
            self._model.execution_ms = 0.0
            stats.model_execution_start_ms = _now_ms()
            hidden = self.encode(inputs)
            stats.num_prompt_tokens = int(hidden.shape[1]) if hidden.dim() >= 2 else 0
            printing = self.print_output and not config.warming
            stream = TextStream(self.tokenizer) if self.tokenizer is not None else None

            def emit(token: int) -> None:
                if stream is None or not self._is_text(token):
                    return  # (a timestamp is no text: the result's text leaves it out too)
                piece = stream.push(token)
                if piece:
                    if printing:
                        sys.stdout.write(piece)
                        sys.stdout.flush()
                    if token_callback is not None:
                        token_callback(piece)

            pos = 0
            at_start: torch.Tensor | None = None  # the start token's logits
            if dp.detect:  # the start token's logits choose the language
                logits = self._model.step(dp.start, 0, hidden)
                at_start = logits.clone() if score else None  # (the next step's memory)
                pos = 1
                ids = torch.tensor(dp.detect, device=logits.device)
                dp = dp.detected(dp.detect[int(logits[ids].argmax())])
            prefix = dp.prefix()
            self.language_id = next((t for t in prefix[1:2] if t in self.languages), None)
            sampler.begin(prefix)
            out: list[int] = []
            self.generated_tokens = out
            # the prompt: every token but the last is fed without sampling
            for t in prefix[pos:-1]:
                logits = self._model.step(t, pos, hidden)
                if score and pos == 0:
                    at_start = logits.clone()
                pos += 1
            logprob = 0.0
            stats.prompt_eval_end_ms = _now_ms()
            cur = prefix[-1]
            ended = False
            limit = self.max_seq_len
            while len(out) < budget and not ended and not self._stop.is_set():
                if limit is not None and pos >= limit:
                    break
                logits = self._model.step(cur, pos, hidden)
                if score and pos == 0:
                    at_start = logits.clone()
                pos += 1
                if self._width is not None:
                    logits = logits[: self._width]
                stats.on_sampling_begin()
                nxt = sampler.sample(logits)
                stats.on_sampling_end()
                if score and sampler.scores is not None:
                    logprob += float(torch.log_softmax(sampler.scores.float(), dim=0)[nxt])
                if not out:
                    stats.first_token_ms = _now_ms()
                out.append(nxt)
                ended = nxt in self.eos_ids and not config.ignore_eos
                emit(nxt)
                cur = nxt
            if stream is not None:
                tail = stream.flush()
                if tail:
                    if printing:
                        sys.stdout.write(tail)
                    if token_callback is not None:
                        token_callback(tail)
            self.finish_reason = (
                "stop" if ended else "interrupted" if self._stop.is_set() else "length"
            )
            if score:
                no_speech = None
                if self.no_speech_id is not None and at_start is not None:
                    row = torch.softmax(at_start.reshape(-1).float(), dim=0)
                    if self.no_speech_id < row.numel():
                        no_speech = float(row[self.no_speech_id])
                # Whisper's average: the EOS's log-probability counts, not as a token
                self.scores = (logprob / (len(out) - int(ended) + 1), no_speech)
            stats.model_execution_end_ms = stats.inference_end_ms = _now_ms()
            stats.aggregate_model_execution_time_ms = self._model.execution_ms
            stats.num_generated_tokens = len(out)
            if printing:
                sys.stdout.write("\n")
                sys.stdout.flush()
            if stats_callback is not None:
                stats_callback(copy.copy(stats))  # its own, as ExecuTorch's is
            return out

    def _need_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise GenerationError("text in or out needs a tokenizer (tokenizer_path)")
        return self.tokenizer

    def decode(self, ids: Sequence[int]) -> str:
        """The text of generated ids (special tokens dropped)."""
        return self._need_tokenizer().decode(list(ids), skip_special_tokens=True)

    def generate_text(
        self,
        text: str,
        config: GenerationConfig | None = None,
        token_callback: TokenCallback | None = None,
        stats_callback: StatsCallback | None = None,
    ) -> str:
        """Text in, text out (a text encoder, e.g. T5): ``text`` is tokenized with
        ``config.num_bos`` BOS and ``config.num_eos`` EOS tokens (T5 ends its input with
        EOS: ``num_eos=1``), encoded and decoded."""
        if not self.takes_tokens:
            raise GenerationError(
                "this program's encoder takes features, not text (use transcribe or generate)"
            )
        config = config or GenerationConfig(temperature=0.0)
        tok = self._need_tokenizer()
        ids = tok.encode(text, config.num_bos, config.num_eos)
        if not ids:
            raise GenerationError("Expected at least 1 prompt token")
        out = self.generate(ids, config, token_callback, stats_callback)
        return self.decode(out)

    def transcribe(
        self,
        audio: str | os.PathLike[str] | torch.Tensor,
        features: FeatureExtractor,
        config: GenerationConfig | None = None,
        token_callback: TokenCallback | None = None,
        *,
        sampling_rate: int | None = None,
        window_seconds: float | None = None,
        prompt: DecoderPrompt | None = None,
    ) -> Transcription:
        """Transcribe an audio file (or mono samples at ``sampling_rate``, default the
        extractor's): resampled to the extractor's rate, in consecutive windows of
        ``window_seconds`` (default: what the extractor takes, 30 s for Whisper; a longer
        window is refused, as the extractor would drop its end), each encoded and decoded
        on its own. A language to detect is detected on the first window and kept for the
        others (as transformers does). Stats are the last window's."""
        rate = features.sampling_rate
        most = getattr(features, "window_samples", None)
        if window_seconds is None:
            window_seconds = most / rate if most else 30.0
        if most and round(window_seconds * rate) > most:
            raise GenerationError(
                f"a window of {window_seconds:g} s is longer than the feature extractor takes "
                f"({most / rate:g} s at {rate} Hz): the rest of each window would be dropped"
            )
        if isinstance(audio, torch.Tensor):
            from .audio import resample, to_mono

            samples = to_mono(audio)
            if sampling_rate is not None and sampling_rate != rate:
                samples = resample(samples, sampling_rate, rate)
        else:
            samples, _ = load_audio(audio, rate)
        texts: list[str] = []
        all_tokens: list[list[int]] = []
        reasons: list[str] = []
        segments: list[Segment] = []
        dp = prompt or self.prompt
        scores: list[WindowScores] = []
        joined = _JoinedStream(token_callback) if token_callback is not None else None
        for k, (start, window) in enumerate(windows(samples, rate, window_seconds)):
            if joined is not None:
                joined.next_window()
            ids = self.generate(features(window), config, joined, prompt=dp, score=True)
            if dp.detect and self.language_id is not None:
                dp = dp.detected(self.language_id)  # the first window's language for all
            all_tokens.append(ids)
            reasons.append(self.finish_reason)
            avg, no_speech = self.scores
            if self.tokenizer is None:
                scores.append(WindowScores(start, avg, no_speech, 1.0))
                continue
            if self.timestamp_begin is not None and any(t >= self.timestamp_begin for t in ids):
                end_of_window = start + window.shape[-1] / rate
                for s, e, toks in split_segments(
                    ids, self.timestamp_begin, start, ignore=self.eos_ids
                ):
                    body = self.decode([t for t in toks if self._is_text(t)])
                    segments.append(Segment(s, end_of_window if e < 0 else e, body, toks, k))
            texts.append(self.decode([t for t in ids if self._is_text(t)]))
            scores.append(WindowScores(start, avg, no_speech, compression_ratio(texts[-1])))
        text = " ".join(t.strip() for t in texts if t.strip())
        language = self.languages.get(self.language_id) if self.language_id is not None else None
        return Transcription(text, all_tokens, segments, reasons, language, scores)

    def _is_text(self, token: int) -> bool:
        return self.timestamp_begin is None or token < self.timestamp_begin

    def __repr__(self) -> str:
        kind = "text" if self.takes_tokens else "features"
        return (
            f"<ptexec.llm.Seq2SeqRunner encoder of {kind} {list(self.encoder_input.sizes)}, "
            f"vocab {self.vocab_size}, decoder cache {self.max_seq_len}>"
        )


# generation config fields that change transformers' output and that ptexec does not do,
# with the value that leaves them off
_NOT_APPLIED: dict[str, Any] = {
    "num_beams": 1,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "encoder_no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0,
    "exponential_decay_length_penalty": None,
    "sequence_bias": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "renormalize_logits": False,
    "guidance_scale": None,
    "penalty_alpha": None,
    "constraints": None,
    "force_words_ids": None,
}


def _not_applied(gen: Mapping[str, Any]) -> list[str]:
    """``name=value`` of each field of ``gen`` set to change the output in a way ptexec
    does not follow."""
    return [
        f"{k}={gen[k]!r}"
        for k, off in _NOT_APPLIED.items()
        if gen.get(k) is not None and gen[k] != off and gen[k] != []
    ]


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GenerationError(f"the generation config's {what} must be an integer >= 0")
    return value


def _config_rules(gen: Mapping[str, Any], eos: Sequence[int]) -> tuple[Any, ...]:
    """The generation config's logits processors, in the order transformers' ``generate``
    builds them (``_get_logits_processor``); ``eos``: the ids that end a generation."""
    rules: list[Any] = []
    try:
        penalty = gen.get("repetition_penalty")
        if penalty is not None and penalty != 1.0:
            rules.append(RepetitionPenalty(float(penalty)))
        n = gen.get("no_repeat_ngram_size")
        if n:
            rules.append(NoRepeatNGram(n))
        bad = gen.get("bad_words_ids")
        if bad:
            rules.append(BadWords(bad, eos))
        new = _count(gen.get("min_new_tokens") or 0, "min_new_tokens")
        # min_new_tokens takes precedence over min_length, as in transformers
        low = 0 if new else _count(gen.get("min_length") or 0, "min_length")
        if (low > 0 or new > 0) and eos:
            rules.append(MinLength(eos, low, new))
        bos = gen.get("forced_bos_token_id")
        if bos is not None:
            rules.append(ForceToken(_ids(bos, "forced_bos_token_id")[0], 1))
        if gen.get("suppress_tokens"):
            rules.append(SuppressTokens(_ids(gen["suppress_tokens"], "suppress_tokens")))
        if gen.get("begin_suppress_tokens"):
            begin = _ids(gen["begin_suppress_tokens"], "tokens")
            rules.append(SuppressTokensAtBegin(begin, after_forced=bos is not None))
    except (TypeError, ValueError) as e:
        raise GenerationError(f"the generation config: {e}") from None
    return tuple(rules)
