"""``ptexec serve`` on the details of OpenAI's contract that clients read: streamed
log-probabilities belong to the chunk whose text their tokens make; a token holding part of
a character has its own bytes (and a name of its own); text offsets index the returned
text; ``logit_bias`` bans and forces tokens; a completion's default length; signed seeds;
fields that are refused rather than ignored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_support import program
from serve_support import TEMPLATE, running_server, tokenizer_folder

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
tokenizers = pytest.importorskip("tokenizers")

MODEL = "tiny-llama"
PROMPT = "Once upon a time"
SPECIAL = ("<unk>", "<|begin_of_text|>", "<|end_of_text|>")  # control tokens: no text


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tokenizer_folder(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def server(tok: Path) -> Iterator[Any]:
    torch.set_num_threads(1)
    with running_server(tok, sessions=1, max_queue=8) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=60)


def _byte_level_tokenizer(folder: Path) -> Path:
    """A byte-level BPE tokenizer of 512 ids (the tiny program's vocabulary) whose merges
    leave most characters beyond ASCII as one token per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = ["Once upon a time there was a café in 日本 with 😀 and naïve façades"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(corpus, trainer)
    assert tk.get_vocab_size() <= 512
    tk.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return folder / "tokenizer.json"


def _stream(server: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with httpx.stream("POST", server.url + "/v1/completions" if "prompt" in body
                      else server.url + "/v1/chat/completions", json=body, timeout=60) as r:  # fmt: skip
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def test_streamed_logprobs_belong_to_their_chunk(server: Any) -> None:
    """Each chunk's log-probabilities are those of the tokens whose text it carries (the
    session samples ahead of the stream: they were attached to whatever chunk was being
    written when they came in)."""
    for seed in range(6):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "seed": seed,
                "logprobs": 1, "stream": True}  # fmt: skip
        text = ""
        for c in _stream(server, body):
            choice = c["choices"][0]
            lp = choice["logprobs"]
            if choice["text"]:
                assert "".join(lp["tokens"]) == choice["text"], (seed, choice)
                assert lp["text_offset"][0] == len(text)
            text += choice["text"]
        chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 24, "seed": seed, "logprobs": True, "stream": True}  # fmt: skip
        for c in _stream(server, chat):
            choice = c["choices"][0]
            content = choice["delta"].get("content")
            if content:
                got = b"".join(bytes(e["bytes"]) for e in choice["logprobs"]["content"])
                assert got.decode("utf-8") == content, (seed, choice)


def test_tokens_that_split_a_character_have_their_bytes(tmp_path: Path) -> None:
    """A token holding part of a character: its ``bytes`` are its own (joined in order they
    give the text), its name is ``bytes:\\xNN`` (distinct from other partial tokens), and a
    completion's ``text_offset`` counts the character once, at the token completing it."""
    tokenizer = _byte_level_tokenizer(tmp_path)
    from ptexec.llm.tokenizer import load_tokenizer
    from ptexec.serve.engine import token_name

    tk = load_tokenizer(tokenizer)
    ids = tk.encode("日本 😀")
    assert b"".join(tk.token_bytes(i) for i in ids) == "日本 😀".encode()
    partial = [i for i in ids if not tk.token_bytes(i).decode("utf-8", "ignore")]
    assert partial, "the tokenizer splits these characters"
    assert all(token_name(tk.token_bytes(i)).startswith("bytes:\\x") for i in partial)
    assert token_name(b"\xe6\x97") == "bytes:\\xe6\\x97" and token_name(b"ab") == "ab"

    with running_server(tokenizer.parent, sessions=1) as server:
        seen_partial = False
        for seed in range(12):
            chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                    "max_tokens": 20, "seed": seed, "logprobs": True, "top_logprobs": 5}  # fmt: skip
            r = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()
            choice = r["choices"][0]
            entries = choice["logprobs"]["content"]
            text = b"".join(bytes(e["bytes"]) for e in entries if e["token"] not in SPECIAL)
            assert text.decode("utf-8", "replace") == choice["message"]["content"]
            for e in entries:
                if e["token"].startswith("bytes:"):
                    seen_partial = True
                    assert "\\x" + "\\x".join(f"{b:02x}" for b in e["bytes"]) == e["token"][6:]
                names = [t["token"] for t in e["top_logprobs"]]
                assert len(set(names)) == len(names) == 5
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 20, "seed": seed,
                    "logprobs": 1, "echo": True}  # fmt: skip
            c = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
            c = c["choices"][0]
            offsets, names = c["logprobs"]["text_offset"], c["logprobs"]["tokens"]
            assert offsets == sorted(offsets) and offsets[-1] <= len(c["text"])
            for start, name in zip(offsets, names, strict=True):
                if not name.startswith("bytes:") and name not in SPECIAL:
                    assert c["text"][start : start + len(name)] == name
        assert seen_partial, "no token split a character in 12 samples"


