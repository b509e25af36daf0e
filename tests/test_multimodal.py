"""Images and audio into an LLM: ``MultimodalRunner`` against the eager Hugging Face model.

The programs are tiny random LLaVA (image-text) and Voxtral (audio-text) models exported by
optimum-executorch (``multimodal_models.py``: cached per machine, minutes to export on two
cores, so those tests are ``slow``). References: the same checkpoint's eager ``generate``
(greedy, and with a repetition penalty) on the same processor output, and optimum's own
generation loop on ExecuTorch's runtime over the same program. The preprocessing and input
tests run without a program, against transformers' image processor.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from ptexec.errors import GenerationError
from ptexec.llm import (
    GenerationConfig,
    ImagePreprocessor,
    MultimodalDecoder,
    MultimodalMethods,
    MultimodalRunner,
    make_audio_input,
    make_image_input,
    make_text_input,
    make_token_input,
    read_image,
)
from ptexec.llm.logits import RepetitionPenalty
from ptexec.llm.multimodal import hf_inputs

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import multimodal_models as mm  # noqa: E402

N = 12  # tokens generated per comparison


def _pixels(seed: int, h: int, w: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)


def _pil(pixels: torch.Tensor) -> Any:
    from PIL import Image

    return Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy())


# ---- without a program ------------------------------------------------------------------


def _clip(**kw: Any) -> Any:
    return transformers.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, **kw
    )


def test_preprocessing_equals_transformers_at_the_encoders_size(tmp_path: Path) -> None:
    hf = _clip()
    hf.save_pretrained(tmp_path)
    ours = ImagePreprocessor.from_dir(tmp_path, target=(32, 32))
    for seed in range(3):
        px = _pixels(seed, 32, 32)
        want = hf(images=_pil(px), return_tensors="pt")["pixel_values"][0]
        torch.testing.assert_close(ours(px), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("resample", [0, 1, 2, 3, 4, 5])
def test_resizing_equals_transformers_with_each_filter(tmp_path: Path, resample: int) -> None:
    """uint8 pixels are resized by Pillow with the config's filter, as transformers'
    processor resizes them: the same values, non-square sizes and odd crops included."""
    _equals_transformers(_clip(resample=resample), tmp_path, [(61, 77), (30, 41), (100, 37)])


def _equals_transformers(hf: Any, folder: Path, sizes: list[tuple[int, int]]) -> None:
    """The preprocessor read from ``hf``'s saved config gives ``hf``'s pixel values for
    uint8 images of these sizes."""
    hf.save_pretrained(folder)
    ours = ImagePreprocessor.from_dir(folder, target=(32, 32))
    for seed, (h, w) in enumerate(sizes):
        px = _pixels(seed, h, w)
        want = hf(images=_pil(px), return_tensors="pt")["pixel_values"][0]
        torch.testing.assert_close(ours(px), want, rtol=0, atol=1e-5)


def test_float_pixels_are_resized_by_torch_close_to_pillow(tmp_path: Path) -> None:
    """Float pixels take torch's filter of the same name (Pillow's NEAREST is torch's
    nearest-exact, not nearest); on a smooth image they agree with Pillow up to rounding."""
    for resample in (3, 0):
        hf = _clip(resample=resample)
        hf.save_pretrained(tmp_path)
        ours = ImagePreprocessor.from_dir(tmp_path, target=(32, 32))
        y = torch.linspace(0, 255, 48).view(1, 48, 1)
        x = torch.linspace(0, 255, 64).view(1, 1, 64)
        px = torch.cat([y.expand(1, 48, 64), x.expand(1, 48, 64), (y + x).expand(1, 48, 64) / 2])
        px = px.round()
        want = hf(images=_pil(px.to(torch.uint8)), return_tensors="pt")["pixel_values"][0]
        got = ours(px)
        assert got.shape == want.shape == (3, 32, 32)
        assert (got - want).abs().max() < 0.1, resample  # about 6 of 255 levels


def test_a_crop_larger_than_the_image_pads_it_as_transformers(tmp_path: Path) -> None:
    hf = transformers.CLIPImageProcessor(
        size={"shortest_edge": 24}, crop_size={"height": 32, "width": 32}
    )
    _equals_transformers(hf, tmp_path, [(24, 40), (50, 30), (24, 24)])


def test_a_square_processors_one_number_size_is_a_square(tmp_path: Path) -> None:
    """DeiT's (as ViT's) ``size: 256`` is 256 x 256 before its crop, not CLIP's shortest
    edge: transformers' pixels, on images that are not square."""
    import json

    config = {"image_processor_type": "DeiTImageProcessor", "size": 40, "crop_size": 32,
              "do_center_crop": True, "resample": 3, "image_mean": 0.5, "image_std": 0.5}  # fmt: skip
    legacy = {k: v for k, v in config.items() if k != "image_processor_type"}
    legacy["feature_extractor_type"] = "DeiTFeatureExtractor"  # an older file names it so
    for written in (config, legacy):
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(written))
        hf = transformers.DeiTImageProcessor.from_pretrained(tmp_path)
        ours = ImagePreprocessor.from_dir(tmp_path, target=(32, 32))
        for seed, (h, w) in enumerate([(61, 77), (100, 37)]):
            px = _pixels(seed, h, w)
            want = hf(images=_pil(px), return_tensors="pt")["pixel_values"][0]
            torch.testing.assert_close(ours(px), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "kind", ["CLIPImageProcessor", "LlavaImageProcessor", "MobileNetV2ImageProcessor"]
)
def test_a_shortest_edge_processors_one_number_size_keeps_the_aspect_ratio(
    tmp_path: Path, kind: str
) -> None:
    """CLIP's convention: ``size: 40`` without a center crop is the shortest edge, the
    aspect ratio kept (61 x 77 becomes 40 x 50), as transformers' processor resizes it."""
    config = {"image_processor_type": kind, "size": 40, "do_center_crop": False,
              "resample": 3, "image_mean": 0.5, "image_std": 0.5}  # fmt: skip
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    hf = getattr(transformers, kind).from_pretrained(tmp_path)
    ours = ImagePreprocessor.from_dir(tmp_path)
    for seed, (h, w) in enumerate([(61, 77), (90, 50)]):
        px = _pixels(seed, h, w)
        want = hf(images=_pil(px), return_tensors="pt")["pixel_values"][0]
        torch.testing.assert_close(ours(px), want, rtol=0, atol=1e-5)


