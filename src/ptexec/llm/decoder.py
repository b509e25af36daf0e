"""The program side of text generation: metadata, input layout, prefill and decode steps.

An exported LLM is a ``forward`` method plus constant methods that describe it (what
ExecuTorch's exporters write; absent ones take ExecuTorch's runner defaults):

==========================  ========================================================
``get_max_seq_len``         required: the most tokens one call may take
``get_max_context_len``     the KV cache's length (default: ``get_max_seq_len``)
``get_vocab_size``          the logits' width (default: the tokenizer's vocabulary)
``get_bos_id``              BOS id (default: the tokenizer's)
``get_eos_ids``             EOS ids, one output each (also ``get_eos_id``; default: the
                            tokenizer's EOS)
``use_kv_cache``            default True
``enable_dynamic_shape``    default: read from ``forward``'s token input
==========================  ========================================================

Another input-free method named ``get_*``, ``use_*`` or ``enable_*`` is read only when it
is a constant (no instructions): reading metadata never runs a program's computation.

``forward`` takes the tokens ``int64[1, seq]`` and, with a KV cache, a position input in one
of the two layouts exporters write: the start position ``input_pos int64[1]`` (ExecuTorch's
Llama exporter) or the cache-position vector ``cache_position int64[seq]`` holding every
token's position (Hugging Face exports through optimum-executorch). The layout is read from
the position input's shape: a dynamic or longer-than-one dimension is a vector. The first
output is the logits, ``[1, vocab]`` (last position) or ``[1, seq, vocab]``.

:class:`TextDecoder` prefills a prompt in one call when the token input is dynamic (in
chunks up to its bound), token by token when it is static, and decodes one token a call. Its
logits stay on the program's device; only the sampled id leaves it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import GenerationError
from .inputs import token_id

__all__ = [
    "DecoderLayout",
    "LlmMetadata",
    "TextDecoder",
    "constant_method",
    "constant_outputs",
    "example_inputs",
    "handed_logits",
    "load_options",
    "read_metadata",
    "token_ids",
]

# the metadata methods ExecuTorch's runner reads (and its EOS ids: _EOS_METHODS)
_RUNNER_METADATA = frozenset(
    {
        "get_max_seq_len",
        "get_max_context_len",
        "get_vocab_size",
        "get_bos_id",
        "use_kv_cache",
        "use_sdpa_with_kv_cache",
        "enable_dynamic_shape",
    }
)
_EOS_METHODS = ("get_eos_ids", "get_eos_id")


def load_options(
    device_map: Any = None, compile: Any = False, xnnpack: str = "auto"
) -> dict[str, Any]:
    """The ``load_method`` options every runner (text, multimodal, seq2seq) loads its
    methods with: ``device_map`` (placement), ``compile`` (True, or ``"background"``) and
    ``xnnpack`` (which runner runs XNNPACK payloads: ``"auto"``, the default, is
    ExecuTorch's XNNPACK backend on the CPU where it can run them, else ptexec's; ``"torch"``
    ptexec's; ``"executorch"`` ExecuTorch's or an error at load). ``xnnpack`` is checked
    here, before anything loads."""
    from ..delegates.xnnpack.backend import XNNPACK_RUNNERS

    if xnnpack not in XNNPACK_RUNNERS:
        raise GenerationError(
            f"xnnpack must be one of {', '.join(XNNPACK_RUNNERS)}, not {xnnpack!r}"
        )
    options: dict[str, Any] = {"xnnpack": xnnpack}
    if device_map is not None:
        options["device_map"] = device_map
    if compile:
        options["compile"] = compile
    return options


class LlmMetadata:
    """The constant methods of an LLM program, as read from the file."""

    def __init__(self, values: dict[str, Any], eos_ids: tuple[int, ...] | None) -> None:
        self.values = values
        self.eos_ids = eos_ids  # None: the program names none

    def get(self, name: str, default: Any = None) -> Any:
        v = self.values.get(name)
        return default if v is None else v

    def __repr__(self) -> str:
        return f"LlmMetadata({self.values}, eos_ids={self.eos_ids})"


def constant_outputs(program: Any, name: str) -> list[Any]:
    """The values a metadata method (no inputs) of ``program`` returns."""
    meta = program.method_meta(name)
    outs = meta.outputs
    if meta.num_instructions == 0 and all(hasattr(o, "kind") for o in outs):
        return [o.value for o in outs]  # a constant method: its outputs are its values
    values = program.load_method(name).execute([])
    return [v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for v in values]


def constant_method(program: Any, name: str) -> bool:
    """Whether method ``name`` of ``program`` only returns constants (it has no
    instructions): reading it runs nothing of the program's."""
    return bool(program.method_meta(name).num_instructions == 0)


