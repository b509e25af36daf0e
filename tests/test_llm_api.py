"""``ptexec.llm`` without a program: ExecuTorch's own runner tests with
``executorch.extension.llm.runner`` resolved to ``ptexec.llm``, the tokenizers of every
format, the sampler, and the configuration rules."""

from __future__ import annotations

import base64
import importlib.util
import io
import struct
import sys
import unittest
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec.llm as llm
from ptexec.errors import ConfigTypeError, ConfigValueError, PtexecError, TokenizerError
from ptexec.llm import GenerationConfig, Sampler, TextStream, load_tokenizer
from ptexec.llm.tokenizer import Tokenizer

# --------------------------------------------------------------------------------------
# ExecuTorch's own tests of its runner bindings


def _executorch_runner_tests() -> Path:
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("executorch is not installed")
    path = (
        Path(next(iter(spec.submodule_search_locations)))
        / "extension/llm/runner/test/test_runner_pybindings.py"
    )
    if not path.is_file():
        pytest.skip("this executorch wheel has no test_runner_pybindings.py")
    return path


def test_executorch_runner_pybindings_pass_on_ptexec(monkeypatch: pytest.MonkeyPatch) -> None:
    path = _executorch_runner_tests()
    monkeypatch.setitem(sys.modules, "executorch.extension.llm.runner", llm)
    spec = importlib.util.spec_from_file_location("et_test_runner_pybindings", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.GenerationConfig is llm.GenerationConfig  # the alias took effect
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=2).run(suite)
    assert result.testsRun >= 10, stream.getvalue()
    assert result.wasSuccessful(), stream.getvalue()
    assert not result.skipped, stream.getvalue()


# --------------------------------------------------------------------------------------
# configuration


def test_resolve_max_new_tokens_rules() -> None:
    c = GenerationConfig(seq_len=-1, max_new_tokens=-1)
    assert c.resolve_max_new_tokens(100, 30) == 70
    c = GenerationConfig(seq_len=-1, max_new_tokens=500)
    assert c.resolve_max_new_tokens(100, 30) == 70
    c = GenerationConfig(seq_len=40, max_new_tokens=-1)
    assert c.resolve_max_new_tokens(100, 30) == 10
    c = GenerationConfig(seq_len=400, max_new_tokens=5)
    assert c.resolve_max_new_tokens(100, 30) == 5
    assert GenerationConfig(seq_len=10).resolve_max_new_tokens(100, 30) == 0


def test_config_repr_has_ptexec_fields() -> None:
    r = repr(GenerationConfig(top_k=5, seed=3, stop=["\n\n"]))
    assert "top_k=5" in r and "seed=3" in r and "stop=" in r


# --------------------------------------------------------------------------------------
# sampler


def test_sampler_greedy_is_first_argmax() -> None:
    logits = torch.tensor([0.5, 3.0, 3.0, -1.0])
    assert Sampler(0.0).sample(logits) == 1
    assert Sampler(0.0).sample(logits[None, None]) == 1


def test_a_tiny_temperature_is_greedy_not_an_overflow() -> None:
    """OpenAI takes any temperature in [0, 2]. Dividing logits of 30 by 1e-40 overflowed
    float32 to inf, softmax gave NaN and the draw failed (a 500 from the server). Below
    ``GREEDY_BELOW`` (vLLM's 1e-5) the sampler takes the likeliest token, the limit of
    the distribution; at it, it still samples."""
    from ptexec.llm.sampling import GREEDY_BELOW

    logits = torch.tensor([30.0, 31.0, -5.0, 30.5])
    for t in (1e-300, 1e-40, 1e-38, 9.9e-6):
        s = Sampler(t, seed=3)
        assert s.greedy and s.sample(logits) == 1
        assert torch.equal(s.distribution(logits), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    s = Sampler(GREEDY_BELOW, seed=3)
    assert not s.greedy and s.sample(logits) == 1


def test_sampler_distribution_filters() -> None:
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    full = torch.softmax(logits / 2.0, 0)
    p = Sampler(2.0).distribution(logits)
    torch.testing.assert_close(p, full)
    p = Sampler(2.0, top_k=2).distribution(logits)
    torch.testing.assert_close(p[:2], full[:2] / full[:2].sum())
    assert not p[2:].any()
    # top-p keeps the smallest prefix whose mass reaches top_p
    cum = torch.cumsum(full, 0)
    keep = int((cum < 0.8).sum()) + 1
    p = Sampler(2.0, top_p=0.8).distribution(logits)
    torch.testing.assert_close(p[:keep], full[:keep] / full[:keep].sum())
    assert not p[keep:].any()
    assert Sampler(2.0, top_p=1e-6).distribution(logits).argmax() == 0


def test_sampler_top_p_keeps_what_transformers_keeps() -> None:
    """At the top-p boundary and among tied tokens, the sampler keeps the tokens
    transformers' TopPLogitsWarper keeps (the highest ids of a tie), with its
    probabilities."""
    tp = pytest.importorskip("transformers.generation.logits_process")
    g = torch.Generator().manual_seed(0)
    cases = [(torch.zeros(v), num / 20) for v in range(2, 41) for num in range(1, 20)]
    cases += [(torch.zeros(20), 0.3), (torch.zeros(20), 0.35)]  # cumulative-sum boundaries
    cases += [(torch.randint(-3, 3, (30,), generator=g).float(), p) for p in (0.25, 0.5, 0.9)]
    for logits, top_p in cases:
        for temperature, top_k in ((1.0, 0), (0.5, 7)):
            got = Sampler(temperature, top_p, top_k).distribution(logits)
            scores = logits.reshape(1, -1) / temperature
            if top_k:
                scores = tp.TopKLogitsWarper(top_k)(None, scores)
            want = torch.softmax(tp.TopPLogitsWarper(top_p)(None, scores), -1).reshape(-1)
            assert torch.equal(got > 0, want > 0), (logits.tolist(), top_p, temperature, top_k)
            torch.testing.assert_close(got, want)


def test_sampler_frequencies_follow_the_distribution() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0])
    s = Sampler(1.0, seed=0)
    n = 4000
    counts = torch.bincount(torch.tensor([s.sample(logits) for _ in range(n)]), minlength=4)
    expected = torch.softmax(logits, 0) * n
    # within 5 standard deviations of a binomial count
    sd = (expected * (1 - expected / n)).sqrt()
    assert ((counts - expected).abs() <= 5 * sd).all(), (counts, expected)


