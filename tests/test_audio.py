"""Audio for speech models: the WAV reader (every format, against the standard library's
``wave`` writer and hand-written files), the resampler (against sines and scipy), windows,
Whisper timestamps and forced tokens from generation configs. No program is exported."""

from __future__ import annotations

import math
import struct
import wave
from pathlib import Path

import pytest
import torch

from ptexec.errors import AudioFormatError, FileMissingError, PtexecError
from ptexec.llm.audio import load_audio, read_wav, resample, to_mono, windows
from ptexec.llm.seq2seq import DecoderPrompt, _prompt_from, split_segments


def _signal(n: int, channels: int) -> torch.Tensor:
    t = torch.arange(n, dtype=torch.float64) / 8000
    rows = [0.8 * torch.sin(2 * math.pi * (300 + 200 * c) * t) for c in range(channels)]
    return torch.stack(rows)


def _write_std(path: Path, x: torch.Tensor, width: int, rate: int = 8000) -> torch.Tensor:
    """Write with the standard library's ``wave``; return the exact values written."""
    full = float(1 << (8 * width - 1))
    q = torch.clamp(torch.round(x * full), -full, full - 1).to(torch.int64)
    frames = q.t().reshape(-1).tolist()
    if width == 1:
        data = bytes(v + 128 for v in frames)
    else:
        data = b"".join(v.to_bytes(width, "little", signed=True) for v in frames)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(x.shape[0])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data)
    return (q.double() / full).float()


def _write_float(path: Path, x: torch.Tensor, bits: int, extensible: bool = False) -> None:
    channels = x.shape[0]
    width = bits // 8
    fmt = "<f" if bits == 32 else "<d"
    data = b"".join(struct.pack(fmt, float(v)) for v in x.t().reshape(-1).tolist())
    if extensible:
        guid = struct.pack("<H", 3) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        body = struct.pack("<HHIIHH", 0xFFFE, channels, 8000, 8000 * width * channels,
                           width * channels, bits)  # fmt: skip
        body += struct.pack("<HHI", 22, bits, 0) + guid
    else:
        body = struct.pack("<HHIIHH", 3, channels, 8000, 8000 * width * channels,
                           width * channels, bits)  # fmt: skip
    chunks = b"fmt " + struct.pack("<I", len(body)) + body
    chunks += b"LIST" + struct.pack("<I", 3) + b"abc\x00"  # an odd-sized chunk, padded
    chunks += b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 2])
def test_pcm_wav_reads_the_values_written(tmp_path: Path, width: int, channels: int) -> None:
    x = _signal(400, channels)
    want = _write_std(tmp_path / "a.wav", x, width)
    got, rate = read_wav(tmp_path / "a.wav")
    assert rate == 8000 and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    mono, _ = load_audio(tmp_path / "a.wav")
    torch.testing.assert_close(mono, want.mean(dim=0))


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("extensible", [False, True])
def test_float_wav(tmp_path: Path, bits: int, extensible: bool) -> None:
    x = _signal(300, 2)
    _write_float(tmp_path / "f.wav", x, bits, extensible)
    got, rate = read_wav(tmp_path / "f.wav")
    assert rate == 8000 and list(got.shape) == [2, 300]
    torch.testing.assert_close(got, x.float(), rtol=0, atol=1e-7)


def test_malformed_wav_files_raise_the_audio_error(tmp_path: Path) -> None:
    x = _signal(100, 1)
    _write_std(tmp_path / "ok.wav", x, 2)
    good = (tmp_path / "ok.wav").read_bytes()
    cases = {
        "not_wav": b"hello world, not audio at all",
        "short": good[:10],
        "adpcm": good[:20] + struct.pack("<H", 2) + good[22:],
        "align": good[:32] + struct.pack("<H", 7) + good[34:],
        "no_data": good[:36],
        "bad_fmt_size": good[:12] + b"fmt " + struct.pack("<I", 1 << 30) + good[20:],
    }
    for name, data in cases.items():
        (tmp_path / f"{name}.wav").write_bytes(data)
        with pytest.raises(AudioFormatError):
            read_wav(tmp_path / f"{name}.wav")
    # a file that is not WAV goes to soundfile; what it cannot read is the same error
    with pytest.raises(AudioFormatError, match="soundfile"):
        load_audio(tmp_path / "not_wav.wav")


