"""``ptexec serve`` with a speech model: OpenAI's ``/v1/audio/transcriptions`` and
``/v1/audio/translations`` through the ``openai`` client, on the tiny random Whisper of
``scripts/seq2seq_programs.py`` (slow: exported once per machine). The reference is the
same runner's :meth:`~ptexec.llm.Seq2SeqRunner.transcribe` on the same audio with the
request's decoder prompt (itself checked against transformers in ``test_seq2seq.py``)."""

from __future__ import annotations

import io
import math
import os
import re
import subprocess
import sys
import wave
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.slow

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("transformers")
pytest.importorskip("optimum.exporters.executorch")
pytest.importorskip("starlette")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import seq2seq_programs  # noqa: E402

from ptexec.llm import GenerationConfig, Seq2SeqRunner  # noqa: E402
from ptexec.llm.audio import ProcessorFeatures, load_audio  # noqa: E402
from ptexec.serve import Server, SpeechService  # noqa: E402

MODEL = "whisper-tiny"
GEN = {
    **seq2seq_programs.generation_config(),
    "forced_decoder_ids": [[1, None], [2, 11]],
    "lang_to_id": {"<|en|>": 10, "<|fr|>": 12, "<|de|>": 14},
    "task_to_id": {"transcribe": 11, "translate": 13},
    "no_timestamps_token_id": 200,  # ids from 201 on are timestamps
    "max_initial_timestamp_index": 10,
}
SPAN = 30.0


def _wav(seconds: float) -> bytes:
    rate = 16000
    n = int(seconds * rate)
    t = torch.arange(n, dtype=torch.float64) / rate
    g = torch.Generator().manual_seed(0)
    x = 0.3 * torch.sin(2 * math.pi * (300 + 30 * t) * t) + 0.05 * torch.randn(
        n, generator=g, dtype=torch.float64
    )
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((x.clamp(-1, 1) * 32767).round().to(torch.int16).numpy().tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder() -> Path:
    return seq2seq_programs.program_dir("whisper_portable")


@pytest.fixture(scope="module")
def runner(folder: Path) -> Seq2SeqRunner:
    return Seq2SeqRunner(folder / "model.pte", folder, generation_config=GEN)


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path]:
    data = _wav(35.0)  # two windows
    path = tmp_path_factory.mktemp("audio") / "speech.wav"
    path.write_bytes(data)
    return data, path


@pytest.fixture(scope="module")
def server(folder: Path, runner: Seq2SeqRunner) -> Iterator[Any]:
    torch.set_num_threads(1)
    service = SpeechService(runner, ProcessorFeatures(folder), MODEL)
    s = Server(None, port=0, speech=service).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=120)


def _reference(runner: Seq2SeqRunner, folder: Path, path: Path, **prompt: Any) -> Any:
    return runner.transcribe(
        path,
        ProcessorFeatures(folder),
        GenerationConfig(temperature=0.0),
        prompt=runner.decoder_prompt(**prompt),
    )


def test_text_formats_equal_the_runners_transcription(
    client: Any, runner: Seq2SeqRunner, folder: Path, audio: tuple[bytes, Path]
) -> None:
    data, path = audio
    want = _reference(runner, folder, path)
    assert want.text and len(want.tokens) == 2
    got = client.audio.transcriptions.create(model=MODEL, file=("speech.wav", data))
    assert got.text == want.text
    text = client.audio.transcriptions.create(
        model=MODEL, file=("speech.wav", data), response_format="text"
    )
    assert text == want.text + "\n"
    french = _reference(runner, folder, path, language="fr")
    got_fr = client.audio.transcriptions.create(
        model=MODEL, file=("speech.wav", data), language="fr"
    )
    assert got_fr.text == french.text and french.language == "fr"
    translated = _reference(runner, folder, path, task="translate")
    got_tr = client.audio.translations.create(model=MODEL, file=("speech.wav", data))
    assert got_tr.text == translated.text