def test_logit_bias_bans_and_forces_tokens(client: Any, tok: Path) -> None:
    from ptexec.llm.tokenizer import load_tokenizer

    tk = load_tokenizer(tok)
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                       logprobs=0)  # fmt: skip
    first = greedy.choices[0].logprobs.tokens[0]
    first_id = next(i for i in range(tk.vocab_size) if tk.decode([i]) == first)
    banned = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                       logprobs=0, logit_bias={str(first_id): -100})  # fmt: skip
    assert banned.choices[0].logprobs.tokens[0] != first
    forced_id = 100
    forced = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0.9,
                                       seed=3, logit_bias={str(forced_id): 100})  # fmt: skip
    assert forced.choices[0].text == tk.decode([forced_id] * 3)


def _status(server: Any, body: dict[str, Any], route: str = "/v1/completions") -> tuple[int, Any]:
    r = httpx.post(server.url + route, json=body, timeout=60)
    return r.status_code, r.json()


def test_completion_defaults_seeds_and_refused_fields(server: Any) -> None:
    # a completion without max_tokens generates 16 at most (OpenAI's default)
    status, body = _status(server, {"model": MODEL, "prompt": PROMPT, "ignore_eos": True})
    assert status == 200 and body["usage"]["completion_tokens"] == 16
    assert body["choices"][0]["finish_reason"] == "length"
    # OpenAI's seeds are signed: a negative one seeds the generator (was a 500)
    texts = set()
    for _ in range(2):
        status, body = _status(
            server, {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "seed": -1}
        )
        assert status == 200
        texts.add(body["choices"][0]["text"])
    assert len(texts) == 1
    for extra, param in (
        ({"suffix": " The end."}, "suffix"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
        ({"logit_bias": [1]}, "logit_bias"),
        # both token bounds are checked, though the newer name wins (it was taken alone)
        ({"max_completion_tokens": 5, "max_tokens": -3}, "max_tokens"),
    ):
        status, body = _status(server, {"model": MODEL, "prompt": PROMPT, **extra})
        assert status == 400 and body["error"]["param"] == param, (extra, body)
    status, body = _status(
        server,
        {"model": MODEL, "prompt": PROMPT, "max_completion_tokens": 3, "max_tokens": 9,
         "ignore_eos": True},
    )  # fmt: skip
    assert status == 200 and body["usage"]["completion_tokens"] == 3


def test_a_model_is_retrieved_by_its_id(client: Any) -> None:
    """``GET /v1/models/{id}`` (the client's ``models.retrieve``): the served model, or
    OpenAI's 404 for another."""
    m = client.models.retrieve(MODEL)
    assert (m.id, m.object, m.owned_by) == (MODEL, "model", "ptexec")
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("other/model")
    assert e.value.body["code"] == "model_not_found"


def test_echo_offsets_follow_the_echoed_prompt_not_its_tokens_leading_space() -> None:
    """A SentencePiece vocabulary's first prompt token carries a space the prompt has not
    (``"\u2581On"``): the echoed text is the prompt, so its tokens' offsets point into it
    (OpenAI's ``text_offset``); the completion's tokens follow on."""
    from ptexec.serve.app import _completion_logprobs, _Offsets
    from ptexec.serve.engine import Logprob

    prompt = [Logprob("<s>", None, (), b"<s>", False), Logprob(" On", -1.0, (), b" On"),
              Logprob("ce", -1.0, (), b"ce"), Logprob(" up", -1.0, (), b" up"),
              Logprob("on", -1.0, (), b"on")]  # fmt: skip
    completion = [Logprob(" a", -1.0, (), b" a")]
    text = "Once upon" + " a"
    got = _completion_logprobs([*prompt, *completion], _Offsets.echoing("Once upon", prompt))
    starts = got["text_offset"]
    assert [text[s : s + 2] for s in starts[1:]] == ["On", "ce", " u", "on", " a"]
    assert starts[0] == 0
    plain = _completion_logprobs(completion)  # without echo: the completion's own text
    assert plain["text_offset"] == [0]


def test_logit_bias_applies_before_the_repetition_penalty(server: Any) -> None:
    """transformers and vLLM add ``logit_bias`` before the repetition penalty scales a
    prompt token's logit: the request's processors give what transformers' give."""
    tp = pytest.importorskip("transformers.generation.logits_process")
    from ptexec.llm.logits import as_processors
    from ptexec.llm.sampling import Sampler
    from ptexec.serve.protocol import parse_request

    req = parse_request({"model": MODEL, "prompt": [10, 11, 12], "temperature": 0,
                         "repetition_penalty": 2.0, "logit_bias": {"10": 1.0}}, chat=False)  # fmt: skip
    job = server.engine.prepare(req)
    logits = torch.full((server.engine.vocab_size,), -5.0)
    logits[10], logits[20] = 3.0, 2.2  # 10 is in the prompt
    s = Sampler(0.0, processors=as_processors(job.config.logits_processor))
    s.begin(job.ids)
    token = s.sample(logits.clone())
    ids = torch.tensor([job.ids])
    want = tp.SequenceBiasLogitsProcessor({(10,): 1.0})(ids, logits.clone().reshape(1, -1))
    want = tp.RepetitionPenaltyLogitsProcessor(2.0)(ids, want).reshape(-1)
    assert s.scores is not None
    torch.testing.assert_close(s.scores, want)
    assert token == int(want.argmax()) == 20


def test_asking_for_a_tool_call_or_audio_output_is_refused(server: Any) -> None:
    """Tools are not supported, so a ``tool_choice`` (or the older ``function_call``) that
    demands a call, and a request for spoken output (``modalities`` with ``"audio"``, an
    ``audio`` object), are 400s: OpenAI refuses a ``tool_choice`` without ``tools``, and
    a text answer would be less than the client asked for. ``"none"`` and ``"auto"`` ask
    for nothing a text answer does not give."""
    route = "/v1/chat/completions"
    base = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for extra, param in (
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy"}}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": "text"}, "modalities"),
    ):
        status, body = _status(server, {**base, **extra}, route)
        assert status == 400 and body["error"]["param"] == param, (extra, body)
    for extra in ({"tool_choice": "none"}, {"tool_choice": "auto"}, {"function_call": "none"},
                  {"modalities": ["text"]}, {"audio": None}):  # fmt: skip
        status, body = _status(server, {**base, **extra}, route)
        assert status == 200, (extra, body)