def test_processors_doing_more_than_ptexec_are_refused_not_followed(tmp_path: Path) -> None:
    """Settings that pad, tile, pan and scan, size by pixel count or crop by a percentage:
    each refused by name (ptexec made other pixels than transformers' processor, of the
    encoder's shape: a silent wrong answer)."""
    configs = [
        transformers.ConvNextImageProcessor(size={"shortest_edge": 32}, crop_pct=0.875),
        transformers.LlavaImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, do_pad=True
        ),
        {
            "image_processor_type": "Qwen2VLImageProcessor",
            "min_pixels": 3136,
            "max_pixels": 12845056,
            "size": {"shortest_edge": 3136, "longest_edge": 12845056},
        },
        {
            "image_processor_type": "Idefics2ImageProcessor",
            "size": {"shortest_edge": 378, "longest_edge": 980},
        },
        {
            "image_processor_type": "Gemma3ImageProcessor",
            "do_pan_and_scan": True,
            "size": {"height": 32, "width": 32},
        },
    ]
    configs.append({"image_processor_type": "Siglip2ImageProcessor", "max_num_patches": 256})
    names = ["crop_pct", "do_pad", "min_pixels", "longest_edge", "do_pan_and_scan",
             "max_num_patches"]  # fmt: skip
    for config, name in zip(configs, names, strict=True):
        if not isinstance(config, dict):
            config.save_pretrained(tmp_path)
            with pytest.raises(GenerationError, match=name):
                ImagePreprocessor.from_dir(tmp_path, target=(32, 32))
        else:
            with pytest.raises(GenerationError, match=name):
                ImagePreprocessor(config, target=(32, 32))
    # CLIP ignores a longest_edge beside its shortest edge, as transformers' does
    clip = transformers.CLIPImageProcessor(
        size={"shortest_edge": 32, "longest_edge": 64}, crop_size={"height": 32, "width": 32}
    )
    _equals_transformers(clip, tmp_path, [(61, 77)])
    # a few bytes of a 2 x 6000 image would be resized to 224 x 672000: refused
    wide = ImagePreprocessor({"size": {"shortest_edge": 224}, "crop_size": 224,
                              "do_center_crop": True})  # fmt: skip
    with pytest.raises(GenerationError, match="more than"):
        wide(torch.zeros(3, 2, 6000, dtype=torch.uint8))


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t.MobileViTImageProcessor(  # BGR: its channels flipped
            size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}
        ),
        lambda t: t.EfficientNetImageProcessor(  # to [-1, 1] with an offset
            size={"height": 32, "width": 32}, rescale_offset=True, include_top=False
        ),
        lambda t: t.EfficientNetImageProcessor(  # divided by the std twice
            size={"height": 32, "width": 32}
        ),
        lambda t: t.AriaImageProcessor(),  # its longest edge to 980, padded to a square
        lambda t: t.DPTImageProcessor(  # the aspect ratio kept, sides multiples of 8
            size={"height": 32, "width": 32}, keep_aspect_ratio=True, ensure_multiple_of=8
        ),
        lambda t: t.GLPNImageProcessor(size_divisor=16),  # sides rounded down to 16
        lambda t: t.PerceiverImageProcessor(  # crops before it resizes
            crop_size={"height": 48, "width": 48}, size={"height": 32, "width": 32}
        ),
        lambda t: t.LevitImageProcessor(  # the shortest edge to 256/224 of its size
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        ),
    ],
    ids=[
        "mobilevit",
        "efficientnet",
        "efficientnet_top",
        "aria",
        "dpt",
        "glpn",
        "perceiver",
        "levit",
    ],
)
def test_a_processor_with_steps_of_its_own_gives_its_pixels_or_is_refused(
    tmp_path: Path, make: Any
) -> None:
    """Processors that flip channels, offset the rescale, size to multiples, crop first
    or scale their shortest edge: their saved config gives transformers' pixels, or a
    GenerationError, never other pixels."""
    hf = make(transformers)
    hf.save_pretrained(tmp_path)
    try:
        ours = ImagePreprocessor.from_dir(tmp_path, target=(32, 32))
    except GenerationError:
        return
    for seed, (h, w) in enumerate([(61, 77), (90, 50)]):
        px = _pixels(seed, h, w)
        want = hf(images=_pil(px), return_tensors="pt")["pixel_values"][0]
        torch.testing.assert_close(ours(px), want, rtol=0, atol=1e-5)


