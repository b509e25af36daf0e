"""``ptexec generate``: text from an exported LLM, with images and audio for multimodal ones."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import GenerationError
from .common import add_threads, add_xnnpack, apply_threads, threads_used


def cmd_generate(args: argparse.Namespace) -> int:
    """Stream generated text to stdout; timings to stderr at the end."""
    from ..llm import GenerationConfig, TextLLMRunner

    # the settings are checked before the program loads; the runner checks the prompt and
    # the budget before it prints anything
    config = GenerationConfig(
        echo=not args.no_echo,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        num_bos=args.bos,
        num_eos=args.eos if args.eos is not None else 0,  # (1 for seq2seq: below)
        stop=args.stop or (),
        ignore_eos=args.ignore_eos,
    )
    apply_threads(args)
    device_map = args.device if args.device else None
    import ptexec

    program = ptexec.load(args.file, data_path=args.data)
    compile_mode = "background" if args.compile else False
    media = bool(args.image or args.audio)
    if args.chat_template and not args.chat:
        raise ValueError("--chat-template is the template of --chat: give --chat too")
    if media and _is_seq2seq(program):
        raise ValueError(
            "an encoder-decoder program takes its encoder's input, not --image or --audio "
            "(for speech to text: ptexec transcribe)"
        )
    if _is_seq2seq(program):
        if args.chat:
            raise ValueError("--chat renders a conversation for a decoder-only LLM; this "
                             "is an encoder-decoder program, which takes the text as it is")  # fmt: skip
        return _generate_seq2seq(program, args, config, device_map)
    # a multimodal program (its methods: embedding, text decoder, encoders) answers text
    # alone too, through the runner that knows its methods
    multimodal = media or "forward" not in program.method_names
    if multimodal:
        from ..llm import MultimodalRunner

        runner: Any = MultimodalRunner(
            program,
            args.tokenizer,
            args.data,
            processor=args.processor,
            device_map=device_map,
            compile=compile_mode,
            xnnpack=args.xnnpack,
            print_output=False,
        )
    else:
        runner = TextLLMRunner(
            program,
            args.tokenizer,
            args.data,
            device_map=device_map,
            compile=compile_mode,
            xnnpack=args.xnnpack,
            print_output=False,
        )

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    prompt = args.prompt
    if args.chat:  # the prompt is the user's message, rendered by the model's chat template
        from ..llm.chat import ChatTemplate

        template = ChatTemplate.for_tokenizer(args.tokenizer, args.chat_template)
        if template is None:
            print("ptexec: --chat needs a chat template (tokenizer_config.json or "
                  "--chat-template)", file=sys.stderr)  # fmt: skip
            return 1
        content: Any = prompt
        if media:  # the media in the user's turn, where the template puts their placeholders
            content = [
                *({"type": "image"} for _ in args.image or ()),
                *({"type": "audio"} for _ in args.audio or ()),
                {"type": "text", "text": prompt},
            ]
        prompt = template.render([{"role": "user", "content": content}])
        if media:
            _check_placeholders(runner, prompt, args)
        config.echo = False
    if multimodal:
        runner.generate(_media_inputs(args, prompt), config, token_callback=show)
    else:
        runner.generate(prompt, config, token_callback=show)
    sys.stdout.write("\n")
    stats = runner.stats
    load_ms = stats.model_load_end_ms - stats.model_load_start_ms
    print(
        f"load {load_ms:.1f} ms; prompt {stats.num_prompt_tokens} tokens, prefill "
        f"{stats.prefill_ms:.2f} ms; first token after {stats.time_to_first_token_ms:.2f} ms; "
        f"{stats.num_generated_tokens} tokens generated, {stats.tokens_per_second:.1f} tokens/s "
        f"{threads_used()}",
        file=sys.stderr,
    )
    if args.stats:
        print(stats.to_json_string(), file=sys.stderr)
    if args.compile:
        _say_compile(runner.decoder.loaded)
    return 0


def _say_compile(methods: Any) -> None:
    """What ``--compile`` did, per method: the compiled code ran, or it is still compiling
    (left to finish into the cache on its own, so that the next run starts compiled), or
    failed."""
    for method in methods:
        status = method.compile_status
        job = method.background_compile
        name = f" '{method.name}'" if len(methods) > 1 else ""
        if status == "pending" and job is not None and job.pid is not None:
            job.detach()
            print(
                f"compile{name}: still compiling (process {job.pid}), left to finish into "
                "the cache; the next run starts compiled",
                file=sys.stderr,
            )
        else:
            print(f"compile{name}: {status}", file=sys.stderr)


def _is_seq2seq(program: Any) -> bool:
    from ..llm.seq2seq import DECODER, ENCODER

    names = set(program.method_names)
    return ENCODER in names and DECODER in names


def _generate_seq2seq(program: Any, args: argparse.Namespace, config: Any, device_map: Any) -> int:
    """Text in, text out with an encoder-decoder program (T5-style: the encoder takes ids)."""
    from pathlib import Path

    from ..llm import Seq2SeqRunner

    # the generation config beside the program, where there is one (as the runner looks)
    beside = Path(args.file).parent / "generation_config.json"
    runner = Seq2SeqRunner(
        program,
        args.tokenizer,
        generation_config=beside if beside.is_file() else None,
        device_map=device_map,
        compile="background" if args.compile else False,
        xnnpack=args.xnnpack,
    )
    if not runner.takes_tokens:
        print("ptexec: this encoder takes audio features; use ptexec transcribe",
              file=sys.stderr)  # fmt: skip
        return 1
    config.echo = False
    if args.eos is None:  # T5-style encoders are trained on inputs ending with EOS
        config.num_eos = 1

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    runner.generate_text(args.prompt, config, show)
    sys.stdout.write("\n")
    stats = runner.stats
    print(
        f"encoder input {stats.num_prompt_tokens} positions; {stats.num_generated_tokens} "
        f"tokens generated, {stats.tokens_per_second:.1f} tokens/s {threads_used()}",
        file=sys.stderr,
    )
    if args.stats:
        print(stats.to_json_string(), file=sys.stderr)
    if args.compile:
        _say_compile(runner.loaded)
    return 0


def _check_placeholders(runner: Any, prompt: str, args: argparse.Namespace) -> None:
    """A chat prompt rendered with media must hold one placeholder of the program's per
    image (audio) file: else the media would go before the whole conversation."""
    if not runner.multimodal:
        return  # (the runner refuses media itself)
    for kind, files in (("image", args.image), ("audio", args.audio)):
        token = runner.decoder.placeholder(kind) if files else None
        if token is None:
            continue
        mark = runner.tokenizer.decode([token])
        found = prompt.count(mark) if mark else 0
        if found != len(files):
            raise GenerationError(
                f"--chat: the chat template wrote {found} {kind} placeholder(s) ({mark!r}) for "
                f"{len(files)} --{kind} file(s); without --chat, put {mark!r} in the prompt "
                "where each goes"
            )


def _media_inputs(args: argparse.Namespace, prompt: str) -> list[Any]:
    """The prompt with its images and audio: the media first, then the text (a prompt that
    holds the model's placeholder, e.g. ``<image>``, gets the media there instead)."""
    from ..llm import make_audio_input, make_image_input, make_text_input, read_image
    from ..llm.audio import load_audio
    from ..llm.multimodal import audio_features

    items = [make_image_input(read_image(f)) for f in args.image or ()]
    for f in args.audio or ():
        if not args.processor:
            raise GenerationError("--audio needs --processor (the model's feature extractor)")
        samples, rate = load_audio(f)  # WAV (or what soundfile reads), to mono
        items.append(make_audio_input(audio_features(samples, rate, args.processor)))
    return [*items, make_text_input(prompt)]


def add_generate(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with an exported LLM (KV-cache .pte) or encoder-decoder (T5-style) "
        "program and its tokenizer",
    )
    p.add_argument("file", help="the .pte program (an LLM export)")
    p.add_argument(
        "--tokenizer",
        required=True,
        help="tokenizer.json (Hugging Face), tiktoken, SentencePiece or llama2.c file",
    )
    p.add_argument("--prompt", required=True, help="the prompt")
    p.add_argument("--data", help="external data file (.ptd) of the program")
    p.add_argument(
        "--max-new-tokens", type=int, default=128, help="most tokens to generate (-1: context)"
    )
    p.add_argument(
        "--temperature", type=float, default=0.8, help="sampling temperature; 0 is greedy"
    )
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling mass (1: off)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: off)")
    p.add_argument("--seed", type=int, help="seed of the sampler (default: random)")
    p.add_argument("--bos", type=int, default=0, help="BOS tokens to put before the prompt")
    p.add_argument(
        "--eos",
        type=int,
        help="EOS tokens after the prompt (default: 1 for encoder-decoder programs, else 0)",
    )
    p.add_argument("--stop", action="append", help="stop string; repeatable")
    p.add_argument("--ignore-eos", action="store_true", help="generate past EOS tokens")
    p.add_argument("--no-echo", action="store_true", help="do not print the prompt first")
    p.add_argument("--device", help="run the program on this device (cpu, cuda, cuda:1)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="ptexec's compiled tier: generate at once, interpreted, switching to the "
        "compiled code when another process has compiled it into the cache",
    )
    add_xnnpack(p)
    add_threads(p)
    p.add_argument("--stats", action="store_true", help="also print the statistics as JSON")
    p.add_argument("--chat", action="store_true", help="the prompt is a user message (template)")
    p.add_argument("--chat-template", help="a Jinja chat template file (with --chat)")
    p.add_argument(
        "--image", action="append", help="an image file for a multimodal program; repeatable"
    )
    p.add_argument(
        "--audio", action="append", help="a WAV file for an audio-text program; repeatable"
    )
    p.add_argument(
        "--processor",
        help="the model's Hugging Face processor or checkpoint directory (image preprocessing, "
        "audio feature extractor)",
    )
    p.set_defaults(func=cmd_generate)