def test_moderation_and_web_search_are_refused(client: Any) -> None:
    """``moderation`` asks the server to screen the prompt and the answer (``"block"``:
    withhold flagged content) and ``web_search_options`` asks it to search the web for the
    answer; this server does neither, so the ``openai`` client's request is a 400 naming
    the field, not an unscreened answer that looks screened (its ``moderation`` null)."""
    messages = [{"role": "user", "content": "Hi"}]
    block = {"mode": "block"}
    for extra, param in (
        ({"moderation": {"model": "omni-moderation-latest",
                         "policy": {"input": block, "output": block}}}, "moderation"),
        ({"web_search_options": {"search_context_size": "low"}}, "web_search_options"),
    ):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, **extra)
        assert e.value.body["param"] == param, extra
    # unset, they ask for nothing; the server answers on
    got = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, extra_body={"moderation": None}
    )
    assert got.choices[0].message.content is not None and got.moderation is None


def test_a_logit_bias_on_an_id_the_tokenizer_lacks_is_a_400(tmp_path: Path) -> None:
    """Logits wider than the tokenizer (exports pad them) end in ids that are never sampled:
    a bias naming one is OpenAI's 400 for a key outside the vocabulary (it was a 500 from
    the session, raised at the first token), and the session answers the next request."""
    tokenizer = _byte_level_tokenizer(tmp_path)
    width = tokenizers.Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    with running_server(tokenizer.parent, sessions=1) as server:
        assert server.engine.vocab_size > width  # the program's logits: 512
        for token in (width, server.engine.vocab_size - 1):
            status, body = _status(server, {"model": MODEL, "prompt": PROMPT, "max_tokens": 2,
                                            "logit_bias": {str(token): 5}})  # fmt: skip
            assert status == 400 and body["error"]["param"] == "logit_bias", body
        status, body = _status(server, {"model": MODEL, "prompt": PROMPT, "max_tokens": 2,
                                        "logit_bias": {str(width - 1): 100}})  # fmt: skip
        assert status == 200 and body["usage"]["completion_tokens"] == 2


