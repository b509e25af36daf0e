"""``Seq2SeqRunner`` and ``ptexec transcribe`` on tiny Whisper programs exported by
optimum-executorch (``scripts/seq2seq_programs.py``: portable and XNNPACK recipes, and
ExecuTorch's ``WhisperAudioProcessor`` as the preprocessor program).

References: the same checkpoint's eager Hugging Face ``generate`` (greedy, the same decoder
prompt), optimum-executorch's own loop on ExecuTorch's runtime, and the Hugging Face feature
extractor. The programs are exported once per machine (minutes), so the module is ``slow``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
import wave
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")
pytest.importorskip("optimum.exporters.executorch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import seq2seq_programs  # noqa: E402

from ptexec.errors import GenerationError  # noqa: E402
from ptexec.llm import DecoderPrompt, GenerationConfig, Seq2SeqRunner  # noqa: E402
from ptexec.llm.audio import ProcessorFeatures, ProgramFeatures, load_audio, windows  # noqa: E402
from ptexec.llm.logits import RepetitionPenalty  # noqa: E402
from ptexec.llm.seq2seq import split_segments  # noqa: E402

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=12)


class _Folders(dict[str, Path]):
    """Each variant's directory, exported when a test first asks for it."""

    def __missing__(self, variant: str) -> Path:
        self[variant] = path = seq2seq_programs.program_dir(variant)
        return path


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    return _Folders()


@pytest.fixture(scope="module")
def runners(folders: dict[str, Path]) -> dict[str, Seq2SeqRunner]:
    return {
        v: Seq2SeqRunner(folders[v] / "model.pte", folders[v])
        for v in ("whisper_portable", "whisper_xnnpack")
    }


@pytest.fixture(scope="module")
def eager(folders: dict[str, Path]) -> Any:
    return transformers.WhisperForConditionalGeneration.from_pretrained(
        folders["whisper_portable"]
    ).eval()


def _features(seed: int) -> torch.Tensor:
    return torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(seed))


def _eager_greedy(model: Any, features: torch.Tensor, prefix: list[int], n: int,
                  **options: Any) -> list[int]:  # fmt: skip
    with torch.no_grad():
        out = transformers.GenerationMixin.generate(
            model,
            input_features=features,
            decoder_input_ids=torch.tensor([prefix]),
            max_new_tokens=n,
            do_sample=False,
            **options,
        )
    return [int(t) for t in out[0, len(prefix) :]]


@pytest.mark.parametrize("variant", ["whisper_portable", "whisper_xnnpack"])
def test_greedy_tokens_equal_the_eager_model(
    runners: dict[str, Seq2SeqRunner], eager: Any, variant: str
) -> None:
    runner = runners[variant]
    # start and forced tokens come from the checkpoint's generation_config.json
    assert runner.prompt == DecoderPrompt(1, (10, 11))
    assert runner.eos_ids == {seq2seq_programs.EOS_ID}
    for seed in (0, 1):
        x = _features(seed)
        got = runner.generate(x, GREEDY)
        want = _eager_greedy(eager, x, runner.prompt.prefix(), GREEDY.max_new_tokens)
        assert got == want, (variant, seed)
        assert len(set(got)) > 1  # not a constant: the tokens depend on the input
    assert _eager_greedy(eager, _features(0), [1, 10, 11], 12) != _eager_greedy(
        eager, _features(1), [1, 10, 11], 12
    )


def test_a_runner_made_in_inference_mode_generates_outside_it(
    folders: dict[str, Path], eager: Any
) -> None:
    """Made under ``torch.inference_mode()`` (a server's start-up), used outside it."""
    with torch.inference_mode():
        runner = Seq2SeqRunner(
            folders["whisper_portable"] / "model.pte", folders["whisper_portable"]
        )
    x = _features(0)
    want = _eager_greedy(eager, x, runner.prompt.prefix(), GREEDY.max_new_tokens)
    assert runner.generate(x, GREEDY) == want


def test_tokens_equal_optimums_loop_on_executorch(
    folders: dict[str, Path], runners: dict[str, Seq2SeqRunner]
) -> None:
    optimum = pytest.importorskip("optimum.executorch")
    folder = folders["whisper_portable"]
    model = optimum.ExecuTorchModelForSpeechSeq2Seq.from_pretrained(str(folder))
    assert type(model.model).__module__.startswith("executorch.")
    x = _features(2)
    theirs = model.generate(x, max_seq_len=12)  # from the start token alone
    ours = runners["whisper_portable"].generate(
        x, GenerationConfig(temperature=0.0, max_new_tokens=len(theirs)), prompt=DecoderPrompt(1)
    )
    assert ours == [int(t) for t in theirs]


def test_streaming_text_and_stats(runners: dict[str, Seq2SeqRunner]) -> None:
    runner = runners["whisper_portable"]
    pieces: list[str] = []
    seen: list[Any] = []
    ids = runner.generate(_features(0), GREEDY, pieces.append, seen.append)
    assert "".join(pieces) == runner.decode(ids) and pieces
    stats = runner.stats
    assert len(seen) == 1 and seen[0] is not stats and seen[0].as_dict() == stats.as_dict()
    assert stats.num_generated_tokens == len(ids) == len(runner.generated_tokens)
    assert stats.num_prompt_tokens == 1500  # the encoder's output positions
    assert stats.prompt_eval_end_ms >= stats.inference_start_ms > 0
    assert stats.inference_end_ms >= stats.first_token_ms >= stats.prompt_eval_end_ms
    assert stats.aggregate_model_execution_time_ms > 0
    assert runner.finish_reason in ("stop", "length")


def test_repetition_penalty_equals_transformers(
    runners: dict[str, Seq2SeqRunner], eager: Any
) -> None:
    runner = runners["whisper_portable"]
    x = _features(0)
    config = GenerationConfig(
        temperature=0.0, max_new_tokens=12, logits_processor=RepetitionPenalty(1.8)
    )
    got = runner.generate(x, config)
    want = _eager_greedy(eager, x, runner.prompt.prefix(), 12, repetition_penalty=1.8)
    assert got == want
    assert got != runner.generate(x, GREEDY)


