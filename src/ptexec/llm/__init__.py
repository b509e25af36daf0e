"""Text generation with exported LLMs, with the names of ExecuTorch's runner.

A script written for ``executorch.extension.llm.runner`` switches by changing one import::

    from ptexec.llm import GenerationConfig, TextLLMRunner

    runner = TextLLMRunner("llama.pte", "tokenizer.json")
    config = GenerationConfig(max_new_tokens=32, temperature=0.0, echo=False)
    runner.generate("Once upon a time", config, token_callback=print)

The program is placed with ``device_map`` like any ptexec method (``TextLLMRunner(...,
device_map="cuda")``); its logits stay on the device until sampled. Tokenizers (Hugging Face
``tokenizer.json``, tiktoken, SentencePiece, llama2.c) are detected from the file; install
the ``llm`` extra (``pip install '.[llm]'`` in ptexec's source tree) for them.
"""

from __future__ import annotations

from ..errors import GenerationError, TokenizerError
from .config import GenerationConfig, Stats
from .decoder import LlmMetadata, TextDecoder, read_metadata
from .image import ImagePreprocessor, read_image
from .inputs import (
    Audio,
    Image,
    MultimodalInput,
    RawAudio,
    make_audio_input,
    make_image_input,
    make_raw_audio_input,
    make_text_input,
    make_token_input,
)
from .multimodal import (
    MultimodalDecoder,
    MultimodalMethods,
    MultimodalRunner,
    audio_features,
    generate_hf,
    generate_text_hf,
)
from .runner import TextLLMRunner
from .sampling import Sampler
from .seq2seq import DecoderPrompt, Segment, Seq2SeqRunner, Transcription, WindowScores
from .tokenizer import TextStream, Tokenizer, load_tokenizer

__all__ = [
    "Audio",
    "DecoderPrompt",
    "GenerationConfig",
    "GenerationError",
    "Image",
    "ImagePreprocessor",
    "LlmMetadata",
    "MultimodalDecoder",
    "MultimodalInput",
    "MultimodalMethods",
    "MultimodalRunner",
    "RawAudio",
    "Sampler",
    "Segment",
    "Seq2SeqRunner",
    "Stats",
    "TextDecoder",
    "TextLLMRunner",
    "TextStream",
    "Tokenizer",
    "TokenizerError",
    "Transcription",
    "WindowScores",
    "audio_features",
    "generate_hf",
    "generate_text_hf",
    "load_tokenizer",
    "make_audio_input",
    "make_image_input",
    "make_raw_audio_input",
    "make_text_input",
    "make_token_input",
    "read_image",
    "read_metadata",
]
