"""Images for a vision encoder: reading a file, resizing and normalising in torch.

:func:`read_image` reads a file or its bytes (PNG, JPEG, ... through Pillow) as ``uint8 [3, H, W]``
RGB pixels. :class:`ImagePreprocessor` turns pixels into what a vision encoder takes, with
the settings of a Hugging Face ``preprocessor_config.json`` (or the ``image_processor``
entry of a ``processor_config.json``): resize (``size``: ``height``/``width``,
``shortest_edge``, or one number: the shortest edge for CLIP's and others that read it so,
or when a center crop follows, else a square), center crop (``crop_size``), rescale
(``rescale_factor``, 1/255 by default) and normalise (``image_mean``, ``image_std``), each
switched by its ``do_*`` flag, as transformers' image processors read them. uint8 pixels are
resized by Pillow with the config's filter, as transformers' processors resize them (the
same pixels); float ones by torch's antialiased interpolation (close to Pillow's). A config
that turns on what these steps do not do (padding, tiling, pan and scan, pixel-count
sizing, ConvNeXt's crop percentage, any other ``do_*`` step, sizes rounded to multiples)
or names a processor whose steps differ (Perceiver's, LeViT's) is refused with a
:class:`GenerationError`, not given other pixels than its processor makes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import GenerationError

__all__ = ["ImagePreprocessor", "read_image"]

# Pillow's resampling filters by number, as preprocessor configs name them, and torch's
# mode for each where Pillow is missing (torch's "nearest-exact" is Pillow's NEAREST)
_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
_MODES = {0: "nearest-exact", 2: "bilinear", 3: "bicubic"}


def read_image(
    source: str | os.PathLike[str] | bytes, *, max_pixels: int | None = None
) -> torch.Tensor:
    """The image at ``source`` (a file's path, or the bytes of an image file) as
    ``uint8 [3, H, W]`` RGB pixels (needs Pillow). ``max_pixels``: the largest ``H * W``
    taken, checked from the image's header before its pixels are decoded (Pillow's own
    bound, about 179 million, applies besides).

    Raises :class:`~ptexec.errors.GenerationError` when the file is missing, is no image
    or is larger than ``max_pixels``."""
    import io

    try:
        from PIL import Image as PILImage
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise GenerationError("reading an image file needs Pillow (pip install pillow)") from e
    named = not isinstance(source, bytes | bytearray | memoryview)
    what = str(source) if named else "the image"
    try:
        with PILImage.open(Path(source) if named else io.BytesIO(source)) as im:  # type: ignore[arg-type]
            w, h = im.size
            if max_pixels is not None and w * h > max_pixels:
                raise GenerationError(f"{what} is {w}x{h} pixels, more than the {max_pixels} taken")
            from PIL import ImageOps

            # as a camera's EXIF orientation says it is shown (transformers' load_image)
            rgb = (ImageOps.exif_transpose(im) or im).convert("RGB")
            w, h = rgb.size
            data = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
    except FileNotFoundError:
        raise GenerationError(f"{what}: no such image file") from None
    except GenerationError:
        raise
    except Exception as e:  # Pillow raises several types for a file it cannot read
        raise GenerationError(f"{what}: not an image Pillow can read ({e})") from e
    return data.reshape(h, w, 3).permute(2, 0, 1).contiguous()


def _pillow() -> Any:
    """Pillow's ``Image`` module, or None without Pillow."""
    try:
        from PIL import Image as PILImage
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return PILImage


def _center_crop(x: torch.Tensor, ch: int, cw: int) -> torch.Tensor:
    """The ``ch`` x ``cw`` center of ``[C, H, W]`` pixels; an image smaller than that is
    padded with zeros around it first, as transformers' ``center_crop`` pads it."""
    h, w = int(x.shape[1]), int(x.shape[2])
    top, left = (h - ch) // 2, (w - cw) // 2
    if top >= 0 and left >= 0:
        return x[:, top : top + ch, left : left + cw]
    nh, nw = max(ch, h), max(cw, w)
    padded = x.new_zeros(x.shape[0], nh, nw)
    tp, lp = math.ceil((nh - h) / 2), math.ceil((nw - w) / 2)
    padded[:, tp : tp + h, lp : lp + w] = x
    top, left = max(top + tp, 0), max(left + lp, 0)
    return padded[:, top : top + ch, left : left + cw]


def _pair(value: Any, field: str) -> tuple[int, int] | int:
    """A ``size``/``crop_size`` entry as (height, width), or an int shortest edge."""
    if isinstance(value, bool):
        raise GenerationError(f"preprocessor {field} must be a size, got {value!r}")
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, Mapping):
        if "height" in value and "width" in value:
            return (int(value["height"]), int(value["width"]))
        if "shortest_edge" in value:
            return int(value["shortest_edge"])
    if isinstance(value, Sequence) and len(value) == 2 and not isinstance(value, str):
        return (int(value[0]), int(value[1]))
    raise GenerationError(
        f"preprocessor {field} must be an int, [height, width], {{height, width}} or "
        f"{{shortest_edge}}, got {value!r}"
    )