def test_sampler_seed_reproduces() -> None:
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    a = [Sampler(1.0, seed=11).sample(logits) for _ in range(1)]
    s1, s2 = Sampler(0.9, top_p=0.9, seed=11), Sampler(0.9, top_p=0.9, seed=11)
    assert [s1.sample(logits) for _ in range(30)] == [s2.sample(logits) for _ in range(30)]
    assert a


def test_sampler_seeds_differing_above_32_bits_draw_different_numbers() -> None:
    """torch's CPU generator keeps a seed's low 32 bits: seeds from 2**32 up are mixed down
    to 32 bits first, so ``s`` and ``s + 2**32`` (OpenAI's seed -1 and 2**32 - 1, as the
    server maps them) sample differently; seeds below 2**32 draw what torch draws."""
    logits = torch.zeros(512)

    def draws(seed: int) -> list[int]:
        s = Sampler(1.0, seed=seed)
        return [s.sample(logits) for _ in range(40)]

    for a, b in ((1, 1 + 2**32), (7, 7 + 5 * 2**32), (0, 2**63), (2**32 - 1, 2**64 - 1)):
        assert draws(a) != draws(b), (a, b)
    g = torch.Generator().manual_seed(5)
    want = [int(torch.multinomial(torch.full((512,), 1 / 512), 1, generator=g)) for _ in range(40)]
    assert draws(5) == want
    assert draws(2**40 + 3) == draws(2**40 + 3)  # still reproducible


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_sampler_refuses_nan_and_fully_masked_scores(temperature: float) -> None:
    """A row holding NaN (greedy's argmax would pick it) or masked to -inf everywhere has
    no token to choose: GenerationError, greedy or sampled, and the sampler goes on."""
    from ptexec.errors import GenerationError

    s = Sampler(temperature, seed=0)
    with pytest.raises(GenerationError, match="1 NaN"):
        s.sample(torch.tensor([1.0, float("nan"), 2.0, 3.0]))
    with pytest.raises(GenerationError, match="-inf"):
        s.sample(torch.full((4,), float("-inf")))
    assert s.sample(torch.tensor([0.0, 0.0, 9.0, float("-inf")])) == 2
    assert Sampler(temperature).sample(torch.tensor([float("-inf"), 1.0])) == 1


def test_token_logprobs_lists_ties_lower_id_first() -> None:
    """The alternatives are the likeliest ids, ties by lower id (topk picks among ties at
    its cut as it likes): greedy's token (the first maximum) is among them."""
    from ptexec.llm.logits import token_logprobs

    row = torch.tensor([0.0, 5.0, 5.0, 5.0, 5.0, 1.0])
    _, top = token_logprobs(row, 1, 2)
    assert [i for i, _ in top] == [1, 2]
    flat = torch.zeros(300)
    _, top = token_logprobs(flat, 0, 3)
    assert [i for i, _ in top] == [0, 1, 2]
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    _, top = token_logprobs(logits, 0, 5)
    assert [i for i, _ in top] == torch.topk(logits, 5).indices.tolist()


def test_sampler_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="temperature"):
        Sampler(-1.0)
    with pytest.raises(ValueError, match="top_p"):
        Sampler(1.0, top_p=0.0)


# --------------------------------------------------------------------------------------
# tokenizers


TEXT = "the cat sat on the mat. The dog ran far away, and then the cat ran too."


def _hf_tokenizer(path: Path) -> Path:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 3, trainer=trainer)
    tok.save(str(path))
    return path


