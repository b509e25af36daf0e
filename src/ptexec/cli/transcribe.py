"""``ptexec transcribe``: speech to text with an exported encoder-decoder (Whisper) program."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .common import add_threads, add_xnnpack, apply_threads, json_text, threads_used


def _beside(model: str, name: str, *dirs: str | None) -> Path | None:
    """``name`` in the first of ``dirs`` (then the model's directory) that holds it."""
    for d in (*dirs, str(Path(model).parent)):
        if d and (Path(d) / name).exists():
            return Path(d) / name
    return None


def speech_model(model: str, args: argparse.Namespace, **runner_options: Any) -> tuple[Any, Any]:
    """The runner and feature extractor of a speech program, from the options
    ``transcribe`` and ``serve`` share (``--processor``/``--preprocessor``,
    ``--tokenizer``, ``--generation-config``, ``--data``, ``--sampling-rate``, ``--device``,
    ``--compile``, ``--xnnpack``), files not named found beside the processor or the
    model. Raises ``ValueError`` saying what is missing."""
    from ..llm import Seq2SeqRunner
    from ..llm.audio import FeatureExtractor, ProcessorFeatures, ProgramFeatures

    processor, preprocessor = args.processor, args.preprocessor
    device_map = args.device if args.device else None
    xnnpack = args.xnnpack
    found = args.tokenizer or _beside(model, "tokenizer.json", processor)
    if found is None:
        raise ValueError(
            "a speech model needs a tokenizer (--tokenizer, or tokenizer.json in the "
            "processor or model directory)"
        )
    generation = args.generation_config or _beside(model, "generation_config.json", processor)
    features: FeatureExtractor
    if preprocessor:
        rate = 16000 if args.sampling_rate is None else args.sampling_rate
        features = ProgramFeatures(
            preprocessor, sampling_rate=rate, device_map=device_map, xnnpack=xnnpack
        )
    else:
        directory = processor or (
            str(Path(model).parent)
            if _beside(model, "preprocessor_config.json") is not None
            else None
        )
        if directory is None:
            raise ValueError(
                "a speech model needs features: --preprocessor P.pte or --processor DIR "
                "(a directory with preprocessor_config.json)"
            )
        features = ProcessorFeatures(directory)
        given = args.sampling_rate
        if given is not None and given != features.sampling_rate:
            # the extractor's rate is the processor's own: --sampling-rate names a program's
            raise ValueError(
                f"--sampling-rate {given} is a preprocessor program's rate; the processor's "
                f"feature extractor takes {features.sampling_rate} Hz (the audio is "
                "resampled to it)"
            )
    runner = Seq2SeqRunner(
        model,
        found,
        args.data,
        generation_config=generation,
        device_map=device_map,
        compile="background" if args.compile else False,
        xnnpack=xnnpack,
        **runner_options,
    )
    return runner, features


def cmd_transcribe(args: argparse.Namespace) -> int:
    """Stream the transcription to stdout (or print JSON); timings to stderr."""
    from ..llm import GenerationConfig

    config = GenerationConfig(
        echo=False,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )
    apply_threads(args)
    try:
        runner, features = speech_model(
            args.model,
            args,
            decoder_start_token_id=args.decoder_start_token_id,
            language=args.language,
            task=args.task,
            timestamps=args.timestamps,
        )
    except ValueError as e:
        print(f"ptexec: transcribe: {e}", file=sys.stderr)
        return 1

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    result = runner.transcribe(
        args.audio, features, config, None if args.json else show, window_seconds=args.window
    )
    if args.json:
        out: dict[str, Any] = {
            "text": result.text,
            "tokens": result.tokens,
            "segments": [{"start": s.start, "end": s.end, "text": s.text} for s in result.segments],
            "language": result.language,
            "finish_reasons": result.finish_reasons,
        }
        print(json_text(out))
    else:
        sys.stdout.write("\n")
        for s in result.segments:
            print(f"[{s.start:7.2f} -> {s.end:7.2f}] {s.text.strip()}")
    cut = [i for i, r in enumerate(result.finish_reasons) if r == "length"]
    if cut:
        print(f"ptexec: window(s) {cut} reached the token budget before the end of their text "
              "(--max-new-tokens, or the decoder's cache)", file=sys.stderr)  # fmt: skip
    stats = runner.stats
    load_ms = stats.model_load_end_ms - stats.model_load_start_ms
    print(
        f"load {load_ms:.1f} ms; {len(result.tokens)} window(s); last window: encoder and "
        f"prompt {stats.prefill_ms:.2f} ms, {stats.num_generated_tokens} tokens, "
        f"{stats.tokens_per_second:.1f} tokens/s {threads_used()}"
        + (f"; language {result.language}" if result.language else ""),
        file=sys.stderr,
    )
    if args.stats:
        print(stats.to_json_string(), file=sys.stderr)
    return 0


def add_transcribe(sub: Any) -> None:
    p = sub.add_parser(
        "transcribe",
        help="speech to text with an exported encoder-decoder program (Whisper: encoder + "
        "text_decoder)",
    )
    p.add_argument("audio", help="the audio file (WAV; other formats with soundfile)")
    p.add_argument("--model", required=True, help="the .pte program (encoder, text_decoder)")
    p.add_argument("--data", help="external data file (.ptd) of the program")
    feats = p.add_mutually_exclusive_group()
    feats.add_argument("--preprocessor", help="a preprocessor .pte (waveform -> log-mel features)")
    feats.add_argument(
        "--processor",
        help="a Hugging Face processor directory (preprocessor_config.json; also where the "
        "tokenizer and generation config are looked for)",
    )
    p.add_argument(
        "--sampling-rate",
        type=int,
        help="the preprocessor program's sample rate (default 16000; with --processor, its "
        "feature extractor's)",
    )
    p.add_argument("--tokenizer", help="tokenizer.json (default: beside the processor / model)")
    p.add_argument(
        "--generation-config",
        help="generation_config.json or its directory (default: beside the processor / model)",
    )
    p.add_argument("--decoder-start-token-id", type=int, help="the decoder's first token")
    p.add_argument(
        "--language",
        help="Whisper language (en, <|fr|>, french, ...; default: the generation config's, else "
        "detected from the first window)",
    )
    p.add_argument("--task", help="Whisper task (transcribe, translate)")
    p.add_argument("--timestamps", action="store_true", help="ask for timestamp tokens")
    p.add_argument(
        "--window",
        type=float,
        help="seconds per window (default: the feature extractor's span, else 30; a longer "
        "window than the extractor takes is refused)",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=-1, help="most tokens per window (-1: the cache)"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: off)")
    p.add_argument("--seed", type=int, help="seed of the sampler (default: random)")
    p.add_argument("--device", help="run the programs on this device (cpu, cuda, cuda:1)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="ptexec's compiled tier: transcribe at once, interpreted, switching to the compiled code when another process has compiled it into the cache",
    )
    p.add_argument("--json", action="store_true", help="print text, tokens and segments as JSON")
    p.add_argument("--stats", action="store_true", help="also print the statistics as JSON")
    add_xnnpack(p)
    add_threads(p)
    p.set_defaults(func=cmd_transcribe)