def _triple(value: Any, field: str) -> tuple[float, float, float]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (float(value),) * 3
    if isinstance(value, Sequence) and len(value) == 3 and not isinstance(value, str):
        return tuple(float(v) for v in value)  # type: ignore[return-value]
    raise GenerationError(f"preprocessor {field} must be a number or 3 numbers, got {value!r}")


MAX_RESIZED_PIXELS = 1 << 26
"""The most pixels a resize keeping the aspect ratio may make (a 2 x 6000 image taken to a
shortest edge of 224 would be 672,000 wide: gigabytes, from a few bytes of PNG)."""

# processors whose one-number ``size`` is a square (transformers' ``default_to_square``);
# others (CLIP's convention) read it as the shortest edge when a center crop follows
_SQUARE = frozenset(
    {"ViTImageProcessor", "DeiTImageProcessor", "BeitImageProcessor", "SiglipImageProcessor"}
)
# processors whose one-number ``size`` is the shortest edge with or without a center crop
_SHORTEST = frozenset(
    {
        "CLIPImageProcessor",
        "LlavaImageProcessor",
        "ChameleonImageProcessor",
        "BitImageProcessor",
        "MobileNetV1ImageProcessor",
        "MobileNetV2ImageProcessor",
    }
)

# settings of processors that do more than resize, crop, rescale and normalise one image:
# followed by none of ptexec's steps, so a config that turns one on is refused rather than
# given other pixels than its processor would make
_NOT_FOLLOWED = {
    "do_pad": "pads the image (to a square, or tiles)",
    "crop_pct": "resizes past the crop by a percentage (ConvNeXt)",
    "do_pan_and_scan": "adds crops of the image (Gemma 3's pan and scan)",
    "do_image_splitting": "splits the image into tiles",
    "image_grid_pinpoints": "tiles the image on a grid (LLaVA-NeXT's any resolution)",
    "max_image_tiles": "tiles the image",
    "do_thumbnail": "thumbnails and pads the image",
    "do_align_long_axis": "rotates the image to its long axis",
    "min_pixels": "sizes the image by its pixel count into patches (Qwen2-VL)",
    "max_pixels": "sizes the image by its pixel count into patches (Qwen2-VL)",
    "max_num_patches": "sizes the image by a patch budget (SigLIP 2's NaFlex)",
    "crop_to_patches": "crops the image into patches",
    "rescale_offset": "rescales to [-1, 1] with an offset (EfficientNet)",
    "keep_aspect_ratio": "keeps the aspect ratio within the size (DPT)",
    "ensure_multiple_of": "rounds the size to a multiple (DPT)",
    "size_divisor": "rounds the size to a multiple",
    "include_top": "divides by the std once more (EfficientNet)",
    "max_image_size": "sizes the image by its longest edge and pads it (Aria)",
    "split_image": "splits the image into tiles",
}
# what a setting of _NOT_FOLLOWED is when off, where that is not None, False or zero
_OFF: dict[str, Any] = {"ensure_multiple_of": 1}
# the do_* switches these steps follow; any other turned on is a step of its own (MobileViT's
# do_flip_channel_order, Nougat's do_crop_margin, ...), except those that change no pixel
_DO_FOLLOWED = frozenset(
    {"do_resize", "do_center_crop", "do_rescale", "do_normalize", "do_convert_rgb"}
)
_DO_NO_PIXEL = frozenset({"do_reduce_labels", "do_convert_annotations"})
# processors whose steps, named as these are, do other things
_KINDS_NOT_FOLLOWED = {
    "PerceiverImageProcessor": "center-crops before it resizes",
    "LevitImageProcessor": "resizes the shortest edge to 256/224 of its size",
}


def _processor_type(c: Mapping[str, Any]) -> str:
    """The processor class a config names: ``image_processor_type``, else a legacy
    ``feature_extractor_type`` (its ``ImageProcessor``, as transformers maps it), without a
    ``Fast`` suffix."""
    kind = str(c.get("image_processor_type") or "")
    if not kind:
        kind = str(c.get("feature_extractor_type") or "").replace(
            "FeatureExtractor", "ImageProcessor"
        )
    return kind.removesuffix("Fast")


