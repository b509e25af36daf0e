"""Audio for speech models: reading files, resampling, 30-second windows, log-mel features.

Each step is one function (or one small class), usable alone and by any runner that takes
audio (speech-to-text here, audio inputs of multimodal LLMs)::

    samples = load_audio("speech.wav", 16000)        # float32 mono [n] at 16 kHz
    for start, window in windows(samples, 16000):     # consecutive 30 s windows
        features = extractor(window)                  # float32 [1, mel bins, frames]

* :func:`read_wav` reads RIFF/WAVE files with the standard library: PCM integers of 8, 16,
  24 and 32 bits and IEEE floats of 32 and 64 bits (``WAVE_FORMAT_EXTENSIBLE`` too), any
  number of channels, RF64 files too (the data size in their ``ds64`` chunk);
  :func:`load_audio` reads WAV itself and other formats through ``soundfile`` when it is
  installed (``pip install 'ptexec[audio]'``), averages the
  channels to mono and resamples.
* :func:`resample` is a band-limited polyphase resampler: a Kaiser-windowed sinc low-pass at
  the lower of the two Nyquist frequencies, evaluated at every output phase, applied as one
  strided convolution (on the samples' device).
* :class:`ProgramFeatures` runs a preprocessor program (ExecuTorch's
  ``WhisperAudioProcessor`` export: ``forward(waveform f32[n]) -> f32[1, mels, frames]``);
  :class:`ProcessorFeatures` calls the Hugging Face feature extractor of a processor
  directory (``WhisperFeatureExtractor``). Both take one window of samples at the model's
  rate and return the encoder's input.

Everything read from a file is checked before it is used; a malformed file raises
:class:`~ptexec.errors.AudioFormatError` saying what and where.
"""

from __future__ import annotations

import math
import os
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from ..errors import AudioFormatError, FileMissingError

__all__ = [
    "FeatureExtractor",
    "ProcessorFeatures",
    "ProgramFeatures",
    "load_audio",
    "read_wav",
    "resample",
    "to_mono",
    "windows",
]

_PCM = 1
_FLOAT = 3
_EXTENSIBLE = 0xFFFE
# the GUID of a WAVE_FORMAT_EXTENSIBLE subformat that is a format tag: the tag, then these
# 14 bytes (KSDATAFORMAT_SUBTYPE_PCM is 00000001-0000-0010-8000-00aa00389b71); other
# GUIDs may share the tag's first bytes (IEC 61937's bitstreams: 00000003-0cea-...)
_TAG_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")
_MAX_CHANNELS = 64


def _chunks(data: bytes, path: str) -> Iterator[tuple[bytes, int, int]]:
    """(id, offset, size) of each chunk of a RIFF/WAVE file, every size checked."""
    if len(data) < 12 or data[:4] not in (b"RIFF", b"RF64") or data[8:12] != b"WAVE":
        raise AudioFormatError(f"{path}: not a RIFF/WAVE file (no 'RIFF....WAVE' header)")
    rf64 = data[:4] == b"RF64"
    data_size: int | None = None  # an RF64 file's data size, from its 'ds64' chunk
    pos = 12
    while pos + 8 <= len(data):
        cid = data[pos : pos + 4]
        (size,) = struct.unpack_from("<I", data, pos + 4)
        start = pos + 8
        if rf64 and cid == b"ds64" and size >= 16 and start + size <= len(data):
            (data_size,) = struct.unpack_from("<Q", data, start + 8)
        if rf64 and cid == b"data" and size == 0xFFFFFFFF:
            # the size is in 'ds64' (EBU Tech 3306), which comes first
            if data_size is None:
                raise AudioFormatError(f"{path}: RF64 'data' chunk without a 'ds64' size before it")
            size = data_size
        if start + size > len(data):
            if cid == b"data":  # a truncated last chunk (a recorder that never finished)
                size = len(data) - start
            else:
                raise AudioFormatError(
                    f"{path}: chunk {cid!r} at byte {pos} claims {size} bytes, only "
                    f"{len(data) - start} remain"
                )
        yield cid, start, size
        pos = start + size + (size & 1)  # chunks are padded to even sizes