def test_sampling_is_seeded(runners: dict[str, Seq2SeqRunner]) -> None:
    runner = runners["whisper_portable"]
    x = _features(3)
    runs = [
        runner.generate(x, GenerationConfig(temperature=1.0, top_p=1.0, seed=s, max_new_tokens=10))
        for s in (7, 7, 8)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert all(0 <= t < runner.vocab_size for r in runs for t in r)


def test_forced_and_start_tokens_from_arguments(folders: dict[str, Path], eager: Any) -> None:
    folder = folders["whisper_portable"]
    runner = Seq2SeqRunner(
        folder / "model.pte",
        folder,
        decoder_start_token_id=3,
        forced_decoder_ids=[(1, 20)],
        eos_ids=[5],
    )
    assert runner.prompt.prefix() == [3, 20] and runner.eos_ids == {5}
    x = _features(4)
    assert runner.generate(x, GREEDY) == _eager_greedy(eager, x, [3, 20], 12, eos_token_id=5)
    # without a generation config, the program's decoder_start_token_id method
    bare = Seq2SeqRunner(folder / "model.pte", folder, generation_config={})
    assert bare.prompt == DecoderPrompt(1)


def test_one_eos_id_is_taken_as_transformers_takes_it(folders: dict[str, Path], eager: Any) -> None:
    """``eos_ids`` may be one id, as transformers' ``eos_token_id`` may be; a bool or a
    float is not an id."""
    folder = folders["whisper_portable"]
    x = _features(4)
    free = Seq2SeqRunner(folder / "model.pte", folder, decoder_start_token_id=3, eos_ids=[])
    eos = free.generate(x, GREEDY)[2]  # a token the model does produce
    runner = Seq2SeqRunner(folder / "model.pte", folder, decoder_start_token_id=3, eos_ids=eos)
    assert runner.eos_ids == {eos}
    expected = _eager_greedy(eager, x, runner.prompt.prefix(), 12, eos_token_id=eos)
    assert runner.generate(x, GREEDY) == expected
    for wrong in ([True], [float(eos)], "5"):
        with pytest.raises(GenerationError, match="eos_ids must be token ids"):
            Seq2SeqRunner(folder / "model.pte", folder, eos_ids=wrong)  # type: ignore[arg-type]


def _write_wav(path: Path, seconds: float, rate: int) -> None:
    """Stereo 16-bit PCM: two chirps and noise (the stdlib's writer)."""
    n = int(seconds * rate)
    t = torch.arange(n, dtype=torch.float64) / rate
    g = torch.Generator().manual_seed(0)
    left = 0.3 * torch.sin(2 * math.pi * (200 + 40 * t) * t) + 0.05 * torch.randn(n, generator=g,
                                                                              dtype=torch.float64)  # fmt: skip
    right = 0.3 * torch.sin(2 * math.pi * (900 - 10 * t) * t)
    q = torch.round(torch.stack([left, right], dim=1).clamp(-1, 1) * 32767).to(torch.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(q.numpy().tobytes())


def test_transcribe_long_audio_in_windows(
    tmp_path: Path, folders: dict[str, Path], runners: dict[str, Seq2SeqRunner], eager: Any
) -> None:
    folder = folders["whisper_portable"]
    runner = runners["whisper_portable"]
    wav = tmp_path / "speech.wav"
    _write_wav(wav, 40.0, 22050)
    features = ProcessorFeatures(folder)
    config = GenerationConfig(temperature=0.0, max_new_tokens=6)
    result = runner.transcribe(wav, features, config)
    assert len(result.tokens) == 2  # 30 s + 10 s
    samples, rate = load_audio(wav, 16000)
    assert rate == 16000 and samples.numel() == math.ceil(40.0 * 22050 * 16000 / 22050)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    for (start, window), got in zip(windows(samples, 16000), result.tokens, strict=True):
        x = extractor(window.numpy(), sampling_rate=16000, return_tensors="pt").input_features
        assert got == _eager_greedy(eager, x, runner.prompt.prefix(), 6), start
    texts = [runner.decode(t).strip() for t in result.tokens]
    assert result.text == " ".join(t for t in texts if t)
    assert result.segments == []  # this vocabulary has no timestamp tokens


def test_timestamps_become_segments(tmp_path: Path, folders: dict[str, Path], eager: Any) -> None:
    """Ids from 200 on stand for timestamp tokens (``no_timestamps_token_id`` 199): the
    model emits some, and each window's segments are timed from its start."""
    folder = folders["whisper_portable"]
    gen = {**seq2seq_programs.generation_config(), "no_timestamps_token_id": 199}
    runner = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen, timestamps=True)
    assert runner.prompt.prefix() == [1, 10, 11] and runner.timestamp_begin == 200
    wav = tmp_path / "speech.wav"
    _write_wav(wav, 35.0, 16000)
    result = runner.transcribe(wav, ProcessorFeatures(folder), GREEDY)
    assert any(t >= 200 for ids in result.tokens for t in ids)
    want = []
    for ids, start, end in zip(result.tokens, (0.0, 30.0), (30.0, 35.0), strict=True):
        for s, e, toks in split_segments(ids, 200, start, ignore=runner.eos_ids):
            want.append((s, end if e < 0 else e, runner.decode([t for t in toks if t < 200])))
    assert [(s.start, s.end, s.text) for s in result.segments] == want and want
    no_ts = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen)
    assert no_ts.prompt.prefix() == [1, 10, 11, 199]


WHISPER_TABLES = {
    "lang_to_id": {"<|en|>": 10, "<|fr|>": 12, "<|de|>": 14, "<|ja|>": 40},
    "task_to_id": {"transcribe": 11, "translate": 13},
    # the last id: no id stands for a timestamp (transformers' Whisper generate would seek
    # on any id above it); the timestamp test moves it down
    "no_timestamps_token_id": 255,
    "is_multilingual": True,
}


