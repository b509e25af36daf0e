"""Shared by the server tests: a tokenizer folder with a chat template, servers on free
loopback ports, and the greedy reference a request must equal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from llm_support import llm_programs, program

# Our own template in the usual shape: BOS first, one line per turn, EOS after the
# assistant's turns, the assistant's turn opened by add_generation_prompt.
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}System: {{ message['content'] | trim }}\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] | trim }}\n"
    "{% elif message['role'] == 'assistant' %}Assistant: {% generation %}"
    "{{ message['content'] | trim }}{% endgeneration %}{{ eos_token }}\n"
    "{% else %}{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def tokenizer_folder(folder: Path) -> Path:
    """``tokenizer.json`` and a ``tokenizer_config.json`` with :data:`TEMPLATE`."""
    tok = llm_programs.make_tokenizer(folder / "tokenizer.json")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TEMPLATE
    config_path.write_text(json.dumps(config))
    return tok


@contextmanager
def running_server(tok: Path, **options: Any) -> Iterator[Any]:
    """A server for the portable tiny Llama on a free 127.0.0.1 port (in this process)."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from ptexec.serve import Engine, Server

    server_options = {
        k: options.pop(k) for k in ("api_key", "max_body_bytes", "drain_timeout") if k in options
    }
    engine = Engine(program("portable"), tok, model_name="tiny-llama", **options)
    server = Server(engine, "127.0.0.1", 0, **server_options).start()
    try:
        yield server
    finally:
        server.stop()