def test_hf_tokenizer_detected_with_special_tokens(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    path = _hf_tokenizer(tmp_path / "tokenizer.json")
    tok = load_tokenizer(path)
    ref = Tokenizer.from_file(str(path))
    assert tok.kind == "Hugging Face"
    assert (tok.bos_id, tok.eos_id) == (ref.token_to_id("<s>"), ref.token_to_id("</s>"))
    ids = tok.encode(TEXT, bos=1, eos=1)
    assert ids == [tok.bos_id, *ref.encode(TEXT, add_special_tokens=False).ids, tok.eos_id]
    assert tok.decode(ids, skip_special_tokens=True) == TEXT
    assert load_tokenizer(tmp_path).kind == "Hugging Face"  # a directory holding it


def test_a_vocabulary_with_gaps_counts_to_its_largest_id(tmp_path: Path) -> None:
    """``vocab_size`` is one past the largest id, also where a tokenizer.json's ids have
    gaps: it was the number of entries (4 for ids up to 9), so the runner sampled ids below
    4 only and refused a prompt holding the tokenizer's own id 9."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    ref = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 5, "ab": 9}, unk_token="<unk>"))
    ref.pre_tokenizer = pre_tokenizers.Whitespace()
    ref.save(str(tmp_path / "tokenizer.json"))
    ref = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert tok.vocab_size == max(ref.get_vocab(with_added_tokens=True).values()) + 1 == 10
    assert max(tok.encode("ab b a")) < tok.vocab_size


def test_a_tokenizer_saved_with_truncation_or_padding_encodes_whole_prompts(
    tmp_path: Path,
) -> None:
    """A tokenizer.json saved with truncation and padding on (a training script's) cut
    every prompt to 4 ids and padded it to 12: transformers' tokenizers switch both off
    unless a call asks for them, and so does ptexec."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    path = _hf_tokenizer(tmp_path / "tokenizer.json")
    t = Tokenizer.from_file(str(path))
    t.enable_truncation(max_length=4)
    t.enable_padding(length=12, pad_id=0, pad_token="<s>")
    t.save(str(path))
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
    tok = load_tokenizer(path)
    for text in (TEXT, "the", ""):
        assert tok.encode(text) == ref(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(tok.encode(TEXT)) == TEXT


def test_a_config_whose_bos_is_null_has_none(tmp_path: Path) -> None:
    """``"bos_token": null`` (Qwen's configs) is no BOS, as transformers reads it; it
    was filled in from the names ptexec guesses ("<s>" here), so ``num_bos`` put that
    token before prompts. A BOS asked of a tokenizer without one is refused."""
    transformers = pytest.importorskip("transformers")
    path = _hf_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(
        '{"bos_token": null, "eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}'
    )
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    tok = load_tokenizer(path)
    assert ref.bos_token_id is None and tok.bos_id == -1
    assert tok.eos_id == ref.eos_token_id == 1
    assert tok.encode("the cat") == ref("the cat", add_special_tokens=False)["input_ids"]
    with pytest.raises(TokenizerError, match="no BOS"):
        tok.encode("the cat", bos=1)
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    assert load_tokenizer(path).bos_id == 0  # not named: guessed (<s>), as before


def test_hf_tokenizer_config_names_bos_eos(tmp_path: Path) -> None:
    path = _hf_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "</s>", "eos_token": "<s>"}')
    tok = load_tokenizer(path)
    assert (tok.bos_id, tok.eos_id) == (1, 0)


def test_text_stream_holds_back_partial_characters(tmp_path: Path) -> None:
    tok = load_tokenizer(_hf_tokenizer(tmp_path / "tokenizer.json"))
    text = "naïve café ☕ done"
    ids = tok.encode(text)
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(ids) > len([p for p in pieces if p])  # some ids completed no character alone


def _byte_fallback_tokenizer(path: Path) -> Path:
    """A Llama-2-style ``tokenizer.json``: BPE whose characters outside a small vocabulary
    are ``<0xNN>`` byte tokens, and the Replace/ByteFallback/Fuse/Strip decoder chain."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ("\u2581", "a", "b", "\u2581a", "\u2581b", "ab", "\u2581ab", "\u00e9", "x"):
        vocab.setdefault(piece, len(vocab))
    merges = [("\u2581", "a"), ("\u2581", "b"), ("a", "b"), ("\u2581a", "b")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
         decoders.Strip(" ", 1, 0)]
    )  # fmt: skip
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.save(str(path))
    return path


def test_text_stream_equals_the_whole_decode_with_byte_tokens(tmp_path: Path) -> None:
    """Long runs of characters made of ``<0xNN>`` tokens stream as the whole sequence
    decodes (a piece never starts decoding inside a character); a held-back invalid run
    comes out on flush, never dropped."""
    from tokenizers import Tokenizer

    path = _byte_fallback_tokenizer(tmp_path / "tokenizer.json")
    tok, ref = load_tokenizer(path), Tokenizer.from_file(str(path))
    assert tok.token_bytes(ref.token_to_id("<0xE6>")) == b"\xe6"
    assert tok.token_bytes(ref.token_to_id("\u2581ab")) == b" ab"
    texts = ["\u8a9e" * 30, "ab " + "\u8a9e" * 7 + " ab", "\u00e9\u00e9 " + "\U0001f600" * 12,
             "x\u65e5\u672c ab \u00e9 \u3053\u3093 \U0001f389 b"]  # fmt: skip
    for text in texts:
        ids = ref.encode(text, add_special_tokens=False).ids
        stream = TextStream(tok)
        pieces = [stream.push(i) for i in ids] + [stream.flush()]
        assert "".join(pieces) == ref.decode(ids, skip_special_tokens=True) == text
        assert all("\ufffd" not in p for p in pieces)
    # an emoji, a stray byte, an emoji: one invalid run, which the decoder writes as nine
    # U+FFFD; the stream gave the first emoji before the run went bad, and the rest on flush
    emoji = [ref.token_to_id(f"<0x{b:02X}>") for b in "\U0001f600".encode()]
    ids = [*emoji, ref.token_to_id("<0x80>"), *emoji]
    stream = TextStream(tok)
    out = "".join(stream.push(i) for i in ids) + stream.flush()
    assert out == "\U0001f600" + "\ufffd" * 8
    assert len(ref.decode(ids)) == len(out)


def test_text_stream_keeps_the_first_space_after_a_prompt(tmp_path: Path) -> None:
    """A decoder that drops the first space of a text (SentencePiece's, Llama 2's Strip)
    drops it at the prompt's start, not the completion's: the streamed text is what the
    decode of prompt and completion has after the prompt (as transformers' pipelines and
    OpenAI's echo give it)."""
    from tokenizers import Tokenizer

    path = _byte_fallback_tokenizer(tmp_path / "tokenizer.json")
    tok, ref = load_tokenizer(path), Tokenizer.from_file(str(path))
    prompt = ref.encode("ab a", add_special_tokens=False).ids
    completion = ref.encode("b ab \u00e9", add_special_tokens=False).ids
    whole = ref.decode(prompt + completion)
    want = whole[len(ref.decode(prompt)) :]
    assert want.startswith(" ")  # (the completion's first word has its space)
    stream = TextStream(tok, prompt)
    pieces = [stream.push(i) for i in completion] + [stream.flush()]
    assert "".join(pieces) == want
    assert "".join(TextStream(tok).push(i) for i in completion[:1]) == want[1:2]  # (no context)


class _ByteTokens(Tokenizer):
    """Tokens that are byte strings (as byte-level and byte-fallback vocabularies have):
    a decode joins them first."""

    def __init__(self, pieces: list[bytes]) -> None:
        super().__init__(Path("bytes"), bos_id=len(pieces), eos_id=len(pieces) + 1,
                         vocab_size=len(pieces) + 2)  # fmt: skip
        self.pieces = pieces

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        data = b"".join(b"" if i >= len(self.pieces) else self.pieces[i] for i in ids)
        return data.decode("utf-8", errors="replace")


def test_text_stream_gives_whole_characters_before_a_partial_one() -> None:
    """A token ending in the first bytes of a character gives the whole characters before
    them at once (a stop string in them is found at that token, not later)."""
    day, book, word = ("\u65e5".encode(), "\u672c".encode(), "\u8a9e".encode())
    tok = _ByteTokens([day + book[:1], book[1:] + word[:2], word[2:]])
    stream = TextStream(tok)
    assert [stream.push(0), stream.push(1), stream.push(2), stream.flush()] == [
        "\u65e5",
        "\u672c",
        "\u8a9e",
        "",
    ]


def _tiktoken_file(path: Path) -> Path:
    ranks = [bytes([b]) for b in range(256)]
    for merge in (b"th", b"the", b" the", b"ca", b"cat", b" cat", b"at", b" sat", b"an", b" ran"):
        ranks.append(merge)
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    return path


def test_tiktoken_detected(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_tokenizers")
    tok = load_tokenizer(_tiktoken_file(tmp_path / "tokenizer.model"))
    assert tok.kind == "tiktoken"
    assert tok.vocab_size == 266 + 256  # regular tokens, then Llama 3's special tokens
    assert (tok.bos_id, tok.eos_id) == (266, 267)
    ids = tok.encode(" the cat sat")
    assert ids[:2] == [258, 261]  # " the", " cat": merges applied
    assert tok.decode(ids) == " the cat sat"
    stream = TextStream(tok)
    text = "é ☕"
    assert "".join([stream.push(i) for i in tok.encode(text)] + [stream.flush()]) == text
    # Llama 3's special tokens are control tokens (<|eot_id|> ends an instruct model's turn)
    eot = tok.bos_id + 9
    assert tok.decode([eot]) == "<|eot_id|>" and tok.is_special(eot)
    assert not tok.is_special(tok.bos_id - 1)
    assert TextStream(tok).push(eot) == ""


# Llama 3's pre-tokenizer pattern, as Meta's tokenizer.py gives it to tiktoken
LLAMA3_PAT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def test_tiktoken_ids_are_tiktokens(tmp_path: Path) -> None:
    """A Llama 3 ``tokenizer.model`` encodes as tiktoken does with Llama 3's pattern:
    pytorch-tokenizers' split (no look-ahead) kept a run of spaces before a word whole
    ("a  b": " ", " b" in tiktoken; "  ", "b" there), 1,796 of 20,000 random strings
    apart. Special tokens written in the text are their ids, as before."""
    pytest.importorskip("pytorch_tokenizers")
    tiktoken = pytest.importorskip("tiktoken")
    import random

    path = _tiktoken_file(tmp_path / "tokenizer.model")
    tok = load_tokenizer(path)
    ranks = {}
    for line in path.read_text().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
             "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
             "<|python_tag|>"]  # fmt: skip
    names += [f"<|reserved_special_token_{i}|>" for i in range(2, 256 - len(names) + 2)]
    ref = tiktoken.Encoding(
        "llama3-like", pat_str=LLAMA3_PAT, mergeable_ranks=ranks,
        special_tokens={n: len(ranks) + i for i, n in enumerate(names)},
    )  # fmt: skip
    texts = ["a  b", "  !", "def f():\n    return x", "x\n  y", "the   cat\tsat\r\n ran",
             "<|start_header_id|>user<|end_header_id|>\n\n  hi<|eot_id|>", "é  ☕ 123456 it's"]  # fmt: skip
    rng = random.Random(0)
    alphabet = [
        " ",
        "  ",
        "\n",
        "\t",
        "x",
        "the",
        "1",
        "23",
        "!",
        "'s",
        "é",
        "\u00a0",
        "<|eot_id|>",
    ]
    texts += [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 8))) for _ in range(2000)
    ]
    for text in texts:
        assert tok.encode(text) == ref.encode(text, allowed_special="all"), repr(text)


