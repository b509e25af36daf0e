"""``ptexec generate``: streams the generated text, reports timings, refuses what it cannot do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_support import PROMPT, executorch_greedy, llm_programs, program
from ptexec.cli import main
from ptexec.llm import GenerationConfig, TextLLMRunner

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llm_programs.make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_generate_streams_the_greedy_text(
    tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pte = program("portable")
    argv = [
        "generate", str(pte), "--tokenizer", str(tokenizer), "--prompt", PROMPT,
        "--max-new-tokens", "16", "--temperature", "0", "--threads", "1", "--stats",
    ]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    runner = TextLLMRunner(str(pte), str(tokenizer), print_output=False)
    want = runner.generate_text(
        PROMPT, GenerationConfig(max_new_tokens=16, temperature=0, echo=False)
    )
    assert out == PROMPT + want + "\n"
    assert "prefill" in err and "first token after" in err and "tokens/s" in err
    assert "16 tokens generated" in err and "tokens/s on 1 thread" in err
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["generated_tokens"] == 16


def test_generate_puts_the_eos_tokens_asked_for_after_the_prompt(
    tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--eos N`` puts N EOS tokens after a decoder-only program's prompt too (they were
    dropped without a word): the text of ExecuTorch's runtime fed those ids greedily."""
    pte = program("portable")
    argv = [
        "generate", str(pte), "--tokenizer", str(tokenizer), "--prompt", PROMPT,
        "--max-new-tokens", "8", "--temperature", "0", "--no-echo", "--ignore-eos",
        "--eos", "2",
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    tok = TextLLMRunner(str(pte), str(tokenizer), print_output=False).tokenizer
    ids = [*tok.encode(PROMPT), tok.eos_id, tok.eos_id]
    want = executorch_greedy(pte, ids, 8, dynamic=True)
    assert out == tok.decode(want, skip_special_tokens=True) + "\n"
    plain = executorch_greedy(pte, tok.encode(PROMPT), 8, dynamic=True)
    assert want != plain  # (the EOS tokens change the answer)


def test_generate_seeded_sampling_and_no_echo(
    tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "generate", str(program("portable")), "--tokenizer", str(tokenizer), "--prompt", PROMPT,
        "--max-new-tokens", "12", "--seed", "5", "--no-echo",
    ]  # fmt: skip
    outs = []
    for _ in range(2):
        assert main(argv) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and not outs[0].startswith(PROMPT)


def test_generate_compile_and_bad_tokenizer(
    tokenizer: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from compile_util import session_cache_dir

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))
    pte = str(program("portable"))
    # --compile compiles in the background; filled first, the cache has it at once
    assert main(["compile", pte]) == 0
    capsys.readouterr()
    texts = []
    for extra in ([], ["--compile"]):
        argv = ["generate", pte, "--tokenizer", str(tokenizer), "--prompt", "a",
                "--max-new-tokens", "4", "--temperature", "0", *extra]  # fmt: skip
        assert main(argv) == 0
        out, err = capsys.readouterr()
        texts.append(out)
    assert "compile: compiled" in err
    assert texts[0] == texts[1]  # compiled: the same greedy text
    bad = tmp_path / "tok.bin"
    bad.write_bytes(b"not a tokenizer")
    assert main(["generate", pte, "--tokenizer", str(bad), "--prompt", "a"]) == 1
    assert "TokenizerError: Failed to load tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--max-new-tokens", "0"], "ConfigValueError: max_new_tokens"),
        (["--max-new-tokens", "-3"], "ConfigValueError: max_new_tokens"),
        (["--temperature", "nan"], "ConfigValueError: temperature"),
        (["--top-p", "0"], "ConfigValueError: top_p"),
        (["--top-k", "-1"], "ConfigValueError: top_k"),
        (["--seed", "-1"], "ConfigValueError: seed"),
        (["--stop", ""], "ConfigValueError: stop"),
        (["--prompt", " ".join([PROMPT] * 40)], "GenerationError: the prompt's"),
        (["--bos", "500"], "GenerationError: num_bos 500"),
        (["--chat-template", "t.jinja"], "ValueError: --chat-template is the template of --chat"),
    ],
)
def test_generate_refuses_before_printing(
    extra: list[str], error: str, tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", str(program("portable")), "--tokenizer", str(tokenizer),
            "--prompt", PROMPT, "--temperature", "0", *extra]  # fmt: skip
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""  # not the prompt: nothing was generated
    assert f"ptexec: {error}" in err and len(err.strip().splitlines()) == 1