def _whisper_config(**extra: Any) -> dict[str, Any]:
    """The checkpoint's config with Whisper's tables, the language left open."""
    base = {**seq2seq_programs.generation_config(), **WHISPER_TABLES}
    return {**base, "forced_decoder_ids": [[1, None], [2, 11]], **extra}


def _whisper_generate(model: Any, x: torch.Tensor, gen: dict[str, Any], n: int,
                      **options: Any) -> list[int]:  # fmt: skip
    """transformers' Whisper ``generate`` (prompt rules, language detection, suppression)."""
    config = transformers.GenerationConfig(**gen)
    with torch.no_grad():
        out = model.generate(
            input_features=x, generation_config=config, max_new_tokens=n, do_sample=False,
            **options,
        )  # fmt: skip
    return [int(t) for t in out[0]]


def test_forced_decoder_ids_are_not_given_with_a_language(
    folders: dict[str, Path], eager: Any
) -> None:
    """transformers takes an asked language (or task) over ``forced_decoder_ids``; ptexec's
    ``forced_decoder_ids`` argument is the decoder's whole prompt, so asking for a language,
    a task or timestamps beside it is refused, not dropped (the tokens were the forced
    ones, not the language's)."""
    folder = folders["whisper_portable"]
    gen = _whisper_config()
    x = _features(2)
    french = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen, language="fr")
    assert french.prompt.prefix() == [1, 12, 11, 255]  # the language's, not the forced ids'
    assert french.generate(x, GREEDY) == _whisper_generate(eager, x, gen, 12, language="fr")
    for asked in ({"language": "fr"}, {"task": "translate"}, {"timestamps": True}):
        with pytest.raises(GenerationError, match="forced_decoder_ids are the decoder's whole"):
            Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen,
                          forced_decoder_ids={1: 10, 2: 11}, **asked)  # fmt: skip


def test_a_language_may_be_named(folders: dict[str, Path], eager: Any) -> None:
    """A language given by its name, in any case, or by another name transformers' Whisper
    knows for it (``"French"``, ``"castilian"`` for Spanish) is the language of that code,
    as transformers takes it (it was refused)."""
    folder = folders["whisper_portable"]
    gen = _whisper_config(lang_to_id={"<|en|>": 10, "<|fr|>": 12, "<|es|>": 14})
    x = _features(2)
    for name, code, token in (("French", "fr", 12), ("castilian", "es", 14), ("ES", "es", 14)):
        runner = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen, language=name)
        assert runner.prompt.prefix()[:2] == [1, token], name
        want = _whisper_generate(eager, x, gen, 12, language=name)
        assert want == _whisper_generate(eager, x, gen, 12, language=code)
        assert runner.generate(x, GREEDY) == want, name
    with pytest.raises(GenerationError, match="not one of the model's"):
        Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen, language="klingon")


def test_language_is_detected_as_transformers_detects(folders: dict[str, Path], eager: Any) -> None:
    folder = folders["whisper_portable"]
    detected = set()
    for table in ({"<|en|>": 10, "<|fr|>": 12, "<|de|>": 14}, {"<|en|>": 10, "<|ja|>": 40}):
        gen = _whisper_config(lang_to_id=table)
        runner = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen)
        assert runner.prompt.detect == tuple(sorted(table.values()))
        for seed in range(3):
            x = _features(seed)
            got = runner.generate(x, GenerationConfig(temperature=0.0, max_new_tokens=10))
            with torch.no_grad():
                config = transformers.GenerationConfig(**gen)
                want_lang = int(eager.detect_language(input_features=x, generation_config=config))
            assert runner.language_id == want_lang, (table, seed)
            detected.add(want_lang)
            assert got == _whisper_generate(eager, x, gen, 10), (table, seed)
    assert len(detected) > 1  # the detection depends on the table and the audio


def test_a_forced_eos_follows_a_detected_language(folders: dict[str, Path], eager: Any) -> None:
    """A forced EOS at the budget's last step, with the language detected from the audio:
    the prompt's length is known before its language is (one token for it), as
    transformers counts it."""
    folder = folders["whisper_portable"]
    table = {"<|en|>": 10, "<|fr|>": 12, "<|de|>": 14}
    plain = _whisper_config(lang_to_id=table)
    x = _features(0)
    greedy = _whisper_generate(eager, x, plain, 8)
    eos = 3 if greedy[-1] != 3 else 4  # (not the token greedy decoding ends with)
    gen = _whisper_config(lang_to_id=table, forced_eos_token_id=eos)
    runner = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen)
    assert runner.prompt.detect
    got = runner.generate(x, GenerationConfig(temperature=0.0, max_new_tokens=8))
    want = _whisper_generate(eager, x, gen, 8)
    assert got == want
    assert want[-1] == eos and want != greedy  # (the forced token ends it early)


def test_scores_are_whispers(folders: dict[str, Path], eager: Any) -> None:
    """A scored generation's average log-probability and no-speech probability, as
    Whisper computes them: the sampled tokens' log-probabilities under the processed
    logits (EOS's counted), over the tokens before EOS plus one; the no-speech token's
    (the id before ``<|notimestamps|>``) probability at the start token's step."""
    folder = folders["whisper_portable"]
    gen = {**seq2seq_programs.generation_config(), "no_timestamps_token_id": 199}
    runner = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen)
    assert runner.no_speech_id == 198
    prefix = runner.prompt.prefix()
    for seed, n in ((0, 12), (1, 40)):
        x = _features(seed)
        got = runner.generate(x, GenerationConfig(temperature=0.0, max_new_tokens=n), score=True)
        with torch.no_grad():
            out = transformers.GenerationMixin.generate(
                eager, input_features=x, decoder_input_ids=torch.tensor([prefix]),
                max_new_tokens=n, do_sample=False, output_scores=True,
                return_dict_in_generate=True,
            )  # fmt: skip
            start = eager(input_features=x, decoder_input_ids=torch.tensor([[prefix[0]]])).logits
        ids = [int(t) for t in out.sequences[0, len(prefix) :]]
        assert got == ids
        logprobs = [
            float(torch.log_softmax(step[0].float(), dim=-1)[t])
            for step, t in zip(out.scores, ids, strict=True)
        ]
        before_eos = len(ids) - int(ids[-1] in runner.eos_ids)
        avg, no_speech = runner.scores
        assert avg == pytest.approx(sum(logprobs) / (before_eos + 1), abs=1e-4)
        want = float(torch.softmax(start[0, 0].float(), dim=-1)[198])
        assert no_speech == pytest.approx(want, rel=1e-4, abs=1e-7)


