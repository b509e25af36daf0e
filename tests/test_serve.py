"""``ptexec serve`` with the official ``openai`` client on loopback: chat, completions,
streaming, stop strings, seeds, structured output, usage, errors; greedy answers equal
``ptexec generate`` with the same template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_support import PROMPT, program
from ptexec.llm import GenerationConfig, TextLLMRunner
from serve_support import TEMPLATE, running_server, tokenizer_folder

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tokenizer_folder(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def server(tok: Path) -> Iterator[Any]:
    torch.set_num_threads(1)
    with running_server(tok, sessions=2, max_queue=8, api_key=KEY, max_body_bytes=20_000) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tok: Path) -> TextLLMRunner:
    return TextLLMRunner(str(program("portable")), str(tok), print_output=False)


def greedy(runner: TextLLMRunner, prompt: str, n: int, stop: tuple[str, ...] = ()) -> str:
    runner.reset()
    config = GenerationConfig(max_new_tokens=n, temperature=0, echo=False, stop=stop)
    return runner.generate_text(prompt, config)


def test_chat_greedy_equals_generate_chat(
    client: Any, tok: Path, reference: TextLLMRunner, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptexec.cli import main

    r = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        temperature=0,
    )
    text = r.choices[0].message.content
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    argv = ["generate", str(program("portable")), "--tokenizer", str(tok), "--prompt", PROMPT,
            "--chat", "--max-new-tokens", "12", "--temperature", "0"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out == text + "\n"
    rendered = "<|begin_of_text|>User: " + PROMPT + "\nAssistant:"
    assert text == greedy(reference, rendered, 12)
    ids = reference.tokenizer.encode(rendered)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(reference.generated_tokens)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason == ("stop" if reference.finish_reason == "stop" else "length")


def test_completion_stop_strings_and_length(client: Any, reference: TextLLMRunner) -> None:
    full = greedy(reference, PROMPT, 16)
    r = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=16, temperature=0)
    assert r.choices[0].text == full and r.object == "text_completion"
    assert r.choices[0].finish_reason == (
        "length" if reference.finish_reason == "length" else "stop"
    )
    stop = full[3:6]  # a stop string inside the greedy text
    r = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "zzzz"]
    )
    assert r.choices[0].text == greedy(reference, PROMPT, 16, (stop, "zzzz"))
    assert stop not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    echoed = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=4, temperature=0, echo=True
    )
    assert echoed.choices[0].text == PROMPT + greedy(reference, PROMPT, 4)


def test_streaming_chunks_join_to_the_answer_and_end_with_done(
    client: Any, server: Any, reference: TextLLMRunner
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    whole = client.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=10, temperature=0
    )
    stream = client.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    # the raw event stream: OpenAI's framing, ending with [DONE]
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 5, "temperature": 0,
            "stream": True}  # fmt: skip
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body,
        headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
    ) as r:  # fmt: skip
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    pieces = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(p["choices"][0]["text"] for p in pieces) == greedy(reference, PROMPT, 5)


def test_seed_reproduces_sampling(client: Any) -> None:
    def sample(seed: int) -> str:
        r = client.completions.create(
            model="tiny-llama", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=seed
        )
        return str(r.choices[0].text)

    assert sample(11) == sample(11)
    assert len({sample(s) for s in range(4)}) > 1


def test_json_schema_response_validates(client: Any) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 10},
            "rain": {"type": "boolean"},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["city", "rain", "days"],
        "additionalProperties": False,
    }
    for seed in range(3):
        r = client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "Weather as JSON"}],
            max_tokens=40,
            temperature=1.0,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "weather", "schema": schema, "strict": True},
            },
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "JSON"}], max_tokens=40,
        temperature=0, response_format={"type": "json_object"},
    )  # fmt: skip
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert r.choices[0].message.content.startswith("{")


def test_a_grammar_the_vocabulary_cannot_finish_is_a_400(server: Any) -> None:
    """The schema's string begins with text the tokenizer writes and goes on with a
    character its vocabulary lacks: the request's error (400, or an error event of the
    request's when streamed), at the token where it is needed, not the server's 500."""
    schema = {"type": "string", "enum": ["a\u00e9\u00e9"]}
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 10, "temperature": 1.0, "seed": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}  # fmt: skip
    err = _error(_post(server, "/v1/chat/completions", body), 400)
    assert err["param"] == "response_format" and "cannot write" in err["message"]
    r = _post(server, "/v1/chat/completions", {**body, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    assert events[-1]["error"]["type"] == "invalid_request_error", events[-1]
    # a schema the matcher cannot follow (recursive) fails while decoding: the request's too
    body["response_format"]["json_schema"]["schema"] = {"$ref": "#"}
    err = _error(_post(server, "/v1/chat/completions", body), 400)
    assert "grammar" in err["message"] and len(err["message"]) < 400
    # a token id too long to be one
    body = {"model": "tiny-llama", "prompt": "a", "max_tokens": 1, "logit_bias": {"9" * 5000: 1}}
    assert _error(_post(server, "/v1/completions", body), 400)["param"] == "logit_bias"
    body["logit_bias"] = {"0" * 30 + "1": 1}  # (zeros before an id do not make it long)
    assert _post(server, "/v1/completions", body).status_code == 200
    # audio a chat holds that cannot be read: its error names no path of the server's
    from ptexec.errors import AudioFormatError
    from ptexec.serve.engine import _read_audio

    with pytest.raises(AudioFormatError) as unread:
        _read_audio(b"not audio", 16000)
    assert "ptexec-audio" not in str(unread.value) and "the audio" in str(unread.value)


def _post(
    server: Any, path: str, body: Any, key: str | None = KEY, raw: bytes | None = None
) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        headers["Content-Type"] = "application/json"
        return httpx.post(server.url + path, content=raw, headers=headers, timeout=60)
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def _error(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in r.text and ".py" not in r.text
    assert str(program("portable").parent) not in r.text  # no paths of this machine
    return dict(err)


def test_openai_style_errors(client: Any, server: Any) -> None:
    chat = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    _error(_post(server, chat, None, raw=b'{"model": "tiny-llama", "messages": ['), 400)
    err = _error(_post(server, chat, {"model": "tiny-llama", "messages": msgs,
                                      "temperature": "hot"}), 400)  # fmt: skip
    assert err["param"] == "temperature"
    assert _error(_post(server, chat, {"model": "x", "messages": msgs}), 404)["code"] == (
        "model_not_found"
    )
    long_prompt = "robot " * 200  # past the 128-token context
    err = _error(
        _post(server, "/v1/completions", {"model": "tiny-llama", "prompt": long_prompt}), 400
    )
    assert err["code"] == "context_length_exceeded"
    err = _error(_post(server, "/v1/completions",
                       {"model": "tiny-llama", "prompt": "a", "max_tokens": 1000}), 400)  # fmt: skip
    assert err["code"] == "context_length_exceeded"
    _error(_post(server, chat, {"model": "tiny-llama", "messages": msgs, "n": 2}), 400)
    _error(_post(server, chat, {"model": "tiny-llama", "messages": msgs}, key=None), 401)
    _error(_post(server, chat, {"model": "tiny-llama", "messages": msgs}, key="wrong"), 401)
    _error(_post(server, "/v1/completions", {"model": "tiny-llama", "prompt": "a" * 30_000}), 413)
    nested = _error(_post(server, chat, None, raw=b"[" * 9_000 + b"]" * 9_000), 400)
    assert "nested too deep" in nested["message"]
    for lone in (b'{"model": "tiny-llama", "prompt": "a\\ud800"}',
                 b'{"model": "\\udfff", "prompt": "a"}'):  # fmt: skip
        assert (
            "surrogate" in _error(_post(server, "/v1/completions", None, raw=lone), 400)["message"]
        )
    paired = b'{"model": "tiny-llama", "prompt": "a\\ud83d\\ude00", "max_tokens": 1}'
    assert _post(server, "/v1/completions", None, raw=paired).status_code == 200
    _error(httpx.get(server.url + "/v2/nothing", timeout=10), 404)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=msgs)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "wizard", "content": "x"}]
        )
    # after all of that, the server still answers
    r = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=3, temperature=0)
    assert r.choices[0].text


def test_models_health_and_metrics(client: Any, server: Any) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401
    text = httpx.get(
        server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    ).text
    assert 'ptexec_requests_total{endpoint="completions",status="200"}' in text
    assert "ptexec_time_to_first_token_seconds_count" in text
    assert "ptexec_tokens_per_second_bucket" in text and "ptexec_queue_depth 0" in text


def test_chat_template_renders_as_transformers_does(tok: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from ptexec.llm.chat import ChatTemplate

    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tok), bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
    )
    ours = ChatTemplate.for_tokenizer(tok)
    assert ours is not None
    chatml = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
        "{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}"
    )
    conversations = [
        [{"role": "user", "content": "Hello"}],
        [
            {"role": "system", "content": "  Terse.  "},
            {"role": "user", "content": "Zwei Wörter & <b>"},
            {"role": "assistant", "content": "Ja."},
            {"role": "user", "content": "Noch?"},
        ],
    ]
    for template in (TEMPLATE, chatml):
        mine = ChatTemplate(template, ours.special_tokens)
        for messages in conversations:
            for gen in (True, False):
                want = hf.apply_chat_template(
                    messages, chat_template=template, tokenize=False, add_generation_prompt=gen
                )
                assert mine.render(messages, add_generation_prompt=gen) == want
    tools = [{"type": "function", "function": {"name": "f", "description": "é"}}]
    want = hf.apply_chat_template(
        conversations[0], chat_template=chatml, tokenize=False, tools=tools
    )
    assert (
        ChatTemplate(chatml).render(conversations[0], add_generation_prompt=False, tools=tools)
        == want
    )
    from ptexec.llm.chat import ChatTemplateError

    with pytest.raises(ChatTemplateError, match="unknown role"):
        ours.render([{"role": "tool", "content": "x"}])
    with pytest.raises(ChatTemplateError):  # the sandbox refuses Python internals
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])


_DOCUMENTS = (  # a retrieval template in the way Command R's and Granite's write documents
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if documents %}<|documents|>{% for d in documents %}[{{ loop.index0 }}] "
    "{{ d.title }}: {{ d.text }}\n{% endfor %}{% endif %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_documents_render_as_transformers_renders_them(tok: Path) -> None:
    """``documents`` (transformers' ``apply_chat_template`` argument for retrieval
    templates) reach the template; given to ``render``, they were a second value of the
    variable and the render failed."""
    transformers = pytest.importorskip("transformers")
    from ptexec.llm.chat import ChatTemplate

    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok))
    messages = [{"role": "user", "content": "Where?"}]
    documents = [{"title": "Alps", "text": "Zürich is near."}, {"title": "Sea", "text": "No."}]
    for given in (documents, None):
        want = hf.apply_chat_template(
            messages, chat_template=_DOCUMENTS, tokenize=False, add_generation_prompt=True,
            documents=given,
        )  # fmt: skip
        assert ("[1] Sea: No.\n" in want) == (given is not None)
        assert ChatTemplate(_DOCUMENTS).render(messages, documents=given) == want


_TOOL_HISTORY = (  # a tool-use template in the way Llama 3.1's and Qwen2.5's write calls
    "{% for m in messages %}<|{{ m.role }}|>"
    "{% if m.name is defined %}({{ m.name }}){% endif %}"
    "{% if m.tool_call_id is defined %}[{{ m.tool_call_id }}]{% endif %}"
    "{{ m.content }}"
    "{% for call in m.tool_calls or [] %}<call>{{ call.id }} {{ call.function.name }} "
    "{{ call.function.arguments | tojson }}</call>{% endfor %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_tool_call_history_renders_as_transformers_renders_it(tok: Path) -> None:
    """An OpenAI client replays a conversation's tool calls (``function.arguments`` as JSON
    text, ``tool_call_id``, ``name``): the template sees them as transformers' templates
    take them (arguments an object), not an empty assistant turn."""
    transformers = pytest.importorskip("transformers")
    from ptexec.llm.chat import ChatTemplate, ChatTemplateError
    from ptexec.serve.protocol import ApiError, parse_request

    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok))
    call = {"id": "call_1", "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Zürich", "days": 2}'}}  # fmt: skip
    sent = [
        {"role": "user", "content": "Weather?", "name": "ana"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20C"},
        {"role": "assistant", "content": "Warm.", "tool_calls": []},
        {"role": "user", "content": "And tomorrow?"},
    ]
    as_transformers_takes_it = [
        sent[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    **call,
                    "function": {"name": "weather", "arguments": {"city": "Zürich", "days": 2}},
                }
            ],
        },
        sent[2],
        {"role": "assistant", "content": "Warm."},
        sent[4],
    ]
    want = hf.apply_chat_template(
        as_transformers_takes_it, chat_template=_TOOL_HISTORY, tokenize=False,
        add_generation_prompt=True,
    )  # fmt: skip
    assert '<call>call_1 weather {"city": "Zürich", "days": 2}</call>' in want
    request = parse_request({"model": "m", "messages": sent}, True)
    assert ChatTemplate(_TOOL_HISTORY).render(request.messages) == want
    for bad in (
        {"role": "assistant", "tool_calls": {"id": "x"}},
        {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{no"}}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "3"}}]},
        {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "f", "arguments": "[" * 50_000 + "]" * 50_000}}],
        },
        {"role": "tool", "tool_call_id": 7, "content": "x"},
        {"role": "user", "name": ["a"], "content": "x"},
    ):
        with pytest.raises(ApiError) as refused:
            parse_request({"model": "m", "messages": [bad]}, True)
        assert refused.value.status == 400 and refused.value.param == "messages"
    # a template failing in any way is the conversation's error (a 400), not the server's
    for failing in ("{{ 1 // 0 }}", "{% for i in range(10**9) %}{% endfor %}"):
        with pytest.raises(ChatTemplateError, match="the chat template failed"):
            ChatTemplate(failing).render(sent[:1])


# -- log-probabilities, scored prompts, several prompts ----------------------------------------


def _reference_logprobs(tokens: list[int]) -> list[torch.Tensor]:
    from llm_support import executorch_logits

    return [torch.log_softmax(r, 0) for r in executorch_logits(program("portable"), tokens)]


def test_echoed_prompt_logprobs_equal_executorch(client: Any, reference: TextLLMRunner) -> None:
    """What an evaluation harness asks (loglikelihood): token ids, ``echo``, ``logprobs``,
    one token generated; every prompt token's log-probability, its alternatives and the
    generated token's equal ExecuTorch's runtime on the same program."""
    ids = reference.tokenizer.encode(PROMPT + " there was")
    r = client.completions.create(
        model="tiny-llama", prompt=ids, max_tokens=1, echo=True, logprobs=3, temperature=0
    )
    choice = r.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    want = _reference_logprobs(ids)
    tok = reference.tokenizer
    for i in range(1, len(ids) + 1):
        row = want[i - 1]
        chosen = ids[i] if i < len(ids) else int(row.argmax())  # greedy: the likeliest
        assert lp.tokens[i] == tok.decode([chosen])
        assert lp.token_logprobs[i] == pytest.approx(float(row[chosen]), abs=1e-4)
        best = torch.topk(row, 3)
        expected = {
            tok.decode([int(j)]): float(v) for j, v in zip(best.indices, best.values, strict=True)
        }
        expected.setdefault(lp.tokens[i], float(row[chosen]))
        assert lp.top_logprobs[i].keys() == expected.keys()
        for k, v in expected.items():
            assert lp.top_logprobs[i][k] == pytest.approx(v, abs=1e-4)
    assert choice.text == tok.decode(ids) + greedy(reference, tok.decode(ids), 1)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 1
    # max_tokens=0: the prompt scored alone, the same numbers
    r0 = client.completions.create(
        model="tiny-llama", prompt=ids, max_tokens=0, echo=True, logprobs=3, temperature=0
    )
    assert r0.choices[0].logprobs.token_logprobs == lp.token_logprobs[: len(ids)]
    assert r0.choices[0].text == tok.decode(ids) and r0.usage.completion_tokens == 0


def test_several_prompts_answer_as_each_alone(client: Any) -> None:
    prompts: list[Any] = ["Once upon", [5, 6, 7, 8], "The robot"]
    r = client.completions.create(
        model="tiny-llama", prompt=prompts, max_tokens=4, temperature=0, logprobs=1
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    total = 0
    for prompt, choice in zip(prompts, r.choices, strict=True):
        alone = client.completions.create(
            model="tiny-llama", prompt=prompt, max_tokens=4, temperature=0, logprobs=1
        )
        assert choice.text == alone.choices[0].text
        assert choice.logprobs.token_logprobs == alone.choices[0].logprobs.token_logprobs
        total += alone.usage.total_tokens
    assert r.usage.total_tokens == total


def test_generated_logprobs_streamed_and_chat(client: Any, reference: TextLLMRunner) -> None:
    whole = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2
    )
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == whole.usage.completion_tokens
    ids = reference.tokenizer.encode(PROMPT)
    want = _reference_logprobs(ids)[-1]
    assert lp.token_logprobs[0] == pytest.approx(float(want.max()), abs=1e-4)
    for tokens, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert tokens == pytest.approx(max(top.values()))  # greedy: the likeliest each time
    chunks = list(
        client.completions.create(
            model="tiny-llama", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2,
            stream=True,
        )
    )  # fmt: skip
    streamed = [
        v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == lp.token_logprobs
    # chat: logprobs: true with top_logprobs, on the rendered prompt's distribution
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=4,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    rendered = "<|begin_of_text|>User: " + PROMPT + "\nAssistant:"
    first = _reference_logprobs(reference.tokenizer.encode(rendered))[-1]
    assert content[0].logprob == pytest.approx(float(first.max()), abs=1e-4)
    for item in content:
        assert len(item.top_logprobs) == 4
        values = [t.logprob for t in item.top_logprobs]
        assert values == sorted(values, reverse=True) and item.logprob == pytest.approx(values[0])
        assert item.bytes == list(item.token.encode("utf-8"))
    plain = client.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=6, temperature=0
    )
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == chat.choices[0].message.content


def test_logprobs_and_prompt_errors(server: Any) -> None:
    chat, done = "/v1/chat/completions", "/v1/completions"
    msgs = [{"role": "user", "content": "hi"}]
    base = {"model": "tiny-llama"}
    assert (
        _error(_post(server, chat, {**base, "messages": msgs, "top_logprobs": 2}), 400)["param"]
        == "top_logprobs"
    )
    _error(
        _post(server, chat, {**base, "messages": msgs, "logprobs": True, "top_logprobs": 21}), 400
    )
    _error(_post(server, chat, {**base, "messages": msgs, "logprobs": 1}), 400)
    _error(_post(server, chat, {**base, "messages": msgs, "max_tokens": 0}), 400)
    _error(_post(server, done, {**base, "prompt": "a", "logprobs": 21}), 400)
    _error(_post(server, done, {**base, "prompt": ["a", "b"], "stream": True}), 400)
    _error(_post(server, done, {**base, "prompt": [1, "a"]}), 400)
    _error(_post(server, done, {**base, "prompt": [[1, 2], []]}), 400)
    _error(_post(server, done, {**base, "prompt": []}), 400)
    err = _error(_post(server, done, {**base, "prompt": [1, 10**9]}), 400)
    assert err["param"] == "prompt" and "vocabulary" in err["message"]


_NEW = "{{ bos_token }}[NEW] {% for m in messages %}{{ m['content'] }}{% endfor %}{{ eos_token }}"
_OLD = "[OLD] {% for m in messages %}{{ m['content'] }}{% endfor %}"
_TOOLS = "[TOOLS {{ tools | length }}] {% for m in messages %}{{ m['content'] }}{% endfor %}"


_LAYOUTS = [
    "file_over_config",
    "named_files",
    "named_in_config",
    "special_tokens_map",
    "map_ignored_with_added_tokens",
]


@pytest.mark.parametrize("layout", _LAYOUTS)
def test_the_template_and_special_tokens_transformers_picks(tmp_path: Path, layout: str) -> None:
    """Where a checkpoint keeps several templates or its special tokens in the older files,
    the prompt is the one transformers' tokenizer renders from the same folder:
    ``chat_template.jinja`` over the config's, ``additional_chat_templates/`` and a named
    ``tool_use`` for tools, ``special_tokens_map.json`` where the config lists no added
    tokens."""
    transformers = pytest.importorskip("transformers")
    from ptexec.llm.chat import ChatTemplate

    tok = tokenizer_folder(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("added_tokens_decoder", None)
    if layout == "file_over_config":
        config["chat_template"] = _OLD
        (tmp_path / "chat_template.jinja").write_text(_NEW)
    elif layout == "named_files":
        config["chat_template"] = _OLD
        (tmp_path / "chat_template.jinja").write_text(_NEW)
        (tmp_path / "additional_chat_templates").mkdir()
        (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text(_TOOLS)
    elif layout == "named_in_config":
        config["chat_template"] = [
            {"name": "tool_use", "template": _TOOLS},
            {"name": "default", "template": _NEW},
        ]
    else:
        config["chat_template"] = _NEW
        bos, eos = config.pop("bos_token"), config.pop("eos_token")
        (tmp_path / "special_tokens_map.json").write_text(
            json.dumps({"bos_token": {"content": bos}, "eos_token": eos})
        )
        if layout == "map_ignored_with_added_tokens":
            config["added_tokens_decoder"] = {
                "0": {"content": "<unk>", "special": True},
                "1": {"content": bos, "special": True},
                "2": {"content": eos, "special": True},
            }
    config_path.write_text(json.dumps(config))
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    ours = ChatTemplate.for_tokenizer(tok)
    assert ours is not None
    messages = [{"role": "user", "content": "Hi there"}]
    tools = [{"type": "function", "function": {"name": "f", "description": "g"}}]
    for given in (None, tools):
        want = hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, tools=given
        )
        assert ours.render(messages, add_generation_prompt=True, tools=given) == want, given
    if layout == "special_tokens_map":
        assert ours.render(messages).startswith("<|begin_of_text|>[NEW]")


def test_the_key_comes_from_the_environment_and_is_never_empty(
    monkeypatch: pytest.MonkeyPatch, tok: Path
) -> None:
    """``PTEXEC_API_KEY`` gives ``serve`` its key (off the process list); an empty key is
    refused (any client sending ``Bearer`` with nothing after it would match it)."""
    from ptexec.cli import build_parser
    from ptexec.serve import Engine, Server

    monkeypatch.setenv("PTEXEC_API_KEY", "from-env")
    assert build_parser().parse_args(["serve", "m.pte"]).api_key == "from-env"
    assert build_parser().parse_args(["serve", "m.pte", "--api-key", "k"]).api_key == "k"
    monkeypatch.delenv("PTEXEC_API_KEY")
    assert build_parser().parse_args(["serve", "m.pte"]).api_key is None
    engine = Engine(program("portable"), tok, model_name="tiny-llama")
    for empty in ("", "  "):
        with pytest.raises(ValueError, match="empty"):
            Server(engine, "127.0.0.1", 0, api_key=empty)