def read_wav(path: str | os.PathLike[str]) -> tuple[torch.Tensor, int]:
    """The samples of a WAV file as float32 ``[channels, n]`` in [-1, 1], and its rate.

    Integers are scaled by their full range (8-bit samples are unsigned, centred at 128);
    floats are taken as they are. Raises :class:`~ptexec.errors.AudioFormatError` for a
    file that is not WAV, a format other than PCM or IEEE float, or inconsistent sizes."""
    name = os.fspath(path)
    try:
        data = Path(name).read_bytes()
    except FileNotFoundError as e:
        raise FileMissingError(e.errno, f"audio file not found: {name}", name) from None
    fmt: tuple[int, int, int, int, int] | None = None
    samples: tuple[int, int] | None = None
    for cid, start, size in _chunks(data, name):
        if cid == b"fmt ":
            if size < 16:
                raise AudioFormatError(f"{name}: 'fmt ' chunk of {size} bytes (at least 16)")
            tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", data, start)
            if tag == _EXTENSIBLE:
                if size < 40:
                    raise AudioFormatError(
                        f"{name}: WAVE_FORMAT_EXTENSIBLE 'fmt ' chunk of {size} bytes (40)"
                    )
                guid = data[start + 24 : start + 40]
                if guid[2:] != _TAG_GUID_TAIL:
                    raise AudioFormatError(
                        f"{name}: WAVE_FORMAT_EXTENSIBLE subformat {uuid.UUID(bytes_le=guid)} "
                        "is not PCM or IEEE float"
                    )
                (tag,) = struct.unpack_from("<H", guid)
            fmt = (tag, channels, rate, align, bits)
        elif cid == b"data" and samples is None:
            samples = (start, size)
    if fmt is None or samples is None:
        missing = "'fmt '" if fmt is None else "'data'"
        raise AudioFormatError(f"{name}: no {missing} chunk")
    tag, channels, rate, align, bits = fmt
    if not 1 <= channels <= _MAX_CHANNELS:
        raise AudioFormatError(f"{name}: {channels} channels (expected 1 to {_MAX_CHANNELS})")
    if rate <= 0:
        raise AudioFormatError(f"{name}: sample rate {rate}")
    kinds = {(_PCM, 8), (_PCM, 16), (_PCM, 24), (_PCM, 32), (_FLOAT, 32), (_FLOAT, 64)}
    if (tag, bits) not in kinds:
        kind = {_PCM: "PCM", _FLOAT: "IEEE float"}.get(tag, f"format tag {tag:#x}")
        raise AudioFormatError(
            f"{name}: {kind} with {bits} bits per sample is not supported (PCM 8/16/24/32-bit "
            "integers and 32/64-bit floats are)"
        )
    width = bits // 8
    if align != width * channels:
        raise AudioFormatError(
            f"{name}: block align {align} does not match {channels} channels of {bits} bits"
        )
    start, size = samples
    frames = size // align
    raw = data[start : start + frames * align]
    x = _decode(raw, tag, width, channels, frames)
    return x, rate


