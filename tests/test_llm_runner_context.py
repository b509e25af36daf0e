"""``ptexec.llm``: what a generation reads of the context it continues: ``prefill`` then
``generate("")`` (processors and config), and programs without a KV cache over several
calls. References: ExecuTorch's runtime with transformers' logits processors, and a
hand-computed model."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_support import PROMPT, executorch_logits, llm_programs, program
from ptexec.errors import GenerationError
from ptexec.llm import GenerationConfig, TextLLMRunner
from ptexec.llm.decoder import TextDecoder

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llm_programs.make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _runner(tokenizer: Path) -> TextLLMRunner:
    return TextLLMRunner(str(program("portable")), str(tokenizer), print_output=False)


class _Record:
    """A logits processor that records the ``input_ids`` it is given."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.seen.append(ids[0].tolist())
        return scores


# --------------------------------------------------------------------------------------
# prefill(prompt), then generate("")


def test_prefill_then_generate_processors_see_every_token(tokenizer: Path) -> None:
    """Each step's processors get the prompt and every token generated before it (the
    first included), as transformers gives them ``input_ids``: a repetition penalty gives
    the tokens of a greedy loop on ExecuTorch's runtime with transformers' processor."""
    tp = pytest.importorskip("transformers.generation.logits_process")
    n = 8
    r = _runner(tokenizer)
    prompt = r.tokenizer.encode(PROMPT)
    # reference: ExecuTorch's logits over the whole sequence, transformers' penalty
    penalty = tp.RepetitionPenaltyLogitsProcessor(3.0)
    seq = list(prompt)
    for _ in range(n):
        row = executorch_logits(program("portable"), seq)[-1].reshape(1, -1)
        seq.append(int(penalty(torch.tensor([seq]), row).argmax()))
    want = seq[len(prompt) :]
    assert len(set(want)) == n, "the penalty should keep the tokens apart"

    record = _Record()
    config = GenerationConfig(
        max_new_tokens=n,
        temperature=0.0,
        echo=False,
        ignore_eos=True,
        logits_processor=[record, tp.RepetitionPenaltyLogitsProcessor(3.0)],
    )
    r.prefill(PROMPT, GenerationConfig(temperature=0.0))
    r.generate_text("", config)
    assert r.generated_tokens == want
    assert record.seen == [seq[: len(prompt) + i] for i in range(n)]


def test_prefill_then_generate_samples_with_the_generate_config(tokenizer: Path) -> None:
    """Every token ``generate("")`` returns is sampled with its own config, not with the
    config ``prefill`` was given: greedy after a hot prefill is greedy, and a seeded call
    samples what the same call after the prompt samples."""
    r = _runner(tokenizer)
    greedy = GenerationConfig(max_new_tokens=4, temperature=0.0, echo=False, ignore_eos=True)
    want = executorch_logits(program("portable"), r.tokenizer.encode(PROMPT))[-1]
    for seed in range(4):
        r.reset()
        r.prefill(PROMPT, GenerationConfig(temperature=50.0, seed=seed))  # nearly uniform
        r.generate_text("", greedy)
        assert r.generated_tokens[0] == int(want.argmax())
    hot = GenerationConfig(max_new_tokens=6, temperature=5.0, seed=3, echo=False, ignore_eos=True)
    r.reset()
    r.generate_text(PROMPT, hot)
    sampled = list(r.generated_tokens)
    r.reset()
    r.prefill(PROMPT, GenerationConfig(temperature=0.0))
    r.generate_text("", hot)
    assert r.generated_tokens == sampled


def test_prefill_then_generate_keeps_the_grammar(tokenizer: Path) -> None:
    """A grammar sees the first token too: the text matches it, as after generate(prompt)."""
    pytest.importorskip("llguidance")
    from ptexec.llm.constrained import Grammar, Vocabulary

    r = _runner(tokenizer)
    vocab = Vocabulary.of(r.tokenizer, r.vocab_size, r.eos_ids)
    pattern = r"x[0-9]{3}"

    def config() -> GenerationConfig:
        grammar = Grammar.regex(vocab, pattern)
        return GenerationConfig(
            temperature=0.0, max_new_tokens=12, echo=False, logits_processor=grammar
        )

    want = r.generate_text(PROMPT, config())
    assert re.fullmatch(pattern, want), want
    r.reset()
    c = config()
    r.prefill(PROMPT, c)
    text = r.generate_text("", c)
    assert re.fullmatch(pattern, text), text
    assert text == want