def test_echo_offsets_count_the_control_tokens_the_echoed_prompt_names(server: Any) -> None:
    """An echoed prompt holding a control token (BOS written in the prompt, or a token-id
    prompt beginning with it) has the token's name in its text: each ``text_offset``
    indexes the returned text, streamed or not (the offsets after BOS were short by its
    name's length); the completion's control tokens (EOS) are no text."""
    bos = "<|begin_of_text|>"
    tk = server.engine.tokenizer
    for prompt in (bos + PROMPT, [tk.bos_id, *tk.encode(PROMPT)]):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                "echo": True, "logprobs": 1}  # fmt: skip
        status, answer = _status(server, body)
        assert status == 200
        choice = answer["choices"][0]
        chunks = _stream(server, {**body, "stream": True})
        streamed = {
            "text": "".join(c["choices"][0]["text"] for c in chunks),
            "tokens": [t for c in chunks if c["choices"][0]["logprobs"]
                       for t in c["choices"][0]["logprobs"]["tokens"]],
            "text_offset": [o for c in chunks if c["choices"][0]["logprobs"]
                            for o in c["choices"][0]["logprobs"]["text_offset"]],
        }  # fmt: skip
        for text, tokens, offsets in (
            (choice["text"], choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]),
            (streamed["text"], streamed["tokens"], streamed["text_offset"]),
        ):
            assert text.startswith(bos + PROMPT)
            assert tokens[0] == bos and len(tokens) == len(offsets)
            for name, start in zip(tokens, offsets, strict=True):
                if name in SPECIAL and start >= len(bos + PROMPT):
                    continue  # (a generated control token: no text)
                assert text[start : start + len(name)] == name, (tokens, offsets)


def test_a_prompt_token_the_tokenizer_lacks_is_a_400(tmp_path: Path) -> None:
    """A token-id prompt naming a padding id past the tokenizer's (the logits are wider)
    is refused, as vLLM refuses an id out of the vocabulary: the tokenizer has no text for
    it (its echo was empty) and the model was never trained on it."""
    tokenizer = _byte_level_tokenizer(tmp_path)
    width = tokenizers.Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    with running_server(tokenizer.parent, sessions=1) as server:
        assert server.engine.vocab_size > width
        for prompt in ([width, 3], [[3, 4], [4, server.engine.vocab_size - 1]]):
            status, body = _status(server, {"model": MODEL, "prompt": prompt, "max_tokens": 1})
            assert status == 400 and body["error"]["param"] == "prompt", body
        status, body = _status(server, {"model": MODEL, "prompt": [width - 1, 3], "max_tokens": 1})
        assert status == 200


