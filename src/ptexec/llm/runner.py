"""``TextLLMRunner``: ExecuTorch's runner API on ptexec, and the loop every runner shares
(``MultimodalRunner`` in :mod:`ptexec.llm.multimodal` drives it with images and audio).

A generation, as ExecuTorch's runner does it:

1. the prompt is encoded with ``config.num_bos`` BOS and ``config.num_eos`` EOS tokens
   and checked before anything runs, as ExecuTorch's runner checks it before prefill: it
   has a token, fits the context after the runner's position, and leaves a budget
   (``config.resolve_max_new_tokens(context, position + prompt)``) of at least one token.
   A refused call changes nothing: the next call runs as on a fresh runner. Then, with
   ``config.echo``, the prompt goes to the token callback;
2. the prompt is prefilled at the runner's position (0 after a load or ``reset``; after a
   ``generate`` the next call continues the same context), and the first token is sampled
   from the prefill's logits (a program without a KV cache reads the whole context, the
   earlier calls' tokens and the prompt, as each decode step does);
3. tokens are decoded one at a time until ``config.resolve_max_new_tokens(context,
   position)`` tokens were generated, an EOS id was sampled (unless ``ignore_eos``), a stop
   string appeared, or :meth:`stop` was called. Each token's text goes to the callback as
   it is produced (EOS and other control tokens have no text).

EOS ids are the program's ``get_eos_ids`` when it has them, else the tokenizer's EOS; BOS is
the program's ``get_bos_id``, else the tokenizer's (a runner's ``tokenizer`` is then a copy
of the one given with the program's BOS; the one given is not changed). The runner prints the text to stdout as
it goes, as ExecuTorch's does, unless ``config.warming`` or ``print_output=False``.

The tokenizer must not have more ids than the program's logits (a
:class:`~ptexec.errors.GenerationError` at construction: it is another model's). Fewer is
what exports do (the logits are padded: Qwen2.5's 151936 for 151665 ids): the padding ids
are never sampled, and a gap wider than padding explains warns.

Where ptexec differs from ExecuTorch's runner, on purpose: a first token that is EOS ends
the generation (ExecuTorch decodes past it); each ``generate`` starts its statistics afresh
(load times kept); the statistics are float milliseconds; after
:meth:`~TextLLMRunner.prefill`, ``generate("")`` samples its first
token from the logits the prefill kept, under its own config (its temperature, seed and
processors, which see the whole context), where ExecuTorch's samples it in ``prefill`` with
that call's config; its ``num_prompt_tokens`` is the tokens prefilled since the last
generation, as ``generate(prompt)`` counts the prompt it prefills (ExecuTorch's counts the
context at the end of the call, the tokens it generated included).

Logits processors always see the context (every earlier call's tokens and the prompt) and
every token the call generated, as transformers gives them ``input_ids``.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import GenerationError
from . import forked
from .config import GenerationConfig, Stats, _now_ms, check_setting
from .decoder import TextDecoder, load_options
from .inputs import MultimodalInput
from .logits import as_processors
from .sampling import Sampler
from .tokenizer import TextStream, Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from ..program import Program

__all__ = ["TextLLMRunner"]

log = logging.getLogger("ptexec.llm")

TokenCallback = Callable[[str], None]
StatsCallback = Callable[[Stats], None]
SampleObserver = Callable[[int, "torch.Tensor"], None]


class _StopStrings:
    """Holds back text that may be the start of a stop string; finds the first one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.pending = ""
        self.hit = False

    def feed(self, piece: str) -> str:
        """The text that can be emitted now (everything before a stop string, if one
        completed: then :attr:`hit` is set)."""
        if not self.stops:
            return piece
        text = self.pending + piece
        first = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if first >= 0:
            self.hit = True
            self.pending = ""
            return text[:first]
        keep = 0
        for s in self.stops:  # longest suffix of text that starts some stop string
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self.pending = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class _Runner:
    """What both runners share: the program, the tokenizer, the position, the loop."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | Program,
        tokenizer_path: str | os.PathLike[str] | Tokenizer,
        data_path: str | os.PathLike[str] | None = None,
        *,
        device_map: Any = None,
        compile: bool | str = False,
        xnnpack: str = "auto",
        temperature: float = -1.0,
        print_output: bool = True,
        method: str = "forward",
    ) -> None:
        import ptexec

        options = load_options(device_map, compile, xnnpack)  # checked before loading
        self.stats = Stats()
        self.stats.model_load_start_ms = _now_ms()
        # a loaded Program and Tokenizer may be given: runners over one program share its
        # constants, each with its own planned memory and state (KV cache), also where the
        # program's methods share their state
        self.tokenizer: Tokenizer = (
            tokenizer_path
            if isinstance(tokenizer_path, Tokenizer)
            else load_tokenizer(tokenizer_path)
        )
        program = (
            model_path.with_own_state()
            if isinstance(model_path, ptexec.Program)
            else ptexec.load(model_path, data_path=data_path)
        )
        self.decoder: Any = self._load_decoder(program, method, options)
        self.program = program
        self.stats.model_load_end_ms = _now_ms()
        md = self.decoder.metadata
        bos = md.get("get_bos_id")
        self.bos_id = int(bos) if bos is not None else self.tokenizer.bos_id
        self.eos_ids: frozenset[int] = frozenset(
            md.eos_ids if md.eos_ids is not None else (self.tokenizer.eos_id,)
        )
        """The ids that end a generation (settable)."""
        self.generated_tokens: list[int] = []
        """The ids the last generation produced, EOS included."""
        self.finish_reason = ""
        """Why the last generation ended: "stop" (EOS, a stop string), "length" (its token
        budget) or "interrupted" (:meth:`stop`)."""
        if self.bos_id != self.tokenizer.bos_id and self.bos_id >= 0:
            # the program's BOS is the one encoded, by a copy: the tokenizer given may
            # serve other programs and its caller, with its own BOS
            self.tokenizer = copy.copy(self.tokenizer)
            self.tokenizer.bos_id = self.bos_id
        self.vocab_size = int(md.get("get_vocab_size", self.tokenizer.vocab_size))
        self._sample_width = _sample_width(self.tokenizer.vocab_size, self.decoder.vocab_size)
        if temperature != -1.0:
            check_setting("temperature", temperature)
        self.temperature = temperature
        self.print_output = print_output
        self.pos = 0
        self._history: list[int] = []  # tokens in the context (for programs without a cache)
        # a prefill() awaiting generate(""): the logits its first token is sampled from,
        # and how many tokens were prefilled since the last generation (its prompt)
        self._pending_logits: torch.Tensor | None = None
        self._pending_tokens = 0
        self._stop = threading.Event()
        self._generating = False  # inside the loop (a callback of this thread may run)
        self._lock = threading.RLock()  # reentrant: a runner may encode inputs under it first
        forked.watch(self)
        self.on_sample: SampleObserver | None = None
        """Called on the generating thread with each sampled id and the logits it was
        sampled from (the model's, before processors and temperature; the ids the
        tokenizer has), e.g. for log-probabilities; None: nothing is called. The logits
        are the program's output memory, rewritten by the next step: read them in the
        call, or keep a ``clone()``."""

    def _load_decoder(self, program: Any, method: str, options: dict[str, Any]) -> Any:
        """The object that runs the program (a :class:`TextDecoder` here)."""
        # the loop samples from each call's logits before the next (and copies what it keeps)
        return TextDecoder(program, method, share_logits=True, **options)

    def _extra_execution_ms(self) -> float:
        """Model time of a generation spent outside the decoder (encoders); 0 here."""
        return 0.0

    # -- ExecuTorch's API -----------------------------------------------------------------
    def stop(self) -> None:
        """Stop the generation in progress after the current token (any thread)."""
        self._stop.set()

    def reset(self) -> None:
        """Forget the context: the next prompt starts at position 0; statistics cleared.
        Refused from a callback of the generation in progress (call :meth:`stop` there)."""
        with self._lock:
            self._refuse_inside("reset()")
            self.stats.reset()
            self.pos = 0
            self._history.clear()
            self._pending_logits = None
            self._pending_tokens = 0

    def _refuse_inside(self, call: str) -> None:
        """Raise when called from inside this runner's generation (its callbacks run on
        the generating thread, which holds the lock): the loop's context would change
        under it."""
        if self._generating:
            raise GenerationError(
                f"{call} was called from a callback of this runner's generation in "
                "progress; call stop() there, and this after generate returns"
            )

    def get_vocab_size(self) -> int:
        """The program's vocabulary size (-1 when unknown)."""
        return self.vocab_size if self.vocab_size > 0 else -1

    def is_loaded(self) -> bool:
        return True

    def load(self) -> None:
        """Loading happens in the constructor; kept for ExecuTorch's API."""

    @property
    def max_context_len(self) -> int:
        return int(self.decoder.max_context_len)

    @property
    def sampled_ids(self) -> int:
        """How many ids tokens are sampled from: ids ``[0, sampled_ids)``, the logits'
        ids the tokenizer has (those past them are padding, never sampled)."""
        width = self._sample_width
        return int(width if width is not None else self.decoder.vocab_size)

    # -- the loop ---------------------------------------------------------------------------
    def _sampler(self, config: GenerationConfig) -> Sampler:
        temperature = config.temperature if self.temperature == -1.0 else self.temperature
        return Sampler(
            temperature,
            config.top_p,
            config.top_k,
            config.seed,
            min_p=config.min_p,
            processors=as_processors(config.logits_processor),
        )

    def _visible(self, logits: Any) -> Any:
        """``logits`` over the ids the tokenizer has (those past them are padding)."""
        if self._sample_width is not None:
            return logits[..., : self._sample_width]
        return logits

    def _sample(self, sampler: Sampler, logits: Any) -> int:
        logits = self._visible(logits)
        self.stats.on_sampling_begin()
        token = sampler.sample(logits)
        self.stats.on_sampling_end()
        observe = self.on_sample
        if observe is not None:
            observe(token, logits)
        return token

    def prompt_logits(self, ids: Sequence[int]) -> list[torch.Tensor]:
        """Score ``ids`` on a fresh context: the logits after each of them (row ``i``
        predicts ``ids[i + 1]``; the last row, the token after the prompt), evaluated one
        token at a time, the way decoding reads them. The context is reset before and
        after (the position is 0 for the next call)."""
        ids = list(ids)
        with self._lock:
            self.reset()
            if not ids:
                raise GenerationError("Expected at least 1 prompt token")
            self._check_prompt(ids)
            rows: list[torch.Tensor] = []
            try:
                for t in ids:
                    logits = self.decoder.step(t, self.pos, self._history)
                    self.pos += 1
                    self._history.append(t)
                    rows.append(self._visible(logits).reshape(-1).float().clone())
            finally:
                self.reset()
            return rows

    def _encode_inputs(
        self, inputs: Sequence[MultimodalInput], num_bos: int, num_eos: int
    ) -> list[int]:
        return [t for ids in self._encode_each(inputs, num_bos, num_eos) for t in ids]

    def _encode_each(
        self, inputs: Sequence[MultimodalInput], num_bos: int, num_eos: int
    ) -> list[list[int]]:
        """The ids of each text or token input, checked: BOS goes with the first of them
        and EOS with the last (ids given as tokens get them too: BOS begins the prompt,
        EOS ends it)."""
        if num_bos + num_eos >= self.max_context_len:
            raise GenerationError(
                f"num_bos {num_bos} + num_eos {num_eos} do not fit the context of "
                f"{self.max_context_len} tokens"
            )
        each: list[list[int]] = []
        for k, item in enumerate(inputs):
            eos = num_eos if k == len(inputs) - 1 else 0
            if item.is_text():
                text = item.get_text() or ""
                each.append(self.tokenizer.encode(text, num_bos, eos))
                num_bos = 0
            elif item.is_tokens():
                ids = list(item.get_tokens() or [])
                tok = self.tokenizer
                each.append([tok.bos_id] * num_bos + ids + [tok.eos_id] * eos)
                num_bos = 0
            else:
                raise GenerationError(
                    f"{item.type} inputs need a multimodal program (an encoder method and "
                    "a decoder taking embeddings); this one has a text decoder only"
                )
        for ids in each:
            for t in ids:
                if not 0 <= t < max(self.vocab_size, 1):
                    raise GenerationError(
                        f"token id {t} is outside the vocabulary [0, {self.vocab_size})"
                    )
        return each

    def _check_prompt(self, ids: list[int]) -> None:
        """What ExecuTorch's runner checks of a prompt before prefill: at least one token,
        and room after it in the context."""
        if not ids:
            raise GenerationError("Expected at least 1 prompt token")
        if self.pos + len(ids) >= self.max_context_len:
            raise GenerationError(
                f"the prompt's {len(ids)} tokens at position {self.pos} do not fit the "
                f"context of {self.max_context_len} tokens (the program's max context length)"
            )

    def _budget(self, config: GenerationConfig, ids: list[int] | None) -> int:
        """The tokens this call generates, checked before anything runs (as ExecuTorch's
        runner checks it before prefill): raises when the prompt does not fit or no token
        may be generated after it."""
        if ids is not None:
            self._check_prompt(ids)
        elif self._pending_logits is None:
            raise GenerationError("an empty prompt needs a prior prefill() call")
        occupied = self.pos + (len(ids) if ids is not None else 0)
        budget = config.resolve_max_new_tokens(self.max_context_len, occupied)
        if budget <= 0:
            limit = (
                f"seq_len {config.seq_len}"
                if config.seq_len != -1 and config.seq_len < self.max_context_len
                else f"the context of {self.max_context_len} tokens"
            )
            raise GenerationError(
                f"no token can be generated: {occupied} tokens would be in the context "
                f"(position {self.pos}, prompt {len(ids) if ids is not None else 0}), "
                f"{limit} leaves no room for a new token"
            )
        return budget

    def _prefill_logits(self, ids: list[int], media: Sequence[Any] = ()) -> torch.Tensor:
        """Evaluate ``ids`` into the context; the logits after the last of them. A program
        without a KV cache reads the context before them too (as :meth:`TextDecoder.step`
        does)."""
        self._check_prompt(ids)
        logits: torch.Tensor
        if media:
            logits = self.decoder.prefill(ids, self.pos, media)
        elif isinstance(self.decoder, TextDecoder):
            logits = self.decoder.prefill(ids, self.pos, self._history)
        else:
            logits = self.decoder.prefill(ids, self.pos)
        self.pos += len(ids)
        self._history += ids
        return logits

    def _prefill_ids(self, ids: list[int], media: Sequence[Any] = ()) -> None:
        """Prefill ``ids`` for a later ``generate("")``: the logits after them are kept (the
        next call samples its first token from them with its own config)."""
        self._refuse_inside("prefill()")
        logits = self._visible(self._prefill_logits(ids, media))
        # the program's output buffer is reused by its next call: keep a copy
        self._pending_logits = logits.detach().clone()
        self._pending_tokens += len(ids)

    def _generate_ids(
        self,
        ids: list[int] | None,
        prompt_text: str,
        config: GenerationConfig,
        token_callback: TokenCallback | None,
        stats_callback: StatsCallback | None,
        media: Sequence[Any] = (),
        started_ms: float | None = None,
    ) -> str:
        """The loop. ``media`` (embedding rows and their prompt offsets) go to the
        decoder's prefill with ``ids``; ``started_ms`` is when the call began (encoding
        the inputs), if before this."""
        with self._lock:
            # everything is checked before any state changes: a refused call leaves the
            # context, the statistics and a pending prefill as they were
            self._refuse_inside("generate()")
            sampler = self._sampler(config)
            budget = self._budget(config, ids)
            self._stop.clear()
            self.stats.reset()
            stats = self.stats
            stats.inference_start_ms = started_ms if started_ms is not None else _now_ms()
            self.decoder.execution_ms = 0.0
            printing = self.print_output and not config.warming
            pieces: list[str] = []

            def emit(text: str) -> None:
                if not text:
                    return
                pieces.append(text)
                if printing:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                if token_callback is not None:
                    token_callback(text)

            # the callbacks run inside the loop: a reset, prefill or generation of this
            # runner from one of them would move the context under it (refused)
            self._generating = True
            try:
                sampler.begin([*self._history, *(ids or ())])
                if ids is not None:
                    stats.token_encode_end_ms = _now_ms()
                    if config.echo and prompt_text:
                        emit(prompt_text)
                    stats.model_execution_start_ms = _now_ms()
                    cur = self._sample(sampler, self._prefill_logits(ids, media))
                    num_prompt = len(ids)
                else:
                    pending = self._pending_logits
                    assert pending is not None  # checked by _budget
                    # the prompt is what the prefills since the last generation evaluated,
                    # before this call: its encoding and evaluation end as the call starts
                    num_prompt = self._pending_tokens
                    stats.token_encode_end_ms = stats.inference_start_ms
                    stats.model_execution_start_ms = stats.inference_start_ms
                    # sampled here, with this call's config: processors see the prompt (in
                    # the history) and this token
                    cur = self._sample(sampler, pending)
                self._pending_logits = None
                self._pending_tokens = 0
                stats.first_token_ms = _now_ms()
                stats.prompt_eval_end_ms = (
                    stats.first_token_ms if ids is not None else stats.inference_start_ms
                )
                self.generated_tokens = out_ids = [cur]
                # the decodes start in the prompt (the completion's first space stays): its
                # last tokens, in the history since the prefill
                context = self._history[-8:]
                stream = TextStream(self.tokenizer, context)
                stops = _StopStrings(config.stop)
                generated = 1
                ended = (cur in self.eos_ids) and not config.ignore_eos
                emit(stops.feed(stream.push(cur)))
                while (
                    not ended and not stops.hit and generated < budget and not self._stop.is_set()
                ):
                    logits = self.decoder.step(cur, self.pos, self._history)
                    self.pos += 1
                    self._history.append(cur)
                    cur = self._sample(sampler, logits)
                    generated += 1
                    out_ids.append(cur)
                    ended = (cur in self.eos_ids) and not config.ignore_eos
                    emit(stops.feed(stream.push(cur)))
                if not stops.hit:
                    emit(stops.feed(stream.flush()))  # (may complete a stop string)
                    if not stops.hit:
                        emit(stops.flush())
                done = ended or stops.hit
                self.finish_reason = (
                    "stop" if done else "length" if generated >= budget else "interrupted"
                )
                stats.model_execution_end_ms = stats.inference_end_ms = _now_ms()
                stats.aggregate_model_execution_time_ms = (
                    self.decoder.execution_ms + self._extra_execution_ms()
                )
                stats.num_prompt_tokens = num_prompt
                stats.num_generated_tokens = generated
            finally:
                self._generating = False
            if printing:
                sys.stdout.write("\n")
                sys.stdout.flush()
                log.info("%s", stats.report())
            if stats_callback is not None:
                stats_callback(copy.copy(stats))  # its own, as ExecuTorch's is
            text = "".join(pieces)
            return text[len(prompt_text) :] if config.echo and prompt_text and ids else text

    def warmup(self, prompt: str, max_new_tokens: int = 15) -> None:
        """One silent generation, then :meth:`reset` (as ExecuTorch's runner warms up)."""
        config = GenerationConfig(echo=False, max_new_tokens=max_new_tokens, warming=True)
        self._generate_ids(self.tokenizer.encode(prompt), prompt, config, None, None)
        self.reset()