def test_tiktoken_long_words_are_tiktokens(tmp_path: Path) -> None:
    """A piece of more than bpe.LONG_PIECE bytes is merged by ptexec in n log n (the
    library's merges take n**2: a megabyte of letters took minutes): the same ids as
    tiktoken's for words of every length around the switch, ties between equal ranks
    included (a word of one repeated pair)."""
    pytest.importorskip("pytorch_tokenizers")
    tiktoken = pytest.importorskip("tiktoken")
    import random

    from ptexec.llm.bpe import LONG_PIECE, merge, read_ranks

    path = _tiktoken_file(tmp_path / "tokenizer.model")
    tok = load_tokenizer(path)
    ranks = read_ranks(path)
    ref = tiktoken.Encoding("llama3-like", pat_str=LLAMA3_PAT, mergeable_ranks=ranks,
                            special_tokens={})  # fmt: skip
    rng = random.Random(1)
    syllables = ["th", "the", "ca", "cat", "at", "an", "a", "t", "h", "n", "c", "e", "é"]
    words = ["at" * 200, "a" * 1000, "th" * 129, "thecat" * 60 + "é" * 90]
    for _ in range(60):
        word = "".join(rng.choice(syllables) for _ in range(rng.randrange(40, 900)))
        words.append(word)
    assert any(len(w.encode()) <= LONG_PIECE for w in words)
    assert any(len(w.encode()) > LONG_PIECE for w in words)
    for word in words:
        for text in (word, " " + word + " sat " + word[::-1]):
            assert tok.encode(text) == ref.encode(text), text[:40]
        # the word alone is one piece of the pattern (letters): merged whole
        assert merge(word.encode(), ranks) == ref.encode(word)


