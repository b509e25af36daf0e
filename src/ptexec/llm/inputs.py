"""Inputs of a multimodal generation: text, token ids, images and audio.

Names and checks follow ExecuTorch's runner bindings. Images are stored channels-first
(``C, H, W``), as uint8 or float32 values. ptexec's runners generate from text and token
inputs; images and audio can be built and inspected, and a runner refuses them with a
:class:`~ptexec.errors.GenerationError` (this runtime has no vision or audio encoders).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, overload

import torch

__all__ = [
    "Audio",
    "Image",
    "MultimodalInput",
    "RawAudio",
    "make_audio_input",
    "make_image_input",
    "make_raw_audio_input",
    "make_text_input",
    "make_token_input",
]


class Image:
    """Image pixels (channels-first), as uint8 or float values."""

    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(
        self, data: Sequence[int] | Sequence[float], width: int, height: int, channels: int
    ) -> None: ...
    def __init__(
        self,
        data: Sequence[int] | Sequence[float] | None = None,
        width: int = 0,
        height: int = 0,
        channels: int = 0,
    ) -> None:
        values = list(data) if data is not None else []
        if values and len(values) != width * height * channels:
            raise RuntimeError(
                f"Image data has {len(values)} values, expected width {width} x height "
                f"{height} x channels {channels} = {width * height * channels}"
            )
        self._float = any(isinstance(v, float) for v in values)
        self._data = values
        self._width, self._height, self._channels = int(width), int(height), int(channels)

    def is_uint8(self) -> bool:
        return not self._float

    def is_float(self) -> bool:
        return self._float

    @property
    def width(self) -> int:
        return self._width

    @property
    def height(self) -> int:
        return self._height

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def uint8_data(self) -> list[int]:
        return [int(v) for v in self._data] if not self._float else []

    @property
    def float_data(self) -> list[float]:
        return [float(v) for v in self._data] if self._float else []

    def to_tensor(self) -> torch.Tensor:
        """The pixels as a ``[C, H, W]`` tensor (uint8 or float32)."""
        dtype = torch.float32 if self._float else torch.uint8
        return torch.tensor(self._data, dtype=dtype).reshape(
            self._channels, self._height, self._width
        )

    def __repr__(self) -> str:
        kind = "float" if self._float else "uint8"
        return (
            f"Image(height={self._height}, width={self._width}, channels={self._channels}, "
            f"type={kind})"
        )


class Audio:
    """Preprocessed audio features (``batch_size x n_bins x n_frames`` values).

    Made as ExecuTorch's is, from the values (uint8 ints or floats, kept as float32), or
    by :func:`make_audio_input` from a tensor's bytes and its ``dtype``. ``data`` is the
    values' bytes, ``dtype`` what they hold."""

    def __init__(
        self,
        data: Sequence[int] | Sequence[float] = (),
        batch_size: int = 0,
        n_bins: int = 0,
        n_frames: int = 0,
        dtype: torch.dtype | None = None,
    ) -> None:
        given = list(data)
        values_given = bool(given) and len(given) == batch_size * n_bins * n_frames
        if dtype is None and (
            any(isinstance(v, float) for v in given)
            or (values_given and not all(0 <= int(v) <= 255 for v in given))
        ):
            # ExecuTorch's float constructor (floats, or ints a byte cannot hold, as its
            # overloads choose): the values, kept as float32 bytes
            values: list[int] = torch.tensor(given, dtype=torch.float32).view(torch.uint8).tolist()
            dtype = torch.float32
        else:
            values = [int(v) for v in given]
            if dtype is None and values_given:
                dtype = torch.uint8  # ExecuTorch's uint8 constructor: a byte a value
        self.data = values
        self.batch_size, self.n_bins, self.n_frames = batch_size, n_bins, n_frames
        self.dtype = dtype
        """The dtype ``data``'s bytes hold (None: float32, or the encoder's own)."""

    def is_uint8(self) -> bool:
        return self.dtype == torch.uint8

    def is_float(self) -> bool:
        return self.dtype is None or self.dtype.is_floating_point

    @property
    def uint8_data(self) -> list[int]:
        """The values, when they are uint8 (else empty; ExecuTorch's raises)."""
        return list(self.data) if self.is_uint8() else []

    @property
    def float_data(self) -> list[float]:
        """The values as floats, when they are floating point (else empty; ExecuTorch's
        raises)."""
        return self.to_tensor().float().reshape(-1).tolist() if self.is_float() else []

    def to_tensor(self) -> torch.Tensor:
        """The values as a ``[batch_size, n_bins, n_frames]`` tensor of their dtype."""
        dtype = self.dtype or torch.float32
        raw = torch.tensor(self.data, dtype=torch.uint8)
        return raw.view(dtype).reshape(self.batch_size, self.n_bins, self.n_frames)

    def toTensor(self, with_batch: bool = True) -> torch.Tensor:
        """:meth:`to_tensor` (without the batch dimension for one window when
        ``with_batch`` is false)."""
        t = self.to_tensor()
        return t if with_batch or self.batch_size != 1 else t[0]

    def __repr__(self) -> str:
        return (
            f"Audio(batch_size={self.batch_size}, n_bins={self.n_bins}, n_frames={self.n_frames})"
        )


