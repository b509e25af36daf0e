"""Every fixture, every XNNPACK fixture and every exported LLM, compiled, against the
interpreter.

Two depths:

- by default, the compiled tier's rebuild and bookkeeping on every program: the regions
  are planned, traced with ``torch.export`` and run as the traced graphs
  (``CompileOptions(backend="graph")``: everything the compiled tier does except handing
  the graphs to AOTInductor, which takes seconds per program). Outputs, records and state
  must match the interpreter call by call; LLMs must generate the same greedy tokens;
- marked ``slow`` (run with ``-m slow``): the same with AOTInductor, every program
  compiled (tens of minutes on two cores).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ptexec
from compile_util import (
    XNNPACK,
    assert_report_partitions,
    load_pair,
    replay_both,
    replay_xnnpack,
    session_cache_dir,
    skip_slow_unless_asked,
    xnnpack_pair,
)
from fixture_data import load_manifest
from ptexec.compile import CompileOptions

MANIFEST = load_manifest()
RUNNABLE = [name for name, entry in MANIFEST.items() if entry.get("runs", True)]
GRAPH = CompileOptions(backend="graph")
LLM_VARIANTS = [
    "portable",
    "portable_static",
    "xnnpack",
    "xnnpack_static",
    "xnnpack_8da4w",
    "portable_chunked",
    "portable_quant",
    "hf_xnnpack",
]
# fixtures whose programs are not compiled whole, and why (what the report must say)
PARTLY = {
    "map": "control flow",
    "map_unplanned": "control flow",
    "scan": "control flow",
    "scan_unplanned": "control flow",
    "h2d_copy": "devices",
    "shared_state": "too little work",
}


@pytest.fixture(autouse=True)
def _setup(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_slow_unless_asked(request)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))


def _check_report(name: str, methods: dict[str, ptexec.Method]) -> None:
    reasons = []
    for m in methods.values():
        report = m.compile_report
        assert report is not None
        assert_report_partitions(report)
        reasons.extend(r for _, _, r in report.fallbacks)
        if name not in PARTLY:
            assert report.fully_compiled, f"{name}: {report.summary()}"
    if name in PARTLY:
        assert any(PARTLY[name] in r for r in reasons), f"{name}: {reasons}"


@pytest.mark.parametrize("name", RUNNABLE)
def test_fixture_traced(name: str) -> None:
    interpreted, compiled = load_pair(name, GRAPH)
    _check_report(name, compiled)
    replay_both(name, interpreted, compiled)


@pytest.mark.parametrize("name", sorted(XNNPACK))
def test_xnnpack_fixture_traced(name: str) -> None:
    plain, compiled = xnnpack_pair(name, GRAPH)
    report = compiled.compile_report
    assert report is not None and report.fully_compiled, report
    replay_xnnpack(name, plain, compiled)


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNABLE)
def test_fixture_compiled(name: str) -> None:
    interpreted, compiled = load_pair(name)
    _check_report(name, compiled)
    replay_both(name, interpreted, compiled)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(XNNPACK))
def test_xnnpack_fixture_compiled(name: str) -> None:
    plain, compiled = xnnpack_pair(name)
    report = compiled.compile_report
    assert report is not None and report.fully_compiled, report
    replay_xnnpack(name, plain, compiled)


# ---- exported LLMs -----------------------------------------------------------------------


def _greedy(program: ptexec.Program, prompt: list[int], count: int, **options: Any) -> list[int]:
    from ptexec.llm import TextDecoder

    d = TextDecoder(program, **options)
    if d.dynamic:
        logits = d.prefill(prompt, 0)
    else:
        for i, t in enumerate(prompt):
            logits = d.step(t, i)
    out = [int(logits.argmax())]
    pos = len(prompt)
    while len(out) < count:
        logits = d.step(out[-1], pos)
        pos += 1
        out.append(int(logits.argmax()))
    return out


def _llm_tokens_agree(variant: str, options: CompileOptions | None) -> None:
    from llm_support import program

    pte = program(variant)
    prompt = [1, 17, 42, 99, 7, 300, 5]
    want = _greedy(ptexec.load(pte), prompt, 24)
    got_program = ptexec.load(pte)
    got = _greedy(got_program, prompt, 24, compile=options or True)
    assert got == want


@pytest.mark.parametrize("variant", LLM_VARIANTS)
def test_llm_greedy_tokens_traced(variant: str) -> None:
    _llm_tokens_agree(variant, GRAPH)


def test_llm_greedy_tokens_compiled() -> None:
    """One LLM compiled in the default run (XNNPACK fp32, KV cache, custom SDPA)."""
    _llm_tokens_agree("xnnpack", None)


@pytest.mark.slow
@pytest.mark.parametrize("variant", LLM_VARIANTS)
def test_llm_greedy_tokens_all_compiled(variant: str) -> None:
    _llm_tokens_agree(variant, None)


@pytest.mark.slow
def test_two_processes_compiling_one_program_at_once(tmp_path: Any) -> None:
    """Both compile (neither finds an entry), one entry results, both run it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from fixture_data import fixture_paths

    root = Path(__file__).resolve().parent.parent
    pte = fixture_paths("mlp")[0]
    code = (
        "import torch, ptexec\n"
        f"m = ptexec.load({str(pte)!r}).load_method('forward', compile=True)\n"
        "print(m.compile_report.compiled_instructions, float(m(torch.ones(2, 8))[0].sum()))\n"
    )
    env = {**os.environ, "PTEXEC_CACHE_DIR": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] and outs[0][0] == "5"
    entries = [p for p in tmp_path.iterdir()]
    assert len(entries) == 1 and (entries[0] / "manifest.json").is_file()
    want = ptexec.load(pte).load_method("forward")(torch.ones(2, 8))[0].sum()
    assert abs(float(outs[0][1]) - float(want)) < 1e-4