class TextLLMRunner(_Runner):
    """Generate text from a text prompt with an exported LLM (``.pte``) and its tokenizer.

    ``model_path``/``tokenizer_path``/``data_path`` as in ExecuTorch. ptexec options:
    ``device_map`` (placement of the program, e.g. ``"cuda"``), ``compile`` (the compiled
    tier: True, or ``"background"`` to start interpreted while it compiles), ``xnnpack``
    (which runner runs XNNPACK payloads, see :func:`~ptexec.llm.decoder.load_options`),
    ``temperature`` (overrides the config's when not -1), ``print_output``.
    """

    def generate(
        self,
        prompt: str,
        config: GenerationConfig,
        token_callback: TokenCallback | None = None,
        stats_callback: StatsCallback | None = None,
    ) -> None:
        """Generate from ``prompt`` (empty: continue from a prior :meth:`prefill`)."""
        self.generate_text(prompt, config, token_callback, stats_callback)

    def generate_text(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        token_callback: TokenCallback | None = None,
        stats_callback: StatsCallback | None = None,
    ) -> str:
        """Like :meth:`generate`, returning the generated text (ptexec)."""
        config = config or GenerationConfig()
        ids = (
            self._encode_inputs([MultimodalInput(prompt)], config.num_bos, config.num_eos)
            if prompt
            else None
        )
        return self._generate_ids(ids, prompt, config, token_callback, stats_callback)

    def prefill(self, prompt: str, config: GenerationConfig | None = None) -> None:
        """Evaluate ``prompt`` into the context without generating (e.g. chat history); a
        following ``generate("")`` starts from the token it predicts, sampled with that
        call's config (``config`` here gives ``num_bos`` and ``num_eos``)."""
        config = config or GenerationConfig()
        with self._lock:
            ids = self._encode_inputs([MultimodalInput(prompt)], config.num_bos, config.num_eos)
            self._prefill_ids(ids)

    def __repr__(self) -> str:
        return (
            f"<ptexec.llm.TextLLMRunner context {self.max_context_len}, vocab "
            f"{self.vocab_size}, position {self.pos}>"
        )


# Exports pad the logits past the tokenizer's ids by a few hundred at most (Qwen2.5 and
# Qwen3: 151936 for 151665 and 151669 ids; Phi-3: 32064 for 32011); a wider gap is a
# tokenizer of another model.
_PADDING = 1024


def _sample_width(tokenizer_vocab: int, logits_width: int) -> int | None:
    """How many of the logits to sample from (None: all), or raise when the tokenizer cannot
    be the program's."""
    if tokenizer_vocab > logits_width:
        raise GenerationError(
            f"the tokenizer has {tokenizer_vocab} ids but the program's logits only "
            f"{logits_width}: ids from {logits_width} on would reach past the program's "
            "vocabulary (is the tokenizer the one this program was exported with?)"
        )
    if tokenizer_vocab == logits_width or tokenizer_vocab <= 0:
        return None
    if logits_width - tokenizer_vocab > _PADDING:
        warnings.warn(
            f"the program's logits have {logits_width} ids and the tokenizer only "
            f"{tokenizer_vocab}: more than padding explains; the tokenizer is probably not "
            "this program's (ids past the tokenizer's are never sampled)",
            RuntimeWarning,
            stacklevel=3,
        )
    return tokenizer_vocab
