"""Whisper's decoding rules against transformers' own: the decoder prompt a generation
config gives (transformers' ``_retrieve_init_tokens``, with its language detection), the
``suppress_tokens`` / ``begin_suppress_tokens`` processors and the timestamp rules
(``WhisperTimeStampLogitsProcessor``) on random contexts and scores. No program is
exported here; ``tests/test_seq2seq.py`` runs the rules in generations."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.generation.logits_process import (  # noqa: E402
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    WhisperTimeStampLogitsProcessor,
)
from transformers.models.whisper.generation_whisper import WhisperGenerationMixin  # noqa: E402

from ptexec.errors import GenerationError  # noqa: E402
from ptexec.llm import DecoderPrompt  # noqa: E402
from ptexec.llm.logits import SuppressTokens, SuppressTokensAtBegin, TimestampRules  # noqa: E402
from ptexec.llm.seq2seq import _prompt_from  # noqa: E402

SOT, EN, FR, DE = 50258, 50259, 50265, 50261
TRANSCRIBE, TRANSLATE, NO_TS = 50359, 50358, 50363
DETECTED = FR  # what the stand-in model below "detects"

MULTILINGUAL = {
    "decoder_start_token_id": SOT,
    "eos_token_id": 50257,
    "lang_to_id": {"<|en|>": EN, "<|fr|>": FR, "<|de|>": DE},
    "task_to_id": {"transcribe": TRANSCRIBE, "translate": TRANSLATE},
    "no_timestamps_token_id": NO_TS,
    "is_multilingual": True,
}


class _Detector:
    """What ``_retrieve_init_tokens`` needs of the model: a device and detect_language."""

    device = torch.device("cpu")

    def detect_language(self, **_: Any) -> torch.Tensor:
        return torch.tensor([DETECTED])


def _transformers_prompt(gen: dict[str, Any], language: str | None, task: str | None,
                         timestamps: bool) -> list[int]:  # fmt: skip
    config = transformers.GenerationConfig(**copy.deepcopy(gen))
    config.return_timestamps = timestamps
    WhisperGenerationMixin._set_language_and_task(language, task, None, config)
    tokens = WhisperGenerationMixin._retrieve_init_tokens(
        _Detector(), None, 1, config, None, 3000, {}
    )
    return [int(t) for t in tokens[0]]


def _ours(gen: dict[str, Any], language: str | None, task: str | None,
          timestamps: bool) -> list[int]:  # fmt: skip
    prompt = _prompt_from(gen, SOT, language, task, timestamps)
    return prompt.detected(DETECTED).prefix() if prompt.detect else prompt.prefix()


FORCED = [
    None,  # no forced_decoder_ids (newer configs)
    [[1, None], [2, TRANSCRIBE]],  # openai/whisper-* configs: the language left open
    [[1, None], [2, TRANSCRIBE], [3, NO_TS]],
    [[1, EN], [2, TRANSLATE]],
    [[1, DE], [2, TRANSCRIBE], [3, NO_TS]],
]


@pytest.mark.parametrize("forced", FORCED, ids=range(len(FORCED)))
def test_decoder_prompt_equals_transformers(forced: list[list[Any]] | None) -> None:
    gen = {**MULTILINGUAL, **({"forced_decoder_ids": forced} if forced else {})}
    for language, task, timestamps in itertools.product(
        (None, "fr", "<|de|>"), (None, "transcribe", "translate"), (False, True)
    ):
        want = _transformers_prompt(gen, language, task, timestamps)
        assert _ours(gen, language, task, timestamps) == want, (forced, language, task)


def test_language_detection_is_asked_for_exactly_when_transformers_detects() -> None:
    gen = {**MULTILINGUAL, "forced_decoder_ids": [[1, None], [2, TRANSCRIBE]]}
    prompt = _prompt_from(gen, SOT, None, None, False)
    assert prompt == DecoderPrompt(SOT, (TRANSCRIBE, NO_TS), (EN, DE, FR))
    assert len(prompt) == 4
    with pytest.raises(GenerationError, match="detect"):
        prompt.prefix()
    assert prompt.detected(DE).prefix() == [SOT, DE, TRANSCRIBE, NO_TS]
    with pytest.raises(GenerationError, match="not one of the languages"):
        prompt.detected(TRANSCRIBE)
    given = _prompt_from(gen, SOT, "en", None, False)
    assert not given.detect and given.prefix() == [SOT, EN, TRANSCRIBE, NO_TS]
    # an English-only model (whisper-*.en): no table, nothing to detect; no language taken
    english = {
        "decoder_start_token_id": SOT,
        "forced_decoder_ids": [[1, NO_TS]],
        "no_timestamps_token_id": NO_TS,
        "is_multilingual": False,
    }
    assert _prompt_from(english, SOT, None, None, False).prefix() == [SOT, NO_TS]
    assert _prompt_from(english, SOT, None, None, True).prefix() == [SOT]
    with pytest.raises(GenerationError, match="English-only"):
        _prompt_from(english, SOT, "en", None, False)
    with pytest.raises(GenerationError, match="xx"):
        _prompt_from(gen, SOT, "xx", None, False)
    with pytest.raises(GenerationError, match="task"):
        _prompt_from(gen, SOT, None, "summarize", False)
    # the config's own language and task count as asked for
    assert _prompt_from({**gen, "language": "de"}, SOT, None, None, True).prefix() == [
        SOT,
        DE,
        TRANSCRIBE,
    ]


def test_suppress_processors_equal_transformers() -> None:
    g = torch.Generator().manual_seed(0)
    ids = [3, 7, 7, 40, 99]  # 99 is past this vocabulary: ignored
    ours, theirs = SuppressTokens(ids), SuppressTokensLogitsProcessor(ids)
    begin = SuppressTokensAtBegin([3, 5])
    their_begin = SuppressTokensAtBeginLogitsProcessor([3, 5], begin_index=4)
    begin.begin([0, 1, 2, 9])
    for length in (4, 5, 6):
        context = torch.randint(0, 50, (1, length), generator=g)
        scores = torch.randn(1, 50, generator=g)
        assert torch.equal(ours(context, scores.clone()), theirs(context, scores.clone()))
        got = begin(context, scores.clone())
        assert torch.equal(got, their_begin(context, scores.clone()))
        assert bool(torch.isinf(got[0, 3])) == (length == 4)


@pytest.mark.parametrize("max_initial", [None, 0, 7])
def test_timestamp_rules_equal_transformers(max_initial: int | None) -> None:
    """Random contexts mixing text, EOS-and-above specials and timestamps, random scores
    (some runs with the timestamps made likely): the same masked scores, exactly."""
    vocab, ts, no_ts, eos = 120, 80, 79, 70
    config = transformers.GenerationConfig(
        no_timestamps_token_id=no_ts, eos_token_id=eos, max_initial_timestamp_index=max_initial
    )
    g = torch.Generator().manual_seed(1)
    prompt = [1, 5, 6]
    theirs = WhisperTimeStampLogitsProcessor(config, begin_index=len(prompt))
    ours = TimestampRules(ts, no_ts, eos, max_initial)
    ours.begin(prompt)
    banned_text = 0
    for case in range(600):
        n = int(torch.randint(0, 9, (1,), generator=g))
        pool = torch.tensor([2, 3, 40, 70, 71, 80, 81, 85, 90, 110])
        generated = pool[torch.randint(0, len(pool), (n,), generator=g)].tolist()
        context = torch.tensor([prompt + generated])
        scores = torch.randn(1, vocab, generator=g) * 3
        if case % 3 == 0:
            scores[0, ts:] += 4.0  # the timestamps' mass beats any text token's
        want = theirs(context, scores.clone())
        got = ours(context, scores.clone())
        assert torch.equal(got, want), (generated, case)
        banned_text += bool(torch.isinf(got[0, :ts]).all())
    assert banned_text > 100  # the rules did act