def test_a_prompt_the_tokenizer_cannot_encode_whole_is_a_400(tmp_path: Path) -> None:
    """A SentencePiece tokenizer (pytorch-tokenizers') ends a text at U+0000: such a prompt
    is the request's 400, naming the field, where its encode dropped the rest of it."""
    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    import io

    from ptexec.serve import Engine
    from ptexec.serve.protocol import ApiError, parse_request

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["Once upon a time there was a cat"] * 20), model_writer=model,
        model_type="bpe", vocab_size=40, minloglevel=2,
    )  # fmt: skip
    (tmp_path / "tokenizer.model").write_bytes(model.getvalue())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    engine = Engine(program("portable"), tmp_path / "tokenizer.model", model_name=MODEL)
    try:
        for body, chat, field in (
            ({"prompt": "Once\x00 upon a time"}, False, "prompt"),
            ({"messages": [{"role": "user", "content": "a\x00b"}]}, True, "messages"),
        ):
            with pytest.raises(ApiError) as e:
                engine.prepare(parse_request({"model": MODEL, **body}, chat=chat))
            assert e.value.status == 400 and e.value.param == field
            assert "U+0000" in e.value.message
        assert engine.prepare(parse_request({"model": MODEL, "prompt": "Once upon"}, chat=False))
    finally:
        engine.close()


def _byte_fallback_tokenizer(folder: Path, names: dict[int, str]) -> Path:
    """A Llama-2-style ``tokenizer.json`` of 300 ids (``<0xNN>`` byte tokens beside text
    pieces) whose ids in ``names`` are those pieces; the other ids are filled in order."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    fill = iter([f"<0x{b:02X}>" for b in range(256)] + [f"w{i}" for i in range(300)])
    special = {0: "<unk>", 1: "<s>", 2: "</s>"}
    taken = set(names.values())
    vocab: dict[str, int] = {}
    for i in range(300):
        name = special.get(i) or names.get(i)
        while name is None or name in vocab or (name in taken and i not in names):
            name = next(fill)
        vocab[name] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.add_special_tokens([AddedToken(t, special=True) for t in special.values()])
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder / "tokenizer.json"


def test_a_top_logprobs_name_two_tokens_share_has_the_likelier_ones_logprob(
    tmp_path: Path,
) -> None:
    """A byte-fallback vocabulary writes ``a`` with two ids (the piece ``a`` and the byte
    ``<0x61>``): a completion's ``top_logprobs`` (an object keyed by the tokens' text)
    holds the likelier one's log-probability under that name, the one the greedy token
    has (the less likely one overwrote it). Reference: ExecuTorch's logits."""
    from llm_support import executorch_logits

    prompt = [5, 6, 7]
    row = torch.log_softmax(executorch_logits(program("portable"), prompt)[-1][:300].float(), 0)
    first, second = torch.topk(row, 2).indices.tolist()
    tokenizer = _byte_fallback_tokenizer(tmp_path, {first: "a", second: "<0x61>"})
    with running_server(tokenizer.parent, sessions=1) as server:
        tk = server.engine.tokenizer
        assert tk.token_bytes(first) == tk.token_bytes(second) == b"a"
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0)
        for stream in (False, True):
            got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                            temperature=0, logprobs=2, stream=stream)  # fmt: skip
            choices = [c.choices[0] for c in got] if stream else [got.choices[0]]
            lp = next(c.logprobs for c in choices if c.logprobs and c.logprobs.tokens)
            assert lp.tokens == ["a"]
            assert lp.token_logprobs[0] == pytest.approx(float(row[first]), abs=1e-5)
            assert lp.top_logprobs[0] == {"a": pytest.approx(float(row[first]), abs=1e-5)}


