"""``ptexec serve``: an OpenAI-compatible HTTP server over exported programs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .common import add_threads, add_xnnpack, apply_threads

DEFAULT_BODY_BYTES = 1 << 20
MEDIA_BODY_BYTES = 32 << 20  # a request with images or audio (OpenAI takes 20-25 MB ones)
DEFAULT_QUEUE = 16
# the options ptexec.serve.options rules on, by its names, and what honours those it refuses
_FLAGS = {
    "sessions": "--max-sessions",
    "max_queue": "--max-queue",
    "timeout": "--timeout",
    "join_rows": "--join-rows",
    "batch_window_ms": "--batch-window-ms",
    "chat_template": "--chat-template",
    "generation_config": "--generation-config",
    "sampling_rate": "--sampling-rate",
}
_HONOURED_BY = {
    "join_rows": "the program's methods'",
    "batch_window_ms": "the methods' with --join-rows",
    "chat_template": "an LLM's, with --tokenizer",
    "generation_config": "a speech model's",
}


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve an LLM program over OpenAI's HTTP API until SIGTERM drains it."""
    try:
        from ..serve import Engine, Server
        from ..serve.options import LIMITS, unhonoured
    except ImportError as e:
        print(f"ptexec: serving needs {e.name} (pip install 'ptexec[serve]')", file=sys.stderr)
        return 1
    apply_threads(args)
    is_speech = _is_speech(args)
    methods = args.programs or (not args.tokenizer and not is_speech)
    llm = bool(args.tokenizer) and not is_speech
    given = [key for key, value in _given(args).items() if value]
    unused = unhonoured(given, llm=llm, speech=is_speech, methods=methods, join_rows=args.join_rows)
    limits = [_FLAGS[k] for k in unused if k in LIMITS]
    if limits:
        # the program's methods alone: each request is one call, which nothing stops
        # part-way, and the limits are the generations' and transcriptions'
        print(
            f"ptexec: serve: {', '.join(limits)} limit{'s' if len(limits) > 1 else ''} "
            "generations and transcriptions; serving the program's methods alone, "
            "nothing would honour it (give --tokenizer for an LLM, --processor or "
            "--preprocessor for speech)",
            file=sys.stderr,
        )
        return 2
    # options of one service, by what honours them: given without it, nothing would
    others = [f"{_FLAGS[k]} ({_HONOURED_BY[k]})" for k in unused if k in _HONOURED_BY]
    if others:
        print(
            f"ptexec: serve: nothing served here would honour {', '.join(others)}",
            file=sys.stderr,
        )
        return 2
    if "sampling_rate" in unused:
        print(
            "ptexec: serve: --sampling-rate is a speech preprocessor program's rate; nothing "
            "served here would honour it (give --preprocessor for speech)",
            file=sys.stderr,
        )
        return 2
    max_queue = args.max_queue if args.max_queue is not None else DEFAULT_QUEUE
    sessions = args.max_sessions if args.max_sessions is not None else 1
    speech = None
    if is_speech:
        from ..serve import SpeechService
        from .transcribe import speech_model

        try:
            runner, features = speech_model(args.file, args)
        except ValueError as e:
            print(f"ptexec: serve: {e}", file=sys.stderr)
            return 1
        speech = SpeechService(
            runner,
            features,
            args.model_name or Path(args.file).stem,
            max_queue=max_queue,
            timeout=args.timeout,
        )
    engine = None
    if args.tokenizer and speech is None:
        engine = Engine(
            args.file,
            args.tokenizer,
            data_path=args.data,
            model_name=args.model_name,
            sessions=sessions,
            max_queue=max_queue,
            timeout=args.timeout,
            device_map=args.device or None,
            compile="background" if args.compile else False,
            xnnpack=args.xnnpack,
            chat_template=args.chat_template,
            processor=args.processor,
        )
    programs = None
    if args.programs or (engine is None and speech is None):  # every method at /v1/programs/
        from .. import load
        from ..serve import ProgramService

        program = (
            engine.program
            if engine is not None
            else speech.runner.program
            if speech is not None
            else load(args.file, data_path=args.data)
        )
        from ..llm.decoder import load_options

        compile_mode = "background" if args.compile else False
        options = load_options(args.device or None, compile_mode, args.xnnpack)
        programs = ProgramService(
            program,
            join=args.join_rows,
            window=(args.batch_window_ms if args.batch_window_ms is not None else 2.0) / 1e3,
            **options,
        )
    server = Server(
        engine,
        args.host,
        args.port,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes
        if args.max_body_bytes is not None
        else MEDIA_BODY_BYTES
        if engine is not None and engine.takes_media
        else DEFAULT_BODY_BYTES,
        log_level=args.log_level,
        programs=programs,
        speech=speech,
    )
    what = (
        f"'{engine.model_name}'"
        if engine is not None
        else f"'{speech.model_name}' (speech to text)"
        if speech is not None
        else "the program's methods"
    )
    print(f"ptexec: serving {what} at {server.url}/v1", file=sys.stderr, flush=True)
    server.run()
    return 0