def test_an_extensible_subformat_is_read_only_by_its_whole_guid(tmp_path: Path) -> None:
    """WAVE_FORMAT_EXTENSIBLE names its samples by a 16-byte GUID. IEC 61937's MPEG-1
    bitstream, 00000003-0cea-0010-8000-00aa00389b71, begins as IEEE float's
    00000003-0000-0010-8000-00aa00389b71 does: its bytes are no float samples, and are
    refused, where the float GUID reads the values written."""
    x = _signal(64, 1)
    _write_float(tmp_path / "f.wav", x, 32, extensible=True)
    good = (tmp_path / "f.wav").read_bytes()
    guid_at = good.index(b"\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71") - 4
    got, _ = read_wav(tmp_path / "f.wav")
    torch.testing.assert_close(got, x.float(), rtol=0, atol=1e-7)
    iec = good[: guid_at + 4] + b"\xea\x0c" + good[guid_at + 6 :]
    (tmp_path / "iec.wav").write_bytes(iec)
    with pytest.raises(AudioFormatError, match="00000003-0cea-0010-8000-00aa00389b71"):
        read_wav(tmp_path / "iec.wav")


def test_a_missing_audio_file_is_the_typed_error(tmp_path: Path) -> None:
    """load_audio (what transcribe reads a path with) raises what read_wav raises for a
    missing file: ptexec's FileMissingError, not the bare OS error."""
    missing = tmp_path / "none.wav"
    for read in (read_wav, load_audio):
        with pytest.raises(FileMissingError, match="audio file not found") as caught:
            read(missing)
        assert isinstance(caught.value, PtexecError) and isinstance(caught.value, FileNotFoundError)
        assert caught.value.filename == str(missing)


def test_rf64_wav_reads_the_data_size_of_its_ds64_chunk(tmp_path: Path) -> None:
    """An RF64 file's 'data' chunk says 0xFFFFFFFF bytes; its size is in 'ds64' (EBU
    Tech 3306): a chunk after the samples is no audio."""
    values = [i * 300 - 15000 for i in range(100)]
    samples = struct.pack(f"<{len(values)}h", *values)
    ds64 = struct.pack("<QQQI", 0, len(samples), len(values), 0)
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    body = (
        b"WAVE"
        + b"ds64" + struct.pack("<I", len(ds64)) + ds64
        + b"fmt " + struct.pack("<I", len(fmt)) + fmt
        + b"data" + struct.pack("<I", 0xFFFFFFFF) + samples
        + b"LIST" + struct.pack("<I", 12) + b"INFOICMT\x00\x00\x00\x00"
    )  # fmt: skip
    path = tmp_path / "big.wav"
    path.write_bytes(b"RF64" + struct.pack("<I", 0xFFFFFFFF) + body)
    x, rate = read_wav(path)
    assert rate == 16000
    assert x.shape == (1, 100)
    assert x[0].tolist() == [v / 32768 for v in values]
    path.write_bytes(b"RF64" + struct.pack("<I", 0xFFFFFFFF) + body[:4] + body[40:])
    with pytest.raises(AudioFormatError, match="ds64"):
        read_wav(path)


def test_to_mono_averages_channels() -> None:
    x = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 1.0]])
    torch.testing.assert_close(to_mono(x), torch.tensor([0.5, 0.5, 0.0]))
    row = x[0]
    assert to_mono(row) is row
    with pytest.raises(AudioFormatError):
        to_mono(torch.zeros(1, 2, 3))


