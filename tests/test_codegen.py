"""Generated code: one source builder, every piece through ``Sources``, and shown to people.

:class:`ptexec.codegen.Code` writes the source of the blocks, the fast call and the
compiled regions; :meth:`ptexec.Method.source` and ``ptexec inspect --code`` show it. The
listing must be the code that runs (what was compiled, as :mod:`linecache` holds it), name
every instruction under its block, compile, and failures must still name their
instruction.
"""

from __future__ import annotations

import gc
import linecache
from pathlib import Path

import numpy as np
import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, tolerance
from ptexec.cli import main
from ptexec.codegen import Code, Sources
from ptexec.compile import CompileOptions
from ptexec.engine.blocks import basic_blocks, forward_only
from ptexec.format import program as p

FIX = Path(__file__).parent / "fixtures"


def _plan(m: ptexec.Method) -> p.ExecutionPlan:
    return m.state.plan


def _strip(listing: str) -> str:
    """The listing without the comments naming instructions: the code as compiled."""
    return "".join(
        line for line in listing.splitlines(True) if not line.lstrip().startswith("# instruction ")
    )


def test_code_builds_text_and_line_map_and_names_failures() -> None:
    code = Code(chain=2)
    code.add("def f(v):")
    with code.indented():
        code.add("a = v[0]\nb = a + 1", 7)  # two lines of instruction 7
        code.add("c = b", None)
        code.add("", 9)  # nothing
        code.add("return 1 // v[1]", 8)
    assert code.text == "def f(v):\n    a = v[0]\n    b = a + 1\n    c = b\n    return 1 // v[1]\n"
    assert code.line_map == {2: 7, 3: 7, 5: 8}
    sources = Sources("test")
    f = sources.compile(code.text, "piece", chain=2, lines=code.line_map)["f"]
    with pytest.raises(ZeroDivisionError) as info:
        f([1, 0])
    assert sources.locate(info.value.__traceback__) == (2, 8)
    assert sources.listing(f, ["x"] * 10) == (
        "def f(v):\n    # instruction 7: x\n    a = v[0]\n    b = a + 1\n    c = b\n"
        "    # instruction 8: x\n    return 1 // v[1]\n"
    )
    assert "not generated" in sources.listing(len)


@pytest.mark.parametrize("limited", [False, True], ids=["one function", "blocks"])
@pytest.mark.parametrize("name", ["mlp", "cond", "scalar_io"])
def test_source_lists_the_fast_call_and_every_block(name: str, limited: bool) -> None:
    """Every jump goes forward in these: each chain's blocks run as one function, unless
    the instruction limit is below the instruction count (then each block is a function,
    and the runner counts)."""
    prog = ptexec.load(FIX / f"{name}.pte")
    n = prog.load_method("forward").state.instruction_count()
    m = prog.load_method("forward", max_instructions=n - 1 if limited else n)
    text = m.source()
    compile(text, "<listing>", "exec")  # every piece compiles as printed
    # (a straight-line chain past the limit is not inlined into a fast call)
    fast = text.count("def _fast(inputs):")
    assert fast == 1 or (limited and fast == 0)
    plan = _plan(m)
    assert all(forward_only(c) for c in m.state.chains)
    for c, chain in enumerate(plan.chains):
        spans = basic_blocks(chain.instructions)
        if limited:
            for k, (start, end) in enumerate(spans):
                assert f"# chain {c} block {k}: instructions {start}-{end - 1}\n" in text
        else:
            assert f"# chain {c}: its blocks in one function (every jump goes forward)\n" in text
            for k in range(1, len(spans)):
                assert f"    if b == {k}:\n" in text
        for i, ins in enumerate(chain.instructions):
            if isinstance(ins, p.KernelCall):
                op = plan.operators[ins.op_index]
                qualified = op.name + (f".{op.overload}" if op.overload else "")
                assert f"# instruction {i}: {qualified}\n" in text
            else:
                assert f"# instruction {i}: " in text
    # what linecache holds for each piece (the text that was compiled) is in the listing
    code = _strip(text)
    shown = 0
    for filename in m.state.sources.filenames:
        if filename.endswith((" in one function>", " call>")) or " block " in filename:
            assert "".join(linecache.getlines(filename)) in code, filename
            shown += 1
    pieces = sum(len(basic_blocks(c.instructions)) for c in plan.chains)
    assert shown == fast + (pieces if limited else len(plan.chains))


def test_failures_still_name_their_instruction() -> None:
    """``cond``'s first branch adds into value 10 (instruction 4, ``aten::add.out``):
    memory that cannot grow to take the sum fails it, on every path (given to the
    tensor in place: the native steps hold the tensor itself)."""
    x, y = torch.ones(3, 4), torch.ones(3, 4)
    options: list[dict[str, object]] = [
        {},
        {"fast_path": False},
        {"compile": CompileOptions(backend="graph", progress=False, min_instructions=99)},
    ]
    for kwargs in options:
        m = ptexec.load(FIX / "cond.pte").load_method("forward", **kwargs)  # type: ignore[arg-type]
        m.state.values[10].set_(torch.from_numpy(np.zeros(0, np.float32)))  # cannot grow
        with pytest.raises(ptexec.ExecutionError) as info:
            m(x, y)
        assert (info.value.instruction, info.value.operator) == (4, "aten::add.out"), kwargs
        assert "not resizable" in str(info.value), kwargs