class RawAudio:
    """Raw audio samples (``batch_size x n_channels x n_samples`` values)."""

    def __init__(
        self,
        data: Sequence[int] = (),
        batch_size: int = 0,
        n_channels: int = 0,
        n_samples: int = 0,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.data = list(data)
        self.batch_size, self.n_channels, self.n_samples = batch_size, n_channels, n_samples
        self.dtype = dtype
        """The dtype ``data``'s bytes hold (None: float32)."""

    def __repr__(self) -> str:
        return (
            f"RawAudio(batch_size={self.batch_size}, n_channels={self.n_channels}, "
            f"n_samples={self.n_samples})"
        )


class _Tokens:
    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = _token_ids(ids)


def _token_ids(ids: Any) -> list[int]:
    """Token ids: a sequence of non-negative ints (not a str, not floats or bools), as
    ExecuTorch's bindings take them."""
    if hasattr(ids, "tolist") and not isinstance(ids, torch.Tensor):  # a numpy array of ids
        ids = ids.tolist()
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence | torch.Tensor):
        raise TypeError(
            "MultimodalInput takes a str, token ids (a sequence of ints), an Image, Audio or "
            f"RawAudio, got {type(ids).__name__}"
        )
    return [token_id(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]


def token_id(i: Any) -> int:
    """One token id as ExecuTorch's bindings take it: an int (or what has ``__index__``: a
    numpy integer; a bool is 0 or 1), 0 to 2**64 - 1; anything else, a float above all
    (7.9 cast would run as token 7), raises ``TypeError``."""
    if not isinstance(i, int) and not hasattr(i, "__index__"):
        raise TypeError(f"token ids are ints, got {type(i).__name__} ({i!r})")
    try:
        value = operator.index(i)
    except TypeError:  # (a float tensor has __index__, and refuses)
        raise TypeError(f"token ids are ints, got {type(i).__name__} ({i!r})") from None
    if not 0 <= value < 1 << 64:
        raise TypeError(f"token ids are 0 to 2**64 - 1, got {value}")
    return value


class MultimodalInput:
    """One input of a multimodal prompt: text, token ids, an image, audio or raw audio.

    Made as ExecuTorch's is: ``MultimodalInput("text")``, ``MultimodalInput([1, 2])`` (token
    ids), or by keyword, ``text=``, ``tokens=``, ``image=``, ``audio=``, ``raw_audio=``
    (exactly one); or with an :class:`Image`, :class:`Audio` or :class:`RawAudio`."""

    def __init__(
        self,
        value: str | Sequence[int] | Image | Audio | RawAudio | _Tokens | None = None,
        *,
        text: str | None = None,
        tokens: Sequence[int] | None = None,
        image: Image | None = None,
        audio: Audio | None = None,
        raw_audio: RawAudio | None = None,
    ) -> None:
        given = [v for v in (value, text, tokens, image, audio, raw_audio) if v is not None]
        if len(given) != 1:
            raise TypeError(
                "MultimodalInput takes one input: text, tokens, image, audio or raw_audio"
            )
        kinds = (
            (text, str, "text"),
            (image, Image, "image"),
            (audio, Audio, "audio"),
            (raw_audio, RawAudio, "raw_audio"),
        )
        for given_value, kind, name in kinds:
            if given_value is not None and not isinstance(given_value, kind):
                raise TypeError(f"MultimodalInput {name}= takes a {kind.__name__}, got "
                                f"{type(given_value).__name__}")  # fmt: skip
        chosen = given[0]
        if isinstance(value, bytes):  # (ExecuTorch's bindings read bytes as text)
            chosen = value.decode("utf-8")
        elif tokens is not None or (
            value is not None and not isinstance(value, str | Image | Audio | RawAudio | _Tokens)
        ):
            chosen = _Tokens(_token_ids(chosen))
        self._value: Any = chosen

    @property
    def type(self) -> str:
        v = self._value
        if isinstance(v, str):
            return "text"
        if isinstance(v, _Tokens):
            return "tokens"
        if isinstance(v, Image):
            return "image"
        return "audio" if isinstance(v, Audio) else "raw_audio"

    def is_text(self) -> bool:
        return self.type == "text"

    def is_tokens(self) -> bool:
        return self.type == "tokens"

    def is_image(self) -> bool:
        return self.type == "image"

    def is_audio(self) -> bool:
        return self.type == "audio"

    def is_raw_audio(self) -> bool:
        return self.type == "raw_audio"

    def get_text(self) -> str | None:
        return self._value if self.is_text() else None

    def get_tokens(self) -> list[int] | None:
        return list(self._value.ids) if self.is_tokens() else None

    def get_image(self) -> Image | None:
        return self._value if self.is_image() else None

    def get_audio(self) -> Audio | None:
        return self._value if self.is_audio() else None

    def get_raw_audio(self) -> RawAudio | None:
        return self._value if self.is_raw_audio() else None

    def __repr__(self) -> str:
        kind = self.type
        if kind == "text":
            text = self._value if len(self._value) <= 50 else self._value[:50] + "..."
            return f'MultimodalInput(type=text, text="{text}")'
        if kind == "tokens":
            ids = self._value.ids
            shown = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
            return f"MultimodalInput(type=tokens, count={len(ids)}, tokens=[{shown}])"
        return f"MultimodalInput(type={kind}, {self._value!r})"


def make_text_input(text: str) -> MultimodalInput:
    """A text input."""
    return MultimodalInput(text)


def make_token_input(tokens: Sequence[int]) -> MultimodalInput:
    """An input of token ids (already encoded)."""
    return MultimodalInput(_Tokens(tokens))


def make_image_input(image_tensor: torch.Tensor) -> MultimodalInput:
    """An image input from a ``(H, W, C)``, ``(1, H, W, C)``, ``(C, H, W)`` or
    ``(1, C, H, W)`` tensor with 3 (RGB) or 4 (RGBA) channels, uint8 or float."""
    t = image_tensor
    if t.dim() == 4:
        if t.shape[0] != 1:
            raise RuntimeError(
                f"Image tensor with 4 dimensions must have batch size 1, got {list(t.shape)}"
            )
        t = t[0]
    if t.dim() != 3:
        raise RuntimeError(
            "Image tensor must be 3-dimensional (H, W, C) or (C, H, W), or 4-dimensional "
            f"with batch size 1; got {t.dim()} dimensions"
        )
    if t.shape[0] in (3, 4):
        chw = t
    elif t.shape[-1] in (3, 4):
        chw = t.permute(2, 0, 1)
    else:
        raise RuntimeError(
            f"Image tensor must have 3 (RGB) or 4 (RGBA) channels, got shape {list(t.shape)}"
        )
    c, h, w = (int(s) for s in chw.shape)
    if t.dtype == torch.uint8:
        data: list[Any] = chw.contiguous().reshape(-1).tolist()
    elif t.is_floating_point():
        data = [float(v) for v in chw.float().contiguous().reshape(-1).tolist()]
    else:
        raise RuntimeError(f"Image tensor must be uint8 or floating point, got {t.dtype}")
    return MultimodalInput(Image(data, w, h, c))


def make_audio_input(audio_tensor: torch.Tensor) -> MultimodalInput:
    """Preprocessed audio features from a ``(batch_size, n_bins, n_frames)`` floating point
    or uint8 tensor (each batch row a window; converted to the encoder's dtype)."""
    if audio_tensor.dim() != 3:
        raise RuntimeError(
            "Audio tensor must be 3-dimensional (batch_size, n_bins, n_frames), got "
            f"{audio_tensor.dim()} dimensions"
        )
    b, bins, frames = (int(s) for s in audio_tensor.shape)
    if not audio_tensor.is_floating_point() and audio_tensor.dtype != torch.uint8:
        raise RuntimeError(
            f"Audio features must be floating point or uint8, got {audio_tensor.dtype}"
        )
    data = audio_tensor.contiguous().reshape(-1).view(torch.uint8).tolist()
    return MultimodalInput(Audio(data, b, bins, frames, audio_tensor.dtype))


def make_raw_audio_input(audio_tensor: torch.Tensor) -> MultimodalInput:
    """Raw audio from a ``(batch_size, n_channels, n_samples)`` tensor: one clip (batch 1),
    its channels averaged; float samples in -1..1, or int16/int32 PCM (scaled to -1..1)."""
    if audio_tensor.dim() != 3:
        raise RuntimeError(
            "Raw audio tensor must be 3-dimensional (batch_size, n_channels, n_samples), got "
            f"{audio_tensor.dim()} dimensions"
        )
    b, ch, n = (int(s) for s in audio_tensor.shape)
    if b != 1:
        raise RuntimeError(f"Raw audio is one clip (batch_size 1), got batch_size {b}")
    x = audio_tensor
    if x.dtype in _PCM:  # integer PCM, as a WAV file holds it: to -1..1
        x = x.double() / _PCM[x.dtype]
    elif not x.is_floating_point():
        raise RuntimeError(
            f"Raw audio must be floating point samples (-1..1) or int16/int32 PCM, got {x.dtype}"
        )
    data = x.contiguous().reshape(-1).view(torch.uint8).tolist()
    return MultimodalInput(RawAudio(data, b, ch, n, x.dtype))


_PCM = {torch.int16: 32768.0, torch.int32: 2147483648.0}