def test_suppress_tokens_of_the_generation_config(folders: dict[str, Path], eager: Any) -> None:
    folder = folders["whisper_portable"]
    x = _features(2)
    plain = Seq2SeqRunner(folder / "model.pte", folder, generation_config=_whisper_config(),
                          language="en")  # fmt: skip
    free = plain.generate(x, GREEDY)
    # suppress what the model would say first, and its next two distinct tokens everywhere
    later = [t for t in dict.fromkeys(free[1:]) if t != free[0]][:2]
    gen = _whisper_config(begin_suppress_tokens=[free[0]], suppress_tokens=later)
    runner = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen, language="en")
    got = runner.generate(x, GREEDY)
    assert got[0] != free[0] and not set(later) & set(got)
    assert got == _whisper_generate(eager, x, gen, GREEDY.max_new_tokens, language="en")
    runner.rules = ()  # settable: off
    assert runner.generate(x, GREEDY) == free


def _well_formed(ids: list[int], begin: int, max_initial: int) -> None:
    stamps = [t for t in ids if t >= begin]
    assert ids[0] >= begin and ids[0] - begin <= max_initial
    assert stamps == sorted(stamps)
    run = 0
    for t in ids:  # never three timestamps in a row
        run = run + 1 if t >= begin else 0
        assert run <= 2


def test_timestamp_rules_in_generation(folders: dict[str, Path], eager: Any) -> None:
    from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

    folder = folders["whisper_portable"]
    gen = _whisper_config(max_initial_timestamp_index=5, no_timestamps_token_id=200)
    runner = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen, language="fr",
                           timestamps=True)  # fmt: skip
    prefix = runner.prompt.prefix()
    assert prefix == [1, 12, 11]
    config = GenerationConfig(temperature=0.0, max_new_tokens=20)
    for seed in range(4):
        x = _features(seed)
        got = runner.generate(x, config)
        rules = WhisperTimeStampLogitsProcessor(
            transformers.GenerationConfig(**gen), begin_index=len(prefix)
        )
        want = _eager_greedy(eager, x, prefix, 20, logits_processor=[rules])
        assert got == want, seed
        _well_formed(got, 201, 5)


def test_transcribe_keeps_the_first_windows_language(
    tmp_path: Path, folders: dict[str, Path], eager: Any
) -> None:
    folder = folders["whisper_portable"]
    gen = _whisper_config()
    runner = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen)
    wav = tmp_path / "speech.wav"
    _write_wav(wav, 40.0, 16000)
    features = ProcessorFeatures(folder)
    assert features.window_samples == 30 * 16000
    config = GenerationConfig(temperature=0.0, max_new_tokens=6)
    result = runner.transcribe(wav, features, config)
    samples, _ = load_audio(wav, 16000)
    (_, first), (_, second) = windows(samples, 16000)
    with torch.no_grad():
        lang = int(eager.detect_language(input_features=features(first),
                                         generation_config=transformers.GenerationConfig(**gen)))  # fmt: skip
    assert result.language == runner.languages[lang]
    prefix = runner.prompt.detected(lang).prefix()
    assert result.tokens == [_eager_greedy(eager, features(w), prefix, 6) for w in (first, second)]
    assert result.finish_reasons == [
        "stop" if ids[-1] in runner.eos_ids else "length" for ids in result.tokens
    ]
    # a window longer than the extractor's 30 s would lose its end: refused
    with pytest.raises(GenerationError, match="longer than the feature extractor"):
        runner.transcribe(wav, features, config, window_seconds=40.0)


def test_preprocessor_program_features(folders: dict[str, Path]) -> None:
    program = ProgramFeatures(folders["preprocessor"] / "model.pte")
    assert program.sampling_rate == 16000 and program.max_samples == 60 * 16000
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folders["whisper_portable"])
    g = torch.Generator().manual_seed(0)
    for seconds in (3.0, 30.0):
        x = 0.2 * torch.randn(int(seconds * 16000), generator=g)
        got = program(x)
        want = extractor(x.numpy(), sampling_rate=16000, return_tensors="pt").input_features
        assert got.shape == want.shape == (1, 80, 3000)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_cli_transcribe(tmp_path: Path, folders: dict[str, Path],
                        runners: dict[str, Seq2SeqRunner]) -> None:  # fmt: skip
    from ptexec.cli import main

    folder = folders["whisper_portable"]
    wav = tmp_path / "a.wav"
    _write_wav(wav, 5.0, 16000)
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["transcribe", str(wav), "--model", str(folder / "model.pte"),
                     "--preprocessor", str(folders["preprocessor"] / "model.pte"),
                     "--max-new-tokens", "6", "--json"])  # fmt: skip
    assert code == 0
    got = json.loads(out.getvalue())
    samples, _ = load_audio(wav, 16000)
    want = runners["whisper_portable"].generate(
        ProgramFeatures(folders["preprocessor"] / "model.pte")(samples),
        GenerationConfig(temperature=0.0, max_new_tokens=6),
    )
    assert got["tokens"] == [want]
    assert got["text"] == runners["whisper_portable"].decode(want).strip()
    assert got["finish_reasons"] == ["length"] and got["language"] is None


def test_refusals(folders: dict[str, Path], runners: dict[str, Seq2SeqRunner]) -> None:
    with pytest.raises(GenerationError, match="encoder"):
        Seq2SeqRunner(folders["preprocessor"] / "model.pte", decoder_start_token_id=1)
    runner = runners["whisper_portable"]
    with pytest.raises(GenerationError, match="exactly"):
        runner.generate(torch.zeros(1, 80, 100), GREEDY)
    with pytest.raises(GenerationError, match="features"):
        runner.generate_text("hello", GREEDY)
    with pytest.raises(Exception, match="stop"):
        runner.generate(_features(0), GenerationConfig(temperature=0.0, stop="x"))