THINKING = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: "
    "{{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:"
    "{% if enable_thinking is defined and not enable_thinking %} <no-think>{% endif %}"
    "{% endif %}"
)


def test_chat_template_kwargs_reach_the_template(tmp_path: Path) -> None:
    """``chat_template_kwargs`` (vLLM's extension, which OpenAI clients send in
    ``extra_body``: ``{"enable_thinking": false}`` for Qwen3) are the template's variables,
    as transformers' ``apply_chat_template`` takes them (they were ignored: the model
    thought anyway); the conversation's own variables are the request's, not theirs."""
    transformers = pytest.importorskip("transformers")
    from ptexec.serve import Engine
    from ptexec.serve.protocol import ApiError, parse_request

    tokenizer = tokenizer_folder(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": THINKING}))
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer), bos_token=config.get("bos_token"),
        eos_token=config.get("eos_token"), chat_template=THINKING,
    )  # fmt: skip
    messages = [{"role": "user", "content": "Once upon a time"}]
    engine = Engine(program("portable"), tokenizer, model_name=MODEL)
    try:
        for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True},
                       {"enable_thinking": False, "add_generation_prompt": False}):  # fmt: skip
            body = {"model": MODEL, "messages": messages, "chat_template_kwargs": kwargs}
            want = reference.apply_chat_template(messages, tokenize=False, **{
                "add_generation_prompt": True, **kwargs})  # fmt: skip
            assert engine.prompt_text(parse_request(body, chat=True)) == want, kwargs
        for bad in ({"messages": []}, {"tools": []}, {"add_generation_prompt": "yes"}, [1]):
            with pytest.raises(ApiError) as e:
                parse_request({"model": MODEL, "messages": messages,
                               "chat_template_kwargs": bad}, chat=True)  # fmt: skip
            assert e.value.status == 400 and e.value.param == "chat_template_kwargs"
        with pytest.raises(ApiError) as e:  # a completion has no template to give them to
            parse_request({"model": MODEL, "prompt": "Once",
                           "chat_template_kwargs": {"enable_thinking": False}}, chat=False)  # fmt: skip
        assert e.value.status == 400
    finally:
        engine.close()


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRIMMED = (  # Llama 3's way: each turn's content trimmed
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] | trim }}<|eot|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_continue_final_message_continues_it_as_transformers_does(tmp_path: Path) -> None:
    """``continue_final_message`` (transformers' ``apply_chat_template`` argument, which vLLM
    takes in ``chat_template_kwargs``) ends the prompt inside the last message, so the
    model goes on with it (a prefilled answer). It reached the template as a variable no
    template reads: the prompt closed the turn (``...The colour is<|im_end|>``), silently."""
    transformers = pytest.importorskip("transformers")
    from ptexec.llm.chat import ChatTemplate, ChatTemplateError
    from ptexec.serve import Engine
    from ptexec.serve.protocol import ApiError, parse_request

    tokenizer = tokenizer_folder(tmp_path)
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer))
    asked = [{"role": "user", "content": "Name a colour."}]
    for template in (CHATML, TRIMMED):
        for last in ("The colour is", "The colour is ", "Zwei Wörter & <b>\n"):
            messages = [*asked, {"role": "assistant", "content": last}]
            want = reference.apply_chat_template(
                messages, chat_template=template, tokenize=False, continue_final_message=True
            )
            assert want.endswith(last if template == CHATML else last.rstrip())
            ours = ChatTemplate(template)
            assert ours.render(messages, continue_final_message=True) == want
            assert ours.render(messages, add_generation_prompt=False,
                               continue_final_message=True) == want  # fmt: skip
        with pytest.raises(ChatTemplateError, match="add_generation_prompt"):
            ChatTemplate(template).render(
                messages, add_generation_prompt=True, continue_final_message=True
            )
    dropped = "{% for m in messages[:-1] %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="final message"):
        ChatTemplate(dropped).render([*asked, *asked], continue_final_message=True)

    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": CHATML}))
    messages = [*asked, {"role": "assistant", "content": "The colour is"}]
    want = reference.apply_chat_template(
        messages, chat_template=CHATML, tokenize=False, continue_final_message=True
    )
    engine = Engine(program("portable"), tokenizer, model_name=MODEL)
    try:
        for kwargs in ({"continue_final_message": True},
                       {"continue_final_message": True, "add_generation_prompt": False}):  # fmt: skip
            body = {"model": MODEL, "messages": messages, "chat_template_kwargs": kwargs}
            assert engine.prompt_text(parse_request(body, chat=True)) == want, kwargs
        both = {"continue_final_message": True, "add_generation_prompt": True}
        with pytest.raises(ApiError) as e:
            engine.prompt_text(parse_request(
                {"model": MODEL, "messages": messages, "chat_template_kwargs": both}, chat=True))  # fmt: skip
        assert e.value.status == 400
        with pytest.raises(ApiError) as e:
            parse_request({"model": MODEL, "messages": messages,
                           "chat_template_kwargs": {"continue_final_message": "yes"}}, chat=True)  # fmt: skip
        assert e.value.status == 400 and e.value.param == "chat_template_kwargs"
    finally:
        engine.close()