def test_source_says_what_runs_compiled() -> None:
    m = ptexec.load(FIX / "cond.pte").load_method(
        "forward", compile=CompileOptions(backend="graph", progress=False)
    )
    report = m.compile_report
    assert report is not None and report.regions
    text = m.source()
    compile(text, "<listing>", "exec")
    for k, (first, last) in enumerate(report.regions):
        assert f"# chain 0 region {k}: instructions {first}-{last} run compiled" in text
        assert f"_R{k}(v)  # instructions {first}-{last}, compiled" in text
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    plain = ptexec.load(FIX / "cond.pte").load_method("forward")
    assert torch.allclose(m(x, y)[0], plain(x, y)[0])


def test_inspect_code_prints_the_source(capsys: pytest.CaptureFixture[str]) -> None:
    pte = str(FIX / "mlp.pte")
    assert main(["inspect", pte, "--code", "--method", "forward"]) == 0
    out = capsys.readouterr().out
    m = ptexec.load(pte).load_method("forward")
    assert m.source() in out
    assert "method 'forward'" in out and "generated code" in out
    assert main(["inspect", pte, "--code", "--json"]) == 0
    assert '"code": "# \'forward\': the generated code it runs' in capsys.readouterr().out
    assert main(["inspect", pte]) == 0
    assert "def _fast" not in capsys.readouterr().out


def test_load_time_work_runs_once_and_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the dataflow rewrites run once at load (``mlp``'s weight transposes become
    views made at load) runs through ``codegen.run_once``: no file name, line cache entry
    or piece of its own; the method's own code is forgotten once it is freed."""
    from ptexec.loader import dataflow

    seen: list[str] = []
    run_once = dataflow.run_once

    def watched(source: str, namespace: dict[str, object]) -> None:
        seen.append(source)
        run_once(source, namespace)

    monkeypatch.setattr(dataflow, "run_once", watched)
    before = {k for k in linecache.cache if k.startswith("<ptexec")}
    m = ptexec.load(FIX / "mlp.pte").load_method("forward")
    assert seen == ["v[5] = v[0].permute(1, 0)", "v[13] = v[2].permute(1, 0)"]
    new = {k for k in linecache.cache if k.startswith("<ptexec")} - before
    assert new == set(m.state.sources.filenames)
    for call in fixture_calls("mlp"):  # the views made at load are the weights it reads
        assert (
            compare_outputs(m.execute(call["inputs"]), call["outputs"], *tolerance("mlp")) is None
        )
    del m
    gc.collect()
    assert not {k for k in linecache.cache if k.startswith("<ptexec")} - before


def test_run_once_shares_one_template_across_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work of one shape on other slots of ``v`` compiles once: the slot numbers become
    names of the namespace; each run writes and reads its own slots, and a source with a
    string in it (where ``v[1]`` could be text) runs as written."""
    import builtins

    from ptexec import codegen

    compiled: list[str] = []

    def counted(source: str, *args: object) -> object:
        compiled.append(source)
        return builtins.compile(source, *args)  # type: ignore[call-overload]

    monkeypatch.setattr(codegen, "compile", counted, raising=False)
    codegen.clear_compiled()
    v: list[object] = [torch.arange(6.0).reshape(2, 3), None, torch.ones(3, 2), None]
    codegen.run_once("v[1] = v[0].permute(1, 0)", {"v": v})
    codegen.run_once("v[3] = v[2].permute(1, 0)", {"v": v})
    assert torch.equal(v[1], torch.arange(6.0).reshape(2, 3).T)  # type: ignore[arg-type]
    assert torch.equal(v[3], torch.ones(2, 3))  # type: ignore[arg-type]
    assert len(compiled) == 1
    ns: dict[str, object] = {"v": v}
    codegen.run_once("v[1] = 'v[2]'", ns)
    assert v[1] == "v[2]"
    with pytest.raises(IndexError):  # a failure is the caller's to handle, as before
        codegen.run_once("v[9] = v[0]", {"v": v})


def test_a_template_makes_one_function_per_namespace() -> None:
    """One text compiled once: each namespace gets its own function, whose globals are
    that namespace (its state); a failure shows the text's line; the text is in linecache
    while the template lives."""
    import traceback

    from ptexec.codegen import Template

    source = "def step(x):\n    global total\n    total += x\n    return 1 / total\n"
    template = Template(source, "test template", "step")
    a, b = {"total": 0}, {"total": 10}
    fa, fb = template.function(a), template.function(b)
    assert fa.__code__ is fb.__code__ and fa.__globals__ is a
    assert fa(2) == 0.5 and fb(5) == 1 / 15
    assert (a["total"], b["total"]) == (2, 15)
    with pytest.raises(ZeroDivisionError) as info:
        fa(-2)
    assert "return 1 / total" in "".join(traceback.format_tb(info.tb))
    filename = fa.__code__.co_filename
    assert filename in linecache.cache
    with pytest.raises(ValueError, match="2 functions"):
        Template(source + "def step(x):\n    return x\n", "two", "step")
    del template
    gc.collect()
    assert filename not in linecache.cache