# --------------------------------------------------------------------------------------
# a program without a KV cache: forward(tokens) reads the whole context every call

_NOKV_VOCAB = 64
_NOKV_WINDOW = 16


@pytest.fixture(scope="module")
def nokv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny program without a KV cache, ``forward(tokens int64[1, n <= 16])``, whose
    argmax is ``sum(tokens) % 64``, and a word-level tokenizer ``t0 .. t63``."""
    return _nokv_program(tmp_path_factory.mktemp("nokv"), {})


def _nokv_program(d: Path, extra: dict[str, Any], static: bool = False) -> tuple[Path, Path]:
    pytest.importorskip("executorch.exir")
    from executorch.exir import to_edge
    from torch.export import Dim, export

    class SumModel(torch.nn.Module):
        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            s = tokens.sum(dim=1) % _NOKV_VOCAB
            return torch.nn.functional.one_hot(s, _NOKV_VOCAB).float() * 10.0

    n = Dim("n", min=1, max=_NOKV_WINDOW)
    example = (torch.ones(1, 4, dtype=torch.long),)
    ep = export(SumModel(), example, dynamic_shapes=None if static else {"tokens": {1: n}})
    metadata: dict[str, Any] = {
        "get_max_seq_len": _NOKV_WINDOW,
        "use_kv_cache": False,
        "enable_dynamic_shape": True,
        "get_vocab_size": _NOKV_VOCAB,
        "get_bos_id": 1,
        "get_eos_ids": [63],
        **extra,
    }
    pte = d / "nokv.pte"
    pte.write_bytes(to_edge(ep, constant_methods=metadata).to_executorch().buffer)
    return pte, _word_tokenizer(d)


def _word_tokenizer(d: Path) -> Path:
    """A word-level tokenizer ``t0 .. t63`` in ``d`` (BOS t1, EOS t63)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(_NOKV_VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "t1", "eos_token": "t63"}))
    return d / "tokenizer.json"


def _sum_model(context: list[int], n: int) -> list[int]:
    """The sum model's greedy tokens after ``context`` (hand-computed)."""
    out: list[int] = []
    for _ in range(n):
        out.append(sum((context + out)[-_NOKV_WINDOW:]) % _NOKV_VOCAB)
    return out


def test_no_kv_cache_program_reads_the_earlier_calls(nokv: tuple[Path, Path]) -> None:
    """A follow-up call's first token comes from the whole context (earlier calls and the
    prompt), as its later tokens do."""
    pte, tok = nokv
    r = TextLLMRunner(str(pte), str(tok), print_output=False)
    assert not r.decoder.use_kv_cache
    config = GenerationConfig(temperature=0.0, max_new_tokens=3, echo=False, ignore_eos=True)
    context: list[int] = []
    for prompt in ("t5 t7", "t11 t13", "t2"):
        r.generate_text(prompt, config)
        context += [int(w[1:]) for w in prompt.split()]
        want = _sum_model(context, 3)
        assert r.generated_tokens == want, prompt
        context += want[:-1]  # the last token is not in the context (as ExecuTorch's)
    # prefill, then generate(""): the same context
    r.reset()
    r.generate_text("t3 t4", config)
    r.prefill("t9")
    r.generate_text("", config)
    context = [3, 4, *_sum_model([3, 4], 3)[:-1], 9]
    assert r.generated_tokens == _sum_model(context, 3)


