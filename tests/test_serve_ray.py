"""``ptexec.ray.serve``: the server's application as a Ray Serve deployment with 2 replicas
on a local Ray (2 CPUs) answers the same requests as ``ptexec serve``: greedy chat equal to
the runner, program methods equal to ExecuTorch's runtime."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixture_data import fixture_paths
from llm_support import PROMPT, program
from ptexec.llm import GenerationConfig, TextLLMRunner
from serve_support import tokenizer_folder

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    pytest.importorskip("starlette")
    import logging

    import ptexec.ray.serve as pserve

    tok = tokenizer_folder(tmp_path_factory.mktemp("tok"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=256 << 20, logging_level=logging.ERROR)  # fmt: skip
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = pserve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.5}).bind(
            str(program("portable")), str(tok), sessions=1, model_name="tiny-llama",
            programs=True, threads=1,
        )  # fmt: skip
        serve.run(app, route_prefix="/", name="ptexec")
        yield f"http://127.0.0.1:{port}", tok
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_like_ptexec_serve(ray_serve: tuple[str, Path]) -> None:
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    from ray import serve

    url, tok = ray_serve
    status = serve.status().applications["ptexec"]
    running = status.deployments["PtexecServer"].replica_states.get("RUNNING", 0)
    assert running == 2
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    runner = TextLLMRunner(str(program("portable")), str(tok), print_output=False)
    rendered = "<|begin_of_text|>User: " + PROMPT + "\nAssistant:"
    want = runner.generate_text(
        rendered, GenerationConfig(max_new_tokens=8, temperature=0, echo=False)
    )
    for _ in range(4):  # spread over the replicas
        r = client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": PROMPT}],
            max_tokens=8, temperature=0,
        )  # fmt: skip
        assert r.choices[0].message.content == want
    chunks = list(
        client.completions.create(
            model="tiny-llama", prompt=PROMPT, max_tokens=6, temperature=0, stream=True
        )
    )
    runner.reset()
    assert "".join(c.choices[0].text for c in chunks) == runner.generate_text(
        PROMPT, GenerationConfig(max_new_tokens=6, temperature=0, echo=False)
    )
    # the LLM program's own methods, through the program route
    r = httpx.post(url + "/v1/programs/get_max_seq_len", json={"inputs": []}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == runner.decoder.max_seq_len


def test_build_app_takes_a_config_files_args(ray_serve: tuple[str, Path]) -> None:
    import ptexec.ray.serve as pserve

    _, tok = ray_serve
    app = pserve.build_app({"model": str(program("portable")), "tokenizer": str(tok)})
    assert type(app).__name__ == "Application"
    with pytest.raises(KeyError):
        pserve.build_app({"tokenizer": str(tok)})


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ({"sessions": 4}, "sessions"),
        ({"max_queue": 0}, "max_queue"),
        ({"timeout": 0.5}, "timeout"),
        ({"chat_template": "template.jinja"}, "chat_template"),
        ({"batch_window_ms": 50.0}, "batch_window_ms"),
        ({"join_rows": True, "batch_window_ms": 50.0, "tokenizer": "tok"}, "join_rows"),
    ],
)
def test_options_nothing_served_would_honour_are_refused(
    args: dict[str, object], option: str
) -> None:
    """As ``ptexec serve`` refuses them (exit 2): serving the methods alone, the limits of
    generations bound nothing and a chat template templates nothing; the window is the
    methods' with join_rows, and join_rows the methods' (an LLM serves none without
    programs=True). Refused before any replica starts, not served without them."""
    pytest.importorskip("ray.serve")
    import ptexec.ray.serve as pserve
    from ptexec.errors import ConfigValueError

    model = str(fixture_paths("mlp")[0])
    with pytest.raises(ConfigValueError, match=option) as refused:
        pserve.build_app({"model": model, **args})
    assert refused.value.field == option
    if "tokenizer" in args:  # served with the methods, join_rows and its window hold
        pserve.build_app({"model": model, **args, "programs": True})
    else:
        pserve.build_app({"model": model, "join_rows": True, "batch_window_ms": 50.0})