def _sentencepiece_model(spm: Any, path: Path, **options: Any) -> Path:
    """A BPE SentencePiece model trained on TEXT (BOS 1, EOS 2, UNK 0), written to ``path``."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([TEXT] * 20),
        model_writer=model,
        model_type="bpe",
        bos_id=1,
        eos_id=2,
        unk_id=0,
        **options,
    )
    path.write_bytes(model.getvalue())
    return path


def test_sentencepiece_detected(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    path = _sentencepiece_model(spm, tmp_path / "tokenizer.model", vocab_size=40)
    tok = load_tokenizer(path)
    ref = spm.SentencePieceProcessor(model_file=str(path))
    assert tok.kind == "SentencePiece"
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (1, 2, 40)
    assert tok.encode("the cat sat") == ref.encode("the cat sat")
    assert tok.decode(tok.encode("the cat sat")).strip() == "the cat sat"


def test_a_sentencepiece_model_without_bos_has_none(tmp_path: Path) -> None:
    """A model trained without BOS (T5's layout: sentencepiece's ``bos_id`` is -1) has no
    BOS here either: asking for one is refused, not an id of 2**64 - 1 in the prompt."""
    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([TEXT] * 20), model_writer=model, model_type="bpe",
        vocab_size=40, bos_id=-1, eos_id=1, unk_id=2, pad_id=0,
    )  # fmt: skip
    path = tmp_path / "tokenizer.model"
    path.write_bytes(model.getvalue())
    tok, ref = load_tokenizer(path), spm.SentencePieceProcessor(model_file=str(path))
    assert (tok.bos_id, tok.eos_id) == (ref.bos_id(), ref.eos_id()) == (-1, 1)
    assert tok.encode("the cat sat") == ref.encode("the cat sat")
    assert tok.encode("the cat sat", bos=0, eos=1) == [*ref.encode("the cat sat"), 1]
    with pytest.raises(TokenizerError, match="BOS"):
        tok.encode("the cat sat", bos=1)


def test_sentencepiece_byte_fallback_and_control_pieces(tmp_path: Path) -> None:
    """A SentencePiece model with byte fallback (Llama 2's, Mistral's): characters outside
    the vocabulary are <0xNN> pieces, which are bytes of the text (as sentencepiece decodes
    them), not their names; the control pieces a chat template writes (<s>, </s>) are BOS
    and EOS, as transformers' tokenizer of the same file reads them."""
    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    path = _sentencepiece_model(
        spm, tmp_path / "tokenizer.model", vocab_size=300, byte_fallback=True,
        hard_vocab_limit=False,
    )  # fmt: skip
    tok, ref = load_tokenizer(path), spm.SentencePieceProcessor(model_file=str(path))
    for text in ("caf\u00e9|ok", "x\U0001f600y the cat", "\u65e5\u672c"):
        ids = ref.encode(text)
        assert any(ref.id_to_piece(i).startswith("<0x") for i in ids)
        assert tok.decode(ids).strip() == ref.decode(ids) == text
        stream = TextStream(tok)
        assert "".join([stream.push(i) for i in ids] + [stream.flush()]).strip() == text
    ids = tok.encode("<s>the cat</s> sat")
    assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids) == "the cat sat"
    assert ids[0] == tok.bos_id == 1 and tok.eos_id in ids
    assert ids[1:] == [*ref.encode("the cat"), 2, *ref.encode(" sat")]
    assert tok.is_special(1) and tok.is_special(2) and not tok.is_special(ids[1])
    assert tok.token_bytes(2) == b"</s>"