def read_metadata(program: Any) -> LlmMetadata:
    """The metadata methods of ``program`` that it has (see the module docstring). Those
    ExecuTorch's runner reads are read as it reads them, computed or not; another
    input-free method named ``get_*``, ``use_*`` or ``enable_*`` only when it is a
    constant (:func:`constant_method`), so that reading metadata never runs a program's
    computation."""
    names = set(program.method_names)
    values: dict[str, Any] = {}
    extra = sorted(n for n in names if n.startswith(("get_", "use_", "enable_")))
    for name in extra:
        if name in _EOS_METHODS or program.method_meta(name).inputs:
            continue  # metadata methods take no inputs
        if name not in _RUNNER_METADATA and not constant_method(program, name):
            continue
        outs = constant_outputs(program, name)
        if len(outs) == 1 and isinstance(outs[0], bool | int | float):
            values[name] = outs[0]
    eos: tuple[int, ...] | None = None
    for name in _EOS_METHODS:
        if name in names:
            eos = tuple(int(v) for v in constant_outputs(program, name))
            break
    return LlmMetadata(values, eos)


class DecoderLayout:
    """How a generation program's ``forward`` is called, read from its metadata and its
    method's inputs and outputs (no method is loaded).

    Raises :class:`~ptexec.errors.GenerationError` when the method is not shaped like a
    generation program or the program has no ``get_max_seq_len``.
    """

    def __init__(self, metadata: LlmMetadata, meta: Any, method: str = "forward") -> None:
        self._check_layout(meta, method)
        tokens = meta.inputs[0]
        self.device: torch.device = tokens.device.to_torch()
        self.token_dtype: torch.dtype = tokens.dtype
        said = bool(metadata.get("use_kv_cache", True))
        self.use_kv_cache = said and len(meta.inputs) > 1
        """Whether the program takes a position input (its cache is at that position)."""
        self.reads_context = not said
        """Whether each call reads the whole context (the metadata says the program keeps
        no cache); else each call is fed its new tokens alone, as ExecuTorch's runner
        feeds them (a program said to keep a cache but taking no position counts
        positions itself)."""
        dyn = tokens.dynamism != "static"
        self.dynamic = bool(metadata.get("enable_dynamic_shape", dyn)) and dyn
        self.max_chunk = int(tokens.sizes[1]) if self.dynamic else 1
        if not self.use_kv_cache:
            self.max_chunk = int(tokens.sizes[1])
            if not said and not dyn and self.max_chunk > 1:
                raise GenerationError(
                    f"'{method}' keeps no KV cache and takes exactly {self.max_chunk} tokens "
                    "a call: a generation's growing context cannot be fed to it (export it "
                    "with a dynamic token length, or with a KV cache)"
                )
        max_seq = metadata.get("get_max_seq_len")
        if max_seq is None:
            raise GenerationError(
                f"the program has no get_max_seq_len method (an LLM export writes it); "
                f"'{method}' cannot be driven as a generation program"
            )
        self.max_seq_len = int(max_seq)
        self.max_context_len = int(metadata.get("get_max_context_len", self.max_seq_len))
        if not said and self.max_chunk + 1 < self.max_context_len:
            # each call reads the whole context but the token it predicts, which is never
            # fed: the context holds one token more than a call takes, as ExecuTorch's
            # runner counts it (its exporter bounds the tokens at get_max_seq_len - 1),
            # and no more (ExecuTorch's runner fails past it; a window of the last tokens
            # is another model than the one exported). A program said to keep a cache but
            # taking no position (one that counts positions itself) is fed its new tokens
            # alone.
            self.max_context_len = self.max_chunk + 1
        self.vocab_size = int(meta.outputs[0].sizes[-1])
        """The logits' width: the ids the program can produce."""
        self.pos_vector = False
        self.pos_dtype = torch.int64
        if self.use_kv_cache:
            pos = meta.inputs[1]
            self.pos_dtype = pos.dtype
            self.pos_vector = pos.dynamism != "static" or int(pos.sizes[0]) > 1

    @staticmethod
    def _check_layout(meta: Any, method: str) -> None:
        ins = meta.inputs
        if not ins or not hasattr(ins[0], "sizes"):
            raise GenerationError(
                f"'{method}' should take the tokens int64[1, seq] first; it takes {list(ins)}"
            )
        tokens = ins[0]
        if tokens.dtype not in (torch.int64, torch.int32) or len(tokens.sizes) != 2:
            raise GenerationError(
                f"'{method}' input 0 should be the tokens, int64[1, seq]; it is {tokens}"
            )
        if len(ins) > 2:
            raise GenerationError(
                f"'{method}' takes {len(ins)} inputs; a generation program takes the tokens "
                "and at most a position input"
            )
        if len(ins) == 2:
            pos = ins[1]
            if (
                not hasattr(pos, "sizes")
                or pos.dtype not in (torch.int64, torch.int32)
                or len(pos.sizes) != 1
            ):
                raise GenerationError(
                    f"'{method}' input 1 should be the position (int64[1] start position or "
                    f"int64[seq] cache positions); it is {pos}"
                )
        outs = meta.outputs
        if not outs or not hasattr(outs[0], "sizes") or len(outs[0].sizes) not in (2, 3):
            raise GenerationError(
                f"'{method}' should return the logits, [1, vocab] or [1, seq, vocab], first"
            )

    def inputs(self, tokens: torch.Tensor, pos: int) -> list[torch.Tensor]:
        """The call's inputs for ``tokens`` (``[1, n]``, on :attr:`device`) at positions
        ``pos ..  pos + n - 1``: the tokens, then the position input the program takes."""
        if not self.use_kv_cache:
            return [tokens]
        if self.pos_vector:
            n = tokens.shape[1]
            return [tokens, torch.arange(pos, pos + n, dtype=self.pos_dtype, device=self.device)]
        return [tokens, torch.tensor([pos], dtype=self.pos_dtype, device=self.device)]


