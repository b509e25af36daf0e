"""``ptexec.llm``: generation with tiny Llama programs exported by ExecuTorch's LLM exporter,
checked against a greedy loop on ExecuTorch's runtime and ExecuTorch's own runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from llm_support import PROMPT, executorch_greedy, executorch_logits, llm_programs, program
from ptexec.errors import GenerationError
from ptexec.llm import (
    GenerationConfig,
    MultimodalRunner,
    Stats,
    TextLLMRunner,
    make_image_input,
    make_text_input,
    make_token_input,
    read_metadata,
)
from ptexec.llm.decoder import TextDecoder

pytest.importorskip("tokenizers")

GREEDY = GenerationConfig(max_new_tokens=24, temperature=0.0, echo=False)
MODEL = llm_programs.TinyLlama()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llm_programs.make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _runner(variant: str, tokenizer: Path, **kw: Any) -> TextLLMRunner:
    return TextLLMRunner(str(program(variant)), str(tokenizer), print_output=False, **kw)


# --------------------------------------------------------------------------------------
# greedy generation against ExecuTorch


@pytest.mark.parametrize(
    ("variant", "dynamic"),
    [("portable", True), ("portable_static", False), ("xnnpack", True), ("xnnpack_8da4w", True)],
)
def test_greedy_tokens_equal_executorch_loop(variant: str, dynamic: bool, tokenizer: Path) -> None:
    runner = _runner(variant, tokenizer)
    assert runner.decoder.dynamic is dynamic
    text = runner.generate_text(PROMPT, GREEDY)
    prompt_ids = runner.tokenizer.encode(PROMPT)
    want = executorch_greedy(program(variant), prompt_ids, GREEDY.max_new_tokens, dynamic)
    assert runner.generated_tokens == want
    assert text == runner.tokenizer.decode(want, skip_special_tokens=True)
    assert len(set(want)) > 3, "the seeded model should not repeat one token"
    assert runner.stats.num_prompt_tokens == len(prompt_ids)
    assert runner.stats.num_generated_tokens == GREEDY.max_new_tokens


def test_hugging_face_export_with_cache_positions(tokenizer: Path) -> None:
    """optimum-executorch's layout: forward(input_ids, cache_position [seq]) -> [1, seq, V]."""
    runner = _runner("hf_xnnpack", tokenizer)
    assert runner.decoder.pos_vector and runner.decoder.dynamic
    assert runner.eos_ids == {MODEL.eos_id} and runner.bos_id == MODEL.bos_id  # get_eos_id
    text = runner.generate_text(PROMPT, GREEDY)
    ids = runner.tokenizer.encode(PROMPT)
    want = executorch_greedy(program("hf_xnnpack"), ids, 24, dynamic=True, cache_positions=True)
    assert runner.generated_tokens == want and len(set(want)) > 3
    assert text == runner.tokenizer.decode(want, skip_special_tokens=True)


def test_text_equals_executorch_runner(tokenizer: Path) -> None:
    """ExecuTorch's own TextLLMRunner (in the wheel) streams the same text."""
    et = pytest.importorskip("executorch.extension.llm.runner")
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

    pte = program("portable")
    pieces: list[str] = []
    config = et.GenerationConfig(max_new_tokens=24, temperature=0.0, echo=False)
    et.TextLLMRunner(str(pte), str(tokenizer)).generate(
        PROMPT, config, token_callback=pieces.append
    )
    ours: list[str] = []
    _runner("portable", tokenizer).generate(PROMPT, GREEDY, token_callback=ours.append)
    assert "".join(ours) == "".join(pieces)
    assert ours == pieces  # piece for piece: one callback per token


def test_static_and_dynamic_programs_agree(tokenizer: Path) -> None:
    a = _runner("portable", tokenizer)
    b = _runner("portable_static", tokenizer)
    assert a.generate_text(PROMPT, GREEDY) == b.generate_text(PROMPT, GREEDY)
    assert a.generated_tokens == b.generated_tokens


def test_long_prompt_prefills_in_chunks(tokenizer: Path) -> None:
    """A dynamic program takes at most max_seq_len - 1 tokens a call (15 here, over a
    128-token cache); a longer prompt goes in chunks, with the result of the same model fed
    token by token."""
    ids = [(7 * i + 3) % (MODEL.vocab_size - 3) + 3 for i in range(40)]
    config = GenerationConfig(max_new_tokens=6, temperature=0.0, echo=False)
    chunked = _multimodal("portable_chunked", tokenizer)
    assert chunked.decoder.max_chunk == 15 and chunked.max_context_len == MODEL.max_context_len
    chunked.generate_text([make_token_input(ids)], config)
    static = _multimodal("portable_static", tokenizer)
    static.generate_text([make_token_input(ids)], config)
    assert chunked.generated_tokens == static.generated_tokens
    want = executorch_greedy(program("portable_static"), ids, 6, dynamic=False)
    assert chunked.generated_tokens == want