def test_a_field_the_server_does_not_know_is_refused_not_ignored(client: Any) -> None:
    """OpenAI answers a request argument it does not recognize with a 400; vLLM's sampling
    extensions (``min_tokens``, ``stop_token_ids``, ``guided_json``, ...), which clients
    send in ``extra_body``, change the answer there. Ignored, they gave an answer that
    looks honoured: ``min_tokens: 8`` with a stop string ended after 2 tokens. OpenAI's own
    hints that change no text (``user``, ``metadata``, ``store``, ``service_tier``, ...) and
    unknown fields set to null (asking for nothing) are answered."""
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create
    complete = client.completions.create
    for create, base, extra in (
        (complete, {"prompt": PROMPT}, {"min_tokens": 8, "stop": [" "]}),
        (complete, {"prompt": PROMPT}, {"stop_token_ids": [5]}),
        (complete, {"prompt": PROMPT}, {"guided_regex": "[0-9]+"}),
        (complete, {"prompt": PROMPT}, {"top_logprobs": 2}),  # a chat's field
        (chat, {"messages": messages}, {"guided_json": {"type": "object"}}),
        (chat, {"messages": messages}, {"include_stop_str_in_output": True}),
        (chat, {"messages": messages}, {"echo": True}),  # a completion's field
        (chat, {"messages": messages}, {"continue_final_message": True}),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            create(model=MODEL, max_tokens=2, **base, extra_body=extra)
        assert e.value.status_code == 400
        assert e.value.body["type"] == "invalid_request_error"
        assert e.value.body["param"] in extra, (extra, e.value.body)
    got = chat(
        model=MODEL, messages=messages, max_tokens=2, user="u", metadata={"k": "v"}, store=False,
        service_tier="auto", parallel_tool_calls=False, prompt_cache_key="k",
        safety_identifier="s", extra_body={"min_tokens": None},
    )  # fmt: skip
    assert got.usage is not None and got.usage.completion_tokens == 2
    done = complete(model=MODEL, prompt=PROMPT, max_tokens=2, user="u", best_of=1)
    assert done.usage is not None and done.usage.completion_tokens == 2


def test_a_stream_option_the_server_does_not_know_is_refused(client: Any) -> None:
    """``stream_options`` takes OpenAI's ``include_usage`` and ``include_obfuscation``
    (padding, no text); vLLM's ``continuous_usage_stats`` (usage in every chunk) came back
    as a stream whose chunks all had ``usage: null``, as if honoured. Now a 400."""
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=2, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        )  # fmt: skip
    assert e.value.body["param"] == "stream_options"
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=2, stream=True, temperature=0,
            stream_options={"include_usage": True, "include_obfuscation": False},
        )
    )  # fmt: skip
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