def test_verbose_json_and_subtitles_carry_the_models_segments(
    client: Any, runner: Seq2SeqRunner, folder: Path, audio: tuple[bytes, Path]
) -> None:
    data, path = audio
    want = _reference(runner, folder, path, timestamps=True)
    assert want.segments  # the rules make the model time its text
    got = client.audio.transcriptions.create(
        model=MODEL,
        file=("speech.wav", data),
        response_format="verbose_json",
        timestamp_granularities=["segment"],
    )
    assert got.text == want.text and want.language and got.language == {"en": "english",
        "fr": "french", "de": "german"}[want.language]  # fmt: skip
    samples, _ = load_audio(path, 16000)
    assert got.duration == pytest.approx(samples.numel() / 16000, abs=1e-3)
    spans = [(s.start, s.end, s.text) for s in got.segments]
    assert spans == [(round(s.start, 3), round(s.end, 3), s.text) for s in want.segments]
    # OpenAI's schema, every field present and typed
    openai.types.audio.TranscriptionVerbose.model_validate(got.model_dump())
    begin = GEN["no_timestamps_token_id"] + 1
    for seg, mine in zip(got.segments, want.segments, strict=True):
        # a segment is text between its timestamps: never the EOS after the last one
        assert seg.tokens[0] >= begin and any(t < begin for t in seg.tokens)
        assert not set(seg.tokens) & runner.eos_ids
        window = want.windows[mine.window]
        assert seg.seek == round(window.start * 100)
        assert (seg.avg_logprob, seg.no_speech_prob) == (window.avg_logprob,
                                                         window.no_speech_prob)  # fmt: skip
        words = runner.decode([t for t in want.tokens[mine.window] if t < begin]).encode()
        assert seg.compression_ratio == pytest.approx(len(words) / len(zlib.compress(words)))
    assert {s.seek for s in got.segments} <= {0, 3000} and len(want.windows) == 2
    translated = client.audio.translations.create(
        model=MODEL, file=("speech.wav", data), response_format="verbose_json"
    )
    assert translated.language == "english"
    for fmt, sep in (("srt", ","), ("vtt", ".")):
        body = client.audio.transcriptions.create(
            model=MODEL, file=("speech.wav", data), response_format=fmt
        )
        times = re.findall(
            r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)", body
        )
        assert len(times) == len(want.segments), fmt
        for t, seg in zip(times, want.segments, strict=True):
            h1, m1, s1, f1, h2, m2, s2, f2 = map(int, t)
            assert (h1 * 3600 + m1 * 60 + s1 + f1 / 1000) == pytest.approx(seg.start, abs=1e-3)
            assert (h2 * 3600 + m2 * 60 + s2 + f2 / 1000) == pytest.approx(seg.end, abs=1e-3)
        assert body.startswith("WEBVTT") == (fmt == "vtt") and sep in body


