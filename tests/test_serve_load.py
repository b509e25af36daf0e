"""The server under load and faults, on loopback, every loop bounded: concurrent streams
mix nothing, a full queue answers 429, a client that leaves frees its session, a timeout
answers 504, SIGTERM drains without losing a reply."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_support import program
from ptexec.llm import GenerationConfig, TextLLMRunner
from serve_support import running_server, tokenizer_folder

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

WORDS = ["robot", "storm", "Mira", "map", "tower", "waves", "birds", "fox", "moon", "lamp"]
PROMPTS = [f"The {a} and the {b}" for a in WORDS for b in WORDS[:4]][:32]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return tokenizer_folder(tmp_path_factory.mktemp("tok"))


@pytest.mark.slow  # about 20 s on two busy cores
def test_32_concurrent_streams_on_4_sessions_equal_each_prompt_alone(tok: Path) -> None:
    runner = TextLLMRunner(str(program("portable")), str(tok), print_output=False)
    alone = {}
    for p in PROMPTS:
        runner.reset()
        alone[p] = runner.generate_text(
            p, GenerationConfig(max_new_tokens=8, temperature=0, echo=False)
        )
    assert len(set(alone.values())) > 8  # the prompts give different answers

    async def load(url: str) -> dict[str, str]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)

        async def one(prompt: str) -> tuple[str, str]:
            stream = await client.completions.create(
                model="tiny-llama", prompt=prompt, max_tokens=8, temperature=0, stream=True
            )
            return prompt, "".join([c.choices[0].text async for c in stream])

        results = await asyncio.wait_for(asyncio.gather(*(one(p) for p in PROMPTS)), 120)
        await client.close()
        return dict(results)

    with running_server(tok, sessions=4, max_queue=64) as server:
        got = asyncio.run(load(server.url))
        assert server.engine.idle
    assert got == alone  # nothing lost, nothing mixed


def test_full_queue_answers_429_with_retry_after_and_never_hangs(tok: Path) -> None:
    async def burst(url: str) -> list[Any]:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model": "tiny-llama", "prompt": "The robot", "max_tokens": 40,
                    "temperature": 0, "ignore_eos": True}  # fmt: skip
            calls = [client.post(url + "/v1/completions", json=body) for _ in range(8)]
            return list(await asyncio.wait_for(asyncio.gather(*calls), 120))

    with running_server(tok, sessions=1, max_queue=1) as server:
        answers = asyncio.run(burst(server.url))
    codes = sorted(r.status_code for r in answers)
    assert codes.count(200) >= 2 and set(codes) == {200, 429}
    for r in answers:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
        else:
            assert r.json()["usage"]["completion_tokens"] == 40


def test_disconnect_mid_stream_frees_the_session(tok: Path) -> None:
    with running_server(tok, sessions=1, max_queue=0) as server:
        body = {"model": "tiny-llama", "prompt": "The robot", "max_tokens": 120,
                "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
        # the one session is free again (bounded wait): the next request is served, not 429
        for _ in range(200):
            if server.engine.idle:
                break
            time.sleep(0.02)
        assert server.engine.idle
        r2 = httpx.post(server.url + "/v1/completions", json={**body, "stream": False,
                        "max_tokens": 3}, timeout=60)  # fmt: skip
        assert r2.status_code == 200 and r2.json()["usage"]["completion_tokens"] == 3
        generated = server.engine.metrics.generated_tokens
        assert generated < 120 + 3  # the abandoned generation stopped early


def test_a_generation_whose_client_left_is_in_the_metrics(tok: Path) -> None:
    """The tokens of a stream abandoned after its first piece were generated: they are
    counted, and the first piece the client got has its time to first token."""
    with running_server(tok, sessions=1, max_queue=0) as server:
        body = {"model": "tiny-llama", "prompt": "The robot", "max_tokens": 120,
                "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            first = json.loads(next(r.iter_lines()).removeprefix("data: "))
        assert first["choices"][0]["text"]  # a token reached the client
        for _ in range(200):
            if server.engine.idle:
                break
            time.sleep(0.02)
        assert server.engine.idle
        generated = server.engine.runners[0].stats.num_generated_tokens
        assert generated >= 1
        text = httpx.get(server.url + "/metrics", timeout=10).text
        assert f"ptexec_generated_tokens_total {generated}\n" in text
        assert "ptexec_time_to_first_token_seconds_count 1\n" in text


def test_the_decode_rate_is_the_tokens_after_the_first_per_second(tok: Path) -> None:
    """A one-token generation has no decode rate (none observed, where the time the answer
    took to reach the loop was); a longer one is observed at the rate ``ptexec generate``
    reports: the tokens after the first over the time after the first."""
    with running_server(tok, sessions=1, max_queue=0) as server:
        body = {"model": "tiny-llama", "prompt": "The robot", "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        r = httpx.post(server.url + "/v1/completions", json={**body, "max_tokens": 1})
        assert r.json()["usage"]["completion_tokens"] == 1
        rate = server.engine.metrics.rate
        assert server.engine.metrics.ttft.count == 1 and rate.count == 0
        r = httpx.post(server.url + "/v1/completions", json={**body, "max_tokens": 12})
        assert r.json()["usage"]["completion_tokens"] == 12
        stats = server.engine.runners[0].stats
        decoded = (stats.num_generated_tokens - 1) / (stats.decode_ms / 1e3)
        assert rate.count == 1 and rate.sum == pytest.approx(decoded, rel=1e-9)


def test_the_time_to_first_token_counts_a_first_token_without_text(tok: Path) -> None:
    """A generation whose first token is EOS (made so by logit_bias) makes no text: its
    time to first token is still observed, up to when the token was sampled."""
    with running_server(tok, sessions=1, max_queue=0) as server:
        eos = sorted(server.engine.runners[0].eos_ids)[0]
        body = {"model": "tiny-llama", "prompt": "The robot", "temperature": 0,
                "max_tokens": 5, "logit_bias": {str(eos): 100}}  # fmt: skip
        sent = time.perf_counter()
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        took = time.perf_counter() - sent
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == ""
        assert r.json()["usage"]["completion_tokens"] == 1
        ttft = server.engine.metrics.ttft
        assert ttft.count == 1 and 0 < ttft.sum < took


def test_a_client_leaving_a_non_streamed_request_stops_it(
    tok: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokens keep coming (faster than the server looked for a gone client, which it did
    only when none came for a while): the generation still stops soon after the client
    leaves, and the session is free."""
    import socket

    import ptexec.serve.engine as engine_module

    made = engine_module._sink

    def slow(loop: Any, job: Any) -> Any:  # about 50 tokens a second
        sink = made(loop, job)

        def piece(text: str) -> None:
            time.sleep(0.02)
            sink(text)

        return piece

    monkeypatch.setattr(engine_module, "_sink", slow)
    with running_server(tok, sessions=1, max_queue=0) as server:
        body = json.dumps({"model": "tiny-llama", "prompt": "The robot", "max_tokens": 120,
                           "temperature": 0, "ignore_eos": True}).encode()  # fmt: skip
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
            time.sleep(0.5)
        for _ in range(200):
            if server.engine.idle:
                break
            time.sleep(0.02)
        assert server.engine.idle
        assert server.engine.metrics.generated_tokens < 100  # not all 120