def test_a_config_leaving_settings_to_its_class_is_refused(tmp_path: Path) -> None:
    """SuperPoint's saved config names no normalisation (its class does none) and a
    hand-written CLIP config without a mean, a filter or whether it crops takes CLIP's:
    taking ptexec's own for any gives other pixels than transformers' processor, so each
    is refused, naming what is left out; named, the same config gives the processor's
    pixels."""
    transformers.SuperPointImageProcessor(size={"height": 32, "width": 32}).save_pretrained(
        tmp_path
    )
    with pytest.raises(GenerationError, match="image_mean, image_std"):
        ImagePreprocessor.from_dir(tmp_path, target=(32, 32))
    config = {"image_processor_type": "CLIPImageProcessor", "size": 32, "crop_size": 32}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    hf = transformers.CLIPImageProcessor.from_pretrained(tmp_path)
    with pytest.raises(GenerationError, match="image_mean, image_std, resample, do_center_crop"):
        ImagePreprocessor.from_dir(tmp_path, target=(32, 32))
    named = {**config, "image_mean": hf.image_mean, "image_std": hf.image_std, "resample": 3,
             "do_center_crop": True}  # fmt: skip
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(named))
    ours = ImagePreprocessor.from_dir(tmp_path, target=(32, 32))
    px = _pixels(0, 61, 77)
    want = hf(images=_pil(px), return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(ours(px), want, rtol=0, atol=1e-5)


def test_preprocessor_reads_processor_config_and_refuses_bad_settings(tmp_path: Path) -> None:
    import json

    (tmp_path / "processor_config.json").write_text(
        json.dumps(
            {
                "image_processor": {
                    "size": {"height": 8, "width": 4},
                    "image_mean": 0.0,
                    "image_std": 1.0,
                    "resample": 3,
                }
            }
        )
    )
    p = ImagePreprocessor.from_dir(tmp_path)
    out = p(torch.full((3, 16, 8), 255, dtype=torch.uint8))
    assert out.shape == (3, 8, 4)
    torch.testing.assert_close(out, torch.ones(3, 8, 4))
    with pytest.raises(GenerationError, match="size"):
        ImagePreprocessor({"size": "big"})
    with pytest.raises(GenerationError, match="no preprocessor_config"):
        ImagePreprocessor.from_dir(tmp_path / "missing")


def test_read_image_turns_a_photo_as_its_exif_orientation_says(tmp_path: Path) -> None:
    from PIL import Image
    from transformers.image_utils import load_image

    px = _pixels(5, 30, 50)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to show
    _pil(px).save(tmp_path / "photo.jpg", exif=exif.tobytes(), quality=95)
    got = read_image(tmp_path / "photo.jpg")
    want = torch.from_numpy(__import__("numpy").asarray(load_image(str(tmp_path / "photo.jpg"))))
    assert got.shape == (3, 50, 30)
    assert torch.equal(got, want.permute(2, 0, 1))


def test_audio_inputs_keep_their_dtype() -> None:
    """Raw audio is one clip of float samples or integer PCM (scaled as a WAV reader
    scales it); features keep their dtype; other kinds are refused."""
    from ptexec.llm import make_raw_audio_input
    from ptexec.llm.multimodal import _bytes_tensor

    wave = torch.linspace(-1, 1, 64)
    pcm = (wave * 32767).round().to(torch.int16)
    raw = make_raw_audio_input(pcm.reshape(1, 1, -1)).get_raw_audio()
    assert raw is not None and raw.dtype == torch.float64
    torch.testing.assert_close(_bytes_tensor(raw.data, 64, stored=raw.dtype),
                               pcm.double() / 32768)  # fmt: skip
    for bad in (torch.zeros(1, 1, 8, dtype=torch.uint8), torch.zeros(2, 1, 8)):
        with pytest.raises(RuntimeError):
            make_raw_audio_input(bad)
    half = torch.randn(1, 4, 6).half()
    feats = make_audio_input(half).get_audio()
    assert feats is not None and feats.dtype == torch.float16
    assert torch.equal(_bytes_tensor(feats.data, 24, torch.bfloat16, feats.dtype), half.flatten())
    with pytest.raises(RuntimeError, match="floating point"):
        make_audio_input(torch.zeros(1, 4, 6, dtype=torch.int32))


def test_read_image_gives_rgb_pixels(tmp_path: Path) -> None:
    px = _pixels(4, 5, 7)
    _pil(px).save(tmp_path / "x.png")
    assert torch.equal(read_image(tmp_path / "x.png"), px)
    (tmp_path / "bad.png").write_text("no image")
    with pytest.raises(GenerationError, match="not an image"):
        read_image(tmp_path / "bad.png")


def test_method_conventions() -> None:
    et = MultimodalMethods.find(
        ["text_decoder", "token_embedding", "vision_encoder", "get_max_seq_len"]
    )
    assert et is not None and (et.embedding, et.decoder, et.decode, et.vision, et.audio) == (
        "token_embedding",
        "text_decoder",
        "text_decoder",
        "vision_encoder",
        None,
    )
    old = MultimodalMethods.find(["decoder", "token_embeddings", "image_encoder"])
    assert old is not None and (old.embedding, old.decoder, old.vision) == (
        "token_embeddings",
        "decoder",
        "image_encoder",
    )
    gemma = MultimodalMethods.find(["embed_text", "prefill", "decode", "vision_encoder"])
    assert gemma is not None and (gemma.decoder, gemma.decode) == ("prefill", "decode")
    assert MultimodalMethods.find(["forward", "get_max_seq_len"]) is None


def test_hf_processor_output_becomes_ids_then_pixels() -> None:
    ids = torch.tensor([[1, 5, 3, 3, 3, 6]])
    pixels = torch.rand(1, 3, 4, 4)
    items = hf_inputs({"input_ids": ids, "pixel_values": pixels})
    assert [i.type for i in items] == ["tokens", "image"]
    assert items[0].get_tokens() == [1, 5, 3, 3, 3, 6]
    image = items[1].get_image()
    assert image is not None and image.is_float()
    torch.testing.assert_close(image.to_tensor(), pixels[0])
    feats = torch.rand(2, 16, 20)
    items = hf_inputs({"input_ids": ids, "input_features": feats})
    assert [i.type for i in items] == ["tokens", "audio"]
    with pytest.raises(GenerationError, match="input_ids"):
        hf_inputs({"pixel_values": pixels})


# ---- the exported models ------------------------------------------------------------------


def _model(name: str) -> Path:
    """The exported model's directory (skips without optimum-executorch)."""
    pytest.importorskip("optimum.exporters.executorch")
    return mm.model_dir(name)


@pytest.fixture(scope="module")
def llava() -> Path:
    return _model("llava")


def _runner(d: Path, **kw: Any) -> MultimodalRunner:
    ck = d / "checkpoint"
    return MultimodalRunner(
        str(d / "model.pte"), str(ck / "tokenizer.json"), processor=ck, print_output=False, **kw
    )


def _greedy(**kw: Any) -> GenerationConfig:
    return GenerationConfig(temperature=0.0, max_new_tokens=N, echo=False, **kw)


def _eager_image(
    d: Path,
    pixels: torch.Tensor | list[torch.Tensor],
    prompt: str = mm.PROMPTS["image"],
    processing: dict[str, Any] | None = None,
    **generate: Any,
) -> tuple[Any, list[int]]:
    """The processor's inputs for ``prompt`` and the image(s), and the eager model's
    greedy tokens after them."""
    ck = d / "checkpoint"
    processor = transformers.AutoProcessor.from_pretrained(ck)
    model = transformers.LlavaForConditionalGeneration.from_pretrained(ck).eval()
    images = [_pil(p) for p in pixels] if isinstance(pixels, list) else _pil(pixels)
    inputs = processor(text=prompt, images=images, return_tensors="pt", **(processing or {}))
    with torch.no_grad():
        out = model.generate(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            pixel_values=inputs["pixel_values"],
            max_new_tokens=N,
            do_sample=False,
            **generate,
        )
    return inputs, out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llava", "llava_portable"])
def test_image_prompt_gives_the_eager_models_greedy_tokens(name: str) -> None:
    d = _model(name)
    runner = _runner(d)
    assert runner.multimodal and runner.decoder.has("image")
    for seed in (0, 1):
        inputs, want = _eager_image(d, _pixels(seed, 40, 30))
        assert len(set(want)) > 2  # the image matters and the model does not repeat one id
        text = runner.generate_text_hf(inputs, _greedy())
        assert runner.generated_tokens == want
        assert text == runner.tokenizer.decode(want, skip_special_tokens=True)
        runner.reset()


@pytest.mark.slow
def test_image_placements_all_give_the_same_tokens(llava: Path) -> None:
    """A processor's expanded placeholders, one placeholder in the text, and ExecuTorch's
    [text, image, text] list with uint8 pixels preprocessed by ptexec (32x32: no resize)."""
    px = _pixels(7, 32, 32)
    inputs, want = _eager_image(llava, px)
    runner = _runner(llava)
    before, after = mm.PROMPTS["image"].split("<image>")
    ways = [
        hf_inputs(inputs),
        [make_text_input(mm.PROMPTS["image"]), make_image_input(px)],
        [make_text_input(before), make_image_input(px), make_text_input(after)],
        [make_text_input(before), make_image_input(px.permute(1, 2, 0)), make_text_input(after)],
    ]
    for items in ways:
        runner.generate(items, _greedy())
        assert runner.generated_tokens == want
        assert runner.stats.num_prompt_tokens == inputs["input_ids"].shape[1]
        runner.reset()


@pytest.mark.slow
def test_preprocessing_from_the_programs_metadata(llava: Path) -> None:
    """optimum-executorch copies preprocessor_config.json into the program's metadata: a
    runner without a processor directory preprocesses the same (a 32x32 image: exact)."""
    px = _pixels(8, 32, 32)
    _, want = _eager_image(llava, px)
    bare = MultimodalRunner(
        str(llava / "model.pte"), str(llava / "checkpoint" / "tokenizer.json"), print_output=False
    )
    assert bare.decoder.image_settings()["image_mean"] == pytest.approx(
        [0.48145466, 0.4578275, 0.40821073]
    )
    bare.generate([make_text_input(mm.PROMPTS["image"]), make_image_input(px)], _greedy())
    assert bare.generated_tokens == want


@pytest.mark.slow
def test_repetition_penalty_equals_transformers_with_the_image_in_the_context(
    llava: Path,
) -> None:
    """Processors see the placeholder ids at the image rows, as transformers' input_ids."""
    inputs, want = _eager_image(llava, _pixels(3, 40, 30), repetition_penalty=1.5)
    runner = _runner(llava)
    runner.generate_hf(inputs, _greedy(logits_processor=RepetitionPenalty(1.5)))
    assert runner.generated_tokens == want


@pytest.mark.slow
@pytest.mark.parametrize("xnnpack", ["torch", "executorch"])
def test_xnnpack_runner_choice_gives_the_same_tokens(llava: Path, xnnpack: str) -> None:
    """The load option reaches every method: ptexec's runner and ExecuTorch's XNNPACK
    backend (which refuses at load when it cannot run a payload) give the eager tokens."""
    inputs, want = _eager_image(llava, _pixels(4, 40, 30))
    runner = _runner(llava, xnnpack=xnnpack)
    runner.generate_hf(inputs, _greedy())
    assert runner.generated_tokens == want


@pytest.mark.slow
def test_min_p_equals_transformers_warpers_with_the_image_in_the_context(llava: Path) -> None:
    tp = pytest.importorskip("transformers.generation.logits_process")
    inputs, _ = _eager_image(llava, _pixels(6, 40, 30))
    runner = _runner(llava)
    warpers = [tp.TemperatureLogitsWarper(0.8), tp.MinPLogitsWarper(0.2)]
    for seed in range(3):
        runs = []
        for config in (
            GenerationConfig(temperature=0.8, top_p=1.0, min_p=0.2, seed=seed),
            GenerationConfig(temperature=1.0, top_p=1.0, seed=seed, logits_processor=warpers),
        ):
            config.max_new_tokens, config.echo, config.ignore_eos = N, False, True
            runner.reset()
            runner.generate_hf(inputs, config)
            runs.append(list(runner.generated_tokens))
        assert runs[0] == runs[1], seed


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", "none"]},
    },
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}


@pytest.mark.slow
def test_json_schema_generations_validate_on_50_seeds_after_an_image(
    llava: Path, tmp_path: Path
) -> None:
    """Random weights make any token plausible: only the grammar's mask keeps the text
    valid (the grammar starts after the image rows and the prompt). The checkpoint's
    tokenizer has no '{', '"' or digits (trained on a few sentences), so the runner reads
    the ids through a tokenizer of the same width that has them: the prompt is the
    processor's ids, and the grammar and the text use the runner's tokenizer."""
    import json
    import sys

    jsonschema = pytest.importorskip("jsonschema")
    from ptexec.llm.constrained import Grammar, Vocabulary

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import llm_programs

    spec = llm_programs.TinyLlama(vocab_size=mm.VOCAB, bos_id=mm.BOS, eos_id=mm.EOS)
    tok = llm_programs.make_tokenizer(tmp_path / "tokenizer.json", spec)
    runner = MultimodalRunner(
        str(llava / "model.pte"), str(tok), processor=llava / "checkpoint", print_output=False
    )
    vocab = Vocabulary.of(runner.tokenizer, runner.vocab_size, runner.eos_ids)
    grammar = Grammar.json_schema(vocab, SCHEMA)
    inputs, _ = _eager_image(llava, _pixels(9, 32, 32))
    outputs = set()
    for seed in range(50):
        runner.reset()
        config = GenerationConfig(
            temperature=1.0, top_p=1.0, seed=seed, max_new_tokens=64, echo=False,
            logits_processor=grammar,
        )  # fmt: skip
        text = runner.generate_text_hf(inputs, config)
        assert runner.finish_reason == "stop", (seed, text)
        jsonschema.validate(json.loads(text), SCHEMA)
        outputs.add(text)
    assert len(outputs) > 40  # sampled, not one answer