def _tones(rate: int, seconds: float, freqs: tuple[float, ...]) -> torch.Tensor:
    t = torch.arange(int(rate * seconds), dtype=torch.float64) / rate
    return sum(0.4 * torch.sin(2 * math.pi * f * t) for f in freqs).float()  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("orig", "new"), [(44100, 16000), (48000, 16000), (22050, 16000), (8000, 16000)]
)
def test_resample_gives_the_sine_at_the_new_rate(orig: int, new: int) -> None:
    freqs = (440.0, 3000.0)
    y = resample(_tones(orig, 0.5, freqs), orig, new)
    assert y.numel() == math.ceil(orig * 0.5 * new / orig)
    want = _tones(new, y.numel() / new, freqs)[: y.numel()]
    edge = new // 20  # the filter's reach past the ends is zeros
    err = (y - want)[edge:-edge].abs().max().item()
    assert err < 2e-3, err


def test_resample_removes_what_the_new_rate_cannot_hold() -> None:
    x = _tones(44100, 0.5, (11000.0,))  # above 16 kHz's Nyquist frequency
    y = resample(x, 44100, 16000)
    assert y[800:-800].pow(2).mean().sqrt().item() < 1e-3


def test_resample_agrees_with_scipy() -> None:
    signal = pytest.importorskip("scipy.signal")
    x = _tones(44100, 0.5, (200.0, 1234.0, 5000.0))
    for orig, new in ((44100, 16000), (16000, 24000)):
        g = math.gcd(orig, new)
        y = resample(x, orig, new)
        ref = torch.from_numpy(signal.resample_poly(x.double().numpy(), new // g, orig // g))
        n = min(y.numel(), ref.numel())
        err = (y[:n].double() - ref[:n])[n // 20 : -n // 20].abs().max().item()
        assert err < 5e-3, (orig, new, err)


def test_resample_keeps_channels_and_edge_cases() -> None:
    x = torch.stack([_tones(8000, 0.1, (300.0,)), _tones(8000, 0.1, (500.0,))])
    y = resample(x, 8000, 16000)
    assert list(y.shape) == [2, 1600]
    torch.testing.assert_close(y[1], resample(x[1], 8000, 16000))
    assert resample(x, 8000, 8000) is x
    assert resample(torch.zeros(0), 8000, 16000).numel() == 0
    with pytest.raises(ValueError):
        resample(x, 0, 16000)


@pytest.mark.cuda
def test_resample_on_cuda_equals_cpu() -> None:
    x = _tones(44100, 0.3, (440.0, 2000.0))
    y = resample(x.cuda(), 44100, 16000)
    assert y.is_cuda
    torch.testing.assert_close(y.cpu(), resample(x, 44100, 16000), rtol=1e-4, atol=1e-5)


def test_windows_of_long_audio() -> None:
    x = torch.arange(16000 * 65, dtype=torch.float32)
    ws = windows(x, 16000)
    assert [s for s, _ in ws] == [0.0, 30.0, 60.0]
    assert [w.numel() for _, w in ws] == [480000, 480000, 80000]
    assert torch.equal(torch.cat([w for _, w in ws]), x)
    assert len(windows(torch.zeros(0), 16000)) == 1
    with pytest.raises(ValueError):
        windows(x, 16000, 0.0)


def test_timestamp_segments() -> None:
    tb = 100  # <|0.00|>
    tokens = [tb + 0, 5, 6, tb + 50, tb + 50, 7, tb + 120, 8, 9]
    got = split_segments(tokens, tb, offset=30.0)
    # a segment's ids hold its timestamps, as Whisper's segments carry them
    assert got == [
        (30.0, 31.0, [tb, 5, 6, tb + 50]),
        (31.0, 32.4, [tb + 50, 7, tb + 120]),
        (32.4, -1.0, [tb + 120, 8, 9]),
    ]
    assert split_segments([5, 6], tb) == [(0.0, -1.0, [5, 6])]
    # Whisper's usual ending, a closing timestamp then EOS: no segment after it
    eos = 2
    ended = [tb, 5, 6, tb + 50, tb + 50, 7, tb + 100, eos]
    assert split_segments(ended, tb, ignore={eos}) == [
        (0.0, 1.0, [tb, 5, 6, tb + 50]),
        (1.0, 2.0, [tb + 50, 7, tb + 100]),
    ]
    # timestamps without text between them make no segment; the latest one opens the next
    assert split_segments([tb, tb + 10, 5, tb + 20, tb + 30, eos], tb, ignore={eos}) == [
        (0.2, 0.4, [tb + 10, 5, tb + 20])
    ]


def test_forced_tokens_from_generation_configs() -> None:
    plain = {"forced_decoder_ids": [[1, 10], [2, 11]]}
    assert _prompt_from(plain, 1, None, None, False).forced == (10, 11)
    whisper = {
        "forced_decoder_ids": [[1, None], [2, 50359]],
        "lang_to_id": {"<|en|>": 50259, "<|fr|>": 50265},
        "task_to_id": {"transcribe": 50359, "translate": 50358},
        "no_timestamps_token_id": 50363,
    }
    assert _prompt_from(whisper, 1, "fr", None, False).forced == (50265, 50359, 50363)
    assert _prompt_from(whisper, 1, "<|en|>", "translate", True).forced == (50259, 50358)
    # no language asked for: detected from the audio (tests/test_whisper_rules.py)
    assert _prompt_from(whisper, 1, None, None, False) == DecoderPrompt(
        1, (50359, 50363), (50259, 50265)
    )
    with pytest.raises(Exception, match="language"):
        _prompt_from(whisper, 1, "xx", None, False)
    # no language or task tables: the forced tokens stay, the no-timestamps token follows them
    plain_ts = {"forced_decoder_ids": [[1, 10], [2, 11]], "no_timestamps_token_id": 99}
    assert _prompt_from(plain_ts, 1, None, None, False).forced == (10, 11, 99)
    assert _prompt_from(plain_ts, 1, None, None, True).forced == (10, 11)
    assert DecoderPrompt.of(50258, {1: 50259, 2: 50359}).prefix() == [50258, 50259, 50359]
    with pytest.raises(Exception, match="positions"):
        DecoderPrompt.of(1, {2: 5})


def test_rates_without_a_small_ratio_are_refused_before_the_filter_is_built(
    tmp_path: Path,
) -> None:
    # 4999 Hz to 4000 Hz is 4000/4999: one strided convolution needs 4000 phases of
    # 5,000+ taps (20 million weights); 44101 Hz to 16000 Hz needed 5.7 GB a temporary,
    # from a WAV of a few bytes. Refused, typed, before anything that size is made.
    path = tmp_path / "odd_rate.wav"
    _write_std(path, _signal(400, 1), 2, rate=4999)
    with pytest.raises(AudioFormatError, match="4999 Hz to 4000 Hz"):
        load_audio(path, 4000)
    # the rates of real recordings stay within the bound, and equal scipy's resampler
    signal = pytest.importorskip("scipy.signal")
    x = _tones(47952, 0.2, (300.0, 2000.0))  # 48 kHz at NTSC's 1000/1001
    y = resample(x, 47952, 16000)
    ref = torch.from_numpy(signal.resample_poly(x.double().numpy(), 1000, 2997))
    n = min(y.numel(), ref.numel())
    assert (y[:n].double() - ref[:n])[n // 20 : -n // 20].abs().max().item() < 5e-3


def test_a_rate_far_below_the_wanted_one_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    # a WAV's rate is untrusted: a 1 Hz file of a million 8-bit samples asked 16,000 output
    # samples of each, 64 GB, from a 1 MB file
    path = tmp_path / "one_hertz.wav"
    _write_std(path, _signal(1000, 1), 1, rate=1)
    with pytest.raises(AudioFormatError, match="1 Hz to 16000 Hz"):
        load_audio(path, 16000)
    with pytest.raises(AudioFormatError, match="at most 8"):
        resample(torch.zeros(10), 1999, 16000)
    # the lowest rates of real recordings (2 kHz, telephony's 8 kHz) are taken
    x = _tones(2000, 0.5, (300.0,))
    assert resample(x, 2000, 16000).shape == (8000,)