def _refuse_what_is_not_followed(c: Mapping[str, Any]) -> None:
    """A :class:`GenerationError` naming the settings of ``c`` this preprocessor does not
    follow: :data:`_NOT_FOLLOWED`, any other ``do_*`` switch turned on that changes
    pixels, a processor whose steps differ (:data:`_KINDS_NOT_FOLLOWED`), and a
    ``longest_edge`` beside a ``shortest_edge``, which only CLIP's processor ignores."""
    found = [
        name
        for name in _NOT_FOLLOWED
        if c.get(name) not in (None, False, [], {}, 0, _OFF.get(name))
    ]
    found += [
        name
        for name, value in c.items()
        if name.startswith("do_")
        and name not in _NOT_FOLLOWED
        and name not in _DO_FOLLOWED | _DO_NO_PIXEL
        and value
    ]
    size = c.get("size")
    kind = _processor_type(c)
    if kind in _KINDS_NOT_FOLLOWED:
        found.append(kind)
    if (
        isinstance(size, Mapping)
        and size.get("longest_edge") is not None
        and "shortest_edge" in size
        and not kind.startswith("CLIP")
    ):
        found.append("size.longest_edge")
    if found:
        why = {
            **_NOT_FOLLOWED,
            **_KINDS_NOT_FOLLOWED,
            "size.longest_edge": "bounds the long edge too",
        }
        what = "; ".join(f"{n} ({why.get(n, 'a step of its own')})" for n in found)
        raise GenerationError(
            f"the image processor{' ' + kind if kind else ''} does more than ptexec's "
            f"resize, crop, rescale and normalise: {what}. Give the encoder's input as "
            "pixel_values from the model's own processor (generate_hf), or a config without them"
        )


def _refuse_class_defaults(c: Mapping[str, Any], where: Path) -> None:
    """A :class:`GenerationError` naming what a config read from a file leaves to its
    processor class: ``image_mean`` and ``image_std`` where it normalises, ``resample``
    where it resizes, ``do_center_crop`` beside a ``crop_size``. Their defaults differ from
    class to class (CLIP's mean is not SigLIP's, ViT resizes bilinearly and CLIP
    bicubically, CLIP crops by default, SuperPoint does not normalise: its saved config
    names no ``do_normalize``), so one taken here would give other pixels than the model's
    processor. ``save_pretrained`` writes them all."""
    missing = []
    if c.get("do_normalize", True):
        missing += [k for k in ("image_mean", "image_std") if k not in c]
    if c.get("do_resize", True) and "resample" not in c:
        missing.append("resample")
    if "crop_size" in c and "do_center_crop" not in c:
        missing.append("do_center_crop")
    if missing:
        kind = _processor_type(c)
        raise GenerationError(
            f"{where}: the config of {kind or 'the image processor'} leaves "
            f"{', '.join(missing)} to its class, whose defaults ptexec does not know; name "
            "them in the file (save_pretrained writes them) or give pixel_values from the "
            "model's own processor"
        )