def test_refused_requests_say_which_field(
    client: Any, server: Any, audio: tuple[bytes, Path]
) -> None:
    data, _ = audio
    refused = [
        ({"prompt": "earlier text"}, "prompt"),
        ({"response_format": "xml"}, "response_format"),
        (
            {"timestamp_granularities": ["word"], "response_format": "verbose_json"},
            "timestamp_granularities[]",
        ),
        ({"temperature": 2.0}, "temperature"),
        ({"language": "xx"}, "language"),
    ]
    for extra, param in refused:
        with pytest.raises(openai.BadRequestError) as e:
            client.audio.transcriptions.create(model=MODEL, file=("a.wav", data), **extra)
        assert e.value.body["param"] == param, extra
    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="other", file=("a.wav", data))
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model=MODEL, file=("a.wav", b"not audio at all"))
    assert e.value.body["param"] == "file"
    assert "ptexec-audio" not in e.value.body["message"]  # (no path of the server's)
    # a file name's suffix is a kind, not a file name of the server's (a 500 before)
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model=MODEL, file=("a." + "x" * 300, b"not audio"))
    assert e.value.body["param"] == "file"
    assert client.audio.transcriptions.create(model=MODEL, file=("a." + "w" * 300, data)).text
    url = server.url + "/v1/audio/transcriptions"
    as_json = httpx.post(url, json={"model": MODEL}, timeout=30)
    assert as_json.status_code == 400 and "multipart" in as_json.json()["error"]["message"]
    unknown = httpx.post(url, data={"model": MODEL, "speed": "2"},
                         files={"file": ("a.wav", data)}, timeout=30)  # fmt: skip
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "speed"
    twice = httpx.post(url, data={"model": MODEL},
                       files=[("file", ("a.wav", data)), ("file", ("b.wav", data))],
                       timeout=30)  # fmt: skip
    assert twice.status_code == 400 and twice.json()["error"]["param"] == "file"
    # the server still answers a good request after the refusals
    assert client.audio.transcriptions.create(model=MODEL, file=("a.wav", data)).text
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_the_command_line_serves_a_speech_program(folder: Path, audio: tuple[bytes, Path],
                                                  runner: Seq2SeqRunner) -> None:  # fmt: skip
    data, path = audio
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ptexec",
            "serve",
            str(folder / "model.pte"),
            "--port",
            "0",
            "--model-name",
            MODEL,
            "--threads",
            "1",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:
            found = re.search(r"at (http://\S+/v1)", line)
            if found:
                url = found.group(1)
                break
        assert url is not None and "speech to text" in line
        client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=120)
        got = client.audio.transcriptions.create(model=MODEL, file=("speech.wav", data))
        # the folder's own generation config (no language table): its forced tokens
        plain = Seq2SeqRunner(folder / "model.pte", folder)
        want = plain.transcribe(path, ProcessorFeatures(folder), GenerationConfig(temperature=0))
        assert got.text == want.text
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_window_without_timestamps_is_a_segment_beside_timed_windows() -> None:
    """Whisper may time one window's text and not the next's: every window's text is
    in the segments (OpenAI's segments cover the transcription's text)."""
    from ptexec.llm.seq2seq import Segment, Transcription, WindowScores
    from ptexec.serve.speech import _Ask

    class Runner:
        def __init__(self) -> None:
            self.generation_config: dict[str, Any] = {}
            self.eos_ids = {0}
            self.timestamp_begin = 50

        def decode(self, ids: list[int]) -> str:
            return "".join(chr(ord("a") + i - 1) for i in ids)

    class Features:
        sampling_rate = 16000
        window_samples = 30 * 16000

    service = SpeechService(Runner(), Features(), MODEL)
    timed = Segment(0.0, 0.2, "ab", [50, 1, 2, 60], 0)
    result = Transcription(
        "ab cd",
        [[50, 1, 2, 60, 0], [3, 4, 0]],  # the second window: text without timestamps
        [timed],
        ["stop", "stop"],
        "en",
        [WindowScores(0.0, -0.1, 0.0, 1.0), WindowScores(30.0, -0.2, 0.0, 1.0)],
    )
    ask = _Ask(b"-", ".wav", None, 0.0, "verbose_json", "transcribe")
    body, _ = service._answer(ask, result, 45.0)
    got = [(s["start"], s["end"], s["text"], s["seek"]) for s in body["segments"]]
    assert got == [(0.0, 0.2, "ab", 0), (30.0, 45.0, "cd", 3000)]
    assert " ".join(s[2] for s in got) == body["text"]
    srt, _ = service._answer(_Ask(b"-", ".wav", None, 0.0, "srt", "transcribe"), result, 45.0)
    assert "00:00:30,000 --> 00:00:45,000\ncd" in srt


def test_a_sampling_rate_nothing_takes_is_refused(tmp_path: Path, capsys: Any) -> None:
    """--sampling-rate is a preprocessor program's rate: beside a processor directory
    whose extractor takes another rate, or while no speech model is served, it is
    refused rather than ignored."""
    import argparse

    from transformers import WhisperFeatureExtractor

    from ptexec.cli import main
    from ptexec.cli.transcribe import speech_model

    WhisperFeatureExtractor().save_pretrained(tmp_path)  # 16 kHz
    (tmp_path / "tokenizer.json").write_text("{}")
    args = argparse.Namespace(
        processor=str(tmp_path), preprocessor=None, device=None, xnnpack="auto",
        tokenizer=None, generation_config=None, data=None, compile=False, sampling_rate=8000,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"--sampling-rate 8000 .* takes 16000 Hz"):
        speech_model(str(tmp_path / "model.pte"), args)
    code = main(["serve", str(tmp_path / "model.pte"), "--tokenizer",
                 str(tmp_path / "tokenizer.json"), "--sampling-rate", "8000"])  # fmt: skip
    assert code == 2 and "--sampling-rate" in capsys.readouterr().err
