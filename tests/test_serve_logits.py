"""Logits processing: penalties and min-p equal transformers' processors on the same logits;
presence/frequency penalties follow OpenAI's definition; a user's processor is called with
the context; grammar-constrained generations validate on every seeded sample."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_support import PROMPT, llm_programs, program
from ptexec.llm import GenerationConfig, MultimodalRunner, Sampler, make_token_input
from ptexec.llm.logits import PresenceFrequencyPenalty, RepetitionPenalty, as_processors

pytest.importorskip("tokenizers")


def _logits(seed: int, vocab: int = 97) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, vocab, generator=g) * 3


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_equals_transformers(penalty: float) -> None:
    tp = pytest.importorskip("transformers.generation.logits_process")
    ids = torch.tensor([[3, 5, 5, 40, 96, 0]])
    for seed in range(5):
        scores = _logits(seed)
        want = tp.RepetitionPenaltyLogitsProcessor(penalty)(ids, scores.clone())
        got = RepetitionPenalty(penalty)(ids, scores.clone())
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("min_p", "temperature", "top_k", "top_p"),
    [(0.05, 1.0, 0, 1.0), (0.2, 0.7, 0, 1.0), (0.1, 1.3, 20, 0.9), (0.5, 1.0, 0, 0.95)],
)
def test_min_p_equals_transformers(
    min_p: float, temperature: float, top_k: int, top_p: float
) -> None:
    tp = pytest.importorskip("transformers.generation.logits_process")
    warpers: list[Any] = [tp.TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(tp.TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(tp.TopPLogitsWarper(top_p))
    warpers.append(tp.MinPLogitsWarper(min_p))
    ids = torch.tensor([[1]])
    sampler = Sampler(temperature, top_p, top_k, seed=0, min_p=min_p)
    for seed in range(5):
        scores = _logits(seed)
        scores_w = scores.clone()
        for w in warpers:
            scores_w = w(ids, scores_w)
        want = torch.softmax(scores_w, dim=-1)[0]
        got = sampler.distribution(scores[0])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert int((got > 0).sum()) == int((want > 0).sum())


def test_presence_and_frequency_follow_openai_definition() -> None:
    prompt = [4, 4, 9]  # prompt tokens are not counted
    generated = [7, 7, 7, 11, 4]
    p = PresenceFrequencyPenalty(presence=0.5, frequency=0.25)
    p.begin(prompt)
    scores = _logits(0, 16)
    got = p(torch.tensor([prompt + generated]), scores.clone())
    want = scores.clone()
    for token in set(generated):
        c = generated.count(token)
        want[0, token] -= (
            c * 0.25 + 0.5
        )  # mu[j] - c[j] * alpha_frequency - [c[j] > 0] * alpha_presence
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_sampler_runs_processors_on_the_context_and_greedy_sees_them() -> None:
    seen: list[list[int]] = []

    def ban_argmax(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen.append(ids[0].tolist())
        return scores.scatter(1, scores.argmax(dim=1, keepdim=True), float("-inf"))

    sampler = Sampler(0.0, processors=[ban_argmax])
    sampler.begin([1, 2])
    logits = torch.tensor([0.0, 5.0, 3.0, 1.0])
    assert sampler.sample(logits) == 2  # the maximum was banned
    assert sampler.sample(logits) == 2
    assert seen == [[1, 2], [1, 2, 2]]
    with pytest.raises(TypeError, match=r"logits_processor\[1\]"):
        as_processors([ban_argmax, 3])
    with pytest.raises(ValueError, match="min_p"):
        Sampler(1.0, min_p=1.5)
    with pytest.raises(ValueError, match="repetition penalty"):
        RepetitionPenalty(0.0)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> MultimodalRunner:
    tok = llm_programs.make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    torch.set_num_threads(1)
    return MultimodalRunner(str(program("portable")), str(tok), print_output=False)


def test_runner_applies_penalties_like_transformers_in_the_loop(runner: MultimodalRunner) -> None:
    tp = pytest.importorskip("transformers.generation.logits_process")
    ids = runner.tokenizer.encode(PROMPT)
    reference = tp.RepetitionPenaltyLogitsProcessor(1.8)
    config = GenerationConfig(
        max_new_tokens=12, temperature=0, echo=False, ignore_eos=True, logits_processor=reference
    )
    runner.reset()
    runner.generate_text([make_token_input(ids)], config)
    with_transformers = list(runner.generated_tokens)
    runner.reset()
    config.logits_processor = RepetitionPenalty(1.8)
    runner.generate_text([make_token_input(ids)], config)
    assert runner.generated_tokens == with_transformers
    runner.reset()
    config.logits_processor = None
    runner.generate_text([make_token_input(ids)], config)
    plain = list(runner.generated_tokens)
    assert plain != with_transformers  # the penalty changed the greedy text
    assert len(set(with_transformers)) >= len(set(plain))


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", "none"]},
    },
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}


@pytest.mark.slow  # about 30 s on two busy cores
def test_json_schema_generations_validate_on_50_seeds(runner: MultimodalRunner) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from ptexec.llm.constrained import Grammar, Vocabulary

    vocab = Vocabulary.of(runner.tokenizer, runner.vocab_size, runner.eos_ids)
    grammar = Grammar.json_schema(vocab, SCHEMA)
    ids = runner.tokenizer.encode(PROMPT)
    outputs = set()
    for seed in range(50):
        runner.reset()
        config = GenerationConfig(
            max_new_tokens=48, temperature=1.0, top_p=1.0, seed=seed, echo=False,
            logits_processor=grammar,
        )  # fmt: skip
        text = runner.generate_text([make_token_input(ids)], config)
        assert runner.finish_reason == "stop", (seed, text)
        jsonschema.validate(json.loads(text), SCHEMA)
        outputs.add(text)
    assert len(outputs) > 40  # sampled, not one answer


def test_regex_and_invalid_grammars(runner: MultimodalRunner, tmp_path: Path) -> None:
    import re

    from ptexec.llm.constrained import Grammar, GrammarError, Vocabulary

    vocab = Vocabulary.of(runner.tokenizer, runner.vocab_size, runner.eos_ids)
    grammar = Grammar.regex(vocab, r"(cat|dog) [0-9]{1,3}")
    for seed in range(5):
        runner.reset()
        config = GenerationConfig(
            max_new_tokens=16, temperature=1.0, seed=seed, echo=False, logits_processor=grammar
        )
        text = runner.generate_text([make_token_input([1, 5, 6])], config)
        assert re.fullmatch(r"(cat|dog) [0-9]{1,3}", text), text
    with pytest.raises(GrammarError, match="JSON schema"):
        Grammar.json_schema(vocab, "{not json")
    with pytest.raises(GrammarError):
        Grammar.regex(vocab, "(unclosed")


def test_min_p_in_the_loop_equals_transformers_warpers(runner: MultimodalRunner) -> None:
    """min_p in the text runner samples what transformers' temperature and min-p warpers
    (run as processors) leave, with the same seed."""
    tp = pytest.importorskip("transformers.generation.logits_process")
    ids = runner.tokenizer.encode(PROMPT)
    warpers = [tp.TemperatureLogitsWarper(0.8), tp.MinPLogitsWarper(0.2)]
    for seed in range(3):
        runs = []
        for config in (
            GenerationConfig(temperature=0.8, top_p=1.0, min_p=0.2, seed=seed),
            GenerationConfig(temperature=1.0, top_p=1.0, seed=seed, logits_processor=warpers),
        ):
            config.max_new_tokens, config.echo, config.ignore_eos = 12, False, True
            runner.reset()
            runner.generate_text([make_token_input(ids)], config)
            runs.append(list(runner.generated_tokens))
        assert runs[0] == runs[1], seed


def test_load_options_are_one_rule_checked_before_loading(tmp_path: Path) -> None:
    """Every runner takes the same load options (device_map, compile, xnnpack); a bad
    xnnpack choice is refused before the program is read."""
    from ptexec.errors import GenerationError
    from ptexec.llm import Seq2SeqRunner, TextLLMRunner
    from ptexec.llm.decoder import load_options

    assert load_options() == {"xnnpack": "auto"}
    assert load_options("cuda", "background", "torch") == {
        "xnnpack": "torch",
        "device_map": "cuda",
        "compile": "background",
    }
    missing = tmp_path / "missing.pte"
    for make in (TextLLMRunner, MultimodalRunner, Seq2SeqRunner):
        with pytest.raises(GenerationError, match="xnnpack must be one of"):
            make(missing, tmp_path / "tokenizer.json", xnnpack="xla")


def test_a_grammar_the_tokenizer_cannot_write_is_an_error(runner: MultimodalRunner) -> None:
    """A grammar whose first characters no token can write is refused when it is made
    (it failed at the first sampled token: a 500 from a server); one that can begin but
    not go on fails at the token it cannot continue with."""
    from ptexec.errors import GenerationError
    from ptexec.llm.constrained import Grammar, GrammarError, Vocabulary

    vocab = Vocabulary.of(runner.tokenizer, runner.vocab_size, runner.eos_ids)
    with pytest.raises(GrammarError, match="cannot write its first characters"):
        Grammar.regex(vocab, "\u00e9\u00e9")  # no token of this vocabulary has it
    grammar = Grammar.regex(vocab, "a\u00e9")  # "a" can begin it, nothing can go on
    runner.reset()
    config = GenerationConfig(max_new_tokens=4, temperature=1.0, seed=0, logits_processor=grammar)
    with pytest.raises(GrammarError, match="cannot write what the grammar needs next"):
        runner.generate_text([make_token_input([1, 5, 6])], config)
    assert issubclass(GrammarError, GenerationError)
    runner.reset()  # the runner works after the error
    runner.generate_text([make_token_input([1, 5, 6])], GenerationConfig(max_new_tokens=2))
    assert 1 <= len(runner.generated_tokens) <= 2


def test_a_grammar_may_go_on_through_special_tokens_and_eos(tmp_path: Path) -> None:
    """A grammar naming a special token (a tool call's marker) or ending in EOS goes on
    through it: only a mask that lets nothing through but tokens the grammar refuses is a
    dead end (the vocabulary lacking a character)."""
    pytest.importorskip("llguidance")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from ptexec.llm.constrained import Grammar, Vocabulary
    from ptexec.llm.tokenizer import HuggingFaceTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<eos>", special=True), AddedToken("<call>", special=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<eos>"}')
    hf = HuggingFaceTokenizer(tmp_path / "tokenizer.json")
    eos, call, a = (tok.token_to_id(t) for t in ("<eos>", "<call>", "a"))
    vocab = Vocabulary.of(hf, hf.vocab_size + 8, [eos])

    def steps(grammar: Grammar, ids: list[int]) -> list[int]:
        """Feed ``ids`` one by one (each allowed); what is allowed after them."""
        grammar.begin([])
        for k in range(len(ids) + 1):
            scores = grammar(torch.tensor([ids[:k]]), torch.zeros(1, vocab.size))
            allowed = (scores[0] > float("-inf")).nonzero().flatten().tolist()
            if k < len(ids):
                assert ids[k] in allowed, (k, allowed[:8])
        return allowed

    assert steps(Grammar.lark(vocab, 'start: "a" <call> "a"'), [a, call, a]) == [eos]
    assert steps(Grammar.lark(vocab, 'start: <call> "a"'), [call, a]) == [eos]
    assert steps(Grammar.lark(vocab, f'start: "a" <[{eos}]>'), [a]) == [eos]
    assert steps(Grammar.regex(vocab, "-?"), []) != []  # the empty text is complete
