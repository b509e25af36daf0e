"""``ptexec generate``: streams the generated text, reports timings, refuses what it cannot do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_support import PROMPT, llm_programs, program
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
    texts = []
    for extra in ([], ["--compile"]):
        argv = ["generate", pte, "--tokenizer", str(tokenizer), "--prompt", "a",
                "--max-new-tokens", "4", "--temperature", "0", *extra]  # fmt: skip
        assert main(argv) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1]  # compiled: the same greedy text
    bad = tmp_path / "tok.bin"
    bad.write_bytes(b"not a tokenizer")
    assert main(["generate", pte, "--tokenizer", str(bad), "--prompt", "a"]) == 1
    assert "TokenizerError: Failed to load tokenizer" in capsys.readouterr().err