def test_sentencepiece_decode_drops_the_space_before_the_text(tmp_path: Path) -> None:
    """SentencePiece's decode drops the space its encode puts before a text (one per
    piece until a piece leaves text): ptexec's gave " Hello world" and "   line", so a
    decode of token-id prompts and of seq2seq outputs began with spaces sentencepiece's
    has not. Streaming still keeps a completion's first space after a prompt."""
    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    path = _sentencepiece_model(spm, tmp_path / "tokenizer.model", vocab_size=60)
    tok, ref = load_tokenizer(path), spm.SentencePieceProcessor(model_file=str(path))
    space = ref.piece_to_id("\u2581")
    for ids in (
        ref.encode("the cat sat"),
        [space, space, *ref.encode("ran")],
        [1, *ref.encode("the dog")],  # after BOS too
        [space],
        [],
    ):
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids), ids
    prompt, completion = ref.encode("the cat"), ref.encode("sat on the mat")
    stream = TextStream(tok, prompt)
    text = "".join([stream.push(i) for i in completion] + [stream.flush()])
    assert text == " sat on the mat"
    stream = TextStream(tok, [space])  # a prompt that decodes to no text
    text = "".join([stream.push(i) for i in completion] + [stream.flush()])
    assert text == ref.decode([space, *completion])[len(ref.decode([space])) :] == "sat on the mat"


@pytest.mark.parametrize("dummy_prefix", [True, False])
@pytest.mark.parametrize("collapse", [True, False])
def test_sentencepiece_decode_keeps_the_spaces_its_model_keeps(
    tmp_path: Path, dummy_prefix: bool, collapse: bool
) -> None:
    """Which leading spaces a SentencePiece decode drops is the model's normalizer's:
    one per piece until text with ``remove_extra_whitespaces`` (the default), the first
    piece's only without it (Llama 2's, Mistral's models), none when neither that nor
    ``add_dummy_prefix`` is set (Gemma's). ptexec dropped them as the default does for
    every model: "  cat" came out "cat" with Llama 2's settings, " cat" "cat" with
    Gemma's. A byte piece's space is a byte of the text, never dropped."""
    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    path = _sentencepiece_model(
        spm, tmp_path / "tokenizer.model", vocab_size=300, add_dummy_prefix=dummy_prefix,
        remove_extra_whitespaces=collapse, normalization_rule_name="identity",
        allow_whitespace_only_pieces=True, byte_fallback=True, hard_vocab_limit=False,
    )  # fmt: skip
    tok, ref = load_tokenizer(path), spm.SentencePieceProcessor(model_file=str(path))
    space, byte_space = ref.piece_to_id("\u2581"), ref.piece_to_id("<0x20>")
    cat = ref.encode("cat")
    texts = (" ", "  ", " the cat", "   sat", "the  cat ", "ran")
    for ids in (
        *(ref.encode(t) for t in texts),
        [space, *cat],
        [space, space, *cat],
        [1, space, space, *cat],
        [byte_space, *cat],
        [space, byte_space, *cat],
        [space],
        [],
    ):
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids), ids
        stream = TextStream(tok)
        text = "".join([stream.push(i) for i in ids] + [stream.flush()])
        assert text == ref.decode(ids), ids