@pytest.mark.slow
def test_sampling_streaming_stats_and_continuing(llava: Path) -> None:
    px = _pixels(5, 32, 32)
    runner = _runner(llava)
    items = [make_text_input(mm.PROMPTS["image"]), make_image_input(px)]
    runs = []
    for _ in range(2):
        pieces: list[str] = []
        seen: list[Any] = []
        cfg = GenerationConfig(temperature=1.0, top_k=20, seed=11, max_new_tokens=N, echo=False)
        text = runner.generate_text(items, cfg, pieces.append, seen.append)
        assert "".join(pieces) == text
        runs.append(list(runner.generated_tokens))
        stats = seen[0]
        assert stats.num_prompt_tokens == 16 + len(runner.tokenizer.encode(mm.PROMPTS["image"])) - 1
        assert stats.num_generated_tokens == len(runner.generated_tokens)
        assert stats.aggregate_model_execution_time_ms > 0
        runner.reset()
    assert runs[0] == runs[1]  # one seed, one generation
    # a generation continues the context: an empty prompt after prefill()
    runner = _runner(llava, temperature=0.0)
    runner.prefill(items)
    runner.generate([], _greedy())
    _, want = _eager_image(llava, px)
    assert runner.generated_tokens == want


@pytest.mark.slow
def test_refusals_name_the_problem(llava: Path) -> None:
    runner = _runner(llava)
    px = _pixels(1, 32, 32)
    with pytest.raises(GenerationError, match="placeholder"):
        runner.generate([make_text_input("<image> and <image>"), make_image_input(px)], _greedy())
    with pytest.raises(GenerationError, match="no audio encoder"):
        runner.generate([make_audio_input(torch.zeros(1, 16, 200))], _greedy())
    with pytest.raises(GenerationError, match="preprocessed pixel values"):
        runner.generate([make_image_input(torch.rand(3, 20, 20))], _greedy())
    with pytest.raises(GenerationError, match=r"placeholders \(token 3\) do not hold"):
        runner.generate([make_token_input([1, 3, 3, 5]), make_image_input(px)], _greedy())
    runner.generate([make_text_input(mm.PROMPTS["image"]), make_image_input(px)], _greedy())
    assert len(runner.generated_tokens) > 1  # nothing refused changed the runner


@pytest.mark.slow
def test_optimum_loop_on_executorch_gives_the_same_tokens(llava: Path, tmp_path: Path) -> None:
    """optimum-executorch's ExecuTorchModelForMultiModalToText runs the program on
    ExecuTorch's runtime with its own greedy loop."""
    from optimum.executorch import ExecuTorchModelForMultiModalToText

    shutil.copy(llava / "checkpoint" / "config.json", tmp_path / "config.json")
    (tmp_path / "model.pte").symlink_to(llava / "model.pte")
    inputs, want = _eager_image(llava, _pixels(2, 40, 30))
    et = ExecuTorchModelForMultiModalToText.from_pretrained(str(tmp_path))
    et.tokenizer = transformers.AutoTokenizer.from_pretrained(llava / "checkpoint")
    prompt = inputs["input_ids"]
    got = et.generate(
        prompt,
        echo=True,  # its loop returns every generated token then
        max_seq_len=prompt.shape[1] + N,
        multimodal_features=inputs["pixel_values"],
    )
    runner = _runner(llava)
    runner.generate_hf(inputs, GenerationConfig(temperature=0.0, echo=False, max_new_tokens=N - 1))
    assert got[: len(runner.generated_tokens)] == runner.generated_tokens == want[: N - 1]