def test_no_kv_cache_context_is_what_one_call_reads(tmp_path: Path) -> None:
    """A program without a KV cache whose context metadata is longer than one call's
    tokens (ExecuTorch's exporter writes get_max_context_len 128 beside a token bound of
    15): the model reads its whole context in each call, so the context is that bound and
    the last token, which no call reads. A longer prompt is refused and generation stops
    there, not fed a window of the last tokens (another model's answer: the sum of the
    last 16 tokens, not of all)."""
    pte, tok = _nokv_program(tmp_path, {"get_max_context_len": 4 * _NOKV_WINDOW})
    r = TextLLMRunner(str(pte), str(tok), print_output=False)
    assert r.max_context_len == _NOKV_WINDOW + 1
    config = GenerationConfig(temperature=0.0, max_new_tokens=-1, echo=False, ignore_eos=True)
    prompt = [5, 7, 11, 13, 2, 3]
    r.generate_text(" ".join(f"t{i}" for i in prompt), config)
    assert r.finish_reason == "length"
    generated = r.generated_tokens
    assert len(prompt) + len(generated) == _NOKV_WINDOW + 1  # as ExecuTorch's budget counts
    context = list(prompt)
    for token in generated:  # each the sum of the whole context before it
        assert token == sum(context) % _NOKV_VOCAB
        context.append(token)
    r.reset()
    with pytest.raises(GenerationError, match="do not fit the context of 17"):
        r.generate_text(" ".join(["t1"] * (_NOKV_WINDOW + 1)), config)
    # a decoder is not fed more than one call reads, nor a window of it
    with pytest.raises(GenerationError, match="more than the 16 one call"):
        r.decoder.step(1, _NOKV_WINDOW, [1] * _NOKV_WINDOW)


def test_no_kv_cache_program_bounded_at_max_seq_len_minus_one_fills_its_context(
    tmp_path: Path,
) -> None:
    """ExecuTorch's exporter bounds the tokens of a call at get_max_seq_len - 1 (16 here,
    get_max_seq_len 17) and writes get_max_context_len as get_max_seq_len. ExecuTorch's
    runner generates get_max_seq_len minus the prompt's tokens (its
    resolve_max_new_tokens), its last step reading 16 tokens, which the program takes:
    the same count here, and a prompt of 16 tokens generates one."""
    et = pytest.importorskip("executorch.extension.llm.runner")
    context_len = _NOKV_WINDOW + 1
    pte, tok = _nokv_program(
        tmp_path, {"get_max_seq_len": context_len, "get_max_context_len": context_len}
    )
    r = TextLLMRunner(str(pte), str(tok), print_output=False)
    config = GenerationConfig(temperature=0.0, max_new_tokens=-1, echo=False, ignore_eos=True)
    for prompt in ([5, 7, 11, 13, 2, 3], [3] * _NOKV_WINDOW):
        r.reset()
        r.generate_text(" ".join(f"t{i}" for i in prompt), config)
        want = et.GenerationConfig(max_new_tokens=-1).resolve_max_new_tokens(
            context_len, len(prompt)
        )
        assert len(r.generated_tokens) == want
        assert r.generated_tokens == _sum_model(prompt, want)
        assert r.finish_reason == "length"


def test_a_static_no_kv_cache_program_is_refused_when_the_runner_is_made(
    tmp_path: Path,
) -> None:
    """Without a cache, each call reads the whole (growing) context: a token input of
    one fixed length cannot take it (ExecuTorch's runner cannot run it either)."""
    pte, tok = _nokv_program(tmp_path, {"enable_dynamic_shape": False}, static=True)
    with pytest.raises(GenerationError, match="exactly 4 tokens a call"):
        TextLLMRunner(str(pte), str(tok), print_output=False)


def test_no_kv_cache_prefill_feeds_what_step_feeds(nokv: tuple[Path, Path]) -> None:
    """``TextDecoder.prefill`` with the history reads what ``step`` reads."""
    import ptexec

    pte, _ = nokv
    decoder = TextDecoder(ptexec.load(pte))
    history = list(range(20, 32))
    prompt = [40, 50, 60]
    got = decoder.prefill(prompt, len(history), history)
    want = decoder.step(prompt[-1], len(history) + 2, history + prompt[:-1])
    assert torch.equal(got, want)
    assert int(got.argmax()) == sum((history + prompt)[-_NOKV_WINDOW:]) % _NOKV_VOCAB