def _given(args: argparse.Namespace) -> dict[str, bool]:
    """Whether each option of :data:`_FLAGS` was given on the command line."""
    return {
        "sessions": args.max_sessions is not None,
        "max_queue": args.max_queue is not None,
        "timeout": args.timeout is not None,
        "join_rows": bool(args.join_rows),
        "batch_window_ms": args.batch_window_ms is not None,
        "chat_template": bool(args.chat_template),
        "generation_config": bool(args.generation_config),
        "sampling_rate": args.sampling_rate is not None,
    }


def _is_speech(args: argparse.Namespace) -> bool:
    """A speech model: a preprocessor program named, a processor directory named for a
    program that is no multimodal LLM (whose processor preprocesses its images), or a
    processor directory beside an encoder-decoder program and no LLM tokenizer asked for."""
    if args.preprocessor:
        return True
    if not args.processor and (
        args.tokenizer or not (Path(args.file).parent / "preprocessor_config.json").exists()
    ):
        return False
    from .. import load
    from ..llm import MultimodalMethods

    names = set(load(args.file, data_path=args.data).method_names)
    if args.processor:
        return MultimodalMethods.find(sorted(names)) is None
    return {"encoder", "text_decoder"} <= names


def add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve an LLM or speech program over OpenAI's HTTP API")
    p.add_argument("file", help="the .pte program (an LLM or speech-to-text export)")
    p.add_argument(
        "--tokenizer", help="tokenizer.json, chat template beside it (without: methods only)"
    )
    p.add_argument("--programs", action="store_true", help="also serve /v1/programs/{method}")
    speech = p.add_mutually_exclusive_group()
    speech.add_argument(
        "--processor",
        help="serve a speech model (Whisper: encoder + text_decoder) at /v1/audio/*, its "
        "features from this Hugging Face processor directory (found beside the program "
        "without this option); for a multimodal LLM, its image preprocessing (default: the "
        "program's metadata) and audio feature extractor",
    )
    speech.add_argument(
        "--preprocessor", help="serve a speech model, its features from this preprocessor .pte"
    )
    p.add_argument(
        "--sampling-rate",
        type=int,
        help="the preprocessor program's sample rate (default 16000; with --processor, its "
        "feature extractor's)",
    )
    p.add_argument(
        "--generation-config",
        help="a speech model's generation_config.json (default: beside the processor / model)",
    )
    p.add_argument(
        "--join-rows",
        action="store_true",
        help="the methods' dim 0 is a batch of independent rows: join concurrent requests "
        "into one call (micro-batching; default: each request is one call)",
    )
    p.add_argument(
        "--batch-window-ms",
        type=float,
        help="micro-batching window of methods, with --join-rows (default 2)",
    )
    p.add_argument("--data", help="external data file (.ptd) of the program")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one)")
    p.add_argument("--model-name", help="the model id clients send (default: the file's stem)")
    p.add_argument(
        "--max-sessions", type=int, help="concurrent generations (default 1; an LLM's only)"
    )
    p.add_argument(
        "--max-queue",
        type=int,
        help=f"generation or transcription requests waiting beyond them (default {DEFAULT_QUEUE})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds a generation or transcription request may take (default: none)",
    )
    p.add_argument("--device", help="run the program on this device (cpu, cuda, cuda:1)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="use ptexec's compiled tier: serve at once, interpreted, and switch to the "
        "compiled code when a compile in another process has filled the cache",
    )
    p.add_argument("--chat-template", help="a Jinja chat template file")
    p.add_argument(
        "--api-key",
        default=os.environ.get("PTEXEC_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' (default: $PTEXEC_API_KEY, which keeps the "
        "key off the process list)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        help="largest request body (default: 1 MiB; 32 MiB for a model that takes images or audio)",
    )
    add_xnnpack(p)
    add_threads(p)
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    p.set_defaults(func=cmd_serve)