def example_inputs(
    program: Any, meta: Any, generator: torch.Generator | None = None
) -> list[torch.Tensor] | None:
    """Inputs the generation method ``meta`` describes can take, or None when ``program`` is
    not a generation program: the most tokens one call takes (bounded by the context), drawn
    uniformly from the vocabulary, at positions from 0 (a prefill of a fresh context)."""
    if "get_max_seq_len" not in program.method_names:
        return None
    try:
        layout = DecoderLayout(read_metadata(program), meta)
    except GenerationError:
        return None
    n = max(1, min(layout.max_chunk, layout.max_context_len - 1))
    ids = torch.randint(0, max(layout.vocab_size, 1), (1, n), generator=generator)
    return layout.inputs(ids.to(layout.token_dtype).to(layout.device), 0)


class TextDecoder:
    """Runs a generation program's ``forward``: prefill a prompt, decode one token.

    ``options`` go to ``load_method`` (``device_map``, ``compile``, ...). The logits
    ``prefill`` and ``step`` return are the caller's to keep; with ``share_logits=True``
    they are views of the method's memory instead, valid until the next call (what a loop
    that samples from each before the next does without a copy). Raises
    :class:`~ptexec.errors.GenerationError` when ``forward`` is not shaped like a
    generation program.
    """

    def __init__(
        self, program: Any, method: str = "forward", share_logits: bool = False, **options: Any
    ) -> None:
        self.metadata = read_metadata(program)
        meta = program.method_meta(method, options.get("device_map"))
        layout = DecoderLayout(self.metadata, meta, method)
        self.layout = layout
        self.share_logits = share_logits
        # the method's outputs are views either way: only the last row of the logits is
        # handed out, copied unless shared
        options.setdefault("outputs", "view")
        self.method = program.load_method(method, **options)
        self.device = layout.device
        self.token_dtype = layout.token_dtype
        self.use_kv_cache = layout.use_kv_cache
        self.reads_context = layout.reads_context
        self.dynamic = layout.dynamic
        self.max_chunk = layout.max_chunk
        self.max_seq_len = layout.max_seq_len
        self.max_context_len = layout.max_context_len
        self.vocab_size = layout.vocab_size
        self.pos_vector = layout.pos_vector
        self.pos_dtype = layout.pos_dtype
        self._top = torch.iinfo(self.token_dtype).max  # the largest id the token input holds
        self.execution_ms = 0.0  # accumulated time in forward
        self.loaded: tuple[Any, ...] = (self.method,)
        """The program's methods this decoder loaded."""
        # a one-token call's inputs, refilled before each such call (making two small
        # tensors costs more than a decode step's envelope); one decoder, one caller.
        # Ordinary tensors whatever the caller's mode: an inference tensor could not be
        # refilled outside torch.inference_mode (on another thread, say)
        self._one: list[torch.Tensor] | None = None
        if self.use_kv_cache:
            with torch.inference_mode(False):
                token = torch.zeros((1, 1), dtype=self.token_dtype, device=self.device)
                self._one = layout.inputs(token, 0)

    # -- running -----------------------------------------------------------------------
    def _call(self, tokens: Sequence[int], pos: int) -> torch.Tensor:
        inputs = self._one
        if inputs is not None and len(tokens) == 1:
            inputs[0].fill_(tokens[0])
            inputs[1].fill_(pos)
        else:
            t = torch.tensor([list(tokens)], dtype=self.token_dtype, device=self.device)
            inputs = self.layout.inputs(t, pos)
        start = time.perf_counter()
        logits: torch.Tensor = self.method.execute(inputs)[0]
        self.execution_ms += (time.perf_counter() - start) * 1e3
        if logits.dim() == 3:
            logits = logits[:, -1, :]
        return logits

    def prefill(self, tokens: Sequence[int], pos: int, history: Sequence[int] = ()) -> torch.Tensor:
        """Evaluate ``tokens`` at positions ``pos, pos + 1, ...``; the last position's logits.
        A program that reads its whole context (:attr:`reads_context`) re-reads ``history``
        (the tokens before them) with them, as :meth:`step` does."""
        if not tokens:
            raise GenerationError("prefill needs at least one token")
        tokens = token_ids(tokens, self.token_dtype)
        if pos + len(tokens) > self.max_context_len:
            raise GenerationError(
                f"{len(tokens)} tokens at position {pos} do not fit the context of "
                f"{self.max_context_len} tokens"
            )
        if self.reads_context:
            return handed_logits(self._call(self._whole(history, tokens), 0), self.share_logits)
        logits: torch.Tensor | None = None
        step = self.max_chunk
        for i in range(0, len(tokens), step):
            logits = self._call(tokens[i : i + step], pos + i)
        assert logits is not None
        return handed_logits(logits, self.share_logits)

    def step(self, token: int, pos: int, history: Sequence[int] = ()) -> torch.Tensor:
        """Evaluate one token at ``pos`` (a program reading its whole context re-reads
        ``history``, every token before it); its logits."""
        if pos >= self.max_context_len:
            raise GenerationError(
                f"position {pos} is past the context of {self.max_context_len} tokens"
            )
        if type(token) is not int or not 0 <= token <= self._top:
            (token,) = token_ids((token,), self.token_dtype)
        if self.reads_context:
            return handed_logits(self._call(self._whole(history, (token,)), 0), self.share_logits)
        return handed_logits(self._call((token,), pos), self.share_logits)

    def _whole(self, history: Sequence[int], tokens: Sequence[int]) -> list[int]:
        """What a program reading its whole context is fed: ``history`` then ``tokens``,
        all of it (a window of the last tokens would be another model's answer)."""
        ids = [*history, *tokens]
        if len(ids) > self.max_chunk:
            raise GenerationError(
                f"a context of {len(ids)} tokens is more than the {self.max_chunk} one call "
                "of this program reads (it keeps no KV cache)"
            )
        return ids


def token_ids(tokens: Sequence[Any], dtype: torch.dtype) -> list[int]:
    """``tokens`` checked as token ids (:func:`~ptexec.llm.inputs.token_id`) that a token
    input of ``dtype`` holds, before anything runs: a float would be cut (7.9 ran as
    token 7); otherwise a :class:`GenerationError`."""
    try:
        top = torch.iinfo(dtype).max
    except TypeError:  # not an integer dtype (an odd embedding method): the ids' own bound
        top = (1 << 64) - 1
    ids = []
    for t in tokens:
        if type(t) is not int:
            try:
                t = token_id(t)
            except TypeError as e:
                raise GenerationError(str(e)) from None
        if not 0 <= t <= top:
            raise GenerationError(f"token ids are 0 to {top}, got {t}")
        ids.append(t)
    return ids


def handed_logits(logits: torch.Tensor, share: bool) -> torch.Tensor:
    """``logits`` as a decoder's ``step`` and ``prefill`` hand them out: a copy the
    caller keeps, unless ``share`` (the view itself, valid until the next call)."""
    return logits if share else logits.clone()