def test_a_text_holding_nul_is_refused_where_the_encode_would_end_there(
    tmp_path: Path,
) -> None:
    """pytorch-tokenizers' SentencePiece and llama2.c encodes end a text at U+0000: the
    rest of a prompt was dropped without a word ("the\\0 cat sat" was "the" alone, where
    sentencepiece encodes every character). Such a text is refused; tiktoken's encode keeps
    it whole, as tiktoken does."""
    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    path = _sentencepiece_model(
        spm, tmp_path / "tokenizer.model", vocab_size=300, byte_fallback=True,
        hard_vocab_limit=False,
    )  # fmt: skip
    tok, ref = load_tokenizer(path), spm.SentencePieceProcessor(model_file=str(path))
    text = "the\x00 cat sat"
    assert len(ref.encode(text)) > len(ref.encode("the"))  # every character is encoded
    with pytest.raises(TokenizerError, match="U\\+0000"):
        tok.encode(text)
    with pytest.raises(TokenizerError, match="U\\+0000"):
        tok.encode("</s>\x00")  # (after a control piece's name too)
    assert tok.encode("the cat sat") == ref.encode("the cat sat")  # (refused, nothing kept)
    # a llama2.c tokenizer.bin (vocab size, BOS, EOS, longest piece; score, size, bytes each)
    pieces = [b"<unk>", b"<s>", b"</s>", *(bytes([b]) for b in range(256)), b" the", b" cat"]
    data = struct.pack("<4I", len(pieces), 1, 2, max(map(len, pieces)))
    data += b"".join(struct.pack("<fI", -float(i), len(p)) + p for i, p in enumerate(pieces))
    (tmp_path / "tokenizer.bin").write_bytes(data)
    l2c = load_tokenizer(tmp_path / "tokenizer.bin")
    assert l2c.kind == "llama2.c"
    with pytest.raises(TokenizerError, match="U\\+0000"):
        l2c.encode(text)
    tt = load_tokenizer(_tiktoken_file(tmp_path / "tiktoken.model"))
    assert tt.decode(tt.encode(text)) == text


def test_a_text_holding_a_lone_surrogate_is_a_tokenizer_error(tmp_path: Path) -> None:
    """A lone surrogate (``"\\ud800"``, which ``json.loads`` and file reads with
    ``surrogateescape`` make) is no UTF-8 text: Python's codec refuses it, and every
    tokenizer kind raised an untyped ``TypeError`` saying the text was not a ``str``
    ("TextInputSequence must be str", "incompatible function arguments"). It is a
    ``TokenizerError`` naming where, and the tokenizer goes on encoding."""
    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    text = "the\ud800 cat"
    with pytest.raises(UnicodeEncodeError) as codec:
        text.encode("utf-8")
    assert codec.value.start == 3
    for tok in (
        load_tokenizer(_hf_tokenizer(tmp_path / "tokenizer.json")),
        load_tokenizer(_tiktoken_file(tmp_path / "tiktoken.model")),
        load_tokenizer(_sentencepiece_model(spm, tmp_path / "tokenizer.model", vocab_size=60)),
    ):
        with pytest.raises(TokenizerError, match="U\\+D800 at character 3"):
            tok.encode(text, bos=1)
        assert tok.decode(tok.encode("the cat")).strip() == "the cat"


def test_text_stream_keeps_the_spaces_after_a_lone_space_piece(tmp_path: Path) -> None:
    """A lone space piece (``\u2581``) decodes alone to no text, and a SentencePiece decode
    that starts with it drops the next piece's space too: a stream that started its decodes
    again at that piece lost a space of a run of spaces ("on  ran" came out "on ran"). The
    stream equals sentencepiece's decode of the whole sequence wherever the piece falls."""
    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    path = _sentencepiece_model(spm, tmp_path / "tokenizer.model", vocab_size=60)
    tok, ref = load_tokenizer(path), spm.SentencePieceProcessor(model_file=str(path))
    space = ref.piece_to_id("\u2581")
    words = ref.encode("the cat sat on the mat and the dog")
    for at in range(1, len(words)):
        for run in (1, 2):
            ids = [*words[:at], *[space] * run, *ref.encode("ran")]
            stream = TextStream(tok)
            text = "".join([stream.push(i) for i in ids] + [stream.flush()])
            assert text == ref.decode(ids), (at, run)