def _multimodal(variant: str, tokenizer: Path) -> MultimodalRunner:
    return MultimodalRunner(str(program(variant)), str(tokenizer), print_output=False)


# --------------------------------------------------------------------------------------
# metadata and layout


def test_metadata_read_from_the_program() -> None:
    md = read_metadata(ptexec.load(program("portable")))
    assert md.get("get_max_seq_len") == MODEL.max_seq_len
    assert md.get("get_max_context_len") == MODEL.max_context_len
    assert md.get("get_vocab_size") == MODEL.vocab_size
    assert md.get("get_bos_id") == MODEL.bos_id
    assert md.eos_ids == (MODEL.eos_id,)
    assert md.get("use_kv_cache") is True
    assert md.get("enable_dynamic_shape") is True
    assert (
        read_metadata(ptexec.load(program("portable_static"))).get("enable_dynamic_shape") is False
    )


def test_runner_takes_bos_eos_vocab_from_the_program(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    assert r.bos_id == MODEL.bos_id and r.eos_ids == {MODEL.eos_id}
    assert r.get_vocab_size() == MODEL.vocab_size
    assert r.max_context_len == MODEL.max_context_len
    assert r.decoder.max_chunk == MODEL.max_seq_len - 1
    assert not r.decoder.pos_vector
    assert _runner("portable_static", tokenizer).decoder.max_chunk == 1


def test_decoder_logits_are_the_callers_to_keep() -> None:
    """``TextDecoder.step`` and ``prefill`` return logits a later call leaves as they
    were (ExecuTorch's ``execute`` returns new tensors too), equal to ExecuTorch's for the
    same tokens; ``share_logits=True`` returns views of the method's memory instead,
    which the next call rewrites (what the runners' loop samples from)."""
    pte = program("portable")
    tokens = [MODEL.bos_id, 7, 11, 13]
    want = executorch_logits(pte, tokens)
    decoder = TextDecoder(ptexec.load(pte))
    kept = [decoder.prefill(tokens[:2], 0)]
    kept += [decoder.step(t, pos) for pos, t in enumerate(tokens[2:], start=2)]
    for k, (got, ref) in enumerate(zip(kept, [want[1], want[2], want[3]], strict=True)):
        torch.testing.assert_close(got.reshape(-1), ref.reshape(-1), rtol=1e-4, atol=1e-4)
        assert k == 0 or not torch.equal(got, kept[k - 1]), f"step {k} equals the one before"
    shared = TextDecoder(ptexec.load(pte), share_logits=True)
    first = shared.prefill(tokens[:2], 0)
    second = shared.step(tokens[2], 2)
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
    assert not torch.equal(first, kept[0])  # the method's memory, rewritten
    torch.testing.assert_close(second.reshape(-1), want[2].reshape(-1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["portable", "portable_static"])
def test_decoder_token_ids_that_are_not_integers_are_refused(variant: str, tokenizer: Path) -> None:
    """A token id is an integer: 7.9 ran as token 7 (``fill_`` and ``torch.tensor`` cast
    it), where eager PyTorch's embedding refuses float indices and ExecuTorch's runtime a
    float token tensor; ids the int64 input cannot hold raised torch's untyped errors.
    Each is a GenerationError before the program runs; the next good call is ExecuTorch's,
    and so are the scores ``prompt_logits`` gives after refusing such ids."""
    pte = program(variant)
    tokens = [MODEL.bos_id, 7, 11, 13]
    want = executorch_logits(pte, tokens)
    with pytest.raises(RuntimeError, match="Long, Int"):  # eager PyTorch
        torch.nn.functional.embedding(torch.tensor([[7.9]]), torch.zeros(MODEL.vocab_size, 4))
    decoder = TextDecoder(ptexec.load(pte))
    decoder.step(tokens[0], 0)
    for bad in (7.9, 7.0, torch.tensor(7.9), "7", None, 2**63, 2**70, -1):
        with pytest.raises(GenerationError, match="token"):
            decoder.step(bad, 1)  # type: ignore[arg-type]
        with pytest.raises(GenerationError, match="token"):
            decoder.prefill([7, bad], 1)  # type: ignore[list-item]
    got = decoder.step(tokens[1], 1)
    torch.testing.assert_close(got.reshape(-1), want[1].reshape(-1), rtol=1e-4, atol=1e-4)
    runner = _runner(variant, tokenizer)
    with pytest.raises(GenerationError, match="token"):
        runner.prompt_logits([MODEL.bos_id, 7.9, 11])  # type: ignore[list-item]
    rows = runner.prompt_logits(tokens)
    for got, ref in zip(rows, want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_not_a_generation_program() -> None:
    from fixture_data import fixture_paths

    pte, _ = fixture_paths("mlp")
    with pytest.raises(GenerationError, match="tokens"):
        TextDecoder(ptexec.load(pte))


# --------------------------------------------------------------------------------------
# sampling, stopping, streaming


def test_seeded_sampling_is_reproducible(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    config = GenerationConfig(max_new_tokens=20, temperature=1.0, top_p=0.95, seed=7, echo=False)
    first = r.generate_text(PROMPT, config)
    first_ids = list(r.generated_tokens)
    r.reset()
    assert r.generate_text(PROMPT, config) == first
    assert r.generated_tokens == first_ids
    r.reset()
    other = GenerationConfig(max_new_tokens=20, temperature=1.0, top_p=0.95, seed=8, echo=False)
    r.generate_text(PROMPT, other)
    assert r.generated_tokens != first_ids
    r.reset()
    r.generate_text(PROMPT, GREEDY)
    assert r.generated_tokens[:20] != first_ids  # temperature 1 is not greedy here


def test_top_k_one_is_greedy(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    r.generate_text(PROMPT, GREEDY)
    greedy = list(r.generated_tokens)
    r.reset()
    config = GenerationConfig(max_new_tokens=24, temperature=1.5, top_k=1, seed=3, echo=False)
    r.generate_text(PROMPT, config)
    assert r.generated_tokens == greedy


def test_eos_stops_generation(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    r.generate_text(PROMPT, GREEDY)
    greedy = list(r.generated_tokens)
    eos = greedy[5]
    stop_at = greedy.index(eos)
    r.reset()
    r.eos_ids = frozenset({eos})
    text = r.generate_text(PROMPT, GREEDY)
    assert r.generated_tokens == greedy[: stop_at + 1]  # EOS is the last token generated
    assert r.stats.num_generated_tokens == stop_at + 1
    # a control token has no text; this EOS is an ordinary token, so its text is the last
    assert text == r.tokenizer.decode(greedy[: stop_at + 1], skip_special_tokens=True)
    r.reset()
    ignoring = GenerationConfig(max_new_tokens=24, temperature=0.0, echo=False, ignore_eos=True)
    r.generate_text(PROMPT, ignoring)
    assert r.generated_tokens == greedy


def test_program_eos_id_has_no_text(tokenizer: Path) -> None:
    """The program's EOS (the tokenizer's <|end_of_text|>) ends a generation without text."""
    r = _runner("portable", tokenizer)
    assert r.tokenizer.is_special(MODEL.eos_id)
    from ptexec.llm import TextStream

    s = TextStream(r.tokenizer)
    assert s.push(MODEL.eos_id) == ""


def test_stop_string(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    full = r.generate_text(PROMPT, GREEDY)
    stop = full[10:13]
    assert stop and full.index(stop) == 10
    r.reset()
    pieces: list[str] = []
    config = GenerationConfig(max_new_tokens=24, temperature=0.0, echo=False, stop=[stop])
    text = r.generate_text(PROMPT, config, token_callback=pieces.append)
    assert text == full[:10] == "".join(pieces)
    assert r.stats.num_generated_tokens < 24


def test_streaming_callback_and_echo(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    pieces: list[str] = []
    seen: list[Stats] = []
    config = GenerationConfig(max_new_tokens=12, temperature=0.0, echo=True)
    text = r.generate_text(PROMPT, config, token_callback=pieces.append, stats_callback=seen.append)
    assert pieces[0] == PROMPT and "".join(pieces[1:]) == text
    assert len(pieces) - 1 <= 12
    # a copy of the runner's figures, as ExecuTorch passes one per call
    assert len(seen) == 1 and seen[0] is not r.stats and seen[0].as_dict() == r.stats.as_dict()


def test_print_output(tokenizer: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = TextLLMRunner(str(program("portable")), str(tokenizer))
    config = GenerationConfig(max_new_tokens=8, temperature=0.0, echo=True)
    r.generate(PROMPT, config)
    text = capsys.readouterr().out
    assert text.startswith(PROMPT) and text.endswith("\n")
    r.reset()
    r.generate(PROMPT, GenerationConfig(max_new_tokens=8, temperature=0.0, warming=True))
    assert capsys.readouterr().out == ""


def test_stop_from_callback(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    count = 0

    def on_token(piece: str) -> None:
        nonlocal count
        count += 1
        if count == 3:
            r.stop()

    r.generate(PROMPT, GREEDY, token_callback=on_token)
    assert 3 <= r.stats.num_generated_tokens <= 4


def test_reset_from_a_token_callback_is_refused(tokenizer: Path) -> None:
    """A callback runs inside the loop, on the thread holding the runner: a reset(),
    prefill() or generate() of the runner there would move the context under the loop
    (it went on decoding at position 0 over the prompt's cache: " birds" where
    ExecuTorch's runner, whose loop keeps its own position, goes on with " sum"). Each
    raises; the runner then resets and generates as ExecuTorch's does."""
    et = pytest.importorskip("executorch.extension.llm.runner")
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

    want: list[str] = []
    et.TextLLMRunner(str(program("portable")), str(tokenizer)).generate(
        PROMPT, et.GenerationConfig(max_new_tokens=8, temperature=0.0, echo=False), want.append
    )
    r = _runner("portable", tokenizer)
    config = GenerationConfig(max_new_tokens=8, temperature=0.0, echo=False)
    for inside in (r.reset, lambda: r.prefill(" and"), lambda: r.generate(" and", config)):
        pieces: list[str] = []

        def on_token(piece: str, inside: Any = inside, pieces: list[str] = pieces) -> None:
            pieces.append(piece)
            if len(pieces) == 3:
                inside()

        with pytest.raises(GenerationError, match="callback"):
            r.generate(PROMPT, config, token_callback=on_token)
        assert pieces == want[:3]
        r.reset()
        assert r.generate_text(PROMPT, config) == "".join(want)
        r.reset()
    # the stats callback runs after the loop: a reset there is taken
    r.generate(PROMPT, config, stats_callback=lambda s: r.reset())
    assert r.pos == 0


def test_stats(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    r.generate(PROMPT, GREEDY)
    s = r.stats
    assert s.model_load_end_ms >= s.model_load_start_ms > 0
    assert s.inference_start_ms <= s.prompt_eval_end_ms <= s.inference_end_ms
    assert s.first_token_ms == s.prompt_eval_end_ms
    assert s.prefill_ms > 0 and s.tokens_per_second > 0
    assert s.aggregate_model_execution_time_ms > 0
    assert 0 <= s.aggregate_sampling_time_ms < s.inference_end_ms - s.inference_start_ms
    d = json.loads(s.to_json_string())
    assert d["prompt_tokens"] == s.num_prompt_tokens and d["generated_tokens"] == 24
    assert d["SCALING_FACTOR_UNITS_PER_SECOND"] == 1000
    s.reset()
    assert s.num_generated_tokens == 0 and s.model_load_end_ms > 0
    s.reset(all_stats=True)
    assert s.model_load_end_ms == 0


# --------------------------------------------------------------------------------------
# context: continuation, prefill, reset, limits


def test_prefill_then_generate_empty_prompt(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    want = r.generate_text(PROMPT, GREEDY)
    r.reset()
    r.prefill(PROMPT, GREEDY)
    assert r.pos == len(r.tokenizer.encode(PROMPT))
    assert r.generate_text("", GREEDY) == want
    r.reset()
    with pytest.raises(GenerationError, match="prefill"):
        r.generate("", GREEDY)


def test_prefilled_prompt_tokens_are_counted_by_the_generate_that_continues(
    tokenizer: Path,
) -> None:
    """``generate("")`` after ``prefill()`` reports the tokens prefilled since the last
    generation as its prompt, as ``generate(prompt)`` reports the prompt it prefills (it
    reported 0), and no prefill rate: the prompt was evaluated before the call.
    ExecuTorch's runner reports the same tokens plus its generated count (the context at
    the end of the call)."""
    et = pytest.importorskip("executorch.extension.llm.runner")
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

    config = GenerationConfig(max_new_tokens=5, temperature=0.0, echo=False)
    r = _runner("portable", tokenizer)
    n_prompt = len(r.tokenizer.encode(PROMPT))
    n_more = len(r.tokenizer.encode(" and then"))

    def ours(steps: list[str]) -> tuple[list[int], list[dict[str, Any]]]:
        r.reset()
        counts, figures = [], []
        for step in steps:
            if step.startswith("prefill:"):
                r.prefill(step.removeprefix("prefill:"), config)
                continue
            r.generate(step, config)
            counts.append(r.stats.num_prompt_tokens)
            figures.append(json.loads(r.stats.to_json_string()))
        return counts, figures

    def executorch(steps: list[str]) -> list[tuple[int, int]]:
        runner = et.TextLLMRunner(str(program("portable")), str(tokenizer))
        cfg = et.GenerationConfig(max_new_tokens=5, temperature=0.0, echo=False)
        seen: list[Any] = []
        for step in steps:
            if step.startswith("prefill:"):
                runner.prefill(step.removeprefix("prefill:"), cfg)
            else:
                runner.generate(step, cfg, stats_callback=seen.append)
        return [(s.num_prompt_tokens, s.num_generated_tokens) for s in seen]

    for steps, want in (
        ([f"prefill:{PROMPT}", ""], [n_prompt]),
        ([f"prefill:{PROMPT}", "prefill: and then", ""], [n_prompt + n_more]),
    ):
        counts, figures = ours(steps)
        assert counts == want
        assert all("prefill_token_per_sec" not in f for f in figures)
        (their,) = executorch(steps)
        assert their[0] - their[1] == want[0]
    # in a context that holds a generation: the prompt prefilled since, as generate(prompt)
    counts, _ = ours([PROMPT, "prefill: and then", ""])
    assert counts == ours([PROMPT, " and then"])[0] == [n_prompt, n_more]


def test_second_prompt_continues_the_context(tokenizer: Path) -> None:
    r = _runner("portable", tokenizer)
    config = GenerationConfig(max_new_tokens=6, temperature=0.0, echo=False)
    r.generate(PROMPT, config)
    first_ids = list(r.generated_tokens)
    pos = r.pos
    assert pos == len(r.tokenizer.encode(PROMPT)) + 5  # the last token is not in the cache
    r.generate(" and then", config)
    second = list(r.generated_tokens)
    # the same as one prompt holding the whole context
    history = r.tokenizer.encode(PROMPT) + first_ids[:-1] + r.tokenizer.encode(" and then")
    fresh = _multimodal("portable", tokenizer)
    fresh.generate_text([make_token_input(history)], config)
    assert fresh.generated_tokens == second


def test_seq_len_bounds_the_whole_context_as_executorchs_runner(tokenizer: Path) -> None:
    """In a context that holds an earlier generation, ``seq_len`` bounds every token in it,
    the earlier ones included, as ExecuTorch's runner resolves it (its counts leave out
    the first token); a ``seq_len`` the context already fills is refused by both."""
    et = pytest.importorskip("executorch.extension.llm.runner")
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

    first = GenerationConfig(max_new_tokens=5, temperature=0.0, echo=False)
    ours = _runner("portable", tokenizer)
    theirs = et.TextLLMRunner(str(program("portable")), str(tokenizer))
    occupied = len(ours.tokenizer.encode(PROMPT)) + 4 + len(ours.tokenizer.encode(" and then"))
    for seq_len in (occupied - 2, occupied + 2, occupied + 16):
        ours.reset()
        theirs.reset()
        ours.generate(PROMPT, first)
        theirs.generate(PROMPT, et.GenerationConfig(max_new_tokens=5, temperature=0.0, echo=False))
        seen: list[Any] = []
        try:
            theirs.generate(
                " and then",
                et.GenerationConfig(seq_len=seq_len, temperature=0.0, echo=False),
                stats_callback=seen.append,
            )
        except RuntimeError:
            with pytest.raises(GenerationError, match="seq_len"):
                ours.generate(" and then", GenerationConfig(seq_len=seq_len, temperature=0.0))
            continue
        ours.generate(" and then", GenerationConfig(seq_len=seq_len, temperature=0.0, echo=False))
        assert ours.stats.num_generated_tokens == seen[0].num_generated_tokens + 1
        assert ours.stats.num_generated_tokens == seq_len - occupied


def test_context_limits(tokenizer: Path) -> None:
    mm = _multimodal("portable", tokenizer)
    with pytest.raises(GenerationError, match="context"):
        mm.generate([make_token_input([5] * MODEL.max_context_len)], GREEDY)
    # the runner still works after the error
    assert mm.pos == 0
    mm.generate([make_token_input([5, 6])], GenerationConfig(max_new_tokens=2, temperature=0))
    assert mm.stats.num_generated_tokens == 2
    r = _runner("portable", tokenizer)
    r.generate(PROMPT, GenerationConfig(max_new_tokens=3, temperature=0.0, echo=False))
    assert r.stats.num_generated_tokens == 3
    # max_new_tokens resolves against the context: ask for more than fits
    r.reset()
    big = GenerationConfig(max_new_tokens=1000, temperature=0.0, echo=False, ignore_eos=True)
    r.generate(PROMPT, big)
    n = len(r.tokenizer.encode(PROMPT))
    assert r.stats.num_generated_tokens == MODEL.max_context_len - n
    r.reset()
    r.generate(PROMPT, GenerationConfig(seq_len=n + 4, temperature=0.0, echo=False))
    assert r.stats.num_generated_tokens == 4


def test_multimodal_runner_text_and_tokens(tokenizer: Path) -> None:
    text_runner = _runner("portable", tokenizer)
    want = text_runner.generate_text(PROMPT, GREEDY)
    mm = MultimodalRunner(str(program("portable")), str(tokenizer), print_output=False)
    ids = mm.tokenizer.encode(PROMPT)
    assert mm.generate_text([make_text_input(PROMPT)], GREEDY) == want
    mm.reset()
    head = mm.tokenizer.encode("Once")
    assert ids[: len(head)] == head
    mixed = [make_text_input("Once"), make_token_input(ids[len(head) :])]
    assert mm.generate_text(mixed, GREEDY) == want
    mm.reset()
    assert mm.generate_text([make_token_input(ids)], GREEDY) == want
    mm.reset()
    assert mm.generate_text_hf({"input_ids": torch.tensor([ids])}, GREEDY) == want
    mm.reset()
    with pytest.raises(GenerationError, match="image"):
        mm.generate([make_image_input(torch.zeros(3, 4, 4, dtype=torch.uint8))], GREEDY)
    # BOS and EOS go with the first input, ids given as tokens too: BOS begins the prompt
    # (it went to the first text, after the tokens)
    mm.reset()
    seen: list[list[int]] = []

    def context(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen.append(ids[0].tolist())
        return scores

    rest = PROMPT[len("Once") :]
    config = GenerationConfig(max_new_tokens=1, temperature=0.0, echo=False, num_bos=1,
                              logits_processor=context)  # fmt: skip
    mm.generate_text([make_token_input(head), make_text_input(rest)], config)
    assert seen == [[mm.tokenizer.bos_id, *head, *mm.tokenizer.encode(rest)]]


# --------------------------------------------------------------------------------------
# devices


def test_logits_stay_on_the_device_until_sampled(tokenizer: Path) -> None:
    """Sampling reads one integer from the logits' device, nothing else (the CUDA rule,
    checked by the ops that run: no copy of the logits, one scalar read of one element)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ptexec.llm import Sampler

    class Record(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[str, list[int]]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            sizes = [a.numel() for a in args if isinstance(a, torch.Tensor)]
            self.ops.append((str(func), sizes))
            return func(*args, **(kwargs or {}))

    r = _runner("portable", tokenizer)
    logits = r.decoder.prefill(r.tokenizer.encode(PROMPT), 0)
    assert logits.device == r.decoder.device
    for sampler in (Sampler(0.0), Sampler(0.8, top_p=0.9, top_k=40, seed=1)):
        with Record() as rec:
            sampler.sample(logits)
        reads = [s for op, s in rec.ops if "_local_scalar_dense" in op]
        assert reads == [[1]], rec.ops
        assert not any("_to_copy" in op or "copy_" in op for op, _ in rec.ops), rec.ops


@pytest.mark.cuda
def test_generation_on_cuda(tokenizer: Path) -> None:
    cpu = _runner("portable", tokenizer)
    gpu = _runner("portable", tokenizer, device_map="cuda")
    assert gpu.decoder.device.type == "cuda"
    logits = gpu.decoder.prefill(gpu.tokenizer.encode(PROMPT), 0)
    assert logits.device.type == "cuda"
    gpu.reset()
    assert gpu.generate_text(PROMPT, GREEDY) == cpu.generate_text(PROMPT, GREEDY)


def test_compile_option(tokenizer: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compile=True generates through the compiled tier: the interpreter's greedy tokens."""
    from compile_util import session_cache_dir

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))
    r = _runner("portable", tokenizer, compile=True)
    report = r.decoder.method.compile_report
    assert report is not None and report.compiled_instructions > 0, report
    want = _runner("portable", tokenizer).generate_text(PROMPT, GREEDY)
    assert r.generate_text(PROMPT, GREEDY) == want


# --------------------------------------------------------------------------------------
# a refused call changes nothing


def test_refused_call_leaves_the_runner_as_fresh(
    tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prompt past the context, or a seq_len below the prompt, is refused before prefill
    and before the prompt is echoed: the next generate equals a fresh runner's."""
    fresh = _runner("portable", tokenizer)
    want = fresh.generate_text(PROMPT, GREEDY)
    n = len(fresh.tokenizer.encode(PROMPT))
    r = TextLLMRunner(str(program("portable")), str(tokenizer))  # prints, as ExecuTorch's
    pieces: list[str] = []
    too_long = " ".join([PROMPT] * 40)
    for prompt, config in [
        (PROMPT, GenerationConfig(seq_len=n, temperature=0.0)),  # no room after the prompt
        (PROMPT, GenerationConfig(seq_len=n - 2, temperature=0.0)),
        (too_long, GenerationConfig(max_new_tokens=4, temperature=0.0)),
        (PROMPT, GenerationConfig(num_bos=MODEL.max_context_len, temperature=0.0)),
    ]:
        with pytest.raises(GenerationError, match=r"context|seq_len"):
            r.generate(prompt, config, token_callback=pieces.append)
        assert r.pos == 0 and r.stats.num_prompt_tokens == 0
    assert pieces == [] and capsys.readouterr().out == ""  # the prompt was not echoed
    r.print_output = False
    assert r.generate_text(PROMPT, GREEDY) == want
    assert r.generated_tokens == fresh.generated_tokens


def test_refused_continuation_keeps_the_context(tokenizer: Path) -> None:
    """After a generate (or a prefill), a refused call keeps the context it had."""
    config = GenerationConfig(max_new_tokens=6, temperature=0.0, echo=False)
    ref = _runner("portable", tokenizer)
    ref.generate(PROMPT, config)
    ref.generate(" and then", config)
    r = _runner("portable", tokenizer)
    r.generate(PROMPT, config)
    pos, stats = r.pos, r.stats.as_dict()
    with pytest.raises(GenerationError, match="seq_len"):
        r.generate(" and then", GenerationConfig(seq_len=pos, temperature=0.0))
    assert r.pos == pos and r.stats.as_dict() == stats
    r.generate(" and then", config)
    assert r.generated_tokens == ref.generated_tokens
    # a prefill's pending token survives a refused generate("")
    want = _runner("portable", tokenizer).generate_text(PROMPT, GREEDY)
    r.reset()
    r.prefill(PROMPT, GREEDY)
    with pytest.raises(GenerationError, match="seq_len"):
        r.generate("", GenerationConfig(seq_len=r.pos, temperature=0.0))
    assert r.generate_text("", GREEDY) == want


def test_runner_temperature_override_is_checked(tokenizer: Path) -> None:
    from ptexec.errors import ConfigValueError

    with pytest.raises(ConfigValueError, match="temperature"):
        _runner("portable", tokenizer, temperature=float("nan"))
    r = _runner("portable", tokenizer, temperature=0.0)  # -1 (the default) defers to config
    sampled = GenerationConfig(max_new_tokens=24, temperature=1.5, seed=1, echo=False)
    assert r.generate_text(PROMPT, sampled) == _runner("portable", tokenizer).generate_text(
        PROMPT, GREEDY
    )


def test_stop_string_given_as_str(tokenizer: Path) -> None:
    """stop="ab" is the stop string "ab", not the characters "a" and "b"."""
    r = _runner("portable", tokenizer)
    full = r.generate_text(PROMPT, GREEDY)
    # a two-character stop string whose characters both occur earlier in the text
    at = next(i for i in range(4, len(full) - 1) if full[i] in full[:i] and full[i + 1] in full[:i])
    stop = full[at : at + 2]
    at = full.index(stop)
    r.reset()
    assert r.generate_text(PROMPT, GenerationConfig(**_greedy(), stop=stop)) == full[:at]


def _greedy() -> dict[str, Any]:
    return {"max_new_tokens": GREEDY.max_new_tokens, "temperature": 0.0, "echo": False}


# --------------------------------------------------------------------------------------
# the tokenizer's vocabulary against the program's


def test_tokenizer_larger_than_the_program_is_refused(tmp_path: Path) -> None:
    big = llm_programs.make_tokenizer(
        tmp_path / "tokenizer.json", llm_programs.TinyLlama(vocab_size=MODEL.vocab_size + 40)
    )
    with pytest.raises(GenerationError, match=f"{MODEL.vocab_size + 40} ids"):
        TextLLMRunner(str(program("portable")), str(big), print_output=False)


def test_tokenizer_smaller_than_the_program_samples_only_its_ids(tmp_path: Path) -> None:
    """Exports pad the logits past the tokenizer's ids; the padding is never sampled, so no
    generated token lacks its text."""
    size = MODEL.vocab_size - 112
    small = llm_programs.make_tokenizer(
        tmp_path / "tokenizer.json", llm_programs.TinyLlama(vocab_size=size)
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a padding-sized gap does not warn
        r = TextLLMRunner(str(program("portable")), str(small), print_output=False)
    config = GenerationConfig(
        max_new_tokens=80, temperature=50.0, seed=0, echo=False, ignore_eos=True
    )  # nearly uniform over the program's 512 ids
    text = r.generate_text(PROMPT, config)
    assert len(r.generated_tokens) == 80
    assert max(r.generated_tokens) < size
    assert text == r.tokenizer.decode(r.generated_tokens, skip_special_tokens=True)


def test_tokenizer_far_smaller_than_the_logits_warns() -> None:
    from ptexec.llm.runner import _sample_width

    assert _sample_width(512, 512) is None
    assert _sample_width(151665, 151936) == 151665  # Qwen2.5's padding
    with pytest.warns(RuntimeWarning, match="128256 ids and the tokenizer only 50257"):
        assert _sample_width(50257, 128256) == 50257


def test_the_runner_modules_names_are_executorchs(tokenizer: Path) -> None:
    """What code written for ExecuTorch's runner module calls, made and read as ExecuTorch's
    bindings make and read them: inputs by keyword or a list of ids, Audio's values and
    accessors, the module's generate_hf functions, a Stats object per call and the rates
    in its JSON."""
    import json as _json

    et = pytest.importorskip("executorch.extension.llm.runner._llm_runner")
    import numpy as np

    from ptexec.llm import Audio, Image, MultimodalInput, generate_hf, generate_text_hf

    for ours, theirs in (
        (MultimodalInput(text="hi"), et.MultimodalInput(text="hi")),
        (MultimodalInput([1, 2]), et.MultimodalInput([1, 2])),
        (MultimodalInput(tokens=(3, 4)), et.MultimodalInput(tokens=(3, 4))),
        (MultimodalInput(np.array([5, 6])), et.MultimodalInput(np.array([5, 6]))),
        (MultimodalInput([True]), et.MultimodalInput([True])),
        (MultimodalInput(b"ab"), et.MultimodalInput(b"ab")),
    ):
        assert (ours.get_text(), ours.get_tokens()) == (theirs.get_text(), theirs.get_tokens())
    image = Image([1] * 12, 2, 2, 3)
    assert MultimodalInput(image=image).get_image() is image
    for bad in ([-1], [1.5], [1 << 64], 5):
        with pytest.raises(TypeError):
            MultimodalInput(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        MultimodalInput(text="a", tokens=[1])
    values = [0.5, -1.25, 3.0, 0.0, 2.5, 1.0]
    for data in (values, [1, 2, 3, 4, 5, 6], [-1, 2, 3, 4, 5, 6], [300, 2, 3, 4, 5, 6]):
        ours_audio, theirs_audio = Audio(data, 1, 2, 3), et.Audio(data, 1, 2, 3)
        assert ours_audio.is_float() == theirs_audio.is_float()
        assert ours_audio.is_uint8() == theirs_audio.is_uint8()
        if theirs_audio.is_float():  # (the other accessor raises in ExecuTorch's)
            assert ours_audio.float_data == pytest.approx(list(theirs_audio.float_data))
        else:
            assert ours_audio.uint8_data == list(theirs_audio.uint8_data)
        assert ours_audio.to_tensor().shape == (1, 2, 3)

    positional = et.GenerationConfig(False, 5, False, 9, 0.5, 1, 0)
    ours_config = GenerationConfig(False, 5, False, 9, 0.5, 1, 0)
    for field in ("echo", "max_new_tokens", "warming", "seq_len", "num_bos", "num_eos"):
        assert getattr(ours_config, field) == getattr(positional, field), field
    assert ours_config.temperature == pytest.approx(positional.temperature)

    mm = MultimodalRunner(str(program("portable")), str(tokenizer), print_output=False)
    ids = mm.tokenizer.encode(PROMPT)
    want = mm.generate_text([make_token_input(ids)], GREEDY)
    mm.reset()
    assert generate_text_hf(mm, {"input_ids": torch.tensor([ids])}, GREEDY) == want
    mm.reset()
    pieces: list[str] = []
    kept: list[Any] = []
    generate_hf(mm, [make_token_input(ids)], GREEDY, None, pieces.append, kept.append)
    assert "".join(pieces) == want
    mm.reset()
    mm.generate([make_token_input(ids[:2])], GREEDY, stats_callback=kept.append)
    assert kept[0] is not kept[1] and kept[0].num_prompt_tokens == len(ids)
    figures = _json.loads(kept[0].to_json_string())
    assert figures["decode_token_per_sec"] > 0 and figures["prefill_token_per_sec"] > 0


_FORK_MID_GENERATION = """
import json, os, signal, sys, threading
sys.path.insert(0, {tests!r})
from ptexec.errors import StateError
from ptexec.llm import GenerationConfig, TextLLMRunner

pte, tok = {pte!r}, {tok!r}
greedy = GenerationConfig(max_new_tokens=24, temperature=0.0, echo=False)
r = TextLLMRunner(pte, tok, print_output=False)
inside, leave = threading.Event(), threading.Event()
def hold(text):  # on the generating thread, inside its generation
    inside.set()
    leave.wait()
worker = threading.Thread(target=r.generate_text, args=({prompt!r}, greedy, hold))
worker.start()
inside.wait()
child = os.fork()
if child == 0:
    signal.alarm(60)  # (a call waiting for the runner's lock for ever)
    seen = {{}}
    for call in ("reset", "generate"):
        try:
            r.reset() if call == "reset" else r.generate_text({prompt!r}, greedy)
            seen[call] = "answered"
        except StateError as e:
            seen[call] = str(e)
    fresh = TextLLMRunner(pte, tok, print_output=False)
    fresh.generate_text({prompt!r}, greedy)
    seen["fresh"] = fresh.generated_tokens
    print(json.dumps(seen), flush=True)
    os._exit(0)
_, code = os.waitpid(child, 0)
leave.set()
worker.join()
print(json.dumps({{"code": code, "parent": r.generated_tokens}}), flush=True)
"""


def test_a_child_forked_during_a_generation_refuses_that_runner(tokenizer: Path) -> None:
    """A process forked while another thread generates (a host forking workers beside a
    thread that serves): that generation never ends in the child, whose next call waited
    for the runner's lock for ever. The child's runner refuses with StateError; a new
    runner there generates ExecuTorch's tokens, and the parent's generation ends as it
    would have."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    pte = program("xnnpack")
    code = _FORK_MID_GENERATION.format(
        tests=str(Path(__file__).resolve().parent), pte=str(pte), tok=str(tokenizer), prompt=PROMPT
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert len(lines) == 2, done.stdout
    child, parent = lines
    for call in ("reset", "generate"):
        assert child[call].startswith("this TextLLMRunner was generating on another thread")
    want = executorch_greedy(pte, _runner("xnnpack", tokenizer).tokenizer.encode(PROMPT), 24, True)
    assert child["fresh"] == want
    assert parent == {"code": 0, "parent": want}