def _counting_program(d: Path, static: bool) -> tuple[Path, Path]:
    """A program said to keep a cache (no ``use_kv_cache`` method: ExecuTorch's default)
    that takes no position: it keeps a running sum of every token it is fed in a buffer,
    and its argmax is that sum % 64. ``static``: one token a call; else up to 16."""
    pytest.importorskip("executorch.exir")
    from executorch.exir import to_edge
    from torch.export import Dim, export

    class Counting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("total", torch.zeros(1, dtype=torch.long))

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            self.total.add_(tokens.sum(dim=1))
            return torch.nn.functional.one_hot(self.total % _NOKV_VOCAB, _NOKV_VOCAB).float()

    example = (torch.ones(1, 1 if static else 4, dtype=torch.long),)
    n = Dim("n", min=1, max=_NOKV_WINDOW)
    ep = export(Counting(), example, dynamic_shapes=None if static else {"tokens": {1: n}})
    metadata = {"get_max_seq_len": _NOKV_WINDOW, "get_vocab_size": _NOKV_VOCAB, "get_eos_ids": [63]}
    pte = d / "counting.pte"
    pte.write_bytes(to_edge(ep, constant_methods=metadata).to_executorch().buffer)
    return pte, _word_tokenizer(d)


@pytest.mark.parametrize("static", [True, False], ids=["one-token", "dynamic"])
def test_a_program_said_to_keep_a_cache_without_a_position_is_fed_new_tokens(
    tmp_path: Path, static: bool
) -> None:
    """A program whose metadata says it keeps a cache but that takes no position input
    is fed each token once, as ExecuTorch's runner feeds it: the whole prompt (one token
    a call when its input takes one), then each generated token alone; not the last
    prompt token alone, nor the whole context again each step."""
    pytest.importorskip("executorch.runtime")
    from executorch.runtime import Runtime

    pte, tok = _counting_program(tmp_path, static)
    prompt, n = [5, 7, 11], 4
    method: Any = Runtime.get().load_program(str(pte)).load_method("forward")
    for fed in [[t] for t in prompt] if static else [prompt]:
        out = method.execute([torch.tensor([fed])])[0]
    want = [int(out.argmax())]
    while len(want) < n:
        want.append(int(method.execute([torch.tensor([[want[-1]]])])[0].argmax()))
    assert want == [23, 46, 28, 56]  # each the sum of every token fed, % 64

    r = TextLLMRunner(str(pte), str(tok), print_output=False)
    config = GenerationConfig(temperature=0.0, max_new_tokens=n, echo=False, ignore_eos=True)
    r.generate_text(" ".join(f"t{i}" for i in prompt), config)
    assert r.generated_tokens == want