@pytest.mark.cuda
def test_cuda_tokens_equal_the_eager_model(folders: dict[str, Path], eager: Any) -> None:
    folder = folders["whisper_portable"]
    runner = Seq2SeqRunner(folder / "model.pte", folder, device_map="cuda")
    x = _features(0)
    got = runner.generate(x, GREEDY)
    assert got == _eager_greedy(eager, x, runner.prompt.prefix(), GREEDY.max_new_tokens)
    program = ProgramFeatures(folders["preprocessor"] / "model.pte", device_map="cuda")
    samples = 0.2 * torch.randn(16000 * 2, generator=torch.Generator().manual_seed(0))
    features = program(samples)
    assert features.is_cuda
    torch.testing.assert_close(
        features.cpu(), ProgramFeatures(folders["preprocessor"] / "model.pte")(samples)
    )


def test_timestamps_past_the_tokenizers_ids_are_sampled(
    tmp_path: Path, folders: dict[str, Path], eager: Any
) -> None:
    """A Whisper tokenizer saved without its timestamp tokens (they are ids past its
    vocabulary, decoded by arithmetic) does not narrow the logits: timestamps from
    there on are sampled as transformers samples them."""
    from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

    folder = folders["whisper_portable"]
    keep = 230  # the tokenizer's ids: timestamps 200..229 in it, 230..255 past it
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = {k: v for k, v in tok["model"]["vocab"].items() if v < keep}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = [
        m for m in merges if all(p in vocab for p in m.split(" ")) and m.replace(" ", "") in vocab
    ]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    gen = {**seq2seq_programs.generation_config(), "no_timestamps_token_id": 199}
    runner = Seq2SeqRunner(folder / "model.pte", tmp_path / "tokenizer.json",
                           generation_config=gen, timestamps=True)  # fmt: skip
    assert runner.tokenizer is not None and runner.tokenizer.vocab_size == keep
    prefix = runner.prompt.prefix()
    config = GenerationConfig(temperature=0.0, max_new_tokens=20)
    past = False
    for seed in range(2):
        x = _features(seed)
        got = runner.generate(x, config)
        rules = WhisperTimeStampLogitsProcessor(
            transformers.GenerationConfig(**gen), begin_index=len(prefix)
        )
        assert got == _eager_greedy(eager, x, prefix, 20, logits_processor=[rules]), seed
        past |= any(t >= keep for t in got)
    assert past  # (timestamps past the tokenizer's ids were chosen)


def _t5(folders: dict[str, Path], variant: str = "t5_portable",
        **options: Any) -> tuple[Seq2SeqRunner, Any]:  # fmt: skip
    folder = folders[variant]
    runner = Seq2SeqRunner(folder / "model.pte", folder, **options)
    model = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    return runner, model


def _cli_generate(folder: Path, prompt: str, new: int, *extra: str) -> tuple[int, str]:
    """``ptexec generate`` of the program and tokenizer in ``folder``, greedy, ``new``
    tokens: its exit code and what it printed."""
    from ptexec.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["generate", str(folder / "model.pte"), "--tokenizer",
                     str(folder / "tokenizer.json"), "--prompt", prompt, "--temperature", "0",
                     "--max-new-tokens", str(new), *extra])  # fmt: skip
    return code, out.getvalue()


def _t5_eager(model: Any, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            decoder_input_ids=torch.tensor([[0]]),
            max_new_tokens=n,
            do_sample=False,
        )
    return [int(t) for t in out[0, 1:]]


@pytest.mark.parametrize(
    ("variant", "xnnpack"),
    [("t5_portable", "auto"), ("t5_xnnpack", "auto"), ("t5_xnnpack", "torch")],
)
def test_t5_greedy_tokens_equal_the_eager_model(
    folders: dict[str, Path], variant: str, xnnpack: str
) -> None:
    runner, model = _t5(folders, variant, xnnpack=xnnpack)
    assert runner.takes_tokens and runner.prompt == DecoderPrompt(0)
    length = seq2seq_programs.MAX_SEQ_LEN  # the encoder's fixed length (see the script)
    outs = []
    for seed in (0, 1):
        ids = torch.randint(3, 256, (length,), generator=torch.Generator().manual_seed(seed))
        got = runner.generate(ids.tolist(), GREEDY)
        assert got == _t5_eager(model, ids.tolist(), GREEDY.max_new_tokens), seed
        outs.append(got)
    assert outs[0] != outs[1]
    with pytest.raises(GenerationError, match="exactly"):
        runner.generate([5, 6, 7], GREEDY)
    with pytest.raises(GenerationError, match="vocabulary"):
        runner.generate([300] * length, GREEDY)
    # optimum-executorch's own loop on ExecuTorch's runtime (it echoes the start token)
    optimum = pytest.importorskip("optimum.executorch")
    et = optimum.ExecuTorchModelForSeq2SeqLM.from_pretrained(str(folders[variant]))
    ids = torch.randint(3, 256, (1, length), generator=torch.Generator().manual_seed(0))
    theirs = [int(t) for t in et.generate(ids, max_seq_len=10)]
    assert theirs[0] == 0
    assert outs[0][: len(theirs) - 1] == theirs[1:]