@pytest.mark.slow
def test_cli_generates_from_an_image_file(llava: Path, tmp_path: Path, capsys: Any) -> None:
    from ptexec.cli import main

    px = _pixels(6, 32, 32)
    _pil(px).save(tmp_path / "cat.png")
    _, want = _eager_image(llava, px)
    ck = llava / "checkpoint"
    rc = main(
        [
            "generate",
            str(llava / "model.pte"),
            "--tokenizer",
            str(ck / "tokenizer.json"),
            "--processor",
            str(ck),
            "--image",
            str(tmp_path / "cat.png"),
            "--prompt",
            mm.PROMPTS["image"],
            "--temperature",
            "0",
            "--max-new-tokens",
            str(N),
            "--no-echo",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    from ptexec.llm import load_tokenizer

    assert out.out.rstrip("\n") == load_tokenizer(ck / "tokenizer.json").decode(
        want, skip_special_tokens=True
    )


# ---- audio --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def voxtral() -> Path:
    return _model("voxtral")


def _wave(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(32000) / 16000
    return 0.3 * torch.sin(2 * torch.pi * (200 + 300 * seed) * t) + 0.05 * torch.randn(
        32000, generator=g
    )


def _eager_audio(d: Path, features: torch.Tensor, rows: int) -> tuple[list[int], list[int]]:
    ck = d / "checkpoint"
    tok = transformers.AutoTokenizer.from_pretrained(ck)
    model = transformers.VoxtralForConditionalGeneration.from_pretrained(ck).eval()
    before, after = mm.PROMPTS["audio"].split("<audio>")
    ids = (
        tok.encode(before, add_special_tokens=False)
        + [mm.AUDIO] * rows
        + tok.encode(after, add_special_tokens=False)
    )
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            input_features=features,
            max_new_tokens=N,
            do_sample=False,
        )
    return ids, out[0, len(ids) :].tolist()


@pytest.mark.slow
def test_audio_prompt_gives_the_eager_models_greedy_tokens(voxtral: Path) -> None:
    from ptexec.llm import audio_features

    ck = voxtral / "checkpoint"
    runner = _runner(voxtral)
    assert runner.decoder.has("audio")
    for seed in (0, 1):
        feats = audio_features(_wave(seed), 16000, ck)
        assert feats.shape == (1, 16, 200)
        ids, want = _eager_audio(voxtral, feats, 25)
        assert len(set(want)) > 2
        # one placeholder in the text, widened to the encoder's 25 rows
        runner.generate([make_text_input(mm.PROMPTS["audio"]), make_audio_input(feats)], _greedy())
        assert runner.generated_tokens == want
        runner.reset()
        # the expanded ids (what a processor writes), and raw samples through the extractor
        raw = make_audio_input(feats)
        runner.generate([make_token_input(ids), raw], _greedy())
        assert runner.generated_tokens == want
        runner.reset()
        samples = _wave(seed).reshape(1, 1, -1).contiguous()
        from ptexec.llm import make_raw_audio_input

        runner.generate([make_token_input(ids), make_raw_audio_input(samples)], _greedy())
        assert runner.generated_tokens == want
        runner.reset()


@pytest.mark.slow
def test_bos_begins_the_prompt_when_an_image_comes_first(llava: Path) -> None:
    """Media before the text (the command line's order without a placeholder): the BOS
    asked for is the prompt's first id, the image rows after it, as with a placeholder."""
    runner = _runner(llava)
    bos = runner.tokenizer.bos_id
    pixels = _pixels(1, 32, 32)
    config = _greedy(num_bos=1)
    first = [make_image_input(pixels), make_text_input("USER: What is this? ASSISTANT:")]
    runner.generate(first, config)
    got = list(runner.generated_tokens)
    runner.reset()
    tok = transformers.AutoTokenizer.from_pretrained(llava / "checkpoint")
    ids = [bos, *tok.encode("USER: What is this? ASSISTANT:", add_special_tokens=False)]
    runner.generate([make_token_input(ids[:1]), make_image_input(pixels),
                     make_token_input(ids[1:])], _greedy())  # fmt: skip
    assert runner.generated_tokens == got


@pytest.mark.slow
def test_audio_longer_than_a_window_is_every_window(voxtral: Path) -> None:
    """Raw audio of 1.5 windows is two windows of features (the last padded), as
    transformers' Voxtral processor splits it, and the model hears all of it: the eager
    model's tokens on both windows, not on the first alone."""
    from ptexec.llm import audio_features, make_raw_audio_input

    ck = voxtral / "checkpoint"
    fe = transformers.WhisperFeatureExtractor.from_pretrained(ck)
    wave = torch.cat([_wave(0), _wave(1)[:16000]])  # 3 s; the tiny extractor's window is 2 s
    want_feats = fe(wave.numpy(), sampling_rate=16000, padding=True, truncation=False,
                    pad_to_multiple_of=fe.n_samples, return_tensors="pt")["input_features"]  # fmt: skip
    want_feats = want_feats.reshape(fe.feature_size, -1, fe.nb_max_frames).transpose(0, 1)
    feats = audio_features(wave, 16000, ck)
    assert feats.shape == (2, 16, 200)
    torch.testing.assert_close(feats, want_feats)
    _, want = _eager_audio(voxtral, want_feats, 50)
    _, first_only = _eager_audio(voxtral, feats[:1], 25)
    assert want != first_only
    runner = _runner(voxtral)
    runner.generate(
        [make_text_input(mm.PROMPTS["audio"]), make_raw_audio_input(wave.reshape(1, 1, -1))],
        _greedy(),
    )
    assert runner.generated_tokens == want and runner.stats.num_prompt_tokens > 50


@pytest.mark.slow
def test_a_processors_padding_and_placeholders_are_honoured(llava: Path) -> None:
    """A padded processor output prefills its ids without the padding (the eager model's
    tokens with the mask); pixels without an image placeholder in the ids are refused, as
    the eager model refuses them, not put after the prompt."""
    ck = llava / "checkpoint"
    processor = transformers.AutoProcessor.from_pretrained(ck)
    model = transformers.LlavaForConditionalGeneration.from_pretrained(ck).eval()
    pixels = _pixels(3, 32, 32)
    processor.tokenizer.padding_side = "left"
    padded = processor(text=mm.PROMPTS["image"], images=_pil(pixels), return_tensors="pt",
                       padding="max_length", max_length=48)  # fmt: skip
    assert int((padded["attention_mask"] == 0).sum()) > 0
    with torch.no_grad():
        out = model.generate(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                             pixel_values=padded["pixel_values"], max_new_tokens=N,
                             do_sample=False)  # fmt: skip
    want = out[0, padded["input_ids"].shape[1] :].tolist()
    runner = _runner(llava)
    runner.generate_hf(padded, _greedy())
    assert runner.generated_tokens == want
    runner.reset()
    bare = processor(text="USER: What is this? ASSISTANT:", images=_pil(pixels),
                     return_tensors="pt")  # fmt: skip
    with pytest.raises(GenerationError, match="no image placeholder"):
        runner.generate_hf(bare, _greedy())
    holes = dict(padded)
    holes["attention_mask"] = padded["attention_mask"].clone()
    holes["attention_mask"][0, -3] = 0
    with pytest.raises(GenerationError, match="attention_mask"):
        runner.generate_hf(holes, _greedy())


@pytest.mark.slow
def test_cli_generates_from_a_wav_file(voxtral: Path, tmp_path: Path, capsys: Any) -> None:
    import wave

    from ptexec.cli import main
    from ptexec.llm import audio_features, load_tokenizer

    samples = _wave(2)
    pcm = (samples.clamp(-1, 1) * 32767).round().to(torch.int16)
    with wave.open(str(tmp_path / "a.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.numpy().tobytes())
    ck = voxtral / "checkpoint"
    feats = audio_features(pcm.float() / 32768, 16000, ck)
    _, want = _eager_audio(voxtral, feats, 25)
    rc = main(
        ["generate", str(voxtral / "model.pte"), "--tokenizer", str(ck / "tokenizer.json"),
         "--processor", str(ck), "--audio", str(tmp_path / "a.wav"), "--prompt",
         mm.PROMPTS["audio"], "--temperature", "0", "--max-new-tokens", str(N), "--no-echo"]
    )  # fmt: skip
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.out.rstrip("\n") == load_tokenizer(ck / "tokenizer.json").decode(
        want, skip_special_tokens=True
    )


# ---- CUDA ----------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("name", ["llava_portable", "llava"])
def test_image_prompt_on_cuda_gives_the_cpus_tokens(name: str) -> None:
    d = _model(name)
    inputs, want = _eager_image(d, _pixels(0, 40, 30))
    runner = _runner(d, device_map="cuda")
    assert runner.decoder.device.type == "cuda"
    runner.generate_hf(inputs, _greedy())
    assert runner.generated_tokens == want


@pytest.mark.slow
def test_cuda_without_a_gpu_is_refused_at_load(llava: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    from ptexec.errors import DeviceUnavailableError

    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        _runner(llava, device_map="cuda")


@pytest.mark.cuda
@pytest.mark.slow
def test_audio_prompt_on_cuda_gives_the_eager_models_tokens() -> None:
    from ptexec.llm import audio_features

    d = _model("voxtral")
    feats = audio_features(_wave(0), 16000, d / "checkpoint")
    _, want = _eager_audio(d, feats, 25)
    runner = _runner(d, device_map="cuda")
    runner.generate([make_text_input(mm.PROMPTS["audio"]), make_audio_input(feats)], _greedy())
    assert runner.generated_tokens == want


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_min_p_and_penalty_with_the_image_in_the_context() -> None:
    """Processors and min-p run on the logits' device: the penalised greedy tokens are the
    eager model's, and a seeded min-p generation is one generation."""
    d = _model("llava_portable")
    inputs, want = _eager_image(d, _pixels(3, 40, 30), repetition_penalty=1.5)
    runner = _runner(d, device_map="cuda")
    runner.generate_hf(inputs, _greedy(logits_processor=RepetitionPenalty(1.5)))
    assert runner.generated_tokens == want
    runs = []
    for _ in range(2):
        runner.reset()
        runner.generate_hf(inputs, GenerationConfig(temperature=0.8, min_p=0.2, seed=1,
                                                    max_new_tokens=N, echo=False))  # fmt: skip
        runs.append(list(runner.generated_tokens))
    assert runs[0] == runs[1]


def test_a_text_server_refuses_a_prompt_holding_the_image_placeholder(llava: Path) -> None:
    """``ptexec serve`` takes text only: a prompt whose text is the program's image
    placeholder ("<image>") has no image to put there, a 400 naming it (it was a 500)."""
    pytest.importorskip("starlette")
    from ptexec.serve.engine import Engine
    from ptexec.serve.protocol import ApiError, parse_request

    engine = Engine(llava / "model.pte", llava / "checkpoint" / "tokenizer.json", model_name="m")
    for body, chat in (
        ({"messages": [{"role": "user", "content": "<image>\nWhat is it?"}]}, True),
        ({"prompt": "USER: <image> hi ASSISTANT:", "max_tokens": 4}, False),
    ):
        with pytest.raises(ApiError, match="image placeholder") as e:
            engine.prepare(parse_request({"model": "m", **body}, chat=chat))
        assert e.value.status == 400
    job = engine.prepare(parse_request({"model": "m", "prompt": "USER: hi ASSISTANT:"}, chat=False))
    assert job.ids


def test_cli_text_alone_on_a_multimodal_program(llava: Path, capsys: Any) -> None:
    """A prompt without media to a multimodal program (no ``forward``) is the runner's
    text answer, not a missing-method error; ``--compile`` reports each of its methods."""
    from ptexec.cli import main

    ck = llava / "checkpoint"
    argv = ["generate", str(llava / "model.pte"), "--tokenizer", str(ck / "tokenizer.json"),
            "--prompt", "USER: hi ASSISTANT:", "--temperature", "0", "--max-new-tokens", "6",
            "--no-echo"]  # fmt: skip
    assert main(argv) == 0
    got = capsys.readouterr().out.strip()
    runner = _runner(llava)
    want = runner.generate_text([make_text_input("USER: hi ASSISTANT:")],
                                GenerationConfig(temperature=0.0, echo=False, max_new_tokens=6))  # fmt: skip
    assert got == want.strip()
    names = {m.name for m in runner.decoder.loaded}
    assert {"token_embedding", "text_decoder", "vision_encoder"} <= names
    assert all(m.compile_status == "interpreted" for m in runner.decoder.loaded)


def test_cli_chat_puts_the_image_in_the_users_turn(
    llava: Path, tmp_path: Path, capsys: Any
) -> None:
    """``generate --chat --image``: the conversation's user turn holds the image (content
    parts, rendered by the template with its placeholder), not the media before the whole
    rendered prompt; a template that writes no placeholder is refused."""
    from ptexec.cli import main
    from ptexec.llm.chat import ChatTemplate

    px = _pixels(7, 32, 32)
    _pil(px).save(tmp_path / "cat.png")
    ck = llava / "checkpoint"
    argv = ["generate", str(llava / "model.pte"), "--tokenizer", str(ck / "tokenizer.json"),
            "--processor", str(ck), "--image", str(tmp_path / "cat.png"), "--prompt",
            "What is it?", "--chat", "--temperature", "0", "--max-new-tokens", "8"]  # fmt: skip
    assert main(argv) == 0
    got = capsys.readouterr().out.strip()
    template = ChatTemplate.for_tokenizer(ck / "tokenizer.json")
    assert template is not None
    content = [{"type": "image"}, {"type": "text", "text": "What is it?"}]
    text = template.render([{"role": "user", "content": content}])
    assert text.count("<image>") == 1
    want = _runner(llava).generate_text(
        [make_image_input(read_image(tmp_path / "cat.png")), make_text_input(text)],
        GenerationConfig(temperature=0.0, echo=False, max_new_tokens=8),
    )
    assert got == want.strip()
    (tmp_path / "plain.jinja").write_text(
        "{% for m in messages %}{{ m['content'][-1]['text'] }}{% endfor %}"
    )
    assert main([*argv, "--chat-template", str(tmp_path / "plain.jinja")]) != 0
    assert "placeholder" in capsys.readouterr().err


# ---- images over the OpenAI API (``ptexec serve``) ---------------------------------------


def _data_url(pixels: torch.Tensor, fmt: str = "PNG") -> str:
    import base64
    import io

    buf = io.BytesIO()
    _pil(pixels).save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def image_server(llava: Path) -> Any:
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    from ptexec.serve import Engine, Server

    ck = llava / "checkpoint"
    engine = Engine(llava / "model.pte", ck / "tokenizer.json", model_name="m", processor=ck)
    server = Server(engine, "127.0.0.1", 0, max_body_bytes=32 << 20).start()
    yield server
    server.stop()


def _chat(server: Any, content: Any, **body: Any) -> Any:
    import httpx

    messages = [{"role": "user", "content": content}]
    body = {"model": "m", "messages": messages, **body}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


@pytest.mark.slow
def test_a_served_image_chat_gives_the_eager_models_greedy_tokens(
    llava: Path, image_server: Any
) -> None:
    """An ``image_url`` content part (a base64 data URL) in a chat: the template renders
    the user's turn with the image's placeholder, the image is preprocessed as the model's
    processor does, and the answer is the eager model's greedy continuation of the
    processor's input for the same rendered prompt. ``usage.prompt_tokens`` counts the
    image's embedding rows, as the processor's ids hold them; streaming gives the same
    text."""
    import httpx

    ck = llava / "checkpoint"
    processor = transformers.AutoProcessor.from_pretrained(ck)
    px = _pixels(11, 40, 30)
    content = [
        {"type": "text", "text": "Look:"},
        {"type": "image_url", "image_url": {"url": _data_url(px), "detail": "auto"}},
        {"type": "text", "text": "What is it?"},
    ]
    parts = [{"type": "text", "text": "Look:"}, {"type": "image"},
             {"type": "text", "text": "What is it?"}]  # fmt: skip
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True
    )
    inputs, tokens = _eager_image(llava, px, prompt, {"add_special_tokens": False})
    want = processor.tokenizer.decode(tokens)
    r = _chat(image_server, content, temperature=0, max_tokens=N)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == want
    assert body["usage"]["prompt_tokens"] == inputs["input_ids"].shape[1]
    pieces = []
    with httpx.stream(
        "POST",
        image_server.url + "/v1/chat/completions",
        json={
            "model": "m",
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": N,
            "stream": True,
        },
        timeout=120,
    ) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                pieces.append(delta.get("content") or "")
    assert "".join(pieces) == want


@pytest.mark.slow
def test_served_images_are_refused_with_what_is_wrong(llava: Path, image_server: Any) -> None:
    """What the server cannot or will not take is a 400 naming it, before any generation:
    URLs it would have to fetch, data that is not base64 or no image, an image larger than
    the server takes, an image outside a user's turn, more tokens than the context holds
    once the image's rows are counted, and an image for a text-only model."""
    from ptexec.serve import Engine
    from ptexec.serve.protocol import ApiError, parse_request

    px = _pixels(2, 24, 24)
    url = _data_url(px)
    cases = [
        ([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], "fetches no"),
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}], "base64"),
        (
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}],
            "not an image",
        ),
        (
            [{"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGVsbG8="}}],
            "not an image",
        ),
        ([{"type": "image_url", "image_url": url}, {"type": "input_audio"}], "input_audio"),
    ]
    for content, words in cases:
        r = _chat(image_server, content, max_tokens=2)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    import httpx

    system = {"role": "system", "content": [{"type": "image_url", "image_url": {"url": url}}]}
    r = httpx.post(
        image_server.url + "/v1/chat/completions",
        json={"model": "m", "messages": [system, {"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert r.status_code == 400 and "user messages" in r.json()["error"]["message"]
    ck = llava / "checkpoint"
    engine = Engine(
        llava / "model.pte", ck / "tokenizer.json", model_name="m", max_image_pixels=500
    )
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]
    job = engine.prepare(parse_request({"model": "m", "messages": [
        {"role": "user", "content": content}]}, chat=True))  # fmt: skip
    with pytest.raises(ApiError, match="24x24 pixels, more than the 500"):
        engine.read_media(job)
    # the context holds the image's 16 rows, not its one placeholder token
    room = engine.context - job.prompt_tokens
    assert job.prompt_tokens == len(job.ids) - 1 + 16
    over = {"model": "m", "messages": [{"role": "user", "content": content}],
            "max_tokens": room + 1}  # fmt: skip
    with pytest.raises(ApiError, match="maximum context length") as e:
        engine.prepare(parse_request(over, chat=True))
    assert e.value.code == "context_length_exceeded"
    assert engine.prepare(parse_request({**over, "max_tokens": room}, chat=True))
    (ck.parent / "plain.jinja").write_text(
        "{% for m in messages %}{{ m['content'][-1]['text'] }}{% endfor %}"
    )
    plain = Engine(llava / "model.pte", ck / "tokenizer.json", model_name="m",
                   chat_template=ck.parent / "plain.jinja")  # fmt: skip
    with pytest.raises(ApiError, match="wrote no image placeholder"):
        plain.prepare(parse_request(over, chat=True))


def _wav_bytes(samples: torch.Tensor, rate: int = 16000) -> bytes:
    """16-bit PCM mono WAV of float samples in [-1, 1]."""
    import io
    import wave

    pcm = (samples.clamp(-1, 1) * 32767).round().to(torch.int16)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.numpy().tobytes())
    return buf.getvalue()


@pytest.mark.slow
def test_a_served_audio_chat_gives_the_eager_models_greedy_tokens(voxtral: Path) -> None:
    """An ``input_audio`` content part (base64 WAV) in a chat, for an audio LLM: features
    by the processor's extractor (transformers' WhisperFeatureExtractor's), one window's 25
    rows at the template's placeholder, the answer the eager model's greedy tokens, and
    ``usage.prompt_tokens`` counting the rows. Audio of 1.5 windows is counted as two
    windows (the context check with ``max_tokens`` one past it is a 400)."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    import base64

    from ptexec.serve import Engine, Server
    from ptexec.serve.protocol import ApiError, parse_request

    ck = voxtral / "checkpoint"
    wave_ = _wave(0)
    data = _wav_bytes(wave_)
    heard = torch.tensor(list(memoryview(data[44:]).cast("h")), dtype=torch.float32) / 32768
    fe = transformers.WhisperFeatureExtractor.from_pretrained(ck)
    feats = fe(heard.numpy(), sampling_rate=16000, return_tensors="pt")["input_features"]
    ids, want = _eager_audio(voxtral, feats, 25)
    tok = transformers.AutoTokenizer.from_pretrained(ck)
    engine = Engine(voxtral / "model.pte", ck / "tokenizer.json", model_name="m", processor=ck)
    server = Server(engine, "127.0.0.1", 0, max_body_bytes=32 << 20).start()
    try:
        part = {"type": "input_audio",
                "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}  # fmt: skip
        content = [part, {"type": "text", "text": "What does the speaker say?"}]
        body = {"model": "m", "messages": [{"role": "user", "content": content}],
                "temperature": 0, "max_tokens": N, "ignore_eos": True}  # fmt: skip
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["choices"][0]["message"]["content"] == tok.decode(want, skip_special_tokens=True)
        assert got["usage"]["prompt_tokens"] == len(ids)
        bad = {**body, "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "wav"}}]}]}  # fmt: skip
        r = httpx.post(server.url + "/v1/chat/completions", json=bad, timeout=60)
        assert r.status_code == 400 and "audio 0" in r.json()["error"]["message"], r.text
        empty = base64.b64encode(_wav_bytes(torch.zeros(0))).decode()
        bad["messages"][0]["content"][0]["input_audio"]["data"] = empty
        r = httpx.post(server.url + "/v1/chat/completions", json=bad, timeout=60)
        assert r.status_code == 400 and "no samples" in r.json()["error"]["message"], r.text
    finally:
        server.stop()
    longer = torch.cat([wave_, _wave(1)[:16000]])  # 3 s: two windows of 2 s
    part = {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(_wav_bytes(longer)).decode(), "format": "wav"}}  # fmt: skip
    ask = {"model": "m", "messages": [{"role": "user", "content": [part]}]}
    job = engine.prepare(parse_request(ask, chat=True))
    engine.read_media(job)
    assert job.prompt_tokens == len(job.ids) - 1 + 50
    room = engine.context - job.prompt_tokens
    assert job.config.max_new_tokens == room
    job = engine.prepare(parse_request({**ask, "max_tokens": room + 1}, chat=True))
    with pytest.raises(ApiError, match="maximum context length") as e:
        engine.read_media(job)
    assert e.value.code == "context_length_exceeded"
    text_only = Engine(voxtral / "model.pte", ck / "tokenizer.json", model_name="m")
    with pytest.raises(ApiError, match="without --processor"):
        text_only.prepare(parse_request(ask, chat=True))


def test_media_slots_take_written_out_runs_or_one_token_each() -> None:
    """A run of placeholders holds the next media written out (each as long as its rows)
    or one token each (side by side, as a template writes several images): ``<image>
    <image>`` was one run, so two images were refused."""
    from ptexec.llm.multimodal import media_slots

    p = 9
    assert media_slots([[1, p, p, 2]], p, [16, 16]) == [(0, 1, 2), (0, 2, 3)]
    assert media_slots([[1, *[p] * 32, 2]], p, [16, 16]) == [(0, 1, 17), (0, 17, 33)]
    assert media_slots([[p], [3, p, 4]], p, [5, 5]) == [(0, 0, 1), (1, 1, 2)]
    assert media_slots([[1, *[p] * 16, 2, p]], p, [16, 4]) == [(0, 1, 17), (0, 18, 19)]
    assert media_slots([[1, p, p, 2]], p, [16]) is None  # two placeholders, one image
    assert media_slots([[1, p, 2]], p, [16, 16]) is None
    assert media_slots([[1, *[p] * 5, 2]], p, [16]) is None  # neither 1 nor 16


@pytest.mark.slow
def test_adjacent_image_placeholders_take_one_image_each(llava: Path, image_server: Any) -> None:
    """``<image><image>`` in a prompt with two images: each placeholder is one image, as
    the processor expands them; the eager model's greedy tokens. A structured-output
    request whose grammar this tiny vocabulary cannot write (no token for "{") is a 400,
    not a 500 from the session."""
    a, b = _pixels(4, 32, 40), _pixels(5, 50, 30)
    prompt = "USER: <image><image>compare ASSISTANT:"
    inputs, want = _eager_image(llava, [a, b], prompt)
    runner = _runner(llava)
    items = [make_text_input(prompt), make_image_input(a), make_image_input(b)]
    runner.generate(items, _greedy())
    assert runner.generated_tokens == want
    assert runner.stats.num_prompt_tokens == inputs["input_ids"].shape[1]
    r = _chat(image_server, "hi", response_format={"type": "json_object"}, max_tokens=4)
    assert r.status_code == 400 and "cannot write" in r.json()["error"]["message"], r.text


def test_decoder_logits_are_the_callers_to_keep(llava: Path) -> None:
    """``MultimodalDecoder.prefill`` and ``step`` return logits a later call leaves as
    they were, the same a fresh decoder computes for those calls; ``share_logits=True``
    returns views of the method's memory, which the next call rewrites."""
    import ptexec

    program = ptexec.load(llava / "model.pte")
    methods = MultimodalMethods.find(program.method_names)
    assert methods is not None
    tokens = [1, 7, 11, 13]

    def calls(decoder: MultimodalDecoder, n: int) -> list[torch.Tensor]:
        out = [decoder.prefill(tokens[:2], 0)]
        return out + [decoder.step(t, pos) for pos, t in enumerate(tokens[2:n], start=2)]

    kept = calls(MultimodalDecoder(program, methods), 4)
    for n in (2, 3):  # a fresh decoder, stopped after the call of kept[n - 2]
        again = calls(MultimodalDecoder(program, methods), n)[-1]
        torch.testing.assert_close(kept[n - 2], again, rtol=0, atol=0)
    assert not torch.equal(kept[0], kept[1]) and not torch.equal(kept[1], kept[2])
    shared = calls(MultimodalDecoder(program, methods, share_logits=True), 3)
    storage = [t.untyped_storage().data_ptr() for t in shared]
    assert storage[0] == storage[1] and not torch.equal(shared[0], kept[0])  # rewritten
    torch.testing.assert_close(shared[1], kept[1], rtol=0, atol=0)


def test_decoder_token_ids_that_are_not_integers_are_refused(llava: Path) -> None:
    """``MultimodalDecoder`` takes integer ids, as eager PyTorch's embedding takes only
    integer indices: 7.9 ran as token 7. Refused with GenerationError before anything
    runs; the decoder's next calls are a fresh decoder's."""
    import ptexec
    from ptexec.errors import GenerationError

    with pytest.raises(RuntimeError, match="Long, Int"):  # eager PyTorch
        torch.nn.functional.embedding(torch.tensor([[7.9]]), torch.zeros(16, 4))
    program = ptexec.load(llava / "model.pte")
    methods = MultimodalMethods.find(program.method_names)
    assert methods is not None
    decoder, fresh = MultimodalDecoder(program, methods), MultimodalDecoder(program, methods)
    want = [fresh.prefill([1, 7], 0).clone(), fresh.step(11, 2).clone()]
    for bad in (7.9, torch.tensor(7.9), "7", None, 2**63, -1):
        with pytest.raises(GenerationError, match="token"):
            decoder.prefill([1, bad], 0)  # type: ignore[list-item]
        with pytest.raises(GenerationError, match="token"):
            decoder.step(bad, 0)  # type: ignore[arg-type]
    got = [decoder.prefill([1, 7], 0), decoder.step(11, 2)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.slow
def test_eos_asked_for_ends_the_prompt_however_it_is_split(llava: Path) -> None:
    """``num_eos`` EOS ids end the prompt, as the tokenizer puts them after a text: the
    eager model's tokens after the processor's ids and the EOS, whether the prompt is one
    text holding the placeholder or the text around the image (the EOS went after the
    first text part, before the image), or ends with the image."""
    px = _pixels(14, 32, 32)
    ck = llava / "checkpoint"
    processor = transformers.AutoProcessor.from_pretrained(ck)
    model = transformers.LlavaForConditionalGeneration.from_pretrained(ck).eval()
    runner = _runner(llava)
    eos = runner.tokenizer.eos_id
    before, after = mm.PROMPTS["image"].split("<image>")
    for prompt, ways in (
        (mm.PROMPTS["image"], [
            [make_text_input(mm.PROMPTS["image"]), make_image_input(px)],
            [make_text_input(before), make_image_input(px), make_text_input(after)],
        ]),
        (before + "<image>", [[make_text_input(before), make_image_input(px)]]),
    ):  # fmt: skip
        inputs = processor(text=prompt, images=_pil(px), return_tensors="pt")
        ids = torch.cat([inputs["input_ids"], torch.tensor([[eos]])], dim=1)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 pixel_values=inputs["pixel_values"], max_new_tokens=N,
                                 do_sample=False)  # fmt: skip
        want = out[0, ids.shape[1] :].tolist()
        assert len(want) > 2, prompt  # an answer, not an EOS at once
        for k, items in enumerate(ways):
            runner.generate(items, _greedy(num_eos=1))
            assert runner.generated_tokens == want, (prompt, k)
            assert runner.stats.num_prompt_tokens == ids.shape[1]
            runner.reset()


def test_an_image_detail_is_one_of_openais_or_refused() -> None:
    """``image_url.detail`` takes OpenAI's values (``auto``, ``low``, ``high``; each the
    encoder's one size); any other is a 400 naming it, as OpenAI's API answers it (it was
    taken and dropped)."""
    pytest.importorskip("starlette")
    from ptexec.serve.protocol import ApiError, parse_request

    url = _data_url(_pixels(0, 8, 8))

    def request(detail: Any) -> Any:
        part = {"type": "image_url", "image_url": {"url": url, "detail": detail}}
        messages = [{"role": "user", "content": [part, {"type": "text", "text": "hi"}]}]
        return parse_request({"model": "m", "messages": messages}, chat=True)

    for detail in ("auto", "low", "high"):
        assert request(detail).media == request("auto").media
    for detail in ("bogus", "", 5, ["low"]):
        with pytest.raises(ApiError, match="detail must be one of auto, low, high") as e:
            request(detail)
        assert e.value.status == 400


def _executorchs_pieces(d: Path, items: Any, config: Any) -> tuple[list[str], str]:
    """What ExecuTorch's multimodal runner streams and returns for ``items(module)`` (the
    inputs, made by the module given) under ``config(module)``."""
    et = pytest.importorskip("executorch.extension.llm.runner")
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

    ck = d / "checkpoint"
    runner = et.MultimodalRunner(str(d / "model.pte"), str(ck / "tokenizer.json"))
    pieces: list[str] = []
    runner.generate(items(et), config(et), pieces.append)
    runner.reset()
    return pieces, runner.generate_text(items(et), config(et))


@pytest.mark.slow
def test_echo_streams_the_last_text_input_as_executorchs_runner(llava: Path) -> None:
    """With ``echo``, ExecuTorch's runner streams the text of the last input, when it is a
    text, before the generated text, and nothing of the prompt when it ends with an image;
    ``generate_text`` leaves that echo out. (All the prompt's texts were streamed, joined
    without the image: 'USER: \\nWhat is in this picture? ASSISTANT:' where ExecuTorch's
    streams '\\nWhat is in this picture? ASSISTANT:', and 'USER: hi' where it streams
    none.)"""
    import ptexec.llm as ours

    pixels = _eager_image(llava, _pixels(7, 32, 32))[0]["pixel_values"][0]
    before, after = mm.PROMPTS["image"].split("<image>")
    runner = _runner(llava)
    for texts in ((before, after), ("USER: hi", None)):

        def items(m: Any, texts: Any = texts) -> list[Any]:
            out = [m.make_text_input(texts[0]), m.make_image_input(pixels)]
            return out + ([m.make_text_input(texts[1])] if texts[1] is not None else [])

        def config(m: Any) -> Any:
            return m.GenerationConfig(temperature=0.0, max_new_tokens=6, echo=True)

        theirs, their_text = _executorchs_pieces(llava, items, config)
        want = [p for p in theirs if p not in mm.SPECIAL]  # control tokens stream no text
        assert len(want) > 3
        pieces: list[str] = []
        text = runner.generate_text(items(ours), config(ours), pieces.append)
        runner.reset()
        assert pieces == want, texts
        assert text == "".join(want[1:] if texts[1] is not None else want)
        for control in mm.SPECIAL:
            their_text = their_text.replace(control, "")
        assert their_text == (texts[1] or "") + text  # theirs returns the echo too


@pytest.mark.slow
def test_input_orders_and_later_turns_give_executorchs_tokens(llava: Path) -> None:
    """Each order of text, image and token inputs, and a second turn with a new image
    after the first (no reset), gives ExecuTorch's runner's tokens at its positions. A
    later turn's ``num_prompt_tokens`` counts its own inputs' positions (ExecuTorch's, the
    whole context after its prefill: a README difference)."""
    et = pytest.importorskip("executorch.extension.llm.runner")
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

    import ptexec.llm as ours

    first, second = (_eager_image(llava, _pixels(s, 32, 32))[0]["pixel_values"][0] for s in (3, 4))
    ck = llava / "checkpoint"
    theirs = et.MultimodalRunner(str(llava / "model.pte"), str(ck / "tokenizer.json"))
    runner = _runner(llava)
    conversations: list[Any] = [
        [lambda m: [m.make_text_input("USER: "), m.make_image_input(first),
                    m.make_text_input("\nWhat is in this picture? ASSISTANT:")],
         lambda m: [m.make_text_input(" USER: "), m.make_image_input(second),
                    m.make_text_input(" And this? ASSISTANT:")],
         lambda m: [m.make_token_input([5, 6, 7])]],
        [lambda m: [m.make_image_input(first), m.make_text_input("What is it? ASSISTANT:")]],
        [lambda m: [m.make_text_input("USER: "), m.make_image_input(first),
                    m.make_text_input(" and "), m.make_image_input(second),
                    m.make_token_input([10, 11]), m.make_text_input(" ASSISTANT:")]],
    ]  # fmt: skip
    for turns in conversations:
        for items in turns:
            want: list[str] = []
            seen: list[Any] = []
            config = {"temperature": 0.0, "max_new_tokens": 6, "echo": False}
            theirs.generate(items(et), et.GenerationConfig(**config), want.append, seen.append)
            at = runner.pos
            runner.generate(items(ours), ours.GenerationConfig(**config))
            got = [runner.tokenizer.decode([t]) for t in runner.generated_tokens]
            assert got == want
            assert seen[0].num_prompt_tokens == at + runner.stats.num_prompt_tokens
            assert runner.pos == seen[0].num_prompt_tokens + seen[0].num_generated_tokens
        theirs.reset()
        runner.reset()


def test_an_image_without_pixels_is_refused_where_it_has_no_aspect_ratio(
    tmp_path: Path,
) -> None:
    """An image of no rows or columns, for a shortest-edge config, is a typed refusal
    naming its size (it divided by zero, untyped, as transformers' processor does); to a
    fixed size it is resized as transformers' processor resizes it."""
    for size in ({"shortest_edge": 32}, {"height": 32, "width": 32}):
        hf = transformers.CLIPImageProcessor(size=size, crop_size={"height": 32, "width": 32})
        hf.save_pretrained(tmp_path)
        pre = ImagePreprocessor.from_dir(tmp_path, (32, 32))
        for shape in ((3, 0, 5), (3, 5, 0), (3, 0, 0)):
            empty = torch.zeros(shape, dtype=torch.uint8)
            if "shortest_edge" in size:
                with pytest.raises(GenerationError, match=r"\d+x\d+ image has no pixels"):
                    pre(empty)
            else:
                want = hf(images=empty.permute(1, 2, 0).numpy(), return_tensors="pt")
                torch.testing.assert_close(pre(empty), want["pixel_values"][0])