def _decode(raw: bytes, tag: int, width: int, channels: int, frames: int) -> torch.Tensor:
    buf = bytearray(raw)  # torch.frombuffer wants a writable buffer
    if not buf:
        return torch.zeros(channels, 0)
    if tag == _FLOAT:
        dtype = torch.float32 if width == 4 else torch.float64
        x = torch.frombuffer(buf, dtype=dtype).float()
    elif width == 1:
        x = (torch.frombuffer(buf, dtype=torch.uint8).float() - 128.0) / 128.0
    elif width == 2:
        x = torch.frombuffer(buf, dtype=torch.int16).float() / 32768.0
    elif width == 3:  # little-endian 24-bit: widen to int32 with the sign of the top byte
        b = torch.frombuffer(buf, dtype=torch.uint8).reshape(-1, 3).to(torch.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = torch.where(v >= 1 << 23, v - (1 << 24), v)
        x = v.double().div(float(1 << 23)).float()
    else:
        x = (torch.frombuffer(buf, dtype=torch.int32).double() / float(1 << 31)).float()
    return x.reshape(frames, channels).t().contiguous()


def to_mono(samples: torch.Tensor) -> torch.Tensor:
    """``[n]`` samples from ``[n]`` or ``[channels, n]`` (the channels' mean)."""
    if samples.dim() == 1:
        return samples
    if samples.dim() != 2:
        raise AudioFormatError(f"audio must be [n] or [channels, n], got {list(samples.shape)}")
    return samples.mean(dim=0)


def load_audio(
    path: str | os.PathLike[str], sampling_rate: int | None = None
) -> tuple[torch.Tensor, int]:
    """Mono float32 samples of an audio file, resampled to ``sampling_rate`` (None: the
    file's rate), and that rate. WAV is read by :func:`read_wav`; other formats need the
    ``soundfile`` package."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            head = f.read(12)
    except FileNotFoundError as e:
        raise FileMissingError(e.errno, f"audio file not found: {name}", name) from None
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        x, rate = read_wav(name)
    else:
        x, rate = _read_soundfile(name)
    mono = to_mono(x)
    if sampling_rate is not None and sampling_rate != rate:
        mono = resample(mono, rate, sampling_rate)
        rate = sampling_rate
    return mono, rate


def _read_soundfile(name: str) -> tuple[torch.Tensor, int]:
    try:
        import soundfile
    except ImportError:
        raise AudioFormatError(
            f"{name}: not a WAV file; other formats need 'soundfile' (pip install 'ptexec[audio]')"
        ) from None
    try:
        data, rate = soundfile.read(name, dtype="float32", always_2d=True)
    except Exception as e:
        raise AudioFormatError(f"{name}: soundfile cannot read it ({e})") from None
    return torch.from_numpy(data).t().contiguous(), int(rate)


# -- resampling ------------------------------------------------------------------------


MAX_FILTER_WEIGHTS = 1 << 24
"""The most weights :func:`resample`'s filter bank may hold (``up * taps``: 16.8 million,
a few hundred MB while it is built). Rates of a small ratio need few (44.1 kHz to 16 kHz:
93,000; 48 kHz at NTSC's 1000/1001: 3.2 million); rates without one (44101 Hz to 16 kHz:
708 million) are refused rather than given gigabytes."""


MAX_UPSAMPLING = 8
"""The most output samples :func:`resample` makes of one input sample (``new / orig``):
16 kHz from 2 kHz and above. A file's rate is untrusted, and a 1 Hz file would ask
16,000 samples of each of its own."""


def _filter_shape(up: int, down: int, zeros: int, rolloff: float) -> tuple[float, int, int]:
    """The low-pass's cutoff (of the input's Nyquist frequency), its half-width in input
    samples and the taps of one phase of the bank."""
    cutoff = min(1.0, up / down) * rolloff
    half = math.ceil(zeros / cutoff)
    return cutoff, half, 2 * half + 1 + down  # room for every phase's offset in one stride


def _kernels(
    up: int, down: int, zeros: int, rolloff: float, beta: float
) -> tuple[torch.Tensor, int]:
    """The polyphase filter bank: row ``r`` holds the taps for output phase ``r``
    (``[up, 1, taps]``, float64), and the half-width in input samples."""
    cutoff, half, taps = _filter_shape(up, down, zeros, rolloff)
    r = torch.arange(up, dtype=torch.float64).reshape(-1, 1)
    m = torch.arange(taps, dtype=torch.float64).reshape(1, -1)
    # output j = k*up + r sits at input time k*down + r*down/up; tap m reads input
    # k*down - half + m: the distance is m - half - r*down/up
    d = m - half - r * down / up
    inside = d.abs() <= half
    window = torch.special.i0(beta * torch.sqrt((1 - (d / half) ** 2).clamp(min=0.0)))
    h = cutoff * torch.sinc(cutoff * d) * window / torch.special.i0(torch.tensor(beta))
    h = torch.where(inside, h, torch.zeros_like(h))
    return h.reshape(up, 1, taps), half


def resample(
    samples: torch.Tensor,
    orig_rate: int,
    new_rate: int,
    *,
    zeros: int = 24,
    rolloff: float = 0.95,
    beta: float = 8.6,
) -> torch.Tensor:
    """Band-limited resampling of ``[n]`` (or ``[channels, n]``) samples from ``orig_rate``
    to ``new_rate`` Hz: ``ceil(n * new / orig)`` samples out, on the input's device.

    A windowed-sinc low-pass (``zeros`` zero crossings each side, cut at ``rolloff`` of the
    lower Nyquist frequency, Kaiser window ``beta``) evaluated at each of the ``new / g``
    output phases (``g`` the rates' gcd), applied as one convolution with stride
    ``orig / g``. Outside the signal the input is taken as zero. Rates whose bank would
    hold more than :data:`MAX_FILTER_WEIGHTS` weights, or that make more than
    :data:`MAX_UPSAMPLING` samples of each (a file's rate is untrusted), raise
    :class:`~ptexec.errors.AudioFormatError` before anything is made."""
    if orig_rate <= 0 or new_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_rate} and {new_rate}")
    if orig_rate == new_rate:
        return samples
    if new_rate > MAX_UPSAMPLING * orig_rate:
        raise AudioFormatError(
            f"resampling from {orig_rate} Hz to {new_rate} Hz makes {new_rate / orig_rate:.4g} "
            f"samples of each, at most {MAX_UPSAMPLING} taken: the file's rate is too low"
        )
    g = math.gcd(orig_rate, new_rate)
    up, down = new_rate // g, orig_rate // g
    weights = up * _filter_shape(up, down, zeros, rolloff)[2]
    if weights > MAX_FILTER_WEIGHTS:
        raise AudioFormatError(
            f"resampling from {orig_rate} Hz to {new_rate} Hz (a ratio of {up}/{down}) needs "
            f"{weights} filter weights, more than the {MAX_FILTER_WEIGHTS} taken: resample "
            "the audio to a common rate first"
        )
    n = samples.shape[-1]
    if n == 0:
        return samples.new_zeros((*samples.shape[:-1], 0))
    flat = samples.reshape(-1, n)
    out_len = -(-n * up // down)
    h, half = _kernels(up, down, zeros, rolloff, beta)
    h = h.to(device=samples.device, dtype=torch.float32)
    frames = -(-out_len // up)  # strided positions k
    need = (frames - 1) * down + h.shape[-1]
    x = torch.nn.functional.pad(flat.float(), (half, max(0, need - n - half)))
    y = torch.nn.functional.conv1d(x.unsqueeze(1), h, stride=down)  # [channels, up, frames]
    y = y[..., :frames].transpose(1, 2).reshape(flat.shape[0], -1)[:, :out_len]
    return y.reshape(*samples.shape[:-1], out_len)


def windows(
    samples: torch.Tensor, sampling_rate: int, seconds: float = 30.0
) -> list[tuple[float, torch.Tensor]]:
    """Consecutive windows of ``seconds`` (the last one shorter) as ``(start time in
    seconds, samples)``; one empty window for empty audio."""
    size = round(seconds * sampling_rate)
    if size <= 0:
        raise ValueError(f"a window of {seconds} s at {sampling_rate} Hz holds no sample")
    n = samples.shape[-1]
    if n == 0:
        return [(0.0, samples)]
    return [(i / sampling_rate, samples[..., i : i + size]) for i in range(0, n, size)]


# -- features --------------------------------------------------------------------------


class FeatureExtractor(Protocol):
    """Turns one window of mono samples (at :attr:`sampling_rate`) into encoder input. An
    extractor that makes features of a fixed span (padding or cutting the samples to it)
    says so with a ``window_samples`` attribute; transcription then refuses longer
    windows."""

    sampling_rate: int

    def __call__(self, samples: torch.Tensor) -> torch.Tensor: ...


class ProgramFeatures:
    """Features from a preprocessor program (ExecuTorch's ``WhisperAudioProcessor``
    export: ``forward(waveform f32[n]) -> f32[1, mel bins, frames]``). The program does not
    record its rate: ``sampling_rate`` says it (Whisper's 16 kHz by default). ``device_map``
    and ``xnnpack`` are the runners' load options (:func:`~ptexec.llm.decoder.load_options`)."""

    def __init__(
        self,
        program: Any,
        *,
        sampling_rate: int = 16000,
        method: str = "forward",
        device_map: Any = None,
        xnnpack: str = "auto",
    ) -> None:
        import ptexec

        from .decoder import load_options

        self.program = program if isinstance(program, ptexec.Program) else ptexec.load(program)
        self.method = self.program.load_method(method, **load_options(device_map, False, xnnpack))
        info: Any = self.method.meta.inputs[0]
        if not hasattr(info, "sizes") or len(info.sizes) != 1 or not info.dtype.is_floating_point:
            raise AudioFormatError(
                f"the preprocessor's '{method}' should take a waveform f32[n]; it takes {info}"
            )
        self.max_samples = int(info.sizes[0])
        self.device = info.device.to_torch()
        self.dtype = info.dtype
        self.sampling_rate = sampling_rate

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        x = to_mono(samples).to(device=self.device, dtype=self.dtype)
        if x.numel() > self.max_samples:
            raise AudioFormatError(
                f"{x.numel()} samples are more than the preprocessor takes ({self.max_samples})"
            )
        if x.numel() == 0:
            x = x.new_zeros(1)
        out: torch.Tensor = self.method.execute([x])[0]
        return out

    def __repr__(self) -> str:
        return f"<ptexec.llm.ProgramFeatures at {self.sampling_rate} Hz>"


class ProcessorFeatures:
    """Features from the Hugging Face feature extractor of a processor or checkpoint
    directory (``preprocessor_config.json``; ``WhisperFeatureExtractor`` for Whisper); needs
    ``transformers``."""

    def __init__(self, directory: str | os.PathLike[str], extractor: Any = None) -> None:
        if extractor is None:
            try:
                from transformers import AutoFeatureExtractor
            except ImportError:
                raise AudioFormatError(
                    "features from a processor directory need 'transformers'"
                ) from None
            extractor = AutoFeatureExtractor.from_pretrained(  # type: ignore[no-untyped-call]
                os.fspath(directory)
            )
        self.extractor = extractor
        self.sampling_rate = int(extractor.sampling_rate)
        chunk = getattr(extractor, "n_samples", None)
        self.window_samples: int | None = int(chunk) if isinstance(chunk, int) else None
        """The samples the extractor makes features of (Whisper's: 30 s, padded or cut
        to it), or None if it does not say."""

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        x = to_mono(samples).detach().float().cpu().numpy()
        out = self.extractor(x, sampling_rate=self.sampling_rate, return_tensors="pt")
        features: torch.Tensor = out["input_features"]
        return features

    def __repr__(self) -> str:
        return f"<ptexec.llm.ProcessorFeatures {type(self.extractor).__name__}>"