def test_generate_cli_text_to_text(folders: dict[str, Path]) -> None:
    from ptexec.cli import main

    runner, model = _t5(folders)
    assert runner.tokenizer is not None
    # a prompt of exactly the encoder's length with the EOS token after it
    words = seq2seq_programs.llm_programs.CORPUS
    want_len = seq2seq_programs.MAX_SEQ_LEN - 1
    prompt = next(
        (words[:n] for n in range(40, 400) if len(runner.tokenizer.encode(words[:n])) == want_len),
        None,
    )
    assert prompt is not None
    config = GenerationConfig(temperature=0.0, max_new_tokens=8, num_eos=1)
    text = runner.generate_text(prompt, config)
    ids = runner.tokenizer.encode(prompt, 0, 1)
    assert runner.generated_tokens == _t5_eager(model, ids, 8)
    assert text == runner.decode(runner.generated_tokens)
    folder = folders["t5_portable"]
    assert _cli_generate(folder, prompt, 8) == (0, text + "\n")
    # a chat conversation is a decoder-only LLM's: refused, not ignored
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["generate", str(folder / "model.pte"), "--tokenizer",
                     str(folder / "tokenizer.json"), "--prompt", prompt, "--chat"])  # fmt: skip
    assert code == 1 and "encoder-decoder" in err.getvalue()
    # an image for an encoder-decoder program: said so, not a missing 'forward'
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["generate", str(folder / "model.pte"), "--tokenizer",
                     str(folder / "tokenizer.json"), "--prompt", prompt, "--image",
                     str(folder / "tokenizer.json")])  # fmt: skip
    assert code == 1 and "not --image or --audio" in err.getvalue(), err.getvalue()
    assert [m.name for m in runner.loaded] == ["encoder", "text_decoder"]