def test_unreadable_tokenizer(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.bin"
    bad.write_bytes(b"dummy tokenizer")
    with pytest.raises(TokenizerError, match="Failed to load tokenizer"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="Hugging Face"):
        load_tokenizer(tmp_path / "broken.json")


# --------------------------------------------------------------------------------------
# every GenerationConfig field is checked when it is set


_BAD_SETTINGS = [
    ("temperature", float("nan"), ConfigValueError),
    ("temperature", float("inf"), ConfigValueError),
    ("temperature", -0.5, ConfigValueError),
    ("temperature", "0.7", ConfigTypeError),
    ("temperature", True, ConfigTypeError),
    ("temperature", None, ConfigTypeError),
    ("top_p", 0.0, ConfigValueError),
    ("top_p", 1.5, ConfigValueError),
    ("top_p", float("nan"), ConfigValueError),
    ("top_p", "0.9", ConfigTypeError),
    ("top_k", -1, ConfigValueError),
    ("top_k", 2.0, ConfigTypeError),
    ("top_k", False, ConfigTypeError),
    ("max_new_tokens", 0, ConfigValueError),
    ("max_new_tokens", -2, ConfigValueError),
    ("max_new_tokens", 8.0, ConfigTypeError),
    ("max_new_tokens", True, ConfigTypeError),
    ("seq_len", 0, ConfigValueError),
    ("seq_len", -5, ConfigValueError),
    ("seq_len", "64", ConfigTypeError),
    ("num_bos", -1, ConfigValueError),
    ("num_eos", -1, ConfigValueError),
    ("num_eos", 1.5, ConfigTypeError),
    ("seed", -1, ConfigValueError),
    ("seed", 2**64, ConfigValueError),
    ("seed", 1.0, ConfigTypeError),
    ("seed", "7", ConfigTypeError),
    ("seed", True, ConfigTypeError),
    ("echo", 1, ConfigTypeError),
    ("echo", "yes", ConfigTypeError),
    ("warming", None, ConfigTypeError),
    ("ignore_eos", 0, ConfigTypeError),
    ("stop", [""], ConfigValueError),
    ("stop", "", ConfigValueError),
    ("stop", [3], ConfigTypeError),
    ("stop", b"\n", ConfigTypeError),
    ("stop", 5, ConfigTypeError),
]


@pytest.mark.parametrize(("field", "value", "error"), _BAD_SETTINGS)
def test_config_rejects_bad_settings(field: str, value: object, error: type) -> None:
    builtin = ValueError if error is ConfigValueError else TypeError
    with pytest.raises(error) as info:
        GenerationConfig(**{field: value})  # type: ignore[arg-type]
    assert isinstance(info.value, builtin) and isinstance(info.value, PtexecError)
    assert info.value.field == field and field in str(info.value)
    config = GenerationConfig()
    before = getattr(config, field)
    with pytest.raises(error):
        setattr(config, field, value)  # set later, as ExecuTorch's tests do
    assert getattr(config, field) == before


def test_config_accepts_and_normalises_good_settings() -> None:
    import numpy as np

    c = GenerationConfig(
        temperature=np.float32(0.5), top_k=np.int64(4), seed=2**64 - 1, max_new_tokens=1, top_p=1
    )
    assert (c.temperature, c.top_k, c.seed, c.top_p) == (0.5, 4, 2**64 - 1, 1.0)
    assert type(c.temperature) is float and type(c.top_k) is int
    assert GenerationConfig(temperature=0, seq_len=1, stop=None).stop == ()
    with pytest.raises(AttributeError):
        c.max_tokens = 3  # type: ignore[attr-defined]  # a misspelt field is not kept


def test_stop_string_is_one_stop_sequence() -> None:
    assert GenerationConfig(stop="\n\n").stop == ("\n\n",)
    assert GenerationConfig(stop=["\n\n", "END"]).stop == ("\n\n", "END")
    assert GenerationConfig(stop=("a", "b")).stop == ("a", "b")
    c = GenerationConfig()
    c.stop = "\n\n"  # type: ignore[assignment]
    assert c.stop == ("\n\n",)
    from ptexec.llm.runner import _StopStrings

    stops = _StopStrings(GenerationConfig(stop="\n\n").stop)
    out = "".join(stops.feed(p) for p in ["one\n", "two\n", "\nthree"])
    assert out == "one\ntwo" and stops.hit


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"temperature": float("nan")}, ConfigValueError),
        ({"temperature": "0.7"}, ConfigTypeError),
        ({"temperature": -1.0}, ConfigValueError),
        ({"top_k": -3}, ConfigValueError),
        ({"top_p": 2.0}, ConfigValueError),
        ({"seed": -4}, ConfigValueError),
    ],
)
def test_sampler_follows_the_config_rules(kw: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        Sampler(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data", [b"", b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x05\x0a\x03ab", b"\xff" * 12, b"\x0b"]
)
def test_sentencepiece_pieces_of_a_malformed_file_are_none(tmp_path: Path, data: bytes) -> None:
    from ptexec.llm.tokenizer import sentencepiece_pieces

    path = tmp_path / "tokenizer.model"
    path.write_bytes(data)
    got = sentencepiece_pieces(path)
    assert got is None or got == []