def test_timeout_answers_504_and_the_server_goes_on(
    tok: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptexec.llm.decoder import TextDecoder

    step = TextDecoder.step

    def slow_step(self: TextDecoder, *args: Any, **kwargs: Any) -> torch.Tensor:
        # 2 ms a decode step: 120 tokens outlast the 50 ms on any machine (on a quiet
        # one the tiny model's own 120 steps took less, and the reply came in time)
        time.sleep(0.002)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(TextDecoder, "step", slow_step)
    with running_server(tok, sessions=1, max_queue=2, timeout=0.05) as server:
        body = {"model": "tiny-llama", "prompt": "The robot", "max_tokens": 120,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        assert server.engine.idle
        # tokens that make no text (a control token forced) are timed too
        r = httpx.post(server.url + "/v1/completions", json={**body, "logit_bias": {"1": 100}},
                       timeout=60)  # fmt: skip
        assert r.status_code == 504, r.text
        assert server.engine.idle
        metrics = server.engine.metrics.render()
        assert 'endpoint="completions",status="504"' in metrics


@pytest.mark.slow  # a server process of its own: about 17 s
def test_sigterm_drains_without_losing_a_reply(tok: Path, tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
    code = "import sys; from ptexec.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "serve", str(program("portable")), "--tokenizer",
            str(tok), "--port", "0", "--max-sessions", "2", "--threads", "1",
            "--model-name", "tiny-llama", "--log-level", "error"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        # "ptexec: serving 'tiny-llama' at http://127.0.0.1:PORT/v1", after what ExecuTorch's
        # runtime logs when --threads sets its thread pool
        for _ in range(100):
            line = proc.stderr.readline()
            if not line or "ptexec: serving" in line:
                break
        assert "serving 'tiny-llama' at http://127.0.0.1:" in line, line
        url = line.strip().rsplit(" ", 1)[-1].removesuffix("/v1")
        # the server's later lines are read as they come: a pipe nobody reads would stop the
        # server at its next write once full, and they say what went wrong if anything does
        said: list[str] = []
        threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True).start()

        async def run() -> tuple[list[str], int, int]:
            async with httpx.AsyncClient(timeout=60) as client:
                # long replies (most of the 128-token context): still running after the signal
                body = {"model": "tiny-llama", "prompt": "The storm", "max_tokens": 110,
                        "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
                streaming = asyncio.Event()

                async def one() -> str:
                    async with client.stream("POST", url + "/v1/completions", json=body) as r:
                        assert r.status_code == 200
                        lines = []
                        async for x in r.aiter_lines():
                            streaming.set()
                            if x:
                                lines.append(x)
                        return "\n".join(lines)

                tasks = [asyncio.ensure_future(one()) for _ in range(4)]
                started = asyncio.ensure_future(streaming.wait())
                await asyncio.wait(
                    [started, *tasks], timeout=60, return_when=asyncio.FIRST_COMPLETED
                )
                if not streaming.is_set():  # no reply is being streamed: say why
                    for task in tasks:
                        if task.done():
                            task.result()
                    raise AssertionError(f"no reply streamed in 60 s; the server said {said}")
                proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.1)
                refused = (await client.get(url + "/health")).status_code
                late = (await client.post(url + "/v1/completions", json={**body,
                        "stream": False})).status_code  # fmt: skip
                return list(await asyncio.wait_for(asyncio.gather(*tasks), 120)), refused, late

        replies, health, late = asyncio.run(run())
        assert health == 503 and late == 503
        for reply in replies:
            events = reply.splitlines()
            assert events[-1] == "data: [DONE]"
            finals = [json.loads(e[6:]) for e in events[:-1]][-1]
            assert finals["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