def test_run_on_an_llm_takes_positions_within_the_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ptexec run`` on an LLM draws tokens from its vocabulary at positions from 0 (random
    positions ran past the KV cache); its logits are ExecuTorch's on the same inputs."""
    import torch

    import ptexec
    from ptexec.llm.decoder import example_inputs

    pte = program("portable")
    saved = tmp_path / "out.pt"
    assert main(["run", str(pte), "--repeat", "1", "--seed", "3", "--output", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "of an LLM" in out and "ptexec generate" in out
    prog = ptexec.load(pte)
    inputs = example_inputs(prog, prog.method_meta("forward"), torch.Generator().manual_seed(3))
    assert inputs is not None
    tokens, pos = inputs
    assert tokens.shape == (1, llm_programs.TinyLlama().max_seq_len - 1)
    assert pos.tolist() == [0] and int(tokens.min()) >= 0 and int(tokens.max()) < 512
    pytest.importorskip("executorch.runtime")
    import executorch.kernels.quantized  # noqa: F401
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    want = Runtime.get().load_program(str(pte)).load_method("forward").execute(inputs)[0]
    got = torch.load(saved, weights_only=True)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_example_inputs_of_other_programs() -> None:
    """Programs without the LLM metadata keep the generic random inputs."""
    import ptexec
    from fixture_data import fixture_paths
    from ptexec.llm.decoder import example_inputs

    pte, _ = fixture_paths("mlp")
    prog = ptexec.load(pte)
    assert example_inputs(prog, prog.method_meta("forward")) is None


def test_llm_programs_script_writes_the_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """scripts/llm_programs.py writes the programs' tokenizer.json (with its config) once,
    and generate runs with it."""
    from ptexec.llm import load_tokenizer

    pte = program("portable")
    monkeypatch.setenv(llm_programs.CACHE_ENV, str(tmp_path))
    path = llm_programs.tokenizer_path()
    assert path.parent.parent == tmp_path and llm_programs.tokenizer_path() == path
    assert (path.parent / "tokenizer_config.json").is_file()
    tok = load_tokenizer(path)
    model = llm_programs.TinyLlama()
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (
        model.vocab_size,
        model.bos_id,
        model.eos_id,
    )
    argv = ["generate", str(pte), "--tokenizer", str(path), "--prompt", PROMPT,
            "--max-new-tokens", "4", "--temperature", "0"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(PROMPT)


def test_tokenizer_for_a_real_vocabulary_size_is_filled(tmp_path: Path) -> None:
    """A vocabulary larger than the corpus trains (SmolLM2-135M's 49152) is filled with
    whole-text added tokens after the trained ones, which text encodes to."""
    from ptexec.llm import load_tokenizer

    model = llm_programs.MODELS["smollm2-135m"]
    big = load_tokenizer(llm_programs.make_tokenizer(tmp_path / "tokenizer.json", model))
    assert (big.vocab_size, big.bos_id, big.eos_id) == (49152, model.bos_id, model.eos_id)
    ids = big.encode(PROMPT)
    assert big.decode(ids) == PROMPT and max(ids) < 1000
    assert big.decode([model.vocab_size - 1]) == f"<|fill_{model.vocab_size - 1}|>"


@pytest.mark.parametrize(
    ("pieces", "cls"),
    [(("<s>", "</s>"), "LlamaTokenizer"), (("<bos>", "<eos>"), "GemmaTokenizer")],
)
def test_chat_template_of_a_bare_sentencepiece_model_names_its_bos_and_eos(
    tmp_path: Path, pieces: tuple[str, str], cls: str
) -> None:
    """A checkpoint with a SentencePiece ``tokenizer.model`` and no config naming its
    special tokens: a template's ``bos_token`` and ``eos_token`` are the model's BOS and
    EOS pieces, as transformers' tokenizer for that model renders them (they rendered
    empty)."""
    import io

    pytest.importorskip("pytorch_tokenizers")
    spm = pytest.importorskip("sentencepiece")
    transformers = pytest.importorskip("transformers")
    from ptexec.llm.chat import ChatTemplate

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([PROMPT + " the cat sat on the mat"] * 20),
        model_writer=model, model_type="bpe", vocab_size=40, unk_id=0, bos_id=1, eos_id=2,
        bos_piece=pieces[0], eos_piece=pieces[1],
    )  # fmt: skip
    (tmp_path / "tokenizer.model").write_bytes(model.getvalue())
    template = tmp_path / "chat.jinja"
    template.write_text(
        "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{{ eos_token }}{% endfor %}"
    )
    messages = [{"role": "user", "content": "hi"}]
    hf = getattr(transformers, cls).from_pretrained(str(tmp_path))
    want = hf.apply_chat_template(messages, chat_template=template.read_text(), tokenize=False)
    assert want == f"{pieces[0]}[hi]{pieces[1]}"
    for path in (tmp_path, tmp_path / "tokenizer.model"):
        ours = ChatTemplate.for_tokenizer(path, template)
        assert ours is not None and ours.render(messages) == want
    # a config that names them (null: none) is taken as it is
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": None, "eos_token": "<x>"})
    )
    ours = ChatTemplate.for_tokenizer(tmp_path, template)
    assert ours is not None and ours.render(messages) == "[hi]<x>"


@pytest.mark.parametrize(
    "layout",
    [
        {"image_token": "<image>", "boi_token": {"content": "<boi>", "__type": "AddedToken"}},
        {"extra_special_tokens": {"image_token": "<image>", "boi_token": "<boi>"}},
        {"extra_special_tokens": {"image_token": "<image>"}, "image_token": "<other>"},
        {"image_token": None, "pad_token": None, "add_bos_token": True},
        {"map": {"image_token": "<image>", "boi_token": {"content": "<boi>"}}},
    ],
)
def test_chat_template_sees_a_models_own_special_tokens(
    tmp_path: Path, layout: dict[str, object], tokenizer: Path
) -> None:
    """A model's own special tokens in its tokenizer config (``image_token``, ``boi_token``,
    alone or in an ``extra_special_tokens`` object) are template variables, as
    transformers' tokenizers and processors pass them (they rendered empty)."""
    import shutil

    transformers = pytest.importorskip("transformers")
    from ptexec.llm.chat import ChatTemplate

    shutil.copy(tokenizer, tmp_path / "tokenizer.json")
    template = "{{ bos_token }}{{ image_token }}|{{ boi_token }}|{{ pad_token }}|{{ messages[0]['content'] }}"  # fmt: skip
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "chat_template": template}  # fmt: skip
    if "map" in layout:  # the older layout: the names in special_tokens_map.json
        (tmp_path / "special_tokens_map.json").write_text(json.dumps(layout["map"]))
    else:
        config.update(layout)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "user", "content": "hi"}]
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    want = hf.apply_chat_template(messages, tokenize=False)
    ours = ChatTemplate.for_tokenizer(tmp_path / "tokenizer.json")
    assert ours is not None and ours.render(messages) == want