def _shared_cache_program(d: Path) -> tuple[Path, Path]:
    """A KV cache program exported with ``share_mutable_buffers=True`` (as ExecuTorch's
    multi-method LLM export writes a base and a LoRA method over one cache): ``forward``
    and ``lora_forward`` take one token at a position, store it in the cache there, and
    their argmax is the sum of the cache up to that position, % 64."""
    pytest.importorskip("executorch.exir")
    import copy

    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass
    from torch.export import export

    class Cache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(_NOKV_WINDOW, dtype=torch.long))

        def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
            self.cache.index_copy_(0, input_pos, tokens[0])
            seen = (self.cache * (torch.arange(_NOKV_WINDOW) <= input_pos)).sum(0, keepdim=True)
            return torch.nn.functional.one_hot(seen % _NOKV_VOCAB, _NOKV_VOCAB).float()[None]

    example = (torch.ones(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    programs = {
        name: export(copy.deepcopy(Cache()), example) for name in ("forward", "lora_forward")
    }
    config = ExecutorchBackendConfig(
        emit_mutable_buffer_names=True,
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
    )
    metadata = {
        "get_max_seq_len": _NOKV_WINDOW,
        "get_vocab_size": _NOKV_VOCAB,
        "get_bos_id": 1,
        "get_eos_ids": [63],
        "enable_dynamic_shape": False,
    }
    pte = d / "shared_cache.pte"
    pte.write_bytes(to_edge(programs, constant_methods=metadata).to_executorch(config).buffer)
    return pte, _word_tokenizer(d)


def test_runners_over_one_program_whose_methods_share_state_keep_their_own_cache(
    tmp_path: Path,
) -> None:
    """Runners (server sessions) over one loaded program each keep their own context,
    also where the program's methods share one state buffer: a generation in one runner
    between another's prefill and its continuation changes nothing of the latter."""
    import ptexec

    pte, tok = _shared_cache_program(tmp_path)
    program = ptexec.load(pte)
    assert program.shared_buffer_indices  # forward and lora_forward share the cache
    config = GenerationConfig(temperature=0.0, max_new_tokens=3, echo=False, ignore_eos=True)
    first = TextLLMRunner(program, str(tok), print_output=False)
    second = TextLLMRunner(program, str(tok), print_output=False)
    first.prefill("t5 t7")
    second.generate_text("t3 t4", config)
    first.generate_text("", config)
    assert first.generated_tokens == [12, 24, 48]  # 5 + 7, then the running sums
    assert second.generated_tokens == [7, 14, 28]
    # the runner's methods still share their state with one another
    lora = first.program.load_method("lora_forward")
    (logits,) = lora.execute([torch.tensor([[0]]), torch.tensor([2])])
    assert int(logits.argmax()) == 12  # forward's cache: 5 and 7 at positions 0 and 1


def _shared_cache_seq2seq(d: Path) -> Path:
    """An encoder-decoder program exported with ``share_mutable_buffers=True``: the
    ``text_decoder`` stores its token in a cache at its position, and its argmax is the sum
    of the cache up to that position, % 64 (the encoder's states are not read)."""
    pytest.importorskip("executorch.exir")
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass
    from torch.export import export

    class Encoder(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2.0

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(_NOKV_WINDOW, dtype=torch.long))

        def forward(
            self, ids: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor
        ) -> torch.Tensor:
            self.cache.index_copy_(0, pos, ids[0])
            seen = (self.cache * (torch.arange(_NOKV_WINDOW) <= pos)).sum(0, keepdim=True)
            logits = torch.nn.functional.one_hot(seen % _NOKV_VOCAB, _NOKV_VOCAB).float()
            return logits[None] + hidden.sum() * 0

    step = (
        torch.ones(1, 1, dtype=torch.long),
        torch.ones(1, 4, 8),
        torch.zeros(1, dtype=torch.long),
    )
    programs = {
        "encoder": export(Encoder(), (torch.ones(1, 4, 8),)),
        "text_decoder": export(Decoder(), step),
    }
    config = ExecutorchBackendConfig(
        emit_mutable_buffer_names=True,
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
    )
    edge = to_edge(programs, constant_methods={"get_max_seq_len": _NOKV_WINDOW})
    pte = d / "shared_cache_seq2seq.pte"
    pte.write_bytes(edge.to_executorch(config).buffer)
    return pte


def test_seq2seq_runners_over_one_program_whose_methods_share_state_keep_their_own_cache(
    tmp_path: Path,
) -> None:
    """Two Seq2SeqRunners over one loaded program whose methods share one state buffer: a
    generation of one inside another's (after its first token) changes nothing of the
    latter's tokens, which are those of a generation alone (hand-computed sums)."""
    import ptexec
    from ptexec.llm import Seq2SeqRunner

    program = ptexec.load(_shared_cache_seq2seq(tmp_path))
    assert program.shared_buffer_indices  # encoder and text_decoder share the cache
    tok = _word_tokenizer(tmp_path)
    config = GenerationConfig(temperature=0.0, max_new_tokens=4)

    def runner(start: int) -> Seq2SeqRunner:
        return Seq2SeqRunner(
            program, tok, decoder_start_token_id=start, eos_ids=[63], generation_config={}
        )

    first, second = runner(3), runner(5)
    features = torch.ones(1, 4, 8)
    inner: list[list[int]] = []

    def between(_: str) -> None:
        if not inner:
            inner.append(second.generate(features, config))

    assert first.generate(features, config, token_callback=between) == [3, 6, 12, 24]
    assert inner == [[5, 10, 20, 40]]


def test_runners_of_programs_with_other_bos_ids_leave_the_tokenizer_given_as_it_is(
    tmp_path: Path,
) -> None:
    """One tokenizer (BOS t1) given to runners of programs whose ``get_bos_id`` differ:
    each runner encodes its program's BOS, and the tokenizer given still encodes its own
    (the ``tokenizers`` library's ids with tokenizer_config.json's BOS)."""
    from tokenizers import Tokenizer as HFTokenizer

    from ptexec.llm.tokenizer import load_tokenizer

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    two, tok = _nokv_program(tmp_path / "a", {"get_bos_id": 2})
    one, _ = _nokv_program(tmp_path / "b", {"get_bos_id": 1})
    tokenizer = load_tokenizer(tok)
    reference = [1, *HFTokenizer.from_file(str(tok)).encode("t5").ids]  # BOS t1
    first = TextLLMRunner(str(two), tokenizer, print_output=False)
    assert tokenizer.encode("t5", 1) == reference == [1, 5]
    TextLLMRunner(str(one), tokenizer, print_output=False)
    config = GenerationConfig(
        temperature=0.0, max_new_tokens=1, echo=False, ignore_eos=True, num_bos=1
    )
    first.generate_text("t5", config)
    assert first.generated_tokens == [2 + 5]  # the sum model over BOS 2 and t5


def test_metadata_runs_only_the_methods_executorchs_runner_reads(tmp_path: Path) -> None:
    """ExecuTorch's runner reads the metadata methods it names (get_max_seq_len,
    get_max_context_len, get_vocab_size, get_bos_id, get_eos_ids, use_kv_cache,
    use_sdpa_with_kv_cache, enable_dynamic_shape), computed or not; another input-free
    method of such a name (or, for the multimodal runner, of any name) is read only when
    it is a constant (no instructions), so that building a runner never runs a program's
    own computation."""
    pytest.importorskip("executorch.exir")
    from executorch.exir import to_edge
    from torch.export import export

    import ptexec
    from ptexec.llm import read_metadata

    class Tokens(torch.nn.Module):
        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.one_hot(tokens.sum(dim=1) % 8, 8).float()

    class Computed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", torch.arange(4))

        def forward(self) -> torch.Tensor:
            return (self.w * self.w).sum()  # 14

    programs = {
        "forward": export(Tokens(), (torch.ones(1, 4, dtype=torch.long),)),
        "get_vocab_size": export(Computed(), ()),
        "get_heavy": export(Computed(), ()),
    }
    metadata = {"get_max_seq_len": 4, "get_n_layers": 2, "use_custom_rope": True}
    pte = tmp_path / "metadata.pte"
    pte.write_bytes(to_edge(programs, constant_methods=metadata).to_executorch().buffer)
    prog = ptexec.load(pte)
    loaded: list[str] = []
    real = prog.load_method

    def load_method(name: str, *args: Any, **kwargs: Any) -> Any:
        loaded.append(name)
        return real(name, *args, **kwargs)

    prog.load_method = load_method  # type: ignore[method-assign]
    md = read_metadata(prog)
    assert md.values == {
        "get_max_seq_len": 4,
        "get_vocab_size": 14,
        "get_n_layers": 2,
        "use_custom_rope": True,
    }
    assert loaded == ["get_vocab_size"]
    # the multimodal runner's further metadata (placeholder ids, preprocessing fields)
    from ptexec.llm.multimodal import _metadata_values

    loaded.clear()
    assert _metadata_values(prog, {"forward", *md.values}) == {}
    assert loaded == []