class ImagePreprocessor:
    """Resize, crop, rescale and normalise pixels for a vision encoder.

    ``config`` holds a preprocessor config's fields (see the module docstring);
    ``target`` (height, width), when given, is the encoder's input size: the result always
    has it (a config without a size resizes straight to it).
    """

    def __init__(
        self, config: Mapping[str, Any] | None = None, target: tuple[int, int] | None = None
    ) -> None:
        c = dict(config or {})
        _refuse_what_is_not_followed(c)
        self.target = target
        self.do_resize = bool(c.get("do_resize", True))
        self.do_center_crop = bool(c.get("do_center_crop", False)) and "crop_size" in c
        self.crop_size = _pair(c["crop_size"], "crop_size") if self.do_center_crop else None
        size = c.get("size")
        kind = _processor_type(c)
        self.size: tuple[int, int] | int | None
        if isinstance(size, int) and not isinstance(size, bool) and kind in _SQUARE:
            self.size = (int(size), int(size))  # these processors read one number as a square
        elif (
            isinstance(size, int)
            and not isinstance(size, bool)
            and (self.do_center_crop or kind in _SHORTEST)
        ):
            # one number is the shortest edge for these processors, and before a center
            # crop (CLIP's convention; exporters flatten {"shortest_edge": n} to n in a
            # program's metadata)
            self.size = int(size)
        else:
            self.size = _pair(size, "size") if size is not None else target
        self.do_rescale = bool(c.get("do_rescale", True))
        self.rescale_factor = float(c.get("rescale_factor", 1 / 255))
        self.do_normalize = bool(c.get("do_normalize", True))
        self.mean = _triple(c.get("image_mean", 0.5), "image_mean")
        self.std = _triple(c.get("image_std", 0.5), "image_std")
        resample = c.get("resample", 3)
        if isinstance(resample, bool) or not isinstance(resample, int) or resample not in _FILTERS:
            raise GenerationError(
                f"preprocessor resample must be one of Pillow's filters {sorted(_FILTERS)}, "
                f"got {resample!r}"
            )
        self.resample = int(resample)
        """Pillow's filter number: uint8 pixels are resized by Pillow with it, as
        transformers' image processors resize them."""
        self.mode = _MODES.get(self.resample, "bicubic")

    @classmethod
    def from_dir(
        cls, path: str | os.PathLike[str], target: tuple[int, int] | None = None
    ) -> ImagePreprocessor:
        """The settings of ``preprocessor_config.json`` in the directory ``path``, else the
        ``image_processor`` entry of its ``processor_config.json``; one that leaves a
        setting to its processor class is refused (:func:`_refuse_class_defaults`)."""
        d = Path(path)
        for name, key in (
            ("preprocessor_config.json", None),
            ("processor_config.json", "image_processor"),
        ):
            f = d / name
            if f.is_file():
                try:
                    data = json.loads(f.read_text())
                except (OSError, ValueError) as e:
                    raise GenerationError(f"{f}: not a JSON preprocessor config ({e})") from e
                if key is not None:
                    data = data.get(key) if isinstance(data, dict) else None
                if isinstance(data, dict):
                    _refuse_class_defaults(data, f)
                    return cls(data, target)
        raise GenerationError(
            f"{d}: no preprocessor_config.json (or processor_config.json with an "
            "image_processor entry)"
        )

    def _resize(self, x: torch.Tensor, size: tuple[int, int], image: bool) -> torch.Tensor:
        """``x`` at ``size``; ``image``: its values are 0..255 integers (uint8 pixels), which
        Pillow resizes with the config's filter, as transformers does (else torch's
        interpolation, the same filter where torch has it)."""
        if tuple(x.shape[-2:]) == size:
            return x
        if image:
            pil = _pillow()
            if pil is not None:
                hwc = x.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous()
                im = pil.fromarray(hwc.numpy()).resize((size[1], size[0]), self.resample)
                out = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8)
                return out.reshape(size[0], size[1], 3).permute(2, 0, 1).float()
        if self.resample not in _MODES:
            raise GenerationError(
                f"resizing with Pillow's {_FILTERS[self.resample]} filter (resample "
                f"{self.resample}) needs Pillow and uint8 pixels (pip install pillow)"
            )
        nearest = self.mode == "nearest-exact"
        return torch.nn.functional.interpolate(
            x.unsqueeze(0),
            size=size,
            mode=self.mode,
            antialias=not nearest,
            align_corners=None if nearest else False,
        )[0]

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """``pixels`` (``[C, H, W]``, uint8 0..255 or float on that scale; an alpha channel
        is dropped) as the encoder's float32 ``[3, H', W']`` input."""
        if pixels.dim() != 3 or pixels.shape[0] not in (1, 3, 4):
            raise GenerationError(
                f"image pixels must be [C, H, W] with 1, 3 or 4 channels, got {list(pixels.shape)}"
            )
        x = pixels[:3].float() if pixels.shape[0] != 1 else pixels.float().expand(3, -1, -1)
        image = pixels.dtype == torch.uint8
        h, w = int(x.shape[1]), int(x.shape[2])
        if self.do_resize and self.size is not None:
            if isinstance(self.size, int):  # shortest edge, aspect ratio kept
                if h == 0 or w == 0:
                    raise GenerationError(
                        f"the {h}x{w} image has no pixels: no aspect ratio to resize it by"
                    )
                short, long = (h, w) if h <= w else (w, h)
                new_long = int(self.size * long / short)
                size = (self.size, new_long) if h <= w else (new_long, self.size)
            else:
                size = self.size
            if size[0] * size[1] > MAX_RESIZED_PIXELS:
                raise GenerationError(
                    f"resizing the {h}x{w} image keeping its aspect ratio makes it "
                    f"{size[0]}x{size[1]} pixels, more than the {MAX_RESIZED_PIXELS} taken"
                )
            x = self._resize(x, size, image)
            if image:
                x = x.round().clamp(0, 255)  # resized as an image, as Pillow does
        if self.crop_size is not None:
            ch, cw = self.crop_size if isinstance(self.crop_size, tuple) else (self.crop_size,) * 2
            x = _center_crop(x, ch, cw)
        if self.target is not None and tuple(x.shape[-2:]) != self.target:
            x = self._resize(x, self.target, image)
        if self.do_rescale:
            x = x * self.rescale_factor
        if self.do_normalize:
            mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(3, 1, 1)
            std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(3, 1, 1)
            x = (x - mean) / std
        return x.contiguous()

    def __repr__(self) -> str:
        return (
            f"ImagePreprocessor(size={self.size}, crop={self.crop_size}, mode={self.mode}, "
            f"mean={self.mean}, std={self.std})"
        )