# short enough to close within the tiny decoder's 48 positions
SCHEMA = {
    "type": "object",
    "properties": {
        "pet": {"enum": ["cat", "dog", "none"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["pet", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("variant", ["t5_portable", "whisper_xnnpack"])
def test_json_schema_generations_validate_on_seeded_samples(
    folders: dict[str, Path], variant: str
) -> None:
    # random weights make any token plausible: only the grammar's mask keeps the text valid
    jsonschema = pytest.importorskip("jsonschema")
    from ptexec.llm.constrained import Grammar, Vocabulary

    folder = folders[variant]
    runner = Seq2SeqRunner(folder / "model.pte", folder)
    assert runner.tokenizer is not None
    vocab = Vocabulary.of(runner.tokenizer, runner.vocab_size, runner.eos_ids)
    grammar = Grammar.json_schema(vocab, SCHEMA)
    x: Any = (
        list(range(3, 3 + seq2seq_programs.MAX_SEQ_LEN)) if runner.takes_tokens else _features(0)
    )
    # 50 seeds on T5 (the runner's check); 10 on Whisper (the same loop after an audio
    # encoder, whose 50 encodes would add a minute on two cores)
    seeds = 50 if runner.takes_tokens else 10
    outputs = set()
    for seed in range(seeds):
        config = GenerationConfig(
            temperature=1.0, top_p=1.0, seed=seed, max_new_tokens=40, logits_processor=grammar
        )
        ids = runner.generate(x, config)
        text = runner.decode(ids)
        assert runner.finish_reason == "stop", (seed, text)
        assert ids[-1] in runner.eos_ids
        jsonschema.validate(json.loads(text), SCHEMA)
        outputs.add(text)
    assert len(outputs) > seeds // 2  # sampled, not one answer
    regex = Grammar.regex(vocab, r"(cat|dog) [0-9]{1,2}")
    for seed in range(5):
        config = GenerationConfig(temperature=1.0, seed=seed, logits_processor=regex)
        text = runner.decode(runner.generate(x, config))
        assert re.fullmatch(r"(cat|dog) [0-9]{1,2}", text), text


def test_min_p_equals_transformers_warpers(runners: dict[str, Seq2SeqRunner]) -> None:
    """min_p samples what transformers' temperature and min-p warpers (run as processors)
    leave, with the same seed."""
    tp = pytest.importorskip("transformers.generation.logits_process")
    runner = runners["whisper_portable"]
    x = _features(5)
    warpers = [tp.TemperatureLogitsWarper(0.8), tp.MinPLogitsWarper(0.2)]
    for seed in range(3):
        ours = runner.generate(
            x, GenerationConfig(temperature=0.8, top_p=1.0, min_p=0.2, seed=seed, ignore_eos=True)
        )
        theirs = runner.generate(
            x,
            GenerationConfig(
                temperature=1.0, top_p=1.0, seed=seed, ignore_eos=True, logits_processor=warpers
            ),
        )
        assert ours == theirs, seed


def test_cuda_without_a_gpu_is_refused_at_load(folders: dict[str, Path]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    from ptexec.errors import DeviceUnavailableError

    folder = folders["t5_portable"]
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        Seq2SeqRunner(folder / "model.pte", folder, device_map="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["t5_portable", "t5_xnnpack"])
def test_cuda_t5_tokens_equal_the_eager_model(folders: dict[str, Path], variant: str) -> None:
    """On CUDA the XNNPACK payloads run with ptexec's runner (ExecuTorch's backend is
    CPU-only: asking for it is refused at load); logits stay on the GPU."""
    from ptexec.errors import BackendUnavailableError

    runner, model = _t5(folders, variant, device_map="cuda")
    ids = torch.randint(3, 256, (seq2seq_programs.MAX_SEQ_LEN,),
                        generator=torch.Generator().manual_seed(0)).tolist()  # fmt: skip
    assert runner.generate(ids, GREEDY) == _t5_eager(model, ids, GREEDY.max_new_tokens)
    assert runner.encode(ids).is_cuda
    if variant == "t5_xnnpack":
        with pytest.raises(BackendUnavailableError, match="CPU"):
            _t5(folders, variant, device_map="cuda", xnnpack="executorch")


@pytest.mark.cuda
def test_cuda_constrained_generations_validate(folders: dict[str, Path]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from ptexec.llm.constrained import Grammar, Vocabulary

    runner, _ = _t5(folders, device_map="cuda")
    assert runner.tokenizer is not None
    grammar = Grammar.json_schema(
        Vocabulary.of(runner.tokenizer, runner.vocab_size, runner.eos_ids), SCHEMA
    )
    x = list(range(3, 3 + seq2seq_programs.MAX_SEQ_LEN))
    for seed in range(10):
        config = GenerationConfig(
            temperature=1.0, seed=seed, max_new_tokens=40, logits_processor=grammar
        )
        text = runner.decode(runner.generate(x, config))
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("choice", ["torch", "executorch"])
def test_generate_cli_xnnpack_choice(folders: dict[str, Path], choice: str) -> None:

    runner, _ = _t5(folders, "t5_xnnpack")
    assert runner.tokenizer is not None
    prompt = seq2seq_programs.llm_programs.CORPUS
    ids = runner.tokenizer.encode(prompt, 0, 1)[: seq2seq_programs.MAX_SEQ_LEN - 1]
    prompt = runner.tokenizer.decode(ids)
    assert len(runner.tokenizer.encode(prompt, 0, 1)) == seq2seq_programs.MAX_SEQ_LEN
    want = runner.generate_text(
        prompt, GenerationConfig(temperature=0.0, max_new_tokens=6, num_eos=1)
    )
    folder = folders["t5_xnnpack"]
    assert _cli_generate(folder, prompt, 6, "--xnnpack", choice) == (0, want + "\n")


def test_a_generation_config_named_but_missing_is_refused(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """A generation config the caller names must exist (a mistyped path ran Whisper without
    its forced and suppressed tokens); one only looked for beside the program may not."""
    from ptexec.errors import FileMissingError

    folder = folders["whisper_portable"]
    for named in (folder / "generation_config.jsn", tmp_path):  # a typo; a folder without one
        with pytest.raises(FileMissingError, match="generation config"):
            Seq2SeqRunner(folder / "model.pte", folder, generation_config=named)
    alone = tmp_path / "model.pte"
    alone.write_bytes((folder / "model.pte").read_bytes())
    with pytest.warns(RuntimeWarning, match="without its generation config"):
        runner = Seq2SeqRunner(alone, folder)  # nothing beside it: the start token alone
    assert runner.generation_config == {} and runner.prompt.forced == ()
    named = Seq2SeqRunner(alone, folder, generation_config=folder)
    assert named.prompt == DecoderPrompt(1, (10, 11))


def test_a_streamed_transcription_is_its_text(tmp_path: Path, folders: dict[str, Path]) -> None:
    """What ``transcribe`` streams is the transcription's text: timestamp tokens give no
    text (they streamed as their vocabulary pieces), and windows are joined with one space
    (they ran together)."""
    folder = folders["whisper_portable"]
    gen = _whisper_config(no_timestamps_token_id=200)  # ids from 201 on are timestamps
    runner = Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen,
                           language="en", timestamps=True)  # fmt: skip
    wav = tmp_path / "speech.wav"
    _write_wav(wav, 40.0, 16000)
    pieces: list[str] = []
    result = runner.transcribe(wav, ProcessorFeatures(folder), GREEDY, pieces.append)
    assert len(result.tokens) == 2
    assert any(t >= runner.timestamp_begin for ids in result.tokens for t in ids)
    assert "".join(pieces) == result.text and " " in result.text


def test_timestamps_need_a_config_that_names_them(folders: dict[str, Path]) -> None:
    folder = folders["whisper_portable"]
    with pytest.raises(GenerationError, match="no_timestamps_token_id"):
        Seq2SeqRunner(folder / "model.pte", folder, generation_config={"decoder_start_token_id": 1},
                      timestamps=True)  # fmt: skip


def test_t5_generation_config_fields_change_tokens_as_in_transformers(
    folders: dict[str, Path],
) -> None:
    """A generation config's fields that change transformers' ``generate`` change ptexec's
    tokens the same way: they were dropped without a word (the tokens of the config without
    them). The repetition penalty, n-gram and bad-word bans, minimum lengths (with EOS as a
    list), forced first and last tokens, and ``max_length`` for a generation that sets no
    bound of its own; what ptexec does not do (beam search) is said once, as a warning."""
    folder = folders["t5_portable"]
    model = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    ids = torch.randint(3, 256, (seq2seq_programs.MAX_SEQ_LEN,),
                        generator=torch.Generator().manual_seed(0)).tolist()  # fmt: skip
    base = {"decoder_start_token_id": 0, "eos_token_id": 2, "pad_token_id": 0}

    def eager(gen: dict[str, Any], **kw: Any) -> list[int]:
        model.generation_config = transformers.GenerationConfig(**gen)  # as the file's
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([ids]), do_sample=False, **kw)
        return [int(t) for t in out[0, 1:]]

    def ours(gen: dict[str, Any], config: GenerationConfig = GREEDY) -> list[int]:
        return Seq2SeqRunner(folder / "model.pte", folder, generation_config=gen).generate(
            ids, config
        )

    plain = eager(base, max_new_tokens=12)
    assert ours(base) == plain
    x = plain[1]
    for extra in (
        {"repetition_penalty": 2.0},
        {"no_repeat_ngram_size": 1},
        {"no_repeat_ngram_size": 2, "repetition_penalty": 1.3},
        {"bad_words_ids": [[x]]},
        {"bad_words_ids": [[plain[0], x], [2]]},
        {"eos_token_id": [2, x], "min_new_tokens": 5},
        {"eos_token_id": [2, x], "min_length": 6},
        {"forced_bos_token_id": 7},
        {"forced_eos_token_id": 2},
        {"forced_eos_token_id": [5, 2]},  # any of the listed ids: greedy takes 2
        {"eos_token_id": [2, x], "min_new_tokens": 2, "min_length": 10},  # new wins
    ):
        gen = {**base, **extra}
        want = eager(gen, max_new_tokens=12)
        assert want != plain, extra  # (the field changes transformers' tokens)
        assert ours(gen) == want, extra
    # tokens suppressed at the beginning, after a forced first token: transformers begins
    # one step later (the forced token's step is not the first it suppresses at)
    forced = eager({**base, "forced_bos_token_id": 7}, max_new_tokens=12)
    gen = {**base, "forced_bos_token_id": 7, "begin_suppress_tokens": [forced[1]]}
    want = eager(gen, max_new_tokens=12)
    assert want[0] == 7 and want[1] != forced[1]
    assert ours(gen) == want
    # a bad word longer than the decoder's context is not looked for yet (transformers)
    for extra in ({"bad_words_ids": [[0, plain[0]]]}, {"bad_words_ids": [[0, plain[0], x]]}):
        gen = {**base, **extra}
        short = GenerationConfig(temperature=0.0, max_new_tokens=4)
        assert ours(gen, short) == eager(gen, max_new_tokens=4), extra
    for length in (6, 20, 25):  # 20, transformers' default, counts new tokens
        gen = {**base, "max_length": length}
        assert ours(gen, GenerationConfig(temperature=0.0)) == eager(gen), length
    assert len(eager({**base, "max_length": 6})) == 5
    with pytest.raises(GenerationError, match="max_length 1 leaves no token"):
        ours({**base, "max_length": 1}, GenerationConfig(temperature=0.0))
    with pytest.warns(RuntimeWarning, match="num_beams=3"):
        ours({**base, "num_beams": 3})
    # no decoder_start_token_id: the config's BOS starts the decoder, as in transformers
    gen = {"bos_token_id": 5, "eos_token_id": 2, "pad_token_id": 0}
    assert ours(gen) == eager(gen, max_new_tokens=12) != plain


def test_seq_len_counts_the_decoder_tokens_as_transformers_max_length(
    folders: dict[str, Path],
) -> None:
    """``seq_len`` bounds the decoder's tokens, its prompt and every generated one, as
    transformers' ``max_length`` does (it let one token more through); the cache's bound
    still lets the last sampled token, never fed, past its positions."""
    runner, model = _t5(folders)
    ids = torch.randint(3, 256, (seq2seq_programs.MAX_SEQ_LEN,),
                        generator=torch.Generator().manual_seed(0)).tolist()  # fmt: skip

    def eager(**kw: Any) -> list[int]:
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([ids]), do_sample=False,
                                 eos_token_id=None, **kw)  # fmt: skip
        return [int(t) for t in out[0, 1:]]

    for length in (2, 5, 10):
        config = GenerationConfig(temperature=0.0, seq_len=length, ignore_eos=True)
        want = eager(max_length=length)
        assert len(want) == length - 1
        assert runner.generate(ids, config) == want, length
    with pytest.raises(GenerationError, match="seq_len 1"):
        runner.generate(ids, GenerationConfig(temperature=0.0, seq_len=1))
    # the cache of 48 positions: 48 tokens after the start token, the last never fed
    config = GenerationConfig(temperature=0.0, seq_len=100, ignore_eos=True)
    got = runner.generate(ids, config)
    assert got == eager(max_new_tokens=seq2seq_programs.MAX_SEQ_LEN)
    assert runner.finish_reason == "length"


def test_token_ids_that_are_not_integers_are_refused_as_transformers_refuses(
    folders: dict[str, Path],
) -> None:
    """A text encoder's ids are integers: a float tensor was cast (3.7 ran as token 3)
    where transformers' embedding refuses it; the next good call runs as usual."""
    runner, model = _t5(folders)
    ids = torch.randint(3, 256, (seq2seq_programs.MAX_SEQ_LEN,),
                        generator=torch.Generator().manual_seed(1)).tolist()  # fmt: skip
    shifted = torch.tensor([ids], dtype=torch.float32) + 0.7
    with pytest.raises(RuntimeError, match="Long, Int"), torch.no_grad():
        model.generate(input_ids=shifted, max_new_tokens=4, do_sample=False)
    for wrong in (shifted, [float(i) for i in ids], torch.ones(1, len(ids), dtype=torch.bool)):
        with pytest.raises(GenerationError, match="token ids"):
            runner.generate(wrong, GREEDY)  # type: ignore[arg-type]
    assert runner.generate(torch.tensor(ids), GREEDY) == _t5_eager(model, ids, 12)


def test_decoder_prompt_ids_that_are_not_integers_are_refused(folders: dict[str, Path]) -> None:
    """A decoder prompt's ids are integers: ``DecoderPrompt(0.7)`` ran as start token 0
    (``fill_`` cast it) where transformers' embedding refuses float decoder ids. Refused
    with GenerationError when the prompt is made; the runner's generation is eager's."""
    runner, model = _t5(folders)
    ids = torch.randint(3, 256, (seq2seq_programs.MAX_SEQ_LEN,),
                        generator=torch.Generator().manual_seed(2)).tolist()  # fmt: skip
    with pytest.raises(RuntimeError, match="Long, Int"), torch.no_grad():
        model.generate(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([[0.7]]),
                       max_new_tokens=4, do_sample=False)  # fmt: skip
    for start, forced, detect in ((0.7, (), ()), (0, (5.5,), ()), (0, (), (3.2,)), ("0", (), ())):
        with pytest.raises(GenerationError, match="token"):
            DecoderPrompt(start, forced, detect)  # type: ignore[arg-type]
    with pytest.raises(GenerationError, match="token"):
        DecoderPrompt.of(0, {1: 5.5})
    assert DecoderPrompt(0) == DecoderPrompt(False)  # a bool is 0 or 1, as ExecuTorch's ids
    got = runner.generate(torch.tensor(ids), GREEDY, prompt=DecoderPrompt(0))
    assert got == _t5_eager(model, ids, 12)


def test_generate_cli_without_a_generation_config(tmp_path: Path, folders: dict[str, Path]) -> None:
    """A text-to-text program without generation_config.json beside it generates from the
    program's own start and EOS ids, as the runner does (it was refused: the config looked
    for was taken as one named)."""
    import shutil

    runner, model = _t5(folders)
    assert runner.tokenizer is not None
    folder = folders["t5_portable"]
    for name in ("model.pte", "tokenizer.json"):
        shutil.copy(folder / name, tmp_path / name)
    words = seq2seq_programs.llm_programs.CORPUS
    prompt = next(
        words[:n]
        for n in range(40, 400)
        if len(runner.tokenizer.encode(words[:n])) == seq2seq_programs.MAX_SEQ_LEN - 1
    )
    want = runner.decode(_t5_eager(model, runner.tokenizer.encode(prompt, 0, 1), 8))
    assert _cli_generate(tmp_path, prompt, 8) == (0, want + "\n")
