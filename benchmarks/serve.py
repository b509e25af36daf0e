#!/usr/bin/env python3
"""``ptexec serve`` on loopback: throughput and time to first token against concurrency, and
the server's own cost against the runner alone.

Usage:
    python benchmarks/serve.py [--variant portable] [--sessions 4] [--levels 1 2 4 8]
                               [--tokens 32] [--rounds 2] [--threads 1]

A server for the tiny Llama (``scripts/llm_programs.py``) runs in this process on a free
127.0.0.1 port with ``--sessions`` sessions. At each concurrency level, that many clients
each stream ``--rounds`` greedy completions of exactly ``--tokens`` tokens (``ignore_eos``);
the table gives the aggregate tokens/s and the median time to first token (from sending the
request to the first text chunk). Then, side by side in alternating blocks, one streaming
client against the same generations run directly on a ``TextLLMRunner`` (what ``ptexec
generate`` runs): the ratio server / alone of tokens per second is the cost of HTTP, JSON
and the event stream (below 1: the server is slower).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.append(str(ROOT / "src"))  # after PYTHONPATH: another tree may be measured

import llm_programs  # noqa: E402

PROMPT = "Once upon a time"


async def _client(url: str, tokens: int, rounds: int) -> tuple[int, list[float]]:
    import httpx

    body = {"model": "bench", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    ttfts: list[float] = []
    count = 0
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(rounds):
            start = time.perf_counter()
            first = None
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    if first is None and json.loads(line[6:])["choices"][0]["text"]:
                        first = time.perf_counter() - start
            ttfts.append(first or 0.0)
            count += tokens
    return count, ttfts


async def _level(url: str, clients: int, tokens: int, rounds: int) -> tuple[float, float]:
    start = time.perf_counter()
    results = await asyncio.gather(*(_client(url, tokens, rounds) for _ in range(clients)))
    elapsed = time.perf_counter() - start
    total = sum(n for n, _ in results)
    ttft = statistics.median(t for _, ts in results for t in ts)
    return total / elapsed, ttft


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="portable", choices=sorted(llm_programs.VARIANTS))
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from ptexec.llm import GenerationConfig, TextLLMRunner
    from ptexec.serve import Engine, Server

    pte = llm_programs.program_path(args.variant)
    tok = llm_programs.make_tokenizer(Path(tempfile.mkdtemp()) / "tokenizer.json")
    engine = Engine(pte, tok, model_name="bench", sessions=args.sessions, max_queue=256)
    server = Server(engine, "127.0.0.1", 0).start()
    print(f"{args.variant}: {args.sessions} sessions, {args.tokens} tokens a request, "
          f"{args.rounds} requests per client, {args.threads} thread(s)")  # fmt: skip
    print(f"{'clients':>8} {'tokens/s':>10} {'median TTFT ms':>15}")
    try:
        asyncio.run(_level(server.url, 1, 4, 1))  # warm up
        for clients in args.levels:
            rate, ttft = asyncio.run(_level(server.url, clients, args.tokens, args.rounds))
            print(f"{clients:>8} {rate:>10.1f} {ttft * 1e3:>15.2f}")
        runner = TextLLMRunner(str(pte), str(tok), print_output=False)
        config = GenerationConfig(
            max_new_tokens=args.tokens, temperature=0, echo=False, ignore_eos=True
        )
        alone, served = [], []
        for _ in range(args.blocks):
            start = time.perf_counter()
            for _ in range(args.rounds):
                runner.reset()
                runner.generate_text(PROMPT, config)
            alone.append(args.tokens * args.rounds / (time.perf_counter() - start))
            served.append(asyncio.run(_level(server.url, 1, args.tokens, args.rounds))[0])
        a, s = statistics.median(alone), statistics.median(served)
        print(f"one client: server {s:.1f} tokens/s, runner alone {a:.1f} tokens/s, "
              f"ratio server/alone {s / a:.2f}")  # fmt: skip
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
